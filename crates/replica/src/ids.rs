//! Identifiers: documents ([`DocId`]) and peers ([`PeerId`]).

use std::fmt;

use rand::RngCore;
use serde::{Deserialize, Serialize};

/// A document's id: an `automerge:` URL (base58 of 16 random bytes after the prefix).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DocId(String);

/// The prefix of every document id.
pub const URL_PREFIX: &str = "automerge:";
/// The longest document id accepted from the network.
pub const MAX_DOC_ID: usize = 64;

impl DocId {
    /// A fresh random id.
    pub fn generate(rng: &mut impl RngCore) -> Self {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        DocId(format!("{URL_PREFIX}{}", bs58::encode(bytes).into_string()))
    }

    /// Parses an id, checking its form.
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(URL_PREFIX)?;
        let ok = s.len() <= MAX_DOC_ID
            && !rest.is_empty()
            && bs58::decode(rest).into_vec().is_ok_and(|b| b.len() == 16);
        ok.then(|| DocId(s.to_owned()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DocId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A peer's identity as text (a libp2p peer id in the running system).
///
/// Peers are ordered by their text; the order breaks ties between router claims of the same
/// term, so every replica must compare the same way.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PeerId(String);

impl PeerId {
    /// Wraps a peer id's text.
    pub fn new(id: impl Into<String>) -> Self {
        PeerId(id.into())
    }

    /// The peer id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
