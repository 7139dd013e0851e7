//! The node's shell: one tokio task that feeds a [`Core`] the clock, the network, the disk and
//! handler runs, and performs the I/O it asks for. It decides nothing itself: every decision is
//! the core's, which the simulator runs too.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use piecework_core::{
    Built, Command, CommandId, Core, Event, Io, Reply, RouterEvent, RunId, RunRequest, RunResult,
    Save, SaveId, Saved, Time, api::StorageFailure,
};
use piecework_net as net;
use piecework_queue_doc::{PeerId, TaskId};
use piecework_replica::DocId;
use piecework_worker_pool::{Context, execute};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{NodeEvent, Shared, now_ms};

/// Inputs (network events, storage and handler answers, API requests) handed to the core in
/// one batch at most: one turn then answers them all.
const BATCH: usize = 256;
/// The longest a batch keeps taking inputs: past it the turn runs (timers, heartbeats, replies)
/// and the rest waits for the next one. A node behind on sync messages (each costs Automerge a
/// walk of the objects it touches) would otherwise hold its heartbeats for as long as a whole
/// batch takes.
const BATCH_TIME: Duration = Duration::from_millis(10);
/// The most gossip messages (heartbeats) taken at once without a turn: the network's
/// gossip queue can hold this many, and a peer that floods gossip must not hold a turn
/// for as long as it keeps sending.
const GOSSIP_PER_DRAIN: usize = net::GOSSIP_CAPACITY;
/// Capacity of the shell's internal input queue (run results, storage answers).
const INPUT_QUEUE: usize = 1024;

/// A command from a [`crate::NodeHandle`], with where to send its reply.
pub(crate) struct Request {
    pub(crate) command: Command,
    pub(crate) reply: oneshot::Sender<Reply>,
}

enum Input {
    Loaded {
        doc: DocId,
        chunks: Result<Vec<Vec<u8>>, StorageFailure>,
    },
    Saved {
        id: SaveId,
        result: Result<Saved, StorageFailure>,
    },
    RunEnded {
        id: RunId,
        result: RunResult,
    },
    /// A running handler reported its progress.
    Progress {
        id: RunId,
        progress: piecework_worker_pool::Progress,
    },
    Archived {
        task: TaskId,
        status: Option<Vec<u8>>,
    },
    /// The store's kept ends for a requeue or an undo ([`Io::LookupEnds`]).
    Ends {
        lookup: u64,
        found: Vec<(TaskId, Vec<u8>)>,
    },
    /// The store's finished tasks for a listing ([`Io::ListFinished`]).
    Listed {
        cmd: CommandId,
        entries: Vec<Vec<u8>>,
    },
    /// A successor epoch document built off the node's thread.
    Rotated(Built),
}

pub(crate) struct Shell {
    shared: Arc<Shared>,
    core: Core,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    /// Replies owed, by command id. Bounded: the core answers every command (its waits have
    /// deadlines), and callers wait for room in the bounded command queue.
    pending: HashMap<CommandId, oneshot::Sender<Reply>>,
    next_command: u64,
    /// Frames the transport refused for want of credit, resent first when it has some again.
    /// Bounded by what the core generated before it heard the peer was blocked.
    stalled: HashMap<net::PeerId, VecDeque<Vec<u8>>>,
    /// The compaction thread's queue ([`spawn_compactor`]).
    compactor: std::sync::mpsc::Sender<CompactJob>,
    /// The epoch thread's queue ([`spawn_epoch_thread`]).
    epochs: std::sync::mpsc::Sender<EpochJob>,
    views:
        HashMap<piecework_queue_doc::QueueId, watch::Sender<Arc<piecework_queue_doc::QueueView>>>,
    /// What the log line of a claim reports (see [`Pace`]).
    pace: Pace,
    /// A stop ([`Command::Stop`]) was answered: the loop ends.
    stopped: bool,
    /// The handlers running, to cancel one the core interrupted ([`Io::Abort`]).
    handlers: HashMap<
        piecework_core::RunId,
        (
            tokio_util::sync::CancellationToken,
            tokio::task::AbortHandle,
        ),
    >,
}

/// A turn at least this long is logged (at info): at the fastest timings the docs recommend,
/// a takeover follows 150 ms of silence. (Three nodes at full load at those timings: follower
/// turns up to 85 ms, docs/benchmarks.md.)
const LONG_TURN: Duration = Duration::from_millis(100);

/// An input whose handling takes at least this long is logged (at info), with what it was:
/// heartbeats wait behind it.
const LONG_INPUT: Duration = Duration::from_millis(100);

