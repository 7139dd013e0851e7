//! Piecework's network layer: a libp2p swarm (TCP, Noise, Yamux) carrying
//!
//! - **heartbeats** over gossipsub, one topic per queue ([`topic_for`]); every message is signed
//!   with the sender's node key and gossipsub rejects unsigned or forged ones, so the
//!   [`Event::Message`] `source` is authenticated;
//! - **document sync**: one libp2p stream per pair of peers carrying replica messages ([`sync`]),
//!   each bound to the Noise-authenticated peer id of its connection. Documents never travel
//!   over gossipsub.
//!
//! # Driving it
//!
//! [`spawn`] builds the swarm and starts its event loop on the current tokio runtime. The loop
//! owns the swarm (rust-libp2p's file-sharing example shape): the application talks to it through
//! a [`Client`], whose commands travel over a bounded channel, and hears from it through a
//! bounded [`Event`] receiver. Dropping every `Client` stops the loop.
//!
//! Bounds: [`COMMAND_CAPACITY`] pending commands (senders wait), [`EVENT_CAPACITY`] pending
//! events. When the application falls that far behind, gossip messages are dropped and counted
//! (heartbeats repeat); connection events and sync messages are never dropped, their senders wait
//! for room instead (which slows the peer down through TCP).

#![warn(missing_docs, unreachable_pub)]

pub mod sync;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use libp2p::gossipsub::{self, IdentTopic, MessageAuthenticity, ValidationMode};
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
pub use libp2p::{Multiaddr, PeerId, identity};
use libp2p::{Swarm, identify, noise, ping, tcp, yamux};
use tokio::sync::{mpsc, oneshot};

/// Pending commands from [`Client`]s to the event loop.
pub const COMMAND_CAPACITY: usize = 256;
/// Pending events from the event loop to the application.
pub const EVENT_CAPACITY: usize = 4096;
/// The largest gossip message: 256 KiB (a pool heartbeat of 256 workers is about 60 KiB).
pub const MAX_GOSSIP_MESSAGE: usize = 256 * 1024;

/// The gossipsub topic carrying the heartbeats of one queue.
pub fn topic_for(queue: &str) -> String {
    format!("piecework/v1/queue/{queue}")
}

/// How to start the network.
#[derive(Debug, Clone)]
pub struct Config {
    /// The node's identity key.
    pub keypair: identity::Keypair,
    /// Addresses to listen on, e.g. `/ip4/127.0.0.1/tcp/0`.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start.
    pub bootstrap: Vec<Multiaddr>,
    /// How long an idle connection stays open.
    pub idle_timeout: Duration,
}

