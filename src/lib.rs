//! Piecework: a peer-to-peer task framework. Peers contribute compute to shared task queues kept
//! in Automerge documents; heartbeats are gossiped over libp2p; an active router per queue hands
//! tasks to idle workers, and when it goes quiet another peer takes over with a
//! write → wait → recheck protocol. Every task runs at least once.
//!
//! This crate is the facade and the `piecework` binary. The parts:
//!
//! - [`queue_doc`]: the queue and task documents as typed operations (pure);
//! - [`router`]: the takeover state machine and routing policy (pure, sans-IO);
//! - [`worker_pool`]: the pool state machine (pure) and the handler runner;
//! - [`net`]: the libp2p swarm, heartbeats and document sync;
//! - [`node`]: the runtime wiring them together, with storage and the HTTP API.
//!
//! Plus, for the binary: the built-in task [`kinds`], the HTTP [`client`] the CLI uses, the
//! [`demo`] and the [`bench`].

#![warn(missing_docs)]

pub mod bench;
pub mod client;
pub mod demo;
pub mod kinds;

pub use piecework_net as net;
pub use piecework_node as node;
pub use piecework_queue_doc as queue_doc;
pub use piecework_router as router;
pub use piecework_worker_pool as worker_pool;
