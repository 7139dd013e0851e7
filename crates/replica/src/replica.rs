//! The [`Replica`]: loaded documents, the accept policy, and the sync state per peer.
//!
//! This file owns the replica's state (every type it keeps), its bounds and tunables, and the
//! driving surface: the getters, the document commands, the inputs, `poll_event` and
//! `poll_timeout`, messages for loaded and loading documents, and the documents themselves.
//! The rest of `Replica`'s methods are in modules of their own: the accept policy (groups,
//! scopes, held pushes) in `policy.rs`, fetches in `fetch.rs`, and sending and flow control
//! per peer in `flow.rs`. Each imports only this file's items (they call one another's methods
//! on the one `Replica`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use automerge::sync::{self, SyncDoc};
use automerge::{ActorId, Automerge, ChangeHash};

use crate::{DocId, Message, PeerId, chunks};

mod fetch;
mod flow;
mod policy;

/// How long a fetch waits for a peer to send the document's changes, from the moment it asks
/// peers. A fetch answered by nobody, or only by peers holding an empty shell (announced to them
/// but without changes), ends in [`Event::Unavailable`] then.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The most pushes of not-yet-accepted documents remembered (see [`Replica::set_scope`]): a
/// peer pushing many unknown documents must not grow memory. When full, the oldest is forgotten;
/// a forgotten push is recovered when its sender next syncs the document (its next change, or a
/// reconnect).
pub const MAX_HELD: usize = 1024;

/// How long a refused push is remembered. A task document's index entry in its queue document
/// normally follows the task document within a round trip; this is generous for that.
pub const HELD_FOR: Duration = Duration::from_secs(30);

/// The most loads from storage pending at once that peers' messages may start. Beyond it, a
/// peer's message for a document not loaded is answered [`Message::Unavailable`] (its sender
/// resets its sync state for the document, and pushes again at its next change or a reconnect);
/// a push turned away is remembered
/// like an unscoped one (up to [`MAX_HELD`]) and retried when a load ends. The driver's own loads
/// ([`Replica::fetch`], [`Replica::set_scope`] retries) count toward this but are never refused:
/// the driver bounds those itself.
pub const MAX_PENDING_LOADS: usize = 256;

/// The most messages kept for one document while it loads. A peer has at most one sync message
/// in flight per document (automerge's sync protocol waits for an answer), plus a request, so
/// this is room for dozens of peers; a message beyond it is answered like one beyond
/// [`MAX_PENDING_LOADS`].
pub const MAX_QUEUED_PER_LOAD: usize = 64;

/// The most bytes of messages kept, over all documents, while they load. A message beyond it is
/// answered like one beyond [`MAX_PENDING_LOADS`].
pub const MAX_QUEUED_BYTES: usize = 64 << 20;

/// The most requests and "unavailable" answers waiting for one peer (sync messages are not
/// counted: they are generated when polled, at most one per document). These wait while the peer
/// is blocked; beyond this bound new ones are dropped: a dropped answer leaves the requester to
/// its own timeout, a dropped request leaves the fetch to the other peers and its timeout.
pub const MAX_QUEUED_PER_PEER: usize = 1024;

/// The largest sync message accepted from a peer, and the size this replica keeps its own
/// under, in bytes: 16 MiB. Larger ones are rejected ([`Event::Rejected`]) before decoding and
/// not answered. Automerge's sync protocol puts every change a peer lacks in one message; this
/// replica splits such a message into several under this size instead (see
/// [`Replica::poll_transmit`]), so a document of any size syncs, in steps of at most this much.
/// A single change larger than this on its own still travels alone, once per connection, and
/// is refused by its receivers: only a local writer can make one, and the layers above bound
/// what goes into a change (a task's result, its logs) far below it. The transport's frame bound (64 MiB) is
/// larger, so an oversized message reaches this check. It bounds the memory one message costs
/// a receiver before Automerge applies it, and the work of applying it.
pub const MAX_SYNC_MESSAGE_BYTES: usize = 16 << 20;

/// The most bytes the deflated parts of one sync message's changes may inflate to: 128 MiB,
/// eight times [`MAX_SYNC_MESSAGE_BYTES`]. Automerge inflates a saved document's deflated
/// columns, and a compressed change, whole and without a bound (16 MiB of deflated zeros become
/// 16 GiB); a message whose chunks would inflate beyond this is rejected ([`Event::Rejected`])
/// before Automerge reads it, counting (not keeping) at most this many inflated bytes. A saved
/// document, the only thing an honest peer deflates, rarely compresses eightfold; this replica
/// checks its own before sending and sends one that would inflate beyond it as its changes
/// instead (never deflated), so honest documents always get through.
pub const MAX_INFLATED_BYTES: usize = 128 << 20;

/// The sizes a replica keeps its sync messages under and accepts from peers. Both ends of a
/// sync must use the same; the default is [`MAX_SYNC_MESSAGE_BYTES`] and
/// [`MAX_INFLATED_BYTES`], and only tests and simulators set others
/// ([`Replica::set_limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest sync message, in bytes.
    pub message_bytes: usize,
    /// The most bytes the deflated parts of one sync message's changes may inflate to.
    pub inflated_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            message_bytes: MAX_SYNC_MESSAGE_BYTES,
            inflated_bytes: MAX_INFLATED_BYTES,
        }
    }
}

