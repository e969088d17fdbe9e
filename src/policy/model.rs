//! The security-context model of SPEC 6.1: the file schema (`SecurityContextSpec`, what operators
//! write and what the API returns) and its compiled, validated form (`SecurityContext`, what
//! `decide` reads).
//!
//! Validation fails closed: unknown keys, bad patterns, explicit `null`s and empty allowlists are
//! errors that name the field. A context with an empty `capabilities` list is valid (it allows
//! nothing, which is a legitimate choice); an empty allowlist *inside* a capability is not, because
//! it reads as "no restriction" or "nothing" depending on who reads it.

use std::collections::BTreeMap;
use std::fmt;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::commands::CommandRule;
use super::domains::DomainRule;
use super::error::RuleError;
use super::paths::PathRule;
use super::pattern::Pattern;
use crate::identity::{is_team_name, DEFAULT_TEAM, MAX_TEAM_NAME_BYTES};

pub use super::limits::{MAX_CAPABILITY_ID_BYTES, MAX_CONTEXT_NAME_BYTES};

/// One security context as written in a policy file (and as returned by the API).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(
    title = "sealgate security context",
    description = "One security context per file in the policies folder (SPEC 6.1)."
)]
pub struct SecurityContextSpec {
    /// Unique name; sessions refer to it. Letters, digits, '_', '-', '.', starting with a letter or digit.
    #[schemars(
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    )]
    pub name: String,
    /// Free text for reviewers.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "String")]
    pub description: Option<String>,
    /// The team that the context, and every session registered on it, belongs to (SPEC 16): letters,
    /// digits, '-', '_'. `default` when absent.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(
        with = "String",
        length(min = 1, max = 128),
        regex(pattern = r"^[A-Za-z0-9_-]+$")
    )]
    pub team: Option<String>,
    /// Tool patterns that are always refused (code 2001), checked before any capability.
    #[serde(default)]
    #[schemars(inner(regex(
        pattern = r"^((\*?[A-Za-z0-9_-])+\*?|\*)(\.((\*?[A-Za-z0-9_-])+\*?|\*))*$"
    )))]
    pub deny_list: Vec<String>,
    /// What the context allows; the first capability whose pattern matches decides. May be empty.
    pub capabilities: Vec<CapabilitySpec>,
    /// Session flow rules (SPEC 19), read in order once a call's capability is found: the first whose
    /// `if_session_has` the session all holds and whose `block` names one of the capability's labels
    /// applies. Left out when empty, so that a context written before them keeps its version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flow_rules: Vec<FlowRuleSpec>,
}

/// One flow rule (SPEC 19): once a session holds every label of `if_session_has`, a call whose
/// capability gives a label of `block` is refused (`deny`, 2010) or waits for a person (`approval`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FlowRuleSpec {
    /// Labels the session must all hold for the rule to apply (at least one).
    #[schemars(length(min = 1), inner(regex(pattern = r"^[A-Za-z0-9_-]+$")))]
    pub if_session_has: Vec<String>,
    /// Capability labels that the rule holds back (at least one).
    #[schemars(length(min = 1), inner(regex(pattern = r"^[A-Za-z0-9_-]+$")))]
    pub block: Vec<String>,
    /// `deny` (2010 FLOW_BLOCKED) or `approval` (the call waits for a person's grant, SPEC 13).
    pub action: FlowAction,
}

/// What a flow rule does to the call it applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FlowAction {
    Deny,
    Approval,
}

impl FlowAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowAction::Deny => "deny",
            FlowAction::Approval => "approval",
        }
    }
}

/// One capability: a tool pattern plus the checks that apply to the calls it matches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CapabilitySpec {
    /// Names the capability (letters, digits, '_', '-'; unique in the context), so that its rate window
    /// stays its own whatever is edited around it; without one, its `tool_pattern` names it. Capabilities
    /// that share a pattern need an id each.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(
        with = "String",
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9_-]+$")
    )]
    pub id: Option<String>,
    /// An exact tool name, or one with `*` anywhere (`*`, `fs.*`, `fs.read*`, `*.delete`); a pattern ending
    /// in `.*` wants at least one character after the dot.
    #[schemars(regex(pattern = r"^((\*?[A-Za-z0-9_-])+\*?|\*)(\.((\*?[A-Za-z0-9_-])+\*?|\*))*$"))]
    pub tool_pattern: String,
    /// Directories that path arguments must lie at or below (absolute).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub path_allowlist: Option<Vec<String>>,
    /// Argument keys that hold paths (default: path, paths, source, destination, file, directory, cwd).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub path_arguments: Option<Vec<String>>,
    /// Base commands that the `command` argument may start with.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub command_allowlist: Option<Vec<String>>,
    /// Per base command, the subcommands allowed.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "BTreeMap<String, Vec<String>>", length(min = 1))]
    pub subcommand_allowlist: Option<BTreeMap<String, Vec<String>>>,
    /// Per base command, or `"command subcommand"` (e.g. `"git log"`), the only options allowed there
    /// (SPEC 6.3 r4); the most specific entry applies. An empty list allows no option.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "BTreeMap<String, Vec<String>>", length(min = 1))]
    pub option_allowlist: Option<BTreeMap<String, Vec<String>>>,
    /// Hosts that `url`/`uri`/`urls` arguments may name (`*.example.com` for subdomains).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub domain_allowlist: Option<Vec<String>>,
    /// At most `calls` allowed calls per `per_seconds`, per session.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "RateLimit")]
    pub rate_limit: Option<RateLimit>,
    /// Largest tool answer passed on, in bytes; larger answers get 2007.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "NonZeroU64")]
    pub max_response_size: Option<NonZeroU64>,
    /// Whether allowed calls take an exactly-once claim (SPEC 7.1).
    #[serde(default)]
    pub claim: ClaimMode,
    /// Holds allowed calls until a person approves them (SPEC 13).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "ApprovalSpec")]
    pub approval: Option<ApprovalSpec>,
    /// Labels a session gains when a call this capability allowed completes (SPEC 19): letters, digits,
    /// '_', '-'. Left out when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9_-]+$"), length(min = 1, max = 64)))]
    pub labels: Vec<String>,
    /// The answer guard for the calls it allows (SPEC 18): what it sets wins over the gateway's.
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "crate::guard::AnswerGuardSpec")]
    pub answer_guard: Option<crate::guard::AnswerGuardSpec>,
}

