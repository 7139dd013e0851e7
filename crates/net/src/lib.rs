//! Piecework's network layer: a libp2p swarm (TCP, Noise, Yamux) carrying
//!
//! - **heartbeats** over gossipsub, one topic per queue ([`topic_for`]); every message is signed
//!   with the sender's node key and gossipsub rejects unsigned or forged ones, so the
//!   [`Event::Message`] `source` is authenticated;
//! - **document sync**: one libp2p stream per pair of peers carrying replica messages ([`sync`]),
//!   each bound to the Noise-authenticated peer id of its connection. Documents never travel
//!   over gossipsub. While two peers are connected, the one with the smaller id keeps a sync
//!   stream open: whenever one ends (read or write error, end of stream, stall, reset, or
//!   replacement) the application hears [`Event::SyncClosed`] once for it, and a new stream is
//!   opened (retrying with backoff for as long as the connection lasts) and reported by
//!   [`Event::SyncOpened`], on which the application restarts its sync with the peer.
//!
//! # Driving it
//!
//! [`spawn`] builds the swarm and starts its event loop on the current tokio runtime. The loop
//! owns the swarm (rust-libp2p's file-sharing example shape): the application talks to it through
//! a [`Client`], whose commands travel over a bounded channel, and hears from it through a
//! bounded [`Event`] receiver. Dropping every `Client` stops the loop.
//!
//! Gossip messages ([`Event::Message`]) arrive on their own receiver, [`Net::gossip`], so that
//! an application behind on sync messages still hears heartbeats at once (read it first).
//!
//! Bounds: [`COMMAND_CAPACITY`] pending commands (senders wait), [`EVENT_CAPACITY`] pending
//! events and [`GOSSIP_CAPACITY`] pending gossip messages. When the application falls that far
//! behind on gossip, messages are dropped and counted (heartbeats repeat); connection events and
//! sync events are never dropped, their senders wait for room instead (which slows the peer down
//! through Yamux flow control).
//!
//! Received sync frames are also bounded in bytes: from the moment a frame's length prefix is
//! read until the application takes its [`Event::SyncMessage`] from [`Net::events`], its length
//! plus [`sync::FRAME_HEADER_BYTES`] counts against its peer's received budget
//! ([`Config::sync_received_bytes`], default [`sync::MAX_RECEIVED_BYTES`], 32 MiB) and the
//! node's ([`Config::sync_received_total_bytes`], default [`sync::MAX_RECEIVED_TOTAL_BYTES`],
//! 256 MiB). While either is full, the peer's stream is not read (the peer slows down through
//! Yamux flow control); nothing is dropped, and the wait itself closes nothing. A frame costing
//! more than a whole budget is still delivered, once everything else counted against that budget
//! has been taken.
//!
//! Sync sends never wait: [`Client::send_sync`] queues a frame within a per-peer byte budget
//! ([`Config::sync_queue_bytes`], default [`sync::MAX_QUEUED_BYTES`]) or refuses it with
//! [`SendOutcome::Blocked`], leaving the frame with the caller until [`Event::SyncWritable`]. A
//! peer that reads nothing for [`Config::sync_stall_timeout`] (default [`sync::STALL_TIMEOUT`])
//! while a send to it is blocked has its stream reset, and both sides resync on the new stream.
//! The details are in [`sync`].

#![warn(missing_docs, unreachable_pub)]

pub mod sync;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode};
pub use libp2p::gossipsub::{MessageAcceptance, MessageId};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
pub use libp2p::{Multiaddr, PeerId, identity};
use libp2p::{Swarm, identify, noise, ping, tcp, yamux};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, DropGuard};

pub use sync::SendOutcome;

/// Pending commands from [`Client`]s to the event loop.
pub const COMMAND_CAPACITY: usize = 256;
/// Pending events from the event loop to the application.
pub const EVENT_CAPACITY: usize = 4096;
/// Pending gossip messages from the event loop to the application.
pub const GOSSIP_CAPACITY: usize = 1024;
/// The largest gossip message: 256 KiB (a pool heartbeat of 256 workers is about 60 KiB).
pub const MAX_GOSSIP_MESSAGE: usize = 256 * 1024;

