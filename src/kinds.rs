//! The task kinds built into the `piecework` binary.
//!
//! | kind | input | result |
//! |---|---|---|
//! | `noop` | anything | `null` |
//! | `sleep` | `{"ms": N}` (N ≤ 3 600 000) | `{"slept_ms": N}` |
//! | `sha256` | `{"data": STRING, "rounds": N}` (1 ≤ N ≤ 10 000 000, default 1) | the hex digest of `data` hashed `rounds` times |
//! | `fail` | `{"times": N, "message": TEXT}` (both optional: N = 1, a default message) | fails with `message` while the run's attempt number ([`Context::attempt`]) is at most N, then `{"attempt": A}` |
//! | `wait_file` | `{"path": PATH}`, an absolute path inside the system's temporary directory | `{"path": PATH}` once a file exists there (at most 1 h, then it fails) |
//!
//! `sha256` runs on tokio's blocking pool so that long hashing does not stall the node.
//! `wait_file` is a run that stays in flight until someone releases it (creates the file): for
//! demos and tests that must act while a run is certainly under way (kill its node, say). It
//! looks every 20 ms and ends early if its run is cancelled. Its path is confined to the
//! temporary directory, so a submitter cannot learn through it what exists elsewhere on a node.

use piecework_worker_pool::{Context, HandlerError, Registry};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The longest `sleep`.
pub const MAX_SLEEP_MS: u64 = 3_600_000;
/// The most `sha256` rounds.
pub const MAX_ROUNDS: u64 = 10_000_000;

/// A registry with every built-in kind.
pub fn builtin() -> Registry {
    let mut r = Registry::new();
    r.register("noop", |_ctx: Context, _input: Value| async {
        Ok(Value::Null)
    });
    r.register("sleep", sleep);
    r.register("sha256", sha256);
    r.register("wait_file", wait_file);
    r.register("fail", fail);
    r
}

#[derive(Deserialize)]
struct FailInput {
    #[serde(default = "one")]
    times: u64,
    #[serde(default)]
    message: Option<String>,
}

/// Fails while its attempt number is at most `times`: for trying retries, dead letters and
/// failure policies.
async fn fail(ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let FailInput { times, message } = serde_json::from_value(input).map_err(|e| {
        HandlerError::new(format!(
            "fail wants {{\"times\": N, \"message\": TEXT}}: {e}"
        ))
    })?;
    let attempt = ctx.attempt();
    if attempt <= times {
        let message =
            message.unwrap_or_else(|| format!("failing on purpose: attempt {attempt} of {times}"));
        return Err(HandlerError::new(message));
    }
    Ok(json!({ "attempt": attempt }))
}

#[derive(Deserialize)]
struct SleepInput {
    ms: u64,
}

async fn sleep(ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let SleepInput { ms } = serde_json::from_value(input)
        .map_err(|e| HandlerError::new(format!("sleep wants {{\"ms\": N}}: {e}")))?;
    if ms > MAX_SLEEP_MS {
        return Err(HandlerError::new(format!(
            "sleep: at most {MAX_SLEEP_MS} ms"
        )));
    }
    tokio::select! {
        () = tokio::time::sleep(std::time::Duration::from_millis(ms)) => Ok(json!({ "slept_ms": ms })),
        () = ctx.cancellation().cancelled() => Err(HandlerError::new("cancelled")),
    }
}

#[derive(Deserialize)]
struct WaitFileInput {
    path: std::path::PathBuf,
}

/// How often `wait_file` looks for its file.
const WAIT_FILE_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

async fn wait_file(ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let WaitFileInput { path } = serde_json::from_value(input)
        .map_err(|e| HandlerError::new(format!("wait_file wants {{\"path\": PATH}}: {e}")))?;
    let inside_temp = path.is_absolute()
        && path.starts_with(std::env::temp_dir())
        && !path
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir));
    if !inside_temp {
        return Err(HandlerError::new(format!(
            "wait_file: {} is not an absolute path inside {}",
            path.display(),
            std::env::temp_dir().display()
        )));
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(MAX_SLEEP_MS);
    loop {
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            return Ok(json!({ "path": path }));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(HandlerError::new(format!(
                "wait_file: {} did not appear within {MAX_SLEEP_MS} ms",
                path.display()
            )));
        }
        tokio::select! {
            () = tokio::time::sleep(WAIT_FILE_EVERY) => {}
            () = ctx.cancellation().cancelled() => return Err(HandlerError::new("cancelled")),
        }
    }
}

