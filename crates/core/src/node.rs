//! The [`Core`]: one node's documents, routers, pool, views, waiters and save bookkeeping.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::{ActorId, Automerge, ChangeHash};
use piecework_queue_doc::epoch::{self, Latest, Link, Seal};
use piecework_queue_doc::task::{self, NewTask, RunStart};
use piecework_queue_doc::{
    AttemptId, AttemptOutcome, Changed, Claim, Output, PeerId, QueueConfig, QueueId, QueueView,
    RunningReport, Submission, TaskEntry, TaskId, TaskState, ViewCache, queue,
};
use piecework_replica::{DocId, Event as ReplicaEvent, Message, Replica, Scope};
use piecework_router::{Action as RouterAction, Role, Router};
use piecework_worker_pool::{Action as PoolAction, Config as PoolConfig, Pool, Run, RunEnd};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::EpochEvent;
use crate::api::{self, QueueError, StorageFailure, SubmitError, TaskError};
use crate::retention::Retention;
use crate::saves::{Acked, Saves};
use crate::wire::Ask;
use crate::{
    BEHIND_WAIT, Built, Command, CommandId, Config, DIAL_EVERY, Event, FIND_TIMEOUT, IDLE_EVICT,
    Io, LOAD_ATTEMPTS, MAX_PENDING_SUBMITS, MAX_WAIT, MAX_WAITERS, Outcome, REPLICATION_WAIT,
    Reply, Retired, Rotate, RotateId, RotateWork, RunId, RunRequest, RunResult, Running,
    SAVE_RETRY, SaveId, Saved, Status, Successor, TaskRunEnd, Time, Wire, max_claim, queue_doc,
    task_doc,
};

/// A rotation whose successor is being built ([`Io::Rotate`]).
#[derive(Debug)]
struct Rotating {
    queue: QueueId,
    /// The document it seals.
    prev: DocId,
    successor: DocId,
    epoch: u64,
    claim: Claim,
    /// The heads of the copy it is built from: the seal's.
    heads: Vec<ChangeHash>,
    /// Catch-ups asked for so far (`Config::catch_ups`).
    catch_ups: u32,
    /// The last catch-up is out, and the queue frozen until it is back (see [`Queue::frozen`]),
    /// or until this deadline ([`FROZEN_AT_MOST`]).
    last: Option<Instant>,
}

/// Changes of sealed documents carried per turn, at most, when what they hold was never shown
/// in this node's view (see [`Core::carry_round`]): the rest waits for the next turns, so that
/// a burst of late writes does not hold up the node's heartbeats.
const CARRY_PER_TURN: usize = 64;

/// The longest a queue stays frozen for a rotation's last catch-up: past it, the rotation is
/// dropped (its answer, if it ever comes, is ignored) and the queue goes on.
const FROZEN_AT_MOST: Duration = Duration::from_secs(2);

/// The pool's heartbeat before any queue says otherwise.
const DEFAULT_POOL_HEARTBEAT: Duration = Duration::from_millis(500);

/// Something parked until a document arrives (or turns out unavailable).
#[derive(Debug)]
enum DocWaiter {
    Join {
        cmd: CommandId,
        id: QueueId,
        from_peers: bool,
        deadline: Instant,
    },
    Status {
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
        deadline: Instant,
    },
    /// A run waiting for its task's document, since when.
    Start { run: Run, since: Instant },
    /// An epoch document of a queue (a successor, or a successor that lost a double seal).
    Epoch { queue: QueueId },
    /// The epoch document a reopened queue was on when this node stopped
    /// ([`Config::resume`]): the queue moves there once it is read back.
    Resume { queue: QueueId },
    /// A task whose input was unavailable: if this node has its document, mark it available.
    Revive {
        queue: QueueId,
        task: TaskId,
        n: u64,
    },
    /// Run records or a summary for a task document that had left memory: written by the
    /// next turn once it is back (`Core::task_writes` keeps them meanwhile).
    Write,
}

/// A sealed epoch this node holds.
#[derive(Debug)]
struct Sealed {
    /// The document its late writes are carried into.
    into: DocId,
    /// That document's epoch number.
    into_epoch: u64,
    /// Its heads carried so far.
    carried: Vec<ChangeHash>,
    /// It changed since the last carry.
    dirty: bool,
    /// Its epoch number.
    epoch: u64,
    /// When this node moved past it.
    since: Instant,
    /// Its target was retired here, after this node had carried it up to `carried` along
    /// the chain: it now carries into the current document, and a task it indexed at
    /// `carried` was carried along already (so the chain's documents are not needed).
    forwarded: bool,
    /// A carry waiting for documents of the chain (or their changes) is looked at again
    /// then, not at every turn: each look asks the members, whose answers make turns.
    retry_at: Option<Instant>,
}

/// A carry waits for a document (or its changes) to arrive.
struct Waiting;

/// What a losing branch's carry reads besides the target's chain (`Core::loser_bases`).
struct LoserBases {
    /// The documents the branch carried from or was built from that this node holds, each
    /// with what the target's chain absorbed of it.
    docs: Vec<(DocId, epoch::Cover)>,
    /// The target's chain absorbed all the branch absorbed of them: a task entry the branch
    /// took from one of them (its build, a carry) needs no carrying.
    all_absorbed: bool,
}

/// How long a carry waiting for documents of the chain, or for changes of them, waits before
/// it looks (and asks) again, unless they arrive.
const CARRY_RETRY: Duration = Duration::from_secs(1);

/// Sealed epochs a queue holds past their carry, at most, besides its first document: the
/// oldest clean ones are retired before `Config::epoch_retain` when more are held. A queue
/// that rotates every second or two would otherwise hold a minute of history in memory
/// (some 4 KiB per task). Three nodes at 5,000 live tasks, rotating every 2–3 s: peak RSS
/// 168–201 MiB per node with 3 held, 201–340 MiB with 8 (docs/benchmarks.md).
const MAX_SEALED_HELD: usize = 3;

/// Bound on the announced epoch documents a queue keeps to look at.
const MAX_ANNOUNCED: usize = 16;

/// Bound on the documents remembered as false epoch announcements, per queue.
const MAX_REJECTED_EPOCHS: usize = 64;

/// Documents waiting to leave memory (saved, unused) are kept this many at most for
/// [`IDLE_EVICT`]; beyond it the oldest leave after [`CROWDED_IDLE`]. A task's document is
/// read again from disk when its run starts: ten thousand pending tasks do not hold ten
/// thousand Automerge documents (some 10 to 20 KiB each) in memory.
const MAX_IDLE_DOCS: usize = 1_024;

/// How long a document waits to leave memory when more than [`MAX_IDLE_DOCS`] wait.
const CROWDED_IDLE: Duration = Duration::from_millis(200);

/// How many pending tasks per worker of this node have their documents read ahead of their
/// start: those first in routing order. A pending task's document otherwise stays on disk.
const PREFETCH_PER_WORKER: usize = 8;

/// Archived statuses kept in memory as well, the latest: a lookup right after an archive
/// write answers without waiting for the disk.
const RECENT_ARCHIVED: usize = 4_096;

/// Bound on the carrying rounds of one turn ([`Core::carry_late`]).
const MAX_CARRY_ROUNDS: usize = 4;

/// How often a join still waiting for its queue document asks the connected peers again: a
/// request or its answer lost with a stream that was reset, or a peer that joined the queue
/// since it was first asked, does not hold the join until [`FIND_TIMEOUT`].
const JOIN_ASK_EVERY: Duration = Duration::from_secs(1);

/// The documents of the branch `own` (a lineage, as [`epoch::read_lineage`] gives it) that
/// the lineage `target` does not share: what a node on `own` wrote since the fork. Never the
/// queue's first document.
fn branch_since_fork(own: &[Link], target: &[Link], root: Option<&DocId>) -> Vec<(DocId, u64)> {
    own.iter()
        // Not on the target's chain: a link older than the target's lineage keeps (cut at
        // `MAX_LINEAGE`) is on it, as `epoch::on_lineage` says.
        .filter(|l| !epoch::on_lineage(target, &l.doc, Some(l.epoch)))
        .filter_map(|l| DocId::parse(&l.doc).map(|d| (d, l.epoch)))
        .filter(|(d, _)| Some(d) != root)
        .collect()
}

/// The newest document of `own` (a lineage) that is on `target`'s chain too: where the two
/// branches forked. `None` if they share only the queue's first document.
fn fork_of(own: &[Link], target: &[Link]) -> Option<DocId> {
    own.iter()
        .filter(|l| epoch::on_lineage(target, &l.doc, Some(l.epoch)))
        .max_by_key(|l| l.epoch)
        .and_then(|l| DocId::parse(&l.doc))
}

/// A stop in progress ([`Command::Stop`]).
#[derive(Debug)]
struct Stopping {
    /// The stop commands to answer (a second one is answered with the first).
    cmds: Vec<CommandId>,
    /// Runs still going then are interrupted.
    grace_until: Instant,
    /// The answer goes out then at the latest, with what is still unsaved.
    flush_until: Instant,
    /// Runs in flight when the stop began.
    runs_at_stop: usize,
    /// Once every run ended and its records were written: each document then not on disk,
    /// and the version it must reach (what peers send meanwhile is not waited for).
    flush: Option<Vec<(DocId, u64)>>,
    report: api::StopReport,
    /// The answer went out: the node does nothing more but wait for its driver to end it.
    answered: bool,
}

/// A status request this node could answer from nothing it holds, asked of the connected
/// members ([`Ask::Status`]).
#[derive(Debug)]
struct Asking {
    /// The requests to answer.
    cmds: Vec<CommandId>,
    /// The members asked that have not answered yet.
    waiting: BTreeSet<PeerId>,
    /// Answered "not found" then, whoever is left.
    deadline: Instant,
}

/// Archive lookups at most in flight for members' questions ([`Ask::Status`]); beyond this a
/// question is answered "unknown".
const MAX_PEER_LOOKUPS: usize = 1_024;

#[derive(Debug)]
struct TaskWaiter {
    cmd: CommandId,
    task: TaskId,
    until: Instant,
    wait: Duration,
}

#[derive(Debug)]
struct SubmitWait {
    cmd: CommandId,
    /// How to answer: one task, or a batch (whose refused entries are already known).
    answer: SubmitAnswer,
    /// Each new task document, its heads and its save version after the submit.
    tasks: Vec<(DocId, Vec<ChangeHash>, u64)>,
    queue: QueueId,
    queue_doc: DocId,
    queue_heads: Vec<ChangeHash>,
    queue_version: u64,
    deadline: Instant,
}

#[derive(Debug)]
enum SubmitAnswer {
    One(TaskId),
    /// Per request entry: its task, or why it was refused.
    Many(Vec<Result<TaskId, String>>),
}

#[derive(Debug)]
struct Queue {
    /// The current epoch's document: where this node writes, and what its view reads.
    doc: DocId,
    /// The queue's first document (epoch 0), whose id is the queue's: the group its members
    /// and task documents are scoped to.
    root: DocId,
    /// The current epoch's number.
    epoch: u64,
    /// Sealed epoch documents this node still holds, and where their late writes are carried:
    /// at most the epochs of the last `Config::epoch_retain`, plus losers of double seals.
    sealed: BTreeMap<DocId, Sealed>,
    /// Epoch documents being fetched: a few (one per announced successor).
    fetching: BTreeSet<DocId>,
    /// Epoch documents a fetch found nowhere: a move stops waiting for them, a carry that
    /// needs one waits without asking again; forgotten (asked for again) when a peer connects
    /// (at most [`MAX_REJECTED_EPOCHS`]).
    unavailable: BTreeSet<DocId>,
    /// Epoch documents of this queue that peers' heartbeats say they are on, other than this
    /// node's current one: at most [`MAX_ANNOUNCED`], forgotten once placed.
    announced: BTreeSet<DocId>,
    /// The successor this node waits to take until it holds what the seal covered, once the
    /// members were asked for it (asked again when a peer connects), and until when it waits
    /// ([`BEHIND_WAIT`]; `None` once that passed: it moves without).
    asked_behind: Option<(DocId, Option<Instant>)>,
    /// Documents announced as epochs of this queue that are not, or that are older epochs of
    /// its chain: never looked at again (at most [`MAX_REJECTED_EPOCHS`]).
    rejected: BTreeSet<DocId>,
    router: Router,
    cache: ViewCache,
    view: Arc<QueueView>,
    topic: String,
    /// The successor whose view is being read off this thread before the node moves to it
    /// ([`RotateWork::Read`]), and the view once read.
    priming: Option<DocId>,
    primed: Option<(DocId, ViewCache)>,
    /// While the sealer's last catch-up is out: the view stays as it is and neither the router
    /// nor the pool writes the document, so that the successor then holds all the view showed
    /// and every change after it is a late write no view showed, carried over the next turns.
    frozen: bool,
    /// Router actions (other than heartbeats) held while frozen, with when they were decided
    /// (unix ms).
    deferred: Vec<(u64, RouterAction)>,
    /// The document `view` was read from: `doc` but between a move and the next refresh.
    view_doc: DocId,
    /// The epoch document this reopened queue resumes at ([`Config::resume`]), while it is
    /// read back: the queue follows no chain until then, or it would fetch every epoch since
    /// its first document.
    resuming: Option<DocId>,
}

/// One node's decisions. See the crate docs for how to drive it.
///
/// Bounds: every collection below is bounded by a named constant or by something the node
/// controls, as each field's comment says; the output queues (`transmit`, `io`, `replies`,
/// `events`) hold one input's worth of output and are drained after every input.
#[derive(Debug)]
pub struct Core {
    config: Config,
    rng: ChaCha8Rng,
    /// This incarnation's Automerge actor: every change this node writes is authored by it.
    actor: ActorId,
    replica: Replica,
    pool: Pool,
    /// Joined queues: one per join command this node's user made.
    queues: BTreeMap<QueueId, Queue>,
    /// One per joined queue.
    topics: BTreeMap<String, QueueId>,
    /// Every epoch document of a joined queue this node holds (current, sealed, the first),
    /// and its queue.
    epoch_docs: BTreeMap<DocId, QueueId>,
    /// Successors being built off this thread ([`Io::Rotate`]): at most one per queue.
    rotating: BTreeMap<RotateId, Rotating>,
    next_rotate: u64,
    /// Peers with an open sync stream (bounded by the transport's connections).
    connected: BTreeSet<PeerId>,
    advertised: Vec<String>,
    next_dial: Instant,
    saves: Saves,
    /// Load attempts per document being loaded (retried on failure). Bounded by the replica's
    /// loads (`piecework_replica::MAX_PENDING_LOADS` for peers' messages, plus this node's own
    /// fetches, which its waiters bound).
    loads: BTreeMap<DocId, u32>,
    /// Failed loads to retry, by when: a subset of `loads`.
    load_retries: BTreeSet<(Instant, DocId)>,
    /// Queues whose document changed since their view was last refreshed: at most `queues`.
    stale: BTreeSet<QueueId>,
    /// Requests parked on a document: at most [`MAX_WAITERS`], plus one start per worker.
    doc_waiters: BTreeMap<DocId, Vec<DocWaiter>>,
    /// Joins that found no peer with the queue yet: retried when a peer connects, answered at
    /// their deadline. Counted in [`MAX_WAITERS`].
    join_retries: Vec<DocWaiter>,
    /// When the joins still waiting ask the peers again ([`JOIN_ASK_EVERY`]).
    next_join_ask: Instant,
    /// `task status --wait` requests: counted in [`MAX_WAITERS`], each with a deadline.
    task_waiters: Vec<TaskWaiter>,
    /// Submits waiting for durability and replication: at most [`MAX_PENDING_SUBMITS`].
    submit_waits: Vec<SubmitWait>,
    /// The task documents of `submit_waits`: kept in memory until their submit is answered
    /// (a document that left memory is no longer synced, so no peer would acknowledge it).
    acking: BTreeSet<DocId>,
    /// Something that can answer a submit wait happened since [`Core::check_submits`] last ran.
    submits_dirty: bool,
    /// Inside [`Core::begin_batch`]: turns wait for [`Core::end_batch`].
    batching: bool,
    /// The earliest deadline of a durable submit that waits only for a peer to hold it.
    submit_deadline: Option<Instant>,
    /// Documents that may leave memory once saved and unused, and from when: at most the
    /// loaded documents (an entry whose document is gone is dropped).
    to_evict: EvictQueue,
    /// Retired documents (finished tasks', sealed epochs that left memory) still on disk:
    /// beyond its bounds the oldest are deleted. At most the bounds, plus the ones held in
    /// memory meanwhile.
    retention: Retention,
    /// Runs in flight, by id: at most one per worker.
    runs: BTreeMap<RunId, Running>,
    /// Runs begun this turn, handed to the driver at its end.
    starting: Vec<RunRequest>,
    /// Tasks seen in `InputUnavailable` to try to revive (queue, task, attempt number): at
    /// most the tasks indexed in that state, drained every turn.
    to_revive: BTreeSet<(QueueId, TaskId, u64)>,
    /// Starts and ends of attempts not yet written, per queue, in the order they happened:
    /// written as one change per queue document when the turn's actions are drained
    /// ([`Core::flush_attempts`]). At most one start and one end per worker.
    attempt_writes: BTreeMap<QueueId, Vec<PendingAttempt>>,
    /// Changes of sealed documents this turn may still carry ([`CARRY_PER_TURN`]).
    carry_budget: usize,
    /// Changes of sealed documents looked at by carries since start ([`Core::carried_changes`]).
    carried_changes: u64,
    /// Carry without the budget: what is carried now is shown in the view (a follower moving
    /// to a successor carries its own late writes before showing it).
    carry_whole: bool,
    /// A carry was left for the next turn, which is due at once.
    carry_again: Option<Instant>,
    /// Run records and final summaries not yet written, per task document: written as one
    /// change per document at the end of the turn. At most one run per worker plus the tasks
    /// that became final in this turn.
    task_writes: BTreeMap<DocId, TaskWrites>,
    /// The documents of each queue's first pending tasks in routing order (at most
    /// [`PREFETCH_PER_WORKER`] per worker): read ahead of their start, and kept in memory.
    prefetch: BTreeMap<QueueId, BTreeSet<TaskId>>,
    /// What the runs of inline tasks produced, from their end until the pool's finish writes
    /// it with the end: at most one per worker.
    outputs: BTreeMap<(TaskId, AttemptId), Output>,
    /// Final statuses of inline tasks to archive at the end of the turn (tasks that became
    /// final in this turn's refreshes).
    to_archive: Vec<(TaskId, Vec<u8>)>,
    /// The latest archived statuses, also in memory: at most [`RECENT_ARCHIVED`].
    recent_archived: BTreeMap<TaskId, Vec<u8>>,
    /// `recent_archived`'s keys, oldest first.
    recent_order: VecDeque<TaskId>,
    /// Status requests waiting for an archive lookup, by task: counted in [`MAX_WAITERS`].
    lookups: BTreeMap<TaskId, Vec<(CommandId, Option<Instant>)>>,
    /// Status requests asked of the members, by task: counted in [`MAX_WAITERS`].
    asks: BTreeMap<TaskId, Asking>,
    /// Members' questions waiting for an archive lookup, by task: at most
    /// [`MAX_PEER_LOOKUPS`].
    peer_lookups: BTreeMap<TaskId, BTreeSet<PeerId>>,
    next_run: u64,
    /// The greatest router claim seen per queue, in views or heartbeats: one per queue.
    seen: BTreeMap<QueueId, Claim>,
    /// Where each queue this node reopens resumes ([`Config::resume`]): taken when the queue
    /// is reopened. At most one per queue the store remembers.
    resume: BTreeMap<QueueId, DocId>,
    /// A stop in progress, or done ([`Command::Stop`]).
    stopping: Option<Stopping>,
    transmit: VecDeque<(PeerId, Vec<u8>)>,
    io: VecDeque<Io>,
    replies: VecDeque<(CommandId, Reply)>,
    events: VecDeque<Event>,
    /// Fencing switched off (the `broken` feature's test variant only).
    #[cfg(feature = "broken")]
    broken: bool,
}

