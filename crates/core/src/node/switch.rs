//! Moving a queue to another epoch document: what the document left becomes (a sealed epoch carried
//! from), what a sideways move keeps, where every sealed document's late writes go. Asks nothing of
//! the others but to remember the epoch (`Io::RememberEpoch`).

use super::*;

impl Core {
    /// Makes `to` the queue's current document; the one it leaves is kept as a sealed epoch
    /// whose late writes are carried into `to`.
    /// Moves the queue to document `to`; `cache`, if given, holds `to`'s view read earlier
    /// (the sealer's, read off its thread), else the next refresh reads `to` whole. `resumed`:
    /// a restart back to the document this node was on ([`Config::resume`]), which passes
    /// over the documents between without needing them.
    pub(super) fn switch_epoch(
        &mut self,
        now: Time,
        id: &QueueId,
        to: DocId,
        epoch_no: u64,
        cache: Option<ViewCache>,
        resumed: bool,
    ) {
        let prev = self.replica.get(&to).and_then(epoch::read_prev);
        let lineage: BTreeSet<String> = self
            .replica
            .get(&to)
            .map(epoch::read_lineage)
            .unwrap_or_default()
            .into_iter()
            .map(|l| l.doc)
            .collect();
        let to_lineage = self
            .replica
            .get(&to)
            .map(epoch::read_lineage)
            .unwrap_or_default();
        let from_lineage = self
            .queues
            .get(id)
            .and_then(|q| self.replica.get(&q.doc))
            .map(epoch::read_lineage)
            .unwrap_or_default();
        // The documents between where this node was and `to` that no member had: deleted
        // everywhere (`keep_sealed_epochs`) while this node was away. It moves past them.
        let missing = to_lineage
            .iter()
            .filter(|_| !resumed)
            .filter(|l| l.doc != to.as_str() && !from_lineage.iter().any(|f| f.doc == l.doc))
            .filter_map(|l| DocId::parse(&l.doc))
            .filter(|d| self.queues.get(id).is_some_and(|q| *d != q.doc))
            .filter(|d| self.epoch_here(id, d).is_none())
            .count();
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let from = std::mem::replace(&mut q.doc, to.clone());
        let from_epoch = q.epoch;
        let sideways =
            !epoch::on_lineage(&to_lineage, from.as_str(), Some(from_epoch)) && from != q.root;
        // Fences are per chain. A claim that counted on the branch this node leaves need not
        // count in `to` (its chain may run through that branch's sealer claim, which no carry
        // brings): a fence raised there would refuse `to`'s router for good. The fence starts
        // again from `to`'s view, which the refresh after the move reads.
        if sideways {
            self.seen.remove(id);
        }
        // Leaving a branch: every document of it since the fork is carried into `to` whole,
        // the ones this node had retired too (a task that ended in one of them may be live
        // in `to`, brought there by a late write of a document both branches share).
        if sideways {
            let fork = fork_of(&from_lineage, &to_lineage)
                .filter(|d| *d != q.root && !q.sealed.contains_key(d))
                .and_then(|d| {
                    let e = from_lineage.iter().find(|l| l.doc == d.as_str())?.epoch;
                    Some((d, e))
                });
            for (d, e) in branch_since_fork(&from_lineage, &to_lineage, Some(&q.root))
                .into_iter()
                .chain(fork)
            {
                if d == from || d == to {
                    continue;
                }
                q.rejected.remove(&d);
                q.sealed.insert(
                    d.clone(),
                    Sealed {
                        into: to.clone(),
                        into_epoch: epoch_no,
                        carried: vec![],
                        dirty: true,
                        epoch: e,
                        since: now.mono,
                        forwarded: false,
                        retry_at: None,
                    },
                );
                self.epochs.hold(d, id.clone());
            }
        }
        q.epoch = epoch_no;
        q.cache = cache.unwrap_or_default();
        q.fetching.remove(&to);
        q.sealed.remove(&to);
        q.announced.remove(&to);
        q.sealed.insert(
            from.clone(),
            Sealed {
                into: to.clone(),
                into_epoch: epoch_no,
                carried: vec![],
                dirty: true,
                epoch: from_epoch,
                since: now.mono,
                forwarded: false,
                retry_at: None,
            },
        );
        // The document `to` continues, if this node had retired it: held again (read back
        // from disk) and carried from `to`'s seal heads. This node's own writes to it after
        // the other side sealed it (a partition) would otherwise never reach `to`.
        if let Some(pd) = prev.as_ref().and_then(|p| DocId::parse(&p.doc))
            && pd != from
            && pd != to
            && !q.sealed.contains_key(&pd)
        {
            q.rejected.remove(&pd);
            q.sealed.insert(
                pd.clone(),
                Sealed {
                    into: to.clone(),
                    into_epoch: epoch_no,
                    carried: vec![],
                    dirty: true,
                    epoch: epoch_no.saturating_sub(1),
                    since: now.mono,
                    forwarded: false,
                    retry_at: None,
                },
            );
            self.epochs.hold(pd, id.clone());
        }
        // Where each sealed document's late writes go now: the document `to` continues
        // carries from `to`'s seal heads; one whose target left `to`'s chain (a losing
        // branch) is carried into `to` whole. Carrying again is harmless.
        let root = q.root.clone();
        for (d, s) in q.sealed.iter_mut() {
            if prev.as_ref().is_some_and(|p| p.doc == d.as_str()) {
                s.into = to.clone();
                s.into_epoch = epoch_no;
                s.carried = prev.as_ref().map(|p| p.heads.clone()).unwrap_or_default();
                s.forwarded = false;
                s.dirty = true;
            } else if s.into != to
                && s.into != root
                && !epoch::on_lineage(&to_lineage, s.into.as_str(), Some(s.into_epoch))
            {
                s.into = to.clone();
                s.into_epoch = epoch_no;
                s.carried = vec![];
                s.forwarded = false;
                s.dirty = true;
            }
        }
        let scope = epoch_scope(&q.root);
        // The chain's earlier documents stay requestable: a member behind a seal catches up
        // from this node's disk, even after a restart.
        let quiet = Scope {
            group: q.root.clone(),
            announce: false,
            requestable: false,
        };
        for d in lineage.iter().filter_map(|d| DocId::parse(d)) {
            if d != to && !q.sealed.contains_key(&d) && self.replica.scope(&d).is_none() {
                self.replica.set_scope(&d, quiet.clone());
            }
        }
        self.replica.set_scope(&to, scope);
        // A task the document left shows final (this node may have ended it there, late,
        // as a restart interrupting its runs does) keeps its end in `to` before `to` is shown:
        // the carry that would bring it may have to wait for the chain's documents.
        self.keep_ends(id, &to);
        self.io.push_back(Io::RememberEpoch {
            queue: id.clone(),
            doc: to.clone(),
        });
        self.epochs.hold(to, id.clone());
        self.stale.insert(id.clone());
        self.events.push_back(Event::Epoch {
            queue: id.clone(),
            event: EpochEvent::Switched {
                epoch: epoch_no,
                from: from_epoch,
                sideways,
                missing,
            },
        });
    }

