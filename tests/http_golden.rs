//! Golden tests of the HTTP API (`piecework_node::http`): every route's success and error
//! answers, status code and JSON, against files under `tests/golden/http/`.
//!
//! One in-process node (one worker, the built-in kinds plus `block`, a handler that runs until
//! it is cancelled) serves the API on an ephemeral loopback port. [`steps`] lists the requests
//! in order, with *settle* steps in between that wait (on the node's handle, polling under a
//! generous deadline; nothing sleeps) until the node reaches a known state, so that every
//! answer is deterministic once volatile values are normalised:
//!
//! - ids become named placeholders: `<peer>`, `<addr>` (the node's listen address),
//!   `<queue:NAME>` and `<task:NAME>` (captured from the answers that created them) and
//!   `<unknown-id>` (a well-formed document id nobody has);
//! - numbers under time keys (`*_at`, `at`) become `"<ms>"`, incarnations `"<incarnation>"`,
//!   `documents_loaded` and the values of `internals` `"<count>"` (eviction runs on a timer);
//! - durations inside strings (`50ms`, `1.2s`) become `<duration>`.
//!
//! Everything else (field names, nesting, types, status codes, messages) must match exactly.
//! Run with `PIECEWORK_BLESS=1` to rewrite the golden files from the current answers.

mod support;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use piecework::node::{Config, Node, NodeHandle};
use piecework::queue_doc::{QueueId, TaskId, TaskState};
use piecework::worker_pool::{Context, FollowUp, HandlerError, Progress};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use support::{GENEROUS, poll};

/// Set to `1` to rewrite the golden files instead of comparing.
const BLESS_VAR: &str = "PIECEWORK_BLESS";

/// A well-formed (base58check, 16 bytes) document id that no node has.
const UNKNOWN_ID: &str = "automerge:pEbmSWqJdBuPadRGm8tDZXgWR6";

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/http")
}

// ----- the cases -----

