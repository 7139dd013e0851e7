//! Document sync streams: one libp2p stream per pair of connected peers, carrying length-framed
//! replica messages (`piecework_queue_doc::replica::Message`, encoded by the caller).
//!
//! The stream belongs to a connection Noise authenticated, so every frame read from it comes from
//! that connection's peer id, which is what [`crate::Event::SyncMessage`] reports. The peer with
//! the smaller id opens the stream; the other accepts it. If a newer stream to the same peer
//! replaces an older one, the older one is closed and reported closed first.
//!
//! Bounds: frames above [`MAX_FRAME`] end the stream; at most [`SEND_QUEUE`] frames wait to be
//! written per peer, and a peer that falls further behind has its stream closed (both sides then
//! start their sync over when it reopens) rather than making the sender wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use libp2p::{PeerId, StreamProtocol};
use tokio::sync::mpsc;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::compat::FuturesAsyncReadCompatExt;

use crate::Event;

/// The libp2p protocol of sync streams.
pub const SYNC_PROTOCOL: StreamProtocol = StreamProtocol::new("/piecework/sync/1");
/// The largest frame: 64 MiB (a whole queue document fits many times over).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;
/// Frames waiting to be written to one peer, at most.
pub const SEND_QUEUE: usize = 8192;

struct Writer {
    generation: u64,
    frames: mpsc::Sender<Vec<u8>>,
}

/// The open sync streams, shared by the event loop, the stream tasks and every client.
#[derive(Clone, Default)]
pub(crate) struct Streams {
    writers: Arc<Mutex<HashMap<PeerId, Writer>>>,
    generation: Arc<AtomicU64>,
}

impl Streams {
    /// Queues a frame for `peer`. Returns false if there is no stream, or if the peer is too far
    /// behind (its stream is then closed).
    pub(crate) fn send(&self, peer: &PeerId, frame: Vec<u8>) -> bool {
        let mut writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        let Some(w) = writers.get(peer) else {
            return false;
        };
        match w.frames.try_send(frame) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(%peer, "peer too slow to read sync messages; closing its stream");
                writers.remove(peer);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    pub(crate) fn is_open(&self, peer: &PeerId) -> bool {
        let writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
        writers.contains_key(peer)
    }

    /// Starts the reader and writer tasks of a new stream to `peer`, replacing any older one.
    pub(crate) async fn register(
        &self,
        peer: PeerId,
        stream: libp2p::Stream,
        events: mpsc::Sender<Event>,
    ) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(SEND_QUEUE);
        let replaced = {
            let mut writers = self.writers.lock().unwrap_or_else(|e| e.into_inner());
            writers
                .insert(
                    peer,
                    Writer {
                        generation,
                        frames: tx,
                    },
                )
                .is_some()
        };
        if replaced && events.send(Event::SyncClosed(peer)).await.is_err() {
            return;
        }
        if events.send(Event::SyncOpened(peer)).await.is_err() {
            return;
        }
        let codec = LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME)
            .new_codec();
        let (mut sink, mut source) = Framed::new(stream.compat(), codec).split();
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                if let Err(e) = sink.send(bytes::Bytes::from(frame)).await {
                    tracing::debug!(%peer, "sync stream write failed: {e}");
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let streams = self.clone();
        tokio::spawn(async move {
            while let Some(frame) = source.next().await {
                match frame {
                    Ok(data) => {
                        let ev = Event::SyncMessage {
                            peer,
                            data: data.to_vec(),
                        };
                        if events.send(ev).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(%peer, "sync stream read failed: {e}");
                        break;
                    }
                }
            }
            let current = {
                let mut writers = streams.writers.lock().unwrap_or_else(|e| e.into_inner());
                let current = writers
                    .get(&peer)
                    .is_some_and(|w| w.generation == generation);
                if current {
                    writers.remove(&peer);
                }
                current
            };
            if current {
                let _ = events.send(Event::SyncClosed(peer)).await;
            }
        });
    }
}

/// Opens a sync stream to `peer` (retrying a few times while the connection settles).
pub(crate) async fn open(
    mut control: libp2p_stream::Control,
    streams: Streams,
    peer: PeerId,
    events: mpsc::Sender<Event>,
) {
    for attempt in 0..5u32 {
        if streams.is_open(&peer) {
            return;
        }
        match control.open_stream(peer, SYNC_PROTOCOL).await {
            Ok(stream) => {
                streams.register(peer, stream, events).await;
                return;
            }
            Err(e) => {
                tracing::debug!(%peer, attempt, "cannot open a sync stream: {e}");
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
}

/// Accepts inbound sync streams until the swarm goes away.
pub(crate) async fn accept(
    mut control: libp2p_stream::Control,
    streams: Streams,
    events: mpsc::Sender<Event>,
) {
    let mut incoming = match control.accept(SYNC_PROTOCOL) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!("sync protocol already registered: {e}");
            return;
        }
    };
    while let Some((peer, stream)) = incoming.next().await {
        streams.register(peer, stream, events.clone()).await;
    }
}
