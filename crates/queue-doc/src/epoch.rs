//! Epochs: a queue as a chain of bounded documents.
//!
//! A queue document that keeps every task forever grows with history. Instead, the queue's
//! effective router **rotates** it: it writes a fresh successor document that holds only what
//! is live (config, members, the router record, and every pending or running task with all its
//! attempt records, under the same keys), then **seals** the old one with a pointer to the
//! successor. Finished tasks are not carried; their task documents keep their summary.
//!
//! - Epoch 0 is the queue's first document, and its id stays the queue's id. Each successor
//!   records its epoch number, the queue it belongs to ([`QueueView::origin`]), and its
//!   predecessor with the predecessor's heads at sealing ([`QueueView::prev`]).
//! - [`build_successor`] writes a successor in one change, [`seal`] writes the pointer into
//!   the old document (under a key named by the successor, so two seals never share an
//!   object), and [`set_latest`] records the newest epoch in epoch 0 so that a node opening the
//!   queue by its id finds the current document at once.
//! - Two routers on either side of a partition may both seal one epoch. Every replica picks the
//!   same successor with [`winner`]: the greatest seal by (claim, successor id).
//! - Writes made to a sealed epoch after its seal (an offline submitter, a late outcome) are
//!   **carried** into the successor by [`carry`]: it reads only the changes after the heads
//!   carried so far, and puts, for every key they touched, the greatest value under the same
//!   key in the successor, where readers resolve it the same way. Carrying any number of
//!   times, by any replicas, concurrently, gives the state of carrying once. A task that was
//!   finished when the epoch was sealed ([`known_at`] the seal heads, but absent from the
//!   successor) is not carried back.
//!
//! [`QueueView::origin`]: crate::QueueView::origin
//! [`QueueView::prev`]: crate::QueueView::prev

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use automerge::legacy::{Key, ObjectId, OpId};
use automerge::transaction::{Transactable, Transaction};
use automerge::{ActorId, Automerge, AutomergeError, ChangeHash, ObjId, ObjType, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::chain::{PackedLatest, PackedSeal, decode_heads, encode_heads};
use crate::ids::{Claim, QueueId, TaskId};
use crate::judge::{Judge, Right};
use crate::keys;
use crate::keys::{
    CARRIED_FROM, COVERED, EPOCH, LATEST, LINEAGE, ORIGIN, PREV, PREV_HEADS, RETIRED, SEALS,
};
use crate::packed;
use crate::queue::{WriteError, write_config, write_member};
use crate::read::{
    finished_of, later_finish, packed_finished, packed_started, packed_values, started_of,
};
use crate::settings;
use crate::view::{QueueView, StateCounts};

pub use crate::chain::{
    Latest, Link, MAX_LINEAGE, Prev, Retired, Seal, read_latest, read_lineage, read_retired,
    read_seals, winner,
};
pub use crate::ends::{DecodeEndError, TaskEnd, restore_ends, write_ends};
pub use crate::successor::{SuccessorCheck, check_successor, counted_seals};

/// How many epochs a [`Cover`] is handed on for: a successor keeps the covers of documents at
/// most this many epochs older than itself.
pub const COVER_EPOCHS: u64 = 256;

/// Whether the document `doc` of epoch `epoch` (if known) is on the chain `lineage` (as
/// [`read_lineage`] gives it): named by it, or older than its oldest link once it was cut to
/// [`MAX_LINEAGE`] (only the newest links are kept, and a document that old is taken to be
/// an ancestor: no double seal outlives that many rotations).
pub fn on_lineage(lineage: &[Link], doc: &str, epoch: Option<u64>) -> bool {
    if lineage.iter().any(|l| l.doc == doc) {
        return true;
    }
    let oldest = lineage.iter().map(|l| l.epoch).min().unwrap_or(0);
    oldest > 1 && epoch.is_some_and(|e| e < oldest)
}

/// Orders two epoch documents of one queue by their lineages (each the links from the
/// queue's first epoch to the document itself, as [`read_lineage`] gives them). At the first
/// epoch where they differ, the greater seal (claim, then document id) wins, as in [`winner`];
/// a document that descends from the other is greater. Every replica computes the same order,
/// so all follow the same chain after a double seal, however far either side went on.
pub fn cmp_lineage(a: &[Link], b: &[Link]) -> std::cmp::Ordering {
    cmp_lineage_counted(a, b).0
}

/// [`cmp_lineage`], with the number of epochs it looked at: at most `a.len() + b.len()`,
/// whatever the epoch numbers say (a peer's lineage may hold any, up to `u64::MAX`). Lineages
/// are read from peers' documents, so the comparison visits the epochs the links name, never
/// the range between them.
pub fn cmp_lineage_counted(a: &[Link], b: &[Link]) -> (std::cmp::Ordering, usize) {
    use std::cmp::Ordering;
    // The first link of each epoch, as a lookup by epoch would find it.
    fn firsts(l: &[Link]) -> BTreeMap<u64, &Link> {
        let mut m = BTreeMap::new();
        for x in l {
            m.entry(x.epoch).or_insert(x);
        }
        m
    }
    let (fa, fb) = (firsts(a), firsts(b));
    let max_a = fa.keys().next_back().copied();
    let max_b = fb.keys().next_back().copied();
    let epochs: BTreeSet<u64> = fa.keys().chain(fb.keys()).copied().collect();
    let mut looked = 0;
    for e in epochs {
        looked += 1;
        match (fa.get(&e), fb.get(&e)) {
            (Some(x), Some(y)) if x != y => {
                return ((&x.claim, &x.doc).cmp(&(&y.claim, &y.doc)), looked);
            }
            (Some(_), None) if max_b.is_none_or(|m| m < e) => return (Ordering::Greater, looked),
            (None, Some(_)) if max_a.is_none_or(|m| m < e) => return (Ordering::Less, looked),
            _ => {}
        }
    }
    (Ordering::Equal, looked)
}

/// The writes of one queue document that the chain of a later document absorbed, as a clock:
/// for each actor, the greatest operation counter absorbed. Every change of that actor up to
/// that counter is absorbed too (an actor's changes are ordered, and a change is only ever
/// sealed or carried with its dependencies).
///
/// A successor records the cover of the document it continues (the seal's heads) and hands on
/// the covers its predecessor held; every carry records what it looked at. A member that comes
/// back with writes to a sealed document, after the documents between were deleted, can then
/// tell a task the chain knew (it ran, or runs, there) from one it never saw ([`entry_covered`])
/// without the history it lacks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cover {
    /// The covered document's epoch number.
    #[serde(rename = "e")]
    pub epoch: u64,
    /// Actor (hex) → the greatest operation counter absorbed.
    #[serde(rename = "c")]
    pub clock: BTreeMap<String, u64>,
}

