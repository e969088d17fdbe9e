//! The bodies of the `cargo fuzz` targets in `fuzz/`: one function per parser that reads untrusted
//! bytes. `fuzz/fuzz_targets/NAME.rs` calls `NAME` here, and so does `tests/fuzz_targets.rs`, which
//! replays `fuzz/seeds/NAME/` and a few thousand arbitrary inputs on stable Rust: one body, two drivers.
//!
//! Each function reaches the parser only through the crate's public functions and panics when the
//! parser panics or breaks a promise it makes; the promises checked are listed on each function. The
//! fixed keys below exist only here: nothing in the gateway trusts them.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{json, Map, Value};

use crate::envelope::{
    decode_signature, jcs, parse_call, parse_envelope, sign_envelope, signature_text,
    signing_key_from_text, Call, SessionKey,
};
use crate::policy::commands::unlisted_option;
use crate::policy::paths::{normalize_absolute, DEFAULT_PATH_ARGUMENTS};
use crate::policy::{decide, parse_context_json, parse_context_yaml, Pattern, SecurityContext};
use crate::strict_json::{
    parse_strict_json, parse_strict_json_with, AUDIT_LINES, MAX_DEPTH, MAX_SAFE_INTEGER,
};
use crate::token::{
    sign_eddsa_for_tests_and_cli, AgentClaims, AgentTokenConfig, AgentTokenVerifier, KeyConfig,
    TokenError,
};

/// A target's body: arbitrary bytes in, a panic out when the parser misbehaves.
pub type Body = fn(&[u8]);

/// Every target: its name (the `fuzz/` binary and the `fuzz/seeds/` folder) and its body.
pub const TARGETS: &[(&str, Body)] = &[
    ("strict_json", strict_json),
    ("envelope", envelope),
    ("jwt", jwt),
    ("commands", commands),
    ("domains", domains),
    ("paths", paths),
    ("policy_yaml", policy_yaml),
    ("policy_decide", policy_decide),
];

/// An Ed25519 key used only by these targets: it signs envelopes and agent tokens so that inputs can
/// get past the signature checks to the parsing behind them.
pub const FUZZ_PRIVATE_KEY_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIGtax38tYmbHJVeZq63txmY9klYMn+3uEVHUwTa+tj+U
-----END PRIVATE KEY-----
";

/// The public half of [`FUZZ_PRIVATE_KEY_PEM`].
pub const FUZZ_PUBLIC_KEY_PEM: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAEYe0T01oFVnCTh5U6I9tAfKnLTa6EVYRSPGYzvGY04A=
-----END PUBLIC KEY-----
";

/// `kid`, `iss` and `aud` of the fuzz agent tokens, and the instant they are checked at.
pub const FUZZ_TOKEN_KID: &str = "fuzz";
pub const FUZZ_TOKEN_ISSUER: &str = "fuzz-issuer";
pub const FUZZ_TOKEN_AUDIENCE: &str = "fuzz-audience";
pub const FUZZ_NOW: i64 = 1_800_000_000;

/// Strict JSON under both rule sets.
///
/// Promises: an accepted document is JSON to serde_json too (the reader is only ever stricter), and
/// serde_json sees no more object members in it than the value holds (no key was repeated); it nests
/// at most 64 deep and holds no integer outside ±(2^53−1); the audit-line rules accept it too, with the
/// same value; serde_json's output for it reads back to the same value; its JCS form reads back (audit
/// rules, as the audit chain does) to a value with the same JCS form.
pub fn strict_json(data: &[u8]) {
    let untrusted = parse_strict_json(data);
    let audit = parse_strict_json_with(data, AUDIT_LINES);
    let Ok(value) = untrusted else { return };
    match serde_json::from_slice::<MemberCount>(data) {
        Ok(MemberCount(members)) => assert_eq!(members, member_count(&value), "a repeated key"),
        Err(error) => panic!("accepted, but serde_json refuses it: {error}"),
    }
    assert_within_untrusted_limits(&value, 1);
    assert_eq!(
        audit.as_ref(),
        Ok(&value),
        "audit rules refuse what untrusted rules accept"
    );
    let printed = value.to_string();
    assert_eq!(
        parse_strict_json(printed.as_bytes()).as_ref(),
        Ok(&value),
        "serde_json's output does not read back: {printed}"
    );
    let canonical = jcs(&value);
    match parse_strict_json_with(&canonical, AUDIT_LINES) {
        Ok(reread) => assert_eq!(jcs(&reread), canonical, "JCS is not a fixed point"),
        Err(error) => panic!("JCS output does not read back: {error}"),
    }
}

