//! Handlers and the async runner: a registry of handlers by kind, and [`execute`], which runs
//! one in its own tokio task so that panics are caught and recorded as failures.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use piecework_queue_doc::{
    AttemptId, MAX_PLANNED, PlanError, Planned, PlannedTask, Progress, TaskId, WorkerId,
    follow_up_id,
};
use tokio_util::sync::CancellationToken;

/// The most log lines one run keeps; later lines are counted, not kept.
pub const MAX_LOG_LINES: usize = 1_000;
/// The longest log line kept, in bytes: a longer one is cut (at a character boundary) and
/// marked. Logs go into documents every member syncs.
pub const MAX_LOG_LINE_BYTES: usize = 4 * 1024;
/// The most log bytes one run keeps; later lines are counted, not kept.
pub const MAX_LOG_BYTES: usize = 64 * 1024;
/// The largest result a handler may return, as JSON text: a run whose result is larger
/// fails with "result too large" instead of writing it. A result goes into a document every
/// member syncs (the task's, or for an inline task its queue's), and a value too large to
/// sync would stop that document's replication.
pub const MAX_RESULT_BYTES: usize = 1024 * 1024;

/// An error a handler returns: the attempt fails with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

impl HandlerError {
    /// An error with this message.
    pub fn new(msg: impl fmt::Display) -> Self {
        HandlerError(msg.to_string())
    }
}

/// What a handler gets besides its input: which run this is, a log, and a cancellation token.
#[derive(Clone, Debug)]
pub struct Context {
    /// The task.
    pub task: TaskId,
    /// The attempt being run.
    pub attempt: AttemptId,
    /// The worker running it.
    pub worker: WorkerId,
    logs: Arc<Mutex<Logs>>,
    cancel: CancellationToken,
    number: u64,
    plans: Arc<Mutex<Plans>>,
    progress: Arc<tokio::sync::watch::Sender<Option<Progress>>>,
}

#[derive(Debug, Default)]
struct Plans {
    follow_ups: Vec<PlannedTask>,
    undo: Vec<PlannedTask>,
    bytes: usize,
}

impl Plans {
    /// Takes `p` into the follow-ups (or the undo tasks) if the run's limits allow it.
    fn take(&mut self, p: PlannedTask, undo: bool) -> Result<usize, HandlerError> {
        let list = if undo {
            &mut self.undo
        } else {
            &mut self.follow_ups
        };
        if list.len() >= MAX_PLANNED
            || self.bytes + p.bytes() > piecework_queue_doc::MAX_PLANNED_TOTAL_BYTES
        {
            return Err(HandlerError::new(PlanError::TooMany));
        }
        self.bytes += p.bytes();
        list.push(p);
        Ok(list.len() - 1)
    }
}

/// A task a handler asks for ([`Context::submit`], [`Context::undo`]): a kind, an input and
/// the options of a submit that apply to it.
#[derive(Clone, Debug, PartialEq)]
pub struct FollowUp {
    planned: PlannedTask,
    input: Result<String, String>,
}

impl FollowUp {
    /// A task of `kind` with `input`.
    pub fn new(kind: impl Into<String>, input: serde_json::Value) -> Self {
        FollowUp {
            planned: PlannedTask::new(kind, String::new()),
            input: serde_json::to_string(&input).map_err(|e| e.to_string()),
        }
    }

    /// With this relative priority (greater runs first).
    pub fn priority(mut self, priority: i64) -> Self {
        self.planned.priority = priority;
        self
    }

    /// Urgent: runs before every task that is not.
    pub fn urgent(mut self) -> Self {
        self.planned.urgent = true;
        self
    }

