//! A task's life-cycle commands: cancel a task, requeue a dead-lettered one, requeue every
//! dead-lettered task of a queue, undo a succeeded one. Each writes into the queue's current
//! document (`cancels/<task>`, `requeues/<task>`, the undo tasks' entries) and answers the
//! task's status, or the tasks made, as this node's view then shows them.
//!
//! A dead-lettered task that already left the live document (a rotation dropped it as ended)
//! is requeued from the end this node kept of it: its entry and records are written back,
//! then the requeue. The last ends are in memory ([`super::state::Ends`]); every end is also
//! kept on disk ([`Io::Archive`]'s `ends`), and a requeue, an undo or a bulk requeue that
//! needs one memory no longer holds (after a restart, or thousands of ends later) reads them
//! back first ([`Io::LookupEnds`], [`Core::handle_ends`]).

use super::state::EndWait;
use super::*;
use piecework_queue_doc::Role as MemberRole;

/// Which life-cycle command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    Cancel,
    Requeue,
}

impl Core {
    /// [`Command::CancelTask`] and [`Command::RequeueTask`].
    pub(super) fn life_command(&mut self, now: Time, cmd: CommandId, task: TaskId, what: Life) {
        if what == Life::Requeue && self.left_unkept(&task) {
            self.look_up_ends(cmd, EndWait::Requeue(task));
            return;
        }
        self.answer_life(now, cmd, task, what);
    }

    fn answer_life(&mut self, now: Time, cmd: CommandId, task: TaskId, what: Life) {
        let r = self.write_life(now, &task, what);
        match r {
            // A task with a document of its own answers once its document is read.
            Ok(()) => self.find_status(now, cmd, task, None),
            Err(e) => self.replies.push_back((cmd, Reply::Task(Box::new(Err(e))))),
        }
    }

    /// [`Command::UndoTask`].
    pub(super) fn undo_command(&mut self, now: Time, cmd: CommandId, task: TaskId) {
        if self.left_unkept(&task) {
            self.look_up_ends(cmd, EndWait::Undo(task));
            return;
        }
        let r = self.undo_task(now, &task);
        self.replies.push_back((cmd, Reply::Undone(r)));
    }

    /// [`Command::RequeueFailed`]: the dead letters that left the live document are read
    /// from the store first.
    pub(super) fn requeue_all_command(&mut self, now: Time, cmd: CommandId, queue: QueueId) {
        if !self.queues.contains_key(&queue) || self.waiting() >= MAX_WAITERS {
            let r = self.requeue_failed(now, &queue, Vec::new());
            self.replies.push_back((cmd, Reply::TaskIds(r)));
            return;
        }
        self.look_up_ends(cmd, EndWait::RequeueAll(queue));
    }

    /// Whether `task` (a well-formed id) is in no live document this node follows and its end
    /// is not in memory: only the store may still hold its end.
    fn left_unkept(&self, task: &TaskId) -> bool {
        task_doc(task).is_some()
            && self.ends.get(task).is_none()
            && !self.queues.values().any(|q| q.view.task(task).is_some())
            && self.waiting() < MAX_WAITERS
    }

    /// `cmd` waits while the store reads the kept ends it needs: the task's (and for an
    /// undo, its undo tasks', to make none twice), or a queue's dead letters'.
    fn look_up_ends(&mut self, cmd: CommandId, what: EndWait) {
        let (tasks, failed_in) = match &what {
            EndWait::Requeue(t) => (vec![t.clone()], None),
            EndWait::Undo(t) => (
                std::iter::once(t.clone())
                    .chain((0..piecework_queue_doc::MAX_PLANNED).map(|i| undo_id(t, i)))
                    .collect(),
                None,
            ),
            EndWait::RequeueAll(q) => (Vec::new(), Some(q.clone())),
        };
        let lookup = self.lookup.wait_for_ends(cmd, what);
        self.io.push_back(Io::LookupEnds {
            lookup,
            tasks,
            failed_in,
        });
    }

