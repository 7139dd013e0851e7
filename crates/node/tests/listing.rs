//! Listing a queue's tasks after their queue document no longer holds them: tasks that ended
//! and were left behind by rotations are listed from this node's store, by state and page by
//! page, across a restart (which forgets the node's recent ends in memory).

use std::time::Duration;

use piecework_node::{Config, api, spawn_isolated};
use piecework_queue_doc::{TaskId, TaskState};
use piecework_worker_pool::{Context, HandlerError, Registry};

const TASKS: usize = 5;

fn config(dir: &std::path::Path) -> Config {
    let mut r = Registry::new();
    r.register(
        "noop",
        |_ctx: Context, input: serde_json::Value| async move { Ok::<_, HandlerError>(input) },
    );
    let mut config = Config::new(dir.to_owned(), r);
    config.workers = 1;
    // Rotate as soon as finished tasks outnumber live ones.
    config.rotation = Some((1, 1));
    // And keep one task's end in memory: the others are listed from the store alone.
    config.recent_ends = Some(1);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_left_behind_by_rotations_are_listed_from_the_store_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = spawn_isolated(config(dir.path()), 1).await.unwrap();
    let h = node.handle().clone();
    let queue = h.create_queue("listed", None).await.unwrap();
    let mut ids: Vec<TaskId> = Vec::new();
    for i in 0..TASKS {
        let mut t = api::SubmitTask::new("noop", serde_json::json!({ "i": i }));
        // One with a document of its own, the others inline.
        if i == 0 {
            t.input = serde_json::json!({ "pad": "x".repeat(4096) });
        }
        ids.push(h.submit(&queue, t).await.unwrap().task_id);
    }
    for id in &ids {
        let s = h.wait_task(id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(s.state, TaskState::Succeeded, "{s:?}");
    }
    // One more task ends after them: the queue rotates and leaves them all behind.
    let last = h
        .submit(&queue, api::SubmitTask::new("noop", serde_json::json!(0)))
        .await
        .unwrap()
        .task_id;
    h.wait_task(&last, Duration::from_secs(60)).await.unwrap();
    let mut rx = h.watch_queue(&queue).unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        rx.wait_for(|v| v.epoch > 0 && ids.iter().all(|id| v.task(id).is_none())),
    )
    .await
    .expect("the queue rotated past the tasks")
    .unwrap();
    drop(rx);
    drop(h);
    // Its recent ends in memory die with it; the store keeps what it listed.
    node.kill().wait().await;

    let node = spawn_isolated(config(dir.path()), 1).await.unwrap();
    let h = node.handle().clone();
    let all = h
        .list_tasks(&queue, Some(TaskState::Succeeded), 100, None)
        .await
        .unwrap();
    let listed: Vec<String> = all
        .tasks
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    for id in &ids {
        assert!(listed.contains(&id.to_string()), "{id} listed: {listed:?}");
    }
    assert!(all.tasks.iter().all(|t| t["state"] == "succeeded"));
    assert!(all.tasks.iter().all(|t| t.get("runs").is_none()));
    assert_eq!(all.next_cursor, None);
    // Page by page, two at a time, every one once and in id order.
    let mut paged: Vec<String> = Vec::new();
    let mut cursor = None;
    loop {
        let page = h.list_tasks(&queue, None, 2, cursor).await.unwrap();
        paged.extend(
            page.tasks
                .iter()
                .map(|t| t["id"].as_str().unwrap().to_owned()),
        );
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    let mut sorted = paged.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(paged, sorted, "in id order, each once");
    assert!(paged.len() > TASKS, "{paged:?}");
    let failed = h
        .list_tasks(&queue, Some(TaskState::Failed), 100, None)
        .await
        .unwrap();
    assert!(failed.tasks.is_empty(), "{failed:?}");
    drop(node.kill());
}
