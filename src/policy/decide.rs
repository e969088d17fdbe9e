//! The policy decision of SPEC 6.3, steps 1–4: session patterns, context, deny list, then the first
//! matching capability with its path, command and domain checks, in that order.
//!
//! Rate limits (2005) and budgets (2008) need the store, so the pipeline applies them after an
//! `Allow`, reading the capability that `Allow` names.

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use super::error::Violation;
use super::flows::{self, FlowMatch, HeldLabel};
use super::model::{Capability, FlowAction, SecurityContext};
use super::pattern::{is_valid_tool_name, Pattern};
use crate::error::Code;

/// Which part of the policy decided (audit `rule`, SPEC 9.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    DenyList,
    Capability,
    NoMatch,
    SessionPatterns,
    /// A flow rule (SPEC 19); `index` is its place in `flow_rules`.
    FlowRule,
}

/// The rule that decided: its kind, its index in the context's list and its pattern, when any, and a
/// capability's `id` when it has one (with the pattern, what names its rate window: `crate::recovery`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rule {
    pub kind: RuleKind,
    pub index: Option<usize>,
    pub pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl Rule {
    pub fn without_position(kind: RuleKind) -> Rule {
        Rule {
            kind,
            index: None,
            pattern: None,
            id: None,
        }
    }

    fn at(kind: RuleKind, index: usize, pattern: &Pattern) -> Rule {
        Rule {
            kind,
            index: Some(index),
            pattern: Some(pattern.as_str().to_owned()),
            id: None,
        }
    }

    fn capability(index: usize, capability: &Capability) -> Rule {
        Rule {
            id: capability.id.clone(),
            ..Rule::at(RuleKind::Capability, index, &capability.pattern)
        }
    }
}

/// The outcome of `decide`. A refusal always carries its SPEC code, and a message that names the
/// argument and the rule but never quotes an argument's value (SPEC 9.1 r2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum Decision {
    /// Allowed by `capabilities[capability]` (rate limit and budget still to apply); with `flow`, only
    /// once a person approves it, whatever the capability asks (SPEC 19's `approval`).
    Allow {
        capability: usize,
        rule: Rule,
        #[serde(skip_serializing_if = "Option::is_none")]
        flow: Option<FlowMatch>,
    },
    Deny {
        #[serde(serialize_with = "code_number")]
        code: Code,
        rule: Rule,
        message: String,
        /// The flow rule that refused (2010), with the labels and the events that brought them.
        #[serde(skip_serializing_if = "Option::is_none")]
        flow: Option<FlowMatch>,
    },
}

/// A code serialises as its number, as in the audit event and the API (SPEC 9.1, 10).
fn code_number<S: Serializer>(code: &Code, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u16(code.number())
}

/// What a decision means for the call, as `policy test` expects it and a shadow version is compared
/// (SPEC 6.4 r4): allowed, allowed once a person approves it, or refused with a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Allowed once a person approves it: the capability's `approval`, or a flow rule's (SPEC 19).
    Approval,
    Refused(Code),
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Allow => f.write_str("allow"),
            Verdict::Approval => f.write_str("approval"),
            Verdict::Refused(code) => write!(f, "{} {}", code.number(), code.name()),
        }
    }
}

impl Verdict {
    /// `allow`, `approval` or the code's number: how the shadow summary names a decision.
    pub fn short(self) -> String {
        match self {
            Verdict::Refused(code) => code.number().to_string(),
            allowed => allowed.to_string(),
        }
    }
}

impl Decision {
    /// The verdict of this decision, made with `context`.
    pub fn verdict(&self, context: Option<&SecurityContext>) -> Verdict {
        match self {
            Decision::Allow {
                capability, flow, ..
            } => {
                let asks_approval = context
                    .and_then(|context| context.capabilities.get(*capability))
                    .is_some_and(|capability| capability.approval.is_some());
                if asks_approval || flow.is_some() {
                    Verdict::Approval
                } else {
                    Verdict::Allow
                }
            }
            Decision::Deny { code, .. } => Verdict::Refused(*code),
        }
    }

    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow { .. })
    }

    /// The SPEC code of a refusal; `None` for `Allow`.
    pub fn code(&self) -> Option<Code> {
        match self {
            Decision::Allow { .. } => None,
            Decision::Deny { code, .. } => Some(*code),
        }
    }

    pub fn rule(&self) -> &Rule {
        match self {
            Decision::Allow { rule, .. } | Decision::Deny { rule, .. } => rule,
        }
    }
}

