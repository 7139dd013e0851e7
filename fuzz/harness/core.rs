//! What a node takes from peers besides its own documents, fed any bytes or any values: gossip
//! on a joined queue's topic ([`Wire`] heartbeats), frames on a sync stream (replica messages
//! and status questions, [`Ask`]), and a queue document's changes written by a member, synced
//! in over a real Automerge sync exchange.
//!
//! Each `pub fn` taking `&[u8]` is one fuzz target (`fuzz/fuzz_targets/<name>.rs`;
//! `crates/core/tests/fuzz.rs` runs it on the corpus `fuzz/corpus/<name>/` and on generated
//! inputs). It needs `queue_doc_harness` (`fuzz/harness/queue_doc.rs`) beside it. What must
//! hold, whatever the input: no panic; a heartbeat or question that decodes encodes back to
//! itself; the core's output after each input ends; its timers, fired at an instant, soon ask
//! for a deadline ahead of it (it never spins), however long the node goes on with what it was
//! sent.

// Each fuzz target calls one harness; the tests call them all.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use automerge::Automerge;
use automerge::sync::{self, SyncDoc};
use piecework_core::{
    Ask, Command, CommandId, Config, Core, Event, Io, Reply, RunResult, Saved, Time, Wire,
    topic_for,
};
use piecework_queue_doc::{PeerId, QueueConfig, QueueId, Submission, TaskId, queue};
use piecework_replica::{DocId, Message};

use crate::queue_doc_harness::{self as qd, Batch};

/// The queue (its document id).
pub const QUEUE: &str = qd::QUEUE;
/// This node.
pub const ME: &str = "me";
/// The queue's creator: a member, connected.
pub const OTHER: &str = qd::PEER_A;
/// A second member, connected.
pub const SECOND: &str = qd::PEER_B;
/// A connected peer that is not a member.
pub const STRANGER: &str = "stranger";

/// The most rounds of outputs one input may produce before the core is taken to spin.
const MAX_ROUNDS: usize = 10_000;

/// How many times in a row a core's timers may fire at one instant before it is taken to spin.
const MAX_FIRINGS: usize = 8;

/// The times (ms after the join) a node goes on to after it was sent something: its router
/// and pool act on what they were sent, and their timers run out.
const LATER: [u64; 5] = [100, 1_000, 5_000, 60_000, 600_000];

fn peer(s: &str) -> PeerId {
    PeerId::new(s)
}

fn doc_id(s: &str) -> DocId {
    DocId::parse(s).expect("a valid document id")
}

/// The queue document as its creator wrote it: short timings, two members, three tasks.
pub fn queue_document() -> &'static Automerge {
    static DOC: OnceLock<Automerge> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut doc = Automerge::new();
        doc.set_actor(automerge::ActorId::from(&[5u8; 16][..]));
        let config = QueueConfig {
            heartbeat_ms: 100,
            takeover_after_ms: 300,
            settle_ms: 50,
            pool_heartbeat_ms: 100,
            lease_ms: 1_000,
            ..QueueConfig::default()
        };
        queue::create(&mut doc, "fuzz", &config, &peer(OTHER), 1_000).expect("create");
        queue::set_member(&mut doc, &peer(SECOND), &[], 1_001).expect("member");
        let subs: Vec<Submission> = qd::TASKS[..3]
            .iter()
            .enumerate()
            .map(|(i, t)| Submission {
                id: TaskId::new(*t),
                kind: "noop".into(),
                submitter: peer(SECOND),
                submitted_at: 1_010 + i as u64,
                priority: 0,
                urgent: false,
                max_attempts: None,
                input: Some("{}".into()),
                rules: Default::default(),
            })
            .collect();
        queue::submit_many(&mut doc, &subs).expect("submit");
        doc
    })
}

/// One real instant to count from; the core never reads a clock.
#[allow(clippy::disallowed_methods)]
fn start() -> Instant {
    Instant::now()
}

/// A core that joined the queue, and everything around it: a disk, a clock, what it sent.
#[derive(Debug)]
pub struct Node {
    /// The core.
    pub core: Core,
    t0: Instant,
    /// Its clock.
    pub now: Time,
    /// What it wrote, by document.
    pub disk: BTreeMap<DocId, Vec<Vec<u8>>>,
    /// Frames it sent on sync streams, not yet taken.
    pub frames: Vec<(PeerId, Vec<u8>)>,
    /// Every event it reported.
    pub events: Vec<Event>,
    next: u64,
}

