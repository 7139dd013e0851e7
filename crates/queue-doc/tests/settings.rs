//! The queue's run-time settings (the pause flag and the config's fields): written by any
//! member, merged field by field, refused whole when invalid, and carried into a successor
//! epoch as registers whose greatest write wins; and schedules with their slot records, which
//! are carried the same way.

use automerge::{ActorId, Automerge};
use piecework_queue_doc::epoch::{self, Rotation};
use piecework_queue_doc::{
    Claim, ConfigPatch, Order, PeerId, QueueConfig, QueueId, QueueView, SetConfigError, TaskId,
    queue,
};
use proptest::prelude::*;

fn new_queue() -> Automerge {
    let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
    queue::create(&mut doc, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
    doc
}

fn fork(doc: &Automerge, actor: u8) -> Automerge {
    doc.fork().with_actor(ActorId::from(vec![actor; 16]))
}

fn rotate(old: &Automerge) -> Automerge {
    let origin = QueueId::new("automerge:q0");
    let sealer = Claim::new(1, PeerId::new("router"));
    let view = QueueView::read(old).unwrap();
    let mut succ = Automerge::new().with_actor(ActorId::from(vec![9u8; 16]));
    epoch::build_successor(
        old,
        &view,
        &mut succ,
        &Rotation {
            origin: &origin,
            prev: "automerge:q0",
            successor: "automerge:q1",
            epoch: 1,
            claim: &sealer,
            now_ms: 1_000,
        },
    )
    .unwrap();
    succ
}

fn carry(from: &Automerge, since: &[automerge::ChangeHash], into: &mut Automerge) -> usize {
    let none = |_: &TaskId| false;
    epoch::carry(from, since, into, &none, None, usize::MAX)
        .unwrap()
        .writes
}

fn view(doc: &Automerge) -> QueueView {
    QueueView::read(doc).unwrap()
}

#[test]
fn a_config_change_sets_only_its_fields_and_an_invalid_one_writes_nothing() {
    let mut doc = new_queue();
    let patch = ConfigPatch {
        concurrency: Some(4),
        order: Some(Order::Lifo),
        ..ConfigPatch::default()
    };
    let c = queue::set_config(&mut doc, &patch, 10).unwrap();
    assert_eq!(c.concurrency, 4);
    assert_eq!(view(&doc).config, c);
    assert_eq!(
        view(&doc).config,
        QueueConfig {
            concurrency: 4,
            order: Order::Lifo,
            ..QueueConfig::default()
        }
    );
    // A lease shorter than two pool heartbeats cannot work: refused, nothing written.
    let heads = doc.get_heads();
    let bad = ConfigPatch {
        lease_ms: Some(1),
        ..ConfigPatch::default()
    };
    assert!(matches!(
        queue::set_config(&mut doc, &bad, 20),
        Err(SetConfigError::Invalid(_))
    ));
    assert_eq!(doc.get_heads(), heads);
}

#[test]
fn members_that_change_different_fields_at_once_both_keep_their_change() {
    let doc = new_queue();
    let mut a = fork(&doc, 2);
    let mut b = fork(&doc, 3);
    let lease = ConfigPatch {
        lease_ms: Some(30_000),
        ..ConfigPatch::default()
    };
    let concurrency = ConfigPatch {
        concurrency: Some(2),
        ..ConfigPatch::default()
    };
    queue::set_config(&mut a, &lease, 10).unwrap();
    queue::set_config(&mut b, &concurrency, 10).unwrap();
    a.merge(&mut b).unwrap();
    let c = view(&a).config;
    assert_eq!((c.lease_ms, c.concurrency), (30_000, 2));
}

#[test]
fn a_pause_written_after_the_seal_reaches_the_successor_once() {
    let old = new_queue();
    let mut succ = rotate(&old);
    let seal_heads = old.get_heads();
    let mut late = fork(&old, 2);
    queue::set_paused(&mut late, true, 5_000).unwrap();
    queue::set_config(
        &mut late,
        &ConfigPatch {
            rate_interval_ms: Some(250),
            ..ConfigPatch::default()
        },
        5_001,
    )
    .unwrap();
    assert!(!view(&succ).paused);
    assert_eq!(carry(&late, &seal_heads, &mut succ), 2);
    assert!(view(&succ).paused);
    assert_eq!(view(&succ).config.rate_interval_ms, 250);
    // Carrying again, from the start, writes nothing.
    let heads = succ.get_heads();
    assert_eq!(carry(&late, &seal_heads, &mut succ), 0);
    assert_eq!(succ.get_heads(), heads);
}

#[test]
fn a_later_resume_in_the_successor_outranks_an_earlier_late_pause() {
    let old = new_queue();
    let mut succ = rotate(&old);
    let seal_heads = old.get_heads();
    let mut late = fork(&old, 2);
    queue::set_paused(&mut late, true, 5_000).unwrap();
    queue::set_paused(&mut succ, false, 6_000).unwrap();
    assert_eq!(carry(&late, &seal_heads, &mut succ), 0);
    assert!(!view(&succ).paused);
    // And an earlier resume in the successor gives way to a later pause carried.
    let mut succ2 = rotate(&old);
    queue::set_paused(&mut succ2, false, 4_000).unwrap();
    assert_eq!(carry(&late, &seal_heads, &mut succ2), 1);
    assert!(view(&succ2).paused);
}

#[test]
fn a_rotation_keeps_each_settings_time_and_a_late_write_outranks_it() {
    let mut old = new_queue();
    queue::set_paused(&mut old, true, 7_000).unwrap();
    let mut succ = rotate(&old);
    assert!(view(&succ).paused);
    assert_eq!(registers(&succ), registers(&old));
    // A resume written after the seal by a member whose clock is behind still replaced the
    // pause in its document: it outranks it in the successor too.
    let seal_heads = old.get_heads();
    let mut late = fork(&old, 2);
    queue::set_paused(&mut late, false, 6_000).unwrap();
    assert_eq!(carry(&late, &seal_heads, &mut succ), 1);
    assert!(!view(&succ).paused);
}

/// A write of a setting: into the sealed document (late) or the successor, at a time.
#[derive(Clone, Debug)]
struct Write {
    late: bool,
    paused: bool,
    concurrency: u32,
    at: u64,
}

fn write() -> impl Strategy<Value = Write> {
    (any::<bool>(), any::<bool>(), 0..4u32, 0..20u64).prop_map(|(late, paused, concurrency, at)| {
        Write {
            late,
            paused,
            concurrency,
            at,
        }
    })
}

/// A document's registers of the pause flag and of `concurrency`: `(time, value as text)`,
/// read from the keys themselves.
fn registers(doc: &Automerge) -> [(u64, String); 2] {
    use automerge::{ObjType, ROOT, ReadDoc};
    let uint = |obj: &automerge::ObjId, key: &str| match doc.get(obj, key).unwrap() {
        Some((automerge::Value::Scalar(v), _)) => v.as_u64().unwrap_or(0),
        _ => 0,
    };
    let text = |obj: &automerge::ObjId, key: &str| match doc.get(obj, key).unwrap() {
        Some((automerge::Value::Scalar(v), _)) => v.to_string(),
        _ => String::new(),
    };
    let config = match doc.get(ROOT, "config").unwrap() {
        Some((automerge::Value::Object(ObjType::Map), id)) => id,
        _ => panic!("no config map"),
    };
    [
        (uint(&ROOT, "paused_at"), text(&ROOT, "paused")),
        (
            uint(&config, "concurrency_at"),
            text(&config, "concurrency"),
        ),
    ]
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(128))]

    /// Whatever the writes on each side (their clocks in any order) and however often and in
    /// what steps the late ones are carried: each setting of the successor ends at the greater
    /// of the two documents' registers, a write always outranks the one it replaced in its
    /// document, and carrying everything again changes nothing.
    #[test]
    fn carried_settings_end_at_the_greatest_write(
        writes in proptest::collection::vec(write(), 0..12),
        carries in proptest::collection::vec(0..12usize, 0..4),
    ) {
        let old = new_queue();
        let mut succ = rotate(&old);
        let seal_heads = old.get_heads();
        let mut late = fork(&old, 2);
        let mut since = seal_heads.clone();
        for (i, w) in writes.iter().enumerate() {
            let doc = if w.late { &mut late } else { &mut succ };
            let before = registers(doc);
            queue::set_paused(doc, w.paused, w.at).unwrap();
            let patch = ConfigPatch { concurrency: Some(w.concurrency), ..ConfigPatch::default() };
            queue::set_config(doc, &patch, w.at).unwrap();
            let after = registers(doc);
            prop_assert!(after[0].0 > before[0].0 || before[0].0 == u64::MAX);
            prop_assert!(after[1].0 > before[1].0 || before[1].0 == u64::MAX);
            prop_assert_eq!(view(doc).paused, w.paused);
            prop_assert_eq!(view(doc).config.concurrency, w.concurrency);
            if carries.contains(&i) {
                carry(&late, &since, &mut succ);
                since = late.get_heads();
            }
        }
        let (l, s) = (registers(&late), registers(&succ));
        carry(&late, &since, &mut succ);
        let ended = registers(&succ);
        for k in 0..2 {
            prop_assert_eq!(&ended[k], std::cmp::max(&l[k], &s[k]), "setting {}", k);
        }
        let heads = succ.get_heads();
        carry(&late, &seal_heads, &mut succ);
        prop_assert_eq!(succ.get_heads(), heads);
    }
}

