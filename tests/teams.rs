//! Teams (SPEC 16) through the real binary: contexts say their team, sessions, claims, approvals and
//! audit events carry it, and every control API call checks the caller's scope for the team of the
//! object it reads or changes. Another team's object answers 404 like a missing one and stays as it
//! was; lists, queries and exports hold only the caller's teams.

mod common;

use common::{code, tool_call, Gateway};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use serde_json::{json, Value};

/// Two teams' contexts, as files: the same rules, one for `payments` and one for `ops`.
fn team_policy(name: &str, team: &str) -> String {
    format!(
        r#"
name: {name}
team: {team}
capabilities:
  - tool_pattern: "tool.*"
    claim: auto
  - tool_pattern: "pay.*"
    claim: off
    approval: {{ required: true }}
"#
    )
}

/// Every scope of one team, for "a scope bound to one team used on another team's object".
const PAYMENTS_ALL: &str = "payments/seal.admin";

/// A gateway with the contexts `pay` (team payments) and `ops` (team ops), a session on each, a claim
/// and an approval request made by each session's calls.
struct Teams {
    gw: Gateway,
    _tool: std::sync::Arc<common::Tool>,
    /// Each session's agent key and token.
    agents: Vec<(SigningKey, String)>,
    claim: [String; 2],
    approval: [String; 2],
}

const SESSIONS: [&str; 2] = ["pay-1", "ops-1"];

impl Teams {
    async fn start(dir: &std::path::Path) -> Teams {
        std::fs::create_dir_all(dir.join("policies")).unwrap();
        std::fs::write(
            dir.join("policies/pay.yaml"),
            team_policy("pay", "payments"),
        )
        .unwrap();
        std::fs::write(dir.join("policies/ops.yaml"), team_policy("ops", "ops")).unwrap();
        let (gw, tool) = Gateway::start(dir, "").await;
        let mut claim = Vec::new();
        let mut approval = Vec::new();
        let mut agents = Vec::new();
        for (id, context) in SESSIONS.iter().zip(["pay", "ops"]) {
            let (key, token) = gw.session_in(id, context).await;
            claim.push(claimed(&gw, &key, &token).await);
            approval.push(requested(&gw, &key, &token).await);
            agents.push((key, token));
        }
        Teams {
            gw,
            _tool: tool,
            agents,
            claim: [claim[0].clone(), claim[1].clone()],
            approval: [approval[0].clone(), approval[1].clone()],
        }
    }

    async fn call(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.gw.operator(method, path, Some(token), body).await
    }

    async fn as_admin(&self, path: &str) -> Value {
        let (status, body) = self.gw.admin(Method::GET, path, None).await;
        assert_eq!(status, 200, "{path}: {body}");
        body
    }
}

/// A call that takes a claim (`claim: auto`); its request id.
async fn claimed(gw: &Gateway, key: &SigningKey, token: &str) -> String {
    let (status, body) = gw
        .call(key, token, tool_call(1, "tool.echo", json!({"n": 1})))
        .await;
    assert_eq!(status, 200, "{body}");
    body["receipt"]["request_id"].as_str().unwrap().to_owned()
}

/// A call held for a person (4003); its approval id.
async fn requested(gw: &Gateway, key: &SigningKey, token: &str) -> String {
    let (status, body) = gw
        .call(key, token, tool_call(2, "pay.send", json!({"cents": 5})))
        .await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    body["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// What `path` answers about `id`, and what it answers about an id that exists nowhere: the same 404
/// (6003), the same message but for the id.
async fn not_found_like_a_missing_one(
    teams: &Teams,
    token: &str,
    method: Method,
    path: &str,
    id: &str,
    body: Option<Value>,
) {
    let (status, answer) = teams.call(token, method.clone(), path, body.clone()).await;
    assert_eq!(
        (status, code(&answer)),
        (404, 6003),
        "{method} {path}: {answer}"
    );
    let missing = path.replace(id, "no-such-id");
    let (status, absent) = teams.call(token, method.clone(), &missing, body).await;
    assert_eq!(
        (status, code(&absent)),
        (404, 6003),
        "{method} {missing}: {absent}"
    );
    assert_eq!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .replace(id, "no-such-id"),
        absent["error"]["message"].as_str().unwrap(),
        "{method} {path}"
    );
}

/// The chain's events but its checkpoints (an export signs one each time).
async fn trail(teams: &Teams) -> Vec<Value> {
    teams
        .gw
        .export()
        .await
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["type"] != "AuditCheckpoint")
        .collect()
}

