//! The clients: they join queues and submit tasks, and hear whether a submit was taken.
//!
//! It owns no state of its own beyond the world's `to_submit` and `submitted`. A client submits
//! at the times the setup drew, to a random queue through a random member that is up and has
//! joined it, one submit in four a batch; a refused submit, or one that finds no such member,
//! is tried again `RETRY_US` later. A node that has not joined a queue it should is asked to.
//!
//! It asks the parent for the event queue, the clock, `count`, `trace` and `command_id`; the
//! shell for `drive`; the invariants for `an_acknowledged_submit_is_on_disk`. The shell asks it
//! for `acknowledged` and `submit_refused` when a submit is answered.

use piecework_core::Command;
use piecework_core::api::SubmitTask;
use piecework_queue_doc::{QueueId, TaskId};
use rand::Rng;

use super::{Ev, RETRY_US, World};

impl World {
    pub(super) fn join(&mut self, i: usize, q: usize) {
        if !self.nodes[i].up || self.is_member_now(i, q) {
            return;
        }
        let Some(id) = self.queues[q].clone() else {
            return;
        };
        if self.nodes[i].joins.values().any(|j| *j == q) {
            return;
        }
        let cmd = self.command_id(i);
        self.nodes[i].joins.insert(cmd, q);
        let t = self.time(i);
        // With its invite; a node the creator did not invite (it made the queue, or it is
        // back after a restart that lost what it had) asks by id, which its members answer.
        let command = match self.invites.get(&(i, q)) {
            Some(token) => Command::JoinInvite {
                token: token.clone(),
            },
            None => Command::JoinQueue {
                id,
                from_peers: true,
            },
        };
        self.nodes[i].core.handle_command(t, cmd, command);
        self.drive(i);
    }

    pub(super) fn submit(&mut self) {
        // A batch may have taken this event's task already.
        if self.to_submit == 0 {
            return;
        }
        let q = self.rng.random_range(0..self.members.len());
        let Some(queue) = self.queues[q].clone() else {
            return;
        };
        let Some(i) = self.member_with_view(q) else {
            // Nobody can take it now: the client tries again a little later.
            self.schedule_at(self.now_us + RETRY_US, Ev::Submit);
            return;
        };
        // One submit in four is a batch of up to 5 tasks (those other tasks' events find
        // nothing left to submit).
        let n = if self.to_submit >= 2 && self.rng.random_range(0..4) == 0 {
            self.rng.random_range(2..=self.to_submit.min(5))
        } else {
            1
        };
        self.to_submit -= n;
        let cmd = self.command_id(i);
        self.nodes[i].submits.insert(cmd, (queue.clone(), n));
        let mut tasks: Vec<SubmitTask> = (0..n)
            .map(|k| SubmitTask {
                kind: "sim".into(),
                // Every third task's input is too large to be inline: it gets a task document.
                input: if (self.submitted.len() + k) % 3 == 2 {
                    serde_json::json!({"n": self.submitted.len() + k, "pad": "x".repeat(300)})
                } else {
                    serde_json::json!({"n": self.submitted.len() + k})
                },
                priority: self.rng.random_range(-2..=2),
                urgent: false,
                max_attempts: None,
                tags: Vec::new(),
                depends_on: Vec::new(),
                delay_ms: None,
                not_before: None,
                dedup_key: None,
                idempotency_key: None,
                requires: Vec::new(),
                timeout_ms: None,
            })
            .collect();
        self.draw_rules(i, &queue, cmd, &mut tasks);
        for t in &mut tasks {
            t.timeout_ms = self.draw_timeout();
        }
        self.trace(|| format!("node{i} takes {n} task(s) for {queue}"));
        let t = self.time(i);
        let command = if n == 1 {
            Command::Submit {
                queue,
                task: tasks.pop().expect("one task"),
            }
        } else {
            Command::SubmitMany { queue, tasks }
        };
        self.nodes[i].core.handle_command(t, cmd, command);
        self.drive(i);
    }

    /// A submit was answered with `task`: one it made (invariant 8 then checks the node's
    /// disk), or, `deduplicated`, an existing task that held its dedup key (made elsewhere,
    /// perhaps: nothing of this submit is on the disk but the bump).
    pub(super) fn acknowledged(
        &mut self,
        i: usize,
        queue: &QueueId,
        task: TaskId,
        deduplicated: bool,
    ) {
        self.trace(|| format!("node{i} acknowledged task {task}"));
        if !deduplicated {
            self.an_acknowledged_submit_is_on_disk(i, queue, &task);
        }
        self.submitted.insert(task, queue.clone());
    }

    /// `n` tasks were not taken: the client submits them again a little later.
    pub(super) fn submit_refused(&mut self, i: usize, n: usize, error: &str) {
        self.count("submit_refused");
        self.trace(|| format!("node{i} refused {n} submit(s): {error}"));
        self.to_submit += n;
        for _ in 0..n {
            self.schedule_at(self.now_us + RETRY_US, Ev::Submit);
        }
    }
}