    /// With this priority tag (the queue's boost of it adds to the priority).
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.planned.rules.tags.push(tag.into());
        self
    }

    /// Needing this resource on the pool that runs it.
    pub fn requires(mut self, resource: impl Into<String>) -> Self {
        self.planned.rules.requires.push(resource.into());
        self
    }

    /// Not run before this wall-clock time (unix ms).
    pub fn not_before(mut self, unix_ms: u64) -> Self {
        self.planned.rules.not_before = unix_ms;
        self
    }

    /// With this many failed attempts before it is dead-lettered.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.planned.max_attempts = Some(n);
        self
    }

    /// With this run timeout.
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.planned.rules.timeout_ms = ms;
        self
    }

    fn planned(self) -> Result<PlannedTask, HandlerError> {
        let input = self.input.map_err(HandlerError)?;
        let p = PlannedTask {
            input,
            ..self.planned
        }
        .normalized();
        p.check().map_err(HandlerError::new)?;
        Ok(p)
    }
}

#[derive(Debug, Default)]
struct Logs {
    lines: Vec<String>,
    bytes: usize,
    dropped: usize,
}

impl Context {
    /// A context for one run.
    pub fn new(task: TaskId, attempt: AttemptId, worker: WorkerId) -> Self {
        Context {
            task,
            attempt,
            worker,
            logs: Arc::default(),
            cancel: CancellationToken::new(),
            number: 1,
            plans: Arc::default(),
            progress: Arc::new(tokio::sync::watch::channel(None).0),
        }
    }

    /// Submits a follow-up task: it is indexed in the same change as this run's success, so
    /// that no member ever sees one without the other, and dropped if the run does not
    /// succeed. Its id, returned, is derived from (this task, the follow-up's index), so that
    /// another successful run of this task makes the same task, not a second one.
    ///
    /// At most [`MAX_PLANNED`] per run, each input at most
    /// [`piecework_queue_doc::MAX_PLANNED_INPUT_BYTES`] of JSON, and
    /// [`piecework_queue_doc::MAX_PLANNED_TOTAL_BYTES`] for a run's follow-up and undo tasks
    /// together; tags and resources valid. A call made after the handler returned (from a task
    /// it spawned) is not kept.
    pub fn submit(&self, task: FollowUp) -> Result<TaskId, HandlerError> {
        let p = task.planned()?;
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        let index = plans.take(p, false)?;
        Ok(follow_up_id(&self.task, index))
    }

    /// Records a task that undoes this run, kept with its success: an `undo` of the task
    /// submits the tasks recorded (ids derived from (this task, index)). Dropped if the run
    /// does not succeed. Limits as [`Context::submit`].
    pub fn undo(&self, task: FollowUp) -> Result<(), HandlerError> {
        let p = task.planned()?;
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        plans.take(p, true).map(|_| ())
    }

    /// Reports how far the run is: members see it while the task runs (it travels with the
    /// pool's heartbeats), and the run's record keeps the last one.
    pub fn progress(&self, progress: Progress) {
        self.progress.send_replace(Some(progress));
    }

    /// The progress reports of this run, as they come (for the driver that carries them).
    pub fn watch_progress(&self) -> tokio::sync::watch::Receiver<Option<Progress>> {
        self.progress.subscribe()
    }

    fn take_planned(&self) -> Planned {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        Planned {
            follow_ups: std::mem::take(&mut plans.follow_ups),
            undo: std::mem::take(&mut plans.undo),
            progress: *self.progress.borrow(),
        }
    }

    /// This context, as the `number`-th run of its task ([`Context::attempt`]).
    pub fn with_attempt(mut self, number: u64) -> Self {
        self.number = number;
        self
    }

    /// Which run of the task this is over its whole life, this one included: 1 for the first.
    /// Runs refused before they started do not count, and a requeue does not reset it.
    pub fn attempt(&self) -> u64 {
        self.number
    }

