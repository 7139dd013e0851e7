//! What a queue view costs: reading the whole document against refreshing the incremental cache
//! after one assignment. `cargo bench -p piecework-queue-doc --bench view`.

use automerge::Automerge;
use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use piecework_queue_doc::{
    Assignment, AttemptId, Claim, PeerId, QueueConfig, QueueView, Submission, TaskId, ViewCache,
    WorkerId, queue,
};

fn queue_with(n: u64) -> (Automerge, PeerId) {
    let me = PeerId::new("12D3KooWQQBxbWrSXaDyidDrDBf9ZbUT1tasngy2Q3SonNMdWt2W");
    let mut doc = Automerge::new();
    queue::create(&mut doc, "q", &QueueConfig::default(), &me, 0).expect("create");
    for i in 0..n {
        let s = Submission {
            id: TaskId::new(format!("automerge:task{i:05}")),
            kind: "sha256".into(),
            submitter: me.clone(),
            submitted_at: i,
            priority: 0,
            urgent: false,
            max_attempts: None,
        };
        queue::submit(&mut doc, &s).expect("submit");
    }
    (doc, me)
}

fn views(c: &mut Criterion) {
    let mut g = c.benchmark_group("queue_view");
    for n in [100u64, 500, 2000] {
        let (doc, me) = queue_with(n);
        g.bench_with_input(BenchmarkId::new("full_read", n), &doc, |b, doc| {
            b.iter(|| QueueView::read(doc));
        });
        let worker = WorkerId::new(me.clone(), 0);
        let claim = Claim::new(1, me.clone());
        g.bench_function(BenchmarkId::new("assign_and_refresh", n), |b| {
            b.iter_batched(
                || {
                    let mut cache = ViewCache::new();
                    cache.refresh(&doc);
                    (doc.clone(), cache)
                },
                |(mut doc, mut cache)| {
                    let a = Assignment {
                        task: TaskId::new("automerge:task00000"),
                        attempt: AttemptId {
                            n: 1,
                            claim: claim.clone(),
                        },
                        worker: worker.clone(),
                        incarnation: 1,
                    };
                    queue::record_assignments(&mut doc, &[a], 1).expect("assign");
                    cache.refresh(&doc).map(|v| v.tasks().len())
                },
                BatchSize::LargeInput,
            );
        });
    }
    g.finish();
}

criterion_group!(benches, views);
criterion_main!(benches);
