//! What travels on a queue's gossip topic: router and pool heartbeats, as JSON.
//!
//! Decoding is the boundary where a peer's bytes become values: anything malformed or larger
//! than [`MAX_GOSSIP_BYTES`] is rejected as data.

use piecework_queue_doc::{PoolBeat, RouterBeat};
use serde::{Deserialize, Serialize};

/// The largest gossip message decoded: 256 KiB (a pool heartbeat of 256 workers is about
/// 60 KiB; the network layer drops larger messages before they get here).
pub const MAX_GOSSIP_BYTES: usize = 256 * 1024;

/// A gossip message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Wire {
    /// A router's heartbeat.
    Router(RouterBeat),
    /// A pool's heartbeat.
    Pool(PoolBeat),
}

impl Wire {
    /// Encodes the message.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("heartbeats always encode")
    }

    /// Decodes a message from the network; `None` for anything malformed or too large.
    pub fn decode(bytes: &[u8]) -> Option<Wire> {
        if bytes.len() > MAX_GOSSIP_BYTES {
            return None;
        }
        serde_json::from_slice(bytes).ok()
    }
}