fn deny(code: Code, rule: Rule, message: String) -> Decision {
    Decision::Deny {
        code,
        rule,
        message,
        flow: None,
    }
}

/// A call that a capability's argument check refused, with the code that the check gives.
fn refuse(rule: Rule, violation: &Violation) -> Decision {
    deny(Code::from(violation), rule, violation.to_string())
}

/// Decides a `tools/call` of `tool` with `arguments`. `ctx` is the one version of the context that
/// this decision uses (`None` when the session's context does not exist); `session_patterns` are
/// the session's `allowed_tool_patterns` (the caller passes `*` when the session named none; an
/// empty list allows nothing).
pub fn decide(
    ctx: Option<&SecurityContext>,
    session_patterns: &[Pattern],
    tool: &str,
    arguments: &Map<String, Value>,
) -> Decision {
    decide_in_session(ctx, session_patterns, tool, arguments, &[])
}

/// [`decide`] for a session that holds `held` labels (SPEC 19): the flow rules are read once the
/// capability is found, before its checks. `held` needs to be read only when
/// [`flows::needs_labels`] says so; otherwise the empty slice decides the same.
pub fn decide_in_session(
    ctx: Option<&SecurityContext>,
    session_patterns: &[Pattern],
    tool: &str,
    arguments: &Map<String, Value>,
    held: &[HeldLabel],
) -> Decision {
    // Patterns never match an invalid tool name, so such a name stops here, unquoted: only a valid
    // name is known to hold nothing but a name.
    if !session_patterns.iter().any(|pattern| pattern.matches(tool)) {
        let message = if is_valid_tool_name(tool) {
            format!("tool {tool:?} is not allowed for this session")
        } else {
            "the tool name is not a valid name".to_owned()
        };
        return deny(
            Code::ToolNotAllowed,
            Rule::without_position(RuleKind::SessionPatterns),
            message,
        );
    }
    let Some(ctx) = ctx else {
        return deny(
            Code::ToolNotAllowed,
            Rule::without_position(RuleKind::NoMatch),
            "the session's security context does not exist".to_owned(),
        );
    };
    if let Some((index, pattern)) = ctx
        .deny
        .iter()
        .enumerate()
        .find(|(_, pattern)| pattern.matches(tool))
    {
        return deny(
            Code::ToolDenied,
            Rule::at(RuleKind::DenyList, index, pattern),
            format!("tool {tool:?} is on the deny list ({pattern})"),
        );
    }
    // The first capability that matches owns the decision, even if a later one would allow.
    let Some((index, capability)) = ctx
        .capabilities
        .iter()
        .enumerate()
        .find(|(_, capability)| capability.pattern.matches(tool))
    else {
        return deny(
            Code::NoMatchingCapability,
            Rule::without_position(RuleKind::NoMatch),
            format!(
                "no capability of context {:?} matches tool {tool:?}",
                ctx.name()
            ),
        );
    };
    let rule = Rule::capability(index, capability);
    // SPEC 19: after the capability is found, before its checks. Nothing to do for almost every call.
    let flow = match flows::applies(ctx, index, held) {
        Some(flow) if flow.action == FlowAction::Deny => {
            return Decision::Deny {
                code: Code::FlowBlocked,
                rule: Rule {
                    kind: RuleKind::FlowRule,
                    index: Some(flow.index),
                    pattern: None,
                    id: None,
                },
                message: flows::blocked_message(&flow),
                flow: Some(flow),
            };
        }
        flow => flow,
    };
    if let Some(paths) = &capability.paths {
        if let Err(violation) = paths.check(arguments) {
            return refuse(rule, &violation);
        }
    }
    if let Some(commands) = &capability.commands {
        let words = match commands.check(arguments) {
            Ok(words) => words,
            Err(violation) => return refuse(rule, &violation),
        };
        // Paths inside an accepted command obey the same allowlist (SPEC 6.3 r2).
        if let Some(paths) = &capability.paths {
            if let Err(violation) = words.check_paths(paths) {
                return refuse(rule, &violation);
            }
        }
    }
    if let Some(domains) = &capability.domains {
        if let Err(violation) = domains.check(arguments) {
            return refuse(rule, &violation);
        }
    }
    Decision::Allow {
        capability: index,
        rule,
        flow,
    }
}

