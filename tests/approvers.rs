//! Several approvers and separation of duties (SPEC 13 r4), through the real binary: `approvers: 2`
//! needs two different people, the same person twice is refused, a deny by anyone denies, the session's
//! registrant may not decide; who decided is recorded as a verified identity, every operator event
//! carries its `actor`, and `sealgate approvals` decides from a terminal.

mod common;

use common::{code, run_cli_with_env, Gateway};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use sealgate::identity::LOCAL_ISSUER;
use serde_json::{json, Value};

const DECIDE: &str = "seal.approval.read seal.approval.decide";

/// The test tokens' subject, which registers every session below (`Gateway::admin`).
const REGISTRANT: &str = "test-operator";

fn payment(cents: u64) -> Value {
    json!({"to": "acct-7", "cents": cents})
}

/// A context whose `pay.*` calls need the grants of `approval`'s people.
fn two_people(approval: Value) -> Value {
    let mut rule = json!({"required": true});
    for (key, value) in approval.as_object().unwrap() {
        rule[key] = value.clone();
    }
    json!({"capabilities": [{"tool_pattern": "pay.*", "claim": "off", "approval": rule}]})
}

async fn put_context(gw: &Gateway, name: &str, spec: Value) -> (u16, Value) {
    gw.admin(
        Method::PUT,
        &format!("/v1/security-contexts/{name}"),
        Some(spec),
    )
    .await
}

/// Puts the context and registers a session on it (as [`REGISTRANT`]).
async fn session_on(
    gw: &Gateway,
    context: &str,
    spec: Value,
    session: &str,
) -> (SigningKey, String) {
    let (status, body) = put_context(gw, context, spec).await;
    assert!(status == 200 || status == 201, "{body}");
    gw.session_in(session, context).await
}

async fn call(gw: &Gateway, key: &SigningKey, token: &str, args: Value) -> (u16, Value) {
    gw.call_tool(key, token, "pay.send", args).await
}