/// How long a sync message that carried changes to a peer waits for that peer's answer before
/// the next one for the same document is sent anyway. While it waits, further changes collect
/// into one message: a peer slower than the changes arrive receives fewer, larger messages
/// instead of a growing backlog (applying a message costs Automerge a walk of every object it
/// touches, so many small ones cost far more than one large one). The first change after a
/// quiet spell goes at once. A peer that already has the changes may not answer at all: this is
/// the longest that delays the next message.
pub const SYNC_ANSWER_WAIT: Duration = Duration::from_millis(20);

/// How long a replica waits before passing on to a third peer the changes a peer sent it, if
/// its peer id is the lower of the two ([`Replica::set_local_peer`]); the other waits
/// [`RELAY_AFTER_HIGHER`]. The author sends its changes to every connected member itself:
/// passing them on at once made every pair of members send each other what both had just
/// received (three of four sync messages with changes brought nothing, seven nodes in the
/// simulator). Waiting lets a message from the third peer say what it has first; the uneven
/// waits make one of each pair tell the other. A change still reaches a member the author
/// cannot reach, this much later. What is passed on is first only our heads and what we have
/// (Automerge's summary, no changes): a member that has the changes answers so, one that
/// lacks them asks, and gets them a round trip later. Sending the changes themselves, the
/// member of each pair that spoke first still sent what the other had (in the 7-node
/// simulator, about 7,600 of 11,000 messages with changes brought nothing).
pub const RELAY_AFTER: Duration = Duration::from_millis(10);

/// See [`RELAY_AFTER`]: the wait of the member whose peer id is the higher of the pair.
pub const RELAY_AFTER_HIGHER: Duration = Duration::from_millis(60);

/// Where a document belongs: which group's members it is synced with, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// The group: a queue, identified by its queue document's id.
    pub group: DocId,
    /// Synced with every connected member of the group: announced on connect and after every
    /// change. Without it the document is only sent to members that ask for it (a final task).
    pub announce: bool,
    /// Sent to, and accepted from, *any* peer that names it, member or not, and synced with it
    /// while connected (a queue document: knowing its id is what lets a peer join, by writing
    /// itself into it). Still announced only to members.
    pub requestable: bool,
}

/// A document's changes not yet acknowledged as saved ([`Replica::unsaved`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsaved {
    /// Each change's hash and raw bytes, oldest first.
    pub changes: Vec<(ChangeHash, Vec<u8>)>,
    /// The document's heads: once `changes` are written, pass these to
    /// [`Replica::mark_saved`].
    pub heads: Vec<ChangeHash>,
}

/// Something the driver must act on or may want to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Load this document from storage and answer with [`Replica::handle_loaded`].
    Load(DocId),
    /// A peer's message changed this document: write [`Replica::unsaved`], then
    /// [`Replica::mark_saved`].
    Changed(DocId),
    /// A document not held before is now loaded with content (fetched, or pushed by a peer).
    Arrived(DocId),
    /// A fetch (or the re-request of a held push) ended without the document: no peer asked had
    /// it, or none sent its changes within [`FETCH_TIMEOUT`].
    Unavailable(DocId),
    /// A peer sent a message about a document this replica does not sync with it (no scope, or
    /// the peer is not a member of its group). It was answered [`Message::Unavailable`] and
    /// nothing was stored or loaded. Data, not an error.
    Refused {
        /// The peer.
        peer: PeerId,
        /// The document.
        doc: DocId,
    },
    /// A peer that may not have this document presented a proof that it may
    /// ([`Message::Present`]): the driver checks it, admits the peer (a group, a scope) if it
    /// holds, and answers with [`Replica::answer_presented`] either way.
    Presented {
        /// The peer.
        peer: PeerId,
        /// The document.
        doc: DocId,
        /// Its proof.
        proof: Vec<u8>,
    },
    /// A peer sent something this replica could not use (a malformed or oversized message).
    /// Data, not a crash.
    Rejected {
        /// The peer.
        peer: PeerId,
        /// What was wrong.
        reason: String,
    },
}

/// A loaded document.
#[derive(Debug)]
struct Entry {
    doc: Automerge,
    /// Sync state per peer it is being synced with. Bounded by the connected peers (removed on
    /// disconnect, and pruned when a peer stops being allowed).
    peers: BTreeMap<PeerId, sync::State>,
    /// Heads of what the driver acknowledged as written ([`Replica::mark_saved`]), sorted.
    saved: Vec<ChangeHash>,
    /// A copy of the peers' changes Automerge keeps aside until their dependencies arrive, to
    /// check them then (`validate`): at most [`MAX_ASIDE_BYTES`] of them, beyond which
    /// Automerge's queue is emptied.
    aside: Vec<(PeerId, automerge::Change)>,
}

/// The most bytes of peers' changes a document keeps aside waiting for their dependencies
/// (Automerge's queue, which Automerge does not bound): as much as one sync message holds.
/// Beyond it the queue is emptied (the document rebuilt from its applied changes); the peers
/// send those changes again once they are needed.
pub const MAX_ASIDE_BYTES: usize = MAX_SYNC_MESSAGE_BYTES;

/// A document being loaded from storage.
#[derive(Debug, Default)]
struct Loading {
    /// Peers' messages waiting for the load: at most [`MAX_QUEUED_PER_LOAD`].
    queued: Vec<(PeerId, Message)>,
    /// The driver fetches it.
    fetch: bool,
    /// Peers that pushed it before it was scoped: ask them once the load says it is not stored.
    /// Bounded by [`MAX_HELD`] (it is taken from the held set).
    retry: BTreeSet<PeerId>,
}

/// A fetch waiting on peers (storage did not have the document).
#[derive(Debug)]
struct Fetch {
    /// The peers asked that have not said "unavailable". They may send the document although it
    /// has no scope (yet), until the deadline.
    asked: BTreeSet<PeerId>,
    deadline: Instant,
    /// The document arrived. The entry stays until the deadline so that the other peers asked
    /// can still answer while the driver scopes the document.
    arrived: bool,
}

