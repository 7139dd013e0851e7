//! Reading a task's entry and its attempts out of a queue document, in either layout (the
//! layout-1 maps and the layout-2 records of `packed.rs`), one task at a time or, for a whole
//! read, from every record read at once ([`Records`]).

use std::collections::{BTreeMap, HashMap};

use automerge::{Automerge, ObjId, ObjType, ROOT, ReadDoc, ValueRef};

use crate::am;
use crate::config::QueueConfig;
use crate::entry::{Attempt, AttemptOutcome, Finished, MAX_PRIORITY, Started, TaskEntry};
use crate::ids::{AttemptId, Claim, PeerId, TaskId, WorkerId};
use crate::judge::{Judge, Right};
use crate::keys;
use crate::packed;

/// A task's value in the `tasks` map: a layout-1 entry map, or a layout-2 packed entry.
pub(crate) enum EntryValue {
    /// Layout 1.
    Map(ObjId),
    /// Layout 2 ([`packed::Entry`] as JSON).
    Packed(String),
    /// Anything else (malformed).
    Other,
}

impl EntryValue {
    pub(crate) fn of(value: &ValueRef<'_>, id: ObjId) -> Self {
        match value {
            ValueRef::Object(ObjType::Map) => EntryValue::Map(id),
            v => am::as_str(v).map_or(EntryValue::Other, |s| EntryValue::Packed(s.to_owned())),
        }
    }
}

/// Reads one task entry, in either layout, with its attempts from both, reporting every
/// layout-1 object id that belongs to it to `owned` (for [`crate::ViewCache`]'s object table).
pub(crate) fn read_task_entry(
    doc: &Automerge,
    judge: &Judge<'_>,
    value: EntryValue,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    read_task_entry_from(doc, judge, None, value, id, malformed, owned)
}

/// The layout-2 records of a whole document, read map by map: a whole read looks a task's
/// records up here instead of seeking each in the document (about seven seeks per task, which
/// made a whole read of 3,000 tasks take 50 ms). Values are kept as Automerge holds them:
/// every concurrent value of starts, ends and marks, the winning assignment (as a per-task
/// read sees them).
#[derive(Default)]
pub(crate) struct Records {
    /// Attempt key → (the index of the `assigned` object that holds it, its value).
    assigned: BTreeMap<String, Vec<(usize, String)>>,
    started: HashMap<String, Vec<String>>,
    ended: HashMap<String, Vec<String>>,
    seen: HashMap<String, u64>,
    bumps: HashMap<String, Vec<String>>,
    /// With, for a value a submitter wrote, that submitter: it counts for its own tasks only.
    cancels: HashMap<String, Vec<(String, Option<PeerId>)>>,
    requeues: HashMap<String, Vec<(String, Option<PeerId>)>>,
}

