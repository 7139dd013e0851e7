//! A task's entry in a queue document and its attempts, as read: the types a view is made of,
//! and the rules that derive a task's state from its attempts.

use serde::{Deserialize, Serialize};

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
    /// The run went past its timeout (derived: it failed with "timed out after N ms", which
    /// only a pool writes for a timeout).
    #[serde(default)]
    pub timed_out: bool,
}

impl Finished {
    /// An end, with [`Finished::timed_out`] derived from it.
    pub fn new(at: u64, outcome: AttemptOutcome, error: Option<String>) -> Finished {
        let timed_out = outcome == AttemptOutcome::Failed
            && error.as_deref().is_some_and(|e| {
                e.trim_start_matches(IGNORED)
                    .starts_with("timed out after ")
            });
        Finished {
            at,
            outcome,
            error,
            timed_out,
        }
    }

    /// The run failed and its kind's failure policy is `ignore`: the task is dead-lettered at
    /// once (derived from the error's [`IGNORED`] mark, which only a pool writes).
    pub fn ignored(&self) -> bool {
        self.outcome == AttemptOutcome::Failed
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(IGNORED))
    }

    /// The run failed and its kind's failure policy paused a resource: the attempt is deferred,
    /// not counted towards `max_attempts` (derived from the error's [`DEFERRED`] mark).
    pub fn deferred(&self) -> bool {
        self.outcome == AttemptOutcome::Failed
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with(DEFERRED))
    }

    /// The end was recorded while the run's handler went on: asked to stop, it did not within
    /// its grace time, and its worker stays busy until it returns (derived from the error
    /// [`GRACE_RAN_OUT`] marks, which only a pool writes).
    pub fn overdue(&self) -> bool {
        self.outcome == AttemptOutcome::Failed
            && self
                .error
                .as_deref()
                .is_some_and(|e| e.ends_with(GRACE_RAN_OUT))
    }
}

/// How a pool ends the error it records for a run whose handler did not stop within its grace
/// time ([`Finished::overdue`]).
pub const GRACE_RAN_OUT: &str = "(the handler did not stop within its grace time)";

/// How a pool starts the error of a failed run whose kind's failure policy is `ignore`
/// ([`Finished::ignored`]).
pub const IGNORED: &str = "ignored: ";

/// How a pool starts the error of a failed run whose kind's failure policy pauses a resource
/// ([`Finished::deferred`]).
pub const DEFERRED: &str = "deferred: ";

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
/// States are ordered by rank: the non-final states rank 0, `Failed` 1, `Cancelled` 2,
/// `Succeeded` 3. A final state only ever gives way to a higher rank (a zombie attempt that
/// succeeds after the task was dead-lettered or cancelled turns it into `Succeeded`).
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
    /// Failed `max_attempts` times since its latest requeue: dead-lettered.
    Failed,
    /// Ended without running to success: a member cancelled it, or a dependency failed or was
    /// cancelled ([`TaskEntry::cancel_reason`] says which).
    Cancelled,
    /// Some attempt succeeded.
    Succeeded,
    /// Shown, never derived from a document: a pending task that cannot be routed now (its
    /// dependencies, its not-before time, a paused queue), as a node's status answers it.
    Blocked,
}

impl TaskState {
    /// The state's rank in the merge order (see the type's docs).
    pub fn rank(self) -> u8 {
        match self {
            TaskState::Pending
            | TaskState::Assigned
            | TaskState::Running
            | TaskState::InputUnavailable
            | TaskState::Blocked => 0,
            TaskState::Failed => 1,
            TaskState::Cancelled => 2,
            TaskState::Succeeded => 3,
        }
    }

    /// `Succeeded`, `Cancelled` or `Failed`.
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
            TaskState::Cancelled => "cancelled",
            TaskState::Succeeded => "succeeded",
            TaskState::Blocked => "blocked",
        }
    }

    /// The state a name gives ([`TaskState::as_str`]'s inverse).
    pub fn parse(s: &str) -> Option<TaskState> {
        Some(match s {
            "pending" => TaskState::Pending,
            "assigned" => TaskState::Assigned,
            "running" => TaskState::Running,
            "input_unavailable" => TaskState::InputUnavailable,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            "succeeded" => TaskState::Succeeded,
            "blocked" => TaskState::Blocked,
            _ => return None,
        })
    }
}

