//! What the bench sees of the queue's router over a run: every claim that became the greatest
//! any node's view showed, and when; when each node started and was killed. From them it
//! tells the takeovers a restarted node won while the router it deposed was alive
//! (`takeovers_by_restarted_node`), and it says what each node sees when a failover does not
//! complete.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use piecework_queue_doc::{Claim, PeerId, QueueId, QueueView};
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::Client;

/// How often every live node is asked for the router it sees.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// How long after its claim a node's view may first show it to the bench: a poll interval,
/// and the time for the claim to reach the node polled. A claim seen this long after the
/// claimant's window closed still counts as made within it.
const SEEN_LATE: Duration = Duration::from_millis(200);

/// How to ask one node which router it sees.
#[derive(Clone, Debug)]
pub(super) enum Observer {
    /// A node in this process: its queue view.
    View(watch::Receiver<Arc<QueueView>>),
    /// A node process: its HTTP API.
    Http(Client, QueueId),
}

impl Observer {
    /// The effective router this node's view shows, if it answers.
    async fn router(&self) -> Option<Claim> {
        match self {
            Observer::View(rx) => rx.borrow().router.clone(),
            Observer::Http(c, queue) => {
                c.status()
                    .await
                    .ok()?
                    .queues
                    .into_iter()
                    .find(|q| q.id == *queue)?
                    .router
            }
        }
    }
}

/// A node's start (`alive: true`) or kill, unix ms.
#[derive(Clone, Copy, Debug)]
struct Life {
    node: usize,
    at: u64,
    alive: bool,
}

/// One router change the bench saw, as the report lists it.
#[derive(Clone, Debug, Serialize)]
pub struct RouterChange {
    /// When a node's view first showed the claim, in ms since the cluster started.
    pub at_ms: u64,
    /// The claim's term.
    pub term: u64,
    /// The node (index) that claimed.
    pub node: Option<usize>,
    /// Milliseconds from the claimant's last (re)start to the moment the claim was seen, if it
    /// was restarted during the run.
    pub after_restart_ms: Option<u64>,
    /// The router it replaced was alive (not killed) when the claim was seen: the bench did
    /// not cause this takeover.
    pub deposed_a_live_router: bool,
    /// Made within `takeover_after + settle` of the claimant's restart while the router it
    /// replaced was alive.
    pub by_restarted_node: bool,
}

#[derive(Debug, Default)]
struct Log {
    /// Each claim greater than every one before it, with when it was first seen (unix ms).
    claims: Vec<(u64, Claim)>,
    lives: Vec<Life>,
}

/// Watches every live node's router until stopped.
#[derive(Debug)]
pub(super) struct Routers {
    observers: Arc<Mutex<Vec<Option<Observer>>>>,
    log: Arc<Mutex<Log>>,
    poller: JoinHandle<()>,
    peers: Vec<PeerId>,
    /// Unix ms when the watch began.
    t0: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Routers {
    /// Starts watching `observers` (node `i`'s at index `i`), whose peer ids are `peers`.
    pub(super) fn start(peers: Vec<PeerId>, observers: Vec<Observer>) -> Routers {
        let t0 = super::wall_ms();
        let log = Arc::new(Mutex::new(Log {
            claims: Vec::new(),
            lives: (0..observers.len())
                .map(|node| Life {
                    node,
                    at: t0,
                    alive: true,
                })
                .collect(),
        }));
        let observers = Arc::new(Mutex::new(observers.into_iter().map(Some).collect()));
        let poller = tokio::spawn(poll(observers.clone(), log.clone()));
        Routers {
            observers,
            log,
            poller,
            peers,
            t0,
        }
    }

    /// Node `i` was killed.
    pub(super) fn killed(&self, i: usize) {
        lock(&self.observers)[i] = None;
        lock(&self.log).lives.push(Life {
            node: i,
            at: super::wall_ms(),
            alive: false,
        });
    }

    /// Node `i` was (re)started at `at` (unix ms, taken before it began to start).
    pub(super) fn started(&self, i: usize, at: u64, observer: Observer) {
        lock(&self.observers)[i] = Some(observer);
        lock(&self.log).lives.push(Life {
            node: i,
            at,
            alive: true,
        });
    }

    fn live(&self) -> Vec<(usize, Observer)> {
        lock(&self.observers)
            .iter()
            .enumerate()
            .filter_map(|(i, o)| Some((i, o.clone()?)))
            .collect()
    }

    /// The router each live node sees now.
    pub(super) async fn views(&self) -> Vec<(usize, Option<Claim>)> {
        let mut out = Vec::new();
        for (i, o) in self.live() {
            out.push((i, o.router().await));
        }
        out
    }

    /// What each live node sees, for an error message.
    pub(super) async fn describe(&self) -> String {
        let views = self.views().await;
        let seen: Vec<String> = views
            .iter()
            .map(|(i, c)| match c {
                Some(c) => format!(
                    "node {i} sees term {} by node {}",
                    c.term,
                    self.node_of(&c.peer)
                        .map_or_else(|| c.peer.to_string(), |n| n.to_string())
                ),
                None => format!("node {i} sees no router (or does not answer)"),
            })
            .collect();
        seen.join("; ")
    }

    /// The error of failover `round` (its number and how many there are) that did not
    /// complete: what it waited for, and what every live node sees.
    pub(super) async fn failover_failed(
        &self,
        (round, of): (usize, usize),
        victim: usize,
        old: &Claim,
        via: usize,
        e: anyhow::Error,
    ) -> anyhow::Error {
        anyhow::anyhow!(
            "failover {round}/{of} did not complete: no router above node {victim}'s (term {}) \
             assigned a task through node {via} after the kill ({e:#}); {}",
            old.term,
            self.describe().await
        )
    }

    /// The node whose peer id is `peer`.
    pub(super) fn node_of(&self, peer: &PeerId) -> Option<usize> {
        self.peers.iter().position(|p| p == peer)
    }

    /// Waits until every live node sees the same router, and returns it.
    pub(super) async fn settled(&self, within: Duration) -> anyhow::Result<Claim> {
        let deadline = tokio::time::Instant::now() + within;
        let mut tick = tokio::time::interval(POLL_EVERY);
        loop {
            tick.tick().await;
            let views = self.views().await;
            if let Some((_, Some(first))) = views.first()
                && views.iter().all(|(_, c)| c.as_ref() == Some(first))
            {
                return Ok(first.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "the nodes did not agree on a router within {within:?}: {}",
                    self.describe().await
                );
            }
        }
    }

    /// Stops watching; every router change seen, `window` being `takeover_after + settle`.
    pub(super) fn stop(self, window: Duration) -> Vec<RouterChange> {
        self.poller.abort();
        let log = std::mem::take(&mut *lock(&self.log));
        changes(&log, &self.peers, self.t0, window)
    }
}

async fn poll(observers: Arc<Mutex<Vec<Option<Observer>>>>, log: Arc<Mutex<Log>>) {
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let live: Vec<Observer> = lock(&observers).iter().flatten().cloned().collect();
        for o in live {
            let Some(c) = o.router().await else { continue };
            let mut log = lock(&log);
            if log.claims.last().is_none_or(|(_, last)| c > *last) {
                log.claims.push((super::wall_ms(), c));
            }
        }
    }
}

