//! Stories about the replica, numbered.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use automerge::transaction::Transactable;
use automerge::{Automerge, ROOT, ReadDoc};

use crate::*;

mod sizes;

fn id(n: u8) -> DocId {
    DocId::parse(&format!(
        "{URL_PREFIX}{}",
        bs58::encode([n; 16]).into_string()
    ))
    .expect("a valid id")
}

/// The group every story uses: the queue document `id(100)`.
fn g() -> DocId {
    id(100)
}

fn announced() -> Scope {
    Scope {
        group: g(),
        announce: true,
        requestable: false,
    }
}

fn on_request() -> Scope {
    Scope {
        group: g(),
        announce: false,
        requestable: false,
    }
}

fn queue_scope() -> Scope {
    Scope {
        group: g(),
        announce: true,
        requestable: true,
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "tests need some instant to start from; the replica only sees it as an argument"
)]
fn t0() -> Instant {
    Instant::now()
}

fn doc_with(k: &str, v: i64) -> Automerge {
    let mut d = Automerge::new();
    put(&mut d, k, v);
    d
}

fn put(d: &mut Automerge, k: &str, v: i64) {
    d.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, k, v).map(|_| ()))
        .unwrap();
}

fn get(r: &Replica, d: &DocId, k: &str) -> Option<i64> {
    r.get(d)?.get(ROOT, k).ok()??.0.as_scalar()?.as_i64()
}

fn peers() -> (PeerId, PeerId, PeerId) {
    (PeerId::new("a"), PeerId::new("b"), PeerId::new("c"))
}

fn members(ps: &[&PeerId]) -> BTreeSet<PeerId> {
    ps.iter().map(|p| (*p).clone()).collect()
}

fn net(ps: &[&PeerId]) -> TestNet {
    let mut net = TestNet::new(t0());
    for p in ps {
        net.add(p);
    }
    net
}

fn drain(r: &mut Replica) -> Vec<Event> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

fn transmit(r: &mut Replica) -> Vec<(PeerId, Message)> {
    std::iter::from_fn(|| r.poll_transmit(t0())).collect()
}

#[test]
fn s01_ids_round_trip_and_refuse_garbage() {
    let d = id(7);
    assert_eq!(DocId::parse(d.as_str()), Some(d.clone()));
    for bad in [
        "",
        "automerge:",
        "automerge:0OIl",
        "http://x",
        "automerge:abc",
    ] {
        assert_eq!(DocId::parse(bad), None, "{bad}");
    }
    // New ids are automerge-repo's form (base58check of 16 bytes); legacy ids (plain base58)
    // still parse, and a checked id with one character changed does not.
    let fresh = DocId::generate(&mut <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7));
    assert!(fresh.is_checked(), "{fresh}");
    assert_eq!(DocId::parse(fresh.as_str()), Some(fresh.clone()));
    assert!(!d.is_checked());
    // The example id in automerge-repo's documentation.
    let js = DocId::parse("automerge:4NMNnkMhL8jXrdJ9jamS58PAVdXu").expect("automerge-repo id");
    assert!(js.is_checked());
    let body = &fresh.as_str()[URL_PREFIX.len()..];
    let last = body.chars().last().unwrap();
    let swapped = if last == '2' { '3' } else { '2' };
    let broken = format!("{URL_PREFIX}{}{swapped}", &body[..body.len() - 1]);
    assert_eq!(DocId::parse(&broken), None, "{broken}");
    let m = Message::Sync {
        doc: d.clone(),
        data: vec![1, 2, 3],
    };
    assert_eq!(Message::decode(&m.encode()), Ok(m));
    assert_eq!(Message::decode(&[1]), Err(DecodeError::Truncated));
    assert_eq!(Message::decode(&[9, 0]), Err(DecodeError::BadDocId));
}

#[test]
fn s02_announced_documents_reach_members_and_changes_follow() {
    let (a, b, c) = peers();
    let mut net = net(&[&a, &b, &c]);
    net.group(&g(), &[&a, &b, &c]);
    net.scope(&id(1), &announced());
    net.connect(&a, &b);
    net.connect(&b, &c);
    net.replica(&a).create(id(1), doc_with("x", 1), None);
    net.run();
    assert_eq!(get(&net.replicas[&b], &id(1), "x"), Some(1));
    assert_eq!(
        get(&net.replicas[&c], &id(1), "x"),
        Some(1),
        "b relays what it received"
    );
    net.replica(&c).change(&id(1), |d| put(d, "y", 2));
    net.run();
    assert_eq!(get(&net.replicas[&a], &id(1), "y"), Some(2));
    assert!(net.events[&c].contains(&Event::Arrived(id(1))));
    assert!(
        !net.events.values().flatten().any(|e| matches!(
            e,
            Event::Refused { .. } | Event::Rejected { .. } | Event::Unavailable(_)
        )),
        "{:?}",
        net.events
    );
}

#[test]
fn s03_unannounced_documents_travel_only_on_request() {
    let (a, b, _) = peers();
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.scope(&id(2), &on_request());
    net.connect(&a, &b);
    net.replica(&a).create(id(2), doc_with("x", 5), None);
    net.run();
    assert!(!net.replicas[&b].is_loaded(&id(2)));
    let now = net.now;
    net.replica(&b).fetch(&id(2), now);
    net.run();
    assert_eq!(get(&net.replicas[&b], &id(2), "x"), Some(5));
    assert!(net.events[&b].contains(&Event::Arrived(id(2))));
}

