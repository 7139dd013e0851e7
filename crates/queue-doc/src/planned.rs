//! What a run leaves for later besides its result: follow-up tasks, committed with its success,
//! undo tasks, recorded with it and submitted by an `undo`, and the progress it reported.
//!
//! The ids of those tasks are derived from (task, index) ([`follow_up_id`], [`undo_id`]), so
//! that two successful runs of one task, or two `undo`s on either side of a partition, make
//! each task once: the second write of an id finds it (or merges with it).

use serde::{Deserialize, Serialize};

use crate::entry::Rules;
use crate::ids::{PeerId, TaskId};
use crate::queue::Submission;

/// The most follow-up tasks one run may submit, and the most undo tasks it may record.
pub const MAX_PLANNED: usize = 32;
/// The largest input of a follow-up or undo task, as JSON text. Such a task lives in its
/// queue document alone (it is written with the success, in the same change), whatever its
/// size up to this.
pub const MAX_PLANNED_INPUT_BYTES: usize = 8 * 1024;
/// The most bytes one run's follow-up and undo tasks take together (their inputs, kinds,
/// tags and resources): what one success adds to the queue document every member syncs.
pub const MAX_PLANNED_TOTAL_BYTES: usize = 64 * 1024;

/// A task a run asks for: a follow-up, submitted with its success, or an undo task, recorded
/// with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedTask {
    /// The handler kind.
    #[serde(rename = "k")]
    pub kind: String,
    /// The input, as JSON text.
    #[serde(rename = "i")]
    pub input: String,
    /// Relative priority.
    #[serde(rename = "p", default, skip_serializing_if = "is_zero_i64")]
    pub priority: i64,
    /// Urgent.
    #[serde(rename = "u", default, skip_serializing_if = "std::ops::Not::not")]
    pub urgent: bool,
    /// Failed attempts before it is dead-lettered; the queue's default if `None`.
    #[serde(rename = "m", default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Tags, delay, resources and timeout (dependencies and keys are not kept:
    /// [`PlannedTask::normalized`]).
    #[serde(rename = "r", default, skip_serializing_if = "Rules::is_empty")]
    pub rules: Rules,
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// Why a run cannot plan a task.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The kind is empty.
    #[error("a follow-up or undo task needs a kind")]
    EmptyKind,
    /// The input is over [`MAX_PLANNED_INPUT_BYTES`].
    #[error(
        "the input of a follow-up or undo task is {0} bytes of JSON, the limit is {MAX_PLANNED_INPUT_BYTES}"
    )]
    InputTooLarge(usize),
    /// The run planned [`MAX_PLANNED`] tasks of this sort already, or
    /// [`MAX_PLANNED_TOTAL_BYTES`] in all.
    #[error(
        "a run submits at most {MAX_PLANNED} follow-up tasks and records at most {MAX_PLANNED} undo tasks, {MAX_PLANNED_TOTAL_BYTES} bytes in all"
    )]
    TooMany,
    /// A tag or resource is not 1 to 64 letters, digits, `_`, `-`, `.` or `:`, or there are
    /// too many.
    #[error(
        "invalid tag or resource {0:?}: 1 to {max} ASCII letters, digits, '_', '-', '.' or ':', at most {tags} of each",
        max = crate::entry::MAX_TAG_LEN,
        tags = crate::entry::MAX_TAGS
    )]
    BadTag(String),
}

impl PlannedTask {
    /// A task of `kind` with `input` (JSON text) and no rules.
    pub fn new(kind: impl Into<String>, input: impl Into<String>) -> Self {
        PlannedTask {
            kind: kind.into(),
            input: input.into(),
            priority: 0,
            urgent: false,
            max_attempts: None,
            rules: Rules::default(),
        }
    }

    /// Checks what a handler controls: a kind, an input within
    /// [`MAX_PLANNED_INPUT_BYTES`], valid tags and resources (at most
    /// [`MAX_TAGS`](crate::entry::MAX_TAGS) of each).
    pub fn check(&self) -> Result<(), PlanError> {
        if self.kind.is_empty() {
            return Err(PlanError::EmptyKind);
        }
        if self.input.len() > MAX_PLANNED_INPUT_BYTES {
            return Err(PlanError::InputTooLarge(self.input.len()));
        }
        for names in [&self.rules.tags, &self.rules.requires] {
            if let Some(t) = names.iter().find(|t| !crate::entry::valid_tag(t)) {
                return Err(PlanError::BadTag(t.clone()));
            }
            if names.len() > crate::entry::MAX_TAGS {
                return Err(PlanError::BadTag(names[crate::entry::MAX_TAGS].clone()));
            }
        }
        Ok(())
    }

