//! The node's actor: one task that owns the routers (one per queue) and the pool, feeds them the
//! documents, heartbeats and the clock, and carries out their actions.
//!
//! Handler runs happen in tasks of their own ([`run_attempt`]); they report back through the
//! actor's input queue.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use piecework_net as net;
use piecework_queue_doc::task::{self, RunEnd as TaskRunEnd, RunStart};
use piecework_queue_doc::{AttemptOutcome, PeerId, QueueId, QueueView, RunningReport, ViewCache, queue};
use piecework_router::{Action as RouterAction, Role, Router};
use piecework_worker_pool::{Action as PoolAction, Config as PoolConfig, Context, Pool, Run, RunEnd, execute};
use samod::DocHandle;
use tokio::sync::{mpsc, oneshot, watch};

use crate::wire::Wire;
use crate::{NodeEvent, Shared, api, now_ms};

/// How often the actor dials members it is not connected to.
const DIAL_EVERY: Duration = Duration::from_secs(2);

pub(crate) enum Input {
    AddQueue {
        id: QueueId,
        handle: DocHandle,
        view: watch::Sender<Arc<QueueView>>,
    },
    DocChanged(QueueId),
    RunEnded {
        index: u32,
        end: RunEnd,
    },
    StartFailed {
        index: u32,
        reason: String,
    },
    Status(oneshot::Sender<Status>),
}

pub(crate) struct Status {
    pub(crate) queues: Vec<(QueueId, String)>,
    pub(crate) workers: Vec<api::WorkerStatus>,
}

struct Queue {
    handle: DocHandle,
    router: Router,
    view: Arc<QueueView>,
    cache: ViewCache,
    view_tx: watch::Sender<Arc<QueueView>>,
    /// Set by the change forwarder, cleared when the actor re-reads the view.
    dirty: Arc<AtomicBool>,
    topic: String,
}

struct Actor {
    shared: Arc<Shared>,
    inputs_tx: mpsc::Sender<Input>,
    pool: Pool,
    queues: BTreeMap<QueueId, Queue>,
    topics: HashMap<String, QueueId>,
    connected: HashSet<net::PeerId>,
    next_dial: Instant,
    malformed_gossip: u64,
}

pub(crate) async fn run(shared: Arc<Shared>, mut inputs: mpsc::Receiver<Input>, mut net_events: mpsc::Receiver<net::Event>) {
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
    let mut actor = Actor {
        inputs_tx: shared.actor.clone(),
        shared,
        pool,
        queues: BTreeMap::new(),
        topics: HashMap::new(),
        connected: HashSet::new(),
        next_dial: now,
        malformed_gossip: 0,
    };
    loop {
        let deadline = actor.next_deadline();
        tokio::select! {
            input = inputs.recv() => match input {
                Some(i) => actor.handle_input(i),
                None => break,
            },
            ev = net_events.recv() => match ev {
                Some(e) => actor.handle_net(e),
                None => break,
            },
            () = tokio::time::sleep_until(deadline.into()) => {}
        }
        actor.tick();
    }
    tracing::debug!("node actor stopped");
}

impl Actor {
    fn next_deadline(&self) -> Instant {
        let mut t = self.pool.poll_timeout().min(self.next_dial);
        for q in self.queues.values() {
            if let Some(r) = q.router.poll_timeout() {
                t = t.min(r);
            }
        }
        t
    }

    fn tick(&mut self) {
        let now = Instant::now();
        for q in self.queues.values_mut() {
            q.router.handle_timeout(now);
        }
        self.pool.handle_timeout(now);
        self.drain(now);
        if now >= self.next_dial {
            self.dial_members();
            self.next_dial = now + DIAL_EVERY;
        }
    }

    fn handle_input(&mut self, input: Input) {
        let now = Instant::now();
        match input {
            Input::AddQueue { id, handle, view } => self.add_queue(now, id, handle, view),
            Input::DocChanged(id) => self.refresh(now, &id),
            Input::RunEnded { index, end } => {
                self.pool.handle_finished(index, end);
            }
            Input::StartFailed { index, reason } => {
                self.pool.handle_start_failed(index, reason);
            }
            Input::Status(reply) => {
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
                let _ = reply.send(Status { queues, workers });
            }
        }
    }

    fn add_queue(&mut self, now: Instant, id: QueueId, handle: DocHandle, view_tx: watch::Sender<Arc<QueueView>>) {
        if self.queues.contains_key(&id) {
            return;
        }
        let topic = net::topic_for(id.as_str());
        let net = self.shared.net.clone();
        let t = topic.clone();
        tokio::spawn(async move {
            let _ = net.subscribe(t).await;
        });
        // Forward document changes, coalesced: one pending notification per queue at most.
        let dirty = Arc::new(AtomicBool::new(false));
        let mut changes = handle.changes();
        let (flag, tx, qid) = (dirty.clone(), self.inputs_tx.clone(), id.clone());
        tokio::spawn(async move {
            while changes.next().await.is_some() {
                if !flag.swap(true, Ordering::AcqRel) && tx.send(Input::DocChanged(qid.clone())).await.is_err() {
                    break;
                }
            }
        });
        let view = view_tx.borrow().clone();
        let min_beat = Duration::from_millis(view.config.pool_heartbeat_ms);
        if min_beat < self.pool.config().heartbeat {
            self.pool.set_heartbeat(min_beat);
        }
        self.topics.insert(topic.clone(), id.clone());
        self.queues.insert(
            id.clone(),
            Queue {
                handle,
                router: Router::new(id.clone(), self.shared.peer.clone(), now),
                view,
                cache: ViewCache::new(),
                view_tx,
                dirty,
                topic,
            },
        );
        self.refresh(now, &id);
        self.next_dial = now;
    }

