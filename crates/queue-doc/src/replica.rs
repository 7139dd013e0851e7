//! The documents a peer holds, and their sync with other peers: a sans-IO engine on Automerge's
//! own sync protocol.
//!
//! Piecework first synced documents with samod. samod keeps every document it has ever seen
//! loaded and does work proportional to *all* of them on every message (measured in
//! `docs/sync.md`: a change's round trip takes 0.3 ms with 10 documents loaded and 38 ms with
//! 5,000). With one document per task that does not scale, so this module does the same job with
//! work per message proportional to the one document it concerns.
//!
//! # Model
//!
//! A [`Replica`] holds loaded documents. Each has a per-peer [`automerge::sync::State`] for every
//! peer it is being synced with. A *shared* document is synced with every connected peer
//! (announced on connect and after every change); an unshared one only with peers that ask for
//! it or send it. A document a peer announces arrives shared, so it is passed on to peers the
//! announcer is not connected to. A message for a document that is not loaded asks the driver to load it
//! ([`Event::Load`]); if storage does not have it either, a document pushed by a peer is accepted
//! as new, and one that was requested is answered with [`Message::Unavailable`].
//!
//! # Driving a replica
//!
//! Inputs: [`Replica::handle_connected`], [`Replica::handle_disconnected`],
//! [`Replica::handle_message`], [`Replica::handle_loaded`]; commands: [`Replica::insert`],
//! [`Replica::change`], [`Replica::fetch`], [`Replica::set_shared`], [`Replica::evict`].
//! Outputs: [`Replica::poll_transmit`] (messages to peers, in order per peer) and
//! [`Replica::poll_event`]. After a document changes, persist [`Replica::take_unsaved`].
//! Messages to one peer must be delivered in order; a lost message is repaired by the protocol
//! once both sides reset (reconnect). Messages are generated when polled, so the changes made
//! between two polls travel together.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use automerge::sync::{self, SyncDoc};
use automerge::{Automerge, ChangeHash, ReadDoc};
use rand::RngCore;
use serde::{Deserialize, Serialize};

use crate::ids::PeerId;

/// A document's id: an `automerge:` URL (base58 of 16 random bytes after the prefix).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DocId(String);

/// The prefix of every document id.
pub const URL_PREFIX: &str = "automerge:";
/// The longest document id accepted from the network.
pub const MAX_DOC_ID: usize = 64;

impl DocId {
    /// A fresh random id.
    pub fn generate(rng: &mut impl RngCore) -> Self {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        DocId(format!("{URL_PREFIX}{}", bs58::encode(bytes).into_string()))
    }

    /// Parses an id, checking its form.
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(URL_PREFIX)?;
        let ok = s.len() <= MAX_DOC_ID
            && !rest.is_empty()
            && bs58::decode(rest).into_vec().is_ok_and(|b| b.len() == 16);
        ok.then(|| DocId(s.to_owned()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A message between replicas about one document.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// An Automerge sync message.
    Sync {
        /// The document.
        doc: DocId,
        /// The encoded sync message.
        data: Vec<u8>,
    },
    /// "Send me this document if you have it."
    Request {
        /// The document.
        doc: DocId,
    },
    /// "I do not have this document."
    Unavailable {
        /// The document.
        doc: DocId,
    },
}

/// A message from the network could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message is shorter than its header says.
    #[error("truncated replica message")]
    Truncated,
    /// Unknown message type.
    #[error("unknown replica message type {0}")]
    UnknownType(u8),
    /// The document id is malformed.
    #[error("malformed document id in a replica message")]
    BadDocId,
}

impl Message {
    /// The document the message is about.
    pub fn doc(&self) -> &DocId {
        match self {
            Message::Sync { doc, .. } | Message::Request { doc } | Message::Unavailable { doc } => {
                doc
            }
        }
    }

    /// Encodes the message: type byte, id length byte, id, then the sync data.
    pub fn encode(&self) -> Vec<u8> {
        let (ty, doc, data): (u8, &DocId, &[u8]) = match self {
            Message::Sync { doc, data } => (1, doc, data),
            Message::Request { doc } => (2, doc, &[]),
            Message::Unavailable { doc } => (3, doc, &[]),
        };
        let id = doc.as_str().as_bytes();
        let mut out = Vec::with_capacity(2 + id.len() + data.len());
        out.push(ty);
        out.push(u8::try_from(id.len()).expect("document ids are short"));
        out.extend_from_slice(id);
        out.extend_from_slice(data);
        out
    }

