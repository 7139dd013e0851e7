//! The task life-cycle workload (the `lifecycle` mix): members cancel acknowledged tasks,
//! requeue a queue's dead-lettered ones and switch its failure policy (ignore the kind's
//! failures, or retry them) at run time, a share of the submits carry a timeout
//! shorter than some runs, and a handler asked to stop either returns an error soon or runs on
//! past the (short) grace time. The requests go through a member's core as a user's would
//! (`Command::CancelTask`, `Command::RequeueFailed`), across partitions, crashes and rotations.
//!
//! A share of the successful runs submit follow-up tasks (which may have their own), and
//! record an undo task; with each requeue of a queue's dead letters, a member undoes a
//! succeeded task.
//!
//! Invariant 18: no run starts on a node whose view of the queue holds a cancel of its task.
//! Invariant 19: no view holds a success without its follow-ups (or their ends), and no
//! follow-up starts on a node whose view holds its task not succeeded. (Every change that
//! writes a success writes its follow-ups; only where branches of a double seal meet can a
//! view hold a follow-up before its task's success, and the follow-up then waits on it.)
//! Invariant 2 (in `invariants.rs`) allows a final state to reopen only by a requeue (the task's,
//! or for a task cancelled by its dependency's failure, the dependency's).
//!
//! It asks the parent for the clock, randomness, `count`, `trace` and `violate`; `settings` for
//! `member_with_view` and `send`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use piecework_core::{Command, Reply, api};
use piecework_queue_doc::{
    ConfigPatch, FailurePolicy, Planned, PlannedTask, QueueId, QueueView, TaskId, TaskState,
    follow_up_id,
};
use rand::Rng;

use super::World;

/// The grace time of a cancelled or timed-out run in the `lifecycle` mix: shorter than many
/// runs, so that handlers that ignore the signal have their end recorded without them.
const LIFECYCLE_GRACE: Duration = Duration::from_millis(300);

/// The share of a `lifecycle` mix's submits that carry a timeout, and its range (ms): runs
/// take up to 1.5 s in the default mix, so some of them time out.
const TIMEOUT_SHARE: f64 = 0.3;
const TIMEOUT_MS: (u64, u64) = (200, 1_500);

/// What the workload remembers: the attempts seen timed out or recorded past their grace.
#[derive(Default)]
pub(super) struct Lifecycle {
    seen_ends: BTreeSet<(TaskId, u64, String)>,
    /// Succeeded tasks undone already.
    undone: BTreeSet<TaskId>,
}

/// How many follow-ups a successful run of `task` submits in the `lifecycle` mix: 1 or 2 for
/// three tasks in ten, a function of the task (every run of it submits the same), so that the
/// chains of follow-ups end.
pub(super) fn follow_ups_of(task: &TaskId) -> usize {
    let h = task
        .as_str()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    if h % 10 < 3 {
        1 + (h / 10 % 2) as usize
    } else {
        0
    }
}

/// The grace time cores get in this run.
pub(super) fn cancel_grace(config: &crate::Config) -> Duration {
    if config.mix.lifecycle > 0.0 {
        LIFECYCLE_GRACE
    } else {
        piecework_core::CANCEL_GRACE
    }
}

impl World {
    /// A member cancels a random acknowledged task, or requeues a queue's dead letters.
    pub(super) fn life_act(&mut self) {
        let q = self.rng.random_range(0..self.members.len());
        let Some(queue) = self.queues[q].clone() else {
            return;
        };
        let Some(i) = self.member_with_view(q) else {
            return;
        };
        if self.rng.random_bool(0.1) {
            // The queue's failure policy: the kind's failures ignored (dead-lettered at once),
            // or retried again.
            let ignore = self.rng.random_bool(0.5);
            let policy = if ignore {
                [("sim".to_owned(), FailurePolicy::Ignore)].into()
            } else {
                Default::default()
            };
            self.count("life_policy_set");
            self.trace(|| format!("node{i} sets {queue}'s failure policy, ignore: {ignore}"));
            let patch = ConfigPatch {
                failure_policy: Some(policy),
                ..ConfigPatch::default()
            };
            self.send(i, Command::SetConfig { queue, patch });
        } else if self.rng.random_bool(0.7) {
            let of_queue: Vec<&TaskId> = self
                .submitted
                .iter()
                .filter(|(_, tq)| **tq == queue)
                .map(|(t, _)| t)
                .collect();
            if of_queue.is_empty() {
                return;
            }
            let task = of_queue[self.rng.random_range(0..of_queue.len())].clone();
            self.count("life_cancel_sent");
            self.trace(|| format!("node{i} cancels {task}"));
            self.send(i, Command::CancelTask { task });
        } else {
            self.count("life_requeue_sent");
            self.trace(|| format!("node{i} requeues the dead letters of {queue}"));
            self.send(i, Command::RequeueFailed { queue });
            // And undoes a succeeded task it has not undone yet (no randomness drawn).
            let task = self
                .ever_succeeded
                .iter()
                .find(|t| !self.life.undone.contains(*t) && follow_ups_of(t) > 0)
                .cloned();
            if let Some(task) = task {
                self.life.undone.insert(task.clone());
                self.count("life_undo_sent");
                self.trace(|| format!("node{i} undoes {task}"));
                self.send(i, Command::UndoTask { task });
            }
        }
    }

