//! Membership: who may hold a queue's documents, and in which [`Role`].
//!
//! A queue document holds its membership as a grow-only set of signed operations
//! ([`MemberOp`]): add a peer with a role, remove a peer. Each is stored once, under a root key
//! named by the hash of its bytes (`mop/<id>`), so no shared container is made at run time and
//! replicas that write the same operation write the same value. Every replica materializes the
//! set the same way ([`Membership::materialize`]), from the queue's creator down:
//!
//! 1. An operation counts only if its signature verifies under the key it names, that key is
//!    its signer's (the one its libp2p peer id is made of, or the one the operation that added
//!    the signer recorded), it is for this queue, and every operation it says it had seen
//!    (`deps`) is in the set.
//! 2. Operations are applied in one order every replica computes alike: each after the
//!    operations it had seen, ties broken by id.
//! 3. An operation counts if its signer is, at that point, an admin that was not removed (or,
//!    for a removal, the peer removing itself). The creator is an admin from the start and can
//!    neither be removed nor have its role changed.
//! 4. A removal also takes back every operation of the removed peer that it had not seen (ops
//!    concurrent with it that the order put first), and what those operations allowed: the
//!    materialization starts again without them, until nothing more is taken back. What the
//!    remover had seen of the removed peer stands.
//!
//! The result is a function of the set alone: replicas that hold the same operations, merged
//! in any order, agree on every member, role and removal (the property test in
//! `tests/membership.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use automerge::{ActorId, Automerge};
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{PeerId, QueueId};

/// The prefix of the root keys membership operations are stored under.
pub(crate) const OP_PREFIX: &str = "mop/";

/// The most membership operations a queue's materialization reads (in id order); the rest are
/// ignored. Far above what invites and removals by hand make.
pub const MAX_MEMBER_OPS: usize = 4096;

/// The most bytes one encoded operation may take (a removal's [`Cut`] names up to
/// [`MAX_CUT_ACTORS`] actors).
pub const MAX_OP_BYTES: usize = 16 * 1024;

/// The most actors a removal's [`Cut`] names: a peer's starts within one document, far more
/// than a node makes between two rotations.
pub const MAX_CUT_ACTORS: usize = 256;

/// How many leading bytes of an Automerge actor id name the peer that writes with it
/// ([`actor_tag`]); the rest are the start's random part.
pub const ACTOR_TAG_LEN: usize = 8;

const ACTOR_DOMAIN: &[u8] = b"piecework/actor/v1\0";

/// The most operations one operation may name as seen.
pub const MAX_DEPS: usize = 64;

const OP_DOMAIN: &[u8] = b"piecework/member-op/v1\0";
const GRANT_DOMAIN: &[u8] = b"piecework/invite-grant/v1\0";

/// What a member may do in its queue.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Submits, reads, cancels and requeues its own tasks; never routes or runs.
    Submitter,
    /// All a submitter does, plus routes, runs, pauses and resumes, sets boosts, and cancels,
    /// requeues and undoes any task.
    #[default]
    Member,
    /// All a member does, plus the queue's configuration, schedules, invites and removals.
    Admin,
}

impl Role {
    /// The role's name (`submitter`, `member`, `admin`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Submitter => "submitter",
            Role::Member => "member",
            Role::Admin => "admin",
        }
    }

    /// Reads a role's name.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "submitter" => Some(Role::Submitter),
            "member" => Some(Role::Member),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    /// Whether this role routes and runs tasks.
    pub fn works(self) -> bool {
        self >= Role::Member
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An ed25519 public key, as its 32 bytes.
pub type PublicKey = [u8; 32];

/// The ed25519 key a libp2p peer id is made of (`12D3KooW…` ids embed it), if it is one.
pub fn peer_key(peer: &PeerId) -> Option<PublicKey> {
    let bytes = bs58::decode(peer.as_str()).into_vec().ok()?;
    // Identity multihash (0x00, length 36) of the protobuf public key: type Ed25519 (0x08
    // 0x01), data of 32 bytes (0x12 0x20).
    match bytes.as_slice() {
        [0x00, 0x24, 0x08, 0x01, 0x12, 0x20, key @ ..] => key.try_into().ok(),
        _ => None,
    }
}

/// A node's signing key and the peer id it signs as.
#[derive(Clone)]
pub struct Signer {
    peer: PeerId,
    key: SigningKey,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer for `peer` from the 32 secret bytes of its ed25519 key. For a libp2p peer id,
    /// the key must be the one the id is made of (see [`peer_key`]), or what it signs will not
    /// verify as that peer's.
    pub fn new(peer: PeerId, secret: [u8; 32]) -> Self {
        Signer {
            peer,
            key: SigningKey::from_bytes(&secret),
        }
    }

    /// The peer it signs as.
    pub fn peer(&self) -> &PeerId {
        &self.peer
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        self.key.verifying_key().to_bytes()
    }

    fn sign(&self, domain: &[u8], body: &[u8]) -> [u8; 64] {
        let mut msg = Vec::with_capacity(domain.len() + body.len());
        msg.extend_from_slice(domain);
        msg.extend_from_slice(body);
        self.key.sign(&msg).to_bytes()
    }
}

fn verify(key: &PublicKey, domain: &[u8], body: &[u8], sig: &[u8; 64]) -> bool {
    let Ok(k) = VerifyingKey::from_bytes(key) else {
        return false;
    };
    let mut msg = Vec::with_capacity(domain.len() + body.len());
    msg.extend_from_slice(domain);
    msg.extend_from_slice(body);
    k.verify(&msg, &Signature::from_bytes(sig)).is_ok()
}

/// What an operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// Adds a peer with a role (or changes the role of a member).
    Add,
    /// Removes a peer.
    Remove,
}

