//! The module structure: no two modules import each other, directly or
//! round a longer loop (STYLE: one folder per layer, no import cycles).
//!
//! Read from the source text: every `crate::…` and `super::…` path outside
//! comments and `#[cfg(test)] mod tests` blocks is an edge to the longest
//! module it names. A module's own ancestors and descendants do not count
//! (a child uses its parent's types; a parent declares its children). The
//! reading is textual on purpose: it needs no compiler internals, and the
//! house style (paths in `use` lines, tests at a file's end) is what makes
//! it exact enough.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; the crate roots
/// and the binary are not library modules.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    match parts.as_slice() {
        [one] if one == "lib" || one == "main" => None,
        [first, ..] if first == "bin" || first == "main" => None,
        [.., last] if last == "mod" => Some(parts[..parts.len() - 1].join("::")),
        _ => Some(parts.join("::")),
    }
}

/// The paths a line names after `prefix` (`crate::` or `super::`), as
/// their `::`-separated lower-case segments.
fn paths_after<'a>(line: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest.find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':'));
        let path = &rest[..end.unwrap_or(rest.len())];
        out.push(path.split("::").filter(|s| !s.is_empty()).collect());
    }
    out
}

fn is_within(module: &str, other: &str) -> bool {
    module.len() > other.len() && module.starts_with(other) && module[other.len()..].starts_with("::")
}

/// The import graph: module -> the modules it names (not its ancestors or
/// descendants).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeMap<String, PathBuf> =
        files.iter().filter_map(|f| module_of(&src, f).map(|m| (m, f.clone()))).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let parent: Vec<&str> = module.split("::").collect();
        let parent = &parent[..parent.len() - 1];
        let targets = edges.entry(module.clone()).or_default();
        for line in code.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
            let from_crate = paths_after(line, "crate::");
            let from_super = paths_after(line, "super::").into_iter().map(|p| [parent, &p[..]].concat());
            for path in from_crate.into_iter().chain(from_super) {
                let named = (1..=path.len()).rev().map(|k| path[..k].join("::")).find(|m| modules.contains_key(m));
                if let Some(named) = named
                    && named != *module
                    && !is_within(module, &named)
                    && !is_within(&named, module)
                {
                    targets.insert(named);
                }
            }
        }
    }
    edges
}

/// A loop in `edges` through `from`, if there is one.
fn loop_from(edges: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, path)) = stack.pop() {
        for next in edges.get(&at).into_iter().flatten() {
            if next == from {
                return Some([path.clone(), vec![from.to_string()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [path.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it() {
    let edges = graph();
    assert!(edges.len() > 40, "the source tree was not read: {} modules", edges.len());
    let loops: Vec<String> = edges.keys().filter_map(|m| loop_from(&edges, m)).map(|l| l.join(" -> ")).collect();
    assert!(loops.is_empty(), "import cycles between modules:\n{}", loops.join("\n"));
}

#[test]
fn the_reading_sees_edges_and_loops() {
    // The graph is not empty because of a reading that finds nothing: the
    // proxy's server names its pump, and a made-up loop is found.
    let edges = graph();
    assert!(edges.get("proxy::server").is_some_and(|t| t.contains("proxy::pump")), "{edges:?}");
    assert!(edges.get("machine").is_some_and(|t| t.contains("scan")), "{:?}", edges.get("machine"));
    let mut looped = edges.clone();
    looped.entry("scan".into()).or_default().insert("machine".into());
    assert!(loop_from(&looped, "scan").is_some());
    assert_eq!(
        paths_after("use super::relay::{End, SseRelay}; let x = crate::scan::text_lossy(b);", "super::"),
        [vec!["relay"]]
    );
    assert_eq!(paths_after("use crate::scan::Span;", "crate::"), [vec!["scan"]]);
}
