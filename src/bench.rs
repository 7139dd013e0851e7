//! `piecework bench`: measures an in-process cluster over loopback.
//!
//! The run has these parts, in order (each announced on stderr):
//!
//! 1. **Probes**, before any node starts: `fsync_ms`, the median of 50 × (write 4 KiB to a file
//!    in the bench's temporary directory, then `sync_all`); and `floor_tasks_per_s`, the
//!    Automerge work of a task's life on one replica (submit → assign → start → finish on one
//!    queue document, no node, no network, no disk) for `min(tasks, 20 000)` tasks.
//! 2. **Throughput**: `tasks` tasks submitted round-robin through the nodes in batches of
//!    `batch` (`submit_many`; one at a time with `--batch 1`), with at most `window` tasks in
//!    flight, until every one succeeded or failed.
//! 3. **Latency**, on the now idle cluster: `latency_samples` tasks, one at a time, each
//!    waited for before the next.
//! 4. **Failover** (`failovers` times, 2 nodes or more): with a trickle of tasks going through
//!    a node that is not the router, the router's node is killed; the time from the kill to the
//!    first attempt assigned under a greater claim is measured; the node is restarted on its
//!    data directory and has rejoined before the next kill.
//! 5. **Checks** over every task submitted: none lost, how many succeeded more than once.
//!
//! Nothing waits on a fixed sleep: phases end on the nodes' queue views or on the tasks'
//! outcomes, each under a generous timeout. See `docs/benchmarks.md` for what each figure means.

// This file holds the options, the run (`run`, over the nodes in this process or over node
// processes) and what the parts share: the display and the waits on a queue view. The cluster
// in this process is in `cluster.rs`, node processes in `processes.rs`, the phases in
// `throughput.rs`, `latency.rs` and `failover.rs`, the probes in `probes.rs`, the report in
// `report.rs`, and what the bench sees of the router in `routers.rs`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use piecework_node::api;
use piecework_queue_doc::{AttemptOutcome, QueueView, TaskEntry, TaskId, TaskState};
use serde::Serialize;
use tokio::sync::watch;

mod cluster;
mod failover;
mod latency;
mod probes;
mod processes;
mod report;
mod routers;
mod throughput;

pub use failover::TRICKLE_EVERY;
pub use probes::{FLOOR_MAX_TASKS, FSYNC_SAMPLES};
pub use report::{Machine, Percentiles, Report, print_report};
pub use routers::RouterChange;

use cluster::Cluster;
use failover::failover_round;
use latency::latency;
use probes::{floor, fsync_probe, load_ms, peak_rss_mib, sample_documents, sample_once};
use report::{commit, machine};
use routers::{Observer, Routers};
use throughput::{Throughput, throughput};

/// The longest pause between two looks at a queue view (see [`wait_view`]).
const MAX_LOOK_PAUSE: Duration = Duration::from_millis(50);

/// The queue timings of the bench's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Timings {
    /// The demo's ([`crate::demo::demo_config`]): takeover after 1 s.
    Demo,
    /// The fastest the docs recommend ([`crate::demo::fast_config`]): takeover after 150 ms.
    Fast,
}

impl Timings {
    /// The queue configuration.
    pub fn config(self) -> piecework_queue_doc::QueueConfig {
        match self {
            Timings::Demo => crate::demo::demo_config(),
            Timings::Fast => crate::demo::fast_config(),
        }
    }
}