#[derive(Serialize, Deserialize)]
struct OpBody {
    v: u32,
    q: String,
    op: OpKind,
    peer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<Role>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    by: String,
    by_key: String,
    #[serde(default)]
    deps: Vec<String>,
    at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    via: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cut: Option<Cut>,
}

/// A membership operation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// Not an operation (too short, too long, or not its layout).
    #[error("malformed membership operation: {0}")]
    Malformed(String),
    /// Its signature does not verify.
    #[error("membership operation with a bad signature")]
    BadSignature,
    /// A key it names is not the one the peer's id is made of.
    #[error("membership operation naming a key that is not {0}'s")]
    WrongKey(PeerId),
}

/// One signed membership operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberOp {
    /// Its id: the hex of the first 16 bytes of the SHA-256 of its bytes.
    pub id: String,
    /// The queue it is for.
    pub queue: QueueId,
    /// Add or remove.
    pub kind: OpKind,
    /// The peer added or removed.
    pub peer: PeerId,
    /// The role given (an add).
    pub role: Option<Role>,
    /// The added peer's key, when its id is not made of one.
    pub key: Option<PublicKey>,
    /// Who signed it.
    pub by: PeerId,
    /// The key it was signed with.
    pub by_key: PublicKey,
    /// The operations its signer had seen (ids).
    pub deps: Vec<String>,
    /// When it was signed (the signer's clock, unix ms): information only.
    pub at_ms: u64,
    /// The invite it redeems, if any (the grant's nonce): information only.
    pub via: Option<String>,
    /// A removal: what its signer had seen of the removed peer's writes (see [`Cut`]).
    pub cut: Option<Cut>,
    bytes: Vec<u8>,
}

/// What a new operation says (see [`MemberOp::sign`]).
#[derive(Clone, Debug)]
pub struct NewOp<'a> {
    /// The queue.
    pub queue: &'a QueueId,
    /// Add or remove.
    pub kind: OpKind,
    /// The peer added or removed.
    pub peer: &'a PeerId,
    /// The role given (an add).
    pub role: Option<Role>,
    /// The added peer's key, if its id is not made of one.
    pub key: Option<PublicKey>,
    /// The operations the signer has seen.
    pub deps: Vec<String>,
    /// The signer's clock.
    pub at_ms: u64,
    /// The invite redeemed.
    pub via: Option<String>,
    /// A removal's [`Cut`] ([`Cut::of_doc`]).
    pub cut: Option<Cut>,
}

fn op_id(bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(bytes)[..16])
}

fn hex_key(s: &str) -> Option<PublicKey> {
    hex::decode(s).ok()?.try_into().ok()
}

impl MemberOp {
    /// Signs a new operation.
    pub fn sign(signer: &Signer, new: NewOp<'_>) -> MemberOp {
        let body = OpBody {
            v: 1,
            q: new.queue.as_str().to_owned(),
            op: new.kind,
            peer: new.peer.as_str().to_owned(),
            role: new.role,
            key: new.key.map(hex::encode),
            by: signer.peer.as_str().to_owned(),
            by_key: hex::encode(signer.public()),
            deps: new.deps,
            at_ms: new.at_ms,
            via: new.via,
            cut: new.cut,
        };
        let body = serde_json::to_vec(&body).expect("an operation serializes");
        let sig = signer.sign(OP_DOMAIN, &body);
        let mut bytes = sig.to_vec();
        bytes.extend_from_slice(&body);
        MemberOp::decode(&bytes).expect("a signed operation reads back")
    }

