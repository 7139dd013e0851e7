//! Named schedules: recurring tasks a queue's active router submits, one per due slot.
//!
//! A schedule is two flat registers in the queue's `config` map (which exists from the
//! queue's first change), each one packed scalar:
//!
//! - `schedule/<name>`: the [`ScheduleRecord`] (when it runs, the task template, paused,
//!   deleted) and the time of its write. Among concurrent values, and when carried into a
//!   successor epoch, the greatest `(time, packed text)` wins.
//! - `slot/<name>`: the [`SlotRecord`], the last slot fired (or passed over) and how many slots
//!   were missed in all. Among concurrent values, and when carried, the greatest `(slot,
//!   missed)` wins: a successor router fires only slots after it.
//!
//! A slot is a wall-clock time (unix ms, UTC): for `every_ms`, each multiple of the interval;
//! for a cron expression, each time it matches. [`Schedule::due`] says which slot the active
//! router fires at a given wall time: the first slot after the last one, if that is due and
//! the next one is not; if more than one is due (nobody fired them: every member was down or
//! paused in routing), only the latest, and the others count as missed.

use std::collections::BTreeMap;
use std::str::FromStr;

use automerge::transaction::{Transactable, Transaction};
use automerge::{Automerge, ObjType, ROOT, ReadDoc, ScalarValue};
use serde::{Deserialize, Serialize};

use crate::judge::{Judge, Right};
use crate::queue::WriteError;
use crate::{am, keys, packed};

/// The most schedules a queue holds; readers keep the first this many by name.
pub const MAX_SCHEDULES: usize = 64;
/// The shortest interval of an `every_ms` schedule.
pub const MIN_EVERY_MS: u64 = 100;
/// The longest interval of an `every_ms` schedule (a year).
pub const MAX_EVERY_MS: u64 = 366 * 24 * 3600 * 1000;
/// The largest task template, in bytes of JSON.
pub const MAX_TEMPLATE: usize = 64 * 1024;
/// Counting missed slots of a cron schedule stops at this many (the count saturates).
const MAX_COUNTED: u64 = 100_000;

/// Keys of each kind (schedule, slot) a read looks at, at most.
const MAX_READ_KEYS: usize = 16 * MAX_SCHEDULES;

const SCHEDULE: &str = "schedule/";
const SLOT: &str = "slot/";

/// When a schedule fires.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Every {
    /// At every multiple of this many ms since the unix epoch.
    Ms(u64),
    /// At every time this cron expression (5 fields, or 6 with seconds first) matches, in UTC.
    Cron(String),
}

impl Every {
    /// Checks the interval's range or parses the cron expression.
    pub fn check(&self) -> Result<(), ScheduleError> {
        match self {
            Every::Ms(ms) if !(MIN_EVERY_MS..=MAX_EVERY_MS).contains(ms) => {
                Err(ScheduleError::BadInterval(*ms))
            }
            Every::Ms(_) => Ok(()),
            Every::Cron(expr) => parse_cron(expr).map(|_| ()),
        }
    }

    /// The first slot strictly after `t_ms`; `None` if there is none (a cron expression that
    /// never matches again, or an unparsable one).
    pub fn next_after(&self, t_ms: u64) -> Option<u64> {
        match self {
            Every::Ms(0) => None,
            Every::Ms(e) => (t_ms / e).checked_add(1)?.checked_mul(*e),
            Every::Cron(expr) => {
                let cron = parse_cron(expr).ok()?;
                let at = utc(t_ms)?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                u64::try_from(next.timestamp_millis()).ok()
            }
        }
    }

    /// The last slot at or before `t_ms`, if any.
    pub fn latest_at(&self, t_ms: u64) -> Option<u64> {
        match self {
            Every::Ms(0) => None,
            Every::Ms(e) => Some(t_ms / e * e),
            Every::Cron(expr) => {
                let cron = parse_cron(expr).ok()?;
                let at = utc(t_ms)?;
                let prev = cron.find_previous_occurrence(&at, true).ok()?;
                u64::try_from(prev.timestamp_millis()).ok()
            }
        }
    }

