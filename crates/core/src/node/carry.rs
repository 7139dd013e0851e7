//! Carrying late writes out of sealed epochs into the current document: from each sealed document
//! this node holds, within a per-turn budget, with the covers of the chain. May ask `follow` to
//! fetch a document a carry needs.

use super::*;

impl Core {
    /// A queue's epoch work for this turn: carry late writes out of the sealed epochs that
    /// changed, and, as the active router, rotate the current document when it is due.
    pub(super) fn epoch_work(&mut self, now: Time, id: &QueueId) {
        self.carry_late(now, id);
        self.maybe_rotate(now, id);
    }

    /// Carries the late writes of every sealed epoch that changed into its successor.
    pub(super) fn carry_late(&mut self, now: Time, id: &QueueId) {
        // A carry that brings a task into a document lets what a losing branch recorded of
        // it (its end, say) follow in the same turn: a few rounds at most.
        for _ in 0..MAX_CARRY_ROUNDS {
            if !self.carry_round(now, id) {
                break;
            }
        }
    }

    /// Whether this node holds every change document `doc` of a chain (`lineage`) had when it
    /// was sealed into the next document of that chain: the seal heads, read from the next
    /// document's `prev` or from `doc`'s own seal. True when they are not known here.
    pub(super) fn holds_sealed_state(&self, doc: &DocId, lineage: &[Link]) -> bool {
        let Some(d) = self.replica.get(doc) else {
            return true;
        };
        let epoch = epoch::read_epoch(d).map_or(0, |e| e.0);
        let Some(next) = lineage
            .iter()
            .filter(|l| l.epoch > epoch)
            .min_by_key(|l| l.epoch)
        else {
            return true;
        };
        let heads = DocId::parse(&next.doc)
            .and_then(|n| self.replica.get(&n))
            .and_then(epoch::read_prev)
            .filter(|p| p.doc == doc.as_str())
            .map(|p| p.heads)
            .or_else(|| epoch::seal_heads(d, &next.doc));
        heads.is_none_or(|h| epoch::known_heads(d, &h).len() == h.len())
    }

    /// Whether sealed document `from` is off the chain of `into` (a losing branch's): its
    /// late writes are carried whole.
    pub(super) fn off_chain(&self, id: &QueueId, from: &DocId, into: &DocId) -> bool {
        let Some(target) = self.replica.get(into) else {
            return false;
        };
        let root = self.queues.get(id).map(|q| &q.root);
        let from_epoch = self
            .replica
            .get(from)
            .and_then(epoch::read_epoch)
            .map(|e| e.0);
        root != Some(from)
            && epoch::read_prev(target).is_none_or(|p| p.doc != from.as_str())
            && !epoch::on_lineage(&epoch::read_lineage(target), from.as_str(), from_epoch)
    }

    /// For a losing branch `from` carried into `into` (whose chain this node holds as
    /// `chain`): the documents its task entries came from that this node holds, each with
    /// what `into`'s chain absorbed of it. `None` when the chain holds no cover of `from`'s
    /// predecessor (a fork older than `epoch::COVER_EPOCHS`, or documents written before
    /// covers): the carry then needs the chain since the fork. `Err` while the predecessor
    /// is being read from disk or asked for (looked at again after [`CARRY_RETRY`]).
    pub(super) fn loser_bases(
        &mut self,
        now: Time,
        id: &QueueId,
        from: &DocId,
        into: &DocId,
        chain: &[DocId],
    ) -> Result<Option<LoserBases>, Waiting> {
        let chain_cover = |this: &Self, of: &str| {
            std::iter::once(into)
                .chain(chain.iter())
                .filter_map(|d| this.replica.get(d))
                .filter_map(|d| epoch::read_cover(d, of))
                .reduce(|mut a, b| {
                    a.merge(&b);
                    a
                })
        };
        let Some(f) = self.replica.get(from) else {
            return Ok(None);
        };
        let Some(prev) = epoch::read_prev(f).and_then(|p| DocId::parse(&p.doc)) else {
            return Ok(None);
        };
        let own = epoch::read_covers(f);
        if chain_cover(self, prev.as_str()).is_none() {
            return Ok(None);
        }
        // The predecessor is read from disk, or asked for, unless no one has it.
        if self
            .replica
            .get(&prev)
            .is_none_or(|p| p.get_heads().is_empty())
            && self.to_fetch(id, &prev)
        {
            self.fetch_epoch(now, id, &prev);
            self.carry_later(now, id, from);
            return Err(Waiting);
        }
        let mut docs = vec![];
        let mut all_absorbed = true;
        for (other, need) in &own {
            let absorbed = chain_cover(self, other);
            all_absorbed &= absorbed.as_ref().is_some_and(|a| a.includes(need));
            if let (Some(d), Some(a)) = (DocId::parse(other), absorbed)
                && self
                    .replica
                    .get(&d)
                    .is_some_and(|x| !x.get_heads().is_empty())
            {
                docs.push((d, a));
            }
        }
        Ok(Some(LoserBases { docs, all_absorbed }))
    }