    /// Reads an operation and checks its signature and keys (not whether its signer may make
    /// it: that is the materialization's).
    pub fn decode(bytes: &[u8]) -> Result<MemberOp, OpError> {
        if bytes.len() > MAX_OP_BYTES {
            return Err(OpError::Malformed(format!("{} bytes", bytes.len())));
        }
        let Some((sig, body)) = bytes.split_first_chunk::<64>() else {
            return Err(OpError::Malformed("shorter than a signature".into()));
        };
        let b: OpBody =
            serde_json::from_slice(body).map_err(|e| OpError::Malformed(e.to_string()))?;
        if b.v != 1 {
            return Err(OpError::Malformed(format!("version {}", b.v)));
        }
        if b.deps.len() > MAX_DEPS {
            return Err(OpError::Malformed(format!("{} deps", b.deps.len())));
        }
        let by_key =
            hex_key(&b.by_key).ok_or_else(|| OpError::Malformed("signer key".to_owned()))?;
        let by = PeerId::new(b.by);
        if peer_key(&by).is_some_and(|k| k != by_key) {
            return Err(OpError::WrongKey(by));
        }
        if !verify(&by_key, OP_DOMAIN, body, sig) {
            return Err(OpError::BadSignature);
        }
        let peer = PeerId::new(b.peer);
        let key = match b.key {
            Some(k) => Some(hex_key(&k).ok_or_else(|| OpError::Malformed("key".to_owned()))?),
            None => None,
        };
        if let (Some(k), Some(derived)) = (key, peer_key(&peer))
            && k != derived
        {
            return Err(OpError::WrongKey(peer));
        }
        if b.cut
            .as_ref()
            .is_some_and(|c| c.clock.len() > MAX_CUT_ACTORS)
        {
            return Err(OpError::Malformed(
                "a cut naming too many actors".to_owned(),
            ));
        }
        if b.op == OpKind::Add && b.role.is_none() {
            return Err(OpError::Malformed("an add without a role".to_owned()));
        }
        Ok(MemberOp {
            id: op_id(bytes),
            queue: QueueId::new(b.q),
            kind: b.op,
            peer,
            role: b.role,
            key,
            by,
            by_key,
            deps: b.deps,
            at_ms: b.at_ms,
            via: b.via,
            cut: b.cut,
            bytes: bytes.to_vec(),
        })
    }

    /// Its bytes, as stored.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The root key it is stored under.
    pub fn key_name(&self) -> String {
        format!("{OP_PREFIX}{}", self.id)
    }

    /// The operation stored under root key `key`, if `bytes` are one and the key names them.
    pub(crate) fn stored_under(key: &str, bytes: &[u8]) -> Option<MemberOp> {
        if !names(key, bytes) {
            return None;
        }
        MemberOp::decode(bytes).ok()
    }
}

/// Whether root key `key` names `bytes` (`mop/` and the id of those bytes): a hash, no
/// signature checked.
pub(crate) fn names(key: &str, bytes: &[u8]) -> bool {
    key.strip_prefix(OP_PREFIX)
        .is_some_and(|id| id == op_id(bytes))
}

/// The first [`ACTOR_TAG_LEN`] bytes of the Automerge actor ids `peer` writes with: the start
/// of the SHA-256 of its id (domain-separated). A reader attributes a write to the member whose
/// tag its actor starts with ([`Membership::writer`]). Changes are not signed, so the tag is a
/// claim, not a proof: it lets honest replicas tell honest writers apart, and a hostile member
/// can still write under another member's tag (see `docs/security.md`).
pub fn actor_tag(peer: &PeerId) -> [u8; ACTOR_TAG_LEN] {
    let mut h = Sha256::new();
    h.update(ACTOR_DOMAIN);
    h.update(peer.as_str().as_bytes());
    let d = h.finalize();
    let mut tag = [0u8; ACTOR_TAG_LEN];
    tag.copy_from_slice(&d[..ACTOR_TAG_LEN]);
    tag
}

/// An actor id for one start of `peer`: its [`actor_tag`], then `nonce` (random per start).
pub fn actor_for(peer: &PeerId, nonce: [u8; 8]) -> ActorId {
    let mut bytes = actor_tag(peer).to_vec();
    bytes.extend_from_slice(&nonce);
    ActorId::from(bytes)
}

fn tag_of(actor: &ActorId) -> Option<[u8; ACTOR_TAG_LEN]> {
    actor.to_bytes().get(..ACTOR_TAG_LEN)?.try_into().ok()
}