/// The gossipsub topic carrying the heartbeats of one queue.
pub fn topic_for(queue: &str) -> String {
    format!("piecework/v1/queue/{queue}")
}

/// How often a node connected to no peer dials its bootstrap addresses again.
pub const BOOTSTRAP_REDIAL: Duration = Duration::from_secs(2);

/// How to start the network.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node's identity key.
    pub keypair: identity::Keypair,
    /// Addresses to listen on, e.g. `/ip4/127.0.0.1/tcp/0`.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start, and again every [`BOOTSTRAP_REDIAL`] while no peer at all is
    /// connected (a node started before its bootstrap peer, or cut off from every peer).
    pub bootstrap: Vec<Multiaddr>,
    /// How long an idle connection stays open.
    pub idle_timeout: Duration,
    /// Each peer's sync send budget, in bytes queued but not yet written (frames count their
    /// payload plus [`sync::FRAME_HEADER_BYTES`]). Default [`sync::MAX_QUEUED_BYTES`]; keep it
    /// above the largest message the application must be able to send, or that message is
    /// [`SendOutcome::TooLarge`].
    pub sync_queue_bytes: usize,
    /// How long a peer may read nothing while a sync send to it is [`SendOutcome::Blocked`]
    /// before its stream is reset (and reopened). Default [`sync::STALL_TIMEOUT`].
    pub sync_stall_timeout: Duration,
    /// Each peer's sync received budget, in bytes read from its stream and not yet taken from
    /// [`Net::events`] (frames count their payload plus [`sync::FRAME_HEADER_BYTES`]); when it
    /// is full, the peer's stream is not read until the application takes some of its frames.
    /// Default [`sync::MAX_RECEIVED_BYTES`]; a frame costing more is still delivered, alone.
    pub sync_received_bytes: usize,
    /// The node-wide sync received budget, in bytes read from all peers' streams and not yet
    /// taken from [`Net::events`], counted as for `sync_received_bytes`. Default
    /// [`sync::MAX_RECEIVED_TOTAL_BYTES`].
    pub sync_received_total_bytes: usize,
}

impl Config {
    /// A configuration listening on `listen`, with no bootstrap peers.
    pub fn new(keypair: identity::Keypair, listen: Vec<Multiaddr>) -> Self {
        Config {
            keypair,
            listen,
            bootstrap: vec![],
            idle_timeout: Duration::from_secs(300),
            sync_queue_bytes: sync::MAX_QUEUED_BYTES,
            sync_stall_timeout: sync::STALL_TIMEOUT,
            sync_received_bytes: sync::MAX_RECEIVED_BYTES,
            sync_received_total_bytes: sync::MAX_RECEIVED_TOTAL_BYTES,
        }
    }
}

/// Something the network reports.
#[derive(Debug, Clone)]
pub enum Event {
    /// The swarm listens on a new address.
    Listening(Multiaddr),
    /// A first connection to `peer` was established.
    Connected(PeerId),
    /// The last connection to `peer` closed.
    Disconnected(PeerId),
    /// A sync stream to `peer` opened: start syncing documents with it afresh. Follows the
    /// previous stream's [`Event::SyncClosed`], if any.
    SyncOpened(PeerId),
    /// The sync stream to `peer` closed: forget the sync state with it. Emitted exactly once per
    /// opened stream, after its last [`Event::SyncMessage`]; while the peers stay connected a new
    /// stream follows ([`Event::SyncOpened`]).
    SyncClosed(PeerId),
    /// `peer`'s sync send queue drained to its low-water mark (half the budget) after a
    /// [`Client::send_sync`] was [`SendOutcome::Blocked`]: send again. Once per blocked spell.
    SyncWritable(PeerId),
    /// A frame from `peer`'s sync stream (the peer is authenticated by the connection).
    SyncMessage {
        /// The peer.
        peer: PeerId,
        /// The frame.
        data: Vec<u8>,
    },
    /// A gossip message, signed by `source`. It is passed on to other peers only once the
    /// application accepts it ([`Client::validate`] with its `id` and `via`).
    Message {
        /// The topic.
        topic: String,
        /// The message's author, authenticated by its signature.
        source: PeerId,
        /// The peer it came from (`source` itself, or a peer that passed it on).
        via: PeerId,
        /// Gossipsub's id of the message.
        id: gossipsub::MessageId,
        /// The payload.
        data: Vec<u8>,
    },
    /// A peer subscribed to a gossip topic: the application says whether it is a member
    /// ([`Client::standing`]); one that is not is sent nothing on any topic.
    Subscribed {
        /// The peer.
        peer: PeerId,
        /// The topic.
        topic: String,
    },
}

