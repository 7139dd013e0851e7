//! The throughput phase: every task submitted in batches through the nodes, round-robin, with
//! at most `window` in flight (and, with `--max-live`, at most that many live), until each one
//! succeeded or failed; its rates of acknowledgements and of outcomes. The submit loop and the
//! rates serve the in-process cluster and the node processes alike.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use piecework_node::{NodeHandle, api};
use piecework_queue_doc::{QueueId, TaskId};
use tokio::sync::watch;

use super::cluster::Cluster;
use super::{Display, Options, deadline_for, wait_final};

pub(super) struct Throughput {
    pub(super) ids: Vec<TaskId>,
    pub(super) tasks_per_s: f64,
    pub(super) first_rate: Option<f64>,
    pub(super) last_rate: Option<f64>,
    pub(super) done_first_rate: Option<f64>,
    pub(super) done_last_rate: Option<f64>,
    pub(super) submit_tenths: Vec<Option<f64>>,
    pub(super) done_tenths: Vec<Option<f64>>,
}

pub(super) async fn throughput(
    cluster: &Cluster,
    opts: &Options,
    display: &Display,
) -> anyhow::Result<Throughput> {
    let m = opts.tasks;
    let handles = cluster.handles();
    // With --http: an HTTP API per node on loopback, served on this runtime.
    let mut clients = Vec::new();
    if opts.http {
        for h in &handles {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("cannot bind an HTTP port")?;
            let base = format!("http://{}", listener.local_addr()?);
            tokio::spawn(piecework_node::http::serve(h.clone(), listener));
            clients.push(crate::client::Client::new(&base)?);
        }
    }
    let mut rx = cluster.watch(0)?;
    // Outcomes as node 0 sees them, recorded as they come: (when, how many had ended).
    let base = {
        let c = rx.borrow().total_counts();
        c.succeeded + c.failed
    };
    let (ended_tx, ended_rx) = watch::channel(0usize);
    let mut outcomes = {
        let mut rx = cluster.watch(0)?;
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut last = 0;
            while rx.changed().await.is_ok() {
                let c = rx.borrow_and_update().total_counts();
                let done = (c.succeeded + c.failed).saturating_sub(base);
                if done > last {
                    last = done;
                    seen.push((Instant::now(), done));
                    ended_tx.send_replace(done);
                }
                if done >= m {
                    break;
                }
            }
            seen
        })
    };
    let q = &cluster.queue;
    let (ids, acks, t0) = submit_all(opts, display, ended_rx, |turn, reqs| {
        let h = handles[turn % handles.len()].clone();
        let client = clients.get(turn % handles.len().max(1)).cloned();
        async move {
            match client {
                Some(c) => submit_http(&c, q, reqs).await,
                None => submit_batch(&h, q, reqs).await,
            }
        }
    })
    .await?;
    display.start(m, "done");
    let end = wait_final(&mut rx, m, deadline_for(m), Some(&display.bar)).await?;
    let seen = tokio::time::timeout(Duration::from_secs(10), &mut outcomes)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    outcomes.abort();
    Ok(Throughput::of(ids, &acks, t0, end, &seen, display))
}

impl Throughput {
    /// The phase's figures: `ids` acknowledged at `acks` (in order), the first submit at
    /// `t0`, the last outcome seen at `end`, and the outcomes as they were seen.
    pub(super) fn of(
        ids: Vec<TaskId>,
        acks: &[Instant],
        t0: Instant,
        end: Instant,
        seen: &[(Instant, usize)],
        display: &Display,
    ) -> Throughput {
        let m = ids.len();
        let span = end.duration_since(t0).as_secs_f64();
        let tasks_per_s = m as f64 / span;
        display.say(format!(
            "throughput: {tasks_per_s:.0} tasks/s ({m} in {span:.2} s)"
        ));
        let slice = m.div_ceil(10);
        let (done_first_rate, done_last_rate) = done_rates(seen, t0, m);
        Throughput {
            ids,
            tasks_per_s,
            first_rate: rate(&acks[..slice]),
            last_rate: rate(&acks[m - slice..]),
            done_first_rate,
            done_last_rate,
            submit_tenths: acks.chunks(slice).map(rate).collect(),
            done_tenths: done_tenths(seen, t0, m),
        }
    }
}

