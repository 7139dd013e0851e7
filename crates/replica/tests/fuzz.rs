//! Fuzzing of the sync frames peers send a replica, as property tests that run in CI (the same
//! harness runs for longer under cargo-fuzz, `fuzz/README.md`).
//!
//! Fed: any bytes, as a frame ([`Message::decode`]) and as the Automerge sync payload of a
//! well-formed frame about a loaded queue document, a stored task document, a task document
//! stored nowhere and a document without a scope, from a member and from a stranger; frames
//! with a well-formed header and any payload; real sync messages with bytes changed. Every
//! seed of the corpus (`fuzz/corpus/replica_message/`) is replayed too.
//!
//! What must hold (`fuzz/harness/replica.rs`): no panic; a frame decodes to a message that
//! round-trips, or to the typed error its header calls for; a payload Automerge cannot decode
//! is `Event::Rejected`; a stranger's frame about a document it may not sync is
//! `Event::Refused`; the replica's output after each input ends, and it never asks for a
//! deadline in the past.

#[path = "../../../fuzz/harness/corpus.rs"]
mod corpus;
#[path = "../../../fuzz/harness/replica.rs"]
mod replica_harness;

use automerge::legacy::{ElementId, Key, ObjectId, OpId};
use automerge::sync;
use piecework_replica::{DocId, Message};
use proptest::prelude::*;
use proptest::sample::Index;
use replica_harness as rh;

#[test]
fn every_replica_message_seed_is_taken() {
    for (name, bytes) in corpus::seeds("replica_message") {
        eprintln!("replica_message/{name}");
        rh::replica_message(&bytes);
    }
}

/// The seeds are frames a replica meets when nothing is wrong, and real sync payloads.
#[test]
#[ignore = "writes fuzz/corpus/replica_message: run by hand"]
fn write_seed_corpus() {
    let q = DocId::parse(rh::QUEUE).unwrap();
    let t = DocId::parse(rh::TASK).unwrap();
    let w = |name: &str, m: Message| corpus::write("replica_message", name, &m.encode());
    w("request_queue", Message::Request { doc: q.clone() });
    w("request_task", Message::Request { doc: t.clone() });
    w("unavailable_task", Message::Unavailable { doc: t.clone() });
    for (i, data) in rh::real_sync_messages().into_iter().enumerate() {
        corpus::write("replica_message", &format!("payload_{i}"), &data);
        w(
            &format!("sync_queue_{i}"),
            Message::Sync {
                doc: q.clone(),
                data: data.clone(),
            },
        );
        w(
            &format!("sync_task_{i}"),
            Message::Sync {
                doc: t.clone(),
                data,
            },
        );
    }
}

/// A valid frame header: a known type and a document the replica knows of.
fn header() -> impl Strategy<Value = Vec<u8>> {
    (
        1u8..=3,
        prop::sample::select(&[rh::QUEUE, rh::TASK, rh::NEW_TASK, rh::UNKNOWN][..]),
    )
        .prop_map(|(ty, doc)| {
            let mut h = vec![ty, u8::try_from(doc.len()).unwrap()];
            h.extend(doc.as_bytes());
            h
        })
}

/// Numbers where a Bloom filter's header breaks things: 0, small, and up to `u32::MAX`.
fn small_or_any() -> impl Strategy<Value = u32> {
    prop_oneof![3 => 0u32..12, 1 => Just(u32::MAX), 1 => any::<u32>()]
}

