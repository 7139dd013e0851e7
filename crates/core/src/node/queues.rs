//! Queues this node serves: creating, joining and registering one (its router, view and topic),
//! writing its membership, refreshing its view after changes (archiving what left it, reading
//! ahead, summarizing), carrying out its router's actions, validating gossip, and dialing members.
//! May ask `follow` and `carry` (the epoch work of a refresh), `runs` (the pool's view), `status`
//! (archiving) and `documents` (waiting for a document).

use super::*;
use crate::{MAX_ADDRS_PER_MEMBER, MAX_DIALS_PER_ROUND};

impl Core {
    pub(super) fn gossip(
        &mut self,
        now: Time,
        topic: &str,
        source: &PeerId,
        via: &PeerId,
        data: &[u8],
    ) -> GossipVerdict {
        let Some(id) = self.topics.get(topic).cloned() else {
            return GossipVerdict::Ignore;
        };
        let reject = |reason: String| Event::Rejected {
            peer: source.clone(),
            reason,
        };
        let Some(q) = self.queues.get_mut(&id) else {
            return GossipVerdict::Ignore;
        };
        // Only the members' heartbeats count, and only members pass them on: a peer that is
        // not one (it knows the queue's id) neither speaks for the queue nor replays what a
        // member said.
        for p in [source, via] {
            if !q.view.is_member(p) {
                self.events.push_back(reject(format!(
                    "gossip on {id} from or through a non-member {p}"
                )));
                return GossipVerdict::Reject;
            }
        }
        let Some(msg) = Wire::decode(data) else {
            self.events
                .push_back(reject("malformed or oversized gossip".into()));
            return GossipVerdict::Reject;
        };
        match msg {
            Wire::Router(beat) if beat.claim.term > piecework_queue_doc::MAX_TERM => {
                self.events.push_back(reject(format!(
                    "router heartbeat with term {} above the maximum {}",
                    beat.claim.term,
                    piecework_queue_doc::MAX_TERM
                )));
                GossipVerdict::Reject
            }
            Wire::Router(beat) if beat.claim.peer == *source && beat.queue == id => {
                if let Some(l) = &beat.epoch
                    && announce(q, l)
                {
                    self.stale.insert(id.clone());
                }
                // A sign of life for the router, nothing more: only the document deposes
                // a router or raises a fence.
                q.router.handle_router_beat(now.mono, &beat);
                GossipVerdict::Accept
            }
            Wire::Pool(beat) if beat.peer == *source => {
                if let Some(l) = &beat.epoch
                    && announce(q, l)
                {
                    self.stale.insert(id.clone());
                }
                q.router.handle_pool_beat(now.mono, &beat);
                self.saw_progress(now, &id, &beat);
                GossipVerdict::Accept
            }
            _ => {
                self.events.push_back(reject(format!(
                    "gossip on {id} claiming another sender or queue"
                )));
                GossipVerdict::Reject
            }
        }
    }

    /// A pool heartbeat of `queue` (this node's, or a member's): the progress of its running
    /// tasks, an event for each that changed. Only a report of the task's running attempt, by
    /// the pool it was assigned to, counts.
    pub(super) fn saw_progress(
        &mut self,
        now: Time,
        queue: &QueueId,
        beat: &piecework_queue_doc::PoolBeat,
    ) {
        for r in beat.workers.iter().filter_map(|w| w.running.as_ref()) {
            let Some(p) = r.progress else { continue };
            if r.queue != *queue {
                continue;
            }
            let seen = (r.attempt.clone(), p);
            if self.progress.get(&r.task) == Some(&seen) {
                continue;
            }
            let running = self
                .queues
                .get(queue)
                .and_then(|q| q.view.task(&r.task))
                .filter(|t| t.state() == TaskState::Running)
                .and_then(|t| t.attempt(&r.attempt))
                .is_some_and(|a| a.is_open() && a.started.is_some() && a.worker.peer == beat.peer);
            if !running {
                continue;
            }
            self.progress.insert(r.task.clone(), seen);
            self.events.push_back(Event::Queue(life_events::progress(
                queue,
                &r.task,
                p,
                now.unix_ms,
            )));
        }
    }