/// The submitting half of the throughput phase: `opts.tasks` tasks in batches of
/// `opts.batch`, the `turn`-th batch through `submit(turn, batch)`, at most `opts.window` in
/// flight and, with `opts.max_live`, at most that many submitted and not yet ended (`ended`
/// counts the ended ones). Returns the tasks, when each was acknowledged, and when the first
/// submit went out.
pub(super) async fn submit_all<F, Fut>(
    opts: &Options,
    display: &Display,
    mut ended: watch::Receiver<usize>,
    mut submit: F,
) -> anyhow::Result<(Vec<TaskId>, Vec<Instant>, Instant)>
where
    F: FnMut(usize, Vec<api::SubmitTask>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<TaskId>>>,
{
    let m = opts.tasks;
    display.say(format!(
        "throughput: {m} {} tasks, round-robin over {} node(s){}, in batches of {}, at most {} in flight",
        opts.kind.name(),
        opts.nodes,
        if opts.processes {
            " (each its own process, through HTTP)"
        } else {
            ""
        },
        opts.batch,
        opts.window
    ));
    display.start(m, "acknowledged");
    let mut ids = Vec::with_capacity(m);
    let mut acks = Vec::with_capacity(m);
    let mut inflight = FuturesUnordered::new();
    let mut in_flight = 0;
    let mut take = |r: anyhow::Result<Vec<TaskId>>| {
        let batch = r?;
        let at = Instant::now();
        display.bar.inc(batch.len() as u64);
        acks.extend(batch.iter().map(|_| at));
        let n = batch.len();
        ids.extend(batch);
        anyhow::Ok(n)
    };
    let t0 = Instant::now();
    let (mut i, mut turn) = (0, 0);
    while i < m {
        let n = opts.batch.min(m - i);
        if let Some(limit) = opts.max_live {
            // Submitted or in flight, and not yet ended: wait for outcomes to make room,
            // driving the submits in flight meanwhile.
            while i + n > limit + *ended.borrow_and_update() {
                tokio::select! {
                    r = ended.changed() => r.context("the count of outcomes stopped")?,
                    Some(r) = inflight.next(), if !inflight.is_empty() => in_flight -= take(r)?,
                }
            }
        }
        let reqs: Vec<api::SubmitTask> = (i..i + n).map(|j| opts.kind.request(j)).collect();
        inflight.push(submit(turn, reqs));
        turn += 1;
        i += n;
        in_flight += n;
        while in_flight >= opts.window {
            let r = inflight.next().await.expect("a submit in flight");
            in_flight -= take(r)?;
        }
    }
    while let Some(r) = inflight.next().await {
        take(r)?;
    }
    display.say(format!(
        "all {m} acknowledged after {:.2} s; waiting for their outcomes",
        t0.elapsed().as_secs_f64()
    ));
    Ok((ids, acks, t0))
}

/// How long a submit refused as "full" or "busy" waits before it is sent again.
const REFUSED_RETRY: Duration = Duration::from_millis(25);
/// How long a submit may go on being refused before the bench gives up on it: a node that
/// stays full this long has stopped finishing tasks, and one that is shutting down (which a
/// 503 also says over HTTP) will not take it at all.
const REFUSED_GIVE_UP: Duration = Duration::from_secs(60);

/// Calls `send` until it answers with anything but an error `refused` says is for now, waiting
/// [`REFUSED_RETRY`] between calls; after [`REFUSED_GIVE_UP`] of refusals, the last one.
async fn until_taken<T, E, Fut>(
    mut send: impl FnMut() -> Fut,
    refused: impl Fn(&E) -> bool,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let give_up = tokio::time::Instant::now() + REFUSED_GIVE_UP;
    loop {
        match send().await {
            Err(e) if refused(&e) && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(REFUSED_RETRY).await
            }
            r => return r,
        }
    }
}

/// Submits one task with `submit`, or several with `submit_many`; every one must be taken.
/// A submit the node refuses for now (its queue is full, or it is busy) is sent again, as a
/// client should, for at most [`REFUSED_GIVE_UP`].
async fn submit_batch(
    h: &NodeHandle,
    q: &QueueId,
    reqs: Vec<api::SubmitTask>,
) -> anyhow::Result<Vec<TaskId>> {
    let refused = |e: &api::SubmitError| {
        matches!(e, api::SubmitError::Full { .. } | api::SubmitError::Busy(_))
    };
    if let [req] = reqs.as_slice() {
        let r = until_taken(|| h.submit(q, req.clone()), refused).await;
        Ok(vec![r.context("a submit failed")?.task_id])
    } else {
        let r = until_taken(|| h.submit_many(q, reqs.clone()), refused).await;
        taken(r.context("a batch submit failed")?)
    }
}

/// The ids of a batch's entries, or an error naming the first one refused.
fn taken(entries: Vec<api::BatchEntry>) -> anyhow::Result<Vec<TaskId>> {
    entries
        .into_iter()
        .map(|e| match e {
            api::BatchEntry::Submitted { task_id, .. } => Ok(task_id),
            api::BatchEntry::Refused { index, error } => {
                Err(anyhow::anyhow!("batch entry {index} was refused: {error}"))
            }
        })
        .collect()
}

/// Submits a batch through the HTTP API (a JSON array, even of one); every one must be taken.
/// A 503 (the queue is full, or the node is busy or stopping) is sent again, for at most
/// [`REFUSED_GIVE_UP`].
pub(super) async fn submit_http(
    c: &crate::client::Client,
    q: &QueueId,
    reqs: Vec<api::SubmitTask>,
) -> anyhow::Result<Vec<TaskId>> {
    let entries = reqs
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    let unavailable = |e: &anyhow::Error| e.downcast_ref::<crate::client::Unavailable>().is_some();
    let r = until_taken(|| c.submit_many(q, &entries), unavailable).await;
    taken(r.context("an HTTP batch submit failed")?)
}

