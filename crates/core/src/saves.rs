//! Save bookkeeping: which documents have changes not yet on disk, the one write in flight per
//! document, retries after failures, and the versions that tell a submit when it is durable.
//!
//! Every change to a document (local or from a peer) bumps its *version*. A write takes every
//! change since the last acknowledged write, so when it is acknowledged the document is durable
//! up to the version it was taken at. Writes of one document never overlap, so a later change
//! cannot reach disk before an earlier one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use automerge::ChangeHash;
use piecework_replica::{DocId, Replica};

use crate::api::StorageFailure;
use crate::{COMPACT_MIN_BYTES, Compact, SAVE_FAILURES_REPORTED, SAVE_RETRY, SAVE_RETRY_MAX};
use crate::{Save, SaveId, Saved, Snapshot};

#[derive(Debug)]
struct InFlight {
    id: SaveId,
    heads: Vec<ChangeHash>,
    version: u64,
    /// Whether the write compacts.
    compacts: bool,
    /// The change chunks it appends: their keys and total size.
    appended: Vec<String>,
    appended_bytes: usize,
}

#[derive(Debug, Default)]
struct DocSaves {
    version: u64,
    durable: u64,
    in_flight: Option<InFlight>,
    failures: u32,
    last_error: Option<StorageFailure>,
    /// The keys (change hashes) of the change chunks stored since the last snapshot.
    since_snapshot: Vec<String>,
    /// Their total size.
    bytes_since_snapshot: usize,
    /// The last snapshot's size (or, after a load, everything loaded).
    snapshot_bytes: usize,
    /// The document was loaded from stored change chunks whose keys are not in
    /// `since_snapshot`: its next compaction lists its changes instead.
    unlisted: bool,
}

/// The outcome of an acknowledged or failed write, for the core to act on.
#[derive(Debug)]
pub(crate) enum Acked {
    /// On disk.
    Saved,
    /// Failed; reported when `failures` reaches [`SAVE_FAILURES_REPORTED`] (and every time
    /// after).
    Failed {
        doc: DocId,
        failures: u32,
        error: StorageFailure,
    },
}

/// Save state of every document that has some. An entry exists while a document has changes
/// not on disk, a write in flight, or a chunk count worth keeping (it is loaded); [`Saves::forget`]
/// drops it when the document leaves memory, so the map is bounded by the loaded documents.
#[derive(Debug, Default)]
pub(crate) struct Saves {
    docs: HashMap<DocId, DocSaves>,
    /// Documents with unwritten changes, no write in flight and no retry pending.
    dirty: BTreeSet<DocId>,
    /// Retries of failed writes, by when.
    retries: BTreeSet<(Instant, DocId)>,
    next_id: u64,
    in_flight: BTreeMap<SaveId, DocId>,
    /// Writes answered with a failure in a row, of any document: the store as a whole fails
    /// (a full disk) once they reach [`SAVE_FAILURES_REPORTED`], until a write succeeds.
    store_failures: u32,
    /// The last of those failures.
    store_error: Option<StorageFailure>,
}

fn retry_delay(failures: u32) -> Duration {
    SAVE_RETRY
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(SAVE_RETRY_MAX)
}

impl Saves {
    /// A document changed: it must be written.
    pub(crate) fn changed(&mut self, doc: &DocId) {
        let d = self.docs.entry(doc.clone()).or_default();
        d.version += 1;
        if d.in_flight.is_none() && !self.retries.iter().any(|(_, r)| r == doc) {
            self.dirty.insert(doc.clone());
        }
    }

    /// A document was loaded from `chunks` stored chunks of `bytes` in all.
    pub(crate) fn loaded(&mut self, doc: &DocId, chunks: usize, bytes: usize) {
        let d = self.docs.entry(doc.clone()).or_default();
        d.unlisted = chunks > 1;
        d.snapshot_bytes = bytes;
        d.bytes_since_snapshot = 0;
        d.since_snapshot.clear();
    }

    /// The document's current version (compare with [`Saves::is_durable`]).
    pub(crate) fn version(&self, doc: &DocId) -> u64 {
        self.docs.get(doc).map_or(0, |d| d.version)
    }

    /// Whether the document is on disk up to `version`.
    pub(crate) fn is_durable(&self, doc: &DocId, version: u64) -> bool {
        self.docs.get(doc).is_none_or(|d| d.durable >= version)
    }

    /// The last error, if writes of the document have failed [`SAVE_FAILURES_REPORTED`] times
    /// in a row.
    pub(crate) fn failing(&self, doc: &DocId) -> Option<&StorageFailure> {
        let d = self.docs.get(doc)?;
        (d.failures >= SAVE_FAILURES_REPORTED)
            .then_some(d.last_error.as_ref())
            .flatten()
    }

    /// The last error, if the store's writes (of any document) have failed
    /// [`SAVE_FAILURES_REPORTED`] times in a row: new work is refused until one succeeds.
    pub(crate) fn store_failing(&self) -> Option<&StorageFailure> {
        (self.store_failures >= SAVE_FAILURES_REPORTED)
            .then_some(self.store_error.as_ref())
            .flatten()
    }

    /// Whether the document has nothing unwritten and no write in flight.
    pub(crate) fn is_clean(&self, doc: &DocId) -> bool {
        self.docs
            .get(doc)
            .is_none_or(|d| d.in_flight.is_none() && d.durable >= d.version)
    }