    /// Decodes a message from the network.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        let [ty, len, rest @ ..] = bytes else {
            return Err(DecodeError::Truncated);
        };
        let len = usize::from(*len);
        if rest.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (id, data) = rest.split_at(len);
        let doc = std::str::from_utf8(id)
            .ok()
            .and_then(DocId::parse)
            .ok_or(DecodeError::BadDocId)?;
        Ok(match ty {
            1 => Message::Sync {
                doc,
                data: data.to_vec(),
            },
            2 => Message::Request { doc },
            3 => Message::Unavailable { doc },
            t => return Err(DecodeError::UnknownType(*t)),
        })
    }
}

/// Something the driver must act on or may want to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Load this document from storage and answer with [`Replica::handle_loaded`].
    Load(DocId),
    /// A peer's message changed this document: persist [`Replica::take_unsaved`].
    Changed(DocId),
    /// A document not held before is now loaded with content (fetched, or pushed by a peer).
    Arrived(DocId),
    /// No connected peer has this fetched document.
    Unavailable(DocId),
    /// A peer sent something this replica could not use (a malformed message). Data, not a crash.
    Rejected {
        /// The peer.
        peer: PeerId,
        /// What was wrong.
        reason: String,
    },
}

#[derive(Debug)]
struct Entry {
    doc: Automerge,
    shared: bool,
    peers: BTreeMap<PeerId, sync::State>,
    saved: Vec<ChangeHash>,
}

#[derive(Debug, Default)]
struct Loading {
    queued: Vec<(PeerId, Message)>,
    fetch: bool,
    shared: bool,
}

/// A peer's documents and their sync state. See the module docs for how to drive it.
#[derive(Debug, Default)]
pub struct Replica {
    // Ordered maps throughout: the order of messages and events depends only on the inputs,
    // so that a seeded simulation replays exactly.
    docs: BTreeMap<DocId, Entry>,
    loading: BTreeMap<DocId, Loading>,
    /// Fetches waiting on peers: the peers asked that have not answered.
    fetching: BTreeMap<DocId, BTreeSet<PeerId>>,
    /// The actor id given to every document this replica takes in, if set.
    actor: Option<automerge::ActorId>,
    peers: BTreeSet<PeerId>,
    /// Documents with sync messages to generate: to every peer syncing them (`true`), or to
    /// these peers. Generated lazily in `poll_transmit`, so that many changes between two polls
    /// travel as one message.
    pending: BTreeMap<DocId, (bool, BTreeSet<PeerId>)>,
    outbox: VecDeque<(PeerId, Message)>,
    events: VecDeque<Event>,
}

impl Replica {
    /// An empty replica with no peers.
    pub fn new() -> Self {
        Replica::default()
    }

    /// Writes made through this replica use `actor` from now on (every document it takes in
    /// gets it). Each writer must have its own actor id: a simulator gives one per node and
    /// incarnation, to replay exactly; without this, documents keep automerge's random ids.
    pub fn set_actor(&mut self, actor: automerge::ActorId) {
        self.actor = Some(actor);
    }

    // ----- getters -----

    /// A loaded document.
    pub fn get(&self, id: &DocId) -> Option<&Automerge> {
        self.docs.get(id).map(|e| &e.doc)
    }

    /// Whether the document is loaded.
    pub fn is_loaded(&self, id: &DocId) -> bool {
        self.docs.contains_key(id)
    }

    /// How many documents are loaded.
    pub fn loaded(&self) -> usize {
        self.docs.len()
    }

    /// The connected peers.
    pub fn peers(&self) -> &BTreeSet<PeerId> {
        &self.peers
    }

