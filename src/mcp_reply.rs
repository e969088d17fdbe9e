//! What an MCP host is told, by `sealgate connect` (SPEC 15) and by the gateway's own MCP endpoint
//! (SPEC 17) alike: the gateway's answers turned into MCP results and JSON-RPC errors. A refusal is a tool
//! result that a model can read and act on; a refused `tools/list` is a JSON-RPC error, since there is no
//! tool result to carry it.

use rmcp::model::{CallToolResult, ErrorCode, ListToolsResult};
use rmcp::ErrorData as McpError;
use serde_json::{json, Map, Value};

use crate::tool_meta::{self, ERROR_KEY, RECEIPT_KEY, WARNINGS_KEY};

/// What the gateway said about one envelope.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// `status: success`: the JSON-RPC response of the tool (or of `tools/list`) and its receipt.
    Success { payload: Value, receipt: Value },
    /// `status: error`: the error object (`code`, `name`, `message`, `details`, …).
    Refused(Value),
    /// No `seal/v1` answer at all: why, without the URL's secrets.
    Unreachable(String),
}

/// The start of every text that says the gateway could not be reached.
pub const UNREACHABLE: &str = "sealgate is unreachable";

/// "sealgate refused this call: CODE NAME: message".
pub fn refusal_sentence(error: &Value) -> String {
    format!(
        "sealgate refused this call: {} {}: {}",
        error["code"],
        error["name"].as_str().unwrap_or("UNKNOWN"),
        error["message"].as_str().unwrap_or("")
    )
}

/// The answer to `tools/call`.
pub fn tool_result(answer: Answer) -> Result<CallToolResult, McpError> {
    match answer {
        Answer::Success {
            mut payload,
            receipt,
        } => {
            if let Some(error) = payload.get("error") {
                return Err(tool_error(error, receipt));
            }
            let mut result = payload["result"].take();
            // The gateway removed them already; a bridge never trusts that (SPEC 20 rule 10).
            tool_meta::remove_sealgate_keys(&mut result);
            let Value::Object(fields) = &result else {
                return Err(internal(
                    "the tool's answer holds no result object".into(),
                    Some(json!({ RECEIPT_KEY: receipt })),
                ));
            };
            let mut with_receipt = fields.clone();
            let meta = with_receipt
                .entry("_meta")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(meta) = meta {
                meta.insert(RECEIPT_KEY.into(), receipt.clone());
            }
            call_tool_result(Value::Object(with_receipt))
                .or_else(|_| call_tool_result(as_text_result(&result, receipt)))
        }
        Answer::Refused(error) => call_tool_result(json!({
            "content": [{"type": "text", "text": refusal_sentence(&error)}],
            "isError": true,
            "_meta": { ERROR_KEY: error },
        })),
        Answer::Unreachable(why) => call_tool_result(json!({
            "content": [{"type": "text", "text": format!("{UNREACHABLE}: {why}")}],
            "isError": true,
        })),
    }
}

/// The answer to `tools/list`: the gateway's list, whole.
pub fn tool_list(answer: Answer) -> Result<ListToolsResult, McpError> {
    match answer {
        Answer::Success { mut payload, .. } => {
            if let Some(error) = payload.get("error") {
                return Err(tool_error(error, Value::Null));
            }
            // The list is passed on whole, `_meta` included; the host's log also says what it lacks.
            if let Some(Value::Array(warnings)) = payload["result"]["_meta"].get(WARNINGS_KEY) {
                for warning in warnings.iter().filter_map(Value::as_str) {
                    tracing::warn!("tools/list: {warning}");
                }
            }
            serde_json::from_value(payload["result"].take()).map_err(|e| {
                internal(
                    format!("the gateway's tools/list answer is not an MCP tool list: {e}"),
                    None,
                )
            })
        }
        Answer::Refused(error) => Err(internal(
            refusal_sentence(&error),
            Some(json!({ ERROR_KEY: error })),
        )),
        Answer::Unreachable(why) => Err(internal(format!("{UNREACHABLE}: {why}"), None)),
    }
}

/// A tool's own JSON-RPC error, same code and message, with the receipt as its data.
fn tool_error(error: &Value, receipt: Value) -> McpError {
    let code = error["code"]
        .as_i64()
        .and_then(|code| i32::try_from(code).ok())
        .unwrap_or(ErrorCode::INTERNAL_ERROR.0);
    let data = (!receipt.is_null()).then(|| json!({ RECEIPT_KEY: receipt }));
    McpError::new(
        ErrorCode(code),
        error["message"].as_str().unwrap_or("").to_owned(),
        data,
    )
}

fn internal(message: String, data: Option<Value>) -> McpError {
    McpError::new(ErrorCode::INTERNAL_ERROR, message, data)
}

