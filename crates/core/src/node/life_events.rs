//! The life of a queue's tasks as events ([`api::QueueEvent`]): derived from the difference
//! between two views of the queue document, for the tasks a refresh changed only, so that a
//! node emits each step as its replica learns it, whoever made it. Pure functions.

use piecework_queue_doc::{AttemptOutcome, QueueId, QueueView, TaskEntry, TaskState};
use serde_json::{Map, Value, json};

use crate::api::QueueEvent;

/// An event named `name` of `queue` (of `task` if it is about one) at `at`, with `data`.
pub(crate) fn event(
    name: &'static str,
    queue: &QueueId,
    task: Option<&piecework_queue_doc::TaskId>,
    at: u64,
    data: Value,
) -> QueueEvent {
    let data = match data {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    QueueEvent {
        event: name.to_owned(),
        queue: queue.clone(),
        task: task.cloned(),
        at,
        data,
    }
}

/// The events of the queue itself between `old` and `new`: paused or resumed, a router
/// elected.
pub(crate) fn queue_events(
    queue: &QueueId,
    old: &QueueView,
    new: &QueueView,
    at: u64,
    out: &mut Vec<QueueEvent>,
) {
    if old.paused != new.paused {
        let name = if new.paused {
            "queue_paused"
        } else {
            "queue_resumed"
        };
        out.push(event(name, queue, None, at, json!({})));
    }
    if let Some(r) = &new.router
        && old.router.as_ref() != Some(r)
    {
        out.push(event(
            "router_elected",
            queue,
            None,
            at,
            json!({"router": r.peer, "term": r.term}),
        ));
    }
}

/// The events of task `new` since `old` (none if it was not indexed): what happened to it
/// that `new` shows and `old` did not, in the order of its life.
pub(crate) fn task_events(
    queue: &QueueId,
    view: &QueueView,
    old: Option<&TaskEntry>,
    new: &TaskEntry,
    at: u64,
    out: &mut Vec<QueueEvent>,
) {
    let task = Some(&new.id);
    let mut ev = |name: &'static str, data: Value| out.push(event(name, queue, task, at, data));
    let state = new.state();
    // A dead letter written back into the document with its requeue (it had left it): the
    // requeue is the news, not its past.
    let restored = old.is_none() && new.requeue.is_some() && !new.attempts.is_empty();
    let since = if restored {
        new.requeue.map_or(0, |r| r.n)
    } else {
        0
    };
    let old_state = if restored {
        Some(TaskState::Failed)
    } else {
        old.map(TaskEntry::state)
    };
    if restored {
        ev("requeued", json!({}));
    } else if old.is_none() {
        let mut data = json!({"kind": new.kind});
        if let Some(p) = &new.rules.follows {
            data["follows"] = json!(p);
        }
        if let Some(p) = &new.rules.undoes {
            data["undoes"] = json!(p);
        }
        ev("submitted", data);
        if state == TaskState::Pending
            && let Some(on) = crate::node::statuses::blocked_on(view, new, at)
        {
            ev("blocked", json!({ "blocked_on": on }));
        }
    }
    if let (Some(o), Some(r)) = (old, new.requeue)
        && o.requeue.is_none_or(|or| or < r)
    {
        ev("requeued", json!({}));
    }
    let mut failed = false;
    for a in new.attempts.iter().filter(|a| a.id.n > since) {
        let before = old.and_then(|o| o.attempt(&a.id));
        let data = || json!({"attempt": a.id.n, "worker": a.worker.to_string()});
        if before.is_none() {
            ev("assigned", data());
        }
        if a.started.is_some() && before.is_none_or(|b| b.started.is_none()) {
            ev("started", data());
        }
        if let Some(f) = &a.finished
            && before.is_none_or(|b| b.finished.is_none())
            && f.outcome == AttemptOutcome::Failed
        {
            failed = true;
            let mut d = data();
            d["error"] = json!(f.error);
            d["timed_out"] = json!(f.timed_out);
            ev("attempt_failed", d);
        }
    }
    if old_state == Some(state) {
        return;
    }
    match state {
        TaskState::Succeeded => ev("succeeded", json!({})),
        TaskState::Failed => ev("dead_lettered", json!({"error": last_error(new)})),
        TaskState::Cancelled => ev("cancelled", json!({"reason": new.cancel_reason()})),
        TaskState::Pending if failed => {
            let failures = new.failures();
            let delay = view
                .config
                .retry_delay_jittered_ms(failures, &new.id, new.last_n());
            ev(
                "retrying",
                json!({"failures": failures, "max_attempts": new.max_attempts, "delay_ms": delay}),
            );
        }
        _ => {}
    }
}

fn last_error(t: &TaskEntry) -> Option<String> {
    crate::node::statuses::last_error(t)
}

/// A peer of `queue` was seen connecting (`up`) or going away.
pub(crate) fn peer_event(
    queue: &QueueId,
    peer: &piecework_queue_doc::PeerId,
    up: bool,
    at: u64,
) -> QueueEvent {
    let name = if up { "peer_up" } else { "peer_down" };
    event(name, queue, None, at, json!({ "peer": peer }))
}

/// This node's router of `queue` stepped down (a greater claim took over).
pub(crate) fn stepped_down(
    queue: &QueueId,
    claim: &piecework_queue_doc::Claim,
    by: &piecework_queue_doc::Claim,
    at: u64,
) -> QueueEvent {
    event(
        "router_stepped_down",
        queue,
        None,
        at,
        json!({"router": claim.peer, "term": claim.term, "by": by.peer, "by_term": by.term}),
    )
}

/// A running task's progress, as its pool's heartbeat reported it.
pub(crate) fn progress(
    queue: &QueueId,
    task: &piecework_queue_doc::TaskId,
    p: piecework_queue_doc::Progress,
    at: u64,
) -> QueueEvent {
    let data = serde_json::to_value(p).unwrap_or_default();
    event("progress", queue, Some(task), at, data)
}
