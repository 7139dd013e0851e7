//! A view ignores writes beyond their writer's role, and a removed peer's writes beyond its
//! removal's cut (`judge.rs`). Each peer writes with an actor tagged with its peer id, as a
//! node does; the writes are merged into one replica whose whole read and incrementally
//! refreshed cache must agree.

use automerge::{ActorId, Automerge};
use piecework_queue_doc::membership::{Cut, MemberOp, NewOp, OpKind, actor_for};
use piecework_queue_doc::schedule::Every;
use piecework_queue_doc::{
    Claim, ConfigPatch, PeerId, QueueConfig, QueueId, QueueView, Role, Signer, Submission, TaskId,
    ViewCache, queue,
};

fn signer(n: u8) -> Signer {
    Signer::new(PeerId::new(format!("peer{n}")), [n + 1; 32])
}

struct World {
    q: QueueId,
    /// The shared replica every write is merged into.
    doc: Automerge,
    cache: ViewCache,
    admin: Signer,
    member: Signer,
    submitter: Signer,
}

impl World {
    /// A queue made by peer0 (admin), with peer1 a member and peer2 a submitter.
    fn new() -> World {
        let q = QueueId::new("automerge:judged");
        let admin = signer(0);
        let mut doc = Automerge::new().with_actor(actor_for(admin.peer(), [9; 8]));
        queue::create(&mut doc, "j", &QueueConfig::default(), admin.peer(), 0).unwrap();
        queue::set_signed_membership(&mut doc, &q, &admin.public()).unwrap();
        let mut w = World {
            q,
            doc,
            cache: ViewCache::new(),
            admin,
            member: signer(1),
            submitter: signer(2),
        };
        let (member, submitter) = (w.member.peer().clone(), w.submitter.peer().clone());
        w.op(OpKind::Add, &member, Some(Role::Member));
        w.op(OpKind::Add, &submitter, Some(Role::Submitter));
        w
    }

    /// The admin signs an operation on `peer` and writes it to the shared replica.
    fn op(&mut self, kind: OpKind, peer: &PeerId, role: Option<Role>) {
        let v = self.view();
        let cut = (kind == OpKind::Remove)
            .then(|| Cut::of_doc(&self.doc, v.doc_key.as_deref().unwrap(), peer));
        let op = MemberOp::sign(
            &self.admin,
            NewOp {
                queue: &self.q,
                kind,
                peer,
                role,
                key: None,
                deps: v.membership.heads(),
                at_ms: 0,
                via: None,
                cut,
            },
        );
        queue::add_member_op(&mut self.doc, &op).unwrap();
        self.cache.refresh(&self.doc);
    }

    /// `by`'s replica: a fork of the shared one, writing as `by`'s tagged actor.
    fn fork(&self, by: &PeerId) -> Automerge {
        self.doc.fork().with_actor(actor_for(by, *b"replica\0"))
    }

    /// Merges a peer's replica back.
    fn merge(&mut self, mut from: Automerge) {
        self.doc.merge(&mut from).unwrap();
        self.cache.refresh(&self.doc);
    }

    /// The shared replica's view, read whole; checked against the cache.
    fn view(&mut self) -> QueueView {
        let whole = QueueView::read(&self.doc).unwrap();
        let cached = self.cache.refresh(&self.doc).unwrap();
        assert_eq!(**cached, whole, "the cache and a whole read differ");
        whole
    }
}

fn submission(id: &str, by: &PeerId) -> Submission {
    Submission {
        id: TaskId::new(id),
        kind: "k".into(),
        submitter: by.clone(),
        submitted_at: 1,
        priority: 0,
        urgent: false,
        max_attempts: None,
        input: Some("{}".into()),
        rules: Default::default(),
    }
}

fn attempts(n: u32) -> ConfigPatch {
    ConfigPatch {
        max_attempts: Some(n),
        ..Default::default()
    }
}

