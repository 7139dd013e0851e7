//! Seed 000's story: a reader app downloads books one request at a time over a stack. The
//! device's node (the only one that reaches the server) runs a single executor; the UI's node
//! pushes downloads.
//!
//! - The queue is a stack (`order: lifo`) with `concurrency: 1`: one download at a time,
//!   newest first.
//! - An urgent book (the one the user opened) jumps the stack.
//! - A download pushed again (same dedup key) moves to the top.
//! - Each page's task submits the next page as a follow-up, written with its success: a book
//!   downloads page after page, and the next page is the newest task, so it goes first.
//! - A failed page download pauses the `server` resource (failure policy `pause_resource`):
//!   nothing downloads until it is restored, and the page is tried again, its failed attempt
//!   deferred (not counted against `max_attempts`).
//! - A failed publisher logo is ignored (failure policy `ignore`): dead-lettered at once.
//!
//! `cargo run --release --example download_throttle`. The example checks its own outcome and
//! exits non-zero if two downloads overlapped, the order is not the stack's, a page was lost or
//! downloaded twice, or a policy did not apply.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{FailurePolicy, Order, QueueConfig, QueueId, QueueView, TaskState};
use piecework::worker_pool::{Context, FollowUp, HandlerError, Registry};
use serde_json::{Value, json};

/// How long the server is left alone after a failed page download.
const PAUSE_MS: u64 = 400;

