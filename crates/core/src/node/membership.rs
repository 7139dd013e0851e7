//! Membership commands and the invite handshake: invites made (`Command::Invite`), redeemed
//! by a joining node (`Command::JoinInvite`, [`crate::invite`]) and checked when presented
//! here (`ReplicaEvent::Presented`); members listed and removed; the role checks of this
//! node's own actions.

use std::collections::BTreeSet;

use piecework_queue_doc::membership::{Cut, Grant, MemberOp, NewOp, OpKind, peer_key};
use piecework_queue_doc::{PeerId, QueueId, Role, queue};
use piecework_replica::DocId;

use super::*;
use crate::invite::{self, Invite, InviteProof};

impl Core {
    /// This node's role in a joined queue (`None`: not a member, or not joined).
    pub(super) fn role_in(&self, queue: &QueueId) -> Option<Role> {
        self.queues
            .get(queue)
            .and_then(|q| q.view.membership.role(&self.config.peer))
    }

    /// Refuses an action this node's role in `queue` does not allow.
    pub(super) fn require(
        &self,
        queue: &QueueId,
        needs: Role,
        action: &'static str,
    ) -> Result<(), QueueError> {
        let Some(q) = self.queues.get(queue) else {
            return Err(QueueError::NotJoined(queue.clone()));
        };
        let role = q.view.membership.role(&self.config.peer);
        if role.is_some_and(|r| r >= needs) {
            return Ok(());
        }
        Err(QueueError::Forbidden {
            queue: queue.clone(),
            role: role.map_or_else(|| "not a member".to_owned(), |r| format!("a {r}")),
            action,
            needs: match needs {
                Role::Submitter => "a member of any role",
                Role::Member => "the member or admin role",
                Role::Admin => "the admin role",
            },
        })
    }

    /// Refuses a cancel, requeue or undo of `entry` (a task of `queue`) that this node's role
    /// does not allow: a submitter acts on its own tasks only (undo: never).
    pub(super) fn may_act_on(
        &self,
        queue: &QueueId,
        entry: &piecework_queue_doc::TaskEntry,
        action: &'static str,
        own_ok: bool,
    ) -> Result<(), TaskError> {
        match self.role_in(queue) {
            Some(r) if r.works() => Ok(()),
            Some(Role::Submitter) if own_ok && entry.submitter == self.config.peer => Ok(()),
            role => Err(TaskError::Forbidden(format!(
                "this node is {} of queue {queue}: {action} task {} needs the member or admin \
                 role{}",
                role.map_or_else(|| "not a member".to_owned(), |r| format!("a {r}")),
                entry.id,
                if own_ok {
                    " (a submitter acts on its own tasks only)"
                } else {
                    ""
                }
            ))),
        }
    }

    /// Makes an invite to `queue` (this node must be an admin of it).
    pub(super) fn invite(
        &mut self,
        now: Time,
        queue: &QueueId,
        req: api::InviteRequest,
    ) -> Result<api::Invited, QueueError> {
        self.require(queue, Role::Admin, "inviting")?;
        let role = req.role.unwrap_or_default();
        let proof = match req.for_peer {
            Some(peer) => {
                if req.expires_ms.is_some() {
                    return Err(QueueError::BadInvite(
                        "an invite for one peer is written into the queue at once and does not \
                         expire: give `expires_ms` only to an invite without `for`"
                            .into(),
                    ));
                }
                if peer.as_str().is_empty() || peer.as_str().len() > 128 {
                    return Err(QueueError::BadInvite(format!("not a peer id: {peer:?}")));
                }
                let op = self.sign_op(NewOp {
                    queue,
                    kind: OpKind::Add,
                    peer: &peer,
                    role: Some(role),
                    key: None,
                    deps: vec![],
                    at_ms: now.unix_ms,
                    via: None,
                    cut: None,
                });
                self.write_op(now, queue, &op)?;
                InviteProof::Add(op)
            }
            None => {
                let ms = req.expires_ms.unwrap_or(api::INVITE_EXPIRES_MS);
                let mut nonce = [0u8; 16];
                self.rng.fill_bytes(&mut nonce);
                let grant = Grant::sign(
                    &self.signer,
                    queue,
                    role,
                    now.unix_ms.saturating_add(ms),
                    hex::encode(nonce),
                );
                InviteProof::Grant(grant)
            }
        };
        let invite = Invite {
            queue: queue.clone(),
            member: self.config.peer.clone(),
            addrs: self.members.advertised().to_vec(),
            proof,
        };
        Ok(api::Invited {
            token: invite.encode(),
        })
    }

