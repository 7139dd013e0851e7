//! Document sync: samod connections carried over libp2p streams.
//!
//! Every samod connection runs over one libp2p stream of protocol [`SYNC_PROTOCOL`], framed
//! with a length prefix (frames above [`MAX_FRAME`] are refused). The stream belongs to a
//! connection that Noise authenticated, so each transport is bound with
//! [`samod::Transport::with_expected_peer_id`] to the remote's libp2p peer id: samod closes the
//! connection if the handshake claims any other id.
//!
//! Between two peers exactly one samod connection exists: the peer with the smaller peer id
//! dials (with samod's reconnecting dialer), the other accepts.

use std::io;

use futures::{SinkExt, StreamExt, TryStreamExt};
use libp2p::{PeerId, StreamProtocol};
use samod::{DialError, Dialer, Transport};
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::compat::FuturesAsyncReadCompatExt;

/// The libp2p protocol of sync streams.
pub const SYNC_PROTOCOL: StreamProtocol = StreamProtocol::new("/piecework/sync/1");

/// The largest sync frame accepted: 64 MiB (a whole queue document fits many times over).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// The samod peer id of a libp2p peer.
pub fn samod_peer(peer: &PeerId) -> samod::PeerId {
    samod::PeerId::from(peer.to_string())
}

/// Wraps an authenticated libp2p stream as a samod transport bound to `peer`.
pub fn transport(stream: libp2p::Stream, peer: &PeerId) -> Transport {
    let codec = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_codec();
    let (sink, stream) = Framed::new(stream.compat(), codec).split();
    let stream = stream.map_ok(|b| b.to_vec());
    let sink = sink.with(|msg: Vec<u8>| futures::future::ready(Ok::<_, io::Error>(bytes::Bytes::from(msg))));
    Transport::new(stream, Box::pin(sink)).with_expected_peer_id(samod_peer(peer))
}

/// Opening a sync stream to a peer failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot open a sync stream to {peer}: {reason}")]
pub struct OpenError {
    /// The peer.
    pub peer: PeerId,
    /// What went wrong.
    pub reason: String,
}

/// A samod [`Dialer`] that opens a sync stream to one peer (dialing it if needed).
#[derive(Clone)]
pub struct StreamDialer {
    peer: PeerId,
    control: libp2p_stream::Control,
}

impl std::fmt::Debug for StreamDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamDialer").field("peer", &self.peer).finish()
    }
}

impl StreamDialer {
    /// A dialer of `peer` through `control`.
    pub fn new(peer: PeerId, control: libp2p_stream::Control) -> Self {
        StreamDialer { peer, control }
    }
}

impl Dialer for StreamDialer {
    type Error = OpenError;

    fn url(&self) -> samod::Url {
        samod::Url::parse(&format!("libp2p://{}", self.peer)).expect("a peer id is a valid host")
    }

    fn connect(&self) -> futures::future::BoxFuture<'static, Result<Transport, DialError<OpenError>>> {
        let mut control = self.control.clone();
        let peer = self.peer;
        Box::pin(async move {
            match control.open_stream(peer, SYNC_PROTOCOL).await {
                Ok(stream) => Ok(transport(stream, &peer)),
                Err(e) => Err(DialError::transient(OpenError {
                    peer,
                    reason: e.to_string(),
                })),
            }
        })
    }
}

/// Accepts inbound sync streams and hands them to samod, until the acceptor closes.
pub async fn accept_loop(mut control: libp2p_stream::Control, acceptor: samod::AcceptorHandle) {
    let mut incoming = match control.accept(SYNC_PROTOCOL) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!("sync protocol already registered: {e}");
            return;
        }
    };
    while let Some((peer, stream)) = incoming.next().await {
        tracing::debug!(%peer, "inbound sync stream");
        if acceptor.accept(transport(stream, &peer)).is_err() {
            tracing::debug!("samod stopped; no more sync streams");
            return;
        }
    }
}
