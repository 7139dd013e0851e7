//! Seed 003's story: recurring work items, each claimed by one node at a time with a lease.
//! Two items (`inbox`, `calendar`) come round every second by their schedules; a work item
//! needs the `site` resource, which only node c holds at first. Node c dies in the middle of an
//! item; nodes a and b then take the resource up, and the item is run again once its lease has
//! run out. The items keep coming round by their schedules, whoever routes the queue.
//!
//! `cargo run --release --example claim_lease`. Fast timings (a 500 ms lease, takeover after
//! 150 ms of silence). The example checks its own outcome from the queue document's records
//! and exits non-zero if the item c died in was not run again after its lease, a slot fired
//! twice or was skipped without being counted missed, or an item did not come round again.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{QueueConfig, QueueId, QueueView, TaskId, TaskState};
use piecework::worker_pool::{Context, HandlerError, Registry};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const EVERY_MS: u64 = 1_000;
const ITEMS: [&str; 2] = ["inbox", "calendar"];
const RESOURCE: &str = "site";
/// Runs of each item after the dead node's item was run again.
const ROUNDS_AFTER: usize = 3;

/// The item node c was running when it died, sent by its handler as the run starts.
type Claimed = Arc<Mutex<Option<oneshot::Sender<TaskId>>>>;

async fn start(
    dir: &std::path::Path,
    name: &'static str,
    bootstrap: Vec<piecework::node::Multiaddr>,
    claimed: Option<Claimed>,
) -> anyhow::Result<IsolatedNode> {
    let mut r = Registry::new();
    match claimed.clone() {
        // Node c: the first item it claims, it never finishes (it dies in the middle).
        Some(tx) => r.register("sync", move |ctx: Context, _input: Value| {
            let tx = tx.clone();
            async move {
                let first = tx.lock().expect("not poisoned").take();
                if let Some(first) = first {
                    let _ = first.send(ctx.task.clone());
                    tokio::time::sleep(Duration::from_secs(600)).await;
                }
                Ok::<_, HandlerError>(json!({ "by": name }))
            }
        }),
        None => r.register("sync", move |_ctx: Context, input: Value| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, HandlerError>(json!({ "item": input["item"], "by": name }))
        }),
    };
    let mut c = Config::new(dir.join(name), r);
    c.workers = 1;
    c.bootstrap = bootstrap;
    if claimed.is_some() {
        c.resources = vec![RESOURCE.to_owned()];
    }
    spawn_isolated(c, 1)
        .await
        .with_context(|| format!("node {name}"))
}

async fn until(
    node: &NodeHandle,
    queue: &QueueId,
    what: &str,
    done: impl Fn(&QueueView) -> bool,
) -> anyhow::Result<Arc<QueueView>> {
    let limit = Duration::from_secs(30);
    let mut rx = node.watch_queue(queue).context("joined")?;
    let view = tokio::time::timeout(limit, rx.wait_for(|v| done(v)))
        .await
        .with_context(|| format!("waited {limit:?} for {what}"))?
        .context("the node stopped")?;
    Ok(view.clone())
}