impl Records {
    /// Reads the layout-2 maps of `doc` whole, keeping the values `judge` counts: O(records).
    pub(crate) fn read(doc: &Automerge, judge: &Judge<'_>) -> Records {
        let mut r = Records::default();
        let text = |v: &automerge::Value<'_>| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        };
        let assigned = am::all_objects(doc, &ROOT, packed::ASSIGNED, ObjType::Map);
        for (i, m) in assigned.iter().enumerate() {
            for item in doc.map_range(m, ..) {
                if !judge.allows(&item.id(), Right::Work) {
                    continue;
                }
                let value = am::as_str(&item.value).map(str::to_owned);
                // Unreadable values count as malformed where the task reads them.
                r.assigned
                    .entry(item.key.to_string())
                    .or_default()
                    .push((i, value.unwrap_or_default()));
            }
        }
        // Every counted value of each key of the root map `name`, with its writer if only a
        // task's own submitter counts it.
        let values_of = |name: &str, right: Option<Right>| {
            let mut out: HashMap<String, Vec<(String, Option<PeerId>)>> = HashMap::new();
            for m in am::all_objects(doc, &ROOT, name, ObjType::Map) {
                for item in doc.map_range(&m, ..) {
                    let values = out.entry(item.key.to_string()).or_default();
                    let mut keep = |v: Option<String>, id: &ObjId| {
                        let owner = match right {
                            Some(right) => judge.allows(id, right).then_some(None),
                            None => judge.owner_only(id),
                        };
                        if let (Some(v), Some(owner)) = (v, owner) {
                            values.push((v, owner));
                        }
                    };
                    match item.conflict {
                        false => keep(am::as_str(&item.value).map(str::to_owned), &item.id()),
                        true => {
                            for (v, id) in doc.get_all(&m, item.key.as_ref()).unwrap_or_default() {
                                keep(text(&v), &id);
                            }
                        }
                    }
                }
            }
            out
        };
        let plain = |m: HashMap<String, Vec<(String, Option<PeerId>)>>| {
            m.into_iter()
                .map(|(k, vs)| (k, vs.into_iter().map(|(v, _)| v).collect()))
                .collect::<HashMap<String, Vec<String>>>()
        };
        r.started = plain(values_of(packed::STARTED, Some(Right::Work)));
        r.ended = plain(values_of(packed::ENDED, Some(Right::Work)));
        r.bumps = plain(values_of(packed::BUMPS, Some(Right::Any)));
        r.cancels = values_of(packed::CANCELS, None);
        r.requeues = values_of(packed::REQUEUES, None);
        for m in am::all_objects(doc, &ROOT, packed::SEEN, ObjType::Map) {
            for item in doc.map_range(&m, ..) {
                let n = match item.conflict || !judge.allows(&item.id(), Right::Any) {
                    false => am::as_uint(&item.value).unwrap_or(0),
                    true => doc
                        .get_all(&m, item.key.as_ref())
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|(_, id)| judge.allows(id, Right::Any))
                        .filter_map(|(v, _)| am::value_uint(&v))
                        .max()
                        .unwrap_or(0),
                };
                let e = r.seen.entry(item.key.to_string()).or_default();
                *e = (*e).max(n);
            }
        }
        r
    }

    fn started(&self, key: &str) -> Option<Started> {
        started_of(self.started.get(key).into_iter().flatten().cloned())
    }

    fn finished(&self, key: &str) -> Option<Finished> {
        finished_of(self.ended.get(key).into_iter().flatten().cloned())
    }
}