#[test]
fn s04_a_fetch_nobody_can_answer_ends_unavailable() {
    let (a, b, _) = peers();
    let mut net = net(&[&a, &b]);
    net.connect(&a, &b);
    let now = net.now;
    net.replica(&b).fetch(&id(3), now);
    net.run();
    assert!(net.events[&b].contains(&Event::Unavailable(id(3))));
    assert!(!net.replicas[&b].is_loaded(&id(3)));
    assert!(!net.replicas[&a].is_loaded(&id(3)));
    assert_eq!(net.replicas[&b].poll_timeout(), None, "the fetch ended");
    // With nobody connected it ends at once.
    let mut lone = Replica::new();
    lone.fetch(&id(3), now);
    assert_eq!(drain(&mut lone), vec![Event::Load(id(3))]);
    lone.handle_loaded(&id(3), None, now);
    assert_eq!(drain(&mut lone), vec![Event::Unavailable(id(3))]);
}

#[test]
fn s05_an_announced_document_created_offline_spreads_on_connect() {
    let (a, b, _) = peers();
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.scope(&id(4), &announced());
    net.replica(&a).create(id(4), doc_with("x", 9), None);
    net.run();
    assert!(!net.replicas[&b].is_loaded(&id(4)));
    net.connect(&a, &b);
    net.run();
    assert_eq!(get(&net.replicas[&b], &id(4), "x"), Some(9));
    let rb = net.replica(&b);
    let unsaved = rb.unsaved(&id(4)).expect("the received change is unsaved");
    assert_eq!(unsaved.changes.len(), 1);
    assert_eq!(
        rb.unsaved(&id(4)),
        Some(unsaved.clone()),
        "handed out until marked"
    );
    rb.mark_saved(&id(4), &unsaved.heads);
    assert_eq!(rb.unsaved(&id(4)), None);
    let ra = &net.replicas[&a];
    assert!(ra.peer_has(&id(4), &ra.get(&id(4)).unwrap().get_heads()));
}

#[test]
fn s06_malformed_sync_data_is_rejected_as_data() {
    let (_, b, _) = peers();
    let now = t0();
    let mut r = Replica::new();
    r.set_group(&g(), members(&[&b]));
    r.handle_connected(b.clone());
    r.create(id(5), doc_with("x", 1), Some(announced()));
    r.handle_message(
        &b,
        Message::Sync {
            doc: id(5),
            data: vec![0x42, 0xff, 0x00],
        },
        now,
    );
    let events = drain(&mut r);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Rejected { peer, .. } if *peer == b)),
        "{events:?}"
    );
    assert_eq!(get(&r, &id(5), "x"), Some(1));
}

#[test]
fn s07_fetching_an_announced_but_empty_document_waits_for_its_changes() {
    let (a, b, _) = peers();
    let now = t0();
    let (mut ra, mut rb) = (Replica::new(), Replica::new());
    for r in [&mut ra, &mut rb] {
        r.set_group(&g(), members(&[&a, &b]));
        r.set_scope(&id(6), announced());
    }
    ra.handle_connected(b.clone());
    rb.handle_connected(a.clone());
    ra.create(id(6), doc_with("x", 3), None);
    // Only a's first message (its heads, no changes yet) reaches b.
    let (to, first) = ra.poll_transmit(t0()).expect("a announces the document");
    assert_eq!(to, b);
    rb.handle_message(&a, first, now);
    while let Some(ev) = rb.poll_event() {
        if let Event::Load(d) = ev {
            rb.handle_loaded(&d, None, now);
        }
    }
    assert!(
        rb.is_loaded(&id(6)) && get(&rb, &id(6), "x").is_none(),
        "known but empty"
    );
    rb.fetch(&id(6), now);
    let early = drain(&mut rb);
    assert!(
        !early.contains(&Event::Arrived(id(6))),
        "an empty document has not arrived: {early:?}"
    );
    // Let the rest flow both ways.
    let mut events = vec![];
    loop {
        let mut moved = false;
        while let Some((_, m)) = ra.poll_transmit(t0()) {
            rb.handle_message(&a, m, now);
            moved = true;
        }
        while let Some((_, m)) = rb.poll_transmit(t0()) {
            ra.handle_message(&b, m, now);
            moved = true;
        }
        events.extend(drain(&mut rb));
        if !moved {
            break;
        }
    }
    assert!(events.contains(&Event::Arrived(id(6))), "{events:?}");
    assert_eq!(get(&rb, &id(6), "x"), Some(3));
}

#[test]
fn s08_a_push_from_a_non_member_is_refused_and_nothing_is_stored() {
    let (a, b, c) = peers();
    let mut net = net(&[&a, &b]);
    // a thinks b is a member; b does not count a among the members.
    net.replica(&a).set_group(&g(), members(&[&a, &b]));
    net.replica(&b).set_group(&g(), members(&[&b, &c]));
    net.scope(&id(8), &announced());
    net.connect(&a, &b);
    net.replica(&a).create(id(8), doc_with("x", 1), None);
    // And a document b has no scope for at all.
    net.replica(&a)
        .create(id(9), doc_with("x", 2), Some(announced()));
    net.replica(&b).clear_scope(&id(9));
    net.run();
    let rb = &net.replicas[&b];
    assert!(!rb.is_loaded(&id(8)) && !rb.is_loaded(&id(9)));
    assert_eq!(rb.loaded(), 0);
    let eb = &net.events[&b];
    assert!(
        !eb.iter().any(|e| matches!(e, Event::Load(_))),
        "nothing is loaded for a refused document: {eb:?}"
    );
    for d in [id(8), id(9)] {
        assert!(
            eb.contains(&Event::Refused {
                peer: a.clone(),
                doc: d.clone()
            }),
            "{eb:?}"
        );
    }
    // a was told: it no longer syncs the documents with b.
    assert!(!net.replicas[&a].peer_has(&id(8), &[]));
}

