//! Membership, property-tested: three replicas of a queue document, partitioned, each writing
//! signed adds and removals by the peers its own view says may make them (and some by peers it
//! says may not), and members removed going on writing as if they had not been (a removed admin
//! adding a peer, a removed member removing itself). Replicas merge pairwise in random orders;
//! at the end every replica merges every other, in an order of its own.
//!
//! Beside them, peers write to the document (a task submitted and a tag boosted, in one
//! change), each with an actor tagged with its peer as a node's are, whatever their role:
//! removed peers and submitters too. Each replica keeps a [`ViewCache`] refreshed after every
//! step, as a node does.
//!
//! What must hold: every replica then materializes the same membership (members, roles, who
//! added and who removed each, which operations count); an operation whose signer was removed
//! by a counted removal that it had seen (a later write of a removed peer) never counts; an
//! operation signed by a peer no replica ever made an admin never counts. Every replica's
//! view is the same, and its cache (refreshed incrementally through the merges) reads as a
//! whole read does; a removed peer's document write made after its replica learned of the
//! removal is ignored by every replica (its task is not in any view, nor its boost); a boost
//! (a write that needs a working role) by a peer that ends a submitter is ignored, and one by
//! a member or an admin counts.

use std::collections::BTreeSet;

use automerge::{ActorId, Automerge};
use piecework_queue_doc::membership::{Cut, MemberOp, NewOp, OpKind, actor_for};
use piecework_queue_doc::{
    Membership, PeerId, QueueConfig, QueueId, QueueView, Role, Signer, Submission, TaskId,
    ViewCache, queue,
};
use proptest::prelude::*;

const PEERS: u8 = 6;

fn signer(n: u8) -> Signer {
    // Peer 0 is the creator.
    Signer::new(PeerId::new(format!("peer{n}")), [n + 1; 32])
}

#[derive(Clone, Debug)]
enum Step {
    /// At replica `at`, peer `by` adds peer `peer` with role `role`.
    Add { at: u8, by: u8, peer: u8, role: u8 },
    /// At replica `at`, peer `by` removes peer `peer`.
    Remove { at: u8, by: u8, peer: u8 },
    /// At replica `at`, peer `by` submits a task and boosts a tag (one change).
    Write { at: u8, by: u8 },
    /// Replica `from`'s changes merged into replica `into`.
    Merge { from: u8, into: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..3u8, 0..PEERS, 1..PEERS, 0..3u8)
            .prop_map(|(at, by, peer, role)| Step::Add { at, by, peer, role }),
        2 => (0..3u8, 0..PEERS, 0..PEERS).prop_map(|(at, by, peer)| Step::Remove { at, by, peer }),
        3 => (0..3u8, 0..PEERS).prop_map(|(at, by)| Step::Write { at, by }),
        3 => (0..3u8, 0..3u8).prop_map(|(from, into)| Step::Merge { from, into }),
    ]
}

fn view(doc: &Automerge) -> QueueView {
    QueueView::read(doc).expect("a queue")
}

fn write(
    doc: &mut Automerge,
    q: &QueueId,
    by: &Signer,
    kind: OpKind,
    peer: &Signer,
    role: Role,
) -> MemberOp {
    let v = view(doc);
    let deps = v.membership.heads();
    // A removal says what its signer had seen of the removed peer's writes, as a node's does.
    let cut = (kind == OpKind::Remove).then(|| {
        Cut::of_doc(
            doc,
            v.doc_key.as_deref().expect("a keyed document"),
            peer.peer(),
        )
    });
    doc.set_actor(tagged(by.peer(), doc));
    let op = MemberOp::sign(
        by,
        NewOp {
            queue: q,
            kind,
            peer: peer.peer(),
            role: (kind == OpKind::Add).then_some(role),
            key: Some(peer.public()),
            deps,
            at_ms: 0,
            via: None,
            cut,
        },
    );
    queue::add_member_op(doc, &op).expect("stored");
    op
}

/// The actor `peer` writes with at the replica whose first actor is `doc`'s own (one per peer
/// and replica: two replicas never write as the same actor).
fn tagged(peer: &PeerId, doc: &Automerge) -> ActorId {
    // The last byte of any actor a replica writes with is its number.
    let replica = *doc.get_actor().to_bytes().last().expect("an actor");
    actor_for(peer, [0, 0, 0, 0, 0, 0, 0, replica])
}

/// Peer `by` writes, at `doc`, a task `task` and a boost of tag `task`.
fn write_doc(doc: &mut Automerge, by: &PeerId, task: &str) {
    doc.set_actor(tagged(by, doc));
    queue::submit(
        doc,
        &Submission {
            id: TaskId::new(task),
            kind: "k".into(),
            submitter: by.clone(),
            submitted_at: 1,
            priority: 0,
            urgent: false,
            max_attempts: None,
            input: Some("{}".into()),
            rules: Default::default(),
        },
    )
    .expect("submitted");
    queue::set_boost(doc, task, 1, 1).expect("boosted");
}