/// The task kind the bench submits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `noop` with input `{}`: measures the queue, not the work.
    Noop,
    /// `sha256` with `{"data": "...", "rounds": 1}`: one hash, and a result to carry back.
    Sha256,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Noop => "noop",
            Kind::Sha256 => "sha256",
        }
    }

    /// The submit request of the `i`th task of this kind.
    fn request(self, i: usize) -> api::SubmitTask {
        let input = match self {
            Kind::Noop => serde_json::json!({}),
            Kind::Sha256 => {
                serde_json::json!({ "data": format!("piecework bench task {i}"), "rounds": 1 })
            }
        };
        api::SubmitTask {
            kind: self.name().into(),
            input,
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
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Nodes in the cluster (at least 1; at least 2 for failovers).
    pub nodes: usize,
    /// Workers per node.
    pub workers: u32,
    /// Tasks in the throughput phase.
    pub tasks: usize,
    /// The kind of every task.
    pub kind: Kind,
    /// The queue's timings.
    pub timings: Timings,
    /// Router kills (0: no failover phase).
    pub failovers: usize,
    /// Tasks in the latency phase, one at a time.
    pub latency_samples: usize,
    /// The most tasks in flight (submitted, not yet acknowledged) during the throughput phase.
    pub window: usize,
    /// Tasks per submit in the throughput phase: 1 submits one at a time, more use
    /// `submit_many` (at most `api::MAX_BATCH`).
    pub batch: usize,
    /// Rotate the queue document past twice this many live tasks (`None`: the nodes'
    /// default).
    pub rotate_min_live: Option<usize>,
    /// Hold the throughput phase's live tasks (submitted and not yet final on the observing
    /// node) at most this many (`None`: only the window bounds the submitter).
    pub max_live: Option<usize>,
    /// Submit the throughput phase through each node's HTTP API instead of its handle.
    pub http: bool,
    /// Run each node as its own `piecework node` process (this executable), fed and
    /// watched through HTTP and killed with SIGKILL.
    pub processes: bool,
    /// The `piecework` executable `--processes` starts (`None`: this one).
    pub exe: Option<PathBuf>,
    /// Show phases and a progress bar on stderr.
    pub progress: bool,
}

impl Options {
    /// How many final statuses each node keeps: the checks read every task's, so at least
    /// all of the run's (a few times its throughput and latency tasks, for the failovers'
    /// trickle), and never fewer than a node's default.
    pub fn archive_keep(&self) -> u64 {
        let tasks = (self.tasks + self.latency_samples) as u64;
        piecework_node::storage::ARCHIVE_KEEP.max(4 * tasks)
    }

    /// The most live tasks each node takes submits for: with `--max-live`, room for twice as
    /// many as the submitter holds (the nodes count a task live until its outcome reaches
    /// them, the submitter until it sees it), never fewer than a node's default; without it,
    /// the node's default.
    pub fn node_max_live(&self) -> Option<usize> {
        self.max_live
            .map(|m| m.saturating_mul(2).max(piecework_node::MAX_LIVE))
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 1,
            workers: 4,
            tasks: 10_000,
            kind: Kind::Noop,
            timings: Timings::Demo,
            failovers: 0,
            latency_samples: 200,
            window: 256,
            batch: 64,
            rotate_min_live: None,
            max_live: None,
            http: false,
            processes: false,
            exe: None,
            progress: true,
        }
    }
}

impl Options {
    fn validate(&self) -> anyhow::Result<()> {
        if self.nodes < 1 {
            bail!("--nodes must be at least 1");
        }
        if self.tasks < 1 {
            bail!("--tasks must be at least 1");
        }
        if self.workers < 1 {
            bail!("--workers must be at least 1");
        }
        if self.workers > piecework_node::MAX_WORKERS {
            bail!(
                "--workers must be at most {} (a node's limit)",
                piecework_node::MAX_WORKERS
            );
        }
        if self.window < 1 {
            bail!("--window must be at least 1");
        }
        if let Some(l) = self.max_live
            && l < self.batch
        {
            bail!("--max-live must be at least --batch ({})", self.batch);
        }
        if !(1..=api::MAX_BATCH).contains(&self.batch) {
            bail!("--batch must be in [1, {}]", api::MAX_BATCH);
        }
        if self.failovers > 0 && self.nodes < 2 {
            bail!(
                "--failovers needs at least 2 nodes (--nodes {}): someone must take over from the killed router",
                self.nodes
            );
        }
        Ok(())
    }
}

/// Phases on stderr, with a progress bar (hidden when stderr is not a terminal).
struct Display {
    bar: ProgressBar,
    show: bool,
}

