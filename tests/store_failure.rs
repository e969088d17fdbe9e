//! Fail closed when the store cannot be reached (SPEC section 3): the gateway runs on a store that can be
//! switched off, and a call that would otherwise be forwarded gets 5005 while the tool is never called;
//! once a call has reached the tool, its outcome's writes are retried before 5005 `forwarded` (r2).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use sealgate::audit::{AuditBackend, ChainHead, ClaimSettlement};
use sealgate::pipeline::Outcome;
use sealgate::store::{
    Admission, Admitted, ApprovalCursor, ApprovalRecord, ClaimCursor, ClaimKind, ClaimRecord,
    ConsoleSessionRecord, LiveCounts, SessionLabel, SessionRecord, ShadowTally, Shelf,
    SignInAttempt, SqliteStore, Store, StoreError, StoreResult, StoredContext, StoredEvent,
    ToolPin,
};
use serde_json::{json, Value};

/// The embedded store behind a switch: when `down`, every operation fails as an unreachable store would.
struct SwitchableStore {
    inner: SqliteStore,
    down: Arc<AtomicBool>,
}

impl SwitchableStore {
    fn check(&self) -> StoreResult<()> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::unavailable("connection refused"))
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl AuditBackend for SwitchableStore {
    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        self.check()?;
        self.inner.head().await
    }
    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.check()?;
        self.inner.append(after, events, settlements).await
    }
    async fn sync(&self) -> StoreResult<()> {
        self.check()?;
        self.inner.sync().await
    }
    async fn events_newest_first(
        &self,
        before: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        self.check()?;
        self.inner.events_newest_first(before, limit).await
    }
    async fn events_oldest_first(&self, from: u64, limit: usize) -> StoreResult<Vec<Value>> {
        self.check()?;
        self.inner.events_oldest_first(from, limit).await
    }
}

