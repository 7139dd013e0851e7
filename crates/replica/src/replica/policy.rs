//! The accept policy: groups and scopes (which peers a document is synced with), whether a
//! peer may send a document or be sent it, the answers to messages that are not accepted, and
//! the pushes held until their document is scoped ([`MAX_HELD`], [`HELD_FOR`]).

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Event, HELD_FOR, Loading, MAX_HELD, MAX_PENDING_LOADS, Replica, Scope};
use crate::{DocId, Message, PeerId};

impl Replica {
    // ----- commands -----

    /// Sets a group's members (replacing them). Connected peers that became members are sent the
    /// group's announced documents; peers that stopped being members are no longer synced with
    /// its documents (unless a document is requestable and they asked for it).
    pub fn set_group(&mut self, group: &DocId, members: BTreeSet<PeerId>) {
        let old = self
            .groups
            .insert(group.clone(), members.clone())
            .unwrap_or_default();
        let added: Vec<PeerId> = members
            .difference(&old)
            .filter(|p| self.peers.contains(*p))
            .cloned()
            .collect();
        let removed = old.difference(&members).next().is_some();
        if added.is_empty() && !removed {
            return;
        }
        for (doc, announce) in self.loaded_in(group) {
            if removed {
                self.prune(&doc);
            }
            if announce {
                for p in &added {
                    self.sync_one(&doc, p);
                }
            }
        }
    }

    /// Forgets a group, and the scopes of its documents (see [`Replica::clear_scope`]): leaving a
    /// queue. Its loaded documents stay loaded until evicted.
    pub fn remove_group(&mut self, group: &DocId) {
        self.groups.remove(group);
        let docs: Vec<DocId> = self
            .scopes
            .iter()
            .filter(|(_, s)| s.group == *group)
            .map(|(d, _)| d.clone())
            .collect();
        for d in docs {
            self.clear_scope(&d);
        }
    }

    /// Puts a document in a group (replacing its scope): from now on it is accepted from, stored
    /// for and synced with that group's members. Works whether or not it is loaded. If it is not
    /// loaded and a peer pushed it before it had a scope (see [`MAX_HELD`]), it is asked for
    /// again: [`Event::Load`] first, then, if storage does not have it, a request to those peers
    /// (or, if none of them is connected and a member, the group's connected members).
    pub fn set_scope(&mut self, doc: &DocId, scope: Scope) {
        let prev = self.scopes.insert(doc.clone(), scope.clone());
        if self.docs.contains_key(doc) {
            self.prune(doc);
            let newly = prev
                .as_ref()
                .is_none_or(|p| !p.announce || p.group != scope.group);
            if scope.announce && newly {
                self.announce(doc);
            }
            self.resume_held(doc);
            return;
        }
        if self.fetching.contains_key(doc) {
            // Already asking peers.
            return;
        }
        let pushers = self.take_held(doc);
        if !pushers.is_empty() {
            self.load_for_retry(doc, pushers);
        }
    }

    /// Takes a document out of every group: it is no longer synced with anyone, nor accepted
    /// from peers (except while this replica fetches it). Stays loaded until evicted.
    pub fn clear_scope(&mut self, doc: &DocId) {
        if self.scopes.remove(doc).is_some() {
            self.prune(doc);
        }
        self.take_held(doc);
    }

    // ----- policy -----

    pub(super) fn is_member(&self, group: &DocId, peer: &PeerId) -> bool {
        self.groups.get(group).is_some_and(|m| m.contains(peer))
    }

    /// Whether `peer` is a member of the group `doc` is scoped to.
    pub(super) fn in_group(&self, doc: &DocId, peer: &PeerId) -> bool {
        self.scopes
            .get(doc)
            .is_some_and(|s| self.is_member(&s.group, peer))
    }

    /// Whether `peer` may send `doc` to this replica, and be sent it.
    pub(super) fn admits(&self, doc: &DocId, peer: &PeerId) -> bool {
        if self
            .fetching
            .get(doc)
            .is_some_and(|f| f.asked.contains(peer))
        {
            return true;
        }
        self.scopes
            .get(doc)
            .is_some_and(|s| s.requestable || self.is_member(&s.group, peer))
    }

    /// Whether a fetch of `doc` may ask `peer`: a scoped document only its group's members.
    pub(super) fn may_ask(&self, doc: &DocId, peer: &PeerId) -> bool {
        self.scopes
            .get(doc)
            .is_none_or(|s| self.is_member(&s.group, peer))
    }

    /// Loaded documents of a group, and whether each is announced.
    fn loaded_in(&self, group: &DocId) -> Vec<(DocId, bool)> {
        self.scopes
            .iter()
            .filter(|(d, s)| s.group == *group && self.docs.contains_key(*d))
            .map(|(d, s)| (d.clone(), s.announce))
            .collect()
    }

