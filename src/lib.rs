//! sealgate: a security gateway for AI agent tool calls (see README.md and SPEC.md).

/// `println!` that ignores a closed stdout (`sealgate demo | head`, `sealgate policy explain … | head -1`):
/// a reader that stops early must never turn a command's output into a panic.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

pub mod api;
pub mod approval;
pub mod audit;
pub mod bench;
pub mod claim;
pub mod clock;
pub mod config;
pub mod config_check;
pub mod connect;
pub mod demo;
pub mod envelope;
pub mod error;
pub mod evidence;
pub mod files;
pub mod fuzzing;
pub mod gateway;
pub mod guard;
pub mod identity;
pub mod logging;
pub mod mcp_reply;
pub mod mcp_server;
pub mod otel;
pub mod outbound;
pub mod pipeline;
pub mod policy;
pub mod recovery;
pub mod redact;
pub mod replay;
pub mod retention;
pub mod serve;
pub mod session;
pub mod shadow;
pub mod store;
pub mod strict_json;
pub mod telemetry;
pub mod tls;
pub mod token;
pub mod tool_meta;
pub mod tools;
pub mod trace;
pub mod upstream;
pub mod window;