    /// Whether some peer has said it has every change in `heads` of document `id`.
    pub fn peer_has(&self, id: &DocId, heads: &[ChangeHash]) -> bool {
        let Some(e) = self.docs.get(id) else {
            return false;
        };
        e.peers.values().any(|s| {
            let Some(theirs) = s.their_heads.as_ref() else {
                return false;
            };
            if heads.iter().all(|h| theirs.contains(h)) {
                return true;
            }
            // They have our heads if none is among the changes their heads lack.
            theirs.iter().all(|h| e.doc.get_change_by_hash(h).is_some())
                && !e
                    .doc
                    .get_changes(theirs)
                    .iter()
                    .any(|c| heads.contains(&c.hash()))
        })
    }

    // ----- commands -----

    /// Adds a document created here, or loaded by the driver unprompted. Replaces nothing: if
    /// the id is already loaded, `doc` is merged into it.
    pub fn insert(&mut self, id: DocId, doc: Automerge, shared: bool) {
        if let Some(e) = self.docs.get_mut(&id) {
            let mut doc = doc;
            if e.doc.merge(&mut doc).is_ok_and(|c| !c.is_empty()) {
                self.sync_all(&id);
            }
            return;
        }
        let mut doc = doc;
        if let Some(a) = &self.actor {
            doc.set_actor(a.clone());
        }
        let saved = doc.get_heads();
        self.docs.insert(
            id.clone(),
            Entry {
                doc,
                shared,
                peers: BTreeMap::new(),
                saved,
            },
        );
        if shared {
            self.announce(&id);
        }
    }

    /// Adds a document created here that storage does not hold yet: [`Replica::take_unsaved`]
    /// returns all of it.
    pub fn create(&mut self, id: DocId, doc: Automerge, shared: bool) {
        self.insert(id.clone(), doc, shared);
        if let Some(e) = self.docs.get_mut(&id) {
            e.saved.clear();
        }
    }

    /// Applies `f` to a loaded document, then syncs whatever changed. `None` if not loaded.
    pub fn change<R>(&mut self, id: &DocId, f: impl FnOnce(&mut Automerge) -> R) -> Option<R> {
        let e = self.docs.get_mut(id)?;
        let before = e.doc.get_heads();
        let r = f(&mut e.doc);
        if e.doc.get_heads() != before {
            self.sync_all(id);
        }
        Some(r)
    }

    /// Makes a document shared (synced with every connected peer) or not.
    pub fn set_shared(&mut self, id: &DocId, shared: bool) {
        let Some(e) = self.docs.get_mut(id) else {
            return;
        };
        let was = e.shared;
        e.shared = shared;
        if shared && !was {
            self.announce(id);
        }
    }

    /// Asks for a document: loaded → [`Event::Arrived`] at once; otherwise load it from
    /// storage and, failing that, request it from every connected peer. Ends in `Arrived` or
    /// [`Event::Unavailable`].
    pub fn fetch(&mut self, id: &DocId, shared: bool) {
        if let Some(e) = self.docs.get_mut(id) {
            e.shared |= shared;
            if e.doc.get_heads().is_empty() {
                // Announced by a peer but no change received yet: ask for it and wait.
                if !self.fetching.contains_key(id) {
                    self.request(id);
                }
            } else {
                self.events.push_back(Event::Arrived(id.clone()));
            }
            return;
        }
        if !self.loading.contains_key(id) {
            self.events.push_back(Event::Load(id.clone()));
        }
        let loading = self.loading.entry(id.clone()).or_default();
        loading.fetch = true;
        loading.shared |= shared;
    }

    /// Drops a loaded document from memory (storage keeps it). Refused (false) while it has
    /// unsaved changes.
    pub fn evict(&mut self, id: &DocId) -> bool {
        match self.docs.get(id) {
            Some(e) if e.doc.get_heads() == e.saved => {
                self.docs.remove(id);
                true
            }
            _ => false,
        }
    }

    /// The changes of `id` not yet handed out for saving, oldest first, and marks them saved.
    /// Returns the raw bytes of each change with its hash.
    pub fn take_unsaved(&mut self, id: &DocId) -> Vec<(ChangeHash, Vec<u8>)> {
        let Some(e) = self.docs.get_mut(id) else {
            return vec![];
        };
        let changes = e
            .doc
            .get_changes(&e.saved)
            .into_iter()
            .map(|c| (c.hash(), c.raw_bytes().to_vec()))
            .collect();
        e.saved = e.doc.get_heads();
        changes
    }

