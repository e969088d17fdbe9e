//! `sealgate approvals list | show | grant | deny` (SPEC 13 r4): decide from a terminal. A client of the
//! control API like any other: it sends the operator's token to the gateway named and nowhere else
//! (no redirect is followed, SPEC 20 rule 8), and prints what the gateway answered.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::{json, Value};

use crate::tls::client::ClientTls;

/// How long one request may take before the command gives up.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What `list` shows at most; the API's pages are followed no further (`--json` shows the cursor).
const LIST_LIMIT: &str = "100";

/// The approval statuses of SPEC 13, checked here so that a typo is a usage error, not a refusal.
const STATUSES: [&str; 5] = ["pending", "granted", "denied", "expired", "used"];

/// Exit status when the gateway refused, or could not be asked.
const REFUSED: u8 = 1;
/// Exit status of a usage error (as clap's own): a bad flag, no token.
const USAGE: u8 = 2;

#[derive(clap::Args)]
#[command(after_help = "\
The operator token comes from --token-file, else from SEALGATE_OPERATOR_TOKEN; it needs
seal.approval.read to list and show, seal.approval.decide to grant and deny.

Exit status: 0 done, 1 the gateway refused (its code and message are printed) or could not be
reached, 2 a usage error (a bad flag, no token).")]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    command: ApprovalsCommand,
}

/// Which gateway, as whom, and how to print: every subcommand takes them.
#[derive(clap::Args)]
struct Target {
    /// The gateway's base URL: https://HOST:PORT, or http:// for a loopback host only (the token
    /// must not cross a network in clear).
    #[arg(
        long,
        env = "SEALGATE_GATEWAY",
        hide_env_values = true,
        value_name = "URL"
    )]
    gateway: String,
    /// A file holding the operator token (white space around it ignored).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print the gateway's JSON answer as it is, for scripts.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    tls: ClientTls,
}

#[derive(clap::Subcommand)]
enum ApprovalsCommand {
    /// List approval requests, newest first.
    List {
        /// Only requests in this status.
        #[arg(long, value_parser = STATUSES)]
        status: Option<String>,
        #[command(flatten)]
        to: Target,
    },
    /// Show one request: the call, its arguments, the grants so far and the decision.
    Show {
        id: String,
        #[command(flatten)]
        to: Target,
    },
    /// Grant a pending request (it runs once enough distinct people granted it).
    Grant {
        id: String,
        /// Why (recorded on the request and in the audit event).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        to: Target,
    },
    /// Deny a pending request.
    Deny {
        id: String,
        /// Why (required).
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        to: Target,
    },
}

impl ApprovalsCommand {
    fn target(&self) -> &Target {
        match self {
            ApprovalsCommand::List { to, .. }
            | ApprovalsCommand::Show { to, .. }
            | ApprovalsCommand::Grant { to, .. }
            | ApprovalsCommand::Deny { to, .. } => to,
        }
    }
}

/// Runs the command; the exit status says how it went (see `ApprovalsArgs`).
pub async fn run(args: ApprovalsArgs) -> ExitCode {
    let target = args.command.target();
    let client = match Client::new(target) {
        Ok(client) => client,
        Err(message) => {
            eprintln!("sealgate approvals: {message}");
            return ExitCode::from(USAGE);
        }
    };
    let (method, path, body) = request(&args.command);
    match client.send(method, &path, body).await {
        Ok(answer) if target.json => say!("{answer:#}"),
        Ok(answer) => say!("{}", shown(&args.command, &answer)),
        Err(message) => {
            eprintln!("sealgate approvals: {message}");
            return ExitCode::from(REFUSED);
        }
    }
    ExitCode::SUCCESS
}

/// The API call of a command: method, path segments under `/v1/approvals`, and body.
fn request(command: &ApprovalsCommand) -> (Method, Request, Option<Value>) {
    match command {
        ApprovalsCommand::List { status, .. } => {
            let mut query = vec![("limit", LIST_LIMIT.to_owned())];
            query.extend(status.iter().map(|s| ("status", s.clone())));
            (Method::GET, Request { id: None, query }, None)
        }
        ApprovalsCommand::Show { id, .. } => (Method::GET, Request::of(id, None), None),
        ApprovalsCommand::Grant { id, reason, .. } => (
            Method::POST,
            Request::of(id, Some("grant")),
            Some(match reason {
                Some(reason) => json!({ "reason": reason }),
                None => json!({}),
            }),
        ),
        ApprovalsCommand::Deny { id, reason, .. } => (
            Method::POST,
            Request::of(id, Some("deny")),
            Some(json!({ "reason": reason })),
        ),
    }
}