#[test]
fn the_configuration_and_schedules_count_from_admins_only() {
    let mut w = World::new();
    let default = QueueConfig::default().max_attempts;
    for (who, n) in [
        (w.submitter.peer().clone(), 7),
        (w.member.peer().clone(), 8),
    ] {
        let mut d = w.fork(&who);
        queue::set_config(&mut d, &attempts(n), 10).unwrap();
        schedule(&mut d, &format!("s{n}"));
        w.merge(d);
        let v = w.view();
        assert_eq!(
            v.config.max_attempts, default,
            "{who}'s configuration counted"
        );
        assert!(v.schedules.is_empty(), "{who}'s schedule counted");
    }
    let mut d = w.fork(&w.admin.peer().clone());
    queue::set_config(&mut d, &attempts(9), 20).unwrap();
    schedule(&mut d, "nightly");
    w.merge(d);
    let v = w.view();
    assert_eq!(v.config.max_attempts, 9);
    assert!(v.schedules.contains_key("nightly"));
}

fn schedule(d: &mut Automerge, name: &str) {
    let every = Every::Ms(60_000);
    queue::put_schedule(d, name, every, "{\"kind\":\"k\"}".into(), false, 10).unwrap();
}

#[test]
fn routing_and_running_count_from_members_only() {
    let mut w = World::new();
    let (member, submitter) = (w.member.peer().clone(), w.submitter.peer().clone());
    // A submitter pauses, boosts and claims the router: none of it counts.
    let mut d = w.fork(&submitter);
    queue::set_paused(&mut d, true, 10).unwrap();
    queue::set_boost(&mut d, "hot", 5, 10).unwrap();
    queue::claim_router(&mut d, &Claim::new(1, submitter.clone()), 10).unwrap();
    w.merge(d);
    let v = w.view();
    assert!(!v.paused);
    assert!(v.boosts.is_empty());
    assert_eq!(v.router, None);
    assert!(v.malformed > 0, "the ignored claim is counted as malformed");
    // A member does the same: it counts.
    let mut d = w.fork(&member);
    queue::set_paused(&mut d, true, 20).unwrap();
    queue::set_boost(&mut d, "hot", 5, 20).unwrap();
    queue::claim_router(&mut d, &Claim::new(1, member.clone()), 20).unwrap();
    w.merge(d);
    let v = w.view();
    assert!(v.paused);
    assert_eq!(v.boosts.get("hot"), Some(&5));
    assert_eq!(v.router, Some(Claim::new(1, member)));
}

#[test]
fn a_submitter_cancels_its_own_tasks_only() {
    let mut w = World::new();
    let (member, submitter) = (w.member.peer().clone(), w.submitter.peer().clone());
    let mut d = w.fork(&member);
    queue::submit(&mut d, &submission("theirs", &member)).unwrap();
    w.merge(d);
    let mut d = w.fork(&submitter);
    queue::submit(&mut d, &submission("mine", &submitter)).unwrap();
    queue::cancel(&mut d, &TaskId::new("mine"), &submitter, 10).unwrap();
    queue::cancel(&mut d, &TaskId::new("theirs"), &submitter, 10).unwrap();
    w.merge(d);
    let v = w.view();
    assert!(v.task(&TaskId::new("mine")).unwrap().cancel.is_some());
    assert!(v.task(&TaskId::new("theirs")).unwrap().cancel.is_none());
}

#[test]
fn a_removed_members_writes_count_up_to_what_its_removal_had_seen() {
    let mut w = World::new();
    let member = w.member.peer().clone();
    // The member writes a task the admin sees, then, partitioned, another and a boost.
    let mut d = w.fork(&member);
    queue::submit(&mut d, &submission("seen", &member)).unwrap();
    let mut shared = d.fork();
    w.merge(d.fork());
    queue::submit(&mut d, &submission("unseen", &member)).unwrap();
    queue::set_boost(&mut d, "late", 3, 30).unwrap();
    // The admin removes it, having seen only the first.
    w.op(OpKind::Remove, &member, None);
    let v = w.view();
    assert!(v.task(&TaskId::new("seen")).is_some());
    // The partition heals: the member's later writes reach the replica, and are ignored.
    w.merge(d.fork());
    let v = w.view();
    assert!(!v.membership.is_member(&member));
    assert!(
        v.task(&TaskId::new("seen")).is_some(),
        "what the removal had seen stands"
    );
    assert!(v.task(&TaskId::new("unseen")).is_none());
    assert!(v.boosts.is_empty());
    // The same on a replica that learns of the removal last.
    shared.merge(&mut d).unwrap();
    assert!(
        QueueView::read(&shared)
            .unwrap()
            .task(&TaskId::new("unseen"))
            .is_some()
    );
    shared.merge(&mut w.doc.fork()).unwrap();
    let v = QueueView::read(&shared).unwrap();
    assert!(v.task(&TaskId::new("unseen")).is_none());
    assert!(v.task(&TaskId::new("seen")).is_some());
}