/// The most tags one task carries.
pub const MAX_TAGS: usize = 16;
/// The longest tag, in bytes.
pub const MAX_TAG_LEN: usize = 64;
/// The most dependencies one task lists.
pub const MAX_DEPENDENCIES: usize = 64;
/// A boost's magnitude is at most this.
pub const MAX_BOOST: i64 = 1_000_000;
/// How much one unit of boost outweighs priority: an effective priority is
/// `boost sum × BOOST_WEIGHT + priority`, and `|priority| < BOOST_WEIGHT / 2`, so the boost
/// sum orders first and the priority breaks its ties.
pub const BOOST_WEIGHT: i64 = 200_000;

/// Whether `tag` is a tag a task may carry: 1 to [`MAX_TAG_LEN`] bytes of ASCII letters,
/// digits, `_`, `-`, `.` and `:`.
pub fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

/// What a task's submitter decided about when and in which order it runs, beyond its priority:
/// written once with its entry, and copied whole into successor epochs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rules {
    /// Priority tags: the queue's boost of each adds to the task's effective priority. Sorted,
    /// without repeats; readers keep at most [`MAX_TAGS`] valid ones.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Not assigned before this wall-clock time (unix ms, by the assigning router's clock);
    /// 0: no delay.
    #[serde(skip_serializing_if = "is_zero")]
    pub not_before: u64,
    /// Tasks of the same queue that must succeed before this one is routed (at most
    /// [`MAX_DEPENDENCIES`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<TaskId>,
    /// The final outcomes of dependencies that were no longer in the queue document where the
    /// entry was written (finished in an earlier epoch): recorded by the submitter, or by the
    /// rotation or carry that left them behind.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub outcomes: std::collections::BTreeMap<TaskId, TaskState>,
    /// Submitting this key again while the task is pending (not yet started) adds no task: it
    /// bumps this one ([`Bump`]). At most [`MAX_KEY_LEN`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup_key: Option<String>,
    /// The tasks with the same dedup key that the submitter saw started or ended when it made
    /// this one: they are not its copies (see [`TaskEntry::duplicate_of`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dedup_after: Vec<TaskId>,
    /// The client's key for retries of this submit (see `docs/protocol.md`, "Idempotent
    /// submits"). At most [`MAX_KEY_LEN`] bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Resources a pool must hold to be assigned the task (names like tags: see
    /// [`valid_tag`]). Sorted, without repeats; readers keep at most [`MAX_TAGS`] valid ones.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<String>,
    /// A run past this many milliseconds is cancelled and recorded failed, "timed out after N
    /// ms" (0: the queue's `timeout_ms`; readers clamp it to [`MAX_TIMEOUT_MS`]).
    #[serde(skip_serializing_if = "is_zero")]
    pub timeout_ms: u64,
    /// The task whose successful run submitted this one as a follow-up (see
    /// [`crate::PlannedTask`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub follows: Option<TaskId>,
    /// The task whose `undo` submitted this one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub undoes: Option<TaskId>,
}

/// The longest per-task timeout, and the longest queue default: 7 days.
pub const MAX_TIMEOUT_MS: u64 = 7 * 24 * 3_600_000;

/// A cancel request for a task (`cancels/<task>`): who asked, and when. Concurrent requests
/// merge to the earliest `(t, b)`; any one of them cancels the task.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cancel {
    /// When (unix ms, the requesting member's clock).
    pub t: u64,
    /// The member that asked.
    pub b: String,
}

impl Cancel {
    /// The merge of two requests: the earlier.
    pub fn merge(self, other: Cancel) -> Cancel {
        self.min(other)
    }
}

/// A requeue of a dead-lettered task (`requeues/<task>`): failures count only in attempts
/// numbered above `n`, so the task is pending again with a fresh budget. Concurrent requeues
/// merge to the greatest `(n, s, t)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Requeue {
    /// The task's highest attempt number when it was requeued: later attempts number above it.
    pub n: u64,
    /// How many runs of the task had started by then, over its whole life.
    #[serde(default)]
    pub s: u64,
    /// When (unix ms, the requeuing member's clock).
    #[serde(default)]
    pub t: u64,
}

impl Requeue {
    /// The merge of two requeues: the greater.
    pub fn merge(self, other: Requeue) -> Requeue {
        self.max(other)
    }
}

/// The longest dedup or idempotency key, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// A dedup bump: a submit of a pending task's dedup key moved it to the front of its priority
/// class and raised its priority fields to the submit's where higher. Concurrent bumps of one
/// task merge field by field: the latest time, the greatest priority, urgent if any was.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bump {
    /// When (unix ms, the bumping member's clock).
    pub t: u64,
    /// The priority it raises the task to (clamped like a priority).
    #[serde(default)]
    pub p: i64,
    /// Urgent.
    #[serde(default)]
    pub u: bool,
}

