//! The disk model: one [`Disk`] per node.
//!
//! It owns what a node stores: chunks by document and key, the queues and epoch documents it
//! remembers, archived statuses, retired documents, the writes in flight (`pending`), the
//! failure windows (`failing_writes_until`, `failing_reads_until`), and the read-back cache the
//! invariants read documents through. Its `impl World` block answers the core's writes, reads
//! and archive lookups when their latency has passed.
//!
//! It asks the parent for the clock and `count`, and the shell for `drive` once a core has its
//! answer. The shell files the core's I/O into it (`pending`, `queues`, `epochs`, `retired`,
//! `archive`, `delete`); the faults open failure windows, and keep or lose the writes in flight
//! at a crash (`apply`); the invariants `read` documents back.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use automerge::Automerge;
use piecework_core::api::StorageFailure;
use piecework_core::{Retired, Save, SaveId, Saved};
use piecework_queue_doc::{QueueId, TaskId};
use piecework_replica::DocId;

use super::World;

/// A document as the invariants last read it back, and the chunks saved since.
type ReadBack = (Automerge, Vec<Vec<u8>>);

/// One node's disk: stored chunks by document and key, and the queues it remembers.
#[derive(Debug, Default)]
pub(super) struct Disk {
    pub(super) docs: BTreeMap<DocId, BTreeMap<String, Vec<u8>>>,
    pub(super) queues: BTreeSet<QueueId>,
    /// The epoch document each queue was last on (`Io::RememberEpoch`), handed back at a
    /// restart.
    pub(super) epochs: BTreeMap<QueueId, DocId>,
    /// Archived final statuses of inline tasks.
    pub(super) archive: BTreeMap<TaskId, Vec<u8>>,
    /// Kept ends of finished tasks, encoded (`Io::Archive`'s `ends`).
    pub(super) ends: BTreeMap<TaskId, Vec<u8>>,
    /// Listing entries of finished tasks, by queue and task (`Io::Archive`'s `listed`).
    pub(super) listing: BTreeMap<(QueueId, TaskId), piecework_core::Listed>,
    /// Retired documents not deleted yet, in the order retired (handed back at a restart).
    pub(super) retired: Vec<(DocId, Retired)>,
    /// Writes in flight (not acknowledged yet).
    pub(super) pending: BTreeMap<SaveId, Save>,
    /// Every write fails until then (virtual µs).
    pub(super) failing_writes_until: u64,
    /// Every read fails until then (virtual µs).
    pub(super) failing_reads_until: u64,
    /// The documents the invariants read back, each with the chunks saved since: applied at
    /// the next read, it equals loading every stored chunk (a compaction or a deletion drops
    /// it). Loading every chunk at every check took a sixth of the simulator's time.
    read_back: RefCell<HashMap<DocId, ReadBack>>,
}

impl Disk {
    pub(super) fn apply(&mut self, save: &Save) -> Saved {
        let chunks = self.docs.entry(save.doc.clone()).or_default();
        for (hash, bytes) in &save.changes {
            chunks.insert(format!("c/{hash}"), bytes.clone());
        }
        let mut read_back = self.read_back.borrow_mut();
        if save.compact.is_some() {
            read_back.remove(&save.doc);
        } else if let Some((_, unread)) = read_back.get_mut(&save.doc) {
            unread.extend(save.changes.iter().map(|(_, bytes)| bytes.clone()));
        }
        if let Some(c) = &save.compact {
            let (snapshot, replaces) = c.clone().build();
            for h in &replaces {
                chunks.remove(&format!("c/{h}"));
            }
            let snapshot_bytes = Some(snapshot.len());
            chunks.insert("a/snapshot".into(), snapshot);
            return Saved { snapshot_bytes };
        }
        Saved::default()
    }