/// Logs an input that took [`LONG_INPUT`] or more since `started`.
fn long_input(started: Instant, what: impl FnOnce() -> String) {
    let took = started.elapsed();
    if took >= LONG_INPUT {
        tracing::info!(ms = took.as_millis(), input = what(), "long input");
    }
}

/// How the shell's loop kept up, for the log line a router claim writes: a follower that
/// claims while a router lives was either not hearing it or not running.
#[derive(Debug, Default)]
struct Pace {
    /// When the last gossip message (a heartbeat) was handed to the core.
    gossip_at: Option<Instant>,
    /// How long the previous turn took, from waking to its last output.
    last_turn: Duration,
    /// How late the timer that woke the current turn fired (zero if something else woke it).
    woke_late: Duration,
    /// Gossip arrivals by sender: silences on the wire are logged as they end.
    heard: HashMap<net::PeerId, Cadence>,
    /// This node's publications by topic: silences of its own loop are logged as they end.
    published: HashMap<String, Cadence>,
    /// The loop's work since this node last published.
    since_publish: Stretch,
    /// When the last turn ended.
    turn_ended: Option<Instant>,
}

/// What the shell's loop did over a stretch of time: what a log line of a silence reports.
#[derive(Debug, Default, Clone, Copy)]
struct Stretch {
    /// Turns run.
    turns: u32,
    /// Time spent in them.
    busy: Duration,
    /// The longest of them.
    longest: Duration,
    /// The longest wait for a turn to begin (between one turn's end and the next's start).
    idle: Duration,
    /// The latest a timer that woke a turn fired.
    late: Duration,
}

/// A gap at least this long, and at least [`GAP_FACTOR`] times the usual one, is logged (at
/// info) when it ends: heartbeats that stopped, on the wire or in a loop, for as long as the
/// fastest timings the docs recommend allow before a takeover, less one heartbeat.
const LONG_GAP: Duration = Duration::from_millis(100);
/// See [`LONG_GAP`].
const GAP_FACTOR: u32 = 3;
/// The most senders (or topics) whose rhythm is kept.
const MAX_CADENCES: usize = 1024;

/// The rhythm of a stream of messages: when the last one came, and the usual gap (a moving
/// average), so that a gap much longer than usual can be told.
#[derive(Debug, Clone, Copy)]
struct Cadence {
    last: Instant,
    usual: Duration,
}

impl Cadence {
    /// Records a message at `now`; the gap it ends, if it was long (see [`LONG_GAP`]), with
    /// the usual gap before it.
    fn tick<K: std::hash::Hash + Eq>(
        map: &mut HashMap<K, Cadence>,
        key: K,
        now: Instant,
    ) -> Option<(Duration, Duration)> {
        use std::collections::hash_map::Entry;
        if map.len() >= MAX_CADENCES {
            // Peers come and go: forget them all now and then rather than grow.
            map.clear();
        }
        match map.entry(key) {
            Entry::Vacant(v) => {
                v.insert(Cadence {
                    last: now,
                    usual: LONG_GAP,
                });
                None
            }
            Entry::Occupied(mut o) => {
                let c = o.get_mut();
                let gap = now.saturating_duration_since(c.last);
                let usual = c.usual;
                c.last = now;
                // An average over about eight gaps.
                c.usual = (usual * 7 + gap) / 8;
                (gap >= LONG_GAP && gap >= usual * GAP_FACTOR).then_some((gap, usual))
            }
        }
    }
}

/// What woke the shell's loop.
enum Wake {
    Net(net::Event),
    Input(Input),
    Request(Request),
    Timer,
}

/// A snapshot to save, and where to send it with the changes it replaces.
type CompactJob = (
    piecework_core::Compact,
    oneshot::Sender<(Vec<u8>, Vec<String>)>,
);

/// Starts the thread that saves compactions' snapshots, one at a time. One thread, not the
/// blocking pool: a save allocates about as much as the document holds, and each new thread
/// would keep that much in an allocator arena of its own (peak RSS of one node process went
/// from 79 to 116 MiB with the pool). It stops when the shell drops its sender.
fn spawn_compactor() -> std::sync::mpsc::Sender<CompactJob> {
    let (tx, rx) = std::sync::mpsc::channel::<CompactJob>();
    let spawned = std::thread::Builder::new()
        .name("piecework-compact".into())
        .spawn(move || {
            for (job, reply) in rx {
                let _ = reply.send(job.build());
            }
        });
    if let Err(e) = spawned {
        // Its jobs then fail like a full disk: retried, and reported if they keep failing.
        tracing::error!("cannot start the compaction thread: {e}");
    }
    tx
}

/// Epoch work to do off the node's thread, and where to send what it gave.
type EpochJob = (Box<piecework_core::Rotate>, mpsc::Sender<Input>);