/// Starting the network failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The transport could not be built.
    #[error("cannot build the libp2p transport: {0}")]
    Transport(String),
    /// Gossipsub refused its configuration.
    #[error("cannot configure gossipsub: {0}")]
    Gossipsub(String),
    /// A listen address was refused.
    #[error("cannot listen on {addr}: {reason}")]
    Listen {
        /// The address.
        addr: Multiaddr,
        /// Why.
        reason: String,
    },
}

/// A request to the event loop failed because the loop has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the network has stopped")]
pub struct Stopped;

/// Dialing failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The network has stopped.
    #[error("the network has stopped")]
    Stopped,
    /// libp2p refused the dial.
    #[error("cannot dial: {0}")]
    Refused(String),
}

/// A snapshot of the network's state.
#[derive(Debug, Clone)]
pub struct Info {
    /// This node's peer id.
    pub peer: PeerId,
    /// Addresses the swarm listens on.
    pub listen: Vec<Multiaddr>,
    /// Connected peers.
    pub connected: Vec<PeerId>,
    /// Gossip messages dropped because the application fell behind.
    pub dropped_messages: u64,
    /// Sync bytes read from all peers and not yet taken from [`Net::events`] (see
    /// [`Config::sync_received_total_bytes`]).
    pub sync_received_bytes: usize,
}

enum Command {
    Subscribe(String),
    Unsubscribe(String),
    Publish {
        topic: String,
        data: Vec<u8>,
    },
    Dial {
        opts: DialOpts,
        reply: oneshot::Sender<Result<(), DialError>>,
    },
    Info(oneshot::Sender<Info>),
    Validate {
        id: gossipsub::MessageId,
        via: PeerId,
        acceptance: gossipsub::MessageAcceptance,
    },
    Standing {
        peer: PeerId,
        member: bool,
    },
}

/// A handle to the network's event loop. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    commands: mpsc::Sender<Command>,
    peer: PeerId,
    streams: sync::Streams,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Subscribe(t) => write!(f, "Subscribe({t})"),
            Command::Unsubscribe(t) => write!(f, "Unsubscribe({t})"),
            Command::Publish { topic, data } => write!(f, "Publish({topic}, {} bytes)", data.len()),
            Command::Dial { opts, .. } => write!(f, "Dial({:?})", opts.get_peer_id()),
            Command::Info(_) => write!(f, "Info"),
            Command::Validate { acceptance, .. } => write!(f, "Validate({acceptance:?})"),
            Command::Standing { peer, member } => write!(f, "Standing({peer}, {member})"),
        }
    }
}

