//! Members change the queue's settings at run time (the `settings` mix): a random member that
//! has joined pauses a queue, and a random member (often another) resumes it a little later; or
//! it changes the concurrency limit, the rate interval and the order. The writes go through
//! the node's core as a user's would (`Command::SetPaused`, `Command::SetConfig`), into
//! whichever document of the queue that node is on, across partitions, crashes and rotations.
//! Invariant 6 then checks the loosest limits any member wrote (the world's `qconfig`).
//!
//! A pause and a resume written on two sides of a partition may merge to paused (Automerge's
//! pick between concurrent writes of one register). Once the faults stop, a member whose view
//! shows a queue paused resumes it at each settle check, so every task can finish; the final
//! check then wants every member's view to hold the same settings (invariant 11).
//!
//! It asks the parent for the event queue, the clock, randomness, `count`, `trace` and
//! `command_id`; the shell for `drive`.

use piecework_core::Command;
use piecework_queue_doc::{ConfigPatch, Order};
use rand::Rng;

use super::{Ev, World};

impl World {
    /// A member changes a setting of a random queue.
    pub(super) fn change_setting(&mut self) {
        let q = self.rng.random_range(0..self.members.len());
        let Some(queue) = self.queues[q].clone() else {
            return;
        };
        let Some(i) = self.member_with_view(q) else {
            return;
        };
        if self.rng.random_bool(0.5) {
            self.count("setting_pause");
            self.trace(|| format!("node{i} pauses {queue}"));
            self.send(
                i,
                Command::SetPaused {
                    queue,
                    paused: true,
                },
            );
            let (lo, hi) = self.config.mix.pause_ms;
            let ms = self.rng.random_range(lo..=hi.max(lo));
            self.schedule_at(self.now_us + ms * 1000, Ev::Resume { queue: q });
        } else {
            let concurrency = [2, 5][self.rng.random_range(0..2)];
            let rate = self.rng.random_bool(0.3).then_some(50);
            let patch = ConfigPatch {
                concurrency: Some(concurrency),
                rate_interval_ms: rate,
                order: Some(if self.rng.random_bool(0.5) {
                    Order::Fifo
                } else {
                    Order::Lifo
                }),
                ..ConfigPatch::default()
            };
            // Invariant 6 checks the loosest limits any member wrote: a router may hold any of
            // them (0 means no limit).
            let q = &mut self.qconfig;
            if q.concurrency != 0 {
                q.concurrency = q.concurrency.max(concurrency);
            }
            if let Some(r) = rate {
                q.rate_interval_ms = q.rate_interval_ms.min(r);
            }
            self.count("setting_config");
            self.trace(|| format!("node{i} sets {patch:?} on {queue}"));
            self.send(i, Command::SetConfig { queue, patch });
        }
    }

    /// A member (any that has joined and is up) resumes queue `q`.
    pub(super) fn resume(&mut self, q: usize) {
        let Some(queue) = self.queues[q].clone() else {
            return;
        };
        let Some(i) = self.member_with_view(q) else {
            // Nobody can now: try again a little later.
            self.schedule_at(self.now_us + 500_000, Ev::Resume { queue: q });
            return;
        };
        self.count("setting_resume");
        self.trace(|| format!("node{i} resumes {queue}"));
        self.send(
            i,
            Command::SetPaused {
                queue,
                paused: false,
            },
        );
    }

    /// Once the faults stopped: each member whose view shows a queue paused resumes it (its
    /// write follows the pause it sees, so it outranks it).
    pub(super) fn resume_where_paused(&mut self) {
        if self.faults_on {
            return;
        }
        for q in 0..self.members.len() {
            let Some(queue) = self.queues[q].clone() else {
                continue;
            };
            for i in 0..self.nodes.len() {
                let paused =
                    self.nodes[i].up && self.nodes[i].core.view(&queue).is_some_and(|v| v.paused);
                if paused {
                    self.count("setting_resume_after_heal");
                    self.trace(|| format!("node{i} resumes {queue}, which it sees paused"));
                    self.send(
                        i,
                        Command::SetPaused {
                            queue: queue.clone(),
                            paused: false,
                        },
                    );
                }
            }
        }
    }

    /// A random member of queue `q` that is up and has its view (the clients submit through
    /// one too).
    pub(super) fn member_with_view(&mut self, q: usize) -> Option<usize> {
        let queue = self.queues[q].clone()?;
        let candidates: Vec<usize> = self.members[q]
            .iter()
            .copied()
            .filter(|&i| self.nodes[i].up && self.nodes[i].core.view(&queue).is_some())
            .collect();
        if candidates.is_empty() {
            return None;
        }
        Some(candidates[self.rng.random_range(0..candidates.len())])
    }

    pub(super) fn send(&mut self, i: usize, command: Command) {
        let cmd = self.command_id(i);
        let t = self.time(i);
        self.nodes[i].core.handle_command(t, cmd, command);
        self.drive(i);
    }
}
