//! MCP hosts over the network (SPEC 17): the gateway as a remote MCP server and an OAuth 2.1 resource
//! server. A host's bearer token is verified here ([`crate::token::AccessTokenVerifier`]), the person it
//! names gets a session of the gateway's own ([`people`]), and each `tools/call` or `tools/list` is
//! handed to the one pipeline after its envelope checks ([`crate::pipeline::call_as_person`]).

pub mod config;
pub mod endpoint;
mod people;

use serde_json::{json, Value};

use crate::token::AccessTokenVerifier;
use config::{McpServerConfig, Surroundings};

/// The endpoint's parts, built once from the configuration.
pub struct McpServer {
    tokens: AccessTokenVerifier,
    path: String,
    /// `resource_metadata` of every challenge: RFC 9728's well-known path with `path` appended.
    metadata_url: String,
    /// The RFC 9728 document.
    metadata: Value,
    scopes_required: String,
    /// The resource's own origin and `allowed_origins`, as browsers write an `Origin` header.
    origins: Vec<String>,
    people: people::People,
}

impl McpServer {
    /// None when the endpoint is off; a mistake names its key.
    pub fn new(
        config: &McpServerConfig,
        around: &Surroundings,
    ) -> Result<Option<McpServer>, String> {
        if !config.enabled {
            return Ok(None);
        }
        let resource = resource_url(config)?;
        if config.authorization_servers.is_empty() {
            return Err("mcp_server.authorization_servers: name at least one".to_owned());
        }
        for issuer in &config.authorization_servers {
            let url = url::Url::parse(issuer)
                .map_err(|e| format!("mcp_server.authorization_servers: {issuer:?}: {e}"))?;
            crate::outbound::https_or_loopback(&url)
                .map_err(|e| format!("mcp_server.authorization_servers: {issuer:?}: {e}"))?;
        }
        if config.keys.is_empty() {
            return Err(
                "mcp_server.keys: name at least one key (a jwks_url of the authorization server)"
                    .to_owned(),
            );
        }
        if let Some(bad) = config
            .scopes_required
            .iter()
            .find(|scope| scope.is_empty() || scope.contains(' '))
        {
            return Err(format!(
                "mcp_server.scopes_required: {bad:?} is not a scope name"
            ));
        }
        let origin = resource.origin().ascii_serialization();
        let mut origins = vec![origin.clone()];
        for allowed in &config.allowed_origins {
            let url = url::Url::parse(allowed)
                .map_err(|e| format!("mcp_server.allowed_origins: {allowed:?}: {e}"))?;
            origins.push(url.origin().ascii_serialization());
        }
        let people = people::People::new(config, around)?;
        let tokens = AccessTokenVerifier::new(
            &config.keys,
            around.base_dir,
            &config.authorization_servers,
            resource.as_str(),
            &config.scopes_required,
            around.skew_secs,
        )?;
        let metadata = json!({
            "resource": resource.as_str(),
            "authorization_servers": config.authorization_servers,
            "scopes_supported": config.scopes_required,
            "bearer_methods_supported": ["header"],
        });
        Ok(Some(McpServer {
            tokens,
            path: config.path.clone(),
            metadata_url: format!(
                "{origin}/.well-known/oauth-protected-resource{}",
                config.path
            ),
            metadata,
            scopes_required: config.scopes_required.join(" "),
            origins,
            people,
        }))
    }
}

/// `resource`: an absolute https URL (http for a loopback host) whose path is `path`, so that the
/// metadata's well-known address and the endpoint agree.
fn resource_url(config: &McpServerConfig) -> Result<url::Url, String> {
    if !config.path.starts_with('/') || config.path.len() < 2 || config.path.contains(['?', '#']) {
        return Err(format!(
            "mcp_server.path: {:?} must be a path such as \"/mcp\"",
            config.path
        ));
    }
    let text = config.resource.as_deref().ok_or(
        "mcp_server.resource: required when enabled (this endpoint's URL, e.g. https://gateway.example.com/mcp)",
    )?;
    let url = url::Url::parse(text).map_err(|e| format!("mcp_server.resource: {text:?}: {e}"))?;
    crate::outbound::https_or_loopback(&url)
        .map_err(|e| format!("mcp_server.resource: {text:?}: {e}"))?;
    if url.path() != config.path || url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "mcp_server.resource: {text:?} must end in mcp_server.path ({:?}), with no query",
            config.path
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn around() -> Surroundings<'static> {
        Surroundings {
            base_dir: std::path::Path::new("/"),
            groups_claim: "groups",
            skew_secs: 60,
            max_lifetime_secs: 86_400,
        }
    }

    fn config(yaml: &str) -> McpServerConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const GOOD: &str = r#"
enabled: true
resource: "https://gw.example/mcp"
authorization_servers: ["https://idp.example"]
keys: [ { jwks_url: "https://idp.example/jwks" } ]
people: [ { group: payments, context: payments-agent } ]
"#;

    fn refused(change: impl FnOnce(&mut McpServerConfig)) -> String {
        let mut changed = config(GOOD);
        change(&mut changed);
        match McpServer::new(&changed, &around()) {
            Err(why) => why,
            Ok(_) => panic!("accepted: {changed:?}"),
        }
    }

    #[test]
    fn a_good_configuration_publishes_its_metadata_at_the_path() {
        let server = McpServer::new(&config(GOOD), &around()).unwrap().unwrap();
        assert_eq!(
            server.metadata_url,
            "https://gw.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            server.metadata["bearer_methods_supported"],
            json!(["header"])
        );
        assert_eq!(server.metadata["scopes_supported"], json!(["mcp:tools"]));
    }

    #[test]
    fn mistakes_name_their_key() {
        assert!(refused(|c| c.path = "/other".into()).contains("mcp_server.resource"));
        assert!(refused(|c| c.authorization_servers.clear()).contains("authorization_servers"));
        assert!(
            refused(|c| c.authorization_servers = vec!["http://idp.example".into()])
                .contains("loopback")
        );
        assert!(refused(|c| c.keys.clear()).contains("mcp_server.keys"));
        assert!(refused(|c| c.scopes_required = vec!["a b".into()]).contains("scopes_required"));
        assert!(refused(|c| c.people[0].context.clear()).contains("mcp_server.people[0]"));
        let no_resource = config("enabled: true\n");
        assert!(McpServer::new(&no_resource, &around())
            .err()
            .unwrap()
            .contains("mcp_server.resource: required"));
        assert!(McpServer::new(&config("enabled: false\n"), &around())
            .unwrap()
            .is_none());
    }
}
