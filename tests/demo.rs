//! `piecework demo --json`, run as a new user runs it: the binary exits 0 and its summary shows
//! every task completed, none lost, and another peer routing after the kill. Both the default
//! cluster and the bigger one the README mentions (`--nodes 5 --tasks 500`).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_piecework");

/// Runs the demo with `args` and returns its JSON summary.
fn demo(args: &[&str]) -> serde_json::Value {
    let out = Command::new(BIN)
        .args(["demo", "--json"])
        .args(args)
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "piecework demo --json {args:?} failed\nstdout: {stdout}\nstderr: {stderr}"
    );
    let mut lines = stdout.lines().filter(|l| !l.trim().is_empty());
    let summary = lines.next().expect("a summary line on stdout");
    assert!(
        lines.next().is_none(),
        "one JSON object on stdout: {stdout}"
    );
    serde_json::from_str(summary).unwrap_or_else(|e| panic!("not JSON ({e}): {summary}"))
}

fn check(s: &serde_json::Value, nodes: u64, tasks: u64) {
    let n = |k: &str| {
        s[k].as_u64()
            .unwrap_or_else(|| panic!("{k} is a number: {s}"))
    };
    let text = |k: &str| {
        s[k].as_str()
            .unwrap_or_else(|| panic!("{k} is a string: {s}"))
            .to_owned()
    };
    assert_eq!(n("nodes"), nodes, "{s}");
    assert_eq!(n("tasks_submitted"), tasks, "{s}");
    assert_eq!(n("tasks_completed"), tasks, "{s}");
    assert_eq!(n("lost"), 0, "{s}");
    assert_eq!(
        s["lost_tasks"].as_array().map(Vec::len),
        Some(0),
        "no task id left unanswered: {s}"
    );
    assert!(n("executions") >= tasks, "every task ran: {s}");
    assert!(n("duplicates") <= n("executions") - tasks, "{s}");
    // Judged after the run, per task: some tasks succeeded on runs the new router routed.
    assert!(
        n("completed_after_kill") > 0,
        "the kill landed mid-run: {s}"
    );
    assert!(n("term_after") > n("term_before"), "{s}");
    assert!(n("takeover_ms") > 0 && n("elapsed_ms") > 0, "{s}");
    let (before, after) = (text("router_before"), text("router_after"));
    assert!(before.starts_with("12D3KooW"), "a libp2p peer id: {s}");
    assert_ne!(before, after, "another peer took over: {s}");
}

#[test]
fn the_demo_completes_every_task_across_a_takeover_at_both_sizes() {
    check(&demo(&[]), 3, 200);
    check(&demo(&["--nodes", "5", "--tasks", "500"]), 5, 500);
}

#[test]
fn the_demo_refuses_a_cluster_too_small_for_a_takeover() {
    let out = Command::new(BIN)
        .args(["demo", "--json", "--nodes", "1"])
        .output()
        .expect("the binary runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 2 nodes"), "{stderr}");
    assert!(out.stdout.is_empty(), "no summary on stdout");
}
