//! How the `piecework` command prints a task's and a queue's status (with `--json`, as JSON).

use std::time::Duration;

use piecework::node::api;
use piecework::queue_doc::{Order, QueueConfig};

use crate::print_json;

/// A task's status, as JSON or as lines.
pub(crate) fn print_task(s: &api::TaskStatus, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(s);
    }
    println!("{} {}", s.id, s.state.as_str());
    println!(
        "  kind {}  queue {}  attempts {}",
        s.kind,
        s.queue,
        s.attempts.len()
    );
    if let (Some(p), Some(u), Some(m)) = (s.priority, s.urgent, s.max_attempts) {
        println!(
            "  priority {p}{}  max attempts {m}",
            if u { " (urgent)" } else { "" }
        );
    }
    if !s.tags.is_empty() {
        let eff = s
            .effective_priority
            .map_or(String::new(), |e| format!("  effective priority {e}"));
        println!("  tags {}{eff}", s.tags.join(", "));
    }
    if !s.depends_on.is_empty() {
        let d: Vec<&str> = s.depends_on.iter().map(|t| t.as_str()).collect();
        println!("  depends on {}", d.join(", "));
    }
    if !s.requires.is_empty() {
        println!("  requires {}", s.requires.join(", "));
    }
    if let Some(b) = &s.blocked_on {
        println!(
            "  blocked on {}",
            serde_json::to_string(b).unwrap_or_default()
        );
    }
    if let Some(r) = &s.cancel_reason {
        println!("  cancelled: {r}");
    } else if s.cancel_requested {
        println!("  cancel requested");
    }
    if let Some(r) = &s.result {
        println!("  result {r}");
    }
    if let Some(e) = &s.error {
        println!("  last error {e}");
    }
    Ok(())
}

/// A queue's status, as JSON or as lines.
pub(crate) fn print_queue(q: &api::QueueStatus, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(q);
    }
    println!("queue {} ({})", q.name, q.id);
    println!(
        "router {} (this node: {}), {} members, epoch {}{}",
        q.router.as_ref().map_or("-".into(), ToString::to_string),
        q.role,
        q.members,
        q.epoch,
        if q.paused { ", paused" } else { "" }
    );
    let t = &q.tasks;
    println!(
        "tasks: {} pending, {} assigned, {} running, {} succeeded, {} failed, {} cancelled, {} input unavailable",
        t.pending, t.assigned, t.running, t.succeeded, t.failed, t.cancelled, t.input_unavailable
    );
    print_config(&q.config);
    if !q.boosts.is_empty() {
        let b: Vec<String> = q.boosts.iter().map(|(t, b)| format!("{t} {b}")).collect();
        println!("boosts: {}", b.join(", "));
    }
    Ok(())
}

/// A queue's configuration, as three lines.
pub(crate) fn print_config(c: &QueueConfig) {
    let d = |ms: u64| humantime::format_duration(Duration::from_millis(ms)).to_string();
    println!(
        "order {}, concurrency {}, rate interval {}, lease {}, max attempts {}, retry backoff {} up to {}",
        match c.order {
            Order::Fifo => "fifo",
            Order::Lifo => "lifo",
        },
        if c.concurrency == 0 {
            "unlimited".to_owned()
        } else {
            c.concurrency.to_string()
        },
        if c.rate_interval_ms == 0 {
            "none".to_owned()
        } else {
            d(c.rate_interval_ms)
        },
        d(c.lease_ms),
        c.max_attempts,
        d(c.retry_backoff_ms),
        d(c.retry_backoff_max_ms),
    );
    println!(
        "heartbeat {}, takeover after {}, settle {}, pool heartbeat {}",
        d(c.heartbeat_ms),
        d(c.takeover_after_ms),
        d(c.settle_ms),
        d(c.pool_heartbeat_ms)
    );
    let timeout = match c.timeout_ms {
        0 => "none".to_owned(),
        ms => d(ms),
    };
    let policies: Vec<String> = c
        .failure_policy
        .iter()
        .map(|(kind, p)| match p {
            piecework::queue_doc::FailurePolicy::Retry => format!("{kind} retry"),
            piecework::queue_doc::FailurePolicy::Ignore => format!("{kind} ignore"),
            piecework::queue_doc::FailurePolicy::PauseResource {
                resource,
                restore_after_ms,
            } => format!("{kind} pauses {resource} for {}", d(*restore_after_ms)),
        })
        .collect();
    println!(
        "run timeout {timeout}, failure policy: {}",
        if policies.is_empty() {
            "retry every kind".to_owned()
        } else {
            policies.join(", ")
        }
    );
}

/// Prints one event of `piecework events`: a JSON object per line (with its `id`) with
/// `json`, else a line of its time, name, task and what else it says.
pub(crate) fn print_event(id: Option<u64>, name: &str, data: &serde_json::Value, json: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if json {
        let mut v = data.clone();
        if let (Some(id), Some(m)) = (id, v.as_object_mut()) {
            m.insert("id".into(), serde_json::json!(id));
        }
        let _ = writeln!(out, "{v}");
    } else {
        let at = data["at"].as_u64().map_or_else(String::new, |ms| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
            humantime::format_rfc3339_millis(t).to_string()
        });
        let mut rest = data.as_object().cloned().unwrap_or_default();
        let subject = rest
            .remove("task")
            .or_else(|| rest.remove("queue"))
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for k in ["event", "at", "queue"] {
            rest.remove(k);
        }
        let extra = if rest.is_empty() {
            String::new()
        } else {
            format!(" {}", serde_json::Value::Object(rest))
        };
        let _ = writeln!(out, "{at} {name:<19} {subject}{extra}");
    }
    let _ = out.flush();
}