    /// How many slots lie strictly between `a` and `b` (saturating for cron schedules).
    fn between(&self, a: u64, b: u64) -> u64 {
        if b <= a {
            return 0;
        }
        match self {
            Every::Ms(0) => 0,
            Every::Ms(e) => (b - 1) / e - a / e,
            Every::Cron(_) => {
                let mut n = 0;
                let mut t = a;
                while let Some(next) = self.next_after(t) {
                    if next >= b || n >= MAX_COUNTED {
                        break;
                    }
                    n += 1;
                    t = next;
                }
                n
            }
        }
    }
}

fn utc(t_ms: u64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp_millis(i64::try_from(t_ms).ok()?)
}

/// Parses a cron expression: 5 fields (minute first), or 6 with seconds first; evaluated in
/// UTC.
pub fn parse_cron(expr: &str) -> Result<croner::Cron, ScheduleError> {
    if expr.len() > 256 {
        return Err(ScheduleError::BadCron(
            expr.chars().take(64).collect(),
            "longer than 256 bytes".into(),
        ));
    }
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .build()
        .parse(expr)
        .or_else(|_| croner::Cron::from_str(expr))
        .map_err(|e| ScheduleError::BadCron(expr.to_owned(), e.to_string()))
}

/// A schedule as written: see the module docs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    /// The time of the write (unix ms, the writer's clock; just after the one it replaced if
    /// that is later).
    pub t: u64,
    /// When it fires.
    pub e: Every,
    /// The task template: a submit body, as JSON text (the node checks it).
    pub k: String,
    /// Paused: its slots pass without firing (and without counting as missed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub p: bool,
    /// Deleted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub d: bool,
}

/// A schedule's last slot and its missed slots: see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotRecord {
    /// The last slot fired or passed over (unix ms).
    pub s: u64,
    /// Slots missed in all (more than one interval late: nobody fired them).
    #[serde(default)]
    pub m: u64,
    /// The last slot fired (0: none yet); a write of the schedule keeps it.
    #[serde(default)]
    pub l: u64,
}

/// A schedule as a view reads it: its record and its slot record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// When it fires.
    pub every: Every,
    /// The task template (a submit body, as JSON text).
    pub template: String,
    /// Paused.
    pub paused: bool,
    /// When it was last written (unix ms).
    pub updated_at: u64,
    /// The last slot fired or passed over, and the missed count.
    pub slot: SlotRecord,
}

/// A slot to fire: see [`Schedule::due`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firing {
    /// The schedule's name.
    pub schedule: String,
    /// The slot (unix ms): the task's dedup key is `schedule/<name>/<slot>`.
    pub slot: u64,
    /// The schedule's missed count once this slot is fired.
    pub missed: u64,
}

impl Firing {
    /// The slot record once this firing is written.
    pub fn record(&self) -> SlotRecord {
        SlotRecord {
            s: self.slot,
            m: self.missed,
            l: self.slot,
        }
    }

    /// The dedup key of the task fired for this slot.
    pub fn dedup_key(&self) -> String {
        format!("schedule/{}/{}", self.schedule, self.slot)
    }
}

impl Schedule {
    /// The slot to fire at wall time `now_ms`, if one is due: the first after the last slot
    /// if the one after that is not due yet; else the latest due slot, counting the earlier
    /// ones as missed. `None` while paused.
    pub fn due(&self, name: &str, now_ms: u64) -> Option<Firing> {
        if self.paused {
            return None;
        }
        let first = self.every.next_after(self.slot.s)?;
        if first > now_ms {
            return None;
        }
        let latest = self.every.latest_at(now_ms).unwrap_or(first).max(first);
        let missed = match latest > first {
            true => self.every.between(self.slot.s, latest),
            false => 0,
        };
        Some(Firing {
            schedule: name.to_owned(),
            slot: latest,
            missed: self.slot.m.saturating_add(missed),
        })
    }

    /// When the next slot falls due (unix ms); `None` while paused.
    pub fn next_fire_at(&self) -> Option<u64> {
        match self.paused {
            true => None,
            false => self.every.next_after(self.slot.s),
        }
    }
}

