//! Session flow rules (SPEC 19): which flow rule, if any, applies to a call of a capability, given the
//! labels its session holds. Pure: the session room reads the labels from the store, and the pipeline
//! asks for them only when [`needs_labels`] says a rule could apply, so that a context without flow rules,
//! or a capability that no rule blocks, costs a call nothing.

use serde::Serialize;

use super::model::{FlowAction, SecurityContext};
use super::pattern::Pattern;

/// A label the session holds, with the `seq` of the completion event that brought it (None for the
/// labels that `explain` and `evaluate` are told to assume).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldLabel {
    pub label: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

impl HeldLabel {
    /// A label assumed to be held, as `--session-labels` names it.
    pub fn assumed(label: &str) -> HeldLabel {
        HeldLabel {
            label: label.to_owned(),
            seq: None,
        }
    }
}

/// The flow rule that applies to a call: its index and action, the labels of its `if_session_has` with
/// the events that brought them, and the capability's labels it blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FlowMatch {
    /// The rule's index in `flow_rules`.
    pub index: usize,
    pub action: FlowAction,
    /// The rule's `if_session_has`, each with the seq of the event that brought it to the session.
    pub labels: Vec<HeldLabel>,
    /// The capability's labels that the rule's `block` names.
    pub blocks: Vec<String>,
}

/// The first flow rule that applies to a call of `capabilities[capability]` in a session that holds
/// `held` (SPEC 19): all its `if_session_has` held, and its `block` sharing a label with the capability.
pub fn applies(ctx: &SecurityContext, capability: usize, held: &[HeldLabel]) -> Option<FlowMatch> {
    let capability = ctx.capabilities.get(capability)?;
    capability.flow_rules.iter().find_map(|&index| {
        let rule = ctx.flows.get(index)?;
        let labels = rule
            .if_session_has
            .iter()
            .map(|wanted| held.iter().find(|h| h.label == *wanted).cloned())
            .collect::<Option<Vec<HeldLabel>>>()?;
        Some(FlowMatch {
            index,
            action: rule.action,
            labels,
            blocks: rule
                .block
                .iter()
                .filter(|label| capability.labels.contains(label))
                .cloned()
                .collect(),
        })
    })
}

/// Whether deciding a call of `tool` could need the session's labels: the capability that the call
/// would meet (session patterns, deny list, first matching pattern) is blocked by some flow rule. False
/// at once for a context without flow rules.
pub fn needs_labels(
    ctx: Option<&SecurityContext>,
    session_patterns: &[Pattern],
    tool: &str,
) -> bool {
    let Some(ctx) = ctx else { return false };
    if ctx.flows.is_empty() {
        return false;
    }
    session_patterns.iter().any(|pattern| pattern.matches(tool))
        && !ctx.deny.iter().any(|pattern| pattern.matches(tool))
        && ctx
            .capabilities
            .iter()
            .find(|capability| capability.pattern.matches(tool))
            .is_some_and(|capability| !capability.flow_rules.is_empty())
}