/// [`read_task_entry`], with the layout-2 records from `records` when given (a whole read)
/// and from the document otherwise.
pub(crate) fn read_task_entry_from(
    doc: &Automerge,
    judge: &Judge<'_>,
    records: Option<&Records>,
    value: EntryValue,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    let mut entry = match value {
        EntryValue::Map(obj) => read_map_entry(doc, judge, &obj, id.clone(), malformed, owned)?,
        EntryValue::Packed(s) => {
            let e: packed::Entry = packed::decode(&s)?;
            let rules = e.r.normalized(&id);
            TaskEntry {
                id: id.clone(),
                kind: e.k,
                submitted_at: e.t,
                submitter: PeerId::new(e.s),
                priority: e.p.clamp(-MAX_PRIORITY, MAX_PRIORITY),
                urgent: e.u,
                max_attempts: u32::try_from(e.m)
                    .unwrap_or(u32::MAX)
                    .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS),
                attempts: Vec::new(),
                input_seen: 0,
                input: e.i,
                dependencies: rules.outcomes.clone(),
                rules,
                bump: None,
                duplicate_of: None,
                cancel: None,
                requeue: None,
            }
        }
        EntryValue::Other => return None,
    };
    // Layout-2 records: attempts, and the starts and ends of attempts of either layout.
    let started = |key: &str| match records {
        Some(r) => r.started(key),
        None => started_of(judged_values(doc, judge, packed::STARTED, key)),
    };
    let finished = |key: &str| match records {
        Some(r) => r.finished(key),
        None => finished_of(judged_values(doc, judge, packed::ENDED, key)),
    };
    for a in &mut entry.attempts {
        let key = packed::attempt_key(&id, &a.id);
        a.started = a
            .started
            .take()
            .into_iter()
            .chain(started(&key))
            .max_by_key(|s| (s.incarnation, s.at));
        a.finished = a
            .finished
            .take()
            .into_iter()
            .chain(finished(&key))
            .max_by(later_finish);
    }
    let mut push = |key: &str, value: Option<&str>| match value
        .and_then(|v| read_packed_attempt(key, v, &started, &finished))
    {
        Some(a) => entry.attempts.push(a),
        None => *malformed += 1,
    };
    match records {
        Some(r) => {
            // In the order the document path takes them (object by object, each in key
            // order), so that equal attempt ids (keys that differ only in how they spell a
            // number) dedup to the same one.
            let mut found: Vec<(usize, &str, &str)> = r
                .assigned
                .range(packed::attempts_of(&id))
                .flat_map(|(k, vs)| vs.iter().map(move |(i, v)| (*i, k.as_str(), v.as_str())))
                .collect();
            found.sort_by_key(|(i, _, _)| *i);
            for (_, key, value) in found {
                push(key, Some(value));
            }
        }
        None => {
            for m in am::all_objects(doc, &ROOT, packed::ASSIGNED, ObjType::Map) {
                for item in doc.map_range(&m, packed::attempts_of(&id)) {
                    if !judge.allows(&item.id(), Right::Work) {
                        continue;
                    }
                    push(item.key.as_ref(), am::as_str(&item.value));
                }
            }
        }
    }
    entry.attempts.sort_by(|a, b| a.id.cmp(&b.id));
    entry.attempts.dedup_by(|a, b| a.id == b.id);
    let seen = match records {
        Some(r) => r.seen.get(id.as_str()).copied().unwrap_or(0),
        None => packed_seen(doc, judge, &id),
    };
    entry.input_seen = entry.input_seen.max(seen);
    entry.bump = match records {
        Some(r) => bump_of(r.bumps.get(id.as_str()).into_iter().flatten().cloned()),
        None => bump_of(judged_values(doc, judge, packed::BUMPS, id.as_str())),
    };
    // A cancel or a requeue counts if a member wrote it, or the task's own submitter.
    let submitter = entry.submitter.clone();
    let own =
        |(v, owner): (String, Option<PeerId>)| owner.is_none_or(|o| o == submitter).then_some(v);
    entry.cancel = match records {
        Some(r) => merged_of(
            r.cancels
                .get(id.as_str())
                .into_iter()
                .flatten()
                .cloned()
                .filter_map(own),
        ),
        None => merged_of(owned_values(doc, judge, packed::CANCELS, id.as_str()).filter_map(own)),
    };
    entry.requeue = match records {
        Some(r) => merged_of(
            r.requeues
                .get(id.as_str())
                .into_iter()
                .flatten()
                .cloned()
                .filter_map(own),
        ),
        None => merged_of(owned_values(doc, judge, packed::REQUEUES, id.as_str()).filter_map(own)),
    };
    Some(entry)
}

/// A record that merges with its concurrent values ([`crate::entry::Cancel`],
/// [`crate::entry::Requeue`]).
pub(crate) trait Merge: serde::de::DeserializeOwned {
    fn merge(self, other: Self) -> Self;
}

impl Merge for crate::entry::Cancel {
    fn merge(self, other: Self) -> Self {
        crate::entry::Cancel::merge(self, other)
    }
}

impl Merge for crate::entry::Requeue {
    fn merge(self, other: Self) -> Self {
        crate::entry::Requeue::merge(self, other)
    }
}

/// The merge of a task's values of one record map; unreadable ones are skipped.
pub(crate) fn merged_of<T: Merge>(values: impl Iterator<Item = String>) -> Option<T> {
    values
        .filter_map(|v| packed::decode::<T>(&v))
        .reduce(T::merge)
}

/// The merge of a task's bump values (see [`crate::entry::Bump`]); unreadable ones are
/// skipped.
pub(crate) fn bump_of(values: impl Iterator<Item = String>) -> Option<crate::entry::Bump> {
    values
        .filter_map(|v| packed::decode::<crate::entry::Bump>(&v))
        .reduce(crate::entry::Bump::merge)
}