#[test]
fn s09_a_requestable_queue_document_goes_to_any_requester_but_is_announced_only_to_members() {
    let (a, b, c) = peers();
    let q = g();
    let mut net = net(&[&a, &b, &c]);
    net.replica(&a).set_group(&q, members(&[&a, &b]));
    net.replica(&b).set_group(&q, members(&[&a, &b]));
    net.replica(&b).set_scope(&q, queue_scope());
    net.connect(&a, &b);
    net.connect(&a, &c);
    net.replica(&a)
        .create(q.clone(), doc_with("x", 1), Some(queue_scope()));
    net.run();
    assert_eq!(get(&net.replicas[&b], &q, "x"), Some(1));
    assert!(
        !net.replicas[&c].is_loaded(&q),
        "not announced to a non-member"
    );
    // c knows the id: it asks, and gets it.
    let now = net.now;
    net.replica(&c).fetch(&q, now);
    net.run();
    assert_eq!(get(&net.replicas[&c], &q, "x"), Some(1));
    assert!(net.events[&c].contains(&Event::Arrived(q.clone())));
    assert!(
        !net.take_events(&a)
            .iter()
            .any(|e| matches!(e, Event::Refused { .. })),
        "a answers a requester of a requestable document"
    );
    // After a reconnect nothing is announced to c: a's later changes do not reach it.
    net.disconnect(&a, &c);
    net.connect(&a, &c);
    net.replica(&a).change(&q, |d| put(d, "y", 2));
    let now = net.now;
    for (to, m) in transmit(net.replica(&a)) {
        assert_eq!(to, b, "nothing for c: {m:?}");
        net.replica(&b).handle_message(&a, m, now);
    }
    net.run();
    assert_eq!(get(&net.replicas[&b], &q, "y"), Some(2));
    assert_eq!(get(&net.replicas[&c], &q, "y"), None);
}

#[test]
fn s10_a_task_pushed_before_its_scope_is_held_then_requested_once_scoped() {
    let (a, b, _) = peers();
    let t = id(10);
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.replica(&a).set_scope(&t, announced());
    net.connect(&a, &b);
    net.replica(&a).create(t.clone(), doc_with("x", 4), None);
    net.run();
    assert!(!net.replicas[&b].is_loaded(&t), "not stored unscoped");
    let eb = net.take_events(&b);
    assert_eq!(
        eb,
        vec![Event::Refused {
            peer: a.clone(),
            doc: t.clone()
        }]
    );
    assert_eq!(
        net.replicas[&b].poll_timeout(),
        Some(net.now + HELD_FOR),
        "the push is held"
    );
    // The task's index entry arrives; the driver scopes the document.
    net.replica(&b).set_scope(&t, announced());
    net.run();
    assert_eq!(get(&net.replicas[&b], &t, "x"), Some(4));
    let eb = net.take_events(&b);
    let load = eb.iter().position(|e| *e == Event::Load(t.clone()));
    let arrived = eb.iter().position(|e| *e == Event::Arrived(t.clone()));
    assert!(
        matches!((load, arrived), (Some(l), Some(r)) if l < r),
        "{eb:?}"
    );
    assert!(
        !net.events
            .values()
            .flatten()
            .any(|e| matches!(e, Event::Refused { .. }))
    );
    assert!(
        net.replicas[&b].poll_timeout().is_some(),
        "the fetch lingers"
    );
    net.advance(FETCH_TIMEOUT);
    assert_eq!(net.replicas[&b].poll_timeout(), None);
    assert!(
        !net.take_events(&b).contains(&Event::Unavailable(t.clone())),
        "an arrived document does not time out"
    );
}

#[test]
fn s11_a_held_push_is_forgotten_after_a_while() {
    let (a, b, _) = peers();
    let t = id(11);
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.replica(&a).set_scope(&t, announced());
    net.connect(&a, &b);
    net.replica(&a).create(t.clone(), doc_with("x", 4), None);
    net.run();
    net.advance(HELD_FOR);
    assert_eq!(net.replicas[&b].poll_timeout(), None);
    net.replica(&b).set_scope(&t, announced());
    net.run();
    assert!(
        !net.take_events(&b).contains(&Event::Load(t.clone())),
        "nothing left to ask again"
    );
    // The protocol recovers anyway at a's next change, now that b accepts it.
    net.replica(&a).change(&t, |d| put(d, "y", 5));
    net.run();
    assert_eq!(get(&net.replicas[&b], &t, "y"), Some(5));
}

#[test]
fn s12_a_fetch_answered_only_by_an_empty_shell_ends_unavailable_at_the_timeout() {
    let (a, b, _) = peers();
    let d = id(12);
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    // b holds an empty shell (announced to it, no changes yet).
    net.replica(&b)
        .insert(d.clone(), Automerge::new(), Some(announced()));
    net.connect(&a, &b);
    let start = net.now;
    net.replica(&a).fetch(&d, start);
    net.run();
    assert!(
        !net.events[&a].contains(&Event::Unavailable(d.clone())),
        "b answered: wait for changes"
    );
    assert_eq!(net.replicas[&a].poll_timeout(), Some(start + FETCH_TIMEOUT));
    net.advance(FETCH_TIMEOUT - Duration::from_millis(1));
    assert!(!net.events[&a].contains(&Event::Unavailable(d.clone())));
    net.advance(Duration::from_millis(1));
    net.run();
    assert!(
        net.events[&a].contains(&Event::Unavailable(d.clone())),
        "{:?}",
        net.events[&a]
    );
    assert!(!net.replicas[&a].is_loaded(&d), "the shell is dropped");
    assert_eq!(net.replicas[&a].poll_timeout(), None);
}