/// Object members of a value, nested ones included.
fn member_count(value: &Value) -> usize {
    match value {
        Value::Object(map) => map.values().map(|v| 1 + member_count(v)).sum(),
        Value::Array(items) => items.iter().map(member_count).sum(),
        _ => 0,
    }
}

/// Object members as serde_json reads them, every occurrence of a repeated key counted: an oracle for
/// "no key was repeated" that shares nothing with the reader under test.
struct MemberCount(usize);

impl<'de> Deserialize<'de> for MemberCount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MemberCountVisitor)
    }
}

struct MemberCountVisitor;

impl<'de> Visitor<'de> for MemberCountVisitor {
    type Value = MemberCount;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_i64<E>(self, _: i64) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_u64<E>(self, _: u64) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_f64<E>(self, _: f64) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_str<E>(self, _: &str) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_unit<E>(self) -> Result<MemberCount, E> {
        Ok(MemberCount(0))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MemberCount, A::Error> {
        let mut total = 0;
        while let Some(MemberCount(inner)) = seq.next_element()? {
            total += inner;
        }
        Ok(MemberCount(total))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MemberCount, A::Error> {
        let mut total = 0;
        while map.next_key::<IgnoredAny>()?.is_some() {
            let MemberCount(inner) = map.next_value()?;
            total += 1 + inner;
        }
        Ok(MemberCount(total))
    }
}

/// SPEC 2's depth and integer limits, checked on the value (the top-level container is level 1).
fn assert_within_untrusted_limits(value: &Value, depth: usize) {
    match value {
        Value::Number(number) => {
            let safe = MAX_SAFE_INTEGER;
            if let Some(n) = number.as_u64() {
                assert!(n <= safe, "accepted the integer {n}");
            } else if let Some(n) = number.as_i64() {
                assert!(n.unsigned_abs() <= safe, "accepted the integer {n}");
            }
        }
        Value::Array(items) => {
            assert!(depth <= MAX_DEPTH, "accepted nesting {depth} deep");
            items
                .iter()
                .for_each(|item| assert_within_untrusted_limits(item, depth + 1));
        }
        Value::Object(map) => {
            assert!(depth <= MAX_DEPTH, "accepted nesting {depth} deep");
            map.values()
                .for_each(|item| assert_within_untrusted_limits(item, depth + 1));
        }
        _ => {}
    }
}

/// `parse_envelope` (check 1), then everything the pipeline derives from an accepted envelope.
///
/// Promises: the canonical message is JSON holding exactly the payload, token and timestamp, and its
/// payload range is JCS(payload); a decodable signature re-encodes to the same bytes; the same parts
/// signed with the fuzz key and sent again are accepted, equal, and verify, while another timestamp
/// does not.
pub fn envelope(data: &[u8]) {
    let Ok(envelope) = parse_envelope(data) else {
        return;
    };
    let (message, payload_range) = envelope.canonical_message_with_payload();
    assert_eq!(message, envelope.canonical_message());
    assert_eq!(
        message.get(payload_range),
        Some(jcs(&envelope.payload).as_slice())
    );
    let mut signed = match parse_strict_json_with(&message, AUDIT_LINES) {
        Ok(Value::Object(signed)) => signed,
        other => panic!("the canonical message is not a JSON object: {other:?}"),
    };
    assert_eq!(
        signed.remove("security_token"),
        Some(Value::from(envelope.security_token.as_str()))
    );
    assert_eq!(
        signed.remove("timestamp"),
        Some(Value::from(envelope.timestamp))
    );
    assert!(signed.remove("payload").is_some() && signed.is_empty());
    if let Ok(Call::ToolsCall { arguments, .. }) = parse_call(&envelope.payload) {
        assert!(
            !has_case_folded_twins(&Value::Object(arguments)),
            "accepted arguments with two names equal under ASCII case folding"
        );
    }
    if let Ok(signature) = decode_signature(&envelope.signature) {
        let again = decode_signature(&signature_text(&signature)).map(|s| s.to_bytes());
        assert_eq!(again, Ok(signature.to_bytes()));
    }

    let signer = match signing_key_from_text(FUZZ_PRIVATE_KEY_PEM) {
        Ok(signer) => signer,
        Err(error) => panic!("fuzz key: {error}"),
    };
    let key = match SessionKey::parse(FUZZ_PUBLIC_KEY_PEM) {
        Ok(key) => key,
        Err(error) => panic!("fuzz public key: {error}"),
    };
    let _ = envelope.verify_signature(&key);
    let wire = sign_envelope(
        &signer,
        envelope.payload.clone(),
        &envelope.security_token,
        envelope.timestamp,
    );
    let resent = match parse_envelope(wire.to_string().as_bytes()) {
        Ok(resent) => resent,
        Err(error) => panic!("a re-signed envelope is refused: {error}"),
    };
    assert_eq!(resent.payload, envelope.payload);
    assert_eq!(resent.security_token, envelope.security_token);
    assert_eq!(resent.timestamp, envelope.timestamp);
    if let Err(error) = resent.verify_signature(&key) {
        panic!("a re-signed envelope does not verify: {error}");
    }
    let mut moved = resent;
    moved.timestamp ^= 1;
    assert!(moved.verify_signature(&key).is_err());
}

/// Whether some object in `value` holds two names equal under ASCII case folding (SPEC 6.3 r3).
fn has_case_folded_twins(value: &Value) -> bool {
    match value {
        Value::Object(map) => {
            let folded: BTreeSet<String> = map.keys().map(|k| k.to_ascii_lowercase()).collect();
            folded.len() != map.len() || map.values().any(has_case_folded_twins)
        }
        Value::Array(items) => items.iter().any(has_case_folded_twins),
        _ => false,
    }
}

/// The agent token verifier (checks 2–4) with the fuzz key. The first byte chooses what the rest is:
/// 0, a token as text; 1, claims that the fuzz key signs; 2, a header and claims (split at the first
/// NUL) with a signature the key never made.
///
/// Promises: a second verification (from the cache) answers as the first; a token the fuzz key did not
/// sign never verifies; a verified token's claims are the signed ones, and it has not expired.
pub fn jwt(data: &[u8]) {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    // A verifier per input: its verified-token cache must not carry one input's state into the next.
    let verifier = token_verifier();
    match mode % 3 {
        0 => {
            let _ = verify_twice(&verifier, &String::from_utf8_lossy(rest));
        }
        1 => {
            let Ok(claims @ Value::Object(_)) = parse_strict_json(rest) else {
                return;
            };
            let token = match sign_eddsa_for_tests_and_cli(
                FUZZ_PRIVATE_KEY_PEM,
                &claims,
                Some(FUZZ_TOKEN_KID),
            ) {
                Ok(token) => token,
                Err(error) => panic!("the fuzz key cannot sign: {error}"),
            };
            if let Ok(verified) = verify_twice(&verifier, &token) {
                assert_eq!(claims.get("sub"), Some(&Value::from(verified.sub.as_str())));
                assert_eq!(claims.get("scp"), Some(&Value::from(verified.scp.as_str())));
                assert_eq!(
                    claims.get("exec_id"),
                    Some(&Value::from(verified.exec_id.as_str()))
                );
                assert_eq!(claims.get("jti"), Some(&Value::from(verified.jti.as_str())));
                assert_eq!(claims.get("iss"), Some(&Value::from(FUZZ_TOKEN_ISSUER)));
                assert!(FUZZ_NOW < verified.exp, "an expired token verified");
            }
        }
        _ => {
            let (header, claims) = match rest.iter().position(|b| *b == 0) {
                Some(cut) => (&rest[..cut], &rest[cut + 1..]),
                None => (rest, &b"{}"[..]),
            };
            let token = format!(
                "{}.{}.{}",
                URL_SAFE_NO_PAD.encode(header),
                URL_SAFE_NO_PAD.encode(claims),
                URL_SAFE_NO_PAD.encode([0x5a; 64])
            );
            assert!(
                verify_twice(&verifier, &token).is_err(),
                "an unsigned token verified"
            );
        }
    }
}

/// The command check (SPEC 6.3 commands) through `decide`, with a fixed allowlist, with the same one
/// under `path_allowlist: [/workspace]`, and with one whose entries come from the input. The first
/// byte chooses the form: a string `command` (plus `args` after NUL bytes) or an array `command`.
///
/// Promises: an allowed string command splits into words with POSIX quoting; the first word of an
/// allowed call is allowlisted, and for `git` its first non-option word is an allowlisted subcommand.
/// Under the path allowlist (SPEC 6.3 r3), an allowed call's shell text holds no unquoted glob, `~`,
/// `{` nor word-leading `=`, and no word nor `NAME=VALUE` value leaves `/workspace`: an absolute one
/// normalises inside it, a relative one never climbs with `..`. Under an `option_allowlist` (SPEC 6.3
/// r4), every option word of an allowed call before `--` is listed (by name, or letter by letter), and
/// the option splitter names an option only by its name or one of its letters, never by a value.
pub fn commands(data: &[u8]) {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.split(|b| *b == 0).map(String::from_utf8_lossy);
    let first = parts.next().unwrap_or_default().into_owned();
    let others: Vec<String> = parts.map(|part| part.into_owned()).collect();
    let mut arguments = Map::new();
    let words: Vec<String> = if mode % 2 == 0 {
        arguments.insert("command".to_owned(), Value::from(first.as_str()));
        if !others.is_empty() {
            arguments.insert("args".to_owned(), json!(others));
        }
        match shell_words::split(&first) {
            Ok(split) => split.into_iter().chain(others.iter().cloned()).collect(),
            Err(_) => Vec::new(),
        }
    } else {
        let all: Vec<String> = std::iter::once(first).chain(others).collect();
        arguments.insert("command".to_owned(), json!(all));
        all
    };

    if decide(
        Some(fixtures().commands),
        &any_tool(),
        "cmd.run",
        &arguments,
    )
    .is_allow()
    {
        let Some(base) = words.first() else {
            panic!("allowed without a word: {arguments:?}");
        };
        assert!(["git", "ls"].contains(&base.as_str()), "allowed {base:?}");
        if base == "git" {
            let subcommand = words.iter().skip(1).find(|word| !word.starts_with('-'));
            assert!(
                subcommand.is_some_and(|s| ["status", "log", "diff"].contains(&s.as_str())),
                "allowed git with {subcommand:?}"
            );
        }
    }
    if decide(
        Some(fixtures().commands_in_workspace),
        &any_tool(),
        "cmd.run",
        &arguments,
    )
    .is_allow()
    {
        assert_stays_in_workspace(mode % 2 == 0, &arguments);
    }
    // The option splitter names only an option, never a value: the word's name before `=`, or one
    // letter of it; and a word whose name is listed passes (SPEC 6.3 r4).
    let listed: BTreeSet<String> = ["-n", "--format", "-ab"].map(String::from).into();
    for word in words.iter().filter(|word| word.starts_with('-')) {
        let name = word.split('=').next().unwrap_or_default();
        if let Some(option) = unlisted_option(word, &listed) {
            let one_letter = option
                .strip_prefix('-')
                .is_some_and(|letter| letter.chars().count() == 1 && name.contains(letter));
            assert!(option == name || one_letter, "{word:?} named {option:?}");
        }
        let own: BTreeSet<String> = [name.to_owned()].into();
        assert!(unlisted_option(word, &own).is_none(), "{word:?} listed");
    }
    if decide(
        Some(fixtures().commands_with_options),
        &any_tool(),
        "cmd.run",
        &arguments,
    )
    .is_allow()
    {
        assert_options_listed(&words);
    }
    // The same call against an allowlist made of the input's own words.
    let context = json!({
        "name": "fuzz-commands-entries",
        "capabilities": [{"tool_pattern": "cmd.run", "command_allowlist": words}],
    });
    if let Ok(context) = parse_context_json(&context) {
        let _ = decide(Some(&context), &any_tool(), "cmd.run", &arguments);
    }
}

/// SPEC 6.3 r4's promise for a call allowed under [`COMMANDS_WITH_OPTIONS_CONTEXT`]: before the first
/// `--`, every `--long` option is listed by its name before `=`, and every short cluster is listed
/// whole or each of its letters is (digits may be a value).
fn assert_options_listed(words: &[String]) {
    let listed: &[&str] = match (
        words.first().map(String::as_str),
        words.get(1).map(String::as_str),
    ) {
        (Some("git"), Some("log")) => &["--oneline", "-n", "--format"],
        (Some("git"), _) => &["-s"],
        _ => &["-l", "-a"],
    };
    for word in words.iter().skip(1).take_while(|word| *word != "--") {
        let Some(short) = word.strip_prefix('-') else {
            continue;
        };
        let name = word.split('=').next().unwrap_or_default();
        let whole = listed.contains(&name);
        let letters = !short.starts_with('-')
            && name[1..]
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .all(|c| listed.contains(&format!("-{c}").as_str()));
        assert!(
            whole || letters,
            "allowed the option word {word:?} in {words:?}"
        );
    }
}

/// SPEC 6.3 r3's promise for a command allowed under `path_allowlist: [/workspace]`: `shell` says
/// whether `command` (and `args`) are shell text.
fn assert_stays_in_workspace(shell: bool, arguments: &Map<String, Value>) {
    let texts: Vec<&str> = arguments
        .values()
        .flat_map(|value| match value {
            Value::String(text) => vec![text.as_str()],
            Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        })
        .collect();
    let mut words = Vec::new();
    for text in texts {
        if shell {
            assert!(
                !expands_unquoted(text),
                "allowed shell expansion in {text:?}"
            );
            words.extend(shell_words::split(text).unwrap_or_default());
        } else {
            words.push(text.to_owned());
        }
    }
    for word in &words {
        // A word, or the parts of a `NAME=VALUE` or `--option=VALUE` word; an absolute word as a whole too.
        let whole = word.starts_with('/') || !word.contains('=');
        let values = word.split('=').chain(whole.then_some(word.as_str()));
        for value in values {
            let inside = match normalise_model(value) {
                Some(path) => path == "/workspace" || path.starts_with("/workspace/"),
                None => !value.starts_with('/') && !value.split('/').any(|part| part == ".."),
            };
            assert!(inside, "allowed {value:?} in {word:?}");
        }
    }
}

/// Whether shell text holds, outside quotes and unescaped, a character that a shell expands into
/// paths (`*`, `?`, `[`, `~`, `{`), or `=` at the start of a word: a model of POSIX quoting that shares
/// nothing with the splitter under test.
fn expands_unquoted(text: &str) -> bool {
    let (mut single, mut double, mut escaped, mut word_start) = (false, false, false, true);
    for c in text.chars() {
        let unquoted = !single && !double && !escaped;
        if unquoted && (matches!(c, '*' | '?' | '[' | '~' | '{') || (c == '=' && word_start)) {
            return true;
        }
        word_start = unquoted && matches!(c, ' ' | '\t');
        match c {
            _ if escaped => escaped = false,
            '\\' if !single => escaped = true,
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            _ => {}
        }
    }
    false
}

/// The URL check (SPEC 6.3 domains) through `decide`: URLs from the input (split at NUL bytes) under a
/// fixed allowlist, and the input as an allowlist entry.
///
/// Promises: every URL of an allowed call parses as an absolute http(s) URL without control
/// characters, surrounding white space or backslashes, whose host is one of the allowlisted ones.
pub fn domains(data: &[u8]) {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    let urls: Vec<String> = rest
        .split(|b| *b == 0)
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    let key = ["url", "uri", "urls"][usize::from(*mode) % 3];
    let mut arguments = Map::new();
    match urls.as_slice() {
        [single] if key != "urls" => arguments.insert(key.to_owned(), Value::from(single.as_str())),
        _ => arguments.insert(key.to_owned(), json!(urls)),
    };
    if decide(
        Some(fixtures().domains),
        &any_tool(),
        "web.fetch",
        &arguments,
    )
    .is_allow()
    {
        for url in &urls {
            assert_allowlisted_url(url);
        }
    }
    let context = json!({
        "name": "fuzz-domain-entry",
        "capabilities": [{"tool_pattern": "web.fetch", "domain_allowlist": urls}],
    });
    if let Ok(context) = parse_context_json(&context) {
        let _ = decide(Some(&context), &any_tool(), "web.fetch", &arguments);
    }
}

/// Hosts of the fixed domain allowlist, as the URL parser writes them.
fn assert_allowlisted_url(value: &str) {
    assert!(
        !value.chars().any(char::is_control) && value.trim() == value && !value.contains('\\'),
        "allowed {value:?}"
    );
    let url = match url::Url::parse(value) {
        Ok(url) => url,
        Err(error) => panic!("allowed {value:?}, which does not parse: {error}"),
    };
    assert!(
        matches!(url.scheme(), "http" | "https"),
        "allowed {value:?}"
    );
    let host = url.host_str().unwrap_or_default();
    let name = host.strip_suffix('.').unwrap_or(host);
    let allowed = ["example.com", "xn--bcher-kva.example", "10.0.0.1", "[::1]"].contains(&name)
        || name
            .strip_suffix(".github.com")
            .is_some_and(|label| !label.is_empty());
    assert!(allowed, "allowed {value:?} with host {host:?}");
}

/// Lexical path normalisation, and the path check (SPEC 6.3 paths) through `decide`. The input, split
/// at NUL bytes, gives the paths.
///
/// Promises: a normalised path is absolute, has no empty, `.` or `..` component, no backslash or NUL,
/// normalises to itself, and agrees with an independent model (which refuses a climb above `/`,
/// empty, relative, NUL and backslash paths); every path of an allowed call normalises to an allowlisted directory or
/// below it.
pub fn paths(data: &[u8]) {
    let paths: Vec<String> = data
        .split(|b| *b == 0)
        .map(|part| String::from_utf8_lossy(part).into_owned())
        .collect();
    for path in &paths {
        let Ok(normalised) = normalize_absolute(path) else {
            continue;
        };
        assert!(normalised.starts_with('/'), "{path:?} → {normalised:?}");
        assert!(
            !normalised.contains(['\\', '\0']),
            "{path:?} → {normalised:?}"
        );
        if normalised != "/" {
            assert!(
                normalised[1..]
                    .split('/')
                    .all(|component| !matches!(component, "" | "." | "..")),
                "{path:?} → {normalised:?}"
            );
        }
        assert_eq!(normalize_absolute(&normalised).as_ref(), Ok(&normalised));
    }
    for path in &paths {
        assert_eq!(
            normalize_absolute(path).ok(),
            normalise_model(path),
            "{path:?}"
        );
    }
    let mut arguments = Map::new();
    match paths.as_slice() {
        [single] => arguments.insert("path".to_owned(), Value::from(single.as_str())),
        _ => arguments.insert("paths".to_owned(), json!(paths)),
    };
    if decide(Some(fixtures().paths), &any_tool(), "fs.read", &arguments).is_allow() {
        for path in &paths {
            let normalised = normalize_absolute(path).unwrap_or_default();
            let inside = ["/workspace", "/tmp/x"].iter().any(|directory| {
                normalised
                    .strip_prefix(directory)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            });
            assert!(inside, "allowed {path:?} → {normalised:?}");
        }
    }
    let context = json!({
        "name": "fuzz-path-entries",
        "capabilities": [{"tool_pattern": "fs.read", "path_allowlist": paths}],
    });
    if let Ok(context) = parse_context_json(&context) {
        let _ = decide(Some(&context), &any_tool(), "fs.read", &arguments);
    }
}

/// An independent model of lexical normalisation: a stack of components, a climb above `/` refused.
fn normalise_model(path: &str) -> Option<String> {
    if path.contains(['\0', '\\']) {
        return None;
    }
    let mut stack: Vec<&str> = Vec::new();
    for component in path.strip_prefix('/')?.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                stack.pop()?;
            }
            name => stack.push(name),
        }
    }
    Some(format!("/{}", stack.join("/")))
}

