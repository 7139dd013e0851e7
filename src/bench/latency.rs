//! The latency phase: tasks one at a time, each waited for before the next, on the idle
//! cluster; submit → start and submit → done of each.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use piecework_node::api;
use piecework_queue_doc::{AttemptOutcome, TaskId};

use super::cluster::Cluster;
use super::{Display, Options, ms, wall_ms};

/// The wall-clock start (unix ms) of the attempt that succeeded, or else of the last one
/// that started.
fn started_at(status: &api::TaskStatus) -> Option<u64> {
    status
        .attempts
        .iter()
        .filter(|a| a.started.is_some())
        .max_by_key(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        })
        .and_then(|a| a.started.as_ref())
        .map(|s| s.at)
}

pub(super) async fn latency(
    cluster: &Cluster,
    opts: &Options,
    display: &Display,
    all: &mut Vec<TaskId>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let handles = cluster.handles();
    let queue = &cluster.queue;
    measure_latency(opts, display, all, "", |i, req| {
        let h = handles[i % handles.len()].clone();
        async move {
            let id = h
                .submit(queue, req)
                .await
                .context("a latency submit failed")?
                .task_id;
            let status = h
                .wait_task(&id, Duration::from_secs(60))
                .await
                .with_context(|| format!("waiting for latency task {id}"))?;
            Ok(status)
        }
    })
    .await
}

/// The latency phase's loop: `run_one(i, task)` submits task `i` and waits for its outcome.
/// Returns the submit→start and submit→done samples, in ms.
pub(super) async fn measure_latency<F, Fut>(
    opts: &Options,
    display: &Display,
    all: &mut Vec<TaskId>,
    via: &str,
    mut run_one: F,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)>
where
    F: FnMut(usize, api::SubmitTask) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<api::TaskStatus>>,
{
    let s = opts.latency_samples;
    let (mut to_start, mut to_done) = (Vec::with_capacity(s), Vec::with_capacity(s));
    if s == 0 {
        return Ok((to_start, to_done));
    }
    display.say(format!("latency: {s} tasks, one at a time{via}"));
    display.start(s, "latency");
    for i in 0..s {
        let req = opts.kind.request(opts.tasks + i);
        let wall = wall_ms();
        let t = Instant::now();
        let status = run_one(i, req).await?;
        to_done.push(ms(t.elapsed()));
        let id = status.id.clone();
        let at = started_at(&status)
            .with_context(|| format!("latency task {id} ended without a started attempt"))?;
        to_start.push(at.saturating_sub(wall) as f64);
        all.push(id);
        display.bar.inc(1);
    }
    Ok((to_start, to_done))
}