/// A refusal with the status and code expected, whose message names `needle`.
fn refused_naming(status: u16, body: &Value, expected: (u16, u64), needle: &str) {
    assert_eq!((status, code(body)), expected, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{needle:?} not in {body}");
}

fn items(page: &Value) -> Vec<Value> {
    page["items"].as_array().unwrap().clone()
}

/// The values of `name` in `items`, sorted; `""` where an item has none.
fn field(items: &[Value], name: &str) -> Vec<String> {
    let mut values: Vec<String> = items
        .iter()
        .map(|item| item[name].as_str().unwrap_or("").to_owned())
        .collect();
    values.sort();
    values
}

#[tokio::test]
async fn objects_carry_the_team_of_their_context_in_records_views_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let context = teams.as_admin("/v1/security-contexts/ops").await;
    assert_eq!(context["team"], "ops");
    let default = teams.as_admin("/v1/security-contexts/test").await;
    assert_eq!(
        default["team"], "default",
        "a context without team: is default's"
    );

    for (index, (session, team)) in SESSIONS.iter().zip(["payments", "ops"]).enumerate() {
        let view = teams
            .as_admin(&format!("/v1/seal/sessions/{session}"))
            .await;
        assert_eq!(view["team"], team);
        let claim = teams
            .as_admin(&format!("/v1/claims/{}", teams.claim[index]))
            .await;
        assert_eq!(claim["team"], team);
        let approval = teams
            .as_admin(&format!("/v1/approvals/{}", teams.approval[index]))
            .await;
        assert_eq!(approval["team"], team);
        // A call refused once its session is known (signed with another key): its team's event too.
        let stranger = sealgate::envelope::generate_signing_key().unwrap();
        let token = &teams.agents[index].1;
        let (status, _) = teams
            .gw
            .call(&stranger, token, tool_call(3, "tool.echo", json!({})))
            .await;
        assert_eq!(status, 401);
        // Every event about the session, from its registration to its calls and approvals.
        let events = teams.gw.events(session).await;
        let types = field(&events, "type");
        for expected in [
            "SessionCreated",
            "ToolCallAuthorized",
            "ToolCallCompleted",
            "ApprovalRequested",
            "SignatureVerificationFailed",
        ] {
            assert!(
                types.iter().any(|t| t == expected),
                "{expected} in {types:?}"
            );
        }
        for event in &events {
            assert_eq!(event["team"], team, "{event}");
        }
    }

    // A revocation, a call on the revoked session, a decision, and a context written over the API:
    // their events are their team's too.
    let (status, _) = teams
        .gw
        .admin(
            Method::DELETE,
            &format!("/v1/seal/sessions/{}", SESSIONS[0]),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (key, token) = &teams.agents[0];
    let (status, body) = teams
        .gw
        .call(key, token, tool_call(4, "tool.echo", json!({})))
        .await;
    assert_eq!((status, code(&body)), (401, 1006), "{body}");
    let events = teams.gw.events(SESSIONS[0]).await;
    let last_two = &events[events.len() - 2..];
    assert_eq!(
        field(last_two, "type"),
        ["EnvelopeRejected", "SessionRevoked"]
    );
    assert_eq!(field(last_two, "team"), ["payments", "payments"]);
    let (status, _) = teams
        .gw
        .admin(
            Method::POST,
            &format!("/v1/approvals/{}/grant", teams.approval[1]),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200);
    let granted = teams
        .gw
        .audit_events(&format!("type=ApprovalGranted&session_id={}", SESSIONS[1]))
        .await;
    assert_eq!(granted[0]["team"], "ops");
    let (status, put) = teams
        .gw
        .admin(
            Method::PUT,
            "/v1/security-contexts/ops-api",
            Some(json!({"team": "ops", "capabilities": []})),
        )
        .await;
    assert_eq!((status, &put["team"]), (201, &json!("ops")), "{put}");
    let changed = teams
        .gw
        .audit_events("type=SecurityContextChanged&limit=1")
        .await;
    let event = &changed[0];
    assert_eq!(
        (&event["scp"], &event["team"], &event["actor"]["team"]),
        (&json!("ops-api"), &json!("ops"), &json!("ops"))
    );
    assert_eq!(event["context_version"], put["version"], "{event}");
}

#[tokio::test]
async fn another_teams_session_approval_claim_context_and_events_are_not_found_and_stay_unchanged()
{
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let payments = teams.gw.keys.operator_token(PAYMENTS_ALL);
    let (ops_session, ops_claim, ops_approval) = (SESSIONS[1], &teams.claim[1], &teams.approval[1]);
    let before = trail(&teams).await;

    let session = format!("/v1/seal/sessions/{ops_session}");
    not_found_like_a_missing_one(&teams, &payments, Method::GET, &session, ops_session, None).await;
    not_found_like_a_missing_one(
        &teams,
        &payments,
        Method::DELETE,
        &session,
        ops_session,
        None,
    )
    .await;
    let claim = format!("/v1/claims/{ops_claim}");
    not_found_like_a_missing_one(&teams, &payments, Method::GET, &claim, ops_claim, None).await;
    let released = json!({"outcome": "released", "evidence": "x"});
    not_found_like_a_missing_one(
        &teams,
        &payments,
        Method::POST,
        &format!("{claim}/resolve"),
        ops_claim,
        Some(released),
    )
    .await;
    let approval = format!("/v1/approvals/{ops_approval}");
    not_found_like_a_missing_one(
        &teams,
        &payments,
        Method::GET,
        &approval,
        ops_approval,
        None,
    )
    .await;
    for (verb, body) in [("grant", json!({})), ("deny", json!({"reason": "no"}))] {
        let path = format!("{approval}/{verb}");
        not_found_like_a_missing_one(
            &teams,
            &payments,
            Method::POST,
            &path,
            ops_approval,
            Some(body),
        )
        .await;
    }
    let context = "/v1/security-contexts/ops";
    not_found_like_a_missing_one(&teams, &payments, Method::GET, context, "ops", None).await;
    not_found_like_a_missing_one(&teams, &payments, Method::DELETE, context, "ops", None).await;
    let evaluate = json!({"tool": "tool.echo", "arguments": {}});
    not_found_like_a_missing_one(
        &teams,
        &payments,
        Method::POST,
        "/v1/security-contexts/ops/evaluate",
        "ops",
        Some(evaluate),
    )
    .await;
    // Taking over ops's context by writing it into payments: the write scope on payments is not enough.
    let stolen = json!({"team": "payments", "capabilities": [{"tool_pattern": "*"}]});
    let (status, body) = teams
        .call(&payments, Method::PUT, context, Some(stolen))
        .await;
    assert_eq!((status, code(&body)), (404, 6003), "{body}");
    // An event about ops's session, looked for by its session id.
    let (status, page) = teams
        .call(
            &payments,
            Method::GET,
            &format!("/v1/audit?session_id={ops_session}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(items(&page).is_empty(), "{page}");

    // Nothing changed: no event was written, and every object stands as it was.
    assert_eq!(trail(&teams).await, before);
    let view = teams.as_admin(&session).await;
    assert_eq!(view["status"], "active");
    assert_eq!(teams.as_admin(&approval).await["status"], "pending");
    assert_eq!(teams.as_admin(&claim).await["status"], "COMMITTED");
    let context = teams.as_admin(context).await;
    assert_eq!(
        (
            &context["team"],
            &context["capabilities"][0]["tool_pattern"]
        ),
        (&json!("ops"), &json!("tool.*"))
    );
}

/// What a listing shows `token`: the sorted values of `key`, and the teams of the items (`""` for an
/// event of no team), each once.
async fn listed(teams: &Teams, token: &str, path: &str, key: &str) -> (Vec<String>, Vec<String>) {
    let (status, page) = teams.call(token, Method::GET, path, None).await;
    assert_eq!(status, 200, "{path}: {page}");
    let mut seen_teams = field(&items(&page), "team");
    seen_teams.dedup();
    (field(&items(&page), key), seen_teams)
}

#[tokio::test]
async fn lists_and_queries_hold_only_the_callers_teams_and_an_unbound_scope_sees_all() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let reads = |team: &str| {
        [
            "seal.session.read",
            "seal.claim.read",
            "seal.approval.read",
            "seal.context.read",
            "seal.audit.read",
        ]
        .map(|scope| format!("{team}/{scope}"))
        .join(" ")
    };
    let token = |scopes: String| teams.gw.keys.operator_token(&scopes);
    let payments = token(reads("payments"));
    let ops = token(reads("ops"));
    let both = token(format!("{} {}", reads("payments"), reads("ops")));
    let star = token(reads("*"));
    let unbound = token(reads("*").replace("*/", ""));
    for (path, key) in [
        ("/v1/seal/sessions", "session_id"),
        ("/v1/claims", "request_id"),
        ("/v1/approvals", "approval_id"),
        ("/v1/security-contexts", "name"),
        ("/v1/audit?limit=1000", "type"),
    ] {
        assert_eq!(
            listed(&teams, &payments, path, key).await.1,
            ["payments"],
            "{path}"
        );
        assert_eq!(listed(&teams, &ops, path, key).await.1, ["ops"], "{path}");
        assert_eq!(
            listed(&teams, &both, path, key).await.1,
            ["ops", "payments"],
            "{path}"
        );
        // `*/SCOPE` and an unbound scope see every team.
        let all = listed(&teams, &star, path, key).await;
        assert_eq!(listed(&teams, &unbound, path, key).await, all, "{path}");
        assert!(
            all.1.contains(&"ops".to_owned()) && all.1.contains(&"payments".to_owned()),
            "{path}"
        );
    }
    let (names, _) = listed(&teams, &star, "/v1/security-contexts", "name").await;
    assert_eq!(names, ["ops", "other", "pay", "test"]);
    // Gateway-wide events (no team: a refusal before any session is known) are only for a caller who
    // reads every team.
    let (status, _) = teams.gw.post_raw(b"not json".to_vec()).await;
    assert_eq!(status, 400);
    let rejected = "/v1/audit?type=EnvelopeRejected";
    // The refusal of an unreadable body is recorded beside the answer, not before it.
    common::until(
        std::time::Duration::from_secs(10),
        "the refusal's event",
        || async { !listed(&teams, &star, rejected, "type").await.0.is_empty() },
    )
    .await;
    assert!(listed(&teams, &both, rejected, "type").await.0.is_empty());
}

#[tokio::test]
async fn registering_a_session_needs_the_create_scope_on_its_contexts_team() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let payments = teams.gw.keys.operator_token("payments/seal.session.create");
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let registration = |id: &str, context: &str| {
        json!({"session_id": id, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
               "security_context": context, "expires_at": sealgate::clock::now_secs() + 600})
    };
    // Another team's context is answered as an unknown one: its name tells nothing.
    let (status, refused) = teams
        .gw
        .register(Some(&payments), registration("s-ops", "ops"))
        .await;
    assert_eq!((status, code(&refused)), (422, 6005), "{refused}");
    let (_, unknown) = teams
        .gw
        .register(Some(&payments), registration("s-x", "nowhere"))
        .await;
    assert_eq!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .replace("ops", "nowhere"),
        unknown["error"]["message"].as_str().unwrap()
    );
    // Nor the default team's, which this token holds nothing of.
    let (status, _) = teams
        .gw
        .register(Some(&payments), registration("s-test", "test"))
        .await;
    assert_eq!(status, 422);
    // A team it can read but not register in: forbidden, saying which scope is missing.
    let reader = teams
        .gw
        .keys
        .operator_token("payments/seal.session.create ops/seal.context.read");
    let (status, forbidden) = teams
        .gw
        .register(Some(&reader), registration("s-ops", "ops"))
        .await;
    refused_naming(status, &forbidden, (403, 6002), "team ops");
    for id in ["s-ops", "s-test"] {
        let (status, _) = teams
            .gw
            .admin(Method::GET, &format!("/v1/seal/sessions/{id}"), None)
            .await;
        assert_eq!(status, 404, "{id} was not registered");
    }
    // Its own team's context: registered in that team.
    let (status, created) = teams
        .gw
        .register(Some(&payments), registration("s-pay", "pay"))
        .await;
    assert_eq!(
        (status, &created["team"]),
        (201, &json!("payments")),
        "{created}"
    );
    // An id another team holds is only taken: never its body, nor its token.
    let (status, taken) = teams
        .gw
        .register(Some(&payments), registration(SESSIONS[1], "pay"))
        .await;
    assert_eq!((status, code(&taken)), (409, 6004), "{taken}");
}

