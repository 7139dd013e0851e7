//! On-disk storage: one redb file per node holding every document, plus the node's own metadata
//! (its incarnation counter and the queues it joined).
//!
//! A document is stored as chunks under its id: `<doc>/c/<change hash>` for each change as it is
//! made or received, and `<doc>/s` for a snapshot that replaces them when they grow many
//! ([`Store::compact`]). Loading reads every chunk of the document in one range scan.
//!
//! The `archive` table keeps the final status of inline tasks (tasks with no task document,
//! see `piecework_core::Config::inline_input_max`) once their queue document stops carrying
//! them: task id → status JSON. It keeps the latest [`ARCHIVE_KEEP`] tasks; an `archive_order`
//! table (sequence → task id) says which are the oldest.
//!
//! The `listing` table keeps the listing entry of every task that became final here (its
//! status without runs, `piecework_core::Listed`), keyed `<queue> <state> <task>` so that a
//! queue's finished tasks in one state are one range scan in task id order; a
//! `listing_order` table drops the oldest beyond the same bound as the archive's.
//!
//! The `ends` table keeps the end of every task that became final here (its entry and runs'
//! records as the queue document held them, `piecework_queue_doc::epoch::TaskEnd::encode`):
//! task id → bytes, the latest written kept, with an `ends_order` table and the same bound as
//! the archive's. A requeue or an undo of a task that left every live document reads it back.
//!
//! The `retired` tables record, in order, the documents the node no longer needs except to
//! answer for them (`piecework_core::Io::Retire`: document → sequence, and sequence → kind and
//! document): the core gets the list back at start and decides which to delete
//! ([`Store::delete_doc`] removes a document's chunks and its record in one transaction).
//!
//! Writes go through one writer thread that commits them in groups: every write waiting when a
//! transaction starts joins it (at most [`MAX_BATCH`]), and all of them are acknowledged after
//! the one durable commit. A write is acknowledged only once it is on disk. Reads run on tokio's
//! blocking pool against redb's snapshot reads.
//!
//! # I/O errors
//!
//! redb latches its first I/O error: every later read and write of that `Database` fails
//! (`PreviousIo`). So any failed read or commit drops the database, opens the file again (redb
//! repairs it to its last commit) and tries once more; while it cannot be opened (the repair
//! writes, so a full disk refuses it too) reads fail as well, and every access tries again. The writes nobody waits on — archived
//! statuses, retirement records, deletions and a queue's epoch (`piecework_core::Io::Archive`,
//! `Retire`, `Delete`, `RememberEpoch`) and a queue's record (`RememberQueue`, which a create
//! or join waits on through its document's write) — are not dropped when a commit fails: the writer
//! keeps them, in order, and commits them before the next writes (at the latest after
//! [`KEPT_RETRY`]), so a later one for the same key still lands last. At most [`MAX_KEPT`] are
//! kept. A chunk that does not decode can be moved aside into a `quarantine` table
//! ([`Store::quarantine`]), so that the rest of its document loads and it is reported once.
//!
//! [`DiskFault`] makes the store's file act as a full disk, for tests.

use std::collections::VecDeque;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use redb::backends::FileBackend;
use redb::{
    BackendError, Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend,
    TableDefinition,
};
use tokio::sync::oneshot;

const CHUNKS: TableDefinition<&str, &[u8]> = TableDefinition::new("chunks");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const QUEUES: TableDefinition<&str, &str> = TableDefinition::new("queues");
const ARCHIVE: TableDefinition<&str, &[u8]> = TableDefinition::new("archive");
const ARCHIVE_ORDER: TableDefinition<u64, &str> = TableDefinition::new("archive_order");
const RETIRED: TableDefinition<&str, u64> = TableDefinition::new("retired");
const RETIRED_ORDER: TableDefinition<u64, &str> = TableDefinition::new("retired_order");
const QUARANTINE: TableDefinition<&str, &[u8]> = TableDefinition::new("quarantine");
const LISTING: TableDefinition<&str, &[u8]> = TableDefinition::new("listing");
const LISTING_ORDER: TableDefinition<u64, &str> = TableDefinition::new("listing_order");
const ENDS: TableDefinition<&str, &[u8]> = TableDefinition::new("ends");
const ENDS_ORDER: TableDefinition<u64, &str> = TableDefinition::new("ends_order");

/// The final states a listing entry is kept under.
const FINAL_STATES: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// Archived task statuses kept, at most: the oldest go first.
pub const ARCHIVE_KEEP: u64 = 100_000;

/// redb's page cache (its default is 1 GiB, which a node that only appends and reads a
/// document back now and then does not need: the cache grows with what was written, and at
/// 32 MiB it was a third of a node's heap at its peak). Reads it misses go to the operating
/// system's page cache.
pub const CACHE_BYTES: usize = 4 << 20;

/// Writes committed in one transaction, at most.
pub const MAX_BATCH: usize = 512;
/// Writes waiting for the writer thread, at most (callers wait for room).
pub const WRITE_QUEUE: usize = 4096;
/// Writes nobody waits on (archive, retirement, deletion, epoch records) kept after a failed
/// commit, at most: as many as one full write queue. A disk full for long enough drops the
/// oldest beyond it, with an error logged; what is lost then is an archived status, a deletion
/// of a retired document (its disk space) or a resume point, never a task.
pub const MAX_KEPT: usize = WRITE_QUEUE;
/// How long the writer waits, holding writes kept after a failed commit, before it tries them
/// again with no new write to carry them: about the longest retry delay of the core's saves
/// (`piecework_core::SAVE_RETRY_MAX`), so a store that fails is tried at least that often.
pub const KEPT_RETRY: Duration = Duration::from_secs(5);

/// Opening or using the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// redb failed.
    #[error("storage: {0}")]
    Redb(String),
    /// The writer thread is gone.
    #[error("storage writer stopped")]
    Stopped,
}