/// A schedule's record and its slot record, as a view reads them.
fn schedule(doc: &Automerge, name: &str) -> Option<piecework_queue_doc::Schedule> {
    view(doc).schedules.get(name).cloned()
}

fn firing(slot: u64, missed: u64) -> piecework_queue_doc::Firing {
    piecework_queue_doc::Firing {
        schedule: "tick".into(),
        slot,
        missed,
    }
}

#[test]
fn a_schedule_and_its_last_slot_reach_the_successor_by_rotation_and_by_carry() {
    use piecework_queue_doc::Every;
    let mut old = new_queue();
    queue::put_schedule(
        &mut old,
        "tick",
        Every::Ms(1_000),
        r#"{"kind":"k"}"#.into(),
        false,
        2_500,
    )
    .unwrap();
    let s = schedule(&old, "tick").unwrap();
    // Written at 2500: the next slot is 3000.
    assert_eq!((s.slot.s, s.next_fire_at()), (2_500, Some(3_000)));
    queue::submit_fired(&mut old, &[], &[], &[], &[firing(3_000, 0)], 3_001).unwrap();
    let mut succ = rotate(&old);
    assert_eq!(schedule(&succ, "tick"), schedule(&old, "tick"));
    assert_eq!(schedule(&succ, "tick").unwrap().slot.l, 3_000);
    // A router that has not moved over yet fires the next slot into the sealed document.
    let seal_heads = old.get_heads();
    let mut late = fork(&old, 2);
    queue::submit_fired(&mut late, &[], &[], &[], &[firing(4_000, 0)], 4_001).unwrap();
    assert_eq!(carry(&late, &seal_heads, &mut succ), 1);
    let s = schedule(&succ, "tick").unwrap();
    assert_eq!(
        (s.slot.s, s.slot.l, s.next_fire_at()),
        (4_000, 4_000, Some(5_000))
    );
    // A successor router therefore fires 5000 next, not 4000 again.
    assert_eq!(s.due("tick", 4_999), None);
    assert_eq!(s.due("tick", 5_000).unwrap().slot, 5_000);
    let heads = succ.get_heads();
    assert_eq!(carry(&late, &seal_heads, &mut succ), 0);
    assert_eq!(succ.get_heads(), heads);
    // A deletion carries like any write (its record, and its slot record moved to its time).
    let mut later = fork(&old, 3);
    queue::delete_schedule(&mut later, "tick", 9_000).unwrap();
    assert_eq!(carry(&later, &seal_heads, &mut succ), 2);
    assert_eq!(schedule(&succ, "tick"), None);
}

