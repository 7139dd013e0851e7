//! Sync streams between two peers on loopback: a closed stream is reported and reopened, a full
//! send budget blocks (and reports writable again) instead of closing the stream, every queued
//! frame arrives in order, a peer that reads nothing is reset and resynced, and an application
//! that reads nothing holds at most its received budget.
//!
//! Nothing here sleeps to synchronise: every wait is on an event, under a generous timeout (one
//! polls a counter no event reports).

use std::time::Duration;

use libp2p::PeerId;
use piecework_net::{Config, Event, Net, SendOutcome, identity, spawn};
use tokio::sync::oneshot;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(60);
const SMALL_BUDGET: usize = 64 * 1024;

fn peer(tweak: impl FnOnce(&mut Config)) -> (Net, PeerId) {
    let key = identity::Keypair::generate_ed25519();
    let id = key.public().to_peer_id();
    let mut config = Config::new(key, vec!["/ip4/127.0.0.1/tcp/0".parse().unwrap()]);
    tweak(&mut config);
    (spawn(config).unwrap(), id)
}

async fn next_matching<T>(net: &mut Net, mut f: impl FnMut(Event) -> Option<T>) -> T {
    timeout(WAIT, async {
        loop {
            let ev = net.events.recv().await.expect("the network is running");
            if let Some(t) = f(ev) {
                return t;
            }
        }
    })
    .await
    .expect("the awaited event in time")
}

/// Two peers, `a` tweaked, connected, with their sync stream open on both sides.
async fn connected_pair(tweak_a: impl FnOnce(&mut Config)) -> (Net, PeerId, Net, PeerId) {
    let (mut a, id_a) = peer(tweak_a);
    let (mut b, id_b) = peer(|_| {});
    let addr_a = next_matching(&mut a, |e| match e {
        Event::Listening(x) => Some(x),
        _ => None,
    })
    .await;
    b.client.dial(addr_a).await.unwrap();
    opened(&mut a, id_b).await;
    opened(&mut b, id_a).await;
    (a, id_a, b, id_b)
}

async fn opened(net: &mut Net, peer: PeerId) {
    next_matching(net, |e| match e {
        Event::SyncOpened(p) if p == peer => Some(()),
        Event::SyncClosed(p) if p == peer => panic!("SyncClosed instead of SyncOpened"),
        _ => None,
    })
    .await;
}

/// Waits for `peer`'s stream to close and then reopen, in that order.
async fn closed_then_reopened(net: &mut Net, peer: PeerId) {
    next_matching(net, |e| match e {
        Event::SyncClosed(p) if p == peer => Some(()),
        Event::SyncOpened(p) if p == peer => panic!("SyncOpened before SyncClosed"),
        _ => None,
    })
    .await;
    opened(net, peer).await;
}

/// Waits for `from`'s next sync frame.
async fn frame_from(net: &mut Net, from: PeerId) -> Vec<u8> {
    next_matching(net, |e| match e {
        Event::SyncMessage { peer, data } if peer == from => Some(data),
        Event::SyncClosed(p) if p == from => panic!("the stream closed"),
        _ => None,
    })
    .await
}

/// Waits for `peer`'s SyncWritable; panics if its stream closes instead.
async fn writable(net: &mut Net, peer: PeerId) {
    next_matching(net, |e| match e {
        Event::SyncWritable(p) if p == peer => Some(()),
        Event::SyncClosed(p) if p == peer => panic!("the stream closed instead of draining"),
        _ => None,
    })
    .await;
}

/// Frame `i`: its sequence number, then filler.
fn numbered(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![(i % 251) as u8; len.max(4)];
    f[..4].copy_from_slice(&i.to_le_bytes());
    f
}