#[tokio::test]
async fn writing_a_context_needs_the_write_scope_on_its_team_before_and_after() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let payments = teams.gw.keys.operator_token("payments/seal.context.write");
    let path = "/v1/security-contexts/pay-api";
    let spec = |team: &str, pattern: &str| json!({"team": team, "capabilities": [{"tool_pattern": pattern}]});

    // Into a team the caller lacks: refused, nothing stored.
    let (status, body) = teams
        .call(&payments, Method::PUT, path, Some(spec("ops", "*")))
        .await;
    refused_naming(status, &body, (403, 6002), "team ops");
    let (status, _) = teams.gw.admin(Method::GET, path, None).await;
    assert_eq!(status, 404);

    // Into its own team: created there.
    let (status, created) = teams
        .call(
            &payments,
            Method::PUT,
            path,
            Some(spec("payments", "tool.*")),
        )
        .await;
    assert_eq!(
        (status, &created["team"]),
        (201, &json!("payments")),
        "{created}"
    );

    // Moved to a team it lacks: refused, the stored context unchanged.
    let (status, body) = teams
        .call(&payments, Method::PUT, path, Some(spec("ops", "*")))
        .await;
    assert_eq!((status, code(&body)), (403, 6002), "{body}");
    let stored = teams.as_admin(path).await;
    assert_eq!(stored["version"], created["version"]);
    assert_eq!(stored["team"], "payments");

    // A bad team name is the policy's error, naming it.
    let (status, body) = teams
        .call(&payments, Method::PUT, path, Some(spec("pay ments", "*")))
        .await;
    refused_naming(status, &body, (422, 6005), "\"pay ments\"");

    // Moving needs both teams; then the old team no longer finds it.
    let both = teams
        .gw
        .keys
        .operator_token("payments/seal.context.write ops/seal.context.write");
    let (status, moved) = teams
        .call(&both, Method::PUT, path, Some(spec("ops", "tool.*")))
        .await;
    assert_eq!((status, &moved["team"]), (200, &json!("ops")), "{moved}");
    let (status, body) = teams.call(&payments, Method::DELETE, path, None).await;
    assert_eq!((status, code(&body)), (404, 6003), "{body}");
    let (status, _) = teams.call(&both, Method::DELETE, path, None).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn standalone_claims_belong_to_the_team_of_the_services_scope() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let ops = teams
        .gw
        .keys
        .operator_token_as("ops-svc", "ops/seal.claim.resolve");
    let payments = teams
        .gw
        .keys
        .operator_token_as("ops-svc", "payments/seal.claim.resolve");
    let several = teams.gw.keys.operator_token_as(
        "ops-svc",
        "ops/seal.claim.resolve payments/seal.claim.resolve",
    );
    let unbound = teams
        .gw
        .keys
        .operator_token_as("svc", "seal.claim.resolve seal.claim.read");
    let claim = |id: &str, team: Option<&str>| {
        let mut body = json!({"request_id": id, "action": "deploy"});
        if let Some(team) = team {
            body["team"] = json!(team);
        }
        body
    };

    let (status, taken) = teams
        .call(&ops, Method::POST, "/claim", Some(claim("job-1", None)))
        .await;
    assert_eq!(
        (status, &taken["status"]),
        (200, &json!("PROCEED")),
        "{taken}"
    );
    let record = teams.as_admin("/v1/claims?kind=standalone").await;
    assert_eq!(field(&items(&record), "team"), ["ops"]);
    let events = teams.gw.audit_events("type=ClaimTaken").await;
    assert_eq!(events[0]["team"], "ops");

    // Another team's service: the claim is not found, and its request id is never another's claim.
    let settle = json!({"result": {"done": true}});
    not_found_like_a_missing_one(
        &teams,
        &payments,
        Method::POST,
        "/settle/job-1",
        "job-1",
        Some(settle.clone()),
    )
    .await;
    let (_, page) = teams.call(&payments, Method::GET, "/audit", None).await;
    assert!(
        !field(&items(&page), "request_id").contains(&"job-1".to_owned()),
        "{page}"
    );
    let (status, refused) = teams
        .call(
            &payments,
            Method::POST,
            "/claim",
            Some(claim("job-1", None)),
        )
        .await;
    assert_eq!((status, code(&refused)), (422, 4002), "{refused}");
    assert!(refused.get("existing").is_none());

    // A scope bound to several teams names one, and only one it holds, by its name.
    let (status, body) = teams
        .call(
            &several,
            Method::POST,
            "/claim",
            Some(claim("job-2", Some("pay ments"))),
        )
        .await;
    refused_naming(status, &body, (422, 6005), "\"pay ments\"");
    let (status, body) = teams
        .call(&several, Method::POST, "/claim", Some(claim("job-2", None)))
        .await;
    refused_naming(status, &body, (422, 6005), "ops, payments");
    let (status, body) = teams
        .call(
            &several,
            Method::POST,
            "/claim",
            Some(claim("job-2", Some("default"))),
        )
        .await;
    assert_eq!((status, code(&body)), (403, 6002), "{body}");
    let (status, body) = teams
        .call(
            &several,
            Method::POST,
            "/claim",
            Some(claim("job-2", Some("payments"))),
        )
        .await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("PROCEED")),
        "{body}"
    );
    let (status, body) = teams
        .call(
            &several,
            Method::POST,
            "/settle/job-2",
            Some(settle.clone()),
        )
        .await;
    assert_eq!(
        (status, &body["status"]),
        (200, &json!("committed")),
        "{body}"
    );

    // Unbound: team default, and it sees every team's claims.
    let (status, _) = teams
        .call(&unbound, Method::POST, "/claim", Some(claim("job-3", None)))
        .await;
    assert_eq!(status, 200);
    let (_, seen) = listed(&teams, &unbound, "/v1/claims?kind=standalone", "team").await;
    assert_eq!(seen, ["default", "ops", "payments"]);
}

#[tokio::test]
async fn the_export_and_checkpoints_need_the_audit_scope_on_every_team() {
    let dir = tempfile::tempdir().unwrap();
    let teams = Teams::start(dir.path()).await;
    let payments = teams.gw.keys.operator_token("payments/seal.audit.read");
    for path in ["/v1/audit/export", "/v1/audit/checkpoints"] {
        let (status, body) = teams.call(&payments, Method::GET, path, None).await;
        refused_naming(status, &body, (403, 6002), "every team");
    }
    let star = teams.gw.keys.operator_token("*/seal.audit.read");
    let (status, _) = teams
        .call(&star, Method::GET, "/v1/audit/checkpoints", None)
        .await;
    assert_eq!(status, 200);
    // The whole chain, every team's events in it, verifies.
    let path = dir.path().join("export.jsonl");
    let events = teams.gw.save_export(&path).await;
    let mut seen = field(&events, "team");
    seen.dedup();
    assert!(
        seen.contains(&"ops".to_owned()) && seen.contains(&"payments".to_owned()),
        "{seen:?}"
    );
    let (status, out) = common::audit_verify(&[&path], Some(&teams.gw.keys_url()));
    assert_eq!(status, 0, "{out}");
}