#[test]
fn s13_changes_count_as_saved_only_once_marked() {
    let d = id(13);
    let mut r = Replica::new();
    r.create(d.clone(), doc_with("x", 1), None);
    assert!(!r.is_saved(&d) && !r.evict(&d), "a new document is unsaved");
    let first = r.unsaved(&d).expect("the creation");
    assert_eq!(first.changes.len(), 1);
    assert!(!r.evict(&d), "taking the changes does not mark them saved");
    r.change(&d, |doc| put(doc, "y", 2));
    r.mark_saved(&d, &first.heads);
    assert!(!r.is_saved(&d), "the later change is not saved");
    let second = r.unsaved(&d).expect("the later change");
    assert_eq!(second.changes.len(), 1);
    assert_ne!(second.changes[0].0, first.changes[0].0);
    assert!(!r.evict(&d));
    r.mark_saved(&d, &second.heads);
    assert!(r.is_saved(&d) && r.unsaved(&d).is_none());
    // A late acknowledgement of the older write changes nothing.
    r.mark_saved(&d, &first.heads);
    assert!(r.is_saved(&d));
    assert!(r.evict(&d) && !r.is_loaded(&d));
    // Acknowledgements out of order: both writes end up saved.
    r.create(id(14), doc_with("x", 1), None);
    let one = r.unsaved(&id(14)).unwrap().heads;
    r.change(&id(14), |doc| put(doc, "y", 2));
    let two = r.unsaved(&id(14)).unwrap().heads;
    r.mark_saved(&id(14), &two);
    r.mark_saved(&id(14), &one);
    assert!(r.is_saved(&id(14)));
}

#[test]
fn s14_concurrent_saves_merge_their_heads() {
    // Two branches saved separately: each acknowledgement covers its own branch only.
    let (a, b, _) = peers();
    let d = id(15);
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.scope(&d, &announced());
    net.connect(&a, &b);
    net.replica(&a).create(d.clone(), doc_with("x", 1), None);
    net.run();
    net.save(&a, &d);
    net.disconnect(&a, &b);
    net.replica(&a).change(&d, |doc| put(doc, "a", 1));
    let mine = net.replica(&a).unsaved(&d).unwrap();
    net.replica(&b).change(&d, |doc| put(doc, "b", 1));
    net.connect(&a, &b);
    net.run();
    let ra = net.replica(&a);
    assert_eq!(get(ra, &d, "b"), Some(1));
    ra.mark_saved(&d, &mine.heads);
    let rest = ra.unsaved(&d).expect("b's change");
    assert_eq!(rest.changes.len(), 1);
    assert_ne!(rest.changes[0].0, mine.changes[0].0);
    ra.mark_saved(&d, &rest.heads);
    assert!(ra.is_saved(&d));
}

#[test]
fn s15_a_blocked_peer_gets_nothing_until_unblocked_then_one_message() {
    let (a, b, _) = peers();
    let d = id(16);
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.scope(&d, &announced());
    net.connect(&a, &b);
    net.replica(&a).create(d.clone(), doc_with("x", 1), None);
    net.run();
    assert_eq!(get(&net.replicas[&b], &d, "x"), Some(1));
    let ra = net.replica(&a);
    ra.handle_blocked(&b);
    assert!(ra.is_blocked(&b));
    for (k, v) in [("k1", 1), ("k2", 2), ("k3", 3)] {
        ra.change(&d, |doc| put(doc, k, v));
        assert_eq!(ra.poll_transmit(t0()), None, "nothing for a blocked peer");
    }
    ra.handle_unblocked(&b);
    let out = transmit(ra);
    assert_eq!(out.len(), 1, "{out:?}");
    let (to, msg) = out.into_iter().next().unwrap();
    assert_eq!(to, b);
    let now = net.now;
    net.replica(&b).handle_message(&a, msg, now);
    for k in ["k1", "k2", "k3"] {
        assert!(get(&net.replicas[&b], &d, k).is_some(), "{k}");
    }
}

#[test]
fn s16_an_oversized_sync_message_is_rejected_as_data() {
    let (a, _, _) = peers();
    let now = t0();
    let mut r = Replica::new();
    r.set_group(&g(), members(&[&a]));
    r.set_scope(&id(17), announced());
    r.handle_connected(a.clone());
    let msg = Message::Sync {
        doc: id(17),
        data: vec![0x42; MAX_SYNC_MESSAGE_BYTES + 1],
    };
    r.handle_message(&a, msg, now);
    let events = drain(&mut r);
    assert!(
        matches!(&events[..], [Event::Rejected { peer, .. }] if *peer == a),
        "{events:?}"
    );
    assert!(!r.is_loaded(&id(17)));
    assert_eq!(transmit(&mut r), vec![], "no answer to feed a loop");
}

#[test]
fn s17_a_peer_that_becomes_a_member_gets_the_groups_announced_documents() {
    let (a, b, _) = peers();
    let d = id(18);
    let mut net = net(&[&a, &b]);
    net.replica(&a).set_group(&g(), members(&[&a]));
    net.replica(&b).set_group(&g(), members(&[&a, &b]));
    net.scope(&d, &announced());
    net.connect(&a, &b);
    net.replica(&a).create(d.clone(), doc_with("x", 1), None);
    net.run();
    assert!(!net.replicas[&b].is_loaded(&d));
    net.replica(&a).set_group(&g(), members(&[&a, &b]));
    net.run();
    assert_eq!(get(&net.replicas[&b], &d, "x"), Some(1));
    // And one removed is no longer synced with.
    net.replica(&a).set_group(&g(), members(&[&a]));
    net.replica(&a).change(&d, |doc| put(doc, "y", 1));
    net.run();
    assert_eq!(get(&net.replicas[&b], &d, "y"), None);
}

#[test]
fn s18_a_node_joins_a_queue_by_fetching_its_document() {
    let (a, _, c) = peers();
    let q = g();
    let t = id(19);
    let mut net = net(&[&a, &c]);
    let ra = net.replica(&a);
    ra.set_group(&q, members(&[&a]));
    ra.create(q.clone(), doc_with("queue", 1), Some(queue_scope()));
    ra.create(t.clone(), doc_with("task", 1), Some(announced()));
    net.connect(&a, &c);
    net.run();
    assert_eq!(net.replicas[&c].loaded(), 0);
    // c knows the queue's id: it fetches the queue document, then scopes it and joins.
    let now = net.now;
    net.replica(&c).fetch(&q, now);
    net.run();
    assert!(net.take_events(&c).contains(&Event::Arrived(q.clone())));
    let rc = net.replica(&c);
    rc.set_group(&q, members(&[&a, &c]));
    rc.set_scope(&q, queue_scope());
    rc.change(&q, |d| put(d, "member c", 1));
    net.run();
    assert_eq!(get(&net.replicas[&a], &q, "member c"), Some(1));
    // a's driver reads the new member: c gets the queue's tasks, which it holds until scoped.
    net.replica(&a).set_group(&q, members(&[&a, &c]));
    net.run();
    assert!(!net.replicas[&c].is_loaded(&t));
    net.replica(&c).set_scope(&t, announced());
    net.run();
    assert_eq!(get(&net.replicas[&c], &t, "task"), Some(1));
}

