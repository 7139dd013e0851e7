//! The simulated world: N cores and what surrounds them, on one virtual clock.
//!
//! Everything a node decides is decided by its [`Core`]; the world only plays the outside world
//! and watches. This file owns the [`World`] struct (the nodes, the event queue, the RNG, the
//! trace and the records the invariants read), its construction, the clock model, and the
//! event loop: it pops each event and hands it to the module that owns it. The models and the
//! checks live in the submodules, each an `impl World` block over its own part:
//!
//! - [`shell`]: what a node's shell does after every input (drive the core, carry out its I/O,
//!   read its replies and events);
//! - [`clients`]: the clients that join queues and submit tasks;
//! - [`net`]: the network model ([`net::Network`]);
//! - [`disk`]: the disk model ([`disk::Disk`]);
//! - [`faults`]: background and scheduled faults, crashes, stops and restarts;
//! - [`invariants`]: the nine invariants, and the table naming each;
//! - [`byzantine`]: the hostile member of the `byzantine` mix, its acts and their refusals
//!   (invariant 10).
//!
//! The submodules may use this file's items (the event queue, `time`, `count`, `trace`,
//! `violate`, the constants); they do not `use` each other's items, and ask each other only
//! through the `pub(super)` methods their own headers list.

mod byzantine;
mod clients;
mod disk;
mod faults;
mod invariants;
mod lifecycle;
mod net;
mod schedules;
mod scheduling;
mod settings;
mod shell;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use piecework_core::{
    Built, Command, CommandId, Config as CoreConfig, Core, RotateId, RunId, SaveId, Time,
};
use piecework_queue_doc::{AttemptId, Claim, PeerId, QueueConfig, QueueId, TaskId, TaskState};
use piecework_replica::DocId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::{Config, Report, Violation};

use disk::Disk;
pub use faults::Fault;
use faults::Kind;
use net::Network;

/// Wall-clock time of virtual zero (unix ms), for the timestamps written into documents.
const EPOCH_MS: u64 = 1_790_000_000_000;
/// Steps after which a run counts as a livelock.
const MAX_STEPS: u64 = 20_000_000;
/// How often a message delivery takes the node's other messages due soon into one batch.
const BATCH_CHANCE: f64 = 0.3;
/// How far ahead a batch takes messages.
const BATCH_WINDOW_US: u64 = 2_000;
/// The most messages one batch takes besides the first.
const MAX_BATCH: usize = 64;
/// How often the settle phase checks whether the cluster has settled, virtual ms.
const SETTLE_CHECK_MS: u64 = 250;
/// Disk read latency, microseconds.
const READ_US: u64 = 200;
/// How long building a successor takes, virtual µs (a few turns to tens of them).
const BUILD_US: (u64, u64) = (1_000, 40_000);
/// How long a client waits before retrying a join or a failed submit, microseconds.
const RETRY_US: u64 = 500_000;

#[derive(Debug)]
enum Ev {
    Sync {
        from: usize,
        to: usize,
        epoch: u64,
        frame: Vec<u8>,
    },
    Gossip {
        from: usize,
        to: usize,
        topic: String,
        data: Vec<u8>,
    },
    Timer {
        node: usize,
        generation: u64,
    },
    RunEnd {
        node: usize,
        incarnation: u64,
        run: RunId,
        ok: bool,
    },
    Saved {
        node: usize,
        incarnation: u64,
        id: SaveId,
    },
    Loaded {
        node: usize,
        incarnation: u64,
        doc: DocId,
    },
    /// A successor built off the node's thread is ready.
    Rotated {
        node: usize,
        incarnation: u64,
        id: RotateId,
    },
    /// An archive lookup's answer.
    Archived {
        node: usize,
        incarnation: u64,
        task: TaskId,
    },
    /// A lookup of kept ends' answer.
    Ends {
        node: usize,
        incarnation: u64,
        lookup: u64,
        tasks: Vec<TaskId>,
        failed_in: Option<QueueId>,
    },
    /// A listing's read of finished tasks.
    Listed {
        node: usize,
        incarnation: u64,
        cmd: piecework_core::CommandId,
        read: disk::ListRead,
    },
    Submit,
    Join {
        node: usize,
        queue: usize,
    },
    Fault(Fault),
    Restart {
        node: usize,
        incarnation: u64,
    },
    Background(Kind),
    /// A member resumes queue `queue` (by index) after a pause.
    Resume {
        queue: usize,
    },
    CutsChanged,
    /// Silent cuts that end now: their streams are reset (the transport's stall detection).
    SilentEnds,
    HealAll,
    SettleCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Succeeded,
    Failed,
    Crashed,
}

