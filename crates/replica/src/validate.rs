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
//! What is checked when: the counters at once; the actors and the ids once every dependency
//! is here. A change whose dependencies are missing is kept aside by Automerge, which applies
//! it when they arrive: the replica keeps a copy of those (`Entry::aside`), and checks them
//! with the message that brings their dependencies. If one fails then, Automerge's queue is
//! emptied (the document is rebuilt from its applied changes) and the message goes on.
//!
//! Work: each change parsed once (Automerge then applies the parsed changes, see `receive`;
//! a message holding a document, a bundle or a bad checksum is parsed again by Automerge's own
//! loading), one lookup per dependency and per actor named, for the message's changes and
//! those kept aside (bounded by `MAX_ASIDE_BYTES`).

use std::collections::{BTreeMap, BTreeSet};

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

/// What a message's changes do, once checked.
#[derive(Debug, Default)]
pub(crate) struct Checked {
    /// Its changes Automerge will keep aside, waiting for a dependency: the caller keeps a
    /// copy, to check them when that arrives (see [`check_changes`]).
    pub(crate) waiting: Vec<Change>,
    /// Every change of the message that the document lacks, parsed, in the message's order,
    /// when the message holds change chunks only, each with a valid checksum: what
    /// [`crate::receive::receive_parsed`] applies without parsing them again. `None` for a
    /// message with a document or a bundle in it, or a bad checksum (Automerge's own loading
    /// then decides what to keep).
    pub(crate) parsed: Option<Vec<Change>>,
}

/// Why a message is refused, and whether a change kept aside is to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// What is wrong.
    pub(crate) why: Invalid,
    /// A change kept aside from an earlier message (its index in `aside`) fails now that its
    /// dependencies are here: Automerge's queue is to be emptied (the message itself may be
    /// fine).
    pub(crate) aside: Option<usize>,
}

/// Checks what a sync message's change list (each entry a run of whole chunks; the caller has
/// already checked that they split and inflate within bounds) makes Automerge apply to `doc`:
/// its changes whose dependencies are here (in `doc` or earlier among them), and the changes
/// kept aside from earlier messages (`aside`, the caller's copy of Automerge's queue) that they
/// make ready. A change whose dependencies are still missing is checked for its counters
/// only, and returned as waiting. Documents and bundles are left to Automerge's own checks on
/// loading.
pub(crate) fn check_changes<'a>(
    doc: &Automerge,
    entries: impl IntoIterator<Item = &'a [u8]>,
    aside: &[&Change],
) -> Result<Checked, Refused> {
    let refuse = |why| Refused { why, aside: None };
    let mut incoming: Vec<Change> = Vec::new();
    let mut seen: BTreeSet<ChangeHash> = BTreeSet::new();
    let mut only_changes = true;
    for entry in entries {
        for chunk in chunks::chunks(entry) {
            let chunk = chunk.map_err(|_| refuse(Invalid::Undecodable))?;
            if !matches!(chunk.kind, Kind::Change | Kind::Compressed) {
                only_changes = false;
                continue;
            }
            let change = parse(chunk.bytes).map_err(refuse)?;
            let hash = change.hash();
            // The header's checksum is the first four bytes of the change's hash.
            only_changes &= chunk.bytes.get(4..8) == hash.as_ref().get(..4);
            if !seen.insert(hash) || doc.get_change_meta_by_hash(&hash).is_some() {
                // Automerge skips a change it has.
                continue;
            }
            counters(&change).map_err(refuse)?;
            incoming.push(change);
        }
    }
    // What becomes ready, in dependency order: a change is checked once every dependency is
    // in `doc` or ready before it. The greatest operation counter of each change ready so
    // far, and the actors they introduce. Linear in the changes and their dependencies.
    let mut candidates: Vec<(&Change, Option<usize>)> = Vec::new();
    let mut index: BTreeMap<ChangeHash, usize> = BTreeMap::new();
    let from_aside = aside
        .iter()
        .enumerate()
        .filter(|(_, c)| doc.get_change_meta_by_hash(&c.hash()).is_none())
        .map(|(i, c)| (*c, Some(i)));
    for (c, a) in from_aside.chain(incoming.iter().map(|c| (c, None))) {
        if let std::collections::btree_map::Entry::Vacant(v) = index.entry(c.hash()) {
            v.insert(candidates.len());
            candidates.push((c, a));
        }
    }
    let mut missing = vec![0usize; candidates.len()];
    let mut dependents: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut next: Vec<usize> = Vec::new();
    for (i, (c, _)) in candidates.iter().enumerate() {
        let deps: BTreeSet<&ChangeHash> = c.deps().iter().collect();
        for d in deps {
            if doc.get_change_meta_by_hash(d).is_some() {
                continue;
            }
            missing[i] += 1;
            if let Some(&k) = index.get(d) {
                dependents.entry(k).or_default().push(i);
            }
        }
        if missing[i] == 0 {
            next.push(i);
        }
    }
    let mut ready: BTreeMap<ChangeHash, u64> = BTreeMap::new();
    let mut introduced: BTreeSet<ActorId> = BTreeSet::new();
    while let Some(i) = next.pop() {
        let (change, from_aside) = candidates[i];
        check_ready(doc, change, &ready, &introduced).map_err(|why| Refused {
            why,
            aside: from_aside,
        })?;
        if change.seq() == 1 {
            introduced.insert(change.actor_id().clone());
        }
        ready.insert(change.hash(), change.max_op());
        for &j in dependents.get(&i).map(Vec::as_slice).unwrap_or_default() {
            missing[j] -= 1;
            if missing[j] == 0 {
                next.push(j);
            }
        }
    }
    let waiting = incoming
        .iter()
        .filter(|c| !ready.contains_key(&c.hash()))
        .cloned()
        .collect();
    Ok(Checked {
        waiting,
        parsed: only_changes.then_some(incoming),
    })
}