/// What the "server" saw: downloads in order, and how many ran at once at most.
#[derive(Default)]
struct Server {
    log: Mutex<Vec<String>>,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl Server {
    async fn download(&self, what: String) {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.log.lock().unwrap().push(what);
        self.running.fetch_sub(1, Ordering::SeqCst);
    }
}

fn registry(server: &Arc<Server>) -> Registry {
    let mut r = Registry::new();
    let s = server.clone();
    r.register("book", move |ctx: Context, input: Value| {
        let s = s.clone();
        async move {
            let book = input["book"].as_str().unwrap_or_default().to_owned();
            s.download(format!("book:{book}")).await;
            let page = json!({ "book": book, "page": 0, "pages": input["pages"] });
            ctx.submit(FollowUp::new("page", page).requires("server"))?;
            if input["logo"].as_bool() == Some(true) {
                ctx.submit(FollowUp::new("logo", json!({ "book": book })).requires("server"))?;
            }
            Ok(json!({ "book": book }))
        }
    });
    let s = server.clone();
    r.register("page", move |ctx: Context, input: Value| {
        let s = s.clone();
        async move {
            let book = input["book"].as_str().unwrap_or_default().to_owned();
            let page = input["page"].as_u64().unwrap_or(0);
            let pages = input["pages"].as_u64().unwrap_or(1);
            // The connection drops once, on book A's second page.
            if book == "A" && page == 1 && ctx.attempt() == 1 {
                return Err(HandlerError::new("the server is unreachable"));
            }
            s.download(format!("page:{book}:{page}")).await;
            if page + 1 < pages {
                let next = json!({ "book": book, "page": page + 1, "pages": pages });
                ctx.submit(FollowUp::new("page", next).requires("server"))?;
            }
            Ok(json!({ "book": book, "page": page }))
        }
    });
    r.register("logo", |_ctx: Context, _input: Value| async move {
        Err::<Value, _>(HandlerError::new("the publisher's logo is gone (404)"))
    });
    r
}

async fn start(
    dir: &std::path::Path,
    name: &str,
    server: &Arc<Server>,
    resources: &[&str],
    bootstrap: Vec<piecework::node::Multiaddr>,
) -> anyhow::Result<IsolatedNode> {
    let mut c = Config::new(dir.join(name), registry(server));
    c.workers = 1;
    c.bootstrap = bootstrap;
    c.resources = resources.iter().map(|r| (*r).to_owned()).collect();
    spawn_isolated(c, 1)
        .await
        .with_context(|| format!("node {name}"))
}

async fn until(
    node: &NodeHandle,
    queue: &QueueId,
    what: &str,
    done: impl Fn(&QueueView) -> bool,
) -> anyhow::Result<Arc<QueueView>> {
    let limit = Duration::from_secs(15);
    let mut rx = node.watch_queue(queue).context("joined")?;
    let view = tokio::time::timeout(limit, rx.wait_for(|v| done(v)))
        .await
        .with_context(|| format!("waited {limit:?} for {what}"))?
        .context("the node stopped")?;
    Ok(view.clone())
}

fn book(name: &str, pages: u64, logo: bool) -> api::SubmitTask {
    let mut t = api::SubmitTask::new(
        "book",
        json!({ "book": name, "pages": pages, "logo": logo }),
    );
    t.dedup_key = Some(format!("book:{name}"));
    t.requires = vec!["server".into()];
    t
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = Arc::new(Server::default());
    // The device reaches the server; the UI's node does not hold the resource.
    let device = start(dir.path(), "device", &server, &["server"], vec![]).await?;
    let addr = device.handle().wait_listening().await;
    let ui = start(dir.path(), "ui", &server, &[], vec![addr]).await?;
    let (device, ui) = (device.handle().clone(), ui.handle().clone());

    let config = QueueConfig {
        concurrency: 1,
        order: Order::Lifo,
        retry_backoff_ms: 50,
        failure_policy: BTreeMap::from([
            (
                "page".to_owned(),
                FailurePolicy::PauseResource {
                    resource: "server".into(),
                    restore_after_ms: PAUSE_MS,
                },
            ),
            ("logo".to_owned(), FailurePolicy::Ignore),
        ]),
        ..piecework::demo::fast_config()
    };
    let queue = device.create_queue("downloads", Some(config)).await?;
    ui.join_from(&device, &queue, piecework::queue_doc::Role::Member)
        .await?;
    until(&ui, &queue, "a router and two members", |v| {
        v.router.is_some() && v.members.len() == 2
    })
    .await?;
    let mut events = ui.queue_events(None);

    // The stack fills while the queue is paused (as it would while the executor is busy).
    ui.set_paused(&queue, true).await?;
    until(&device, &queue, "the pause", |v| v.paused).await?;
    let mut ids = BTreeMap::new();
    for (name, pages, logo) in [("A", 3, false), ("B", 2, true), ("C", 2, false)] {
        ids.insert(
            name,
            ui.submit(&queue, book(name, pages, logo)).await?.task_id,
        );
        // Distinct submit times: the stack's order is the submits'.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A pushed again moves to the top of the stack (no second task).
    let again = ui.submit(&queue, book("A", 3, false)).await?;
    ensure!(
        again.deduplicated && again.task_id == ids["A"],
        "a re-push bumps"
    );
    // The book the user opens jumps the stack.
    let mut urgent = book("U", 2, false);
    urgent.urgent = true;
    ids.insert("U", ui.submit(&queue, urgent).await?.task_id);
    println!("stack: A, B, C pushed, A pushed again, U opened (urgent)");
    ui.set_paused(&queue, false).await?;

    // 4 books, 9 pages, 1 logo.
    let v = until(&ui, &queue, "every download to end", |v| {
        let c = v.total_counts();
        c.succeeded + c.failed == 14 && v.tasks().values().all(|t| t.state().is_final())
    })
    .await?;

    let log = server.log.lock().unwrap().clone();
    println!("the server saw: {}", log.join(", "));
    ensure!(
        server.most.load(Ordering::SeqCst) == 1,
        "one download at a time"
    );
    let books: Vec<&str> = log.iter().filter_map(|l| l.strip_prefix("book:")).collect();
    ensure!(
        books == ["U", "A", "C", "B"],
        "urgent first, the re-pushed book next, then the stack's order: {books:?}"
    );
    // Each book's pages come right after it, in order, each once.
    for (b, pages) in [("U", 2), ("A", 3), ("C", 2), ("B", 2)] {
        let at = log.iter().position(|l| *l == format!("book:{b}")).unwrap();
        let mine: Vec<&String> = log
            .iter()
            .filter(|l| l.starts_with(&format!("page:{b}:")))
            .collect();
        let want: Vec<String> = (0..pages).map(|p| format!("page:{b}:{p}")).collect();
        ensure!(
            mine.iter()
                .map(|s| s.as_str())
                .eq(want.iter().map(String::as_str)),
            "book {b}'s pages: {mine:?}"
        );
        let next_book = log[at + 1..].iter().position(|l| l.starts_with("book:"));
        let last_page = log
            .iter()
            .rposition(|l| l.starts_with(&format!("page:{b}:")));
        ensure!(
            next_book.is_none_or(|n| last_page.unwrap() < at + 1 + n),
            "book {b} is downloaded whole before the next book"
        );
    }

    // The failed page paused the server and was deferred, then downloaded.
    let page_a1 = v
        .tasks()
        .values()
        .find(|t| {
            t.kind == "page"
                && t.input
                    .as_deref()
                    .is_some_and(|i| i.contains("\"A\"") && i.contains("\"page\":1"))
        })
        .context("book A's second page")?;
    let ends: Vec<String> = page_a1
        .attempts
        .iter()
        .filter_map(|a| a.finished.as_ref())
        .map(|f| format!("{:?}: {}", f.outcome, f.error.clone().unwrap_or_default()))
        .collect();
    ensure!(
        page_a1.state() == TaskState::Succeeded
            && page_a1
                .attempts
                .iter()
                .filter_map(|a| a.finished.as_ref())
                .any(|f| f.deferred()),
        "book A's second page was deferred, then downloaded: {ends:?}"
    );
    println!("book A's second page: {}", ends.join(" / "));
    // The logo was ignored: dead-lettered at its first failure.
    let logo = v
        .tasks()
        .values()
        .find(|t| t.kind == "logo")
        .context("the logo task")?;
    ensure!(
        logo.state() == TaskState::Failed && logo.attempts.len() == 1 && logo.ignored(),
        "the logo is ignored at once"
    );
    let follows = v
        .tasks()
        .values()
        .filter(|t| t.rules.follows.is_some())
        .count();
    ensure!(
        follows == 10,
        "9 pages and a logo came as follow-ups, not {follows}"
    );

    // The UI's node saw it all as events.
    let mut seen = BTreeMap::<String, usize>::new();
    while let Ok(e) = events.live.try_recv() {
        *seen.entry(e.event.event.clone()).or_default() += 1;
    }
    println!("events on the UI's node: {seen:?}");
    ensure!(
        seen.get("succeeded") == Some(&13) && seen.get("dead_lettered") == Some(&1),
        "13 successes and a dead letter as events: {seen:?}"
    );
    println!(
        "one download at a time, in the stack's order; the failed page paused the server, the logo was ignored"
    );
    Ok(())
}
