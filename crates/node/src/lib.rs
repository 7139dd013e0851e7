//! Piecework's node: the runtime that wires documents, routers, the worker pool and the network
//! together with tokio, the real clock, on-disk storage and a local HTTP API.
//!
//! This is the only crate that owns a clock, the disk and the network, and it decides nothing:
//! every decision is made by a [`piecework_core::Core`], the node as a pure state machine that
//! the simulator runs too. One task, the node's *shell*, feeds the core the clock, network
//! messages, storage answers and handler results, and performs the I/O the core asks for
//! (redb reads and writes, libp2p sends and dials, handler runs). [`NodeHandle`] talks to the
//! shell over a bounded command queue; handlers run in tasks of their own and report back.
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
//! let submitted = node
//!     .handle()
//!     .submit(
//!         &queue,
//!         piecework_node::api::SubmitTask::new("echo", serde_json::json!({"to": "ada@example.org"})),
//!     )
//!     .await?;
//! let status = node.handle().wait_task(&submitted.task_id, std::time::Duration::from_secs(30)).await?;
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
//! (every document, the incarnation counter and the joined queues). A submit returns once the
//! task document and the queue's index entry are on disk, and, when a peer is connected, held by
//! one peer too.

#![warn(missing_docs, unreachable_pub)]

pub mod access;
mod events;
pub mod http;
pub mod identity;
mod shell;
pub mod storage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use piecework_core::{Command, Reply};
use piecework_net as net;
use piecework_queue_doc::{PeerId, QueueConfig, QueueId, QueueView, TaskId};
use piecework_router::Event as RouterEvent;
use piecework_worker_pool::Registry;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use events::{EVENT_LOG, Logged, Subscription};
pub use net::Multiaddr;
pub use piecework_core::api;
pub use piecework_core::api::{QueueError, SubmitError, TaskError};
pub use piecework_core::{
    EPOCH_RETAIN, FIND_TIMEOUT, KEEP_SEALED_EPOCHS, KEEP_TASK_DOCS, MAX_LIVE, MAX_WORKERS,
    REPLICATION_WAIT, ROTATE_MIN_LIVE, ROTATE_RATIO, Wire,
};

/// Capacity of the shell's command queue (callers wait when it is full).
pub const COMMAND_QUEUE: usize = 1024;
/// Capacity of the [`NodeEvent`] broadcast; a receiver that lags further loses events.
pub const EVENT_BUFFER: usize = 1024;

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
    /// A switch that makes the store's disk act full, for tests ([`storage::DiskFault`]).
    #[doc(hidden)]
    pub disk_fault: Option<storage::DiskFault>,
    /// When this node, as a queue's router, rotates the queue document: `(ratio, min_live)`
    /// (`piecework_core::Config::rotate_ratio`); `None` for the defaults.
    pub rotation: Option<(usize, usize)>,
    /// How many final statuses of inline tasks the store keeps ([`storage::ARCHIVE_KEEP`] by
    /// default): a task whose status was dropped answers "not found" once no epoch carries it.
    pub archive_keep: u64,
    /// The most live tasks a queue takes submits for (`piecework_core::Config::max_live`);
    /// `None` for the default ([`MAX_LIVE`]).
    pub max_live: Option<usize>,
    /// How many tasks' ends the node keeps in memory (`piecework_core::Config::recent_ends`);
    /// `None` keeps the core's default.
    pub recent_ends: Option<usize>,
    /// Finished tasks' documents kept on disk (`piecework_core::Config::keep_task_docs`,
    /// [`KEEP_TASK_DOCS`] by default): the documents of the tasks that finished first go.
    pub keep_task_docs: usize,
    /// Sealed epoch documents kept on disk once out of memory
    /// (`piecework_core::Config::keep_sealed_epochs`, [`KEEP_SEALED_EPOCHS`] by default).
    pub keep_sealed_epochs: usize,
    /// The resources this node's pool holds from the start (`piecework node --resource`);
    /// tasks that require one are routed only to pools that hold it.
    pub resources: Vec<String>,
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
            disk_fault: None,
            rotation: None,
            archive_keep: storage::ARCHIVE_KEEP,
            max_live: None,
            recent_ends: None,
            keep_task_docs: KEEP_TASK_DOCS,
            keep_sealed_epochs: KEEP_SEALED_EPOCHS,
            resources: Vec::new(),
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
    /// The disk refuses writes (`Some`, with the error: submits are refused) or takes them
    /// again (`None`).
    Store {
        /// The error while failing.
        failing: Option<String>,
    },
}

