//! The single writer task: group commit of audit events.
//!
//! Callers queue an event with a reply channel; the writer takes every event waiting (up to a cap),
//! chains them, appends them to the store, and then makes the batch durable with the store's sync (which
//! also covers every store write made before these events were queued). Only then does it answer every
//! caller, and hand the batch to the copies (the file, standard output) on a thread of their own. One sync
//! per batch is the group commit that lets durable calls keep up with many concurrent callers. One writer per process, and an append that is a compare-and-set
//! on the chain head, mean one chain with no forks even when several replicas share the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use super::chain::{format_at, seal, Link, Sealed};
use super::event::{AuditEvent, EventType, Facts, Unsealed};
use super::sink::Copies;
use super::{AuditBackend, AuditError, ChainHead, ClaimSettlement, InvalidEvent, Recorded};
use crate::store::{StoreError, StoredEvent};

pub(crate) type Reply = oneshot::Sender<Result<Recorded, AuditError>>;

pub(crate) struct Job {
    pub(crate) event: Unsealed,
    /// `None` for fire-and-forget events (unreadable bodies).
    pub(crate) reply: Option<Reply>,
    /// False when the decision was already counted where it was made (unreadable bodies are counted
    /// even when their event is suppressed).
    pub(crate) count_decision: bool,
    /// A claim's settlement to write with this event (see [`AuditBackend::append`]).
    /// Boxed: two claim records would make every queued job that large.
    pub(crate) settlement: Option<Box<ClaimSettlement>>,
    /// When the writer took the job: the event's `at`, also when it is held for a later batch.
    pub(crate) taken_at: Option<DateTime<Utc>>,
}

pub(crate) enum Command {
    Record(Job),
    /// Ends the chain with a checkpoint now, unless one ends it already, and answers that checkpoint's
    /// seq (SPEC 20 rule 7: an export ends with one); none without a signer, or when it cannot be made.
    SignHead(oneshot::Sender<Option<u64>>),
    Shutdown(oneshot::Sender<()>),
}

/// Tuning of the writer; the defaults suit production, tests and the bench change them.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Most events chained and appended in one batch.
    pub max_batch: usize,
    /// Events that may wait for the writer before `record` waits for room.
    pub queue_capacity: usize,
    /// Unauthenticated refusals recorded per second and client address, when set; otherwise
    /// `audit.unauthenticated_per_second`. The rest are only counted.
    pub unreadable_per_second: Option<u32>,
    /// How often the count of suppressed unreadable-body events is recorded.
    pub suppressed_report_interval: Duration,
    /// The `replica` written into every event (SPEC 12: `replica_id`); none when unset.
    pub replica: Option<String>,
    /// Signed checkpoints in the chain (SPEC 14); none when unset.
    pub checkpoints: Option<CheckpointOptions>,
}

/// Signs the chain's head for an `AuditCheckpoint` event (SPEC 14). The signing key lives in
/// `evidence`, which implements this; the writer only says which head and when.
pub trait CheckpointSigner: Send + Sync {
    /// The unchained `AuditCheckpoint` event that covers `head`, the event it is chained after. Signing
    /// cannot fail; an event that does not chain is the writer's to report.
    fn checkpoint(&self, head: &ChainHead) -> AuditEvent;
}

/// When the writer appends checkpoints, and who signs them.
#[derive(Clone)]
pub struct CheckpointOptions {
    /// A checkpoint follows every event whose seq is a multiple of this: a rule of the chain alone, so
    /// that replicas sharing it never sign the same range twice.
    pub every: u64,
    /// While events follow the last checkpoint, one is appended at least this often.
    pub interval: Duration,
    pub signer: Arc<dyn CheckpointSigner>,
}

impl std::fmt::Debug for CheckpointOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointOptions")
            .field("every", &self.every)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            max_batch: 512,
            queue_capacity: 8192,
            unreadable_per_second: None,
            suppressed_report_interval: Duration::from_secs(10),
            replica: None,
            checkpoints: None,
        }
    }
}

