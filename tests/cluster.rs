//! Three nodes in one process, over loopback libp2p: tasks survive the active router's death.
//!
//! Each node runs on a tokio runtime of its own ([`spawn_isolated`]), so killing one stops all
//! of its work at once, as if its process had died. Waits are on the nodes' queue views (which
//! change as documents sync) with generous timeouts; nothing sleeps.

use std::sync::Arc;
use std::time::Duration;

use piecework::demo::demo_config;
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{QueueId, QueueView, TaskState};
use tokio::sync::watch;

const TASKS: usize = 100;
const GENEROUS: Duration = Duration::from_secs(120);

async fn start(
    dir: &std::path::Path,
    i: usize,
    bootstrap: Vec<piecework::node::Multiaddr>,
) -> IsolatedNode {
    let mut c = Config::new(dir.join(format!("node{i}")), piecework::kinds::builtin());
    c.workers = 2;
    c.bootstrap = bootstrap;
    spawn_isolated(c, 1).await.expect("node starts")
}

/// Waits until `done` holds on the view, or panics after [`GENEROUS`].
async fn until(
    rx: &mut watch::Receiver<Arc<QueueView>>,
    what: &str,
    mut done: impl FnMut(&QueueView) -> bool,
) -> Arc<QueueView> {
    let wait = async {
        loop {
            let v = rx.borrow_and_update().clone();
            if done(&v) {
                return v;
            }
            rx.changed().await.expect("the node is running");
        }
    };
    match tokio::time::timeout(GENEROUS, wait).await {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out waiting for {what}; last view: {:?}",
            rx.borrow().counts()
        ),
    }
}

async fn role_on(h: &NodeHandle, q: &QueueId) -> String {
    let s = h.status().await.expect("status");
    s.queues
        .into_iter()
        .find(|s| &s.id == q)
        .expect("the queue is joined")
        .role
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_completes_after_the_active_router_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(dir.path(), 0, vec![]).await;
    let addr = first.handle().wait_listening().await;
    let mut nodes = vec![Some(first)];
    for i in 1..3 {
        nodes.push(Some(start(dir.path(), i, vec![addr.clone()]).await));
    }
    let handles: Vec<NodeHandle> = nodes.iter().flatten().map(|n| n.handle().clone()).collect();

    let queue = handles[0]
        .create_queue("cluster", Some(demo_config()))
        .await
        .unwrap();
    for h in &handles[1..] {
        h.join_queue(&queue).await.unwrap();
    }
    let mut views: Vec<_> = handles
        .iter()
        .map(|h| h.watch_queue(&queue).unwrap())
        .collect();
    let before = until(&mut views[0], "a first router", |v| v.router.is_some())
        .await
        .router
        .clone()
        .unwrap();

    // Submit with routing paused so that the kill lands mid-run, whatever the machine's speed.
    handles[0].set_paused(&queue, true).await.unwrap();
    let mut ids = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let req = api::SubmitTask {
            kind: "sha256".into(),
            input: serde_json::json!({ "data": format!("task {i}"), "rounds": 20_000 }),
            priority: 0,
            urgent: false,
            max_attempts: None,
        };
        ids.push(handles[i % 3].submit(&queue, req).await.unwrap().task_id);
    }
    handles[0].set_paused(&queue, false).await.unwrap();

    let victim = handles
        .iter()
        .position(|h| h.peer_id() == &before.peer)
        .expect("the router is one of ours");
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let watcher = survivors[0];
    let at_kill = until(&mut views[watcher], "a third of the tasks done", |v| {
        v.counts().succeeded * 3 >= TASKS
    })
    .await;
    // The router may have changed hands on its own in the meantime; kill whoever it is now.
    let before = at_kill.router.clone().unwrap();
    let victim = handles
        .iter()
        .position(|h| h.peer_id() == &before.peer)
        .unwrap();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    drop(nodes[victim].take().unwrap().kill());
    assert!(
        at_kill.counts().succeeded < TASKS,
        "the kill landed before the end"
    );

    for &i in &survivors {
        let v = until(
            &mut views[i],
            "every task to succeed and a new router",
            |v| {
                v.counts().succeeded == TASKS
                    && v.router.as_ref().is_some_and(|r| r.peer != before.peer)
            },
        )
        .await;
        for id in &ids {
            assert_eq!(
                v.tasks()[id].state(),
                TaskState::Succeeded,
                "{id} on node {i}"
            );
        }
    }
    // Both survivors name the same router, with a greater term, and only it is active.
    let after: Vec<_> = survivors
        .iter()
        .map(|&i| views[i].borrow().router.clone().unwrap())
        .collect();
    assert_eq!(
        after[0], after[1],
        "the survivors agree on the effective router"
    );
    assert!(
        after[0] > before,
        "the new router's claim is greater than the dead one's"
    );
    assert_ne!(after[0].peer, before.peer);
    let mut active = vec![];
    for &i in &survivors {
        if role_on(&handles[i], &queue).await == "active" {
            active.push(handles[i].peer_id().clone());
        }
    }
    assert_eq!(
        active,
        vec![after[0].peer.clone()],
        "exactly the effective router is active"
    );
    // And the outcomes are readable from a survivor (these tasks are inline: their results
    // travel in the queue document).
    let s = handles[survivors[1]].task_status(&ids[0]).await.unwrap();
    assert_eq!(s.state, TaskState::Succeeded);
    assert!(
        s.result.is_some(),
        "the result travelled with the queue document"
    );
}

/// The demo itself, small: what `piecework demo --json` reports is checked here too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_reports_a_takeover_with_nothing_lost() {
    let opts = piecework::demo::Options {
        nodes: 3,
        tasks: 60,
        progress: false,
        ..Default::default()
    };
    let s = piecework::demo::run(&opts).await.unwrap();
    assert_eq!(s.tasks_submitted, 60);
    assert_eq!(s.tasks_completed, 60);
    assert_eq!(s.lost, 0);
    assert_ne!(s.router_before, s.router_after);
    assert!(s.term_after > s.term_before);
    assert!(
        s.executions >= 60,
        "every completed task ran at least once: {s:?}"
    );
    assert!(s.completed_at_kill < 60, "the router died mid-run: {s:?}");
}