    pub(super) fn create_queue(
        &mut self,
        now: Time,
        name: &str,
        config: &QueueConfig,
    ) -> Result<QueueId, QueueError> {
        let mut doc = self.new_doc();
        let id = DocId::generate(&mut self.rng);
        let qid = QueueId::new(id.as_str());
        queue::create(&mut doc, name, config, &self.config.peer, now.unix_ms)?;
        // Its membership is signed from the start: its creator is its first admin.
        queue::set_signed_membership(&mut doc, &qid, &self.signer.public())?;
        queue::set_member(
            &mut doc,
            &self.config.peer,
            self.members.advertised(),
            now.unix_ms,
        )?;
        self.replica
            .set_group(&id, BTreeSet::from([self.config.peer.clone()]));
        self.replica.create(id.clone(), doc, Some(queue_scope(&id)));
        self.saves.changed(&id);
        self.register(now, qid.clone(), name);
        Ok(qid)
    }

    /// Completes a join or reopen: the queue document is loaded.
    pub(super) fn finish_join(
        &mut self,
        now: Time,
        id: &QueueId,
        inviter: Option<&PeerId>,
    ) -> Result<Arc<QueueView>, QueueError> {
        let doc = queue_doc(id).ok_or_else(|| QueueError::BadId(id.to_string()))?;
        let view = self
            .replica
            .get(&doc)
            .and_then(QueueView::read)
            .ok_or_else(|| QueueError::NotAQueue(id.clone()))?;
        let group = self.group_of(&view, inviter);
        self.replica.set_group(&doc, group);
        self.replica.set_scope(&doc, queue_scope(&doc));
        self.register(now, id.clone(), &view.name);
        if let Some(q) = self.queues.get_mut(id) {
            q.introducer = inviter.cloned();
        }
        self.write_member(now, id);
        Ok(self
            .queues
            .get(id)
            .map_or_else(|| Arc::new(view), |q| q.view.clone()))
    }

    /// Writes this node's membership and addresses into a queue, if they differ.
    pub(super) fn write_member(&mut self, now: Time, id: &QueueId) {
        self.adopt_legacy(now, id);
        let Some(q) = self.queues.get(id) else { return };
        let me = self.config.peer.clone();
        if q.view
            .members
            .get(&me)
            .is_some_and(|m| m.addrs == self.members.advertised())
        {
            return;
        }
        let addrs = self.members.advertised().to_vec();
        self.write_queue(now, id, "this node's membership", |d| {
            queue::set_member(d, &me, &addrs, now.unix_ms)
        });
    }

    /// Starts serving a queue: a router, a view, its gossip topic.
    pub(super) fn register(&mut self, now: Time, id: QueueId, name: &str) {
        if self.queues.contains_key(&id) {
            return;
        }
        let Some(doc) = queue_doc(&id) else { return };
        self.io.push_back(Io::RememberQueue {
            id: id.clone(),
            name: name.to_owned(),
        });
        let topic = topic_for(&id);
        self.io.push_back(Io::Subscribe {
            topic: topic.clone(),
        });
        self.topics.insert(topic.clone(), id.clone());
        self.epochs.hold(doc.clone(), id.clone());
        let root = doc.clone();
        self.queues.insert(
            id.clone(),
            Queue {
                doc: doc.clone(),
                view_doc: doc.clone(),
                root: doc,
                epoch: 0,
                sealed: BTreeMap::new(),
                fetching: BTreeSet::new(),
                unavailable: BTreeSet::new(),
                announced: BTreeSet::new(),
                asked_behind: None,
                rejected: BTreeSet::new(),
                verified: BTreeSet::new(),
                router: Router::new(id.clone(), self.config.peer.clone(), now.mono),
                cache: ViewCache::new(),
                view: Arc::new(QueueView::default()),
                topic,
                priming: None,
                primed: None,
                frozen: false,
                deferred: Vec::new(),
                resuming: None,
                introducer: None,
            },
        );
        // Reopened after a restart: back to the epoch this node was on, read from its disk,
        // rather than through every sealed epoch since the queue's first document.
        if let Some(at) = self
            .resume
            .remove(&id)
            .filter(|d| d.as_str() != id.as_str())
        {
            self.replica.set_scope(&at, epoch_scope(&root));
            if let Some(q) = self.queues.get_mut(&id) {
                q.resuming = Some(at.clone());
            }
            self.wait_for(now, &at, DocWaiter::Resume { queue: id.clone() });
        }
        self.refresh(now, &id);
        if let Some(q) = self.queues.get_mut(&id) {
            // A member reached before the queue was opened: the silence counts from now.
            if self.members.connected_peers().any(|p| q.view.is_member(p)) {
                q.router.handle_member_connected(now.mono);
            }
            let beat = Duration::from_millis(q.view.config.pool_heartbeat_ms);
            if beat < self.pool.config().heartbeat {
                self.pool.set_heartbeat(beat);
            }
        }
        self.members.dial_now(now.mono);
    }