/// `approval: {required, expires_secs, approvers, separate_from_registrant}` (SPEC 13, 13 r4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalSpec {
    /// True: every call this capability allows waits for a person's grant.
    pub required: bool,
    /// How long a request waits for a decision, and how long a decision stays in force (900 by default).
    #[serde(default = "default_approval_secs")]
    #[schemars(range(max = 31_536_000))]
    pub expires_secs: NonZeroU64,
    /// How many distinct people must grant a call (1 by default, at most 10).
    // Left out when 1, so that a context written before r4 keeps its version.
    #[serde(default = "one_approver", skip_serializing_if = "is_one_approver")]
    #[schemars(range(max = 10))]
    pub approvers: NonZeroU32,
    /// Whether the person who registered the session may not decide its calls' approvals (true by
    /// default when `approvers` is 2 or more, else false).
    #[serde(
        default,
        deserialize_with = "present_not_null",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "bool")]
    pub separate_from_registrant: Option<bool>,
}

/// Longest `approval.expires_secs`: a year. A longer wait is a mistake, not a policy.
const MAX_APPROVAL_SECS: u64 = 31_536_000;

/// Most `approval.approvers`: more people than this is a committee, not an approval, and a request
/// that can never gather its grants only waits to expire.
pub const MAX_APPROVERS: u32 = 10;

fn default_approval_secs() -> NonZeroU64 {
    NonZeroU64::new(900).unwrap_or(NonZeroU64::MIN)
}

fn one_approver() -> NonZeroU32 {
    NonZeroU32::MIN
}

fn is_one_approver(approvers: &NonZeroU32) -> bool {
    approvers.get() == 1
}

/// What a capability that requires approval asks (SPEC 13, 13 r4), with its defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApprovalRule {
    pub expires_secs: u64,
    /// Distinct people whose grants make the request granted.
    pub approvers: u32,
    /// The session's registrant may not decide.
    pub separate_from_registrant: bool,
}

/// `rate_limit: {calls, per_seconds}`; both at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub calls: NonZeroU32,
    pub per_seconds: NonZeroU32,
}

/// SPEC 7.1: when a claim is taken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimMode {
    /// With the caller's idempotency key, or else one derived from the call: an identical call later
    /// in the same execution is a SKIP. Must be chosen (SPEC 7.1 r3).
    Auto,
    /// Only when the caller gives an idempotency key. The default (SPEC 7.1 r3): `auto` by default
    /// silently skipped reads and writes that an agent repeated on purpose.
    #[default]
    Explicit,
    /// Never.
    Off,
}

impl ClaimMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimMode::Auto => "auto",
            ClaimMode::Explicit => "explicit",
            ClaimMode::Off => "off",
        }
    }
}

impl<'de> Deserialize<'de> for ClaimMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ClaimVisitor;
        const EXPECTED: &str = "one of auto, explicit, off";

        impl serde::de::Visitor<'_> for ClaimVisitor {
            type Value = ClaimMode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(EXPECTED)
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ClaimMode, E> {
                match text {
                    "auto" => Ok(ClaimMode::Auto),
                    "explicit" => Ok(ClaimMode::Explicit),
                    "off" => Ok(ClaimMode::Off),
                    _ => Err(E::invalid_value(
                        serde::de::Unexpected::Str(text),
                        &EXPECTED,
                    )),
                }
            }

            // YAML 1.1 readers turn a bare `off` into false (SPEC 6.1); true has no meaning.
            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<ClaimMode, E> {
                if value {
                    Err(E::invalid_value(
                        serde::de::Unexpected::Bool(true),
                        &EXPECTED,
                    ))
                } else {
                    Ok(ClaimMode::Off)
                }
            }
        }

        deserializer.deserialize_any(ClaimVisitor)
    }
}

impl JsonSchema for ClaimMode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ClaimMode".into()
    }

    fn json_schema(_generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "explicit (default: a claim only for a call with an idempotency key), auto or off; the boolean false (a YAML 1.1 reading of a bare off) means off",
            "oneOf": [
                { "type": "string", "enum": ["explicit", "auto", "off"] },
                { "const": false }
            ]
        })
    }
}

/// A key that is written must carry a value: `path_allowlist:` with nothing after it is a
/// mistake, not "no restriction".
fn present_not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// Where a compiled context came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContextSource {
    /// A policy file (read-only through the API).
    File(PathBuf),
    /// The store (managed through the API).
    Store,
}

impl Serialize for ContextSource {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        match self {
            ContextSource::File(path) => {
                map.serialize_entry("kind", "file")?;
                map.serialize_entry("path", &path.to_string_lossy())?;
            }
            ContextSource::Store => map.serialize_entry("kind", "store")?,
        }
        map.end()
    }
}

