//! Faults: the mix's background faults, the schedule's faults at fixed times, and what a node
//! goes through when it crashes, stops and restarts.
//!
//! It owns [`Fault`] (the public schedule entries) and [`Kind`] (the background kinds), drawing
//! when each background fault fires next, choosing its target, and carrying it out: partitions
//! and one-way cuts (through the network model), disk failure windows (on the node's [`Disk`]),
//! crashes and planned stops, restarts with the next incarnation, and the heal that ends the
//! faulty phase. A crash ends the node's runs in the run records and keeps or loses each write
//! still in flight.
//!
//! It asks the parent for the event queue, the clock, `count`, `trace` and the node seeds; the
//! network for `cut`, `silent_cut`, `relink` and `end_silent_cuts` (and it clears `cuts` and
//! `beat_delay` and records `disturbances` itself); the shell for `drive`. The shell asks it for
//! `down` when a stop is answered.
//!
//! [`Disk`]: super::disk::Disk

use std::time::Duration;

use piecework_core::{Command, Config as CoreConfig, Core};
use piecework_queue_doc::QueueId;
use rand::Rng;
use serde::Serialize;

use super::{
    EPOCH_RETAIN, End, Ev, KEEP_TASK_DOCS, RETRY_US, World, catch_ups, node_seed, relay_waits,
    time_at,
};
use crate::Target;

/// A fault at a fixed time (see [`Config::schedule`](crate::Config::schedule)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// Crash the node; it restarts after a downtime drawn from the mix.
    Crash(Target),
    /// Cut the node off from every other, both ways.
    Isolate(Target),
    /// Split the cluster into two halves (the first `n / 2` nodes and the rest).
    Halves,
    /// Lose everything the node sends (it still hears the others' heartbeats).
    SilenceOut(Target),
    /// Delay the node's heartbeats by `extra_ms` for `for_ms`.
    DelayBeats {
        /// Whose heartbeats.
        target: Target,
        /// Extra delay, ms.
        extra_ms: u64,
        /// For how long, ms.
        for_ms: u64,
    },
    /// End every cut and delay.
    Heal,
}

impl Fault {
    /// The node index this fault names, if it names one.
    pub(super) fn node(&self) -> Option<usize> {
        match self {
            Fault::Crash(Target::Node(i))
            | Fault::Isolate(Target::Node(i))
            | Fault::SilenceOut(Target::Node(i))
            | Fault::DelayBeats {
                target: Target::Node(i),
                ..
            } => Some(*i),
            _ => None,
        }
    }

    /// Whether this fault loses or delays messages beyond the normal range (invariants 5 and 7
    /// are not expected to hold in runs that have one).
    pub fn disturbs_messages(&self) -> bool {
        !matches!(self, Fault::Crash(_) | Fault::Heal)
    }
}

/// A kind of background fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    Crash,
    Partition,
    OneWay,
    WriteFailures,
    ReadFailures,
    Stop,
    /// A hostile act of the Byzantine member.
    Byzantine,
    /// A member changes a setting (`settings.rs`).
    Settings,
    /// A member cancels a task or requeues dead letters (`lifecycle.rs`).
    Lifecycle,
}

impl World {
    pub(super) fn schedule_background(&mut self, kind: Kind) {
        let mix = &self.config.mix;
        let rate = match kind {
            Kind::Crash => mix.crash_rate,
            Kind::Partition => mix.partition_rate,
            Kind::OneWay => mix.oneway_rate,
            Kind::WriteFailures => mix.write_failure_rate,
            Kind::ReadFailures => mix.read_failure_rate,
            Kind::Stop => mix.stop_rate,
            Kind::Byzantine => mix.byzantine_rate,
            Kind::Settings => mix.settings_rate,
            Kind::Lifecycle => mix.lifecycle,
        };
        if rate <= 0.0 {
            return;
        }
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        let wait_us = (-u.ln() / rate * 1e6) as u64;
        let at = self.now_us + wait_us;
        if at < self.config.fault_ms * 1000 {
            self.schedule_at(at, Ev::Background(kind));
        }
    }

