//! Two peers on loopback: gossip arrives with its authenticated source, and a document created
//! on one is found and kept in sync on the other over libp2p streams.

use std::time::Duration;

use automerge::transaction::Transactable;
use automerge::{Automerge, ROOT, ReadDoc};
use futures::StreamExt;
use piecework_net::{Config, Event, Net, identity, spawn, sync, topic_for};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(30);

async fn peer() -> (Net, samod::Repo, libp2p::PeerId) {
    let key = identity::Keypair::generate_ed25519();
    let id = key.public().to_peer_id();
    let repo = samod::Repo::build_tokio().with_peer_id(sync::samod_peer(&id)).load().await;
    let net = spawn(Config::new(key, vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()]), repo.clone()).unwrap();
    (net, repo, id)
}

async fn listening(net: &mut Net) -> libp2p::Multiaddr {
    loop {
        if let Some(Event::Listening(a)) = net.events.recv().await {
            return a;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip_and_documents_cross_between_two_peers() -> anyhow::Result<()> {
    let (mut a, repo_a, id_a) = peer().await;
    let (mut b, repo_b, id_b) = peer().await;
    let addr_a = timeout(WAIT, listening(&mut a)).await?;
    let topic = topic_for("automerge:q");
    a.client.subscribe(topic.clone()).await?;
    b.client.subscribe(topic.clone()).await?;
    b.client.dial(addr_a).await?;
    timeout(WAIT, async {
        while !matches!(b.events.recv().await, Some(Event::Connected(p)) if p == id_a) {}
    })
    .await?;

    // Gossip: b publishes until a hears it (the subscription may not have crossed yet).
    let heard = timeout(WAIT, async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = tick.tick() => { b.client.publish(topic.clone(), b"beat".to_vec()); }
                ev = a.events.recv() => if let Some(Event::Message { source, data, topic: t }) = ev {
                    return (source, data, t);
                },
            }
        }
    })
    .await?;
    assert_eq!(heard, (id_b, b"beat".to_vec(), topic));

    // Documents: created on a, found on b, then a change on b reaches a.
    let mut doc = Automerge::new();
    doc.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, "hello", "world").map(|_| ()))
        .map_err(|f| f.error)?;
    let handle_a = repo_a.create(doc).await?;
    let found = timeout(WAIT, async {
        loop {
            if let Ok(Some(h)) = repo_b.find(handle_a.document_id().clone()).await {
                return h;
            }
            // Not connected for sync yet: wait for the connection, then look again.
            let _ = repo_b.when_connected(sync::samod_peer(&id_a)).await;
        }
    })
    .await?;
    let read = |h: &samod::DocHandle, k: &str| {
        h.with_document(|d| d.get(ROOT, k).ok().flatten().map(|(v, _)| v.to_string()))
    };
    assert_eq!(read(&found, "hello").as_deref(), Some("\"world\""));
    let mut changes = handle_a.changes();
    found.with_document(|d| {
        d.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, "reply", "hi").map(|_| ()))
            .map_err(|f| f.error)
    })?;
    timeout(WAIT, async {
        while read(&handle_a, "reply").is_none() {
            changes.next().await;
        }
    })
    .await?;
    let info = a.client.info().await?;
    assert_eq!(info.connected, vec![id_b]);
    Ok(())
}
