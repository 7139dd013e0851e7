//! `Runs`: this node's runs (in flight, and begun this turn), what the runs of inline tasks
//! produced, the writes of attempts' starts and ends and of run records, and the tasks whose
//! input to try to revive. A sub-machine: its fields are its own. The turn tells it of runs
//! begun, ended, fenced and interrupted, and of the writes to make; it takes the writes and the
//! starts from it when it makes them, hands back what must wait, and asks it whether a task or
//! a document is in use and whether everything is written. It asks nothing of the others.

use std::collections::{BTreeMap, BTreeSet};

use piecework_queue_doc::task::{RunStart, Summary};
use piecework_queue_doc::{AttemptId, Output, QueueId, Submission, TaskId};
use piecework_replica::DocId;
use piecework_worker_pool::Run;

use crate::node::writes::{PendingAttempt, TaskWrites};
use crate::{RunId, RunRequest, Running, TaskRunEnd};

/// This node's runs and the writes they make.
#[derive(Debug, Default)]
pub(in crate::node) struct Runs {
    /// Runs in flight, by id: at most one per worker.
    live: BTreeMap<RunId, Running>,
    /// Runs begun this turn, handed to the driver at its end.
    starting: Vec<RunRequest>,
    /// The last run id given.
    next: u64,
    /// Starts and ends of attempts not yet written, per queue, in the order they happened:
    /// written as one change per queue document when the turn's actions are drained. At most
    /// one start and one end per worker.
    attempt_writes: BTreeMap<QueueId, Vec<PendingAttempt>>,
    /// Run records and final summaries not yet written, per task document: written as one
    /// change per document at the end of the turn. At most one run per worker plus the tasks
    /// that became final in this turn.
    task_writes: BTreeMap<DocId, TaskWrites>,
    /// What runs produced for the queue document (an inline task's output, a success's undo
    /// tasks, and its follow-ups), from their end until the pool's finish writes it with the
    /// end: at most one per worker.
    outputs: BTreeMap<(TaskId, AttemptId), (Option<Output>, Vec<Submission>)>,
    /// Tasks seen in `InputUnavailable` to try to revive (queue, task, attempt number): at
    /// most the tasks indexed in that state, drained every turn.
    to_revive: BTreeSet<(QueueId, TaskId, u64)>,
}

impl Runs {
    /// A start is recorded: the run gets the next id, is in flight, and is handed to the
    /// driver at the end of the turn (unless it is fenced before).
    pub(in crate::node) fn begin(&mut self, run: Run, start: RunStart, input: serde_json::Value) {
        self.next += 1;
        let id = RunId(self.next);
        self.starting.push(RunRequest {
            id,
            queue: run.queue.clone(),
            task: run.task.clone(),
            attempt: run.attempt.clone(),
            worker: run.worker.clone(),
            kind: run.kind.clone(),
            input,
            number: run.number,
        });
        self.live.insert(id, Running { run, start });
    }

    /// The runs begun this turn, taken: to hand to the driver, or to look at for fences
    /// (those that may still run come back through [`Runs::still_starting`]).
    pub(in crate::node) fn take_starting(&mut self) -> Vec<RunRequest> {
        std::mem::take(&mut self.starting)
    }

    /// A run begun this turn still starts.
    pub(in crate::node) fn still_starting(&mut self, req: RunRequest) {
        self.starting.push(req);
    }

    /// A run begun this turn was fenced: it never runs.
    pub(in crate::node) fn abort_start(&mut self, id: &RunId) {
        self.live.remove(id);
    }

    /// A run in flight.
    pub(in crate::node) fn get(&self, id: &RunId) -> Option<&Running> {
        self.live.get(id)
    }

    /// The id of the run in flight of `attempt` of `task`, if any.
    pub(in crate::node) fn id_of(&self, task: &TaskId, attempt: &AttemptId) -> Option<RunId> {
        self.live
            .iter()
            .find(|(_, r)| r.run.task == *task && r.run.attempt == *attempt)
            .map(|(id, _)| *id)
    }

    /// Run `id` ended: the run and its start, if it was still in flight (not interrupted).
    pub(in crate::node) fn ended(&mut self, id: &RunId) -> Option<Running> {
        self.live.remove(id)
    }

    /// The grace time of a stop is over: every run in flight is interrupted (what any
    /// produced is dropped); them, in id order.
    pub(in crate::node) fn interrupt_all(&mut self) -> Vec<(RunId, Run)> {
        let runs = std::mem::take(&mut self.live);
        runs.into_iter()
            .map(|(id, Running { run, .. })| {
                self.outputs
                    .remove(&(run.task.clone(), run.attempt.clone()));
                (id, run)
            })
            .collect()
    }

