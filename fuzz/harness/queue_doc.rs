//! What a node reads of the queue documents peers write, fed any bytes or any values: the
//! documents themselves (whole, or as changes on top of a queue a node already reads), the
//! packed records written under their keys, and the lineages of epoch documents.
//!
//! Each `pub fn` taking `&[u8]` is one fuzz target (`fuzz/fuzz_targets/<name>.rs` calls it;
//! `crates/queue-doc/tests/fuzz.rs` calls it on the corpus `fuzz/corpus/<name>/` and on
//! generated inputs). What must hold, whatever the input: no panic; a cached view, whole or
//! refreshed incrementally, equals a whole read of the same document; a task's entry read
//! alone equals the view's; a view's counts add up to its tasks; a lineage holds at most
//! `MAX_LINEAGE` links and two lineages compare in work bounded by their lengths, in an order
//! that is antisymmetric.

// Each fuzz target calls one harness; the tests call them all.
#![allow(dead_code)]

use std::cmp::Ordering;
use std::sync::OnceLock;

use automerge::transaction::{Transactable, Transaction};
use automerge::{ActorId, Automerge, ObjId, ObjType, ROOT, ReadDoc, ScalarValue};
use piecework_queue_doc::epoch::{self, Latest, Link, Rotation, Seal};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueConfig, QueueId, QueueView,
    Submission, TaskId, ViewCache, WorkerId, queue, task,
};

/// The queue's first document (a valid document id).
pub const QUEUE: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiACzeAtpW";
/// Its successor (a valid document id).
pub const SUCCESSOR: &str = "automerge:2ZqJmwUE7jSb5WMa7QyiABaK7mS9";
/// The queue's creator and first router.
pub const PEER_A: &str = "peer-a";
/// A second member.
pub const PEER_B: &str = "peer-b";
/// The tasks of the base documents: `T1` succeeded, `T2` (inline) running, `T3` assigned,
/// `T4` pending, `T5` a layout-1 entry with one attempt that ended failed.
pub const TASKS: [&str; 5] = [
    "automerge:t1",
    "automerge:t2",
    "automerge:t3",
    "automerge:t4",
    "automerge:t5",
];

/// Keys a peer may write at, anywhere in a document: every key of the schema
/// (`crates/queue-doc/src/keys.rs`, the packed maps, the configuration), the members, tasks
/// and attempts of the base documents, and a few others.
pub const KEYS: &[&str] = &[
    // The schema's keys.
    "schema",
    "version",
    "name",
    "config",
    "created_at",
    "creator",
    "members",
    "role",
    "addrs",
    "joined_at",
    "router",
    "term",
    "peer",
    "claimed_at",
    "paused",
    "tasks",
    "queue",
    "kind",
    "input",
    "submitted_at",
    "submitter",
    "priority",
    "urgent",
    "max_attempts",
    "attempts",
    "input_seen",
    "n",
    "worker",
    "assigned_at",
    "pool_incarnation",
    "start",
    "finish",
    "at",
    "incarnation",
    "outcome",
    "error",
    "runs",
    "result",
    "logs",
    "summary",
    "epoch",
    "origin",
    "prev",
    "prev_heads",
    "seals",
    "latest",
    "lineage",
    "carried_from",
    "covered",
    "retired",
    // The packed layout's maps.
    "assigned",
    "started",
    "ended",
    "seen",
    "output",
    // The configuration's keys.
    "heartbeat_ms",
    "takeover_after_ms",
    "settle_ms",
    "pool_heartbeat_ms",
    "lease_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "rate_interval_ms",
    "concurrency",
    "order",
    // Members, tasks, attempts and documents of the base documents.
    PEER_A,
    PEER_B,
    TASKS[0],
    TASKS[1],
    TASKS[2],
    TASKS[3],
    TASKS[4],
    "automerge:t1/1/1/peer-a",
    "automerge:t2/1/1/peer-a",
    "automerge:t3/1/1/peer-a",
    "automerge:t4/1/1/peer-a",
    "automerge:t4/2/2/peer-a",
    "automerge:t4/1/2/peer-b",
    "automerge:t4/18446744073709551615/2/peer-a",
    "automerge:t4/1/18446744073709551615/peer-a",
    "automerge:t4/01/2/peer-a",
    "automerge:t4/1/2/",
    "automerge:t4/1/2/a/b",
    "automerge:t4/",
    QUEUE,
    SUCCESSOR,
    // Others.
    "",
    "0",
    "1",
    "x",
];

