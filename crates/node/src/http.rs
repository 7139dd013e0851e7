//! The local HTTP API the `piecework` CLI talks to. JSON in and out; errors are
//! `{"error": "..."}` with a fitting status code. [`serve`] serves only the requests that may
//! drive the node ([`crate::access`]): 403 for another origin or host on loopback, 401
//! without the node's token beyond.
//!
//! | method and path | body | returns |
//! |---|---|---|
//! | `GET /v1/status` | | [`api::NodeStatus`] |
//! | `POST /v1/queues` | [`api::CreateQueue`] | [`api::Created`] |
//! | `POST /v1/queues/{id}/join` | | [`api::QueueStatus`] |
//! | `POST /v1/queues/{id}/tasks` | [`api::SubmitTask`] | [`api::Submitted`] |
//! | `POST /v1/queues/{id}/tasks` | an array of [`api::SubmitTask`] | an array of [`api::BatchEntry`]: `{index, task_id, replicated}` or `{index, error}` |
//! | `GET /v1/queues/{id}` | | [`api::QueueStatus`] |
//! | `POST /v1/queues/{id}/pause` | | [`api::QueueStatus`] |
//! | `POST /v1/queues/{id}/resume` | | [`api::QueueStatus`] |
//! | `PATCH /v1/queues/{id}/config` | any subset of [`api::QueueStatus`]'s `config` fields | [`api::QueueStatus`] |
//! | `GET /v1/tasks/{id}` | | [`api::TaskStatus`] |
//! | `GET /v1/tasks/{id}/wait?timeout_ms=N` | | [`api::TaskStatus`] once final; 408 after N ms (at most 60 000) |
//!
//! A batch (an array body) holds at most [`api::MAX_BATCH`] (1,000) tasks and
//! [`MAX_BODY`] (8 MiB) of JSON. It is acknowledged once, when every task in it is durable (and
//! replicated, as for one task). An entry that is not a valid task is answered by its index
//! with an `error`, and the others are submitted; a batch the node cannot take at all (not
//! joined, too many entries, busy) gets an error status like a single submit. Bodies the API
//! cannot parse are answered with the same `{"error": ...}` form and the status the parser gives
//! (400 for malformed JSON, 415 without a JSON content type, 422 for a missing or mistyped
//! field, 413 over the size limit).

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post, put};
use axum::{Json, Router};
use piecework_queue_doc::{PeerId, QueueId, TaskId};
use serde::Deserialize;

use crate::access::{Access, guard};
use crate::{NodeHandle, QueueError, SubmitError, TaskError, api};

/// The largest request body: a batch of tasks with their inputs.
pub const MAX_BODY: usize = 8 << 20;