/// One step of a field path such as `capabilities[1].path_allowlist`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldSegment {
    Key(String),
    Index(usize),
}

/// Where in a context document a problem lies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(pub Vec<FieldSegment>);

impl FieldPath {
    pub fn root() -> FieldPath {
        FieldPath(Vec::new())
    }

    pub fn key(mut self, key: &str) -> FieldPath {
        self.0.push(FieldSegment::Key(key.to_owned()));
        self
    }

    pub fn index(mut self, index: usize) -> FieldPath {
        self.0.push(FieldSegment::Index(index));
        self
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (position, segment) in self.0.iter().enumerate() {
            match segment {
                FieldSegment::Index(index) => write!(f, "[{index}]")?,
                FieldSegment::Key(key) if position == 0 => f.write_str(key)?,
                FieldSegment::Key(key) => write!(f, ".{key}")?,
            }
        }
        Ok(())
    }
}

/// A valid document that breaks a rule, with the field that breaks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub path: FieldPath,
    pub message: String,
}

fn spec_error(path: FieldPath, message: impl fmt::Display) -> SpecError {
    SpecError {
        path,
        message: message.to_string(),
    }
}

/// A compiled capability: the parsed pattern and the argument checks, ready for `decide`.
pub struct Capability {
    pub id: Option<String>,
    pub pattern: Pattern,
    pub paths: Option<PathRule>,
    pub commands: Option<CommandRule>,
    pub domains: Option<DomainRule>,
    pub rate_limit: Option<RateLimit>,
    pub max_response_size: Option<u64>,
    pub claim: ClaimMode,
    /// What a person's approval takes when the capability requires one (SPEC 13), else None.
    pub approval: Option<ApprovalRule>,
    /// What a completed call gives its session (SPEC 19), without repeats.
    pub labels: Vec<String>,
    /// The context's flow rules whose `block` names one of `labels`, in order: empty for almost every
    /// capability, which then costs a call nothing (no label read).
    pub flow_rules: Vec<usize>,
    /// Its `answer_guard`, compiled (SPEC 18); None: the gateway's.
    pub answer_guard: Option<crate::guard::Overrides>,
}

impl Capability {
    /// What the capability's rate window belongs to (SPEC 20 rule 4): its id, else its pattern, neither
    /// of which moves when other capabilities are edited, inserted or reordered.
    pub fn identity(&self) -> String {
        identity(self.id.as_deref(), self.pattern.as_str())
    }
}

/// [`Capability::identity`] from its parts, as an audit event's `rule` records them.
pub fn identity(id: Option<&str>, pattern: &str) -> String {
    match id {
        Some(id) => format!("id:{id}"),
        None => format!("pattern:{pattern}"),
    }
}

impl fmt::Debug for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Capability")
            .field("id", &self.id)
            .field("pattern", &self.pattern.as_str())
            .field("paths", &self.paths.is_some())
            .field("commands", &self.commands.is_some())
            .field("domains", &self.domains.is_some())
            .field("rate_limit", &self.rate_limit)
            .field("max_response_size", &self.max_response_size)
            .field("claim", &self.claim)
            .field("approval", &self.approval)
            .field("labels", &self.labels)
            .field("flow_rules", &self.flow_rules)
            .field("answer_guard", &self.answer_guard)
            .finish()
    }
}

/// A validated security context. Immutable once built: a change builds a new one.
pub struct SecurityContext {
    pub spec: SecurityContextSpec,
    pub deny: Vec<Pattern>,
    pub capabilities: Vec<Capability>,
    /// The flow rules (SPEC 19), in order; `spec.flow_rules` compiled.
    pub flows: Vec<FlowRule>,
    /// hex(SHA-256(JCS(spec as JSON))): equal specs have equal versions, however the file is laid out.
    pub version: String,
    pub source: ContextSource,
}

impl fmt::Debug for SecurityContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecurityContext")
            .field("name", &self.spec.name)
            .field("version", &self.version)
            .field("source", &self.source)
            .field("capabilities", &self.capabilities)
            .finish()
    }
}

impl SecurityContext {
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Validates `spec` and builds its checks. Errors name the offending field.
    pub fn compile(
        mut spec: SecurityContextSpec,
        source: ContextSource,
    ) -> Result<SecurityContext, SpecError> {
        validate_context_name(&spec.name)
            .map_err(|message| spec_error(FieldPath::root().key("name"), message))?;
        if let Some(team) = &spec.team {
            if !is_team_name(team) {
                return Err(spec_error(
                    FieldPath::root().key("team"),
                    format!(
                        "invalid team name {team:?}: 1 to {MAX_TEAM_NAME_BYTES} letters, digits, '-' and '_'"
                    ),
                ));
            }
        }
        // `team: default` says what an absent team says: one spec, one version.
        if spec.team.as_deref() == Some(DEFAULT_TEAM) {
            spec.team = None;
        }

        let mut deny = Vec::with_capacity(spec.deny_list.len());
        for (index, text) in spec.deny_list.iter().enumerate() {
            let pattern = Pattern::parse(text).map_err(|message| {
                spec_error(FieldPath::root().key("deny_list").index(index), message)
            })?;
            deny.push(pattern);
        }

        let mut capabilities = Vec::with_capacity(spec.capabilities.len());
        for (index, capability) in spec.capabilities.iter().enumerate() {
            let at = FieldPath::root().key("capabilities").index(index);
            capabilities.push(compile_capability(capability, &at)?);
        }
        require_distinct_identities(&spec.capabilities)?;
        let flows = compile_flow_rules(&spec.flow_rules)?;
        for capability in &mut capabilities {
            capability.flow_rules = flows
                .iter()
                .enumerate()
                .filter(|(_, rule)| rule.block.iter().any(|l| capability.labels.contains(l)))
                .map(|(index, _)| index)
                .collect();
        }

        let as_json = serde_json::to_value(&spec).map_err(|error| {
            spec_error(
                FieldPath::root(),
                format!("cannot canonicalise the context: {error}"),
            )
        })?;
        let version = crate::envelope::jcs_sha256_hex(&as_json);

        Ok(SecurityContext {
            spec,
            deny,
            capabilities,
            flows,
            version,
            source,
        })
    }

