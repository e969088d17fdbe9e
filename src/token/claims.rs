//! Typed reading of JWT claims and the time check (check 4), shared by agent and operator tokens.

use serde_json::{Map, Value};

use super::{ConfigError, TokenError};
use crate::clock::{whole_seconds, Round};

/// Leeway beyond this is refused as a configuration mistake: it would all but switch expiry off.
pub(crate) const MAX_LEEWAY_SECS: u64 = 600;

/// A required, non-empty string claim.
pub(crate) fn required_string(
    claims: &Map<String, Value>,
    name: &str,
) -> Result<String, TokenError> {
    match claims.get(name) {
        None => Err(invalid(format!("token has no `{name}` claim"))),
        Some(Value::String(text)) if text.is_empty() => {
            Err(invalid(format!("token claim `{name}` is empty")))
        }
        Some(Value::String(text)) => Ok(text.clone()),
        Some(_) => Err(invalid(format!("token claim `{name}` is not a string"))),
    }
}

/// An optional string claim; when present it must be a non-empty string (`null` is not "absent").
pub(crate) fn optional_string(
    claims: &Map<String, Value>,
    name: &str,
) -> Result<Option<String>, TokenError> {
    if claims.contains_key(name) {
        required_string(claims, name).map(Some)
    } else {
        Ok(None)
    }
}

/// A required NumericDate as whole seconds; a fraction (RFC 7519 allows one) is rounded toward the
/// stricter reading: `Round::Down` for `exp` and `iat`, `Round::Up` for `nbf`.
pub(crate) fn required_seconds(
    claims: &Map<String, Value>,
    name: &str,
    round: Round,
) -> Result<i64, TokenError> {
    match claims.get(name) {
        None => Err(invalid(format!("token has no `{name}` claim"))),
        Some(Value::Number(number)) => whole_seconds(number, round).ok_or_else(|| {
            invalid(format!(
                "token claim `{name}` is not a number of seconds within range"
            ))
        }),
        Some(_) => Err(invalid(format!("token claim `{name}` is not a number"))),
    }
}

pub(crate) fn optional_seconds(
    claims: &Map<String, Value>,
    name: &str,
    round: Round,
) -> Result<Option<i64>, TokenError> {
    if claims.contains_key(name) {
        required_seconds(claims, name, round).map(Some)
    } else {
        Ok(None)
    }
}

/// `iss` must equal the configured issuer.
pub(crate) fn check_issuer(claims: &Map<String, Value>, expected: &str) -> Result<(), TokenError> {
    match claims.get("iss") {
        Some(Value::String(issuer)) if issuer == expected => Ok(()),
        Some(Value::String(issuer)) => Err(invalid(format!(
            "token issuer `{issuer}` is not the configured issuer `{expected}`"
        ))),
        Some(_) => Err(invalid("token claim `iss` is not a string")),
        None => Err(invalid(format!(
            "token has no `iss` claim; issuer `{expected}` is required"
        ))),
    }
}

/// `aud` must be the configured audience, or an array of strings that contains it (RFC 7519 4.1.3).
pub(crate) fn check_audience(
    claims: &Map<String, Value>,
    expected: &str,
) -> Result<(), TokenError> {
    let matches = match claims.get("aud") {
        None => {
            return Err(invalid(format!(
                "token has no `aud` claim; audience `{expected}` is required"
            )))
        }
        Some(Value::String(audience)) => audience == expected,
        Some(Value::Array(audiences)) => {
            let mut found = false;
            for audience in audiences {
                match audience {
                    Value::String(audience) => found |= audience == expected,
                    _ => {
                        return Err(invalid(
                            "token claim `aud` holds a value that is not a string",
                        ))
                    }
                }
            }
            found
        }
        Some(_) => {
            return Err(invalid(
                "token claim `aud` is neither a string nor an array of strings",
            ))
        }
    };
    if matches {
        Ok(())
    } else {
        Err(invalid(format!(
            "token audience does not include `{expected}`"
        )))
    }
}

/// When no audience is configured the claim is not compared, but its shape is still checked.
pub(crate) fn check_audience_shape(claims: &Map<String, Value>) -> Result<(), TokenError> {
    match claims.get("aud") {
        None | Some(Value::String(_)) => Ok(()),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => Ok(()),
        Some(_) => Err(invalid(
            "token claim `aud` is neither a string nor an array of strings",
        )),
    }
}