pub(crate) struct Writer {
    pub(crate) backend: Arc<dyn AuditBackend>,
    /// The chain head after the last durable batch; `None` after a failure, so the next batch re-reads it
    /// from the store instead of trusting what this task believed.
    pub(crate) head: Option<ChainHead>,
    /// Where committed batches are copied (the file and standard output), when anywhere.
    pub(crate) copies: Option<Copies>,
    pub(crate) max_batch: usize,
    pub(crate) report_interval: Duration,
    pub(crate) suppressed: Arc<AtomicU64>,
    /// Calls shed by admission control (5006) since the last report.
    pub(crate) shed: Arc<AtomicU64>,
    pub(crate) rx: mpsc::Receiver<Command>,
    /// Written into every event as `replica` (SPEC 12), when set.
    pub(crate) replica: Option<String>,
    /// Until when batches take turns with other writers instead of racing them for the head.
    pub(crate) contended_until: Option<Instant>,
    pub(crate) checkpoints: Option<CheckpointOptions>,
    /// The interval asked for a checkpoint that is not written yet: the next batch ends with one.
    pub(crate) checkpoint_owed: bool,
    /// A head to sign on its own, when it is still the chain's head (see [`Writer::sign_tail`]).
    pub(crate) checkpoint_cover: Option<ChainHead>,
    /// Who asked for a checkpoint at the head ([`Command::SignHead`]), answered after the batch at hand.
    pub(crate) head_waiters: Vec<oneshot::Sender<Option<u64>>>,
    /// Events appended but not yet synced (nobody waited for them), with what the metrics count of them.
    pub(crate) unsynced: Vec<(Sealed, Tally)>,
    /// When the oldest of them was appended.
    pub(crate) unsynced_since: Option<Instant>,
    /// Events nobody waits for, not yet chained: they lead the next batch (one store round trip for a
    /// call's two events), or are written and synced by the same deadline as unsynced ones.
    pub(crate) held: Vec<Job>,
    /// When the oldest of them was taken.
    pub(crate) held_since: Option<Instant>,
}

impl Writer {
    pub(crate) async fn run(mut self) {
        let mut report = tokio::time::interval(self.report_interval);
        report.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick completes at once; consume it so reports come one interval apart.
        report.tick().await;
        let mut checkpoint_tick = self.checkpoints.as_ref().map(|options| {
            let mut tick = tokio::time::interval(options.interval);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            tick
        });
        if let Some(tick) = checkpoint_tick.as_mut() {
            tick.tick().await;
        }
        let mut shutdown_waiters = Vec::new();
        loop {
            let first = tokio::select! {
                command = self.rx.recv() => match command {
                    Some(command) => command,
                    None => break,
                },
                _ = report.tick() => {
                    let summaries = self.summaries();
                    if !summaries.is_empty() {
                        self.commit(summaries).await;
                    }
                    continue;
                }
                _ = next_tick(checkpoint_tick.as_mut()) => {
                    self.sign_tail().await;
                    continue;
                }
                _ = sync_deadline(self.unsynced_since.into_iter().chain(self.held_since).min()) => {
                    self.flush().await;
                    continue;
                }
            };
            let mut batch = Vec::new();
            self.take(first, &mut batch, &mut shutdown_waiters);
            self.drain(&mut batch, &mut shutdown_waiters);
            // While replicas take turns at the head, each turn costs a transaction: let more calls join.
            if self
                .contended_until
                .is_some_and(|until| Instant::now() < until)
                && batch.len() < self.max_batch
            {
                tokio::time::sleep(CONTENDED_LINGER).await;
                self.drain(&mut batch, &mut shutdown_waiters);
            }
            if !batch.is_empty() {
                self.commit(batch).await;
            }
            if !self.head_waiters.is_empty() {
                let signed = self.sign_head().await;
                for waiter in std::mem::take(&mut self.head_waiters) {
                    let _ = waiter.send(signed);
                }
            }
        }
        let summaries = self.summaries();
        if !summaries.is_empty() {
            self.commit(summaries).await;
        }
        self.flush().await;
        // A clean shutdown leaves no unsigned tail (SPEC 14), and nothing unsynced.
        self.sign_tail().await;
        if self.unsynced_since.is_some() {
            let _ = self.sync().await;
        }
        if let Some(copies) = self.copies.take() {
            // The file holds every committed event when shutdown returns.
            let _ = tokio::task::spawn_blocking(move || copies.finish()).await;
        }
        for waiter in shutdown_waiters {
            let _ = waiter.send(());
        }
    }