    /// Stops syncing `doc` with the peers no longer admitted.
    fn prune(&mut self, doc: &DocId) {
        let Some(e) = self.docs.get(doc) else {
            return;
        };
        let gone: Vec<PeerId> = e
            .peers
            .keys()
            .filter(|p| !self.admits(doc, p))
            .cloned()
            .collect();
        if let Some(e) = self.docs.get_mut(doc) {
            for p in &gone {
                e.peers.remove(p);
            }
        }
        for p in &gone {
            self.forget_parts(doc, Some(p));
        }
    }

    /// Answers a message this replica does not accept.
    pub(super) fn refuse(&mut self, doc: &DocId, peer: &PeerId, push: bool, now: Instant) {
        self.send_control(peer, Message::Unavailable { doc: doc.clone() });
        self.events.push_back(Event::Refused {
            peer: peer.clone(),
            doc: doc.clone(),
        });
        if push && !self.scopes.contains_key(doc) {
            self.hold(doc, peer, now);
        }
    }

    /// Answers a message this replica cannot take now (a bound is reached).
    pub(super) fn turn_away(&mut self, doc: &DocId, peer: &PeerId, push: bool, now: Instant) {
        self.send_control(peer, Message::Unavailable { doc: doc.clone() });
        if push {
            self.hold(doc, peer, now);
        }
    }

    // ----- held pushes -----

    fn hold(&mut self, doc: &DocId, peer: &PeerId, now: Instant) {
        self.expire_held(now);
        let key = (doc.clone(), peer.clone());
        if let Some(at) = self.held.insert(key, now) {
            self.held_order.remove(&(at, doc.clone(), peer.clone()));
        }
        self.held_order.insert((now, doc.clone(), peer.clone()));
        while self.held.len() > MAX_HELD {
            let Some((_, d, p)) = self.held_order.pop_first() else {
                break;
            };
            self.held.remove(&(d, p));
        }
    }

    pub(super) fn expire_held(&mut self, now: Instant) {
        while let Some((at, d, p)) = self.held_order.first().cloned() {
            if at + HELD_FOR > now {
                break;
            }
            self.held_order.pop_first();
            self.held.remove(&(d, p));
        }
    }

    /// Forgets the held pushes of `doc`, returning who pushed it.
    fn take_held(&mut self, doc: &DocId) -> BTreeSet<PeerId> {
        let from = (doc.clone(), PeerId::new(""));
        let keys: Vec<(DocId, PeerId)> = self
            .held
            .range(from..)
            .take_while(|((d, _), _)| d == doc)
            .map(|(k, _)| k.clone())
            .collect();
        let mut peers = BTreeSet::new();
        for (d, p) in keys {
            if let Some(at) = self.held.remove(&(d.clone(), p.clone())) {
                self.held_order.remove(&(at, d, p.clone()));
            }
            peers.insert(p);
        }
        peers
    }

    /// A loaded document: sync with the admitted peers that pushed it before.
    pub(super) fn resume_held(&mut self, doc: &DocId) {
        if !self.scopes.contains_key(doc) {
            return;
        }
        for p in self.take_held(doc) {
            if self.peers.contains(&p) && self.admits(doc, &p) {
                self.sync_one(doc, &p);
            }
        }
    }

    /// Loads `doc` to ask `pushers` for it (see [`Replica::set_scope`]).
    fn load_for_retry(&mut self, doc: &DocId, pushers: BTreeSet<PeerId>) {
        match self.loading.get_mut(doc) {
            Some(l) => l.retry.extend(pushers),
            None => {
                self.loading.insert(
                    doc.clone(),
                    Loading {
                        retry: pushers,
                        ..Loading::default()
                    },
                );
                self.events.push_back(Event::Load(doc.clone()));
            }
        }
    }

    /// Loads ended: retry pushes turned away by [`MAX_PENDING_LOADS`] that are now acceptable.
    pub(super) fn retry_refused_loads(&mut self) {
        if !self.loads_refused {
            return;
        }
        while self.loading.len() < MAX_PENDING_LOADS {
            let next = self.held_order.iter().find_map(|(_, d, p)| {
                let ready = self.admits(d, p)
                    && !self.docs.contains_key(d)
                    && !self.loading.contains_key(d)
                    && !self.fetching.contains_key(d);
                ready.then(|| d.clone())
            });
            let Some(doc) = next else {
                self.loads_refused = false;
                return;
            };
            let pushers = self.take_held(&doc);
            self.load_for_retry(&doc, pushers);
        }
    }
}