/// Appends `n` in unsigned LEB128.
fn leb128(out: &mut Vec<u8>, mut n: u32) {
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(256))]

    /// Any bytes.
    #[test]
    fn any_bytes_are_a_message_or_a_typed_error_and_never_a_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        rh::replica_message(&bytes);
    }

    /// A well-formed header and any payload (a frame about a document it knows, with a
    /// payload Automerge may not decode).
    #[test]
    fn a_valid_header_with_any_payload_is_taken_or_rejected(
        head in header(),
        payload in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut frame = head;
        frame.extend(payload);
        rh::replica_message(&frame);
    }

    /// Sync messages built field by field: any heads and needs, Bloom filters of any header
    /// (entries, bits per entry and probes from 0 to `u32::MAX`, with the bits their header
    /// calls for when that is small), and the changes of a real message or none.
    #[test]
    fn any_sync_message_field_by_field_is_taken_or_rejected(
        heads in prop::collection::vec(any::<[u8; 32]>(), 0..3),
        need in prop::collection::vec(any::<[u8; 32]>(), 0..3),
        blooms in prop::collection::vec(
            (small_or_any(), small_or_any(), small_or_any(), any::<u8>()),
            0..3,
        ),
        with_changes in any::<bool>(),
    ) {
        let have = blooms
            .into_iter()
            .filter_map(|(entries, per_entry, probes, fill)| {
                let mut bytes = Vec::new();
                for n in [entries, per_entry, probes] {
                    leb128(&mut bytes, n);
                }
                let bits = (u64::from(entries) * u64::from(per_entry)).div_ceil(8);
                bytes.extend(std::iter::repeat_n(fill, usize::try_from(bits.min(64)).ok()?));
                let bloom = sync::BloomFilter::try_from(bytes.as_slice()).ok()?;
                Some(sync::Have { last_sync: vec![], bloom })
            })
            .collect();
        let changes = match with_changes {
            true => rh::real_sync_messages()
                .last()
                .and_then(|m| sync::Message::decode(m).ok())
                .map_or_else(sync::ChunkList::empty, |m| m.changes),
            false => sync::ChunkList::empty(),
        };
        // Automerge encodes hash lists sorted (and asserts it); a peer's may be in any order.
        let sorted = |mut v: Vec<[u8; 32]>| {
            v.sort();
            v.into_iter().map(automerge::ChangeHash).collect()
        };
        let msg = sync::Message {
            heads: sorted(heads),
            need: sorted(need),
            have,
            changes,
            flags: None,
            version: sync::MessageVersion::V1,
        };
        rh::replica_message(&msg.encode());
    }

    /// A real sync message (with and without changes) with bytes changed and cut short.
    #[test]
    fn a_real_sync_message_with_bytes_changed_is_taken_or_rejected(
        which in any::<Index>(),
        edits in prop::collection::vec((any::<Index>(), 1u8..), 0..4),
        cut in proptest::option::of(any::<Index>()),
    ) {
        let real = rh::real_sync_messages();
        let mut bytes = real[which.index(real.len())].clone();
        for (at, x) in &edits {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        rh::replica_message(&bytes);
    }
}

// ----- findings fixed -----

/// A sync frame from `from` about the queue document whose message carries one Bloom filter,
/// `bloom` as it travels (entries, bits per entry, probes, then the bits).
fn bloom_frame(bloom: &[u8]) -> Message {
    let bloom = sync::BloomFilter::try_from(bloom).expect("a filter Automerge parses");
    let msg = sync::Message {
        heads: vec![],
        need: vec![],
        have: vec![sync::Have {
            last_sync: vec![],
            bloom,
        }],
        changes: sync::ChunkList::empty(),
        flags: None,
        version: sync::MessageVersion::V1,
    };
    Message::Sync {
        doc: DocId::parse(rh::QUEUE).unwrap(),
        data: msg.encode(),
    }
}

/// Rejected, from a member and from a stranger (the queue document is requestable).
fn rejected_from_anyone(msg: &Message, why: &str) {
    for from in [rh::MEMBER, rh::STRANGER] {
        let mut f = rh::Fixture::new();
        f.deliver(from, msg.clone());
        assert!(
            f.events.iter().any(|e| matches!(
                e,
                piecework_replica::Event::Rejected { peer, reason }
                    if peer.as_str() == from && reason.contains(why)
            )),
            "{:?}",
            f.events
        );
        f.later(std::time::Duration::from_secs(1));
    }
}

/// Found by the `replica_message` fuzz target (seed `bloom_without_bits`): a sync message whose
/// Bloom filter has one entry and no bits (`1, 0, 1`) made Automerge 0.12 divide by zero
/// (`sync/bloom.rs`) when it looked the replica's changes up in it: any peer could stop a
/// node with one message about a queue document.
#[test]
fn a_sync_message_whose_bloom_filter_has_no_bits_is_rejected() {
    rejected_from_anyone(&bloom_frame(&[1, 0, 1]), "no bits");
    let seed = corpus::seeds("replica_message")
        .into_iter()
        .find(|(name, _)| name == "bloom_without_bits")
        .expect("the fuzzer's input is in the corpus");
    rh::replica_message(&seed.1);
}

/// Beside it: a filter asking for `u32::MAX` probes per hash made Automerge 0.12 allocate and
/// compute billions of probes for each change it looked up.
#[test]
fn a_sync_message_whose_bloom_filter_asks_for_billions_of_probes_is_rejected() {
    // One entry, 10 bits per entry (two bytes of bits), u32::MAX probes.
    let bloom = [1, 10, 0xff, 0xff, 0xff, 0xff, 0x0f, 0xff, 0xff];
    rejected_from_anyone(&bloom_frame(&bloom), "probes");
}

// ----- findings not fixed: changes a peer crafts that Automerge 0.12 panics on -----
//
// A sync message's changes go to `Automerge::load_incremental` as they came. A peer that
// writes a change's bytes itself (any header, any operations, with a valid checksum) makes
// Automerge 0.12 panic while applying it, or later when the document's changes are read
// (`get_changes`, which every save and sync message calls). Each test below sends one such
// change from a member, in a well-formed sync message about the queue document (which any
// peer may sync: it is requestable), and wants it rejected as data. They are ignored until
// the replica refuses such changes before Automerge applies them.

