//! The node's log of queue events ([`api::QueueEvent`]): numbered, kept in a bounded buffer so
//! that a subscriber that reconnects can resume after the last one it saw, and handed to live
//! subscribers as they come.
//!
//! Ids rise by one per event; a node's first id is its start time in unix ms × 1,000, so ids
//! keep rising across restarts (unless a node logged more than 1,000 events per millisecond of
//! its previous life). A resume from an id older than the buffer's oldest event starts with the
//! oldest one, after a `lost` event that says how many were forgotten (`null`: an id of an
//! earlier life, whose count is not known).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::api;

/// How many events the node keeps for subscribers that resume (`Last-Event-ID`).
pub const EVENT_LOG: usize = 4_096;

/// An event as the log keeps it: its id, and the event.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    /// The event's id (rising by one per event).
    pub id: u64,
    /// The event.
    pub event: api::QueueEvent,
}

/// What a subscriber gets: the kept events after the id it resumes from (after a `lost` gap
/// if some were forgotten), then the live ones.
#[derive(Debug)]
pub struct Subscription {
    /// Kept events to send first, oldest first.
    pub replay: Vec<Arc<Logged>>,
    /// Events forgotten between the id resumed from and the oldest kept: 0 if none, `None` if
    /// the id is from an earlier life of the node (how many it logged then is not known).
    pub lost: Option<u64>,
    /// The live events, from the one after the last replayed.
    pub live: broadcast::Receiver<Arc<Logged>>,
}

#[derive(Debug)]
struct Inner {
    kept: VecDeque<Arc<Logged>>,
    /// This life's first id.
    first: u64,
    next: u64,
}

/// The log.
#[derive(Debug)]
pub(crate) struct EventLog {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Logged>>,
}

impl EventLog {
    /// A log whose first id is `first`.
    pub(crate) fn new(first: u64) -> Self {
        EventLog {
            inner: Mutex::new(Inner {
                kept: VecDeque::with_capacity(EVENT_LOG),
                first: first.max(1),
                next: first.max(1),
            }),
            tx: broadcast::channel(EVENT_LOG).0,
        }
    }

    /// Logs `event` under the next id and hands it to the live subscribers.
    pub(crate) fn push(&self, event: api::QueueEvent) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let logged = Arc::new(Logged {
            id: inner.next,
            event,
        });
        inner.next += 1;
        if inner.kept.len() == EVENT_LOG {
            inner.kept.pop_front();
        }
        inner.kept.push_back(logged.clone());
        // Under the lock: a subscriber sees each event once, replayed or live.
        let _ = self.tx.send(logged);
    }

    /// A subscription resuming after `after` (every kept event if `None`).
    pub(crate) fn subscribe(&self, after: Option<u64>) -> Subscription {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let live = self.tx.subscribe();
        let oldest = inner.kept.front().map_or(inner.next, |e| e.id);
        let (replay, lost) = match after {
            None => (Vec::new(), Some(0)),
            Some(a) => {
                let replay: Vec<Arc<Logged>> =
                    inner.kept.iter().filter(|e| e.id > a).cloned().collect();
                let lost = if a.saturating_add(1) < inner.first {
                    // An id of an earlier life (or none this node gave).
                    None
                } else {
                    Some(oldest.saturating_sub(a.saturating_add(1)))
                };
                (replay, lost)
            }
        };
        Subscription { replay, lost, live }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(n: u64) -> api::QueueEvent {
        api::QueueEvent {
            event: "submitted".into(),
            queue: piecework_queue_doc::QueueId::new("q"),
            task: None,
            at: n,
            data: Default::default(),
        }
    }

    #[test]
    fn a_resume_replays_what_is_kept_after_its_id_and_counts_what_was_forgotten() {
        let log = EventLog::new(100);
        for n in 0..(EVENT_LOG as u64 + 10) {
            log.push(ev(n));
        }
        // Kept: ids 110 ..= 100 + EVENT_LOG + 9.
        let s = log.subscribe(Some(105));
        assert_eq!(s.lost, Some(4));
        assert_eq!(s.replay.first().map(|e| e.id), Some(110));
        assert_eq!(s.replay.len(), EVENT_LOG);
        let last = 100 + EVENT_LOG as u64 + 9;
        let s = log.subscribe(Some(last - 2));
        assert_eq!((s.lost, s.replay.len()), (Some(0), 2));
        // An id of an earlier life: every kept event, how many were lost unknown.
        let s = log.subscribe(Some(7));
        assert_eq!((s.lost, s.replay.len()), (None, EVENT_LOG));
        let mut s = log.subscribe(None);
        assert!(s.replay.is_empty());
        log.push(ev(1));
        assert_eq!(s.live.try_recv().map(|e| e.id).ok(), Some(last + 1));
    }
}