impl Client {
    /// This node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.peer
    }

    async fn send(&self, c: Command) -> Result<(), Stopped> {
        self.commands.send(c).await.map_err(|_| Stopped)
    }

    /// Subscribes to a gossip topic.
    pub async fn subscribe(&self, topic: String) -> Result<(), Stopped> {
        self.send(Command::Subscribe(topic)).await
    }

    /// Unsubscribes from a gossip topic.
    pub async fn unsubscribe(&self, topic: String) -> Result<(), Stopped> {
        self.send(Command::Unsubscribe(topic)).await
    }

    /// Gives gossipsub the application's verdict on a message ([`Event::Message`]), without
    /// waiting: accepted, it is passed on; rejected, it is dropped and counts against `via`'s
    /// peer score; ignored, it is dropped. A message given no verdict is dropped once
    /// gossipsub's cache forgets it. Returns false if the command queue is full (the message
    /// is then dropped the same way).
    pub fn validate(
        &self,
        id: gossipsub::MessageId,
        via: PeerId,
        acceptance: gossipsub::MessageAcceptance,
    ) -> bool {
        self.commands
            .try_send(Command::Validate {
                id,
                via,
                acceptance,
            })
            .is_ok()
    }

    /// Whether `peer` is a member of a queue this node serves, without waiting: one that is
    /// not gets an application score that puts it below gossipsub's graylist threshold
    /// ([`NON_MEMBER_SCORE`]): nothing is published or gossiped to it and nothing taken from
    /// it, on any topic, until it is said to be one. Returns false if the command queue is
    /// full.
    pub fn standing(&self, peer: PeerId, member: bool) -> bool {
        self.commands
            .try_send(Command::Standing { peer, member })
            .is_ok()
    }

    /// Publishes on a topic, without waiting. Heartbeats are periodic, so when the command
    /// queue is full the message is dropped rather than delaying the caller; returns whether it
    /// was queued.
    pub fn publish(&self, topic: String, data: Vec<u8>) -> bool {
        self.commands
            .try_send(Command::Publish { topic, data })
            .is_ok()
    }

    /// Queues a frame on `peer`'s sync stream without waiting, within the peer's send budget
    /// (see [`sync`]). Frames reported [`SendOutcome::Queued`] are written in order unless the
    /// stream closes first ([`Event::SyncClosed`]). On [`SendOutcome::Blocked`] the frame is not
    /// queued: keep it and send it again after [`Event::SyncWritable`].
    pub fn send_sync(&self, peer: &PeerId, frame: Vec<u8>) -> SendOutcome {
        self.streams.send(peer, frame)
    }

    /// The bytes that can still be queued for `peer` (a frame of `n` bytes needs
    /// `n + sync::FRAME_HEADER_BYTES`), or None if there is no open sync stream with it.
    pub fn sync_credit(&self, peer: &PeerId) -> Option<usize> {
        self.streams.credit(peer)
    }

    /// The bytes counted against `peer`'s sync received budget (at most
    /// [`Config::sync_received_bytes`]): its stream's frames not yet taken from [`Net::events`],
    /// and what the next one, waiting for room, has been granted so far. None if there is no open
    /// sync stream with it.
    pub fn sync_received(&self, peer: &PeerId) -> Option<usize> {
        self.streams.received(peer)
    }

    /// Closes and reopens the sync stream with `peer`: closes the current stream as if it had
    /// failed (both sides get [`Event::SyncClosed`], frames still queued are lost), after which
    /// the peer with the smaller id opens a new one ([`Event::SyncOpened`] on both sides) if
    /// they are still connected. Returns false if there was no stream.
    pub fn reset_sync(&self, peer: &PeerId) -> bool {
        self.streams.reset(peer)
    }

    /// Dials an address (which may end in `/p2p/<peer id>`).
    pub async fn dial(&self, addr: Multiaddr) -> Result<(), DialError> {
        self.dial_opts(DialOpts::unknown_peer_id().address(addr).build())
            .await
    }

    /// Dials `peer` at `addrs` unless already connected to it.
    pub async fn dial_peer(&self, peer: PeerId, addrs: Vec<Multiaddr>) -> Result<(), DialError> {
        let opts = DialOpts::peer_id(peer)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .addresses(addrs)
            .build();
        self.dial_opts(opts).await
    }

    async fn dial_opts(&self, opts: DialOpts) -> Result<(), DialError> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Dial { opts, reply })
            .await
            .map_err(|_| DialError::Stopped)?;
        rx.await.map_err(|_| DialError::Stopped)?
    }

    /// The network's state.
    pub async fn info(&self) -> Result<Info, Stopped> {
        let (reply, rx) = oneshot::channel();
        self.send(Command::Info(reply)).await?;
        rx.await.map_err(|_| Stopped)
    }
}