#[test]
fn s19_loads_beyond_the_bound_are_turned_away_then_retried() {
    let (a, b, _) = peers();
    let now = t0();
    let (mut ra, mut rb) = (Replica::new(), Replica::new());
    let docs: Vec<DocId> = (0..=MAX_PENDING_LOADS)
        .map(|i| {
            let n = u16::try_from(i).unwrap().to_be_bytes();
            let mut bytes = [7u8; 16];
            bytes[..2].copy_from_slice(&n);
            DocId::parse(&format!(
                "{URL_PREFIX}{}",
                bs58::encode(bytes).into_string()
            ))
            .unwrap()
        })
        .collect();
    for r in [&mut ra, &mut rb] {
        r.set_group(&g(), members(&[&a, &b]));
        for d in &docs {
            r.set_scope(d, announced());
        }
    }
    ra.handle_connected(b.clone());
    rb.handle_connected(a.clone());
    for d in &docs {
        ra.create(d.clone(), doc_with("x", 1), None);
    }
    for (_, m) in transmit(&mut ra) {
        rb.handle_message(&a, m, now);
    }
    let loads: Vec<Event> = drain(&mut rb);
    assert_eq!(loads.len(), MAX_PENDING_LOADS, "one push turned away");
    let back = transmit(&mut rb);
    assert!(
        matches!(&back[..], [(_, Message::Unavailable { .. })]),
        "{back:?}"
    );
    // As loads end, the turned-away push is retried; everything arrives.
    for ev in loads {
        let Event::Load(d) = ev else { unreachable!() };
        rb.handle_loaded(&d, None, now);
    }
    for (_, m) in back {
        ra.handle_message(&b, m, now);
    }
    loop {
        let mut moved = false;
        for ev in drain(&mut rb) {
            if let Event::Load(d) = ev {
                rb.handle_loaded(&d, None, now);
                moved = true;
            }
        }
        for (_, m) in transmit(&mut ra) {
            rb.handle_message(&a, m, now);
            moved = true;
        }
        for (_, m) in transmit(&mut rb) {
            ra.handle_message(&b, m, now);
            moved = true;
        }
        if !moved {
            break;
        }
    }
    for d in &docs {
        assert_eq!(get(&rb, d, "x"), Some(1), "{d}");
    }
}

#[test]
fn s20_every_document_taken_in_gets_the_actor() {
    let (a, b, _) = peers();
    let mut net = net(&[&a, &b]);
    net.group(&g(), &[&a, &b]);
    net.scope(&id(20), &announced());
    let actor = automerge::ActorId::from(vec![0xbb; 16]);
    net.replica(&b).set_actor(actor.clone());
    net.connect(&a, &b);
    net.replica(&a).create(id(20), doc_with("x", 1), None);
    net.run();
    let rb = net.replica(&b);
    assert_eq!(rb.get(&id(20)).unwrap().get_actor(), &actor);
    rb.change(&id(20), |d| put(d, "y", 1));
    let ours = rb.unsaved(&id(20)).unwrap();
    let last = rb
        .get(&id(20))
        .unwrap()
        .get_change_by_hash(&ours.heads[0])
        .unwrap();
    assert_eq!(last.actor_id(), &actor);
    // Loaded and inserted documents too.
    rb.insert(id(21), doc_with("x", 1), None);
    assert_eq!(rb.get(&id(21)).unwrap().get_actor(), &actor);
    rb.fetch(&id(22), t0());
    rb.handle_loaded(&id(22), Some(doc_with("x", 1)), t0());
    assert_eq!(rb.get(&id(22)).unwrap().get_actor(), &actor);
}

#[test]
fn s21_a_scoped_fetch_asks_only_the_groups_members() {
    let (a, b, c) = peers();
    let now = t0();
    let mut r = Replica::new();
    r.set_group(&g(), members(&[&a, &b]));
    r.set_scope(&id(23), on_request());
    r.handle_connected(b.clone());
    r.handle_connected(c.clone());
    r.fetch(&id(23), now);
    assert_eq!(drain(&mut r), vec![Event::Load(id(23))]);
    r.handle_loaded(&id(23), None, now);
    assert_eq!(
        transmit(&mut r),
        vec![(b.clone(), Message::Request { doc: id(23) })]
    );
    // b has nothing either: with no member left to ask, the fetch ends.
    r.handle_message(&b, Message::Unavailable { doc: id(23) }, now);
    assert_eq!(drain(&mut r), vec![Event::Unavailable(id(23))]);
    // An unscoped fetch asks everyone.
    r.fetch(&id(24), now);
    r.handle_loaded(&id(24), None, now);
    let asked: BTreeSet<PeerId> = transmit(&mut r).into_iter().map(|(p, _)| p).collect();
    assert_eq!(asked, members(&[&b, &c]));
}

#[test]
fn s22_a_blocked_peer_keeps_its_requests_and_answers_for_later() {
    let (_, b, _) = peers();
    let now = t0();
    let mut r = Replica::new();
    r.handle_connected(b.clone());
    r.handle_blocked(&b);
    // b asks for documents this replica does not sync with it: each answer waits.
    for n in 0..3 {
        r.handle_message(&b, Message::Request { doc: id(n) }, now);
    }
    assert_eq!(r.poll_transmit(t0()), None);
    r.handle_unblocked(&b);
    let out = transmit(&mut r);
    assert_eq!(out.len(), 3);
    assert!(
        out.iter()
            .all(|(p, m)| *p == b && matches!(m, Message::Unavailable { .. }))
    );
}