impl Cover {
    /// Raises this cover to `other` wherever `other` covers more; true if it grew.
    pub fn merge(&mut self, other: &Cover) -> bool {
        let mut grew = false;
        self.epoch = self.epoch.max(other.epoch);
        for (actor, &max) in &other.clock {
            let mine = self.clock.entry(actor.clone()).or_insert(0);
            if max > *mine {
                *mine = max;
                grew = true;
            }
        }
        grew
    }

    /// Whether this cover covers every operation `other` covers.
    pub fn includes(&self, other: &Cover) -> bool {
        other
            .clock
            .iter()
            .all(|(actor, &max)| self.clock.get(actor).is_some_and(|&m| m >= max))
    }

    /// Whether the operation `counter` of `actor` is covered.
    pub fn covers(&self, counter: u64, actor: &ActorId) -> bool {
        self.clock
            .get(&actor.to_hex_string())
            .is_some_and(|&max| counter <= max)
    }

    /// The cover of every change of `doc`.
    pub fn of_doc(doc: &Automerge, epoch: u64) -> Cover {
        let mut clock: BTreeMap<String, u64> = BTreeMap::new();
        for m in doc.get_changes_meta(&[]) {
            let e = clock.entry(m.actor.to_hex_string()).or_insert(0);
            *e = (*e).max(m.max_op);
        }
        Cover { epoch, clock }
    }
}

/// Every cover a queue document holds, by covered document id (concurrent values merged).
pub fn read_covers<R: ReadDoc>(doc: &R) -> BTreeMap<String, Cover> {
    let mut out: BTreeMap<String, Cover> = BTreeMap::new();
    for m in am::all_objects(doc, &ROOT, COVERED, ObjType::Map) {
        for item in doc.map_range(&m, ..) {
            let key = item.key.to_string();
            for c in read_cover_values(doc, &m, &key) {
                out.entry(key.clone()).or_default().merge(&c);
            }
        }
    }
    out
}

/// The cover a queue document holds of document `of`, concurrent values merged.
pub fn read_cover<R: ReadDoc>(doc: &R, of: &str) -> Option<Cover> {
    let mut out: Option<Cover> = None;
    for m in am::all_objects(doc, &ROOT, COVERED, ObjType::Map) {
        for c in read_cover_values(doc, &m, of) {
            out.get_or_insert_with(Cover::default).merge(&c);
        }
    }
    out
}

