//! Values from peers are validated when read: a queue document written by a faulty or hostile
//! peer (values written with automerge directly, bypassing the typed operations) reads as a
//! configuration within its documented ranges, without unbeatable router claims, and with every
//! replica computing the same.

use automerge::transaction::Transactable;
use automerge::{Automerge, AutomergeError, ObjId, ObjType, ROOT, ReadDoc, ScalarValue};
use piecework_queue_doc::queue::{AssignError, WriteError};
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, ConfigError, MAX_TERM, Order, PeerId,
    QueueConfig, QueueView, Submission, TaskId, ViewCache, WorkerId, queue,
};
use proptest::prelude::*;

/// The keys of the numeric configuration fields, as the queue document stores them.
const FIELDS: [&str; 10] = [
    "heartbeat_ms",
    "takeover_after_ms",
    "settle_ms",
    "pool_heartbeat_ms",
    "lease_ms",
    "max_attempts",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "concurrency",
    "rate_interval_ms",
];

fn me() -> PeerId {
    PeerId::new("peer-a")
}

fn new_queue() -> Automerge {
    let mut doc = Automerge::new();
    queue::create(&mut doc, "q", &QueueConfig::default(), &me(), 0).unwrap();
    doc
}

fn object(doc: &Automerge, obj: &ObjId, key: &str) -> ObjId {
    match doc.get(obj, key).unwrap() {
        Some((automerge::Value::Object(_), id)) => id,
        other => panic!("{key} is not an object: {other:?}"),
    }
}

/// Overwrites configuration values the way a hostile peer could: straight into the document.
fn write_config(doc: &mut Automerge, values: &[(&str, u64)]) {
    let config = object(doc, &ROOT, "config");
    doc.transact::<_, _, AutomergeError>(|tx| {
        for (k, v) in values {
            tx.put(&config, *k, *v)?;
        }
        Ok(())
    })
    .unwrap();
}

/// Every field within its documented range, and the relations `validate` checks.
fn assert_in_ranges(c: &QueueConfig) {
    type C = QueueConfig;
    assert!((C::MIN_HEARTBEAT_MS..=C::MAX_HEARTBEAT_MS).contains(&c.heartbeat_ms));
    assert!((2 * c.heartbeat_ms..=C::MAX_TAKEOVER_AFTER_MS).contains(&c.takeover_after_ms));
    assert!((C::MIN_SETTLE_MS..=C::MAX_SETTLE_MS).contains(&c.settle_ms));
    assert!((C::MIN_POOL_HEARTBEAT_MS..=C::MAX_POOL_HEARTBEAT_MS).contains(&c.pool_heartbeat_ms));
    assert!((2 * c.pool_heartbeat_ms..=C::MAX_LEASE_MS).contains(&c.lease_ms));
    assert!((C::MIN_MAX_ATTEMPTS..=C::MAX_MAX_ATTEMPTS).contains(&c.max_attempts));
    assert!((C::MIN_RETRY_BACKOFF_MS..=C::MAX_RETRY_BACKOFF_MS).contains(&c.retry_backoff_ms));
    assert!((c.retry_backoff_ms..=C::MAX_RETRY_BACKOFF_MS).contains(&c.retry_backoff_max_ms));
    assert!(c.concurrency <= C::MAX_CONCURRENCY);
    assert!(c.rate_interval_ms <= C::MAX_RATE_INTERVAL_MS);
    assert_eq!(c.validate(), Ok(()));
}

#[test]
fn config_values_of_u64_max_read_clamped_to_the_maximums() {
    let mut doc = new_queue();
    let values: Vec<(&str, u64)> = FIELDS.iter().map(|k| (*k, u64::MAX)).collect();
    write_config(&mut doc, &values);
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(
        view.config,
        QueueConfig {
            heartbeat_ms: QueueConfig::MAX_HEARTBEAT_MS,
            takeover_after_ms: QueueConfig::MAX_TAKEOVER_AFTER_MS,
            settle_ms: QueueConfig::MAX_SETTLE_MS,
            pool_heartbeat_ms: QueueConfig::MAX_POOL_HEARTBEAT_MS,
            lease_ms: QueueConfig::MAX_LEASE_MS,
            max_attempts: QueueConfig::MAX_MAX_ATTEMPTS,
            retry_backoff_ms: QueueConfig::MAX_RETRY_BACKOFF_MS,
            retry_backoff_max_ms: QueueConfig::MAX_RETRY_BACKOFF_MS,
            concurrency: QueueConfig::MAX_CONCURRENCY,
            rate_interval_ms: QueueConfig::MAX_RATE_INTERVAL_MS,
            order: Order::Fifo,
            timeout_ms: 0,
            failure_policy: Default::default(),
        }
    );
    assert_in_ranges(&view.config);
    // The incremental view clamps the same way.
    let mut cache = ViewCache::new();
    assert_eq!(cache.refresh(&doc).unwrap().config, view.config);
}

