//! The API's commands: dispatching each (`command`) and the node's status report. May ask `queues`,
//! `submits`, `status` and `stop` to carry a command out.

use super::*;
use piecework_queue_doc::Role as MemberRole;

impl Core {
    pub(super) fn command(&mut self, now: Time, cmd: CommandId, command: Command) {
        if self.stopping.is_some() {
            // A stopping node takes no new work and writes nothing new.
            let refused = match &command {
                Command::CreateQueue { .. } => Some(Reply::Created(Err(QueueError::Stopped))),
                Command::JoinQueue { .. } => Some(Reply::Joined(Err(QueueError::Stopped))),
                Command::SetPaused { .. } => Some(Reply::Paused(Err(QueueError::Stopped))),
                Command::ListTasks { .. } => Some(Reply::Tasks(Err(QueueError::Stopped))),
                Command::SetConfig { .. } | Command::SetBoost { .. } => {
                    Some(Reply::Configured(Err(QueueError::Stopped)))
                }
                Command::PutSchedule { .. } | Command::DeleteSchedule { .. } => {
                    Some(Reply::Schedules(Err(QueueError::Stopped)))
                }
                Command::Submit { .. } => Some(Reply::Submitted(Err(SubmitError::Stopped))),
                Command::CancelTask { .. } | Command::RequeueTask { .. } => {
                    Some(Reply::Task(Box::new(Err(TaskError::Stopped))))
                }
                Command::RequeueFailed { .. } => Some(Reply::TaskIds(Err(QueueError::Stopped))),
                Command::UndoTask { .. } => Some(Reply::Undone(Err(TaskError::Stopped))),
                Command::SubmitMany { .. } => Some(Reply::SubmittedMany(Err(SubmitError::Stopped))),
                Command::AddResource { .. } | Command::WithdrawResource { .. } => {
                    Some(Reply::Resources(Err(api::ResourceError::Stopped)))
                }
                _ => None,
            };
            if let Some(r) = refused {
                self.replies.push_back((cmd, r));
                return;
            }
        }
        match command {
            Command::CreateQueue { name, config } => {
                if self.waiting() >= MAX_WAITERS {
                    self.replies
                        .push_back((cmd, Reply::Created(Err(QueueError::Busy(MAX_WAITERS)))));
                    return;
                }
                match self.create_queue(now, &name, &config) {
                    Ok(queue) => self.opened(cmd, queue, None),
                    Err(e) => self.replies.push_back((cmd, Reply::Created(Err(e)))),
                }
            }
            Command::JoinQueue { id, from_peers } => {
                if let Some(q) = self.queues.get(&id) {
                    self.replies
                        .push_back((cmd, Reply::Joined(Ok(q.view.clone()))));
                    return;
                }
                let Some(doc) = queue_doc(&id) else {
                    self.replies
                        .push_back((cmd, Reply::Joined(Err(QueueError::BadId(id.to_string())))));
                    return;
                };
                if self.waiting() >= MAX_WAITERS {
                    self.replies
                        .push_back((cmd, Reply::Joined(Err(QueueError::Busy(MAX_WAITERS)))));
                    return;
                }
                let deadline = now.mono + FIND_TIMEOUT;
                self.docs.join_begins(now.mono);
                self.wait_for(
                    now,
                    &doc,
                    DocWaiter::Join {
                        cmd,
                        id,
                        from_peers,
                        deadline,
                        invite: None,
                    },
                );
            }
            Command::JoinInvite { token } => self.join_invite(now, cmd, &token),
            Command::Invite { queue, request } => {
                let r = self.invite(now, &queue, request);
                self.replies.push_back((cmd, Reply::Invited(r)));
            }
            Command::Members { queue } => {
                let r = self.members_of(&queue);
                self.replies.push_back((cmd, Reply::Members(r)));
            }
            Command::RemoveMember { queue, peer } => {
                let r = self.remove_member(now, &queue, &peer);
                self.replies.push_back((cmd, Reply::Members(r)));
            }
            Command::SetPaused { queue, paused } => {
                let action = if paused { "pausing" } else { "resuming" };
                let r = self
                    .require(&queue, MemberRole::Member, action)
                    .and_then(|()| {
                        self.write_setting(now, &queue, |d| {
                            queue::set_paused(d, paused, now.unix_ms).map_err(QueueError::from)
                        })
                    });
                self.replies.push_back((cmd, Reply::Paused(r)));
            }
            Command::SetConfig { queue, patch } => {
                let r = self
                    .require(&queue, MemberRole::Admin, "configuring")
                    .and_then(|()| {
                        self.write_setting(now, &queue, |d| {
                            queue::set_config(d, &patch, now.unix_ms)
                                .map(|_| ())
                                .map_err(QueueError::from)
                        })
                    });
                self.replies.push_back((cmd, Reply::Configured(r)));
            }
            Command::ListTasks {
                queue,
                state,
                limit,
                cursor,
            } => {
                self.list_tasks(now, cmd, queue, state, limit, cursor);
            }
            Command::SetBoost { queue, tag, boost } => {
                let r = self
                    .require(&queue, MemberRole::Member, "boosting")
                    .and_then(|()| {
                        self.write_setting(now, &queue, |d| {
                            queue::set_boost(d, &tag, boost, now.unix_ms).map_err(QueueError::from)
                        })
                    });
                self.replies.push_back((cmd, Reply::Configured(r)));
            }
            Command::PutSchedule {
                queue,
                name,
                schedule,
            } => {
                let r = self.put_schedule(now, &queue, &name, *schedule);
                self.replies.push_back((cmd, Reply::Schedules(r)));
            }
            Command::DeleteSchedule { queue, name } => {
                let r = self
                    .require(&queue, MemberRole::Admin, "deleting a schedule")
                    .and_then(|()| {
                        self.write_setting(now, &queue, |d| {
                            queue::delete_schedule(d, &name, now.unix_ms).map_err(|e| match e {
                                ScheduleError::Unknown(n) => {
                                    QueueError::UnknownSchedule(queue.clone(), n)
                                }
                                ScheduleError::Write(w) => QueueError::Write(w),
                                e => QueueError::InvalidSchedule(e.to_string()),
                            })
                        })
                    })
                    .map(|s| api::Schedules {
                        schedules: s.schedules,
                    });
                self.replies.push_back((cmd, Reply::Schedules(r)));
            }
            Command::Schedules { queue } => {
                let r = self
                    .queue_status(&queue)
                    .map(|s| api::Schedules {
                        schedules: s.schedules,
                    })
                    .ok_or(QueueError::NotJoined(queue));
                self.replies.push_back((cmd, Reply::Schedules(r)));
            }
            Command::Resources => {
                let r = self.resources(now);
                self.replies.push_back((cmd, Reply::Resources(Ok(r))));
            }
            Command::AddResource { name } => {
                let r = match piecework_queue_doc::valid_tag(&name) {
                    true => {
                        self.pool.add_resource(name, now.mono);
                        Ok(self.resources(now))
                    }
                    false => Err(api::ResourceError::InvalidName(name)),
                };
                self.replies.push_back((cmd, Reply::Resources(r)));
            }
            Command::WithdrawResource {
                name,
                restore_after,
            } => {
                let r = match self.pool.withdraw_resource(&name, now.mono, restore_after) {
                    true => Ok(self.resources(now)),
                    false => Err(api::ResourceError::NotHeld(name)),
                };
                self.replies.push_back((cmd, Reply::Resources(r)));
            }
            Command::Stop { grace } => self.stop(now, cmd, grace),
            Command::Submit { queue, task } => self.submit(now, cmd, queue, task),
            Command::SubmitMany { queue, tasks } => self.submit_many(now, cmd, queue, tasks),
            Command::CancelTask { task } => {
                self.life_command(now, cmd, task, lifecycle::Life::Cancel);
            }
            Command::RequeueTask { task } => {
                self.life_command(now, cmd, task, lifecycle::Life::Requeue);
            }
            Command::UndoTask { task } => self.undo_command(now, cmd, task),
            Command::RequeueFailed { queue } => self.requeue_all_command(now, cmd, queue),
            Command::TaskStatus { task, wait } => {
                if task_doc(&task).is_none() {
                    self.replies.push_back((
                        cmd,
                        Reply::Task(Box::new(Err(TaskError::BadId(task.to_string())))),
                    ));
                    return;
                }
                if self.waiting() >= MAX_WAITERS {
                    self.replies.push_back((
                        cmd,
                        Reply::Task(Box::new(Err(TaskError::Busy(MAX_WAITERS)))),
                    ));
                    return;
                }
                let wait_until = wait.map(|w| now.mono + w.min(MAX_WAIT));
                self.find_status(now, cmd, task, wait_until);
            }
            Command::Status => {
                let status = self.status();
                self.replies.push_back((cmd, Reply::Status(status)));
            }
            Command::QueueDocument { queue } => {
                let saved = self
                    .queues
                    .get(&queue)
                    .and_then(|q| Some((q.epoch, self.replica.get(&q.doc)?.save())))
                    .ok_or(QueueError::NotJoined(queue));
                self.replies.push_back((cmd, Reply::Document(saved)));
            }
        }
    }

