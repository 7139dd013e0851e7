//! A queue view kept up to date incrementally.
//!
//! Reading a whole queue document costs time in proportion to its tasks. Routers and pools need
//! a fresh view after every change, so [`ViewCache`] re-reads only what the new changes
//! touched: it decodes the changes since the heads it last read and maps each operation to the
//! task it belongs to (layout 2: the task named by the operation's key in one of the layout
//! maps; layout 1: the task owning the operation's object, from a table of object ids filled
//! while reading), re-reads those tasks, plus the small root records if an operation touched
//! anything else, and says which tasks it re-read ([`ViewCache::changed`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use automerge::legacy::{Key, ObjectId, OpId};
use automerge::{ActorId, Automerge, ChangeHash, ObjId, ReadDoc};

use crate::am;
use crate::ids::TaskId;
use crate::keys;
use crate::packed;
use crate::view::{EntryValue, QueueView, read_root, read_task_entry};

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
}

/// Which tasks the last [`ViewCache::refresh`] changed.
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
#[derive(Debug, Default)]
pub struct ViewCache {
    view: Option<Arc<QueueView>>,
    heads: Vec<ChangeHash>,
    tasks_obj: Option<ObjKey>,
    tasks_exid: Option<ObjId>,
    /// The layout-2 root maps (every concurrent copy): an operation in one names its task in
    /// its key.
    layout_objs: HashSet<ObjKey>,
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

    /// Which tasks the last refresh changed.
    pub fn changed(&self) -> &Changed {
        &self.changed
    }

    /// Brings the view up to date with `doc` and returns it; `None` if `doc` is not a queue.
    pub fn refresh(&mut self, doc: &Automerge) -> Option<&Arc<QueueView>> {
        let heads = doc.get_heads();
        if self.view.is_some() && heads == self.heads {
            self.changed = Changed::Tasks(Vec::new());
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
        self.layout_objs = packed::MAPS
            .iter()
            .flat_map(|k| am::all_objects(doc, &automerge::ROOT, k, automerge::ObjType::Map))
            .filter_map(|o| key_of(&o))
            .collect();
        if let Some(tasks) = tasks {
            for item in doc.map_range(&tasks, ..) {
                let id = TaskId::new(item.key.as_ref());
                let owners = &mut self.owners;
                let mut own = |o: &ObjId| {
                    if let Some(k) = key_of(o) {
                        owners.insert(k, id.clone());
                    }
                };
                let mut bad = 0;
                let value = EntryValue::of(&item.value, item.id());
                match read_task_entry(doc, value, id.clone(), &mut bad, &mut own) {
                    Some(entry) => view.set_task(id.clone(), Some(entry)),
                    None => bad += 1,
                }
                if bad > 0 {
                    self.task_malformed.insert(id, bad);
                }
            }
        }
        self.set_malformed(&mut view);
        self.view = Some(Arc::new(view));
        true
    }

    fn set_malformed(&self, view: &mut QueueView) {
        view.malformed = self.root_malformed + self.task_malformed.values().sum::<usize>();
    }

    fn incremental(&mut self, doc: &Automerge) -> bool {
        let mut root = false;
        let mut dirty = BTreeSet::new();
        for change in doc.get_changes(&self.heads) {
            let expanded = change.decode();
            let start = expanded.start_op.get();
            for (i, op) in (0u64..).zip(expanded.operations.iter()) {
                let owner = match &op.obj {
                    ObjectId::Root => {
                        if matches!(&op.key, Key::Map(k) if k == keys::TASKS || k == keys::SCHEMA || packed::MAPS.contains(&k.as_str()))
                        {
                            // The task index itself was replaced: start over.
                            return self.full(doc);
                        }
                        root = true;
                        None
                    }
                    ObjectId::Id(OpId(counter, actor)) => {
                        let k = (*counter, actor.clone());
                        if Some(&k) == self.tasks_obj.as_ref() {
                            match &op.key {
                                Key::Map(task) => Some(TaskId::new(task.as_str())),
                                Key::Seq(_) => None,
                            }
                        } else if self.layout_objs.contains(&k) {
                            match &op.key {
                                Key::Map(key) => Some(TaskId::new(packed::task_of(key))),
                                Key::Seq(_) => None,
                            }
                        } else if let Some(t) = self.owners.get(&k) {
                            Some(t.clone())
                        } else {
                            root = true;
                            None
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
        }
        let tasks = self.tasks_exid.clone();
        self.changed = Changed::Tasks(dirty.iter().cloned().collect());
        for id in dirty {
            self.stats.tasks_reread += 1;
            // As in a full read: a key whose value is no readable task entry is malformed.
            let value = tasks.as_ref().and_then(|t| {
                let (v, o) = doc.get(t, id.as_str()).ok().flatten()?;
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
                Some(value) => match read_task_entry(doc, value, id.clone(), &mut bad, &mut own) {
                    Some(entry) => view.set_task(id.clone(), Some(entry)),
                    None => {
                        bad += 1;
                        view.set_task(id.clone(), None);
                    }
                },
                None => view.set_task(id.clone(), None),
            }
            match bad {
                0 => self.task_malformed.remove(&id),
                _ => self.task_malformed.insert(id, bad),
            };
        }
        self.set_malformed(&mut view);
        self.view = Some(Arc::new(view));
        true
    }
}
