//! Piecework's node as a pure state machine: every decision a node makes, with no I/O.
//!
//! A [`Core`] owns the node's documents (a [`piecework_replica::Replica`]), one
//! [`piecework_router::Router`] per joined queue, the worker [`piecework_worker_pool::Pool`],
//! the queue views, the requests waiting on something (joins, submits, task waits), and the
//! bookkeeping of what is loaded, saved and evictable. It reads no clock, draws no OS randomness,
//! opens no file and no socket: time comes in on every call ([`Time`]), randomness from the seed
//! in [`Config`], and everything the node must do outside comes out as data. The node's shell
//! (`piecework-node`) performs that I/O with tokio, redb and libp2p; the simulator
//! (`piecework-sim`) performs it against models of a network, a disk and handler runs. Both run
//! this same code, in the style of quinn-proto and samod-core.
//!
//! # Driving a core
//!
//! Methods come in four kinds:
//!
//! - **getters** ([`Core::peer`], [`Core::view`], [`Core::is_active`], …);
//! - **inputs**, `handle_*`: a sync frame or a gossip message from a peer
//!   ([`Core::handle_sync`], [`Core::handle_gossip`]), a sync stream opened or closed
//!   ([`Core::handle_connected`], [`Core::handle_disconnected`]) or out of send credit
//!   ([`Core::handle_blocked`], [`Core::handle_unblocked`]), the node's listen addresses
//!   ([`Core::handle_addresses`]), the answer to an I/O request ([`Core::handle_loaded`],
//!   [`Core::handle_saved`], [`Core::handle_run_ended`], [`Core::handle_archived`],
//!   [`Core::handle_rotated`]), a command from the API with an id
//!   ([`Core::handle_command`]), and a timer ([`Core::handle_timeout`]);
//! - **outputs**, `poll_*`: frames to send ([`Core::poll_transmit`]), I/O to perform
//!   ([`Core::poll_io`]: load, save (a compaction's snapshot is saved by the driver, from a
//!   copy: [`Compact::build`]), run a handler, build a successor epoch document off the core's
//!   thread ([`Rotate::build`]), archive or look up a status, dial, publish, subscribe), replies to
//!   commands matched by their [`CommandId`] ([`Core::poll_reply`]), and events for logs and
//!   displays ([`Core::poll_event`]);
//! - the next deadline, [`Core::poll_timeout`]: call [`Core::handle_timeout`] then.
//!
//! After every input, drain every `poll_*` output, then ask for the next deadline. Each input
//! runs the node's state machines until they have nothing more to do, so the order of outputs
//! depends only on the order of inputs: a seeded simulation replays exactly.
//!
//! ```
//! use std::time::Instant;
//! use piecework_core::{Command, CommandId, Config, Core, Io, Reply, Time};
//! use piecework_queue_doc::PeerId;
//!
//! let t0 = Time { mono: Instant::now(), unix_ms: 1_800_000_000_000 };
//! let mut core = Core::new(Config::new(PeerId::new("me"), 1, 2, 7), t0);
//! core.handle_command(t0, CommandId(1), Command::CreateQueue {
//!     name: "emails".into(),
//!     config: Default::default(),
//! });
//! // The new queue document must be saved: the core asks for it, and answers once it is.
//! let save = std::iter::from_fn(|| core.poll_io())
//!     .find_map(|io| match io { Io::Save(s) => Some(s), _ => None })
//!     .unwrap();
//! assert!(core.poll_reply().is_none());
//! core.handle_saved(t0, save.id, Ok(Default::default()));
//! let Some((CommandId(1), Reply::Created(Ok(queue)))) = core.poll_reply() else { panic!() };
//! assert!(core.view(&queue).is_some());
//! ```
//!
//! # Durability
//!
//! Saves are ordered per document: one write per document is in flight at a time, and each
//! carries every change since the last acknowledged one. A write that fails is retried with a
//! backoff; after [`SAVE_FAILURES_REPORTED`] failures in a row the core reports
//! [`Event::SaveFailed`] and fails the submits waiting on that document. After as many
//! failures in a row of any documents the store as a whole is failing ([`Event::StoreFailing`]):
//! submits are refused before they change anything, until a write succeeds. A submit is
//! acknowledged only when its changes, and every earlier change of both its documents, are on
//! disk. A document with changes not yet on disk is never evicted.

#![warn(missing_docs, unreachable_pub)]

pub mod api;
pub mod invite;
mod node;
mod retention;
mod saves;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use piecework_queue_doc::task::RunStart;
use piecework_queue_doc::{AttemptId, Claim, PeerId, QueueConfig, QueueId, QueueView, TaskId};
use piecework_queue_doc::{TaskState, WorkerId, task};
use piecework_replica::DocId;

pub use node::{Core, topic_for};
pub use piecework_router::{Event as RouterEvent, Role};
pub use piecework_worker_pool::CANCEL_GRACE;
pub use wire::{Ask, Wire};

/// How often a node dials members of its queues it is not connected to.
pub const DIAL_EVERY: Duration = Duration::from_secs(2);

/// The most members dialed per round ([`DIAL_EVERY`], or at once when a member list
/// changes): a member list of thousands (written by any member) must not turn into thousands
/// of dials every two seconds. Rounds take the members in turn, so each is dialed within
/// `members / MAX_DIALS_PER_ROUND` rounds.
pub const MAX_DIALS_PER_ROUND: usize = 32;

/// The most addresses dialed per member: a member's entry may list any number.
pub const MAX_ADDRS_PER_MEMBER: usize = 8;
/// A save compacts a document's stored change chunks into one snapshot once they outweigh its
/// last snapshot, and are at least this many bytes: small documents are not rewritten for
/// every few changes, and a large one is rewritten only after as many bytes of changes as it
/// holds, so compaction costs O(1) per byte changed, not O(history) per save.
pub const COMPACT_MIN_BYTES: usize = 64 * 1024;
/// How long a submit waits for a connected member to hold the new task before it is answered
/// with `replicated: false`.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(5);
/// How long a join or a task lookup waits for peers to answer.
pub const FIND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a member waits for what a successor's seal covered of the document it continues
/// (asking the members for it) before it moves to the successor without it: no member may
/// have it any more (`Config::keep_sealed_epochs`).
pub const BEHIND_WAIT: Duration = Duration::from_secs(10);
/// The longest a task wait may last.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
/// Requests parked at once (joins, task lookups and waits): beyond this a request is answered
/// `Busy` at once. Bounds the waiter lists, whose callers are remote (HTTP clients).
pub const MAX_WAITERS: usize = 4096;