    /// A queue was created (`view` is `None`) or joined: answered once its document is on
    /// disk ([`Core::check_opens`]), with the queue record written before it (the driver
    /// performs [`Io::RememberQueue`] first).
    pub(super) fn opened(&mut self, cmd: CommandId, queue: QueueId, view: Option<Arc<QueueView>>) {
        let Some(doc) = queue_doc(&queue) else {
            return;
        };
        let version = self.saves.version(&doc);
        self.opens.push(OpenWait {
            cmd,
            queue,
            doc,
            version,
            view,
        });
        self.check_opens();
    }

    /// Answers the creates and joins whose queue document is on disk, and fails those whose
    /// writes keep failing.
    pub(super) fn check_opens(&mut self) {
        if self.opens.is_empty() {
            return;
        }
        for w in std::mem::take(&mut self.opens) {
            let r = match (
                self.saves.is_durable(&w.doc, w.version),
                self.saves.failing(&w.doc),
            ) {
                (true, _) => Ok(()),
                (false, Some(e)) => Err(QueueError::NotDurable(w.queue.clone(), e.clone())),
                (false, None) => {
                    self.opens.push(w);
                    continue;
                }
            };
            let reply = match w.view {
                None => Reply::Created(r.map(|()| w.queue)),
                Some(view) => Reply::Joined(r.map(|()| view)),
            };
            self.replies.push_back((w.cmd, reply));
        }
    }

