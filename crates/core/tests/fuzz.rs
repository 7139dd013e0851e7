//! Fuzzing of what a node takes from peers besides its own documents, as property tests that
//! run in CI (the same harnesses run for longer under cargo-fuzz, `fuzz/README.md`).
//!
//! Fed, to a core that joined a queue and is connected to its two members and a stranger:
//! any bytes and any heartbeats (router and pool, every field at its extremes, naming the
//! sender or not) as gossip on the queue's topic; any bytes, any status questions and replica
//! frames with any payload on sync streams; and any writes by a member to the queue document
//! (the values `crates/queue-doc/tests/fuzz.rs` writes) synced in over Automerge's sync
//! protocol. After each, the node goes on for ten minutes (its router and pool act on what
//! they were sent). Every seed of the corpus (`fuzz/corpus/{gossip,sync_frame,queue_changes}/`)
//! is replayed too.
//!
//! What must hold (`fuzz/harness/core.rs`): no panic; a heartbeat or question that decodes
//! re-encodes to itself; the core's output after each input ends; its timers never spin (a
//! deadline at the instant they fired is fired again, and within a few firings lies ahead).

#[path = "../../../fuzz/harness/core.rs"]
mod core_harness;
#[path = "../../../fuzz/harness/corpus.rs"]
mod corpus;
#[path = "../../../fuzz/harness/queue_doc.rs"]
mod queue_doc_harness;

use core_harness as ch;
use piecework_core::{Ask, Wire};
use piecework_queue_doc::epoch::Latest;
use piecework_queue_doc::{
    AttemptId, Claim, MAX_TERM, PeerId, PoolBeat, QueueId, RouterBeat, RunningReport, TaskId,
    WorkerReport,
};
use piecework_replica::{DocId, Message};
use proptest::prelude::*;
use proptest::sample::select;
use queue_doc_harness::{self as qd, Batch, Op, Value};

// ----- the corpus -----

#[test]
fn every_gossip_seed_is_taken() {
    for (name, bytes) in corpus::seeds("gossip") {
        eprintln!("gossip/{name}");
        ch::gossip(&bytes);
    }
}

#[test]
fn every_sync_frame_seed_is_taken() {
    for (name, bytes) in corpus::seeds("sync_frame") {
        eprintln!("sync_frame/{name}");
        ch::sync_frame(&bytes);
    }
}

#[test]
fn every_queue_changes_seed_is_taken() {
    for (name, bytes) in corpus::seeds("queue_changes") {
        eprintln!("queue_changes/{name}");
        ch::queue_changes(&bytes);
    }
}

