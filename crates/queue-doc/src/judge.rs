//! Which writes a view counts, by who wrote them.
//!
//! Automerge changes are not signed, but every honest node writes with an actor id that starts
//! with its peer's tag ([`crate::membership::actor_tag`]), so a reader can attribute a value
//! to a member by the actor of the operation that wrote it. A [`Judge`] built from the
//! document's [`Membership`] answers, for each value a view reads, whether it counts:
//!
//! - a removed peer's write that its removal's cut does not include never counts;
//! - a write that needs a role ([`Right`]) counts only if its writer has it now: `Work`
//!   (router claims, assignments, starts and ends, schedule firings, pause, boosts) needs a
//!   member or an admin, `Admin` (the configuration, the schedules) an admin; a cancel or a
//!   requeue needs a member, or the task's own submitter;
//! - in a successor, its build (the operations up to the `built` key's, by its writer) counts
//!   whatever the builder's role: it copies the predecessor's state as that view judged it;
//! - a write whose writer cannot be known (an actor no member's tag names: a queue written
//!   before actors were tagged, or a forged actor) counts, as every write did before.
//!
//! A value that does not count is read as if it had not been written; what it overwrote in
//! the same document is not brought back (Automerge keeps no history a view reads).
//! Every replica holding the same changes judges them the same, so views still agree.

use automerge::{ActorId, ObjId};

use crate::ids::PeerId;
use crate::membership::{Membership, Role, Writer};

/// What a write needs of its writer's role to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Right {
    /// Any member (a submission, a dedup bump, an input mark).
    Any,
    /// A member or an admin: routing and running.
    Work,
    /// An admin.
    Admin,
}

/// Judges the writes of one document (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Judge<'a> {
    membership: Option<&'a Membership>,
    doc: Option<&'a str>,
    built: Option<&'a (u64, ActorId)>,
}

impl<'a> Judge<'a> {
    /// A judge that counts every write: for readers of a document whose membership they do
    /// not hold (carrying late writes out of a sealed document is judged by the successor's
    /// readers instead).
    pub(crate) fn open() -> Judge<'static> {
        Judge {
            membership: None,
            doc: None,
            built: None,
        }
    }

    /// The judge of the document whose key is `doc` and whose membership is `membership`.
    pub(crate) fn new(membership: &'a Membership, doc: Option<&'a str>) -> Judge<'a> {
        Judge {
            membership: Some(membership),
            doc,
            built: None,
        }
    }

    /// In a successor: `built` is its build's last operation (counter, actor); the operations
    /// up to it by that actor are the predecessor's state as its view judged it, and count
    /// whatever the builder's role (a member's rotation keeps an admin's configuration).
    pub(crate) fn built(self, built: Option<&'a (u64, ActorId)>) -> Judge<'a> {
        Judge { built, ..self }
    }

    fn copied(&self, id: &ObjId) -> bool {
        match (self.built, id) {
            (Some((last, builder)), ObjId::Id(counter, actor, _)) => {
                counter <= last && actor == builder
            }
            _ => false,
        }
    }

    /// Who wrote the value (or made the object) `id`.
    pub(crate) fn writer(&self, id: &ObjId) -> Writer<'a> {
        match (self.membership, id) {
            (Some(m), ObjId::Id(counter, actor, _)) => m.writer(self.doc, *counter, actor),
            _ => Writer::Unknown,
        }
    }

    /// Whether the value (or object) `id` counts for a write that needs `need`.
    pub(crate) fn allows(&self, id: &ObjId, need: Right) -> bool {
        let Some(m) = self.membership else {
            return true;
        };
        if (need != Right::Admin && m.all_work()) || self.copied(id) {
            return true;
        }
        match self.writer(id) {
            Writer::Unknown => true,
            Writer::Cut => false,
            Writer::Member(_, role) => match need {
                Right::Any => true,
                Right::Work => role.works(),
                Right::Admin => role == Role::Admin,
            },
        }
    }

    /// For a cancel or a requeue: `None` if `id` does not count at all, `Some(None)` if it
    /// counts for any task, `Some(Some(peer))` if only for a task `peer` submitted (its writer
    /// is a submitter).
    pub(crate) fn owner_only(&self, id: &ObjId) -> Option<Option<PeerId>> {
        if self.membership.is_none_or(Membership::all_work) || self.copied(id) {
            return Some(None);
        }
        match self.writer(id) {
            Writer::Unknown => Some(None),
            Writer::Cut => None,
            Writer::Member(_, role) if role.works() => Some(None),
            Writer::Member(peer, _) => Some(Some(peer.clone())),
        }
    }
}
