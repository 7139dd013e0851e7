//! Fuzzing of what a node reads of the queue documents peers write, as property tests that run
//! in CI (the same harnesses run for longer under cargo-fuzz, `fuzz/README.md`).
//!
//! Fed: any bytes loaded as a whole document or as changes arriving at a queue a node already
//! reads (a cached view refreshed incrementally); saved queues and changes with bytes changed;
//! any writes (scalars of every type, objects, deletes, increments; alone or concurrent with a
//! second writer's) at the schema's keys: the router record, members, configuration, task
//! index entries of both layouts, packed records, seals, covers, lineages; packed records of
//! any shape under every packed key; lineages of any links. Every seed of the corpus
//! (`fuzz/corpus/{queue_document,packed_record,lineage,queue_ops}/`) is replayed too.
//!
//! What must hold (`fuzz/harness/queue_doc.rs`): no panic; a view refreshed from changes is
//! the whole read of the document; a task's entry read alone is the view's; the counts add up
//! to the tasks; a lineage holds at most `MAX_LINEAGE` links, and comparing two looks at most
//! at one epoch per link, in an antisymmetric order.

#[path = "../../../fuzz/harness/corpus.rs"]
mod corpus;
#[path = "../../../fuzz/harness/queue_doc.rs"]
mod queue_doc_harness;

use automerge::Automerge;
use piecework_queue_doc::epoch::{self, Link};
use piecework_queue_doc::{Claim, PeerId, QueueView};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use queue_doc_harness::{self as qd, Batch, Op, Value};

// ----- the corpus -----

#[test]
fn every_queue_document_seed_reads() {
    for (name, bytes) in corpus::seeds("queue_document") {
        eprintln!("queue_document/{name}");
        qd::queue_document(&bytes);
    }
}

#[test]
fn every_packed_record_seed_reads() {
    for (name, bytes) in corpus::seeds("packed_record") {
        eprintln!("packed_record/{name}");
        qd::packed_record(&bytes);
    }
}

#[test]
fn every_lineage_seed_compares() {
    for (name, bytes) in corpus::seeds("lineage") {
        eprintln!("lineage/{name}");
        qd::lineage(&bytes);
    }
}

#[test]
fn every_queue_ops_seed_reads() {
    for (name, bytes) in corpus::seeds("queue_ops") {
        eprintln!("queue_ops/{name}");
        qd::queue_ops(&bytes);
    }
}

