//! Fuzz target: `decide` on a fixed context with an arbitrary tool name and arbitrary arguments
//! must never panic.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sealgate::policy::{decide, parse_context_yaml, Pattern, SecurityContext};
use serde_json::{Map, Value};

const CONTEXT: &str = r#"
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

/// Argument keys that the checks read, so the fuzzer reaches them often.
const KEYS: &[&str] = &[
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
];

fn context() -> &'static SecurityContext {
    static CONTEXT_CELL: OnceLock<SecurityContext> = OnceLock::new();
    // A context that does not load is a broken harness, not a finding: stop loudly.
    CONTEXT_CELL.get_or_init(
        || match parse_context_yaml(CONTEXT, Path::new("fuzz.yaml")) {
            Ok(context) => context,
            Err(error) => panic!("fuzz context does not load: {error}"),
        },
    )
}

/// Builds arguments from bytes: JSON when the bytes are a JSON object, else values cut from the
/// bytes under the keys that the checks read.
fn arguments(bytes: &[u8]) -> Map<String, Value> {
    if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) {
        return map;
    }
    let mut map = Map::new();
    for (index, chunk) in bytes.split(|b| *b == 0xff).enumerate() {
        let Some((selector, rest)) = chunk.split_first() else {
            continue;
        };
        let key = KEYS[usize::from(*selector) % KEYS.len()];
        let text = String::from_utf8_lossy(rest).into_owned();
        let value = match index % 4 {
            0 => Value::String(text),
            1 => Value::Array(
                text.split(' ')
                    .map(|s| Value::String(s.to_owned()))
                    .collect(),
            ),
            2 => Value::from(u64::from(*selector)),
            _ => Value::Array(vec![Value::String(text), Value::Null]),
        };
        map.insert(key.to_owned(), value);
    }
    map
}

fuzz_target!(|data: &[u8]| {
    let (tool, rest) = match data.iter().position(|b| *b == 0) {
        Some(cut) => (&data[..cut], &data[cut + 1..]),
        None => (data, &[][..]),
    };
    let tool = String::from_utf8_lossy(tool);
    let patterns: Vec<Pattern> = ["*", "fs.*"]
        .iter()
        .filter_map(|p| Pattern::parse(p).ok())
        .collect();
    let args = arguments(rest);
    let _ = decide(Some(context()), &patterns, &tool, &args);
    let _ = decide(None, &patterns, &tool, &args);
    let _ = Pattern::parse(&tool);
});
