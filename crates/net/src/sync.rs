//! Document sync streams: one libp2p stream per pair of connected peers, carrying length-framed
//! replica messages (`piecework_replica::Message`, encoded by the caller).
//!
//! The stream belongs to a connection Noise authenticated, so every frame read from it comes from
//! that connection's peer id, which is what [`crate::Event::SyncMessage`] reports.
//!
//! # Lifecycle
//!
//! Each stream is a *generation*. For every generation the application hears exactly one
//! [`crate::Event::SyncOpened`], then that stream's [`crate::Event::SyncMessage`]s in order, then
//! exactly one [`crate::Event::SyncClosed`]; the events of two generations with the same peer
//! never interleave, so a `SyncClosed` always comes before the next `SyncOpened`. On
//! `SyncOpened` the application starts its sync state with that peer afresh (Automerge's sync
//! protocol then repairs whatever the previous stream lost); on `SyncClosed` it forgets it.
//!
//! A stream ends when it reads an error or end of stream, when a write fails, when it stalls (see
//! below), when [`crate::Client::reset_sync`] closes it, or when a newer stream with the same peer
//! replaces it. Ending drops both halves, which resets the stream, so the remote end sees it fail
//! and ends its side too.
//!
//! The peer with the smaller id opens the stream; the other accepts it. The opener keeps a stream
//! open for as long as the event loop knows a connection to the peer: from the first
//! `ConnectionEstablished` to the last `ConnectionClosed` (`Event::Connected` to
//! `Event::Disconnected`), it opens a new stream whenever the previous one ended, retrying failed
//! opens with exponential backoff from [`REOPEN_BACKOFF_MIN`] doubling to at most
//! [`REOPEN_BACKOFF_MAX`]. A stream that lived at least `REOPEN_BACKOFF_MAX` is replaced at once;
//! one that ended sooner is replaced after the current backoff, so a peer that keeps resetting
//! streams costs one open per `REOPEN_BACKOFF_MAX`. Connections themselves are not redialed here.
//!
//! # Bounds
//!
//! - A frame is at most [`MAX_FRAME`] bytes; a longer one read ends the stream.
//! - Each peer has a send budget of `Config::sync_queue_bytes` bytes (default
//!   [`MAX_QUEUED_BYTES`]): a frame costs its length plus [`FRAME_HEADER_BYTES`] from the moment
//!   [`crate::Client::send_sync`] queues it until it has been written to the stream. A frame that
//!   would exceed the budget is refused with [`SendOutcome::Blocked`] and not queued: the caller
//!   keeps it, and once the queued bytes have fallen to the low-water mark (half the budget) the
//!   network emits [`crate::Event::SyncWritable`] once. A frame that could never fit (longer than
//!   `MAX_FRAME`, or costing more than the whole budget) is refused with
//!   [`SendOutcome::TooLarge`].
//! - A peer that cannot keep up is resynced, never silently dropped: when a send was refused as
//!   `Blocked` and no byte has been written to the stream since for `Config::sync_stall_timeout`
//!   (default [`STALL_TIMEOUT`]; checked every quarter of it), the stream is closed, which emits
//!   `SyncClosed` on both sides and reopens it as above.
//! - The accepting side accepts at most [`MAX_ACCEPTS_PER_WINDOW`] streams per peer per
//!   [`ACCEPT_WINDOW`] (each one replaces the current stream and resyncs); beyond, a new stream
//!   is reset at once, without `SyncOpened`, and the current one stays open.
//! - Frames read wait for room in the event channel: a slow application slows the remote writer
//!   down through Yamux flow control (and, past its stall timeout, gets the stream reset).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Sink, SinkExt, StreamExt};
use libp2p::{PeerId, StreamProtocol};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio_util::compat::FuturesAsyncReadCompatExt;
use tokio_util::sync::CancellationToken;

use crate::Event;

