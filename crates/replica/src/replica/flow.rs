//! Sending and flow control per peer: the sync messages owed to each connected peer (its
//! `Link`), generated only when polled and not while the peer is blocked, held back while the
//! peer has not answered the last one ([`SYNC_ANSWER_WAIT`]), and one peer's changes passed on
//! to the others ([`RELAY_AFTER`]).

use std::collections::{BTreeSet, VecDeque};
use std::time::Instant;

use automerge::sync::{self, SyncDoc};
use automerge::{Automerge, ChangeHash};

#[cfg(doc)]
use super::Limits;
use super::{MAX_QUEUED_PER_PEER, RELAY_AFTER, RELAY_AFTER_HIGHER, Replica, SYNC_ANSWER_WAIT};
use crate::{DocId, Message, PeerId, chunks};

impl Replica {
    // ----- inputs -----

    /// The transport to `peer` has no send credit: [`Replica::poll_transmit`] generates nothing
    /// for it until [`Replica::handle_unblocked`]. What it owes the peer is kept (a set of
    /// documents, and at most [`MAX_QUEUED_PER_PEER`] requests and answers).
    pub fn handle_blocked(&mut self, peer: &PeerId) {
        if let Some(l) = self.links.get_mut(peer) {
            l.blocked = true;
        }
    }

    /// The transport to `peer` can send again: what waited is generated when polled, the
    /// changes made meanwhile in one message per document.
    pub fn handle_unblocked(&mut self, peer: &PeerId) {
        if let Some(l) = self.links.get_mut(peer) {
            l.blocked = false;
        }
    }

    // ----- outputs -----

    /// The next message to send, and to whom. Messages to one peer come in order; peers are
    /// served in turn; nothing is generated for a blocked peer. Sync messages are generated
    /// here, from the sync state, so the changes made between two polls travel together.
    ///
    /// A document whose last message to a peer carried changes and is not answered yet is held
    /// back for that peer until the answer comes or [`SYNC_ANSWER_WAIT`] has passed since `now`
    /// of that message (then [`Replica::poll_timeout`] says when).
    pub fn poll_transmit(&mut self, now: Instant) -> Option<(PeerId, Message)> {
        let mut turn: Vec<PeerId> = self
            .links
            .iter()
            .filter(|(_, l)| !l.blocked && (!l.ready.is_empty() || !l.sync.is_empty()))
            .map(|(p, _)| p.clone())
            .collect();
        if let Some(c) = &self.cursor {
            // Start after the peer served last.
            let split = turn.partition_point(|p| p <= c);
            turn.rotate_left(split);
        }
        for peer in turn {
            let link = self.links.get_mut(&peer)?;
            if let Some(msg) = link.ready.pop_front() {
                self.cursor = Some(peer.clone());
                return Some((peer, msg));
            }
            while let Some(doc) = self.links.get_mut(&peer).and_then(|l| l.sync.pop_first()) {
                if let Some(l) = self.links.get_mut(&peer)
                    && l.unanswered.get(&doc).is_some_and(|at| *at > now)
                {
                    l.held.insert(doc);
                    continue;
                }
                let heads_only = match self.links.get_mut(&peer) {
                    Some(l) => {
                        l.relay.remove(&doc);
                        l.heads_only.remove(&doc)
                    }
                    None => false,
                };
                let next = match self.next_part(&doc, &peer) {
                    Some(part) => Some((part, true)),
                    None => self.generate(&doc, &peer, heads_only),
                };
                if let Some((msg, changes)) = next {
                    if let Some(l) = self.links.get_mut(&peer) {
                        match changes {
                            true => l.unanswered.insert(doc.clone(), now + SYNC_ANSWER_WAIT),
                            false => l.unanswered.remove(&doc),
                        };
                        // The next part goes once this one is answered (or its wait is over).
                        if l.parts.contains_key(&doc) {
                            l.sync.insert(doc);
                        }
                    }
                    self.cursor = Some(peer.clone());
                    return Some((peer, msg));
                }
            }
        }
        None
    }

    // ----- sending -----

    /// Announces a document to its group's connected members.
    pub(super) fn announce(&mut self, id: &DocId) {
        let Some(s) = self.scopes.get(id) else {
            return;
        };
        let members: Vec<PeerId> = self
            .groups
            .get(&s.group)
            .map(|m| m.intersection(&self.peers).cloned().collect())
            .unwrap_or_default();
        for p in members {
            self.sync_one(id, &p);
        }
    }

    /// Schedules a message for every peer this document is being synced with (and, if
    /// announced, every connected member of its group).
    pub(super) fn sync_all(&mut self, id: &DocId) {
        for p in self.sync_targets(id) {
            self.sync_one(id, &p);
        }
    }

    /// The peers this document is being synced with (and, if announced, the connected
    /// members of its group).
    fn sync_targets(&self, id: &DocId) -> BTreeSet<PeerId> {
        let Some(e) = self.docs.get(id) else {
            return BTreeSet::new();
        };
        let mut targets: BTreeSet<PeerId> = e.peers.keys().cloned().collect();
        if let Some(s) = self.scopes.get(id)
            && s.announce
            && let Some(m) = self.groups.get(&s.group)
        {
            targets.extend(m.intersection(&self.peers).cloned());
        }
        targets
    }

