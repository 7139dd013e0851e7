//! The per-queue state the node keeps (`Queue`) and the state of its epochs: sealed documents it
//! carries from (`Sealed`), a rotation in flight (`Rotating`), what a losing branch carries from
//! (`LoserBases`), with their bounds and the small pure helpers over lineages and scopes. Asks
//! nothing of the others: `Core` and its turn modules read and change these.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use automerge::ChangeHash;
use piecework_queue_doc::epoch::{self, Latest, Link};
use piecework_queue_doc::{Claim, QueueId, QueueView, ViewCache};
use piecework_replica::{DocId, Scope};
use piecework_router::{Action as RouterAction, Router};

use crate::{CommandId, max_claim};

/// A listing waiting for the store's finished tasks ([`crate::Io::ListFinished`]).
#[derive(Debug)]
pub(super) struct ListWait {
    pub(super) queue: QueueId,
    pub(super) state: Option<piecework_queue_doc::TaskState>,
    pub(super) limit: usize,
    pub(super) cursor: Option<piecework_queue_doc::TaskId>,
}

/// A rotation whose successor is being built ([`Io::Rotate`]).
#[derive(Debug)]
pub(super) struct Rotating {
    pub(super) queue: QueueId,
    /// The document it seals.
    pub(super) prev: DocId,
    pub(super) successor: DocId,
    pub(super) epoch: u64,
    pub(super) claim: Claim,
    /// The heads of the copy it is built from: the seal's.
    pub(super) heads: Vec<ChangeHash>,
    /// Catch-ups asked for so far (`Config::catch_ups`).
    pub(super) catch_ups: u32,
    /// The last catch-up is out, and the queue frozen until it is back (see [`Queue::frozen`]),
    /// or until this deadline ([`FROZEN_AT_MOST`]).
    pub(super) last: Option<Instant>,
}

/// Changes of sealed documents carried per turn, at most, when what they hold was never shown
/// in this node's view (see [`Core::carry_round`]): the rest waits for the next turns, so that
/// a burst of late writes does not hold up the node's heartbeats.
pub(super) const CARRY_PER_TURN: usize = 64;

/// The longest a queue stays frozen for a rotation's last catch-up: past it, the rotation is
/// dropped (its answer, if it ever comes, is ignored) and the queue goes on.
pub(super) const FROZEN_AT_MOST: Duration = Duration::from_secs(2);

/// A sealed epoch this node holds.
#[derive(Debug)]
pub(super) struct Sealed {
    /// The document its late writes are carried into.
    pub(super) into: DocId,
    /// That document's epoch number.
    pub(super) into_epoch: u64,
    /// Its heads carried so far.
    pub(super) carried: Vec<ChangeHash>,
    /// It changed since the last carry.
    pub(super) dirty: bool,
    /// Its epoch number.
    pub(super) epoch: u64,
    /// When this node moved past it.
    pub(super) since: Instant,
    /// Its target was retired here, after this node had carried it up to `carried` along
    /// the chain: it now carries into the current document, and a task it indexed at
    /// `carried` was carried along already (so the chain's documents are not needed).
    pub(super) forwarded: bool,
    /// A carry waiting for documents of the chain (or their changes) is looked at again
    /// then, not at every turn: each look asks the members, whose answers make turns.
    pub(super) retry_at: Option<Instant>,
}

/// A carry waits for a document (or its changes) to arrive.
pub(super) struct Waiting;

/// What a losing branch's carry reads besides the target's chain (`Core::loser_bases`).
pub(super) struct LoserBases {
    /// The documents the branch carried from or was built from that this node holds, each
    /// with what the target's chain absorbed of it.
    pub(super) docs: Vec<(DocId, epoch::Cover)>,
    /// The target's chain absorbed all the branch absorbed of them: a task entry the branch
    /// took from one of them (its build, a carry) needs no carrying.
    pub(super) all_absorbed: bool,
}

/// How long a carry waiting for documents of the chain, or for changes of them, waits before
/// it looks (and asks) again, unless they arrive.
pub(super) const CARRY_RETRY: Duration = Duration::from_secs(1);

