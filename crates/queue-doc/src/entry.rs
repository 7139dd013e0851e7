//! A task's entry in a queue document and its attempts, as read: the types a view is made of,
//! and the rules that derive a task's state from its attempts.

use serde::{Deserialize, Serialize};

use crate::config::Order;
use crate::ids::{AttemptId, PeerId, TaskId, WorkerId};

/// How an attempt ended.
///
/// When concurrent writes leave an attempt with more than one ending (possible only after a
/// node restarted from a copy that lacked its own last writes), the greatest by this order wins:
/// `Succeeded > Failed > Interrupted > Unavailable > Refused`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttemptOutcome {
    /// The worker did not start it: fenced, busy, superseded, or the task already ran.
    Refused,
    /// The worker could not get the task's input: no reachable member had its document. The
    /// task waits in [`TaskState::InputUnavailable`] until a member that has it says so.
    Unavailable,
    /// The worker's node restarted while the attempt ran.
    Interrupted,
    /// The handler returned an error, panicked or timed out.
    Failed,
    /// The handler returned a result.
    Succeeded,
}

impl AttemptOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Refused => "refused",
            AttemptOutcome::Unavailable => "unavailable",
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Succeeded => "succeeded",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "refused" => AttemptOutcome::Refused,
            "unavailable" => AttemptOutcome::Unavailable,
            "interrupted" => AttemptOutcome::Interrupted,
            "failed" => AttemptOutcome::Failed,
            "succeeded" => AttemptOutcome::Succeeded,
            _ => return None,
        })
    }

    /// Whether the attempt counts towards the task's `max_attempts`.
    pub fn is_failure(self) -> bool {
        matches!(self, AttemptOutcome::Failed | AttemptOutcome::Interrupted)
    }
}

/// The start of an attempt, written by the worker's pool before the handler runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    /// Wall-clock time of the start (unix ms, the worker's clock).
    pub at: u64,
    /// The pool's incarnation (how many times its node had started).
    pub incarnation: u64,
}

/// The end of an attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finished {
    /// Wall-clock time (unix ms, the worker's clock).
    pub at: u64,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The error or refusal reason, if any.
    pub error: Option<String>,
}

/// One attempt at a task: an assignment to a worker, and what became of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The attempt's number and router.
    pub id: AttemptId,
    /// The worker it was assigned to.
    pub worker: WorkerId,
    /// The incarnation of the worker's pool the assignment is addressed to (the one the router
    /// had heard from). A pool of another incarnation never starts it. `None` in attempts
    /// written before assignments named an incarnation.
    pub pool_incarnation: Option<u64>,
    /// Wall-clock time of the assignment (unix ms, the router's clock).
    pub assigned_at: u64,
    /// Set once the worker started it.
    pub started: Option<Started>,
    /// Set once it ended.
    pub finished: Option<Finished>,
}

impl Attempt {
    /// Assigned or running, not yet ended.
    pub fn is_open(&self) -> bool {
        self.finished.is_none()
    }
}

/// Where a task stands, derived from its attempts.
///
/// States are ordered by rank: the non-final states rank 0, `Failed` 1, `Succeeded` 2. A final
/// state never turns back into a non-final one and only ever gives way to a higher rank (a
/// zombie attempt that succeeds after the task was dead-lettered turns it into `Succeeded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// Waiting to be routed.
    Pending,
    /// Assigned to a worker that has not started it.
    Assigned,
    /// Running on a worker.
    Running,
    /// Its last attempt found no reachable member holding the task's document. Not final and
    /// not routed: it revives (turns pending) when a member that holds the document marks it
    /// available ([`crate::queue::mark_input_available`]).
    #[serde(rename = "input_unavailable")]
    InputUnavailable,
    /// Failed `max_attempts` times: dead-lettered.
    Failed,
    /// Some attempt succeeded.
    Succeeded,
}

impl TaskState {
    /// The state's rank in the merge order (see the type's docs).
    pub fn rank(self) -> u8 {
        match self {
            TaskState::Pending
            | TaskState::Assigned
            | TaskState::Running
            | TaskState::InputUnavailable => 0,
            TaskState::Failed => 1,
            TaskState::Succeeded => 2,
        }
    }