#[derive(Clone, Debug)]
struct RunRec {
    node: usize,
    claim: Claim,
    /// When its attempt was assigned (virtual µs, from the router's clock reading).
    assigned_us: u64,
    start_us: u64,
    end_us: Option<u64>,
    end: Option<End>,
}

#[derive(Clone, Debug)]
struct Live {
    task: TaskId,
    queue: QueueId,
    claim: Claim,
    /// A cut separated the run's node from its router's node while it ran.
    tainted: bool,
    /// The run was asked to stop (its task cancelled, or past its timeout): it ends failed.
    signalled: bool,
}

struct Node {
    peer: PeerId,
    up: bool,
    incarnation: u64,
    drift_ppm: i64,
    offset_us: u64,
    core: Core,
    disk: Disk,
    timer_generation: u64,
    next_command: u64,
    /// Submits waiting for their reply: the queue and how many tasks the command holds.
    submits: BTreeMap<CommandId, (QueueId, usize)>,
    /// Joins waiting for their reply: command → queue index.
    joins: BTreeMap<CommandId, usize>,
    /// Invites this node makes, waiting for their token: command → (invitee, queue index).
    inviting: BTreeMap<CommandId, (usize, usize)>,
    subscribed: BTreeSet<String>,
    /// Runs in flight, by id.
    live: BTreeMap<RunId, Live>,
    /// Successors built ([`Io::Rotate`]), handed to the core after a delay.
    built: BTreeMap<RotateId, Built>,
    /// The first views after a restart are checked for superseded attempts held by this pool.
    restarted: bool,
    /// A planned stop asked of this incarnation ([`Command::Stop`]): its command, until
    /// answered.
    stopping: Option<CommandId>,
}