    /// Schedules the changes `from` sent for every other peer [`Replica::sync_all`] would
    /// send them to, after [`RELAY_AFTER`] (or [`RELAY_AFTER_HIGHER`]); a message already
    /// owed goes as it would.
    pub(super) fn relay(&mut self, id: &DocId, from: &PeerId, now: Instant) {
        let mut targets = self.sync_targets(id);
        targets.remove(from);
        for p in targets {
            let (lower, higher) = self
                .relay_waits
                .unwrap_or((RELAY_AFTER, RELAY_AFTER_HIGHER));
            let wait = match &self.me {
                Some(me) if *me > p => higher,
                _ => lower,
            };
            let Some(l) = self.links.get_mut(&p) else {
                continue;
            };
            if l.sync.contains(id) || l.held.contains(id) || l.relay.contains_key(id) {
                continue;
            }
            let at = now + wait;
            l.relay.insert(id.clone(), at);
            self.relay_due.insert((at, p, id.clone()));
        }
    }

    /// Schedules a message for one peer.
    pub(super) fn sync_one(&mut self, id: &DocId, peer: &PeerId) {
        if let Some(l) = self.links.get_mut(peer) {
            l.heads_only.remove(id);
            l.sync.insert(id.clone());
        }
    }

    /// Queues a request or an answer for a connected peer; false if it was dropped.
    pub(super) fn send_control(&mut self, peer: &PeerId, msg: Message) -> bool {
        match self.links.get_mut(peer) {
            Some(l) if l.ready.len() < MAX_QUEUED_PER_PEER => {
                l.ready.push_back(msg);
                true
            }
            _ => false,
        }
    }

    /// Drops the parts of a split message still to send for `doc`, to `peer` or (`None`) to
    /// every peer: the sync state they came from has started over.
    pub(super) fn forget_parts(&mut self, doc: &DocId, peer: Option<&PeerId>) {
        match peer {
            Some(p) => {
                if let Some(l) = self.links.get_mut(p) {
                    l.parts.remove(doc);
                }
            }
            None => {
                for l in self.links.values_mut() {
                    l.parts.remove(doc);
                }
            }
        }
    }

    /// The next part of a split sync message for `peer`, if one waits.
    fn next_part(&mut self, id: &DocId, peer: &PeerId) -> Option<Message> {
        if !self.admits(id, peer) {
            self.forget_parts(id, Some(peer));
            return None;
        }
        let l = self.links.get_mut(peer)?;
        let parts = l.parts.get_mut(id)?;
        let part = parts.pop_front();
        if parts.is_empty() {
            l.parts.remove(id);
        }
        Some(Message::Sync {
            doc: id.clone(),
            data: part?,
        })
    }

    /// The next sync message for `peer`, and whether it carries changes. `heads_only`: a
    /// message that says what we have without sending changes (as if the peer had not said
    /// what it has yet); a peer that lacks them asks.
    ///
    /// A message above [`Limits::message_bytes`] (or a saved document that would inflate
    /// beyond [`Limits::inflated_bytes`]) is split: its changes go in parts under the limit,
    /// each with the message's heads, needs and summary, in the order Automerge put them
    /// (the order they were applied in, so each part's changes find their dependencies in the
    /// parts before). The first part is returned; the rest wait in the link, sent one per
    /// answer. A saved document, which cannot be cut, is replaced by all of its changes.
    fn generate(&mut self, id: &DocId, peer: &PeerId, heads_only: bool) -> Option<(Message, bool)> {
        if !self.admits(id, peer) {
            return None;
        }
        let limits = self.limits;
        let e = self.docs.get_mut(id)?;
        let state = e.peers.entry(peer.clone()).or_default();
        // A peer that holds part of the document gets the changes it lacks, never the whole
        // document: Automerge sends a whole save to a peer that supports it once a third of
        // the changes are missing, which for a document of a few changes is every change,
        // and the peer then decodes the whole document to find the one it lacked.
        let whole = hide_whole_document(state);
        let msg = if heads_only {
            let have = state.their_have.take();
            let msg = e.doc.generate_sync_message(state);
            state.their_have = have;
            msg
        } else {
            e.doc.generate_sync_message(state)
        };
        if let Some(caps) = whole {
            state.their_capabilities = Some(caps);
        }
        let msg = msg?;
        let changes = !msg.changes.is_empty();
        // The peer refused a change too large for any message and asks for it again (its
        // `need`); Automerge, having sent it, answers without it, and the two would go on
        // without end: no answer to that alone.
        let their_need = state.their_need.clone().unwrap_or_default();
        if !changes
            && !their_need.is_empty()
            && self.links.get(peer).is_some_and(|l| {
                l.oversized
                    .get(id)
                    .is_some_and(|o| their_need.iter().all(|h| o.contains(h)))
            })
        {
            return None;
        }
        // A saved document is the one thing this replica sends deflated: it must inflate
        // within what its receiver accepts.
        let whole = changes && holds_document(&msg);
        let inflates =
            whole && chunks::inflated_size(msg.changes.iter(), limits.inflated_bytes).is_err();
        let data = msg.encode();
        if data.len() <= limits.message_bytes && !inflates {
            let msg = Message::Sync {
                doc: id.clone(),
                data,
            };
            return Some((msg, changes));
        }
        let (mut parts, big) = split(&e.doc, &data, whole, limits.message_bytes)
            .unwrap_or_else(|| (VecDeque::from([data]), Vec::new()));
        // A change too large for any message goes alone, once per connection, and is refused:
        // sent again it would be refused again, without end. Once sent, neither it nor the
        // parts after it (they depend on it) go again.
        if !big.is_empty()
            && let Some(l) = self.links.get_mut(peer)
        {
            let sent = l.oversized.entry(id.clone()).or_default();
            if big.iter().all(|(_, h)| sent.contains(h)) {
                if let Some((first, _)) = big.first() {
                    parts.truncate(*first);
                }
            } else {
                sent.extend(big.iter().map(|(_, h)| *h));
            }
        }
        let first = parts.pop_front()?;
        if !parts.is_empty()
            && let Some(l) = self.links.get_mut(peer)
        {
            l.parts.insert(id.clone(), parts);
        }
        let msg = Message::Sync {
            doc: id.clone(),
            data: first,
        };
        Some((msg, changes))
    }
}

