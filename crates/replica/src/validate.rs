//! Checks on the changes a peer sends, before Automerge sees them. Automerge 0.12 panics on some
//! changes a peer can craft, or accepts them and panics at a later read of the document:
//!
//! - an operation counter at or above `u32::MAX` (its own, or one it names as an object, a list
//!   element or a predecessor);
//! - a change of an actor the document does not know whose number (`seq`) is not 1, or that
//!   names an actor the document does not know;
//! - a change whose operation ids are not above every operation of the changes it depends on
//!   (ids reused).
//!
//! Honest changes never do any of these: a change's first operation follows the greatest of
//! its dependencies', an actor's first change is numbered 1, and Automerge numbers operations
//! far below `u32::MAX` in any document Piecework bounds. A message holding such a change is
//! rejected whole, as one Automerge cannot decode is.
//!
//! Automerge's own parser panics on a counter above `u32::MAX` in a change's columns; the
//! parse is caught (see [`parse`]).
//!
//! What is checked when: the counters always; the actors and the ids once every dependency is
//! in the document or earlier in the same message. A change with a dependency not here yet is
//! kept aside by Automerge and applied when it arrives, without these two checks: a member can
//! still reach those panics that way (see `docs/security.md`).
//!
//! Work: each change's operations once, one lookup per dependency and per actor named.

use std::collections::{BTreeMap, BTreeSet};

use automerge::legacy::{ElementId, Key, ObjectId, OpId};
use automerge::{ActorId, Automerge, Change, ChangeHash};

use crate::chunks::{self, Kind};

/// Operation counters must stay below this (Automerge keeps them in 32 bits).
const COUNTER_BOUND: u64 = u32::MAX as u64;

/// Why a peer's change is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Invalid {
    /// An operation counter at or above `u32::MAX`.
    #[error("a change with an operation counter of {0}, at or above 2^32 - 1")]
    Counter(u64),
    /// Operation ids not above those of a change it depends on.
    #[error("a change whose operations start at {start}, not above its dependency's {max}")]
    ReusedOps {
        /// The change's first operation counter.
        start: u64,
        /// The greatest operation counter of one of its dependencies.
        max: u64,
    },
    /// A change numbered `seq` by an actor the document does not know (a first change is 1).
    #[error("a change numbered {0} by an actor the document does not know")]
    UnknownAuthor(u64),
    /// A change naming an actor the document does not know.
    #[error("a change naming an actor the document does not know")]
    UnknownActor,
    /// A change that does not decode.
    #[error("a change that does not decode")]
    Undecodable,
}

/// Checks the changes of a sync message's change list (each entry a run of whole chunks; the
/// caller has already checked that they split and inflate within bounds) against `doc`.
/// Documents and bundles are left to Automerge's own checks on loading.
pub(crate) fn check_changes<'a>(
    doc: &Automerge,
    entries: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), Invalid> {
    // The changes earlier in this message: their greatest operation counters (none for one
    // that waits for a dependency), and the actors they introduce.
    let mut earlier: BTreeMap<ChangeHash, Option<u64>> = BTreeMap::new();
    let mut introduced: BTreeSet<ActorId> = BTreeSet::new();
    for entry in entries {
        for chunk in chunks::chunks(entry) {
            let chunk = chunk.map_err(|_| Invalid::Undecodable)?;
            if !matches!(chunk.kind, Kind::Change | Kind::Compressed) {
                continue;
            }
            let change = parse(chunk.bytes)?;
            let hash = change.hash();
            if earlier.contains_key(&hash) || doc.get_change_meta_by_hash(&hash).is_some() {
                // Automerge skips a change it has.
                continue;
            }
            let applies = check_change(doc, &change, &earlier, &introduced)?;
            if change.seq() == 1 {
                introduced.insert(change.actor_id().clone());
            }
            earlier.insert(hash, applies.then(|| change.max_op()));
        }
    }
    Ok(())
}

/// Checks one change; whether Automerge applies it now (true), or keeps it aside until a
/// dependency arrives (false: the checks against its dependencies are not made).
fn check_change(
    doc: &Automerge,
    change: &Change,
    earlier: &BTreeMap<ChangeHash, Option<u64>>,
    introduced: &BTreeSet<ActorId>,
) -> Result<bool, Invalid> {
    let start = change.start_op().get();
    let last = start.saturating_add(u64::try_from(change.len()).unwrap_or(u64::MAX));
    if last >= COUNTER_BOUND {
        return Err(Invalid::Counter(last));
    }
    let expanded = change.decode();
    for op in &expanded.operations {
        if let ObjectId::Id(id) = &op.obj {
            counter(id)?;
        }
        if let Key::Seq(ElementId::Id(id)) = &op.key {
            counter(id)?;
        }
        for id in op.pred.iter() {
            counter(id)?;
        }
    }
    let mut waits = false;
    for dep in change.deps() {
        let max = match doc.get_change_meta_by_hash(dep) {
            Some(meta) => Some(meta.max_op),
            None => earlier.get(dep).copied().flatten(),
        };
        match max {
            Some(max) if start <= max => return Err(Invalid::ReusedOps { start, max }),
            Some(_) => {}
            None => waits = true,
        }
    }
    if waits {
        // Automerge keeps it aside until its dependencies arrive (an honest peer's changes
        // can come out of order: an actor's second change before its first, say).
        return Ok(false);
    }
    let known = |a: &ActorId| introduced.contains(a) || knows_actor(doc, a);
    if change.seq() != 1 && !known(change.actor_id()) {
        return Err(Invalid::UnknownAuthor(change.seq()));
    }
    if !change.other_actor_ids().iter().all(known) {
        return Err(Invalid::UnknownActor);
    }
    Ok(true)
}

/// A change chunk, parsed. Automerge's parser itself panics on an operation counter above
/// `u32::MAX` in a change's columns (an `unwrap` of a narrowing conversion): parsing is a pure
/// function of the bytes, touching no document, so its panic is caught and the change refused
/// as undecodable.
fn parse(bytes: &[u8]) -> Result<Change, Invalid> {
    match std::panic::catch_unwind(|| Change::try_from(bytes)) {
        Ok(Ok(change)) => Ok(change),
        Ok(Err(_)) | Err(_) => Err(Invalid::Undecodable),
    }
}

fn counter(id: &OpId) -> Result<(), Invalid> {
    if id.0 >= COUNTER_BOUND {
        return Err(Invalid::Counter(id.0));
    }
    Ok(())
}

/// Whether `doc` holds operations of `actor`. Automerge 0.12 answers this only through the
/// parsing of an object id ("counter@actor"), which looks the actor up.
fn knows_actor(doc: &Automerge, actor: &ActorId) -> bool {
    doc.import_obj(&format!("1@{}", actor.to_hex_string()))
        .is_ok()
}
