//! The node's actor: one task owning the documents (a [`Replica`]), the routers (one per queue)
//! and the pool. It feeds them network messages, heartbeats and the clock, carries out their
//! actions, persists every change, and answers [`Command`]s from [`crate::NodeHandle`].
//!
//! Requests that must wait for something (a document to arrive from a peer, a submit to reach a
//! peer, a task to finish) are parked here and resumed by the events that complete them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::{Automerge, ChangeHash};
use piecework_net as net;
use piecework_queue_doc::replica::{DocId, Event as ReplicaEvent, Message, Replica};
use piecework_queue_doc::task::{self, NewTask, RunEnd as TaskRunEnd, RunStart};
use piecework_queue_doc::{
    AttemptOutcome, PeerId, QueueConfig, QueueId, QueueView, RunningReport, Submission, TaskId,
    TaskState, ViewCache, queue,
};
use piecework_router::{Action as RouterAction, Role, Router};
use piecework_worker_pool::{
    Action as PoolAction, Config as PoolConfig, Context, Outcome, Pool, Run, RunEnd, execute,
};
use tokio::sync::{mpsc, oneshot, watch};

use crate::wire::Wire;
use crate::{NodeEvent, QueueError, Shared, SubmitError, TaskError, api, now_ms};

/// How often the actor dials members it is not connected to.
const DIAL_EVERY: Duration = Duration::from_secs(2);
/// Stored change chunks of one document that trigger a compaction into a snapshot.
const COMPACT_AFTER: usize = 256;
/// Network events handled per tick at most, before the actor answers them.
const NET_BATCH: usize = 256;
/// Capacity of the actor's internal input queue (run results, storage answers).
const INPUT_QUEUE: usize = 1024;

pub(crate) enum Command {
    CreateQueue {
        name: String,
        config: QueueConfig,
        reply: oneshot::Sender<Result<QueueId, QueueError>>,
    },
    OpenQueue {
        id: QueueId,
        from_peers: bool,
        reply: oneshot::Sender<Result<Arc<QueueView>, QueueError>>,
    },
    SetPaused {
        queue: QueueId,
        paused: bool,
        reply: oneshot::Sender<Result<(), QueueError>>,
    },
    Submit {
        queue: QueueId,
        req: api::SubmitTask,
        reply: oneshot::Sender<Result<api::Submitted, SubmitError>>,
    },
    TaskStatus {
        task: TaskId,
        wait: bool,
        reply: oneshot::Sender<Result<api::TaskStatus, TaskError>>,
    },
    Status {
        reply: oneshot::Sender<Status>,
    },
}

pub(crate) struct Status {
    pub(crate) queues: Vec<(QueueId, String)>,
    pub(crate) workers: Vec<api::WorkerStatus>,
    pub(crate) documents_loaded: usize,
}

enum Input {
    Loaded {
        doc: DocId,
        chunks: Result<Vec<Vec<u8>>, String>,
    },
    RunEnded(Box<(Run, RunStart, Outcome)>),
    Durable {
        submit: u64,
    },
    /// A save started by [`Actor::save_now`] ended (on disk or failed).
    Saved(DocId),
}

/// A `task status --wait` parked until the task reaches an outcome.
type TaskWaiter = (
    TaskId,
    QueueId,
    oneshot::Sender<Result<api::TaskStatus, TaskError>>,
);

/// Something parked until a document arrives (or turns out unavailable).
enum DocWaiter {
    Join {
        id: QueueId,
        from_peers: bool,
        reply: oneshot::Sender<Result<Arc<QueueView>, QueueError>>,
    },
    Status {
        task: TaskId,
        wait: bool,
        reply: oneshot::Sender<Result<api::TaskStatus, TaskError>>,
    },
    Start(Run),
}

struct SubmitWait {
    id: u64,
    task: TaskId,
    task_doc: DocId,
    task_heads: Vec<ChangeHash>,
    queue_doc: DocId,
    queue_heads: Vec<ChangeHash>,
    durable: bool,
    deadline: Instant,
    reply: oneshot::Sender<Result<api::Submitted, SubmitError>>,
}

struct Queue {
    router: Router,
    cache: ViewCache,
    view: Arc<QueueView>,
    view_tx: watch::Sender<Arc<QueueView>>,
    topic: String,
}

pub(crate) struct Actor {
    shared: Arc<Shared>,
    replica: Replica,
    pool: Pool,
    queues: BTreeMap<QueueId, Queue>,
    topics: HashMap<String, QueueId>,
    inputs_tx: mpsc::Sender<Input>,
    inputs: mpsc::Receiver<Input>,
    connected: HashSet<net::PeerId>,
    next_dial: Instant,
    /// Documents changed since the last flush to storage.
    unsaved: BTreeSet<DocId>,
    /// Change chunks stored per document since its last snapshot.
    chunks: HashMap<DocId, usize>,
    /// Saves in flight per document.
    saving: HashMap<DocId, usize>,
    /// Queues whose document changed since their view was last refreshed.
    stale: BTreeSet<QueueId>,
    doc_waiters: HashMap<DocId, Vec<DocWaiter>>,
    /// Joins that found no peer with the queue yet: retried when a peer connects.
    join_retries: Vec<DocWaiter>,
    task_waiters: Vec<TaskWaiter>,
    submit_waits: Vec<SubmitWait>,
    next_submit: u64,
    /// Final tasks whose documents can leave memory once saved.
    to_evict: Vec<DocId>,
}