/// Why a schedule was not written.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// Not a name a schedule may have.
    #[error(
        "invalid schedule name {0:?}: names are 1 to 64 ASCII letters, digits, '_', '-', '.' or ':'"
    )]
    BadName(String),
    /// `every_ms` out of range.
    #[error("every_ms {0} is outside [{MIN_EVERY_MS}, {MAX_EVERY_MS}]")]
    BadInterval(u64),
    /// A cron expression that does not parse.
    #[error("invalid cron expression {0:?}: {1}")]
    BadCron(String, String),
    /// The template is too large.
    #[error("the task template is {0} bytes; at most {MAX_TEMPLATE}")]
    TooLarge(usize),
    /// The queue holds [`MAX_SCHEDULES`] schedules already.
    #[error("the queue holds {MAX_SCHEDULES} schedules already")]
    TooMany,
    /// No schedule has that name.
    #[error("no schedule named {0:?}")]
    Unknown(String),
    /// The document could not take the change.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Writes schedule `name` (a new one, or a new version of it), as of `now_ms`. Its slot
/// record moves up to `now_ms` (or stays if it is later), so it fires only slots after the
/// write: resuming a paused schedule does not fire the slots it passed.
pub fn put_schedule(
    doc: &mut Automerge,
    name: &str,
    every: Every,
    template: String,
    paused: bool,
    now_ms: u64,
) -> Result<(), ScheduleError> {
    if !crate::entry::valid_tag(name) {
        return Err(ScheduleError::BadName(name.to_owned()));
    }
    every.check()?;
    if template.len() > MAX_TEMPLATE {
        return Err(ScheduleError::TooLarge(template.len()));
    }
    let schedules = read_schedules(doc, &Judge::open());
    if !schedules.contains_key(name) && schedules.len() >= MAX_SCHEDULES {
        return Err(ScheduleError::TooMany);
    }
    write(doc, name, now_ms, |t| ScheduleRecord {
        t,
        e: every,
        k: template,
        p: paused,
        d: false,
    })
}

/// Deletes schedule `name`, as of `now_ms`.
pub fn delete_schedule(doc: &mut Automerge, name: &str, now_ms: u64) -> Result<(), ScheduleError> {
    let Some(current) = read_schedules(doc, &Judge::open()).remove(name) else {
        return Err(ScheduleError::Unknown(name.to_owned()));
    };
    write(doc, name, now_ms, |t| ScheduleRecord {
        t,
        e: current.every,
        k: String::new(),
        p: false,
        d: true,
    })
}

fn write(
    doc: &mut Automerge,
    name: &str,
    now_ms: u64,
    record: impl FnOnce(u64) -> ScheduleRecord,
) -> Result<(), ScheduleError> {
    let regs = read_registers(doc, &Judge::open());
    let t = now_ms.max(
        regs.schedules
            .get(name)
            .map_or(0, |(r, _)| r.t.saturating_add(1)),
    );
    let slot = regs.slots.get(name).copied().unwrap_or_default();
    let slot = SlotRecord {
        s: slot.s.max(now_ms),
        ..slot
    };
    let rec = record(t);
    doc.transact(|tx| {
        if am::string(tx, &ROOT, keys::SCHEMA).as_deref() != Some(keys::QUEUE_SCHEMA) {
            return Err(WriteError::NotAQueue);
        }
        let Some(obj) = am::object(tx, &ROOT, keys::CONFIG, ObjType::Map) else {
            return Err(WriteError::NotAQueue);
        };
        tx.put(&obj, format!("{SCHEDULE}{name}"), packed::encode(&rec))?;
        tx.put(&obj, format!("{SLOT}{name}"), packed::encode(&slot))?;
        Ok(())
    })
    .map(|_| ())
    .map_err(|f| ScheduleError::Write(f.error))
}