    /// Adds what is queued to `batch`, up to the batch limit.
    fn drain(&mut self, batch: &mut Vec<Job>, shutdown_waiters: &mut Vec<oneshot::Sender<()>>) {
        while batch.len() < self.max_batch {
            match self.rx.try_recv() {
                Ok(command) => self.take(command, batch, shutdown_waiters),
                Err(_) => break,
            }
        }
    }

    fn take(
        &mut self,
        command: Command,
        batch: &mut Vec<Job>,
        shutdown_waiters: &mut Vec<oneshot::Sender<()>>,
    ) {
        match command {
            Command::Record(mut job) => {
                job.taken_at = Some(Utc::now());
                batch.push(job);
            }
            Command::SignHead(waiter) => self.head_waiters.push(waiter),
            Command::Shutdown(waiter) => {
                // Closing refuses new events but still yields those already queued, which are written.
                self.rx.close();
                shutdown_waiters.push(waiter);
            }
        }
    }

    /// The counts of refusals that got no event of their own since the last report, one
    /// `EnvelopeRejected` event each: unreadable bodies (1000) and calls shed while overloaded (5006).
    fn summaries(&self) -> Vec<Job> {
        let counted = [
            (
                &self.suppressed,
                1000,
                "refusals before check 8 passed got no event of their own (rate limit per address)",
            ),
            (
                &self.shed,
                5006,
                "calls were shed while more than limits.max_concurrent_calls were in progress",
            ),
        ];
        let mut jobs = Vec::new();
        for (counter, code, what) in counted {
            let count = counter.swap(0, Ordering::AcqRel);
            if count == 0 {
                continue;
            }
            let event = AuditEvent::new(EventType::EnvelopeRejected)
                .code(code)
                .suppressed(count)
                .detail(format!("{count} {what}"));
            match event.into_unsealed(false) {
                Ok(event) => jobs.push(Job {
                    event,
                    reply: None,
                    count_decision: false,
                    settlement: None,
                    taken_at: Some(Utc::now()),
                }),
                Err(e) => {
                    tracing::error!(target: "audit", error = %e, "suppressed-count event is invalid")
                }
            }
        }
        jobs
    }

    /// Appends a checkpoint after the chain's newest event unless it is one (SPEC 14: while events follow
    /// the last checkpoint, and at a clean shutdown). The head is signed only if it is still the one read
    /// here, so two replicas never sign the same head; if another writer moved it meanwhile, this
    /// writer's next batch ends with the checkpoint instead.
    async fn sign_tail(&mut self) {
        if self.checkpoints.is_none() {
            return;
        }
        let newest = match self.backend.events_newest_first(None, 1).await {
            Ok(newest) => newest,
            Err(e) => {
                tracing::warn!(target: "audit", error = %e, "cannot read the chain's head to checkpoint it");
                self.checkpoint_owed = true;
                return;
            }
        };
        let Some(head) = newest.first().and_then(unsigned_head) else {
            self.checkpoint_owed = false;
            return;
        };
        self.checkpoint_owed = true;
        self.checkpoint_cover = Some(head);
        self.commit(Vec::new()).await;
        self.checkpoint_cover = None;
    }

    /// Signs the chain's head unless a checkpoint is the head already, and returns the seq of the
    /// checkpoint that ends the chain. Another replica may move the head in between: then it tries again
    /// after the events it wrote.
    async fn sign_head(&mut self) -> Option<u64> {
        self.checkpoints.as_ref()?;
        // Held events were recorded before the export asked: written first, they are in what it signs.
        self.flush().await;
        for _ in 0..MAX_HEAD_RETRIES {
            self.sign_tail().await;
            // Durable first: an export reads the store, which shows only what was synced.
            if self.unsynced_since.is_some() && self.sync().await.is_err() {
                return None;
            }
            let newest = match self.backend.events_newest_first(None, 1).await {
                Ok(newest) => newest,
                Err(e) => {
                    tracing::warn!(target: "audit", error = %e, "cannot read the chain's head after signing it");
                    return None;
                }
            };
            let head = newest.first()?;
            if is_checkpoint(head) {
                return head.get("seq").and_then(Value::as_u64);
            }
        }
        None
    }

    /// The head to chain from: the one this task wrote last, or the store's after a failure.
    async fn current_head(&mut self) -> Result<ChainHead, StoreError> {
        if let Some(head) = &self.head {
            return Ok(head.clone());
        }
        let head = self
            .backend
            .head()
            .await?
            .unwrap_or_else(ChainHead::genesis);
        Ok(head)
    }

