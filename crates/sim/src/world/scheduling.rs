//! The scheduling workload (the `scheduling` mix): clients submit tasks with priority tags, a
//! delay, and dependencies on tasks acknowledged before, and members change tags' boosts at run
//! time, through the node's core as a user would, across partitions, crashes and rotations.
//!
//! It keeps the truth the checks judge from: each acknowledged task's dependencies and its
//! not-before time as the client asked (the submitting node's clock at the submit plus the
//! delay). Invariant 12: no task starts before a run of each of its dependencies ended in
//! success. Invariant 13: no attempt was assigned before its task's not-before time, by the
//! assigning router's clock (the attempt's `assigned_at`).
//!
//! It asks the parent for randomness, the clock, `count`, `trace`, `violate` and the run
//! records; the settings module for `send`. The clients ask it for `draw_rules`, the shell for
//! `note_acknowledged` and `forget_submit`, the start check for the two invariants.

use std::collections::BTreeMap;

use piecework_core::api::SubmitTask;
use piecework_core::{Command, CommandId};
use piecework_queue_doc::{AttemptId, QueueId, TaskId};
use rand::Rng;

use super::{End, World};

/// The tags the workload uses.
const TAGS: [&str; 3] = ["a", "b", "c"];

/// The kind every node runs.
const KIND: &str = "sim";
/// The kind only the even-numbered nodes run (in the `scheduling` mix).
const RARE_KIND: &str = "sim-even";
/// The resource the nodes whose index is not a multiple of three hold (in the `scheduling`
/// mix), each withdrawing it for a while now and then.
const RESOURCE: &str = "r1";

/// The kinds node `i` reports: every node [`KIND`], the even ones [`RARE_KIND`] too; `None`
/// (not reported) outside the `scheduling` mix.
pub(super) fn kinds_of(config: &crate::Config, i: usize) -> Option<Vec<String>> {
    (config.mix.scheduling > 0.0).then(|| {
        let mut k = vec![KIND.to_owned()];
        if i.is_multiple_of(2) {
            k.push(RARE_KIND.to_owned());
        }
        k
    })
}

/// The resources node `i` holds at each start.
pub(super) fn resources_of(config: &crate::Config, i: usize) -> Vec<String> {
    match config.mix.scheduling > 0.0 && !i.is_multiple_of(3) {
        true => vec![RESOURCE.to_owned()],
        false => vec![],
    }
}

/// What the client asked of one task.
#[derive(Clone, Debug, Default)]
pub(super) struct Asked {
    deps: Vec<TaskId>,
    /// Unix ms, by the submitting node's clock; 0: none.
    not_before: u64,
    /// Its kind is [`RARE_KIND`].
    rare_kind: bool,
    /// It requires [`RESOURCE`].
    requires: bool,
}

/// The workload's records.
#[derive(Debug, Default)]
pub(super) struct Scheduling {
    /// Acknowledged tasks that asked for something.
    asked: BTreeMap<TaskId, Asked>,
    /// Submits in flight: what each entry of the command asked.
    pending: BTreeMap<(usize, CommandId), Vec<Asked>>,
    /// Single submits in flight with an idempotency key: the request, to send again once
    /// answered.
    idempotent: BTreeMap<(usize, CommandId), SubmitTask>,
    /// Retries in flight, sent to the node that took the first submit: the task it answered.
    retries: BTreeMap<(usize, CommandId), TaskId>,
    /// Idempotency keys drawn so far.
    keys: u64,
    /// (node, task): the node's view showed the task cancelled as a dedup duplicate.
    dup_cancelled: std::collections::BTreeSet<(usize, TaskId)>,
    /// Nodes that withdrew [`RESOURCE`] in their current start, with when (on the node's
    /// monotonic clock) it is theirs again.
    pub(super) withdrawn: BTreeMap<usize, std::time::Instant>,
    /// Attempts seen refused for a resource the pool did not hold (counted once each).
    resource_refusals: std::collections::BTreeSet<(TaskId, AttemptId)>,
}