/// What a removal had seen of the removed peer's writes in the document it was written to:
/// for each of the peer's actors there, the greatest operation counter. Every replica ignores
/// the removed peer's writes in that document beyond it (the writes of an actor it does not
/// name, all of them): removal converges whatever the order the replicas learn of it, and what
/// the remover had seen stands. In another document of the queue the removed peer's writes are
/// judged by its role alone: one built after the removal holds it from its first change, so no
/// honest member takes the removed peer's writes into it, and one built without it (by a
/// router in a partition) holds the queue's live tasks, which at-least-once must keep.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cut {
    /// The document's key ([`crate::QueueView::doc_key`]).
    #[serde(rename = "d")]
    pub doc: String,
    /// Actor (hex) → the greatest operation counter seen.
    #[serde(rename = "c")]
    pub clock: BTreeMap<String, u64>,
}

impl Cut {
    /// The cut of `peer`'s writes in `doc` (whose key is `doc_key`), as `doc` holds them now:
    /// O(the document's changes), once per removal.
    pub fn of_doc(doc: &Automerge, doc_key: &str, peer: &PeerId) -> Cut {
        let tag = actor_tag(peer);
        let mut clock: BTreeMap<String, u64> = BTreeMap::new();
        for m in doc.get_changes_meta(&[]) {
            if tag_of(&m.actor) == Some(tag) {
                let e = clock.entry(m.actor.to_hex_string()).or_insert(0);
                *e = (*e).max(m.max_op);
            }
        }
        if clock.len() > MAX_CUT_ACTORS {
            // Keep the actors with the most writes seen; the others' writes are ignored.
            let mut by_count: Vec<(String, u64)> = clock.into_iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            by_count.truncate(MAX_CUT_ACTORS);
            clock = by_count.into_iter().collect();
        }
        Cut {
            doc: doc_key.to_owned(),
            clock,
        }
    }
}

/// Who wrote a value, as a reader can tell ([`Membership::writer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer<'a> {
    /// An actor no member's tag names (a queue written before actors were tagged, or a
    /// forged one): the writer cannot be known, and its writes are read as before.
    Unknown,
    /// A member (removed or not) and its role.
    Member(&'a PeerId, Role),
    /// A removed peer's write beyond its removal's [`Cut`]: ignored by every reader.
    Cut,
}

/// A member as the materialization leaves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRecord {
    /// Its role (the last one given).
    pub role: Role,
    /// Who added it (`None`: the creator, or a member of a queue made before memberships were
    /// signed).
    pub added_by: Option<PeerId>,
    /// Who removed it, if it was removed.
    pub removed_by: Option<PeerId>,
    /// Its key, if known.
    pub key: Option<PublicKey>,
    /// The operations of its own the removal had seen (see [`Membership::counts`]).
    seen_at_removal: BTreeSet<String>,
    /// What the removal had seen of its writes (none: every write of a removed peer is
    /// ignored).
    cut: Option<Cut>,
}

impl MemberRecord {
    /// Whether it is a member now (added and not removed since).
    pub fn active(&self) -> bool {
        self.removed_by.is_none()
    }
}

/// A queue's members, roles and removals, materialized from its operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    creator: Option<PeerId>,
    members: BTreeMap<PeerId, MemberRecord>,
    /// Every operation read (valid or not), by id: what the next materialization reuses.
    ops: BTreeMap<String, MemberOp>,
    /// The operations that counted.
    counted: BTreeSet<String>,
    /// Whether members listed the old way (the `members` map of a queue made before
    /// memberships were signed) count.
    legacy: bool,
    /// Every peer ever added, by its [`actor_tag`].
    writers: BTreeMap<[u8; ACTOR_TAG_LEN], PeerId>,
    /// See [`Membership::all_work`].
    all_work: bool,
}

