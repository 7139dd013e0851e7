//! The seed corpus kept in the repository, `fuzz/corpus/<target>/`: the property tests replay
//! every file of it, and an ignored test in each writes its seeds anew (see `fuzz/README.md`). Paths are taken from a workspace crate's manifest directory
//! (`crates/<name>`).

// Not every test file uses every function.
#![allow(dead_code)]

use std::path::PathBuf;

/// The directory of a target's seeds.
pub fn dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Every seed of a target, by file name, in name order. Panics if there are none: a target
/// without seeds is a corpus lost.
pub fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = dir(target);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes =
                std::fs::read(&path).unwrap_or_else(|e| panic!("the seed {}: {e}", path.display()));
            (name, bytes)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// Writes one seed of a target (the directory is made if missing).
pub fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = dir(target);
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    std::fs::write(dir.join(name), bytes).expect("a seed written");
}
