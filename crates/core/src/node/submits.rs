//! Submits: checking a request, writing a task (inline, or with its document) and its index entry
//! in one batch, and answering once durable and replicated. May ask `documents` (changes, waits)
//! and `queues` (the current view).

use super::*;

impl Core {
    pub(super) fn submit(
        &mut self,
        now: Time,
        cmd: CommandId,
        queue_id: QueueId,
        req: api::SubmitTask,
    ) {
        match self.submit_batch(now, Some(cmd), queue_id, vec![req], false, &[]) {
            Ok(()) => {}
            Err(e) => self.replies.push_back((cmd, Reply::Submitted(Err(e)))),
        }
    }

    pub(super) fn submit_many(
        &mut self,
        now: Time,
        cmd: CommandId,
        queue_id: QueueId,
        reqs: Vec<api::SubmitTask>,
    ) {
        if reqs.len() > api::MAX_BATCH {
            self.replies.push_back((
                cmd,
                Reply::SubmittedMany(Err(SubmitError::TooMany(reqs.len()))),
            ));
            return;
        }
        if let Err(e) = self.submit_batch(now, Some(cmd), queue_id, reqs, true, &[]) {
            self.replies.push_back((cmd, Reply::SubmittedMany(Err(e))));
        }
    }

    /// Carries out a router's firings of schedules: one task per firing from its schedule's
    /// template, with the firing's dedup key, and the slots recorded in the same change. A
    /// template that no longer reads as a submit (or a schedule deleted meanwhile) fires no
    /// task, and its slot passes. If the queue takes no submit now (full, busy, disk
    /// failing), the slots pass and count as missed.
    pub(super) fn fire(&mut self, now: Time, queue_id: &QueueId, firings: Vec<Firing>) {
        let Some(view) = self.queues.get(queue_id).map(|q| Arc::clone(&q.view)) else {
            return;
        };
        let reqs: Vec<api::SubmitTask> = firings
            .iter()
            .map(|f| {
                view.schedules
                    .get(&f.schedule)
                    .and_then(|s| api::SubmitTask::from_template(&s.template).ok())
                    .map(|mut r| {
                        r.dedup_key = Some(f.dedup_key());
                        r
                    })
                    // An empty kind: refused, and only the slot is recorded.
                    .unwrap_or_else(|| api::SubmitTask::new("", serde_json::Value::Null))
            })
            .collect();
        if let Err(e) = self.submit_batch(now, None, queue_id.clone(), reqs, true, &firings) {
            tracing::warn!(queue = %queue_id, "schedule slots missed: {e}");
            let missed: Vec<Firing> = firings
                .into_iter()
                .map(|f| Firing {
                    missed: f.missed.saturating_add(1),
                    ..f
                })
                .collect();
            self.write_queue(now, queue_id, "missed schedule slots", |d| {
                queue::submit_fired(d, &[], &[], &[], &missed, now.unix_ms)
            });
        }
    }