impl Membership {
    /// Materializes the membership of `queue`, made by `creator` (whose key is
    /// `creator_key`, or the one its id is made of), from `ops`. `legacy`: the members a
    /// queue made before memberships were signed lists (each a member, added by the creator).
    pub fn materialize(
        queue: Option<&QueueId>,
        creator: &PeerId,
        creator_key: Option<PublicKey>,
        ops: impl IntoIterator<Item = MemberOp>,
        legacy: Option<&BTreeSet<PeerId>>,
    ) -> Membership {
        let mut all: BTreeMap<String, MemberOp> = BTreeMap::new();
        for op in ops {
            if all.len() >= MAX_MEMBER_OPS {
                break;
            }
            all.insert(op.id.clone(), op);
        }
        let order = causal_order(&all, queue);
        let mut base = BTreeMap::new();
        base.insert(
            creator.clone(),
            MemberRecord {
                role: Role::Admin,
                added_by: None,
                removed_by: None,
                key: creator_key.or_else(|| peer_key(creator)),
                seen_at_removal: BTreeSet::new(),
                cut: None,
            },
        );
        for p in legacy.into_iter().flatten() {
            if p != creator {
                base.insert(
                    p.clone(),
                    MemberRecord {
                        role: Role::Member,
                        added_by: None,
                        removed_by: None,
                        key: peer_key(p),
                        seen_at_removal: BTreeSet::new(),
                        cut: None,
                    },
                );
            }
        }
        let mut taken_back: BTreeSet<String> = BTreeSet::new();
        loop {
            let mut members = base.clone();
            let mut counted: Vec<&MemberOp> = Vec::new();
            let mut again = false;
            for id in &order {
                if taken_back.contains(id) {
                    continue;
                }
                let op = &all[id];
                if !may_apply(&members, creator, op) {
                    continue;
                }
                match op.kind {
                    OpKind::Add => {
                        let role = op.role.unwrap_or_default();
                        let key = op.key.or_else(|| peer_key(&op.peer));
                        let m = members.entry(op.peer.clone()).or_insert(MemberRecord {
                            role,
                            added_by: Some(op.by.clone()),
                            removed_by: None,
                            key,
                            seen_at_removal: BTreeSet::new(),
                            cut: None,
                        });
                        m.role = role;
                        m.added_by = Some(op.by.clone());
                        m.removed_by = None;
                        m.cut = None;
                        if m.key.is_none() {
                            m.key = key;
                        }
                    }
                    OpKind::Remove => {
                        let seen = ancestors(&all, op);
                        for earlier in &counted {
                            if earlier.by == op.peer && !seen.contains(&earlier.id) {
                                taken_back.insert(earlier.id.clone());
                                again = true;
                            }
                        }
                        if again {
                            break;
                        }
                        if let Some(m) = members.get_mut(&op.peer) {
                            m.removed_by = Some(op.by.clone());
                            m.cut = op.cut.clone();
                            m.seen_at_removal = seen
                                .into_iter()
                                .filter(|s| all.get(s).is_some_and(|o| o.by == op.peer))
                                .collect();
                        }
                    }
                }
                counted.push(op);
            }
            if again {
                continue;
            }
            let counted = counted.iter().map(|o| o.id.clone()).collect();
            let writers = members.keys().map(|p| (actor_tag(p), p.clone())).collect();
            let all_work = members.values().all(|m| m.active() && m.role.works());
            return Membership {
                creator: Some(creator.clone()),
                members,
                ops: all,
                counted,
                legacy: legacy.is_some(),
                writers,
                all_work,
            };
        }
    }

    /// The materialization from the operations `stored` (root key → bytes), reusing those
    /// this one already decoded and checked.
    pub(crate) fn with_stored(
        &self,
        queue: Option<&QueueId>,
        creator: &PeerId,
        creator_key: Option<PublicKey>,
        stored: &BTreeMap<String, Vec<u8>>,
        legacy: Option<&BTreeSet<PeerId>>,
    ) -> Membership {
        let ops = stored.iter().filter_map(|(key, bytes)| {
            let id = key.strip_prefix(OP_PREFIX)?;
            match self.ops.get(id) {
                Some(op) if op.bytes == *bytes => Some(op.clone()),
                _ => MemberOp::stored_under(key, bytes),
            }
        });
        Membership::materialize(queue, creator, creator_key, ops, legacy)
    }

    /// The queue's creator.
    pub fn creator(&self) -> Option<&PeerId> {
        self.creator.as_ref()
    }

    /// Every peer ever added (removed ones too), by peer.
    pub fn records(&self) -> &BTreeMap<PeerId, MemberRecord> {
        &self.members
    }

    /// The role of a member not removed.
    pub fn role(&self, peer: &PeerId) -> Option<Role> {
        self.members
            .get(peer)
            .filter(|m| m.active())
            .map(|m| m.role)
    }

