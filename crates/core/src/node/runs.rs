//! Runs of this node's workers: the pool's actions (start, finish, beat), fetching a task's input,
//! the start's fences, writing starts and ends in one change per queue document and run records per
//! task document, handler ends, and reviving a task whose input was unavailable. May ask
//! `documents` to wait for a task's document.

use super::*;

impl Core {
    /// The answer to [`Io::Run`].
    pub fn handle_run_ended(&mut self, now: Time, id: RunId, result: RunResult) {
        let Some(Running { run, start }) = self.runs.ended(&id) else {
            return;
        };
        self.run_ended(now, run, start, result);
        self.turn(now);
    }

    /// The handler of run `id` reported its progress: the pool's next heartbeats carry it.
    pub fn handle_progress(&mut self, id: RunId, progress: piecework_queue_doc::Progress) {
        if let Some(r) = self.runs.get(&id) {
            self.pool.handle_progress(r.run.worker.index, progress);
        }
    }

    /// A run ended with `result` (its handler returned, or it was cancelled before its handler
    /// was handed over): the pool says what is recorded, in the queue document with the
    /// attempt's end and in the task document's run record.
    fn run_ended(&mut self, now: Time, run: Run, start: RunStart, result: RunResult) {
        let inline = self.inline_input(&run.queue, &run.task).is_some();
        let result = if inline {
            result.within_inline_limit()
        } else {
            result
        };
        let end = match &result.result {
            Ok(_) => RunEnd::Succeeded,
            Err(e) => RunEnd::Failed(e.clone()),
        };
        // The pool says what is recorded: a run asked to stop (cancelled, timed out) may end
        // otherwise than its handler said, and one whose grace time ran out was recorded
        // already.
        let Some((outcome, error)) = self.pool.handle_finished(run.worker.index, end, now.mono)
        else {
            return;
        };
        let ok = outcome == AttemptOutcome::Succeeded;
        let planned = result.planned;
        let task_end = TaskRunEnd {
            outcome,
            at: now.unix_ms,
            result: result.result.ok().filter(|_| ok),
            error,
            logs: result.logs,
            progress: planned.progress,
        };
        self.events.push_back(Event::RunEnded {
            queue: run.queue.clone(),
            task: run.task.clone(),
            ok,
        });
        // A success's follow-ups are indexed with its end, in the same change; its undo tasks
        // are kept in its output record. Neither is kept for another outcome.
        // Within the run's limits (a handler's context refuses more; a driver's result is
        // cut to them here).
        let mut budget = MAX_PLANNED_TOTAL_BYTES;
        let (follow_ups, undo) = if ok {
            let (f, _) = PlannedTask::within_limits(planned.follow_ups, &mut budget);
            let (u, _) = PlannedTask::within_limits(planned.undo, &mut budget);
            (self.follow_ups(&run, f, now), u)
        } else {
            (Vec::new(), Vec::new())
        };
        if inline {
            // Written with the attempt's end, in the queue document.
            let output = Output {
                // A null result (a no-op's) is not written: it reads back as null.
                result: task_end
                    .result
                    .as_ref()
                    .filter(|v| !v.is_null())
                    .and_then(|v| serde_json::to_string(v).ok()),
                logs: task_end.logs,
                undo,
                progress: task_end.progress,
            };
            self.runs.keep_output(
                run.task.clone(),
                run.attempt.clone(),
                Some(output),
                follow_ups,
            );
        } else {
            let output = (!undo.is_empty()).then(|| Output {
                undo,
                ..Output::default()
            });
            self.runs
                .keep_output(run.task.clone(), run.attempt.clone(), output, follow_ups);
            if let Some(tdoc) = task_doc(&run.task) {
                self.runs.record_run(tdoc, start, task_end);
            }
        }
    }