    /// Checks a request on its own (before any document is touched).
    pub(super) fn check_request(req: &api::SubmitTask) -> Result<(), SubmitError> {
        if req.kind.trim().is_empty() {
            return Err(SubmitError::Invalid("the kind is empty".into()));
        }
        if req.priority.unsigned_abs() > queue::MAX_PRIORITY.unsigned_abs() {
            return Err(SubmitError::Invalid(format!(
                "priority {} is outside [-{max}, {max}]",
                req.priority,
                max = queue::MAX_PRIORITY
            )));
        }
        if let Some(m) = req.max_attempts {
            let (lo, hi) = (QueueConfig::MIN_MAX_ATTEMPTS, QueueConfig::MAX_MAX_ATTEMPTS);
            if !(lo..=hi).contains(&m) {
                return Err(SubmitError::Invalid(format!(
                    "max_attempts {m} is outside [{lo}, {hi}]"
                )));
            }
        }
        if let Some(t) = req.tags.iter().find(|t| !piecework_queue_doc::valid_tag(t)) {
            return Err(SubmitError::Invalid(format!(
                "invalid tag {t:?}: tags are 1 to {} ASCII letters, digits, '_', '-', '.' or ':'",
                piecework_queue_doc::MAX_TAG_LEN
            )));
        }
        if req.tags.len() > piecework_queue_doc::MAX_TAGS {
            return Err(SubmitError::Invalid(format!(
                "a task carries at most {} tags",
                piecework_queue_doc::MAX_TAGS
            )));
        }
        if let Some(r) = req
            .requires
            .iter()
            .find(|r| !piecework_queue_doc::valid_tag(r))
        {
            return Err(SubmitError::Invalid(format!(
                "invalid resource {r:?} in requires: names are 1 to {} ASCII letters, digits, '_', '-', '.' or ':'",
                piecework_queue_doc::MAX_TAG_LEN
            )));
        }
        if req.requires.len() > piecework_queue_doc::MAX_TAGS {
            return Err(SubmitError::Invalid(format!(
                "a task requires at most {} resources",
                piecework_queue_doc::MAX_TAGS
            )));
        }
        if req.depends_on.len() > piecework_queue_doc::MAX_DEPENDENCIES {
            return Err(SubmitError::Invalid(format!(
                "a task depends on at most {} tasks",
                piecework_queue_doc::MAX_DEPENDENCIES
            )));
        }
        for (what, k) in [
            ("dedup key", &req.dedup_key),
            ("idempotency key", &req.idempotency_key),
        ] {
            if let Some(k) = k
                && (k.is_empty() || k.len() > piecework_queue_doc::MAX_KEY_LEN)
            {
                return Err(SubmitError::Invalid(format!(
                    "a {what} is 1 to {} bytes",
                    piecework_queue_doc::MAX_KEY_LEN
                )));
            }
        }
        if let Some(ms) = req.timeout_ms
            && !(1..=piecework_queue_doc::MAX_TIMEOUT_MS).contains(&ms)
        {
            return Err(SubmitError::Invalid(format!(
                "timeout_ms is 1 to {} (7 days)",
                piecework_queue_doc::MAX_TIMEOUT_MS
            )));
        }
        if req.delay_ms.is_some() && req.not_before.is_some() {
            return Err(SubmitError::Invalid(
                "give delay_ms or not_before, not both".into(),
            ));
        }
        if let Some(t) = &req.not_before {
            not_before_ms(t)?;
        }
        Ok(())
    }

    /// The task a submit with idempotency key `key` made, as the queue's current document or a
    /// sealed one this node holds records it (a record written late into a sealed epoch is
    /// there until carried).
    fn idempotent_task(&self, queue: &QueueId, key: &str) -> Option<TaskId> {
        let q = self.queues.get(queue)?;
        std::iter::once(&q.doc)
            .chain(q.sealed.keys())
            .filter_map(|d| self.replica.get(d))
            .find_map(|d| queue::idempotent_task(d, key))
    }

    /// The rules of a checked request submitted at `now_ms`: its tags, its not-before time,
    /// and its dependencies, each of which must be in the queue's view, or have ended lately
    /// on this node (its outcome is then recorded with the entry).
    fn rules_of(
        &self,
        view: &QueueView,
        req: &api::SubmitTask,
        now_ms: u64,
    ) -> Result<piecework_queue_doc::Rules, SubmitError> {
        let mut rules = piecework_queue_doc::Rules {
            tags: req.tags.clone(),
            not_before: match (&req.not_before, req.delay_ms) {
                (Some(t), _) => not_before_ms(t)?,
                (None, Some(d)) => now_ms.saturating_add(d),
                (None, None) => 0,
            },
            depends_on: req.depends_on.clone(),
            outcomes: Default::default(),
            follows: None,
            undoes: None,
            dedup_key: req.dedup_key.clone(),
            // The key's tasks this node sees (none pending, or the submit bumps one instead):
            // the new task is no copy of them.
            dedup_after: req
                .dedup_key
                .as_deref()
                .map(|k| {
                    view.with_dedup_key(k)
                        .iter()
                        .map(|t| t.id.clone())
                        .collect()
                })
                .unwrap_or_default(),
            idempotency_key: req.idempotency_key.clone(),
            timeout_ms: req.timeout_ms.unwrap_or(0),
            requires: {
                let mut r = req.requires.clone();
                // A kind whose failures pause a resource requires it.
                if let piecework_queue_doc::FailurePolicy::PauseResource { resource, .. } =
                    view.config.policy_of(&req.kind)
                {
                    r.push(resource.clone());
                }
                r.sort();
                r.dedup();
                r
            },
        };
        for d in &req.depends_on {
            if view.task(d).is_some() {
                continue;
            }
            match self.ends.get(d).map(|e| e.entry().state()) {
                Some(s) if s.is_final() => {
                    rules.outcomes.insert(d.clone(), s);
                }
                _ => {
                    return Err(SubmitError::Invalid(format!(
                        "unknown dependency {d}: no task of this queue has that id"
                    )));
                }
            }
        }
        Ok(rules)
    }