// ----- convergence under random interleavings -----

#[derive(Clone, Debug)]
enum Op {
    Change(usize, u8),
    Poll(usize),
    Deliver(usize, usize),
    Block(usize, usize),
    Unblock(usize, usize),
    Disconnect(usize, usize),
    Connect(usize, usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let i = 0..3usize;
    prop_oneof![
        3 => (i.clone(), any::<u8>()).prop_map(|(i, v)| Op::Change(i, v)),
        4 => i.clone().prop_map(Op::Poll),
        6 => (i.clone(), i.clone()).prop_map(|(a, b)| Op::Deliver(a, b)),
        1 => (i.clone(), i.clone()).prop_map(|(a, b)| Op::Block(a, b)),
        1 => (i.clone(), i.clone()).prop_map(|(a, b)| Op::Unblock(a, b)),
        1 => (i.clone(), i.clone()).prop_map(|(a, b)| Op::Disconnect(a, b)),
        1 => (i.clone(), i).prop_map(|(a, b)| Op::Connect(a, b)),
    ]
}

struct Sim {
    ids: Vec<PeerId>,
    rs: Vec<Replica>,
    wire: BTreeMap<(usize, usize), VecDeque<Message>>,
    now: Instant,
}

impl Sim {
    fn new() -> Self {
        let ids: Vec<PeerId> = (0..3).map(|i| PeerId::new(format!("p{i}"))).collect();
        let all: BTreeSet<PeerId> = ids.iter().cloned().collect();
        let mut rs: Vec<Replica> = (0..3).map(|_| Replica::new()).collect();
        for (i, r) in rs.iter_mut().enumerate() {
            r.set_actor(automerge::ActorId::from(vec![
                u8::try_from(i).unwrap() + 1;
                16
            ]));
            r.set_local_peer(PeerId::new(format!("p{i}")));
            r.set_group(&g(), all.clone());
            r.set_scope(&id(30), announced());
            r.set_scope(&id(31), announced());
        }
        rs[0].create(id(30), doc_with("from 0", 1), None);
        rs[1].create(id(31), doc_with("from 1", 1), None);
        let mut sim = Sim {
            ids,
            rs,
            wire: BTreeMap::new(),
            now: t0(),
        };
        for (a, b) in [(0, 1), (1, 2), (0, 2)] {
            sim.connect(a, b);
        }
        sim
    }

    fn connected(&self, a: usize, b: usize) -> bool {
        self.rs[a].peers().contains(&self.ids[b])
    }

    fn connect(&mut self, a: usize, b: usize) {
        if a == b || self.connected(a, b) {
            return;
        }
        self.rs[a].handle_connected(self.ids[b].clone());
        self.rs[b].handle_connected(self.ids[a].clone());
    }

    fn disconnect(&mut self, a: usize, b: usize) {
        if a == b || !self.connected(a, b) {
            return;
        }
        self.rs[a].handle_disconnected(&self.ids[b]);
        self.rs[b].handle_disconnected(&self.ids[a]);
        self.wire.remove(&(a, b));
        self.wire.remove(&(b, a));
    }

    fn loads(&mut self, i: usize) {
        while let Some(ev) = self.rs[i].poll_event() {
            if let Event::Load(d) = ev {
                self.rs[i].handle_loaded(&d, None, self.now);
            }
        }
    }

    fn poll(&mut self, i: usize) -> bool {
        let mut moved = false;
        while let Some((to, m)) = self.rs[i].poll_transmit(self.now) {
            let j = self.ids.iter().position(|p| *p == to).unwrap();
            self.wire.entry((i, j)).or_default().push_back(m);
            moved = true;
        }
        moved
    }

    fn deliver(&mut self, a: usize, b: usize) -> bool {
        let Some(m) = self.wire.get_mut(&(a, b)).and_then(|q| q.pop_front()) else {
            return false;
        };
        let from = self.ids[a].clone();
        self.rs[b].handle_message(&from, m, self.now);
        self.loads(b);
        true
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Change(i, v) => {
                let key = format!("k{}", v % 4);
                let d = id(30 + v % 2);
                self.rs[i].change(&d, |doc| put(doc, &key, i64::from(v)));
            }
            Op::Poll(i) => {
                self.poll(i);
            }
            Op::Deliver(a, b) => {
                self.deliver(a, b);
            }
            Op::Block(a, b) => {
                let p = self.ids[b].clone();
                self.rs[a].handle_blocked(&p);
            }
            Op::Unblock(a, b) => {
                let p = self.ids[b].clone();
                self.rs[a].handle_unblocked(&p);
            }
            Op::Disconnect(a, b) => self.disconnect(a, b),
            Op::Connect(a, b) => self.connect(a, b),
        }
        self.now += Duration::from_millis(10);
        for i in 0..3 {
            self.rs[i].handle_timeout(self.now);
            self.loads(i);
        }
    }

    fn settle(&mut self) {
        for (a, b) in [(0, 1), (1, 2), (0, 2)] {
            self.connect(a, b);
        }
        for a in 0..3 {
            for b in 0..3 {
                let p = self.ids[b].clone();
                self.rs[a].handle_unblocked(&p);
            }
        }
        let mut waited = false;
        for _ in 0..10_000 {
            let mut moved = false;
            for i in 0..3 {
                self.loads(i);
                moved |= self.poll(i);
            }
            for a in 0..3 {
                for b in 0..3 {
                    while self.deliver(a, b) {
                        moved = true;
                    }
                }
            }
            if !moved {
                // Messages held for an answer that will not come go once their wait is over,
                // and changes to pass on once theirs is.
                if waited {
                    return;
                }
                waited = true;
                self.now += crate::SYNC_ANSWER_WAIT.max(crate::RELAY_AFTER_HIGHER);
                for i in 0..3 {
                    self.rs[i].handle_timeout(self.now);
                }
            } else {
                waited = false;
            }
        }
        panic!("no quiescence");
    }
}

