//! Piecework as a library: two nodes in one program, a handler of your own, tasks submitted and
//! awaited through `NodeHandle`, with no HTTP and no CLI.
//!
//! `cargo run --release --example embedded`

use std::time::Duration;

use anyhow::Context as _;
use piecework::node::{Config, Node, api};
use piecework::worker_pool::{Context, HandlerError, Registry};
use serde_json::{Value, json};

/// The handler: counts the words of `{"text": STRING}`.
async fn word_count(ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let text = input
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| HandlerError::new("word_count wants {\"text\": STRING}"))?;
    ctx.log(format!("counting {} bytes", text.len()));
    Ok(json!({ "words": text.split_whitespace().count() }))
}

fn registry() -> Registry {
    let mut r = Registry::new();
    r.register("word_count", word_count);
    r
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = Config::new(dir.path().join("a"), registry());
    a.workers = 2;
    let a = Node::start(a).await.context("node a")?;
    let addr = a.handle().wait_listening().await;
    let mut b = Config::new(dir.path().join("b"), registry());
    b.workers = 2;
    b.bootstrap = vec![addr];
    let b = Node::start(b).await.context("node b")?;

    let queue = a.handle().create_queue("words", None).await?;
    b.handle()
        .join_from(a.handle(), &queue, piecework::queue_doc::Role::Member)
        .await?;
    println!(
        "queue {queue} shared by {} and {}",
        a.handle().peer_id(),
        b.handle().peer_id()
    );

    let texts = [
        "the quick brown fox",
        "jumps over",
        "the lazy dog",
        "",
        "one",
    ];
    let mut ids = vec![];
    for (i, text) in texts.iter().enumerate() {
        let via = if i % 2 == 0 { a.handle() } else { b.handle() };
        let req = api::SubmitTask {
            kind: "word_count".into(),
            input: json!({ "text": text }),
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
        ids.push(via.submit(&queue, req).await?.task_id);
    }
    let mut total = 0;
    for (id, text) in ids.iter().zip(texts) {
        let s = a.handle().wait_task(id, Duration::from_secs(60)).await?;
        let words = s
            .result
            .as_ref()
            .and_then(|r| r["words"].as_u64())
            .context("a result")?;
        let ran_on = s
            .runs
            .first()
            .map(|r| r.worker.to_string())
            .unwrap_or_default();
        println!("{text:?}: {words} words (ran on {ran_on})");
        total += words;
    }
    println!("total: {total} words");
    anyhow::ensure!(total == 10, "expected 10 words, counted {total}");
    Ok(())
}
