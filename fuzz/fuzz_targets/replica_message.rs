//! `replica_message`: see `replica_harness::replica_message` (`fuzz/harness/replica.rs`).

#![no_main]

#[path = "../harness/replica.rs"]
mod replica_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| replica_harness::replica_message(data));
