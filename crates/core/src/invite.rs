//! Invite tokens: what a joining node needs to get a queue's documents from a member.
//!
//! A token names the queue, the member that made it and the addresses it listens on, and
//! carries one of two proofs (`piecework_queue_doc::membership`):
//! - an *add* operation for one peer (`--for PEER`), signed by an admin and already in the
//!   queue document: any member that holds it admits that peer;
//! - a *grant* for whoever holds the token, signed by an admin, with an expiry: the member it
//!   is presented to (an admin: the one that made it) signs an add for the presenter if the
//!   grant has not expired by its clock.
//!
//! The joining node dials the addresses and presents the token (with its own public key, for
//! peers whose id is not made of one) in a [`piecework_replica::Message::Present`]; the member
//! answers with the queue document or "unavailable". The token is text: base58 (with a
//! checksum) of a small JSON object.

use piecework_queue_doc::membership::{Grant, MemberOp, PublicKey};
use piecework_queue_doc::{PeerId, QueueId};
use serde::{Deserialize, Serialize};

/// The most bytes of a token's text.
pub const MAX_TOKEN_CHARS: usize = 8 * 1024;

/// A decoded invite token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invite {
    /// The queue.
    pub queue: QueueId,
    /// The member that made it, to dial.
    pub member: PeerId,
    /// Where that member listens (multiaddrs as text).
    pub addrs: Vec<String>,
    /// The proof.
    pub proof: InviteProof,
}

/// What an invite proves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InviteProof {
    /// An add operation for one peer.
    Add(MemberOp),
    /// A grant for whoever holds the token.
    Grant(Grant),
}

#[derive(Serialize, Deserialize)]
struct TokenBody {
    v: u32,
    q: String,
    m: String,
    #[serde(default)]
    a: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    op: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    grant: Option<String>,
}

/// What a joining node presents: its token, and its public key.
#[derive(Serialize, Deserialize)]
struct PresentedBody {
    token: String,
    key: String,
}

/// A token could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InviteError {
    /// Not a token.
    #[error("not an invite token ({0})")]
    Malformed(String),
    /// Its proof does not verify.
    #[error("the invite's signature does not verify ({0})")]
    Proof(#[from] piecework_queue_doc::membership::OpError),
    /// Its proof is for another queue than it names.
    #[error("the invite's proof is for another queue")]
    OtherQueue,
}

impl Invite {
    /// The token's text.
    pub fn encode(&self) -> String {
        let (op, grant) = match &self.proof {
            InviteProof::Add(op) => (Some(hex::encode(op.bytes())), None),
            InviteProof::Grant(g) => (None, Some(hex::encode(g.bytes()))),
        };
        let body = TokenBody {
            v: 1,
            q: self.queue.as_str().to_owned(),
            m: self.member.as_str().to_owned(),
            a: self.addrs.clone(),
            op,
            grant,
        };
        let json = serde_json::to_vec(&body).expect("a token serializes");
        bs58::encode(json).with_check().into_string()
    }

    /// Reads a token, checking its proof's signature (not whether its signer may make it:
    /// the member it is presented to decides that).
    pub fn decode(token: &str) -> Result<Invite, InviteError> {
        let token = token.trim();
        if token.len() > MAX_TOKEN_CHARS {
            return Err(InviteError::Malformed(format!(
                "{} characters",
                token.len()
            )));
        }
        let json = bs58::decode(token)
            .with_check(None)
            .into_vec()
            .map_err(|e| InviteError::Malformed(e.to_string()))?;
        let b: TokenBody =
            serde_json::from_slice(&json).map_err(|e| InviteError::Malformed(e.to_string()))?;
        if b.v != 1 {
            return Err(InviteError::Malformed(format!("version {}", b.v)));
        }
        let bytes = |h: &str| hex::decode(h).map_err(|e| InviteError::Malformed(e.to_string()));
        let queue = QueueId::new(b.q);
        let proof = match (b.op, b.grant) {
            (Some(op), None) => {
                let op = MemberOp::decode(&bytes(&op)?)?;
                if op.queue != queue {
                    return Err(InviteError::OtherQueue);
                }
                InviteProof::Add(op)
            }
            (None, Some(g)) => {
                let g = Grant::decode(&bytes(&g)?)?;
                if g.queue != queue {
                    return Err(InviteError::OtherQueue);
                }
                InviteProof::Grant(g)
            }
            _ => return Err(InviteError::Malformed("no proof, or two".into())),
        };
        Ok(Invite {
            queue,
            member: PeerId::new(b.m),
            addrs: b.a,
            proof,
        })
    }
}

/// The bytes a joining node presents: `token` and its public `key`.
pub fn presented(token: &str, key: &PublicKey) -> Vec<u8> {
    serde_json::to_vec(&PresentedBody {
        token: token.trim().to_owned(),
        key: hex::encode(key),
    })
    .expect("a presentation serializes")
}

/// Reads what a joining node presented: its invite and its public key.
pub fn read_presented(bytes: &[u8]) -> Result<(Invite, PublicKey), InviteError> {
    let b: PresentedBody =
        serde_json::from_slice(bytes).map_err(|e| InviteError::Malformed(e.to_string()))?;
    let key = hex::decode(&b.key)
        .ok()
        .and_then(|k| k.try_into().ok())
        .ok_or_else(|| InviteError::Malformed("key".into()))?;
    Ok((Invite::decode(&b.token)?, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use piecework_queue_doc::membership::{NewOp, OpKind};
    use piecework_queue_doc::{Role, Signer};

    #[test]
    fn a_token_reads_back_and_a_damaged_one_does_not() {
        let s = Signer::new(PeerId::new("a"), [1; 32]);
        let q = QueueId::new("automerge:q");
        let g = Grant::sign(&s, &q, Role::Member, 5, "n".into());
        let inv = Invite {
            queue: q.clone(),
            member: s.peer().clone(),
            addrs: vec!["/ip4/127.0.0.1/tcp/1".into()],
            proof: InviteProof::Grant(g),
        };
        let t = inv.encode();
        assert_eq!(Invite::decode(&format!(" {t}\n")), Ok(inv.clone()));
        let mut bad = t.clone().into_bytes();
        bad[10] = if bad[10] == b'2' { b'3' } else { b'2' };
        assert!(Invite::decode(std::str::from_utf8(&bad).unwrap()).is_err());
        assert!(Invite::decode("automerge:q").is_err());
        // An add for another queue than the token names.
        let op = MemberOp::sign(
            &s,
            NewOp {
                queue: &QueueId::new("automerge:other"),
                kind: OpKind::Add,
                peer: &PeerId::new("b"),
                role: Some(Role::Member),
                key: None,
                deps: vec![],
                at_ms: 0,
                via: None,
                cut: None,
            },
        );
        let other = Invite {
            proof: InviteProof::Add(op),
            ..inv
        };
        assert_eq!(
            Invite::decode(&other.encode()),
            Err(InviteError::OtherQueue)
        );
        let p = presented(&t, &s.public());
        let (back, key) = read_presented(&p).unwrap();
        assert_eq!((back.encode(), key), (t, s.public()));
    }
}
