//! `piecework-sim`: runs many seeds (or replays one) and prints what they found.
//!
//! `cargo run -p piecework-sim --release -- --seeds 1000 [--seed S] [--nodes K] [--faults MIX] [--json]`
//!
//! `--swarm` draws each seed's node count, relay waits and fault rates from the seed
//! (`Config::swarm`) instead of `--nodes`, `--relay-ms` and `--faults`.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Parser;
use piecework_sim::{Config, FaultMix, Report, Shape, Violation};
use serde::Serialize;

/// Runs Piecework's deterministic simulator over many seeds.
#[derive(Parser, Debug)]
#[command(name = "piecework-sim", version, about)]
struct Args {
    /// How many seeds to run (consecutive, from --seed).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed; with --seeds 1, the one to replay.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Nodes per cluster.
    #[arg(long, default_value_t = 5, conflicts_with = "swarm")]
    nodes: usize,
    /// Tasks per run.
    #[arg(long, default_value_t = 40)]
    tasks: usize,
    /// Virtual seconds of faults per run (then everything heals).
    #[arg(long, default_value_t = 60)]
    fault_secs: u64,
    /// The fault mix: default, crashes, stops, calm, partitions or byzantine (the last node
    /// a hostile member).
    #[arg(long, default_value = "default", conflicts_with = "swarm")]
    faults: String,
    /// Swarm testing: each seed draws its node count (3–9), relay waits and fault rates from
    /// the seed; a failing seed replays with `--swarm --seeds 1 --seed S`.
    #[arg(long)]
    swarm: bool,
    /// Sealed epoch documents each node keeps on disk (default: as a node, 256).
    #[arg(long)]
    keep_sealed_epochs: Option<usize>,
    /// The replicas' relay waits in ms, `LOWER,HIGHER` (default: a node's, 10,60).
    #[arg(long, value_parser = parse_relay_ms, conflicts_with = "swarm")]
    relay_ms: Option<(u64, u64)>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
    /// Print each seed's report as a JSON line on stderr.
    #[arg(long)]
    verbose: bool,
    /// How many of a failing seed's last trace lines to print (a large number prints it all).
    #[arg(long, default_value_t = 60)]
    trace_lines: usize,
}

#[derive(Serialize, Default)]
struct Summary {
    seeds_run: u64,
    failing_seeds: Vec<u64>,
    /// Each failing seed's shape and violations.
    failures: Vec<Failure>,
    tasks: u64,
    lost: u64,
    runs_with_duplicates: u64,
    most_duplicates_in_one_run: usize,
    duplicated_tasks: u64,
    rerun_tasks: u64,
    takeovers: u64,
    fenced: u64,
    /// Seeds run per node count (several only with --swarm).
    seeds_by_nodes: BTreeMap<usize, u64>,
    faults: BTreeMap<String, u64>,
    /// The Byzantine member's acts (`--faults byzantine`), sent and refused by honest nodes.
    byzantine_sent: BTreeMap<String, u64>,
    byzantine_refused: BTreeMap<String, u64>,
    violations_by_invariant: BTreeMap<u8, u64>,
    virtual_seconds: f64,
    real_seconds: f64,
    virtual_seconds_per_real_second: f64,
}