impl StorageError {
    /// The error without the `storage:` its display begins with, for an error that says so
    /// already (`piecework_core::api::StorageFailure`).
    pub fn detail(&self) -> String {
        match self {
            StorageError::Redb(m) => m.clone(),
            other => other.to_string(),
        }
    }
}

fn redb_err(e: impl std::fmt::Display) -> StorageError {
    StorageError::Redb(e.to_string())
}

/// A switch that makes a store's file act as a full disk: while it is on, every write and
/// every change of the file's length fails with `ENOSPC` (reads still work). For tests of what
/// a node does on a full disk ([`Store::open_with`]); a store opened without one pays nothing.
#[derive(Clone, Debug, Default)]
pub struct DiskFault(Arc<AtomicBool>);

impl DiskFault {
    /// A switch, off.
    pub fn new() -> DiskFault {
        DiskFault::default()
    }

    /// Turns the full disk on or off.
    pub fn set_full(&self, full: bool) {
        self.0.store(full, Ordering::SeqCst);
    }

    fn check(&self) -> std::io::Result<()> {
        match self.0.load(Ordering::SeqCst) {
            true => Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device (a full disk, simulated)",
            )),
            false => Ok(()),
        }
    }
}

/// redb's file backend, failing writes while a [`DiskFault`] is on.
#[derive(Debug)]
struct Backend {
    file: FileBackend,
    fault: Option<DiskFault>,
}

impl Backend {
    fn fault(&self) -> std::io::Result<()> {
        self.fault.as_ref().map_or(Ok(()), DiskFault::check)
    }
}

impl StorageBackend for Backend {
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.fault()?;
        self.file.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.fault()?;
        self.file.write(offset, data)
    }

    fn close(&self) -> std::io::Result<()> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// The database, reopened after an error (see the module's doc).
struct Db {
    path: PathBuf,
    fault: Option<DiskFault>,
    /// `None` while it could not be opened again.
    slot: RwLock<Option<Database>>,
    /// Opens so far: a caller that saw an error reopens only if nobody did since.
    opens: AtomicU64,
}

impl Db {
    fn open_file(path: &Path, fault: Option<&DiskFault>) -> Result<Database, StorageError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| StorageError::Redb(format!("cannot open {}: {e}", path.display())))?;
        let backend = Backend {
            file: FileBackend::new(file).map_err(redb_err)?,
            fault: fault.cloned(),
        };
        Database::builder()
            .set_cache_size(CACHE_BYTES)
            .create_with_backend(backend)
            .map_err(redb_err)
    }

    /// Creates the tables a new store lacks (at the first open only: a reopen on a full disk
    /// must not need a write).
    fn create_tables(db: &Database) -> Result<(), StorageError> {
        let tx = db.begin_write().map_err(redb_err)?;
        tx.open_table(CHUNKS).map_err(redb_err)?;
        tx.open_table(META).map_err(redb_err)?;
        tx.open_table(QUEUES).map_err(redb_err)?;
        tx.open_table(ARCHIVE).map_err(redb_err)?;
        tx.open_table(ARCHIVE_ORDER).map_err(redb_err)?;
        tx.open_table(RETIRED).map_err(redb_err)?;
        tx.open_table(RETIRED_ORDER).map_err(redb_err)?;
        tx.open_table(QUARANTINE).map_err(redb_err)?;
        tx.open_table(LISTING).map_err(redb_err)?;
        tx.open_table(LISTING_ORDER).map_err(redb_err)?;
        tx.open_table(ENDS).map_err(redb_err)?;
        tx.open_table(ENDS_ORDER).map_err(redb_err)?;
        tx.commit().map_err(redb_err)
    }

    /// Runs `f` on the database; if it fails, reopens the database and runs it once more.
    fn with<T>(&self, f: impl Fn(&Database) -> Result<T, StorageError>) -> Result<T, StorageError> {
        let opens = self.opens.load(Ordering::SeqCst);
        let first = {
            let slot = self.slot.read().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(db) => f(db),
                None => Err(StorageError::Redb("the store is not open".into())),
            }
        };
        let Err(e) = first else { return first };
        self.reopen(opens, &e)?;
        let slot = self.slot.read().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(db) => f(db),
            None => Err(e),
        }
    }

    /// Drops the database and opens its file again, unless another caller did since `seen`;
    /// the error of that open, if it failed.
    fn reopen(&self, seen: u64, error: &StorageError) -> Result<(), StorageError> {
        let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
        if self.opens.load(Ordering::SeqCst) != seen && slot.is_some() {
            return Ok(());
        }
        // The file is released before it is opened again (redb locks it).
        let was_open = slot.take().is_some();
        self.opens.fetch_add(1, Ordering::SeqCst);
        match Db::open_file(&self.path, self.fault.as_ref()) {
            Ok(db) => {
                tracing::warn!("storage failed ({error}): the store is reopened");
                *slot = Some(db);
                Ok(())
            }
            Err(e) => {
                if was_open {
                    tracing::error!("storage failed ({error}); it cannot be reopened yet: {e}");
                }
                Err(StorageError::Redb(format!(
                    "the store cannot be reopened after an I/O error: {e}"
                )))
            }
        }
    }
}

enum Write {
    Append(Vec<(String, Vec<u8>)>),
    Compact {
        snapshot: (String, Vec<u8>),
        drop: Vec<String>,
    },
    Meta(String, Vec<u8>),
    Queue(String, String),
    Archive {
        records: Vec<(String, Vec<u8>)>,
        keep: u64,
    },
    List {
        /// `<queue> <state> <task>` and the listing entry.
        records: Vec<(String, Vec<u8>)>,
        /// Keys of the same tasks under the other final states: emptied where present (an
        /// empty entry is read as none; it keeps its place in `listing_order`).
        stale: Vec<String>,
        keep: u64,
    },
    Ends {
        /// Task and its encoded end.
        records: Vec<(String, Vec<u8>)>,
        keep: u64,
    },
    Retire {
        doc: String,
        kind: RetiredKind,
    },
    Delete(String),
    Quarantine {
        doc: String,
        chunk: Vec<u8>,
    },
}

