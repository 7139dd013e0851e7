//! `piecework queue create` with configuration flags, `resource list|add|withdraw` and
//! `node --resource`, `queue status`, `queue pause` and
//! `queue resume`, `queue config --set`, `task submit --max-attempts` and
//! `queue schedule|schedules|unschedule`, against node
//! processes: a queue paused through
//! one node is resumed through the other, and a configuration change made through one shows
//! on the other.
//!
//! Waits are on the HTTP API (its long-poll for outcomes, polls of the status under a
//! generous deadline); nothing sleeps a fixed time.

mod support;

use std::process::Command;

use piecework::client::Client;
use piecework::queue_doc::{Order, QueueId, TaskState};
use support::{BIN, cli, poll, spawn_node, wait_final};

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_is_configured_paused_and_resumed_from_the_cli_through_any_member() {
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_node(&dir.path().join("a"), None);
    let b = spawn_node(&dir.path().join("b"), Some(&a));
    let queue = cli(
        &a,
        &[
            "queue",
            "create",
            "configured",
            "--order",
            "lifo",
            "--concurrency",
            "2",
            "--rate-interval",
            "50ms",
            "--lease",
            "30s",
            "--max-attempts",
            "5",
        ],
    );
    let status = json(&cli(&a, &["queue", "status", &queue, "--json"]));
    let config = &status["config"];
    assert_eq!(config["order"], "lifo", "{status:#}");
    assert_eq!(config["concurrency"], 2, "{status:#}");
    assert_eq!(config["rate_interval_ms"], 50, "{status:#}");
    assert_eq!(config["lease_ms"], 30_000, "{status:#}");
    assert_eq!(config["max_attempts"], 5, "{status:#}");
    // b may configure the queue: an admin.
    let token = cli(
        &a,
        &[
            "queue", "invite", &queue, "--for", &b.peer, "--role", "admin",
        ],
    );
    cli(&b, &["queue", "join", &token]);

    // Paused through b: a task submitted through b after the pause never starts, as every
    // router reads the pause before the task.
    let paused = json(&cli(&b, &["queue", "pause", &queue, "--json"]));
    assert_eq!(paused["paused"], true, "{paused:#}");
    let task = cli(
        &b,
        &[
            "task",
            "submit",
            &queue,
            "--kind",
            "noop",
            "--max-attempts",
            "2",
        ],
    );
    let id = QueueId::new(queue.clone());
    let client_a = Client::new(&a.http).unwrap();
    poll("node a to see the pause and the task", || {
        let (c, id) = (client_a.clone(), id.clone());
        async move {
            let q = c.queue_status(&id).await.map_err(|e| e.to_string())?;
            if q.paused && q.tasks.pending == 1 {
                Ok(())
            } else {
                Err(format!("{q:?}"))
            }
        }
    })
    .await;
    let human = cli(&a, &["queue", "status", &queue]);
    assert!(human.contains("paused"), "{human}");
    assert!(human.contains("1 pending"), "{human}");

    // Resumed through a: the task runs.
    let resumed = json(&cli(&a, &["queue", "resume", &queue, "--json"]));
    assert_eq!(resumed["paused"], false, "{resumed:#}");
    let all = [a.http.clone(), b.http.clone()];
    let s = wait_final(&all, &a.http, &piecework::queue_doc::TaskId::new(task)).await;
    assert_eq!(s.state, TaskState::Succeeded, "{s:#?}");
    assert_eq!(
        s.max_attempts,
        Some(2),
        "--max-attempts is the task's: {s:#?}"
    );

    // A configuration change through a shows on b; an invalid one is refused with the reason.
    let config = json(&cli(
        &a,
        &[
            "queue",
            "config",
            &queue,
            "--set",
            "order=fifo",
            "--set",
            "concurrency=4",
            "--set",
            "rate_interval=0s",
            "--json",
        ],
    ));
    assert_eq!(config["order"], "fifo", "{config:#}");
    assert_eq!(config["concurrency"], 4, "{config:#}");
    assert_eq!(config["rate_interval_ms"], 0, "{config:#}");
    let client_b = Client::new(&b.http).unwrap();
    poll("node b to see the configuration change", || {
        let (c, id) = (client_b.clone(), id.clone());
        async move {
            let q = c.queue_status(&id).await.map_err(|e| e.to_string())?;
            if q.config.order == Order::Fifo && q.config.concurrency == 4 {
                Ok(())
            } else {
                Err(format!("{:?}", q.config))
            }
        }
    })
    .await;
    let refused = |set: &str| {
        let out = Command::new(BIN)
            .args(["--node", &b.http, "queue", "config", &queue, "--set", set])
            .output()
            .expect("the binary runs");
        assert!(!out.status.success(), "--set {set} must fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused("lease=1ms");
    assert!(
        stderr.contains("lease_ms (1) must be at least twice"),
        "{stderr}"
    );
    let stderr = refused("colour=blue");
    assert!(stderr.contains("not a configuration field"), "{stderr}");
    let shown = cli(&b, &["queue", "config", &queue]);
    assert!(shown.contains("order fifo, concurrency 4"), "{shown}");
}

/// `task submit --tag --depends-on --delay --dedup-key --idempotency-key` and `queue boost`,
/// against a node process: a boosted tag runs first, a dependent waits blocked for its
/// dependency, a delayed task stays blocked, a re-submitted dedup key adds no task, and a
/// retried idempotency key answers the first task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduling_flags_order_hold_back_and_dedup_tasks_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_node(&dir.path().join("a"), None);
    let queue = cli(&a, &["queue", "create", "sched", "--concurrency", "1"]);
    cli(&a, &["queue", "pause", &queue]);
    let submit = |extra: &[&str]| {
        let mut args = vec!["task", "submit", queue.as_str(), "--kind", "noop"];
        args.extend_from_slice(extra);
        cli(&a, &args)
    };
    let plain = submit(&[]);
    let vip = submit(&["--tag", "vip"]);
    let dependent = submit(&["--depends-on", &vip]);
    let delayed = submit(&["--delay", "1h"]);
    let first = submit(&["--dedup-key", "download/1"]);
    let again = json(&cli(
        &a,
        &[
            "task",
            "submit",
            &queue,
            "--kind",
            "noop",
            "--dedup-key",
            "download/1",
            "--json",
        ],
    ));
    assert_eq!(again["task_id"], first.as_str(), "{again:#}");
    assert_eq!(again["deduplicated"], true, "{again:#}");
    let once = submit(&["--idempotency-key", "order-1"]);
    assert_eq!(submit(&["--idempotency-key", "order-1"]), once, "a retry");
    let boosted = json(&cli(&a, &["queue", "boost", &queue, "vip", "2", "--json"]));
    assert_eq!(boosted["boosts"]["vip"], 2, "{boosted:#}");
    let status = |t: &str| json(&cli(&a, &["task", "status", t, "--json"]));
    assert_eq!(status(&vip)["effective_priority"], 400_000);
    let d = status(&dependent);
    assert_eq!(d["state"], "blocked", "{d:#}");
    assert_eq!(d["blocked_on"]["reason"], "paused", "{d:#}");
    cli(&a, &["queue", "resume", &queue]);
    let all = [a.http.clone()];
    for t in [&plain, &vip, &dependent, &first, &once] {
        let s = wait_final(&all, &a.http, &piecework::queue_doc::TaskId::new(t)).await;
        assert_eq!(s.state, TaskState::Succeeded, "{s:#?}");
    }
    let started = |t: &str| status(t)["runs"][0]["started_at"].as_u64().unwrap();
    assert!(
        started(&vip) <= started(&plain),
        "the boosted tag goes first"
    );
    assert!(
        started(&vip) <= started(&dependent),
        "the dependency goes first"
    );
    let d = status(&delayed);
    assert_eq!(d["state"], "blocked", "{d:#}");
    assert_eq!(d["blocked_on"]["reason"], "not_before", "{d:#}");
    let human = cli(&a, &["task", "status", &delayed]);
    assert!(human.contains("blocked on"), "{human}");
    // The listing: by state, and all of them across pages of one.
    let blocked = cli(&a, &["task", "list", &queue, "--state", "blocked"]);
    assert_eq!(blocked, format!("{delayed}\tblocked\tnoop"), "{blocked}");
    let all = json(&cli(&a, &["task", "list", &queue, "--json"]));
    assert_eq!(all.as_array().map(Vec::len), Some(6), "{all:#}");
    let client = Client::new(&a.http).unwrap();
    let id = QueueId::new(queue.clone());
    let mut cursor = None;
    let mut paged = 0;
    loop {
        let page = client
            .list_tasks(&id, None, 1, cursor.as_ref())
            .await
            .unwrap();
        paged += page.tasks.len();
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, 6, "pages of one");
}

/// Kinds and resources from the CLI, across two node processes: `b` starts with
/// `--resource online`; a task that requires it runs on `b` only; a task that requires a
/// resource nobody holds shows `blocked_on` it until `resource add` on `a`, then runs there; a
/// withdrawal with a restore time lists its `restore_at`; and a task of a kind no node runs
/// shows `blocked_on` its kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_route_tasks_and_change_at_run_time_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_node(&dir.path().join("a"), None);
    let mut opts = support::NodeOptions::loopback(&dir.path().join("b"));
    opts.bootstrap = vec![a.listen.clone()];
    opts.extra = vec!["--resource".into(), "online".into()];
    let b = support::spawn(&opts);
    let queue = cli(&a, &["queue", "create", "resourced"]);
    let token = cli(&a, &["queue", "invite", &queue, "--for", &b.peer]);
    cli(&b, &["queue", "join", &token]);
    let b_peer = json(&cli(&b, &["status", "--json"]))["peer_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = json(&cli(&b, &["resource", "list", "--json"]));
    assert_eq!(listed["resources"][0]["name"], "online", "{listed:#}");
    assert_eq!(listed["resources"][0]["held"], true, "{listed:#}");

    let submit = |extra: &[&str]| {
        let mut args = vec!["task", "submit", queue.as_str(), "--kind", "noop"];
        args.extend_from_slice(extra);
        cli(&a, &args)
    };
    let online = submit(&["--requires", "online"]);
    let gpu = submit(&["--requires", "gpu"]);
    let all = [a.http.clone(), b.http.clone()];
    let s = wait_final(&all, &a.http, &piecework::queue_doc::TaskId::new(&online)).await;
    assert_eq!(s.state, TaskState::Succeeded, "{s:#?}");
    assert_eq!(
        s.runs[0].worker.peer.as_str(),
        b_peer,
        "ran where the resource is"
    );
    let status = |t: &str| json(&cli(&a, &["task", "status", t, "--json"]));
    let g = status(&gpu);
    assert_eq!(g["state"], "blocked", "{g:#}");
    assert_eq!(g["blocked_on"]["reason"], "resource", "{g:#}");
    assert_eq!(g["blocked_on"]["resources"][0], "gpu", "{g:#}");
    assert_eq!(g["requires"][0], "gpu", "{g:#}");

    let added = json(&cli(&a, &["resource", "add", "gpu", "--json"]));
    assert_eq!(added["resources"][0]["name"], "gpu", "{added:#}");
    let s = wait_final(&all, &a.http, &piecework::queue_doc::TaskId::new(&gpu)).await;
    assert_eq!(s.state, TaskState::Succeeded, "{s:#?}");

    let withdrawn = json(&cli(
        &b,
        &[
            "resource",
            "withdraw",
            "online",
            "--restore-after",
            "1h",
            "--json",
        ],
    ));
    assert_eq!(withdrawn["resources"][0]["held"], false, "{withdrawn:#}");
    assert!(
        withdrawn["resources"][0]["restore_at"].is_u64(),
        "{withdrawn:#}"
    );
    let human = cli(&b, &["resource", "list"]);
    assert!(human.starts_with("online: withdrawn, back at "), "{human}");

    let other = cli(
        &a,
        &["task", "submit", &queue, "--kind", "nobody-runs-this"],
    );
    let o = status(&other);
    assert_eq!(o["state"], "blocked", "{o:#}");
    assert_eq!(
        o["blocked_on"],
        serde_json::json!({"reason": "kind", "kind": "nobody-runs-this"})
    );
}

/// `queue schedule` writes a schedule whose slots the active router fires, one task each with
/// dedup key `schedule/<name>/<slot>`; `queue schedules` shows its last slot; a bad cron
/// expression is refused with the parser's reason; `queue unschedule` deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_one_task_per_slot_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_node(&dir.path().join("a"), None);
    let queue = cli(&a, &["queue", "create", "scheduled"]);
    let written = json(&cli(
        &a,
        &[
            "queue",
            "schedule",
            &queue,
            "tick",
            "--every",
            "200ms",
            "--kind",
            "noop",
            "--input",
            r#"{"n":1}"#,
            "--json",
        ],
    ));
    assert_eq!(written["every_ms"], 200, "{written:#}");
    assert_eq!(written["task"]["kind"], "noop", "{written:#}");

    let bad = Command::new(BIN)
        .args(["--node", &a.http, "queue", "schedule", &queue, "bad"])
        .args(["--cron", "61 * * * *", "--kind", "noop"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("invalid cron expression"), "{err}");

    let client = Client::new(&a.http).unwrap();
    let q = QueueId::new(&queue);
    let fired = poll("three slots to fire and succeed", || {
        let client = client.clone();
        let q = q.clone();
        async move {
            let list = client
                .list_tasks(&q, Some("succeeded"), 100, None)
                .await
                .map_err(|e| e.to_string())?;
            match list.tasks.len() >= 3 {
                true => Ok(list.tasks),
                false => Err(format!("{} succeeded", list.tasks.len())),
            }
        }
    })
    .await;
    let mut slots: Vec<u64> = fired
        .iter()
        .map(|t| {
            let key = t["dedup_key"].as_str().expect("a slot's dedup key");
            key.strip_prefix("schedule/tick/").unwrap().parse().unwrap()
        })
        .collect();
    slots.sort();
    assert!(slots.iter().all(|s| s % 200 == 0), "{slots:?}");
    assert!(
        slots.windows(2).all(|w| w[0] < w[1]),
        "one task per slot: {slots:?}"
    );

    let listed = json(&cli(&a, &["queue", "schedules", &queue, "--json"]));
    let s = &listed["schedules"][0];
    assert!(
        s["last_slot"].as_u64().unwrap() >= *slots.last().unwrap(),
        "{listed:#}"
    );
    assert!(s["next_fire_at"].as_u64().unwrap() > s["last_slot"].as_u64().unwrap());
    let human = cli(&a, &["queue", "schedules", &queue]);
    assert!(human.starts_with("tick: every 200ms, kind noop"), "{human}");

    let left = json(&cli(&a, &["queue", "unschedule", &queue, "tick", "--json"]));
    assert_eq!(left["schedules"], serde_json::json!([]), "{left:#}");
}

/// `piecework events --queue Q --json --count 4` prints a task's life as JSON lines, once it
/// says it follows the node; `task undo` prints the undo tasks (none for a `noop`), and
/// answers an error for a task that did not succeed or that nobody has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_undo_from_the_cli() {
    use std::io::{BufRead, BufReader, Read};
    let dir = tempfile::tempdir().unwrap();
    let a = spawn_node(&dir.path().join("a"), None);
    let queue = cli(&a, &["queue", "create", "lives"]);
    let mut events = Command::new(BIN)
        .args(["--node", &a.http, "events", "--queue", &queue, "--json"])
        .args(["--count", "4"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // It says so once the node answered: a submit after that is followed.
    let mut said = String::new();
    BufReader::new(events.stderr.take().unwrap())
        .read_line(&mut said)
        .unwrap();
    assert!(said.starts_with("following the events of "), "{said}");
    let task = cli(&a, &["task", "submit", &queue, "--kind", "noop"]);
    let done = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        events
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        (events.wait().unwrap(), out)
    });
    let (status, out) = tokio::time::timeout(support::GENEROUS, done)
        .await
        .expect("four events come")
        .unwrap();
    assert!(status.success(), "{out}");
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    let names: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["submitted", "assigned", "started", "succeeded"],
        "{out}"
    );
    for l in &lines {
        assert_eq!(l["task"], task.as_str(), "{l}");
        assert_eq!(l["queue"], queue.as_str(), "{l}");
        assert!(l["id"].is_u64() && l["at"].is_u64(), "{l}");
    }

    // A noop records no undo task: an empty list.
    let undone = json(&cli(&a, &["task", "undo", &task, "--json"]));
    assert_eq!(undone, serde_json::json!({ "task_ids": [] }));
    let failing = cli(
        &a,
        &[
            "task",
            "submit",
            &queue,
            "--kind",
            "fail",
            "--input",
            r#"{"times": 5}"#,
            "--max-attempts",
            "1",
        ],
    );
    let all = [a.http.clone()];
    let s = wait_final(&all, &a.http, &piecework::queue_doc::TaskId::new(&failing)).await;
    assert_eq!(s.state, TaskState::Failed, "{s:#?}");
    let refused = Command::new(BIN)
        .args(["--node", &a.http, "task", "undo", &failing])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("only a succeeded task can be undone"), "{err}");
}