/// Strings a peer may write: the schema's words, and packed records of every kind, well
/// formed with values at their extremes, or almost well formed.
pub const STRINGS: &[&str] = &[
    "piecework/queue",
    "piecework/task",
    "member",
    "succeeded",
    "failed",
    "interrupted",
    "refused",
    "unavailable",
    "fifo",
    "lifo",
    "peer-a",
    "peer-a/0",
    "peer-b/4294967295",
    "peer-a/4294967296",
    "/0",
    "peer-a/",
    "automerge:t4",
    "",
    "{",
    "null",
    "[]",
    "{}",
    "\u{0}",
    "é\u{202e}",
    // Task entries.
    r#"{"k":"k","t":1,"s":"peer-a","m":3}"#,
    r#"{"k":"k","t":18446744073709551615,"s":"peer-a","p":-9223372036854775808,"u":true,"m":18446744073709551615,"i":"{}"}"#,
    r#"{"k":"k","t":-1,"s":"peer-a","m":0}"#,
    r#"{"k":1,"t":"1","s":null,"m":1.5}"#,
    // Assignments, starts, ends, outputs.
    r#"{"w":"peer-a/0","i":1,"a":1}"#,
    r#"{"w":"peer-a/0","a":18446744073709551615}"#,
    r#"{"w":"nope","i":-1,"a":1}"#,
    r#"{"a":1,"i":1}"#,
    r#"{"a":18446744073709551615,"i":18446744073709551615}"#,
    r#"{"a":1,"o":"succeeded"}"#,
    r#"{"a":1,"o":"failed","e":"boom"}"#,
    r#"{"a":1,"o":"bogus"}"#,
    r#"{"r":"1","l":["a","b"]}"#,
    r#"{"r":1,"l":"a"}"#,
    // Seals, latest, retired, covers, lineages, heads.
    r#"{"e":1,"t":2,"p":"peer-a"}"#,
    r#"{"e":18446744073709551615,"t":18446744073709551615,"p":"peer-a","h":"zz,"}"#,
    r#"{"e":1,"d":"automerge:2ZqJmwUE7jSb5WMa7QyiABaK7mS9"}"#,
    r#"{"e":18446744073709551615,"d":"not a document"}"#,
    r#"{"succeeded":18446744073709551615,"failed":18446744073709551615}"#,
    r#"{"e":1,"c":{"0101":18446744073709551615,"zz":1}}"#,
    r#"[{"epoch":1,"claim":{"term":2,"peer":"peer-a"},"doc":"automerge:2ZqJmwUE7jSb5WMa7QyiABaK7mS9"}]"#,
    r#"[{"epoch":18446744073709551615,"claim":{"term":18446744073709551615,"peer":""},"doc":""},{"epoch":0,"claim":{"term":0,"peer":"x"},"doc":"x"}]"#,
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0000000000000000000000000000000000000000000000000000000000000000,zz,",
];

/// A value a peer may write.
#[derive(Clone, Debug)]
pub enum Value {
    /// A string.
    Str(String),
    /// An unsigned integer.
    Uint(u64),
    /// A signed integer.
    Int(i64),
    /// A float.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// Null.
    Null,
    /// Bytes.
    Bytes(Vec<u8>),
    /// A counter.
    Counter(i64),
    /// A timestamp.
    Timestamp(i64),
    /// A scalar of a type Automerge does not know. Its type code is taken modulo 6, plus 10:
    /// a value's type is 4 bits of its metadata in a change, and 0 to 9 are Automerge's own
    /// types (a local put of another code is a misuse of Automerge's API that no peer's change
    /// can express, and corrupts the document).
    Unknown(u8, Vec<u8>),
    /// A new map.
    Map,
    /// A new list.
    List,
    /// A new text object holding this.
    Text(String),
    /// Deletes the key.
    Delete,
    /// Increments a counter.
    Increment(i64),
}

/// One write a peer may make: `value` under `key` of the object reached from the root by
/// `path` (objects missing on the way are made maps; a list is indexed by the key as a
/// number).
#[derive(Clone, Debug)]
pub struct Op {
    /// The keys from the root to the object written.
    pub path: Vec<String>,
    /// The key written.
    pub key: String,
    /// The value.
    pub value: Value,
}

/// One change, and optionally another made concurrently by a second writer from the same
/// heads: the two then merge, so that their writes to one key become conflicting values.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The writes of the first writer.
    pub ops: Vec<Op>,
    /// The concurrent writes of the second writer.
    pub concurrent: Vec<Op>,
}

fn actor(n: u8) -> ActorId {
    ActorId::from(&[n; 16][..])
}

