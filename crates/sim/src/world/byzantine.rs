//! The Byzantine member of the `byzantine` mix: the cluster's last node runs a real core (it
//! syncs, routes, runs tasks and is checked as any other), and the world also makes it act
//! hostile on a seeded schedule. Its acts, and what counts as one sent and one refused:
//!
//! | act | what the member does | sent | refused |
//! |---|---|---|---|
//! | `router_beat` | gossips a router heartbeat under its own claim at `MAX_TERM`, at a random term in `[2^32, MAX_TERM)`, or above `MAX_TERM` | per delivery to an honest node | that node's fence and effective router are not the beat's claim once it handled the beat |
//! | `claim` | writes a chained claim record straight into its replica of the queue document (raw Automerge): at `MAX_TERM` naming the router, above it, or five terms past the router's naming nobody | per record written | an honest node whose current document holds the record reads a view that does not count it (neither the router nor in its chain) |
//! | `oversized` | writes a 64 KiB junk value as a task entry or as a claim record | per record written | an honest node whose current document holds it reads no task of that key and counts a malformed record |
//! | `pool_flood` | its own pool heartbeat, with worker 0 listed [`FLOOD_REPEATS`] more times and [`FLOOD_OUT_OF_RANGE`] idle workers at indexes from `MAX_POOL_WORKERS` | per delivery to an honest node | that node's router reported the extra reports not counted (`PoolBeatTrimmed`) |
//! | `forged_successor` | builds a successor of its current document and seals the document into it (raw writes): under a claim of its own that does not count, or under the router's claim with a live task left out of the successor | per seal written | the first honest node that holds both documents refuses it (`EpochEvent::Refused`) |
//!
//! An honest node that counts a hostile value (its fence or router becomes a hostile claim,
//! a written claim counts, an oversized key reads as a task, a router assigns a hostile worker
//! index at or above the bound, a node moves to a forged successor that its own check would
//! refuse) is a violation of invariant 10.
//!
//! It asks the parent for the clock, the RNG, `trace` and `violate`, the network for `gossip`.
//! The shell asks it for `flood_pool_beat` (at a publish), the network for `hostile_delivery`
//! and `judge_hostile_delivery` (around a heartbeat's delivery), the event handler for
//! `pool_beat_trimmed` and the view checks for `judge_hostile_writes`.

use std::collections::BTreeMap;
use std::sync::Arc;

use automerge::transaction::Transactable;
use automerge::{ActorId, Automerge, AutomergeError, ObjType, ROOT, ReadDoc};
use piecework_core::{Wire, topic_for};
use piecework_queue_doc::beat::{MAX_POOL_WORKERS, WorkerReport};
use piecework_queue_doc::epoch::{self, Seal};
use piecework_queue_doc::{
    Claim, MAX_TERM, PeerId, QueueId, QueueView, RouterBeat, TaskId, ViewCache,
};
use piecework_replica::DocId;
use rand::Rng;

use super::World;

/// The least term of a hostile heartbeat below the bound: far above any term an honest run
/// reaches, so the hostile beats are told from the member's own router's.
const HOSTILE_TERM_MIN: u64 = 1 << 32;
/// How far past the effective router's term a skipping claim is written.
const SKIP: u64 = 5;
/// The size of an oversized value: far above any record an honest writer makes, small enough
/// that a seed's few of them keep every sync message below the replica's limit.
const OVERSIZED_BYTES: usize = 64 * 1024;
/// How often one of the member's pool heartbeats is flooded, in the faulty phase.
const FLOOD_CHANCE: f64 = 0.5;
/// Extra reports of worker 0 in a flooded pool heartbeat ("hundreds of times").
const FLOOD_REPEATS: u32 = 300;
/// Idle workers a flooded pool heartbeat lists at indexes from `MAX_POOL_WORKERS` up.
const FLOOD_OUT_OF_RANGE: u32 = 44;

/// The hostile acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Act {
    RouterBeat,
    Claim,
    Oversized,
    PoolFlood,
    ForgedSuccessor,
}

impl Act {
    fn key(self) -> &'static str {
        match self {
            Act::RouterBeat => "router_beat",
            Act::Claim => "claim",
            Act::Oversized => "oversized",
            Act::PoolFlood => "pool_flood",
            Act::ForgedSuccessor => "forged_successor",
        }
    }
}

/// A hostile heartbeat on its way to an honest node.
pub(super) enum Hostile {
    Beat(QueueId, Claim),
    Flood,
}

/// A record the member wrote, waiting for an honest node to hold it.
struct Written {
    act: Act,
    doc: DocId,
    map: &'static str,
    key: String,
    /// The claim it would be, for a claim record that reads.
    claim: Option<Claim>,
}