    /// Stores `batch` chained after the store's head in this writer's turn (other replicas' writers wait),
    /// and stays in that mode while they keep moving the head. None when nothing was left to chain.
    async fn append_in_turn(
        &mut self,
        batch: &mut Vec<Job>,
        settlements: &[ClaimSettlement],
    ) -> Result<Option<Chained>, StoreError> {
        let believed = self.head.clone();
        let mut chained_after = None;
        let plan = self.plan();
        let replica = self.replica.as_deref();
        let mut chainer = |head: &ChainHead| {
            let mut chained = chain(batch, head, plan.as_ref(), replica);
            let stored = std::mem::take(&mut chained.stored);
            chained_after = Some((head.clone(), chained));
            stored
        };
        self.backend
            .append_in_turn(&mut chainer, settlements)
            .await?;
        let Some((after, chained)) = chained_after else {
            return Err(StoreError::Corrupt(
                "the store wrote a batch without chaining it".into(),
            ));
        };
        if believed.as_ref() != Some(&after) {
            metrics::counter!("sealgate_audit_head_conflicts_total").increment(1);
            self.contended_until = Some(Instant::now() + CONTENDED_FOR);
        }
        if chained.events.is_empty() {
            return Ok(None);
        }
        metrics::counter!("sealgate_audit_batches_total").increment(1);
        Ok(Some(chained))
    }

    /// Stores `batch` chained after the head this writer believes in, by compare-and-set: `HeadMoved` when
    /// another writer got there first. None when nothing was left to chain.
    /// `durably`: the batch is also synced, with everything appended before it (see
    /// [`AuditBackend::append_durably`]).
    async fn append_racing(
        &mut self,
        batch: &mut Vec<Job>,
        settlements: &[ClaimSettlement],
        durably: bool,
    ) -> Result<Option<Chained>, StoreError> {
        let head = self.current_head().await?;
        let mut chained = chain(batch, &head, self.plan().as_ref(), self.replica.as_deref());
        let stored = std::mem::take(&mut chained.stored);
        if stored.is_empty() {
            return Ok(None);
        }
        if durably {
            self.backend
                .append_durably(&head, &stored, settlements)
                .await?;
        } else {
            self.backend.append(&head, &stored, settlements).await?;
        }
        metrics::counter!("sealgate_audit_batches_total").increment(1);
        Ok(Some(chained))
    }