/// Writes the slot records of `firings` into `tx` (in the change that submits their tasks).
pub(crate) fn write_slots(
    tx: &mut Transaction<'_>,
    firings: &[Firing],
) -> Result<(), automerge::AutomergeError> {
    let Some(obj) = am::object(&*tx, &ROOT, keys::CONFIG, ObjType::Map) else {
        return Ok(());
    };
    for f in firings {
        let rec = f.record();
        tx.put(&obj, format!("{SLOT}{}", f.schedule), packed::encode(&rec))?;
    }
    Ok(())
}

/// Every schedule and slot register of a document, by name: among concurrent values of one,
/// the greatest. Unreadable values and invalid names are skipped; at most
/// [`MAX_SCHEDULES`] schedules (live or deleted) are kept, by name.
#[derive(Default)]
pub(crate) struct Registers {
    /// The schedule records, with their packed text (which breaks ties of time).
    schedules: BTreeMap<String, (ScheduleRecord, String)>,
    slots: BTreeMap<String, SlotRecord>,
}

fn read_registers<R: ReadDoc>(doc: &R, judge: &Judge<'_>) -> Registers {
    let mut regs = Registers::default();
    let Some(obj) = am::object(doc, &ROOT, keys::CONFIG, ObjType::Map) else {
        return regs;
    };
    for (prefix, end) in [(SCHEDULE, "schedule0"), (SLOT, "slot0")] {
        // Bounded: a hostile member that writes a flood of keys costs a read this much at
        // most (it can hide the schedules named after its keys, as it could rewrite them).
        let keys: Vec<String> = doc
            .map_range(&obj, prefix.to_owned()..end.to_owned())
            .take(MAX_READ_KEYS)
            .map(|item| item.key.to_string())
            .collect();
        for key in keys {
            let Some(name) = key
                .strip_prefix(prefix)
                .filter(|n| crate::entry::valid_tag(n))
            else {
                continue;
            };
            // A schedule is an admin's to write; its firing slot, the router's.
            let need = match prefix == SCHEDULE {
                true => Right::Admin,
                false => Right::Work,
            };
            let texts = doc
                .get_all(&obj, key.as_str())
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, id)| judge.allows(id, need))
                .filter_map(|(v, _)| match v {
                    automerge::Value::Scalar(s) => match s.as_ref() {
                        ScalarValue::Str(text) => Some(text.to_string()),
                        _ => None,
                    },
                    _ => None,
                });
            if prefix == SCHEDULE {
                if regs.schedules.len() >= MAX_SCHEDULES {
                    continue;
                }
                let best = texts
                    .filter_map(|text| {
                        let r = packed::decode::<ScheduleRecord>(&text)?;
                        Some((r, text))
                    })
                    .max_by(|(a, at), (b, bt)| (a.t, at).cmp(&(b.t, bt)));
                if let Some(best) = best {
                    regs.schedules.insert(name.to_owned(), best);
                }
            } else if let Some(best) = texts
                .filter_map(|text| packed::decode::<SlotRecord>(&text))
                .max()
            {
                regs.slots.insert(name.to_owned(), best);
            }
        }
    }
    regs
}

/// The live schedules of a document, by name (deleted ones and ones whose timing cannot be
/// read are left out).
pub(crate) fn read_schedules<R: ReadDoc>(doc: &R, judge: &Judge<'_>) -> BTreeMap<String, Schedule> {
    let regs = read_registers(doc, judge);
    regs.schedules
        .into_iter()
        .filter(|(_, (r, _))| !r.d && r.e.check().is_ok())
        .map(|(name, (r, _))| {
            let slot = regs.slots.get(&name).copied().unwrap_or_default();
            let s = Schedule {
                every: r.e,
                template: r.k,
                paused: r.p,
                updated_at: r.t,
                slot,
            };
            (name, s)
        })
        .collect()
}

/// Copies every schedule and slot register of `from` into a successor being built.
pub(crate) fn copy_schedules(
    from: &Automerge,
    tx: &mut Transaction<'_>,
) -> Result<(), automerge::AutomergeError> {
    carry_schedules(from, tx).map(|_| ())
}

