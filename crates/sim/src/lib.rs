//! Piecework's deterministic simulator.
//!
//! It runs N [`piecework_core::Core`]s, the very state machine a real node runs, in one thread
//! on virtual time, and plays everything around them: a network, a disk and handler runs. There
//! is no tokio, no libp2p and no redb, and no node logic of its own: every decision is the
//! core's. Documents travel between nodes as the cores' own sync frames, and heartbeats as the
//! same gossip bytes a node publishes. The cluster serves two queues, and one node is a member
//! of only one of them.
//!
//! Faults: the network delays messages; it drops, duplicates and reorders heartbeats, resets
//! sync streams, and cuts links between any sets of nodes, both ways or one way. The disk has a
//! seeded write latency, windows in which every write fails, and windows in which every read
//! fails. Nodes crash, keeping what was acknowledged as saved plus an arbitrary (seeded) subset
//! of the writes still in flight, and restart with a new incarnation, sometimes after longer
//! than the lease. Each node's clock drifts. Handlers take random times and fail at random.
//!
//! One seed decides everything. [`run`] with the same seed and [`Config`] replays the same run
//! exactly, and [`Report::trace_hash`] proves it. Invariants are checked after every step, and
//! again once the run has been healed and has settled (see [`Violation`] and
//! `docs/testing.md`).
//!
//! ```
//! let report = piecework_sim::run(7, &piecework_sim::Config::default());
//! assert!(report.violations.is_empty(), "{:?}", report.violations);
//! assert_eq!(report.lost, 0);
//! ```

#![warn(missing_docs, unreachable_pub)]

mod world;

use std::collections::BTreeMap;

use piecework_queue_doc::QueueConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};

pub use world::Fault;

/// Where a scheduled fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Target {
    /// A node by index, below [`Config::nodes`] (a run whose schedule names a node beyond the
    /// cluster panics at once rather than strike nothing).
    Node(usize),
    /// Whichever node is the effective router (per the greatest claim any node knows) when the
    /// fault fires.
    Router,
}

/// How often each fault fires in the background, and how bad the network is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultMix {
    /// Name, for reports.
    pub name: String,
    /// Message delay range, microseconds.
    pub delay_us: (u64, u64),
    /// Probability that a heartbeat is dropped.
    pub drop: f64,
    /// Probability that a heartbeat is delivered twice.
    pub duplicate: f64,
    /// Probability that a sync message kills its connection (it and everything in flight on it
    /// are lost; the replicas reconnect and start their sync state over).
    pub reset: f64,
    /// Node crashes per virtual second, cluster-wide.
    pub crash_rate: f64,
    /// How long a crashed node stays down, milliseconds.
    pub downtime_ms: (u64, u64),
    /// Partitions (a random split into two sides) per virtual second.
    pub partition_rate: f64,
    /// One-way cuts (one node's outgoing messages lost) per virtual second.
    pub oneway_rate: f64,
    /// How long a partition or cut lasts, milliseconds.
    pub cut_ms: (u64, u64),
    /// Largest clock drift of a node, parts per million (fast or slow).
    pub drift_ppm: i64,
    /// Probability that a handler run fails.
    pub handler_failure: f64,
    /// Handler run time range, milliseconds.
    pub run_ms: (u64, u64),
    /// Disk write latency range, microseconds.
    pub write_us: (u64, u64),
    /// Windows in which every write of one node fails, per virtual second, cluster-wide.
    pub write_failure_rate: f64,
    /// Windows in which every read of one node fails, per virtual second, cluster-wide.
    pub read_failure_rate: f64,
    /// How long a failing-disk window lasts, milliseconds.
    pub disk_window_ms: (u64, u64),
    /// Planned stops per virtual second, cluster-wide: a node is asked to stop
    /// (`Command::Stop`, as SIGTERM does), exits once its stop is answered, and starts again
    /// after a downtime. 0 in every mix but `stops`, so that the others replay as before.
    pub stop_rate: f64,
    /// The grace time of a planned stop, milliseconds.
    pub stop_grace_ms: (u64, u64),
    /// Hostile acts per virtual second of the faulty phase: the cluster's last node is a
    /// Byzantine member (a real core that syncs, plus what the world makes it send and write:
    /// see `docs/testing.md`, "The Byzantine member"). 0 in every mix but `byzantine`, so
    /// that the others replay as before.
    pub byzantine_rate: f64,
    /// Run-time setting changes per virtual second of the faulty phase, cluster-wide: a member
    /// pauses a queue (and a member resumes it [`FaultMix::pause_ms`] later), or changes its
    /// concurrency limit, rate interval and order. 0 in every mix but `settings`, so that the
    /// others replay as before.
    pub settings_rate: f64,
    /// How long a pause lasts before a member (any) resumes it, milliseconds.
    pub pause_ms: (u64, u64),
    /// The share of submitted tasks that carry scheduling rules (priority tags, a dependency
    /// on an acknowledged task, a delay), with boost changes beside them. 0 in every mix but
    /// `scheduling`, so that the others replay as before.
    pub scheduling: f64,
    /// Life-cycle acts per virtual second of the faulty phase: a member cancels an
    /// acknowledged task or requeues a queue's dead letters; with it on, a share of the submits
    /// carry a timeout and runs asked to stop get a short grace time. 0 in every mix but
    /// `lifecycle`, so that the others replay as before.
    pub lifecycle: f64,
}