    /// Writes a setting of a joined queue (its pause flag or config) into its current
    /// document, and answers the queue's status with the write in its view.
    fn write_setting(
        &mut self,
        now: Time,
        id: &QueueId,
        f: impl FnOnce(&mut automerge::Automerge) -> Result<(), QueueError>,
    ) -> Result<api::QueueStatus, QueueError> {
        let doc = self
            .queues
            .get(id)
            .map(|q| q.doc.clone())
            .ok_or_else(|| QueueError::NotJoined(id.clone()))?;
        self.change(&doc, f)
            .unwrap_or(Err(QueueError::Write(queue::WriteError::NotAQueue)))?;
        self.stale.remove(id);
        self.refresh(now, id);
        self.queue_status(id)
            .ok_or_else(|| QueueError::NotJoined(id.clone()))
    }

    /// Checks a schedule's timing and task, then writes it.
    fn put_schedule(
        &mut self,
        now: Time,
        queue_id: &QueueId,
        name: &str,
        put: api::PutSchedule,
    ) -> Result<api::Schedules, QueueError> {
        self.require(queue_id, MemberRole::Admin, "writing a schedule")?;
        let bad = |m: String| QueueError::InvalidSchedule(m);
        let every = match (put.every_ms, put.cron) {
            (Some(ms), None) => Every::Ms(ms),
            (None, Some(c)) => Every::Cron(c),
            (Some(_), Some(_)) => return Err(bad("give every_ms or cron, not both".into())),
            (None, None) => return Err(bad("give every_ms or cron".into())),
        };
        let t = &put.task;
        Self::check_request(t).map_err(|e| bad(format!("invalid task template: {e}")))?;
        for (field, set) in [
            ("depends_on", !t.depends_on.is_empty()),
            ("not_before", t.not_before.is_some()),
            ("dedup_key", t.dedup_key.is_some()),
            ("idempotency_key", t.idempotency_key.is_some()),
        ] {
            if set {
                return Err(bad(format!(
                    "a schedule's task cannot carry {field}: it is the template of every slot's task (whose dedup key is schedule/<name>/<slot>)"
                )));
            }
        }
        // Fields at their defaults are left out of the record.
        let mut value = serde_json::to_value(t).map_err(|e| bad(e.to_string()))?;
        if let Some(map) = value.as_object_mut() {
            map.retain(|k, v| {
                !(v.is_null()
                    || v.as_array().is_some_and(Vec::is_empty)
                    || (k == "urgent" && v == false)
                    || (k == "priority" && v == 0))
            });
        }
        let template = value.to_string();
        self.write_setting(now, queue_id, |d| {
            queue::put_schedule(d, name, every, template, put.paused, now.unix_ms).map_err(|e| {
                match e {
                    ScheduleError::Write(w) => QueueError::Write(w),
                    e => QueueError::InvalidSchedule(e.to_string()),
                }
            })
        })
        .map(|s| api::Schedules {
            schedules: s.schedules,
        })
    }

