//! Joining by invite, against node processes: `queue invite` (for one peer, and for whoever
//! holds the token, with an expiry), `queue join TOKEN` on nodes that were never told of each
//! other (they dial the invite's addresses), `queue members` and `queue remove`, and what is
//! refused: an invite for another peer, a join by id, a member that is not an admin inviting,
//! the creator removed, an expired invite, a damaged token (`POST /v1/join`).
//!
//! Waits are on the HTTP API under a generous deadline; nothing sleeps a fixed time.

mod support;

use std::process::Command;

use support::{BIN, cli, poll, spawn_node};

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Runs the CLI and returns its stderr, asserting that it failed.
fn cli_fails(node: &support::NodeProcess, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("--node")
        .arg(&node.http)
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(!out.status.success(), "piecework {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn member<'a>(members: &'a serde_json::Value, peer: &str) -> &'a serde_json::Value {
    members
        .as_array()
        .and_then(|a| a.iter().find(|m| m["peer"] == peer))
        .unwrap_or_else(|| panic!("{peer} not listed: {members:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_join_by_invite_and_an_admin_removes_one() {
    let dir = tempfile::tempdir().unwrap();
    // No bootstrap: b and c reach a through the invite's addresses alone.
    let a = spawn_node(&dir.path().join("a"), None);
    let b = spawn_node(&dir.path().join("b"), None);
    let c = spawn_node(&dir.path().join("c"), None);
    let queue = cli(&a, &["queue", "create", "invited"]);

    // An invite for b's peer id: one line, the token alone.
    let token = cli(&a, &["queue", "invite", &queue, "--for", &b.peer]);
    assert!(!token.contains(char::is_whitespace), "{token}");
    let joined = json(&cli(&b, &["queue", "join", &token, "--json"]));
    assert_eq!(joined["id"], queue.as_str(), "{joined:#}");
    // The same invite presented by c is for another peer: refused. And c cannot join by id.
    let err = cli_fails(&c, &["queue", "join", &token]);
    assert!(err.contains("did not admit this node"), "{err}");
    let err = cli_fails(&c, &["queue", "join", &queue]);
    assert!(err.contains("needs an invite token"), "{err}");

    // An invite for whoever holds it, as a submitter.
    let bearer = cli(
        &a,
        &[
            "queue",
            "invite",
            &queue,
            "--role",
            "submitter",
            "--expires",
            "10m",
        ],
    );
    cli(&c, &["queue", "join", &bearer]);
    let members = json(&cli(&a, &["queue", "members", &queue, "--json"]));
    assert_eq!(member(&members, &a.peer)["role"], "admin", "{members:#}");
    assert_eq!(member(&members, &b.peer)["role"], "member", "{members:#}");
    assert_eq!(member(&members, &b.peer)["added_by"], a.peer.as_str());
    assert_eq!(
        member(&members, &c.peer)["role"],
        "submitter",
        "{members:#}"
    );

    // A submitter neither pauses nor configures; a member does not configure.
    let err = cli_fails(&c, &["queue", "pause", &queue]);
    assert!(err.contains("needs the member or admin role"), "{err}");
    let err = cli_fails(&b, &["queue", "config", &queue, "--set", "concurrency=2"]);
    assert!(err.contains("needs the admin role"), "{err}");
    cli(&b, &["queue", "pause", &queue]);
    cli(&a, &["queue", "resume", &queue]);

    // Only an admin invites; the creator cannot be removed; a damaged token is refused.
    let err = cli_fails(&b, &["queue", "invite", &queue]);
    assert!(err.contains("needs the admin role"), "{err}");
    let err = cli_fails(&a, &["queue", "remove", &queue, &a.peer]);
    assert!(err.contains("creator"), "{err}");
    let err = cli_fails(
        &c,
        &[
            "queue",
            "invite",
            &queue,
            "--for",
            &a.peer,
            "--expires",
            "1m",
        ],
    );
    assert!(err.contains("cannot be used with"), "{err}");
    let expired = cli(&a, &["queue", "invite", &queue, "--expires", "1ms"]);
    let d = spawn_node(&dir.path().join("d"), None);
    let err = cli_fails(&d, &["queue", "join", &expired]);
    assert!(err.contains("did not admit this node"), "{err}");
    let resp = support::client_for(&d.http);
    let bad = resp.join_invite("3mJr7AoUXx2Wqd").await.unwrap_err();
    assert!(bad.to_string().contains("invalid invite"), "{bad:#}");

    // a removes c: every member comes to list it removed, by a.
    let after = json(&cli(&a, &["queue", "remove", &queue, &c.peer, "--json"]));
    assert_eq!(member(&after, &c.peer)["removed"], true, "{after:#}");
    let queue_id = piecework::queue_doc::QueueId::new(queue.clone());
    let b_client = support::client_for(&b.http);
    poll("b to see c removed", || {
        let b_client = b_client.clone();
        let queue_id = queue_id.clone();
        let c_peer = c.peer.clone();
        async move {
            let m = b_client
                .members(&queue_id)
                .await
                .map_err(|e| e.to_string())?;
            m.iter()
                .find(|m| m.peer.as_str() == c_peer && m.removed)
                .map(|m| m.removed_by.clone())
                .ok_or_else(|| format!("{m:?}"))
        }
    })
    .await;
}