/// The member's acts and what became of them.
#[derive(Default)]
pub(super) struct Byzantine {
    pub(super) sent: BTreeMap<String, u64>,
    pub(super) refused: BTreeMap<String, u64>,
    written: Vec<Written>,
    counter: u64,
    records: u64,
    /// The forged successors written, and whether an honest node refused each yet.
    forged: BTreeMap<DocId, bool>,
}

impl World {
    fn byz_sent(&mut self, act: Act) {
        *self.byz.sent.entry(act.key().into()).or_default() += 1;
    }

    fn byz_refused(&mut self, act: Act) {
        *self.byz.refused.entry(act.key().into()).or_default() += 1;
    }

    fn is_hostile(&self, i: usize) -> bool {
        self.hostile == Some(i)
    }

    /// One hostile act, at a time the background schedule drew.
    pub(super) fn hostile_act(&mut self) {
        let Some(h) = self.hostile else {
            return;
        };
        match self.rng.random_range(0..4) {
            0 => self.hostile_router_beat(h),
            1 => self.hostile_claim(h),
            2 => self.hostile_oversized(h),
            _ => self.hostile_forged_successor(h),
        }
    }

    fn hostile_router_beat(&mut self, h: usize) {
        let Some(queue) = self.queues[0].clone() else {
            return;
        };
        if !self.nodes[h].up {
            return;
        }
        let term = match self.rng.random_range(0..3) {
            0 => MAX_TERM,
            1 => self.rng.random_range(HOSTILE_TERM_MIN..MAX_TERM),
            _ => self.rng.random_range(MAX_TERM + 1..=u64::MAX),
        };
        self.byz.counter += 1;
        let beat = RouterBeat {
            queue: queue.clone(),
            claim: Claim::new(term, self.nodes[h].peer.clone()),
            counter: self.byz.counter,
            epoch: None,
            handover: None,
        };
        self.trace(|| format!("node{h} (hostile) beats as {}", beat.claim));
        self.gossip(h, topic_for(&queue), Wire::Router(beat).encode());
    }

    /// The member's current document of queue 0 and its effective router there.
    fn hostile_doc(&self, h: usize) -> Option<(DocId, Option<Claim>)> {
        let queue = self.queues[0].as_ref()?;
        let core = &self.nodes[h].core;
        let (_, doc) = core.epoch(queue)?;
        let router = core.view(queue).and_then(|v| v.router.clone());
        Some((doc.clone(), router))
    }

    fn hostile_claim(&mut self, h: usize) {
        let Some((doc, router)) = self.hostile_doc(h) else {
            return;
        };
        let me = self.nodes[h].peer.clone();
        let named = router.as_ref().map(|c| c.peer.to_string());
        let (term, prev) = match self.rng.random_range(0..3) {
            0 => (MAX_TERM, named),
            1 => (MAX_TERM + self.rng.random_range(1..1_000), named),
            _ => (router.map_or(0, |c| c.term) + SKIP, None),
        };
        let mut rec = serde_json::json!({"t": term, "c": me.to_string(), "a": 0});
        if let Some(p) = prev {
            rec["p"] = p.into();
        }
        let key = format!("{term}/{me}");
        let claim = Claim::new(term, me);
        self.hostile_write(
            h,
            Act::Claim,
            doc,
            "claims",
            key,
            rec.to_string(),
            Some(claim),
        );
    }

    fn hostile_oversized(&mut self, h: usize) {
        let Some((doc, router)) = self.hostile_doc(h) else {
            return;
        };
        self.byz.records += 1;
        let me = self.nodes[h].peer.clone();
        let junk = "x".repeat(OVERSIZED_BYTES);
        if self.rng.random_bool(0.5) {
            let key = format!("hostile-{}-{}", me, self.byz.records);
            self.hostile_write(h, Act::Oversized, doc, "tasks", key, junk, None);
        } else {
            let term = router.map_or(0, |c| c.term) + 1;
            let key = format!("{term}/{me}");
            self.hostile_write(h, Act::Oversized, doc, "claims", key, junk, None);
        }
    }

