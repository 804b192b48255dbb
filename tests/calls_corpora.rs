//! The `corpora/{tam,action,attp}-*.txt` transcripts: each parsed by the
//! binary whole, byte by byte and 7 bytes at a time (the events must agree),
//! and its call payloads (with context, as a [`CallTracker`] builds them)
//! compared with `corpora/<name>.expected.json`.
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
    assert!(
        list.len() >= 30,
        "expected the tam/action/attp corpora, found {}",
        list.len()
    );
    for (stem, profile_name) in list {
        let input = std::fs::read_to_string(format!("corpora/{stem}.txt")).unwrap();
        let events = parse_all_splits(&input, &["--profile", &profile_name]);
        let registry = profile(&profile_name);
        let tracked = tracked_payloads(&registry, &events);

        // The binary's payloads are the context-free form (until the payload
        // stage is wired to a CallTracker) or the tracked form.
        let mut i = 0;
        for e in events
            .iter()
            .filter(|e| e["type"] == "element" && e["tag"] == profile_name.as_str())
        {
            let el: Element = serde_json::from_value(e.clone()).unwrap();
            let free = match profile_name.as_str() {
                "tam" => spindle::calls::tam_payload(&el),
                "action" => spindle::calls::action_payload(&el),
                _ => spindle::calls::attp_payload(&el),
            };
            assert!(
                e["payload"] == free.value || e["payload"] == tracked[i],
                "{stem}: element {i}"
            );
            i += 1;
        }
        assert_eq!(i, tracked.len());

        let expected_path = format!("corpora/{stem}.expected.json");
        let got = Value::Array(tracked);
        if bless {
            std::fs::write(
                &expected_path,
                serde_json::to_string_pretty(&got).unwrap() + "\n",
            )
            .unwrap();
            continue;
        }
        let want: Value = serde_json::from_str(
            &std::fs::read_to_string(&expected_path)
                .unwrap_or_else(|_| panic!("missing {expected_path}")),
        )
        .unwrap();
        assert_eq!(got, want, "{stem}: payloads differ from {expected_path}");
    }
}