impl Core {
    /// A node with no queues, started at `now`.
    pub fn new(mut config: Config, now: Time) -> Self {
        let retention = Retention::new(
            config.keep_task_docs,
            config.keep_sealed_epochs,
            std::mem::take(&mut config.retired),
        );
        let resume = std::mem::take(&mut config.resume).into_iter().collect();
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut actor = [0u8; 16];
        rng.fill_bytes(&mut actor);
        let actor = ActorId::from(&actor[..]);
        let mut replica = Replica::new();
        // Each start writes as a new Automerge actor: a change lost in a crash can never
        // collide with a new change under the same (actor, seq).
        replica.set_actor(actor.clone());
        replica.set_local_peer(config.peer.clone());
        if let Some((lower, higher)) = config.relay_waits {
            replica.set_relay_waits(lower, higher);
        }
        let pool = Pool::new(
            PoolConfig {
                peer: config.peer.clone(),
                workers: config.workers,
                incarnation: config.incarnation,
                heartbeat: DEFAULT_POOL_HEARTBEAT,
            },
            now.mono,
        );
        Core {
            config,
            retention,
            rng,
            actor,
            replica,
            pool,
            queues: BTreeMap::new(),
            topics: BTreeMap::new(),
            epoch_docs: BTreeMap::new(),
            rotating: BTreeMap::new(),
            next_rotate: 0,
            connected: BTreeSet::new(),
            advertised: vec![],
            next_dial: now.mono,
            saves: Saves::default(),
            loads: BTreeMap::new(),
            load_retries: BTreeSet::new(),
            stale: BTreeSet::new(),
            doc_waiters: BTreeMap::new(),
            join_retries: vec![],
            next_join_ask: now.mono,
            task_waiters: vec![],
            submit_waits: vec![],
            acking: BTreeSet::new(),
            submits_dirty: false,
            batching: false,
            submit_deadline: None,
            to_evict: EvictQueue::default(),
            runs: BTreeMap::new(),
            starting: Vec::new(),
            to_revive: BTreeSet::new(),
            attempt_writes: BTreeMap::new(),
            carry_budget: CARRY_PER_TURN,
            carried_changes: 0,
            carry_whole: false,
            carry_again: None,
            task_writes: BTreeMap::new(),
            prefetch: BTreeMap::new(),
            outputs: BTreeMap::new(),
            to_archive: Vec::new(),
            recent_archived: BTreeMap::new(),
            recent_order: VecDeque::new(),
            lookups: BTreeMap::new(),
            asks: BTreeMap::new(),
            peer_lookups: BTreeMap::new(),
            next_run: 0,
            seen: BTreeMap::new(),
            resume,
            stopping: None,
            transmit: VecDeque::new(),
            io: VecDeque::new(),
            replies: VecDeque::new(),
            events: VecDeque::new(),
            #[cfg(feature = "broken")]
            broken: false,
        }
    }

    /// Breaks this node on purpose: its workers stop fencing (they start assignments from
    /// deposed routers). Only for proving that the simulator catches it.
    #[cfg(feature = "broken")]
    pub fn break_fencing(&mut self) {
        self.pool.break_fencing();
        self.broken = true;
    }

    fn fencing(&self) -> bool {
        #[cfg(feature = "broken")]
        if self.broken {
            return false;
        }
        true
    }

    /// An empty document whose changes this incarnation authors.
    fn new_doc(&self) -> Automerge {
        Automerge::new().with_actor(self.actor.clone())
    }

    // ----- getters -----

    /// This node's peer id.
    pub fn peer(&self) -> &PeerId {
        &self.config.peer
    }

    /// This start's incarnation.
    pub fn incarnation(&self) -> u64 {
        self.config.incarnation
    }

    /// The joined queues.
    pub fn queues(&self) -> impl Iterator<Item = &QueueId> {
        self.queues.keys()
    }

    /// A joined queue's current view.
    pub fn view(&self, queue: &QueueId) -> Option<&Arc<QueueView>> {
        self.queues.get(queue).map(|q| &q.view)
    }

    /// How many changes of sealed documents this node's carries have looked at since it
    /// started: what carrying late writes has cost it (a work counter; a carry costs the
    /// changes after the seal, not the epoch's history).
    pub fn carried_changes(&self) -> u64 {
        self.carried_changes
    }

    /// A joined queue's current epoch: its number and its document.
    pub fn epoch(&self, queue: &QueueId) -> Option<(u64, &DocId)> {
        self.queues.get(queue).map(|q| (q.epoch, &q.doc))
    }

    /// Every epoch document of a joined queue this node holds: the current one first, then
    /// the sealed ones it keeps (the queue's first document among them).
    pub fn epoch_docs(&self, queue: &QueueId) -> Vec<DocId> {
        self.queues.get(queue).map_or_else(Vec::new, |q| {
            std::iter::once(q.doc.clone())
                .chain(q.sealed.keys().cloned())
                .collect()
        })
    }

    /// This node's router role for a queue.
    pub fn role(&self, queue: &QueueId) -> Option<&Role> {
        self.queues.get(queue).map(|q| q.router.role())
    }

    /// Whether this node is the active router of `queue`.
    pub fn is_active(&self, queue: &QueueId) -> bool {
        self.queues.get(queue).is_some_and(|q| q.router.is_active())
    }

    /// The greatest router claim this node has seen for `queue` (in its view or a heartbeat):
    /// what its workers fence on.
    pub fn fence(&self, queue: &QueueId) -> Option<&Claim> {
        self.seen.get(queue)
    }

    /// Documents held in memory.
    pub fn documents_loaded(&self) -> usize {
        self.replica.loaded()
    }

    /// A document held in memory, read-only (for checks and displays).
    pub fn document(&self, doc: &DocId) -> Option<&Automerge> {
        self.replica.get(doc)
    }

    /// Whether a document is held in memory.
    pub fn is_loaded(&self, doc: &DocId) -> bool {
        self.replica.is_loaded(doc)
    }

    /// Runs in flight.
    pub fn running(&self) -> usize {
        self.runs.len()
    }

