//! The `corpora/payload-*.txt` transcripts against their
//! `payload-*.expected.json`: every element's tag, payload and diagnostic
//! codes, at chunk sizes whole, 1 and 7.
//!
//! To update an expectation after an intended change, regenerate it with
//! `spindle parse corpora/payload-X.txt --format jsonl` and review the diff.

use serde_json::{Value, json};
use spindle::event::{Event, RepairKind};
use spindle::{Parser, Registry};
use std::path::Path;

fn actual(input: &[u8], chunk: usize) -> Value {
    let mut parser = Parser::new(Registry::filament());
    let mut events = Vec::new();
    for c in input.chunks(chunk.max(1)) {
        events.extend(parser.feed(c));
    }
    events.extend(parser.finish());
    let mut out = Vec::new();
    for el in events.iter().filter_map(Event::as_element) {
        let codes: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                Event::Diagnostic(d) if d.element == Some(el.id) => Some(d.code.to_string()),
                Event::Repair(r) if r.element == Some(el.id) && r.kind == RepairKind::FallbackToContent => {
                    Some(format!("repair:{}", r.kind.as_str()))
                }
                _ => None,
            })
            .collect();
        out.push(json!({"id": el.id, "tag": &*el.tag, "payload": el.payload, "codes": codes}));
    }
    Value::Array(out)
}

#[test]
fn corpora_match_their_expectations() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("corpora dir") {
        let path = entry.expect("dir entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !(name.starts_with("payload-") && name.ends_with(".txt")) {
            continue;
        }
        let expected_path =
            path.with_file_name("expected").join(format!("{}.expected.json", name.trim_end_matches(".txt")));
        let expected: Value = serde_json::from_str(&std::fs::read_to_string(&expected_path).expect("expected file"))
            .expect("expected JSON");
        let input = std::fs::read(&path).expect("transcript");
        for chunk in [usize::MAX, 1, 7] {
            assert_eq!(actual(&input, chunk), expected, "{name} at chunk size {chunk}");
        }
        checked += 1;
    }
    assert!(checked >= 4, "only {checked} corpora found");
}
