//! A queue view kept up to date incrementally.
//!
//! Reading a whole queue document costs time in proportion to its tasks. Routers and pools need
//! a fresh view after every change, so [`ViewCache`] re-reads only what the new changes
//! touched: it decodes the changes since the heads it last read and maps each operation to the
//! task it belongs to (layout 2: the task named by the operation's key in one of the layout
//! maps; layout 1: the task owning the operation's object, from a table of object ids filled
//! while reading), re-reads those tasks, plus the small root records if an operation touched
//! anything else, and says which tasks it re-read ([`ViewCache::changed`]).
//!
//! Most operations need no read at all. A layout-2 record is one string put under a key that
//! names its attempt, by one writer, overwriting nothing: an assignment, a start, an end or an
//! output put with no predecessor. When the view shows no value for that attempt's record yet,
//! the document's values for the key are exactly the new one (and any concurrent put of the
//! same batch, which then finds the value set and falls back), so the view takes it from the
//! operation itself: no lookup in the document, whose map lookups cost microseconds each.
//! Everything else falls back to re-reading the task: a put that overwrites or meets a value,
//! a record that does not parse, a start or end of an attempt the view does not show (the
//! task is then remembered as holding records the view hides, and always re-read).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use automerge::legacy::{Key, ObjectId, OpId, OpType};
use automerge::{ActorId, Automerge, ChangeHash, ObjId, ReadDoc, ScalarValue};

use crate::am;
use crate::entry::{AttemptOutcome, Finished, Started, TaskEntry};
use crate::ids::TaskId;
use crate::judge::{Judge, Right};
use crate::keys;
use crate::packed;
use crate::read::{EntryValue, Records, read_task_entry, read_task_entry_from};
use crate::view::{QueueView, read_root};

type ObjKey = (u64, ActorId);

fn key_of(obj: &ObjId) -> Option<ObjKey> {
    match obj {
        ObjId::Id(counter, actor, _) => Some((*counter, actor.clone())),
        ObjId::Root => None,
    }
}

/// What [`ViewCache::refresh`] did, for metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Refreshes that re-read the whole document.
    pub full_reads: u64,
    /// Refreshes that applied changes incrementally.
    pub incremental: u64,
    /// Task entries re-read by incremental refreshes.
    pub tasks_reread: u64,
    /// Task entries updated from the operations alone (no read of the document).
    pub tasks_patched: u64,
}

/// Which tasks the refreshes since the last [`ViewCache::take_changed`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Changed {
    /// The view was read whole: any task may have changed.
    #[default]
    Everything,
    /// Only these tasks' entries were re-read (added, changed or removed); the root records
    /// (config, members, claims) may have changed too.
    Tasks(Vec<TaskId>),
}

/// A [`QueueView`] of one queue document, refreshed from the changes since its last read.
///
/// The view is shared as an `Arc`; a refresh that changes something replaces it with a new one,
/// so holders of the old view keep a consistent snapshot.
#[derive(Clone, Debug, Default)]
pub struct ViewCache {
    view: Option<Arc<QueueView>>,
    heads: Vec<ChangeHash>,
    tasks_obj: Option<ObjKey>,
    tasks_exid: Option<ObjId>,
    /// The layout-2 root maps (every concurrent copy), with their root keys: an operation in
    /// one names its task in its key.
    layout_objs: HashMap<ObjKey, &'static str>,
    /// The idempotency maps (every concurrent copy): the view reads nothing there.
    idem_objs: HashSet<ObjKey>,
    /// Tasks whose layout-2 records may include some of attempts the view does not show (an
    /// unreadable assignment, a start or end without one): a record arriving later must be
    /// read with them, so these tasks are always re-read.
    hidden: HashSet<TaskId>,
    /// Every object inside a task entry (the entry, its attempts list, attempts, their start
    /// and end records) → the task.
    owners: HashMap<ObjKey, TaskId>,
    /// Router claims ignored by the last root read.
    root_malformed: usize,
    /// Malformed records per task (the entry itself, or its attempts), for the tasks that have
    /// any: the view's count is their sum plus `root_malformed`, so that re-reading a task
    /// replaces its share instead of adding to it.
    task_malformed: HashMap<TaskId, usize>,
    changed: Changed,
    stats: CacheStats,
}

