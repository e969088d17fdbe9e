//! The offline verifiers' commands: `sealgate audit verify FILE... [--keys JWKS|URL]` and
//! `sealgate receipt verify --keys JWKS|URL RESPONSE_FILE [--envelope FILE]`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::jwks::KeyRing;
use super::key::io_error;
use super::{receipt, verify, Error};

/// Exit 0 with a summary, or 1 naming the event (or file) that broke.
pub async fn audit_verify(files: &[PathBuf], keys: Option<&str>) -> ExitCode {
    let ring = match keys {
        Some(source) => match KeyRing::load(source).await {
            Ok(ring) => Some(ring),
            Err(e) => return fail(&format!("--keys: {e}")),
        },
        None => None,
    };
    let report = match verify::verify_files(files, ring.as_ref()) {
        Ok(report) => report,
        Err(broken) => {
            eprintln!("broken: {broken}");
            explain_replica_log(files);
            return ExitCode::FAILURE;
        }
    };
    let chain = &report.chain;
    println!(
        "ok: {} events, seq {}..{}, chain intact (first prev_hash {}, last hash {})",
        chain.events, chain.first_seq, chain.last_seq, chain.first_prev_hash, chain.last_hash
    );
    match (&ring, report.last_checkpoint) {
        (None, _) => println!(
            "{} checkpoints, signatures not checked (give --keys with the gateway's /v1/keys)",
            report.checkpoints
        ),
        (Some(_), Some(last)) => println!(
            "ok: {} checkpoints verified (kid {}); {}",
            report.checkpoints,
            report.kids.join(", "),
            signed_range(chain.first_seq, last)
        ),
        (Some(_), None) => {}
    }
    println!(
        "{} events follow the last checkpoint (unsigned)",
        report.unsigned_tail
    );
    ExitCode::SUCCESS
}

/// What the last checkpoint (at seq `last`) signs of files that begin at `first_seq`: the event before
/// it and, through the chain, every earlier one. Only seqs that the files hold are named as a range.
fn signed_range(first_seq: u64, last: u64) -> String {
    if last > first_seq {
        format!(
            "the last, at seq {last}, signs seq {first_seq}..{}",
            last - 1
        )
    } else {
        format!(
            "the last, at seq {last}, is the files' first event: it signs the chain before them \
             (through seq {}), none of their events",
            last.saturating_sub(1)
        )
    }
}

/// A whole-chain check that failed on one file that reads as a replica's own log (PostgreSQL: the events
/// this replica wrote, others' seqs missing) says so, and what to run instead.
fn explain_replica_log(files: &[PathBuf]) {
    let [file] = files else { return };
    let Ok(opened) = std::fs::File::open(file) else {
        return;
    };
    if let Ok(report) = crate::audit::verify_replica_log(std::io::BufReader::new(opened)) {
        if report.gaps > 0 {
            eprintln!(
                "this file reads as {report}. A replica's audit.file is not a whole chain: \
                 `sealgate audit verify --replica-log` checks it as a replica's log, and the whole \
                 chain is GET /v1/audit/export"
            );
        }
    }
}

/// `sealgate audit verify --replica-log FILE`: checks a replica's own audit.file as such (SPEC 12).
pub fn replica_log_verify(files: &[PathBuf]) -> ExitCode {
    let [file] = files else {
        return fail("--replica-log checks one file");
    };
    let opened = match std::fs::File::open(file) {
        Ok(opened) => opened,
        Err(e) => return fail(&format!("cannot open {}: {e}", file.display())),
    };
    match crate::audit::verify_replica_log(std::io::BufReader::new(opened)) {
        Ok(report) => {
            println!("ok: {report}");
            ExitCode::SUCCESS
        }
        Err(broken) => fail(&format!("broken: {broken}")),
    }
}

/// Exit 0 only when the receipt's signature, its `answer_sha256` and (with an envelope) its
/// `payload_sha256` all hold; otherwise 1, naming each problem.
pub async fn receipt_verify(keys: &str, response: &Path, envelope: Option<&Path>) -> ExitCode {
    let checked = async {
        let ring = KeyRing::load(keys).await.map_err(|e| e.at("--keys"))?;
        let body = read_json(response)?;
        let envelope = envelope.map(read_json).transpose()?;
        Ok::<_, Error>(receipt::verify(&body, &ring, envelope.as_ref()))
    };
    match checked.await {
        Err(e) => fail(&e.to_string()),
        Ok(Ok(verified)) => {
            println!(
                "ok: receipt signed by kid {}: decision {}, event_seq {}, issued_at {}",
                verified.kid, verified.decision, verified.event_seq, verified.issued_at
            );
            if verified.decision == "allow" {
                println!("ok: answer_sha256 matches the response's payload");
            }
            if verified.envelope_checked {
                println!("ok: payload_sha256 matches the envelope's payload");
            }
            ExitCode::SUCCESS
        }
        Ok(Err(problems)) => {
            for problem in problems {
                eprintln!("broken: {problem}");
            }
            ExitCode::FAILURE
        }
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, Error> {
    let bytes = std::fs::read(path).map_err(io_error("read", path))?;
    crate::strict_json::parse_strict_json(&bytes).map_err(|error| Error::NotJson {
        path: path.to_path_buf(),
        error,
    })
}

fn fail(message: &str) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}