fn queue_doc(id: &QueueId) -> Option<DocId> {
    DocId::parse(id.as_str())
}

fn task_doc(id: &TaskId) -> Option<DocId> {
    DocId::parse(id.as_str())
}

impl Actor {
    pub(crate) fn new(shared: Arc<Shared>, replica: Replica) -> Self {
        let now = Instant::now();
        let pool = Pool::new(
            PoolConfig {
                peer: shared.peer.clone(),
                workers: shared.workers,
                incarnation: shared.incarnation,
                heartbeat: Duration::from_millis(500),
            },
            now,
        );
        let (inputs_tx, inputs) = mpsc::channel(INPUT_QUEUE);
        Actor {
            shared,
            replica,
            pool,
            queues: BTreeMap::new(),
            topics: HashMap::new(),
            inputs_tx,
            inputs,
            connected: HashSet::new(),
            next_dial: now,
            unsaved: BTreeSet::new(),
            chunks: HashMap::new(),
            stale: BTreeSet::new(),
            doc_waiters: HashMap::new(),
            join_retries: vec![],
            task_waiters: vec![],
            submit_waits: vec![],
            next_submit: 0,
            to_evict: vec![],
            saving: HashMap::new(),
        }
    }

    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut net_events: mpsc::Receiver<net::Event>,
    ) {
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                input = self.inputs.recv() => match input {
                    Some(i) => self.handle_input(i),
                    None => break,
                },
                ev = net_events.recv() => match ev {
                    Some(e) => {
                        self.handle_net(e);
                        // Take what else has arrived too, so that one tick answers them all.
                        for _ in 0..NET_BATCH {
                            match net_events.try_recv() {
                                Ok(e) => self.handle_net(e),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                cmd = commands.recv() => match cmd {
                    Some(c) => self.handle_command(c),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
            self.tick();
        }
        tracing::debug!("node actor stopped");
    }

    fn next_deadline(&self) -> Instant {
        let mut t = self.pool.poll_timeout().min(self.next_dial);
        for q in self.queues.values() {
            if let Some(r) = q.router.poll_timeout() {
                t = t.min(r);
            }
        }
        for w in &self.submit_waits {
            t = t.min(w.deadline);
        }
        t
    }

    /// Runs after every input: drives timers, carries out actions until none is left, flushes
    /// changes to storage and the network, and resumes whatever waited on them.
    fn tick(&mut self) {
        let now = Instant::now();
        loop {
            self.drain_replica();
            let stale: Vec<QueueId> = std::mem::take(&mut self.stale).into_iter().collect();
            for id in &stale {
                self.refresh(now, id);
            }
            for q in self.queues.values_mut() {
                q.router.handle_timeout(now);
            }
            self.pool.handle_timeout(now);
            let acted = self.drain_actions(now);
            if !acted && self.stale.is_empty() {
                break;
            }
        }
        self.flush();
        self.evict();
        self.check_submits(now);
        self.check_task_waiters();
        if now >= self.next_dial {
            self.dial_members();
            self.next_dial = now + DIAL_EVERY;
        }
    }

    // ----- documents -----

    /// Carries out the replica's outputs: messages to peers, loads, and arrivals.
    fn drain_replica(&mut self) {
        while let Some((peer, msg)) = self.replica.poll_transmit() {
            let Ok(p) = peer.as_str().parse::<net::PeerId>() else {
                continue;
            };
            if !self.shared.net.send_sync(&p, msg.encode()) {
                tracing::debug!(%peer, "sync message not sent (stream closed or full)");
            }
        }
        while let Some(ev) = self.replica.poll_event() {
            match ev {
                ReplicaEvent::Load(doc) => {
                    let store = self.shared.store.clone();
                    let tx = self.inputs_tx.clone();
                    tokio::spawn(async move {
                        let chunks = store
                            .load_doc(doc.as_str())
                            .await
                            .map_err(|e| e.to_string());
                        let _ = tx.send(Input::Loaded { doc, chunks }).await;
                    });
                }
                ReplicaEvent::Changed(doc) => self.changed(&doc),
                ReplicaEvent::Arrived(doc) => self.arrived(&doc),
                ReplicaEvent::Unavailable(doc) => self.unavailable(&doc),
                ReplicaEvent::Rejected { peer, reason } => {
                    tracing::warn!(%peer, "rejected a sync message: {reason}");
                }
            }
        }
    }

    /// A document changed (here or from a peer): save it, and refresh its queue's view.
    fn changed(&mut self, doc: &DocId) {
        self.unsaved.insert(doc.clone());
        let q = QueueId::new(doc.as_str());
        if self.queues.contains_key(&q) {
            self.stale.insert(q);
        }
    }

    /// Applies a local change to a loaded document; `None` if it is not loaded.
    fn change<R>(&mut self, doc: &DocId, f: impl FnOnce(&mut Automerge) -> R) -> Option<R> {
        let r = self.replica.change(doc, f)?;
        self.changed(doc);
        Some(r)
    }

    /// Hands every unsaved change to the store, in the background. Returns nothing: durability
    /// waits use [`Actor::save_now`].
    fn flush(&mut self) {
        for doc in std::mem::take(&mut self.unsaved) {
            // The save runs in its own task; nobody waits for this one.
            drop(self.save_now(&doc));
        }
    }

    /// Starts saving `doc`'s unsaved changes; the future resolves once they are on disk.
    fn save_now(
        &mut self,
        doc: &DocId,
    ) -> impl std::future::Future<Output = Result<(), crate::storage::StorageError>> + use<> {
        let changes: Vec<(String, Vec<u8>)> = self
            .replica
            .take_unsaved(doc)
            .into_iter()
            .map(|(h, b)| (h.to_string(), b))
            .collect();
        let store = self.shared.store.clone();
        let count = self.chunks.entry(doc.clone()).or_default();
        *count += changes.len();
        let compact = match *count >= COMPACT_AFTER {
            true => self.replica.get(doc).map(|d| {
                let hashes = d
                    .get_changes(&[])
                    .iter()
                    .map(|c| c.hash().to_string())
                    .collect::<Vec<_>>();
                (d.save(), hashes)
            }),
            false => None,
        };
        if compact.is_some() {
            self.chunks.insert(doc.clone(), 0);
        }
        let id = doc.to_string();
        let write = async move {
            store.append(&id, changes).await?;
            if let Some((snapshot, hashes)) = compact {
                store.compact(&id, snapshot, hashes).await?;
            }
            Ok(())
        };
        let (tx, rx) = oneshot::channel();
        let doc_name = doc.to_string();
        // Until this write is on disk the document stays in memory: evicting it earlier would let
        // a reload from storage miss these changes.
        *self.saving.entry(doc.clone()).or_default() += 1;
        let inputs = self.inputs_tx.clone();
        let saved = doc.clone();
        tokio::spawn(async move {
            let r = write.await;
            let _ = inputs.send(Input::Saved(saved)).await;
            match &r {
                Ok(()) => {}
                // The node is being killed or stopped: nothing is lost that a restart would not redo.
                Err(crate::storage::StorageError::Stopped) => {
                    tracing::debug!(doc = %doc_name, "save abandoned: stopping")
                }
                Err(e) => tracing::error!(doc = %doc_name, "cannot save changes: {e}"),
            }
            let _ = tx.send(r);
        });
        async move {
            rx.await
                .unwrap_or(Err(crate::storage::StorageError::Stopped))
        }
    }

    fn handle_loaded(&mut self, doc: DocId, chunks: Result<Vec<Vec<u8>>, String>) {
        let loaded = match chunks {
            Ok(chunks) if chunks.is_empty() => None,
            Ok(chunks) => {
                self.chunks.insert(doc.clone(), chunks.len());
                let mut d = Automerge::new();
                let mut ok = true;
                for c in &chunks {
                    if let Err(e) = d.load_incremental(c) {
                        tracing::error!(%doc, "a stored chunk does not load: {e}; the chunk is kept, the document treated as absent");
                        ok = false;
                        break;
                    }
                }
                ok.then_some(d)
            }
            Err(e) => {
                tracing::error!(%doc, "cannot read the document: {e}");
                None
            }
        };
        self.replica.handle_loaded(&doc, loaded);
    }

    /// A document this node waited for is loaded.
    fn arrived(&mut self, doc: &DocId) {
        for w in self.doc_waiters.remove(doc).unwrap_or_default() {
            match w {
                DocWaiter::Join { id, reply, .. } => {
                    let r = self.finish_join(&id);
                    let _ = reply.send(r);
                }
                DocWaiter::Status { task, wait, reply } => self.answer_status(task, wait, reply),
                DocWaiter::Start(run) => self.start_run(run),
            }
        }
    }

    fn unavailable(&mut self, doc: &DocId) {
        for w in self.doc_waiters.remove(doc).unwrap_or_default() {
            match w {
                DocWaiter::Join {
                    id,
                    from_peers: true,
                    reply,
                } => {
                    // Ask again when another peer connects; the caller's timeout bounds it.
                    self.join_retries.push(DocWaiter::Join {
                        id,
                        from_peers: true,
                        reply,
                    });
                }
                DocWaiter::Join { id, reply, .. } => {
                    let _ = reply.send(Err(QueueError::NotFound(id)));
                }
                DocWaiter::Status { task, reply, .. } => {
                    let _ = reply.send(Err(TaskError::NotFound(task)));
                }
                DocWaiter::Start(run) => {
                    self.pool.handle_start_failed(
                        run.worker.index,
                        "the task document is unavailable".into(),
                    );
                }
            }
        }
    }

    fn wait_for(&mut self, doc: &DocId, shared: bool, waiter: DocWaiter) {
        self.doc_waiters
            .entry(doc.clone())
            .or_default()
            .push(waiter);
        self.replica.fetch(doc, shared);
    }

    /// Drops final tasks' documents from memory once they are saved.
    fn evict(&mut self) {
        let pending = std::mem::take(&mut self.to_evict);
        for doc in pending {
            if self.doc_waiters.contains_key(&doc)
                || self.unsaved.contains(&doc)
                || self.saving.contains_key(&doc)
                || !self.replica.evict(&doc)
            {
                self.to_evict.push(doc);
            }
        }
    }

    // ----- commands -----

    fn handle_command(&mut self, c: Command) {
        match c {
            Command::CreateQueue {
                name,
                config,
                reply,
            } => {
                let r = self.create_queue(&name, &config);
                let _ = reply.send(r);
            }
            Command::OpenQueue {
                id,
                from_peers,
                reply,
            } => {
                if let Some(q) = self.queues.get(&id) {
                    let _ = reply.send(Ok(q.view.clone()));
                    return;
                }
                let Some(doc) = queue_doc(&id) else {
                    let _ = reply.send(Err(QueueError::BadId(id.to_string())));
                    return;
                };
                self.wait_for(
                    &doc,
                    true,
                    DocWaiter::Join {
                        id,
                        from_peers,
                        reply,
                    },
                );
            }
            Command::SetPaused {
                queue,
                paused,
                reply,
            } => {
                let r = match queue_doc(&queue).filter(|_| self.queues.contains_key(&queue)) {
                    None => Err(QueueError::NotJoined(queue)),
                    Some(doc) => self
                        .change(&doc, |d| queue::set_paused(d, paused))
                        .unwrap_or(Err(queue::WriteError::NotAQueue))
                        .map_err(QueueError::from),
                };
                let _ = reply.send(r);
            }
            Command::Submit { queue, req, reply } => self.submit(queue, req, reply),
            Command::TaskStatus { task, wait, reply } => {
                let Some(doc) = task_doc(&task) else {
                    let _ = reply.send(Err(TaskError::BadId(task.to_string())));
                    return;
                };
                // Answered at once if the document is here with content, else once it arrives.
                self.wait_for(&doc, false, DocWaiter::Status { task, wait, reply });
            }
            Command::Status { reply } => {
                let queues = self
                    .queues
                    .iter()
                    .map(|(id, q)| {
                        let role = match q.router.role() {
                            Role::Follower => "follower",
                            Role::Claiming { .. } => "claiming",
                            Role::Active { .. } => "active",
                        };
                        (id.clone(), role.to_owned())
                    })
                    .collect();
                let workers = self
                    .pool
                    .runs()
                    .map(|(i, run)| api::WorkerStatus {
                        name: format!("{}/{i}", self.shared.peer),
                        running: run.map(|r| RunningReport {
                            queue: r.queue.clone(),
                            task: r.task.clone(),
                            attempt: r.attempt.clone(),
                        }),
                    })
                    .collect();
                let _ = reply.send(Status {
                    queues,
                    workers,
                    documents_loaded: self.replica.loaded(),
                });
            }
        }
    }

    fn create_queue(&mut self, name: &str, config: &QueueConfig) -> Result<QueueId, QueueError> {
        let mut doc = Automerge::new();
        queue::create(&mut doc, name, config, &self.shared.peer, now_ms())?;
        queue::set_member(
            &mut doc,
            &self.shared.peer,
            &self.shared.advertised(),
            now_ms(),
        )?;
        let id = DocId::generate(&mut rand::rng());
        self.replica.create(id.clone(), doc, true);
        self.changed(&id);
        let qid = QueueId::new(id.as_str());
        self.register(qid.clone(), name);
        Ok(qid)
    }

    /// Completes a join or reopen: the queue document is loaded.
    fn finish_join(&mut self, id: &QueueId) -> Result<Arc<QueueView>, QueueError> {
        let doc = queue_doc(id).ok_or_else(|| QueueError::BadId(id.to_string()))?;
        let view = self
            .replica
            .get(&doc)
            .and_then(QueueView::read)
            .ok_or_else(|| QueueError::NotAQueue(id.clone()))?;
        let me = self.shared.peer.clone();
        let addrs = self.shared.advertised();
        if view.members.get(&me).is_none_or(|m| m.addrs != addrs) {
            self.change(&doc, |d| queue::set_member(d, &me, &addrs, now_ms()))
                .unwrap_or(Err(queue::WriteError::NotAQueue))?;
        }
        self.replica.set_shared(&doc, true);
        self.register(id.clone(), &view.name);
        Ok(self
            .queues
            .get(id)
            .map_or_else(|| Arc::new(view), |q| q.view.clone()))
    }

    /// Starts serving a queue: a router, a view, its gossip topic.
    fn register(&mut self, id: QueueId, name: &str) {
        if self.queues.contains_key(&id) {
            return;
        }
        let now = Instant::now();
        let store = self.shared.store.clone();
        let (qid, qname) = (id.to_string(), name.to_owned());
        tokio::spawn(async move {
            if let Err(e) = store.add_queue(&qid, &qname).await {
                tracing::error!(queue = %qid, "cannot remember the queue: {e}");
            }
        });
        let topic = net::topic_for(id.as_str());
        let net = self.shared.net.clone();
        let t = topic.clone();
        tokio::spawn(async move {
            let _ = net.subscribe(t).await;
        });
        let (view_tx, view_rx) = watch::channel(Arc::new(QueueView::default()));
        {
            let mut views = self.shared.views.write().unwrap_or_else(|e| e.into_inner());
            views.insert(id.clone(), view_rx);
        }
        self.topics.insert(topic.clone(), id.clone());
        self.queues.insert(
            id.clone(),
            Queue {
                router: Router::new(id.clone(), self.shared.peer.clone(), now),
                cache: ViewCache::new(),
                view: Arc::new(QueueView::default()),
                view_tx,
                topic,
            },
        );
        self.refresh(now, &id);
        if let Some(q) = self.queues.get(&id) {
            let beat = Duration::from_millis(q.view.config.pool_heartbeat_ms);
            if beat < self.pool.config().heartbeat {
                self.pool.set_heartbeat(beat);
            }
        }
        self.next_dial = now;
    }

    fn submit(
        &mut self,
        queue_id: QueueId,
        req: api::SubmitTask,
        reply: oneshot::Sender<Result<api::Submitted, SubmitError>>,
    ) {
        let Some(qdoc) = queue_doc(&queue_id).filter(|_| self.queues.contains_key(&queue_id))
        else {
            let _ = reply.send(Err(SubmitError::NotJoined(queue_id)));
            return;
        };
        let now = now_ms();
        let mut doc = Automerge::new();
        let new = NewTask {
            queue: queue_id.clone(),
            kind: req.kind.clone(),
            input: req.input,
            submitter: self.shared.peer.clone(),
            submitted_at: now,
        };
        if let Err(e) = task::init(&mut doc, &new) {
            let _ = reply.send(Err(e.into()));
            return;
        }
        let tdoc = DocId::generate(&mut rand::rng());
        let task_id = TaskId::new(tdoc.as_str());
        let submission = Submission {
            id: task_id.clone(),
            kind: req.kind,
            submitter: self.shared.peer.clone(),
            submitted_at: now,
            priority: req.priority,
            urgent: req.urgent,
            max_attempts: req.max_attempts,
        };
        let r = self.replica.change(&qdoc, |d| {
            queue::submit(d, &submission)?;
            Ok::<_, queue::SubmitError>(d.get_heads())
        });
        let queue_heads = match r {
            Some(Ok(h)) => h,
            Some(Err(e)) => {
                let _ = reply.send(Err(e.into()));
                return;
            }
            None => {
                let _ = reply.send(Err(SubmitError::NotJoined(queue_id)));
                return;
            }
        };
        let task_heads = doc.get_heads();
        self.replica.create(tdoc.clone(), doc, true);
        self.stale.insert(queue_id.clone());
        // Both documents must be on disk before the submit is acknowledged.
        let a = self.save_now(&tdoc);
        let b = self.save_now(&qdoc);
        self.next_submit += 1;
        let id = self.next_submit;
        let tx = self.inputs_tx.clone();
        tokio::spawn(async move {
            let (a, b) = futures::join!(a, b);
            if a.is_ok() && b.is_ok() {
                let _ = tx.send(Input::Durable { submit: id }).await;
            }
        });
        self.submit_waits.push(SubmitWait {
            id,
            task: task_id,
            task_doc: tdoc,
            task_heads,
            queue_doc: qdoc,
            queue_heads,
            durable: false,
            deadline: Instant::now() + crate::REPLICATION_WAIT,
            reply,
        });
    }

    /// Answers submits that are durable and either held by a peer or out of time (or alone).
    fn check_submits(&mut self, now: Instant) {
        let alone = self.replica.peers().is_empty();
        let waits = std::mem::take(&mut self.submit_waits);
        for w in waits {
            if w.reply.is_closed() {
                continue;
            }
            let held = w.durable
                && self.replica.peer_has(&w.task_doc, &w.task_heads)
                && self.replica.peer_has(&w.queue_doc, &w.queue_heads);
            if w.durable && (held || alone || now >= w.deadline) {
                if !held {
                    tracing::info!(task = %w.task, "submitted; held only by this node for now");
                }
                let _ = w.reply.send(Ok(api::Submitted {
                    task_id: w.task,
                    replicated: held,
                }));
            } else {
                self.submit_waits.push(w);
            }
        }
    }

    fn status_of(&self, task: &TaskId) -> Result<api::TaskStatus, TaskError> {
        let doc = task_doc(task).ok_or_else(|| TaskError::BadId(task.to_string()))?;
        let d = self
            .replica
            .get(&doc)
            .ok_or_else(|| TaskError::NotFound(task.clone()))?;
        let t = task::read(d).map_err(|e| TaskError::NotATask(task.clone(), e))?;
        let q = self
            .queues
            .get(&t.queue)
            .ok_or_else(|| TaskError::NotJoined(task.clone(), t.queue.clone()))?;
        let entry = q
            .view
            .tasks
            .get(task)
            .ok_or_else(|| TaskError::NotIndexed(task.clone(), t.queue.clone()))?;
        let error = entry
            .attempts
            .iter()
            .filter_map(|a| a.finished.as_ref())
            .filter(|f| f.outcome.is_failure())
            .max_by_key(|f| f.at)
            .and_then(|f| f.error.clone());
        Ok(api::TaskStatus {
            id: task.clone(),
            queue: t.queue.clone(),
            kind: t.kind.clone(),
            state: entry.state(),
            submitted_at: t.submitted_at,
            submitter: t.submitter.to_string(),
            result: t.result().cloned(),
            input: t.input.clone(),
            error,
            attempts: entry.attempts.clone(),
            runs: t.runs,
        })
    }

    fn answer_status(
        &mut self,
        task: TaskId,
        wait: bool,
        reply: oneshot::Sender<Result<api::TaskStatus, TaskError>>,
    ) {
        match self.status_of(&task) {
            Ok(s) if wait && !is_done(&s) => self.task_waiters.push((task, s.queue, reply)),
            r => {
                let _ = reply.send(r);
            }
        }
    }

    fn check_task_waiters(&mut self) {
        let waiters = std::mem::take(&mut self.task_waiters);
        for (task, queue, reply) in waiters {
            if reply.is_closed() {
                continue;
            }
            let Some(doc) = task_doc(&task) else { continue };
            if !self.replica.is_loaded(&doc) {
                // Evicted meanwhile: load it again and answer when it is back.
                self.wait_for(
                    &doc,
                    false,
                    DocWaiter::Status {
                        task,
                        wait: true,
                        reply,
                    },
                );
                continue;
            }
            match self.status_of(&task) {
                Ok(s) if !is_done(&s) => self.task_waiters.push((task, queue, reply)),
                r => {
                    let _ = reply.send(r);
                }
            }
        }
    }

    // ----- routers and the pool -----

    /// Re-reads a queue's view and hands it to the router and the pool.
    fn refresh(&mut self, now: Instant, id: &QueueId) {
        let Some(doc) = queue_doc(id) else { return };
        let Some(q) = self.queues.get_mut(id) else {
            return;
        };
        let Some(d) = self.replica.get(&doc) else {
            return;
        };
        let Some(view) = q.cache.refresh(d).cloned() else {
            tracing::warn!(queue = %id, "the queue document does not read as a queue");
            return;
        };
        if Arc::ptr_eq(&view, &q.view) {
            return;
        }
        // Tasks that just became final: their documents may leave memory.
        for (tid, t) in &view.tasks {
            if t.state().is_final()
                && q.view
                    .tasks
                    .get(tid)
                    .is_some_and(|old| !old.state().is_final())
                && let Some(td) = task_doc(tid)
            {
                self.replica.set_shared(&td, false);
                self.to_evict.push(td);
            }
        }
        // A member that joined or moved: dial it now rather than at the next round, so that a
        // full mesh forms before the peer everyone bootstrapped from can go away.
        let members_changed = view.members != q.view.members;
        q.view = view.clone();
        q.view_tx.send_replace(view.clone());
        q.router.handle_view(now, view.clone());
        self.pool.handle_view(id, &view);
        if members_changed {
            self.next_dial = now;
        }
    }

    /// Carries out the routers' and the pool's actions; true if there were any.
    fn drain_actions(&mut self, now: Instant) -> bool {
        let mut acted = false;
        let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
        for id in &ids {
            while let Some(action) = self.queues.get_mut(id).and_then(|q| q.router.poll_action()) {
                acted = true;
                self.router_action(now, id, action);
            }
            if let Some(q) = self.queues.get_mut(id) {
                while let Some(event) = q.router.poll_event() {
                    tracing::info!(queue = %id, ?event, "router");
                    let _ = self.shared.events.send(NodeEvent::Router {
                        queue: id.clone(),
                        event,
                    });
                }
            }
        }
        while let Some(action) = self.pool.poll_action() {
            acted = true;
            self.pool_action(now, action);
        }
        acted
    }

    /// Writes to a queue document and refreshes its view at once (routers must see their own
    /// writes before deciding again).
    fn write_queue<E: std::fmt::Display>(
        &mut self,
        now: Instant,
        id: &QueueId,
        what: &str,
        f: impl FnOnce(&mut Automerge) -> Result<(), E>,
    ) {
        let Some(doc) = queue_doc(id) else { return };
        match self.change(&doc, f) {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::warn!(queue = %id, "cannot record {what}: {e}"),
            None => tracing::warn!(queue = %id, "cannot record {what}: queue document not loaded"),
        }
        self.stale.remove(id);
        self.refresh(now, id);
    }

    fn router_action(&mut self, now: Instant, id: &QueueId, action: RouterAction) {
        match action {
            RouterAction::Claim(claim) => {
                self.write_queue(now, id, "a router claim", |d| {
                    queue::claim_router(d, &claim, now_ms())
                });
            }
            RouterAction::Assign(list) => {
                tracing::debug!(queue = %id, count = list.len(), "assigning");
                self.write_queue(now, id, "assignments", |d| {
                    queue::record_assignments(d, &list, now_ms())
                });
            }
            RouterAction::Beat(beat) => {
                self.pool.handle_router_beat(&beat);
                if let Some(q) = self.queues.get(id) {
                    self.shared
                        .net
                        .publish(q.topic.clone(), Wire::Router(beat).encode());
                }
            }
        }
    }

    fn pool_action(&mut self, now: Instant, action: PoolAction) {
        match action {
            PoolAction::Start(run) => {
                let Some(doc) = task_doc(&run.task) else {
                    self.pool.handle_start_failed(
                        run.worker.index,
                        format!("{} is not a task id", run.task),
                    );
                    return;
                };
                self.wait_for(&doc, false, DocWaiter::Start(run));
            }
            PoolAction::Finish {
                worker,
                queue: qid,
                task,
                attempt,
                outcome,
                error,
                started_by,
            } => {
                if outcome == AttemptOutcome::Refused || outcome == AttemptOutcome::Interrupted {
                    tracing::info!(%task, %attempt, ?outcome, error = error.as_deref().unwrap_or(""), "attempt not run");
                }
                if outcome == AttemptOutcome::Interrupted
                    && let (Some(inc), Some(doc)) = (started_by, task_doc(&task))
                {
                    let start = RunStart {
                        attempt: attempt.clone(),
                        worker: worker.clone(),
                        incarnation: inc,
                        at: 0,
                    };
                    let end = TaskRunEnd {
                        outcome,
                        at: now_ms(),
                        result: None,
                        error: error.clone(),
                        logs: vec![],
                    };
                    // Best effort: the task document may not be here.
                    let _ = self.change(&doc, |d| task::record_run_end(d, &start, &end));
                }
                self.write_queue(now, &qid, "an attempt's end", |d| {
                    queue::record_finish(
                        d,
                        &task,
                        &attempt,
                        &worker,
                        outcome,
                        error.as_deref(),
                        now_ms(),
                    )
                });
            }
            PoolAction::Beat(beat) => {
                let bytes = Wire::Pool(beat.clone()).encode();
                for q in self.queues.values_mut() {
                    q.router.handle_pool_beat(now, &beat);
                    self.shared.net.publish(q.topic.clone(), bytes.clone());
                }
            }
        }
    }

    /// Starts a run whose task document is loaded: records the start in both documents, then
    /// runs the handler in a task of its own.
    fn start_run(&mut self, run: Run) {
        let index = run.worker.index;
        let Some(tdoc) = task_doc(&run.task) else {
            return;
        };
        let input = match self.replica.get(&tdoc).map(task::read) {
            Some(Ok(t)) => t.input,
            Some(Err(e)) => {
                self.pool
                    .handle_start_failed(index, format!("unreadable task document: {e}"));
                return;
            }
            None => {
                self.pool
                    .handle_start_failed(index, "the task document is unavailable".into());
                return;
            }
        };
        let Some(qdoc) = queue_doc(&run.queue) else {
            return;
        };
        let inc = self.shared.incarnation;
        let started = self
            .change(&qdoc, |d| {
                queue::record_start(d, &run.task, &run.attempt, &run.worker, inc, now_ms())
            })
            .unwrap_or_else(|| Err(queue::AttemptError::NotAQueue));
        if let Err(e) = started {
            self.pool
                .handle_start_failed(index, format!("cannot record the start: {e}"));
            return;
        }
        let start = RunStart {
            attempt: run.attempt.clone(),
            worker: run.worker.clone(),
            incarnation: inc,
            at: now_ms(),
        };
        if let Some(Err(e)) = self.change(&tdoc, |d| task::record_run_start(d, &start)) {
            tracing::warn!(task = %run.task, "cannot record the run's start: {e}");
        }
        let _ = self.shared.events.send(NodeEvent::RunStarted {
            queue: run.queue.clone(),
            task: run.task.clone(),
            worker: run.worker.to_string(),
        });
        let registry = self.shared.registry.clone();
        let tx = self.inputs_tx.clone();
        let ctx = Context::new(run.task.clone(), run.attempt.clone(), run.worker.clone());
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let outcome = execute(&registry, &run.kind, ctx, input).await;
            let _ = tx
                .send(Input::RunEnded(Box::new((run, start, outcome))))
                .await;
        }));
    }

    fn handle_input(&mut self, input: Input) {
        match input {
            Input::Loaded { doc, chunks } => self.handle_loaded(doc, chunks),
            Input::Saved(doc) => {
                if let Some(n) = self.saving.get_mut(&doc) {
                    *n -= 1;
                    if *n == 0 {
                        self.saving.remove(&doc);
                    }
                }
            }
            Input::Durable { submit } => {
                if let Some(w) = self.submit_waits.iter_mut().find(|w| w.id == submit) {
                    w.durable = true;
                }
            }
            Input::RunEnded(ended) => {
                let (run, start, outcome) = *ended;
                let (end, task_end) = match outcome.result {
                    Ok(v) => (
                        RunEnd::Succeeded,
                        TaskRunEnd {
                            outcome: AttemptOutcome::Succeeded,
                            at: now_ms(),
                            result: Some(v),
                            error: None,
                            logs: outcome.logs,
                        },
                    ),
                    Err(e) => (
                        RunEnd::Failed(e.clone()),
                        TaskRunEnd {
                            outcome: AttemptOutcome::Failed,
                            at: now_ms(),
                            result: None,
                            error: Some(e),
                            logs: outcome.logs,
                        },
                    ),
                };
                let _ = self.shared.events.send(NodeEvent::RunEnded {
                    queue: run.queue.clone(),
                    task: run.task.clone(),
                    ok: end == RunEnd::Succeeded,
                });
                if let Some(tdoc) = task_doc(&run.task) {
                    match self.change(&tdoc, |d| task::record_run_end(d, &start, &task_end)) {
                        Some(Ok(())) => {}
                        Some(Err(e)) => {
                            tracing::warn!(task = %run.task, "cannot record the run's end: {e}")
                        }
                        None => {
                            tracing::warn!(task = %run.task, "cannot record the run's end: task document not loaded")
                        }
                    }
                }
                self.pool.handle_finished(run.worker.index, end);
            }
        }
    }

    // ----- network -----

    fn handle_net(&mut self, ev: net::Event) {
        let now = Instant::now();
        match ev {
            net::Event::Listening(addr) => {
                {
                    let mut listen = self
                        .shared
                        .listen
                        .write()
                        .unwrap_or_else(|e| e.into_inner());
                    if !listen.contains(&addr) {
                        listen.push(addr);
                    }
                }
                let addrs = self.shared.advertised();
                let _ = self.shared.events.send(NodeEvent::Listening(addrs.clone()));
                let me = self.shared.peer.clone();
                let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
                for id in ids {
                    self.write_queue(now, &id, "this node's addresses", |d| {
                        queue::set_member(d, &me, &addrs, now_ms())
                    });
                }
            }
            net::Event::Connected(peer) => {
                tracing::debug!(%peer, "connected");
                self.connected.insert(peer);
            }
            net::Event::Disconnected(peer) => {
                tracing::debug!(%peer, "disconnected");
                self.connected.remove(&peer);
            }
            net::Event::SyncOpened(peer) => {
                self.replica.handle_connected(PeerId::new(peer.to_string()));
                for w in std::mem::take(&mut self.join_retries) {
                    if let DocWaiter::Join {
                        id,
                        from_peers,
                        reply,
                    } = w
                    {
                        if reply.is_closed() {
                            continue;
                        }
                        if let Some(doc) = queue_doc(&id) {
                            self.wait_for(
                                &doc,
                                true,
                                DocWaiter::Join {
                                    id,
                                    from_peers,
                                    reply,
                                },
                            );
                        }
                    }
                }
            }
            net::Event::SyncClosed(peer) => {
                self.replica
                    .handle_disconnected(&PeerId::new(peer.to_string()));
            }
            net::Event::SyncMessage { peer, data } => {
                let from = PeerId::new(peer.to_string());
                match Message::decode(&data) {
                    Ok(msg) => self.replica.handle_message(&from, msg),
                    Err(e) => tracing::warn!(%peer, "undecodable sync frame: {e}"),
                }
            }
            net::Event::Message {
                topic,
                source,
                data,
            } => {
                let Some(id) = self.topics.get(&topic).cloned() else {
                    return;
                };
                let Some(msg) = Wire::decode(&data) else {
                    tracing::debug!(%source, "malformed gossip, ignored");
                    return;
                };
                let source = PeerId::new(source.to_string());
                let Some(q) = self.queues.get_mut(&id) else {
                    return;
                };
                match msg {
                    Wire::Router(beat) if beat.claim.peer == source && beat.queue == id => {
                        q.router.handle_router_beat(now, &beat);
                        self.pool.handle_router_beat(&beat);
                    }
                    Wire::Pool(beat) if beat.peer == source => {
                        q.router.handle_pool_beat(now, &beat);
                    }
                    _ => {
                        tracing::debug!(%source, "gossip claiming another sender or queue, ignored")
                    }
                }
            }
        }
    }

    /// Dials every member of every queue this node is not connected to.
    fn dial_members(&self) {
        let me = &self.shared.libp2p_peer;
        let mut wanted: HashMap<net::PeerId, Vec<net::Multiaddr>> = HashMap::new();
        for q in self.queues.values() {
            for (peer, member) in &q.view.members {
                let Ok(peer) = peer.as_str().parse::<net::PeerId>() else {
                    continue;
                };
                if &peer == me || self.connected.contains(&peer) {
                    continue;
                }
                let addrs = member.addrs.iter().filter_map(|a| a.parse().ok());
                wanted.entry(peer).or_default().extend(addrs);
            }
        }
        for (peer, addrs) in wanted {
            if addrs.is_empty() {
                continue;
            }
            let net = self.shared.net.clone();
            tokio::spawn(async move {
                if let Err(e) = net.dial_peer(peer, addrs).await {
                    tracing::trace!(%peer, "dial: {e}");
                }
            });
        }
    }
}

fn is_done(s: &api::TaskStatus) -> bool {
    match s.state {
        TaskState::Failed => true,
        TaskState::Succeeded => s.result.is_some(),
        _ => false,
    }
}
