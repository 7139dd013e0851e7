//! The network model: the sync streams between the cores, heartbeat delivery, and the cuts.
//!
//! It owns [`Network`]: which pairs of nodes are linked (a stream needs both directions open and
//! both nodes up), each link's epoch (a frame sent on an earlier stream is lost with it), the
//! cuts (both ways, one way, and silent ones that keep the stream up and lose what crosses it),
//! the heartbeat delays a scheduled fault adds, the order of frames and beats per direction, and
//! the record of every loss and cut (`disturbances`, which invariant 7 reads). Its `impl World`
//! block delivers sync frames and heartbeats, draws their delays, drops, duplicates and reorders
//! heartbeats and resets streams as the mix says, and marks the runs a cut separates from their
//! router.
//!
//! It asks the parent for the event queue, the clock, `count` and `trace`, and the shell for
//! `drive` once a core has heard something. The faults ask it for `cut`, `silent_cut`, `relink`
//! and `end_silent_cuts`, and clear `cuts` and `beat_delay` on a heal; the shell asks it for
//! `send_sync` and `gossip`.

use std::collections::{BTreeMap, BTreeSet};

use piecework_core::RunId;
use rand::Rng;

use super::{Ev, World};

/// A cut: the directed pairs `(from, to)` whose messages it loses, until when.
pub(super) struct Cut {
    blocked: BTreeSet<(usize, usize)>,
    until_us: u64,
}

/// The network: links, cuts and what they lost.
#[derive(Default)]
pub(super) struct Network {
    pub(super) cuts: Vec<Cut>,
    /// Silent one-way cuts: the stream stays up but what the node sends is lost, as on a
    /// half-open connection, until the transport's stall detection resets it when they end.
    silent: Vec<Cut>,
    pub(super) beat_delay: BTreeMap<usize, (u64, u64)>,
    /// Connected pairs (a < b) and their connection epochs.
    links: BTreeSet<(usize, usize)>,
    epochs: BTreeMap<(usize, usize), u64>,
    last_sync_at: BTreeMap<(usize, usize), u64>,
    last_beat_at: BTreeMap<(usize, usize), u64>,
    /// Message losses and cuts: (from µs, until µs, a, b).
    pub(super) disturbances: Vec<(u64, u64, usize, usize)>,
}