/// Policy YAML loading (`parse_context_yaml`).
///
/// Promises: an error that names a line names one of the file's lines; an accepted context reads the
/// same through the API's JSON loader (same spec, same version).
pub fn policy_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse_context_yaml(&text, Path::new("fuzz.yaml")) {
        Err(error) => {
            if let Some(line) = error.line {
                // YAML breaks lines at CR as well as LF (a lone CR too, which `str::lines` keeps).
                let breaks = text.chars().filter(|c| matches!(c, '\n' | '\r')).count();
                assert!(line <= breaks + 1, "line {line} of {error}");
            }
            let _ = error.to_string();
        }
        Ok(context) => {
            let as_json = match serde_json::to_value(&context.spec) {
                Ok(as_json) => as_json,
                Err(error) => panic!("an accepted context does not serialise: {error}"),
            };
            match parse_context_json(&as_json) {
                Ok(again) => {
                    assert_eq!(again.spec, context.spec);
                    assert_eq!(again.version, context.version);
                }
                Err(error) => panic!("YAML accepts what JSON refuses: {error}"),
            }
        }
    }
}

/// Argument keys that the checks read, so that `policy_decide` reaches them often.
const DECIDE_KEYS: &[&str] = &[
    "path",
    "paths",
    "source",
    "destination",
    "file",
    "directory",
    "cwd",
    "command",
    "args",
    "url",
    "uri",
    "urls",
    // SPEC 6.3 r3: names match without regard to ASCII case.
    "Path",
    "FILE",
    "URL",
    "Command",
    "ARGS",
];

