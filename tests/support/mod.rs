//! Helpers for the tests that run `piecework node` processes (`tests/processes.rs`,
//! `tests/restart.rs`, `tests/partition.rs`): spawning and killing nodes, running the CLI,
//! waiting on tasks and on nodes' status.
//!
//! Nothing here sleeps to wait for something: a node's start is awaited on its banner, a task's
//! outcome on the HTTP API's long-poll, and a state that has no event to wait on (a router
//! role, an attempt's end) is polled with a short pause between polls under a generous overall
//! deadline ([`poll`]).

// Each test binary uses its own part of these helpers.
#![allow(dead_code)]

pub mod netns;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use piecework::client::Client;
use piecework::node::api;
use piecework::queue_doc::{QueueConfig, QueueId, TaskId};

/// The `piecework` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_piecework");
/// The timeout of every wait: long enough for a loaded 2-core CI machine.
pub const GENEROUS: Duration = Duration::from_secs(120);
/// The pause between two polls of a state that has no event to wait on.
pub const POLL_PAUSE: Duration = Duration::from_millis(100);

/// Queue timings short enough for a test to see takeovers and lease expiries within seconds:
/// router heartbeat 200 ms, takeover after 1 s of silence, pool heartbeat 200 ms, lease 2 s.
/// They pass `QueueConfig::validate` (takeover ≥ 2 × heartbeat, lease ≥ 2 × pool heartbeat).
pub fn fast_config() -> QueueConfig {
    let config = QueueConfig {
        heartbeat_ms: 200,
        takeover_after_ms: 1_000,
        settle_ms: 200,
        pool_heartbeat_ms: 200,
        lease_ms: 2_000,
        retry_backoff_ms: 200,
        retry_backoff_max_ms: 1_000,
        ..QueueConfig::default()
    };
    config
        .validate()
        .expect("the test's queue timings are valid");
    config
}

/// How to start a `piecework node` process.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--listen`.
    pub listen: String,
    /// `--http`.
    pub http: String,
    /// `--bootstrap`, each.
    pub bootstrap: Vec<String>,
    /// `--workers`.
    pub workers: u32,
    /// Run it inside this network namespace (`ip netns exec NS piecework node …`).
    pub netns: Option<String>,
    /// More arguments, after the others.
    pub extra: Vec<String>,
}

impl NodeOptions {
    /// A node on loopback with ephemeral ports and two workers.
    pub fn loopback(data_dir: &Path) -> Self {
        NodeOptions {
            data_dir: data_dir.to_owned(),
            listen: "/ip4/127.0.0.1/tcp/0".into(),
            http: "127.0.0.1:0".into(),
            bootstrap: vec![],
            workers: 2,
            netns: None,
            extra: vec![],
        }
    }
}

/// A running `piecework node`; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct NodeProcess {
    child: Child,
    /// Its peer id.
    pub peer: String,
    /// Its first libp2p address, ending in `/p2p/<peer>`.
    pub listen: String,
    /// Its HTTP API's base URL.
    pub http: String,
}

impl NodeProcess {
    /// SIGKILLs the process and waits until it is gone (so its data directory is free).
    pub fn kill(self) {
        drop(self);
    }

    /// Sends the process SIGTERM (a planned stop) and waits, up to [`GENEROUS`], for it to
    /// exit; returns how it exited.
    pub fn terminate(self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM could not be sent");
        self.wait_exit("SIGTERM")
    }

    /// Waits, up to [`GENEROUS`], for the process to exit after `what`; returns how it
    /// exited.
    pub fn wait_exit(mut self, what: &str) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + GENEROUS;
        loop {
            if let Some(status) = self.child.try_wait().expect("the child can be waited for") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the node did not exit within {GENEROUS:?} of {what}"
            );
            std::thread::sleep(POLL_PAUSE);
        }
    }

    /// A client of its HTTP API (with its token, which an API bound beyond loopback asks for).
    pub fn client(&self) -> Client {
        client_for(&self.http)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // `ip netns exec` execs the node, so the child is the node itself.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The API tokens of the nodes started, by HTTP base URL.
fn tokens() -> &'static std::sync::Mutex<std::collections::HashMap<String, String>> {
    static TOKENS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, String>>,
    > = std::sync::OnceLock::new();
    TOKENS.get_or_init(Default::default)
}

/// A client of the node at `url`, with its API token if this test started it.
pub fn client_for(url: &str) -> Client {
    let token = tokens()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(url)
        .cloned();
    Client::with_token(url, token.as_deref()).expect("a client")
}