/// The most status requests for ids this node has no record of that wait for the members'
/// answers (each up to [`FIND_TIMEOUT`]): lookups of unknown ids (mistyped, or sent on
/// purpose) cannot take the waits of [`MAX_WAITERS`] from lookups this node can answer.
/// Beyond it such a request is answered "not found" at once.
pub const MAX_ASKING: usize = 256;
/// Submits waiting for durability or replication at once; beyond this a submit is answered
/// `Busy`. Each holds two documents' heads, so this bounds that memory.
pub const MAX_PENDING_SUBMITS: usize = 8192;
/// Failed writes of one document in a row after which the core reports it and fails the
/// submits waiting on it (it keeps retrying).
pub const SAVE_FAILURES_REPORTED: u32 = 3;
/// The first retry delay of a failed write; it doubles per failure up to [`SAVE_RETRY_MAX`].
pub const SAVE_RETRY: Duration = Duration::from_millis(50);
/// The longest delay between retries of a failed write.
pub const SAVE_RETRY_MAX: Duration = Duration::from_secs(5);
/// Failed loads of one document after which it is treated as absent (each is retried after
/// [`SAVE_RETRY`] doubled).
pub const LOAD_ATTEMPTS: u32 = 4;
/// How long a document loaded for a peer's request or a lookup stays in memory unused.
pub const IDLE_EVICT: Duration = Duration::from_secs(5);
/// The most workers one node runs.
pub const MAX_WORKERS: u32 = 256;
/// How long a stopping node ([`Command::Stop`]) waits, after its grace time, for its last
/// writes to reach the disk before it answers with what is still unsaved.
pub const STOP_FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Time as the core sees it: the node's monotonic clock for every timer, and the wall clock for
/// the timestamps written into documents (unix milliseconds). Remote clocks are never compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Time {
    /// The monotonic clock.
    pub mono: Instant,
    /// The wall clock, unix milliseconds.
    pub unix_ms: u64,
}

/// A core's fixed settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This node's peer id.
    pub peer: PeerId,
    /// How many times this node has started; every start must have a greater one.
    pub incarnation: u64,
    /// Task workers in this node's pool (at most [`MAX_WORKERS`]).
    pub workers: u32,
    /// Seeds every random choice: document ids, and this incarnation's Automerge actor id.
    /// A node draws it from the OS at start, a simulation from its seed.
    pub seed: u64,
    /// When this node, as a queue's active router, rotates the queue document into a new
    /// epoch: its finished tasks outweigh `rotate_ratio` times its live ones, and at least
    /// `rotate_ratio × rotate_min_live` ([`piecework_queue_doc::epoch::should_rotate`]).
    pub rotate_ratio: usize,
    /// See `rotate_ratio`.
    pub rotate_min_live: usize,
    /// How many times a successor is brought up to date off the node's thread before the
    /// last catch-up, during which the queue stands still ([`CATCH_UPS`] by default; see
    /// [`Rotate`]).
    pub catch_ups: u32,
    /// How long a sealed epoch's document is kept after this node moved past it
    /// ([`EPOCH_RETAIN`] by default).
    pub epoch_retain: Duration,
    /// The largest input (bytes of JSON text) this node submits inline: in the queue
    /// document's entry, with no task document ([`INLINE_INPUT_MAX`] by default; 0 gives every
    /// task a document).
    pub inline_input_max: usize,
    /// The most live tasks (pending, assigned, running or waiting for their input) a queue
    /// takes submits for ([`MAX_LIVE`] by default): a submit to a queue that has as many, in
    /// this node's view, is refused with [`api::SubmitError::Full`] until some finish. A soft
    /// bound: a batch is taken whole while the count is below it, and nodes that submit at
    /// once each count what they have seen.
    pub max_live: usize,
    /// How many tasks' ends this node keeps in memory (4,096 by default): a move to another
    /// branch writes them into it, and listings show them beside the store's.
    pub recent_ends: usize,
    /// How long a handler asked to stop (its task cancelled, or its run past its timeout) may
    /// go on before its end is recorded without it
    /// ([`CANCEL_GRACE`], 5 s, by default).
    pub cancel_grace: Duration,
    /// Documents of finished tasks this node keeps on disk ([`KEEP_TASK_DOCS`] by default):
    /// beyond this many, the documents of the tasks that finished first (as this node saw
    /// them) are deleted, and those tasks answer here as unknown. Inline tasks have no
    /// document; their statuses have the store's archive and its own bound.
    pub keep_task_docs: usize,
    /// Sealed epoch documents this node keeps on disk once they left memory, over all its
    /// queues ([`KEEP_SEALED_EPOCHS`] by default): beyond this many, the oldest are deleted,
    /// except the predecessor of a document this node holds. A queue's first document is
    /// never retired.
    pub keep_sealed_epochs: usize,
    /// The documents retired before this start and not deleted yet, oldest first, as the
    /// store recorded them from [`Io::Retire`].
    pub retired: Vec<(DocId, Retired)>,
    /// The epoch document each queue was on when this node last stopped, as the store
    /// recorded them from [`Io::RememberEpoch`]. A reopened queue resumes there once that
    /// document is read back, instead of walking the chain of sealed epochs from the queue's
    /// first document: a restart then reads what changed while the node was down, not the
    /// queue's history.
    pub resume: Vec<(QueueId, DocId)>,
    /// How long the replica waits before passing a peer's changes on to a third, lower and
    /// higher peer id of the pair (`None`: `piecework_replica::RELAY_AFTER` and
    /// `RELAY_AFTER_HIGHER`). The simulator varies it to explore other timings.
    pub relay_waits: Option<(Duration, Duration)>,
    /// The handler kinds this node runs: its pool's heartbeats name them, so routers assign
    /// it only tasks of these kinds, and it refuses others. `None`: not reported (routers
    /// take the pool to run any kind).
    pub kinds: Option<Vec<String>>,
    /// The resources this node's pool holds at start (`piecework node --resource`).
    pub resources: Vec<String>,
    /// The 32 secret bytes of this node's ed25519 identity key, which signs its membership
    /// operations and invites (`piecework_queue_doc::membership`): for a libp2p peer id, the
    /// key the id is made of. By default (simulations, tests) a key derived from the peer id,
    /// which anyone can derive: a node sets its own with [`Config::with_identity_key`].
    pub identity_key: [u8; 32],
}

