//! A schedule in the scheduling workload (the `scheduling` mix): node 0 writes one interval
//! schedule on queue 0 as it creates it, and whichever router is active fires its slots across
//! crashes, partitions, takeovers and rotations.
//!
//! It keeps the truth the checks judge from: every task any view showed with a slot's dedup
//! key (`schedule/<name>/<slot>`), whether a view showed it started and whether one showed it
//! cancelled as a dedup copy. Invariant 17: a slot's task is submitted no earlier than its slot
//! (by the firing router's clock: the entry's submit time); once settled, no slot has two
//! surviving tasks unless both started (a partition's two sides fired it; counted), and
//! between the first and last slot fired, every slot not fired is counted missed in the
//! schedule's slot record (none is skipped silently: a takeover fires the slot late instead).
//!
//! It asks the parent for `count`, `trace`, `violate` and the nodes' views; the shell calls
//! [`World::watch_schedule_tasks`] on every view, the final checks
//! [`World::no_slot_is_skipped_or_fired_twice`].

use std::collections::BTreeMap;

use piecework_core::Command;
use piecework_core::api::{PutSchedule, SubmitTask};
use piecework_queue_doc::{QueueView, TaskId};

use super::World;

/// The schedule's name.
const NAME: &str = "tick";
/// Its interval: longer than a takeover (takeover_after + settle + one pool heartbeat), so
/// a takeover fires a slot late rather than skipping it.
pub(super) const EVERY_MS: u64 = 4_000;

/// What views showed of one slot's task.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SlotTask {
    started: bool,
    duplicate: bool,
}

/// The workload's records: by queue name and schedule name, by slot, each task.
pub(super) type Fired = BTreeMap<(String, String), BTreeMap<u64, BTreeMap<TaskId, SlotTask>>>;

impl World {
    /// Node `i` (the creator of queue 0) writes the schedule (in the `scheduling` mix).
    pub(super) fn write_schedule(&mut self, i: usize) {
        if self.config.mix.scheduling <= 0.0 {
            return;
        }
        let Some(queue) = self.queues[0].clone() else {
            return;
        };
        self.count("schedule_written");
        self.send(
            i,
            Command::PutSchedule {
                queue,
                name: NAME.to_owned(),
                schedule: Box::new(PutSchedule {
                    every_ms: Some(EVERY_MS),
                    cron: None,
                    task: SubmitTask::new("sim", serde_json::json!({ "ms": 20 })),
                    paused: false,
                }),
            },
        );
    }

    /// Records the slot tasks of a view, and checks that none was submitted before its slot.
    pub(super) fn watch_schedule_tasks(&mut self, i: usize, view: &QueueView) {
        if self.config.mix.scheduling <= 0.0 || view.schedules.is_empty() && self.fired.is_empty() {
            return;
        }
        let mut early = Vec::new();
        for t in view.tasks().values() {
            let Some(key) = t.rules.dedup_key.as_deref() else {
                continue;
            };
            let Some((name, slot)) = key
                .strip_prefix("schedule/")
                .and_then(|rest| rest.rsplit_once('/'))
                .and_then(|(n, s)| Some((n, s.parse::<u64>().ok()?)))
            else {
                continue;
            };
            let slots = self
                .fired
                .entry((view.name.clone(), name.to_owned()))
                .or_default();
            let fresh = !slots.get(&slot).is_some_and(|s| s.contains_key(&t.id));
            let rec = slots
                .entry(slot)
                .or_default()
                .entry(t.id.clone())
                .or_default();
            rec.started |= t.ever_started();
            rec.duplicate |= t.duplicate_of.is_some();
            if fresh {
                if t.submitted_at < slot {
                    early.push(format!(
                        "node{i}'s view has {} for slot {slot} of {name}, submitted at {}",
                        t.id, t.submitted_at
                    ));
                }
                if t.submitted_at >= slot.saturating_add(1_000) {
                    self.count("schedule_slot_fired_late");
                }
            }
        }
        for e in early {
            self.violate(17, e);
        }
    }

    /// Invariant 17, once settled: no slot has two surviving tasks unless both started, and
    /// every slot between the first and the last fired was fired or counted missed.
    pub(super) fn no_slot_is_skipped_or_fired_twice(&mut self) {
        let fired = std::mem::take(&mut self.fired);
        for ((queue, name), slots) in &fired {
            let mut twice = 0;
            for (slot, tasks) in slots {
                let survivors: Vec<(&TaskId, &SlotTask)> =
                    tasks.iter().filter(|(_, s)| !s.duplicate).collect();
                if survivors.len() > 1 {
                    if survivors.iter().all(|(_, s)| s.started) {
                        twice += 1;
                    } else {
                        self.violate(
                            17,
                            format!(
                                "slot {slot} of {queue}/{name} has {} surviving tasks, not all started: {survivors:?}",
                                survivors.len()
                            ),
                        );
                    }
                }
            }
            let (Some(first), Some(last)) = (slots.keys().next(), slots.keys().last()) else {
                continue;
            };
            let grid = (last - first) / EVERY_MS + 1;
            let not_fired = grid.saturating_sub(slots.len() as u64);
            let missed = self
                .nodes
                .iter()
                .filter(|n| n.up)
                .filter_map(|n| {
                    let id = n
                        .core
                        .queues()
                        .find(|q| n.core.view(q).is_some_and(|v| v.name == *queue))?;
                    Some(n.core.view(id)?.schedules.get(name)?.slot.m)
                })
                .max()
                .unwrap_or(0);
            for _ in 0..slots.len() {
                self.count("schedule_slot_fired");
            }
            for _ in 0..missed {
                self.count("schedule_slot_missed");
            }
            for _ in 0..twice {
                self.count("schedule_slot_ran_twice");
            }
            if not_fired > missed {
                self.violate(
                    17,
                    format!(
                        "{queue}/{name}: {not_fired} of the {grid} slots from {first} to {last} were not fired, but only {missed} counted missed"
                    ),
                );
            }
        }
        self.fired = fired;
    }
}