/// What waits to be sent to one connected peer.
#[derive(Debug, Default)]
struct Link {
    /// Its transport has no send credit: generate nothing for it.
    blocked: bool,
    /// Requests and "unavailable" answers, in order: at most [`MAX_QUEUED_PER_PEER`].
    ready: VecDeque<Message>,
    /// Documents to generate a sync message for, when polled and not blocked. A set: bounded by
    /// the loaded documents (evicted ones are removed), and many changes in between become one
    /// message.
    sync: BTreeSet<DocId>,
    /// Documents whose last message to the peer carried changes and has not been answered,
    /// with when the next may go anyway ([`SYNC_ANSWER_WAIT`]).
    unanswered: BTreeMap<DocId, Instant>,
    /// Documents with a message owed, held back until their entry in `unanswered` goes.
    held: BTreeSet<DocId>,
    /// The rest of a sync message too large to go at once, per document: the parts still to
    /// send, each under [`Limits::message_bytes`], in order. While a document has parts here
    /// nothing else is generated for it; each part waits for the answer to the one before (or
    /// [`SYNC_ANSWER_WAIT`]), and they are dropped when the peer's sync state for the document
    /// starts over. Bounded by one generated message per document.
    parts: BTreeMap<DocId, VecDeque<Vec<u8>>>,
    /// Changes too large for any message (a local writer's) sent to the peer once, per
    /// document: the peer refused them and would refuse them again. They are not sent again
    /// on this connection, and a message that would only answer the peer's asking for them is
    /// not sent either (the two would otherwise trade messages without end). Bounded by the
    /// loaded documents and their changes.
    oversized: BTreeMap<DocId, BTreeSet<automerge::ChangeHash>>,
    /// Documents whose changes from another peer are to be passed on, and when
    /// ([`RELAY_AFTER`]); a message generated for the document before then passes them on.
    relay: BTreeMap<DocId, Instant>,
    /// Documents in `sync` (or `held`) only to pass on another peer's changes: their message
    /// names our heads and what we have, without changes; the peer asks for what it lacks.
    /// Any other reason to send clears the entry. A subset of `sync` and `held`.
    heads_only: BTreeSet<DocId>,
}

impl Link {
    /// The peer said something about `id`: a message held for it may go.
    fn answered(&mut self, id: &DocId) {
        self.unanswered.remove(id);
        if self.held.remove(id) {
            self.sync.insert(id.clone());
        }
    }
}

/// A peer's documents and their sync state. See the crate docs for how to drive it.
#[derive(Debug, Default)]
pub struct Replica {
    // Ordered maps throughout: the order of messages and events depends only on the inputs,
    // so that a seeded simulation replays exactly.
    /// Loaded documents. Not bounded here: the driver decides what to evict ([`Replica::loaded`],
    /// [`Replica::evict`]). Peers add to it only documents it has scoped or fetches.
    docs: BTreeMap<DocId, Entry>,
    /// Scopes, loaded or not. Grows only by the driver's [`Replica::set_scope`] (one per document
    /// of the queues it serves); [`Replica::clear_scope`] and [`Replica::remove_group`] shrink it.
    scopes: BTreeMap<DocId, Scope>,
    /// Groups and their members. Grows only by the driver's [`Replica::set_group`] (one per queue
    /// it serves).
    groups: BTreeMap<DocId, BTreeSet<PeerId>>,
    /// Loads from storage under way: at most [`MAX_PENDING_LOADS`] started by peers, plus the
    /// driver's own.
    loading: BTreeMap<DocId, Loading>,
    /// Bytes of the messages in `loading`: at most [`MAX_QUEUED_BYTES`].
    queued_bytes: usize,
    /// A peer's message was turned away because of [`MAX_PENDING_LOADS`]: when loads end, retry
    /// the held pushes that are now acceptable.
    loads_refused: bool,
    /// Fetches waiting on peers. Started only by the driver's fetches and the retries of held
    /// pushes (at most [`MAX_HELD`]), each after its load, and every entry ends by its deadline:
    /// bounded by what the driver fetched in the last [`FETCH_TIMEOUT`] plus [`MAX_HELD`].
    fetching: BTreeMap<DocId, Fetch>,
    /// The fetches' deadlines, for [`Replica::poll_timeout`]: one per `fetching` entry.
    deadlines: BTreeSet<(Instant, DocId)>,
    /// Pushes of documents not accepted yet, and when: at most [`MAX_HELD`], each for at most
    /// [`HELD_FOR`].
    held: BTreeMap<(DocId, PeerId), Instant>,
    /// The same pushes, oldest first.
    held_order: BTreeSet<(Instant, DocId, PeerId)>,
    /// The actor id given to every document this replica takes in, if set.
    actor: Option<ActorId>,
    /// The connected peers.
    peers: BTreeSet<PeerId>,
    /// What waits for each connected peer (one per entry of `peers`). Messages are generated
    /// lazily from it in [`Replica::poll_transmit`]: there is no outbox of encoded sync messages
    /// to grow.
    links: BTreeMap<PeerId, Link>,
    /// The peer last sent to: [`Replica::poll_transmit`] serves peers in turn from the next one.
    cursor: Option<PeerId>,
    /// This replica's own peer id, if the driver set it: it decides which of two members
    /// passes on a third's changes first ([`RELAY_AFTER`]).
    me: Option<PeerId>,
    /// The relay waits, lower and higher peer id, if the driver set them
    /// ([`Replica::set_relay_waits`]); else [`RELAY_AFTER`] and [`RELAY_AFTER_HIGHER`].
    relay_waits: Option<(Duration, Duration)>,
    /// The `relay` entries of all links, by when they are due (an entry whose link no longer
    /// has it, or has it for another time, is skipped): one per entry.
    relay_due: BTreeSet<(Instant, PeerId, DocId)>,
    /// Drained by the driver after every input; each input adds a bounded number (at most one
    /// or two per document it concerns).
    events: VecDeque<Event>,
    /// The sizes of sync messages, sent and accepted.
    limits: Limits,
    /// Presentations ([`Message::Present`]) the driver has not answered yet
    /// ([`Replica::answer_presented`]): at most [`MAX_PRESENTED`], forgotten when their peer
    /// disconnects.
    presented: BTreeSet<(PeerId, DocId)>,
}