fn call_tool_result(value: Value) -> Result<CallToolResult, McpError> {
    serde_json::from_value(value)
        .map_err(|e| internal(format!("cannot build the tool result: {e}"), None))
}

/// A result that is not an MCP tool result (a plain JSON-RPC tool's): its JSON as text, and as
/// structured content when it is an object, so that the host loses nothing it could show.
fn as_text_result(result: &Value, receipt: Value) -> Value {
    let mut shown = json!({
        "content": [{"type": "text", "text": result.to_string()}],
        "_meta": { RECEIPT_KEY: receipt },
    });
    if result.is_object() {
        shown["structuredContent"] = result.clone();
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(result: &CallToolResult) -> Value {
        serde_json::to_value(result).unwrap()
    }

    fn refused() -> Value {
        json!({"code": 2002, "name": "POLICY_VIOLATION_PATH_NOT_ALLOWED",
               "message": "argument \"path\": outside path_allowlist", "details": {}})
    }

    #[test]
    fn a_result_gets_the_receipt_in_its_meta_and_keeps_the_rest() {
        let payload = json!({"jsonrpc": "2.0", "id": 3, "result": {
            "content": [{"type": "text", "text": "ok"}], "_meta": {"other": 1}}});
        let receipt = json!({"claim": "PROCEED", "request_id": "r"});
        let result = tool_result(Answer::Success {
            payload,
            receipt: receipt.clone(),
        })
        .unwrap();
        let result = wire(&result);
        assert_eq!(result["content"][0]["text"], "ok");
        assert_eq!(result["_meta"]["other"], 1);
        assert_eq!(result["_meta"][RECEIPT_KEY], receipt);
    }

    #[test]
    fn a_tool_error_keeps_its_code_and_message_and_carries_the_receipt() {
        let payload = json!({"jsonrpc": "2.0", "id": 3,
            "error": {"code": -32000, "message": "tool failed", "data": {"x": 1}}});
        let error = tool_result(Answer::Success {
            payload,
            receipt: json!({"claim": "NONE"}),
        })
        .unwrap_err();
        assert_eq!(error.code, ErrorCode(-32000));
        assert_eq!(error.message, "tool failed");
        assert_eq!(error.data, Some(json!({RECEIPT_KEY: {"claim": "NONE"}})));
    }

    #[test]
    fn a_refusal_is_a_tool_result_with_the_sentence_and_the_error_object() {
        let result = wire(&tool_result(Answer::Refused(refused())).unwrap());
        assert_eq!(result["isError"], true);
        assert_eq!(
            result["content"][0]["text"],
            "sealgate refused this call: 2002 POLICY_VIOLATION_PATH_NOT_ALLOWED: argument \"path\": outside path_allowlist"
        );
        assert_eq!(result["_meta"][ERROR_KEY], refused());
    }

    #[test]
    fn an_unreachable_gateway_says_so_without_an_error_object() {
        let result = wire(&tool_result(Answer::Unreachable("refused".into())).unwrap());
        assert_eq!(result["isError"], true);
        assert!(result["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(UNREACHABLE));
        assert!(result.get("_meta").is_none());
    }

    #[test]
    fn a_result_that_is_not_an_mcp_tool_result_is_shown_as_its_json() {
        let payload = json!({"jsonrpc": "2.0", "id": 3, "result": {"sum": 5}});
        let result = wire(
            &tool_result(Answer::Success {
                payload,
                receipt: json!({"claim": "NONE"}),
            })
            .unwrap(),
        );
        assert_eq!(result["content"][0]["text"], "{\"sum\":5}");
        assert_eq!(result["structuredContent"], json!({"sum": 5}));
        assert_eq!(result["_meta"][RECEIPT_KEY]["claim"], "NONE");
    }

    #[test]
    fn a_refused_or_failed_tool_list_is_an_internal_error() {
        let refusal = tool_list(Answer::Refused(refused())).unwrap_err();
        assert_eq!(refusal.code, ErrorCode::INTERNAL_ERROR);
        assert!(refusal
            .message
            .starts_with("sealgate refused this call: 2002"));
        assert_eq!(refusal.data, Some(json!({ERROR_KEY: refused()})));
        let unreachable = tool_list(Answer::Unreachable("down".into())).unwrap_err();
        assert_eq!(unreachable.code, ErrorCode::INTERNAL_ERROR);
        assert!(unreachable.message.starts_with(UNREACHABLE));
        assert_eq!(unreachable.data, None);
        let listed = tool_list(Answer::Success {
            payload: json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
                {"name": "fs.read", "inputSchema": {"type": "object"}}]}}),
            receipt: Value::Null,
        })
        .unwrap();
        assert_eq!(listed.tools[0].name, "fs.read");
    }
}