/// Every request of the test, in order. Add cases here; a case's name is its golden file's
/// name, so it must be unique. Paths and JSON bodies may use placeholders known at that point
/// (`<queue:main>`, `<task:hashed>`, …; see [`Case::capture`]).
///
/// The order matters where an answer shows the node's state (status, join, task status):
/// the settle steps before such a case make that state deterministic. With one worker, held by
/// the `block` task from the `Running` settle on, every task submitted later stays pending.
fn steps() -> Vec<Step> {
    vec![
        // Slow (the node looks for a peer that has the queue until FIND_TIMEOUT), so it runs in
        // the background while the rest goes on.
        case(
            "join_unknown_queue",
            "joining by id a queue this node never joined: an invite is needed",
        )
        .post("/v1/queues/<unknown-id>/join")
        .background()
        .into(),
        // GET /v1/status
        case("status_fresh", "a node with no queue and an idle worker")
            .get("/v1/status")
            .into(),
        // POST /v1/queues
        case(
            "create_queue",
            "creating a queue with the default configuration",
        )
        .post("/v1/queues")
        .json(json!({ "name": "golden" }))
        .capture("queue_id", "<queue:main>")
        .into(),
        Step::Settle(Settle::RouterActive("<queue:main>")),
        case(
            "status_one_queue",
            "a node with one queue whose router is active",
        )
        .get("/v1/status")
        .into(),
        // POST /v1/queues/{id}/join
        case(
            "join_joined_queue",
            "joining a queue this node is already a member of",
        )
        .post("/v1/queues/<queue:main>/join")
        .into(),
        // GET /v1/queues/{id}/members
        case(
            "members",
            "the members of a queue this node created: itself, an admin",
        )
        .get("/v1/queues/<queue:main>/members")
        .into(),
        // POST /v1/queues/{id}/invites: the token is random, so only its errors are here
        // (tests/invites.rs uses tokens).
        case(
            "invite_for_with_expiry",
            "an invite for one peer with an expiry (a peer's invite never expires)",
        )
        .post("/v1/queues/<queue:main>/invites")
        .json(json!({ "for": "12D3KooWOther", "expires_ms": 60000 }))
        .into(),
        case(
            "invite_bad_role",
            "an invite with a role that does not exist",
        )
        .post("/v1/queues/<queue:main>/invites")
        .json(json!({ "role": "owner" }))
        .into(),
        case(
            "invite_unknown_queue",
            "an invite to a queue this node has not joined",
        )
        .post("/v1/queues/<unknown-id>/invites")
        .json(json!({}))
        .into(),
        // POST /v1/join
        case("join_bad_token", "joining with a token that is not one")
            .post("/v1/join")
            .json(json!({ "token": "automerge:not-a-token" }))
            .into(),
        // DELETE /v1/queues/{id}/members/{peer}
        case("remove_creator", "removing the queue's creator")
            .delete("/v1/queues/<queue:main>/members/<peer>")
            .into(),
        case(
            "remove_unknown_member",
            "removing a peer that is not a member",
        )
        .delete("/v1/queues/<queue:main>/members/12D3KooWOther")
        .into(),
        // POST /v1/queues/{id}/tasks
        case("submit", "submitting a task (alone, so not replicated)")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": "sha256", "input": { "data": "abc", "rounds": 1 } }))
            .capture("task_id", "<task:hashed>")
            .into(),
        Step::Settle(Settle::Finished("<task:hashed>")),
        // GET /v1/tasks/{id}
        case("task_succeeded", "a task that succeeded, with its result")
            .get("/v1/tasks/<task:hashed>")
            .into(),
        case(
            "submit_document_task",
            "submitting a task whose input is too large to be inline: it gets a task document",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({ "kind": "sha256", "input": { "data": "d".repeat(300), "rounds": 1 } }))
        .capture("task_id", "<task:document>")
        .into(),
        Step::Settle(Settle::Finished("<task:document>")),
        case(
            "task_document_succeeded",
            "a task with a task document that succeeded, with its result",
        )
        .get("/v1/tasks/<task:document>")
        .into(),
        // GET /v1/tasks/{id}/wait
        case(
            "wait_succeeded",
            "waiting on a task that has succeeded answers at once",
        )
        .get("/v1/tasks/<task:hashed>/wait?timeout_ms=60000")
        .into(),
        case("wait_default_timeout", "the timeout is optional")
            .get("/v1/tasks/<task:hashed>/wait")
            .into(),
        case(
            "submit_all_fields",
            "submitting with every field set (a `block` task: it holds the only worker)",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({
            "kind": "block",
            "input": { "why": "holds the only worker" },
            "priority": 5,
            "urgent": true,
            "max_attempts": 1,
        }))
        .capture("task_id", "<task:blocking>")
        .into(),
        Step::Settle(Settle::Running("<task:blocking>")),
        case(
            "submit_minimal",
            "submitting with only a kind (the worker is busy: stays pending)",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({ "kind": "noop" }))
        .capture("task_id", "<task:pending>")
        .into(),
        case("task_running", "a task running on this node's worker")
            .get("/v1/tasks/<task:blocking>")
            .into(),
        case("task_pending", "a task waiting for a worker")
            .get("/v1/tasks/<task:pending>")
            .into(),
        case(
            "status_busy",
            "a node whose worker runs a task, with one task pending",
        )
        .get("/v1/status")
        .into(),
        case("join_busy_queue", "the queue's counts after three submits")
            .post("/v1/queues/<queue:main>/join")
            .into(),
        case("wait_timeout", "a wait that ends before the task does")
            .get("/v1/tasks/<task:blocking>/wait?timeout_ms=50")
            .into(),
        case("wait_zero_timeout", "a wait of 0 ms on an unfinished task")
            .get("/v1/tasks/<task:pending>/wait?timeout_ms=0")
            .into(),
        // Errors of POST /v1/queues.
        case("create_queue_empty_name", "a queue needs a name")
            .post("/v1/queues")
            .json(json!({ "name": "" }))
            .into(),
        case("create_queue_blank_name", "a name of spaces is empty too")
            .post("/v1/queues")
            .json(json!({ "name": "   " }))
            .into(),
        case(
            "create_queue_missing_name",
            "a body without a name (axum's rejection)",
        )
        .post("/v1/queues")
        .json(json!({}))
        .into(),
        case(
            "create_queue_malformed_json",
            "a body that is not JSON (axum's rejection)",
        )
        .post("/v1/queues")
        .raw(Some("application/json"), "{\"name\": ")
        .into(),
        case(
            "create_queue_no_content_type",
            "a JSON body without a content type (axum's rejection)",
        )
        .post("/v1/queues")
        .raw(None, "{\"name\": \"golden\"}")
        .into(),
        case(
            "create_queue_invalid_config",
            "a configuration that cannot work",
        )
        .post("/v1/queues")
        .json(
            json!({ "name": "bad", "config": { "heartbeat_ms": 1000, "takeover_after_ms": 1500 } }),
        )
        .into(),
        case(
            "create_queue_config_wrong_type",
            "a configuration field of the wrong type (axum's rejection)",
        )
        .post("/v1/queues")
        .json(json!({ "name": "bad", "config": { "order": "random" } }))
        .into(),
        // Errors of POST /v1/queues/{id}/join (and `join_unknown_queue` above).
        case("join_bad_id", "an id that is not a document id")
            .post("/v1/queues/not-a-queue/join")
            .into(),
        case("join_task_id", "joining a task's document")
            .post("/v1/queues/<task:document>/join")
            .into(),
        // Errors of POST /v1/queues/{id}/tasks. Batch submits (a JSON array body) go here too:
        // `.json(json!([{ "kind": "noop" }, ...]))`; a successful one before `status_busy`
        // changes the counts that case and `join_busy_queue` record.
        case(
            "submit_not_joined",
            "submitting to a queue this node has not joined",
        )
        .post("/v1/queues/<unknown-id>/tasks")
        .json(json!({ "kind": "noop" }))
        .into(),
        case(
            "submit_bad_queue_id",
            "submitting to an id that is not a document id",
        )
        .post("/v1/queues/not-a-queue/tasks")
        .json(json!({ "kind": "noop" }))
        .into(),
        case("submit_empty_kind", "a task needs a kind")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": " " }))
            .into(),
        case("submit_priority_too_high", "priority above 99999")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": "noop", "priority": 100_000 }))
            .into(),
        case("submit_priority_too_low", "priority below -99999")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": "noop", "priority": -100_000 }))
            .into(),
        case("submit_zero_max_attempts", "a task allowed no attempt")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": "noop", "max_attempts": 0 }))
            .into(),
        case(
            "submit_max_attempts_too_high",
            "more attempts than a queue may allow",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({ "kind": "noop", "max_attempts": 1001 }))
        .into(),
        // Once crashed the node's core (`priority.abs()` overflowed).
        case("submit_priority_min", "the lowest i64 as a priority")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!({ "kind": "noop", "priority": i64::MIN }))
            .into(),
        case(
            "submit_object_not_task",
            "a JSON value that is neither a task nor an array",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!("noop"))
        .into(),
        // Batches (an array body). The tasks stay pending behind the blocking task.
        case(
            "submit_batch_mixed",
            "a batch: valid entries are submitted, each bad one is answered by its index",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!([
            { "kind": "noop" },
            { "kind": " " },
            { "input": 1 },
            { "kind": "noop", "priority": 100_000 },
            "not a task",
            { "kind": "sha256", "input": { "data": "x", "rounds": 1 }, "priority": -3 },
        ]))
        .into(),
        case("submit_batch_empty", "an empty batch")
            .post("/v1/queues/<queue:main>/tasks")
            .json(json!([]))
            .into(),
        case(
            "submit_batch_not_joined",
            "a batch to a queue this node has not joined",
        )
        .post("/v1/queues/<unknown-id>/tasks")
        .json(json!([{ "kind": "noop" }]))
        .into(),
        case(
            "submit_batch_too_many",
            "a batch over the 1,000-entry limit",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(Value::Array(vec![json!({ "kind": "noop" }); 1001]))
        .into(),
        case(
            "submit_missing_kind",
            "a body without a kind (axum's rejection)",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({ "input": 1 }))
        .into(),
        case(
            "submit_wrong_type",
            "a priority that is not an integer (axum's rejection)",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .json(json!({ "kind": "noop", "priority": "high" }))
        .into(),
        case(
            "submit_malformed_json",
            "a body that is not JSON (axum's rejection)",
        )
        .post("/v1/queues/<queue:main>/tasks")
        .raw(Some("application/json"), "[")
        .into(),
        // Errors of GET /v1/tasks/{id}.
        case("task_bad_id", "an id that is not a document id")
            .get("/v1/tasks/not-a-task")
            .into(),
        case("task_unknown", "a well-formed id nobody has")
            .get("/v1/tasks/<unknown-id>")
            .into(),
        case("task_queue_id", "a queue's id is not a task's")
            .get("/v1/tasks/<queue:main>")
            .into(),
        // Errors of GET /v1/tasks/{id}/wait.
        case("wait_bad_id", "an id that is not a document id")
            .get("/v1/tasks/not-a-task/wait?timeout_ms=10")
            .into(),
        case("wait_unknown", "a well-formed id nobody has")
            .get("/v1/tasks/<unknown-id>/wait?timeout_ms=10")
            .into(),
        case(
            "wait_bad_timeout",
            "a timeout that is not a number (axum's rejection)",
        )
        .get("/v1/tasks/<task:hashed>/wait?timeout_ms=soon")
        .into(),
        // Outside the routes.
        case("unknown_route", "a path no route serves")
            .get("/v1/nothing")
            .into(),
        case("wrong_method", "a route asked with the wrong method")
            .get("/v1/queues")
            .into(),
        // Last, as it adds a second queue to the node's status.
        case(
            "create_queue_with_config",
            "creating a queue with a configuration",
        )
        .post("/v1/queues")
        .json(json!({
            "name": "configured",
            "config": { "heartbeat_ms": 200, "takeover_after_ms": 1000, "order": "lifo" },
        }))
        .capture("queue_id", "<queue:configured>")
        .into(),
        Step::Settle(Settle::RouterActive("<queue:configured>")),
        // GET /v1/queues/{id}
        case("queue_status", "a joined queue's status")
            .get("/v1/queues/<queue:configured>")
            .into(),
        case("queue_status_unknown", "a queue this node has not joined")
            .get("/v1/queues/<unknown-id>")
            .into(),
        // POST /v1/queues/{id}/pause and /resume
        case("pause_queue", "pausing a queue's routing")
            .post("/v1/queues/<queue:configured>/pause")
            .into(),
        case("resume_queue", "resuming it")
            .post("/v1/queues/<queue:configured>/resume")
            .into(),
        case(
            "pause_unknown_queue",
            "pausing a queue this node has not joined",
        )
        .post("/v1/queues/<unknown-id>/pause")
        .into(),
        // PATCH /v1/queues/{id}/config
        case(
            "config_patch",
            "changing some fields of a queue's configuration; the others keep their values",
        )
        .patch("/v1/queues/<queue:configured>/config")
        .json(json!({ "concurrency": 3, "lease_ms": 20000, "order": "fifo" }))
        .into(),
        case(
            "config_patch_invalid",
            "a change that gives a configuration that cannot work: nothing is written",
        )
        .patch("/v1/queues/<queue:configured>/config")
        .json(json!({ "concurrency": 4, "lease_ms": 1 }))
        .into(),
        case(
            "config_patch_unknown_field",
            "a field the configuration does not have (axum's rejection)",
        )
        .patch("/v1/queues/<queue:configured>/config")
        .json(json!({ "colour": "blue" }))
        .into(),
        case(
            "config_patch_wrong_type",
            "a field of the wrong type (axum's rejection)",
        )
        .patch("/v1/queues/<queue:configured>/config")
        .json(json!({ "concurrency": "many" }))
        .into(),
        case(
            "config_patch_unknown_queue",
            "a queue this node has not joined",
        )
        .patch("/v1/queues/<unknown-id>/config")
        .json(json!({ "concurrency": 3 }))
        .into(),
        case(
            "queue_status_after_changes",
            "the queue after a pause, a resume and a configuration change",
        )
        .get("/v1/queues/<queue:configured>")
        .into(),
        // PUT and DELETE /v1/queues/{id}/boosts/{tag}
        case("boost_put", "boosting a priority tag")
            .put("/v1/queues/<queue:configured>/boosts/vip")
            .json(json!({ "boost": 3 }))
            .into(),
        case("boost_put_second", "boosting another tag, below zero")
            .put("/v1/queues/<queue:configured>/boosts/bulk")
            .json(json!({ "boost": -2 }))
            .into(),
        case("boost_out_of_range", "a boost outside [-1000000, 1000000]")
            .put("/v1/queues/<queue:configured>/boosts/vip")
            .json(json!({ "boost": 1_000_001 }))
            .into(),
        case("boost_bad_tag", "a tag with a character tags may not hold")
            .put("/v1/queues/<queue:configured>/boosts/a%20b")
            .json(json!({ "boost": 1 }))
            .into(),
        case("boost_missing_body", "no boost given (axum's rejection)")
            .put("/v1/queues/<queue:configured>/boosts/vip")
            .json(json!({}))
            .into(),
        case("boost_unknown_queue", "a queue this node has not joined")
            .put("/v1/queues/<unknown-id>/boosts/vip")
            .json(json!({ "boost": 1 }))
            .into(),
        case("boost_delete", "removing a tag's boost")
            .delete("/v1/queues/<queue:configured>/boosts/bulk")
            .into(),
        // PUT, GET and DELETE /v1/queues/{id}/schedules[/{name}] (slots a year apart: none
        // falls due while the test runs).
        case("schedule_put_every", "a schedule that fires every 365 days")
            .put("/v1/queues/<queue:configured>/schedules/yearly")
            .json(json!({
                "every_ms": 31_536_000_000u64,
                "task": { "kind": "noop", "input": { "n": 1 }, "tags": ["vip"] }
            }))
            .into(),
        case("schedule_put_cron", "a paused cron schedule, in UTC")
            .put("/v1/queues/<queue:configured>/schedules/new-year")
            .json(json!({ "cron": "0 0 1 1 *", "task": { "kind": "noop" }, "paused": true }))
            .into(),
        case("schedule_bad_cron", "a cron expression that does not parse")
            .put("/v1/queues/<queue:configured>/schedules/bad")
            .json(json!({ "cron": "61 * * * *", "task": { "kind": "noop" } }))
            .into(),
        case("schedule_both_timings", "every_ms and cron at once")
            .put("/v1/queues/<queue:configured>/schedules/bad")
            .json(json!({ "every_ms": 1000, "cron": "* * * * *", "task": { "kind": "noop" } }))
            .into(),
        case("schedule_no_timing", "neither every_ms nor cron")
            .put("/v1/queues/<queue:configured>/schedules/bad")
            .json(json!({ "task": { "kind": "noop" } }))
            .into(),
        case("schedule_interval_too_short", "every_ms below 100")
            .put("/v1/queues/<queue:configured>/schedules/bad")
            .json(json!({ "every_ms": 99, "task": { "kind": "noop" } }))
            .into(),
        case(
            "schedule_task_with_dependency",
            "a template that depends on a task",
        )
        .put("/v1/queues/<queue:configured>/schedules/bad")
        .json(
            json!({ "every_ms": 1000, "task": { "kind": "noop", "depends_on": ["automerge:x"] } }),
        )
        .into(),
        case(
            "schedule_bad_task",
            "a template with a priority out of range",
        )
        .put("/v1/queues/<queue:configured>/schedules/bad")
        .json(json!({ "every_ms": 1000, "task": { "kind": "noop", "priority": 100000 } }))
        .into(),
        case(
            "schedule_bad_name",
            "a name with a character names may not hold",
        )
        .put("/v1/queues/<queue:configured>/schedules/a%20b")
        .json(json!({ "every_ms": 1000, "task": { "kind": "noop" } }))
        .into(),
        case("schedule_unknown_queue", "a queue this node has not joined")
            .put("/v1/queues/<unknown-id>/schedules/yearly")
            .json(json!({ "every_ms": 1000, "task": { "kind": "noop" } }))
            .into(),
        case("schedules_list", "the queue's schedules")
            .get("/v1/queues/<queue:configured>/schedules")
            .into(),
        case("schedule_get", "one schedule")
            .get("/v1/queues/<queue:configured>/schedules/yearly")
            .into(),
        case("schedule_get_unknown", "a schedule the queue does not have")
            .get("/v1/queues/<queue:configured>/schedules/nope")
            .into(),
        case("schedule_delete", "deleting a schedule: the ones left")
            .delete("/v1/queues/<queue:configured>/schedules/new-year")
            .into(),
        case("schedule_delete_unknown", "deleting it again")
            .delete("/v1/queues/<queue:configured>/schedules/new-year")
            .into(),
        // The scheduling fields of a submit (the node's one worker is held by the `block`
        // task, so these stay pending or blocked).
        case("submit_tagged", "a task with priority tags")
            .post("/v1/queues/<queue:configured>/tasks")
            .json(json!({ "kind": "noop", "tags": ["vip", "bulk"], "priority": 7 }))
            .capture("task_id", "<task:tagged>")
            .into(),
        case(
            "submit_with_dependency",
            "a task that depends on another, delayed until a fixed time",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({
            "kind": "noop",
            "depends_on": ["<task:tagged>"],
            "not_before": "2999-01-01T00:00:00Z",
        }))
        .capture("task_id", "<task:dependent>")
        .into(),
        case("submit_delayed", "a task not routed before a fixed time")
            .post("/v1/queues/<queue:configured>/tasks")
            .json(json!({ "kind": "noop", "not_before": "2999-01-01T00:00:00Z" }))
            .capture("task_id", "<task:delayed>")
            .into(),
        case(
            "task_tagged",
            "a tagged task: its effective priority counts the boost",
        )
        .get("/v1/tasks/<task:tagged>")
        .into(),
        case(
            "task_blocked_on_dependency",
            "a task whose dependency has not succeeded: blocked",
        )
        .get("/v1/tasks/<task:dependent>")
        .into(),
        case(
            "task_blocked_not_before",
            "a task whose time has not come: blocked",
        )
        .get("/v1/tasks/<task:delayed>")
        .into(),
        case(
            "submit_unknown_dependency",
            "a dependency no task of the queue has",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "depends_on": ["<unknown-id>"] }))
        .into(),
        case(
            "submit_delay_and_not_before",
            "a delay and a not-before time at once",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "delay_ms": 1000, "not_before": "2999-01-01T00:00:00Z" }))
        .into(),
        case(
            "submit_bad_not_before",
            "a not-before time that is not RFC 3339",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "not_before": "tomorrow" }))
        .into(),
        case("submit_bad_tag", "a tag with a character tags may not hold")
            .post("/v1/queues/<queue:configured>/tasks")
            .json(json!({ "kind": "noop", "tags": ["no spaces"] }))
            .into(),
        case(
            "submit_dedup_first",
            "the first submit of a dedup key adds a task",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "dedup_key": "download/42" }))
        .capture("task_id", "<task:deduped>")
        .into(),
        case(
            "submit_dedup_again",
            "the key again while its task is pending: no task added, the same id, deduplicated",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "dedup_key": "download/42", "priority": 9 }))
        .into(),
        case(
            "task_deduplicated",
            "the task a dedup moved to the front, its priority raised to the submit's",
        )
        .get("/v1/tasks/<task:deduped>")
        .into(),
        case(
            "submit_idempotent_first",
            "a submit with an idempotency key adds a task",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "idempotency_key": "order-7" }))
        .capture("task_id", "<task:idempotent>")
        .into(),
        case(
            "submit_idempotent_retry",
            "its retry (a client that lost the answer) returns the same task and adds none",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "idempotency_key": "order-7" }))
        .into(),
        case("submit_dedup_key_too_long", "a dedup key over 256 bytes")
            .post("/v1/queues/<queue:configured>/tasks")
            .json(json!({ "kind": "noop", "dedup_key": "k".repeat(257) }))
            .into(),
        // GET /v1/queues/{id}/tasks
        case(
            "list_running",
            "a queue's running tasks: the `block` task, without its runs",
        )
        .get("/v1/queues/<queue:main>/tasks?state=running")
        .into(),
        case("list_cancelled_none", "a state no task of the queue is in")
            .get("/v1/queues/<queue:configured>/tasks?state=cancelled&limit=10")
            .into(),
        case("list_bad_state", "a state that does not exist")
            .get("/v1/queues/<queue:configured>/tasks?state=sleeping")
            .into(),
        case("list_unknown_queue", "a queue this node has not joined")
            .get("/v1/queues/<unknown-id>/tasks")
            .into(),
        case(
            "queue_status_with_boosts",
            "the queue with a boost, its tasks pending and blocked",
        )
        .get("/v1/queues/<queue:configured>")
        .into(),
        // GET /v1/resources, PUT and DELETE /v1/resources/{name}
        case("resources_none", "a node started without resources")
            .get("/v1/resources")
            .into(),
        case("resource_add", "holding a resource from now on")
            .put("/v1/resources/net")
            .into(),
        case(
            "resource_add_bad_name",
            "a name with a character names may not hold",
        )
        .put("/v1/resources/no%20spaces")
        .into(),
        case(
            "resource_withdraw_for_a_while",
            "withdrawing it for an hour: held again by itself then",
        )
        .delete("/v1/resources/net?restore_after_ms=3600000")
        .into(),
        case(
            "resource_withdraw_unknown",
            "a resource this node does not hold",
        )
        .delete("/v1/resources/gpu")
        .into(),
        case(
            "resource_withdraw_bad_query",
            "a restore time that is not a number",
        )
        .delete("/v1/resources/net?restore_after_ms=soon")
        .into(),
        case(
            "resource_withdraw_for_good",
            "withdrawing it until it is added again",
        )
        .delete("/v1/resources/net")
        .into(),
        // Kinds and resources on a submit, and tasks no pool can run.
        case(
            "submit_requires",
            "a task that requires a resource no pool holds",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "requires": ["gpu"] }))
        .capture("task_id", "<task:needs-gpu>")
        .into(),
        case(
            "submit_unknown_kind",
            "a task of a kind no pool has a handler for",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "nobody-runs-this" }))
        .capture("task_id", "<task:other-kind>")
        .into(),
        case(
            "submit_bad_resource",
            "a required resource with a character names may not hold",
        )
        .post("/v1/queues/<queue:configured>/tasks")
        .json(json!({ "kind": "noop", "requires": ["no spaces"] }))
        .into(),
        case(
            "task_blocked_on_resource",
            "no live pool holds the resource: blocked, naming it",
        )
        .get("/v1/tasks/<task:needs-gpu>")
        .into(),
        case(
            "task_blocked_on_kind",
            "no live pool runs the kind: blocked, naming it",
        )
        .get("/v1/tasks/<task:other-kind>")
        .into(),
    ]
}