    /// Marks sealed document `from` to be carried again after [`CARRY_RETRY`].
    pub(super) fn carry_later(&mut self, now: Time, id: &QueueId, from: &DocId) {
        if let Some(s) = self.queues.get_mut(id).and_then(|q| q.sealed.get_mut(from)) {
            s.dirty = true;
            s.retry_at = Some(now.mono + CARRY_RETRY);
        }
    }

    /// One round of [`Self::carry_late`]: the documents of the target's chain first, then the
    /// losing branches'. True if a carry brought tasks into a document that a losing branch
    /// carries into, which is then carried again whole.
    pub(super) fn carry_round(&mut self, now: Time, id: &QueueId) -> bool {
        let Some(q) = self.queues.get_mut(id) else {
            return false;
        };
        let mut dirty: Vec<(DocId, DocId, Vec<ChangeHash>, bool)> = q
            .sealed
            .iter_mut()
            .filter(|(_, s)| s.dirty && s.retry_at.is_none_or(|t| now.mono >= t))
            .map(|(d, s)| {
                s.dirty = false;
                s.retry_at = None;
                (d.clone(), s.into.clone(), s.carried.clone(), s.forwarded)
            })
            .collect();
        // Nothing written to one since its last carry: carrying again would find no change
        // to carry (and its claims were seen then). Most marks are of this kind (a document
        // of the chain arrived, a peer's sync brought nothing new).
        dirty.retain(|(from, _, since, _)| {
            !self.replica.get(from).is_some_and(|d| {
                let heads = d.get_heads();
                !heads.is_empty() && same_heads(heads, since)
            })
        });
        // The chain first: a task a late write of the chain brings back in is there when a
        // losing branch's record of its end is carried.
        dirty.sort_by_cached_key(|(from, into, _, _)| self.off_chain(id, from, into));
        // The documents that carries brought tasks into, and from where.
        let mut grown: BTreeMap<DocId, BTreeSet<DocId>> = BTreeMap::new();
        for (from, into, since, forwarded) in dirty {
            if self
                .replica
                .get(&from)
                .is_none_or(|d| d.get_heads().is_empty())
            {
                // Not in memory (a retired document a move brought back): load it first,
                // unless no one has it.
                if self.to_fetch(id, &from) {
                    self.fetch_epoch(now, id, &from);
                }
                continue;
            }
            let Some(target) = self.replica.get(&into) else {
                continue;
            };
            // Claims written into a sealed epoch fence before they are carried: those that
            // will count in the document carried into (their chain runs through a claim that
            // counts there), as they will for its routers once the carry is written.
            if let Some(c) = self
                .replica
                .get(&from)
                .and_then(|f| epoch::carried_claim(f, target))
            {
                see(&mut self.seen, id, &c);
            }
            let prev = epoch::read_prev(target);
            let lineage = epoch::read_lineage(target);
            let root = self.queues.get(id).map(|q| q.root.clone());
            let from_epoch = self
                .replica
                .get(&from)
                .and_then(epoch::read_epoch)
                .map_or(0, |e| e.0);
            // A forwarded document carries as if into its direct successor, from the heads it
            // carried along the chain before (see `Sealed::forwarded`).
            let direct = forwarded || prev.as_ref().is_some_and(|p| p.doc == from.as_str());
            let ancestor = root.as_ref() == Some(&from)
                || epoch::on_lineage(&lineage, from.as_str(), Some(from_epoch));
            // The documents of the target's chain this node holds, newer than `from` if `from`
            // is on it: a task one of them indexes was carried along the chain already.
            let chain: Vec<DocId> = lineage
                .iter()
                .filter(|l| l.doc != into.as_str() && (!ancestor || l.epoch > from_epoch))
                .filter_map(|l| DocId::parse(&l.doc))
                .chain(root.clone().filter(|_| !ancestor))
                .filter(|d| {
                    *d != from
                        && self
                            .replica
                            .get(d)
                            .is_some_and(|x| !x.get_heads().is_empty())
                })
                .collect();
            // A carrier that jumped epochs (a restart) must see every document of the chain
            // between: a task carried along it and dropped there would otherwise come back.
            // A carrier from a losing branch must see every document of the target's chain
            // since the fork, for the same reason.
            let from_lineage = self
                .replica
                .get(&from)
                .map(epoch::read_lineage)
                .unwrap_or_default();
            let fork = lineage
                .iter()
                .find(|l| !from_lineage.contains(l))
                .map_or(u64::MAX, |l| l.epoch);
            // What the target's chain absorbed of `from` (`epoch::Cover`): with it, a task
            // entry of `from` tells by itself whether the chain knew the task, and the carry
            // needs neither the documents between nor the changes of `from` it lacks. A
            // losing branch's entries were written by its own sealer: it still needs the
            // chain since the fork.
            let cover = std::iter::once(&into)
                .chain(chain.iter())
                .filter_map(|d| self.replica.get(d))
                .filter_map(|d| epoch::read_cover(d, from.as_str()))
                .reduce(|mut a, b| {
                    a.merge(&b);
                    a
                });
            // A losing branch carries without the chain since the fork when the target's
            // chain holds a cover of its predecessor: a task entry found in a document the
            // branch came from or carried from (those here) was absorbed, or not, by its
            // entry there; one the branch took from a document not here, if the chain
            // absorbed all the branch did of them (`epoch::Cover::includes`).
            let loser = if direct || ancestor {
                None
            } else {
                match self.loser_bases(now, id, &from, &into, &chain) {
                    Ok(b) => b,
                    Err(Waiting) => continue,
                }
            };
            let covered = (cover.is_some() && (direct || ancestor)) || loser.is_some();
            let (bases, all_absorbed) = loser.map_or((vec![], false), |l| (l.docs, l.all_absorbed));
            let needed_from = match (direct, ancestor) {
                _ if covered => None,
                (true, _) => None,
                (false, true) => Some(from_epoch + 1),
                (false, false) => Some(fork.saturating_sub(1)),
            };
            if let Some(first) = needed_from {
                // Every one of them: without one, a task carried into it and ended there
                // would come back. One that no connected peer had is asked for again when a
                // peer connects (`Core::handle_connected`); until then nothing is carried.
                let lacking: Vec<DocId> = lineage
                    .iter()
                    .filter(|l| l.epoch >= first && l.doc != into.as_str())
                    .filter_map(|l| DocId::parse(&l.doc))
                    .filter(|d| self.replica.get(d).is_none_or(|x| x.get_heads().is_empty()))
                    .collect();
                if !lacking.is_empty() {
                    let mut asked = false;
                    for d in lacking
                        .iter()
                        .filter(|d| self.to_fetch(id, d))
                        .cloned()
                        .collect::<Vec<_>>()
                    {
                        self.fetch_epoch(now, id, &d);
                        asked = true;
                    }
                    if asked {
                        self.carry_later(now, id, &from);
                    }
                    continue;
                }
            }
            // Where `from` was sealed into the target's chain: the seal heads.
            let heads = if forwarded {
                Some(since.clone())
            } else if direct {
                prev.as_ref().map(|p| p.heads.clone())
            } else if ancestor {
                let next = lineage
                    .iter()
                    .filter(|l| l.epoch > from_epoch)
                    .min_by_key(|l| l.epoch)
                    .map(|l| l.doc.clone());
                // The seal heads: from the next document of the chain (its `prev`), or from
                // the seal in `from` (a carrier that missed the seal lacks the latter).
                let via_next = next
                    .as_ref()
                    .and_then(|n| DocId::parse(n))
                    .and_then(|n| self.replica.get(&n))
                    .and_then(epoch::read_prev)
                    .filter(|p| p.doc == from.as_str())
                    .map(|p| p.heads);
                via_next.or_else(|| {
                    self.replica
                        .get(&from)
                        .zip(next)
                        .and_then(|(d, n)| epoch::seal_heads(d, &n))
                })
            } else {
                None
            };
            // A carrier behind the seal (it lacks some of the changes the seal covered) cannot
            // tell a late submit from a task that ended before the seal: it waits for them.
            if let (Some(h), Some(f)) = (&heads, self.replica.get(&from))
                && !covered
                && epoch::known_heads(f, h).len() < h.len()
            {
                self.replica.resync_with_members(&from);
                continue;
            }
            // The same for the chain's documents: one this node holds only in part (its own
            // messages were lost while the others wrote it) may lack a task that was carried
            // into it, ran and ended there; that task would come back. Each must have what it
            // held when it was sealed into the next.
            let behind: Vec<DocId> = chain
                .iter()
                .filter(|_| !covered)
                .filter(|d| !self.holds_sealed_state(d, &lineage))
                .cloned()
                .collect();
            if !behind.is_empty() {
                for d in &behind {
                    self.replica.resync_with_members(d);
                }
                // Looked at again later (their changes do not mark `from`).
                self.carry_later(now, id, &from);
                continue;
            }
            let from_loser = !direct && !ancestor;
            // Into its direct successor, a carry starts where any carrier's marked carry
            // ended, and marks its own: the sealer's carries then spare the others theirs.
            let mark = (direct && !forwarded).then(|| from.to_string());
            let mut since = since;
            // An ancestor not carried yet (a node that moved past its successor, straight to a
            // later epoch) starts at its seal: what it held then was sealed into the chain,
            // and carrying it again writes nothing (every task it knew then is in the target
            // or `dropped`). From its first change instead, the carry looks at the whole
            // epoch's history: half a second in one turn at 2,000 live tasks.
            if since.is_empty()
                && ancestor
                && !direct
                && let Some(h) = &heads
            {
                since = h.clone();
            }
            if let Some(m) = &mark
                && let Some(t) = self.replica.get(&into)
            {
                since.extend(epoch::carried_marks(t, m));
            }
            // Within the turn's budget, unless the view shows what is carried (see
            // `Epochs::carry_without_budget`): the rest at the next turns.
            let limit = self.epochs.carry_limit();
            if limit == 0 {
                if let Some(s) = self
                    .queues
                    .get_mut(id)
                    .and_then(|q| q.sealed.get_mut(&from))
                {
                    s.dirty = true;
                }
                self.epochs.carry_later(now.mono);
                continue;
            }
            let mut others: Vec<&DocId> = vec![&from];
            others.extend(chain.iter());
            others.extend(bases.iter().map(|(d, _)| d));
            let carried = self.replica.change_reading(&into, &others, |d, docs| {
                let f = docs[0]?;
                let held: Vec<&Automerge> =
                    docs[1..=chain.len()].iter().flatten().copied().collect();
                let based: Vec<(&Automerge, &epoch::Cover)> = docs[chain.len() + 1..]
                    .iter()
                    .zip(&bases)
                    .filter_map(|(d, (_, c))| Some(((*d)?, c)))
                    .collect();
                let dropped = |t: &TaskId| {
                    if held.iter().any(|h| epoch::indexes(*h, t))
                        || cover
                            .as_ref()
                            .is_some_and(|c| epoch::entry_covered(f, c, t))
                    {
                        return true;
                    }
                    // A losing branch's task that came from a document the chain absorbed
                    // too: as that document's entry says.
                    if let Some((b, c)) = based.iter().find(|(b, _)| epoch::indexes(*b, t)) {
                        return epoch::entry_covered(b, c, t);
                    }
                    // One the branch took from a document not here (its build, a carry):
                    // absorbed if the chain absorbed all the branch did.
                    if covered && !(ancestor || direct) && epoch::entry_carried(f, t) {
                        return all_absorbed;
                    }
                    match (&heads, ancestor || direct) {
                        (Some(h), _) => epoch::known_at(f, h, t),
                        // On the chain, but the seal is not here: never bring back a task
                        // that ended (at worst a live one runs again).
                        (None, true) => epoch::task_state(f, t).is_some_and(|s| s.is_final()),
                        // A losing branch: a task no document of the chain indexes was
                        // submitted on that branch.
                        (None, false) => false,
                    }
                };
                Some(epoch::carry_covering(
                    f,
                    &since,
                    d,
                    &dropped,
                    mark.as_deref(),
                    Some((from.as_str(), from_epoch)),
                    limit,
                ))
            });
            match carried.flatten() {
                Some(Ok(c)) => {
                    self.epochs.carried(c.changes);
                    if c.more {
                        self.epochs.carry_later(now.mono);
                    }
                    if c.tasks > 0 {
                        grown.entry(into.clone()).or_default().insert(from.clone());
                    }
                    if c.writes > 0 {
                        self.changed(&into);
                        self.events.push_back(Event::Epoch {
                            queue: id.clone(),
                            event: EpochEvent::Carried {
                                writes: c.writes,
                                from_loser,
                            },
                        });
                    }
                    if let Some(s) = self
                        .queues
                        .get_mut(id)
                        .and_then(|q| q.sealed.get_mut(&from))
                    {
                        s.carried = c.heads;
                        s.dirty |= c.more;
                    }
                }
                Some(Err(e)) => tracing::warn!(queue = %id, "cannot carry late writes: {e}"),
                // The predecessor is not here: nothing can tell a late submit from a task
                // finished before the seal, so nothing is carried.
                None => {}
            }
        }
        // A losing branch's records of a task that was not in the target when they were
        // carried were left behind: carry the branch again whole (carrying is idempotent).
        let again: Vec<DocId> = self.queues.get(id).map_or(vec![], |q| {
            q.sealed
                .iter()
                .filter(|(d, s)| {
                    grown
                        .get(&s.into)
                        .is_some_and(|g| g.iter().any(|f| f != *d))
                        && self.off_chain(id, d, &s.into)
                })
                .map(|(d, _)| d.clone())
                .collect()
        });
        let Some(q) = self.queues.get_mut(id) else {
            return false;
        };
        for d in &again {
            if let Some(s) = q.sealed.get_mut(d) {
                s.dirty = true;
                s.carried = vec![];
            }
        }
        !again.is_empty()
    }
}
