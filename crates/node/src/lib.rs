//! Piecework's node: the runtime that wires documents, routers, the worker pool and the network
//! together with tokio, the real clock, on-disk storage and a local HTTP API.
//!
//! This is the only crate that owns a clock, the disk and the network. The pure cores
//! (`queue-doc`, `router`, the `worker-pool` state machine) are driven from one task, the
//! node's *actor*, which feeds them documents, heartbeats and timeouts and carries out their
//! actions.
//!
//! # Running a node
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use piecework_node::{Config, Node};
//! use piecework_worker_pool::Registry;
//!
//! let mut registry = Registry::new();
//! registry.register("echo", |_ctx, input| async move { Ok(input) });
//! let node = Node::start(Config::new("/tmp/piecework-a".into(), registry)).await?;
//! let queue = node.handle().create_queue("emails", None).await?;
//! let task = node
//!     .handle()
//!     .submit(&queue, piecework_node::api::SubmitTask {
//!         kind: "echo".into(),
//!         input: serde_json::json!({"to": "ada@example.org"}),
//!         priority: 0,
//!         urgent: false,
//!         max_attempts: None,
//!     })
//!     .await?;
//! let status = node.handle().wait_task(&task, std::time::Duration::from_secs(30)).await?;
//! # Ok(()) }
//! ```
//!
//! [`http::router`] serves the same operations over HTTP for the `piecework` CLI, and
//! [`spawn_isolated`] runs a node on a runtime of its own so that a test or the demo can kill
//! it abruptly.
//!
//! # What a node stores
//!
//! `<data dir>/identity.key` (the ed25519 key, mode 0600) and `<data dir>/piecework.redb`
//! (every document chunk, the incarnation counter and the joined queues). A submit returns only
//! once the task document and the queue document's index entry are on disk.

#![warn(missing_docs, unreachable_pub)]

mod actor;
pub mod api;
pub mod http;
pub mod identity;
pub mod storage;
mod wire;

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use piecework_net as net;
use piecework_queue_doc::task::{self, NewTask};
use piecework_queue_doc::{
    PeerId, QueueConfig, QueueId, QueueView, Submission, TaskId, TaskState, queue,
};
use piecework_router::Event as RouterEvent;
use piecework_worker_pool::Registry;
use samod::{AutomergeUrl, DocHandle, DocumentId};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use net::Multiaddr;
pub use wire::Wire;

/// Capacity of the actor's input queue (senders wait when it is full).
pub const ACTOR_QUEUE: usize = 1024;
/// Capacity of the [`NodeEvent`] broadcast; a receiver that lags further loses events.
pub const EVENT_BUFFER: usize = 1024;
/// The most workers one node runs.
pub const MAX_WORKERS: u32 = 256;

/// How to start a node.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the identity key and the documents are kept.
    pub data_dir: PathBuf,
    /// Addresses to listen on.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start.
    pub bootstrap: Vec<Multiaddr>,
    /// Task workers in this node's pool.
    pub workers: u32,
    /// Handlers by kind.
    pub registry: Registry,
}

impl Config {
    /// A node keeping its data in `data_dir`, listening on an ephemeral loopback port, with as
    /// many workers as the machine has cores.
    pub fn new(data_dir: PathBuf, registry: Registry) -> Self {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        Config {
            data_dir,
            listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("valid multiaddr")],
            bootstrap: vec![],
            workers,
            registry,
        }
    }
}

/// Something that happened on this node, for live displays and tests.
#[derive(Clone, Debug)]
pub enum NodeEvent {
    /// The node listens on new addresses; all its advertised addresses.
    Listening(Vec<String>),
    /// This node's router for `queue` changed role.
    Router {
        /// The queue.
        queue: QueueId,
        /// What happened.
        event: RouterEvent,
    },
    /// One of this node's workers started a run.
    RunStarted {
        /// The queue.
        queue: QueueId,
        /// The task.
        task: TaskId,
        /// The worker's name.
        worker: String,
    },
    /// One of this node's workers ended a run.
    RunEnded {
        /// The queue.
        queue: QueueId,
        /// The task.
        task: TaskId,
        /// Whether the handler succeeded.
        ok: bool,
    },
}