fn peer(p: &str) -> PeerId {
    PeerId::new(p)
}

/// The documents the targets start from: a queue's first document (sealed, with every kind of
/// task and record), its successor, and an empty document.
pub fn bases() -> &'static [Automerge; 3] {
    static BASES: OnceLock<[Automerge; 3]> = OnceLock::new();
    BASES.get_or_init(|| {
        let first = first_epoch();
        let succ = successor(&first);
        let mut empty = Automerge::new();
        empty.set_actor(actor(1));
        [first, succ, empty]
    })
}

/// A base document by number (any number picks one).
pub fn base(n: usize) -> Automerge {
    let b = bases();
    b[n % b.len()].clone()
}

fn first_epoch() -> Automerge {
    let (a, b) = (peer(PEER_A), peer(PEER_B));
    let mut doc = Automerge::new();
    doc.set_actor(actor(1));
    queue::create(&mut doc, "fuzz", &QueueConfig::default(), &a, 1_000).expect("create");
    queue::set_member(&mut doc, &b, &["/ip4/127.0.0.1/tcp/1".into()], 1_001).expect("member");
    let claim = Claim::new(1, a.clone());
    queue::claim_router(&mut doc, &claim, 1_002).expect("claim");
    let subs: Vec<Submission> = TASKS[..4]
        .iter()
        .enumerate()
        .map(|(i, t)| Submission {
            id: TaskId::new(*t),
            kind: "k".into(),
            submitter: b.clone(),
            submitted_at: 1_010 + i as u64,
            priority: i as i64,
            urgent: i == 3,
            max_attempts: Some(3),
            input: (i == 1).then(|| "{}".into()),
            rules: Default::default(),
        })
        .collect();
    queue::submit_many(&mut doc, &subs).expect("submit");
    let worker = WorkerId::new(a.clone(), 0);
    let attempt = AttemptId {
        n: 1,
        claim: claim.clone(),
    };
    let assignments: Vec<Assignment> = TASKS[..3]
        .iter()
        .map(|t| Assignment {
            task: TaskId::new(*t),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        })
        .collect();
    queue::record_assignments(&mut doc, &assignments, 1_020).expect("assign");
    for t in &TASKS[..2] {
        queue::record_start(&mut doc, &TaskId::new(*t), &attempt, &worker, 1, 1_030)
            .expect("start");
    }
    let t1 = TaskId::new(TASKS[0]);
    queue::record_finish(
        &mut doc,
        &t1,
        &attempt,
        &worker,
        AttemptOutcome::Succeeded,
        None,
        1_040,
    )
    .expect("finish");
    // A layout-1 entry, as earlier versions wrote them.
    let mut tx = doc.transaction();
    let tasks = match tx.get(ROOT, "tasks") {
        Ok(Some((automerge::Value::Object(ObjType::Map), id))) => id,
        _ => unreachable!("a queue has a task index"),
    };
    layout_one_entry(&mut tx, &tasks).expect("layout 1");
    tx.commit();
    let heads = doc.get_heads();
    let seal = Seal {
        claim: Claim::new(2, a),
        successor: SUCCESSOR.into(),
        epoch: 1,
    };
    epoch::seal(&mut doc, &seal, &heads).expect("seal");
    epoch::set_latest(
        &mut doc,
        &Latest {
            epoch: 1,
            doc: SUCCESSOR.into(),
        },
    )
    .expect("latest");
    doc
}

fn layout_one_entry(
    tx: &mut Transaction<'_>,
    tasks: &ObjId,
) -> Result<(), automerge::AutomergeError> {
    let e = tx.put_object(tasks, TASKS[4], ObjType::Map)?;
    tx.put(&e, "kind", "k")?;
    tx.put(&e, "submitted_at", 1_050u64)?;
    tx.put(&e, "submitter", PEER_B)?;
    tx.put(&e, "priority", -3i64)?;
    tx.put(&e, "urgent", false)?;
    tx.put(&e, "max_attempts", 2u64)?;
    tx.put(&e, "input_seen", 1u64)?;
    let list = tx.put_object(&e, "attempts", ObjType::List)?;
    let a = tx.insert_object(&list, 0, ObjType::Map)?;
    tx.put(&a, "n", 1u64)?;
    tx.put(&a, "term", 1u64)?;
    tx.put(&a, "router", PEER_A)?;
    tx.put(&a, "worker", "peer-b/1")?;
    tx.put(&a, "assigned_at", 1_060u64)?;
    tx.put(&a, "pool_incarnation", 4u64)?;
    let s = tx.put_object(&a, "start", ObjType::Map)?;
    tx.put(&s, "at", 1_070u64)?;
    tx.put(&s, "incarnation", 4u64)?;
    let f = tx.put_object(&a, "finish", ObjType::Map)?;
    tx.put(&f, "at", 1_080u64)?;
    tx.put(&f, "outcome", "failed")?;
    tx.put(&f, "error", "boom")?;
    Ok(())
}