    /// What `policy check` warns about (SPEC 19): a flow rule naming a label that no capability gives,
    /// which can never be held (`if_session_has`) or never be blocked (`block`).
    pub fn flow_warnings(&self) -> Vec<String> {
        let given = |label: &String| {
            self.capabilities
                .iter()
                .any(|capability| capability.labels.contains(label))
        };
        let mut warnings = Vec::new();
        for (index, rule) in self.flows.iter().enumerate() {
            for (key, labels) in [
                ("if_session_has", &rule.if_session_has),
                ("block", &rule.block),
            ] {
                for label in labels.iter().filter(|label| !given(label)) {
                    warnings.push(format!(
                        "flow_rules[{index}].{key}: no capability gives the label {label:?}, so this rule never applies"
                    ));
                }
            }
        }
        warnings
    }

    /// The team the context belongs to (SPEC 16).
    pub fn team(&self) -> &str {
        self.spec.team.as_deref().unwrap_or(DEFAULT_TEAM)
    }

    /// The API view (SPEC 6.4): the spec in the file schema plus `version` and `source`, and its
    /// `team` even when the file names none.
    pub fn api_view(&self) -> serde_json::Value {
        let mut view = match serde_json::to_value(&self.spec) {
            Ok(serde_json::Value::Object(map)) => map,
            // The spec is plain data: it always serialises to an object.
            _ => serde_json::Map::new(),
        };
        view.insert("team".into(), serde_json::Value::from(self.team()));
        view.insert(
            "version".into(),
            serde_json::Value::String(self.version.clone()),
        );
        if let Ok(source) = serde_json::to_value(&self.source) {
            view.insert("source".into(), source);
        }
        serde_json::Value::Object(view)
    }
}

/// Context names travel in URLs and tokens (`scp`), so they keep to a small URL-safe alphabet.
fn validate_context_name(name: &str) -> Result<(), RuleError> {
    if name.is_empty() || name.len() > MAX_CONTEXT_NAME_BYTES {
        return Err(RuleError::ContextNameLength);
    }
    let first_ok = name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric());
    let rest_ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(RuleError::ContextName(name.to_owned()))
    }
}

/// A capability id is a short name of letters, digits, '_' and '-'.
fn validate_capability_id(id: &str) -> Result<(), RuleError> {
    let valid = !id.is_empty()
        && id.len() <= MAX_CAPABILITY_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(RuleError::CapabilityId(id.to_owned()))
    }
}