impl Write {
    /// Whether the writer keeps the write after a failed commit, to commit it later: nobody
    /// waits on it (see the module's doc).
    fn kept(&self) -> bool {
        match self {
            Write::Archive { .. }
            | Write::List { .. }
            | Write::Ends { .. }
            | Write::Retire { .. }
            | Write::Delete(_)
            | Write::Quarantine { .. } => true,
            Write::Queue(..) => true,
            Write::Meta(k, _) => k.starts_with(EPOCH_PREFIX),
            Write::Append(_) | Write::Compact { .. } => false,
        }
    }
}

/// Why a document was retired (as `piecework_core::Retired`, which this crate's storage does
/// not name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetiredKind {
    /// A finished task's document.
    Task,
    /// A sealed epoch document.
    Epoch,
}

impl RetiredKind {
    fn tag(self) -> char {
        match self {
            RetiredKind::Task => 't',
            RetiredKind::Epoch => 'e',
        }
    }
}

struct Request {
    write: Write,
    done: oneshot::Sender<Result<(), String>>,
}

/// The node's store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Arc<Db>,
    writes: std_mpsc::SyncSender<Request>,
    closed: tokio::sync::watch::Receiver<bool>,
    archive_keep: u64,
}

/// Resolves once a store's writer thread has stopped and released the database file, so the
/// same data directory can be opened again (a node restarted in the same process).
#[derive(Debug)]
pub struct Closed(tokio::sync::watch::Receiver<bool>);

impl Closed {
    /// Waits for the release.
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|c| *c).await;
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn change_key(doc: &str, hash: &str) -> String {
    format!("{doc}/c/{hash}")
}

fn snapshot_key(doc: &str) -> String {
    format!("{doc}/s")
}

impl Store {
    /// Opens (or creates) the store at `path` and starts its writer thread.
    pub fn open(path: &Path) -> Result<Store, StorageError> {
        Store::open_with(path, None)
    }

    /// Opens the store at `path`, its writes failing while `fault` is on (for tests).
    pub fn open_with(path: &Path, fault: Option<DiskFault>) -> Result<Store, StorageError> {
        let first = Db::open_file(path, fault.as_ref())?;
        Db::create_tables(&first)?;
        let db = Arc::new(Db {
            path: path.to_owned(),
            slot: RwLock::new(Some(first)),
            fault,
            opens: AtomicU64::new(0),
        });
        let (tx, rx) = std_mpsc::sync_channel(WRITE_QUEUE);
        let (closed_tx, closed) = tokio::sync::watch::channel(false);
        let writer_db = db.clone();
        std::thread::Builder::new()
            .name("piecework-store".into())
            .spawn(move || {
                writer(&writer_db, &rx);
                drop(writer_db);
                let _ = closed_tx.send(true);
            })
            .map_err(redb_err)?;
        Ok(Store {
            db,
            writes: tx,
            closed,
            archive_keep: ARCHIVE_KEEP,
        })
    }

    /// The same store, keeping at most `keep` archived statuses ([`ARCHIVE_KEEP`] by default).
    pub fn with_archive_keep(mut self, keep: u64) -> Store {
        self.archive_keep = keep;
        self
    }

    /// A signal for when the last handle is gone and the file released (see [`Closed`]).
    pub fn closed(&self) -> Closed {
        Closed(self.closed.clone())
    }