#[async_trait::async_trait]
impl Store for SwitchableStore {
    async fn ping(&self) -> StoreResult<()> {
        self.check()?;
        self.inner.ping().await
    }
    async fn session_insert(&self, r: &SessionRecord) -> StoreResult<Option<SessionRecord>> {
        self.check()?;
        self.inner.session_insert(r).await
    }
    async fn session_get(&self, id: &str) -> StoreResult<Option<SessionRecord>> {
        self.check()?;
        self.inner.session_get(id).await
    }
    async fn session_labels(&self, id: &str) -> StoreResult<Vec<SessionLabel>> {
        self.check()?;
        self.inner.session_labels(id).await
    }
    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        self.check()?;
        self.inner.session_replace(old, new).await
    }
    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)> {
        self.check()?;
        self.inner.session_page(after, limit, keep).await
    }
    async fn live_counts(&self, now_secs: i64) -> StoreResult<LiveCounts> {
        self.check()?;
        self.inner.live_counts(now_secs).await
    }
    async fn sign_in_insert(&self, attempt: &SignInAttempt, before: i64) -> StoreResult<()> {
        self.check()?;
        self.inner.sign_in_insert(attempt, before).await
    }
    async fn sign_in_take(&self, state: &str) -> StoreResult<Option<SignInAttempt>> {
        self.check()?;
        self.inner.sign_in_take(state).await
    }
    async fn console_session_insert(&self, r: &ConsoleSessionRecord, now: i64) -> StoreResult<()> {
        self.check()?;
        self.inner.console_session_insert(r, now).await
    }
    async fn console_session_get(&self, id: &str) -> StoreResult<Option<ConsoleSessionRecord>> {
        self.check()?;
        self.inner.console_session_get(id).await
    }
    async fn console_session_touch(&self, r: &ConsoleSessionRecord) -> StoreResult<()> {
        self.check()?;
        self.inner.console_session_touch(r).await
    }
    async fn console_session_delete(&self, id: &str) -> StoreResult<bool> {
        self.check()?;
        self.inner.console_session_delete(id).await
    }
    async fn tool_pin_first(&self, pin: &ToolPin) -> StoreResult<ToolPin> {
        self.check()?;
        self.inner.tool_pin_first(pin).await
    }
    async fn tool_pin_put(&self, pin: &ToolPin) -> StoreResult<()> {
        self.check()?;
        self.inner.tool_pin_put(pin).await
    }
    async fn tool_pins(&self) -> StoreResult<Vec<ToolPin>> {
        self.check()?;
        self.inner.tool_pins().await
    }
    async fn tool_sighting_first(&self, u: &str, t: &str, sha: &str, at: i64) -> StoreResult<bool> {
        self.check()?;
        self.inner.tool_sighting_first(u, t, sha, at).await
    }
    async fn counter_get(&self, key: &str) -> StoreResult<Option<i64>> {
        self.check()?;
        self.inner.counter_get(key).await
    }
    async fn remember_signature(&self, sig: &[u8], until: i64) -> StoreResult<bool> {
        self.check()?;
        self.inner.remember_signature(sig, until).await
    }
    async fn purge_signatures(&self, now: i64) -> StoreResult<usize> {
        self.check()?;
        self.inner.purge_signatures(now).await
    }
    async fn admit(&self, admission: &Admission) -> StoreResult<Admitted> {
        self.check()?;
        self.inner.admit(admission).await
    }
    async fn claim_insert(&self, r: &ClaimRecord) -> StoreResult<Option<ClaimRecord>> {
        self.check()?;
        self.inner.claim_insert(r).await
    }
    async fn claim_get(&self, kind: ClaimKind, id: &str) -> StoreResult<Option<ClaimRecord>> {
        self.check()?;
        self.inner.claim_get(kind, id).await
    }
    async fn claim_replace(
        &self,
        old: &ClaimRecord,
        new: Option<&ClaimRecord>,
    ) -> StoreResult<bool> {
        self.check()?;
        self.inner.claim_replace(old, new).await
    }
    async fn claim_page(
        &self,
        before: Option<&ClaimCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ClaimRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ClaimRecord>, bool)> {
        self.check()?;
        self.inner.claim_page(before, limit, keep).await
    }
    async fn approval_insert(
        &self,
        r: &ApprovalRecord,
        replacing: Option<&str>,
    ) -> StoreResult<bool> {
        self.check()?;
        self.inner.approval_insert(r, replacing).await
    }
    async fn approval_current(
        &self,
        session: &str,
        digest: &str,
    ) -> StoreResult<Option<ApprovalRecord>> {
        self.check()?;
        self.inner.approval_current(session, digest).await
    }
    async fn approval_get(&self, id: &str) -> StoreResult<Option<ApprovalRecord>> {
        self.check()?;
        self.inner.approval_get(id).await
    }
    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool> {
        self.check()?;
        self.inner.approval_replace(old, new).await
    }
    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)> {
        self.check()?;
        self.inner.approval_page(before, limit, keep).await
    }
    async fn context_put(&self, shelf: Shelf, c: &StoredContext) -> StoreResult<()> {
        self.check()?;
        self.inner.context_put(shelf, c).await
    }
    async fn context_delete(&self, shelf: Shelf, name: &str) -> StoreResult<bool> {
        self.check()?;
        self.inner.context_delete(shelf, name).await
    }
    async fn shadow_tally_add(&self, counts: &[ShadowTally]) -> StoreResult<()> {
        self.check()?;
        self.inner.shadow_tally_add(counts).await
    }
    async fn shadow_tallies(&self, context: &str, version: &str) -> StoreResult<Vec<ShadowTally>> {
        self.check()?;
        self.inner.shadow_tallies(context, version).await
    }
    async fn first_seq(&self) -> StoreResult<Option<u64>> {
        self.check()?;
        self.inner.first_seq().await
    }
    async fn events_remove_through(&self, through: u64) -> StoreResult<u64> {
        self.check()?;
        self.inner.events_remove_through(through).await
    }
    async fn settled_remove_before(&self, before_ms: i64, now_ms: i64) -> StoreResult<(u64, u64)> {
        self.check()?;
        self.inner.settled_remove_before(before_ms, now_ms).await
    }
    async fn replay_cover(&self) -> StoreResult<Option<sealgate::replay::ReplayCover>> {
        self.check()?;
        self.inner.replay_cover().await
    }
    async fn set_replay_cover(&self, cover: &sealgate::replay::ReplayCover) -> StoreResult<()> {
        self.check()?;
        self.inner.set_replay_cover(cover).await
    }
    async fn context_list(&self, shelf: Shelf) -> StoreResult<Vec<StoredContext>> {
        self.check()?;
        self.inner.context_list(shelf).await
    }
}

/// A gateway on a switchable store, with one session on `context` and its signing material.
struct Rig {
    gateway: Arc<sealgate::gateway::Gateway>,
    down: Arc<AtomicBool>,
    tool: Arc<common::Tool>,
    key: ed25519_dalek::SigningKey,
    token: String,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// `extra_upstreams` and `policy` (a context file's text, or "") are added to the test configuration.
    async fn start(
        down: Arc<AtomicBool>,
        extra_upstreams: &str,
        policy: &str,
        context: &str,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let (tool, tool_base) = common::start_tool().await;
        let keys = common::Keys::new();
        let config_path = common::write_config(
            dir.path(),
            &keys,
            &tool_base,
            extra_upstreams,
            "limits: { store_retry_secs: 1 }",
        );
        if !policy.is_empty() {
            std::fs::write(dir.path().join("policies/extra.yaml"), policy).unwrap();
        }
        let config = sealgate::config::Config::from_yaml(
            &std::fs::read_to_string(&config_path).unwrap(),
            dir.path(),
            &[("TEST_TOOL_CREDENTIAL".into(), "Bearer tool-secret".into())],
        )
        .unwrap();
        let store = Arc::new(SwitchableStore {
            inner: SqliteStore::open(&dir.path().join("data")).unwrap(),
            down: down.clone(),
        });
        let gateway = sealgate::gateway::Gateway::build_with_store(config, store.clone())
            .await
            .unwrap();
        let key = sealgate::envelope::generate_signing_key().unwrap();
        store
            .session_insert(&SessionRecord {
                session_id: "exec-store".into(),
                public_key: Some(sealgate::session::encode_key(
                    &key.verifying_key().to_bytes(),
                )),
                security_context: context.into(),
                expires_at: sealgate::clock::now_secs() + 600,
                agent_id: None,
                workload_id: None,
                allowed_tool_patterns: vec!["*".into()],
                max_calls: None,
                security_token: None,
                created_at_ms: 0,
                revoked_at_ms: None,
                team: "default".into(),
                registered_by: None,
                person: None,
            })
            .await
            .unwrap();
        let token = keys.agent_token_from(&keys.agent_claims("exec-store", context));
        Rig {
            gateway,
            down,
            tool,
            key,
            token,
            _dir: dir,
        }
    }