#[test]
fn a_zero_config_reads_clamped_to_the_minimums() {
    let mut doc = new_queue();
    let values: Vec<(&str, u64)> = FIELDS.iter().map(|k| (*k, 0)).collect();
    write_config(&mut doc, &values);
    let c = QueueView::read(&doc).unwrap().config;
    assert_eq!(
        c.heartbeat_ms,
        QueueConfig::MIN_HEARTBEAT_MS,
        "no busy loop"
    );
    assert_eq!(c.takeover_after_ms, 2 * QueueConfig::MIN_HEARTBEAT_MS);
    assert_eq!(c.settle_ms, QueueConfig::MIN_SETTLE_MS);
    assert_eq!(c.pool_heartbeat_ms, QueueConfig::MIN_POOL_HEARTBEAT_MS);
    assert_eq!(c.lease_ms, 2 * QueueConfig::MIN_POOL_HEARTBEAT_MS);
    assert_eq!(c.max_attempts, 1);
    assert_eq!(
        (c.retry_backoff_ms, c.retry_backoff_max_ms),
        (
            QueueConfig::MIN_RETRY_BACKOFF_MS,
            QueueConfig::MIN_RETRY_BACKOFF_MS
        )
    );
    assert_eq!(
        (c.concurrency, c.rate_interval_ms),
        (0, 0),
        "0 means no limit"
    );
    assert_in_ranges(&c);
}

#[test]
fn a_valid_config_reads_back_unchanged_and_an_out_of_range_one_is_refused() {
    let mut doc = Automerge::new();
    let config = QueueConfig {
        heartbeat_ms: 20,
        takeover_after_ms: 40,
        settle_ms: 1,
        pool_heartbeat_ms: 10,
        lease_ms: 20,
        max_attempts: 1_000,
        retry_backoff_ms: 7,
        retry_backoff_max_ms: 7,
        concurrency: 1_000_000,
        rate_interval_ms: 86_400_000,
        order: Order::Lifo,
        timeout_ms: 0,
        failure_policy: Default::default(),
    };
    queue::create(&mut doc, "q", &config, &me(), 0).unwrap();
    assert_eq!(QueueView::read(&doc).unwrap().config, config);
    let too_fast = QueueConfig {
        heartbeat_ms: 5,
        ..QueueConfig::default()
    };
    assert!(matches!(
        queue::create(&mut Automerge::new(), "q", &too_fast, &me(), 0),
        Err(queue::CreateQueueError::Config(ConfigError::OutOfRange {
            field: "heartbeat_ms",
            ..
        }))
    ));
}

/// A fork of `doc` that wrote a raw router claim (merged back, it is concurrent with the
/// claims of `doc` and of other such forks).
fn raw_claim_fork(doc: &Automerge, term: u64, peer: &str) -> Automerge {
    let mut fork = doc.fork();
    fork.transact::<_, _, AutomergeError>(|tx| {
        let r = tx.put_object(ROOT, "router", ObjType::Map)?;
        tx.put(&r, "term", term)?;
        tx.put(&r, "peer", peer)?;
        tx.put(&r, "claimed_at", 0u64)?;
        Ok(())
    })
    .unwrap();
    fork
}