pub(crate) struct World {
    seed: u64,
    config: Config,
    qconfig: QueueConfig,
    rng: ChaCha8Rng,
    base: Instant,
    now_us: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Ev>,
    nodes: Vec<Node>,
    /// The queues, once created.
    queues: Vec<Option<QueueId>>,
    /// The invite each planned member of each queue joins with: (node, queue index) → token,
    /// made by the queue's creator right after it created the queue.
    invites: BTreeMap<(usize, usize), String>,
    /// Which nodes are members of which queue (by index).
    members: Vec<Vec<usize>>,
    /// The network model: cuts, links and what they lost.
    net: Network,
    faults_on: bool,
    faults: BTreeMap<String, u64>,
    /// Acknowledged submits.
    submitted: BTreeMap<TaskId, QueueId>,
    to_submit: usize,
    seen_states: BTreeMap<(usize, TaskId), TaskState>,
    /// The requeue mark each node's view last showed of each task (invariant 2).
    seen_requeues: BTreeMap<(usize, TaskId), u64>,
    /// Tasks some node's view showed final, ever (crashes do not forget it): a task that a
    /// rotation left behind was final on its sealer.
    ever_final: BTreeSet<TaskId>,
    /// Each node's last view of each task's state, for the situations it passes through.
    last_state: BTreeMap<(usize, TaskId), TaskState>,
    runs: BTreeMap<TaskId, Vec<RunRec>>,
    crashes: Vec<(usize, u64)>,
    /// What invariant 4 judges from: the greatest effective router of each node's views, per
    /// queue, as they stood at the end of each step (`World::note_claims_held`), and the
    /// document the node was on then: fences are per chain, so a move to a document whose
    /// lineage does not hold that one (the winning branch of a double seal) starts again.
    claims_held: BTreeMap<(usize, QueueId), (Claim, DocId)>,
    /// Assignments seen per claim (for the rate check), and when the claim last assigned.
    assigned: BTreeSet<(TaskId, u64, Claim)>,
    last_assign: BTreeMap<(QueueId, Claim), u64>,
    activations: usize,
    /// Queues that have had an active router: an activation of one of them is a takeover.
    activated: BTreeSet<QueueId>,
    takeovers: usize,
    claims_lost: usize,
    /// Starts the cores reported refused as fenced.
    fenced: usize,
    violations: Vec<Violation>,
    check_duplicates: bool,
    steps: u64,
    hasher: Sha256,
    tail: VecDeque<String>,
    settled: bool,
    /// The Byzantine member (the last node, in the `byzantine` mix only).
    hostile: Option<usize>,
    /// Its acts, sent and refused.
    byz: byzantine::Byzantine,
    /// Tasks some node's view showed succeeded, ever (with a Byzantine member, every task
    /// must be among them at the end).
    ever_succeeded: BTreeSet<TaskId>,
    /// The scheduling workload's records (the `scheduling` mix).
    sched: scheduling::Scheduling,
    life: lifecycle::Lifecycle,
    /// The tasks of schedule slots views showed (the `scheduling` mix).
    fired: schedules::Fired,
}

fn node_seed(seed: u64, node: usize, incarnation: u64) -> u64 {
    let h = Sha256::digest(format!(
        "piecework-sim {seed} node {node} incarnation {incarnation}"
    ));
    u64::from_le_bytes(h[..8].try_into().expect("8 bytes"))
}