    /// Submits `reqs` with one change to the queue document; the reply to `cmd` waits in
    /// [`Core::check_submits`]. An error refuses the whole batch; a single submit
    /// (`many == false`) is refused by its entry's error too. Without a command,
    /// the submits are a router's `firings` of schedules (one per firing, in order), and the
    /// same change records their slots.
    pub(super) fn submit_batch(
        &mut self,
        now: Time,
        cmd: Option<CommandId>,
        queue_id: QueueId,
        reqs: Vec<api::SubmitTask>,
        many: bool,
        firings: &[piecework_queue_doc::Firing],
    ) -> Result<(), SubmitError> {
        if !many && let Some(req) = reqs.first() {
            Self::check_request(req)?;
        }
        let Some((qdoc, root, c)) = self
            .queues
            .get(&queue_id)
            .map(|q| (q.doc.clone(), q.root.clone(), q.view.counts()))
        else {
            return Err(SubmitError::NotJoined(queue_id));
        };
        // A node the queue removed submits nothing more (its members would not take it).
        if self.queues.get(&queue_id).is_some_and(|q| {
            q.view
                .membership
                .records()
                .get(&self.config.peer)
                .is_some_and(|r| !r.active())
        }) {
            return Err(SubmitError::Removed(queue_id));
        }
        if self.submits.is_full() {
            return Err(SubmitError::Busy(MAX_PENDING_SUBMITS));
        }
        // The disk refuses writes (full): refused before anything is written, so that no
        // task the caller was refused turns up once the disk has room.
        if let Some(e) = self.saves.store_failing() {
            return Err(SubmitError::NotDurable(e.clone()));
        }
        let live = c.pending + c.assigned + c.running + c.input_unavailable;
        if live >= self.config.max_live {
            return Err(SubmitError::Full {
                queue: queue_id,
                live,
                max: self.config.max_live,
            });
        }
        let mut answers: Vec<Result<(TaskId, bool), String>> = Vec::with_capacity(reqs.len());
        // Dedup: bumps of pending tasks, and the keys this batch adds (a later entry with one
        // is deduplicated into the earlier, raising its priority fields).
        let mut bumps: Vec<(TaskId, piecework_queue_doc::Bump)> = Vec::new();
        let mut batch_keys: BTreeMap<String, usize> = BTreeMap::new();
        let mut batch_idem: BTreeMap<String, TaskId> = BTreeMap::new();
        // Each idempotency key this change records, with the task its submit answered.
        let mut idem: Vec<(String, TaskId)> = Vec::new();
        let mut submissions = Vec::with_capacity(reqs.len());
        let mut docs = Vec::with_capacity(reqs.len());
        let view = Arc::clone(&self.queues[&queue_id].view);
        for req in reqs {
            if let Err(e) = Self::check_request(&req) {
                answers.push(Err(e.to_string()));
                continue;
            }
            let rules = match self.rules_of(&view, &req, now.unix_ms) {
                Ok(r) => r,
                Err(e) if !many => return Err(e),
                Err(e) => {
                    answers.push(Err(e.to_string()));
                    continue;
                }
            };
            if let Some(key) = &req.idempotency_key {
                // A retry: the task the first submit of the key made (in this batch, or
                // recorded in the queue document).
                let earlier = batch_idem
                    .get(key)
                    .cloned()
                    .or_else(|| self.idempotent_task(&queue_id, key));
                if let Some(id) = earlier {
                    answers.push(Ok((id, false)));
                    continue;
                }
            }
            if let Some(key) = &req.dedup_key {
                let found = if let Some(&i) = batch_keys.get(key) {
                    let s: &mut Submission = &mut submissions[i];
                    s.priority = s.priority.max(req.priority);
                    s.urgent |= req.urgent;
                    Some(s.id.clone())
                } else if let Some(t) = view.dedup_target(key) {
                    let b = piecework_queue_doc::Bump {
                        t: now.unix_ms,
                        p: t.priority_now().max(req.priority),
                        u: t.urgent_now() || req.urgent,
                    };
                    bumps.push((t.id.clone(), b));
                    Some(t.id.clone())
                } else {
                    None
                };
                if let Some(id) = found {
                    // A retry of this submit answers the task it was deduplicated into.
                    if let Some(k) = &req.idempotency_key {
                        batch_idem.insert(k.clone(), id.clone());
                        idem.push((k.clone(), id.clone()));
                    }
                    answers.push(Ok((id, true)));
                    continue;
                }
            }
            let text = serde_json::to_string(&req.input).unwrap_or_default();
            let inline = !text.is_empty() && text.len() <= self.config.inline_input_max;
            // Inline: the entry carries the input and there is no task document.
            let doc = if inline {
                None
            } else {
                let mut doc = self.new_doc();
                let new = NewTask {
                    queue: queue_id.clone(),
                    kind: req.kind.clone(),
                    input: req.input,
                    submitter: self.config.peer.clone(),
                    submitted_at: now.unix_ms,
                };
                if let Err(e) = task::init(&mut doc, &new) {
                    if !many {
                        return Err(e.into());
                    }
                    answers.push(Err(SubmitError::from(e).to_string()));
                    continue;
                }
                Some(doc)
            };
            let tdoc = DocId::generate(&mut self.rng);
            let task_id = TaskId::new(tdoc.as_str());
            submissions.push(Submission {
                id: task_id.clone(),
                kind: req.kind,
                submitter: self.config.peer.clone(),
                submitted_at: now.unix_ms,
                priority: req.priority,
                urgent: req.urgent,
                max_attempts: req.max_attempts,
                input: inline.then_some(text),
                rules,
            });
            if let Some(key) = &req.dedup_key {
                batch_keys.insert(key.clone(), submissions.len() - 1);
            }
            if let Some(key) = &req.idempotency_key {
                batch_idem.insert(key.clone(), task_id.clone());
                idem.push((key.clone(), task_id.clone()));
            }
            answers.push(Ok((task_id, false)));
            if let Some(doc) = doc {
                docs.push((tdoc, doc));
            }
        }
        // The task documents first, so that they are scoped (indexed) when peers receive the
        // entries.
        let mut tasks = Vec::with_capacity(docs.len());
        for (tdoc, doc) in docs {
            let heads = doc.get_heads();
            self.replica.create(
                tdoc.clone(),
                doc,
                Some(Scope {
                    group: root.clone(),
                    announce: true,
                    requestable: false,
                }),
            );
            self.saves.changed(&tdoc);
            // Leaves memory once saved and idle (it is read again when a run starts).
            self.docs.may_evict(tdoc.clone(), now.mono);
            tasks.push((tdoc.clone(), heads, self.saves.version(&tdoc)));
        }
        let r = self.change(&qdoc, |d| {
            queue::submit_fired(d, &submissions, &bumps, &idem, firings, now.unix_ms)?;
            Ok::<_, queue::SubmitError>(d.get_heads())
        });
        let queue_heads = match r {
            Some(Ok(h)) => h,
            other => {
                for (tdoc, _, _) in &tasks {
                    self.replica.clear_scope(tdoc);
                }
                return Err(match other {
                    Some(Err(e)) => e.into(),
                    _ => SubmitError::NotJoined(queue_id),
                });
            }
        };
        let Some(cmd) = cmd else {
            // Fired by a router: nobody waits for an answer.
            return Ok(());
        };
        let answer = if many {
            SubmitAnswer::Many(answers)
        } else {
            match answers.pop() {
                Some(Ok((id, dedup))) => SubmitAnswer::One(id, dedup),
                _ => unreachable!("a single submit's refusal returned above"),
            }
        };
        self.submits.wait(SubmitWait {
            cmd,
            answer,
            tasks,
            queue: queue_id,
            queue_version: self.saves.version(&qdoc),
            queue_doc: qdoc,
            queue_heads,
            deadline: now.mono + REPLICATION_WAIT,
        });
        Ok(())
    }