/// Check 4: expired when `now >= exp + leeway`; not yet valid when `nbf > now + leeway`.
pub(crate) fn check_time(
    exp: i64,
    nbf: Option<i64>,
    now: i64,
    leeway_secs: u64,
) -> Result<(), TokenError> {
    let leeway = i128::from(leeway_secs);
    if i128::from(now) >= i128::from(exp) + leeway {
        return Err(TokenError::Expired(format!(
            "token expired at {exp} (now {now}, leeway {leeway_secs} s)"
        )));
    }
    if let Some(nbf) = nbf {
        if i128::from(nbf) > i128::from(now) + leeway {
            return Err(TokenError::Expired(format!(
                "token is not valid before {nbf} (now {now}, leeway {leeway_secs} s)"
            )));
        }
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> TokenError {
    TokenError::Invalid(message.into())
}

/// Checks shared by the agent and operator sections.
pub(crate) fn validate_common(
    section: &'static str,
    issuer: Option<&str>,
    leeway_secs: u64,
) -> Result<(), ConfigError> {
    if issuer == Some("") {
        return Err(ConfigError::EmptyIssuer(section));
    }
    if leeway_secs > MAX_LEEWAY_SECS {
        return Err(ConfigError::Leeway {
            section,
            secs: leeway_secs,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn expiry_boundary_is_exclusive_of_exp_plus_leeway() {
        assert!(check_time(100, None, 99, 0).is_ok());
        assert!(matches!(
            check_time(100, None, 100, 0),
            Err(TokenError::Expired(_))
        ));
        assert!(check_time(100, None, 104, 5).is_ok());
        assert!(matches!(
            check_time(100, None, 105, 5),
            Err(TokenError::Expired(_))
        ));
    }

    #[test]
    fn nbf_in_the_future_counts_as_expired_and_leeway_applies() {
        assert!(
            matches!(check_time(200, Some(101), 100, 0), Err(TokenError::Expired(m)) if m.contains("not valid before"))
        );
        assert!(check_time(200, Some(100), 100, 0).is_ok());
        assert!(check_time(200, Some(105), 100, 5).is_ok());
        assert!(matches!(
            check_time(200, Some(106), 100, 5),
            Err(TokenError::Expired(_))
        ));
    }

    #[test]
    fn extreme_times_do_not_overflow() {
        assert!(check_time(i64::MAX, Some(i64::MIN), i64::MIN, u64::MAX).is_ok());
        assert!(matches!(
            check_time(i64::MIN, None, i64::MAX, 0),
            Err(TokenError::Expired(_))
        ));
    }

    #[test]
    fn seconds_are_numbers_and_fractions_round_toward_the_stricter_reading() {
        let claims = object(json!({"a": 5, "b": 5.5, "c": "5", "d": 1e30, "e": u64::MAX}));
        assert_eq!(required_seconds(&claims, "a", Round::Down), Ok(5));
        assert_eq!(required_seconds(&claims, "b", Round::Down), Ok(5));
        assert_eq!(required_seconds(&claims, "b", Round::Up), Ok(6));
        assert!(required_seconds(&claims, "c", Round::Down).is_err());
        assert!(required_seconds(&claims, "d", Round::Down).is_err());
        assert!(required_seconds(&claims, "e", Round::Down).is_err());
        assert!(required_seconds(&claims, "missing", Round::Down).is_err());
        assert_eq!(optional_seconds(&claims, "missing", Round::Up), Ok(None));
    }

    #[test]
    fn strings_must_be_non_empty_strings() {
        let claims = object(json!({"a": "x", "b": "", "c": 1, "d": null}));
        assert_eq!(required_string(&claims, "a"), Ok("x".to_owned()));
        assert!(required_string(&claims, "b").is_err());
        assert!(required_string(&claims, "c").is_err());
        assert!(optional_string(&claims, "d").is_err());
        assert_eq!(optional_string(&claims, "missing"), Ok(None));
    }

    #[test]
    fn audience_accepts_string_or_array_containing_it() {
        let wanted = "sealgate-agents";
        assert!(check_audience(&object(json!({"aud": wanted})), wanted).is_ok());
        assert!(check_audience(&object(json!({"aud": ["x", wanted]})), wanted).is_ok());
        assert!(check_audience(&object(json!({"aud": ["x"]})), wanted).is_err());
        assert!(check_audience(&object(json!({"aud": [wanted, 3]})), wanted).is_err());
        assert!(check_audience(&object(json!({"aud": "other"})), wanted).is_err());
        assert!(check_audience(&object(json!({})), wanted).is_err());
        assert!(check_audience_shape(&object(json!({"aud": {"x": 1}}))).is_err());
        assert!(check_audience_shape(&object(json!({"aud": ["x"]}))).is_ok());
    }

    #[test]
    fn issuer_must_match_exactly() {
        assert!(check_issuer(&object(json!({"iss": "orch"})), "orch").is_ok());
        assert!(check_issuer(&object(json!({"iss": "Orch"})), "orch").is_err());
        assert!(check_issuer(&object(json!({})), "orch").is_err());
        assert!(check_issuer(&object(json!({"iss": 1})), "orch").is_err());
    }
}
