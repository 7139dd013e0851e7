//! Stories about sizes: documents whose missing changes exceed one sync message travel in
//! parts, and changes that would inflate beyond the bound are refused before they inflate.

use std::io::Write;

use automerge::sync::{ChunkList, MessageVersion};
use automerge::{ChangeHash, ScalarValue};

use super::*;

/// Bytes that do not compress (xorshift), `n` of them.
fn noise(state: &mut u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        out.extend(state.to_le_bytes());
    }
    out.truncate(n);
    out
}

fn put_bytes(d: &mut Automerge, k: &str, v: Vec<u8>) {
    d.transact::<_, _, automerge::AutomergeError>(|tx| {
        tx.put(ROOT, k, ScalarValue::Bytes(v)).map(|_| ())
    })
    .unwrap();
}

fn heads(net: &TestNet, p: &PeerId, d: &DocId) -> Vec<ChangeHash> {
    let mut h = net.replicas[p]
        .get(d)
        .map(|d| d.get_heads())
        .unwrap_or_default();
    h.sort();
    h
}

fn rejections(events: &[Event]) -> Vec<&String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Rejected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect()
}

/// Appends `n` as unsigned LEB128.
fn leb(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// A storage chunk of `kind` around `data` (its checksum is not checked before it is parsed).
fn chunk(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x85, 0x6f, 0x4a, 0x83, 0, 0, 0, 0, kind];
    leb(&mut out, data.len());
    out.extend(data);
    out
}

/// An Automerge sync message carrying `chunks` as its changes, with `heads`.
fn sync_data(heads: Vec<ChangeHash>, chunks: Vec<Vec<u8>>) -> Vec<u8> {
    automerge::sync::Message {
        heads,
        need: vec![],
        have: vec![],
        changes: ChunkList::from(chunks),
        flags: None,
        version: MessageVersion::V1,
    }
    .encode()
}

/// A new member joins a queue whose queue document holds 18 MiB of changes that do not compress
/// (results written since the last rotation): more than one sync message may carry, whole or
/// saved. It fetches the document by id and gets all of it, in messages each under the limit.
#[test]
fn s29_a_new_member_joins_a_queue_whose_changes_since_the_last_rotation_exceed_16_mib() {
    let (a, _, c) = peers();
    let q = g();
    let mut net = net(&[&a, &c]);
    let mut doc = Automerge::new();
    let mut x = 0x9e37_79b9_7f4a_7c15;
    for i in 0..36 {
        put_bytes(&mut doc, &format!("result {i}"), noise(&mut x, 512 << 10));
    }
    assert!(
        doc.save().len() > MAX_SYNC_MESSAGE_BYTES,
        "saved, it is too large too"
    );
    let ra = net.replica(&a);
    ra.set_group(&q, members(&[&a]));
    ra.create(q.clone(), doc, Some(queue_scope()));
    net.connect(&a, &c);
    net.run();
    let now = net.now;
    net.replica(&c).fetch(&q, now);
    net.run();
    let events = net.take_events(&c);
    assert_eq!(rejections(&events), Vec::<&String>::new());
    assert!(events.contains(&Event::Arrived(q.clone())), "{events:?}");
    assert_eq!(heads(&net, &c, &q), heads(&net, &a, &q), "all of it");
    let (count, largest) = net.synced;
    assert!(largest <= MAX_SYNC_MESSAGE_BYTES, "{largest}");
    assert!(count >= 3, "in parts: {count} messages");
    // And the new member writes itself in, as a join does.
    let rc = net.replica(&c);
    rc.set_group(&q, members(&[&a, &c]));
    rc.set_scope(&q, queue_scope());
    rc.change(&q, |d| put(d, "member c", 1));
    net.run();
    assert_eq!(get(&net.replicas[&a], &q, "member c"), Some(1));
}

/// Small limits, so that many parts are cheap.
fn small() -> Limits {
    Limits {
        message_bytes: 64 << 10,
        inflated_bytes: MAX_INFLATED_BYTES,
    }
}