/// The seeds are what a node meets when nothing is wrong: heartbeats of the queue's members,
/// status questions and answers, replica frames, a member's writes.
#[test]
#[ignore = "writes fuzz/corpus/{gossip,sync_frame,queue_changes}: run by hand"]
fn write_seed_corpus() {
    let q = QueueId::new(ch::QUEUE);
    let other = PeerId::new(ch::OTHER);
    let latest = Latest {
        epoch: 1,
        doc: qd::SUCCESSOR.into(),
    };
    let router = |epoch: Option<Latest>, handover: Option<PeerId>| {
        Wire::Router(RouterBeat {
            queue: q.clone(),
            claim: Claim::new(2, other.clone()),
            counter: 7,
            epoch,
            handover,
        })
    };
    let running = RunningReport {
        queue: q.clone(),
        task: TaskId::new(qd::TASKS[0]),
        attempt: AttemptId {
            n: 1,
            claim: Claim::new(2, other.clone()),
        },
        overdue: false,
        progress: None,
    };
    let pool = |draining: bool| {
        Wire::Pool(PoolBeat {
            peer: other.clone(),
            incarnation: 1,
            counter: 3,
            workers: vec![
                WorkerReport {
                    index: 0,
                    running: Some(running.clone()),
                },
                WorkerReport {
                    index: 1,
                    running: None,
                },
            ],
            epoch: Some(latest.clone()),
            draining,
            kinds: None,
            resources: Vec::new(),
        })
    };
    for (name, w) in [
        ("router", router(None, None)),
        ("router_epoch", router(Some(latest.clone()), None)),
        ("router_handover", router(None, Some(PeerId::new(ch::ME)))),
        ("pool", pool(false)),
        ("pool_draining", pool(true)),
    ] {
        corpus::write("gossip", name, &w.encode());
    }

    let task = TaskId::new(qd::TASKS[1]);
    corpus::write(
        "sync_frame",
        "ask_status",
        &Ask::Status { task: task.clone() }.encode(),
    );
    corpus::write(
        "sync_frame",
        "ask_answer",
        &Ask::Answer {
            task,
            status: Some(serde_json::json!({"id": qd::TASKS[1], "state": "succeeded"})),
        }
        .encode(),
    );
    let qdoc = DocId::parse(ch::QUEUE).unwrap();
    corpus::write(
        "sync_frame",
        "request_queue",
        &Message::Request { doc: qdoc.clone() }.encode(),
    );
    // The first sync message of a member holding the queue document.
    let theirs = ch::queue_document();
    let mut state = automerge::sync::State::new();
    let first = automerge::sync::SyncDoc::generate_sync_message(theirs, &mut state)
        .expect("a first message");
    corpus::write(
        "sync_frame",
        "sync_queue",
        &Message::Sync {
            doc: qdoc,
            data: first.encode(),
        }
        .encode(),
    );

    let s = qd::string_index;
    let mut claim = vec![0u8];
    claim.extend(qd::spell_op(&["router"], "term", 3, 9));
    claim.extend(qd::spell_op(&["router"], "peer", 0, s("peer-a")));
    corpus::write("queue_changes", "router_claim", &claim);
    let mut assign = vec![0u8];
    assign.extend(qd::spell_op(
        &["assigned"],
        "automerge:t1/1/1/peer-a",
        0,
        s(r#"{"w":"peer-a/0","i":1,"a":1}"#),
    ));
    corpus::write("queue_changes", "assignment", &assign);
    let mut pause = vec![0u8];
    pause.extend(qd::spell_op(&[], "paused", 3, 1));
    pause.push(7);
    pause.extend(qd::spell_op(&["config"], "heartbeat_ms", 3, u64::MAX));
    corpus::write("queue_changes", "pause_and_config", &pause);
}

// ----- generated inputs -----

fn number() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..5,
        1 => Just(u64::MAX),
        1 => Just(MAX_TERM),
        1 => Just(MAX_TERM + 1),
        1 => any::<u64>(),
    ]
}

/// A peer: the sender or not.
fn peer() -> impl Strategy<Value = PeerId> {
    select(&[ch::OTHER, ch::SECOND, ch::STRANGER, ch::ME, ""][..]).prop_map(PeerId::new)
}

fn queue() -> impl Strategy<Value = QueueId> {
    select(&[ch::QUEUE, qd::SUCCESSOR, "automerge:x", ""][..]).prop_map(QueueId::new)
}

fn latest() -> impl Strategy<Value = Option<Latest>> {
    proptest::option::of(
        (
            number(),
            select(&[ch::QUEUE, qd::SUCCESSOR, "automerge:x", "not a document"][..]),
        )
            .prop_map(|(epoch, doc)| Latest {
                epoch,
                doc: doc.into(),
            }),
    )
}

fn claim() -> impl Strategy<Value = Claim> {
    (number(), peer()).prop_map(|(t, p)| Claim::new(t, p))
}