/// A fork of `doc` that wrote a raw chained claim record at `term` naming `prev` as the
/// claimant it supersedes at the term below (as a member's own writer could).
fn raw_chained_fork(doc: &Automerge, term: u64, peer: &str, prev: Option<&str>) -> Automerge {
    let mut fork = doc.fork();
    fork.transact::<_, _, AutomergeError>(|tx| {
        let claims = match tx.get(ROOT, "claims")? {
            Some((automerge::Value::Object(ObjType::Map), id)) => id,
            _ => tx.put_object(ROOT, "claims", ObjType::Map)?,
        };
        let rec = match prev {
            Some(p) => format!(r#"{{"t":{term},"c":"{peer}","p":"{p}","a":0}}"#),
            None => format!(r#"{{"t":{term},"c":"{peer}","a":0}}"#),
        };
        tx.put(&claims, format!("{term}/{peer}"), rec)?;
        Ok(())
    })
    .unwrap();
    fork
}

/// Claims a member wrote that no honest router could: in the router record at `u64::MAX`,
/// above [`MAX_TERM`] and at it; a chained claim at the term bound naming a claim that does
/// not count; and a claim that skips a term (term 5 naming a claim at term 4 nobody wrote).
/// None counts; each is counted as malformed, in a full read and incrementally; the honest
/// chain (terms 1, 2, 3) is the effective router. The typed write refuses both a term above
/// the bound and a skip. (Before claims were chained, the record at `MAX_TERM` was the
/// effective router and nobody could out-claim it.)
#[test]
fn a_claim_that_skips_a_term_or_passes_the_bound_does_not_count() {
    let mut doc = new_queue();
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    let mut forks = vec![
        raw_claim_fork(&doc, u64::MAX, "z"),
        raw_claim_fork(&doc, MAX_TERM + 1, "y"),
        raw_claim_fork(&doc, MAX_TERM, "x"),
        raw_chained_fork(&doc, MAX_TERM, "w", Some("a")),
        raw_chained_fork(&doc, 5, "v", Some("a")),
    ];
    for t in 1..=3 {
        queue::claim_router(&mut doc, &Claim::new(t, PeerId::new("a")), t).unwrap();
    }
    let honest = Claim::new(3, PeerId::new("a"));
    for fork in &mut forks {
        doc.merge(fork).unwrap();
    }
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.router, Some(honest.clone()));
    assert_eq!(
        view.claims,
        (1..=3)
            .map(|t| Claim::new(t, PeerId::new("a")))
            .collect::<Vec<_>>()
    );
    assert_eq!(view.malformed, 5);
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view, "incremental");
    assert_eq!(
        ViewCache::new().refresh(&doc).unwrap().as_ref(),
        &view,
        "full"
    );
    // A later change elsewhere does not count the bad claims twice.
    queue::set_paused(&mut doc, true, 0).unwrap();
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.malformed, 5);
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view);
    // The next honest claim names the effective one and counts.
    queue::claim_router(&mut doc, &Claim::new(4, PeerId::new("b")), 4).unwrap();
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.router, Some(Claim::new(4, PeerId::new("b"))));
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view);
    // The skip at term 5 named "a" at term 4; "b" holds term 4, so it still does not count.
    assert_eq!(view.malformed, 5);
    // The typed write refuses what readers would ignore.
    assert!(matches!(
        queue::claim_router(&mut doc, &Claim::new(MAX_TERM + 1, PeerId::new("c")), 5),
        Err(WriteError::TermTooLarge(t)) if t == MAX_TERM + 1
    ));
    assert!(matches!(
        queue::claim_router(&mut doc, &Claim::new(9, PeerId::new("c")), 5),
        Err(WriteError::SkipsTerm(9))
    ));
}

fn submit(doc: &mut Automerge, n: u32) -> TaskId {
    let id = TaskId::new(format!("automerge:t{n}"));
    queue::submit(
        doc,
        &Submission {
            id: id.clone(),
            kind: "k".into(),
            submitter: me(),
            submitted_at: u64::from(n),
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: Default::default(),
        },
    )
    .unwrap();
    id
}

/// Indexes a task the way layout 1 wrote it (a map of fields with a list of attempts), as a
/// document written by an earlier version holds it.
fn v1_task(doc: &mut Automerge, n: u32) -> TaskId {
    let id = TaskId::new(format!("automerge:v1task{n}"));
    let tasks = object(doc, &ROOT, "tasks");
    doc.transact::<_, _, AutomergeError>(|tx| {
        let e = tx.put_object(&tasks, id.as_str(), ObjType::Map)?;
        tx.put(&e, "kind", "k")?;
        tx.put(&e, "submitted_at", u64::from(n))?;
        tx.put(&e, "submitter", me().as_str())?;
        tx.put(&e, "priority", ScalarValue::Int(0))?;
        tx.put(&e, "urgent", false)?;
        tx.put(&e, "max_attempts", 3u64)?;
        tx.put_object(&e, "attempts", ObjType::List)?;
        Ok(())
    })
    .unwrap();
    id
}

/// Writes a raw layout-2 record, as a hostile peer could.
fn raw_packed(doc: &mut Automerge, map: &str, key: &str, value: &str) {
    let m = object(doc, &ROOT, map);
    doc.transact::<_, _, AutomergeError>(|tx| {
        tx.put(&m, key, value)?;
        Ok(())
    })
    .unwrap();
}

