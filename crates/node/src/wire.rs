//! What travels on a queue's gossip topic: router and pool heartbeats, as JSON.

use piecework_queue_doc::{PoolBeat, RouterBeat};
use serde::{Deserialize, Serialize};

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

    /// Decodes a message from the network; `None` for anything malformed.
    pub fn decode(bytes: &[u8]) -> Option<Wire> {
        serde_json::from_slice(bytes).ok()
    }
}