impl Config {
    /// A configuration listening on `listen`, with no bootstrap peers.
    pub fn new(keypair: identity::Keypair, listen: Vec<Multiaddr>) -> Self {
        Config {
            keypair,
            listen,
            bootstrap: vec![],
            idle_timeout: Duration::from_secs(300),
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
    /// A sync stream to `peer` opened: start syncing documents with it.
    SyncOpened(PeerId),
    /// The sync stream to `peer` closed: forget the sync state with it.
    SyncClosed(PeerId),
    /// A frame from `peer`'s sync stream (the peer is authenticated by the connection).
    SyncMessage {
        /// The peer.
        peer: PeerId,
        /// The frame.
        data: Vec<u8>,
    },
    /// A gossip message, signed by `source`.
    Message {
        /// The topic.
        topic: String,
        /// The message's author, authenticated by its signature.
        source: PeerId,
        /// The payload.
        data: Vec<u8>,
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
}

/// A handle to the network's event loop. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    commands: mpsc::Sender<Command>,
    peer: PeerId,
    streams: sync::Streams,
}

impl std::fmt::Debug for sync::Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Streams")
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Subscribe(t) => write!(f, "Subscribe({t})"),
            Command::Unsubscribe(t) => write!(f, "Unsubscribe({t})"),
            Command::Publish { topic, data } => write!(f, "Publish({topic}, {} bytes)", data.len()),
            Command::Dial { opts, .. } => write!(f, "Dial({:?})", opts.get_peer_id()),
            Command::Info(_) => write!(f, "Info"),
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

    /// Publishes on a topic, without waiting. Heartbeats are periodic, so when the command
    /// queue is full the message is dropped rather than delaying the caller; returns whether it
    /// was queued.
    pub fn publish(&self, topic: String, data: Vec<u8>) -> bool {
        self.commands
            .try_send(Command::Publish { topic, data })
            .is_ok()
    }

    /// Sends a frame on `peer`'s sync stream without waiting; false if there is no open stream
    /// or the peer is too far behind (see [`sync`]).
    pub fn send_sync(&self, peer: &PeerId, frame: Vec<u8>) -> bool {
        self.streams.send(peer, frame)
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

#[derive(NetworkBehaviour)]
struct Behaviour {
    gossipsub: gossipsub::Behaviour,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    stream: libp2p_stream::Behaviour,
}

/// A started network: its client and its events.
#[derive(Debug)]
pub struct Net {
    /// The handle to the event loop.
    pub client: Client,
    /// What the network reports. Read it steadily: see the crate docs on bounds.
    pub events: mpsc::Receiver<Event>,
}

/// Builds the swarm, starts listening and dialing the bootstrap peers, and spawns the event loop
/// and the sync acceptor on the current tokio runtime.
pub fn spawn(config: Config) -> Result<Net, StartError> {
    let peer = config.keypair.public().to_peer_id();
    let gossip_config = gossipsub::ConfigBuilder::default()
        .heartbeat_interval(Duration::from_millis(500))
        .validation_mode(ValidationMode::Strict)
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
                gossipsub: gossipsub::Behaviour::new(
                    MessageAuthenticity::Signed(key.clone()),
                    gossip_config,
                )
                .map_err(|e| std::io::Error::other(e.to_string()))?,
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
    let streams = sync::Streams::default();
    tokio::spawn(sync::accept(
        control.clone(),
        streams.clone(),
        ev_tx.clone(),
    ));
    let event_loop = EventLoop {
        swarm,
        commands: cmd_rx,
        events: ev_tx,
        control,
        streams: streams.clone(),
        dropped: Arc::new(AtomicU64::new(0)),
    };
    tokio::spawn(event_loop.run());
    Ok(Net {
        client: Client {
            commands: cmd_tx,
            peer,
            streams,
        },
        events: ev_rx,
    })
}

struct EventLoop {
    swarm: Swarm<Behaviour>,
    commands: mpsc::Receiver<Command>,
    events: mpsc::Sender<Event>,
    control: libp2p_stream::Control,
    streams: sync::Streams,
    dropped: Arc<AtomicU64>,
}

impl EventLoop {
    async fn run(mut self) {
        loop {
            tokio::select! {
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

    fn handle_command(&mut self, c: Command) {
        let gossip = &mut self.swarm.behaviour_mut().gossipsub;
        match c {
            Command::Subscribe(t) => {
                if let Err(e) = gossip.subscribe(&IdentTopic::new(t)) {
                    tracing::warn!("cannot subscribe: {e}");
                }
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
                });
            }
        }
    }

    /// Err when the application dropped its event receiver.
    async fn handle_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) -> Result<(), ()> {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                self.events
                    .send(Event::Listening(address))
                    .await
                    .map_err(drop)?;
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                num_established,
                ..
            } if num_established.get() == 1 => {
                self.ensure_sync(peer_id);
                self.events
                    .send(Event::Connected(peer_id))
                    .await
                    .map_err(drop)?;
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
                self.events
                    .send(Event::Disconnected(peer_id))
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
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(gossipsub::Event::Message {
                message,
                ..
            })) => {
                // Strict validation guarantees a verified signature, hence a source.
                let Some(source) = message.source else {
                    return Ok(());
                };
                let ev = Event::Message {
                    topic: message.topic.into_string(),
                    source,
                    data: message.data,
                };
                match self.events.try_send(ev) {
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

    /// Makes sure a sync stream to `peer` exists or is being opened: the smaller peer id opens
    /// it, the greater accepts.
    fn ensure_sync(&mut self, peer: PeerId) {
        if *self.swarm.local_peer_id() >= peer || self.streams.is_open(&peer) {
            return;
        }
        tokio::spawn(sync::open(
            self.control.clone(),
            self.streams.clone(),
            peer,
            self.events.clone(),
        ));
    }
}