fn read_cover_values<R: ReadDoc>(doc: &R, map: &ObjId, key: &str) -> Vec<Cover> {
    doc.get_all(map, key)
        .map(|vs| {
            vs.into_iter()
                .filter_map(|(v, _)| match v {
                    automerge::Value::Scalar(s) => match s.as_ref() {
                        automerge::ScalarValue::Str(s) => packed::decode::<Cover>(s),
                        _ => None,
                    },
                    automerge::Value::Object(_) => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a task entry of `from` was absorbed by the chain `cover` describes: one of the
/// values indexing `task` in `from` was written by an operation `cover` covers. Such a task
/// was sealed or carried into the chain, so if the chain does not index it now it ended
/// there and must not be carried back.
pub fn entry_covered(from: &Automerge, cover: &Cover, task: &TaskId) -> bool {
    am::all_objects(from, &ROOT, keys::TASKS, ObjType::Map)
        .iter()
        .any(|t| {
            from.get_all(t, task.as_str()).is_ok_and(|vs| {
                vs.iter().any(|(_, id)| match id {
                    ObjId::Id(counter, actor, _) => cover.covers(*counter, actor),
                    ObjId::Root => false,
                })
            })
        })
}

/// Whether the entry indexing `task` in `doc` was written by a successor's build or by a
/// carry (a change that also wrote covers), rather than by a submit to `doc` itself. Reads
/// the changes that wrote it: for a losing branch's carry only.
pub fn entry_carried(doc: &Automerge, task: &TaskId) -> bool {
    let covered: Vec<ObjKey> = am::all_objects(doc, &ROOT, COVERED, ObjType::Map)
        .iter()
        .filter_map(key_of)
        .collect();
    am::all_objects(doc, &ROOT, keys::TASKS, ObjType::Map)
        .iter()
        .flat_map(|t| {
            doc.get_all(t, task.as_str())
                .map(|vs| vs.into_iter().map(|(_, id)| id).collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .filter_map(|op| doc.hash_for_opid(&op))
        .filter_map(|h| doc.get_change_by_hash(&h))
        .any(|c| {
            c.decode()
                .operations
                .iter()
                .any(|op| match (&op.obj, &op.key) {
                    (ObjectId::Root, Key::Map(k)) => k == COVERED,
                    (ObjectId::Id(OpId(counter, actor)), _) => {
                        covered.contains(&(*counter, actor.clone()))
                    }
                    _ => false,
                })
        })
}

/// Writes into the root `covered` map of `tx` every cover of `covers` that holds more than
/// the document has.
fn write_covers(
    tx: &mut Transaction<'_>,
    covers: &BTreeMap<String, Cover>,
) -> Result<usize, AutomergeError> {
    let mut writes = 0;
    let mut map = am::object(tx, &ROOT, COVERED, ObjType::Map);
    for (doc, c) in covers {
        let existing = read_cover(tx, doc);
        let mut merged = existing.clone().unwrap_or_default();
        if !merged.merge(c) && existing.is_some() {
            continue;
        }
        let m = match &map {
            Some(m) => m.clone(),
            None => {
                let m = tx.put_object(ROOT, COVERED, ObjType::Map)?;
                map = Some(m.clone());
                m
            }
        };
        tx.put(&m, doc.as_str(), packed::encode(&merged))?;
        writes += 1;
    }
    Ok(writes)
}

/// When a queue document is due for rotation: its finished tasks outweigh `ratio` times its
/// live ones (and at least `ratio × min_live`). Counted from the view's O(1) counts.
pub fn should_rotate(counts: &StateCounts, ratio: usize, min_live: usize) -> bool {
    let finished = counts.succeeded + counts.failed;
    let live = counts.pending + counts.assigned + counts.running + counts.input_unavailable;
    finished > ratio.saturating_mul(live.max(min_live))
}

/// What the successor of a rotation is.
#[derive(Clone, Debug)]
pub struct Rotation<'a> {
    /// The queue (its first document's id).
    pub origin: &'a QueueId,
    /// The document being sealed.
    pub prev: &'a str,
    /// The successor's own id (its lineage names it).
    pub successor: &'a str,
    /// The successor's epoch number.
    pub epoch: u64,
    /// The sealer's router record in the successor: a term above every term it knows.
    pub claim: &'a Claim,
    /// Now, unix ms.
    pub now_ms: u64,
}

/// What [`build_successor`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rotated {
    /// Live tasks written into the successor.
    pub carried: usize,
    /// Finished tasks left behind.
    pub dropped: usize,
}

/// Rotating failed; the successor is left empty.
#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    /// The old document is not a queue document.
    #[error("not a queue document")]
    NotAQueue,
    /// The successor already has content.
    #[error("the successor document is not empty")]
    NotEmpty,
    /// Automerge refused the change.
    #[error(transparent)]
    Automerge(#[from] AutomergeError),
}

/// Writes into the empty document `succ` the successor of `old` (read as `view`): the name,
/// config, pause flag and members, the router record `r.claim`, the epoch records, and every
/// task that is not final with all its attempt records, in the packed layout. One change.
///
/// Its cost is in proportion to the tasks of `old` (it looks at each to drop the finished
/// ones) plus the records of the live ones; a rotation happens once per many finished tasks.
pub fn build_successor(
    old: &Automerge,
    view: &QueueView,
    succ: &mut Automerge,
    r: &Rotation<'_>,
) -> Result<Rotated, RotateError> {
    if am::string(old, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
        return Err(RotateError::NotAQueue);
    }
    if !succ.get_heads().is_empty() {
        return Err(RotateError::NotEmpty);
    }
    let creator = am::string(old, &ROOT, keys::CREATOR).unwrap_or_default();
    let mut lineage = read_lineage(old);
    lineage.push(Link {
        epoch: r.epoch,
        claim: r.claim.clone(),
        doc: r.successor.to_owned(),
    });
    if lineage.len() > MAX_LINEAGE {
        lineage.drain(..lineage.len() - MAX_LINEAGE);
    }
    let lineage = serde_json::to_string(&lineage).expect("links serialize");
    let heads = old.get_heads();
    // What the chain absorbed: all of `old` (the seal's heads are its heads), and the covers
    // `old` held of the documents before it, as far back as `COVER_EPOCHS`.
    let mut covers: BTreeMap<String, Cover> = read_covers(old)
        .into_iter()
        .filter(|(_, c)| c.epoch.saturating_add(COVER_EPOCHS) >= r.epoch)
        .collect();
    let old_epoch = read_epoch(old).map_or(0, |e| e.0);
    covers
        .entry(r.prev.to_owned())
        .or_default()
        .merge(&Cover::of_doc(old, old_epoch));
    let mut stats = Rotated::default();
    let mut retired = view.retired;
    for t in view.tasks().values() {
        match t.state() {
            crate::TaskState::Succeeded => retired.succeeded = retired.succeeded.saturating_add(1),
            crate::TaskState::Failed => retired.failed = retired.failed.saturating_add(1),
            crate::TaskState::Cancelled => retired.cancelled = retired.cancelled.saturating_add(1),
            _ => {}
        }
    }
    let retired = packed::encode(&retired);
    succ.transact(|tx| {
        tx.put(ROOT, keys::SCHEMA, keys::QUEUE_SCHEMA)?;
        tx.put(ROOT, keys::VERSION, keys::QUEUE_VERSION)?;
        tx.put(ROOT, keys::NAME, view.name.as_str())?;
        tx.put(ROOT, keys::CREATED_AT, r.now_ms)?;
        tx.put(ROOT, keys::CREATOR, creator.as_str())?;
        // The membership goes on whole: the creator's key and every signed operation.
        for key in [keys::CREATOR_KEY, keys::QUEUE_ID] {
            if let Some(v) = am::string(old, &ROOT, key) {
                tx.put(ROOT, key, v.as_str())?;
            }
        }
        for (key, bytes) in crate::view::stored_ops(old) {
            tx.put(ROOT, key.as_str(), automerge::ScalarValue::Bytes(bytes))?;
        }
        tx.put(ROOT, keys::PAUSED, view.paused)?;
        tx.put(ROOT, EPOCH, r.epoch)?;
        tx.put(ROOT, ORIGIN, r.origin.as_str())?;
        tx.put(ROOT, PREV, r.prev)?;
        tx.put(ROOT, PREV_HEADS, encode_heads(&heads))?;
        tx.put(ROOT, LINEAGE, lineage.as_str())?;
        tx.put(ROOT, RETIRED, retired.as_str())?;
        write_covers(tx, &covers)?;
        let config = write_config(tx, &view.config)?;
        settings::copy_times(old, tx, &config)?;
        crate::schedule::copy_schedules(old, tx)?;
        let members = tx.put_object(ROOT, keys::MEMBERS, ObjType::Map)?;
        for (peer, m) in &view.members {
            write_member(tx, &members, peer, &m.addrs, r.now_ms)?;
        }
        let router = tx.put_object(ROOT, keys::ROUTER, ObjType::Map)?;
        tx.put(&router, keys::TERM, r.claim.term)?;
        tx.put(&router, keys::PEER, r.claim.peer.as_str())?;
        tx.put(&router, keys::CLAIMED_AT, r.now_ms)?;
        tx.put_object(ROOT, keys::CLAIMS, ObjType::Map)?;
        tx.put_object(ROOT, SEALS, ObjType::Map)?;
        let tasks = tx.put_object(ROOT, keys::TASKS, ObjType::Map)?;
        let assigned = tx.put_object(ROOT, packed::ASSIGNED, ObjType::Map)?;
        let started = tx.put_object(ROOT, packed::STARTED, ObjType::Map)?;
        let ended = tx.put_object(ROOT, packed::ENDED, ObjType::Map)?;
        let seen = tx.put_object(ROOT, packed::SEEN, ObjType::Map)?;
        let output = tx.put_object(ROOT, packed::OUTPUT, ObjType::Map)?;
        let bumps = tx.put_object(ROOT, packed::BUMPS, ObjType::Map)?;
        let cancels = tx.put_object(ROOT, packed::CANCELS, ObjType::Map)?;
        let requeues = tx.put_object(ROOT, packed::REQUEUES, ObjType::Map)?;
        let idem = tx.put_object(ROOT, packed::IDEMPOTENCY, ObjType::Map)?;
        // Idempotency records younger than IDEMPOTENCY_KEEP_MS (by this clock) go on.
        for m in am::all_objects(old, &ROOT, packed::IDEMPOTENCY, ObjType::Map) {
            for item in old.map_range(&m, ..) {
                let key = item.key.to_string();
                let Some(rec) = packed_values(old, packed::IDEMPOTENCY, &key)
                    .filter_map(|v| packed::decode::<packed::Idem>(&v))
                    .min()
                else {
                    continue;
                };
                if rec.t.saturating_add(crate::queue::IDEMPOTENCY_KEEP_MS) >= r.now_ms {
                    tx.put(&idem, key.as_str(), packed::encode(&rec))?;
                }
            }
        }
        for t in view.tasks().values() {
            if t.state().is_final() {
                stats.dropped += 1;
                continue;
            }
            stats.carried += 1;
            let entry = packed::Entry::of(t, carried_rules(t, view));
            tx.put(&tasks, t.id.as_str(), packed::encode(&entry))?;
            // What the ended runs of an inline task produced (its failed runs' logs).
            if t.input.is_some() {
                for (id, out) in crate::read::read_outputs(old, &t.id) {
                    let key = packed::attempt_key(&t.id, &id);
                    tx.put(&output, key.as_str(), packed::encode(&out))?;
                }
            }
            for a in &t.attempts {
                let key = packed::attempt_key(&t.id, &a.id);
                let rec = packed::Assigned {
                    w: a.worker.to_string(),
                    i: a.pool_incarnation,
                    a: a.assigned_at,
                };
                tx.put(&assigned, key.as_str(), packed::encode(&rec))?;
                if let Some(s) = &a.started {
                    let rec = packed::Start {
                        a: s.at,
                        i: s.incarnation,
                    };
                    tx.put(&started, key.as_str(), packed::encode(&rec))?;
                }
                if let Some(f) = &a.finished {
                    tx.put(&ended, key.as_str(), packed::encode(&packed::End::of(f)))?;
                }
            }
            if t.input_seen > 0 {
                tx.put(&seen, t.id.as_str(), t.input_seen)?;
            }
            if let Some(b) = &t.bump {
                tx.put(&bumps, t.id.as_str(), packed::encode(b))?;
            }
            // A live task has no cancel (a cancel makes it final): copied all the same, so
            // that the successor reads the entry exactly as the view does.
            if let Some(c) = &t.cancel {
                tx.put(&cancels, t.id.as_str(), packed::encode(c))?;
            }
            if let Some(q) = &t.requeue {
                tx.put(&requeues, t.id.as_str(), packed::encode(q))?;
            }
        }
        // The last operation of the build: everything up to it, by this actor, is the
        // predecessor's state as its view judged it, copied (`judge.rs` counts it whatever the
        // builder's role: a member's rotation keeps an admin's configuration).
        tx.put(ROOT, keys::BUILT, true)?;
        Ok::<_, RotateError>(())
    })
    .map_err(|f| f.error)?;
    Ok(stats)
}

/// Writes a seal into `doc` (the epoch being sealed): `seal.successor` continues it, from
/// `doc`'s heads `heads` (the writes after them are carried).
pub fn seal(doc: &mut Automerge, seal: &Seal, heads: &[ChangeHash]) -> Result<(), WriteError> {
    doc.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        let seals = match am::object(tx, &ROOT, SEALS, ObjType::Map) {
            Some(s) => s,
            None => tx.put_object(ROOT, SEALS, ObjType::Map)?,
        };
        let rec = PackedSeal {
            e: seal.epoch,
            t: seal.claim.term,
            p: seal.claim.peer.to_string(),
            h: Some(encode_heads(heads)),
        };
        tx.put(&seals, seal.successor.as_str(), packed::encode(&rec))?;
        Ok(())
    })
    .map(|s| s.result)
    .map_err(|f| f.error)
}

/// Records in the queue's first document that `latest` is its newest epoch, unless it already
/// names a newer one. Concurrent values resolve to the greatest.
pub fn set_latest(doc: &mut Automerge, latest: &Latest) -> Result<(), WriteError> {
    if read_latest(doc).is_some_and(|l| l >= *latest) {
        return Ok(());
    }
    doc.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        let rec = PackedLatest {
            e: latest.epoch,
            d: latest.doc.clone(),
        };
        tx.put(ROOT, LATEST, packed::encode(&rec))?;
        Ok(())
    })
    .map(|s| s.result)
    .map_err(|f| f.error)
}

/// The greatest claim that counts in `into` once the chained claims of `from` (a sealed
/// document it continues) are carried into it: `from`'s claims above the seal count there
/// only if their chain runs through a claim that counts in `into`. A node fences with it
/// before the carry is written.
pub fn carried_claim<R: ReadDoc, S: ReadDoc>(from: &R, into: &S) -> Option<Claim> {
    let (counted, _) = crate::view::read_claims(into, &Judge::open());
    let mut counted: std::collections::BTreeSet<Claim> = counted.into_iter().collect();
    let mut bad = 0;
    let mut records = crate::view::chained_records(from, &Judge::open(), &mut bad);
    records.extend(crate::view::chained_records(into, &Judge::open(), &mut bad));
    crate::view::extend_chain(&mut counted, records);
    counted.into_iter().next_back()
}

/// The chained claim records of a queue document, as written: key and packed value.
fn chained_claims<R: ReadDoc>(doc: &R) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for map in am::all_objects(doc, &ROOT, keys::CLAIMS, ObjType::Map) {
        for item in doc.map_range(&map, ..) {
            if let Some(v) = am::as_str(&item.value) {
                out.push((item.key.to_string(), v.to_owned()));
            }
        }
    }
    out
}

/// A queue document's epoch number and the queue it continues (`None` in epoch 0); `None` if
/// it is not a queue document.
pub fn read_epoch<R: ReadDoc>(doc: &R) -> Option<(u64, Option<QueueId>)> {
    if am::string(doc, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
        return None;
    }
    Some((
        am::uint(doc, &ROOT, EPOCH).unwrap_or(0),
        am::string(doc, &ROOT, ORIGIN).map(QueueId::new),
    ))
}

/// The effective router claim of a queue document (the greatest of its concurrent claims).
pub fn effective_claim<R: ReadDoc>(doc: &R) -> Option<Claim> {
    crate::view::read_claims(doc, &Judge::open())
        .0
        .into_iter()
        .max()
}

/// The sealed document a queue document continues, and its heads at sealing (`None` in
/// epoch 0).
pub fn read_prev<R: ReadDoc>(doc: &R) -> Option<Prev> {
    let doc_id = am::string(doc, &ROOT, PREV)?;
    let heads = am::string(doc, &ROOT, PREV_HEADS)
        .map(|h| decode_heads(&h))
        .unwrap_or_default();
    Some(Prev { doc: doc_id, heads })
}

/// The heads a queue document had when it was sealed into `successor`, if it holds that
/// seal.
pub fn seal_heads<R: ReadDoc>(doc: &R, successor: &str) -> Option<Vec<ChangeHash>> {
    am::all_objects(doc, &ROOT, SEALS, ObjType::Map)
        .iter()
        .find_map(|m| am::string(doc, m, successor))
        .and_then(|v| packed::decode::<PackedSeal>(&v))
        .and_then(|s| s.h)
        .map(|h| decode_heads(&h))
}

/// A task's state in a queue document, if the document indexes it (reads that entry, and
/// those of its dependencies: see [`task_entry`]).
pub fn task_state(doc: &Automerge, task: &TaskId) -> Option<crate::TaskState> {
    task_entry(doc, task).map(|t| t.state())
}

/// A task's entry in a queue document, if the document indexes it: that one entry, with its
/// dependencies' final outcomes as the document shows them (their entries read the same way,
/// 16 levels deep at most), as a whole view would.
pub fn task_entry(doc: &Automerge, task: &TaskId) -> Option<crate::TaskEntry> {
    let mut e = entry_alone(doc, task)?;
    for d in e.rules.depends_on.clone() {
        if let Some(s) = settled_state(doc, &d, SETTLED_DEPTH).filter(|s| s.is_final()) {
            e.dependencies.insert(d, s);
        }
    }
    Some(e)
}

/// A task's entry read alone (its dependencies' outcomes only as recorded in it).
fn entry_alone(doc: &Automerge, task: &TaskId) -> Option<crate::TaskEntry> {
    let tasks = am::object(doc, &ROOT, keys::TASKS, ObjType::Map)?;
    let (v, o) = doc.get(&tasks, task.as_str()).ok()??;
    let value = match v {
        automerge::Value::Object(ObjType::Map) => crate::read::EntryValue::Map(o),
        automerge::Value::Scalar(s) => match s.as_ref() {
            automerge::ScalarValue::Str(s) => crate::read::EntryValue::Packed(s.to_string()),
            _ => return None,
        },
        _ => return None,
    };
    crate::read::read_task_entry(
        doc,
        &Judge::open(),
        value,
        task.clone(),
        &mut 0,
        &mut |_| {},
    )
}

/// The heads among `heads` that `doc` has.
pub fn known_heads(doc: &Automerge, heads: &[ChangeHash]) -> Vec<ChangeHash> {
    heads
        .iter()
        .filter(|h| doc.get_change_meta_by_hash(h).is_some())
        .copied()
        .collect()
}

/// Whether `task` was indexed in `doc` at `heads` (the heads `doc` does not have are left
/// out).
pub fn known_at(doc: &Automerge, heads: &[ChangeHash], task: &TaskId) -> bool {
    let heads = known_heads(doc, heads);
    if heads.is_empty() {
        return false;
    }
    am::all_objects(doc, &ROOT, keys::TASKS, ObjType::Map)
        .iter()
        .any(|t| {
            doc.get_all_at(t, task.as_str(), &heads)
                .is_ok_and(|v| !v.is_empty())
        })
}

/// What [`carry`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// Values written into the successor.
    pub writes: usize,
    /// Keys left behind: records of tasks that are not in the successor (finished before the
    /// seal), and values that are not packed records.
    pub skipped: usize,
    /// Of the writes, task entries: tasks that were not in the successor before. Another
    /// document's records of such a task, left behind before it arrived, can now be carried.
    pub tasks: usize,
    /// `from`'s heads, or where a carry that looked at only part of the changes stopped: pass
    /// them as `since` next time.
    pub heads: Vec<ChangeHash>,
    /// Changes were left for another carry (`max_changes`).
    pub more: bool,
    /// The changes looked at.
    pub changes: usize,
}