fn successor(first: &Automerge) -> Automerge {
    let view = QueueView::read(first).expect("a queue");
    let mut succ = Automerge::new();
    succ.set_actor(actor(2));
    let origin = QueueId::new(QUEUE);
    let claim = Claim::new(2, peer(PEER_A));
    let r = Rotation {
        origin: &origin,
        prev: QUEUE,
        successor: SUCCESSOR,
        epoch: 1,
        claim: &claim,
        now_ms: 2_000,
    };
    epoch::build_successor(first, &view, &mut succ, &r).expect("successor");
    // A late write to the sealed document, carried: the successor records its mark and cover.
    let mut late = first.clone();
    late.set_actor(actor(3));
    queue::record_finish(
        &mut late,
        &TaskId::new(TASKS[1]),
        &AttemptId {
            n: 1,
            claim: Claim::new(1, peer(PEER_A)),
        },
        &WorkerId::new(peer(PEER_A), 0),
        AttemptOutcome::Failed,
        Some("late"),
        2_010,
    )
    .expect("late finish");
    epoch::carry_covering(
        &late,
        &first.get_heads(),
        &mut succ,
        &|_| false,
        Some(QUEUE),
        Some((QUEUE, 0)),
        64,
    )
    .expect("carry");
    succ
}

// ----- writing what a peer may write -----

fn index_of(key: &str, len: usize) -> usize {
    key.parse::<usize>().map_or(0, |i| i.min(len))
}

/// The object at `path`, made a map wherever there is none.
fn resolve(tx: &mut Transaction<'_>, path: &[String]) -> Option<ObjId> {
    let mut obj = ROOT;
    for key in path {
        obj = match tx.object_type(&obj).ok()? {
            ObjType::Map | ObjType::Table => match tx.get(&obj, key.as_str()).ok()? {
                Some((automerge::Value::Object(_), id)) => id,
                _ => tx.put_object(&obj, key.as_str(), ObjType::Map).ok()?,
            },
            ObjType::List => {
                let len = tx.length(&obj);
                let i = index_of(key, len);
                match tx.get(&obj, i).ok()? {
                    Some((automerge::Value::Object(_), id)) => id,
                    Some(_) => tx.put_object(&obj, i, ObjType::Map).ok()?,
                    None => tx.insert_object(&obj, len, ObjType::Map).ok()?,
                }
            }
            ObjType::Text => return None,
        };
    }
    Some(obj)
}

fn scalar(v: &Value) -> Option<ScalarValue> {
    Some(match v {
        Value::Str(s) => ScalarValue::Str(s.as_str().into()),
        Value::Uint(x) => ScalarValue::Uint(*x),
        Value::Int(x) => ScalarValue::Int(*x),
        Value::F64(x) => ScalarValue::F64(*x),
        Value::Bool(x) => ScalarValue::Boolean(*x),
        Value::Null => ScalarValue::Null,
        Value::Bytes(b) => ScalarValue::Bytes(b.clone()),
        Value::Counter(x) => ScalarValue::counter(*x),
        Value::Timestamp(x) => ScalarValue::Timestamp(*x),
        Value::Unknown(code, bytes) => ScalarValue::Unknown {
            type_code: 10 + code % 6,
            bytes: bytes.clone(),
        },
        Value::Map | Value::List | Value::Text(_) | Value::Delete | Value::Increment(_) => {
            return None;
        }
    })
}

