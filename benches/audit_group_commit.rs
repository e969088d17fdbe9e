//! Measures what group commit buys: audit events per second into a store that really syncs a file on
//! every append, with the writer batching (default cap) versus one append per event (cap 1), for many
//! concurrent callers and for one caller at a time.
//!
//! Run: `cargo bench --bench audit_group_commit` (set AUDIT_BENCH_EVENTS to change the event count).

use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sealgate::audit::testing::JsonlFileBackend;
use sealgate::audit::{AuditBackend, AuditConfig, AuditEvent, AuditLog, EventType, WriterOptions};

struct Outcome {
    events: usize,
    elapsed: Duration,
    appends: usize,
}

fn event(n: usize) -> AuditEvent {
    AuditEvent::new(EventType::ToolCallAuthorized)
        .session_id(format!("exec-{}", n % 16))
        .sub("agent-7")
        .scp("agent-runtime")
        .tool("fs.read_file")
        .signature(format!("bench-signature-{n:08}"))
        .envelope_timestamp(1_771_338_721)
        .claim("NONE")
}

async fn run(events: usize, callers: usize, max_batch: usize) -> Result<Outcome, Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(JsonlFileBackend::open(&dir.path().join("store.jsonl"))?);
    let backend: Arc<dyn AuditBackend> = store.clone();
    let options = WriterOptions {
        max_batch,
        ..WriterOptions::default()
    };
    let log = AuditLog::start_with(backend, &AuditConfig::default(), options).await?;
    let per_caller = events / callers;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(callers);
    for caller in 0..callers {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..per_caller {
                log.record(event(caller * per_caller + n)).await?;
            }
            Ok::<(), sealgate::audit::AuditError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    log.shutdown().await;
    let report = log.verify_store().await.map_err(|e| e.to_string())?;
    if report.events != (per_caller * callers) as u64 {
        return Err(format!(
            "store holds {} events, expected {}",
            report.events,
            per_caller * callers
        )
        .into());
    }
    Ok(Outcome {
        events: per_caller * callers,
        elapsed,
        appends: store.append_calls(),
    })
}

fn print(label: &str, outcome: &Outcome) {
    let secs = outcome.elapsed.as_secs_f64().max(f64::EPSILON);
    println!(
        "{label:<44} {:>6} events {:>8.3} s {:>10.0} events/s {:>6} appends {:>7.1} events/append",
        outcome.events,
        secs,
        outcome.events as f64 / secs,
        outcome.appends,
        outcome.events as f64 / outcome.appends.max(1) as f64,
    );
}

fn main() -> Result<(), Box<dyn Error>> {
    let events: usize = std::env::var("AUDIT_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        println!("audit group commit, store = JSON lines + fdatasync per append, {events} events");
        print(
            "64 callers, group commit (cap 512)",
            &run(events, 64, 512).await?,
        );
        print(
            "64 callers, one append per event (cap 1)",
            &run(events, 64, 1).await?,
        );
        let sequential = (events / 4).max(1);
        print(
            "1 caller, group commit (cap 512)",
            &run(sequential, 1, 512).await?,
        );
        Ok(())
    })
}