impl Node {
    /// A core (two workers) that joined [`QUEUE`] from its disk, connected to both members
    /// and a stranger.
    pub fn joined() -> Node {
        let t0 = start();
        let now = Time {
            mono: t0,
            unix_ms: 1_800_000_000_000,
        };
        let mut n = Node {
            core: Core::new(Config::new(peer(ME), 1, 2, 7), now),
            t0,
            now,
            disk: BTreeMap::new(),
            frames: Vec::new(),
            events: Vec::new(),
            next: 0,
        };
        n.drain();
        n.disk.insert(doc_id(QUEUE), vec![queue_document().save()]);
        n.next += 1;
        let cmd = CommandId(n.next);
        let join = Command::JoinQueue {
            id: QueueId::new(QUEUE),
            from_peers: false,
        };
        n.core.handle_command(n.now, cmd, join);
        let replies = n.drain();
        assert!(
            replies
                .iter()
                .any(|(c, r)| *c == cmd && matches!(r, Reply::Joined(Ok(_)))),
            "joined: {replies:?}"
        );
        for p in [OTHER, SECOND, STRANGER] {
            n.core.handle_connected(n.now, peer(p));
            n.drain();
        }
        n
    }

    /// Carries out everything the core asks for (writes, loads, runs, epoch work) until it
    /// asks for nothing more; its replies.
    pub fn drain(&mut self) -> Vec<(CommandId, Reply)> {
        let mut replies = Vec::new();
        for _ in 0..MAX_ROUNDS {
            let mut moved = false;
            while let Some(f) = self.core.poll_transmit(self.now.mono) {
                self.frames.push(f);
            }
            let mut ios = Vec::new();
            while let Some(io) = self.core.poll_io() {
                ios.push(io);
            }
            while let Some(r) = self.core.poll_reply() {
                replies.push(r);
            }
            while let Some(e) = self.core.poll_event() {
                self.events.push(e);
            }
            for io in ios {
                moved = true;
                self.answer(io);
            }
            if !moved {
                return replies;
            }
        }
        panic!("the core asked for I/O in more than {MAX_ROUNDS} rounds after one input");
    }

    fn answer(&mut self, io: Io) {
        let now = self.now;
        match io {
            Io::Save(s) => {
                let chunks = self.disk.entry(s.doc.clone()).or_default();
                chunks.extend(s.changes.iter().map(|(_, b)| b.clone()));
                let mut saved = Saved::default();
                if let Some(c) = &s.compact {
                    let (snapshot, _) = c.clone().build();
                    saved.snapshot_bytes = Some(snapshot.len());
                    *chunks = vec![snapshot];
                }
                self.core.handle_saved(now, s.id, Ok(saved));
            }
            Io::Load { doc } => {
                let chunks = self.disk.get(&doc).cloned().unwrap_or_default();
                self.core.handle_loaded(now, &doc, Ok(chunks));
            }
            Io::Run(r) => {
                let ok = RunResult {
                    result: Ok(serde_json::json!(1)),
                    logs: vec![],
                    planned: Default::default(),
                };
                self.core.handle_run_ended(now, r.id, ok);
            }
            Io::Rotate(job) => self.core.handle_rotated(now, job.build()),
            Io::Lookup { task } => self.core.handle_archived(now, task, None),
            Io::Delete { doc } => {
                self.disk.remove(&doc);
            }
            _ => {}
        }
    }

    /// Moves the clock to `ms` after the join and fires the core's timers due by then. A
    /// deadline at `now` is fired again at once (a router whose claim lost claims again at its
    /// next turn); within [`MAX_FIRINGS`] firings the core must ask for a deadline ahead of
    /// `now`, or it would spin its driver.
    pub fn at(&mut self, ms: u64) {
        self.now = Time {
            mono: self.t0 + Duration::from_millis(ms),
            unix_ms: 1_800_000_000_000 + ms,
        };
        for _ in 0..MAX_FIRINGS {
            self.core.handle_timeout(self.now);
            self.drain();
            if self
                .core
                .poll_timeout()
                .is_none_or(|next| next > self.now.mono)
            {
                return;
            }
        }
        panic!("the core asks for a deadline in the past after {MAX_FIRINGS} firings: it spins");
    }