    /// The sizes of the core's collections, for tests that check they stay bounded.
    pub fn sizes(&self) -> BTreeMap<&'static str, usize> {
        BTreeMap::from([
            ("queues", self.queues.len()),
            ("connected", self.connected.len()),
            ("loads", self.loads.len()),
            ("load_retries", self.load_retries.len()),
            ("stale", self.stale.len()),
            ("doc_waiters", self.doc_waiters.values().map(Vec::len).sum()),
            ("join_retries", self.join_retries.len()),
            ("task_waiters", self.task_waiters.len()),
            ("submit_waits", self.submit_waits.len()),
            ("to_evict", self.to_evict.len()),
            ("runs", self.runs.len()),
            ("loaded", self.replica.loaded()),
            ("epoch_docs", self.epoch_docs.len()),
            ("sealed", self.queues.values().map(|q| q.sealed.len()).sum()),
            (
                "sealed_dirty",
                self.queues
                    .values()
                    .map(|q| q.sealed.values().filter(|s| s.dirty).count())
                    .sum(),
            ),
            ("rotating", self.rotating.len()),
            ("retired_task_docs", self.retention.len().0),
            ("retired_epochs", self.retention.len().1),
        ])
    }

    // ----- inputs -----

    /// The node's advertised addresses changed: record them in every joined queue.
    pub fn handle_addresses(&mut self, now: Time, addrs: Vec<String>) {
        if addrs == self.advertised {
            return;
        }
        self.advertised = addrs;
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in ids {
            self.write_member(now, &id);
        }
        self.turn(now);
    }

    /// A sync stream to `peer` opened: start syncing with it.
    pub fn handle_connected(&mut self, now: Time, peer: PeerId) {
        self.submits_dirty = true;
        self.connected.insert(peer.clone());
        for q in self.queues.values_mut() {
            if q.view.members.contains_key(&peer) {
                q.router.handle_member_connected(now.mono);
            }
        }
        self.replica.handle_connected(peer);
        for q in self.queues.values_mut() {
            if q.asked_behind.take().is_some() {
                self.stale.insert(QueueId::new(q.root.as_str()));
            }
            // The newcomer may have the epoch documents no one had: ask again, and look at
            // the carries that waited for them.
            if !q.unavailable.is_empty() {
                q.unavailable.clear();
                for s in q.sealed.values_mut() {
                    s.dirty = true;
                }
                self.stale.insert(QueueId::new(q.root.as_str()));
            }
        }
        // A member that comes back may hold the documents of tasks whose input was unavailable.
        for (qid, q) in &self.queues {
            for t in q.view.input_unavailable() {
                self.to_revive
                    .insert((qid.clone(), t.id.clone(), t.last_n()));
            }
        }
        for w in std::mem::take(&mut self.join_retries) {
            if let DocWaiter::Join { id, .. } = &w
                && let Some(doc) = queue_doc(id)
            {
                self.wait_for(now, &doc, w);
            }
        }
        self.turn(now);
    }

    /// The sync stream to `peer` closed: forget the sync state with it (a reopened stream
    /// starts over).
    pub fn handle_disconnected(&mut self, now: Time, peer: &PeerId) {
        self.submits_dirty = true;
        self.connected.remove(peer);
        self.replica.handle_disconnected(peer);
        // Its answers will not come.
        let tasks: Vec<TaskId> = self.asks.keys().cloned().collect();
        for task in tasks {
            self.not_answered(&task, peer);
        }
        for peers in self.peer_lookups.values_mut() {
            peers.remove(peer);
        }
        self.turn(now);
    }

    /// The transport to `peer` has no send credit: generate nothing more for it until
    /// [`Core::handle_unblocked`].
    pub fn handle_blocked(&mut self, peer: &PeerId) {
        self.replica.handle_blocked(peer);
    }

    /// The transport to `peer` has credit again.
    pub fn handle_unblocked(&mut self, now: Time, peer: &PeerId) {
        self.replica.handle_unblocked(peer);
        self.turn(now);
    }

    /// A frame from `peer`'s sync stream (the transport authenticated the peer).
    pub fn handle_sync(&mut self, now: Time, peer: &PeerId, frame: &[u8]) {
        self.submits_dirty = true;
        if Ask::is_ask(frame) {
            match Ask::decode(frame) {
                Some(ask) => self.handle_ask(peer, ask),
                None => self.events.push_back(Event::Rejected {
                    peer: peer.clone(),
                    reason: "undecodable or oversized status question".into(),
                }),
            }
            self.turn(now);
            return;
        }
        match Message::decode(frame) {
            Ok(msg) => self.replica.handle_message(peer, msg, now.mono),
            Err(e) => self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!("undecodable sync frame: {e}"),
            }),
        }
        self.turn(now);
    }

    /// A gossip message on `topic`, signed by `source`.
    pub fn handle_gossip(&mut self, now: Time, topic: &str, source: &PeerId, data: &[u8]) {
        self.gossip(now, topic, source, data);
        self.turn(now);
    }

    fn gossip(&mut self, now: Time, topic: &str, source: &PeerId, data: &[u8]) {
        let Some(id) = self.topics.get(topic).cloned() else {
            return;
        };
        let reject = |reason: String| Event::Rejected {
            peer: source.clone(),
            reason,
        };
        let Some(msg) = Wire::decode(data) else {
            self.events
                .push_back(reject("malformed or oversized gossip".into()));
            return;
        };
        let Some(q) = self.queues.get_mut(&id) else {
            return;
        };
        if !q.view.members.contains_key(source) {
            self.events
                .push_back(reject(format!("gossip on {id} from a non-member")));
            return;
        }
        match msg {
            Wire::Router(beat) if beat.claim.term > piecework_queue_doc::MAX_TERM => {
                self.events.push_back(reject(format!(
                    "router heartbeat with term {} above the maximum {}",
                    beat.claim.term,
                    piecework_queue_doc::MAX_TERM
                )));
            }
            Wire::Router(beat) if beat.claim.peer == *source && beat.queue == id => {
                if let Some(l) = &beat.epoch
                    && announce(q, l)
                {
                    self.stale.insert(id.clone());
                }
                q.router.handle_router_beat(now.mono, &beat);
                self.pool.handle_router_beat(&beat);
                see(&mut self.seen, &id, &beat.claim);
            }
            Wire::Pool(beat) if beat.peer == *source => {
                if let Some(l) = &beat.epoch
                    && announce(q, l)
                {
                    self.stale.insert(id.clone());
                }
                q.router.handle_pool_beat(now.mono, &beat);
            }
            _ => self.events.push_back(reject(format!(
                "gossip on {id} claiming another sender or queue"
            ))),
        }
    }

    /// The answer to [`Io::Load`]: every stored chunk (none if the document is not stored), or
    /// the read's error.
    pub fn handle_loaded(
        &mut self,
        now: Time,
        doc: &DocId,
        chunks: Result<Vec<Vec<u8>>, StorageFailure>,
    ) {
        let attempts = self.loads.remove(doc).unwrap_or(0) + 1;
        let loaded = match chunks {
            Ok(chunks) if chunks.is_empty() => None,
            Ok(chunks) => match piecework_replica::load_chunks(&chunks) {
                Ok(d) => {
                    let bytes = chunks.iter().map(Vec::len).sum();
                    self.saves.loaded(doc, chunks.len(), bytes);
                    Some(d)
                }
                Err(e) => {
                    self.events.push_back(Event::LoadFailed {
                        doc: doc.clone(),
                        error: format!(
                            "a stored chunk does not load ({e}); the document is treated as absent"
                        ),
                    });
                    None
                }
            },
            Err(e) if attempts < LOAD_ATTEMPTS => {
                // Retry: a transient read error must not make a stored document look absent.
                self.loads.insert(doc.clone(), attempts);
                let at = now.mono + SAVE_RETRY.saturating_mul(1 << attempts);
                self.load_retries.insert((at, doc.clone()));
                self.events.push_back(Event::LoadFailed {
                    doc: doc.clone(),
                    error: format!("{e} (attempt {attempts}, retrying)"),
                });
                self.turn(now);
                return;
            }
            Err(e) => {
                self.events.push_back(Event::LoadFailed {
                    doc: doc.clone(),
                    error: format!("{e} (attempt {attempts}, giving up: treated as absent)"),
                });
                None
            }
        };
        self.replica.handle_loaded(doc, loaded, now.mono);
        // Loaded for a peer's message (a member catching up through an old epoch), or for
        // this node: either way it leaves memory once idle, unless something holds it.
        if self.replica.is_loaded(doc) && !self.is_live(doc) {
            self.to_evict.insert_if_absent(doc.clone(), now.mono);
        }
        self.turn(now);
    }

    /// The answer to [`Io::Save`].
    pub fn handle_saved(&mut self, now: Time, id: SaveId, result: Result<Saved, StorageFailure>) {
        self.submits_dirty = true;
        match self
            .saves
            .handle_saved(now.mono, id, result, &mut self.replica)
        {
            Some(Acked::Failed {
                doc,
                failures,
                error,
            }) if failures >= crate::SAVE_FAILURES_REPORTED => {
                self.events.push_back(Event::SaveFailed {
                    doc,
                    failures,
                    error,
                });
            }
            _ => {}
        }
        self.turn(now);
    }

    /// The answer to [`Io::Run`].
    pub fn handle_run_ended(&mut self, now: Time, id: RunId, result: RunResult) {
        let Some(Running { run, start }) = self.runs.remove(&id) else {
            return;
        };
        let ok = result.result.is_ok();
        let (end, task_end) = match result.result {
            Ok(v) => (
                RunEnd::Succeeded,
                TaskRunEnd {
                    outcome: AttemptOutcome::Succeeded,
                    at: now.unix_ms,
                    result: Some(v),
                    error: None,
                    logs: result.logs,
                },
            ),
            Err(e) => (
                RunEnd::Failed(e.clone()),
                TaskRunEnd {
                    outcome: AttemptOutcome::Failed,
                    at: now.unix_ms,
                    result: None,
                    error: Some(e),
                    logs: result.logs,
                },
            ),
        };
        self.events.push_back(Event::RunEnded {
            queue: run.queue.clone(),
            task: run.task.clone(),
            ok,
        });
        let key = (run.task.clone(), run.attempt.clone());
        if self.inline_input(&run.queue, &run.task).is_some() {
            // Written with the attempt's end, in the queue document.
            let output = Output {
                // A null result (a no-op's) is not written: it reads back as null.
                result: task_end
                    .result
                    .as_ref()
                    .filter(|v| !v.is_null())
                    .and_then(|v| serde_json::to_string(v).ok()),
                logs: task_end.logs,
            };
            self.outputs.insert(key.clone(), output);
        } else if let Some(tdoc) = task_doc(&run.task) {
            self.task_writes
                .entry(tdoc)
                .or_default()
                .runs
                .push((start, task_end));
        }
        if !self.pool.handle_finished(run.worker.index, end) {
            self.outputs.remove(&key);
        }
        self.turn(now);
    }

    /// A command from the API; its reply comes out of [`Core::poll_reply`] with the same id.
    pub fn handle_command(&mut self, now: Time, cmd: CommandId, command: Command) {
        self.command(now, cmd, command);
        self.turn(now);
    }

    /// A deadline from [`Core::poll_timeout`] passed (calling early is harmless).
    pub fn handle_timeout(&mut self, now: Time) {
        self.turn(now);
    }

    // ----- outputs -----

    /// The next frame to send, and to whom. `now` is when it goes: a document's sync messages
    /// to a peer that has not answered the last one wait a little
    /// ([`piecework_replica::SYNC_ANSWER_WAIT`]; [`Core::poll_timeout`] says until when).
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(PeerId, Vec<u8>)> {
        if self.transmit.is_empty() {
            while let Some((peer, msg)) = self.replica.poll_transmit(now) {
                self.transmit.push_back((peer, msg.encode()));
            }
        }
        self.transmit.pop_front()
    }

    /// The next I/O to perform.
    pub fn poll_io(&mut self) -> Option<Io> {
        self.io.pop_front()
    }

    /// The next reply to a command.
    pub fn poll_reply(&mut self) -> Option<(CommandId, Reply)> {
        self.replies.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Core::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut t = [
            Some(self.pool.poll_timeout()),
            Some(self.next_dial).filter(|_| !self.queues.is_empty()),
            self.queues
                .values()
                .filter_map(|q| q.asked_behind.as_ref().and_then(|(_, until)| *until))
                .min(),
            self.saves.poll_timeout(),
            self.load_retries.first().map(|(at, _)| *at),
            self.replica.poll_timeout(),
            self.to_evict.next_due(IDLE_EVICT, MAX_IDLE_DOCS),
        ]
        .into_iter()
        .flatten()
        .min();
        let mut earliest = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        for q in self.queues.values() {
            if let Some(r) = q.router.poll_timeout() {
                earliest(r);
            }
        }
        if let Some(d) = self.submit_deadline {
            earliest(d);
        }
        if let Some(d) = self.asks.values().map(|a| a.deadline).min() {
            earliest(d);
        }
        if let Some(s) = self.stopping.as_ref().filter(|s| !s.answered) {
            if !self.runs.is_empty() {
                earliest(s.grace_until);
            }
            earliest(s.flush_until);
        }
        if let Some(d) = self.carry_again {
            earliest(d);
        }
        for s in self.queues.values().flat_map(|q| q.sealed.values()) {
            if let (true, Some(t)) = (s.dirty, s.retry_at) {
                earliest(t);
            }
        }
        for r in self.rotating.values() {
            if let Some(d) = r.last {
                earliest(d);
            }
        }
        for w in &self.task_waiters {
            earliest(w.until);
        }
        for ws in self.doc_waiters.values() {
            for w in ws {
                match w {
                    DocWaiter::Join { deadline, .. } => {
                        earliest((*deadline).min(self.next_join_ask));
                    }
                    DocWaiter::Status { deadline, .. } => earliest(*deadline),
                    DocWaiter::Start { .. }
                    | DocWaiter::Revive { .. }
                    | DocWaiter::Write
                    | DocWaiter::Epoch { .. }
                    | DocWaiter::Resume { .. } => {}
                }
            }
        }
        for q in self.queues.values() {
            // A dirty one stays until it is carried (then clean, and timed again).
            for (d, sealed) in &q.sealed {
                if *d != q.root && !sealed.dirty {
                    earliest(sealed.since + self.config.epoch_retain);
                }
            }
        }
        for w in &self.join_retries {
            if let DocWaiter::Join { deadline, .. } = w {
                earliest((*deadline).min(self.next_join_ask));
            }
        }
        t
    }

    // ----- the turn -----

    /// Defers the turn every `handle_*` method ends with until [`Core::end_batch`]: a driver
    /// that has several inputs ready hands them all over, and one turn then routes, writes,
    /// saves and syncs what they changed together (one refresh of each view, one save of each
    /// document, one sync message per document and peer). Outputs wait for the turn.
    pub fn begin_batch(&mut self) {
        self.batching = true;
    }

    /// Sends the router heartbeats that are due, and nothing else: no input is read and no
    /// turn runs. A driver calls it when it wakes and between the parts of a batch (after
    /// taking inputs, before the turn that applies them). Otherwise a beat that falls due
    /// during a long turn waits for the end of the next one, and two long turns in a row are a
    /// silence long enough for a takeover at the fastest timings.
    ///
    /// The pool's beats still go out at the end of a turn: they tell routers which workers are
    /// idle, and one sent before the turn that ends runs would say so a turn late (throughput
    /// fell about 5% when they went out here too). A pool is deemed gone only after a lease,
    /// many beats long.
    pub fn handle_beats(&mut self, now: Time) {
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in &ids {
            let beat = self
                .queues
                .get_mut(id)
                .and_then(|q| q.router.poll_beat(now.mono));
            if let Some(beat) = beat {
                self.router_action(now, id, RouterAction::Beat(beat), now.unix_ms);
            }
        }
    }

    /// Ends a batch begun with [`Core::begin_batch`]: runs the deferred turn.
    pub fn end_batch(&mut self, now: Time) {
        self.batching = false;
        self.turn(now);
    }

    /// Runs after every input (or batch of inputs): drives timers, carries out actions until
    /// none is left, starts writes, and resumes or expires whatever waited.
    fn turn(&mut self, now: Time) {
        if self.batching {
            return;
        }
        self.replica.handle_timeout(now.mono);
        self.saves.handle_timeout(now.mono);
        self.carry_budget = CARRY_PER_TURN;
        self.carry_again = None;
        // Carries whose wait is over are due at this turn's epoch work (and no longer a timer).
        for s in self.queues.values_mut().flat_map(|q| q.sealed.values_mut()) {
            if s.retry_at.is_some_and(|t| now.mono >= t) {
                s.retry_at = None;
            }
        }
        self.expire_frozen(now);
        self.interrupt_at_grace(now);
        while let Some((at, doc)) = self.load_retries.first().cloned() {
            if at > now.mono {
                break;
            }
            self.load_retries.pop_first();
            self.io.push_back(Io::Load { doc });
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            self.drain_replica(now);
            for id in std::mem::take(&mut self.stale) {
                self.refresh(now, &id);
            }
            let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
            for id in &ids {
                self.epoch_work(now, id);
            }
            for (queue, task, n) in std::mem::take(&mut self.to_revive) {
                self.revive(now, queue, task, n);
            }
            for q in self.queues.values_mut() {
                q.router.handle_timeout(now.mono);
            }
            self.pool.handle_timeout(now.mono);
            let acted = self.drain_actions(now);
            let wrote = self.flush_attempts(now);
            if (!acted && !wrote && self.stale.is_empty()) || rounds > 10_000 {
                if rounds <= 10_000 && self.abort_fenced_starts() {
                    continue;
                }
                break;
            }
        }
        self.hand_over_starts();
        self.flush_task_writes(now);
        self.flush_archive();
        // Asked only of a document whose compaction is due (rarely), not for every write.
        let (rotating, queues) = (&self.rotating, &self.queues);
        let sealing = |d: &DocId| {
            rotating.values().any(|r| r.prev == *d)
                || queues.values().any(|q| q.sealed.contains_key(d))
        };
        let saves = self.saves.take_writes(&self.replica, sealing);
        for save in saves {
            self.io.push_back(Io::Save(save));
        }
        self.evict(now);
        self.check_submits(now);
        self.check_task_waiters(now);
        self.expire_doc_waiters(now);
        self.ask_joins_again(now);
        self.answer_stop(now);
        if now.mono >= self.next_dial {
            self.dial_members();
            self.next_dial = now.mono + DIAL_EVERY;
        }
    }

    // ----- documents -----

    fn drain_replica(&mut self, now: Time) {
        while let Some(ev) = self.replica.poll_event() {
            match ev {
                ReplicaEvent::Load(doc) => {
                    if !self.loads.contains_key(&doc) {
                        self.loads.insert(doc.clone(), 0);
                        self.io.push_back(Io::Load { doc });
                    }
                }
                ReplicaEvent::Changed(doc) => self.changed(&doc),
                ReplicaEvent::Arrived(doc) => self.arrived(now, &doc),
                ReplicaEvent::Unavailable(doc) => self.unavailable(now, &doc),
                ReplicaEvent::Rejected { peer, reason } => {
                    self.events.push_back(Event::Rejected { peer, reason });
                }
                ReplicaEvent::Refused { peer, doc } => {
                    tracing::debug!(%peer, %doc, "refused a document outside this node's queues");
                }
            }
        }
    }

    /// A document changed (here or from a peer): save it, and refresh its queue's view.
    fn changed(&mut self, doc: &DocId) {
        self.saves.changed(doc);
        let Some(id) = self.epoch_docs.get(doc) else {
            return;
        };
        if let Some(q) = self.queues.get_mut(id) {
            if let Some(s) = q.sealed.get_mut(doc) {
                s.dirty = true;
            }
            self.stale.insert(id.clone());
        }
    }

    /// Applies a local change to a loaded document; `None` if it is not loaded.
    fn change<R>(&mut self, doc: &DocId, f: impl FnOnce(&mut Automerge) -> R) -> Option<R> {
        let before = self.replica.get(doc)?.get_heads();
        let r = self.replica.change(doc, f)?;
        if self
            .replica
            .get(doc)
            .is_some_and(|d| d.get_heads() != before)
        {
            self.changed(doc);
        }
        Some(r)
    }

    fn wait_for(&mut self, now: Time, doc: &DocId, waiter: DocWaiter) {
        self.doc_waiters
            .entry(doc.clone())
            .or_default()
            .push(waiter);
        self.replica.fetch(doc, now.mono);
    }

    fn waiting(&self) -> usize {
        self.doc_waiters.values().map(Vec::len).sum::<usize>()
            + self.join_retries.len()
            + self.task_waiters.len()
            + self.lookups.values().map(Vec::len).sum::<usize>()
            + self.asks.values().map(|a| a.cmds.len()).sum::<usize>()
    }

    /// A document this node waited for is loaded.
    fn arrived(&mut self, now: Time, doc: &DocId) {
        let waiters = self.doc_waiters.remove(doc).unwrap_or_default();
        let asked = waiters
            .iter()
            .any(|w| matches!(w, DocWaiter::Status { .. }));
        for w in waiters {
            match w {
                DocWaiter::Join { cmd, id, .. } => {
                    let r = self.finish_join(now, &id);
                    self.replies.push_back((cmd, Reply::Joined(r)));
                }
                DocWaiter::Status {
                    cmd,
                    task,
                    wait_until,
                    ..
                } => self.answer_status(now, cmd, task, wait_until),
                DocWaiter::Start { run, .. } => self.start_run(run),
                DocWaiter::Revive { queue, task, n } => self.revive(now, queue, task, n),
                DocWaiter::Write => {}
                DocWaiter::Resume { queue } => self.resume_at(now, &queue, doc),
                DocWaiter::Epoch { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.fetching.remove(doc);
                        // A carry may have waited for this document of the chain.
                        for s in q.sealed.values_mut() {
                            s.dirty = true;
                        }
                        self.stale.insert(queue);
                    }
                }
            }
        }
        // A task's document loaded from disk may be behind: this node may have been down when
        // the task ended, and a final task's document is no longer announced. Ask the members,
        // for a status or a final task. (A live task's document read for its start or ahead
        // of it needs only its input, which never changes; its later changes are pushed here.)
        let task = TaskId::new(doc.as_str());
        if self.queues.values().any(|q| {
            q.view
                .task(&task)
                .is_some_and(|t| asked || t.state().is_final())
        }) {
            self.replica.refresh_from_members(doc);
        }
        if !self.is_live(doc) {
            self.to_evict.insert_if_absent(doc.clone(), now.mono);
        }
    }

    fn unavailable(&mut self, now: Time, doc: &DocId) {
        for w in self.doc_waiters.remove(doc).unwrap_or_default() {
            match w {
                DocWaiter::Join {
                    from_peers: true,
                    cmd,
                    id,
                    deadline,
                } if now.mono < deadline => {
                    // Ask again when another peer connects; the deadline bounds it.
                    self.join_retries.push(DocWaiter::Join {
                        cmd,
                        id,
                        from_peers: true,
                        deadline,
                    });
                }
                DocWaiter::Join { cmd, id, .. } => {
                    self.replies
                        .push_back((cmd, Reply::Joined(Err(QueueError::NotFound(id)))));
                }
                // No member has a document for it (an inline task has none): the members may
                // still know what became of it.
                DocWaiter::Status { cmd, task, .. } => self.ask_members(now, cmd, task),
                DocWaiter::Start { run, since } => {
                    let timed_out = now.mono.saturating_duration_since(since)
                        >= piecework_replica::FETCH_TIMEOUT;
                    self.events.push_back(Event::FetchFailed {
                        task: run.task.clone(),
                        timed_out,
                    });
                    self.pool.handle_input_unavailable(
                        run.worker.index,
                        "the task document is unavailable: no reachable member has it".into(),
                    );
                }
                // Not here either: another member may have it.
                DocWaiter::Revive { .. } => {}
                // Never saved here (the node stopped first): the queue follows its chain
                // from where it is.
                DocWaiter::Resume { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.resuming = None;
                        self.stale.insert(queue);
                    }
                }
                DocWaiter::Write => {
                    if self.task_writes.remove(doc).is_some() {
                        tracing::warn!(%doc, "cannot record the task's runs: its document is on no reachable member");
                    }
                }
                // Asked again at the next change of the queue.
                DocWaiter::Epoch { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.fetching.remove(doc);
                        if q.unavailable.len() < MAX_REJECTED_EPOCHS {
                            q.unavailable.insert(doc.clone());
                        }
                        for s in q.sealed.values_mut() {
                            s.dirty = true;
                        }
                        self.stale.insert(queue);
                    }
                }
            }
        }
    }

    /// Every [`JOIN_ASK_EVERY`] while joins wait: a join whose fetch still waits asks the
    /// connected peers again, and one that found no peer with the queue fetches again.
    fn ask_joins_again(&mut self, now: Time) {
        if now.mono < self.next_join_ask {
            return;
        }
        let fetching: Vec<DocId> = self
            .doc_waiters
            .iter()
            .filter(|(_, ws)| ws.iter().any(|w| matches!(w, DocWaiter::Join { .. })))
            .map(|(d, _)| d.clone())
            .collect();
        let retries = std::mem::take(&mut self.join_retries);
        if fetching.is_empty() && retries.is_empty() {
            return;
        }
        self.next_join_ask = now.mono + JOIN_ASK_EVERY;
        for doc in fetching {
            self.replica.ask_again(&doc);
        }
        for w in retries {
            if let DocWaiter::Join { id, .. } = &w
                && let Some(doc) = queue_doc(id)
            {
                self.wait_for(now, &doc, w);
            }
        }
    }

    fn expire_doc_waiters(&mut self, now: Time) {
        let late: Vec<TaskId> = self
            .asks
            .iter()
            .filter(|(_, a)| now.mono >= a.deadline)
            .map(|(t, _)| t.clone())
            .collect();
        for task in late {
            if let Some(a) = self.asks.remove(&task) {
                for cmd in a.cmds {
                    let r = Err(TaskError::NotFound(task.clone()));
                    self.replies.push_back((cmd, Reply::Task(Box::new(r))));
                }
            }
        }
        let expired = |w: &DocWaiter| match w {
            DocWaiter::Join { deadline, .. } | DocWaiter::Status { deadline, .. } => {
                now.mono >= *deadline
            }
            DocWaiter::Start { .. }
            | DocWaiter::Revive { .. }
            | DocWaiter::Epoch { .. }
            | DocWaiter::Resume { .. }
            | DocWaiter::Write => false,
        };
        let mut gone = vec![];
        for ws in self.doc_waiters.values_mut() {
            let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(ws).into_iter().partition(expired);
            *ws = keep;
            gone.extend(old);
        }
        self.doc_waiters.retain(|_, ws| !ws.is_empty());
        let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.join_retries)
            .into_iter()
            .partition(expired);
        self.join_retries = keep;
        gone.extend(old);
        for w in gone {
            match w {
                DocWaiter::Join { cmd, id, .. } => self
                    .replies
                    .push_back((cmd, Reply::Joined(Err(QueueError::NotFound(id))))),
                DocWaiter::Status { cmd, task, .. } => self
                    .replies
                    .push_back((cmd, Reply::Task(Box::new(Err(TaskError::NotFound(task)))))),
                DocWaiter::Start { .. }
                | DocWaiter::Revive { .. }
                | DocWaiter::Epoch { .. }
                | DocWaiter::Resume { .. }
                | DocWaiter::Write => {}
            }
        }
    }

    /// Whether a document must stay in memory: a joined queue's, a live task's (not final),
    /// one a request waits on, or one a run of this node uses.
    fn is_live(&self, doc: &DocId) -> bool {
        let id = QueueId::new(doc.as_str());
        if self.queues.contains_key(&id)
            || self.epoch_docs.contains_key(doc)
            || self.doc_waiters.contains_key(doc)
        {
            return true;
        }
        // A task's document is read when a run starts and written when it ends: a live
        // task's stays on disk until then (an Automerge document costs some 10 KiB of memory
        // even when empty; ten thousand pending tasks would hold 200 MB).
        let task = TaskId::new(doc.as_str());
        self.runs.values().any(|r| r.run.task == task)
            || self.task_waiters.iter().any(|w| w.task == task)
            || self.task_writes.contains_key(doc)
            || self.acking.contains(doc)
            || self.prefetch.values().any(|p| p.contains(&task))
    }

    /// Drops documents that are saved, unused and idle for [`IDLE_EVICT`] from memory.
    fn evict(&mut self, now: Time) {
        self.retire_epochs(now);
        let due = self.to_evict.due(now.mono, IDLE_EVICT, MAX_IDLE_DOCS);
        for doc in due {
            if !self.replica.is_loaded(&doc) {
                self.to_evict.remove(&doc);
                self.saves.forget(&doc);
                continue;
            }
            if self.is_live(&doc) {
                self.to_evict.remove(&doc);
                continue;
            }
            if self.saves.is_clean(&doc) && self.replica.evict(&doc) {
                self.to_evict.remove(&doc);
                self.saves.forget(&doc);
            } else {
                // Not saved yet: look again after another idle period.
                self.to_evict.set(doc, now.mono);
            }
        }
        self.delete_retired();
    }

    /// Retires a document: recorded in order, deleted from disk once beyond its kind's bound.
    fn retire(&mut self, doc: DocId, kind: Retired) {
        if self.retention.retire(doc.clone(), kind) {
            self.io.push_back(Io::Retire { doc, kind });
        }
    }

    /// Deletes the retired documents beyond their bounds, oldest first, each once it can
    /// leave memory (saved, unused) and has no load in flight; one that cannot yet holds back
    /// the ones behind it until a later call.
    fn delete_retired(&mut self) {
        // The predecessors of the documents each queue holds (its current one, its sealed
        // ones): a losing branch's carry reads its predecessor (`Core::loser_bases`).
        let mut pinned: Option<BTreeSet<DocId>> = None;
        let mut postponed: BTreeSet<DocId> = BTreeSet::new();
        loop {
            let mut deleted = false;
            for doc in self.retention.over() {
                let pinned = pinned.get_or_insert_with(|| {
                    self.queues
                        .values()
                        .flat_map(|q| std::iter::once(&q.doc).chain(q.sealed.keys()))
                        .filter_map(|d| self.replica.get(d))
                        .filter_map(epoch::read_prev)
                        .filter_map(|p| DocId::parse(&p.doc))
                        .collect()
                });
                if pinned.contains(&doc) {
                    // Behind the others; once every one left is pinned, none goes.
                    if postponed.insert(doc.clone()) {
                        self.retention.postpone(&doc);
                        deleted = true;
                    }
                    continue;
                }
                let in_memory = self.replica.is_loaded(&doc);
                if self.loads.contains_key(&doc)
                    || !self.saves.is_clean(&doc)
                    || (in_memory && (self.is_live(&doc) || !self.replica.evict(&doc)))
                {
                    continue;
                }
                self.retention.deleted(&doc);
                self.saves.forget(&doc);
                self.to_evict.remove(&doc);
                self.io.push_back(Io::Delete { doc });
                deleted = true;
            }
            if !deleted {
                return;
            }
        }
    }

    // ----- commands -----

    fn command(&mut self, now: Time, cmd: CommandId, command: Command) {
        if self.stopping.is_some() {
            // A stopping node takes no new work and writes nothing new.
            let refused = match &command {
                Command::CreateQueue { .. } => Some(Reply::Created(Err(QueueError::Stopped))),
                Command::JoinQueue { .. } => Some(Reply::Joined(Err(QueueError::Stopped))),
                Command::SetPaused { .. } => Some(Reply::Paused(Err(QueueError::Stopped))),
                Command::Submit { .. } => Some(Reply::Submitted(Err(SubmitError::Stopped))),
                Command::SubmitMany { .. } => Some(Reply::SubmittedMany(Err(SubmitError::Stopped))),
                _ => None,
            };
            if let Some(r) = refused {
                self.replies.push_back((cmd, r));
                return;
            }
        }
        match command {
            Command::CreateQueue { name, config } => {
                let r = self.create_queue(now, &name, &config);
                self.replies.push_back((cmd, Reply::Created(r)));
            }
            Command::JoinQueue { id, from_peers } => {
                if let Some(q) = self.queues.get(&id) {
                    self.replies
                        .push_back((cmd, Reply::Joined(Ok(q.view.clone()))));
                    return;
                }
                let Some(doc) = queue_doc(&id) else {
                    self.replies
                        .push_back((cmd, Reply::Joined(Err(QueueError::BadId(id.to_string())))));
                    return;
                };
                if self.waiting() >= MAX_WAITERS {
                    self.replies
                        .push_back((cmd, Reply::Joined(Err(QueueError::Busy(MAX_WAITERS)))));
                    return;
                }
                let deadline = now.mono + FIND_TIMEOUT;
                self.next_join_ask = self.next_join_ask.max(now.mono + JOIN_ASK_EVERY);
                self.wait_for(
                    now,
                    &doc,
                    DocWaiter::Join {
                        cmd,
                        id,
                        from_peers,
                        deadline,
                    },
                );
            }
            Command::SetPaused { queue, paused } => {
                let r = match self.queues.get(&queue).map(|q| q.doc.clone()) {
                    None => Err(QueueError::NotJoined(queue)),
                    Some(doc) => self
                        .change(&doc, |d| queue::set_paused(d, paused))
                        .unwrap_or(Err(queue::WriteError::NotAQueue))
                        .map_err(QueueError::from),
                };
                self.replies.push_back((cmd, Reply::Paused(r)));
            }
            Command::Stop { grace } => self.stop(now, cmd, grace),
            Command::Submit { queue, task } => self.submit(now, cmd, queue, task),
            Command::SubmitMany { queue, tasks } => self.submit_many(now, cmd, queue, tasks),
            Command::TaskStatus { task, wait } => {
                if task_doc(&task).is_none() {
                    self.replies.push_back((
                        cmd,
                        Reply::Task(Box::new(Err(TaskError::BadId(task.to_string())))),
                    ));
                    return;
                }
                if self.waiting() >= MAX_WAITERS {
                    self.replies.push_back((
                        cmd,
                        Reply::Task(Box::new(Err(TaskError::Busy(MAX_WAITERS)))),
                    ));
                    return;
                }
                let wait_until = wait.map(|w| now.mono + w.min(MAX_WAIT));
                self.find_status(now, cmd, task, wait_until);
            }
            Command::Status => {
                let status = self.status();
                self.replies.push_back((cmd, Reply::Status(status)));
            }
            Command::QueueDocument { queue } => {
                let saved = self
                    .queues
                    .get(&queue)
                    .and_then(|q| Some((q.epoch, self.replica.get(&q.doc)?.save())))
                    .ok_or(QueueError::NotJoined(queue));
                self.replies.push_back((cmd, Reply::Document(saved)));
            }
        }
    }

    fn status(&self) -> Status {
        let queues = self
            .queues
            .iter()
            .map(|(id, q)| {
                let role = match q.router.role() {
                    Role::Follower => "follower",
                    Role::Claiming { .. } => "claiming",
                    Role::Active { .. } => "active",
                    Role::Stopped { .. } => "stopped",
                };
                api::QueueStatus {
                    id: id.clone(),
                    name: q.view.name.clone(),
                    router: q.view.router.clone(),
                    role: role.to_owned(),
                    members: q.view.members.len(),
                    paused: q.view.paused,
                    epoch: q.epoch,
                    tasks: q.view.total_counts(),
                    config: q.view.config.clone(),
                }
            })
            .collect();
        let workers = self
            .pool
            .runs()
            .map(|(i, run)| api::WorkerStatus {
                name: format!("{}/{i}", self.config.peer),
                running: run.map(|r| RunningReport {
                    queue: r.queue.clone(),
                    task: r.task.clone(),
                    attempt: r.attempt.clone(),
                }),
            })
            .collect();
        Status {
            queues,
            workers,
            documents_loaded: self.replica.loaded(),
            internals: self
                .sizes()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }

    fn create_queue(
        &mut self,
        now: Time,
        name: &str,
        config: &QueueConfig,
    ) -> Result<QueueId, QueueError> {
        let mut doc = self.new_doc();
        queue::create(&mut doc, name, config, &self.config.peer, now.unix_ms)?;
        queue::set_member(&mut doc, &self.config.peer, &self.advertised, now.unix_ms)?;
        let id = DocId::generate(&mut self.rng);
        self.replica
            .set_group(&id, BTreeSet::from([self.config.peer.clone()]));
        self.replica.create(id.clone(), doc, Some(queue_scope(&id)));
        self.saves.changed(&id);
        let qid = QueueId::new(id.as_str());
        self.register(now, qid.clone(), name);
        Ok(qid)
    }

    /// Completes a join or reopen: the queue document is loaded.
    fn finish_join(&mut self, now: Time, id: &QueueId) -> Result<Arc<QueueView>, QueueError> {
        let doc = queue_doc(id).ok_or_else(|| QueueError::BadId(id.to_string()))?;
        let view = self
            .replica
            .get(&doc)
            .and_then(QueueView::read)
            .ok_or_else(|| QueueError::NotAQueue(id.clone()))?;
        let members = view
            .members
            .keys()
            .cloned()
            .chain([self.config.peer.clone()]);
        self.replica.set_group(&doc, members.collect());
        self.replica.set_scope(&doc, queue_scope(&doc));
        self.register(now, id.clone(), &view.name);
        self.write_member(now, id);
        Ok(self
            .queues
            .get(id)
            .map_or_else(|| Arc::new(view), |q| q.view.clone()))
    }

    /// Writes this node's membership and addresses into a queue, if they differ.
    fn write_member(&mut self, now: Time, id: &QueueId) {
        let Some(q) = self.queues.get(id) else { return };
        let me = self.config.peer.clone();
        if q.view
            .members
            .get(&me)
            .is_some_and(|m| m.addrs == self.advertised)
        {
            return;
        }
        let addrs = self.advertised.clone();
        self.write_queue(now, id, "this node's membership", |d| {
            queue::set_member(d, &me, &addrs, now.unix_ms)
        });
    }

    /// Starts serving a queue: a router, a view, its gossip topic.
    fn register(&mut self, now: Time, id: QueueId, name: &str) {
        if self.queues.contains_key(&id) {
            return;
        }
        let Some(doc) = queue_doc(&id) else { return };
        self.io.push_back(Io::RememberQueue {
            id: id.clone(),
            name: name.to_owned(),
        });
        let topic = topic_for(&id);
        self.io.push_back(Io::Subscribe {
            topic: topic.clone(),
        });
        self.topics.insert(topic.clone(), id.clone());
        self.epoch_docs.insert(doc.clone(), id.clone());
        let root = doc.clone();
        self.queues.insert(
            id.clone(),
            Queue {
                doc: doc.clone(),
                view_doc: doc.clone(),
                root: doc,
                epoch: 0,
                sealed: BTreeMap::new(),
                fetching: BTreeSet::new(),
                unavailable: BTreeSet::new(),
                announced: BTreeSet::new(),
                asked_behind: None,
                rejected: BTreeSet::new(),
                router: Router::new(id.clone(), self.config.peer.clone(), now.mono),
                cache: ViewCache::new(),
                view: Arc::new(QueueView::default()),
                topic,
                priming: None,
                primed: None,
                frozen: false,
                deferred: Vec::new(),
                resuming: None,
            },
        );
        // Reopened after a restart: back to the epoch this node was on, read from its disk,
        // rather than through every sealed epoch since the queue's first document.
        if let Some(at) = self
            .resume
            .remove(&id)
            .filter(|d| d.as_str() != id.as_str())
        {
            self.replica.set_scope(&at, epoch_scope(&root));
            if let Some(q) = self.queues.get_mut(&id) {
                q.resuming = Some(at.clone());
            }
            self.wait_for(now, &at, DocWaiter::Resume { queue: id.clone() });
        }
        self.refresh(now, &id);
        if let Some(q) = self.queues.get_mut(&id) {
            // A member reached before the queue was opened: the silence counts from now.
            if self
                .connected
                .iter()
                .any(|p| q.view.members.contains_key(p))
            {
                q.router.handle_member_connected(now.mono);
            }
            let beat = Duration::from_millis(q.view.config.pool_heartbeat_ms);
            if beat < self.pool.config().heartbeat {
                self.pool.set_heartbeat(beat);
            }
        }
        self.next_dial = now.mono;
    }

    fn submit(&mut self, now: Time, cmd: CommandId, queue_id: QueueId, req: api::SubmitTask) {
        match self.submit_batch(now, cmd, queue_id, vec![req], false) {
            Ok(()) => {}
            Err(e) => self.replies.push_back((cmd, Reply::Submitted(Err(e)))),
        }
    }

    fn submit_many(
        &mut self,
        now: Time,
        cmd: CommandId,
        queue_id: QueueId,
        reqs: Vec<api::SubmitTask>,
    ) {
        if reqs.len() > api::MAX_BATCH {
            self.replies.push_back((
                cmd,
                Reply::SubmittedMany(Err(SubmitError::TooMany(reqs.len()))),
            ));
            return;
        }
        if let Err(e) = self.submit_batch(now, cmd, queue_id, reqs, true) {
            self.replies.push_back((cmd, Reply::SubmittedMany(Err(e))));
        }
    }

    /// Checks a request on its own (before any document is touched).
    fn check_request(req: &api::SubmitTask) -> Result<(), SubmitError> {
        if req.kind.trim().is_empty() {
            return Err(SubmitError::Invalid("the kind is empty".into()));
        }
        if req.priority.unsigned_abs() > queue::MAX_PRIORITY.unsigned_abs() {
            return Err(SubmitError::Invalid(format!(
                "priority {} is outside [-{max}, {max}]",
                req.priority,
                max = queue::MAX_PRIORITY
            )));
        }
        if let Some(m) = req.max_attempts {
            let (lo, hi) = (QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
            if !(lo..=hi).contains(&m) {
                return Err(SubmitError::Invalid(format!(
                    "max_attempts {m} is outside [{lo}, {hi}]"
                )));
            }
        }
        Ok(())
    }

    /// Submits `reqs` with one change to the queue document; the reply waits in
    /// [`Core::check_submits`]. An error refuses the whole batch; a single submit
    /// (`many == false`) is refused by its entry's error too.
    fn submit_batch(
        &mut self,
        now: Time,
        cmd: CommandId,
        queue_id: QueueId,
        reqs: Vec<api::SubmitTask>,
        many: bool,
    ) -> Result<(), SubmitError> {
        if !many && let Some(req) = reqs.first() {
            Self::check_request(req)?;
        }
        let Some((qdoc, root, c)) = self
            .queues
            .get(&queue_id)
            .map(|q| (q.doc.clone(), q.root.clone(), q.view.counts()))
        else {
            return Err(SubmitError::NotJoined(queue_id));
        };
        if self.submit_waits.len() >= MAX_PENDING_SUBMITS {
            return Err(SubmitError::Busy(MAX_PENDING_SUBMITS));
        }
        let live = c.pending + c.assigned + c.running + c.input_unavailable;
        if live >= self.config.max_live {
            return Err(SubmitError::Full {
                queue: queue_id,
                live,
                max: self.config.max_live,
            });
        }
        let mut answers: Vec<Result<TaskId, String>> = Vec::with_capacity(reqs.len());
        let mut submissions = Vec::with_capacity(reqs.len());
        let mut docs = Vec::with_capacity(reqs.len());
        for req in reqs {
            if let Err(e) = Self::check_request(&req) {
                answers.push(Err(e.to_string()));
                continue;
            }
            let text = serde_json::to_string(&req.input).unwrap_or_default();
            let inline = !text.is_empty() && text.len() <= self.config.inline_input_max;
            // Inline: the entry carries the input and there is no task document.
            let doc = if inline {
                None
            } else {
                let mut doc = self.new_doc();
                let new = NewTask {
                    queue: queue_id.clone(),
                    kind: req.kind.clone(),
                    input: req.input,
                    submitter: self.config.peer.clone(),
                    submitted_at: now.unix_ms,
                };
                if let Err(e) = task::init(&mut doc, &new) {
                    if !many {
                        return Err(e.into());
                    }
                    answers.push(Err(SubmitError::from(e).to_string()));
                    continue;
                }
                Some(doc)
            };
            let tdoc = DocId::generate(&mut self.rng);
            let task_id = TaskId::new(tdoc.as_str());
            submissions.push(Submission {
                id: task_id.clone(),
                kind: req.kind,
                submitter: self.config.peer.clone(),
                submitted_at: now.unix_ms,
                priority: req.priority,
                urgent: req.urgent,
                max_attempts: req.max_attempts,
                input: inline.then_some(text),
            });
            answers.push(Ok(task_id));
            if let Some(doc) = doc {
                docs.push((tdoc, doc));
            }
        }
        // The task documents first, so that they are scoped (indexed) when peers receive the
        // entries.
        let mut tasks = Vec::with_capacity(docs.len());
        for (tdoc, doc) in docs {
            let heads = doc.get_heads();
            self.replica.create(
                tdoc.clone(),
                doc,
                Some(Scope {
                    group: root.clone(),
                    announce: true,
                    requestable: false,
                }),
            );
            self.saves.changed(&tdoc);
            // Leaves memory once saved and idle (it is read again when a run starts).
            self.to_evict.insert_if_absent(tdoc.clone(), now.mono);
            tasks.push((tdoc.clone(), heads, self.saves.version(&tdoc)));
        }
        let r = self.change(&qdoc, |d| {
            queue::submit_many(d, &submissions)?;
            Ok::<_, queue::SubmitError>(d.get_heads())
        });
        let queue_heads = match r {
            Some(Ok(h)) => h,
            other => {
                for (tdoc, _, _) in &tasks {
                    self.replica.clear_scope(tdoc);
                }
                return Err(match other {
                    Some(Err(e)) => e.into(),
                    _ => SubmitError::NotJoined(queue_id),
                });
            }
        };
        let answer = if many {
            SubmitAnswer::Many(answers)
        } else {
            match answers.pop() {
                Some(Ok(id)) => SubmitAnswer::One(id),
                _ => unreachable!("a single submit's refusal returned above"),
            }
        };
        self.submits_dirty = true;
        self.acking.extend(tasks.iter().map(|(d, _, _)| d.clone()));
        self.submit_waits.push(SubmitWait {
            cmd,
            answer,
            tasks,
            queue: queue_id,
            queue_version: self.saves.version(&qdoc),
            queue_doc: qdoc,
            queue_heads,
            deadline: now.mono + REPLICATION_WAIT,
        });
        Ok(())
    }

    /// Answers submits that are durable and either held by a peer or out of time (or alone),
    /// and fails those whose documents cannot be written. Runs only when a save ended, a peer
    /// sent something, a submit arrived or the oldest wait's deadline passed.
    fn check_submits(&mut self, now: Time) {
        let due = self.submit_deadline.is_some_and(|d| now.mono >= d);
        if !std::mem::take(&mut self.submits_dirty) && !due {
            return;
        }
        self.submit_deadline = None;
        let waits = std::mem::take(&mut self.submit_waits);
        for w in waits {
            let failing = w
                .tasks
                .iter()
                .find_map(|(d, _, _)| self.saves.failing(d))
                .or_else(|| self.saves.failing(&w.queue_doc))
                .cloned();
            let durable = w.tasks.iter().all(|(d, _, v)| self.saves.is_durable(d, *v))
                && self.saves.is_durable(&w.queue_doc, w.queue_version);
            if !durable {
                if let Some(e) = failing {
                    self.release_acking(now, &w);
                    let reply = match w.answer {
                        SubmitAnswer::One(_) => Reply::Submitted(Err(SubmitError::NotDurable(e))),
                        SubmitAnswer::Many(_) => {
                            Reply::SubmittedMany(Err(SubmitError::NotDurable(e)))
                        }
                    };
                    self.replies.push_back((w.cmd, reply));
                } else {
                    self.submit_waits.push(w);
                }
                continue;
            }
            let alone = self.queues.get(&w.queue).is_none_or(|q| {
                !q.view
                    .members
                    .keys()
                    .any(|m| *m != self.config.peer && self.connected.contains(m))
            });
            let held = w.tasks.iter().all(|(d, h, _)| self.replica.peer_has(d, h))
                && self.replica.peer_has(&w.queue_doc, &w.queue_heads);
            if !(held || alone || now.mono >= w.deadline) {
                // Only its deadline (or a peer's message, which marks the waits dirty) can
                // answer it now.
                self.submit_deadline = Some(
                    self.submit_deadline
                        .map_or(w.deadline, |d| d.min(w.deadline)),
                );
                self.submit_waits.push(w);
                continue;
            }
            self.release_acking(now, &w);
            let reply = match w.answer {
                SubmitAnswer::One(task_id) => Reply::Submitted(Ok(api::Submitted {
                    task_id,
                    replicated: held,
                })),
                SubmitAnswer::Many(answers) => Reply::SubmittedMany(Ok(answers
                    .into_iter()
                    .enumerate()
                    .map(|(index, a)| match a {
                        Ok(task_id) => api::BatchEntry::Submitted {
                            index,
                            task_id,
                            replicated: held,
                        },
                        Err(error) => api::BatchEntry::Refused { index, error },
                    })
                    .collect())),
            };
            self.replies.push_back((w.cmd, reply));
        }
    }

    /// A submit is answered: its documents may leave memory once idle.
    fn release_acking(&mut self, now: Time, w: &SubmitWait) {
        for (d, _, _) in &w.tasks {
            self.acking.remove(d);
            self.to_evict.insert_if_absent(d.clone(), now.mono);
        }
    }

    /// Answers a status request: from a view for a task a queue indexes (with its task
    /// document if it has one), else from the archive of inline tasks, else from the task's
    /// document, loaded or fetched.
    fn find_status(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        let indexed = self.queues.values().any(|q| q.view.task(&task).is_some());
        if indexed && self.inline_task(&task).is_some() {
            self.answer_status(now, cmd, task, wait_until);
            return;
        }
        if !indexed {
            if let Some(json) = self.recent_archived.get(&task) {
                let reply = archived_status(&task, json);
                self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
                return;
            }
            let asked = self.lookups.contains_key(&task);
            self.lookups
                .entry(task.clone())
                .or_default()
                .push((cmd, wait_until));
            if !asked {
                self.io.push_back(Io::Lookup { task });
            }
            return;
        }
        self.status_from_doc(now, cmd, task, wait_until);
    }

    /// Asks the connected members about a task this node has no record of (not in a view, not
    /// archived, no document found): one of them may have seen it finish (an inline task that
    /// ran while this node was down or cut off, in epochs it skipped). Answered "not found"
    /// when every member asked said it knows nothing, or after [`FIND_TIMEOUT`].
    fn ask_members(&mut self, now: Time, cmd: CommandId, task: TaskId) {
        if let Some(a) = self.asks.get_mut(&task) {
            a.cmds.push(cmd);
            return;
        }
        let members: BTreeSet<PeerId> = self
            .connected
            .iter()
            .filter(|p| {
                self.queues
                    .values()
                    .any(|q| q.view.members.contains_key(*p))
            })
            .cloned()
            .collect();
        if members.is_empty() {
            let r = Err(TaskError::NotFound(task));
            self.replies.push_back((cmd, Reply::Task(Box::new(r))));
            return;
        }
        let frame = Ask::Status { task: task.clone() }.encode();
        for p in &members {
            self.transmit.push_back((p.clone(), frame.clone()));
        }
        self.asks.insert(
            task,
            Asking {
                cmds: vec![cmd],
                waiting: members,
                deadline: now.mono + FIND_TIMEOUT,
            },
        );
    }

    /// A member asked about a task, or answered this node's question.
    fn handle_ask(&mut self, peer: &PeerId, ask: Ask) {
        match ask {
            Ask::Status { task } => {
                if let Some(known) = self.known_status(peer, &task) {
                    self.answer_ask(peer, &task, known);
                    return;
                }
                // Perhaps archived here: look, and answer then.
                let looking =
                    self.lookups.contains_key(&task) || self.peer_lookups.contains_key(&task);
                if !looking && self.peer_lookups.len() >= MAX_PEER_LOOKUPS {
                    self.answer_ask(peer, &task, None);
                    return;
                }
                self.peer_lookups
                    .entry(task.clone())
                    .or_default()
                    .insert(peer.clone());
                if !looking {
                    self.io.push_back(Io::Lookup { task });
                }
            }
            Ask::Answer { task, status } => {
                let asked = self
                    .asks
                    .get_mut(&task)
                    .is_some_and(|a| a.waiting.remove(peer));
                if !asked {
                    return; // not asked, or answered already
                }
                // Only a status of a task of a queue this node joined is taken.
                let found = status.and_then(|json| {
                    let s: api::TaskStatus = serde_json::from_value(json).ok()?;
                    (s.id == task && self.queues.contains_key(&s.queue)).then_some(s)
                });
                match found {
                    Some(s) => {
                        let a = self.asks.remove(&task).map_or_else(Vec::new, |a| a.cmds);
                        // Learned: a final status is archived here, so that this node answers
                        // for the task from now on, even with no member connected.
                        if s.state.is_final()
                            && let Ok(json) = serde_json::to_vec(&s)
                        {
                            self.to_archive.push((task.clone(), json));
                        }
                        for cmd in a {
                            self.replies
                                .push_back((cmd, Reply::Task(Box::new(Ok(s.clone())))));
                        }
                    }
                    None => self.not_answered(&task, peer),
                }
            }
        }
    }

    /// `peer` will not tell anything of `task` (it knows nothing, or it is gone): once no
    /// member asked is left, the requests are answered "not found".
    fn not_answered(&mut self, task: &TaskId, peer: &PeerId) {
        let Some(a) = self.asks.get_mut(task) else {
            return;
        };
        a.waiting.remove(peer);
        if a.waiting.is_empty()
            && let Some(a) = self.asks.remove(task)
        {
            for cmd in a.cmds {
                let r = Err(TaskError::NotFound(task.clone()));
                self.replies.push_back((cmd, Reply::Task(Box::new(r))));
            }
        }
    }

    /// What this node can tell `peer` of `task` without waiting: `Some(answer)` (which may be
    /// "nothing"), or `None` if its archive must be looked at first.
    fn known_status(&self, peer: &PeerId, task: &TaskId) -> Option<Option<serde_json::Value>> {
        let member = |q: &QueueId| {
            self.queues
                .get(q)
                .is_some_and(|q| q.view.members.contains_key(peer))
        };
        if let Ok(s) = self.status_of(task) {
            return Some(
                member(&s.queue)
                    .then(|| serde_json::to_value(&s).ok())
                    .flatten(),
            );
        }
        if let Some(json) = self.recent_archived.get(task) {
            return Some(self.shareable(peer, json));
        }
        None
    }

    /// An archived status, for `peer` if it is a member of the task's queue.
    fn shareable(&self, peer: &PeerId, json: &[u8]) -> Option<serde_json::Value> {
        let s: api::TaskStatus = serde_json::from_slice(json).ok()?;
        self.queues
            .get(&s.queue)
            .is_some_and(|q| q.view.members.contains_key(peer))
            .then(|| serde_json::to_value(&s).ok())
            .flatten()
    }

    /// Sends `peer` this node's answer about `task`.
    fn answer_ask(&mut self, peer: &PeerId, task: &TaskId, status: Option<serde_json::Value>) {
        let frame = Ask::Answer {
            task: task.clone(),
            status,
        }
        .encode();
        self.transmit.push_back((peer.clone(), frame));
    }

    /// Answers a status request once the task's document is here with content.
    fn status_from_doc(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        let Some(doc) = task_doc(&task) else {
            let reply = Err(TaskError::BadId(task.to_string()));
            self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
            return;
        };
        let deadline = now.mono + FIND_TIMEOUT;
        self.wait_for(
            now,
            &doc,
            DocWaiter::Status {
                cmd,
                task,
                wait_until,
                deadline,
            },
        );
    }

    /// The archive's answer for a task (see [`Io::Lookup`]): its final status, or `None` if
    /// it is not archived here, in which case the requests look for its task document.
    pub fn handle_archived(&mut self, now: Time, task: TaskId, status: Option<Vec<u8>>) {
        for peer in self.peer_lookups.remove(&task).unwrap_or_default() {
            let answer = status
                .as_deref()
                .and_then(|json| self.shareable(&peer, json));
            self.answer_ask(&peer, &task, answer);
        }
        let waiting = self.lookups.remove(&task).unwrap_or_default();
        for (cmd, wait_until) in waiting {
            match &status {
                Some(json) => {
                    let reply = archived_status(&task, json);
                    self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
                }
                None if self.inline_task(&task).is_some()
                    || self.unviewed_inline_task(&task).is_some() =>
                {
                    // Indexed meanwhile (its entry arrived), or in a queue document no view
                    // shows yet (submitted while the queue stood still, or not carried yet).
                    self.answer_status(now, cmd, task.clone(), wait_until);
                }
                None => self.status_from_doc(now, cmd, task.clone(), wait_until),
            }
        }
        self.turn(now);
    }

    /// Hands the turn's archive records to the driver, and keeps the latest in memory.
    fn flush_archive(&mut self) {
        if self.to_archive.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.to_archive);
        for (task, json) in &records {
            if self
                .recent_archived
                .insert(task.clone(), json.clone())
                .is_none()
            {
                self.recent_order.push_back(task.clone());
            }
        }
        while self.recent_order.len() > RECENT_ARCHIVED {
            if let Some(t) = self.recent_order.pop_front() {
                self.recent_archived.remove(&t);
            }
        }
        self.io.push_back(Io::Archive { records });
    }

    /// The input (JSON text) of an inline task that the queue's current view indexes.
    fn inline_input(&self, queue: &QueueId, task: &TaskId) -> Option<String> {
        self.queues.get(queue)?.view.task(task)?.input.clone()
    }

    /// The queue and entry of an inline task that a joined queue's current view indexes.
    fn inline_task(&self, task: &TaskId) -> Option<(&QueueId, &Queue, &TaskEntry)> {
        self.queues.iter().find_map(|(id, q)| {
            q.view
                .task(task)
                .filter(|t| t.input.is_some())
                .map(|t| (id, q, t))
        })
    }

    /// An inline task that no queue's view shows but a queue document this node holds does:
    /// one submitted while the queue stands still for its successor's last catch-up (its
    /// current document, frozen view), or written to a sealed epoch and not carried yet. Reads
    /// one entry in each of those documents.
    fn unviewed_inline_task(&self, task: &TaskId) -> Option<(&QueueId, TaskEntry, &Automerge)> {
        self.queues.iter().find_map(|(id, q)| {
            std::iter::once(&q.doc)
                .chain(q.sealed.keys())
                .find_map(|d| {
                    let doc = self.replica.get(d)?;
                    let t = epoch::task_entry(doc, task)?;
                    t.input.is_some().then_some((id, t, doc))
                })
        })
    }

    fn status_of(&self, task: &TaskId) -> Result<api::TaskStatus, TaskError> {
        if let Some((id, q, t)) = self.inline_task(task) {
            return match self.replica.get(&q.doc) {
                Some(d) => Ok(inline_status(id, t, d)),
                None => Err(TaskError::NotFound(task.clone())),
            };
        }
        let in_view = self.queues.values().any(|q| q.view.task(task).is_some());
        if !in_view && let Some((id, t, d)) = self.unviewed_inline_task(task) {
            return Ok(inline_status(id, &t, d));
        }
        let doc = task_doc(task).ok_or_else(|| TaskError::BadId(task.to_string()))?;
        let d = self
            .replica
            .get(&doc)
            .ok_or_else(|| TaskError::NotFound(task.clone()))?;
        let t = task::read(d).map_err(|e| TaskError::NotATask(task.clone(), e))?;
        let q = self
            .queues
            .get(&t.queue)
            .ok_or_else(|| TaskError::NotJoined(task.clone(), t.queue.clone()))?;
        let entry = q.view.task(task);
        let (priority, urgent, max_attempts) = match (entry, &t.summary) {
            (Some(e), _) => (Some(e.priority), Some(e.urgent), Some(e.max_attempts)),
            (None, Some(s)) => (s.priority, s.urgent, s.max_attempts),
            (None, None) => (None, None, None),
        };
        let (state, attempts, error) = match (entry, &t.summary) {
            (Some(entry), _) => (entry.state(), entry.attempts.clone(), last_error(entry)),
            // Finished and no longer carried by the queue's current epoch: its summary.
            (None, Some(s)) => (s.state, s.attempts.clone(), s.error.clone()),
            (None, None) => return Err(TaskError::NotIndexed(task.clone(), t.queue.clone())),
        };
        Ok(api::TaskStatus {
            id: task.clone(),
            queue: t.queue.clone(),
            kind: t.kind.clone(),
            state,
            submitted_at: t.submitted_at,
            submitter: t.submitter.to_string(),
            result: t.result().cloned(),
            input: t.input.clone(),
            priority,
            urgent,
            max_attempts,
            error,
            attempts,
            runs: t.runs,
        })
    }

    fn answer_status(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        match (self.status_of(&task), wait_until) {
            (Ok(s), Some(until)) if !is_done(&s) && now.mono < until => {
                let wait = until.saturating_duration_since(now.mono);
                self.task_waiters.push(TaskWaiter {
                    cmd,
                    task,
                    until,
                    wait,
                });
            }
            (Ok(s), Some(_)) if !is_done(&s) => {
                self.replies.push_back((
                    cmd,
                    Reply::Task(Box::new(Err(TaskError::Timeout(task, Duration::ZERO)))),
                ));
            }
            (r, _) => self.replies.push_back((cmd, Reply::Task(Box::new(r)))),
        }
    }

    fn check_task_waiters(&mut self, now: Time) {
        let waiters = std::mem::take(&mut self.task_waiters);
        for w in waiters {
            let Some(doc) = task_doc(&w.task) else {
                continue;
            };
            if now.mono >= w.until {
                self.replies.push_back((
                    w.cmd,
                    Reply::Task(Box::new(Err(TaskError::Timeout(w.task, w.wait)))),
                ));
                continue;
            }
            let indexed = self.queues.values().any(|q| q.view.task(&w.task).is_some());
            if !indexed && !self.replica.is_loaded(&doc) {
                // It left the current epoch (an inline task, archived once final) or its
                // document left memory: look again.
                self.find_status(now, w.cmd, w.task, Some(w.until));
                continue;
            }
            if !self.replica.is_loaded(&doc) && self.inline_task(&w.task).is_none() {
                // Evicted meanwhile: load it again and answer when it is back.
                let deadline = now.mono + FIND_TIMEOUT;
                self.wait_for(
                    now,
                    &doc,
                    DocWaiter::Status {
                        cmd: w.cmd,
                        task: w.task,
                        wait_until: Some(w.until),
                        deadline,
                    },
                );
                continue;
            }
            match self.status_of(&w.task) {
                Ok(s) if !is_done(&s) => self.task_waiters.push(w),
                r => self.replies.push_back((w.cmd, Reply::Task(Box::new(r)))),
            }
        }
    }

    // ----- routers and the pool -----

    /// Re-reads a queue's view and hands it to the router and the pool.
    fn refresh(&mut self, now: Time, id: &QueueId) {
        if self.queues.get(id).is_some_and(|q| q.frozen) {
            return;
        }
        let switched = self.follow_epochs(now, id);
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let Some(d) = self.replica.get(&q.doc) else {
            return;
        };
        let Some(view) = q.cache.refresh(d).cloned() else {
            tracing::warn!(queue = %id, "the queue document does not read as a queue");
            return;
        };
        if Arc::ptr_eq(&view, &q.view) {
            return;
        }
        let old = std::mem::replace(&mut q.view, view.clone());
        let left = std::mem::replace(&mut q.view_doc, q.doc.clone());
        let qdoc = q.root.clone();
        q.router.handle_view(now.mono, view.clone());
        if let Some(r) = &view.router {
            see(&mut self.seen, id, r);
        }
        // Scope the task documents: live ones are announced to members, final ones travel on
        // request only and may leave memory. Only the tasks this refresh changed are looked at
        // (all of them after a whole read).
        let changed_ids = q.cache.take_changed();
        let changed: Vec<&TaskEntry> = match &changed_ids {
            Changed::Everything => view.tasks().values().map(|t| &**t).collect(),
            Changed::Tasks(ids) => ids.iter().filter_map(|id| view.task(id)).collect(),
        };
        let mut summarize = Vec::new();
        let mut retired = Vec::new();
        for t in changed {
            let tid = &t.id;
            let state = t.state();
            if state == TaskState::InputUnavailable
                && old.task(tid).map(|o| o.state()) != Some(TaskState::InputUnavailable)
            {
                self.to_revive.insert((id.clone(), tid.clone(), t.last_n()));
            }
            let final_now = state.is_final();
            let before = old.task(tid).map(|o| o.state().is_final());
            if before == Some(final_now) {
                continue;
            }
            if t.input.is_some() {
                // Inline: no task document. Its final status is archived (again after a
                // restart: archiving is idempotent), to answer once no epoch carries it.
                if final_now && let Some(d) = self.replica.get(&q.doc) {
                    let status = inline_status(id, t, d);
                    if let Ok(json) = serde_json::to_vec(&status) {
                        self.to_archive.push((tid.clone(), json));
                    }
                }
                continue;
            }
            let Some(td) = task_doc(tid) else { continue };
            self.replica.set_scope(
                &td,
                Scope {
                    group: qdoc.clone(),
                    announce: !final_now,
                    requestable: false,
                },
            );
            if final_now && before == Some(false) {
                summarize.push(td.clone());
            }
            if final_now {
                retired.push(td.clone());
            }
            // Live or final, a task's document leaves memory once saved and idle.
            self.to_evict.insert_if_absent(td, now.mono);
        }
        for td in summarize {
            self.summarize(&view, &td);
        }
        for td in retired {
            self.retire(td, Retired::Task);
        }
        // A member that joined or moved: dial it now rather than at the next round, so that a
        // full mesh forms before the peer everyone bootstrapped from can go away.
        if view.members != old.members {
            let members = view
                .members
                .keys()
                .cloned()
                .chain([self.config.peer.clone()])
                .collect();
            self.replica.set_group(&qdoc, members);
            self.next_dial = now.mono;
        }
        if self.queues.get(id).is_some_and(|q| q.doc != left) {
            self.archive_left_behind(id, &old, &view, &left);
        }
        self.pool.handle_view(id, &view);
        self.prefetch(now, id, &view);
        self.events.push_back(Event::View {
            queue: id.clone(),
            view,
        });
        if switched {
            // Membership is not carried across epochs: a node (re)writes its own.
            self.write_member(now, id);
        }
    }

    /// After a move to a successor: the tasks the old view showed live that the successor
    /// does not hold ended before the successor's copy, in writes this node's view had not
    /// shown yet (a sealer's frozen view, or a follower's view one turn behind). No view of
    /// this node will show them final, so their final status is read from the document left
    /// (or, after a move over several epochs, the sealed one that has it) and archived here:
    /// a status lookup at this node answers for them too.
    fn archive_left_behind(
        &mut self,
        id: &QueueId,
        old: &QueueView,
        new: &QueueView,
        left: &DocId,
    ) {
        let gone: BTreeSet<&TaskId> = old
            .routable()
            .chain(old.retrying())
            .chain(old.input_unavailable())
            .chain(old.with_open_attempts())
            .filter(|t| t.input.is_some() && !t.state().is_final() && new.task(&t.id).is_none())
            .map(|t| &t.id)
            .collect();
        if gone.is_empty() {
            return;
        }
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let docs: Vec<&DocId> = std::iter::once(left)
            .chain(q.sealed.keys().filter(|d| *d != left))
            .collect();
        for tid in gone {
            let found = docs.iter().find_map(|d| {
                let doc = self.replica.get(d)?;
                let entry = epoch::task_entry(doc, tid).filter(|t| t.state().is_final())?;
                Some(inline_status(id, &entry, doc))
            });
            match found.map(|status| serde_json::to_vec(&status)) {
                Some(Ok(json)) => self.to_archive.push((tid.clone(), json)),
                Some(Err(e)) => tracing::warn!(task = %tid, "cannot encode a final status: {e}"),
                None => tracing::debug!(task = %tid, "left an epoch live, final nowhere here"),
            }
        }
    }

    /// Reads ahead the documents of the queue's first pending tasks in routing order, so that
    /// a start does not wait for the disk; the ones that left the window may leave memory.
    fn prefetch(&mut self, now: Time, id: &QueueId, view: &QueueView) {
        let want = PREFETCH_PER_WORKER * self.config.workers as usize;
        // The first pending tasks, of which only those with a task document (not inline) have
        // one to read: filtering first would scan every pending inline task.
        let window: BTreeSet<TaskId> = view
            .routable()
            .take(want)
            .filter(|t| t.input.is_none())
            .map(|t| t.id.clone())
            .collect();
        let old = self.prefetch.remove(id).unwrap_or_default();
        // Only the tasks that entered or left the window: a task id is parsed (and its
        // checksum verified) into a document id once per move, not once per refresh.
        for t in window.difference(&old) {
            if let Some(doc) = task_doc(t)
                && !self.replica.is_loaded(&doc)
            {
                self.replica.fetch(&doc, now.mono);
            }
        }
        for t in old.difference(&window) {
            if let Some(doc) = task_doc(t) {
                self.to_evict.insert_if_absent(doc, now.mono);
            }
        }
        self.prefetch.insert(id.clone(), window);
    }

    // ----- epochs -----

    /// Writes a task's final summary into its document, if this node ran the attempt that
    /// decided it and holds the document: the task's status stays known after the queue
    /// document stops carrying it.
    fn summarize(&mut self, view: &QueueView, td: &DocId) {
        let Some(t) = view.task(&TaskId::new(td.as_str())) else {
            return;
        };
        let decisive = t
            .attempts
            .iter()
            .filter(|a| {
                a.finished.as_ref().is_some_and(|f| {
                    f.outcome.is_failure() || f.outcome == AttemptOutcome::Succeeded
                })
            })
            .max_by_key(|a| a.finished.as_ref().map(|f| (f.outcome, f.at)));
        if decisive.is_none_or(|a| a.worker.peer != self.config.peer) {
            return;
        }
        let summary = task::Summary {
            state: t.state(),
            attempts: t.attempts.clone(),
            error: last_error(t),
            priority: Some(t.priority),
            urgent: Some(t.urgent),
            max_attempts: Some(t.max_attempts),
        };
        self.task_writes.entry(td.clone()).or_default().summary = Some(summary);
    }

    /// Moves a queue to the newest epoch document this node knows of: the winner of its
    /// current document's seals, the winner of a double seal of its own epoch, the newest
    /// epoch its first document records, or the one a router heartbeat announced. A document
    /// that is not here yet is fetched first. True if it moved.
    fn follow_epochs(&mut self, now: Time, id: &QueueId) -> bool {
        let Some(q) = self.queues.get(id) else {
            return false;
        };
        if q.resuming.is_some() {
            return false;
        }
        let cur = q.doc.clone();
        // Every epoch document of the queue this node has heard of and not yet placed.
        let mut names: BTreeSet<DocId> = BTreeSet::new();
        let successors = |d: &Automerge| {
            epoch::read_seals(d)
                .into_iter()
                .filter_map(|s| DocId::parse(&s.successor))
                .collect::<Vec<_>>()
        };
        if let Some(d) = self.replica.get(&cur) {
            names.extend(successors(d));
            if let Some(p) = epoch::read_prev(d)
                .and_then(|p| DocId::parse(&p.doc))
                .and_then(|p| self.replica.get(&p))
            {
                names.extend(successors(p));
            }
        }
        if let Some(l) = self.replica.get(&q.root).and_then(epoch::read_latest) {
            names.extend(DocId::parse(&l.doc));
        }
        names.extend(q.announced.iter().cloned());
        names.retain(|n| *n != cur && !q.rejected.contains(n) && !q.sealed.contains_key(n));
        if names.is_empty() {
            return false;
        }
        let lineage = |d: &DocId| {
            self.replica
                .get(d)
                .map(epoch::read_lineage)
                .unwrap_or_default()
        };
        let mut best = (lineage(&cur), cur.clone(), 0);
        let mut here = Vec::new();
        let mut absent = Vec::new();
        let mut rejected = Vec::new();
        for n in names {
            match self.epoch_here(id, &n) {
                Some(Ok(e)) => {
                    let l = lineage(&n);
                    if epoch::cmp_lineage(&l, &best.0) == std::cmp::Ordering::Greater {
                        best = (l, n.clone(), e);
                    }
                    here.push(n);
                }
                Some(Err(())) => rejected.push(n),
                None => absent.push(n),
            }
        }
        // One found nowhere is not asked for again until a peer connects: asking at every
        // refresh would load it from storage and ask the same peers in a loop.
        for n in absent {
            if self.to_fetch(id, &n) {
                self.fetch_epoch(now, id, &n);
            }
        }
        if let Some(q) = self.queues.get_mut(id) {
            for n in rejected {
                q.announced.remove(&n);
                if q.rejected.len() < MAX_REJECTED_EPOCHS {
                    q.rejected.insert(n);
                }
            }
        }
        let (best_lineage, to, epoch_no) = best;
        // A successor is taken only once this node holds everything its seal covered of the
        // document it continues (this very document, or, moving sideways, one this node holds
        // too): the writes after the seal are then exactly what to carry, at once.
        let sealed_from = self
            .replica
            .get(&to)
            .and_then(epoch::read_prev)
            .and_then(|p| Some((DocId::parse(&p.doc)?, p.heads)));
        let behind = sealed_from.as_ref().is_some_and(|(pd, heads)| {
            to != cur
                && self
                    .replica
                    .get(pd)
                    .is_some_and(|c| epoch::known_heads(c, heads).len() < heads.len())
        });
        if behind
            && let Some((pd, _)) = &sealed_from
            && let Some(q) = self.queues.get_mut(id)
            && q.asked_behind.as_ref().is_none_or(|(d, _)| *d != to)
        {
            // Ask the members for what the seal covered (they may hold it on disk only).
            q.asked_behind = Some((to.clone(), Some(now.mono + BEHIND_WAIT)));
            self.replica.resync_with_members(pd);
        }
        // No member had it within BEHIND_WAIT (every one deleted that document): move
        // without it. The carry out of that document then goes by the successor's covers
        // (`carry_round`), which say what the chain absorbed without the changes.
        let behind = behind
            && !self
                .queues
                .get(id)
                .and_then(|q| q.asked_behind.as_ref())
                .is_some_and(|(d, until)| *d == to && until.is_none());
        // The documents of the target's chain that this node's chain does not share: a move
        // waits until they are here (or found nowhere), so that carrying this node's own late
        // writes can tell what the chain already ended.
        let own = self
            .replica
            .get(&cur)
            .map(epoch::read_lineage)
            .unwrap_or_default();
        let gaps: Vec<DocId> = if to == cur {
            vec![]
        } else {
            best_lineage
                .iter()
                .filter(|l| !own.contains(l) && l.doc != to.as_str())
                .filter_map(|l| DocId::parse(&l.doc))
                .filter(|d| self.to_fetch(id, d))
                .collect()
        };
        // A move to another branch carries what this node's branch wrote since the fork, from
        // every document of it (retired ones too): they must be here first, or a task this
        // branch ended would show live in the target until they are.
        let mut gaps = gaps;
        if to != cur {
            let root = self.queues.get(id).map(|q| q.root.clone());
            let branch = branch_since_fork(&own, &best_lineage, root.as_ref());
            // Moving sideways, the fork too: the last document both chains share, sealed
            // twice. What this node wrote to it after the other side's seal (a task's end) is
            // carried from it, and kept in the target at the move (`Core::keep_ends`): if this
            // node retired it, the target showed the task live again (default seed 5016 with
            // `--relay-ms 100,300`).
            let fork = (!branch.is_empty())
                .then(|| fork_of(&own, &best_lineage))
                .flatten()
                .filter(|d| Some(d) != root.as_ref());
            gaps.extend(
                branch
                    .into_iter()
                    .map(|(d, _)| d)
                    .chain(fork)
                    .filter(|d| self.to_fetch(id, d)),
            );
        }
        // The document `to` continues, if this node no longer holds it (it retired it): the
        // writes it got after `to`'s seal are carried from it, so it must be here first, or
        // a task this node ended there would show live in `to` until it is (partitions seed
        // 2200, once rotations were built off the node's thread).
        if to != cur
            && let Some(pd) = self
                .replica
                .get(&to)
                .and_then(epoch::read_prev)
                .and_then(|p| DocId::parse(&p.doc))
            && pd != cur
            && !gaps.contains(&pd)
            && self.to_fetch(id, &pd)
        {
            gaps.push(pd);
        }
        for d in &gaps {
            self.fetch_epoch(now, id, d);
        }
        let mut switched = to != cur && !behind && gaps.is_empty();
        // Its view is read off this thread first (a copy costs a small fraction of the read):
        // the turn that moves then reads only what changed since.
        let mut cache = None;
        if switched && let Some(q) = self.queues.get_mut(id) {
            match q.primed.take() {
                Some((d, c)) if d == to => cache = Some(c),
                _ if q.priming.as_ref() == Some(&to) => switched = false,
                _ => {
                    if let Some(copy) = self.replica.get(&to).map(|d| Box::new(d.clone())) {
                        self.next_rotate += 1;
                        q.priming = Some(to.clone());
                        self.io.push_back(Io::Rotate(Box::new(Rotate {
                            id: RotateId(self.next_rotate),
                            old: copy,
                            work: RotateWork::Read {
                                queue: id.clone(),
                                doc: to.clone(),
                            },
                        })));
                        switched = false;
                    }
                }
            }
        }
        if to != cur && !switched {
            // Waiting to move: the candidates stay as they are.
            return false;
        }
        if switched {
            self.switch_epoch(now, id, to.clone(), epoch_no, cache, false);
            // Before the view moves: what the old view showed is in the new document as soon
            // as it is shown.
            self.carry_whole = true;
            self.carry_late(now, id);
            self.carry_whole = false;
        }

        // Documents of a losing branch (a double seal's loser and what grew from it): their
        // writes are carried into the current document.
        let ancestors: BTreeSet<String> = best_lineage.iter().map(|l| l.doc.clone()).collect();
        let Some(q) = self.queues.get_mut(id) else {
            return switched;
        };
        for n in here {
            q.announced.remove(&n);
            if n == to || q.sealed.contains_key(&n) {
                continue;
            }
            if ancestors.contains(n.as_str()) {
                // An older epoch of this chain: nothing to follow or carry there.
                if q.rejected.len() < MAX_REJECTED_EPOCHS {
                    q.rejected.insert(n);
                }
                continue;
            }
            q.sealed.insert(
                n.clone(),
                Sealed {
                    into: to.clone(),
                    into_epoch: epoch_no,
                    carried: vec![],
                    dirty: true,
                    epoch: epoch_no,
                    since: now.mono,
                    forwarded: false,
                    retry_at: None,
                },
            );
            self.epoch_docs.insert(n, id.clone());
        }
        switched
    }

    /// Begins a stop ([`Command::Stop`]): the pool starts nothing new, every router stops
    /// (an active one hands its role over), and starts waiting for a task's document are
    /// refused. The answer comes from [`Core::answer_stop`].
    fn stop(&mut self, now: Time, cmd: CommandId, grace: Duration) {
        if let Some(s) = &mut self.stopping {
            if s.answered {
                self.replies
                    .push_back((cmd, Reply::Stopped(s.report.clone())));
            } else {
                s.cmds.push(cmd);
            }
            return;
        }
        self.pool.drain(now.mono);
        let mut handed_over = Vec::new();
        for (id, q) in &mut self.queues {
            let active = q.router.is_active();
            q.router.stop(now.mono);
            // Held while frozen, and never to be carried out now.
            q.deferred.clear();
            if active && let Role::Stopped { handing } = q.router.role() {
                handed_over.push((id.clone(), handing.as_ref().map(|(_, to)| to.clone())));
            }
        }
        // Starts waiting for their task's document will not run here: refused, so that the
        // router routes them elsewhere at once.
        let mut refused = Vec::new();
        for ws in self.doc_waiters.values_mut() {
            ws.retain(|w| match w {
                DocWaiter::Start { run, .. } => {
                    refused.push(run.worker.index);
                    false
                }
                _ => true,
            });
        }
        self.doc_waiters.retain(|_, ws| !ws.is_empty());
        for index in refused {
            self.pool
                .handle_start_failed(index, "the worker's node is stopping".into());
        }
        // At most as long as any wait (an hour): no deadline overflows the clock.
        let grace_until = now.mono + grace.min(MAX_WAIT);
        self.stopping = Some(Stopping {
            cmds: vec![cmd],
            grace_until,
            flush_until: grace_until + crate::STOP_FLUSH_WAIT,
            runs_at_stop: self.runs.len(),
            flush: None,
            report: api::StopReport {
                handed_over,
                ..api::StopReport::default()
            },
            answered: false,
        });
    }

    /// A stopping node's grace time is over: the runs still going are recorded interrupted
    /// (their handlers are abandoned; a later end is ignored), so that their tasks are routed
    /// again at once rather than after their lease.
    fn interrupt_at_grace(&mut self, now: Time) {
        let Some(s) = self.stopping.as_mut() else {
            return;
        };
        if s.answered || now.mono < s.grace_until || self.runs.is_empty() {
            return;
        }
        let runs = std::mem::take(&mut self.runs);
        s.report.runs_interrupted += runs.len();
        for Running { run, .. } in runs.into_values() {
            self.outputs
                .remove(&(run.task.clone(), run.attempt.clone()));
            self.pool.interrupt(
                run.worker.index,
                "the worker's node stopped before the run ended".into(),
            );
        }
    }

    /// Answers a stop once it is done: no run in flight, every start and end written, every
    /// router's hand-over taken up (or the grace time over), and every change on disk; or at
    /// its flush deadline, with what is still unsaved.
    fn answer_stop(&mut self, now: Time) {
        let Some(s) = self.stopping.as_ref().filter(|s| !s.answered) else {
            return;
        };
        let handing = self
            .queues
            .values()
            .any(|q| matches!(q.router.role(), Role::Stopped { handing: Some(_) }));
        let written = self.runs.is_empty()
            && self.starting.is_empty()
            && self.attempt_writes.values().all(Vec::is_empty)
            && self.task_writes.is_empty()
            && self.to_archive.is_empty();
        let flush = match (&s.flush, written) {
            (Some(f), _) => Some(f.clone()),
            (None, true) => Some(self.saves.unsaved()),
            (None, false) => None,
        };
        let unsaved = |f: &[(DocId, u64)]| {
            f.iter()
                .filter(|(doc, v)| !self.saves.is_durable(doc, *v))
                .count()
        };
        let saved = flush.as_ref().is_some_and(|f| unsaved(f) == 0);
        let done = saved && (!handing || now.mono >= s.grace_until);
        let late = now.mono >= s.flush_until;
        let left = match &flush {
            Some(f) => unsaved(f),
            None => self.saves.unsaved().len(),
        };
        let Some(s) = self.stopping.as_mut() else {
            return;
        };
        s.flush = flush;
        if !done && !late {
            return;
        }
        let unsaved = left;
        s.answered = true;
        s.report.runs_finished = s.runs_at_stop.saturating_sub(s.report.runs_interrupted);
        s.report.unsaved_documents = unsaved;
        for cmd in std::mem::take(&mut s.cmds) {
            self.replies
                .push_back((cmd, Reply::Stopped(s.report.clone())));
        }
    }

    /// A reopened queue's remembered epoch document ([`Config::resume`]) is here: the queue
    /// moves to it, as a follower moves to a successor, if it is still on its first document
    /// and `doc` is an epoch of it. From there it follows the chain as any member behind it
    /// does: what it reads is what the chain did while this node was down.
    fn resume_at(&mut self, now: Time, id: &QueueId, doc: &DocId) {
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        q.resuming = None;
        self.stale.insert(id.clone());
        if q.doc != q.root {
            return;
        }
        if let Some(Ok(epoch_no)) = self.epoch_here(id, doc) {
            self.switch_epoch(now, id, doc.clone(), epoch_no, None, true);
        }
    }

    /// Whether epoch document `doc` of queue `id` is to be fetched: it is not here, and was
    /// not found when last asked for.
    fn to_fetch(&self, id: &QueueId, doc: &DocId) -> bool {
        self.replica
            .get(doc)
            .is_none_or(|d| d.get_heads().is_empty())
            && !self
                .queues
                .get(id)
                .is_some_and(|q| q.unavailable.contains(doc))
    }

    /// Whether `doc` is here: `Some(Ok(epoch))` if it is an epoch document of queue `id`,
    /// `Some(Err(()))` if it is something else, `None` if it has not arrived.
    fn epoch_here(&self, id: &QueueId, doc: &DocId) -> Option<Result<u64, ()>> {
        let d = self.replica.get(doc)?;
        if d.get_heads().is_empty() {
            return None;
        }
        Some(match epoch::read_epoch(d) {
            Some((e, Some(origin))) if origin == *id && e > 0 => Ok(e),
            _ => Err(()),
        })
    }

    fn fetch_epoch(&mut self, now: Time, id: &QueueId, doc: &DocId) {
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        if !q.fetching.insert(doc.clone()) {
            return;
        }
        let scope = epoch_scope(&q.root);
        self.replica.set_scope(doc, scope);
        self.wait_for(now, doc, DocWaiter::Epoch { queue: id.clone() });
    }

    /// Makes `to` the queue's current document; the one it leaves is kept as a sealed epoch
    /// whose late writes are carried into `to`.
    /// Moves the queue to document `to`; `cache`, if given, holds `to`'s view read earlier
    /// (the sealer's, read off its thread), else the next refresh reads `to` whole. `resumed`:
    /// a restart back to the document this node was on ([`Config::resume`]), which passes
    /// over the documents between without needing them.
    fn switch_epoch(
        &mut self,
        now: Time,
        id: &QueueId,
        to: DocId,
        epoch_no: u64,
        cache: Option<ViewCache>,
        resumed: bool,
    ) {
        let prev = self.replica.get(&to).and_then(epoch::read_prev);
        let lineage: BTreeSet<String> = self
            .replica
            .get(&to)
            .map(epoch::read_lineage)
            .unwrap_or_default()
            .into_iter()
            .map(|l| l.doc)
            .collect();
        let to_lineage = self
            .replica
            .get(&to)
            .map(epoch::read_lineage)
            .unwrap_or_default();
        let from_lineage = self
            .queues
            .get(id)
            .and_then(|q| self.replica.get(&q.doc))
            .map(epoch::read_lineage)
            .unwrap_or_default();
        // The documents between where this node was and `to` that no member had: deleted
        // everywhere (`keep_sealed_epochs`) while this node was away. It moves past them.
        let missing = to_lineage
            .iter()
            .filter(|_| !resumed)
            .filter(|l| l.doc != to.as_str() && !from_lineage.iter().any(|f| f.doc == l.doc))
            .filter_map(|l| DocId::parse(&l.doc))
            .filter(|d| self.queues.get(id).is_some_and(|q| *d != q.doc))
            .filter(|d| self.epoch_here(id, d).is_none())
            .count();
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let from = std::mem::replace(&mut q.doc, to.clone());
        let from_epoch = q.epoch;
        let sideways =
            !epoch::on_lineage(&to_lineage, from.as_str(), Some(from_epoch)) && from != q.root;
        // Leaving a branch: every document of it since the fork is carried into `to` whole,
        // the ones this node had retired too (a task that ended in one of them may be live
        // in `to`, brought there by a late write of a document both branches share).
        if sideways {
            let fork = fork_of(&from_lineage, &to_lineage)
                .filter(|d| *d != q.root && !q.sealed.contains_key(d))
                .and_then(|d| {
                    let e = from_lineage.iter().find(|l| l.doc == d.as_str())?.epoch;
                    Some((d, e))
                });
            for (d, e) in branch_since_fork(&from_lineage, &to_lineage, Some(&q.root))
                .into_iter()
                .chain(fork)
            {
                if d == from || d == to {
                    continue;
                }
                q.rejected.remove(&d);
                q.sealed.insert(
                    d.clone(),
                    Sealed {
                        into: to.clone(),
                        into_epoch: epoch_no,
                        carried: vec![],
                        dirty: true,
                        epoch: e,
                        since: now.mono,
                        forwarded: false,
                        retry_at: None,
                    },
                );
                self.epoch_docs.insert(d, id.clone());
            }
        }
        q.epoch = epoch_no;
        q.cache = cache.unwrap_or_default();
        q.fetching.remove(&to);
        q.sealed.remove(&to);
        q.announced.remove(&to);
        q.sealed.insert(
            from.clone(),
            Sealed {
                into: to.clone(),
                into_epoch: epoch_no,
                carried: vec![],
                dirty: true,
                epoch: from_epoch,
                since: now.mono,
                forwarded: false,
                retry_at: None,
            },
        );
        // The document `to` continues, if this node had retired it: held again (read back
        // from disk) and carried from `to`'s seal heads. This node's own writes to it after
        // the other side sealed it (a partition) would otherwise never reach `to`.
        if let Some(pd) = prev.as_ref().and_then(|p| DocId::parse(&p.doc))
            && pd != from
            && pd != to
            && !q.sealed.contains_key(&pd)
        {
            q.rejected.remove(&pd);
            q.sealed.insert(
                pd.clone(),
                Sealed {
                    into: to.clone(),
                    into_epoch: epoch_no,
                    carried: vec![],
                    dirty: true,
                    epoch: epoch_no.saturating_sub(1),
                    since: now.mono,
                    forwarded: false,
                    retry_at: None,
                },
            );
            self.epoch_docs.insert(pd, id.clone());
        }
        // Where each sealed document's late writes go now: the document `to` continues
        // carries from `to`'s seal heads; one whose target left `to`'s chain (a losing
        // branch) is carried into `to` whole. Carrying again is harmless.
        let root = q.root.clone();
        for (d, s) in q.sealed.iter_mut() {
            if prev.as_ref().is_some_and(|p| p.doc == d.as_str()) {
                s.into = to.clone();
                s.into_epoch = epoch_no;
                s.carried = prev.as_ref().map(|p| p.heads.clone()).unwrap_or_default();
                s.forwarded = false;
                s.dirty = true;
            } else if s.into != to
                && s.into != root
                && !epoch::on_lineage(&to_lineage, s.into.as_str(), Some(s.into_epoch))
            {
                s.into = to.clone();
                s.into_epoch = epoch_no;
                s.carried = vec![];
                s.forwarded = false;
                s.dirty = true;
            }
        }
        let scope = epoch_scope(&q.root);
        // The chain's earlier documents stay requestable: a member behind a seal catches up
        // from this node's disk, even after a restart.
        let quiet = Scope {
            group: q.root.clone(),
            announce: false,
            requestable: true,
        };
        for d in lineage.iter().filter_map(|d| DocId::parse(d)) {
            if d != to && !q.sealed.contains_key(&d) && self.replica.scope(&d).is_none() {
                self.replica.set_scope(&d, quiet.clone());
            }
        }
        self.replica.set_scope(&to, scope);
        if sideways {
            self.keep_ends(id, &to);
        }
        self.io.push_back(Io::RememberEpoch {
            queue: id.clone(),
            doc: to.clone(),
        });
        self.epoch_docs.insert(to, id.clone());
        self.stale.insert(id.clone());
        self.events.push_back(Event::Epoch {
            queue: id.clone(),
            event: EpochEvent::Switched {
                epoch: epoch_no,
                from: from_epoch,
                sideways,
                missing,
            },
        });
    }

    /// After a move to another branch: a task `to` shows live that a document of this queue
    /// this node holds shows final gets that document's records of it in `to` (its end
    /// first of all), before any view of `to` is read. `to`'s branch may lack the end (its
    /// copy of a document both branches share stopped before it, or the task was brought in
    /// by a carrier that held less); this node's view must not go back to live. The carries
    /// that follow would bring it too, but only in later turns. A sideways move is rare; this
    /// reads `to` whole and each live task's entry in each sealed document held.
    fn keep_ends(&mut self, id: &QueueId, to: &DocId) {
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let Some(live) = self.replica.get(to).and_then(QueueView::read).map(|v| {
            v.tasks()
                .values()
                .filter(|t| !t.state().is_final())
                .map(|t| t.id.clone())
                .collect::<Vec<_>>()
        }) else {
            return;
        };
        let mut by_doc: BTreeMap<DocId, Vec<TaskId>> = BTreeMap::new();
        for t in live {
            let holder = q.sealed.keys().find(|d| {
                self.replica
                    .get(d)
                    .and_then(|doc| epoch::task_state(doc, &t))
                    .is_some_and(|s| s.is_final())
            });
            if let Some(d) = holder {
                by_doc.entry(d.clone()).or_default().push(t);
            }
        }
        for (d, tasks) in by_doc {
            let written = self.replica.change_reading(to, &[&d], |into, docs| {
                docs[0].map(|f| epoch::carry_records(f, into, &tasks))
            });
            match written.flatten() {
                Some(Ok(n)) if n > 0 => self.changed(to),
                Some(Err(e)) => {
                    tracing::warn!(queue = %id, "cannot write the ends {d} holds into {to}: {e}")
                }
                _ => {}
            }
        }
    }

    /// A queue's epoch work for this turn: carry late writes out of the sealed epochs that
    /// changed, and, as the active router, rotate the current document when it is due.
    fn epoch_work(&mut self, now: Time, id: &QueueId) {
        self.carry_late(now, id);
        self.maybe_rotate(now, id);
    }

    /// Carries the late writes of every sealed epoch that changed into its successor.
    fn carry_late(&mut self, now: Time, id: &QueueId) {
        // A carry that brings a task into a document lets what a losing branch recorded of
        // it (its end, say) follow in the same turn: a few rounds at most.
        for _ in 0..MAX_CARRY_ROUNDS {
            if !self.carry_round(now, id) {
                break;
            }
        }
    }

    /// Whether this node holds every change document `doc` of a chain (`lineage`) had when it
    /// was sealed into the next document of that chain: the seal heads, read from the next
    /// document's `prev` or from `doc`'s own seal. True when they are not known here.
    fn holds_sealed_state(&self, doc: &DocId, lineage: &[Link]) -> bool {
        let Some(d) = self.replica.get(doc) else {
            return true;
        };
        let epoch = epoch::read_epoch(d).map_or(0, |e| e.0);
        let Some(next) = lineage
            .iter()
            .filter(|l| l.epoch > epoch)
            .min_by_key(|l| l.epoch)
        else {
            return true;
        };
        let heads = DocId::parse(&next.doc)
            .and_then(|n| self.replica.get(&n))
            .and_then(epoch::read_prev)
            .filter(|p| p.doc == doc.as_str())
            .map(|p| p.heads)
            .or_else(|| epoch::seal_heads(d, &next.doc));
        heads.is_none_or(|h| epoch::known_heads(d, &h).len() == h.len())
    }

    /// Whether sealed document `from` is off the chain of `into` (a losing branch's): its
    /// late writes are carried whole.
    fn off_chain(&self, id: &QueueId, from: &DocId, into: &DocId) -> bool {
        let Some(target) = self.replica.get(into) else {
            return false;
        };
        let root = self.queues.get(id).map(|q| &q.root);
        let from_epoch = self
            .replica
            .get(from)
            .and_then(epoch::read_epoch)
            .map(|e| e.0);
        root != Some(from)
            && epoch::read_prev(target).is_none_or(|p| p.doc != from.as_str())
            && !epoch::on_lineage(&epoch::read_lineage(target), from.as_str(), from_epoch)
    }

    /// For a losing branch `from` carried into `into` (whose chain this node holds as
    /// `chain`): the documents its task entries came from that this node holds, each with
    /// what `into`'s chain absorbed of it. `None` when the chain holds no cover of `from`'s
    /// predecessor (a fork older than `epoch::COVER_EPOCHS`, or documents written before
    /// covers): the carry then needs the chain since the fork. `Err` while the predecessor
    /// is being read from disk or asked for (looked at again after [`CARRY_RETRY`]).
    fn loser_bases(
        &mut self,
        now: Time,
        id: &QueueId,
        from: &DocId,
        into: &DocId,
        chain: &[DocId],
    ) -> Result<Option<LoserBases>, Waiting> {
        let chain_cover = |this: &Self, of: &str| {
            std::iter::once(into)
                .chain(chain.iter())
                .filter_map(|d| this.replica.get(d))
                .filter_map(|d| epoch::read_cover(d, of))
                .reduce(|mut a, b| {
                    a.merge(&b);
                    a
                })
        };
        let Some(f) = self.replica.get(from) else {
            return Ok(None);
        };
        let Some(prev) = epoch::read_prev(f).and_then(|p| DocId::parse(&p.doc)) else {
            return Ok(None);
        };
        let own = epoch::read_covers(f);
        if chain_cover(self, prev.as_str()).is_none() {
            return Ok(None);
        }
        // The predecessor is read from disk, or asked for, unless no one has it.
        if self
            .replica
            .get(&prev)
            .is_none_or(|p| p.get_heads().is_empty())
            && self.to_fetch(id, &prev)
        {
            self.fetch_epoch(now, id, &prev);
            self.carry_later(now, id, from);
            return Err(Waiting);
        }
        let mut docs = vec![];
        let mut all_absorbed = true;
        for (other, need) in &own {
            let absorbed = chain_cover(self, other);
            all_absorbed &= absorbed.as_ref().is_some_and(|a| a.includes(need));
            if let (Some(d), Some(a)) = (DocId::parse(other), absorbed)
                && self
                    .replica
                    .get(&d)
                    .is_some_and(|x| !x.get_heads().is_empty())
            {
                docs.push((d, a));
            }
        }
        Ok(Some(LoserBases { docs, all_absorbed }))
    }

    /// Marks sealed document `from` to be carried again after [`CARRY_RETRY`].
    fn carry_later(&mut self, now: Time, id: &QueueId, from: &DocId) {
        if let Some(s) = self.queues.get_mut(id).and_then(|q| q.sealed.get_mut(from)) {
            s.dirty = true;
            s.retry_at = Some(now.mono + CARRY_RETRY);
        }
    }

    /// One round of [`Self::carry_late`]: the documents of the target's chain first, then the
    /// losing branches'. True if a carry brought tasks into a document that a losing branch
    /// carries into, which is then carried again whole.
    fn carry_round(&mut self, now: Time, id: &QueueId) -> bool {
        let Some(q) = self.queues.get_mut(id) else {
            return false;
        };
        let mut dirty: Vec<(DocId, DocId, Vec<ChangeHash>, bool)> = q
            .sealed
            .iter_mut()
            .filter(|(_, s)| s.dirty && s.retry_at.is_none_or(|t| now.mono >= t))
            .map(|(d, s)| {
                s.dirty = false;
                s.retry_at = None;
                (d.clone(), s.into.clone(), s.carried.clone(), s.forwarded)
            })
            .collect();
        // Nothing written to one since its last carry: carrying again would find no change
        // to carry (and its claims were seen then). Most marks are of this kind (a document
        // of the chain arrived, a peer's sync brought nothing new).
        dirty.retain(|(from, _, since, _)| {
            !self.replica.get(from).is_some_and(|d| {
                let heads = d.get_heads();
                !heads.is_empty() && same_heads(heads, since)
            })
        });
        // The chain first: a task a late write of the chain brings back in is there when a
        // losing branch's record of its end is carried.
        dirty.sort_by_cached_key(|(from, into, _, _)| self.off_chain(id, from, into));
        // The documents that carries brought tasks into, and from where.
        let mut grown: BTreeMap<DocId, BTreeSet<DocId>> = BTreeMap::new();
        for (from, into, since, forwarded) in dirty {
            if self
                .replica
                .get(&from)
                .is_none_or(|d| d.get_heads().is_empty())
            {
                // Not in memory (a retired document a move brought back): load it first,
                // unless no one has it.
                if self.to_fetch(id, &from) {
                    self.fetch_epoch(now, id, &from);
                }
                continue;
            }
            // Claims written into a sealed epoch still fence.
            if let Some(c) = self.replica.get(&from).and_then(epoch::effective_claim) {
                see(&mut self.seen, id, &c);
            }
            let Some(target) = self.replica.get(&into) else {
                continue;
            };
            let prev = epoch::read_prev(target);
            let lineage = epoch::read_lineage(target);
            let root = self.queues.get(id).map(|q| q.root.clone());
            let from_epoch = self
                .replica
                .get(&from)
                .and_then(epoch::read_epoch)
                .map_or(0, |e| e.0);
            // A forwarded document carries as if into its direct successor, from the heads it
            // carried along the chain before (see `Sealed::forwarded`).
            let direct = forwarded || prev.as_ref().is_some_and(|p| p.doc == from.as_str());
            let ancestor = root.as_ref() == Some(&from)
                || epoch::on_lineage(&lineage, from.as_str(), Some(from_epoch));
            // The documents of the target's chain this node holds, newer than `from` if `from`
            // is on it: a task one of them indexes was carried along the chain already.
            let chain: Vec<DocId> = lineage
                .iter()
                .filter(|l| l.doc != into.as_str() && (!ancestor || l.epoch > from_epoch))
                .filter_map(|l| DocId::parse(&l.doc))
                .chain(root.clone().filter(|_| !ancestor))
                .filter(|d| {
                    *d != from
                        && self
                            .replica
                            .get(d)
                            .is_some_and(|x| !x.get_heads().is_empty())
                })
                .collect();
            // A carrier that jumped epochs (a restart) must see every document of the chain
            // between: a task carried along it and dropped there would otherwise come back.
            // A carrier from a losing branch must see every document of the target's chain
            // since the fork, for the same reason.
            let from_lineage = self
                .replica
                .get(&from)
                .map(epoch::read_lineage)
                .unwrap_or_default();
            let fork = lineage
                .iter()
                .find(|l| !from_lineage.contains(l))
                .map_or(u64::MAX, |l| l.epoch);
            // What the target's chain absorbed of `from` (`epoch::Cover`): with it, a task
            // entry of `from` tells by itself whether the chain knew the task, and the carry
            // needs neither the documents between nor the changes of `from` it lacks. A
            // losing branch's entries were written by its own sealer: it still needs the
            // chain since the fork.
            let cover = std::iter::once(&into)
                .chain(chain.iter())
                .filter_map(|d| self.replica.get(d))
                .filter_map(|d| epoch::read_cover(d, from.as_str()))
                .reduce(|mut a, b| {
                    a.merge(&b);
                    a
                });
            // A losing branch carries without the chain since the fork when the target's
            // chain holds a cover of its predecessor: a task entry found in a document the
            // branch came from or carried from (those here) was absorbed, or not, by its
            // entry there; one the branch took from a document not here, if the chain
            // absorbed all the branch did of them (`epoch::Cover::includes`).
            let loser = if direct || ancestor {
                None
            } else {
                match self.loser_bases(now, id, &from, &into, &chain) {
                    Ok(b) => b,
                    Err(Waiting) => continue,
                }
            };
            let covered = (cover.is_some() && (direct || ancestor)) || loser.is_some();
            let (bases, all_absorbed) = loser.map_or((vec![], false), |l| (l.docs, l.all_absorbed));
            let needed_from = match (direct, ancestor) {
                _ if covered => None,
                (true, _) => None,
                (false, true) => Some(from_epoch + 1),
                (false, false) => Some(fork.saturating_sub(1)),
            };
            if let Some(first) = needed_from {
                // Every one of them: without one, a task carried into it and ended there
                // would come back. One that no connected peer had is asked for again when a
                // peer connects (`Core::handle_connected`); until then nothing is carried.
                let lacking: Vec<DocId> = lineage
                    .iter()
                    .filter(|l| l.epoch >= first && l.doc != into.as_str())
                    .filter_map(|l| DocId::parse(&l.doc))
                    .filter(|d| self.replica.get(d).is_none_or(|x| x.get_heads().is_empty()))
                    .collect();
                if !lacking.is_empty() {
                    let mut asked = false;
                    for d in lacking
                        .iter()
                        .filter(|d| self.to_fetch(id, d))
                        .cloned()
                        .collect::<Vec<_>>()
                    {
                        self.fetch_epoch(now, id, &d);
                        asked = true;
                    }
                    if asked {
                        self.carry_later(now, id, &from);
                    }
                    continue;
                }
            }
            // Where `from` was sealed into the target's chain: the seal heads.
            let heads = if forwarded {
                Some(since.clone())
            } else if direct {
                prev.as_ref().map(|p| p.heads.clone())
            } else if ancestor {
                let next = lineage
                    .iter()
                    .filter(|l| l.epoch > from_epoch)
                    .min_by_key(|l| l.epoch)
                    .map(|l| l.doc.clone());
                // The seal heads: from the next document of the chain (its `prev`), or from
                // the seal in `from` (a carrier that missed the seal lacks the latter).
                let via_next = next
                    .as_ref()
                    .and_then(|n| DocId::parse(n))
                    .and_then(|n| self.replica.get(&n))
                    .and_then(epoch::read_prev)
                    .filter(|p| p.doc == from.as_str())
                    .map(|p| p.heads);
                via_next.or_else(|| {
                    self.replica
                        .get(&from)
                        .zip(next)
                        .and_then(|(d, n)| epoch::seal_heads(d, &n))
                })
            } else {
                None
            };
            // A carrier behind the seal (it lacks some of the changes the seal covered) cannot
            // tell a late submit from a task that ended before the seal: it waits for them.
            if let (Some(h), Some(f)) = (&heads, self.replica.get(&from))
                && !covered
                && epoch::known_heads(f, h).len() < h.len()
            {
                self.replica.resync_with_members(&from);
                continue;
            }
            // The same for the chain's documents: one this node holds only in part (its own
            // messages were lost while the others wrote it) may lack a task that was carried
            // into it, ran and ended there; that task would come back. Each must have what it
            // held when it was sealed into the next.
            let behind: Vec<DocId> = chain
                .iter()
                .filter(|_| !covered)
                .filter(|d| !self.holds_sealed_state(d, &lineage))
                .cloned()
                .collect();
            if !behind.is_empty() {
                for d in &behind {
                    self.replica.resync_with_members(d);
                }
                // Looked at again later (their changes do not mark `from`).
                self.carry_later(now, id, &from);
                continue;
            }
            let from_loser = !direct && !ancestor;
            // Into its direct successor, a carry starts where any carrier's marked carry
            // ended, and marks its own: the sealer's carries then spare the others theirs.
            let mark = (direct && !forwarded).then(|| from.to_string());
            let mut since = since;
            // An ancestor not carried yet (a node that moved past its successor, straight to a
            // later epoch) starts at its seal: what it held then was sealed into the chain,
            // and carrying it again writes nothing (every task it knew then is in the target
            // or `dropped`). From its first change instead, the carry looks at the whole
            // epoch's history: half a second in one turn at 2,000 live tasks.
            if since.is_empty()
                && ancestor
                && !direct
                && let Some(h) = &heads
            {
                since = h.clone();
            }
            if let Some(m) = &mark
                && let Some(t) = self.replica.get(&into)
            {
                since.extend(epoch::carried_marks(t, m));
            }
            // Within the turn's budget, unless the view shows what is carried (see
            // `Core::carry_whole`): the rest at the next turns.
            let limit = if self.carry_whole {
                usize::MAX
            } else {
                self.carry_budget
            };
            if limit == 0 {
                if let Some(s) = self
                    .queues
                    .get_mut(id)
                    .and_then(|q| q.sealed.get_mut(&from))
                {
                    s.dirty = true;
                }
                self.carry_again = Some(now.mono);
                continue;
            }
            let mut others: Vec<&DocId> = vec![&from];
            others.extend(chain.iter());
            others.extend(bases.iter().map(|(d, _)| d));
            let carried = self.replica.change_reading(&into, &others, |d, docs| {
                let f = docs[0]?;
                let held: Vec<&Automerge> =
                    docs[1..=chain.len()].iter().flatten().copied().collect();
                let based: Vec<(&Automerge, &epoch::Cover)> = docs[chain.len() + 1..]
                    .iter()
                    .zip(&bases)
                    .filter_map(|(d, (_, c))| Some(((*d)?, c)))
                    .collect();
                let dropped = |t: &TaskId| {
                    if held.iter().any(|h| epoch::indexes(*h, t))
                        || cover
                            .as_ref()
                            .is_some_and(|c| epoch::entry_covered(f, c, t))
                    {
                        return true;
                    }
                    // A losing branch's task that came from a document the chain absorbed
                    // too: as that document's entry says.
                    if let Some((b, c)) = based.iter().find(|(b, _)| epoch::indexes(*b, t)) {
                        return epoch::entry_covered(b, c, t);
                    }
                    // One the branch took from a document not here (its build, a carry):
                    // absorbed if the chain absorbed all the branch did.
                    if covered && !(ancestor || direct) && epoch::entry_carried(f, t) {
                        return all_absorbed;
                    }
                    match (&heads, ancestor || direct) {
                        (Some(h), _) => epoch::known_at(f, h, t),
                        // On the chain, but the seal is not here: never bring back a task
                        // that ended (at worst a live one runs again).
                        (None, true) => epoch::task_state(f, t).is_some_and(|s| s.is_final()),
                        // A losing branch: a task no document of the chain indexes was
                        // submitted on that branch.
                        (None, false) => false,
                    }
                };
                Some(epoch::carry_covering(
                    f,
                    &since,
                    d,
                    &dropped,
                    mark.as_deref(),
                    Some((from.as_str(), from_epoch)),
                    limit,
                ))
            });
            match carried.flatten() {
                Some(Ok(c)) => {
                    self.carried_changes += c.changes as u64;
                    if !self.carry_whole {
                        self.carry_budget = self.carry_budget.saturating_sub(c.changes);
                    }
                    if c.more {
                        self.carry_again = Some(now.mono);
                    }
                    if c.tasks > 0 {
                        grown.entry(into.clone()).or_default().insert(from.clone());
                    }
                    if c.writes > 0 {
                        self.changed(&into);
                        self.events.push_back(Event::Epoch {
                            queue: id.clone(),
                            event: EpochEvent::Carried {
                                writes: c.writes,
                                from_loser,
                            },
                        });
                    }
                    if let Some(s) = self
                        .queues
                        .get_mut(id)
                        .and_then(|q| q.sealed.get_mut(&from))
                    {
                        s.carried = c.heads;
                        s.dirty |= c.more;
                    }
                }
                Some(Err(e)) => tracing::warn!(queue = %id, "cannot carry late writes: {e}"),
                // The predecessor is not here: nothing can tell a late submit from a task
                // finished before the seal, so nothing is carried.
                None => {}
            }
        }
        // A losing branch's records of a task that was not in the target when they were
        // carried were left behind: carry the branch again whole (carrying is idempotent).
        let again: Vec<DocId> = self.queues.get(id).map_or(vec![], |q| {
            q.sealed
                .iter()
                .filter(|(d, s)| {
                    grown
                        .get(&s.into)
                        .is_some_and(|g| g.iter().any(|f| f != *d))
                        && self.off_chain(id, d, &s.into)
                })
                .map(|(d, _)| d.clone())
                .collect()
        });
        let Some(q) = self.queues.get_mut(id) else {
            return false;
        };
        for d in &again {
            if let Some(s) = q.sealed.get_mut(d) {
                s.dirty = true;
                s.carried = vec![];
            }
        }
        !again.is_empty()
    }

    /// As the queue's active router, asks for a successor of the current epoch holding what is
    /// live, once its finished tasks outweigh the live ones ([`epoch::should_rotate`]). The
    /// successor is built off this thread ([`Io::Rotate`]); [`Core::handle_rotated`] seals.
    fn maybe_rotate(&mut self, now: Time, id: &QueueId) {
        if self.rotating.values().any(|r| r.queue == *id) {
            return;
        }
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let Role::Active { claim, .. } = q.router.role() else {
            return;
        };
        // The successor is built from the view and sealed at the heads of the document it
        // was read with: a view behind the document (a carry or a peer's change since its
        // refresh) would leave out tasks the seal covers, and those are never carried
        // afterwards.
        if self.stale.contains(id) {
            return;
        }
        let view = q.view.clone();
        if view.router.as_ref() != Some(claim)
            || !view.routable_version()
            || !view.seals.is_empty()
            || !epoch::should_rotate(
                &view.counts(),
                self.config.rotate_ratio,
                self.config.rotate_min_live,
            )
        {
            return;
        }
        let claim = claim.clone();
        let (old, epoch_no) = (q.doc.clone(), q.epoch + 1);
        let Some(old_doc) = self.replica.get(&old) else {
            return;
        };
        if !epoch::read_seals(old_doc).is_empty() {
            return;
        }
        // A copy costs a small fraction of the build.
        let copy = Box::new(old_doc.clone());
        let heads = copy.get_heads();
        let successor = DocId::generate(&mut self.rng);
        self.next_rotate += 1;
        let rid = RotateId(self.next_rotate);
        self.rotating.insert(
            rid,
            Rotating {
                queue: id.clone(),
                prev: old.clone(),
                successor: successor.clone(),
                epoch: epoch_no,
                claim: claim.clone(),
                heads,
                catch_ups: 0,
                last: None,
            },
        );
        self.io.push_back(Io::Rotate(Box::new(Rotate {
            id: rid,
            old: copy,
            work: RotateWork::Build {
                view,
                succ: Box::new(self.new_doc()),
                origin: id.clone(),
                prev: old,
                successor,
                epoch: epoch_no,
                claim,
                now_ms: now.unix_ms,
            },
        })));
    }

    /// The answer to [`Io::Rotate`]: brings the successor up to date off this thread again
    /// if the document moved on meanwhile (`Config::catch_ups` times, then once more with the
    /// queue frozen: see [`Queue::frozen`]), then seals the
    /// current epoch into it, unless the rotation no longer holds (this node is no longer the
    /// active router with the same claim, it moved to another epoch, or someone sealed the
    /// document meanwhile); then the successor is dropped unseen. What the router wrote after
    /// the last copy (and peers' writes) is carried into it like any late write (the seal
    /// names the first copy's heads).
    pub fn handle_rotated(&mut self, now: Time, built: Built) {
        match built.outcome {
            Outcome::Read { queue, doc, cache } => {
                if let Some(q) = self.queues.get_mut(&queue)
                    && q.priming.as_ref() == Some(&doc)
                {
                    q.priming = None;
                    q.primed = Some((doc, *cache));
                    self.stale.insert(queue);
                }
            }
            Outcome::Successor(result) => {
                if let Some(r) = self.rotating.remove(&built.id) {
                    self.rotated(now, r, built.id, result);
                }
            }
        }
        self.turn(now);
    }

    fn rotated(
        &mut self,
        now: Time,
        mut r: Rotating,
        rid: RotateId,
        result: Result<Box<Successor>, String>,
    ) {
        let id = r.queue.clone();
        if r.last.is_some()
            && let Some(q) = self.queues.get_mut(&id)
        {
            // Whatever happens next, in this call: sealed or dropped.
            q.frozen = false;
            self.stale.insert(id.clone());
        }
        let Some(q) = self.queues.get(&id) else {
            return;
        };
        let holds = matches!(q.router.role(), Role::Active { claim, .. } if *claim == r.claim)
            && q.doc == r.prev
            && self
                .replica
                .get(&r.prev)
                .is_some_and(|d| epoch::read_seals(d).is_empty());
        if !holds {
            tracing::debug!(queue = %id, "a rotation no longer holds; its successor is dropped");
            return;
        }
        let succ = match result {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(queue = %id, "cannot rotate the queue document: {e}");
                return;
            }
        };
        let old = self.replica.get(&r.prev).map(|d| (d.get_heads(), d));
        if let Some((heads, doc)) = old
            && heads != succ.carried
            && r.last.is_none()
        {
            let copy = Box::new(doc.clone());
            r.catch_ups += 1;
            if r.catch_ups > self.config.catch_ups {
                // The last: writes go on as fast as a catch-up carries them, so the document
                // stands still for this one (see `Queue::frozen`).
                r.last = Some(now.mono + FROZEN_AT_MOST);
                if let Some(q) = self.queues.get_mut(&id) {
                    q.frozen = true;
                }
            }
            self.rotating.insert(rid, r);
            self.io.push_back(Io::Rotate(Box::new(Rotate {
                id: rid,
                old: copy,
                work: RotateWork::CatchUp(succ),
            })));
            return;
        }
        self.seal_rotation(now, r, succ);
    }

    fn seal_rotation(&mut self, now: Time, r: Rotating, built: Box<Successor>) {
        let id = &r.queue;
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let root = q.root.clone();
        let Successor {
            doc: succ,
            rotated,
            cache,
            carried,
            ..
        } = *built;
        let succ_id = r.successor.clone();
        self.replica
            .create(succ_id.clone(), succ, Some(epoch_scope(&root)));
        self.epoch_docs.insert(succ_id.clone(), id.clone());
        self.saves.changed(&succ_id);
        let seal = Seal {
            claim: r.claim.clone(),
            successor: succ_id.to_string(),
            epoch: r.epoch,
        };
        let heads = r.heads.clone();
        if let Some(Err(e)) = self.change(&r.prev, |d| epoch::seal(d, &seal, &heads)) {
            tracing::warn!(queue = %id, "cannot seal the queue document: {e}");
        }
        let latest = Latest {
            epoch: r.epoch,
            doc: succ_id.to_string(),
        };
        if let Some(Err(e)) = self.change(&root, |d| epoch::set_latest(d, &latest)) {
            tracing::warn!(queue = %id, "cannot record the newest epoch: {e}");
        }
        self.events.push_back(Event::Epoch {
            queue: id.clone(),
            event: EpochEvent::Rotated {
                epoch: r.epoch,
                carried: rotated.carried,
                dropped: rotated.dropped,
            },
        });
        self.switch_epoch(now, id, succ_id, r.epoch, Some(cache), false);
        // The successor holds what the last catch-up carried: the rest is carried now.
        if let Some(s) = self
            .queues
            .get_mut(id)
            .and_then(|q| q.sealed.get_mut(&r.prev))
        {
            s.carried = carried;
        }
        // What was written after the copy (here or by peers) goes into the successor before
        // its view is first read: no task seems to step back.
        self.carry_late(now, id);
    }

    /// Drops the rotations whose last catch-up has not come back in time, and thaws their
    /// queues.
    fn expire_frozen(&mut self, now: Time) {
        for (id, q) in &mut self.queues {
            if let Some((_, until)) = &mut q.asked_behind
                && until.is_some_and(|u| now.mono >= u)
            {
                *until = None;
                self.stale.insert(id.clone());
            }
        }
        let late: Vec<RotateId> = self
            .rotating
            .iter()
            .filter(|(_, r)| r.last.is_some_and(|d| now.mono >= d))
            .map(|(id, _)| *id)
            .collect();
        for rid in late {
            if let Some(r) = self.rotating.remove(&rid) {
                tracing::warn!(queue = %r.queue, "a rotation's last catch-up did not come back; it is dropped");
                if let Some(q) = self.queues.get_mut(&r.queue) {
                    q.frozen = false;
                }
                self.stale.insert(r.queue);
            }
        }
    }

    /// Drops sealed epochs this node moved past more than `Config::epoch_retain` ago (never the
    /// queue's first document) from its chain; they then leave memory like any idle document.
    fn retire_epochs(&mut self, now: Time) {
        let mut gone = Vec::new();
        let retain = self.config.epoch_retain;
        for (id, q) in &mut self.queues {
            let root = q.root.clone();
            // Beyond MAX_SEALED_HELD, the oldest clean ones go whatever their age.
            let mut clean: Vec<(Instant, u64, DocId)> = q
                .sealed
                .iter()
                .filter(|(d, s)| **d != root && !s.dirty)
                .map(|(d, s)| (s.since, s.epoch, d.clone()))
                .collect();
            clean.sort();
            let excess = clean.len().saturating_sub(MAX_SEALED_HELD);
            let crowded: BTreeSet<DocId> = clean.into_iter().take(excess).map(|c| c.2).collect();
            q.sealed.retain(|d, s| {
                let keep = *d == root
                    || s.dirty
                    || (now.mono.saturating_duration_since(s.since) < retain
                        && !crowded.contains(d));
                if !keep {
                    gone.push((id.clone(), d.clone(), s.epoch));
                }
                keep
            });
            // Carried out and done with: never followed or carried from again (a peer that
            // still names one would otherwise bring it back, and with it tasks that ended
            // since).
            for (_, d, _) in gone.iter().filter(|(q, _, _)| q == id) {
                if q.rejected.len() >= MAX_REJECTED_EPOCHS {
                    q.rejected.pop_first();
                }
                q.rejected.insert(d.clone());
            }
            // A document still held (the queue's first, or a loser) whose late writes went
            // into a retired one now carries into the current document: the retired one is
            // carried from no more, so what reached it later would stay there.
            let (cur, cur_epoch) = (q.doc.clone(), q.epoch);
            for s in q.sealed.values_mut() {
                if gone.iter().any(|(g, d, _)| g == id && *d == s.into) {
                    s.into = cur.clone();
                    s.into_epoch = cur_epoch;
                    s.forwarded = !s.carried.is_empty();
                    s.dirty = true;
                }
            }
        }
        for (id, doc, epoch_no) in gone {
            self.epoch_docs.remove(&doc);
            self.retire(doc.clone(), Retired::Epoch);
            // No longer announced, but still served from disk to a member that asks: one
            // that comes back behind the seal catches up through it.
            if let Some(root) = self.queues.get(&id).map(|q| q.root.clone()) {
                self.replica.set_scope(
                    &doc,
                    Scope {
                        group: root,
                        announce: false,
                        requestable: true,
                    },
                );
            }
            self.to_evict.insert_if_absent(doc, now.mono);
            self.events.push_back(Event::Epoch {
                queue: id,
                event: EpochEvent::Evicted { epoch: epoch_no },
            });
        }
    }

    /// Carries out the routers' and the pool's actions; true if there were any.
    fn drain_actions(&mut self, now: Time) -> bool {
        let mut acted = false;
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in &ids {
            let frozen = self.queues.get(id).is_some_and(|q| q.frozen);
            if !frozen {
                let held = self
                    .queues
                    .get_mut(id)
                    .map(|q| std::mem::take(&mut q.deferred))
                    .unwrap_or_default();
                for (at_ms, action) in held {
                    acted = true;
                    self.router_action(now, id, action, at_ms);
                }
            }
            while let Some(action) = self.queues.get_mut(id).and_then(|q| q.router.poll_action()) {
                match action {
                    RouterAction::Beat(_) => self.router_action(now, id, action, now.unix_ms),
                    _ if frozen => {
                        if let Some(q) = self.queues.get_mut(id) {
                            q.deferred.push((now.unix_ms, action));
                        }
                    }
                    _ => self.router_action(now, id, action, now.unix_ms),
                }
                acted = true;
            }
            if let Some(q) = self.queues.get_mut(id) {
                while let Some(event) = q.router.poll_event() {
                    self.events.push_back(Event::Router {
                        queue: id.clone(),
                        event,
                    });
                }
            }
        }
        while let Some(action) = self.pool.poll_action() {
            acted = true;
            self.pool_action(now, action);
        }
        acted
    }

    /// Writes to a queue document and refreshes its view at once (routers must see their own
    /// writes before deciding again).
    /// The queue document's view at its current heads, from its cache (refreshed if the
    /// document changed since: costs in what changed; the changes it finds are handled by the
    /// queue's next refresh). `None` if the document is not here or reads as no queue.
    fn current_view(&mut self, id: &QueueId) -> Option<Arc<QueueView>> {
        let q = self.queues.get_mut(id)?;
        if q.frozen {
            return Some(q.view.clone());
        }
        let d = self.replica.get(&q.doc)?;
        q.cache.refresh(d).cloned()
    }

    fn write_queue<E: std::fmt::Display>(
        &mut self,
        now: Time,
        id: &QueueId,
        what: &str,
        f: impl FnOnce(&mut Automerge) -> Result<(), E>,
    ) {
        let Some(doc) = self.queues.get(id).map(|q| q.doc.clone()) else {
            return;
        };
        match self.change(&doc, f) {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::warn!(queue = %id, "cannot record {what}: {e}"),
            None => tracing::warn!(queue = %id, "cannot record {what}: queue document not loaded"),
        }
        self.stale.remove(id);
        self.refresh(now, id);
    }

    /// Carries out a router's action, decided at `at_ms` (unix ms: earlier than `now` for an
    /// action held while the queue was frozen). Assignments are recorded as made then, when
    /// the router counted them against its rate interval.
    fn router_action(&mut self, now: Time, id: &QueueId, action: RouterAction, at_ms: u64) {
        match action {
            RouterAction::Claim(claim) => {
                self.write_queue(now, id, "a router claim", |d| {
                    queue::claim_router(d, &claim, now.unix_ms)
                });
            }
            RouterAction::Assign(list) => {
                // Checked against the cached view, as a turn's starts and ends are.
                let view = self.current_view(id);
                self.write_queue(now, id, "assignments", |d| match &view {
                    Some(v) => queue::record_assignments_in_view(d, v, &list, at_ms),
                    None => queue::record_assignments(d, &list, at_ms),
                });
            }
            RouterAction::Beat(mut beat) => {
                self.pool.handle_router_beat(&beat);
                see(&mut self.seen, id, &beat.claim);
                if let Some(q) = self.queues.get(id) {
                    if q.epoch > 0 {
                        beat.epoch = Some(Latest {
                            epoch: q.epoch,
                            doc: q.doc.to_string(),
                        });
                    }
                    self.io.push_back(Io::Publish {
                        topic: q.topic.clone(),
                        data: Wire::Router(beat).encode(),
                    });
                }
            }
        }
    }

    fn pool_action(&mut self, now: Time, action: PoolAction) {
        match action {
            PoolAction::Start(run) => {
                if let Some(input) = self.inline_input(&run.queue, &run.task) {
                    let input = match serde_json::from_str(&input) {
                        Ok(v) => v,
                        Err(e) => {
                            self.pool.handle_start_failed(
                                run.worker.index,
                                format!("unreadable inline input: {e}"),
                            );
                            return;
                        }
                    };
                    self.start_with(run, input);
                    return;
                }
                let Some(doc) = task_doc(&run.task) else {
                    self.pool.handle_start_failed(
                        run.worker.index,
                        format!("{} is not a task id", run.task),
                    );
                    return;
                };
                let since = now.mono;
                self.wait_for(now, &doc, DocWaiter::Start { run, since });
            }
            PoolAction::Finish {
                worker,
                queue: qid,
                task,
                attempt,
                outcome,
                error,
                started_by,
            } => {
                if outcome == AttemptOutcome::Refused || outcome == AttemptOutcome::Interrupted {
                    self.events.push_back(Event::NotRun {
                        task: task.clone(),
                        attempt: attempt.clone(),
                        outcome,
                        reason: error.clone().unwrap_or_default(),
                    });
                }
                let output = self.outputs.remove(&(task.clone(), attempt.clone()));
                let inline = self.inline_input(&qid, &task).is_some();
                if outcome == AttemptOutcome::Interrupted
                    && !inline
                    && let (Some(inc), Some(doc)) = (started_by, task_doc(&task))
                {
                    // The earlier life recorded the start in the queue document only.
                    let at = self
                        .queues
                        .get(&qid)
                        .and_then(|q| q.view.task(&task))
                        .and_then(|t| t.attempt(&attempt))
                        .and_then(|a| a.started.as_ref())
                        .map_or(0, |s| s.at);
                    let start = RunStart {
                        attempt: attempt.clone(),
                        worker: worker.clone(),
                        incarnation: inc,
                        at,
                    };
                    let end = TaskRunEnd {
                        outcome,
                        at: now.unix_ms,
                        result: None,
                        error: error.clone(),
                        logs: vec![],
                    };
                    // Best effort: the task document may not be here.
                    self.task_writes
                        .entry(doc)
                        .or_default()
                        .runs
                        .push((start, end));
                }
                self.attempt_writes
                    .entry(qid)
                    .or_default()
                    .push(PendingAttempt {
                        write: queue::AttemptWrite::Finish {
                            task,
                            attempt,
                            worker,
                            outcome,
                            error,
                            output,
                        },
                        started: None,
                    });
            }
            PoolAction::Beat(beat) => {
                for q in self.queues.values_mut() {
                    q.router.handle_pool_beat(now.mono, &beat);
                    // Each queue's copy names this node's epoch document of that queue.
                    let mut beat = beat.clone();
                    if q.epoch > 0 {
                        beat.epoch = Some(Latest {
                            epoch: q.epoch,
                            doc: q.doc.to_string(),
                        });
                    }
                    self.io.push_back(Io::Publish {
                        topic: q.topic.clone(),
                        data: Wire::Pool(beat).encode(),
                    });
                }
            }
        }
    }

    /// Starts a run whose task document is loaded: records the start in both documents, then
    /// asks the driver to run the handler.
    fn start_run(&mut self, run: Run) {
        let index = run.worker.index;
        let Some(tdoc) = task_doc(&run.task) else {
            return;
        };
        let input = match self.replica.get(&tdoc).map(task::read_input) {
            Some(Ok(input)) => input,
            Some(Err(e)) => {
                self.pool
                    .handle_start_failed(index, format!("unreadable task document: {e}"));
                return;
            }
            None => {
                self.pool
                    .handle_input_unavailable(index, "the task document is unavailable".into());
                return;
            }
        };
        self.start_with(run, input);
    }

    /// Starts a run whose input is at hand: records the start, then (once it is written) asks
    /// the driver to run the handler.
    fn start_with(&mut self, run: Run, input: serde_json::Value) {
        let index = run.worker.index;
        if self.stopping.is_some() {
            self.pool
                .handle_start_failed(index, "the worker's node is stopping".into());
            return;
        }
        if !self.queues.contains_key(&run.queue) {
            self.pool
                .handle_start_failed(index, "this node left the task's queue".into());
            return;
        }
        // The fence may have risen while the task document was fetched.
        if let Some(reason) = self.fenced(&run) {
            self.pool.handle_start_failed(index, reason);
            return;
        }
        self.attempt_writes
            .entry(run.queue.clone())
            .or_default()
            .push(PendingAttempt {
                write: queue::AttemptWrite::Start {
                    task: run.task.clone(),
                    attempt: run.attempt.clone(),
                    worker: run.worker.clone(),
                    incarnation: self.config.incarnation,
                },
                started: Some((run, input)),
            });
    }

    /// Writes the turn's starts and ends of attempts, one change per queue document, then
    /// refreshes those views (routers must see their own queue's writes before deciding
    /// again) and hands each recorded start to the driver. True if anything was written.
    fn flush_attempts(&mut self, now: Time) -> bool {
        if self.attempt_writes.is_empty() {
            return false;
        }
        let mut wrote = false;
        for (id, mut pending) in std::mem::take(&mut self.attempt_writes) {
            if self.queues.get(&id).is_some_and(|q| q.frozen) {
                // Held until the queue's successor is in place (they go there).
                let later = self.attempt_writes.entry(id).or_default();
                pending.append(later);
                *later = pending;
                continue;
            }
            wrote = true;
            // The fence may have risen since the start was asked for (a view or a heartbeat
            // in this turn): checked again where the start is written.
            pending.retain(|p| match &p.started {
                Some((run, _)) => match self.fenced(run) {
                    Some(reason) => {
                        self.pool.handle_start_failed(run.worker.index, reason);
                        false
                    }
                    None => true,
                },
                None => true,
            });
            let writes: Vec<queue::AttemptWrite> =
                pending.iter().map(|p| p.write.clone()).collect();
            // The writes are checked against the queue document's cached view rather than by
            // reading the document (several map lookups per write).
            let view = self.current_view(&id);
            let target = self.queues.get(&id).map(|q| (q.doc.clone(), view));
            let results = target
                .and_then(|(doc, view)| {
                    self.change(&doc, |d| match &view {
                        Some(v) => queue::record_attempts_in_view(d, v, &writes, now.unix_ms),
                        None => queue::record_attempts(d, &writes, now.unix_ms),
                    })
                })
                .unwrap_or_else(|| {
                    writes
                        .iter()
                        .map(|_| Err(queue::AttemptError::NotAQueue))
                        .collect()
                });
            for (p, r) in pending.into_iter().zip(results) {
                match (p.started, r) {
                    (Some((run, input)), Ok(())) => self.begin_run(now, run, input),
                    (Some((run, _)), Err(e)) => {
                        self.pool.handle_start_failed(
                            run.worker.index,
                            format!("cannot record the start: {e}"),
                        );
                    }
                    (None, Ok(())) => {}
                    (None, Err(e)) => {
                        tracing::warn!(queue = %id, "cannot record an attempt's end: {e}")
                    }
                }
            }
            self.stale.remove(&id);
            self.refresh(now, &id);
        }
        wrote
    }

    /// Why a run must not start: its attempt was assigned by a router below the greatest
    /// claim this node has seen for the queue.
    /// Starts recorded this turn whose claim a fence raised later in the same turn (a switch
    /// to another branch, a heartbeat) are not run: their workers are freed and their attempts
    /// refused, as if the fence had been known when they were asked for. True if any was.
    fn abort_fenced_starts(&mut self) -> bool {
        let mut aborted = false;
        let starting = std::mem::take(&mut self.starting);
        for req in starting {
            let reason = self.runs.get(&req.id).and_then(|r| self.fenced(&r.run));
            match reason {
                Some(reason) => {
                    self.runs.remove(&req.id);
                    self.pool.handle_start_failed(req.worker.index, reason);
                    aborted = true;
                }
                None => self.starting.push(req),
            }
        }
        aborted
    }

    /// Hands this turn's starts to the driver.
    fn hand_over_starts(&mut self) {
        for req in std::mem::take(&mut self.starting) {
            self.events.push_back(Event::RunStarted {
                queue: req.queue.clone(),
                task: req.task.clone(),
                attempt: req.attempt.clone(),
                worker: req.worker.clone(),
            });
            self.io.push_back(Io::Run(req));
        }
    }

    fn fenced(&self, run: &Run) -> Option<String> {
        let fence = self.seen.get(&run.queue)?;
        (run.attempt.claim < *fence && self.fencing()).then(|| {
            format!(
                "fenced: assigned by {}, but {fence} is the router",
                run.attempt.claim
            )
        })
    }

    /// Writes each task document's pending run records and summary in one change.
    /// A document that left memory is read back first; its writes wait for it.
    fn flush_task_writes(&mut self, now: Time) {
        for (doc, w) in std::mem::take(&mut self.task_writes) {
            if self
                .replica
                .get(&doc)
                .is_none_or(|d| d.get_heads().is_empty())
            {
                if w.runs.is_empty() && w.summary.is_none() {
                    continue;
                }
                let waits = self
                    .doc_waiters
                    .get(&doc)
                    .is_some_and(|ws| ws.iter().any(|w| matches!(w, DocWaiter::Write)));
                self.task_writes.insert(doc.clone(), w);
                if !waits {
                    self.wait_for(now, &doc, DocWaiter::Write);
                }
                continue;
            }
            match self.change(&doc, |d| task::record_runs(d, &w.runs, w.summary.as_ref())) {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!(%doc, "cannot record the task's runs: {e}"),
                None => {}
            }
        }
    }

    /// A start is recorded: hands the run to the driver.
    fn begin_run(&mut self, now: Time, run: Run, input: serde_json::Value) {
        let start = RunStart {
            attempt: run.attempt.clone(),
            worker: run.worker.clone(),
            incarnation: self.config.incarnation,
            at: now.unix_ms,
        };
        self.next_run += 1;
        let id = RunId(self.next_run);
        // Handed to the driver at the end of the turn, if no higher claim came to light
        // meanwhile ([`Core::abort_fenced_starts`]).
        self.starting.push(RunRequest {
            id,
            queue: run.queue.clone(),
            task: run.task.clone(),
            attempt: run.attempt.clone(),
            worker: run.worker.clone(),
            kind: run.kind.clone(),
            input,
        });
        self.runs.insert(id, Running { run, start });
    }

    /// A task's input was unavailable to its worker: if this node holds the task's document,
    /// mark the input available so that it is routed again; if it is not in memory, look on
    /// disk first (the fetch also asks members, which is harmless).
    fn revive(&mut self, now: Time, queue: QueueId, task: TaskId, n: u64) {
        let Some(doc) = task_doc(&task) else { return };
        let still = self
            .queues
            .get(&queue)
            .and_then(|q| q.view.task(&task))
            .is_some_and(|t| t.state() == TaskState::InputUnavailable);
        if !still {
            return;
        }
        let held = self
            .replica
            .get(&doc)
            .is_some_and(|d| !d.get_heads().is_empty());
        if held {
            self.write_queue(now, &queue, "a task's input as available", |d| {
                queue::mark_input_available(d, &task, n)
            });
            return;
        }
        let waiting = self.doc_waiters.get(&doc).is_some_and(|ws| {
            ws.iter()
                .any(|w| matches!(w, DocWaiter::Revive { .. } | DocWaiter::Start { .. }))
        });
        if !waiting {
            self.wait_for(now, &doc, DocWaiter::Revive { queue, task, n });
        }
    }

    /// Dials every member of every queue this node has no sync stream with.
    fn dial_members(&mut self) {
        let mut wanted: BTreeMap<PeerId, Vec<String>> = BTreeMap::new();
        for q in self.queues.values() {
            for (peer, member) in &q.view.members {
                if *peer == self.config.peer || self.connected.contains(peer) {
                    continue;
                }
                wanted
                    .entry(peer.clone())
                    .or_default()
                    .extend(member.addrs.iter().cloned());
            }
        }
        for (peer, mut addrs) in wanted {
            addrs.sort();
            addrs.dedup();
            if !addrs.is_empty() {
                self.io.push_back(Io::Dial { peer, addrs });
            }
        }
    }
}