type ObjKey = (u64, ActorId);

fn key_of(obj: &ObjId) -> Option<ObjKey> {
    match obj {
        ObjId::Id(counter, actor, _) => Some((*counter, actor.clone())),
        ObjId::Root => None,
    }
}

/// The maps carried, in the order they are carried: task entries first, so that the records
/// of a task submitted late find it.
pub(crate) const CARRIED: [&str; 10] = [
    keys::TASKS,
    packed::ASSIGNED,
    packed::STARTED,
    packed::ENDED,
    packed::SEEN,
    packed::OUTPUT,
    packed::BUMPS,
    packed::IDEMPOTENCY,
    packed::CANCELS,
    packed::REQUEUES,
];

/// The index of the requeues in [`CARRIED`].
const REQUEUES_AT: usize = 9;

/// Carries into `into` the writes `from` received after `since`: for every key of the task
/// index and the attempt maps that they touched, `into` ends up resolving to the greatest value
/// of the two documents, written under the same key. `dropped(task)` says that a task absent
/// from `into` was finished and left behind when it was sealed (see [`known_at`]); other
/// absent tasks were submitted late and are carried. One change (none if nothing is new).
///
/// With `mark` (the id of `from`, when `into` is its direct successor), a carry that writes
/// also records the heads it carried from in `into` ([`carried_marks`]): every carrier of
/// `from` into `into` then starts from them, and carries only what no one carried yet.
///
/// At most `max_changes` of the changes after `since` are looked at, the earliest (a prefix
/// that holds the dependencies of each of its changes): [`Carried::more`] then says that
/// some were left, and [`Carried::heads`] where to go on from.
///
/// Costs the changes after `since`, not `from`'s history.
pub fn carry(
    from: &Automerge,
    since: &[ChangeHash],
    into: &mut Automerge,
    dropped: &dyn Fn(&TaskId) -> bool,
    mark: Option<&str>,
    max_changes: usize,
) -> Result<Carried, WriteError> {
    carry_covering(from, since, into, dropped, mark, None, max_changes)
}