    /// Hands `write` to the writer at once while its queue has room (the usual case), so that
    /// a write enqueued before another commits no later than it; the future answers once it is
    /// committed. With the queue full, the future waits for room, off the async threads.
    fn enqueue(
        &self,
        write: Write,
    ) -> impl std::future::Future<Output = Result<(), StorageError>> + Send + 'static {
        let (done, rx) = oneshot::channel();
        let waiting = match self.writes.try_send(Request { write, done }) {
            Ok(()) => None,
            Err(std_mpsc::TrySendError::Full(r)) => Some(r),
            // The writer is gone: the request is dropped, and `rx` says so.
            Err(std_mpsc::TrySendError::Disconnected(_)) => None,
        };
        let writes = self.writes.clone();
        async move {
            if let Some(r) = waiting {
                tokio::task::spawn_blocking(move || writes.send(r))
                    .await
                    .map_err(|_| StorageError::Stopped)?
                    .map_err(|_| StorageError::Stopped)?;
            }
            rx.await
                .map_err(|_| StorageError::Stopped)?
                .map_err(StorageError::Redb)
        }
    }

    async fn write(&self, write: Write) -> Result<(), StorageError> {
        self.enqueue(write).await
    }

    /// Stores changes of `doc` (hash in hex, raw bytes) durably. Enqueued at the call (see
    /// [`Store::add_queue`]); the future answers once they are on disk.
    pub fn append(
        &self,
        doc: &str,
        changes: Vec<(String, Vec<u8>)>,
    ) -> impl std::future::Future<Output = Result<(), StorageError>> + Send + 'static {
        let pending = (!changes.is_empty()).then(|| {
            let chunks = changes
                .into_iter()
                .map(|(h, b)| (change_key(doc, &h), b))
                .collect();
            self.enqueue(Write::Append(chunks))
        });
        async move {
            match pending {
                Some(p) => p.await,
                None => Ok(()),
            }
        }
    }

    /// Replaces every chunk of `doc` known as `changes` (hashes in hex) with one snapshot, in one
    /// transaction.
    pub async fn compact(
        &self,
        doc: &str,
        snapshot: Vec<u8>,
        changes: Vec<String>,
    ) -> Result<(), StorageError> {
        let drop = changes.iter().map(|h| change_key(doc, h)).collect();
        self.write(Write::Compact {
            snapshot: (snapshot_key(doc), snapshot),
            drop,
        })
        .await
    }

    /// Every chunk of `doc`: the snapshot first if there is one, then its changes; empty if the
    /// document is not stored.
    pub async fn load_doc(&self, doc: &str) -> Result<Vec<Vec<u8>>, StorageError> {
        let db = self.db.clone();
        let doc = doc.to_owned();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let mut rows = Store::load_range_blocking(db, &doc)?;
                let snap = snapshot_key(&doc);
                rows.sort_by_key(|(k, _)| *k != snap);
                Ok(rows.into_iter().map(|(_, v)| v).collect())
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// Reads a metadata value.
    pub async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let db = self.db.clone();
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = tx.open_table(META).map_err(redb_err)?;
                Ok(t.get(key.as_str())
                    .map_err(redb_err)?
                    .map(|v| v.value().to_vec()))
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// Writes a metadata value durably.
    pub async fn set_meta(&self, key: &str, value: Vec<u8>) -> Result<(), StorageError> {
        self.write(Write::Meta(key.to_owned(), value)).await
    }

    /// Remembers the epoch document a queue is on (see `piecework_core::Io::RememberEpoch`).
    pub async fn set_epoch(&self, queue: &str, doc: &str) -> Result<(), StorageError> {
        self.set_meta(&epoch_key(queue), doc.as_bytes().to_vec())
            .await
    }

    /// The epoch document a queue was last remembered on, if any.
    pub async fn epoch(&self, queue: &str) -> Result<Option<String>, StorageError> {
        Ok(self
            .meta(&epoch_key(queue))
            .await?
            .and_then(|b| String::from_utf8(b).ok()))
    }

    /// Remembers a joined queue (id → name) durably. Enqueued at the call, so a write of the
    /// queue's document enqueued after it commits in the same transaction or a later one; a
    /// failed commit keeps the record and commits it before the next writes. So once the
    /// queue document is on disk, so is its record.
    pub fn add_queue(
        &self,
        id: &str,
        name: &str,
    ) -> impl std::future::Future<Output = Result<(), StorageError>> + Send + 'static {
        self.enqueue(Write::Queue(id.to_owned(), name.to_owned()))
    }

    /// Archives final task statuses (task id → JSON) durably: a task archived again keeps its
    /// place and takes the new value; beyond [`ARCHIVE_KEEP`] the oldest are dropped.
    pub async fn archive(&self, records: Vec<(String, Vec<u8>)>) -> Result<(), StorageError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(Write::Archive {
            records,
            keep: self.archive_keep,
        })
        .await
    }

    /// Keeps listing entries of finished tasks (queue, final state, task → entry) durably: an
    /// entry written again keeps its place; beyond the archive's bound the oldest are dropped.
    pub async fn list(
        &self,
        records: Vec<(String, &'static str, String, Vec<u8>)>,
    ) -> Result<(), StorageError> {
        if records.is_empty() {
            return Ok(());
        }
        // A task listed in one final state is listed in no other (a dead letter requeued,
        // that succeeded since): its entries under the others, if any, are emptied.
        let stale = records
            .iter()
            .flat_map(|(queue, state, task, _)| {
                FINAL_STATES
                    .iter()
                    .filter(move |s| *s != state)
                    .map(move |s| format!("{queue} {s} {task}"))
            })
            .collect();
        let records = records
            .into_iter()
            .map(|(queue, state, task, entry)| (format!("{queue} {state} {task}"), entry))
            .collect();
        self.write(Write::List {
            records,
            stale,
            keep: self.archive_keep,
        })
        .await
    }

    /// The listing entries of `queue`'s finished tasks in `state` (each final state if
    /// `None`), by task id after `after`: at most `limit`.
    pub async fn listed(
        &self,
        queue: &str,
        state: Option<&'static str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let db = self.db.clone();
        let queue = queue.to_owned();
        let after = after.map(str::to_owned);
        let states: Vec<&'static str> = match state {
            Some(s) => vec![s],
            None => FINAL_STATES.to_vec(),
        };
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = match tx.open_table(LISTING) {
                    Ok(t) => t,
                    // A store from before listings: nothing listed yet.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![]),
                    Err(e) => return Err(redb_err(e)),
                };
                let mut found: Vec<(String, Vec<u8>)> = Vec::new();
                for s in &states {
                    let prefix = format!("{queue} {s} ");
                    let lo = match &after {
                        Some(a) => format!("{prefix}{a}\u{1}"),
                        None => prefix.clone(),
                    };
                    let hi = format!("{queue} {s}!");
                    let mut taken = 0;
                    for row in t.range(lo.as_str()..hi.as_str()).map_err(redb_err)? {
                        if taken == limit {
                            break;
                        }
                        let (k, v) = row.map_err(redb_err)?;
                        // Emptied: the task is listed in another state now.
                        if v.value().is_empty() {
                            continue;
                        }
                        let task = k.value()[prefix.len()..].to_owned();
                        found.push((task, v.value().to_vec()));
                        taken += 1;
                    }
                }
                found.sort_by(|a, b| a.0.cmp(&b.0));
                found.truncate(limit);
                Ok(found.into_iter().map(|(_, v)| v).collect())
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// Keeps the ends of tasks that became final (task id → encoded end) durably: a task's
    /// end written again keeps its place and takes the new value; beyond the archive's bound
    /// the oldest are dropped.
    pub async fn keep_ends(&self, records: Vec<(String, Vec<u8>)>) -> Result<(), StorageError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(Write::Ends {
            records,
            keep: self.archive_keep,
        })
        .await
    }

    /// The kept ends of `tasks` (those it has), and with `failed_in`, of every task listed
    /// failed in that queue (`listed`'s entries): task id → encoded end, in task id order.
    pub async fn ends(
        &self,
        tasks: Vec<String>,
        failed_in: Option<String>,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = match tx.open_table(ENDS) {
                    Ok(t) => t,
                    // A store from before kept ends: none kept.
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(vec![]),
                    Err(e) => return Err(redb_err(e)),
                };
                let mut wanted: std::collections::BTreeSet<String> =
                    tasks.iter().cloned().collect();
                if let Some(q) = &failed_in {
                    match tx.open_table(LISTING) {
                        Ok(l) => {
                            let prefix = format!("{q} failed ");
                            let hi = format!("{q} failed!");
                            for row in l.range(prefix.as_str()..hi.as_str()).map_err(redb_err)? {
                                let (k, v) = row.map_err(redb_err)?;
                                if !v.value().is_empty() {
                                    wanted.insert(k.value()[prefix.len()..].to_owned());
                                }
                            }
                        }
                        Err(redb::TableError::TableDoesNotExist(_)) => {}
                        Err(e) => return Err(redb_err(e)),
                    }
                }
                let mut found = Vec::new();
                for task in wanted {
                    if let Some(v) = t.get(task.as_str()).map_err(redb_err)? {
                        let bytes = v.value().to_vec();
                        found.push((task, bytes));
                    }
                }
                Ok(found)
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// A task's archived status.
    pub async fn archived(&self, task: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let db = self.db.clone();
        let task = task.to_owned();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = tx.open_table(ARCHIVE).map_err(redb_err)?;
                Ok(t.get(task.as_str())
                    .map_err(redb_err)?
                    .map(|v| v.value().to_vec()))
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// Records, durably and after those recorded before, that `doc` is retired; a document
    /// recorded already keeps its place.
    pub async fn retire(&self, doc: &str, kind: RetiredKind) -> Result<(), StorageError> {
        self.write(Write::Retire {
            doc: doc.to_owned(),
            kind,
        })
        .await
    }

    /// Deletes every chunk of `doc` and its retirement record, in one transaction.
    pub async fn delete_doc(&self, doc: &str) -> Result<(), StorageError> {
        self.write(Write::Delete(doc.to_owned())).await
    }

    /// Moves a chunk of `doc` that does not decode (found by its bytes) out of the document,
    /// into the `quarantine` table under its key, so that the rest of the document loads and
    /// the chunk is kept for a human to look at.
    pub async fn quarantine(&self, doc: &str, chunk: Vec<u8>) -> Result<(), StorageError> {
        self.write(Write::Quarantine {
            doc: doc.to_owned(),
            chunk,
        })
        .await
    }

    /// The chunks moved aside ([`Store::quarantine`]): key and bytes.
    pub async fn quarantined(&self) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = tx.open_table(QUARANTINE).map_err(redb_err)?;
                let mut out = vec![];
                for row in t.iter().map_err(redb_err)? {
                    let (k, v) = row.map_err(redb_err)?;
                    out.push((k.value().to_owned(), v.value().to_vec()));
                }
                Ok(out)
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// The retired documents not deleted yet, in the order they were retired.
    pub async fn retired(&self) -> Result<Vec<(String, RetiredKind)>, StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = tx.open_table(RETIRED_ORDER).map_err(redb_err)?;
                let mut out = vec![];
                for row in t.iter().map_err(redb_err)? {
                    let (_, v) = row.map_err(redb_err)?;
                    let v = v.value();
                    let kind = match v.split_once(':') {
                        Some(("t", _)) => RetiredKind::Task,
                        Some(("e", _)) => RetiredKind::Epoch,
                        _ => {
                            tracing::warn!("ignoring a malformed retirement record {v:?}");
                            continue;
                        }
                    };
                    out.push((v[2..].to_owned(), kind));
                }
                Ok(out)
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    /// The joined queues (id → name).
    pub async fn queues(&self) -> Result<Vec<(String, String)>, StorageError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || {
            db.with(|db| {
                let tx = db.begin_read().map_err(redb_err)?;
                let t = tx.open_table(QUEUES).map_err(redb_err)?;
                let mut out = vec![];
                for row in t.iter().map_err(redb_err)? {
                    let (k, v) = row.map_err(redb_err)?;
                    out.push((k.value().to_owned(), v.value().to_owned()));
                }
                Ok(out)
            })
        })
        .await
        .map_err(|_| StorageError::Stopped)?
    }

    fn load_range_blocking(
        db: &Database,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, StorageError> {
        let tx = db.begin_read().map_err(redb_err)?;
        let t = tx.open_table(CHUNKS).map_err(redb_err)?;
        let mut out = vec![];
        if let Some(v) = t.get(prefix).map_err(redb_err)? {
            out.push((prefix.to_owned(), v.value().to_vec()));
        }
        // Keys under `prefix/…`: components never contain '/', and '0' follows '/'.
        let lo = format!("{prefix}/");
        let hi = format!("{prefix}0");
        for row in t.range(lo.as_str()..hi.as_str()).map_err(redb_err)? {
            let (k, v) = row.map_err(redb_err)?;
            out.push((k.value().to_owned(), v.value().to_vec()));
        }
        Ok(out)
    }
}