/// The most presentations waiting for the driver's answer; more are answered
/// [`Message::Unavailable`].
pub const MAX_PRESENTED: usize = 64;

impl Replica {
    /// An empty replica with no peers.
    pub fn new() -> Self {
        Replica::default()
    }

    /// Writes made through this replica use `actor` from now on: every document loaded now and
    /// every document it takes in later (created, inserted, loaded or received) gets it. Each
    /// writer must have its own actor id (the driver derives a fresh one per node incarnation);
    /// without this, documents keep automerge's random ids.
    pub fn set_actor(&mut self, actor: ActorId) {
        for e in self.docs.values_mut() {
            e.doc.set_actor(actor.clone());
        }
        self.actor = Some(actor);
    }

    /// This replica's own peer id: with it, of two members the one with the lower id passes
    /// on a third's changes first ([`RELAY_AFTER`]). Without it both wait [`RELAY_AFTER`].
    pub fn set_local_peer(&mut self, me: PeerId) {
        self.me = Some(me);
    }

    /// Sets how long this replica waits before passing a peer's changes on to a third: `lower`
    /// when its peer id is the lower of the two, `higher` otherwise (by default
    /// [`RELAY_AFTER`] and [`RELAY_AFTER_HIGHER`]). For a simulator that explores timings.
    pub fn set_relay_waits(&mut self, lower: Duration, higher: Duration) {
        self.relay_waits = Some((lower, higher));
    }

    /// Sets the sizes this replica keeps its sync messages under and accepts (by default
    /// [`MAX_SYNC_MESSAGE_BYTES`] and [`MAX_INFLATED_BYTES`]); every replica it syncs with must
    /// use the same. For tests and simulators that want large documents without large data.
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
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

    /// How many documents are loaded. The replica never evicts on its own: the driver watches
    /// this and [`Replica::evict`]s documents it does not need (final tasks, once saved).
    pub fn loaded(&self) -> usize {
        self.docs.len()
    }

