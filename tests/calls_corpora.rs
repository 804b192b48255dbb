//! The `corpora/{tam,action,attp}-*.txt` transcripts: each parsed by the
//! binary whole, byte by byte and 7 bytes at a time (the events must agree),
//! and its call payloads (with context, as a [`CallTracker`] builds them)
//! compared with `corpora/expected/<name>.expected.json`.
//!
//! `SPINDLE_BLESS=1 cargo test --test calls_corpora` rewrites the expected
//! files; review the diff before committing it.
//!
//! [`CallTracker`]: spindle::calls::CallTracker

mod calls_support;

use calls_support::*;
use serde_json::Value;
use spindle::event::Element;

fn corpora() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("corpora").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let Some(stem) = name.strip_suffix(".txt") else {
            continue;
        };
        let profile = stem.split('-').next().unwrap();
        if matches!(profile, "tam" | "action" | "attp") {
            out.push((stem.to_string(), profile.to_string()));
        }
    }
    out.sort();
    out
}

#[test]
fn corpora_match_their_expected_payloads() {
    let bless = std::env::var_os("SPINDLE_BLESS").is_some();
    let list = corpora();
    assert!(list.len() >= 30, "expected the tam/action/attp corpora, found {}", list.len());
    for (stem, profile_name) in list {
        let input = std::fs::read_to_string(format!("corpora/{stem}.txt")).unwrap();
        let events = parse_all_splits(&input, &["--profile", &profile_name]);
        let registry = profile(&profile_name);
        let tracked = tracked_payloads(&registry, &events);

        // The binary's payloads are the context-free form (until the payload
        // stage is wired to a CallTracker) or the tracked form.
        let mut i = 0;
        for e in events.iter().filter(|e| e["type"] == "element" && e["tag"] == profile_name.as_str()) {
            let el: Element = serde_json::from_value(e.clone()).unwrap();
            let free = match profile_name.as_str() {
                "tam" => spindle::calls::tam_payload(&el),
                "action" => spindle::calls::action_payload(&el),
                _ => spindle::calls::attp_payload(&el),
            };
            assert!(e["payload"] == free.value || e["payload"] == tracked[i], "{stem}: element {i}");
            i += 1;
        }
        assert_eq!(i, tracked.len());

        let expected_path = format!("corpora/expected/{stem}.expected.json");
        let got = Value::Array(tracked);
        if bless {
            std::fs::write(&expected_path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
            continue;
        }
        let want: Value = serde_json::from_str(
            &std::fs::read_to_string(&expected_path).unwrap_or_else(|_| panic!("missing {expected_path}")),
        )
        .unwrap();
        assert_eq!(got, want, "{stem}: payloads differ from {expected_path}");
    }
}

/// A call's payload is written by moving the call into a value, not by
/// serde: its text (keys in order) must be the serde text of the call it
/// reads back as, on every call of the corpora.
#[test]
fn call_payloads_are_the_serde_form_of_their_calls() {
    let mut checked = 0;
    for (stem, profile_name) in corpora() {
        let input = std::fs::read(format!("corpora/{stem}.txt")).unwrap();
        for event in spindle::parse(profile(&profile_name), &input) {
            let Some(el) = event.as_element().filter(|el| &*el.tag == profile_name.as_str()) else { continue };
            let call: spindle::ToolCall = serde_json::from_value(el.payload.clone()).unwrap();
            let text = serde_json::to_string(&el.payload).unwrap();
            assert_eq!(text, serde_json::to_string(&call).unwrap(), "{stem}: element {}", el.id);
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} calls checked");
}

/// In-process: every corpus at chunk sizes 2 to 13 gives the payloads of
/// the whole input (the binary runs above cover 1, 7 and whole).
#[test]
fn corpora_payloads_do_not_depend_on_chunk_size() {
    for (stem, profile_name) in corpora() {
        let input = std::fs::read(format!("corpora/{stem}.txt")).unwrap();
        let whole: Vec<Value> = spindle::parse(profile(&profile_name), &input)
            .iter()
            .filter_map(|e| e.as_element())
            .map(|e| e.payload.clone())
            .collect();
        for size in 2..=13 {
            let mut parser = spindle::Parser::new(profile(&profile_name));
            let mut events = Vec::new();
            for chunk in input.chunks(size) {
                events.extend(parser.feed(chunk));
            }
            events.extend(parser.finish());
            let got: Vec<Value> = events.iter().filter_map(|e| e.as_element()).map(|e| e.payload.clone()).collect();
            assert_eq!(got, whole, "{stem} at chunk size {size}");
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64).min(64)
    ))]
    /// Random split points through any corpus give the whole input's
    /// element payloads.
    #[test]
    fn corpora_random_splits(which in 0usize..1000, cuts in proptest::collection::vec(0usize..2000, 1..12)) {
        let list = corpora();
        let (stem, profile_name) = &list[which % list.len()];
        let input = std::fs::read(format!("corpora/{stem}.txt")).unwrap();
        let whole: Vec<Value> = spindle::parse(profile(profile_name), &input)
            .iter().filter_map(|e| e.as_element()).map(|e| e.payload.clone()).collect();
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut parser = spindle::Parser::new(profile(profile_name));
        let mut events = Vec::new();
        let mut last = 0;
        for c in cuts {
            events.extend(parser.feed(&input[last..c]));
            last = c;
        }
        events.extend(parser.feed(&input[last..]));
        events.extend(parser.finish());
        let got: Vec<Value> = events.iter().filter_map(|e| e.as_element()).map(|e| e.payload.clone()).collect();
        proptest::prop_assert_eq!(got, whole);
    }
}

#[test]
fn tracker_bounds_the_response_text() {
    let registry = profile("action");
    let text = format!("{}\n<ACTION><T><a>1</a></T></ACTION>", "word ".repeat(100));
    let events = spindle::parse(registry.clone(), text.as_bytes());
    let mut tracker = spindle::calls::CallTracker::with_text_limit(std::sync::Arc::new(registry), 40);
    let mut got = Vec::new();
    for e in &events {
        tracker.observe(e);
        if let Some(p) = e.as_element().and_then(|el| tracker.payload(el)) {
            got.push(p.value);
        }
    }
    let rt = got[0]["response_text"].as_str().unwrap();
    assert!(rt.len() <= 40 && rt.ends_with("word word"), "{rt:?}");
    assert_eq!(warnings(&got[0]), ["response_text_truncated"]);
}
