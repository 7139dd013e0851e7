//! `piecework task submit QUEUE --file tasks.jsonl` against a node process: every line is
//! answered by its line number, the valid ones are submitted and run, and the run fails (after
//! answering) when a line was refused.
//!
//! Waits are on the HTTP API's long-poll for each task's outcome; nothing sleeps.

mod support;

use std::process::Command;

use piecework::queue_doc::{TaskId, TaskState};
use support::{BIN, cli, spawn_node, wait_final};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_file_is_submitted_in_one_batch_and_bad_lines_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let node = spawn_node(&dir.path().join("a"), None);
    let queue = cli(&node, &["queue", "create", "batch"]);
    let file = dir.path().join("tasks.jsonl");
    std::fs::write(
        &file,
        [
            r#"{"kind": "sha256", "input": {"data": "one", "rounds": 10}}"#,
            r#"{"kind": "noop", "priority": 7}"#,
            "",
            r#"{"kind": "sha256", "input": {"data": "two"#,
            r#"{"input": 3}"#,
            r#"{"kind": "noop", "urgent": true}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--node", &node.http, "task", "submit", &queue, "--file"])
        .arg(&file)
        .arg("--json")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused lines must fail the run");
    assert!(
        stderr.contains("2 of 5 lines were not submitted"),
        "{stderr}"
    );
    let answers: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let lines: Vec<u64> = answers
        .iter()
        .map(|a| a["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, [1, 2, 4, 5, 6], "{answers:#?}");
    let ids: Vec<TaskId> = answers
        .iter()
        .filter_map(|a| a["task_id"].as_str().map(TaskId::new))
        .collect();
    assert_eq!(ids.len(), 3, "{answers:#?}");
    let error = |line: u64| {
        answers
            .iter()
            .find(|a| a["line"] == line)
            .and_then(|a| a["error"].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(error(4).starts_with("not JSON"), "{answers:#?}");
    assert!(error(5).contains("missing field `kind`"), "{answers:#?}");
    let all = [node.http.clone()];
    for id in &ids {
        let s = wait_final(&all, &node.http, id).await;
        assert_eq!(s.state, TaskState::Succeeded, "{s:#?}");
    }

    // A file of valid lines succeeds and prints `<line>\t<task id>` per line.
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, "{\"kind\": \"noop\"}\n{\"kind\": \"noop\"}\n").unwrap();
    let printed = cli(
        &node,
        &["task", "submit", &queue, "--file", good.to_str().unwrap()],
    );
    let rows: Vec<&str> = printed.lines().collect();
    assert_eq!(rows.len(), 2, "{printed}");
    assert!(rows[0].starts_with("1\tautomerge:"), "{printed}");
    assert!(rows[1].starts_with("2\tautomerge:"), "{printed}");
}