/// Appends a raw attempt to a layout-1 task's list, with the given extra fields.
fn raw_attempt(doc: &mut Automerge, task: &TaskId, term: u64, extra: &[(&str, ScalarValue)]) {
    let tasks = object(doc, &ROOT, "tasks");
    let entry = object(doc, &tasks, task.as_str());
    let list = object(doc, &entry, "attempts");
    doc.transact::<_, _, AutomergeError>(|tx| {
        let len = tx.length(&list);
        let a = tx.insert_object(&list, len, ObjType::Map)?;
        tx.put(&a, "n", 1u64)?;
        tx.put(&a, "term", term)?;
        tx.put(&a, "router", "r")?;
        tx.put(&a, "worker", "peer-a/0")?;
        tx.put(&a, "assigned_at", 0u64)?;
        for (k, v) in extra {
            tx.put(&a, *k, v.clone())?;
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn attempts_name_the_pool_incarnation_they_are_addressed_to() {
    let mut doc = new_queue();
    let (t1, t2, t3) = (
        submit(&mut doc, 1),
        v1_task(&mut doc, 2),
        v1_task(&mut doc, 3),
    );
    let claim = Claim::new(1, PeerId::new("r"));
    queue::record_assignments(
        &mut doc,
        &[Assignment {
            task: t1.clone(),
            attempt: AttemptId {
                n: 1,
                claim: claim.clone(),
            },
            worker: WorkerId::new(me(), 0),
            incarnation: 7,
        }],
        0,
    )
    .unwrap();
    // Written before attempts named an incarnation: unknown, still readable.
    raw_attempt(&mut doc, &t2, 1, &[]);
    // A pool incarnation that is not a number: malformed.
    raw_attempt(&mut doc, &t3, 1, &[("pool_incarnation", "seven".into())]);
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.tasks()[&t1].attempts[0].pool_incarnation, Some(7));
    assert_eq!(view.tasks()[&t2].attempts[0].pool_incarnation, None);
    assert!(view.tasks()[&t3].attempts.is_empty());
    assert_eq!(view.malformed, 1);
    assert_eq!(ViewCache::new().refresh(&doc).unwrap().as_ref(), &view);
}

#[test]
fn attempts_under_a_claim_above_max_term_are_malformed() {
    let mut doc = new_queue();
    let t = v1_task(&mut doc, 1);
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    raw_attempt(&mut doc, &t, u64::MAX, &[("pool_incarnation", 1u64.into())]);
    let view = QueueView::read(&doc).unwrap();
    assert!(
        view.tasks()[&t].attempts.is_empty(),
        "it would pass every fence"
    );
    assert_eq!(view.malformed, 1);
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view);
    // Re-reading the task (another change to it) does not count it twice.
    raw_attempt(&mut doc, &t, 1, &[]);
    let view = QueueView::read(&doc).unwrap();
    assert_eq!((view.tasks()[&t].attempts.len(), view.malformed), (1, 1));
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view);
    let too_large = Assignment {
        task: t,
        attempt: AttemptId {
            n: 2,
            claim: Claim::new(MAX_TERM + 1, PeerId::new("r")),
        },
        worker: WorkerId::new(me(), 0),
        incarnation: 1,
    };
    assert!(matches!(
        queue::record_assignments(&mut doc, &[too_large], 0),
        Err(AssignError::TermTooLarge(_))
    ));
    // The same in layout 2: a key under a term above MAX_TERM, a value that does not parse,
    // a key that names no attempt.
    let t2 = submit(&mut doc, 2);
    let assigned = r#"{"w":"peer-a/0","i":1,"a":0}"#;
    raw_packed(
        &mut doc,
        "assigned",
        &format!("{t2}/1/{}/r", u64::MAX),
        assigned,
    );
    raw_packed(&mut doc, "assigned", &format!("{t2}/2/1/r"), "not json");
    raw_packed(&mut doc, "assigned", &format!("{t2}/x"), assigned);
    raw_packed(&mut doc, "assigned", &format!("{t2}/3/1/r"), assigned);
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.tasks()[&t2].attempts.len(), 1);
    assert_eq!(view.malformed, 1 + 3);
    assert_eq!(cache.refresh(&doc).unwrap().as_ref(), &view);
}