/// A member that was away while 400 KiB of changes were written catches up in parts under a
/// 64 KiB limit (the changes it lacks, as a list), and so does a new member (the whole document,
/// which does not fit saved either, as its changes).
#[test]
fn s30_a_member_behind_by_more_than_the_limit_catches_up_in_parts() {
    let (a, b, c) = peers();
    let d = id(30);
    let mut net = net(&[&a, &b, &c]);
    for p in [&a, &b, &c] {
        net.replica(p).set_limits(small());
    }
    net.group(&g(), &[&a, &b, &c]);
    net.scope(&d, &announced());
    net.replica(&a)
        .create(d.clone(), doc_with("x", 1), Some(announced()));
    net.connect(&a, &b);
    net.run();
    assert_eq!(get(&net.replicas[&b], &d, "x"), Some(1));
    net.disconnect(&a, &b);
    let mut x = 7;
    let sizes: Vec<usize> = (0..200).map(|i| 500 + (i * 7919) % 3000).collect();
    net.replica(&a).change(&d, |doc| {
        for (i, n) in sizes.iter().enumerate() {
            put_bytes(doc, &format!("k{i}"), noise(&mut x, *n));
        }
    });
    net.synced = (0, 0);
    net.connect(&a, &b);
    net.run();
    assert_eq!(rejections(&net.take_events(&b)), Vec::<&String>::new());
    assert_eq!(heads(&net, &b, &d), heads(&net, &a, &d));
    let (count, largest) = net.synced;
    assert!(largest <= small().message_bytes, "{largest}");
    assert!(
        count >= 6,
        "{count} messages for {} bytes",
        sizes.iter().sum::<usize>()
    );
    // A new member, holding nothing: Automerge would send it the saved document.
    net.connect(&a, &c);
    net.run();
    assert_eq!(rejections(&net.take_events(&c)), Vec::<&String>::new());
    assert_eq!(heads(&net, &c, &d), heads(&net, &a, &d));
    assert!(net.synced.1 <= small().message_bytes);
    // Later changes still travel as before, in one message.
    net.synced = (0, 0);
    net.replica(&a).change(&d, |doc| put(doc, "y", 2));
    net.run();
    assert_eq!(get(&net.replicas[&b], &d, "y"), Some(2));
    assert_eq!(get(&net.replicas[&c], &d, "y"), Some(2));
    assert!(net.synced.1 < 1024, "{:?}", net.synced);
}

/// A change larger than the limit on its own cannot be cut: it travels alone, and its receiver
/// refuses it as it refuses any message over the limit. The changes before it arrive. It goes
/// once per connection, and the receiver's asking for it again is not answered: before, the
/// two traded messages without end (as Automerge does while two peers' heads stay apart).
#[test]
fn s31_a_change_larger_than_the_limit_travels_alone_and_is_refused() {
    let (a, b, _) = peers();
    let d = id(31);
    let mut net = net(&[&a, &b]);
    for p in [&a, &b] {
        net.replica(p).set_limits(small());
    }
    net.group(&g(), &[&a, &b]);
    net.scope(&d, &announced());
    let mut doc = Automerge::new();
    let mut x = 31;
    for i in 0..40 {
        put_bytes(&mut doc, &format!("before {i}"), noise(&mut x, 4096));
    }
    put_bytes(&mut doc, "big", noise(&mut x, 100 << 10));
    put(&mut doc, "after", 1);
    net.replica(&a).create(d.clone(), doc, Some(announced()));
    net.connect(&a, &b);
    // The exchange ends: the refused change is not sent again on this connection, nor is an
    // answer to b's asking for it alone (before, a and b traded messages without end).
    assert!(
        net.run_at_most(10_000),
        "the peers still talk after 10,000 messages"
    );
    let rb = &net.replicas[&b];
    assert!(
        rb.get(&d)
            .is_some_and(|doc| doc.get(ROOT, "before 39").unwrap().is_some())
    );
    assert!(
        rb.get(&d)
            .is_some_and(|doc| doc.get(ROOT, "big").unwrap().is_none())
    );
    assert_eq!(
        get(rb, &d, "after"),
        None,
        "it depends on the refused change"
    );
    let events = net.take_events(&b);
    let refused = rejections(&events);
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("above the 65536 accepted"),
        "{refused:?}"
    );
}

