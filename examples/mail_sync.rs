//! Seed 004's story: an e-mail client's task queue, shared by the phone (which is online and
//! syncs) and the UI (which submits and says what the user looks at).
//!
//! - Priority tags with boosts that change as the user looks at a folder: folder syncs are
//!   tagged `view:folder:<name>`; looking at a folder boosts its tag, and looking elsewhere
//!   moves the boost while the syncs run.
//! - A dependency chain: saving a draft needs the drafts folder, which needs the folder list.
//! - The `online` resource going away and coming back: online tasks wait, `blocked_on` it.
//! - Backoff retries: sending a mail fails twice (the server is busy), then goes.
//! - An undo: marking a message read records the task that marks it unread; undoing it (from
//!   either node, twice) runs that task once.
//!
//! `cargo run --release --example mail_sync`. The example checks its own outcome and exits
//! non-zero if the order is not the boosts' or the chain's, a task ran while offline, the retries
//! did not back off, or the undo did not run exactly once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use piecework::node::{Config, IsolatedNode, NodeHandle, api, spawn_isolated};
use piecework::queue_doc::{QueueConfig, QueueId, QueueView, TaskId, TaskState};
use piecework::worker_pool::{Context, FollowUp, HandlerError, Registry};
use serde_json::{Value, json};

const BACKOFF_MS: u64 = 200;

/// The mailbox as the tasks change it, and the order they ran in.
#[derive(Default)]
struct Mailbox {
    ran: Mutex<Vec<(String, Instant)>>,
    read: Mutex<BTreeMap<String, bool>>,
}

impl Mailbox {
    fn ran(&self, what: String) {
        self.ran.lock().unwrap().push((what, Instant::now()));
    }

    fn order(&self, prefix: &str) -> Vec<String> {
        self.ran
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _)| w.starts_with(prefix))
            .map(|(w, _)| w.clone())
            .collect()
    }
}

fn registry(mail: &Arc<Mailbox>) -> Registry {
    let mut r = Registry::new();
    for kind in [
        "sync_folder",
        "sync_folder_list",
        "create_folder",
        "save_draft",
    ] {
        let m = mail.clone();
        r.register(kind, move |_ctx: Context, input: Value| {
            let m = m.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                m.ran(format!("{kind}:{}", input["name"].as_str().unwrap_or("")));
                Ok(json!({}))
            }
        });
    }
    let m = mail.clone();
    r.register("send_email", move |ctx: Context, input: Value| {
        let m = m.clone();
        async move {
            m.ran(format!("send_email:attempt {}", ctx.attempt()));
            if ctx.attempt() <= 2 {
                return Err(HandlerError::new("the SMTP server is busy (421)"));
            }
            Ok(json!({ "sent": input["to"] }))
        }
    });
    let m = mail.clone();
    r.register("mark_read", move |ctx: Context, input: Value| {
        let m = m.clone();
        async move {
            let msg = input["msg"].as_str().unwrap_or_default().to_owned();
            let was = m.read.lock().unwrap().insert(msg.clone(), true);
            // Undoing it puts back what there was: nothing to undo if it was read already.
            if was != Some(true) {
                ctx.undo(FollowUp::new("mark_unread", json!({ "msg": msg })))?;
            }
            Ok(json!({ "read": msg }))
        }
    });
    let m = mail.clone();
    r.register("mark_unread", move |_ctx: Context, input: Value| {
        let m = m.clone();
        async move {
            let msg = input["msg"].as_str().unwrap_or_default().to_owned();
            m.ran(format!("mark_unread:{msg}"));
            m.read.lock().unwrap().insert(msg.clone(), false);
            Ok(json!({ "unread": msg }))
        }
    });
    r
}

