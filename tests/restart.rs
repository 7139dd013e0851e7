//! A `piecework node` process SIGKILLed while it runs tasks, then restarted on the same data
//! directory (same identity, same redb store).
//!
//! Three node processes on loopback share a queue with short timings (see
//! [`support::fast_config`]: lease 2 s). Six `wait_file` tasks occupy the six workers: each run
//! stays in flight until the test creates its release file, so a run seen started is certainly
//! still running when its node is killed. The test picks a node that is not the active router
//! and whose workers run tasks it has recorded as started, SIGKILLs it, and only then releases
//! the runs. The other two re-route its tasks once its lease expires; once each of those tasks
//! has a started attempt on a survivor, the victim is restarted on its data directory,
//! bootstrapping from the survivors. What is checked:
//!
//! 1. The restarted node has the same peer id and the next incarnation (`status.incarnation`
//!    is one more than before the kill).
//! 2. It reopens the queue by itself: its status lists the queue right after its banner,
//!    without a `join`.
//! 3. Every attempt the victim had started before the kill and that was still running then
//!    (what its workers reported running, as its own replica recorded them started) ends
//!    `interrupted`, with `started.incarnation` the old incarnation, as seen by both the
//!    restarted node and a survivor.
//! 4. Every submitted task reaches `succeeded` with its result, as seen by both survivors and
//!    by the restarted node: the six before the kill (whose documents the restarted node had on
//!    its disk without their runs' ends, and must bring up to date), and six more submitted
//!    through the restarted node afterwards, held until one of them runs on it (so that the
//!    checks below see its new incarnation at work). Nothing is lost: the queue counts exactly
//!    as many succeeded tasks as were submitted.
//! 5. No stale attempt ran. For every task:
//!    - no attempt started by the restarted node's new incarnation has a lower number than
//!      another started attempt of the task (it never started an attempt that had been
//!      superseded, e.g. by the re-route);
//!    - every attempt it started in its new incarnation was addressed to that incarnation
//!      (`pool_incarnation`), never to its earlier life;
//!    - no attempt has runs (task document) from two incarnations of the same node, i.e. the
//!      old and the new incarnation never both ran the same attempt.
//!
//! Waits are on process output and on the API's long-poll; states without an event (workers'
//! `running`, an attempt's end) are polled with a short pause under a generous deadline.

mod support;

use std::collections::BTreeSet;
use std::time::Instant;

use piecework::client::Client;
use piecework::node::api;
use piecework::queue_doc::{AttemptId, AttemptOutcome, QueueId, TaskId, TaskState};
use support::{NodeOptions, NodeProcess, fast_config, poll, spawn, wait_final};

/// Tasks submitted before the kill: one per worker. As many are submitted after the restart.
const FIRST_BATCH: usize = 6;

/// Submits, through `node`, a `wait_file` task whose run lasts until `release` exists.
async fn submit_held(node: &NodeProcess, queue: &QueueId, release: &std::path::Path) -> TaskId {
    support::submit_kind(
        node,
        queue,
        "wait_file",
        serde_json::json!({ "path": release }),
    )
    .await
}

/// Ends every run waiting on `release` (and lets later ones end at once).
fn release(path: &std::path::Path) {
    std::fs::write(path, b"").expect("the release file is written");
}

/// Waits through `via` until `id` is final; checks that it succeeded, with its result.
async fn succeeded(urls: &[String], via: &str, id: &TaskId) -> api::TaskStatus {
    let s = wait_final(urls, via, id).await;
    assert_eq!(s.state, TaskState::Succeeded, "{id} via {via}: {s:#?}");
    assert!(s.result.is_some(), "{id} via {via} has its result");
    s
}