    /// Answers a listing of a queue's tasks ([`Command::ListTasks`]): at once if only live
    /// tasks can match (`state` is not final), else once the store has read this node's
    /// finished tasks of the queue ([`Io::ListFinished`], [`Core::handle_listed`]).
    fn list_tasks(
        &mut self,
        now: Time,
        cmd: CommandId,
        queue: QueueId,
        state: Option<TaskState>,
        limit: usize,
        cursor: Option<TaskId>,
    ) {
        let limit = limit.clamp(1, api::MAX_LIST);
        if !self.queues.contains_key(&queue) {
            self.replies
                .push_back((cmd, Reply::Tasks(Err(QueueError::NotJoined(queue)))));
            return;
        }
        if state.is_some_and(|s| !s.is_final()) {
            let r = self.list_page(now, &queue, state, limit, cursor.as_ref(), Vec::new());
            self.replies.push_back((cmd, Reply::Tasks(r)));
            return;
        }
        self.io.push_back(Io::ListFinished {
            cmd,
            queue: queue.clone(),
            state,
            after: cursor.clone(),
            limit: limit + 1,
        });
        self.listings.insert(
            cmd,
            ListWait {
                queue,
                state,
                limit,
                cursor,
            },
        );
    }

    /// The store's answer to [`Io::ListFinished`]: the listing entries (JSON) it holds, in
    /// task id order; the listing waiting for them is answered.
    pub fn handle_listed(&mut self, now: Time, cmd: CommandId, entries: Vec<Vec<u8>>) {
        if let Some(w) = self.listings.remove(&cmd) {
            let r = self.list_page(now, &w.queue, w.state, w.limit, w.cursor.as_ref(), entries);
            self.replies.push_back((cmd, Reply::Tasks(r)));
        }
        self.turn(now);
    }

