//! `Members`: the peers this node has a sync stream with, the listen addresses it writes into
//! its queues' member lists, and when it dials the members it has no stream with. A
//! sub-machine: its fields are its own. The turn tells it of streams opened and closed and of
//! the node's addresses; it asks it whether a peer is connected, which peers are, what to
//! advertise, and whether members are due to be dialed. It asks nothing of the others.

use std::collections::BTreeSet;
use std::time::Instant;

use piecework_queue_doc::PeerId;

/// The peers this node is connected to, and what it tells them of itself.
#[derive(Debug)]
pub(in crate::node) struct Members {
    /// Peers with an open sync stream (bounded by the transport's connections).
    connected: BTreeSet<PeerId>,
    /// This node's listen addresses, as written into its queues' member lists.
    advertised: Vec<String>,
    /// When the members this node has no stream with are dialed next.
    next_dial: Instant,
    /// The last member dialed: the next round starts after it, so that every member is
    /// dialed in turn however many there are ([`crate::MAX_DIALS_PER_ROUND`] per round).
    dialed_up_to: Option<PeerId>,
}

impl Members {
    pub(in crate::node) fn new(now: Instant) -> Self {
        Members {
            connected: BTreeSet::new(),
            advertised: vec![],
            next_dial: now,
            dialed_up_to: None,
        }
    }

    /// A sync stream with `peer` opened.
    pub(in crate::node) fn connected(&mut self, peer: PeerId) {
        self.connected.insert(peer);
    }

    /// The stream with `peer` closed.
    pub(in crate::node) fn disconnected(&mut self, peer: &PeerId) {
        self.connected.remove(peer);
    }

    /// Whether a sync stream with `peer` is open.
    pub(in crate::node) fn is_connected(&self, peer: &PeerId) -> bool {
        self.connected.contains(peer)
    }

    /// The peers with an open sync stream, in order.
    pub(in crate::node) fn connected_peers(&self) -> impl Iterator<Item = &PeerId> {
        self.connected.iter()
    }

    /// How many peers this node has a stream with.
    pub(in crate::node) fn connected_count(&self) -> usize {
        self.connected.len()
    }

    /// This node's listen addresses, as its queues' member lists should say.
    pub(in crate::node) fn advertised(&self) -> &[String] {
        &self.advertised
    }

    /// The node's listen addresses are `addrs`; whether they changed.
    pub(in crate::node) fn advertise(&mut self, addrs: Vec<String>) -> bool {
        if addrs == self.advertised {
            return false;
        }
        self.advertised = addrs;
        true
    }

    /// When the members are dialed next.
    pub(in crate::node) fn next_dial(&self) -> Instant {
        self.next_dial
    }

    /// Dial the members at the next turn (a queue was joined, or a member list changed).
    pub(in crate::node) fn dial_now(&mut self, now: Instant) {
        self.next_dial = now;
    }

    /// Whether members are due to be dialed at `now`; if so, the next time is `every` later.
    pub(in crate::node) fn dial_due(&mut self, now: Instant, every: std::time::Duration) -> bool {
        if now < self.next_dial {
            return false;
        }
        self.next_dial = now + every;
        true
    }

    /// Of the members to dial (in order), those of this round: at most `max`, starting after
    /// the last one dialed and wrapping around. Remembers where the round ended.
    pub(in crate::node) fn dial_round<T>(
        &mut self,
        wanted: Vec<(PeerId, T)>,
        max: usize,
    ) -> Vec<(PeerId, T)> {
        if wanted.len() <= max {
            // Everyone this round, in order.
            return wanted;
        }
        let start = self
            .dialed_up_to
            .as_ref()
            .map_or(0, |last| wanted.partition_point(|(p, _)| p <= last));
        let n = wanted.len();
        let mut round: Vec<(PeerId, T)> = Vec::with_capacity(max.min(n));
        let mut wanted: Vec<Option<(PeerId, T)>> = wanted.into_iter().map(Some).collect();
        for i in 0..n.min(max) {
            if let Some(w) = wanted[(start + i) % n].take() {
                round.push(w);
            }
        }
        if let Some((last, _)) = round.last() {
            self.dialed_up_to = Some(last.clone());
        }
        round
    }
}