impl FaultMix {
    /// The default mix: everything at once.
    pub fn default_mix() -> Self {
        FaultMix {
            name: "default".into(),
            delay_us: (200, 30_000),
            drop: 0.05,
            duplicate: 0.02,
            reset: 0.002,
            crash_rate: 0.05,
            downtime_ms: (500, 14_000),
            partition_rate: 0.03,
            oneway_rate: 0.02,
            cut_ms: (1_000, 10_000),
            drift_ppm: 20_000,
            handler_failure: 0.1,
            run_ms: (5, 1_500),
            write_us: (50, 4_000),
            write_failure_rate: 0.02,
            read_failure_rate: 0.02,
            disk_window_ms: (100, 3_000),
            stop_rate: 0.0,
            stop_grace_ms: (0, 2_000),
            byzantine_rate: 0.0,
            settings_rate: 0.0,
            pause_ms: (200, 4_000),
            scheduling: 0.0,
            lifecycle: 0.0,
        }
    }

    /// Crashes and restarts only (some down for longer than the lease), with failing disks, on
    /// a network that loses nothing: the mix under which no task may run twice without a crash
    /// to explain it (invariant 5), and no two runs of a task may overlap (invariant 7).
    pub fn crashes() -> Self {
        FaultMix {
            name: "crashes".into(),
            drop: 0.0,
            duplicate: 0.0,
            reset: 0.0,
            partition_rate: 0.0,
            oneway_rate: 0.0,
            crash_rate: 0.1,
            downtime_ms: (500, 25_000),
            ..FaultMix::default_mix()
        }
    }

    /// Nothing goes wrong but delays, drift and a slow disk.
    pub fn calm() -> Self {
        FaultMix {
            name: "calm".into(),
            crash_rate: 0.0,
            write_failure_rate: 0.0,
            read_failure_rate: 0.0,
            ..FaultMix::crashes()
        }
    }

    /// Planned stops (a router hands its role over, runs get a grace time), with crashes and
    /// failing disks, on a network that loses nothing: invariants 5 and 7 hold strictly, a run
    /// interrupted by a stop counting as one its node's crash ended.
    pub fn stops() -> Self {
        FaultMix {
            name: "stops".into(),
            stop_rate: 0.1,
            crash_rate: 0.03,
            ..FaultMix::crashes()
        }
    }

