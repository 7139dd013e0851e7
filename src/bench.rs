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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressStyle};
use piecework_node::{Config, IsolatedNode, Multiaddr, NodeHandle, api, spawn_isolated};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueId, QueueView, Submission,
    TaskEntry, TaskId, TaskState, WorkerId, queue,
};
use serde::Serialize;
use tokio::sync::{oneshot, watch};

mod processes;
mod routers;

pub use routers::RouterChange;
use routers::{Observer, Routers};

/// The most tasks the Automerge floor is measured over (it stays quick).
pub const FLOOR_MAX_TASKS: usize = 20_000;
/// How many fsyncs `fsync_ms` is the median of.
pub const FSYNC_SAMPLES: usize = 50;
/// How often the failover trickle submits a task.
pub const TRICKLE_EVERY: Duration = Duration::from_millis(20);
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

/// Median, 99th percentile (nearest rank) and maximum of a set of samples, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// The median.
    pub p50: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The largest sample.
    pub max: f64,
}

impl Percentiles {
    /// `None` for no samples.
    pub fn of(samples: &[f64]) -> Option<Percentiles> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Some(Percentiles {
            p50: nearest_rank(&s, 0.50),
            p99: nearest_rank(&s, 0.99),
            max: s[s.len() - 1],
        })
    }
}

fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The machine the bench ran on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// `std::thread::available_parallelism`.
    pub cores: usize,
    /// `MemTotal` of `/proc/meminfo`, in MiB (`None` where there is no such file).
    pub memory_mib: Option<u64>,
}

