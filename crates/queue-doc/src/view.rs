//! Read views of a queue document: the effective router, members, tasks and their states.
//!
//! A view is computed from the document alone, so every replica holding the same changes
//! computes the same view, whatever order the changes arrived in.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use automerge::{Automerge, ObjId, ObjType, ROOT, ReadDoc, ValueRef};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::chain;
use crate::config::{Order, QueueConfig};
use crate::entry::{Attempt, TaskEntry, TaskState};
use crate::ids::{Claim, MAX_TERM, PeerId, TaskId, WorkerId};
use crate::judge::{Judge, Right};
use crate::keys;
use crate::membership::{self, Membership};
use crate::packed;
use crate::read::{EntryValue, Records, read_task_entry_from};

/// A member of a queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's role (`member` for now).
    pub role: String,
    /// Addresses the member listens on, as it last wrote them.
    pub addrs: Vec<String>,
}

/// Everything a queue document says, read at one moment.
///
/// The tasks live in a persistent map (cloning a view costs O(1), changing one task
/// O(log n)), and the view keeps indexes over them that every change updates: pending tasks in
/// routing order, tasks with open attempts by worker peer, tasks waiting for their input, and
/// counts by state. Reading them costs what they hold, never the queue's history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueView {
    /// The queue's name.
    pub name: String,
    /// The queue's configuration.
    pub config: QueueConfig,
    /// The effective router: the greatest claim among the router record's concurrent values.
    pub router: Option<Claim>,
    /// Every router claim that counts, in order (see [`QueueView::router`]): claims that
    /// skip a term or are above [`MAX_TERM`](crate::MAX_TERM) are ignored and counted in
    /// [`QueueView::malformed`].
    pub claims: Vec<Claim>,
    /// Members by peer, as each wrote its entry (its addresses). Who is a member, and in
    /// which role, is [`QueueView::membership`]'s.
    pub members: BTreeMap<PeerId, Member>,
    /// The queue's membership, materialized from its signed operations
    /// ([`crate::membership`]).
    pub membership: Arc<Membership>,
    /// Whether routing is paused.
    pub paused: bool,
    /// The boost of each priority tag (tags without one count 0): see
    /// [`QueueView::effective_priority`].
    pub boosts: BTreeMap<String, i64>,
    /// The live schedules, by name ([`crate::schedule`]).
    pub schedules: BTreeMap<String, crate::schedule::Schedule>,
    /// The document's schema version. A node does not route a queue whose version is above
    /// the one it knows ([`QueueView::routable_version`]).
    pub version: u64,
    /// This document's epoch: 0 for a queue's first document ([`crate::epoch`]).
    pub epoch: u64,
    /// This document's own id, as it names itself: the queue's id in its first document, its
    /// lineage's last link in a successor; `None` in a queue written before either was
    /// recorded. A removal's [`Cut`](crate::membership::Cut) names the document by it.
    pub doc_key: Option<String>,
    /// The queue this document continues (its first document's id); `None` in epoch 0.
    pub origin: Option<crate::QueueId>,
    /// The sealed document this one continues, and its heads at sealing; `None` in epoch 0.
    pub prev: Option<chain::Prev>,
    /// Seals written into this document: successors that continue it, in order (the last is
    /// the [winner](crate::epoch::winner)).
    pub seals: Vec<chain::Seal>,
    /// In a queue's first document: the newest epoch it knows of.
    pub latest: Option<chain::Latest>,
    /// Tasks that ended in earlier epochs and were left behind by rotations (a running
    /// total, as each sealer counted them).
    pub retired: chain::Retired,
    /// Every indexed task by id.
    tasks: OrdMap<TaskId, Arc<TaskEntry>>,
    /// Derived from `tasks` (and `config.order`); updated by [`QueueView::set_task`].
    index: TaskIndex,
    /// Task entries, attempts and router claims that could not be read or were ignored (written
    /// by a faulty or hostile peer).
    pub malformed: usize,
    /// In a successor, the build's last operation: the operations up to it by its actor are
    /// the predecessor's state, copied (see `judge.rs`).
    pub(crate) built: Option<(u64, automerge::ActorId)>,
    /// Tasks re-derived because a dependency's outcome changed, since the last
    /// its last refresh (the cache reports them as changed).
    rederived: Rederived,
}

/// Ids of re-derived tasks: bookkeeping, so equal for any two views.
#[derive(Clone, Debug, Default)]
struct Rederived(Vec<TaskId>);

impl PartialEq for Rederived {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Rederived {}

/// A pending task's place in the routing order: urgent first, then greater effective priority
/// (boost sum, then priority), then submit time (per the queue's [`Order`]), then id. A dedup
/// bump moves a task to the front of its priority class: in a FIFO queue bumped tasks go
/// first (the latest bump first); in a LIFO queue a bump counts as a new push.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct RouteKey {
    not_urgent: bool,
    priority: std::cmp::Reverse<i64>,
    /// FIFO: the last bump's time (0: none), latest first. LIFO: 0.
    front: std::cmp::Reverse<u64>,
    /// `submitted_at` for FIFO; for LIFO, the complement of the later of it and the last bump.
    time: u64,
    id: TaskId,
}

impl RouteKey {
    fn of(t: &TaskEntry, order: Order, boosts: &BTreeMap<String, i64>) -> Self {
        let (front, time) = match order {
            Order::Fifo => (t.bumped_at(), t.submitted_at),
            Order::Lifo => (0, u64::MAX - t.submitted_at.max(t.bumped_at())),
        };
        RouteKey {
            not_urgent: !t.urgent_now(),
            priority: std::cmp::Reverse(effective_priority(t, boosts)),
            front: std::cmp::Reverse(front),
            time,
            id: t.id.clone(),
        }
    }
}

