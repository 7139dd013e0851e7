//! `Documents`: the documents this node is loading (and retrying), the requests parked on a
//! document, the joins that found no peer yet, and the documents that may leave memory. A
//! sub-machine: its fields are its own. The turn tells it of loads and their answers, of
//! requests to park and of documents that may leave memory; it asks it which loads to retry,
//! which waiters a document's arrival (or absence, or a deadline) releases, whether a document
//! is awaited, and which documents are due to leave memory. It asks nothing of the others.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use piecework_replica::DocId;
use piecework_worker_pool::Run;

use crate::node::evict::{EvictQueue, MAX_IDLE_DOCS};
use crate::node::waiters::{DocWaiter, JOIN_ASK_EVERY};
use crate::{IDLE_EVICT, LOAD_ATTEMPTS, SAVE_RETRY};

/// Documents being loaded, waited for, or waiting to leave memory.
#[derive(Debug)]
pub(in crate::node) struct Documents {
    /// Load attempts per document being loaded (retried on failure). Bounded by the replica's
    /// loads (`piecework_replica::MAX_PENDING_LOADS` for peers' messages, plus this node's own
    /// fetches, which its waiters bound).
    loads: BTreeMap<DocId, u32>,
    /// Failed loads to retry, by when: a subset of `loads`.
    load_retries: BTreeSet<(Instant, DocId)>,
    /// Requests parked on a document: at most [`crate::MAX_WAITERS`], plus one start per
    /// worker.
    waiters: BTreeMap<DocId, Vec<DocWaiter>>,
    /// Joins that found no peer with the queue yet: retried when a peer connects, answered at
    /// their deadline. Counted in [`crate::MAX_WAITERS`].
    join_retries: Vec<DocWaiter>,
    /// When the joins still waiting ask the peers again ([`JOIN_ASK_EVERY`]).
    next_join_ask: Instant,
    /// Documents that may leave memory once saved and unused, and from when: at most the
    /// loaded documents (an entry whose document is gone is dropped).
    to_evict: EvictQueue,
}

impl Documents {
    pub(in crate::node) fn new(now: Instant) -> Self {
        Documents {
            loads: BTreeMap::new(),
            load_retries: BTreeSet::new(),
            waiters: BTreeMap::new(),
            join_retries: vec![],
            next_join_ask: now,
            to_evict: EvictQueue::default(),
        }
    }

    /// The replica needs `doc` from disk: whether the driver is to be asked for it (false if
    /// a load of it is already in flight or waits for its retry).
    pub(in crate::node) fn load(&mut self, doc: &DocId) -> bool {
        if self.loads.contains_key(doc) {
            return false;
        }
        self.loads.insert(doc.clone(), 0);
        true
    }

    /// Whether a load of `doc` is in flight (or waits for its retry).
    pub(in crate::node) fn is_loading(&self, doc: &DocId) -> bool {
        self.loads.contains_key(doc)
    }

    /// A load of `doc` was answered: which attempt the answer ends (the first is 1). The load
    /// is no longer in flight.
    pub(in crate::node) fn load_answered(&mut self, doc: &DocId) -> u32 {
        self.loads.remove(doc).unwrap_or(0) + 1
    }

    /// The `attempt`-th read of `doc` failed: whether it is read again (after a backoff that
    /// doubles with each attempt, up to [`LOAD_ATTEMPTS`]); if not, the load is given up.
    pub(in crate::node) fn load_failed(&mut self, doc: &DocId, attempt: u32, now: Instant) -> bool {
        if attempt >= LOAD_ATTEMPTS {
            return false;
        }
        self.loads.insert(doc.clone(), attempt);
        let at = now + SAVE_RETRY.saturating_mul(1 << attempt);
        self.load_retries.insert((at, doc.clone()));
        true
    }

