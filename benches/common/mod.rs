//! What the benchmarks share: the transcripts they read.

use std::path::{Path, PathBuf};

/// The transcripts of `corpora/` (`*.txt`), sorted by name.
pub fn transcripts() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|x| x == "txt"));
    files.sort();
    files
}
