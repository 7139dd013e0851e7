//! The `piecework` command: run a node, talk to one, run the demo, or measure a cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

mod config_cli;
mod print_cli;
mod schedules_cli;

use config_cli::{config_patch, parse_duration_ms, parse_order};
use print_cli::{print_config, print_queue, print_task};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use piecework::client::Client;
use piecework::node::{self, Multiaddr, api};
use piecework::queue_doc::{ConfigPatch, Order, QueueConfig, QueueId, TaskId, TaskState};

/// A peer-to-peer task queue: tasks in Automerge documents, routers that take over.
#[derive(Parser, Debug)]
#[command(name = "piecework", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PIECEWORK_COMMIT"), ")"), about)]
struct Cli {
    /// The node whose HTTP API to talk to.
    #[arg(
        long,
        global = true,
        env = "PIECEWORK_NODE",
        default_value = "http://127.0.0.1:7700"
    )]
    node: String,
    /// The data directory of the node to talk to (given before the subcommand): its API token
    /// is read from there, which a node whose API is bound beyond loopback asks of every
    /// request. `PIECEWORK_TOKEN` gives the token itself instead.
    #[arg(long = "data-dir", value_name = "DIR")]
    token_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// A client of the node at `base`, with the API token from `PIECEWORK_TOKEN` or from the data directory
/// `dir`, if either is given.
fn client(base: &str, dir: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let token = match std::env::var("PIECEWORK_TOKEN") {
        Ok(t) if !t.trim().is_empty() => Some(t.trim().to_owned()),
        _ => match dir {
            Some(d) => {
                let path = d.join(node::access::TOKEN_FILE);
                let t = std::fs::read_to_string(&path).with_context(|| {
                    format!("cannot read the node's API token {}", path.display())
                })?;
                Some(t.trim().to_owned())
            }
            None => None,
        },
    };
    Client::with_token(base, token.as_deref())
}

