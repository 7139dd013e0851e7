//! A task's life-cycle commands: cancel a task, requeue a dead-lettered one, requeue every
//! dead-lettered task of a queue. Each writes one record into the queue's current document
//! (`cancels/<task>`, `requeues/<task>`) and answers the task's status as this node's view
//! then shows it.

use super::*;

/// Which life-cycle command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    Cancel,
    Requeue,
}

impl Core {
    /// [`Command::CancelTask`] and [`Command::RequeueTask`].
    pub(super) fn life_command(&mut self, now: Time, cmd: CommandId, task: TaskId, what: Life) {
        let r = self.write_life(now, &task, what);
        match r {
            Ok(()) => self.answer_status(now, cmd, task, None),
            Err(e) => self.replies.push_back((cmd, Reply::Task(Box::new(Err(e))))),
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
            // archived status says so), or unknown here.
            return Err(
                match self.archive.recent(task).map(|j| archived_status(task, j)) {
                    Some(Ok(s)) if what == Life::Requeue && s.state == TaskState::Failed => {
                        TaskError::Conflict(format!(
                            "task {task} left the live queue document (it ended before a \
                             rotation): requeueing such a task is not supported yet"
                        ))
                    }
                    Some(Ok(s)) => TaskError::Conflict(conflict(task, what, s.state)),
                    _ => TaskError::NotFound(task.clone()),
                },
            );
        };
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

    /// [`Command::RequeueFailed`]: every dead-lettered task the queue's live document holds, in
    /// one change.
    pub(super) fn requeue_failed(
        &mut self,
        now: Time,
        queue: &QueueId,
    ) -> Result<Vec<TaskId>, QueueError> {
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
        if failed.is_empty() {
            return Ok(Vec::new());
        }
        let doc = q.doc.clone();
        match self.change(&doc, |d| queue::requeue_many(d, &failed)) {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(QueueError::Write(e)),
            None => return Err(QueueError::NotJoined(queue.clone())),
        }
        self.stale.remove(queue);
        self.refresh(now, queue);
        Ok(failed.into_iter().map(|(t, _)| t).collect())
    }
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
