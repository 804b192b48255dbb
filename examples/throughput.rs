//! Parse a file REPEAT times (a fresh parser each time) and print the
//! throughput: a quick check outside criterion, and a stable target for
//! instruction counts, which do not drift on shared machines:
//!
//! ```sh
//! cargo build --release --example throughput
//! valgrind --tool=callgrind target/release/examples/throughput corpora/clean-rp-zh-teahouse.txt 100 filament 4
//! ```
//!
//! Arguments: FILE [REPEAT=1] [PROFILE=filament] [CHUNK=whole]
//! [PAYLOADS=eager|on-demand]. FILE may be
//! a directory: each `.txt` in it is parsed with its own parser and the
//! profile its name asks for (as `benches/throughput.rs` does with
//! `corpora/`), PROFILE being the fallback.
//!
//! With REPEAT > 1 it also prints the first pass apart from the others:
//! the first runs on cold caches (code and data not yet loaded), which is
//! what one `spindle parse` of a small file pays.

/// The binary's allocator (the default `mimalloc` feature), so that the
/// figures are the binary's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

#[cfg(feature = "mimalloc")]
#[path = "../src/bin/spindle/alloc.rs"]
mod alloc;

use spindle::payload::Payloads;
use spindle::{Parser, ParserOptions, Registry};
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: throughput FILE [REPEAT] [PROFILE] [CHUNK]")?;
    let repeat: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);
    let profile = args.next().unwrap_or_else(|| "filament".into());
    let chunk: Option<usize> = args.next().filter(|s| s != "whole").map(|s| s.parse()).transpose()?;
    let payloads = match args.next().as_deref() {
        None | Some("eager") => Payloads::Eager,
        Some("on-demand") => Payloads::OnDemand,
        Some(other) => return Err(format!("PAYLOADS is eager or on-demand, not {other:?}").into()),
    };
    let mut inputs = Vec::new();
    if std::fs::metadata(&path)?.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(&path)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "txt"))
            .collect();
        files.sort();
        for file in files {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let profile = Registry::profile_for_file_name(name).unwrap_or(&profile);
            let registry = Arc::new(Registry::profile(profile).ok_or("unknown profile")?);
            inputs.push((registry, std::fs::read(&file)?));
        }
    } else {
        let registry = Arc::new(Registry::profile(&profile).ok_or("unknown profile")?);
        inputs.push((registry, std::fs::read(&path)?));
    }
    let started = Instant::now();
    let mut first = None;
    let mut events = 0usize;
    let mut buf = Vec::new();
    for _ in 0..repeat {
        for (registry, input) in &inputs {
            let mut parser =
                Parser::with_options(registry.clone(), ParserOptions { payloads, ..ParserOptions::default() });
            for c in input.chunks(chunk.unwrap_or(input.len()).max(1)) {
                parser.feed_into(c, &mut buf);
                events += buf.len();
                buf.clear();
            }
            events += parser.finish().len();
        }
        first.get_or_insert_with(|| started.elapsed());
    }
    let elapsed = started.elapsed();
    let secs = elapsed.as_secs_f64();
    let bytes = inputs.iter().map(|(_, i)| i.len()).sum::<usize>() * repeat;
    println!("{bytes} bytes, {events} events, {:.3} s, {:.1} MB/s", secs, bytes as f64 / secs / 1e6);
    if let Some(first) = first.filter(|_| repeat > 1) {
        let rest = (elapsed - first) / u32::try_from(repeat - 1).unwrap_or(u32::MAX);
        println!("first pass {first:.1?} (cold caches), then {rest:.1?} per pass");
    }
    Ok(())
}