    /// Each document with changes not on disk yet, and its version now: the versions a stop
    /// waits to see durable (changes that arrive later are not waited for).
    pub(crate) fn unsaved(&self) -> Vec<(DocId, u64)> {
        self.docs
            .iter()
            .filter(|(_, d)| d.durable < d.version)
            .map(|(doc, d)| (doc.clone(), d.version))
            .collect()
    }

    /// The document left memory: forget its entry (only if clean).
    pub(crate) fn forget(&mut self, doc: &DocId) {
        if self.is_clean(doc) {
            self.docs.remove(doc);
            self.dirty.remove(doc);
        }
    }

    /// Retries whose time has come become due.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        while let Some((at, doc)) = self.retries.first().cloned() {
            if at > now {
                break;
            }
            self.retries.pop_first();
            self.dirty.insert(doc);
        }
    }

    /// The next retry.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.retries.first().map(|(at, _)| *at)
    }

    /// The writes to start now: one per dirty document without a write in flight. A document
    /// for which `sealing` is true is never compacted: it is sealed or being sealed, written to
    /// only by late writes, and a snapshot of it (a copy and a save of its whole history) would
    /// be the largest allocation of the node for a document that is seldom read again.
    pub(crate) fn take_writes(
        &mut self,
        replica: &Replica,
        sealing: impl Fn(&DocId) -> bool,
    ) -> Vec<Save> {
        let mut out = vec![];
        for doc in std::mem::take(&mut self.dirty) {
            let Some(d) = self.docs.get_mut(&doc) else {
                continue;
            };
            if d.in_flight.is_some() {
                continue;
            }
            let Some(unsaved) = replica.unsaved(&doc) else {
                // Nothing unwritten after all (or not loaded: nothing to write).
                d.durable = d.version;
                continue;
            };
            let appended_bytes: usize = unsaved.changes.iter().map(|(_, b)| b.len()).sum();
            // A snapshot once the change chunks since the last one outweigh it (and at least
            // COMPACT_MIN_BYTES): each byte of change is copied into snapshots a bounded number
            // of times, whatever the document's history.
            let since = d.bytes_since_snapshot + appended_bytes;
            // The save itself (and, for a document loaded from untracked chunks, the listing
            // of its changes) is the driver's, off this thread: here only a copy.
            let due = since > d.snapshot_bytes.max(COMPACT_MIN_BYTES) && !sealing(&doc);
            let compact = match due {
                true => replica.get(&doc).map(|am| Compact {
                    snapshot: Snapshot(Box::new(am.clone())),
                    replaces: (!d.unlisted).then(|| {
                        d.since_snapshot
                            .iter()
                            .cloned()
                            .chain(unsaved.changes.iter().map(|(h, _)| h.to_string()))
                            .collect()
                    }),
                }),
                false => None,
            };
            self.next_id += 1;
            let id = SaveId(self.next_id);
            d.in_flight = Some(InFlight {
                id,
                heads: unsaved.heads,
                version: d.version,
                compacts: compact.is_some(),
                appended: unsaved.changes.iter().map(|(h, _)| h.to_string()).collect(),
                appended_bytes,
            });
            self.in_flight.insert(id, doc.clone());
            out.push(Save {
                id,
                doc,
                changes: unsaved
                    .changes
                    .into_iter()
                    .map(|(h, b)| (h.to_string(), b))
                    .collect(),
                compact,
            });
        }
        out
    }

    /// A write ended. `None` if the id is unknown (answered twice, or from before a restart).
    pub(crate) fn handle_saved(
        &mut self,
        now: Instant,
        id: SaveId,
        result: Result<Saved, StorageFailure>,
        replica: &mut Replica,
    ) -> Option<Acked> {
        let doc = self.in_flight.remove(&id)?;
        let d = self.docs.get_mut(&doc)?;
        let flight = d.in_flight.take().filter(|f| f.id == id)?;
        match result {
            Ok(saved) => {
                self.store_failures = 0;
                self.store_error = None;
                replica.mark_saved(&doc, &flight.heads);
                d.durable = d.durable.max(flight.version);
                d.failures = 0;
                d.last_error = None;
                // A driver that did not say the snapshot's size: count what it replaced.
                let snapshot = flight.compacts.then(|| {
                    saved.snapshot_bytes.unwrap_or(
                        d.snapshot_bytes + d.bytes_since_snapshot + flight.appended_bytes,
                    )
                });
                match snapshot {
                    Some(bytes) => {
                        d.since_snapshot.clear();
                        d.bytes_since_snapshot = 0;
                        d.snapshot_bytes = bytes;
                        d.unlisted = false;
                    }
                    None => {
                        d.since_snapshot.extend(flight.appended);
                        d.bytes_since_snapshot += flight.appended_bytes;
                    }
                }
                if d.version > d.durable {
                    self.dirty.insert(doc.clone());
                }
                Some(Acked::Saved)
            }
            Err(error) => {
                self.store_failures = self.store_failures.saturating_add(1);
                self.store_error = Some(error.clone());
                d.failures = d.failures.saturating_add(1);
                d.last_error = Some(error.clone());
                self.retries
                    .insert((now + retry_delay(d.failures), doc.clone()));
                Some(Acked::Failed {
                    doc,
                    failures: d.failures,
                    error,
                })
            }
        }
    }
}
