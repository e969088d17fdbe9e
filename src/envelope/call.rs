//! The JSON-RPC payload inside an envelope, read into typed values (SPEC sections 2 and 7.1; check 9):
//! a validated [`ToolName`] and a [`Call`] that is either `tools/call` or `tools/list`.
//!
//! Fields outside the JSON-RPC 2.0 request and the MCP `tools/call` params are refused: the gateway
//! forwards the payload, so anything it does not understand must not reach a tool unchecked.

use std::fmt;

use serde_json::{Map, Value};

use crate::strict_json::{quote_excerpt, refuse_case_folded_names};

/// Longest tool name, in bytes (SPEC section 2).
pub const MAX_TOOL_NAME_BYTES: usize = 128;

/// Length bounds of `params._meta.idempotency_key`, in bytes (SPEC section 7.1).
pub const IDEMPOTENCY_KEY_BYTES: std::ops::RangeInclusive<usize> = 1..=256;

/// A tool name matching `^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, at most 128 bytes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolName(String);

impl ToolName {
    pub fn parse(name: &str) -> Result<ToolName, String> {
        if name.is_empty() {
            return Err("tool name is empty".to_string());
        }
        if name.len() > MAX_TOOL_NAME_BYTES {
            return Err(format!(
                "tool name is {} bytes long; at most {MAX_TOOL_NAME_BYTES} are allowed",
                name.len()
            ));
        }
        for segment in name.split('.') {
            if segment.is_empty() {
                return Err(format!(
                    "tool name {} has an empty segment (a leading, trailing or doubled '.')",
                    quote_excerpt(name)
                ));
            }
            if let Some(bad) = segment
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
            {
                return Err(format!(
                    "tool name {} contains {}; allowed are A-Z, a-z, 0-9, '_', '-' and '.' between segments",
                    quote_excerpt(name),
                    quote_excerpt(bad.encode_utf8(&mut [0; 4])),
                ));
            }
        }
        Ok(ToolName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first segment, which selects the upstream (SPEC section 8: `fs.read_file` → `fs`).
    pub fn upstream(&self) -> &str {
        self.0
            .split_once('.')
            .map_or(self.0.as_str(), |(first, _)| first)
    }

    /// The name after the first '.', i.e. the tool's own name at its upstream; the whole name when
    /// there is no '.'.
    pub fn local_name(&self) -> &str {
        self.0
            .split_once('.')
            .map_or(self.0.as_str(), |(_, rest)| rest)
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ToolName({:?})", self.0)
    }
}

/// What the payload asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    ToolsCall {
        /// The JSON-RPC id: a string or a number.
        id: Value,
        tool: ToolName,
        /// `params.arguments`; an absent `arguments` reads as `{}`.
        arguments: Map<String, Value>,
        /// `params._meta.idempotency_key`, 1–256 bytes.
        idempotency_key: Option<String>,
    },
    ToolsList {
        id: Value,
    },
}

impl Call {
    pub fn id(&self) -> &Value {
        match self {
            Call::ToolsCall { id, .. } | Call::ToolsList { id } => id,
        }
    }

    /// The tool, for a `tools/call`.
    pub fn tool(&self) -> Option<&ToolName> {
        match self {
            Call::ToolsCall { tool, .. } => Some(tool),
            Call::ToolsList { .. } => None,
        }
    }

    /// The JSON-RPC method name.
    pub fn method(&self) -> &'static str {
        match self {
            Call::ToolsCall { .. } => "tools/call",
            Call::ToolsList { .. } => "tools/list",
        }
    }
}

