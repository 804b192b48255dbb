//! Memory of idle parsers: creates 10,000 parsers (one per stream, as a
//! proxy holds them), each fed a little, and prints the resident memory
//! they add, in total and per parser, read from `/proc/self/statm` (no
//! allocator hooks, no unsafe code). Linux only.
//!
//! Run: `cargo run --release --example memory [N]`.

use spindle::{Parser, Registry};
use std::sync::Arc;

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let registry = Arc::new(Registry::filament());
    // Warm up the allocator and the registry before measuring.
    drop((0..100).map(|_| Parser::with_options(registry.clone(), Default::default())).collect::<Vec<_>>());
    let before = rss_bytes().unwrap_or(0);
    let mut parsers: Vec<Parser> = (0..n).map(|_| Parser::with_options(registry.clone(), Default::default())).collect();
    let idle = rss_bytes().unwrap_or(0);
    // Each stream has started: a thought open, some content streamed.
    for p in &mut parsers {
        let _ = p.feed(b"<thought>Thinking about the answer</thought>\n<content>Hello, ");
    }
    let started = rss_bytes().unwrap_or(0);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!("{n} idle parsers: {:.1} MiB ({} bytes each)", mib(idle - before), (idle - before) / n as u64);
    println!("{n} parsers mid-stream: {:.1} MiB ({} bytes each)", mib(started - before), (started - before) / n as u64);
    drop(parsers);
}