/// Delivers everything `from` sends to `to` at `now`; how many messages went.
fn deliver_all(from: &mut Replica, fp: &PeerId, to: &mut Replica, now: Instant) -> usize {
    let mut n = 0;
    while let Some((_, m)) = from.poll_transmit(now) {
        to.handle_message(fp, m, now);
        n += 1;
    }
    n
}

/// Two connected members of a group: `a` holds document 7 (`x` = 0), `b` an empty one.
fn two_members(a: &PeerId, b: &PeerId) -> (Replica, Replica) {
    let (mut ra, mut rb) = (Replica::new(), Replica::new());
    for r in [&mut ra, &mut rb] {
        r.set_group(&g(), members(&[a, b]));
        r.set_scope(&id(7), announced());
    }
    ra.handle_connected(b.clone());
    rb.handle_connected(a.clone());
    ra.create(id(7), doc_with("x", 0), None);
    rb.create(id(7), Automerge::new(), None);
    (ra, rb)
}

#[test]
fn s24_changes_wait_for_the_answer_to_the_last_message_and_travel_together() {
    let (a, b, _) = peers();
    let now = t0();
    let (mut ra, mut rb) = two_members(&a, &b);
    // Sync to quiescence, answering each other at once.
    for _ in 0..10 {
        deliver_all(&mut ra, &a, &mut rb, now);
        deliver_all(&mut rb, &b, &mut ra, now);
    }
    assert_eq!(get(&rb, &id(7), "x"), Some(0));

    // A change goes at once: nothing is unanswered after a quiet spell.
    ra.change(&id(7), |d| put(d, "x", 1));
    let (to, first) = ra
        .poll_transmit(now)
        .expect("the first change goes at once");
    assert_eq!(to, b);
    // Three more changes before b answers: held, and no timer beyond the answer wait.
    for v in 2..=4 {
        ra.change(&id(7), |d| put(d, "x", v));
        assert_eq!(ra.poll_transmit(now), None, "held until b answers");
    }
    assert_eq!(ra.poll_timeout(), Some(now + SYNC_ANSWER_WAIT));
    // b's answer releases them, as one message carrying all three.
    rb.handle_message(&a, first, now);
    assert_eq!(get(&rb, &id(7), "x"), Some(1));
    assert_eq!(deliver_all(&mut rb, &b, &mut ra, now), 1, "b answers");
    assert_eq!(
        deliver_all(&mut ra, &a, &mut rb, now),
        1,
        "one message for three changes"
    );
    assert_eq!(get(&rb, &id(7), "x"), Some(4));

    // An answer that never comes: the held change goes once the wait is over, not before.
    ra.change(&id(7), |d| put(d, "x", 5));
    assert_eq!(
        ra.poll_transmit(now),
        None,
        "the last message is not answered yet"
    );
    let half = now + SYNC_ANSWER_WAIT / 2;
    ra.handle_timeout(half);
    assert_eq!(ra.poll_transmit(half), None);
    let later = now + SYNC_ANSWER_WAIT;
    ra.handle_timeout(later);
    let (_, m) = ra.poll_transmit(later).expect("sent once the wait is over");
    rb.handle_message(&a, m, later);
    assert_eq!(get(&rb, &id(7), "x"), Some(5));
}

proptest::proptest! {
    #![proptest_config(piecework_proptest_config::config(64))]

    #[test]
    fn s23_replicas_converge_once_connected_and_unblocked(
        ops in proptest::collection::vec(op(), 0..120)
    ) {
        let mut sim = Sim::new();
        for o in ops {
            sim.apply(o);
        }
        sim.settle();
        for d in [id(30), id(31)] {
            let heads: Vec<Vec<automerge::ChangeHash>> = sim
                .rs
                .iter()
                .map(|r| {
                    let mut h = r.get(&d).map(|doc| doc.get_heads()).unwrap_or_default();
                    h.sort();
                    h
                })
                .collect();
            proptest::prop_assert!(!heads[0].is_empty(), "{d} reached nobody");
            proptest::prop_assert_eq!(&heads[0], &heads[1], "{}", d);
            proptest::prop_assert_eq!(&heads[1], &heads[2], "{}", d);
        }
    }
}

/// Three members, each told its own peer id, exchanging in rounds: every member sends what it
/// has to send, then every message is delivered (so two members that hear of a change in the
/// same round both act on it before hearing from each other, as on a real network). When
/// nothing moves, the clock goes to the next timer. Returns the messages that carried
/// changes, as (from, to).
fn run_three(rs: &mut [Replica; 3], ps: &[PeerId; 3], now: &mut Instant) -> Vec<(usize, usize)> {
    let mut carried = vec![];
    for _ in 0..1_000 {
        let mut wire = vec![];
        for (i, r) in rs.iter_mut().enumerate() {
            while let Some((to, m)) = r.poll_transmit(*now) {
                let j = ps.iter().position(|p| *p == to).expect("a member");
                if let Message::Sync { data, .. } = &m
                    && !automerge::sync::Message::decode(data)
                        .expect("own messages decode")
                        .changes
                        .is_empty()
                {
                    carried.push((i, j));
                }
                wire.push((i, j, m));
            }
        }
        if wire.is_empty() {
            let Some(at) = rs.iter().filter_map(Replica::poll_timeout).min() else {
                return carried;
            };
            *now = (*now).max(at);
            for r in rs.iter_mut() {
                r.handle_timeout(*now);
            }
        }
        for (i, j, m) in wire {
            let from = ps[i].clone();
            rs[j].handle_message(&from, m, *now);
        }
    }
    panic!("no quiescence");
}

