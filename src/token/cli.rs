//! `sealgate token operator|agent`: mint the two token kinds the gateway verifies (SPEC section 4) with
//! an Ed25519 key, so that nobody has to hand-write JWT claims. The JWT goes to stdout; `--explain`
//! describes every claim it set on stderr, so `TOKEN=$(sealgate token … --explain)` still works.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use super::mint::{sign_eddsa, MintError, NewAgentToken, NewOperatorToken};
use super::OperatorAuthConfig;

/// A token is a bearer credential: lifetimes past this are refused as a likely mistake.
const MAX_TTL_SECS: i64 = 30 * 24 * 3600;

#[derive(Subcommand)]
pub enum TokenCommand {
    /// An operator token for the control API (`Authorization: Bearer …`).
    Operator(OperatorArgs),
    /// An agent token, the `security_token` of an envelope.
    Agent(AgentArgs),
}

#[derive(Args)]
pub struct CommonArgs {
    /// The Ed25519 private key that signs (PKCS#8 PEM, keygen JSON, or the seed in hex or base64); its
    /// public half must be in the gateway's `operator_auth.keys` or `agent_tokens.keys`. `@FILE` works too.
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// How long the token lives: seconds, or a number with s, m, h or d (at most 30d).
    #[arg(long, default_value = "1h", value_parser = parse_ttl)]
    ttl: i64,
    /// `iss`: required when the gateway's configuration names an issuer.
    #[arg(long)]
    iss: Option<String>,
    /// A `kid` header, needed only when the gateway's key entry has a `kid`.
    #[arg(long)]
    kid: Option<String>,
    /// Also describe every claim on stderr.
    #[arg(long)]
    explain: bool,
}

#[derive(Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Space-separated scopes, e.g. "seal.session.create seal.session.read".
    #[arg(long)]
    scope: String,
    /// `sub`: who acts; the audit trail records it as the actor.
    #[arg(long, default_value = "operator")]
    sub: String,
    /// `aud`: must equal the gateway's `operator_auth.audience`.
    #[arg(long, default_value_t = OperatorAuthConfig::default().audience)]
    aud: String,
}

#[derive(Args)]
pub struct AgentArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// `sub`: the agent id (must equal the session's `agent_id` when it has one).
    #[arg(long = "agent", visible_alias = "sub")]
    sub: String,
    /// `scp`: the session's security context.
    #[arg(long = "context", visible_alias = "scp")]
    scp: String,
    /// `exec_id`: the session id.
    #[arg(long = "session", visible_alias = "exec-id")]
    exec_id: String,
    /// `wid`: the workload id (must equal the session's `workload_id`).
    #[arg(long = "workload", visible_alias = "wid")]
    wid: Option<String>,
    /// `aud`: required when the gateway sets `agent_tokens.audience`.
    #[arg(long)]
    aud: Option<String>,
}

/// Prints the token on stdout (and the explanation on stderr when asked).
pub fn run(command: TokenCommand) -> Result<(), MintError> {
    let (common, claims, meanings) = match &command {
        TokenCommand::Operator(args) => {
            let iat = crate::clock::now_secs();
            let claims = NewOperatorToken {
                sub: &args.sub,
                aud: &args.aud,
                iss: args.common.iss.as_deref(),
                scope: &args.scope,
                iat,
                exp: expiry(iat, args.common.ttl)?,
            }
            .claims()?;
            (&args.common, claims, OPERATOR_CLAIMS)
        }
        TokenCommand::Agent(args) => {
            let iat = crate::clock::now_secs();
            let claims = NewAgentToken {
                sub: &args.sub,
                scp: &args.scp,
                exec_id: &args.exec_id,
                wid: args.wid.as_deref(),
                iss: args.common.iss.as_deref(),
                aud: args.aud.as_deref(),
                iat,
                exp: expiry(iat, args.common.ttl)?,
            }
            .claims()?;
            (&args.common, claims, AGENT_CLAIMS)
        }
    };
    // `@FILE` as in `sealgate sign --key`, so one habit works for every command.
    let key_path = match common.key.to_str().and_then(|path| path.strip_prefix('@')) {
        Some(path) => Path::new(path),
        None => common.key.as_path(),
    };
    let key = crate::envelope::read_signing_key_file(key_path)?;
    let token = sign_eddsa(&key, &claims, common.kid.as_deref())?;
    if common.explain {
        eprint!("{}", explain(&claims, meanings, common.kid.as_deref()));
    }
    println!("{token}");
    Ok(())
}

fn expiry(iat: i64, ttl: i64) -> Result<i64, MintError> {
    iat.checked_add(ttl).ok_or(MintError::EndOfTime)
}

/// Why a `--ttl` was refused (clap shows the message after the option's name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum TtlError {
    #[error("`{0}` is not a duration: write seconds or a number with s, m, h or d (e.g. 15m)")]
    NotADuration(String),
    #[error("`{0}` does not start with a whole number")]
    NotANumber(String),
    #[error("a token must live at least one second")]
    Zero,
    #[error("`{0}` is longer than the 30 days a token may live; mint a new one when it expires")]
    TooLong(String),
}