/// The message of a 2010 refusal: the rule and what it blocks, never an argument.
pub fn blocked_message(flow: &FlowMatch) -> String {
    let held: Vec<&str> = flow.labels.iter().map(|h| h.label.as_str()).collect();
    format!(
        "flow rule {} blocks {} once the session holds {}",
        flow.index,
        flow.blocks.join(", "),
        held.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use proptest::prelude::*;

    use super::*;
    use crate::policy::load::parse_context_yaml;

    const TRIFECTA: &str = "\
name: t
capabilities:
  - { tool_pattern: \"web.fetch\", labels: [untrusted_content] }
  - { tool_pattern: \"fs.read_file\", labels: [private_data] }
  - { tool_pattern: \"email.send\", labels: [external_send] }
  - { tool_pattern: \"*\" }
flow_rules:
  - { if_session_has: [untrusted_content, private_data], block: [external_send], action: deny }
  - { if_session_has: [untrusted_content], block: [external_send], action: approval }
";

    fn context(text: &str) -> SecurityContext {
        match parse_context_yaml(text, Path::new("t.yaml")) {
            Ok(context) => context,
            Err(error) => panic!("{error}"),
        }
    }

    fn held(labels: &[(&str, u64)]) -> Vec<HeldLabel> {
        labels
            .iter()
            .map(|(label, seq)| HeldLabel {
                label: (*label).to_owned(),
                seq: Some(*seq),
            })
            .collect()
    }

    #[test]
    fn the_first_rule_whose_labels_are_all_held_applies() {
        let ctx = context(TRIFECTA);
        assert_eq!(applies(&ctx, 2, &[]), None);
        assert_eq!(applies(&ctx, 2, &held(&[("private_data", 3)])), None);
        let approval = applies(&ctx, 2, &held(&[("untrusted_content", 4)]));
        assert_eq!(
            approval.as_ref().map(|f| (f.index, f.action)),
            Some((1, FlowAction::Approval))
        );
        let both = held(&[("private_data", 3), ("untrusted_content", 7)]);
        let deny = applies(&ctx, 2, &both);
        assert_eq!(
            deny,
            Some(FlowMatch {
                index: 0,
                action: FlowAction::Deny,
                labels: held(&[("untrusted_content", 7), ("private_data", 3)]),
                blocks: vec!["external_send".into()],
            })
        );
        // Only a capability whose labels the rule blocks: reading more is never held back.
        assert_eq!(applies(&ctx, 0, &both), None);
        assert_eq!(applies(&ctx, 3, &both), None);
    }

    #[test]
    fn labels_are_read_only_for_a_capability_that_a_rule_blocks() {
        let ctx = context(TRIFECTA);
        let all = [Pattern::parse("*").unwrap_or_else(|e| panic!("{e}"))];
        assert!(needs_labels(Some(&ctx), &all, "email.send"));
        assert!(!needs_labels(Some(&ctx), &all, "web.fetch"));
        assert!(!needs_labels(Some(&ctx), &all, "other.tool"));
        assert!(!needs_labels(None, &all, "email.send"));
        let none = context("name: n\ncapabilities: [{tool_pattern: \"*\", labels: [a]}]\n");
        assert!(none.flows.is_empty());
        assert!(!needs_labels(Some(&none), &all, "email.send"));
    }

    #[test]
    fn the_refusal_names_the_rule_and_labels() {
        let ctx = context(TRIFECTA);
        let both = held(&[("private_data", 3), ("untrusted_content", 7)]);
        let flow = applies(&ctx, 2, &both).unwrap_or_else(|| panic!("applies"));
        assert_eq!(
            blocked_message(&flow),
            "flow rule 0 blocks external_send once the session holds untrusted_content, private_data"
        );
    }

    fn label() -> impl Strategy<Value = String> {
        prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(str::to_owned)
    }

    proptest! {
        /// Labels only grow, so the decision only gets stricter: a rule that applies with some labels
        /// still applies, or an earlier one does, when the session holds more.
        #[test]
        fn more_labels_never_loosen_the_decision(
            rules in prop::collection::vec(
                (prop::collection::vec(label(), 1..3), prop::collection::vec(label(), 1..3), any::<bool>()),
                0..4,
            ),
            caps in prop::collection::vec(prop::collection::vec(label(), 0..3), 1..4),
            first in prop::collection::vec(label(), 0..4),
            more in prop::collection::vec(label(), 0..4),
        ) {
            let mut text = String::from("name: p\ncapabilities:\n");
            for (index, labels) in caps.iter().enumerate() {
                text.push_str(&format!("  - {{ tool_pattern: \"t{index}\", labels: {labels:?} }}\n"));
            }
            text.push_str("flow_rules:\n");
            for (has, block, deny) in &rules {
                let action = if *deny { "deny" } else { "approval" };
                text.push_str(&format!(
                    "  - {{ if_session_has: {has:?}, block: {block:?}, action: {action} }}\n"
                ));
            }
            if rules.is_empty() {
                text = text.replace("flow_rules:\n", "");
            }
            let ctx = context(&text);
            let before: Vec<HeldLabel> = first.iter().map(|l| HeldLabel::assumed(l)).collect();
            let mut after = before.clone();
            after.extend(more.iter().map(|l| HeldLabel::assumed(l)));
            for capability in 0..caps.len() {
                let was = applies(&ctx, capability, &before);
                let now = applies(&ctx, capability, &after);
                if let Some(was) = was {
                    let now = now.map(|n| n.index);
                    prop_assert!(now.is_some_and(|n| n <= was.index));
                }
            }
        }
    }
}