/// Makes one write; refusals (a write Automerge does not allow there) are ignored.
fn write(tx: &mut Transaction<'_>, op: &Op) {
    let Some(obj) = resolve(tx, &op.path) else {
        return;
    };
    let Ok(ty) = tx.object_type(&obj) else {
        return;
    };
    let key = op.key.as_str();
    match ty {
        ObjType::Map | ObjType::Table => {
            let _ = match &op.value {
                Value::Map => tx.put_object(&obj, key, ObjType::Map).map(drop),
                Value::List => tx.put_object(&obj, key, ObjType::List).map(drop),
                Value::Text(s) => tx
                    .put_object(&obj, key, ObjType::Text)
                    .and_then(|t| tx.splice_text(&t, 0, 0, s)),
                Value::Delete => tx.delete(&obj, key),
                Value::Increment(by) => tx.increment(&obj, key, *by),
                v => match scalar(v) {
                    Some(s) => tx.put(&obj, key, s),
                    None => Ok(()),
                },
            };
        }
        ObjType::List => {
            let len = tx.length(&obj);
            let i = index_of(key, len);
            let _ = match (&op.value, i < len) {
                (Value::Map, _) => tx.insert_object(&obj, i, ObjType::Map).map(drop),
                (Value::List, _) => tx.insert_object(&obj, i, ObjType::List).map(drop),
                (Value::Text(s), _) => tx
                    .insert_object(&obj, i, ObjType::Text)
                    .and_then(|t| tx.splice_text(&t, 0, 0, s)),
                (Value::Delete, true) => tx.delete(&obj, i),
                (Value::Increment(by), true) => tx.increment(&obj, i, *by),
                (Value::Delete | Value::Increment(_), false) => Ok(()),
                (v, in_list) => match scalar(v) {
                    Some(s) if in_list => tx.put(&obj, i, s),
                    Some(s) => tx.insert(&obj, i, s),
                    None => Ok(()),
                },
            };
        }
        ObjType::Text => {
            let len = tx.length(&obj);
            let _ = tx.splice_text(&obj, index_of(key, len), 0, &format!("{:?}", op.value));
        }
    }
}

fn commit_ops(doc: &mut Automerge, ops: &[Op]) {
    if ops.is_empty() {
        return;
    }
    let mut tx = doc.transaction();
    for op in ops {
        write(&mut tx, op);
    }
    tx.commit();
}

/// Applies one batch to `doc`: its writes, and the concurrent writes of a second writer
/// merged in.
pub fn apply(doc: &mut Automerge, batch: &Batch) {
    let mut other = (!batch.concurrent.is_empty()).then(|| {
        let mut f = doc.fork();
        f.set_actor(actor(9));
        f
    });
    commit_ops(doc, &batch.ops);
    if let Some(other) = &mut other {
        commit_ops(other, &batch.concurrent);
        doc.merge(other).expect("a fork merges back");
    }
}

// ----- reading it as a node does -----

/// A whole read of `doc` must equal what `cache` shows once refreshed.
pub fn refresh_agrees(cache: &mut ViewCache, doc: &Automerge) {
    let whole = QueueView::read(doc);
    let cached = cache.refresh(doc).map(|v| (**v).clone());
    assert_eq!(
        cached, whole,
        "a view refreshed from the changes is the whole read of the document"
    );
}

/// Reads `doc` in every way a node reads a queue document (and a task document), checking
/// what must hold whatever it holds.
pub fn read_as_queue(doc: &Automerge) {
    let mut cache = ViewCache::new();
    refresh_agrees(&mut cache, doc);
    read_chain(doc);
    let _ = task::read(doc);
    let _ = task::read_input(doc);
    if let Some(view) = QueueView::read(doc) {
        use_view(doc, &view);
    }
}

fn read_chain(doc: &Automerge) {
    let _ = epoch::read_epoch(doc);
    let _ = epoch::effective_claim(doc);
    let _ = epoch::read_latest(doc);
    let _ = epoch::read_retired(doc);
    let seals = epoch::read_seals(doc);
    let _ = epoch::winner(&seals);
    for s in &seals {
        let _ = epoch::seal_heads(doc, &s.successor);
    }
    let lineage = epoch::read_lineage(doc);
    assert!(
        lineage.len() <= epoch::MAX_LINEAGE,
        "{} links",
        lineage.len()
    );
    check_lineages(&lineage, &lineage);
    let _ = epoch::on_lineage(&lineage, QUEUE, Some(0));
    let covers = epoch::read_covers(doc);
    let t1 = TaskId::new(TASKS[0]);
    for (of, c) in &covers {
        assert!(epoch::read_cover(doc, of).is_some_and(|one| one.includes(c)));
        let _ = epoch::entry_covered(doc, c, &t1);
    }
    let _ = epoch::entry_carried(doc, &t1);
    let _ = epoch::carried_marks(doc, QUEUE);
    if let Some(prev) = epoch::read_prev(doc) {
        let _ = epoch::carried_marks(doc, &prev.doc);
        let _ = epoch::known_at(doc, &prev.heads, &t1);
    }
}