/// What the bench measured (`--json` prints it as one object).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Workers per node.
    pub workers: u32,
    /// The kind of every task.
    pub kind: Kind,
    /// Tasks in the throughput phase.
    pub throughput_tasks: usize,
    /// The most tasks in flight during the throughput phase.
    pub window: usize,
    /// Tasks per submit during the throughput phase.
    pub batch: usize,
    /// How the throughput phase submitted: `handle` (in-process `NodeHandle`) or `http`
    /// (each node's HTTP API on loopback, batches as JSON arrays).
    pub submit_via: &'static str,
    /// Throughput tasks / (first submit → the moment the observing node saw the last of them
    /// succeed or fail).
    pub throughput_tasks_per_s: f64,
    /// Acknowledgements per second over the first 10% of acknowledgements (`None` if the
    /// slice has fewer than 2 or spans no time).
    pub submit_rate_first_10pct: Option<f64>,
    /// The same over the last 10%.
    pub submit_rate_last_10pct: Option<f64>,
    /// Outcomes per second over the first 10% of the throughput tasks to end, as the
    /// observing node saw them: from the first submit to the moment a tenth had ended.
    pub done_rate_first_10pct: Option<f64>,
    /// The same over the last 10% to end: from the moment 90% had ended to the last.
    pub done_rate_last_10pct: Option<f64>,
    /// Acknowledgements per second over each tenth of the acknowledgements, in order (`null`
    /// for a tenth that spans no time): where a fall sets in.
    pub submit_rate_by_tenth: Vec<Option<f64>>,
    /// Outcomes per second over each tenth of the outcomes, as `done_rate_*` counts them.
    pub done_rate_by_tenth: Vec<Option<f64>>,
    /// The `--max-live` bound (`None`: none).
    pub max_live: Option<usize>,
    /// Tasks in the latency phase.
    pub latency_samples: usize,
    /// From the wall clock just before the submit to the attempt's `started.at` (the worker's
    /// wall clock), 1 ms resolution; `None` without latency samples.
    pub submit_to_start_ms: Option<Percentiles>,
    /// From just before the submit until the wait for the outcome returned.
    pub submit_to_done_ms: Option<Percentiles>,
    /// Router kills made.
    pub failovers: usize,
    /// From each kill to the first attempt assigned under a greater claim (`assigned_at`, the
    /// new router's wall clock); `None` without failovers.
    pub failover_ms: Option<Percentiles>,
    /// The queue's timings.
    pub timings: Timings,
    /// What the issue bounds failover by: `takeover_after + settle + pool heartbeat + 300` ms
    /// of the queue's timings.
    pub failover_bound_ms: u64,
    /// Router terms beyond one per kill, from the first router to the last: takeovers the
    /// bench did not cause (a router that looked silent, e.g. on an overloaded machine), or
    /// claims that raced.
    pub unforced_takeovers: u64,
    /// Claims won by a node within `takeover_after + settle` of its own restart while the
    /// router it deposed was alive (see `router_changes`): a restarted node that did not wait
    /// to hear the live router.
    pub takeovers_by_restarted_node: u64,
    /// Every router the nodes' views showed, in order, with when and by which node (the
    /// first one included): what `unforced_takeovers` and `takeovers_by_restarted_node` count.
    pub router_changes: Vec<RouterChange>,
    /// Every task submitted, in all phases.
    pub tasks: usize,
    /// Of those, the ones that succeeded, at the end.
    pub succeeded: usize,
    /// Submitted tasks that had not succeeded at the end (after waiting for them).
    pub lost: usize,
    /// Tasks with more than one succeeded attempt in the final view.
    pub duplicates: usize,
    /// Median of 50 × (write 4 KiB + `sync_all`) in the bench's temporary directory.
    pub fsync_ms: f64,
    /// Tasks the floor was measured over: `min(throughput_tasks, 20 000)`.
    pub floor_tasks: usize,
    /// The Automerge work of a task's life on one queue document, tasks per second.
    pub floor_tasks_per_s: f64,
    /// `throughput_tasks_per_s / floor_tasks_per_s`.
    pub ratio_to_floor: f64,
    /// The machine.
    pub machine: Machine,
    /// The commit this binary was built from (`git rev-parse --short HEAD` at build time), or
    /// `unknown` outside a git checkout.
    pub commit: String,
    /// Epoch documents the queue went through (1: never rotated), as the observing node's
    /// view ends.
    pub epochs: u64,
    /// The largest current queue document over the nodes, saved whole, sampled every second
    /// of the throughput phase and at its end, in bytes.
    pub queue_doc_bytes_max: Option<usize>,
    /// Loading that largest document and reading its view, in ms (what opening the queue
    /// costs a node).
    pub queue_doc_load_ms: Option<f64>,
    /// This process's peak resident set, in MiB: with the nodes in process, every node of
    /// the cluster and the bench itself.
    pub process_peak_rss_mib: Option<f64>,
    /// Whether the nodes ran as separate processes (`--processes`).
    pub processes: bool,
    /// With `--processes`: each node's peak resident set (`VmHWM`, sampled at the phases'
    /// ends and before each kill, the largest over its lives), in MiB; empty otherwise.
    pub peak_rss_mib: Vec<Option<f64>>,
    /// The whole run, probes and cluster start included.
    pub elapsed_s: f64,
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

/// The nodes, by index; a killed node's slot is empty until it is restarted.
struct Cluster {
    root: PathBuf,
    workers: u32,
    rotate_min_live: Option<usize>,
    archive_keep: u64,
    max_live: Option<usize>,
    nodes: Vec<Option<IsolatedNode>>,
    peers: Vec<PeerId>,
    queue: QueueId,
}

impl Cluster {
    fn config(
        root: &Path,
        workers: u32,
        rotate_min_live: Option<usize>,
        archive_keep: u64,
        max_live: Option<usize>,
        i: usize,
        bootstrap: Vec<Multiaddr>,
    ) -> Config {
        let mut c = Config::new(root.join(format!("node{i}")), crate::kinds::builtin());
        c.archive_keep = archive_keep;
        c.workers = workers;
        c.bootstrap = bootstrap;
        c.rotation = rotate_min_live.map(|m| (piecework_node::ROTATE_RATIO, m));
        c.max_live = max_live;
        c
    }