/// The libp2p protocol of sync streams.
pub const SYNC_PROTOCOL: StreamProtocol = StreamProtocol::new("/piecework/sync/1");
/// The largest frame: 64 MiB (a whole queue document fits many times over).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;
/// The bytes a frame costs beyond its payload: its length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;
/// The default per-peer send budget (`Config::sync_queue_bytes`): 96 MiB of frames, counted as
/// payload plus [`FRAME_HEADER_BYTES`], queued but not yet written.
///
/// It must exceed the largest document the replica accepts (16 MiB,
/// `piecework_replica::MAX_SYNC_MESSAGE_BYTES`) and [`MAX_FRAME`], so that on a fresh stream, with nothing
/// queued, any frame the stream can carry is accepted: a new peer's first sync message always
/// fits.
pub const MAX_QUEUED_BYTES: usize = 96 * 1024 * 1024;
/// The default stall timeout (`Config::sync_stall_timeout`): a peer whose stream has written no
/// byte for this long while a send to it is [`SendOutcome::Blocked`] has its stream closed and
/// reopened (both sides resync).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The first delay before retrying to open a sync stream.
pub const REOPEN_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest delay between attempts to open a sync stream.
pub const REOPEN_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// The most sync streams accepted from one peer per [`ACCEPT_WINDOW`]: 30. Each accepted
/// stream replaces the current one and starts a full resync of every document shared with the
/// peer, so a peer opening streams without end would keep this node resyncing. An honest
/// opener makes at most about 18 in its worst minute (its backoff from [`REOPEN_BACKOFF_MIN`]
/// doubling to [`REOPEN_BACKOFF_MAX`] makes 7 in the first 6.3 s, then one per 5 s); this is
/// room for that and a reconnect. Streams beyond it are reset at once, without a `SyncOpened`
/// (so without a resync here), and the current stream stays open; the opener backs off and
/// retries.
pub const MAX_ACCEPTS_PER_WINDOW: usize = 30;
/// The window [`MAX_ACCEPTS_PER_WINDOW`] counts in: a minute.
pub const ACCEPT_WINDOW: Duration = Duration::from_secs(60);

const _: () = assert!(MAX_QUEUED_BYTES > MAX_FRAME + FRAME_HEADER_BYTES);
const _: () = assert!(MAX_QUEUED_BYTES > 16 * 1024 * 1024 + FRAME_HEADER_BYTES);

/// What became of a frame given to [`crate::Client::send_sync`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum SendOutcome {
    /// Queued: it will be written, in order, unless the stream closes first (then
    /// [`crate::Event::SyncClosed`] follows and the sync restarts).
    Queued,
    /// Not queued: it would exceed the peer's send budget. Keep the data and send it again after
    /// [`crate::Event::SyncWritable`] (or restart the sync after [`crate::Event::SyncClosed`]).
    Blocked,
    /// Not queued: there is no open sync stream with the peer (it is not connected, its stream is
    /// being (re)opened, or is closing).
    NoStream,
    /// Not queued, and never will be: longer than [`MAX_FRAME`], or costing (with
    /// [`FRAME_HEADER_BYTES`]) more than the whole send budget.
    TooLarge,
}

/// The bounds of the sync streams.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) queue_bytes: usize,
    pub(crate) stall_timeout: Duration,
}

/// The open sync streams, shared by the event loop, the stream tasks and every client.
#[derive(Clone)]
pub(crate) struct Streams {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Streams")
    }
}

struct Shared {
    peers: Mutex<HashMap<PeerId, PeerSlot>>,
    generation: AtomicU64,
    limits: Limits,
    events: mpsc::Sender<Event>,
}

#[derive(Default)]
struct PeerSlot {
    /// Held by a stream task from before its `SyncOpened` to after its `SyncClosed`, so that the
    /// events of two generations never interleave.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// The newest stream, waiting for its turn or open.
    current: Option<Current>,
}