/// The approval id of a 4003 answer.
fn requested(answer: &(u16, Value)) -> String {
    assert_eq!((answer.0, code(&answer.1)), (403, 4003), "{}", answer.1);
    answer.1["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn approval(gw: &Gateway, id: &str) -> Value {
    let token = gw.keys.operator_token("seal.approval.read");
    let path = format!("/v1/approvals/{id}");
    let (status, body) = gw.operator(Method::GET, &path, Some(&token), None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// `who` grants or denies (`verdict`) approval `id`.
async fn decide(gw: &Gateway, who: &str, id: &str, verdict: &str, body: Value) -> (u16, Value) {
    let token = gw.keys.operator_token_as(who, DECIDE);
    let path = format!("/v1/approvals/{id}/{verdict}");
    gw.operator(Method::POST, &path, Some(&token), Some(body))
        .await
}

/// The identity that an operator token minted with a configured key and no issuer verifies as.
fn by_key(sub: &str) -> Value {
    json!({"iss": LOCAL_ISSUER, "sub": sub, "via": "key"})
}

/// An event's `actor`: the identity, and the team of the object acted on (SPEC 16).
fn actor_by_key(sub: &str) -> Value {
    json!({"iss": LOCAL_ISSUER, "sub": sub, "via": "key", "team": "default"})
}

fn of_type(events: &[Value], kind: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .cloned()
        .collect()
}

/// The record without what reading it may change by itself (nothing here expires): for "nothing
/// changed" checks.
async fn unchanged_since(gw: &Gateway, id: &str, before: &Value) {
    assert_eq!(
        &approval(gw, id).await,
        before,
        "a refused decision changed the request"
    );
}

#[tokio::test]
async fn two_people_grant_one_after_the_other_and_the_call_then_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = session_on(&gw, "pay2", two_people(json!({"approvers": 2})), "exec-2").await;

    // The session shows who registered it.
    let (status, session) = gw
        .admin(Method::GET, "/v1/seal/sessions/exec-2", None)
        .await;
    assert_eq!(status, 200, "{session}");
    assert_eq!(session["registered_by"], by_key(REGISTRANT));

    // Evaluate says what the call will need.
    let (status, evaluated) = gw
        .admin(
            Method::POST,
            "/v1/security-contexts/pay2/evaluate",
            Some(json!({"tool": "pay.send", "arguments": payment(500)})),
        )
        .await;
    assert_eq!(status, 200, "{evaluated}");
    assert_eq!(
        evaluated["approval"],
        json!({"required": true, "expires_secs": 900, "approvers": 2,
               "separate_from_registrant": true})
    );

    let id = requested(&call(&gw, &key, &token, payment(500)).await);
    let fresh = approval(&gw, &id).await;
    assert_eq!(fresh["approvers"], 2);
    assert_eq!(fresh["separate_from_registrant"], true);
    assert_eq!(fresh["grants"], json!([]));

    // The first grant leaves it pending with that grant.
    let (status, once) = decide(&gw, "ann", &id, "grant", json!({"reason": "payee known"})).await;
    assert_eq!(status, 200, "{once}");
    assert_eq!(once["status"], "pending");
    assert_eq!(once["grants"].as_array().unwrap().len(), 1);
    assert_eq!(once["grants"][0]["by"], by_key("ann"));
    assert_eq!(once["grants"][0]["reason"], "payee known");
    assert!(once["grants"][0]["at"].as_str().unwrap().ends_with('Z'));
    assert!(once.get("decided_by").is_none(), "{once}");
    assert_eq!(requested(&call(&gw, &key, &token, payment(500)).await), id);
    assert_eq!(tool.count(), 0, "the call ran on one person's grant");

    // The same person again: 409, and nothing changes.
    let (status, again) = decide(&gw, "ann", &id, "grant", json!({})).await;
    assert_eq!((status, code(&again)), (409, 6004), "{again}");
    assert!(again["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already granted"));
    unchanged_since(&gw, &id, &once).await;

    // Asking for three people after the request was made changes nothing for it.
    let (status, body) = put_context(&gw, "pay2", two_people(json!({"approvers": 3}))).await;
    assert_eq!(status, 200, "{body}");

    let (status, granted) = decide(&gw, "bob", &id, "grant", json!({})).await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["status"], "granted");
    assert_eq!(granted["decided_by"], by_key("bob"));
    let grantors: Vec<_> = granted["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["by"]["sub"].clone())
        .collect();
    assert_eq!(grantors, [json!("ann"), json!("bob")]);

    let (status, ran) = call(&gw, &key, &token, payment(500)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(tool.count(), 1);
    assert_eq!(approval(&gw, &id).await["status"], "used");
    // One grant of two people, one execution: the same call again asks anew.
    let next = requested(&call(&gw, &key, &token, payment(500)).await);
    assert_ne!(next, id);
    assert_eq!(tool.count(), 1);
    assert_eq!(
        approval(&gw, &next).await["approvers"],
        3,
        "a new request takes the edit"
    );

    // Each grant is an event with its person as `actor`, and how many grants the request holds.
    let trail = gw.events("exec-2").await;
    let grants = of_type(&trail, "ApprovalGranted");
    let seen: Vec<_> = grants
        .iter()
        .map(|e| {
            (
                e["actor"].clone(),
                e["grants"].clone(),
                e["approvers"].clone(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (actor_by_key("ann"), json!(1), json!(2)),
            (actor_by_key("bob"), json!(2), json!(2))
        ]
    );
    let created = of_type(&trail, "SessionCreated");
    assert_eq!(created[0]["actor"], actor_by_key(REGISTRANT));
}

#[tokio::test]
async fn the_registrant_may_not_decide_and_a_deny_after_one_grant_denies() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) =
        session_on(&gw, "pay2", two_people(json!({"approvers": 2})), "exec-sod").await;
    let id = requested(&call(&gw, &key, &token, payment(9)).await);
    let before = approval(&gw, &id).await;

    for (verdict, body) in [("grant", json!({})), ("deny", json!({"reason": "mine"}))] {
        let (status, refused) = decide(&gw, REGISTRANT, &id, verdict, body).await;
        assert_eq!(
            (status, code(&refused)),
            (403, 6002),
            "{verdict}: {refused}"
        );
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("registered session") && message.contains("separate_from_registrant"),
            "{message}"
        );
        unchanged_since(&gw, &id, &before).await;
    }

    let (status, once) = decide(&gw, "ann", &id, "grant", json!({})).await;
    assert_eq!(
        (status, once["status"].as_str()),
        (200, Some("pending")),
        "{once}"
    );
    let (status, denied) = decide(&gw, "bob", &id, "deny", json!({"reason": "too much"})).await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(denied["status"], "denied");
    assert_eq!(denied["decided_by"], by_key("bob"));
    assert_eq!(denied["reason"], "too much");
    assert_eq!(
        denied["grants"][0]["by"],
        by_key("ann"),
        "the grant stays on record"
    );

    let (status, refused) = call(&gw, &key, &token, payment(9)).await;
    assert_eq!((status, code(&refused)), (403, 4004), "{refused}");
    assert_eq!(tool.count(), 0);
    let denials = of_type(&gw.events("exec-sod").await, "ApprovalDenied");
    assert_eq!(denials.len(), 1);
    assert_eq!(denials[0]["actor"], actor_by_key("bob"));
    assert_eq!(denials[0]["detail"], "too much");
}

#[tokio::test]
async fn without_separation_the_registrant_counts_as_one_of_the_people() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = two_people(json!({"approvers": 2, "separate_from_registrant": false}));
    let (key, token) = session_on(&gw, "pay2", spec, "exec-trust").await;
    let id = requested(&call(&gw, &key, &token, payment(3)).await);
    assert_eq!(
        decide(&gw, REGISTRANT, &id, "grant", json!({})).await.0,
        200
    );
    let (status, granted) = decide(&gw, "ann", &id, "grant", json!({})).await;
    assert_eq!(
        (status, granted["status"].as_str()),
        (200, Some("granted")),
        "{granted}"
    );
    assert_eq!(call(&gw, &key, &token, payment(3)).await.0, 200);
    assert_eq!(tool.count(), 1);
}

#[tokio::test]
async fn grants_at_once_by_different_people_all_count_and_one_person_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = session_on(
        &gw,
        "pay3",
        two_people(json!({"approvers": 3})),
        "exec-race",
    )
    .await;
    let id = requested(&call(&gw, &key, &token, payment(1)).await);

    let people = ["p1", "p2", "p3", "p4", "p5"];
    let answers = futures_util::future::join_all(
        people
            .iter()
            .map(|who| decide(&gw, who, &id, "grant", json!({}))),
    )
    .await;
    // Three grants make it granted; the two after them find it decided.
    let statuses: Vec<_> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        3,
        "{answers:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        2,
        "{answers:?}"
    );
    let record = approval(&gw, &id).await;
    assert_eq!(record["status"], "granted");
    assert_eq!(record["grants"].as_array().unwrap().len(), 3);

    let id = {
        assert_eq!(call(&gw, &key, &token, payment(1)).await.0, 200);
        requested(&call(&gw, &key, &token, payment(2)).await)
    };
    let twice =
        futures_util::future::join_all((0..4).map(|_| decide(&gw, "p1", &id, "grant", json!({}))))
            .await;
    let statuses: Vec<_> = twice
        .iter()
        .map(|(status, body)| (*status, code_or_zero(body)))
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| s.0 == 200).count(),
        1,
        "{twice:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == (409, 6004)).count(),
        3,
        "{twice:?}"
    );
    let record = approval(&gw, &id).await;
    assert_eq!(
        (
            record["status"].as_str(),
            record["grants"].as_array().unwrap().len()
        ),
        (Some("pending"), 1)
    );
}