/// The seeds are valid inputs (what a node meets when nothing is wrong): a queue's first
/// document and its successor, a change, every kind of packed record, lineages.
#[test]
#[ignore = "writes fuzz/corpus/{queue_document,packed_record,lineage,queue_ops}: run by hand"]
fn write_seed_corpus() {
    let [first, succ, empty] = qd::bases();
    corpus::write("queue_document", "first_epoch", &first.save());
    corpus::write("queue_document", "successor", &succ.save());
    corpus::write("queue_document", "empty", &empty.save());
    // A change arriving at a queue: a submit, alone.
    let mut doc = first.clone();
    let heads = doc.get_heads();
    piecework_queue_doc::queue::submit(
        &mut doc,
        &piecework_queue_doc::Submission {
            id: piecework_queue_doc::TaskId::new("automerge:late"),
            kind: "k".into(),
            submitter: PeerId::new(qd::PEER_B),
            submitted_at: 5_000,
            priority: 1,
            urgent: false,
            max_attempts: None,
            input: Some("[1]".into()),
            rules: Default::default(),
        },
    )
    .unwrap();
    corpus::write("queue_document", "submit_change", &doc.save_after(&heads));

    for (name, text) in [
        (
            "entry",
            r#"{"k":"k","t":1,"s":"peer-b","p":2,"u":false,"m":3}"#,
        ),
        (
            "entry_inline",
            r#"{"k":"k","t":1,"s":"peer-b","m":3,"i":"{\"to\":\"ada\"}"}"#,
        ),
        ("assigned", r#"{"w":"peer-a/0","i":1,"a":1020}"#),
        ("started", r#"{"a":1030,"i":1}"#),
        ("ended", r#"{"a":1040,"o":"succeeded"}"#),
        ("ended_error", r#"{"a":1040,"o":"failed","e":"boom"}"#),
        ("output", r#"{"r":"1","l":["line"]}"#),
        (
            "seal",
            r#"{"e":1,"t":2,"p":"peer-a","h":"0000000000000000000000000000000000000000000000000000000000000000"}"#,
        ),
        (
            "latest",
            r#"{"e":1,"d":"automerge:2ZqJmwUE7jSb5WMa7QyiABaK7mS9"}"#,
        ),
        ("retired", r#"{"succeeded":3,"failed":1}"#),
        (
            "cover",
            r#"{"e":0,"c":{"01010101010101010101010101010101":12}}"#,
        ),
        (
            "heads",
            "0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ] {
        corpus::write("packed_record", name, text.as_bytes());
    }

    let honest = epoch::read_lineage(succ);
    corpus::write(
        "lineage",
        "honest.json",
        serde_json::to_string(&honest).unwrap().as_bytes(),
    );
    let long: Vec<Link> = (1..=70).map(|e| link(e, e, 0, 0)).collect();
    corpus::write(
        "lineage",
        "seventy_links.json",
        serde_json::to_string(&long).unwrap().as_bytes(),
    );
    let forged = vec![link(1, 2, 0, 3), link(u64::MAX, 9, 1, 1)];
    corpus::write(
        "lineage",
        "forged.json",
        serde_json::to_string(&forged).unwrap().as_bytes(),
    );
    // Links spelled as `qd::links_of` reads them.
    let mut spelled = Vec::new();
    for (e, t, pick) in [(1u64, 2u64, 9u8), (2, 3, 0), (u64::MAX, u64::MAX, 4)] {
        spelled.extend(e.to_le_bytes());
        spelled.extend(t.to_le_bytes());
        spelled.push(pick);
    }
    corpus::write("lineage", "spelled_links", &spelled);

    let s = qd::string_index;
    let submit_entry = s(r#"{"k":"k","t":1,"s":"peer-a","m":3}"#);
    let mut entry = qd::spell_op(&["tasks"], "automerge:t4", 0, submit_entry);
    entry.insert(0, 0); // the first base
    corpus::write("queue_ops", "task_entry", &entry);
    // Two routers claim at once: conflicting router records.
    let mut claims = vec![1u8];
    claims.extend(qd::spell_op(&["router"], "term", 3, 7));
    claims.extend(qd::spell_op(&["router"], "peer", 0, s("peer-a")));
    claims.push(6); // the second writer
    claims.extend(qd::spell_op(&["router"], "term", 3, 7));
    claims.extend(qd::spell_op(&["router"], "peer", 0, s("peer-b/4294967295")));
    corpus::write("queue_ops", "concurrent_claims", &claims);
    // An assignment, a start and an end of a pending task, in three changes.
    let mut run = vec![0u8];
    let key = "automerge:t4/1/1/peer-a";
    run.extend(qd::spell_op(
        &["assigned"],
        key,
        0,
        s(r#"{"w":"peer-a/0","i":1,"a":1}"#),
    ));
    run.push(7);
    run.extend(qd::spell_op(&["started"], key, 0, s(r#"{"a":1,"i":1}"#)));
    run.push(7);
    run.extend(qd::spell_op(
        &["ended"],
        key,
        0,
        s(r#"{"a":1,"o":"succeeded"}"#),
    ));
    corpus::write("queue_ops", "assign_start_end", &run);
    // A layout-1 attempt's end rewritten.
    let mut layout1 = vec![0u8];
    layout1.extend(qd::spell_op(
        &["tasks", "automerge:t5", "attempts"],
        "0",
        12,
        0,
    ));
    corpus::write("queue_ops", "layout1_attempt", &layout1);
}

fn link(epoch: u64, term: u64, peer: usize, doc: usize) -> Link {
    Link {
        epoch,
        claim: Claim::new(term, PeerId::new(["peer-a", "peer-b", ""][peer % 3])),
        doc: ["d0", "d1", "d2", qd::SUCCESSOR][doc % 4].into(),
    }
}

// ----- generated inputs -----

/// Numbers where readers cut, clamp or overflow, and any.
fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..5,
        1 => Just(u64::MAX),
        1 => Just(u64::MAX - 1),
        1 => Just(u64::from(u32::MAX)),
        1 => Just(u64::from(u32::MAX) + 1),
        1 => Just(i64::MAX as u64),
        1 => Just((i64::MAX as u64) + 1),
        1 => Just(piecework_queue_doc::MAX_TERM),
        1 => Just(piecework_queue_doc::MAX_TERM + 1),
        2 => any::<u64>(),
    ]
}

/// A JSON value shaped like a packed record: objects with the packed layout's field names
/// (and the lineage's and covers'), holding any JSON.
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value as J;
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::from),
        any::<i64>().prop_map(J::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(J::Null, J::Number)),
        select(qd::STRINGS).prop_map(J::from),
        ".{0,8}".prop_map(J::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(J::Array),
            prop::collection::btree_map(
                select(
                    &[
                        "k",
                        "t",
                        "s",
                        "p",
                        "u",
                        "m",
                        "i",
                        "w",
                        "a",
                        "o",
                        "e",
                        "r",
                        "l",
                        "d",
                        "h",
                        "c",
                        "epoch",
                        "claim",
                        "term",
                        "peer",
                        "doc",
                        "succeeded",
                        "failed",
                    ][..]
                ),
                inner,
                0..7
            )
            .prop_map(|m| J::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    })
}

/// Text a peer may write: the schema's words, packed records, JSON of their shape, anything.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(qd::STRINGS).prop_map(str::to_owned),
        3 => json().prop_map(|j| j.to_string()),
        1 => any::<String>(),
        1 => "[0-9a-f]{64}(,[0-9a-f]{0,64}){0,3}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(qd::KEYS).prop_map(str::to_owned),
        1 => "[a-z0-9:/]{0,14}",
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => text().prop_map(Value::Str),
        2 => number().prop_map(Value::Uint),
        1 => any::<i64>().prop_map(Value::Int),
        1 => any::<f64>().prop_map(Value::F64),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(Value::Bytes),
        1 => any::<i64>().prop_map(Value::Counter),
        1 => any::<i64>().prop_map(Value::Timestamp),
        // The type codes a change can carry that Automerge does not know: 10 to 15 (a
        // value's type is 4 bits of its metadata).
        1 => (10u8..16, prop::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(c, b)| Value::Unknown(c, b)),
        2 => Just(Value::Map),
        1 => Just(Value::List),
        1 => text().prop_map(Value::Text),
        2 => Just(Value::Delete),
        1 => any::<i64>().prop_map(Value::Increment),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop::collection::vec(select(qd::KEYS).prop_map(str::to_owned), 0..4),
        key(),
        value(),
    )
        .prop_map(|(path, key, value)| Op { path, key, value })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        prop::collection::vec(op(), 0..8),
        prop_oneof![
            2 => Just(vec![]),
            1 => prop::collection::vec(op(), 1..6),
        ],
    )
        .prop_map(|(ops, concurrent)| Batch { ops, concurrent })
}

fn links() -> impl Strategy<Value = Vec<Link>> {
    prop::collection::vec(
        (
            prop_oneof![3 => 0u64..12, 1 => number()],
            prop_oneof![3 => 0u64..4, 1 => number()],
            0usize..3,
            0usize..4,
        )
            .prop_map(|(e, t, p, d)| link(e, t, p, d)),
        0..80,
    )
}

/// Bytes of a valid document or change, with some changed and possibly cut short.
fn edited(bytes: Vec<u8>, edits: &[(Index, u8)], cut: Option<Index>) -> Vec<u8> {
    let mut bytes = bytes;
    if bytes.is_empty() {
        return bytes;
    }
    for (at, x) in edits {
        let i = at.index(bytes.len());
        bytes[i] ^= x;
    }
    if let Some(c) = cut {
        bytes.truncate(c.index(bytes.len()));
    }
    bytes
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(256))]

    /// Any bytes, as a document and as changes arriving at each base document.
    #[test]
    fn any_bytes_load_as_nothing_or_a_document_that_reads(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        qd::queue_document(&bytes);
    }

    /// A saved queue document, or a change to one, with bytes changed and cut short.
    #[test]
    fn a_saved_queue_or_change_with_bytes_changed_reads(
        n in 0usize..3,
        change in any::<bool>(),
        edits in prop::collection::vec((any::<Index>(), 1u8..), 0..4),
        cut in proptest::option::of(any::<Index>()),
    ) {
        let base = qd::base(n);
        let bytes = match change {
            false => base.save(),
            true => base
                .get_changes(&[])
                .last()
                .map(|c| c.raw_bytes().to_vec())
                .unwrap_or_default(),
        };
        qd::queue_document(&edited(bytes, &edits, cut));
    }

    /// Any writes a peer can make, at the schema's keys, in batches (some concurrent with a
    /// second writer's): each refresh of a cached view is the whole read, and the document
    /// reads in every way a node reads one.
    #[test]
    fn any_writes_at_the_schema_keys_read_as_a_queue(
        n in 0usize..3,
        batches in prop::collection::vec(batch(), 1..4),
    ) {
        qd::queue_with_batches(n, &batches);
    }

    /// Bytes read as writes, as the `queue_ops` fuzz target reads them.
    #[test]
    fn any_bytes_read_as_writes_read_as_a_queue(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        qd::queue_ops(&bytes);
    }

    /// Text of any shape written as every packed record at once.
    #[test]
    fn packed_records_of_any_shape_read(text in text()) {
        qd::packed_record(text.as_bytes());
    }

    /// Lineages of any links (epochs and terms up to `u64::MAX`, repeated epochs, more links
    /// than a lineage keeps) compare in work bounded by their lengths, antisymmetrically; and
    /// written into a document they read as at most `MAX_LINEAGE` links.
    #[test]
    fn lineages_of_any_links_compare_in_bounded_work(a in links(), b in links()) {
        qd::check_lineages(&a, &b);
        let json = serde_json::to_string(&a).expect("links serialize");
        qd::lineage(json.as_bytes());
        let mut doc = qd::base(1);
        qd::apply(&mut doc, &Batch {
            ops: vec![Op { path: vec![], key: "lineage".into(), value: Value::Str(json) }],
            concurrent: vec![],
        });
        let read = epoch::read_lineage(&doc);
        prop_assert_eq!(read.len(), a.len().min(epoch::MAX_LINEAGE));
    }

    /// Any bytes as a lineage's JSON and as links spelled byte by byte.
    #[test]
    fn any_bytes_as_a_lineage_compare_in_bounded_work(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        qd::lineage(&bytes);
    }
}

/// A document that is not a queue reads as none, whatever else it holds.
#[test]
fn a_document_without_the_queue_schema_is_no_queue() {
    let mut doc = Automerge::new();
    qd::apply(
        &mut doc,
        &Batch {
            ops: vec![Op {
                path: vec!["tasks".into()],
                key: "automerge:t1".into(),
                value: Value::Str(r#"{"k":"k","t":1,"s":"p","m":1}"#.into()),
            }],
            concurrent: vec![],
        },
    );
    assert!(QueueView::read(&doc).is_none());
    assert!(epoch::read_epoch(&doc).is_none());
}