fn peer_key_seed(peer: &PeerId) -> Vec<u8> {
    let mut seed = b"piecework/derived-identity/".to_vec();
    seed.extend_from_slice(peer.as_str().as_bytes());
    seed
}

/// 32 bytes drawn from `seed` (ChaCha): the identity key of a core given none.
fn derived_key(seed: &[u8]) -> [u8; 32] {
    let mut s = [0u8; 32];
    for (i, b) in seed.iter().enumerate() {
        s[i % 32] ^= b.rotate_left((i / 32) as u32);
    }
    use rand::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::from_seed(s);
    let mut key = [0u8; 32];
    rng.fill_bytes(&mut key);
    key
}

/// The default `Config::keep_task_docs`: as many as the store's archive keeps statuses of
/// inline tasks, so that both kinds of task answer for about as long.
pub const KEEP_TASK_DOCS: usize = 100_000;

/// The default `Config::keep_sealed_epochs`: as many as a successor hands on covers for
/// (`piecework_queue_doc::epoch::COVER_EPOCHS`). A member that comes back behind documents
/// every member deleted moves past them (`EpochEvent::Switched::missing`) and carries its
/// late writes with the covers of the current epoch, which say what the chain absorbed of the
/// document it left: it needs none of the deleted documents. One that comes back more than
/// `COVER_EPOCHS` rotations later finds no cover, and its late writes wait for a member that
/// kept the documents between (docs/protocol.md).
pub const KEEP_SEALED_EPOCHS: usize = piecework_queue_doc::epoch::COVER_EPOCHS as usize;

/// Why a document was retired ([`Io::Retire`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Retired {
    /// A finished task's document.
    Task,
    /// A sealed epoch document that left memory.
    Epoch,
}

/// The default `Config::max_live`. Every sync message of a queue document costs each replica
/// Automerge work in proportion to the document's tasks (its apply walks the maps a message
/// touches, and the change graph), so an unbounded backlog of pending tasks slows every node
/// until a router misses its heartbeats. Three node processes fed faster than they finished
/// (fast timings) ran steadily with 2,000 live tasks (1,080 tasks/s, no takeover, 28 epochs
/// over 100,000 tasks) and fell into takeovers with 10,000 (docs/benchmarks.md).
pub const MAX_LIVE: usize = 2_000;

/// The most bytes of output (result JSON plus log lines) one run of an inline task keeps: its
/// output goes into its queue document, which every member syncs and which holds the outputs
/// of every task finished since the last rotation. A larger result fails the run ("result too
/// large for an inline task"); logs beyond the rest of the budget are dropped and counted.
/// (A task with a document of its own keeps up to the runner's limits: a result of
/// `piecework_worker_pool::runner::MAX_RESULT_BYTES`, logs of `MAX_LOG_BYTES`.)
pub const MAX_INLINE_OUTPUT_BYTES: usize = 8 * 1024;

/// The default `Config::inline_input_max`. A task whose input's JSON text is at most this
/// long lives in its queue document alone: its input in its entry, its runs' results and
/// logs with their ends. A larger input gets a task document of its own.
pub const INLINE_INPUT_MAX: usize = 256;

/// The default `Config::rotate_ratio`.
pub const ROTATE_RATIO: usize = 2;
/// The default `Config::rotate_min_live`: a queue document rotates after about
/// `ROTATE_RATIO × ROTATE_MIN_LIVE` finished tasks when few are live.
pub const ROTATE_MIN_LIVE: usize = 512;
/// The default `Config::catch_ups`: each carries the writes made while the one before ran,
/// which under a steady load take about as long to carry as they took to write; the queue
/// then stands still for the last one (tens of milliseconds) rather than a turn carrying
/// them all.
pub const CATCH_UPS: u32 = 2;
/// How long a node keeps a sealed epoch's document after it moved on, carrying the late writes
/// it receives; then the document leaves memory.
pub const EPOCH_RETAIN: Duration = Duration::from_secs(60);

impl Config {
    /// The settings of node `peer` in its `incarnation`-th start.
    pub fn new(peer: PeerId, incarnation: u64, workers: u32, seed: u64) -> Self {
        Config {
            incarnation,
            workers: workers.min(MAX_WORKERS),
            seed,
            rotate_ratio: ROTATE_RATIO,
            rotate_min_live: ROTATE_MIN_LIVE,
            catch_ups: CATCH_UPS,
            epoch_retain: EPOCH_RETAIN,
            inline_input_max: INLINE_INPUT_MAX,
            max_live: MAX_LIVE,
            recent_ends: 4_096,
            cancel_grace: piecework_worker_pool::CANCEL_GRACE,
            keep_task_docs: KEEP_TASK_DOCS,
            keep_sealed_epochs: KEEP_SEALED_EPOCHS,
            retired: Vec::new(),
            resume: Vec::new(),
            relay_waits: None,
            kinds: None,
            resources: Vec::new(),
            identity_key: derived_key(&peer_key_seed(&peer)),
            peer,
        }
    }

    /// The same settings, signing with the identity key whose secret bytes are `secret`.
    pub fn with_identity_key(mut self, secret: [u8; 32]) -> Self {
        self.identity_key = secret;
        self
    }

    /// The same settings, reporting the handler `kinds` this node runs and holding
    /// `resources` from the start (see `Config::kinds`).
    pub fn with_capabilities(mut self, kinds: Option<Vec<String>>, resources: Vec<String>) -> Self {
        self.kinds = kinds;
        self.resources = resources;
        self
    }

    /// The same settings, with the replica's relay waits (see `Config::relay_waits`).
    pub fn with_relay_waits(mut self, waits: Option<(Duration, Duration)>) -> Self {
        self.relay_waits = waits;
        self
    }

    /// The same settings, keeping at most `task_docs` finished tasks' documents and
    /// `sealed_epochs` sealed epoch documents on disk (see `Config::keep_task_docs`).
    pub fn with_disk_retention(mut self, task_docs: usize, sealed_epochs: usize) -> Self {
        self.keep_task_docs = task_docs;
        self.keep_sealed_epochs = sealed_epochs;
        self
    }

    /// The same settings, with the documents retired before this start (see
    /// `Config::retired`).
    pub fn with_retired(mut self, retired: Vec<(DocId, Retired)>) -> Self {
        self.retired = retired;
        self
    }

    /// The same settings, resuming each queue at the epoch document the store remembers (see
    /// `Config::resume`).
    pub fn with_resume(mut self, resume: Vec<(QueueId, DocId)>) -> Self {
        self.resume = resume;
        self
    }