    /// Builds a successor of the member's current document, as a rotation would, and seals
    /// the document into it: under the router's claim with one live task left out (when
    /// there is one, half the time), else under a claim of the member's own one term above
    /// the router's, which no chain names.
    fn hostile_forged_successor(&mut self, h: usize) {
        let Some(queue) = self.queues[0].clone() else {
            return;
        };
        if !self.nodes[h].up {
            return;
        }
        let core = &self.nodes[h].core;
        let Some((epoch_no, cur)) = core.epoch(&queue).map(|(e, d)| (e, d.clone())) else {
            return;
        };
        let (Some(view), Some(old)) = (core.view(&queue).cloned(), core.document(&cur).cloned())
        else {
            return;
        };
        let me = self.nodes[h].peer.clone();
        let live = view
            .tasks()
            .values()
            .find(|t| !t.state().is_final())
            .map(|t| t.id.clone());
        let (claim, left_out) = match (view.router.clone(), live) {
            (Some(r), Some(t)) if self.rng.random_bool(0.5) => (r, Some(t)),
            (r, _) => (Claim::new(r.map_or(1, |c| c.term + 1), me), None),
        };
        let Some(next) = epoch_no.checked_add(1) else {
            return;
        };
        let succ_id = DocId::generate(&mut self.rng);
        let actor: [u8; 16] = self.rng.random();
        let mut succ = Automerge::new().with_actor(ActorId::from(actor.to_vec()));
        let t = self.time(h);
        let rotation = epoch::Rotation {
            origin: &queue,
            prev: cur.as_str(),
            successor: succ_id.as_str(),
            epoch: next,
            claim: &claim,
            now_ms: t.unix_ms,
        };
        if epoch::build_successor(&old, &view, &mut succ, &rotation).is_err() {
            return;
        }
        if let Some(task) = &left_out {
            let dropped = succ.transact::<_, _, AutomergeError>(|tx| {
                if let Some((automerge::Value::Object(ObjType::Map), tasks)) =
                    tx.get(ROOT, "tasks")?
                {
                    tx.delete(&tasks, task.as_str())?;
                }
                Ok(())
            });
            if dropped.is_err() {
                return;
            }
        }
        if !self.nodes[h]
            .core
            .hostile_create(t, &queue, succ_id.clone(), succ)
        {
            return;
        }
        let seal = Seal {
            claim: claim.clone(),
            successor: succ_id.to_string(),
            epoch: next,
        };
        let heads = old.get_heads();
        let wrote = self.nodes[h]
            .core
            .hostile_change(t, &cur, |d| epoch::seal(d, &seal, &heads).is_ok());
        self.drive(h);
        if wrote != Some(true) {
            return;
        }
        self.trace(|| {
            format!(
                "node{h} (hostile) sealed {cur} into the forged {succ_id} as {claim}{}",
                left_out.map_or(String::new(), |t| format!(" without {t}"))
            )
        });
        self.byz_sent(Act::ForgedSuccessor);
        self.byz.forged.insert(succ_id, false);
    }

    /// An honest node refused a successor: the first refusal of a forged one counts.
    pub(super) fn successor_refused(&mut self, i: usize, doc: &DocId) {
        if self.is_hostile(i) {
            return;
        }
        if let Some(refused) = self.byz.forged.get_mut(doc)
            && !*refused
        {
            *refused = true;
            self.byz_refused(Act::ForgedSuccessor);
        }
    }

    /// An honest node moved to another epoch: a forged successor it moved to must pass the
    /// check it is followed by (a live task it leaves out ended meanwhile, say), or the move
    /// is a violation of invariant 10.
    pub(super) fn judge_move(&mut self, i: usize, queue: &QueueId) {
        if self.is_hostile(i) {
            return;
        }
        let core = &self.nodes[i].core;
        let Some((_, to)) = core.epoch(queue) else {
            return;
        };
        if !self.byz.forged.contains_key(to) {
            return;
        }
        let to = to.clone();
        let verdict = core.document(&to).and_then(|succ| {
            let prev = epoch::read_prev(succ).and_then(|p| DocId::parse(&p.doc))?;
            let prev = core.document(&prev)?;
            Some(epoch::check_successor(
                prev,
                &mut ViewCache::new(),
                succ,
                to.as_str(),
            ))
        });
        if let Some(Err(why)) = verdict {
            self.violate(
                10,
                format!("node{i} moved to the forged successor {to}: {why}"),
            );
        }
    }

    /// Writes `value` at `map/key` of the member's replica of `doc` as a raw change.
    #[allow(clippy::too_many_arguments)]
    fn hostile_write(
        &mut self,
        h: usize,
        act: Act,
        doc: DocId,
        map: &'static str,
        key: String,
        value: String,
        claim: Option<Claim>,
    ) {
        let t = self.time(h);
        let k = key.clone();
        let wrote = self.nodes[h].core.hostile_change(t, &doc, |d| {
            d.transact::<_, _, AutomergeError>(|tx| {
                let obj = match tx.get(ROOT, map)? {
                    Some((automerge::Value::Object(ObjType::Map), id)) => id,
                    _ => tx.put_object(ROOT, map, ObjType::Map)?,
                };
                tx.put(&obj, k.as_str(), value)?;
                Ok(())
            })
            .is_ok()
        });
        self.drive(h);
        if wrote != Some(true) {
            return;
        }
        self.trace(|| format!("node{h} (hostile) wrote {map}/{key} ({})", act.key()));
        self.byz_sent(act);
        self.byz.written.push(Written {
            act,
            doc,
            map,
            key,
            claim,
        });
    }