/// Starting a node failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The identity key could not be loaded or created.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    /// The store could not be opened (is another node using this data directory?).
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The network could not start.
    #[error(transparent)]
    Net(#[from] net::StartError),
    /// Too many workers.
    #[error("a node runs at most {MAX_WORKERS} workers, not {0}")]
    TooManyWorkers(u32),
}

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The id is not an `automerge:` URL.
    #[error("not a queue id (expected automerge:<id>): {0:?}")]
    BadId(String),
    /// No connected peer has the queue.
    #[error("no connected peer has queue {0} (is a member of it connected?)")]
    NotFound(QueueId),
    /// The document is not a queue document.
    #[error("{0} is not a queue document")]
    NotAQueue(QueueId),
    /// This node is not a member of the queue.
    #[error("this node has not joined queue {0}")]
    NotJoined(QueueId),
    /// The configuration cannot work.
    #[error(transparent)]
    Create(#[from] queue::CreateQueueError),
    /// The document could not be written.
    #[error(transparent)]
    Write(#[from] queue::WriteError),
    /// The change could not be stored.
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
}

/// Submitting a task failed; nothing was indexed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// This node has not joined the queue.
    #[error("this node has not joined queue {0}")]
    NotJoined(QueueId),
    /// The request is invalid.
    #[error("invalid task: {0}")]
    Invalid(String),
    /// The task document could not be written.
    #[error(transparent)]
    TaskDoc(#[from] task::TaskWriteError),
    /// The queue document refused the entry.
    #[error(transparent)]
    Queue(#[from] queue::SubmitError),
    /// The change could not be stored.
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
}

/// Looking up a task failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The id is not an `automerge:` URL.
    #[error("not a task id (expected automerge:<id>): {0:?}")]
    BadId(String),
    /// Neither this node nor a connected peer has the task.
    #[error("task {0} not found here or on any connected peer")]
    NotFound(TaskId),
    /// The document is not a task document.
    #[error("{0} is not a task document: {1}")]
    NotATask(TaskId, task::TaskReadError),
    /// This node has not joined the task's queue.
    #[error("task {0} belongs to queue {1}, which this node has not joined")]
    NotJoined(TaskId, QueueId),
    /// The task's queue does not index it (yet).
    #[error("task {0} is not (yet) in queue {1}'s index on this node")]
    NotIndexed(TaskId, QueueId),
    /// The wait ended before the task did.
    #[error("task {0} had not finished after {1:?}")]
    Timeout(TaskId, Duration),
    /// The node is stopping.
    #[error("the node is stopping")]
    Stopped,
}

/// The last six characters of a peer id, for logs and displays.
pub fn short_peer(peer: &PeerId) -> String {
    let s = peer.as_str();
    s[s.len().saturating_sub(6)..].to_owned()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn doc_id(url: &str) -> Option<DocumentId> {
    AutomergeUrl::from_str(url).ok().map(|u| u.document_id().clone())
}

/// How long a submit waits for a connected peer to hold the new task.
pub const REPLICATION_WAIT: Duration = Duration::from_secs(5);

/// Resolves once some connected peer has every change in `heads` of `handle`'s document.
async fn replicated(handle: &DocHandle, heads: &[automerge::ChangeHash]) {
    let peer_has = |s: &samod::PeerDocState| {
        let Some(theirs) = s.their_heads.as_ref() else { return false };
        handle.with_document(|d| {
            use automerge::ReadDoc;
            // They have our heads if none of them is among the changes they lack.
            theirs.iter().all(|h| d.get_change_by_hash(h).is_some())
                && !d.get_changes(theirs).iter().any(|c| heads.contains(&c.hash()))
        })
    };
    let (mut states, mut updates) = handle.peers();
    loop {
        if states.values().any(peer_has) {
            return;
        }
        match updates.next().await {
            Some(delta) => states.extend(delta),
            None => std::future::pending().await,
        }
    }
}

/// How long a lookup waits for peers to answer.
const FIND_TIMEOUT: Duration = Duration::from_secs(10);

struct QueueEntry {
    handle: DocHandle,
    view: watch::Receiver<Arc<QueueView>>,
}

pub(crate) struct Shared {
    peer: PeerId,
    libp2p_peer: net::PeerId,
    incarnation: u64,
    repo: samod::Repo,
    store: storage::Store,
    net: net::Client,
    registry: Registry,
    workers: u32,
    queues: RwLock<HashMap<QueueId, QueueEntry>>,
    actor: mpsc::Sender<actor::Input>,
    events: broadcast::Sender<NodeEvent>,
    listen: RwLock<Vec<Multiaddr>>,
}

impl Shared {
    /// The addresses this node advertises, each ending in `/p2p/<peer>`.
    fn advertised(&self) -> Vec<String> {
        let listen = self.listen.read().unwrap_or_else(|e| e.into_inner());
        listen
            .iter()
            .map(|a| format!("{a}/p2p/{}", self.libp2p_peer))
            .collect()
    }
}

/// A running node. Dropping it does not stop it; see [`spawn_isolated`] for a node that can be
/// killed.
#[derive(Debug)]
pub struct Node {
    handle: NodeHandle,
}

/// A handle to a running node: everything the HTTP API and the CLI can do. Cheap to clone.
#[derive(Clone)]
pub struct NodeHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle").field("peer", &self.shared.peer).finish()
    }
}