    /// The same settings, submitting inputs of at most `max` bytes inline (see
    /// `Config::inline_input_max`).
    pub fn with_inline_input_max(mut self, max: usize) -> Self {
        self.inline_input_max = max;
        self
    }

    /// The same settings, with `n` catch-ups of a successor (see `Config::catch_ups`).
    pub fn with_catch_ups(mut self, n: u32) -> Self {
        self.catch_ups = n;
        self
    }

    /// The same settings, keeping sealed epochs for `retain` (see `Config::epoch_retain`).
    pub fn with_epoch_retain(mut self, retain: Duration) -> Self {
        self.epoch_retain = retain;
        self
    }

    /// The same settings, taking submits for at most `max` live tasks per queue (see
    /// `Config::max_live`; at least 1).
    pub fn with_max_live(mut self, max: usize) -> Self {
        self.max_live = max.max(1);
        self
    }

    /// The same settings, with another grace time for handlers asked to stop (see
    /// `Config::cancel_grace`).
    pub fn with_cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// The same settings, keeping the ends of at most `n` tasks in memory (see
    /// `Config::recent_ends`; at least 1).
    pub fn with_recent_ends(mut self, n: usize) -> Self {
        self.recent_ends = n.max(1);
        self
    }

    /// The same settings, rotating queue documents at another threshold (see
    /// `Config::rotate_ratio`).
    pub fn with_rotation(mut self, ratio: usize, min_live: usize) -> Self {
        self.rotate_ratio = ratio.max(1);
        self.rotate_min_live = min_live.max(1);
        self
    }
}

/// Identifies a command, so that its reply can be matched ([`Core::poll_reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommandId(pub u64);

/// Identifies a write requested by [`Io::Save`], for [`Core::handle_saved`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SaveId(pub u64);

/// Identifies a handler run requested by [`Io::Run`], for [`Core::handle_run_ended`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(pub u64);

/// What the transport should do with a gossip message ([`Core::handle_gossip`]): gossipsub's
/// validation result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GossipVerdict {
    /// A member's well-formed heartbeat: deliver and pass on.
    Accept,
    /// From or through a non-member, malformed, or claiming another sender: drop, do not pass
    /// on, and count against the peer that sent it (gossipsub's peer score).
    Reject,
    /// For a queue this node does not serve: drop, without blame.
    Ignore,
}

/// A request from the API.
#[derive(Clone, Debug)]
pub enum Command {
    /// Create a queue with this node as its first member: [`Reply::Created`].
    CreateQueue {
        /// Its name.
        name: String,
        /// Its configuration.
        config: QueueConfig,
    },
    /// Join a queue a peer has, or reopen one joined before (stored here): [`Reply::Joined`].
    /// Waits up to [`FIND_TIMEOUT`] for a peer that has it.
    JoinQueue {
        /// The queue.
        id: QueueId,
        /// Ask connected peers if the document is not stored here.
        from_peers: bool,
    },
    /// Join a queue with an invite token ([`crate::invite`]): [`Reply::Joined`]. Waits up
    /// to [`FIND_TIMEOUT`] for the invite's member to admit this node.
    JoinInvite {
        /// The token.
        token: String,
    },
    /// Make an invite to a queue (this node must be an admin of it): [`Reply::Invited`].
    Invite {
        /// The queue.
        queue: QueueId,
        /// Its role, peer and expiry.
        request: api::InviteRequest,
    },
    /// A queue's members: [`Reply::Members`].
    Members {
        /// The queue.
        queue: QueueId,
    },
    /// Remove a member (this node must be an admin, or the member): [`Reply::Members`].
    RemoveMember {
        /// The queue.
        queue: QueueId,
        /// The member.
        peer: PeerId,
    },
    /// Pause or resume routing: [`Reply::Paused`].
    SetPaused {
        /// The queue.
        queue: QueueId,
        /// Paused or not.
        paused: bool,
    },
    /// Change some fields of a queue's configuration: [`Reply::Configured`].
    SetConfig {
        /// The queue.
        queue: QueueId,
        /// The fields to set.
        patch: piecework_queue_doc::ConfigPatch,
    },
    /// A page of a queue's tasks, by id: [`Reply::Tasks`].
    ListTasks {
        /// The queue.
        queue: QueueId,
        /// Only tasks in this state (`blocked` as the status shows it).
        state: Option<piecework_queue_doc::TaskState>,
        /// At most this many (clamped to [`api::MAX_LIST`]).
        limit: usize,
        /// Only ids after this one (the previous page's `next_cursor`).
        cursor: Option<TaskId>,
    },
    /// Set (or, with 0, remove) the boost of a priority tag: [`Reply::Configured`].
    SetBoost {
        /// The queue.
        queue: QueueId,
        /// The tag.
        tag: String,
        /// The boost, in `[-1000000, 1000000]`.
        boost: i64,
    },
    /// Write a named schedule (new, or a new version of it): [`Reply::Schedules`].
    PutSchedule {
        /// The queue.
        queue: QueueId,
        /// The schedule's name (like a tag).
        name: String,
        /// Its timing and task.
        schedule: Box<api::PutSchedule>,
    },
    /// Delete a schedule: [`Reply::Schedules`] (those left).
    DeleteSchedule {
        /// The queue.
        queue: QueueId,
        /// The schedule's name.
        name: String,
    },
    /// A queue's schedules: [`Reply::Schedules`].
    Schedules {
        /// The queue.
        queue: QueueId,
    },
    /// Submit a task: [`Reply::Submitted`].
    Submit {
        /// The queue.
        queue: QueueId,
        /// The task.
        task: api::SubmitTask,
    },
    /// Submit up to [`api::MAX_BATCH`] tasks with one change to the queue document and one
    /// durable acknowledgement: [`Reply::SubmittedMany`]. An invalid entry is refused by its
    /// index; the others are submitted.
    SubmitMany {
        /// The queue.
        queue: QueueId,
        /// The tasks.
        tasks: Vec<api::SubmitTask>,
    },
    /// Cancel a task that has not ended: [`Reply::Task`], its status once the request is
    /// written ([`api::TaskError::Conflict`] if it ended).
    CancelTask {
        /// The task.
        task: TaskId,
    },
    /// Requeue a dead-lettered (`failed`) task: [`Reply::Task`], its status once written
    /// ([`api::TaskError::Conflict`] if it is not failed).
    RequeueTask {
        /// The task.
        task: TaskId,
    },
    /// Submit the undo tasks a succeeded task's run recorded: [`Reply::Undone`], their ids
    /// ([`api::TaskError::Conflict`] if the task did not succeed).
    UndoTask {
        /// The task.
        task: TaskId,
    },
    /// Requeue every dead-lettered task of a queue: [`Reply::TaskIds`], those requeued.
    RequeueFailed {
        /// The queue.
        queue: QueueId,
    },
    /// A task's status: [`Reply::Task`]; with `wait`, once it is done (or the wait ends).
    TaskStatus {
        /// The task.
        task: TaskId,
        /// Wait this long for the task to succeed or fail for good (at most [`MAX_WAIT`]).
        wait: Option<Duration>,
    },
    /// This node's queues, workers and documents: [`Reply::Status`].
    Status,
    /// A queue's current epoch document, saved whole: [`Reply::Document`]. Costs time in the
    /// document's size; for benchmarks and diagnostics, not for a hot path.
    QueueDocument {
        /// The queue.
        queue: QueueId,
    },
    /// This node's resources: [`Reply::Resources`].
    Resources,
    /// Hold a resource from now on (again, if it was withdrawn): [`Reply::Resources`].
    AddResource {
        /// Its name (like a tag).
        name: String,
    },
    /// Give a resource up: for `restore_after`, after which it is held again by itself, or
    /// for good: [`Reply::Resources`].
    WithdrawResource {
        /// Its name.
        name: String,
        /// When it comes back by itself, if it does.
        restore_after: Option<Duration>,
    },
    /// Stop for a planned restart or shutdown: [`Reply::Stopped`] once done. At once the
    /// pool starts nothing new (assignments are refused, its heartbeats say it is stopping),
    /// every router stops claiming and routing, and an active one hands its role to a member
    /// that claims without waiting `takeover_after`. Runs in progress get `grace` to end;
    /// those still running then are recorded interrupted. The reply comes once every change
    /// is on disk, or [`STOP_FLUSH_WAIT`] after the grace if writes keep failing. Commands
    /// that write (submits, joins, pauses) are answered "stopping" from the first moment.
    Stop {
        /// How long runs in progress may go on.
        grace: Duration,
    },
}