fn pair(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

impl Network {
    fn blocked(&self, from: usize, to: usize) -> bool {
        self.cuts.iter().any(|c| c.blocked.contains(&(from, to)))
    }

    fn silenced(&self, from: usize, to: usize) -> bool {
        self.silent.iter().any(|c| c.blocked.contains(&(from, to)))
    }
}

impl World {
    /// A sync frame arrives, unless its stream is gone, the frame is lost to a silent cut, or
    /// it kills its stream ([`crate::FaultMix::reset`]).
    pub(super) fn deliver_sync(&mut self, from: usize, to: usize, epoch: u64, frame: Vec<u8>) {
        let p = pair(from, to);
        if !self.nodes[to].up
            || !self.net.links.contains(&p)
            || self.net.epochs.get(&p) != Some(&epoch)
        {
            return;
        }
        if self.net.silenced(from, to) {
            self.count("frame_lost_silently");
            return;
        }
        if self.faults_on && self.rng.random_bool(self.config.mix.reset) {
            self.count("sync_reset");
            self.net
                .disturbances
                .push((self.now_us, self.now_us, from, to));
            self.trace(|| format!("sync stream {from}-{to} reset"));
            self.reset_link(p);
            return;
        }
        let t = self.time(to);
        let peer = self.nodes[from].peer.clone();
        self.nodes[to].core.handle_sync(t, &peer, &frame);
        self.drive(to);
    }

    /// A heartbeat arrives, unless a cut or a silent cut loses it or the node is not subscribed.
    pub(super) fn deliver_gossip(&mut self, from: usize, to: usize, topic: String, data: Vec<u8>) {
        if !self.nodes[to].up
            || self.net.blocked(from, to)
            || self.net.silenced(from, to)
            || !self.nodes[to].subscribed.contains(&topic)
        {
            return;
        }
        let hostile = self.hostile_delivery(from, to, &data);
        let t = self.time(to);
        let peer = self.nodes[from].peer.clone();
        self.nodes[to]
            .core
            .handle_gossip(t, &topic, &peer, &peer, &data);
        self.drive(to);
        if let Some(h) = hostile {
            self.judge_hostile_delivery(to, h);
        }
    }

    /// Cuts that end now are dropped, and the streams follow.
    pub(super) fn cuts_changed(&mut self) {
        let now = self.now_us;
        self.net.cuts.retain(|c| c.until_us > now);
        self.relink();
    }

    /// Silent cuts that end now: their streams are reset (the transport's stall detection).
    pub(super) fn silent_cuts_end(&mut self) {
        let now = self.now_us;
        let (ended, kept): (Vec<Cut>, Vec<Cut>) = std::mem::take(&mut self.net.silent)
            .into_iter()
            .partition(|c| c.until_us <= now);
        self.net.silent = kept;
        let pairs: BTreeSet<(usize, usize)> = ended
            .iter()
            .flat_map(|c| c.blocked.iter().map(|&(a, b)| pair(a, b)))
            .collect();
        for p in pairs {
            if self.net.links.contains(&p) {
                self.trace(|| format!("stalled stream {}-{} reset", p.0, p.1));
                self.reset_link(p);
            }
        }
    }

    /// Ends every silent cut now (their streams are reset right after).
    pub(super) fn end_silent_cuts(&mut self) {
        let now = self.now_us;
        for c in &mut self.net.silent {
            c.until_us = now;
        }
        self.schedule_at(now, Ev::SilentEnds);
    }

    fn delay(&mut self) -> u64 {
        let (lo, hi) = self.config.mix.delay_us;
        self.rng.random_range(lo..=hi.max(lo))
    }

    pub(super) fn send_sync(&mut self, from: usize, to: usize, frame: Vec<u8>) {
        let p = pair(from, to);
        if !self.net.links.contains(&p) {
            return;
        }
        let epoch = self.net.epochs.get(&p).copied().unwrap_or(0);
        // A stream: in order per direction.
        let at = (self.now_us + self.delay())
            .max(self.net.last_sync_at.get(&(from, to)).map_or(0, |t| t + 1));
        self.net.last_sync_at.insert((from, to), at);
        self.schedule_at(
            at,
            Ev::Sync {
                from,
                to,
                epoch,
                frame,
            },
        );
    }

    pub(super) fn gossip(&mut self, from: usize, topic: String, data: Vec<u8>) {
        let extra = match self.net.beat_delay.get(&from) {
            Some((extra_ms, until)) if self.now_us < *until => *extra_ms * 1000,
            _ => 0,
        };
        for to in 0..self.nodes.len() {
            if to == from
                || !self.nodes[to].up
                || self.net.blocked(from, to)
                || self.net.silenced(from, to)
            {
                continue;
            }
            if !self.nodes[to].subscribed.contains(&topic) {
                continue;
            }
            let mix = &self.config.mix;
            let (drop, dup) = if self.faults_on {
                (mix.drop, mix.duplicate)
            } else {
                (0.0, 0.0)
            };
            if self.rng.random_bool(drop) {
                self.count("beat_dropped");
                self.net
                    .disturbances
                    .push((self.now_us, self.now_us, from, to));
                continue;
            }
            let copies = if self.rng.random_bool(dup) { 2 } else { 1 };
            if copies == 2 {
                self.count("beat_duplicated");
            }
            for _ in 0..copies {
                let at = self.now_us + self.delay() + extra;
                if self
                    .net
                    .last_beat_at
                    .get(&(from, to))
                    .is_some_and(|last| at < *last)
                {
                    self.count("beat_reordered");
                }
                let last = self.net.last_beat_at.entry((from, to)).or_default();
                *last = (*last).max(at);
                self.schedule_at(
                    at,
                    Ev::Gossip {
                        from,
                        to,
                        topic: topic.clone(),
                        data: data.clone(),
                    },
                );
            }
        }
    }

    /// Makes the cores' sync streams match who is up and what is cut: a stream needs both
    /// directions open.
    pub(super) fn relink(&mut self) {
        let n = self.nodes.len();
        let mut touched = BTreeSet::new();
        for a in 0..n {
            for b in a + 1..n {
                let want = self.nodes[a].up
                    && self.nodes[b].up
                    && !self.net.blocked(a, b)
                    && !self.net.blocked(b, a);
                let have = self.net.links.contains(&(a, b));
                if want == have {
                    continue;
                }
                *self.net.epochs.entry((a, b)).or_default() += 1;
                let (pa, pb) = (self.nodes[a].peer.clone(), self.nodes[b].peer.clone());
                let (ta, tb) = (self.time(a), self.time(b));
                if want {
                    self.net.links.insert((a, b));
                    self.nodes[a].core.handle_connected(ta, pb);
                    self.nodes[b].core.handle_connected(tb, pa);
                } else {
                    self.net.links.remove(&(a, b));
                    if self.nodes[a].up {
                        self.nodes[a].core.handle_disconnected(ta, &pb);
                    }
                    if self.nodes[b].up {
                        self.nodes[b].core.handle_disconnected(tb, &pa);
                    }
                }
                touched.insert(a);
                touched.insert(b);
            }
        }
        for i in touched {
            self.drive(i);
        }
    }

    fn reset_link(&mut self, p: (usize, usize)) {
        // Down, then up again: both cores start their sync state over.
        self.count("resync");
        self.net.links.remove(&p);
        *self.net.epochs.entry(p).or_default() += 1;
        let (a, b) = p;
        let (pa, pb) = (self.nodes[a].peer.clone(), self.nodes[b].peer.clone());
        let (ta, tb) = (self.time(a), self.time(b));
        self.nodes[a].core.handle_disconnected(ta, &pb);
        self.nodes[b].core.handle_disconnected(tb, &pa);
        self.relink();
    }

    pub(super) fn cut(&mut self, blocked: BTreeSet<(usize, usize)>, for_ms: u64) {
        let until_us = self.taint(&blocked, for_ms);
        self.net.cuts.push(Cut { blocked, until_us });
        self.schedule_at(until_us, Ev::CutsChanged);
        self.relink();
    }

    /// Like [`World::cut`], but the streams stay up and lose what crosses them.
    pub(super) fn silent_cut(&mut self, blocked: BTreeSet<(usize, usize)>, for_ms: u64) {
        let until_us = self.taint(&blocked, for_ms);
        self.net.silent.push(Cut { blocked, until_us });
        self.schedule_at(until_us, Ev::SilentEnds);
    }

    /// Marks the runs a cut separates from their router, records the disturbance, and
    /// returns when the cut ends.
    fn taint(&mut self, blocked: &BTreeSet<(usize, usize)>, for_ms: u64) -> u64 {
        // Runs whose router is now out of reach may be routed again; they no longer count
        // against that router's concurrency limit.
        for n in 0..self.nodes.len() {
            let ids: Vec<RunId> = self.nodes[n].live.keys().copied().collect();
            for id in ids {
                let claim_node = self.index_of(&self.nodes[n].live[&id].claim.peer);
                if let Some(r) = claim_node
                    && (blocked.contains(&(n, r)) || blocked.contains(&(r, n)))
                    && let Some(l) = self.nodes[n].live.get_mut(&id)
                {
                    l.tainted = true;
                }
            }
        }
        let until_us = self.now_us + for_ms * 1000;
        for &(a, b) in blocked {
            self.net.disturbances.push((self.now_us, until_us, a, b));
        }
        until_us
    }
}