impl World {
    /// Draws the scheduling fields of a submit's tasks (in the `scheduling` mix only: no
    /// randomness is drawn otherwise), and now and then a boost change by the same member.
    pub(super) fn draw_rules(
        &mut self,
        i: usize,
        queue: &QueueId,
        cmd: CommandId,
        tasks: &mut [SubmitTask],
    ) {
        let share = self.config.mix.scheduling;
        if share <= 0.0 {
            return;
        }
        let t = self.time(i);
        let mut asked = Vec::with_capacity(tasks.len());
        for task in tasks.iter_mut() {
            let mut a = Asked::default();
            if self.rng.random_bool(share) {
                for tag in TAGS {
                    if self.rng.random_bool(0.3) {
                        task.tags.push(tag.to_owned());
                    }
                }
                if !task.tags.is_empty() {
                    self.count("scheduling_tagged");
                }
                if self.rng.random_bool(0.4) {
                    let of_queue: Vec<&TaskId> = self
                        .submitted
                        .iter()
                        .filter(|(_, q)| *q == queue)
                        .map(|(t, _)| t)
                        .collect();
                    if !of_queue.is_empty() {
                        let d = of_queue[self.rng.random_range(0..of_queue.len())].clone();
                        self.count("scheduling_dependent");
                        a.deps.push(d.clone());
                        task.depends_on.push(d);
                    }
                }
                if self.rng.random_bool(0.3) {
                    let delay = self.rng.random_range(100..=3_000u64);
                    self.count("scheduling_delayed");
                    a.not_before = t.unix_ms + delay;
                    task.delay_ms = Some(delay);
                }
            }
            if self.rng.random_bool(share * 0.5) {
                task.dedup_key = Some(format!("d{}", self.rng.random_range(0..5)));
                self.count("scheduling_dedup_key");
            }
            if self.rng.random_bool(share * 0.2) {
                task.kind = RARE_KIND.to_owned();
                a.rare_kind = true;
                self.count("scheduling_rare_kind");
            }
            if self.rng.random_bool(share * 0.2) {
                task.requires.push(RESOURCE.to_owned());
                a.requires = true;
                self.count("scheduling_requires");
            }
            asked.push(a);
        }
        if !i.is_multiple_of(3) && self.rng.random_bool(0.1) {
            let restore = std::time::Duration::from_millis(self.rng.random_range(200..=2_000));
            self.count("resource_withdrawn");
            self.trace(|| format!("node{i} withdraws {RESOURCE} for {restore:?}"));
            self.sched.withdrawn.insert(i, t.mono + restore);
            self.send(
                i,
                Command::WithdrawResource {
                    name: RESOURCE.to_owned(),
                    restore_after: Some(restore),
                },
            );
        }
        self.sched.pending.insert((i, cmd), asked);
        if tasks.len() == 1 && self.rng.random_bool(0.2) {
            self.sched.keys += 1;
            tasks[0].idempotency_key = Some(format!("idem-{}", self.sched.keys));
            self.sched.idempotent.insert((i, cmd), tasks[0].clone());
        }
        if self.rng.random_bool(0.15) {
            let tag = TAGS[self.rng.random_range(0..TAGS.len())];
            let boost = self.rng.random_range(-2..=2i64);
            self.count("setting_boost");
            self.trace(|| format!("node{i} boosts {tag} by {boost} on {queue}"));
            self.send(
                i,
                Command::SetBoost {
                    queue: queue.clone(),
                    tag: tag.to_owned(),
                    boost,
                },
            );
        }
    }

    /// Entry `index` of submit `cmd` on node `i` was acknowledged as `task` (`deduplicated`:
    /// an existing task that held the entry's dedup key). A single submit with an idempotency
    /// key is sent again to the same node, as a client that lost the answer would.
    pub(super) fn note_acknowledged(
        &mut self,
        i: usize,
        cmd: CommandId,
        index: usize,
        task: &TaskId,
        deduplicated: bool,
    ) {
        if let Some(req) = self.sched.idempotent.remove(&(i, cmd)) {
            let queue = self.nodes[i].submits.get(&cmd).map(|(q, _)| q.clone());
            if let Some(queue) = queue {
                let retry = self.command_id(i);
                self.count("idempotent_retry");
                self.sched.retries.insert((i, retry), task.clone());
                let t = self.time(i);
                self.nodes[i]
                    .core
                    .handle_command(t, retry, Command::Submit { queue, task: req });
                self.drive(i);
            }
        }
        if deduplicated {
            self.count("dedup_bumped");
            return;
        }
        let asked = self
            .sched
            .pending
            .get(&(i, cmd))
            .and_then(|a| a.get(index))
            .cloned();
        if let Some(a) =
            asked.filter(|a| !a.deps.is_empty() || a.not_before > 0 || a.rare_kind || a.requires)
        {
            self.sched.asked.insert(task.clone(), a);
        }
    }