/// What a replica's materialization says, in a comparable form.
fn summary(m: &Membership) -> Vec<(String, Role, Option<String>, Option<String>)> {
    m.records()
        .iter()
        .map(|(p, r)| {
            (
                p.to_string(),
                r.role,
                r.added_by.as_ref().map(ToString::to_string),
                r.removed_by.as_ref().map(ToString::to_string),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(piecework_proptest_config::config(128))]

    #[test]
    fn replicas_materialize_one_membership(
        steps in prop::collection::vec(step(), 1..40),
        orders in prop::collection::vec(Just([0u8, 1, 2]).prop_shuffle(), 3),
    ) {
        let q = QueueId::new("automerge:membership");
        let creator = signer(0);
        let mut first = Automerge::new().with_actor(ActorId::from(&[1u8; 16][..]));
        queue::create(&mut first, "m", &QueueConfig::default(), creator.peer(), 0).unwrap();
        queue::set_signed_membership(&mut first, &q, &creator.public()).unwrap();
        let mut docs: Vec<Automerge> = (0..3u8)
            .map(|i| first.fork().with_actor(ActorId::from(&[i + 2; 16][..])))
            .collect();
        // Operations signed by peers removed in the signing replica's view, after that removal
        // (their `deps` include it): these must never count.
        let mut after_removal: Vec<String> = Vec::new();
        // Document writes: (task, writer, the removal of the writer its replica had seen).
        let mut writes: Vec<(String, PeerId, Option<String>)> = Vec::new();
        let mut removals: Vec<(PeerId, String)> = Vec::new();
        let mut caches: Vec<ViewCache> = (0..3).map(|_| ViewCache::new()).collect();
        for (n, s) in steps.iter().enumerate() {
            match *s {
                Step::Add { at, by, peer, role } => {
                    let doc = &mut docs[usize::from(at)];
                    let m = view(doc).membership;
                    let (by, peer) = (signer(by), signer(peer));
                    let removed = m.records().get(by.peer()).is_some_and(|r| !r.active());
                    let role = [Role::Submitter, Role::Member, Role::Admin][usize::from(role)];
                    let op = write(doc, &q, &by, OpKind::Add, &peer, role);
                    let _ = op.id.len();
                    if removed {
                        after_removal.push(op.id.clone());
                    }
                }
                Step::Remove { at, by, peer } => {
                    let doc = &mut docs[usize::from(at)];
                    let m = view(doc).membership;
                    let (by, peer) = (signer(by), signer(peer));
                    let removed = m.records().get(by.peer()).is_some_and(|r| !r.active());
                    let op = write(doc, &q, &by, OpKind::Remove, &peer, Role::Member);
                    if removed {
                        after_removal.push(op.id.clone());
                    }
                    removals.push((peer.peer().clone(), op.id.clone()));
                }
                Step::Write { at, by } => {
                    let doc = &mut docs[usize::from(at)];
                    let m = view(doc).membership;
                    let by = signer(by).peer().clone();
                    // The counted removal of the writer this replica holds, if any.
                    let seen = removals
                        .iter()
                        .filter(|(p, id)| *p == by && m.counts(id))
                        .map(|(_, id)| id.clone())
                        .next_back();
                    let task = format!("t{n}");
                    write_doc(doc, &by, &task);
                    let removed = !m.is_member(&by);
                    writes.push((task, by, seen.filter(|_| removed)));
                }
                Step::Merge { from, into } => {
                    if from != into {
                        let mut src = docs[usize::from(from)].fork();
                        docs[usize::from(into)].merge(&mut src).unwrap();
                    }
                }
            }
            for (cache, doc) in caches.iter_mut().zip(&docs) {
                cache.refresh(doc);
            }
        }
        let mut merged = Vec::new();
        let mut views = Vec::new();
        for (i, order) in orders.iter().enumerate() {
            let mut d = docs[i].fork();
            for &j in order {
                let mut src = docs[usize::from(j)].fork();
                d.merge(&mut src).unwrap();
                caches[i].refresh(&d);
            }
            let whole = view(&d);
            let cached = caches[i].refresh(&d).expect("a queue");
            prop_assert_eq!(&**cached, &whole, "replica {}'s cache and a whole read differ", i);
            merged.push(whole.membership.clone());
            views.push(whole);
        }
        for v in &views[1..] {
            prop_assert_eq!(v, &views[0]);
        }
        let last = &views[0];
        for (task, by, seen) in &writes {
            let shown = last.task(&TaskId::new(task.as_str())).is_some();
            let boosted = last.boosts.contains_key(task.as_str());
            let rec = last.membership.records().get(by);
            let removed_once = |id: &String| {
                removals
                    .iter()
                    .filter(|(p, r)| p == by && last.membership.counts(r))
                    .all(|(_, r)| r == id)
            };
            match seen {
                // Written after its replica had seen the writer's removal, which still stands
                // alone at the end: ignored everywhere.
                Some(id) if last.membership.counts(id)
                    && rec.is_some_and(|r| !r.active())
                    && removed_once(id) =>
                {
                    prop_assert!(!shown, "{}'s task {} written after its removal shows", by, task);
                    prop_assert!(!boosted, "{}'s boost {} written after its removal counts", by, task);
                }
                _ => {
                    // A member not removed: its task counts; its boost if it routes and runs.
                    if let Some(role) = last.membership.role(by) {
                        prop_assert!(shown, "{}'s task {} is missing", by, task);
                        prop_assert_eq!(boosted, role.works(), "{}'s boost {} as a {}", by, task, role);
                    }
                }
            }
        }
        let first = &merged[0];
        for m in &merged[1..] {
            prop_assert_eq!(summary(m), summary(first));
            prop_assert_eq!(m.op_ids().collect::<Vec<_>>(), first.op_ids().collect::<Vec<_>>());
            for id in first.op_ids() {
                prop_assert_eq!(m.counts(id), first.counts(id), "op {}", id);
            }
        }
        for id in &after_removal {
            prop_assert!(!first.counts(id), "a removed peer's later operation {id} counted");
        }
        // An add counts only if its signer is the creator or was made an admin by an add
        // that counts.
        let admins: BTreeSet<&PeerId> = first
            .op_ids()
            .filter_map(|id| first.op(id).filter(|_| first.counts(id)))
            .filter(|op| op.kind == OpKind::Add && op.role == Some(Role::Admin))
            .map(|op| &op.peer)
            .chain([creator.peer()])
            .collect();
        for id in first.op_ids() {
            let op = first.op(id).unwrap();
            if first.counts(id) && op.kind == OpKind::Add {
                prop_assert!(admins.contains(&op.by), "an add by {} counted", op.by);
            }
        }
        // The creator stays an admin, whatever was written.
        prop_assert_eq!(first.role(creator.peer()), Some(Role::Admin));
    }
}

#[test]
fn a_queue_made_before_signed_membership_keeps_its_creator_and_members() {
    // The old layout: the creator and the members it lists, no creator key.
    let creator = signer(0);
    let mut doc = Automerge::new();
    queue::create(&mut doc, "old", &QueueConfig::default(), creator.peer(), 0).unwrap();
    queue::set_member(&mut doc, signer(1).peer(), &[], 1).unwrap();
    let m = view(&doc).membership;
    assert!(m.is_legacy());
    assert_eq!(m.role(creator.peer()), Some(Role::Admin));
    assert_eq!(m.role(signer(1).peer()), Some(Role::Member));
    // The creator adopts it: an add for each listed member, then its key. A member listed
    // after that (written the old way) counts no more.
    let q = QueueId::new("automerge:old");
    write(
        &mut doc,
        &q,
        &creator,
        OpKind::Add,
        &signer(1),
        Role::Member,
    );
    queue::set_signed_membership(&mut doc, &q, &creator.public()).unwrap();
    queue::set_member(&mut doc, signer(2).peer(), &[], 2).unwrap();
    let m = view(&doc).membership;
    assert!(!m.is_legacy());
    assert_eq!(m.role(signer(1).peer()), Some(Role::Member));
    assert_eq!(m.role(signer(2).peer()), None);
}

#[test]
fn a_successor_holds_the_membership_and_a_late_operation_is_carried() {
    use piecework_queue_doc::Claim;
    use piecework_queue_doc::epoch::{self, Rotation};
    let q = QueueId::new("automerge:q0");
    let creator = signer(0);
    let mut old = Automerge::new().with_actor(ActorId::from(&[1u8; 16][..]));
    queue::create(&mut old, "q", &QueueConfig::default(), creator.peer(), 0).unwrap();
    queue::set_signed_membership(&mut old, &q, &creator.public()).unwrap();
    write(
        &mut old,
        &q,
        &creator,
        OpKind::Add,
        &signer(1),
        Role::Member,
    );
    // A member that has not seen the seal yet writes an add into the old document.
    let mut late = old.fork().with_actor(ActorId::from(&[2u8; 16][..]));
    let view = QueueView::read(&old).unwrap();
    let mut succ = Automerge::new().with_actor(ActorId::from(&[3u8; 16][..]));
    epoch::build_successor(
        &old,
        &view,
        &mut succ,
        &Rotation {
            origin: &q,
            prev: "automerge:q0",
            successor: "automerge:q1",
            epoch: 1,
            claim: &Claim::new(1, creator.peer().clone()),
            now_ms: 1,
        },
    )
    .unwrap();
    let m = view_of(&succ);
    assert!(!m.is_legacy(), "the creator's key went on");
    assert_eq!(m.role(signer(1).peer()), Some(Role::Member));
    let since = old.get_heads();
    write(
        &mut late,
        &q,
        &creator,
        OpKind::Add,
        &signer(2),
        Role::Submitter,
    );
    old.merge(&mut late).unwrap();
    let carried =
        epoch::carry(&old, &since, &mut succ, &|_| false, None, usize::MAX).expect("carried");
    assert!(carried.writes >= 1, "{carried:?}");
    assert_eq!(view_of(&succ).role(signer(2).peer()), Some(Role::Submitter));
}

fn view_of(doc: &Automerge) -> std::sync::Arc<Membership> {
    view(doc).membership
}