    /// Begins a join with an invite: dial its member, present it, wait for the queue.
    pub(super) fn join_invite(&mut self, now: Time, cmd: CommandId, token: &str) {
        let invite = match Invite::decode(token) {
            Ok(i) => i,
            Err(e) => {
                self.replies.push_back((
                    cmd,
                    Reply::Joined(Err(QueueError::BadInvite(e.to_string()))),
                ));
                return;
            }
        };
        let id = invite.queue.clone();
        if let Some(q) = self.queues.get(&id) {
            self.replies
                .push_back((cmd, Reply::Joined(Ok(q.view.clone()))));
            return;
        }
        let Some(doc) = queue_doc(&id) else {
            self.replies
                .push_back((cmd, Reply::Joined(Err(QueueError::BadId(id.to_string())))));
            return;
        };
        if invite.member == self.config.peer {
            self.replies.push_back((
                cmd,
                Reply::Joined(Err(QueueError::BadInvite(
                    "this invite was made by this node: give it to the node that should join"
                        .into(),
                ))),
            ));
            return;
        }
        if self.waiting() >= MAX_WAITERS {
            self.replies
                .push_back((cmd, Reply::Joined(Err(QueueError::Busy(MAX_WAITERS)))));
            return;
        }
        let deadline = now.mono + FIND_TIMEOUT;
        self.docs.join_begins(now.mono);
        let by = InviteJoin {
            member: invite.member.clone(),
            addrs: invite.addrs.clone(),
            proof: invite::presented(token, &self.signer.public()),
            for_this_peer: matches!(invite.proof, InviteProof::Add(_)),
            presented: false,
        };
        self.wait_for(
            now,
            &doc,
            DocWaiter::Join {
                cmd,
                id,
                from_peers: true,
                deadline,
                invite: Some(Box::new(by)),
            },
        );
    }

    /// Asks for a queue's first document with an invite: presents it to the invite's member,
    /// dialed first if need be (the join is asked again when it connects, or every
    /// [`JOIN_ASK_EVERY`]). An invite for this peer alone (an add written in the queue) is
    /// presented to every connected peer too: any member admits its peer. An invite for
    /// whoever holds it goes to its member alone (to others it would be given away).
    pub(super) fn present_invite(&mut self, now: Time, doc: &DocId, mut waiter: DocWaiter) {
        let DocWaiter::Join {
            invite: Some(by), ..
        } = &mut waiter
        else {
            return;
        };
        let (member, proof) = (by.member.clone(), by.proof.clone());
        let mut to: Vec<PeerId> = Vec::new();
        if self.members.is_connected(&member) {
            to.push(member.clone());
            by.presented = true;
        } else {
            self.io.push_back(Io::Dial {
                peer: member.clone(),
                addrs: by.addrs.clone(),
            });
        }
        if by.for_this_peer {
            to.extend(
                self.members
                    .connected_peers()
                    .filter(|p| **p != member)
                    .cloned(),
            );
        }
        if to.is_empty() {
            self.docs.retry_join(waiter);
            return;
        }
        self.docs.park(doc, waiter);
        self.replica.present(doc, &to, proof, now.mono);
    }

    /// A peer presented a proof that it may have `doc` (`ReplicaEvent::Presented`): an invite
    /// to the queue whose first document it is. Admits it if the invite holds.
    pub(super) fn presented(&mut self, now: Time, peer: PeerId, doc: DocId, proof: Vec<u8>) {
        let queue = QueueId::new(doc.as_str());
        let accepted = match self.redeem(now, &peer, &queue, &proof) {
            Ok(()) => true,
            Err(why) => {
                self.events.push_back(Event::Rejected {
                    peer: peer.clone(),
                    reason: format!("invite to {queue} refused: {why}"),
                });
                false
            }
        };
        self.replica
            .answer_presented(&peer, &doc, accepted, now.mono);
    }