/// One step of the test.
enum Step {
    /// Send a request and check its answer.
    Case(Case),
    /// Wait until the node reaches a state.
    Settle(Settle),
}

impl From<Case> for Step {
    fn from(c: Case) -> Step {
        Step::Case(c)
    }
}

/// A state to wait for before the next case; each names a placeholder.
enum Settle {
    /// The queue's router on this node is active.
    RouterActive(&'static str),
    /// The task succeeded, its runs ended (per its document) and no worker runs anything.
    Finished(&'static str),
    /// The task runs on a worker, per its queue entry, its document and the pool.
    Running(&'static str),
    /// The queue's document was rotated, the task is no longer in its current epoch and reads
    /// in this state, every task is final and no worker runs anything.
    Rotated(&'static str, &'static str, TaskState),
    /// The task ended in this state, every attempt of it ended, and no worker runs anything.
    Ended(&'static str, TaskState),
}

/// A request body.
enum Body {
    None,
    Json(Value),
    /// Sent as is, with this content type if any.
    Raw(Option<&'static str>, &'static str),
}

/// One request and what to keep from its answer.
struct Case {
    name: &'static str,
    about: &'static str,
    method: &'static str,
    path: &'static str,
    body: Body,
    /// Record this string field of the answer under this placeholder.
    capture: Option<(&'static str, &'static str)>,
    /// Send it now but collect its answer at the end (for slow answers).
    background: bool,
}

fn case(name: &'static str, about: &'static str) -> Case {
    Case {
        name,
        about,
        method: "GET",
        path: "",
        body: Body::None,
        capture: None,
        background: false,
    }
}

impl Case {
    fn get(mut self, path: &'static str) -> Self {
        self.method = "GET";
        self.path = path;
        self
    }

    fn post(mut self, path: &'static str) -> Self {
        self.method = "POST";
        self.path = path;
        self
    }

    fn patch(mut self, path: &'static str) -> Self {
        self.method = "PATCH";
        self.path = path;
        self
    }

    fn put(mut self, path: &'static str) -> Self {
        self.method = "PUT";
        self.path = path;
        self
    }

    fn delete(mut self, path: &'static str) -> Self {
        self.method = "DELETE";
        self.path = path;
        self
    }

    fn json(mut self, body: Value) -> Self {
        self.body = Body::Json(body);
        self
    }

    fn raw(mut self, content_type: Option<&'static str>, body: &'static str) -> Self {
        self.body = Body::Raw(content_type, body);
        self
    }

    fn capture(mut self, field: &'static str, placeholder: &'static str) -> Self {
        self.capture = Some((field, placeholder));
        self
    }

    fn background(mut self) -> Self {
        self.background = true;
        self
    }
}

// ----- the golden files -----

/// A golden file: one request and its normalised answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Golden {
    case: String,
    about: String,
    request: GoldenRequest,
    response: GoldenResponse,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GoldenRequest {
    method: String,
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    raw_body: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct GoldenResponse {
    status: u16,
    content_type: Option<String>,
    /// The answer, if it is JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
    /// The answer as text, if it is not JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// An answer as received.
struct Answer {
    status: u16,
    content_type: Option<String>,
    bytes: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.bytes).ok()
    }
}

// ----- running -----

struct Session {
    base: String,
    http: reqwest::Client,
    node: NodeHandle,
    /// Placeholders and the values they stand for.
    names: Vec<(String, String)>,
}

impl Session {
    fn value_of(&self, placeholder: &str) -> &str {
        self.names
            .iter()
            .find(|(p, _)| p == placeholder)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("{placeholder} is not known yet"))
    }

    /// Replaces every known placeholder in `s` by its value.
    fn fill(&self, s: &str) -> String {
        self.names
            .iter()
            .fold(s.to_owned(), |s, (p, v)| s.replace(p.as_str(), v))
    }

    fn fill_json(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.fill(s)),
            Value::Array(a) => Value::Array(a.iter().map(|v| self.fill_json(v)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), self.fill_json(v)))
                    .collect(),
            ),
            v => v.clone(),
        }
    }

    /// Sends the case's request in a task of its own.
    fn send(&self, case: &Case) -> tokio::task::JoinHandle<Answer> {
        let path = self.fill(case.path);
        assert!(
            !path.contains('<'),
            "{}: a placeholder in {path} is not known yet",
            case.name
        );
        let url = format!("{}{path}", self.base);
        let method = reqwest::Method::from_bytes(case.method.as_bytes()).expect("a method");
        let mut req = self.http.request(method, &url).timeout(GENEROUS);
        match &case.body {
            Body::None => {}
            Body::Json(v) => req = req.json(&self.fill_json(v)),
            Body::Raw(content_type, text) => {
                if let Some(ct) = content_type {
                    req = req.header(reqwest::header::CONTENT_TYPE, *ct);
                }
                req = req.body(self.fill(text));
            }
        }
        tokio::spawn(async move {
            let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
            let status = resp.status().as_u16();
            let content_type = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .map(|v| v.to_str().expect("an ASCII content type").to_owned());
            let bytes = resp.bytes().await.expect("the answer's body").to_vec();
            Answer {
                status,
                content_type,
                bytes,
            }
        })
    }

    fn capture(&mut self, case: &Case, answer: &Answer) {
        let Some((field, placeholder)) = case.capture else {
            return;
        };
        let value = answer
            .json()
            .as_ref()
            .and_then(|b| match field.starts_with('/') {
                true => b.pointer(field),
                false => b.get(field),
            })
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                panic!(
                    "{}: no string field {field:?} to capture as {placeholder} in the answer \
                     ({}): {}",
                    case.name,
                    answer.status,
                    String::from_utf8_lossy(&answer.bytes)
                )
            });
        self.names.push((placeholder.to_owned(), value));
    }

    async fn settle(&self, settle: &Settle) {
        let node = self.node.clone();
        match *settle {
            Settle::RouterActive(q) => {
                let id = QueueId::new(self.value_of(q));
                poll(&format!("{q}'s router to be active"), || {
                    let (node, id) = (node.clone(), id.clone());
                    async move {
                        let status = node.status().await.map_err(|e| e.to_string())?;
                        let q = status
                            .queues
                            .iter()
                            .find(|q| q.id == id)
                            .ok_or("the queue is not joined")?;
                        if q.role == "active" && q.router.is_some() {
                            Ok(())
                        } else {
                            Err(format!("role {}, router {:?}", q.role, q.router))
                        }
                    }
                })
                .await;
            }
            Settle::Finished(t) => {
                let id = TaskId::new(self.value_of(t));
                poll(&format!("{t} to succeed"), || {
                    let (node, id) = (node.clone(), id.clone());
                    async move {
                        let s = node
                            .wait_task(&id, GENEROUS)
                            .await
                            .map_err(|e| e.to_string())?;
                        if s.state != TaskState::Succeeded {
                            return Err(format!("state {:?}", s.state));
                        }
                        if s.runs.is_empty() || s.runs.iter().any(|r| r.end.is_none()) {
                            return Err(format!("runs not all ended: {:?}", s.runs));
                        }
                        let status = node.status().await.map_err(|e| e.to_string())?;
                        if status.workers.iter().any(|w| w.running.is_some()) {
                            return Err(format!("workers busy: {:?}", status.workers));
                        }
                        Ok(())
                    }
                })
                .await;
            }
            Settle::Running(t) => {
                let id = TaskId::new(self.value_of(t));
                poll(&format!("{t} to run"), || {
                    let (node, id) = (node.clone(), id.clone());
                    async move {
                        let s = node.task_status(&id).await.map_err(|e| e.to_string())?;
                        if s.state != TaskState::Running {
                            return Err(format!("state {:?}", s.state));
                        }
                        // A run's record is written when it ends: a running task shows its
                        // run through its started attempt.
                        if !s.runs.is_empty() || s.attempts.iter().any(|a| a.started.is_none()) {
                            return Err(format!("runs {:?}, attempts {:?}", s.runs, s.attempts));
                        }
                        let status = node.status().await.map_err(|e| e.to_string())?;
                        if !status
                            .workers
                            .iter()
                            .any(|w| w.running.as_ref().is_some_and(|r| r.task == id))
                        {
                            return Err(format!("no worker reports it: {:?}", status.workers));
                        }
                        Ok(())
                    }
                })
                .await;
            }
            Settle::Ended(t, state) => {
                let id = TaskId::new(self.value_of(t));
                poll(&format!("{t} to end {state:?}"), || {
                    let (node, id) = (node.clone(), id.clone());
                    async move {
                        let s = node.task_status(&id).await.map_err(|e| e.to_string())?;
                        if s.state != state || s.attempts.iter().any(|a| a.finished.is_none()) {
                            return Err(format!("state {:?}, attempts {:?}", s.state, s.attempts));
                        }
                        let status = node.status().await.map_err(|e| e.to_string())?;
                        if status.workers.iter().any(|w| w.running.is_some()) {
                            return Err(format!("workers busy: {:?}", status.workers));
                        }
                        Ok(())
                    }
                })
                .await;
            }
            Settle::Rotated(q, t, state) => {
                let (queue, task) = (
                    QueueId::new(self.value_of(q)),
                    TaskId::new(self.value_of(t)),
                );
                poll(&format!("{q} to rotate past {t}"), || {
                    let (node, queue, task) = (node.clone(), queue.clone(), task.clone());
                    async move {
                        let (epoch, _) = node
                            .queue_document(&queue)
                            .await
                            .map_err(|e| e.to_string())?;
                        let view = node
                            .watch_queue(&queue)
                            .ok_or("the queue is not joined")?
                            .borrow()
                            .clone();
                        if epoch == 0 || view.task(&task).is_some() {
                            return Err(format!("epoch {epoch}, the task still indexed"));
                        }
                        if let Some(t) = view.tasks().values().find(|t| !t.state().is_final()) {
                            return Err(format!("{} is {:?}", t.id, t.state()));
                        }
                        let s = node.task_status(&task).await.map_err(|e| e.to_string())?;
                        if s.state != state {
                            return Err(format!("{task} reads {:?}", s.state));
                        }
                        let status = node.status().await.map_err(|e| e.to_string())?;
                        if status.workers.iter().any(|w| w.running.is_some()) {
                            return Err(format!("workers busy: {:?}", status.workers));
                        }
                        Ok(())
                    }
                })
                .await;
            }
        }
    }

    /// The golden record of a case's answer, normalised.
    fn record(&self, case: &Case, answer: &Answer) -> Golden {
        let (content_type, body, raw_body) = match &case.body {
            Body::None => (None, None, None),
            Body::Json(v) => (None, Some(v.clone()), None),
            Body::Raw(ct, text) => (ct.map(str::to_owned), None, Some((*text).to_owned())),
        };
        let (body_out, text) = match answer.json() {
            Some(v) => (Some(self.normalise(None, v)), None),
            None => {
                let text = String::from_utf8_lossy(&answer.bytes);
                (None, Some(self.normalise_str(&text)))
            }
        };
        Golden {
            case: case.name.to_owned(),
            about: case.about.to_owned(),
            request: GoldenRequest {
                method: case.method.to_owned(),
                path: case.path.to_owned(),
                content_type,
                body,
                raw_body,
            },
            response: GoldenResponse {
                status: answer.status,
                content_type: answer.content_type.clone(),
                body: body_out,
                text,
            },
        }
    }

    /// Known values become their placeholders (longest first, so that an address is replaced
    /// before the peer id inside it); then durations become `<duration>`.
    fn normalise_str(&self, s: &str) -> String {
        let mut names: Vec<&(String, String)> = self.names.iter().collect();
        names.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        let s = names
            .iter()
            .fold(s.to_owned(), |s, (p, v)| s.replace(v.as_str(), p));
        normalise_durations(&s)
    }

    /// Normalises a JSON answer; `key` is the field `v` is the value of, if any.
    fn normalise(&self, key: Option<&str>, v: Value) -> Value {
        match v {
            Value::String(s) if key == Some("listen") => {
                let s = self.normalise_str(&s);
                Value::String(if s.starts_with('/') {
                    "<addr>".into()
                } else {
                    s
                })
            }
            Value::String(s) => {
                let s = self.normalise_str(&s);
                // Ids no case captured (a batch's new tasks).
                Value::String(if s.starts_with("automerge:") {
                    "<new-id>".into()
                } else {
                    s
                })
            }
            Value::Number(n) => match key.and_then(volatile_number) {
                Some(placeholder) => Value::String(placeholder.into()),
                None => Value::Number(n),
            },
            // Array elements keep their field's key, so that `listen: [...]` is normalised.
            Value::Array(a) => {
                Value::Array(a.into_iter().map(|v| self.normalise(key, v)).collect())
            }
            // The node's collection sizes: their names are the format, their values vary.
            Value::Object(o) if key == Some("internals") => Value::Object(
                o.into_iter()
                    .map(|(k, _)| (k, Value::String("<count>".into())))
                    .collect(),
            ),
            Value::Object(o) => Value::Object(
                o.into_iter()
                    .map(|(k, v)| {
                        let v = self.normalise(Some(&k), v);
                        (k, v)
                    })
                    .collect(),
            ),
            v => v,
        }
    }
}

