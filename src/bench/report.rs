//! The report: what the bench measured ([`Report`], which `--json` prints as one object, with
//! its [`Percentiles`] and [`Machine`]) and its printing for people ([`print_report`]).

use serde::Serialize;

use super::routers::RouterChange;
use super::{Kind, Timings};

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

pub(super) fn machine() -> Machine {
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
pub(super) fn commit() -> String {
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

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = Percentiles::of(&s).unwrap();
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        let one = Percentiles::of(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert!(Percentiles::of(&[]).is_none());
    }
}