    async fn start(opts: &Options, root: &Path) -> anyhow::Result<Cluster> {
        let first = spawn_isolated(
            Cluster::config(
                root,
                opts.workers,
                opts.rotate_min_live,
                opts.archive_keep(),
                opts.node_max_live(),
                0,
                vec![],
            ),
            1,
        )
        .await
        .context("cannot start node 0")?;
        let addr = first.handle().wait_listening().await;
        let mut nodes = vec![Some(first)];
        for i in 1..opts.nodes {
            let n = spawn_isolated(
                Cluster::config(
                    root,
                    opts.workers,
                    opts.rotate_min_live,
                    opts.archive_keep(),
                    opts.node_max_live(),
                    i,
                    vec![addr.clone()],
                ),
                1,
            )
            .await
            .with_context(|| format!("cannot start node {i}"))?;
            nodes.push(Some(n));
        }
        let peers: Vec<PeerId> = nodes
            .iter()
            .flatten()
            .map(|n| n.handle().peer_id().clone())
            .collect();
        let h0 = nodes[0].as_ref().expect("started").handle().clone();
        let queue = h0
            .create_queue("bench", Some(opts.timings.config()))
            .await
            .context("cannot create the queue")?;
        for (i, n) in nodes.iter().enumerate().skip(1) {
            let h = n.as_ref().expect("started").handle();
            h.join_queue(&queue)
                .await
                .with_context(|| format!("node {i} cannot join the queue"))?;
        }
        let cluster = Cluster {
            root: root.to_owned(),
            workers: opts.workers,
            rotate_min_live: opts.rotate_min_live,
            archive_keep: opts.archive_keep(),
            max_live: opts.node_max_live(),
            nodes,
            peers,
            queue,
        };
        for i in 0..opts.nodes {
            cluster.router(i).await?;
        }
        Ok(cluster)
    }

    fn handle(&self, i: usize) -> anyhow::Result<NodeHandle> {
        self.nodes[i]
            .as_ref()
            .map(|n| n.handle().clone())
            .with_context(|| format!("node {i} is not running"))
    }

    fn handles(&self) -> Vec<NodeHandle> {
        self.nodes
            .iter()
            .flatten()
            .map(|n| n.handle().clone())
            .collect()
    }

    fn watch(&self, i: usize) -> anyhow::Result<watch::Receiver<Arc<QueueView>>> {
        self.handle(i)?
            .watch_queue(&self.queue)
            .with_context(|| format!("node {i} has not opened the queue"))
    }