    /// Who wrote with `actor` an operation numbered `counter` in the document whose key is
    /// `doc` ([`crate::QueueView::doc_key`]): the member whose [`actor_tag`] the actor starts
    /// with, or [`Writer::Cut`] if that member was removed by a removal whose [`Cut`] names this
    /// document and does not include the operation. (A removal written before removals carried
    /// cuts, or in a document without a key, cuts nothing.)
    pub fn writer(&self, doc: Option<&str>, counter: u64, actor: &ActorId) -> Writer<'_> {
        let Some(peer) = tag_of(actor).and_then(|t| self.writers.get(&t)) else {
            return Writer::Unknown;
        };
        let Some(m) = self.members.get(peer) else {
            return Writer::Unknown;
        };
        if m.active() {
            return Writer::Member(peer, m.role);
        }
        let Some(cut) = m.cut.as_ref().filter(|c| Some(c.doc.as_str()) == doc) else {
            return Writer::Member(peer, m.role);
        };
        let seen = cut
            .clock
            .get(&actor.to_hex_string())
            .is_some_and(|&max| counter <= max);
        match seen {
            true => Writer::Member(peer, m.role),
            false => Writer::Cut,
        }
    }

    /// Whether every member not removed routes and runs and none was removed: then every
    /// write a reader checks for [`Role::works`] is allowed without looking its writer up.
    pub fn all_work(&self) -> bool {
        self.all_work
    }

    /// Whether `peer` is a member not removed.
    pub fn is_member(&self, peer: &PeerId) -> bool {
        self.role(peer).is_some()
    }

    /// The members not removed.
    pub fn active(&self) -> impl Iterator<Item = (&PeerId, Role)> {
        self.members
            .iter()
            .filter(|(_, m)| m.active())
            .map(|(p, m)| (p, m.role))
    }

    /// Ids of every operation read (in order).
    pub fn op_ids(&self) -> impl Iterator<Item = &String> {
        self.ops.keys()
    }

    /// An operation read, by id.
    pub fn op(&self, id: &str) -> Option<&MemberOp> {
        self.ops.get(id)
    }

    /// Whether the operation `id` counted.
    pub fn counts(&self, id: &str) -> bool {
        self.counted.contains(id)
    }

    /// How many operations read did not count.
    pub fn ignored(&self) -> usize {
        self.ops.len() - self.counted.len()
    }

    /// Whether a queue made before memberships were signed: its listed members count.
    pub fn is_legacy(&self) -> bool {
        self.legacy
    }

    /// Whether a removed peer's operation `id` stands: the removal had seen it.
    pub fn seen_at_removal(&self, peer: &PeerId, id: &str) -> bool {
        self.members
            .get(peer)
            .is_some_and(|m| m.seen_at_removal.contains(id))
    }

    /// The ids of the operations counted that no other counted operation names as seen: what
    /// a new operation should name (its `deps`), at most [`MAX_DEPS`].
    pub fn heads(&self) -> Vec<String> {
        let mut named: BTreeSet<&str> = BTreeSet::new();
        for id in &self.counted {
            if let Some(op) = self.ops.get(id) {
                named.extend(op.deps.iter().map(String::as_str));
            }
        }
        let mut heads: Vec<String> = self
            .ops
            .keys()
            .filter(|id| !named.contains(id.as_str()))
            .cloned()
            .collect();
        heads.truncate(MAX_DEPS);
        heads
    }

    /// The key `peer` signs with, if known.
    pub fn key_of(&self, peer: &PeerId) -> Option<PublicKey> {
        self.members
            .get(peer)
            .and_then(|m| m.key)
            .or_else(|| peer_key(peer))
    }
}

/// Whether `op`'s signer may make it among `members` (the state so far).
fn may_apply(members: &BTreeMap<PeerId, MemberRecord>, creator: &PeerId, op: &MemberOp) -> bool {
    if op.peer == *creator {
        return false;
    }
    let Some(signer) = members.get(&op.by).filter(|m| m.active()) else {
        return false;
    };
    if signer.key.or_else(|| peer_key(&op.by)) != Some(op.by_key) {
        return false;
    }
    match op.kind {
        OpKind::Add => signer.role == Role::Admin,
        OpKind::Remove => {
            members.get(&op.peer).is_some_and(|m| m.active())
                && (signer.role == Role::Admin || op.by == op.peer)
        }
    }
}

/// The ids of `all` in the order they are applied: each after the operations it names as seen
/// (an operation naming one missing is left out, and so are those after it), ties by id;
/// operations for another queue are left out.
fn causal_order(all: &BTreeMap<String, MemberOp>, queue: Option<&QueueId>) -> Vec<String> {
    let usable = |op: &MemberOp| queue.is_none_or(|q| op.queue == *q);
    let mut waiting: BTreeMap<&str, usize> = BTreeMap::new();
    let mut after: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut ready: BTreeSet<&str> = BTreeSet::new();
    for (id, op) in all {
        if !usable(op) {
            continue;
        }
        let deps: BTreeSet<&str> = op.deps.iter().map(String::as_str).collect();
        if deps.iter().any(|d| !all.get(*d).is_some_and(usable)) {
            continue;
        }
        if deps.is_empty() {
            ready.insert(id);
        } else {
            waiting.insert(id, deps.len());
            for d in deps {
                after.entry(d).or_default().push(id);
            }
        }
    }
    let mut order = Vec::with_capacity(all.len());
    while let Some(id) = ready.pop_first() {
        order.push(id.to_owned());
        for next in after.get(id).into_iter().flatten() {
            if let Some(n) = waiting.get_mut(next) {
                *n -= 1;
                if *n == 0 {
                    waiting.remove(next);
                    ready.insert(next);
                }
            }
        }
    }
    order
}