    /// A page of a queue's tasks, by id: those its current document indexes (live, and final
    /// until a rotation leaves them behind), those that ended lately on this node and left
    /// it (its recent ends), and `stored`: the listing entries of finished tasks the store
    /// read, which may repeat them (the view's or the recent end's status is shown then).
    /// Each entry is the task's status from the queue document (a task with a document of its
    /// own shows no input or result here), without runs. `next_cursor` is set if more follow.
    fn list_page(
        &self,
        now: Time,
        id: &QueueId,
        state: Option<TaskState>,
        limit: usize,
        cursor: Option<&TaskId>,
        stored: Vec<Vec<u8>>,
    ) -> Result<api::TaskList, QueueError> {
        let q = self
            .queues
            .get(id)
            .ok_or_else(|| QueueError::NotJoined(id.clone()))?;
        let doc = self.replica.get(&q.doc);
        let mut entries: BTreeMap<TaskId, std::sync::Arc<TaskEntry>> = BTreeMap::new();
        let after = |t: &TaskId| cursor.is_none_or(|c| t > c);
        for (tid, t) in q.view.tasks() {
            if after(tid) {
                entries.insert(tid.clone(), std::sync::Arc::clone(t));
            }
        }
        for end in self.ends.of_queue(id) {
            let tid = &end.entry().id;
            if after(tid) && !entries.contains_key(tid) {
                entries.insert(tid.clone(), end.shared_entry());
            }
        }
        // The first `limit + 1` matches of the view and the recent ends, then of the store:
        // the page is the first `limit` of their union, and more follow if it has more.
        let mut page: BTreeMap<TaskId, serde_json::Value> = BTreeMap::new();
        for (tid, t) in entries {
            if page.len() > limit {
                break;
            }
            let outputs = match (t.input.is_some() && t.state().is_final(), doc) {
                (true, Some(d)) => piecework_queue_doc::read_outputs(d, &tid),
                _ => Vec::new(),
            };
            let s = self.annotate(status_with_outputs(id, &t, &outputs), now);
            if state.is_some_and(|want| want != s.state) {
                continue;
            }
            let mut v = serde_json::to_value(&s).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.remove("runs");
            }
            page.insert(tid, v);
        }
        for json in stored {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&json) else {
                continue;
            };
            let Some(tid) = v.get("id").and_then(|i| i.as_str()).map(TaskId::new) else {
                continue;
            };
            let fits =
                state.is_none_or(|want| v.get("state") == serde_json::to_value(want).ok().as_ref());
            if after(&tid) && fits {
                page.entry(tid).or_insert(v);
            }
        }
        let more = page.len() > limit;
        let tasks: Vec<(TaskId, serde_json::Value)> = page.into_iter().take(limit).collect();
        let next_cursor = more.then(|| tasks.last().map(|(t, _)| t.clone())).flatten();
        Ok(api::TaskList {
            tasks: tasks.into_iter().map(|(_, v)| v).collect(),
            next_cursor,
        })
    }

    /// The status of a joined queue, from this node's view.
    pub(super) fn queue_status(&self, id: &QueueId) -> Option<api::QueueStatus> {
        let q = self.queues.get(id)?;
        let role = match q.router.role() {
            Role::Follower => "follower",
            Role::Claiming { .. } => "claiming",
            Role::Active { .. } => "active",
            Role::Stopped { .. } => "stopped",
        };
        Some(api::QueueStatus {
            id: id.clone(),
            name: q.view.name.clone(),
            router: q.view.router.clone(),
            role: role.to_owned(),
            members: q.view.members.len(),
            paused: q.view.paused,
            epoch: q.epoch,
            tasks: q.view.total_counts(),
            config: q.view.config.clone(),
            boosts: q.view.boosts.clone(),
            schedules: q
                .view
                .schedules
                .iter()
                .map(|(name, s)| api::ScheduleStatus::of(name, s))
                .collect(),
        })
    }

    pub(super) fn status(&self) -> Status {
        let queues = self
            .queues
            .keys()
            .filter_map(|id| self.queue_status(id))
            .collect();
        let workers = self
            .pool
            .runs()
            .map(|(i, run)| api::WorkerStatus {
                name: format!("{}/{i}", self.config.peer),
                running: run.map(|r| RunningReport {
                    queue: r.queue.clone(),
                    task: r.task.clone(),
                    attempt: r.attempt.clone(),
                    overdue: false,
                    progress: self.pool.progress(i),
                }),
            })
            .collect();
        Status {
            queues,
            workers,
            documents_loaded: self.replica.loaded(),
            internals: self
                .sizes()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }

    /// This node's resources, held and withdrawn, by name.
    fn resources(&self, now: Time) -> api::Resources {
        let (held, withdrawn) = self.pool.resources();
        let mut resources: Vec<api::Resource> = held
            .iter()
            .map(|name| api::Resource {
                name: name.clone(),
                held: true,
                restore_at: None,
            })
            .chain(withdrawn.iter().map(|(name, at)| {
                let wait = at.saturating_duration_since(now.mono).as_millis();
                api::Resource {
                    name: name.clone(),
                    held: false,
                    restore_at: Some(
                        now.unix_ms
                            .saturating_add(u64::try_from(wait).unwrap_or(u64::MAX)),
                    ),
                }
            }))
            .collect();
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        api::Resources { resources }
    }
}