/// A task that became final, as a listing of its queue shows it ([`Io::Archive`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// The queue.
    pub queue: QueueId,
    /// The task.
    pub task: TaskId,
    /// Its final state.
    pub state: TaskState,
    /// Its listing entry: its status without runs, as JSON.
    pub entry: Vec<u8>,
}

/// The answer to a [`Command`].
#[derive(Debug)]
pub enum Reply {
    /// To [`Command::CreateQueue`].
    Created(Result<QueueId, api::QueueError>),
    /// To [`Command::JoinQueue`] and [`Command::JoinInvite`].
    Joined(Result<Arc<QueueView>, api::QueueError>),
    /// To [`Command::Invite`].
    Invited(Result<api::Invited, api::QueueError>),
    /// To [`Command::Members`] and [`Command::RemoveMember`].
    Members(Result<Vec<api::MemberEntry>, api::QueueError>),
    /// To [`Command::SetPaused`]: the queue's status once written.
    Paused(Result<api::QueueStatus, api::QueueError>),
    /// To [`Command::SetConfig`] and [`Command::SetBoost`]: the queue's status once written.
    Configured(Result<api::QueueStatus, api::QueueError>),
    /// To [`Command::PutSchedule`], [`Command::DeleteSchedule`] and [`Command::Schedules`]:
    /// the queue's schedules once written.
    Schedules(Result<api::Schedules, api::QueueError>),
    /// To [`Command::ListTasks`].
    Tasks(Result<api::TaskList, api::QueueError>),
    /// To [`Command::Submit`].
    Submitted(Result<api::Submitted, api::SubmitError>),
    /// To [`Command::SubmitMany`]: one entry per task, in order, unless the whole batch was
    /// refused.
    SubmittedMany(Result<Vec<api::BatchEntry>, api::SubmitError>),
    /// To [`Command::TaskStatus`], [`Command::CancelTask`] and [`Command::RequeueTask`].
    Task(Box<Result<api::TaskStatus, api::TaskError>>),
    /// To [`Command::RequeueFailed`]: the tasks it wrote a record for.
    TaskIds(Result<Vec<TaskId>, api::QueueError>),
    /// To [`Command::UndoTask`]: the undo tasks (made now, or by an earlier undo).
    Undone(Result<Vec<TaskId>, api::TaskError>),
    /// To [`Command::Status`].
    Status(Status),
    /// To [`Command::QueueDocument`]: the epoch number and the saved document.
    Document(Result<(u64, Vec<u8>), api::QueueError>),
    /// To [`Command::Stop`].
    Stopped(api::StopReport),
    /// To [`Command::Resources`], [`Command::AddResource`] and [`Command::WithdrawResource`].
    Resources(Result<api::Resources, api::ResourceError>),
}

/// What [`Command::Status`] reports.
#[derive(Clone, Debug)]
pub struct Status {
    /// Every joined queue.
    pub queues: Vec<api::QueueStatus>,
    /// Every worker of this node.
    pub workers: Vec<api::WorkerStatus>,
    /// Documents held in memory.
    pub documents_loaded: usize,
    /// The sizes of the node's bounded collections ([`Core::sizes`]).
    pub internals: std::collections::BTreeMap<String, usize>,
}

/// A write of one document's changes (and possibly a compaction) to disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Save {
    /// Answer with [`Core::handle_saved`].
    pub id: SaveId,
    /// The document.
    pub doc: DocId,
    /// Changes to append: (hash in hex, raw change bytes), oldest first.
    pub changes: Vec<(String, Vec<u8>)>,
    /// After appending, replace these stored changes with one snapshot.
    pub compact: Option<Compact>,
}

/// A snapshot that replaces stored changes. The core hands over a copy of the document (a
/// copy costs a small fraction of a save); the driver saves it with [`Compact::build`] off the
/// core's thread, so a compaction never holds up the core's turn (its heartbeats).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compact {
    /// The document as of the write's changes.
    pub snapshot: Snapshot,
    /// The stored changes it replaces (hashes in hex); `None` for every change of the
    /// document (it was loaded from chunks whose keys were not tracked), listed by
    /// [`Compact::build`].
    pub replaces: Option<Vec<String>>,
}

impl Compact {
    /// Saves the document whole and lists the changes the snapshot replaces: CPU-bound work
    /// in proportion to the document, for a blocking thread.
    pub fn build(self) -> (Vec<u8>, Vec<String>) {
        let doc = self.snapshot.0;
        let replaces = self.replaces.unwrap_or_else(|| {
            doc.get_changes(&[])
                .iter()
                .map(|c| c.hash().to_string())
                .collect()
        });
        (doc.save(), replaces)
    }
}

