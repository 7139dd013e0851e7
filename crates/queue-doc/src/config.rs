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

/// What a worker does when a run of a kind fails ([`QueueConfig::failure_policy`]). As JSON:
/// `"retry"`, `"ignore"`, or `{"pause_resource": {"resource": "…", "restore_after_ms": n}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Retried with backoff up to `max_attempts` failures, then dead-lettered (the default).
    Retry,
    /// The task ends `failed` at once, without retries; its attempt's error starts with
    /// `ignored: ` ([`crate::Finished::ignored`]).
    Ignore,
    /// Tasks of the kind require `resource` (added to their rules when submitted); on a
    /// failure, the pool that saw it withdraws the resource and holds it again after
    /// `restore_after_ms`, and the attempt ends deferred (its error starts with `deferred: `,
    /// [`crate::Finished::deferred`]): it does not count towards `max_attempts`, and the task
    /// waits, blocked on the resource, until a pool holds it.
    PauseResource {
        /// The resource (a name like a tag).
        resource: String,
        /// When the pool holds it again (1 ms to 24 h).
        restore_after_ms: u64,
    },
}

/// The most kinds a queue's failure policy names.
pub const MAX_FAILURE_POLICIES: usize = 64;

impl FailurePolicy {
    /// Why the policy for `kind` cannot work, if it cannot.
    fn problem(&self, kind: &str) -> Option<String> {
        if kind.is_empty() || kind.len() > crate::entry::MAX_KEY_LEN {
            return Some(format!(
                "failure_policy: a kind is 1 to {} bytes",
                crate::entry::MAX_KEY_LEN
            ));
        }
        match self {
            FailurePolicy::PauseResource {
                resource,
                restore_after_ms,
            } => {
                if !crate::entry::valid_tag(resource) {
                    return Some(format!(
                        "failure_policy of {kind:?}: {resource:?} is not a resource name (1 to 64 ASCII letters, digits, '_', '-', '.' or ':')"
                    ));
                }
                if !(1..=QueueConfig::MAX_RETRY_BACKOFF_MS).contains(restore_after_ms) {
                    return Some(format!(
                        "failure_policy of {kind:?}: restore_after_ms ({restore_after_ms}) must be between 1 and {}",
                        QueueConfig::MAX_RETRY_BACKOFF_MS
                    ));
                }
                None
            }
            FailurePolicy::Retry | FailurePolicy::Ignore => None,
        }
    }
}

