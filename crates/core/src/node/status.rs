//! A task's status: from a view, the archive, a document, or the members (`Ask`); task waits;
//! answering members' questions; archiving final statuses. May ask `documents` to wait for a task's
//! document.

use super::*;

impl Core {
    /// Answers a status request: from a view for a task a queue indexes (with its task
    /// document if it has one), else from the archive of inline tasks, else from the task's
    /// document, loaded or fetched.
    pub(super) fn find_status(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        let indexed = self.queues.values().any(|q| q.view.task(&task).is_some());
        if indexed && self.inline_task(&task).is_some() {
            self.answer_status(now, cmd, task, wait_until);
            return;
        }
        if !indexed {
            if let Some(json) = self.archive.recent(&task) {
                let reply = archived_status(&task, json);
                self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
                return;
            }
            if self.lookup.wait_for_archive(&task, cmd, wait_until) {
                self.io.push_back(Io::Lookup { task });
            }
            return;
        }
        self.status_from_doc(now, cmd, task, wait_until);
    }

    /// Asks the connected members about a task this node has no record of (not in a view, not
    /// archived, no document found): one of them may have seen it finish (an inline task that
    /// ran while this node was down or cut off, in epochs it skipped). Answered "not found"
    /// when every member asked said it knows nothing, or after [`FIND_TIMEOUT`].
    ///
    /// At most [`crate::MAX_ASKING`] requests wait so: beyond, a request for an id this node
    /// has no record of is answered "not found" at once, and the others' waits
    /// ([`crate::MAX_WAITERS`]) stay free for lookups this node can answer.
    pub(super) fn ask_members(&mut self, now: Time, cmd: CommandId, task: TaskId) {
        if self.lookup.asking() >= crate::MAX_ASKING {
            let r = Err(TaskError::NotFound(task));
            self.replies.push_back((cmd, Reply::Task(Box::new(r))));
            return;
        }
        if self.lookup.join_question(&task, cmd) {
            return;
        }
        let members: BTreeSet<PeerId> = self
            .members
            .connected_peers()
            .filter(|p| self.queues.values().any(|q| q.view.is_member(p)))
            .cloned()
            .collect();
        if members.is_empty() {
            let r = Err(TaskError::NotFound(task));
            self.replies.push_back((cmd, Reply::Task(Box::new(r))));
            return;
        }
        let frame = Ask::Status { task: task.clone() }.encode();
        for p in &members {
            self.transmit.push_back((p.clone(), frame.clone()));
        }
        self.lookup.ask(task, cmd, members, now.mono + FIND_TIMEOUT);
    }

    /// A member asked about a task, or answered this node's question.
    pub(super) fn handle_ask(&mut self, peer: &PeerId, ask: Ask) {
        match ask {
            Ask::Status { task } => {
                if let Some(known) = self.known_status(peer, &task) {
                    self.answer_ask(peer, &task, known);
                    return;
                }
                // Perhaps archived here: look, and answer then.
                match self.lookup.peer_asks(&task, peer) {
                    PeerLookup::Refused => self.answer_ask(peer, &task, None),
                    PeerLookup::Ask => self.io.push_back(Io::Lookup { task }),
                    PeerLookup::Joined => {}
                }
            }
            Ask::Answer { task, status } => {
                if !self.lookup.answered_by(&task, peer) {
                    return; // not asked, or answered already
                }
                // Only a status of a task of a queue this node joined is taken.
                let found = status.and_then(|json| {
                    let s: api::TaskStatus = serde_json::from_value(json).ok()?;
                    (s.id == task && self.queues.contains_key(&s.queue)).then_some(s)
                });
                match found {
                    Some(s) => {
                        let a = self.lookup.take_question(&task);
                        // Learned: a final status is archived here, so that this node answers
                        // for the task from now on, even with no member connected.
                        if s.state.is_final()
                            && let Ok(json) = serde_json::to_vec(&s)
                        {
                            self.archive.record(task.clone(), json);
                        }
                        for cmd in a {
                            self.replies
                                .push_back((cmd, Reply::Task(Box::new(Ok(s.clone())))));
                        }
                    }
                    None => self.not_answered(&task, peer),
                }
            }
        }
    }

