//! `sealgate policy check [DIR]` and `sealgate policy explain`: the operator's offline view of the same
//! loading and decision code the gateway runs.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Map, Value};

use super::{decide, load_dir, Decision, Pattern, SecurityContext};

pub enum PolicyCommand {
    Check {
        dir: PathBuf,
    },
    Explain {
        context: String,
        tool: String,
        args: String,
        policies: PathBuf,
    },
}

/// The decision a call would get, with its code and the rule that decided (shared with the API).
pub fn explain(context: &SecurityContext, tool: &str, arguments: &Map<String, Value>) -> Value {
    let any = [Pattern::parse("*").expect("`*` is a valid pattern")];
    let mut answer = match decide(Some(context), &any, tool, arguments) {
        Decision::Allow { capability, rule } => {
            let mut allow = json!({"decision": "allow", "rule": rule, "capability": capability});
            // Allowed, but only with a person's grant: the call itself gets 4003 until then (SPEC 13).
            if let Some(rule) = context.capabilities[capability].approval {
                allow["approval"] = json!({"required": true, "expires_secs": rule.expires_secs,
                    "approvers": rule.approvers,
                    "separate_from_registrant": rule.separate_from_registrant});
            }
            allow
        }
        Decision::Deny {
            code,
            rule,
            message,
        } => json!({
            "decision": "deny", "code": code.number(), "name": code.name(),
            "message": message, "rule": rule,
        }),
    };
    answer["context"] = json!(context.spec.name);
    answer["context_version"] = json!(context.version);
    answer
}

pub fn run(command: PolicyCommand) -> ExitCode {
    match command {
        PolicyCommand::Check { dir } => match load_dir(&dir) {
            Ok(contexts) => {
                for context in &contexts {
                    say!("ok  {}  (version {})", context.spec.name, context.version);
                }
                say!(
                    "{} security context(s) valid in {}",
                    contexts.len(),
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("invalid: {e}");
                ExitCode::FAILURE
            }
        },
        PolicyCommand::Explain {
            context,
            tool,
            args,
            policies,
        } => {
            // Read as the gateway reads a payload: a duplicate key is refused, not resolved.
            let arguments: Map<String, Value> =
                match crate::strict_json::parse_strict_json(args.as_bytes()) {
                    Ok(Value::Object(map)) => map,
                    Ok(_) => {
                        eprintln!("--args must be a JSON object");
                        return ExitCode::FAILURE;
                    }
                    Err(e) => {
                        eprintln!("--args: {e}");
                        return ExitCode::FAILURE;
                    }
                };
            // A call whose argument names are equal under case folding never reaches the policy (1000).
            if let Err(e) = crate::strict_json::refuse_case_folded_names(&arguments) {
                eprintln!("--args: {e}");
                return ExitCode::FAILURE;
            }
            if let Err(e) = crate::envelope::ToolName::parse(&tool) {
                eprintln!("--tool: {e}");
                return ExitCode::FAILURE;
            }
            let contexts = match load_dir(&policies) {
                Ok(contexts) => contexts,
                Err(e) => {
                    eprintln!("invalid: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let Some(found) = contexts.iter().find(|c| c.spec.name == context) else {
                eprintln!("no security context {context:?} in {}", policies.display());
                return ExitCode::FAILURE;
            };
            let answer = explain(found, &tool, &arguments);
            let rule = &answer["rule"];
            let rule_text = format!(
                "{} #{} {}",
                rule["kind"].as_str().unwrap_or("?"),
                rule["index"],
                rule["pattern"].as_str().unwrap_or("-")
            );
            match answer["decision"].as_str() {
                Some("allow") => say!("allow  rule: {rule_text}"),
                _ => say!(
                    "deny  code: {} {}  rule: {rule_text}\n{}",
                    answer["code"],
                    answer["name"].as_str().unwrap_or("?"),
                    answer["message"].as_str().unwrap_or("")
                ),
            }
            say!("{answer}");
            ExitCode::SUCCESS
        }
    }
}
