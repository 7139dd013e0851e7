//! Writes a turn gathers before it makes them: a start or an end of an attempt for the queue
//! document (`PendingAttempt`), run records and a summary for a task document (`TaskWrites`). Plain
//! data.

use piecework_queue_doc::queue;
use piecework_queue_doc::task::{self, RunStart};
use piecework_worker_pool::Run;

use crate::TaskRunEnd;

/// A start or an end of an attempt waiting for [`Core::flush_attempts`].
#[derive(Debug)]
pub(super) struct PendingAttempt {
    pub(super) write: queue::AttemptWrite,
    /// For a start: the run and its input, handed to the driver once the start is recorded.
    pub(super) started: Option<(Run, serde_json::Value)>,
}

/// What waits to be written into one task document at the end of a turn.
#[derive(Debug, Default)]
pub(super) struct TaskWrites {
    pub(super) runs: Vec<(RunStart, TaskRunEnd)>,
    pub(super) summary: Option<task::Summary>,
}