#[derive(Subcommand, Debug)]
enum ResourceCommand {
    /// The resources this node holds, and those withdrawn with when each comes back.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Hold a resource from now on (again, if it was withdrawn).
    Add {
        /// Its name (1 to 64 ASCII letters, digits, `_`, `-`, `.`, `:`).
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a resource up: tasks that require it are routed elsewhere, or wait.
    Withdraw {
        /// Its name.
        name: String,
        /// Hold it again by itself after this long (humantime: `30s`, `5m`); without it, for
        /// good (until `resource add`).
        #[arg(long, value_parser = humantime::parse_duration)]
        restore_after: Option<std::time::Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a peer: join the network, serve queues, run tasks.
    Node {
        /// Where the node keeps its key and documents.
        #[arg(long)]
        data_dir: PathBuf,
        /// libp2p address to listen on.
        #[arg(long, default_value = "/ip4/0.0.0.0/tcp/0")]
        listen: Vec<Multiaddr>,
        /// A peer to dial at start (repeatable), e.g. /ip4/127.0.0.1/tcp/4001/p2p/12D3Koo…
        #[arg(long)]
        bootstrap: Vec<Multiaddr>,
        /// Address of the local HTTP API.
        #[arg(long, default_value = "127.0.0.1:7700")]
        http: SocketAddr,
        /// Task workers in this node's pool (default: one per core).
        #[arg(long)]
        workers: Option<u32>,
        /// Rotate a queue document once its finished tasks outweigh twice this many live
        /// ones (default: 512). Smaller keeps the document smaller and rotates more often.
        #[arg(long)]
        rotate_min_live: Option<usize>,
        /// Final statuses of inline tasks kept, the latest (default: 100,000).
        #[arg(long)]
        archive_keep: Option<u64>,
        /// Refuse submits (HTTP 503) to a queue holding this many live tasks until some
        /// finish (default: 2,000).
        #[arg(long)]
        max_live: Option<usize>,
        /// Documents of finished tasks kept on disk, the latest (default: 100,000; 0 deletes
        /// each once it leaves memory). A task whose document was deleted answers "not found".
        #[arg(long)]
        keep_task_docs: Option<usize>,
        /// Sealed epoch documents kept on disk once out of memory, the latest, over all
        /// queues (default: 256). A member that comes back more rotations later than its
        /// queue's covers reach (256) needs a member that kept the documents between.
        #[arg(long)]
        keep_sealed_epochs: Option<usize>,
        /// A resource this node holds from the start (repeatable): tasks that require it
        /// (`task submit --requires`) are routed only to nodes that hold it. Change them at run
        /// time with `piecework resource`.
        #[arg(long = "resource", value_name = "NAME")]
        resource: Vec<String>,
        /// On SIGTERM or Ctrl-C, how long (in seconds) the tasks running here may go on
        /// before they are recorded interrupted and run again elsewhere. The node stops
        /// taking work and hands its router role over at once, then exits 0 once every change
        /// is on disk. A second signal exits at once.
        #[arg(long, default_value_t = 10.0)]
        stop_grace: f64,
        /// A fault for tests: the node's shell panics this many milliseconds after start
        /// (the process must then exit non-zero).
        #[arg(long, hide = true)]
        fault_panic_after_ms: Option<u64>,
    },
    /// Create or join queues.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Submit tasks and look at them.
    Task {
        #[command(subcommand)]
        command: TaskCommand,
    },
    /// This node's resources: list them, hold one, or withdraw one for a while.
    Resource {
        #[command(subcommand)]
        command: ResourceCommand,
    },
    /// Follow the life of this node's queues and their tasks as it learns it (submitted,
    /// assigned, started, progress, succeeded, attempt_failed, retrying, dead_lettered,
    /// cancelled, requeued; queue_paused, router_elected, peer_up...), until interrupted.
    Events {
        /// Only this queue's events.
        #[arg(long)]
        queue: Option<String>,
        /// One JSON object per line (with the event's `id`).
        #[arg(long)]
        json: bool,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
    /// This node: its queues (router, term, task counts) and workers.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a cluster on this machine, kill its router mid-way, and show the takeover.
    Demo {
        /// Nodes to start.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Tasks to submit.
        #[arg(long, default_value_t = 200)]
        tasks: usize,
        /// Workers per node.
        #[arg(long, default_value_t = 2)]
        workers: u32,
        /// SHA-256 rounds per task.
        #[arg(long, default_value_t = 20_000)]
        rounds: u64,
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Measure a cluster on this machine: throughput, latency, failover (docs/benchmarks.md).
    Bench {
        /// Nodes to start.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// Workers per node.
        #[arg(long, default_value_t = 4)]
        workers: u32,
        /// Tasks in the throughput phase.
        #[arg(long, default_value_t = 10_000)]
        tasks: usize,
        /// The task kind.
        #[arg(long, value_enum, default_value_t = piecework::bench::Kind::Noop)]
        kind: piecework::bench::Kind,
        /// The queue's timings: the demo's (takeover after 1 s) or the fastest the docs
        /// recommend (takeover after 150 ms).
        #[arg(long, value_enum, default_value_t = piecework::bench::Timings::Demo)]
        timings: piecework::bench::Timings,
        /// Times to kill the active router (needs 2 nodes or more).
        #[arg(long, default_value_t = 0)]
        failovers: usize,
        /// Tasks run one at a time to measure latency.
        #[arg(long, default_value_t = 200)]
        latency_samples: usize,
        /// The most tasks in flight (submitted, not yet acknowledged) in the throughput phase.
        #[arg(long, default_value_t = 256)]
        window: usize,
        /// Tasks per submit in the throughput phase (1: one at a time; at most 1000).
        #[arg(long, default_value_t = 64)]
        batch: usize,
        /// Rotate the queue document once its finished tasks outweigh twice this many live
        /// ones (the nodes' default: 512). A small number forces rotations in a short run.
        #[arg(long)]
        rotate_min_live: Option<usize>,
        /// Hold the throughput phase's live tasks (submitted, not yet succeeded or failed)
        /// at most this many: the submitter waits for outcomes. The nodes are started with
        /// room for twice as many (`piecework node --max-live`, at least its default), so that
        /// this bound, not theirs, is the one that holds. Without it, submits run as far ahead
        /// of the workers as the window and the nodes' default bound let them.
        #[arg(long)]
        max_live: Option<usize>,
        /// Submit the throughput phase through each node's HTTP API (batches posted as JSON
        /// arrays to `/v1/queues/{id}/tasks`) instead of the in-process `NodeHandle`.
        #[arg(long)]
        http: bool,
        /// Run each node as a separate `piecework node` process, fed and watched through its
        /// HTTP API and killed with SIGKILL; reports each node's peak memory.
        #[arg(long)]
        processes: bool,
        /// With --processes: start each node as `EXE node …` instead of this executable (a
        /// wrapper that runs it under a profiler, say; it must pass its arguments on).
        #[arg(long, requires = "processes")]
        node_exe: Option<std::path::PathBuf>,
        /// Print the report as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum QueueCommand {
    /// Create a queue; prints its id. Unset options take the defaults (`queue status` shows
    /// them).
    Create {
        /// The queue's name.
        name: String,
        /// Which of two tasks of equal priority runs first: fifo (oldest) or lifo (newest).
        #[arg(long, value_parser = parse_order)]
        order: Option<Order>,
        /// At most this many tasks assigned or running at once across the queue (0: no limit).
        #[arg(long)]
        concurrency: Option<u32>,
        /// At most one task start per this interval across the queue (`500ms`, `2s`; 0s: no
        /// limit).
        #[arg(long, value_parser = parse_duration_ms)]
        rate_interval: Option<u64>,
        /// A task whose worker's pool has been silent this long is routed again (`10s`).
        #[arg(long, value_parser = parse_duration_ms)]
        lease: Option<u64>,
        /// Failed attempts after which a task fails for good.
        #[arg(long)]
        max_attempts: Option<u32>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a joined queue's status: router, members, task counts, configuration.
    Status {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pause routing, for every member (any member can resume it).
    Pause {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Resume routing.
    Resume {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a queue's configuration, or change some of its fields for every member.
    Config {
        /// The queue's id.
        queue_id: String,
        /// A field to change, as FIELD=VALUE (repeatable): order=lifo|fifo, concurrency=N,
        /// max_attempts=N, the durations rate_interval, timeout (a run's, for tasks without
        /// their own), lease, retry_backoff, retry_backoff_max, heartbeat, takeover_after,
        /// settle, pool_heartbeat (`30s`, `5m`, `250ms`), and failure_policy=JSON (per kind:
        /// "retry", "ignore" or {"pause_resource": {"resource": R, "restore_after_ms": N}}).
        #[arg(long = "set", value_name = "FIELD=VALUE")]
        set: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Set the boost of a priority tag for every member (0 removes it): each pending task
    /// with the tag moves by boost × 200,000 in effective priority.
    Boost {
        /// The queue's id.
        queue_id: String,
        /// The tag.
        tag: String,
        /// The boost, in [-1000000, 1000000].
        #[arg(allow_hyphen_values = true)]
        boost: i64,
        /// Print JSON (the queue's status).
        #[arg(long)]
        json: bool,
    },
    /// Requeue every dead-lettered (failed) task of the queue; prints their ids.
    Requeue {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a named schedule (new, or a new version of it): the queue's active router
    /// submits its task at every slot, with dedup key schedule/<name>/<slot>.
    Schedule(schedules_cli::ScheduleArgs),
    /// List a queue's schedules: last slot fired, next fire time, missed slots.
    Schedules {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule.
    Unschedule {
        /// The queue's id.
        queue_id: String,
        /// The schedule's name.
        name: String,
        /// Print JSON (the schedules left).
        #[arg(long)]
        json: bool,
    },
    /// Join a queue with an invite token (`piecework queue invite` on an admin's node);
    /// returns once this node holds the queue. A queue id reopens a queue this node joined
    /// before.
    Join {
        /// The invite token (or the id of a queue joined before).
        token: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make an invite to a queue (this node must be an admin of it); prints the token alone.
    Invite {
        /// The queue's id.
        queue_id: String,
        /// The role it gives.
        #[arg(long, default_value = "member", value_parser = ["submitter", "member", "admin"])]
        role: String,
        /// The peer it is for (written into the queue at once); without it, whoever holds
        /// the token may join until it expires.
        #[arg(long = "for", value_name = "PEER_ID")]
        for_peer: Option<String>,
        /// How long an invite without --for may be redeemed (humantime: `30m`, `2d`; a day by
        /// default).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "for_peer")]
        expires: Option<std::time::Duration>,
    },
    /// List a queue's members: peer, role, who added it, whether it was removed.
    Members {
        /// The queue's id.
        queue_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove a member from a queue (this node must be an admin of it, or the member).
    Remove {
        /// The queue's id.
        queue_id: String,
        /// The member's peer id.
        peer_id: String,
        /// Print JSON (the members then).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
// Parsed once per run: the size of the largest variant costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
enum TaskCommand {
    /// Submit a task and print its id; or, with --file, a batch of tasks.
    Submit {
        /// The queue's id.
        queue_id: String,
        /// The handler kind (built in: noop, sleep, sha256, wait_file, fail).
        #[arg(long, required_unless_present = "file")]
        kind: Option<String>,
        /// Submit the tasks in this file (`-` for stdin): one JSON task per line, as the HTTP
        /// API takes it (`{"kind": "sha256", "input": …, "priority": 0}`). Each line is
        /// answered with its task id or its error; the valid lines are submitted either way.
        #[arg(long, conflicts_with_all = ["kind", "input", "priority", "urgent", "max_attempts", "wait", "tag", "depends_on", "delay", "not_before", "dedup_key", "idempotency_key", "requires", "timeout"])]
        file: Option<std::path::PathBuf>,
        /// The input, as JSON.
        #[arg(long, default_value = "null")]
        input: String,
        /// Relative priority in [-99999, 99999].
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        priority: i64,
        /// Run before every non-urgent task.
        #[arg(long)]
        urgent: bool,
        /// Failed attempts after which the task fails for good (the queue's `max_attempts`
        /// by default).
        #[arg(long)]
        max_attempts: Option<u32>,
        /// A priority tag (repeatable): the queue's boost of each adds to the task's effective
        /// priority (`queue boost`).
        #[arg(long = "tag")]
        tag: Vec<String>,
        /// A task of the same queue that must succeed first (repeatable).
        #[arg(long = "depends-on")]
        depends_on: Vec<String>,
        /// Not routed before this long after the submit (humantime: `30s`, `5m`).
        #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "not_before")]
        delay: Option<std::time::Duration>,
        /// Not routed before this time (RFC 3339, e.g. `2026-11-28T09:00:00Z`).
        #[arg(long)]
        not_before: Option<String>,
        /// While a pending task of the queue holds this key, add no task: move that one to the
        /// front of its priority class (the answer says `deduplicated`).
        #[arg(long)]
        dedup_key: Option<String>,
        /// A retry with the same key (after a lost answer) prints the task the first submit
        /// made instead of adding one (kept at least 24 hours).
        #[arg(long)]
        idempotency_key: Option<String>,
        /// A resource a node must hold to run the task (repeatable; `node --resource`).
        #[arg(long = "requires", value_name = "RESOURCE")]
        requires: Vec<String>,
        /// Wait for the outcome and print it.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up waiting after this many seconds.
        #[arg(long, default_value_t = 300)]
        wait_timeout: u64,
        /// A run past this long is cancelled and recorded failed, then retried by the policy
        /// (humantime: `30s`, `5m`; the queue's `timeout_ms` by default).
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<std::time::Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The tasks of a queue this node knows, by id: live ones, and those that ended lately.
    List {
        /// The queue's id.
        queue_id: String,
        /// Only tasks in this state (pending, blocked, assigned, running, input_unavailable,
        /// succeeded, failed, cancelled).
        #[arg(long)]
        state: Option<String>,
        /// At most this many (all pages when absent).
        #[arg(long)]
        limit: Option<usize>,
        /// Print JSON (one array).
        #[arg(long)]
        json: bool,
    },
    /// A task's state, attempts and result.
    Status {
        /// The task's id (automerge:…).
        task_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a task that has not ended: it never starts where the cancel is known, and a
    /// running handler is signalled to stop (a success it still returns stands).
    Cancel {
        /// The task's id (automerge:…).
        task_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Requeue a dead-lettered (failed) task: pending again with a fresh budget of
    /// max_attempts failures, its history kept.
    Requeue {
        /// The task's id (automerge:…).
        task_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Undo a succeeded task: submit the undo tasks its run recorded (each made once, however
    /// many members undo it); prints their ids.
    Undo {
        /// The task's id (automerge:…).
        task_id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> anyhow::Result<()> {
    fix_mmap_threshold();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PIECEWORK_LOG")
                // libp2p warns on every retry to reach a peer that is gone, which is
                // routine here: a dead router is the point of the demo.
                .unwrap_or_else(|_| "warn,libp2p=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(cli))
}

fn print_members(members: &[api::MemberEntry], json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&members);
    }
    println!("{:<54} {:<9} {:<14} removed", "peer", "role", "added by");
    for m in members {
        let short = |p: &Option<piecework::queue_doc::PeerId>| {
            p.as_ref()
                .map_or_else(|| "-".to_owned(), |p| short_id(p.as_str()))
        };
        println!(
            "{:<54} {:<9} {:<14} {}",
            m.peer,
            m.role,
            short(&m.added_by),
            if m.removed {
                format!("by {}", short(&m.removed_by))
            } else {
                "no".to_owned()
            }
        );
    }
    Ok(())
}

fn short_id(p: &str) -> String {
    if p.len() > 12 {
        format!("{}…", &p[..12])
    } else {
        p.to_owned()
    }
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Node {
            data_dir,
            listen,
            bootstrap,
            http,
            workers,
            rotate_min_live,
            archive_keep,
            max_live,
            keep_task_docs,
            keep_sealed_epochs,
            resource,
            stop_grace,
            fault_panic_after_ms,
        } => {
            if !(stop_grace.is_finite() && (0.0..=3600.0).contains(&stop_grace)) {
                bail!("--stop-grace must be between 0 and 3600 seconds, not {stop_grace}");
            }
            let tuning = Tuning {
                workers,
                rotate_min_live,
                archive_keep,
                max_live,
                keep_task_docs,
                keep_sealed_epochs,
                resources: resource,
                stop_grace: Duration::from_secs_f64(stop_grace),
                fault_panic_after: fault_panic_after_ms.map(Duration::from_millis),
            };
            run_node(data_dir, listen, bootstrap, http, tuning).await
        }
        Command::Demo {
            nodes,
            tasks,
            workers,
            rounds,
            json,
        } => {
            let opts = piecework::demo::Options {
                nodes,
                tasks,
                workers,
                rounds,
                progress: true,
            };
            let summary = piecework::demo::run(&opts).await?;
            if json {
                println!("{}", serde_json::to_string(&summary)?);
            } else {
                piecework::demo::print_summary(&summary);
            }
            if summary.lost > 0
                || summary.router_before == summary.router_after
                || summary.completed_after_kill == 0
            {
                bail!(
                    "the demo did not go as it should: {} lost, router {} -> {}, {} tasks completed by the new router",
                    summary.lost,
                    summary.router_before,
                    summary.router_after,
                    summary.completed_after_kill
                );
            }
            Ok(())
        }
        Command::Bench {
            nodes,
            workers,
            tasks,
            kind,
            timings,
            failovers,
            latency_samples,
            window,
            batch,
            rotate_min_live,
            max_live,
            http,
            processes,
            node_exe,
            json,
        } => {
            let opts = piecework::bench::Options {
                nodes,
                workers,
                tasks,
                kind,
                timings,
                failovers,
                latency_samples,
                window,
                batch,
                rotate_min_live,
                max_live,
                http,
                processes,
                exe: node_exe,
                progress: true,
            };
            let report = piecework::bench::run(&opts).await?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                piecework::bench::print_report(&report);
            }
            if report.lost > 0 {
                bail!("{} of {} tasks were lost", report.lost, report.tasks);
            }
            Ok(())
        }
        Command::Queue { command } => {
            let client = client(&cli.node, cli.token_dir.as_deref())?;
            match command {
                QueueCommand::Create {
                    name,
                    order,
                    concurrency,
                    rate_interval,
                    lease,
                    max_attempts,
                    json,
                } => {
                    let patch = ConfigPatch {
                        order,
                        concurrency,
                        rate_interval_ms: rate_interval,
                        lease_ms: lease,
                        max_attempts,
                        ..ConfigPatch::default()
                    };
                    let config = (!patch.is_empty()).then(|| patch.apply(&QueueConfig::default()));
                    let id = client.create_queue(&name, config).await?;
                    if json {
                        print_json(&api::Created { queue_id: id })
                    } else {
                        println!("{id}");
                        Ok(())
                    }
                }
                QueueCommand::Status { queue_id, json } => {
                    let q = client.queue_status(&QueueId::new(queue_id)).await?;
                    print_queue(&q, json)
                }
                QueueCommand::Pause { queue_id, json } => {
                    let q = client.set_paused(&QueueId::new(queue_id), true).await?;
                    print_queue(&q, json)
                }
                QueueCommand::Resume { queue_id, json } => {
                    let q = client.set_paused(&QueueId::new(queue_id), false).await?;
                    print_queue(&q, json)
                }
                QueueCommand::Config {
                    queue_id,
                    set,
                    json,
                } => {
                    let id = QueueId::new(queue_id);
                    let q = if set.is_empty() {
                        client.queue_status(&id).await?
                    } else {
                        client.set_config(&id, &config_patch(&set)?).await?
                    };
                    if json {
                        print_json(&q.config)
                    } else {
                        print_config(&q.config);
                        Ok(())
                    }
                }
                QueueCommand::Boost {
                    queue_id,
                    tag,
                    boost,
                    json,
                } => {
                    let q = client
                        .set_boost(&QueueId::new(queue_id), &tag, boost)
                        .await?;
                    if json {
                        return print_json(&q);
                    }
                    match q.boosts.get(&tag) {
                        Some(b) => println!("{tag}: boost {b}"),
                        None => println!("{tag}: no boost"),
                    }
                    Ok(())
                }
                QueueCommand::Requeue { queue_id, json } => {
                    let r = client.requeue_failed(&QueueId::new(queue_id)).await?;
                    if json {
                        return print_json(&r);
                    }
                    for t in &r.task_ids {
                        println!("{t}");
                    }
                    eprintln!("requeued {} task(s)", r.task_ids.len());
                    Ok(())
                }
                QueueCommand::Schedule(args) => schedules_cli::schedule(&client, args).await,
                QueueCommand::Schedules { queue_id, json } => {
                    schedules_cli::list(&client, queue_id, json).await
                }
                QueueCommand::Unschedule {
                    queue_id,
                    name,
                    json,
                } => schedules_cli::delete(&client, queue_id, name, json).await,
                QueueCommand::Invite {
                    queue_id,
                    role,
                    for_peer,
                    expires,
                } => {
                    let req = api::InviteRequest {
                        role: piecework::queue_doc::Role::parse(&role),
                        for_peer: for_peer.map(piecework::queue_doc::PeerId::new),
                        expires_ms: expires
                            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    };
                    let invited = client.invite(&QueueId::new(queue_id), &req).await?;
                    println!("{}", invited.token);
                    Ok(())
                }
                QueueCommand::Members { queue_id, json } => {
                    let members = client.members(&QueueId::new(queue_id)).await?;
                    print_members(&members, json)
                }
                QueueCommand::Remove {
                    queue_id,
                    peer_id,
                    json,
                } => {
                    let members = client
                        .remove_member(&QueueId::new(queue_id), &peer_id)
                        .await?;
                    print_members(&members, json)
                }
                QueueCommand::Join { token, json } => {
                    let q = if token.trim().starts_with("automerge:") {
                        client.join_queue(&QueueId::new(token.trim())).await?
                    } else {
                        client.join_invite(token.trim()).await?
                    };
                    if json {
                        print_json(&q)
                    } else {
                        println!(
                            "joined {} ({}), {} members, router {}",
                            q.name,
                            q.id,
                            q.members,
                            q.router.map_or("-".into(), |r| r.to_string())
                        );
                        Ok(())
                    }
                }
            }
        }
        Command::Task { command } => {
            let client = client(&cli.node, cli.token_dir.as_deref())?;
            match command {
                TaskCommand::Submit {
                    queue_id,
                    kind,
                    file,
                    input,
                    priority,
                    urgent,
                    max_attempts,
                    tag,
                    depends_on,
                    delay,
                    not_before,
                    dedup_key,
                    idempotency_key,
                    requires,
                    wait,
                    wait_timeout,
                    timeout,
                    json,
                } => {
                    if let Some(file) = file {
                        return submit_file(&client, &QueueId::new(queue_id), &file, json).await;
                    }
                    let kind = kind.context("--kind is required without --file")?;
                    let input: serde_json::Value = serde_json::from_str(&input)
                        .with_context(|| format!("--input is not valid JSON: {input:?}"))?;
                    let req = api::SubmitTask {
                        kind,
                        input,
                        priority,
                        urgent,
                        max_attempts,
                        tags: tag,
                        depends_on: depends_on.into_iter().map(TaskId::new).collect(),
                        delay_ms: delay.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                        not_before,
                        dedup_key,
                        idempotency_key,
                        requires,
                        timeout_ms: timeout
                            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    };
                    let submitted = client.submit(&QueueId::new(queue_id), &req).await?;
                    let id = submitted.task_id.clone();
                    if submitted.deduplicated && !json {
                        eprintln!("deduplicated: a pending task holds the key, moved to the front");
                    }
                    if !wait {
                        if json {
                            return print_json(&submitted);
                        }
                        println!("{id}");
                        return Ok(());
                    }
                    if !json {
                        println!("{id}");
                    }
                    let status = client.wait(&id, Duration::from_secs(wait_timeout)).await?;
                    print_task(&status, json)?;
                    if status.state == TaskState::Failed {
                        bail!("task failed");
                    }
                    Ok(())
                }
                TaskCommand::List {
                    queue_id,
                    state,
                    limit,
                    json,
                } => {
                    let queue = QueueId::new(queue_id);
                    let mut all: Vec<serde_json::Value> = Vec::new();
                    let mut cursor: Option<TaskId> = None;
                    loop {
                        let want = limit.map_or(500, |l| l.saturating_sub(all.len()).min(500));
                        if want == 0 {
                            break;
                        }
                        let page = client
                            .list_tasks(&queue, state.as_deref(), want, cursor.as_ref())
                            .await?;
                        all.extend(page.tasks);
                        match page.next_cursor {
                            Some(c) => cursor = Some(c),
                            None => break,
                        }
                    }
                    if json {
                        return print_json(&all);
                    }
                    for t in &all {
                        let field = |k: &str| t[k].as_str().unwrap_or("-").to_owned();
                        println!("{}\t{}\t{}", field("id"), field("state"), field("kind"));
                    }
                    Ok(())
                }
                TaskCommand::Status { task_id, json } => {
                    let status = client.task_status(&TaskId::new(task_id)).await?;
                    print_task(&status, json)
                }
                TaskCommand::Cancel { task_id, json } => {
                    let status = client.cancel_task(&TaskId::new(task_id)).await?;
                    print_task(&status, json)
                }
                TaskCommand::Requeue { task_id, json } => {
                    let status = client.requeue_task(&TaskId::new(task_id)).await?;
                    print_task(&status, json)
                }
                TaskCommand::Undo { task_id, json } => {
                    let r = client.undo_task(&TaskId::new(task_id)).await?;
                    if json {
                        return print_json(&r);
                    }
                    for t in &r.task_ids {
                        println!("{t}");
                    }
                    eprintln!("{} undo task(s)", r.task_ids.len());
                    Ok(())
                }
            }
        }
        Command::Events { queue, json, count } => {
            if count == Some(0) {
                return Ok(());
            }
            let client = client(&cli.node, cli.token_dir.as_deref())?;
            let queue = queue.map(QueueId::new);
            let mut seen = 0u64;
            client
                .follow_events(
                    queue.as_ref(),
                    || eprintln!("following the events of {}", cli.node),
                    |id, name, data| {
                        print_cli::print_event(id, name, &data, json);
                        seen += 1;
                        count.is_none_or(|c| seen < c)
                    },
                )
                .await
        }
        Command::Resource { command } => {
            let client = client(&cli.node, cli.token_dir.as_deref())?;
            let (r, json) = match command {
                ResourceCommand::List { json } => (client.resources().await?, json),
                ResourceCommand::Add { name, json } => (client.add_resource(&name).await?, json),
                ResourceCommand::Withdraw {
                    name,
                    restore_after,
                    json,
                } => (client.withdraw_resource(&name, restore_after).await?, json),
            };
            if json {
                return print_json(&r);
            }
            if r.resources.is_empty() {
                println!("no resources");
            }
            for res in &r.resources {
                match res.restore_at {
                    Some(at) => println!(
                        "{}: withdrawn, back at {}",
                        res.name,
                        humantime::format_rfc3339_millis(
                            std::time::UNIX_EPOCH + Duration::from_millis(at)
                        )
                    ),
                    None => println!("{}: held", res.name),
                }
            }
            Ok(())
        }
        Command::Status { json } => {
            let client = client(&cli.node, cli.token_dir.as_deref())?;
            let s = client.status().await?;
            if json {
                return print_json(&s);
            }
            println!("peer {} (incarnation {})", s.peer_id, s.incarnation);
            println!(
                "connected to {} peers; kinds: {}",
                s.connected.len(),
                s.kinds.join(", ")
            );
            for q in &s.queues {
                let t = &q.tasks;
                println!(
                    "queue {} ({})\n  router {} (this node: {})\n  tasks: {} pending, {} assigned, {} running, {} succeeded, {} failed, {} waiting for their input",
                    q.name,
                    q.id,
                    q.router
                        .as_ref()
                        .map_or("-".into(), |r| format!("{} term {}", r.peer, r.term)),
                    q.role,
                    t.pending,
                    t.assigned,
                    t.running,
                    t.succeeded,
                    t.failed,
                    t.input_unavailable
                );
            }
            for w in &s.workers {
                match &w.running {
                    Some(r) => println!("worker {}: running {} ({})", w.name, r.task, r.attempt),
                    None => println!("worker {}: idle", w.name),
                }
            }
            Ok(())
        }
    }
}

/// `piecework node`'s optional settings.
struct Tuning {
    workers: Option<u32>,
    rotate_min_live: Option<usize>,
    archive_keep: Option<u64>,
    max_live: Option<usize>,
    keep_task_docs: Option<usize>,
    keep_sealed_epochs: Option<usize>,
    resources: Vec<String>,
    stop_grace: Duration,
    fault_panic_after: Option<Duration>,
}

/// Resolves at the first SIGTERM or SIGINT (Ctrl-C).
async fn stop_signal() -> anyhow::Result<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
        tokio::select! {
            _ = term.recv() => Ok("SIGTERM"),
            _ = int.recv() => Ok("SIGINT"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .context("cannot watch for Ctrl-C")?;
        Ok("Ctrl-C")
    }
}

async fn run_node(
    data_dir: PathBuf,
    listen: Vec<Multiaddr>,
    bootstrap: Vec<Multiaddr>,
    http: SocketAddr,
    tuning: Tuning,
) -> anyhow::Result<()> {
    let Tuning {
        workers,
        rotate_min_live,
        archive_keep,
        max_live,
        keep_task_docs,
        keep_sealed_epochs,
        resources,
        stop_grace,
        fault_panic_after,
    } = tuning;
    let mut config = node::Config::new(data_dir.clone(), piecework::kinds::builtin());
    if let Some(k) = archive_keep {
        if k == 0 {
            bail!("--archive-keep must be at least 1");
        }
        config.archive_keep = k;
    }
    config.listen = listen;
    config.bootstrap = bootstrap;
    if let Some(m) = rotate_min_live {
        if m == 0 {
            bail!("--rotate-min-live must be at least 1");
        }
        config.rotation = Some((node::ROTATE_RATIO, m));
    }
    if let Some(w) = workers {
        if w == 0 {
            bail!("--workers must be at least 1");
        }
        config.workers = w;
    }
    if let Some(m) = max_live {
        if m == 0 {
            bail!("--max-live must be at least 1");
        }
        config.max_live = Some(m);
    }
    config.keep_task_docs = keep_task_docs.unwrap_or(config.keep_task_docs);
    config.keep_sealed_epochs = keep_sealed_epochs.unwrap_or(config.keep_sealed_epochs);
    if let Some(r) = resources
        .iter()
        .find(|r| !piecework::queue_doc::valid_tag(r))
    {
        bail!(
            "--resource {r:?} is not a valid name: 1 to 64 ASCII letters, digits, '_', '-', '.' or ':'"
        );
    }
    config.resources = resources;
    let listener = tokio::net::TcpListener::bind(http)
        .await
        .with_context(|| format!("cannot listen for the HTTP API on {http}"))?;
    let http_addr = listener.local_addr()?;
    // One line, naming what mends it (a key others may read: the `chmod`).
    let node = node::Node::start(config)
        .await
        .map_err(|e| anyhow::anyhow!("cannot start a node in {}: {e}", data_dir.display()))?;
    let handle = node.handle().clone();
    handle.wait_listening().await;
    println!("peer id: {}", handle.peer_id());
    for a in handle.status().await?.listen {
        println!("listening on: {a}");
    }
    println!("http api: http://{http_addr}");
    let server = tokio::spawn(node::http::serve(handle.clone(), listener));
    if let Some(after) = fault_panic_after {
        let h = handle.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            h.inject_shell_panic().await;
        });
    }
    let signal = tokio::select! {
        r = server => {
            r.context("the HTTP server task failed")?.context("the HTTP server stopped")?;
            return Ok(());
        }
        // A node whose shell ended without being asked to (a panic, a failure) can answer
        // nothing: the process exits non-zero rather than serve an API that says so forever.
        why = handle.ended_with() => bail!("the node stopped: {why}"),
        s = stop_signal() => s?,
    };
    eprintln!(
        "{signal}: stopping (runs get {:.1} s to end; a second signal exits at once)",
        stop_grace.as_secs_f64()
    );
    let report = tokio::select! {
        r = handle.shutdown(stop_grace) => r.context("the node could not stop cleanly")?,
        s = stop_signal() => bail!("{}: exiting without waiting for the stop", s?),
    };
    for (queue, to) in &report.handed_over {
        match to {
            Some(peer) => eprintln!("handed the router of {queue} over to {peer}"),
            None => eprintln!("was the router of {queue}, with no member to hand it over to"),
        }
    }
    eprintln!(
        "stopped: {} run(s) finished, {} interrupted",
        report.runs_finished, report.runs_interrupted
    );
    if report.unsaved_documents > 0 {
        bail!(
            "{} document(s) could not be written to disk before stopping (see the errors above)",
            report.unsaved_documents
        );
    }
    Ok(())
}

/// One line of a `task submit --file` run: its task, or why it was not submitted.
#[derive(serde::Serialize)]
struct LineAnswer {
    line: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<TaskId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Submits a JSON-lines file in batches of [`api::MAX_BATCH`]; fails (after answering every
/// line) if any line was refused.
async fn submit_file(
    client: &Client,
    queue: &QueueId,
    path: &std::path::Path,
    json: bool,
) -> anyhow::Result<()> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the tasks from stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the tasks file {}", path.display()))?
    };
    let mut answers = Vec::new();
    let mut batch: Vec<(usize, serde_json::Value)> = Vec::new();
    let lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty());
    let mut lines = lines.peekable();
    while let Some((i, line)) = lines.next() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => batch.push((i + 1, v)),
            Err(e) => answers.push(LineAnswer {
                line: i + 1,
                task_id: None,
                error: Some(format!("not JSON: {e}")),
            }),
        }
        if batch.len() == api::MAX_BATCH || (lines.peek().is_none() && !batch.is_empty()) {
            let (numbers, values): (Vec<usize>, Vec<serde_json::Value>) =
                std::mem::take(&mut batch).into_iter().unzip();
            let entries = match client.submit_many(queue, &values).await {
                Ok(entries) => entries,
                Err(e) => {
                    // What was submitted before stays submitted: say which lines those were.
                    print_lines(&mut answers, json)?;
                    return Err(e.context(format!(
                        "lines {} to {} and any after them were not submitted",
                        numbers[0],
                        numbers[numbers.len() - 1]
                    )));
                }
            };
            for e in entries {
                let (index, task_id, error) = match e {
                    api::BatchEntry::Submitted { index, task_id, .. } => {
                        (index, Some(task_id), None)
                    }
                    api::BatchEntry::Refused { index, error } => (index, None, Some(error)),
                };
                let line = numbers.get(index).copied().unwrap_or(0);
                answers.push(LineAnswer {
                    line,
                    task_id,
                    error,
                });
            }
        }
    }
    print_lines(&mut answers, json)?;
    let refused = answers.iter().filter(|a| a.error.is_some()).count();
    if refused > 0 {
        bail!(
            "{refused} of {} lines were not submitted (see their errors above)",
            answers.len()
        );
    }
    Ok(())
}

/// Prints each line's answer in line order: `<line>\t<task id>` or `<line>\terror: <why>`.
fn print_lines(answers: &mut [LineAnswer], json: bool) -> anyhow::Result<()> {
    answers.sort_by_key(|a| a.line);
    if json {
        return print_json(&answers);
    }
    for a in answers.iter() {
        match (&a.task_id, &a.error) {
            (Some(id), _) => println!("{}\t{id}", a.line),
            (None, Some(e)) => println!("{}\terror: {e}", a.line),
            (None, None) => {}
        }
    }
    Ok(())
}

/// The size from which glibc gives an allocation pages of its own (`mmap`), returned to the
/// system when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 1 << 20;

/// Keeps glibc's mmap threshold at [`MMAP_THRESHOLD`]. By default glibc raises it each time a
/// block that large is freed (up to 32 MiB), and from then on a node's large, short-lived
/// buffers (a compaction's encoding of the queue document, a rotation's copy of the live
/// tasks) come from its heaps, where the memory stays with the process once they are freed.
/// One node process with 10,000 live tasks peaked at 170–201 MiB with the default and 135–162
/// MiB with this, at the same throughput (docs/benchmarks.md).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn fix_mmap_threshold() {
    // SAFETY: mallopt only sets an allocator parameter, and this runs before any other
    // thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn fix_mmap_threshold() {}
