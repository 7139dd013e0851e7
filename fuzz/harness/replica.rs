//! Sync frames a peer sends a replica, fed any bytes: decoded as a frame
//! ([`Message::decode`]), and taken as the Automerge sync payload of a well-formed frame about
//! each kind of document a replica holds, from a member and from a stranger.
//!
//! The `pub fn` taking `&[u8]` is the fuzz target `replica_message`
//! (`fuzz/fuzz_targets/replica_message.rs`; `crates/replica/tests/fuzz.rs` runs it on the
//! corpus `fuzz/corpus/replica_message/` and on generated inputs). What must hold, whatever
//! the bytes: no panic; a frame decodes to a message that encodes back to a frame decoding to
//! the same, or to the typed error its header calls for; a payload Automerge cannot decode is
//! reported as [`Event::Rejected`], a stranger's frame about a document it may not sync as
//! [`Event::Refused`]; the replica's output after each input ends, and no deadline it asks
//! for lies in the past.

// Each fuzz target calls one harness; the tests call them all.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use automerge::sync::{self, SyncDoc};
use automerge::transaction::CommitOptions;
use automerge::transaction::Transactable;
use automerge::{ActorId, Automerge, ROOT};
use piecework_replica::{DecodeError, DocId, Event, Message, PeerId, Replica, Scope};

/// A queue document: loaded, and requestable by anyone.
pub const QUEUE: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiACzeAtpW";
/// A task document of the queue: stored, not loaded.
pub const TASK: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiADEn7jVQ";
/// A task document of the queue that no one stored yet.
pub const NEW_TASK: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiADhxEphV";
/// A document this replica has no scope for.
pub const UNKNOWN: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiABaK7mS9";
/// This replica's peer.
pub const ME: &str = "me";
/// A member of the queue.
pub const MEMBER: &str = "member";
/// A connected peer that is not a member.
pub const STRANGER: &str = "stranger";

/// The most outputs (events and messages) one input may produce: far above what any does.
const MAX_OUTPUTS: usize = 100_000;

fn id(s: &str) -> DocId {
    DocId::parse(s).expect("a valid document id")
}

fn peer(s: &str) -> PeerId {
    PeerId::new(s)
}

/// A document with one change per `(key, value)`, written by actor `n` at time 0: the same
/// changes, with the same hashes, in every run.
pub fn doc_with(n: u8, values: &[(&str, &str)]) -> Automerge {
    let mut doc = Automerge::new();
    doc.set_actor(ActorId::from(&[n; 16][..]));
    for (k, v) in values {
        let mut tx = doc.transaction();
        tx.put(ROOT, *k, *v).expect("a put");
        tx.commit_with(CommitOptions::default().with_time(0));
    }
    doc
}

/// The queue document of the [`Fixture`].
pub fn queue_document() -> Automerge {
    doc_with(2, &[("schema", "piecework/queue"), ("name", "q")])
}

/// A frame from a member carrying, in a sync message, one change to the fixture's queue
/// document (a put at its root) that `edit` rewrote as a peer may: any header, any
/// operations. Automerge's encoding gives it a valid checksum.
pub fn crafted_frame(edit: impl Fn(&mut automerge::ExpandedChange)) -> Vec<u8> {
    let mut doc = queue_document();
    let heads = doc.get_heads();
    doc.set_actor(ActorId::from(&[8u8; 16][..]));
    let mut tx = doc.transaction();
    tx.put(ROOT, "name", "crafted").expect("a put");
    tx.commit_with(CommitOptions::default().with_time(0));
    let change = doc.get_changes(&heads).pop().expect("the change");
    let mut e = change.decode();
    e.hash = None;
    edit(&mut e);
    let crafted = automerge::Change::from(e);
    let msg = sync::Message {
        heads: vec![crafted.hash()],
        need: vec![],
        have: vec![],
        changes: sync::ChunkList::from(vec![crafted.raw_bytes().to_vec()]),
        flags: None,
        version: sync::MessageVersion::V1,
    };
    Message::Sync {
        doc: id(QUEUE),
        data: msg.encode(),
    }
    .encode()
}

/// Real sync messages: the first message of a peer that has nothing (its heads and needs,
/// no changes), and the answer of a peer that has a document (its changes).
pub fn real_sync_messages() -> Vec<Vec<u8>> {
    let empty = Automerge::new();
    let mut full = doc_with(7, &[("schema", "piecework/task"), ("kind", "k")]);
    let (mut se, mut sf) = (sync::State::new(), sync::State::new());
    let mut out = Vec::new();
    let ask = empty
        .generate_sync_message(&mut se)
        .expect("a first message");
    out.push(ask.clone().encode());
    full.receive_sync_message(&mut sf, ask)
        .expect("its own message");
    if let Some(m) = full.generate_sync_message(&mut sf) {
        out.push(m.encode());
    }
    out
}

/// A replica serving one queue: its queue document loaded, one task document stored and not
/// loaded, another scoped but nowhere; a member and a stranger connected.
#[derive(Debug)]
pub struct Fixture {
    /// The replica.
    pub replica: Replica,
    /// Its clock.
    pub now: Instant,
    /// What its storage holds of [`TASK`].
    stored: Automerge,
    /// Every event it reported.
    pub events: Vec<Event>,
    /// Every message it sent, and to whom.
    pub sent: Vec<(PeerId, Message)>,
}