/// A change's own operation counters: below `u32::MAX`. Those it names (its objects, list
/// elements and predecessors) are narrowed to 32 bits by Automerge's parser, which panics on a
/// larger one: [`parse`] refuses such a change. Reads the change's header only.
fn counters(change: &Change) -> Result<(), Invalid> {
    let start = change.start_op().get();
    let last = start.saturating_add(u64::try_from(change.len()).unwrap_or(u64::MAX));
    if last >= COUNTER_BOUND {
        return Err(Invalid::Counter(last));
    }
    Ok(())
}

/// Checks a change whose dependencies are all in `doc` or in `ready`: its operations start
/// above theirs, and its actors are known (its own, unless this is its first change).
fn check_ready(
    doc: &Automerge,
    change: &Change,
    ready: &BTreeMap<ChangeHash, u64>,
    introduced: &BTreeSet<ActorId>,
) -> Result<(), Invalid> {
    let start = change.start_op().get();
    for dep in change.deps() {
        let max = match doc.get_change_meta_by_hash(dep) {
            Some(meta) => meta.max_op,
            None => ready.get(dep).copied().unwrap_or(0),
        };
        if start <= max {
            return Err(Invalid::ReusedOps { start, max });
        }
    }
    let known = |a: &ActorId| introduced.contains(a) || knows_actor(doc, a);
    if change.seq() != 1 && !known(change.actor_id()) {
        return Err(Invalid::UnknownAuthor(change.seq()));
    }
    if !change.other_actor_ids().iter().all(known) {
        return Err(Invalid::UnknownActor);
    }
    Ok(())
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

/// Whether `doc` holds operations of `actor`. Automerge 0.12 answers this only through the
/// parsing of an object id ("counter@actor"), which looks the actor up.
fn knows_actor(doc: &Automerge, actor: &ActorId) -> bool {
    doc.import_obj(&format!("1@{}", actor.to_hex_string()))
        .is_ok()
}