/// Starts the thread that does the core's epoch work ([`Io::Rotate`]: building successors,
/// catching them up, reading their views), one job at a time, for the reason the compaction
/// thread is one thread. It stops when the shell drops its sender.
fn spawn_epoch_thread() -> std::sync::mpsc::Sender<EpochJob> {
    let (tx, rx) = std::sync::mpsc::channel::<EpochJob>();
    let spawned = std::thread::Builder::new()
        .name("piecework-epochs".into())
        .spawn(move || {
            for (job, to) in rx {
                // Dropped (never sealed) only if the shell is gone: shutting down.
                let _ = to.blocking_send(Input::Rotated(job.build()));
            }
        });
    if let Err(e) = spawned {
        // Rotations then never happen (each is dropped unseen); the queue still works.
        tracing::error!("cannot start the epoch thread: {e}");
    }
    tx
}

/// Appends a document's changes, then, if asked, compacts it: the snapshot is saved from the
/// core's copy on the compaction thread, so that the node's turns go on meanwhile.
async fn save_doc(
    store: &crate::storage::Store,
    compactor: &std::sync::mpsc::Sender<CompactJob>,
    doc: &DocId,
    appended: impl std::future::Future<Output = Result<(), crate::storage::StorageError>>,
    compact: Option<piecework_core::Compact>,
) -> Result<Saved, StorageFailure> {
    let failed = |e: &dyn std::fmt::Display| StorageFailure(e.to_string());
    appended.await.map_err(|e| StorageFailure(e.detail()))?;
    let Some(c) = compact else {
        return Ok(Saved::default());
    };
    let (reply, built) = oneshot::channel();
    compactor
        .send((c, reply))
        .map_err(|_| failed(&"the compaction thread is gone"))?;
    let (snapshot, replaces) = built.await.map_err(|e| failed(&e))?;
    let snapshot_bytes = snapshot.len();
    store
        .compact(doc.as_str(), snapshot, replaces)
        .await
        .map_err(|e| StorageFailure(e.detail()))?;
    Ok(Saved {
        snapshot_bytes: Some(snapshot_bytes),
    })
}

fn now() -> Time {
    Time {
        mono: Instant::now(),
        unix_ms: now_ms(),
    }
}

fn peer_of(p: &net::PeerId) -> PeerId {
    PeerId::new(p.to_string())
}

