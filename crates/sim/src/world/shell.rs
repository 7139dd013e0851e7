//! What a node's shell does: after every input, drain the core's events, replies, I/O and
//! frames, carry each out, and set one timer at `poll_timeout`.
//!
//! It owns no state of its own beyond the nodes' shell fields (`submits`, `joins`,
//! `subscribed`, `live`, `built`, `timer_generation`). It turns the core's I/O into disk writes
//! and reads, handler runs, frames and heartbeats, and successor builds; it reads replies and
//! events, and counts what they show. It fires the node's timer, ends its handler runs and
//! hands back the successors it built.
//!
//! It asks the parent for the event queue, the clock, `count`, `trace` and the run records; the
//! network for `send_sync` and `gossip`; the disk through the node's [`Disk`] fields; the
//! clients for `acknowledged` and `submit_refused`; the faults for `down` when a stop is
//! answered; and the invariants for the checks at each save, run start and view. Every other
//! module asks it for `drive` after it gives a core an input.
//!
//! [`Disk`]: super::disk::Disk

use std::sync::Arc;

use piecework_core::api::BatchEntry;
use piecework_core::{
    CommandId, EpochEvent, Event, Io, Reply, RotateId, RouterEvent, RunId, RunResult,
};
use piecework_queue_doc::{AttemptOutcome, QueueId, QueueView, TaskState};
use rand::Rng;

use super::{BUILD_US, End, Ev, Live, READ_US, RETRY_US, RunRec, World};

impl World {
    /// Carries out everything node `i`'s core asks for, watches what it reports, and sets its
    /// timer: what the node's shell does after every input.
    pub(super) fn drive(&mut self, i: usize) {
        if !self.nodes[i].up {
            return;
        }
        loop {
            let mut any = false;
            while let Some(ev) = self.nodes[i].core.poll_event() {
                any = true;
                self.event(i, ev);
            }
            while let Some((cmd, reply)) = self.nodes[i].core.poll_reply() {
                any = true;
                self.reply(i, cmd, reply);
            }
            while let Some(io) = self.nodes[i].core.poll_io() {
                any = true;
                self.io(i, io);
            }
            let now = self.time(i).mono;
            while let Some((to, frame)) = self.nodes[i].core.poll_transmit(now) {
                any = true;
                if let Some(j) = self.index_of(&to) {
                    self.send_sync(i, j, frame);
                }
            }
            if !any {
                break;
            }
        }
        self.note_claims_held(i);
        let next = self.nodes[i].core.poll_timeout();
        let n = &mut self.nodes[i];
        n.timer_generation += 1;
        let generation = n.timer_generation;
        if let Some(at) = next {
            let at = self.global_of(i, at);
            self.schedule_at(
                at,
                Ev::Timer {
                    node: i,
                    generation,
                },
            );
        }
    }

    /// The node's timer fires, if it is still the one last set.
    pub(super) fn timer_fired(&mut self, node: usize, generation: u64) {
        if !self.nodes[node].up || self.nodes[node].timer_generation != generation {
            return;
        }
        let t = self.time(node);
        self.nodes[node].core.handle_timeout(t);
        self.drive(node);
    }

    /// Ends node `node`'s run `run` in the simulator's records (`end`, now), if it is live.
    fn end_run(&mut self, node: usize, run: RunId, end: End) -> Option<Live> {
        let live = self.nodes[node].live.remove(&run)?;
        let now = self.now_us;
        if let Some(r) = self.runs.get_mut(&live.task).and_then(|v| {
            v.iter_mut()
                .rev()
                .find(|r| r.node == node && r.end.is_none())
        }) {
            r.end = Some(end);
            r.end_us = Some(now);
        }
        Some(live)
    }

    /// A handler run ends, unless its node went down meanwhile.
    pub(super) fn run_ended(&mut self, node: usize, incarnation: u64, run: RunId, ok: bool) {
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        // A handler asked to stop ends with an error, whenever it returns.
        let ok = ok && !self.nodes[node].live.get(&run).is_some_and(|l| l.signalled);
        let end = if ok { End::Succeeded } else { End::Failed };
        let Some(live) = self.end_run(node, run, end) else {
            return;
        };
        if !ok {
            self.count("handler_failure");
        }
        self.trace(|| format!("node{node} run of {} ended ok={ok}", live.task));
        let result = RunResult {
            result: match ok {
                true => Ok(serde_json::json!({"ok": true})),
                false => Err("simulated failure".into()),
            },
            logs: vec![],
            planned: if ok {
                self.planned_for(&live.task)
            } else {
                Default::default()
            },
        };
        let t = self.time(node);
        self.nodes[node].core.handle_run_ended(t, run, result);
        self.drive(node);
    }