    /// The node goes on for ten minutes with what it was sent.
    pub fn go_on(&mut self) {
        for ms in LATER {
            self.at(ms);
            self.frames.clear();
        }
    }

    /// A frame from `from` on its sync stream.
    pub fn sync_frame(&mut self, from: &str, frame: &[u8]) {
        self.core.handle_sync(self.now, &peer(from), frame);
        self.drain();
    }

    /// Gossip from `from` on `topic`.
    pub fn gossip(&mut self, topic: &str, from: &str, data: &[u8]) {
        self.core
            .handle_gossip(self.now, topic, &peer(from), &peer(from), data);
        self.drain();
    }

    /// The queue document as this node stored it.
    pub fn stored_queue(&self) -> Automerge {
        let chunks = self.disk.get(&doc_id(QUEUE)).cloned().unwrap_or_default();
        piecework_replica::load_chunks(&chunks).expect("the node's own writes load")
    }

    /// Syncs `theirs` (the queue document as `from` holds it) with the node over Automerge's
    /// sync protocol, in frames on `from`'s sync stream, until neither has more to say.
    pub fn sync_queue_from(&mut self, from: &str, theirs: &mut Automerge, state: &mut sync::State) {
        let q = doc_id(QUEUE);
        for _ in 0..64 {
            for (to, frame) in std::mem::take(&mut self.frames) {
                if to.as_str() != from {
                    continue;
                }
                if let Ok(Message::Sync { doc, data }) = Message::decode(&frame)
                    && doc == q
                    && let Ok(m) = sync::Message::decode(&data)
                {
                    let _ = theirs.receive_sync_message(state, m);
                }
            }
            let Some(m) = theirs.generate_sync_message(state) else {
                return;
            };
            let frame = Message::Sync {
                doc: q.clone(),
                data: m.encode(),
            }
            .encode();
            self.sync_frame(from, &frame);
        }
    }
}

/// What must hold of a gossip message's decoding.
pub fn check_wire(data: &[u8]) {
    if let Some(w) = Wire::decode(data) {
        assert_eq!(Wire::decode(&w.encode()), Some(w), "a heartbeat re-encodes");
    }
}

/// What must hold of a status question's decoding.
pub fn check_ask(data: &[u8]) {
    if let Some(a) = Ask::decode(data) {
        assert!(Ask::is_ask(data));
        assert_eq!(Ask::decode(&a.encode()), Some(a), "a question re-encodes");
    }
}

/// Target `gossip`: the bytes on the queue's topic from each member and a stranger (and on a
/// topic the node is not on); then the node goes on.
pub fn gossip(data: &[u8]) {
    check_wire(data);
    let mut n = Node::joined();
    let topic = topic_for(&QueueId::new(QUEUE));
    for from in [OTHER, SECOND, STRANGER] {
        n.gossip(&topic, from, data);
    }
    n.gossip("elsewhere", OTHER, data);
    n.go_on();
}

/// Target `sync_frame`: the bytes as a frame on a member's and a stranger's sync stream, and
/// as the sync payload of a frame about the queue document; then the node goes on.
pub fn sync_frame(data: &[u8]) {
    check_ask(data);
    let mut n = Node::joined();
    let payload = Message::Sync {
        doc: doc_id(QUEUE),
        data: data.to_vec(),
    }
    .encode();
    for from in [OTHER, STRANGER] {
        n.sync_frame(from, data);
        n.sync_frame(from, &payload);
    }
    n.go_on();
}

/// A member writes `batches` into the queue document and syncs them to the node, which goes
/// on with them.
pub fn queue_from_member(batches: &[Batch]) {
    let mut n = Node::joined();
    let mut theirs = n.stored_queue();
    theirs.set_actor(automerge::ActorId::from(&[6u8; 16][..]));
    let mut state = sync::State::new();
    n.sync_queue_from(OTHER, &mut theirs, &mut state);
    for b in batches {
        qd::apply(&mut theirs, b);
        n.sync_queue_from(OTHER, &mut theirs, &mut state);
        n.at(100);
    }
    n.go_on();
}

/// Target `queue_changes`: writes spelled by the bytes (`queue_doc_harness::batches_of`;
/// the base it picks is not used) made by a member to the queue document the node serves.
pub fn queue_changes(data: &[u8]) {
    let (_, batches) = qd::batches_of(data);
    queue_from_member(&batches);
}
