//! Loading a document from its stored chunks.

use automerge::{Automerge, AutomergeError, Change};

/// Stored documents at least this large (all chunks together) are loaded by replaying their
/// changes ([`load_chunks`]); smaller ones are loaded as Automerge lays them out.
pub const REPLAY_MIN_BYTES: usize = 64 * 1024;

/// The first batch of changes a replayed load applies; each later one is half of what is in.
const FIRST_BATCH: usize = 32;

/// Loads a document from its stored chunks: a snapshot (if any) and the change chunks written
/// after it, in any order.
///
/// A document of at least [`REPLAY_MIN_BYTES`] is rebuilt from its changes, applied in
/// batches that grow with what is in (32, then half of what is applied so far), and cloned
/// once at the end. Loading it as Automerge lays it out would cost many times its size in
/// memory: Automerge 0.12's column store (hexane 1.0.0-alpha.5) reads each column of a
/// snapshot into one slab, and every change applied to it afterwards splits that slab, copying
/// the rest of it and keeping the whole of the old allocation. A sealed epoch of 0.3–0.7 MB on
/// disk (a snapshot and 460–770 change chunks) then held 170–277 MB once loaded, with a peak
/// of 280 MB; rebuilt, it holds 3.3–3.5 MB with an 18–21 MB peak, in about the same time
/// (docs/benchmarks.md). A replayed document stays small as later changes arrive; one loaded
/// from a snapshot grows by tens of MB. Smaller documents (a task's) load the direct way: it
/// is faster for them, and their slabs are small.
///
/// # Errors
/// A chunk that does not decode, or changes that do not apply.
pub fn load_chunks<C: AsRef<[u8]>>(chunks: &[C]) -> Result<Automerge, AutomergeError> {
    let bytes: usize = chunks.iter().map(|c| c.as_ref().len()).sum();
    if bytes >= REPLAY_MIN_BYTES {
        return replay(chunks);
    }
    let mut doc = Automerge::new();
    let Some((first, rest)) = chunks.split_first() else {
        return Ok(doc);
    };
    doc.load_incremental(first.as_ref())?;
    match rest {
        [] => {}
        [one] => {
            doc.load_incremental(one.as_ref())?;
        }
        _ => {
            // One batch: Automerge applies a batch of changes in one pass over its op
            // columns, where one call per chunk costs a pass each.
            let mut tail = Vec::with_capacity(rest.iter().map(|c| c.as_ref().len()).sum());
            for c in rest {
                tail.extend_from_slice(c.as_ref());
            }
            doc.load_incremental(&tail)?;
        }
    }
    Ok(doc)
}

/// Rebuilds a document from every change its chunks hold (see [`load_chunks`]).
fn replay<C: AsRef<[u8]>>(chunks: &[C]) -> Result<Automerge, AutomergeError> {
    let mut changes = Vec::new();
    for c in chunks {
        match Change::try_from(c.as_ref()) {
            Ok(change) => changes.push(change),
            // A snapshot (or several changes in one chunk): its changes.
            Err(_) => changes.extend(Automerge::load(c.as_ref())?.get_changes(&[])),
        }
    }
    let mut doc = Automerge::new();
    let mut left = changes.into_iter();
    let mut applied = 0usize;
    loop {
        // Changes whose dependencies are not in yet wait in Automerge's queue, as with a load.
        let batch: Vec<Change> = left.by_ref().take(FIRST_BATCH.max(applied / 2)).collect();
        if batch.is_empty() {
            break;
        }
        applied += batch.len();
        doc.apply_changes(batch)?;
    }
    // The batches leave spare capacity in the columns (some 13 MB in a 3 MB document); a
    // clone holds each at its size.
    Ok(doc.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use automerge::{ROOT, ReadDoc, transaction::Transactable};

    fn change(doc: &mut Automerge, key: &str, value: i64) -> Vec<u8> {
        let before = doc.get_heads();
        let mut tx = doc.transaction();
        tx.put(ROOT, key, value).unwrap();
        tx.commit();
        doc.save_after(&before)
    }

    #[test]
    fn a_snapshot_and_its_change_chunks_load_as_one_document() {
        let mut doc = Automerge::new();
        change(&mut doc, "a", 1);
        let mut chunks = vec![doc.save()];
        for i in 0..20 {
            chunks.push(change(&mut doc, &format!("k{i}"), i));
        }
        chunks.push(change(&mut doc, "a", 2));
        let loaded = load_chunks(&chunks).unwrap();
        assert_eq!(loaded.get_heads(), doc.get_heads());
        assert_eq!(loaded.get(ROOT, "a").unwrap().unwrap().0.as_i64(), Some(2));
        assert_eq!(
            loaded.get(ROOT, "k19").unwrap().unwrap().0.as_i64(),
            Some(19)
        );
        // Change chunks alone (a document never compacted) load too, and so does nothing.
        let mut fresh = Automerge::new();
        let changes: Vec<Vec<u8>> = (0..5).map(|i| change(&mut fresh, "n", i)).collect();
        let only_changes = load_chunks(&changes).unwrap();
        assert_eq!(only_changes.get_heads(), fresh.get_heads());
        assert_eq!(
            only_changes.get(ROOT, "n").unwrap().unwrap().0.as_i64(),
            Some(4)
        );
        assert!(load_chunks::<Vec<u8>>(&[]).unwrap().get_heads().is_empty());
    }

    #[test]
    fn a_large_document_is_replayed_into_the_same_document() {
        let mut doc = Automerge::new();
        // Values that do not compress, so that the stored bytes pass the threshold.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut noise = || {
            (0..25)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    format!("{:08x}", x as u32)
                })
                .collect::<String>()
        };
        for i in 0..200 {
            change_str(&mut doc, &format!("k{i}"), &noise());
        }
        let mut chunks = vec![doc.save()];
        let mut filler = String::new();
        for i in 0..150 {
            filler = noise();
            chunks.push(change_str(&mut doc, &format!("late{i}"), &filler));
        }
        // Stored chunks come back in key order, not in the order written.
        chunks[1..].reverse();
        assert!(chunks.iter().map(Vec::len).sum::<usize>() >= REPLAY_MIN_BYTES);
        let loaded = load_chunks(&chunks).unwrap();
        assert_eq!(loaded.get_heads(), doc.get_heads());
        assert_eq!(
            loaded
                .get(ROOT, "late149")
                .unwrap()
                .unwrap()
                .0
                .into_string()
                .ok(),
            Some(filler.clone())
        );
        assert_eq!(loaded.get_changes(&[]).len(), doc.get_changes(&[]).len());
    }

    fn change_str(doc: &mut Automerge, key: &str, value: &str) -> Vec<u8> {
        let before = doc.get_heads();
        let mut tx = doc.transaction();
        tx.put(ROOT, key, value).unwrap();
        tx.commit();
        doc.save_after(&before)
    }

    #[test]
    fn a_chunk_that_is_not_automerge_is_an_error() {
        let mut doc = Automerge::new();
        let mut chunks = vec![doc.save()];
        chunks.push(change(&mut doc, "a", 1));
        chunks.insert(0, b"not a document".to_vec());
        assert!(load_chunks(&chunks).is_err());
    }
}