/// The most bytes a LEB128 length prefix takes (of a 64-bit number): room kept for each
/// change's prefix, and the list's, when parts are packed.
const LEB128_MAX: usize = 10;

/// Whether a sync message's changes are a saved document.
fn holds_document(msg: &sync::Message) -> bool {
    msg.changes.iter().any(|entry| {
        chunks::chunks(entry)
            .next()
            .is_some_and(|c| c.is_ok_and(|c| c.kind == chunks::Kind::Document))
    })
}

/// Splits an encoded sync message of `doc` into messages of at most `limit` bytes, each with its
/// heads, needs, summary and flags and a run of its changes, in order (see
/// [`Replica::generate`]); a change larger than `limit` on its own goes alone. `whole`: the
/// message holds a saved document, replaced by all of `doc`'s changes. `None` if the message
/// does not decode into chunks (never for one this replica generated).
/// Also the changes larger than `limit` on their own: the index of the part each travels in,
/// and its hash.
#[allow(clippy::type_complexity)]
fn split(
    doc: &Automerge,
    data: &[u8],
    whole: bool,
    limit: usize,
) -> Option<(VecDeque<Vec<u8>>, Vec<(usize, ChangeHash)>)> {
    let msg = sync::Message::decode(data).ok()?;
    let changes: Vec<Vec<u8>> = if whole {
        doc.get_changes(&[])
            .iter()
            .map(|c| c.raw_bytes().to_vec())
            .collect()
    } else {
        let mut out = Vec::new();
        for entry in msg.changes.iter() {
            for c in chunks::chunks(entry) {
                out.push(c.ok()?.bytes.to_vec());
            }
        }
        out
    };
    let header = sync::Message {
        changes: sync::ChunkList::empty(),
        ..msg
    };
    let overhead = header.clone().encode().len() + LEB128_MAX;
    let build = |batch: Vec<Vec<u8>>| {
        let changes = match header.version {
            // One chunk of changes back to back, as Automerge writes a version 2 message.
            sync::MessageVersion::V2 => sync::ChunkList::from(batch.concat()),
            sync::MessageVersion::V1 => sync::ChunkList::from(batch),
        };
        sync::Message {
            changes,
            ..header.clone()
        }
        .encode()
    };
    let mut parts = VecDeque::new();
    let mut big = Vec::new();
    let mut batch = Vec::new();
    let mut size = overhead;
    for c in changes {
        let cost = c.len() + LEB128_MAX;
        if !batch.is_empty() && size + cost > limit {
            parts.push_back(build(std::mem::take(&mut batch)));
            size = overhead;
        }
        if overhead + cost > limit
            && let Ok(change) = automerge::Change::try_from(c.as_slice())
        {
            big.push((parts.len(), change.hash()));
        }
        size += cost;
        batch.push(c);
    }
    if !batch.is_empty() {
        parts.push_back(build(batch));
    }
    Some((parts, big))
}

/// Takes the whole-document capability out of `state` while the peer holds part of the
/// document, and returns the capabilities to restore.
fn hide_whole_document(state: &mut sync::State) -> Option<Vec<sync::Capability>> {
    let has_some = state.their_heads.as_ref().is_some_and(|h| !h.is_empty());
    let caps = state.their_capabilities.as_mut()?;
    if !has_some || !caps.contains(&sync::Capability::MessageV2) {
        return None;
    }
    let all = caps.clone();
    caps.retain(|c| *c != sync::Capability::MessageV2);
    Some(all)
}