    /// Re-reads a queue's view and hands it to the router and the pool.
    pub(super) fn refresh(&mut self, now: Time, id: &QueueId) {
        if self.queues.get(id).is_some_and(|q| q.frozen) {
            return;
        }
        let switched = self.follow_epochs(now, id);
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let Some(d) = self.replica.get(&q.doc) else {
            return;
        };
        let Some(mut view) = q.cache.refresh(d).cloned() else {
            tracing::warn!(queue = %id, "the queue document does not read as a queue");
            return;
        };
        if let Some(healed) = self.write_later_ends(id, &view) {
            view = healed;
        }
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        if Arc::ptr_eq(&view, &q.view) {
            return;
        }
        let old = std::mem::replace(&mut q.view, view.clone());
        let left = std::mem::replace(&mut q.view_doc, q.doc.clone());
        let qdoc = q.root.clone();
        q.router.handle_clock(now.mono, now.unix_ms);
        // A submitter (or a removed member) neither routes nor runs: its router stands down
        // for good (a role given later counts from the next start). A view that does not list
        // this node yet (it joined in a later epoch) changes nothing.
        let stands_down = !standing(&view, &self.config.peer);
        if stands_down {
            q.router.stop(now.mono);
        }
        q.router.handle_view(now.mono, view.clone());
        if let Some(r) = &view.router {
            see(&mut self.seen, id, r);
        }
        // Scope the task documents: live ones are announced to members, final ones travel on
        // request only and may leave memory. Only the tasks this refresh changed are looked at
        // (all of them after a whole read).
        let changed_ids = q.cache.take_changed();
        let changed: Vec<&Arc<TaskEntry>> = match &changed_ids {
            Changed::Everything => view.tasks().values().collect(),
            Changed::Tasks(ids) => ids.iter().filter_map(|id| view.tasks().get(id)).collect(),
        };
        // The life of the changed tasks, as events (not for the first read of the queue,
        // which learns its history at once).
        let first = matches!(changed_ids, Changed::Everything) && old.tasks().is_empty();
        if !first {
            let mut evs = Vec::new();
            life_events::queue_events(id, &old, &view, now.unix_ms, &mut evs);
            for t in &changed {
                life_events::task_events(id, &view, old.task(&t.id), t, now.unix_ms, &mut evs);
                if t.state() != TaskState::Running {
                    self.progress.remove(&t.id);
                }
            }
            if matches!(changed_ids, Changed::Everything) {
                // A move to another document: what it does not show running is forgotten.
                self.progress.retain(|task, _| {
                    view.task(task)
                        .is_none_or(|t| t.state() == TaskState::Running)
                });
            }
            self.events.extend(evs.into_iter().map(Event::Queue));
        }
        let mut summarize = Vec::new();
        let mut retired = Vec::new();
        for t in changed {
            let tid = &t.id;
            let state = t.state();
            if state == TaskState::InputUnavailable
                && old.task(tid).map(|o| o.state()) != Some(TaskState::InputUnavailable)
            {
                self.runs.revive_later(id.clone(), tid.clone(), t.last_n());
            }
            let final_now = state.is_final();
            let was = old.task(tid);
            let before = was.map(|o| o.state().is_final());
            // A final task whose entry changed (a requeue and its new end arrived together,
            // failed to succeeded, say) has a new end to keep, archive and list.
            if before == Some(final_now) && (!final_now || was.is_some_and(|o| o == t.as_ref())) {
                continue;
            }
            // Inline: no task document; its runs' outputs are in the queue document. Any
            // task's successful run may have recorded undo tasks there.
            let outputs = match (final_now, self.replica.get(&q.doc)) {
                (true, Some(d)) => read_outputs(d, tid),
                _ => Vec::new(),
            };
            if final_now && t.input.is_some() {
                // Its final status is archived (again after a restart: archiving is
                // idempotent), to answer once no epoch carries it.
                let status = status_with_outputs(id, t, &outputs);
                if let Ok(json) = serde_json::to_vec(&status) {
                    self.archive.record(tid.clone(), json);
                }
            }
            if final_now {
                self.archive.list(listed(id, t, &outputs));
                let end = TaskEnd::new(Arc::clone(t), outputs);
                lifecycle::keep_end(&mut self.archive, &mut self.ends, id, end);
            }
            if t.input.is_some() {
                continue;
            }
            let Some(td) = task_doc(tid) else { continue };
            self.replica.set_scope(
                &td,
                Scope {
                    group: qdoc.clone(),
                    announce: !final_now,
                    requestable: false,
                },
            );
            if final_now && before == Some(false) {
                summarize.push(td.clone());
            }
            if final_now {
                retired.push(td.clone());
            }
            // Live or final, a task's document leaves memory once saved and idle.
            self.docs.may_evict(td, now.mono);
        }
        for td in summarize {
            self.summarize(&view, &td);
        }
        for td in retired {
            self.retire(td, Retired::Task);
        }
        // A member that joined or moved: dial it now rather than at the next round, so that a
        // full mesh forms before the peer everyone bootstrapped from can go away.
        if view.membership != old.membership {
            self.standings(&old, &view);
        }
        if view.members != old.members || view.membership != old.membership {
            let introducer = self.queues.get(id).and_then(|q| q.introducer.clone());
            let group = self.group_of(&view, introducer.as_ref());
            self.replica.set_group(&qdoc, group);
            self.members.dial_now(now.mono);
        }
        if self.queues.get(id).is_some_and(|q| q.doc != left) {
            self.archive_left_behind(id, &old, &view, &left);
        }
        if !stands_down {
            self.pool.handle_view(id, &view, now.mono);
        }
        self.prefetch(now, id, &view);
        self.events.push_back(Event::View {
            queue: id.clone(),
            view,
        });
        if switched {
            // Membership is not carried across epochs: a node (re)writes its own.
            self.write_member(now, id);
        }
    }