async fn start(
    dir: &std::path::Path,
    name: &str,
    mail: &Arc<Mailbox>,
    resources: &[&str],
    bootstrap: Vec<piecework::node::Multiaddr>,
) -> anyhow::Result<IsolatedNode> {
    let mut c = Config::new(dir.join(name), registry(mail));
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

fn online(kind: &str, name: &str) -> api::SubmitTask {
    let mut t = api::SubmitTask::new(kind, json!({ "name": name }));
    t.requires = vec!["online".into()];
    t
}

fn state(v: &QueueView, id: &TaskId) -> Option<TaskState> {
    v.task(id).map(|t| t.state())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mail = Arc::new(Mailbox::default());
    let phone = start(dir.path(), "phone", &mail, &["online"], vec![]).await?;
    let addr = phone.handle().wait_listening().await;
    let ui = start(dir.path(), "ui", &mail, &[], vec![addr]).await?;
    let (phone, ui) = (phone.handle().clone(), ui.handle().clone());

    let config = QueueConfig {
        concurrency: 1,
        max_attempts: 5,
        retry_backoff_ms: BACKOFF_MS,
        retry_backoff_max_ms: 4 * BACKOFF_MS,
        ..piecework::demo::fast_config()
    };
    let queue = phone.create_queue("mail", Some(config)).await?;
    ui.join_from(&phone, &queue, piecework::queue_doc::Role::Member)
        .await?;
    until(&ui, &queue, "a router and two members", |v| {
        v.router.is_some() && v.members.len() == 2
    })
    .await?;

    // 1. Folder syncs, tagged by folder; the user looks at the archive.
    ui.set_paused(&queue, true).await?;
    until(&phone, &queue, "the pause", |v| v.paused).await?;
    for folder in ["inbox", "archive", "spam"] {
        for n in 1..=2 {
            let mut t = online("sync_folder", &format!("{folder}{n}"));
            t.tags = vec![format!("view:folder:{folder}")];
            ui.submit(&queue, t).await?;
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }
    ui.set_boost(&queue, "view:folder:archive", 10).await?;
    until(&phone, &queue, "the boost", |v| {
        v.boosts.get("view:folder:archive") == Some(&10)
    })
    .await?;
    ui.set_paused(&queue, false).await?;
    // The first archive sync runs; the user clicks on the spam folder.
    until(&ui, &queue, "a folder sync to start", |v| {
        v.tasks()
            .values()
            .any(|t| t.kind == "sync_folder" && t.state() == TaskState::Running)
    })
    .await?;
    ui.set_boost(&queue, "view:folder:archive", 0).await?;
    ui.set_boost(&queue, "view:folder:spam", 10).await?;
    until(&ui, &queue, "every folder synced", |v| {
        v.tasks()
            .values()
            .filter(|t| t.kind == "sync_folder" && t.state() == TaskState::Succeeded)
            .count()
            == 6
    })
    .await?;
    let syncs = mail.order("sync_folder:");
    println!("folder syncs ran: {}", syncs.join(", "));
    ensure!(
        syncs
            == [
                "sync_folder:archive1",
                "sync_folder:spam1",
                "sync_folder:spam2",
                "sync_folder:inbox1",
                "sync_folder:inbox2",
                "sync_folder:archive2",
            ],
        "the boosted folder first, then the one looked at next, then the rest in order"
    );

    // 2. Offline: a draft to save needs the drafts folder, which needs the folder list.
    phone.withdraw_resource("online", None).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let list = ui
        .submit(&queue, online("sync_folder_list", "all"))
        .await?
        .task_id;
    let mut create = online("create_folder", "drafts");
    create.depends_on = vec![list.clone()];
    let create = ui.submit(&queue, create).await?.task_id;
    let mut save = online("save_draft", "hello");
    save.depends_on = vec![create.clone()];
    let save = ui.submit(&queue, save).await?.task_id;
    let blocked = phone.task_status(&list).await?;
    ensure!(
        matches!(blocked.blocked_on, Some(api::BlockedOn::Resource { .. })),
        "offline, the folder list waits on the resource: {:?}",
        blocked.blocked_on
    );
    let waiting = phone.task_status(&save).await?;
    ensure!(
        matches!(
            waiting.blocked_on,
            Some(api::BlockedOn::Dependencies { .. })
        ),
        "the draft waits on its folder: {:?}",
        waiting.blocked_on
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        mail.order("sync_folder_list").is_empty(),
        "nothing online ran offline"
    );
    println!("offline: the folder list is blocked on `online`, the draft on its folder");
    phone.add_resource("online").await?;
    until(&ui, &queue, "the draft saved", |v| {
        state(v, &save) == Some(TaskState::Succeeded)
    })
    .await?;
    let at = |w: &str| mail.ran.lock().unwrap().iter().position(|(x, _)| x == w);
    ensure!(
        at("sync_folder_list:all") < at("create_folder:drafts")
            && at("create_folder:drafts") < at("save_draft:hello"),
        "the chain ran in order: {:?} {:?} {:?}",
        at("sync_folder_list:all"),
        at("create_folder:drafts"),
        at("save_draft:hello")
    );
    println!("online again: folder list, drafts folder, draft, in order");

    // 3. Sending fails twice, then goes, backing off in between.
    let mut send = api::SubmitTask::new("send_email", json!({ "to": "ada@example.org" }));
    send.requires = vec!["online".into()];
    let send = ui.submit(&queue, send).await?.task_id;
    until(&ui, &queue, "the mail sent", |v| {
        state(v, &send) == Some(TaskState::Succeeded)
    })
    .await?;
    let tries: Vec<Instant> = mail
        .ran
        .lock()
        .unwrap()
        .iter()
        .filter(|(w, _)| w.starts_with("send_email"))
        .map(|(_, t)| *t)
        .collect();
    ensure!(tries.len() == 3, "three attempts: {}", tries.len());
    let gaps: Vec<u128> = tries
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    // Equal jitter: at least half of 200 ms, then of 400 ms.
    ensure!(
        gaps[0] >= u128::from(BACKOFF_MS / 2) && gaps[1] >= u128::from(BACKOFF_MS),
        "the retries backed off: {gaps:?} ms"
    );
    println!("sent at the third attempt, {gaps:?} ms apart");

    // 4. Mark a message read, then undo it from both nodes.
    let mut read = api::SubmitTask::new("mark_read", json!({ "msg": "m42" }));
    read.requires = vec!["online".into()];
    let read = ui.submit(&queue, read).await?.task_id;
    until(&ui, &queue, "the message marked read", |v| {
        state(v, &read) == Some(TaskState::Succeeded)
    })
    .await?;
    ensure!(mail.read.lock().unwrap().get("m42") == Some(&true), "read");
    let first = ui.undo_task(&read).await?;
    let second = phone.undo_task(&read).await?;
    ensure!(
        first.len() == 1 && first == second,
        "one undo task, whoever undoes: {first:?} {second:?}"
    );
    until(&ui, &queue, "the undo to run", |v| {
        state(v, &first[0]) == Some(TaskState::Succeeded)
    })
    .await?;
    ensure!(
        mail.read.lock().unwrap().get("m42") == Some(&false),
        "unread again"
    );
    ensure!(mail.order("mark_unread").len() == 1, "the undo ran once");
    println!("marked read, undone from both nodes: marked unread once");
    Ok(())
}
