//! `piecework demo`: a cluster on this machine telling the whole story: nodes start on
//! loopback, a queue is created and joined, tasks are submitted and routed, the active router is
//! killed when about a third are done, another peer takes over, and every task still completes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use indicatif::{ProgressBar, ProgressStyle};
use piecework_node::{Config, IsolatedNode, NodeEvent, NodeHandle, api, spawn_isolated};
use piecework_queue_doc::{AttemptOutcome, Claim, PeerId, QueueConfig, QueueView, TaskState};
use piecework_router::Event as RouterEvent;
use serde::Serialize;

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Nodes in the cluster (at least 2).
    pub nodes: usize,
    /// Tasks to submit.
    pub tasks: usize,
    /// Workers per node.
    pub workers: u32,
    /// SHA-256 rounds per task (the work each task does).
    pub rounds: u64,
    /// Show live progress on stderr.
    pub progress: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            nodes: 3,
            tasks: 200,
            workers: 2,
            rounds: 20_000,
            progress: true,
        }
    }
}

/// The demo's summary (`--json` prints it as one object).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Nodes started.
    pub nodes: usize,
    /// Tasks submitted.
    pub tasks_submitted: usize,
    /// Tasks that succeeded.
    pub tasks_completed: usize,
    /// Handler runs that ended, on the surviving replicas' records.
    pub executions: usize,
    /// Tasks whose handler succeeded more than once.
    pub duplicates: usize,
    /// Submitted tasks that never completed: the acknowledged task ids that did not end
    /// `succeeded`, counted one by one.
    pub lost: usize,
    /// Those tasks' ids.
    pub lost_tasks: Vec<String>,
    /// The router killed.
    pub router_before: String,
    /// The router that took over.
    pub router_after: String,
    /// The router's term before and after.
    pub term_before: u64,
    /// The new router's term.
    pub term_after: u64,
    /// From the kill to the first task routed by the new router.
    pub takeover_ms: u64,
    /// From the first submit to the last completion.
    pub elapsed_ms: u64,
    /// Tasks completed when the router was killed, as the observing node saw them just before
    /// the kill.
    pub completed_at_kill: usize,
    /// Tasks whose successful run was routed by a router that claimed after the killed one (a
    /// greater claim), per task id in the state read after the run: work that was still to do
    /// when the router died. More than zero shows that the kill landed before the end.
    pub completed_after_kill: usize,
}

/// The fastest queue timings the docs recommend (`docs/benchmarks.md`, failover): a router
/// heartbeat every 50 ms, takeover after 150 ms, settle 25 ms, a pool heartbeat every 50 ms
/// and a 500 ms lease. A router is taken over about 200–300 ms after it dies. Faster timings
/// depose healthy routers whose node is busy for a moment.
pub fn fast_config() -> QueueConfig {
    QueueConfig {
        heartbeat_ms: 50,
        takeover_after_ms: 150,
        settle_ms: 25,
        pool_heartbeat_ms: 50,
        lease_ms: 500,
        ..QueueConfig::default()
    }
}

/// The queue timings the demo uses: a router heartbeat every 200 ms, takeover after 1 s.
pub fn demo_config() -> QueueConfig {
    QueueConfig {
        heartbeat_ms: 200,
        takeover_after_ms: 1_000,
        settle_ms: 200,
        pool_heartbeat_ms: 200,
        lease_ms: 2_000,
        ..QueueConfig::default()
    }
}

fn short(p: &PeerId) -> String {
    let s = p.as_str();
    format!("…{}", &s[s.len().saturating_sub(6)..])
}

struct Display {
    bar: ProgressBar,
}

impl Display {
    fn new(total: usize, show: bool) -> Self {
        let bar = if show {
            ProgressBar::new(total as u64)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:40.cyan/blue} {pos:>4}/{len} done  {msg}")
                .expect("valid template"),
        );
        Display { bar }
    }

    fn say(&self, line: String) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