/// A compressed change whose 4 MiB of zeros deflate to a few KiB, against a 1 MiB bound: refused
/// before Automerge inflates it (it would otherwise apply it).
#[test]
fn s32_a_change_that_would_inflate_beyond_the_bound_is_rejected_before_inflating() {
    let (a, _, _) = peers();
    let d = id(32);
    let mut r = Replica::new();
    r.set_limits(Limits {
        message_bytes: MAX_SYNC_MESSAGE_BYTES,
        inflated_bytes: 1 << 20,
    });
    r.set_group(&g(), members(&[&a]));
    r.create(d.clone(), doc_with("x", 1), Some(announced()));
    r.handle_connected(a.clone());
    transmit(&mut r);
    let mut src = Automerge::new();
    put_bytes(&mut src, "zeros", vec![0; 4 << 20]);
    let mut change = src.get_changes(&[]).pop().unwrap();
    let compressed = change.bytes().to_vec();
    assert_eq!(compressed.get(8), Some(&2), "a compressed change chunk");
    assert!(compressed.len() < 64 << 10, "{}", compressed.len());
    let data = sync_data(src.get_heads(), vec![compressed]);
    let now = t0();
    r.handle_message(
        &a,
        Message::Sync {
            doc: d.clone(),
            data,
        },
        now,
    );
    let events = drain(&mut r);
    let refused = rejections(&events);
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(
        refused[0].contains("inflate to more than the 1048576 bytes accepted"),
        "{refused:?}"
    );
    let doc = r.get(&d).unwrap();
    assert!(doc.get(ROOT, "zeros").unwrap().is_none());
    assert_eq!(get(&r, &d, "x"), Some(1));
}

/// At the real bound: a saved-document chunk whose one deflated column is 129 MiB of zeros (a
/// few hundred KiB on the wire) is refused by the inflation bound, counting at most
/// `MAX_INFLATED_BYTES`, before Automerge inflates the column.
#[test]
fn s33_a_saved_document_that_would_inflate_beyond_128_mib_is_rejected_before_inflating() {
    let (a, _, _) = peers();
    let d = id(33);
    let mut r = Replica::new();
    r.set_group(&g(), members(&[&a]));
    r.create(d.clone(), doc_with("x", 1), Some(announced()));
    r.handle_connected(a.clone());
    transmit(&mut r);
    let mut z = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![0u8; 1 << 20];
    for _ in 0..(MAX_INFLATED_BYTES >> 20) + 1 {
        z.write_all(&block).unwrap();
    }
    let bomb = z.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    // No actors or heads; one change column (id 1, deflated), no op columns; then its data.
    let mut body = vec![0, 0, 1, 0x18];
    leb(&mut body, bomb.len());
    body.push(0);
    body.extend(&bomb);
    let data = sync_data(vec![], vec![chunk(0, &body)]);
    r.handle_message(
        &a,
        Message::Sync {
            doc: d.clone(),
            data,
        },
        t0(),
    );
    let events = drain(&mut r);
    let refused = rejections(&events);
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(
        refused[0].contains(&format!(
            "inflate to more than the {MAX_INFLATED_BYTES} bytes accepted"
        )),
        "{refused:?}"
    );
    assert_eq!(get(&r, &d, "x"), Some(1));
}

/// A document that compresses well: saved, it is a few KiB but inflates beyond a 256 KiB bound.
/// Its holder checks before sending and sends it to a new member as its changes instead.
#[test]
fn s34_a_saved_document_that_would_inflate_beyond_the_bound_is_sent_as_changes() {
    let (a, b, _) = peers();
    let d = id(34);
    let limits = Limits {
        message_bytes: MAX_SYNC_MESSAGE_BYTES,
        inflated_bytes: 256 << 10,
    };
    let mut net = net(&[&a, &b]);
    for p in [&a, &b] {
        net.replica(p).set_limits(limits);
    }
    net.group(&g(), &[&a, &b]);
    net.scope(&d, &announced());
    let mut doc = Automerge::new();
    for i in 0..16 {
        put_bytes(&mut doc, &format!("k{i}"), vec![i; 64 << 10]);
    }
    let saved = doc.save();
    assert!(saved.len() < 64 << 10, "{}", saved.len());
    net.replica(&a).create(d.clone(), doc, Some(announced()));
    net.connect(&a, &b);
    net.run();
    assert_eq!(rejections(&net.take_events(&b)), Vec::<&String>::new());
    assert_eq!(heads(&net, &b, &d), heads(&net, &a, &d));
}
