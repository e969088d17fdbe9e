//! Why evidence could not be made or checked. None of these reaches an HTTP answer: they stop the
//! gateway's start (`serve`, `serve --check`) or are what the offline verifiers print, so each
//! message is the operator's only clue and keeps the wording the docs and tests quote.

use std::path::PathBuf;

/// A key not read or made, a key set or audit trail not trusted, a signature that does not verify.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `at` (a configuration field, file, URL or list entry) names where `source` happened.
    #[error("{at}: {source}")]
    In { at: String, source: Box<Error> },
    /// `field` is the subject of `source`'s sentence (`x is not unpadded base64url`).
    #[error("{field} {source}")]
    Of {
        field: &'static str,
        source: Box<Error>,
    },
    #[error("cannot {action} {}: {error}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// A key that group or other users may read could sign in the gateway's name: refused, not used.
    #[error(
        "{} has mode {mode:04o}: group or other users may read the gateway's signing key; \
         make it readable by its owner only (chmod 600)",
        .path.display()
    )]
    KeyReadableByOthers { path: PathBuf, mode: u32 },
    /// A file whose first line is not the PEM form it must hold; `form` names it.
    #[error("{} is not {form}", .path.display())]
    NotPem { path: PathBuf, form: &'static str },
    #[error(
        "required on a postgres:// store (each replica signs with a key it is given; make one \
         with `sealgate keygen --out DIR --name signing`)"
    )]
    KeyRequired,
    /// The envelope module's key code refused or could not make a key; its message as it gave it.
    #[error(transparent)]
    Key(#[from] crate::envelope::KeyError),
    /// A folder that could not be synced (the file helpers' message).
    #[error("{0}")]
    Sync(String),
    #[error("signing: cannot {action}: {error}")]
    Store {
        action: &'static str,
        error: crate::store::StoreError,
    },
    #[error("is not unpadded base64url: {0}")]
    NotBase64(base64::DecodeError),
    #[error("decodes to {length} bytes, not {expected}")]
    WrongLength { length: usize, expected: usize },
    #[error("does not verify under key {kid}")]
    BadSignature { kid: String },
    #[error(
        "sig.value {0}: a field of the receipt was changed after signing, or the signature was"
    )]
    ReceiptChanged(Box<Error>),
    /// A field of a key set, checkpoint or receipt that is absent.
    #[error("{0} is missing")]
    Missing(&'static str),
    /// A field that is absent or not of the type `expected`.
    #[error("{field} is missing or not {expected}")]
    MissingOrNot {
        field: &'static str,
        expected: &'static str,
    },
    /// A field whose value is not the one allowed; `rule` is how the verifier says so.
    #[error("{field} {rule} {value:?}")]
    NotValue {
        field: &'static str,
        rule: &'static str,
        value: &'static str,
    },
    #[error("the JWK Set has no \"keys\" array")]
    NoKeys,
    #[error("not a JWK Set: {0}")]
    NotJwkSet(String),
    #[error("{} is not strict JSON: {error}", .path.display())]
    NotJson { path: PathBuf, error: String },
    #[error("not an Ed25519 key (kty \"OKP\", crv \"Ed25519\")")]
    NotEd25519,
    #[error("kid {kid:?} is not the kid of its key ({actual:?})")]
    WrongKid { kid: String, actual: String },
    #[error("{field} {kid:?} is not a key of the given JWK Set")]
    UnknownKid { field: &'static str, kid: String },
    /// A URL that only HTTPS or a loopback host may serve (the outbound module's reason).
    #[error("{0}")]
    Insecure(String),
    #[error("{url} is not a URL: {error}")]
    NotUrl { url: String, error: url::ParseError },
    /// The HTTP client could not be made (its TLS setup).
    #[error("{0}")]
    Client(reqwest::Error),
    #[error("cannot {action} {url}: {error}")]
    Fetch {
        action: &'static str,
        url: String,
        error: reqwest::Error,
    },
    #[error("{url} answered {status}")]
    Answered { url: String, status: String },
    #[error("{0}")]
    Chain(crate::audit::ChainBreak),
    #[error("no AuditCheckpoint in these files: none of their {0} events is signed")]
    NoCheckpoint(u64),
    #[error("checkpoint.seq {seq} is not the seq of the event before it ({before})")]
    SeqNotBefore { seq: u64, before: u64 },
    #[error("checkpoint.hash is not the hash of the event before it (seq {seq})")]
    HashNotBefore { seq: u64 },
    #[error("{}: line 1 is not an audit event with a seq", .path.display())]
    NoFirstSeq { path: PathBuf },
    #[error("count is too large")]
    CountTooLarge,
}

impl Error {
    /// `self`, said to happen in `at`.
    pub fn at(self, at: impl Into<String>) -> Error {
        Error::In {
            at: at.into(),
            source: Box::new(self),
        }
    }

    /// `self`, said of `field`.
    pub fn of(self, field: &'static str) -> Error {
        Error::Of {
            field,
            source: Box::new(self),
        }
    }
}

/// The gateway's start, `sealgate bench` and the demo still report their errors as text.
impl From<Error> for String {
    fn from(error: Error) -> String {
        error.to_string()
    }
}