/// The longest a wait request blocks.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(api::ApiError { error: self.1 })).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        ApiError(e.status(), e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError(e.status(), e.body_text())
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        let code = match e {
            QueueError::BadId(_)
            | QueueError::Create(_)
            | QueueError::InvalidConfig(_)
            | QueueError::InvalidBoost(_)
            | QueueError::InvalidSchedule(_) => StatusCode::BAD_REQUEST,
            QueueError::NotFound(_)
            | QueueError::NotJoined(_)
            | QueueError::UnknownMember(..)
            | QueueError::UnknownSchedule(..) => StatusCode::NOT_FOUND,
            QueueError::BadInvite(_) => StatusCode::BAD_REQUEST,
            QueueError::Forbidden { .. }
            | QueueError::CreatorStays(_)
            | QueueError::InviteNeeded(_) => StatusCode::FORBIDDEN,
            QueueError::NotAQueue(_) => StatusCode::UNPROCESSABLE_ENTITY,
            QueueError::NotDurable(..) => StatusCode::INSUFFICIENT_STORAGE,
            // Busy or stopping: a client may try again (here later, or another node).
            QueueError::Busy(_) | QueueError::Stopped | QueueError::Ended(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let code = match e {
            SubmitError::NotJoined(_) => StatusCode::NOT_FOUND,
            SubmitError::Removed(_) => StatusCode::FORBIDDEN,
            SubmitError::Invalid(_) => StatusCode::BAD_REQUEST,
            SubmitError::Busy(_)
            | SubmitError::Full { .. }
            | SubmitError::Stopped
            | SubmitError::Ended(_) => StatusCode::SERVICE_UNAVAILABLE,
            SubmitError::TooMany(_) => StatusCode::PAYLOAD_TOO_LARGE,
            SubmitError::NotDurable(_) => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<TaskError> for ApiError {
    fn from(e: TaskError) -> Self {
        let code = match e {
            TaskError::BadId(_) => StatusCode::BAD_REQUEST,
            TaskError::NotFound(_) | TaskError::NotJoined(..) | TaskError::NotIndexed(..) => {
                StatusCode::NOT_FOUND
            }
            TaskError::NotATask(..) => StatusCode::UNPROCESSABLE_ENTITY,
            TaskError::Timeout(..) => StatusCode::REQUEST_TIMEOUT,
            TaskError::Busy(_) | TaskError::Stopped | TaskError::Ended(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            TaskError::Conflict(_) => StatusCode::CONFLICT,
            TaskError::Forbidden(_) => StatusCode::FORBIDDEN,
            TaskError::Write(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<api::ResourceError> for ApiError {
    fn from(e: api::ResourceError) -> Self {
        let code = match e {
            api::ResourceError::InvalidName(_) => StatusCode::BAD_REQUEST,
            api::ResourceError::NotHeld(_) => StatusCode::NOT_FOUND,
            api::ResourceError::Stopped | api::ResourceError::Ended(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError(code, e.to_string())
    }
}

/// The API's routes over `node`.
pub fn router(node: NodeHandle) -> Router {
    Router::new()
        .route("/v1/resources", get(resources))
        .route(
            "/v1/resources/{name}",
            put(add_resource).delete(withdraw_resource),
        )
        .route("/v1/status", get(status))
        .route("/v1/queues", post(create_queue))
        .route("/v1/queues/{id}", get(queue_status))
        .route("/v1/queues/{id}/join", post(join_queue))
        .route("/v1/join", post(join_invite))
        .route("/v1/queues/{id}/invites", post(invite))
        .route("/v1/queues/{id}/members", get(members))
        .route("/v1/queues/{id}/members/{peer}", delete(remove_member))
        .route("/v1/queues/{id}/pause", post(pause))
        .route("/v1/queues/{id}/resume", post(resume))
        .route("/v1/queues/{id}/config", patch(set_config))
        .route(
            "/v1/queues/{id}/boosts/{tag}",
            put(set_boost).delete(delete_boost),
        )
        .route("/v1/queues/{id}/schedules", get(schedules))
        .route(
            "/v1/queues/{id}/schedules/{name}",
            get(schedule).put(put_schedule).delete(delete_schedule),
        )
        .route("/v1/queues/{id}/tasks", post(submit).get(list_tasks))
        .route("/v1/tasks/{id}", get(task_status))
        .route("/v1/tasks/{id}/wait", get(wait_task))
        .route("/v1/tasks/{id}/cancel", post(cancel_task))
        .route("/v1/tasks/{id}/requeue", post(requeue_task))
        .route("/v1/tasks/{id}/undo", post(undo_task))
        .route("/v1/events", get(events))
        .route("/v1/queues/{id}/requeue", post(requeue_failed))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(node)
}

/// Serves the API on `listener` until the future is dropped, to the requests that may drive
/// the node ([`crate::access`]: on loopback, none from another origin or for another host;
/// beyond, none without the node's token).
pub async fn serve(node: NodeHandle, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let access = Access::for_addr(listener.local_addr()?, node.api_token());
    let app = router(node).layer(axum::middleware::from_fn_with_state(access, guard));
    axum::serve(listener, app).await
}

async fn status(State(node): State<NodeHandle>) -> Result<Json<api::NodeStatus>, ApiError> {
    Ok(Json(node.status().await?))
}

async fn create_queue(
    State(node): State<NodeHandle>,
    req: Result<Json<api::CreateQueue>, JsonRejection>,
) -> Result<Json<api::Created>, ApiError> {
    let Json(req) = req?;
    if req.name.trim().is_empty() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "a queue needs a name".into(),
        ));
    }
    let queue_id = node.create_queue(&req.name, req.config).await?;
    Ok(Json(api::Created { queue_id }))
}

async fn join_queue(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    let id = QueueId::new(id);
    node.join_queue(&id).await?;
    let status = node.status().await?;
    let q = status
        .queues
        .into_iter()
        .find(|q| q.id == id)
        .ok_or_else(|| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "joined queue missing from status".into(),
            )
        })?;
    Ok(Json(q))
}

/// `POST /v1/join` with `{"token": …}`: the queue's status once joined.
async fn join_invite(
    State(node): State<NodeHandle>,
    body: Result<Json<JoinRequest>, JsonRejection>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    let Json(req) = body?;
    let invite = piecework_core::invite::Invite::decode(&req.token)
        .map_err(|e| ApiError::from(QueueError::BadInvite(e.to_string())))?;
    node.join_invite(&req.token).await?;
    Ok(Json(node.queue_status(&invite.queue).await?))
}

/// The body of `POST /v1/join`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct JoinRequest {
    token: String,
}

async fn invite(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    body: Result<Json<api::InviteRequest>, JsonRejection>,
) -> Result<Json<api::Invited>, ApiError> {
    let Json(req) = body?;
    Ok(Json(node.invite(&QueueId::new(id), req).await?))
}

async fn members(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<Vec<api::MemberEntry>>, ApiError> {
    Ok(Json(node.members(&QueueId::new(id)).await?))
}

async fn remove_member(
    State(node): State<NodeHandle>,
    Path((id, peer)): Path<(String, String)>,
) -> Result<Json<Vec<api::MemberEntry>>, ApiError> {
    Ok(Json(
        node.remove_member(&QueueId::new(id), &PeerId::new(peer))
            .await?,
    ))
}

async fn queue_status(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    Ok(Json(node.queue_status(&QueueId::new(id)).await?))
}

async fn pause(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    Ok(Json(node.set_paused(&QueueId::new(id), true).await?))
}

async fn resume(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    Ok(Json(node.set_paused(&QueueId::new(id), false).await?))
}

async fn set_config(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    body: Result<Json<piecework_queue_doc::ConfigPatch>, JsonRejection>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    let Json(patch) = body?;
    Ok(Json(node.set_config(&QueueId::new(id), patch).await?))
}

/// `GET /v1/queues/{id}/tasks`'s query.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_tasks(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<api::TaskList>, ApiError> {
    let Query(q) = query?;
    let state = match q.state.as_deref() {
        None => None,
        Some(s) => Some(piecework_queue_doc::TaskState::parse(s).ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "unknown state {s:?}: one of pending, blocked, assigned, running, \
                     input_unavailable, succeeded, failed, cancelled"
                ),
            )
        })?),
    };
    let limit = q.limit.unwrap_or(100).min(api::MAX_LIST);
    let cursor = q.cursor.map(piecework_queue_doc::TaskId::new);
    Ok(Json(
        node.list_tasks(&QueueId::new(id), state, limit, cursor)
            .await?,
    ))
}