/// A queue's timings and scheduling limits. All durations are in milliseconds.
///
/// The defaults suit a LAN: a router heartbeat every 500 ms, takeover after 2.5 s of silence.
///
/// # Ranges
///
/// The configuration lives in the queue document, where any member can write any value. Every
/// field therefore has a documented range, and readers clamp what they read into it
/// ([`QueueConfig::clamped`]; [`QueueView::read`](crate::QueueView::read) does so), so that every
/// replica computes the same timers from the same document and no value can overflow a timer,
/// busy-loop a node or flood the network. [`QueueConfig::validate`] refuses values outside the
/// ranges, so a valid configuration reads back unchanged.
///
/// | field | min | max |
/// |---|---|---|
/// | `heartbeat_ms` | [`MIN_HEARTBEAT_MS`](Self::MIN_HEARTBEAT_MS) (10 ms) | [`MAX_HEARTBEAT_MS`](Self::MAX_HEARTBEAT_MS) (60 s) |
/// | `takeover_after_ms` | 2 × `heartbeat_ms` | [`MAX_TAKEOVER_AFTER_MS`](Self::MAX_TAKEOVER_AFTER_MS) (10 min) |
/// | `settle_ms` | [`MIN_SETTLE_MS`](Self::MIN_SETTLE_MS) (1 ms) | [`MAX_SETTLE_MS`](Self::MAX_SETTLE_MS) (60 s) |
/// | `pool_heartbeat_ms` | [`MIN_POOL_HEARTBEAT_MS`](Self::MIN_POOL_HEARTBEAT_MS) (10 ms) | [`MAX_POOL_HEARTBEAT_MS`](Self::MAX_POOL_HEARTBEAT_MS) (60 s) |
/// | `lease_ms` | 2 × `pool_heartbeat_ms` | [`MAX_LEASE_MS`](Self::MAX_LEASE_MS) (24 h) |
/// | `max_attempts` | [`MIN_MAX_ATTEMPTS`](Self::MIN_MAX_ATTEMPTS) (1) | [`MAX_MAX_ATTEMPTS`](Self::MAX_MAX_ATTEMPTS) (1,000) |
/// | `retry_backoff_ms` | [`MIN_RETRY_BACKOFF_MS`](Self::MIN_RETRY_BACKOFF_MS) (1 ms) | [`MAX_RETRY_BACKOFF_MS`](Self::MAX_RETRY_BACKOFF_MS) (24 h) |
/// | `retry_backoff_max_ms` | `retry_backoff_ms` | [`MAX_RETRY_BACKOFF_MS`](Self::MAX_RETRY_BACKOFF_MS) (24 h) |
/// | `concurrency` | 0 (no limit) | [`MAX_CONCURRENCY`](Self::MAX_CONCURRENCY) (1,000,000) |
/// | `rate_interval_ms` | 0 (no limit) | [`MAX_RATE_INTERVAL_MS`](Self::MAX_RATE_INTERVAL_MS) (24 h) |
/// | `timeout_ms` | 0 (no timeout) | [`MAX_TIMEOUT_MS`](crate::MAX_TIMEOUT_MS) (7 days) |
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
    /// A run of a task without its own `timeout_ms` that goes on this long is cancelled and
    /// recorded failed, "timed out after N ms" (0: no timeout).
    pub timeout_ms: u64,
    /// What a failed run of each kind leads to; kinds not named are retried (at most
    /// [`MAX_FAILURE_POLICIES`] kinds).
    pub failure_policy: std::collections::BTreeMap<String, FailurePolicy>,
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
            timeout_ms: 0,
            failure_policy: std::collections::BTreeMap::new(),
        }
    }
}

/// A queue configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A timing was zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// A value was outside its documented range (see [`QueueConfig`]).
    #[error("{field} ({value}) must be between {min} and {max}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// The configured value.
        value: u64,
        /// The least allowed value.
        min: u64,
        /// The greatest allowed value.
        max: u64,
    },
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
    /// The retry delay's cap is below its base.
    #[error("retry_backoff_max_ms ({max}) must be at least retry_backoff_ms ({base})")]
    BackoffCapBelowBase {
        /// The configured first retry delay.
        base: u64,
        /// The configured longest retry delay.
        max: u64,
    },
    /// A failure policy cannot work (the reason says why).
    #[error("{0}")]
    FailurePolicy(String),
}

// The relative minimums must fit under the absolute maximums, or clamping could not satisfy both.
const _: () = assert!(2 * QueueConfig::MAX_HEARTBEAT_MS <= QueueConfig::MAX_TAKEOVER_AFTER_MS);
const _: () = assert!(2 * QueueConfig::MAX_POOL_HEARTBEAT_MS <= QueueConfig::MAX_LEASE_MS);