impl Display {
    fn new(show: bool) -> Self {
        let bar = if show {
            ProgressBar::new(0)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:40.cyan/blue} {pos:>6}/{len:6} {msg}")
                .expect("valid template"),
        );
        Display { bar, show }
    }

    fn start(&self, len: usize, msg: &str) {
        self.bar.set_length(len as u64);
        self.bar.set_position(0);
        self.bar.set_message(msg.to_owned());
    }

    fn say(&self, line: String) {
        if !self.show {
            return;
        }
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

/// The queue view's tasks: the one place that knows how a view exposes them.
fn entries(v: &QueueView) -> impl Iterator<Item = &TaskEntry> + '_ {
    v.tasks().values().map(|t| &**t)
}

/// One task of a queue view.
fn entry<'a>(v: &'a QueueView, id: &TaskId) -> Option<&'a TaskEntry> {
    v.task(id)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Waits until `look` finds what it looks for in `rx`'s view, up to `within`.
///
/// The view changes after every document change, and a look can cost as much as a scan of
/// every task: after a look that cost `c`, the next waits for a change and for `20 c` to pass
/// (at most 50 ms), so that the observer takes at most about 5% of a core.
async fn wait_view<T>(
    rx: &mut watch::Receiver<Arc<QueueView>>,
    within: Duration,
    what: &str,
    mut look: impl FnMut(&QueueView) -> Option<T>,
) -> anyhow::Result<T> {
    tokio::time::timeout(within, async {
        loop {
            let view = rx.borrow_and_update().clone();
            let t = Instant::now();
            if let Some(found) = look(&view) {
                return Ok(found);
            }
            let cost = t.elapsed();
            rx.changed().await.context("the node stopped")?;
            let pause = (cost * 20).min(MAX_LOOK_PAUSE);
            if pause > Duration::from_micros(100) {
                tokio::time::sleep_until((t + cost + pause).into()).await;
            }
        }
    })
    .await
    .with_context(|| format!("timed out after {within:?} waiting for {what}"))?
}

/// Waits until at least `total` tasks of the queue succeeded or failed; returns the instant
/// the view showed it. Shows the count on `bar`, if any.
async fn wait_final(
    rx: &mut watch::Receiver<Arc<QueueView>>,
    total: usize,
    within: Duration,
    bar: Option<&ProgressBar>,
) -> anyhow::Result<Instant> {
    wait_view(rx, within, "every task to succeed or fail", |v| {
        let c = v.total_counts();
        let done = c.succeeded + c.failed;
        if let Some(bar) = bar {
            bar.set_position(done as u64);
        }
        (done >= total).then(Instant::now)
    })
    .await
}

/// A generous deadline for `n` tasks to run.
fn deadline_for(n: usize) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(50 * n as u64)
}

