//! A replica's own `audit.file` (SPEC 12): the events that one replica wrote into the chain that all
//! replicas share, with the other replicas' seqs missing in between. Such a file cannot show that the
//! chain is whole, nor that none of the replica's own events is missing; what it can show is checked
//! here: each event is as it was sealed (its own hash), its seqs only rise, all of them name one
//! replica, and events whose seqs follow each other are linked. The whole chain is
//! `GET /v1/audit/export`, which `verify_chain` checks.

use std::io::BufRead;

use serde_json::Value;

use super::chain::{read_event, ChainBreak, GENESIS_HASH};

/// What a replica's log was found to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaLogReport {
    pub replica: String,
    pub events: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// Pairs of lines with consecutive seqs, whose link (`prev_hash`) was checked.
    pub links: u64,
    /// Places where seqs skip: other replicas' events, which this file cannot check.
    pub gaps: u64,
}

impl std::fmt::Display for ReplicaLogReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replica {:?}'s own log: {} events, seq {}..{}; each event's hash holds, seqs rise, {} \
             link(s) between consecutive seqs hold, {} gap(s) where other replicas wrote. A replica's \
             log cannot show that the chain is whole or that none of its events is missing: verify \
             the whole chain, GET /v1/audit/export",
            self.replica, self.events, self.first_seq, self.last_seq, self.links, self.gaps
        )
    }
}

/// Checks a replica's `audit.file`; names the first line that breaks what such a file must hold.
pub fn verify_replica_log<R: BufRead>(reader: R) -> Result<ReplicaLogReport, ChainBreak> {
    let mut report: Option<ReplicaLogReport> = None;
    let mut last_hash = String::new();
    for (index, line) in reader.lines().enumerate() {
        let line_number = index + 1;
        let (event, linked) = read_event(line_number, line)?;
        let broken = |reason: String| ChainBreak {
            line: line_number,
            seq: Some(linked.seq),
            event_id: event["event_id"].as_str().map(str::to_owned),
            reason,
        };
        let Some(replica) = event.get("replica").and_then(Value::as_str) else {
            return Err(broken("the event names no replica".to_owned()));
        };
        if (linked.seq == 1) != (linked.prev_hash == GENESIS_HASH) {
            return Err(broken(
                "only seq 1 has, and must have, a prev_hash of 64 zeros".to_owned(),
            ));
        }
        match report.as_mut() {
            None => {
                report = Some(ReplicaLogReport {
                    replica: replica.to_owned(),
                    events: 1,
                    first_seq: linked.seq,
                    last_seq: linked.seq,
                    links: 0,
                    gaps: 0,
                })
            }
            Some(report) => {
                if replica != report.replica {
                    return Err(broken(format!(
                        "written by replica {replica:?}, in the log of replica {:?}",
                        report.replica
                    )));
                }
                if linked.seq <= report.last_seq {
                    return Err(broken(format!(
                        "seq {} follows seq {}: seqs must rise",
                        linked.seq, report.last_seq
                    )));
                }
                if linked.seq == report.last_seq + 1 {
                    if linked.prev_hash != last_hash {
                        return Err(broken(
                            "prev_hash is not the hash of the previous line's event".to_owned(),
                        ));
                    }
                    report.links += 1;
                } else {
                    report.gaps += 1;
                }
                report.events += 1;
                report.last_seq = linked.seq;
            }
        }
        last_hash = linked.hash;
    }
    report.ok_or_else(|| ChainBreak {
        line: 0,
        seq: None,
        event_id: None,
        reason: "the file holds no events".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::audit::chain::{seal, Link};
    use crate::audit::{AuditEvent, EventType};

    /// A chain of `count` events written alternately by replicas r0 and r1, as JSON lines.
    fn shared_chain(count: u64) -> Vec<Value> {
        let event = AuditEvent::new(EventType::SessionCreated)
            .into_unsealed(false)
            .unwrap();
        let mut prev = GENESIS_HASH.to_owned();
        (1..=count)
            .map(|seq| {
                let replica = format!("r{}", seq % 2);
                let link = Link {
                    seq,
                    prev_hash: &prev,
                    at: "2026-01-01T00:00:00.000Z",
                    replica: Some(&replica),
                };
                let (sealed, _, recorded) = seal(&event, &link).unwrap();
                prev = recorded.hash;
                serde_json::from_str(&sealed.line).unwrap()
            })
            .collect()
    }

    fn lines(events: &[&Value]) -> String {
        events.iter().map(|e| format!("{e}\n")).collect()
    }

    fn verify(events: &[&Value]) -> Result<ReplicaLogReport, ChainBreak> {
        verify_replica_log(std::io::Cursor::new(lines(events)))
    }

    #[test]
    fn a_replicas_own_events_verify_as_its_log_and_not_as_a_chain() {
        let chain = shared_chain(6);
        let r1: Vec<&Value> = chain.iter().filter(|e| e["replica"] == "r1").collect();
        let report = verify(&r1).unwrap();
        assert_eq!(
            (
                report.replica.as_str(),
                report.events,
                report.first_seq,
                report.last_seq
            ),
            ("r1", 3, 1, 5)
        );
        assert_eq!((report.links, report.gaps), (0, 2));
        let broken = crate::audit::verify_chain(std::io::Cursor::new(lines(&r1))).unwrap_err();
        assert!(broken.reason.contains("seq 3 follows seq 1"), "{broken}");
        // Consecutive seqs are linked: the whole chain, read as one replica's log, names the mix.
        let all: Vec<&Value> = chain.iter().collect();
        let mixed = verify(&all).unwrap_err();
        assert!(mixed.reason.contains("replica \"r0\""), "{mixed}");
    }

    #[test]
    fn a_changed_reordered_or_unnamed_event_breaks_a_replicas_log() {
        let chain = shared_chain(4);
        let r0: Vec<&Value> = chain.iter().filter(|e| e["replica"] == "r0").collect();
        let mut changed = r0[1].clone();
        changed["type"] = json!("SessionRevoked");
        let broken = verify(&[r0[0], &changed]).unwrap_err();
        assert_eq!(
            (broken.line, broken.reason.as_str()),
            (2, "hash does not match the event's content")
        );
        let broken = verify(&[r0[1], r0[0]]).unwrap_err();
        assert!(broken.reason.contains("seqs must rise"), "{broken}");
        assert!(verify(&[]).is_err());
    }
}
