//! Rotating a queue document into a successor as its router (the build and catch-ups off the node's
//! thread, the frozen last catch-up, the seal), and retiring sealed epochs this node is done with.
//! May ask `switch` to move to the successor.

use super::*;

impl Core {
    /// As the queue's active router, asks for a successor of the current epoch holding what is
    /// live, once its finished tasks outweigh the live ones ([`epoch::should_rotate`]). The
    /// successor is built off this thread ([`Io::Rotate`]); [`Core::handle_rotated`] seals.
    pub(super) fn maybe_rotate(&mut self, now: Time, id: &QueueId) {
        if self.epochs.is_rotating(id) {
            return;
        }
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let Role::Active { claim, .. } = q.router.role() else {
            return;
        };
        // The successor is built from the view and sealed at the heads of the document it
        // was read with: a view behind the document (a carry or a peer's change since its
        // refresh) would leave out tasks the seal covers, and those are never carried
        // afterwards.
        if self.stale.contains(id) {
            return;
        }
        let view = q.view.clone();
        let sealed = !view.seals.is_empty()
            && self
                .replica
                .get(&q.doc)
                .is_none_or(|d| stops_rotation(&q.rejected, d));
        if view.router.as_ref() != Some(claim)
            || !view.routable_version()
            || sealed
            || !epoch::should_rotate(
                &view.counts(),
                self.config.rotate_ratio,
                self.config.rotate_min_live,
            )
        {
            return;
        }
        let claim = claim.clone();
        let (old, epoch_no) = (q.doc.clone(), q.epoch + 1);
        let Some(old_doc) = self.replica.get(&old) else {
            return;
        };
        if stops_rotation(&q.rejected, old_doc) {
            return;
        }
        // A copy costs a small fraction of the build.
        let copy = Box::new(old_doc.clone());
        let heads = copy.get_heads();
        let successor = DocId::generate(&mut self.rng);
        let rid = self.epochs.next_rotate_id();
        self.epochs.rotation(
            rid,
            Rotating {
                queue: id.clone(),
                prev: old.clone(),
                successor: successor.clone(),
                epoch: epoch_no,
                claim: claim.clone(),
                heads,
                catch_ups: 0,
                last: None,
            },
        );
        self.io.push_back(Io::Rotate(Box::new(Rotate {
            id: rid,
            old: copy,
            work: RotateWork::Build {
                view,
                succ: Box::new(self.new_doc()),
                origin: id.clone(),
                prev: old,
                successor,
                epoch: epoch_no,
                claim,
                now_ms: now.unix_ms,
            },
        })));
    }

    /// The answer to [`Io::Rotate`]: brings the successor up to date off this thread again
    /// if the document moved on meanwhile (`Config::catch_ups` times, then once more with the
    /// queue frozen: see [`Queue::frozen`]), then seals the
    /// current epoch into it, unless the rotation no longer holds (this node is no longer the
    /// active router with the same claim, it moved to another epoch, or someone sealed the
    /// document meanwhile); then the successor is dropped unseen. What the router wrote after
    /// the last copy (and peers' writes) is carried into it like any late write (the seal
    /// names the first copy's heads).
    pub fn handle_rotated(&mut self, now: Time, built: Built) {
        match built.outcome {
            Outcome::Read { queue, doc, cache } => {
                if let Some(q) = self.queues.get_mut(&queue)
                    && q.priming.as_ref() == Some(&doc)
                {
                    q.priming = None;
                    q.primed = Some((doc, *cache));
                    self.stale.insert(queue);
                }
            }
            Outcome::Successor(result) => {
                if let Some(r) = self.epochs.take_rotation(&built.id) {
                    self.rotated(now, r, built.id, result);
                }
            }
        }
        self.turn(now);
    }

