//! Admission of one allowed call (SPEC 7, 11, 13): its replay record, rate window, budget and claim in
//! one store call, with the approval step between the charge and the claim where the capability or a
//! flow rule asks for a person. What the store finds decides whether anything runs.

use crate::approval::{self, Desk, Gate};
use crate::clock;
use crate::store::{self, ApprovalRecord, ClaimRecord, SeenSignature, Store};
use crate::window::SlidingWindow;

use super::{classify, take, Taken};

/// Check 8's replay record (SPEC 3) until the call's first store write carries it, and whether its
/// signature was new when it was written.
#[derive(Default)]
pub struct Replay {
    pub unwritten: Option<SeenSignature>,
    pub was_new: bool,
}

/// What an allowed call is admitted with.
pub struct Ask<'a> {
    /// The capability's rate window: (cell key, the window).
    pub rate: Option<(String, SlidingWindow)>,
    /// The session's call count and budget: (cell key, max calls; `u64::MAX` when unlimited).
    pub budget: (String, u64),
    /// The PENDING claim to take; None when the capability takes none.
    pub claim: Option<ClaimRecord>,
    /// The approval step, when the capability or a flow rule asks for a person.
    pub approval: Option<approval::Call<'a>>,
}

/// What admission found. Only `Run` runs anything; the others are a claim of the same request id, which
/// answers the call as SPEC 7 says.
pub enum Admitted {
    /// Run the call, holding its PENDING claim (None without one) and the grant it used up (None without
    /// an approval step; give it back with [`approval::restore`] when nothing is sent).
    Run {
        claim: Option<ClaimRecord>,
        grant: Option<Box<ApprovalRecord>>,
    },
    /// COMMITTED: its stored answer is the call's.
    Skip(ClaimRecord),
    /// PENDING elsewhere: in flight, or its outcome is unknown (4001).
    Pending(ClaimRecord),
    /// Taken by a different call with the same idempotency key (4002).
    OtherCall(ClaimRecord),
}

/// The approval step holds the call back, for the request it names.
pub enum Hold {
    /// A new request was recorded (4003, `ApprovalRequested`).
    Requested(ApprovalRecord),
    /// The call's request is still waiting (4003).
    Waiting(ApprovalRecord),
    /// A person refused the call, and the refusal is still in force (4004).
    Denied(ApprovalRecord),
}

/// Why a call was not admitted.
pub enum Refusal {
    /// The envelope's signature was seen before (1008); nothing was charged.
    Replayed,
    /// Over the capability's rate limit (2005); nothing was charged.
    RateLimited {
        retry_after_ms: i64,
    },
    /// The session's budget is used up (2008); nothing was charged.
    BudgetExhausted,
    /// The approval step holds the call.
    Held(Box<Hold>),
    Store(String),
}

impl Refusal {
    fn store(error: impl std::fmt::Display) -> Self {
        Refusal::Store(error.to_string())
    }
}

/// Admits an allowed call, or says why not. Without an approval step, replay record, rate, budget and
/// claim are one store call; with one, a repeat whose request still waits is answered before it is
/// charged (SPEC 13 r3), and the claim is taken only by a call holding a grant.
pub async fn admit(desk: &Desk, ask: Ask<'_>, replay: &mut Replay) -> Result<Admitted, Refusal> {
    let Some(call) = &ask.approval else {
        let found = charge(desk.store.as_ref(), ask.rate, ask.budget, ask.claim, replay).await?;
        return Ok(found.map_or(
            Admitted::Run {
                claim: None,
                grant: None,
            },
            |taken| admitted(taken, None),
        ));
    };
    if existing(desk.store.as_ref(), ask.claim.as_ref())
        .await?
        .is_none()
    {
        let waiting =
            approval::still_pending(desk.store.as_ref(), call.session_id, call.call_digest)
                .await
                .map_err(Refusal::store)?;
        if let Some(record) = waiting {
            return Err(Refusal::Held(Box::new(Hold::Waiting(record))));
        }
    }
    charge(desk.store.as_ref(), ask.rate, ask.budget, None, replay).await?;
    claim_after_approval(desk, call, ask.claim).await
}