/// Creates the data directory (and its missing parents) readable by its owner only; one that
/// exists is left as it is.
fn create_data_dir(dir: &std::path::Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
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
    /// The API token could not be loaded or created.
    #[error("API token file {0}")]
    Token(#[from] access::SecretFileError),
    /// The store could not be opened (is another node using this data directory?).
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The network could not start.
    #[error(transparent)]
    Net(#[from] net::StartError),
    /// Too many workers.
    #[error("a node runs at most {MAX_WORKERS} workers, not {0}")]
    TooManyWorkers(u32),
    /// The runtime could not start.
    #[error("cannot start a runtime for the node: {0}")]
    Runtime(std::io::Error),
}

/// The last six characters of a peer id, for logs and displays.
pub fn short_peer(peer: &PeerId) -> String {
    let s = peer.as_str();
    s[s.len().saturating_sub(6)..].to_owned()
}

/// The text of a panic's payload.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What every part of the node shares.
pub(crate) struct Shared {
    pub(crate) peer: PeerId,
    pub(crate) libp2p_peer: net::PeerId,
    pub(crate) incarnation: u64,
    pub(crate) store: storage::Store,
    pub(crate) net: net::Client,
    pub(crate) registry: Registry,
    pub(crate) events: broadcast::Sender<NodeEvent>,
    /// The queue events, numbered and kept for subscribers that resume.
    pub(crate) queue_events: events::EventLog,
    pub(crate) listen: RwLock<Vec<Multiaddr>>,
    pub(crate) views: RwLock<HashMap<QueueId, watch::Receiver<Arc<QueueView>>>>,
    pub(crate) commands: mpsc::Sender<shell::Request>,
    /// Why the shell ended, once it has (a stop, or the failure that ended it).
    pub(crate) ended: watch::Sender<Option<String>>,
    /// A fault to inject, for tests of what a panic in the shell does
    /// ([`NodeHandle::inject_shell_panic`]): the shell panics at its next turn.
    pub(crate) panic_injected: std::sync::atomic::AtomicBool,
    /// Stored chunks moved aside because they did not decode, since this start.
    pub(crate) quarantined: std::sync::atomic::AtomicU64,
    /// The token an API bound beyond loopback asks of every request ([`access`]).
    pub(crate) api_token: Arc<str>,
}

impl Shared {
    /// The addresses this node advertises, each ending in `/p2p/<peer>`.
    pub(crate) fn advertised(&self) -> Vec<String> {
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
        f.debug_struct("NodeHandle")
            .field("peer", &self.shared.peer)
            .finish()
    }
}

impl Node {
    /// Starts a node on the current tokio runtime: opens its store, starts the network and the
    /// shell, and reopens the queues it had joined.
    pub async fn start(config: Config) -> Result<Node, StartError> {
        if config.workers > MAX_WORKERS {
            return Err(StartError::TooManyWorkers(config.workers));
        }
        create_data_dir(&config.data_dir).map_err(|source| StartError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
        let keypair = identity::load_or_create(&config.data_dir)?;
        let api_token: Arc<str> = access::load_or_create_token(&config.data_dir)?.into();
        let libp2p_peer = keypair.public().to_peer_id();
        let store = storage::Store::open_with(
            &config.data_dir.join("piecework.redb"),
            config.disk_fault.clone(),
        )?
        .with_archive_keep(config.archive_keep);
        let incarnation = store
            .meta("incarnation")
            .await?
            .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
            .map_or(0, u64::from_le_bytes)
            + 1;
        store
            .set_meta("incarnation", incarnation.to_le_bytes().to_vec())
            .await?;
        let identity_secret: [u8; 32] = keypair
            .clone()
            .try_into_ed25519()
            .map(|k| {
                let secret = k.secret();
                let mut out = [0u8; 32];
                out.copy_from_slice(secret.as_ref());
                out
            })
            .map_err(|_| {
                StartError::Identity(identity::IdentityError::Corrupt(
                    config
                        .data_dir
                        .join(identity::KEY_FILE)
                        .display()
                        .to_string(),
                ))
            })?;
        let mut net_config = net::Config::new(keypair, config.listen.clone());
        net_config.bootstrap = config.bootstrap.clone();
        let net = net::spawn(net_config)?;
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let shared = Arc::new(Shared {
            peer: PeerId::new(libp2p_peer.to_string()),
            libp2p_peer,
            incarnation,
            store,
            net: net.client.clone(),
            registry: config.registry.clone(),
            events,
            queue_events: events::EventLog::new(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_millis() as u64)
                    .saturating_mul(1_000),
            ),
            listen: RwLock::new(vec![]),
            views: RwLock::new(HashMap::new()),
            commands,
            ended: watch::Sender::new(None),
            panic_injected: std::sync::atomic::AtomicBool::new(false),
            quarantined: std::sync::atomic::AtomicU64::new(0),
            api_token,
        });
        let span = tracing::info_span!("node", peer = %short_peer(&shared.peer));
        let t0 = piecework_core::Time {
            mono: std::time::Instant::now(),
            unix_ms: now_ms(),
        };
        let mut core_config = piecework_core::Config::new(
            shared.peer.clone(),
            incarnation,
            config.workers,
            rand::random(),
        )
        .with_identity_key(identity_secret);
        if let Some((ratio, min_live)) = config.rotation {
            core_config = core_config.with_rotation(ratio, min_live);
        }
        if let Some(n) = config.recent_ends {
            core_config = core_config.with_recent_ends(n);
        }
        if let Some(m) = config.max_live {
            core_config = core_config.with_max_live(m);
        }
        let retired = shared
            .store
            .retired()
            .await?
            .into_iter()
            .filter_map(|(doc, kind)| {
                let kind = match kind {
                    storage::RetiredKind::Task => piecework_core::Retired::Task,
                    storage::RetiredKind::Epoch => piecework_core::Retired::Epoch,
                };
                Some((piecework_replica::DocId::parse(&doc)?, kind))
            })
            .collect();
        let queues = shared.store.queues().await?;
        let mut resume = Vec::new();
        for (id, _) in &queues {
            if let Some(doc) = shared
                .store
                .epoch(id)
                .await?
                .and_then(|d| piecework_replica::DocId::parse(&d))
            {
                resume.push((QueueId::new(id.clone()), doc));
            }
        }
        core_config = core_config
            .with_disk_retention(config.keep_task_docs, config.keep_sealed_epochs)
            .with_retired(retired)
            .with_resume(resume)
            .with_capabilities(
                Some(shared.registry.kinds().map(str::to_owned).collect()),
                config.resources.clone(),
            );
        let core = piecework_core::Core::new(core_config, t0);
        let shell = shell::Shell::new(shared.clone(), core);
        let running = tokio::spawn(tracing::Instrument::instrument(
            shell.run(command_rx, net.events, net.gossip),
            span.clone(),
        ));
        // Whatever ends the shell is recorded and logged: a handle then answers with it,
        // never with a bare "channel closed".
        let ended_by = shared.clone();
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                let why = match running.await {
                    Ok(why) => why,
                    Err(e) if e.is_panic() => {
                        let why = format!("its shell panicked: {}", panic_text(e.into_panic()));
                        tracing::error!("the node stopped: {why}");
                        why
                    }
                    Err(_) => "its runtime was shut down".to_owned(),
                };
                ended_by.ended.send_replace(Some(why));
            },
            span,
        ));
        let handle = NodeHandle { shared };
        for (id, name) in queues {
            let id = QueueId::new(id);
            // From disk first; from peers if the queue document never reached the disk.
            if let Err(e) = handle.open_queue(&id, true).await {
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
    /// The token an API bound beyond loopback asks of every request (kept in the data
    /// directory, [`access::TOKEN_FILE`]).
    pub fn api_token(&self) -> &str {
        &self.shared.api_token
    }

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

    /// Waits until the node listens somewhere and returns its first advertised address (with
    /// `/p2p/<id>`).
    pub async fn wait_listening(&self) -> Multiaddr {
        let mut events = self.events();
        loop {
            if let Some(a) = self.shared.advertised().first() {
                return a.parse().expect("advertised addresses parse");
            }
            // The shell records listen addresses as it learns them, then announces them.
            if let Ok(NodeEvent::Listening(addrs)) = events.recv().await
                && let Some(a) = addrs.first()
            {
                return a.parse().expect("advertised addresses parse");
            }
        }
    }

    /// Dials a peer.
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), net::DialError> {
        self.shared.net.dial(addr).await
    }

    /// A watch on this node's view of `queue`, updated after every change.
    pub fn watch_queue(&self, queue: &QueueId) -> Option<watch::Receiver<Arc<QueueView>>> {
        let views = self.shared.views.read().unwrap_or_else(|e| e.into_inner());
        views.get(queue).cloned()
    }

    async fn ask(&self, command: Command) -> Option<Reply> {
        let (reply, rx) = oneshot::channel();
        self.shared
            .commands
            .send(shell::Request { command, reply })
            .await
            .ok()?;
        rx.await.ok()
    }

    /// Why the node's shell ended, for the error of a request it can no longer answer.
    fn ended(&self) -> String {
        self.shared
            .ended
            .borrow()
            .clone()
            .unwrap_or_else(|| "its shell is gone".to_owned())
    }

    /// Waits until the node's shell ends, and says why: a planned stop
    /// ([`NodeHandle::shutdown`]), or a failure (a panic, a closed channel). A process that
    /// serves a node should exit non-zero when it ends by failure, rather than keep an API
    /// that can only answer that the node is gone.
    pub async fn ended_with(&self) -> String {
        let mut rx = self.shared.ended.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => "its shell is gone".to_owned(),
        }
    }

    /// Makes the node's shell panic at its next turn: a fault injected by tests (and by the
    /// binary's hidden `--fault-panic-after-ms`) to show what a bug in the shell does.
    #[doc(hidden)]
    pub async fn inject_shell_panic(&self) {
        self.shared
            .panic_injected
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // Any command wakes the shell for a turn.
        let _ = self.status().await;
    }

    /// Stops the node for a planned restart or shutdown, and returns what it did. At once it
    /// starts no new run, refuses assignments (their routers route them elsewhere) and stops
    /// claiming; the router of each queue it routes hands its role to another member, which
    /// claims without waiting `takeover_after`. Runs in progress get `grace` to end; those
    /// still running then are recorded interrupted and run again elsewhere. Once every change
    /// is on disk the node's shell ends: requests to it then fail with
    /// [`QueueError::Ended`] and the like. Drop every handle to release the data directory.
    pub async fn shutdown(&self, grace: Duration) -> Result<api::StopReport, QueueError> {
        match self.ask(Command::Stop { grace }).await {
            Some(Reply::Stopped(report)) => Ok(report),
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Creates a queue with this node as its first member; returns its id.
    pub async fn create_queue(
        &self,
        name: &str,
        config: Option<QueueConfig>,
    ) -> Result<QueueId, QueueError> {
        let command = Command::CreateQueue {
            name: name.to_owned(),
            config: config.unwrap_or_default(),
        };
        match self.ask(command).await {
            Some(Reply::Created(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Reopens a queue this node joined before (on its disk, or given by a connected member
    /// that counts it as one); returns its view. A node that never joined gets
    /// [`QueueError::InviteNeeded`]: see [`NodeHandle::join_invite`].
    pub async fn join_queue(&self, id: &QueueId) -> Result<Arc<QueueView>, QueueError> {
        // Storage, then the connected peers once: a peer that is not a member is refused the
        // queue's documents, and told to ask for an invite.
        self.open_queue(id, false).await
    }

    /// Joins a queue with an invite token: returns once this node holds the queue document.
    pub async fn join_invite(&self, token: &str) -> Result<Arc<QueueView>, QueueError> {
        let command = Command::JoinInvite {
            token: token.to_owned(),
        };
        match self.ask(command).await {
            Some(Reply::Joined(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Joins `queue` with an invite for this node that `admin` (a node that is an admin of
    /// the queue) makes, giving it `role`: what `piecework queue invite --for` and `queue
    /// join` do, for programs that hold both handles (tests, demos, benchmarks).
    pub async fn join_from(
        &self,
        admin: &NodeHandle,
        queue: &QueueId,
        role: piecework_queue_doc::Role,
    ) -> Result<Arc<QueueView>, QueueError> {
        let request = api::InviteRequest {
            role: Some(role),
            for_peer: Some(self.shared.peer.clone()),
            expires_ms: None,
        };
        let invited = admin.invite(queue, request).await?;
        self.join_invite(&invited.token).await
    }

    /// Makes an invite to a queue this node is an admin of.
    pub async fn invite(
        &self,
        queue: &QueueId,
        request: api::InviteRequest,
    ) -> Result<api::Invited, QueueError> {
        let command = Command::Invite {
            queue: queue.clone(),
            request,
        };
        match self.ask(command).await {
            Some(Reply::Invited(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// A queue's members (removed ones too).
    pub async fn members(&self, queue: &QueueId) -> Result<Vec<api::MemberEntry>, QueueError> {
        match self
            .ask(Command::Members {
                queue: queue.clone(),
            })
            .await
        {
            Some(Reply::Members(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Removes a member of a queue (this node must be an admin of it, or the member).
    pub async fn remove_member(
        &self,
        queue: &QueueId,
        peer: &PeerId,
    ) -> Result<Vec<api::MemberEntry>, QueueError> {
        let command = Command::RemoveMember {
            queue: queue.clone(),
            peer: peer.clone(),
        };
        match self.ask(command).await {
            Some(Reply::Members(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    async fn open_queue(
        &self,
        id: &QueueId,
        from_peers: bool,
    ) -> Result<Arc<QueueView>, QueueError> {
        let command = Command::JoinQueue {
            id: id.clone(),
            from_peers,
        };
        match self.ask(command).await {
            Some(Reply::Joined(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Pauses (or resumes) routing of a queue, for every router: written into the queue
    /// document, so any member can pause and any other resume. Returns the queue's status.
    pub async fn set_paused(
        &self,
        queue: &QueueId,
        paused: bool,
    ) -> Result<api::QueueStatus, QueueError> {
        let command = Command::SetPaused {
            queue: queue.clone(),
            paused,
        };
        match self.ask(command).await {
            Some(Reply::Paused(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Changes the fields of a queue's configuration that `patch` names, for every member, once
    /// the configuration they give is valid ([`QueueError::InvalidConfig`] otherwise, and
    /// nothing is written). Returns the queue's status.
    pub async fn set_config(
        &self,
        queue: &QueueId,
        patch: piecework_queue_doc::ConfigPatch,
    ) -> Result<api::QueueStatus, QueueError> {
        let command = Command::SetConfig {
            queue: queue.clone(),
            patch,
        };
        match self.ask(command).await {
            Some(Reply::Configured(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// A page of a queue's tasks, by id (see [`Command::ListTasks`]).
    pub async fn list_tasks(
        &self,
        queue: &QueueId,
        state: Option<piecework_queue_doc::TaskState>,
        limit: usize,
        cursor: Option<piecework_queue_doc::TaskId>,
    ) -> Result<api::TaskList, QueueError> {
        let command = Command::ListTasks {
            queue: queue.clone(),
            state,
            limit,
            cursor,
        };
        match self.ask(command).await {
            Some(Reply::Tasks(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Sets the boost of priority tag `tag` in a queue, for every member (0 removes it).
    /// Returns the queue's status.
    pub async fn set_boost(
        &self,
        queue: &QueueId,
        tag: &str,
        boost: i64,
    ) -> Result<api::QueueStatus, QueueError> {
        let command = Command::SetBoost {
            queue: queue.clone(),
            tag: tag.to_owned(),
            boost,
        };
        match self.ask(command).await {
            Some(Reply::Configured(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// Writes schedule `name` of a queue (new, or a new version of it), for every member: the
    /// queue's active router submits its task at every slot. Returns the queue's schedules.
    pub async fn put_schedule(
        &self,
        queue: &QueueId,
        name: &str,
        schedule: api::PutSchedule,
    ) -> Result<api::Schedules, QueueError> {
        self.schedules_reply(Command::PutSchedule {
            queue: queue.clone(),
            name: name.to_owned(),
            schedule: Box::new(schedule),
        })
        .await
    }

    /// Deletes schedule `name` of a queue. Returns the schedules left.
    pub async fn delete_schedule(
        &self,
        queue: &QueueId,
        name: &str,
    ) -> Result<api::Schedules, QueueError> {
        self.schedules_reply(Command::DeleteSchedule {
            queue: queue.clone(),
            name: name.to_owned(),
        })
        .await
    }

    /// A queue's schedules, as this node's view shows them.
    pub async fn schedules(&self, queue: &QueueId) -> Result<api::Schedules, QueueError> {
        self.schedules_reply(Command::Schedules {
            queue: queue.clone(),
        })
        .await
    }

    async fn schedules_reply(&self, command: Command) -> Result<api::Schedules, QueueError> {
        match self.ask(command).await {
            Some(Reply::Schedules(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// This node's resources, held and withdrawn.
    pub async fn resources(&self) -> api::Resources {
        match self.ask(Command::Resources).await {
            Some(Reply::Resources(Ok(r))) => r,
            _ => api::Resources::default(),
        }
    }

    /// Holds `name` from now on (again, if it was withdrawn): this node's pool advertises it
    /// in its heartbeats, and routers assign it tasks that require it. Returns the resources.
    pub async fn add_resource(&self, name: &str) -> Result<api::Resources, api::ResourceError> {
        let command = Command::AddResource {
            name: name.to_owned(),
        };
        match self.ask(command).await {
            Some(Reply::Resources(r)) => r,
            _ => Err(api::ResourceError::Ended(self.ended())),
        }
    }

    /// Gives `name` up: for `restore_after`, after which this node holds it again by itself,
    /// or for good with `None`. Returns the resources.
    pub async fn withdraw_resource(
        &self,
        name: &str,
        restore_after: Option<Duration>,
    ) -> Result<api::Resources, api::ResourceError> {
        let command = Command::WithdrawResource {
            name: name.to_owned(),
            restore_after,
        };
        match self.ask(command).await {
            Some(Reply::Resources(r)) => r,
            _ => Err(api::ResourceError::Ended(self.ended())),
        }
    }

    /// The status of a queue this node has joined.
    pub async fn queue_status(&self, queue: &QueueId) -> Result<api::QueueStatus, QueueError> {
        let Some(Reply::Status(status)) = self.ask(Command::Status).await else {
            return Err(QueueError::Ended(self.ended()));
        };
        status
            .queues
            .into_iter()
            .find(|q| q.id == *queue)
            .ok_or_else(|| QueueError::NotJoined(queue.clone()))
    }

    /// Submits a task: creates its task document and indexes it in the queue. Returns once both
    /// are on disk (with every earlier change of both documents) and, when a member of the queue
    /// is connected, once one holds both too (up to [`REPLICATION_WAIT`]; `replicated` says
    /// whether that happened), so that the task survives this node dying right after. A task
    /// that cannot be written to disk is answered [`SubmitError::NotDurable`].
    pub async fn submit(
        &self,
        queue: &QueueId,
        req: api::SubmitTask,
    ) -> Result<api::Submitted, SubmitError> {
        let command = Command::Submit {
            queue: queue.clone(),
            task: req,
        };
        match self.ask(command).await {
            Some(Reply::Submitted(r)) => r,
            _ => Err(SubmitError::Ended(self.ended())),
        }
    }

    /// Submits up to [`api::MAX_BATCH`] tasks at once, with one change to the queue document
    /// and one durable acknowledgement for the batch (the same wait as [`NodeHandle::submit`]).
    /// The answer has one entry per task, in order: its id, or why that entry was refused (an
    /// empty kind, a priority out of range); the valid entries are submitted either way. The
    /// whole batch fails only if the node cannot take it (not joined, busy, too many entries,
    /// not durable).
    pub async fn submit_many(
        &self,
        queue: &QueueId,
        tasks: Vec<api::SubmitTask>,
    ) -> Result<Vec<api::BatchEntry>, SubmitError> {
        let command = Command::SubmitMany {
            queue: queue.clone(),
            tasks,
        };
        match self.ask(command).await {
            Some(Reply::SubmittedMany(r)) => r,
            _ => Err(SubmitError::Ended(self.ended())),
        }
    }

    /// A task's status: its state per this node's replica of its queue, its attempts and runs.
    pub async fn task_status(&self, id: &TaskId) -> Result<api::TaskStatus, TaskError> {
        self.task(id, None).await
    }

    /// Waits until the task succeeds or fails for good (and, on success, until this node has
    /// its result), up to `timeout`.
    pub async fn wait_task(
        &self,
        id: &TaskId,
        timeout: Duration,
    ) -> Result<api::TaskStatus, TaskError> {
        self.task(id, Some(timeout)).await
    }

    /// Cancels a task that has not ended, for every member: a pending or blocked task never
    /// starts where the cancel is known, and a running one's handler is signalled to stop (a
    /// success it still returns stands). Returns its status ([`TaskError::Conflict`] if it
    /// ended).
    pub async fn cancel_task(&self, id: &TaskId) -> Result<api::TaskStatus, TaskError> {
        let command = Command::CancelTask { task: id.clone() };
        match self.ask(command).await {
            Some(Reply::Task(r)) => *r,
            _ => Err(TaskError::Ended(self.ended())),
        }
    }

    /// Requeues a dead-lettered (`failed`) task: pending again with a fresh budget of
    /// `max_attempts` failures, its history kept. Returns its status ([`TaskError::Conflict`]
    /// if it is not failed).
    pub async fn requeue_task(&self, id: &TaskId) -> Result<api::TaskStatus, TaskError> {
        let command = Command::RequeueTask { task: id.clone() };
        match self.ask(command).await {
            Some(Reply::Task(r)) => *r,
            _ => Err(TaskError::Ended(self.ended())),
        }
    }

    /// Submits the undo tasks a succeeded task's run recorded ([`piecework_worker_pool::Context::undo`]);
    /// returns their ids. Each is made once, however many members undo the task
    /// ([`TaskError::Conflict`] if it did not succeed).
    pub async fn undo_task(&self, id: &TaskId) -> Result<Vec<TaskId>, TaskError> {
        let command = Command::UndoTask { task: id.clone() };
        match self.ask(command).await {
            Some(Reply::Undone(r)) => r,
            _ => Err(TaskError::Ended(self.ended())),
        }
    }

    /// The life of this node's queues and their tasks as events ([`api::QueueEvent`]), as its
    /// replica learns it: the events kept after id `after` (none if `None`), then the live
    /// ones. The node keeps the last [`EVENT_LOG`] events.
    pub fn queue_events(&self, after: Option<u64>) -> Subscription {
        self.shared.queue_events.subscribe(after)
    }

    /// Requeues every dead-lettered task of a queue; returns their ids.
    pub async fn requeue_failed(&self, queue: &QueueId) -> Result<Vec<TaskId>, QueueError> {
        let command = Command::RequeueFailed {
            queue: queue.clone(),
        };
        match self.ask(command).await {
            Some(Reply::TaskIds(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    async fn task(
        &self,
        id: &TaskId,
        wait: Option<Duration>,
    ) -> Result<api::TaskStatus, TaskError> {
        let command = Command::TaskStatus {
            task: id.clone(),
            wait,
        };
        match self.ask(command).await {
            Some(Reply::Task(r)) => *r,
            _ => Err(TaskError::Ended(self.ended())),
        }
    }

    /// A queue's current epoch number and its document, saved whole (for benchmarks and
    /// diagnostics: it costs time in the document's size).
    pub async fn queue_document(&self, queue: &QueueId) -> Result<(u64, Vec<u8>), QueueError> {
        match self
            .ask(Command::QueueDocument {
                queue: queue.clone(),
            })
            .await
        {
            Some(Reply::Document(r)) => r,
            _ => Err(QueueError::Ended(self.ended())),
        }
    }

    /// This node's status: its queues, workers and connections.
    pub async fn status(&self) -> Result<api::NodeStatus, QueueError> {
        let info = self
            .shared
            .net
            .info()
            .await
            .map_err(|_| QueueError::Ended(self.ended()))?;
        let Some(Reply::Status(status)) = self.ask(Command::Status).await else {
            return Err(QueueError::Ended(self.ended()));
        };
        Ok(api::NodeStatus {
            peer_id: self.shared.peer.to_string(),
            incarnation: self.shared.incarnation,
            listen: self.shared.advertised(),
            connected: info.connected.iter().map(ToString::to_string).collect(),
            kinds: self.shared.registry.kinds().map(str::to_owned).collect(),
            queues: status.queues,
            workers: status.workers,
            documents_loaded: status.documents_loaded,
            internals: {
                let mut internals = status.internals;
                internals.insert(
                    "quarantined_chunks".to_owned(),
                    usize::try_from(
                        self.shared
                            .quarantined
                            .load(std::sync::atomic::Ordering::Relaxed),
                    )
                    .unwrap_or(usize::MAX),
                );
                internals
            },
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
        .map_err(StartError::Runtime)?;
    let node = runtime
        .spawn(Node::start(config))
        .await
        .map_err(|_| StartError::Storage(storage::StorageError::Stopped))??;
    Ok(IsolatedNode {
        handle: node.handle,
        runtime: Some(runtime),
    })
}