/// Each item's succeeded slot tasks, by slot (from their dedup keys `schedule/<item>/<slot>`).
fn rounds(v: &QueueView, item: &str) -> Vec<(u64, TaskId)> {
    let prefix = format!("schedule/{item}/");
    let mut out: Vec<(u64, TaskId)> = v
        .tasks()
        .values()
        .filter(|t| t.state() == TaskState::Succeeded)
        .filter_map(|t| {
            let slot = t.rules.dedup_key.as_deref()?.strip_prefix(&prefix)?;
            Some((slot.parse().ok()?, t.id.clone()))
        })
        .collect();
    out.sort();
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (tx, rx) = oneshot::channel();
    let claimed: Claimed = Arc::new(Mutex::new(Some(tx)));
    let a = start(dir.path(), "a", vec![], None).await?;
    let addr = a.handle().wait_listening().await;
    let b = start(dir.path(), "b", vec![addr.clone()], None).await?;
    let c = start(dir.path(), "c", vec![addr], Some(claimed)).await?;
    let h: Vec<NodeHandle> = [&a, &b, &c].iter().map(|n| n.handle().clone()).collect();

    let config = QueueConfig {
        // A router heartbeat every 50 ms, takeover after 150 ms of silence, lease 500 ms.
        ..piecework::demo::fast_config()
    };
    let lease_ms = config.lease_ms;
    let queue = h[0].create_queue("items", Some(config)).await?;
    for n in &h[1..] {
        n.join_from(&h[0], &queue, piecework::queue_doc::Role::Member)
            .await?;
    }
    until(&h[0], &queue, "a router and three members", |v| {
        v.router.is_some() && v.members.len() == 3
    })
    .await?;
    for item in ITEMS {
        let mut task = api::SubmitTask::new("sync", json!({ "item": item }));
        task.requires = vec![RESOURCE.to_owned()];
        let put = api::PutSchedule {
            every_ms: Some(EVERY_MS),
            cron: None,
            task,
            paused: false,
        };
        h[0].put_schedule(&queue, item, put).await?;
    }
    println!("two work items, each every {EVERY_MS} ms; only node c holds {RESOURCE:?}");

    let lost = tokio::time::timeout(Duration::from_secs(20), rx)
        .await
        .context("node c claimed no item")??;
    println!("node c claimed {lost}; killing it mid-item");
    drop(c.kill());
    for n in &h[..2] {
        n.add_resource(RESOURCE).await?;
    }
    println!("nodes a and b hold {RESOURCE:?} now");

    let v = until(&h[0], &queue, "the lost item to run again", |v| {
        v.task(&lost)
            .is_some_and(|t| t.state() == TaskState::Succeeded)
    })
    .await?;
    let t = v.task(&lost).context("the item")?;
    let first = t.attempts.first().context("c's attempt")?;
    let last = t.attempts.last().context("the attempt that succeeded")?;
    ensure!(
        t.attempts.len() >= 2 && first.worker.peer == *h[2].peer_id(),
        "the item ran again elsewhere: {:?}",
        t.attempts
    );
    // Millisecond wall clocks round: allow one.
    ensure!(
        last.assigned_at + 1 >= first.assigned_at + lease_ms,
        "run again {} ms after c's claim, inside the {lease_ms} ms lease",
        last.assigned_at.saturating_sub(first.assigned_at)
    );
    println!(
        "run again by {} {} ms after c claimed it (lease {lease_ms} ms)",
        last.worker.peer,
        last.assigned_at.saturating_sub(first.assigned_at)
    );

    let after = |v: &QueueView, item: &str| {
        rounds(v, item)
            .iter()
            .filter(|(_, id)| {
                v.task(id)
                    .and_then(|t| t.attempts.last())
                    .is_some_and(|a| a.assigned_at > last.assigned_at)
            })
            .count()
    };
    let v = until(&h[1], &queue, "each item to come round again", |v| {
        ITEMS.iter().all(|item| after(v, item) >= ROUNDS_AFTER)
    })
    .await?;
    let schedules = h[1].schedules(&queue).await?.schedules;
    for item in ITEMS {
        let slots: Vec<u64> = rounds(&v, item).iter().map(|(s, _)| *s).collect();
        let mut unique = slots.clone();
        unique.dedup();
        ensure!(unique == slots, "{item}: a slot ran twice: {slots:?}");
        let skipped: u64 = slots.windows(2).map(|w| (w[1] - w[0]) / EVERY_MS - 1).sum();
        let missed = schedules
            .iter()
            .find(|s| s.name == item)
            .map_or(0, |s| s.missed);
        ensure!(
            skipped <= missed,
            "{item}: {skipped} slots skipped between {slots:?}, {missed} counted missed"
        );
        println!(
            "{item}: {} rounds, one per slot, {skipped} slots skipped ({missed} counted missed)",
            slots.len()
        );
    }
    println!("every item came round again by its schedule");
    drop(a);
    drop(b);
    Ok(())
}