    /// `Succeeded` or `Failed`.
    pub fn is_final(self) -> bool {
        self.rank() > 0
    }

    /// The state's name, as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Assigned => "assigned",
            TaskState::Running => "running",
            TaskState::InputUnavailable => "input_unavailable",
            TaskState::Failed => "failed",
            TaskState::Succeeded => "succeeded",
        }
    }
}

/// Relative priorities are clamped to this magnitude.
pub const MAX_PRIORITY: i64 = 99_999;

/// A task as indexed in its queue document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEntry {
    /// The task's id (its task document's URL).
    pub id: TaskId,
    /// The handler kind.
    pub kind: String,
    /// Wall-clock submit time (unix ms, the submitter's clock).
    pub submitted_at: u64,
    /// The submitting peer.
    pub submitter: PeerId,
    /// Relative priority in `[-99999, 99999]`; greater runs first.
    pub priority: i64,
    /// Urgent tasks run before every non-urgent one.
    pub urgent: bool,
    /// Failed attempts after which the task is dead-lettered.
    pub max_attempts: u32,
    /// Every attempt, in document order.
    pub attempts: Vec<Attempt>,
    /// The greatest attempt number at which a member holding the task's document marked its
    /// input available (0: never).
    pub input_seen: u64,
    /// The input (JSON text) of an inline task, which has no task document; `None` for a task
    /// whose input is in its task document.
    pub input: Option<String>,
}

impl TaskEntry {
    /// The number of failed attempts (errors and interruptions).
    pub fn failures(&self) -> u32 {
        let n = self
            .attempts
            .iter()
            .filter(|a| a.finished.as_ref().is_some_and(|f| f.outcome.is_failure()))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The number of attempts not run (refused: fenced, busy worker, superseded; or the task's
    /// document unavailable).
    pub fn refusals(&self) -> u32 {
        let n = self
            .attempts
            .iter()
            .filter(|a| {
                a.finished.as_ref().is_some_and(|f| {
                    matches!(
                        f.outcome,
                        AttemptOutcome::Refused | AttemptOutcome::Unavailable
                    )
                })
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The highest attempt number, 0 if never assigned.
    pub fn last_n(&self) -> u64 {
        self.attempts.iter().map(|a| a.id.n).max().unwrap_or(0)
    }

    /// The attempts with the highest number (more than one only after concurrent routers).
    pub fn current_attempts(&self) -> impl Iterator<Item = &Attempt> {
        let n = self.last_n();
        self.attempts.iter().filter(move |a| a.id.n == n)
    }

    /// The task's state, derived from its attempts (see [`TaskState`]).
    pub fn state(&self) -> TaskState {
        if self.attempts.iter().any(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        }) {
            return TaskState::Succeeded;
        }
        if self.failures() >= self.max_attempts {
            return TaskState::Failed;
        }
        let n = self.last_n();
        let unavailable = n > self.input_seen
            && self.current_attempts().all(|a| {
                a.finished
                    .as_ref()
                    .is_some_and(|f| f.outcome == AttemptOutcome::Unavailable)
            });
        if n > 0 && unavailable {
            return TaskState::InputUnavailable;
        }
        let mut state = TaskState::Pending;
        for a in self.current_attempts().filter(|a| a.is_open()) {
            if a.started.is_some() {
                return TaskState::Running;
            }
            state = TaskState::Assigned;
        }
        state
    }

    /// The routing order between two tasks: urgent first, then greater priority, then submit
    /// time (oldest first for [`Order::Fifo`], newest first for [`Order::Lifo`]), then id.
    pub fn route_cmp(&self, other: &TaskEntry, order: Order) -> std::cmp::Ordering {
        other
            .urgent
            .cmp(&self.urgent)
            .then(other.priority.cmp(&self.priority))
            .then(match order {
                Order::Fifo => self.submitted_at.cmp(&other.submitted_at),
                Order::Lifo => other.submitted_at.cmp(&self.submitted_at),
            })
            .then(self.id.cmp(&other.id))
    }

    /// The attempt with this id.
    pub fn attempt(&self, id: &AttemptId) -> Option<&Attempt> {
        self.attempts.iter().find(|a| &a.id == id)
    }
}