/// Sealed epochs a queue holds past their carry, at most, besides its first document: the
/// oldest clean ones are retired before `Config::epoch_retain` when more are held. A queue
/// that rotates every second or two would otherwise hold a minute of history in memory
/// (some 4 KiB per task). Three nodes at 5,000 live tasks, rotating every 2–3 s: peak RSS
/// 168–201 MiB per node with 3 held, 201–340 MiB with 8 (docs/benchmarks.md).
pub(super) const MAX_SEALED_HELD: usize = 3;

/// Bound on the announced epoch documents a queue keeps to look at.
pub(super) const MAX_ANNOUNCED: usize = 16;

/// Bound on the documents remembered as false epoch announcements, per queue.
pub(super) const MAX_REJECTED_EPOCHS: usize = 64;

/// Bound on the carrying rounds of one turn ([`Core::carry_late`]).
pub(super) const MAX_CARRY_ROUNDS: usize = 4;

/// How many pending tasks per worker of this node have their documents read ahead of their
/// start: those first in routing order. A pending task's document otherwise stays on disk.
pub(super) const PREFETCH_PER_WORKER: usize = 8;

/// The documents of the branch `own` (a lineage, as [`epoch::read_lineage`] gives it) that
/// the lineage `target` does not share: what a node on `own` wrote since the fork. Never the
/// queue's first document.
pub(super) fn branch_since_fork(
    own: &[Link],
    target: &[Link],
    root: Option<&DocId>,
) -> Vec<(DocId, u64)> {
    own.iter()
        // Not on the target's chain: a link older than the target's lineage keeps (cut at
        // `MAX_LINEAGE`) is on it, as `epoch::on_lineage` says.
        .filter(|l| !epoch::on_lineage(target, &l.doc, Some(l.epoch)))
        .filter_map(|l| DocId::parse(&l.doc).map(|d| (d, l.epoch)))
        .filter(|(d, _)| Some(d) != root)
        .collect()
}

/// The newest document of `own` (a lineage) that is on `target`'s chain too: where the two
/// branches forked. `None` if they share only the queue's first document.
pub(super) fn fork_of(own: &[Link], target: &[Link]) -> Option<DocId> {
    own.iter()
        .filter(|l| epoch::on_lineage(target, &l.doc, Some(l.epoch)))
        .max_by_key(|l| l.epoch)
        .and_then(|l| DocId::parse(&l.doc))
}

