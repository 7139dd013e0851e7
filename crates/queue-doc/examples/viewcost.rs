//! Rough cost of reading a queue view: whole-document reads against incremental refreshes.
//! `cargo run --release -p piecework-queue-doc --example viewcost` (the criterion bench in
//! benches/ is the reference; this prints quick numbers while developing).
use std::time::Instant;

use automerge::Automerge;
use piecework_queue_doc::*;

fn main() {
    for n in [100u64, 500, 2000] {
        let me = PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W");
        let mut doc = Automerge::new();
        queue::create(&mut doc, "q", &QueueConfig::default(), &me, 0).unwrap();
        let claim = Claim::new(1, me.clone());
        let w = WorkerId::new(me.clone(), 0);
        for i in 0..n {
            let id = TaskId::new(format!("automerge:task{i:05}"));
            let s = Submission {
                id,
                kind: "sha256".into(),
                submitter: me.clone(),
                submitted_at: i,
                priority: 0,
                urgent: false,
                max_attempts: None,
            };
            queue::submit(&mut doc, &s).unwrap();
        }
        let reps = 20u32;
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(QueueView::read(&doc));
        }
        let full = t.elapsed() / reps;
        let mut cache = ViewCache::new();
        cache.refresh(&doc);
        let t = Instant::now();
        for i in 0..u64::from(reps) {
            let id = TaskId::new(format!("automerge:task{i:05}"));
            let a = Assignment {
                task: id,
                attempt: AttemptId {
                    n: 1,
                    claim: claim.clone(),
                },
                worker: w.clone(),
            };
            queue::record_assignments(&mut doc, &[a], 1).unwrap();
            std::hint::black_box(cache.refresh(&doc));
        }
        let inc = t.elapsed() / reps;
        println!("{n} tasks: full read {full:?}, one assignment + incremental refresh {inc:?}");
    }
}