/// The attempts `node`'s workers run that its own replica records as started by `incarnation`.
async fn started_runs(node: &NodeProcess, incarnation: u64) -> Vec<(TaskId, AttemptId)> {
    let client = node.client();
    let Ok(status) = client.status().await else {
        return vec![];
    };
    let mut started = vec![];
    for w in &status.workers {
        let Some(r) = &w.running else { continue };
        let Ok(t) = client.task_status(&r.task).await else {
            continue;
        };
        let recorded = t.attempts.iter().any(|a| {
            a.id == r.attempt
                && a.started
                    .as_ref()
                    .is_some_and(|s| s.incarnation == incarnation)
        });
        if recorded {
            started.push((r.task.clone(), r.attempt.clone()));
        }
    }
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_on_its_data_directory_interrupts_its_old_runs_and_loses_nothing() {
    let t0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let dirs: Vec<_> = ["a", "b", "c"].iter().map(|n| dir.path().join(n)).collect();
    let mut nodes: Vec<Option<NodeProcess>> = vec![];
    for d in &dirs {
        let mut opts = NodeOptions::loopback(d);
        opts.bootstrap = nodes.iter().flatten().map(|n| n.listen.clone()).collect();
        nodes.push(Some(tokio::task::block_in_place(|| spawn(&opts))));
    }
    let n =
        |nodes: &[Option<NodeProcess>], i: usize| -> Client { nodes[i].as_ref().unwrap().client() };
    let urls: Vec<String> = nodes.iter().flatten().map(|n| n.http.clone()).collect();

    // The CLI cannot set a queue's timings; the HTTP API can.
    let queue = n(&nodes, 0)
        .create_queue("restart", Some(fast_config()))
        .await
        .unwrap();
    for i in 1..3 {
        let peer = nodes[i].as_ref().unwrap().peer.clone();
        n(&nodes, i)
            .join_from(
                &n(&nodes, 0),
                &queue,
                &peer,
                piecework::queue_doc::Role::Admin,
            )
            .await
            .unwrap();
    }

    // Six held tasks for six workers: none can end before the kill.
    let first_release = dir.path().join("release-first");
    let mut tasks = vec![];
    for i in 0..FIRST_BATCH {
        tasks.push(submit_held(nodes[i % 3].as_ref().unwrap(), &queue, &first_release).await);
    }

    // A victim: a node that is not the active router, running tasks it recorded as started.
    let (victim, old_incarnation, interrupted) = poll("a non-router node running tasks", || {
        let (nodes, queue) = (&nodes, &queue);
        async move {
            for (i, node) in nodes.iter().enumerate() {
                let node = node.as_ref().unwrap();
                let Ok(status) = node.client().status().await else {
                    continue;
                };
                let Some(q) = status.queues.iter().find(|q| q.id == *queue) else {
                    continue;
                };
                let routes = q
                    .router
                    .as_ref()
                    .is_none_or(|r| r.peer.as_str() == node.peer);
                if q.role != "follower" || routes {
                    continue;
                }
                let started = started_runs(node, status.incarnation).await;
                if !started.is_empty() {
                    return Ok((i, status.incarnation, started));
                }
            }
            Err("no follower runs a started task yet".to_owned())
        }
    })
    .await;
    let victim_peer = nodes[victim].as_ref().unwrap().peer.clone();
    eprintln!(
        "[{:?}] killing node {victim} ({victim_peer}, incarnation {old_incarnation}), running {interrupted:?}",
        t0.elapsed()
    );
    tokio::task::block_in_place(|| nodes[victim].take().unwrap().kill());
    // The victim's runs were in flight when it died; now every run may end.
    release(&first_release);
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let survivor = nodes[survivors[0]].as_ref().unwrap().client();
    let survivor_url = nodes[survivors[0]].as_ref().unwrap().http.clone();

    // The survivors re-route the victim's tasks after its lease: each gets a started attempt
    // with a greater number on another node.
    for (task, attempt) in &interrupted {
        poll("the survivors to re-route the victim's task", || {
            let (survivor, victim_peer) = (&survivor, &victim_peer);
            async move {
                let t = survivor
                    .task_status(task)
                    .await
                    .map_err(|e| e.to_string())?;
                let rerouted = t.attempts.iter().any(|a| {
                    a.id.n > attempt.n
                        && a.worker.peer.as_str() != victim_peer.as_str()
                        && a.started.is_some()
                });
                rerouted
                    .then_some(())
                    .ok_or_else(|| format!("{task}: {:?}", t.attempts))
            }
        })
        .await;
    }
    eprintln!("[{:?}] re-routed; restarting node {victim}", t0.elapsed());

    // Restart on the same data directory, bootstrapping from the survivors.
    let mut opts = NodeOptions::loopback(&dirs[victim]);
    opts.bootstrap = survivors
        .iter()
        .map(|&i| nodes[i].as_ref().unwrap().listen.clone())
        .collect();
    let restarted = tokio::task::block_in_place(|| spawn(&opts));
    assert_eq!(restarted.peer, victim_peer, "the same identity");
    let status = restarted.client().status().await.unwrap();
    assert_eq!(
        status.incarnation,
        old_incarnation + 1,
        "the restarted node is the next incarnation"
    );
    let new_incarnation = status.incarnation;
    assert!(
        status.queues.iter().any(|q| q.id == queue),
        "the restarted node reopened the queue by itself: {status:#?}"
    );
    let restarted_url = restarted.http.clone();
    nodes[victim] = Some(restarted);
    let urls: Vec<String> = urls
        .iter()
        .enumerate()
        .map(|(i, u)| {
            if i == victim {
                restarted_url.clone()
            } else {
                u.clone()
            }
        })
        .collect();

    // Every task of the first batch succeeds, with its result, as seen by both survivors and
    // by the restarted node: it had those tasks' documents on its disk, without their runs'
    // ends, and must bring them up to date.
    let survivor_urls: Vec<String> = survivors
        .iter()
        .map(|&i| nodes[i].as_ref().unwrap().http.clone())
        .collect();
    let all_views: Vec<&String> = survivor_urls.iter().chain([&restarted_url]).collect();
    for id in &tasks {
        for via in &all_views {
            succeeded(&urls, via, id).await;
        }
    }
    eprintln!("[{:?}] the first batch succeeded", t0.elapsed());

    // The runs in flight at the kill end `interrupted`, started by the old incarnation.
    for (task, attempt) in &interrupted {
        for via in [&survivor_url, &restarted_url] {
            let client = Client::new(via).unwrap();
            let a = poll("the old run to be marked interrupted", || {
                let client = &client;
                async move {
                    let t = client.task_status(task).await.map_err(|e| e.to_string())?;
                    let a = t
                        .attempts
                        .iter()
                        .find(|a| a.id == *attempt)
                        .ok_or_else(|| format!("{task} has no attempt {attempt}"))?;
                    match a.finished {
                        Some(_) => Ok(a.clone()),
                        None => Err(format!("{task} {attempt} still open: {a:?}")),
                    }
                }
            })
            .await;
            let finished = a.finished.as_ref().unwrap();
            assert_eq!(
                finished.outcome,
                AttemptOutcome::Interrupted,
                "{task} {attempt} via {via}: {a:?}"
            );
            assert_eq!(
                a.started.as_ref().map(|s| s.incarnation),
                Some(old_incarnation),
                "{task} {attempt} via {via}: {a:?}"
            );
            assert_eq!(a.worker.peer.as_str(), victim_peer);
        }
    }

    // Six more held tasks, submitted through the restarted node: the survivors' four workers
    // can hold only four of them (the router hands tasks to idle workers only), so the
    // restarted node's new incarnation runs at least one. Released once it does.
    let second_release = dir.path().join("release-second");
    let mut ids = vec![];
    for _ in 0..FIRST_BATCH {
        ids.push(submit_held(nodes[victim].as_ref().unwrap(), &queue, &second_release).await);
    }
    poll(
        "the restarted node to run a task submitted after its restart",
        || {
            let (client, ids) = (nodes[victim].as_ref().unwrap().client(), &ids);
            async move {
                let status = client.status().await.map_err(|e| e.to_string())?;
                let running: Vec<_> = status
                    .workers
                    .iter()
                    .filter_map(|w| w.running.as_ref())
                    .filter(|r| ids.contains(&r.task))
                    .collect();
                (!running.is_empty())
                    .then_some(())
                    .ok_or_else(|| format!("its workers: {:?}", status.workers))
            }
        },
    )
    .await;
    release(&second_release);
    let mut ran_after_restart = false;
    for id in &ids {
        for via in &all_views {
            let s = succeeded(&urls, via, id).await;
            ran_after_restart |= s.attempts.iter().any(|a| {
                a.worker.peer.as_str() == victim_peer
                    && a.started
                        .as_ref()
                        .is_some_and(|s| s.incarnation == new_incarnation)
            });
        }
    }
    tasks.extend(ids);
    eprintln!(
        "[{:?}] the tasks submitted after the restart succeeded",
        t0.elapsed()
    );
    assert!(
        ran_after_restart,
        "the restarted node's new incarnation started none of the tasks submitted after its restart"
    );

    // Every attempt the old incarnation started has ended (before the kill, or interrupted).
    poll("every attempt of the old incarnation to have ended", || {
        let (client, tasks, victim_peer) = (
            nodes[victim].as_ref().unwrap().client(),
            &tasks,
            &victim_peer,
        );
        async move {
            for id in tasks {
                let t = client.task_status(id).await.map_err(|e| e.to_string())?;
                let open = t.attempts.iter().find(|a| {
                    a.worker.peer.as_str() == victim_peer.as_str()
                        && a.started
                            .as_ref()
                            .is_some_and(|s| s.incarnation == old_incarnation)
                        && a.finished.is_none()
                });
                if let Some(a) = open {
                    return Err(format!("{id}: {a:?} is still open"));
                }
            }
            Ok(())
        }
    })
    .await;

    // No stale attempt ran.
    let mut started_after_restart = 0;
    for id in &tasks {
        let t = survivor.task_status(id).await.unwrap();
        let max_started = t
            .attempts
            .iter()
            .filter(|a| a.started.is_some())
            .map(|a| a.id.n)
            .max()
            .expect("a started attempt");
        for a in &t.attempts {
            let Some(started) = &a.started else { continue };
            if a.worker.peer.as_str() != victim_peer || started.incarnation != new_incarnation {
                continue;
            }
            started_after_restart += 1;
            assert_eq!(
                a.id.n, max_started,
                "{id}: the restarted node started a superseded attempt: {:#?}",
                t.attempts
            );
            assert!(
                a.pool_incarnation.is_none_or(|i| i == new_incarnation),
                "{id}: the restarted node started an attempt addressed to its earlier life: {a:#?}"
            );
        }
        for a in &t.attempts {
            let incarnations: BTreeSet<u64> = t
                .runs
                .iter()
                .filter(|r| r.attempt == a.id && r.worker == a.worker)
                .map(|r| r.incarnation)
                .collect();
            assert!(
                incarnations.len() <= 1,
                "{id}: attempt {} ran in incarnations {incarnations:?}: {:#?}",
                a.id,
                t.runs
            );
        }
    }
    let counts = survivor.status().await.unwrap();
    let q = counts.queues.iter().find(|q| q.id == queue).unwrap();
    assert_eq!(q.tasks.succeeded, tasks.len(), "{q:#?}");
    eprintln!(
        "[{:?}] done: {} tasks, {started_after_restart} attempts started after the restart",
        t0.elapsed(),
        tasks.len()
    );
}

/// Invariant 8 with the real shell and store: a node process SIGKILLed right after each
/// acknowledgement (a single inline submit, one with a task document, a batch) is restarted on
/// its data directory alone, and every acknowledged task is there and runs to its end. The
/// shell answers only after the store's durable commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_acknowledged_just_before_a_sigkill_is_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("a");
    let node = spawn(&NodeOptions::loopback(&data));
    let queue = node
        .client()
        .create_queue("durable", Some(fast_config()))
        .await
        .unwrap();
    let mut node = Some(node);
    let task = |input: serde_json::Value| api::SubmitTask {
        kind: "noop".into(),
        input,
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
    let mut acked: Vec<TaskId> = Vec::new();
    for round in 0..3 {
        let n = node.take().unwrap();
        let c = n.client();
        match round {
            // Inline: the entry is all there is.
            0 => acked.push(
                c.submit(&queue, &task(serde_json::json!({})))
                    .await
                    .unwrap()
                    .task_id,
            ),
            // An input too large to go inline: a task document and its entry.
            1 => {
                let big = serde_json::json!({ "pad": "x".repeat(1_000) });
                acked.push(c.submit(&queue, &task(big)).await.unwrap().task_id);
            }
            // A batch.
            _ => {
                let batch: Vec<serde_json::Value> = (0..10)
                    .map(|i| serde_json::to_value(task(serde_json::json!({ "i": i }))).unwrap())
                    .collect();
                for e in c.submit_many(&queue, &batch).await.unwrap() {
                    acked.push(e.task_id().expect("taken").clone());
                }
            }
        }
        // SIGKILL at once, then start again on the same directory, alone.
        n.kill();
        node = Some(spawn(&NodeOptions::loopback(&data)));
    }
    let n = node.unwrap();
    let url = vec![n.http.clone()];
    for id in &acked {
        let s = wait_final(&url, &n.http, id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{id}");
    }
}