#[test]
fn task_limits_and_priorities_read_clamped() {
    let mut doc = new_queue();
    let t = v1_task(&mut doc, 1);
    let tasks = object(&doc, &ROOT, "tasks");
    let entry = object(&doc, &tasks, t.as_str());
    doc.transact::<_, _, AutomergeError>(|tx| {
        tx.put(&entry, "max_attempts", u64::MAX)?;
        tx.put(&entry, "priority", ScalarValue::Int(i64::MIN))?;
        Ok(())
    })
    .unwrap();
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(view.tasks()[&t].max_attempts, QueueConfig::MAX_MAX_ATTEMPTS);
    assert_eq!(view.tasks()[&t].priority, -queue::MAX_PRIORITY);
    // Layout 2: the packed entry's values are clamped the same way.
    let id = TaskId::new("automerge:packed");
    let entry = format!(
        r#"{{"k":"k","t":1,"s":"peer-a","p":{},"u":false,"m":{}}}"#,
        i64::MIN,
        u64::MAX
    );
    raw_packed(&mut doc, "tasks", id.as_str(), &entry);
    let view = QueueView::read(&doc).unwrap();
    assert_eq!(
        view.tasks()[&id].max_attempts,
        QueueConfig::MAX_MAX_ATTEMPTS
    );
    assert_eq!(view.tasks()[&id].priority, -queue::MAX_PRIORITY);
}

fn any_config() -> impl Strategy<Value = QueueConfig> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()),
        (any::<u32>(), any::<u64>(), any::<bool>()),
    )
        .prop_map(
            |((hb, to, settle, phb), (lease, ma, rb, rbm), (conc, rate, lifo))| QueueConfig {
                heartbeat_ms: hb,
                takeover_after_ms: to,
                settle_ms: settle,
                pool_heartbeat_ms: phb,
                lease_ms: lease,
                max_attempts: ma,
                retry_backoff_ms: rb,
                retry_backoff_max_ms: rbm,
                concurrency: conc,
                rate_interval_ms: rate,
                order: if lifo { Order::Lifo } else { Order::Fifo },
                timeout_ms: 0,
                failure_policy: Default::default(),
            },
        )
}

/// Small values and values near the ends are where the ranges bite; mix them in.
fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..200_000,
        (u64::MAX - 10)..=u64::MAX,
        Just(0),
        Just(1),
    ]
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(1_000))]

    /// Any values clamp into the ranges, the clamped config validates, clamping twice changes
    /// nothing, and a config that validates is left as it is.
    #[test]
    fn clamped_configs_are_valid(c in any_config()) {
        let clamped = c.clone().clamped();
        assert_in_ranges(&clamped);
        prop_assert_eq!(clamped.clone().clamped(), clamped.clone());
        if c.validate().is_ok() {
            prop_assert_eq!(clamped, c);
        }
    }

    /// Any u64 for every field, written into the document: the view's config is what the
    /// documented ranges make of those values ([`documented_reading`], written apart from the
    /// reader and its `clamped`).
    #[test]
    fn any_document_config_reads_valid(values in proptest::collection::vec(edgy_u64(), FIELDS.len())) {
        let mut doc = new_queue();
        let pairs: Vec<(&str, u64)> = FIELDS.iter().copied().zip(values.iter().copied()).collect();
        write_config(&mut doc, &pairs);
        let c = QueueView::read(&doc).unwrap().config;
        assert_in_ranges(&c);
        prop_assert_eq!(c, documented_reading(&values));
    }
}

/// Puts `v` between `lo` and `hi`.
fn between(v: u64, lo: u64, hi: u64) -> u64 {
    if v < lo {
        lo
    } else if v > hi {
        hi
    } else {
        v
    }
}

/// What a reader must make of raw document values (in the order of [`FIELDS`]), worked out from
/// the table of ranges in `QueueConfig`'s documentation with its numbers written out here, not
/// from the crate's constants or `clamped`: absolute ranges first, then the relative minimums
/// against the values the absolute ranges gave. `max_attempts` and `concurrency` are `u32`s, so
/// anything larger is first read as `u32::MAX`.
fn documented_reading(raw: &[u64]) -> QueueConfig {
    const MINUTE: u64 = 60_000;
    const DAY: u64 = 86_400_000;
    let heartbeat = between(raw[0], 10, MINUTE);
    let pool_heartbeat = between(raw[3], 10, MINUTE);
    let backoff = between(raw[6], 1, DAY);
    let as_u32 = |v: u64| v.min(4_294_967_295);
    QueueConfig {
        heartbeat_ms: heartbeat,
        takeover_after_ms: between(raw[1], 2 * heartbeat, 10 * MINUTE),
        settle_ms: between(raw[2], 1, MINUTE),
        pool_heartbeat_ms: pool_heartbeat,
        lease_ms: between(raw[4], 2 * pool_heartbeat, DAY),
        max_attempts: between(as_u32(raw[5]), 1, 1_000) as u32,
        retry_backoff_ms: backoff,
        retry_backoff_max_ms: between(raw[7], backoff, DAY),
        concurrency: between(as_u32(raw[8]), 0, 1_000_000) as u32,
        rate_interval_ms: between(raw[9], 0, DAY),
        order: Order::Fifo,
        timeout_ms: 0,
        failure_policy: Default::default(),
    }
}