/// `boost sum × BOOST_WEIGHT + priority` (see [`crate::entry::BOOST_WEIGHT`]).
fn effective_priority(t: &TaskEntry, boosts: &BTreeMap<String, i64>) -> i64 {
    let sum: i64 = t
        .rules
        .tags
        .iter()
        .map(|tag| boosts.get(tag).copied().unwrap_or(0))
        .sum();
    sum.saturating_mul(crate::entry::BOOST_WEIGHT)
        .saturating_add(t.priority_now())
}

/// What a pool must have to be assigned a task: a handler for its kind, and its required
/// resources. Pending tasks are indexed by it, so that a router skips a whole class no idle
/// pool can run instead of visiting its tasks one by one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Need {
    /// The handler kind.
    pub kind: String,
    /// The required resources (sorted, unique).
    pub requires: Vec<String>,
}

impl Need {
    /// A task's need.
    pub fn of(t: &TaskEntry) -> Need {
        Need {
            kind: t.kind.clone(),
            requires: t.rules.requires.clone(),
        }
    }
}

/// The view's indexes over its tasks. Every field is a function of the tasks and the order;
/// [`TaskIndex::add`] and [`TaskIndex::remove`] keep it so one task at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TaskIndex {
    order: Order,
    /// The boosts the keys of `routable` were computed with.
    boosts: BTreeMap<String, i64>,
    /// Pending tasks in routing order (their dependencies met, with no delay).
    routable: OrdSet<RouteKey>,
    /// `routable` again, by what a pool needs to run each.
    needs: OrdMap<Need, OrdSet<RouteKey>>,
    /// Of `routable`, the tasks with each tag (a boost change re-keys them).
    tagged: OrdMap<String, OrdSet<TaskId>>,
    /// Pending tasks whose dependencies are met, with a delay: by not-before, then id.
    timed: OrdSet<(u64, TaskId)>,
    /// Pending tasks waiting for a dependency's success.
    waiting: OrdSet<TaskId>,
    /// Every task that lists dependencies, by each dependency.
    dependents: OrdMap<TaskId, OrdSet<TaskId>>,
    /// Every task with a dedup key, by key.
    dedup: OrdMap<String, OrdSet<TaskId>>,
    /// Pending tasks that failed or were refused before (they wait a retry delay).
    retrying: OrdSet<TaskId>,
    /// Tasks with at least one open attempt, by the peer of each open attempt's worker.
    open: OrdMap<PeerId, OrdSet<TaskId>>,
    /// Tasks in [`TaskState::InputUnavailable`].
    unavailable: OrdSet<TaskId>,
    counts: StateCounts,
}

impl TaskIndex {
    fn counter(&mut self, state: TaskState) -> &mut usize {
        let c = &mut self.counts;
        match state {
            TaskState::Pending => &mut c.pending,
            TaskState::Assigned => &mut c.assigned,
            TaskState::Running => &mut c.running,
            TaskState::InputUnavailable => &mut c.input_unavailable,
            TaskState::Succeeded => &mut c.succeeded,
            TaskState::Failed => &mut c.failed,
            TaskState::Cancelled => &mut c.cancelled,
            // Never derived from a document: counted as pending.
            TaskState::Blocked => &mut c.pending,
        }
    }

    fn add(&mut self, t: &TaskEntry) {
        let state = t.state();
        *self.counter(state) += 1;
        for d in &t.rules.depends_on {
            self.dependents
                .entry(d.clone())
                .or_default()
                .insert(t.id.clone());
        }
        if let Some(k) = &t.rules.dedup_key {
            self.dedup
                .entry(k.clone())
                .or_default()
                .insert(t.id.clone());
        }
        match state {
            TaskState::Pending if !t.dependencies_met() => {
                self.waiting.insert(t.id.clone());
            }
            TaskState::Pending if t.rules.not_before > 0 => {
                self.timed.insert((t.rules.not_before, t.id.clone()));
                if t.failures() + t.refusals() > 0 {
                    self.retrying.insert(t.id.clone());
                }
            }
            TaskState::Pending => {
                let key = RouteKey::of(t, self.order, &self.boosts);
                self.needs
                    .entry(Need::of(t))
                    .or_default()
                    .insert(key.clone());
                self.routable.insert(key);
                for tag in &t.rules.tags {
                    self.tagged
                        .entry(tag.clone())
                        .or_default()
                        .insert(t.id.clone());
                }
                if t.failures() + t.refusals() > 0 {
                    self.retrying.insert(t.id.clone());
                }
            }
            TaskState::InputUnavailable => {
                self.unavailable.insert(t.id.clone());
            }
            _ => {}
        }
        for a in t.attempts.iter().filter(|a| a.is_open()) {
            self.open
                .entry(a.worker.peer.clone())
                .or_default()
                .insert(t.id.clone());
        }
    }