    /// Every chunk of a document, the snapshot first.
    pub(super) fn chunks(&self, doc: &DocId) -> Vec<Vec<u8>> {
        self.docs
            .get(doc)
            .map(|c| c.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Reads a stored document as a node loading it would see it, if any chunk of it is
    /// stored and every chunk loads.
    pub(super) fn read<R>(&self, doc: &DocId, f: impl FnOnce(&Automerge) -> R) -> Option<R> {
        let mut read_back = self.read_back.borrow_mut();
        if let Some((d, unread)) = read_back.get_mut(doc) {
            let applied = std::mem::take(unread)
                .iter()
                .all(|c| d.load_incremental(c).is_ok());
            if applied {
                return Some(f(d));
            }
            read_back.remove(doc);
        }
        let chunks = self.chunks(doc);
        if chunks.is_empty() {
            return None;
        }
        let d = piecework_replica::load_chunks(&chunks).ok()?;
        let r = f(&d);
        read_back.insert(doc.clone(), (d, vec![]));
        Some(r)
    }

    pub(super) fn delete(&mut self, doc: &DocId) {
        self.docs.remove(doc);
        self.read_back.borrow_mut().remove(doc);
    }
}

impl World {
    /// A write ends: applied and acknowledged, or failed inside a write-failure window.
    pub(super) fn saved(&mut self, node: usize, incarnation: u64, id: SaveId) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let Some(save) = self.nodes[node].disk.pending.remove(&id) else {
            return;
        };
        let result = if self.now_us < self.nodes[node].disk.failing_writes_until {
            self.count("save_error");
            Err(StorageFailure("simulated write failure".into()))
        } else {
            Ok(self.nodes[node].disk.apply(&save))
        };
        let t = self.time(node);
        self.nodes[node].core.handle_saved(t, id, result);
        self.drive(node);
    }

    /// A read ends: every chunk of the document, or an error inside a read-failure window.
    pub(super) fn loaded(&mut self, node: usize, incarnation: u64, doc: DocId) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let chunks = if self.now_us < self.nodes[node].disk.failing_reads_until {
            self.count("load_error");
            Err(StorageFailure("simulated read failure".into()))
        } else {
            Ok(self.nodes[node].disk.chunks(&doc))
        };
        let t = self.time(node);
        self.nodes[node].core.handle_loaded(t, &doc, chunks);
        self.drive(node);
    }

    /// An archive lookup is answered.
    pub(super) fn archived(&mut self, node: usize, incarnation: u64, task: TaskId) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let status = self.nodes[node].disk.archive.get(&task).cloned();
        let t = self.time(node);
        self.nodes[node].core.handle_archived(t, task, status);
        self.drive(node);
    }

    /// A lookup of kept ends ([`piecework_core::Io::LookupEnds`]): of `tasks`, and of the
    /// tasks listed failed in `failed_in`.
    pub(super) fn ends_read(
        &mut self,
        node: usize,
        incarnation: u64,
        lookup: u64,
        tasks: Vec<TaskId>,
        failed_in: Option<QueueId>,
    ) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let disk = &self.nodes[node].disk;
        let mut wanted: BTreeSet<TaskId> = tasks.into_iter().collect();
        if let Some(q) = &failed_in {
            wanted.extend(
                disk.listing
                    .range((q.clone(), TaskId::new(""))..)
                    .take_while(|((lq, _), _)| lq == q)
                    .filter(|(_, l)| l.state == piecework_queue_doc::TaskState::Failed)
                    .map(|((_, t), _)| t.clone()),
            );
        }
        let found: Vec<(TaskId, Vec<u8>)> = wanted
            .into_iter()
            .filter_map(|t| disk.ends.get(&t).map(|e| (t, e.clone())))
            .collect();
        self.count("ends_looked_up");
        for _ in &found {
            self.count("ends_found");
        }
        let t = self.time(node);
        self.nodes[node].core.handle_ends(t, lookup, found);
        self.drive(node);
    }

    /// A listing's read of the finished tasks of a queue ([`piecework_core::Io::ListFinished`]).
    pub(super) fn listed(
        &mut self,
        node: usize,
        incarnation: u64,
        cmd: piecework_core::CommandId,
        read: ListRead,
    ) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let entries = self.nodes[node]
            .disk
            .listing
            .range((read.queue.clone(), TaskId::new(""))..)
            .take_while(|((q, _), _)| *q == read.queue)
            .filter(|((_, t), l)| {
                read.after.as_ref().is_none_or(|a| t > a) && read.state.is_none_or(|s| s == l.state)
            })
            .take(read.limit)
            .map(|(_, l)| l.entry.clone())
            .collect();
        let t = self.time(node);
        self.nodes[node].core.handle_listed(t, cmd, entries);
        self.drive(node);
    }
}

/// What a listing reads from the disk.
#[derive(Debug)]
pub(super) struct ListRead {
    pub(super) queue: QueueId,
    pub(super) state: Option<piecework_queue_doc::TaskState>,
    pub(super) after: Option<TaskId>,
    pub(super) limit: usize,
}