    /// A Byzantine member (the last node) on a network that loses nothing, with handlers
    /// that never fail: the hostile acts are the only faults, so every violation is theirs,
    /// invariants 5 and 7 hold strictly, and every task must end `succeeded`. The member
    /// gossips router heartbeats at and above the term bound, writes claims that skip terms
    /// or pass the bound and oversized records straight into its replica of the queue
    /// document, and floods its pool heartbeats with repeated and out-of-range workers.
    pub fn byzantine() -> Self {
        FaultMix {
            name: "byzantine".into(),
            handler_failure: 0.0,
            byzantine_rate: 0.5,
            ..FaultMix::calm()
        }
    }

    /// The default mix, with members pausing and resuming the queue and changing its
    /// configuration at run time, from any node, across partitions, crashes and rotations:
    /// every node must end with the same settings, and every task must finish.
    pub fn settings() -> Self {
        FaultMix {
            name: "settings".into(),
            settings_rate: 0.3,
            ..FaultMix::default_mix()
        }
    }

    /// The default mix, with the scheduling workload: tasks with priority tags, delays and
    /// dependencies, and boosts changed at run time (invariants 12 and 13).
    pub fn scheduling() -> Self {
        FaultMix {
            name: "scheduling".into(),
            scheduling: 0.6,
            ..FaultMix::default_mix()
        }
    }

    /// The default mix, with the life-cycle workload: cancels, requeues of dead letters,
    /// timeouts, handlers that ignore the signal to stop (invariant 18, and invariant 2's
    /// requeue rule), and more handler failures so that tasks are dead-lettered.
    pub fn lifecycle() -> Self {
        FaultMix {
            name: "lifecycle".into(),
            lifecycle: 0.6,
            handler_failure: 0.25,
            ..FaultMix::default_mix()
        }
    }

    /// Partitions and one-way cuts, nothing else.
    pub fn partitions() -> Self {
        FaultMix {
            name: "partitions".into(),
            partition_rate: 0.08,
            oneway_rate: 0.05,
            ..FaultMix::calm()
        }
    }

    /// The mix called `name`: `default`, `crashes`, `stops`, `calm`, `partitions`,
    /// `byzantine`, `settings`, `scheduling` or `lifecycle`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "default" => Some(FaultMix::default_mix()),
            "crashes" => Some(FaultMix::crashes()),
            "stops" => Some(FaultMix::stops()),
            "calm" => Some(FaultMix::calm()),
            "partitions" => Some(FaultMix::partitions()),
            "byzantine" => Some(FaultMix::byzantine()),
            "settings" => Some(FaultMix::settings()),
            "scheduling" => Some(FaultMix::scheduling()),
            "lifecycle" => Some(FaultMix::lifecycle()),
            _ => None,
        }
    }

    /// A mix drawn by `rng`, for swarm testing ([`Config::swarm`]): each kind of fault is on
    /// in about half the draws, at a rate drawn around the other mixes' (planned stops
    /// included), so that a seed without some kinds goes deeper into the others. Every value
    /// is drawn whether its kind is on or not, so each draw takes the same randomness.
    fn swarm(rng: &mut ChaCha8Rng) -> Self {
        fn maybe(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
            let on = rng.random_bool(0.5);
            let v = rng.random_range(lo..=hi);
            if on { v } else { 0.0 }
        }
        FaultMix {
            name: "swarm".into(),
            delay_us: (200, rng.random_range(2_000..=60_000)),
            drop: maybe(rng, 0.01, 0.15),
            duplicate: maybe(rng, 0.01, 0.05),
            reset: maybe(rng, 0.0005, 0.005),
            crash_rate: maybe(rng, 0.01, 0.15),
            downtime_ms: (500, rng.random_range(2_000..=25_000)),
            partition_rate: maybe(rng, 0.01, 0.1),
            oneway_rate: maybe(rng, 0.01, 0.08),
            cut_ms: (1_000, rng.random_range(3_000..=15_000)),
            drift_ppm: maybe(rng, 0.0, 20_000.0) as i64,
            handler_failure: maybe(rng, 0.02, 0.2),
            run_ms: (5, rng.random_range(200..=3_000)),
            write_us: (50, rng.random_range(500..=8_000)),
            write_failure_rate: maybe(rng, 0.005, 0.05),
            read_failure_rate: maybe(rng, 0.005, 0.05),
            disk_window_ms: (100, rng.random_range(500..=4_000)),
            stop_rate: maybe(rng, 0.02, 0.15),
            stop_grace_ms: (0, rng.random_range(0..=3_000)),
            // Drawn last and not at all: swarm shapes stay those drawn before they existed.
            byzantine_rate: 0.0,
            settings_rate: 0.0,
            pause_ms: (200, 4_000),
            scheduling: 0.0,
            lifecycle: 0.0,
        }
    }

    /// Whether this mix loses or cuts messages (invariant 5 holds only where it does not).
    pub fn loses_messages(&self) -> bool {
        self.drop > 0.0 || self.reset > 0.0 || self.partition_rate > 0.0 || self.oneway_rate > 0.0
    }
}