impl Node {
    /// Starts a node on the current tokio runtime: opens its store, starts the network and the
    /// actor, and reopens the queues it had joined.
    pub async fn start(config: Config) -> Result<Node, StartError> {
        if config.workers > MAX_WORKERS {
            return Err(StartError::TooManyWorkers(config.workers));
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| StartError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
        let keypair = identity::load_or_create(&config.data_dir)?;
        let libp2p_peer = keypair.public().to_peer_id();
        let store = storage::Store::open(&config.data_dir.join("piecework.redb"))?;
        let incarnation = store
            .meta("incarnation")
            .await?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_le_bytes)
            + 1;
        store.set_meta("incarnation", incarnation.to_le_bytes().to_vec()).await?;
        let repo = samod::Repo::builder(tokio::runtime::Handle::current())
            .with_storage(store.clone())
            .with_peer_id(net::sync::samod_peer(&libp2p_peer))
            .load()
            .await;
        let mut net_config = net::Config::new(keypair, config.listen.clone());
        net_config.bootstrap = config.bootstrap.clone();
        let net = net::spawn(net_config, repo.clone())?;
        let (actor_tx, actor_rx) = mpsc::channel(ACTOR_QUEUE);
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let shared = Arc::new(Shared {
            peer: PeerId::new(libp2p_peer.to_string()),
            libp2p_peer,
            incarnation,
            repo,
            store,
            net: net.client.clone(),
            registry: config.registry.clone(),
            workers: config.workers,
            queues: RwLock::new(HashMap::new()),
            actor: actor_tx,
            events,
            listen: RwLock::new(vec![]),
        });
        let span = tracing::info_span!("node", peer = %short_peer(&shared.peer));
        tokio::spawn(tracing::Instrument::instrument(actor::run(shared.clone(), actor_rx, net.events), span));
        let handle = NodeHandle { shared };
        for (id, name) in handle.shared.store.queues().await? {
            let id = QueueId::new(id);
            if let Err(e) = handle.open_queue(&id, false).await {
                tracing::warn!(queue = %id, %name, "cannot reopen queue: {e}");
            }
        }
        Ok(Node { handle })
    }

    /// The node's handle.
    pub fn handle(&self) -> &NodeHandle {
        &self.handle
    }
}

impl NodeHandle {
    /// This node's peer id.
    pub fn peer_id(&self) -> &PeerId {
        &self.shared.peer
    }

    /// This start's incarnation number.
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// Events on this node (see [`EVENT_BUFFER`] on lagging).
    pub fn events(&self) -> broadcast::Receiver<NodeEvent> {
        self.shared.events.subscribe()
    }

    /// Addresses the node listens on, once known.
    pub async fn listen_addrs(&self) -> Vec<Multiaddr> {
        self.shared.net.info().await.map(|i| i.listen).unwrap_or_default()
    }

    /// Waits until the node listens somewhere and returns the first address, with `/p2p/<id>`.
    pub async fn wait_listening(&self) -> Multiaddr {
        let mut events = self.events();
        loop {
            if let Some(a) = self.shared.advertised().first() {
                return a.parse().expect("advertised addresses parse");
            }
            // The actor records listen addresses as it learns them, then announces them.
            if let Ok(NodeEvent::Listening(addrs)) = events.recv().await {
                if let Some(a) = addrs.first() {
                    return a.parse().expect("advertised addresses parse");
                }
            }
        }
    }