    /// Node `i`'s view shows `task` cancelled as a dedup duplicate.
    pub(super) fn note_dup_cancelled(&mut self, i: usize, task: &TaskId) {
        self.sched.dup_cancelled.insert((i, task.clone()));
    }

    /// Whether node `i`'s view showed `task` cancelled as a dedup duplicate.
    pub(super) fn sched_dup_cancelled(&self, i: usize, task: &TaskId) -> bool {
        self.sched.dup_cancelled.contains(&(i, task.clone()))
    }

    /// Submit `cmd` on node `i` was answered.
    pub(super) fn forget_submit(&mut self, i: usize, cmd: CommandId) {
        self.sched.pending.remove(&(i, cmd));
        self.sched.idempotent.remove(&(i, cmd));
    }

    /// Whether `cmd` on node `i` is an idempotent retry; if it is, checks its answer
    /// (invariant 15: a retry on the node that took the first submit returns that submit's
    /// task).
    pub(super) fn retry_answered(
        &mut self,
        i: usize,
        cmd: CommandId,
        answer: Option<&TaskId>,
    ) -> bool {
        let Some(first) = self.sched.retries.remove(&(i, cmd)) else {
            return false;
        };
        if let Some(t) = answer
            && *t != first
        {
            self.violate(
                15,
                format!("node{i} answered a retry of {first}'s idempotency key with {t}"),
            );
        }
        true
    }

    /// Invariant 14: no view shows two pending tasks that never started with one dedup key
    /// (copies reduce to one survivor; a task made knowing of another only after it started).
    pub(super) fn no_two_fresh_pending_tasks_share_a_dedup_key(
        &mut self,
        i: usize,
        view: &piecework_queue_doc::QueueView,
    ) {
        if self.config.mix.scheduling <= 0.0 {
            return;
        }
        let mut seen: BTreeMap<&str, &TaskId> = BTreeMap::new();
        let mut clash = None;
        for t in view.tasks().values() {
            let fresh = t.state() == piecework_queue_doc::TaskState::Pending && !t.ever_started();
            if let (true, Some(k)) = (fresh, t.rules.dedup_key.as_deref())
                && let Some(other) = seen.insert(k, &t.id)
            {
                clash = Some((k.to_owned(), other.clone(), t.id.clone()));
            }
        }
        if let Some((k, a, b)) = clash {
            self.violate(
                14,
                format!("node{i}'s view has {a} and {b} pending with dedup key {k}"),
            );
        }
    }