#[test]
fn concurrent_firings_merge_to_the_greatest_slot() {
    use piecework_queue_doc::Every;
    let mut doc = new_queue();
    queue::put_schedule(&mut doc, "tick", Every::Ms(1_000), "{}".into(), false, 0).unwrap();
    let mut a = fork(&doc, 2);
    let mut b = fork(&doc, 3);
    queue::submit_fired(&mut a, &[], &[], &[], &[firing(5_000, 0)], 5_000).unwrap();
    queue::submit_fired(&mut b, &[], &[], &[], &[firing(3_000, 1)], 3_000).unwrap();
    a.merge(&mut b).unwrap();
    b.merge(&mut a.clone()).unwrap();
    for d in [&a, &b] {
        let s = schedule(d, "tick").unwrap();
        assert_eq!((s.slot.s, s.slot.m), (5_000, 0));
    }
    // Resuming a paused schedule passes over the slots it was paused through.
    queue::put_schedule(&mut a, "tick", Every::Ms(1_000), "{}".into(), true, 6_000).unwrap();
    assert_eq!(schedule(&a, "tick").unwrap().due("tick", 9_000), None);
    queue::put_schedule(&mut a, "tick", Every::Ms(1_000), "{}".into(), false, 9_500).unwrap();
    let s = schedule(&a, "tick").unwrap();
    assert_eq!(s.due("tick", 9_999), None);
    assert_eq!(s.due("tick", 10_000).unwrap().missed, 0);
}