#[derive(Serialize)]
struct Failure {
    seed: u64,
    shape: Shape,
    violations: Vec<Violation>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.nodes < 2 {
        bail!("--nodes must be at least 2");
    }
    let mix = FaultMix::named(&args.faults).with_context(|| {
        format!(
            "unknown fault mix {:?}: use default, crashes, stops, calm, partitions or byzantine",
            args.faults
        )
    })?;
    let shape = |seed: u64| {
        let base = if args.swarm {
            Config::swarm(seed)
        } else {
            Config {
                nodes: args.nodes,
                mix: mix.clone(),
                relay_ms: args.relay_ms,
                ..Config::default()
            }
        };
        Config {
            tasks: args.tasks,
            fault_ms: args.fault_secs * 1000,
            trace_lines: args.trace_lines,
            keep_sealed_epochs: args
                .keep_sealed_epochs
                .unwrap_or(piecework_core::KEEP_SEALED_EPOCHS),
            ..base
        }
    };
    let started = Instant::now();
    let mut s = Summary::default();
    let mut first_failure: Option<Report> = None;
    for seed in args.seed..args.seed + args.seeds {
        let config = shape(seed);
        let r = piecework_sim::run(seed, &config);
        if args.verbose {
            eprintln!("{}", serde_json::to_string(&r)?);
        }
        s.seeds_run += 1;
        s.tasks += r.tasks as u64;
        s.lost += r.lost as u64;
        if r.duplicated_tasks > 0 {
            s.runs_with_duplicates += 1;
        }
        s.most_duplicates_in_one_run = s.most_duplicates_in_one_run.max(r.duplicated_tasks);
        s.duplicated_tasks += r.duplicated_tasks as u64;
        s.rerun_tasks += r.rerun_tasks as u64;
        s.takeovers += r.takeovers as u64;
        s.fenced += r.fenced as u64;
        *s.seeds_by_nodes.entry(r.shape.nodes).or_default() += 1;
        for (k, v) in &r.faults {
            *s.faults.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &r.byzantine_sent {
            *s.byzantine_sent.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &r.byzantine_refused {
            *s.byzantine_refused.entry(k.clone()).or_default() += v;
        }
        for v in &r.violations {
            *s.violations_by_invariant.entry(v.invariant).or_default() += 1;
        }
        s.virtual_seconds += r.virtual_ms as f64 / 1000.0;
        if !r.passed() {
            s.failing_seeds.push(seed);
            s.failures.push(Failure {
                seed,
                shape: r.shape.clone(),
                violations: r.violations.clone(),
            });
            first_failure.get_or_insert(r);
        }
    }
    s.real_seconds = started.elapsed().as_secs_f64();
    s.virtual_seconds_per_real_second = s.virtual_seconds / s.real_seconds.max(1e-9);
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!("seeds run          {}", s.seeds_run);
        println!("failing seeds      {:?}", s.failing_seeds);
        println!("tasks              {} ({} lost)", s.tasks, s.lost);
        println!(
            "duplicates         {} tasks succeeded more than once, in {} runs; at most {} in one run",
            s.duplicated_tasks, s.runs_with_duplicates, s.most_duplicates_in_one_run
        );
        println!(
            "reruns             {} tasks ran more than once (retries, runs lost with their node, duplicates)",
            s.rerun_tasks
        );
        println!("takeovers          {}", s.takeovers);
        println!("starts fenced      {}", s.fenced);
        if args.swarm {
            println!("seeds by nodes     {:?}", s.seeds_by_nodes);
        }
        println!("faults injected    {:?}", s.faults);
        if !s.byzantine_sent.is_empty() {
            println!("hostile acts sent  {:?}", s.byzantine_sent);
            println!("  and refused      {:?}", s.byzantine_refused);
        }
        println!(
            "speed              {:.0} virtual s in {:.1} real s: {:.0} virtual s per real s",
            s.virtual_seconds, s.real_seconds, s.virtual_seconds_per_real_second
        );
    }
    if let Some(r) = first_failure {
        eprintln!("\nseed {} failed:", r.seed);
        for v in &r.violations {
            eprintln!("  invariant {} at {} ms: {}", v.invariant, v.at_ms, v.what);
        }
        eprintln!("trace tail:");
        for l in &r.trace_tail {
            eprintln!("  {l}");
        }
        eprintln!(
            "shape: {} nodes, relay waits {:?} ms, mix {}",
            r.shape.nodes,
            r.shape.relay_ms,
            serde_json::to_string(&r.shape.mix)?
        );
        let shape = if args.swarm {
            " --swarm".to_owned()
        } else {
            format!(" --nodes {} --faults {}", args.nodes, args.faults)
                + &args
                    .relay_ms
                    .map(|(l, h)| format!(" --relay-ms {l},{h}"))
                    .unwrap_or_default()
        };
        eprintln!(
            "replay: cargo run -p piecework-sim --release -- --seeds 1 --seed {}{shape} --tasks {} --fault-secs {}{} (add --trace-lines 100000 for the whole trace)",
            r.seed,
            args.tasks,
            args.fault_secs,
            args.keep_sealed_epochs
                .map(|k| format!(" --keep-sealed-epochs {k}"))
                .unwrap_or_default()
        );
        bail!("{} of {} seeds failed", s.failing_seeds.len(), s.seeds_run);
    }
    Ok(())
}

/// `LOWER,HIGHER` in ms.
fn parse_relay_ms(s: &str) -> Result<(u64, u64), String> {
    let (l, h) = s
        .split_once(',')
        .ok_or_else(|| format!("expected LOWER,HIGHER in ms, got {s:?}"))?;
    let ms = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|e| format!("{v:?} is not a number of ms: {e}"))
    };
    Ok((ms(l)?, ms(h)?))
}
