//! Piecework's document sync engine: the Automerge documents a peer holds, and their sync with
//! other peers, as a sans-IO state machine on Automerge's own sync protocol.
//!
//! Piecework first synced documents with samod. samod keeps every document it has ever seen
//! loaded and does work proportional to *all* of them on every message (measured in
//! `docs/sync.md`: a change's round trip takes 0.3 ms with 10 documents loaded and 38 ms with
//! 5,000). With one document per task that does not scale, so this crate does the same job with
//! work per message proportional to the one document it concerns.
//!
//! The engine is pure: it reads no clock and no random source and does no I/O. Time comes in as
//! an argument (`now`) where something depends on it; storage and the network are the driver's.
//!
//! # Model
//!
//! A [`Replica`] holds loaded documents, each with a per-peer [`automerge::sync::State`] for
//! every peer it is being synced with.
//!
//! **Groups and scopes.** A *group* is a queue, named by its queue document's [`DocId`], with a
//! set of member peers ([`Replica::set_group`]). A document's [`Scope`] puts it in one group
//! ([`Replica::set_scope`]): it is stored, relayed and announced only with that group's members.
//! An *announced* document is synced with every connected member (on connect and after every
//! change); an unannounced one (a final task) only with members that ask for it. A
//! *requestable* document (a queue document) is also sent to any peer that asks for it by id,
//! since knowing the id is what lets a peer join, but it is announced only to members.
//!
//! **Accept policy.** A message about a document without a scope, or from a peer that is not a
//! member of its group, is answered [`Message::Unavailable`] and reported as
//! [`Event::Refused`]; nothing is stored or loaded for it. Two exceptions: the peers asked by a
//! [`Replica::fetch`] may send that document (that is how a node joins a queue: it fetches the
//! queue document by id, then scopes it); and requestable documents, from anyone. A push of a
//! document without a scope yet (a task whose entry in its queue document has not arrived) is
//! *held* for a while ([`HELD_FOR`], at most [`MAX_HELD`]): when the driver scopes the document,
//! the replica asks the pushers for it again.
//!
//! **Loading.** A message for a scoped document that is not loaded asks the driver to load it
//! ([`Event::Load`]); if storage does not have it, a push is taken in as a new document, and a
//! request is answered "unavailable".
//!
//! **Saving.** [`Replica::unsaved`] gives the changes since the last save the driver
//! acknowledged with [`Replica::mark_saved`]; a document with changes not marked saved cannot be
//! evicted.
//!
//! **Flow control.** Sync messages are generated when polled, from the sync state, so the
//! changes made between two polls travel together. While a peer is blocked
//! ([`Replica::handle_blocked`]) nothing is generated for it; what it is owed (a set of
//! documents) waits, and becomes one message per document when it is unblocked.
//!
//! **Bounds.** Everything a peer can make the replica keep is bounded: loads started by peers
//! ([`MAX_PENDING_LOADS`]), messages kept while loading ([`MAX_QUEUED_PER_LOAD`],
//! [`MAX_QUEUED_BYTES`]), held pushes ([`MAX_HELD`]), requests and answers waiting for a peer
//! ([`MAX_QUEUED_PER_PEER`]), the size of one sync message
//! ([`MAX_SYNC_MESSAGE_BYTES`]: larger ones this replica sends in parts) and what its changes may
//! inflate to ([`MAX_INFLATED_BYTES`]), the changes kept aside for a missing dependency
//! ([`MAX_ASIDE_BYTES`]), the probes of
//! a peer's Bloom filter ([`MAX_BLOOM_PROBES`]), fetches ([`FETCH_TIMEOUT`]). Loaded documents
//! are the driver's to bound: it reads [`Replica::loaded`] and [`Replica::evict`]s; peers only
//! add documents the driver scoped or fetches. Groups and scopes grow only by the driver's
//! commands.
//!
//! **Checks.** A peer's changes are checked before Automerge applies them, for what Automerge
//! 0.12 would panic on (operation counters at the 32-bit bound, an unknown actor's change not
//! numbered 1, operation ids reused): a message holding one is rejected ([`Event::Rejected`])
//! and the document does not change. A change waiting for a dependency is checked when that
//! arrives. A change too large for any message goes once per connection.
//!
//! # Driving a replica
//!
//! 1. Set up: [`Replica::new`], [`Replica::set_actor`] (a fresh actor id per node incarnation),
//!    [`Replica::set_local_peer`] (which of two members passes a third's changes on first,
//!    [`RELAY_AFTER`]), then the groups ([`Replica::set_group`]) and documents ([`Replica::create`],
//!    [`Replica::insert`], [`Replica::set_scope`]) the node has.
//! 2. Inputs: [`Replica::handle_connected`], [`Replica::handle_disconnected`],
//!    [`Replica::handle_blocked`], [`Replica::handle_unblocked`], [`Replica::handle_message`],
//!    [`Replica::handle_loaded`] (the answer to [`Event::Load`]), [`Replica::handle_timeout`].
//! 3. Commands: [`Replica::set_group`], [`Replica::remove_group`], [`Replica::set_scope`],
//!    [`Replica::clear_scope`], [`Replica::create`], [`Replica::insert`], [`Replica::change`],
//!    [`Replica::fetch`], [`Replica::evict`], [`Replica::mark_saved`].
//! 4. After each input or command, drain the outputs: [`Replica::poll_event`] (answer `Load`,
//!    write [`Replica::unsaved`] after `Changed` and local changes, wake waiters on `Arrived` and
//!    `Unavailable`), [`Replica::poll_transmit`] (messages to peers, in order per peer), and
//!    arm a timer for [`Replica::poll_timeout`].
//!
//! Messages to one peer must be delivered in order; a lost message is repaired by the protocol
//! once both sides reset (reconnect).

#![warn(missing_docs, unreachable_pub)]

mod chunks;
mod ids;
mod load;
mod message;
mod receive;
mod replica;
#[cfg(any(test, feature = "test-support"))]
mod test_support;
#[cfg(test)]
mod tests;
mod validate;

pub use ids::{DocId, MAX_DOC_ID, PeerId, URL_PREFIX};
pub use load::{REPLAY_MIN_BYTES, load_chunks};
pub use message::{DecodeError, MAX_PROOF_BYTES, Message};
pub use replica::{
    Event, FETCH_TIMEOUT, HELD_FOR, Limits, MAX_ASIDE_BYTES, MAX_BLOOM_PROBES, MAX_HELD,
    MAX_INFLATED_BYTES, MAX_PENDING_LOADS, MAX_PRESENTED, MAX_QUEUED_BYTES, MAX_QUEUED_PER_LOAD,
    MAX_QUEUED_PER_PEER, MAX_SYNC_MESSAGE_BYTES, RELAY_AFTER, RELAY_AFTER_HIGHER, Replica,
    SYNC_ANSWER_WAIT, Scope, Unsaved,
};
#[cfg(any(test, feature = "test-support"))]
pub use test_support::TestNet;
