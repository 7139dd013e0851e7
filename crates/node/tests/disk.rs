//! A full disk (issue 34): a node whose disk refuses writes refuses submits with a clear error
//! before it writes anything, loses nothing it acknowledged, and takes submits again once the
//! disk has room, without a restart. The disk is redb's file behind a backend that fails every
//! write while a switch is on ([`DiskFault`]), so the test needs no small filesystem and no
//! root.

use std::time::Duration;

use piecework_node::storage::DiskFault;
use piecework_node::{Config, NodeEvent, SubmitError, api, spawn_isolated};
use piecework_worker_pool::Registry;

/// The longest the node may take to notice the disk has room again: its failed writes are
/// retried with a backoff of at most `piecework_core::SAVE_RETRY_MAX` (5 s). Generous.
const RECOVERY: Duration = Duration::from_secs(60);

/// A task no worker runs (no handler of its kind): it stays pending, so the queue's counts
/// show every task that reached the queue document.
fn task(n: u32) -> api::SubmitTask {
    api::SubmitTask {
        kind: "nobody-runs-this".into(),
        input: serde_json::json!({ "n": n }),
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
    }
}

fn config(dir: &std::path::Path, fault: Option<DiskFault>) -> Config {
    let mut config = Config::new(dir.to_owned(), Registry::new());
    config.workers = 1;
    config.disk_fault = fault;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_refused_loses_nothing_and_is_served_again_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fault = DiskFault::new();
    let node = spawn_isolated(config(dir.path(), Some(fault.clone())), 2)
        .await
        .unwrap();
    let h = node.handle().clone();
    let queue = h.create_queue("disk", None).await.unwrap();
    let before = h.submit(&queue, task(1)).await.unwrap();
    let mut events = h.events();

    fault.set_full(true);
    // Waits for its writes, retried, then refused: not acknowledged.
    let refused = h.submit(&queue, task(2)).await.unwrap_err();
    assert!(
        matches!(&refused, SubmitError::NotDurable(e) if e.0.contains("no space left")),
        "a clear error: {refused}"
    );
    // The disk is known to fail now: refused before anything is written.
    let refused = h.submit(&queue, task(3)).await.unwrap_err();
    assert!(matches!(refused, SubmitError::NotDurable(_)), "{refused}");

    fault.set_full(false);
    tokio::time::timeout(RECOVERY, async {
        loop {
            if let Ok(NodeEvent::Store { failing: None }) = events.recv().await {
                return;
            }
        }
    })
    .await
    .expect("the node takes writes again once the disk has room, without a restart");
    let after = h.submit(&queue, task(4)).await.unwrap();

    // Killed (no planned stop: only what was acknowledged as on disk is), and restarted on its
    // disk, now without faults.
    drop(h);
    node.kill().wait().await;
    let node = spawn_isolated(config(dir.path(), None), 2).await.unwrap();
    let h = node.handle();
    for id in [&before, &after] {
        let status = h.task_status(&id.task_id).await;
        assert!(
            status.is_ok(),
            "{}: acknowledged, so kept: {status:?}",
            id.task_id
        );
    }
    let status = h.status().await.unwrap();
    let pending = status
        .queues
        .iter()
        .find(|q| q.id == queue)
        .map(|q| q.tasks.pending)
        .expect("the queue is reopened");
    // The two acknowledged, and perhaps the one refused after its write was tried (it was in
    // the queue document when the disk failed); never the one refused at once.
    assert!(
        (2..=3).contains(&pending),
        "{pending} tasks pending: the task refused at once was never written"
    );
}
