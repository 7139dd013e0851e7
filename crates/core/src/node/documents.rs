//! Documents: loads and their retries, saves' answers, the replica's events, requests parked on a
//! document and what answers them (arrival, unavailability, deadlines), eviction and disk
//! retention. May ask `status` to answer a status request, `runs` to start a run, `follow` to
//! resume a queue, and the queues' refresh (through `stale`).

use super::*;

impl Core {
    /// The answer to [`Io::Load`]: every stored chunk (none if the document is not stored), or
    /// the read's error.
    pub fn handle_loaded(
        &mut self,
        now: Time,
        doc: &DocId,
        chunks: Result<Vec<Vec<u8>>, StorageFailure>,
    ) {
        let attempts = self.docs.load_answered(doc);
        let loaded = match chunks {
            Ok(chunks) if chunks.is_empty() => None,
            Ok(chunks) => match piecework_replica::load_chunks(&chunks) {
                Ok(d) => {
                    let bytes = chunks.iter().map(Vec::len).sum();
                    self.saves.loaded(doc, chunks.len(), bytes);
                    Some(d)
                }
                Err(e) => self.load_without_bad_chunks(doc, &chunks, &e),
            },
            // Retried: a transient read error must not make a stored document look absent.
            Err(e) if self.docs.load_failed(doc, attempts, now.mono) => {
                self.events.push_back(Event::LoadFailed {
                    doc: doc.clone(),
                    error: format!("{e} (attempt {attempts}, retrying)"),
                });
                self.turn(now);
                return;
            }
            Err(e) => {
                self.events.push_back(Event::LoadFailed {
                    doc: doc.clone(),
                    error: format!("{e} (attempt {attempts}, giving up: treated as absent)"),
                });
                None
            }
        };
        self.replica.handle_loaded(doc, loaded, now.mono);
        // Loaded for a peer's message (a member catching up through an old epoch), or for
        // this node: either way it leaves memory once idle, unless something holds it.
        if self.replica.is_loaded(doc) && !self.is_live(doc) {
            self.docs.may_evict(doc.clone(), now.mono);
        }
        self.turn(now);
    }

    /// A document whose stored chunks do not load together: the chunks that do not decode on
    /// their own are moved aside ([`Io::Quarantine`], reported once as
    /// [`Event::Quarantined`]) and the rest is loaded. `None` (treated as absent) if it still
    /// does not load.
    fn load_without_bad_chunks(
        &mut self,
        doc: &DocId,
        chunks: &[Vec<u8>],
        error: &automerge::AutomergeError,
    ) -> Option<Automerge> {
        let (good, bad): (Vec<&Vec<u8>>, Vec<&Vec<u8>>) = chunks
            .iter()
            .partition(|c| Automerge::new().load_incremental(c).is_ok());
        for chunk in bad {
            self.events.push_back(Event::Quarantined {
                doc: doc.clone(),
                bytes: chunk.len(),
                error: error.to_string(),
            });
            self.io.push_back(Io::Quarantine {
                doc: doc.clone(),
                chunk: chunk.clone(),
            });
        }
        let loaded = match good.is_empty() {
            true => None,
            false => piecework_replica::load_chunks(&good).ok(),
        };
        match loaded {
            Some(d) => {
                let bytes = good.iter().map(|c| c.len()).sum();
                self.saves.loaded(doc, good.len(), bytes);
                Some(d)
            }
            None => {
                self.events.push_back(Event::LoadFailed {
                    doc: doc.clone(),
                    error: format!(
                        "its stored chunks do not load ({error}); the document is treated as absent"
                    ),
                });
                None
            }
        }
    }

    /// The answer to [`Io::Save`].
    pub fn handle_saved(&mut self, now: Time, id: SaveId, result: Result<Saved, StorageFailure>) {
        self.submits.mark_dirty();
        let was_failing = self.saves.store_failing().is_some();
        match self
            .saves
            .handle_saved(now.mono, id, result, &mut self.replica)
        {
            Some(Acked::Failed {
                doc,
                failures,
                error,
            }) if failures >= crate::SAVE_FAILURES_REPORTED => {
                self.events.push_back(Event::SaveFailed {
                    doc,
                    failures,
                    error,
                });
            }
            _ => {}
        }
        match (was_failing, self.saves.store_failing()) {
            (false, Some(error)) => self.events.push_back(Event::StoreFailing {
                error: error.clone(),
            }),
            (true, None) => self.events.push_back(Event::StoreRecovered),
            _ => {}
        }
        self.turn(now);
    }