/// Why a payload is not a `tools/call` or `tools/list` request the gateway accepts (code 1000). The
/// message names the field by its path in the payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{field} must be {expected}, found {found}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{place} has an unknown field {}", quote_excerpt(.field))]
    UnknownField { place: &'static str, field: String },
    #[error("payload.jsonrpc is {}; expected \"2.0\"", quote_excerpt(.0))]
    UnsupportedVersion(String),
    #[error("payload.id is missing (notifications are not accepted)")]
    Notification,
    #[error(
        "payload.method {} is not supported; expected \"tools/call\" or \"tools/list\"",
        quote_excerpt(.0)
    )]
    UnsupportedMethod(String),
    #[error("payload.params is missing (tools/call needs a name)")]
    NoParams,
    #[error("payload.params.name: {0}")]
    ToolName(String),
    /// Two argument names equal under ASCII case folding (SPEC 6.3 r3).
    #[error("payload.params.arguments: {0}")]
    CaseFoldedArguments(String),
    #[error("payload.params._meta.idempotency_key is {0} bytes long; it must be 1 to 256 bytes")]
    IdempotencyKeyLength(usize),
}

fn wrong_type(field: &'static str, expected: &'static str, found: &Value) -> PayloadError {
    PayloadError::WrongType {
        field,
        expected,
        found: json_kind(found),
    }
}

/// Reads the envelope's payload as a `tools/call` or `tools/list` JSON-RPC 2.0 request.
///
/// Refused: a `jsonrpc` other than `"2.0"`; an `id` that is missing, null, a boolean, an array or an
/// object (notifications get no answer, so they cannot be authorised calls); any other method; for
/// `tools/call`, `params` that is not an object, a missing or invalid `name`, `arguments` that is
/// present but not an object or that holds, at any depth, two names equal under ASCII case folding
/// (SPEC 6.3 r3); `params._meta` that is not an object or an `idempotency_key` that is not
/// a string of 1–256 bytes; and any field that a JSON-RPC request or these params do not define.
pub fn parse_call(payload: &Value) -> Result<Call, PayloadError> {
    let Value::Object(fields) = payload else {
        return Err(wrong_type("payload", "a JSON object", payload));
    };
    refuse_unknown_keys(fields, &["jsonrpc", "id", "method", "params"], "payload")?;
    match fields.get("jsonrpc") {
        Some(Value::String(version)) if version == "2.0" => {}
        Some(Value::String(version)) => {
            return Err(PayloadError::UnsupportedVersion(version.clone()))
        }
        Some(other) => return Err(wrong_type("payload.jsonrpc", "the string \"2.0\"", other)),
        None => return Err(PayloadError::Missing("payload.jsonrpc")),
    }
    let id = match fields.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        Some(other) => return Err(wrong_type("payload.id", "a string or a number", other)),
        None => return Err(PayloadError::Notification),
    };
    let method = match fields.get("method") {
        Some(Value::String(method)) => method.as_str(),
        Some(other) => return Err(wrong_type("payload.method", "a string", other)),
        None => return Err(PayloadError::Missing("payload.method")),
    };
    match method {
        "tools/call" => parse_tools_call(id, fields.get("params")),
        "tools/list" => {
            match fields.get("params") {
                None => {}
                Some(Value::Object(params)) => {
                    refuse_unknown_keys(params, &["_meta"], "payload.params")?;
                    idempotency_key(params)?;
                }
                Some(other) => return Err(wrong_type("payload.params", "an object", other)),
            }
            Ok(Call::ToolsList { id })
        }
        other => Err(PayloadError::UnsupportedMethod(other.to_string())),
    }
}

fn parse_tools_call(id: Value, params: Option<&Value>) -> Result<Call, PayloadError> {
    let params = match params {
        Some(Value::Object(params)) => params,
        Some(other) => return Err(wrong_type("payload.params", "an object", other)),
        None => return Err(PayloadError::NoParams),
    };
    refuse_unknown_keys(params, &["name", "arguments", "_meta"], "payload.params")?;
    let tool = match params.get("name") {
        Some(Value::String(name)) => ToolName::parse(name).map_err(PayloadError::ToolName)?,
        Some(other) => return Err(wrong_type("payload.params.name", "a string", other)),
        None => return Err(PayloadError::Missing("payload.params.name")),
    };
    let arguments = match params.get("arguments") {
        None => Map::new(),
        Some(Value::Object(arguments)) => {
            refuse_case_folded_names(arguments).map_err(PayloadError::CaseFoldedArguments)?;
            arguments.clone()
        }
        Some(other) => return Err(wrong_type("payload.params.arguments", "an object", other)),
    };
    let idempotency_key = idempotency_key(params)?;
    Ok(Call::ToolsCall {
        id,
        tool,
        arguments,
        idempotency_key,
    })
}