/// The placeholder of a number under field `key`, if its value is volatile.
fn volatile_number(key: &str) -> Option<&'static str> {
    if key == "at" || key.ends_with("_at") {
        Some("<ms>")
    } else if key == "incarnation" || key.ends_with("_incarnation") {
        Some("<incarnation>")
    } else if key == "documents_loaded" {
        Some("<count>")
    } else {
        None
    }
}

/// Replaces durations as `Debug` prints them (`50ms`, `1.5s`, `0ns`, `3µs`) by `<duration>`.
fn normalise_durations(s: &str) -> String {
    const UNITS: [&str; 4] = ["ns", "µs", "ms", "s"];
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    let mut prev: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        if c.is_ascii_digit() && !prev.is_some_and(|p| p.is_alphanumeric() || p == '.') {
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let (number, after) = rest.split_at(end);
            let unit = UNITS.iter().find(|u| {
                after
                    .strip_prefix(**u)
                    .is_some_and(|tail| !tail.chars().next().is_some_and(char::is_alphanumeric))
            });
            match unit {
                Some(u) => {
                    out.push_str("<duration>");
                    rest = &after[u.len()..];
                    prev = u.chars().last();
                }
                None => {
                    out.push_str(number);
                    rest = after;
                    prev = number.chars().last();
                }
            }
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
        prev = Some(c);
    }
    out
}