    fn remove(&mut self, t: &TaskEntry) {
        let state = t.state();
        let n = self.counter(state);
        *n = n.saturating_sub(1);
        for d in &t.rules.depends_on {
            if let Some(set) = self.dependents.get_mut(d) {
                set.remove(&t.id);
                if set.is_empty() {
                    self.dependents.remove(d);
                }
            }
        }
        if let Some(k) = &t.rules.dedup_key
            && let Some(set) = self.dedup.get_mut(k)
        {
            set.remove(&t.id);
            if set.is_empty() {
                self.dedup.remove(k);
            }
        }
        match state {
            TaskState::Pending if !t.dependencies_met() => {
                self.waiting.remove(&t.id);
            }
            TaskState::Pending if t.rules.not_before > 0 => {
                self.timed.remove(&(t.rules.not_before, t.id.clone()));
                self.retrying.remove(&t.id);
            }
            TaskState::Pending => {
                let key = RouteKey::of(t, self.order, &self.boosts);
                let need = Need::of(t);
                if let Some(set) = self.needs.get_mut(&need) {
                    set.remove(&key);
                    if set.is_empty() {
                        self.needs.remove(&need);
                    }
                }
                self.routable.remove(&key);
                for tag in &t.rules.tags {
                    if let Some(set) = self.tagged.get_mut(tag) {
                        set.remove(&t.id);
                        if set.is_empty() {
                            self.tagged.remove(tag);
                        }
                    }
                }
                self.retrying.remove(&t.id);
            }
            TaskState::InputUnavailable => {
                self.unavailable.remove(&t.id);
            }
            _ => {}
        }
        for a in t.attempts.iter().filter(|a| a.is_open()) {
            if let Some(set) = self.open.get_mut(&a.worker.peer) {
                set.remove(&t.id);
                if set.is_empty() {
                    self.open.remove(&a.worker.peer);
                }
            }
        }
    }
}

/// Task counts by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateCounts {
    /// Waiting to be routed.
    pub pending: usize,
    /// Assigned, not started.
    pub assigned: usize,
    /// Running.
    pub running: usize,
    /// Waiting for a member that holds the task's document.
    #[serde(default)]
    pub input_unavailable: usize,
    /// Succeeded.
    pub succeeded: usize,
    /// Failed for good.
    pub failed: usize,
    /// Cancelled.
    #[serde(default)]
    pub cancelled: usize,
}

impl QueueView {
    /// Whether `peer` is a member of the queue now (added, not removed since): see
    /// [`QueueView::membership`].
    pub fn is_member(&self, peer: &PeerId) -> bool {
        self.membership.is_member(peer)
    }

    /// Whether `peer`'s role routes and runs tasks (a member or an admin, not a submitter).
    pub fn may_work(&self, peer: &PeerId) -> bool {
        self.membership.role(peer).is_some_and(|r| r.works())
    }

    /// Reads a queue document. Returns `None` if the document is not a queue document.
    /// Malformed task entries are skipped and counted in [`QueueView::malformed`]; the
    /// configuration is read [clamped](QueueConfig::clamped) into its ranges.
    ///
    /// This reads the whole document; [`crate::ViewCache`] keeps a view up to date at the cost
    /// of the changes since its last read.
    pub fn read(doc: &Automerge) -> Option<QueueView> {
        let mut view = QueueView::default();
        let (tasks, bad_claims) = read_root(doc, &mut view)?;
        view.malformed += bad_claims;
        if let Some(tasks) = tasks {
            let (membership, doc_key) = (Arc::clone(&view.membership), view.doc_key.clone());
            let built = view.built.clone();
            let judge = Judge::new(&membership, doc_key.as_deref()).built(built.as_ref());
            let records = Records::read(doc, &judge);
            for item in doc.map_range(&tasks, ..) {
                // A removed peer's submission its removal had not seen.
                if !judge.allows(&item.id(), Right::Any) {
                    continue;
                }
                let id = TaskId::new(item.key.as_ref());
                let value = EntryValue::of(&item.value, item.id());
                let (bad, records) = (&mut view.malformed, Some(&records));
                match read_task_entry_from(
                    doc,
                    &judge,
                    records,
                    value,
                    id.clone(),
                    bad,
                    &mut |_| {},
                ) {
                    Some(entry) => view.set_task(id, Some(entry)),
                    None => view.malformed += 1,
                }
            }
        }
        view.take_rederived();
        Some(view)
    }

    /// Whether this node knows the document's schema version, so may route it and run its
    /// tasks.
    pub fn routable_version(&self) -> bool {
        self.version <= keys::QUEUE_VERSION
    }

    /// Every indexed task by id.
    pub fn tasks(&self) -> &OrdMap<TaskId, Arc<TaskEntry>> {
        &self.tasks
    }

    /// One task's entry.
    pub fn task(&self, id: &TaskId) -> Option<&TaskEntry> {
        self.tasks.get(id).map(|t| &**t)
    }

