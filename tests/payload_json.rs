//! The lenient JSON reader: against `jsonrepair-rs` as an oracle for the
//! values, and against a sloppy printer (a property test) for the values
//! *and* the exact leniencies reported.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use spindle::payload::json::{Leniency, parse};
use std::collections::BTreeSet;

/// Sloppy JSON that `jsonrepair-rs` and our reader must read the same way.
const ORACLE_CASES: &[&str] = &[
    "{name: 'Alice', active: True, skills: ['Rust',],}",
    "```json\n{\"a\": 1, \"b\": [1, 2, 3,]}\n```",
    "[1, 2, 3,]",
    "{\"a\": 1, // comment\n \"b\": 2}",
    "{\"a\": /* block */ 1}",
    "{'single': 'quotes', 'nested': {'x': None}}",
    "[True, False, None]",
    "{\"truncated\": [1, 2, {\"x\": \"y\"",
    "{\"a\": \"cut off",
    "[[\"SET\", \"纯田真奈.好感度\", 2], [\"ADD\", \"mood.value\", 1],]",
    "{unquoted_key: 1, another-key: 2}",
    "{\"view\": \"w.x\", \"props\": {\"columns\": 3, \"filter\": 'magic',},}",
    "{\"a\": [1, 2}",
    "{\"emoji\": '😀', \"cjk\": '中文'}",
    "[1 2 3]",
    "{\"a\": 1 \"b\": 2}",
    "{\"n\": -0.5e3, \"m\": 1E2}",
];

#[test]
fn agrees_with_jsonrepair_rs() {
    for text in ORACLE_CASES {
        let ours = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}")).value;
        let repaired = jsonrepair_rs::jsonrepair(text).unwrap_or_else(|e| panic!("oracle failed on {text:?}: {e}"));
        let oracle: Value =
            serde_json::from_str(&repaired).unwrap_or_else(|e| panic!("oracle output {repaired:?}: {e}"));
        assert_eq!(ours, oracle, "{text:?} (oracle repaired it to {repaired})");
    }
}

#[test]
fn strict_json_is_read_strictly() {
    for text in ["{}", "[]", "{\"a\": [1, 2.5, -3, \"x\\n\\u00e9\", true, false, null]}", "  \"str\"  ", "42"] {
        let read = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(read.is_strict(), "{text:?}: {:?}", read.leniencies);
        assert_eq!(read.value, serde_json::from_str::<Value>(text).unwrap_or_default());
    }
}

#[test]
fn each_leniency_alone() {
    use Leniency::*;
    let table: &[(&str, Value, Leniency)] = &[
        ("```json\n[1]\n```", json!([1]), CodeFence),
        ("The update:\n[1]", json!([1]), SurroundingProse),
        ("[1] // done", json!([1]), Comment),
        ("[1,]", json!([1]), TrailingComma),
        ("[1 2]", json!([1, 2]), MissingComma),
        ("['a']", json!(["a"]), SingleQuotes),
        ("[\u{201c}a\u{201d}]", json!(["a"]), SmartQuotes),
        ("{a: 1}", json!({"a": 1}), UnquotedKey),
        ("{\"a\": widget.grid}", json!({"a": "widget.grid"}), UnquotedString),
        ("[None]", json!([null]), PythonLiteral),
        ("[undefined]", json!([null]), JsLiteral),
        ("[+1]", json!([1]), NumberFormat),
        ("[\"a\tb\"]", json!(["a\tb"]), ControlCharacter),
        ("[\"\\x\"]", json!(["x"]), InvalidEscape),
        ("[\"say \"hi\" now\"]", json!(["say \"hi\" now"]), UnescapedQuote),
        ("[1\u{ff0c}2]", json!([1, 2]), FullwidthPunctuation),
        ("[1}", json!([1]), MismatchedBracket),
        ("[1, [2", json!([1, [2]]), Truncated),
    ];
    for (text, want, kind) in table {
        let read = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(&read.value, want, "{text:?}");
        let kinds: Vec<Leniency> = read.leniencies.iter().map(|u| u.kind).collect();
        assert_eq!(kinds, [*kind], "{text:?}");
        assert!(read.leniencies[0].at <= text.len());
    }
}

