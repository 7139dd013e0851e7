//! Piecework's documents, as typed operations on [`automerge::Automerge`] documents.
//!
//! This crate is pure: it reads no clock and no random source, and does no I/O. Callers pass
//! wall-clock times (`now_ms`, unix milliseconds) and own the documents; the same functions run
//! inside a node (on documents held by its `piecework_replica::Replica`) and inside the simulator.
//!
//! # The documents
//!
//! - A **queue document** holds the queue's name and [`QueueConfig`], its members, the router
//!   record, the pause flag, and the task index: for each task its kind, priority, submit time,
//!   submitter and attempts. Operations: [`queue::create`], [`queue::set_member`],
//!   [`queue::claim_router`], [`queue::submit`] ([`queue::submit_many`] for a batch), [`queue::record_assignments`],
//!   [`queue::record_start`], [`queue::record_finish`] ([`queue::record_attempts`] for a
//!   turn's starts and ends in one change). Read it with [`QueueView::read`].
//!   An **inline task** (a small input, [`Submission::input`]) lives there alone: its input in
//!   its entry ([`TaskEntry::input`]) and what its runs produced written with their ends
//!   ([`Output`], read with [`read_outputs`]).
//! - A **task document** per task that is not inline (its URL is the task id) holds the kind, the input, one
//!   run record per run that ended and the final summary: [`task::init`],
//!   [`task::record_runs`] (a run's whole record and the summary in one change),
//!   [`task::read`], [`task::read_input`]. Earlier versions wrote a run's start when it began
//!   ([`task::record_run_start`], [`task::record_run_end`]); those records still read.
//!
//! The queue's run-time settings (pause, configuration fields, tag boosts) and its named
//! schedules ([`schedule`]: [`queue::put_schedule`], [`Schedule::due`], fired with
//! [`queue::submit_fired`]) are registers in its `config` map whose greatest write wins.
//!
//! A queue is a chain of epoch documents: the active router rotates a queue document into a
//! successor holding only what is live ([`epoch::build_successor`], [`epoch::seal`]), and late
//! writes to a sealed one are carried over ([`epoch::carry`]).
//!
//! Beside the documents, peers gossip [`RouterBeat`]s and [`PoolBeat`]s (module [`beat`]).
//!
//! # Merge rules
//!
//! Replicas apply these operations concurrently and exchange changes in any order. The rules
//! that make every replica agree, and that keep outcomes from regressing:
//!
//! - **Router record.** Claims are written to one key; concurrent claims survive as conflicting
//!   values. The effective router is the greatest `(term, peer)` among them ([`Claim`]'s order),
//!   not Automerge's last-writer-wins pick.
//! - **Attempts** are appended to a list and never removed: the list is the union of all
//!   replicas' attempts. An attempt's start and end are written only by its worker's pool; if a
//!   restarted node writes one again concurrently with its earlier self, the greatest by a fixed
//!   order wins (`start`: greatest incarnation; `end`: [`AttemptOutcome`]'s order).
//! - **Task state** is not stored but derived from the attempts ([`TaskEntry::state`]): any
//!   successful attempt makes the task `Succeeded`; `max_attempts` failures make it `Failed`.
//!   Since attempts only accumulate, a final state never turns back into a pending one.
//! - Tasks leave the index only when final, when a rotation starts a new epoch document
//!   without them ([`epoch`]).
//!
//! # Values from peers
//!
//! Every value is judged by who wrote it (module `judge`): a node writes with an actor id tagged
//! with its peer ([`membership::actor_for`]), and a view ignores a write its writer's role does
//! not allow (the configuration and schedules are an admin's, routing and running a member's)
//! and a removed peer's writes beyond its removal's [`membership::Cut`].
//!
//! Beyond that any member can write any value, so readers validate what they read, the same
//! way on every replica: the [`QueueConfig`] is clamped into its documented ranges
//! ([`QueueConfig::clamped`]), router claims above [`MAX_TERM`] are ignored and attempts made
//! under one are malformed (both counted in [`QueueView::malformed`]), and priorities and
//! per-task attempt limits are clamped. Each attempt names the pool incarnation it is
//! addressed to ([`Attempt::pool_incarnation`]), so a restarted node never starts an
//! assignment made to its earlier life.
//!
//! ```
//! use automerge::Automerge;
//! use piecework_queue_doc::{queue, PeerId, QueueConfig, QueueView, Submission, TaskId, TaskState};
//!
//! let me = PeerId::new("peer-a");
//! let mut doc = Automerge::new();
//! queue::create(&mut doc, "emails", &QueueConfig::default(), &me, 1_000).unwrap();
//! queue::submit(&mut doc, &Submission {
//!     id: TaskId::new("automerge:task1"),
//!     kind: "send".into(),
//!     submitter: me.clone(),
//!     submitted_at: 1_001,
//!     priority: 0,
//!     urgent: false,
//!     max_attempts: None,
//!     // Small enough to be inline: no task document.
//!     input: Some(r#"{"to":"ada"}"#.into()),
//!     rules: Default::default(),
//! }).unwrap();
//! let view = QueueView::read(&doc).unwrap();
//! assert_eq!(view.pending()[0].state(), TaskState::Pending);
//! ```

#![warn(missing_docs, unreachable_pub)]

mod am;
pub mod beat;
mod cache;
mod chain;
mod config;
mod ends;
mod entry;
pub mod epoch;
mod ids;
mod judge;
mod keys;
pub mod membership;
mod packed;
mod planned;
pub mod queue;
mod read;
pub mod schedule;
mod settings;
mod successor;
pub mod task;
mod view;

pub use beat::{
    Lack, MAX_POOL_KINDS, MAX_POOL_RESOURCES, MAX_POOL_WORKERS, PoolBeat, RouterBeat,
    RunningReport, WorkerReport,
};
pub use cache::{CacheStats, Changed, ViewCache};
pub use config::{ConfigError, FailurePolicy, MAX_FAILURE_POLICIES, Order, QueueConfig};
pub use entry::{
    Attempt, AttemptOutcome, BOOST_WEIGHT, Bump, Cancel, DEFERRED, Finished, GRACE_RAN_OUT,
    IGNORED, MAX_BOOST, MAX_DEPENDENCIES, MAX_KEY_LEN, MAX_TAG_LEN, MAX_TAGS, MAX_TIMEOUT_MS,
    Requeue, Rules, Started, TaskEntry, TaskState, valid_tag,
};
pub use ids::{AttemptId, BadWorkerId, Claim, MAX_TERM, PeerId, QueueId, TaskId, WorkerId};
pub use membership::{Grant, MemberOp, Membership, Role, Signer};
pub use packed::Output;
pub use planned::{
    MAX_PLANNED, MAX_PLANNED_INPUT_BYTES, MAX_PLANNED_TOTAL_BYTES, PlanError, Planned, PlannedTask,
    Progress, follow_up_id, undo_id,
};
pub use queue::{Assignment, Submission};
pub use read::read_outputs;
pub use schedule::{Every, Firing, Schedule, ScheduleError};
pub use settings::{ConfigPatch, SetBoostError, SetConfigError};
pub use view::{Member, Need, QueueView, StateCounts};