impl World {
    pub(crate) fn new(seed: u64, config: &Config) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let qconfig = config.queue.clone().unwrap_or_else(|| {
            let mut q = QueueConfig {
                heartbeat_ms: 500,
                takeover_after_ms: 2_500,
                settle_ms: 500,
                pool_heartbeat_ms: 500,
                lease_ms: 10_000,
                max_attempts: 3,
                retry_backoff_ms: 500,
                retry_backoff_max_ms: 5_000,
                ..QueueConfig::default()
            };
            if rng.random_bool(0.3) {
                q.concurrency = rng.random_range(1..=4);
            }
            if rng.random_bool(0.2) {
                q.rate_interval_ms = rng.random_range(20..=300);
            }
            q
        });
        let mix = &config.mix;
        let check_duplicates =
            !mix.loses_messages() && !config.schedule.iter().any(|(_, f)| f.disturbs_messages());
        let base = Instant::now();
        let n = config.nodes;
        // A fault aimed at a node beyond the cluster would strike nothing, silently.
        for (at_ms, f) in &config.schedule {
            if let Some(i) = f.node() {
                assert!(
                    i < n,
                    "the fault at {at_ms} ms strikes node {i}, but the cluster has {n} nodes: {f:?}"
                );
            }
        }
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let drift_ppm = if mix.drift_ppm > 0 {
                rng.random_range(-mix.drift_ppm..=mix.drift_ppm)
            } else {
                0
            };
            let offset_us = rng.random_range(0..10_000_000);
            let peer = PeerId::new(format!("node{i}"));
            let t = time_at(base, offset_us, drift_ppm, 0);
            let core = Core::new(
                CoreConfig::new(peer.clone(), 1, config.workers, node_seed(seed, i, 1))
                    .with_rotation(config.rotation.0, config.rotation.1)
                    .with_catch_ups(catch_ups(i))
                    .with_epoch_retain(EPOCH_RETAIN)
                    .with_disk_retention(KEEP_TASK_DOCS, config.keep_sealed_epochs)
                    .with_relay_waits(relay_waits(config))
                    .with_cancel_grace(lifecycle::cancel_grace(config))
                    .with_capabilities(
                        scheduling::kinds_of(config, i),
                        scheduling::resources_of(config, i),
                    ),
                t,
            );
            nodes.push(Node {
                peer,
                up: true,
                incarnation: 1,
                drift_ppm,
                offset_us,
                core,
                disk: Disk::default(),
                timer_generation: 0,
                next_command: 0,
                submits: BTreeMap::new(),
                joins: BTreeMap::new(),
                inviting: BTreeMap::new(),
                subscribed: BTreeSet::new(),
                live: BTreeMap::new(),
                built: BTreeMap::new(),
                restarted: false,
                stopping: None,
            });
        }
        // Queue 0: every node. Queue 1: every node but the last, which must never hold its
        // documents.
        let members = vec![(0..n).collect(), (0..n.saturating_sub(1)).collect()];
        let mut w = World {
            seed,
            config: config.clone(),
            qconfig,
            rng,
            base,
            now_us: 0,
            seq: 0,
            events: BTreeMap::new(),
            nodes,
            queues: vec![None, None],
            invites: BTreeMap::new(),
            members,
            net: Network::default(),
            faults_on: true,
            faults: BTreeMap::new(),
            submitted: BTreeMap::new(),
            to_submit: config.tasks,
            seen_states: BTreeMap::new(),
            seen_requeues: BTreeMap::new(),
            ever_final: BTreeSet::new(),
            last_state: BTreeMap::new(),
            runs: BTreeMap::new(),
            crashes: vec![],
            claims_held: BTreeMap::new(),
            assigned: BTreeSet::new(),
            last_assign: BTreeMap::new(),
            activations: 0,
            activated: BTreeSet::new(),
            takeovers: 0,
            claims_lost: 0,
            fenced: 0,
            violations: vec![],
            check_duplicates,
            steps: 0,
            hasher: Sha256::new(),
            tail: VecDeque::new(),
            settled: false,
            hostile: (config.mix.byzantine_rate > 0.0).then(|| n - 1),
            byz: byzantine::Byzantine::default(),
            ever_succeeded: BTreeSet::new(),
            sched: scheduling::Scheduling::default(),
            life: lifecycle::Lifecycle::default(),
            fired: schedules::Fired::default(),
        };
        #[cfg(feature = "broken")]
        for n in &mut w.nodes {
            n.core
                .break_fencing(config.broken_fencing, config.broken_core_fencing);
        }
        w.setup();
        w
    }

    fn setup(&mut self) {
        // Node 0 creates queue 0 and node 1 queue 1; the other members join once connected.
        for (q, creator) in [(0usize, 0usize), (1, 1.min(self.nodes.len() - 1))] {
            let name = format!("sim{q}");
            let cmd = self.command_id(creator);
            let t = self.time(creator);
            self.nodes[creator].core.handle_command(
                t,
                cmd,
                Command::CreateQueue {
                    name,
                    config: self.qconfig.clone(),
                },
            );
            // Answered once its document is on disk; the queue is served at once.
            let known: Vec<Option<QueueId>> = self.queues.clone();
            self.queues[q] = self.nodes[creator]
                .core
                .queues()
                .find(|id| !known.contains(&Some((*id).clone())))
                .cloned();
            self.drive(creator);
            // An invite for each other planned member (as an admin, so that any member may
            // change the settings the fault mixes change), written into the queue at once:
            // any member then admits it, whoever is up when it joins.
            if let Some(queue) = self.queues[q].clone() {
                for i in self.members[q].clone() {
                    if i == creator {
                        continue;
                    }
                    let cmd = self.command_id(creator);
                    self.nodes[creator].inviting.insert(cmd, (i, q));
                    let t = self.time(creator);
                    let request = piecework_core::api::InviteRequest {
                        role: Some(piecework_queue_doc::Role::Admin),
                        for_peer: Some(self.nodes[i].peer.clone()),
                        expires_ms: None,
                    };
                    self.nodes[creator].core.handle_command(
                        t,
                        cmd,
                        Command::Invite {
                            queue: queue.clone(),
                            request,
                        },
                    );
                    self.drive(creator);
                }
            }
            if q == 0 {
                self.write_schedule(creator);
            }
        }
        self.relink();
        for q in 0..self.members.len() {
            for i in self.members[q].clone() {
                if !self.is_member_now(i, q) {
                    self.schedule_at(0, Ev::Join { node: i, queue: q });
                }
            }
        }
        let fault_ms = self.config.fault_ms;
        for _ in 0..self.config.tasks {
            let at = self.rng.random_range(0..=fault_ms * 8 / 10) * 1000;
            self.schedule_at(at, Ev::Submit);
        }
        for (at_ms, f) in self.config.schedule.clone() {
            self.schedule_at(at_ms * 1000, Ev::Fault(f));
        }
        for kind in [
            Kind::Crash,
            Kind::Partition,
            Kind::OneWay,
            Kind::WriteFailures,
            Kind::ReadFailures,
            // Last: a mix without planned stops draws the same schedule as before they existed.
            Kind::Stop,
            // After it, for the same reason: only the `byzantine` mix has hostile acts.
            Kind::Byzantine,
            Kind::Settings,
            Kind::Lifecycle,
        ] {
            self.schedule_background(kind);
        }
        self.schedule_at(fault_ms * 1000, Ev::HealAll);
    }

    fn is_member_now(&self, i: usize, q: usize) -> bool {
        self.queues[q]
            .as_ref()
            .is_some_and(|id| self.nodes[i].core.view(id).is_some())
    }

    fn command_id(&mut self, i: usize) -> CommandId {
        self.nodes[i].next_command += 1;
        CommandId(self.nodes[i].next_command)
    }

    // ----- time -----

    fn time(&self, node: usize) -> Time {
        let n = &self.nodes[node];
        time_at(self.base, n.offset_us, n.drift_ppm, self.now_us)
    }

    /// When the attempt `node` is starting was assigned, in virtual µs: the attempt's
    /// `assigned_at` is the router's wall clock, turned back into virtual time through the
    /// router node's clock. Falls back to now if the view or the router is unknown.
    fn assigned_us(&self, node: usize, queue: &QueueId, task: &TaskId, attempt: &AttemptId) -> u64 {
        let found = self.nodes[node]
            .core
            .view(queue)
            .and_then(|v| v.task(task))
            .and_then(|t| t.attempts.iter().find(|a| a.id == *attempt))
            .map(|a| a.assigned_at);
        let (Some(wall_ms), Some(router)) = (found, self.index_of(&attempt.claim.peer)) else {
            return self.now_us;
        };
        let n = &self.nodes[router];
        let local = i128::from(wall_ms.saturating_sub(EPOCH_MS)) * 1000 - i128::from(n.offset_us);
        let global = (local * 1_000_000).div_euclid(1_000_000 + i128::from(n.drift_ppm));
        (global.max(0) as u64).min(self.now_us)
    }

    /// The virtual time at which `node`'s clock reads `at` (never before now).
    fn global_of(&self, node: usize, at: Instant) -> u64 {
        let n = &self.nodes[node];
        let local =
            at.saturating_duration_since(self.base).as_micros() as i128 - i128::from(n.offset_us);
        let global = (local * 1_000_000).div_euclid(1_000_000 + i128::from(n.drift_ppm)) + 1;
        (global.max(0) as u64).max(self.now_us)
    }

    // ----- the event queue, the counts and the trace -----

    fn schedule_at(&mut self, at_us: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((at_us.max(self.now_us), self.seq), ev);
    }

    fn count(&mut self, fault: &str) {
        *self.faults.entry(fault.to_owned()).or_default() += 1;
    }

    fn trace(&mut self, line: impl FnOnce() -> String) {
        let line = format!("{:>10.3}s {}", self.now_us as f64 / 1e6, line());
        self.hasher.update(line.as_bytes());
        self.tail.push_back(line);
        while self.tail.len() > self.config.trace_lines {
            self.tail.pop_front();
        }
    }

    fn violate(&mut self, invariant: u8, what: String) {
        self.trace(|| format!("VIOLATION of invariant {invariant}: {what}"));
        self.violations.push(Violation {
            invariant,
            at_ms: self.now_us / 1000,
            what,
        });
    }

    fn index_of(&self, peer: &PeerId) -> Option<usize> {
        self.nodes.iter().position(|n| &n.peer == peer)
    }

    // ----- the loop -----

    pub(crate) fn run(mut self) -> Report {
        while let Some(((at, _), ev)) = self.events.pop_first() {
            self.now_us = at;
            self.steps += 1;
            self.hasher.update(at.to_le_bytes());
            if self.steps > MAX_STEPS {
                self.violate(1, format!("no progress after {MAX_STEPS} steps (livelock)"));
                break;
            }
            let target = match &ev {
                Ev::Sync { to, .. } | Ev::Gossip { to, .. } => Some(*to),
                _ => None,
            };
            match target {
                Some(n) if self.nodes[n].up && self.rng.random_bool(BATCH_CHANCE) => {
                    self.step_batch(n, at, ev)
                }
                _ => self.step(ev),
            }
            if self.settled || self.violations.len() > 20 {
                break;
            }
            if self.now_us > (self.config.fault_ms + self.config.settle_limit_ms) * 1000 {
                self.unsettled();
                break;
            }
        }
        self.report()
    }

    /// Delivers `ev` and every other message to node `n` due within [`BATCH_WINDOW_US`] as one
    /// batch ([`Core::begin_batch`]), as a shell does with what is ready at once. Taking a
    /// message a little early is a shorter latency, and messages stay in their order.
    fn step_batch(&mut self, n: usize, at: u64, ev: Ev) {
        let more: Vec<(u64, u64)> = self
            .events
            .range(..=(at + BATCH_WINDOW_US, u64::MAX))
            .filter(|(_, e)| matches!(e, Ev::Sync { to, .. } | Ev::Gossip { to, .. } if *to == n))
            .map(|(k, _)| *k)
            .take(MAX_BATCH)
            .collect();
        if more.is_empty() {
            self.step(ev);
            return;
        }
        self.count("batched_inputs");
        self.nodes[n].core.begin_batch();
        // As the shell does on waking: beats due go out before the batch (at once, here).
        let t = self.time(n);
        self.nodes[n].core.handle_beats(t);
        self.step(ev);
        for k in more {
            if let Some(e) = self.events.remove(&k) {
                self.step(e);
            }
        }
        let t = self.time(n);
        self.nodes[n].core.end_batch(t);
        self.drive(n);
    }

    /// Hands one event to the module that owns it.
    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Sync {
                from,
                to,
                epoch,
                frame,
            } => self.deliver_sync(from, to, epoch, frame),
            Ev::Gossip {
                from,
                to,
                topic,
                data,
            } => self.deliver_gossip(from, to, topic, data),
            Ev::Timer { node, generation } => self.timer_fired(node, generation),
            Ev::RunEnd {
                node,
                incarnation,
                run,
                ok,
            } => self.run_ended(node, incarnation, run, ok),
            Ev::Saved {
                node,
                incarnation,
                id,
            } => self.saved(node, incarnation, id),
            Ev::Loaded {
                node,
                incarnation,
                doc,
            } => self.loaded(node, incarnation, doc),
            Ev::Rotated {
                node,
                incarnation,
                id,
            } => self.rotated(node, incarnation, id),
            Ev::Archived {
                node,
                incarnation,
                task,
            } => self.archived(node, incarnation, task),
            Ev::Listed {
                node,
                incarnation,
                cmd,
                read,
            } => self.listed(node, incarnation, cmd, read),
            Ev::Ends {
                node,
                incarnation,
                lookup,
                tasks,
                failed_in,
            } => self.ends_read(node, incarnation, lookup, tasks, failed_in),
            Ev::Submit => self.submit(),
            Ev::Join { node, queue } => self.join(node, queue),
            Ev::Fault(f) => self.fault(&f),
            Ev::Restart { node, incarnation } => {
                if !self.nodes[node].up && self.nodes[node].incarnation == incarnation {
                    self.restart(node);
                }
            }
            Ev::Background(kind) => {
                if self.faults_on {
                    self.background(kind);
                    self.schedule_background(kind);
                }
            }
            Ev::Resume { queue } => self.resume(queue),
            Ev::CutsChanged => self.cuts_changed(),
            Ev::SilentEnds => self.silent_cuts_end(),
            Ev::HealAll => self.heal_all(),
            Ev::SettleCheck => {
                self.resume_where_paused();
                if self.is_settled() {
                    self.settled = true;
                    self.final_checks();
                } else {
                    self.schedule_at(self.now_us + SETTLE_CHECK_MS * 1000, Ev::SettleCheck);
                }
            }
        }
    }

    fn report(self) -> Report {
        let duplicated_tasks = self
            .runs
            .values()
            .filter(|v| v.iter().filter(|r| r.end == Some(End::Succeeded)).count() > 1)
            .count();
        let rerun_tasks = self.runs.values().filter(|v| v.len() > 1).count();
        let max_runs = self.runs.values().map(Vec::len).max().unwrap_or(0);
        let lost = self.lost();
        Report {
            seed: self.seed,
            shape: self.config.shape(),
            tasks: self.submitted.len(),
            lost,
            duplicated_tasks,
            rerun_tasks,
            max_runs,
            activations: self.activations,
            takeovers: self.takeovers,
            claims_lost: self.claims_lost,
            fenced: self.fenced,
            faults: self.faults,
            byzantine_sent: self.byz.sent,
            byzantine_refused: self.byz.refused,
            violations: self.violations,
            virtual_ms: self.now_us / 1000,
            steps: self.steps,
            trace_hash: hex::encode(self.hasher.finalize()),
            trace_tail: self.tail.into_iter().collect(),
        }
    }
}