/// Where under `/v1/approvals` a command goes: an id and a verb as path segments (escaped by the URL
/// builder, so an id cannot name another path), or a query.
struct Request {
    id: Option<(String, Option<&'static str>)>,
    query: Vec<(&'static str, String)>,
}

impl Request {
    fn of(id: &str, verb: Option<&'static str>) -> Request {
        Request {
            id: Some((id.to_owned(), verb)),
            query: Vec::new(),
        }
    }
}

/// The gateway, the token and the HTTP client that talks to it.
struct Client {
    base: Url,
    token: String,
    http: reqwest::Client,
}

impl Client {
    fn new(target: &Target) -> Result<Client, String> {
        let base = gateway_url(&target.gateway)?;
        let token = operator_token(target.token_file.as_deref(), &target.gateway)?;
        // A proxy from the environment would see the token: the gateway is asked directly.
        let http = target.tls.client(
            crate::outbound::client_builder()
                .no_proxy()
                .timeout(TIMEOUT),
        )?;
        Ok(Client { base, token, http })
    }

    /// Sends one request; the answer's JSON on 2xx, else a message naming the gateway's refusal.
    async fn send(
        &self,
        method: Method,
        request: &Request,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let url = self.url(request)?;
        let mut sent = self.http.request(method, url).bearer_auth(&self.token);
        if let Some(body) = body {
            sent = sent.json(&body);
        }
        let shown = crate::redact::url(self.base.as_str());
        let response = sent.send().await.map_err(|e| {
            let why = crate::tls::client::failure(&e.without_url());
            format!("cannot reach {shown}: {why}")
        })?;
        let status = response.status();
        if status.is_redirection() {
            let why = crate::outbound::failed_status(status, response.headers());
            return Err(format!("{shown} answered {why}"));
        }
        let text = response
            .text()
            .await
            .map_err(|e| format!("{shown}: cannot read the answer: {e}"))?;
        let answer: Option<Value> = serde_json::from_str(&text).ok();
        match answer {
            Some(answer) if status.is_success() => Ok(answer),
            Some(answer) if answer["error"]["code"].is_u64() => Err(refusal(&answer["error"])),
            _ => Err(format!(
                "{shown} answered HTTP {status}, not sealgate's JSON"
            )),
        }
    }

    fn url(&self, request: &Request) -> Result<Url, String> {
        let mut url = self.base.clone();
        {
            let mut segments = url
                .path_segments_mut()
                .map_err(|()| "--gateway cannot be a base URL".to_owned())?;
            segments.pop_if_empty().extend(["v1", "approvals"]);
            if let Some((id, verb)) = &request.id {
                segments.push(id);
                segments.extend(verb);
            }
        }
        if !request.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&request.query);
        }
        Ok(url)
    }
}

/// The gateway's base URL: https://, or http:// on this machine only, where no one between can read
/// the operator's token.
fn gateway_url(gateway: &str) -> Result<Url, String> {
    let url = Url::parse(gateway).map_err(|e| format!("--gateway {gateway:?}: {e}"))?;
    crate::outbound::https_or_loopback(&url)
        .map_err(|why| format!("--gateway {}: {why}", crate::redact::url(gateway)))?;
    Ok(url)
}

/// The credential, from the first source that has one: `--token-file`, `SEALGATE_OPERATOR_TOKEN`, then
/// what `sealgate login --gateway` stored for this gateway (SPEC 16).
fn operator_token(token_file: Option<&std::path::Path>, gateway: &str) -> Result<String, String> {
    let token = match token_file {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("--token-file {}: {e}", path.display()))?,
        None => std::env::var("SEALGATE_OPERATOR_TOKEN")
            .ok()
            .or_else(|| crate::identity::stored_credential(gateway))
            .ok_or_else(|| {
                format!(
                    "no operator token: give --token-file FILE, set SEALGATE_OPERATOR_TOKEN, or run \
                     sealgate login --gateway {gateway}"
                )
            })?,
    };
    let token = token.trim();
    if token.is_empty() {
        return Err("the operator token is empty".to_owned());
    }
    Ok(token.to_owned())
}

/// A refusal as the gateway gave it: `403 OPERATOR_FORBIDDEN (6002): message`.
fn refusal(error: &Value) -> String {
    format!(
        "the gateway refused: {} ({}): {}",
        error["name"].as_str().unwrap_or("?"),
        error["code"],
        error["message"].as_str().unwrap_or("")
    )
}

/// The answer, for a person.
fn shown(command: &ApprovalsCommand, answer: &Value) -> String {
    match command {
        ApprovalsCommand::List { .. } => listing(answer),
        ApprovalsCommand::Show { .. } => details(answer),
        ApprovalsCommand::Grant { .. } | ApprovalsCommand::Deny { .. } => {
            format!("{}\n\n{}", outcome(answer), details(answer))
        }
    }
}