/// Each capability names one rate window (SPEC 20 rule 4): ids are unique, and capabilities that share
/// a pattern have an id each.
fn require_distinct_identities(capabilities: &[CapabilitySpec]) -> Result<(), SpecError> {
    for (index, capability) in capabilities.iter().enumerate() {
        let at = FieldPath::root().key("capabilities").index(index);
        for (earlier, other) in capabilities[..index].iter().enumerate() {
            if capability.id.is_some() && capability.id == other.id {
                return Err(spec_error(
                    at.key("id"),
                    format!("the id is also that of capabilities[{earlier}]; ids are unique"),
                ));
            }
            if capability.tool_pattern == other.tool_pattern
                && (capability.id.is_none() || other.id.is_none())
            {
                return Err(spec_error(
                    at.key("tool_pattern"),
                    format!(
                        "capabilities[{earlier}] has the same pattern; capabilities that share a \
                         pattern need an id each"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A compiled flow rule (SPEC 19).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowRule {
    pub if_session_has: Vec<String>,
    pub block: Vec<String>,
    pub action: FlowAction,
}

/// Longest label, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;

/// A label is a short name of letters, digits, '_' and '-' (SPEC 19).
pub fn is_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= MAX_LABEL_BYTES
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// Checks a list of labels and returns it without repeats, in its order.
fn compile_labels(
    labels: &[String],
    at: &FieldPath,
    required: bool,
) -> Result<Vec<String>, SpecError> {
    if required && labels.is_empty() {
        return Err(spec_error(at.clone(), "must name at least one label"));
    }
    let mut unique: Vec<String> = Vec::with_capacity(labels.len());
    for (index, label) in labels.iter().enumerate() {
        if !is_label(label) {
            return Err(spec_error(
                at.clone().index(index),
                format!(
                    "invalid label {label:?}: 1 to {MAX_LABEL_BYTES} letters, digits, '_' or '-'"
                ),
            ));
        }
        if !unique.contains(label) {
            unique.push(label.clone());
        }
    }
    Ok(unique)
}

fn compile_flow_rules(rules: &[FlowRuleSpec]) -> Result<Vec<FlowRule>, SpecError> {
    rules
        .iter()
        .enumerate()
        .map(|(index, rule)| {
            let at = FieldPath::root().key("flow_rules").index(index);
            Ok(FlowRule {
                if_session_has: compile_labels(
                    &rule.if_session_has,
                    &at.clone().key("if_session_has"),
                    true,
                )?,
                block: compile_labels(&rule.block, &at.clone().key("block"), true)?,
                action: rule.action,
            })
        })
        .collect()
}

/// An allowlist that is written must list something.
fn require_entries(list: &[String], at: &FieldPath) -> Result<(), SpecError> {
    if list.is_empty() {
        return Err(spec_error(
            at.clone(),
            "empty allowlist would allow nothing",
        ));
    }
    if let Some(index) = list.iter().position(|entry| entry.is_empty()) {
        return Err(spec_error(at.clone().index(index), "empty entry"));
    }
    Ok(())
}

fn compile_capability(spec: &CapabilitySpec, at: &FieldPath) -> Result<Capability, SpecError> {
    if let Some(id) = &spec.id {
        validate_capability_id(id).map_err(|message| spec_error(at.clone().key("id"), message))?;
    }
    let pattern = Pattern::parse(&spec.tool_pattern)
        .map_err(|message| spec_error(at.clone().key("tool_pattern"), message))?;

    let paths = match (&spec.path_allowlist, &spec.path_arguments) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(spec_error(
                at.clone().key("path_arguments"),
                "path_arguments without path_allowlist would check nothing",
            ))
        }
        (Some(allowlist), arguments) => {
            let allow_at = at.clone().key("path_allowlist");
            require_entries(allowlist, &allow_at)?;
            if let Some(arguments) = arguments {
                // An empty key list would switch the path check off without saying so.
                require_entries(arguments, &at.clone().key("path_arguments"))?;
            }
            Some(
                PathRule::new(allowlist, arguments.as_deref())
                    .map_err(|message| spec_error(allow_at, message))?,
            )
        }
    };

    if spec.option_allowlist.is_some() && spec.command_allowlist.is_none() {
        return Err(spec_error(
            at.clone().key("option_allowlist"),
            "option_allowlist without command_allowlist",
        ));
    }
    let commands = match (&spec.command_allowlist, &spec.subcommand_allowlist) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(spec_error(
                at.clone().key("subcommand_allowlist"),
                "subcommand_allowlist without command_allowlist",
            ))
        }
        (Some(commands), subcommands) => {
            let commands_at = at.clone().key("command_allowlist");
            require_entries(commands, &commands_at)?;
            if let Some(subcommands) = subcommands {
                let sub_at = at.clone().key("subcommand_allowlist");
                if subcommands.is_empty() {
                    return Err(spec_error(sub_at, "empty allowlist would allow nothing"));
                }
                for (command, allowed) in subcommands {
                    let entry_at = sub_at.clone().key(command);
                    if !commands.contains(command) {
                        return Err(spec_error(
                            entry_at,
                            format!("{command:?} is not in command_allowlist"),
                        ));
                    }
                    require_entries(allowed, &entry_at)?;
                }
            }
            let rule = CommandRule::new(Some(commands), subcommands.as_ref())
                .map_err(|message| spec_error(commands_at, message))?;
            match &spec.option_allowlist {
                None => Some(rule),
                Some(options) => Some(rule.with_options(options).map_err(|refused| {
                    let mut path = at.clone().key("option_allowlist");
                    if let Some(key) = &refused.key {
                        path = path.key(key);
                    }
                    if let Some(index) = refused.index {
                        path = path.index(index);
                    }
                    spec_error(path, refused.message)
                })?),
            }
        }
    };

    let domains = match &spec.domain_allowlist {
        None => None,
        Some(allowlist) => {
            let domains_at = at.clone().key("domain_allowlist");
            require_entries(allowlist, &domains_at)?;
            Some(DomainRule::new(allowlist).map_err(|message| spec_error(domains_at, message))?)
        }
    };

    let approval = match spec.approval {
        Some(approval) => approval_rule(&approval, &at.clone().key("approval"))?,
        None => None,
    };

    let labels = compile_labels(&spec.labels, &at.clone().key("labels"), false)?;
    let answer_guard = match &spec.answer_guard {
        Some(guard) => Some(crate::guard::Overrides::new(guard).map_err(|refused| {
            let key = at.clone().key("answer_guard").key("secret_patterns");
            spec_error(key.key(&refused.name), refused.reason)
        })?),
        None => None,
    };

    Ok(Capability {
        id: spec.id.clone(),
        pattern,
        paths,
        commands,
        domains,
        rate_limit: spec.rate_limit,
        max_response_size: spec.max_response_size.map(NonZeroU64::get),
        claim: spec.claim,
        approval,
        labels,
        flow_rules: Vec::new(),
        answer_guard,
    })
}

/// The rule of an `approval:` block, None when it does not require approval; bounds are checked even
/// then, so that turning `required` on later cannot meet a value that was never valid.
fn approval_rule(
    approval: &ApprovalSpec,
    at: &FieldPath,
) -> Result<Option<ApprovalRule>, SpecError> {
    if approval.expires_secs.get() > MAX_APPROVAL_SECS {
        return Err(spec_error(
            at.clone().key("expires_secs"),
            format!("must be at most {MAX_APPROVAL_SECS} (a year)"),
        ));
    }
    let approvers = approval.approvers.get();
    if approvers > MAX_APPROVERS {
        return Err(spec_error(
            at.clone().key("approvers"),
            format!("must be 1 to {MAX_APPROVERS}, not {approvers}"),
        ));
    }
    if !approval.required {
        return Ok(None);
    }
    Ok(Some(ApprovalRule {
        expires_secs: approval.expires_secs.get(),
        approvers,
        separate_from_registrant: approval.separate_from_registrant.unwrap_or(approvers >= 2),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_from_json(value: serde_json::Value) -> SecurityContextSpec {
        match serde_json::from_value(value) {
            Ok(spec) => spec,
            Err(error) => panic!("spec should deserialize: {error}"),
        }
    }

    #[test]
    fn field_path_display() {
        let path = FieldPath::root()
            .key("capabilities")
            .index(1)
            .key("path_allowlist")
            .index(0);
        assert_eq!(path.to_string(), "capabilities[1].path_allowlist[0]");
        assert_eq!(FieldPath::root().to_string(), "");
    }

    #[test]
    fn claim_mode_accepts_false_and_refuses_true() {
        let off: Result<ClaimMode, _> = serde_json::from_value(serde_json::json!(false));
        assert_eq!(off.ok(), Some(ClaimMode::Off));
        let on: Result<ClaimMode, _> = serde_json::from_value(serde_json::json!(true));
        assert!(on.is_err());
        let explicit: Result<ClaimMode, _> = serde_json::from_value(serde_json::json!("explicit"));
        assert_eq!(explicit.ok(), Some(ClaimMode::Explicit));
        let upper: Result<ClaimMode, _> = serde_json::from_value(serde_json::json!("OFF"));
        assert!(upper.is_err());
    }

    #[test]
    fn serialises_back_without_absent_optionals() {
        let spec = spec_from_json(serde_json::json!({
            "name": "c", "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/w"]}]
        }));
        let json = serde_json::to_value(&spec).ok();
        assert_eq!(
            json,
            Some(serde_json::json!({
                "name": "c", "deny_list": [],
                "capabilities": [{"tool_pattern": "fs.*", "path_allowlist": ["/w"], "claim": "explicit"}]
            }))
        );
    }

    #[test]
    fn explicit_defaults_give_the_same_version() {
        let short = spec_from_json(
            serde_json::json!({"name": "c", "capabilities": [{"tool_pattern": "x"}]}),
        );
        let long = spec_from_json(serde_json::json!({
            "name": "c", "deny_list": [], "capabilities": [{"tool_pattern": "x", "claim": "explicit"}]
        }));
        let short = SecurityContext::compile(short, ContextSource::Store).map(|c| c.version);
        let long = SecurityContext::compile(long, ContextSource::Store).map(|c| c.version);
        assert!(short.is_ok());
        assert_eq!(short, long);
    }

    fn compile_approval(approval: serde_json::Value) -> Result<Option<ApprovalRule>, String> {
        let spec: Result<SecurityContextSpec, _> = serde_json::from_value(serde_json::json!({
            "name": "c", "capabilities": [{"tool_pattern": "pay.*", "approval": approval}]
        }));
        spec.map_err(|e| e.to_string()).and_then(|spec| {
            SecurityContext::compile(spec, ContextSource::Store)
                .map(|c| c.capabilities[0].approval)
                .map_err(|e| format!("{}: {}", e.path, e.message))
        })
    }

    #[test]
    fn a_team_is_a_name_and_default_says_what_no_team_says() {
        let compile = |team: serde_json::Value| {
            let spec =
                spec_from_json(serde_json::json!({"name": "c", "team": team, "capabilities": []}));
            SecurityContext::compile(spec, ContextSource::Store)
        };
        let payments = compile(serde_json::json!("pay_ments-2")).ok();
        assert_eq!(payments.as_ref().map(|c| c.team()), Some("pay_ments-2"));
        assert_eq!(
            payments.map(|c| c.api_view()["team"].clone()),
            Some(serde_json::json!("pay_ments-2"))
        );
        let unnamed = spec_from_json(serde_json::json!({"name": "c", "capabilities": []}));
        let unnamed = SecurityContext::compile(unnamed, ContextSource::Store).ok();
        let named_default = compile(serde_json::json!("default")).ok();
        assert_eq!(unnamed.as_ref().map(|c| c.team()), Some(DEFAULT_TEAM));
        assert_eq!(
            unnamed.as_ref().map(|c| c.api_view()["team"].clone()),
            Some(serde_json::json!("default"))
        );
        assert_eq!(unnamed.map(|c| c.version), named_default.map(|c| c.version));
        let long = "a".repeat(MAX_TEAM_NAME_BYTES + 1);
        for bad in ["", "pay ments", "pay.ments", "a/b", "*", &long] {
            let err = compile(serde_json::json!(bad)).err();
            assert_eq!(
                err.map(|e| (e.path.to_string(), e.message.contains(&format!("{bad:?}")))),
                Some(("team".to_owned(), true)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn approval_takes_required_and_a_bounded_expiry_with_900_by_default() {
        let compile = |approval| compile_approval(approval).map(|r| r.map(|r| r.expires_secs));
        assert_eq!(
            compile(serde_json::json!({"required": true})),
            Ok(Some(900))
        );
        assert_eq!(
            compile(serde_json::json!({"required": true, "expires_secs": 5})),
            Ok(Some(5))
        );
        assert_eq!(compile(serde_json::json!({"required": false})), Ok(None));
        assert!(compile(serde_json::json!({})).is_err());
        assert!(compile(serde_json::json!({"required": true, "expires_secs": 0})).is_err());
        let too_long = compile(serde_json::json!({"required": true, "expires_secs": 31_536_001}));
        assert!(
            too_long
                .as_ref()
                .is_err_and(|e| e.contains("capabilities[0].approval.expires_secs")),
            "{too_long:?}"
        );
    }

    #[test]
    fn approvers_default_to_one_and_separation_follows_them_unless_given() {
        let rule = |approval| compile_approval(approval).unwrap().unwrap();
        let one = rule(serde_json::json!({"required": true}));
        assert_eq!((one.approvers, one.separate_from_registrant), (1, false));
        let two = rule(serde_json::json!({"required": true, "approvers": 2}));
        assert_eq!((two.approvers, two.separate_from_registrant), (2, true));
        let trusting = serde_json::json!({"required": true, "approvers": 2,
                                          "separate_from_registrant": false});
        assert!(!rule(trusting).separate_from_registrant);
        let strict = serde_json::json!({"required": true, "separate_from_registrant": true});
        assert_eq!(
            (
                rule(strict.clone()).approvers,
                rule(strict).separate_from_registrant
            ),
            (1, true)
        );
        for bad in [
            serde_json::json!({"required": true, "approvers": 0}),
            serde_json::json!({"required": true, "approvers": -1}),
            serde_json::json!({"required": true, "approvers": "2"}),
            serde_json::json!({"required": true, "separate_from_registrant": null}),
        ] {
            assert!(compile_approval(bad.clone()).is_err(), "{bad}");
        }
        let too_many = compile_approval(serde_json::json!({"required": false, "approvers": 11}));
        assert!(
            too_many
                .as_ref()
                .is_err_and(|e| e.contains("capabilities[0].approval.approvers")),
            "{too_many:?}"
        );
    }

    #[test]
    fn one_approver_is_left_out_so_that_earlier_contexts_keep_their_version() {
        let version = |approval| {
            let spec = spec_from_json(serde_json::json!({
                "name": "c", "capabilities": [{"tool_pattern": "pay.*", "approval": approval}]
            }));
            SecurityContext::compile(spec, ContextSource::Store).map(|c| c.version)
        };
        assert_eq!(
            version(serde_json::json!({"required": true})),
            version(serde_json::json!({"required": true, "approvers": 1}))
        );
        assert_ne!(
            version(serde_json::json!({"required": true})),
            version(serde_json::json!({"required": true, "approvers": 2}))
        );
    }

    #[test]
    fn context_names_are_url_safe() {
        for good in ["agent-runtime", "a", "coding_agent.v2"] {
            assert!(validate_context_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "-x", "a/b", "a b", "é", &"a".repeat(129)] {
            assert!(validate_context_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn structural_rules_name_the_field() {
        let cases = [
            (
                serde_json::json!({"tool_pattern": "fs.*", "path_arguments": ["p"]}),
                "capabilities[0].path_arguments",
            ),
            (
                serde_json::json!({"tool_pattern": "fs.*", "path_allowlist": ["/w"], "path_arguments": []}),
                "capabilities[0].path_arguments",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "subcommand_allowlist": {"git": ["log"]}}),
                "capabilities[0].subcommand_allowlist",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["ls"], "subcommand_allowlist": {"git": ["log"]}}),
                "capabilities[0].subcommand_allowlist.git",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git"], "subcommand_allowlist": {"git": []}}),
                "capabilities[0].subcommand_allowlist.git",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git"], "subcommand_allowlist": {}}),
                "capabilities[0].subcommand_allowlist",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git", ""]}),
                "capabilities[0].command_allowlist[1]",
            ),
            (
                serde_json::json!({"tool_pattern": "w", "domain_allowlist": []}),
                "capabilities[0].domain_allowlist",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "option_allowlist": {"git": ["-s"]}}),
                "capabilities[0].option_allowlist",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git"], "option_allowlist": {"ls": ["-l"]}}),
                "capabilities[0].option_allowlist.ls",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git"], "subcommand_allowlist": {"git": ["log"]}, "option_allowlist": {"git log": ["-n", "oneline"]}}),
                "capabilities[0].option_allowlist.git log[1]",
            ),
            (
                serde_json::json!({"tool_pattern": "c", "command_allowlist": ["git"], "option_allowlist": {"git": []}, "subcommand_allowlist": {"git": ["log"]}, "path_allowlist": ["/w"], "domain_allowlist": [], "rate_limit": {"calls": 1, "per_seconds": 1}}),
                "capabilities[0].domain_allowlist",
            ),
        ];
        for (capability, field) in cases {
            let spec =
                spec_from_json(serde_json::json!({"name": "c", "capabilities": [capability]}));
            match SecurityContext::compile(spec, ContextSource::Store) {
                Ok(_) => panic!("{field} case should be refused"),
                Err(error) => assert_eq!(error.path.to_string(), field),
            }
        }
    }

    #[test]
    fn a_capability_is_named_by_its_id_or_else_its_pattern() {
        let compile = |capabilities: serde_json::Value| {
            let spec =
                spec_from_json(serde_json::json!({"name": "c", "capabilities": capabilities}));
            SecurityContext::compile(spec, ContextSource::Store)
        };
        let context = compile(serde_json::json!([
            {"id": "reads", "tool_pattern": "fs.*"},
            {"id": "writes-2", "tool_pattern": "fs.*"},
            {"tool_pattern": "web.fetch"},
        ]));
        let identities: Vec<String> = context
            .map(|c| c.capabilities.iter().map(Capability::identity).collect())
            .unwrap_or_default();
        assert_eq!(identities, ["id:reads", "id:writes-2", "pattern:web.fetch"]);

        let refused = [
            (
                serde_json::json!([{"id": "a b", "tool_pattern": "x"}]),
                "capabilities[0].id",
                "invalid capability id",
            ),
            (
                serde_json::json!([{"id": "", "tool_pattern": "x"}]),
                "capabilities[0].id",
                "invalid capability id",
            ),
            (
                serde_json::json!([{"id": "a", "tool_pattern": "x"}, {"id": "a", "tool_pattern": "y"}]),
                "capabilities[1].id",
                "also that of capabilities[0]",
            ),
            (
                serde_json::json!([{"tool_pattern": "x"}, {"tool_pattern": "y"}, {"id": "b", "tool_pattern": "x"}]),
                "capabilities[2].tool_pattern",
                "need an id each",
            ),
        ];
        for (capabilities, field, reason) in refused {
            match compile(capabilities.clone()) {
                Ok(_) => panic!("{capabilities} should be refused"),
                Err(error) => {
                    assert_eq!(error.path.to_string(), field, "{capabilities}");
                    assert!(error.message.contains(reason), "{}", error.message);
                }
            }
        }
    }

    #[test]
    fn labels_and_flow_rules_are_names_and_part_of_the_version() {
        let compile = |value: serde_json::Value| {
            serde_json::from_value::<SecurityContextSpec>(value)
                .map_err(|e| e.to_string())
                .and_then(|spec| {
                    SecurityContext::compile(spec, ContextSource::Store)
                        .map_err(|e| format!("{}: {}", e.path, e.message))
                })
        };
        let plain =
            compile(serde_json::json!({"name": "c", "capabilities": [{"tool_pattern": "x"}]}));
        let empty = compile(serde_json::json!({"name": "c", "flow_rules": [],
            "capabilities": [{"tool_pattern": "x", "labels": []}]}));
        let labelled = compile(serde_json::json!({"name": "c",
            "capabilities": [{"tool_pattern": "x", "labels": ["a", "b-2", "a"]}],
            "flow_rules": [{"if_session_has": ["a"], "block": ["b-2"], "action": "deny"}]}));
        let version =
            |c: &Result<SecurityContext, String>| c.as_ref().map(|c| c.version.clone()).ok();
        // A context without them keeps the version it had before SPEC 19; with them the version moves.
        assert_eq!(version(&plain), version(&empty));
        assert_ne!(version(&plain), version(&labelled));
        let labelled = labelled.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(labelled.capabilities[0].labels, ["a", "b-2"]);
        assert_eq!(labelled.capabilities[0].flow_rules, [0]);
        assert!(labelled.flow_warnings().is_empty());

        let refused = [
            (
                serde_json::json!([{"tool_pattern": "x", "labels": ["a b"]}]),
                serde_json::json!([]),
                "capabilities[0].labels[0]",
            ),
            (
                serde_json::json!([{"tool_pattern": "x", "labels": ["ok", ""]}]),
                serde_json::json!([]),
                "capabilities[0].labels[1]",
            ),
            (
                serde_json::json!([{"tool_pattern": "x"}]),
                serde_json::json!([{"if_session_has": [], "block": ["b"], "action": "deny"}]),
                "flow_rules[0].if_session_has",
            ),
            (
                serde_json::json!([{"tool_pattern": "x"}]),
                serde_json::json!([{"if_session_has": ["a"], "block": ["é"], "action": "approval"}]),
                "flow_rules[0].block[0]",
            ),
        ];
        for (capabilities, rules, field) in refused {
            let error = compile(
                serde_json::json!({"name": "c", "capabilities": capabilities,
                "flow_rules": rules}),
            );
            assert!(
                error
                    .as_ref()
                    .is_err_and(|e| e.starts_with(&format!("{field}: invalid label"))
                        || e.starts_with(&format!("{field}: must name"))),
                "{field}: {error:?}"
            );
        }
        for unknown in [
            serde_json::json!({"if_session_has": ["a"], "block": ["b"], "action": "deny", "when": 1}),
            serde_json::json!({"if_session_has": ["a"], "block": ["b"], "action": "warn"}),
            serde_json::json!({"if_session_has": ["a"], "block": ["b"]}),
        ] {
            let error = compile(serde_json::json!({"name": "c", "capabilities": [],
                "flow_rules": [unknown.clone()]}));
            assert!(error.is_err(), "{unknown}");
        }
        let unused = compile(serde_json::json!({"name": "c",
            "capabilities": [{"tool_pattern": "x", "labels": ["a"]}],
            "flow_rules": [{"if_session_has": ["a", "ghost"], "block": ["nowhere"], "action": "deny"}]}))
        .unwrap_or_else(|e| panic!("{e}"));
        let warnings = unused.flow_warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0]
            .starts_with("flow_rules[0].if_session_has: no capability gives the label \"ghost\""));
        assert!(warnings[1]
            .starts_with("flow_rules[0].block: no capability gives the label \"nowhere\""));
    }

    #[test]
    fn api_view_has_version_and_source() {
        let spec = spec_from_json(serde_json::json!({"name": "c", "capabilities": []}));
        let context = SecurityContext::compile(spec, ContextSource::File("policies/c.yaml".into()));
        let view = context.map(|c| c.api_view()).ok();
        let view = view.unwrap_or_default();
        assert_eq!(view["name"], "c");
        assert_eq!(
            view["source"],
            serde_json::json!({"kind": "file", "path": "policies/c.yaml"})
        );
        assert_eq!(view["version"].as_str().map(str::len), Some(64));
    }
}