impl QueueConfig {
    /// The shortest router heartbeat interval: a faster one would spend a node's time and the
    /// network's bandwidth on heartbeats (zero would busy-loop and flood gossip).
    pub const MIN_HEARTBEAT_MS: u64 = 10;
    /// The longest router heartbeat interval: beyond a minute a dead router goes unnoticed for
    /// too long.
    pub const MAX_HEARTBEAT_MS: u64 = 60_000;
    /// The longest takeover delay (10 minutes); the shortest is twice `heartbeat_ms`, so that a
    /// healthy router is not deposed between two heartbeats.
    pub const MAX_TAKEOVER_AFTER_MS: u64 = 600_000;
    /// The shortest settle wait: it must be positive for the claim to have a chance to
    /// propagate before the recheck.
    pub const MIN_SETTLE_MS: u64 = 1;
    /// The longest settle wait: a queue without an active router for longer serves nobody.
    pub const MAX_SETTLE_MS: u64 = 60_000;
    /// The shortest pool heartbeat interval, for the same reasons as
    /// [`MIN_HEARTBEAT_MS`](Self::MIN_HEARTBEAT_MS).
    pub const MIN_POOL_HEARTBEAT_MS: u64 = 10;
    /// The longest pool heartbeat interval: a new router waits one before routing.
    pub const MAX_POOL_HEARTBEAT_MS: u64 = 60_000;
    /// The longest lease (24 hours); the shortest is twice `pool_heartbeat_ms`, so that tasks
    /// are not re-routed away from healthy pools.
    pub const MAX_LEASE_MS: u64 = 86_400_000;
    /// The fewest attempts a task gets: it must be allowed to run once.
    pub const MIN_MAX_ATTEMPTS: u32 = 1;
    /// The most attempts a task gets: each one is kept in the queue document forever.
    pub const MAX_MAX_ATTEMPTS: u32 = 1_000;
    /// The shortest first retry delay: a positive one keeps a failing task from spinning.
    pub const MIN_RETRY_BACKOFF_MS: u64 = 1;
    /// The longest retry delay (24 hours), first or capped; it bounds every timer computed
    /// from a retry.
    pub const MAX_RETRY_BACKOFF_MS: u64 = 86_400_000;
    /// The longest rate interval (24 hours): one task a day.
    pub const MAX_RATE_INTERVAL_MS: u64 = 86_400_000;
    /// The greatest concurrency limit (0 means no limit); far beyond any real pool.
    pub const MAX_CONCURRENCY: u32 = 1_000_000;