    /// A task back in the document live (a member requeued it from its record of the task's
    /// end) that this node saw end later than that record: a later attempt's end, an end that
    /// outranks the document's, or a cancel, the document lacks. Its end as this node kept it is written back ([`epoch::write_ends`]:
    /// only the records newer than the document's) before any view of this node shows it
    /// live again, so that a success it saw never goes back; the view read after. `None` if
    /// there was nothing to write.
    fn write_later_ends(&mut self, id: &QueueId, view: &Arc<QueueView>) -> Option<Arc<QueueView>> {
        let q = self.queues.get(id)?;
        let changed: Vec<&TaskId> = match q.cache.changed() {
            Changed::Everything => return None,
            Changed::Tasks(ids) => ids.iter().collect(),
        };
        let later: Vec<TaskEnd> = changed
            .into_iter()
            .filter(|t| q.view.task(t).is_none())
            .filter_map(|t| {
                let shown = view.task(t).filter(|e| !e.state().is_final())?;
                let end = self.ends.get(t).filter(|e| e.entry().state().is_final())?;
                // An end the document lacks, or holds otherwise (a restarted pool's
                // `interrupted` where this node saw the run succeed): `write_ends` writes it
                // where it is the later one.
                let lacks = end.entry().attempts.iter().any(|a| {
                    a.finished.is_some()
                        && shown
                            .attempts
                            .iter()
                            .find(|b| b.id == a.id)
                            .is_none_or(|b| b.finished != a.finished)
                });
                (lacks || (end.entry().cancel.is_some() && shown.cancel.is_none()))
                    .then(|| end.clone())
            })
            .collect();
        if later.is_empty() {
            return None;
        }
        let doc = q.doc.clone();
        let refs: Vec<&TaskEnd> = later.iter().collect();
        match self.change(&doc, |d| epoch::write_ends(d, &refs)) {
            Some(Ok(n)) if n > 0 => {}
            Some(Err(e)) => {
                tracing::warn!(queue = %id, "cannot write back the later ends of requeued tasks: {e}");
                return None;
            }
            _ => return None,
        }
        let q = self.queues.get_mut(id)?;
        let d = self.replica.get(&q.doc)?;
        q.cache.refresh(d).cloned()
    }