/// [`carry`], which also records in `into`, with what it writes, a [`Cover`] of the changes it
/// looked at under `cover` (`from`'s id and epoch), and hands on the covers those changes
/// wrote into `from`. Every change before them was sealed or carried already, so the cover
/// says what the chain absorbed of `from`.
pub fn carry_covering(
    from: &Automerge,
    since: &[ChangeHash],
    into: &mut Automerge,
    dropped: &dyn Fn(&TaskId) -> bool,
    mark: Option<&str>,
    cover: Option<(&str, u64)>,
    max_changes: usize,
) -> Result<Carried, WriteError> {
    let since = known_heads(from, since);
    let mut maps: HashMap<ObjKey, usize> = HashMap::new();
    for (i, name) in CARRIED.iter().enumerate() {
        for obj in am::all_objects(from, &ROOT, name, ObjType::Map) {
            if let Some(k) = key_of(&obj) {
                maps.insert(k, i);
            }
        }
    }
    let mut touched: BTreeSet<(usize, String)> = BTreeSet::new();
    let mut changes = from.get_changes(&since);
    let more = changes.len() > max_changes;
    changes.truncate(max_changes);
    // Where the next carry goes on from: `from`'s heads, or those of the prefix looked at
    // (with the heads it started from that none of the prefix depends on).
    let heads = if more {
        let deps: BTreeSet<ChangeHash> = changes
            .iter()
            .flat_map(|c| c.deps().iter().copied())
            .collect();
        let mut h: Vec<ChangeHash> = since
            .iter()
            .chain(changes.iter().map(|c| c.hash()).collect::<Vec<_>>().iter())
            .filter(|h| !deps.contains(h))
            .copied()
            .collect();
        h.sort();
        h.dedup();
        h
    } else {
        from.get_heads()
    };
    // The router records and the chained claims: a claim can have changed only if one of
    // the changes wrote there.
    let routers: HashSet<ObjKey> = am::all_objects(from, &ROOT, keys::ROUTER, ObjType::Map)
        .iter()
        .chain(am::all_objects(from, &ROOT, keys::CLAIMS, ObjType::Map).iter())
        .filter_map(key_of)
        .collect();
    let mut router_touched = false;
    // The covers `from` holds (of the documents before it): handed on if one of the changes
    // wrote there.
    let cover_maps: HashSet<ObjKey> = am::all_objects(from, &ROOT, COVERED, ObjType::Map)
        .iter()
        .filter_map(key_of)
        .collect();
    let mut covers_touched = false;
    let mut members_touched = false;
    // The settings (the pause flag, the config's fields): carried as registers if one of the
    // changes wrote there (see `settings`).
    let config_maps: HashSet<ObjKey> = am::all_objects(from, &ROOT, keys::CONFIG, ObjType::Map)
        .iter()
        .filter_map(key_of)
        .collect();
    let mut settings_touched = false;
    let mut looked = Cover::default();
    // Late writes are judged as `from`'s view judges them (`judge.rs`): what a removed peer
    // wrote beyond its removal's cut, or a peer beyond its role, is not carried (carried, it
    // would be the carrier's write).
    let mut root = QueueView::default();
    let judged = crate::view::read_root(from, &mut root).is_some();
    let judge = match judged {
        true => Judge::new(&root.membership, root.doc_key.as_deref()).built(root.built.as_ref()),
        false => Judge::open(),
    };
    for change in &changes {
        if let Some((_, epoch)) = cover {
            looked.epoch = epoch;
            let e = looked
                .clock
                .entry(change.actor_id().to_hex_string())
                .or_insert(0);
            *e = (*e).max(change.max_op());
        }
        let expanded = change.decode();
        let start = expanded.start_op.get();
        for (n, op) in (0u64..).zip(expanded.operations.iter()) {
            let id = ObjId::Id(start + n, expanded.actor_id.clone(), 0);
            let may = |right: Right| judge.allows(&id, right);
            match (&op.obj, &op.key) {
                (ObjectId::Id(OpId(counter, actor)), Key::Map(key)) => {
                    let k = (*counter, actor.clone());
                    if let Some(&i) = maps.get(&k) {
                        let counts = match CARRIED[i] {
                            packed::ASSIGNED | packed::STARTED | packed::ENDED | packed::OUTPUT => {
                                may(Right::Work)
                            }
                            packed::CANCELS | packed::REQUEUES => judge.owner_only(&id).is_some(),
                            _ => may(Right::Any),
                        };
                        if counts {
                            touched.insert((i, key.to_string()));
                        }
                    } else if routers.contains(&k) {
                        router_touched |= may(Right::Work);
                    } else if cover_maps.contains(&k) {
                        covers_touched = true;
                    } else if config_maps.contains(&k) {
                        settings_touched |= may(Right::Work);
                    }
                }
                (ObjectId::Root, Key::Map(key))
                    if key == keys::PAUSED || key == settings::PAUSED_AT || key == keys::CONFIG =>
                {
                    settings_touched |= may(Right::Work)
                }
                (ObjectId::Root, Key::Map(key)) if key == keys::ROUTER || key == keys::CLAIMS => {
                    router_touched |= may(Right::Work)
                }
                (ObjectId::Root, Key::Map(key)) if key == COVERED => covers_touched = true,
                (ObjectId::Root, Key::Map(key))
                    if key.starts_with(crate::membership::OP_PREFIX) =>
                {
                    members_touched = true
                }
                _ => {}
            }
        }
    }
    let mut out = Carried {
        heads,
        more,
        changes: changes.len(),
        ..Carried::default()
    };
    // A router claim written into the sealed document above every claim of `into` (a
    // follower that claimed there) still fences pools: `into`'s routers must see it too.
    let claim = router_touched
        .then(|| carried_claim(from, &*into))
        .flatten()
        .filter(|c| effective_claim(into).is_none_or(|m| *c > m));
    // Membership operations written late into the sealed document: those `into` lacks.
    let ops: Vec<(String, Vec<u8>)> = if members_touched {
        let have = crate::view::stored_ops(into);
        crate::view::stored_ops(from)
            .into_iter()
            .filter(|(k, _)| !have.contains_key(k))
            .collect()
    } else {
        Vec::new()
    };
    if touched.is_empty() && claim.is_none() && !settings_touched && ops.is_empty() {
        return Ok(out);
    }
    let mut writes: BTreeMap<(usize, String), automerge::ScalarValue> = BTreeMap::new();
    into.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        if claim.is_some() {
            // The chained claims `into` lacks, as `from` holds them: a claim of `from` above
            // the seal's counts in `into` too, its chain running through the sealer's claim.
            // The records that count in `into` once carried and do not yet: a claim counts
            // only with the chain below it, and the chain runs through a claim that counts
            // there (the sealer's, a base of its lineage). Records that would not count (a
            // forged term, say) are left behind.
            let (before, _) = crate::view::read_claims(tx, &Judge::open());
            let mut after: BTreeSet<Claim> = before.iter().cloned().collect();
            let mut bad = 0;
            let mut records = crate::view::chained_records(from, &Judge::open(), &mut bad);
            records.extend(crate::view::chained_records(tx, &Judge::open(), &mut bad));
            crate::view::extend_chain(&mut after, records);
            let new: HashSet<String> = after
                .difference(&before.into_iter().collect())
                .map(|c| format!("{}/{}", c.term, c.peer))
                .collect();
            let missing: Vec<(String, String)> = chained_claims(from)
                .into_iter()
                .filter(|(k, _)| new.contains(k))
                .collect();
            if !missing.is_empty() {
                let claims = match am::object(tx, &ROOT, keys::CLAIMS, ObjType::Map) {
                    Some(m) => m,
                    None => tx.put_object(ROOT, keys::CLAIMS, ObjType::Map)?,
                };
                for (k, v) in missing {
                    tx.put(&claims, k.as_str(), v)?;
                    out.writes += 1;
                }
            }
        }
        for (key, bytes) in &ops {
            tx.put(
                ROOT,
                key.as_str(),
                automerge::ScalarValue::Bytes(bytes.clone()),
            )?;
            out.writes += 1;
        }
        if settings_touched {
            out.writes += settings::carry_settings(from, tx)?;
            out.writes += crate::schedule::carry_schedules(from, tx)?;
        }
        let mut targets = Vec::new();
        for name in CARRIED {
            targets.push(match am::object(tx, &ROOT, name, ObjType::Map) {
                Some(m) => m,
                None => tx.put_object(ROOT, name, ObjType::Map)?,
            });
        }
        for (i, key) in &touched {
            let value = carried_value(from, tx, *i, key, dropped, false);
            match value {
                Some(v) => {
                    tx.put(&targets[*i], key.as_str(), v.clone())?;
                    writes.insert((*i, key.clone()), v);
                }
                None => out.skipped += 1,
            }
        }
        if !writes.is_empty() {
            let mut covers = if covers_touched {
                read_covers(from)
            } else {
                BTreeMap::new()
            };
            // A document off `into`'s chain (a losing branch) absorbed the chain's documents
            // its own way: its covers of them do not say what `into` absorbed (the tasks this
            // carry leaves to the chain's own carries would count as absorbed, and no carry
            // would bring them). Only its own cover is handed on.
            if let Some((id, _)) = cover {
                let lineage = crate::chain::read_lineage(&*tx);
                if !lineage.iter().any(|l| l.doc == id) {
                    covers.retain(|d, _| !lineage.iter().any(|l| l.doc == *d));
                }
            }
            if let Some((id, _)) = cover {
                covers.entry(id.to_owned()).or_default().merge(&looked);
            }
            write_covers(tx, &covers)?;
        }
        if let Some(m) = mark
            && !writes.is_empty()
        {
            let marks = match am::object(tx, &ROOT, CARRIED_FROM, ObjType::Map) {
                Some(o) => o,
                None => tx.put_object(ROOT, CARRIED_FROM, ObjType::Map)?,
            };
            tx.put(&marks, m, encode_heads(&out.heads))?;
        }
        Ok(())
    })
    .map_err(|f| f.error)?;
    out.writes += writes.len();
    out.tasks = writes.keys().filter(|(i, _)| *i == 0).count();
    out.skipped = touched.len() - writes.len();
    Ok(out)
}