/// A start or an end of an attempt waiting for [`Core::flush_attempts`].
#[derive(Debug)]
struct PendingAttempt {
    write: queue::AttemptWrite,
    /// For a start: the run and its input, handed to the driver once the start is recorded.
    started: Option<(Run, serde_json::Value)>,
}

/// What waits to be written into one task document at the end of a turn.
#[derive(Debug, Default)]
struct TaskWrites {
    runs: Vec<(RunStart, TaskRunEnd)>,
    summary: Option<task::Summary>,
}

/// The gossipsub topic carrying a queue's heartbeats.
pub fn topic_for(queue: &QueueId) -> String {
    format!("piecework/v1/queue/{queue}")
}

/// An epoch document's scope: announced to the queue's members, and requestable (a node
/// that learns of an epoch from a heartbeat fetches it).
fn epoch_scope(root: &DocId) -> Scope {
    Scope {
        group: root.clone(),
        announce: true,
        requestable: true,
    }
}

/// Notes an epoch document a peer's heartbeat says it is on; true if this node should look at
/// it (it is new here, or an earlier fetch of it ended without it).
fn announce(q: &mut Queue, l: &Latest) -> bool {
    let Some(d) = DocId::parse(&l.doc) else {
        return false;
    };
    if d == q.doc || q.sealed.contains_key(&d) || q.rejected.contains(&d) || q.fetching.contains(&d)
    {
        return false;
    }
    if q.announced.len() >= MAX_ANNOUNCED && !q.announced.contains(&d) {
        return false;
    }
    q.announced.insert(d);
    true
}

