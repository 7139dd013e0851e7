//! Identifiers: peers, workers, tasks, queues and router claims.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub use piecework_replica::PeerId;

/// A task worker: the index of a worker slot in a peer's pool.
///
/// Names are stable across restarts of the node (`<peer>/<index>`); the pool's incarnation
/// number tells runs of different starts apart.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerId {
    /// The peer whose pool owns the worker.
    pub peer: PeerId,
    /// The slot's index in that pool, from 0.
    pub index: u32,
}

impl WorkerId {
    /// A worker of `peer`'s pool.
    pub fn new(peer: PeerId, index: u32) -> Self {
        WorkerId { peer, index }
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.peer, self.index)
    }
}

/// The text was not a `<peer>/<index>` worker name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a worker name (expected <peer>/<index>): {0:?}")]
pub struct BadWorkerId(pub String);

impl FromStr for WorkerId {
    type Err = BadWorkerId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (peer, index) = s
            .rsplit_once('/')
            .ok_or_else(|| BadWorkerId(s.to_owned()))?;
        if peer.is_empty() {
            return Err(BadWorkerId(s.to_owned()));
        }
        let index = index.parse().map_err(|_| BadWorkerId(s.to_owned()))?;
        Ok(WorkerId::new(PeerId::new(peer), index))
    }
}

/// A task's id: the `automerge:` URL of its task document.
///
/// Shared text: cloning an id (views hold it in several indexes) copies a pointer.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(std::sync::Arc<str>);

impl TaskId {
    /// Wraps a task document's URL.
    pub fn new(id: impl Into<String>) -> Self {
        TaskId(std::sync::Arc::from(id.into()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A queue's id: the `automerge:` URL of its queue document.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct QueueId(String);

impl QueueId {
    /// Wraps a queue document's URL.
    pub fn new(id: impl Into<String>) -> Self {
        QueueId(id.into())
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The greatest router term a claim may have (2^48).
///
/// A term grows by one per takeover: at one takeover per millisecond, an honest queue would
/// need almost 9,000 years to reach this. A greater term can only come from a faulty or hostile
/// peer, and it would be unbeatable (nobody could out-claim it) and make `term + 1` overflow.
/// So claims above it are ignored when a queue document is read (and counted in
/// [`QueueView::malformed`](crate::QueueView::malformed)), attempts made under such a claim are
/// malformed, [`queue::claim_router`](crate::queue::claim_router) refuses to write one, and
/// routers and pools ignore heartbeats that carry one. A router that knows of a claim at this
/// term does not claim.
pub const MAX_TERM: u64 = 1 << 48;

/// A router's claim on a queue: its term and its peer.
///
/// Claims are ordered by `(term, peer)`. The *effective router* of a queue is the greatest claim
/// among the concurrent values of the queue document's router record; every replica computes it
/// the same way. Workers fence on it: an assignment made under a claim below the effective one
/// is refused.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Claim {
    /// The router term: one more than the effective term its claimant had seen; at most
    /// [`MAX_TERM`].
    pub term: u64,
    /// The claimant.
    pub peer: PeerId,
}

impl Claim {
    /// A claim of `peer` at `term`.
    pub fn new(term: u64, peer: PeerId) -> Self {
        Claim { term, peer }
    }

    /// Whether the term is at most [`MAX_TERM`]: only such claims count.
    pub fn is_valid(&self) -> bool {
        self.term <= MAX_TERM
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.peer, self.term)
    }
}

/// Identifies one attempt of a task: its number and the claim of the router that made it.
///
/// A router makes at most one attempt with a given number per task, so the pair is unique even
/// when two routers briefly both assign the same task during a takeover.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptId {
    /// The attempt number: one more than the highest the router had seen for the task.
    pub n: u64,
    /// The router that made the assignment.
    pub claim: Claim,
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} by {}", self.n, self.claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_round_trip_through_text() {
        let w = WorkerId::new(PeerId::new("12D3KooWabc"), 3);
        assert_eq!(w.to_string(), "12D3KooWabc/3");
        assert_eq!("12D3KooWabc/3".parse::<WorkerId>().unwrap(), w);
        assert!("nope".parse::<WorkerId>().is_err());
        assert!("/3".parse::<WorkerId>().is_err());
        assert!("p/x".parse::<WorkerId>().is_err());
    }

    #[test]
    fn claims_order_by_term_then_peer() {
        let a = Claim::new(2, PeerId::new("b"));
        let b = Claim::new(3, PeerId::new("a"));
        let c = Claim::new(3, PeerId::new("c"));
        assert!(a < b && b < c);
    }
}