    /// About how many bytes it adds to the queue document (see
    /// [`MAX_PLANNED_TOTAL_BYTES`]).
    pub fn bytes(&self) -> usize {
        let names: usize = self
            .rules
            .tags
            .iter()
            .chain(&self.rules.requires)
            .map(|t| t.len() + 3)
            .sum();
        64 + self.kind.len() + self.input.len() + names
    }

    /// The tasks of `planned` a run may keep: valid ones ([`PlannedTask::check`]), at most
    /// [`MAX_PLANNED`], within `budget` bytes (taken from it), in order; the rest are left
    /// out, each with its reason.
    pub fn within_limits(
        planned: Vec<PlannedTask>,
        budget: &mut usize,
    ) -> (Vec<PlannedTask>, Vec<PlanError>) {
        let mut kept = Vec::new();
        let mut refused = Vec::new();
        for p in planned {
            let p = p.normalized();
            if let Err(e) = p.check() {
                refused.push(e);
            } else if kept.len() >= MAX_PLANNED || p.bytes() > *budget {
                refused.push(PlanError::TooMany);
            } else {
                *budget -= p.bytes();
                kept.push(p);
            }
        }
        (kept, refused)
    }

    /// The task as it is kept: the rules a planned task may carry (tags, delay, resources,
    /// timeout; no dependencies, dedup or idempotency keys, no parent links).
    pub fn normalized(mut self) -> Self {
        let r = std::mem::take(&mut self.rules);
        self.rules = Rules {
            tags: r.tags,
            not_before: r.not_before,
            requires: r.requires,
            timeout_ms: r.timeout_ms,
            ..Rules::default()
        };
        self
    }

    /// The submission of this task under `id`, made by `submitter` at `now_ms`, with `link`
    /// setting its parent link (`follows` or `undoes`) in its rules.
    pub fn submission(
        &self,
        id: TaskId,
        submitter: PeerId,
        now_ms: u64,
        link: impl FnOnce(&mut Rules),
    ) -> Submission {
        let mut rules = self.clone().normalized().rules;
        link(&mut rules);
        Submission {
            id,
            kind: self.kind.clone(),
            submitter,
            submitted_at: now_ms,
            priority: self.priority,
            urgent: self.urgent,
            max_attempts: self.max_attempts,
            input: Some(self.input.clone()),
            rules,
        }
    }
}

/// What a run planned besides its result: follow-ups, undo tasks, its last progress.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Planned {
    /// Follow-up tasks, submitted with the run's success (`Context::submit`).
    pub follow_ups: Vec<PlannedTask>,
    /// Tasks that undo the run's success (`Context::undo`).
    pub undo: Vec<PlannedTask>,
    /// The progress it last reported (`Context::progress`).
    pub progress: Option<Progress>,
}

/// The id of the `index`-th follow-up task of `task` (from 0).
pub fn follow_up_id(task: &TaskId, index: usize) -> TaskId {
    derived(b"piecework follow-up", task, index)
}

/// The id of the `index`-th undo task of `task` (from 0).
pub fn undo_id(task: &TaskId, index: usize) -> TaskId {
    derived(b"piecework undo", task, index)
}

fn derived(what: &[u8], task: &TaskId, index: usize) -> TaskId {
    let id = piecework_replica::DocId::derived(&[
        what,
        task.as_str().as_bytes(),
        &(index as u64).to_le_bytes(),
    ]);
    TaskId::new(id.as_str())
}

/// How far a run is, as its handler reported it: a fraction, or done of total.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Progress {
    /// A fraction in millionths (0 to 1,000,000).
    Fraction(u32),
    /// Done of total.
    Count {
        /// Done.
        done: u64,
        /// Total.
        total: u64,
    },
}

impl Progress {
    /// A fraction, clamped to `[0, 1]` (not a number reads as 0).
    pub fn fraction(f: f64) -> Progress {
        let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
        Progress::Fraction((f * 1_000_000.0).round() as u32)
    }