impl ViewCache {
    /// An empty cache; the first refresh reads the whole document.
    pub fn new() -> Self {
        ViewCache::default()
    }

    /// The last view, if a refresh has read one.
    pub fn view(&self) -> Option<&Arc<QueueView>> {
        self.view.as_ref()
    }

    /// What refreshes did so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Which tasks the refreshes since the last [`ViewCache::take_changed`] changed.
    pub fn changed(&self) -> &Changed {
        &self.changed
    }

    /// Which tasks the refreshes since the last call changed; the next ones count anew.
    pub fn take_changed(&mut self) -> Changed {
        std::mem::replace(&mut self.changed, Changed::Tasks(Vec::new()))
    }

    /// Brings the view up to date with `doc` and returns it; `None` if `doc` is not a queue.
    pub fn refresh(&mut self, doc: &Automerge) -> Option<&Arc<QueueView>> {
        let heads = doc.get_heads();
        if self.view.is_some() && heads == self.heads {
            return self.view.as_ref();
        }
        let ok = match self.view.is_some() {
            true => self.incremental(doc),
            false => self.full(doc),
        };
        self.heads = heads;
        if !ok {
            self.view = None;
        }
        self.view.as_ref()
    }

    fn full(&mut self, doc: &Automerge) -> bool {
        self.stats.full_reads += 1;
        self.changed = Changed::Everything;
        self.owners.clear();
        self.task_malformed.clear();
        let mut view = QueueView::default();
        let Some((tasks, bad_claims)) = read_root(doc, &mut view) else {
            self.tasks_obj = None;
            return false;
        };
        self.root_malformed = bad_claims;
        self.tasks_obj = tasks.as_ref().and_then(key_of);
        self.tasks_exid = tasks.clone();
        let layout: Vec<(&'static str, ObjId)> = packed::MAPS
            .iter()
            .flat_map(|k| {
                am::all_objects(doc, &automerge::ROOT, k, automerge::ObjType::Map)
                    .into_iter()
                    .map(move |o| (*k, o))
            })
            .collect();
        self.layout_objs = layout
            .iter()
            .filter_map(|(k, o)| Some((key_of(o)?, *k)))
            .collect();
        self.idem_objs = am::all_objects(
            doc,
            &automerge::ROOT,
            packed::IDEMPOTENCY,
            automerge::ObjType::Map,
        )
        .iter()
        .filter_map(key_of)
        .collect();
        let (membership, doc_key) = (Arc::clone(&view.membership), view.doc_key.clone());
        let built = view.built.clone();
        let judge = Judge::new(&membership, doc_key.as_deref()).built(built.as_ref());
        if let Some(tasks) = tasks {
            let records = Records::read(doc, &judge);
            for item in doc.map_range(&tasks, ..) {
                // A removed peer's submission its removal had not seen.
                if !judge.allows(&item.id(), Right::Any) {
                    continue;
                }
                let id = TaskId::new(item.key.as_ref());
                let owners = &mut self.owners;
                let mut own = |o: &ObjId| {
                    if let Some(k) = key_of(o) {
                        owners.insert(k, id.clone());
                    }
                };
                let mut bad = 0;
                let value = EntryValue::of(&item.value, item.id());
                let records = Some(&records);
                match read_task_entry_from(
                    doc,
                    &judge,
                    records,
                    value,
                    id.clone(),
                    &mut bad,
                    &mut own,
                ) {
                    Some(entry) => view.set_task(id.clone(), Some(entry)),
                    None => bad += 1,
                }
                if bad > 0 {
                    self.task_malformed.insert(id, bad);
                }
            }
        }
        // Records of attempts the view does not show (an assignment that is not readable, or
        // whose task is not; a start or end whose assignment never came): their tasks are
        // always re-read.
        self.hidden.clear();
        for (k, obj) in &layout {
            if ![packed::ASSIGNED, packed::STARTED, packed::ENDED].contains(k) {
                continue;
            }
            for item in doc.map_range(obj, ..) {
                let key = item.key.as_ref();
                if !shows_attempt(&view, key) {
                    self.hidden.insert(TaskId::new(packed::task_of(key)));
                }
            }
        }
        view.take_rederived();
        self.set_malformed(&mut view);
        self.view = Some(Arc::new(view));
        true
    }

    /// Where an operation of a change wrote, by the tables of the last read.
    fn place<'o>(&self, op: &'o automerge::legacy::Op) -> Place<'o> {
        match &op.obj {
            ObjectId::Root => match &op.key {
                Key::Map(k)
                    if k == keys::TASKS
                        || k == keys::SCHEMA
                        || packed::MAPS.contains(&k.as_str()) =>
                {
                    Place::Replaced
                }
                // The idempotency records are not in the view.
                Key::Map(k) if k == packed::IDEMPOTENCY => Place::Elsewhere,
                _ => Place::Root,
            },
            ObjectId::Id(OpId(counter, actor)) => {
                let k = (*counter, actor.clone());
                if Some(&k) == self.tasks_obj.as_ref() {
                    match &op.key {
                        Key::Map(task) => Place::Task(TaskId::new(task.as_str())),
                        Key::Seq(_) => Place::Elsewhere,
                    }
                } else if let Some(map) = self.layout_objs.get(&k) {
                    match &op.key {
                        Key::Map(key) => Place::Record(map, key.as_str()),
                        Key::Seq(_) => Place::Elsewhere,
                    }
                } else if let Some(t) = self.owners.get(&k) {
                    Place::Task(t.clone())
                } else if self.idem_objs.contains(&k) {
                    Place::Elsewhere
                } else {
                    Place::Root
                }
            }
        }
    }

    /// The tasks whose entries or records the changes of `doc` after `heads` wrote, by the
    /// tables of the last refresh, which must have read `doc` as it is (every object those
    /// changes made is then known); `None` if one of them replaced the task index or a layout
    /// map (any task may have changed). Any other task of the view reads in `doc` as it read
    /// at `heads`. Costs the changes after `heads`.
    pub fn touched_since(&self, doc: &Automerge, heads: &[ChangeHash]) -> Option<BTreeSet<TaskId>> {
        let mut touched = BTreeSet::new();
        for change in doc.get_changes(heads) {
            for op in &change.decode().operations {
                match self.place(op) {
                    Place::Replaced => return None,
                    Place::Root | Place::Elsewhere => {}
                    Place::Task(task) => {
                        touched.insert(task);
                    }
                    Place::Record(_, key) => {
                        touched.insert(TaskId::new(packed::task_of(key)));
                    }
                }
            }
        }
        Some(touched)
    }

    fn set_malformed(&self, view: &mut QueueView) {
        view.malformed = self.root_malformed + self.task_malformed.values().sum::<usize>();
    }

    fn incremental(&mut self, doc: &Automerge) -> bool {
        let mut root = false;
        let mut dirty = BTreeSet::new();
        let mut patches: BTreeMap<TaskId, Vec<(Patch, ObjId)>> = BTreeMap::new();
        // Assignments, starts and ends seen: afterwards, any whose attempt the view does not
        // show hides records from it.
        let mut records: Vec<(TaskId, String)> = Vec::new();
        for change in doc.get_changes(&self.heads) {
            let expanded = change.decode();
            let start = expanded.start_op.get();
            for (i, op) in (0u64..).zip(expanded.operations.iter()) {
                let owner = match self.place(op) {
                    // The task index itself was replaced: start over.
                    Place::Replaced => return self.full(doc),
                    Place::Root => {
                        root = true;
                        None
                    }
                    Place::Elsewhere => None,
                    Place::Task(task) => Some(task),
                    Place::Record(map, key) => {
                        let task = TaskId::new(packed::task_of(key));
                        if [packed::ASSIGNED, packed::STARTED, packed::ENDED].contains(&map) {
                            records.push((task.clone(), key.to_string()));
                        }
                        match Patch::of(map, key, op) {
                            Some(p) => {
                                let id = ObjId::Id(start + i, expanded.actor_id.clone(), 0);
                                patches.entry(task).or_default().push((p, id));
                                None
                            }
                            None => Some(task),
                        }
                    }
                };
                if let Some(task) = owner {
                    if op.obj_type().is_some() {
                        // The op creates an object inside the task: it belongs to the task too.
                        self.owners
                            .insert((start + i, expanded.actor_id.clone()), task.clone());
                    }
                    dirty.insert(task);
                }
            }
        }
        self.stats.incremental += 1;
        let mut view = QueueView::clone(self.view.as_deref().expect("incremental needs a view"));
        if root {
            match read_root(doc, &mut view) {
                Some((_, bad_claims)) => self.root_malformed = bad_claims,
                None => return false,
            }
            // Who may write what changed: every value is judged anew (rare: an invite, a
            // removal).
            let before = self.view.as_deref().expect("incremental needs a view");
            if view.membership != before.membership
                || view.doc_key != before.doc_key
                || view.built != before.built
            {
                return self.full(doc);
            }
        }
        let (membership, doc_key) = (Arc::clone(&view.membership), view.doc_key.clone());
        let built = view.built.clone();
        let judge = Judge::new(&membership, doc_key.as_deref()).built(built.as_ref());
        let mut changed: BTreeSet<TaskId> = dirty.clone();
        for (id, list) in patches {
            changed.insert(id.clone());
            if dirty.contains(&id) {
                continue;
            }
            let patched = match view.task(&id) {
                Some(entry) if !self.hidden.contains(&id) => {
                    let mut entry = entry.clone();
                    // A record its writer's role does not allow is left to the re-read.
                    list.iter()
                        .all(|(p, id)| judge.allows(id, Right::Work) && p.apply(&mut entry))
                        .then_some(entry)
                }
                _ => None,
            };
            match patched {
                Some(entry) => {
                    self.stats.tasks_patched += 1;
                    view.set_task(id, Some(entry));
                }
                None => {
                    dirty.insert(id);
                }
            }
        }
        let tasks = self.tasks_exid.clone();
        for id in dirty {
            self.stats.tasks_reread += 1;
            // As in a full read: a key whose value is no readable task entry is malformed.
            let value = tasks.as_ref().and_then(|t| {
                let (v, o) = doc.get(t, id.as_str()).ok().flatten()?;
                if !judge.allows(&o, Right::Any) {
                    return None;
                }
                Some(match v {
                    automerge::Value::Object(automerge::ObjType::Map) => EntryValue::Map(o),
                    automerge::Value::Scalar(s) => match s.as_ref() {
                        automerge::ScalarValue::Str(s) => EntryValue::Packed(s.to_string()),
                        _ => EntryValue::Other,
                    },
                    _ => EntryValue::Other,
                })
            });
            let owners = &mut self.owners;
            let mut own = |o: &ObjId| {
                if let Some(k) = key_of(o) {
                    owners.insert(k, id.clone());
                }
            };
            let mut bad = 0;
            match value {
                Some(value) => {
                    match read_task_entry(doc, &judge, value, id.clone(), &mut bad, &mut own) {
                        Some(entry) => view.set_task(id.clone(), Some(entry)),
                        None => {
                            bad += 1;
                            view.set_task(id.clone(), None);
                        }
                    }
                }
                None => view.set_task(id.clone(), None),
            }
            match bad {
                0 => self.task_malformed.remove(&id),
                _ => self.task_malformed.insert(id, bad),
            };
        }
        for (task, key) in records {
            if !shows_attempt(&view, &key) {
                self.hidden.insert(task);
            }
        }
        // Dependents whose state followed a dependency's outcome changed too.
        changed.extend(view.take_rederived());
        if let Changed::Tasks(earlier) = &mut self.changed {
            changed.extend(earlier.drain(..));
            *earlier = changed.into_iter().collect();
        }
        self.set_malformed(&mut view);
        self.view = Some(Arc::new(view));
        true
    }
}