/// Raw document values and what they read as, worked out by hand (fields in the order of
/// [`FIELDS`]).
#[test]
fn document_configs_read_as_worked_out_by_hand() {
    let cases: [([u64; 10], QueueConfig); 4] = [
        // Within every range: unchanged.
        (
            [20, 45, 3, 15, 31, 7, 2, 9, 5, 11],
            QueueConfig {
                heartbeat_ms: 20,
                takeover_after_ms: 45,
                settle_ms: 3,
                pool_heartbeat_ms: 15,
                lease_ms: 31,
                max_attempts: 7,
                retry_backoff_ms: 2,
                retry_backoff_max_ms: 9,
                concurrency: 5,
                rate_interval_ms: 11,
                order: Order::Fifo,
                timeout_ms: 0,
                failure_policy: Default::default(),
            },
        ),
        // Relative minimums below their bases: raised to twice (or once) the base.
        (
            [500, 999, 500, 700, 1_399, 3, 5_000, 4_999, 0, 0],
            QueueConfig {
                heartbeat_ms: 500,
                takeover_after_ms: 1_000,
                settle_ms: 500,
                pool_heartbeat_ms: 700,
                lease_ms: 1_400,
                max_attempts: 3,
                retry_backoff_ms: 5_000,
                retry_backoff_max_ms: 5_000,
                concurrency: 0,
                rate_interval_ms: 0,
                order: Order::Fifo,
                timeout_ms: 0,
                failure_policy: Default::default(),
            },
        ),
        // Bases above their maximums: the relative minimums follow the clamped bases (a
        // takeover of 100 s is raised to twice the 60 s heartbeat the 90 s one reads as).
        (
            [
                90_000, 100_000, 0, 61_000, 100_000, 0, 90_000_000, 1, 1_000_001, 86_400_001,
            ],
            QueueConfig {
                heartbeat_ms: 60_000,
                takeover_after_ms: 120_000,
                settle_ms: 1,
                pool_heartbeat_ms: 60_000,
                lease_ms: 120_000,
                max_attempts: 1,
                retry_backoff_ms: 86_400_000,
                retry_backoff_max_ms: 86_400_000,
                concurrency: 1_000_000,
                rate_interval_ms: 86_400_000,
                order: Order::Fifo,
                timeout_ms: 0,
                failure_policy: Default::default(),
            },
        ),
        // Counts beyond u32 and timings at the absolute ends.
        (
            [
                9,
                600_001,
                60_001,
                9,
                86_400_001,
                1 << 40,
                0,
                0,
                1 << 40,
                86_400_000,
            ],
            QueueConfig {
                heartbeat_ms: 10,
                takeover_after_ms: 600_000,
                settle_ms: 60_000,
                pool_heartbeat_ms: 10,
                lease_ms: 86_400_000,
                max_attempts: 1_000,
                retry_backoff_ms: 1,
                retry_backoff_max_ms: 1,
                concurrency: 1_000_000,
                rate_interval_ms: 86_400_000,
                order: Order::Fifo,
                timeout_ms: 0,
                failure_policy: Default::default(),
            },
        ),
    ];
    for (raw, expected) in cases {
        let mut doc = new_queue();
        let pairs: Vec<(&str, u64)> = FIELDS.iter().copied().zip(raw).collect();
        write_config(&mut doc, &pairs);
        assert_eq!(QueueView::read(&doc).unwrap().config, expected, "{raw:?}");
        assert_eq!(
            documented_reading(&raw),
            expected,
            "the proptest's oracle, {raw:?}"
        );
    }
}

