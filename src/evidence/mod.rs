//! Evidence that stands without trusting the gateway's database (SPEC 14): the gateway's signing key,
//! signed receipts, signed audit checkpoints, the JWK Set of `GET /v1/keys`, and the offline verifiers
//! of `sealgate audit verify --keys` and `sealgate receipt verify`.
//!
//! It knows nothing of what was decided: the pipeline tells it (a [`Statement`]) and the audit writer
//! asks it to sign the head it chained. Ed25519 signing and verification of receipts and checkpoints
//! happen here and nowhere else.

mod checkpoint;
pub mod cli;
mod jwks;
mod key;
mod receipt;
mod verify;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use checkpoint::{signed_bytes as checkpoint_signed_bytes, CHAIN};
pub use jwks::KeyRing;
pub use key::{kid_of, PublicKey, GENERATED_KEY_FILE};
pub use receipt::{verify as verify_receipt, Statement, Verified};
pub use verify::{verify_files, TrailReport};

use crate::audit::{AuditConfig, CheckpointOptions};
use crate::store::{SigningKeyRecord, Store, StoreError};
use key::Signer;

/// `signing:` in the configuration (SPEC 11, 14).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SigningConfig {
    /// The gateway's Ed25519 private key (PKCS#8 PEM, readable by its owner only). When null on the
    /// embedded store, a key is made at first start as `data_dir/signing.key`; required on PostgreSQL.
    pub key_file: Option<PathBuf>,
    /// SPKI PEM files of retired keys, still listed at `/v1/keys` so that what they signed verifies.
    pub previous_public_keys: Vec<PathBuf>,
}

/// What signing needs of the configuration, every path resolved against the configuration's folder.
pub struct SigningSetup {
    pub key_file: Option<PathBuf>,
    pub previous_public_keys: Vec<PathBuf>,
    pub data_dir: PathBuf,
    /// On a shared (PostgreSQL) store each replica is given its key, and publishes it there.
    pub shared_store: bool,
    pub replica_id: String,
}

/// The gateway's signing key and what it publishes.
pub struct Evidence {
    signer: Arc<Signer>,
    previous: Vec<PublicKey>,
    replica_id: String,
}

impl Evidence {
    /// Loads (or on the embedded store makes) the signing key, reads the retired keys, and on a shared
    /// store publishes this replica's key, so that every replica lists it.
    pub async fn start(config: &SigningSetup, store: &dyn Store) -> Result<Evidence, String> {
        let (signer, previous) = load_keys(config)?;
        if config.shared_store {
            let record = SigningKeyRecord {
                kid: signer.public().kid().to_owned(),
                public_key: signer.public().to_bytes(),
                replica_id: config.replica_id.clone(),
            };
            store
                .signing_key_publish(&record)
                .await
                .map_err(|e| format!("signing: cannot publish this replica's key: {e}"))?;
        }
        tracing::info!(kid = %signer.public().kid(), "signing receipts and audit checkpoints");
        Ok(Evidence {
            signer: Arc::new(signer),
            previous,
            replica_id: config.replica_id.clone(),
        })
    }

    /// The kid this replica signs with.
    pub fn kid(&self) -> &str {
        self.signer.public().kid()
    }

    /// Section 10's receipt `fields` completed with `statement` and signed (about 20 µs: call it in
    /// the request's own task).
    pub fn receipt(&self, fields: Map<String, Value>, statement: &Statement<'_>) -> Value {
        receipt::sign(&self.signer, &self.replica_id, fields, statement)
    }

    /// The audit writer's checkpoints, signed with this replica's key.
    pub fn checkpoint_options(&self, audit: &AuditConfig) -> CheckpointOptions {
        CheckpointOptions {
            every: audit.checkpoint_every,
            interval: Duration::from_secs(audit.checkpoint_secs),
            signer: self.signer.clone(),
        }
    }

