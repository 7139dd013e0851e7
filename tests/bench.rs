//! `piecework bench`, run in-process and small: three nodes, 300 throughput tasks, five latency
//! samples and one router kill with a restart. Nothing here is about speed: the checks are
//! that every task submitted in every phase succeeded, that no task ran twice except where the
//! kill allows it, and that the failover was measured. The bench itself waits on queue views and task outcomes, never on a fixed sleep.

use piecework::bench::{self, Kind, Options, Timings};

/// The nodes' warnings and the network's connection events, shown with a failing test's
/// output (`RUST_LOG` overrides the filter).
fn logs() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,piecework_net=debug".into());
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .try_init();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_bench_with_a_failover_loses_nothing() {
    logs();
    let opts = Options {
        nodes: 3,
        tasks: 300,
        kind: Kind::Noop,
        failovers: 1,
        latency_samples: 5,
        progress: false,
        ..Options::default()
    };
    let r = bench::run(&opts).await.expect("the bench runs");
    let json = serde_json::to_string(&r).expect("the report serializes");
    assert_eq!(r.nodes, 3, "{json}");
    assert_eq!(r.throughput_tasks, 300, "{json}");
    // Throughput, latency and at least one trickle task.
    assert!(r.tasks > 300 + 5, "{json}");
    assert_eq!(r.succeeded, r.tasks, "every task done: {json}");
    assert_eq!(r.lost, 0, "{json}");
    // A kill is a crash: a run the killed router's node finished but had not yet sent may
    // succeed again elsewhere (at-least-once), at most once per worker of the killed node.
    assert!(
        r.duplicates <= r.workers as usize * opts.failovers,
        "{json}"
    );
    assert!(r.failover_ms.is_some(), "{json}");
    // The restarted node waited to hear the live router instead of claiming.
    assert_eq!(r.takeovers_by_restarted_node, 0, "{json}");
    assert!(
        r.submit_to_start_ms.is_some() && r.submit_to_done_ms.is_some(),
        "{json}"
    );
    assert_eq!(r.floor_tasks, 300, "{json}");
    assert!(!r.commit.is_empty(), "{json}");
    // The JSON carries every field the docs describe, failover_ms as an object.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["failover_ms"]["p50"].is_number(), "{json}");
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1, "{json}");
}

/// Two router kills at the fastest timings the docs recommend (takeover after 150 ms):
/// nothing lost, every task done, and the report names the timings and their bound. No
/// timing is asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_at_the_fast_timings_fails_over_and_loses_nothing() {
    logs();
    let opts = Options {
        nodes: 3,
        tasks: 300,
        kind: Kind::Noop,
        timings: Timings::Fast,
        failovers: 2,
        latency_samples: 5,
        progress: false,
        ..Options::default()
    };
    let r = bench::run(&opts).await.expect("the bench runs");
    let json = serde_json::to_string(&r).expect("the report serializes");
    assert_eq!(r.succeeded, r.tasks, "every task done: {json}");
    assert_eq!(r.lost, 0, "{json}");
    assert!(
        r.duplicates <= r.workers as usize * opts.failovers,
        "{json}"
    );
    assert!(r.failover_ms.is_some(), "{json}");
    assert_eq!(r.takeovers_by_restarted_node, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["timings"], "fast", "{json}");
    assert_eq!(v["failover_bound_ms"], 150 + 25 + 50 + 300, "{json}");
}

/// The CI bench of the bounded queue document: 2,000 tasks on three nodes with a tiny rotation
/// threshold, so the queue document is rotated several times while tasks are submitted, run
/// and finished. The tasks are submitted through the nodes' HTTP batch API. No timing is
/// asserted: at least two epochs, every task done, nothing lost or run twice, and the queue
/// document sampled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_with_a_tiny_rotation_threshold_rotates_and_loses_nothing() {
    logs();
    let opts = Options {
        nodes: 3,
        workers: 2,
        tasks: 2_000,
        kind: Kind::Noop,
        latency_samples: 5,
        rotate_min_live: Some(50),
        http: true,
        progress: false,
        ..Options::default()
    };
    let r = bench::run(&opts).await.expect("the bench runs");
    let json = serde_json::to_string(&r).expect("the report serializes");
    assert_eq!(r.submit_via, "http", "{json}");
    assert!(r.epochs >= 2, "the queue document was rotated: {json}");
    assert!(
        r.queue_doc_bytes_max.is_some_and(|b| b > 0) && r.queue_doc_load_ms.is_some(),
        "{json}"
    );
    assert_eq!(r.succeeded, r.tasks, "every task done: {json}");
    assert_eq!(r.lost, 0, "{json}");
    assert_eq!(r.duplicates, 0, "{json}");
}

/// `--processes`: each node a `piecework node` process of the built executable, fed through
/// HTTP, its router killed with SIGKILL and restarted. No timing is asserted: every task done,
/// the failover measured, and a peak resident set read for each node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_of_node_processes_with_a_sigkill_loses_nothing() {
    logs();
    let opts = Options {
        nodes: 2,
        workers: 2,
        tasks: 300,
        kind: Kind::Noop,
        failovers: 1,
        latency_samples: 5,
        max_live: Some(100),
        processes: true,
        exe: Some(env!("CARGO_BIN_EXE_piecework").into()),
        progress: false,
        ..Options::default()
    };
    let r = bench::run(&opts).await.expect("the bench runs");
    let json = serde_json::to_string(&r).expect("the report serializes");
    assert!(r.processes, "{json}");
    assert_eq!(r.submit_via, "http", "{json}");
    assert_eq!(r.peak_rss_mib.len(), 2, "{json}");
    assert!(
        r.peak_rss_mib.iter().all(|m| m.is_some_and(|m| m > 0.0)),
        "{json}"
    );
    assert!(r.failover_ms.is_some(), "{json}");
    assert_eq!(r.takeovers_by_restarted_node, 0, "{json}");
    assert!(r.tasks > 300 + 5, "{json}");
    assert_eq!(r.succeeded, r.tasks, "every task done: {json}");
    assert_eq!(r.lost, 0, "{json}");
    assert!(
        r.duplicates <= r.workers as usize * opts.failovers,
        "{json}"
    );
    assert!(
        r.done_rate_first_10pct.is_some() && r.done_rate_last_10pct.is_some(),
        "{json}"
    );
}

#[tokio::test]
async fn the_bench_refuses_bad_arguments() {
    let cases = [
        (
            Options {
                nodes: 0,
                ..Options::default()
            },
            "--nodes",
        ),
        (
            Options {
                tasks: 0,
                ..Options::default()
            },
            "--tasks",
        ),
        (
            Options {
                nodes: 1,
                failovers: 1,
                ..Options::default()
            },
            "at least 2 nodes",
        ),
        (
            Options {
                max_live: Some(10),
                batch: 64,
                ..Options::default()
            },
            "--max-live",
        ),
    ];
    for (opts, says) in cases {
        let e = bench::run(&opts).await.expect_err("refused");
        assert!(format!("{e:#}").contains(says), "{says}: {e:#}");
    }
}