    /// A flooded copy of the member's own pool heartbeat (sometimes), else `data` as it was.
    pub(super) fn flood_pool_beat(&mut self, i: usize, data: Vec<u8>) -> Vec<u8> {
        if !self.is_hostile(i) || !self.faults_on || !self.rng.random_bool(FLOOD_CHANCE) {
            return data;
        }
        let Some(Wire::Pool(mut beat)) = Wire::decode(&data) else {
            return data;
        };
        let idle = |index| WorkerReport {
            index,
            running: None,
        };
        beat.workers.extend((0..FLOOD_REPEATS).map(|_| idle(0)));
        beat.workers
            .extend((MAX_POOL_WORKERS..MAX_POOL_WORKERS + FLOOD_OUT_OF_RANGE).map(idle));
        Wire::Pool(beat).encode()
    }

    /// What a heartbeat from `from` to `to` is, if it is a hostile one to an honest node.
    pub(super) fn hostile_delivery(&self, from: usize, to: usize, data: &[u8]) -> Option<Hostile> {
        if !self.is_hostile(from) || self.is_hostile(to) {
            return None;
        }
        match Wire::decode(data)? {
            Wire::Router(b) if b.claim.term >= HOSTILE_TERM_MIN => {
                Some(Hostile::Beat(b.queue, b.claim))
            }
            Wire::Pool(b) if b.normalized().workers.len() != b.workers.len() => {
                Some(Hostile::Flood)
            }
            _ => None,
        }
    }

    /// After node `to` handled a hostile heartbeat: sent, and refused unless it counted.
    pub(super) fn judge_hostile_delivery(&mut self, to: usize, hostile: Hostile) {
        match hostile {
            Hostile::Flood => self.byz_sent(Act::PoolFlood),
            Hostile::Beat(queue, claim) => {
                self.byz_sent(Act::RouterBeat);
                let core = &self.nodes[to].core;
                let fenced = core.fence(&queue) == Some(&claim);
                let follows = core.view(&queue).and_then(|v| v.router.as_ref()) == Some(&claim);
                if fenced || follows {
                    self.violate(
                        10,
                        format!("node{to} took the hostile heartbeat's claim {claim} (fence: {fenced}, router: {follows})"),
                    );
                } else {
                    self.byz_refused(Act::RouterBeat);
                }
            }
        }
    }

    /// An honest node's router did not count some of a pool heartbeat's reports.
    pub(super) fn pool_beat_trimmed(&mut self, i: usize, peer: &PeerId) {
        if !self.is_hostile(i) && self.hostile.is_some_and(|h| self.nodes[h].peer == *peer) {
            self.byz_refused(Act::PoolFlood);
        }
    }

    /// On an honest node's view: the member's records that node's current document holds are
    /// refused if the view does not count them (a violation if it does); and no attempt of the
    /// view names a hostile worker index at or above the bound.
    pub(super) fn judge_hostile_writes(
        &mut self,
        i: usize,
        queue: &QueueId,
        view: &Arc<QueueView>,
    ) {
        let Some(h) = self.hostile else {
            return;
        };
        if i == h {
            return;
        }
        let hostile_peer = self.nodes[h].peer.clone();
        let bad_worker = view.tasks().values().find_map(|t| {
            t.attempts
                .iter()
                .find(|a| a.worker.peer == hostile_peer && a.worker.index >= MAX_POOL_WORKERS)
                .map(|a| (t.id.clone(), a.worker.index))
        });
        if let Some((task, index)) = bad_worker {
            self.violate(
                10,
                format!("node{i}'s view assigns {task} to the hostile pool's worker {index}"),
            );
        }
        let core = &self.nodes[i].core;
        let Some((_, current)) = core.epoch(queue) else {
            return;
        };
        let Some(doc) = core.document(current) else {
            return;
        };
        let held = |w: &Written| {
            w.doc == *current
                && match doc.get(ROOT, w.map) {
                    Ok(Some((_, obj))) => matches!(doc.get(&obj, w.key.as_str()), Ok(Some(_))),
                    _ => false,
                }
        };
        let (judged, waiting): (Vec<Written>, Vec<Written>) = std::mem::take(&mut self.byz.written)
            .into_iter()
            .partition(held);
        self.byz.written = waiting;
        for w in judged {
            let counted = match (&w.claim, w.map) {
                (Some(c), _) => view.router.as_ref() == Some(c) || view.claims.contains(c),
                (None, "tasks") => view.task(&TaskId::new(w.key.clone())).is_some(),
                (None, _) => false,
            };
            if counted {
                self.violate(
                    10,
                    format!("node{i} counted the hostile record {}/{}", w.map, w.key),
                );
            } else if view.malformed > 0 {
                self.byz_refused(w.act);
            }
        }
    }
}
