//! Every transcript in `corpora/` parses to its checked-in expected events
//! (`corpora/expected/*.snap`, insta snapshots), identically whole, byte by
//! byte and in 7-byte chunks (lol_html's re-chunking harness, STYLE B.4).
//!
//! The profile comes from the file name: `reasoning-*`, `tam-*`, `action-*`
//! and `attp-*` use those profiles, everything else `filament`.
//! Accept intended changes with `INSTA_UPDATE=always cargo test --test corpus`
//! and review the diff. `CHUNK_SIZE=n` adds one more chunk size to compare.

use spindle::event::{Event, coalesce};
use spindle::{JsonLines, Parser, ParserOptions, Registry};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn profile_for(name: &str) -> &'static str {
    Registry::profile_for_file_name(name).unwrap_or("filament")
}

fn transcripts() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("corpora/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    files
}

fn parse(registry: &Arc<Registry>, input: &[u8], chunk: usize) -> Vec<Event> {
    let mut parser = Parser::with_options(registry.clone(), ParserOptions::default());
    let mut events = Vec::new();
    for c in input.chunks(chunk.max(1)) {
        parser.feed_into(c, &mut events);
    }
    events.extend(parser.finish());
    coalesce(events)
}

#[test]
fn corpus_has_at_least_30_transcripts() {
    assert!(transcripts().len() >= 30, "corpora/ holds {} transcripts", transcripts().len());
}

#[test]
fn every_transcript_matches_its_snapshot_at_every_chunk_size() {
    let extra: Option<usize> = std::env::var("CHUNK_SIZE").ok().and_then(|s| s.parse().ok());
    for path in transcripts() {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let registry = Arc::new(Registry::profile(profile_for(&name)).expect("known profile"));
        let input = std::fs::read(&path).expect("readable transcript");
        let whole = parse(&registry, &input, input.len());
        for chunk in [1, 7].into_iter().chain(extra) {
            assert_eq!(parse(&registry, &input, chunk), whole, "{name} at chunk size {chunk}");
        }
        let jsonl: String = whole.iter().map(|e| serde_json::to_string(e).expect("events serialise") + "\n").collect();
        insta::with_settings!({
            snapshot_path => "../corpora/expected",
            prepend_module_to_snapshot => false,
            description => format!("spindle parse corpora/{name}.txt --profile {}", profile_for(&name)),
        }, {
            insta::assert_snapshot!(name, jsonl);
        });
    }
}

/// `feed_with` hands out, in batches, exactly the events `feed_into`
/// collects (uncoalesced), on the whole corpus fed as one large chunk.
#[test]
fn feed_with_batches_are_feed_into_events() {
    let registry = Arc::new(Registry::filament());
    let input: Vec<u8> = transcripts().iter().flat_map(|p| std::fs::read(p).expect("readable transcript")).collect();
    let mut collected = Vec::new();
    Parser::with_options(registry.clone(), ParserOptions::default()).feed_into(&input, &mut collected);
    let mut batched = Vec::new();
    let mut batches = 0;
    let mut parser = Parser::with_options(registry, ParserOptions::default());
    parser
        .feed_with(&input, |events| {
            batches += 1;
            batched.extend_from_slice(events);
            Ok::<(), ()>(())
        })
        .expect("no error");
    assert!(batches > 1, "a {} byte chunk comes in several batches", input.len());
    assert_eq!(batched, collected);
    // An error stops the feed at once.
    let mut parser = Parser::with_options(Arc::new(Registry::filament()), ParserOptions::default());
    assert_eq!(parser.feed_with(&input, |_| Err("stop")), Err("stop"));
    assert!(parser.offset() < input.len());
}

/// `Event::write_json` (the JSONL writer of `spindle parse`) writes every
/// event of every transcript, whole and byte by byte (many small deltas),
/// exactly as serde does: the snapshots above are the serde form.
#[test]
fn every_event_writes_its_serde_json() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let more: Vec<PathBuf> = std::fs::read_dir(&data)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "txt")).collect()
        })
        .unwrap_or_default();
    let mut checked = 0;
    for path in transcripts().into_iter().chain(more) {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let registry = Arc::new(Registry::profile(profile_for(&name)).expect("known profile"));
        let input = std::fs::read(&path).expect("readable transcript");
        for chunk in [input.len(), 1] {
            let mut parser = Parser::with_options(registry.clone(), ParserOptions::default());
            let mut events = Vec::new();
            for c in input.chunks(chunk.max(1)) {
                parser.feed_into(c, &mut events);
            }
            events.extend(parser.finish());
            // `JsonLines` over the whole sequence: a delta line's start is
            // kept from delta to delta of one element.
            let (mut json, mut lines) = (JsonLines::new(), Vec::new());
            let mut expected_lines = String::new();
            for event in &events {
                let mut line = Vec::new();
                event.write_json(&mut line);
                let expected = serde_json::to_string(event).expect("events serialise");
                assert_eq!(String::from_utf8_lossy(&line), expected, "{name} at chunk size {chunk}");
                json.push(event, &mut lines);
                expected_lines.push_str(&expected);
                expected_lines.push('\n');
                checked += 1;
            }
            assert_eq!(String::from_utf8_lossy(&lines), expected_lines, "{name} as lines at chunk size {chunk}");
        }
    }
    assert!(checked > 10_000, "{checked} events checked");
}

/// Payloads on demand (`Payloads::OnDemand`): on every transcript, whole
/// and at 1 and 7 bytes, the eager events are the on-demand events with
/// each deferred payload built (`payload::build_deferred`) and put back,
/// its repair and diagnostics after it (compared as JSON, key order
/// included).
#[test]
fn payloads_built_on_demand_are_the_eager_ones() {
    let mut deferred = 0;
    for path in transcripts() {
        let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let registry = Arc::new(Registry::profile(profile_for(&name)).expect("known profile"));
        let input = std::fs::read(&path).expect("readable transcript");
        for chunk in [input.len(), 1, 7] {
            if let Err(why) = spindle::check::deferred_payloads_with(&registry, &input, chunk) {
                panic!("{name} at chunk size {chunk}: {why}");
            }
        }
        let options = ParserOptions { payloads: spindle::Payloads::OnDemand, ..ParserOptions::default() };
        let mut parser = Parser::with_options(registry.clone(), options);
        let mut events = parser.feed(&input);
        events.extend(parser.finish());
        deferred += events
            .iter()
            .filter_map(Event::as_element)
            .filter(|e| spindle::payload::build_deferred(&registry, e).is_some())
            .count();
    }
    // Not an empty check: the corpus has dozens of deferred payloads.
    assert!(deferred >= 40, "only {deferred} deferred payloads in corpora/");
}