    /// Done of total (done is clamped to total).
    pub fn count(done: u64, total: u64) -> Progress {
        Progress::Count {
            done: done.min(total),
            total,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct ProgressWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    done: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
}

impl Serialize for Progress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = match *self {
            Progress::Fraction(m) => ProgressWire {
                fraction: Some(f64::from(m.min(1_000_000)) / 1_000_000.0),
                done: None,
                total: None,
            },
            Progress::Count { done, total } => ProgressWire {
                fraction: None,
                done: Some(done),
                total: Some(total),
            },
        };
        w.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Progress {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = ProgressWire::deserialize(d)?;
        match (w.fraction, w.done, w.total) {
            (Some(f), None, None) => Ok(Progress::fraction(f)),
            (None, Some(done), Some(total)) => Ok(Progress::count(done, total)),
            _ => Err(serde::de::Error::custom(
                "progress is {\"fraction\": f} or {\"done\": n, \"total\": n}",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_task_ids_that_differ_by_task_index_and_sort() {
        let t = TaskId::new("automerge:2Xc7");
        let a = follow_up_id(&t, 0);
        assert_eq!(a, follow_up_id(&t, 0));
        assert_ne!(a, follow_up_id(&t, 1));
        assert_ne!(a, undo_id(&t, 0));
        assert_ne!(a, follow_up_id(&TaskId::new("automerge:2Xc8"), 0));
        assert!(piecework_replica::DocId::parse(a.as_str()).is_some());
    }

    #[test]
    fn progress_reads_both_forms_and_clamps() {
        let p: Progress = serde_json::from_str(r#"{"fraction": 1.5}"#).unwrap();
        assert_eq!(p, Progress::Fraction(1_000_000));
        let p: Progress = serde_json::from_str(r#"{"done": 7, "total": 5}"#).unwrap();
        assert_eq!(p, Progress::Count { done: 5, total: 5 });
        assert!(serde_json::from_str::<Progress>(r#"{"fraction": 0.5, "done": 1}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Progress::fraction(0.25)).unwrap(),
            r#"{"fraction":0.25}"#
        );
    }

    #[test]
    fn planned_tasks_keep_only_the_rules_they_may_carry() {
        let mut p = PlannedTask::new("k", "{}");
        p.rules.depends_on = vec![TaskId::new("automerge:x")];
        p.rules.tags = vec!["a".into()];
        p.rules.dedup_key = Some("d".into());
        let s = p.submission(TaskId::new("automerge:y"), PeerId::new("p"), 5, |r| {
            r.follows = Some(TaskId::new("automerge:z"))
        });
        assert!(s.rules.depends_on.is_empty());
        assert_eq!(s.rules.dedup_key, None);
        assert_eq!(s.rules.tags, vec!["a".to_owned()]);
        assert_eq!(s.rules.follows, Some(TaskId::new("automerge:z")));
        assert_eq!(
            PlannedTask::new("k", "x".repeat(MAX_PLANNED_INPUT_BYTES + 1)).check(),
            Err(PlanError::InputTooLarge(MAX_PLANNED_INPUT_BYTES + 1))
        );
        let mut bad = PlannedTask::new("k", "{}");
        bad.rules.requires = vec!["no spaces".into()];
        assert_eq!(bad.check(), Err(PlanError::BadTag("no spaces".into())));
    }

    #[test]
    fn a_runs_planned_tasks_are_kept_within_its_limits_in_order() {
        let big = "x".repeat(MAX_PLANNED_INPUT_BYTES);
        let mut bad = PlannedTask::new("k", "{}");
        bad.rules.tags = vec!["a b".into()];
        let mut planned = vec![bad];
        planned.extend((0..12).map(|i| PlannedTask::new(format!("k{i}"), big.clone())));
        let mut budget = MAX_PLANNED_TOTAL_BYTES;
        let (kept, refused) = PlannedTask::within_limits(planned, &mut budget);
        // 64 KiB hold 7 inputs of 8 KiB with their overhead.
        assert_eq!(kept.len(), 7);
        assert_eq!(kept[0].kind, "k0");
        assert_eq!(refused[0], PlanError::BadTag("a b".into()));
        assert!(refused[1..].iter().all(|e| *e == PlanError::TooMany));
        assert!(budget < MAX_PLANNED_INPUT_BYTES);
    }
}