    /// What a run of `task` plans in the `lifecycle` mix if it succeeds: its follow-ups and an
    /// undo task for tasks that have follow-ups.
    pub(super) fn planned_for(&self, task: &TaskId) -> Planned {
        if self.config.mix.lifecycle <= 0.0 {
            return Planned::default();
        }
        let n = follow_ups_of(task);
        Planned {
            follow_ups: (0..n)
                .map(|i| PlannedTask::new("sim", format!("{{\"follows\":{i}}}")))
                .collect(),
            undo: (0..n.min(1))
                .map(|_| PlannedTask::new("sim", "{\"undo\":true}"))
                .collect(),
            progress: None,
        }
    }

    /// Invariant 19 on node `i`'s view: a task it holds succeeded holds its follow-ups (or they
    /// ended and left it), and a follow-up it holds has its task succeeded (or not held).
    pub(super) fn follow_ups_with_their_success(&mut self, i: usize, view: &Arc<QueueView>) {
        if self.config.mix.lifecycle <= 0.0 {
            return;
        }
        let mut bad = Vec::new();
        let mut seen = Vec::new();
        let mut held = Vec::new();
        for (id, t) in view.tasks() {
            if let Some(p) = &t.rules.follows {
                seen.push(id.clone());
                // Where branches meet: held back (waiting on its task) until the success
                // arrives. Invariant 19's other half checks that it never starts meanwhile.
                if view
                    .task(p)
                    .is_some_and(|pt| pt.state() != TaskState::Succeeded)
                {
                    held.push(id.clone());
                }
            }
            if t.state() == TaskState::Succeeded {
                for j in 0..follow_ups_of(id) {
                    let f = follow_up_id(id, j);
                    if view.task(&f).is_none() && !self.ever_final.contains(&f) {
                        bad.push(format!(
                            "node{i} holds {id} succeeded without its follow-up {f}"
                        ));
                    }
                }
            }
        }
        for id in seen {
            if self
                .life
                .seen_ends
                .insert((id, 0, "follow_up_seen".to_owned()))
            {
                self.count("follow_up_seen");
            }
        }
        for id in held {
            if self
                .life
                .seen_ends
                .insert((id, 0, "follow_up_held_back".to_owned()))
            {
                self.count("follow_up_held_back");
            }
        }
        for what in bad {
            self.violate(19, what);
        }
    }

    /// Invariant 19, the other half: node `i` starts a follow-up only if its view holds its
    /// task succeeded (or not at all: it ended and was left behind).
    pub(super) fn a_follow_up_starts_after_its_success(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
    ) {
        let Some(view) = self.nodes[i].core.view(queue) else {
            return;
        };
        let Some(p) = view.task(task).and_then(|t| t.rules.follows.clone()) else {
            return;
        };
        if let Some(state) = view.task(&p).map(|t| t.state())
            && state != TaskState::Succeeded
        {
            self.violate(
                19,
                format!(
                    "node{i} starts follow-up {task} while its view holds its task {p} {}",
                    state.as_str()
                ),
            );
        }
    }

    /// The timeouts a `lifecycle` mix puts on a new task (none in other mixes: no randomness is
    /// drawn there, so they replay as before).
    pub(super) fn draw_timeout(&mut self) -> Option<u64> {
        if self.config.mix.lifecycle <= 0.0 || !self.rng.random_bool(TIMEOUT_SHARE) {
            return None;
        }
        Some(self.rng.random_range(TIMEOUT_MS.0..=TIMEOUT_MS.1))
    }

    /// Counts what a life-cycle command's answer says.
    pub(super) fn life_reply(&mut self, reply: &Reply) {
        match reply {
            Reply::Task(r) => match r.as_ref() {
                Ok(_) => self.count("life_cancel_or_requeue_written"),
                Err(api::TaskError::Conflict(_)) => self.count("life_refused_as_ended"),
                Err(_) => self.count("life_refused_other"),
            },
            Reply::TaskIds(Ok(ids)) => {
                for _ in ids {
                    self.count("life_requeued");
                }
            }
            Reply::Undone(Ok(ids)) => {
                for _ in ids {
                    self.count("life_undo_task");
                }
            }
            Reply::Undone(Err(_)) => self.count("life_undo_refused"),
            _ => {}
        }
    }

    /// Counts the attempts a view shows ended by a timeout or past their grace time, once each.
    pub(super) fn watch_life_ends(&mut self, view: &Arc<QueueView>) {
        if self.config.mix.lifecycle <= 0.0 {
            return;
        }
        let mut new = Vec::new();
        for (id, t) in view.tasks() {
            if t.cancel_requested() {
                new.push((id.clone(), 0, "cancelled_task_seen".to_owned()));
            }
            if t.requeue.is_some() {
                new.push((id.clone(), 0, "requeued_task_seen".to_owned()));
            }
            for a in &t.attempts {
                let Some(f) = &a.finished else { continue };
                let what = if f.ignored() {
                    "attempt_ignored"
                } else if f.overdue() {
                    "attempt_overdue"
                } else if f.timed_out {
                    "attempt_timed_out"
                } else if f
                    .error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("cancelled: "))
                {
                    "attempt_cancelled"
                } else {
                    continue;
                };
                new.push((id.clone(), a.id.n, what.to_owned()));
            }
        }
        for key in new {
            if self.life.seen_ends.insert(key.clone()) {
                self.count(&key.2);
            }
        }
    }

    /// Invariant 18: node `i` starts a run of `task` of `queue` only if its view holds no cancel
    /// of it.
    pub(super) fn a_cancelled_task_never_starts(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: &TaskId,
    ) {
        let cancelled = self.nodes[i]
            .core
            .view(queue)
            .and_then(|v| v.task(task).map(|t| t.cancel_requested()))
            .unwrap_or(false);
        if cancelled {
            self.violate(
                18,
                format!("node{i} starts {task} while its view holds a cancel of it"),
            );
        }
    }
}