/// Writes into `tx` (a successor of `from`) each schedule or slot register of `from` greater
/// than the successor's. Returns how many it wrote.
pub(crate) fn carry_schedules(
    from: &Automerge,
    tx: &mut Transaction<'_>,
) -> Result<usize, automerge::AutomergeError> {
    let theirs = read_registers(from, &Judge::open());
    if theirs.schedules.is_empty() && theirs.slots.is_empty() {
        return Ok(0);
    }
    let ours = read_registers(&*tx, &Judge::open());
    let Some(obj) = am::object(&*tx, &ROOT, keys::CONFIG, ObjType::Map) else {
        return Ok(0);
    };
    let mut n = 0;
    for (name, (rec, text)) in &theirs.schedules {
        let greater = ours
            .schedules
            .get(name)
            .is_none_or(|(o, ot)| (rec.t, text) > (o.t, ot));
        if greater {
            tx.put(&obj, format!("{SCHEDULE}{name}"), text.as_str())?;
            n += 1;
        }
    }
    for (name, slot) in &theirs.slots {
        if ours.slots.get(name).is_none_or(|o| slot > o) {
            tx.put(&obj, format!("{SLOT}{name}"), packed::encode(slot))?;
            n += 1;
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(ms: u64, s: u64, m: u64) -> Schedule {
        Schedule {
            every: Every::Ms(ms),
            template: String::new(),
            paused: false,
            updated_at: 0,
            slot: SlotRecord { s, m, l: 0 },
        }
    }

    #[test]
    fn an_interval_fires_each_slot_once_in_turn() {
        let s = every(1000, 5_500, 0);
        assert_eq!(s.due("a", 5_999), None);
        let f = s.due("a", 6_000).unwrap();
        assert_eq!((f.slot, f.missed), (6_000, 0));
        assert_eq!(s.due("a", 6_999).unwrap().slot, 6_000);
        assert_eq!(f.dedup_key(), "schedule/a/6000");
        assert_eq!(every(1000, 6_000, 0).due("a", 6_999), None);
        assert_eq!(every(1000, 6_000, 0).next_fire_at(), Some(7_000));
    }

    #[test]
    fn slots_more_than_one_interval_late_are_skipped_and_counted() {
        // Last fired 6000; at 9500 the slots 7000, 8000 and 9000 are due: 9000 fires.
        let f = every(1000, 6_000, 2).due("a", 9_500).unwrap();
        assert_eq!((f.slot, f.missed), (9_000, 4));
    }

    #[test]
    fn a_paused_schedule_fires_nothing() {
        let mut s = every(1000, 0, 0);
        s.paused = true;
        assert_eq!(s.due("a", 10_000), None);
        assert_eq!(s.next_fire_at(), None);
    }

    #[test]
    fn cron_slots_are_utc_matches() {
        // 2026-11-28T09:00:00Z.
        let nine = 1_795_856_400_000;
        let e = Every::Cron("*/15 * * * *".into());
        assert_eq!(e.next_after(nine), Some(nine + 15 * 60_000));
        assert_eq!(e.latest_at(nine + 20 * 60_000), Some(nine + 15 * 60_000));
        assert_eq!(e.between(nine, nine + 60 * 60_000), 3);
        let secs = Every::Cron("*/2 * * * * *".into());
        assert_eq!(secs.next_after(nine + 1), Some(nine + 2_000));
        let s = Schedule {
            every: e,
            template: String::new(),
            paused: false,
            updated_at: 0,
            slot: SlotRecord {
                s: nine,
                m: 0,
                l: 0,
            },
        };
        let f = s.due("c", nine + 61 * 60_000).unwrap();
        assert_eq!((f.slot, f.missed), (nine + 60 * 60_000, 3));
    }

    #[test]
    fn bad_timings_are_refused() {
        assert!(matches!(
            Every::Ms(99).check(),
            Err(ScheduleError::BadInterval(99))
        ));
        assert!(matches!(
            Every::Cron("61 * * * *".into()).check(),
            Err(ScheduleError::BadCron(..))
        ));
        assert!(Every::Cron("0 9 * * MON-FRI".into()).check().is_ok());
    }
}