    /// After a move to a successor: the tasks the old view showed live that the successor
    /// does not hold ended before the successor's copy, in writes this node's view had not
    /// shown yet (a sealer's frozen view, or a follower's view one turn behind). No view of
    /// this node will show them final, so their final status is read from the document left
    /// (or, after a move over several epochs, the sealed one that has it) and archived here:
    /// a status lookup at this node answers for them too.
    pub(super) fn archive_left_behind(
        &mut self,
        id: &QueueId,
        old: &QueueView,
        new: &QueueView,
        left: &DocId,
    ) {
        let gone: BTreeSet<&TaskId> = old
            .routable()
            .chain(old.retrying())
            .chain(old.input_unavailable())
            .chain(old.with_open_attempts())
            .filter(|t| t.input.is_some() && !t.state().is_final() && new.task(&t.id).is_none())
            .map(|t| &t.id)
            .collect();
        if gone.is_empty() {
            return;
        }
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let docs: Vec<&DocId> = std::iter::once(left)
            .chain(q.sealed.keys().filter(|d| *d != left))
            .collect();
        for tid in gone {
            let found = docs.iter().find_map(|d| {
                let doc = self.replica.get(d)?;
                let entry = epoch::task_entry(doc, tid).filter(|t| t.state().is_final())?;
                Some((entry, read_outputs(doc, tid)))
            });
            let found = found.map(|(entry, outputs)| {
                self.archive.list(listed(id, &entry, &outputs));
                let status = status_with_outputs(id, &entry, &outputs);
                let end = TaskEnd::new(Arc::new(entry), outputs);
                lifecycle::keep_end(&mut self.archive, &mut self.ends, id, end);
                status
            });
            match found.map(|status| serde_json::to_vec(&status)) {
                Some(Ok(json)) => self.archive.record(tid.clone(), json),
                Some(Err(e)) => tracing::warn!(task = %tid, "cannot encode a final status: {e}"),
                None => tracing::debug!(task = %tid, "left an epoch live, final nowhere here"),
            }
        }
    }

    /// Reads ahead the documents of the queue's first pending tasks in routing order, so that
    /// a start does not wait for the disk; the ones that left the window may leave memory.
    pub(super) fn prefetch(&mut self, now: Time, id: &QueueId, view: &QueueView) {
        let want = PREFETCH_PER_WORKER * self.config.workers as usize;
        // The first pending tasks, of which only those with a task document (not inline) have
        // one to read: filtering first would scan every pending inline task.
        let window: BTreeSet<TaskId> = view
            .routable()
            .take(want)
            .filter(|t| t.input.is_none())
            .map(|t| t.id.clone())
            .collect();
        let old = self.prefetch.remove(id).unwrap_or_default();
        // Only the tasks that entered or left the window: a task id is parsed (and its
        // checksum verified) into a document id once per move, not once per refresh.
        for t in window.difference(&old) {
            if let Some(doc) = task_doc(t)
                && !self.replica.is_loaded(&doc)
            {
                self.replica.fetch(&doc, now.mono);
            }
        }
        for t in old.difference(&window) {
            if let Some(doc) = task_doc(t) {
                self.docs.may_evict(doc, now.mono);
            }
        }
        self.prefetch.insert(id.clone(), window);
    }