/// `decide` on a fixed context with an arbitrary tool name (before the first NUL) and arguments (JSON
/// when the rest is a JSON object, else values cut from it under the keys the checks read).
///
/// Promises: it answers, without a context too, and never allows a tool on the deny list; an allowed
/// `fs.*` call has every path argument, whatever the case of its name (SPEC 6.3 r3), inside the
/// allowlist.
pub fn policy_decide(data: &[u8]) {
    let (tool, rest) = match data.iter().position(|b| *b == 0) {
        Some(cut) => (&data[..cut], &data[cut + 1..]),
        None => (data, &[][..]),
    };
    let tool = String::from_utf8_lossy(tool);
    let patterns: Vec<Pattern> = ["*", "fs.*"]
        .iter()
        .filter_map(|p| Pattern::parse(p).ok())
        .collect();
    let arguments = decide_arguments(rest);
    let decision = decide(Some(fixtures().decide), &patterns, &tool, &arguments);
    if decision.is_allow() {
        assert!(
            tool != "fs.delete" && !tool.starts_with("secrets."),
            "allowed {tool:?}"
        );
        if tool.starts_with("fs.") {
            assert_path_arguments_inside(&arguments);
        }
    }
    assert!(!decide(None, &patterns, &tool, &arguments).is_allow());
    let _ = Pattern::parse(&tool);
}