/// The heads of document `from` (by id) whose writes were carried into `into` by any carrier
/// that marked its carry ([`carry`]'s `mark`): all of them, concurrent marks included.
pub fn carried_marks<R: ReadDoc>(into: &R, from: &str) -> Vec<ChangeHash> {
    let mut heads: Vec<ChangeHash> = am::all_objects(into, &ROOT, CARRIED_FROM, ObjType::Map)
        .iter()
        .flat_map(|m| {
            into.get_all(m, from)
                .map(|vs| {
                    vs.into_iter()
                        .filter_map(|(v, _)| match v {
                            automerge::Value::Scalar(s) => match s.as_ref() {
                                automerge::ScalarValue::Str(s) => Some(decode_heads(s)),
                                _ => None,
                            },
                            automerge::Value::Object(_) => None,
                        })
                        .flatten()
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        })
        .collect();
    heads.sort();
    heads.dedup();
    heads
}

/// Writes into `into` every attempt record (assignment, start, end, output) that `from`
/// holds of each of `tasks` and that is newer than `into`'s, as a carry merges them, whether
/// or not `into` holds the task; how many. One change, none if nothing is new.
///
/// A node that moves to another branch writes those of the tasks the branch shows live and
/// a sealed document it holds shows final: the branch's copy of a document both share may
/// lack their ends, and the node's view must not go back. Costs the records of `tasks`.
pub fn carry_records(
    from: &Automerge,
    into: &mut Automerge,
    tasks: &[TaskId],
) -> Result<usize, WriteError> {
    // (index in CARRIED, attempt key)
    let mut found: Vec<(usize, String)> = Vec::new();
    for (i, name) in CARRIED.iter().enumerate() {
        if ![
            packed::ASSIGNED,
            packed::STARTED,
            packed::ENDED,
            packed::OUTPUT,
        ]
        .contains(name)
        {
            continue;
        }
        for obj in am::all_objects(from, &ROOT, name, ObjType::Map) {
            for t in tasks {
                for item in from.map_range(&obj, packed::attempts_of(t)) {
                    found.push((i, item.key.to_string()));
                }
            }
        }
    }
    found.sort();
    found.dedup();
    if found.is_empty() {
        return Ok(0);
    }
    let mut writes = 0;
    into.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        let mut targets = BTreeMap::new();
        for (i, key) in &found {
            let keep = |_: &TaskId| true;
            let Some(v) = carried_value(from, tx, *i, key, &keep, true) else {
                continue;
            };
            let target = match targets.get(i) {
                Some(t) => t,
                None => {
                    let t = match am::object(tx, &ROOT, CARRIED[*i], ObjType::Map) {
                        Some(m) => m,
                        None => tx.put_object(ROOT, CARRIED[*i], ObjType::Map)?,
                    };
                    targets.entry(*i).or_insert(t)
                }
            };
            tx.put(target, key.as_str(), v)?;
            writes += 1;
        }
        Ok(())
    })
    .map_err(|f| f.error)?;
    Ok(writes)
}

