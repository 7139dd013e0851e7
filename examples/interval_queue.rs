//! Seed 001's story: a queue that starts one task per interval across three nodes, whoever
//! routes it. It is paused from one node and resumed from another, and its active router is
//! killed mid-way: the successor keeps the interval.
//!
//! `cargo run --release --example interval_queue`. Fast timings (a 300 ms rate interval,
//! takeover after 150 ms of silence). The example checks its own outcome from the queue
//! document's records (each attempt's `assigned_at`, on the assigning router's clock) and
//! exits non-zero if two assignments came closer than the interval, one came while the queue
//! was paused, no other member took over, or a task did not succeed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{QueueConfig, QueueId, QueueView, TaskState};
use piecework::worker_pool::{Context, HandlerError, Registry};
use serde_json::{Value, json};

const TASKS: usize = 16;
const INTERVAL_MS: u64 = 300;
/// How long after a pause is acknowledged its router may still assign (the pause reaches it
/// over the network).
const PAUSE_REACH_MS: u64 = 100;

async fn tick(_ctx: Context, input: Value) -> Result<Value, HandlerError> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(input)
}

async fn start(
    dir: &std::path::Path,
    name: &str,
    bootstrap: Vec<piecework::node::Multiaddr>,
) -> anyhow::Result<IsolatedNode> {
    let mut r = Registry::new();
    r.register("tick", tick);
    let mut c = Config::new(dir.join(name), r);
    c.workers = 2;
    c.bootstrap = bootstrap;
    spawn_isolated(c, 1)
        .await
        .with_context(|| format!("node {name}"))
}

async fn until(
    node: &NodeHandle,
    queue: &QueueId,
    what: &str,
    done: impl Fn(&QueueView) -> bool,
) -> anyhow::Result<std::sync::Arc<QueueView>> {
    let limit = Duration::from_secs(30);
    let mut rx = node.watch_queue(queue).context("joined")?;
    let view = tokio::time::timeout(limit, rx.wait_for(|v| done(v)))
        .await
        .with_context(|| format!("waited {limit:?} for {what}"))?
        .context("the node stopped")?;
    Ok(view.clone())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn succeeded(v: &QueueView) -> usize {
    v.total_counts().succeeded
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let a = start(dir.path(), "a", vec![]).await?;
    let addr = a.handle().wait_listening().await;
    let b = start(dir.path(), "b", vec![addr.clone()]).await?;
    let c = start(dir.path(), "c", vec![addr]).await?;
    let mut nodes = [Some(a), Some(b), Some(c)];
    let h: Vec<NodeHandle> = nodes.iter().flatten().map(|n| n.handle().clone()).collect();

    let config = QueueConfig {
        rate_interval_ms: INTERVAL_MS,
        // A router heartbeat every 50 ms, takeover after 150 ms of silence.
        ..piecework::demo::fast_config()
    };
    let queue = h[0].create_queue("interval", Some(config)).await?;
    for n in &h[1..] {
        n.join_from(&h[0], &queue, piecework::queue_doc::Role::Member)
            .await?;
    }
    let v = until(&h[0], &queue, "a router and three members", |v| {
        v.router.is_some() && v.members.len() == 3
    })
    .await?;
    let first = v.router.clone().context("a router")?;
    let router = h
        .iter()
        .position(|n| *n.peer_id() == first.peer)
        .context("the router is a member")?;
    let (x, y) = ((router + 1) % 3, (router + 2) % 3);

    let mut ids = vec![];
    for i in 0..TASKS {
        let req = api::SubmitTask::new("tick", json!({ "i": i }));
        ids.push(h[i % 3].submit(&queue, req).await?.task_id);
    }
    println!("{TASKS} tasks submitted; one starts every {INTERVAL_MS} ms");

    until(&h[x], &queue, "4 tasks done", |v| succeeded(v) >= 4).await?;
    h[x].set_paused(&queue, true).await?;
    let paused_at = unix_ms();
    println!("paused from node {x}");
    let during = until(&h[y], &queue, "the pause to reach node y", |v| v.paused).await?;
    let done_then = succeeded(&during);
    tokio::time::sleep(Duration::from_millis(4 * INTERVAL_MS)).await;
    let resumed_at = unix_ms();
    h[y].set_paused(&queue, false).await?;
    println!("resumed from node {y}");

    until(&h[x], &queue, "9 tasks done", |v| succeeded(v) >= 9).await?;
    println!("killing node {router}, the active router");
    drop(nodes[router].take().context("alive")?.kill());
    let v = until(&h[x], &queue, "every task done", |v| succeeded(v) >= TASKS).await?;

    let next = v.router.clone().context("a router")?;
    ensure!(
        next.peer != first.peer && next.term > first.term,
        "another member took over: {next:?} after {first:?}"
    );
    println!("took over: {} at term {}", next.peer, next.term);
    for id in &ids {
        let t = v.task(id).context("the task is in the queue")?;
        ensure!(t.state() == TaskState::Succeeded, "{id}: {:?}", t.state());
    }
    let mut assigned: Vec<u64> = v
        .tasks()
        .values()
        .flat_map(|t| t.attempts.iter().map(|a| a.assigned_at))
        .collect();
    assigned.sort();
    let gaps: Vec<u64> = assigned.windows(2).map(|w| w[1] - w[0]).collect();
    let closest = gaps.iter().copied().min().unwrap_or(0);
    println!(
        "{} assignments, the closest two {closest} ms apart",
        assigned.len()
    );
    // Wall-clock milliseconds round: allow one.
    ensure!(
        closest + 1 >= INTERVAL_MS,
        "two assignments {closest} ms apart, under the {INTERVAL_MS} ms interval: {gaps:?}"
    );
    let in_pause: Vec<&u64> = assigned
        .iter()
        .filter(|at| **at > paused_at + PAUSE_REACH_MS && **at < resumed_at)
        .collect();
    ensure!(
        in_pause.is_empty(),
        "assigned while paused ({paused_at}..{resumed_at}): {in_pause:?}"
    );
    println!("nothing assigned while paused ({done_then} done by then); all {TASKS} succeeded");
    Ok(())
}
