//! `packed_record`: see `queue_doc_harness::packed_record` (`fuzz/harness/queue_doc.rs`).

#![no_main]

#[path = "../harness/queue_doc.rs"]
mod queue_doc_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| queue_doc_harness::packed_record(data));