    /// Checks that every value is within its range (see [`QueueConfig`]) and that the timings
    /// can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("takeover_after_ms", self.takeover_after_ms),
            ("settle_ms", self.settle_ms),
            ("pool_heartbeat_ms", self.pool_heartbeat_ms),
            ("lease_ms", self.lease_ms),
            ("max_attempts", u64::from(self.max_attempts)),
            ("retry_backoff_ms", self.retry_backoff_ms),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        let range = |field, value: u64, min: u64, max: u64| match (min..=max).contains(&value) {
            true => Ok(()),
            false => Err(ConfigError::OutOfRange {
                field,
                value,
                min,
                max,
            }),
        };
        range(
            "heartbeat_ms",
            self.heartbeat_ms,
            Self::MIN_HEARTBEAT_MS,
            Self::MAX_HEARTBEAT_MS,
        )?;
        range(
            "settle_ms",
            self.settle_ms,
            Self::MIN_SETTLE_MS,
            Self::MAX_SETTLE_MS,
        )?;
        range(
            "pool_heartbeat_ms",
            self.pool_heartbeat_ms,
            Self::MIN_POOL_HEARTBEAT_MS,
            Self::MAX_POOL_HEARTBEAT_MS,
        )?;
        range(
            "max_attempts",
            u64::from(self.max_attempts),
            u64::from(Self::MIN_MAX_ATTEMPTS),
            u64::from(Self::MAX_MAX_ATTEMPTS),
        )?;
        range(
            "retry_backoff_ms",
            self.retry_backoff_ms,
            Self::MIN_RETRY_BACKOFF_MS,
            Self::MAX_RETRY_BACKOFF_MS,
        )?;
        range(
            "rate_interval_ms",
            self.rate_interval_ms,
            0,
            Self::MAX_RATE_INTERVAL_MS,
        )?;
        range("timeout_ms", self.timeout_ms, 0, crate::MAX_TIMEOUT_MS)?;
        range(
            "concurrency",
            u64::from(self.concurrency),
            0,
            u64::from(Self::MAX_CONCURRENCY),
        )?;
        if self.takeover_after_ms < self.heartbeat_ms.saturating_mul(2) {
            return Err(ConfigError::TakeoverTooShort {
                takeover: self.takeover_after_ms,
                heartbeat: self.heartbeat_ms,
            });
        }
        range(
            "takeover_after_ms",
            self.takeover_after_ms,
            self.heartbeat_ms.saturating_mul(2),
            Self::MAX_TAKEOVER_AFTER_MS,
        )?;
        if self.lease_ms < self.pool_heartbeat_ms.saturating_mul(2) {
            return Err(ConfigError::LeaseTooShort {
                lease: self.lease_ms,
                pool_heartbeat: self.pool_heartbeat_ms,
            });
        }
        range(
            "lease_ms",
            self.lease_ms,
            self.pool_heartbeat_ms.saturating_mul(2),
            Self::MAX_LEASE_MS,
        )?;
        if self.retry_backoff_max_ms < self.retry_backoff_ms {
            return Err(ConfigError::BackoffCapBelowBase {
                base: self.retry_backoff_ms,
                max: self.retry_backoff_max_ms,
            });
        }
        range(
            "retry_backoff_max_ms",
            self.retry_backoff_max_ms,
            self.retry_backoff_ms,
            Self::MAX_RETRY_BACKOFF_MS,
        )?;
        if self.failure_policy.len() > MAX_FAILURE_POLICIES {
            return Err(ConfigError::FailurePolicy(format!(
                "failure_policy names at most {MAX_FAILURE_POLICIES} kinds"
            )));
        }
        if let Some(p) = self
            .failure_policy
            .iter()
            .find_map(|(kind, p)| p.problem(kind))
        {
            return Err(ConfigError::FailurePolicy(p));
        }
        Ok(())
    }

    /// The failure policy of `kind` (retry if the queue names none).
    pub fn policy_of(&self, kind: &str) -> &FailurePolicy {
        self.failure_policy
            .get(kind)
            .unwrap_or(&FailurePolicy::Retry)
    }

    /// This configuration with every field clamped into its range (see [`QueueConfig`]): the
    /// absolute ranges first, then the relative minimums (`takeover_after_ms` at least twice the
    /// clamped `heartbeat_ms`, `lease_ms` at least twice the clamped `pool_heartbeat_ms`,
    /// `retry_backoff_max_ms` at least the clamped `retry_backoff_ms`).
    ///
    /// The result always passes [`QueueConfig::validate`], and a configuration that passes it
    /// is returned unchanged. Pure: every replica clamps a document's values the same way.
    pub fn clamped(self) -> QueueConfig {
        let heartbeat_ms = self
            .heartbeat_ms
            .clamp(Self::MIN_HEARTBEAT_MS, Self::MAX_HEARTBEAT_MS);
        let pool_heartbeat_ms = self
            .pool_heartbeat_ms
            .clamp(Self::MIN_POOL_HEARTBEAT_MS, Self::MAX_POOL_HEARTBEAT_MS);
        let retry_backoff_ms = self
            .retry_backoff_ms
            .clamp(Self::MIN_RETRY_BACKOFF_MS, Self::MAX_RETRY_BACKOFF_MS);
        QueueConfig {
            heartbeat_ms,
            takeover_after_ms: self
                .takeover_after_ms
                .clamp(2 * heartbeat_ms, Self::MAX_TAKEOVER_AFTER_MS),
            settle_ms: self
                .settle_ms
                .clamp(Self::MIN_SETTLE_MS, Self::MAX_SETTLE_MS),
            pool_heartbeat_ms,
            lease_ms: self
                .lease_ms
                .clamp(2 * pool_heartbeat_ms, Self::MAX_LEASE_MS),
            max_attempts: self
                .max_attempts
                .clamp(Self::MIN_MAX_ATTEMPTS, Self::MAX_MAX_ATTEMPTS),
            retry_backoff_ms,
            retry_backoff_max_ms: self
                .retry_backoff_max_ms
                .clamp(retry_backoff_ms, Self::MAX_RETRY_BACKOFF_MS),
            concurrency: self.concurrency.min(Self::MAX_CONCURRENCY),
            rate_interval_ms: self.rate_interval_ms.min(Self::MAX_RATE_INTERVAL_MS),
            order: self.order,
            timeout_ms: self.timeout_ms.min(crate::MAX_TIMEOUT_MS),
            failure_policy: self
                .failure_policy
                .into_iter()
                .filter(|(kind, p)| p.problem(kind).is_none())
                .take(MAX_FAILURE_POLICIES)
                .collect(),
        }
    }

    /// The delay before retrying after `failures` failed attempts (`failures >= 1`):
    /// `retry_backoff_ms * 2^(failures-1)`, capped at `retry_backoff_max_ms`.
    pub fn retry_delay_ms(&self, failures: u32) -> u64 {
        let shift = failures.saturating_sub(1).min(32);
        self.retry_backoff_ms
            .saturating_mul(1u64 << shift)
            .min(self.retry_backoff_max_ms)
    }

    /// The delay before retrying `task` after `failures` failed attempts, the last of them
    /// numbered `n`: [`retry_delay_ms`](Self::retry_delay_ms) with "equal jitter", its first
    /// half fixed and its second half spread by a hash of `(task, n)`. Tasks that fail
    /// together retry apart, and every router computes the same delay for one failure.
    pub fn retry_delay_jittered_ms(&self, failures: u32, task: &crate::TaskId, n: u64) -> u64 {
        let delay = self.retry_delay_ms(failures);
        let half = delay / 2;
        let spread = delay - half;
        half + jitter(task.as_str(), n) % spread.saturating_add(1)
    }
}