    /// The loads whose retry is due at `now`, earliest first: the driver is asked again.
    pub(in crate::node) fn retries_due(&mut self, now: Instant) -> Vec<DocId> {
        let mut due = vec![];
        while let Some((at, doc)) = self.load_retries.first().cloned() {
            if at > now {
                break;
            }
            self.load_retries.pop_first();
            due.push(doc);
        }
        due
    }

    /// When the next load is retried.
    pub(in crate::node) fn next_retry(&self) -> Option<Instant> {
        self.load_retries.first().map(|(at, _)| *at)
    }

    /// Parks `waiter` until `doc` arrives (or turns out unavailable, or its deadline passes).
    pub(in crate::node) fn park(&mut self, doc: &DocId, waiter: DocWaiter) {
        self.waiters.entry(doc.clone()).or_default().push(waiter);
    }

    /// `doc` arrived or is unavailable: the requests parked on it, in the order they came.
    pub(in crate::node) fn take_waiters(&mut self, doc: &DocId) -> Vec<DocWaiter> {
        self.waiters.remove(doc).unwrap_or_default()
    }

    /// Whether a request is parked on `doc`.
    pub(in crate::node) fn is_awaited(&self, doc: &DocId) -> bool {
        self.waiters.contains_key(doc)
    }

    /// Whether a request parked on `doc` is one that `which` says.
    pub(in crate::node) fn is_awaited_by(
        &self,
        doc: &DocId,
        which: impl Fn(&DocWaiter) -> bool,
    ) -> bool {
        self.waiters.get(doc).is_some_and(|ws| ws.iter().any(which))
    }

    /// The requests parked (on a document, or as joins to retry): what counts in
    /// [`crate::MAX_WAITERS`] here.
    pub(in crate::node) fn parked(&self) -> usize {
        self.waiters.values().map(Vec::len).sum::<usize>() + self.join_retries.len()
    }

    /// A stop began: the starts parked on their task's document will not run here; their
    /// runs, in document order.
    pub(in crate::node) fn take_starts(&mut self) -> Vec<Run> {
        let mut refused = Vec::new();
        for ws in self.waiters.values_mut() {
            let mut keep = Vec::with_capacity(ws.len());
            for w in std::mem::take(ws) {
                match w {
                    DocWaiter::Start { run, .. } => refused.push(run),
                    w => keep.push(w),
                }
            }
            *ws = keep;
        }
        self.waiters.retain(|_, ws| !ws.is_empty());
        refused
    }