/// The error of a task's latest failed attempt.
fn last_error(t: &TaskEntry) -> Option<String> {
    t.attempts
        .iter()
        .filter_map(|a| a.finished.as_ref())
        .filter(|f| f.outcome.is_failure())
        .max_by_key(|f| f.at)
        .and_then(|f| f.error.clone())
}

fn queue_scope(doc: &DocId) -> Scope {
    Scope {
        group: doc.clone(),
        announce: true,
        requestable: true,
    }
}

/// Whether a document's heads are exactly `carried` (in any order).
fn same_heads(mut heads: Vec<ChangeHash>, carried: &[ChangeHash]) -> bool {
    if heads.len() != carried.len() {
        return false;
    }
    heads.sort_unstable();
    let mut c = carried.to_vec();
    c.sort_unstable();
    heads == c
}

fn see(seen: &mut BTreeMap<QueueId, Claim>, queue: &QueueId, claim: &Claim) {
    let best = max_claim(seen.get(queue), Some(claim));
    if let Some(best) = best {
        seen.insert(queue.clone(), best);
    }
}

fn is_done(s: &api::TaskStatus) -> bool {
    match s.state {
        TaskState::Failed => true,
        TaskState::Succeeded => s.result.is_some(),
        _ => false,
    }
}

/// Documents waiting to leave memory, by document and by the time they became candidates, so
/// that finding the due ones and the next deadline costs O(log n) per document, not a scan.
#[derive(Debug, Default)]
struct EvictQueue {
    by_doc: BTreeMap<DocId, Instant>,
    by_time: BTreeSet<(Instant, DocId)>,
}