/// Sealed epochs are kept this long in the simulation (a node's default is a minute): short
/// enough that evictions happen while faults go on.
const EPOCH_RETAIN: Duration = Duration::from_secs(10);
/// Finished tasks' documents a simulated node keeps on disk (a node's default is 100,000):
/// few, so that deletions happen while faults go on.
const KEEP_TASK_DOCS: usize = 16;

fn local_us(offset_us: u64, drift_ppm: i64, now_us: u64) -> u64 {
    let scaled = i128::from(now_us) * (1_000_000 + i128::from(drift_ppm)) / 1_000_000;
    offset_us + scaled as u64
}

fn time_at(base: Instant, offset_us: u64, drift_ppm: i64, now_us: u64) -> Time {
    let local = local_us(offset_us, drift_ppm, now_us);
    Time {
        mono: base + Duration::from_micros(local),
        unix_ms: EPOCH_MS + local / 1000,
    }
}

/// Node `i`'s catch-ups of a successor it builds: none, one or two, so that every cluster has
/// sealers that freeze their queue at once and some that catch up first.
fn catch_ups(i: usize) -> u32 {
    (i % 3) as u32
}

/// The relay waits a config asks for, if any.
fn relay_waits(config: &Config) -> Option<(std::time::Duration, std::time::Duration)> {
    config.relay_ms.map(|(lower, higher)| {
        (
            std::time::Duration::from_millis(lower),
            std::time::Duration::from_millis(higher),
        )
    })
}