    /// Appends a line to the run's log (kept in the task document's run record).
    ///
    /// At most [`MAX_LOG_LINES`] lines and [`MAX_LOG_BYTES`] bytes are kept, each line cut to
    /// [`MAX_LOG_LINE_BYTES`]; the lines beyond are counted, and the count is the log's last
    /// line.
    pub fn log(&self, line: impl Into<String>) {
        let mut line = line.into();
        if line.len() > MAX_LOG_LINE_BYTES {
            let mut cut = MAX_LOG_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            let more = line.len() - cut;
            line.truncate(cut);
            line.push_str(&format!(" (… {more} more bytes cut)"));
        }
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        if logs.lines.len() < MAX_LOG_LINES && logs.bytes + line.len() <= MAX_LOG_BYTES {
            logs.bytes += line.len();
            logs.lines.push(line);
        } else {
            logs.dropped += 1;
        }
    }

    /// The token that is cancelled when the run should stop (its task was cancelled, or the run
    /// went past its timeout); handlers check it cooperatively. A handler that goes on has its
    /// end recorded without it after a grace time, and its worker stays busy until it returns.
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    fn take_logs(&self) -> Vec<String> {
        let mut logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines = std::mem::take(&mut logs.lines);
        if logs.dropped > 0 {
            lines.push(format!("({} more lines dropped)", logs.dropped));
        }
        lines
    }
}

/// A task handler: an async function of (context, input) to a result.
pub trait Handler: Send + Sync + 'static {
    /// Runs the task.
    fn call(
        &self,
        ctx: Context,
        input: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, HandlerError>>;
}

impl<F, Fut> Handler for F
where
    F: Fn(Context, serde_json::Value) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<serde_json::Value, HandlerError>> + Send + 'static,
{
    fn call(
        &self,
        ctx: Context,
        input: serde_json::Value,
    ) -> BoxFuture<'static, Result<serde_json::Value, HandlerError>> {
        Box::pin(self(ctx, input))
    }
}

/// Handlers by kind.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.handlers.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// Registers `handler` for `kind`, replacing any earlier one.
    pub fn register(&mut self, kind: impl Into<String>, handler: impl Handler) -> &mut Self {
        self.handlers.insert(kind.into(), Arc::new(handler));
        self
    }

    /// The handler for `kind`.
    pub fn get(&self, kind: &str) -> Option<Arc<dyn Handler>> {
        self.handlers.get(kind).cloned()
    }

    /// The registered kinds.
    pub fn kinds(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }
}

/// How a run ended, with what the task document records of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The result, or the error message.
    pub result: Result<serde_json::Value, String>,
    /// The run's log lines.
    pub logs: Vec<String>,
    /// Its follow-ups, undo tasks and last progress.
    pub planned: Planned,
}

/// Runs the handler for `kind` in its own tokio task and waits for it. A missing handler, an
/// error, a panic and a result over [`MAX_RESULT_BYTES`] all come back as `Err` with a
/// message; nothing escapes.
pub async fn execute(
    registry: &Registry,
    kind: &str,
    ctx: Context,
    input: serde_json::Value,
) -> Outcome {
    let Some(handler) = registry.get(kind) else {
        return Outcome {
            result: Err(format!("no handler for kind {kind:?} on this node")),
            logs: vec![],
            planned: Planned::default(),
        };
    };
    let task = tokio::spawn(handler.call(ctx.clone(), input));
    let result = match task.await {
        Ok(Ok(v)) => match serde_json::to_string(&v).map(|t| t.len()) {
            Ok(len) if len > MAX_RESULT_BYTES => Err(format!(
                "result too large: {len} bytes of JSON, the limit is {MAX_RESULT_BYTES}"
            )),
            Ok(_) => Ok(v),
            Err(e) => Err(format!("the result does not serialize as JSON: {e}")),
        },
        Ok(Err(e)) => Err(e.0),
        Err(e) if e.is_panic() => {
            let payload = e.into_panic();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic payload".to_owned());
            Err(format!("handler panicked: {msg}"))
        }
        Err(_) => Err("handler was cancelled".to_owned()),
    };
    Outcome {
        result,
        logs: ctx.take_logs(),
        planned: ctx.take_planned(),
    }
}