#[derive(Deserialize)]
struct Sha256Input {
    data: String,
    #[serde(default = "one")]
    rounds: u64,
}

fn one() -> u64 {
    1
}

/// `data` hashed `rounds` times with SHA-256, as hex.
pub fn sha256_rounds(data: &[u8], rounds: u64) -> String {
    let mut digest = Sha256::digest(data);
    for _ in 1..rounds {
        digest = Sha256::digest(digest);
    }
    hex::encode(digest)
}

async fn sha256(ctx: Context, input: Value) -> Result<Value, HandlerError> {
    let Sha256Input { data, rounds } = serde_json::from_value(input).map_err(|e| {
        HandlerError::new(format!(
            "sha256 wants {{\"data\": STRING, \"rounds\": N}}: {e}"
        ))
    })?;
    if !(1..=MAX_ROUNDS).contains(&rounds) {
        return Err(HandlerError::new(format!(
            "sha256: rounds must be in 1..={MAX_ROUNDS}"
        )));
    }
    ctx.log(format!("hashing {} bytes, {rounds} rounds", data.len()));
    let digest = tokio::task::spawn_blocking(move || sha256_rounds(data.as_bytes(), rounds))
        .await
        .map_err(|e| HandlerError::new(format!("sha256 worker failed: {e}")))?;
    Ok(Value::String(digest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_a_known_digest() {
        assert_eq!(
            sha256_rounds(b"abc", 1),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let twice = hex::encode(Sha256::digest(Sha256::digest(b"abc")));
        assert_eq!(sha256_rounds(b"abc", 2), twice);
    }

    fn context() -> Context {
        use piecework_queue_doc::{AttemptId, Claim, PeerId, TaskId, WorkerId};
        let peer = PeerId::new("peer-a");
        let attempt = AttemptId {
            n: 1,
            claim: Claim::new(1, peer.clone()),
        };
        Context::new(TaskId::new("automerge:t"), attempt, WorkerId::new(peer, 0))
    }

    #[tokio::test]
    async fn fail_fails_while_its_attempt_is_at_most_times() {
        let input = json!({ "times": 2, "message": "boom" });
        for (n, ok) in [(1, false), (2, false), (3, true)] {
            let out = fail(context().with_attempt(n), input.clone()).await;
            assert_eq!(out.is_ok(), ok, "attempt {n}");
        }
        assert_eq!(
            fail(context(), input).await.unwrap_err().to_string(),
            "boom"
        );
        assert!(fail(context(), json!({ "times": "x" })).await.is_err());
    }

    #[tokio::test]
    async fn wait_file_runs_until_its_file_exists_or_its_run_is_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("release");
        let input = json!({ "path": path });
        // Released: the run is under way (it has not ended) until the file is created.
        let run = tokio::spawn(wait_file(context(), input.clone()));
        tokio::task::yield_now().await;
        assert!(!run.is_finished(), "it waits for its file");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(run.await.unwrap().unwrap(), json!({ "path": path }));
        // Cancelled: it ends at once, with an error.
        let never = json!({ "path": dir.path().join("never") });
        let ctx = context();
        ctx.cancellation().cancel();
        assert!(wait_file(ctx, never).await.is_err());
        // Outside the temporary directory, or climbing out of it: refused.
        for p in ["/etc/passwd", "relative"] {
            assert!(
                wait_file(context(), json!({ "path": p })).await.is_err(),
                "{p}"
            );
        }
        let out = std::env::temp_dir().join("..").join("etc").join("passwd");
        assert!(wait_file(context(), json!({ "path": out })).await.is_err());
    }
}
