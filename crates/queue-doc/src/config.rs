//! A queue's configuration, stored in its queue document so that every router continues it.

use serde::{Deserialize, Serialize};

/// Which of two tasks of equal priority runs first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Oldest first (a queue).
    #[default]
    Fifo,
    /// Newest first (a stack).
    Lifo,
}

impl Order {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Order::Fifo => "fifo",
            Order::Lifo => "lifo",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Order> {
        match s {
            "fifo" => Some(Order::Fifo),
            "lifo" => Some(Order::Lifo),
            _ => None,
        }
    }
}

/// A queue's timings and scheduling limits. All durations are in milliseconds.
///
/// The defaults suit a LAN: a router heartbeat every 500 ms, takeover after 2.5 s of silence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueConfig {
    /// How often the active router broadcasts its heartbeat.
    pub heartbeat_ms: u64,
    /// How long a follower waits without hearing the effective router before it claims.
    pub takeover_after_ms: u64,
    /// How long a claimant waits for its claim to propagate before it re-reads the document.
    pub settle_ms: u64,
    /// How often pools broadcast their workers' states. A new router waits one such interval
    /// before routing, to learn what is already running.
    pub pool_heartbeat_ms: u64,
    /// A task whose worker's pool has been silent this long is routed again.
    pub lease_ms: u64,
    /// Failed attempts (errors, panics, interruptions) after which a task fails for good.
    pub max_attempts: u32,
    /// The delay before the first retry; it doubles with each further failure.
    pub retry_backoff_ms: u64,
    /// The longest delay between retries.
    pub retry_backoff_max_ms: u64,
    /// At most this many tasks assigned or running at once across the queue (0: no limit).
    pub concurrency: u32,
    /// At most one task start per this interval across the queue (0: no limit).
    pub rate_interval_ms: u64,
    /// Which of two tasks of equal priority runs first.
    pub order: Order,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            heartbeat_ms: 500,
            takeover_after_ms: 2_500,
            settle_ms: 500,
            pool_heartbeat_ms: 500,
            lease_ms: 10_000,
            max_attempts: 3,
            retry_backoff_ms: 1_000,
            retry_backoff_max_ms: 60_000,
            concurrency: 0,
            rate_interval_ms: 0,
            order: Order::Fifo,
        }
    }
}

/// A queue configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A timing was zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Followers would take over from a router that is merely between two heartbeats.
    #[error(
        "takeover_after_ms ({takeover}) must be at least twice heartbeat_ms ({heartbeat}), or a healthy router would be deposed"
    )]
    TakeoverTooShort {
        /// The configured takeover delay.
        takeover: u64,
        /// The configured heartbeat interval.
        heartbeat: u64,
    },
    /// Tasks would be re-routed away from healthy pools.
    #[error("lease_ms ({lease}) must be at least twice pool_heartbeat_ms ({pool_heartbeat})")]
    LeaseTooShort {
        /// The configured lease.
        lease: u64,
        /// The configured pool heartbeat interval.
        pool_heartbeat: u64,
    },
}

impl QueueConfig {
    /// Checks that the timings can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("takeover_after_ms", self.takeover_after_ms),
            ("settle_ms", self.settle_ms),
            ("pool_heartbeat_ms", self.pool_heartbeat_ms),
            ("lease_ms", self.lease_ms),
            ("max_attempts", u64::from(self.max_attempts)),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if self.takeover_after_ms < 2 * self.heartbeat_ms {
            return Err(ConfigError::TakeoverTooShort {
                takeover: self.takeover_after_ms,
                heartbeat: self.heartbeat_ms,
            });
        }
        if self.lease_ms < 2 * self.pool_heartbeat_ms {
            return Err(ConfigError::LeaseTooShort {
                lease: self.lease_ms,
                pool_heartbeat: self.pool_heartbeat_ms,
            });
        }
        Ok(())
    }

    /// The delay before retrying after `failures` failed attempts (`failures >= 1`):
    /// `retry_backoff_ms * 2^(failures-1)`, capped at `retry_backoff_max_ms`.
    pub fn retry_delay_ms(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(32);
        self.retry_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.retry_backoff_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        QueueConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_timings_are_refused() {
        let c = QueueConfig {
            takeover_after_ms: 600,
            ..QueueConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::TakeoverTooShort { .. })
        ));
        let c = QueueConfig {
            settle_ms: 0,
            ..QueueConfig::default()
        };
        assert_eq!(c.validate(), Err(ConfigError::Zero("settle_ms")));
    }

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let c = QueueConfig::default();
        assert_eq!(c.retry_delay_ms(1), 1_000);
        assert_eq!(c.retry_delay_ms(2), 2_000);
        assert_eq!(c.retry_delay_ms(3), 4_000);
        assert_eq!(c.retry_delay_ms(40), 60_000);
    }
}
