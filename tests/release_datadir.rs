//! A data directory written by an earlier release opens with this one: the node reopens its
//! queue, every task the earlier release ran reads as succeeded with its result, the counts
//! include the tasks that release's rotations retired, and the queue goes on taking and running
//! tasks (and rotating its document, at a small threshold here).
//!
//! The fixture (`tests/fixtures/datadir-<commit>.tar.gz`, with a manifest) was written by
//! `tests/fixtures/make_release_datadir.sh` with that commit's release build: one node, one
//! queue, 3,000 `sha256` tasks submitted in batches of 1,000 and run to success.

mod support;

use std::path::Path;

use piecework::node::{Config, Node, api};
use piecework::queue_doc::{QueueId, TaskId, TaskState};
use serde::Deserialize;
use sha2::Digest as _;
use support::{GENEROUS, poll};

#[derive(Deserialize)]
struct Manifest {
    commit: String,
    queue: String,
    tasks: usize,
}

const FIXTURE: &str = "cc8384a";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_directory_of_the_previous_release_opens_with_every_task() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let manifest: Manifest = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join(format!("datadir-{FIXTURE}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest.commit, FIXTURE);
    let tmp = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(fixtures.join(format!("datadir-{FIXTURE}.tar.gz")))
        .arg("-C")
        .arg(tmp.path())
        .status()
        .expect("tar runs");
    assert!(status.success(), "the fixture unpacks");
    let ids: Vec<TaskId> = std::fs::read_to_string(tmp.path().join("ids.txt"))
        .unwrap()
        .lines()
        .map(TaskId::new)
        .collect();
    assert_eq!(ids.len(), manifest.tasks);

    let mut config = Config::new(tmp.path().join("node"), piecework::kinds::builtin());
    config.workers = 2;
    // Small enough that the reopened document rotates again under this release.
    config.rotation = Some((2, 20));
    let node = Node::start(config)
        .await
        .expect("the earlier release's directory opens");
    let h = node.handle().clone();
    let queue = QueueId::new(&manifest.queue);

    // The queue is reopened by itself, with every task counted.
    let total = poll("the queue to reopen with every task", || {
        let h = h.clone();
        let queue = queue.clone();
        async move {
            let status = h.status().await.map_err(|e| e.to_string())?;
            let q = status
                .queues
                .iter()
                .find(|q| q.id == queue)
                .ok_or("the queue is not open yet")?;
            match q.tasks.succeeded {
                n if n == manifest.tasks => Ok(q.tasks.clone()),
                n => Err(format!("{n} succeeded: {:?}", q.tasks)),
            }
        }
    })
    .await;
    assert_eq!(total.failed + total.pending + total.running, 0, "{total:?}");

    // Every task answers, with the result of its input (the line number, hashed once).
    for (i, id) in ids.iter().enumerate() {
        let s = h
            .task_status(id)
            .await
            .unwrap_or_else(|e| panic!("task {i} {id}: {e}"));
        assert_eq!(s.state, TaskState::Succeeded, "task {i} {id}");
        let want = hex::encode(sha2::Sha256::digest(i.to_string().as_bytes()));
        assert_eq!(
            s.result.as_ref().and_then(|r| r.as_str()),
            Some(want.as_str()),
            "task {i} {id}: {s:?}"
        );
    }

    // New work goes on, in epochs this release writes.
    let (epoch_before, _) = h.queue_document(&queue).await.unwrap();
    let reqs: Vec<api::SubmitTask> = (0..100)
        .map(|i| api::SubmitTask {
            kind: "sha256".into(),
            input: serde_json::json!({ "data": format!("new {i}"), "rounds": 1 }),
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
        })
        .collect();
    let entries = h.submit_many(&queue, reqs).await.expect("a batch submit");
    for e in &entries {
        let id = match e {
            api::BatchEntry::Submitted { task_id, .. } => task_id,
            other => panic!("refused: {other:?}"),
        };
        let s = h
            .wait_task(id, GENEROUS)
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(s.state, TaskState::Succeeded, "{id}");
    }
    poll("the new tasks to be counted", || {
        let h = h.clone();
        let queue = queue.clone();
        async move {
            let status = h.status().await.map_err(|e| e.to_string())?;
            let q = status.queues.iter().find(|q| q.id == queue).unwrap();
            match q.tasks.succeeded {
                n if n == manifest.tasks + 100 => Ok(()),
                n => Err(format!("{n} succeeded")),
            }
        }
    })
    .await;
    let (epoch_after, _) = h.queue_document(&queue).await.unwrap();
    assert!(
        epoch_after > epoch_before,
        "100 tasks at a threshold of 20 rotate the reopened document: epoch {epoch_before} → {epoch_after}"
    );
    drop(node);
}