    /// The core interrupted a run (a stop's grace ran out) and the handler is cancelled at
    /// once: its run ends now, as a crash ends it (its task runs again elsewhere), and its
    /// scheduled end finds nothing.
    fn run_aborted(&mut self, node: usize, run: RunId) {
        let Some(live) = self.end_run(node, run, End::Crashed) else {
            return;
        };
        self.count("run_aborted");
        self.trace(|| format!("node{node} run of {} aborted", live.task));
    }

    /// A successor built off the node's thread is handed back.
    pub(super) fn rotated(&mut self, node: usize, incarnation: u64, id: RotateId) {
        let Some(built) = self.nodes[node].built.remove(&id) else {
            return;
        };
        if !self.nodes[node].up || self.nodes[node].incarnation != incarnation {
            return;
        }
        let t = self.time(node);
        self.nodes[node].core.handle_rotated(t, built);
        self.drive(node);
    }

    fn io(&mut self, i: usize, io: Io) {
        let inc = self.nodes[i].incarnation;
        match io {
            Io::Load { doc } => {
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Loaded {
                        node: i,
                        incarnation: inc,
                        doc,
                    },
                );
            }
            Io::Save(save) => {
                self.a_saved_document_belongs_to_a_joined_queue(i, &save.doc);
                let (lo, hi) = self.config.mix.write_us;
                let us = self.rng.random_range(lo..=hi.max(lo));
                let id = save.id;
                self.nodes[i].disk.pending.insert(id, save);
                self.schedule_at(
                    self.now_us + us,
                    Ev::Saved {
                        node: i,
                        incarnation: inc,
                        id,
                    },
                );
            }
            Io::Abort { run } => self.run_aborted(i, run),
            Io::Cancel { run } => {
                // Most handlers observe the signal and return an error soon; the others run
                // on to their end, past the grace time if it is long.
                self.count("run_cancel_signalled");
                let Some(live) = self.nodes[i].live.get_mut(&run) else {
                    return;
                };
                live.signalled = true;
                if self.rng.random_bool(0.7) {
                    let us = self.rng.random_range(0..=50_000);
                    self.schedule_at(
                        self.now_us + us,
                        Ev::RunEnd {
                            node: i,
                            incarnation: inc,
                            run,
                            ok: false,
                        },
                    );
                }
            }
            Io::Run(req) => {
                let claim = req.attempt.claim.clone();
                let assigned_us = self.assigned_us(i, &req.queue, &req.task, &req.attempt);
                let tainted = self.cut_from_its_router_since(i, &claim, assigned_us);
                self.check_start(i, &req.queue, &req.task, &claim, tainted);
                self.a_run_starts_only_where_its_kind_and_resources_are(i, &req.task);
                self.a_cancelled_task_never_starts(i, &req.queue, &req.task);
                self.a_follow_up_starts_after_its_success(i, &req.queue, &req.task);
                self.no_task_is_assigned_before_its_not_before(
                    i,
                    &req.queue,
                    &req.task,
                    &req.attempt,
                );
                self.trace(|| {
                    format!(
                        "node{i} starts {} {} on {}",
                        req.task, req.attempt, req.worker
                    )
                });
                let (lo, hi) = self.config.mix.run_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let ok = !self.rng.random_bool(self.config.mix.handler_failure);
                self.nodes[i].live.insert(
                    req.id,
                    Live {
                        task: req.task.clone(),
                        queue: req.queue.clone(),
                        claim: claim.clone(),
                        tainted,
                        signalled: false,
                    },
                );
                self.runs.entry(req.task.clone()).or_default().push(RunRec {
                    node: i,
                    claim,
                    assigned_us,
                    start_us: self.now_us,
                    end_us: None,
                    end: None,
                });
                self.schedule_at(
                    self.now_us + ms * 1000,
                    Ev::RunEnd {
                        node: i,
                        incarnation: inc,
                        run: req.id,
                        ok,
                    },
                );
            }
            // Every pair of up, uncut nodes is connected: dials change nothing here.
            Io::Dial { .. } => {}
            Io::Publish { topic, data } => {
                let data = self.flood_pool_beat(i, data);
                self.gossip(i, topic, data)
            }
            Io::Subscribe { topic } => {
                self.nodes[i].subscribed.insert(topic);
            }
            // Gossip standing is the transport's; the simulated network has none.
            Io::Standing { .. } => {}
            Io::RememberQueue { id, .. } => {
                self.nodes[i].disk.queues.insert(id);
            }
            Io::RememberEpoch { queue, doc } => {
                self.nodes[i].disk.epochs.insert(queue, doc);
            }
            Io::Rotate(job) => {
                // Built at once (it is deterministic), handed back later: the router goes on
                // writing the document meanwhile, and those writes are carried as late ones.
                let id = job.id;
                self.nodes[i].built.insert(id, job.build());
                let us = self.rng.random_range(BUILD_US.0..=BUILD_US.1);
                self.schedule_at(
                    self.now_us + us,
                    Ev::Rotated {
                        node: i,
                        incarnation: inc,
                        id,
                    },
                );
            }
            Io::Retire { doc, kind } => {
                let retired = &mut self.nodes[i].disk.retired;
                if !retired.iter().any(|(d, _)| *d == doc) {
                    retired.push((doc, kind));
                }
            }
            Io::Quarantine { doc, chunk } => {
                if let Some(chunks) = self.nodes[i].disk.docs.get_mut(&doc) {
                    chunks.retain(|_, c| *c != chunk);
                }
            }
            Io::Delete { doc } => {
                self.count("deleted_docs");
                let disk = &mut self.nodes[i].disk;
                disk.delete(&doc);
                disk.retired.retain(|(d, _)| *d != doc);
            }
            Io::Archive {
                records,
                listed,
                ends,
            } => {
                self.count("archived");
                self.nodes[i].disk.archive.extend(records);
                self.nodes[i].disk.ends.extend(ends);
                for l in listed {
                    let key = (l.queue.clone(), l.task.clone());
                    self.nodes[i].disk.listing.insert(key, l);
                }
            }
            Io::ListFinished {
                cmd,
                queue,
                state,
                after,
                limit,
            } => {
                let read = super::disk::ListRead {
                    queue,
                    state,
                    after,
                    limit,
                };
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Listed {
                        node: i,
                        incarnation: inc,
                        cmd,
                        read,
                    },
                );
            }
            Io::LookupEnds {
                lookup,
                tasks,
                failed_in,
            } => {
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Ends {
                        node: i,
                        incarnation: inc,
                        lookup,
                        tasks,
                        failed_in,
                    },
                );
            }
            Io::Lookup { task } => {
                self.schedule_at(
                    self.now_us + READ_US,
                    Ev::Archived {
                        node: i,
                        incarnation: inc,
                        task,
                    },
                );
            }
        }
    }

    fn reply(&mut self, i: usize, cmd: CommandId, reply: Reply) {
        self.life_reply(&reply);
        match reply {
            Reply::Submitted(r) => {
                if self.retry_answered(i, cmd, r.as_ref().ok().map(|s| &s.task_id)) {
                    return;
                }
                let Some((queue, _)) = self.nodes[i].submits.get(&cmd).cloned() else {
                    return;
                };
                match r {
                    Ok(s) => {
                        self.note_acknowledged(i, cmd, 0, &s.task_id, s.deduplicated);
                        self.nodes[i].submits.remove(&cmd);
                        self.acknowledged(i, &queue, s.task_id, s.deduplicated)
                    }
                    Err(e) => {
                        self.nodes[i].submits.remove(&cmd);
                        self.submit_refused(i, 1, &e.to_string())
                    }
                }
                self.forget_submit(i, cmd);
            }
            Reply::SubmittedMany(r) => {
                let Some((queue, n)) = self.nodes[i].submits.remove(&cmd) else {
                    return;
                };
                match r {
                    Ok(entries) => {
                        self.count("batch_submit");
                        for e in entries {
                            match e {
                                BatchEntry::Submitted {
                                    task_id,
                                    index,
                                    deduplicated,
                                    ..
                                } => {
                                    self.note_acknowledged(i, cmd, index, &task_id, deduplicated);
                                    self.acknowledged(i, &queue, task_id, deduplicated)
                                }
                                BatchEntry::Refused { error, .. } => {
                                    self.submit_refused(i, 1, &error)
                                }
                            }
                        }
                    }
                    Err(e) => self.submit_refused(i, n, &e.to_string()),
                }
                self.forget_submit(i, cmd);
            }
            Reply::Joined(r) => {
                let Some(q) = self.nodes[i].joins.remove(&cmd) else {
                    return;
                };
                if let Err(e) = r {
                    self.trace(|| format!("node{i} could not join queue {q}: {e}"));
                    self.schedule_at(self.now_us + RETRY_US, Ev::Join { node: i, queue: q });
                }
            }
            Reply::Invited(r) => {
                let Some((invitee, q)) = self.nodes[i].inviting.remove(&cmd) else {
                    return;
                };
                match r {
                    Ok(inv) => {
                        self.invites.insert((invitee, q), inv.token);
                    }
                    Err(e) => self.trace(|| format!("node{i} could not invite node{invitee}: {e}")),
                }
            }
            Reply::Created(_)
            | Reply::Paused(_)
            | Reply::Configured(_)
            | Reply::Tasks(_)
            | Reply::Task(_)
            | Reply::TaskIds(_)
            | Reply::Undone(_)
            | Reply::Status(_)
            | Reply::Document(_)
            | Reply::Resources(_)
            | Reply::Members(_)
            | Reply::Schedules(_) => {}
            Reply::Stopped(report) => {
                if self.nodes[i].stopping != Some(cmd) {
                    return;
                }
                if report.handed_over.iter().any(|(_, to)| to.is_some()) {
                    self.count("router_handed_over");
                }
                if report.runs_interrupted > 0 {
                    self.count("runs_interrupted_by_a_stop");
                }
                // The process exits once its stop is answered: down like a crash (its runs
                // still going are abandoned), and restarted after a downtime.
                self.down(i, true);
            }
        }
    }

    fn event(&mut self, i: usize, ev: Event) {
        match ev {
            Event::View { queue, view } => self.watch_view(i, &queue, &view),
            Event::Queue(e) => self.count(&format!("event_{}", e.event)),
            Event::Router { event, queue } => match event {
                RouterEvent::BecameActive(c) => {
                    self.activations += 1;
                    if !self.activated.insert(queue.clone()) {
                        self.takeovers += 1;
                    }
                    self.trace(|| format!("node{i} active for {queue} as {c}"));
                }
                RouterEvent::Reunited { .. } => {
                    self.count("router_reunited");
                    self.trace(|| format!("node{i} router: {event:?}"));
                }
                RouterEvent::SteppedDown { .. } => {
                    self.count("router_stepped_down");
                    self.trace(|| format!("node{i} router: {event:?}"));
                }
                RouterEvent::PoolBeatTrimmed { ref peer, .. } => {
                    self.pool_beat_trimmed(i, peer);
                    self.trace(|| format!("node{i} router: {event:?}"));
                }
                RouterEvent::ClaimLost { .. } => {
                    self.claims_lost += 1;
                    self.trace(|| format!("node{i} router: {event:?}"));
                }
                e => self.trace(|| format!("node{i} router: {e:?}")),
            },
            Event::NotRun {
                task,
                attempt,
                outcome,
                reason,
            } => {
                // The core's own word that it refused a start as fenced (its pool at the
                // assignment, or the core itself once the task document was fetched or at the
                // end of the turn): counted, not decided here.
                if outcome == AttemptOutcome::Refused && reason.starts_with("fenced") {
                    self.fenced += 1;
                }
                // The other refusals, by the pool's reason (the signatures of pinned seeds).
                if outcome == AttemptOutcome::Refused {
                    for (prefix, key) in [
                        ("stale", "refused_stale"),
                        ("superseded", "refused_superseded"),
                        ("the task already has an outcome", "refused_final"),
                        ("the task is running already", "refused_running_elsewhere"),
                    ] {
                        if reason.starts_with(prefix) {
                            self.count(key);
                        }
                    }
                }
                self.trace(|| {
                    format!("node{i} did not run {task} {attempt}: {outcome:?} {reason}")
                });
            }
            Event::FetchFailed { task, timed_out } => {
                self.count("fetch_failed");
                if timed_out {
                    self.count("fetch_timeout");
                }
                self.trace(|| format!("node{i} found no member with {task}'s document"));
            }
            Event::SaveFailed { doc, failures, .. } => {
                self.count("save_failure_reported");
                self.trace(|| format!("node{i} cannot write {doc} ({failures} failures)"));
            }
            Event::LoadFailed { doc, error } => {
                self.trace(|| format!("node{i} cannot load {doc}: {error}"));
            }
            Event::StoreFailing { .. } => {
                self.count("store_failing");
                self.trace(|| format!("node{i}'s disk fails: submits refused"));
            }
            Event::StoreRecovered => {
                self.trace(|| format!("node{i}'s disk writes again"));
            }
            Event::Quarantined { doc, bytes, .. } => {
                self.count("quarantined");
                self.trace(|| format!("node{i} moved aside a chunk of {doc} ({bytes} bytes)"));
            }
            Event::Rejected { peer, reason } => {
                self.count("rejected");
                self.trace(|| format!("node{i} rejected {peer}: {reason}"));
            }
            Event::Epoch { queue, event } => {
                match &event {
                    EpochEvent::Rotated { .. } => self.count("rotation"),
                    EpochEvent::Switched { sideways: true, .. } => {
                        self.count("double_seal_followed")
                    }
                    EpochEvent::Switched { missing, .. } => {
                        self.count("epoch_switch");
                        self.judge_move(i, &queue);
                        if *missing > 0 {
                            self.count("moved_past_deleted_epochs");
                        }
                    }
                    EpochEvent::Carried {
                        from_loser: false,
                        writes,
                    } => {
                        *self.faults.entry("carried_late_writes".into()).or_default() +=
                            u64::try_from(*writes).unwrap_or(u64::MAX)
                    }
                    EpochEvent::Carried {
                        from_loser: true, ..
                    } => self.count("successor_merge"),
                    EpochEvent::Evicted { .. } => self.count("epoch_evicted"),
                    // Never among honest nodes: `honest_mixes_refuse_no_successor` checks.
                    EpochEvent::Refused { doc, .. } => {
                        self.count("successor_refused");
                        self.successor_refused(i, doc);
                    }
                }
                self.trace(|| format!("node{i} {queue}: {event:?}"));
            }
            Event::RunStarted { .. } | Event::RunEnded { .. } => {}
        }
    }

    /// Watches a view a core reports: invariant 2 and the rate half of invariant 6 (see
    /// [`super::invariants`]), the tasks seen final (for invariant 1), and the situations a task
    /// or a restarted pool passes through.
    fn watch_view(&mut self, i: usize, queue: &QueueId, view: &Arc<QueueView>) {
        self.input_situations(i, view);
        self.no_outcome_regresses(i, view);
        self.remember_final_tasks(view);
        self.no_two_fresh_pending_tasks_share_a_dedup_key(i, view);
        self.watch_schedule_tasks(i, view);
        self.watch_life_ends(view);
        self.follow_ups_with_their_success(i, view);
        if self.config.mix.scheduling > 0.0 {
            self.no_assignment_to_a_pool_that_lacked_it(view);
        }
        self.superseded_attempt_held(i, view);
        self.assignments_keep_the_rate_interval(i, queue, view);
        self.judge_hostile_writes(i, queue, view);
    }

    /// Counts the tasks that enter `input_unavailable` on node `i`, or leave it.
    fn input_situations(&mut self, i: usize, view: &Arc<QueueView>) {
        let mut situations = vec![];
        for (id, t) in view.tasks() {
            let s = t.state();
            let key = (i, id.clone());
            let was = self.last_state.insert(key, s);
            if s == TaskState::InputUnavailable && was != Some(s) {
                situations.push("input_unavailable");
            }
            if was == Some(TaskState::InputUnavailable) && s != TaskState::InputUnavailable {
                situations.push("input_revived");
            }
        }
        for k in situations {
            self.count(k);
        }
    }

    /// Counts a restarted pool holding an attempt that was superseded while it was down.
    fn superseded_attempt_held(&mut self, i: usize, view: &Arc<QueueView>) {
        if self.nodes[i].restarted {
            let me = self.nodes[i].peer.clone();
            let inc = self.nodes[i].incarnation;
            let held = view.tasks().values().any(|t| {
                t.attempts.iter().any(|a| {
                    a.worker.peer == me
                        && a.is_open()
                        && a.started.is_none()
                        && (a.id.n < t.last_n() || a.pool_incarnation.is_some_and(|p| p < inc))
                })
            });
            if held {
                self.count("superseded_attempt_held");
                self.nodes[i].restarted = false;
            }
        }
    }
}