/// Runs the bench and returns its report.
pub async fn run(opts: &Options) -> anyhow::Result<Report> {
    opts.validate()?;
    let t_run = Instant::now();
    let display = Display::new(opts.progress);
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;

    display.say(format!(
        "probes: fsync ({FSYNC_SAMPLES} × 4 KiB), Automerge floor ({} tasks)",
        opts.tasks.min(FLOOR_MAX_TASKS)
    ));
    let probe = dir.path().join("fsync-probe");
    let fsync_ms = tokio::task::spawn_blocking(move || fsync_probe(&probe))
        .await
        .context("the fsync probe panicked")??;
    let floor_tasks = opts.tasks.min(FLOOR_MAX_TASKS);
    let floor_tasks_per_s = tokio::task::spawn_blocking(move || floor(floor_tasks))
        .await
        .context("the floor probe panicked")??;
    display.say(format!(
        "fsync p50 {fsync_ms:.2} ms; floor {floor_tasks_per_s:.0} tasks/s"
    ));

    let m = if opts.processes {
        with_processes(opts, &display, dir.path()).await?
    } else {
        in_process(opts, &display, dir.path()).await?
    };

    Ok(Report {
        nodes: opts.nodes,
        workers: opts.workers,
        kind: opts.kind,
        throughput_tasks: opts.tasks,
        window: opts.window,
        batch: opts.batch,
        submit_via: if opts.http || opts.processes {
            "http"
        } else {
            "handle"
        },
        throughput_tasks_per_s: m.tp.tasks_per_s,
        submit_rate_first_10pct: m.tp.first_rate,
        submit_rate_last_10pct: m.tp.last_rate,
        done_rate_first_10pct: m.tp.done_first_rate,
        done_rate_last_10pct: m.tp.done_last_rate,
        submit_rate_by_tenth: m.tp.submit_tenths.clone(),
        done_rate_by_tenth: m.tp.done_tenths.clone(),
        max_live: opts.max_live,
        latency_samples: opts.latency_samples,
        submit_to_start_ms: Percentiles::of(&m.to_start),
        submit_to_done_ms: Percentiles::of(&m.to_done),
        failovers: opts.failovers,
        failover_ms: Percentiles::of(&m.failover),
        timings: opts.timings,
        failover_bound_ms: {
            let c = opts.timings.config();
            c.takeover_after_ms + c.settle_ms + c.pool_heartbeat_ms + 300
        },
        unforced_takeovers: (m.last_term.saturating_sub(m.first_term))
            .saturating_sub(opts.failovers as u64),
        takeovers_by_restarted_node: m
            .router_changes
            .iter()
            .filter(|c| c.by_restarted_node)
            .count() as u64,
        router_changes: m.router_changes,
        tasks: m.tasks,
        succeeded: m.succeeded,
        lost: m.tasks - m.succeeded,
        duplicates: m.duplicates,
        fsync_ms,
        floor_tasks,
        floor_tasks_per_s,
        ratio_to_floor: m.tp.tasks_per_s / floor_tasks_per_s,
        machine: machine(),
        commit: commit(),
        epochs: m.epochs,
        queue_doc_bytes_max: m.queue_doc_bytes,
        queue_doc_load_ms: m.queue_doc_load_ms,
        process_peak_rss_mib: peak_rss_mib(),
        processes: opts.processes,
        peak_rss_mib: m.peak_rss,
        elapsed_s: t_run.elapsed().as_secs_f64(),
    })
}

/// What one way of running the cluster measured.
struct Measured {
    tp: Throughput,
    to_start: Vec<f64>,
    to_done: Vec<f64>,
    failover: Vec<f64>,
    first_term: u64,
    last_term: u64,
    tasks: usize,
    succeeded: usize,
    duplicates: usize,
    epochs: u64,
    queue_doc_bytes: Option<usize>,
    queue_doc_load_ms: Option<f64>,
    peak_rss: Vec<Option<f64>>,
    router_changes: Vec<RouterChange>,
}

/// What the bench counts a takeover by a restarted node within: `takeover_after + settle`.
fn restart_window(opts: &Options) -> Duration {
    let c = opts.timings.config();
    Duration::from_millis(c.takeover_after_ms + c.settle_ms)
}