impl Default for FaultMix {
    fn default() -> Self {
        FaultMix::default_mix()
    }
}

/// A simulated run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Workers per node.
    pub workers: u32,
    /// Tasks submitted over the faulty phase.
    pub tasks: usize,
    /// Length of the faulty phase, virtual milliseconds; then everything heals.
    pub fault_ms: u64,
    /// How long the healed cluster may take to settle before the run fails, virtual ms.
    pub settle_limit_ms: u64,
    /// Background faults.
    pub mix: FaultMix,
    /// Faults at fixed times (milliseconds since the start), on top of the background.
    pub schedule: Vec<(u64, Fault)>,
    /// The queue's configuration. `None`: drawn from the seed (with or without a concurrency
    /// limit and a rate interval).
    pub queue: Option<QueueConfig>,
    /// How many of the trace's last lines the report keeps.
    pub trace_lines: usize,
    /// When routers rotate the queue document, as `(ratio, min_live)` (see
    /// `piecework_core::Config::rotate_ratio`). The default is tiny, so that every seed
    /// rotates several times while partitions, crashes and late writes go on.
    pub rotation: (usize, usize),
    /// Sealed epoch documents each node keeps on disk once out of memory
    /// (`piecework_core::Config::keep_sealed_epochs`): as many as a node keeps by default
    /// (`KEEP_SEALED_EPOCHS`, more than a seed rotates). With few (say 2), members come back
    /// behind documents of the chain every member deleted (`moved_past_deleted_epochs` in the
    /// JSON).
    pub keep_sealed_epochs: usize,
    /// The replicas' relay waits in ms, lower and higher peer id of a pair
    /// (`piecework_core::Config::relay_waits`); `None` for a node's defaults. Other waits
    /// give other interleavings of the same faults.
    pub relay_ms: Option<(u64, u64)>,
    /// Make every node's pool skip fencing: a deliberately broken protocol (tests only).
    #[cfg(feature = "broken")]
    pub broken_fencing: bool,
    /// Make every node's core skip its own fence checks of a start (after a task document is
    /// fetched, at the end of a turn), its pool still fencing: a deliberately broken protocol
    /// (tests only).
    #[cfg(feature = "broken")]
    pub broken_core_fencing: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: 5,
            workers: 2,
            tasks: 40,
            fault_ms: 60_000,
            settle_limit_ms: 300_000,
            mix: FaultMix::default_mix(),
            schedule: vec![],
            queue: None,
            trace_lines: 60,
            rotation: (2, 3),
            keep_sealed_epochs: piecework_core::KEEP_SEALED_EPOCHS,
            relay_ms: None,
            #[cfg(feature = "broken")]
            broken_fencing: false,
            #[cfg(feature = "broken")]
            broken_core_fencing: false,
        }
    }
}