/// The value a carry from `from` writes under `key` of map `CARRIED[i]` in `into`, if any: the
/// task's entry unless `dropped`; an attempt's record if it is newer than `into`'s. An
/// attempt's end and output go even when `into` does not hold the task: another carrier that
/// holds less of a sealed document may bring the task in later, live, and the end must be
/// there when it does, or the task shows running again after it ended. Its assignment and
/// start stay behind, unless `absent_too`.
fn carried_value<R: ReadDoc>(
    from: &Automerge,
    into: &R,
    i: usize,
    key: &str,
    dropped: &dyn Fn(&TaskId) -> bool,
    absent_too: bool,
) -> Option<automerge::ScalarValue> {
    match i {
        0 => carry_entry(from, into, key, dropped),
        // An idempotency record: the earliest of both documents' (its key names no task).
        7 => {
            let first = |d: &dyn Fn() -> Vec<String>| {
                d().into_iter()
                    .filter_map(|v| packed::decode::<packed::Idem>(&v))
                    .min()
            };
            let theirs = first(&|| packed_values(from, packed::IDEMPOTENCY, key).collect())?;
            let mine = first(&|| packed_values(into, packed::IDEMPOTENCY, key).collect());
            mine.is_none_or(|m| theirs < m)
                .then(|| automerge::ScalarValue::from(packed::encode(&theirs)))
        }
        1 | 2 | 4 | 6 | 8 | REQUEUES_AT if !absent_too && !has_task(into, packed::task_of(key)) => {
            None
        }
        1..=3 | 5 => attempt_value(i, packed_values(from, CARRIED[i], key), into, key),
        6 => {
            let mine = crate::read::bump_of(packed_values(into, packed::BUMPS, key));
            let theirs = crate::read::bump_of(packed_values(from, packed::BUMPS, key))?;
            let merged = mine.map_or(theirs, |m| m.merge(theirs));
            (Some(merged) != mine).then(|| automerge::ScalarValue::from(packed::encode(&merged)))
        }
        8 => merged_value::<crate::entry::Cancel, R>(from, into, packed::CANCELS, key),
        REQUEUES_AT => merged_value::<crate::entry::Requeue, R>(from, into, packed::REQUEUES, key),
        _ => {
            let theirs = max_uint_all(from, packed::SEEN, key);
            (theirs > max_uint_all(into, packed::SEEN, key))
                .then_some(automerge::ScalarValue::Uint(theirs))
        }
    }
}

