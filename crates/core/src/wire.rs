//! What travels between nodes besides documents: router and pool heartbeats on a queue's gossip
//! topic, and status questions between members on their sync streams ([`Ask`]), as JSON.
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

/// The first byte of a frame that carries an [`Ask`] on a sync stream; the replica's own
/// frames begin with 1, 2 or 3 ([`piecework_replica::Message`]).
pub const ASK_FRAME: u8 = 0x10;

/// The largest [`Ask`] frame decoded: 4 MiB (a task's status with its result and logs).
pub const MAX_ASK_BYTES: usize = 4 * 1024 * 1024;

/// What members ask each other besides documents, on their sync streams: the status of a task
/// the asker has no record of (an inline task has no document to fetch; it finished while the
/// asker was down or cut off, in epochs it skipped).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Ask {
    /// "What do you know of this task?"
    Status {
        /// The task.
        task: piecework_queue_doc::TaskId,
    },
    /// The answer: the task's status as the answering node has it (a `TaskStatus` as JSON),
    /// or none, if it knows nothing of the task or the asker is not a member of its queue.
    Answer {
        /// The task.
        task: piecework_queue_doc::TaskId,
        /// Its status, as JSON.
        status: Option<serde_json::Value>,
    },
}

impl Ask {
    /// Encodes the ask as a sync frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![ASK_FRAME];
        serde_json::to_writer(&mut out, self).expect("asks always encode");
        out
    }

    /// Whether a sync frame carries an ask (rather than a replica message).
    pub fn is_ask(frame: &[u8]) -> bool {
        frame.first() == Some(&ASK_FRAME)
    }

    /// Decodes an ask frame; `None` for anything malformed or too large.
    pub fn decode(frame: &[u8]) -> Option<Ask> {
        let body = frame.strip_prefix(&[ASK_FRAME])?;
        if body.len() > MAX_ASK_BYTES {
            return None;
        }
        serde_json::from_slice(body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ask_round_trips_and_is_told_from_replica_frames() {
        let ask = Ask::Answer {
            task: piecework_queue_doc::TaskId::new("automerge:t"),
            status: Some(serde_json::json!({"id": "automerge:t"})),
        };
        let frame = ask.encode();
        assert!(Ask::is_ask(&frame));
        assert_eq!(Ask::decode(&frame), Some(ask));
        // Replica messages start with their type byte, 1 to 3.
        for ty in 1u8..=3 {
            assert!(!Ask::is_ask(&[ty, 0]));
        }
        assert_eq!(Ask::decode(&[ASK_FRAME, b'{']), None);
        assert_eq!(Ask::decode(&[]), None);
    }
}