    fn redeem(
        &mut self,
        now: Time,
        peer: &PeerId,
        queue: &QueueId,
        proof: &[u8],
    ) -> Result<(), String> {
        let Some(q) = self.queues.get(queue) else {
            return Err("this node has not joined that queue".into());
        };
        if q.view.membership.is_member(peer) {
            return Ok(());
        }
        let (invite, key) = invite::read_presented(proof).map_err(|e| e.to_string())?;
        if invite.queue != *queue {
            return Err("the invite is for another queue".into());
        }
        // The transport authenticated the peer: a key it claims must be its id's, if its id
        // is made of one.
        if peer_key(peer).is_some_and(|k| k != key) {
            return Err("the key presented is not the peer's".into());
        }
        match invite.proof {
            InviteProof::Add(op) => {
                if op.peer != *peer || op.kind != OpKind::Add {
                    return Err("the invite is for another peer".into());
                }
                self.write_op(now, queue, &op).map_err(|e| e.to_string())?;
            }
            InviteProof::Grant(g) => {
                let m = &q.view.membership;
                if m.role(&g.by) != Some(Role::Admin) || m.key_of(&g.by) != Some(g.by_key) {
                    return Err(format!("{} is not an admin of the queue", g.by));
                }
                if now.unix_ms > g.expires_ms {
                    return Err("the invite has expired".into());
                }
                if self.role_in(queue) != Some(Role::Admin) {
                    return Err("only an admin redeems an invite for whoever holds it".into());
                }
                let key = peer_key(peer).is_none().then_some(key);
                let via = Some(g.nonce.clone());
                let op = self.sign_op(NewOp {
                    queue,
                    kind: OpKind::Add,
                    peer,
                    role: Some(g.role),
                    key,
                    deps: vec![],
                    at_ms: now.unix_ms,
                    via,
                    cut: None,
                });
                self.write_op(now, queue, &op).map_err(|e| e.to_string())?;
            }
        }
        if self
            .queues
            .get(queue)
            .is_some_and(|q| q.view.membership.is_member(peer))
        {
            Ok(())
        } else {
            Err("the invite's signer may not add members".into())
        }
    }

    /// Signs `op` as this node, naming as seen the membership operations its view holds.
    fn sign_op(&self, mut op: NewOp<'_>) -> MemberOp {
        op.deps = self
            .queues
            .get(op.queue)
            .map(|q| q.view.membership.heads())
            .unwrap_or_default();
        MemberOp::sign(&self.signer, op)
    }

    /// Stores a membership operation in the queue's current document and refreshes the view.
    fn write_op(&mut self, now: Time, queue: &QueueId, op: &MemberOp) -> Result<(), QueueError> {
        let doc = self
            .queues
            .get(queue)
            .map(|q| q.doc.clone())
            .ok_or_else(|| QueueError::NotJoined(queue.clone()))?;
        self.change(&doc, |d| queue::add_member_op(d, op).map(|_| ()))
            .unwrap_or(Err(queue::WriteError::NotAQueue))?;
        self.stale.remove(queue);
        self.refresh(now, queue);
        Ok(())
    }

    /// A queue made before memberships were signed, opened by its creator: it signs an add
    /// (as a member) for every peer the queue lists, then writes its key, in one change. From
    /// then on only signed operations make members: a peer that lists itself the old way is
    /// no longer one.
    pub(super) fn adopt_legacy(&mut self, now: Time, id: &QueueId) {
        let Some(q) = self.queues.get(id) else { return };
        let m = &q.view.membership;
        if !m.is_legacy() || m.creator() != Some(&self.config.peer) {
            return;
        }
        let listed: Vec<PeerId> = m
            .active()
            .filter(|(p, _)| **p != self.config.peer)
            .map(|(p, _)| p.clone())
            .collect();
        let mut ops = Vec::with_capacity(listed.len());
        for peer in &listed {
            let mut op = self.sign_op(NewOp {
                queue: id,
                kind: OpKind::Add,
                peer,
                role: Some(Role::Member),
                key: None,
                deps: vec![],
                at_ms: now.unix_ms,
                via: None,
                cut: None,
            });
            // Each names the ones before it as seen: one causal chain.
            if let Some(prev) = ops.last().map(|o: &MemberOp| o.id.clone()) {
                op = MemberOp::sign(
                    &self.signer,
                    NewOp {
                        queue: id,
                        kind: OpKind::Add,
                        peer,
                        role: Some(Role::Member),
                        key: None,
                        deps: vec![prev],
                        at_ms: now.unix_ms,
                        via: None,
                        cut: None,
                    },
                );
            }
            ops.push(op);
        }
        let key = self.signer.public();
        self.write_queue(now, id, "the queue's signed membership", |d| {
            for op in &ops {
                queue::add_member_op(d, op)?;
            }
            queue::set_signed_membership(d, id, &key)
        });
    }

