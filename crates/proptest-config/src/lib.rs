//! The proptest configuration every property test in the workspace uses:
//!
//! ```text
//! proptest! {
//!     #![proptest_config(piecework_proptest_config::config(200))]
//!     // ...
//! }
//! ```
//!
//! - **By default (CI, `cargo test`)** the cases come from a fixed seed ([`SEED`], ChaCha), so
//!   every run explores the same cases and a red run is red again on the next try.
//! - **A hunt** (`PIECEWORK_PROPTEST_HUNT=1`) draws a fresh random seed and runs
//!   [`HUNT_FACTOR`] times as many cases.
//! - proptest's own variables still apply on top of either (the `proptest!` macro reads them
//!   last): `PROPTEST_CASES=<n>` sets the number of cases, `PROPTEST_RNG_SEED=<u64>` replays
//!   another seed. CI sets none of them.
//! - **Failures** are kept next to the test that found them: `tests/merge.rs` writes
//!   `tests/merge.proptest-regressions`, `src/tests.rs` writes
//!   `src/tests.proptest-regressions`. Commit them: proptest replays every case they hold
//!   before it generates new ones, in CI and in a hunt.

#![warn(missing_docs)]

use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, RngSeed};

/// The seed every property test draws its cases from, unless a hunt or `PROPTEST_RNG_SEED`
/// says otherwise.
pub const SEED: u64 = 0x7069_6563_6577_6f72; // "piecewor"

/// The environment variable that turns a run into a hunt: a random seed, more cases.
pub const HUNT_VAR: &str = "PIECEWORK_PROPTEST_HUNT";

/// How many times as many cases a hunt runs as a test's own count.
pub const HUNT_FACTOR: u32 = 10;

/// The configuration of a property test that runs `cases` cases in CI.
pub fn config(cases: u32) -> Config {
    let hunt = hunting();
    Config {
        cases: if hunt {
            cases.saturating_mul(HUNT_FACTOR)
        } else {
            cases
        },
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: if hunt {
            RngSeed::Random
        } else {
            RngSeed::Fixed(SEED)
        },
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

/// Whether this run is a hunt ([`HUNT_VAR`] set to anything but `0` or nothing).
pub fn hunting() -> bool {
    std::env::var_os(HUNT_VAR).is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_runs_draw_from_the_fixed_seed_and_keep_failures_beside_the_test() {
        if hunting() {
            return; // a hunt draws its own seed
        }
        let c = config(7);
        assert_eq!(c.rng_seed, RngSeed::Fixed(SEED));
        assert_eq!(c.rng_algorithm, RngAlgorithm::ChaCha);
        assert_eq!(c.cases, 7);
        let persistence = c.failure_persistence.expect("failures are kept");
        let expected: Box<dyn proptest::test_runner::FailurePersistence> =
            Box::new(FileFailurePersistence::WithSource("proptest-regressions"));
        assert!(persistence == expected);
    }
}
