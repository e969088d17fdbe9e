//! Real MCP servers behind the real gateway binary (SPEC section 8, `tools/list` of section 2): the
//! reference filesystem server over stdio and the reference "everything" server over Streamable HTTP,
//! both from the npm packages pinned in tests/mcp-servers (`npm ci --prefix tests/mcp-servers`).

mod common;

use std::time::{Duration, Instant};

use common::mcp::{free_port, server_script, start_everything};
use common::{code, tool_call, Gateway};
use serde_json::{json, Value};

fn text(body: &Value) -> String {
    body["payload"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_mcp_servers_behind_the_gateway() {
    let fs_script = server_script("server-filesystem");
    let every_script = server_script("server-everything");
    let dir = tempfile::tempdir().unwrap();
    // The filesystem server may see the whole root; the gateway allows only root/workspace.
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    let workspace = root_path.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(root_path.join("secret.txt"), "TOP-SECRET-CONTENT").unwrap();
    let port = free_port();
    let mut everything = start_everything(&every_script, port).await;

    let upstreams = format!(
        "  fs: {{ mcp: {{ command: node, args: [{fs_script:?}, {root:?}] }}, timeout_ms: 20000 }}\n  \
         every: {{ mcp: {{ url: \"http://127.0.0.1:{port}/mcp\" }}, timeout_ms: 3000 }}\n",
        root = root_path.to_string_lossy()
    );
    let (gw, _tool) = Gateway::start_with(dir.path(), &upstreams, "").await;
    std::fs::write(
        dir.path().join("policies/mcp.yaml"),
        format!(
            "name: mcp\ndeny_list: [\"fs.move_file\", \"fs.edit_file\", \"every.get-env\"]\ncapabilities:\n  \
             - tool_pattern: \"fs.*\"\n    path_allowlist: [{workspace:?}]\n    claim: auto\n  \
             - tool_pattern: \"every.*\"\n    claim: auto\n",
            workspace = workspace.to_string_lossy()
        ),
    )
    .unwrap();
    // The new policy file is picked up by hot reload; register once it is there.
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let body = json!({"session_id": "exec-mcp", "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                      "security_context": "mcp", "expires_at": sealgate::clock::now_secs() + 600});
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (status, answer) = gw
            .admin(
                reqwest::Method::POST,
                "/v1/seal/sessions",
                Some(body.clone()),
            )
            .await;
        if status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mcp context never loaded: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let token = gw
        .keys
        .agent_token_from(&gw.keys.agent_claims("exec-mcp", "mcp"));

    // A write inside the workspace really lands on disk, and a read returns it.
    let note = workspace.join("note.txt");
    let write = |id| tool_call(id, "fs.write_file", json!({"path": note, "content": "v1"}));
    let (status, body) = gw.call(&key, &token, write(1)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "PROCEED");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "v1");
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(2, "fs.read_text_file", json!({"path": note})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(text(&body), "v1");

    // The retried write is SKIPped: a change made in between is not overwritten.
    std::fs::write(&note, "changed by someone else").unwrap();
    let (status, body) = gw.call(&key, &token, write(3)).await;
    assert_eq!(
        (status, body["receipt"]["claim"].as_str()),
        (200, Some("SKIP")),
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(&note).unwrap(),
        "changed by someone else"
    );

    // The server would read root/secret.txt; the gateway's allowlist refuses it before it is asked.
    let secret = root_path.join("secret.txt");
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(4, "fs.read_text_file", json!({"path": secret})),
        )
        .await;
    assert_eq!((status, code(&body)), (403, 2002));
    assert!(!body.to_string().contains("TOP-SECRET"));

    // tools/list: the routed names of both servers, without what the deny list forbids.
    let (status, body) = gw
        .call(
            &key,
            &token,
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<&str> = body["payload"]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"fs.read_text_file") && names.contains(&"every.echo"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"fs.move_file") && !names.contains(&"every.get-env"),
        "{names:?}"
    );
    assert_eq!(body["receipt"]["claim"], "NONE");

    // A long-running tool hits the timeout (5002); its claim stays PENDING, so the retry gets 4001.
    let long = |id| {
        tool_call(
            id,
            "every.trigger-long-running-operation",
            json!({"duration": 10, "steps": 5}),
        )
    };
    let (status, body) = gw.call(&key, &token, long(6)).await;
    assert_eq!((status, code(&body)), (504, 5002), "{body}");
    let (status, body) = gw.call(&key, &token, long(7)).await;
    assert_eq!((status, code(&body)), (409, 4001), "{body}");

    // The HTTP server restarts mid-test (and forgets its sessions); the next call succeeds.
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(8, "every.echo", json!({"message": "before"})),
        )
        .await;
    assert_eq!(
        (status, text(&body)),
        (200, "Echo: before".to_string()),
        "{body}"
    );
    everything.kill().await.unwrap();
    everything = start_everything(&every_script, port).await;
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(9, "every.echo", json!({"message": "after"})),
        )
        .await;
    assert_eq!(
        (status, text(&body)),
        (200, "Echo: after".to_string()),
        "{body}"
    );
    everything.kill().await.unwrap();
}