    /// What the next append adds to its events: checkpoints, when this writer signs them.
    fn plan(&self) -> Option<CheckpointPlan<'_>> {
        self.checkpoints.as_ref().map(|options| CheckpointPlan {
            options,
            after_batch: self.checkpoint_owed,
            cover: self.checkpoint_cover.as_ref(),
        })
    }

    /// Chains one batch after the events held so far and makes it durable, answering its callers; a batch
    /// that nobody waits for is held instead, while the writer races for the head and the batch is short.
    async fn commit(&mut self, mut batch: Vec<Job>) {
        let held_since = self.held_since.take();
        batch.splice(0..0, std::mem::take(&mut self.held));
        let waited_on = batch.iter().any(|job| job.reply.is_some());
        let contended = self
            .contended_until
            .is_some_and(|until| Instant::now() < until);
        // A checkpoint's cover is signed now (see `sign_tail`): nothing is held back from it.
        if !waited_on
            && !contended
            && self.checkpoint_cover.is_none()
            && batch.len() < self.max_batch
        {
            self.held = batch;
            self.held_since = Some(held_since.unwrap_or_else(Instant::now));
            return;
        }
        self.write(batch, false).await;
    }

    /// Writes what is held, durably; otherwise syncs what was appended unsynced, if anything.
    async fn flush(&mut self) {
        if self.held.is_empty() {
            if self.unsynced_since.is_some() {
                let _ = self.sync().await;
            }
            return;
        }
        self.held_since = None;
        let held = std::mem::take(&mut self.held);
        self.write(held, true).await;
    }

    /// Chains one batch and stores it, answering its callers once it is durable; `durably`: synced even
    /// when nobody waits for it.
    async fn write(&mut self, mut batch: Vec<Job>, durably: bool) {
        let settlements: Vec<ClaimSettlement> = batch
            .iter_mut()
            .filter_map(|job| job.settlement.take().map(|settlement| *settlement))
            .collect();
        // A batch that callers wait for is synced with its append where the store can (one round trip).
        let waited_on = durably || batch.iter().any(|job| job.reply.is_some());
        let mut attempts = 0;
        let (chained, synced) = loop {
            let contended = self
                .contended_until
                .is_some_and(|until| Instant::now() < until);
            let written = if contended {
                self.append_in_turn(&mut batch, &settlements).await
            } else {
                self.append_racing(&mut batch, &settlements, waited_on)
                    .await
            };
            match written {
                Ok(Some(chained)) => break (chained, waited_on && !contended),
                Ok(None) => return,
                // Another writer appended since this one read the head (a store whose turns are not
                // exclusive can say so in either mode): chain the batch again after the events it wrote.
                // Each round trip lets at least one writer through, so this ends.
                Err(StoreError::HeadMoved) if attempts < MAX_HEAD_RETRIES => {
                    metrics::counter!("sealgate_audit_head_conflicts_total").increment(1);
                    attempts += 1;
                    self.head = None;
                    self.contended_until = Some(Instant::now() + CONTENDED_FOR);
                }
                Err(e) => {
                    self.head = None;
                    tracing::error!(target: "audit", error = %e, "audit store append failed");
                    fail_all(batch, &AuditError::Store(e));
                    return;
                }
            }
        };
        let waited_on = durably || batch.iter().any(|job| job.reply.is_some());
        if chained.ends_with_checkpoint() {
            self.checkpoint_owed = false;
        }
        let Chained {
            events,
            receipts,
            head,
            ..
        } = chained;
        let pending: Vec<(Option<Reply>, Recorded, bool)> = batch
            .into_iter()
            .zip(receipts)
            .map(|(job, recorded)| (job.reply, recorded, job.count_decision))
            .collect();
        self.head = Some(head);
        self.unsynced.extend(tallies(events, &pending));
        if !waited_on {
            // Nobody waits for these events (a call's authorisation without a claim, counts): the next
            // waited-on batch's commit makes them durable too, so a call costs one commit, not two.
            self.unsynced_since.get_or_insert_with(Instant::now);
            return;
        }
        // The store is the record of truth: once its commit holds the batch, the callers are answered
        // and the copies (file, stdout) follow off the reply path (SPEC 12 r3: the file is a copy,
        // written after the commit and extended from the store at start-up).
        if synced {
            let events = self.take_unsynced();
            self.committed(events);
        } else if let Err(e) = self.sync().await {
            fail_pending(pending, &e);
            return;
        }
        for (reply, recorded, _) in pending {
            answer(reply, Ok(recorded));
        }
    }

    /// Makes every appended event durable, then counts them and hands them to the copies.
    async fn sync(&mut self) -> Result<(), AuditError> {
        let events = self.take_unsynced();
        if let Err(e) = self.backend.sync().await {
            self.head = None;
            tracing::error!(target: "audit", error = %e, "audit store sync failed");
            return Err(AuditError::Store(e));
        }
        self.committed(events);
        Ok(())
    }

    /// The events appended since the last sync, for the commit about to hold them (dropped if it fails).
    fn take_unsynced(&mut self) -> Vec<(Sealed, Tally)> {
        self.unsynced_since = None;
        std::mem::take(&mut self.unsynced)
    }

    /// Counts durable events and hands them to the copies.
    fn committed(&self, events: Vec<(Sealed, Tally)>) {
        let mut committed = Vec::with_capacity(events.len());
        for (event, tally) in events {
            count_metrics(&tally);
            committed.push(event);
        }
        if let Some(copies) = &self.copies {
            copies.send(committed);
        }
    }
}

/// How long appended events that nobody waits for may stay unsynced when no waited-on batch follows.
const DEFERRED_SYNC_AFTER: Duration = Duration::from_millis(50);

/// How often one batch is chained again because other replicas moved the head meanwhile.
const MAX_HEAD_RETRIES: usize = 64;

/// After another writer moved the chain head, how long this one takes turns (see
/// [`AuditBackend::append_in_turn`]) instead of racing it with compare-and-sets: as long as the head
/// keeps moving under it, and this long after.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// How long a contended writer waits for more events before taking its turn at the head.
const CONTENDED_LINGER: Duration = Duration::from_millis(1);