/// A line diff of two texts: `  ` same, `- ` expected only, `+ ` actual only.
fn line_diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = String::new();
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            let _ = writeln!(out, "  {}", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            let _ = writeln!(out, "- {}", a[i]);
            i += 1;
        } else {
            let _ = writeln!(out, "+ {}", b[j]);
            j += 1;
        }
    }
    out
}

fn pretty(g: &Golden) -> String {
    let mut s = serde_json::to_string_pretty(g).expect("a golden record serialises");
    s.push('\n');
    s
}

/// Compares (or, when blessing, writes) every record against `dir`; returns the complaints.
fn check(dir: &Path, records: &[Golden], bless: bool) -> Vec<String> {
    let mut complaints = vec![];
    if bless {
        std::fs::create_dir_all(dir).expect("create the golden directory");
    }
    for g in records {
        let path = dir.join(format!("{}.json", g.case));
        let actual = pretty(g);
        if bless {
            std::fs::write(&path, &actual).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            continue;
        }
        let expected_text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                complaints.push(format!(
                    "case {}: no golden file {} ({e}); run with {BLESS_VAR}=1 to create it.\n\
                     actual:\n{actual}",
                    g.case,
                    path.display()
                ));
                continue;
            }
        };
        let expected: Golden = match serde_json::from_str(&expected_text) {
            Ok(e) => e,
            Err(e) => {
                complaints.push(format!(
                    "case {}: {} does not parse ({e}); actual:\n{actual}",
                    g.case,
                    path.display()
                ));
                continue;
            }
        };
        if &expected != g {
            complaints.push(format!(
                "case {} ({} {}): the answer differs from {}\n\
                 expected: status {}, actual: status {}\n\
                 diff (- expected, + actual):\n{}",
                g.case,
                g.request.method,
                g.request.path,
                path.display(),
                expected.response.status,
                g.response.status,
                line_diff(&pretty(&expected), &actual)
            ));
        }
    }
    // Golden files of cases that no longer exist.
    let names: BTreeSet<String> = records.iter().map(|g| format!("{}.json", g.case)).collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if !file.ends_with(".json") || names.contains(&file) {
                continue;
            }
            if bless {
                std::fs::remove_file(entry.path()).expect("remove a stale golden file");
            } else {
                complaints.push(format!(
                    "{}: no case has this golden file; run with {BLESS_VAR}=1 to remove it",
                    entry.path().display()
                ));
            }
        }
    }
    complaints
}