    /// Re-reads a queue's view and hands it to the router and the pool.
    fn refresh(&mut self, now: Instant, id: &QueueId) {
        let Some(q) = self.queues.get_mut(id) else { return };
        q.dirty.store(false, Ordering::Release);
        let cache = &mut q.cache;
        let Some(view) = q.handle.with_document(|d| cache.refresh(d).cloned()) else {
            tracing::warn!(queue = %id, "the queue document no longer reads as a queue");
            return;
        };
        if Arc::ptr_eq(&view, &q.view) {
            return;
        }
        q.view = view.clone();
        q.view_tx.send_replace(view.clone());
        q.router.handle_view(now, view.clone());
        self.pool.handle_view(id, &view);
    }

    /// Carries out every action the routers and the pool have, until none is left.
    fn drain(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
            for id in &ids {
                while let Some(action) = self.queues.get_mut(id).and_then(|q| q.router.poll_action()) {
                    progressed = true;
                    self.router_action(now, id, action);
                }
                if let Some(q) = self.queues.get_mut(id) {
                    while let Some(event) = q.router.poll_event() {
                        tracing::info!(queue = %id, ?event, "router");
                        let _ = self.shared.events.send(NodeEvent::Router { queue: id.clone(), event });
                    }
                }
            }
            while let Some(action) = self.pool.poll_action() {
                progressed = true;
                self.pool_action(now, action);
            }
            if !progressed {
                break;
            }
        }
    }

    fn write<T, E: std::fmt::Display>(&mut self, now: Instant, id: &QueueId, what: &str, f: impl FnOnce(&mut automerge::Automerge) -> Result<T, E>) {
        let Some(q) = self.queues.get(id) else { return };
        if let Err(e) = q.handle.with_document(f) {
            tracing::warn!(queue = %id, "cannot record {what}: {e}");
        }
        self.refresh(now, id);
    }

    fn router_action(&mut self, now: Instant, id: &QueueId, action: RouterAction) {
        match action {
            RouterAction::Claim(claim) => {
                self.write(now, id, "a router claim", |d| queue::claim_router(d, &claim, now_ms()));
            }
            RouterAction::Assign(list) => {
                tracing::debug!(queue = %id, count = list.len(), "assigning");
                self.write(now, id, "assignments", |d| queue::record_assignments(d, &list, now_ms()));
            }
            RouterAction::Beat(beat) => {
                self.pool.handle_router_beat(&beat);
                if let Some(q) = self.queues.get(id) {
                    self.shared.net.publish(q.topic.clone(), Wire::Router(beat).encode());
                }
            }
        }
    }

    fn pool_action(&mut self, now: Instant, action: PoolAction) {
        match action {
            PoolAction::Start(run) => {
                let Some(q) = self.queues.get(&run.queue) else {
                    self.pool.handle_start_failed(run.worker.index, "queue closed".into());
                    return;
                };
                let _ = self.shared.events.send(NodeEvent::RunStarted {
                    queue: run.queue.clone(),
                    task: run.task.clone(),
                    worker: run.worker.to_string(),
                });
                let fut = run_attempt(self.shared.clone(), self.inputs_tx.clone(), q.handle.clone(), run);
                tokio::spawn(tracing::Instrument::in_current_span(fut));
            }
            PoolAction::Finish { worker, queue: qid, task, attempt, outcome, error, started_by } => {
                if outcome == AttemptOutcome::Refused || outcome == AttemptOutcome::Interrupted {
                    tracing::info!(%task, %attempt, ?outcome, error = error.as_deref().unwrap_or(""), "attempt not run");
                }
                if outcome != AttemptOutcome::Refused {
                    let _ = self.shared.events.send(NodeEvent::RunEnded {
                        queue: qid.clone(),
                        task: task.clone(),
                        ok: outcome == AttemptOutcome::Succeeded,
                    });
                }
                if outcome == AttemptOutcome::Interrupted {
                    if let Some(inc) = started_by {
                        let shared = self.shared.clone();
                        let start = RunStart { attempt: attempt.clone(), worker: worker.clone(), incarnation: inc, at: 0 };
                        let end = TaskRunEnd { outcome, at: now_ms(), result: None, error: error.clone(), logs: vec![] };
                        let task = task.clone();
                        tokio::spawn(async move {
                            let Some(doc) = crate::doc_id(task.as_str()) else { return };
                            if let Ok(Ok(Some(th))) = tokio::time::timeout(crate::FIND_TIMEOUT, shared.repo.find(doc)).await {
                                let _ = th.with_document(|d| task::record_run_end(d, &start, &end));
                            }
                        });
                    }
                }
                self.write(now, &qid, "an attempt's end", |d| {
                    queue::record_finish(d, &task, &attempt, &worker, outcome, error.as_deref(), now_ms())
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

    fn handle_net(&mut self, ev: net::Event) {
        let now = Instant::now();
        match ev {
            net::Event::Listening(addr) => {
                {
                    let mut listen = self.shared.listen.write().unwrap_or_else(|e| e.into_inner());
                    if !listen.contains(&addr) {
                        listen.push(addr);
                    }
                }
                let addrs = self.shared.advertised();
                let me = self.shared.peer.clone();
                let _ = self.shared.events.send(NodeEvent::Listening(addrs.clone()));
                let ids: Vec<QueueId> = self.queues.keys().cloned().collect();
                for id in ids {
                    self.write(now, &id, "this node's addresses", |d| queue::set_member(d, &me, &addrs, now_ms()));
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
            net::Event::Message { topic, source, data } => {
                let Some(id) = self.topics.get(&topic).cloned() else { return };
                let Some(msg) = Wire::decode(&data) else {
                    self.malformed_gossip += 1;
                    tracing::debug!(%source, "malformed gossip ({} so far)", self.malformed_gossip);
                    return;
                };
                let source = PeerId::new(source.to_string());
                let Some(q) = self.queues.get_mut(&id) else { return };
                match msg {
                    Wire::Router(beat) if beat.claim.peer == source && beat.queue == id => {
                        q.router.handle_router_beat(now, &beat);
                        self.pool.handle_router_beat(&beat);
                    }
                    Wire::Pool(beat) if beat.peer == source => {
                        q.router.handle_pool_beat(now, &beat);
                    }
                    _ => {
                        self.malformed_gossip += 1;
                        tracing::debug!(%source, "gossip claiming another sender or queue, ignored");
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
                let Ok(peer) = peer.as_str().parse::<net::PeerId>() else { continue };
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

/// Runs one attempt: fetch the task's input, record the start in both documents, run the
/// handler, record the run's end in the task document, and report back to the actor (which
/// records the end in the queue document).
async fn run_attempt(shared: Arc<Shared>, actor: mpsc::Sender<Input>, queue_doc: DocHandle, run: Run) {
    let index = run.worker.index;
    let fail = |reason: String| Input::StartFailed { index, reason };
    let Some(doc) = crate::doc_id(run.task.as_str()) else {
        let _ = actor.send(fail(format!("{} is not a task id", run.task))).await;
        return;
    };
    let th = match tokio::time::timeout(crate::FIND_TIMEOUT, shared.repo.find(doc)).await {
        Ok(Ok(Some(th))) => th,
        other => {
            tracing::info!(task = %run.task, found = ?other.as_ref().map(|r| r.as_ref().map(Option::is_some)), "task document unavailable");
            let _ = actor.send(fail("the task document is unavailable".into())).await;
            return;
        }
    };
    let input = match th.with_document(|d| task::read(d)) {
        Ok(t) => t.input,
        Err(e) => {
            let _ = actor.send(fail(format!("unreadable task document: {e}"))).await;
            return;
        }
    };
    let started = queue_doc.with_document(|d| {
        queue::record_start(d, &run.task, &run.attempt, &run.worker, shared.incarnation, now_ms())
    });
    if let Err(e) = started {
        let _ = actor.send(fail(format!("cannot record the start: {e}"))).await;
        return;
    }
    let start = RunStart {
        attempt: run.attempt.clone(),
        worker: run.worker.clone(),
        incarnation: shared.incarnation,
        at: now_ms(),
    };
    if let Err(e) = th.with_document(|d| task::record_run_start(d, &start)) {
        tracing::warn!(task = %run.task, "cannot record the run's start: {e}");
    }
    let ctx = Context::new(run.task.clone(), run.attempt.clone(), run.worker.clone());
    let outcome = execute(&shared.registry, &run.kind, ctx, input).await;
    let (end, task_end) = match outcome.result {
        Ok(v) => (
            RunEnd::Succeeded,
            TaskRunEnd { outcome: AttemptOutcome::Succeeded, at: now_ms(), result: Some(v), error: None, logs: outcome.logs },
        ),
        Err(e) => (
            RunEnd::Failed(e.clone()),
            TaskRunEnd { outcome: AttemptOutcome::Failed, at: now_ms(), result: None, error: Some(e), logs: outcome.logs },
        ),
    };
    if let Err(e) = th.with_document(|d| task::record_run_end(d, &start, &task_end)) {
        tracing::warn!(task = %run.task, "cannot record the run's end: {e}");
    }
    let _ = actor.send(Input::RunEnded { index, end }).await;
}
