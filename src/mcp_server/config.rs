//! `mcp_server` in the configuration file (SPEC 17), and what the endpoint reads of the rest of it: kept
//! apart from the endpoint, so that the configuration needs nothing that runs.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::token::KeyConfig;

/// `mcp_server` in the configuration file (SPEC 17).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpServerConfig {
    pub enabled: bool,
    pub path: String,
    /// This server's canonical URI (RFC 8707, RFC 9728): the audience its tokens must hold.
    pub resource: Option<String>,
    pub authorization_servers: Vec<String>,
    pub keys: Vec<KeyConfig>,
    pub scopes_required: Vec<String>,
    pub allowed_origins: Vec<String>,
    pub people: Vec<PeopleRule>,
    pub session: PersonSessionConfig,
}

impl Default for McpServerConfig {
    fn default() -> Self {
        McpServerConfig {
            enabled: false,
            path: "/mcp".to_owned(),
            resource: None,
            authorization_servers: Vec::new(),
            keys: Vec::new(),
            scopes_required: vec!["mcp:tools".to_owned()],
            allowed_origins: Vec::new(),
            people: Vec::new(),
            session: PersonSessionConfig::default(),
        }
    }
}

/// `mcp_server.session`: what a person's session lasts and may spend.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct PersonSessionConfig {
    pub expires_secs: i64,
    /// The session's call budget; null: none.
    pub budget: Option<u64>,
}

impl Default for PersonSessionConfig {
    fn default() -> Self {
        PersonSessionConfig {
            expires_secs: 3600,
            budget: None,
        }
    }
}

/// What `McpServer::new` needs of the rest of the configuration.
pub struct Surroundings<'a> {
    pub base_dir: &'a Path,
    /// `operator_auth.oidc.groups_claim`, default `groups`.
    pub groups_claim: &'a str,
    /// `limits.max_clock_skew_secs`: the leeway on `exp` and `nbf`.
    pub skew_secs: u64,
    /// `sessions.max_lifetime_secs`: no person's session outlives what a registered one may.
    pub max_lifetime_secs: i64,
}

/// One rule of `mcp_server.people`: a group of the token's, or a claim matching a pattern, names the
/// context of the person's session.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PeopleRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The whole claim value, `*` standing for any run of characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub context: String,
}
