//! Memory of idle parsers: creates 10,000 parsers (one per stream, as a
//! proxy holds them), each fed a little, and prints the resident memory
//! they add, in total and per parser, read from `/proc/self/statm` (no
//! allocator hooks, no unsafe code). Then the peak a large element costs:
//! one tool call of 3.7 MiB (under the 4 MiB element limit, streamed 4 KiB
//! at a time, its `call_delta` fragments and payload built), as the growth
//! of the peak resident size (`VmHWM` in `/proc/self/status`). Linux only.
//!
//! Run: `cargo run --release --example memory [N]`.

use spindle::{Parser, Registry};
use std::sync::Arc;

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The peak resident size so far (`VmHWM`), in bytes.
fn peak_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parses one large `<tool_call>` (an array of 500,000 numbers) and
/// prints how far the peak resident size grew, against the call's size.
fn large_element(registry: &Arc<Registry>) {
    let numbers: Vec<String> = (0..500_000).map(|n| n.to_string()).collect();
    let call = format!(r#"<tool_call>{{"name": "plot", "arguments": {{"xs": [{}]}}}}</tool_call>"#, numbers.join(", "));
    drop(numbers);
    let before = peak_bytes().unwrap_or(0);
    let mut parser = Parser::with_options(registry.clone(), Default::default());
    let mut events = 0;
    for piece in call.as_bytes().chunks(4096) {
        events += parser.feed(piece).len();
    }
    events += parser.finish().len();
    let grew = peak_bytes().unwrap_or(0).saturating_sub(before);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "one {:.1} MiB tool call ({events} events): peak {:.1} MiB more ({:.1}x its size)",
        mib(call.len() as u64),
        mib(grew),
        grew as f64 / call.len() as f64
    );
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
    large_element(&registry);
}