    /// The requests whose deadline passed at `now`, taken: those parked on a document (in
    /// document order), then the joins to retry.
    pub(in crate::node) fn expire(&mut self, now: Instant) -> Vec<DocWaiter> {
        let expired = |w: &DocWaiter| match w {
            DocWaiter::Join { deadline, .. } | DocWaiter::Status { deadline, .. } => {
                now >= *deadline
            }
            DocWaiter::Start { .. }
            | DocWaiter::Revive { .. }
            | DocWaiter::Epoch { .. }
            | DocWaiter::Resume { .. }
            | DocWaiter::Write => false,
        };
        let mut gone = vec![];
        for ws in self.waiters.values_mut() {
            let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(ws).into_iter().partition(expired);
            *ws = keep;
            gone.extend(old);
        }
        self.waiters.retain(|_, ws| !ws.is_empty());
        let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.join_retries)
            .into_iter()
            .partition(expired);
        self.join_retries = keep;
        gone.extend(old);
        gone
    }

    /// The earliest deadline of a parked request (a join's, no later than its next ask).
    pub(in crate::node) fn next_deadline(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut earliest = |x: Instant| t = Some(t.map_or(x, |t| t.min(x)));
        for ws in self.waiters.values() {
            for w in ws {
                match w {
                    DocWaiter::Join { deadline, .. } => {
                        earliest((*deadline).min(self.next_join_ask));
                    }
                    DocWaiter::Status { deadline, .. } => earliest(*deadline),
                    DocWaiter::Start { .. }
                    | DocWaiter::Revive { .. }
                    | DocWaiter::Write
                    | DocWaiter::Epoch { .. }
                    | DocWaiter::Resume { .. } => {}
                }
            }
        }
        for w in &self.join_retries {
            if let DocWaiter::Join { deadline, .. } = w {
                earliest((*deadline).min(self.next_join_ask));
            }
        }
        t
    }

    /// A join is about to wait for its queue's document: the joins ask the peers again no
    /// sooner than [`JOIN_ASK_EVERY`] from `now`.
    pub(in crate::node) fn join_begins(&mut self, now: Instant) {
        self.next_join_ask = self.next_join_ask.max(now + JOIN_ASK_EVERY);
    }

    /// A join found no peer with its queue: it is retried when a peer connects (or at the
    /// next ask), and answered at its deadline.
    pub(in crate::node) fn retry_join(&mut self, waiter: DocWaiter) {
        self.join_retries.push(waiter);
    }

    /// A peer connected: the joins that found no peer yet, to fetch again.
    pub(in crate::node) fn take_join_retries(&mut self) -> Vec<DocWaiter> {
        std::mem::take(&mut self.join_retries)
    }

    /// If the joins are due to ask again at `now` and any waits: the documents whose joins
    /// still wait for a fetch (to ask the peers again), and the joins to fetch again. The next
    /// ask is then [`JOIN_ASK_EVERY`] later.
    pub(in crate::node) fn joins_to_ask_again(
        &mut self,
        now: Instant,
    ) -> Option<(Vec<DocId>, Vec<DocWaiter>)> {
        if now < self.next_join_ask {
            return None;
        }
        let fetching: Vec<DocId> = self
            .waiters
            .iter()
            .filter(|(_, ws)| ws.iter().any(|w| matches!(w, DocWaiter::Join { .. })))
            .map(|(d, _)| d.clone())
            .collect();
        let retries = std::mem::take(&mut self.join_retries);
        if fetching.is_empty() && retries.is_empty() {
            return None;
        }
        self.next_join_ask = now + JOIN_ASK_EVERY;
        Some((fetching, retries))
    }

    /// `doc` may leave memory once saved, unused and idle, counting from `now` (unless it
    /// already counts from earlier).
    pub(in crate::node) fn may_evict(&mut self, doc: DocId, now: Instant) {
        self.to_evict.insert_if_absent(doc, now);
    }

    /// `doc` could not leave memory yet (not saved): looked at again after another idle
    /// period from `now`.
    pub(in crate::node) fn evict_later(&mut self, doc: DocId, now: Instant) {
        self.to_evict.set(doc, now);
    }

    /// `doc` is no longer a candidate to leave memory (it left, is gone, or is in use).
    pub(in crate::node) fn not_evicting(&mut self, doc: &DocId) {
        self.to_evict.remove(doc);
    }

    /// The documents due to leave memory at `now` ([`IDLE_EVICT`], sooner when more than
    /// [`MAX_IDLE_DOCS`] wait).
    pub(in crate::node) fn evictions_due(&self, now: Instant) -> Vec<DocId> {
        self.to_evict.due(now, IDLE_EVICT, MAX_IDLE_DOCS)
    }

    /// When the next document is due to leave memory.
    pub(in crate::node) fn next_eviction(&self) -> Option<Instant> {
        self.to_evict.next_due(IDLE_EVICT, MAX_IDLE_DOCS)
    }

    /// The sizes of its collections, for the checks that they stay bounded.
    pub(in crate::node) fn sizes(&self) -> [(&'static str, usize); 5] {
        [
            ("loads", self.loads.len()),
            ("load_retries", self.load_retries.len()),
            ("doc_waiters", self.waiters.values().map(Vec::len).sum()),
            ("join_retries", self.join_retries.len()),
            ("to_evict", self.to_evict.len()),
        ]
    }
}
