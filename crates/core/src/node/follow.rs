//! Following the chain of epochs: finding the greatest epoch document this node knows of, fetching
//! what a move needs, moving when it holds it, and resuming a reopened queue at the epoch it was
//! on. May ask `switch` to move and `carry` to carry at a move.

use super::*;

impl Core {
    /// Moves a queue to the newest epoch document this node knows of: the winner of its
    /// current document's seals, the winner of a double seal of its own epoch, the newest
    /// epoch its first document records, or the one a router heartbeat announced. A document
    /// that is not here yet is fetched first. True if it moved.
    pub(super) fn follow_epochs(&mut self, now: Time, id: &QueueId) -> bool {
        let Some(q) = self.queues.get(id) else {
            return false;
        };
        if q.resuming.is_some() {
            return false;
        }
        let cur = q.doc.clone();
        // Every epoch document of the queue this node has heard of and not yet placed.
        let mut names: BTreeSet<DocId> = BTreeSet::new();
        let successors = |d: &Automerge| {
            epoch::read_seals(d)
                .into_iter()
                .filter_map(|s| DocId::parse(&s.successor))
                .collect::<Vec<_>>()
        };
        if let Some(d) = self.replica.get(&cur) {
            names.extend(successors(d));
            if let Some(p) = epoch::read_prev(d)
                .and_then(|p| DocId::parse(&p.doc))
                .and_then(|p| self.replica.get(&p))
            {
                names.extend(successors(p));
            }
        }
        if let Some(l) = self.replica.get(&q.root).and_then(epoch::read_latest) {
            names.extend(DocId::parse(&l.doc));
        }
        names.extend(q.announced.iter().cloned());
        names.retain(|n| *n != cur && !q.rejected.contains(n) && !q.sealed.contains_key(n));
        if names.is_empty() {
            return false;
        }
        // Successors not (yet) to be followed: forged ones are rejected for good.
        let blocked: BTreeSet<DocId> = names
            .iter()
            .filter(|n| matches!(self.epoch_here(id, n), Some(Ok(_))))
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter(|n| !self.may_follow(id, n))
            .collect();
        let lineage = |d: &DocId| {
            self.replica
                .get(d)
                .map(epoch::read_lineage)
                .unwrap_or_default()
        };
        let mut best = (lineage(&cur), cur.clone(), 0);
        let mut here = Vec::new();
        let mut absent = Vec::new();
        let mut rejected = Vec::new();
        for n in names {
            match self.epoch_here(id, &n) {
                Some(Ok(_)) if blocked.contains(&n) => {}
                Some(Ok(e)) => {
                    let l = lineage(&n);
                    if epoch::cmp_lineage(&l, &best.0) == std::cmp::Ordering::Greater {
                        best = (l, n.clone(), e);
                    }
                    here.push(n);
                }
                Some(Err(())) => rejected.push(n),
                None => absent.push(n),
            }
        }
        // One found nowhere is not asked for again until a peer connects: asking at every
        // refresh would load it from storage and ask the same peers in a loop.
        for n in absent {
            if self.to_fetch(id, &n) {
                self.fetch_epoch(now, id, &n);
            }
        }
        if let Some(q) = self.queues.get_mut(id) {
            for n in rejected {
                q.announced.remove(&n);
                if q.rejected.len() < MAX_REJECTED_EPOCHS {
                    q.rejected.insert(n);
                }
            }
        }
        let (best_lineage, to, epoch_no) = best;
        // A successor is taken only once this node holds everything its seal covered of the
        // document it continues (this very document, or, moving sideways, one this node holds
        // too): the writes after the seal are then exactly what to carry, at once.
        let sealed_from = self
            .replica
            .get(&to)
            .and_then(epoch::read_prev)
            .and_then(|p| Some((DocId::parse(&p.doc)?, p.heads)));
        let behind = sealed_from.as_ref().is_some_and(|(pd, heads)| {
            to != cur
                && self
                    .replica
                    .get(pd)
                    .is_some_and(|c| epoch::known_heads(c, heads).len() < heads.len())
        });
        if behind
            && let Some((pd, _)) = &sealed_from
            && let Some(q) = self.queues.get_mut(id)
            && q.asked_behind.as_ref().is_none_or(|(d, _)| *d != to)
        {
            // Ask the members for what the seal covered (they may hold it on disk only).
            q.asked_behind = Some((to.clone(), Some(now.mono + BEHIND_WAIT)));
            self.replica.resync_with_members(pd);
        }
        // No member had it within BEHIND_WAIT (every one deleted that document): move
        // without it. The carry out of that document then goes by the successor's covers
        // (`carry_round`), which say what the chain absorbed without the changes.
        let behind = behind
            && !self
                .queues
                .get(id)
                .and_then(|q| q.asked_behind.as_ref())
                .is_some_and(|(d, until)| *d == to && until.is_none());
        // The documents of the target's chain that this node's chain does not share: a move
        // waits until they are here (or found nowhere), so that carrying this node's own late
        // writes can tell what the chain already ended.
        let own = self
            .replica
            .get(&cur)
            .map(epoch::read_lineage)
            .unwrap_or_default();
        let gaps: Vec<DocId> = if to == cur {
            vec![]
        } else {
            best_lineage
                .iter()
                .filter(|l| !own.contains(l) && l.doc != to.as_str())
                .filter_map(|l| DocId::parse(&l.doc))
                .filter(|d| self.to_fetch(id, d))
                .collect()
        };
        // A move to another branch carries what this node's branch wrote since the fork, from
        // every document of it (retired ones too): they must be here first, or a task this
        // branch ended would show live in the target until they are.
        let mut gaps = gaps;
        if to != cur {
            let root = self.queues.get(id).map(|q| q.root.clone());
            let branch = branch_since_fork(&own, &best_lineage, root.as_ref());
            // Moving sideways, the fork too: the last document both chains share, sealed
            // twice. What this node wrote to it after the other side's seal (a task's end) is
            // carried from it, and kept in the target at the move (`Core::keep_ends`): if this
            // node retired it, the target showed the task live again (default seed 5016 with
            // `--relay-ms 100,300`).
            let fork = (!branch.is_empty())
                .then(|| fork_of(&own, &best_lineage))
                .flatten()
                .filter(|d| Some(d) != root.as_ref());
            gaps.extend(
                branch
                    .into_iter()
                    .map(|(d, _)| d)
                    .chain(fork)
                    .filter(|d| self.to_fetch(id, d)),
            );
        }
        // The document `to` continues, if this node no longer holds it (it retired it): the
        // writes it got after `to`'s seal are carried from it, so it must be here first, or
        // a task this node ended there would show live in `to` until it is (partitions seed
        // 2200, once rotations were built off the node's thread).
        if to != cur
            && let Some(pd) = self
                .replica
                .get(&to)
                .and_then(epoch::read_prev)
                .and_then(|p| DocId::parse(&p.doc))
            && pd != cur
            && !gaps.contains(&pd)
            && self.to_fetch(id, &pd)
        {
            gaps.push(pd);
        }
        for d in &gaps {
            self.fetch_epoch(now, id, d);
        }
        let mut switched = to != cur && !behind && gaps.is_empty();
        // Its view is read off this thread first (a copy costs a small fraction of the read):
        // the turn that moves then reads only what changed since.
        let mut cache = None;
        if switched && let Some(q) = self.queues.get_mut(id) {
            match q.primed.take() {
                Some((d, c)) if d == to => cache = Some(c),
                _ if q.priming.as_ref() == Some(&to) => switched = false,
                _ => {
                    if let Some(copy) = self.replica.get(&to).map(|d| Box::new(d.clone())) {
                        let rid = self.epochs.next_rotate_id();
                        q.priming = Some(to.clone());
                        self.io.push_back(Io::Rotate(Box::new(Rotate {
                            id: rid,
                            old: copy,
                            work: RotateWork::Read {
                                queue: id.clone(),
                                doc: to.clone(),
                            },
                        })));
                        switched = false;
                    }
                }
            }
        }
        if to != cur && !switched {
            // Waiting to move: the candidates stay as they are.
            return false;
        }
        if switched {
            self.switch_epoch(now, id, to.clone(), epoch_no, cache, false);
            // Before the view moves: what the old view showed is in the new document as soon
            // as it is shown.
            self.epochs.carry_without_budget();
            self.carry_late(now, id);
            self.epochs.carry_within_budget();
        }

        // Documents of a losing branch (a double seal's loser and what grew from it): their
        // writes are carried into the current document.
        let ancestors: BTreeSet<String> = best_lineage.iter().map(|l| l.doc.clone()).collect();
        let Some(q) = self.queues.get_mut(id) else {
            return switched;
        };
        for n in here {
            q.announced.remove(&n);
            if n == to || q.sealed.contains_key(&n) {
                continue;
            }
            if ancestors.contains(n.as_str()) {
                // An older epoch of this chain: nothing to follow or carry there.
                if q.rejected.len() < MAX_REJECTED_EPOCHS {
                    q.rejected.insert(n);
                }
                continue;
            }
            q.sealed.insert(
                n.clone(),
                Sealed {
                    into: to.clone(),
                    into_epoch: epoch_no,
                    carried: vec![],
                    dirty: true,
                    epoch: epoch_no,
                    since: now.mono,
                    forwarded: false,
                    retry_at: None,
                },
            );
            self.epochs.hold(n, id.clone());
        }
        switched
    }