/// A copy of a document to be saved whole. Two are equal when they have the same heads.
#[derive(Clone, Debug)]
pub struct Snapshot(Box<automerge::Automerge>);

impl Snapshot {
    /// The copy's heads.
    pub fn heads(&self) -> Vec<automerge::ChangeHash> {
        self.0.get_heads()
    }
}

impl PartialEq for Snapshot {
    fn eq(&self, other: &Self) -> bool {
        self.0.get_heads() == other.0.get_heads()
    }
}

impl Eq for Snapshot {}

/// What a driver reports of a write that succeeded ([`Core::handle_saved`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    /// The snapshot's size, if the write compacted ([`Save::compact`]).
    pub snapshot_bytes: Option<usize>,
}

/// Identifies a successor build requested by [`Io::Rotate`], for [`Core::handle_rotated`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RotateId(pub u64);

/// A successor document to build off the core's thread, or to bring up to date. Building
/// costs in proportion to the document (about 0.1 s at 10,000 live tasks), so the driver runs
/// [`Rotate::build`] where it does not hold up the node's turns (its heartbeats) and answers
/// with [`Core::handle_rotated`]. Meanwhile the router goes on writing the current document;
/// what it writes after the copy the successor was built from is carried into it, off the
/// thread too (a catch-up: another [`Io::Rotate`] with a newer copy), until little is left
/// for the turn that seals. Two are equal when their ids are.
#[derive(Clone, Debug)]
pub struct Rotate {
    /// Answer with this in [`Built`].
    pub id: RotateId,
    /// A copy of the document being sealed.
    pub(crate) old: Box<automerge::Automerge>,
    pub(crate) work: RotateWork,
}

#[derive(Clone, Debug)]
pub(crate) enum RotateWork {
    /// Write the successor from the copy and its view (the sealing router's, of one turn).
    Build {
        view: Arc<QueueView>,
        succ: Box<automerge::Automerge>,
        origin: QueueId,
        prev: DocId,
        successor: DocId,
        epoch: u64,
        claim: Claim,
        now_ms: u64,
    },
    /// Carry what the copy holds beyond `carried` into the successor built before.
    CatchUp(Box<Successor>),
    /// Read the view of the copy (a successor this node is about to move to), so that the
    /// node's turn does not read it whole.
    Read { queue: QueueId, doc: DocId },
}

/// What off-thread epoch work gave.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// A successor built or caught up.
    Successor(Result<Box<Successor>, String>),
    /// The view of a successor this node moves to, read from its copy.
    Read {
        queue: QueueId,
        doc: DocId,
        cache: Box<piecework_queue_doc::ViewCache>,
    },
}

/// A successor being built, and what it holds of the document it continues.
#[derive(Clone, Debug)]
pub(crate) struct Successor {
    pub(crate) doc: automerge::Automerge,
    pub(crate) rotated: piecework_queue_doc::epoch::Rotated,
    /// Its view, read off the node's thread: the node's first refresh after installing it
    /// reads only what was carried since.
    pub(crate) cache: piecework_queue_doc::ViewCache,
    /// The heads of the sealed document whose changes it holds (carried or built from).
    pub(crate) carried: Vec<automerge::ChangeHash>,
    /// The seal's heads: the copy it was built from.
    pub(crate) seal_heads: Vec<automerge::ChangeHash>,
    /// The document it continues.
    pub(crate) prev: DocId,
}

impl PartialEq for Rotate {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Rotate {
    /// Writes the successor (one change) and reads its view, or carries into it what the
    /// copy holds beyond what it has, or reads the copy's view: CPU-bound work for a blocking
    /// thread.
    pub fn build(self) -> Built {
        let old = self.old;
        let result = match self.work {
            RotateWork::Read { queue, doc } => {
                let mut cache = piecework_queue_doc::ViewCache::new();
                cache.refresh(&old);
                return Built {
                    id: self.id,
                    outcome: Outcome::Read {
                        queue,
                        doc,
                        cache: Box::new(cache),
                    },
                };
            }
            RotateWork::Build {
                view,
                succ,
                origin,
                prev,
                successor,
                epoch,
                claim,
                now_ms,
            } => {
                let mut doc = *succ;
                piecework_queue_doc::epoch::build_successor(
                    &old,
                    &view,
                    &mut doc,
                    &piecework_queue_doc::epoch::Rotation {
                        origin: &origin,
                        prev: prev.as_str(),
                        successor: successor.as_str(),
                        epoch,
                        claim: &claim,
                        now_ms,
                    },
                )
                .map_err(|e| e.to_string())
                .map(|rotated| {
                    let mut cache = piecework_queue_doc::ViewCache::new();
                    cache.refresh(&doc);
                    let heads = old.get_heads();
                    Box::new(Successor {
                        doc,
                        rotated,
                        cache,
                        carried: heads.clone(),
                        seal_heads: heads,
                        prev,
                    })
                })
            }
            RotateWork::CatchUp(mut s) => {
                let seal_heads = s.seal_heads.clone();
                let dropped = |t: &piecework_queue_doc::TaskId| {
                    piecework_queue_doc::epoch::known_at(&old, &seal_heads, t)
                };
                let mark = s.prev.to_string();
                let epoch = piecework_queue_doc::epoch::read_epoch(&*old).map_or(0, |e| e.0);
                piecework_queue_doc::epoch::carry_covering(
                    &old,
                    &s.carried,
                    &mut s.doc,
                    &dropped,
                    Some(&mark),
                    Some((&mark, epoch)),
                    usize::MAX,
                )
                .map_err(|e| e.to_string())
                .map(|c| {
                    s.carried = c.heads;
                    s.cache.refresh(&s.doc);
                    s
                })
            }
        };
        Built {
            id: self.id,
            outcome: Outcome::Successor(result),
        }
    }
}

/// A successor built by [`Rotate::build`], for [`Core::handle_rotated`].
#[derive(Debug)]
pub struct Built {
    /// The build's id.
    pub id: RotateId,
    pub(crate) outcome: Outcome,
}

/// A handler run to perform.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRequest {
    /// Answer with [`Core::handle_run_ended`].
    pub id: RunId,
    /// The task's queue.
    pub queue: QueueId,
    /// The task.
    pub task: TaskId,
    /// The attempt being run.
    pub attempt: AttemptId,
    /// The worker running it.
    pub worker: WorkerId,
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    pub input: serde_json::Value,
    /// Which run of the task this is over its whole life, this one included
    /// ([`piecework_worker_pool::Context::attempt`]).
    pub number: u64,
}

