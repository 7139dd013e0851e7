//! The queue's settings that any member changes at run time: the pause flag and each field of
//! the configuration.
//!
//! Each setting is a register: its value, and beside it the wall time of the write that set it
//! (`paused_at` at the root; `<field>_at` in the `config` map, which exists from the queue's
//! first change). A write puts both in one change, so within one document the same write wins
//! both keys (Automerge resolves a conflict by operation id, and each writer's two operations
//! are consecutive). Fields are separate registers: two members that change different fields
//! at once both keep their change.
//!
//! A write's time is the writer's wall clock, or just after the time it overwrites if that is
//! later: within a document a write always outranks what it replaced.
//!
//! Across epochs, a setting written into a document after its seal (a late write) is carried
//! into the successor when its `(time, value)` is greater than the successor's
//! ([`carry_settings`]; values compare as text when times are equal): the successor ends with
//! the greater of the two documents' registers, whichever order and however often they are
//! carried. A rotation copies each register whole, times included. Documents written before
//! registers had times read as time 0.

use automerge::transaction::{Transactable, Transaction};
use automerge::{Automerge, ObjId, ObjType, ROOT, ReadDoc, ScalarValue};
use serde::{Deserialize, Serialize};

use crate::config::{ConfigError, Order, QueueConfig};
use crate::judge::{Judge, Right};
use crate::queue::WriteError;
use crate::{am, keys};

/// The key beside the pause flag that holds the time of its write.
pub(crate) const PAUSED_AT: &str = "paused_at";

/// The configuration's fields as the document names them, in the order they are written.
pub(crate) const CONFIG_FIELDS: [&str; 13] = [
    "heartbeat_ms",
    "takeover_after_ms",
    "settle_ms",
    "pool_heartbeat_ms",
    "lease_ms",
    "max_attempts",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "concurrency",
    "rate_interval_ms",
    "order",
    "timeout_ms",
    "failure_policy",
];

/// A change to some of a queue's configuration fields; the others keep their values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigPatch {
    /// See [`QueueConfig::heartbeat_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    /// See [`QueueConfig::takeover_after_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub takeover_after_ms: Option<u64>,
    /// See [`QueueConfig::settle_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settle_ms: Option<u64>,
    /// See [`QueueConfig::pool_heartbeat_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_heartbeat_ms: Option<u64>,
    /// See [`QueueConfig::lease_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// See [`QueueConfig::max_attempts`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// See [`QueueConfig::retry_backoff_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_backoff_ms: Option<u64>,
    /// See [`QueueConfig::retry_backoff_max_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_backoff_max_ms: Option<u64>,
    /// See [`QueueConfig::concurrency`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// See [`QueueConfig::rate_interval_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_interval_ms: Option<u64>,
    /// See [`QueueConfig::order`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Order>,
    /// See [`QueueConfig::timeout_ms`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// See [`QueueConfig::failure_policy`]: the whole map, replacing the queue's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<std::collections::BTreeMap<String, crate::FailurePolicy>>,
}

impl ConfigPatch {
    /// `config` with this patch's fields set.
    pub fn apply(&self, config: &QueueConfig) -> QueueConfig {
        let mut c = config.clone();
        let set = |v: &mut u64, p: Option<u64>| *v = p.unwrap_or(*v);
        set(&mut c.heartbeat_ms, self.heartbeat_ms);
        set(&mut c.takeover_after_ms, self.takeover_after_ms);
        set(&mut c.settle_ms, self.settle_ms);
        set(&mut c.pool_heartbeat_ms, self.pool_heartbeat_ms);
        set(&mut c.lease_ms, self.lease_ms);
        set(&mut c.retry_backoff_ms, self.retry_backoff_ms);
        set(&mut c.retry_backoff_max_ms, self.retry_backoff_max_ms);
        set(&mut c.rate_interval_ms, self.rate_interval_ms);
        set(&mut c.timeout_ms, self.timeout_ms);
        c.max_attempts = self.max_attempts.unwrap_or(c.max_attempts);
        c.concurrency = self.concurrency.unwrap_or(c.concurrency);
        c.order = self.order.unwrap_or(c.order);
        if let Some(p) = &self.failure_policy {
            c.failure_policy = p.clone();
        }
        c
    }