    /// Writes a task's final summary into its document, if this node ran the attempt that
    /// decided it and holds the document: the task's status stays known after the queue
    /// document stops carrying it.
    pub(super) fn summarize(&mut self, view: &QueueView, td: &DocId) {
        let Some(t) = view.task(&TaskId::new(td.as_str())) else {
            return;
        };
        let decisive = t
            .attempts
            .iter()
            .filter(|a| {
                a.finished.as_ref().is_some_and(|f| {
                    f.outcome.is_failure() || f.outcome == AttemptOutcome::Succeeded
                })
            })
            .max_by_key(|a| a.finished.as_ref().map(|f| (f.outcome, f.at)));
        // A task cancelled without a decisive run (a dependency failed) is summarized by its
        // submitter, which holds its document.
        let writer = match decisive {
            Some(a) => &a.worker.peer,
            None if t.state() == TaskState::Cancelled => &t.submitter,
            None => return,
        };
        if *writer != self.config.peer {
            return;
        }
        let summary = task::Summary {
            state: t.state(),
            attempts: t.attempts.clone(),
            error: last_error(t),
            priority: Some(t.priority_now()),
            urgent: Some(t.urgent_now()),
            max_attempts: Some(t.max_attempts),
            rules: t.rules.clone(),
            cancel_reason: t.cancel_reason(),
        };
        self.runs.record_summary(td.clone(), summary);
    }

    /// Carries out the routers' and the pool's actions; true if there were any.
    pub(super) fn drain_actions(&mut self, now: Time) -> bool {
        let mut acted = false;
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in &ids {
            let frozen = self.queues.get(id).is_some_and(|q| q.frozen);
            if !frozen {
                let held = self
                    .queues
                    .get_mut(id)
                    .map(|q| std::mem::take(&mut q.deferred))
                    .unwrap_or_default();
                for (at_ms, action) in held {
                    acted = true;
                    self.router_action(now, id, action, at_ms);
                }
            }
            while let Some(action) = self.queues.get_mut(id).and_then(|q| q.router.poll_action()) {
                match action {
                    RouterAction::Beat(_) => self.router_action(now, id, action, now.unix_ms),
                    _ if frozen => {
                        if let Some(q) = self.queues.get_mut(id) {
                            q.deferred.push((now.unix_ms, action));
                        }
                    }
                    _ => self.router_action(now, id, action, now.unix_ms),
                }
                acted = true;
            }
            if let Some(q) = self.queues.get_mut(id) {
                while let Some(event) = q.router.poll_event() {
                    if let piecework_router::Event::SteppedDown { claim, by } = &event {
                        self.events
                            .push_back(Event::Queue(life_events::stepped_down(
                                id,
                                claim,
                                by,
                                now.unix_ms,
                            )));
                    }
                    self.events.push_back(Event::Router {
                        queue: id.clone(),
                        event,
                    });
                }
            }
        }
        while let Some(action) = self.pool.poll_action() {
            acted = true;
            self.pool_action(now, action);
        }
        acted
    }

    /// Writes to a queue document and refreshes its view at once (routers must see their own
    /// writes before deciding again).
    /// The queue document's view at its current heads, from its cache (refreshed if the
    /// document changed since: costs in what changed; the changes it finds are handled by the
    /// queue's next refresh). `None` if the document is not here or reads as no queue.
    pub(super) fn current_view(&mut self, id: &QueueId) -> Option<Arc<QueueView>> {
        let q = self.queues.get_mut(id)?;
        if q.frozen {
            return Some(q.view.clone());
        }
        let d = self.replica.get(&q.doc)?;
        q.cache.refresh(d).cloned()
    }