/// The merge of `from`'s and `into`'s values under `key` of record map `map`, if it differs
/// from `into`'s.
fn merged_value<T, R>(
    from: &Automerge,
    into: &R,
    map: &str,
    key: &str,
) -> Option<automerge::ScalarValue>
where
    T: crate::read::Merge + Serialize + PartialEq + Clone,
    R: ReadDoc,
{
    let mine = crate::read::merged_of::<T>(packed_values(into, map, key));
    let theirs = crate::read::merged_of::<T>(packed_values(from, map, key))?;
    let merged = match mine.clone() {
        Some(m) => m.merge(theirs),
        None => theirs,
    };
    (Some(&merged) != mine.as_ref()).then(|| automerge::ScalarValue::from(packed::encode(&merged)))
}

/// The value to write under `key` of the attempt map `CARRIED[i]` (assignment, start, end or
/// output) in `into`, given the packed values another holder has under it: theirs if it is
/// newer than `into`'s.
pub(crate) fn attempt_value<R: ReadDoc>(
    i: usize,
    theirs: impl Iterator<Item = String>,
    into: &R,
    key: &str,
) -> Option<automerge::ScalarValue> {
    match i {
        1 => theirs
            .max()
            .filter(|_| packed_values(into, packed::ASSIGNED, key).next().is_none())
            .map(automerge::ScalarValue::from),
        2 => {
            let mine = packed_started(into, key);
            started_of(theirs)
                .filter(|s| mine.is_none_or(|m| (s.incarnation, s.at) > (m.incarnation, m.at)))
                .map(|s| {
                    let rec = packed::Start {
                        a: s.at,
                        i: s.incarnation,
                    };
                    automerge::ScalarValue::from(packed::encode(&rec))
                })
        }
        3 => {
            let mine = packed_finished(into, key);
            finished_of(theirs)
                .filter(|f| {
                    mine.as_ref()
                        .is_none_or(|m| later_finish(f, m) == std::cmp::Ordering::Greater)
                })
                .map(|f| automerge::ScalarValue::from(packed::encode(&packed::End::of(&f))))
        }
        // An inline run's output: written once, with its end, by the run's pool.
        5 => theirs
            .max()
            .filter(|_| packed_values(into, packed::OUTPUT, key).next().is_none())
            .map(automerge::ScalarValue::from),
        _ => None,
    }
}

/// A task's rules as a successor records them: its known dependency outcomes become recorded
/// ones, since a dependency that is final does not follow it into the successor; and a
/// dependency that is a dedup duplicate becomes its survivor.
fn carried_rules(t: &crate::TaskEntry, view: &QueueView) -> crate::Rules {
    let mut r = t.rules.clone();
    let mut outcomes = std::collections::BTreeMap::new();
    for d in &t.rules.depends_on {
        if let Some(s) = t.dependencies.get(d) {
            outcomes.insert(view.survivor(d), *s);
        }
    }
    let mut seen = BTreeSet::new();
    r.depends_on = t
        .rules
        .depends_on
        .iter()
        .map(|d| view.survivor(d))
        .filter(|d| seen.insert(d.clone()))
        .collect();
    r.outcomes = outcomes;
    r
}

/// How deep [`settled_state`] follows dependencies of dependencies.
const SETTLED_DEPTH: usize = 16;

/// A task's state in `doc` read from its entry and, recursively, its dependencies' entries
/// (a dependency's own dependencies can cancel it): `None` if `doc` does not index it.
fn settled_state(doc: &Automerge, task: &TaskId, depth: usize) -> Option<crate::TaskState> {
    let mut e = entry_alone(doc, task)?;
    if depth > 0 {
        for d in e.rules.depends_on.clone() {
            if let Some(s) = settled_state(doc, &d, depth - 1).filter(|s| s.is_final()) {
                e.dependencies.insert(d, s);
            }
        }
    }
    Some(e.state())
}

/// A late task entry to carry: absent from the successor, and not a task that was finished
/// and left behind at the seal. Its dependencies that the successor does not index have their
/// final outcomes in `from` recorded into it (they ended before the seal and stayed behind).
fn carry_entry<R: ReadDoc>(
    from: &Automerge,
    tx: &R,
    task: &str,
    dropped: &dyn Fn(&TaskId) -> bool,
) -> Option<automerge::ScalarValue> {
    let id = TaskId::new(task);
    if has_task(tx, task) || dropped(&id) {
        return None;
    }
    let text = packed_values(from, keys::TASKS, task).max()?;
    let Some(mut entry) = packed::decode::<packed::Entry>(&text) else {
        return Some(automerge::ScalarValue::from(text));
    };
    let mut recorded = false;
    let mut unresolved = Vec::new();
    for d in entry.r.depends_on.clone() {
        if entry.r.outcomes.contains_key(&d) || has_task(tx, d.as_str()) {
            continue;
        }
        if let Some(s) = settled_state(from, &d, SETTLED_DEPTH).filter(|s| s.is_final()) {
            entry.r.outcomes.insert(d, s);
            recorded = true;
        } else if entry.r.follows.as_ref() == Some(&d) {
            // A follow-up's task succeeded: the follow-up was written with its success.
            entry.r.outcomes.insert(d, crate::TaskState::Succeeded);
            recorded = true;
        } else {
            unresolved.push(d);
        }
    }
    // A dependency that is neither in the successor nor final by its own entry is a dedup
    // copy that lost to another (its loss shows only beside the other copies): the entry
    // depends on the survivor instead, as a rotation would have written it. Rare (a late
    // submit depending on a copy cancelled before the seal), so `from` is read whole here.
    if !unresolved.is_empty()
        && let Some(view) = QueueView::read(from)
    {
        for d in unresolved {
            let survivor = view.survivor(&d);
            if survivor == d {
                continue;
            }
            entry.r.depends_on.retain(|x| *x != d);
            if !entry.r.depends_on.contains(&survivor) {
                entry.r.depends_on.push(survivor.clone());
            }
            if !has_task(tx, survivor.as_str())
                && let Some(s) = view
                    .task(&survivor)
                    .map(|t| t.state())
                    .filter(|s| s.is_final())
            {
                entry.r.outcomes.insert(survivor, s);
            }
            recorded = true;
        }
    }
    Some(automerge::ScalarValue::from(match recorded {
        true => packed::encode(&entry),
        false => text,
    }))
}

/// Whether a queue document indexes `task` (at its current heads).
pub fn indexes<R: ReadDoc>(doc: &R, task: &TaskId) -> bool {
    has_task(doc, task.as_str())
}

fn has_task<R: ReadDoc>(doc: &R, task: &str) -> bool {
    am::all_objects(doc, &ROOT, keys::TASKS, ObjType::Map)
        .iter()
        .any(|t| doc.get_all(t, task).is_ok_and(|v| !v.is_empty()))
}

fn max_uint_all<R: ReadDoc>(doc: &R, map: &str, key: &str) -> u64 {
    am::all_objects(doc, &ROOT, map, ObjType::Map)
        .iter()
        .map(|m| am::max_uint(doc, m, key))
        .max()
        .unwrap_or(0)
}
