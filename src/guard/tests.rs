use super::*;
use proptest::prelude::*;
use serde_json::json;

const GITHUB: &str = "ghp_abcdefghijklmnopqrstuvwxyz0123456789";

fn guard() -> Guard {
    Guard::new(&AnswerGuardConfig::default()).unwrap()
}

fn text_answer(texts: &[&str]) -> Value {
    let content: Vec<Value> = texts
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    json!({"jsonrpc": "2.0", "id": 1, "result": {"content": content}})
}

#[test]
fn guard_redacts_the_gateways_credentials_whole_and_without_their_scheme() {
    let credentials = Credentials::new(["Bearer tool-secret", "tool-secret", "short"]).unwrap();
    let mut answer = text_answer(&["sent Bearer tool-secret and tool-secret; short stays"]);
    let report = super::answer(&mut answer, Some(&credentials), guard().rules(None));
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "sent [REDACTED] and [REDACTED]; short stays"
    );
    assert_eq!(report.detail(), "credential=2 redacted");
    assert!(!report.withheld());
}

#[test]
fn guard_redacts_refuses_or_ignores_secrets_by_mode() {
    let text = format!("token {GITHUB} end");
    let gateway = guard();
    let mut answer = text_answer(&[&text]);
    let report = super::answer(&mut answer, None, gateway.rules(None));
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "token [REDACTED:github_token] end"
    );
    assert_eq!(report.detail(), "github_token=1 redacted");

    let refuse = Overrides::new(&AnswerGuardSpec {
        secrets: Some(SecretsMode::Refuse),
        ..Default::default()
    })
    .unwrap();
    let report = super::answer(
        &mut text_answer(&[&text]),
        None,
        gateway.rules(Some(&refuse)),
    );
    assert!(report.withheld());
    assert_eq!(report.kinds(), vec!["github_token"]);

    let off = Overrides::new(&AnswerGuardSpec {
        secrets: Some(SecretsMode::Off),
        ..Default::default()
    })
    .unwrap();
    let mut answer = text_answer(&[&text]);
    assert!(super::answer(&mut answer, None, gateway.rules(Some(&off))).is_clean());
    assert_eq!(answer["result"]["content"][0]["text"], text.as_str());
}

#[test]
fn guard_strips_hidden_characters_before_looking_for_secrets() {
    // A zero-width joiner inside the token would otherwise hide it.
    let hidden = format!("{}\u{200d}{}\u{e0041}", &GITHUB[..10], &GITHUB[10..]);
    let mut answer = text_answer(&[&hidden]);
    let report = super::answer(&mut answer, None, guard().rules(None));
    assert_eq!(
        answer["result"]["content"][0]["text"],
        "[REDACTED:github_token]"
    );
    assert_eq!(
        report.detail(),
        "github_token=1 redacted, invisible=2 stripped"
    );
}

#[test]
fn guard_reads_structured_content_values_and_error_messages_but_never_keys() {
    let key = format!("{GITHUB}\u{200b}");
    let mut answer = json!({"jsonrpc": "2.0", "id": 1, "result": {
        "content": [{"type": "image", "data": GITHUB}, {"type": "text", "text": 7}],
        "structuredContent": {key.clone(): [GITHUB, {"n": 1, "s": "a\u{202e}b"}]},
        "other": GITHUB,
    }});
    super::answer(&mut answer, None, guard().rules(None));
    let structured = &answer["result"]["structuredContent"][&key];
    assert_eq!(structured[0], "[REDACTED:github_token]");
    assert_eq!(structured[1]["s"], "ab");
    assert_eq!(
        answer["result"]["content"][0]["data"], GITHUB,
        "images are not text"
    );
    assert_eq!(
        answer["result"]["other"], GITHUB,
        "only content and structuredContent"
    );

    let mut error = json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": GITHUB}});
    super::answer(&mut error, None, guard().rules(None));
    assert_eq!(error["error"]["message"], "[REDACTED:github_token]");
}

#[test]
fn guard_cannot_see_a_secret_split_across_two_items() {
    let mut answer = text_answer(&[&GITHUB[..20], &GITHUB[20..]]);
    assert!(super::answer(&mut answer, None, guard().rules(None)).is_clean());
}

#[test]
fn guard_leaves_nfc_and_nfd_as_they_are() {
    let mut answer = text_answer(&["caf\u{e9}", "cafe\u{301}"]);
    assert!(super::answer(&mut answer, None, guard().rules(None)).is_clean());
    assert_eq!(answer["result"]["content"][1]["text"], "cafe\u{301}");
}

#[test]
fn guard_capability_patterns_replace_the_gateways() {
    let gateway = Guard::new(&AnswerGuardConfig {
        secret_patterns: BTreeMap::from([("ticket".into(), "TKT-[0-9]{6}".into())]),
        ..Default::default()
    })
    .unwrap();
    let mut answer = text_answer(&["TKT-123456"]);
    let report = super::answer(&mut answer, None, gateway.rules(None));
    assert_eq!(answer["result"]["content"][0]["text"], "[REDACTED:ticket]");
    assert_eq!(report.detail(), "ticket=1 redacted");
    let none = Overrides::new(&AnswerGuardSpec {
        secret_patterns: Some(BTreeMap::new()),
        ..Default::default()
    })
    .unwrap();
    assert!(super::answer(
        &mut text_answer(&["TKT-123456"]),
        None,
        gateway.rules(Some(&none))
    )
    .is_clean());
}

/// The answer with every string the guard may rewrite replaced by a placeholder, everything else as it was.
fn shape(value: &Value) -> Value {
    let mut value = value.clone();
    for_each_text(&mut value, |text| *text = String::from("§"));
    value
}

fn json_value() -> impl Strategy<Value = Value> {
    let words = prop_oneof![
        Just(GITHUB.to_owned()),
        Just("a\u{200d}b\u{e0020}".to_owned()),
        Just("Bearer tool-secret".to_owned()),
        Just("AKIAIOSFODNN7EXAMPLE".to_owned()),
        "[a-z \u{200b}]{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        words.clone().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(words.clone(), inner.clone(), 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            (words.clone(), any::<bool>()).prop_map(|(text, is_text)| {
                json!({"type": if is_text { "text" } else { "image" }, "text": text})
            }),
        ]
    })
}

proptest! {
    /// Whatever the answer, the guard only ever rewrites the strings it reads: keys, numbers, arrays and
    /// objects, and every other string, stay as they were.
    #[test]
    fn guard_never_changes_the_json_structure(
        content in prop::collection::vec(json_value(), 0..4),
        structured in json_value(),
        other in json_value(),
    ) {
        let original = json!({"jsonrpc": "2.0", "id": 1, "result": {
            "content": content, "structuredContent": structured, "other": other}});
        let credentials = Credentials::new(["Bearer tool-secret"]).unwrap();
        let mut guarded = original.clone();
        answer(&mut guarded, Some(&credentials), guard().rules(None));
        prop_assert_eq!(shape(&guarded), shape(&original));
    }
}