/// The replay record, the rate window, the budget and the claim: one store call. Returns what taking the
/// claim found, or None when the call takes no claim.
async fn charge(
    store: &dyn Store,
    rate: Option<(String, SlidingWindow)>,
    budget: (String, u64),
    claim: Option<ClaimRecord>,
    replay: &mut Replay,
) -> Result<Option<Taken>, Refusal> {
    let admission = store::Admission {
        signature: replay.unwritten.take(),
        rate,
        budget: Some(budget),
        claim,
        now_ms: clock::now_millis(),
    };
    let admitted = store.admit(&admission).await.map_err(Refusal::store)?;
    replay.was_new |= admission.signature.is_some() && admitted != store::Admitted::Replayed;
    match admitted {
        store::Admitted::Replayed => Err(Refusal::Replayed),
        store::Admitted::RateLimited { retry_after_ms } => {
            Err(Refusal::RateLimited { retry_after_ms })
        }
        store::Admitted::BudgetExhausted => Err(Refusal::BudgetExhausted),
        store::Admitted::Charged { existing_claim } => Ok(admission
            .claim
            .map(|pending| classify(pending, existing_claim.map(|c| *c)))),
    }
}

/// SPEC 13, for a call already charged: a claim of its request id answers it as section 7 does and asks
/// for nothing; otherwise the approval step, and only a call holding a grant takes its claim.
async fn claim_after_approval(
    desk: &Desk,
    call: &approval::Call<'_>,
    claim: Option<ClaimRecord>,
) -> Result<Admitted, Refusal> {
    if let Some(found) = existing(desk.store.as_ref(), claim.as_ref()).await? {
        return Ok(admitted(found, None));
    }
    let hold = match approval::gate(desk, call).await.map_err(Refusal::store)? {
        Gate::Granted(grant) => return take_with_grant(desk.store.as_ref(), claim, grant).await,
        Gate::Requested(record) => Hold::Requested(record),
        Gate::Waiting(record) => Hold::Waiting(record),
        Gate::Denied(record) => Hold::Denied(record),
    };
    Err(Refusal::Held(Box::new(hold)))
}

/// A call holding a grant takes its claim; when it cannot run, the grant goes back.
async fn take_with_grant(
    store: &dyn Store,
    claim: Option<ClaimRecord>,
    grant: ApprovalRecord,
) -> Result<Admitted, Refusal> {
    let Some(pending) = claim else {
        return Ok(Admitted::Run {
            claim: None,
            grant: Some(Box::new(grant)),
        });
    };
    match take(store, pending).await {
        Ok(Taken::Proceed(record)) => Ok(admitted(Taken::Proceed(record), Some(Box::new(grant)))),
        // Another call took the claim meanwhile, or the store failed: nothing runs, the grant stays.
        other => {
            approval::restore(store, &grant)
                .await
                .map_err(Refusal::store)?;
            other
                .map(|taken| admitted(taken, None))
                .map_err(Refusal::store)
        }
    }
}

/// The claim a call with an approval step would meet, classified as section 7 answers it, or None when
/// it has no request id or none was taken yet.
async fn existing(
    store: &dyn Store,
    pending: Option<&ClaimRecord>,
) -> Result<Option<Taken>, Refusal> {
    let Some(pending) = pending else {
        return Ok(None);
    };
    let found = store
        .claim_get(pending.kind, &pending.request_id)
        .await
        .map_err(Refusal::store)?;
    Ok(found.map(|found| classify(pending.clone(), Some(found))))
}

fn admitted(taken: Taken, grant: Option<Box<ApprovalRecord>>) -> Admitted {
    match taken {
        Taken::Proceed(record) => Admitted::Run {
            claim: Some(record),
            grant,
        },
        Taken::Skip(record) => Admitted::Skip(record),
        Taken::Pending(record) => Admitted::Pending(record),
        Taken::OtherCall(record) => Admitted::OtherCall(record),
    }
}