/// Outcomes per second over the first and the last tenth of `m` tasks to end, from `seen`
/// ((when, how many had ended), in order) and the first submit `t0`.
fn done_rates(seen: &[(Instant, usize)], t0: Instant, m: usize) -> (Option<f64>, Option<f64>) {
    let slice = m.div_ceil(10);
    let at = |n: usize| seen.iter().find(|(_, d)| *d >= n).map(|(t, _)| *t);
    let per_s = |n: usize, from: Instant, to: Instant| {
        let span = to.duration_since(from).as_secs_f64();
        (span > 0.0).then(|| n as f64 / span)
    };
    let first = at(slice).and_then(|t| per_s(slice, t0, t));
    let last = at(m - slice)
        .zip(at(m))
        .and_then(|(from, to)| per_s(slice, from, to));
    (first, last)
}

/// Outcomes per second over each tenth of `m` outcomes (`seen` as in [`done_rates`]): the
/// first from `t0`, each next from the moment the one before it was complete.
fn done_tenths(seen: &[(Instant, usize)], t0: Instant, m: usize) -> Vec<Option<f64>> {
    let slice = m.div_ceil(10).max(1);
    let at = |n: usize| seen.iter().find(|(_, d)| *d >= n).map(|(t, _)| *t);
    let mut from = Some(t0);
    let mut out = Vec::new();
    let mut n = 0;
    while n < m {
        let next = (n + slice).min(m);
        let to = at(next);
        out.push(from.zip(to).and_then(|(f, t)| {
            let span = t.duration_since(f).as_secs_f64();
            (span > 0.0).then(|| (next - n) as f64 / span)
        }));
        from = to;
        n = next;
    }
    out
}

/// Acknowledgements per second within a slice: those after the first over the span from the
/// first to the last; `None` if the slice has fewer than 2 or spans no time.
fn rate(acks: &[Instant]) -> Option<f64> {
    let (first, last) = (acks.first()?, acks.last()?);
    let span = last.duration_since(*first).as_secs_f64();
    (acks.len() >= 2 && span > 0.0).then(|| (acks.len() - 1) as f64 / span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_refused_submit_is_sent_again_until_taken() {
        let mut calls = 0;
        let r: Result<u32, &str> = until_taken(
            || {
                calls += 1;
                let answer = if calls < 4 { Err("full") } else { Ok(calls) };
                std::future::ready(answer)
            },
            |e| *e == "full",
        )
        .await;
        assert_eq!(r, Ok(4));

        // Any other error is returned at once.
        let mut calls = 0;
        let r: Result<u32, &str> = until_taken(
            || {
                calls += 1;
                std::future::ready(Err("malformed"))
            },
            |e| *e == "full",
        )
        .await;
        assert_eq!((r, calls), (Err("malformed"), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_submit_refused_for_too_long_gives_up_with_the_refusal() {
        let started = tokio::time::Instant::now();
        let mut calls = 0u64;
        let r: Result<(), &str> = until_taken(
            || {
                calls += 1;
                std::future::ready(Err("stopping"))
            },
            |e| *e == "stopping",
        )
        .await;
        assert_eq!(r, Err("stopping"));
        let waited = started.elapsed();
        assert!(waited >= REFUSED_GIVE_UP, "gave up after {waited:?}");
        assert!(
            waited < REFUSED_GIVE_UP + REFUSED_RETRY * 2,
            "gave up after {waited:?}"
        );
        let expected = (REFUSED_GIVE_UP.as_millis() / REFUSED_RETRY.as_millis()) as u64 + 1;
        assert!(
            calls.abs_diff(expected) <= 1,
            "{calls} calls, expected about {expected}"
        );
    }

    #[test]
    fn outcome_rates_cover_the_first_and_last_tenth() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 100 tasks: the first 10 ended by 1 s, the 90th at 5 s, the last at 7 s.
        let seen = vec![
            (at(1000), 10),
            (at(3000), 50),
            (at(5000), 90),
            (at(7000), 100),
        ];
        let (first, last) = done_rates(&seen, t0, 100);
        assert_eq!(first, Some(10.0));
        assert_eq!(last, Some(5.0));
        // Never saw the end: no last rate.
        assert_eq!(done_rates(&seen[..2], t0, 100).1, None);
    }

    #[test]
    fn rates_need_two_acks_and_some_time() {
        let t = Instant::now();
        assert_eq!(rate(&[t]), None);
        assert_eq!(rate(&[t, t]), None);
        let r = rate(&[
            t,
            t + Duration::from_millis(500),
            t + Duration::from_secs(1),
        ])
        .unwrap();
        assert!((r - 2.0).abs() < 1e-9);
    }
}
