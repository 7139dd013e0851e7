//! The README's tour, automated: three `piecework node` processes on loopback run tasks
//! submitted from the CLI, and keep running them after the active router's process is killed
//! with SIGKILL.
//!
//! Waits are on the processes' output and on the HTTP API's long-poll for a task's outcome, each
//! with a generous timeout; nothing sleeps.

mod support;

use piecework::client::Client;
use piecework::node::api;
use piecework::queue_doc::{TaskId, TaskState};
use support::{GENEROUS, NodeProcess, cli, spawn_node};

fn submit(node: &NodeProcess, queue: &str, i: usize) -> TaskId {
    let input = format!(r#"{{"data": "process task {i}", "rounds": 2000}}"#);
    TaskId::new(cli(
        node,
        &[
            "task", "submit", queue, "--kind", "sha256", "--input", &input,
        ],
    ))
}

/// The HTTP addresses of the nodes still running.
fn urls(nodes: &[Option<NodeProcess>]) -> Vec<Option<String>> {
    nodes
        .iter()
        .map(|n| n.as_ref().map(|n| n.http.clone()))
        .collect()
}

/// Waits for a task's outcome through node `via`; on failure, prints what every running node
/// sees of the queue and the task.
async fn wait_done(urls: &[Option<String>], via: usize, id: &TaskId) -> api::TaskStatus {
    let client = Client::new(urls[via].as_deref().expect("a running node")).unwrap();
    match client.wait(id, GENEROUS).await {
        Ok(s) => s,
        Err(e) => {
            for (i, url) in urls.iter().enumerate() {
                let Some(url) = url else { continue };
                let c = Client::new(url).unwrap();
                eprintln!("node {i}: {:#?}", c.status().await);
                eprintln!("node {i}, {id}: {:#?}", c.task_status(id).await);
            }
            panic!("{id}: {e:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_processes_keep_running_tasks_after_the_router_is_sigkilled() {
    let dir = tempfile::tempdir().unwrap();
    let first = spawn_node(&dir.path().join("a"), None);
    let mut nodes = vec![Some(spawn_node(&dir.path().join("b"), Some(&first)))];
    nodes.push(Some(spawn_node(&dir.path().join("c"), Some(&first))));
    nodes.insert(0, Some(first));
    let node = |nodes: &[Option<NodeProcess>], i: usize| -> String {
        nodes[i].as_ref().unwrap().http.clone()
    };

    // The CLI side of the tour, run as separate processes.
    let queue = tokio::task::block_in_place(|| {
        let n = |i: usize| nodes[i].as_ref().unwrap();
        let queue = cli(n(0), &["queue", "create", "tour"]);
        assert!(queue.starts_with("automerge:"), "a queue id: {queue}");
        for i in 1..3 {
            let token = cli(n(0), &["queue", "invite", &queue, "--for", &n(i).peer]);
            let joined = cli(n(i), &["queue", "join", &token]);
            assert!(joined.starts_with("joined tour"), "{joined}");
        }
        let waited = cli(
            n(1),
            &[
                "task",
                "submit",
                &queue,
                "--kind",
                "sha256",
                "--input",
                r#"{"data": "abc", "rounds": 1}"#,
                "--wait",
            ],
        );
        assert!(
            waited.contains("succeeded")
                && waited
                    .contains("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            "sha256(abc) comes back: {waited}"
        );
        queue
    });
    let first_batch: Vec<TaskId> = tokio::task::block_in_place(|| {
        (0..12)
            .map(|i| submit(nodes[i % 3].as_ref().unwrap(), &queue, i))
            .collect()
    });
    let client0 = Client::new(&node(&nodes, 0)).unwrap();
    for id in &first_batch {
        let s = wait_done(&urls(&nodes), 0, id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{id}");
    }

    // SIGKILL the active router's process.
    let status: api::NodeStatus = client0.status().await.unwrap();
    let before = status.queues[0]
        .router
        .clone()
        .expect("a router routed the first batch");
    let victim = nodes
        .iter()
        .position(|n| n.as_ref().unwrap().peer == before.peer.as_str())
        .unwrap();
    drop(nodes[victim].take());
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();

    // The survivors go on: tasks submitted from the CLI after the kill all complete.
    let second_batch: Vec<TaskId> = tokio::task::block_in_place(|| {
        (0..12)
            .map(|i| submit(nodes[survivors[i % 2]].as_ref().unwrap(), &queue, 100 + i))
            .collect()
    });
    let client = Client::new(&node(&nodes, survivors[0])).unwrap();
    for id in first_batch.iter().chain(&second_batch) {
        let s = wait_done(&urls(&nodes), survivors[0], id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{id}");
        assert!(s.result.is_some());
    }
    let after = client.status().await.unwrap().queues[0]
        .router
        .clone()
        .unwrap();
    assert_ne!(after.peer, before.peer, "another peer took over");
    assert!(after > before);
    let text =
        tokio::task::block_in_place(|| cli(nodes[survivors[1]].as_ref().unwrap(), &["status"]));
    assert!(
        text.contains(&format!("term {}", after.term)),
        "status shows the new term: {text}"
    );
}

/// A planned restart: SIGTERM to the active router's process. The node stops taking work,
/// hands its router role over at once, lets its running handlers finish and exits 0; the next
/// router routes before `takeover_after` could have passed since the signal (set to 20 s here,
/// so that only a handover, never a takeover after silence, passes; it takes about 0.4 s),
/// and no task runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_to_the_routers_process_hands_over_at_once_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let first = spawn_node(&dir.path().join("a"), None);
    let second = spawn_node(&dir.path().join("b"), Some(&first));
    let third = spawn_node(&dir.path().join("c"), Some(&first));
    let mut nodes = vec![Some(first), Some(second), Some(third)];
    let mut config = support::fast_config();
    config.takeover_after_ms = 20_000;
    let c0 = nodes[0].as_ref().unwrap().client();
    let queue = c0
        .create_queue("planned", Some(config.clone()))
        .await
        .unwrap();
    for n in nodes.iter().skip(1).flatten() {
        n.client()
            .join_from(&c0, &queue, &n.peer, piecework::queue_doc::Role::Member)
            .await
            .unwrap();
    }
    // A first task tells us the router is routing.
    let warm = support::submit_sleep(nodes[1].as_ref().unwrap(), &queue, 10).await;
    let all: Vec<String> = urls(&nodes).into_iter().flatten().collect();
    support::wait_final(&all, &all[1], &warm).await;
    let router = c0.status().await.unwrap().queues[0].router.clone().unwrap();
    let victim = nodes
        .iter()
        .position(|n| n.as_ref().is_some_and(|n| n.peer == router.peer.as_str()))
        .unwrap();
    let via = (victim + 1) % 3;
    // Enough work that tasks wait when the signal comes: four times as many as the cluster's
    // six workers, in one batch (one by one, a slow machine's submits let the backlog drain
    // before the signal); the router's own workers run some, which must end within the grace
    // time.
    let mut tasks = vec![warm];
    let batch: Vec<serde_json::Value> = (0..24)
        .map(|_| serde_json::json!({ "kind": "sleep", "input": { "ms": 300 } }))
        .collect();
    let entries = nodes[via]
        .as_ref()
        .unwrap()
        .client()
        .submit_many(&queue, &batch)
        .await
        .unwrap();
    for e in entries {
        match e {
            api::BatchEntry::Submitted { task_id, .. } => tasks.push(task_id),
            other => panic!("a batch entry refused: {other:?}"),
        }
    }
    let signalled = wall_ms();
    let node = nodes[victim].take().unwrap();
    let exit = tokio::task::block_in_place(|| node.terminate());
    assert!(exit.success(), "the node exits 0 after SIGTERM: {exit:?}");

    // The next router's first assignment after the signal.
    let c = nodes[via].as_ref().unwrap().client();
    let all: Vec<String> = urls(&nodes).into_iter().flatten().collect();
    let mut first_new = u64::MAX;
    for id in &tasks {
        let s = support::wait_final(&all, &c_url(&nodes, via), id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{id}: {s:#?}");
        let started = s.attempts.iter().filter(|a| a.started.is_some()).count();
        assert_eq!(started, 1, "{id} ran more than once: {:#?}", s.attempts);
        for a in s.attempts.iter().filter(|a| a.id.claim > router) {
            first_new = first_new.min(a.assigned_at);
        }
    }
    let took = first_new.saturating_sub(signalled);
    // Not a timing bound: without the handover, no member could claim before `takeover_after`
    // of silence.
    let bound = config.takeover_after_ms;
    eprintln!("the next router routed {took} ms after SIGTERM (takeover_after {bound} ms)");
    assert!(
        first_new != u64::MAX && took <= bound,
        "the next router routed {took} ms after the signal (bound {bound} ms)"
    );
    let after = c.status().await.unwrap().queues[0].router.clone().unwrap();
    assert!(after > router && after.peer != router.peer);
    assert_eq!(after.term, router.term + 1, "one claim, no race");

    // The restart of the planned restart: the node starts again on its data directory, runs
    // tasks submitted through it, and leaves the router where it is.
    let back = spawn_node(
        &dir.path().join(["a", "b", "c"][victim]),
        nodes[via].as_ref(),
    );
    let mut more = Vec::new();
    for _ in 0..6 {
        more.push(support::submit_sleep(&back, &queue, 10).await);
    }
    nodes[victim] = Some(back);
    let all: Vec<String> = urls(&nodes).into_iter().flatten().collect();
    for id in &more {
        let s = support::wait_final(&all, &all[0], id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{id}");
    }
    for n in nodes.iter().flatten() {
        let r = n.client().status().await.unwrap().queues[0].router.clone();
        assert_eq!(
            r.as_ref(),
            Some(&after),
            "the restarted node took the router back"
        );
    }
}

fn c_url(nodes: &[Option<NodeProcess>], i: usize) -> String {
    nodes[i].as_ref().unwrap().http.clone()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A panic in a node's shell ends its process with a non-zero status (and the panic's message
/// on stderr), rather than leaving a process whose API answers "the node stopped" forever.
/// The panic is a fault injected by the binary's hidden `--fault-panic-after-ms`.
#[test]
fn a_panic_in_the_shell_exits_the_process_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = support::NodeOptions::loopback(&dir.path().join("n"));
    opts.extra = vec!["--fault-panic-after-ms".into(), "100".into()];
    let node = support::spawn(&opts);
    let status = node.wait_exit("a panic in its shell");
    assert!(
        !status.success(),
        "a node whose shell panicked exited with {status}"
    );
}
