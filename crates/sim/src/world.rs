//! The simulated world: N cores, the network, the disks and the handler runs between them, the
//! event queue, and the checks. Everything a node decides is decided by its [`Core`]; this file
//! only plays the outside world and watches.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::Automerge;
use piecework_core::api::{BatchEntry, StorageFailure, SubmitTask};
use piecework_core::{
    Built, Command, CommandId, Config as CoreConfig, Core, EpochEvent, Event, Io, Reply, Retired,
    RotateId, RouterEvent, RunId, RunResult, Save, SaveId, Saved, Time,
};
use piecework_queue_doc::{
    AttemptId, Claim, PeerId, QueueConfig, QueueId, QueueView, TaskId, TaskState,
};
use piecework_replica::DocId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{Config, Report, Target, Violation};

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

/// A fault at a fixed time (see [`Config::schedule`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// Crash the node; it restarts after a downtime drawn from the mix.
    Crash(Target),
    /// Cut the node off from every other, both ways.
    Isolate(Target),
    /// Split the cluster into two halves (the first `n / 2` nodes and the rest).
    Halves,
    /// Lose everything the node sends (it still hears the others' heartbeats).
    SilenceOut(Target),
    /// Delay the node's heartbeats by `extra_ms` for `for_ms`.
    DelayBeats {
        /// Whose heartbeats.
        target: Target,
        /// Extra delay, ms.
        extra_ms: u64,
        /// For how long, ms.
        for_ms: u64,
    },
    /// End every cut and delay.
    Heal,
}

impl Fault {
    /// Whether this fault loses or delays messages beyond the normal range (invariants 5 and 7
    /// are not expected to hold in runs that have one).
    pub fn disturbs_messages(&self) -> bool {
        !matches!(self, Fault::Crash(_) | Fault::Heal)
    }
}

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
    CutsChanged,
    /// Silent cuts that end now: their streams are reset (the transport's stall detection).
    SilentEnds,
    HealAll,
    SettleCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Crash,
    Partition,
    OneWay,
    WriteFailures,
    ReadFailures,
    Stop,
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
}

/// A document as the invariants last read it back, and the chunks saved since.
type ReadBack = (Automerge, Vec<Vec<u8>>);

/// One node's disk: stored chunks by document and key, and the queues it remembers.
#[derive(Debug, Default)]
struct Disk {
    docs: BTreeMap<DocId, BTreeMap<String, Vec<u8>>>,
    queues: BTreeSet<QueueId>,
    /// The epoch document each queue was last on (`Io::RememberEpoch`), handed back at a
    /// restart.
    epochs: BTreeMap<QueueId, DocId>,
    /// Archived final statuses of inline tasks.
    archive: BTreeMap<TaskId, Vec<u8>>,
    /// Retired documents not deleted yet, in the order retired (handed back at a restart).
    retired: Vec<(DocId, Retired)>,
    /// Writes in flight (not acknowledged yet).
    pending: BTreeMap<SaveId, Save>,
    /// Every write fails until then (virtual µs).
    failing_writes_until: u64,
    /// Every read fails until then (virtual µs).
    failing_reads_until: u64,
    /// The documents the invariants read back, each with the chunks saved since: applied at
    /// the next read, it equals loading every stored chunk (a compaction or a deletion drops
    /// it). Loading every chunk at every check took a sixth of the simulator's time.
    read_back: RefCell<HashMap<DocId, ReadBack>>,
}

impl Disk {
    fn apply(&mut self, save: &Save) -> Saved {
        let chunks = self.docs.entry(save.doc.clone()).or_default();
        for (hash, bytes) in &save.changes {
            chunks.insert(format!("c/{hash}"), bytes.clone());
        }
        let mut read_back = self.read_back.borrow_mut();
        if save.compact.is_some() {
            read_back.remove(&save.doc);
        } else if let Some((_, unread)) = read_back.get_mut(&save.doc) {
            unread.extend(save.changes.iter().map(|(_, bytes)| bytes.clone()));
        }
        if let Some(c) = &save.compact {
            let (snapshot, replaces) = c.clone().build();
            for h in &replaces {
                chunks.remove(&format!("c/{h}"));
            }
            let snapshot_bytes = Some(snapshot.len());
            chunks.insert("a/snapshot".into(), snapshot);
            return Saved { snapshot_bytes };
        }
        Saved::default()
    }