fn writer(db: &Db, rx: &std_mpsc::Receiver<Request>) {
    // Writes nobody waits on, kept after a failed commit, oldest first.
    let mut kept: VecDeque<Write> = VecDeque::new();
    loop {
        let first = match kept.is_empty() {
            true => match rx.recv() {
                Ok(r) => Some(r),
                Err(_) => break,
            },
            false => match rx.recv_timeout(KEPT_RETRY) {
                Ok(r) => Some(r),
                Err(std_mpsc::RecvTimeoutError::Timeout) => None,
                Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                    // Shutting down: one last try.
                    let held: Vec<&Write> = kept.iter().collect();
                    if let Err(e) = db.with(|d| commit(d, &held)) {
                        tracing::error!(
                            "storage: {} kept writes are lost at shutdown: {e}",
                            kept.len()
                        );
                    }
                    break;
                }
            },
        };
        let mut batch: Vec<Request> = first.into_iter().collect();
        while !batch.is_empty() && batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        // The kept writes first: later writes for the same key land after them.
        let writes: Vec<&Write> = kept.iter().chain(batch.iter().map(|r| &r.write)).collect();
        let result = db.with(|d| commit(d, &writes)).map_err(|e| e.detail());
        drop(writes);
        match &result {
            Ok(()) => {
                if !kept.is_empty() {
                    tracing::info!("storage: {} kept writes committed", kept.len());
                    kept.clear();
                }
            }
            Err(e) => {
                tracing::error!("storage commit failed: {e}");
                for r in &mut batch {
                    if r.write.kept() {
                        // Its caller hears of the failure; the write is kept.
                        kept.push_back(std::mem::replace(&mut r.write, Write::Append(vec![])));
                    }
                }
                let mut dropped = 0;
                while kept.len() > MAX_KEPT {
                    kept.pop_front();
                    dropped += 1;
                }
                if dropped > 0 {
                    tracing::error!(
                        "storage: {dropped} kept writes dropped (more than {MAX_KEPT} kept)"
                    );
                }
            }
        }
        for r in batch {
            let _ = r.done.send(result.clone());
        }
    }
}