/// The registry: the built-in kinds, plus `block`, which runs until it is cancelled.
fn registry() -> piecework::worker_pool::Registry {
    let mut r = piecework::kinds::builtin();
    r.register("block", |ctx: Context, _input: Value| async move {
        ctx.cancellation().cancelled().await;
        Err::<Value, _>(HandlerError::new("cancelled"))
    });
    // Reports its progress, submits a follow-up and records an undo task.
    r.register("chain", |ctx: Context, input: Value| async move {
        ctx.progress(Progress::count(1, 2));
        let next = ctx.submit(FollowUp::new("noop", json!({ "after": input["step"] })))?;
        ctx.undo(FollowUp::new("noop", json!({ "undo": input["step"] })).priority(5))?;
        ctx.progress(Progress::count(2, 2));
        Ok(json!({ "next": next }))
    });
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_as_recorded() {
    run_golden(steps(), &golden_dir(), |_| {}).await;
}

/// The routes that show a queue or a task, once the queue document has been rotated into a
/// new epoch (a node rotating at the smallest threshold): the queue keeps its id and answers,
/// a task the current epoch no longer carries answers from its document's summary, and
/// submits go on.
fn steps_after_rotation() -> Vec<Step> {
    vec![
        case(
            "create_queue",
            "creating a queue on a node that rotates early",
        )
        .post("/v1/queues")
        .json(json!({ "name": "rotating" }))
        .capture("queue_id", "<queue:rot>")
        .into(),
        Step::Settle(Settle::RouterActive("<queue:rot>")),
        case(
            "submit_first",
            "the task whose status is asked after the rotation",
        )
        .post("/v1/queues/<queue:rot>/tasks")
        .json(json!({ "kind": "sha256", "input": { "data": "1", "rounds": 1 } }))
        .capture("task_id", "<task:first>")
        .into(),
        Step::Settle(Settle::Finished("<task:first>")),
        case(
            "submit_more",
            // One task, not more: with two, whether the second is carried into the successor
            // (and a later end rotates again) would depend on timing.
            "a batch of one more task, whose end makes the queue rotate (two finished, none live)",
        )
        .post("/v1/queues/<queue:rot>/tasks")
        .json(json!([
            { "kind": "sha256", "input": { "data": "2", "rounds": 1 } }
        ]))
        .into(),
        Step::Settle(Settle::Rotated(
            "<queue:rot>",
            "<task:first>",
            TaskState::Succeeded,
        )),
        case(
            "task_after_rotation",
            "a task that ended before the rotation: its status from its summary",
        )
        .get("/v1/tasks/<task:first>")
        .into(),
        case(
            "wait_after_rotation",
            "waiting on that task answers at once",
        )
        .get("/v1/tasks/<task:first>/wait?timeout_ms=100")
        .into(),
        case(
            "join_after_rotation",
            "the queue, by its first id, after the rotation",
        )
        .post("/v1/queues/<queue:rot>/join")
        .into(),
        case(
            "submit_after_rotation",
            "a submit to the rotated queue, by its first id",
        )
        .post("/v1/queues/<queue:rot>/tasks")
        .json(json!({ "kind": "sha256", "input": { "data": "4", "rounds": 1 } }))
        .capture("task_id", "<task:later>")
        .into(),
        Step::Settle(Settle::Finished("<task:later>")),
        case(
            "task_submitted_after_rotation",
            "that task, succeeded in the new epoch",
        )
        .get("/v1/tasks/<task:later>")
        .into(),
        case(
            "status_after_rotation",
            "the node's status after the rotation",
        )
        .get("/v1/status")
        .into(),
        case(
            "submit_failing",
            "a task that fails once, one attempt allowed: dead-lettered",
        )
        .post("/v1/queues/<queue:rot>/tasks")
        .json(json!({ "kind": "fail", "input": { "times": 1 }, "max_attempts": 1 }))
        .capture("task_id", "<task:failing>")
        .into(),
        Step::Settle(Settle::Ended("<task:failing>", TaskState::Failed)),
        case(
            "submit_to_rotate_again",
            "one more task, whose end makes the queue rotate again, leaving the dead letter behind",
        )
        .post("/v1/queues/<queue:rot>/tasks")
        .json(json!({ "kind": "sha256", "input": { "data": "5", "rounds": 1 } }))
        .into(),
        Step::Settle(Settle::Rotated(
            "<queue:rot>",
            "<task:failing>",
            TaskState::Failed,
        )),
        case(
            "requeue_after_rotation",
            "requeueing the dead letter the live document no longer holds: back, pending",
        )
        .post("/v1/tasks/<task:failing>/requeue")
        .into(),
        // Its second run (attempt 2 of its life) succeeds. (Its status then is not recorded:
        // whether a rotation has left it behind again by then is a matter of timing.)
        Step::Settle(Settle::Ended("<task:failing>", TaskState::Succeeded)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_answer_as_recorded_after_a_rotation() {
    run_golden(
        steps_after_rotation(),
        &golden_dir().join("after_rotation"),
        |c| c.rotation = Some((1, 1)),
    )
    .await;
}

/// A queue holding as many live tasks as the node takes: submits, one or a batch, answer 503
/// and write nothing; the queue's counts show that nothing was added.
fn steps_full_queue() -> Vec<Step> {
    vec![
        case(
            "create_queue",
            "creating a queue on a node that takes one live task",
        )
        .post("/v1/queues")
        .json(json!({ "name": "small" }))
        .capture("queue_id", "<queue:full>")
        .into(),
        Step::Settle(Settle::RouterActive("<queue:full>")),
        case(
            "submit_fills",
            "the one task the queue takes (it holds the only worker)",
        )
        .post("/v1/queues/<queue:full>/tasks")
        .json(json!({ "kind": "block", "input": null }))
        .capture("task_id", "<task:holding>")
        .into(),
        Step::Settle(Settle::Running("<task:holding>")),
        case(
            "submit_full",
            "a submit to a queue at its bound of live tasks",
        )
        .post("/v1/queues/<queue:full>/tasks")
        .json(json!({ "kind": "noop" }))
        .into(),
        case(
            "submit_batch_full",
            "a batch to a full queue is refused whole",
        )
        .post("/v1/queues/<queue:full>/tasks")
        .json(json!([{ "kind": "noop" }, { "kind": "noop" }]))
        .into(),
        case(
            "join_full_queue",
            "the queue's counts: the refused submits wrote nothing",
        )
        .post("/v1/queues/<queue:full>/join")
        .into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_as_recorded() {
    run_golden(steps_full_queue(), &golden_dir().join("full_queue"), |c| {
        c.max_live = Some(1)
    })
    .await;
}

/// A task's life-cycle: cancel (pending, running, ended), dead letters and requeues (one task,
/// a whole queue), a run past its timeout, and the errors of each route.
fn steps_lifecycle() -> Vec<Step> {
    vec![
        case("create_queue", "creating a queue for the life-cycle cases")
            .post("/v1/queues")
            .json(json!({ "name": "life" }))
            .capture("queue_id", "<queue:life>")
            .into(),
        Step::Settle(Settle::RouterActive("<queue:life>")),
        case("submit_block", "a task that holds the only worker until cancelled")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "block", "max_attempts": 1 }))
            .capture("task_id", "<task:block>")
            .into(),
        Step::Settle(Settle::Running("<task:block>")),
        case("submit_waiting", "a task that waits behind it")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "noop" }))
            .capture("task_id", "<task:waiting>")
            .into(),
        case(
            "cancel_pending",
            "cancelling a pending task: cancelled at once, naming who asked",
        )
        .post("/v1/tasks/<task:waiting>/cancel")
        .into(),
        case("cancel_ended", "cancelling a task that ended: 409")
            .post("/v1/tasks/<task:waiting>/cancel")
            .into(),
        case("cancel_unknown", "cancelling a task nobody has: 404")
            .post("/v1/tasks/<unknown-id>/cancel")
            .into(),
        case("cancel_bad_id", "cancelling by a malformed id: 400")
            .post("/v1/tasks/not-an-id/cancel")
            .into(),
        case("requeue_not_failed", "requeueing a task that is not dead-lettered: 409")
            .post("/v1/tasks/<task:waiting>/requeue")
            .into(),
        case("requeue_unknown", "requeueing a task nobody has: 404")
            .post("/v1/tasks/<unknown-id>/requeue")
            .into(),
        case(
            "cancel_running",
            "cancelling a running task: cancelled, its handler signalled, its run still open",
        )
        .post("/v1/tasks/<task:block>/cancel")
        .into(),
        Step::Settle(Settle::Ended("<task:block>", TaskState::Cancelled)),
        case(
            "task_cancelled_while_running",
            "its handler stopped on the signal: the attempt failed, the task stays cancelled",
        )
        .get("/v1/tasks/<task:block>")
        .into(),
        case("submit_fail", "a task of the built-in fail kind, one attempt allowed")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "fail", "input": { "times": 1, "message": "boom" }, "max_attempts": 1 }))
            .capture("task_id", "<task:fail>")
            .into(),
        Step::Settle(Settle::Ended("<task:fail>", TaskState::Failed)),
        case("task_dead_lettered", "dead-lettered after its one failure")
            .get("/v1/tasks/<task:fail>")
            .into(),
        case(
            "requeue_task",
            "requeueing it: pending again, its failed attempt kept",
        )
        .post("/v1/tasks/<task:fail>/requeue")
        .into(),
        Step::Settle(Settle::Ended("<task:fail>", TaskState::Succeeded)),
        case(
            "task_after_requeue",
            "its second run (attempt 2 of its life) succeeded",
        )
        .get("/v1/tasks/<task:fail>")
        .into(),
        case("submit_fail_again", "a task that fails five times, one attempt allowed")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "fail", "input": { "times": 5 }, "max_attempts": 1 }))
            .capture("task_id", "<task:fails>")
            .into(),
        Step::Settle(Settle::Ended("<task:fails>", TaskState::Failed)),
        case("requeue_queue", "requeueing every dead-lettered task of the queue")
            .post("/v1/queues/<queue:life>/requeue")
            .into(),
        Step::Settle(Settle::Ended("<task:fails>", TaskState::Failed)),
        case(
            "requeue_queue_none_failed",
            "the same, with none failed: an empty list",
        )
        .post("/v1/queues/<queue:life>/requeue")
        .into(),
        case("requeue_queue_unknown", "requeueing a queue this node has not joined: 404")
            .post("/v1/queues/<unknown-id>/requeue")
            .into(),
        case("submit_timeout", "a 60 s sleep with a 200 ms timeout, one attempt allowed")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "sleep", "input": { "ms": 60000 }, "timeout_ms": 200, "max_attempts": 1 }))
            .capture("task_id", "<task:slow>")
            .into(),
        Step::Settle(Settle::Ended("<task:slow>", TaskState::Failed)),
        case("task_timed_out", "its run was cancelled at its timeout and failed")
            .get("/v1/tasks/<task:slow>")
            .into(),
        case("submit_bad_timeout", "a timeout of 0 ms: 400")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "noop", "timeout_ms": 0 }))
            .into(),
        case(
            "config_failure_policy",
            "per-kind failure policies: fail is ignored, flaky pauses the server resource",
        )
        .patch("/v1/queues/<queue:life>/config")
        .json(json!({ "failure_policy": {
            "fail": "ignore",
            "flaky": { "pause_resource": { "resource": "server", "restore_after_ms": 60000 } },
        } }))
        .into(),
        case(
            "config_bad_failure_policy",
            "a policy that pauses a resource with an invalid name: 400",
        )
        .patch("/v1/queues/<queue:life>/config")
        .json(json!({ "failure_policy": {
            "x": { "pause_resource": { "resource": "no spaces", "restore_after_ms": 1 } },
        } }))
        .into(),
        case("submit_ignored", "a failing task of an ignored kind, three attempts allowed")
            .post("/v1/queues/<queue:life>/tasks")
            .json(json!({ "kind": "fail", "input": { "times": 1 }, "max_attempts": 3 }))
            .capture("task_id", "<task:ignored>")
            .into(),
        Step::Settle(Settle::Ended("<task:ignored>", TaskState::Failed)),
        case("task_ignored", "dead-lettered at its first failure, marked ignored")
            .get("/v1/tasks/<task:ignored>")
            .into(),
        case(
            "submit_paused_kind",
            "a task of a kind whose failures pause a resource: it requires the resource",
        )
        .post("/v1/queues/<queue:life>/tasks")
        .json(json!({ "kind": "flaky" }))
        .capture("task_id", "<task:flaky>")
        .into(),
        case(
            "task_requires_by_policy",
            "blocked on its kind (no handler here), requiring the server resource",
        )
        .get("/v1/tasks/<task:flaky>")
        .into(),
        case(
            "submit_chain",
            "a task that reports progress, submits a follow-up and records an undo task",
        )
        .post("/v1/queues/<queue:life>/tasks")
        .json(json!({ "kind": "chain", "input": { "step": 1 } }))
        .capture("task_id", "<task:chain>")
        .into(),
        Step::Settle(Settle::Ended("<task:chain>", TaskState::Succeeded)),
        case(
            "task_with_follow_up",
            "succeeded: its result names its follow-up, its run keeps its last progress",
        )
        .get("/v1/tasks/<task:chain>")
        .capture("/result/next", "<task:next>")
        .into(),
        Step::Settle(Settle::Ended("<task:next>", TaskState::Succeeded)),
        case(
            "follow_up_status",
            "the follow-up, submitted with the success: it follows its task and waited on it",
        )
        .get("/v1/tasks/<task:next>")
        .into(),
        case("undo_task", "undoing the task: its undo task is submitted")
            .post("/v1/tasks/<task:chain>/undo")
            .capture("/task_ids/0", "<task:undo>")
            .into(),
        case(
            "undo_again",
            "undoing it again: the same undo task, not a second one",
        )
        .post("/v1/tasks/<task:chain>/undo")
        .into(),
        Step::Settle(Settle::Ended("<task:undo>", TaskState::Succeeded)),
        case("undo_task_status", "the undo task: it undoes its task")
            .get("/v1/tasks/<task:undo>")
            .into(),
        case(
            "undo_not_succeeded",
            "undoing a task that did not succeed: 409",
        )
        .post("/v1/tasks/<task:fails>/undo")
        .into(),
        case("undo_unknown", "undoing a task nobody has: 404")
            .post("/v1/tasks/<unknown-id>/undo")
            .into(),
        case("undo_bad_id", "undoing by a malformed id: 400")
            .post("/v1/tasks/not-an-id/undo")
            .into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_life_cycle_answers_as_recorded() {
    run_golden(steps_lifecycle(), &golden_dir().join("lifecycle"), |_| {}).await;
}

