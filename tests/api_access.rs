//! Who may drive a node's HTTP API (issue "only invited members get in", its API part), against
//! node processes: on loopback a web page cannot (another `Origin` or `Host` is refused with
//! 403, and nothing is written); bound beyond loopback every request needs the node's token
//! (401 without), which the CLI reads from the data directory or `PIECEWORK_TOKEN`; a node
//! whose identity key others may read does not start, and says which `chmod` mends it.

mod support;

use std::process::{Command, Stdio};

use support::{BIN, GENEROUS, NodeOptions, spawn, spawn_node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_drive_a_node_on_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let node = spawn_node(&dir.path().join("a"), None);
    let http = reqwest::Client::new();
    let create = |origin: Option<&str>, host: Option<&str>| {
        let mut r = http
            .post(format!("{}/v1/queues", node.http))
            .json(&serde_json::json!({ "name": "from a page" }));
        if let Some(o) = origin {
            r = r.header("Origin", o);
        }
        if let Some(h) = host {
            r = r.header("Host", h);
        }
        r.send()
    };
    // A cross-origin POST (a page on another site), and a DNS-rebinding one (the page's own
    // host name, resolved to loopback): refused, with the error form of every refusal.
    for (origin, host) in [
        (Some("https://evil.example"), None),
        (Some("null"), None),
        (None, Some("evil.example")),
    ] {
        let resp = create(origin, host).await.unwrap();
        assert_eq!(resp.status(), 403, "{origin:?} {host:?}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert!(
            body["error"].as_str().unwrap().contains("may not drive"),
            "{body}"
        );
    }
    let status: serde_json::Value = http
        .get(format!("{}/v1/status", node.http))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status["queues"],
        serde_json::json!([]),
        "nothing written: {status}"
    );
    // The node's own origin, and a client that sends none (the CLI, curl), are served.
    let port = node.http.rsplit(':').next().unwrap();
    let own = format!("http://localhost:{port}");
    let resp = create(Some(&own), None).await.unwrap();
    assert_eq!(resp.status(), 200);
    let resp = create(None, None).await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_every_request_needs_the_nodes_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a");
    let mut opts = NodeOptions::loopback(&data);
    opts.http = "0.0.0.0:0".into();
    let node = spawn(&opts);
    let base = node.http.replace("0.0.0.0", "127.0.0.1");
    let resp = reqwest::get(format!("{base}/v1/status")).await.unwrap();
    assert_eq!(resp.status(), 401);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert!(
        body["error"].as_str().unwrap().contains("api-token"),
        "{body}"
    );
    // A wrong token is refused too.
    let resp = reqwest::Client::new()
        .get(format!("{base}/v1/status"))
        .bearer_auth("not-the-token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // The CLI: refused without the token, served with it from the data directory (owner-only)
    // or from PIECEWORK_TOKEN.
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = Command::new(BIN);
        c.arg("--node").arg(&base).args(args);
        c.env_remove("PIECEWORK_TOKEN");
        if let Some(t) = env {
            c.env("PIECEWORK_TOKEN", t);
        }
        c.output().unwrap()
    };
    let out = run(&["queue", "create", "q"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("token"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token_file = data.join(piecework::node::access::TOKEN_FILE);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let dir_mode = std::fs::metadata(&data).unwrap().permissions().mode();
        assert_eq!(dir_mode & 0o777, 0o700, "the data directory is owner-only");
    }
    let d = data.to_str().unwrap();
    let out = run(&["--data-dir", d, "queue", "create", "q"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = std::fs::read_to_string(&token_file).unwrap();
    let out = run(&["queue", "create", "r"], Some(token.trim()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_key_readable_by_others_stops_the_node_with_the_chmod_that_mends_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a");
    // A first start makes the key.
    drop(spawn_node(&data, None));
    let key = data.join(piecework::node::identity::KEY_FILE);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let child = Command::new(BIN)
        .args([
            "node",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&data)
        // As a user runs it: no backtrace under the error line.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its exit is waited for on a thread, under a generous deadline: a node that starts
    // anyway fails the test (and is killed) instead of hanging it.
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(GENEROUS) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the node started with a shared key");
        }
    };
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    let want = format!("chmod 600 {}", key.display());
    assert!(lines[0].contains(&want), "{err}");
}