    /// Whether the patch sets no field.
    pub fn is_empty(&self) -> bool {
        *self == ConfigPatch::default()
    }

    /// The fields it sets, by the document's names, with their values as written.
    fn fields(&self) -> Vec<(&'static str, ScalarValue)> {
        let u = |name, v: Option<u64>| v.map(|v| (name, ScalarValue::Uint(v)));
        [
            u("heartbeat_ms", self.heartbeat_ms),
            u("takeover_after_ms", self.takeover_after_ms),
            u("settle_ms", self.settle_ms),
            u("pool_heartbeat_ms", self.pool_heartbeat_ms),
            u("lease_ms", self.lease_ms),
            u("max_attempts", self.max_attempts.map(u64::from)),
            u("retry_backoff_ms", self.retry_backoff_ms),
            u("retry_backoff_max_ms", self.retry_backoff_max_ms),
            u("concurrency", self.concurrency.map(u64::from)),
            u("rate_interval_ms", self.rate_interval_ms),
            u("timeout_ms", self.timeout_ms),
            self.order
                .map(|o| ("order", ScalarValue::Str(o.as_str().into()))),
            self.failure_policy
                .as_ref()
                .map(|p| ("failure_policy", ScalarValue::Str(policy_text(p).into()))),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Why a configuration change was not written.
#[derive(Debug, thiserror::Error)]
pub enum SetConfigError {
    /// The configuration it would give cannot work (a value out of its range, or timings that
    /// do not fit together); nothing was written.
    #[error("invalid queue configuration: {0}")]
    Invalid(#[from] ConfigError),
    /// The document could not take the change.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Pauses or resumes routing, as of `now_ms` (wall time).
pub fn set_paused(doc: &mut Automerge, paused: bool, now_ms: u64) -> Result<(), WriteError> {
    doc.transact(|tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let at = after(am::uint(tx, &ROOT, PAUSED_AT), now_ms);
        put_fresh(tx, &ROOT, keys::PAUSED, ScalarValue::Boolean(paused))?;
        tx.put(ROOT, PAUSED_AT, at)?;
        Ok(())
    })
    .map(|_| ())
    .map_err(|f| f.error)
}

/// Sets the fields `patch` names, as of `now_ms` (wall time), after checking that the
/// configuration they give with the document's other fields is valid. Returns that
/// configuration.
pub fn set_config(
    doc: &mut Automerge,
    patch: &ConfigPatch,
    now_ms: u64,
) -> Result<QueueConfig, SetConfigError> {
    let current = crate::view::read_config_of(doc).ok_or(WriteError::NotAQueue)?;
    let next = patch.apply(&current);
    next.validate()?;
    doc.transact(|tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let obj = match am::object(tx, &ROOT, keys::CONFIG, ObjType::Map) {
            Some(o) => o,
            None => return Err(WriteError::NotAQueue),
        };
        for (name, value) in patch.fields() {
            let at = after(am::uint(tx, &obj, &at_key(name)), now_ms);
            put_fresh(tx, &obj, name, value)?;
            tx.put(&obj, at_key(name), at)?;
        }
        Ok(())
    })
    .map_err(|f| f.error)?;
    Ok(next)
}

/// Puts `value` under `key` as a new operation of this writer's even when the key holds that
/// value already: Automerge writes nothing for a put of the value a key shows, which would
/// leave the value to its earlier writer, whom readers may not count (`judge.rs`).
fn put_fresh(
    tx: &mut Transaction<'_>,
    obj: &ObjId,
    key: &str,
    value: ScalarValue,
) -> Result<(), automerge::AutomergeError> {
    if am::scalar(tx, obj, key).as_ref() == Some(&value) {
        tx.delete(obj, key)?;
    }
    tx.put(obj, key, value)
}

/// The config map's key holding the boost of `tag`.
pub(crate) fn boost_key(tag: &str) -> String {
    format!("{BOOST}{tag}")
}

/// Prefix of the config map's boost registers: `boost/<tag>` holds a [`BoostRegister`], the
/// boost and the time of its write in one value, so that concurrent writes compare whole.
pub(crate) const BOOST: &str = "boost/";

/// A boost as written: its value and the time of the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct BoostRegister {
    /// The time of the write (unix ms; see [`after`]).
    pub(crate) t: u64,
    /// The boost.
    pub(crate) b: i64,
}

/// Every boost register of a document, by tag: among concurrent values of one, the greatest
/// `(time, boost)`. Unreadable values and invalid tags are skipped.
pub(crate) fn read_boost_registers<R: ReadDoc>(
    doc: &R,
    judge: &Judge<'_>,
) -> std::collections::BTreeMap<String, BoostRegister> {
    let mut out = std::collections::BTreeMap::new();
    let Some(obj) = am::object(doc, &ROOT, keys::CONFIG, ObjType::Map) else {
        return out;
    };
    let end = format!("{}0", &BOOST[..BOOST.len() - 1]);
    let keys: Vec<String> = doc
        .map_range(&obj, BOOST.to_owned()..end)
        .map(|item| item.key.to_string())
        .collect();
    for key in keys {
        let Some(tag) = key
            .strip_prefix(BOOST)
            .filter(|t| crate::entry::valid_tag(t))
        else {
            continue;
        };
        let best = doc
            .get_all(&obj, key.as_str())
            .unwrap_or_default()
            .into_iter()
            .filter(|(_, id)| judge.allows(id, Right::Work))
            .filter_map(|(v, _)| match v {
                automerge::Value::Scalar(s) => match s.as_ref() {
                    ScalarValue::Str(text) => crate::packed::decode::<BoostRegister>(text),
                    _ => None,
                },
                _ => None,
            })
            .max();
        if let Some(r) = best {
            out.insert(tag.to_owned(), r);
        }
    }
    out
}

/// Sets the boost of priority tag `tag` (0 removes it), as of `now_ms` (wall time).
pub fn set_boost(
    doc: &mut Automerge,
    tag: &str,
    boost: i64,
    now_ms: u64,
) -> Result<(), SetBoostError> {
    if !crate::entry::valid_tag(tag) {
        return Err(SetBoostError::BadTag(tag.to_owned()));
    }
    let max = crate::entry::MAX_BOOST;
    if !(-max..=max).contains(&boost) {
        return Err(SetBoostError::OutOfRange(boost));
    }
    let current = read_boost_registers(doc, &Judge::open())
        .get(tag)
        .map(|r| r.t);
    let reg = BoostRegister {
        t: after(current, now_ms),
        b: boost,
    };
    doc.transact(|tx| {
        if !is_queue(tx) {
            return Err(WriteError::NotAQueue);
        }
        let Some(obj) = am::object(tx, &ROOT, keys::CONFIG, ObjType::Map) else {
            return Err(WriteError::NotAQueue);
        };
        tx.put(&obj, boost_key(tag), crate::packed::encode(&reg))?;
        Ok(())
    })
    .map(|_| ())
    .map_err(|f| SetBoostError::Write(f.error))
}

/// Why a boost was not written.
#[derive(Debug, thiserror::Error)]
pub enum SetBoostError {
    /// Not a tag a task may carry.
    #[error("invalid tag {0:?}: tags are 1 to 64 ASCII letters, digits, '_', '-', '.' or ':'")]
    BadTag(String),
    /// Outside `[-1,000,000, 1,000,000]`.
    #[error("boost {0} is outside [-1000000, 1000000]")]
    OutOfRange(i64),
    /// The document could not take the change.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// Copies every register of `from` into the document being built (a successor: see
/// `epoch::build_successor`, which writes the config's values; this adds their times, and the
/// boosts whole).
pub(crate) fn copy_times(
    from: &Automerge,
    tx: &mut Transaction<'_>,
    config: &ObjId,
) -> Result<(), automerge::AutomergeError> {
    let regs = Registers::read(from);
    // A register never written since the queue was created keeps time 0 by having no time.
    if regs.paused.0 > 0 {
        tx.put(ROOT, PAUSED_AT, regs.paused.0)?;
    }
    for (name, (at, _, _)) in &regs.config {
        if *at > 0 {
            tx.put(config, at_key(name), *at)?;
        }
    }
    for (tag, reg) in read_boost_registers(from, &Judge::open()) {
        tx.put(config, boost_key(&tag), crate::packed::encode(&reg))?;
    }
    Ok(())
}

/// Writes into `tx` (a successor of `from`) each register of `from` whose `(time, value)` is
/// greater than the successor's: a late write of a setting reaches the successor, and the
/// greatest write wins whatever the order of carries. Returns how many registers it wrote.
pub(crate) fn carry_settings(
    from: &Automerge,
    tx: &mut Transaction<'_>,
) -> Result<usize, automerge::AutomergeError> {
    let theirs = Registers::read(from);
    let ours = Registers::read(&*tx);
    let mut n = 0;
    if theirs.paused > ours.paused
        && let Some(v) = theirs.paused_value.clone()
    {
        tx.put(ROOT, keys::PAUSED, v)?;
        tx.put(ROOT, PAUSED_AT, theirs.paused.0)?;
        n += 1;
    }
    let Some(obj) = am::object(&*tx, &ROOT, keys::CONFIG, ObjType::Map) else {
        return Ok(n);
    };
    for (name, (at, text, value)) in &theirs.config {
        let mine = ours
            .config
            .get(name)
            .map(|(a, t, _)| (*a, t.as_str()))
            .unwrap_or((0, ""));
        if (*at, text.as_str()) > mine
            && let Some(v) = value.clone()
        {
            tx.put(&obj, name.as_str(), v)?;
            tx.put(&obj, at_key(name), *at)?;
            n += 1;
        }
    }
    let ours = read_boost_registers(&*tx, &Judge::open());
    for (tag, reg) in read_boost_registers(from, &Judge::open()) {
        if ours.get(&tag).is_none_or(|o| reg > *o) {
            tx.put(&obj, boost_key(&tag), crate::packed::encode(&reg))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The time a write made at `now_ms` records over a register last written at `current`:
/// `now_ms`, or just after `current` if that is later (another member's clock ahead of this
/// one's), so that a write always outranks the ones it overwrites, and a carry never brings
/// back a value a later write in the successor replaced.
fn after(current: Option<u64>, now_ms: u64) -> u64 {
    now_ms.max(current.unwrap_or(0).saturating_add(1))
}

fn at_key(field: &str) -> String {
    format!("{field}_at")
}

fn is_queue<R: ReadDoc>(tx: &R) -> bool {
    am::string(tx, &ROOT, keys::SCHEMA).as_deref() == Some(keys::QUEUE_SCHEMA)
}

/// The settings' registers of a document: for each, `(time, value as text)` to compare, and
/// the value to write. `config` holds the config's fields and the boosts, by key.
struct Registers {
    paused: (u64, String),
    paused_value: Option<ScalarValue>,
    config: std::collections::BTreeMap<String, (u64, String, Option<ScalarValue>)>,
}

impl Registers {
    fn read<R: ReadDoc>(doc: &R) -> Registers {
        let paused_value = am::scalar(doc, &ROOT, keys::PAUSED);
        let paused = (
            am::uint(doc, &ROOT, PAUSED_AT).unwrap_or(0),
            paused_value
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
        );
        let obj = am::object(doc, &ROOT, keys::CONFIG, ObjType::Map);
        let mut config = std::collections::BTreeMap::new();
        for name in CONFIG_FIELDS.iter().map(|n| (*n).to_owned()) {
            let value = obj.as_ref().and_then(|o| am::scalar(doc, o, &name));
            let at = obj
                .as_ref()
                .and_then(|o| am::uint(doc, o, &at_key(&name)))
                .unwrap_or(0);
            let text = value.as_ref().map(ToString::to_string).unwrap_or_default();
            config.insert(name, (at, text, value));
        }
        Registers {
            paused,
            paused_value,
            config,
        }
    }
}

/// A failure policy map as the `config/failure_policy` register holds it: its JSON text.
pub(crate) fn policy_text(p: &std::collections::BTreeMap<String, crate::FailurePolicy>) -> String {
    serde_json::to_string(p).unwrap_or_else(|_| "{}".into())
}
