//! `piecework queue schedule|schedules|unschedule`: a queue's named schedules from the CLI.

use anyhow::Context as _;
use clap::Args;
use piecework::client::Client;
use piecework::node::api;
use piecework::queue_doc::QueueId;

/// `queue schedule QUEUE NAME (--every D | --cron EXPR) --kind K [--input J]`.
#[derive(Args, Debug)]
pub(crate) struct ScheduleArgs {
    /// The queue's id.
    queue_id: String,
    /// The schedule's name (letters, digits, '_', '-', '.', ':').
    name: String,
    /// Fire every this long (`30s`, `5m`; at least 100ms), at the multiples of the interval.
    #[arg(long, value_parser = humantime::parse_duration, required_unless_present = "cron", conflicts_with = "cron")]
    every: Option<std::time::Duration>,
    /// Fire at each time this cron expression matches, in UTC (5 fields, or 6 with seconds
    /// first), e.g. "0 9 * * MON-FRI".
    #[arg(long)]
    cron: Option<String>,
    /// The kind of the task each slot submits.
    #[arg(long)]
    kind: String,
    /// The task's input, as JSON.
    #[arg(long, default_value = "null")]
    input: String,
    /// The task's relative priority, in [-99999, 99999].
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i64,
    /// A priority tag of the task (repeatable).
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// A resource the task requires (repeatable).
    #[arg(long = "requires", value_name = "RESOURCE")]
    requires: Vec<String>,
    /// Failed attempts after which a task fails for good.
    #[arg(long)]
    max_attempts: Option<u32>,
    /// Write the schedule paused (its slots pass without firing); write it again without
    /// this flag to resume it.
    #[arg(long)]
    paused: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn schedule(client: &Client, a: ScheduleArgs) -> anyhow::Result<()> {
    let input: serde_json::Value = serde_json::from_str(&a.input)
        .with_context(|| format!("--input is not valid JSON: {:?}", a.input))?;
    let mut task = api::SubmitTask::new(a.kind, input);
    task.priority = a.priority;
    task.tags = a.tags;
    task.requires = a.requires;
    task.max_attempts = a.max_attempts;
    let every_ms = a
        .every
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let put = api::PutSchedule {
        every_ms,
        cron: a.cron,
        task,
        paused: a.paused,
    };
    let s = client
        .put_schedule(&QueueId::new(a.queue_id), &a.name, &put)
        .await?;
    if a.json {
        return crate::print_json(&s);
    }
    print_schedule(&s);
    Ok(())
}

pub(crate) async fn list(client: &Client, queue_id: String, json: bool) -> anyhow::Result<()> {
    let all = client.schedules(&QueueId::new(queue_id)).await?;
    if json {
        return crate::print_json(&all);
    }
    if all.schedules.is_empty() {
        println!("no schedules");
    }
    all.schedules.iter().for_each(print_schedule);
    Ok(())
}

pub(crate) async fn delete(
    client: &Client,
    queue_id: String,
    name: String,
    json: bool,
) -> anyhow::Result<()> {
    let left = client
        .delete_schedule(&QueueId::new(queue_id), &name)
        .await?;
    if json {
        return crate::print_json(&left);
    }
    println!("deleted schedule {name}; {} left", left.schedules.len());
    Ok(())
}

fn print_schedule(s: &api::ScheduleStatus) {
    let when = match (&s.every_ms, &s.cron) {
        (Some(ms), _) => format!(
            "every {}",
            humantime::format_duration(std::time::Duration::from_millis(*ms))
        ),
        (None, Some(c)) => format!("cron {c:?} (UTC)"),
        (None, None) => "-".into(),
    };
    let kind = s.task.get("kind").and_then(|k| k.as_str()).unwrap_or("?");
    let time = |t: Option<u64>| match t {
        Some(ms) => humantime::format_rfc3339_millis(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        )
        .to_string(),
        None => "-".into(),
    };
    println!(
        "{}: {when}, kind {kind}{}; last slot {}, next {}, missed {}",
        s.name,
        if s.paused { ", paused" } else { "" },
        time(s.last_slot),
        time(s.next_fire_at),
        s.missed
    );
}
