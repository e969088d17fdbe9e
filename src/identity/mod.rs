//! Who a caller of the control API is (SPEC 16): their identity (`iss`, `sub`, `name`), how it was
//! vouched for (`via`), and the scopes they hold per team. Every control API handler receives a
//! [`Caller`] and asks it before it reads or changes an object of a team.

pub mod console_session;
pub mod login;
pub mod oidc;
mod roles;
mod scope;
mod start_budget;

use serde::{Deserialize, Serialize};

use crate::error::{ApiError, Code};

pub use console_session::{ConsoleSessions, Person};
pub use login::stored_credential;
pub use oidc::{IdTokenCheck, Oidc, OidcConfig};
pub use roles::{RoleConfig, Roles};
pub use scope::{
    is_team_name, scopes, TeamFilter, TeamScope, TeamScopes, Teams, DEFAULT_TEAM,
    MAX_TEAM_NAME_BYTES,
};
pub use start_budget::StartBudget;

/// The `iss` of an operator token that names none (one minted with `sealgate token operator` and no
/// issuer): the identity is then vouched for by the gateway's own key configuration only.
pub const LOCAL_ISSUER: &str = "urn:sealgate:local";

/// How a person's identity was verified (SPEC 13 r4): signed in with the identity provider, a token
/// verified with a key set fetched from a URL, or a token verified with a configured key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    Oidc,
    Jwks,
    Key,
}

/// A verified person or service: `{iss, sub}` is who; `name` is shown beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Identity {
    pub iss: String,
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub via: Via,
}

impl Identity {
    /// The same person: `name` and `via` do not take part.
    pub fn same_person(&self, other: &Identity) -> bool {
        self.iss == other.iss && self.sub == other.sub
    }
}

/// An authenticated caller of the control API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub identity: Identity,
    pub scopes: TeamScopes,
}

impl Caller {
    pub fn may(&self, team: &str, scope: &str) -> bool {
        self.scopes.allows(team, scope)
    }

    /// 403 (6002) unless `scope` is held for `team`.
    pub fn require(&self, team: &str, scope: &str) -> Result<(), ApiError> {
        if self.may(team, scope) {
            return Ok(());
        }
        Err(ApiError::new(
            Code::OperatorForbidden,
            format!("the caller lacks scope {scope} for team {team}"),
        ))
    }

    /// 403 (6002) unless `scope` is held for at least one team: the gate of a listing, which then
    /// holds only the teams of [`Caller::teams_with`].
    pub fn require_some(&self, scope: &str) -> Result<TeamFilter, ApiError> {
        let teams = self.scopes.teams_with(scope);
        if teams.is_empty() {
            return Err(ApiError::new(
                Code::OperatorForbidden,
                format!("the caller lacks scope {scope}"),
            ));
        }
        Ok(teams)
    }

    /// 403 (6002) unless `scope` is held for every team: gateway-wide things (the metrics of all teams).
    pub fn require_everywhere(&self, scope: &str) -> Result<(), ApiError> {
        if self.scopes.allows_everywhere(scope) {
            return Ok(());
        }
        Err(ApiError::new(
            Code::OperatorForbidden,
            format!("the caller lacks scope {scope} for every team"),
        ))
    }

    /// For one object of `team`: 404 (6003, `not_found`'s message) when the caller may not read it, so
    /// that one team cannot learn what another has (SPEC 16); then 403 unless `scope` is held there.
    pub fn require_visible(
        &self,
        team: &str,
        read_scope: &str,
        scope: &str,
        not_found: impl FnOnce() -> ApiError,
    ) -> Result<(), ApiError> {
        if !self.may(team, read_scope) && !self.may(team, scope) {
            return Err(not_found());
        }
        self.require(team, scope)
    }

    pub fn teams_with(&self, scope: &str) -> TeamFilter {
        self.scopes.teams_with(scope)
    }

    /// `seal.admin` on every team.
    pub fn is_admin(&self) -> bool {
        self.scopes.is_admin()
    }

    /// The `sub`, for records that keep only it.
    pub fn sub(&self) -> &str {
        &self.identity.sub
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(scope_claim: &[&str]) -> Caller {
        Caller {
            identity: Identity {
                iss: LOCAL_ISSUER.into(),
                sub: "ann".into(),
                name: None,
                via: Via::Key,
            },
            scopes: TeamScopes::from_claim(scope_claim.iter().copied()),
        }
    }

    #[test]
    fn an_identity_is_written_without_an_absent_name_and_compared_by_iss_and_sub() {
        let ann = caller(&[]).identity;
        assert_eq!(
            serde_json::to_value(&ann).unwrap(),
            serde_json::json!({"iss": LOCAL_ISSUER, "sub": "ann", "via": "key"})
        );
        let same = Identity {
            name: Some("Ann".into()),
            via: Via::Oidc,
            ..ann.clone()
        };
        assert!(ann.same_person(&same));
        assert!(!ann.same_person(&Identity {
            iss: "https://idp".into(),
            ..ann.clone()
        }));
    }

    #[test]
    fn another_teams_object_is_not_found_and_a_visible_one_without_scope_is_forbidden() {
        let reader = caller(&["payments/seal.approval.read"]);
        let missing = || ApiError::new(Code::NotFound, "no approval x");
        let err = reader
            .require_visible(
                "ops",
                scopes::APPROVAL_READ,
                scopes::APPROVAL_DECIDE,
                missing,
            )
            .unwrap_err();
        assert_eq!(err.code, Code::NotFound);
        let err = reader
            .require_visible(
                "payments",
                scopes::APPROVAL_READ,
                scopes::APPROVAL_DECIDE,
                missing,
            )
            .unwrap_err();
        assert_eq!(err.code, Code::OperatorForbidden);
        assert!(reader
            .require_visible(
                "payments",
                scopes::APPROVAL_READ,
                scopes::APPROVAL_READ,
                missing
            )
            .is_ok());
        assert!(reader.require_some(scopes::APPROVAL_DECIDE).is_err());
        assert!(reader.require_everywhere(scopes::APPROVAL_READ).is_err());
    }
}
