//! The `_meta` keys of a tool result that belong to sealgate (SPEC 15, SPEC 20 rule 10): the receipt and
//! the refusal that `sealgate connect` hands an MCP host. A tool may not plant them: a planted
//! `sealgate/error` would make a call that ran look like a refusal (and a host that keys on it retry
//! it), a planted `sealgate/receipt` would pass for another receipt. The gateway removes them from
//! every tool answer, and the bridge again before it adds its own.

use serde_json::Value;

/// What every key of sealgate's own starts with.
const PREFIX: &str = "sealgate/";
/// Where the receipt goes in a result's `_meta`, and in a tool error's `data`.
pub const RECEIPT_KEY: &str = "sealgate/receipt";
/// Where the gateway's error object goes.
pub const ERROR_KEY: &str = "sealgate/error";
/// Where a `tools/list` says which upstreams' tools it left out (SPEC 20 rule 11).
pub const WARNINGS_KEY: &str = "sealgate/warnings";

/// Removes every `sealgate/…` key from `result._meta`; the rest of the result stays as the tool sent it.
pub fn remove_sealgate_keys(result: &mut Value) {
    if let Some(Value::Object(meta)) = result.get_mut("_meta") {
        meta.retain(|key, _| !key.starts_with(PREFIX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_sealgate_keys_leave_the_meta() {
        let mut result = json!({"content": [], "isError": false, "_meta": {
            "sealgate/error": {"code": 2001}, "sealgate/receipt": {}, "sealgate/x": 1,
            "sealgatex": 2, "progressToken": 3}});
        remove_sealgate_keys(&mut result);
        assert_eq!(
            result,
            json!({"content": [], "isError": false, "_meta": {"sealgatex": 2, "progressToken": 3}})
        );
        for mut other in [json!({"_meta": "text"}), json!({"sum": 5}), json!(7)] {
            let before = other.clone();
            remove_sealgate_keys(&mut other);
            assert_eq!(other, before);
        }
    }
}