fn read_packed_attempt(
    key: &str,
    value: &str,
    started: &dyn Fn(&str) -> Option<Started>,
    finished: &dyn Fn(&str) -> Option<Finished>,
) -> Option<Attempt> {
    let (_, id) = packed::parse_attempt_key(key)?;
    if !id.claim.is_valid() {
        return None;
    }
    let rec: packed::Assigned = packed::decode(value)?;
    Some(Attempt {
        id,
        worker: rec.w.parse().ok()?,
        pool_incarnation: rec.i,
        assigned_at: rec.a,
        started: started(key),
        finished: finished(key),
    })
}

/// An attempt's layout-2 start; among concurrent ones, the greatest `(incarnation, at)`.
pub(crate) fn packed_started<R: ReadDoc>(doc: &R, key: &str) -> Option<Started> {
    started_of(packed_values(doc, packed::STARTED, key))
}

pub(crate) fn started_of(values: impl Iterator<Item = String>) -> Option<Started> {
    values
        .filter_map(|s| packed::decode::<packed::Start>(&s))
        .map(|s| Started {
            at: s.a,
            incarnation: s.i,
        })
        .max_by_key(|s| (s.incarnation, s.at))
}

/// An attempt's layout-2 end; among concurrent ones, the greatest (see [`AttemptOutcome`]).
pub(crate) fn packed_finished<R: ReadDoc>(doc: &R, key: &str) -> Option<Finished> {
    finished_of(packed_values(doc, packed::ENDED, key))
}

pub(crate) fn finished_of(values: impl Iterator<Item = String>) -> Option<Finished> {
    values
        .filter_map(|s| {
            let e: packed::End = packed::decode(&s)?;
            Some(Finished::new(e.a, AttemptOutcome::parse(&e.o)?, e.e))
        })
        .max_by(later_finish)
}

/// The layout-2 mark of a task's input (0 if none); concurrent marks keep the greatest.
fn packed_seen<R: ReadDoc>(doc: &R, judge: &Judge<'_>, task: &TaskId) -> u64 {
    am::all_objects(doc, &ROOT, packed::SEEN, ObjType::Map)
        .iter()
        .flat_map(|m| doc.get_all(m, task.as_str()).unwrap_or_default())
        .filter(|(_, id)| judge.allows(id, Right::Any))
        .filter_map(|(v, _)| am::value_uint(&v))
        .max()
        .unwrap_or(0)
}

/// [`packed_values`], keeping the values `judge` counts for a write needing `right`.
pub(crate) fn judged_values<'a, R: ReadDoc>(
    doc: &'a R,
    judge: &'a Judge<'a>,
    map: &str,
    key: &'a str,
) -> impl Iterator<Item = String> + 'a {
    let right = match map {
        packed::BUMPS | packed::SEEN => Right::Any,
        _ => Right::Work,
    };
    am::all_objects(doc, &ROOT, map, ObjType::Map)
        .into_iter()
        .flat_map(move |m| doc.get_all(&m, key).unwrap_or_default())
        .filter(move |(_, id)| judge.allows(id, right))
        .filter_map(|(v, _)| am::value_str(&v).map(str::to_owned))
}

/// The values of a cancel or requeue record that `judge` counts, each with its writer if it
/// counts for that writer's own tasks only ([`Judge::owner_only`]).
fn owned_values<'a, R: ReadDoc>(
    doc: &'a R,
    judge: &'a Judge<'a>,
    map: &str,
    key: &'a str,
) -> impl Iterator<Item = (String, Option<PeerId>)> + 'a {
    am::all_objects(doc, &ROOT, map, ObjType::Map)
        .into_iter()
        .flat_map(move |m| doc.get_all(&m, key).unwrap_or_default())
        .filter_map(move |(v, id)| Some((am::value_str(&v)?.to_owned(), judge.owner_only(&id)?)))
}

/// The greatest attempt number at which a task's input was marked available, in either layout.
pub(crate) fn input_seen<R: ReadDoc>(doc: &R, task: &TaskId) -> u64 {
    let v1 = am::object(doc, &ROOT, keys::TASKS, ObjType::Map)
        .and_then(|t| am::object(doc, &t, task.as_str(), ObjType::Map))
        .map_or(0, |e| am::max_uint(doc, &e, keys::INPUT_SEEN));
    v1.max(packed_seen(doc, &Judge::open(), task))
}

