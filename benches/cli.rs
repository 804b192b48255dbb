//! The `spindle` binary end to end, as a user or an outside benchmark runs
//! it: one process per transcript, output to `/dev/null`.
//!
//! * `cli/start`: `spindle parse` of an empty file. Process start, the
//!   dynamic loader, the allocator and argument parsing: what no per-file
//!   run can go below. Compare the groups below with it.
//! * `cli/per_file_whole`, `cli/per_file_chunk4`: `spindle parse FILE`
//!   (default profile and JSONL) for every transcript of `corpora/`, each
//!   in its own process, whole and with `--chunk-size 4`. Small transcripts
//!   measure the start more than the parse; this is the figure a
//!   per-transcript run of the release binary sees.
//! * `cli/joined_whole`, `cli/joined_chunk4`: the same transcripts joined
//!   into one file, parsed by one process (one start for all of them).
//!
//! Run: `cargo bench --bench cli`. The binary is the one Cargo builds for
//! this benchmark (`CARGO_BIN_EXE_spindle`, the bench profile: release).

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `spindle parse FILE [--chunk-size N]` to completion; panics (the
/// benchmark is void) when it fails.
fn parse(file: &Path, chunk: Option<usize>) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.arg("parse").arg(file).stdout(Stdio::null()).stderr(Stdio::null());
    if let Some(n) = chunk {
        cmd.arg("--chunk-size").arg(n.to_string());
    }
    match cmd.status() {
        Ok(status) if status.success() => {}
        other => panic!("spindle parse {} failed: {other:?}", file.display()),
    }
}

fn bench_cli(c: &mut Criterion) {
    let files = common::transcripts();
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let empty = tmp.join("cli-bench-empty.txt");
    let joined = tmp.join("cli-bench-joined.txt");
    let all: Vec<u8> = files.iter().filter_map(|f| std::fs::read(f).ok()).flatten().collect();
    if let Err(e) = std::fs::write(&empty, b"").and_then(|()| std::fs::write(&joined, &all)) {
        panic!("cannot write the benchmark's inputs under {}: {e}", tmp.display());
    }
    let bytes = all.len() as u64;

    let mut g = c.benchmark_group("cli");
    g.sample_size(10);
    g.bench_function("start", |b| b.iter(|| parse(&empty, None)));
    g.throughput(Throughput::Bytes(bytes));
    for (name, chunk) in [("whole", None), ("chunk4", Some(4))] {
        g.bench_function(format!("per_file_{name}"), |b| {
            b.iter(|| files.iter().for_each(|f| parse(f, chunk)));
        });
        g.bench_function(format!("joined_{name}"), |b| b.iter(|| parse(&joined, chunk)));
    }
    g.finish();
}

criterion_group!(benches, bench_cli);
criterion_main!(benches);