    // ----- inputs -----

    /// A sync connection to `peer` opened: announce every shared document.
    pub fn handle_connected(&mut self, peer: PeerId) {
        if !self.peers.insert(peer.clone()) {
            return;
        }
        let shared: Vec<DocId> = self
            .docs
            .iter()
            .filter(|(_, e)| e.shared)
            .map(|(id, _)| id.clone())
            .collect();
        for id in shared {
            self.sync_one(&id, &peer);
        }
        // Fetches still waiting for an answer ask the newcomer too.
        let waiting: Vec<DocId> = self.fetching.keys().cloned().collect();
        for id in waiting {
            if let Some(asked) = self.fetching.get_mut(&id) {
                asked.insert(peer.clone());
            }
            self.outbox
                .push_back((peer.clone(), Message::Request { doc: id }));
        }
    }

    /// The sync connection to `peer` closed: forget its sync states (a reconnect starts over).
    pub fn handle_disconnected(&mut self, peer: &PeerId) {
        if !self.peers.remove(peer) {
            return;
        }
        for e in self.docs.values_mut() {
            e.peers.remove(peer);
        }
        let waiting: Vec<DocId> = self.fetching.keys().cloned().collect();
        for id in waiting {
            self.unavailable_from(&id, peer);
        }
    }

    /// The driver's answer to [`Event::Load`]: the stored document, or `None`.
    pub fn handle_loaded(&mut self, id: &DocId, doc: Option<Automerge>) {
        let Some(loading) = self.loading.remove(id) else {
            if let Some(doc) = doc {
                self.insert(id.clone(), doc, false);
            }
            return;
        };
        match doc {
            Some(doc) => {
                self.insert(id.clone(), doc, loading.shared);
                if loading.fetch {
                    self.events.push_back(Event::Arrived(id.clone()));
                }
                for (peer, msg) in loading.queued {
                    self.handle_message(&peer, msg);
                }
            }
            None => {
                let pushed = loading
                    .queued
                    .iter()
                    .any(|(_, m)| matches!(m, Message::Sync { .. }));
                if pushed {
                    // A peer is announcing this document: take it as new, and pass it on (an
                    // announced document is meant to replicate; the driver may unshare it).
                    self.insert(id.clone(), Automerge::new(), true);
                    if let Some(e) = self.docs.get_mut(id) {
                        e.saved.clear();
                    }
                } else if loading.fetch {
                    self.request(id);
                }
                for (peer, msg) in loading.queued {
                    match msg {
                        Message::Request { doc } if !self.docs.contains_key(&doc) => {
                            self.outbox.push_back((peer, Message::Unavailable { doc }));
                        }
                        msg => self.handle_message(&peer, msg),
                    }
                }
            }
        }
    }

    /// A message from `peer` (authenticated by the transport).
    pub fn handle_message(&mut self, peer: &PeerId, msg: Message) {
        let id = msg.doc().clone();
        if let Some(l) = self.loading.get_mut(&id) {
            l.queued.push((peer.clone(), msg));
            return;
        }
        if !self.docs.contains_key(&id) {
            match msg {
                Message::Unavailable { .. } => self.unavailable_from(&id, peer),
                msg => {
                    self.loading.insert(
                        id.clone(),
                        Loading {
                            queued: vec![(peer.clone(), msg)],
                            ..Loading::default()
                        },
                    );
                    self.events.push_back(Event::Load(id));
                }
            }
            return;
        }
        match msg {
            Message::Sync { data, .. } => self.receive(&id, peer, &data),
            Message::Request { .. } => {
                if let Some(e) = self.docs.get_mut(&id) {
                    e.peers.insert(peer.clone(), sync::State::new());
                }
                self.sync_one(&id, peer);
            }
            Message::Unavailable { .. } => {
                if let Some(e) = self.docs.get_mut(&id) {
                    e.peers.remove(peer);
                }
                self.unavailable_from(&id, peer);
            }
        }
    }