    pub(super) fn drain_replica(&mut self, now: Time) {
        while let Some(ev) = self.replica.poll_event() {
            match ev {
                ReplicaEvent::Load(doc) => {
                    if self.docs.load(&doc) {
                        self.io.push_back(Io::Load { doc });
                    }
                }
                ReplicaEvent::Changed(doc) => self.changed(&doc),
                ReplicaEvent::Arrived(doc) => self.arrived(now, &doc),
                ReplicaEvent::Unavailable(doc) => self.unavailable(now, &doc),
                ReplicaEvent::Rejected { peer, reason } => {
                    self.events.push_back(Event::Rejected { peer, reason });
                }
                ReplicaEvent::Presented { peer, doc, proof } => {
                    self.presented(now, peer, doc, proof);
                }
                ReplicaEvent::Refused { peer, doc } => {
                    tracing::debug!(%peer, %doc, "refused a document outside this node's queues");
                }
            }
        }
    }

    /// A document changed (here or from a peer): save it, and refresh its queue's view.
    pub(super) fn changed(&mut self, doc: &DocId) {
        self.saves.changed(doc);
        let Some(id) = self.epochs.queue_of(doc) else {
            return;
        };
        if let Some(q) = self.queues.get_mut(id) {
            if let Some(s) = q.sealed.get_mut(doc) {
                s.dirty = true;
            }
            self.stale.insert(id.clone());
        }
    }

    /// Applies a local change to a loaded document; `None` if it is not loaded.
    pub(super) fn change<R>(
        &mut self,
        doc: &DocId,
        f: impl FnOnce(&mut Automerge) -> R,
    ) -> Option<R> {
        let before = self.replica.get(doc)?.get_heads();
        let r = self.replica.change(doc, f)?;
        if self
            .replica
            .get(doc)
            .is_some_and(|d| d.get_heads() != before)
        {
            self.changed(doc);
        }
        Some(r)
    }

    pub(super) fn wait_for(&mut self, now: Time, doc: &DocId, waiter: DocWaiter) {
        if matches!(
            waiter,
            DocWaiter::Join {
                invite: Some(_),
                ..
            }
        ) {
            self.present_invite(now, doc, waiter);
            return;
        }
        self.docs.park(doc, waiter);
        self.replica.fetch(doc, now.mono);
    }

    pub(super) fn waiting(&self) -> usize {
        self.docs.parked() + self.lookup.waiting() + self.opens.len()
    }