/// Whether `view` shows the attempt an attempt key names (false for a key that names none).
fn shows_attempt(view: &QueueView, key: &str) -> bool {
    packed::parse_attempt_key(key).is_some_and(|(task, id)| {
        view.task(&TaskId::new(task))
            .is_some_and(|e| e.attempts.iter().any(|a| a.id == id))
    })
}

/// Where an operation wrote ([`ViewCache::place`]).
enum Place<'o> {
    /// The root key of the task index, the schema or a layout map: the tables no longer hold.
    Replaced,
    /// A root record (config, members, claims, seals...), or an object of one.
    Root,
    /// A list position of the task index or a layout map: nothing a read takes.
    Elsewhere,
    /// A task's entry, or an object inside it (layout 1).
    Task(TaskId),
    /// A layout-2 record: its map and attempt (or task) key.
    Record(&'static str, &'o str),
}

/// A layout-2 record the view can take from its operation: a string put under an attempt
/// key, overwriting nothing.
enum Patch {
    Assigned(String, String),
    Started(String, String),
    Ended(String, String),
    /// An output: the view does not keep outputs, but the task changed.
    Output,
}

impl Patch {
    fn of(map: &str, key: &str, op: &automerge::legacy::Op) -> Option<Patch> {
        if !op.pred.is_empty() || op.insert {
            return None;
        }
        let OpType::Put(ScalarValue::Str(value)) = &op.action else {
            return None;
        };
        let (key, value) = (key.to_owned(), value.to_string());
        match map {
            packed::ASSIGNED => Some(Patch::Assigned(key, value)),
            packed::STARTED => Some(Patch::Started(key, value)),
            packed::ENDED => Some(Patch::Ended(key, value)),
            packed::OUTPUT => Some(Patch::Output),
            _ => None,
        }
    }