    /// `peer` will not tell anything of `task` (it knows nothing, or it is gone): once no
    /// member asked is left, the requests are answered "not found".
    pub(super) fn not_answered(&mut self, task: &TaskId, peer: &PeerId) {
        let cmds = self.lookup.not_answered(task, peer);
        self.not_found(task, cmds);
    }

    /// Answers requests about `task` "not found".
    pub(super) fn not_found(&mut self, task: &TaskId, cmds: Vec<CommandId>) {
        for cmd in cmds {
            let r = Err(TaskError::NotFound(task.clone()));
            self.replies.push_back((cmd, Reply::Task(Box::new(r))));
        }
    }

    /// What this node can tell `peer` of `task` without waiting: `Some(answer)` (which may be
    /// "nothing"), or `None` if its archive must be looked at first.
    pub(super) fn known_status(
        &self,
        peer: &PeerId,
        task: &TaskId,
    ) -> Option<Option<serde_json::Value>> {
        let member = |q: &QueueId| self.queues.get(q).is_some_and(|q| q.view.is_member(peer));
        if let Ok(s) = self.status_of(task) {
            return Some(
                member(&s.queue)
                    .then(|| serde_json::to_value(&s).ok())
                    .flatten(),
            );
        }
        if let Some(json) = self.archive.recent(task) {
            return Some(self.shareable(peer, json));
        }
        None
    }

    /// An archived status, for `peer` if it is a member of the task's queue.
    pub(super) fn shareable(&self, peer: &PeerId, json: &[u8]) -> Option<serde_json::Value> {
        let s: api::TaskStatus = serde_json::from_slice(json).ok()?;
        self.queues
            .get(&s.queue)
            .is_some_and(|q| q.view.is_member(peer))
            .then(|| serde_json::to_value(&s).ok())
            .flatten()
    }

    /// Sends `peer` this node's answer about `task`.
    pub(super) fn answer_ask(
        &mut self,
        peer: &PeerId,
        task: &TaskId,
        status: Option<serde_json::Value>,
    ) {
        let frame = Ask::Answer {
            task: task.clone(),
            status,
        }
        .encode();
        self.transmit.push_back((peer.clone(), frame));
    }

    /// Answers a status request once the task's document is here with content.
    pub(super) fn status_from_doc(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        let Some(doc) = task_doc(&task) else {
            let reply = Err(TaskError::BadId(task.to_string()));
            self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
            return;
        };
        let deadline = now.mono + FIND_TIMEOUT;
        self.wait_for(
            now,
            &doc,
            DocWaiter::Status {
                cmd,
                task,
                wait_until,
                deadline,
            },
        );
    }

    /// The archive's answer for a task (see [`Io::Lookup`]): its final status, or `None` if
    /// it is not archived here, in which case the requests look for its task document.
    pub fn handle_archived(&mut self, now: Time, task: TaskId, status: Option<Vec<u8>>) {
        for peer in self.lookup.take_peers_asking(&task) {
            let answer = status
                .as_deref()
                .and_then(|json| self.shareable(&peer, json));
            self.answer_ask(&peer, &task, answer);
        }
        let waiting = self.lookup.take_archive_waiters(&task);
        for (cmd, wait_until) in waiting {
            match &status {
                Some(json) => {
                    let reply = archived_status(&task, json);
                    self.replies.push_back((cmd, Reply::Task(Box::new(reply))));
                }
                None if self.inline_task(&task).is_some()
                    || self.unviewed_inline_task(&task).is_some() =>
                {
                    // Indexed meanwhile (its entry arrived), or in a queue document no view
                    // shows yet (submitted while the queue stood still, or not carried yet).
                    self.answer_status(now, cmd, task.clone(), wait_until);
                }
                None => self.status_from_doc(now, cmd, task.clone(), wait_until),
            }
        }
        self.turn(now);
    }

    /// Hands the turn's archive records to the driver, and keeps the latest in memory.
    pub(super) fn flush_archive(&mut self) {
        if !self.archive.is_pending() {
            return;
        }
        let records = self.archive.take(RECENT_ARCHIVED);
        let listed = self.archive.take_listed();
        let ends = self.archive.take_ends();
        self.io.push_back(Io::Archive {
            records,
            listed,
            ends,
        });
    }

