//! `piecework bench --processes`: the cluster as separate `piecework node` processes (this
//! very executable), fed and watched through their HTTP APIs on loopback, and killed with
//! SIGKILL. What only processes can show: each node's own peak resident set.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use piecework_node::api;
use piecework_queue_doc::{Claim, QueueId, TaskId, TaskState};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{oneshot, watch};

use super::routers::{Observer, Routers};
use super::throughput::{Throughput, submit_http};
use super::{Display, Options, deadline_for, wall_ms};
use crate::client::Client;

/// How often the bench asks node 0 for its task counts while tasks run.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// One node process, in a process group of its own (see [`kill_group`]).
struct Proc {
    child: Child,
    client: Client,
    peer: String,
    /// Its libp2p address with its peer id, to bootstrap from.
    addr: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        kill_group(&self.child);
    }
}

/// Starts `cmd` as the leader of a new process group, which [`kill_group`] kills whole: a
/// `--node-exe` wrapper that runs the node as its child (rather than `exec`ing it) then takes
/// its node down with it, and no node outlives the bench.
fn grouped(cmd: &mut Command) -> &mut Command {
    cmd.process_group(0).kill_on_drop(true)
}

/// SIGKILL to every process of the group `child` leads (started by [`grouped`]). Nothing once
/// the child has been waited for: its id, and so its group's, may belong to another process
/// by then.
#[allow(unsafe_code)]
fn kill_group(child: &Child) {
    let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals that process group; it reads and writes no
    // memory of this process. The group is the child's own (process_group(0)), and the child
    // has not been reaped (it has an id), so the group id is not reused.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

impl Proc {
    /// `VmHWM` of the process, in MiB, while it runs.
    fn peak_rss_mib(&self) -> Option<f64> {
        let pid = self.child.id()?;
        super::probes::vm_hwm_mib(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
    }
}

/// The node processes, by index; a killed node's slot is empty until it is restarted.
pub(super) struct Procs {
    exe: PathBuf,
    root: PathBuf,
    workers: u32,
    rotate_min_live: Option<usize>,
    archive_keep: u64,
    max_live: Option<usize>,
    nodes: Vec<Option<Proc>>,
    pub(super) queue: QueueId,
    /// The largest `VmHWM` seen per node, over its lives.
    peak_rss: Vec<Option<f64>>,
}

impl Procs {
    /// Starts the nodes, creates the queue on node 0, joins it from the others, and waits
    /// until every node sees a router.
    pub(super) async fn start(opts: &Options, root: &Path) -> anyhow::Result<Procs> {
        let exe = match &opts.exe {
            Some(e) => e.clone(),
            None => std::env::current_exe().context("cannot find this executable")?,
        };
        let mut procs = Procs {
            exe,
            root: root.to_owned(),
            workers: opts.workers,
            rotate_min_live: opts.rotate_min_live,
            archive_keep: opts.archive_keep(),
            max_live: opts.node_max_live(),
            nodes: Vec::new(),
            queue: QueueId::new("none"),
            peak_rss: vec![None; opts.nodes],
        };
        for i in 0..opts.nodes {
            let bootstrap = procs
                .nodes
                .first()
                .and_then(|n| n.as_ref())
                .map(|n| n.addr.clone());
            let p = procs.spawn(i, bootstrap).await?;
            procs.nodes.push(Some(p));
        }
        let queue = procs
            .client(0)?
            .create_queue("bench", Some(opts.timings.config()))
            .await
            .context("cannot create the queue")?;
        procs.queue = queue.clone();
        let admin = procs.client(0)?;
        for i in 1..opts.nodes {
            let peer = procs.nodes[i]
                .as_ref()
                .map(|n| n.peer.clone())
                .unwrap_or_default();
            procs
                .client(i)?
                .join_from(&admin, &queue, &peer, crate::queue_doc::Role::Member)
                .await
                .with_context(|| format!("node {i} cannot join the queue"))?;
        }
        for i in 0..opts.nodes {
            procs.router(i, None).await?;
        }
        Ok(procs)
    }

    /// Starts node `i` on its data directory and waits until it serves its HTTP API (it
    /// prints the address once bound).
    async fn spawn(&self, i: usize, bootstrap: Option<String>) -> anyhow::Result<Proc> {
        let dir = self.root.join(format!("node{i}"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(format!("node{i}.log")))
            .context("cannot create a node's log file")?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("node")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--listen", "/ip4/127.0.0.1/tcp/0", "--http", "127.0.0.1:0"])
            .args(["--workers", &self.workers.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        grouped(&mut cmd);
        if let Some(b) = bootstrap {
            cmd.args(["--bootstrap", &b]);
        }
        if let Some(m) = self.rotate_min_live {
            cmd.args(["--rotate-min-live", &m.to_string()]);
        }
        cmd.args(["--archive-keep", &self.archive_keep.to_string()]);
        if let Some(m) = self.max_live {
            cmd.args(["--max-live", &m.to_string()]);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start node {i} ({})", self.exe.display()))?;
        let out = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(out).lines();
        let (mut peer, mut addr, mut http) = (None, None, None);
        let read = async {
            while let Some(line) = lines.next_line().await? {
                if let Some(p) = line.strip_prefix("peer id: ") {
                    peer = Some(p.to_owned());
                } else if let Some(a) = line.strip_prefix("listening on: ") {
                    addr.get_or_insert(a.to_owned());
                } else if let Some(h) = line.strip_prefix("http api: ") {
                    http = Some(h.to_owned());
                    break;
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(60), read)
            .await
            .with_context(|| format!("node {i} did not start within 60 s"))??;
        let (Some(peer), Some(addr), Some(http)): (Option<String>, Option<String>, Option<String>) =
            (peer, addr, http)
        else {
            bail!(
                "node {i} exited before it served its HTTP API (see {})",
                self.root.join(format!("node{i}.log")).display()
            );
        };
        // Its stdout is not read again: let what it prints go nowhere.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Proc {
            child,
            client: Client::new(&http)?,
            addr: format!("{addr}/p2p/{peer}"),
            peer,
        })
    }

    fn proc(&self, i: usize) -> anyhow::Result<&Proc> {
        self.nodes[i]
            .as_ref()
            .with_context(|| format!("node {i} is not running"))
    }

    pub(super) fn client(&self, i: usize) -> anyhow::Result<Client> {
        Ok(self.proc(i)?.client.clone())
    }

    pub(super) fn clients(&self) -> Vec<Client> {
        self.nodes
            .iter()
            .flatten()
            .map(|p| p.client.clone())
            .collect()
    }

    /// The queue as node `i` sees it.
    async fn queue_status(&self, i: usize) -> anyhow::Result<api::QueueStatus> {
        let s = self.client(i)?.status().await?;
        s.queues
            .into_iter()
            .find(|q| q.id == self.queue)
            .with_context(|| format!("node {i} does not serve the queue"))
    }

    /// The router node `i` sees, once it sees one greater than `above`.
    async fn router(&self, i: usize, above: Option<&Claim>) -> anyhow::Result<Claim> {
        poll(Duration::from_secs(60), "a router", || async {
            let q = self.queue_status(i).await.ok()?;
            q.router.filter(|r| above.is_none_or(|a| r > a))
        })
        .await
    }

    /// Tasks of the queue that ended, as node `i` counts them over the queue's life.
    async fn ended(&self, i: usize) -> anyhow::Result<usize> {
        let c = self.queue_status(i).await?.tasks;
        Ok(c.succeeded + c.failed)
    }

    /// Records every node's `VmHWM` now.
    pub(super) fn sample_rss(&mut self) {
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(r) = n.as_ref().and_then(Proc::peak_rss_mib) {
                let p = &mut self.peak_rss[i];
                *p = Some(p.map_or(r, |p: f64| p.max(r)));
            }
        }
    }

    /// Each node's peak resident set over its lives, in MiB.
    pub(super) fn peak_rss(&self) -> Vec<Option<f64>> {
        self.peak_rss.clone()
    }

    /// A watch on every node's router (see [`Routers`]).
    pub(super) fn watch_routers(&self) -> anyhow::Result<Routers> {
        let mut peers = Vec::new();
        let mut observers = Vec::new();
        for i in 0..self.nodes.len() {
            let p = self.proc(i)?;
            peers.push(piecework_queue_doc::PeerId::new(p.peer.clone()));
            observers.push(Observer::Http(p.client.clone(), self.queue.clone()));
        }
        Ok(Routers::start(peers, observers))
    }
}

/// Calls `look` every [`POLL_EVERY`] until it finds something, up to `within`.
async fn poll<T, F, Fut>(within: Duration, what: &str, mut look: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    tokio::time::timeout(within, async {
        let mut tick = tokio::time::interval(POLL_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(t) = look().await {
                return t;
            }
        }
    })
    .await
    .with_context(|| format!("timed out after {within:?} waiting for {what}"))
}

/// Waits until node `i` counts at least `total` ended tasks; returns when it saw it.
async fn wait_ended(
    procs: &Procs,
    i: usize,
    total: usize,
    within: Duration,
) -> anyhow::Result<Instant> {
    poll(within, "every task to succeed or fail", || async {
        let n = procs.ended(i).await.ok()?;
        (n >= total).then(Instant::now)
    })
    .await
}

/// The throughput phase through the nodes' HTTP APIs.
pub(super) async fn throughput(
    procs: &mut Procs,
    opts: &Options,
    display: &Display,
) -> anyhow::Result<Throughput> {
    let m = opts.tasks;
    let clients = procs.clients();
    let base = procs.ended(0).await?;
    // Node 0's count of ended tasks, polled while the phase runs.
    let (ended_tx, ended_rx) = watch::channel(0usize);
    let watcher = {
        let c0 = procs.client(0)?;
        let queue = procs.queue.clone();
        tokio::spawn(async move {
            let mut seen: Vec<(Instant, usize)> = Vec::new();
            let mut tick = tokio::time::interval(POLL_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Ok(s) = c0.status().await else { continue };
                let Some(q) = s.queues.into_iter().find(|q| q.id == queue) else {
                    continue;
                };
                let done = (q.tasks.succeeded + q.tasks.failed).saturating_sub(base);
                if seen.last().is_none_or(|(_, d)| done > *d) {
                    seen.push((Instant::now(), done));
                    ended_tx.send_replace(done);
                }
                if done >= m {
                    return seen;
                }
            }
        })
    };
    let q = &procs.queue;
    let (ids, acks, t0) = super::throughput::submit_all(opts, display, ended_rx, |turn, reqs| {
        let client = clients[turn % clients.len()].clone();
        async move { submit_http(&client, q, reqs).await }
    })
    .await?;
    procs.sample_rss();
    display.start(m, "done");
    let seen = tokio::time::timeout(deadline_for(m), watcher)
        .await
        .context("timed out waiting for every task to succeed or fail")?
        .context("the watcher of node 0 panicked")?;
    procs.sample_rss();
    let end = seen.last().map_or(t0, |(t, _)| *t);
    Ok(Throughput::of(ids, &acks, t0, end, &seen, display))
}

/// The latency phase: one task at a time, round-robin, each awaited through HTTP.
pub(super) async fn latency(
    procs: &Procs,
    opts: &Options,
    display: &Display,
    all: &mut Vec<TaskId>,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let clients = procs.clients();
    let queue = &procs.queue;
    super::latency::measure_latency(opts, display, all, ", through HTTP", |i, req| {
        let c = clients[i % clients.len()].clone();
        async move {
            let id = c
                .submit(queue, &req)
                .await
                .context("a latency submit failed")?
                .task_id;
            c.wait(&id, Duration::from_secs(60))
                .await
                .with_context(|| format!("waiting for latency task {id}"))
        }
    })
    .await
}

/// One failover: SIGKILL the router's process; returns the milliseconds from the kill to the
/// first attempt assigned under a greater claim, as the trickle's tasks record it.
pub(super) async fn failover_round(
    procs: &mut Procs,
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
    let c = procs.client(via)?;
    display.say(format!(
        "failover {}/{}: router is node {victim} (term {}); trickling tasks through node {via}",
        round + 1,
        opts.failovers,
        old.term
    ));
    let (stop, stop_rx) = oneshot::channel();
    let (acked_tx, mut acked) = watch::channel(Vec::new());
    let (c2, q) = (c.clone(), procs.queue.clone());
    let submit = move |req: api::SubmitTask| {
        let (c, q) = (c2.clone(), q.clone());
        async move { Ok(c.submit(&q, &req).await?.task_id) }
    };
    let mut trickling = tokio::spawn(super::failover::trickle(
        submit,
        opts.kind,
        all.len(),
        stop_rx,
        acked_tx,
    ));
    super::failover::flowing(&mut acked, &mut trickling, via).await?;

    procs.sample_rss();
    let mut killed = procs.nodes[victim]
        .take()
        .context("the router's node is not running")?;
    kill_group(&killed.child);
    let kill_wall = wall_ms();
    routers.killed(victim);
    killed.child.wait().await.context("the killed process")?;

    // The trickle's tasks, newest first, until one shows an attempt of a new router.
    let assigned_at = match poll(
        Duration::from_secs(60),
        "an attempt by a new router",
        || {
            let ids: Vec<TaskId> = acked.borrow().iter().rev().take(20).cloned().collect();
            let c = c.clone();
            let old = old.clone();
            async move {
                let mut first: Option<u64> = None;
                for id in ids {
                    let s = c.task_status(&id).await.ok()?;
                    if let Some(at) = s
                        .attempts
                        .iter()
                        .filter(|a| a.id.claim > old && a.assigned_at >= kill_wall)
                        .map(|a| a.assigned_at)
                        .min()
                    {
                        first = Some(first.map_or(at, |f| f.min(at)));
                    }
                }
                first
            }
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

    let bootstrap = procs.proc(via)?.addr.clone();
    let started_at = wall_ms();
    let restarted = procs.spawn(victim, Some(bootstrap)).await?;
    routers.started(
        victim,
        started_at,
        Observer::Http(restarted.client.clone(), procs.queue.clone()),
    );
    procs.nodes[victim] = Some(restarted);
    procs.router(victim, Some(&old)).await?;
    display.say(format!(
        "failover {}/{}: node {victim} restarted and sees the new router",
        round + 1,
        opts.failovers
    ));
    let _ = stop.send(());
    let ids = trickling.await.context("the trickle panicked")??;
    all.extend(ids);
    wait_ended(procs, via, all.len(), deadline_for(all.len())).await?;
    Ok(takeover_ms)
}

/// The checks: every task's state through the first live node's HTTP API; returns
/// (succeeded, tasks with more than one successful attempt, the router's term, the epoch).
pub(super) async fn check(
    procs: &Procs,
    all: &[TaskId],
    display: &Display,
) -> anyhow::Result<(usize, usize, u64, u64)> {
    let observer = (0..procs.nodes.len())
        .find(|&i| procs.nodes[i].is_some())
        .context("no node left")?;
    display.say(format!("checks: waiting for all {} tasks", all.len()));
    if let Err(e) = wait_ended(procs, observer, all.len(), deadline_for(all.len())).await {
        display.say(format!("{e:#}; counting the rest as lost"));
    }
    let c = procs.client(observer)?;
    let term = procs.router(observer, None).await?.term;
    let epoch = procs.queue_status(observer).await?.epoch;
    let mut answers = futures::stream::iter(all.iter().cloned())
        .map(|id| {
            let c = c.clone();
            async move { c.task_status(&id).await }
        })
        .buffer_unordered(16);
    let (mut succeeded, mut duplicates) = (0, 0);
    while let Some(s) = answers.next().await {
        let Ok(s) = s else { continue };
        if s.state == TaskState::Succeeded {
            succeeded += 1;
        }
        if super::succeeded_attempts(&s.attempts) > 1 {
            duplicates += 1;
            display.say(format!(
                "duplicate: task {} succeeded more than once; attempts {}",
                s.id,
                serde_json::to_string(&s.attempts).unwrap_or_default()
            ));
        }
    }
    Ok((succeeded, duplicates, term, epoch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A wrapper that runs its program as a child, not with `exec`: killing the group takes
    /// the grandchild too. Both hold the stdout pipe, so its end of file is the event that
    /// both are dead; killing the wrapper alone left the grandchild holding it.
    #[tokio::test]
    async fn killing_the_group_takes_a_wrappers_child_with_it() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 600 & echo started; wait"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = grouped(&mut cmd).spawn().unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut first = [0u8; 8];
        out.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"started\n");
        kill_group(&child);
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), out.read_to_end(&mut rest))
            .await
            .expect("the wrapper's child outlived the group's kill")
            .unwrap();
        child.wait().await.unwrap();
    }
}
