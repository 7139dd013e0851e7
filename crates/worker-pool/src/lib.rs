//! Piecework's worker pool: N task workers per node.
//!
//! Two halves:
//!
//! - [`Pool`] is the pure state machine (no tokio, no clock): it reads the assignments in each
//!   queue's view, fences them against the effective router, and decides which to start, which
//!   to refuse and which an earlier start of this node left interrupted. It also produces the
//!   pool's heartbeat listing every worker's state.
//! - `runner` (feature `runner`, on by default) holds the handler `Registry` and `execute`,
//!   which runs a handler in its own tokio task and turns errors and panics into failed
//!   outcomes. Without the feature the crate needs no tokio: `piecework-core` uses it so.
//!
//! # Driving a pool
//!
//! Feed [`Pool::handle_view`] each queue's view (the only source of its fences: router
//! heartbeats raise none); carry out every [`Action`] from [`Pool::poll_action`]: record a `Start` in the
//! documents and run the handler, report its end with [`Pool::handle_finished`]; record a
//! `Finish`; signal a `Cancel` to the run's handler (its task was cancelled, or it ran past its
//! timeout); broadcast a `Beat`. Call [`Pool::handle_timeout`] at [`Pool::poll_timeout`]: it
//! times runs out, and records the end of a run whose handler ignored the signal past its
//! grace time ([`CANCEL_GRACE`]; the worker stays busy until the handler returns).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use piecework_queue_doc::{PeerId, QueueId, QueueView};
//! use piecework_worker_pool::{Action, Config, Pool};
//!
//! let t0 = Instant::now(); // the node's clock; the simulator passes virtual instants
//! let mut pool = Pool::new(
//!     Config { peer: PeerId::new("me"), workers: 2, incarnation: 1, heartbeat: Duration::from_millis(500) },
//!     t0,
//! );
//! pool.handle_timeout(t0);
//! let Some(Action::Beat(beat)) = pool.poll_action() else { panic!() };
//! assert_eq!(beat.workers.len(), 2);
//! pool.handle_view(&QueueId::new("automerge:q"), &Arc::new(QueueView::default()), t0);
//! assert_eq!(pool.poll_action(), None, "nothing assigned to us");
//! ```

#![warn(missing_docs, unreachable_pub)]

mod pool;
#[cfg(feature = "runner")]
pub mod runner;

pub use piecework_queue_doc::{Planned, PlannedTask, Progress};
pub use pool::{Action, CANCEL_GRACE, Config, Pool, Run, RunEnd};
#[cfg(feature = "runner")]
pub use runner::{Context, FollowUp, Handler, HandlerError, Outcome, Registry, execute};