/// The ids of the operations `op` had seen, directly or not.
fn ancestors(all: &BTreeMap<String, MemberOp>, op: &MemberOp) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack: Vec<&str> = op.deps.iter().map(String::as_str).collect();
    while let Some(id) = stack.pop() {
        if !seen.insert(id.to_owned()) {
            continue;
        }
        if let Some(o) = all.get(id) {
            stack.extend(o.deps.iter().map(String::as_str));
        }
    }
    seen
}

/// A bearer invite: "whoever holds this may join `queue` as `role` until `expires_ms`",
/// signed by an admin. Redeemed by an admin node, which then signs the add itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The queue.
    pub queue: QueueId,
    /// The role it gives.
    pub role: Role,
    /// Until when it may be redeemed (unix ms, the redeeming node's clock).
    pub expires_ms: u64,
    /// Who signed it.
    pub by: PeerId,
    /// The key it was signed with.
    pub by_key: PublicKey,
    /// A random nonce naming it.
    pub nonce: String,
    bytes: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct GrantBody {
    v: u32,
    q: String,
    role: Role,
    expires_ms: u64,
    by: String,
    by_key: String,
    nonce: String,
}

impl Grant {
    /// Signs a bearer invite.
    pub fn sign(
        signer: &Signer,
        queue: &QueueId,
        role: Role,
        expires_ms: u64,
        nonce: String,
    ) -> Grant {
        let body = GrantBody {
            v: 1,
            q: queue.as_str().to_owned(),
            role,
            expires_ms,
            by: signer.peer.as_str().to_owned(),
            by_key: hex::encode(signer.public()),
            nonce,
        };
        let body = serde_json::to_vec(&body).expect("a grant serializes");
        let mut bytes = signer.sign(GRANT_DOMAIN, &body).to_vec();
        bytes.extend_from_slice(&body);
        Grant::decode(&bytes).expect("a signed grant reads back")
    }