    /// The store read the kept ends of lookup `lookup` ([`Io::LookupEnds`]): each task's
    /// encoded end. The command that waited goes on with them: a requeue's or an undo's
    /// are kept in memory again, a bulk requeue's are requeued.
    pub fn handle_ends(&mut self, now: Time, lookup: u64, found: Vec<(TaskId, Vec<u8>)>) {
        let ends: Vec<(QueueId, TaskEnd)> = found
            .into_iter()
            .filter_map(|(task, bytes)| match TaskEnd::decode(&bytes) {
                Ok((q, end)) if end.entry().id == task => Some((q, end)),
                Ok(_) => {
                    tracing::warn!(%task, "a kept end stored under another task's id");
                    None
                }
                Err(e) => {
                    tracing::warn!(%task, "cannot read a kept end: {e}");
                    None
                }
            })
            .collect();
        let Some((cmd, what)) = self.lookup.take_ends_waiter(lookup) else {
            return;
        };
        match what {
            _ if self.stopping.is_some() => {
                let reply = match what {
                    EndWait::Undo(_) => Reply::Undone(Err(TaskError::Stopped)),
                    EndWait::RequeueAll(_) => Reply::TaskIds(Err(QueueError::Stopped)),
                    EndWait::Requeue(_) => Reply::Task(Box::new(Err(TaskError::Stopped))),
                };
                self.replies.push_back((cmd, reply));
            }
            EndWait::RequeueAll(queue) => {
                let r = self.requeue_failed(now, &queue, ends);
                self.replies.push_back((cmd, Reply::TaskIds(r)));
            }
            EndWait::Requeue(task) => {
                self.remember_ends(ends);
                self.answer_life(now, cmd, task, Life::Requeue);
            }
            EndWait::Undo(task) => {
                self.remember_ends(ends);
                let r = self.undo_task(now, &task);
                self.replies.push_back((cmd, Reply::Undone(r)));
            }
        }
        self.turn(now);
    }

    /// Ends read back from the store, kept in memory again where memory holds none of the
    /// task (it holds the same or a later one otherwise).
    fn remember_ends(&mut self, ends: Vec<(QueueId, TaskEnd)>) {
        for (q, end) in ends {
            if self.ends.get(&end.entry().id).is_none() {
                self.ends.record_of(Some(&q), end);
            }
        }
    }

    fn write_life(&mut self, now: Time, task: &TaskId, what: Life) -> Result<(), TaskError> {
        if task_doc(task).is_none() {
            return Err(TaskError::BadId(task.to_string()));
        }
        let found = self
            .queues
            .iter()
            .find_map(|(id, q)| q.view.task(task).map(|t| (id.clone(), q.doc.clone(), t)));
        let Some((queue, doc, entry)) = found else {
            // Not in a live queue document this node follows: ended and left behind (its
            // kept end or its archived status says so), or unknown here.
            if let Some(end) = self.ends.get(task) {
                let state = end.entry().state();
                if what == Life::Requeue && state == TaskState::Failed {
                    return self.requeue_left(now, task);
                }
                return Err(TaskError::Conflict(conflict(task, what, state)));
            }
            return Err(
                match self.archive.recent(task).map(|j| archived_status(task, j)) {
                    Some(Ok(s)) if what == Life::Requeue && s.state == TaskState::Failed => {
                        TaskError::Conflict(format!(
                            "task {task} left the live queue document and this node's store no \
                             longer holds its end: it cannot be requeued from here"
                        ))
                    }
                    Some(Ok(s)) => TaskError::Conflict(conflict(task, what, s.state)),
                    _ => TaskError::NotFound(task.clone()),
                },
            );
        };
        let action = match what {
            Life::Cancel => "cancelling",
            Life::Requeue => "requeueing",
        };
        self.may_act_on(&queue, entry, action, true)?;
        let state = entry.state();
        let allowed = match what {
            Life::Cancel => !state.is_final(),
            Life::Requeue => state == TaskState::Failed,
        };
        if !allowed {
            return Err(TaskError::Conflict(conflict(task, what, state)));
        }
        let requeue = entry.requeue_now(now.unix_ms);
        let me = self.config.peer.clone();
        let written = self.change(&doc, |d| match what {
            Life::Cancel => queue::cancel(d, task, &me, now.unix_ms),
            Life::Requeue => queue::requeue(d, task, requeue),
        });
        self.life_written(now, task, queue, written)
    }

    /// Requeues a dead-lettered task that left its queue's live document, from the end this
    /// node kept of it: its entry, its records and the requeue record are written back in one
    /// change (`epoch::restore_ends`).
    fn requeue_left(&mut self, now: Time, task: &TaskId) -> Result<(), TaskError> {
        let Some(queue) = self.ends.queue_of(task).cloned() else {
            return Err(TaskError::NotFound(task.clone()));
        };
        let Some(doc) = self.queues.get(&queue).map(|q| q.doc.clone()) else {
            return Err(TaskError::NotFound(task.clone()));
        };
        let Some(end) = self.ends.get(task) else {
            return Err(TaskError::NotFound(task.clone()));
        };
        self.may_act_on(&queue, end.entry(), "requeueing", true)?;
        let back = requeued(end, now);
        let written = self.change(&doc, |d| {
            piecework_queue_doc::epoch::restore_ends(d, &[&back]).map(|_| ())
        });
        self.life_written(now, task, queue, written)
    }