/// Reads `params._meta.idempotency_key`; `_meta` may hold other (MCP) keys, which are left alone.
fn idempotency_key(params: &Map<String, Value>) -> Result<Option<String>, PayloadError> {
    let meta = match params.get("_meta") {
        None => return Ok(None),
        Some(Value::Object(meta)) => meta,
        Some(other) => return Err(wrong_type("payload.params._meta", "an object", other)),
    };
    match meta.get("idempotency_key") {
        None => Ok(None),
        Some(Value::String(key)) if IDEMPOTENCY_KEY_BYTES.contains(&key.len()) => {
            Ok(Some(key.clone()))
        }
        Some(Value::String(key)) => Err(PayloadError::IdempotencyKeyLength(key.len())),
        Some(other) => Err(wrong_type(
            "payload.params._meta.idempotency_key",
            "a string",
            other,
        )),
    }
}

fn refuse_unknown_keys(
    fields: &Map<String, Value>,
    known: &[&str],
    place: &'static str,
) -> Result<(), PayloadError> {
    match fields.keys().find(|key| !known.contains(&key.as_str())) {
        Some(unknown) => Err(PayloadError::UnknownField {
            place,
            field: unknown.clone(),
        }),
        None => Ok(()),
    }
}

/// "a string", "an object", … for error messages.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_names_follow_the_grammar() {
        for good in [
            "fs",
            "fs.read_file",
            "a-b.c_d.E9",
            "x.y.z",
            &"a".repeat(128),
        ] {
            assert_eq!(ToolName::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            ".fs",
            "fs.",
            "fs..read",
            "fs read",
            "fs/read",
            "fs.*",
            "é",
            "fs.read\n",
            "fs:read",
            &"a".repeat(129),
        ] {
            assert!(ToolName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ToolName::parse(&"a".repeat(129))
            .unwrap_err()
            .contains("129 bytes"));
        assert!(ToolName::parse("fs..x")
            .unwrap_err()
            .contains("empty segment"));
        assert!(ToolName::parse("fs.r*").unwrap_err().contains("\"*\""));
    }

    #[test]
    fn tool_names_split_into_upstream_and_local_name() {
        let nested = ToolName::parse("fs.dir.list").unwrap();
        assert_eq!((nested.upstream(), nested.local_name()), ("fs", "dir.list"));
        let single = ToolName::parse("echo").unwrap();
        assert_eq!((single.upstream(), single.local_name()), ("echo", "echo"));
    }

    #[test]
    fn reads_a_tools_call() {
        let payload = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "fs.read_file", "arguments": {"path": "/workspace/a"},
                       "_meta": {"idempotency_key": "k-1", "progressToken": 3}}});
        let call = parse_call(&payload).unwrap();
        assert_eq!(call.method(), "tools/call");
        assert_eq!(call.id(), &json!(7));
        let Call::ToolsCall {
            tool,
            arguments,
            idempotency_key,
            ..
        } = call
        else {
            panic!("not a tools/call");
        };
        assert_eq!(tool.as_str(), "fs.read_file");
        assert_eq!(Value::Object(arguments), json!({"path": "/workspace/a"}));
        assert_eq!(idempotency_key.as_deref(), Some("k-1"));
    }

    #[test]
    fn absent_arguments_read_as_an_empty_object() {
        let call = parse_call(&json!({"jsonrpc": "2.0", "id": "x", "method": "tools/call",
            "params": {"name": "echo"}}))
        .unwrap();
        assert_eq!(
            call,
            Call::ToolsCall {
                id: json!("x"),
                tool: ToolName::parse("echo").unwrap(),
                arguments: Map::new(),
                idempotency_key: None
            }
        );
    }

    #[test]
    fn reads_a_tools_list() {
        for payload in [
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}),
        ] {
            assert_eq!(
                parse_call(&payload).unwrap(),
                Call::ToolsList { id: json!(1) }
            );
        }
    }

    #[test]
    fn refuses_malformed_payloads_naming_the_problem() {
        let base = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "fs.read", "arguments": {}, "_meta": {}}});
        assert!(parse_call(&base).is_ok());
        let with = |pointer: &str, value: Value| {
            let mut payload = base.clone();
            *payload.pointer_mut(pointer).unwrap() = value;
            parse_call(&payload).unwrap_err().to_string()
        };
        let without = |field: &str| {
            let mut payload = base.clone();
            payload.as_object_mut().unwrap().remove(field);
            parse_call(&payload).unwrap_err().to_string()
        };
        assert!(with("/jsonrpc", json!("1.0")).contains("expected \"2.0\""));
        assert!(with("/jsonrpc", json!(2.0)).contains("found a number"));
        assert!(without("jsonrpc").contains("jsonrpc is missing"));
        assert!(without("id").contains("id is missing"));
        assert!(with("/id", Value::Null).contains("found null"));
        assert!(with("/id", json!(true)).contains("found a boolean"));
        assert!(with("/id", json!([1])).contains("found an array"));
        assert!(with("/method", json!("resources/read")).contains("not supported"));
        assert!(without("method").contains("method is missing"));
        assert!(without("params").contains("params is missing"));
        assert!(with("/params", json!([])).contains("params must be an object"));
        assert!(with("/params/name", json!(5)).contains("name must be a string"));
        assert!(with("/params/name", json!("fs/read")).contains("payload.params.name: tool name"));
        assert!(with("/params/arguments", json!("x")).contains("arguments must be an object"));
        assert!(with("/params/arguments", Value::Null).contains("arguments must be an object"));
        assert_eq!(
            with(
                "/params/arguments",
                json!({"opts": {"Path": "/etc", "path": "/w"}})
            ),
            "payload.params.arguments: the names \"path\" and \"Path\" are equal under ASCII case \
             folding at $.opts"
        );
        assert!(with("/params/_meta", json!("k")).contains("_meta must be an object"));
        let key_error = |key: Value| with("/params/_meta", json!({"idempotency_key": key}));
        assert!(key_error(json!("")).contains("0 bytes long"));
        assert!(key_error(json!("k".repeat(257))).contains("257 bytes long"));
        assert!(key_error(json!(12)).contains("must be a string"));
        let mut extra_param = base.clone();
        extra_param["params"]["task"] = json!({});
        assert!(parse_call(&extra_param)
            .unwrap_err()
            .to_string()
            .contains("payload.params has an unknown field \"task\""));
        assert!(parse_call(&json!([]))
            .unwrap_err()
            .to_string()
            .contains("found an array"));
        let mut extra = base.clone();
        extra["result"] = json!(1);
        assert!(parse_call(&extra)
            .unwrap_err()
            .to_string()
            .contains("payload has an unknown field \"result\""));
    }

    #[test]
    fn accepts_idempotency_keys_at_the_length_bounds() {
        for key in ["k".to_string(), "k".repeat(256), "é".repeat(128)] {
            let payload = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "x", "_meta": {"idempotency_key": key}}});
            let Ok(Call::ToolsCall {
                idempotency_key, ..
            }) = parse_call(&payload)
            else {
                panic!("refused a {}-byte key", key.len());
            };
            assert_eq!(idempotency_key, Some(key));
        }
    }
}
