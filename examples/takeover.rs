//! Seed 002's story: three nodes share a queue, the active router dies mid-way, another member
//! takes over with write → wait → recheck, and every task submitted runs, none lost.
//!
//! `cargo run --release --example takeover`. Fast timings (a router heartbeat every 50 ms,
//! takeover after 150 ms of silence); the example checks its own outcome and exits non-zero if
//! a task is lost or no other member took over.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{QueueConfig, TaskId, TaskState};
use piecework::worker_pool::{Context, HandlerError, Registry};
use serde_json::{Value, json};

const TASKS: usize = 60;

/// The work: sleeps `{"ms": N}`, then answers its input.
async fn work(_ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let ms = input["ms"].as_u64().unwrap_or(20);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    Ok(input)
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register("work", work);
    r
}

/// A node on a runtime of its own, so that killing it stops it dead (as a crash would).
async fn start(
    dir: &std::path::Path,
    name: &str,
    bootstrap: Vec<piecework::node::Multiaddr>,
) -> anyhow::Result<IsolatedNode> {
    let mut c = Config::new(dir.join(name), registry());
    c.workers = 2;
    c.bootstrap = bootstrap;
    spawn_isolated(c, 1)
        .await
        .with_context(|| format!("node {name}"))
}

/// Waits until `node`'s view of the queue satisfies `done`, up to `limit`.
async fn until(
    node: &NodeHandle,
    queue: &piecework::queue_doc::QueueId,
    limit: Duration,
    what: &str,
    done: impl Fn(&piecework::queue_doc::QueueView) -> bool,
) -> anyhow::Result<std::sync::Arc<piecework::queue_doc::QueueView>> {
    let mut rx = node
        .watch_queue(queue)
        .context("the node has joined the queue")?;
    let view = tokio::time::timeout(limit, rx.wait_for(|v| done(v)))
        .await
        .with_context(|| format!("waited {limit:?} for {what}"))?
        .context("the node stopped")?;
    Ok(view.clone())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let a = start(dir.path(), "a", vec![]).await?;
    let addr = a.handle().wait_listening().await;
    let b = start(dir.path(), "b", vec![addr.clone()]).await?;
    let c = start(dir.path(), "c", vec![addr]).await?;
    let mut nodes = [Some(a), Some(b), Some(c)];
    let handles: Vec<NodeHandle> = nodes.iter().flatten().map(|n| n.handle().clone()).collect();

    let config = QueueConfig {
        // A router heartbeat every 50 ms, takeover after 150 ms of silence.
        ..piecework::demo::fast_config()
    };
    let queue = handles[0].create_queue("takeover", Some(config)).await?;
    for h in &handles[1..] {
        h.join_from(&handles[0], &queue, piecework::queue_doc::Role::Member)
            .await?;
    }
    let first = until(
        &handles[0],
        &queue,
        Duration::from_secs(10),
        "a router",
        |v| v.router.is_some() && v.members.len() == 3,
    )
    .await?
    .router
    .clone()
    .context("a router")?;
    let dead = handles
        .iter()
        .position(|h| *h.peer_id() == first.peer)
        .context("the router is one of the three")?;
    println!("router: node {dead} ({}), term {}", first.peer, first.term);

    // Half the tasks, through every node; the router dies while they run; then the rest.
    let mut ids: Vec<TaskId> = vec![];
    for i in 0..TASKS / 2 {
        let req = api::SubmitTask::new("work", json!({ "i": i, "ms": 30 }));
        ids.push(handles[i % 3].submit(&queue, req).await?.task_id);
    }
    let survivor = (dead + 1) % 3;
    until(
        &handles[survivor],
        &queue,
        Duration::from_secs(10),
        "some tasks to run",
        |v| v.total_counts().succeeded >= 5,
    )
    .await?;
    println!("killing node {dead}, the active router");
    // Its runtime stops at once, mid-whatever it was doing (its store is released once the
    // handles below are dropped too; nothing restarts on it here).
    drop(nodes[dead].take().context("alive")?.kill());
    for i in TASKS / 2..TASKS {
        let via = if i % 2 == 0 { survivor } else { (dead + 2) % 3 };
        let req = api::SubmitTask::new("work", json!({ "i": i, "ms": 30 }));
        ids.push(handles[via].submit(&queue, req).await?.task_id);
    }

    let view = until(
        &handles[survivor],
        &queue,
        Duration::from_secs(30),
        "a new router",
        |v| v.router.as_ref().is_some_and(|r| r.peer != first.peer),
    )
    .await?;
    let next = view.router.clone().context("a router")?;
    println!("took over: {} at term {}", next.peer, next.term);
    ensure!(
        next.term > first.term,
        "the new claim is above the dead router's"
    );

    let mut ran_on = std::collections::BTreeMap::new();
    for id in &ids {
        let s = handles[survivor]
            .wait_task(id, Duration::from_secs(30))
            .await?;
        ensure!(
            s.state == TaskState::Succeeded,
            "task {id} ended {:?}, not succeeded",
            s.state
        );
        let succeeded = |r: &&piecework::queue_doc::task::Run| {
            r.end.as_ref().is_some_and(|e| e.result.is_some())
        };
        if let Some(run) = s.runs.iter().rev().find(succeeded) {
            *ran_on.entry(run.worker.peer.to_string()).or_insert(0usize) += 1;
        }
    }
    println!(
        "all {} tasks succeeded; runs by node: {ran_on:?}",
        ids.len()
    );
    Ok(())
}