/// Runs `steps` against a fresh node (one worker, then `tune` changes its configuration) and
/// checks every answer against the golden files in `dir`.
async fn run_golden(steps: Vec<Step>, dir: &Path, tune: impl FnOnce(&mut Config)) {
    let mut seen = BTreeSet::new();
    for s in &steps {
        if let Step::Case(c) = s {
            assert!(seen.insert(c.name), "two cases are named {}", c.name);
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let mut config = Config::new(tmp.path().join("node"), registry());
    config.workers = 1;
    tune(&mut config);
    let node = Node::start(config).await.expect("the node starts");
    let handle = node.handle().clone();
    let addr = handle.wait_listening().await.to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(piecework::node::http::serve(handle.clone(), listener));

    let mut session = Session {
        base,
        http: reqwest::Client::new(),
        names: vec![
            ("<peer>".into(), handle.peer_id().to_string()),
            ("<addr>".into(), addr),
            ("<unknown-id>".into(), UNKNOWN_ID.into()),
        ],
        node: handle,
    };

    let mut answers: Vec<(&Case, Option<Answer>)> = vec![];
    let mut pending = vec![];
    for step in &steps {
        match step {
            Step::Settle(s) => session.settle(s).await,
            Step::Case(c) if c.background => {
                pending.push((answers.len(), session.send(c)));
                answers.push((c, None));
            }
            Step::Case(c) => {
                let answer = session.send(c).await.expect("the request task");
                session.capture(c, &answer);
                answers.push((c, Some(answer)));
            }
        }
    }
    for (i, task) in pending {
        let answer = task.await.expect("the request task");
        session.capture(answers[i].0, &answer);
        answers[i].1 = Some(answer);
    }

    let records: Vec<Golden> = answers
        .iter()
        .map(|(c, a)| session.record(c, a.as_ref().expect("answered")))
        .collect();
    let bless = std::env::var(BLESS_VAR).is_ok_and(|v| v == "1");
    let complaints = check(dir, &records, bless);
    if bless {
        eprintln!("wrote {} golden files to {}", records.len(), dir.display());
    }
    assert!(
        complaints.is_empty(),
        "{} problem(s) with the golden files of the {} HTTP cases (run with {BLESS_VAR}=1 to accept \
         the new answers):\n\n{}",
        complaints.len(),
        records.len(),
        complaints.join("\n\n")
    );
}

#[test]
fn durations_are_normalised_and_nothing_else() {
    assert_eq!(
        normalise_durations("task x had not finished after 50ms"),
        "task x had not finished after <duration>"
    );
    assert_eq!(
        normalise_durations("1.5s, 0ns, 3µs and 12s."),
        "<duration>, <duration>, <duration> and <duration>."
    );
    assert_eq!(
        normalise_durations("priority 100000 is outside [-99999, 99999]; 12D3Koo 5ms2 v1.2s"),
        "priority 100000 is outside [-99999, 99999]; 12D3Koo 5ms2 v1.2s"
    );
}

#[test]
fn the_line_diff_marks_changed_lines() {
    assert_eq!(line_diff("a\nb\nc", "a\nx\nc"), "  a\n- b\n+ x\n  c\n");
}

/// `GET /v1/events`: the first events of a task's life on a fresh queue, as Server-Sent Events,
/// and a resume from the first event's id (`Last-Event-ID`), compared with
/// `golden/http/events.txt` (queue, task and peer ids, times and event ids normalised).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_begins_as_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = Config::new(tmp.path().join("node"), registry());
    config.workers = 1;
    let node = Node::start(config).await.expect("the node starts");
    let handle = node.handle().clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(piecework::node::http::serve(handle.clone(), listener));
    let http = reqwest::Client::new();

    let created: Value = http
        .post(format!("{base}/v1/queues"))
        .json(&json!({ "name": "events" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let queue = created["queue_id"].as_str().unwrap().to_owned();
    poll("the router to be active", || {
        let node = handle.clone();
        let id = QueueId::new(queue.as_str());
        async move {
            let status = node.status().await.map_err(|e| e.to_string())?;
            match status.queues.iter().find(|q| q.id == id) {
                Some(q) if q.role == "active" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    let mut stream = http
        .get(format!("{base}/v1/events?queue={queue}"))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(
        stream.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let submitted: Value = http
        .post(format!("{base}/v1/queues/{queue}/tasks"))
        .json(&json!({ "kind": "noop" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = submitted["task_id"].as_str().unwrap().to_owned();

    // Events until the task's success.
    let events = read_events(&mut stream, |e| e.iter().any(|(_, n, _)| n == "succeeded")).await;

    // A resume after the first event replays the ones after it (the node keeps them).
    let mut resumed = http
        .get(format!("{base}/v1/events?queue={queue}"))
        .header("Last-Event-ID", events[0].0.to_string())
        .send()
        .await
        .unwrap();
    let replayed = read_events(&mut resumed, |e| e.len() >= events.len() - 1).await;
    assert_eq!(
        replayed[..],
        events[1..],
        "a resume replays the events after its id"
    );
    for w in events.windows(2) {
        assert_eq!(w[1].0, w[0].0 + 1, "event ids rise by one");
    }

    let peer = handle.peer_id().to_string();
    let mut text = String::new();
    for (_, name, data) in &events {
        assert_eq!(data["event"], name.as_str(), "the data names its event");
        assert!(data["at"].as_u64().is_some(), "every event has its time");
        let mut data = data.clone();
        data["at"] = json!("<at>");
        let line = data
            .to_string()
            .replace(&queue, "<queue>")
            .replace(&task, "<task>")
            .replace(&peer, "<peer>");
        writeln!(text, "id: <id>\nevent: {name}\ndata: {line}\n").unwrap();
    }
    let path = golden_dir().join("events.txt");
    if std::env::var(BLESS_VAR).is_ok_and(|v| v == "1") {
        std::fs::write(&path, &text).unwrap();
    } else {
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run with {BLESS_VAR}=1", path.display()));
        assert_eq!(
            text,
            want,
            "the event stream differs from {} (run with {BLESS_VAR}=1 to accept)",
            path.display()
        );
    }
    drop(node);
}

/// The events of an SSE stream, read until `enough` says so (within a generous deadline).
async fn read_events(
    stream: &mut reqwest::Response,
    enough: impl Fn(&[(u64, String, Value)]) -> bool,
) -> Vec<(u64, String, Value)> {
    let mut events = vec![];
    let mut buf = String::new();
    tokio::time::timeout(GENEROUS, async {
        while !enough(&events) {
            let chunk = stream.chunk().await.unwrap().expect("the stream goes on");
            buf.push_str(std::str::from_utf8(&chunk).unwrap());
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                events.extend(parse_event(&block));
            }
        }
    })
    .await
    .expect("the events come");
    events
}

/// The event of one SSE block (`id:`, `event:`, `data:` lines), if it is one.
fn parse_event(block: &str) -> Option<(u64, String, Value)> {
    let (mut id, mut name, mut data) = (None, None, None);
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            name = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data = serde_json::from_str(v.trim()).ok();
        }
    }
    Some((id?, name?, data?))
}
