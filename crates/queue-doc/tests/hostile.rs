//! Values a faulty or hostile member can write into a queue document, and what reading them
//! costs: each test here failed (spun, panicked or followed the forgery) before its fix.

use piecework_queue_doc::epoch::{self, Link};
use piecework_queue_doc::{Claim, PeerId};
use proptest::prelude::*;

fn link(epoch: u64, term: u64, peer: &str, doc: &str) -> Link {
    Link {
        epoch,
        claim: Claim::new(term, PeerId::new(peer)),
        doc: doc.into(),
    }
}

/// The order lineages had before it was counted: every epoch number from the least to the
/// greatest either names, looked up by a scan. Right, but its work is the range of the epoch
/// numbers, which a peer chooses.
fn by_every_epoch(a: &[Link], b: &[Link]) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let at = |l: &[Link], e: u64| l.iter().find(|x| x.epoch == e).cloned();
    let lo = a.iter().chain(b).map(|l| l.epoch).min().unwrap_or(0);
    let hi = a.iter().chain(b).map(|l| l.epoch).max().unwrap_or(0);
    for e in lo..=hi {
        match (at(a, e), at(b, e)) {
            (Some(x), Some(y)) if x != y => return (&x.claim, &x.doc).cmp(&(&y.claim, &y.doc)),
            (Some(_), None) if b.iter().all(|l| l.epoch < e) => return Ordering::Greater,
            (None, Some(_)) if a.iter().all(|l| l.epoch < e) => return Ordering::Less,
            _ => {}
        }
    }
    Ordering::Equal
}

#[test]
fn a_forged_lineage_at_u64_max_is_compared_in_work_bounded_by_its_length() {
    let honest = vec![link(1, 1, "a", "d1"), link(2, 2, "a", "d2")];
    let forged = vec![link(1, 1, "a", "d1"), link(u64::MAX, 9, "x", "forged")];
    let (order, looked) = epoch::cmp_lineage_counted(&forged, &honest);
    assert_eq!(
        order,
        std::cmp::Ordering::Greater,
        "the order itself is unchanged: the forgery descends further"
    );
    assert!(
        looked <= forged.len() + honest.len(),
        "looked at {looked} epochs for lineages of {} and {} links",
        forged.len(),
        honest.len()
    );
    let (_, looked) = epoch::cmp_lineage_counted(&[link(0, 1, "a", "z")], &forged);
    assert!(looked <= 3, "looked at {looked} epochs");
}

fn lineage() -> impl Strategy<Value = Vec<Link>> {
    prop::collection::vec(
        (0u64..12, 0u64..3, 0u8..2, 0u8..3).prop_map(|(e, t, p, d)| {
            link(e, t, ["a", "b"][p as usize], ["d", "e", "f"][d as usize])
        }),
        0..8,
    )
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(512))]

    /// Counting the comparison changed no order: on lineages whose epoch range is small, it
    /// agrees with the comparison that visits every epoch, and it looks at most at one epoch
    /// per link.
    #[test]
    fn the_counted_order_is_the_order_of_every_epoch(a in lineage(), b in lineage()) {
        let (order, looked) = epoch::cmp_lineage_counted(&a, &b);
        prop_assert_eq!(order, by_every_epoch(&a, &b));
        prop_assert!(looked <= a.len() + b.len());
    }
}

mod successors {
    use automerge::{ActorId, Automerge};
    use piecework_queue_doc::epoch::{self, Rotation, Seal, SuccessorCheck};
    use piecework_queue_doc::queue::{self, Submission};
    use piecework_queue_doc::{Claim, PeerId, QueueConfig, QueueId, QueueView, TaskId, ViewCache};