#[test]
fn a_writer_that_cannot_be_known_is_read_as_before() {
    // An actor no member's tag names (a queue written before actors were tagged).
    let mut w = World::new();
    let mut d = w.doc.fork().with_actor(ActorId::from(&[7u8; 16][..]));
    queue::set_config(&mut d, &attempts(6), 10).unwrap();
    w.merge(d);
    assert_eq!(w.view().config.max_attempts, 6);
}

#[test]
fn a_takeover_supersedes_the_claim_the_view_counts_not_a_submitters() {
    let mut w = World::new();
    let (admin, member, submitter) = (
        w.admin.peer().clone(),
        w.member.peer().clone(),
        w.submitter.peer().clone(),
    );
    let mut d = w.fork(&member);
    queue::claim_router(&mut d, &Claim::new(1, member.clone()), 10).unwrap();
    w.merge(d);
    // A submitter's claim at the same term, greater than the member's: ignored by views.
    let mut d = w.fork(&submitter);
    queue::claim_router(&mut d, &Claim::new(1, submitter.clone()), 11).unwrap();
    w.merge(d);
    let view = w.view();
    assert_eq!(view.router, Some(Claim::new(1, member.clone())));
    // Read without judging, the takeover would supersede the submitter's claim, and count
    // nowhere; superseding the view's, it counts.
    let mut blind = w.fork(&admin);
    queue::claim_router(&mut blind, &Claim::new(2, admin.clone()), 20).unwrap();
    assert_eq!(
        QueueView::read(&blind).unwrap().router,
        Some(Claim::new(1, member.clone()))
    );
    let mut d = w.fork(&admin);
    queue::claim_router_in_view(&mut d, &view, &Claim::new(2, admin.clone()), 20).unwrap();
    w.merge(d);
    assert_eq!(w.view().router, Some(Claim::new(2, admin)));
}

#[test]
fn a_task_documents_runs_count_from_members_only() {
    use piecework_queue_doc::task;
    let w = World::new();
    let submitter = w.submitter.peer().clone();
    let view = QueueView::read(&w.doc).unwrap();
    let mut doc = Automerge::new().with_actor(actor_for(&submitter, [1; 8]));
    task::init(
        &mut doc,
        &task::NewTask {
            queue: w.q.clone(),
            kind: "k".into(),
            input: serde_json::json!({}),
            submitter: submitter.clone(),
            submitted_at: 1,
        },
    )
    .unwrap();
    // The submitter's node, modified, writes a run's result itself.
    let attempt = piecework_queue_doc::AttemptId {
        n: 1,
        claim: Claim::new(1, submitter.clone()),
    };
    let worker = piecework_queue_doc::WorkerId::new(submitter.clone(), 0);
    task::record_run_start(
        &mut doc,
        &task::RunStart {
            attempt,
            worker,
            incarnation: 1,
            at: 2,
        },
    )
    .unwrap();
    assert_eq!(
        task::read(&doc).unwrap().runs.len(),
        1,
        "read without judging"
    );
    assert!(
        task::read_judged(&doc, &view.membership)
            .unwrap()
            .runs
            .is_empty()
    );
}

#[test]
fn a_removal_without_a_cut_keeps_what_the_removed_member_wrote() {
    // A removal signed before removals carried cuts: the member's writes are judged by its
    // role alone, so its tasks stay (at least once).
    let mut w = World::new();
    let member = w.member.peer().clone();
    let mut d = w.fork(&member);
    queue::submit(&mut d, &submission("earlier", &member)).unwrap();
    w.merge(d);
    let v = w.view();
    let op = MemberOp::sign(
        &w.admin,
        NewOp {
            queue: &w.q,
            kind: OpKind::Remove,
            peer: &member,
            role: None,
            key: None,
            deps: v.membership.heads(),
            at_ms: 0,
            via: None,
            cut: None,
        },
    );
    queue::add_member_op(&mut w.doc, &op).unwrap();
    let v = w.view();
    assert!(!v.membership.is_member(&member));
    assert!(v.task(&TaskId::new("earlier")).is_some());
}