fn use_view(doc: &Automerge, view: &QueueView) {
    let c = view.counts();
    let counted = c.pending + c.assigned + c.running + c.input_unavailable + c.succeeded + c.failed;
    assert_eq!(counted, view.tasks().len(), "every task is counted once");
    let _ = view.total_counts();
    let _ = view.routable_version();
    assert_eq!(
        view.pending().len(),
        c.pending,
        "every pending task is routable"
    );
    let _ = view.retrying().count();
    let _ = view.input_unavailable().count();
    let _ = view.open_attempts();
    for (p, _) in view.open_peers() {
        let _ = view.open_attempts_of(p).count();
    }
    for t in view.tasks().values() {
        let _ = (t.state(), t.failures(), t.refusals(), t.last_n());
        let _ = t.current_attempts().count();
        assert_eq!(
            epoch::task_entry(doc, &t.id).as_ref(),
            Some(&**t),
            "a task read alone is the view's"
        );
        let _ = piecework_queue_doc::read_outputs(doc, &t.id);
        assert!(epoch::indexes(doc, &t.id));
    }
    let _ = epoch::should_rotate(&c, 1, 1);
    // The router rotates it, and carries its writes into the successor.
    let origin = view.origin.clone().unwrap_or_else(|| QueueId::new(QUEUE));
    let claim = Claim::new(
        view.router.as_ref().map_or(1, |r| r.term.saturating_add(1)),
        peer(PEER_A),
    );
    let r = Rotation {
        origin: &origin,
        prev: QUEUE,
        successor: SUCCESSOR,
        epoch: view.epoch.saturating_add(1),
        claim: &claim,
        now_ms: 3_000,
    };
    let mut succ = Automerge::new();
    succ.set_actor(actor(4));
    if epoch::build_successor(doc, view, &mut succ, &r).is_ok() {
        let built = QueueView::read(&succ).expect("a built successor is a queue");
        assert!(built.tasks().values().all(|t| !t.state().is_final()));
        let _ = epoch::carry_covering(
            doc,
            &[],
            &mut succ,
            &|_| false,
            Some(QUEUE),
            Some((QUEUE, view.epoch)),
            64,
        );
        let _ = epoch::carry_records(doc, &mut succ, &[TaskId::new(TASKS[3])]);
        let mut cache = ViewCache::new();
        refresh_agrees(&mut cache, &succ);
    }
}

/// Compares lineages both ways: bounded work, an antisymmetric order, equal to itself.
pub fn check_lineages(a: &[Link], b: &[Link]) {
    let (ab, looked) = epoch::cmp_lineage_counted(a, b);
    assert!(
        looked <= a.len() + b.len(),
        "looked at {looked} epochs for {} and {} links",
        a.len(),
        b.len()
    );
    let (ba, looked) = epoch::cmp_lineage_counted(b, a);
    assert!(looked <= a.len() + b.len());
    assert_eq!(ab, ba.reverse(), "the order is antisymmetric");
    assert_eq!(epoch::cmp_lineage(a, a), Ordering::Equal);
}

// ----- the targets -----

/// Target `queue_document`: the bytes as a whole document, and as changes arriving at each
/// base document (a view of it cached before they arrive), read as a queue.
pub fn queue_document(data: &[u8]) {
    if let Ok(doc) = Automerge::load(data) {
        read_as_queue(&doc);
    }
    for n in 0..bases().len() {
        let mut doc = base(n);
        let mut cache = ViewCache::new();
        refresh_agrees(&mut cache, &doc);
        // A load that fails part way may have applied some changes: read whatever it left.
        let _ = doc.load_incremental(data);
        refresh_agrees(&mut cache, &doc);
        read_as_queue(&doc);
    }
}

/// Target `packed_record`: the bytes (as text) written as every packed record of the base
/// documents at once (task entries, assignments, starts, ends, outputs, input marks, seals,
/// the latest epoch, the retired counts, covers, carry marks, a lineage and heads), over
/// records there and under new keys, then read as a queue, incrementally and whole.
pub fn packed_record(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let at = |path: &[&str], key: &str| Op {
        path: path.iter().map(|s| (*s).to_owned()).collect(),
        key: key.to_owned(),
        value: Value::Str(text.clone()),
    };
    let ops = vec![
        at(&["tasks"], TASKS[0]),
        at(&["tasks"], "automerge:new"),
        at(&["assigned"], "automerge:t1/1/1/peer-a"),
        at(&["assigned"], "automerge:t4/1/1/peer-a"),
        at(&["started"], "automerge:t3/1/1/peer-a"),
        at(&["ended"], "automerge:t2/1/1/peer-a"),
        at(&["ended"], "automerge:t4/1/1/peer-a"),
        at(&["output"], "automerge:t2/1/1/peer-a"),
        at(&["seen"], TASKS[3]),
        at(&["seals"], SUCCESSOR),
        at(&["seals"], QUEUE),
        at(&[], "latest"),
        at(&[], "retired"),
        at(&[], "lineage"),
        at(&[], "prev_heads"),
        at(&["covered"], QUEUE),
        at(&["carried_from"], QUEUE),
    ];
    for n in 0..bases().len() {
        let mut doc = base(n);
        let mut cache = ViewCache::new();
        refresh_agrees(&mut cache, &doc);
        apply(
            &mut doc,
            &Batch {
                ops: ops.clone(),
                concurrent: vec![],
            },
        );
        refresh_agrees(&mut cache, &doc);
        read_as_queue(&doc);
    }
}