/// Every value under a default path argument name, in any case, is a path inside the decide
/// fixture's `fs.*` allowlist.
fn assert_path_arguments_inside(arguments: &Map<String, Value>) {
    for (name, value) in arguments {
        if !DEFAULT_PATH_ARGUMENTS
            .iter()
            .any(|key| key.eq_ignore_ascii_case(name))
        {
            continue;
        }
        let paths = match value {
            Value::Array(items) => items.iter().collect(),
            single => vec![single],
        };
        for path in paths {
            let inside = path.as_str().and_then(normalise_model).is_some_and(|path| {
                ["/workspace", "/tmp/x"].iter().any(|directory| {
                    path.strip_prefix(directory)
                        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
                })
            });
            assert!(inside, "allowed {name:?}: {path}");
        }
    }
}

fn decide_arguments(bytes: &[u8]) -> Map<String, Value> {
    if let Ok(Value::Object(map)) = parse_strict_json(bytes) {
        return map;
    }
    let mut map = Map::new();
    for (index, chunk) in bytes.split(|b| *b == 0xff).enumerate() {
        let Some((selector, rest)) = chunk.split_first() else {
            continue;
        };
        let key = DECIDE_KEYS[usize::from(*selector) % DECIDE_KEYS.len()];
        let text = String::from_utf8_lossy(rest).into_owned();
        let value = match index % 4 {
            0 => Value::String(text),
            1 => Value::Array(text.split(' ').map(Value::from).collect()),
            2 => Value::from(u64::from(*selector)),
            _ => Value::Array(vec![Value::String(text), Value::Null]),
        };
        map.insert(key.to_owned(), value);
    }
    map
}