/// What an append adds besides its events (SPEC 14): a checkpoint after every event whose seq is a
/// multiple of `every`; one after the batch's last event when the interval asked for one; and, for an
/// empty batch, one after `cover` when that is still the head.
struct CheckpointPlan<'a> {
    options: &'a CheckpointOptions,
    after_batch: bool,
    cover: Option<&'a ChainHead>,
}

/// A batch chained after a head.
struct Chained {
    /// Every event chained (checkpoints too) as the store takes it, taken for the append.
    stored: Vec<StoredEvent>,
    /// The same events as the copies take them, with what the metrics count of them.
    events: Vec<(Sealed, Facts)>,
    /// One per job left in the batch: checkpoints answer nobody.
    receipts: Vec<Recorded>,
    head: ChainHead,
}

impl Chained {
    fn push(&mut self, event: Sealed, stored: StoredEvent, facts: Facts) {
        self.head = stored.head.clone();
        self.events.push((event, facts));
        self.stored.push(stored);
    }

    fn ends_with_checkpoint(&self) -> bool {
        self.events
            .last()
            .is_some_and(|(_, facts)| is_checkpoint_type(facts))
    }
}

/// Seals the batch after `head`, with the checkpoints `plan` asks for. Jobs whose event cannot be sealed
/// are answered with the error and removed, so `batch` and the receipts stay in step.
fn chain(
    batch: &mut Vec<Job>,
    head: &ChainHead,
    plan: Option<&CheckpointPlan<'_>>,
    replica: Option<&str>,
) -> Chained {
    let mut chained = Chained {
        stored: Vec::with_capacity(batch.len()),
        events: Vec::with_capacity(batch.len()),
        receipts: Vec::with_capacity(batch.len()),
        head: head.clone(),
    };
    let mut kept = Vec::with_capacity(batch.len());
    // Held events lead a batch that signs a cover: the checkpoint after them covers it too.
    if batch.is_empty() && plan.is_some_and(|plan| plan.cover == Some(&chained.head)) {
        append_checkpoint(&mut chained, plan, replica);
    }
    for job in batch.drain(..) {
        let at = job.taken_at.unwrap_or_else(Utc::now);
        match seal_next(&job.event, &chained.head, replica, at) {
            Ok((event, stored, recorded)) => {
                chained.push(event, stored, job.event.facts);
                chained.receipts.push(recorded);
                kept.push(job);
                if plan.is_some_and(|plan| chained.head.seq.is_multiple_of(plan.options.every)) {
                    append_checkpoint(&mut chained, plan, replica);
                }
            }
            Err(e) => answer(job.reply, Err(e)),
        }
    }
    let ends_unsigned = !kept.is_empty() && !chained.ends_with_checkpoint();
    if ends_unsigned && plan.is_some_and(|plan| plan.after_batch) {
        append_checkpoint(&mut chained, plan, replica);
    }
    *batch = kept;
    chained
}

/// Seals one event after `head`: the event as the copies and as the store take it, and the receipt.
fn seal_next(
    event: &Unsealed,
    head: &ChainHead,
    replica: Option<&str>,
    at: DateTime<Utc>,
) -> Result<(Sealed, StoredEvent, Recorded), AuditError> {
    let seq = head.seq.checked_add(1).ok_or(InvalidEvent::SeqOverflow)?;
    let at = format_at(at);
    let link = Link {
        seq,
        prev_hash: &head.hash,
        at: &at,
        replica,
    };
    Ok(seal(event, &link)?)
}

/// Chains a signed checkpoint of the batch's head after it. A checkpoint that cannot be made is left
/// out (the chain stays valid, its tail unsigned until the next one) and said in the log.
fn append_checkpoint(
    chained: &mut Chained,
    plan: Option<&CheckpointPlan<'_>>,
    replica: Option<&str>,
) {
    let Some(plan) = plan else { return };
    let sealed = plan
        .options
        .signer
        .checkpoint(&chained.head)
        .into_unsealed(false)
        .map_err(AuditError::from)
        .and_then(|event| {
            seal_next(&event, &chained.head, replica, Utc::now())
                .map(|sealed| (sealed, event.facts))
        });
    match sealed {
        Ok(((event, stored, _), facts)) => chained.push(event, stored, facts),
        Err(e) => {
            tracing::error!(target: "audit", error = %e, "audit checkpoint could not be made")
        }
    }
}