    /// Replaces (or, with `None`, removes) one task's entry and updates the indexes:
    /// O(log n + the entry's attempts), plus the same for each task that depends on it when its
    /// final state changes (their states follow their dependencies' outcomes).
    pub(crate) fn set_task(&mut self, id: TaskId, entry: Option<TaskEntry>) {
        let mut work = vec![(id, entry)];
        // A hostile peer may write dependency cycles: each task is re-derived a bounded number
        // of times per change.
        let mut budget = 4 * (self.tasks.len() + 1);
        while let Some((id, entry)) = work.pop() {
            let before = self.signature(&id);
            if let Some(old) = self.tasks.get(&id) {
                self.index.remove(old);
            }
            let key = entry.as_ref().and_then(|e| e.rules.dedup_key.clone());
            match entry {
                Some(mut e) => {
                    self.derive(&mut e);
                    self.index.add(&e);
                    self.tasks.insert(id.clone(), Arc::new(e));
                }
                None => {
                    self.tasks.remove(&id);
                }
            }
            if self.signature(&id) == before {
                continue;
            }
            // Its dependents' states follow its outcome, and its copies' survivor may change.
            let mut next: Vec<TaskId> = self
                .index
                .dependents
                .get(&id)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            let key = key.or_else(|| before.as_ref().and_then(|b| b.3.clone()));
            if let Some(set) = key.as_ref().and_then(|k| self.index.dedup.get(k)) {
                for y in set.iter().filter(|t| **t != id) {
                    next.push(y.clone());
                    // A dependency on its duplicate stands for it.
                    if self
                        .tasks
                        .get(y)
                        .is_some_and(|t| t.duplicate_of.as_ref() == Some(&id))
                    {
                        next.extend(self.index.dependents.get(y).into_iter().flatten().cloned());
                    }
                }
            }
            for d in next {
                if budget == 0 {
                    break;
                }
                budget -= 1;
                if let Some(t) = self.tasks.get(&d) {
                    self.rederived.0.push(d.clone());
                    work.push((d, Some(TaskEntry::clone(t))));
                }
            }
        }
    }

    /// What others derive from a task: its final state, whether it ever started, the copy it
    /// is a duplicate of, and its dedup key (`None` if the view does not hold it).
    #[allow(clippy::type_complexity)]
    fn signature(
        &self,
        id: &TaskId,
    ) -> Option<(Option<TaskState>, bool, Option<TaskId>, Option<String>)> {
        self.tasks.get(id).map(|t| {
            let s = t.state();
            (
                s.is_final().then_some(s),
                t.ever_started(),
                t.duplicate_of.clone(),
                t.rules.dedup_key.clone(),
            )
        })
    }

    /// Sets what an entry derives from the rest of the view: its dependencies' outcomes and
    /// the copy it is a duplicate of.
    fn derive(&self, e: &mut TaskEntry) {
        self.fill_dependencies(e);
        e.duplicate_of = self.survivor_of(e);
    }

    /// The copy `e` is a duplicate of, if any. Two tasks with one dedup key are *copies* if
    /// neither names the other among the tasks it was made after (`Rules::dedup_after`: made
    /// without knowing of each other). The key's tasks are taken started first, then by id; a
    /// task survives if it started or no copy taken before it survives; otherwise it is the
    /// first such copy's duplicate. So a started task always survives, and of copies none of
    /// which started the smallest id does.
    fn survivor_of(&self, e: &TaskEntry) -> Option<TaskId> {
        let key = e.rules.dedup_key.as_ref()?;
        if e.ever_started() {
            return None;
        }
        let group = self.index.dedup.get(key)?;
        let mut members: Vec<&TaskEntry> = group
            .iter()
            .filter(|id| **id != e.id)
            .filter_map(|id| self.tasks.get(id).map(|t| &**t))
            .chain(std::iter::once(e))
            .collect();
        members.sort_by(|a, b| (!a.ever_started(), &a.id).cmp(&(!b.ever_started(), &b.id)));
        let copies = |a: &TaskEntry, b: &TaskEntry| {
            !a.rules.dedup_after.contains(&b.id) && !b.rules.dedup_after.contains(&a.id)
        };
        let mut survivors: Vec<&TaskEntry> = Vec::new();
        for t in members {
            let beaten = survivors
                .iter()
                .find(|s| copies(s, t))
                .map(|s| s.id.clone());
            if t.id == e.id {
                return beaten;
            }
            // A started task survives, beaten or not (two copies that both started both ran).
            if beaten.is_none() || t.ever_started() {
                survivors.push(t);
            }
        }
        None
    }

    /// The tasks re-derived since the last call because a dependency's outcome changed.
    pub(crate) fn take_rederived(&mut self) -> Vec<TaskId> {
        std::mem::take(&mut self.rederived.0)
    }

    /// A task's state if it is in the view and final; a duplicate's is its survivor's.
    fn final_state(&self, id: &TaskId) -> Option<TaskState> {
        let t = self.tasks.get(id)?;
        let t = match &t.duplicate_of {
            Some(s) => self.tasks.get(s)?,
            None => t,
        };
        Some(t.state()).filter(|s| s.is_final())
    }

    /// The task a dependency on `id` stands for: its survivor if it is a duplicate.
    pub fn survivor(&self, id: &TaskId) -> TaskId {
        self.tasks
            .get(id)
            .and_then(|t| t.duplicate_of.clone())
            .unwrap_or_else(|| id.clone())
    }

    /// The task a submit of dedup key `key` bumps instead of adding one: the view's task with
    /// that key that is pending or assigned (not started since, not final), the smallest id
    /// if several.
    pub fn dedup_target(&self, key: &str) -> Option<&TaskEntry> {
        self.index
            .dedup
            .get(key)?
            .iter()
            .filter_map(|id| self.task(id))
            .find(|t| matches!(t.state(), TaskState::Pending | TaskState::Assigned))
    }

