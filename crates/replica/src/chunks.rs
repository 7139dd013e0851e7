//! Automerge's storage chunks as they travel in sync messages, read only as far as this crate
//! needs: where each chunk ends (to split a message's changes over several messages), and how
//! many bytes its deflated parts inflate to (to refuse one that would inflate beyond a bound,
//! before Automerge inflates it).
//!
//! A chunk is the magic bytes, a 4-byte checksum, a type byte and a LEB128 length, then that
//! many bytes of data. Of the four types Automerge 0.12 reads, three can hold deflated bytes: a
//! document (each column whose specification has the deflate bit), a compressed change (all of
//! its data) and a bundle (as a document). A change's columns are never deflated (Automerge
//! refuses one that says so). Automerge inflates each of them whole, without a bound: 16 MiB of
//! deflated zeros become 16 GiB.

use std::io::Read;

/// The first four bytes of every chunk.
const MAGIC: [u8; 4] = [0x85, 0x6f, 0x4a, 0x83];

/// The bit of a column specification that says its data is deflated.
const DEFLATE_BIT: u64 = 0b1000;

/// What a chunk holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A whole document, as `Automerge::save` writes it.
    Document,
    /// One change.
    Change,
    /// One change, deflated whole.
    Compressed,
    /// Several changes in columns, as a document lays them out.
    Bundle,
}

/// One chunk of a byte string.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk<'a> {
    /// Its type.
    pub(crate) kind: Kind,
    /// The whole chunk, header included.
    pub(crate) bytes: &'a [u8],
    /// Its data, after the header.
    data: &'a [u8],
}

/// Why the chunks of a sync message cannot be handed to Automerge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChunkError {
    /// The bytes are not a sequence of whole chunks of known types.
    #[error("a malformed change chunk ({0})")]
    Malformed(&'static str),
    /// Its chunks would inflate to more than the bound.
    #[error("changes that inflate to more than the {limit} bytes accepted")]
    Inflates {
        /// The bound, in bytes.
        limit: usize,
    },
}

/// The chunks of `bytes`, in order: an error for bytes that are not whole chunks of known types.
pub(crate) fn chunks(bytes: &[u8]) -> impl Iterator<Item = Result<Chunk<'_>, ChunkError>> + '_ {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let next = split_chunk(rest);
        match next {
            Ok((chunk, after)) => {
                rest = after;
                Some(Ok(chunk))
            }
            Err(e) => {
                rest = &[];
                Some(Err(e))
            }
        }
    })
}

fn split_chunk(bytes: &[u8]) -> Result<(Chunk<'_>, &[u8]), ChunkError> {
    let mut r = bytes;
    if take(&mut r, MAGIC.len())? != MAGIC {
        return Err(ChunkError::Malformed("no magic bytes"));
    }
    take(&mut r, 4)?;
    let kind = match take(&mut r, 1)? {
        [0] => Kind::Document,
        [1] => Kind::Change,
        [2] => Kind::Compressed,
        [3] => Kind::Bundle,
        _ => return Err(ChunkError::Malformed("unknown chunk type")),
    };
    let len = length(&mut r)?;
    let header = bytes.len() - r.len();
    let data = take(&mut r, len)?;
    let whole = bytes
        .get(..header + len)
        .ok_or(ChunkError::Malformed("truncated"))?;
    Ok((
        Chunk {
            kind,
            bytes: whole,
            data,
        },
        r,
    ))
}

/// The bytes the deflated parts of the chunks of `entries` (each a sequence of whole chunks, as
/// a sync message's change list holds them) inflate to, together. An error, before inflating
/// past it, once that passes `limit`; an error too for bytes that are not whole chunks, or
/// deflated parts that are not deflate streams (Automerge would refuse both).
pub(crate) fn inflated_size<'a>(
    entries: impl IntoIterator<Item = &'a [u8]>,
    limit: usize,
) -> Result<usize, ChunkError> {
    let mut total = 0usize;
    for entry in entries {
        for chunk in chunks(entry) {
            let chunk = chunk?;
            match chunk.kind {
                Kind::Change => {}
                Kind::Compressed => {
                    total = add(total, inflate(chunk.data, limit - total, limit)?, limit)?;
                }
                Kind::Document | Kind::Bundle => {
                    for column in deflated_columns(chunk.kind, chunk.data)? {
                        total = add(total, inflate(column, limit - total, limit)?, limit)?;
                    }
                }
            }
        }
    }
    Ok(total)
}

