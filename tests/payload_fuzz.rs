//! No input panics the payload stage, the lenient JSON reader, paths or
//! `apply`; payloads do not depend on chunking; filtered HTML stays inside
//! the allowlist whatever the input.

use proptest::prelude::*;
use serde_json::Value;
use spindle::check::filtered_html_problem;
use spindle::event::Event;
use spindle::state::{Op, OpCode, Path, apply};
use spindle::{CodeMarkup, Parser, Registry};

const TAGS: &[&str] = &[
    "content",
    "variable_update",
    "UpdateVariable",
    "tool_call",
    "ui_component",
    "media",
    "choice",
    "xx",
    "details",
    "status_bar",
    "thought",
];

/// Text biased towards the characters every reader cares about.
fn body() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(vec![
                "<", ">", "/", "\"", "'", "&", ";", "#", "[", "]", "{", "}", ",", ":", "=", "(", ")", "\\", "\n", " ",
                "_.set(", "`", "```", "<!--", "-->", "<analysis>", "</analysis>", "<b>", "<script>", "SET", "on", "url(",
                "\u{201c}", "\u{ff0c}", "\u{ff1a}", "True", "None", "//", "/*", "*/", "&#", "x;",
            ])
            .prop_map(str::to_string),
            1 => any::<char>().prop_map(|c| c.to_string()),
            1 => "[a-z0-9.]{1,6}",
        ],
        0..48,
    )
    .prop_map(|v| v.concat())
}

fn parse(input: &[u8], chunk: usize) -> Vec<Event> {
    let mut parser = Parser::new(Registry::filament());
    let mut out = Vec::new();
    for c in input.chunks(chunk.max(1)) {
        out.extend(parser.feed(c));
    }
    out.extend(parser.finish());
    out
}

fn payloads(events: &[Event]) -> Vec<Value> {
    events.iter().filter_map(Event::as_element).map(|e| e.payload.clone()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(ProptestConfig::default().cases.min(128)))]

    #[test]
    fn any_body_in_any_tag(tag in prop::sample::select(TAGS), text in body(), attrs in "( [a-z]{1,5}=\"[^\"]{0,8}\"){0,2}") {
        let input = format!("<{tag}{attrs}>{text}</{tag}>");
        let whole = parse(input.as_bytes(), usize::MAX);
        for chunk in [1, 7] {
            prop_assert_eq!(payloads(&parse(input.as_bytes(), chunk)), payloads(&whole), "{}", input);
        }
        for el in whole.iter().filter_map(Event::as_element) {
            if let Some(html) = el.payload.get("html").and_then(Value::as_str) {
                let problem = filtered_html_problem(html, CodeMarkup::Inert);
                prop_assert!(problem.is_none(), "{}: {}", problem.unwrap_or_default(), html);
            }
        }
    }

    /// With code shown as written, the filter's output is safe outside
    /// code, the same at every split, and its own fixed point.
    #[test]
    fn code_as_written_is_safe_outside_code(text in body(), chunk in 1usize..17) {
        let checked = spindle::check::code_as_written(&text, chunk);
        prop_assert!(checked.is_ok(), "{}", checked.unwrap_err());
    }

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let whole = parse(&bytes, usize::MAX);
        prop_assert_eq!(payloads(&parse(&bytes, 1)), payloads(&whole));
    }

    #[test]
    fn lenient_json_and_paths_never_panic(text in body()) {
        let _ = spindle::payload::json::parse(&text);
        let _ = spindle::payload::json::parse_values(&text);
        let _ = Path::parse(&text);
        let _ = spindle::payload::html::sanitize(&text);
    }

    #[test]
    fn apply_never_panics(
        paths in prop::collection::vec("[a-c]{1,2}(\\.[a-c0-9]{1,2}|\\[-?[0-9]\\]){0,3}", 1..12),
        codes in prop::collection::vec(0usize..8, 1..12),
        values in prop::collection::vec(prop_oneof![Just(Value::Null), any::<i8>().prop_map(Value::from), Just(Value::from(0.5)), Just(serde_json::json!([1])), Just(serde_json::json!({"a": 1})), Just(Value::from("s"))], 1..12),
    ) {
        let mut state = serde_json::json!({"a": {"b": [1, 2, {"c": 3}]}, "b": 4, "c": "text"});
        let ops: Vec<Op> = paths
            .iter()
            .zip(codes.iter().cycle())
            .zip(values.iter().cycle())
            .map(|((p, &c), v)| {
                let code = OpCode::ALL[c % OpCode::ALL.len()];
                let value = code.takes_value().then(|| if code.is_arithmetic() { Value::from(2) } else { v.clone() });
                Op::new(code, p, value)
            })
            .collect();
        let outcomes = apply(&mut state, &ops);
        prop_assert_eq!(outcomes.len(), ops.len());
        // A failed op leaves the state as it was: replaying only the
        // successful ones on a fresh copy gives the same state.
        let ok: Vec<Op> = outcomes.iter().filter(|o| o.is_ok()).map(|o| o.op.clone()).collect();
        let mut replay = serde_json::json!({"a": {"b": [1, 2, {"c": 3}]}, "b": 4, "c": "text"});
        let again = apply(&mut replay, &ok);
        prop_assert!(again.iter().all(|o| o.is_ok()));
        prop_assert_eq!(replay, state);
    }
}
