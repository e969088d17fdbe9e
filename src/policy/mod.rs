//! Security contexts and the policy decision (SPEC 6): the file model and its validation, loading
//! and hot reload, tool patterns, the path/command/domain argument checks, and `decide()`, which
//! returns a decision together with the rule that made it. Knows nothing about the store or HTTP.

pub mod arguments;
pub mod cases;
pub mod cli;
pub mod commands;
pub mod decide;
pub mod domains;
pub mod error;
pub mod explain;
pub mod flows;
pub mod limits;
pub mod load;
pub mod model;
pub mod paths;
pub mod pattern;
pub mod rate;
pub mod registry;

pub use decide::{
    could_allow, could_allow_within, decide, decide_in_session, Decision, Rule, RuleKind, Verdict,
};
pub use error::{RuleError, Violation};
pub use flows::{FlowMatch, HeldLabel};
pub use load::{load_dir, parse_context_json, parse_context_yaml, PolicyError};
pub use model::{
    ApprovalRule, Capability, CapabilitySpec, ClaimMode, ContextSource, FlowAction, RateLimit,
    SecurityContext, SecurityContextSpec,
};
pub use pattern::{is_valid_tool_name, Pattern};
pub use registry::{ContextRegistry, RegistryError, ReloadEvent, Snapshot, WatcherHandle};

/// Helpers shared by the policy module's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    pub fn write(dir: &Path, name: &str, text: &str) {
        if let Err(error) = std::fs::write(dir.join(name), text) {
            panic!("cannot write {name}: {error}");
        }
    }

    pub fn temp_dir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(error) => panic!("no temp dir: {error}"),
        }
    }
}