    /// Whether successor `doc` of queue `id` may be followed, as far as this node can tell
    /// ([`epoch::check_successor`] against the document it continues, when that is here):
    /// not while the seal naming it has not arrived; never once it is found forged (it is
    /// rejected, and reported once). A successor whose predecessor is not here is judged by
    /// its lineage alone: the move waits for that document anyway (`gaps`), unless no
    /// member has it any more.
    fn may_follow(&mut self, id: &QueueId, doc: &DocId) -> bool {
        let Some(q) = self.queues.get(id) else {
            return false;
        };
        if q.verified.contains(doc) {
            return true;
        }
        let Some(succ) = self.replica.get(doc) else {
            return false;
        };
        let Some((prev_id, prev)) = epoch::read_prev(succ)
            .and_then(|p| DocId::parse(&p.doc))
            .and_then(|p| Some((p.clone(), self.replica.get(&p)?)))
            .filter(|(_, p)| !p.get_heads().is_empty())
        else {
            return true;
        };
        // The queue's own view cache when the successor continues its document (the usual
        // move: the refresh is incremental), a whole read otherwise.
        let mut other = ViewCache::new();
        let cache = match self.queues.get_mut(id) {
            Some(q) if q.doc == prev_id => &mut q.cache,
            _ => &mut other,
        };
        match epoch::check_successor(prev, cache, succ, doc.as_str()) {
            Ok(()) => {
                if let Some(q) = self.queues.get_mut(id) {
                    q.verified.insert(doc.clone());
                }
                true
            }
            Err(epoch::SuccessorCheck::NotYet) => false,
            Err(why) => {
                tracing::warn!(queue = %id, %doc, %why, "a forged successor is not followed");
                if let Some(q) = self.queues.get_mut(id) {
                    q.announced.remove(doc);
                    if q.rejected.len() < MAX_REJECTED_EPOCHS {
                        q.rejected.insert(doc.clone());
                    }
                }
                self.events.push_back(Event::Epoch {
                    queue: id.clone(),
                    event: EpochEvent::Refused {
                        doc: doc.clone(),
                        reason: why.to_string(),
                    },
                });
                false
            }
        }
    }