    /// Dials a peer.
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), net::DialError> {
        self.shared.net.dial(addr).await
    }

    /// A watch on this node's view of `queue`, updated after every change.
    pub fn watch_queue(&self, queue: &QueueId) -> Option<watch::Receiver<Arc<QueueView>>> {
        let queues = self.shared.queues.read().unwrap_or_else(|e| e.into_inner());
        queues.get(queue).map(|q| q.view.clone())
    }

    /// Creates a queue with this node as its first member; returns its id.
    pub async fn create_queue(
        &self,
        name: &str,
        config: Option<QueueConfig>,
    ) -> Result<QueueId, QueueError> {
        let mut doc = automerge::Automerge::new();
        queue::create(&mut doc, name, &config.unwrap_or_default(), &self.shared.peer, now_ms())?;
        queue::set_member(&mut doc, &self.shared.peer, &self.shared.advertised(), now_ms())?;
        let handle = self.shared.repo.create(doc).await.map_err(|_| QueueError::Stopped)?;
        let id = QueueId::new(handle.url().to_string());
        self.register(&id, name, handle).await?;
        Ok(id)
    }

    /// Joins a queue a connected peer has; returns its view. Waits up to 10 s for peers to
    /// answer.
    pub async fn join_queue(&self, id: &QueueId) -> Result<Arc<QueueView>, QueueError> {
        self.open_queue(id, true).await
    }

    async fn open_queue(&self, id: &QueueId, from_peers: bool) -> Result<Arc<QueueView>, QueueError> {
        if let Some(v) = self.watch_queue(id) {
            return Ok(v.borrow().clone());
        }
        let doc = doc_id(id.as_str()).ok_or_else(|| QueueError::BadId(id.to_string()))?;
        let find = async {
            let mut connections = self.events();
            loop {
                match self.shared.repo.find(doc.clone()).await {
                    Ok(Some(h)) => return Ok(h),
                    Ok(None) if from_peers => {
                        // Not found among the peers connected so far: wait for another to
                        // connect (or a moment), then ask again.
                        let _ = tokio::time::timeout(Duration::from_millis(500), connections.recv()).await;
                    }
                    Ok(None) => return Err(QueueError::NotFound(id.clone())),
                    Err(_) => return Err(QueueError::Stopped),
                }
            }
        };
        let handle = tokio::time::timeout(FIND_TIMEOUT, find)
            .await
            .map_err(|_| QueueError::NotFound(id.clone()))??;
        let view = handle
            .with_document(|d| QueueView::read(d))
            .ok_or_else(|| QueueError::NotAQueue(id.clone()))?;
        let me = &self.shared.peer;
        let addrs = self.shared.advertised();
        if view.members.get(me).is_none_or(|m| m.addrs != addrs) {
            handle.with_document(|d| queue::set_member(d, me, &addrs, now_ms()))?;
        }
        let name = view.name.clone();
        self.register(id, &name, handle).await?;
        Ok(self.watch_queue(id).map(|v| v.borrow().clone()).unwrap_or_else(|| Arc::new(view)))
    }

    async fn register(&self, id: &QueueId, name: &str, handle: DocHandle) -> Result<(), QueueError> {
        self.shared.store.add_queue(id.as_str(), name).await?;
        let view = Arc::new(handle.with_document(|d| QueueView::read(d)).unwrap_or_default());
        let (tx, rx) = watch::channel(view);
        {
            let mut queues = self.shared.queues.write().unwrap_or_else(|e| e.into_inner());
            queues.insert(
                id.clone(),
                QueueEntry {
                    handle: handle.clone(),
                    view: rx,
                },
            );
        }
        self.shared
            .actor
            .send(actor::Input::AddQueue {
                id: id.clone(),
                handle,
                view: tx,
            })
            .await
            .map_err(|_| QueueError::Stopped)
    }

    /// Pauses (or resumes) routing of a queue, for every router.
    pub async fn set_paused(&self, queue_id: &QueueId, paused: bool) -> Result<(), QueueError> {
        let qh = self
            .queue_handle(queue_id)
            .ok_or_else(|| QueueError::NotJoined(queue_id.clone()))?;
        qh.with_document(|d| queue::set_paused(d, paused))?;
        Ok(())
    }

    fn queue_handle(&self, id: &QueueId) -> Option<DocHandle> {
        let queues = self.shared.queues.read().unwrap_or_else(|e| e.into_inner());
        queues.get(id).map(|q| q.handle.clone())
    }

    /// Submits a task: creates its task document and indexes it in the queue. Returns once both
    /// are on disk and, when a peer is connected, once one peer holds both too (up to
    /// [`REPLICATION_WAIT`]; `replicated` says whether that happened), so that the task
    /// survives this node dying right after.
    pub async fn submit(&self, queue_id: &QueueId, req: api::SubmitTask) -> Result<api::Submitted, SubmitError> {
        let qh = self
            .queue_handle(queue_id)
            .ok_or_else(|| SubmitError::NotJoined(queue_id.clone()))?;
        if req.kind.trim().is_empty() {
            return Err(SubmitError::Invalid("the kind is empty".into()));
        }
        if req.priority.abs() > queue::MAX_PRIORITY {
            return Err(SubmitError::Invalid(format!(
                "priority {} is outside [-{max}, {max}]",
                req.priority,
                max = queue::MAX_PRIORITY
            )));
        }
        let now = now_ms();
        let mut doc = automerge::Automerge::new();
        task::init(
            &mut doc,
            &NewTask {
                queue: queue_id.clone(),
                kind: req.kind.clone(),
                input: req.input,
                submitter: self.shared.peer.clone(),
                submitted_at: now,
            },
        )?;
        let th = self.shared.repo.create(doc).await.map_err(|_| SubmitError::Stopped)?;
        let task_id = TaskId::new(th.url().to_string());
        let task_heads = th.with_document(|d| d.get_heads());
        let submission = Submission {
            id: task_id.clone(),
            kind: req.kind,
            submitter: self.shared.peer.clone(),
            submitted_at: now,
            priority: req.priority,
            urgent: req.urgent,
            max_attempts: req.max_attempts,
        };
        let change = qh.with_document(|d| {
            queue::submit(d, &submission)?;
            Ok::<_, queue::SubmitError>(d.get_last_local_change().map(|c| (c.hash(), c.raw_bytes().to_vec())))
        })?;
        // samod saves the change too, in the background; this write makes the submit durable
        // before it is acknowledged. Same key, same bytes: the two writes agree.
        let Some((hash, bytes)) = change else {
            return Err(SubmitError::Invalid("the submit made no change".into()));
        };
        let key = samod::storage::StorageKey::incremental_path(qh.document_id(), hash);
        self.shared.store.put_chunk(&key, bytes).await?;
        let replicated = if self.shared.net.info().await.is_ok_and(|i| !i.connected.is_empty()) {
            let queue_heads = [hash];
            let both = async {
                futures::join!(replicated(&th, &task_heads), replicated(&qh, &queue_heads));
            };
            tokio::time::timeout(REPLICATION_WAIT, both).await.is_ok()
        } else {
            false
        };
        if !replicated {
            tracing::info!(task = %task_id, "submitted; held only by this node for now");
        }
        Ok(api::Submitted { task_id, replicated })
    }

    async fn find_task(&self, id: &TaskId) -> Result<DocHandle, TaskError> {
        let doc = doc_id(id.as_str()).ok_or_else(|| TaskError::BadId(id.to_string()))?;
        match tokio::time::timeout(FIND_TIMEOUT, self.shared.repo.find(doc)).await {
            Ok(Ok(Some(h))) => Ok(h),
            Ok(Ok(None)) | Err(_) => Err(TaskError::NotFound(id.clone())),
            Ok(Err(_)) => Err(TaskError::Stopped),
        }
    }

    /// Whether this node holds the task's document on disk (without asking peers).
    pub async fn has_task_locally(&self, id: &TaskId) -> bool {
        match doc_id(id.as_str()) {
            Some(d) => self.shared.store.has_doc(&d.to_string()).await.unwrap_or(false),
            None => false,
        }
    }

    /// A task's status: its state per this node's replica of its queue, its attempts and runs.
    pub async fn task_status(&self, id: &TaskId) -> Result<api::TaskStatus, TaskError> {
        let th = self.find_task(id).await?;
        self.status_of(id, &th)
    }

    fn status_of(&self, id: &TaskId, th: &DocHandle) -> Result<api::TaskStatus, TaskError> {
        let doc = th
            .with_document(|d| task::read(d))
            .map_err(|e| TaskError::NotATask(id.clone(), e))?;
        let view = self
            .watch_queue(&doc.queue)
            .ok_or_else(|| TaskError::NotJoined(id.clone(), doc.queue.clone()))?
            .borrow()
            .clone();
        let entry = view
            .tasks
            .get(id)
            .ok_or_else(|| TaskError::NotIndexed(id.clone(), doc.queue.clone()))?;
        let error = entry
            .attempts
            .iter()
            .filter_map(|a| a.finished.as_ref())
            .filter(|f| f.outcome.is_failure())
            .max_by_key(|f| f.at)
            .and_then(|f| f.error.clone());
        Ok(api::TaskStatus {
            id: id.clone(),
            queue: doc.queue.clone(),
            kind: doc.kind.clone(),
            state: entry.state(),
            submitted_at: doc.submitted_at,
            submitter: doc.submitter.to_string(),
            result: doc.result().cloned(),
            input: doc.input.clone(),
            error,
            attempts: entry.attempts.clone(),
            runs: doc.runs,
        })
    }

    /// Waits until the task succeeds or fails for good (and, on success, until this node has
    /// its result), up to `timeout`.
    pub async fn wait_task(&self, id: &TaskId, timeout: Duration) -> Result<api::TaskStatus, TaskError> {
        let wait = async {
            let th = self.find_task(id).await?;
            let queue = th
                .with_document(|d| task::read(d))
                .map_err(|e| TaskError::NotATask(id.clone(), e))?
                .queue;
            let mut view = self
                .watch_queue(&queue)
                .ok_or_else(|| TaskError::NotJoined(id.clone(), queue.clone()))?;
            let mut task_changes = th.changes();
            loop {
                let state = view.borrow_and_update().tasks.get(id).map(|t| t.state());
                match state {
                    Some(TaskState::Failed) => return self.status_of(id, &th),
                    Some(TaskState::Succeeded) => {
                        let status = self.status_of(id, &th)?;
                        if status.result.is_some() {
                            return Ok(status);
                        }
                        // The task document's run record is still on its way.
                        task_changes.next().await;
                    }
                    _ => view.changed().await.map_err(|_| TaskError::Stopped)?,
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| TaskError::Timeout(id.clone(), timeout))?
    }

    /// This node's status: its queues, workers and connections.
    pub async fn status(&self) -> Result<api::NodeStatus, QueueError> {
        let info = self.shared.net.info().await.map_err(|_| QueueError::Stopped)?;
        let (reply, rx) = oneshot::channel();
        self.shared
            .actor
            .send(actor::Input::Status(reply))
            .await
            .map_err(|_| QueueError::Stopped)?;
        let actor = rx.await.map_err(|_| QueueError::Stopped)?;
        let queues = actor
            .queues
            .into_iter()
            .map(|(id, role)| {
                let view = self.watch_queue(&id).map(|v| v.borrow().clone()).unwrap_or_default();
                api::QueueStatus {
                    id,
                    name: view.name.clone(),
                    router: view.router.clone(),
                    role,
                    members: view.members.len(),
                    paused: view.paused,
                    tasks: view.counts(),
                    config: view.config.clone(),
                }
            })
            .collect();
        Ok(api::NodeStatus {
            peer_id: self.shared.peer.to_string(),
            incarnation: self.shared.incarnation,
            listen: self.shared.advertised(),
            connected: info.connected.iter().map(ToString::to_string).collect(),
            kinds: self.shared.registry.kinds().map(str::to_owned).collect(),
            queues,
            workers: actor.workers,
        })
    }
}

/// A node running on a tokio runtime of its own, so that it can be killed abruptly: everything
/// it runs stops at once, as if its process had died.
#[derive(Debug)]
pub struct IsolatedNode {
    handle: NodeHandle,
    runtime: Option<tokio::runtime::Runtime>,
}

impl IsolatedNode {
    /// The node's handle.
    pub fn handle(&self) -> &NodeHandle {
        &self.handle
    }

    /// Kills the node: its runtime stops without running anything further, its connections
    /// drop and unsent messages are lost. The returned signal resolves once the data directory
    /// is released (after every other [`NodeHandle`] clone is dropped too), so that a node can
    /// be started on it again.
    pub fn kill(mut self) -> storage::Closed {
        let closed = self.handle.shared.store.closed();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        closed
    }
}

impl Drop for IsolatedNode {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which async code must not do; let it go in the background.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Starts a node on a new runtime of its own (`threads` worker threads).
pub async fn spawn_isolated(config: Config, threads: usize) -> Result<IsolatedNode, StartError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("piecework-node")
        .enable_all()
        .build()
        .map_err(|source| StartError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
    let node = runtime
        .spawn(Node::start(config))
        .await
        .map_err(|_| StartError::Storage(storage::StorageError::Stopped))??;
    Ok(IsolatedNode {
        handle: node.handle,
        runtime: Some(runtime),
    })
}