    fn submit(doc: &mut Automerge, n: u32) -> TaskId {
        let id = TaskId::new(format!("automerge:t{n}"));
        queue::submit(
            doc,
            &Submission {
                id: id.clone(),
                kind: "k".into(),
                submitter: PeerId::new("s"),
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

    /// A queue document with three live tasks, its router `r@1`, and a successor `name`
    /// built by `sealer` from it, then sealed into it; `drop` is left out of the successor.
    fn sealed(sealer: &Claim, drop: Option<&TaskId>) -> (Automerge, Automerge, Vec<TaskId>) {
        let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
        queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
        queue::claim_router(&mut old, &Claim::new(1, PeerId::new("r")), 1).unwrap();
        let tasks: Vec<TaskId> = (1..=3).map(|n| submit(&mut old, n)).collect();
        // The successor as a forger builds it: from a view without the task it drops.
        let mut from = old.clone();
        if let Some(t) = drop {
            let view = QueueView::read(&from).unwrap();
            assert!(view.task(t).is_some());
            from = Automerge::new().with_actor(ActorId::from(vec![3u8; 16]));
            queue::create(
                &mut from,
                "q",
                &QueueConfig::default(),
                &PeerId::new("s"),
                0,
            )
            .unwrap();
            for n in 1..=3 {
                if TaskId::new(format!("automerge:t{n}")) != *t {
                    submit(&mut from, n);
                }
            }
        }
        let view = QueueView::read(&from).unwrap();
        let mut succ = Automerge::new().with_actor(ActorId::from(vec![2u8; 16]));
        let origin = QueueId::new("automerge:q0");
        epoch::build_successor(
            &from,
            &view,
            &mut succ,
            &Rotation {
                origin: &origin,
                prev: "automerge:q0",
                successor: "automerge:next",
                epoch: 1,
                claim: sealer,
                now_ms: 2,
            },
        )
        .unwrap();
        let heads = old.get_heads();
        epoch::seal(
            &mut old,
            &Seal {
                claim: sealer.clone(),
                successor: "automerge:next".into(),
                epoch: 1,
            },
            &heads,
        )
        .unwrap();
        (old, succ, tasks)
    }

    #[test]
    fn the_routers_successor_holding_every_live_task_is_followed() {
        let (old, succ, _) = sealed(&Claim::new(1, PeerId::new("r")), None);
        assert_eq!(
            epoch::check_successor(&old, &mut ViewCache::new(), &succ, "automerge:next"),
            Ok(())
        );
    }

    /// A member seals the queue into a successor of its own that leaves a live task out: the
    /// seal is under the router's claim (or any claim that counts), so only the contents
    /// tell. It is not followed: the task would never run.
    #[test]
    fn a_forged_successor_that_drops_live_tasks_is_not_followed() {
        let dropped = TaskId::new("automerge:t2");
        let (old, succ, _) = sealed(&Claim::new(1, PeerId::new("r")), Some(&dropped));
        assert_eq!(
            epoch::check_successor(&old, &mut ViewCache::new(), &succ, "automerge:next"),
            Err(SuccessorCheck::DropsLive(dropped))
        );
    }

    /// The task the forger left out ends after the seal, in the copy of a member that reads
    /// on: the successor is still refused there. The verdict is taken at the seal's heads, so
    /// every member holding them judges alike (before, members that had seen the task end
    /// followed the forged successor while the others, the forger's own core among them,
    /// stayed behind: 18 of 500 byzantine seeds never settled).
    #[test]
    fn a_forged_successor_is_refused_even_once_the_task_it_dropped_has_ended() {
        let router = Claim::new(1, PeerId::new("r"));
        let dropped = TaskId::new("automerge:t2");
        let (mut old, succ, _) = sealed(&router, Some(&dropped));
        end(&mut old, &router, &dropped, 1, 5);
        assert!(epoch::task_state(&old, &dropped).unwrap().is_final());
        assert_eq!(
            epoch::check_successor(&old, &mut ViewCache::new(), &succ, "automerge:next"),
            Err(SuccessorCheck::DropsLive(dropped))
        );
    }

    /// A seal under a claim that does not count in the document sealed (a term nobody
    /// claimed there, here the bound) is not followed, whatever the successor holds.
    #[test]
    fn a_successor_sealed_under_a_claim_that_does_not_count_is_not_followed() {
        let forged = Claim::new(piecework_queue_doc::MAX_TERM, PeerId::new("x"));
        let (old, succ, _) = sealed(&forged, None);
        assert_eq!(
            epoch::check_successor(&old, &mut ViewCache::new(), &succ, "automerge:next"),
            Err(SuccessorCheck::SealerNotRouter(forged))
        );
    }

    /// A member's seal under a claim that does not count does not count as a seal either: it
    /// must not keep the router from sealing the document itself (before, any seal stopped
    /// rotations for good). The router's own seal counts.
    #[test]
    fn a_seal_under_a_claim_that_does_not_count_is_not_a_seal_of_the_document() {
        let forged = Claim::new(7, PeerId::new("x"));
        let (old, _, _) = sealed(&forged, None);
        assert_eq!(epoch::read_seals(&old).len(), 1);
        assert!(epoch::counted_seals(&old).is_empty());
        let router = Claim::new(1, PeerId::new("r"));
        let (old, _, _) = sealed(&router, None);
        let counted = epoch::counted_seals(&old);
        assert_eq!(counted.len(), 1);
        assert_eq!(counted[0].claim, router);
    }

    /// A task this node saw end, whose every document is gone, keeps its end when written
    /// into a branch that shows it live again: the records kept apart from any document
    /// (`epoch::TaskEnd`: its entry as read, its outputs) write its end into the other branch's document, and nothing
    /// when that document already has it.
    #[test]
    fn a_kept_end_written_into_a_branch_that_shows_the_task_live_shows_it_ended() {
        use piecework_queue_doc::{Assignment, AttemptId, AttemptOutcome, TaskState, WorkerId};
        let router = Claim::new(1, PeerId::new("r"));
        let mut doc = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
        queue::create(&mut doc, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
        queue::claim_router(&mut doc, &router, 1).unwrap();
        let task = submit(&mut doc, 1);
        let attempt = AttemptId {
            n: 1,
            claim: router.clone(),
        };
        let worker = WorkerId::new(PeerId::new("w"), 0);
        let assignment = Assignment {
            task: task.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        };
        queue::record_assignments(&mut doc, &[assignment], 2).unwrap();
        // The other branch forks here: it saw the task assigned, not started or ended.
        let mut other = doc.fork().with_actor(ActorId::from(vec![2u8; 16]));
        queue::record_start(&mut doc, &task, &attempt, &worker, 1, 3).unwrap();
        let ended = AttemptOutcome::Succeeded;
        queue::record_finish(&mut doc, &task, &attempt, &worker, ended, None, 4).unwrap();
        let state = |d: &Automerge| QueueView::read(d).unwrap().task(&task).unwrap().state();
        let entry = QueueView::read(&doc).unwrap().task(&task).unwrap().clone();
        let kept = epoch::TaskEnd::new(std::sync::Arc::new(entry), Vec::new());
        drop(doc);
        assert!(!state(&other).is_final());
        let written = epoch::write_ends(&mut other, &[&kept]).unwrap();
        assert!(written > 0);
        assert_eq!(state(&other), TaskState::Succeeded);
        // Nothing newer to write a second time.
        assert_eq!(epoch::write_ends(&mut other, &[&kept]).unwrap(), 0);
    }

    /// A successor whose seal has not arrived is not followed yet (nor refused).
    #[test]
    fn a_successor_without_its_seal_waits() {
        let (_, succ, _) = sealed(&Claim::new(1, PeerId::new("r")), None);
        let mut unsealed = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
        queue::create(
            &mut unsealed,
            "q",
            &QueueConfig::default(),
            &PeerId::new("s"),
            0,
        )
        .unwrap();
        assert_eq!(
            epoch::check_successor(&unsealed, &mut ViewCache::new(), &succ, "automerge:next"),
            Err(SuccessorCheck::NotYet)
        );
    }

    /// Ends `task`'s attempt `n` (assigned, started, succeeded) under `router`, at time `at`.
    fn end(doc: &mut Automerge, router: &Claim, task: &TaskId, n: u64, at: u64) {
        use piecework_queue_doc::{Assignment, AttemptId, AttemptOutcome, WorkerId};
        let attempt = AttemptId {
            n,
            claim: router.clone(),
        };
        let worker = WorkerId::new(PeerId::new("w"), 0);
        let assignment = Assignment {
            task: task.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        };
        queue::record_assignments(doc, &[assignment], at).unwrap();
        queue::record_start(doc, task, &attempt, &worker, 1, at + 1).unwrap();
        let ok = AttemptOutcome::Succeeded;
        queue::record_finish(doc, task, &attempt, &worker, ok, None, at + 2).unwrap();
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(piecework_proptest_config::config(64))]

        /// The check reads a task no write after the seal touched as it reads now, and copies
        /// the document at the seal's heads only for the others: its verdict is the one a
        /// copy at the heads gives for every task (the check before, kept here as the
        /// oracle), whatever ended before the seal, what the successor left out, and what
        /// ended after it; with a fresh cache and with one read before the late writes.
        #[test]
        fn the_successor_check_agrees_with_a_copy_at_the_seals_heads(
            ended_before in proptest::collection::vec(any::<bool>(), 6),
            dropped in proptest::collection::vec(any::<bool>(), 6),
            ended_after in proptest::collection::vec(any::<bool>(), 6),
        ) {
            let router = Claim::new(1, PeerId::new("r"));
            let mut old = Automerge::new().with_actor(ActorId::from(vec![1u8; 16]));
            queue::create(&mut old, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
            queue::claim_router(&mut old, &router, 1).unwrap();
            let tasks: Vec<TaskId> = (1..=6).map(|n| submit(&mut old, n)).collect();
            for (t, e) in tasks.iter().zip(&ended_before) {
                if *e {
                    end(&mut old, &router, t, 1, 10);
                }
            }
            // The successor, built from a document without the tasks it leaves out.
            let mut from = Automerge::new().with_actor(ActorId::from(vec![3u8; 16]));
            queue::create(&mut from, "q", &QueueConfig::default(), &PeerId::new("s"), 0).unwrap();
            for (n, (t, d)) in (1..=6).zip(tasks.iter().zip(&dropped)) {
                if !*d && !QueueView::read(&old).unwrap().task(t).unwrap().state().is_final() {
                    submit(&mut from, n);
                }
            }
            let view = QueueView::read(&from).unwrap();
            let mut succ = Automerge::new().with_actor(ActorId::from(vec![2u8; 16]));
            let origin = QueueId::new("automerge:q0");
            let rotation = Rotation {
                origin: &origin,
                prev: "automerge:q0",
                successor: "automerge:next",
                epoch: 1,
                claim: &router,
                now_ms: 20,
            };
            epoch::build_successor(&from, &view, &mut succ, &rotation).unwrap();
            let heads = old.get_heads();
            let seal = Seal {
                claim: router.clone(),
                successor: "automerge:next".into(),
                epoch: 1,
            };
            epoch::seal(&mut old, &seal, &heads).unwrap();
            let mut early = ViewCache::new();
            early.refresh(&old).unwrap();
            for (t, e) in tasks.iter().zip(&ended_after) {
                if *e && !epoch::task_state(&old, t).unwrap().is_final() {
                    end(&mut old, &router, t, 2, 30);
                }
            }
            let at = old.fork_at(&heads).unwrap();
            let live_dropped: Vec<TaskId> = tasks
                .iter()
                .filter(|t| !epoch::task_state(&at, t).unwrap().is_final())
                .filter(|t| !epoch::indexes(&succ, t))
                .cloned()
                .collect();
            for cache in [&mut ViewCache::new(), &mut early] {
                match epoch::check_successor(&old, cache, &succ, "automerge:next") {
                    Ok(()) => prop_assert!(live_dropped.is_empty()),
                    Err(SuccessorCheck::DropsLive(t)) => prop_assert!(live_dropped.contains(&t)),
                    Err(other) => prop_assert!(false, "unexpected {other:?}"),
                }
            }
        }
    }
}
