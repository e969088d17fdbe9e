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

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;

use super::chain::{format_at, seal};
use super::event::{AuditEvent, Decision, EventType};
use super::sink::Copies;
use super::{AuditBackend, AuditError, ChainHead, ClaimSettlement, Recorded};
use crate::store::StoreError;

pub(crate) type Reply = oneshot::Sender<Result<Recorded, AuditError>>;

pub(crate) struct Job {
    pub(crate) event: Map<String, Value>,
    /// `None` for fire-and-forget events (unreadable bodies).
    pub(crate) reply: Option<Reply>,
    /// False when the decision was already counted where it was made (unreadable bodies are counted
    /// even when their event is suppressed).
    pub(crate) count_decision: bool,
    /// A claim's settlement to write with this event (see [`AuditBackend::append`]).
    /// Boxed: two claim records would make every queued job that large.
    pub(crate) settlement: Option<Box<ClaimSettlement>>,
}

pub(crate) enum Command {
    Record(Job),
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
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            max_batch: 512,
            queue_capacity: 8192,
            unreadable_per_second: None,
            suppressed_report_interval: Duration::from_secs(10),
            replica: None,
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
}

impl Writer {
    pub(crate) async fn run(mut self) {
        let mut report = tokio::time::interval(self.report_interval);
        report.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The first tick completes at once; consume it so reports come one interval apart.
        report.tick().await;
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
        }
        let summaries = self.summaries();
        if !summaries.is_empty() {
            self.commit(summaries).await;
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
            Command::Record(job) => batch.push(job),
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
                "request bodies were refused without an event of their own (rate limit)",
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
            match event.into_object(false) {
                Ok(event) => jobs.push(Job {
                    event,
                    reply: None,
                    count_decision: false,
                    settlement: None,
                }),
                Err(e) => {
                    tracing::error!(target: "audit", error = %e, "suppressed-count event is invalid")
                }
            }
        }
        jobs
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
    ) -> Result<Option<(Vec<Value>, Vec<Recorded>, ChainHead)>, StoreError> {
        let believed = self.head.clone();
        let mut chained_after = None;
        let mut chainer = |head: &ChainHead| {
            let (chained, recorded, new_head) = chain(batch, head);
            chained_after = Some((head.clone(), recorded, new_head));
            chained
        };
        let chained = self
            .backend
            .append_in_turn(&mut chainer, settlements)
            .await?;
        let Some((after, recorded, new_head)) = chained_after else {
            return Err(StoreError::Corrupt(
                "the store wrote a batch without chaining it".into(),
            ));
        };
        if believed.as_ref() != Some(&after) {
            metrics::counter!("sealgate_audit_head_conflicts_total").increment(1);
            self.contended_until = Some(Instant::now() + CONTENDED_FOR);
        }
        if chained.is_empty() {
            return Ok(None);
        }
        metrics::counter!("sealgate_audit_batches_total").increment(1);
        Ok(Some((chained, recorded, new_head)))
    }

    /// Stores `batch` chained after the head this writer believes in, by compare-and-set: `HeadMoved` when
    /// another writer got there first. None when nothing was left to chain.
    async fn append_racing(
        &mut self,
        batch: &mut Vec<Job>,
        settlements: &[ClaimSettlement],
    ) -> Result<Option<(Vec<Value>, Vec<Recorded>, ChainHead)>, StoreError> {
        let head = self.current_head().await?;
        let (chained, recorded, new_head) = chain(batch, &head);
        if chained.is_empty() {
            return Ok(None);
        }
        self.backend.append(&head, &chained, settlements).await?;
        metrics::counter!("sealgate_audit_batches_total").increment(1);
        Ok(Some((chained, recorded, new_head)))
    }

    /// Chains one batch, makes it durable, and answers its callers.
    async fn commit(&mut self, mut batch: Vec<Job>) {
        if let Some(replica) = &self.replica {
            for job in &mut batch {
                job.event
                    .insert("replica".to_owned(), Value::from(replica.as_str()));
            }
        }
        let settlements: Vec<ClaimSettlement> = batch
            .iter_mut()
            .filter_map(|job| job.settlement.take().map(|settlement| *settlement))
            .collect();
        let mut attempts = 0;
        let (chained, recorded, new_head) = loop {
            let contended = self
                .contended_until
                .is_some_and(|until| Instant::now() < until);
            let written = if contended {
                self.append_in_turn(&mut batch, &settlements).await
            } else {
                self.append_racing(&mut batch, &settlements).await
            };
            match written {
                Ok(Some(written)) => break written,
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
        let pending: Vec<(Option<Reply>, Recorded, bool)> = batch
            .into_iter()
            .zip(recorded)
            .map(|(job, recorded)| (job.reply, recorded, job.count_decision))
            .collect();

        // The store is the record of truth: once its commit holds the batch, the callers are answered
        // and the copies (file, stdout) follow off the reply path (SPEC 12 r3: the file is a copy,
        // written after the commit and extended from the store at start-up).
        if let Err(e) = self.backend.sync().await {
            self.head = None;
            tracing::error!(target: "audit", error = %e, "audit store sync failed");
            fail_pending(pending, &AuditError::Store(e));
            return;
        }
        self.head = Some(new_head);
        for (event, (reply, recorded, count_decision)) in chained.iter().zip(pending) {
            count_metrics(event, count_decision);
            answer(reply, Ok(recorded));
        }
        if let Some(copies) = &self.copies {
            copies.send(chained);
        }
    }
}

/// How often one batch is chained again because other replicas moved the head meanwhile.
const MAX_HEAD_RETRIES: usize = 64;

/// After another writer moved the chain head, how long this one takes turns (see
/// [`AuditBackend::append_in_turn`]) instead of racing it with compare-and-sets: as long as the head
/// keeps moving under it, and this long after.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// How long a contended writer waits for more events before taking its turn at the head.
const CONTENDED_LINGER: Duration = Duration::from_millis(1);

/// Seals the batch after `head`. Jobs whose event cannot be sealed are answered with the error and
/// removed, so `batch`, the events and the receipts stay in step.
fn chain(batch: &mut Vec<Job>, head: &ChainHead) -> (Vec<Value>, Vec<Recorded>, ChainHead) {
    let mut chained = Vec::with_capacity(batch.len());
    let mut receipts = Vec::with_capacity(batch.len());
    let mut seq = head.seq;
    let mut prev_hash = head.hash.clone();
    let mut kept = Vec::with_capacity(batch.len());
    for job in batch.drain(..) {
        let Some(next_seq) = seq.checked_add(1) else {
            answer(
                job.reply,
                Err(AuditError::InvalidEvent("audit seq overflow".to_owned())),
            );
            continue;
        };
        let at = format_at(chrono::Utc::now());
        match seal(job.event.clone(), next_seq, &prev_hash, &at) {
            Ok((event, recorded)) => {
                seq = next_seq;
                prev_hash.clone_from(&recorded.hash);
                chained.push(event);
                receipts.push(recorded);
                kept.push(job);
            }
            Err(e) => answer(job.reply, Err(AuditError::InvalidEvent(e))),
        }
    }
    *batch = kept;
    let head = ChainHead {
        seq,
        hash: prev_hash,
    };
    (chained, receipts, head)
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

/// The metric updates one durable event implies.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MetricUpdates {
    pub(crate) event_type: String,
    /// (decision, code label) for `sealgate_decisions_total`; code is "none" for an allow.
    pub(crate) decision: Option<(String, String)>,
    /// outcome label for `sealgate_claims_total`.
    pub(crate) claim: Option<&'static str>,
}

pub(crate) fn metric_updates(event: &Value, count_decision: bool) -> MetricUpdates {
    let text = |key: &str| event.get(key).and_then(Value::as_str);
    let event_type = text("type").unwrap_or("unknown").to_owned();
    let decision = if count_decision {
        text("decision")
            .and_then(|d| d.parse::<Decision>().ok())
            .map(|d| {
                let code = event
                    .get("code")
                    .and_then(Value::as_u64)
                    .map_or_else(|| "none".to_owned(), |c| c.to_string());
                (d.as_str().to_owned(), code)
            })
    } else {
        None
    };
    let claim = match (event_type.parse::<EventType>(), text("claim")) {
        (Ok(EventType::ToolCallAuthorized), Some("PROCEED")) => Some("PROCEED"),
        (Ok(EventType::ClaimSkipped), _) => Some("SKIP"),
        (Ok(EventType::ClaimBlocked), _) => Some("PENDING"),
        _ => None,
    };
    MetricUpdates {
        event_type,
        decision,
        claim,
    }
}

fn count_metrics(event: &Value, count_decision: bool) {
    let updates = metric_updates(event, count_decision);
    metrics::counter!("sealgate_audit_events_total", "type" => updates.event_type).increment(1);
    if let Some((decision, code)) = updates.decision {
        metrics::counter!("sealgate_decisions_total", "decision" => decision, "code" => code)
            .increment(1);
    }
    if let Some(outcome) = updates.claim {
        metrics::counter!("sealgate_claims_total", "outcome" => outcome).increment(1);
    }
}