    /// The input (JSON text) of an inline task that the queue's current view indexes.
    pub(super) fn inline_input(&self, queue: &QueueId, task: &TaskId) -> Option<String> {
        self.queues.get(queue)?.view.task(task)?.input.clone()
    }

    /// The queue and entry of an inline task that a joined queue's current view indexes.
    pub(super) fn inline_task(&self, task: &TaskId) -> Option<(&QueueId, &Queue, &TaskEntry)> {
        self.queues.iter().find_map(|(id, q)| {
            q.view
                .task(task)
                .filter(|t| t.input.is_some())
                .map(|t| (id, q, t))
        })
    }

    /// An inline task that no queue's view shows but a queue document this node holds does:
    /// one submitted while the queue stands still for its successor's last catch-up (its
    /// current document, frozen view), or written to a sealed epoch and not carried yet. Reads
    /// one entry in each of those documents.
    pub(super) fn unviewed_inline_task(
        &self,
        task: &TaskId,
    ) -> Option<(&QueueId, TaskEntry, &Automerge)> {
        self.queues.iter().find_map(|(id, q)| {
            std::iter::once(&q.doc)
                .chain(q.sealed.keys())
                .find_map(|d| {
                    let doc = self.replica.get(d)?;
                    let t = epoch::task_entry(doc, task)?;
                    t.input.is_some().then_some((id, t, doc))
                })
        })
    }