    /// `GET /v1/keys`: this replica's key, the retired ones, and every key published in the store by
    /// any replica (a stored key whose kid is not its own is left out, and said in the log).
    pub async fn key_set(&self, store: &dyn Store) -> Result<Value, StoreError> {
        let published: Vec<PublicKey> = store
            .signing_keys()
            .await?
            .iter()
            .filter_map(|record| match PublicKey::from_bytes(&record.public_key) {
                Ok(key) if key.kid() == record.kid => Some(key),
                _ => {
                    tracing::error!(kid = %record.kid, "a stored signing key does not match its kid; not listed");
                    None
                }
            })
            .collect();
        let own = std::iter::once(self.signer.public());
        Ok(jwks::jwk_set(
            own.chain(&self.previous).chain(published.iter()),
        ))
    }
}

/// What one receipt of a typical call costs, and its Ed25519 signature alone, each the mean of `count`
/// (`sealgate bench sign`): the CPU that SPEC 14 adds to a call.
pub fn receipt_cost(count: usize) -> Result<(Duration, Duration), String> {
    let signer = Signer::new(crate::envelope::generate_signing_key()?)?;
    let digest = "0".repeat(64);
    let answer = serde_json::json!({"jsonrpc": "2.0", "id": 7,
        "result": {"content": [{"type": "text", "text": "ran tool.write"}]}});
    let serde_json::Value::Object(fields) = serde_json::json!({"request_id": digest, "claim": "PROCEED",
        "action_ref": digest, "claimed_at": "2026-12-01T10:00:00.000Z",
        "event_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "context": "agent-runtime",
        "context_version": digest})
    else {
        return Err("the bench receipt is not an object".to_owned());
    };
    let statement = Statement {
        decision: crate::audit::Decision::Allow,
        code: None,
        session_id: Some("exec-bench"),
        sub: Some("agent-bench"),
        tool: Some("tool.write"),
        payload_sha256: &digest,
        answer: Some(&answer),
        event_seq: 1,
    };
    let runs = u32::try_from(count).map_err(|_| "count is too large".to_owned())?;
    let started = std::time::Instant::now();
    for _ in 0..count {
        std::hint::black_box(receipt::sign(&signer, "bench", fields.clone(), &statement));
    }
    let receipts = started.elapsed() / runs;
    let message = crate::envelope::jcs_object(&fields);
    let started = std::time::Instant::now();
    for _ in 0..count {
        std::hint::black_box(signer.sign(&message));
    }
    Ok((receipts, started.elapsed() / runs))
}

/// The signing key and the retired public keys, as the configuration names them.
fn load_keys(config: &SigningSetup) -> Result<(Signer, Vec<PublicKey>), String> {
    let key = key::load(
        config.key_file.as_deref(),
        &config.data_dir,
        !config.shared_store,
    )?;
    let signer = Signer::new(key).map_err(|e| format!("signing.key_file: {e}"))?;
    let previous = read_previous(config)?;
    Ok((signer, previous))
}

fn read_previous(config: &SigningSetup) -> Result<Vec<PublicKey>, String> {
    config
        .previous_public_keys
        .iter()
        .enumerate()
        .map(|(index, path)| {
            key::read_public_pem(path)
                .map_err(|e| format!("signing.previous_public_keys[{index}]: {e}"))
        })
        .collect()
}

/// What `serve --check` finds wrong with `signing:` without making anything: an unreadable or
/// unprotected key file, a missing one on PostgreSQL, a retired key that is not a public key.
pub fn config_problems(config: &SigningSetup) -> Vec<String> {
    let generated = config.data_dir.join(GENERATED_KEY_FILE);
    let key = match &config.key_file {
        Some(path) => Some(key::read_key_file(path).map_err(|e| format!("signing.key_file: {e}"))),
        None if config.shared_store => Some(key::load(None, Path::new(""), false)),
        None if generated.exists() => {
            Some(key::read_key_file(&generated).map_err(|e| format!("signing key: {e}")))
        }
        // Made at first start.
        None => None,
    };
    key.and_then(Result::err)
        .into_iter()
        .chain(read_previous(config).err())
        .collect()
}