    /// The tasks whose derived state depends on `id`'s: those that depend on it, and those
    /// with its dedup key.
    pub fn related(&self, id: &TaskId) -> Vec<TaskId> {
        let mut out: Vec<TaskId> = self
            .index
            .dependents
            .get(id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if let Some(key) = self.tasks.get(id).and_then(|t| t.rules.dedup_key.as_ref()) {
            out.extend(self.with_dedup_key(key).into_iter().map(|t| t.id.clone()));
        }
        out.retain(|t| t != id);
        out
    }

    /// The view's tasks with dedup key `key`.
    pub fn with_dedup_key(&self, key: &str) -> Vec<&TaskEntry> {
        self.index
            .dedup
            .get(key)
            .into_iter()
            .flat_map(|s| s.iter())
            .filter_map(|id| self.task(id))
            .collect()
    }

    /// Sets an entry's known dependency outcomes: the recorded ones, and the final states of
    /// its dependencies in this view.
    fn fill_dependencies(&self, e: &mut TaskEntry) {
        if e.rules.depends_on.is_empty() {
            return;
        }
        e.dependencies = e.rules.outcomes.clone();
        for d in &e.rules.depends_on {
            if let Some(s) = self.final_state(d) {
                e.dependencies.insert(d.clone(), s);
            }
        }
        // A follow-up waits on its task as this view holds it: where branches meet, a view
        // can hold the follow-up (from the branch where the task succeeded) and the task not
        // succeeded yet (the success comes with the rest of that branch).
        if let Some(p) = &e.rules.follows
            && self.task(p).is_some()
            && self.final_state(p).is_none()
        {
            e.dependencies.remove(p);
        }
    }

    /// Sets the boosts, re-keying the pending tasks whose tags' boosts changed: O(those
    /// tasks).
    pub(crate) fn set_boosts(&mut self, boosts: BTreeMap<String, i64>) {
        if self.index.boosts == boosts {
            self.boosts = boosts;
            return;
        }
        let changed: BTreeSet<&String> = boosts
            .iter()
            .filter(|(k, v)| self.index.boosts.get(*k) != Some(v))
            .map(|(k, _)| k)
            .chain(
                self.index
                    .boosts
                    .keys()
                    .filter(|k| !boosts.contains_key(*k)),
            )
            .collect();
        let affected: BTreeSet<TaskId> = changed
            .iter()
            .filter_map(|tag| self.index.tagged.get(*tag))
            .flat_map(|s| s.iter().cloned())
            .collect();
        let entries: Vec<Arc<TaskEntry>> = affected
            .iter()
            .filter_map(|id| self.tasks.get(id).cloned())
            .collect();
        for t in &entries {
            self.index.remove(t);
        }
        self.index.boosts = boosts.clone();
        for t in &entries {
            self.index.add(t);
        }
        self.boosts = boosts;
    }

    /// A task's effective priority: the sum of its tags' boosts × 200,000, plus its priority.
    pub fn effective_priority(&self, t: &TaskEntry) -> i64 {
        effective_priority(t, &self.index.boosts)
    }

    /// The routing order between two tasks: urgent first, then greater effective priority,
    /// then submit time (oldest first for [`Order::Fifo`], newest first for [`Order::Lifo`]),
    /// then id.
    pub fn route_cmp(&self, a: &TaskEntry, b: &TaskEntry) -> std::cmp::Ordering {
        let (order, boosts) = (self.index.order, &self.index.boosts);
        RouteKey::of(a, order, boosts).cmp(&RouteKey::of(b, order, boosts))
    }

    /// Re-sorts the routing index if the configured order changed (a switch between FIFO and
    /// LIFO rebuilds it: O(pending), off the hot path).
    pub(crate) fn reorder(&mut self) {
        let order = self.config.order;
        if self.index.order == order {
            return;
        }
        let pending: Vec<Arc<TaskEntry>> = self
            .index
            .routable
            .iter()
            .filter_map(|k| self.tasks.get(&k.id).cloned())
            .collect();
        for t in &pending {
            self.index.remove(t);
        }
        self.index.order = order;
        for t in &pending {
            self.index.add(t);
        }
    }

    /// Pending tasks in routing order, lazily: taking the first k costs O(k log n).
    pub fn routable(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.routable.iter().filter_map(|k| self.task(&k.id))
    }

    /// What pools need to run the routable tasks: one entry per class, with its tasks in
    /// routing order, lazily (see [`Need`]).
    pub fn routable_by_need(
        &self,
    ) -> impl Iterator<Item = (&Need, impl Iterator<Item = &TaskEntry> + '_)> + '_ {
        self.index
            .needs
            .iter()
            .map(|(need, keys)| (need, keys.iter().filter_map(|k| self.task(&k.id))))
    }

    /// Pending tasks whose dependencies are met and that wait for a not-before time, by that
    /// time (then id): the router takes those due by its clock.
    pub fn timed(&self) -> impl Iterator<Item = (u64, &TaskEntry)> + '_ {
        self.index
            .timed
            .iter()
            .filter_map(|(at, id)| Some((*at, self.task(id)?)))
    }

    /// Pending tasks waiting for a dependency's success.
    pub fn waiting_on_dependencies(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.waiting.iter().filter_map(|id| self.task(id))
    }

    /// Pending tasks that failed or were refused before, so wait a retry delay.
    pub fn retrying(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.retrying.iter().filter_map(|id| self.task(id))
    }

    /// Tasks waiting for a member that holds their document.
    pub fn input_unavailable(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        self.index.unavailable.iter().filter_map(|id| self.task(id))
    }

    /// Tasks with an open attempt (of any state: a task with an outcome can still have a run
    /// in flight that another router started), once each.
    pub fn with_open_attempts(&self) -> impl Iterator<Item = &TaskEntry> + '_ {
        let mut ids: Vec<&TaskId> = self.index.open.values().flat_map(|s| s.iter()).collect();
        ids.sort();
        ids.dedup();
        ids.into_iter().filter_map(|id| self.task(id))
    }

