//! The documents' key names, in one place so that readers and writers agree.

pub(crate) const SCHEMA: &str = "schema";
pub(crate) const VERSION: &str = "version";
pub(crate) const QUEUE_SCHEMA: &str = "piecework/queue";
pub(crate) const TASK_SCHEMA: &str = "piecework/task";
pub(crate) const SCHEMA_VERSION: u64 = 1;
/// The queue document's schema version: 2 writes the packed layout (`packed.rs`).
pub(crate) const QUEUE_VERSION: u64 = 2;

pub(crate) const NAME: &str = "name";
pub(crate) const CONFIG: &str = "config";
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const CREATOR: &str = "creator";
/// The creator's ed25519 public key (hex): present in queues whose membership is signed
/// ([`crate::membership`]); a queue without it was made before, and its listed members count.
pub(crate) const CREATOR_KEY: &str = "creator_key";
/// The queue's id, in its first document (later ones name it as their `origin`).
pub(crate) const QUEUE_ID: &str = "queue_id";
pub(crate) const MEMBERS: &str = "members";
pub(crate) const ROLE: &str = "role";
pub(crate) const ADDRS: &str = "addrs";
pub(crate) const JOINED_AT: &str = "joined_at";
pub(crate) const ROUTER: &str = "router";
pub(crate) const TERM: &str = "term";
pub(crate) const PEER: &str = "peer";
pub(crate) const CLAIMED_AT: &str = "claimed_at";
/// The chained router claims: `TERM/PEER` → a packed [`crate::view::PackedClaim`].
pub(crate) const CLAIMS: &str = "claims";
pub(crate) const PAUSED: &str = "paused";
pub(crate) const TASKS: &str = "tasks";

pub(crate) const QUEUE: &str = "queue";
pub(crate) const KIND: &str = "kind";
pub(crate) const INPUT: &str = "input";
pub(crate) const SUBMITTED_AT: &str = "submitted_at";
pub(crate) const SUBMITTER: &str = "submitter";
pub(crate) const PRIORITY: &str = "priority";
pub(crate) const URGENT: &str = "urgent";
pub(crate) const MAX_ATTEMPTS: &str = "max_attempts";
pub(crate) const ATTEMPTS: &str = "attempts";
pub(crate) const INPUT_SEEN: &str = "input_seen";

pub(crate) const N: &str = "n";
pub(crate) const WORKER: &str = "worker";
pub(crate) const ASSIGNED_AT: &str = "assigned_at";
/// The incarnation of the worker's pool an assignment is addressed to (absent in attempts
/// written before assignments named one).
pub(crate) const POOL_INCARNATION: &str = "pool_incarnation";
pub(crate) const START: &str = "start";
pub(crate) const FINISH: &str = "finish";
pub(crate) const AT: &str = "at";
pub(crate) const INCARNATION: &str = "incarnation";
pub(crate) const OUTCOME: &str = "outcome";
pub(crate) const ERROR: &str = "error";

pub(crate) const RUNS: &str = "runs";
pub(crate) const RESULT: &str = "result";
pub(crate) const PROGRESS: &str = "progress";
pub(crate) const LOGS: &str = "logs";

// Epochs (`epoch.rs`, `chain.rs`).
pub(crate) const EPOCH: &str = "epoch";
pub(crate) const ORIGIN: &str = "origin";
pub(crate) const PREV: &str = "prev";
pub(crate) const PREV_HEADS: &str = "prev_heads";
pub(crate) const SEALS: &str = "seals";
pub(crate) const LATEST: &str = "latest";
pub(crate) const LINEAGE: &str = "lineage";
/// Root map of a successor: for each document carried into it directly, the heads of that
/// document whose writes have been carried ([`carry`](crate::epoch::carry)'s `mark`).
pub(crate) const CARRIED_FROM: &str = "carried_from";
/// Root map of a queue document: for each earlier document of its queue whose writes its
/// chain absorbed (sealed into a successor, or carried), a [`Cover`](crate::epoch::Cover) of
/// those writes.
pub(crate) const COVERED: &str = "covered";
pub(crate) const RETIRED: &str = "retired";
/// Root key of a successor, written last when it is built: its operation id bounds the build's
/// operations, which readers count as copies of the predecessor's judged state.
pub(crate) const BUILT: &str = "built";