    /// How many runs are in flight.
    pub(in crate::node) fn running(&self) -> usize {
        self.live.len()
    }

    /// Whether a run of `task` is in flight.
    pub(in crate::node) fn runs_task(&self, task: &TaskId) -> bool {
        self.live.values().any(|r| r.run.task == *task)
    }

    /// What a run produced for the queue document (its output record, its follow-ups), kept
    /// until the pool's finish writes it with the end.
    pub(in crate::node) fn keep_output(
        &mut self,
        task: TaskId,
        attempt: AttemptId,
        output: Option<Output>,
        follow_ups: Vec<Submission>,
    ) {
        if output.is_some() || !follow_ups.is_empty() {
            self.outputs.insert((task, attempt), (output, follow_ups));
        }
    }

    /// What a run produced for the queue document, taken (to write with the attempt's end, or
    /// to drop).
    pub(in crate::node) fn take_output(
        &mut self,
        task: &TaskId,
        attempt: &AttemptId,
    ) -> (Option<Output>, Vec<Submission>) {
        self.outputs
            .remove(&(task.clone(), attempt.clone()))
            .unwrap_or_default()
    }

    /// An attempt's start or end, to write into `queue`'s document with the others.
    pub(in crate::node) fn write_attempt(&mut self, queue: QueueId, write: PendingAttempt) {
        self.attempt_writes.entry(queue).or_default().push(write);
    }

    /// The attempts' starts and ends to write, per queue, taken. Those that must wait come
    /// back through [`Runs::hold_attempts`].
    pub(in crate::node) fn take_attempt_writes(
        &mut self,
    ) -> BTreeMap<QueueId, Vec<PendingAttempt>> {
        std::mem::take(&mut self.attempt_writes)
    }

    /// `queue`'s starts and ends wait (its document stands still): they stay ahead of any
    /// written meanwhile.
    pub(in crate::node) fn hold_attempts(
        &mut self,
        queue: QueueId,
        mut pending: Vec<PendingAttempt>,
    ) {
        let later = self.attempt_writes.entry(queue).or_default();
        pending.append(later);
        *later = pending;
    }

    /// A run record to write into its task's document.
    pub(in crate::node) fn record_run(&mut self, doc: DocId, start: RunStart, end: TaskRunEnd) {
        self.task_writes
            .entry(doc)
            .or_default()
            .runs
            .push((start, end));
    }

    /// A final task's summary to write into its document.
    pub(in crate::node) fn record_summary(&mut self, doc: DocId, summary: Summary) {
        self.task_writes.entry(doc).or_default().summary = Some(summary);
    }

    /// The run records and summaries to write, per task document, taken. Those whose
    /// document must be read back first come back through [`Runs::hold_task_writes`].
    pub(in crate::node) fn take_task_writes(&mut self) -> BTreeMap<DocId, TaskWrites> {
        std::mem::take(&mut self.task_writes)
    }

    /// A task document's writes wait for it to be read back.
    pub(in crate::node) fn hold_task_writes(&mut self, doc: DocId, writes: TaskWrites) {
        self.task_writes.insert(doc, writes);
    }

    /// A task document is on no reachable member: its writes are dropped; whether there were
    /// any.
    pub(in crate::node) fn drop_task_writes(&mut self, doc: &DocId) -> bool {
        self.task_writes.remove(doc).is_some()
    }

    /// Whether writes wait for task document `doc`.
    pub(in crate::node) fn writes_to(&self, doc: &DocId) -> bool {
        self.task_writes.contains_key(doc)
    }

    /// Whether no run is in flight or starting and every start, end and record is written.
    pub(in crate::node) fn all_written(&self) -> bool {
        self.live.is_empty()
            && self.starting.is_empty()
            && self.attempt_writes.values().all(Vec::is_empty)
            && self.task_writes.is_empty()
    }

    /// A task of `queue` is in `InputUnavailable` (at attempt `n`): try to revive it this
    /// turn.
    pub(in crate::node) fn revive_later(&mut self, queue: QueueId, task: TaskId, n: u64) {
        self.to_revive.insert((queue, task, n));
    }

    /// The tasks to try to revive, taken, in order.
    pub(in crate::node) fn take_to_revive(&mut self) -> BTreeSet<(QueueId, TaskId, u64)> {
        std::mem::take(&mut self.to_revive)
    }
}
