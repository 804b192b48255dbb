//! Tool calls streamed while they arrive (`call_delta` events): for
//! generated Hermes/Qwen `<tool_call>` bodies, in every profile that reads
//! them and at any split, the name comes first and once, and the joined
//! argument fragments are strict JSON equal to the element's payload.
//!
//! Raise the case count locally with `PROPTEST_CASES=10000`.

use proptest::prelude::*;
use serde_json::{Value, json};
use spindle::event::{Event, coalesce};
use spindle::{Parser, Registry};

fn run(registry: &Registry, chunks: &[&[u8]]) -> Vec<Event> {
    let mut p = Parser::new(registry.clone());
    let mut out = Vec::new();
    for c in chunks {
        out.extend(p.feed(c));
    }
    out.extend(p.finish());
    out
}

/// Per `tool_call` element: (name, joined arguments) from its call deltas,
/// and its payload.
fn calls(events: &[Event]) -> Vec<(Option<String>, String, Value)> {
    let mut out: Vec<(u32, Option<String>, String, Value)> = Vec::new();
    for e in events {
        match e {
            Event::CallDelta(d) => match out.iter_mut().find(|c| c.0 == d.id) {
                Some(c) => {
                    assert!(d.name.is_none(), "a second name for element {}", d.id);
                    c.2.push_str(&d.arguments);
                }
                None => {
                    assert!(d.name.is_some(), "arguments before the name for element {}", d.id);
                    out.push((d.id, d.name.clone(), d.arguments.clone(), Value::Null));
                }
            },
            Event::Element(el) if &*el.tag == "tool_call" => match out.iter_mut().find(|c| c.0 == el.id) {
                Some(c) => c.3 = el.payload.clone(),
                None => out.push((el.id, None, String::new(), el.payload.clone())),
            },
            _ => {}
        }
    }
    out.into_iter().map(|(_, n, a, p)| (n, a, p)).collect()
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        (-1000.0f64..1000.0).prop_map(|f| json!(f)),
        "[a-z \"\\\\/{}\\[\\],:é😀\n\t]{0,12}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn arguments() -> impl Strategy<Value = Value> {
    prop::collection::vec(("[a-z_]{1,8}", value()), 0..5).prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// One way a model writes the call.
#[derive(Debug, Clone)]
enum Shape {
    /// `{"name": …, "arguments": {…}}`, pretty or compact.
    Hermes { pretty: bool },
    /// `{"arguments": …, "name": …}`.
    ArgsFirst,
    /// `{"name": …, "arguments": "<json text>"}`.
    StringArgs,
    /// `{"name": …, "parameters": {…}}`.
    Parameters,
    /// `<tool_call name="…">{…}</tool_call>`.
    Attribute,
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        any::<bool>().prop_map(|pretty| Shape::Hermes { pretty }),
        Just(Shape::ArgsFirst),
        Just(Shape::StringArgs),
        Just(Shape::Parameters),
        Just(Shape::Attribute),
    ]
}

fn render(name: &str, args: &Value, shape: &Shape) -> String {
    let text = |v: &Value| serde_json::to_string(v).unwrap();
    match shape {
        Shape::Hermes { pretty: true } => {
            format!(
                "<tool_call>\n{}\n</tool_call>",
                serde_json::to_string_pretty(&json!({"name": name, "arguments": args})).unwrap()
            )
        }
        Shape::Hermes { pretty: false } => {
            format!("<tool_call>{}</tool_call>", text(&json!({"name": name, "arguments": args})))
        }
        Shape::ArgsFirst => {
            format!("<tool_call>{{\"arguments\": {}, \"name\": {}}}</tool_call>", text(args), text(&json!(name)))
        }
        Shape::StringArgs => {
            format!("<tool_call>{}</tool_call>", text(&json!({"name": name, "arguments": text(args)})))
        }
        Shape::Parameters => format!("<tool_call>{}</tool_call>", text(&json!({"name": name, "parameters": args}))),
        Shape::Attribute => {
            format!("<tool_call name=\"{name}\">\n{}\n</tool_call>", serde_json::to_string_pretty(args).unwrap())
        }
    }
}

fn chunks_at<'a>(input: &'a [u8], cuts: &[prop::sample::Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
    points.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for p in points {
        out.push(&input[last..p]);
        last = p;
    }
    out.push(&input[last..]);
    out
}

proptest! {
    #[test]
    fn streamed_calls_join_to_their_payload(
        calls_in in prop::collection::vec(("[a-z_][a-z_.]{0,12}", arguments(), shape()), 1..4),
        profile in prop::sample::select(vec!["chat", "reasoning", "reasoning-prefilled", "filament"]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..10),
    ) {
        let registry = Registry::profile(profile).unwrap();
        let lead = if profile == "filament" { "<content>On it.</content>\n" } else { "On it.\n" };
        let input = format!("{lead}{}", calls_in.iter().map(|(n, a, s)| render(n, a, s)).collect::<Vec<_>>().join("\n"));
        let whole = run(&registry, &[input.as_bytes()]);
        let bytes: Vec<&[u8]> = input.as_bytes().chunks(1).collect();
        prop_assert_eq!(coalesce(run(&registry, &bytes)), coalesce(whole.clone()), "byte by byte: {}", input);
        prop_assert_eq!(coalesce(run(&registry, &chunks_at(input.as_bytes(), &cuts))), coalesce(whole.clone()), "split: {}", input);
        let got = calls(&whole);
        prop_assert_eq!(got.len(), calls_in.len(), "{}", input);
        for ((name, args, payload), (want_name, want_args, _)) in got.iter().zip(&calls_in) {
            prop_assert_eq!(name.as_deref(), Some(want_name.as_str()), "{}", input);
            let joined: Value = serde_json::from_str(args).map_err(|e| TestCaseError::fail(format!("{e}: {args:?} in {input}")))?;
            prop_assert_eq!(&joined, want_args, "{}", input);
            prop_assert_eq!(&payload["arguments"], want_args, "{}", input);
        }
        let differ = whole.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code == "call_arguments_streamed_differ"));
        prop_assert!(!differ, "{}", input);
    }
}

/// The name goes out before the body ends, and argument fragments while it
/// streams: the first call delta arrives with the chunk that completes the
/// name, long before the element.
#[test]
fn name_and_arguments_arrive_before_the_element() {
    let mut p = Parser::new(Registry::chat());
    let mut seen = Vec::new();
    for chunk in
        ["<tool_call>{\"name\": \"get_", "weather\", \"arguments\": {\"city\"", ": \"Par", "is\"}}</tool_call>"]
    {
        let events = p.feed(chunk.as_bytes());
        let deltas: Vec<(Option<String>, String)> = events
            .iter()
            .filter_map(|e| match e {
                Event::CallDelta(d) => Some((d.name.clone(), d.arguments.clone())),
                _ => None,
            })
            .collect();
        seen.push(deltas);
    }
    assert_eq!(seen[0], []);
    assert_eq!(seen[1], [(Some("get_weather".to_string()), "{\"city\"".to_string())]);
    assert_eq!(seen[2], [(None, ": \"Par".to_string())]);
    assert_eq!(seen[3], [(None, "is\"}".to_string())]);
}
