//! `queue_changes`: see `core_harness::queue_changes` (`fuzz/harness/core.rs`).

#![no_main]

#[path = "../harness/core.rs"]
mod core_harness;
#[path = "../harness/queue_doc.rs"]
mod queue_doc_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| core_harness::queue_changes(data));