#[test]
fn a_members_rotation_keeps_the_admins_configuration_and_schedules() {
    use piecework_queue_doc::epoch::{self, Rotation};
    let mut w = World::new();
    let (admin, member) = (w.admin.peer().clone(), w.member.peer().clone());
    let mut d = w.fork(&admin);
    queue::set_config(&mut d, &attempts(9), 20).unwrap();
    schedule(&mut d, "nightly");
    w.merge(d);
    let mut d = w.fork(&member);
    queue::claim_router(&mut d, &Claim::new(1, member.clone()), 10).unwrap();
    queue::submit(&mut d, &submission("live", &member)).unwrap();
    w.merge(d);
    let view = w.view();
    assert_eq!(view.config.max_attempts, 9);
    // The member, routing, rotates: the successor is written under its actor alone.
    let mut succ = Automerge::new().with_actor(actor_for(&member, [2; 8]));
    let claim = Claim::new(2, member.clone());
    epoch::build_successor(
        &w.doc,
        &view,
        &mut succ,
        &Rotation {
            origin: &w.q,
            prev: w.q.as_str(),
            successor: "automerge:successor",
            epoch: 1,
            claim: &claim,
            now_ms: 30,
        },
    )
    .unwrap();
    let next = QueueView::read(&succ).unwrap();
    assert_eq!(next.doc_key.as_deref(), Some("automerge:successor"));
    assert_eq!(
        next.config.max_attempts, 9,
        "the admin's configuration, copied"
    );
    assert!(next.schedules.contains_key("nightly"));
    assert!(next.task(&TaskId::new("live")).is_some());
    // After the build, the member's own configuration write is judged as its own: it does
    // not count (and the copy it overwrote is not brought back: the default is read).
    queue::set_config(&mut succ, &attempts(4), 40).unwrap();
    assert_eq!(
        QueueView::read(&succ).unwrap().config.max_attempts,
        QueueConfig::default().max_attempts
    );
    let mut cache = ViewCache::new();
    assert_eq!(
        **cache.refresh(&succ).unwrap(),
        QueueView::read(&succ).unwrap()
    );
}

#[test]
fn a_removed_members_late_write_is_not_carried_into_the_successor() {
    use piecework_queue_doc::epoch::{self, Rotation};
    let mut w = World::new();
    let (admin, member, submitter) = (
        w.admin.peer().clone(),
        w.member.peer().clone(),
        w.submitter.peer().clone(),
    );
    // Replicas of the member and the submitter, partitioned from here on.
    let mut theirs = w.fork(&member);
    let mut sub = w.fork(&submitter);
    // The admin removes the member and rotates.
    w.op(OpKind::Remove, &member, None);
    let view = w.view();
    let sealed_at = w.doc.get_heads();
    let mut succ = Automerge::new().with_actor(actor_for(&admin, [3; 8]));
    let claim = Claim::new(1, admin.clone());
    epoch::build_successor(
        &w.doc,
        &view,
        &mut succ,
        &Rotation {
            origin: &w.q,
            prev: w.q.as_str(),
            successor: "automerge:next",
            epoch: 1,
            claim: &claim,
            now_ms: 30,
        },
    )
    .unwrap();
    // Late writes into the sealed document: the removed member's, and a submitter's.
    queue::submit(&mut theirs, &submission("removed-late", &member)).unwrap();
    queue::submit(&mut sub, &submission("submitter-late", &submitter)).unwrap();
    w.merge(theirs);
    w.merge(sub);
    epoch::carry(&w.doc, &sealed_at, &mut succ, &|_| false, None, 1_000).unwrap();
    let next = QueueView::read(&succ).unwrap();
    assert!(next.task(&TaskId::new("submitter-late")).is_some());
    assert!(
        next.task(&TaskId::new("removed-late")).is_none(),
        "a removed member's write its removal had not seen, carried by the admin"
    );
}