fn add(total: usize, n: usize, limit: usize) -> Result<usize, ChunkError> {
    match total.checked_add(n) {
        Some(t) if t <= limit => Ok(t),
        _ => Err(ChunkError::Inflates { limit }),
    }
}

/// The bytes `deflated` inflates to, reading no more than `room + 1` of them.
fn inflate(deflated: &[u8], room: usize, limit: usize) -> Result<usize, ChunkError> {
    let cap = u64::try_from(room).unwrap_or(u64::MAX).saturating_add(1);
    let mut inflater = flate2::bufread::DeflateDecoder::new(deflated).take(cap);
    let n = std::io::copy(&mut inflater, &mut std::io::sink())
        .map_err(|_| ChunkError::Malformed("not a deflate stream"))?;
    match usize::try_from(n) {
        Ok(n) if n <= room => Ok(n),
        _ => Err(ChunkError::Inflates { limit }),
    }
}

/// The data of each deflated column of a document or bundle chunk.
fn deflated_columns(kind: Kind, data: &[u8]) -> Result<Vec<&[u8]>, ChunkError> {
    let mut r = data;
    let mut out = Vec::new();
    if kind == Kind::Bundle {
        // Dependencies, then actors; then change columns and their data, op columns and theirs.
        hashes(&mut r)?;
        actors(&mut r)?;
        let changes = columns(&mut r)?;
        deflated(&mut r, &changes, &mut out)?;
        let ops = columns(&mut r)?;
        deflated(&mut r, &ops, &mut out)?;
    } else {
        // Actors, heads, change columns, op columns; then the change data and the op data.
        actors(&mut r)?;
        hashes(&mut r)?;
        let changes = columns(&mut r)?;
        let ops = columns(&mut r)?;
        deflated(&mut r, &changes, &mut out)?;
        deflated(&mut r, &ops, &mut out)?;
    }
    Ok(out)
}

/// Column metadata: each column's specification and length.
fn columns(r: &mut &[u8]) -> Result<Vec<(u64, usize)>, ChunkError> {
    let n = leb128(r)?;
    let mut cols = Vec::new();
    for _ in 0..n {
        // Every column takes at least two bytes of metadata: a count beyond the bytes left is
        // malformed, caught here before it costs a loop.
        if r.len() < 2 {
            return Err(ChunkError::Malformed("truncated"));
        }
        let spec = leb128(r)?;
        if spec > u64::from(u32::MAX) {
            return Err(ChunkError::Malformed("column specification above 32 bits"));
        }
        cols.push((spec, length(r)?));
    }
    Ok(cols)
}

/// Takes the data of `cols` off `r`, keeping that of the deflated ones.
fn deflated<'a>(
    r: &mut &'a [u8],
    cols: &[(u64, usize)],
    out: &mut Vec<&'a [u8]>,
) -> Result<(), ChunkError> {
    for (spec, len) in cols {
        let data = take(r, *len)?;
        if spec & DEFLATE_BIT != 0 {
            out.push(data);
        }
    }
    Ok(())
}

/// A count of change hashes, then the hashes.
fn hashes(r: &mut &[u8]) -> Result<(), ChunkError> {
    let n = length(r)?;
    take(
        r,
        n.checked_mul(32)
            .ok_or(ChunkError::Malformed("truncated"))?,
    )?;
    Ok(())
}

/// A count of actor ids, then each as a length and its bytes.
fn actors(r: &mut &[u8]) -> Result<(), ChunkError> {
    let n = length(r)?;
    for _ in 0..n {
        if r.is_empty() {
            return Err(ChunkError::Malformed("truncated"));
        }
        let len = length(r)?;
        take(r, len)?;
    }
    Ok(())
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8], ChunkError> {
    if r.len() < n {
        return Err(ChunkError::Malformed("truncated"));
    }
    let (head, tail) = r.split_at(n);
    *r = tail;
    Ok(head)
}

/// A LEB128 length: at most the bytes that could follow it.
fn length(r: &mut &[u8]) -> Result<usize, ChunkError> {
    let n = leb128(r)?;
    usize::try_from(n).map_err(|_| ChunkError::Malformed("length above the address space"))
}