    /// [`Command::UndoTask`]: submits the undo tasks the task's successful run recorded, into
    /// its queue's live document, each under an id derived from (task, index); one already
    /// made (by an earlier undo, here or on another member) is not made again.
    pub(super) fn undo_task(&mut self, now: Time, task: &TaskId) -> Result<Vec<TaskId>, TaskError> {
        if task_doc(task).is_none() {
            return Err(TaskError::BadId(task.to_string()));
        }
        let live = self
            .queues
            .iter()
            .find_map(|(id, q)| q.view.task(task).map(|t| (id.clone(), Arc::new(t.clone()))));
        let (queue, entry, outputs) = match live {
            Some((queue, entry)) => {
                let doc = self.queues.get(&queue).map(|q| q.doc.clone());
                let outputs = doc
                    .and_then(|d| self.replica.get(&d))
                    .map(|d| read_outputs(d, task))
                    .unwrap_or_default();
                (queue, entry, outputs)
            }
            None => match (self.ends.get(task), self.ends.queue_of(task)) {
                (Some(end), Some(q)) => (q.clone(), end.shared_entry(), end.outputs().to_vec()),
                _ => {
                    return Err(
                        match self.archive.recent(task).map(|j| archived_status(task, j)) {
                            Some(Ok(s)) if s.state != TaskState::Succeeded => {
                                TaskError::Conflict(format!(
                                    "task {task} is {}: only a succeeded task can be undone",
                                    s.state.as_str()
                                ))
                            }
                            Some(Ok(_)) => TaskError::Conflict(format!(
                                "task {task} left the live queue document and this node's store \
                                 no longer holds its end: its undo tasks are unknown here"
                            )),
                            _ => TaskError::NotFound(task.clone()),
                        },
                    );
                }
            },
        };
        self.may_act_on(&queue, &entry, "undoing", false)?;
        let state = entry.state();
        if state != TaskState::Succeeded {
            return Err(TaskError::Conflict(format!(
                "task {task} is {}: only a succeeded task can be undone",
                state.as_str()
            )));
        }
        // The undo tasks of its first successful run that recorded any.
        let succeeded: BTreeSet<&piecework_queue_doc::AttemptId> = entry
            .attempts
            .iter()
            .filter(|a| {
                a.finished
                    .as_ref()
                    .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
            })
            .map(|a| &a.id)
            .collect();
        let plans = outputs
            .iter()
            .filter(|(a, o)| succeeded.contains(a) && !o.undo.is_empty())
            .map(|(_, o)| o.undo.clone())
            .next()
            .unwrap_or_default();
        // As any member may have written them: the valid ones, within a run's limits.
        let mut budget = MAX_PLANNED_TOTAL_BYTES;
        let (plans, _) = PlannedTask::within_limits(plans, &mut budget);
        let Some(q) = self.queues.get(&queue) else {
            return Err(TaskError::NotJoined(task.clone(), queue));
        };
        let max = q.view.config.max_attempts;
        let doc = q.doc.clone();
        let ids: Vec<TaskId> = (0..plans.len()).map(|i| undo_id(task, i)).collect();
        let subs: Vec<Submission> = plans
            .iter()
            .zip(&ids)
            .filter(|(_, id)| q.view.task(id).is_none() && self.ends.get(id).is_none())
            .map(|(p, id)| {
                let mut s = p.submission(id.clone(), self.config.peer.clone(), now.unix_ms, |r| {
                    r.undoes = Some(task.clone())
                });
                s.max_attempts = Some(s.max_attempts.unwrap_or(max));
                s
            })
            .collect();
        if !subs.is_empty() {
            // The document may hold some already (another member's undo merged in since the
            // view was read): those are left as they are.
            let written = self.change(&doc, |d| {
                let new: Vec<Submission> = subs
                    .iter()
                    .filter(|s| !epoch::indexes(d, &s.id))
                    .cloned()
                    .collect();
                queue::submit_many(d, &new)
            });
            match written {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(TaskError::Write(e.to_string())),
                None => return Err(TaskError::NotJoined(task.clone(), queue)),
            }
            self.stale.remove(&queue);
            self.refresh(now, &queue);
        }
        Ok(ids)
    }