    pub(super) fn write_queue<E: std::fmt::Display>(
        &mut self,
        now: Time,
        id: &QueueId,
        what: &str,
        f: impl FnOnce(&mut Automerge) -> Result<(), E>,
    ) {
        let Some(doc) = self.queues.get(id).map(|q| q.doc.clone()) else {
            return;
        };
        match self.change(&doc, f) {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::warn!(queue = %id, "cannot record {what}: {e}"),
            None => tracing::warn!(queue = %id, "cannot record {what}: queue document not loaded"),
        }
        self.stale.remove(id);
        self.refresh(now, id);
    }

    /// Carries out a router's action, decided at `at_ms` (unix ms: earlier than `now` for an
    /// action held while the queue was frozen). Assignments are recorded as made then, when
    /// the router counted them against its rate interval.
    pub(super) fn router_action(
        &mut self,
        now: Time,
        id: &QueueId,
        action: RouterAction,
        at_ms: u64,
    ) {
        match action {
            RouterAction::Claim(claim) => {
                // Superseding a claim the view counts, so that this one counts too.
                let view = self.current_view(id);
                self.write_queue(now, id, "a router claim", |d| match &view {
                    Some(v) => queue::claim_router_in_view(d, v, &claim, now.unix_ms),
                    None => queue::claim_router(d, &claim, now.unix_ms),
                });
            }
            RouterAction::Assign(list) => {
                // Checked against the cached view, as a turn's starts and ends are.
                let view = self.current_view(id);
                self.write_queue(now, id, "assignments", |d| match &view {
                    Some(v) => queue::record_assignments_in_view(d, v, &list, at_ms),
                    None => queue::record_assignments(d, &list, at_ms),
                });
            }
            RouterAction::Fire(firings) => self.fire(now, id, firings),
            RouterAction::Beat(mut beat) => {
                if let Some(q) = self.queues.get(id) {
                    if q.epoch > 0 {
                        beat.epoch = Some(Latest {
                            epoch: q.epoch,
                            doc: q.doc.to_string(),
                        });
                    }
                    self.io.push_back(Io::Publish {
                        topic: q.topic.clone(),
                        data: Wire::Router(beat).encode(),
                    });
                }
            }
        }
    }

    /// Dials every member of every queue this node has no sync stream with.
    pub(super) fn dial_members(&mut self) {
        let mut wanted: BTreeMap<PeerId, Vec<String>> = BTreeMap::new();
        for q in self.queues.values() {
            for (peer, member) in &q.view.members {
                if *peer == self.config.peer
                    || self.members.is_connected(peer)
                    || !q.view.is_member(peer)
                {
                    continue;
                }
                wanted
                    .entry(peer.clone())
                    .or_default()
                    .extend(member.addrs.iter().cloned());
            }
        }
        let wanted: Vec<(PeerId, Vec<String>)> = wanted
            .into_iter()
            .filter(|(_, addrs)| !addrs.is_empty())
            .collect();
        for (peer, mut addrs) in self.members.dial_round(wanted, MAX_DIALS_PER_ROUND) {
            addrs.sort();
            addrs.dedup();
            addrs.truncate(MAX_ADDRS_PER_MEMBER);
            self.io.push_back(Io::Dial { peer, addrs });
        }
    }
}

/// A task that became final, as listings of its queue show it ([`crate::Listed`]).
fn listed(
    id: &QueueId,
    t: &TaskEntry,
    outputs: &[(piecework_queue_doc::AttemptId, Output)],
) -> crate::Listed {
    let mut v = serde_json::to_value(status_with_outputs(id, t, outputs)).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("runs");
    }
    crate::Listed {
        queue: id.clone(),
        task: t.id.clone(),
        state: t.state(),
        entry: v.to_string().into_bytes(),
    }
}

/// Whether `peer` may route and run in the queue `view` shows: not listed there at all (a view
/// behind its add), or listed as a member or admin and not removed.
pub(super) fn standing(view: &QueueView, peer: &PeerId) -> bool {
    view.membership
        .records()
        .get(peer)
        .is_none_or(|r| r.active() && r.role.works())
}