/// A hash of `(task, n)` that every version and platform computes alike (64-bit FNV-1a).
fn jitter(task: &str, n: u64) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in task.bytes().chain(n.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
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
    fn out_of_range_values_are_refused_and_clamped() {
        let c = QueueConfig {
            heartbeat_ms: QueueConfig::MAX_HEARTBEAT_MS + 1,
            takeover_after_ms: u64::MAX,
            ..QueueConfig::default()
        };
        assert!(matches!(
            c.validate(),
            Err(ConfigError::OutOfRange {
                field: "heartbeat_ms",
                ..
            })
        ));
        let clamped = c.clamped();
        assert_eq!(clamped.heartbeat_ms, QueueConfig::MAX_HEARTBEAT_MS);
        assert_eq!(
            clamped.takeover_after_ms,
            QueueConfig::MAX_TAKEOVER_AFTER_MS
        );
        clamped.validate().unwrap();
        let c = QueueConfig {
            retry_backoff_ms: 5_000,
            retry_backoff_max_ms: 1_000,
            ..QueueConfig::default()
        };
        assert_eq!(
            c.validate(),
            Err(ConfigError::BackoffCapBelowBase {
                base: 5_000,
                max: 1_000
            })
        );
        assert_eq!(c.clamped().retry_backoff_max_ms, 5_000);
        assert_eq!(
            QueueConfig::default().clamped(),
            QueueConfig::default(),
            "a valid config is left as it is"
        );
    }

    #[test]
    fn retry_delay_doubles_up_to_the_cap() {
        let c = QueueConfig::default();
        assert_eq!(c.retry_delay_ms(1), 1_000);
        assert_eq!(c.retry_delay_ms(2), 2_000);
        assert_eq!(c.retry_delay_ms(3), 4_000);
        assert_eq!(c.retry_delay_ms(40), 60_000);
    }

    #[test]
    fn jittered_retry_delays_spread_over_the_upper_half_and_repeat_for_one_failure() {
        let c = QueueConfig::default();
        let delays: Vec<u64> = (0..200)
            .map(|i| c.retry_delay_jittered_ms(2, &crate::TaskId::new(format!("t{i}")), 2))
            .collect();
        assert!(
            delays.iter().all(|d| (1_000..=2_000).contains(d)),
            "{delays:?}"
        );
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 150, "tasks that fail together retry apart");
        let t = crate::TaskId::new("t7");
        assert_eq!(
            c.retry_delay_jittered_ms(2, &t, 2),
            c.retry_delay_jittered_ms(2, &t, 2)
        );
        assert_ne!(
            c.retry_delay_jittered_ms(2, &t, 2),
            c.retry_delay_jittered_ms(2, &t, 3)
        );
        // The fixed value this hash gives, so that a change of it shows here: every router
        // of a queue must compute the same delay.
        assert_eq!(jitter("t7", 2), 0x40ef41fd1386fd3e);
    }
}