/// The most connections a node keeps established, to all peers together: a member list
/// of thousands (or a flood of inbound dials) cannot exhaust its sockets and memory.
pub const MAX_CONNECTIONS: u32 = 512;
/// The most inbound connections still in their handshake at once.
pub const MAX_PENDING_INCOMING: u32 = 64;
/// The most connections established with one peer: two lets a simultaneous dial of each
/// other settle without a refusal.
pub const MAX_CONNECTIONS_PER_PEER: u32 = 2;

#[derive(NetworkBehaviour)]
struct Behaviour {
    limits: libp2p::connection_limits::Behaviour,
    gossipsub: gossipsub::Behaviour,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    stream: libp2p_stream::Behaviour,
}

/// What the network reports, but gossip: the receiving end of a bounded channel
/// ([`EVENT_CAPACITY`]). Taking an [`Event::SyncMessage`] from it releases the frame's bytes from
/// the sync received budgets ([`Config::sync_received_bytes`]).
#[derive(Debug)]
pub struct Events {
    rx: mpsc::Receiver<sync::Delivery>,
}

impl Events {
    /// The next event, waiting for one; None once the network has stopped. Cancel safe: an event
    /// is taken only when this returns it.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await.map(sync::Delivery::take)
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Result<Event, mpsc::error::TryRecvError> {
        self.rx.try_recv().map(sync::Delivery::take)
    }

    /// How many events are waiting.
    pub fn len(&self) -> usize {
        self.rx.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// A started network: its client and its events.
#[derive(Debug)]
pub struct Net {
    /// The handle to the event loop.
    pub client: Client,
    /// What the network reports, but gossip. Read it steadily: see the crate docs on bounds.
    pub events: Events,
    /// Gossip messages ([`Event::Message`] only), apart so that they are never queued behind
    /// sync messages.
    pub gossip: mpsc::Receiver<Event>,
}

/// The application score of a peer that is a member of none of this node's queues: with
/// gossipsub's default weight (10) and thresholds, −100 in all, below the graylist threshold
/// (−80): nothing is sent to it or taken from it.
pub const NON_MEMBER_SCORE: f64 = -10.0;

/// Peer scoring of a queue's topic: every message rejected (from or through a peer that is
/// not a member, or malformed) costs its sender, squared, until its score falls below
/// gossipsub's graylist threshold and nothing more is taken from it or sent to it; the cost
/// fades by half every decay interval.
fn topic_score() -> gossipsub::TopicScoreParams {
    gossipsub::TopicScoreParams {
        topic_weight: 1.0,
        invalid_message_deliveries_weight: -100.0,
        invalid_message_deliveries_decay: 0.5,
        // The mesh and delivery terms stay off: heartbeats are sparse and uneven.
        time_in_mesh_weight: 0.0,
        first_message_deliveries_weight: 0.0,
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        ..Default::default()
    }
}

/// Builds the swarm, starts listening and dialing the bootstrap peers, and spawns the event loop
/// and the sync acceptor on the current tokio runtime.
pub fn spawn(config: Config) -> Result<Net, StartError> {
    let peer = config.keypair.public().to_peer_id();
    let gossip_config = gossipsub::ConfigBuilder::default()
        .heartbeat_interval(Duration::from_millis(500))
        .validation_mode(ValidationMode::Strict)
        // Nothing is passed on before the node says it came from, and through, a member.
        .validate_messages()
        .max_transmit_size(MAX_GOSSIP_MESSAGE)
        .build()
        .map_err(|e| StartError::Gossipsub(e.to_string()))?;
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(config.keypair.clone())
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            yamux::Config::default,
        )
        .map_err(|e| StartError::Transport(e.to_string()))?
        .with_behaviour(|key| {
            Ok(Behaviour {
                limits: libp2p::connection_limits::Behaviour::new(
                    libp2p::connection_limits::ConnectionLimits::default()
                        .with_max_established(Some(MAX_CONNECTIONS))
                        .with_max_pending_incoming(Some(MAX_PENDING_INCOMING))
                        .with_max_established_per_peer(Some(MAX_CONNECTIONS_PER_PEER)),
                ),
                gossipsub: {
                    let mut g = gossipsub::Behaviour::new(
                        MessageAuthenticity::Signed(key.clone()),
                        gossip_config,
                    )
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
                    g.with_peer_score(
                        gossipsub::PeerScoreParams::default(),
                        gossipsub::PeerScoreThresholds::default(),
                    )
                    .map_err(std::io::Error::other)?;
                    g
                },
                identify: identify::Behaviour::new(identify::Config::new(
                    "/piecework/id/1".to_owned(),
                    key.public(),
                )),
                ping: ping::Behaviour::default(),
                stream: libp2p_stream::Behaviour::new(),
            })
        })
        .map_err(|e| StartError::Gossipsub(e.to_string()))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(config.idle_timeout))
        .build();
    for addr in &config.listen {
        swarm
            .listen_on(addr.clone())
            .map_err(|e| StartError::Listen {
                addr: addr.clone(),
                reason: e.to_string(),
            })?;
    }
    for addr in &config.bootstrap {
        if let Err(e) = swarm.dial(addr.clone()) {
            tracing::warn!(%addr, "cannot dial bootstrap peer: {e}");
        }
    }
    let control = swarm.behaviour().stream.new_control();
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_CAPACITY);
    let (ev_tx, ev_rx) = mpsc::channel(EVENT_CAPACITY);
    let (gossip_tx, gossip_rx) = mpsc::channel(GOSSIP_CAPACITY);
    let streams = sync::Streams::new(
        ev_tx.clone(),
        sync::Limits {
            queue_bytes: config.sync_queue_bytes,
            stall_timeout: config.sync_stall_timeout,
            received_bytes: config.sync_received_bytes,
            received_total_bytes: config.sync_received_total_bytes,
        },
    );
    tokio::spawn(sync::accept(control.clone(), streams.clone()));
    let shutdown = CancellationToken::new();
    let event_loop = EventLoop {
        swarm,
        bootstrap: config.bootstrap.clone(),
        commands: cmd_rx,
        events: ev_tx,
        gossip: gossip_tx,
        control,
        streams: streams.clone(),
        dropped: Arc::new(AtomicU64::new(0)),
        keepers: HashMap::new(),
        shutdown: shutdown.clone(),
        _stop_keepers: shutdown.drop_guard(),
    };
    tokio::spawn(event_loop.run());
    Ok(Net {
        client: Client {
            commands: cmd_tx,
            peer,
            streams,
        },
        events: Events { rx: ev_rx },
        gossip: gossip_rx,
    })
}

