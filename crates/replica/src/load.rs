//! Loading a document from its stored chunks.

use automerge::{Automerge, AutomergeError};

/// Loads a document from its stored chunks, the snapshot (if any) first and then the change
/// chunks written after it, in order.
///
/// The change chunks are applied in one batch: Automerge applies a batch of changes in one
/// pass over its op columns, where loading them one call each costs a pass per chunk (a
/// document saved as a snapshot and 150 chunks took 150 passes).
///
/// # Errors
/// A chunk that does not decode, or changes that do not apply.
pub fn load_chunks<C: AsRef<[u8]>>(chunks: &[C]) -> Result<Automerge, AutomergeError> {
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
            let mut tail = Vec::with_capacity(rest.iter().map(|c| c.as_ref().len()).sum());
            for c in rest {
                tail.extend_from_slice(c.as_ref());
            }
            doc.load_incremental(&tail)?;
        }
    }
    Ok(doc)
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
    fn a_chunk_that_is_not_automerge_is_an_error() {
        let mut doc = Automerge::new();
        let mut chunks = vec![doc.save()];
        chunks.push(change(&mut doc, "a", 1));
        chunks.insert(0, b"not a document".to_vec());
        assert!(load_chunks(&chunks).is_err());
    }
}