    /// The submissions of a successful run's follow-ups: ids derived from (task, index),
    /// inline, the queue's default attempts where they name none.
    fn follow_ups(&self, run: &Run, planned: Vec<PlannedTask>, now: Time) -> Vec<Submission> {
        let max = self
            .queues
            .get(&run.queue)
            .map_or(1, |q| q.view.config.max_attempts);
        planned
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut s = p.submission(
                    follow_up_id(&run.task, i),
                    self.config.peer.clone(),
                    now.unix_ms,
                    |r| {
                        // It runs after its task's success, which it is written with.
                        r.follows = Some(run.task.clone());
                        r.depends_on = vec![run.task.clone()];
                    },
                );
                s.max_attempts = Some(s.max_attempts.unwrap_or(max));
                s
            })
            .collect()
    }

    pub(super) fn pool_action(&mut self, now: Time, action: PoolAction) {
        match action {
            PoolAction::Start(run) => {
                if let Some(input) = self.inline_input(&run.queue, &run.task) {
                    let input = match serde_json::from_str(&input) {
                        Ok(v) => v,
                        Err(e) => {
                            self.pool.handle_start_failed(
                                run.worker.index,
                                format!("unreadable inline input: {e}"),
                            );
                            return;
                        }
                    };
                    self.start_with(run, input);
                    return;
                }
                let Some(doc) = task_doc(&run.task) else {
                    self.pool.handle_start_failed(
                        run.worker.index,
                        format!("{} is not a task id", run.task),
                    );
                    return;
                };
                let since = now.mono;
                self.wait_for(now, &doc, DocWaiter::Start { run, since });
            }
            PoolAction::Cancel(run) => {
                if let Some(id) = self.runs.id_of(&run.task, &run.attempt) {
                    self.io.push_back(Io::Cancel { run: id });
                }
            }
            PoolAction::Finish {
                worker,
                queue: qid,
                task,
                attempt,
                outcome,
                error,
                started_by,
                overdue,
            } => {
                if outcome == AttemptOutcome::Refused || outcome == AttemptOutcome::Interrupted {
                    self.events.push_back(Event::NotRun {
                        task: task.clone(),
                        attempt: attempt.clone(),
                        outcome,
                        reason: error.clone().unwrap_or_default(),
                    });
                }
                let (output, follow_ups) = self.runs.take_output(&task, &attempt);
                let inline = self.inline_input(&qid, &task).is_some();
                // No handler end records these runs in their task document: an interrupted
                // one, and one whose handler outran its grace time.
                if (outcome == AttemptOutcome::Interrupted || overdue)
                    && !inline
                    && let (Some(inc), Some(doc)) = (started_by, task_doc(&task))
                {
                    // The earlier life recorded the start in the queue document only.
                    let at = self
                        .queues
                        .get(&qid)
                        .and_then(|q| q.view.task(&task))
                        .and_then(|t| t.attempt(&attempt))
                        .and_then(|a| a.started.as_ref())
                        .map_or(0, |s| s.at);
                    let start = RunStart {
                        attempt: attempt.clone(),
                        worker: worker.clone(),
                        incarnation: inc,
                        at,
                    };
                    let end = TaskRunEnd {
                        outcome,
                        at: now.unix_ms,
                        result: None,
                        error: error.clone(),
                        logs: vec![],
                        progress: None,
                    };
                    // Best effort: the task document may not be here.
                    self.runs.record_run(doc, start, end);
                }
                self.runs.write_attempt(
                    qid,
                    PendingAttempt {
                        write: queue::AttemptWrite::Finish {
                            task,
                            attempt,
                            worker,
                            outcome,
                            error,
                            output,
                            follow_ups,
                        },
                        started: None,
                    },
                );
            }
            PoolAction::Beat(beat) => {
                let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
                for id in &ids {
                    self.saw_progress(now, id, &beat);
                }
                for q in self.queues.values_mut() {
                    q.router.handle_pool_beat(now.mono, &beat);
                    // Each queue's copy names this node's epoch document of that queue.
                    let mut beat = beat.clone();
                    if q.epoch > 0 {
                        beat.epoch = Some(Latest {
                            epoch: q.epoch,
                            doc: q.doc.to_string(),
                        });
                    }
                    self.io.push_back(Io::Publish {
                        topic: q.topic.clone(),
                        data: Wire::Pool(beat).encode(),
                    });
                }
            }
        }
    }

    /// Starts a run whose task document is loaded: records the start in both documents, then
    /// asks the driver to run the handler.
    pub(super) fn start_run(&mut self, run: Run) {
        let index = run.worker.index;
        let Some(tdoc) = task_doc(&run.task) else {
            return;
        };
        let input = match self.replica.get(&tdoc).map(task::read_input) {
            Some(Ok(input)) => input,
            Some(Err(e)) => {
                self.pool
                    .handle_start_failed(index, format!("unreadable task document: {e}"));
                return;
            }
            None => {
                self.pool
                    .handle_input_unavailable(index, "the task document is unavailable".into());
                return;
            }
        };
        self.start_with(run, input);
    }

    /// Starts a run whose input is at hand: records the start, then (once it is written) asks
    /// the driver to run the handler.
    pub(super) fn start_with(&mut self, run: Run, input: serde_json::Value) {
        let index = run.worker.index;
        if self.stopping.is_some() {
            self.pool
                .handle_start_failed(index, "the worker's node is stopping".into());
            return;
        }
        if !self.queues.contains_key(&run.queue) {
            self.pool
                .handle_start_failed(index, "this node left the task's queue".into());
            return;
        }
        // The fence may have risen while the task document was fetched.
        if let Some(reason) = self.fenced(&run) {
            self.pool.handle_start_failed(index, reason);
            return;
        }
        self.runs.write_attempt(
            run.queue.clone(),
            PendingAttempt {
                write: queue::AttemptWrite::Start {
                    task: run.task.clone(),
                    attempt: run.attempt.clone(),
                    worker: run.worker.clone(),
                    incarnation: self.config.incarnation,
                },
                started: Some((run, input)),
            },
        );
    }

    /// Writes the turn's starts and ends of attempts, one change per queue document, then
    /// refreshes those views (routers must see their own queue's writes before deciding
    /// again) and hands each recorded start to the driver. True if anything was written.
    pub(super) fn flush_attempts(&mut self, now: Time) -> bool {
        let mut wrote = false;
        for (id, mut pending) in self.runs.take_attempt_writes() {
            if self.queues.get(&id).is_some_and(|q| q.frozen) {
                // Held until the queue's successor is in place (they go there).
                self.runs.hold_attempts(id, pending);
                continue;
            }
            wrote = true;
            // The fence may have risen since the start was asked for (a view or a heartbeat
            // in this turn): checked again where the start is written.
            // So may a cancel of its task have merged.
            pending.retain(|p| match &p.started {
                Some((run, _)) => match self.fenced(run).or_else(|| self.cancelled(run)) {
                    Some(reason) => {
                        self.pool.handle_start_failed(run.worker.index, reason);
                        false
                    }
                    None => true,
                },
                None => true,
            });
            let writes: Vec<queue::AttemptWrite> =
                pending.iter().map(|p| p.write.clone()).collect();
            // The writes are checked against the queue document's cached view rather than by
            // reading the document (several map lookups per write).
            let view = self.current_view(&id);
            let target = self.queues.get(&id).map(|q| (q.doc.clone(), view));
            let results = target
                .and_then(|(doc, view)| {
                    self.change(&doc, |d| match &view {
                        Some(v) => queue::record_attempts_in_view(d, v, &writes, now.unix_ms),
                        None => queue::record_attempts(d, &writes, now.unix_ms),
                    })
                })
                .unwrap_or_else(|| {
                    writes
                        .iter()
                        .map(|_| Err(queue::AttemptError::NotAQueue))
                        .collect()
                });
            for (p, r) in pending.into_iter().zip(results) {
                match (p.started, r) {
                    (Some((run, input)), Ok(())) => self.begin_run(now, run, input),
                    (Some((run, _)), Err(e)) => {
                        self.pool.handle_start_failed(
                            run.worker.index,
                            format!("cannot record the start: {e}"),
                        );
                    }
                    (None, Ok(())) => {}
                    (None, Err(e)) => {
                        tracing::warn!(queue = %id, "cannot record an attempt's end: {e}")
                    }
                }
            }
            self.stale.remove(&id);
            self.refresh(now, &id);
        }
        wrote
    }

    /// Why a run must not start: its attempt was assigned by a router below the greatest
    /// claim this node has seen for the queue.
    /// Starts recorded this turn whose claim a fence raised later in the same turn (a switch
    /// to another branch, a heartbeat) are not run: their workers are freed and their attempts
    /// refused, as if the fence had been known when they were asked for. True if any was.
    ///
    /// Starts whose task a cancel merged into this turn are not run either: their starts are
    /// written, so each ends at once, failed ("cancelled: ..."), as a handler that stopped on
    /// its signal would. No handler starts where the view holds its task's cancel.
    pub(super) fn abort_fenced_starts(&mut self, now: Time) -> bool {
        let mut aborted = false;
        for req in self.runs.take_starting() {
            let reason = self.runs.get(&req.id).and_then(|r| self.fenced(&r.run));
            let cancelled = self
                .runs
                .get(&req.id)
                .is_some_and(|r| self.cancelled(&r.run).is_some());
            match reason {
                Some(reason) => {
                    self.runs.abort_start(&req.id);
                    self.pool.handle_start_failed(req.worker.index, reason);
                    aborted = true;
                }
                None if cancelled => {
                    if let Some(Running { run, start }) = self.runs.ended(&req.id) {
                        let result = RunResult {
                            result: Err("cancelled before its handler started".into()),
                            logs: vec![],
                            planned: Default::default(),
                        };
                        self.run_ended(now, run, start, result);
                        aborted = true;
                    }
                }
                None => self.runs.still_starting(req),
            }
        }
        aborted
    }

    /// Hands this turn's starts to the driver; their timeouts run from now.
    pub(super) fn hand_over_starts(&mut self, now: Time) {
        for req in self.runs.take_starting() {
            self.pool.handle_started(req.worker.index, now.mono);
            self.events.push_back(Event::RunStarted {
                queue: req.queue.clone(),
                task: req.task.clone(),
                attempt: req.attempt.clone(),
                worker: req.worker.clone(),
            });
            self.io.push_back(Io::Run(req));
        }
    }

    /// Why a run must not start because of its task: a cancel of it merged.
    fn cancelled(&self, run: &Run) -> Option<String> {
        self.queues
            .get(&run.queue)
            .and_then(|q| q.view.task(&run.task))
            .is_some_and(|t| t.cancel_requested())
            .then(|| "the task was cancelled".to_owned())
    }

    pub(super) fn fenced(&self, run: &Run) -> Option<String> {
        let fence = self.seen.get(&run.queue)?;
        (run.attempt.claim < *fence && self.fencing()).then(|| {
            format!(
                "fenced: assigned by {}, but {fence} is the router",
                run.attempt.claim
            )
        })
    }

    /// Writes each task document's pending run records and summary in one change.
    /// A document that left memory is read back first; its writes wait for it.
    pub(super) fn flush_task_writes(&mut self, now: Time) {
        for (doc, w) in self.runs.take_task_writes() {
            if self
                .replica
                .get(&doc)
                .is_none_or(|d| d.get_heads().is_empty())
            {
                if w.runs.is_empty() && w.summary.is_none() {
                    continue;
                }
                let waits = self
                    .docs
                    .is_awaited_by(&doc, |w| matches!(w, DocWaiter::Write));
                self.runs.hold_task_writes(doc.clone(), w);
                if !waits {
                    self.wait_for(now, &doc, DocWaiter::Write);
                }
                continue;
            }
            match self.change(&doc, |d| task::record_runs(d, &w.runs, w.summary.as_ref())) {
                Some(Ok(())) => {}
                Some(Err(e)) => tracing::warn!(%doc, "cannot record the task's runs: {e}"),
                None => {}
            }
        }
    }

    /// A start is recorded: hands the run to the driver.
    pub(super) fn begin_run(&mut self, now: Time, run: Run, input: serde_json::Value) {
        let start = RunStart {
            attempt: run.attempt.clone(),
            worker: run.worker.clone(),
            incarnation: self.config.incarnation,
            at: now.unix_ms,
        };
        // Handed to the driver at the end of the turn, if no higher claim came to light
        // meanwhile ([`Core::abort_fenced_starts`]).
        self.runs.begin(run, start, input);
    }

    /// A task's input was unavailable to its worker: if this node holds the task's document,
    /// mark the input available so that it is routed again; if it is not in memory, look on
    /// disk first (the fetch also asks members, which is harmless).
    pub(super) fn revive(&mut self, now: Time, queue: QueueId, task: TaskId, n: u64) {
        let Some(doc) = task_doc(&task) else { return };
        let still = self
            .queues
            .get(&queue)
            .and_then(|q| q.view.task(&task))
            .is_some_and(|t| t.state() == TaskState::InputUnavailable);
        if !still {
            return;
        }
        let held = self
            .replica
            .get(&doc)
            .is_some_and(|d| !d.get_heads().is_empty());
        if held {
            self.write_queue(now, &queue, "a task's input as available", |d| {
                queue::mark_input_available(d, &task, n)
            });
            return;
        }
        let waiting = self.docs.is_awaited_by(&doc, |w| {
            matches!(w, DocWaiter::Revive { .. } | DocWaiter::Start { .. })
        });
        if !waiting {
            self.wait_for(now, &doc, DocWaiter::Revive { queue, task, n });
        }
    }
}