    /// A reopened queue's remembered epoch document ([`Config::resume`]) is here: the queue
    /// moves to it, as a follower moves to a successor, if it is still on its first document
    /// and `doc` is an epoch of it. From there it follows the chain as any member behind it
    /// does: what it reads is what the chain did while this node was down.
    pub(super) fn resume_at(&mut self, now: Time, id: &QueueId, doc: &DocId) {
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        q.resuming = None;
        self.stale.insert(id.clone());
        if q.doc != q.root {
            return;
        }
        if let Some(Ok(epoch_no)) = self.epoch_here(id, doc) {
            self.switch_epoch(now, id, doc.clone(), epoch_no, None, true);
        }
    }

    /// Whether epoch document `doc` of queue `id` is to be fetched: it is not here, and was
    /// not found when last asked for.
    pub(super) fn to_fetch(&self, id: &QueueId, doc: &DocId) -> bool {
        self.replica
            .get(doc)
            .is_none_or(|d| d.get_heads().is_empty())
            && !self
                .queues
                .get(id)
                .is_some_and(|q| q.unavailable.contains(doc))
    }

    /// Whether `doc` is here: `Some(Ok(epoch))` if it is an epoch document of queue `id`,
    /// `Some(Err(()))` if it is something else, `None` if it has not arrived.
    pub(super) fn epoch_here(&self, id: &QueueId, doc: &DocId) -> Option<Result<u64, ()>> {
        let d = self.replica.get(doc)?;
        if d.get_heads().is_empty() {
            return None;
        }
        Some(match epoch::read_epoch(d) {
            Some((e, Some(origin))) if origin == *id && e > 0 => Ok(e),
            _ => Err(()),
        })
    }

    pub(super) fn fetch_epoch(&mut self, now: Time, id: &QueueId, doc: &DocId) {
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        if !q.fetching.insert(doc.clone()) {
            return;
        }
        let scope = epoch_scope(&q.root);
        self.replica.set_scope(doc, scope);
        self.wait_for(now, doc, DocWaiter::Epoch { queue: id.clone() });
    }
}
