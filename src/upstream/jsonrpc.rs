//! JSON-RPC 2.0 response handling shared by the upstream kinds: strict validation of an answer
//! read from a plain JSON-RPC endpoint, and the response object handed back with the caller's id.

use serde_json::{Map, Value};

use super::UpstreamError;
use crate::strict_json::{parse_tool_answer, AnswerRefusal};

/// What a tool answered: a `result`, or a JSON-RPC `error` object (`code`, `message`, `data`?).
/// Both are answers (the claim is committed either way); only their shape differs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ToolAnswer {
    Result(Value),
    Error(Value),
}

impl ToolAnswer {
    /// The JSON-RPC response object that goes back to the agent, with the agent's own id.
    pub(crate) fn into_response(self, caller_id: &Value) -> Value {
        let mut response = Map::new();
        response.insert("jsonrpc".into(), Value::String("2.0".into()));
        response.insert("id".into(), caller_id.clone());
        match self {
            ToolAnswer::Result(result) => response.insert("result".into(), result),
            ToolAnswer::Error(error) => response.insert("error".into(), error),
        };
        Value::Object(response)
    }

    /// The serialized size of the answer's payload (the `result` or `error` value).
    pub(crate) fn payload_len(&self) -> usize {
        let value = match self {
            ToolAnswer::Result(v) | ToolAnswer::Error(v) => v,
        };
        serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len())
    }
}

/// Builds the JSON-RPC `error` member from its parts, leaving out an absent `data`.
pub(crate) fn error_object(code: i64, message: &str, data: Option<Value>) -> Value {
    let mut error = Map::new();
    error.insert("code".into(), Value::from(code));
    error.insert("message".into(), Value::String(message.to_owned()));
    if let Some(data) = data {
        error.insert("data".into(), data);
    }
    Value::Object(error)
}

/// Reads `body` as the JSON-RPC response to the request that carried `expected_id`.
///
/// Strict JSON (no repeated key), with every number as JCS will write it for the receipt (SPEC 20
/// rule 5). Strict JSON-RPC: `jsonrpc` must be `"2.0"`, exactly one of `result` / `error` must be present, an error
/// must have an integer `code` and a string `message`, and the id must be ours (or `null` on an
/// error, which JSON-RPC allows when the server could not read the id). A non-2xx status is only
/// accepted together with an `error`: a failed HTTP exchange that claims success is not an answer.
pub(crate) fn parse_http_answer(
    body: &[u8],
    expected_id: &Value,
    status_is_success: bool,
) -> Result<ToolAnswer, UpstreamError> {
    let bad = |why: &str| UpstreamError::BadResponse(why.to_owned());
    let value = parse_tool_answer(body).map_err(|refusal| match refusal {
        AnswerRefusal::InexactNumber(why) => UpstreamError::InexactNumber(why),
        AnswerRefusal::Malformed(why) => UpstreamError::BadResponse(format!("not JSON: {why}")),
    })?;
    let Value::Object(mut object) = value else {
        return Err(bad("the answer is not a JSON object"));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(bad("`jsonrpc` is not \"2.0\""));
    }
    let Some(id) = object.get("id") else {
        return Err(bad("the answer has no `id`"));
    };
    let id_is_null = id.is_null();
    if id != expected_id && !id_is_null {
        return Err(bad("the answer's `id` is not the id of the request"));
    }
    let answer = match (object.remove("result"), object.remove("error")) {
        (Some(_), Some(_)) => return Err(bad("the answer has both `result` and `error`")),
        (None, None) => return Err(bad("the answer has neither `result` nor `error`")),
        (Some(result), None) => {
            if id_is_null {
                return Err(bad("a `result` with a null `id`"));
            }
            if !status_is_success {
                return Err(bad("a `result` in a non-2xx HTTP answer"));
            }
            ToolAnswer::Result(result)
        }
        (None, Some(error)) => ToolAnswer::Error(validate_error(error)?),
    };
    Ok(answer)
}

fn validate_error(error: Value) -> Result<Value, UpstreamError> {
    let bad = |why: &str| UpstreamError::BadResponse(why.to_owned());
    let Value::Object(mut error) = error else {
        return Err(bad("`error` is not an object"));
    };
    let code = match error.get("code") {
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.as_i64(),
        _ => None,
    }
    .ok_or_else(|| bad("`error.code` is not an integer"))?;
    let message = match error.get("message") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad("`error.message` is not a string")),
    };
    Ok(error_object(code, &message, error.remove("data")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value, ok: bool) -> Result<ToolAnswer, UpstreamError> {
        parse_http_answer(body.to_string().as_bytes(), &json!(7), ok)
    }

    #[test]
    fn accepts_results_and_errors() {
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 7, "result": {"x": 1}}), true).unwrap(),
            ToolAnswer::Result(json!({"x": 1}))
        );
        assert_eq!(
            parse(json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32601, "message": "no", "data": [1], "extra": 1}}), false).unwrap(),
            ToolAnswer::Error(json!({"code": -32601, "message": "no", "data": [1]}))
        );
        assert!(parse(
            json!({"jsonrpc": "2.0", "id": null, "error": {"code": -32700, "message": "parse"}}),
            true
        )
        .is_ok());
    }

    #[test]
    fn refuses_everything_that_is_not_a_response_to_us() {
        let cases = [
            json!([1]),
            json!({"id": 7, "result": 1}),
            json!({"jsonrpc": "1.0", "id": 7, "result": 1}),
            json!({"jsonrpc": "2.0", "result": 1}),
            json!({"jsonrpc": "2.0", "id": 8, "result": 1}),
            json!({"jsonrpc": "2.0", "id": null, "result": 1}),
            json!({"jsonrpc": "2.0", "id": 7}),
            json!({"jsonrpc": "2.0", "id": 7, "result": 1, "error": {"code": 1, "message": "m"}}),
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": 1.5, "message": "m"}}),
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": 1}}),
            json!({"jsonrpc": "2.0", "id": 7, "error": "boom"}),
        ];
        for case in cases {
            assert!(
                matches!(
                    parse(case.clone(), true),
                    Err(UpstreamError::BadResponse(_))
                ),
                "{case}"
            );
        }
        assert!(matches!(
            parse_http_answer(b"<html>", &json!(7), true),
            Err(UpstreamError::BadResponse(_))
        ));
        // A result in a failed HTTP exchange is not trusted.
        assert!(parse(json!({"jsonrpc": "2.0", "id": 7, "result": 1}), false).is_err());
    }

    #[test]
    fn response_carries_the_callers_id() {
        let response = ToolAnswer::Result(json!({"ok": true})).into_response(&json!("agent-1"));
        assert_eq!(
            response,
            json!({"jsonrpc": "2.0", "id": "agent-1", "result": {"ok": true}})
        );
    }
}