    /// After a move to another branch: a task `to` shows live that a document of this queue
    /// this node holds shows final gets that document's records of it in `to` (its end
    /// first of all), before any view of `to` is read. `to`'s branch may lack the end (its
    /// copy of a document both branches share stopped before it, or the task was brought in
    /// by a carrier that held less); this node's view must not go back to live. The carries
    /// that follow would bring it too, but only in later turns. This reads `to` through the
    /// queue's view cache (the read every later turn starts from) and each live task's entry
    /// in each sealed document held.
    pub(super) fn keep_ends(&mut self, id: &QueueId, to: &DocId) {
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let Some(live) = self
            .replica
            .get(to)
            .and_then(|d| q.cache.refresh(d))
            .map(|v| {
                v.tasks()
                    .values()
                    .filter(|t| !t.state().is_final())
                    .map(|t| t.id.clone())
                    .collect::<Vec<_>>()
            })
        else {
            return;
        };
        let mut by_doc: BTreeMap<DocId, Vec<TaskId>> = BTreeMap::new();
        let mut kept = Vec::new();
        for t in live {
            let holder = q.sealed.keys().find(|d| {
                self.replica
                    .get(d)
                    .and_then(|doc| epoch::task_state(doc, &t))
                    .is_some_and(|s| s.is_final())
            });
            match holder {
                Some(d) => by_doc.entry(d.clone()).or_default().push(t),
                None => kept.extend(self.ends.get(&t)),
            }
        }
        // No document here holds its end, but this node saw it end: the documents that held
        // it are deleted (the losing side of a double seal, say).
        if !kept.is_empty() {
            match self
                .replica
                .change(to, |into| epoch::write_ends(into, &kept))
            {
                Some(Ok(n)) if n > 0 => self.changed(to),
                Some(Err(e)) => {
                    tracing::warn!(queue = %id, "cannot write the ends kept in memory into {to}: {e}")
                }
                _ => {}
            }
        }
        for (d, tasks) in by_doc {
            let written = self.replica.change_reading(to, &[&d], |into, docs| {
                docs[0].map(|f| epoch::carry_records(f, into, &tasks))
            });
            match written.flatten() {
                Some(Ok(n)) if n > 0 => self.changed(to),
                Some(Err(e)) => {
                    tracing::warn!(queue = %id, "cannot write the ends {d} holds into {to}: {e}")
                }
                _ => {}
            }
        }
    }
}
