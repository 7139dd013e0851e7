//! Parsing a queue's configuration from the command line: `queue create`'s flags and
//! `queue config --set FIELD=VALUE`.

use anyhow::{Context as _, bail};
use piecework::queue_doc::{ConfigPatch, Order};

/// `lifo` or `fifo`.
pub(crate) fn parse_order(s: &str) -> Result<Order, String> {
    match s {
        "fifo" => Ok(Order::Fifo),
        "lifo" => Ok(Order::Lifo),
        _ => Err(format!("{s:?} is not an order: use fifo or lifo")),
    }
}

/// A duration in humantime form (`30s`, `5m`, `250ms`), in milliseconds.
pub(crate) fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 30s, 5m or 250ms: {e}"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too long"))
}

/// `queue config --set` arguments as a configuration change.
pub(crate) fn config_patch(set: &[String]) -> anyhow::Result<ConfigPatch> {
    const DURATIONS: [&str; 9] = [
        "rate_interval",
        "timeout",
        "lease",
        "retry_backoff",
        "retry_backoff_max",
        "heartbeat",
        "takeover_after",
        "settle",
        "pool_heartbeat",
    ];
    let mut fields = serde_json::Map::new();
    for arg in set {
        let Some((field, value)) = arg.split_once('=') else {
            bail!("--set {arg:?}: expected FIELD=VALUE, such as concurrency=4 or lease=30s");
        };
        let (key, value) = match field {
            "order" => (
                field.to_owned(),
                serde_json::json!(parse_order(value).map_err(anyhow::Error::msg)?),
            ),
            "failure_policy" => (
                field.to_owned(),
                serde_json::from_str::<serde_json::Value>(value).with_context(|| {
                    format!(
                        "--set failure_policy: {value:?} is not JSON, such as \
                         '{{\"logo\": \"ignore\"}}'"
                    )
                })?,
            ),
            "concurrency" | "max_attempts" => {
                (
                    field.to_owned(),
                    serde_json::json!(value.parse::<u32>().with_context(|| format!(
                        "--set {field}: {value:?} is not a whole number"
                    ))?),
                )
            }
            d if DURATIONS.contains(&d) => (
                format!("{d}_ms"),
                serde_json::json!(
                    parse_duration_ms(value).map_err(|e| anyhow::anyhow!("--set {d}: {e}"))?
                ),
            ),
            other => bail!(
                "--set {other:?}: not a configuration field (order, concurrency, max_attempts, failure_policy, {})",
                DURATIONS.join(", ")
            ),
        };
        fields.insert(key, value);
    }
    Ok(serde_json::from_value(serde_json::Value::Object(fields))?)
}
