//! Scopes bound to teams (SPEC 16): `TEAM/SCOPE` in a token's `scope` claim, or a role's `team`. An
//! unbound scope, or team `*`, applies to every team.

use std::collections::BTreeSet;

/// The scope names of SPEC section 4.
pub mod scopes {
    pub const SESSION_CREATE: &str = "seal.session.create";
    pub const SESSION_REVOKE: &str = "seal.session.revoke";
    pub const SESSION_READ: &str = "seal.session.read";
    pub const CONTEXT_READ: &str = "seal.context.read";
    pub const CONTEXT_WRITE: &str = "seal.context.write";
    pub const AUDIT_READ: &str = "seal.audit.read";
    pub const CLAIM_READ: &str = "seal.claim.read";
    pub const CLAIM_RESOLVE: &str = "seal.claim.resolve";
    pub const APPROVAL_READ: &str = "seal.approval.read";
    pub const APPROVAL_DECIDE: &str = "seal.approval.decide";
    /// `GET /metrics` on the main listener (SPEC 11 r3).
    pub const METRICS_READ: &str = "seal.metrics.read";
    /// `GET /v1/tools`: the MCP upstreams' tool definitions (SPEC 18).
    pub const TOOL_READ: &str = "seal.tool.read";
    /// Accepting a tool definition (SPEC 18).
    pub const TOOL_REVIEW: &str = "seal.tool.review";
    /// Grants every other scope.
    pub const ADMIN: &str = "seal.admin";
    /// Every name above, for tools that refuse a misspelt scope before it becomes a useless token.
    pub const ALL: [&str; 14] = [
        SESSION_CREATE,
        SESSION_REVOKE,
        SESSION_READ,
        CONTEXT_READ,
        CONTEXT_WRITE,
        AUDIT_READ,
        CLAIM_READ,
        CLAIM_RESOLVE,
        APPROVAL_READ,
        APPROVAL_DECIDE,
        METRICS_READ,
        TOOL_READ,
        TOOL_REVIEW,
        ADMIN,
    ];
}

/// The team of a context that names none.
pub const DEFAULT_TEAM: &str = "default";

/// Longest team name, in bytes: a name is written whole into every event of its team (whose string
/// fields hold at most 256 characters), where a cut name would match no team.
pub const MAX_TEAM_NAME_BYTES: usize = 128;

/// Team names: letters, digits, `-` and `_` (SPEC 16); never empty, at most [`MAX_TEAM_NAME_BYTES`].
pub fn is_team_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TEAM_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// Which teams a scope applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Teams {
    /// Unbound, or bound to `*`.
    Every,
    One(String),
}

impl Teams {
    fn covers(&self, team: &str) -> bool {
        match self {
            Teams::Every => true,
            Teams::One(name) => name == team,
        }
    }
}

/// One scope and the teams it applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TeamScope {
    pub teams: Teams,
    pub scope: String,
}

impl TeamScope {
    /// Reads `SCOPE`, `*/SCOPE` or `TEAM/SCOPE`. Only the last `/` separates: scope names hold none.
    pub fn parse(raw: &str) -> Result<TeamScope, String> {
        let (teams, scope) = match raw.split_once('/') {
            None => (Teams::Every, raw),
            Some(("*", scope)) => (Teams::Every, scope),
            Some((team, scope)) if is_team_name(team) => (Teams::One(team.to_owned()), scope),
            Some((team, _)) => {
                return Err(format!(
                    "scope {raw:?}: team {team:?} is not a team name (1 to {MAX_TEAM_NAME_BYTES} letters, digits, '-', '_', or '*')"
                ))
            }
        };
        if scope.is_empty() || scope.contains('/') || scope.chars().any(char::is_whitespace) {
            return Err(format!("scope {raw:?}: {scope:?} is not a scope name"));
        }
        Ok(TeamScope {
            teams,
            scope: scope.to_owned(),
        })
    }

    /// Whether this grants `wanted` on `team`; `seal.admin` grants every scope.
    fn grants(&self, team: &str, wanted: &str) -> bool {
        self.teams.covers(team) && (self.scope == wanted || self.scope == scopes::ADMIN)
    }

    fn grants_scope(&self, wanted: &str) -> bool {
        self.scope == wanted || self.scope == scopes::ADMIN
    }
}

/// The teams a caller may read (or change) something in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TeamFilter {
    Every,
    Only(BTreeSet<String>),
}

impl TeamFilter {
    pub fn admits(&self, team: &str) -> bool {
        match self {
            TeamFilter::Every => true,
            TeamFilter::Only(teams) => teams.contains(team),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, TeamFilter::Only(teams) if teams.is_empty())
    }
}

/// Everything a caller holds. Entries that do not parse are dropped: like unknown scope names, they
/// grant nothing (a token is not refused for them, SPEC 4).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TeamScopes(Vec<TeamScope>);