/// Writes `records` into `table`, a record written again keeping its place in `order`
/// (sequence → key), and drops the oldest beyond `keep`.
fn insert_kept(
    table: &mut redb::Table<&str, &[u8]>,
    order: &mut redb::Table<u64, &str>,
    records: &[(String, Vec<u8>)],
    keep: u64,
) -> Result<(), StorageError> {
    let mut next = order
        .last()
        .map_err(redb_err)?
        .map_or(0, |(k, _)| k.value() + 1);
    for (key, value) in records {
        let known = table
            .insert(key.as_str(), value.as_slice())
            .map_err(redb_err)?
            .is_some();
        if !known {
            order.insert(next, key.as_str()).map_err(redb_err)?;
            next += 1;
        }
    }
    while order.len().map_err(redb_err)? > keep {
        let Some((_, key)) = order.pop_first().map_err(redb_err)? else {
            break;
        };
        table.remove(key.value()).map_err(redb_err)?;
    }
    Ok(())
}

fn commit(db: &Database, batch: &[&Write]) -> Result<(), StorageError> {
    let tx = db.begin_write().map_err(redb_err)?;
    {
        let mut chunks = tx.open_table(CHUNKS).map_err(redb_err)?;
        let mut meta = tx.open_table(META).map_err(redb_err)?;
        let mut queues = tx.open_table(QUEUES).map_err(redb_err)?;
        let mut archive = tx.open_table(ARCHIVE).map_err(redb_err)?;
        let mut order = tx.open_table(ARCHIVE_ORDER).map_err(redb_err)?;
        let mut retired = tx.open_table(RETIRED).map_err(redb_err)?;
        let mut retired_order = tx.open_table(RETIRED_ORDER).map_err(redb_err)?;
        let mut quarantine = tx.open_table(QUARANTINE).map_err(redb_err)?;
        let mut listing = tx.open_table(LISTING).map_err(redb_err)?;
        let mut listing_order = tx.open_table(LISTING_ORDER).map_err(redb_err)?;
        let mut ends = tx.open_table(ENDS).map_err(redb_err)?;
        let mut ends_order = tx.open_table(ENDS_ORDER).map_err(redb_err)?;
        for w in batch {
            match w {
                Write::Append(list) => {
                    for (k, v) in list {
                        chunks.insert(k.as_str(), v.as_slice()).map_err(redb_err)?;
                    }
                }
                Write::Compact { snapshot, drop } => {
                    chunks
                        .insert(snapshot.0.as_str(), snapshot.1.as_slice())
                        .map_err(redb_err)?;
                    for k in drop {
                        chunks.remove(k.as_str()).map_err(redb_err)?;
                    }
                }
                Write::Meta(k, v) => {
                    meta.insert(k.as_str(), v.as_slice()).map_err(redb_err)?;
                }
                Write::Queue(k, v) => {
                    queues.insert(k.as_str(), v.as_str()).map_err(redb_err)?;
                }
                Write::Archive { records, keep } => {
                    insert_kept(&mut archive, &mut order, records, *keep)?;
                }
                Write::List {
                    records,
                    stale,
                    keep,
                } => {
                    for k in stale {
                        if listing
                            .get(k.as_str())
                            .map_err(redb_err)?
                            .is_some_and(|v| !v.value().is_empty())
                        {
                            listing.insert(k.as_str(), &[][..]).map_err(redb_err)?;
                        }
                    }
                    insert_kept(&mut listing, &mut listing_order, records, *keep)?;
                }
                Write::Ends { records, keep } => {
                    insert_kept(&mut ends, &mut ends_order, records, *keep)?;
                }
                Write::Retire { doc, kind } => {
                    if retired.get(doc.as_str()).map_err(redb_err)?.is_none() {
                        let next = retired_order
                            .last()
                            .map_err(redb_err)?
                            .map_or(0, |(k, _)| k.value() + 1);
                        let record = format!("{}:{doc}", kind.tag());
                        retired_order
                            .insert(next, record.as_str())
                            .map_err(redb_err)?;
                        retired.insert(doc.as_str(), next).map_err(redb_err)?;
                    }
                }
                Write::Delete(doc) => {
                    chunks.remove(doc.as_str()).map_err(redb_err)?;
                    // Keys under `doc/…`, as `load_range_blocking` reads them.
                    let lo = format!("{doc}/");
                    let hi = format!("{doc}0");
                    chunks
                        .retain_in(lo.as_str()..hi.as_str(), |_, _| false)
                        .map_err(redb_err)?;
                    if let Some(seq) = retired.remove(doc.as_str()).map_err(redb_err)? {
                        retired_order.remove(seq.value()).map_err(redb_err)?;
                    }
                }
                Write::Quarantine { doc, chunk } => {
                    // The chunk's key: the snapshot's, or a change's with the same bytes.
                    let lo = format!("{doc}/");
                    let hi = format!("{doc}0");
                    let mut keys = vec![];
                    for row in chunks.range(lo.as_str()..hi.as_str()).map_err(redb_err)? {
                        let (k, v) = row.map_err(redb_err)?;
                        if v.value() == chunk.as_slice() {
                            keys.push(k.value().to_owned());
                        }
                    }
                    for k in keys {
                        chunks.remove(k.as_str()).map_err(redb_err)?;
                        quarantine
                            .insert(k.as_str(), chunk.as_slice())
                            .map_err(redb_err)?;
                    }
                }
            }
        }
    }
    tx.commit().map_err(redb_err)
}

