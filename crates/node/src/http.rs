//! The local HTTP API the `piecework` CLI talks to. JSON in and out; errors are
//! `{"error": "..."}` with a fitting status code.
//!
//! | method and path | body | returns |
//! |---|---|---|
//! | `GET /v1/status` | | [`api::NodeStatus`] |
//! | `POST /v1/queues` | [`api::CreateQueue`] | [`api::Created`] |
//! | `POST /v1/queues/{id}/join` | | [`api::QueueStatus`] |
//! | `POST /v1/queues/{id}/tasks` | [`api::SubmitTask`] | [`api::Submitted`] |
//! | `GET /v1/tasks/{id}` | | [`api::TaskStatus`] |
//! | `GET /v1/tasks/{id}/wait?timeout_ms=N` | | [`api::TaskStatus`] once final; 408 after N ms (at most 60 000) |

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use piecework_queue_doc::{QueueId, TaskId};
use serde::Deserialize;

use crate::{NodeHandle, QueueError, SubmitError, TaskError, api};

/// The longest a wait request blocks.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(api::ApiError { error: self.1 })).into_response()
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        let code = match e {
            QueueError::BadId(_) | QueueError::Create(_) => StatusCode::BAD_REQUEST,
            QueueError::NotFound(_) | QueueError::NotJoined(_) => StatusCode::NOT_FOUND,
            QueueError::NotAQueue(_) => StatusCode::UNPROCESSABLE_ENTITY,
            QueueError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let code = match e {
            SubmitError::NotJoined(_) => StatusCode::NOT_FOUND,
            SubmitError::Invalid(_) => StatusCode::BAD_REQUEST,
            SubmitError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
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
            TaskError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            TaskError::Stopped => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

/// The API's routes over `node`.
pub fn router(node: NodeHandle) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/queues", post(create_queue))
        .route("/v1/queues/{id}/join", post(join_queue))
        .route("/v1/queues/{id}/tasks", post(submit))
        .route("/v1/tasks/{id}", get(task_status))
        .route("/v1/tasks/{id}/wait", get(wait_task))
        .with_state(node)
}

/// Serves the API on `listener` until the future is dropped.
pub async fn serve(node: NodeHandle, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router(node)).await
}

async fn status(State(node): State<NodeHandle>) -> Result<Json<api::NodeStatus>, ApiError> {
    Ok(Json(node.status().await?))
}

async fn create_queue(
    State(node): State<NodeHandle>,
    Json(req): Json<api::CreateQueue>,
) -> Result<Json<api::Created>, ApiError> {
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

async fn submit(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    Json(req): Json<api::SubmitTask>,
) -> Result<Json<api::Submitted>, ApiError> {
    Ok(Json(node.submit(&QueueId::new(id), req).await?))
}

async fn task_status(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    Ok(Json(node.task_status(&TaskId::new(id)).await?))
}

#[derive(Deserialize)]
struct WaitQuery {
    timeout_ms: Option<u64>,
}

async fn wait_task(
    State(node): State<NodeHandle>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Result<Json<api::TaskStatus>, ApiError> {
    let timeout = Duration::from_millis(q.timeout_ms.unwrap_or(30_000)).min(MAX_WAIT);
    Ok(Json(node.wait_task(&TaskId::new(id), timeout).await?))
}