/// `90`, `90s`, `15m`, `1h`, `7d`.
fn parse_ttl(text: &str) -> Result<i64, TtlError> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(TtlError::NotADuration(text.to_owned())),
    };
    let count: i64 = number
        .parse()
        .map_err(|_| TtlError::NotANumber(text.to_owned()))?;
    match count.checked_mul(scale) {
        Some(0) => Err(TtlError::Zero),
        Some(secs) if secs <= MAX_TTL_SECS => Ok(secs),
        _ => Err(TtlError::TooLong(text.to_owned())),
    }
}

/// (claim, requirement, meaning), in the order the explanation lists them.
type Meanings = &'static [(&'static str, &'static str, &'static str)];

const OPERATOR_CLAIMS: Meanings = &[
    ("sub", "required", "who acts; audit events record it as the actor"),
    (
        "aud",
        "required",
        "must equal operator_auth.audience (default sealgate-operators); keeps agent tokens out of the control API",
    ),
    (
        "scope",
        "needed",
        "space-separated permissions; a request whose scope is missing gets 403 (6002); seal.admin grants all",
    ),
    ("iat", "optional", "when the token was minted (Unix seconds)"),
    (
        "exp",
        "required",
        "refused with 401 (6001) from this second on (plus operator_auth.leeway_secs)",
    ),
    ("jti", "optional", "a random id that tells tokens apart in logs"),
    (
        "iss",
        "if configured",
        "must equal operator_auth.issuer when that is set",
    ),
];

const AGENT_CLAIMS: Meanings = &[
    (
        "sub",
        "required",
        "the agent id; must equal the session's agent_id when it has one (else 1004)",
    ),
    (
        "scp",
        "required",
        "the security context; must equal the session's context (else 3001)",
    ),
    (
        "exec_id",
        "required",
        "the session id (POST /v1/seal/sessions session_id); no such session gives 1005",
    ),
    (
        "wid",
        "optional",
        "the workload id; must equal the session's workload_id",
    ),
    (
        "jti",
        "required",
        "a random id; replay protection is per envelope, not per jti",
    ),
    (
        "iat",
        "required",
        "when the token was minted (Unix seconds)",
    ),
    (
        "exp",
        "required",
        "refused with 1003 from this second on (plus agent_tokens.leeway_secs)",
    ),
    (
        "iss",
        "if configured",
        "must equal agent_tokens.issuer when that is set (else 1004)",
    ),
    (
        "aud",
        "if configured",
        "must equal (or, as an array, contain) agent_tokens.audience when that is set (else 1004)",
    ),
];

/// One line per claim set (value, whether the gateway requires it, what it means), then the header.
fn explain(claims: &Map<String, Value>, meanings: Meanings, kid: Option<&str>) -> String {
    let mut text = String::from("claims:\n");
    for (name, requirement, meaning) in meanings {
        if let Some(value) = claims.get(*name) {
            text.push_str(&format!(
                "  {name:<8} {value:<40} [{requirement}] {meaning}\n",
                value = value.to_string()
            ));
        }
    }
    let header_kid = kid.map_or(String::new(), |kid| format!(", kid {kid:?}"));
    text.push_str(&format!(
        "header: alg EdDSA{header_kid}; the gateway verifies it with the key's public half\n"
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_take_a_unit_and_stay_within_bounds() {
        assert_eq!(parse_ttl("90"), Ok(90));
        assert_eq!(parse_ttl("90s"), Ok(90));
        assert_eq!(parse_ttl("15m"), Ok(900));
        assert_eq!(parse_ttl("1h"), Ok(3600));
        assert_eq!(parse_ttl("30d"), Ok(MAX_TTL_SECS));
        for (bad, expected) in [
            ("0", "at least one second"),
            ("31d", "30 days"),
            ("99999999999999999999", "whole number"),
            ("9999999999999999d", "30 days"),
            ("1w", "not a duration"),
            ("h", "whole number"),
            ("-5", "not a duration"),
            ("", "whole number"),
        ] {
            let error = parse_ttl(bad).expect_err(bad).to_string();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }

    #[test]
    fn every_claim_either_kind_can_carry_has_a_meaning() {
        let agent = NewAgentToken {
            sub: "a",
            scp: "c",
            exec_id: "s",
            wid: Some("w"),
            iss: Some("i"),
            aud: Some("au"),
            iat: 1,
            exp: 2,
        }
        .claims()
        .expect("claims");
        let operator = NewOperatorToken {
            sub: "o",
            aud: "sealgate-operators",
            iss: Some("i"),
            scope: "seal.admin",
            iat: 1,
            exp: 2,
        }
        .claims()
        .expect("claims");
        for (claims, meanings) in [(agent, AGENT_CLAIMS), (operator, OPERATOR_CLAIMS)] {
            let text = explain(&claims, meanings, Some("k1"));
            for name in claims.keys() {
                assert!(
                    text.lines()
                        .any(|line| line.trim_start().starts_with(name.as_str())),
                    "{name} unexplained in {text}"
                );
            }
            assert!(text.contains("kid \"k1\""), "{text}");
        }
    }
}