/// The nodes in this process, each on its own runtime, driven through their handles.
async fn in_process(opts: &Options, display: &Display, root: &Path) -> anyhow::Result<Measured> {
    let mut cluster = Cluster::start(opts, root).await?;
    let observers = (0..opts.nodes)
        .map(|i| cluster.watch(i).map(Observer::View))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let routers = Routers::start(cluster.peers.clone(), observers);
    let first_term = routers.settled(Duration::from_secs(60)).await?.term;
    display.say(format!(
        "started {} node(s) with {} workers each; queue {}",
        opts.nodes, opts.workers, cluster.queue
    ));

    let mut all: Vec<TaskId> = Vec::new();
    let kept = Arc::new(std::sync::Mutex::new(None));
    let sampling = tokio::spawn(sample_documents(
        cluster.handles(),
        cluster.queue.clone(),
        kept.clone(),
    ));
    let tp = throughput(&cluster, opts, display).await;
    sampling.abort();
    let _ = sampling.await;
    let largest = kept.lock().unwrap_or_else(|e| e.into_inner()).take();
    let tp = tp?;
    all.extend(tp.ids.iter().cloned());
    let largest = match largest {
        Some(l) => Some(l),
        // Sampled at least once: at the end of the throughput phase.
        None => sample_once(&cluster.handles(), &cluster.queue).await,
    };
    let queue_doc_load_ms = match &largest {
        Some(l) => Some(load_ms(&l.bytes)?),
        None => None,
    };

    let (to_start, to_done) = latency(&cluster, opts, display, &mut all).await?;

    let mut failover = Vec::new();
    for round in 0..opts.failovers {
        failover
            .push(failover_round(&mut cluster, &routers, opts, display, round, &mut all).await?);
    }

    display.say(format!("checks: waiting for all {} tasks", all.len()));
    display.start(all.len(), "final");
    let observer = (0..opts.nodes)
        .find(|&i| cluster.nodes[i].is_some())
        .context("no node left")?;
    let mut rx = cluster.watch(observer)?;
    let within = deadline_for(all.len());
    if let Err(e) = wait_final(&mut rx, all.len(), within, Some(&display.bar)).await {
        display.say(format!("{e:#}; counting the rest as lost"));
    }
    display.bar.finish_and_clear();
    let view = rx.borrow().clone();
    let last_term = view.router.as_ref().map_or(first_term, |r| r.term);
    let mut succeeded = 0;
    let mut duplicates = 0;
    let reader = cluster.handle(observer)?;
    for id in &all {
        // A task the queue document no longer carries (it ended before a rotation): its
        // task document's summary.
        let summary;
        let (state, attempts) = match entry(&view, id) {
            Some(t) => (t.state(), &t.attempts),
            None => match reader.task_status(id).await {
                Ok(s) => {
                    summary = s;
                    (summary.state, &summary.attempts)
                }
                Err(e) => {
                    display.say(format!("lost: task {id}: {e}"));
                    continue;
                }
            },
        };
        if state == TaskState::Succeeded {
            succeeded += 1;
        } else {
            display.say(format!(
                "lost: task {id} is {state:?}; attempts {}",
                serde_json::to_string(attempts).unwrap_or_default()
            ));
        }
        if succeeded_attempts(attempts) > 1 {
            duplicates += 1;
            display.say(format!(
                "duplicate: task {id} succeeded more than once; attempts {}",
                serde_json::to_string(attempts).unwrap_or_default()
            ));
        }
    }
    drop(rx);
    let router_changes = routers.stop(restart_window(opts));
    drop(cluster);

    Ok(Measured {
        tp,
        to_start,
        to_done,
        failover,
        first_term,
        last_term,
        tasks: all.len(),
        succeeded,
        duplicates,
        epochs: view.epoch + 1,
        queue_doc_bytes: largest.as_ref().map(|l| l.bytes.len()),
        queue_doc_load_ms,
        peak_rss: vec![],
        router_changes,
    })
}

/// Each node its own process, driven through HTTP ([`processes`]).
async fn with_processes(
    opts: &Options,
    display: &Display,
    root: &Path,
) -> anyhow::Result<Measured> {
    let mut procs = processes::Procs::start(opts, root).await?;
    display.say(format!(
        "started {} node process(es) with {} workers each; queue {}",
        opts.nodes, opts.workers, procs.queue
    ));
    let routers = procs.watch_routers()?;
    let first_term = routers.settled(Duration::from_secs(60)).await?.term;
    let mut all: Vec<TaskId> = Vec::new();
    let tp = processes::throughput(&mut procs, opts, display).await?;
    all.extend(tp.ids.iter().cloned());
    let (to_start, to_done) = processes::latency(&procs, opts, display, &mut all).await?;
    procs.sample_rss();
    let mut failover = Vec::new();
    for round in 0..opts.failovers {
        failover.push(
            processes::failover_round(&mut procs, &routers, opts, display, round, &mut all).await?,
        );
    }
    let (succeeded, duplicates, last_term, epoch) = processes::check(&procs, &all, display).await?;
    procs.sample_rss();
    let router_changes = routers.stop(restart_window(opts));
    Ok(Measured {
        tp,
        to_start,
        to_done,
        failover,
        first_term,
        last_term,
        tasks: all.len(),
        succeeded,
        duplicates,
        epochs: epoch + 1,
        queue_doc_bytes: None,
        queue_doc_load_ms: None,
        peak_rss: procs.peak_rss(),
        router_changes,
    })
}

/// How many of `attempts` succeeded.
fn succeeded_attempts(attempts: &[piecework_queue_doc::Attempt]) -> usize {
    attempts
        .iter()
        .filter(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        })
        .count()
}
