//! The [`Core`]: one node's documents, routers, pool, views, waiters and save bookkeeping.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::{ActorId, Automerge, ChangeHash};
use piecework_queue_doc::epoch::{self, Latest, Link, Seal, TaskEnd};
use piecework_queue_doc::task::{self, NewTask, RunStart};
use piecework_queue_doc::{
    AttemptOutcome, Changed, Claim, Every, Firing, MAX_PLANNED_TOTAL_BYTES, Output, PeerId,
    PlannedTask, QueueConfig, QueueId, QueueView, RunningReport, ScheduleError, Submission,
    TaskEntry, TaskId, TaskState, ViewCache, follow_up_id, queue, read_outputs, undo_id,
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
    BEHIND_WAIT, Built, Command, CommandId, Config, DIAL_EVERY, Event, FIND_TIMEOUT, GossipVerdict,
    Io, MAX_PENDING_SUBMITS, MAX_WAIT, MAX_WAITERS, Outcome, REPLICATION_WAIT, Reply, Retired,
    Rotate, RotateId, RotateWork, RunId, RunResult, Running, SaveId, Saved, Status, Successor,
    TaskRunEnd, Time, Wire, queue_doc, task_doc,
};

mod carry;
mod commands;
mod documents;
mod evict;
mod follow;
mod life_events;
mod lifecycle;
mod membership;
mod queue_state;
mod queues;
mod rotate;
mod runs;
mod state;
mod status;
mod statuses;
mod stop;
mod submits;
mod switch;
mod waiters;
mod writes;

use queue_state::*;
use state::*;
use statuses::*;
use waiters::*;
use writes::*;