async fn wait_view(
    rx: &mut tokio::sync::watch::Receiver<Arc<QueueView>>,
    within: Duration,
    what: &str,
    mut done: impl FnMut(&QueueView) -> bool,
) -> anyhow::Result<Arc<QueueView>> {
    tokio::time::timeout(within, async {
        loop {
            let v = rx.borrow_and_update().clone();
            if done(&v) {
                return Ok(v);
            }
            rx.changed().await.context("the node stopped")?;
        }
    })
    .await
    .with_context(|| format!("timed out waiting for {what}"))?
}

/// Runs the demo and returns its summary.
pub async fn run(opts: &Options) -> anyhow::Result<Summary> {
    if opts.nodes < 2 {
        bail!("the demo needs at least 2 nodes to show a takeover");
    }
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let display = Display::new(opts.tasks, opts.progress);
    let node_config = |i: usize, bootstrap: Vec<piecework_node::Multiaddr>| {
        let mut c = Config::new(dir.path().join(format!("node{i}")), crate::kinds::builtin());
        c.workers = opts.workers;
        c.bootstrap = bootstrap;
        // Every task is submitted while routing is paused: the queue must take them all.
        c.max_live = Some(opts.tasks.max(piecework_node::MAX_LIVE));
        c
    };
    let mut nodes: Vec<Option<IsolatedNode>> = Vec::new();
    let first = spawn_isolated(node_config(0, vec![]), 1).await?;
    let addr = first.handle().wait_listening().await;
    nodes.push(Some(first));
    for i in 1..opts.nodes {
        nodes.push(Some(
            spawn_isolated(node_config(i, vec![addr.clone()]), 1).await?,
        ));
    }
    let handles: Vec<NodeHandle> = nodes.iter().flatten().map(|n| n.handle().clone()).collect();
    display.say(format!(
        "started {} nodes on loopback: {}",
        opts.nodes,
        handles
            .iter()
            .map(|h| short(h.peer_id()))
            .collect::<Vec<_>>()
            .join(" ")
    ));

    let queue = handles[0].create_queue("demo", Some(demo_config())).await?;
    for h in &handles[1..] {
        h.join_from(&handles[0], &queue, crate::queue_doc::Role::Member)
            .await?;
    }
    display.say(format!(
        "queue {queue} created on node 0 and joined by the others"
    ));
    let mut watch0 = handles[0].watch_queue(&queue).context("queue not open")?;
    let view = wait_view(
        &mut watch0,
        Duration::from_secs(30),
        "a first router",
        |v| v.router.is_some(),
    )
    .await?;
    let first_router = view.router.clone().expect("checked");
    display.say(format!(
        "router elected: {} (term {})",
        short(&first_router.peer),
        first_router.term
    ));

    // Watch router events on every node, to narrate the takeover.
    let mut events = futures::stream::select_all(
        handles
            .iter()
            .map(|h| events_of(h.peer_id().clone(), h.events())),
    );

    // Submit with routing paused, so that the run starts from zero done.
    handles[0].set_paused(&queue, true).await?;
    let submit_started = Instant::now();
    let mut submits = FuturesUnordered::new();
    let mut submitted = 0usize;
    let mut task_ids = Vec::with_capacity(opts.tasks);
    for i in 0..opts.tasks {
        let h = handles[i % handles.len()].clone();
        let q = queue.clone();
        let req = api::SubmitTask {
            kind: "sha256".into(),
            input: serde_json::json!({ "data": format!("piecework demo task {i}"), "rounds": opts.rounds }),
            priority: 0,
            urgent: false,
            max_attempts: None,
            tags: Vec::new(),
            depends_on: Vec::new(),
            delay_ms: None,
            not_before: None,
            dedup_key: None,
            idempotency_key: None,
            requires: Vec::new(),
            timeout_ms: None,
        };
        submits.push(async move { h.submit(&q, req).await });
        if submits.len() >= 32
            && let Some(r) = submits.next().await
        {
            task_ids.push(r?.task_id);
            submitted += 1;
        }
    }
    while let Some(r) = submits.next().await {
        task_ids.push(r?.task_id);
        submitted += 1;
    }
    display.say(format!(
        "submitted {submitted} sha256 tasks ({} rounds each) through all nodes in {} ms; resuming the queue",
        opts.rounds,
        submit_started.elapsed().as_millis()
    ));
    let started = Instant::now();
    handles[0].set_paused(&queue, false).await?;

    // Observe from a node that is not the router, so that the observer survives the kill.
    let router_index = |c: &Claim| handles.iter().position(|h| h.peer_id() == &c.peer);
    let victim =
        router_index(&first_router).context("the router is not one of the demo's nodes")?;
    let observer = (victim + 1) % handles.len();
    let mut watch = handles[observer]
        .watch_queue(&queue)
        .context("queue not open")?;
    let deadline = Duration::from_secs(120) + Duration::from_millis(opts.tasks as u64 * 100);

    let mut killed: Option<(Instant, u64, Claim, usize)> = None;
    let mut new_router: Option<Claim> = None;
    let mut takeover_ms = None;
    let outcome = tokio::time::timeout(deadline, async {
        loop {
            let view = watch.borrow_and_update().clone();
            // Tasks that ended before the queue document's last rotation count too.
            let c = view.total_counts();
            let router = view.router.clone();
            display.bar.set_position(c.succeeded as u64);
            display.bar.set_message(format!(
                "router {} term {}  running {}  pending {}",
                router.as_ref().map_or("-".into(), |r| short(&r.peer)),
                router.as_ref().map_or(0, |r| r.term),
                c.running + c.assigned,
                c.pending
            ));
            if killed.is_none() && c.succeeded * 3 >= opts.tasks {
                let current = view.router.clone().expect("a router routed these");
                let Some(i) = router_index(&current) else { bail!("unknown router") };
                if i == observer {
                    // The observer became the router (it cannot be killed and watched): watch
                    // from another node.
                    let next = (i + 1) % handles.len();
                    watch = handles[next].watch_queue(&queue).context("queue not open")?;
                    continue;
                }
                let node = nodes[i].take().context("router already killed")?;
                let _closed = node.kill();
                let kill_wall = piecework_now_ms();
                display.say(format!(
                    "killed the active router {} (term {}) with {} of {} tasks done",
                    short(&current.peer),
                    current.term,
                    c.succeeded,
                    opts.tasks
                ));
                killed = Some((Instant::now(), kill_wall, current, c.succeeded));
            }
            if let Some((_, kill_wall, old, _)) = &killed
                && takeover_ms.is_none() {
                    let first_routed = view
                        .tasks()
                        .values()
                        .flat_map(|t| t.attempts.iter())
                        .filter(|a| a.id.claim > *old)
                        .min_by_key(|a| a.assigned_at);
                    if let Some(a) = first_routed {
                        takeover_ms = Some(a.assigned_at.saturating_sub(*kill_wall));
                        new_router = Some(a.id.claim.clone());
                        display.say(format!(
                            "takeover: {} routed its first task {} ms after the kill (term {})",
                            short(&a.id.claim.peer),
                            a.assigned_at.saturating_sub(*kill_wall),
                            a.id.claim.term
                        ));
                    }
                }
            if c.succeeded + c.failed >= opts.tasks && takeover_ms.is_some() {
                return Ok(view);
            }
            tokio::select! {
                r = watch.changed() => r.context("the observing node stopped")?,
                Some((peer, ev)) = events.next() => {
                    if let NodeEvent::Router { event, .. } = ev {
                        match event {
                            RouterEvent::Claimed(c) if killed.is_some() => display.say(format!("{} claims the router record, term {}", short(&peer), c.term)),
                            RouterEvent::BecameActive(c) if killed.is_some() => display.say(format!("{} rechecked its claim and is now the active router (term {})", short(&peer), c.term)),
                            RouterEvent::ClaimLost { winner, .. } => display.say(format!("{} lost its claim to {}", short(&peer), winner.map_or("-".into(), |w| short(&w.peer)))),
                            _ => {}
                        }
                    }
                }
            }
        }
    })
    .await;
    display.bar.finish_and_clear();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let final_view = match outcome {
        Ok(v) => v?,
        Err(_) => watch.borrow().clone(),
    };
    let Some((_, _, old, completed_at_kill)) = killed else {
        bail!("the demo ended before the router could be killed");
    };

    // Count executions and duplicates from both records a run leaves: the attempt's outcome in
    // the queue document and the run record in the task document (a killed node's last writes
    // may have reached only one of them). Per task, the larger count wins.
    let reader = handles[observer].clone();
    let mut executions = 0;
    let mut duplicates = 0;
    // Per task id: a task counts as completed only if its own state says succeeded (in the
    // final view, or in its status once the view no longer carries it), and as lost otherwise;
    // never by subtracting counts.
    let mut completed = 0;
    let mut lost_tasks = Vec::new();
    let mut completed_after_kill = 0;
    // An attempt that succeeded, routed under a claim greater than the killed router's.
    let by_a_later_router = |a: &piecework_queue_doc::Attempt| {
        a.id.claim > old
            && a.finished
                .as_ref()
                .is_some_and(|f| f.outcome == AttemptOutcome::Succeeded)
    };
    for id in &task_ids {
        let (mut ended, mut ok) = (0, 0);
        let mut succeeded = false;
        let mut after_kill = false;
        if let Some(t) = final_view.task(id) {
            succeeded = t.state() == TaskState::Succeeded;
            after_kill = t.attempts.iter().any(by_a_later_router);
            let ran = t.attempts.iter().filter(|a| a.started.is_some());
            let finished: Vec<_> = ran.filter_map(|a| a.finished.as_ref()).collect();
            ended = finished.len();
            ok = finished
                .iter()
                .filter(|f| f.outcome == AttemptOutcome::Succeeded)
                .count();
        }
        if let Ok(s) = reader.task_status(id).await {
            succeeded |= s.state == TaskState::Succeeded;
            after_kill |= s.attempts.iter().any(by_a_later_router);
            let runs: Vec<_> = s.runs.iter().filter_map(|r| r.end.as_ref()).collect();
            ended = ended.max(runs.len());
            ok = ok.max(
                runs.iter()
                    .filter(|e| e.outcome == AttemptOutcome::Succeeded)
                    .count(),
            );
        }
        executions += ended;
        if ok > 1 {
            duplicates += 1;
        }
        if succeeded {
            completed += 1;
            if after_kill {
                completed_after_kill += 1;
            }
        } else {
            lost_tasks.push(id.to_string());
        }
    }
    let after = final_view
        .router
        .clone()
        .or(new_router)
        .unwrap_or_else(|| old.clone());
    drop(handles);
    drop(nodes);
    Ok(Summary {
        nodes: opts.nodes,
        tasks_submitted: submitted,
        tasks_completed: completed,
        executions,
        duplicates,
        lost: lost_tasks.len(),
        lost_tasks,
        router_before: old.peer.to_string(),
        router_after: after.peer.to_string(),
        term_before: old.term,
        term_after: after.term,
        takeover_ms: takeover_ms.unwrap_or(0),
        elapsed_ms,
        completed_at_kill,
        completed_after_kill,
    })
}