async fn set_boost(
    State(node): State<NodeHandle>,
    Path((id, tag)): Path<(String, String)>,
    body: Result<Json<api::SetBoost>, JsonRejection>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    let Json(b) = body?;
    Ok(Json(
        node.set_boost(&QueueId::new(id), &tag, b.boost).await?,
    ))
}

async fn delete_boost(
    State(node): State<NodeHandle>,
    Path((id, tag)): Path<(String, String)>,
) -> Result<Json<api::QueueStatus>, ApiError> {
    Ok(Json(node.set_boost(&QueueId::new(id), &tag, 0).await?))
}

async fn schedules(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::Schedules>, ApiError> {
    Ok(Json(node.schedules(&QueueId::new(id)).await?))
}

/// The schedule named `name` among `all`, or a 404.
fn named(id: String, name: String, all: api::Schedules) -> Result<api::ScheduleStatus, ApiError> {
    all.schedules
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| QueueError::UnknownSchedule(QueueId::new(id), name).into())
}

async fn schedule(
    State(node): State<NodeHandle>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Json<api::ScheduleStatus>, ApiError> {
    let all = node.schedules(&QueueId::new(id.clone())).await?;
    Ok(Json(named(id, name, all)?))
}

async fn put_schedule(
    State(node): State<NodeHandle>,
    Path((id, name)): Path<(String, String)>,
    body: Result<Json<api::PutSchedule>, JsonRejection>,
) -> Result<Json<api::ScheduleStatus>, ApiError> {
    let Json(b) = body?;
    let all = node
        .put_schedule(&QueueId::new(id.clone()), &name, b)
        .await?;
    Ok(Json(named(id, name, all)?))
}

async fn delete_schedule(
    State(node): State<NodeHandle>,
    Path((id, name)): Path<(String, String)>,
) -> Result<Json<api::Schedules>, ApiError> {
    Ok(Json(node.delete_schedule(&QueueId::new(id), &name).await?))
}

async fn resources(State(node): State<NodeHandle>) -> Json<api::Resources> {
    Json(node.resources().await)
}

async fn add_resource(
    State(node): State<NodeHandle>,
    Path(name): Path<String>,
) -> Result<Json<api::Resources>, ApiError> {
    Ok(Json(node.add_resource(&name).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WithdrawQuery {
    restore_after_ms: Option<u64>,
}

async fn withdraw_resource(
    State(node): State<NodeHandle>,
    Path(name): Path<String>,
    query: Result<Query<WithdrawQuery>, QueryRejection>,
) -> Result<Json<api::Resources>, ApiError> {
    let Query(q) = query?;
    let restore_after = q.restore_after_ms.map(Duration::from_millis);
    Ok(Json(node.withdraw_resource(&name, restore_after).await?))
}

async fn submit(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    body: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let queue = QueueId::new(id);
    match body {
        serde_json::Value::Array(values) => {
            if values.len() > api::MAX_BATCH {
                return Err(SubmitError::TooMany(values.len()).into());
            }
            Ok(Json(submit_batch(&node, &queue, values).await?).into_response())
        }
        one => {
            let req = serde_json::from_value::<api::SubmitTask>(one).map_err(|e| {
                ApiError(StatusCode::UNPROCESSABLE_ENTITY, format!("not a task: {e}"))
            })?;
            Ok(Json(node.submit(&queue, req).await?).into_response())
        }
    }
}

/// Submits the entries that are tasks, and answers every entry by its index.
async fn submit_batch(
    node: &NodeHandle,
    queue: &QueueId,
    values: Vec<serde_json::Value>,
) -> Result<Vec<api::BatchEntry>, SubmitError> {
    let mut answers: Vec<Option<api::BatchEntry>> = vec![None; values.len()];
    let mut tasks = Vec::with_capacity(values.len());
    let mut positions = Vec::with_capacity(values.len());
    for (index, v) in values.into_iter().enumerate() {
        match serde_json::from_value::<api::SubmitTask>(v) {
            Ok(t) => {
                positions.push(index);
                tasks.push(t);
            }
            Err(e) => {
                answers[index] = Some(api::BatchEntry::Refused {
                    index,
                    error: format!("not a task: {e}"),
                });
            }
        }
    }
    if !tasks.is_empty() {
        let entries = node.submit_many(queue, tasks).await?;
        for (entry, index) in entries.into_iter().zip(positions) {
            answers[index] = Some(match entry {
                api::BatchEntry::Submitted {
                    task_id,
                    replicated,
                    deduplicated,
                    ..
                } => api::BatchEntry::Submitted {
                    index,
                    task_id,
                    replicated,
                    deduplicated,
                },
                api::BatchEntry::Refused { error, .. } => api::BatchEntry::Refused { index, error },
            });
        }
    }
    Ok(answers.into_iter().flatten().collect())
}

async fn task_status(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    Ok(Json(node.task_status(&TaskId::new(id)).await?))
}

async fn cancel_task(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    Ok(Json(node.cancel_task(&TaskId::new(id)).await?))
}

async fn requeue_task(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    Ok(Json(node.requeue_task(&TaskId::new(id)).await?))
}

async fn undo_task(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskIds>, ApiError> {
    let task_ids = node.undo_task(&TaskId::new(id)).await?;
    Ok(Json(api::TaskIds { task_ids }))
}

#[derive(Deserialize)]
struct EventsQuery {
    queue: Option<String>,
}

/// How often an idle event stream gets a keep-alive comment.
const EVENTS_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// `GET /v1/events[?queue=Q]`: the queue events as Server-Sent Events (`id:` the event's id,
/// `event:` its name, `data:` the event as JSON), from now on, or with `Last-Event-ID` from
/// after that id as far as the node still keeps them (a `lost` event first says how many it
/// forgot, `null` for an id of the node's earlier life). A subscriber too slow to keep up gets a
/// `lost` event where it fell behind. `lost` events have no id and are not in the log.
async fn events(
    State(node): State<NodeHandle>,
    headers: axum::http::HeaderMap,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let Query(q) = q?;
    let queue = q.queue.map(QueueId::new);
    let after = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError(
                        StatusCode::BAD_REQUEST,
                        "Last-Event-ID is not an event id (a number)".into(),
                    )
                })?,
        ),
    };
    let sub = node.queue_events(after);
    let lost = (sub.lost != Some(0)).then(|| {
        Event::default()
            .event("lost")
            .data(serde_json::json!({ "lost": sub.lost }).to_string())
    });
    let sse = |e: &crate::Logged| {
        Event::default()
            .id(e.id.to_string())
            .event(e.event.event.as_str())
            .data(serde_json::to_string(&e.event).unwrap_or_default())
    };
    let wanted = move |e: &crate::Logged| queue.as_ref().is_none_or(|q| e.event.queue == *q);
    let first: Vec<Event> = lost
        .into_iter()
        .chain(sub.replay.iter().filter(|e| wanted(e)).map(|e| sse(e)))
        .collect();
    let live = futures::stream::unfold(sub.live, move |mut rx| {
        let wanted = wanted.clone();
        async move {
            loop {
                match rx.recv().await {
                    Ok(e) if wanted(&e) => return Some((sse(&e), rx)),
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let lost = Event::default()
                            .event("lost")
                            .data(serde_json::json!({ "lost": n }).to_string());
                        return Some((lost, rx));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    let stream = futures::StreamExt::map(
        futures::StreamExt::chain(futures::stream::iter(first), live),
        Ok::<Event, std::convert::Infallible>,
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(EVENTS_KEEP_ALIVE))
        .into_response())
}

async fn requeue_failed(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskIds>, ApiError> {
    let task_ids = node.requeue_failed(&QueueId::new(id)).await?;
    Ok(Json(api::TaskIds { task_ids }))
}

#[derive(Deserialize)]
struct WaitQuery {
    timeout_ms: Option<u64>,
}

async fn wait_task(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    let Query(q) = q?;
    let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(30_000)).min(MAX_WAIT);
    Ok(Json(node.wait_task(&TaskId::new(id), timeout).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that is stopping answers 503, as a busy one does: the request may succeed
    /// later or on another node, and nothing went wrong in it.
    #[test]
    fn a_stopping_node_answers_service_unavailable() {
        assert_eq!(
            ApiError::from(QueueError::Stopped).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ApiError::from(SubmitError::Stopped).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ApiError::from(TaskError::Stopped).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