    /// Reads a grant and checks its signature (not whether its signer is an admin).
    pub fn decode(bytes: &[u8]) -> Result<Grant, OpError> {
        if bytes.len() > MAX_OP_BYTES {
            return Err(OpError::Malformed(format!("{} bytes", bytes.len())));
        }
        let Some((sig, body)) = bytes.split_first_chunk::<64>() else {
            return Err(OpError::Malformed("shorter than a signature".into()));
        };
        let b: GrantBody =
            serde_json::from_slice(body).map_err(|e| OpError::Malformed(e.to_string()))?;
        if b.v != 1 {
            return Err(OpError::Malformed(format!("version {}", b.v)));
        }
        let by_key =
            hex_key(&b.by_key).ok_or_else(|| OpError::Malformed("signer key".to_owned()))?;
        let by = PeerId::new(b.by);
        if peer_key(&by).is_some_and(|k| k != by_key) {
            return Err(OpError::WrongKey(by));
        }
        if !verify(&by_key, GRANT_DOMAIN, body, sig) {
            return Err(OpError::BadSignature);
        }
        Ok(Grant {
            queue: QueueId::new(b.q),
            role: b.role,
            expires_ms: b.expires_ms,
            by,
            by_key,
            nonce: b.nonce,
            bytes: bytes.to_vec(),
        })
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(n: u8) -> Signer {
        Signer::new(PeerId::new(format!("p{n}")), [n; 32])
    }

    fn add(s: &Signer, q: &QueueId, p: &Signer, role: Role, deps: Vec<String>) -> MemberOp {
        MemberOp::sign(
            s,
            NewOp {
                queue: q,
                kind: OpKind::Add,
                peer: p.peer(),
                role: Some(role),
                key: Some(p.public()),
                deps,
                at_ms: 1,
                via: None,
                cut: None,
            },
        )
    }

    fn remove(s: &Signer, q: &QueueId, p: &PeerId, deps: Vec<String>) -> MemberOp {
        MemberOp::sign(
            s,
            NewOp {
                queue: q,
                kind: OpKind::Remove,
                peer: p,
                role: None,
                key: None,
                deps,
                at_ms: 2,
                via: None,
                cut: None,
            },
        )
    }

    #[test]
    fn an_admin_adds_and_removes_and_a_member_cannot() {
        let q = QueueId::new("automerge:q");
        let (c, a, b, x) = (signer(1), signer(2), signer(3), signer(4));
        let m = |ops: Vec<MemberOp>| {
            Membership::materialize(Some(&q), c.peer(), Some(c.public()), ops, None)
        };
        let add_a = add(&c, &q, &a, Role::Admin, vec![]);
        let add_b = add(&a, &q, &b, Role::Member, vec![add_a.id.clone()]);
        let by_b = add(&b, &q, &x, Role::Member, vec![add_b.id.clone()]);
        let got = m(vec![add_a.clone(), add_b.clone(), by_b.clone()]);
        assert_eq!(got.role(a.peer()), Some(Role::Admin));
        assert_eq!(got.role(b.peer()), Some(Role::Member));
        assert_eq!(got.role(x.peer()), None, "a member cannot add");
        assert_eq!(got.ignored(), 1);
        // Without the operation that added its signer, an add does not count.
        assert_eq!(m(vec![add_b.clone()]).role(b.peer()), None);
        // A removal; the creator cannot be removed.
        let rm_b = remove(&a, &q, b.peer(), vec![add_b.id.clone()]);
        let rm_c = remove(&a, &q, c.peer(), vec![add_a.id.clone()]);
        let got = m(vec![add_a.clone(), add_b.clone(), rm_b, rm_c]);
        assert_eq!(got.role(b.peer()), None);
        assert_eq!(got.records()[b.peer()].removed_by.as_ref(), Some(a.peer()));
        assert_eq!(got.role(c.peer()), Some(Role::Admin));
        // Another queue's operation does not count here.
        let other = QueueId::new("automerge:other");
        let elsewhere = add(&c, &other, &x, Role::Member, vec![]);
        assert_eq!(m(vec![elsewhere]).role(x.peer()), None);
    }

    #[test]
    fn a_removal_takes_back_what_the_removed_admin_did_unseen() {
        let q = QueueId::new("automerge:q");
        let (c, a, b) = (signer(1), signer(2), signer(3));
        let add_a = add(&c, &q, &a, Role::Admin, vec![]);
        // Concurrently: a adds b; c removes a without having seen that.
        let add_b = add(&a, &q, &b, Role::Member, vec![add_a.id.clone()]);
        let rm_a = remove(&c, &q, a.peer(), vec![add_a.id.clone()]);
        let got = Membership::materialize(
            Some(&q),
            c.peer(),
            Some(c.public()),
            vec![add_a.clone(), add_b.clone(), rm_a.clone()],
            None,
        );
        assert_eq!(got.role(a.peer()), None);
        assert_eq!(got.role(b.peer()), None, "a's unseen add is taken back");
        // Had c seen a's add, it stands.
        let rm_a_seen = remove(&c, &q, a.peer(), vec![add_b.id.clone()]);
        let got = Membership::materialize(
            Some(&q),
            c.peer(),
            Some(c.public()),
            vec![add_a, add_b, rm_a_seen],
            None,
        );
        assert_eq!(got.role(b.peer()), Some(Role::Member));
    }

    #[test]
    fn forged_and_tampered_operations_are_refused() {
        let q = QueueId::new("automerge:q");
        let c = signer(1);
        let x = signer(9);
        let op = add(&c, &q, &x, Role::Admin, vec![]);
        let mut bad = op.bytes().to_vec();
        let n = bad.len();
        bad[n - 3] ^= 1;
        assert!(MemberOp::decode(&bad).is_err());
        assert!(MemberOp::decode(&bad[..10]).is_err());
        // Signed by x claiming to be c: x's key is not the creator's.
        let forged = add(
            &Signer::new(c.peer().clone(), [9; 32]),
            &q,
            &x,
            Role::Admin,
            vec![],
        );
        let got = Membership::materialize(Some(&q), c.peer(), Some(c.public()), vec![forged], None);
        assert_eq!(got.role(x.peer()), None);
        // Stored under a key that does not name it: not read.
        assert!(MemberOp::stored_under("mop/00", op.bytes()).is_none());
        assert!(MemberOp::stored_under(&op.key_name(), op.bytes()).is_some());
    }

    #[test]
    fn a_libp2p_peer_id_gives_its_key_and_a_grant_verifies() {
        // 12D3KooW ids are identity multihashes of an ed25519 protobuf key.
        let key = [7u8; 32];
        let mut bytes = vec![0x00, 0x24, 0x08, 0x01, 0x12, 0x20];
        bytes.extend_from_slice(&key);
        let id = PeerId::new(bs58::encode(&bytes).into_string());
        assert!(id.as_str().starts_with("12D3KooW"));
        assert_eq!(peer_key(&id), Some(key));
        assert_eq!(peer_key(&PeerId::new("node0")), None);
        let s = signer(3);
        let q = QueueId::new("automerge:q");
        let g = Grant::sign(&s, &q, Role::Submitter, 99, "n".into());
        assert_eq!(Grant::decode(g.bytes()), Ok(g.clone()));
        let mut bad = g.bytes().to_vec();
        bad[0] ^= 1;
        assert_eq!(Grant::decode(&bad), Err(OpError::BadSignature));
    }
}