    /// The node a scheduled fault strikes. A node index is within the cluster (the schedule is
    /// checked when the world is built). The router may be unknown (no node up knows one): the
    /// fault then strikes nothing, and that is counted (`fault_without_router`) and traced,
    /// so that a test can tell its scenario did not happen.
    fn target(&mut self, t: Target) -> Option<usize> {
        let found = match t {
            Target::Node(i) => return Some(i),
            Target::Router => self.queues[0].as_ref().and_then(|q| {
                let best = self
                    .nodes
                    .iter()
                    .filter(|n| n.up)
                    .filter_map(|n| n.core.view(q).and_then(|v| v.router.clone()))
                    .max()?;
                self.index_of(&best.peer)
            }),
        };
        if found.is_none() {
            self.count("fault_without_router");
            self.trace(|| "a fault aimed at the router finds none".into());
        }
        found
    }

    pub(super) fn background(&mut self, kind: Kind) {
        let n = self.nodes.len();
        match kind {
            Kind::Byzantine => self.hostile_act(),
            Kind::Settings => self.change_setting(),
            Kind::Lifecycle => self.life_act(),
            Kind::Crash => {
                let i = self.rng.random_range(0..n);
                self.crash(i);
            }
            Kind::Stop => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.stop_grace_ms;
                let grace = self.rng.random_range(lo..=hi.max(lo));
                self.stop(i, grace);
            }
            Kind::Partition => {
                let mut side: Vec<bool> = (0..n).map(|_| self.rng.random_bool(0.5)).collect();
                if side.iter().all(|s| *s) || side.iter().all(|s| !*s) {
                    side[0] = !side[0];
                }
                let blocked = (0..n)
                    .flat_map(|a| (0..n).map(move |b| (a, b)))
                    .filter(|&(a, b)| side[a] != side[b])
                    .collect();
                let (lo, hi) = self.config.mix.cut_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                self.count("partition");
                self.trace(|| format!("partition {side:?} for {ms} ms"));
                self.cut(blocked, ms);
            }
            Kind::OneWay => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.cut_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let blocked = (0..n).filter(|&b| b != i).map(|b| (i, b)).collect();
                if self.rng.random_bool(0.5) {
                    // A half-open stream lasts until the transport notices it stalled: longer
                    // than a cut it sees at once.
                    let ms = ms * 2;
                    self.count("silent_cut");
                    self.trace(|| format!("node{i}'s outgoing messages silently lost for {ms} ms"));
                    self.silent_cut(blocked, ms);
                } else {
                    self.count("one_way_cut");
                    self.trace(|| format!("node{i}'s outgoing messages lost for {ms} ms"));
                    self.cut(blocked, ms);
                }
            }
            Kind::WriteFailures | Kind::ReadFailures => {
                let i = self.rng.random_range(0..n);
                let (lo, hi) = self.config.mix.disk_window_ms;
                let ms = self.rng.random_range(lo..=hi.max(lo));
                let until = self.now_us + ms * 1000;
                let disk = &mut self.nodes[i].disk;
                let what = if kind == Kind::WriteFailures {
                    disk.failing_writes_until = disk.failing_writes_until.max(until);
                    "write"
                } else {
                    disk.failing_reads_until = disk.failing_reads_until.max(until);
                    "read"
                };
                self.count(&format!("{what}_failure_window"));
                self.trace(|| format!("node{i}'s disk fails every {what} for {ms} ms"));
            }
        }
    }

    pub(super) fn fault(&mut self, f: &Fault) {
        let n = self.nodes.len();
        let long = self.config.fault_ms + self.config.settle_limit_ms;
        match f {
            Fault::Crash(t) => {
                if let Some(i) = self.target(*t) {
                    self.crash(i);
                }
            }
            Fault::Isolate(t) => {
                if let Some(i) = self.target(*t) {
                    self.count("isolate");
                    self.trace(|| format!("node{i} isolated"));
                    let blocked = (0..n)
                        .filter(|&b| b != i)
                        .flat_map(|b| [(i, b), (b, i)])
                        .collect();
                    self.cut(blocked, long);
                }
            }
            Fault::Halves => {
                self.count("halves");
                self.trace(|| "split into halves".into());
                let h = n / 2;
                let blocked = (0..n)
                    .flat_map(|a| (0..n).map(move |b| (a, b)))
                    .filter(|&(a, b)| (a < h) != (b < h))
                    .collect();
                self.cut(blocked, long);
            }
            Fault::SilenceOut(t) => {
                if let Some(i) = self.target(*t) {
                    self.count("one_way_cut");
                    self.trace(|| format!("node{i}'s outgoing messages lost"));
                    self.cut((0..n).filter(|&b| b != i).map(|b| (i, b)).collect(), long);
                }
            }
            Fault::DelayBeats {
                target,
                extra_ms,
                for_ms,
            } => {
                if let Some(i) = self.target(*target) {
                    self.count("beats_delayed");
                    self.trace(|| {
                        format!("node{i}'s heartbeats delayed {extra_ms} ms for {for_ms} ms")
                    });
                    let until = self.now_us + for_ms * 1000;
                    for b in 0..n {
                        self.net.disturbances.push((self.now_us, until, i, b));
                    }
                    self.net.beat_delay.insert(i, (*extra_ms, until));
                }
            }
            Fault::Heal => {
                self.trace(|| "heal".into());
                self.net.cuts.clear();
                self.end_silent_cuts();
                self.net.beat_delay.clear();
                self.relink();
            }
        }
    }

    /// A planned stop: the node is asked to stop with `grace_ms` for its runs; it exits when
    /// its stop is answered ([`World::reply`]).
    fn stop(&mut self, i: usize, grace_ms: u64) {
        if !self.nodes[i].up || self.nodes[i].stopping.is_some() {
            return;
        }
        self.count("planned_stop");
        self.trace(|| format!("node{i} is asked to stop ({grace_ms} ms of grace)"));
        let cmd = self.command_id(i);
        self.nodes[i].stopping = Some(cmd);
        let t = self.time(i);
        self.nodes[i].core.handle_command(
            t,
            cmd,
            Command::Stop {
                grace: Duration::from_millis(grace_ms),
            },
        );
        self.drive(i);
    }

    fn crash(&mut self, i: usize) {
        self.down(i, false);
    }

    /// Node `i` goes down: it crashes, or (`clean`) exits once its stop was answered. Either
    /// way what it runs is abandoned, and it restarts after a downtime.
    pub(super) fn down(&mut self, i: usize, clean: bool) {
        if !self.nodes[i].up {
            return;
        }
        self.nodes[i].stopping = None;
        if clean {
            self.count("stopped");
            self.trace(|| format!("node{i} exits after its stop"));
        } else {
            self.count("crash");
            self.trace(|| format!("node{i} crashes"));
        }
        self.crashes.push((i, self.now_us));
        let now = self.now_us;
        let n = &mut self.nodes[i];
        n.up = false;
        n.timer_generation += 1;
        for live in std::mem::take(&mut n.live).into_values() {
            if let Some(r) = self
                .runs
                .get_mut(&live.task)
                .and_then(|v| v.iter_mut().rev().find(|r| r.node == i && r.end.is_none()))
            {
                r.end = Some(End::Crashed);
                r.end_us = Some(now);
            }
        }
        // What the node had seen only in memory is gone with it: invariant 2 watches each
        // incarnation from what it reloads (acknowledged tasks are invariant 8's).
        self.seen_states.retain(|(n, _), _| *n != i);
        self.seen_requeues.retain(|(n, _), _| *n != i);
        // Writes in flight: the crash keeps an arbitrary subset of them.
        let pending = std::mem::take(&mut self.nodes[i].disk.pending);
        for save in pending.into_values() {
            if self.rng.random_bool(0.5) {
                let _ = self.nodes[i].disk.apply(&save);
                self.count("unacknowledged_write_kept");
            } else {
                self.count("unacknowledged_write_lost");
            }
        }
        self.relink();
        let (lo, hi) = self.config.mix.downtime_ms;
        let ms = self.rng.random_range(lo..=hi.max(lo));
        if ms > self.qconfig.lease_ms {
            self.count("long_downtime");
        }
        let inc = self.nodes[i].incarnation;
        self.schedule_at(
            self.now_us + ms * 1000,
            Ev::Restart {
                node: i,
                incarnation: inc,
            },
        );
    }

    pub(super) fn restart(&mut self, i: usize) {
        self.count("restart");
        let inc = self.nodes[i].incarnation + 1;
        self.trace(|| format!("node{i} restarts, incarnation {inc}"));
        let t = time_at(
            self.base,
            self.nodes[i].offset_us,
            self.nodes[i].drift_ppm,
            self.now_us,
        );
        let config = CoreConfig::new(
            self.nodes[i].peer.clone(),
            inc,
            self.config.workers,
            node_seed(self.seed, i, inc),
        )
        .with_rotation(self.config.rotation.0, self.config.rotation.1)
        .with_catch_ups(catch_ups(i))
        .with_epoch_retain(EPOCH_RETAIN)
        .with_disk_retention(KEEP_TASK_DOCS, self.config.keep_sealed_epochs)
        .with_relay_waits(relay_waits(&self.config))
        .with_capabilities(
            super::scheduling::kinds_of(&self.config, i),
            super::scheduling::resources_of(&self.config, i),
        )
        .with_cancel_grace(super::lifecycle::cancel_grace(&self.config))
        .with_retired(self.nodes[i].disk.retired.clone())
        .with_resume(
            self.nodes[i]
                .disk
                .epochs
                .iter()
                .map(|(q, d)| (q.clone(), d.clone()))
                .collect(),
        );
        // A start holds the configured resources again: withdrawals lived in the last one.
        self.sched.withdrawn.remove(&i);
        let n = &mut self.nodes[i];
        n.incarnation = inc;
        n.up = true;
        n.core = Core::new(config, t);
        #[cfg(feature = "broken")]
        n.core
            .break_fencing(self.config.broken_fencing, self.config.broken_core_fencing);
        n.submits.clear();
        n.joins.clear();
        n.subscribed.clear();
        n.restarted = true;
        n.disk.failing_reads_until = 0;
        n.disk.failing_writes_until = 0;
        // What the shell does at start: reopen every queue the disk remembers.
        let remembered: Vec<QueueId> = n.disk.queues.iter().cloned().collect();
        for id in remembered {
            let q = self.queues.iter().position(|x| x.as_ref() == Some(&id));
            let cmd = self.command_id(i);
            if let Some(q) = q {
                self.nodes[i].joins.insert(cmd, q);
            }
            let t = self.time(i);
            self.nodes[i].core.handle_command(
                t,
                cmd,
                Command::JoinQueue {
                    id,
                    from_peers: true,
                },
            );
        }
        self.relink();
        self.drive(i);
        for q in 0..self.members.len() {
            if self.members[q].contains(&i) {
                self.schedule_at(self.now_us + RETRY_US, Ev::Join { node: i, queue: q });
            }
        }
    }

    pub(super) fn heal_all(&mut self) {
        self.trace(|| "faults stop: heal everything, restart every node".into());
        self.faults_on = false;
        self.net.cuts.clear();
        self.end_silent_cuts();
        self.net.beat_delay.clear();
        for n in &mut self.nodes {
            n.disk.failing_reads_until = 0;
            n.disk.failing_writes_until = 0;
        }
        for i in 0..self.nodes.len() {
            // A node still stopping would never take work again: it exits now.
            if self.nodes[i].up && self.nodes[i].stopping.is_some() {
                self.crash(i);
            }
            if !self.nodes[i].up {
                self.restart(i);
            }
        }
        self.relink();
        self.schedule_at(self.now_us, Ev::SettleCheck);
    }
}