fn piecework_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A node's event receiver as a stream of (node, event); lagged events are skipped.
fn events_of(
    peer: PeerId,
    rx: tokio::sync::broadcast::Receiver<NodeEvent>,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = (PeerId, NodeEvent)> + Send>> {
    Box::pin(futures::stream::unfold(rx, move |mut rx| {
        let peer = peer.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => return Some(((peer, ev), rx)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    }))
}

/// Prints the summary for people.
pub fn print_summary(s: &Summary) {
    println!("nodes              {}", s.nodes);
    println!("tasks submitted    {}", s.tasks_submitted);
    println!("tasks completed    {}", s.tasks_completed);
    println!("executions         {}", s.executions);
    println!(
        "duplicates         {}  (tasks whose handler succeeded more than once)",
        s.duplicates
    );
    println!("lost               {}", s.lost);
    for id in &s.lost_tasks {
        println!("  lost task        {id}");
    }
    println!(
        "after the kill     {}  (tasks that succeeded on a run the new router routed)",
        s.completed_after_kill
    );
    println!(
        "router before      {} (term {})",
        s.router_before, s.term_before
    );
    println!(
        "router after       {} (term {})",
        s.router_after, s.term_after
    );
    println!(
        "takeover           {} ms from the kill to the first task routed by the new router",
        s.takeover_ms
    );
    println!("elapsed            {} ms", s.elapsed_ms);
}
