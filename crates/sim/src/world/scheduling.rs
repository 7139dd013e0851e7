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

/// What the client asked of one task.
#[derive(Clone, Debug, Default)]
pub(super) struct Asked {
    deps: Vec<TaskId>,
    /// Unix ms, by the submitting node's clock; 0: none.
    not_before: u64,
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
            asked.push(a);
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
        if let Some(a) = asked.filter(|a| !a.deps.is_empty() || a.not_before > 0) {
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