    /// Applies the record to `entry` as a read of the document would; false if only a read
    /// can say (the record meets a value already shown, names an attempt the entry does not
    /// have, or does not parse as the read would take it).
    fn apply(&self, entry: &mut TaskEntry) -> bool {
        let attempt_of = |key: &str| {
            packed::parse_attempt_key(key)
                .filter(|(task, id)| *task == entry.id.as_str() && id.claim.is_valid())
                .map(|(_, id)| id)
        };
        match self {
            Patch::Output => true,
            Patch::Assigned(key, value) => {
                let Some(id) = attempt_of(key) else {
                    return false;
                };
                let Some(rec) = packed::decode::<packed::Assigned>(value) else {
                    return false;
                };
                let Ok(worker) = rec.w.parse() else {
                    return false;
                };
                let at = entry.attempts.partition_point(|a| a.id < id);
                if entry.attempts.get(at).is_some_and(|a| a.id == id) {
                    return false;
                }
                entry.attempts.insert(
                    at,
                    crate::entry::Attempt {
                        id,
                        worker,
                        pool_incarnation: rec.i,
                        assigned_at: rec.a,
                        started: None,
                        finished: None,
                    },
                );
                true
            }
            Patch::Started(key, value) => {
                let Some(id) = attempt_of(key) else {
                    return false;
                };
                let Some(a) = entry.attempts.iter_mut().find(|a| a.id == id) else {
                    return false;
                };
                let Some(s) = packed::decode::<packed::Start>(value) else {
                    return false;
                };
                if a.started.is_some() {
                    return false;
                }
                a.started = Some(Started {
                    at: s.a,
                    incarnation: s.i,
                });
                true
            }
            Patch::Ended(key, value) => {
                let Some(id) = attempt_of(key) else {
                    return false;
                };
                let Some(a) = entry.attempts.iter_mut().find(|a| a.id == id) else {
                    return false;
                };
                let Some(e) = packed::decode::<packed::End>(value) else {
                    return false;
                };
                let Some(outcome) = AttemptOutcome::parse(&e.o) else {
                    return false;
                };
                if a.finished.is_some() {
                    return false;
                }
                a.finished = Some(Finished::new(e.a, outcome, e.e));
                true
            }
        }
    }
}
