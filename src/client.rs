//! A client of a node's HTTP API (see `piecework_node::http`), as the CLI uses it.

use std::time::Duration;

use anyhow::{Context as _, bail};
use piecework_node::api;
use piecework_queue_doc::{ConfigPatch, QueueConfig, QueueId, TaskId};
use serde::de::DeserializeOwned;

/// A node's API at a base URL such as `http://127.0.0.1:7700`.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    http: reqwest::Client,
}

/// The node refused for now (HTTP 503: a full queue, a busy or stopping node): the same request
/// may succeed later.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

impl Client {
    /// A client of the node at `base`.
    pub fn new(base: &str) -> anyhow::Result<Self> {
        Client::with_token(base, None)
    }

    /// A client of the node at `base` that gives the node's API `token` with every request
    /// (a node whose API is bound beyond loopback asks for it).
    pub fn with_token(base: &str, token: Option<&str>) -> anyhow::Result<Self> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = token {
            let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {t}"))
                .context("the API token is not valid in an HTTP header")?;
            v.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, v);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .default_headers(headers)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            http,
        })
    }

    async fn parse<T: DeserializeOwned>(&self, resp: reqwest::Response) -> anyhow::Result<T> {
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .context("cannot read the node's answer")?;
        if status.is_success() {
            return serde_json::from_slice(&body)
                .context("the node's answer is not what this CLI expects");
        }
        match serde_json::from_slice::<api::ApiError>(&body) {
            Ok(e) if status == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                Err(Unavailable(e.error).into())
            }
            Ok(e) => bail!("{}", e.error),
            Err(_) => bail!("the node answered {status}"),
        }
    }

    fn unreachable(&self) -> String {
        format!(
            "cannot reach a piecework node at {} (is `piecework node` running there?)",
            self.base
        )
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, timeout: Duration) -> anyhow::Result<T> {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .timeout(timeout)
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<T> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30))
            .json(body)
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// The node's status.
    pub async fn status(&self) -> anyhow::Result<api::NodeStatus> {
        self.get("/v1/status", Duration::from_secs(10)).await
    }

    /// Creates a queue.
    pub async fn create_queue(
        &self,
        name: &str,
        config: Option<QueueConfig>,
    ) -> anyhow::Result<QueueId> {
        let c: api::Created = self
            .post(
                "/v1/queues",
                &api::CreateQueue {
                    name: name.to_owned(),
                    config,
                },
            )
            .await?;
        Ok(c.queue_id)
    }

    /// A joined queue's status.
    pub async fn queue_status(&self, id: &QueueId) -> anyhow::Result<api::QueueStatus> {
        self.get(&format!("/v1/queues/{id}"), Duration::from_secs(10))
            .await
    }

    /// Pauses (`true`) or resumes a queue's routing; its status after.
    pub async fn set_paused(&self, id: &QueueId, paused: bool) -> anyhow::Result<api::QueueStatus> {
        let verb = if paused { "pause" } else { "resume" };
        self.post(&format!("/v1/queues/{id}/{verb}"), &serde_json::json!({}))
            .await
    }

    /// Changes some of a queue's configuration fields; its status after.
    pub async fn set_config(
        &self,
        id: &QueueId,
        patch: &ConfigPatch,
    ) -> anyhow::Result<api::QueueStatus> {
        let resp = self
            .http
            .patch(format!("{}/v1/queues/{id}/config", self.base))
            .timeout(Duration::from_secs(30))
            .json(patch)
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Writes a queue's schedule `name`: its schedules once written.
    pub async fn put_schedule(
        &self,
        id: &QueueId,
        name: &str,
        schedule: &api::PutSchedule,
    ) -> anyhow::Result<api::ScheduleStatus> {
        let resp = self
            .http
            .put(format!("{}/v1/queues/{id}/schedules/{name}", self.base))
            .timeout(Duration::from_secs(30))
            .json(schedule)
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Deletes a queue's schedule `name`: the schedules left.
    pub async fn delete_schedule(
        &self,
        id: &QueueId,
        name: &str,
    ) -> anyhow::Result<api::Schedules> {
        let resp = self
            .http
            .delete(format!("{}/v1/queues/{id}/schedules/{name}", self.base))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// A queue's schedules.
    pub async fn schedules(&self, id: &QueueId) -> anyhow::Result<api::Schedules> {
        let resp = self
            .http
            .get(format!("{}/v1/queues/{id}/schedules", self.base))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Sets (0: removes) a priority tag's boost.
    pub async fn set_boost(
        &self,
        id: &QueueId,
        tag: &str,
        boost: i64,
    ) -> anyhow::Result<api::QueueStatus> {
        let url = format!("{}/v1/queues/{id}/boosts/{tag}", self.base);
        let req = match boost {
            0 => self.http.delete(url),
            b => self.http.put(url).json(&api::SetBoost { boost: b }),
        };
        let resp = req
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// The node's resources.
    pub async fn resources(&self) -> anyhow::Result<api::Resources> {
        self.get("/v1/resources", Duration::from_secs(15)).await
    }

    /// Holds a resource on the node.
    pub async fn add_resource(&self, name: &str) -> anyhow::Result<api::Resources> {
        let url = format!("{}/v1/resources/{name}", self.base);
        let resp = self
            .http
            .put(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Withdraws a resource from the node, for `restore_after` or for good.
    pub async fn withdraw_resource(
        &self,
        name: &str,
        restore_after: Option<Duration>,
    ) -> anyhow::Result<api::Resources> {
        let mut url = format!("{}/v1/resources/{name}", self.base);
        if let Some(d) = restore_after {
            url.push_str(&format!("?restore_after_ms={}", d.as_millis()));
        }
        let resp = self
            .http
            .delete(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Joins a queue.
    pub async fn join_queue(&self, id: &QueueId) -> anyhow::Result<api::QueueStatus> {
        self.post(&format!("/v1/queues/{id}/join"), &serde_json::json!({}))
            .await
    }

    /// Joins a queue with an invite token: its status once this node holds it.
    pub async fn join_invite(&self, token: &str) -> anyhow::Result<api::QueueStatus> {
        // A join may wait for the invite's member to be dialed and to answer.
        let resp = self
            .http
            .post(format!("{}/v1/join", self.base))
            .timeout(Duration::from_secs(60))
            .json(&serde_json::json!({ "token": token }))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Joins `queue` with an invite for this node's peer id (`peer`) that `admin` (an admin of
    /// the queue) makes, giving it `role`.
    pub async fn join_from(
        &self,
        admin: &Client,
        queue: &QueueId,
        peer: &str,
        role: piecework_queue_doc::Role,
    ) -> anyhow::Result<api::QueueStatus> {
        let req = api::InviteRequest {
            role: Some(role),
            for_peer: Some(piecework_queue_doc::PeerId::new(peer)),
            expires_ms: None,
        };
        let invited = admin.invite(queue, &req).await?;
        self.join_invite(&invited.token).await
    }

    /// Makes an invite to a queue: its token.
    pub async fn invite(
        &self,
        queue: &QueueId,
        req: &api::InviteRequest,
    ) -> anyhow::Result<api::Invited> {
        self.post(&format!("/v1/queues/{queue}/invites"), req).await
    }

    /// A queue's members.
    pub async fn members(&self, queue: &QueueId) -> anyhow::Result<Vec<api::MemberEntry>> {
        self.get(
            &format!("/v1/queues/{queue}/members"),
            Duration::from_secs(10),
        )
        .await
    }

    /// Removes a member of a queue: the members then.
    pub async fn remove_member(
        &self,
        queue: &QueueId,
        peer: &str,
    ) -> anyhow::Result<Vec<api::MemberEntry>> {
        let resp = self
            .http
            .delete(format!("{}/v1/queues/{queue}/members/{peer}", self.base))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| self.unreachable())?;
        self.parse(resp).await
    }

    /// Submits a task.
    pub async fn submit(
        &self,
        queue: &QueueId,
        req: &api::SubmitTask,
    ) -> anyhow::Result<api::Submitted> {
        self.post(&format!("/v1/queues/{queue}/tasks"), req).await
    }

    /// Submits a batch (at most [`api::MAX_BATCH`] entries): one answer per entry.
    pub async fn submit_many(
        &self,
        queue: &QueueId,
        entries: &[serde_json::Value],
    ) -> anyhow::Result<Vec<api::BatchEntry>> {
        self.post(&format!("/v1/queues/{queue}/tasks"), &entries)
            .await
    }

    /// Cancels a task that has not ended; its status after.
    pub async fn cancel_task(&self, id: &TaskId) -> anyhow::Result<api::TaskStatus> {
        self.post(&format!("/v1/tasks/{id}/cancel"), &serde_json::json!({}))
            .await
    }

    /// Requeues a dead-lettered task; its status after.
    pub async fn requeue_task(&self, id: &TaskId) -> anyhow::Result<api::TaskStatus> {
        self.post(&format!("/v1/tasks/{id}/requeue"), &serde_json::json!({}))
            .await
    }

    /// Submits the undo tasks a succeeded task's run recorded; their ids.
    pub async fn undo_task(&self, id: &TaskId) -> anyhow::Result<api::TaskIds> {
        self.post(&format!("/v1/tasks/{id}/undo"), &serde_json::json!({}))
            .await
    }

    /// Follows the node's event stream (of one queue, or of all): `connected` once the node
    /// answered, then `each` with every event (its SSE id and name, and the event's JSON)
    /// until `each` says to stop. A stream the node closes (it stopped) is opened again after
    /// a second, resuming after the last event seen (`Last-Event-ID`); an answer that is not
    /// a stream (an error) ends it.
    pub async fn follow_events(
        &self,
        queue: Option<&QueueId>,
        connected: impl FnOnce(),
        mut each: impl FnMut(Option<u64>, &str, serde_json::Value) -> bool,
    ) -> anyhow::Result<()> {
        let mut connected = Some(connected);
        let mut last: Option<u64> = None;
        loop {
            let mut req = self.http.get(format!("{}/v1/events", self.base));
            if let Some(q) = queue {
                req = req.query(&[("queue", q.as_str())]);
            }
            if let Some(id) = last {
                req = req.header("Last-Event-ID", id.to_string());
            }
            let mut resp = match req.send().await {
                Ok(r) => r,
                Err(_) if last.is_some() || connected.is_none() => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => return Err(e).with_context(|| self.unreachable()),
            };
            if !resp.status().is_success() {
                return self.parse::<serde_json::Value>(resp).await.map(|_| ());
            }
            if let Some(c) = connected.take() {
                c();
            }
            let mut sse = SseParser::default();
            while let Ok(Some(chunk)) = resp.chunk().await {
                for (id, name, data) in sse.feed(&chunk) {
                    if id.is_some() {
                        last = id;
                    }
                    let value =
                        serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
                    if !each(id, &name, value) {
                        return Ok(());
                    }
                }
            }
            eprintln!("the node closed the event stream; opening it again");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Requeues every dead-lettered task of a queue; their ids.
    pub async fn requeue_failed(&self, queue: &QueueId) -> anyhow::Result<api::TaskIds> {
        self.post(
            &format!("/v1/queues/{queue}/requeue"),
            &serde_json::json!({}),
        )
        .await
    }

    /// A task's status.
    pub async fn task_status(&self, id: &TaskId) -> anyhow::Result<api::TaskStatus> {
        self.get(&format!("/v1/tasks/{id}"), Duration::from_secs(15))
            .await
    }

    /// A page of a queue's tasks (by id, after `cursor`), optionally in one state.
    pub async fn list_tasks(
        &self,
        queue: &QueueId,
        state: Option<&str>,
        limit: usize,
        cursor: Option<&TaskId>,
    ) -> anyhow::Result<api::TaskList> {
        let mut path = format!("/v1/queues/{queue}/tasks?limit={limit}");
        if let Some(s) = state {
            path.push_str(&format!("&state={s}"));
        }
        if let Some(c) = cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        self.get(&path, Duration::from_secs(15)).await
    }

    /// Waits until the task is final, up to `timeout` (in rounds of at most a minute).
    pub async fn wait(&self, id: &TaskId, timeout: Duration) -> anyhow::Result<api::TaskStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                bail!("task {id} had not finished after {timeout:?}");
            }
            let round = left.min(Duration::from_secs(60));
            let path = format!("/v1/tasks/{id}/wait?timeout_ms={}", round.as_millis());
            let resp = self
                .http
                .get(format!("{}{path}", self.base))
                .timeout(round + Duration::from_secs(10))
                .send()
                .await
                .with_context(|| self.unreachable())?;
            if resp.status() == reqwest::StatusCode::REQUEST_TIMEOUT {
                continue;
            }
            return self.parse(resp).await;
        }
    }
}

/// Server-Sent Events, parsed as they arrive: lines end with LF, CRLF or CR; an event ends at
/// a blank line; its `data:` lines are joined with LF; comments and events without data are
/// skipped.
#[derive(Debug, Default)]
struct SseParser {
    line: Vec<u8>,
    /// The last byte was a CR (a LF right after it ends no second line).
    after_cr: bool,
    id: Option<u64>,
    name: Option<String>,
    data: Option<String>,
}

impl SseParser {
    /// The events `bytes` completes: (id, name, data).
    fn feed(&mut self, bytes: &[u8]) -> Vec<(Option<u64>, String, String)> {
        let mut out = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line =
                        String::from_utf8_lossy(&std::mem::take(&mut self.line)).into_owned();
                    if let Some(e) = self.line_done(&line) {
                        out.push(e);
                    }
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    fn line_done(&mut self, line: &str) -> Option<(Option<u64>, String, String)> {
        if line.is_empty() {
            let name = self.name.take().unwrap_or_else(|| "message".to_owned());
            let id = self.id.take();
            return self.data.take().map(|d| (id, name, d));
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => self.id = value.parse().ok(),
            "event" => self.name = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::SseParser;

    #[test]
    fn events_parse_whatever_their_line_ends_and_however_they_are_cut() {
        let text = "id: 7\r\nevent: started\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: keep-alive\n\nevent: lost\rdata: {}\r\r";
        for cut in 0..text.len() {
            let mut p = SseParser::default();
            let mut got = p.feed(&text.as_bytes()[..cut]);
            got.extend(p.feed(&text.as_bytes()[cut..]));
            assert_eq!(
                got,
                vec![
                    (Some(7), "started".to_owned(), "{\"a\":\n1}".to_owned()),
                    (None, "lost".to_owned(), "{}".to_owned()),
                ],
                "cut at {cut}"
            );
        }
    }
}