fn wire() -> impl Strategy<Value = Wire> {
    let router = (
        queue(),
        claim(),
        number(),
        latest(),
        proptest::option::of(peer()),
    )
        .prop_map(|(queue, claim, counter, epoch, handover)| {
            Wire::Router(RouterBeat {
                queue,
                claim,
                counter,
                epoch,
                handover,
            })
        });
    let report = (
        prop_oneof![0u32..4, Just(255), Just(256), Just(u32::MAX)],
        proptest::option::of(
            (queue(), select(&qd::TASKS[..]), number(), claim()).prop_map(
                |(queue, task, n, claim)| RunningReport {
                    queue,
                    task: TaskId::new(task),
                    attempt: AttemptId { n, claim },
                    overdue: false,
                    progress: None,
                },
            ),
        ),
    )
        .prop_map(|(index, running)| WorkerReport { index, running });
    let pool = (
        peer(),
        number(),
        number(),
        prop::collection::vec(report, 0..6),
        latest(),
        any::<bool>(),
    )
        .prop_map(|(peer, incarnation, counter, workers, epoch, draining)| {
            Wire::Pool(PoolBeat {
                peer,
                incarnation,
                counter,
                workers,
                epoch,
                draining,
                kinds: None,
                resources: Vec::new(),
            })
        });
    prop_oneof![router, pool]
}

fn ask() -> impl Strategy<Value = Ask> {
    let task = select(&qd::TASKS[..]).prop_map(TaskId::new);
    let status = proptest::option::of(prop_oneof![
        Just(serde_json::json!(null)),
        Just(serde_json::json!({"id": qd::TASKS[0], "state": "succeeded"})),
        Just(serde_json::json!({"id": 1, "state": []})),
        ".{0,12}".prop_map(serde_json::Value::from),
    ]);
    prop_oneof![
        task.clone().prop_map(|task| Ask::Status { task }),
        (task, status).prop_map(|(task, status)| Ask::Answer { task, status }),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => select(qd::STRINGS).prop_map(|s| Value::Str(s.to_owned())),
        2 => number().prop_map(Value::Uint),
        1 => any::<i64>().prop_map(Value::Int),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => Just(Value::Null),
        1 => Just(Value::Map),
        1 => Just(Value::List),
        1 => Just(Value::Delete),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    (
        prop::collection::vec(select(qd::KEYS).prop_map(str::to_owned), 0..3),
        select(qd::KEYS).prop_map(str::to_owned),
        value(),
    )
        .prop_map(|(path, key, value)| Op { path, key, value })
}

fn batch() -> impl Strategy<Value = Batch> {
    (
        prop::collection::vec(op(), 0..8),
        prop_oneof![2 => Just(vec![]), 1 => prop::collection::vec(op(), 1..4)],
    )
        .prop_map(|(ops, concurrent)| Batch { ops, concurrent })
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(48))]

    /// Any bytes as gossip.
    #[test]
    fn any_bytes_as_gossip_are_dropped_or_taken(
        bytes in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        ch::gossip(&bytes);
    }

    /// Any heartbeat, naming its sender or another, this queue or another.
    #[test]
    fn any_heartbeat_is_taken_or_rejected(w in wire()) {
        ch::gossip(&w.encode());
    }

    /// Any bytes as a sync frame, and as the payload of a frame about the queue.
    #[test]
    fn any_bytes_as_a_sync_frame_are_taken_or_rejected(
        bytes in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        ch::sync_frame(&bytes);
    }

    /// Any status question or answer on a sync stream.
    #[test]
    fn any_status_question_is_answered_or_rejected(a in ask()) {
        ch::sync_frame(&a.encode());
    }

    /// Any writes of a member to the queue document, synced in.
    #[test]
    fn any_writes_of_a_member_leave_the_node_running(
        batches in prop::collection::vec(batch(), 1..3),
    ) {
        ch::queue_from_member(&batches);
    }
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(256))]

    /// Decoding alone, on many more inputs: any bytes, and JSON of a heartbeat's shape.
    #[test]
    fn gossip_and_questions_decode_or_are_none(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        w in wire(),
        a in ask(),
    ) {
        ch::check_wire(&bytes);
        ch::check_ask(&bytes);
        let mut asked = vec![piecework_core::wire::ASK_FRAME];
        asked.extend(&bytes);
        ch::check_ask(&asked);
        ch::check_wire(&w.encode());
        ch::check_ask(&a.encode());
        let json = w.encode();
        // Every prefix of a heartbeat (a frame cut short).
        for cut in 0..json.len() {
            prop_assert!(Wire::decode(&json[..cut]).is_none());
        }
    }
}
