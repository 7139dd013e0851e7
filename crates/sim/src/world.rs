//! The simulated world: nodes, the network between them, the event queue, and the checks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::{ActorId, Automerge};
use piecework_queue_doc::replica::{DocId, Event as ReplicaEvent, Message, Replica};
use piecework_queue_doc::{
    Claim, PeerId, PoolBeat, QueueConfig, QueueId, QueueView, RouterBeat, Submission, TaskId,
    TaskState, ViewCache, queue,
};
use piecework_router::{Action as RouterAction, Event as RouterEvent, Role, Router};
use piecework_worker_pool::{Action as PoolAction, Pool, RunEnd};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{Config, Report, Target, Violation};

/// Wall-clock time of virtual zero (unix ms), for the timestamps written into documents.
const EPOCH_MS: u64 = 1_790_000_000_000;
/// Steps after which a run counts as a livelock.
const MAX_STEPS: u64 = 20_000_000;
/// Stored chunks of the queue document after which a node compacts them into one.
const COMPACT_AFTER: usize = 64;
/// How often the settle phase checks whether the cluster has settled, virtual ms.
const SETTLE_CHECK_MS: u64 = 250;

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
    /// Whether this fault loses or delays messages beyond the normal range (invariant 5 is not
    /// expected to hold in runs that have one).
    pub fn disturbs_messages(&self) -> bool {
        !matches!(self, Fault::Crash(_) | Fault::Heal)
    }
}

#[derive(Clone, Debug)]
enum Beat {
    Router(RouterBeat),
    Pool(PoolBeat),
}

#[derive(Debug)]
enum Ev {
    Sync {
        from: usize,
        to: usize,
        epoch: u64,
        msg: Message,
    },
    Beat {
        from: usize,
        to: usize,
        beat: Beat,
    },
    Timer {
        node: usize,
        generation: u64,
    },
    RunEnd {
        node: usize,
        incarnation: u64,
        index: u32,
        ok: bool,
    },
    Submit,
    Fault(Fault),
    Restart {
        node: usize,
        incarnation: u64,
    },
    Background(Kind),
    CutsChanged,
    HealAll,
    SettleCheck,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Crash,
    Partition,
    OneWay,
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
    start_us: u64,
    end: Option<End>,
}

#[derive(Clone, Debug)]
struct Live {
    task: TaskId,
    claim: Claim,
    /// A cut separated the run's node from its router's node while it ran.
    tainted: bool,
}

struct Node {
    peer: PeerId,
    up: bool,
    incarnation: u64,
    drift_ppm: i64,
    offset_us: u64,
    replica: Replica,
    router: Router,
    pool: Pool,
    cache: ViewCache,
    view: Arc<QueueView>,
    /// Durable chunks of the queue document: all a crash leaves.
    store: Vec<Vec<u8>>,
    timer_generation: u64,
    /// The greatest router claim this node has seen, in its view or in heartbeats.
    seen: Option<Claim>,
    /// Runs in flight, by worker index.
    live: BTreeMap<u32, Live>,
    /// The queue document could not be fetched: ask again on the next connection.
    refetch: bool,
    /// Local instant of each claim's last assignment, for the rate-interval check.
    last_assign: BTreeMap<Claim, Instant>,
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
    doc: DocId,
    queue: QueueId,
    cuts: Vec<Cut>,
    beat_delay: BTreeMap<usize, (u64, u64)>,
    /// Connected pairs (a < b) and their connection epochs.
    links: BTreeSet<(usize, usize)>,
    epochs: BTreeMap<(usize, usize), u64>,
    last_sync_at: BTreeMap<(usize, usize), u64>,
    last_beat_at: BTreeMap<(usize, usize), u64>,
    faults_on: bool,
    faults: BTreeMap<String, u64>,
    submitted: BTreeSet<TaskId>,
    to_submit: usize,
    seen_states: BTreeMap<(usize, TaskId), TaskState>,
    runs: BTreeMap<TaskId, Vec<RunRec>>,
    crashes: Vec<(usize, u64)>,
    activations: usize,
    claims_lost: usize,
    violations: Vec<Violation>,
    check_duplicates: bool,
    steps: u64,
    hasher: Sha256,
    tail: VecDeque<String>,
    settled: bool,
}

fn actor(node: usize, incarnation: u64) -> ActorId {
    let h = Sha256::digest(format!(
        "piecework-sim node {node} incarnation {incarnation}"
    ));
    ActorId::from(&h[..16])
}