#[derive(Debug)]
pub(super) struct Queue {
    /// The current epoch's document: where this node writes, and what its view reads.
    pub(super) doc: DocId,
    /// The queue's first document (epoch 0), whose id is the queue's: the group its members
    /// and task documents are scoped to.
    pub(super) root: DocId,
    /// The current epoch's number.
    pub(super) epoch: u64,
    /// Sealed epoch documents this node still holds, and where their late writes are carried:
    /// at most the epochs of the last `Config::epoch_retain`, plus losers of double seals.
    pub(super) sealed: BTreeMap<DocId, Sealed>,
    /// Epoch documents being fetched: a few (one per announced successor).
    pub(super) fetching: BTreeSet<DocId>,
    /// Epoch documents a fetch found nowhere: a move stops waiting for them, a carry that
    /// needs one waits without asking again; forgotten (asked for again) when a peer connects
    /// (at most [`MAX_REJECTED_EPOCHS`]).
    pub(super) unavailable: BTreeSet<DocId>,
    /// Epoch documents of this queue that peers' heartbeats say they are on, other than this
    /// node's current one: at most [`MAX_ANNOUNCED`], forgotten once placed.
    pub(super) announced: BTreeSet<DocId>,
    /// The successor this node waits to take until it holds what the seal covered, once the
    /// members were asked for it (asked again when a peer connects), and until when it waits
    /// ([`BEHIND_WAIT`]; `None` once that passed: it moves without).
    pub(super) asked_behind: Option<(DocId, Option<Instant>)>,
    /// Documents announced as epochs of this queue that are not, or that are older epochs of
    /// its chain: never looked at again (at most [`MAX_REJECTED_EPOCHS`]).
    pub(super) rejected: BTreeSet<DocId>,
    /// Successors found to continue their predecessor as sealed
    /// ([`epoch::check_successor`]): not checked again. Forgotten with the queue.
    pub(super) verified: BTreeSet<DocId>,
    pub(super) router: Router,
    pub(super) cache: ViewCache,
    pub(super) view: Arc<QueueView>,
    pub(super) topic: String,
    /// The successor whose view is being read off this thread before the node moves to it
    /// ([`RotateWork::Read`]), and the view once read.
    pub(super) priming: Option<DocId>,
    pub(super) primed: Option<(DocId, ViewCache)>,
    /// While the sealer's last catch-up is out: the view stays as it is and neither the router
    /// nor the pool writes the document, so that the successor then holds all the view showed
    /// and every change after it is a late write no view showed, carried over the next turns.
    pub(super) frozen: bool,
    /// Router actions (other than heartbeats) held while frozen, with when they were decided
    /// (unix ms).
    pub(super) deferred: Vec<(u64, RouterAction)>,
    /// The document `view` was read from: `doc` but between a move and the next refresh.
    pub(super) view_doc: DocId,
    /// The epoch document this reopened queue resumes at ([`Config::resume`]), while it is
    /// read back: the queue follows no chain until then, or it would fetch every epoch since
    /// its first document.
    pub(super) resuming: Option<DocId>,
    /// The member that admitted this node with an invite (this start): synced with although
    /// the documents this node read so far may not list it (it joined after the queue's
    /// first document was sealed).
    pub(super) introducer: Option<piecework_queue_doc::PeerId>,
}

/// An epoch document's scope: announced to the queue's members, and sent to them alone (a
/// member that learns of an epoch from a heartbeat fetches it from the members).
pub(super) fn epoch_scope(root: &DocId) -> Scope {
    Scope {
        group: root.clone(),
        announce: true,
        requestable: false,
    }
}

/// Notes an epoch document a peer's heartbeat says it is on; true if this node should look at
/// it (it is new here, or an earlier fetch of it ended without it).
pub(super) fn announce(q: &mut Queue, l: &Latest) -> bool {
    let Some(d) = DocId::parse(&l.doc) else {
        return false;
    };
    if d == q.doc || q.sealed.contains_key(&d) || q.rejected.contains(&d) || q.fetching.contains(&d)
    {
        return false;
    }
    if q.announced.len() >= MAX_ANNOUNCED && !q.announced.contains(&d) {
        return false;
    }
    q.announced.insert(d);
    true
}

/// A queue's first document's scope: announced to its members, and sent to them alone (a
/// peer that is not one gets it by presenting an invite).
pub(super) fn queue_scope(doc: &DocId) -> Scope {
    Scope {
        group: doc.clone(),
        announce: true,
        requestable: false,
    }
}

/// Whether a document's heads are exactly `carried` (in any order).
pub(super) fn same_heads(mut heads: Vec<ChangeHash>, carried: &[ChangeHash]) -> bool {
    if heads.len() != carried.len() {
        return false;
    }
    heads.sort_unstable();
    let mut c = carried.to_vec();
    c.sort_unstable();
    heads == c
}

pub(super) fn see(seen: &mut BTreeMap<QueueId, Claim>, queue: &QueueId, claim: &Claim) {
    let best = max_claim(seen.get(queue), Some(claim));
    if let Some(best) = best {
        seen.insert(queue.clone(), best);
    }
}

/// A create or a join waiting for its queue document to be on disk up to `version`
/// ([`Core::check_opens`]).
#[derive(Debug)]
pub(super) struct OpenWait {
    pub(super) cmd: CommandId,
    pub(super) queue: QueueId,
    pub(super) doc: DocId,
    pub(super) version: u64,
    /// The view to answer a join with; `None` for a create.
    pub(super) view: Option<Arc<QueueView>>,
}
