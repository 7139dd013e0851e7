//! A requeue and an undo of tasks that left the live queue document, once the node no longer
//! holds their ends in memory: after a restart (memory forgotten) and with one end kept in
//! memory at most, the ends come back from the node's store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use piecework_node::{Config, api, spawn_isolated};
use piecework_queue_doc::{TaskId, TaskState};
use piecework_worker_pool::{Context, FollowUp, HandlerError, Registry};

const WAIT: Duration = Duration::from_secs(60);

fn config(dir: &std::path::Path, failing: Arc<AtomicBool>) -> Config {
    let mut r = Registry::new();
    r.register(
        "noop",
        |_ctx: Context, input: serde_json::Value| async move { Ok::<_, HandlerError>(input) },
    );
    r.register("flaky", move |_ctx: Context, input: serde_json::Value| {
        let failing = failing.load(Ordering::SeqCst);
        async move {
            if failing {
                Err(HandlerError::new("down"))
            } else {
                Ok(input)
            }
        }
    });
    r.register(
        "undoable",
        |ctx: Context, input: serde_json::Value| async move {
            ctx.undo(FollowUp::new(
                "noop",
                serde_json::json!({ "undoes": input }),
            ))?;
            Ok::<_, HandlerError>(input)
        },
    );
    let mut config = Config::new(dir.to_owned(), r);
    config.workers = 1;
    // Rotate as soon as finished tasks outnumber live ones, and keep one end in memory.
    config.rotation = Some((1, 1));
    config.recent_ends = Some(1);
    config
}

fn task(kind: &str, i: usize, attempts: Option<u32>) -> api::SubmitTask {
    let mut t = api::SubmitTask::new(kind, serde_json::json!({ "i": i }));
    t.max_attempts = attempts;
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_successes_left_behind_are_requeued_and_undone_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let failing = Arc::new(AtomicBool::new(true));
    let node = spawn_isolated(config(dir.path(), failing.clone()), 1)
        .await
        .unwrap();
    let h = node.handle().clone();
    let queue = h.create_queue("left", None).await.unwrap();
    // Two dead letters (one with a document of its own) and a success with an undo task.
    let mut dead = Vec::new();
    for i in 0..2 {
        let mut t = task("flaky", i, Some(1));
        if i == 0 {
            t.input = serde_json::json!({ "pad": "x".repeat(4096) });
        }
        dead.push(h.submit(&queue, t).await.unwrap().task_id);
    }
    let done = h
        .submit(&queue, task("undoable", 9, None))
        .await
        .unwrap()
        .task_id;
    for id in &dead {
        let s = h.wait_task(id, WAIT).await.unwrap();
        assert_eq!(s.state, TaskState::Failed, "{s:?}");
    }
    assert_eq!(
        h.wait_task(&done, WAIT).await.unwrap().state,
        TaskState::Succeeded
    );
    // More ends make the queue rotate past all three.
    let left: Vec<TaskId> = dead.iter().chain([&done]).cloned().collect();
    for i in 0..2 {
        let id = h
            .submit(&queue, task("noop", i, None))
            .await
            .unwrap()
            .task_id;
        h.wait_task(&id, WAIT).await.unwrap();
    }
    let mut rx = h.watch_queue(&queue).unwrap();
    tokio::time::timeout(
        WAIT,
        rx.wait_for(|v| v.epoch > 0 && left.iter().all(|id| v.task(id).is_none())),
    )
    .await
    .expect("the queue rotated past the tasks")
    .unwrap();
    drop(rx);
    drop(h);
    node.kill().wait().await;

    // A new life: nothing in memory, the ends on disk.
    failing.store(false, Ordering::SeqCst);
    let node = spawn_isolated(config(dir.path(), failing.clone()), 1)
        .await
        .unwrap();
    let h = node.handle().clone();
    let s = h.requeue_task(&dead[0]).await.unwrap();
    assert!(!s.state.is_final(), "requeued: {s:?}");
    let s = h.wait_task(&dead[0], WAIT).await.unwrap();
    assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
    assert_eq!(s.attempts.len(), 2, "its history kept: {s:?}");
    // The other, by the bulk form (it reads the queue's dead letters from the store).
    let ids = h.requeue_failed(&queue).await.unwrap();
    assert_eq!(ids, vec![dead[1].clone()]);
    let s = h.wait_task(&dead[1], WAIT).await.unwrap();
    assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
    // The success's undo task, made once however many times it is asked for.
    let undo = h.undo_task(&done).await.unwrap();
    assert_eq!(undo.len(), 1);
    let s = h.wait_task(&undo[0], WAIT).await.unwrap();
    assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
    assert_eq!(s.undoes.as_ref(), Some(&done));
    assert_eq!(h.undo_task(&done).await.unwrap(), undo);
    // A requeue of a task that did not fail is refused, from the store's record too.
    let e = h.requeue_task(&done).await.unwrap_err();
    assert!(e.to_string().contains("succeeded"), "{e}");
    drop(h);
    node.kill().wait().await;
}