impl Shell {
    pub(crate) fn new(shared: Arc<Shared>, core: Core) -> Self {
        let (inputs_tx, inputs) = mpsc::channel(INPUT_QUEUE);
        Shell {
            shared,
            core,
            inputs_tx,
            inputs,
            pending: HashMap::new(),
            next_command: 0,
            stalled: HashMap::new(),
            views: HashMap::new(),
            compactor: spawn_compactor(),
            epochs: spawn_epoch_thread(),
            pace: Pace::default(),
            stopped: false,
            handlers: HashMap::new(),
        }
    }

    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Request>,
        mut net_events: net::Events,
        mut gossip: mpsc::Receiver<net::Event>,
    ) -> String {
        self.drain();
        let why = loop {
            if self.stopped {
                break "it was stopped (a planned stop: every change is on disk)".to_owned();
            }
            let deadline = self.core.poll_timeout();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            self.core.begin_batch();
            let woken = tokio::select! {
                biased;
                // Gossip first: a heartbeat must not wait behind a backlog of sync messages.
                ev = gossip.recv() => ev.map(Wake::Net).ok_or("its network's gossip channel closed"),
                input = self.inputs.recv() => input.map(Wake::Input).ok_or("its input queue closed"),
                ev = net_events.recv() => ev.map(Wake::Net).ok_or("its network event loop ended"),
                req = commands.recv() => req.map(Wake::Request).ok_or("every handle to it was dropped"),
                () = sleep => Ok(Wake::Timer),
            };
            if self
                .shared
                .panic_injected
                .load(std::sync::atomic::Ordering::SeqCst)
            {
                panic!("a fault injected for a test: the shell panics");
            }
            // The turn counts from here: handling its first input is part of it.
            let woke = Instant::now();
            // Beats due go out before anything else is done.
            self.beat();
            match woken {
                Err(why) => {
                    tracing::error!("the node's shell stops: {why}");
                    break why.to_owned();
                }
                Ok(Wake::Net(e)) => self.handle_net(e),
                Ok(Wake::Input(i)) => self.handle_input(i),
                Ok(Wake::Request(r)) => self.handle_request(r),
                Ok(Wake::Timer) => {
                    self.pace.woke_late = deadline.map_or(Duration::ZERO, |d| d.elapsed());
                }
            }
            // Take whatever else is ready too (up to a bound, never waiting for more), so
            // that one turn answers them all.
            let mut taken = 0;
            let started = Instant::now();
            while taken < BATCH && started.elapsed() < BATCH_TIME {
                let before = taken;
                taken += self.drain_gossip(&mut gossip);
                if let Ok(i) = self.inputs.try_recv() {
                    self.handle_input(i);
                    taken += 1;
                }
                if let Ok(e) = net_events.try_recv() {
                    self.handle_net(e);
                    taken += 1;
                }
                if let Ok(r) = commands.try_recv() {
                    self.handle_request(r);
                    taken += 1;
                }
                if taken == before {
                    break;
                }
                self.beat();
            }
            // The turn's timers decide from what the node has heard by now: a heartbeat that
            // arrived while the batch's last input was applied (a large sync message can take
            // tens of milliseconds) must count, or a busy follower deposes a live router.
            self.drain_gossip(&mut gossip);
            let taken_in = woke.elapsed();
            self.beat();
            self.core.end_batch(now());
            let turned = woke.elapsed();
            self.drain();
            self.pace.last_turn = woke.elapsed();
            let st = &mut self.pace.since_publish;
            st.turns += 1;
            st.busy += self.pace.last_turn;
            st.longest = st.longest.max(self.pace.last_turn);
            st.late = st.late.max(self.pace.woke_late);
            if let Some(ended) = self.pace.turn_ended {
                st.idle = st.idle.max(woke.saturating_duration_since(ended));
            }
            self.pace.turn_ended = Some(Instant::now());
            self.pace.woke_late = Duration::ZERO;
            if self.pace.last_turn >= LONG_TURN {
                // A turn this long keeps the node's heartbeats waiting: a follower's pool beat
                // or, at the fast timings, long enough for a takeover.
                tracing::info!(
                    inputs = taken + 1,
                    inputs_ms = taken_in.as_millis(),
                    turn_ms = (turned - taken_in).as_millis(),
                    outputs_ms = (self.pace.last_turn - turned).as_millis(),
                    "long turn"
                );
            }
        };
        tracing::info!("node shell stopped: {why}");
        why
    }

    /// Publishes the heartbeats that are due, between the parts of a turn
    /// ([`Core::handle_beats`]).
    fn beat(&mut self) {
        self.core.handle_beats(now());
        while let Some(io) = self.core.poll_io() {
            self.perform(io);
        }
    }

    /// Hands the core the gossip messages waiting, at most [`GOSSIP_PER_DRAIN`]; how many.
    fn drain_gossip(&mut self, gossip: &mut mpsc::Receiver<net::Event>) -> usize {
        let mut taken = 0;
        while taken < GOSSIP_PER_DRAIN {
            let Ok(e) = gossip.try_recv() else { break };
            self.handle_net(e);
            taken += 1;
        }
        taken
    }

    fn handle_request(&mut self, Request { command, reply }: Request) {
        self.next_command += 1;
        let id = CommandId(self.next_command);
        self.pending.insert(id, reply);
        self.core.handle_command(now(), id, command);
    }

    fn handle_input(&mut self, input: Input) {
        let started = Instant::now();
        let what = match &input {
            Input::Loaded { doc, chunks } => format!(
                "load of {doc} ({} bytes)",
                chunks
                    .as_ref()
                    .map_or(0, |c| c.iter().map(Vec::len).sum::<usize>())
            ),
            Input::Saved { .. } => "a save's answer".to_owned(),
            Input::RunEnded { .. } => "a run's end".to_owned(),
            Input::Progress { .. } => "a run's progress".to_owned(),
            Input::Archived { .. } => "an archive lookup".to_owned(),
            Input::Ends { .. } => "a lookup of kept ends".to_owned(),
            Input::Listed { .. } => "a listing's finished tasks".to_owned(),
            Input::Rotated(_) => "an epoch job's answer".to_owned(),
        };
        self.handle_input_now(input);
        long_input(started, || what);
    }

    fn handle_input_now(&mut self, input: Input) {
        match input {
            Input::Loaded { doc, chunks } => self.core.handle_loaded(now(), &doc, chunks),
            Input::Saved { id, result } => self.core.handle_saved(now(), id, result),
            Input::RunEnded { id, result } => {
                self.handlers.remove(&id);
                self.core.handle_run_ended(now(), id, result)
            }
            Input::Progress { id, progress } => self.core.handle_progress(id, progress),
            Input::Archived { task, status } => self.core.handle_archived(now(), task, status),
            Input::Ends { lookup, found } => self.core.handle_ends(now(), lookup, found),
            Input::Listed { cmd, entries } => self.core.handle_listed(now(), cmd, entries),
            Input::Rotated(built) => self.core.handle_rotated(now(), built),
        }
    }

    fn handle_net(&mut self, ev: net::Event) {
        let started = Instant::now();
        let what = match &ev {
            net::Event::SyncMessage { peer, data } => Some(format!(
                "a sync frame of {} bytes from {peer} about {}",
                data.len(),
                piecework_replica::Message::peek_doc(data)
                    .map_or_else(|| "no document".to_owned(), |d| d.to_string())
            )),
            net::Event::SyncOpened(peer) => Some(format!("a sync stream opened with {peer}")),
            _ => None,
        };
        self.handle_net_now(ev);
        if let Some(what) = what {
            long_input(started, || what);
        }
    }

    fn handle_net_now(&mut self, ev: net::Event) {
        let t = now();
        match ev {
            net::Event::Listening(addr) => {
                {
                    let mut listen = self
                        .shared
                        .listen
                        .write()
                        .unwrap_or_else(|e| e.into_inner());
                    if !listen.contains(&addr) {
                        listen.push(addr);
                    }
                }
                let addrs = self.shared.advertised();
                let _ = self.shared.events.send(NodeEvent::Listening(addrs.clone()));
                self.core.handle_addresses(t, addrs);
            }
            net::Event::Connected(peer) => tracing::debug!(%peer, "connected"),
            net::Event::Disconnected(peer) => tracing::debug!(%peer, "disconnected"),
            net::Event::SyncOpened(peer) => {
                self.stalled.remove(&peer);
                self.core.handle_connected(t, peer_of(&peer));
            }
            net::Event::SyncClosed(peer) => {
                self.stalled.remove(&peer);
                self.core.handle_disconnected(t, &peer_of(&peer));
            }
            net::Event::SyncWritable(peer) => {
                if self.flush_stalled(&peer) {
                    self.core.handle_unblocked(t, &peer_of(&peer));
                }
            }
            net::Event::SyncMessage { peer, data } => {
                self.core.handle_sync(t, &peer_of(&peer), &data);
            }
            net::Event::Subscribed { peer, topic } => {
                if let Some(member) = self.core.gossip_standing(&topic, &peer_of(&peer)) {
                    self.shared.net.standing(peer, member);
                }
            }
            net::Event::Message {
                topic,
                source,
                via,
                id,
                data,
            } => {
                let at = Instant::now();
                self.pace.gossip_at = Some(at);
                if let Some((gap, usual)) = Cadence::tick(&mut self.pace.heard, source, at) {
                    // Why a router is deposed: its heartbeats did not come (see `Pace`).
                    tracing::info!(
                        peer = %source,
                        gap_ms = gap.as_millis(),
                        usual_ms = usual.as_millis(),
                        // A silence this node's own long turn made, if about as long.
                        own_turn_ms = self.pace.last_turn.as_millis(),
                        "gossip from a peer resumed after a silence"
                    );
                }
                let verdict =
                    self.core
                        .handle_gossip(t, &topic, &peer_of(&source), &peer_of(&via), &data);
                let acceptance = match verdict {
                    piecework_core::GossipVerdict::Accept => net::MessageAcceptance::Accept,
                    piecework_core::GossipVerdict::Reject => net::MessageAcceptance::Reject,
                    piecework_core::GossipVerdict::Ignore => net::MessageAcceptance::Ignore,
                };
                self.shared.net.validate(id, via, acceptance);
            }
        }
    }

    /// Resends frames the transport refused; true once none is left.
    fn flush_stalled(&mut self, peer: &net::PeerId) -> bool {
        let Some(frames) = self.stalled.get_mut(peer) else {
            return true;
        };
        while let Some(frame) = frames.pop_front() {
            match self.shared.net.send_sync(peer, frame.clone()) {
                net::sync::SendOutcome::Queued => {}
                net::sync::SendOutcome::Blocked => {
                    frames.push_front(frame);
                    return false;
                }
                // The stream is gone or the frame can never fit: the stream's close resets the
                // sync state, which repairs anything lost.
                net::sync::SendOutcome::NoStream | net::sync::SendOutcome::TooLarge => {}
            }
        }
        self.stalled.remove(peer);
        true
    }

    /// Carries out everything the core asks for.
    fn drain(&mut self) {
        loop {
            let mut any = false;
            while let Some((peer, frame)) = self.core.poll_transmit(Instant::now()) {
                any = true;
                self.send(&peer, frame);
            }
            while let Some(io) = self.core.poll_io() {
                any = true;
                self.perform(io);
            }
            // Events first: a reply's caller may look at a view the same turn published.
            while let Some(ev) = self.core.poll_event() {
                any = true;
                self.event(ev);
            }
            while let Some((id, reply)) = self.core.poll_reply() {
                any = true;
                if let Reply::Stopped(report) = &reply {
                    tracing::info!(?report, "stopped");
                    self.stopped = true;
                }
                if let Some(tx) = self.pending.remove(&id) {
                    let _ = tx.send(reply);
                }
            }
            if !any {
                break;
            }
        }
    }

    fn send(&mut self, peer: &PeerId, frame: Vec<u8>) {
        let Ok(p) = peer.as_str().parse::<net::PeerId>() else {
            return;
        };
        if let Some(q) = self.stalled.get_mut(&p) {
            q.push_back(frame);
            return;
        }
        match self.shared.net.send_sync(&p, frame.clone()) {
            net::sync::SendOutcome::Queued => {}
            net::sync::SendOutcome::Blocked => {
                self.stalled.entry(p).or_default().push_back(frame);
                self.core.handle_blocked(peer);
            }
            net::sync::SendOutcome::NoStream => {
                tracing::debug!(%peer, "sync message not sent: no stream");
            }
            net::sync::SendOutcome::TooLarge => {
                tracing::warn!(%peer, "sync message larger than the transport's budget, dropped");
            }
        }
    }

    fn perform(&mut self, io: Io) {
        match io {
            Io::Load { doc } => {
                let store = self.shared.store.clone();
                let tx = self.inputs_tx.clone();
                tokio::spawn(async move {
                    let chunks = store
                        .load_doc(doc.as_str())
                        .await
                        .map_err(|e| StorageFailure(e.detail()));
                    let _ = tx.send(Input::Loaded { doc, chunks }).await;
                });
            }
            Io::Save(save) => {
                let store = self.shared.store.clone();
                let compactor = self.compactor.clone();
                let tx = self.inputs_tx.clone();
                let Save {
                    id,
                    doc,
                    changes,
                    compact,
                } = save;
                // Enqueued now, in the order the core asked (after a queue's record).
                let appended = store.append(doc.as_str(), changes);
                tokio::spawn(async move {
                    let result = save_doc(&store, &compactor, &doc, appended, compact).await;
                    if let Err(e) = &result {
                        tracing::error!(%doc, "cannot save changes: {e}");
                    }
                    let _ = tx.send(Input::Saved { id, result }).await;
                });
            }
            Io::Run(req) => self.run_handler(req),
            Io::Abort { run } => {
                if let Some((cancel, task)) = self.handlers.remove(&run) {
                    tracing::info!(?run, "a run interrupted by the stop is cancelled");
                    // The token first (a handler on the blocking pool can only stop there),
                    // then the task itself.
                    cancel.cancel();
                    task.abort();
                }
            }
            Io::Cancel { run } => {
                if let Some((cancel, _)) = self.handlers.get(&run) {
                    tracing::info!(
                        ?run,
                        "a run is asked to stop (cancelled, or past its timeout)"
                    );
                    cancel.cancel();
                }
            }
            Io::Rotate(job) => {
                if self.epochs.send((job, self.inputs_tx.clone())).is_err() {
                    tracing::error!("the epoch thread is gone: a rotation is dropped");
                }
            }
            Io::Dial { peer, addrs } => {
                let Ok(peer) = peer.as_str().parse::<net::PeerId>() else {
                    return;
                };
                let addrs: Vec<net::Multiaddr> =
                    addrs.iter().filter_map(|a| a.parse().ok()).collect();
                if addrs.is_empty() {
                    return;
                }
                let net = self.shared.net.clone();
                tokio::spawn(async move {
                    if let Err(e) = net.dial_peer(peer, addrs).await {
                        tracing::trace!(%peer, "dial: {e}");
                    }
                });
            }
            Io::Publish { topic, data } => {
                let at = Instant::now();
                let st = std::mem::take(&mut self.pace.since_publish);
                if let Some((gap, usual)) =
                    Cadence::tick(&mut self.pace.published, topic.clone(), at)
                {
                    tracing::info!(
                        %topic,
                        gap_ms = gap.as_millis(),
                        usual_ms = usual.as_millis(),
                        turns = st.turns,
                        busy_ms = st.busy.as_millis(),
                        longest_turn_ms = st.longest.as_millis(),
                        longest_wait_ms = st.idle.as_millis(),
                        woke_late_ms = st.late.as_millis(),
                        "published after a silence"
                    );
                }
                self.shared.net.publish(topic, data);
            }
            Io::Standing { peer, member } => {
                if let Ok(p) = peer.as_str().parse::<net::PeerId>() {
                    self.shared.net.standing(p, member);
                }
            }
            Io::Subscribe { topic } => {
                let net = self.shared.net.clone();
                tokio::spawn(async move {
                    let _ = net.subscribe(topic).await;
                });
            }
            Io::Archive {
                records,
                listed,
                ends,
            } => {
                let store = self.shared.store.clone();
                tokio::spawn(async move {
                    let listed = listed
                        .into_iter()
                        .map(|l| {
                            let (q, t) = (l.queue.to_string(), l.task.to_string());
                            (q, l.state.as_str(), t, l.entry)
                        })
                        .collect();
                    if let Err(e) = store.list(listed).await {
                        tracing::warn!(
                            "cannot keep finished tasks for listings yet (the store keeps them and retries): {e}"
                        );
                    }
                    let records = records
                        .into_iter()
                        .map(|(t, json)| (t.as_str().to_owned(), json))
                        .collect();
                    if let Err(e) = store.archive(records).await {
                        tracing::warn!(
                            "cannot archive final task statuses yet (the store keeps them and retries): {e}"
                        );
                    }
                    let ends = ends
                        .into_iter()
                        .map(|(t, end)| (t.as_str().to_owned(), end))
                        .collect();
                    if let Err(e) = store.keep_ends(ends).await {
                        tracing::warn!(
                            "cannot keep the ends of finished tasks yet (the store keeps them and retries): {e}"
                        );
                    }
                });
            }
            Io::ListFinished {
                cmd,
                queue,
                state,
                after,
                limit,
            } => {
                let store = self.shared.store.clone();
                let tx = self.inputs_tx.clone();
                tokio::spawn(async move {
                    let state = state.map(|s| s.as_str());
                    let after = after.as_ref().map(|a| a.as_str());
                    let entries = match store.listed(queue.as_str(), state, after, limit).await {
                        Ok(e) => e,
                        Err(e) => {
                            tracing::error!(%queue, "cannot read the finished tasks to list: {e}");
                            Vec::new()
                        }
                    };
                    let _ = tx.send(Input::Listed { cmd, entries }).await;
                });
            }
            Io::Lookup { task } => {
                let store = self.shared.store.clone();
                let tx = self.inputs_tx.clone();
                tokio::spawn(async move {
                    let status = match store.archived(task.as_str()).await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::error!(%task, "cannot read the archive: {e}");
                            None
                        }
                    };
                    let _ = tx.send(Input::Archived { task, status }).await;
                });
            }
            Io::LookupEnds {
                lookup,
                tasks,
                failed_in,
            } => {
                let store = self.shared.store.clone();
                let tx = self.inputs_tx.clone();
                tokio::spawn(async move {
                    let tasks = tasks.iter().map(|t| t.as_str().to_owned()).collect();
                    let failed_in = failed_in.map(|q| q.as_str().to_owned());
                    let found = match store.ends(tasks, failed_in).await {
                        Ok(found) => found
                            .into_iter()
                            .map(|(t, end)| (TaskId::new(t), end))
                            .collect(),
                        Err(e) => {
                            tracing::error!("cannot read the kept ends of finished tasks: {e}");
                            Vec::new()
                        }
                    };
                    let _ = tx.send(Input::Ends { lookup, found }).await;
                });
            }
            Io::Retire { doc, kind } => {
                let store = self.shared.store.clone();
                let kind = match kind {
                    piecework_core::Retired::Task => crate::storage::RetiredKind::Task,
                    piecework_core::Retired::Epoch => crate::storage::RetiredKind::Epoch,
                };
                tokio::spawn(async move {
                    if let Err(e) = store.retire(doc.as_str(), kind).await {
                        tracing::warn!(%doc, "cannot record a retired document yet (the store keeps it and retries): {e}");
                    }
                });
            }
            Io::Delete { doc } => {
                let store = self.shared.store.clone();
                tokio::spawn(async move {
                    match store.delete_doc(doc.as_str()).await {
                        Ok(()) => tracing::debug!(%doc, "deleted a retired document"),
                        Err(e) => {
                            tracing::warn!(%doc, "cannot delete a retired document yet (the store keeps the deletion and retries): {e}")
                        }
                    }
                });
            }
            Io::Quarantine { doc, chunk } => {
                let store = self.shared.store.clone();
                tokio::spawn(async move {
                    if let Err(e) = store.quarantine(doc.as_str(), chunk).await {
                        tracing::warn!(%doc, "cannot move a chunk aside yet (the store keeps the move and retries): {e}");
                    }
                });
            }
            Io::RememberEpoch { queue, doc } => {
                let store = self.shared.store.clone();
                tokio::spawn(async move {
                    if let Err(e) = store.set_epoch(queue.as_str(), doc.as_str()).await {
                        tracing::warn!(%queue, "cannot remember the queue's epoch yet (the store keeps it and retries): {e}");
                    }
                });
            }
            Io::RememberQueue { id, name } => {
                // Enqueued now: before the queue document's write, which a create or join
                // waits on.
                let remembered = self.shared.store.add_queue(id.as_str(), &name);
                tokio::spawn(async move {
                    if let Err(e) = remembered.await {
                        tracing::warn!(queue = %id, "cannot remember the queue yet (the store keeps the record and retries): {e}");
                    }
                });
            }
        }
    }

    fn run_handler(&mut self, req: RunRequest) {
        let registry = self.shared.registry.clone();
        let tx = self.inputs_tx.clone();
        let ctx = Context::new(req.task.clone(), req.attempt.clone(), req.worker.clone())
            .with_attempt(req.number);
        let id = req.id;
        let cancel = ctx.cancellation().clone();
        // The handler's progress reports, to the core (the latest only, as they come).
        let mut progress = ctx.watch_progress();
        let progress_tx = tx.clone();
        tokio::spawn(async move {
            while progress.changed().await.is_ok() {
                let Some(p) = *progress.borrow_and_update() else {
                    continue;
                };
                let input = Input::Progress { id, progress: p };
                if progress_tx.send(input).await.is_err() {
                    break;
                }
            }
        });
        let handle = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let outcome = execute(&registry, &req.kind, ctx, req.input).await;
            let result = RunResult {
                result: outcome.result,
                logs: outcome.logs,
                planned: outcome.planned,
            };
            let _ = tx.send(Input::RunEnded { id: req.id, result }).await;
        }));
        self.handlers.insert(id, (cancel, handle.abort_handle()));
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Epoch { queue, event } => {
                tracing::info!(%queue, ?event, "epoch");
            }
            Event::Router { queue, event } => {
                if let RouterEvent::Claimed(_) = &event {
                    // Why a follower stopped hearing the router: silence on the wire, or a
                    // loop that did not run (a long turn, a timer that fired late).
                    let p = &self.pace;
                    tracing::info!(
                        %queue,
                        ?event,
                        gossip_ms_ago = p.gossip_at.map(|t| t.elapsed().as_millis()),
                        last_turn_ms = p.last_turn.as_millis(),
                        woke_late_ms = p.woke_late.as_millis(),
                        "router claims"
                    );
                } else {
                    tracing::info!(%queue, ?event, "router");
                }
                let _ = self.shared.events.send(NodeEvent::Router { queue, event });
            }
            Event::Queue(e) => self.shared.queue_events.push(e),
            Event::View { queue, view } => {
                let tx = self.views.entry(queue.clone()).or_insert_with(|| {
                    let (tx, rx) = watch::channel(view.clone());
                    let mut views = self.shared.views.write().unwrap_or_else(|e| e.into_inner());
                    views.insert(queue.clone(), rx);
                    tx
                });
                tx.send_replace(view);
            }
            Event::RunStarted {
                queue,
                task,
                worker,
                ..
            } => {
                let _ = self.shared.events.send(NodeEvent::RunStarted {
                    queue,
                    task,
                    worker: worker.to_string(),
                });
            }
            Event::RunEnded { queue, task, ok } => {
                let _ = self
                    .shared
                    .events
                    .send(NodeEvent::RunEnded { queue, task, ok });
            }
            Event::NotRun {
                task,
                attempt,
                outcome,
                reason,
            } => tracing::info!(%task, %attempt, ?outcome, reason, "attempt not run"),
            Event::Rejected { peer, reason } => {
                tracing::warn!(%peer, "rejected a peer's message: {reason}")
            }
            Event::SaveFailed {
                doc,
                failures,
                error,
            } => tracing::error!(%doc, failures, "writes keep failing: {error}"),
            Event::LoadFailed { doc, error } => tracing::warn!(%doc, "cannot load: {error}"),
            Event::StoreFailing { error } => {
                tracing::error!(
                    "the disk refuses writes: submits are refused until it takes them again: {error}"
                );
                let _ = self.shared.events.send(NodeEvent::Store {
                    failing: Some(error.to_string()),
                });
            }
            Event::StoreRecovered => {
                tracing::warn!("the disk takes writes again: submits are taken again");
                let _ = self.shared.events.send(NodeEvent::Store { failing: None });
            }
            Event::Quarantined { doc, bytes, error } => {
                self.shared
                    .quarantined
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%doc, bytes, "a stored chunk does not decode: moved aside into the store's quarantine table, the rest of the document loaded ({error})");
            }
            Event::FetchFailed { task, timed_out } => {
                tracing::warn!(%task, timed_out, "no reachable member has the task's document")
            }
        }
    }
}