/// Every concurrent string value of `key` in every concurrent copy of the root map `map`.
pub(crate) fn packed_values<'a, R: ReadDoc>(
    doc: &'a R,
    map: &str,
    key: &'a str,
) -> impl Iterator<Item = String> + 'a {
    am::all_objects(doc, &ROOT, map, ObjType::Map)
        .into_iter()
        .flat_map(move |m| doc.get_all(&m, key).unwrap_or_default())
        .filter_map(|(v, _)| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => Some(s.to_string()),
                _ => None,
            },
            _ => None,
        })
}

/// The order among concurrent ends: outcome, then time, then error text.
pub(crate) fn later_finish(a: &Finished, b: &Finished) -> std::cmp::Ordering {
    a.outcome
        .cmp(&b.outcome)
        .then(a.at.cmp(&b.at))
        .then(a.error.cmp(&b.error))
}

/// Reads a layout-1 task entry in a single pass over each of its objects.
fn read_map_entry(
    doc: &Automerge,
    judge: &Judge<'_>,
    obj: &ObjId,
    id: TaskId,
    malformed: &mut usize,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<TaskEntry> {
    owned(obj);
    let (mut kind, mut submitted_at, mut submitter) = (None, None, None);
    let (mut priority, mut urgent, mut max_attempts, mut list) = (0, false, 1, None);
    let mut input_seen = 0;
    for item in doc.map_range(obj, ..) {
        let v = &item.value;
        match item.key.as_ref() {
            keys::KIND => kind = am::as_str(v).map(str::to_owned),
            keys::SUBMITTED_AT => submitted_at = am::as_uint(v),
            keys::SUBMITTER => submitter = am::as_str(v).map(PeerId::new),
            keys::PRIORITY => {
                priority = am::as_int(v).map_or(0, |p| p.clamp(-MAX_PRIORITY, MAX_PRIORITY))
            }
            keys::URGENT => urgent = am::as_bool(v).unwrap_or(false),
            keys::MAX_ATTEMPTS => {
                max_attempts = am::as_uint(v)
                    .map_or(1, |x| u32::try_from(x).unwrap_or(u32::MAX))
                    .clamp(QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
            }
            keys::ATTEMPTS if matches!(v, ValueRef::Object(ObjType::List)) => {
                list = Some(item.id())
            }
            // Members write it concurrently: the greatest value counts.
            keys::INPUT_SEEN => input_seen = am::max_uint(doc, obj, keys::INPUT_SEEN),
            _ => {}
        }
    }
    let mut attempts = Vec::new();
    if let Some(list) = list {
        owned(&list);
        for item in doc.list_range(&list, ..) {
            if !matches!(item.value, ValueRef::Object(ObjType::Map)) {
                *malformed += 1;
                continue;
            }
            // An attempt is made by the router, and its record is written by the router and
            // the worker: all of it needs a working role.
            if !judge.allows(&item.id(), Right::Work) {
                continue;
            }
            match read_attempt(doc, &item.id(), owned) {
                Some(a) => attempts.push(a),
                None => *malformed += 1,
            }
        }
    }
    Some(TaskEntry {
        id,
        kind: kind?,
        submitted_at: submitted_at?,
        submitter: submitter?,
        priority,
        urgent,
        max_attempts,
        attempts,
        input_seen,
        input: None,
        rules: Default::default(),
        dependencies: Default::default(),
        bump: None,
        duplicate_of: None,
        cancel: None,
        requeue: None,
    })
}

/// What the runs of an inline task produced, by attempt, from the `output` map of a queue
/// document (the view does not keep it: only a task's status reads it). Among concurrent
/// values of one attempt (two ends after a restart) the greatest text wins.
pub fn read_outputs<R: ReadDoc>(doc: &R, task: &TaskId) -> Vec<(AttemptId, crate::Output)> {
    let mut out: BTreeMap<AttemptId, String> = BTreeMap::new();
    for m in am::all_objects(doc, &ROOT, packed::OUTPUT, ObjType::Map) {
        for item in doc.map_range(&m, packed::attempts_of(task)) {
            let Some((_, id)) = packed::parse_attempt_key(item.key.as_ref()) else {
                continue;
            };
            for (v, _) in doc.get_all(&m, item.key.as_ref()).unwrap_or_default() {
                if let automerge::Value::Scalar(sv) = v
                    && let automerge::ScalarValue::Str(text) = sv.as_ref()
                {
                    let e = out.entry(id.clone()).or_default();
                    if text.as_str() > e.as_str() {
                        *e = text.to_string();
                    }
                }
            }
        }
    }
    out.into_iter()
        .filter_map(|(id, text)| Some((id, packed::decode(&text)?)))
        .collect()
}

pub(crate) fn read_attempt(
    doc: &Automerge,
    obj: &ObjId,
    owned: &mut dyn FnMut(&ObjId),
) -> Option<Attempt> {
    owned(obj);
    let (mut n, mut term, mut router, mut worker, mut assigned_at) = (None, None, None, None, None);
    let (mut start, mut finish, mut pool_incarnation) = (None, None, None);
    for item in doc.map_range(obj, ..) {
        let v = &item.value;
        match item.key.as_ref() {
            keys::N => n = am::as_uint(v),
            keys::TERM => term = am::as_uint(v),
            keys::ROUTER => router = am::as_str(v).map(PeerId::new),
            keys::WORKER => worker = am::as_str(v).and_then(|w| w.parse::<WorkerId>().ok()),
            keys::ASSIGNED_AT => assigned_at = am::as_uint(v),
            keys::POOL_INCARNATION => pool_incarnation = Some(am::as_uint(v)),
            keys::START => start = Some(item.conflict),
            keys::FINISH => finish = Some(item.conflict),
            _ => {}
        }
    }
    // Start and end records are rare and small; read them (with their conflicts) directly.
    let started = start.and_then(|_| {
        let objs = am::all_objects(doc, obj, keys::START, ObjType::Map);
        objs.iter().for_each(&mut *owned);
        resolve_started(doc, &objs)
    });
    let finished = finish.and_then(|_| {
        let objs = am::all_objects(doc, obj, keys::FINISH, ObjType::Map);
        objs.iter().for_each(&mut *owned);
        resolve_finished(doc, &objs)
    });
    // An attempt made under a claim above MAX_TERM is malformed: no router can hold one, and it
    // would pass every fence. So is one whose pool incarnation is there but not a number.
    let pool_incarnation = match pool_incarnation {
        Some(None) => return None,
        p => p.flatten(),
    };
    Some(Attempt {
        id: AttemptId {
            n: n?,
            claim: Some(Claim::new(term?, router?)).filter(Claim::is_valid)?,
        },
        worker: worker?,
        pool_incarnation,
        assigned_at: assigned_at?,
        started,
        finished,
    })
}

/// The start record; among concurrent ones, the greatest `(incarnation, at)`.
pub(crate) fn read_started<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Started> {
    resolve_started(
        doc,
        &am::all_objects(doc, attempt, keys::START, ObjType::Map),
    )
}

fn resolve_started<R: ReadDoc>(doc: &R, objs: &[ObjId]) -> Option<Started> {
    objs.iter()
        .filter_map(|o| {
            Some(Started {
                at: am::uint(doc, o, keys::AT)?,
                incarnation: am::uint(doc, o, keys::INCARNATION)?,
            })
        })
        .max_by_key(|s| (s.incarnation, s.at))
}

/// The end record; among concurrent ones, the greatest by outcome, then time, then error text.
pub(crate) fn read_finished<R: ReadDoc>(doc: &R, attempt: &ObjId) -> Option<Finished> {
    resolve_finished(
        doc,
        &am::all_objects(doc, attempt, keys::FINISH, ObjType::Map),
    )
}

fn resolve_finished<R: ReadDoc>(doc: &R, objs: &[ObjId]) -> Option<Finished> {
    objs.iter()
        .filter_map(|o| {
            Some(Finished::new(
                am::uint(doc, o, keys::AT)?,
                AttemptOutcome::parse(&am::string(doc, o, keys::OUTCOME)?)?,
                am::string(doc, o, keys::ERROR),
            ))
        })
        .max_by(later_finish)
}