/// The fixed contexts of the policy targets, loaded once (they are never changed).
struct Fixtures {
    commands: &'static SecurityContext,
    commands_in_workspace: &'static SecurityContext,
    commands_with_options: &'static SecurityContext,
    domains: &'static SecurityContext,
    paths: &'static SecurityContext,
    decide: &'static SecurityContext,
}

const COMMANDS_CONTEXT: &str = r#"
name: fuzz-commands
capabilities:
  - tool_pattern: "cmd.run"
    command_allowlist: ["git", "ls"]
    subcommand_allowlist: { git: ["status", "log", "diff"] }
"#;

const COMMANDS_IN_WORKSPACE_CONTEXT: &str = r#"
name: fuzz-commands-in-workspace
capabilities:
  - tool_pattern: "cmd.run"
    path_allowlist: ["/workspace"]
    command_allowlist: ["git", "ls", "cat", "dd", "make", "curl"]
    subcommand_allowlist: { git: ["status", "log", "diff"] }
"#;

const COMMANDS_WITH_OPTIONS_CONTEXT: &str = r#"
name: fuzz-commands-with-options
capabilities:
  - tool_pattern: "cmd.run"
    command_allowlist: ["git", "ls"]
    subcommand_allowlist: { git: ["status", "log", "diff"] }
    option_allowlist: { "git log": ["--oneline", "-n", "--format"], git: ["-s"], ls: ["-l", "-a"] }
