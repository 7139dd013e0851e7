//! A small in-memory network of replicas, for tests (feature `test-support`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::{DocId, Event, Message, PeerId, Replica, Scope};

/// A small in-memory network of replicas for tests: delivers every message, in order per pair,
/// and answers loads from each peer's in-memory store (empty unless a test saves into it).
#[derive(Debug)]
pub struct TestNet {
    /// The replicas by peer.
    pub replicas: BTreeMap<PeerId, Replica>,
    /// Events seen, per peer.
    pub events: BTreeMap<PeerId, Vec<Event>>,
    /// Each peer's storage: the saved changes of each document. Loads are answered from it.
    pub stores: BTreeMap<PeerId, BTreeMap<DocId, Vec<Vec<u8>>>>,
    /// The time given to the replicas.
    pub now: Instant,
    /// The sync messages delivered so far, and the largest one's payload in bytes.
    pub synced: (usize, usize),
}

impl TestNet {
    /// An empty network whose clock starts at `now`.
    pub fn new(now: Instant) -> Self {
        TestNet {
            replicas: BTreeMap::new(),
            events: BTreeMap::new(),
            stores: BTreeMap::new(),
            now,
            synced: (0, 0),
        }
    }

    /// Adds a replica for `peer`.
    pub fn add(&mut self, peer: &PeerId) {
        self.replicas.insert(peer.clone(), Replica::new());
    }

    /// A peer's replica. Panics if there is none (a test's mistake).
    pub fn replica(&mut self, peer: &PeerId) -> &mut Replica {
        self.replicas
            .get_mut(peer)
            .expect("a replica for this peer")
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

    /// Disconnects two peers (messages not yet delivered between them are lost).
    pub fn disconnect(&mut self, a: &PeerId, b: &PeerId) {
        if let Some(r) = self.replicas.get_mut(a) {
            r.handle_disconnected(b);
        }
        if let Some(r) = self.replicas.get_mut(b) {
            r.handle_disconnected(a);
        }
    }

    /// Sets `group`'s members on every replica.
    pub fn group(&mut self, group: &DocId, members: &[&PeerId]) {
        let members: BTreeSet<PeerId> = members.iter().map(|p| (*p).clone()).collect();
        for r in self.replicas.values_mut() {
            r.set_group(group, members.clone());
        }
    }

    /// Sets a document's scope on every replica.
    pub fn scope(&mut self, doc: &DocId, scope: &Scope) {
        for r in self.replicas.values_mut() {
            r.set_scope(doc, scope.clone());
        }
    }

    /// Writes a peer's unsaved changes of `doc` to its store, and marks them saved.
    pub fn save(&mut self, peer: &PeerId, doc: &DocId) {
        let Some(r) = self.replicas.get_mut(peer) else {
            return;
        };
        let Some(unsaved) = r.unsaved(doc) else {
            return;
        };
        let stored = self
            .stores
            .entry(peer.clone())
            .or_default()
            .entry(doc.clone())
            .or_default();
        stored.extend(unsaved.changes.into_iter().map(|(_, bytes)| bytes));
        r.mark_saved(doc, &unsaved.heads);
    }

    /// Moves the clock on and lets the replicas' timers fire.
    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        for r in self.replicas.values_mut() {
            r.handle_timeout(self.now);
        }
    }

    /// The events seen by `peer` since the last call.
    pub fn take_events(&mut self, peer: &PeerId) -> Vec<Event> {
        self.events.remove(peer).unwrap_or_default()
    }

    /// Delivers messages and answers loads (from the stores) until nothing moves.
    ///
    /// A message held back for a peer's answer ([`crate::SYNC_ANSWER_WAIT`]) that does not come
    /// goes when its wait is over, and changes to pass on go after theirs
    /// ([`crate::RELAY_AFTER`]): the clock moves on to them (never further) when nothing else
    /// moves.
    pub fn run(&mut self) {
        self.run_at_most(usize::MAX);
    }

    /// As [`TestNet::run`], delivering at most `messages` messages: true if nothing moved any
    /// more before that (two peers whose heads stay apart answer each other without end).
    pub fn run_at_most(&mut self, messages: usize) -> bool {
        let mut delivered = 0usize;
        loop {
            let now = self.now;
            let mut moved = false;
            let peers: Vec<PeerId> = self.replicas.keys().cloned().collect();
            for p in &peers {
                while let Some(r) = self.replicas.get_mut(p) {
                    if let Some(ev) = r.poll_event() {
                        moved = true;
                        if let Event::Load(id) = &ev {
                            let stored = self.stores.get(p).and_then(|s| s.get(id)).map(|chunks| {
                                crate::load_chunks(chunks).expect("stored changes load")
                            });
                            r.handle_loaded(id, stored, now);
                        }
                        self.events.entry(p.clone()).or_default().push(ev);
                        continue;
                    }
                    if delivered >= messages {
                        return false;
                    }
                    let Some((to, msg)) = r.poll_transmit(now) else {
                        break;
                    };
                    delivered += 1;
                    moved = true;
                    // Round-trip through the wire format, as the network would.
                    let msg = Message::decode(&msg.encode()).expect("own messages decode");
                    if let Message::Sync { data, .. } = &msg {
                        self.synced = (self.synced.0 + 1, self.synced.1.max(data.len()));
                    }
                    if let Some(dst) = self.replicas.get_mut(&to) {
                        dst.handle_message(p, msg, now);
                    }
                }
            }
            if !moved {
                let soon = self.now + crate::SYNC_ANSWER_WAIT.max(crate::RELAY_AFTER_HIGHER);
                let Some(at) = self
                    .replicas
                    .values()
                    .filter_map(Replica::poll_timeout)
                    .filter(|at| *at <= soon)
                    .min()
                else {
                    return true;
                };
                self.now = self.now.max(at);
                for r in self.replicas.values_mut() {
                    r.handle_timeout(self.now);
                }
            }
        }
    }
}