struct Current {
    generation: u64,
    /// Cancelled when the generation ends, for whatever reason.
    close: CancellationToken,
    /// Set once the stream is open (just before its `SyncOpened`).
    writer: Option<WriterHandle>,
}

struct WriterHandle {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    budget: Arc<Budget>,
}

/// One stream's send budget: bytes queued but not yet written.
struct Budget {
    capacity: usize,
    low_water: usize,
    state: Mutex<BudgetState>,
}

struct BudgetState {
    queued: usize,
    /// When a send was first refused as `Blocked` since the last `SyncWritable`.
    blocked_since: Option<Instant>,
}

impl Budget {
    fn new(capacity: usize) -> Self {
        Budget {
            capacity,
            low_water: capacity / 2,
            state: Mutex::new(BudgetState {
                queued: 0,
                blocked_since: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn credit(&self) -> usize {
        self.capacity.saturating_sub(self.lock().queued)
    }

    /// A frame costing `cost` was written; true if `SyncWritable` is due.
    fn written(&self, cost: usize) -> bool {
        let mut s = self.lock();
        s.queued = s.queued.saturating_sub(cost);
        if s.blocked_since.is_some() && s.queued <= self.low_water {
            s.blocked_since = None;
            return true;
        }
        false
    }

    /// Whether a send has been blocked, with no byte written, for `timeout` at `now`.
    fn stalled(&self, last_progress: Instant, now: Instant, timeout: Duration) -> bool {
        self.lock()
            .blocked_since
            .is_some_and(|b| now.saturating_duration_since(b.max(last_progress)) >= timeout)
    }
}

impl Streams {
    pub(crate) fn new(events: mpsc::Sender<Event>, limits: Limits) -> Self {
        Streams {
            shared: Arc::new(Shared {
                peers: Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
                limits,
                events,
            }),
        }
    }

    fn peers(&self) -> MutexGuard<'_, HashMap<PeerId, PeerSlot>> {
        self.shared.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a frame for `peer`, within its send budget.
    pub(crate) fn send(&self, peer: &PeerId, frame: Vec<u8>) -> SendOutcome {
        let cost = frame.len().saturating_add(FRAME_HEADER_BYTES);
        if frame.len() > MAX_FRAME || cost > self.shared.limits.queue_bytes {
            return SendOutcome::TooLarge;
        }
        let peers = self.peers();
        let Some(w) = peers
            .get(peer)
            .and_then(|s| s.current.as_ref())
            .and_then(|c| c.writer.as_ref())
        else {
            return SendOutcome::NoStream;
        };
        let mut budget = w.budget.lock();
        if budget.queued + cost > w.budget.capacity {
            budget.blocked_since.get_or_insert_with(Instant::now);
            return SendOutcome::Blocked;
        }
        if w.frames.send(frame).is_err() {
            // The writer has stopped: the stream is closing.
            return SendOutcome::NoStream;
        }
        budget.queued += cost;
        SendOutcome::Queued
    }

    /// The bytes that can still be queued for `peer` (a frame of `n` bytes needs
    /// `n + FRAME_HEADER_BYTES`), or None without an open stream.
    pub(crate) fn credit(&self, peer: &PeerId) -> Option<usize> {
        let peers = self.peers();
        let w = peers.get(peer)?.current.as_ref()?.writer.as_ref()?;
        Some(w.budget.credit())
    }

    /// Closes the current stream with `peer` as if it had failed; false if there was none.
    pub(crate) fn reset(&self, peer: &PeerId) -> bool {
        let mut peers = self.peers();
        match peers.get_mut(peer).and_then(|s| s.current.take()) {
            Some(c) => {
                tracing::debug!(%peer, "sync stream reset by the application");
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    /// Ends `generation` of `peer`'s stream if it is still the current one.
    fn end(&self, peer: &PeerId, generation: u64) {
        let mut peers = self.peers();
        if let Some(slot) = peers.get_mut(peer)
            && slot
                .current
                .as_ref()
                .is_some_and(|c| c.generation == generation)
            && let Some(c) = slot.current.take()
        {
            c.close.cancel();
        }
    }

    /// Makes `generation` the open stream with `peer`, unless it was replaced or closed already.
    fn activate(
        &self,
        peer: &PeerId,
        generation: u64,
    ) -> Option<(Arc<Budget>, mpsc::UnboundedReceiver<Vec<u8>>)> {
        let mut peers = self.peers();
        let current = peers.get_mut(peer)?.current.as_mut()?;
        if current.generation != generation || current.close.is_cancelled() {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let budget = Arc::new(Budget::new(self.shared.limits.queue_bytes));
        current.writer = Some(WriterHandle {
            frames: tx,
            budget: budget.clone(),
        });
        Some((budget, rx))
    }

    /// Forgets `peer` once no stream with it exists or waits.
    fn tidy(&self, peer: &PeerId) {
        let mut peers = self.peers();
        if peers
            .get(peer)
            .is_some_and(|s| s.current.is_none() && Arc::strong_count(&s.turn) == 1)
        {
            peers.remove(peer);
        }
    }

    /// Starts a new stream with `peer`, replacing (closing) any current one. Returns a token
    /// cancelled when this stream ends.
    pub(crate) fn register<S>(&self, peer: PeerId, io: S) -> CancellationToken
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let close = CancellationToken::new();
        let turn = {
            let mut peers = self.peers();
            let slot = peers.entry(peer).or_default();
            let old = slot.current.replace(Current {
                generation,
                close: close.clone(),
                writer: None,
            });
            if let Some(old) = old {
                tracing::debug!(%peer, "a new sync stream replaces the current one");
                old.close.cancel();
            }
            slot.turn.clone()
        };
        tokio::spawn(run_stream(
            self.clone(),
            peer,
            generation,
            close.clone(),
            turn,
            io,
        ));
        close
    }
}

/// Runs one stream generation: waits for the previous one to finish, reports the stream open,
/// reads frames into events, and reports it closed.
async fn run_stream<S>(
    streams: Streams,
    peer: PeerId,
    generation: u64,
    close: CancellationToken,
    turn: Arc<tokio::sync::Mutex<()>>,
    io: S,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _closed = close.clone().drop_guard();
    let turn = tokio::select! {
        biased;
        () = close.cancelled() => None,
        t = turn.lock_owned() => Some(t),
    };
    let Some(turn) = turn else {
        streams.tidy(&peer);
        return;
    };
    let Some((budget, frames)) = streams.activate(&peer, generation) else {
        drop(turn);
        streams.tidy(&peer);
        return;
    };
    let events = streams.shared.events.clone();
    if events.send(Event::SyncOpened(peer)).await.is_err() {
        streams.end(&peer, generation);
        return;
    }
    let written = Arc::new(AtomicU64::new(0));
    let codec = LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_codec();
    let io = Counting {
        inner: io,
        written: written.clone(),
    };
    let (sink, mut source) = Framed::new(io, codec).split();
    let writer = tokio::spawn(write_frames(
        streams.clone(),
        peer,
        generation,
        close.clone(),
        sink,
        frames,
        budget,
        written,
    ));
    loop {
        let frame = tokio::select! {
            biased;
            () = close.cancelled() => break,
            f = source.next() => f,
        };
        match frame {
            Some(Ok(data)) => {
                let ev = Event::SyncMessage {
                    peer,
                    data: data.into(),
                };
                tokio::select! {
                    biased;
                    () = close.cancelled() => break,
                    r = events.send(ev) => if r.is_err() { break },
                }
            }
            Some(Err(e)) => {
                tracing::debug!(%peer, "sync stream read failed: {e}");
                break;
            }
            None => {
                tracing::debug!(%peer, "sync stream closed by the peer");
                break;
            }
        }
    }
    streams.end(&peer, generation);
    close.cancel();
    // The writer stops at once on cancellation; waiting for it keeps its SyncWritable (if any)
    // before this SyncClosed.
    let _ = writer.await;
    // Dropping both halves resets the stream, so the remote ends its side.
    drop(source);
    let _ = events.send(Event::SyncClosed(peer)).await;
    drop(turn);
    streams.tidy(&peer);
}

/// Writes queued frames to the stream, paying back the budget after each, and ends the generation
/// on a write error or a stall.
#[allow(clippy::too_many_arguments)]
async fn write_frames<W>(
    streams: Streams,
    peer: PeerId,
    generation: u64,
    close: CancellationToken,
    mut sink: W,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
    budget: Arc<Budget>,
    written: Arc<AtomicU64>,
) where
    W: Sink<bytes::Bytes, Error = io::Error> + Unpin,
{
    let stall_timeout = streams.shared.limits.stall_timeout;
    let events = streams.shared.events.clone();
    let mut check = tokio::time::interval((stall_timeout / 4).max(Duration::from_millis(1)));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut progress = (written.load(Ordering::Relaxed), Instant::now());
    loop {
        let frame = tokio::select! {
            biased;
            () = close.cancelled() => break,
            f = frames.recv() => match f {
                Some(f) => f,
                None => break,
            },
        };
        let cost = frame.len() + FRAME_HEADER_BYTES;
        let write = sink.send(bytes::Bytes::from(frame));
        tokio::pin!(write);
        let result = loop {
            tokio::select! {
                biased;
                () = close.cancelled() => break None,
                r = &mut write => break Some(r),
                _ = check.tick() => {
                    let now = Instant::now();
                    let bytes = written.load(Ordering::Relaxed);
                    if bytes != progress.0 {
                        progress = (bytes, now);
                    } else if budget.stalled(progress.1, now, stall_timeout) {
                        tracing::warn!(
                            %peer,
                            "peer too slow to read sync messages; resetting its stream"
                        );
                        break None;
                    }
                }
            }
        };
        match result {
            None => break,
            Some(Err(e)) => {
                tracing::debug!(%peer, "sync stream write failed: {e}");
                break;
            }
            Some(Ok(())) => {
                progress = (written.load(Ordering::Relaxed), Instant::now());
                if budget.written(cost) {
                    tokio::select! {
                        biased;
                        () = close.cancelled() => break,
                        r = events.send(Event::SyncWritable(peer)) => if r.is_err() { break },
                    }
                }
            }
        }
    }
    streams.end(&peer, generation);
}

/// Counts the bytes written through it, the progress the stall check watches.
struct Counting<S> {
    inner: S,
    written: Arc<AtomicU64>,
}

impl<S> Counting<S> {
    fn count(&self, r: &Poll<io::Result<usize>>) {
        if let Poll::Ready(Ok(n)) = r {
            self.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counting<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.count(&r);
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.count(&r);
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Keeps a sync stream open to `peer` (whose id is greater than ours) until `connected` is
/// cancelled: opens one, waits for it to end, opens the next, backing off on failures.
pub(crate) async fn keep_open(
    mut control: libp2p_stream::Control,
    streams: Streams,
    peer: PeerId,
    connected: CancellationToken,
) {
    let mut backoff = REOPEN_BACKOFF_MIN;
    loop {
        let opened = tokio::select! {
            biased;
            () = connected.cancelled() => return,
            r = control.open_stream(peer, SYNC_PROTOCOL) => r,
        };
        match opened {
            Ok(stream) => {
                let started = Instant::now();
                let ended = streams.register(peer, stream.compat());
                tokio::select! {
                    biased;
                    () = connected.cancelled() => return,
                    () = ended.cancelled() => {}
                }
                if started.elapsed() >= REOPEN_BACKOFF_MAX {
                    backoff = REOPEN_BACKOFF_MIN;
                    continue;
                }
            }
            Err(e) => tracing::debug!(%peer, "cannot open a sync stream: {e}"),
        }
        tokio::select! {
            biased;
            () = connected.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(REOPEN_BACKOFF_MAX);
    }
}

/// Accepts inbound sync streams until the swarm goes away, at most [`MAX_ACCEPTS_PER_WINDOW`]
/// per peer per [`ACCEPT_WINDOW`].
pub(crate) async fn accept(mut control: libp2p_stream::Control, streams: Streams) {
    let mut incoming = match control.accept(SYNC_PROTOCOL) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!("sync protocol already registered: {e}");
            return;
        }
    };
    let mut rate = AcceptRate::default();
    while let Some((peer, stream)) = incoming.next().await {
        rate.accept(&streams, peer, stream.compat(), Instant::now());
    }
}

/// When each peer's recent accepted streams were accepted, to bound them
/// ([`MAX_ACCEPTS_PER_WINDOW`]).
#[derive(Debug, Default)]
struct AcceptRate {
    /// Per peer, the accept times within the last [`ACCEPT_WINDOW`], oldest first: at most
    /// [`MAX_ACCEPTS_PER_WINDOW`] each. A peer is forgotten once all of its are older than the
    /// window, when the map holds more peers than [`crate::MAX_CONNECTIONS`] (so it holds at
    /// most the peers that opened a stream in the last window, plus that many).
    recent: HashMap<PeerId, std::collections::VecDeque<Instant>>,
}

impl AcceptRate {
    /// Registers `io` as `peer`'s new stream, or resets it (drops it) if the peer opened
    /// [`MAX_ACCEPTS_PER_WINDOW`] already in the last [`ACCEPT_WINDOW`]. Returns the stream's
    /// end token if it was accepted.
    fn accept<S>(
        &mut self,
        streams: &Streams,
        peer: PeerId,
        io: S,
        now: Instant,
    ) -> Option<CancellationToken>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let max_peers = usize::try_from(crate::MAX_CONNECTIONS).unwrap_or(usize::MAX);
        if self.recent.len() > max_peers {
            self.recent.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|t| now.saturating_duration_since(*t) < ACCEPT_WINDOW)
            });
        }
        let times = self.recent.entry(peer).or_default();
        while times
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= ACCEPT_WINDOW)
        {
            times.pop_front();
        }
        if times.len() >= MAX_ACCEPTS_PER_WINDOW {
            tracing::debug!(
                %peer,
                "refused a sync stream: {MAX_ACCEPTS_PER_WINDOW} accepted from it within {ACCEPT_WINDOW:?}"
            );
            drop(io);
            return None;
        }
        times.push_back(now);
        Some(streams.register(peer, io))
    }
}

#[cfg(test)]
mod tests {
    //! One end of an in-memory pipe as the stream, under virtual time.

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::timeout;

    use super::*;

    const WAIT: Duration = Duration::from_secs(3600);

    fn streams(queue_bytes: usize) -> (Streams, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(crate::EVENT_CAPACITY);
        let limits = Limits {
            queue_bytes,
            stall_timeout: STALL_TIMEOUT,
        };
        (Streams::new(tx, limits), rx)
    }

    async fn next(events: &mut mpsc::Receiver<Event>) -> Event {
        timeout(WAIT, events.recv())
            .await
            .expect("an event")
            .expect("the channel is open")
    }

    fn pipe() -> (DuplexStream, DuplexStream) {
        tokio::io::duplex(1024)
    }

    /// Sends 1 KiB frames until one is refused; returns how many were queued.
    fn fill(s: &Streams, peer: &PeerId) -> usize {
        let mut n = 0;
        loop {
            match s.send(peer, vec![7; 1024]) {
                SendOutcome::Queued => n += 1,
                SendOutcome::Blocked => return n,
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn blocked_then_writable_once_drained() {
        let (s, mut events) = streams(16 * 1024);
        let peer = PeerId::random();
        let (ours, mut theirs) = pipe();
        s.register(peer, ours);
        assert!(matches!(next(&mut events).await, Event::SyncOpened(p) if p == peer));
        assert_eq!(s.credit(&peer), Some(16 * 1024));
        let queued = fill(&s, &peer);
        assert!(
            queued >= 15,
            "the budget holds about 16 frames, got {queued}"
        );
        let credit = s.credit(&peer).unwrap();
        assert!(credit < 1024 + FRAME_HEADER_BYTES);
        assert_eq!(s.send(&peer, vec![0; 1024]), SendOutcome::Blocked);
        assert_eq!(
            s.credit(&peer),
            Some(credit),
            "a blocked frame is not queued"
        );
        // Drain the pipe: the writer pays the budget back and reports it writable, once.
        let mut buf = vec![0; 64 * 1024];
        let mut total = 0;
        let ev = loop {
            tokio::select! {
                r = theirs.read(&mut buf) => total += r.unwrap(),
                ev = events.recv() => break ev.unwrap(),
            }
        };
        assert!(matches!(ev, Event::SyncWritable(p) if p == peer), "{ev:?}");
        assert_eq!(s.send(&peer, vec![0; 1024]), SendOutcome::Queued);
        // Everything drains without a second SyncWritable or a close.
        while total < (queued + 1) * (1024 + FRAME_HEADER_BYTES) {
            total += theirs.read(&mut buf).await.unwrap();
        }
        assert!(events.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_peer_is_reset_after_the_stall_timeout() {
        let (s, mut events) = streams(16 * 1024);
        let peer = PeerId::random();
        let (ours, theirs) = pipe();
        let ended = s.register(peer, ours);
        assert!(matches!(next(&mut events).await, Event::SyncOpened(_)));
        fill(&s, &peer);
        let blocked_at = Instant::now();
        // Nobody reads `theirs`: no byte moves while blocked.
        assert!(matches!(next(&mut events).await, Event::SyncClosed(p) if p == peer));
        let waited = blocked_at.elapsed();
        assert!(
            waited >= STALL_TIMEOUT && waited <= STALL_TIMEOUT * 2,
            "closed after {waited:?}"
        );
        assert!(ended.is_cancelled());
        assert_eq!(s.send(&peer, vec![1]), SendOutcome::NoStream);
        assert_eq!(s.credit(&peer), None);
        drop(theirs);
        assert!(events.try_recv().is_err(), "SyncClosed exactly once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_peer_that_progresses_is_not_reset() {
        let (s, mut events) = streams(16 * 1024);
        let peer = PeerId::random();
        let (ours, mut theirs) = pipe();
        s.register(peer, ours);
        assert!(matches!(next(&mut events).await, Event::SyncOpened(_)));
        fill(&s, &peer);
        // Read a little every STALL_TIMEOUT / 2 until the queue drains: never a stall.
        let mut buf = vec![0; 512];
        let ev = loop {
            tokio::select! {
                ev = events.recv() => break ev.unwrap(),
                () = tokio::time::sleep(STALL_TIMEOUT / 2) => {
                    assert!(theirs.read(&mut buf).await.unwrap() > 0);
                }
            }
        };
        assert!(matches!(ev, Event::SyncWritable(_)), "{ev:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn too_large_and_no_stream() {
        let (s, _events) = streams(1024);
        let peer = PeerId::random();
        assert_eq!(
            s.send(&peer, vec![0; 1024 - FRAME_HEADER_BYTES + 1]),
            SendOutcome::TooLarge
        );
        assert_eq!(s.send(&peer, vec![0; 10]), SendOutcome::NoStream);
        let (big, _events) = streams(MAX_QUEUED_BYTES);
        assert_eq!(
            big.send(&peer, vec![0; MAX_FRAME + 1]),
            SendOutcome::TooLarge
        );
    }

    #[tokio::test(start_paused = true)]
    async fn streams_accepted_from_a_peer_beyond_the_bound_per_minute_are_reset_without_a_resync() {
        let (s, mut events) = streams(MAX_QUEUED_BYTES);
        let mut rate = AcceptRate::default();
        let peer = PeerId::random();
        let other = PeerId::random();
        let mut remotes = Vec::new();
        let step = Duration::from_millis(100);
        for i in 0..MAX_ACCEPTS_PER_WINDOW {
            let (ours, theirs) = pipe();
            remotes.push(theirs);
            assert!(rate.accept(&s, peer, ours, Instant::now()).is_some());
            if i > 0 {
                assert!(matches!(next(&mut events).await, Event::SyncClosed(_)));
            }
            assert!(matches!(next(&mut events).await, Event::SyncOpened(p) if p == peer));
            tokio::time::advance(step).await;
        }
        // One more within the minute: reset at once, no event, and the current stream stays.
        let (ours, mut refused) = pipe();
        assert!(rate.accept(&s, peer, ours, Instant::now()).is_none());
        let mut buf = [0; 8];
        assert_eq!(
            refused.read(&mut buf).await.unwrap(),
            0,
            "the opener sees it end"
        );
        assert_eq!(s.send(&peer, vec![5]), SendOutcome::Queued);
        let current = remotes.last_mut().unwrap();
        current.read_exact(&mut buf[..5]).await.unwrap();
        assert_eq!(&buf[..5], &[0, 0, 0, 1, 5]);
        // Another peer is not affected.
        let (ours, _theirs) = pipe();
        assert!(rate.accept(&s, other, ours, Instant::now()).is_some());
        assert!(matches!(next(&mut events).await, Event::SyncOpened(p) if p == other));
        // Once the first accept is a minute old, one more is accepted: the next events are
        // that stream's replacement, nothing from the refused one.
        let accepted = u32::try_from(MAX_ACCEPTS_PER_WINDOW).unwrap();
        tokio::time::advance(ACCEPT_WINDOW - step * accepted).await;
        let (ours, _theirs) = pipe();
        assert!(rate.accept(&s, peer, ours, Instant::now()).is_some());
        assert!(matches!(next(&mut events).await, Event::SyncClosed(p) if p == peer));
        assert!(matches!(next(&mut events).await, Event::SyncOpened(p) if p == peer));
        assert!(events.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn replacement_and_reset_close_each_generation_once_in_order() {
        let (s, mut events) = streams(MAX_QUEUED_BYTES);
        let peer = PeerId::random();
        let (ours1, mut theirs1) = pipe();
        let first = s.register(peer, ours1);
        assert!(matches!(next(&mut events).await, Event::SyncOpened(_)));
        // A frame from the first stream, then a replacement.
        theirs1.write_all(&[0, 0, 0, 1, 42]).await.unwrap();
        let (ours2, mut theirs2) = pipe();
        let ev = next(&mut events).await;
        assert!(matches!(&ev, Event::SyncMessage { data, .. } if data == &[42]));
        let second = s.register(peer, ours2);
        assert!(matches!(next(&mut events).await, Event::SyncClosed(_)));
        assert!(first.is_cancelled());
        assert!(matches!(next(&mut events).await, Event::SyncOpened(_)));
        // The first stream was reset: its remote reads end of stream.
        let mut buf = [0; 8];
        assert_eq!(theirs1.read(&mut buf).await.unwrap(), 0);
        // The second carries frames both ways.
        assert_eq!(s.send(&peer, vec![9]), SendOutcome::Queued);
        theirs2.read_exact(&mut buf[..5]).await.unwrap();
        assert_eq!(&buf[..5], &[0, 0, 0, 1, 9]);
        assert!(s.reset(&peer));
        assert!(!s.reset(&peer));
        assert!(matches!(next(&mut events).await, Event::SyncClosed(_)));
        assert!(second.is_cancelled());
        assert_eq!(s.send(&peer, vec![9]), SendOutcome::NoStream);
        // Its task is done and the peer forgotten.
        timeout(WAIT, async {
            while !s.peers().is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        assert!(events.try_recv().is_err());
    }
}
