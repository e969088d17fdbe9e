//! How the argument checks find the arguments they read (SPEC 6.3 r3): by name, without regard to
//! ASCII case. Many tools' JSON decoders (Go's `encoding/json`, for one) hand `{"Path": …}` to a
//! field named `path`, so a check that looked up `path` exactly would pass what the tool then reads.
//! The gateway refuses `arguments` holding two names equal under case folding (1000) before any
//! check runs; the lookups here stay safe without that rule too.

use serde_json::{Map, Value};

/// The arguments whose name equals one of `names` under ASCII case folding, as given (name, value).
pub fn named<'a, 'n, N: AsRef<str>>(
    arguments: &'a Map<String, Value>,
    names: &'n [N],
) -> impl Iterator<Item = (&'a str, &'a Value)> + use<'a, 'n, N> {
    arguments
        .iter()
        .filter(|(key, _)| {
            names
                .iter()
                .any(|name| name.as_ref().eq_ignore_ascii_case(key))
        })
        .map(|(key, value)| (key.as_str(), value))
}

/// Each value a check reads in the arguments named `names`: with its argument's name and, inside an array,
/// its index. A lone value is read as an array of one.
pub fn each_value<'a, 'n, N: AsRef<str>>(
    arguments: &'a Map<String, Value>,
    names: &'n [N],
) -> impl Iterator<Item = (&'a str, Option<usize>, &'a Value)> + use<'a, 'n, N> {
    named(arguments, names).flat_map(|(key, value)| {
        let (values, in_array): (&[Value], bool) = match value {
            Value::Array(items) => (items, true),
            single => (std::slice::from_ref(single), false),
        };
        let index = move |index| in_array.then_some(index);
        values
            .iter()
            .enumerate()
            .map(move |(at, item)| (key, index(at), item))
    })
}

/// Two arguments whose names are equal under ASCII case folding, where a check reads one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("two arguments are named {0:?} under ASCII case folding")]
pub struct TwoNamed(pub String);

/// The argument named `name` under ASCII case folding; two of them are refused, since a tool would
/// read only one and which one is its own business.
pub fn single<'a>(
    arguments: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a Value>, TwoNamed> {
    let mut found = named(arguments, std::slice::from_ref(&name)).map(|(_, value)| value);
    let first = found.next();
    match found.next() {
        Some(_) => Err(TwoNamed(name.to_owned())),
        None => Ok(first),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn names_match_without_regard_to_ascii_case() {
        let arguments =
            object(json!({"Path": 1, "URL": 2, "paths": 3, "pathx": 4, "PATH\u{0130}": 5}));
        let mut found: Vec<&str> = named(&arguments, &["path", "paths", "url"])
            .map(|(name, _)| name)
            .collect();
        found.sort_unstable();
        assert_eq!(found, ["Path", "URL", "paths"]);
    }

    #[test]
    fn a_single_argument_is_found_by_any_case_and_two_are_refused() {
        let one = object(json!({"Command": "git status"}));
        assert_eq!(single(&one, "command"), Ok(Some(&json!("git status"))));
        assert_eq!(single(&one, "args"), Ok(None));
        let two = object(json!({"args": [], "ARGS": ["x"]}));
        assert_eq!(
            single(&two, "args").map_err(|e| e.to_string()),
            Err("two arguments are named \"args\" under ASCII case folding".to_string())
        );
    }
}