impl Bump {
    /// The field-wise merge of two bumps.
    pub fn merge(self, other: Bump) -> Bump {
        Bump {
            t: self.t.max(other.t),
            p: self.p.max(other.p),
            u: self.u || other.u,
        }
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Rules {
    /// The rules as readers take them from any writer: tags valid, sorted, unique and at most
    /// [`MAX_TAGS`]; dependencies unique, at most [`MAX_DEPENDENCIES`], never the task itself;
    /// only final outcomes, of listed dependencies.
    pub fn normalized(mut self, task: &TaskId) -> Rules {
        self.tags.retain(|t| valid_tag(t));
        self.tags.sort();
        self.tags.dedup();
        self.tags.truncate(MAX_TAGS);
        self.requires.retain(|t| valid_tag(t));
        self.requires.sort();
        self.requires.dedup();
        self.requires.truncate(MAX_TAGS);
        let mut seen = std::collections::BTreeSet::new();
        self.depends_on
            .retain(|d| d != task && seen.insert(d.clone()));
        self.depends_on.truncate(MAX_DEPENDENCIES);
        let deps: std::collections::BTreeSet<&TaskId> = self.depends_on.iter().collect();
        self.outcomes
            .retain(|d, s| deps.contains(d) && s.is_final());
        let short = |k: &Option<String>| k.as_ref().is_none_or(|k| k.len() <= MAX_KEY_LEN);
        if !short(&self.dedup_key) {
            self.dedup_key = None;
        }
        if !short(&self.idempotency_key) {
            self.idempotency_key = None;
        }
        if self.dedup_key.is_none() {
            self.dedup_after.clear();
        }
        self.dedup_after.truncate(MAX_DEPENDENCIES);
        self.timeout_ms = self.timeout_ms.min(MAX_TIMEOUT_MS);
        self
    }

    /// Whether no rule is set.
    pub fn is_empty(&self) -> bool {
        *self == Rules::default()
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
    /// Its tags, delay and dependencies, as written.
    pub rules: Rules,
    /// The final outcome of each dependency known where the entry is read: those recorded in
    /// [`Rules::outcomes`], and those of dependencies the same view shows final (a
    /// [`crate::QueueView`] keeps them as its tasks change; an entry read alone knows only the
    /// recorded ones).
    pub dependencies: std::collections::BTreeMap<TaskId, TaskState>,
    /// Its dedup bumps, merged (none if never bumped).
    pub bump: Option<Bump>,
    /// Derived by a view: the copy of this task that survives (this one has the same dedup
    /// key, was made without knowing of it, and has not started). The task is then
    /// `cancelled`, naming it.
    pub duplicate_of: Option<TaskId>,
    /// A member's request to cancel it, merged (see [`Cancel`]).
    pub cancel: Option<Cancel>,
    /// Its latest requeue (see [`Requeue`]).
    pub requeue: Option<Requeue>,
}

impl TaskEntry {
    /// The attempt number its latest requeue was written at (0: never requeued): only later
    /// attempts count towards `max_attempts`.
    pub fn requeued_at(&self) -> u64 {
        self.requeue.map_or(0, |r| r.n)
    }

    /// The attempts since its latest requeue (all of them if never requeued).
    fn since_requeue(&self) -> impl Iterator<Item = &Attempt> {
        let after = self.requeued_at();
        self.attempts.iter().filter(move |a| a.id.n > after)
    }

    /// The number of failed attempts (errors and interruptions) since its latest requeue;
    /// deferred ones (a failure policy paused a resource) do not count.
    pub fn failures(&self) -> u32 {
        let n = self
            .since_requeue()
            .filter(|a| {
                a.finished
                    .as_ref()
                    .is_some_and(|f| f.outcome.is_failure() && !f.deferred())
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Whether a failure since its latest requeue was ignored by its kind's failure policy.
    pub fn ignored(&self) -> bool {
        self.since_requeue()
            .any(|a| a.finished.as_ref().is_some_and(Finished::ignored))
    }

    /// How many runs of it started over its whole life (refusals do not count, a requeue does
    /// not reset it): the number a run's handler sees as its attempt, its own start included.
    pub fn runs_started(&self) -> u64 {
        let after = self.requeued_at();
        let started = |before: bool| {
            self.attempts
                .iter()
                .filter(|a| a.started.is_some() && (a.id.n <= after) == before)
                .count() as u64
        };
        let earlier = self.requeue.map_or(0, |r| r.s).max(started(true));
        earlier.saturating_add(started(false))
    }

    /// The requeue a member writes to reopen it now, at `now_ms`: above its every attempt.
    pub fn requeue_now(&self, now_ms: u64) -> Requeue {
        Requeue {
            n: self.last_n(),
            s: self.runs_started(),
            t: now_ms,
        }
    }

    /// Whether a member asked to cancel it.
    pub fn cancel_requested(&self) -> bool {
        self.cancel.is_some()
    }

    /// The number of attempts not run (refused: fenced, busy worker, superseded; or the task's
    /// document unavailable) or deferred (a failure policy paused a resource).
    pub fn refusals(&self) -> u32 {
        let n = self
            .since_requeue()
            .filter(|a| {
                a.finished.as_ref().is_some_and(|f| {
                    f.deferred()
                        || matches!(
                            f.outcome,
                            AttemptOutcome::Refused | AttemptOutcome::Unavailable
                        )
                })
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The highest attempt number, 0 if never assigned (at least the number its latest
    /// requeue was written at).
    pub fn last_n(&self) -> u64 {
        self.attempts
            .iter()
            .map(|a| a.id.n)
            .max()
            .unwrap_or(0)
            .max(self.requeued_at())
    }

    /// The attempts with the highest number (more than one only after concurrent routers).
    pub fn current_attempts(&self) -> impl Iterator<Item = &Attempt> {
        let n = self.last_n();
        self.attempts.iter().filter(move |a| a.id.n == n)
    }

    /// The dependency whose outcome cancels this task: the first, by id, that failed or was
    /// cancelled.
    pub fn cancelled_by(&self) -> Option<(&TaskId, TaskState)> {
        self.dependencies
            .iter()
            .find(|(_, s)| matches!(s, TaskState::Failed | TaskState::Cancelled))
            .map(|(d, s)| (d, *s))
    }

    /// Why the task was cancelled, if it was: `"cancelled by <peer>"`, `"duplicate of
    /// <id>"`, `"dependency <id> failed"` or `"dependency <id> was cancelled"`.
    pub fn cancel_reason(&self) -> Option<String> {
        if self.state() != TaskState::Cancelled {
            return None;
        }
        if let Some(c) = &self.cancel {
            return Some(format!("cancelled by {}", c.b));
        }
        if let Some(s) = &self.duplicate_of {
            return Some(format!("duplicate of {s}"));
        }
        self.cancelled_by().map(|(d, s)| match s {
            TaskState::Failed => format!("dependency {d} failed"),
            _ => format!("dependency {d} was cancelled"),
        })
    }

    /// Its priority, raised by its bumps.
    pub fn priority_now(&self) -> i64 {
        self.bump
            .map_or(self.priority, |b| self.priority.max(b.p))
            .clamp(-MAX_PRIORITY, MAX_PRIORITY)
    }

    /// Whether it is urgent, by its submit or a bump.
    pub fn urgent_now(&self) -> bool {
        self.urgent || self.bump.is_some_and(|b| b.u)
    }

    /// When it was last bumped (0: never).
    pub fn bumped_at(&self) -> u64 {
        self.bump.map_or(0, |b| b.t)
    }

    /// Whether some attempt of it started.
    pub fn ever_started(&self) -> bool {
        self.attempts.iter().any(|a| a.started.is_some())
    }

    /// The dependencies whose success is not known yet, in id order.
    pub fn waiting_on(&self) -> impl Iterator<Item = &TaskId> + '_ {
        self.rules
            .depends_on
            .iter()
            .filter(|d| self.dependencies.get(*d) != Some(&TaskState::Succeeded))
    }

    /// Whether every dependency's success is known.
    pub fn dependencies_met(&self) -> bool {
        self.waiting_on().next().is_none()
    }

    /// The task's state, derived from its attempts and its dependencies' outcomes (see
    /// [`TaskState`]).
    pub fn state(&self) -> TaskState {
        if self.attempts.iter().any(|a| {
            a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
        }) {
            return TaskState::Succeeded;
        }
        if self.duplicate_of.is_some() || self.cancelled_by().is_some() || self.cancel.is_some() {
            return TaskState::Cancelled;
        }
        if self.failures() >= self.max_attempts || self.ignored() {
            return TaskState::Failed;
        }
        let n = self.last_n();
        let unavailable = n > self.input_seen
            && self.current_attempts().next().is_some()
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

    /// The attempt with this id.
    pub fn attempt(&self, id: &AttemptId) -> Option<&Attempt> {
        self.attempts.iter().find(|a| &a.id == id)
    }
}
