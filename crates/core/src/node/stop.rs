//! A planned stop (`Command::Stop`): draining the pool, stopping the routers (hand-over), refusing
//! starts, interrupting runs at the grace time, and answering once everything is on disk.

use super::*;

impl Core {
    /// Begins a stop ([`Command::Stop`]): the pool starts nothing new, every router stops
    /// (an active one hands its role over), and starts waiting for a task's document are
    /// refused. The answer comes from [`Core::answer_stop`].
    pub(super) fn stop(&mut self, now: Time, cmd: CommandId, grace: Duration) {
        if let Some(s) = &mut self.stopping {
            if s.answered {
                self.replies
                    .push_back((cmd, Reply::Stopped(s.report.clone())));
            } else {
                s.cmds.push(cmd);
            }
            return;
        }
        self.pool.drain(now.mono);
        let mut handed_over = Vec::new();
        for (id, q) in &mut self.queues {
            let active = q.router.is_active();
            q.router.stop(now.mono);
            // Held while frozen, and never to be carried out now.
            q.deferred.clear();
            if active && let Role::Stopped { handing } = q.router.role() {
                handed_over.push((id.clone(), handing.as_ref().map(|(_, to)| to.clone())));
            }
        }
        // Starts waiting for their task's document will not run here: refused, so that the
        // router routes them elsewhere at once.
        for run in self.docs.take_starts() {
            self.pool
                .handle_start_failed(run.worker.index, "the worker's node is stopping".into());
        }
        // At most as long as any wait (an hour): no deadline overflows the clock.
        let grace_until = now.mono + grace.min(MAX_WAIT);
        self.stopping = Some(Stopping {
            cmds: vec![cmd],
            grace_until,
            flush_until: grace_until + crate::STOP_FLUSH_WAIT,
            runs_at_stop: self.runs.running(),
            flush: None,
            report: api::StopReport {
                handed_over,
                ..api::StopReport::default()
            },
            answered: false,
        });
    }

    /// A stopping node's grace time is over: the runs still going are recorded interrupted
    /// (their handlers are abandoned; a later end is ignored), so that their tasks are routed
    /// again at once rather than after their lease.
    pub(super) fn interrupt_at_grace(&mut self, now: Time) {
        let Some(s) = self.stopping.as_mut() else {
            return;
        };
        if s.answered || now.mono < s.grace_until || self.runs.running() == 0 {
            return;
        }
        let runs = self.runs.interrupt_all();
        s.report.runs_interrupted += runs.len();
        for (id, run) in runs {
            self.io.push_back(Io::Abort { run: id });
            self.pool.interrupt(
                run.worker.index,
                "the worker's node stopped before the run ended".into(),
            );
        }
    }

    /// Answers a stop once it is done: no run in flight, every start and end written, every
    /// router's hand-over taken up (or the grace time over), and every change on disk; or at
    /// its flush deadline, with what is still unsaved.
    pub(super) fn answer_stop(&mut self, now: Time) {
        let Some(s) = self.stopping.as_ref().filter(|s| !s.answered) else {
            return;
        };
        let handing = self
            .queues
            .values()
            .any(|q| matches!(q.router.role(), Role::Stopped { handing: Some(_) }));
        let written = self.runs.all_written() && !self.archive.is_pending();
        let flush = match (&s.flush, written) {
            (Some(f), _) => Some(f.clone()),
            (None, true) => Some(self.saves.unsaved()),
            (None, false) => None,
        };
        let unsaved = |f: &[(DocId, u64)]| {
            f.iter()
                .filter(|(doc, v)| !self.saves.is_durable(doc, *v))
                .count()
        };
        let saved = flush.as_ref().is_some_and(|f| unsaved(f) == 0);
        // What the node wrote last (its runs' ends, above all) reaches a member before it
        // stops: otherwise the next router sees those runs open, waits out their lease and
        // runs them again. A node that reaches no member has nobody to tell.
        let told = self.members.connected_count() == 0
            || self.queues.values().all(|q| {
                self.replica
                    .get(&q.doc)
                    .is_none_or(|d| self.replica.peer_has(&q.doc, &d.get_heads()))
            });
        let done = saved && told && (!handing || now.mono >= s.grace_until);
        let late = now.mono >= s.flush_until;
        let left = match &flush {
            Some(f) => unsaved(f),
            None => self.saves.unsaved().len(),
        };
        let Some(s) = self.stopping.as_mut() else {
            return;
        };
        s.flush = flush;
        if !done && !late {
            return;
        }
        let unsaved = left;
        s.answered = true;
        s.report.runs_finished = s.runs_at_stop.saturating_sub(s.report.runs_interrupted);
        s.report.unsaved_documents = unsaved;
        for cmd in std::mem::take(&mut s.cmds) {
            self.replies
                .push_back((cmd, Reply::Stopped(s.report.clone())));
        }
    }
}
