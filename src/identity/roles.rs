//! Roles from groups (SPEC 16): `operator_auth.roles` binds an identity provider's group to scopes on a
//! team; a person's scopes are the union of the roles whose group they are in.

use serde::{Deserialize, Serialize};

use super::scope::{is_team_name, scopes, TeamScope, TeamScopes, Teams};

/// One entry of `operator_auth.roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// A group name as the provider's groups claim writes it.
    pub group: String,
    /// A team name, or `*` for every team.
    pub team: String,
    pub scopes: Vec<String>,
}

/// The roles of the configuration, checked.
#[derive(Debug, Clone, Default)]
pub struct Roles(Vec<RoleConfig>);

impl Roles {
    /// Refuses, naming the key (`operator_auth.roles[1].team`), a team that is not a team name nor `*`,
    /// a scope this gateway does not know, or an empty group: a typo must not silently grant nothing,
    /// or grant to the wrong people.
    pub fn new(roles: &[RoleConfig]) -> Result<Roles, String> {
        for (index, role) in roles.iter().enumerate() {
            let place = format!("operator_auth.roles[{index}]");
            if role.group.is_empty() {
                return Err(format!("{place}.group: must not be empty"));
            }
            if role.team != "*" && !is_team_name(&role.team) {
                return Err(format!(
                    "{place}.team: {:?} is not a team name (letters, digits, '-', '_') nor '*'",
                    role.team
                ));
            }
            if role.scopes.is_empty() {
                return Err(format!("{place}.scopes: must name at least one scope"));
            }
            if let Some(unknown) = role
                .scopes
                .iter()
                .find(|s| !scopes::ALL.contains(&s.as_str()))
            {
                return Err(format!(
                    "{place}.scopes: {unknown:?} is not a scope (known: {})",
                    scopes::ALL.join(", ")
                ));
            }
        }
        Ok(Roles(roles.to_vec()))
    }

    /// The union of the roles whose group is among `groups`; none → no scope at all.
    pub fn scopes_of(&self, groups: &[String]) -> TeamScopes {
        let held = self
            .0
            .iter()
            .filter(|role| groups.contains(&role.group))
            .flat_map(|role| {
                let teams = match role.team.as_str() {
                    "*" => Teams::Every,
                    team => Teams::One(team.to_owned()),
                };
                role.scopes.iter().map(move |scope| TeamScope {
                    teams: teams.clone(),
                    scope: scope.clone(),
                })
            })
            .collect();
        TeamScopes::from_entries(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(group: &str, team: &str, scopes: &[&str]) -> RoleConfig {
        RoleConfig {
            group: group.into(),
            team: team.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_persons_scopes_are_the_union_of_their_groups_roles() {
        let roles = Roles::new(&[
            role("security", "*", &["seal.admin"]),
            role(
                "payments-oncall",
                "payments",
                &["seal.approval.read", "seal.approval.decide"],
            ),
            role("payments-oncall", "ops", &["seal.audit.read"]),
        ])
        .unwrap();
        let oncall = roles.scopes_of(&["payments-oncall".into(), "other".into()]);
        assert!(oncall.allows("payments", scopes::APPROVAL_DECIDE));
        assert!(oncall.allows("ops", scopes::AUDIT_READ));
        assert!(!oncall.allows("ops", scopes::APPROVAL_DECIDE));
        assert!(!oncall.allows("default", scopes::APPROVAL_READ));
        assert!(roles.scopes_of(&["security".into()]).is_admin());
        assert!(roles.scopes_of(&["nobody".into()]).entries().is_empty());
        assert!(roles.scopes_of(&[]).entries().is_empty());
    }

    #[test]
    fn a_bad_team_an_unknown_scope_or_an_empty_group_is_refused_by_key() {
        let cases = [
            (role("g", "pay ments", &["seal.admin"]), "roles[0].team"),
            (role("g", "pay/x", &["seal.admin"]), "roles[0].team"),
            (role("g", "", &["seal.admin"]), "roles[0].team"),
            (
                role("g", "payments", &["seal.approvals.read"]),
                "roles[0].scopes",
            ),
            (
                role("g", "payments", &["payments/seal.admin"]),
                "roles[0].scopes",
            ),
            (role("g", "payments", &[]), "roles[0].scopes"),
            (role("", "payments", &["seal.admin"]), "roles[0].group"),
        ];
        for (bad, key) in cases {
            let err = Roles::new(std::slice::from_ref(&bad)).unwrap_err();
            assert!(
                err.starts_with(&format!("operator_auth.{key}")),
                "{bad:?}: {err}"
            );
        }
        let typo: Result<RoleConfig, _> =
            serde_json::from_value(serde_json::json!({"group": "g", "team": "*", "scope": []}));
        assert!(typo.is_err());
    }
}