impl EvictQueue {
    fn len(&self) -> usize {
        self.by_doc.len()
    }

    fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    fn insert_if_absent(&mut self, doc: DocId, at: Instant) {
        if !self.by_doc.contains_key(&doc) {
            self.set(doc, at);
        }
    }

    fn set(&mut self, doc: DocId, at: Instant) {
        if let Some(old) = self.by_doc.insert(doc.clone(), at) {
            self.by_time.remove(&(old, doc.clone()));
        }
        self.by_time.insert((at, doc));
    }

    fn remove(&mut self, doc: &DocId) {
        if let Some(old) = self.by_doc.remove(doc) {
            self.by_time.remove(&(old, doc.clone()));
        }
    }

    /// The documents that have waited at least `idle` by `now`, oldest first; and, beyond the
    /// newest `keep`, those that have waited at least [`CROWDED_IDLE`].
    fn due(&self, now: Instant, idle: Duration, keep: usize) -> Vec<DocId> {
        let crowded = self.by_time.len().saturating_sub(keep);
        self.by_time
            .iter()
            .enumerate()
            .take_while(|(i, (t, _))| {
                now >= *t + idle || (*i < crowded && now >= *t + CROWDED_IDLE)
            })
            .map(|(_, (_, d))| d.clone())
            .collect()
    }