/// The links of a lineage spelled by `data`, 17 bytes a link: epoch and term (little-endian
/// `u64`s), then one byte choosing the sealer and the document.
pub fn links_of(data: &[u8]) -> Vec<Link> {
    data.chunks_exact(17)
        .map(|c| {
            let mut e = [0u8; 8];
            let mut t = [0u8; 8];
            e.copy_from_slice(&c[..8]);
            t.copy_from_slice(&c[8..16]);
            let pick = c[16];
            Link {
                epoch: u64::from_le_bytes(e),
                claim: Claim::new(
                    u64::from_le_bytes(t),
                    peer(["peer-a", "peer-b", ""][usize::from(pick % 3)]),
                ),
                doc: ["d0", "d1", "d2", SUCCESSOR][usize::from(pick / 3 % 4)].into(),
            }
        })
        .collect()
}

/// Target `lineage`: the bytes as the lineage a peer wrote into a successor (JSON text), and
/// as links themselves ([`links_of`]), compared with the honest lineage and each other.
pub fn lineage(data: &[u8]) {
    let honest = epoch::read_lineage(&bases()[1]);
    let mut doc = base(1);
    apply(
        &mut doc,
        &Batch {
            ops: vec![Op {
                path: vec![],
                key: "lineage".into(),
                value: Value::Str(String::from_utf8_lossy(data).into_owned()),
            }],
            concurrent: vec![],
        },
    );
    let written = epoch::read_lineage(&doc);
    assert!(written.len() <= epoch::MAX_LINEAGE);
    check_lineages(&written, &honest);
    let spelled = links_of(data);
    check_lineages(&spelled, &honest);
    check_lineages(&spelled, &written);
    let half = &spelled[..spelled.len() / 2];
    check_lineages(&spelled, half);
    for l in &spelled {
        let _ = epoch::on_lineage(&spelled, &l.doc, Some(l.epoch));
        let _ = epoch::on_lineage(&honest, &l.doc, Some(l.epoch));
    }
}

/// Writes spelled by bytes, for [`queue_ops`]: the first byte picks the base document; then
/// each write takes a byte for its kind and path length, one per path key and one for its
/// key (indexes into [`KEYS`]), and a value from the bytes after.
pub fn batches_of(data: &[u8]) -> (usize, Vec<Batch>) {
    let mut it = data.iter().copied();
    let base = usize::from(it.next().unwrap_or(0));
    let mut batches = vec![Batch::default()];
    let mut concurrent = false;
    let key = |b: u8| KEYS[usize::from(b) % KEYS.len()].to_owned();
    while let Some(c) = it.next() {
        match c % 8 {
            7 => {
                batches.push(Batch::default());
                concurrent = false;
                continue;
            }
            6 => {
                concurrent = !concurrent;
                continue;
            }
            _ => {}
        }
        let depth = usize::from(c >> 3) % 4;
        let path: Vec<String> = it.by_ref().take(depth).map(key).collect();
        let k = key(it.next().unwrap_or(0));
        let mut next8 = || {
            let mut b = [0u8; 8];
            for x in &mut b {
                *x = it.next().unwrap_or(0);
            }
            b
        };
        let kind = next8();
        let n = u64::from_le_bytes(next8());
        let value = match kind[0] % 16 {
            0 | 1 => Value::Str(STRINGS[(n % STRINGS.len() as u64) as usize].to_owned()),
            2 => Value::Str(String::from_utf8_lossy(&kind[1..]).into_owned()),
            3 => Value::Uint(n),
            4 => Value::Int(n as i64),
            5 => Value::F64(f64::from_bits(n)),
            6 => Value::Bool(n % 2 == 0),
            7 => Value::Null,
            8 => Value::Bytes(kind[1..].to_vec()),
            9 => Value::Counter(n as i64),
            10 => Value::Timestamp(n as i64),
            11 => Value::Unknown(kind[1], kind[2..].to_vec()),
            12 => Value::Map,
            13 => Value::List,
            14 => Value::Delete,
            _ => Value::Increment(n as i64),
        };
        let op = Op {
            path,
            key: k,
            value,
        };
        let last = batches.last_mut().expect("one batch at least");
        match concurrent {
            true => last.concurrent.push(op),
            false => last.ops.push(op),
        }
    }
    (base, batches)
}