    pub(super) fn rotated(
        &mut self,
        now: Time,
        mut r: Rotating,
        rid: RotateId,
        result: Result<Box<Successor>, String>,
    ) {
        let id = r.queue.clone();
        if r.last.is_some()
            && let Some(q) = self.queues.get_mut(&id)
        {
            // Whatever happens next, in this call: sealed or dropped.
            q.frozen = false;
            self.stale.insert(id.clone());
        }
        let Some(q) = self.queues.get(&id) else {
            return;
        };
        let holds = matches!(q.router.role(), Role::Active { claim, .. } if *claim == r.claim)
            && q.doc == r.prev
            && self
                .replica
                .get(&r.prev)
                .is_some_and(|d| !stops_rotation(&q.rejected, d));
        if !holds {
            tracing::debug!(queue = %id, "a rotation no longer holds; its successor is dropped");
            return;
        }
        let succ = match result {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(queue = %id, "cannot rotate the queue document: {e}");
                return;
            }
        };
        let old = self.replica.get(&r.prev).map(|d| (d.get_heads(), d));
        if let Some((heads, doc)) = old
            && heads != succ.carried
            && r.last.is_none()
        {
            let copy = Box::new(doc.clone());
            r.catch_ups += 1;
            if r.catch_ups > self.config.catch_ups {
                // The last: writes go on as fast as a catch-up carries them, so the document
                // stands still for this one (see `Queue::frozen`).
                r.last = Some(now.mono + FROZEN_AT_MOST);
                if let Some(q) = self.queues.get_mut(&id) {
                    q.frozen = true;
                }
            }
            self.epochs.rotation(rid, r);
            self.io.push_back(Io::Rotate(Box::new(Rotate {
                id: rid,
                old: copy,
                work: RotateWork::CatchUp(succ),
            })));
            return;
        }
        self.seal_rotation(now, r, succ);
    }

    pub(super) fn seal_rotation(&mut self, now: Time, r: Rotating, built: Box<Successor>) {
        let id = &r.queue;
        let Some(q) = self.queues.get(id) else {
            return;
        };
        let root = q.root.clone();
        let Successor {
            doc: succ,
            rotated,
            cache,
            carried,
            ..
        } = *built;
        let succ_id = r.successor.clone();
        self.replica
            .create(succ_id.clone(), succ, Some(epoch_scope(&root)));
        self.epochs.hold(succ_id.clone(), id.clone());
        self.saves.changed(&succ_id);
        let seal = Seal {
            claim: r.claim.clone(),
            successor: succ_id.to_string(),
            epoch: r.epoch,
        };
        let heads = r.heads.clone();
        if let Some(Err(e)) = self.change(&r.prev, |d| epoch::seal(d, &seal, &heads)) {
            tracing::warn!(queue = %id, "cannot seal the queue document: {e}");
        }
        let latest = Latest {
            epoch: r.epoch,
            doc: succ_id.to_string(),
        };
        if let Some(Err(e)) = self.change(&root, |d| epoch::set_latest(d, &latest)) {
            tracing::warn!(queue = %id, "cannot record the newest epoch: {e}");
        }
        self.events.push_back(Event::Epoch {
            queue: id.clone(),
            event: EpochEvent::Rotated {
                epoch: r.epoch,
                carried: rotated.carried,
                dropped: rotated.dropped,
            },
        });
        self.switch_epoch(now, id, succ_id, r.epoch, Some(cache), false);
        // The successor holds what the last catch-up carried: the rest is carried now.
        if let Some(s) = self
            .queues
            .get_mut(id)
            .and_then(|q| q.sealed.get_mut(&r.prev))
        {
            s.carried = carried;
        }
        // What was written after the copy (here or by peers) goes into the successor before
        // its view is first read: no task seems to step back.
        self.carry_late(now, id);
    }

    /// Drops the rotations whose last catch-up has not come back in time, and thaws their
    /// queues.
    pub(super) fn expire_frozen(&mut self, now: Time) {
        for (id, q) in &mut self.queues {
            if let Some((_, until)) = &mut q.asked_behind
                && until.is_some_and(|u| now.mono >= u)
            {
                *until = None;
                self.stale.insert(id.clone());
            }
        }
        for r in self.epochs.take_late_rotations(now.mono) {
            tracing::warn!(queue = %r.queue, "a rotation's last catch-up did not come back; it is dropped");
            if let Some(q) = self.queues.get_mut(&r.queue) {
                q.frozen = false;
            }
            self.stale.insert(r.queue);
        }
    }

    /// Drops sealed epochs this node moved past more than `Config::epoch_retain` ago (never the
    /// queue's first document) from its chain; they then leave memory like any idle document.
    pub(super) fn retire_epochs(&mut self, now: Time) {
        let mut gone = Vec::new();
        let retain = self.config.epoch_retain;
        for (id, q) in &mut self.queues {
            let root = q.root.clone();
            // Beyond MAX_SEALED_HELD, the oldest clean ones go whatever their age.
            let mut clean: Vec<(Instant, u64, DocId)> = q
                .sealed
                .iter()
                .filter(|(d, s)| **d != root && !s.dirty)
                .map(|(d, s)| (s.since, s.epoch, d.clone()))
                .collect();
            clean.sort();
            let excess = clean.len().saturating_sub(MAX_SEALED_HELD);
            let crowded: BTreeSet<DocId> = clean.into_iter().take(excess).map(|c| c.2).collect();
            q.sealed.retain(|d, s| {
                let keep = *d == root
                    || s.dirty
                    || (now.mono.saturating_duration_since(s.since) < retain
                        && !crowded.contains(d));
                if !keep {
                    gone.push((id.clone(), d.clone(), s.epoch));
                }
                keep
            });
            // Carried out and done with: never followed or carried from again (a peer that
            // still names one would otherwise bring it back, and with it tasks that ended
            // since).
            for (_, d, _) in gone.iter().filter(|(q, _, _)| q == id) {
                if q.rejected.len() >= MAX_REJECTED_EPOCHS {
                    q.rejected.pop_first();
                }
                q.rejected.insert(d.clone());
            }
            // A document still held (the queue's first, or a loser) whose late writes went
            // into a retired one now carries into the current document: the retired one is
            // carried from no more, so what reached it later would stay there.
            let (cur, cur_epoch) = (q.doc.clone(), q.epoch);
            for s in q.sealed.values_mut() {
                if gone.iter().any(|(g, d, _)| g == id && *d == s.into) {
                    s.into = cur.clone();
                    s.into_epoch = cur_epoch;
                    s.forwarded = !s.carried.is_empty();
                    s.dirty = true;
                }
            }
        }
        for (id, doc, epoch_no) in gone {
            self.epochs.retired(&doc);
            self.retire(doc.clone(), Retired::Epoch);
            // No longer announced, but still served from disk to a member that asks: one
            // that comes back behind the seal catches up through it.
            if let Some(root) = self.queues.get(&id).map(|q| q.root.clone()) {
                self.replica.set_scope(
                    &doc,
                    Scope {
                        group: root,
                        announce: false,
                        requestable: false,
                    },
                );
            }
            self.docs.may_evict(doc, now.mono);
            self.events.push_back(Event::Epoch {
                queue: id,
                event: EpochEvent::Evicted { epoch: epoch_no },
            });
        }
    }
}

/// Whether `doc` holds a seal that stops its router from sealing it: one under a claim that
/// counts, naming a successor this node has not found forged. A member's forged seal (under a
/// claim that does not count, or naming a successor that drops live tasks) is never followed
/// and does not keep the queue from rotating; a double seal by the router is followed as any.
fn stops_rotation(rejected: &BTreeSet<DocId>, doc: &Automerge) -> bool {
    epoch::counted_seals(doc)
        .iter()
        .any(|s| DocId::parse(&s.successor).is_none_or(|n| !rejected.contains(&n)))
}