/// Whether some call of `tool` could be allowed, for `tools/list` filtering: session patterns, deny
/// list and capability patterns apply; argument checks cannot apply before a call.
pub fn could_allow(
    ctx: Option<&SecurityContext>,
    session_patterns: &[Pattern],
    tool: &str,
) -> bool {
    let Some(ctx) = ctx else { return false };
    session_patterns.iter().any(|pattern| pattern.matches(tool))
        && !ctx.deny.iter().any(|pattern| pattern.matches(tool))
        && ctx
            .capabilities
            .iter()
            .any(|capability| capability.pattern.matches(tool))
}

/// Whether the session could be allowed some tool of `upstream`, whatever its tools are called: a
/// `tools/list` tells it about an upstream left out only then, never about one it could not use.
pub fn could_allow_within(
    ctx: Option<&SecurityContext>,
    session_patterns: &[Pattern],
    upstream: &str,
) -> bool {
    let Some(ctx) = ctx else { return false };
    session_patterns
        .iter()
        .any(|pattern| pattern.could_match_within(upstream))
        && ctx
            .capabilities
            .iter()
            .any(|capability| capability.pattern.could_match_within(upstream))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::policy::load::parse_context_yaml;

    const CONTEXT: &str = "\
name: t
deny_list: [\"fs.delete\", \"secrets.*\"]
capabilities:
  - tool_pattern: \"fs.read_file\"
    path_allowlist: [\"/workspace\"]
  - tool_pattern: \"fs.*\"
    path_allowlist: [\"/\"]
  - tool_pattern: \"cmd.run\"
    path_allowlist: [\"/workspace\"]
    command_allowlist: [\"git\"]
  - tool_pattern: \"web.fetch\"
    domain_allowlist: [\"example.com\"]
  - tool_pattern: \"*\"
    path_allowlist: [\"/tmp\"]
";

    fn context() -> SecurityContext {
        match parse_context_yaml(CONTEXT, Path::new("t.yaml")) {
            Ok(context) => context,
            Err(error) => panic!("{error}"),
        }
    }

    fn patterns(texts: &[&str]) -> Vec<Pattern> {
        texts
            .iter()
            .filter_map(|text| Pattern::parse(text).ok())
            .collect()
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    fn outcome(decision: &Decision) -> (Option<u16>, RuleKind, Option<usize>) {
        (
            decision.code().map(Code::number),
            decision.rule().kind,
            decision.rule().index,
        )
    }

    #[test]
    fn session_patterns_come_before_everything() {
        let ctx = context();
        // fs.delete is on the deny list, but the session pattern refuses it first.
        let decision = decide(Some(&ctx), &patterns(&["web.*"]), "fs.delete", &Map::new());
        assert_eq!(
            outcome(&decision),
            (Some(2000), RuleKind::SessionPatterns, None)
        );
        // Even with no context at all.
        let decision = decide(None, &patterns(&["web.*"]), "fs.delete", &Map::new());
        assert_eq!(
            outcome(&decision),
            (Some(2000), RuleKind::SessionPatterns, None)
        );
        // An empty pattern list allows nothing.
        let decision = decide(Some(&ctx), &[], "web.fetch", &Map::new());
        assert_eq!(decision.code(), Some(Code::ToolNotAllowed));
    }

    #[test]
    fn missing_context_is_2000() {
        let decision = decide(None, &patterns(&["*"]), "fs.read_file", &Map::new());
        assert_eq!(outcome(&decision), (Some(2000), RuleKind::NoMatch, None));
    }

    #[test]
    fn deny_list_comes_before_capabilities() {
        let ctx = context();
        let decision = decide(Some(&ctx), &patterns(&["*"]), "secrets.get", &Map::new());
        assert_eq!(
            outcome(&decision),
            (Some(2001), RuleKind::DenyList, Some(1))
        );
        assert_eq!(decision.rule().pattern.as_deref(), Some("secrets.*"));
        // fs.delete would be allowed by capabilities[1] (`fs.*` under `/`), but the deny list wins.
        let decision = decide(
            Some(&ctx),
            &patterns(&["*"]),
            "fs.delete",
            &args(serde_json::json!({"path": "/workspace/a"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2001), RuleKind::DenyList, Some(0))
        );
    }

    #[test]
    fn first_matching_capability_owns_the_decision() {
        let ctx = context();
        let all = patterns(&["*"]);
        // capabilities[1] (`fs.*` under `/`) would allow /etc/passwd, but capabilities[0] matches first.
        let decision = decide(
            Some(&ctx),
            &all,
            "fs.read_file",
            &args(serde_json::json!({"path": "/etc/passwd"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2002), RuleKind::Capability, Some(0))
        );
        assert_eq!(decision.rule().pattern.as_deref(), Some("fs.read_file"));
        let decision = decide(
            Some(&ctx),
            &all,
            "fs.read_file",
            &args(serde_json::json!({"path": "/workspace/a.txt"})),
        );
        assert_eq!(
            decision,
            Decision::Allow {
                capability: 0,
                rule: Rule {
                    kind: RuleKind::Capability,
                    index: Some(0),
                    pattern: Some("fs.read_file".into()),
                    id: None,
                },
                flow: None,
            }
        );
        let decision = decide(
            Some(&ctx),
            &all,
            "fs.write_file",
            &args(serde_json::json!({"path": "/etc/passwd"})),
        );
        assert_eq!(outcome(&decision), (None, RuleKind::Capability, Some(1)));
    }

    #[test]
    fn checks_run_paths_then_commands_then_domains() {
        let ctx = context();
        let all = patterns(&["*"]);
        // Both the path and the command are wrong: the path check reports first.
        let decision = decide(
            Some(&ctx),
            &all,
            "cmd.run",
            &args(serde_json::json!({"cwd": "/etc", "command": "rm -rf /"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2002), RuleKind::Capability, Some(2))
        );
        let decision = decide(
            Some(&ctx),
            &all,
            "cmd.run",
            &args(serde_json::json!({"cwd": "/workspace", "command": "rm -rf /"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2003), RuleKind::Capability, Some(2))
        );
        let decision = decide(
            Some(&ctx),
            &all,
            "cmd.run",
            &args(serde_json::json!({"cwd": "/workspace", "command": "git status"})),
        );
        assert!(decision.is_allow());
        // A command that passes its own check still has its paths checked (SPEC 6.3 r2).
        let decision = decide(
            Some(&ctx),
            &all,
            "cmd.run",
            &args(serde_json::json!({"cwd": "/workspace", "command": "git diff --output=/etc/x"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2002), RuleKind::Capability, Some(2))
        );
        let decision = decide(
            Some(&ctx),
            &all,
            "cmd.run",
            &args(serde_json::json!({"command": "git diff --output=out/x /workspace/a"})),
        );
        assert!(decision.is_allow());
        let decision = decide(
            Some(&ctx),
            &all,
            "web.fetch",
            &args(serde_json::json!({"url": "https://evil.test/"})),
        );
        assert_eq!(
            outcome(&decision),
            (Some(2004), RuleKind::Capability, Some(3))
        );
        let decision = decide(
            Some(&ctx),
            &all,
            "web.fetch",
            &args(serde_json::json!({"url": "https://example.com/a"})),
        );
        assert!(decision.is_allow());
    }

    #[test]
    fn no_matching_capability_is_2006() {
        let ctx = match parse_context_yaml(
            "name: n\ncapabilities: [{tool_pattern: \"fs.*\"}]\n",
            Path::new("n.yaml"),
        ) {
            Ok(ctx) => ctx,
            Err(error) => panic!("{error}"),
        };
        let decision = decide(Some(&ctx), &patterns(&["*"]), "fsx.read", &Map::new());
        assert_eq!(outcome(&decision), (Some(2006), RuleKind::NoMatch, None));
        let decision = decide(Some(&ctx), &patterns(&["*"]), "fs", &Map::new());
        assert_eq!(decision.code(), Some(Code::NoMatchingCapability));
    }

    #[test]
    fn messages_never_quote_argument_values() {
        let ctx = context();
        let all = patterns(&["*"]);
        let calls = [
            (
                "fs.read_file",
                serde_json::json!({"path": "/secret/MARKER"}),
            ),
            (
                "cmd.run",
                serde_json::json!({"command": "git /secret/MARKER"}),
            ),
            ("cmd.run", serde_json::json!({"command": "MARKER status"})),
            ("cmd.run", serde_json::json!({"command": "git MARKER;"})),
            (
                "web.fetch",
                serde_json::json!({"url": "https://u:MARKER@x.test/?k=MARKER"}),
            ),
            ("any.tool", serde_json::json!({"path": "/secret/MARKER"})),
        ];
        for (tool, call) in calls {
            match decide(Some(&ctx), &all, tool, &args(call.clone())) {
                Decision::Deny { message, .. } => {
                    assert!(!message.contains("MARKER"), "{call}: {message}");
                    assert!(message.starts_with("argument \""), "{call}: {message}");
                }
                allowed => panic!("{call} allowed: {allowed:?}"),
            }
        }
        // An invalid tool name is not quoted either; a valid one may be.
        let decision = decide(Some(&ctx), &patterns(&["web.*"]), "x MARKER", &Map::new());
        assert!(matches!(decision, Decision::Deny { message, .. } if !message.contains("MARKER")));
        let decision = decide(
            Some(&ctx),
            &patterns(&["web.*"]),
            "fs.read_file",
            &Map::new(),
        );
        assert!(
            matches!(decision, Decision::Deny { message, .. } if message.contains("\"fs.read_file\""))
        );
    }

    #[test]
    fn invalid_tool_names_are_refused() {
        let ctx = context();
        for tool in ["", "fs.", "fs..read_file", "fs read", "*"] {
            let decision = decide(Some(&ctx), &patterns(&["*"]), tool, &Map::new());
            assert_eq!(decision.code(), Some(Code::ToolNotAllowed), "{tool:?}");
            assert!(!could_allow(Some(&ctx), &patterns(&["*"]), tool));
        }
    }

    #[test]
    fn could_allow_applies_patterns_only() {
        let ctx = context();
        let all = patterns(&["*"]);
        assert!(could_allow(Some(&ctx), &all, "fs.read_file"));
        assert!(could_allow(Some(&ctx), &all, "anything.else"));
        assert!(!could_allow(Some(&ctx), &all, "fs.delete"));
        assert!(!could_allow(
            Some(&ctx),
            &patterns(&["web.*"]),
            "fs.read_file"
        ));
        assert!(!could_allow(None, &all, "fs.read_file"));
        let narrow = match parse_context_yaml(
            "name: n\ncapabilities: [{tool_pattern: \"fs.*\"}]\n",
            Path::new("n.yaml"),
        ) {
            Ok(ctx) => ctx,
            Err(error) => panic!("{error}"),
        };
        assert!(!could_allow(Some(&narrow), &all, "web.fetch"));
    }

    #[test]
    fn flow_rules_come_after_the_deny_list_and_before_the_capabilitys_checks() {
        let ctx = match parse_context_yaml(
            "name: f\ndeny_list: [\"mail.bulk\"]\ncapabilities:\n\
             - { tool_pattern: \"mail.*\", domain_allowlist: [\"example.com\"], labels: [out] }\n\
             flow_rules:\n  - { if_session_has: [web], block: [out], action: deny }\n",
            Path::new("f.yaml"),
        ) {
            Ok(ctx) => ctx,
            Err(error) => panic!("{error}"),
        };
        let all = patterns(&["*"]);
        let held = [HeldLabel::assumed("web")];
        let bad_url = args(serde_json::json!({"url": "https://evil.test/"}));
        // The flow rule answers before the domain check would.
        let decision = decide_in_session(Some(&ctx), &all, "mail.send", &bad_url, &held);
        assert_eq!(
            outcome(&decision),
            (Some(2010), RuleKind::FlowRule, Some(0))
        );
        // The deny list still comes first, and without the label the capability's checks decide.
        let decision = decide_in_session(Some(&ctx), &all, "mail.bulk", &bad_url, &held);
        assert_eq!(decision.code(), Some(Code::ToolDenied));
        let decision = decide_in_session(Some(&ctx), &all, "mail.send", &bad_url, &[]);
        assert_eq!(decision.code(), Some(Code::DomainNotAllowed));
        // `decide` is the session that holds nothing.
        assert_eq!(decide(Some(&ctx), &all, "mail.send", &bad_url), decision);
    }

    #[test]
    fn decision_serialises_for_audit_and_explain() {
        let ctx = context();
        let decision = decide(Some(&ctx), &patterns(&["*"]), "secrets.get", &Map::new());
        let json = serde_json::to_value(&decision).ok();
        assert_eq!(
            json.as_ref()
                .map(|j| (&j["decision"], &j["code"], &j["rule"])),
            Some((
                &serde_json::json!("deny"),
                &serde_json::json!(2001),
                &serde_json::json!({"kind": "deny_list", "index": 1, "pattern": "secrets.*"})
            ))
        );
    }
}