fn leb128(r: &mut &[u8]) -> Result<u64, ChunkError> {
    crate::replica::leb128(r).ok_or(ChunkError::Malformed("bad LEB128 number"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use automerge::transaction::Transactable;
    use automerge::{Automerge, ROOT};
    use std::io::Write;

    fn deflate(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn chunk(kind: u8, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend([0; 4]);
        out.push(kind);
        let mut n = data.len();
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend(data);
        out
    }

    #[test]
    fn a_saved_document_and_its_changes_are_read_whole() {
        let mut doc = Automerge::new();
        for i in 0..50 {
            let mut tx = doc.transaction();
            tx.put(ROOT, format!("k{i}"), "a value that repeats ".repeat(40))
                .unwrap();
            tx.commit();
        }
        let saved = doc.save();
        let kinds: Vec<Kind> = chunks(&saved).map(|c| c.unwrap().kind).collect();
        assert_eq!(kinds, vec![Kind::Document]);
        // The save deflates its value column: counting inflates it.
        let size = inflated_size([saved.as_slice()], usize::MAX).unwrap();
        assert!(size > 50 * 800, "{size}");
        assert!(matches!(
            inflated_size([saved.as_slice()], saved.len()),
            Err(ChunkError::Inflates { .. })
        ));
        let changes: Vec<u8> = doc
            .get_changes(&[])
            .iter()
            .flat_map(|c| c.raw_bytes().to_vec())
            .collect();
        let split: Vec<Chunk<'_>> = chunks(&changes).map(Result::unwrap).collect();
        assert_eq!(split.len(), 50);
        assert!(split.iter().all(|c| c.kind == Kind::Change));
        // Changes as Automerge sends them inflate nothing.
        assert_eq!(inflated_size([changes.as_slice()], 0), Ok(0));
        // A compressed change (as `Change::bytes` gives a large one) counts what it inflates to.
        let mut big = doc.get_changes(&[]).pop().unwrap();
        let raw = big.raw_bytes().len();
        let compressed = big.bytes().to_vec();
        assert!(compressed.len() < raw);
        assert_eq!(
            chunks(&compressed).next().unwrap().unwrap().kind,
            Kind::Compressed
        );
        let inflated = inflated_size([compressed.as_slice()], usize::MAX).unwrap();
        assert!(
            inflated > compressed.len() && inflated < raw,
            "{inflated} of {raw}"
        );
    }

    #[test]
    fn garbage_and_truncated_chunks_are_malformed() {
        let mut doc = Automerge::new();
        doc.transact::<_, _, automerge::AutomergeError>(|tx| tx.put(ROOT, "a", 1).map(|_| ()))
            .unwrap();
        let saved = doc.save();
        for bad in [
            &b"not a chunk"[..],
            &saved[..saved.len() - 1],
            &chunk(9, b"")[..],
        ] {
            assert!(
                matches!(
                    inflated_size([bad], usize::MAX),
                    Err(ChunkError::Malformed(_))
                ),
                "{bad:?}"
            );
        }
        // A document whose metadata claims a billion columns.
        let mut data = vec![0, 0];
        data.extend([0x80, 0x94, 0xeb, 0xdc, 0x03]);
        assert!(matches!(
            inflated_size([chunk(0, &data).as_slice()], usize::MAX),
            Err(ChunkError::Malformed(_))
        ));
    }

    #[test]
    fn a_deflate_bomb_is_stopped_at_the_bound() {
        let zeros = vec![0u8; 8 << 20];
        let bomb = deflate(&zeros);
        assert!(bomb.len() < 64 << 10);
        // As a compressed change.
        let change = chunk(2, &bomb);
        assert!(matches!(
            inflated_size([change.as_slice()], 1 << 20),
            Err(ChunkError::Inflates { limit }) if limit == 1 << 20
        ));
        // As a document's deflated column (no actors or heads, one change column, no ops).
        let mut data = vec![0, 0, 1];
        data.push(0x18); // column 1, type 0, deflated
        let mut n = bomb.len();
        while n >= 0x80 {
            data.push((n & 0x7f) as u8 | 0x80);
            n >>= 7;
        }
        data.push(n as u8);
        data.push(0);
        data.extend(&bomb);
        let document = chunk(0, &data);
        assert!(matches!(
            inflated_size([document.as_slice()], 1 << 20),
            Err(ChunkError::Inflates { .. })
        ));
        assert_eq!(inflated_size([document.as_slice()], 16 << 20), Ok(8 << 20));
    }
}