"#;

const DOMAINS_CONTEXT: &str = r#"
name: fuzz-domains
capabilities:
  - tool_pattern: "web.fetch"
    domain_allowlist: ["example.com", "*.github.com", "bücher.example", "10.0.0.1", "[::1]"]
"#;

const PATHS_CONTEXT: &str = r#"
name: fuzz-paths
capabilities:
  - tool_pattern: "fs.read"
    path_allowlist: ["/workspace", "/tmp/x/"]
"#;

const DECIDE_CONTEXT: &str = r#"
name: fuzz
deny_list: ["fs.delete", "secrets.*"]
capabilities:
  - tool_pattern: "fs.*"
    path_allowlist: ["/workspace", "/tmp/x"]
  - tool_pattern: "cmd.run"
    path_allowlist: ["/workspace"]
    command_allowlist: ["git", "ls"]
    subcommand_allowlist: { git: ["status", "log"] }
  - tool_pattern: "web.fetch"
    domain_allowlist: ["example.com", "*.github.com"]
  - tool_pattern: "*"
"#;

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| Fixtures {
        commands: fixed_context(COMMANDS_CONTEXT),
        commands_in_workspace: fixed_context(COMMANDS_IN_WORKSPACE_CONTEXT),
        commands_with_options: fixed_context(COMMANDS_WITH_OPTIONS_CONTEXT),
        domains: fixed_context(DOMAINS_CONTEXT),
        paths: fixed_context(PATHS_CONTEXT),
        decide: fixed_context(DECIDE_CONTEXT),
    })
}