/// A member sends `frame`; the replica must survive it and its next save.
/// A member's frame carrying a crafted change: no panic (at the message, or at a later read
/// of the document), the message is rejected and the document does not change.
fn survives(frame: &[u8]) {
    let mut f = rh::Fixture::new();
    let q = DocId::parse(rh::QUEUE).unwrap();
    let before = f.replica.get(&q).map(|d| d.get_heads());
    let msg = Message::decode(frame).expect("a well-formed frame");
    f.deliver(rh::MEMBER, msg);
    let _ = f.replica.unsaved(&q);
    f.later(std::time::Duration::from_secs(1));
    assert!(
        f.events
            .iter()
            .any(|e| matches!(e, piecework_replica::Event::Rejected { .. })),
        "not rejected: {:?}",
        f.events
    );
    assert_eq!(f.replica.get(&q).map(|d| d.get_heads()), before);
}

#[test]
fn a_change_whose_pred_counter_is_above_u32_max_is_rejected() {
    survives(&rh::crafted_frame(|e| {
        let actor = e.actor_id.clone();
        e.operations[0].pred = vec![OpId(1 << 33, actor)].into();
    }));
}

#[test]
fn a_change_into_an_object_whose_counter_is_above_u32_max_is_rejected() {
    survives(&rh::crafted_frame(|e| {
        let actor = e.actor_id.clone();
        e.operations[0].obj = ObjectId::Id(OpId(1 << 33, actor.clone()));
        e.operations[0].key = Key::Seq(ElementId::Id(OpId(1 << 34, actor)));
        e.operations[0].insert = true;
    }));
}

#[test]
fn a_first_change_of_an_actor_that_is_not_numbered_one_is_rejected() {
    survives(&rh::crafted_frame(|e| e.seq = 5));
}

#[test]
fn a_change_that_reuses_operation_ids_is_rejected() {
    survives(&rh::crafted_frame(|e| {
        e.start_op = std::num::NonZeroU64::new(1).expect("one");
    }));
}

#[test]
fn a_change_whose_first_operation_counter_is_u32_max_is_rejected() {
    survives(&rh::crafted_frame(|e| {
        e.start_op = std::num::NonZeroU64::new(u64::from(u32::MAX)).expect("non-zero");
    }));
}

/// A frame from a member carrying `changes` of the fixture's queue document, as a sync
/// message that names them as its heads.
fn frame_of(changes: &[automerge::Change]) -> Message {
    let msg = sync::Message {
        heads: changes.iter().map(|c| c.hash()).collect(),
        need: vec![],
        have: vec![],
        changes: sync::ChunkList::from(
            changes
                .iter()
                .map(|c| c.raw_bytes().to_vec())
                .collect::<Vec<_>>(),
        ),
        flags: None,
        version: sync::MessageVersion::V1,
    };
    Message::Sync {
        doc: DocId::parse(rh::QUEUE).unwrap(),
        data: msg.encode(),
    }
}

/// A crafted change that waits for a dependency (Automerge keeps it aside) is checked when
/// the dependency arrives: a change of an unknown actor numbered 5, then the honest change it
/// depends on. The dependency is applied, the crafted change never is, nothing panics (then,
/// or at a later read of the document). Before, Automerge applied it unchecked and panicked.
#[test]
fn a_crafted_change_that_waits_for_its_dependency_is_dropped_when_it_arrives() {
    use automerge::transaction::{CommitOptions, Transactable};
    use automerge::{ActorId, ROOT};
    let mut f = rh::Fixture::new();
    let q = DocId::parse(rh::QUEUE).unwrap();
    let mut doc = rh::queue_document();
    let heads = doc.get_heads();
    doc.set_actor(ActorId::from(&[8u8; 16][..]));
    let mut tx = doc.transaction();
    tx.put(ROOT, "name", "honest").unwrap();
    tx.commit_with(CommitOptions::default().with_time(0));
    let dep = doc.get_changes(&heads).pop().unwrap();
    let after = doc.get_heads();
    doc.set_actor(ActorId::from(&[9u8; 16][..]));
    let mut tx = doc.transaction();
    tx.put(ROOT, "name", "crafted").unwrap();
    tx.commit_with(CommitOptions::default().with_time(0));
    let mut e = doc.get_changes(&after).pop().unwrap().decode();
    e.hash = None;
    e.seq = 5;
    let crafted = automerge::Change::from(e);
    f.deliver(rh::MEMBER, frame_of(std::slice::from_ref(&crafted)));
    f.deliver(rh::MEMBER, frame_of(std::slice::from_ref(&dep)));
    let _ = f.replica.unsaved(&q);
    f.later(std::time::Duration::from_secs(1));
    let held = f.replica.get(&q).unwrap();
    assert!(
        held.get_change_meta_by_hash(&dep.hash()).is_some(),
        "the dependency applied"
    );
    assert!(held.get_change_meta_by_hash(&crafted.hash()).is_none());
    assert_eq!(held.get_heads(), vec![dep.hash()]);
    // A later read of the whole history does not panic either.
    assert!(!held.get_changes(&[]).is_empty());
}