impl TeamScopes {
    /// From a token's space-separated `scope` claim.
    pub fn from_claim<'a>(names: impl IntoIterator<Item = &'a str>) -> TeamScopes {
        TeamScopes(
            names
                .into_iter()
                .filter_map(|raw| TeamScope::parse(raw).ok())
                .collect(),
        )
    }

    pub fn from_entries(mut entries: Vec<TeamScope>) -> TeamScopes {
        entries.sort();
        entries.dedup();
        TeamScopes(entries)
    }

    pub fn entries(&self) -> &[TeamScope] {
        &self.0
    }

    pub fn allows(&self, team: &str, scope: &str) -> bool {
        self.0.iter().any(|held| held.grants(team, scope))
    }

    /// The teams on which `scope` is held.
    pub fn teams_with(&self, scope: &str) -> TeamFilter {
        let mut teams = BTreeSet::new();
        for held in self.0.iter().filter(|held| held.grants_scope(scope)) {
            match &held.teams {
                Teams::Every => return TeamFilter::Every,
                Teams::One(team) => {
                    teams.insert(team.clone());
                }
            }
        }
        TeamFilter::Only(teams)
    }

    /// Whether `scope` is held on every team (unbound): what gateway-wide objects need.
    pub fn allows_everywhere(&self, scope: &str) -> bool {
        self.teams_with(scope) == TeamFilter::Every
    }

    /// `seal.admin` on every team: acts for anyone (a standalone claim taken by another operator).
    pub fn is_admin(&self) -> bool {
        self.allows_everywhere(scopes::ADMIN)
    }

    /// As `TEAM/SCOPE` strings (`*/SCOPE` for every team), for the console and `GET /console/session`.
    pub fn by_team(&self) -> std::collections::BTreeMap<String, Vec<String>> {
        let mut map = std::collections::BTreeMap::<String, Vec<String>>::new();
        for held in &self.0 {
            let team = match &held.teams {
                Teams::Every => "*".to_owned(),
                Teams::One(team) => team.clone(),
            };
            map.entry(team).or_default().push(held.scope.clone());
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn unbound_star_and_team_forms_parse() {
        let any = TeamScope::parse("seal.audit.read").unwrap();
        assert_eq!(any.teams, Teams::Every);
        assert_eq!(TeamScope::parse("*/seal.audit.read").unwrap(), any);
        let bound = TeamScope::parse("payments/seal.approval.decide").unwrap();
        assert_eq!(bound.teams, Teams::One("payments".into()));
        assert_eq!(bound.scope, "seal.approval.decide");
        for bad in [
            "",
            "/x",
            "pay ments/x",
            "a/b/c",
            "payments/",
            "pay.ments/x",
            "ü/x",
            &format!("{}/x", "a".repeat(MAX_TEAM_NAME_BYTES + 1)),
        ] {
            assert!(TeamScope::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn a_team_bound_scope_applies_to_its_team_only_and_admin_grants_all() {
        let held = TeamScopes::from_claim(["payments/seal.approval.decide", "ops/seal.admin"]);
        assert!(held.allows("payments", scopes::APPROVAL_DECIDE));
        assert!(!held.allows("default", scopes::APPROVAL_DECIDE));
        assert!(!held.allows("payments", scopes::APPROVAL_READ));
        assert!(held.allows("ops", scopes::CONTEXT_WRITE));
        assert!(!held.is_admin());
        assert_eq!(
            held.teams_with(scopes::APPROVAL_DECIDE),
            TeamFilter::Only(["ops".to_owned(), "payments".to_owned()].into())
        );
        assert!(TeamScopes::from_claim(["seal.admin"]).is_admin());
        assert!(TeamScopes::from_claim(["*/seal.admin"]).is_admin());
    }

    #[test]
    fn a_malformed_entry_grants_nothing() {
        let held = TeamScopes::from_claim(["pay ments/seal.admin", "x/y/seal.admin"]);
        assert!(held.entries().is_empty());
        assert!(!held.allows("pay ments", scopes::ADMIN));
        assert!(held.teams_with(scopes::ADMIN).is_empty());
    }

    proptest! {
        /// Whatever the text, parsing never panics, and what parses grants exactly what it names.
        #[test]
        fn parsing_any_text_is_total_and_exact(raw in "\\PC{0,40}") {
            if let Ok(parsed) = TeamScope::parse(&raw) {
                let held = TeamScopes::from_entries(vec![parsed.clone()]);
                match &parsed.teams {
                    Teams::One(team) => {
                        prop_assert!(is_team_name(team));
                        let written = format!("{team}/{}", parsed.scope);
                        prop_assert_eq!(written, raw.clone());
                        prop_assert!(held.allows(team, &parsed.scope));
                        let longer = format!("{team}x");
                        prop_assert!(!held.allows(&longer, &parsed.scope));
                    }
                    Teams::Every => prop_assert!(held.allows("any-team", &parsed.scope)),
                }
                prop_assert!(!parsed.scope.contains('/'));
            }
        }

        /// A scope bound to one team never reaches another, whatever the names.
        #[test]
        fn a_bound_scope_never_leaks(team in "[A-Za-z0-9_-]{1,12}", other in "[A-Za-z0-9_-]{1,12}") {
            let held = TeamScopes::from_claim([format!("{team}/seal.admin").as_str()]);
            prop_assert_eq!(held.allows(&other, scopes::SESSION_READ), team == other);
        }
    }
}