/// The bytes [`batches_of`] reads as one write: `value_kind` as its first value byte (0: a
/// string of [`STRINGS`], 3: an unsigned integer, 12: a map, 13: a list, 14: a delete; see
/// [`batches_of`]) and `n` as the number after (which string, or the integer). Path and key
/// must be among [`KEYS`].
pub fn spell_op(path: &[&str], key: &str, value_kind: u8, n: u64) -> Vec<u8> {
    let at = |k: &str| {
        let i = KEYS.iter().position(|x| *x == k).expect("a key of KEYS");
        u8::try_from(i).expect("fewer than 256 keys")
    };
    assert!(path.len() < 4);
    let depth = u8::try_from(path.len()).expect("a short path");
    let mut out = vec![depth << 3];
    out.extend(path.iter().map(|k| at(k)));
    out.push(at(key));
    out.push(value_kind);
    out.extend([0u8; 7]);
    out.extend(n.to_le_bytes());
    out
}

/// The index of a string in [`STRINGS`].
pub fn string_index(s: &str) -> u64 {
    STRINGS
        .iter()
        .position(|x| *x == s)
        .expect("a string of STRINGS") as u64
}

/// Writes to a base document, batch by batch, each followed by a refresh of a cached view
/// (incremental) that must equal a whole read; then the document read as a queue in every
/// way, and read again from its own save.
pub fn queue_with_batches(base_n: usize, batches: &[Batch]) {
    let mut doc = base(base_n);
    let mut cache = ViewCache::new();
    refresh_agrees(&mut cache, &doc);
    for b in batches {
        apply(&mut doc, b);
        refresh_agrees(&mut cache, &doc);
    }
    read_as_queue(&doc);
    let loaded = Automerge::load(&doc.save()).expect("a saved document loads");
    assert_eq!(QueueView::read(&loaded), QueueView::read(&doc));
}

/// The header of a change a peer crafts instead of letting Automerge write it: any first
/// operation counter, sequence number, time and dependencies.
#[derive(Clone, Debug)]
pub struct Header {
    /// The first operation's counter (0 is taken as 1).
    pub start_op: u64,
    /// The change's number among its actor's (`None`: as Automerge wrote it).
    pub seq: Option<u64>,
    /// Its time.
    pub time: i64,
    /// Its dependencies: as written (0), none (1), or the base document's heads (2).
    pub deps: u8,
}

/// A change of `ops` (one writer, from a base document's heads) with its header replaced by
/// `header`, applied to the base document (whose view is cached); the document is then read as
/// a queue, incrementally and whole. Automerge may refuse the change: that is fine.
pub fn crafted_change(base_n: usize, ops: &[Op], header: &Header) {
    let mut doc = base(base_n);
    let mut cache = ViewCache::new();
    refresh_agrees(&mut cache, &doc);
    let mut fork = doc.fork();
    fork.set_actor(actor(8));
    commit_ops(&mut fork, ops);
    let Some(change) = fork.get_changes(&doc.get_heads()).pop() else {
        return;
    };
    let mut e = change.decode();
    e.hash = None;
    e.start_op = std::num::NonZeroU64::new(header.start_op).unwrap_or(std::num::NonZeroU64::MIN);
    if let Some(seq) = header.seq {
        e.seq = seq;
    }
    e.time = header.time;
    match header.deps % 3 {
        1 => e.deps.clear(),
        2 => e.deps = doc.get_heads(),
        _ => {}
    }
    let crafted = automerge::Change::from(e);
    let _ = doc.apply_changes([crafted]);
    refresh_agrees(&mut cache, &doc);
    read_as_queue(&doc);
}

/// Target `queue_ops`: writes spelled by the bytes ([`batches_of`]) made to a base document.
pub fn queue_ops(data: &[u8]) {
    let (base_n, batches) = batches_of(data);
    queue_with_batches(base_n, &batches);
}