fn is_checkpoint_type(facts: &Facts) -> bool {
    facts.event_type == EventType::AuditCheckpoint
}

/// Each chained event with what the metrics count of it: checkpoints, which this writer adds, answer
/// nobody and decide nothing.
fn tallies(
    events: Vec<(Sealed, Facts)>,
    pending: &[(Option<Reply>, Recorded, bool)],
) -> impl Iterator<Item = (Sealed, Tally)> + '_ {
    let mut flags = pending.iter().map(|(_, _, count)| *count);
    events.into_iter().map(move |(event, facts)| {
        let count_decision = !is_checkpoint_type(&facts) && flags.next().unwrap_or(false);
        (
            event,
            Tally {
                facts,
                count_decision,
            },
        )
    })
}

fn is_checkpoint(event: &Value) -> bool {
    event.get("type").and_then(Value::as_str) == Some(EventType::AuditCheckpoint.as_str())
}

/// The head that `event` is, when it is not itself a checkpoint (nothing then follows the last one).
fn unsigned_head(event: &Value) -> Option<ChainHead> {
    if is_checkpoint(event) {
        return None;
    }
    Some(ChainHead {
        seq: event.get("seq").and_then(Value::as_u64)?,
        hash: event.get("hash").and_then(Value::as_str)?.to_owned(),
    })
}

/// When appended events that nobody waits for are synced at the latest; never, without any.
async fn sync_deadline(since: Option<Instant>) {
    match since {
        Some(since) => tokio::time::sleep_until((since + DEFERRED_SYNC_AFTER).into()).await,
        None => std::future::pending().await,
    }
}

/// The next tick of the checkpoint interval; never, without one.
async fn next_tick(tick: Option<&mut tokio::time::Interval>) {
    match tick {
        Some(tick) => {
            tick.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn answer(reply: Option<Reply>, result: Result<Recorded, AuditError>) {
    if let Some(reply) = reply {
        // The caller may have gone away; the event is recorded regardless.
        let _ = reply.send(result);
    }
}

fn fail_all(batch: Vec<Job>, error: &AuditError) {
    for job in batch {
        answer(job.reply, Err(error.clone()));
    }
}

fn fail_pending(pending: Vec<(Option<Reply>, Recorded, bool)>, error: &AuditError) {
    for (reply, _, _) in pending {
        answer(reply, Err(error.clone()));
    }
}

/// What the metrics count of one durable event.
pub(crate) struct Tally {
    pub(crate) facts: Facts,
    /// False when the decision was counted where it was made, or is none (checkpoints).
    pub(crate) count_decision: bool,
}

/// The metric updates one durable event implies.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MetricUpdates {
    pub(crate) event_type: &'static str,
    /// (decision, code label) for `sealgate_decisions_total`; code is "none" for an allow.
    pub(crate) decision: Option<(&'static str, String)>,
    /// outcome label for `sealgate_claims_total`.
    pub(crate) claim: Option<&'static str>,
}

pub(crate) fn metric_updates(tally: &Tally) -> MetricUpdates {
    let facts = &tally.facts;
    // An allowed call's ToolCallCompleted restates the decision its ToolCallAuthorized made: one call,
    // one decision (SPEC 20 r13).
    let restated = facts.event_type == EventType::ToolCallCompleted;
    let decision = match facts.decision {
        Some(decision) if tally.count_decision && !restated => {
            let code = facts
                .code
                .map_or_else(|| "none".to_owned(), |code| code.to_string());
            Some((decision.as_str(), code))
        }
        _ => None,
    };
    MetricUpdates {
        event_type: facts.event_type.as_str(),
        decision,
        claim: facts.claim,
    }
}

fn count_metrics(tally: &Tally) {
    let updates = metric_updates(tally);
    metrics::counter!("sealgate_audit_events_total", "type" => updates.event_type).increment(1);
    if let Some((decision, code)) = updates.decision {
        metrics::counter!("sealgate_decisions_total", "decision" => decision, "code" => code)
            .increment(1);
    }
    if let Some(outcome) = updates.claim {
        metrics::counter!("sealgate_claims_total", "outcome" => outcome).increment(1);
    }
}