    fn receive(&mut self, id: &DocId, peer: &PeerId, data: &[u8]) {
        let msg = match sync::Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                self.events.push_back(Event::Rejected {
                    peer: peer.clone(),
                    reason: format!("undecodable sync message for {id}: {e}"),
                });
                return;
            }
        };
        let Some(e) = self.docs.get_mut(id) else {
            return;
        };
        let was_empty = e.doc.get_heads().is_empty();
        let before = e.doc.get_heads();
        let state = e.peers.entry(peer.clone()).or_default();
        if let Err(err) = e.doc.receive_sync_message(state, msg) {
            // A hostile or broken peer; reset our state with it and carry on.
            e.peers.remove(peer);
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!("bad sync message for {id}: {err}"),
            });
            return;
        }
        let changed = e.doc.get_heads() != before;
        if changed {
            self.events.push_back(Event::Changed(id.clone()));
            if was_empty {
                self.events.push_back(Event::Arrived(id.clone()));
                self.fetching.remove(id);
            }
            self.sync_all(id);
        } else {
            self.sync_one(id, peer);
        }
    }

    // ----- outputs -----

    /// The next message to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(PeerId, Message)> {
        if self.outbox.is_empty() {
            for (id, (all, peers)) in std::mem::take(&mut self.pending) {
                let Some(e) = self.docs.get(&id) else {
                    continue;
                };
                let mut targets = peers;
                if all {
                    targets.extend(e.peers.keys().cloned());
                    if e.shared {
                        targets.extend(self.peers.iter().cloned());
                    }
                }
                for p in targets {
                    self.generate(&id, &p);
                }
            }
        }
        self.outbox.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    // ----- internals -----

    fn request(&mut self, id: &DocId) {
        if self.peers.is_empty() {
            self.events.push_back(Event::Unavailable(id.clone()));
            return;
        }
        let peers = self.peers.clone();
        for p in &peers {
            self.outbox
                .push_back((p.clone(), Message::Request { doc: id.clone() }));
        }
        self.fetching.insert(id.clone(), peers);
    }

    fn unavailable_from(&mut self, id: &DocId, peer: &PeerId) {
        let Some(asked) = self.fetching.get_mut(id) else {
            return;
        };
        asked.remove(peer);
        if asked.is_empty() {
            self.fetching.remove(id);
            if self
                .docs
                .get(id)
                .is_none_or(|e| e.doc.get_heads().is_empty())
            {
                self.docs.remove(id);
                self.events.push_back(Event::Unavailable(id.clone()));
            }
        }
    }

    fn announce(&mut self, id: &DocId) {
        let peers: Vec<PeerId> = self.peers.iter().cloned().collect();
        for p in peers {
            self.sync_one(id, &p);
        }
    }

    /// Schedules a message for every peer this document is being synced with (and, if shared,
    /// every connected peer).
    fn sync_all(&mut self, id: &DocId) {
        self.pending.entry(id.clone()).or_default().0 = true;
    }

    /// Schedules a message for one peer.
    fn sync_one(&mut self, id: &DocId, peer: &PeerId) {
        self.pending
            .entry(id.clone())
            .or_default()
            .1
            .insert(peer.clone());
    }

    fn generate(&mut self, id: &DocId, peer: &PeerId) {
        if !self.peers.contains(peer) {
            return;
        }
        let Some(e) = self.docs.get_mut(id) else {
            return;
        };
        let state = e.peers.entry(peer.clone()).or_default();
        if let Some(msg) = e.doc.generate_sync_message(state) {
            self.outbox.push_back((
                peer.clone(),
                Message::Sync {
                    doc: id.clone(),
                    data: msg.encode(),
                },
            ));
        }
    }
}

/// A small in-memory network of replicas for tests: delivers every message, in order per pair,
/// and answers loads from nothing (no storage).
#[derive(Debug, Default)]
pub struct TestNet {
    /// The replicas by peer.
    pub replicas: BTreeMap<PeerId, Replica>,
    /// Events seen, per peer.
    pub events: BTreeMap<PeerId, Vec<Event>>,
}

impl TestNet {
    /// Adds a replica for `peer`.
    pub fn add(&mut self, peer: &PeerId) {
        self.replicas.insert(peer.clone(), Replica::new());
    }

