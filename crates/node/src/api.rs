//! The node's API types: what [`crate::NodeHandle`] and the HTTP API take and return, as JSON.

use piecework_queue_doc::task::Run;
use piecework_queue_doc::{
    Attempt, Claim, QueueConfig, QueueId, RunningReport, StateCounts, TaskId, TaskState,
};
use serde::{Deserialize, Serialize};

/// `POST /v1/queues`: create a queue.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CreateQueue {
    /// The queue's name.
    pub name: String,
    /// Its configuration; the defaults if absent.
    #[serde(default)]
    pub config: Option<QueueConfig>,
}

/// A queue id, as returned on creation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Created {
    /// The new queue's id.
    pub queue_id: QueueId,
}

/// `POST /v1/queues/{id}/tasks`: submit a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SubmitTask {
    /// The handler kind.
    pub kind: String,
    /// The handler's input.
    #[serde(default)]
    pub input: serde_json::Value,
    /// Relative priority in `[-99999, 99999]`.
    #[serde(default)]
    pub priority: i64,
    /// Run before every non-urgent task.
    #[serde(default)]
    pub urgent: bool,
    /// Failed attempts before dead-lettering; the queue's default if absent.
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

/// A submitted task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Submitted {
    /// The task's id.
    pub task_id: TaskId,
    /// Whether a connected peer held the task before the submit returned. `false` means only
    /// this node has it for now (it was offline, or peers were slow): it is durable here and
    /// spreads when peers are reachable.
    pub replicated: bool,
}

/// One queue as this node sees it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QueueStatus {
    /// The queue's id.
    pub id: QueueId,
    /// Its name.
    pub name: String,
    /// The effective router, per this node's replica.
    pub router: Option<Claim>,
    /// This node's router role: `follower`, `claiming` or `active`.
    pub role: String,
    /// Members.
    pub members: usize,
    /// Whether routing is paused.
    pub paused: bool,
    /// Task counts by state.
    pub tasks: StateCounts,
    /// The queue's configuration.
    pub config: QueueConfig,
}

/// One of this node's workers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// The worker's name (`<peer>/<index>`).
    pub name: String,
    /// What it runs, if anything.
    pub running: Option<RunningReport>,
}

/// `GET /v1/status`: this node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeStatus {
    /// This node's peer id.
    pub peer_id: String,
    /// How many times this node has started.
    pub incarnation: u64,
    /// Addresses it listens on.
    pub listen: Vec<String>,
    /// Connected peers.
    pub connected: Vec<String>,
    /// Handler kinds this node runs.
    pub kinds: Vec<String>,
    /// Its queues.
    pub queues: Vec<QueueStatus>,
    /// Its workers.
    pub workers: Vec<WorkerStatus>,
    /// Documents held in memory (queues and live tasks; finished tasks' stay on disk).
    pub documents_loaded: usize,
}

/// `GET /v1/tasks/{id}`: a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task's id.
    pub id: TaskId,
    /// Its queue.
    pub queue: QueueId,
    /// Its kind.
    pub kind: String,
    /// Its state, per this node's replica of the queue.
    pub state: TaskState,
    /// Wall-clock submit time (unix ms).
    pub submitted_at: u64,
    /// The submitter.
    pub submitter: String,
    /// Its input.
    pub input: serde_json::Value,
    /// The result of the first successful run, once this node has it.
    pub result: Option<serde_json::Value>,
    /// The last error, if an attempt failed.
    pub error: Option<String>,
    /// Every attempt (from the queue document).
    pub attempts: Vec<Attempt>,
    /// Every run (from the task document).
    pub runs: Vec<Run>,
}

/// An error from the HTTP API.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ApiError {
    /// What went wrong.
    pub error: String,
}