#[test]
fn errors_say_where() {
    for (text, at_most) in [("{\"a\" 1}", 5), ("{:}", 1), ("[1, (2)]", 4), ("{\"a\": <b>}", 6), ("", 0)] {
        let e = parse(text).expect_err(text);
        assert!(e.at <= at_most, "{text:?}: {e}");
        assert!(!e.to_string().is_empty());
    }
}

// ----- property test: a sloppy printer and the leniencies it used -------

/// Leniencies a printer may use.
#[derive(Debug, Clone, Copy)]
struct Sloppy {
    fence: bool,
    comment: bool,
    trailing: bool,
    single: bool,
    unquoted: bool,
    python: bool,
}

fn is_ident(k: &str) -> bool {
    k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn print(v: &Value, s: Sloppy, used: &mut BTreeSet<Leniency>, out: &mut String) {
    match v {
        Value::Null if s.python => {
            used.insert(Leniency::PythonLiteral);
            out.push_str("None");
        }
        Value::Bool(b) if s.python => {
            used.insert(Leniency::PythonLiteral);
            out.push_str(if *b { "True" } else { "False" });
        }
        Value::String(st) if s.single => {
            used.insert(Leniency::SingleQuotes);
            out.push('\'');
            for c in st.chars() {
                match c {
                    '\'' => out.push_str("\\'"),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                print(item, s, used, out);
            }
            if s.trailing && !items.is_empty() {
                used.insert(Leniency::TrailingComma);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if s.unquoted && is_ident(k) && !matches!(k.as_str(), "true" | "false" | "null") {
                    used.insert(Leniency::UnquotedKey);
                    out.push_str(k);
                } else {
                    print(&Value::String(k.clone()), s, used, out);
                }
                out.push_str(": ");
                print(item, s, used, out);
            }
            if s.trailing && !map.is_empty() {
                used.insert(Leniency::TrailingComma);
                out.push(',');
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        (-1.0e6f64..1.0e6).prop_map(|f| json!(f)),
        "[a-zA-Z0-9 '\"\\\\\n中文é😀._-]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec(("[a-z_][a-z0-9_]{0,6}|[a-z ]{1,5}|好感度", inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

fn container() -> impl Strategy<Value = Value> {
    value().prop_map(|v| if v.is_array() || v.is_object() { v } else { json!([v]) })
}

proptest! {
    #[test]
    fn sloppy_printing_reads_back_with_exact_leniencies(
        v in container(),
        fence in any::<bool>(),
        comment in any::<bool>(),
        trailing in any::<bool>(),
        single in any::<bool>(),
        unquoted in any::<bool>(),
        python in any::<bool>(),
    ) {
        let s = Sloppy { fence, comment, trailing, single, unquoted, python };
        let mut used = BTreeSet::new();
        let mut body = String::new();
        print(&v, s, &mut used, &mut body);
        if s.comment {
            used.insert(Leniency::Comment);
            body = format!("// the state\n{body}\n/* end */");
        }
        if s.fence {
            used.insert(Leniency::CodeFence);
            body = format!("```json\n{body}\n```");
        }
        // Strict JSON is read strictly, whatever the flags said.
        if serde_json::from_str::<Value>(&body).is_ok() {
            used.clear();
        }
        let read = parse(&body).map_err(|e| TestCaseError::fail(format!("{body}: {e}")))?;
        prop_assert_eq!(&read.value, &v, "{}", body);
        let kinds: BTreeSet<Leniency> = read.leniencies.iter().map(|u| u.kind).collect();
        prop_assert_eq!(kinds, used, "{}", body);
    }

    #[test]
    fn never_panics(text in "[\\[\\]{}:,\"'a-z0-9 \\\\/*#\n.+-]{0,64}") {
        let _ = parse(&text);
    }
}