/// Starts a node process and waits for its banner (peer id, listen address, HTTP address).
pub fn spawn(opts: &NodeOptions) -> NodeProcess {
    let mut cmd = match &opts.netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, BIN]);
            c
        }
        None => Command::new(BIN),
    };
    cmd.args(["node", "--listen", &opts.listen, "--http", &opts.http])
        .args(["--workers", &opts.workers.to_string()])
        .arg("--data-dir")
        .arg(&opts.data_dir);
    for b in &opts.bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    cmd.args(&opts.extra);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary runs");
    let stdout = child.stdout.take().expect("piped");
    // Read the banner on a thread, so that a node that never prints fails the test instead of
    // hanging it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let (mut peer, mut listen, mut http) = (None, None, None);
    while http.is_none() {
        let line = rx
            .recv_timeout(GENEROUS)
            .unwrap_or_else(|e| panic!("the node ({opts:?}) prints its banner: {e}"));
        if let Some(v) = line.strip_prefix("peer id: ") {
            peer = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("listening on: ") {
            listen.get_or_insert_with(|| v.to_owned());
        } else if let Some(v) = line.strip_prefix("http api: ") {
            http = Some(v.to_owned());
        }
    }
    let peer = peer.expect("a peer id line");
    let mut listen = listen.expect("a listen address line");
    if !listen.contains("/p2p/") {
        listen = format!("{listen}/p2p/{peer}");
    }
    let http = http.expect("checked");
    // The node wrote its token before its banner.
    if let Ok(t) = std::fs::read_to_string(opts.data_dir.join(piecework::node::access::TOKEN_FILE))
    {
        tokens()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(http.clone(), t.trim().to_owned());
    }
    NodeProcess {
        child,
        peer,
        listen,
        http,
    }
}

/// Starts a node on loopback with two workers, bootstrapping from `bootstrap` if given.
pub fn spawn_node(dir: &Path, bootstrap: Option<&NodeProcess>) -> NodeProcess {
    let mut opts = NodeOptions::loopback(dir);
    opts.bootstrap = bootstrap.iter().map(|b| b.listen.clone()).collect();
    spawn(&opts)
}

/// Runs the CLI against a node; returns its stdout, trimmed. Panics with stderr if it fails.
pub fn cli(node: &NodeProcess, args: &[&str]) -> String {
    let mut cmd = Command::new(BIN);
    cmd.arg("--node").arg(&node.http).args(args);
    if let Some(t) = tokens()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&node.http)
    {
        cmd.env("PIECEWORK_TOKEN", t);
    }
    let out = cmd.output().expect("the binary runs");
    assert!(
        out.status.success(),
        "piecework {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// Prints what every node in `urls` sees: its status and, if given, the task's status.
pub async fn dump(urls: &[String], task: Option<&TaskId>) {
    for url in urls {
        let c = client_for(url);
        eprintln!("{url}: {:#?}", c.status().await);
        if let Some(id) = task {
            eprintln!("{url}, {id}: {:#?}", c.task_status(id).await);
        }
    }
}

/// Waits for a task's outcome through the node at `via`, on its long-poll. A node that cannot
/// answer yet (it has not synced the task's queue entry, say) is asked again after a pause,
/// until [`GENEROUS`] has passed; on failure, prints what every node in `all` sees.
pub async fn wait_final(all: &[String], via: &str, id: &TaskId) -> api::TaskStatus {
    let client = client_for(via);
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let err = match client.wait(id, left.max(Duration::from_secs(1))).await {
            Ok(s) if s.state.is_final() => return s,
            Ok(s) => anyhow::anyhow!("not final: {:?}", s.state),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            dump(all, Some(id)).await;
            panic!("{id} via {via}: {err:#}");
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// Polls `check` with a short pause between calls until it returns `Some`, for at most
/// [`GENEROUS`]; panics naming `what` (and printing `check`'s last complaint) otherwise. For
/// states that have no event to wait on.
pub async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + GENEROUS;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {GENEROUS:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(POLL_PAUSE).await;
    }
}

/// Submits a `sleep` task of `ms` milliseconds through `node`'s HTTP API.
pub async fn submit_sleep(node: &NodeProcess, queue: &QueueId, ms: u64) -> TaskId {
    submit_kind(node, queue, "sleep", serde_json::json!({ "ms": ms })).await
}

/// Submits a task of `kind` with `input` through `node`'s HTTP API.
pub async fn submit_kind(
    node: &NodeProcess,
    queue: &QueueId,
    kind: &str,
    input: serde_json::Value,
) -> TaskId {
    let req = api::SubmitTask {
        kind: kind.into(),
        input,
        priority: 0,
        urgent: false,
        max_attempts: None,
        tags: Vec::new(),
        depends_on: Vec::new(),
        delay_ms: None,
        not_before: None,
        dedup_key: None,
        idempotency_key: None,
        requires: Vec::new(),
        timeout_ms: None,
    };
    node.client()
        .submit(queue, &req)
        .await
        .expect("submit")
        .task_id
}
