//! Identifiers: documents ([`DocId`]) and peers ([`PeerId`]).

use std::fmt;

use rand::RngCore;
use serde::{Deserialize, Serialize};

/// A document's id: an `automerge:` URL.
///
/// New ids are written as automerge-repo writes them: 16 random bytes in base58check (base58
/// of the bytes followed by the first 4 bytes of their double SHA-256), so a JavaScript
/// automerge-repo peer names the same document with the same text. Ids written by earlier
/// versions (plain base58 of 16 bytes, no checksum) still parse; an id is compared as text, so
/// both forms coexist.
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
        let text = bs58::encode(bytes).with_check().into_string();
        DocId(format!("{URL_PREFIX}{text}"))
    }

    /// The id every member derives from the same `parts`: the first 16 bytes of their SHA-256
    /// (each part prefixed by its length), in automerge-repo's form. Used for the ids of tasks
    /// that more than one member may make (a run's follow-ups, an undo's tasks), so that they
    /// make one task.
    pub fn derived(parts: &[&[u8]]) -> Self {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        let digest = h.finalize();
        let text = bs58::encode(&digest[..16]).with_check().into_string();
        DocId(format!("{URL_PREFIX}{text}"))
    }

    /// Parses an id, checking its form: 16 bytes in base58check (automerge-repo's form), or
    /// in plain base58 (the form of ids written by earlier versions).
    pub fn parse(s: &str) -> Option<Self> {
        let rest = s.strip_prefix(URL_PREFIX)?;
        if s.len() > MAX_DOC_ID || rest.is_empty() {
            return None;
        }
        let checked = bs58::decode(rest)
            .with_check(None)
            .into_vec()
            .is_ok_and(|b| b.len() == 16);
        let legacy = || bs58::decode(rest).into_vec().is_ok_and(|b| b.len() == 16);
        (checked || legacy()).then(|| DocId(s.to_owned()))
    }

    /// Whether the id is in automerge-repo's form (base58check), rather than the legacy one.
    pub fn is_checked(&self) -> bool {
        self.0.strip_prefix(URL_PREFIX).is_some_and(|rest| {
            bs58::decode(rest)
                .with_check(None)
                .into_vec()
                .is_ok_and(|b| b.len() == 16)
        })
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