/// The prefix of the metadata keys under which queues' current epoch documents are remembered.
const EPOCH_PREFIX: &str = "epoch/";

/// The metadata key under which a queue's current epoch document is remembered.
fn epoch_key(queue: &str) -> String {
    format!("{EPOCH_PREFIX}{queue}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn documents_survive_reopening_and_ranges_stop_at_the_document() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        {
            let s = Store::open(&path).unwrap();
            s.append(
                "automerge:doc1",
                vec![("aa".into(), b"1".to_vec()), ("bb".into(), b"2".to_vec())],
            )
            .await
            .unwrap();
            s.append("automerge:doc10", vec![("cc".into(), b"3".to_vec())])
                .await
                .unwrap();
            s.compact("automerge:doc1", b"snap".to_vec(), vec!["aa".into()])
                .await
                .unwrap();
            s.append("automerge:doc1", vec![("dd".into(), b"4".to_vec())])
                .await
                .unwrap();
            s.set_meta("incarnation", 7u64.to_le_bytes().to_vec())
                .await
                .unwrap();
            s.add_queue("automerge:q", "emails").await.unwrap();
            let closed = s.closed();
            drop(s);
            closed.wait().await;
        }
        let s = Store::open(&path).unwrap();
        let doc1 = s.load_doc("automerge:doc1").await.unwrap();
        assert_eq!(
            doc1.first().map(Vec::as_slice),
            Some(&b"snap"[..]),
            "the snapshot comes first"
        );
        assert_eq!(
            doc1.len(),
            3,
            "snapshot, bb and dd; aa was compacted away; doc10 is another document"
        );
        assert_eq!(
            s.load_doc("automerge:doc10").await.unwrap(),
            vec![b"3".to_vec()]
        );
        assert!(s.load_doc("automerge:none").await.unwrap().is_empty());
        assert_eq!(
            s.meta("incarnation").await.unwrap(),
            Some(7u64.to_le_bytes().to_vec())
        );
        assert_eq!(
            s.queues().await.unwrap(),
            vec![("automerge:q".to_owned(), "emails".to_owned())]
        );
    }

    /// Issue 34: redb latches its first I/O error, so a store that once hit a full disk failed
    /// every later read and write until a restart. Now it reopens once there is space and
    /// serves again, and the writes nobody waits on were kept and land with the next commit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_that_hit_a_full_disk_serves_again_once_there_is_space() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let chunk = |h: &str| vec![(h.to_owned(), h.as_bytes().to_vec())];
        let fault = DiskFault::new();
        let s = Store::open_with(&path, Some(fault.clone())).unwrap();
        s.append("automerge:a", chunk("c1")).await.unwrap();
        fault.set_full(true);
        let refused = s.append("automerge:a", chunk("c2")).await.unwrap_err();
        assert!(
            refused.to_string().contains("no space left"),
            "a clear error: {refused}"
        );
        assert!(s.set_epoch("automerge:q", "automerge:e1").await.is_err());
        s.retire("automerge:a", RetiredKind::Task)
            .await
            .unwrap_err();
        // (Reads may fail meanwhile: reopening needs a write too, as redb repairs the file.)
        fault.set_full(false);
        assert_eq!(s.load_doc("automerge:a").await.unwrap().len(), 1);
        s.append("automerge:a", chunk("c3")).await.unwrap();
        assert_eq!(s.load_doc("automerge:a").await.unwrap().len(), 2);
        // The kept writes landed with that commit.
        assert_eq!(
            s.epoch("automerge:q").await.unwrap().as_deref(),
            Some("automerge:e1")
        );
        assert_eq!(s.retired().await.unwrap().len(), 1);
        let closed = s.closed();
        drop(s);
        closed.wait().await;
        let s = Store::open(&path).unwrap();
        assert_eq!(s.load_doc("automerge:a").await.unwrap().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_quarantined_chunk_leaves_its_document_and_is_kept_aside() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("store.redb")).unwrap();
        s.append(
            "automerge:a",
            vec![
                ("aa".into(), b"good".to_vec()),
                ("bb".into(), b"bad".to_vec()),
            ],
        )
        .await
        .unwrap();
        s.quarantine("automerge:a", b"bad".to_vec()).await.unwrap();
        assert_eq!(
            s.load_doc("automerge:a").await.unwrap(),
            vec![b"good".to_vec()]
        );
        assert_eq!(
            s.quarantined().await.unwrap(),
            vec![("automerge:a/c/bb".to_owned(), b"bad".to_vec())]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_archive_keeps_the_latest_statuses() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("store.redb"))
            .unwrap()
            .with_archive_keep(3);
        let rec = |t: &str, v: &str| (t.to_owned(), v.as_bytes().to_vec());
        s.archive(vec![rec("t1", "a"), rec("t2", "b")])
            .await
            .unwrap();
        // Archived again: new value, same place.
        s.archive(vec![rec("t1", "a2"), rec("t3", "c")])
            .await
            .unwrap();
        assert_eq!(s.archived("t1").await.unwrap(), Some(b"a2".to_vec()));
        s.archive(vec![rec("t4", "d"), rec("t5", "e")])
            .await
            .unwrap();
        // Five archived, three kept: t1 and t2 were the oldest.
        assert_eq!(s.archived("t1").await.unwrap(), None);
        assert_eq!(s.archived("t2").await.unwrap(), None);
        for (t, v) in [("t3", "c"), ("t4", "d"), ("t5", "e")] {
            assert_eq!(
                s.archived(t).await.unwrap(),
                Some(v.as_bytes().to_vec()),
                "{t}"
            );
        }
    }

    /// Kept ends are read back by task, and with a queue, for every task listed failed in it
    /// (not another queue's, not another state's); the oldest go beyond the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kept_ends_are_read_by_task_and_by_the_failed_listing() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("store.redb"))
            .unwrap()
            .with_archive_keep(3);
        let rec = |t: &str, v: &str| (t.to_owned(), v.as_bytes().to_vec());
        s.keep_ends(vec![rec("t1", "a"), rec("t2", "b"), rec("t3", "c")])
            .await
            .unwrap();
        let listed =
            |q: &str, st: &'static str, t: &str| (q.to_owned(), st, t.to_owned(), b"e".to_vec());
        s.list(vec![
            listed("q1", "failed", "t2"),
            listed("q1", "succeeded", "t1"),
            listed("q2", "failed", "t3"),
        ])
        .await
        .unwrap();
        let names = |v: Vec<(String, Vec<u8>)>| v.into_iter().map(|(t, _)| t).collect::<Vec<_>>();
        let ends = s.ends(vec!["t1".into(), "t9".into()], None).await.unwrap();
        assert_eq!(ends, vec![rec("t1", "a")]);
        let ends = s.ends(vec![], Some("q1".into())).await.unwrap();
        assert_eq!(names(ends), ["t2"]);
        let ends = s.ends(vec!["t1".into()], Some("q2".into())).await.unwrap();
        assert_eq!(names(ends), ["t1", "t3"]);
        // Kept again: the new value, in its place.
        s.keep_ends(vec![rec("t2", "b2")]).await.unwrap();
        assert_eq!(
            s.ends(vec!["t2".into()], None).await.unwrap(),
            vec![rec("t2", "b2")]
        );
        // Two more push the two oldest out.
        s.keep_ends(vec![rec("t4", "d"), rec("t5", "e")])
            .await
            .unwrap();
        let all = ["t1", "t2", "t3", "t4", "t5"].map(String::from).to_vec();
        assert_eq!(names(s.ends(all, None).await.unwrap()), ["t3", "t4", "t5"]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn finished_tasks_are_listed_by_queue_and_state_in_id_order_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("store.redb"))
            .unwrap()
            .with_archive_keep(5);
        let rec = |q: &str, st: &'static str, t: &str| {
            (
                q.to_owned(),
                st,
                t.to_owned(),
                format!("{q}/{t}").into_bytes(),
            )
        };
        s.list(vec![
            rec("q1", "succeeded", "t3"),
            rec("q1", "failed", "t2"),
            rec("q2", "succeeded", "t1"),
            rec("q1", "cancelled", "t5"),
            rec("q1", "succeeded", "t1"),
        ])
        .await
        .unwrap();
        let read = |state, after: Option<&'static str>, limit| {
            let s = s.clone();
            async move {
                s.listed("q1", state, after, limit)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|v| String::from_utf8(v).unwrap())
                    .collect::<Vec<_>>()
            }
        };
        // Every final state, merged by task id; after a cursor; at most `limit`.
        assert_eq!(
            read(None, None, 10).await,
            ["q1/t1", "q1/t2", "q1/t3", "q1/t5"]
        );
        assert_eq!(read(None, Some("t2"), 10).await, ["q1/t3", "q1/t5"]);
        assert_eq!(read(None, None, 2).await, ["q1/t1", "q1/t2"]);
        assert_eq!(read(Some("succeeded"), None, 10).await, ["q1/t1", "q1/t3"]);
        assert_eq!(
            read(Some("failed"), Some("t2"), 10).await,
            Vec::<String>::new()
        );
        // Five kept: one more drops the oldest (q1's t3).
        s.list(vec![rec("q1", "succeeded", "t9")]).await.unwrap();
        assert_eq!(read(Some("succeeded"), None, 10).await, ["q1/t1", "q1/t9"]);
        // A dead letter requeued that succeeded since is listed succeeded only, and a page
        // counts only what it lists.
        s.list(vec![rec("q1", "succeeded", "t2")]).await.unwrap();
        assert_eq!(read(Some("failed"), None, 10).await, Vec::<String>::new());
        assert_eq!(read(None, None, 2).await, ["q1/t1", "q1/t2"]);
        assert_eq!(
            read(Some("succeeded"), None, 10).await,
            ["q1/t1", "q1/t2", "q1/t9"]
        );
        assert_eq!(s.ends(vec![], Some("q1".into())).await.unwrap(), vec![]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn retired_documents_are_listed_in_order_and_deleted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let chunk = |h: &str| vec![(h.to_owned(), h.as_bytes().to_vec())];
        {
            let s = Store::open(&path).unwrap();
            for d in ["automerge:a", "automerge:a1", "automerge:b"] {
                s.append(d, chunk("c1")).await.unwrap();
            }
            s.compact("automerge:a", b"snap".to_vec(), vec![])
                .await
                .unwrap();
            s.retire("automerge:b", RetiredKind::Epoch).await.unwrap();
            s.retire("automerge:a", RetiredKind::Task).await.unwrap();
            // Retired again: keeps its place.
            s.retire("automerge:b", RetiredKind::Epoch).await.unwrap();
            s.retire("automerge:a1", RetiredKind::Task).await.unwrap();
            assert_eq!(
                s.retired().await.unwrap(),
                vec![
                    ("automerge:b".to_owned(), RetiredKind::Epoch),
                    ("automerge:a".to_owned(), RetiredKind::Task),
                    ("automerge:a1".to_owned(), RetiredKind::Task),
                ]
            );
            s.delete_doc("automerge:a").await.unwrap();
            // Its snapshot and changes are gone; a document whose id extends it is not.
            assert!(s.load_doc("automerge:a").await.unwrap().is_empty());
            assert_eq!(s.load_doc("automerge:a1").await.unwrap().len(), 1);
            let closed = s.closed();
            drop(s);
            closed.wait().await;
        }
        let s = Store::open(&path).unwrap();
        assert_eq!(
            s.retired().await.unwrap(),
            vec![
                ("automerge:b".to_owned(), RetiredKind::Epoch),
                ("automerge:a1".to_owned(), RetiredKind::Task),
            ]
        );
        // A document retired after a deletion comes last.
        s.retire("automerge:a", RetiredKind::Task).await.unwrap();
        assert_eq!(s.retired().await.unwrap().last().unwrap().0, "automerge:a");
    }
}