/// A document written by the previous version: layout 1, version 1, no layout-2 maps.
fn v1_queue() -> Automerge {
    let mut doc = new_queue();
    doc.transact::<_, _, AutomergeError>(|tx| {
        for key in ["assigned", "started", "ended", "seen"] {
            tx.delete(ROOT, key)?;
        }
        tx.put(ROOT, "version", 1u64)?;
        Ok(())
    })
    .unwrap();
    doc
}

#[test]
fn two_replicas_that_upgrade_a_layout_1_queue_concurrently_keep_both_writes() {
    let mut a = v1_queue();
    let (t1, t2) = (v1_task(&mut a, 1), v1_task(&mut a, 2));
    assert_eq!(QueueView::read(&a).unwrap().version, 1);
    let mut b = a.fork();
    let assign = |task: &TaskId, peer: &str| Assignment {
        task: task.clone(),
        attempt: AttemptId {
            n: 1,
            claim: Claim::new(1, PeerId::new(peer)),
        },
        worker: WorkerId::new(me(), 0),
        incarnation: 1,
    };
    // Each replica creates the layout-2 maps on its own: two concurrent `assigned` maps.
    queue::record_assignments(&mut a, &[assign(&t1, "ra")], 5).unwrap();
    queue::record_assignments(&mut b, &[assign(&t2, "rb")], 6).unwrap();
    let mut cache = ViewCache::new();
    cache.refresh(&a);
    a.merge(&mut b).unwrap();
    let view = QueueView::read(&a).unwrap();
    assert_eq!(view.version, 2);
    assert_eq!(
        view.tasks()[&t1].attempts.len(),
        1,
        "the loser's map is read too"
    );
    assert_eq!(
        view.tasks()[&t2].attempts.len(),
        1,
        "the winner's map is read"
    );
    assert_eq!(cache.refresh(&a).unwrap().as_ref(), &view);
    // Later writes to either attempt land and are read, whichever map holds it.
    let w = WorkerId::new(me(), 0);
    for (t, peer) in [(&t1, "ra"), (&t2, "rb")] {
        let id = assign(t, peer).attempt;
        queue::record_start(&mut a, t, &id, &w, 1, 7).unwrap();
        queue::record_finish(&mut a, t, &id, &w, AttemptOutcome::Succeeded, None, 8).unwrap();
    }
    let view = QueueView::read(&a).unwrap();
    assert_eq!(view.counts().succeeded, 2);
    assert_eq!(cache.refresh(&a).unwrap().as_ref(), &view);
}

#[test]
fn a_queue_of_an_unknown_version_is_not_routable() {
    let mut doc = new_queue();
    assert!(QueueView::read(&doc).unwrap().routable_version());
    doc.transact::<_, _, AutomergeError>(|tx| {
        tx.put(ROOT, "version", 99u64)?;
        Ok(())
    })
    .unwrap();
    assert!(!QueueView::read(&doc).unwrap().routable_version());
}

/// Writes `value` under `key` in the layout-2 root map `map`, bypassing the typed operations.
fn raw_record(doc: &mut Automerge, map: &str, key: &str, value: &str) {
    let m = object(doc, &ROOT, map);
    doc.transact::<_, _, AutomergeError>(|tx| {
        tx.put(&m, key, value)?;
        Ok(())
    })
    .unwrap();
}

fn submitted(doc: &mut Automerge, id: &str) -> TaskId {
    let task = TaskId::new(id);
    queue::submit(
        doc,
        &Submission {
            id: task.clone(),
            kind: "k".into(),
            submitter: me(),
            submitted_at: 1,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: None,
            rules: Default::default(),
        },
    )
    .unwrap();
    task
}

