//! Payloads on demand (`ParserOptions::payloads = Payloads::OnDemand`):
//! the payloads that depend on the element alone are left `null` and built
//! with `build_deferred`, which gives the payload and the events that would
//! have followed the element, exactly as the eager stream has them (on
//! every transcript of `corpora/`: `tests/corpus.rs`).

use serde_json::json;
use spindle::event::{DiagnosticCode, Event, RepairKind};
use spindle::payload::{Payloads, build_deferred};
use spindle::{Parser, ParserOptions, Registry};
use std::sync::Arc;

fn parse(registry: &Arc<Registry>, input: &[u8], payloads: Payloads) -> Vec<Event> {
    let options = ParserOptions { payloads, ..ParserOptions::default() };
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut events = parser.feed(input);
    events.extend(parser.finish());
    events
}

fn element<'e>(events: &'e [Event], tag: &str) -> &'e spindle::Element {
    events
        .iter()
        .filter_map(Event::as_element)
        .find(|e| &*e.tag == tag)
        .unwrap_or_else(|| panic!("no <{tag}> element in {events:?}"))
}

#[test]
fn structured_payloads_wait_and_their_events_come_with_them() {
    let registry = Arc::new(Registry::filament());
    let input = b"<content>Hi <b>you</b></content>\n<status_bar><hp>41/60</hp><mood>calm</mood></status_bar>\n\
<variable_update>[[\"ADD\", \"hp\", 5],]</variable_update>\n<ui_component>{not json</ui_component>";
    let eager = parse(&registry, input, Payloads::Eager);
    let lazy = parse(&registry, input, Payloads::OnDemand);

    // Content is filtered as it streams: its payload is there either way.
    assert_eq!(element(&lazy, "content").payload["html"], "Hi <b>you</b>");
    assert!(build_deferred(&registry, element(&lazy, "content")).is_none());

    // The structured ones are null, and nothing about their payloads is in
    // the stream.
    for tag in ["status_bar", "variable_update", "ui_component"] {
        let el = element(&lazy, tag);
        assert!(el.payload.is_null(), "<{tag}> has a payload on demand");
        let about = |events: &[Event]| {
            events
                .iter()
                .filter(|e| match e {
                    Event::Diagnostic(d) => d.element == Some(el.id),
                    Event::Repair(r) => r.element == Some(el.id) && r.kind == RepairKind::FallbackToContent,
                    _ => false,
                })
                .count()
        };
        assert_eq!(about(&lazy), 0, "<{tag}>: payload events in the stream on demand");
        let built = build_deferred(&registry, el).unwrap_or_else(|| panic!("<{tag}> is deferred"));
        assert_eq!(built.value, element(&eager, tag).payload, "<{tag}>");
        assert_eq!(built.events.len(), about(&eager), "<{tag}>");
    }
    assert_eq!(
        build_deferred(&registry, element(&lazy, "status_bar")).map(|b| b.value),
        Some(json!({"hp": "41/60", "mood": "calm"}))
    );

    // The lenient read of the ops is reported when the payload is built.
    let ops = build_deferred(&registry, element(&lazy, "variable_update")).expect("deferred");
    assert_eq!(ops.value["ops"], json!([["ADD", "hp", 5]]));
    assert!(
        ops.events.iter().any(|e| matches!(e, Event::Diagnostic(d) if d.code.as_str().starts_with("json_"))),
        "{:?}",
        ops.events
    );

    // A body that cannot be read falls back to content: the repair comes
    // first, then the error, both naming the element.
    let ui = element(&lazy, "ui_component");
    let broken = build_deferred(&registry, ui).expect("deferred");
    assert!(broken.value.get("error").is_some(), "{}", broken.value);
    assert!(
        matches!(&broken.events[0], Event::Repair(r) if r.kind == RepairKind::FallbackToContent && r.element == Some(ui.id))
    );
    assert!(broken.events.iter().any(
        |e| matches!(e, Event::Diagnostic(d) if d.code == DiagnosticCode::PayloadUnparsable && d.element == Some(ui.id) && d.tag.as_deref() == Some("ui_component"))
    ));
}

#[test]
fn calls_and_thoughts_are_never_deferred() {
    let registry = Arc::new(Registry::filament());
    let input =
        br#"<thought>plan</thought><tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>"#;
    let lazy = parse(&registry, input, Payloads::OnDemand);
    let call = element(&lazy, "tool_call");
    assert_eq!(call.payload["name"], "get_weather");
    assert!(lazy.iter().any(|e| matches!(e, Event::CallDelta(_))), "{lazy:?}");
    assert!(build_deferred(&registry, call).is_none());
    assert!(build_deferred(&registry, element(&lazy, "thought")).is_none());
    let tam = Arc::new(Registry::profile("tam").expect("tam profile"));
    let input =
        "<tool_call>\n{\"tool_id\": \"File.Read\", \"params\": {\"path\": \"/tmp/a\"}}\n</tool_call>".as_bytes();
    let eager = parse(&tam, input, Payloads::Eager);
    let lazy = parse(&tam, input, Payloads::OnDemand);
    assert_eq!(
        serde_json::to_string(&eager).ok(),
        serde_json::to_string(&lazy).ok(),
        "a TAM call is built as it completes"
    );
}