fn code_or_zero(body: &Value) -> u64 {
    body["error"]["code"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn a_context_with_a_bad_approvers_value_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    for (approval, key) in [
        (json!({"approvers": 0}), "approvers"),
        (json!({"approvers": 11}), "approvers"),
        (json!({"approvers": "two"}), "approvers"),
        (
            json!({"separate_from_registrant": null}),
            "separate_from_registrant",
        ),
        (
            json!({"separate_from_registrant": "yes"}),
            "separate_from_registrant",
        ),
    ] {
        let (status, body) = put_context(&gw, "bad", two_people(approval.clone())).await;
        assert_eq!((status, code(&body)), (422, 6005), "{approval}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(key), "{approval}: {message}");
    }
    let (status, _) = gw
        .admin(Method::GET, "/v1/security-contexts/bad", None)
        .await;
    assert_eq!(status, 404, "a refused context was kept");
}

/// Runs `sealgate approvals ARGS` against `gw` as `who`; its exit code and what it printed.
fn approvals_cli(gw: &Gateway, who: &str, args: &[&str]) -> (i32, String) {
    let token = gw.keys.operator_token_as(who, DECIDE);
    let mut all = vec!["approvals"];
    all.extend_from_slice(args);
    all.extend(["--gateway", gw.base.as_str()]);
    run_cli_with_env(&all, &[("SEALGATE_OPERATOR_TOKEN", token.as_str())])
}

#[tokio::test]
async fn sealgate_approvals_lists_shows_grants_and_denies_from_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) =
        session_on(&gw, "pay2", two_people(json!({"approvers": 2})), "exec-cli").await;
    let id = requested(&call(&gw, &key, &token, payment(42)).await);

    let (status, listed) = approvals_cli(&gw, "ann", &["list", "--status", "pending"]);
    assert_eq!(status, 0, "{listed}");
    let line = listed
        .lines()
        .find(|l| l.contains(&id))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        line.contains("pending") && line.contains("0/2") && line.contains("pay.send"),
        "{line}"
    );
    let (status, shown) = approvals_cli(&gw, "ann", &["show", &id]);
    assert_eq!(status, 0, "{shown}");
    assert!(
        shown.contains(r#""cents":42"#) && shown.contains("exec-cli"),
        "{shown}"
    );

    // The token may come from a file too.
    let token_file = dir.path().join("ann.token");
    std::fs::write(
        &token_file,
        format!("{}\n", gw.keys.operator_token_as("ann", DECIDE)),
    )
    .unwrap();
    let (status, granted) = common::run_cli(&[
        "approvals",
        "grant",
        &id,
        "--reason",
        "looks right",
        "--gateway",
        &gw.base,
        "--token-file",
        token_file.to_str().unwrap(),
    ]);
    assert_eq!(status, 0, "{granted}");
    assert!(granted.contains("grant recorded; 1/2"), "{granted}");
    assert!(
        granted.contains("granted    by ann (key, urn:sealgate:local)"),
        "{granted}"
    );

    // Refusals: exit 1 with the gateway's code and message, and nothing changes.
    let before = approval(&gw, &id).await;
    let (status, again) = approvals_cli(&gw, "ann", &["grant", &id]);
    assert_eq!(status, 1, "{again}");
    assert!(
        again.contains("CONFLICT (6004)") && again.contains("already granted"),
        "{again}"
    );
    let (status, own) = approvals_cli(&gw, REGISTRANT, &["deny", &id, "--reason", "x"]);
    assert_eq!(status, 1, "{own}");
    assert!(
        own.contains("OPERATOR_FORBIDDEN (6002)") && own.contains("registered session"),
        "{own}"
    );
    let (status, missing) = approvals_cli(&gw, "ann", &["show", "no-such-id"]);
    assert_eq!(status, 1, "{missing}");
    assert!(missing.contains("NOT_FOUND (6003)"), "{missing}");
    unchanged_since(&gw, &id, &before).await;

    // Usage errors: exit 2, before anything is sent.
    let (status, usage) = approvals_cli(&gw, "ann", &["deny", &id]);
    assert_eq!(status, 2, "a deny needs --reason: {usage}");
    let (status, usage) = approvals_cli(&gw, "ann", &["list", "--status", "waiting"]);
    assert_eq!(status, 2, "{usage}");
    let (status, usage) = common::run_cli(&["approvals", "list", "--gateway", &gw.base]);
    assert_eq!(status, 2, "{usage}");
    assert!(usage.contains("SEALGATE_OPERATOR_TOKEN"), "{usage}");
    unchanged_since(&gw, &id, &before).await;

    // A deny, answered as JSON for scripts.
    let (status, denied) = approvals_cli(
        &gw,
        "bob",
        &["deny", &id, "--reason", "not today", "--json"],
    );
    assert_eq!(status, 0, "{denied}");
    let denied: Value = serde_json::from_str(&denied).unwrap_or_else(|e| panic!("{e}: {denied}"));
    assert_eq!(denied["status"], "denied");
    assert_eq!(denied["decided_by"], by_key("bob"));
    assert_eq!(call(&gw, &key, &token, payment(42)).await.0, 403);
    assert_eq!(tool.count(), 0);
}
