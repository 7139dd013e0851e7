//! Which stored documents a node deletes from its disk, and when.
//!
//! A document a node no longer needs except to answer for it is *retired*: a finished task's
//! document (its queue no longer routes it), or a sealed epoch document once it left memory
//! (`Config::epoch_retain`). Retired documents are kept in the order they were retired, one
//! list per kind, and each list keeps its last `keep` documents: beyond that, the oldest are
//! deleted from disk. A document is deleted only once it is out of memory and has no write
//! in flight (the caller says which may go); until then the ones behind it wait too, so the
//! order on disk is the order retired.
//!
//! The lists survive restarts through the store: every retirement is written
//! ([`crate::Io::Retire`]) and handed back at the next start (`Config::retired`).

use std::collections::{HashSet, VecDeque};

use piecework_replica::DocId;

use crate::Retired;

/// The retired documents of one node, oldest first per kind.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    tasks: VecDeque<DocId>,
    epochs: VecDeque<DocId>,
    known: HashSet<DocId>,
    keep_tasks: usize,
    keep_epochs: usize,
}

impl Retention {
    /// Keeps `keep_tasks` task documents and `keep_epochs` sealed epochs; `restored` are the
    /// documents retired before this start, oldest first.
    pub(crate) fn new(
        keep_tasks: usize,
        keep_epochs: usize,
        restored: impl IntoIterator<Item = (DocId, Retired)>,
    ) -> Self {
        let mut r = Retention {
            keep_tasks,
            keep_epochs,
            ..Retention::default()
        };
        for (doc, kind) in restored {
            r.retire(doc, kind);
        }
        r
    }

    /// Retires `doc`; false if it already was (nothing to record).
    pub(crate) fn retire(&mut self, doc: DocId, kind: Retired) -> bool {
        if !self.known.insert(doc.clone()) {
            return false;
        }
        match kind {
            Retired::Task => self.tasks.push_back(doc),
            Retired::Epoch => self.epochs.push_back(doc),
        }
        true
    }

    /// Whether `doc` is retired (and not deleted yet).
    #[cfg(test)]
    pub(crate) fn contains(&self, doc: &DocId) -> bool {
        self.known.contains(doc)
    }

    /// How many documents of each kind are retired and still on disk: (tasks, epochs).
    pub(crate) fn len(&self) -> (usize, usize) {
        (self.tasks.len(), self.epochs.len())
    }

    /// The oldest document of each kind beyond its bound: the next to delete, once it is out
    /// of memory with no write in flight ([`Retention::deleted`]).
    pub(crate) fn over(&self) -> Vec<DocId> {
        [
            (&self.tasks, self.keep_tasks),
            (&self.epochs, self.keep_epochs),
        ]
        .into_iter()
        .filter(|(list, keep)| list.len() > *keep)
        .filter_map(|(list, _)| list.front().cloned())
        .collect()
    }

    /// Puts `doc`, one of [`Retention::over`], behind the others of its kind: it is still
    /// needed, and must not hold back the deletion of those behind it.
    pub(crate) fn postpone(&mut self, doc: &DocId) {
        for list in [&mut self.tasks, &mut self.epochs] {
            if list.front() == Some(doc)
                && let Some(d) = list.pop_front()
            {
                list.push_back(d);
            }
        }
    }

    /// Forgets `doc`, one of [`Retention::over`]: the caller deletes it.
    pub(crate) fn deleted(&mut self, doc: &DocId) {
        for list in [&mut self.tasks, &mut self.epochs] {
            if list.front() == Some(doc) {
                list.pop_front();
                self.known.remove(doc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(i: u64) -> DocId {
        use rand::SeedableRng as _;
        DocId::generate(&mut rand_chacha::ChaCha8Rng::seed_from_u64(i))
    }

    /// Deletes, in order, every document [`Retention::over`] names that `may_go`.
    fn delete(r: &mut Retention, may_go: impl Fn(&DocId) -> bool) -> Vec<DocId> {
        let mut out = vec![];
        loop {
            let go: Vec<DocId> = r.over().into_iter().filter(|d| may_go(d)).collect();
            if go.is_empty() {
                return out;
            }
            for d in go {
                r.deleted(&d);
                out.push(d);
            }
        }
    }

    #[test]
    fn the_oldest_beyond_each_bound_go_first() {
        let mut r = Retention::new(2, 1, [(doc(0), Retired::Task)]);
        for i in 1..5 {
            assert!(r.retire(doc(i), Retired::Task));
        }
        assert!(!r.retire(doc(3), Retired::Task), "retired twice");
        r.retire(doc(10), Retired::Epoch);
        assert_eq!(delete(&mut r, |_| true), vec![doc(0), doc(1), doc(2)]);
        assert_eq!(r.len(), (2, 1));
        r.retire(doc(11), Retired::Epoch);
        assert_eq!(delete(&mut r, |_| true), vec![doc(10)]);
        assert!(r.over().is_empty());
        assert!(!r.contains(&doc(0)) && r.contains(&doc(3)));
    }

    #[test]
    fn a_document_that_may_not_go_holds_back_the_ones_behind_it() {
        let mut r = Retention::new(1, 0, []);
        for i in 0..4 {
            r.retire(doc(i), Retired::Task);
        }
        r.retire(doc(10), Retired::Epoch);
        // doc 1 is still in memory: doc 0 goes, doc 1 and 2 wait; the epoch list goes on.
        assert_eq!(delete(&mut r, |d| *d != doc(1)), vec![doc(0), doc(10)]);
        assert_eq!(r.len(), (3, 0));
        // `deleted` of a document that is not first of its list changes nothing.
        r.deleted(&doc(2));
        assert_eq!(r.len(), (3, 0));
        assert_eq!(delete(&mut r, |_| true), vec![doc(1), doc(2)]);
        assert_eq!(r.len(), (1, 0));
        // A deleted document may be retired again (a peer sent it back): it counts anew.
        assert!(r.retire(doc(0), Retired::Task));
    }

    #[test]
    fn a_postponed_document_goes_behind_the_others_and_stays() {
        let mut r = Retention::new(0, 1, []);
        for i in 0..3 {
            r.retire(doc(i), Retired::Epoch);
        }
        // doc 0 is still needed (the predecessor of a document a queue holds).
        assert_eq!(r.over(), vec![doc(0)]);
        r.postpone(&doc(0));
        assert_eq!(delete(&mut r, |_| true), vec![doc(1), doc(2)]);
        assert_eq!(r.len(), (0, 1));
        assert!(r.contains(&doc(0)));
        // `postpone` of a document that is not first of its list changes nothing.
        r.retire(doc(3), Retired::Epoch);
        r.postpone(&doc(3));
        assert_eq!(r.over(), vec![doc(0)]);
    }
}