    /// Connects two peers.
    pub fn connect(&mut self, a: &PeerId, b: &PeerId) {
        if let Some(r) = self.replicas.get_mut(a) {
            r.handle_connected(b.clone());
        }
        if let Some(r) = self.replicas.get_mut(b) {
            r.handle_connected(a.clone());
        }
    }

    /// Delivers messages and answers loads (with "not stored") until nothing moves.
    pub fn run(&mut self) {
        loop {
            let mut moved = false;
            let peers: Vec<PeerId> = self.replicas.keys().cloned().collect();
            for p in &peers {
                while let Some(r) = self.replicas.get_mut(p) {
                    if let Some(ev) = r.poll_event() {
                        moved = true;
                        if let Event::Load(id) = &ev {
                            r.handle_loaded(id, None);
                        }
                        self.events.entry(p.clone()).or_default().push(ev);
                        continue;
                    }
                    let Some((to, msg)) = r.poll_transmit() else {
                        break;
                    };
                    moved = true;
                    // Round-trip through the wire format, as the network would.
                    let msg = Message::decode(&msg.encode()).expect("own messages decode");
                    if let Some(dst) = self.replicas.get_mut(&to)
                        && dst.peers().contains(p)
                    {
                        dst.handle_message(p, msg);
                    }
                }
            }
            if !moved {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use automerge::ROOT;
    use automerge::transaction::Transactable;

    fn id(n: u8) -> DocId {
        DocId(format!(
            "{URL_PREFIX}{}",
            bs58::encode([n; 16]).into_string()
        ))
    }

    fn doc_with(k: &str, v: i64) -> Automerge {
        let mut d = Automerge::new();
        d.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, k, v).map(|_| ()))
            .unwrap();
        d
    }

    fn get(r: &Replica, d: &DocId, k: &str) -> Option<i64> {
        r.get(d)?.get(ROOT, k).ok()??.0.as_scalar()?.as_i64()
    }

    fn peers() -> (PeerId, PeerId, PeerId) {
        (PeerId::new("a"), PeerId::new("b"), PeerId::new("c"))
    }

    #[test]
    fn ids_round_trip_and_refuse_garbage() {
        let d = id(7);
        assert_eq!(DocId::parse(d.as_str()), Some(d.clone()));
        for bad in [
            "",
            "automerge:",
            "automerge:0OIl",
            "http://x",
            "automerge:abc",
        ] {
            assert_eq!(DocId::parse(bad), None, "{bad}");
        }
        let m = Message::Sync {
            doc: d.clone(),
            data: vec![1, 2, 3],
        };
        assert_eq!(Message::decode(&m.encode()), Ok(m));
        assert_eq!(Message::decode(&[1]), Err(DecodeError::Truncated));
        assert_eq!(Message::decode(&[9, 0]), Err(DecodeError::BadDocId));
    }

    #[test]
    fn shared_documents_reach_connected_peers_and_changes_follow() {
        let (a, b, c) = peers();
        let mut net = TestNet::default();
        for p in [&a, &b, &c] {
            net.add(p);
        }
        net.connect(&a, &b);
        net.connect(&b, &c);
        net.replicas
            .get_mut(&a)
            .unwrap()
            .create(id(1), doc_with("x", 1), true);
        net.run();
        assert_eq!(get(&net.replicas[&b], &id(1), "x"), Some(1));
        assert_eq!(
            get(&net.replicas[&c], &id(1), "x"),
            Some(1),
            "b relays what it received"
        );
        net.replicas.get_mut(&c).unwrap().change(&id(1), |d| {
            d.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, "y", 2).map(|_| ()))
                .unwrap();
        });
        net.run();
        assert_eq!(get(&net.replicas[&a], &id(1), "y"), Some(2));
        assert!(net.events[&c].contains(&Event::Arrived(id(1))));
    }

    #[test]
    fn unshared_documents_travel_only_on_request() {
        let (a, b, _) = peers();
        let mut net = TestNet::default();
        net.add(&a);
        net.add(&b);
        net.connect(&a, &b);
        net.replicas
            .get_mut(&a)
            .unwrap()
            .create(id(2), doc_with("x", 5), false);
        net.run();
        assert!(!net.replicas[&b].is_loaded(&id(2)));
        net.replicas.get_mut(&b).unwrap().fetch(&id(2), false);
        net.run();
        assert_eq!(get(&net.replicas[&b], &id(2), "x"), Some(5));
        assert!(net.events[&b].contains(&Event::Arrived(id(2))));
        // Fetching what nobody has ends in Unavailable, not a hang.
        net.replicas.get_mut(&b).unwrap().fetch(&id(3), false);
        net.run();
        assert!(net.events[&b].contains(&Event::Unavailable(id(3))));
        assert!(!net.replicas[&b].is_loaded(&id(3)));
    }

    #[test]
    fn a_shared_document_created_offline_spreads_on_connect() {
        let (a, b, _) = peers();
        let mut net = TestNet::default();
        net.add(&a);
        net.add(&b);
        net.replicas
            .get_mut(&a)
            .unwrap()
            .create(id(4), doc_with("x", 9), true);
        net.run();
        assert!(!net.replicas[&b].is_loaded(&id(4)));
        net.connect(&a, &b);
        net.run();
        assert_eq!(get(&net.replicas[&b], &id(4), "x"), Some(9));
        let unsaved = net.replicas.get_mut(&b).unwrap().take_unsaved(&id(4));
        assert_eq!(
            unsaved.len(),
            1,
            "the received change is handed out for saving once"
        );
        assert!(
            net.replicas
                .get_mut(&b)
                .unwrap()
                .take_unsaved(&id(4))
                .is_empty()
        );
        assert!(
            net.replicas[&a].peer_has(&id(4), &net.replicas[&a].get(&id(4)).unwrap().get_heads())
        );
    }

    #[test]
    fn malformed_sync_data_is_rejected_as_data() {
        let (a, b, _) = peers();
        let mut r = Replica::new();
        r.handle_connected(b.clone());
        r.create(id(5), doc_with("x", 1), true);
        r.handle_message(
            &b,
            Message::Sync {
                doc: id(5),
                data: vec![0x42, 0xff, 0x00],
            },
        );
        let events: Vec<Event> = std::iter::from_fn(|| r.poll_event()).collect();
        assert!(
            events
                .iter()
                .any(|e| matches!(e, Event::Rejected { peer, .. } if *peer == b)),
            "{events:?}"
        );
        assert_eq!(get(&r, &id(5), "x"), Some(1));
        let _ = a;
    }

    #[test]
    fn fetching_an_announced_but_empty_document_waits_for_its_changes() {
        let (a, b, _) = peers();
        let (mut ra, mut rb) = (Replica::new(), Replica::new());
        ra.handle_connected(b.clone());
        rb.handle_connected(a.clone());
        ra.create(id(6), doc_with("x", 3), true);
        // Only a's first message (its heads, no changes yet) reaches b.
        let (to, first) = ra.poll_transmit().expect("a announces the document");
        assert_eq!(to, b);
        rb.handle_message(&a, first);
        while let Some(ev) = rb.poll_event() {
            if let Event::Load(d) = ev {
                rb.handle_loaded(&d, None);
            }
        }
        assert!(
            rb.is_loaded(&id(6)) && get(&rb, &id(6), "x").is_none(),
            "known but empty"
        );
        rb.fetch(&id(6), true);
        let early: Vec<Event> = std::iter::from_fn(|| rb.poll_event()).collect();
        assert!(
            !early.contains(&Event::Arrived(id(6))),
            "an empty document has not arrived: {early:?}"
        );
        // Let the rest flow both ways.
        let mut events = vec![];
        loop {
            let mut moved = false;
            while let Some((_, m)) = ra.poll_transmit() {
                rb.handle_message(&a, m);
                moved = true;
            }
            while let Some((_, m)) = rb.poll_transmit() {
                ra.handle_message(&b, m);
                moved = true;
            }
            events.extend(std::iter::from_fn(|| rb.poll_event()));
            if !moved {
                break;
            }
        }
        assert!(events.contains(&Event::Arrived(id(6))), "{events:?}");
        assert_eq!(get(&rb, &id(6), "x"), Some(3));
    }
}
