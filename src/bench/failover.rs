//! The failover phase: with a trickle of tasks going through a node that is not the router, the
//! router's node is killed, the time from the kill to the first attempt assigned under a greater
//! claim is measured, and the node is restarted on its data directory before the next round.
//! The trickle serves the in-process cluster and the node processes alike.

use std::time::Duration;

use anyhow::{Context as _, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use piecework_node::{api, spawn_isolated};
use piecework_queue_doc::TaskId;
use tokio::sync::{oneshot, watch};

use super::cluster::Cluster;
use super::routers::{Observer, Routers};
use super::{Display, Kind, Options, deadline_for, entries, wait_final, wait_view, wall_ms};

/// How often the failover trickle submits a task.
pub const TRICKLE_EVERY: Duration = Duration::from_millis(20);

/// Submits task `first`, `first + 1`, … with `submit` every [`TRICKLE_EVERY`] until `stop`;
/// returns the tasks acknowledged. `acked` holds them as they come.
pub(super) async fn trickle<F, Fut>(
    submit: F,
    kind: Kind,
    first: usize,
    mut stop: oneshot::Receiver<()>,
    acked: watch::Sender<Vec<TaskId>>,
) -> anyhow::Result<Vec<TaskId>>
where
    F: Fn(api::SubmitTask) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<TaskId>>,
{
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut inflight = FuturesUnordered::new();
    let mut ids = Vec::new();
    let mut i = first;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                inflight.push(submit(kind.request(i)));
                i += 1;
            }
            Some(r) = inflight.next(), if !inflight.is_empty() => {
                ids.push(r.context("a trickle submit failed")?);
                acked.send_replace(ids.clone());
            }
        }
    }
    while let Some(r) = inflight.next().await {
        ids.push(r.context("a trickle submit failed")?);
    }
    Ok(ids)
}

/// Waits until the trickle `acked` reports has its first task acknowledged (it flows before
/// a kill). A trickle that stops first is reported with its own error.
pub(super) async fn flowing(
    acked: &mut watch::Receiver<Vec<TaskId>>,
    trickling: &mut tokio::task::JoinHandle<anyhow::Result<Vec<TaskId>>>,
    via: usize,
) -> anyhow::Result<()> {
    let first = tokio::time::timeout(
        Duration::from_secs(30),
        acked.wait_for(|ids| !ids.is_empty()),
    )
    .await
    .with_context(|| {
        format!("the trickle's first task through node {via} was not acknowledged within 30 s")
    })?;
    if first.is_ok() {
        return Ok(());
    }
    // The trickle ended before its first acknowledgement: say why.
    match trickling.await {
        Ok(Err(e)) => Err(e.context(format!("the trickle through node {via} stopped"))),
        Ok(Ok(_)) => bail!("the trickle through node {via} stopped before a task was acknowledged"),
        Err(e) => bail!("the trickle through node {via} panicked: {e}"),
    }
}

/// One failover: returns the milliseconds from the kill to the first attempt assigned under
/// a greater claim.
pub(super) async fn failover_round(
    cluster: &mut Cluster,
    routers: &Routers,
    opts: &Options,
    display: &Display,
    round: usize,
    all: &mut Vec<TaskId>,
) -> anyhow::Result<f64> {
    let n = opts.nodes;
    // Every node agrees on the router before it is killed.
    let old = routers.settled(Duration::from_secs(60)).await?;
    let victim = routers
        .node_of(&old.peer)
        .context("the router is not one of the bench's nodes")?;
    let via = (victim + 1) % n;
    let via_handle = cluster.handle(via)?;
    display.say(format!(
        "failover {}/{}: router is node {victim} (term {}); trickling tasks through node {via}",
        round + 1,
        opts.failovers,
        old.term
    ));
    display.start(opts.failovers, "failovers");
    display.bar.set_position(round as u64);

    let (stop, stop_rx) = oneshot::channel();
    let (acked_tx, mut acked) = watch::channel(Vec::new());
    let (h, q) = (via_handle.clone(), cluster.queue.clone());
    let submit = move |req| {
        let (h, q) = (h.clone(), q.clone());
        async move { Ok(h.submit(&q, req).await?.task_id) }
    };
    let mut trickling = tokio::spawn(trickle(submit, opts.kind, all.len(), stop_rx, acked_tx));
    flowing(&mut acked, &mut trickling, via).await?;

    let node = cluster.nodes[victim]
        .take()
        .context("the router's node is not running")?;
    let closed = node.kill();
    let kill_wall = wall_ms();
    routers.killed(victim);

    let mut rx = via_handle
        .watch_queue(&cluster.queue)
        .context("queue not open")?;
    let assigned_at = match wait_view(
        &mut rx,
        Duration::from_secs(60),
        "an attempt by a new router",
        |v| {
            entries(v)
                .flat_map(|t| t.attempts.iter())
                .filter(|a| a.id.claim > old && a.assigned_at >= kill_wall)
                .map(|a| a.assigned_at)
                .min()
        },
    )
    .await
    {
        Ok(at) => at,
        Err(e) => {
            let round = (round + 1, opts.failovers);
            return Err(routers.failover_failed(round, victim, &old, via, e).await);
        }
    };
    let takeover_ms = assigned_at.saturating_sub(kill_wall) as f64;
    display.say(format!(
        "failover {}/{}: a new router assigned its first task {takeover_ms} ms after the kill",
        round + 1,
        opts.failovers
    ));

    // Restart the victim on its data directory, bootstrapping from the trickle's node.
    tokio::time::timeout(Duration::from_secs(60), closed.wait())
        .await
        .context("the killed node's store was not released within 60 s")?;
    let addr = via_handle.wait_listening().await;
    let started_at = wall_ms();
    let restarted = spawn_isolated(
        Cluster::config(
            &cluster.root,
            cluster.workers,
            cluster.rotate_min_live,
            cluster.archive_keep,
            cluster.max_live,
            victim,
            vec![addr],
        ),
        1,
    )
    .await
    .with_context(|| format!("cannot restart node {victim} on its data directory"))?;
    let h = restarted.handle().clone();
    cluster.nodes[victim] = Some(restarted);
    let mut rx = match h.watch_queue(&cluster.queue) {
        Some(rx) => rx,
        None => {
            h.join_queue(&cluster.queue)
                .await
                .context("the restarted node cannot rejoin the queue")?;
            h.watch_queue(&cluster.queue).context("queue not open")?
        }
    };
    routers.started(victim, started_at, Observer::View(rx.clone()));
    wait_view(
        &mut rx,
        Duration::from_secs(60),
        "the restarted node to see the new router",
        |v| v.router.as_ref().filter(|r| **r > old).map(|_| ()),
    )
    .await?;
    display.say(format!(
        "failover {}/{}: node {victim} restarted and rejoined",
        round + 1,
        opts.failovers
    ));

    let _ = stop.send(());
    let ids = trickling.await.context("the trickle panicked")??;
    all.extend(ids);
    // The next round (or the checks) starts on an idle cluster.
    let mut rx = via_handle
        .watch_queue(&cluster.queue)
        .context("queue not open")?;
    wait_final(&mut rx, all.len(), deadline_for(all.len()), None).await?;
    display.bar.set_position(round as u64 + 1);
    Ok(takeover_ms)
}