    /// Whether `peer`, which subscribed to `topic`, is a member of a queue this node serves
    /// (`None`: the topic is none of this node's queues').
    pub fn gossip_standing(&self, topic: &str, peer: &PeerId) -> Option<bool> {
        self.topics.get(topic)?;
        Some(self.queues.values().any(|q| q.view.is_member(peer)))
    }

    /// A queue's membership changed from `old` to `new`: the transport's standing of the peers
    /// that came in or went out ([`Io::Standing`]).
    pub(super) fn standings(&mut self, old: &QueueView, new: &QueueView) {
        let before: BTreeSet<&PeerId> = old.membership.active().map(|(p, _)| p).collect();
        let after: BTreeSet<&PeerId> = new.membership.active().map(|(p, _)| p).collect();
        for p in after.difference(&before) {
            if **p != self.config.peer {
                self.io.push_back(Io::Standing {
                    peer: (*p).clone(),
                    member: true,
                });
            }
        }
        for p in before.difference(&after) {
            // Still a member of another queue here: it keeps its standing.
            if self.queues.values().any(|q| q.view.is_member(p)) {
                continue;
            }
            self.io.push_back(Io::Standing {
                peer: (*p).clone(),
                member: false,
            });
        }
    }

    /// The members of a joined queue, as the API lists them.
    pub(super) fn members_of(&self, queue: &QueueId) -> Result<Vec<api::MemberEntry>, QueueError> {
        let q = self
            .queues
            .get(queue)
            .ok_or_else(|| QueueError::NotJoined(queue.clone()))?;
        Ok(q.view
            .membership
            .records()
            .iter()
            .map(|(peer, r)| api::MemberEntry {
                peer: peer.clone(),
                role: r.role,
                added_by: r.added_by.clone(),
                removed: !r.active(),
                removed_by: r.removed_by.clone(),
            })
            .collect())
    }

    /// Removes a member (this node must be an admin, or the member itself).
    pub(super) fn remove_member(
        &mut self,
        now: Time,
        queue: &QueueId,
        peer: &PeerId,
    ) -> Result<Vec<api::MemberEntry>, QueueError> {
        if *peer != self.config.peer {
            self.require(queue, Role::Admin, "removing a member")?;
        }
        let q = self
            .queues
            .get(queue)
            .ok_or_else(|| QueueError::NotJoined(queue.clone()))?;
        let m = &q.view.membership;
        if m.creator() == Some(peer) {
            return Err(QueueError::CreatorStays(queue.clone()));
        }
        if !m.is_member(peer) {
            return Err(QueueError::UnknownMember(queue.clone(), peer.clone()));
        }
        // What this node has seen of the peer's writes in the queue's current document: the
        // rest is ignored by every replica (`queue-doc`'s `judge.rs`).
        let cut = q.view.doc_key.as_deref().and_then(|key| {
            let doc = self.replica.get(&q.doc)?;
            Some(Cut::of_doc(doc, key, peer))
        });
        let op = self.sign_op(NewOp {
            queue,
            kind: OpKind::Remove,
            peer,
            role: None,
            key: None,
            deps: vec![],
            at_ms: now.unix_ms,
            via: None,
            cut,
        });
        self.write_op(now, queue, &op)?;
        self.members_of(queue)
    }

    /// The peers a queue's documents are synced with: its members not removed, this node, and
    /// `also` (the member a join by invite was served by).
    pub(super) fn group_of(&self, view: &QueueView, also: Option<&PeerId>) -> BTreeSet<PeerId> {
        view.membership
            .active()
            .map(|(p, _)| p.clone())
            .chain([self.config.peer.clone()])
            .chain(also.cloned())
            .collect()
    }
}

/// A join by invite, while it waits for the queue's first document.
#[derive(Clone, Debug)]
pub(super) struct InviteJoin {
    /// The member to ask.
    pub(super) member: PeerId,
    /// Where it listens.
    pub(super) addrs: Vec<String>,
    /// What to present ([`invite::presented`]).
    pub(super) proof: Vec<u8>,
    /// An invite for this peer alone: presented to every connected peer.
    pub(super) for_this_peer: bool,
    /// Presented to the invite's member at least once: an "unavailable" from every peer asked
    /// then is a refusal, answered at once rather than asked again until the deadline.
    pub(super) presented: bool,
}
