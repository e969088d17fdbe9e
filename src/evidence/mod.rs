//! Evidence that stands without trusting the gateway's database (SPEC 14): the gateway's signing key,
//! signed receipts, signed audit checkpoints, the JWK Set of `GET /v1/keys`, and the offline verifiers
//! of `sealgate audit verify --keys` and `sealgate receipt verify`.
//!
//! It knows nothing of what was decided: the pipeline tells it (a [`Statement`]) and the audit writer
//! asks it to sign the head it chained. Ed25519 signing and verification of receipts and checkpoints
//! happen here and nowhere else.

mod checkpoint;
pub mod cli;
mod error;
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
pub use error::Error;
pub use jwks::KeyRing;
pub use key::{kid_of, PublicKey, GENERATED_KEY_FILE};
pub use receipt::{verify as verify_receipt, Statement, Verified};
pub use verify::{verify_files, TrailReport};

use crate::audit::{AuditConfig, CheckpointOptions};
use crate::store::{SigningKeyRecord, Store};
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
    /// SPKI PEM files of the keys the other replicas sign with (PostgreSQL): listed at `/v1/keys` so
    /// that what any replica signed verifies with the set that this one serves (SPEC 20 rule 6).
    pub replica_public_keys: Vec<PathBuf>,
}

/// What signing needs of the configuration, every path resolved against the configuration's folder.
pub struct SigningSetup {
    pub key_file: Option<PathBuf>,
    pub previous_public_keys: Vec<PathBuf>,
    pub replica_public_keys: Vec<PathBuf>,
    pub data_dir: PathBuf,
    /// On a shared (PostgreSQL) store each replica is given its key, and notes it there (a hint only).
    pub shared_store: bool,
    pub replica_id: String,
}

/// The gateway's signing key and what it publishes.
pub struct Evidence {
    signer: Arc<Signer>,
    /// `GET /v1/keys`: the configured keys only, fixed at start-up (SPEC 20 rule 6).
    key_set: Value,
    replica_id: String,
}

impl Evidence {
    /// Loads (or on the embedded store makes) the signing key and reads the public keys the
    /// configuration names. On a shared store it also notes this replica's key there and warns about
    /// every noted key that the configuration does not name: a hint to the operator, never trust.
    pub async fn start(config: &SigningSetup, store: &dyn Store) -> Result<Evidence, Error> {
        let (signer, others) = load_keys(config)?;
        let key_set = jwks::jwk_set(std::iter::once(signer.public()).chain(&others));
        if config.shared_store {
            note_replica_key(store, &signer, &others, &config.replica_id).await?;
        }
        tracing::info!(kid = %signer.public().kid(), "signing receipts and audit checkpoints");
        Ok(Evidence {
            signer: Arc::new(signer),
            key_set,
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

    /// `GET /v1/keys`: this replica's key, the retired ones and the other replicas', as configured.
    /// Nothing in it comes from the store: evidence must stand without trusting the database.
    pub fn key_set(&self) -> &Value {
        &self.key_set
    }
}

/// Notes this replica's key in the shared store, and warns about each key noted there by a replica
/// whose key the configuration does not name: what that replica signs will not verify with this
/// replica's `/v1/keys` (or the row was planted). The store's keys are never published nor trusted.
async fn note_replica_key(
    store: &dyn Store,
    signer: &Signer,
    configured: &[PublicKey],
    replica_id: &str,
) -> Result<(), Error> {
    let own = signer.public();
    let record = SigningKeyRecord {
        kid: own.kid().to_owned(),
        public_key: own.to_bytes(),
        replica_id: replica_id.to_owned(),
    };
    store
        .signing_key_publish(&record)
        .await
        .map_err(|error| Error::Store {
            action: "note this replica's key in the store",
            error,
        })?;
    let noted = store.signing_keys().await.map_err(|error| Error::Store {
        action: "read the keys noted in the store",
        error,
    })?;
    let is_configured =
        |kid: &str| kid == own.kid() || configured.iter().any(|key| key.kid() == kid);
    for record in noted.iter().filter(|record| !is_configured(&record.kid)) {
        tracing::warn!(kid = %record.kid, replica = %record.replica_id,
            "a replica signs with a key that signing.replica_public_keys does not name: \
             /v1/keys does not list it, so what that replica signs does not verify here");
    }
    Ok(())
}

/// What one receipt of a typical call costs, and its Ed25519 signature alone, each the mean of `count`
/// (`sealgate bench sign`): the CPU that SPEC 14 adds to a call.
pub fn receipt_cost(count: usize) -> Result<(Duration, Duration), Error> {
    let signer = Signer::new(crate::envelope::generate_signing_key().map_err(Error::Key)?)?;
    let digest = "0".repeat(64);
    let answer = serde_json::json!({"jsonrpc": "2.0", "id": 7,
        "result": {"content": [{"type": "text", "text": "ran tool.write"}]}});
    let fields: Map<String, Value> = [
        ("request_id", digest.as_str()),
        ("claim", "PROCEED"),
        ("action_ref", digest.as_str()),
        ("claimed_at", "2026-12-01T10:00:00.000Z"),
        ("event_id", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"),
        ("context", "agent-runtime"),
        ("context_version", digest.as_str()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), Value::from(value)))
    .collect();
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
    let runs = u32::try_from(count).map_err(|_| Error::CountTooLarge)?;
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

/// The signing key, and the public keys the configuration names besides it (retired ones, then the
/// other replicas').
fn load_keys(config: &SigningSetup) -> Result<(Signer, Vec<PublicKey>), Error> {
    let key = key::load(
        config.key_file.as_deref(),
        &config.data_dir,
        !config.shared_store,
    )?;
    let signer = Signer::new(key).map_err(|e| e.at("signing.key_file"))?;
    Ok((signer, read_public_keys(config)?))
}

/// `previous_public_keys`, then `replica_public_keys`.
fn read_public_keys(config: &SigningSetup) -> Result<Vec<PublicKey>, Error> {
    let mut keys = read_pem_list("previous_public_keys", &config.previous_public_keys)?;
    keys.extend(read_pem_list(
        "replica_public_keys",
        &config.replica_public_keys,
    )?);
    Ok(keys)
}

/// The SPKI PEM keys of `signing.<list>`; an error names the key's place in the list.
fn read_pem_list(list: &str, paths: &[PathBuf]) -> Result<Vec<PublicKey>, Error> {
    paths
        .iter()
        .enumerate()
        .map(|(index, path)| {
            key::read_public_pem(path).map_err(|e| e.at(format!("signing.{list}[{index}]")))
        })
        .collect()
}

/// What `serve --check` finds wrong with `signing:` without making anything: an unreadable or
/// unprotected key file, a missing one on PostgreSQL, a listed public key that is not one.
pub fn config_problems(config: &SigningSetup) -> Vec<String> {
    let generated = config.data_dir.join(GENERATED_KEY_FILE);
    let key = match &config.key_file {
        Some(path) => Some(key::read_key_file(path).map_err(|e| e.at("signing.key_file"))),
        None if config.shared_store => Some(key::load(None, Path::new(""), false)),
        None if generated.exists() => {
            Some(key::read_key_file(&generated).map_err(|e| e.at("signing key")))
        }
        // Made at first start.
        None => None,
    };
    key.and_then(Result::err)
        .into_iter()
        .chain(read_public_keys(config).err())
        .map(|error| error.to_string())
        .collect()
}
