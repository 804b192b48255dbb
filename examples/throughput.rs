//! Parse a file REPEAT times (a fresh parser each time) and print the
//! throughput: a quick check outside criterion, and a stable target for
//! instruction counts, which do not drift on shared machines:
//!
//! ```sh
//! cargo build --release --example throughput
//! valgrind --tool=callgrind target/release/examples/throughput corpora/clean-rp-zh-teahouse.txt 100 filament 4
//! ```
//!
//! Arguments: FILE [REPEAT=1] [PROFILE=filament] [CHUNK=whole].

/// The binary's allocator (the default `mimalloc` feature), so that the
/// figures are the binary's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use spindle::{Parser, ParserOptions, Registry};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: throughput FILE [REPEAT] [PROFILE] [CHUNK]")?;
    let repeat: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let profile = args.next().unwrap_or_else(|| "filament".into());
    let input = std::fs::read(&path)?;
    let chunk: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(input.len().max(1));
    let registry = Arc::new(Registry::profile(&profile).ok_or("unknown profile")?);
    let started = Instant::now();
    let mut events = 0usize;
    let mut buf = Vec::new();
    for _ in 0..repeat {
        let mut parser = Parser::with_options(registry.clone(), ParserOptions::default());
        for c in input.chunks(chunk.max(1)) {
            parser.feed_into(c, &mut buf);
            events += buf.len();
            buf.clear();
        }
        events += parser.finish().len();
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = input.len() * repeat;
    println!("{bytes} bytes, {events} events, {:.3} s, {:.1} MB/s", secs, bytes as f64 / secs / 1e6);
    Ok(())
}