struct EventLoop {
    swarm: Swarm<Behaviour>,
    /// Dialed again while no peer is connected.
    bootstrap: Vec<Multiaddr>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<sync::Delivery>,
    gossip: mpsc::Sender<Event>,
    control: libp2p_stream::Control,
    streams: sync::Streams,
    dropped: Arc<AtomicU64>,
    /// Per connected peer with a greater id, cancels the task keeping its sync stream open.
    keepers: HashMap<PeerId, CancellationToken>,
    /// The parent of the `keepers` tokens.
    shutdown: CancellationToken,
    /// Stops every keeper when the loop ends.
    _stop_keepers: DropGuard,
}

impl EventLoop {
    async fn run(mut self) {
        let mut redial = tokio::time::interval_at(
            tokio::time::Instant::now() + BOOTSTRAP_REDIAL,
            BOOTSTRAP_REDIAL,
        );
        redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = redial.tick(), if !self.bootstrap.is_empty() => self.redial_bootstrap(),
                ev = self.swarm.select_next_some() => {
                    if self.handle_swarm_event(ev).await.is_err() {
                        break;
                    }
                }
                cmd = self.commands.recv() => match cmd {
                    Some(c) => self.handle_command(c),
                    None => break,
                },
            }
        }
        tracing::debug!("network event loop stopped");
    }

    /// Dials the bootstrap addresses again when no peer is connected.
    fn redial_bootstrap(&mut self) {
        if self.swarm.connected_peers().next().is_some() {
            return;
        }
        for addr in self.bootstrap.clone() {
            if let Err(e) = self.swarm.dial(addr.clone()) {
                tracing::debug!(%addr, "cannot dial bootstrap peer again: {e}");
            }
        }
    }

    fn handle_command(&mut self, c: Command) {
        let gossip = &mut self.swarm.behaviour_mut().gossipsub;
        match c {
            Command::Subscribe(t) => {
                let topic = IdentTopic::new(t);
                if let Err(e) = gossip.subscribe(&topic) {
                    tracing::warn!("cannot subscribe: {e}");
                }
                // A rejected message (from or through a non-member) lowers its sender's score
                // until gossipsub stops taking its messages and sending it any.
                if let Err(e) = gossip.set_topic_params(topic, topic_score()) {
                    tracing::warn!("cannot score the topic: {e}");
                }
            }
            Command::Validate {
                id,
                via,
                acceptance,
            } => {
                gossip.report_message_validation_result(&id, &via, acceptance);
            }
            Command::Standing { peer, member } => {
                let score = if member { 0.0 } else { NON_MEMBER_SCORE };
                gossip.set_application_score(&peer, score);
            }
            Command::Unsubscribe(t) => {
                gossip.unsubscribe(&IdentTopic::new(t));
            }
            Command::Publish { topic, data } => {
                if let Err(e) = gossip.publish(IdentTopic::new(topic), data) {
                    // No subscribed peer yet (a lone node) is normal, and heartbeats repeat.
                    tracing::trace!("gossip not published: {e}");
                }
            }
            Command::Dial { opts, reply } => {
                let r = self
                    .swarm
                    .dial(opts)
                    .map_err(|e| DialError::Refused(e.to_string()));
                let _ = reply.send(r);
            }
            Command::Info(reply) => {
                let _ = reply.send(Info {
                    peer: *self.swarm.local_peer_id(),
                    listen: self.swarm.listeners().cloned().collect(),
                    connected: self.swarm.connected_peers().copied().collect(),
                    dropped_messages: self.dropped.load(Ordering::Relaxed),
                    sync_received_bytes: self.streams.received_total(),
                });
            }
        }
    }

    /// Err when the application dropped its event receiver.
    async fn handle_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) -> Result<(), ()> {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                self.events
                    .send(Event::Listening(address).into())
                    .await
                    .map_err(drop)?;
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                num_established,
                ..
            } if num_established.get() == 1 => {
                self.keep_sync_open(peer_id);
                self.events
                    .send(Event::Connected(peer_id).into())
                    .await
                    .map_err(drop)?;
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                // The stream, if any, died with the connection and reports itself closed.
                if let Some(keeper) = self.keepers.remove(&peer_id) {
                    keeper.cancel();
                }
                self.events
                    .send(Event::Disconnected(peer_id).into())
                    .await
                    .map_err(drop)?;
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                for addr in info.listen_addrs {
                    self.swarm.add_peer_address(peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Subscribed {
                peer_id,
                topic,
                ..
            })) => {
                let ev = Event::Subscribed {
                    peer: peer_id,
                    topic: topic.into_string(),
                };
                if let Err(mpsc::error::TrySendError::Closed(_)) = self.gossip.try_send(ev) {
                    return Err(());
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                message,
                message_id,
                propagation_source,
            })) => {
                // Strict validation guarantees a verified signature, hence a source.
                let Some(source) = message.source else {
                    return Ok(());
                };
                let ev = Event::Message {
                    topic: message.topic.into_string(),
                    source,
                    via: propagation_source,
                    id: message_id,
                    data: message.data,
                };
                match self.gossip.try_send(ev) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return Err(()),
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                tracing::debug!(?peer_id, "outgoing connection failed: {error}");
            }
            _ => {}
        }
        Ok(())
    }

    /// Keeps a sync stream with newly connected `peer` open until it disconnects: the smaller
    /// peer id opens it (and reopens it whenever it ends), the greater accepts.
    fn keep_sync_open(&mut self, peer: PeerId) {
        if *self.swarm.local_peer_id() >= peer {
            return;
        }
        let connected = self.shutdown.child_token();
        if let Some(old) = self.keepers.insert(peer, connected.clone()) {
            old.cancel();
        }
        tokio::spawn(sync::keep_open(
            self.control.clone(),
            self.streams.clone(),
            peer,
            connected,
        ));
    }
}