    /// The loaded documents' ids, in order.
    pub fn loaded_ids(&self) -> impl Iterator<Item = &DocId> + '_ {
        self.docs.keys()
    }

    /// The connected peers.
    pub fn peers(&self) -> &BTreeSet<PeerId> {
        &self.peers
    }

    /// Whether the transport to `peer` is blocked ([`Replica::handle_blocked`]).
    pub fn is_blocked(&self, peer: &PeerId) -> bool {
        self.links.get(peer).is_some_and(|l| l.blocked)
    }

    /// A document's scope.
    pub fn scope(&self, doc: &DocId) -> Option<&Scope> {
        self.scopes.get(doc)
    }

    /// A group's members.
    pub fn group(&self, group: &DocId) -> Option<&BTreeSet<PeerId>> {
        self.groups.get(group)
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
            theirs
                .iter()
                .all(|h| e.doc.get_change_meta_by_hash(h).is_some())
                && !e
                    .doc
                    .get_changes_meta(theirs)
                    .iter()
                    .any(|c| heads.contains(&c.hash))
        })
    }

    /// The changes of `id` since the last save acknowledged by [`Replica::mark_saved`], oldest
    /// first, with the heads they lead to. `None` if there are none or the document is not
    /// loaded. Calling it marks nothing: the same changes come back until marked saved.
    pub fn unsaved(&self, id: &DocId) -> Option<Unsaved> {
        let e = self.docs.get(id)?;
        let changes: Vec<(ChangeHash, Vec<u8>)> = e
            .doc
            .get_changes(&e.saved)
            .into_iter()
            .map(|c| (c.hash(), c.raw_bytes().to_vec()))
            .collect();
        if changes.is_empty() {
            return None;
        }
        Some(Unsaved {
            changes,
            heads: e.doc.get_heads(),
        })
    }

    /// Whether every change of a loaded document is acknowledged as saved (false if not loaded).
    pub fn is_saved(&self, id: &DocId) -> bool {
        self.docs
            .get(id)
            .is_some_and(|e| sorted(e.doc.get_heads()) == e.saved)
    }

    // ----- commands -----

    /// Adds a document created here, or loaded by the driver unprompted. Replaces nothing: if
    /// the id is already loaded, `doc` is merged into it. `scope`: as [`Replica::set_scope`];
    /// `None` leaves the document's scope as it is (it may have one already).
    pub fn insert(&mut self, id: DocId, doc: Automerge, scope: Option<Scope>) {
        self.take_in(&id, doc);
        if let Some(s) = scope {
            self.set_scope(&id, s);
        }
    }

    /// Adds a document created here that storage does not hold yet: [`Replica::unsaved`]
    /// returns all of it.
    pub fn create(&mut self, id: DocId, doc: Automerge, scope: Option<Scope>) {
        self.insert(id.clone(), doc, scope);
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

    /// As [`Replica::change`], with read access to other loaded documents (`None` for one that
    /// is not loaded, or is `id` itself): for a change computed from other documents, such as
    /// carrying an epoch's late writes into its successor.
    pub fn change_reading<R>(
        &mut self,
        id: &DocId,
        others: &[&DocId],
        f: impl FnOnce(&mut Automerge, &[Option<&Automerge>]) -> R,
    ) -> Option<R> {
        let mut e = self.docs.remove(id)?;
        let before = e.doc.get_heads();
        let r = {
            let refs: Vec<Option<&Automerge>> = others
                .iter()
                .map(|o| self.docs.get(*o).map(|e| &e.doc))
                .collect();
            f(&mut e.doc, &refs)
        };
        let changed = e.doc.get_heads() != before;
        self.docs.insert(id.clone(), e);
        if changed {
            self.sync_all(id);
        }
        Some(r)
    }

    /// Drops a loaded document from memory (storage keeps it). Refused (false) while it has
    /// changes not marked saved, or a fetch of it still waits for its changes.
    pub fn evict(&mut self, id: &DocId) -> bool {
        if !self.is_saved(id) || self.fetching.get(id).is_some_and(|f| !f.arrived) {
            return false;
        }
        self.end_fetch(id);
        self.drop_entry(id);
        true
    }

    /// The driver wrote a document's changes up to `heads` (from [`Replica::unsaved`]) to
    /// storage. Changes made since stay unsaved. Acknowledgements may come in any order; unknown
    /// heads (or a document not loaded) are ignored.
    pub fn mark_saved(&mut self, id: &DocId, heads: &[ChangeHash]) {
        let Some(e) = self.docs.get_mut(id) else {
            return;
        };
        if heads
            .iter()
            .any(|h| e.doc.get_change_meta_by_hash(h).is_none())
        {
            return;
        }
        let heads = sorted(heads.to_vec());
        let current = sorted(e.doc.get_heads());
        if heads == current || e.saved.is_empty() {
            // Everything up to the document's heads covers every earlier save.
            e.saved = heads;
            return;
        }
        // Keep the candidates that are not an ancestor of another: the heads of what is saved.
        let mut candidates: Vec<ChangeHash> = e.saved.iter().chain(&heads).copied().collect();
        candidates.sort();
        candidates.dedup();
        let after: Vec<BTreeSet<ChangeHash>> = candidates
            .iter()
            .map(|c| {
                e.doc
                    .get_changes_meta(&[*c])
                    .iter()
                    .map(|ch| ch.hash)
                    .collect()
            })
            .collect();
        let keep: Vec<ChangeHash> = candidates
            .iter()
            .filter(|h| {
                candidates
                    .iter()
                    .zip(&after)
                    .all(|(c, not_before)| c == *h || not_before.contains(*h))
            })
            .copied()
            .collect();
        e.saved = keep;
    }

    // ----- inputs -----

    /// A sync connection to `peer` opened: announce the documents it is a member for, and ask
    /// it for the documents still being fetched.
    pub fn handle_connected(&mut self, peer: PeerId) {
        if !self.peers.insert(peer.clone()) {
            return;
        }
        self.links.insert(peer.clone(), Link::default());
        let announced: Vec<DocId> = self
            .docs
            .keys()
            .filter(|id| {
                self.scopes
                    .get(*id)
                    .is_some_and(|s| s.announce && self.is_member(&s.group, &peer))
            })
            .cloned()
            .collect();
        for id in announced {
            self.sync_one(&id, &peer);
        }
        // Fetches still waiting for an answer ask the newcomer too.
        let waiting: Vec<DocId> = self
            .fetching
            .iter()
            .filter(|(id, f)| !f.arrived && self.may_ask(id, &peer))
            .map(|(id, _)| id.clone())
            .collect();
        for id in waiting {
            if self.send_control(&peer, Message::Request { doc: id.clone() })
                && let Some(f) = self.fetching.get_mut(&id)
            {
                f.asked.insert(peer.clone());
            }
        }
    }

    /// The sync connection to `peer` closed: forget its sync states (a reconnect starts over),
    /// and what waited to be sent to it.
    pub fn handle_disconnected(&mut self, peer: &PeerId) {
        if !self.peers.remove(peer) {
            return;
        }
        self.links.remove(peer);
        self.presented.retain(|(p, _)| p != peer);
        for e in self.docs.values_mut() {
            e.peers.remove(peer);
        }
        let waiting: Vec<DocId> = self.fetching.keys().cloned().collect();
        for id in waiting {
            self.unavailable_from(&id, peer);
        }
    }

    /// A message from `peer` (authenticated by the transport). Messages from a peer that is not
    /// connected ([`Replica::handle_connected`]) are ignored.
    pub fn handle_message(&mut self, peer: &PeerId, msg: Message, now: Instant) {
        if !self.peers.contains(peer) {
            return;
        }
        let id = msg.doc().clone();
        let limit = self.limits.message_bytes;
        if let Message::Sync { data, .. } = &msg
            && data.len() > limit
        {
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!(
                    "sync message for {id} of {} bytes, above the {limit} accepted",
                    data.len()
                ),
            });
            return;
        }
        if let Message::Unavailable { .. } = msg {
            if let Some(e) = self.docs.get_mut(&id) {
                e.peers.remove(peer);
            }
            self.forget_parts(&id, Some(peer));
            self.unavailable_from(&id, peer);
            return;
        }
        let msg = match msg {
            // A member of the document's group already: a request like any other. (A
            // requestable document is sent to anyone who asks, but a presentation is meant to
            // make its peer a member: the driver sees it.)
            Message::Present { doc, .. } if self.in_group(&id, peer) => Message::Request { doc },
            Message::Present { doc, proof } => {
                if self.presented.len() >= MAX_PRESENTED
                    || !self.presented.insert((peer.clone(), doc.clone()))
                {
                    self.send_control(peer, Message::Unavailable { doc });
                    return;
                }
                self.events.push_back(Event::Presented {
                    peer: peer.clone(),
                    doc,
                    proof,
                });
                return;
            }
            m => m,
        };
        let push = matches!(msg, Message::Sync { .. });
        if !self.admits(&id, peer) {
            self.refuse(&id, peer, push, now);
            return;
        }
        if self.docs.contains_key(&id) {
            self.dispatch(&id, peer, msg, now);
            return;
        }
        if self.loading.contains_key(&id) {
            self.queue(&id, peer, msg, now);
            return;
        }
        if self.fetching.contains_key(&id) {
            // Storage did not have it and peers were asked: this is (likely) an answer.
            self.take_from_peer(&id, peer, msg, now);
            return;
        }
        if self.loading.len() >= MAX_PENDING_LOADS
            || self.queued_bytes + bytes(&msg) > MAX_QUEUED_BYTES
        {
            self.loads_refused = true;
            self.turn_away(&id, peer, push, now);
            return;
        }
        self.loading.insert(id.clone(), Loading::default());
        self.events.push_back(Event::Load(id.clone()));
        self.queue(&id, peer, msg, now);
    }

    /// The driver's answer to [`Event::Presented`]: if `accepted` (and the peer is now
    /// admitted), the document is sent to it as if it had asked; otherwise it is answered
    /// [`Message::Unavailable`].
    pub fn answer_presented(&mut self, peer: &PeerId, doc: &DocId, accepted: bool, now: Instant) {
        if !self.presented.remove(&(peer.clone(), doc.clone())) {
            return;
        }
        if accepted && self.admits(doc, peer) {
            self.handle_message(peer, Message::Request { doc: doc.clone() }, now);
        } else {
            self.send_control(peer, Message::Unavailable { doc: doc.clone() });
        }
    }

    /// The driver's answer to [`Event::Load`]: the stored document, or `None`.
    pub fn handle_loaded(&mut self, id: &DocId, doc: Option<Automerge>, now: Instant) {
        let Some(loading) = self.loading.remove(id) else {
            if let Some(doc) = doc {
                self.take_in(id, doc);
            }
            return;
        };
        self.queued_bytes = self
            .queued_bytes
            .saturating_sub(loading.queued.iter().map(|(_, m)| bytes(m)).sum());
        match doc {
            Some(doc) => {
                self.take_in(id, doc);
                for p in &loading.retry {
                    if self.peers.contains(p) && self.admits(id, p) {
                        self.sync_one(id, p);
                    }
                }
                if loading.fetch {
                    self.fetch(id, now);
                }
                for (peer, msg) in loading.queued {
                    self.handle_message(&peer, msg, now);
                }
            }
            None => {
                for (peer, msg) in loading.queued {
                    if !self.peers.contains(&peer) {
                        continue;
                    }
                    let push = matches!(msg, Message::Sync { .. });
                    if !self.admits(id, &peer) {
                        self.refuse(id, &peer, push, now);
                        continue;
                    }
                    self.take_from_peer(id, &peer, msg, now);
                }
                let has_content = self
                    .docs
                    .get(id)
                    .is_some_and(|e| !e.doc.get_heads().is_empty());
                if !has_content && !self.fetching.contains_key(id) {
                    if !loading.retry.is_empty() {
                        let only: BTreeSet<PeerId> = loading
                            .retry
                            .into_iter()
                            .filter(|p| self.admits(id, p))
                            .collect();
                        self.request(id, Some(only), now);
                    } else if loading.fetch {
                        self.request(id, None, now);
                    }
                }
            }
        }
        self.retry_refused_loads();
    }

    /// Time passed: fetches past their deadline end, held pushes past [`HELD_FOR`] are
    /// forgotten. Call it at [`Replica::poll_timeout`].
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expire_held(now);
        while let Some((at, peer, doc)) = self.relay_due.first().cloned() {
            if at > now {
                break;
            }
            self.relay_due.pop_first();
            if let Some(l) = self.links.get_mut(&peer)
                && l.relay.get(&doc) == Some(&at)
            {
                l.relay.remove(&doc);
                if l.sync.insert(doc.clone()) {
                    l.heads_only.insert(doc);
                }
            }
        }
        for l in self.links.values_mut() {
            let due: Vec<DocId> = l
                .held
                .iter()
                .filter(|d| l.unanswered.get(*d).is_none_or(|at| *at <= now))
                .cloned()
                .collect();
            for d in due {
                l.answered(&d);
            }
        }
        while let Some((at, id)) = self.deadlines.first().cloned() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            let Some(f) = self.fetching.remove(&id) else {
                continue;
            };
            if !f.arrived && !self.has_content(&id) {
                self.drop_empty(&id);
                self.events.push_back(Event::Unavailable(id));
            }
        }
    }

    // ----- outputs -----

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Replica::handle_timeout`] should next be called, if anything waits on time.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let fetch = self.deadlines.first().map(|(at, _)| *at);
        let held = self.held_order.first().map(|(at, _, _)| *at + HELD_FOR);
        let answer = self
            .links
            .values()
            .flat_map(|l| l.held.iter().filter_map(|d| l.unanswered.get(d)))
            .min()
            .copied();
        let relay = self.relay_due.first().map(|(at, _, _)| *at);
        [fetch, held, answer, relay].into_iter().flatten().min()
    }

    // ----- messages -----

    /// Keeps a message for a document being loaded, if there is room.
    fn queue(&mut self, doc: &DocId, peer: &PeerId, msg: Message, now: Instant) {
        let n = bytes(&msg);
        let full = self.queued_bytes + n > MAX_QUEUED_BYTES
            || self
                .loading
                .get(doc)
                .is_none_or(|l| l.queued.len() >= MAX_QUEUED_PER_LOAD);
        if full {
            let push = matches!(msg, Message::Sync { .. });
            self.loads_refused = true;
            self.turn_away(doc, peer, push, now);
            return;
        }
        if let Some(l) = self.loading.get_mut(doc) {
            l.queued.push((peer.clone(), msg));
            self.queued_bytes += n;
        }
    }

    /// An admitted message for a loaded document.
    fn dispatch(&mut self, id: &DocId, peer: &PeerId, msg: Message, now: Instant) {
        if let Some(l) = self.links.get_mut(peer) {
            l.answered(id);
        }
        match msg {
            Message::Sync { data, .. } => self.receive(id, peer, &data, now),
            Message::Request { .. } => {
                if let Some(e) = self.docs.get_mut(id) {
                    e.peers.insert(peer.clone(), sync::State::new());
                }
                self.forget_parts(id, Some(peer));
                self.sync_one(id, peer);
            }
            // Turned into a request before it is dispatched.
            Message::Unavailable { .. } | Message::Present { .. } => {}
        }
    }

    /// An admitted message for a document storage does not have: a push makes it (an empty
    /// document to receive into), a request is answered "unavailable" unless that happened.
    fn take_from_peer(&mut self, id: &DocId, peer: &PeerId, msg: Message, now: Instant) {
        if let Message::Sync { .. } = msg
            && !self.docs.contains_key(id)
        {
            self.take_in(id, Automerge::new());
        }
        if self.docs.contains_key(id) {
            self.dispatch(id, peer, msg, now);
        } else if let Message::Request { doc } = msg {
            self.send_control(peer, Message::Unavailable { doc });
        }
    }

    fn receive(&mut self, id: &DocId, peer: &PeerId, data: &[u8], now: Instant) {
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
        if let Some(why) = unusable_bloom(&msg) {
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!("sync message for {id} with {why}"),
            });
            return;
        }
        // Before Automerge inflates anything: what the changes come to, counted up to the bound.
        if let Err(why) = chunks::inflated_size(msg.changes.iter(), self.limits.inflated_bytes) {
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!("sync message for {id} with {why}"),
            });
            return;
        }
        let Some(e) = self.docs.get_mut(id) else {
            return;
        };
        // Before Automerge applies them: changes it would panic on (see `validate`), this
        // message's and those it makes ready among the ones kept aside.
        let aside: Vec<&automerge::Change> = e.aside.iter().map(|(_, c)| c).collect();
        let mut checked = crate::validate::check_changes(&e.doc, msg.changes.iter(), &aside);
        if let Err(crate::validate::Refused {
            aside: Some(i),
            why,
        }) = &checked
        {
            // Its sender, not this message's, is to blame; the message goes on.
            if let Some((from, _)) = e.aside.get(*i) {
                self.events.push_back(Event::Rejected {
                    peer: from.clone(),
                    reason: format!("a change for {id} kept aside, once ready: {why}"),
                });
            }
            empty_queue(e);
            checked = crate::validate::check_changes(&e.doc, msg.changes.iter(), &[]);
        }
        let (waiting, parsed) = match checked {
            Ok(c) => (c.waiting, c.parsed),
            Err(refused) => {
                e.peers.remove(peer);
                self.forget_parts(id, Some(peer));
                self.events.push_back(Event::Rejected {
                    peer: peer.clone(),
                    reason: format!("sync message for {id} with {}", refused.why),
                });
                return;
            }
        };
        let before = e.doc.get_heads();
        let state = e.peers.entry(peer.clone()).or_default();
        let received = match parsed {
            Some(changes) => crate::receive::receive_parsed(&mut e.doc, state, msg, changes),
            None => e.doc.receive_sync_message(state, msg),
        };
        if keep_aside(e, peer, waiting) {
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!(
                    "more than {MAX_ASIDE_BYTES} bytes of changes for {id} wait for their dependencies: dropped"
                ),
            });
        }
        if let Err(err) = received {
            // A hostile or broken peer; reset our state with it and carry on.
            e.peers.remove(peer);
            self.forget_parts(id, Some(peer));
            self.events.push_back(Event::Rejected {
                peer: peer.clone(),
                reason: format!("bad sync message for {id}: {err}"),
            });
            return;
        }
        if e.doc.get_heads() != before {
            self.events.push_back(Event::Changed(id.clone()));
            if before.is_empty() {
                self.events.push_back(Event::Arrived(id.clone()));
                if let Some(f) = self.fetching.get_mut(id) {
                    f.arrived = true;
                }
            }
            // The sender at once (its answer); the others a little later (see RELAY_AFTER).
            self.sync_one(id, peer);
            self.relay(id, peer, now);
        } else {
            self.sync_one(id, peer);
        }
    }

    // ----- documents -----

    /// Adds a document (or merges it into the loaded one), with this replica's actor.
    fn take_in(&mut self, id: &DocId, mut doc: Automerge) {
        if let Some(e) = self.docs.get_mut(id) {
            if e.doc.merge(&mut doc).is_ok_and(|c| !c.is_empty()) {
                self.sync_all(id);
            }
            return;
        }
        if let Some(a) = &self.actor {
            doc.set_actor(a.clone());
        }
        let saved = sorted(doc.get_heads());
        self.docs.insert(
            id.clone(),
            Entry {
                doc,
                peers: BTreeMap::new(),
                saved,
                aside: Vec::new(),
            },
        );
        if self.scopes.get(id).is_some_and(|s| s.announce) {
            self.announce(id);
        }
        self.resume_held(id);
    }

    fn has_content(&self, id: &DocId) -> bool {
        self.docs
            .get(id)
            .is_some_and(|e| !e.doc.get_heads().is_empty())
    }

    /// Drops a loaded document that has no changes (a shell nobody filled).
    fn drop_empty(&mut self, id: &DocId) {
        if self
            .docs
            .get(id)
            .is_some_and(|e| e.doc.get_heads().is_empty())
        {
            self.drop_entry(id);
        }
    }

    fn drop_entry(&mut self, id: &DocId) {
        self.docs.remove(id);
        for l in self.links.values_mut() {
            l.sync.remove(id);
            l.held.remove(id);
            l.unanswered.remove(id);
            l.relay.remove(id);
            l.heads_only.remove(id);
            l.parts.remove(id);
            l.oversized.remove(id);
        }
    }

    /// Syncs a loaded document once with every connected member of its group, whether it is
    /// announced or not: a copy loaded from disk may be behind (its node was down while the
    /// document changed), and a document that is no longer announced would otherwise stay so.
    pub fn refresh_from_members(&mut self, id: &DocId) {
        if self.docs.contains_key(id) {
            self.announce(id);
        }
    }

    /// As [`Replica::refresh_from_members`], starting the sync with each member over: a copy
    /// whose sync state says the peer has nothing new (the peer dropped the document from
    /// memory since) still asks for what it lacks.
    pub fn resync_with_members(&mut self, id: &DocId) {
        if let Some(e) = self.docs.get_mut(id) {
            e.peers.clear();
            self.forget_parts(id, None);
            self.announce(id);
        }
    }
}

fn sorted(mut heads: Vec<ChangeHash>) -> Vec<ChangeHash> {
    heads.sort();
    heads
}

/// The most probes per hash a peer's Bloom filter may ask for. Automerge writes 7; it computes
/// (and allocates) every probe for each of its changes it looks up, so a filter asking for up to
/// `u32::MAX` would cost billions of steps per change.
pub const MAX_BLOOM_PROBES: u64 = 64;

/// Why a decoded sync message's Bloom filters cannot be handed to Automerge 0.12, if they
/// cannot: a filter with entries but no bits (Automerge divides by its size in bits, zero, when
/// it looks a hash up: a panic), or one asking for more than [`MAX_BLOOM_PROBES`] probes.
fn unusable_bloom(msg: &sync::Message) -> Option<String> {
    for have in &msg.have {
        // The filter as it travels: entries, bits per entry and probes (LEB128), then the bits;
        // nothing at all for a filter without entries.
        let bytes = have.bloom.to_bytes();
        let mut rest = bytes.as_slice();
        let (Some(entries), Some(_), Some(probes)) =
            (leb128(&mut rest), leb128(&mut rest), leb128(&mut rest))
        else {
            continue;
        };
        if entries == 0 {
            continue;
        }
        if rest.is_empty() {
            return Some(format!("a Bloom filter of {entries} entries and no bits"));
        }
        if probes > MAX_BLOOM_PROBES {
            return Some(format!(
                "a Bloom filter of {probes} probes, above the {MAX_BLOOM_PROBES} accepted"
            ));
        }
    }
    None
}

/// Reads an unsigned LEB128 number off the front of `bytes` (`None` past its end, or past 64
/// bits).
pub(crate) fn leb128(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(b & 0x7f).checked_shl(shift)?;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The bytes a message takes while queued.
fn bytes(msg: &Message) -> usize {
    match msg {
        Message::Sync { data, .. } => data.len() + msg.doc().as_str().len(),
        _ => msg.doc().as_str().len(),
    }
}

/// Empties Automerge's queue of changes waiting for dependencies: the document is rebuilt
/// from its applied changes (Automerge has no other way), keeping its actor. Costs the
/// document's history; done only when a change kept aside fails its check, or too many wait.
fn empty_queue(e: &mut Entry) {
    let actor = e.doc.get_actor().clone();
    // A document built from applied changes has its heads: this does not fail.
    if let Ok(mut doc) = e.doc.fork_at(&e.doc.get_heads()) {
        doc.set_actor(actor);
        e.doc = doc;
    }
    e.aside.clear();
}

/// After a message: the changes kept aside that Automerge applied leave the copy, the
/// message's own waiting ones (from `peer`) join it; beyond [`MAX_ASIDE_BYTES`] the queue is
/// emptied (true).
fn keep_aside(e: &mut Entry, peer: &PeerId, waiting: Vec<automerge::Change>) -> bool {
    let doc = &e.doc;
    e.aside
        .retain(|(_, c)| doc.get_change_meta_by_hash(&c.hash()).is_none());
    e.aside.extend(
        waiting
            .into_iter()
            .filter(|c| doc.get_change_meta_by_hash(&c.hash()).is_none())
            .map(|c| (peer.clone(), c)),
    );
    let bytes: usize = e.aside.iter().map(|(_, c)| c.raw_bytes().len()).sum();
    if bytes > MAX_ASIDE_BYTES {
        empty_queue(e);
        return true;
    }
    false
}