    /// The router as node `i` sees it, once it sees one.
    async fn router(&self, i: usize) -> anyhow::Result<Claim> {
        let mut rx = self.watch(i)?;
        wait_view(&mut rx, Duration::from_secs(60), "a router", |v| {
            v.router.clone()
        })
        .await
    }
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

/// The largest queue document sampled.
struct Largest {
    bytes: Vec<u8>,
}

/// How often the throughput phase samples each node's queue document.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Samples every node's current queue document each [`SAMPLE_EVERY`] until aborted, keeping
/// the largest in `kept`.
async fn sample_documents(
    handles: Vec<NodeHandle>,
    queue: QueueId,
    kept: Arc<std::sync::Mutex<Option<Largest>>>,
) {
    loop {
        if let Some(l) = sample_once(&handles, &queue).await {
            let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
            if k.as_ref().is_none_or(|o| o.bytes.len() < l.bytes.len()) {
                *k = Some(l);
            }
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// The largest current queue document over the nodes, now.
async fn sample_once(handles: &[NodeHandle], queue: &QueueId) -> Option<Largest> {
    let mut best: Option<Largest> = None;
    for h in handles {
        if let Ok((_, bytes)) = h.queue_document(queue).await
            && best.as_ref().is_none_or(|b| b.bytes.len() < bytes.len())
        {
            best = Some(Largest { bytes });
        }
    }
    best
}

/// How many times [`load_ms`] loads the document; it reports the median.
const LOAD_TIMINGS: usize = 5;

/// Milliseconds to load a saved queue document and read its view: what opening the queue
/// costs a node. The median of [`LOAD_TIMINGS`] loads: one timing on a shared machine is
/// as much the machine's as the document's.
fn load_ms(bytes: &[u8]) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(LOAD_TIMINGS);
    for _ in 0..LOAD_TIMINGS {
        let t = Instant::now();
        let doc = automerge::Automerge::load(bytes)
            .context("the sampled queue document does not load")?;
        QueueView::read(&doc).context("the sampled queue document does not read as a queue")?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[LOAD_TIMINGS / 2])
}

/// This process's peak resident set (`VmHWM`), in MiB; `None` where `/proc` has no such line.
fn peak_rss_mib() -> Option<f64> {
    vm_hwm_mib(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `VmHWM` line of a `/proc/PID/status` text, in MiB.
fn vm_hwm_mib(status: &str) -> Option<f64> {
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

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

struct Throughput {
    ids: Vec<TaskId>,
    tasks_per_s: f64,
    first_rate: Option<f64>,
    last_rate: Option<f64>,
    done_first_rate: Option<f64>,
    done_last_rate: Option<f64>,
    submit_tenths: Vec<Option<f64>>,
    done_tenths: Vec<Option<f64>>,
}

async fn throughput(
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
    fn of(
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
async fn submit_all<F, Fut>(
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
async fn submit_http(
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

async fn latency(
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
async fn measure_latency<F, Fut>(
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

/// Submits task `first`, `first + 1`, … with `submit` every [`TRICKLE_EVERY`] until `stop`;
/// returns the tasks acknowledged. `acked` holds them as they come.
async fn trickle<F, Fut>(
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
async fn flowing(
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
async fn failover_round(
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

/// Median of [`FSYNC_SAMPLES`] × (append 4 KiB + `sync_all`), in ms.
fn fsync_probe(path: &Path) -> anyhow::Result<f64> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    for _ in 0..FSYNC_SAMPLES {
        let t = Instant::now();
        f.write_all(&block).context("fsync probe: write")?;
        f.sync_all().context("fsync probe: sync_all")?;
        samples.push(ms(t.elapsed()));
    }
    Ok(Percentiles::of(&samples).map_or(0.0, |p| p.p50))
}

/// Tasks per second for `n` tasks' submit → assign → start → finish on one queue document,
/// each operation its own transaction, as a node writes them.
fn floor(n: usize) -> anyhow::Result<f64> {
    use sha2::Digest as _;
    let me = PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W");
    // An `automerge::Automerge`; this crate does not name automerge, the queue functions do.
    let mut doc = Default::default();
    queue::create(&mut doc, "floor", &crate::demo::demo_config(), &me, 0)
        .context("floor: create the queue")?;
    let claim = Claim::new(1, me.clone());
    let worker = WorkerId::new(me.clone(), 0);
    // Ids shaped like real ones (random-looking, so map inserts land anywhere).
    let ids: Vec<TaskId> = (0..n)
        .map(|i| {
            let h = hex::encode(sha2::Sha256::digest(i.to_le_bytes()));
            TaskId::new(format!("automerge:{}", &h[..28]))
        })
        .collect();
    let t = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let at = i as u64;
        queue::submit(
            &mut doc,
            &Submission {
                id: id.clone(),
                kind: "noop".into(),
                submitter: me.clone(),
                submitted_at: at,
                priority: 0,
                urgent: false,
                max_attempts: None,
                // As a node submits a noop task: inline.
                input: Some("{}".into()),
            },
        )
        .context("floor: submit")?;
        let attempt = AttemptId {
            n: 1,
            claim: claim.clone(),
        };
        let a = Assignment {
            task: id.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        };
        queue::record_assignments(&mut doc, &[a], at).context("floor: assign")?;
        queue::record_start(&mut doc, id, &attempt, &worker, 1, at).context("floor: start")?;
        queue::record_finish(
            &mut doc,
            id,
            &attempt,
            &worker,
            AttemptOutcome::Succeeded,
            None,
            at,
        )
        .context("floor: finish")?;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(n as f64 / secs.max(1e-9))
}

fn machine() -> Machine {
    let memory_mib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib / 1024);
    Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        memory_mib,
    }
}

/// The commit this binary was built from (`build.rs`), or `unknown`.
fn commit() -> String {
    env!("PIECEWORK_COMMIT").to_owned()
}

fn fmt_p(p: &Option<Percentiles>) -> String {
    p.as_ref().map_or("-".into(), |p| {
        format!("p50 {:.1}  p99 {:.1}  max {:.1}", p.p50, p.p99, p.max)
    })
}

fn fmt_rate(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.0}"))
}

/// Prints the report for people.
pub fn print_report(r: &Report) {
    println!(
        "cluster                  {} node(s) × {} workers, kind {}, commit {}",
        r.nodes,
        r.workers,
        r.kind.name(),
        r.commit
    );
    println!(
        "machine                  {} cores, {} MiB",
        r.machine.cores,
        r.machine.memory_mib.map_or("?".into(), |m| m.to_string())
    );
    println!(
        "throughput               {:.0} tasks/s ({} tasks, batches of {} through the {}, window {})",
        r.throughput_tasks_per_s,
        r.throughput_tasks,
        r.batch,
        if r.submit_via == "http" {
            "HTTP API"
        } else {
            "node handle"
        },
        r.window
    );
    println!(
        "submit rate              first 10% {}/s, last 10% {}/s",
        fmt_rate(r.submit_rate_first_10pct),
        fmt_rate(r.submit_rate_last_10pct)
    );
    println!(
        "outcome rate             first 10% {}/s, last 10% {}/s{}",
        fmt_rate(r.done_rate_first_10pct),
        fmt_rate(r.done_rate_last_10pct),
        r.max_live
            .map(|l| format!(" (at most {l} live)"))
            .unwrap_or_default()
    );
    println!(
        "submit → start (ms)      {}  ({} samples)",
        fmt_p(&r.submit_to_start_ms),
        r.latency_samples
    );
    println!("submit → done (ms)       {}", fmt_p(&r.submit_to_done_ms));
    println!(
        "failover (ms)            {}  ({} kills, {:?} timings, bound {} ms)",
        fmt_p(&r.failover_ms),
        r.failovers,
        r.timings,
        r.failover_bound_ms
    );
    println!(
        "unforced takeovers       {}  (router terms beyond one per kill)",
        r.unforced_takeovers
    );
    println!(
        "by a restarted node      {}  (claims won within takeover_after + settle of a restart)",
        r.takeovers_by_restarted_node
    );
    println!(
        "tasks                    {} submitted, {} succeeded, {} lost, {} duplicates",
        r.tasks, r.succeeded, r.lost, r.duplicates
    );
    println!("fsync (4 KiB, p50)       {:.2} ms", r.fsync_ms);
    println!(
        "Automerge floor          {:.0} tasks/s ({} tasks); throughput is {:.3} of it",
        r.floor_tasks_per_s, r.floor_tasks, r.ratio_to_floor
    );
    println!(
        "queue document           {} epoch(s); largest {} KiB, loads and reads in {} ms",
        r.epochs,
        r.queue_doc_bytes_max
            .map_or("?".into(), |b| format!("{:.1}", b as f64 / 1024.0)),
        r.queue_doc_load_ms
            .map_or("?".into(), |m| format!("{m:.1}"))
    );
    println!(
        "peak RSS                 {} MiB (this process: every node and the bench)",
        r.process_peak_rss_mib
            .map_or("?".into(), |m| format!("{m:.0}"))
    );
    println!("elapsed                  {:.1} s", r.elapsed_s);
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
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&s).unwrap();
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        let one = Percentiles::of(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert!(Percentiles::of(&[]).is_none());
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

    #[test]
    fn the_floor_runs() {
        assert!(floor(20).unwrap() > 0.0);
    }
}