/// How a handler run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// The handler's result, or its error (errors, panics and timeouts alike).
    pub result: Result<serde_json::Value, String>,
    /// Log lines the handler wrote.
    pub logs: Vec<String>,
    /// Its follow-up tasks, undo tasks and last progress (follow-ups and undo tasks are kept
    /// only if the run is recorded succeeded).
    pub planned: piecework_queue_doc::Planned,
}

impl RunResult {
    /// The result as an inline task keeps it: within [`MAX_INLINE_OUTPUT_BYTES`] for its
    /// result and logs together. A result over it fails the run; logs beyond what is left
    /// are dropped, and a last line counts them.
    pub(crate) fn within_inline_limit(mut self) -> RunResult {
        let result_len = match &mut self.result {
            Ok(v) => serde_json::to_string(v).map_or(0, |t| t.len()),
            Err(e) => {
                // An error message is cut to the budget (at a character boundary).
                let mut cut = e.len().min(MAX_INLINE_OUTPUT_BYTES);
                while !e.is_char_boundary(cut) {
                    cut -= 1;
                }
                e.truncate(cut);
                cut
            }
        };
        if result_len > MAX_INLINE_OUTPUT_BYTES {
            self.result = Err(format!(
                "result too large for an inline task: {result_len} bytes, the limit is \
                 {MAX_INLINE_OUTPUT_BYTES} (an inline task's output goes into its queue \
                 document; a task with a larger input gets a document of its own)"
            ));
        }
        let mut left =
            MAX_INLINE_OUTPUT_BYTES.saturating_sub(result_len.min(MAX_INLINE_OUTPUT_BYTES));
        let mut kept = 0;
        for line in &self.logs {
            if line.len() > left {
                break;
            }
            left -= line.len();
            kept += 1;
        }
        let dropped = self.logs.len() - kept;
        if dropped > 0 {
            self.logs.truncate(kept);
            self.logs.push(format!("({dropped} more lines dropped: an inline task keeps {MAX_INLINE_OUTPUT_BYTES} bytes of output)"));
        }
        self
    }
}

/// I/O the node must perform for the core.
#[derive(Clone, Debug, PartialEq)]
pub enum Io {
    /// Read every stored chunk of a document; answer with [`Core::handle_loaded`].
    Load {
        /// The document.
        doc: DocId,
    },
    /// Write to disk; answer with [`Core::handle_saved`].
    Save(Save),
    /// Run a handler; answer with [`Core::handle_run_ended`].
    Run(RunRequest),
    /// Cancel the handler of this run: the core ended its attempt as interrupted (a stop's
    /// grace time ran out) and ignores its end. A handler left running would be work in
    /// flight that no router counts (against a concurrency limit, say) while its task runs
    /// again elsewhere.
    Abort {
        /// The run.
        run: RunId,
    },
    /// Signal a run's handler to stop (cancel its context's token) and let it go on: its task
    /// was cancelled, or it ran past its timeout. Its end is reported as usual.
    Cancel {
        /// The run.
        run: RunId,
    },
    /// Connect to a peer (no answer: a stream that opens is reported by
    /// [`Core::handle_connected`]).
    Dial {
        /// The peer.
        peer: PeerId,
        /// Where it listens (multiaddrs as text).
        addrs: Vec<String>,
    },
    /// Broadcast on a gossip topic.
    Publish {
        /// The topic.
        topic: String,
        /// The payload ([`Wire`] encoded).
        data: Vec<u8>,
    },
    /// Listen on a gossip topic.
    Subscribe {
        /// The topic.
        topic: String,
    },
    /// Whether `peer` is a member of a queue this node serves, now that a membership changed
    /// (a peer added, or removed from every queue that had it): the transport sends nothing
    /// on any topic to a peer that is not, nor takes anything from it
    /// ([`Core::gossip_standing`] answers for a peer that subscribes).
    Standing {
        /// The peer.
        peer: PeerId,
        /// A member of a queue this node serves.
        member: bool,
    },
    /// Keep the final status of inline tasks (which have no task document) once the queue
    /// document stops carrying them: each record is a task and its [`api::TaskStatus`] as
    /// JSON. No answer; the store keeps the latest ones up to its retention.
    Archive {
        /// The records.
        records: Vec<(TaskId, Vec<u8>)>,
        /// Tasks of any kind that became final, for listings of their queue
        /// ([`Io::ListFinished`]); the store keeps the latest up to its retention.
        listed: Vec<Listed>,
        /// The ends of tasks of any kind that became final (task → its end,
        /// `piecework_queue_doc::epoch::TaskEnd::encode`), read back by [`Io::LookupEnds`];
        /// the store keeps the latest up to its retention.
        ends: Vec<(TaskId, Vec<u8>)>,
    },
    /// Read the finished tasks this node listed ([`Io::Archive`]'s `listed`) of a queue: in
    /// `state` (any final state if `None`), by task id after `after`, at most `limit`; answer
    /// with [`Core::handle_listed`].
    ListFinished {
        /// The listing command waiting for the answer.
        cmd: CommandId,
        /// The queue.
        queue: QueueId,
        /// Only this final state.
        state: Option<TaskState>,
        /// Only task ids after this one.
        after: Option<TaskId>,
        /// At most this many.
        limit: usize,
    },
    /// Epoch work off the core's thread ([`Rotate::build`]: build a successor epoch document,
    /// bring it up to date, or read a successor's view); answer with [`Core::handle_rotated`].
    Rotate(Box<Rotate>),
    /// Read a task's archived status; answer with [`Core::handle_archived`].
    Lookup {
        /// The task.
        task: TaskId,
    },
    /// Read the kept ends ([`Io::Archive`]'s `ends`) of `tasks`, and with `failed_in`, of every
    /// task listed failed in that queue; answer with [`Core::handle_ends`] (the ends found).
    LookupEnds {
        /// Names this lookup in the answer.
        lookup: u64,
        /// The tasks.
        tasks: Vec<TaskId>,
        /// A queue whose listed dead letters are wanted too.
        failed_in: Option<QueueId>,
    },
    /// Record, in order, that this node no longer needs a document except to answer for it
    /// (a finished task's, or a sealed epoch that left memory): the store hands the list back
    /// at the next start ([`Config::retired`]). No answer.
    Retire {
        /// The document.
        doc: DocId,
        /// Which kind it is.
        kind: Retired,
    },
    /// Delete a retired document from disk, with its record: beyond the bound of its kind
    /// (`Config::keep_task_docs`, `Config::keep_sealed_epochs`). It is not in memory and has no
    /// write in flight. No answer.
    Delete {
        /// The document.
        doc: DocId,
    },
    /// Remember that this node joined a queue, so that a restart reopens it.
    RememberQueue {
        /// The queue.
        id: QueueId,
        /// Its name.
        name: String,
    },
    /// Move a stored chunk of a document that does not decode out of the document (the store
    /// finds it by its bytes and keeps it aside), so that later loads neither see nor report
    /// it again. No answer.
    Quarantine {
        /// The document.
        doc: DocId,
        /// The chunk's bytes, as loaded.
        chunk: Vec<u8>,
    },
    /// Remember the epoch document a queue is on now, so that a restart resumes there
    /// ([`Config::resume`]). No answer; a later one replaces it.
    RememberEpoch {
        /// The queue.
        queue: QueueId,
        /// Its current epoch document.
        doc: DocId,
    },
}