impl Config {
    /// Swarm testing: the default run, with its node count (3–9), the replicas' relay waits
    /// and its fault mix ([`FaultMix`] named `swarm`, each kind on or off and its rate drawn)
    /// drawn from `seed`. The shape has its own random stream, derived from the seed; the run
    /// itself draws from the seed as any other. [`Report::shape`] states what was drawn, and
    /// `piecework-sim --swarm --seeds 1 --seed S` replays it.
    pub fn swarm(seed: u64) -> Config {
        let h = Sha256::digest(format!("piecework-sim swarm {seed}"));
        let mut rng = ChaCha8Rng::from_seed(h.into());
        let nodes = rng.random_range(3..=9);
        // A quarter of the seeds keep a node's waits (10 and 60 ms).
        let keep = rng.random_bool(0.25);
        let lower = rng.random_range(2..=150);
        let higher = rng.random_range(lower..=lower * 4 + 60);
        let relay_ms = (!keep).then_some((lower, higher));
        let mix = FaultMix::swarm(&mut rng);
        Config {
            nodes,
            relay_ms,
            mix,
            ..Config::default()
        }
    }

    /// The shape of this run: its node count, relay waits and mix.
    pub fn shape(&self) -> Shape {
        Shape {
            nodes: self.nodes,
            relay_ms: self.relay_ms,
            mix: self.mix.clone(),
        }
    }
}

/// An invariant that did not hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant (1–9, see `docs/testing.md`; 10: an honest node counted a value the
    /// Byzantine member of the `byzantine` mix sent or wrote).
    pub invariant: u8,
    /// Virtual time, milliseconds.
    pub at_ms: u64,
    /// What happened.
    pub what: String,
}

/// The shape of a run's cluster and faults: what [`Config::swarm`] draws from the seed, and a
/// report states so that a failing seed can be told apart and replayed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Shape {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The replicas' relay waits in ms, lower and higher peer id (`None`: a node's defaults).
    pub relay_ms: Option<(u64, u64)>,
    /// The fault mix, with its rates.
    pub mix: FaultMix,
}

/// What a run did and found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The run's cluster and fault mix (drawn from the seed in swarm mode).
    pub shape: Shape,
    /// Tasks whose submit was acknowledged (durable on the submitting node).
    pub tasks: usize,
    /// Acknowledged tasks without an outcome on some member's replica after settling.
    pub lost: usize,
    /// Tasks whose handler succeeded more than once: the duplicates at-least-once allows.
    pub duplicated_tasks: usize,
    /// Tasks whose handler ran more than once for any reason: retries after a failure, runs
    /// lost with their node, and duplicates.
    pub rerun_tasks: usize,
    /// The most runs of one task.
    pub max_runs: usize,
    /// Routers that became active (the first election of each of the two queues included).
    pub activations: usize,
    /// Activations after a queue's first: a router became active where another had been
    /// (after a crash, a partition, a stop, or a claim won at once by two).
    pub takeovers: usize,
    /// Claims that lost to a concurrent greater claim during their settle wait (two or more
    /// routers claimed at once).
    pub claims_lost: usize,
    /// Starts refused as fenced: assignments a node's pool or core answered `Refused` because
    /// they came from a router below the greatest claim it had seen (each core reports these
    /// as `Event::NotRun` with a reason beginning `fenced`; the simulator only counts them).
    pub fenced: usize,
    /// Faults injected, and situations reached, by kind (see `docs/testing.md`).
    pub faults: BTreeMap<String, u64>,
    /// Hostile acts the Byzantine member sent, by act (empty outside the `byzantine` mix; see
    /// `docs/testing.md` for what one act is, per kind).
    pub byzantine_sent: BTreeMap<String, u64>,
    /// Hostile acts honest nodes refused, by act, read from what they did: beats that raised
    /// no fence and deposed nobody, claims and records held and not counted, workers their
    /// routers did not count.
    pub byzantine_refused: BTreeMap<String, u64>,
    /// Invariant violations (empty when the run passes).
    pub violations: Vec<Violation>,
    /// Virtual time simulated, milliseconds.
    pub virtual_ms: u64,
    /// Events processed.
    pub steps: u64,
    /// A hash of everything that happened, in order: equal for equal runs.
    pub trace_hash: String,
    /// The last lines of the trace.
    pub trace_tail: Vec<String>,
}

impl Report {
    /// Whether every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Runs one seeded simulation.
pub fn run(seed: u64, config: &Config) -> Report {
    world::World::new(seed, config).run()
}
