//! Fetches: a document the driver asks for ([`Replica::fetch`]), loaded from storage or else
//! requested from peers until it arrives, every peer asked says it has none, or
//! [`FETCH_TIMEOUT`] passes.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Event, FETCH_TIMEOUT, Fetch, Replica};
use crate::{DocId, Message, PeerId};

impl Replica {
    // ----- commands -----

    /// Asks for a document. Loaded with content → [`Event::Arrived`] at once. Otherwise load it
    /// from storage ([`Event::Load`]) and, failing that, request it from the connected peers (a
    /// scoped document only from its group's connected members, an unscoped one from all) and
    /// from peers connecting meanwhile. Ends in `Arrived`, or [`Event::Unavailable`] when every
    /// peer asked said so, or none is connected, or [`FETCH_TIMEOUT`] passes without changes.
    /// The peers asked may send it although it has no scope: set one when it arrives.
    pub fn fetch(&mut self, id: &DocId, now: Instant) {
        if let Some(e) = self.docs.get(id) {
            if e.doc.get_heads().is_empty() {
                // Announced by a peer but no change received yet: ask for it and wait.
                if !self.fetching.contains_key(id) {
                    self.request(id, None, now);
                }
            } else {
                self.events.push_back(Event::Arrived(id.clone()));
            }
            return;
        }
        if self.fetching.contains_key(id) {
            // Storage did not have it; peers were asked.
            return;
        }
        if !self.loading.contains_key(id) {
            self.events.push_back(Event::Load(id.clone()));
        }
        self.loading.entry(id.clone()).or_default().fetch = true;
    }

    /// Asks `peers` (those connected) for a document this replica may not be sent yet, with a
    /// proof that it may ([`Message::Present`], an invite): the fetch then waits for it like
    /// [`Replica::fetch`]'s, from those peers. Loaded with content → [`Event::Arrived`] at
    /// once; none of them connected → [`Event::Unavailable`].
    pub fn present(&mut self, id: &DocId, peers: &[PeerId], proof: Vec<u8>, now: Instant) {
        if self.has_content(id) {
            self.events.push_back(Event::Arrived(id.clone()));
            return;
        }
        let mut asked = BTreeSet::new();
        for p in peers {
            let msg = Message::Present {
                doc: id.clone(),
                proof: proof.clone(),
            };
            if self.peers.contains(p) && self.send_control(p, msg) {
                asked.insert(p.clone());
            }
        }
        if asked.is_empty() {
            self.events.push_back(Event::Unavailable(id.clone()));
            return;
        }
        self.begin_fetch(id, asked, now);
    }

    /// Asks every connected peer a fetch of `id` may ask again, for a fetch still waiting for
    /// the document's changes: a request or its answer lost on a stream that was reset, or a
    /// peer that did not have the document when first asked and may have it now. Does nothing
    /// for a document that has content or is not being fetched (see [`Replica::fetch`]).
    pub fn ask_again(&mut self, id: &DocId) {
        if self.has_content(id) || self.fetching.get(id).is_none_or(|f| f.arrived) {
            return;
        }
        let targets: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|p| self.may_ask(id, p))
            .cloned()
            .collect();
        for p in targets {
            if self.send_control(&p, Message::Request { doc: id.clone() })
                && let Some(f) = self.fetching.get_mut(id)
            {
                f.asked.insert(p);
            }
        }
    }

    /// Asks peers for `id`: `only` these (those connected), or else the connected peers a
    /// fetch may ask.
    pub(super) fn request(&mut self, id: &DocId, only: Option<BTreeSet<PeerId>>, now: Instant) {
        let targets: Vec<PeerId> = match only {
            Some(only) if only.iter().any(|p| self.peers.contains(p)) => only
                .into_iter()
                .filter(|p| self.peers.contains(p))
                .collect(),
            _ => self
                .peers
                .iter()
                .filter(|p| self.may_ask(id, p))
                .cloned()
                .collect(),
        };
        let mut asked = BTreeSet::new();
        for p in targets {
            if self.send_control(&p, Message::Request { doc: id.clone() }) {
                asked.insert(p);
            }
        }
        if asked.is_empty() {
            self.drop_empty(id);
            self.events.push_back(Event::Unavailable(id.clone()));
            return;
        }
        self.begin_fetch(id, asked, now);
    }

    /// Waits for `id` from the peers `asked`, until [`FETCH_TIMEOUT`] from `now`.
    fn begin_fetch(&mut self, id: &DocId, asked: BTreeSet<PeerId>, now: Instant) {
        let deadline = now + FETCH_TIMEOUT;
        self.end_fetch(id);
        self.deadlines.insert((deadline, id.clone()));
        self.fetching.insert(
            id.clone(),
            Fetch {
                asked,
                deadline,
                arrived: false,
            },
        );
    }

    pub(super) fn unavailable_from(&mut self, id: &DocId, peer: &PeerId) {
        let Some(f) = self.fetching.get_mut(id) else {
            return;
        };
        f.asked.remove(peer);
        if !f.asked.is_empty() {
            return;
        }
        let arrived = f.arrived;
        self.end_fetch(id);
        if !arrived && !self.has_content(id) {
            self.drop_empty(id);
            self.events.push_back(Event::Unavailable(id.clone()));
        }
    }

    pub(super) fn end_fetch(&mut self, id: &DocId) -> Option<Fetch> {
        let f = self.fetching.remove(id)?;
        self.deadlines.remove(&(f.deadline, id.clone()));
        Some(f)
    }
}
