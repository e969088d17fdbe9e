//! What a call would get, and why, as the operator asks it offline (`policy explain`, `policy test`) and
//! over the API (`evaluate`): the gateway's own decision, with the approval it would wait for.

use serde_json::{json, Map, Value};

use super::{decide_in_session, Decision, HeldLabel, Pattern, SecurityContext};

/// The decision a call would get in a session holding `held` labels (SPEC 19), with its code and the
/// rule that decided (shared with the API).
pub fn explain(
    context: &SecurityContext,
    tool: &str,
    arguments: &Map<String, Value>,
    held: &[HeldLabel],
) -> Value {
    let any = [Pattern::parse("*").expect("`*` is a valid pattern")];
    let mut answer = match decide_in_session(Some(context), &any, tool, arguments, held) {
        Decision::Allow {
            capability,
            rule,
            flow,
        } => {
            let mut allow = json!({"decision": "allow", "rule": rule, "capability": capability});
            // Allowed, but only with a person's grant: the call itself gets 4003 until then (SPEC 13);
            // a flow rule's `approval` asks one even where the capability asks none (SPEC 19).
            let approval = context.capabilities[capability]
                .approval
                .or(flow.as_ref().map(|_| crate::approval::FLOW_APPROVAL));
            if let Some(rule) = approval {
                allow["approval"] = json!({"required": true, "expires_secs": rule.expires_secs,
                    "approvers": rule.approvers,
                    "separate_from_registrant": rule.separate_from_registrant});
            }
            if let Some(flow) = flow {
                allow["flow_rule"] = json!(flow);
            }
            let labels = &context.capabilities[capability].labels;
            if !labels.is_empty() {
                // What the session would gain once the call completes.
                allow["labels_added"] = json!(labels);
            }
            allow
        }
        Decision::Deny {
            code,
            rule,
            message,
            flow,
        } => {
            let mut deny = json!({
                "decision": "deny", "code": code.number(), "name": code.name(),
                "message": message, "rule": rule,
            });
            if let Some(flow) = flow {
                deny["flow_rule"] = json!(flow);
            }
            deny
        }
    };
    answer["session_labels"] = json!(held);
    answer["context"] = json!(context.spec.name);
    answer["context_version"] = json!(context.version);
    answer
}

/// `capability #2 cmd.run`, `flow_rule #0`, `deny_list #1 secrets.*`, `no_match`.
pub fn rule_text(rule: &Value) -> String {
    let mut text = rule["kind"].as_str().unwrap_or("?").to_owned();
    if let Some(index) = rule["index"].as_u64() {
        text.push_str(&format!(" #{index}"));
    }
    if let Some(pattern) = rule["pattern"].as_str() {
        text.push(' ');
        text.push_str(pattern);
    }
    text
}