fn fixed_context(yaml: &str) -> &'static SecurityContext {
    // A fixture that does not load is a broken harness, not a finding: stop loudly.
    match parse_context_yaml(yaml, Path::new("fuzz.yaml")) {
        Ok(context) => Box::leak(Box::new(context)),
        Err(error) => panic!("fuzz context does not load: {error}"),
    }
}

fn any_tool() -> [Pattern; 1] {
    match Pattern::parse("*") {
        Ok(pattern) => [pattern],
        Err(error) => panic!("'*' is not a pattern: {error}"),
    }
}

/// A fresh agent-token verifier that trusts the fuzz key (kid, issuer and audience above).
pub fn token_verifier() -> AgentTokenVerifier {
    let config = AgentTokenConfig {
        issuer: Some(FUZZ_TOKEN_ISSUER.to_owned()),
        audience: Some(FUZZ_TOKEN_AUDIENCE.to_owned()),
        leeway_secs: 0,
        keys: vec![KeyConfig {
            alg: Some("EdDSA".to_owned()),
            kid: Some(FUZZ_TOKEN_KID.to_owned()),
            public_key_pem: Some(FUZZ_PUBLIC_KEY_PEM.to_owned()),
            ..KeyConfig::default()
        }],
        issuer_key: None,
    };
    match AgentTokenVerifier::new(&config, Path::new(".")) {
        Ok(verifier) => verifier,
        Err(error) => panic!("fuzz token verifier: {error}"),
    }
}

fn verify_twice(
    verifier: &AgentTokenVerifier,
    token: &str,
) -> Result<Arc<AgentClaims>, TokenError> {
    let first = verifier.verify(token, FUZZ_NOW);
    assert_eq!(
        verifier.verify(token, FUZZ_NOW),
        first,
        "the cache answers differently"
    );
    first
}