    /// When the next document is due (see [`EvictQueue::due`]).
    fn next_due(&self, idle: Duration, keep: usize) -> Option<Instant> {
        let first = self.first()?;
        Some(if self.len() > keep {
            first + CROWDED_IDLE
        } else {
            first + idle
        })
    }
}

/// The status of an inline task from its queue's view and document (its runs' outputs are
/// read from the document: the view does not keep them).
fn inline_status(queue: &QueueId, t: &TaskEntry, doc: &Automerge) -> api::TaskStatus {
    let outputs: BTreeMap<AttemptId, Output> = piecework_queue_doc::read_outputs(doc, &t.id)
        .into_iter()
        .collect();
    let runs: Vec<task::Run> = t
        .attempts
        .iter()
        .filter_map(|a| {
            let started = a.started.as_ref()?;
            let f = a.finished.as_ref()?;
            let out = outputs.get(&a.id);
            Some(task::Run {
                attempt: a.id.clone(),
                worker: a.worker.clone(),
                incarnation: started.incarnation,
                started_at: started.at,
                end: Some(TaskRunEnd {
                    outcome: f.outcome,
                    at: f.at,
                    // A success with no result written returned null.
                    result: out
                        .and_then(|o| o.result.as_deref())
                        .and_then(|r| serde_json::from_str(r).ok())
                        .or((f.outcome == AttemptOutcome::Succeeded)
                            .then_some(serde_json::Value::Null)),
                    error: f.error.clone(),
                    logs: out.map(|o| o.logs.clone()).unwrap_or_default(),
                }),
            })
        })
        .collect();
    let result = runs
        .iter()
        .filter_map(|r| r.end.as_ref())
        .find(|e| e.outcome == AttemptOutcome::Succeeded)
        .and_then(|e| e.result.clone());
    api::TaskStatus {
        id: t.id.clone(),
        queue: queue.clone(),
        kind: t.kind.clone(),
        state: t.state(),
        submitted_at: t.submitted_at,
        submitter: t.submitter.to_string(),
        input: t
            .input
            .as_deref()
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or(serde_json::Value::Null),
        priority: Some(t.priority),
        urgent: Some(t.urgent),
        max_attempts: Some(t.max_attempts),
        result,
        error: last_error(t),
        attempts: t.attempts.clone(),
        runs,
    }
}

/// An archived status, as the archive keeps it: the task's final status when it was archived.
fn archived_status(task: &TaskId, json: &[u8]) -> Result<api::TaskStatus, TaskError> {
    serde_json::from_slice::<api::TaskStatus>(json).map_err(|e| {
        tracing::warn!(%task, "unreadable archived status: {e}");
        TaskError::NotFound(task.clone())
    })
}
