//! Two peers on loopback: gossip arrives with its authenticated source, and sync frames cross the
//! stream that the smaller peer id opened, tagged with the sender's authenticated id.

use std::time::Duration;

use piecework_net::{Config, Event, Net, SendOutcome, identity, spawn, topic_for};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);

fn peer() -> (Net, libp2p::PeerId) {
    let key = identity::Keypair::generate_ed25519();
    let id = key.public().to_peer_id();
    let net = spawn(Config::new(
        key,
        vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
    ))
    .unwrap();
    (net, id)
}

async fn next_matching<T>(net: &mut Net, mut f: impl FnMut(Event) -> Option<T>) -> T {
    loop {
        if let Some(t) = net.events.recv().await.and_then(&mut f) {
            return t;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_and_sync_frames_cross_between_two_peers() -> anyhow::Result<()> {
    let (mut a, id_a) = peer();
    let (mut b, id_b) = peer();
    let addr_a = timeout(
        WAIT,
        next_matching(&mut a, |e| match e {
            Event::Listening(x) => Some(x),
            _ => None,
        }),
    )
    .await?;
    let topic = topic_for("automerge:q");
    a.client.subscribe(topic.clone()).await?;
    b.client.subscribe(topic.clone()).await?;
    b.client.dial(addr_a).await?;
    // Both ends see the sync stream open, whichever of them opened it.
    timeout(
        WAIT,
        next_matching(&mut a, |e| {
            matches!(e, Event::SyncOpened(p) if p == id_b).then_some(())
        }),
    )
    .await?;
    timeout(
        WAIT,
        next_matching(&mut b, |e| {
            matches!(e, Event::SyncOpened(p) if p == id_a).then_some(())
        }),
    )
    .await?;

    assert_eq!(
        a.client.send_sync(&id_b, b"hello b".to_vec()),
        SendOutcome::Queued
    );
    assert_eq!(
        b.client.send_sync(&id_a, b"hello a".to_vec()),
        SendOutcome::Queued
    );
    let got_b = timeout(
        WAIT,
        next_matching(&mut b, |e| match e {
            Event::SyncMessage { peer, data } => Some((peer, data)),
            _ => None,
        }),
    )
    .await?;
    assert_eq!(got_b, (id_a, b"hello b".to_vec()));
    let got_a = timeout(
        WAIT,
        next_matching(&mut a, |e| match e {
            Event::SyncMessage { peer, data } => Some((peer, data)),
            _ => None,
        }),
    )
    .await?;
    assert_eq!(got_a, (id_b, b"hello a".to_vec()));
    assert_eq!(
        a.client.send_sync(&libp2p::PeerId::random(), vec![1]),
        SendOutcome::NoStream,
        "no stream to a stranger"
    );

    // Gossip: b publishes until a hears it (the subscription may not have crossed yet).
    let heard = timeout(WAIT, async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = tick.tick() => { b.client.publish(topic.clone(), b"beat".to_vec()); }
                ev = a.gossip.recv() => if let Some(Event::Message { source, data, topic: t, via, id }) = ev {
                    // Validated by the application before gossipsub passes it on.
                    assert!(a.client.validate(id, via, piecework_net::MessageAcceptance::Accept));
                    return (source, data, t);
                },
            }
        }
    })
    .await?;
    assert_eq!(heard, (id_b, b"beat".to_vec(), topic));
    let info = a.client.info().await?;
    assert_eq!(info.connected, vec![id_b]);
    Ok(())
}

/// A peer whose bootstrap peer is not up yet dials it again: its first dial fails (the
/// address answers with a plain TCP socket that closes), then the real peer starts and answers
/// on that address, and the two connect.
///
/// The address stays the test's own from start to end: its listener is never released (another
/// process could take a released port before the real peer binds it). Once the real peer is up
/// (on a port of its own), the listener forwards every further connection to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_peer_that_starts_later_is_dialed_again() -> anyhow::Result<()> {
    let squatter = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = squatter.local_addr()?.port();
    let addr: libp2p::Multiaddr = format!("/ip4/127.0.0.1/tcp/{port}").parse()?;
    let key_b = identity::Keypair::generate_ed25519();
    let mut config = Config::new(key_b, vec!["/ip4/127.0.0.1/tcp/0".parse()?]);
    config.bootstrap = vec![addr.clone()];
    let mut b = spawn(config)?;
    // The first dial reaches the squatter, which closes it: that dial fails.
    let (conn, _) = timeout(WAIT, squatter.accept()).await??;
    drop(conn);
    let key_a = identity::Keypair::generate_ed25519();
    let id_a = key_a.public().to_peer_id();
    let mut a = spawn(Config::new(
        key_a,
        vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()],
    ))?;
    let real = timeout(
        WAIT,
        next_matching(&mut a, |e| match e {
            Event::Listening(x) => Some(x),
            _ => None,
        }),
    )
    .await?;
    let real_port = real
        .iter()
        .find_map(|p| match p {
            libp2p::multiaddr::Protocol::Tcp(port) => Some(port),
            _ => None,
        })
        .expect("a TCP address");
    // From now on the address answers as the real peer does.
    let forward = tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = squatter.accept().await else {
                return;
            };
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", real_port)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    timeout(
        WAIT,
        next_matching(&mut b, |e| {
            matches!(e, Event::Connected(p) if p == id_a).then_some(())
        }),
    )
    .await?;
    forward.abort();
    Ok(())
}