/// The incremental view takes an assignment, a start and an end from their operations (no
/// read of the document), and still reads as a whole read does when records arrive out of
/// order, meet another value or do not parse.
#[test]
fn records_taken_from_operations_read_as_the_document_does() {
    let mut doc = new_queue();
    let mut cache = ViewCache::new();
    cache.refresh(&doc);
    let check = |cache: &mut ViewCache, doc: &Automerge, what: &str| {
        let whole = QueueView::read(doc).unwrap();
        assert_eq!(cache.refresh(doc).unwrap().as_ref(), &whole, "{what}");
    };
    let claim = Claim::new(1, me());
    let worker = WorkerId::new(me(), 0);
    let attempt = AttemptId {
        n: 1,
        claim: claim.clone(),
    };
    let assign = |doc: &mut Automerge, task: &TaskId| {
        let a = Assignment {
            task: task.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        };
        queue::record_assignments(doc, &[a], 2).unwrap();
    };

    // An honest life: three of its four writes need no read.
    let t = submitted(&mut doc, "automerge:honest");
    check(&mut cache, &doc, "submitted");
    let before = cache.stats();
    assign(&mut doc, &t);
    check(&mut cache, &doc, "assigned");
    queue::record_start(&mut doc, &t, &attempt, &worker, 1, 3).unwrap();
    check(&mut cache, &doc, "started");
    queue::record_finish(
        &mut doc,
        &t,
        &attempt,
        &worker,
        AttemptOutcome::Succeeded,
        None,
        4,
    )
    .unwrap();
    check(&mut cache, &doc, "finished");
    let after = cache.stats();
    assert_eq!(after.tasks_patched - before.tasks_patched, 3, "{after:?}");
    assert_eq!(after.tasks_reread, before.tasks_reread, "{after:?}");

    // A start written before its assignment: hidden until the assignment, then read with it.
    let t = submitted(&mut doc, "automerge:early");
    check(&mut cache, &doc, "submitted");
    let key = format!("{t}/1/1/{}", me());
    raw_record(&mut doc, "started", &key, r#"{"a":9,"i":1}"#);
    check(&mut cache, &doc, "a start without an assignment");
    assign(&mut doc, &t);
    check(&mut cache, &doc, "its assignment");
    let whole = QueueView::read(&doc).unwrap();
    assert!(whole.task(&t).unwrap().attempts[0].started.is_some());
    // The same, found by a fresh cache's whole read.
    let mut fresh = ViewCache::new();
    let t = submitted(&mut doc, "automerge:early2");
    let key = format!("{t}/1/1/{}", me());
    raw_record(&mut doc, "ended", &key, r#"{"a":9,"o":"succeeded"}"#);
    fresh.refresh(&doc);
    assign(&mut doc, &t);
    check(&mut fresh, &doc, "an end read before its assignment");

    // Records that do not parse, an end that overwrites another, and a concurrent
    // unreadable assignment of the same attempt.
    let t = submitted(&mut doc, "automerge:odd");
    check(&mut cache, &doc, "submitted");
    let mut fork = doc.fork();
    let key = format!("{t}/1/1/{}", me());
    raw_record(&mut fork, "assigned", &key, "not json");
    assign(&mut doc, &t);
    doc.merge(&mut fork).unwrap();
    check(&mut cache, &doc, "two assignments of one attempt");
    raw_record(&mut doc, "started", &key, "{}");
    check(&mut cache, &doc, "an unreadable start");
    raw_record(&mut doc, "ended", &key, r#"{"a":5,"o":"failed","e":"x"}"#);
    check(&mut cache, &doc, "an end");
    raw_record(&mut doc, "ended", &key, r#"{"a":6,"o":"succeeded"}"#);
    check(&mut cache, &doc, "an end overwritten");
    raw_record(
        &mut doc,
        "assigned",
        &format!("{t}/x/1/p"),
        r#"{"w":"p/0","a":1}"#,
    );
    check(&mut cache, &doc, "an assignment whose key names no attempt");
}

/// A whole read takes a task's assignments from every `assigned` map in the order a per-task
/// read does: two keys that name the same attempt (one spells its number `01`), each in one
/// of two concurrent maps, give the same attempt either way.
#[test]
fn a_whole_read_keeps_the_attempt_a_per_task_read_keeps() {
    let mut a = v1_queue();
    let task = v1_task(&mut a, 1);
    let mut b = a.fork();
    let assign = |n: u64, worker: u32| Assignment {
        task: task.clone(),
        attempt: AttemptId {
            n,
            claim: Claim::new(1, PeerId::new("ra")),
        },
        worker: WorkerId::new(me(), worker),
        incarnation: 1,
    };
    // Each replica makes its own `assigned` map; b also spells attempt 1's key another way.
    queue::record_assignments(&mut a, &[assign(1, 0)], 5).unwrap();
    queue::record_assignments(&mut b, &[assign(2, 0)], 5).unwrap();
    let other = format!(r#"{{"w":"{}","i":1,"a":6}}"#, WorkerId::new(me(), 1));
    raw_record(&mut b, "assigned", &format!("{task}/01/1/ra"), &other);
    a.merge(&mut b).unwrap();
    let whole = QueueView::read(&a).unwrap();
    let one = piecework_queue_doc::epoch::task_entry(&a, &task).unwrap();
    assert_eq!(whole.task(&task), Some(&one));
    assert_eq!(one.attempts.len(), 2);
}