    pub(super) fn status_of(&self, task: &TaskId) -> Result<api::TaskStatus, TaskError> {
        if let Some((id, q, t)) = self.inline_task(task) {
            return match self.replica.get(&q.doc) {
                Some(d) => Ok(inline_status(id, t, d)),
                None => Err(TaskError::NotFound(task.clone())),
            };
        }
        let in_view = self.queues.values().any(|q| q.view.task(task).is_some());
        if !in_view && let Some((id, t, d)) = self.unviewed_inline_task(task) {
            return Ok(inline_status(id, &t, d));
        }
        let doc = task_doc(task).ok_or_else(|| TaskError::BadId(task.to_string()))?;
        let d = self
            .replica
            .get(&doc)
            .ok_or_else(|| TaskError::NotFound(task.clone()))?;
        let t = task::read(d).map_err(|e| TaskError::NotATask(task.clone(), e))?;
        let q = self
            .queues
            .get(&t.queue)
            .ok_or_else(|| TaskError::NotJoined(task.clone(), t.queue.clone()))?;
        // Runs and summaries count only from members that route and run (`judge.rs`).
        let t = match q.view.membership.all_work() {
            true => t,
            false => task::read_judged(d, &q.view.membership)
                .map_err(|e| TaskError::NotATask(task.clone(), e))?,
        };
        let entry = q.view.task(task);
        let (priority, urgent, max_attempts) = match (entry, &t.summary) {
            (Some(e), _) => (
                Some(e.priority_now()),
                Some(e.urgent_now()),
                Some(e.max_attempts),
            ),
            (None, Some(s)) => (s.priority, s.urgent, s.max_attempts),
            (None, None) => (None, None, None),
        };
        let (state, attempts, error) = match (entry, &t.summary) {
            (Some(entry), _) => (entry.state(), entry.attempts.clone(), last_error(entry)),
            // Finished and no longer carried by the queue's current epoch: its summary.
            (None, Some(s)) => (s.state, s.attempts.clone(), s.error.clone()),
            (None, None) => return Err(TaskError::NotIndexed(task.clone(), t.queue.clone())),
        };
        let (rules, cancel_reason) = match (entry, &t.summary) {
            (Some(e), _) => (e.rules.clone(), e.cancel_reason()),
            (None, Some(s)) => (s.rules.clone(), s.cancel_reason.clone()),
            (None, None) => Default::default(),
        };
        // A summary keeps the reason: a member's cancel names the member.
        let cancel_requested = entry.map_or_else(
            || {
                cancel_reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("cancelled by "))
            },
            |e| e.cancel_requested(),
        );
        Ok(api::TaskStatus {
            id: task.clone(),
            queue: t.queue.clone(),
            kind: t.kind.clone(),
            state,
            submitted_at: t.submitted_at,
            submitter: t.submitter.to_string(),
            result: t.result().cloned(),
            input: t.input.clone(),
            priority,
            urgent,
            max_attempts,
            tags: rules.tags,
            depends_on: rules.depends_on,
            dedup_key: rules.dedup_key,
            requires: rules.requires,
            not_before: (rules.not_before > 0).then_some(rules.not_before),
            effective_priority: None,
            blocked_on: None,
            cancel_reason,
            cancel_requested,
            progress: last_progress(&t.runs),
            follows: rules.follows,
            undoes: rules.undoes,
            error,
            attempts,
            runs: t.runs,
        })
    }

    /// Adds to a task's status what its queue's current view says of it as of `now_ms`: its
    /// effective priority, and why it cannot be routed now (its state then shows `blocked`).
    pub(super) fn annotate(&self, mut s: api::TaskStatus, now: Time) -> api::TaskStatus {
        let Some(q) = self.queues.get(&s.queue) else {
            return s;
        };
        let Some(t) = q.view.task(&s.id) else {
            return s;
        };
        s.effective_priority = Some(q.view.effective_priority(t));
        if s.state == TaskState::Running
            && let Some((_, p)) = self.progress.get(&s.id)
        {
            s.progress = Some(*p);
        }
        if s.state == TaskState::Pending {
            s.blocked_on = blocked_on(&q.view, t, now.unix_ms).or_else(|| {
                q.router.lack(now.mono, t).map(|l| match l {
                    piecework_queue_doc::Lack::Kind(kind) => api::BlockedOn::Kind { kind },
                    piecework_queue_doc::Lack::Resources(resources) => {
                        api::BlockedOn::Resource { resources }
                    }
                })
            });
            if s.blocked_on.is_some() {
                s.state = TaskState::Blocked;
            }
        }
        s
    }

    pub(super) fn answer_status(
        &mut self,
        now: Time,
        cmd: CommandId,
        task: TaskId,
        wait_until: Option<Instant>,
    ) {
        let status = self.status_of(&task).map(|s| self.annotate(s, now));
        match (status, wait_until) {
            (Ok(s), Some(until)) if !is_done(&s) && now.mono < until => {
                let wait = until.saturating_duration_since(now.mono);
                self.lookup.wait_on_task(TaskWaiter {
                    cmd,
                    task,
                    until,
                    wait,
                });
            }
            (Ok(s), Some(_)) if !is_done(&s) => {
                self.replies.push_back((
                    cmd,
                    Reply::Task(Box::new(Err(TaskError::Timeout(task, Duration::ZERO)))),
                ));
            }
            (r, _) => self.replies.push_back((cmd, Reply::Task(Box::new(r)))),
        }
    }

    pub(super) fn check_task_waiters(&mut self, now: Time) {
        let waiters = self.lookup.take_task_waits();
        for w in waiters {
            let Some(doc) = task_doc(&w.task) else {
                continue;
            };
            if now.mono >= w.until {
                self.replies.push_back((
                    w.cmd,
                    Reply::Task(Box::new(Err(TaskError::Timeout(w.task, w.wait)))),
                ));
                continue;
            }
            let indexed = self.queues.values().any(|q| q.view.task(&w.task).is_some());
            if !indexed && !self.replica.is_loaded(&doc) {
                // It left the current epoch (an inline task, archived once final) or its
                // document left memory: look again.
                self.find_status(now, w.cmd, w.task, Some(w.until));
                continue;
            }
            if !self.replica.is_loaded(&doc) && self.inline_task(&w.task).is_none() {
                // Evicted meanwhile: load it again and answer when it is back.
                let deadline = now.mono + FIND_TIMEOUT;
                self.wait_for(
                    now,
                    &doc,
                    DocWaiter::Status {
                        cmd: w.cmd,
                        task: w.task,
                        wait_until: Some(w.until),
                        deadline,
                    },
                );
                continue;
            }
            match self.status_of(&w.task).map(|s| self.annotate(s, now)) {
                Ok(s) if !is_done(&s) => self.lookup.wait_on_task(w),
                r => self.replies.push_back((w.cmd, Reply::Task(Box::new(r)))),
            }
        }
    }
}