    /// A document this node waited for is loaded.
    pub(super) fn arrived(&mut self, now: Time, doc: &DocId) {
        let waiters = self.docs.take_waiters(doc);
        let asked = waiters
            .iter()
            .any(|w| matches!(w, DocWaiter::Status { .. }));
        for w in waiters {
            match w {
                DocWaiter::Join {
                    cmd, id, invite, ..
                } => match self.finish_join(now, &id, invite.as_ref().map(|i| &i.member)) {
                    Ok(view) => self.opened(cmd, id, Some(view)),
                    Err(e) => self.replies.push_back((cmd, Reply::Joined(Err(e)))),
                },
                DocWaiter::Status {
                    cmd,
                    task,
                    wait_until,
                    ..
                } => self.answer_status(now, cmd, task, wait_until),
                DocWaiter::Start { run, .. } => self.start_run(run),
                DocWaiter::Revive { queue, task, n } => self.revive(now, queue, task, n),
                DocWaiter::Write => {}
                DocWaiter::Resume { queue } => self.resume_at(now, &queue, doc),
                DocWaiter::Epoch { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.fetching.remove(doc);
                        // A carry may have waited for this document of the chain.
                        for s in q.sealed.values_mut() {
                            s.dirty = true;
                        }
                        self.stale.insert(queue);
                    }
                }
            }
        }
        // A task's document loaded from disk may be behind: this node may have been down when
        // the task ended, and a final task's document is no longer announced. Ask the members,
        // for a status or a final task. (A live task's document read for its start or ahead
        // of it needs only its input, which never changes; its later changes are pushed here.)
        let task = TaskId::new(doc.as_str());
        if self.queues.values().any(|q| {
            q.view
                .task(&task)
                .is_some_and(|t| asked || t.state().is_final())
        }) {
            self.replica.refresh_from_members(doc);
        }
        if !self.is_live(doc) {
            self.docs.may_evict(doc.clone(), now.mono);
        }
    }

    pub(super) fn unavailable(&mut self, now: Time, doc: &DocId) {
        for w in self.docs.take_waiters(doc) {
            match w {
                DocWaiter::Join {
                    cmd,
                    invite: Some(by),
                    ..
                } if by.presented => self.replies.push_back((
                    cmd,
                    Reply::Joined(Err(QueueError::BadInvite(format!(
                        "{} did not admit this node: the invite is for another peer, expired, \
                         or made by a member that is no longer an admin",
                        by.member
                    )))),
                )),
                w @ DocWaiter::Join {
                    from_peers: true,
                    deadline,
                    ..
                } if now.mono < deadline => {
                    // Ask again when another peer connects; the deadline bounds it.
                    self.docs.retry_join(w);
                }
                DocWaiter::Join {
                    cmd, id, invite, ..
                } => self
                    .replies
                    .push_back((cmd, Reply::Joined(Err(join_failed(id, invite.is_some()))))),
                // No member has a document for it (an inline task has none): the members may
                // still know what became of it.
                DocWaiter::Status { cmd, task, .. } => self.ask_members(now, cmd, task),
                DocWaiter::Start { run, since } => {
                    let timed_out = now.mono.saturating_duration_since(since)
                        >= piecework_replica::FETCH_TIMEOUT;
                    self.events.push_back(Event::FetchFailed {
                        task: run.task.clone(),
                        timed_out,
                    });
                    self.pool.handle_input_unavailable(
                        run.worker.index,
                        "the task document is unavailable: no reachable member has it".into(),
                    );
                }
                // Not here either: another member may have it.
                DocWaiter::Revive { .. } => {}
                // Never saved here (the node stopped first): the queue follows its chain
                // from where it is.
                DocWaiter::Resume { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.resuming = None;
                        self.stale.insert(queue);
                    }
                }
                DocWaiter::Write => {
                    if self.runs.drop_task_writes(doc) {
                        tracing::warn!(%doc, "cannot record the task's runs: its document is on no reachable member");
                    }
                }
                // Asked again at the next change of the queue.
                DocWaiter::Epoch { queue } => {
                    if let Some(q) = self.queues.get_mut(&queue) {
                        q.fetching.remove(doc);
                        if q.unavailable.len() < MAX_REJECTED_EPOCHS {
                            q.unavailable.insert(doc.clone());
                        }
                        for s in q.sealed.values_mut() {
                            s.dirty = true;
                        }
                        self.stale.insert(queue);
                    }
                }
            }
        }
    }

    /// Every [`JOIN_ASK_EVERY`] while joins wait: a join whose fetch still waits asks the
    /// connected peers again, and one that found no peer with the queue fetches again.
    pub(super) fn ask_joins_again(&mut self, now: Time) {
        let Some((fetching, retries)) = self.docs.joins_to_ask_again(now.mono) else {
            return;
        };
        for doc in fetching {
            self.replica.ask_again(&doc);
        }
        for w in retries {
            if let DocWaiter::Join { id, .. } = &w
                && let Some(doc) = queue_doc(id)
            {
                self.wait_for(now, &doc, w);
            }
        }
    }

    pub(super) fn expire_doc_waiters(&mut self, now: Time) {
        for (task, cmds) in self.lookup.expire_questions(now.mono) {
            self.not_found(&task, cmds);
        }
        for w in self.docs.expire(now.mono) {
            match w {
                DocWaiter::Join {
                    cmd, id, invite, ..
                } => self
                    .replies
                    .push_back((cmd, Reply::Joined(Err(join_failed(id, invite.is_some()))))),
                DocWaiter::Status { cmd, task, .. } => self
                    .replies
                    .push_back((cmd, Reply::Task(Box::new(Err(TaskError::NotFound(task)))))),
                DocWaiter::Start { .. }
                | DocWaiter::Revive { .. }
                | DocWaiter::Epoch { .. }
                | DocWaiter::Resume { .. }
                | DocWaiter::Write => {}
            }
        }
    }

    /// Whether a document must stay in memory: a joined queue's, a live task's (not final),
    /// one a request waits on, or one a run of this node uses.
    pub(super) fn is_live(&self, doc: &DocId) -> bool {
        let id = QueueId::new(doc.as_str());
        if self.queues.contains_key(&id) || self.epochs.holds(doc) || self.docs.is_awaited(doc) {
            return true;
        }
        // A task's document is read when a run starts and written when it ends: a live
        // task's stays on disk until then (an Automerge document costs some 10 KiB of memory
        // even when empty; ten thousand pending tasks would hold 200 MB).
        let task = TaskId::new(doc.as_str());
        self.runs.runs_task(&task)
            || self.lookup.waits_on(&task)
            || self.runs.writes_to(doc)
            || self.submits.holds(doc)
            || self.prefetch.values().any(|p| p.contains(&task))
    }

    /// Drops documents that are saved, unused and idle for [`IDLE_EVICT`] from memory.
    pub(super) fn evict(&mut self, now: Time) {
        self.retire_epochs(now);
        let due = self.docs.evictions_due(now.mono);
        for doc in due {
            if !self.replica.is_loaded(&doc) {
                self.docs.not_evicting(&doc);
                self.saves.forget(&doc);
                continue;
            }
            if self.is_live(&doc) {
                self.docs.not_evicting(&doc);
                continue;
            }
            if self.saves.is_clean(&doc) && self.replica.evict(&doc) {
                self.docs.not_evicting(&doc);
                self.saves.forget(&doc);
            } else {
                // Not saved yet: look again after another idle period.
                self.docs.evict_later(doc, now.mono);
            }
        }
        self.delete_retired();
    }

    /// Retires a document: recorded in order, deleted from disk once beyond its kind's bound.
    pub(super) fn retire(&mut self, doc: DocId, kind: Retired) {
        if self.retention.retire(doc.clone(), kind) {
            self.io.push_back(Io::Retire { doc, kind });
        }
    }

    /// Deletes the retired documents beyond their bounds, oldest first, each once it can
    /// leave memory (saved, unused) and has no load in flight; one that cannot yet holds back
    /// the ones behind it until a later call.
    pub(super) fn delete_retired(&mut self) {
        // The predecessors of the documents each queue holds (its current one, its sealed
        // ones): a losing branch's carry reads its predecessor (`Core::loser_bases`).
        let mut pinned: Option<BTreeSet<DocId>> = None;
        let mut postponed: BTreeSet<DocId> = BTreeSet::new();
        loop {
            let mut deleted = false;
            for doc in self.retention.over() {
                let pinned = pinned.get_or_insert_with(|| {
                    self.queues
                        .values()
                        .flat_map(|q| std::iter::once(&q.doc).chain(q.sealed.keys()))
                        .filter_map(|d| self.replica.get(d))
                        .filter_map(epoch::read_prev)
                        .filter_map(|p| DocId::parse(&p.doc))
                        .collect()
                });
                if pinned.contains(&doc) {
                    // Behind the others; once every one left is pinned, none goes.
                    if postponed.insert(doc.clone()) {
                        self.retention.postpone(&doc);
                        deleted = true;
                    }
                    continue;
                }
                let in_memory = self.replica.is_loaded(&doc);
                if self.docs.is_loading(&doc)
                    || !self.saves.is_clean(&doc)
                    || (in_memory && (self.is_live(&doc) || !self.replica.evict(&doc)))
                {
                    continue;
                }
                self.retention.deleted(&doc);
                self.saves.forget(&doc);
                self.docs.not_evicting(&doc);
                self.io.push_back(Io::Delete { doc });
                deleted = true;
            }
            if !deleted {
                return;
            }
        }
    }
}

/// Why a join ended without its queue's document: a join by invite that no member answered
/// with it in time, or a join by id of a queue neither on disk nor given by a connected member
/// (a node that never joined needs an invite).
fn join_failed(id: QueueId, invited: bool) -> QueueError {
    if !invited {
        return QueueError::InviteNeeded(id);
    }
    QueueError::BadInvite(
        "the member at the invite's addresses did not admit this node in time: it may be \
         unreachable, or the invite expired, was made by a member no longer an admin, or was \
         for another peer"
            .into(),
    )
}