    /// Sends one call through the pipeline; returns the HTTP status and the body it would answer.
    async fn call(&self, id: u64, tool: &str) -> (StatusCode, Value) {
        let envelope = sealgate::envelope::sign_envelope(
            &self.key,
            common::tool_call(id, tool, json!({"path": format!("/workspace/{id}")})),
            &self.token,
            sealgate::clock::now_secs(),
        );
        let body = serde_json::to_vec(&envelope).unwrap();
        match sealgate::pipeline::invoke(&self.gateway, &body, None).await {
            Outcome::Success { payload, .. } => (StatusCode::OK, payload),
            Outcome::Refused { error, .. } => (error.code.status(), error.body()),
        }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn an_unreachable_store_refuses_with_5005_and_forwards_nothing() {
    let rig = Rig::start(Arc::default(), "", "", "test").await;
    let (status, body) = rig.call(1, "tool.write").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(rig.tool.count(), 1);

    rig.set_down(true);
    let (status, body) = rig.call(2, "tool.write").await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (StatusCode::SERVICE_UNAVAILABLE, Some(5005)),
        "{body}"
    );
    assert_eq!(
        rig.tool.count(),
        1,
        "nothing is forwarded while the store is down"
    );

    rig.set_down(false);
    let (status, body) = rig.call(3, "tool.write").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the gateway recovers with its store: {body}"
    );
    assert_eq!(rig.tool.count(), 2);
}

/// An upstream that switches the store off as a call reaches it (and on again after `outage`, when
/// given), then answers with something that is not JSON-RPC: a refusal (5003) after a forward.
async fn start_store_cutting_tool(down: Arc<AtomicBool>, outage: Option<Duration>) -> String {
    let app = axum::Router::new().route(
        "/rpc",
        axum::routing::post(move || {
            let down = down.clone();
            async move {
                down.store(true, Ordering::SeqCst);
                if let Some(outage) = outage {
                    tokio::spawn(async move {
                        tokio::time::sleep(outage).await;
                        down.store(false, Ordering::SeqCst);
                    });
                }
                "not JSON-RPC"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("  cut: {{ http: {{ url: \"http://{addr}/rpc\" }} }}")
}

/// One call to a tool whose arrival switches the store off (for `outage`, or for good), under `policy`
/// (a context named `cut`).
async fn call_that_cuts_the_store(
    outage: Option<Duration>,
    policy: &str,
) -> (Rig, StatusCode, Value) {
    let down = Arc::new(AtomicBool::new(false));
    let upstream = start_store_cutting_tool(down.clone(), outage).await;
    let rig = Rig::start(down, &upstream, policy, "cut").await;
    let (status, body) = rig.call(1, "cut.write").await;
    (rig, status, body)
}

const CUT_POLICY: &str = "name: cut\ncapabilities:\n  - { tool_pattern: \"cut.*\", claim: off }\n";
const CLAIMED_CUT_POLICY: &str =
    "name: cut\ncapabilities:\n  - { tool_pattern: \"cut.*\", claim: auto }\n";

#[tokio::test]
async fn a_refusal_after_the_forward_is_recorded_once_the_store_is_back() {
    let (rig, status, body) =
        call_that_cuts_the_store(Some(Duration::from_millis(150)), CUT_POLICY).await;
    assert_eq!(
        (status, body["error"]["code"].as_u64()),
        (StatusCode::BAD_GATEWAY, Some(5003)),
        "the event was retried until the store came back: {body}"
    );
    let trail = rig
        .gateway
        .store()
        .events_newest_first(None, 10)
        .await
        .unwrap();
    assert!(
        trail
            .iter()
            .any(|e| e["type"] == "ToolCallFailed" && e["code"] == 5003),
        "{trail:?}"
    );
}

#[tokio::test]
async fn a_refusal_after_the_forward_that_cannot_be_recorded_says_it_was_forwarded() {
    // Without a claim the refusal's event is what fails; with one, settling the claim fails first.
    for policy in [CUT_POLICY, CLAIMED_CUT_POLICY] {
        let (_rig, status, body) = call_that_cuts_the_store(None, policy).await;
        assert_eq!(
            (status, body["error"]["code"].as_u64()),
            (StatusCode::SERVICE_UNAVAILABLE, Some(5005)),
            "{policy}: {body}"
        );
        assert_eq!(
            body["error"]["details"]["forwarded"], true,
            "{policy}: {body}"
        );
    }
}