    /// Answers submits that are durable and either held by a peer or out of time (or alone),
    /// and fails those whose documents cannot be written. Runs only when a save ended, a peer
    /// sent something, a submit arrived or the oldest wait's deadline passed.
    pub(super) fn check_submits(&mut self, now: Time) {
        let Some(waits) = self.submits.take_due(now.mono) else {
            return;
        };
        for w in waits {
            let failing = w
                .tasks
                .iter()
                .find_map(|(d, _, _)| self.saves.failing(d))
                .or_else(|| self.saves.failing(&w.queue_doc))
                .cloned();
            let durable = w.tasks.iter().all(|(d, _, v)| self.saves.is_durable(d, *v))
                && self.saves.is_durable(&w.queue_doc, w.queue_version);
            if !durable {
                if let Some(e) = failing {
                    self.release_acking(now, &w);
                    let reply = match w.answer {
                        SubmitAnswer::One(..) => Reply::Submitted(Err(SubmitError::NotDurable(e))),
                        SubmitAnswer::Many(_) => {
                            Reply::SubmittedMany(Err(SubmitError::NotDurable(e)))
                        }
                    };
                    self.replies.push_back((w.cmd, reply));
                } else {
                    self.submits.still_waiting(w);
                }
                continue;
            }
            let alone = self.queues.get(&w.queue).is_none_or(|q| {
                !q.view
                    .members
                    .keys()
                    .any(|m| *m != self.config.peer && self.members.is_connected(m))
            });
            let held = w.tasks.iter().all(|(d, h, _)| self.replica.peer_has(d, h))
                && self.replica.peer_has(&w.queue_doc, &w.queue_heads);
            if !(held || alone || now.mono >= w.deadline) {
                // Only its deadline (or a peer's message, which marks the waits dirty) can
                // answer it now.
                self.submits.waits_for_deadline(w);
                continue;
            }
            self.release_acking(now, &w);
            let reply = match w.answer {
                SubmitAnswer::One(task_id, deduplicated) => Reply::Submitted(Ok(api::Submitted {
                    task_id,
                    replicated: held,
                    deduplicated,
                })),
                SubmitAnswer::Many(answers) => Reply::SubmittedMany(Ok(answers
                    .into_iter()
                    .enumerate()
                    .map(|(index, a)| match a {
                        Ok((task_id, deduplicated)) => api::BatchEntry::Submitted {
                            index,
                            task_id,
                            replicated: held,
                            deduplicated,
                        },
                        Err(error) => api::BatchEntry::Refused { index, error },
                    })
                    .collect())),
            };
            self.replies.push_back((w.cmd, reply));
        }
    }

    /// A submit is answered: its documents may leave memory once idle.
    pub(super) fn release_acking(&mut self, now: Time, w: &SubmitWait) {
        for (d, _, _) in &w.tasks {
            self.submits.release(d);
            self.docs.may_evict(d.clone(), now.mono);
        }
    }
}

/// A not-before time in RFC 3339, in unix ms.
fn not_before_ms(text: &str) -> Result<u64, SubmitError> {
    let t = humantime::parse_rfc3339_weak(text).map_err(|e| {
        SubmitError::Invalid(format!(
            "not_before {text:?} is not an RFC 3339 time (e.g. 2026-11-28T09:00:00Z): {e}"
        ))
    })?;
    let ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| SubmitError::Invalid(format!("not_before {text:?} is before 1970")))?
        .as_millis();
    Ok(u64::try_from(ms).unwrap_or(u64::MAX))
}
