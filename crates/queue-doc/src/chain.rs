//! What an epoch document records of its place in its queue's chain, and how to read it: the
//! seals that name its successors ([`Seal`], the [`winner`]), the document it continues
//! ([`Prev`]), in a queue's first document the newest epoch ([`Latest`]), and the tasks that
//! ended in earlier epochs ([`Retired`]). The view reads them; `epoch.rs` writes them and
//! re-exports these.

use automerge::{ChangeHash, ObjType, ROOT, ReadDoc};
use serde::{Deserialize, Serialize};

use crate::am;
use crate::ids::{Claim, PeerId};
use crate::keys::{LATEST, LINEAGE, RETIRED, SEALS};
use crate::packed;

/// A seal in a queue document: this epoch ended, and `successor` holds what was live.
///
/// Seals order by claim, then successor id: the greatest is the [`winner`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Seal {
    /// The sealer's router claim in the successor.
    pub claim: Claim,
    /// The successor document's id.
    pub successor: String,
    /// The successor's epoch number.
    pub epoch: u64,
}

/// The sealed document a successor continues, and its heads when it was sealed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prev {
    /// The predecessor document's id.
    pub doc: String,
    /// Its heads when the successor was built: the writes after them are carried.
    pub heads: Vec<ChangeHash>,
}

/// The newest epoch a queue's first document knows of.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Latest {
    /// Its epoch number.
    pub epoch: u64,
    /// Its document's id.
    pub doc: String,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PackedSeal {
    pub(crate) e: u64,
    pub(crate) t: u64,
    pub(crate) p: String,
    /// The sealed document's heads at sealing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) h: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct PackedLatest {
    pub(crate) e: u64,
    pub(crate) d: String,
}

/// Tasks that ended in earlier epochs and were not carried into this one. The counts are read
/// from peers' documents and only shown: they saturate at `u64::MAX` rather than wrap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retired {
    /// Ended succeeded.
    pub succeeded: u64,
    /// Ended failed.
    pub failed: u64,
    /// Ended cancelled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cancelled: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// The running total of retired tasks a queue document records.
pub fn read_retired<R: ReadDoc>(doc: &R) -> Retired {
    am::string(doc, &ROOT, RETIRED)
        .and_then(|s| packed::decode(&s))
        .unwrap_or_default()
}

/// The successor every replica follows: the greatest seal.
pub fn winner(seals: &[Seal]) -> Option<&Seal> {
    seals.iter().max()
}

/// Every seal written into a queue document, in order (the last is the [`winner`]).
pub fn read_seals<R: ReadDoc>(doc: &R) -> Vec<Seal> {
    let mut seals: Vec<Seal> = am::all_objects(doc, &ROOT, SEALS, ObjType::Map)
        .into_iter()
        .flat_map(|m| {
            doc.map_range(&m, ..)
                .filter_map(|item| {
                    let rec: PackedSeal = packed::decode(am::as_str(&item.value)?)?;
                    let claim = Claim::new(rec.t, PeerId::new(rec.p));
                    claim.is_valid().then(|| Seal {
                        claim,
                        successor: item.key.to_string(),
                        epoch: rec.e,
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    seals.sort();
    seals.dedup();
    seals
}

/// The newest epoch recorded in a queue's first document, if any.
pub fn read_latest<R: ReadDoc>(doc: &R) -> Option<Latest> {
    doc.get_all(ROOT, LATEST)
        .ok()?
        .into_iter()
        .filter_map(|(v, _)| match v {
            automerge::Value::Scalar(s) => match s.as_ref() {
                automerge::ScalarValue::Str(s) => packed::decode::<PackedLatest>(s),
                _ => None,
            },
            _ => None,
        })
        .map(|l| Latest {
            epoch: l.e,
            doc: l.d,
        })
        .max()
}

pub(crate) fn encode_heads(heads: &[ChangeHash]) -> String {
    heads
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn decode_heads(s: &str) -> Vec<ChangeHash> {
    s.split(',').filter_map(|h| h.parse().ok()).collect()
}

/// The most links a lineage keeps (the oldest are dropped): forks further back than this many
/// epochs are not told apart.
pub const MAX_LINEAGE: usize = 64;

/// One link of an epoch document's lineage: the seal that made epoch `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Link {
    /// The epoch number.
    pub epoch: u64,
    /// The sealer's claim.
    pub claim: Claim,
    /// The document of that epoch.
    pub doc: String,
}

/// A queue document's lineage: the seals from the queue's first epoch to this one (empty in
/// epoch 0; at most [`MAX_LINEAGE`], the newest).
///
/// A peer's document may hold more links than that: only the newest [`MAX_LINEAGE`] (by
/// epoch) are read.
pub fn read_lineage<R: ReadDoc>(doc: &R) -> Vec<Link> {
    let mut links: Vec<Link> = am::string(doc, &ROOT, LINEAGE)
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    if links.len() > MAX_LINEAGE {
        links.sort_by_key(|l| l.epoch);
        links.drain(..links.len() - MAX_LINEAGE);
    }
    links
}