/// Something that happened, for logs, displays, metrics and the simulator's checks.
#[derive(Clone, Debug)]
pub enum Event {
    /// This node's router for `queue` changed role.
    Router {
        /// The queue.
        queue: QueueId,
        /// What happened.
        event: piecework_router::Event,
    },
    /// A step in the life of a queue or of one of its tasks ([`api::QueueEvent`]).
    Queue(api::QueueEvent),
    /// A queue's view changed.
    View {
        /// The queue.
        queue: QueueId,
        /// The new view.
        view: Arc<QueueView>,
    },
    /// One of this node's workers started a run.
    RunStarted {
        /// The queue.
        queue: QueueId,
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// The worker.
        worker: WorkerId,
    },
    /// One of this node's workers ended a run.
    RunEnded {
        /// The queue.
        queue: QueueId,
        /// The task.
        task: TaskId,
        /// Whether the handler succeeded.
        ok: bool,
    },
    /// An attempt assigned to this node was answered without running (refused, or interrupted
    /// by a restart), with the reason.
    NotRun {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: AttemptId,
        /// Refused or interrupted.
        outcome: piecework_queue_doc::AttemptOutcome,
        /// Why.
        reason: String,
    },
    /// A peer sent something invalid; it was dropped (a hostile or broken peer, or a version
    /// mismatch). Never a panic.
    Rejected {
        /// The peer.
        peer: PeerId,
        /// What was wrong.
        reason: String,
    },
    /// Writes of a document keep failing (reported after [`SAVE_FAILURES_REPORTED`] in a row).
    SaveFailed {
        /// The document.
        doc: DocId,
        /// Failures in a row.
        failures: u32,
        /// The last error.
        error: api::StorageFailure,
    },
    /// The store's writes, of any document, failed [`SAVE_FAILURES_REPORTED`] times in a row
    /// (a full disk): submits are refused at once ([`api::SubmitError::NotDurable`]) until a
    /// write succeeds ([`Event::StoreRecovered`]). Failed writes are retried meanwhile.
    StoreFailing {
        /// The last error.
        error: api::StorageFailure,
    },
    /// A write succeeded after [`Event::StoreFailing`]: the node takes submits again.
    StoreRecovered,
    /// A stored chunk of a document did not decode: it is moved aside ([`Io::Quarantine`]) and
    /// the rest of the document loaded. Reported once per chunk.
    Quarantined {
        /// The document.
        doc: DocId,
        /// The chunk's size.
        bytes: usize,
        /// Why the document did not load with it.
        error: String,
    },
    /// A document could not be read from disk.
    LoadFailed {
        /// The document.
        doc: DocId,
        /// Why.
        error: String,
    },
    /// A queue's epochs changed (see [`piecework_queue_doc::epoch`]).
    Epoch {
        /// The queue.
        queue: QueueId,
        /// What happened.
        event: EpochEvent,
    },
    /// A fetch of a task's document for a run ended with no member having it: the attempt
    /// ended `unavailable`.
    FetchFailed {
        /// The task.
        task: TaskId,
        /// Whether it ended at the fetch's deadline (no answer) rather than on answers.
        timed_out: bool,
    },
}

/// What happened to a queue's chain of epoch documents ([`Event::Epoch`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpochEvent {
    /// This node, as the active router, sealed the current epoch into a successor.
    Rotated {
        /// The successor's epoch number.
        epoch: u64,
        /// Live tasks carried into it.
        carried: usize,
        /// Finished tasks left behind.
        dropped: usize,
    },
    /// This node moved to another epoch document (a newer epoch, or the winner of a double
    /// seal of the same epoch).
    Switched {
        /// The epoch it moved to.
        epoch: u64,
        /// The epoch number it left.
        from: u64,
        /// Whether it left a successor that lost a double seal.
        sideways: bool,
        /// Documents of the chain between the two that no member had (deleted everywhere
        /// while this node was away, see `Config::keep_sealed_epochs`): moved past unread.
        missing: usize,
    },
    /// Writes made to a sealed epoch after its seal were carried into its successor.
    Carried {
        /// Values written.
        writes: usize,
        /// Whether they came from a successor that lost a double seal.
        from_loser: bool,
    },
    /// A sealed epoch's document left memory.
    Evicted {
        /// Its epoch number.
        epoch: u64,
    },
    /// A document that says it succeeds one of this queue's epochs is not followed, ever:
    /// its seal's claim does not count there, or it drops tasks live at the seal
    /// ([`piecework_queue_doc::epoch::check_successor`]). Reported once per document.
    Refused {
        /// The document.
        doc: DocId,
        /// Why.
        reason: String,
    },
}

/// A run this node's pool started and has not ended.
#[derive(Clone, Debug)]
pub(crate) struct Running {
    pub(crate) run: piecework_worker_pool::Run,
    pub(crate) start: RunStart,
}

/// The greatest of two optional claims.
pub(crate) fn max_claim(a: Option<&Claim>, b: Option<&Claim>) -> Option<Claim> {
    a.into_iter().chain(b).max().cloned()
}

/// A task document's id from a task id, if it is well-formed.
pub(crate) fn task_doc(id: &TaskId) -> Option<DocId> {
    DocId::parse(id.as_str())
}

/// A queue document's id from a queue id, if it is well-formed.
pub(crate) fn queue_doc(id: &QueueId) -> Option<DocId> {
    DocId::parse(id.as_str())
}

pub(crate) use task::RunEnd as TaskRunEnd;