    /// Invariant 12: node `i` starts `task` only after a run of each of its dependencies
    /// ended in success.
    pub(super) fn a_dependent_starts_after_its_dependencies_succeeded(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
    ) {
        let Some(asked) = self.sched.asked.get(task) else {
            return;
        };
        // A dependency on a dedup duplicate stands for its survivor: as the starting node's
        // view derives it from the copies it holds, or, once a rotation left the duplicate
        // behind, as the dependent's entry names it (a rotation rewrites the dependency).
        let view = self.nodes[i].core.view(queue).cloned();
        let rewritten: Vec<TaskId> = view
            .as_ref()
            .and_then(|v| v.task(task))
            .map(|e| {
                e.rules
                    .depends_on
                    .iter()
                    .filter(|d| !asked.deps.contains(d))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let succeeded = |t: &TaskId| {
            self.runs.get(t).is_some_and(|runs| {
                runs.iter().any(|r| {
                    r.end == Some(End::Succeeded) && r.end_us.is_some_and(|e| e <= self.now_us)
                })
            })
        };
        let missing: Vec<TaskId> = asked
            .deps
            .iter()
            .filter(|d| {
                let survivor = view.as_ref().map_or((*d).clone(), |v| v.survivor(d));
                !succeeded(d) && !succeeded(&survivor) && !rewritten.iter().any(&succeeded)
            })
            .cloned()
            .collect();
        if !asked.deps.is_empty() {
            self.count("dependent_started");
        }
        if let Some(d) = missing.first() {
            let entry = view.as_ref().and_then(|v| v.task(task)).map(|e| {
                format!(
                    "depends on {:?}, outcomes known {:?}",
                    e.rules.depends_on, e.dependencies
                )
            });
            self.violate(
                12,
                format!("node{i} starts {task} before its dependency {d} succeeded ({entry:?})"),
            );
        }
    }

    /// Invariant 16, at a start: node `i` has a handler for the task's kind and holds every
    /// resource it requires, as the workload configured and changed them (a withdrawn
    /// resource is the node's again at its restore time, by the node's clock).
    pub(super) fn a_run_starts_only_where_its_kind_and_resources_are(
        &mut self,
        i: usize,
        task: &TaskId,
    ) {
        let Some(asked) = self.sched.asked.get(task).cloned() else {
            return;
        };
        if asked.rare_kind {
            self.count("rare_kind_started");
            if !i.is_multiple_of(2) {
                self.violate(
                    16,
                    format!("node{i} starts {task}, of a kind it has no handler for"),
                );
            }
        }
        if asked.requires {
            self.count("requiring_started");
            let now = self.time(i).mono;
            let withdrawn = self.sched.withdrawn.get(&i).is_some_and(|at| now < *at);
            if i.is_multiple_of(3) || withdrawn {
                self.violate(
                    16,
                    format!(
                        "node{i} starts {task}, which requires {RESOURCE}, while it does not hold it (withdrawn: {withdrawn})"
                    ),
                );
            }
        }
    }

    /// Invariant 16, in every view: no router assigned a task to a pool whose heartbeats
    /// never named its kind or a resource it requires. Kinds never change, so a refusal for
    /// the kind is always such an assignment; a pool refuses for a resource only when it
    /// withdrew it after the heartbeat the router went by (counted), never on a node that
    /// never held it.
    pub(super) fn no_assignment_to_a_pool_that_lacked_it(
        &mut self,
        view: &piecework_queue_doc::QueueView,
    ) {
        let mut bad = None;
        let mut refused = vec![];
        for t in view.tasks().values() {
            for a in &t.attempts {
                let Some(error) = a.finished.as_ref().and_then(|f| f.error.as_deref()) else {
                    continue;
                };
                let node: Option<usize> = a
                    .worker
                    .peer
                    .as_str()
                    .strip_prefix("node")
                    .and_then(|n| n.parse().ok());
                if error.starts_with("no handler for kind") {
                    bad = Some(format!(
                        "{} {} was assigned to {}: {error}",
                        t.id, a.id, a.worker
                    ));
                } else if error.starts_with("resource ") {
                    if node.is_some_and(|n| n.is_multiple_of(3)) {
                        bad = Some(format!(
                            "{} {} was assigned to {}, which never held it: {error}",
                            t.id, a.id, a.worker
                        ));
                    }
                    refused.push((t.id.clone(), a.id.clone()));
                }
            }
        }
        for r in refused {
            if self.sched.resource_refusals.insert(r) {
                self.count("resource_refused_after_withdrawal");
            }
        }
        if let Some(b) = bad {
            self.violate(16, b);
        }
    }

    /// Invariant 13: the attempt node `i` starts was not assigned before its task's
    /// not-before time, by the assigning router's clock.
    pub(super) fn no_task_is_assigned_before_its_not_before(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
        attempt: &AttemptId,
    ) {
        let Some(not_before) = self
            .sched
            .asked
            .get(task)
            .map(|a| a.not_before)
            .filter(|t| *t > 0)
        else {
            return;
        };
        let assigned_at = self.nodes[i]
            .core
            .view(queue)
            .and_then(|v| v.task(task))
            .and_then(|t| t.attempts.iter().find(|a| a.id == *attempt))
            .map(|a| a.assigned_at);
        self.count("delayed_started");
        if let Some(at) = assigned_at.filter(|at| *at < not_before) {
            self.violate(
                13,
                format!(
                    "{task} (attempt {attempt}) was assigned at {at}, before its not-before {not_before}"
                ),
            );
        }
    }
}
