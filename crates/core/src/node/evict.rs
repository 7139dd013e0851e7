//! `EvictQueue`: documents that may leave memory, and from when, with the crowding bound
//! (`MAX_IDLE_DOCS`, `CROWDED_IDLE`). Asks nothing of the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use piecework_replica::DocId;

/// Documents waiting to leave memory (saved, unused) are kept this many at most for
/// [`IDLE_EVICT`]; beyond it the oldest leave after [`CROWDED_IDLE`]. A task's document is
/// read again from disk when its run starts: ten thousand pending tasks do not hold ten
/// thousand Automerge documents (some 10 to 20 KiB each) in memory.
pub(super) const MAX_IDLE_DOCS: usize = 1_024;

/// How long a document waits to leave memory when more than [`MAX_IDLE_DOCS`] wait.
pub(super) const CROWDED_IDLE: Duration = Duration::from_millis(200);

/// Documents waiting to leave memory, by document and by the time they became candidates, so
/// that finding the due ones and the next deadline costs O(log n) per document, not a scan.
#[derive(Debug, Default)]
pub(super) struct EvictQueue {
    pub(super) by_doc: BTreeMap<DocId, Instant>,
    pub(super) by_time: BTreeSet<(Instant, DocId)>,
}

impl EvictQueue {
    pub(super) fn len(&self) -> usize {
        self.by_doc.len()
    }

    pub(super) fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|(t, _)| *t)
    }

    pub(super) fn insert_if_absent(&mut self, doc: DocId, at: Instant) {
        if !self.by_doc.contains_key(&doc) {
            self.set(doc, at);
        }
    }

    pub(super) fn set(&mut self, doc: DocId, at: Instant) {
        if let Some(old) = self.by_doc.insert(doc.clone(), at) {
            self.by_time.remove(&(old, doc.clone()));
        }
        self.by_time.insert((at, doc));
    }

    pub(super) fn remove(&mut self, doc: &DocId) {
        if let Some(old) = self.by_doc.remove(doc) {
            self.by_time.remove(&(old, doc.clone()));
        }
    }

    /// The documents that have waited at least `idle` by `now`, oldest first; and, beyond the
    /// newest `keep`, those that have waited at least [`CROWDED_IDLE`].
    pub(super) fn due(&self, now: Instant, idle: Duration, keep: usize) -> Vec<DocId> {
        let crowded = self.by_time.len().saturating_sub(keep);
        self.by_time
            .iter()
            .enumerate()
            .take_while(|(i, (t, _))| {
                now >= *t + idle || (*i < crowded && now >= *t + CROWDED_IDLE)
            })
            .map(|(_, (_, d))| d.clone())
            .collect()
    }

    /// When the next document is due (see [`EvictQueue::due`]).
    pub(super) fn next_due(&self, idle: Duration, keep: usize) -> Option<Instant> {
        let first = self.first()?;
        Some(if self.len() > keep {
            first + CROWDED_IDLE
        } else {
            first + idle
        })
    }
}