fn three_members(connected: &[(usize, usize)]) -> ([Replica; 3], [PeerId; 3]) {
    let ps = [PeerId::new("a"), PeerId::new("b"), PeerId::new("c")];
    let mut rs = [Replica::new(), Replica::new(), Replica::new()];
    for (i, r) in rs.iter_mut().enumerate() {
        r.set_local_peer(ps[i].clone());
        r.set_group(&g(), members(&[&ps[0], &ps[1], &ps[2]]));
        r.set_scope(&id(9), announced());
    }
    for &(i, j) in connected {
        let (pi, pj) = (ps[i].clone(), ps[j].clone());
        rs[i].handle_connected(pj);
        rs[j].handle_connected(pi);
    }
    rs[0].create(id(9), doc_with("x", 0), None);
    for r in &mut rs[1..] {
        r.create(id(9), Automerge::new(), None);
    }
    (rs, ps)
}

#[test]
fn s25_members_do_not_pass_each_other_what_both_had_from_its_author() {
    let (mut rs, ps) = three_members(&[(0, 1), (1, 2), (0, 2)]);
    let mut now = t0();
    run_three(&mut rs, &ps, &mut now);
    for v in 1..=5 {
        rs[0].change(&id(9), |d| put(d, "x", v));
        let carried = run_three(&mut rs, &ps, &mut now);
        assert_eq!(get(&rs[1], &id(9), "x"), Some(v));
        assert_eq!(get(&rs[2], &id(9), "x"), Some(v));
        // a sends the change to b and to c. Before RELAY_AFTER, b and c, hearing of it in
        // the same round, each passed it on to the other at once: four messages with
        // changes, two of them useless. Then c waited longer and heard from b, but b still
        // sent the change c had. Now b first says what it has, c answers that it has it too,
        // and neither sends the change.
        let between: Vec<_> = carried.iter().filter(|(i, j)| *i != 0 && *j != 0).collect();
        assert!(
            between.is_empty(),
            "change {v}: b and c passed it to each other: {carried:?}"
        );
        assert!(
            carried.contains(&(0, 1)) && carried.contains(&(0, 2)),
            "{carried:?}"
        );
    }
}

#[test]
fn s26_a_change_reaches_a_member_its_author_cannot_reach_after_the_relay_wait() {
    // b's id is below c's: b waits RELAY_AFTER.
    assert_eq!(relayed_after(None), crate::RELAY_AFTER);
}

#[test]
fn s28_the_relay_waits_can_be_set() {
    let waits = (Duration::from_millis(35), Duration::from_millis(80));
    assert_eq!(relayed_after(Some(waits)), waits.0);
}

/// a and c are not connected: how long after a's change b passes it on to c, with `waits`
/// set on every replica.
fn relayed_after(waits: Option<(Duration, Duration)>) -> Duration {
    let (mut rs, ps) = three_members(&[(0, 1), (1, 2)]);
    if let Some((lower, higher)) = waits {
        for r in &mut rs {
            r.set_relay_waits(lower, higher);
        }
    }
    let mut now = t0();
    run_three(&mut rs, &ps, &mut now);
    assert_eq!(get(&rs[2], &id(9), "x"), Some(0));
    rs[0].change(&id(9), |d| put(d, "x", 1));
    let start = now;
    // Delivered at once, no time passing: b has it, c not yet.
    for _ in 0..10 {
        for i in 0..3 {
            while let Some((to, m)) = rs[i].poll_transmit(now) {
                let j = ps.iter().position(|p| *p == to).expect("a member");
                let from = ps[i].clone();
                rs[j].handle_message(&from, m, now);
            }
        }
    }
    // (The rounds of `run_three` would move the clock; these do not.)
    assert_eq!(get(&rs[1], &id(9), "x"), Some(1));
    assert_eq!(
        get(&rs[2], &id(9), "x"),
        Some(0),
        "passed on before the wait"
    );
    let due = rs[1].poll_timeout().expect("a relay due");
    run_three(&mut rs, &ps, &mut now);
    assert_eq!(get(&rs[2], &id(9), "x"), Some(1));
    assert_eq!(now, due);
    now - start
}

/// The chunk types in a sync message's changes (Automerge's storage format: magic bytes,
/// checksum, then the type: 0 a whole document, 1 a change).
fn chunk_types(msg: &Message) -> Vec<u8> {
    let Message::Sync { data, .. } = msg else {
        return vec![];
    };
    let m = automerge::sync::Message::decode(data).expect("a sync message");
    m.changes.iter().map(|c| c[8]).collect()
}

#[test]
fn s27_a_peer_holding_part_of_a_small_document_gets_only_the_change_it_lacks() {
    let (a, b, _) = peers();
    let now = t0();
    let (mut ra, mut rb) = two_members(&a, &b);
    // A peer holding nothing gets the whole document.
    let (_, m) = ra.poll_transmit(now).expect("a's first message");
    rb.handle_message(&a, m, now);
    let (_, m) = rb.poll_transmit(now).expect("b says it has nothing");
    ra.handle_message(&b, m, now);
    let (_, whole) = ra.poll_transmit(now).expect("the document");
    assert_eq!(chunk_types(&whole), vec![0], "the whole document");
    rb.handle_message(&a, whole, now);
    for _ in 0..10 {
        deliver_all(&mut rb, &b, &mut ra, now);
        deliver_all(&mut ra, &a, &mut rb, now);
    }
    assert_eq!(get(&rb, &id(7), "x"), Some(0));
    // One more change is half the document's history: Automerge would send the whole
    // document again. It goes as the one change.
    ra.change(&id(7), |d| put(d, "x", 1));
    let (_, m) = ra.poll_transmit(now).expect("the change");
    assert_eq!(chunk_types(&m), vec![1], "one change, not the document");
    rb.handle_message(&a, m, now);
    assert_eq!(get(&rb, &id(7), "x"), Some(1));
}