    /// Every chunk of a document, the snapshot first.
    fn chunks(&self, doc: &DocId) -> Vec<Vec<u8>> {
        self.docs
            .get(doc)
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Reads a stored document as a node loading it would see it, if any chunk of it is
    /// stored and every chunk loads.
    fn read<R>(&self, doc: &DocId, f: impl FnOnce(&Automerge) -> R) -> Option<R> {
        let mut read_back = self.read_back.borrow_mut();
        if let Some((d, unread)) = read_back.get_mut(doc) {
            let applied = std::mem::take(unread)
                .iter()
                .all(|c| d.load_incremental(c).is_ok());
            if applied {
                return Some(f(d));
            }
            read_back.remove(doc);
        }
        let chunks = self.chunks(doc);
        if chunks.is_empty() {
            return None;
        }
        let d = piecework_replica::load_chunks(&chunks).ok()?;
        let r = f(&d);
        read_back.insert(doc.clone(), (d, vec![]));
        Some(r)
    }

    fn delete(&mut self, doc: &DocId) {
        self.docs.remove(doc);
        self.read_back.borrow_mut().remove(doc);
    }
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
    /// Submits waiting for their reply: command → queue.
    /// Submits waiting for their reply: the queue and how many tasks the command holds.
    submits: BTreeMap<CommandId, (QueueId, usize)>,
    /// Joins waiting for their reply: command → queue index.
    joins: BTreeMap<CommandId, usize>,
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

struct Cut {
    blocked: BTreeSet<(usize, usize)>,
    until_us: u64,
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
    /// Which nodes are members of which queue (by index).
    members: Vec<Vec<usize>>,
    cuts: Vec<Cut>,
    /// Silent one-way cuts: the stream stays up but what the node sends is lost, as on a
    /// half-open connection, until the transport's stall detection resets it when they end.
    silent: Vec<Cut>,
    beat_delay: BTreeMap<usize, (u64, u64)>,
    /// Connected pairs (a < b) and their connection epochs.
    links: BTreeSet<(usize, usize)>,
    epochs: BTreeMap<(usize, usize), u64>,
    last_sync_at: BTreeMap<(usize, usize), u64>,
    last_beat_at: BTreeMap<(usize, usize), u64>,
    /// Message losses and cuts: (from µs, until µs, a, b).
    disturbances: Vec<(u64, u64, usize, usize)>,
    faults_on: bool,
    faults: BTreeMap<String, u64>,
    /// Acknowledged submits.
    submitted: BTreeMap<TaskId, QueueId>,
    to_submit: usize,
    seen_states: BTreeMap<(usize, TaskId), TaskState>,
    /// Tasks some node's view showed final, ever (crashes do not forget it): a task that a
    /// rotation left behind was final on its sealer.
    ever_final: BTreeSet<TaskId>,
    /// Each node's last view of each task's state, for the situations it passes through.
    last_state: BTreeMap<(usize, TaskId), TaskState>,
    runs: BTreeMap<TaskId, Vec<RunRec>>,
    crashes: Vec<(usize, u64)>,
    /// Assignments seen per claim (for the rate check), and when the claim last assigned.
    assigned: BTreeSet<(TaskId, u64, Claim)>,
    last_assign: BTreeMap<(QueueId, Claim), u64>,
    activations: usize,
    claims_lost: usize,
    violations: Vec<Violation>,
    check_duplicates: bool,
    steps: u64,
    hasher: Sha256,
    tail: VecDeque<String>,
    settled: bool,
}

fn pair(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
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
                    .with_relay_waits(relay_waits(config)),
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
            members,
            cuts: vec![],
            silent: vec![],
            beat_delay: BTreeMap::new(),
            links: BTreeSet::new(),
            epochs: BTreeMap::new(),
            last_sync_at: BTreeMap::new(),
            last_beat_at: BTreeMap::new(),
            disturbances: vec![],
            faults_on: true,
            faults: BTreeMap::new(),
            submitted: BTreeMap::new(),
            to_submit: config.tasks,
            seen_states: BTreeMap::new(),
            ever_final: BTreeSet::new(),
            last_state: BTreeMap::new(),
            runs: BTreeMap::new(),
            crashes: vec![],
            assigned: BTreeSet::new(),
            last_assign: BTreeMap::new(),
            activations: 0,
            claims_lost: 0,
            violations: vec![],
            check_duplicates,
            steps: 0,
            hasher: Sha256::new(),
            tail: VecDeque::new(),
            settled: false,
        };
        #[cfg(feature = "broken")]
        if config.broken_fencing {
            for n in &mut w.nodes {
                n.core.break_fencing();
            }
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
            while let Some((_, reply)) = self.nodes[creator].core.poll_reply() {
                if let Reply::Created(Ok(id)) = reply {
                    self.queues[q] = Some(id);
                }
            }
            self.drive(creator);
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

    fn schedule_at(&mut self, at_us: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((at_us.max(self.now_us), self.seq), ev);
    }

    fn schedule_background(&mut self, kind: Kind) {
        let mix = &self.config.mix;
        let rate = match kind {
            Kind::Crash => mix.crash_rate,
            Kind::Partition => mix.partition_rate,
            Kind::OneWay => mix.oneway_rate,
            Kind::WriteFailures => mix.write_failure_rate,
            Kind::ReadFailures => mix.read_failure_rate,
            Kind::Stop => mix.stop_rate,
        };
        if rate <= 0.0 {
            return;
        }
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        let wait_us = (-u.ln() / rate * 1e6) as u64;
        let at = self.now_us + wait_us;
        if at < self.config.fault_ms * 1000 {
            self.schedule_at(at, Ev::Background(kind));
        }
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

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Sync {
                from,
                to,
                epoch,
                frame,
            } => {
                let p = pair(from, to);
                if !self.nodes[to].up
                    || !self.links.contains(&p)
                    || self.epochs.get(&p) != Some(&epoch)
                {
                    return;
                }
                if self.silenced(from, to) {
                    self.count("frame_lost_silently");
                    return;
                }
                if self.faults_on && self.rng.random_bool(self.config.mix.reset) {
                    self.count("sync_reset");
                    self.disturbances.push((self.now_us, self.now_us, from, to));
                    self.trace(|| format!("sync stream {from}-{to} reset"));
                    self.reset_link(p);
                    return;
                }
                let t = self.time(to);
                let peer = self.nodes[from].peer.clone();
                self.nodes[to].core.handle_sync(t, &peer, &frame);
                self.drive(to);
            }
            Ev::Gossip {
                from,
                to,
                topic,
                data,
            } => {
                if !self.nodes[to].up
                    || self.blocked(from, to)
                    || self.silenced(from, to)
                    || !self.nodes[to].subscribed.contains(&topic)
                {
                    return;
                }
                let t = self.time(to);
                let peer = self.nodes[from].peer.clone();
                self.nodes[to].core.handle_gossip(t, &topic, &peer, &data);
                self.drive(to);
            }
            Ev::Timer { node, generation } => {
                if !self.nodes[node].up || self.nodes[node].timer_generation != generation {
                    return;
                }
                let t = self.time(node);
                self.nodes[node].core.handle_timeout(t);
                self.drive(node);
            }
            Ev::RunEnd {
                node,
                incarnation,
                run,
                ok,
            } => {
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let Some(live) = self.nodes[node].live.remove(&run) else {
                    return;
                };
                let now = self.now_us;
                if let Some(r) = self.runs.get_mut(&live.task).and_then(|v| {
                    v.iter_mut()
                        .rev()
                        .find(|r| r.node == node && r.end.is_none())
                }) {
                    r.end = Some(if ok { End::Succeeded } else { End::Failed });
                    r.end_us = Some(now);
                }
                if !ok {
                    self.count("handler_failure");
                }
                self.trace(|| format!("node{node} run of {} ended ok={ok}", live.task));
                let result = RunResult {
                    result: match ok {
                        true => Ok(serde_json::json!({"ok": true})),
                        false => Err("simulated failure".into()),
                    },
                    logs: vec![],
                };
                let t = self.time(node);
                self.nodes[node].core.handle_run_ended(t, run, result);
                self.drive(node);
            }
            Ev::Saved {
                node,
                incarnation,
                id,
            } => {
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let Some(save) = self.nodes[node].disk.pending.remove(&id) else {
                    return;
                };
                let result = if self.now_us < self.nodes[node].disk.failing_writes_until {
                    self.count("save_error");
                    Err(StorageFailure("simulated write failure".into()))
                } else {
                    Ok(self.nodes[node].disk.apply(&save))
                };
                let t = self.time(node);
                self.nodes[node].core.handle_saved(t, id, result);
                self.drive(node);
            }
            Ev::Loaded {
                node,
                incarnation,
                doc,
            } => {
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let chunks = if self.now_us < self.nodes[node].disk.failing_reads_until {
                    self.count("load_error");
                    Err(StorageFailure("simulated read failure".into()))
                } else {
                    Ok(self.nodes[node].disk.chunks(&doc))
                };
                let t = self.time(node);
                self.nodes[node].core.handle_loaded(t, &doc, chunks);
                self.drive(node);
            }
            Ev::Rotated {
                node,
                incarnation,
                id,
            } => {
                let Some(built) = self.nodes[node].built.remove(&id) else {
                    return;
                };
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let t = self.time(node);
                self.nodes[node].core.handle_rotated(t, built);
                self.drive(node);
            }
            Ev::Archived {
                node,
                incarnation,
                task,
            } => {
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let status = self.nodes[node].disk.archive.get(&task).cloned();
                let t = self.time(node);
                self.nodes[node].core.handle_archived(t, task, status);
                self.drive(node);
            }
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
            Ev::CutsChanged => {
                let now = self.now_us;
                self.cuts.retain(|c| c.until_us > now);
                self.relink();
            }
            Ev::SilentEnds => {
                let now = self.now_us;
                let (ended, kept): (Vec<Cut>, Vec<Cut>) = std::mem::take(&mut self.silent)
                    .into_iter()
                    .partition(|c| c.until_us <= now);
                self.silent = kept;
                let pairs: BTreeSet<(usize, usize)> = ended
                    .iter()
                    .flat_map(|c| c.blocked.iter().map(|&(a, b)| pair(a, b)))
                    .collect();
                for p in pairs {
                    if self.links.contains(&p) {
                        self.trace(|| format!("stalled stream {}-{} reset", p.0, p.1));
                        self.reset_link(p);
                    }
                }
            }
            Ev::HealAll => self.heal_all(),
            Ev::SettleCheck => {
                if self.is_settled() {
                    self.settled = true;
                    self.final_checks();
                } else {
                    self.schedule_at(self.now_us + SETTLE_CHECK_MS * 1000, Ev::SettleCheck);
                }
            }
        }
    }

    // ----- a node's turn -----

    /// Carries out everything node `i`'s core asks for, watches what it reports, and sets its
    /// timer: what the node's shell does after every input.
    fn drive(&mut self, i: usize) {
        if !self.nodes[i].up {
            return;
        }
        loop {
            let mut any = false;
            while let Some(ev) = self.nodes[i].core.poll_event() {
                any = true;
                self.event(i, ev);
            }
            while let Some((cmd, reply)) = self.nodes[i].core.poll_reply() {
                any = true;
                self.reply(i, cmd, reply);
            }
            while let Some(io) = self.nodes[i].core.poll_io() {
                any = true;
                self.io(i, io);
            }
            let now = self.time(i).mono;
            while let Some((to, frame)) = self.nodes[i].core.poll_transmit(now) {
                any = true;
                if let Some(j) = self.index_of(&to) {
                    self.send_sync(i, j, frame);
                }
            }
            if !any {
                break;
            }
        }
        let next = self.nodes[i].core.poll_timeout();
        let n = &mut self.nodes[i];
        n.timer_generation += 1;
        let generation = n.timer_generation;
        if let Some(at) = next {
            let at = self.global_of(i, at);
            self.schedule_at(
                at,
                Ev::Timer {
                    node: i,
                    generation,
                },
            );
        }
    }

    fn index_of(&self, peer: &PeerId) -> Option<usize> {
        self.nodes.iter().position(|n| &n.peer == peer)
    }

    fn io(&mut self, i: usize, io: Io) {
        let inc = self.nodes[i].incarnation;
        match io {
            Io::Load { doc } => {
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Loaded {
                        node: i,
                        incarnation: inc,
                        doc,
                    },
                );
            }
            Io::Save(save) => {
                self.check_scope(i, &save.doc);
                let (lo, hi) = self.config.mix.write_us;
                let us = self.rng.random_range(lo..=hi.max(lo));
                let id = save.id;
                self.nodes[i].disk.pending.insert(id, save);
                self.schedule_at(
                    self.now_us + us,
                    Ev::Saved {
                        node: i,
                        incarnation: inc,
                        id,
                    },
                );
            }
            Io::Run(req) => {
                let claim = req.attempt.claim.clone();
                self.check_start(i, &req.queue, &req.task, &claim);
                self.trace(|| {
                    format!(
                        "node{i} starts {} {} on {}",
                        req.task, req.attempt, req.worker
                    )
                });
                let (lo, hi) = self.config.mix.run_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let ok = !self.rng.random_bool(self.config.mix.handler_failure);
                self.nodes[i].live.insert(
                    req.id,
                    Live {
                        task: req.task.clone(),
                        queue: req.queue.clone(),
                        claim: claim.clone(),
                        tainted: false,
                    },
                );
                let assigned_us = self.assigned_us(i, &req.queue, &req.task, &req.attempt);
                self.runs.entry(req.task.clone()).or_default().push(RunRec {
                    node: i,
                    claim,
                    assigned_us,
                    start_us: self.now_us,
                    end_us: None,
                    end: None,
                });
                self.schedule_at(
                    self.now_us + ms * 1000,
                    Ev::RunEnd {
                        node: i,
                        incarnation: inc,
                        run: req.id,
                        ok,
                    },
                );
            }
            // Every pair of up, uncut nodes is connected: dials change nothing here.
            Io::Dial { .. } => {}
            Io::Publish { topic, data } => self.gossip(i, topic, data),
            Io::Subscribe { topic } => {
                self.nodes[i].subscribed.insert(topic);
            }
            Io::RememberQueue { id, .. } => {
                self.nodes[i].disk.queues.insert(id);
            }
            Io::RememberEpoch { queue, doc } => {
                self.nodes[i].disk.epochs.insert(queue, doc);
            }
            Io::Rotate(job) => {
                // Built at once (it is deterministic), handed back later: the router goes on
                // writing the document meanwhile, and those writes are carried as late ones.
                let id = job.id;
                self.nodes[i].built.insert(id, job.build());
                let us = self.rng.random_range(BUILD_US.0..=BUILD_US.1);
                self.schedule_at(
                    self.now_us + us,
                    Ev::Rotated {
                        node: i,
                        incarnation: inc,
                        id,
                    },
                );
            }
            Io::Retire { doc, kind } => {
                let retired = &mut self.nodes[i].disk.retired;
                if !retired.iter().any(|(d, _)| *d == doc) {
                    retired.push((doc, kind));
                }
            }
            Io::Delete { doc } => {
                self.count("deleted_docs");
                let disk = &mut self.nodes[i].disk;
                disk.delete(&doc);
                disk.retired.retain(|(d, _)| *d != doc);
            }
            Io::Archive { records } => {
                self.count("archived");
                self.nodes[i].disk.archive.extend(records);
            }
            Io::Lookup { task } => {
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Archived {
                        node: i,
                        incarnation: inc,
                        task,
                    },
                );
            }
        }
    }

    fn reply(&mut self, i: usize, cmd: CommandId, reply: Reply) {
        match reply {
            Reply::Submitted(r) => {
                let Some((queue, _)) = self.nodes[i].submits.remove(&cmd) else {
                    return;
                };
                match r {
                    Ok(s) => self.acknowledged(i, &queue, s.task_id),
                    Err(e) => self.submit_refused(i, 1, &e.to_string()),
                }
            }
            Reply::SubmittedMany(r) => {
                let Some((queue, n)) = self.nodes[i].submits.remove(&cmd) else {
                    return;
                };
                match r {
                    Ok(entries) => {
                        self.count("batch_submit");
                        for e in entries {
                            match e {
                                BatchEntry::Submitted { task_id, .. } => {
                                    self.acknowledged(i, &queue, task_id)
                                }
                                BatchEntry::Refused { error, .. } => {
                                    self.submit_refused(i, 1, &error)
                                }
                            }
                        }
                    }
                    Err(e) => self.submit_refused(i, n, &e.to_string()),
                }
            }
            Reply::Joined(r) => {
                let Some(q) = self.nodes[i].joins.remove(&cmd) else {
                    return;
                };
                if let Err(e) = r {
                    self.trace(|| format!("node{i} could not join queue {q}: {e}"));
                    self.schedule_at(self.now_us + RETRY_US, Ev::Join { node: i, queue: q });
                }
            }
            Reply::Created(_)
            | Reply::Paused(_)
            | Reply::Task(_)
            | Reply::Status(_)
            | Reply::Document(_) => {}
            Reply::Stopped(report) => {
                if self.nodes[i].stopping != Some(cmd) {
                    return;
                }
                if report.handed_over.iter().any(|(_, to)| to.is_some()) {
                    self.count("router_handed_over");
                }
                if report.runs_interrupted > 0 {
                    self.count("runs_interrupted_by_a_stop");
                }
                // The process exits once its stop is answered: down like a crash (its runs
                // still going are abandoned), and restarted after a downtime.
                self.down(i, true);
            }
        }
    }

    fn acknowledged(&mut self, i: usize, queue: &QueueId, task: TaskId) {
        self.trace(|| format!("node{i} acknowledged task {task}"));
        self.check_durable(i, queue, &task);
        self.submitted.insert(task, queue.clone());
    }

    /// `n` tasks were not taken: the client submits them again a little later.
    fn submit_refused(&mut self, i: usize, n: usize, error: &str) {
        self.count("submit_refused");
        self.trace(|| format!("node{i} refused {n} submit(s): {error}"));
        self.to_submit += n;
        for _ in 0..n {
            self.schedule_at(self.now_us + RETRY_US, Ev::Submit);
        }
    }

    fn event(&mut self, i: usize, ev: Event) {
        match ev {
            Event::View { queue, view } => self.watch_view(i, &queue, &view),
            Event::Router { event, queue } => match event {
                RouterEvent::BecameActive(c) => {
                    self.activations += 1;
                    self.trace(|| format!("node{i} active for {queue} as {c}"));
                }
                RouterEvent::ClaimLost { .. } => {
                    self.claims_lost += 1;
                    self.trace(|| format!("node{i} router: {event:?}"));
                }
                e => self.trace(|| format!("node{i} router: {e:?}")),
            },
            Event::NotRun {
                task,
                attempt,
                outcome,
                reason,
            } => {
                self.trace(|| {
                    format!("node{i} did not run {task} {attempt}: {outcome:?} {reason}")
                });
            }
            Event::FetchFailed { task, timed_out } => {
                self.count("fetch_failed");
                if timed_out {
                    self.count("fetch_timeout");
                }
                self.trace(|| format!("node{i} found no member with {task}'s document"));
            }
            Event::SaveFailed { doc, failures, .. } => {
                self.count("save_failure_reported");
                self.trace(|| format!("node{i} cannot write {doc} ({failures} failures)"));
            }
            Event::LoadFailed { doc, error } => {
                self.trace(|| format!("node{i} cannot load {doc}: {error}"));
            }
            Event::Rejected { peer, reason } => {
                self.count("rejected");
                self.trace(|| format!("node{i} rejected {peer}: {reason}"));
            }
            Event::Epoch { queue, event } => {
                match &event {
                    EpochEvent::Rotated { .. } => self.count("rotation"),
                    EpochEvent::Switched { sideways: true, .. } => {
                        self.count("double_seal_followed")
                    }
                    EpochEvent::Switched { missing, .. } => {
                        self.count("epoch_switch");
                        if *missing > 0 {
                            self.count("moved_past_deleted_epochs");
                        }
                    }
                    EpochEvent::Carried {
                        from_loser: false,
                        writes,
                    } => {
                        *self.faults.entry("carried_late_writes".into()).or_default() +=
                            u64::try_from(*writes).unwrap_or(u64::MAX)
                    }
                    EpochEvent::Carried {
                        from_loser: true, ..
                    } => self.count("successor_merge"),
                    EpochEvent::Evicted { .. } => self.count("epoch_evicted"),
                }
                self.trace(|| format!("node{i} {queue}: {event:?}"));
            }
            Event::RunStarted { .. } | Event::RunEnded { .. } => {}
        }
    }

    /// Invariant 2 (no outcome regresses, no task leaves the index), the rate half of
    /// invariant 6, and the situations a restarted pool meets.
    fn watch_view(&mut self, i: usize, queue: &QueueId, view: &Arc<QueueView>) {
        let mut bad = vec![];
        let mut situations = vec![];
        for (id, t) in view.tasks() {
            let s = t.state();
            let key = (i, id.clone());
            let was = self.last_state.insert(key.clone(), s);
            if s == TaskState::InputUnavailable && was != Some(s) {
                situations.push("input_unavailable");
            }
            if was == Some(TaskState::InputUnavailable) && s != TaskState::InputUnavailable {
                situations.push("input_revived");
            }
            if let Some(prev) = self.seen_states.get(&key) {
                let regressed = (prev.is_final() && !s.is_final())
                    || (*prev == TaskState::Succeeded && s != TaskState::Succeeded);
                if regressed {
                    bad.push(format!(
                        "node{i}: {id} went from {} to {}",
                        prev.as_str(),
                        s.as_str()
                    ));
                }
            }
            if s.is_final() && !self.ever_final.contains(id) {
                self.ever_final.insert(id.clone());
            }
            if s.is_final() || !self.seen_states.contains_key(&key) {
                self.seen_states.insert(key, s);
            }
        }
        for b in bad {
            self.violate(2, b);
        }
        for k in situations {
            self.count(k);
        }
        // A restarted pool holding an attempt that was superseded while it was down.
        if self.nodes[i].restarted {
            let me = self.nodes[i].peer.clone();
            let inc = self.nodes[i].incarnation;
            let held = view.tasks().values().any(|t| {
                t.attempts.iter().any(|a| {
                    a.worker.peer == me
                        && a.is_open()
                        && a.started.is_none()
                        && (a.id.n < t.last_n() || a.pool_incarnation.is_some_and(|p| p < inc))
                })
            });
            if held {
                self.count("superseded_attempt_held");
                self.nodes[i].restarted = false;
            }
        }
        // Rate interval: new attempts of this node's active claim.
        let interval_us = self.qconfig.rate_interval_ms * 1000;
        if interval_us > 0 && self.nodes[i].core.is_active(queue) {
            let me = self.nodes[i].peer.clone();
            // Each new attempt with the router's own record of when it assigned it: the
            // view may show an assignment a little after it was made (a rotation's last
            // catch-up holds the router's writes for a moment).
            let mut fresh: Vec<(Claim, u64)> = vec![];
            for t in view.tasks().values() {
                for a in t.attempts.iter().filter(|a| a.id.claim.peer == me) {
                    let key = (t.id.clone(), a.id.n, a.id.claim.clone());
                    if self.assigned.insert(key) {
                        fresh.push((a.id.claim.clone(), a.assigned_at));
                    }
                }
            }
            if fresh.len() > 1 {
                self.violate(
                    6,
                    format!(
                        "node{i} assigned {} tasks at once under a rate interval",
                        fresh.len()
                    ),
                );
            }
            if let Some((claim, at_ms)) = fresh.pop() {
                let now = self.now_us;
                // Whole ms of the router's clock: a gap of at least the interval never shows
                // as less.
                let local = at_ms.saturating_sub(EPOCH_MS) * 1000;
                let key = (queue.clone(), claim);
                if let Some(last) = self.last_assign.get(&key)
                    && local.saturating_sub(*last) < interval_us
                {
                    let gap = local.saturating_sub(*last);
                    self.violate(
                        6,
                        format!(
                            "node{i} assigned {gap} µs after its last, rate interval {interval_us} µs (at {now})"
                        ),
                    );
                }
                self.last_assign.insert(key, local);
            }
        }
    }

    // ----- the clients -----

    fn join(&mut self, i: usize, q: usize) {
        if !self.nodes[i].up || self.is_member_now(i, q) {
            return;
        }
        let Some(id) = self.queues[q].clone() else {
            return;
        };
        if self.nodes[i].joins.values().any(|j| *j == q) {
            return;
        }
        let cmd = self.command_id(i);
        self.nodes[i].joins.insert(cmd, q);
        let t = self.time(i);
        self.nodes[i].core.handle_command(
            t,
            cmd,
            Command::JoinQueue {
                id,
                from_peers: true,
            },
        );
        self.drive(i);
    }

    fn submit(&mut self) {
        // A batch may have taken this event's task already.
        if self.to_submit == 0 {
            return;
        }
        let q = self.rng.random_range(0..self.members.len());
        let Some(queue) = self.queues[q].clone() else {
            return;
        };
        let candidates: Vec<usize> = self.members[q]
            .iter()
            .copied()
            .filter(|&i| self.nodes[i].up && self.nodes[i].core.view(&queue).is_some())
            .collect();
        if candidates.is_empty() {
            // Nobody can take it now: the client tries again a little later.
            self.schedule_at(self.now_us + RETRY_US, Ev::Submit);
            return;
        }
        let i = candidates[self.rng.random_range(0..candidates.len())];
        // One submit in four is a batch of up to 5 tasks (those other tasks' events find
        // nothing left to submit).
        let n = if self.to_submit >= 2 && self.rng.random_range(0..4) == 0 {
            self.rng.random_range(2..=self.to_submit.min(5))
        } else {
            1
        };
        self.to_submit -= n;
        let cmd = self.command_id(i);
        self.nodes[i].submits.insert(cmd, (queue.clone(), n));
        let mut tasks: Vec<SubmitTask> = (0..n)
            .map(|k| SubmitTask {
                kind: "sim".into(),
                // Every third task's input is too large to be inline: it gets a task document.
                input: if (self.submitted.len() + k) % 3 == 2 {
                    serde_json::json!({"n": self.submitted.len() + k, "pad": "x".repeat(300)})
                } else {
                    serde_json::json!({"n": self.submitted.len() + k})
                },
                priority: self.rng.random_range(-2..=2),
                urgent: false,
                max_attempts: None,
            })
            .collect();
        self.trace(|| format!("node{i} takes {n} task(s) for {queue}"));
        let t = self.time(i);
        let command = if n == 1 {
            Command::Submit {
                queue,
                task: tasks.pop().expect("one task"),
            }
        } else {
            Command::SubmitMany { queue, tasks }
        };
        self.nodes[i].core.handle_command(t, cmd, command);
        self.drive(i);
    }

    // ----- the network -----

    fn blocked(&self, from: usize, to: usize) -> bool {
        self.cuts.iter().any(|c| c.blocked.contains(&(from, to)))
    }

    /// Ends every silent cut now (their streams are reset right after).
    fn end_silent_cuts(&mut self) {
        let now = self.now_us;
        for c in &mut self.silent {
            c.until_us = now;
        }
        self.schedule_at(now, Ev::SilentEnds);
    }

    fn silenced(&self, from: usize, to: usize) -> bool {
        self.silent.iter().any(|c| c.blocked.contains(&(from, to)))
    }

    fn delay(&mut self) -> u64 {
        let (lo, hi) = self.config.mix.delay_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    fn send_sync(&mut self, from: usize, to: usize, frame: Vec<u8>) {
        let p = pair(from, to);
        if !self.links.contains(&p) {
            return;
        }
        let epoch = self.epochs.get(&p).copied().unwrap_or(0);
        // A stream: in order per direction.
        let at = (self.now_us + self.delay())
            .max(self.last_sync_at.get(&(from, to)).map_or(0, |t| t + 1));
        self.last_sync_at.insert((from, to), at);
        self.schedule_at(
            at,
            Ev::Sync {
                from,
                to,
                epoch,
                frame,
            },
        );
    }

    fn gossip(&mut self, from: usize, topic: String, data: Vec<u8>) {
        let extra = match self.beat_delay.get(&from) {
            Some((extra_ms, until)) if self.now_us < *until => *extra_ms * 1000,
            _ => 0,
        };
        for to in 0..self.nodes.len() {
            if to == from || !self.nodes[to].up || self.blocked(from, to) || self.silenced(from, to)
            {
                continue;
            }
            if !self.nodes[to].subscribed.contains(&topic) {
                continue;
            }
            let mix = &self.config.mix;
            let (drop, dup) = if self.faults_on {
                (mix.drop, mix.duplicate)
            } else {
                (0.0, 0.0)
            };
            if self.rng.random_bool(drop) {
                self.count("beat_dropped");
                self.disturbances.push((self.now_us, self.now_us, from, to));
                continue;
            }
            let copies = if self.rng.random_bool(dup) { 2 } else { 1 };
            if copies == 2 {
                self.count("beat_duplicated");
            }
            for _ in 0..copies {
                let at = self.now_us + self.delay() + extra;
                if self
                    .last_beat_at
                    .get(&(from, to))
                    .is_some_and(|last| at < *last)
                {
                    self.count("beat_reordered");
                }
                let last = self.last_beat_at.entry((from, to)).or_default();
                *last = (*last).max(at);
                self.schedule_at(
                    at,
                    Ev::Gossip {
                        from,
                        to,
                        topic: topic.clone(),
                        data: data.clone(),
                    },
                );
            }
        }
    }

    /// Makes the cores' sync streams match who is up and what is cut: a stream needs both
    /// directions open.
    fn relink(&mut self) {
        let n = self.nodes.len();
        let mut touched = BTreeSet::new();
        for a in 0..n {
            for b in a + 1..n {
                let want = self.nodes[a].up
                    && self.nodes[b].up
                    && !self.blocked(a, b)
                    && !self.blocked(b, a);
                let have = self.links.contains(&(a, b));
                if want == have {
                    continue;
                }
                *self.epochs.entry((a, b)).or_default() += 1;
                let (pa, pb) = (self.nodes[a].peer.clone(), self.nodes[b].peer.clone());
                let (ta, tb) = (self.time(a), self.time(b));
                if want {
                    self.links.insert((a, b));
                    self.nodes[a].core.handle_connected(ta, pb);
                    self.nodes[b].core.handle_connected(tb, pa);
                } else {
                    self.links.remove(&(a, b));
                    if self.nodes[a].up {
                        self.nodes[a].core.handle_disconnected(ta, &pb);
                    }
                    if self.nodes[b].up {
                        self.nodes[b].core.handle_disconnected(tb, &pa);
                    }
                }
                touched.insert(a);
                touched.insert(b);
            }
        }
        for i in touched {
            self.drive(i);
        }
    }

    fn reset_link(&mut self, p: (usize, usize)) {
        // Down, then up again: both cores start their sync state over.
        self.count("resync");
        self.links.remove(&p);
        *self.epochs.entry(p).or_default() += 1;
        let (a, b) = p;
        let (pa, pb) = (self.nodes[a].peer.clone(), self.nodes[b].peer.clone());
        let (ta, tb) = (self.time(a), self.time(b));
        self.nodes[a].core.handle_disconnected(ta, &pb);
        self.nodes[b].core.handle_disconnected(tb, &pa);
        self.relink();
    }

    fn cut(&mut self, blocked: BTreeSet<(usize, usize)>, for_ms: u64) {
        let until_us = self.taint(&blocked, for_ms);
        self.cuts.push(Cut { blocked, until_us });
        self.schedule_at(until_us, Ev::CutsChanged);
        self.relink();
    }

    /// Like [`World::cut`], but the streams stay up and lose what crosses them.
    fn silent_cut(&mut self, blocked: BTreeSet<(usize, usize)>, for_ms: u64) {
        let until_us = self.taint(&blocked, for_ms);
        self.silent.push(Cut { blocked, until_us });
        self.schedule_at(until_us, Ev::SilentEnds);
    }

    /// Marks the runs a cut separates from their router, records the disturbance, and
    /// returns when the cut ends.
    fn taint(&mut self, blocked: &BTreeSet<(usize, usize)>, for_ms: u64) -> u64 {
        // Runs whose router is now out of reach may be routed again; they no longer count
        // against that router's concurrency limit.
        for n in 0..self.nodes.len() {
            let ids: Vec<RunId> = self.nodes[n].live.keys().copied().collect();
            for id in ids {
                let claim_node = self.index_of(&self.nodes[n].live[&id].claim.peer);
                if let Some(r) = claim_node
                    && (blocked.contains(&(n, r)) || blocked.contains(&(r, n)))
                    && let Some(l) = self.nodes[n].live.get_mut(&id)
                {
                    l.tainted = true;
                }
            }
        }
        let until_us = self.now_us + for_ms * 1000;
        for &(a, b) in blocked {
            self.disturbances.push((self.now_us, until_us, a, b));
        }
        until_us
    }

    // ----- faults -----

    fn target(&self, t: Target) -> Option<usize> {
        match t {
            Target::Node(i) => (i < self.nodes.len()).then_some(i),
            Target::Router => {
                let q = self.queues[0].as_ref()?;
                let best = self
                    .nodes
                    .iter()
                    .filter(|n| n.up)
                    .filter_map(|n| n.core.view(q).and_then(|v| v.router.clone()))
                    .max()?;
                self.index_of(&best.peer)
            }
        }
    }

    fn background(&mut self, kind: Kind) {
        let n = self.nodes.len();
        match kind {
            Kind::Crash => {
                let i = self.rng.random_range(0..n);
                self.crash(i);
            }
            Kind::Stop => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.stop_grace_ms;
                let grace = self.rng.random_range(lo..=hi.max(lo));
                self.stop(i, grace);
            }
            Kind::Partition => {
                let mut side: Vec<bool> = (0..n).map(|_| self.rng.random_bool(0.5)).collect();
                if side.iter().all(|s| *s) || side.iter().all(|s| !*s) {
                    side[0] = !side[0];
                }
                let blocked = (0..n)
                    .flat_map(|a| (0..n).map(move |b| (a, b)))
                    .filter(|&(a, b)| side[a] != side[b])
                    .collect();
                let (lo, hi) = self.config.mix.cut_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                self.count("partition");
                self.trace(|| format!("partition {side:?} for {ms} ms"));
                self.cut(blocked, ms);
            }
            Kind::OneWay => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.cut_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let blocked = (0..n).filter(|&b| b != i).map(|b| (i, b)).collect();
                if self.rng.random_bool(0.5) {
                    // A half-open stream lasts until the transport notices it stalled: longer
                    // than a cut it sees at once.
                    let ms = ms * 2;
                    self.count("silent_cut");
                    self.trace(|| format!("node{i}'s outgoing messages silently lost for {ms} ms"));
                    self.silent_cut(blocked, ms);
                } else {
                    self.count("one_way_cut");
                    self.trace(|| format!("node{i}'s outgoing messages lost for {ms} ms"));
                    self.cut(blocked, ms);
                }
            }
            Kind::WriteFailures | Kind::ReadFailures => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.disk_window_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let until = self.now_us + ms * 1000;
                let disk = &mut self.nodes[i].disk;
                let what = if kind == Kind::WriteFailures {
                    disk.failing_writes_until = disk.failing_writes_until.max(until);
                    "write"
                } else {
                    disk.failing_reads_until = disk.failing_reads_until.max(until);
                    "read"
                };
                self.count(&format!("{what}_failure_window"));
                self.trace(|| format!("node{i}'s disk fails every {what} for {ms} ms"));
            }
        }
    }

    fn fault(&mut self, f: &Fault) {
        let n = self.nodes.len();
        let long = self.config.fault_ms + self.config.settle_limit_ms;
        match f {
            Fault::Crash(t) => {
                if let Some(i) = self.target(*t) {
                    self.crash(i);
                }
            }
            Fault::Isolate(t) => {
                if let Some(i) = self.target(*t) {
                    self.count("isolate");
                    self.trace(|| format!("node{i} isolated"));
                    let blocked = (0..n)
                        .filter(|&b| b != i)
                        .flat_map(|b| [(i, b), (b, i)])
                        .collect();
                    self.cut(blocked, long);
                }
            }
            Fault::Halves => {
                self.count("halves");
                self.trace(|| "split into halves".into());
                let h = n / 2;
                let blocked = (0..n)
                    .flat_map(|a| (0..n).map(move |b| (a, b)))
                    .filter(|&(a, b)| (a < h) != (b < h))
                    .collect();
                self.cut(blocked, long);
            }
            Fault::SilenceOut(t) => {
                if let Some(i) = self.target(*t) {
                    self.count("one_way_cut");
                    self.trace(|| format!("node{i}'s outgoing messages lost"));
                    self.cut((0..n).filter(|&b| b != i).map(|b| (i, b)).collect(), long);
                }
            }
            Fault::DelayBeats {
                target,
                extra_ms,
                for_ms,
            } => {
                if let Some(i) = self.target(*target) {
                    self.count("beats_delayed");
                    self.trace(|| {
                        format!("node{i}'s heartbeats delayed {extra_ms} ms for {for_ms} ms")
                    });
                    let until = self.now_us + for_ms * 1000;
                    for b in 0..n {
                        self.disturbances.push((self.now_us, until, i, b));
                    }
                    self.beat_delay.insert(i, (*extra_ms, until));
                }
            }
            Fault::Heal => {
                self.trace(|| "heal".into());
                self.cuts.clear();
                self.end_silent_cuts();
                self.beat_delay.clear();
                self.relink();
            }
        }
    }

    /// A planned stop: the node is asked to stop with `grace_ms` for its runs; it exits when
    /// its stop is answered ([`World::reply`]).
    fn stop(&mut self, i: usize, grace_ms: u64) {
        if !self.nodes[i].up || self.nodes[i].stopping.is_some() {
            return;
        }
        self.count("planned_stop");
        self.trace(|| format!("node{i} is asked to stop ({grace_ms} ms of grace)"));
        let cmd = self.command_id(i);
        self.nodes[i].stopping = Some(cmd);
        let t = self.time(i);
        self.nodes[i].core.handle_command(
            t,
            cmd,
            Command::Stop {
                grace: Duration::from_millis(grace_ms),
            },
        );
        self.drive(i);
    }

    fn crash(&mut self, i: usize) {
        self.down(i, false);
    }

    /// Node `i` goes down: it crashes, or (`clean`) exits once its stop was answered. Either
    /// way what it runs is abandoned, and it restarts after a downtime.
    fn down(&mut self, i: usize, clean: bool) {
        if !self.nodes[i].up {
            return;
        }
        self.nodes[i].stopping = None;
        if clean {
            self.count("stopped");
            self.trace(|| format!("node{i} exits after its stop"));
        } else {
            self.count("crash");
            self.trace(|| format!("node{i} crashes"));
        }
        self.crashes.push((i, self.now_us));
        let now = self.now_us;
        let n = &mut self.nodes[i];
        n.up = false;
        n.timer_generation += 1;
        for live in std::mem::take(&mut n.live).into_values() {
            if let Some(r) = self
                .runs
                .get_mut(&live.task)
                .and_then(|v| v.iter_mut().rev().find(|r| r.node == i && r.end.is_none()))
            {
                r.end = Some(End::Crashed);
                r.end_us = Some(now);
            }
        }
        // What the node had seen only in memory is gone with it: invariant 2 watches each
        // incarnation from what it reloads (acknowledged tasks are invariant 8's).
        self.seen_states.retain(|(n, _), _| *n != i);
        // Writes in flight: the crash keeps an arbitrary subset of them.
        let pending = std::mem::take(&mut self.nodes[i].disk.pending);
        for save in pending.into_values() {
            if self.rng.random_bool(0.5) {
                let _ = self.nodes[i].disk.apply(&save);
                self.count("unacknowledged_write_kept");
            } else {
                self.count("unacknowledged_write_lost");
            }
        }
        self.relink();
        let (lo, hi) = self.config.mix.downtime_ms;
        let ms = self.rng.random_range(lo..=hi.max(lo));
        if ms > self.qconfig.lease_ms {
            self.count("long_downtime");
        }
        let inc = self.nodes[i].incarnation;
        self.schedule_at(
            self.now_us + ms * 1000,
            Ev::Restart {
                node: i,
                incarnation: inc,
            },
        );
    }

    fn restart(&mut self, i: usize) {
        self.count("restart");
        let inc = self.nodes[i].incarnation + 1;
        self.trace(|| format!("node{i} restarts, incarnation {inc}"));
        let t = time_at(
            self.base,
            self.nodes[i].offset_us,
            self.nodes[i].drift_ppm,
            self.now_us,
        );
        let config = CoreConfig::new(
            self.nodes[i].peer.clone(),
            inc,
            self.config.workers,
            node_seed(self.seed, i, inc),
        )
        .with_rotation(self.config.rotation.0, self.config.rotation.1)
        .with_catch_ups(catch_ups(i))
        .with_epoch_retain(EPOCH_RETAIN)
        .with_disk_retention(KEEP_TASK_DOCS, self.config.keep_sealed_epochs)
        .with_relay_waits(relay_waits(&self.config))
        .with_retired(self.nodes[i].disk.retired.clone())
        .with_resume(
            self.nodes[i]
                .disk
                .epochs
                .iter()
                .map(|(q, d)| (q.clone(), d.clone()))
                .collect(),
        );
        let n = &mut self.nodes[i];
        n.incarnation = inc;
        n.up = true;
        n.core = Core::new(config, t);
        #[cfg(feature = "broken")]
        if self.config.broken_fencing {
            n.core.break_fencing();
        }
        n.submits.clear();
        n.joins.clear();
        n.subscribed.clear();
        n.restarted = true;
        n.disk.failing_reads_until = 0;
        n.disk.failing_writes_until = 0;
        // What the shell does at start: reopen every queue the disk remembers.
        let remembered: Vec<QueueId> = n.disk.queues.iter().cloned().collect();
        for id in remembered {
            let q = self.queues.iter().position(|x| x.as_ref() == Some(&id));
            let cmd = self.command_id(i);
            if let Some(q) = q {
                self.nodes[i].joins.insert(cmd, q);
            }
            let t = self.time(i);
            self.nodes[i].core.handle_command(
                t,
                cmd,
                Command::JoinQueue {
                    id,
                    from_peers: true,
                },
            );
        }
        self.relink();
        self.drive(i);
        for q in 0..self.members.len() {
            if self.members[q].contains(&i) {
                self.schedule_at(self.now_us + RETRY_US, Ev::Join { node: i, queue: q });
            }
        }
    }

    fn heal_all(&mut self) {
        self.trace(|| "faults stop: heal everything, restart every node".into());
        self.faults_on = false;
        self.cuts.clear();
        self.end_silent_cuts();
        self.beat_delay.clear();
        for n in &mut self.nodes {
            n.disk.failing_reads_until = 0;
            n.disk.failing_writes_until = 0;
        }
        for i in 0..self.nodes.len() {
            // A node still stopping would never take work again: it exits now.
            if self.nodes[i].up && self.nodes[i].stopping.is_some() {
                self.crash(i);
            }
            if !self.nodes[i].up {
                self.restart(i);
            }
        }
        self.relink();
        self.schedule_at(self.now_us, Ev::SettleCheck);
    }

    // ----- checks -----

    /// Invariants 4, 5, 6 and 7 at the moment a worker starts a run.
    fn check_start(&mut self, i: usize, queue: &QueueId, task: &TaskId, claim: &Claim) {
        if let Some(seen) = self.nodes[i].core.fence(queue).cloned()
            && *claim < seen
        {
            self.violate(
                4,
                format!("node{i} started {task} assigned by {claim}, having seen {seen}"),
            );
        }
        let earlier = self.runs.get(task).cloned().unwrap_or_default();
        if self.check_duplicates {
            let unexplained = earlier.iter().find(|r| {
                let crashed_since = self
                    .crashes
                    .iter()
                    .any(|(n, t)| *n == r.node && *t >= r.start_us);
                !matches!(r.end, Some(End::Failed) | Some(End::Crashed)) && !crashed_since
            });
            if let Some(r) = unexplained {
                let what = format!(
                    "{task} starts again on node{i} though its run on node{} ({:?}) neither failed nor lost its node",
                    r.node, r.end
                );
                self.violate(5, what);
            }
        }
        // Invariant 7: no two runs of a task overlap, unless messages between the routers and
        // the workers involved were lost or cut since the earlier run began.
        for r in earlier.iter().filter(|r| r.end_us.is_none()) {
            let involved: BTreeSet<usize> = [Some(i), Some(r.node)]
                .into_iter()
                .chain([self.index_of(&claim.peer), self.index_of(&r.claim.peer)])
                .flatten()
                .collect();
            // From the earlier attempt's assignment to this start, on any link of the routers
            // and workers involved. What a loss hid (a second router's claim, say) is learnt
            // again only once messages flow: a disturbance also explains assignments up to a
            // router heartbeat after it ended (seed 2093: a one-way cut ends, and 35 ms later
            // the router that could not hear the other assigns before the next beat arrives).
            let from = r.assigned_us;
            let grace_us = self.qconfig.heartbeat_ms * 1000;
            let explained = !self.check_duplicates
                && self.disturbances.iter().any(|&(s, e, a, b)| {
                    e + grace_us >= from
                        && s <= self.now_us
                        && (involved.contains(&a) || involved.contains(&b))
                });
            if explained {
                self.count("overlap_explained_by_loss");
            } else {
                let what = format!(
                    "{task} starts on node{i} (by {claim}) while its run on node{} (by {}) still runs",
                    r.node, r.claim
                );
                self.violate(7, what);
            }
        }
        let limit = self.qconfig.concurrency;
        if limit > 0 {
            let running = 1 + self
                .nodes
                .iter()
                .flat_map(|n| n.live.values())
                .filter(|l| l.claim == *claim && l.queue == *queue && !l.tainted)
                .count();
            if running > limit as usize {
                self.violate(
                    6,
                    format!("{running} runs under {claim}, concurrency limit {limit}"),
                );
            }
        }
    }

    /// Invariant 8: an acknowledged submit is on the submitting node's disk, task document and
    /// index entry both, so no crash can lose it.
    fn check_durable(&mut self, i: usize, queue: &QueueId, task: &TaskId) {
        let disk = &self.nodes[i].disk;
        // In whichever epoch document the node wrote it to (the current one, or one it has
        // moved past since).
        // The entry, if any: an inline task has no task document, its entry holds its input.
        let entry_inline = self.nodes[i]
            .core
            .epoch_docs(queue)
            .into_iter()
            .find_map(|d| {
                disk.read(&d, |d| {
                    piecework_queue_doc::epoch::task_entry(d, task).map(|t| t.input.is_some())
                })
                .flatten()
            });
        let indexed = entry_inline.is_some();
        let inline = entry_inline == Some(true);
        let stored =
            inline || DocId::parse(task.as_str()).is_some_and(|d| disk.read(&d, |_| ()).is_some());
        if !indexed || !stored {
            self.violate(
                8,
                format!(
                    "node{i} acknowledged {task} but its disk holds the index entry: {indexed}, the task document: {stored}"
                ),
            );
        }
    }

    /// Whether a document this node stores says it belongs to a queue the node joined: an
    /// epoch document of it, or a task document of it (a finished task that the current epoch
    /// no longer carries).
    fn of_joined_queue(&self, i: usize, doc: &DocId) -> bool {
        let n = &self.nodes[i];
        let origin = |d: &automerge::Automerge| match piecework_queue_doc::epoch::read_epoch(d) {
            Some((_, Some(origin))) => Some(origin),
            _ => piecework_queue_doc::task::read(d).ok().map(|t| t.queue),
        };
        let queue = match n.core.document(doc).filter(|d| !d.get_heads().is_empty()) {
            Some(d) => origin(d),
            None => n.disk.read(doc, origin).flatten(),
        };
        queue.is_some_and(|q| n.core.view(&q).is_some())
    }

    /// Invariant 9: a node stores only documents of queues it joined.
    fn check_scope(&mut self, i: usize, doc: &DocId) {
        let core = &self.nodes[i].core;
        let ok = core.queues().any(|q| {
            q.as_str() == doc.as_str()
                || core.epoch_docs(q).contains(doc)
                || core
                    .view(q)
                    .is_some_and(|v| v.tasks().contains_key(&TaskId::new(doc.as_str())))
        }) || self.of_joined_queue(i, doc);
        if !ok {
            self.violate(
                9,
                format!("node{i} stores {doc}, which belongs to no queue it joined"),
            );
        }
    }

    fn everyone_agrees(&self, q: usize) -> Option<Claim> {
        let id = self.queues[q].as_ref()?;
        let first = self.nodes[self.members[q][0]]
            .core
            .view(id)?
            .router
            .clone()?;
        self.members[q]
            .iter()
            .all(|&i| {
                self.nodes[i]
                    .core
                    .view(id)
                    .is_some_and(|v| v.router.as_ref() == Some(&first))
            })
            .then_some(first)
    }

    fn is_settled(&self) -> bool {
        if self.to_submit > 0
            || self.nodes.iter().any(|n| !n.up || !n.submits.is_empty())
            || self.queues.iter().any(Option::is_none)
        {
            return false;
        }
        for q in 0..self.members.len() {
            let Some(router) = self.everyone_agrees(q) else {
                return false;
            };
            let id = self.queues[q].as_ref().expect("created");
            let active: Vec<&PeerId> = self
                .nodes
                .iter()
                .filter(|n| n.core.is_active(id))
                .map(|n| &n.peer)
                .collect();
            if active != vec![&router.peer] {
                return false;
            }
        }
        self.lost() == 0
    }

    /// Invariants 1, 3 and 9, once healed and settled.
    fn final_checks(&mut self) {
        self.trace(|| "settled".into());
        // Settling proves 1 and 3; re-check explicitly so a wrong `is_settled` cannot hide one.
        let lost = self.lost();
        if lost > 0 {
            self.violate(1, format!("{lost} tasks without an outcome after settling"));
        }
        for q in 0..self.members.len() {
            let Some(id) = self.queues[q].clone() else {
                continue;
            };
            for n in &self.nodes {
                if n.core.is_active(&id)
                    && n.core
                        .view(&id)
                        .and_then(|v| v.router.as_ref())
                        .map(|c| &c.peer)
                        != Some(&n.peer)
                {
                    let what =
                        format!("{} is active for {id} but not its effective router", n.peer);
                    self.violations.push(Violation {
                        invariant: 3,
                        at_ms: self.now_us / 1000,
                        what,
                    });
                    break;
                }
            }
        }
        // The node outside queue 1 never stored any of its documents. A task document that no
        // index names is allowed only if this node wrote it for a queue it joined: a submit
        // whose index entry was lost with the node before it was acknowledged.
        let mut strays = vec![];
        for (i, n) in self.nodes.iter().enumerate() {
            for doc in n.disk.docs.keys() {
                // The document is read (loaded) only if the cheaper checks do not place it.
                let ours = || {
                    n.disk
                        .read(doc, |d| piecework_queue_doc::task::read(d).ok())
                        .flatten()
                        .is_some_and(|t| t.submitter == n.peer && n.core.view(&t.queue).is_some())
                };
                let ok = self.of_joined_queue(i, doc)
                    || n.core.queues().any(|q| {
                        q.as_str() == doc.as_str()
                            || n.core
                                .view(q)
                                .is_some_and(|v| v.tasks().contains_key(&TaskId::new(doc.as_str())))
                    })
                    || ours();
                if !ok {
                    strays.push(format!("node{i} holds {doc} on disk"));
                }
            }
        }
        for s in strays {
            self.violate(9, s);
        }
    }

    /// Acknowledged tasks that have no outcome on some member. A task counts as done on a
    /// member if its view shows it final, or if the member is on the queue's newest epoch,
    /// whose document no longer carries the task, and some node saw it final (a rotation
    /// leaves only final tasks behind).
    fn lost(&self) -> usize {
        // Per queue: its members and the newest epoch any of them is on.
        let mut per_queue: BTreeMap<&QueueId, (Vec<usize>, Option<Epoch>)> = BTreeMap::new();
        for queue in self.submitted.values() {
            if per_queue.contains_key(queue) {
                continue;
            }
            let q = self.queues.iter().position(|x| x.as_ref() == Some(queue));
            let members = q.map(|q| self.members[q].clone()).unwrap_or_default();
            let lineage = |i: usize| {
                let core = &self.nodes[i].core;
                core.epoch(queue)
                    .and_then(|(_, d)| core.document(d))
                    .map(piecework_queue_doc::epoch::read_lineage)
                    .unwrap_or_default()
            };
            let newest = members
                .iter()
                .max_by(|&&a, &&b| {
                    piecework_queue_doc::epoch::cmp_lineage(&lineage(a), &lineage(b))
                })
                .and_then(|&i| self.nodes[i].core.epoch(queue))
                .map(|(e, d)| (e, d.clone()));
            per_queue.insert(queue, (members, newest));
        }
        self.submitted
            .iter()
            .filter(|(id, queue)| {
                let (members, newest) = &per_queue[queue];
                let seen_final = || self.ever_final.contains(*id);
                !members.iter().all(|&i| {
                    let core = &self.nodes[i].core;
                    match core.view(queue).map(|v| v.task(id)) {
                        Some(Some(t)) => t.state().is_final(),
                        Some(None) => {
                            core.epoch(queue).map(|(e, d)| (e, d.clone())) == *newest
                                && seen_final()
                        }
                        None => false,
                    }
                })
            })
            .count()
    }

    fn unsettled(&mut self) {
        // Where each node stands, for the trace.
        for q in self.queues.clone().into_iter().flatten() {
            let lines: Vec<String> = self
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    format!(
                        "unsettled {q} node{i}: epoch {:?} role {:?} router {:?}",
                        n.core.epoch(&q),
                        n.core.role(&q),
                        n.core.view(&q).and_then(|v| v.router.clone())
                    )
                })
                .collect();
            for line in lines {
                self.trace(|| line);
            }
        }
        let mut routers = vec![];
        for q in 0..self.members.len() {
            let Some(id) = self.queues[q].clone() else {
                continue;
            };
            for n in &self.nodes {
                routers.push(format!(
                    "{} on {q}: {:?} ({:?})",
                    n.peer,
                    n.core.view(&id).and_then(|v| v.router.clone()),
                    n.core.role(&id)
                ));
            }
            let active = self.nodes.iter().filter(|n| n.core.is_active(&id)).count();
            if self.everyone_agrees(q).is_none() || active != 1 {
                self.violate(
                    3,
                    format!("no single agreed active router of queue {q} after the settle limit"),
                );
            }
        }
        if self.violations.is_empty() {
            self.violate(1, format!("the cluster did not settle: {routers:?}"));
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
            tasks: self.submitted.len(),
            lost,
            duplicated_tasks,
            rerun_tasks,
            max_runs,
            activations: self.activations,
            claims_lost: self.claims_lost,
            faults: self.faults,
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

/// An epoch of a queue: its number and its document.
type Epoch = (u64, DocId);