/// The pool's heartbeat before any queue says otherwise.
const DEFAULT_POOL_HEARTBEAT: Duration = Duration::from_millis(500);

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
    /// Signs this node's membership operations and invites.
    signer: piecework_queue_doc::Signer,
    replica: Replica,
    pool: Pool,
    /// Joined queues: one per join command this node's user made.
    queues: BTreeMap<QueueId, Queue>,
    /// One per joined queue.
    topics: BTreeMap<String, QueueId>,
    saves: Saves,
    /// Documents being loaded, waited for, or waiting to leave memory.
    docs: Documents,
    /// The peers.
    members: Members,
    /// Submits waiting to be acknowledged.
    submits: Submits,
    /// Creates and joins waiting for their queue document to be on disk.
    opens: Vec<OpenWait>,
    /// Status requests that wait, and members' questions.
    lookup: Lookups,
    /// Final statuses of inline tasks: to archive, and the latest archived.
    archive: Archive,
    /// Listings waiting for the store's finished tasks ([`Io::ListFinished`]).
    listings: BTreeMap<CommandId, ListWait>,
    /// The records of the tasks this node saw end lately (`Core::keep_ends`).
    ends: Ends,
    /// This node's runs and the writes they make.
    runs: Runs,
    /// The epoch documents held and the epoch work in flight.
    epochs: Epochs,
    /// Queues whose document changed since their view was last refreshed: at most `queues`.
    stale: BTreeSet<QueueId>,
    /// Inside [`Core::begin_batch`]: turns wait for [`Core::end_batch`].
    batching: bool,
    /// Retired documents (finished tasks', sealed epochs that left memory) still on disk:
    /// beyond its bounds the oldest are deleted. At most the bounds, plus the ones held in
    /// memory meanwhile.
    retention: Retention,
    /// The documents of each queue's first pending tasks in routing order (at most
    /// [`PREFETCH_PER_WORKER`] per worker): read ahead of their start, and kept in memory.
    prefetch: BTreeMap<QueueId, BTreeSet<TaskId>>,
    /// The greatest router claim seen per queue, in views (heartbeats raise no fence): one per
    /// queue, since the node last moved sideways to another branch of its chain (fences are
    /// per chain: `switch.rs`).
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
    /// The progress of running tasks of this node's queues, as pool heartbeats last reported
    /// it for their running attempt: at most one per task a view shows running (forgotten when
    /// the task stops running).
    progress: BTreeMap<
        TaskId,
        (
            piecework_queue_doc::AttemptId,
            piecework_queue_doc::Progress,
        ),
    >,
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
        let ends = Ends::keeping(config.recent_ends);
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let mut random = [0u8; 16];
        rng.fill_bytes(&mut random);
        let mut nonce = [0u8; 8];
        nonce.copy_from_slice(&random[8..]);
        // Tagged with this peer: readers attribute its writes to it (`queue-doc`'s judge).
        let actor = piecework_queue_doc::membership::actor_for(&config.peer, nonce);
        let mut replica = Replica::new();
        // Each start writes as a new Automerge actor: a change lost in a crash can never
        // collide with a new change under the same (actor, seq).
        replica.set_actor(actor.clone());
        replica.set_local_peer(config.peer.clone());
        if let Some((lower, higher)) = config.relay_waits {
            replica.set_relay_waits(lower, higher);
        }
        let mut pool = Pool::new(
            PoolConfig {
                peer: config.peer.clone(),
                workers: config.workers,
                incarnation: config.incarnation,
                heartbeat: DEFAULT_POOL_HEARTBEAT,
            },
            now.mono,
        );
        pool.set_cancel_grace(config.cancel_grace);
        if let Some(kinds) = &config.kinds {
            pool.set_kinds(kinds.iter().cloned());
        }
        for r in config
            .resources
            .iter()
            .filter(|r| piecework_queue_doc::valid_tag(r))
        {
            pool.add_resource(r.clone(), now.mono);
        }
        Core {
            signer: piecework_queue_doc::Signer::new(config.peer.clone(), config.identity_key),
            config,
            retention,
            rng,
            actor,
            replica,
            pool,
            queues: BTreeMap::new(),
            topics: BTreeMap::new(),
            saves: Saves::default(),
            docs: Documents::new(now.mono),
            members: Members::new(now.mono),
            submits: Submits::default(),
            opens: Vec::new(),
            lookup: Lookups::default(),
            archive: Archive::default(),
            listings: BTreeMap::new(),
            ends,
            runs: Runs::default(),
            epochs: Epochs::default(),
            stale: BTreeSet::new(),
            batching: false,
            prefetch: BTreeMap::new(),
            seen: BTreeMap::new(),
            resume,
            stopping: None,
            transmit: VecDeque::new(),
            io: VecDeque::new(),
            replies: VecDeque::new(),
            events: VecDeque::new(),
            progress: BTreeMap::new(),
            #[cfg(feature = "broken")]
            broken: false,
        }
    }

    /// Breaks this node on purpose, for proving that the tests catch it: its pool stops
    /// fencing (it starts assignments from deposed routers, `pool`), or the core's own fence
    /// checks of a start stop (after its task's document was fetched, and at the end of the
    /// turn: `core`).
    #[cfg(feature = "broken")]
    pub fn break_fencing(&mut self, pool: bool, core: bool) {
        if pool {
            self.pool.break_fencing();
        }
        self.broken = core;
    }

    /// The simulator's hook for a hostile member (feature `hostile`, enabled only by
    /// `piecework-sim`): applies `f` to this node's replica of `doc` as a raw Automerge change,
    /// bypassing every typed write and its checks, then runs a turn, so the change is saved
    /// and synced to the peers as any local change would be. `None` if `doc` is not loaded.
    /// It lets the simulator's world write what a hostile member's own code could write (a
    /// claim that skips terms, an oversized record); the node's logic is unchanged.
    #[cfg(feature = "hostile")]
    pub fn hostile_change<R>(
        &mut self,
        now: Time,
        doc: &DocId,
        f: impl FnOnce(&mut Automerge) -> R,
    ) -> Option<R> {
        let r = self.change(doc, f);
        self.turn(now);
        r
    }

    /// The simulator's hook for a hostile member (feature `hostile`): adds `doc` to this
    /// node's replica under `id` as an epoch document of `queue` (announced to its members,
    /// saved), as a forged successor's author would, then runs a turn. False if the queue is
    /// not open here.
    #[cfg(feature = "hostile")]
    pub fn hostile_create(
        &mut self,
        now: Time,
        queue: &QueueId,
        id: DocId,
        doc: Automerge,
    ) -> bool {
        let Some(q) = self.queues.get(queue) else {
            return false;
        };
        let scope = epoch_scope(&q.root);
        self.replica.create(id.clone(), doc, Some(scope));
        self.saves.changed(&id);
        self.turn(now);
        true
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
        self.epochs.carried_changes()
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

    /// The greatest router claim this node has seen for `queue` (in its views: heartbeats do not count)
    /// on the chain of documents it is on: what its workers fence on.
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
        self.runs.running()
    }

    /// The sizes of the core's collections, for tests that check they stay bounded.
    pub fn sizes(&self) -> BTreeMap<&'static str, usize> {
        let mut sizes = BTreeMap::from([
            ("queues", self.queues.len()),
            ("connected", self.members.connected_count()),
            ("stale", self.stale.len()),
            ("task_waiters", self.lookup.task_waits()),
            ("submit_waits", self.submits.waiting()),
            ("runs", self.runs.running()),
            ("loaded", self.replica.loaded()),
            ("epoch_docs", self.epochs.held()),
            ("sealed", self.queues.values().map(|q| q.sealed.len()).sum()),
            (
                "sealed_dirty",
                self.queues
                    .values()
                    .map(|q| q.sealed.values().filter(|s| s.dirty).count())
                    .sum(),
            ),
            ("rotating", self.epochs.rotations()),
            ("retired_task_docs", self.retention.len().0),
            ("retired_epochs", self.retention.len().1),
        ]);
        sizes.extend(self.docs.sizes());
        sizes
    }

    /// The node's advertised addresses changed: record them in every joined queue.
    pub fn handle_addresses(&mut self, now: Time, addrs: Vec<String>) {
        if !self.members.advertise(addrs) {
            return;
        }
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in ids {
            self.write_member(now, &id);
        }
        self.turn(now);
    }

    /// A sync stream to `peer` opened: start syncing with it.
    pub fn handle_connected(&mut self, now: Time, peer: PeerId) {
        self.submits.mark_dirty();
        self.members.connected(peer.clone());
        for (id, q) in self.queues.iter_mut() {
            if q.view.is_member(&peer) {
                q.router.handle_member_connected(now.mono);
                self.events.push_back(Event::Queue(life_events::peer_event(
                    id,
                    &peer,
                    true,
                    now.unix_ms,
                )));
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
                self.runs
                    .revive_later(qid.clone(), t.id.clone(), t.last_n());
            }
        }
        for w in self.docs.take_join_retries() {
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
        self.submits.mark_dirty();
        self.members.disconnected(peer);
        for (id, q) in &self.queues {
            if q.view.is_member(peer) {
                self.events.push_back(Event::Queue(life_events::peer_event(
                    id,
                    peer,
                    false,
                    now.unix_ms,
                )));
            }
        }
        self.replica.handle_disconnected(peer);
        // Its answers will not come.
        for (task, cmds) in self.lookup.peer_gone(peer) {
            self.not_found(&task, cmds);
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
        self.submits.mark_dirty();
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

    /// A gossip message on `topic`, signed by `source` and passed on by `via` (the peer it
    /// came from; `source` itself if it came directly). Returns whether the transport should
    /// pass it on ([`GossipVerdict`]).
    pub fn handle_gossip(
        &mut self,
        now: Time,
        topic: &str,
        source: &PeerId,
        via: &PeerId,
        data: &[u8],
    ) -> GossipVerdict {
        let verdict = self.gossip(now, topic, source, via, data);
        self.turn(now);
        verdict
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
            Some(self.members.next_dial()).filter(|_| !self.queues.is_empty()),
            self.queues
                .values()
                .filter_map(|q| q.asked_behind.as_ref().and_then(|(_, until)| *until))
                .min(),
            self.saves.poll_timeout(),
            self.docs.next_retry(),
            self.replica.poll_timeout(),
            self.docs.next_eviction(),
            self.docs.next_deadline(),
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
        if let Some(d) = self.submits.deadline() {
            earliest(d);
        }
        if let Some(d) = self.lookup.next_deadline() {
            earliest(d);
        }
        if let Some(s) = self.stopping.as_ref().filter(|s| !s.answered) {
            if self.runs.running() > 0 {
                earliest(s.grace_until);
            }
            earliest(s.flush_until);
        }
        if let Some(d) = self.epochs.carry_due() {
            earliest(d);
        }
        for s in self.queues.values().flat_map(|q| q.sealed.values()) {
            if let (true, Some(t)) = (s.dirty, s.retry_at) {
                earliest(t);
            }
        }
        if let Some(d) = self.epochs.next_rotation_deadline() {
            earliest(d);
        }
        for q in self.queues.values() {
            // A dirty one stays until it is carried (then clean, and timed again).
            for (d, sealed) in &q.sealed {
                if *d != q.root && !sealed.dirty {
                    earliest(sealed.since + self.config.epoch_retain);
                }
            }
        }
        t
    }

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
        self.epochs.new_turn();
        // Carries whose wait is over are due at this turn's epoch work (and no longer a timer).
        for s in self.queues.values_mut().flat_map(|q| q.sealed.values_mut()) {
            if s.retry_at.is_some_and(|t| now.mono >= t) {
                s.retry_at = None;
            }
        }
        self.expire_frozen(now);
        self.interrupt_at_grace(now);
        for doc in self.docs.retries_due(now.mono) {
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
            for (queue, task, n) in self.runs.take_to_revive() {
                self.revive(now, queue, task, n);
            }
            for q in self.queues.values_mut() {
                q.router.handle_clock(now.mono, now.unix_ms);
                q.router.handle_timeout(now.mono);
            }
            self.pool.handle_timeout(now.mono);
            let acted = self.drain_actions(now);
            let wrote = self.flush_attempts(now);
            if (!acted && !wrote && self.stale.is_empty()) || rounds > 10_000 {
                if rounds <= 10_000 && self.abort_fenced_starts(now) {
                    continue;
                }
                break;
            }
        }
        self.hand_over_starts(now);
        self.flush_task_writes(now);
        self.flush_archive();
        // Asked only of a document whose compaction is due (rarely), not for every write.
        let (epochs, queues) = (&self.epochs, &self.queues);
        let sealing =
            |d: &DocId| epochs.seals(d) || queues.values().any(|q| q.sealed.contains_key(d));
        let saves = self.saves.take_writes(&self.replica, sealing);
        for save in saves {
            self.io.push_back(Io::Save(save));
        }
        self.evict(now);
        self.check_submits(now);
        self.check_opens();
        self.check_task_waiters(now);
        self.expire_doc_waiters(now);
        self.ask_joins_again(now);
        self.answer_stop(now);
        if self.members.dial_due(now.mono, DIAL_EVERY) {
            self.dial_members();
        }
    }
}

/// The gossipsub topic carrying a queue's heartbeats.
pub fn topic_for(queue: &QueueId) -> String {
    format!("piecework/v1/queue/{queue}")
}