/// Each router change of `log`, told apart.
fn changes(log: &Log, peers: &[PeerId], t0: u64, window: Duration) -> Vec<RouterChange> {
    let window = u64::try_from((window + SEEN_LATE).as_millis()).unwrap_or(u64::MAX);
    let node = |p: &PeerId| peers.iter().position(|q| q == p);
    // Whether `n` was alive at `t`: its last start or kill at or before `t` was a start.
    let alive_at = |n: usize, t: u64| {
        log.lives
            .iter()
            .filter(|l| l.node == n && l.at <= t)
            .max_by_key(|l| l.at)
            .is_some_and(|l| l.alive)
    };
    let mut out = Vec::new();
    for (k, (at, claim)) in log.claims.iter().enumerate() {
        let claimant = node(&claim.peer);
        let deposed = k
            .checked_sub(1)
            .and_then(|j| node(&log.claims[j].1.peer))
            .is_some_and(|p| alive_at(p, *at));
        // The claimant's last restart before the claim was seen (its first start is not one).
        let restart = claimant.and_then(|n| {
            log.lives
                .iter()
                .filter(|l| l.node == n && l.alive && l.at <= *at)
                .skip(1)
                .map(|l| l.at)
                .max()
        });
        let after_restart_ms = restart.map(|r| at - r);
        out.push(RouterChange {
            at_ms: at.saturating_sub(t0),
            term: claim.term,
            node: claimant,
            after_restart_ms,
            deposed_a_live_router: deposed,
            by_restarted_node: deposed && after_restart_ms.is_some_and(|ms| ms <= window),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(term: u64, peer: &str) -> Claim {
        Claim::new(term, PeerId::new(peer))
    }

    #[test]
    fn a_restarted_node_that_deposes_a_live_router_at_once_is_counted() {
        let peers = vec![PeerId::new("a"), PeerId::new("b"), PeerId::new("c")];
        let life = |node, at, alive| Life { node, at, alive };
        let log = Log {
            claims: vec![
                (1_000, claim(1, "a")),
                // a killed at 5,000; b takes over.
                (6_200, claim(2, "b")),
                // a restarted at 8,000 claims at 8,900 while b beats: counted.
                (8_900, claim(3, "a")),
                // b claims back much later: an unforced takeover, not by a restarted node.
                (30_000, claim(4, "b")),
            ],
            lives: vec![
                life(0, 0, true),
                life(1, 0, true),
                life(2, 0, true),
                life(0, 5_000, false),
                life(0, 8_000, true),
            ],
        };
        let c = changes(&log, &peers, 0, Duration::from_millis(1_200));
        let by: Vec<bool> = c.iter().map(|c| c.by_restarted_node).collect();
        assert_eq!(by, [false, false, true, false]);
        let deposed: Vec<bool> = c.iter().map(|c| c.deposed_a_live_router).collect();
        // The kill's takeover deposed a dead router; the others deposed live ones.
        assert_eq!(deposed, [false, false, true, true]);
        assert_eq!(c[2].after_restart_ms, Some(900));
        assert_eq!(c[1].after_restart_ms, None);
        assert_eq!(c[3].node, Some(1));
    }
}