    /// Peers whose workers hold open attempts, with how many tasks each.
    pub fn open_peers(&self) -> impl Iterator<Item = (&PeerId, usize)> + '_ {
        self.index.open.iter().map(|(p, s)| (p, s.len()))
    }

    /// Pending tasks in the order the router should take them: urgent first, then by priority
    /// (greater first), then by submit time (per the queue's [`Order`]), then by id.
    pub fn pending(&self) -> Vec<&TaskEntry> {
        self.routable().collect()
    }

    /// Open (not ended) attempts by worker: O(open attempts).
    pub fn open_attempts(&self) -> BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> {
        let mut open: BTreeMap<&WorkerId, Vec<(&TaskEntry, &Attempt)>> = BTreeMap::new();
        for task in self.with_open_attempts() {
            for a in task.attempts.iter().filter(|a| a.is_open()) {
                open.entry(&a.worker).or_default().push((task, a));
            }
        }
        open
    }

    /// Open attempts assigned to the workers of `peer`: O(its open attempts).
    pub fn open_attempts_of<'a>(
        &'a self,
        peer: &'a PeerId,
    ) -> impl Iterator<Item = (&'a TaskEntry, &'a Attempt)> + 'a {
        self.index
            .open
            .get(peer)
            .into_iter()
            .flat_map(|s| s.iter())
            .filter_map(|id| self.task(id))
            .flat_map(move |t| {
                t.attempts
                    .iter()
                    .filter(move |a| a.is_open() && &a.worker.peer == peer)
                    .map(move |a| (t, a))
            })
    }

    /// Task counts by state in this epoch document: O(1), kept by every change.
    pub fn counts(&self) -> StateCounts {
        self.index.counts.clone()
    }

    /// Task counts by state over the queue's whole life: [`QueueView::counts`] plus the
    /// tasks that ended in earlier epochs ([`QueueView::retired`]).
    pub fn total_counts(&self) -> StateCounts {
        let mut c = self.counts();
        c.succeeded = c
            .succeeded
            .saturating_add(usize::try_from(self.retired.succeeded).unwrap_or(usize::MAX));
        c.failed = c
            .failed
            .saturating_add(usize::try_from(self.retired.failed).unwrap_or(usize::MAX));
        c.cancelled = c
            .cancelled
            .saturating_add(usize::try_from(self.retired.cancelled).unwrap_or(usize::MAX));
        c
    }
}

/// Reads everything but the tasks into `view`; returns the tasks map's id (`None` if the
/// document has none) and the number of router claims ignored as malformed (the caller counts
/// them in [`QueueView::malformed`]), or `None` if the document is not a queue.
pub(crate) fn read_root(doc: &Automerge, view: &mut QueueView) -> Option<(Option<ObjId>, usize)> {
    let mut schema_ok = false;
    let mut tasks = None;
    let mut config = None;
    let mut members = None;
    let mut creator = None;
    let mut creator_key = None;
    let mut queue_id = None;
    let mut ops: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    view.name.clear();
    view.paused = false;
    view.version = 1;
    view.epoch = 0;
    view.origin = None;
    let mut prev = None;
    let mut prev_heads = Vec::new();
    let mut paused = None;
    let mut built = None;
    for item in doc.map_range(ROOT, ..) {
        match (item.key.as_ref(), &item.value) {
            (keys::EPOCH, v) => view.epoch = am::as_uint(v).unwrap_or(0),
            (keys::ORIGIN, v) => view.origin = am::as_str(v).map(crate::QueueId::new),
            (keys::PREV, v) => prev = am::as_str(v).map(str::to_owned),
            (keys::PREV_HEADS, v) => {
                prev_heads = am::as_str(v).map(chain::decode_heads).unwrap_or_default()
            }
            (keys::SCHEMA, v) => schema_ok = am::as_str(v) == Some(keys::QUEUE_SCHEMA),
            (keys::VERSION, v) => view.version = am::as_uint(v).unwrap_or(u64::MAX),
            (keys::NAME, v) => view.name = am::as_str(v).unwrap_or_default().to_owned(),
            (keys::PAUSED, _) => paused = Some(item.id()),
            (keys::BUILT, _) => {
                built = match item.id() {
                    ObjId::Id(counter, actor, _) => Some((counter, actor)),
                    ObjId::Root => None,
                }
            }
            (keys::TASKS, ValueRef::Object(ObjType::Map)) => tasks = Some(item.id()),
            (keys::CONFIG, ValueRef::Object(ObjType::Map)) => config = Some(item.id()),
            (keys::MEMBERS, ValueRef::Object(ObjType::Map)) => members = Some(item.id()),
            (keys::CREATOR, v) => creator = am::as_str(v).map(PeerId::new),
            (keys::CREATOR_KEY, v) => {
                creator_key = am::as_str(v)
                    .and_then(|k| hex::decode(k).ok())
                    .and_then(|k| k.try_into().ok())
            }
            (keys::QUEUE_ID, v) => queue_id = am::as_str(v).map(crate::QueueId::new),
            (k, _) if k.starts_with(membership::OP_PREFIX) => {
                if let Some(bytes) = stored_op(doc, k) {
                    ops.insert(k.to_owned(), bytes);
                }
            }
            _ => {}
        }
    }
    if !schema_ok {
        return None;
    }
    view.prev = prev.map(|doc| chain::Prev {
        doc,
        heads: prev_heads,
    });
    view.seals = chain::read_seals(doc);
    view.latest = chain::read_latest(doc);
    view.retired = chain::read_retired(doc);
    view.members.clear();
    if let Some(members) = members {
        for item in doc.map_range(&members, ..) {
            if !matches!(item.value, ValueRef::Object(ObjType::Map)) {
                continue;
            }
            let obj = item.id();
            let mut m = Member {
                role: String::new(),
                addrs: vec![],
            };
            for f in doc.map_range(&obj, ..) {
                match (f.key.as_ref(), &f.value) {
                    (keys::ROLE, v) => m.role = am::as_str(v).unwrap_or_default().to_owned(),
                    (keys::ADDRS, ValueRef::Object(ObjType::List)) => {
                        m.addrs = am::list_strings(doc, &f.id())
                    }
                    _ => {}
                }
            }
            view.members.insert(PeerId::new(item.key.as_ref()), m);
        }
    }
    let creator = creator.unwrap_or_else(|| PeerId::new(""));
    // A queue made before memberships were signed: the members it lists count.
    let legacy: Option<BTreeSet<PeerId>> = creator_key
        .is_none()
        .then(|| view.members.keys().cloned().collect());
    let lineage = chain::read_lineage(doc);
    view.doc_key = match view.epoch {
        0 => queue_id.as_ref().map(|q| q.as_str().to_owned()),
        _ => lineage.last().map(|l| l.doc.clone()),
    };
    let queue = view.origin.clone().or(queue_id);
    view.membership = Arc::new(view.membership.with_stored(
        queue.as_ref(),
        &creator,
        creator_key,
        &ops,
        legacy.as_ref(),
    ));
    // Everything below is judged by who wrote it (`judge.rs`).
    let membership = Arc::clone(&view.membership);
    view.built = built.filter(|_| view.epoch > 0);
    let doc_key = view.doc_key.clone();
    let built = view.built.clone();
    let judge = Judge::new(&membership, doc_key.as_deref()).built(built.as_ref());
    view.paused = paused.is_some_and(|_| {
        am::judged(doc, &ROOT, keys::PAUSED, &judge, Right::Work)
            .and_then(|v| am::value_bool(&v))
            .unwrap_or(false)
    });
    let (config, boosts) = config
        .map(|c| (read_config(doc, &c, &judge), read_boosts(doc, &judge)))
        .unwrap_or_default();
    view.config = config;
    view.reorder();
    view.set_boosts(boosts);
    view.schedules = crate::schedule::read_schedules(doc, &judge);
    let (claims, bad_claims) = read_claims(doc, &judge);
    view.claims = claims;
    view.router = view.claims.iter().max().cloned();
    Some((tasks, bad_claims))
}