fn sequence_of(data: &[u8]) -> u32 {
    u32::from_le_bytes(data[..4].try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_closed_from_either_side_is_reported_and_reopened() {
    let (mut a, id_a, mut b, id_b) = connected_pair(|_| {}).await;
    for round in 0..2u8 {
        // Round 0: a closes; round 1: b closes. One of them is the opener, the other accepted.
        let closed = if round == 0 {
            a.client.reset_sync(&id_b)
        } else {
            b.client.reset_sync(&id_a)
        };
        assert!(closed, "there was a stream to close");
        closed_then_reopened(&mut a, id_b).await;
        closed_then_reopened(&mut b, id_a).await;
        assert!(a.client.sync_credit(&id_b).is_some());
        assert!(b.client.sync_credit(&id_a).is_some());
        // Frames flow both ways on the new stream.
        assert_eq!(
            a.client.send_sync(&id_b, vec![1, round]),
            SendOutcome::Queued
        );
        assert_eq!(
            b.client.send_sync(&id_a, vec![2, round]),
            SendOutcome::Queued
        );
        assert_eq!(frame_from(&mut b, id_a).await, vec![1, round]);
        assert_eq!(frame_from(&mut a, id_b).await, vec![2, round]);
    }
    assert!(!a.client.reset_sync(&PeerId::random()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_budget_blocks_without_closing_and_drains_to_writable() {
    let (mut a, id_a, mut b, id_b) = connected_pair(|c| c.sync_queue_bytes = SMALL_BUDGET).await;
    assert_eq!(a.client.sync_credit(&id_b), Some(SMALL_BUDGET));
    // b reads nothing while a fills its budget (and everything behind it).
    let mut queued = 0u32;
    loop {
        assert!(queued < 1_000_000, "never blocked");
        match a.client.send_sync(&id_b, numbered(queued, 1024)) {
            SendOutcome::Queued => queued += 1,
            SendOutcome::Blocked => break,
            other => panic!("frame {queued}: {other:?}"),
        }
    }
    let credit = a.client.sync_credit(&id_b).unwrap();
    assert!(credit < 1024 + 4, "blocked with {credit} bytes of credit");
    assert_eq!(
        a.client.send_sync(&id_b, numbered(queued, 1024)),
        SendOutcome::Blocked
    );
    assert!(
        a.client.sync_credit(&id_b).unwrap() <= credit,
        "a blocked frame is not queued"
    );
    assert_eq!(
        a.client.send_sync(&id_b, vec![0; SMALL_BUDGET]),
        SendOutcome::TooLarge
    );
    // b drains: every queued frame arrives, the stream stays open, and a hears it is writable.
    for i in 0..queued {
        let data = frame_from(&mut b, id_a).await;
        assert_eq!(sequence_of(&data), i);
    }
    writable(&mut a, id_b).await;
    assert_eq!(
        a.client.send_sync(&id_b, numbered(queued, 1024)),
        SendOutcome::Queued
    );
    assert_eq!(sequence_of(&frame_from(&mut b, id_a).await), queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queued_frame_arrives_in_order() {
    const FRAMES: u32 = 60_000;
    let size = |i: u32| {
        if i % 1000 == 999 {
            // Nearly the whole budget: it only fits once the queue has all but emptied.
            SMALL_BUDGET - 4096
        } else {
            8 + (i as usize * 7919) % 4000
        }
    };
    let (mut a, id_a, mut b, id_b) = connected_pair(|c| c.sync_queue_bytes = SMALL_BUDGET).await;
    // b starts reading once a is first blocked, so the whole path fills up at least once.
    let (go, wait_go) = oneshot::channel::<()>();
    let reader = tokio::spawn(async move {
        let _ = wait_go.await;
        for i in 0..FRAMES {
            let data = frame_from(&mut b, id_a).await;
            assert_eq!(sequence_of(&data), i, "out of order");
            assert_eq!(data.len(), size(i).max(4), "frame {i}");
            assert!(data[4..].iter().all(|&x| x == (i % 251) as u8), "frame {i}");
        }
        b
    });
    let mut go = Some(go);
    let mut blocked = 0u32;
    for i in 0..FRAMES {
        loop {
            match a.client.send_sync(&id_b, numbered(i, size(i))) {
                SendOutcome::Queued => break,
                SendOutcome::Blocked => {
                    blocked += 1;
                    if let Some(go) = go.take() {
                        let _ = go.send(());
                    }
                    writable(&mut a, id_b).await;
                }
                other => panic!("frame {i}: {other:?}"),
            }
        }
    }
    if let Some(go) = go.take() {
        let _ = go.send(());
    }
    let b = timeout(WAIT, reader)
        .await
        .expect("b read every frame")
        .unwrap();
    assert!(blocked > 0, "the budget never filled");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_reads_nothing_is_reset_and_resynced() {
    let (mut a, id_a, mut b, id_b) = connected_pair(|c| {
        c.sync_queue_bytes = SMALL_BUDGET;
        c.sync_stall_timeout = Duration::from_secs(1);
    })
    .await;
    // b's application reads nothing: a fills everything, then stalls, then resets the stream.
    let mut i = 0;
    timeout(WAIT, async {
        loop {
            match a.client.send_sync(&id_b, numbered(i, 1024)) {
                SendOutcome::Queued => i += 1,
                SendOutcome::Blocked => {
                    let closed = next_matching(&mut a, |e| match e {
                        Event::SyncWritable(p) if p == id_b => Some(false),
                        Event::SyncClosed(p) if p == id_b => Some(true),
                        _ => None,
                    })
                    .await;
                    if closed {
                        return;
                    }
                }
                other => panic!("frame {i}: {other:?}"),
            }
        }
    })
    .await
    .expect("the stalled stream is reset");
    assert_eq!(a.client.sync_credit(&id_b), None);
    // Once b reads again it sees the old stream close and a new one open; so does a.
    closed_then_reopened(&mut b, id_a).await;
    opened(&mut a, id_b).await;
    assert_eq!(
        a.client.send_sync(&id_b, b"resync".to_vec()),
        SendOutcome::Queued
    );
    assert_eq!(frame_from(&mut b, id_a).await, b"resync".to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_that_does_not_read_holds_at_most_its_received_budget_and_loses_nothing() {
    // About 3 MiB, 48 times the budget, in fewer frames than the event channel holds.
    const FRAMES: u32 = 3000;
    let cost = 1024 + 4;
    let (mut a, id_a, b, id_b) = connected_pair(|c| c.sync_received_bytes = SMALL_BUDGET).await;
    for i in 0..FRAMES {
        assert_eq!(
            b.client.send_sync(&id_a, numbered(i, 1024)),
            SendOutcome::Queued
        );
    }
    // a's application reads nothing: its reader fills the budget, then stops reading.
    timeout(WAIT, async {
        while a.client.sync_received(&id_b).expect("the stream is open") < SMALL_BUDGET - cost {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("a's reader fills its budget");
    assert!(a.client.sync_received(&id_b).unwrap() <= SMALL_BUDGET);
    assert!(a.client.info().await.unwrap().sync_received_bytes <= SMALL_BUDGET);
    // The frames waiting for the application fit in the budget (two more events at most: a's
    // `Connected` may come after its `SyncOpened`).
    let waiting = a.events.len();
    assert!(
        waiting <= SMALL_BUDGET / cost + 2,
        "{waiting} events waiting for the application"
    );
    // Once a reads, every frame arrives in order, on the same stream.
    for i in 0..FRAMES {
        assert_eq!(sequence_of(&frame_from(&mut a, id_b).await), i);
    }
    assert_eq!(a.client.sync_received(&id_b), Some(0));
    assert_eq!(a.client.info().await.unwrap().sync_received_bytes, 0);
    drop(b);
}