/// One real instant to count from; the replica never reads a clock.
#[allow(clippy::disallowed_methods)]
fn start() -> Instant {
    Instant::now()
}

impl Fixture {
    /// The replica, with everything its setup produced drained.
    pub fn new() -> Self {
        let mut r = Replica::new();
        r.set_actor(ActorId::from(&[1u8; 16][..]));
        r.set_local_peer(peer(ME));
        let q = id(QUEUE);
        r.set_group(&q, BTreeSet::from([peer(ME), peer(MEMBER)]));
        r.create(
            q.clone(),
            queue_document(),
            Some(Scope {
                group: q.clone(),
                announce: true,
                requestable: true,
            }),
        );
        for (doc, announce) in [(TASK, true), (NEW_TASK, false)] {
            r.set_scope(
                &id(doc),
                Scope {
                    group: q.clone(),
                    announce,
                    requestable: false,
                },
            );
        }
        r.handle_connected(peer(MEMBER));
        r.handle_connected(peer(STRANGER));
        let mut f = Fixture {
            replica: r,
            now: start(),
            stored: doc_with(3, &[("schema", "piecework/task"), ("kind", "k")]),
            events: Vec::new(),
            sent: Vec::new(),
        };
        f.drain();
        f
    }

    /// Takes every event and message, answering loads from storage; each message sent goes
    /// through the wire format.
    pub fn drain(&mut self) {
        for _ in 0..MAX_OUTPUTS {
            if let Some(ev) = self.replica.poll_event() {
                if let Event::Load(doc) = &ev {
                    let stored = (doc.as_str() == TASK).then(|| self.stored.clone());
                    self.replica.handle_loaded(doc, stored, self.now);
                }
                self.events.push(ev);
                continue;
            }
            let Some((to, msg)) = self.replica.poll_transmit(self.now) else {
                return;
            };
            let back = Message::decode(&msg.encode());
            assert_eq!(back.as_ref(), Ok(&msg), "a message sent decodes as sent");
            self.sent.push((to, msg));
        }
        panic!("one input produced more than {MAX_OUTPUTS} outputs");
    }

    /// A frame from `from`, and what it produces.
    pub fn deliver(&mut self, from: &str, msg: Message) {
        self.replica.handle_message(&peer(from), msg, self.now);
        self.drain();
    }

    /// Time passes; no deadline the replica asks for lies in the past.
    pub fn later(&mut self, by: Duration) {
        self.now += by;
        self.replica.handle_timeout(self.now);
        self.drain();
        if let Some(at) = self.replica.poll_timeout() {
            assert!(
                at > self.now,
                "a deadline in the past would spin the driver"
            );
        }
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

/// What must hold of a frame's decoding.
pub fn check_decode(data: &[u8]) {
    match Message::decode(data) {
        Ok(m) => {
            assert_eq!(Message::decode(&m.encode()), Ok(m.clone()));
            assert_eq!(Message::peek_doc(data).as_ref(), Some(m.doc()));
            assert!(data.first().is_some_and(|t| (1..=3).contains(t)));
        }
        Err(DecodeError::Truncated) => {
            let claimed = data.get(1).map_or(0, |l| usize::from(*l));
            assert!(data.len() < 2 || data.len() - 2 < claimed);
        }
        Err(DecodeError::BadDocId) => assert!(Message::peek_doc(data).is_none()),
        Err(DecodeError::UnknownType(t)) => {
            assert!(!(1..=3).contains(&t));
            assert_eq!(data.first(), Some(&t));
        }
    }
}

/// `data` as the sync payload of a frame about `doc`, from a member and from a stranger.
pub fn sync_payload(f: &mut Fixture, doc: &str, data: &[u8]) {
    let undecodable = sync::Message::decode(data).is_err();
    for from in [MEMBER, STRANGER] {
        let before = f.events.len();
        f.deliver(
            from,
            Message::Sync {
                doc: id(doc),
                data: data.to_vec(),
            },
        );
        let new = &f.events[before..];
        let allowed = doc == QUEUE || (from == MEMBER && doc != UNKNOWN);
        if allowed && undecodable {
            assert!(
                new.iter()
                    .any(|e| matches!(e, Event::Rejected { peer, .. } if peer.as_str() == from)),
                "an undecodable payload about {doc} from {from} is rejected: {new:?}"
            );
        }
        if !allowed {
            assert!(
                new.iter()
                    .any(|e| matches!(e, Event::Refused { peer, .. } if peer.as_str() == from)),
                "{from} may not sync {doc}: {new:?}"
            );
        }
    }
}

/// Target `replica_message`: the bytes as a frame from a member and from a stranger, and as
/// the sync payload of a frame about each kind of document; then time passes.
pub fn replica_message(data: &[u8]) {
    check_decode(data);
    let mut f = Fixture::new();
    if let Ok(m) = Message::decode(data) {
        for from in [MEMBER, STRANGER] {
            f.deliver(from, m.clone());
        }
    }
    for doc in [QUEUE, TASK, NEW_TASK, UNKNOWN] {
        sync_payload(&mut f, doc, data);
    }
    f.later(Duration::from_secs(1));
    f.later(Duration::from_secs(60));
}
