//! Property tests for lexical path normalisation and the `/workspace` allowlist (SPEC 6.3 paths).

use proptest::prelude::*;
use sealgate::policy::paths::{normalize_absolute, PathRule};
use serde_json::{json, Map, Value};

/// Segments chosen to hit every normalisation branch and the component-boundary cases.
fn segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "a",
        ".",
        "..",
        "",
        "workspace",
        "workspace2",
        "work",
        "/",
        "...",
        "..a",
        "~",
        "%2e%2e",
        "b\\c",
        " ",
        "etc",
    ])
}

/// Paths made of those segments, joined by `/`, with or without a leading `/`.
fn segmented_path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(segment(), 0..10)).prop_map(|(absolute, segments)| {
        let joined = segments.join("/");
        if absolute {
            format!("/{joined}")
        } else {
            joined
        }
    })
}

fn workspace_rule() -> PathRule {
    match PathRule::new(&["/workspace".to_string()], None) {
        Ok(rule) => rule,
        Err(problem) => panic!("allowlist refused: {problem}"),
    }
}

fn call(path: &str) -> Map<String, Value> {
    let mut arguments = Map::new();
    arguments.insert("path".to_string(), json!(path));
    arguments
}

/// An independent model: resolve components with a stack, refusing a climb above the root.
fn model(path: &str) -> Option<Vec<&str>> {
    let rest = path.strip_prefix('/')?;
    let mut stack = Vec::new();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                stack.pop()?;
            }
            name => stack.push(name),
        }
    }
    Some(stack)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn accepted_paths_normalise_inside_workspace(path in segmented_path()) {
        let rule = workspace_rule();
        if rule.check(&call(&path)).is_ok() {
            let normalised = normalize_absolute(&path);
            prop_assert!(normalised.is_ok(), "accepted {path:?} but normalisation failed");
            let normalised = normalised.unwrap_or_default();
            prop_assert!(
                normalised == "/workspace" || normalised.starts_with("/workspace/"),
                "accepted {path:?} normalised to {normalised:?}"
            );
        }
    }

    #[test]
    fn acceptance_agrees_with_the_component_model(path in segmented_path()) {
        let expected = !path.contains('\\')
            && model(&path).is_some_and(|components| components.first() == Some(&"workspace"));
        prop_assert_eq!(workspace_rule().check(&call(&path)).is_ok(), expected, "path {:?}", path);
    }

    #[test]
    fn normalisation_is_idempotent_and_canonical(path in segmented_path()) {
        if let Ok(once) = normalize_absolute(&path) {
            prop_assert_eq!(normalize_absolute(&once), Ok(once.clone()));
            prop_assert!(once.starts_with('/'));
            prop_assert!(!once.contains("//"), "{once:?}");
            prop_assert!(once == "/" || !once.ends_with('/'), "{once:?}");
            prop_assert!(
                once.split('/').skip(1).all(|c| c != "." && c != ".."),
                "{once:?}"
            );
        }
    }

    #[test]
    fn arbitrary_text_never_panics(path in any::<String>()) {
        if let Ok(once) = normalize_absolute(&path) {
            prop_assert_eq!(normalize_absolute(&once), Ok(once.clone()));
        }
        let verdict = workspace_rule().check(&call(&path));
        if verdict.is_ok() {
            let normalised = normalize_absolute(&path).unwrap_or_default();
            prop_assert!(normalised == "/workspace" || normalised.starts_with("/workspace/"));
        }
    }
}
