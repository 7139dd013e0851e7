//! Probes: what the bench measures beside its phases. Before any node starts, `fsync_ms` and the
//! Automerge floor (a task's life on one queue document, no node); during the run, the largest
//! queue document and the time to load it, and peak resident sets.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use piecework_node::NodeHandle;
use piecework_queue_doc::{
    Assignment, AttemptId, AttemptOutcome, Claim, PeerId, QueueId, QueueView, Submission, TaskId,
    WorkerId, queue,
};

use super::ms;
use super::report::Percentiles;

/// The most tasks the Automerge floor is measured over (it stays quick).
pub const FLOOR_MAX_TASKS: usize = 20_000;
/// How many fsyncs `fsync_ms` is the median of.
pub const FSYNC_SAMPLES: usize = 50;

/// The largest queue document sampled.
pub(super) struct Largest {
    pub(super) bytes: Vec<u8>,
}

/// How often the throughput phase samples each node's queue document.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Samples every node's current queue document each [`SAMPLE_EVERY`] until aborted, keeping
/// the largest in `kept`.
pub(super) async fn sample_documents(
    handles: Vec<NodeHandle>,
    queue: QueueId,
    kept: Arc<std::sync::Mutex<Option<Largest>>>,
) {
    loop {
        if let Some(l) = sample_once(&handles, &queue).await {
            let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
            if k.as_ref().is_none_or(|o| o.bytes.len() < l.bytes.len()) {
                *k = Some(l);
            }
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// The largest current queue document over the nodes, now.
pub(super) async fn sample_once(handles: &[NodeHandle], queue: &QueueId) -> Option<Largest> {
    let mut best: Option<Largest> = None;
    for h in handles {
        if let Ok((_, bytes)) = h.queue_document(queue).await
            && best.as_ref().is_none_or(|b| b.bytes.len() < bytes.len())
        {
            best = Some(Largest { bytes });
        }
    }
    best
}

/// How many times [`load_ms`] loads the document; it reports the median.
const LOAD_TIMINGS: usize = 5;

/// Milliseconds to load a saved queue document and read its view: what opening the queue
/// costs a node. The median of [`LOAD_TIMINGS`] loads: one timing on a shared machine is
/// as much the machine's as the document's.
pub(super) fn load_ms(bytes: &[u8]) -> anyhow::Result<f64> {
    let mut times = Vec::with_capacity(LOAD_TIMINGS);
    for _ in 0..LOAD_TIMINGS {
        let t = Instant::now();
        let doc = automerge::Automerge::load(bytes)
            .context("the sampled queue document does not load")?;
        QueueView::read(&doc).context("the sampled queue document does not read as a queue")?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[LOAD_TIMINGS / 2])
}

/// This process's peak resident set (`VmHWM`), in MiB; `None` where `/proc` has no such line.
pub(super) fn peak_rss_mib() -> Option<f64> {
    vm_hwm_mib(&std::fs::read_to_string("/proc/self/status").ok()?)
}

/// The `VmHWM` line of a `/proc/PID/status` text, in MiB.
pub(super) fn vm_hwm_mib(status: &str) -> Option<f64> {
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Median of [`FSYNC_SAMPLES`] × (append 4 KiB + `sync_all`), in ms.
pub(super) fn fsync_probe(path: &Path) -> anyhow::Result<f64> {
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let block = [0x5au8; 4096];
    let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
    for _ in 0..FSYNC_SAMPLES {
        let t = Instant::now();
        f.write_all(&block).context("fsync probe: write")?;
        f.sync_all().context("fsync probe: sync_all")?;
        samples.push(ms(t.elapsed()));
    }
    Ok(Percentiles::of(&samples).map_or(0.0, |p| p.p50))
}

/// Tasks per second for `n` tasks' submit → assign → start → finish on one queue document,
/// each operation its own transaction, as a node writes them.
pub(super) fn floor(n: usize) -> anyhow::Result<f64> {
    use sha2::Digest as _;
    let me = PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W");
    // An `automerge::Automerge`; this crate does not name automerge, the queue functions do.
    let mut doc = Default::default();
    queue::create(&mut doc, "floor", &crate::demo::demo_config(), &me, 0)
        .context("floor: create the queue")?;
    let claim = Claim::new(1, me.clone());
    let worker = WorkerId::new(me.clone(), 0);
    // Ids shaped like real ones (random-looking, so map inserts land anywhere).
    let ids: Vec<TaskId> = (0..n)
        .map(|i| {
            let h = hex::encode(sha2::Sha256::digest(i.to_le_bytes()));
            TaskId::new(format!("automerge:{}", &h[..28]))
        })
        .collect();
    let t = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let at = i as u64;
        queue::submit(
            &mut doc,
            &Submission {
                id: id.clone(),
                kind: "noop".into(),
                submitter: me.clone(),
                submitted_at: at,
                priority: 0,
                urgent: false,
                max_attempts: None,
                // As a node submits a noop task: inline.
                input: Some("{}".into()),
                rules: Default::default(),
            },
        )
        .context("floor: submit")?;
        let attempt = AttemptId {
            n: 1,
            claim: claim.clone(),
        };
        let a = Assignment {
            task: id.clone(),
            attempt: attempt.clone(),
            worker: worker.clone(),
            incarnation: 1,
        };
        queue::record_assignments(&mut doc, &[a], at).context("floor: assign")?;
        queue::record_start(&mut doc, id, &attempt, &worker, 1, at).context("floor: start")?;
        queue::record_finish(
            &mut doc,
            id,
            &attempt,
            &worker,
            AttemptOutcome::Succeeded,
            None,
            at,
        )
        .context("floor: finish")?;
    }
    let secs = t.elapsed().as_secs_f64();
    Ok(n as f64 / secs.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_runs() {
        assert!(floor(20).unwrap() > 0.0);
    }
}
