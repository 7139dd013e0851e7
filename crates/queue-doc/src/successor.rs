//! Which successor documents a member follows ([`check_successor`]) and which seals stop a
//! router from sealing ([`counted_seals`]): a seal counts only under a claim that counts, and
//! a successor is followed only if it indexes every task live at its seal's heads.

use automerge::{Automerge, ChangeHash, ObjType, ROOT, ReadDoc};

use crate::am;
use crate::cache::ViewCache;
use crate::chain::{Seal, read_seals};
use crate::epoch::{indexes, known_heads, read_prev, seal_heads, task_state};
use crate::ids::{Claim, TaskId};
use crate::keys;

/// The seals of `doc` whose sealer's claim counts in it (see [`check_successor`]): a seal
/// under a claim that does not count is a member's forgery, never followed, and must not stop
/// the router from sealing the document itself. Linear in the seals and claims written.
pub fn counted_seals<R: ReadDoc>(doc: &R) -> Vec<Seal> {
    let seals = read_seals(doc);
    if seals.is_empty() {
        return seals;
    }
    let (counted, _) = crate::view::read_claims(doc, &crate::judge::Judge::open());
    seals
        .into_iter()
        .filter(|s| counted.contains(&s.claim))
        .collect()
}

/// What [`check_successor`] found of a successor document, judged against the document it
/// continues.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SuccessorCheck {
    /// The predecessor holds no seal naming the successor yet, or not every change the seal
    /// covered: judge again once they are here.
    #[error("the seal naming it, or what the seal covered, is not here yet")]
    NotYet,
    /// The seal's claim does not count in the predecessor: whoever sealed was not a router
    /// there (a claim that skips a term, above the bound, or never written).
    #[error("its seal's claim {0} does not count in the document it continues")]
    SealerNotRouter(Claim),
    /// The successor does not index a task that was live at the seal's heads: following it
    /// would hide that task.
    #[error("it drops task {0}, live in the document it continues at the seal")]
    DropsLive(TaskId),
}

/// Whether `succ`, a document named `succ_id` that says it continues `prev`, may be
/// followed: `prev` holds a seal naming it under a claim that counts in `prev` (its router
/// sealed it), and `succ` indexes every task that was live in `prev` at the seal's heads
/// (whatever it is now: the verdict is the same at every member holding those heads). A
/// successor that fails either check is forged (or broken) and never followed: its seal
/// cannot hide live tasks.
///
/// `cache` is a view cache of `prev` (the caller's, or a new one): it is refreshed here.
///
/// Work: the refresh, the changes written after the seal's heads (decoded once), and, for the
/// tasks those changes touched that `succ` does not index, a copy of `prev` at the seal's
/// heads to read them there. A task no later change touched reads now as it read at the heads,
/// in the view. Once per successor: the caller keeps the verdict.
pub fn check_successor(
    prev: &Automerge,
    cache: &mut ViewCache,
    succ: &Automerge,
    succ_id: &str,
) -> Result<(), SuccessorCheck> {
    let Some(seal) = read_seals(prev)
        .into_iter()
        .find(|s| s.successor == succ_id)
    else {
        return Err(SuccessorCheck::NotYet);
    };
    let (counted, _) = crate::view::read_claims(prev, &crate::judge::Judge::open());
    if !counted.contains(&seal.claim) {
        return Err(SuccessorCheck::SealerNotRouter(seal.claim));
    }
    let heads = seal_heads(prev, succ_id)
        .filter(|h| !h.is_empty())
        .or_else(|| read_prev(succ).map(|p| p.heads))
        .unwrap_or_default();
    if heads.is_empty() || known_heads(prev, &heads).len() < heads.len() {
        return Err(SuccessorCheck::NotYet);
    }
    // Judged as the seal saw the document: a task live then and final now (here) was live for
    // the sealer too, and a successor built at the seal's heads indexes it; judging by the
    // state here would make the verdict depend on how far each member had read.
    let view = cache.refresh(prev).cloned();
    let touched = view
        .as_ref()
        .and_then(|_| cache.touched_since(prev, &heads));
    let (Some(view), Some(touched)) = (view, touched) else {
        // The task index was replaced after the seal (or does not read): every task is
        // read at the seal's heads.
        return check_at_heads(prev, &heads, succ, None);
    };
    // A task's state can follow others' (its dependencies, the copies of its dedup key): the
    // tasks related to a touched one, transitively, are judged at the heads too.
    let mut touched = touched;
    let mut todo: Vec<TaskId> = touched.iter().cloned().collect();
    while let Some(t) = todo.pop() {
        for r in view.related(&t) {
            if touched.insert(r.clone()) {
                todo.push(r);
            }
        }
    }
    for t in view.tasks().values() {
        if !touched.contains(&t.id) && !t.state().is_final() && !indexes(succ, &t.id) {
            return Err(SuccessorCheck::DropsLive(t.id.clone()));
        }
    }
    let touched: Vec<TaskId> = touched.into_iter().filter(|t| !indexes(succ, t)).collect();
    if touched.is_empty() {
        return Ok(());
    }
    check_at_heads(prev, &heads, succ, Some(&touched))
}

/// The check on a copy of `prev` at `heads`: every task of `only` (all if `None`) live there
/// is indexed by `succ`.
fn check_at_heads(
    prev: &Automerge,
    heads: &[ChangeHash],
    succ: &Automerge,
    only: Option<&[TaskId]>,
) -> Result<(), SuccessorCheck> {
    let Ok(at) = prev.fork_at(heads) else {
        return Err(SuccessorCheck::NotYet);
    };
    // States derived across tasks (dependencies, dedup copies) need the whole view there.
    let view = crate::QueueView::read(&at);
    let live = |task: &TaskId| {
        view.as_ref()
            .and_then(|v| v.task(task))
            .map(|t| t.state())
            .or_else(|| task_state(&at, task))
            .is_some_and(|s| !s.is_final())
    };
    let dropped = match only {
        Some(tasks) => tasks.iter().find(|t| live(t)).cloned(),
        None => am::all_objects(&at, &ROOT, keys::TASKS, ObjType::Map)
            .iter()
            .flat_map(|tasks| {
                at.map_range(tasks, ..)
                    .map(|i| TaskId::new(i.key.to_string()))
            })
            .find(|t| live(t) && !indexes(succ, t)),
    };
    match dropped {
        Some(task) => Err(SuccessorCheck::DropsLive(task)),
        None => Ok(()),
    }
}
