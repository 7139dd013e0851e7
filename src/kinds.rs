//! The task kinds built into the `piecework` binary.
//!
//! | kind | input | result |
//! |---|---|---|
//! | `noop` | anything | `null` |
//! | `sleep` | `{"ms": N}` (N ≤ 3 600 000) | `{"slept_ms": N}` |
//! | `sha256` | `{"data": STRING, "rounds": N}` (1 ≤ N ≤ 10 000 000, default 1) | the hex digest of `data` hashed `rounds` times |
//!
//! `sha256` runs on tokio's blocking pool so that long hashing does not stall the node.

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
    r
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
}