fn pair(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
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
        let doc = DocId::generate(&mut rng);
        let queue = QueueId::new(doc.as_str());
        let mut nodes = Vec::with_capacity(config.nodes);
        for i in 0..config.nodes {
            let drift_ppm = if mix.drift_ppm > 0 {
                rng.random_range(-mix.drift_ppm..=mix.drift_ppm)
            } else {
                0
            };
            let offset_us = rng.random_range(0..10_000_000);
            let peer = PeerId::new(format!("node{i}"));
            let local = base + Duration::from_micros(offset_us);
            nodes.push(Node {
                router: Router::new(queue.clone(), peer.clone(), local),
                pool: Pool::new(pool_config(&peer, config.workers, 1, &qconfig), local),
                peer,
                up: true,
                incarnation: 1,
                drift_ppm,
                offset_us,
                replica: Replica::new(),
                cache: ViewCache::new(),
                view: Arc::new(QueueView::default()),
                store: vec![],
                timer_generation: 0,
                seen: None,
                live: BTreeMap::new(),
                refetch: false,
                last_assign: BTreeMap::new(),
            });
        }
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
            doc,
            queue,
            cuts: vec![],
            beat_delay: BTreeMap::new(),
            links: BTreeSet::new(),
            epochs: BTreeMap::new(),
            last_sync_at: BTreeMap::new(),
            last_beat_at: BTreeMap::new(),
            faults_on: true,
            faults: BTreeMap::new(),
            submitted: BTreeSet::new(),
            to_submit: config.tasks,
            seen_states: BTreeMap::new(),
            runs: BTreeMap::new(),
            crashes: vec![],
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
                n.pool.break_fencing();
            }
        }
        w.setup();
        w
    }

    fn setup(&mut self) {
        for i in 0..self.nodes.len() {
            self.nodes[i].replica.set_actor(actor(i, 1));
        }
        // Node 0 creates the queue; the others fetch it once connected.
        let wall = self.wall_ms(0);
        let mut doc = Automerge::new();
        doc.set_actor(actor(0, 1));
        queue::create(&mut doc, "sim", &self.qconfig, &self.nodes[0].peer, wall)
            .expect("a fresh queue document");
        self.nodes[0].replica.create(self.doc.clone(), doc, true);
        self.relink();
        for i in 1..self.nodes.len() {
            let d = self.doc.clone();
            self.nodes[i].replica.fetch(&d, true);
        }
        for i in 0..self.nodes.len() {
            self.drive(i);
        }
        let fault_ms = self.config.fault_ms;
        for _ in 0..self.config.tasks {
            let at = self.rng.random_range(0..=fault_ms * 8 / 10) * 1000;
            self.schedule_at(at, Ev::Submit);
        }
        for (at_ms, f) in self.config.schedule.clone() {
            self.schedule_at(at_ms * 1000, Ev::Fault(f));
        }
        for kind in [Kind::Crash, Kind::Partition, Kind::OneWay] {
            self.schedule_background(kind);
        }
        self.schedule_at(fault_ms * 1000, Ev::HealAll);
    }

    // ----- time -----

    fn local_us(&self, node: usize) -> u64 {
        let n = &self.nodes[node];
        let scaled = i128::from(self.now_us) * (1_000_000 + i128::from(n.drift_ppm)) / 1_000_000;
        n.offset_us + scaled as u64
    }

    fn local(&self, node: usize) -> Instant {
        self.base + Duration::from_micros(self.local_us(node))
    }

    fn wall_ms(&self, node: usize) -> u64 {
        EPOCH_MS + self.local_us(node) / 1000
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
            self.step(ev);
            if self.settled || !self.violations.is_empty() && self.violations.len() > 20 {
                break;
            }
            if self.now_us > (self.config.fault_ms + self.config.settle_limit_ms) * 1000 {
                self.unsettled();
                break;
            }
        }
        self.report()
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Sync {
                from,
                to,
                epoch,
                msg,
            } => {
                let p = pair(from, to);
                if !self.nodes[to].up
                    || !self.links.contains(&p)
                    || self.epochs.get(&p) != Some(&epoch)
                {
                    return;
                }
                if self.faults_on && self.rng.random_bool(self.config.mix.reset) {
                    self.count("sync_reset");
                    self.trace(|| format!("sync connection {from}-{to} reset"));
                    self.reset_link(p);
                    return;
                }
                let peer = self.nodes[from].peer.clone();
                self.nodes[to].replica.handle_message(&peer, msg);
                self.drive(to);
            }
            Ev::Beat { from, to, beat } => {
                if !self.nodes[to].up || self.blocked(from, to) {
                    return;
                }
                let now = self.local(to);
                let n = &mut self.nodes[to];
                match &beat {
                    Beat::Router(b) => {
                        n.router.handle_router_beat(now, b);
                        n.pool.handle_router_beat(b);
                        if n.seen.as_ref().is_none_or(|s| b.claim > *s) {
                            n.seen = Some(b.claim.clone());
                        }
                    }
                    Beat::Pool(b) => n.router.handle_pool_beat(now, b),
                }
                self.drive(to);
            }
            Ev::Timer { node, generation } => {
                if !self.nodes[node].up || self.nodes[node].timer_generation != generation {
                    return;
                }
                let now = self.local(node);
                let n = &mut self.nodes[node];
                n.router.handle_timeout(now);
                n.pool.handle_timeout(now);
                self.drive(node);
            }
            Ev::RunEnd {
                node,
                incarnation,
                index,
                ok,
            } => {
                if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
                    return;
                }
                let Some(live) = self.nodes[node].live.remove(&index) else {
                    return;
                };
                let end = if ok {
                    RunEnd::Succeeded
                } else {
                    RunEnd::Failed("simulated failure".into())
                };
                if let Some(r) = self.runs.get_mut(&live.task).and_then(|v| {
                    v.iter_mut()
                        .rev()
                        .find(|r| r.node == node && r.end.is_none())
                }) {
                    r.end = Some(if ok { End::Succeeded } else { End::Failed });
                }
                if !ok {
                    self.count("handler_failure");
                }
                self.trace(|| format!("node{node} run of {} ended ok={ok}", live.task));
                self.nodes[node].pool.handle_finished(index, end);
                self.drive(node);
            }
            Ev::Submit => self.submit(),
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

    /// Runs node `i`'s state machines until they have nothing more to do, then saves, sends,
    /// and sets its timer: what the node's actor does after every input.
    fn drive(&mut self, i: usize) {
        let mut rounds = 0;
        loop {
            rounds += 1;
            let mut busy = false;
            let mut dirty = false;
            while let Some(ev) = self.nodes[i].replica.poll_event() {
                busy = true;
                match ev {
                    ReplicaEvent::Load(id) => {
                        let doc = self.load(i);
                        self.nodes[i].replica.handle_loaded(&id, doc);
                    }
                    ReplicaEvent::Changed(_) => dirty = true,
                    ReplicaEvent::Arrived(id) => {
                        self.nodes[i].replica.set_shared(&id, true);
                        self.nodes[i].refetch = false;
                        dirty = true;
                    }
                    ReplicaEvent::Unavailable(_) => self.nodes[i].refetch = true,
                    ReplicaEvent::Rejected { peer, reason } => {
                        self.violate(
                            2,
                            format!("node{i} rejected a message from {peer}: {reason}"),
                        );
                    }
                }
            }
            if dirty {
                self.refresh(i);
            }
            let now = self.local(i);
            while let Some(a) = self.nodes[i].router.poll_action() {
                busy = true;
                self.router_action(i, now, a);
            }
            while let Some(e) = self.nodes[i].router.poll_event() {
                if let RouterEvent::BecameActive(c) = &e {
                    self.activations += 1;
                    self.trace(|| format!("node{i} active as {c}"));
                } else if let RouterEvent::ClaimLost { .. } = &e {
                    self.claims_lost += 1;
                    self.trace(|| format!("node{i} router: {e:?}"));
                } else {
                    self.trace(|| format!("node{i} router: {e:?}"));
                }
            }
            while let Some(a) = self.nodes[i].pool.poll_action() {
                busy = true;
                self.pool_action(i, now, a);
            }
            if !busy || rounds > 1000 {
                break;
            }
        }
        self.save(i);
        while let Some((to, msg)) = self.nodes[i].replica.poll_transmit() {
            let Some(j) = self.index_of(&to) else {
                continue;
            };
            self.send_sync(i, j, msg);
        }
        let n = &mut self.nodes[i];
        let next = [n.router.poll_timeout(), Some(n.pool.poll_timeout())]
            .into_iter()
            .flatten()
            .min();
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

    fn refresh(&mut self, i: usize) {
        let now = self.local(i);
        let n = &mut self.nodes[i];
        let Some(doc) = n.replica.get(&self.doc) else {
            return;
        };
        let Some(view) = n.cache.refresh(doc).cloned() else {
            return;
        };
        if Arc::ptr_eq(&view, &n.view) {
            return;
        }
        n.view = view.clone();
        if let Some(r) = &view.router
            && n.seen.as_ref().is_none_or(|s| r > s)
        {
            n.seen = Some(r.clone());
        }
        n.router.handle_view(now, view.clone());
        n.pool.handle_view(&self.queue, &view);
        // Invariant 2: no outcome regresses, and no task leaves the index, on any replica.
        let mut bad = vec![];
        for (id, t) in &view.tasks {
            let s = t.state();
            let key = (i, id.clone());
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
            if s.is_final() || !self.seen_states.contains_key(&key) {
                self.seen_states.insert(key, s);
            }
        }
        let known = self
            .seen_states
            .range((i, TaskId::new(""))..)
            .take_while(|((n, _), _)| *n == i)
            .count();
        if known > view.tasks.len() {
            bad.push(format!(
                "node{i}: {} tasks it knew left its index",
                known - view.tasks.len()
            ));
        }
        for b in bad {
            self.violate(2, b);
        }
    }

    fn write(
        &mut self,
        i: usize,
        what: &str,
        f: impl FnOnce(&mut Automerge) -> Result<(), String>,
    ) {
        let d = self.doc.clone();
        match self.nodes[i].replica.change(&d, f) {
            Some(Ok(())) => self.refresh(i),
            Some(Err(e)) => self.trace(|| format!("node{i} could not write {what}: {e}")),
            None => self.trace(|| format!("node{i} could not write {what}: no queue document")),
        }
    }

    fn router_action(&mut self, i: usize, now: Instant, a: RouterAction) {
        let wall = self.wall_ms(i);
        match a {
            RouterAction::Claim(c) => {
                self.trace(|| format!("node{i} claims {c}"));
                self.write(i, "a claim", |d| {
                    queue::claim_router(d, &c, wall).map_err(|e| e.to_string())
                });
            }
            RouterAction::Assign(list) => {
                self.check_rate(i, now, &list);
                for a in &list {
                    self.trace(|| {
                        format!("node{i} assigns {} {} to {}", a.task, a.attempt, a.worker)
                    });
                }
                self.write(i, "assignments", |d| {
                    queue::record_assignments(d, &list, wall).map_err(|e| e.to_string())
                });
            }
            RouterAction::Beat(b) => {
                let n = &mut self.nodes[i];
                n.pool.handle_router_beat(&b);
                if n.seen.as_ref().is_none_or(|s| b.claim > *s) {
                    n.seen = Some(b.claim.clone());
                }
                self.gossip(i, Beat::Router(b));
            }
        }
    }

    fn pool_action(&mut self, i: usize, now: Instant, a: PoolAction) {
        let wall = self.wall_ms(i);
        match a {
            PoolAction::Start(run) => {
                self.check_start(i, &run.task, &run.attempt.claim);
                let inc = self.nodes[i].incarnation;
                let d = self.doc.clone();
                let r = self.nodes[i].replica.change(&d, |d| {
                    queue::record_start(d, &run.task, &run.attempt, &run.worker, inc, wall)
                });
                if !matches!(r, Some(Ok(()))) {
                    self.nodes[i]
                        .pool
                        .handle_start_failed(run.worker.index, "cannot record the start".into());
                    return;
                }
                self.refresh(i);
                self.trace(|| {
                    format!(
                        "node{i} starts {} {} on {}",
                        run.task, run.attempt, run.worker
                    )
                });
                let (lo, hi) = self.config.mix.run_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let ok = !self.rng.random_bool(self.config.mix.handler_failure);
                self.nodes[i].live.insert(
                    run.worker.index,
                    Live {
                        task: run.task.clone(),
                        claim: run.attempt.claim.clone(),
                        tainted: false,
                    },
                );
                self.runs.entry(run.task.clone()).or_default().push(RunRec {
                    node: i,
                    start_us: self.now_us,
                    end: None,
                });
                let at = self.now_us + ms * 1000;
                self.schedule_at(
                    at,
                    Ev::RunEnd {
                        node: i,
                        incarnation: inc,
                        index: run.worker.index,
                        ok,
                    },
                );
            }
            PoolAction::Finish {
                worker,
                task,
                attempt,
                outcome,
                error,
                ..
            } => {
                self.trace(|| format!("node{i} finishes {task} {attempt}: {outcome:?}"));
                let err = error.clone();
                self.write(i, "an attempt's end", |d| {
                    queue::record_finish(d, &task, &attempt, &worker, outcome, err.as_deref(), wall)
                        .map_err(|e| e.to_string())
                });
            }
            PoolAction::Beat(b) => {
                self.nodes[i].router.handle_pool_beat(now, &b);
                self.gossip(i, Beat::Pool(b));
            }
        }
    }

    fn load(&self, i: usize) -> Option<Automerge> {
        let store = &self.nodes[i].store;
        if store.is_empty() {
            return None;
        }
        let mut d = Automerge::new();
        for c in store {
            d.load_incremental(c)
                .expect("the simulator's own chunks load");
        }
        Some(d)
    }

    fn save(&mut self, i: usize) {
        let d = self.doc.clone();
        let n = &mut self.nodes[i];
        let changes = n.replica.take_unsaved(&d);
        if changes.is_empty() {
            return;
        }
        n.store.extend(changes.into_iter().map(|(_, b)| b));
        if n.store.len() > COMPACT_AFTER
            && let Some(doc) = n.replica.get(&d)
        {
            n.store = vec![doc.save()];
        }
    }

    // ----- the network -----

    fn blocked(&self, from: usize, to: usize) -> bool {
        self.cuts.iter().any(|c| c.blocked.contains(&(from, to)))
    }

    fn delay(&mut self) -> u64 {
        let (lo, hi) = self.config.mix.delay_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    fn send_sync(&mut self, from: usize, to: usize, msg: Message) {
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
                msg,
            },
        );
    }

    fn gossip(&mut self, from: usize, beat: Beat) {
        let extra = match self.beat_delay.get(&from) {
            Some((extra_ms, until)) if self.now_us < *until => *extra_ms * 1000,
            _ => 0,
        };
        for to in 0..self.nodes.len() {
            if to == from || !self.nodes[to].up || self.blocked(from, to) {
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
                    Ev::Beat {
                        from,
                        to,
                        beat: beat.clone(),
                    },
                );
            }
        }
    }

    /// Makes the replicas' connections match who is up and what is cut: a sync connection
    /// needs both directions open.
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
                if want {
                    self.links.insert((a, b));
                    self.nodes[a].replica.handle_connected(pb);
                    self.nodes[b].replica.handle_connected(pa);
                } else {
                    self.links.remove(&(a, b));
                    if self.nodes[a].up {
                        self.nodes[a].replica.handle_disconnected(&pb);
                    }
                    if self.nodes[b].up {
                        self.nodes[b].replica.handle_disconnected(&pa);
                    }
                }
                touched.insert(a);
                touched.insert(b);
            }
        }
        for i in touched {
            if self.nodes[i].up {
                if self.nodes[i].refetch {
                    let d = self.doc.clone();
                    self.nodes[i].refetch = false;
                    self.nodes[i].replica.fetch(&d, true);
                }
                self.drive(i);
            }
        }
    }

    fn reset_link(&mut self, p: (usize, usize)) {
        // Down, then up again: both replicas start their sync state over.
        self.links.remove(&p);
        *self.epochs.entry(p).or_default() += 1;
        let (a, b) = p;
        let (pa, pb) = (self.nodes[a].peer.clone(), self.nodes[b].peer.clone());
        self.nodes[a].replica.handle_disconnected(&pb);
        self.nodes[b].replica.handle_disconnected(&pa);
        self.relink();
    }

    fn cut(&mut self, blocked: BTreeSet<(usize, usize)>, for_ms: u64) {
        // Runs whose router is now out of reach may be routed again; they no longer count
        // against that router's concurrency limit.
        for n in 0..self.nodes.len() {
            let idx: Vec<u32> = self.nodes[n].live.keys().copied().collect();
            for w in idx {
                let claim_node = self.index_of(&self.nodes[n].live[&w].claim.peer);
                if let Some(r) = claim_node
                    && (blocked.contains(&(n, r)) || blocked.contains(&(r, n)))
                    && let Some(l) = self.nodes[n].live.get_mut(&w)
                {
                    l.tainted = true;
                }
            }
        }
        let until_us = self.now_us + for_ms * 1000;
        self.cuts.push(Cut { blocked, until_us });
        self.schedule_at(until_us, Ev::CutsChanged);
        self.relink();
    }

    // ----- faults -----

    fn target(&self, t: Target) -> Option<usize> {
        match t {
            Target::Node(i) => (i < self.nodes.len()).then_some(i),
            Target::Router => {
                let best = self
                    .nodes
                    .iter()
                    .filter(|n| n.up)
                    .filter_map(|n| n.view.router.clone())
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
                self.count("one_way_cut");
                self.trace(|| format!("node{i}'s outgoing messages lost for {ms} ms"));
                self.cut((0..n).filter(|&b| b != i).map(|b| (i, b)).collect(), ms);
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
                    self.beat_delay
                        .insert(i, (*extra_ms, self.now_us + for_ms * 1000));
                }
            }
            Fault::Heal => {
                self.trace(|| "heal".into());
                self.cuts.clear();
                self.beat_delay.clear();
                self.relink();
            }
        }
    }

    fn crash(&mut self, i: usize) {
        if !self.nodes[i].up {
            return;
        }
        self.count("crash");
        self.trace(|| format!("node{i} crashes"));
        self.crashes.push((i, self.now_us));
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
            }
        }
        self.relink();
        let (lo, hi) = self.config.mix.downtime_ms;
        let ms = self.rng.random_range(lo..=hi.max(lo));
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
        let now = self.local(i);
        let inc = self.nodes[i].incarnation + 1;
        self.trace(|| format!("node{i} restarts, incarnation {inc}"));
        let pool = pool_config(&self.nodes[i].peer, self.config.workers, inc, &self.qconfig);
        let n = &mut self.nodes[i];
        n.incarnation = inc;
        n.up = true;
        n.replica = Replica::new();
        n.replica.set_actor(actor(i, inc));
        n.router = Router::new(self.queue.clone(), n.peer.clone(), now);
        n.pool = Pool::new(pool, now);
        #[cfg(feature = "broken")]
        if self.config.broken_fencing {
            n.pool.break_fencing();
        }
        n.cache = ViewCache::new();
        n.view = Arc::new(QueueView::default());
        n.seen = None;
        n.last_assign.clear();
        let d = self.doc.clone();
        self.nodes[i].replica.fetch(&d, true);
        self.relink();
        self.drive(i);
    }

    fn heal_all(&mut self) {
        self.trace(|| "faults stop: heal everything, restart every node".into());
        self.faults_on = false;
        self.cuts.clear();
        self.beat_delay.clear();
        for i in 0..self.nodes.len() {
            if !self.nodes[i].up {
                self.restart(i);
            }
        }
        self.relink();
        self.schedule_at(self.now_us, Ev::SettleCheck);
    }

    fn submit(&mut self) {
        let n = self.nodes.len();
        let first = self.rng.random_range(0..n);
        let Some(i) = (0..n)
            .map(|k| (first + k) % n)
            .find(|&i| self.nodes[i].up && !self.nodes[i].view.name.is_empty())
        else {
            // Nobody can take it now: the client tries again a little later.
            self.schedule_at(self.now_us + 500_000, Ev::Submit);
            return;
        };
        let id = TaskId::new(DocId::generate(&mut self.rng).as_str());
        let s = Submission {
            id: id.clone(),
            kind: "sim".into(),
            submitter: self.nodes[i].peer.clone(),
            submitted_at: self.wall_ms(i),
            priority: self.rng.random_range(-2..=2),
            urgent: false,
            max_attempts: None,
        };
        self.to_submit = self.to_submit.saturating_sub(1);
        self.write(i, "a submission", |d| {
            queue::submit(d, &s).map_err(|e| e.to_string())
        });
        self.submitted.insert(id.clone());
        self.trace(|| format!("node{i} takes task {id}"));
        // Durable once saved, which drive() does before anything else can happen.
        self.drive(i);
    }

    // ----- checks -----

    /// Invariants 4, 5 and 6 at the moment a worker starts a run.
    fn check_start(&mut self, i: usize, task: &TaskId, claim: &Claim) {
        if let Some(seen) = self.nodes[i].seen.clone()
            && *claim < seen
        {
            self.violate(
                4,
                format!("node{i} started {task} assigned by {claim}, having seen {seen}"),
            );
        }
        if self.check_duplicates
            && let Some(earlier) = self.runs.get(task)
        {
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
        let limit = self.qconfig.concurrency;
        if limit > 0 {
            let running = 1 + self
                .nodes
                .iter()
                .flat_map(|n| n.live.values())
                .filter(|l| l.claim == *claim && !l.tainted)
                .count();
            if running > limit as usize {
                self.violate(
                    6,
                    format!("{running} runs under {claim}, concurrency limit {limit}"),
                );
            }
        }
    }

    /// Invariant 6, rate half: one assignment per interval per router.
    fn check_rate(&mut self, i: usize, now: Instant, list: &[piecework_queue_doc::Assignment]) {
        let interval = Duration::from_millis(self.qconfig.rate_interval_ms);
        if interval.is_zero() || list.is_empty() {
            return;
        }
        if list.len() > 1 {
            self.violate(
                6,
                format!(
                    "node{i} assigned {} tasks at once under a rate interval",
                    list.len()
                ),
            );
        }
        let claim = list[0].attempt.claim.clone();
        if let Some(last) = self.nodes[i].last_assign.get(&claim)
            && now.duration_since(*last) < interval
        {
            let gap = now.duration_since(*last);
            self.violate(
                6,
                format!("node{i} assigned {gap:?} after its last, rate interval {interval:?}"),
            );
        }
        self.nodes[i].last_assign.insert(claim, now);
    }

    fn effective_everywhere(&self) -> Option<Claim> {
        let first = self.nodes[0].view.router.clone()?;
        self.nodes
            .iter()
            .all(|n| n.view.router.as_ref() == Some(&first))
            .then_some(first)
    }

    fn is_settled(&self) -> bool {
        if self.to_submit > 0 || self.nodes.iter().any(|n| !n.up) {
            return false;
        }
        let Some(router) = self.effective_everywhere() else {
            return false;
        };
        let all_done = self.nodes.iter().all(|n| {
            self.submitted
                .iter()
                .all(|id| n.view.tasks.get(id).is_some_and(|t| t.state().is_final()))
        });
        let active: Vec<&PeerId> = self
            .nodes
            .iter()
            .filter(|n| n.router.is_active())
            .map(|n| &n.peer)
            .collect();
        all_done && active == vec![&router.peer]
    }

    /// Invariants 1 and 3, once healed and settled.
    fn final_checks(&mut self) {
        self.trace(|| "settled".into());
        // Settling proves both; re-check explicitly so a wrong `is_settled` cannot hide a loss.
        let lost = self.lost();
        if lost > 0 {
            self.violate(1, format!("{lost} tasks without an outcome after settling"));
        }
        for n in &self.nodes {
            if matches!(n.router.role(), Role::Active { .. })
                && n.view.router.as_ref().map(|c| &c.peer) != Some(&n.peer)
            {
                let what = format!(
                    "{} is active but the effective router is {:?}",
                    n.peer, n.view.router
                );
                self.violations.push(Violation {
                    invariant: 3,
                    at_ms: self.now_us / 1000,
                    what,
                });
                break;
            }
        }
    }

    fn lost(&self) -> usize {
        self.submitted
            .iter()
            .filter(|id| {
                !self
                    .nodes
                    .iter()
                    .all(|n| n.view.tasks.get(*id).is_some_and(|t| t.state().is_final()))
            })
            .count()
    }

    fn unsettled(&mut self) {
        let lost = self.lost();
        if lost > 0 {
            self.violate(
                1,
                format!(
                    "{lost} submitted tasks have no outcome on every replica after the settle limit"
                ),
            );
        }
        let routers: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{}: {:?} ({:?})", n.peer, n.view.router, n.router.role()))
            .collect();
        if self.effective_everywhere().is_none()
            || self.nodes.iter().filter(|n| n.router.is_active()).count() != 1
        {
            self.violate(
                3,
                format!("no single agreed active router after the settle limit: {routers:?}"),
            );
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

fn pool_config(
    peer: &PeerId,
    workers: u32,
    incarnation: u64,
    q: &QueueConfig,
) -> piecework_worker_pool::Config {
    piecework_worker_pool::Config {
        peer: peer.clone(),
        workers,
        incarnation,
        heartbeat: Duration::from_millis(q.pool_heartbeat_ms),
    }
}