/// Every membership operation stored in `doc`: root key → bytes.
pub(crate) fn stored_ops(doc: &Automerge) -> BTreeMap<String, Vec<u8>> {
    doc.map_range(ROOT, membership::OP_PREFIX.to_owned()..)
        .take_while(|i| i.key.starts_with(membership::OP_PREFIX))
        .filter_map(|i| Some((i.key.to_string(), stored_op(doc, &i.key)?)))
        .collect()
}

/// The bytes stored under root key `key` that are the membership operation it names (of
/// concurrent values, the first that is).
fn stored_op(doc: &Automerge, key: &str) -> Option<Vec<u8>> {
    let values = doc.get_all(ROOT, key).ok()?;
    values.into_iter().find_map(|(v, _)| match v {
        automerge::Value::Scalar(s) => match s.as_ref() {
            automerge::ScalarValue::Bytes(b) if membership::names(key, b) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    })
}

/// The configuration of a queue document, read alone (without the tasks): `None` if the
/// document has no config map.
pub(crate) fn read_config_of(doc: &Automerge) -> Option<QueueConfig> {
    // Read by writers (a submission's default attempts, a settings change), not by views:
    // every value counts here.
    am::object(doc, &ROOT, keys::CONFIG, ObjType::Map).map(|c| read_config(doc, &c, &Judge::open()))
}

/// The boosts written in the config map: valid tags only, clamped to
/// `[-MAX_BOOST, MAX_BOOST]`, zeros left out.
fn read_boosts(doc: &Automerge, judge: &Judge<'_>) -> BTreeMap<String, i64> {
    let max = crate::entry::MAX_BOOST;
    crate::settings::read_boost_registers(doc, judge)
        .into_iter()
        .map(|(tag, r)| (tag, r.b.clamp(-max, max)))
        .filter(|(_, b)| *b != 0)
        .collect()
}

/// The configuration as written, [clamped](QueueConfig::clamped) into its ranges: every replica
/// derives the same timers from the same document, whatever a peer wrote.
fn read_config(doc: &Automerge, obj: &ObjId, judge: &Judge<'_>) -> QueueConfig {
    let mut c = QueueConfig::default();
    for item in doc.map_range(obj, ..) {
        if !crate::settings::CONFIG_FIELDS.contains(&item.key.as_ref()) {
            continue;
        }
        // A value an admin did not write does not count (nor, then, does one it overwrote).
        let v = match item.conflict || !judge.allows(&item.id(), Right::Admin) {
            false => item.value.clone().into_value(),
            true => match am::judged(doc, obj, item.key.as_ref(), judge, Right::Admin) {
                Some(v) => v,
                None => continue,
            },
        };
        let u = am::value_uint(&v);
        let small = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        match item.key.as_ref() {
            "heartbeat_ms" => c.heartbeat_ms = u.unwrap_or(c.heartbeat_ms),
            "takeover_after_ms" => c.takeover_after_ms = u.unwrap_or(c.takeover_after_ms),
            "settle_ms" => c.settle_ms = u.unwrap_or(c.settle_ms),
            "pool_heartbeat_ms" => c.pool_heartbeat_ms = u.unwrap_or(c.pool_heartbeat_ms),
            "lease_ms" => c.lease_ms = u.unwrap_or(c.lease_ms),
            "retry_backoff_ms" => c.retry_backoff_ms = u.unwrap_or(c.retry_backoff_ms),
            "retry_backoff_max_ms" => c.retry_backoff_max_ms = u.unwrap_or(c.retry_backoff_max_ms),
            "rate_interval_ms" => c.rate_interval_ms = u.unwrap_or(c.rate_interval_ms),
            "timeout_ms" => c.timeout_ms = u.unwrap_or(c.timeout_ms),
            // An unreadable map leaves the default (retry every kind), as a member can write
            // anything.
            "failure_policy" => {
                if let Some(p) = am::value_str(&v).and_then(|t| serde_json::from_str(t).ok()) {
                    c.failure_policy = p;
                }
            }
            "max_attempts" => c.max_attempts = u.map_or(c.max_attempts, small),
            "concurrency" => c.concurrency = u.map_or(c.concurrency, small),
            "order" => c.order = am::value_str(&v).and_then(Order::parse).unwrap_or(c.order),
            _ => {}
        }
    }
    c.clamped()
}

/// Every router claim that counts, in order, and how many were ignored.
///
/// Terms rise one at a time: a claim at term `t` counts only if it names the claim it
/// supersedes at `t - 1` and that claim counts. The chain starts at a claim at term 1 or at a
/// sealer's claim the document's lineage names (its own epoch's and the ones before).
/// A claim that skips a term, names a
/// claim that does not count, is above [`MAX_TERM`], or does not read, is ignored: no
/// member can write a term nobody can out-claim. Linear in the claims written (plus a sort).
pub(crate) fn read_claims<R: ReadDoc>(doc: &R, judge: &Judge<'_>) -> (Vec<Claim>, usize) {
    let mut bad = 0;
    // The bases of the chain: the sealers' claims the document's lineage names, its own
    // epoch's and those before it (a claim carried from a sealed epoch chains through that
    // epoch's sealer). None in epoch 0.
    let bases: BTreeSet<Claim> = chain::read_lineage(doc)
        .into_iter()
        .map(|l| l.claim)
        .filter(Claim::is_valid)
        .collect();
    let mut counted: BTreeSet<Claim> = bases.clone();
    // The router record: the successor's base, written when it was built, and the claims of
    // documents written before claims were chained. A value counts only as a base: at term 1,
    // or one the lineage names.
    for obj in am::all_objects(doc, &ROOT, keys::ROUTER, ObjType::Map) {
        if !judge.allows(&obj, Right::Work) {
            bad += 1;
            continue;
        }
        let claim = am::uint(doc, &obj, keys::TERM)
            .zip(am::string(doc, &obj, keys::PEER))
            .map(|(term, peer)| Claim::new(term, PeerId::new(peer)));
        match claim {
            Some(c) if c.term == 1 || bases.contains(&c) => {
                counted.insert(c);
            }
            _ => bad += 1,
        }
    }
    let records = chained_records(doc, judge, &mut bad);
    bad += extend_chain(&mut counted, records);
    (counted.into_iter().collect(), bad)
}

/// The chained claim records of a queue document, as `(term, claimant, superseded claimant)`;
/// one that does not read adds to `bad`.
pub(crate) fn chained_records<R: ReadDoc>(
    doc: &R,
    judge: &Judge<'_>,
    bad: &mut usize,
) -> Vec<(u64, PeerId, Option<PeerId>)> {
    let mut records = Vec::new();
    for map in am::all_objects(doc, &ROOT, keys::CLAIMS, ObjType::Map) {
        for item in doc.map_range(&map, ..) {
            // A claim's key names its term and claimant: written once, never overwritten.
            if !judge.allows(&item.id(), Right::Work) {
                *bad += 1;
                continue;
            }
            match am::as_str(&item.value).and_then(packed::decode::<PackedClaim>) {
                Some(r) => records.push((r.t, PeerId::new(r.c), r.p.map(PeerId::new))),
                None => *bad += 1,
            }
        }
    }
    records
}

/// Adds to `counted` the chained claims of `records` that count: in the order of their
/// terms, each counts if it names a claim that counts at the term below it (or is at term 1
/// and names none), and is at most [`MAX_TERM`]. Returns how many did not count.
pub(crate) fn extend_chain(
    counted: &mut BTreeSet<Claim>,
    mut records: Vec<(u64, PeerId, Option<PeerId>)>,
) -> usize {
    let mut bad = 0;
    records.sort();
    records.dedup();
    for (term, peer, prev) in records {
        let named = match (term.checked_sub(1), prev) {
            (Some(0), None) => true,
            (Some(below), Some(prev)) if below > 0 => counted.contains(&Claim::new(below, prev)),
            _ => false,
        };
        if named && term <= MAX_TERM {
            counted.insert(Claim::new(term, peer));
        } else {
            bad += 1;
        }
    }
    bad
}

/// A chained router claim as the queue document stores it (`claims/TERM/PEER`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct PackedClaim {
    /// The term.
    pub(crate) t: u64,
    /// The claimant.
    pub(crate) c: String,
    /// The claimant of the claim it supersedes, at the term below (none at term 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) p: Option<String>,
    /// When it was written (unix ms).
    pub(crate) a: u64,
}