/// One line per request: id, status, grants so far of those needed, tool, session, agent, when.
fn listing(page: &Value) -> String {
    let items = page["items"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if items.is_empty() {
        return "no approval requests".to_owned();
    }
    let mut lines = vec![format!(
        "{:<36}  {:<8}  {:<6}  {:<24}  {:<16}  REQUESTED",
        "ID", "STATUS", "GRANTS", "TOOL", "SESSION"
    )];
    lines.extend(items.iter().map(|item| {
        format!(
            "{:<36}  {:<8}  {:<6}  {:<24}  {:<16}  {}",
            text(&item["approval_id"]),
            text(&item["status"]),
            grant_count(item),
            text(&item["tool"]),
            text(&item["session_id"]),
            text(&item["requested_at"]),
        )
    }));
    if !page["next_cursor"].is_null() {
        lines.push(format!(
            "(the newest {LIST_LIMIT} are shown; narrow with --status, or page with --json's next_cursor)"
        ));
    }
    lines.join("\n")
}

/// A request in full.
fn details(record: &Value) -> String {
    let mut lines = vec![
        format!("approval   {}", text(&record["approval_id"])),
        format!(
            "status     {} ({} of {} grants)",
            text(&record["status"]),
            record["grants"].as_array().map_or(0, Vec::len),
            record["approvers"]
        ),
        format!("tool       {}", text(&record["tool"])),
        format!(
            "session    {} (agent {})",
            text(&record["session_id"]),
            text(&record["sub"])
        ),
        format!("context    {}", text(&record["context"])),
        format!("arguments  {}", record["arguments"]),
        format!("requested  {}", text(&record["requested_at"])),
        format!("expires    {}", text(&record["expires_at"])),
    ];
    if record["separate_from_registrant"] == true {
        lines.push("           (the session's registrant may not decide)".to_owned());
    }
    for grant in record["grants"].as_array().into_iter().flatten() {
        lines.push(format!(
            "granted    by {} at {}{}",
            person(&grant["by"]),
            text(&grant["at"]),
            because(&grant["reason"])
        ));
    }
    if !record["decided_by"].is_null() {
        lines.push(format!(
            "decided    by {} at {}{}",
            person(&record["decided_by"]),
            text(&record["decided_at"]),
            because(&record["reason"])
        ));
    }
    lines.join("\n")
}

/// What a grant or deny did.
fn outcome(record: &Value) -> String {
    let id = text(&record["approval_id"]);
    match record["status"].as_str() {
        Some("pending") => format!(
            "approval {id}: grant recorded; {} it waits for more grants",
            grant_count(record)
        ),
        Some(status) => format!("approval {id}: {status}"),
        None => format!("approval {id}"),
    }
}

/// `1/2`: grants so far of those needed.
fn grant_count(record: &Value) -> String {
    format!(
        "{}/{}",
        record["grants"].as_array().map_or(0, Vec::len),
        record["approvers"]
    )
}

/// `Ann Smith <ann> (oidc, https://idp.example)`: who, and how the gateway knew.
fn person(identity: &Value) -> String {
    let who = match identity["name"].as_str() {
        Some(name) => format!("{name} <{}>", text(&identity["sub"])),
        None => text(&identity["sub"]).to_owned(),
    };
    format!(
        "{who} ({}, {})",
        text(&identity["via"]),
        text(&identity["iss"])
    )
}

fn because(reason: &Value) -> String {
    reason
        .as_str()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Value {
        json!({"approval_id": "a1", "status": "pending", "tool": "pay.send", "session_id": "s",
               "sub": "agent-1", "context": "c", "arguments": {"cents": 5},
               "requested_at": "2026-01-01T00:00:00.000Z", "expires_at": "2026-01-01T00:15:00.000Z",
               "approvers": 2, "separate_from_registrant": true,
               "grants": [{"by": {"iss": "https://idp", "sub": "ann", "name": "Ann", "via": "oidc"},
                           "at": "2026-01-01T00:01:00.000Z", "reason": "ok"}]})
    }

    #[test]
    fn a_request_shows_its_grants_with_how_each_person_was_known() {
        let shown = details(&record());
        assert!(shown.contains("pending (1 of 2 grants)"), "{shown}");
        assert!(
            shown.contains(
                "granted    by Ann <ann> (oidc, https://idp) at 2026-01-01T00:01:00.000Z: ok"
            ),
            "{shown}"
        );
        assert!(shown.contains("registrant may not decide"), "{shown}");
        assert!(outcome(&record()).contains("1/2 it waits for more grants"));
        let page = listing(&json!({"items": [record()], "next_cursor": null}));
        assert!(
            page.lines().nth(1).unwrap().contains("pending   1/2"),
            "{page}"
        );
        assert_eq!(listing(&json!({"items": []})), "no approval requests");
    }

    #[test]
    fn the_token_crosses_a_network_only_over_tls() {
        assert!(gateway_url("https://gw.example:8443").is_ok());
        assert!(gateway_url("http://127.0.0.1:8089").is_ok());
        assert!(gateway_url("http://localhost:8089").is_ok());
        let plain = gateway_url("http://user:pw@gw.example/").unwrap_err();
        assert!(plain.contains("loopback"), "{plain}");
        assert!(!plain.contains("pw"), "{plain}");
        assert!(gateway_url("ftp://gw.example").is_err());
    }

    #[test]
    fn an_id_stays_one_path_segment() {
        let client = Client {
            base: gateway_url("http://127.0.0.1:1/prefix/").unwrap(),
            token: "t".into(),
            http: reqwest::Client::new(),
        };
        let url = client
            .url(&Request::of("../../v1/seal/sessions", Some("grant")))
            .unwrap();
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:1/prefix/v1/approvals/..%2F..%2Fv1%2Fseal%2Fsessions/grant"
        );
    }
}