    /// The answer to a life-cycle record's write into `queue`'s document; the view is read
    /// again if it was written.
    fn life_written(
        &mut self,
        now: Time,
        task: &TaskId,
        queue: QueueId,
        written: Option<Result<(), queue::WriteError>>,
    ) -> Result<(), TaskError> {
        match written {
            Some(Ok(())) => {}
            Some(Err(queue::WriteError::UnknownTask(_))) | None => {
                return Err(TaskError::NotIndexed(task.clone(), queue));
            }
            Some(Err(e)) => return Err(TaskError::Write(e.to_string())),
        }
        self.stale.remove(&queue);
        self.refresh(now, &queue);
        Ok(())
    }

    /// [`Command::RequeueFailed`]: every dead-lettered task of the queue: those its live
    /// document holds, and those that left it whose end this node kept (in memory, or
    /// `stored`, read back from the store), written back with their requeue; in one change.
    pub(super) fn requeue_failed(
        &mut self,
        now: Time,
        queue: &QueueId,
        stored: Vec<(QueueId, TaskEnd)>,
    ) -> Result<Vec<TaskId>, QueueError> {
        self.require(queue, MemberRole::Member, "requeueing every dead letter")?;
        let q = self
            .queues
            .get(queue)
            .ok_or_else(|| QueueError::NotJoined(queue.clone()))?;
        let failed: Vec<(TaskId, piecework_queue_doc::Requeue)> = q
            .view
            .tasks()
            .values()
            .filter(|t| t.state() == TaskState::Failed)
            .map(|t| (t.id.clone(), t.requeue_now(now.unix_ms)))
            .collect();
        // Memory's end of a task is the same as the store's, or later.
        let kept = self.ends.of_queue(queue).cloned().collect::<Vec<_>>();
        let stored = stored
            .into_iter()
            .filter(|(sq, e)| sq == queue && self.ends.get(&e.entry().id).is_none())
            .map(|(_, e)| e);
        let left: Vec<TaskEnd> = kept
            .into_iter()
            .chain(stored)
            .filter(|e| {
                e.entry().state() == TaskState::Failed && q.view.task(&e.entry().id).is_none()
            })
            .map(|e| requeued(&e, now))
            .collect();

        if failed.is_empty() && left.is_empty() {
            return Ok(Vec::new());
        }
        let doc = q.doc.clone();
        let written = self.change(&doc, |d| {
            queue::requeue_many(d, &failed)?;
            let refs: Vec<&TaskEnd> = left.iter().collect();
            piecework_queue_doc::epoch::restore_ends(d, &refs).map(|_| ())
        });
        match written {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(QueueError::Write(e)),
            None => return Err(QueueError::NotJoined(queue.clone())),
        }
        self.stale.remove(queue);
        self.refresh(now, queue);
        let mut ids: Vec<TaskId> = failed.into_iter().map(|(t, _)| t).collect();
        ids.extend(left.iter().map(|e| e.entry().id.clone()));
        ids.sort();
        Ok(ids)
    }
}

/// Keeps a task's end: in memory, and encoded for the store at the end of the turn.
pub(super) fn keep_end(archive: &mut Archive, ends: &mut Ends, queue: &QueueId, end: TaskEnd) {
    archive.end(end.entry().id.clone(), end.encode(queue));
    ends.record_of(Some(queue), end);
}

/// `end`'s task as it ended, with a requeue at `now` merged into its record: written back
/// in one change, so that no replica sees the dead letter back without its requeue.
///
/// An attempt the end holds open (started under a router whose claim no longer counts, while
/// the failure policy dead-lettered the task) is not written back: no pool runs it any more,
/// and restored it would hold the task `running` with nobody to end it. Its number stays
/// taken (the requeue's `n` counts it).
fn requeued(end: &TaskEnd, now: Time) -> TaskEnd {
    let mut entry = end.entry().clone();
    let requeue = entry.requeue_now(now.unix_ms);
    entry.requeue = Some(entry.requeue.map_or(requeue, |r| r.merge(requeue)));
    entry.attempts.retain(|a| a.finished.is_some());
    TaskEnd::new(Arc::new(entry), end.outputs().to_vec())
}

/// Why `what` cannot be done to a task in `state`.
fn conflict(task: &TaskId, what: Life, state: TaskState) -> String {
    match what {
        Life::Cancel => format!(
            "task {task} is {}: only a task that has not ended can be cancelled",
            state.as_str()
        ),
        Life::Requeue => format!(
            "task {task} is {}: only a failed (dead-lettered) task can be requeued",
            state.as_str()
        ),
    }
}
