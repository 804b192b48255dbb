//! The chat-completions stream model, one quirk per test, from small
//! hand-written chunk sequences.

use serde_json::{Value, json};
use spindle::event::Event;
use spindle::sources::{
    Channel, ChatStream, ErrorOrigin, FinishReason, Framing, LineTap, SourceEvent, StreamOptions, StreamTap, Truncation,
};
use spindle::{Parser, ParserOptions, Registry};
use std::sync::Arc;

/// Pushes data payloads (one SSE event each) and finishes.
fn run_with(options: StreamOptions, datas: &[&str]) -> Vec<SourceEvent> {
    let mut stream = ChatStream::new(options);
    let mut out = Vec::new();
    for d in datas {
        stream.push_data("message", d, 0, &mut out);
    }
    stream.finish_into(&mut out);
    out
}

fn run(datas: &[&str]) -> Vec<SourceEvent> {
    run_with(StreamOptions::default(), datas)
}

/// Feeds a raw SSE body through a tap.
fn sse(body: &str) -> Vec<SourceEvent> {
    let mut tap = StreamTap::new(StreamOptions::default());
    let mut out = tap.feed(body.as_bytes());
    tap.finish_into(&mut out);
    out
}

/// (choice, channel, tag, text) of every element.
fn elements(events: &[SourceEvent]) -> Vec<(u32, Channel, String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Choice(c) => {
                c.event.as_element().map(|el| (c.choice, c.channel, el.tag.to_string(), el.text.clone()))
            }
            _ => None,
        })
        .collect()
}

fn payloads(events: &[SourceEvent], tag: &str) -> Vec<Value> {
    events
        .iter()
        .filter_map(SourceEvent::as_element)
        .filter(|el| &*el.tag == tag)
        .map(|el| el.payload.clone())
        .collect()
}

fn diagnostics(events: &[SourceEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Diagnostic(d) => Some(d.code.to_string()),
            SourceEvent::Choice(c) => match &c.event {
                Event::Diagnostic(d) => Some(d.code.to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn truncations(events: &[SourceEvent]) -> Vec<(Option<u32>, Truncation)> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Truncated { choice, why } => Some((*choice, *why)),
            _ => None,
        })
        .collect()
}

fn finishes(events: &[SourceEvent]) -> Vec<(u32, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Finish { choice, reason } => Some((*choice, reason.as_str().to_string())),
            _ => None,
        })
        .collect()
}

fn chunk(choice: u32, delta: Value) -> String {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": choice, "delta": delta, "finish_reason": null}]})
        .to_string()
}

fn finish(choice: u32, reason: &str) -> String {
    json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": choice, "delta": {}, "finish_reason": reason}]})
        .to_string()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn plain_content_is_one_content_element() {
    let data = [
        chunk(0, json!({"role": "assistant", "content": ""})),
        chunk(0, json!({"content": "Hello"})),
        chunk(0, json!({"content": " world"})),
        finish(0, "stop"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Hello world".into())]);
    assert_eq!(finishes(&events), [(0, "stop".into())]);
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Done)));
    assert!(truncations(&events).is_empty());
}

#[test]
fn choices_interleave_and_index_one_may_come_first() {
    let data = [
        chunk(1, json!({"content": "B1"})),
        chunk(0, json!({"content": "A1"})),
        chunk(1, json!({"content": "B2"})),
        chunk(2, json!({"content": "C"})),
        chunk(0, json!({"content": "A2"})),
        finish(1, "stop"),
        finish(0, "length"),
        finish(2, "stop"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    let mut got = elements(&events);
    got.sort_by_key(|e| e.0);
    assert_eq!(
        got,
        [
            (0, Channel::Content, "content".into(), "A1A2".into()),
            (1, Channel::Content, "content".into(), "B1B2".into()),
            (2, Channel::Content, "content".into(), "C".into()),
        ]
    );
    assert_eq!(finishes(&events), [(1, "stop".into()), (0, "length".into()), (2, "stop".into())]);
    // Every choice event carries its choice; choice 1's element comes when
    // choice 1 finishes, before choice 0's.
    let order: Vec<u32> = events.iter().filter(|e| e.as_element().is_some()).filter_map(SourceEvent::choice).collect();
    assert_eq!(order, [1, 0, 2]);
}

#[test]
fn reasoning_content_becomes_a_thought_element() {
    let data = [
        chunk(0, json!({"reasoning_content": "Let me", "content": null})),
        chunk(0, json!({"reasoning_content": " think."})),
        chunk(0, json!({"content": "42"})),
        finish(0, "stop"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Let me think.".into()),
            (0, Channel::Content, "content".into(), "42".into()),
        ]
    );
    // Thought deltas stream, and ids are unique within the choice.
    let ids: Vec<(u32, String)> =
        events.iter().filter_map(|e| e.as_element().map(|el| (el.id, el.raw_tag.to_string()))).collect();
    assert_eq!(ids[0], (0, "reasoning_content".into()));
    assert_eq!(ids[1].0, 1);
    let thought_deltas: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Choice(c) if c.channel == Channel::Reasoning => match &c.event {
                Event::Delta(d) if &*d.tag == "thought" => Some(d.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(thought_deltas, ["Let me", " think."]);
}

#[test]
fn reasoning_field_and_duplicate_fields() {
    let data = [
        chunk(0, json!({"reasoning": "a", "reasoning_details": [{"type": "reasoning.text", "text": "a"}]})),
        // Some servers send both fields with the same text: read once.
        chunk(0, json!({"reasoning": "b", "reasoning_content": "b"})),
        chunk(0, json!({"content": "x"})),
        finish(0, "stop"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(elements(&events)[0], (0, Channel::Reasoning, "thought".into(), "ab".into()));
}

#[test]
fn think_tags_in_content_with_escaped_angle_brackets() {
    let data = [
        r#"{"choices":[{"index":0,"delta":{"content":"\u003cthink\u003e\nhm"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":"m\n\u003c/think\u003e\n\nThe answer"}}]}"#,
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        "[DONE]",
    ];
    let events = run(&data);
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Content, "thought".into(), "\nhmm\n".into()),
            (0, Channel::Content, "content".into(), "The answer".into()),
        ]
    );
}

#[test]
fn openai_parallel_tool_calls_complete_when_the_next_index_starts() {
    let data = [
        chunk(
            0,
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
        ),
        chunk(0, json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]})),
        chunk(0, json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]})),
        chunk(
            0,
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": ""}}]}),
        ),
        chunk(0, json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]})),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ];
    let mut stream = ChatStream::new(StreamOptions::default());
    let mut before_second = Vec::new();
    for d in &data[..3] {
        stream.push_data("message", d, 0, &mut before_second);
    }
    assert!(payloads(&before_second, "tool_call").is_empty(), "call 0 may still grow");
    let mut at_second = Vec::new();
    stream.push_data("message", &data[3], 0, &mut at_second);
    assert_eq!(
        payloads(&at_second, "tool_call"),
        [json!({"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris"}, "index": 0})],
        "call 0 is complete the moment call 1 starts"
    );
    let mut rest = Vec::new();
    for d in &data[4..] {
        stream.push_data("message", d, 0, &mut rest);
    }
    stream.finish_into(&mut rest);
    assert_eq!(
        payloads(&rest, "tool_call"),
        [json!({"id": "call_b", "name": "get_time", "arguments": {}, "index": 1})]
    );
    let el = rest.iter().find_map(SourceEvent::as_element).map(|e| e.text.clone());
    assert_eq!(el.as_deref(), Some("{}"), "raw argument text is the element text");
}

#[test]
fn tool_call_id_repeated_on_every_fragment() {
    // OpenRouter/Novita kimi-k2: the id and name come again with the args.
    let data = [
        chunk(
            0,
            json!({"content": null, "tool_calls": [{"index": 0, "id": "0", "type": "function", "function": {"name": "llm_version", "arguments": ""}}]}),
        ),
        chunk(
            0,
            json!({"content": null, "tool_calls": [{"index": 0, "id": "0", "type": "function", "function": {"name": "llm_version", "arguments": "{}"}}]}),
        ),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(
        payloads(&events, "tool_call"),
        [json!({"id": "0", "name": "llm_version", "arguments": {}, "index": 0})]
    );
}

#[test]
fn repeated_whole_call_and_growing_snapshots() {
    let whole = json!({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{\"a\":1}"}}]});
    let events = run(&strs(&[chunk(0, whole.clone()), chunk(0, whole), finish(0, "tool_calls"), "[DONE]".into()]));
    assert_eq!(payloads(&events, "tool_call"), [json!({"id": "t1", "name": "f", "arguments": {"a": 1}, "index": 0})]);
    assert!(diagnostics(&events).contains(&"tool_call_repeated".to_string()));

    let snap = |args: &str| {
        chunk(0, json!({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": args}}]}))
    };
    let events = run(&strs(&[snap("{\"a\""), snap("{\"a\":1,"), snap("{\"a\":1,\"b\":2}"), "[DONE]".into()]));
    assert_eq!(
        payloads(&events, "tool_call"),
        [json!({"id": "t1", "name": "f", "arguments": {"a": 1, "b": 2}, "index": 0})]
    );
}

#[test]
fn calls_without_index_and_distinct_ids_in_one_delta() {
    // Mistral: no index, two calls in one delta.
    let data = [
        chunk(
            0,
            json!({"tool_calls": [
                {"id": "nq1", "function": {"name": "plus", "arguments": "{\"a\": 1, \"b\": 2}"}},
                {"id": "AT2", "function": {"name": "minus", "arguments": "{\"a\": 2, \"b\": 1}"}}
            ]}),
        ),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(
        payloads(&events, "tool_call"),
        [
            json!({"id": "nq1", "name": "plus", "arguments": {"a": 1, "b": 2}}),
            json!({"id": "AT2", "name": "minus", "arguments": {"a": 2, "b": 1}}),
        ]
    );
}

#[test]
fn all_calls_at_index_zero_with_distinct_ids() {
    let call = |id: &str, name: &str| {
        chunk(0, json!({"tool_calls": [{"index": 0, "id": id, "function": {"name": name, "arguments": "{}"}}]}))
    };
    let data = [call("x1", "a"), call("x2", "b"), call("x3", "c"), finish(0, "tool_calls"), "[DONE]".into()];
    let names: Vec<Value> = payloads(&run(&strs(&data)), "tool_call").iter().map(|p| p["name"].clone()).collect();
    assert_eq!(names, [json!("a"), json!("b"), json!("c")]);
}

#[test]
fn tool_call_arguments_null_object_invalid_and_cut() {
    // null arguments (muse-spark): {} with an info diagnostic.
    let events = run(&strs(&[
        chunk(0, json!({"tool_calls": [{"index": 0, "id": "0", "function": {"name": "v", "arguments": null}}]})),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ]));
    assert_eq!(payloads(&events, "tool_call")[0]["arguments"], json!({}));
    assert!(diagnostics(&events).contains(&"empty_arguments".to_string()));

    // Arguments as an object (some gateways).
    let events = run(&strs(&[
        chunk(0, json!({"tool_calls": [{"id": "o", "function": {"name": "v", "arguments": {"k": [1, 2]}}}]})),
        "[DONE]".into(),
    ]));
    assert_eq!(payloads(&events, "tool_call")[0]["arguments"], json!({"k": [1, 2]}));

    // Cut by finish_reason length: read leniently, and said so.
    let events = run(&strs(&[
        chunk(
            0,
            json!({"tool_calls": [{"index": 0, "id": "L", "function": {"name": "w", "arguments": "{\"city\": \"Par"}}]}),
        ),
        finish(0, "length"),
        "[DONE]".into(),
    ]));
    assert_eq!(payloads(&events, "tool_call")[0]["arguments"], json!({"city": "Par"}));
    assert!(diagnostics(&events).contains(&"arguments_repaired".to_string()));
    let text = events.iter().find_map(SourceEvent::as_element).map(|e| e.text.clone());
    assert_eq!(text.as_deref(), Some("{\"city\": \"Par"));
}

#[test]
fn legacy_function_call_delta() {
    let data = [
        chunk(0, json!({"function_call": {"name": "lookup", "arguments": ""}})),
        chunk(0, json!({"function_call": {"arguments": "{\"q\":"}})),
        chunk(0, json!({"function_call": {"arguments": "\"x\"}"}})),
        finish(0, "function_call"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(payloads(&events, "tool_call"), [json!({"id": null, "name": "lookup", "arguments": {"q": "x"}})]);
    assert_eq!(finishes(&events), [(0, "function_call".into())]);
}

#[test]
fn interleaved_parallel_tool_calls_assemble_by_index() {
    // index 0 name, index 1 name, index 0 arguments, index 1 arguments, in
    // pieces and out of order; ids only on each call's first fragment.
    let data = [
        chunk(
            0,
            json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
        ),
        chunk(
            0,
            json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": ""}}]}),
        ),
        chunk(0, json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]})),
        chunk(0, json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"tz\": "}}]})),
        chunk(
            0,
            json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"UTC\"}"}}, {"index": 0, "function": {"arguments": " \"Paris\"}"}}]}),
        ),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    let mut calls = payloads(&events, "tool_call");
    calls.sort_by_key(|c| c["index"].as_u64());
    assert_eq!(
        calls,
        [
            json!({"id": "call_a", "name": "get_weather", "arguments": {"city": "Paris"}, "index": 0}),
            json!({"id": "call_b", "name": "get_time", "arguments": {"tz": "UTC"}, "index": 1}),
        ]
    );
    assert!(!diagnostics(&events).contains(&"tool_call_fragment_after_complete".to_string()));
    // Three calls, fragments round-robin, one fragment each per chunk.
    let mut data = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        data.push(chunk(0, json!({"tool_calls": [{"index": i, "id": format!("id{i}"), "function": {"name": name}}]})));
    }
    for piece in ["{\"n\"", ": ", "1}"] {
        for i in 0..3 {
            data.push(chunk(0, json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})));
        }
    }
    data.push(finish(0, "tool_calls"));
    data.push("[DONE]".into());
    let events = run(&strs(&data));
    let names: Vec<(String, Value)> = payloads(&events, "tool_call")
        .iter()
        .map(|p| (p["name"].as_str().unwrap_or_default().to_string(), p["arguments"].clone()))
        .collect();
    assert_eq!(names, [("a".into(), json!({"n": 1})), ("b".into(), json!({"n": 1})), ("c".into(), json!({"n": 1}))]);
}

#[test]
fn late_fragment_after_its_call_completed_is_reported_not_lost() {
    // Call 0's arguments were whole when call 1 began, so it was complete;
    // a fragment for it after that starts a new element, reported.
    let data = [
        chunk(
            0,
            json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}),
        ),
        chunk(0, json!({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]})),
        chunk(0, json!({"tool_calls": [{"index": 0, "function": {"arguments": " "}}]})),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert!(diagnostics(&events).contains(&"tool_call_fragment_after_complete".to_string()));
    let texts: Vec<String> = events.iter().filter_map(SourceEvent::as_element).map(|e| e.text.clone()).collect();
    assert_eq!(texts, ["{\"x\": 1}", "{}", " "]);
}

#[test]
fn refusal_deltas_become_a_refusal_element() {
    let data = [
        chunk(0, json!({"role": "assistant", "content": null, "refusal": ""})),
        chunk(0, json!({"refusal": "I'm sorry,"})),
        chunk(0, json!({"refusal": " I can't."})),
        finish(0, "stop"),
        "[DONE]".into(),
    ];
    assert_eq!(elements(&run(&strs(&data))), [(0, Channel::Refusal, "refusal".into(), "I'm sorry, I can't.".into())]);
}

#[test]
fn unknown_finish_reasons_are_kept() {
    let events = run(&strs(&[chunk(0, json!({"content": "x"})), finish(0, "eos"), "[DONE]".into()]));
    let finish_event = events.iter().find(|e| matches!(e, SourceEvent::Finish { .. }));
    assert!(matches!(finish_event, Some(SourceEvent::Finish { reason: FinishReason::Other(r), .. }) if r == "eos"));
    let json = serde_json::to_value(finish_event).unwrap_or_default();
    assert_eq!(json, json!({"type": "finish", "choice": 0, "reason": "eos"}));
}

#[test]
fn usage_chunk_with_empty_null_or_absent_choices() {
    for choices in [json!([]), Value::Null] {
        let usage =
            json!({"id": "c", "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).to_string();
        let events = run(&strs(&[chunk(0, json!({"content": "x"})), finish(0, "stop"), usage, "[DONE]".into()]));
        let usages: Vec<&SourceEvent> = events.iter().filter(|e| matches!(e, SourceEvent::Usage { .. })).collect();
        assert_eq!(usages.len(), 1, "{choices}");
    }
    let absent = json!({"id": "c", "usage": {"total_tokens": 4}}).to_string();
    let events = run(&strs(&[absent.clone(), absent, "[DONE]".into()]));
    let usages: Vec<Value> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Usage { usage } => Some(usage.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(usages, [json!({"total_tokens": 4})], "an unchanged usage is reported once");
    // usage: null on every chunk is not usage.
    let events =
        run(&strs(&[json!({"choices": [{"index": 0, "delta": {"content": "a"}}], "usage": null}).to_string()]));
    assert!(!events.iter().any(|e| matches!(e, SourceEvent::Usage { .. })));
}

#[test]
fn azure_filter_results() {
    let quiet = json!({"choices": [], "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {"hate": {"filtered": false, "severity": "safe"}}}], "model": "", "object": "", "id": ""});
    let flagged = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter", "content_filter_results": {"violence": {"filtered": true, "severity": "medium"}}}]});
    let events =
        run(&strs(&[quiet.to_string(), chunk(0, json!({"content": "Once"})), flagged.to_string(), "[DONE]".into()]));
    let filters: Vec<Option<u32>> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::ContentFilter { choice, .. } => Some(*choice),
            _ => None,
        })
        .collect();
    assert_eq!(filters, [Some(0)], "only flagged results are events");
    assert_eq!(finishes(&events), [(0, "content_filter".into())]);
    assert!(diagnostics(&events).is_empty(), "{:?}", diagnostics(&events));

    let prompt_flagged = json!({"choices": [], "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {"jailbreak": {"filtered": true, "detected": true}}}]});
    let events = run(&strs(&[prompt_flagged.to_string(), "[DONE]".into()]));
    assert!(events.iter().any(|e| matches!(e, SourceEvent::ContentFilter { choice: None, .. })));
}

#[test]
fn in_band_errors() {
    // An error chunk (OpenRouter) after the finish.
    let err = json!({"id": "g", "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}], "error": {"code": 400, "message": "Token limit reached"}});
    let events = run(&strs(&[chunk(0, json!({"content": "partial"})), err.to_string(), "[DONE]".into()]));
    let errors: Vec<(ErrorOrigin, Value)> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::StreamError { origin, error, .. } => Some((*origin, error.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [(ErrorOrigin::InBand, json!({"code": 400, "message": "Token limit reached"}))]);
    assert_eq!(finishes(&events), [(0, "error".into())]);

    // `event: error` (Groq), the stream then ends without [DONE].
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\nevent: error\ndata: {\"error\":{\"message\":\"Tool call validation failed\",\"code\":\"tool_use_failed\"}}\n\n";
    let events = sse(body);
    assert!(events.iter().any(|e| matches!(e, SourceEvent::StreamError { origin: ErrorOrigin::ErrorEvent, error, .. } if error["code"] == "tool_use_failed")));
    assert_eq!(truncations(&events), [(Some(0), Truncation::NoDone)]);

    // A bare `{"error": ...}` data payload.
    let events = run(&[r#"{"error":{"message":"overloaded","type":"server_error"}}"#]);
    assert!(events.iter().any(|e| matches!(e, SourceEvent::StreamError { origin: ErrorOrigin::InBand, .. })));
    // No choice was ever seen: the truncation names none.
    assert_eq!(truncations(&events), [(None, Truncation::NoDone)]);
}

#[test]
fn done_missing_and_mid_json_truncation() {
    let events = run(&strs(&[chunk(0, json!({"content": "a"})), chunk(1, json!({"content": "b"}))]));
    assert_eq!(truncations(&events), [(Some(0), Truncation::NoDone), (Some(1), Truncation::NoDone)]);
    // Open elements are still closed and reported.
    assert_eq!(elements(&events).len(), 2);

    let body =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"del";
    let events = sse(body);
    assert_eq!(truncations(&events), [(Some(0), Truncation::MidJson)]);
    assert!(diagnostics(&events).contains(&"truncated_chunk".to_string()));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "a".into())]);
}

#[test]
fn done_without_trailing_blank_line_is_still_done() {
    let events = sse(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n",
    );
    assert!(truncations(&events).is_empty());
    assert!(diagnostics(&events).contains(&"sse_unterminated_event".to_string()));
}

#[test]
fn json_chunk_split_over_two_events_is_rejoined() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"con\n\ndata: tent\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
    let events = sse(body);
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Hi".into())]);
    assert!(diagnostics(&events).contains(&"chunk_rejoined".to_string()));
}

#[test]
fn invalid_json_chunk_is_reported_and_skipped() {
    let data = [
        chunk(0, json!({"content": "a"})),
        "{not json}".into(),
        "[1,2]".into(),
        chunk(0, json!({"content": "b"})),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    let d = diagnostics(&events);
    assert!(d.contains(&"invalid_chunk_json".to_string()), "{d:?}");
    assert!(d.contains(&"unexpected_chunk_shape".to_string()), "{d:?}");
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "ab".into())]);
}

#[test]
fn chunk_lines_framing_judges_by_finish_reason() {
    let options = StreamOptions { framing: Framing::Chunks, ..StreamOptions::default() };
    let events = run_with(options.clone(), &strs(&[chunk(0, json!({"content": "a"})), finish(0, "stop")]));
    assert!(truncations(&events).is_empty());
    let events = run_with(options, &strs(&[chunk(0, json!({"content": "a"}))]));
    assert_eq!(truncations(&events), [(Some(0), Truncation::NoFinishReason)]);
}

#[test]
fn content_after_finish_is_a_continuation() {
    let events = run(&strs(&[
        chunk(0, json!({"content": "a"})),
        finish(0, "stop"),
        chunk(0, json!({"content": "b"})),
        "[DONE]".into(),
    ]));
    assert!(diagnostics(&events).contains(&"data_after_finish".to_string()));
    let texts: Vec<String> = elements(&events).into_iter().map(|e| e.3).collect();
    assert_eq!(texts, ["a", "b"]);
}

#[test]
fn mistral_content_as_a_list_of_parts() {
    let data = [
        chunk(
            0,
            json!({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "Okay, the"}], "closed": true}]}),
        ),
        chunk(0, json!({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": " user"}]}]})),
        chunk(
            0,
            json!({"content": [{"type": "text", "text": "Answer"}, {"type": "image_url", "image_url": {"url": "x"}}]}),
        ),
        chunk(0, json!({"content": " here"})),
        finish(0, "stop"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Okay, the user".into()),
            (0, Channel::Content, "content".into(), "Answer here".into()),
        ]
    );
    assert!(diagnostics(&events).contains(&"unsupported_content_part".to_string()));
}

#[test]
fn non_streamed_response() {
    let response = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant",
            "reasoning_content": "Need the weather.",
            "content": "<think>also inline</think>Checking.",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Rome\"}"}}]
        }}],
        "usage": {"total_tokens": 9}
    });
    let options = StreamOptions { framing: Framing::Response, ..StreamOptions::default() };
    let events = run_with(options, &[&response.to_string()]);
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Need the weather.".into()),
            (0, Channel::Content, "thought".into(), "also inline".into()),
            (0, Channel::Content, "content".into(), "Checking.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"city\":\"Rome\"}".into()),
        ]
    );
    assert_eq!(finishes(&events), [(0, "tool_calls".into())]);
    assert!(truncations(&events).is_empty());
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Usage { .. })));
}

#[test]
fn anthropic_messages_stream() {
    let body = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Hmm.\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me check.\"}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"weather\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"Rome\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let events = sse(body);
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Hmm.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"city\": \"Rome\"}".into()),
            (0, Channel::Content, "content".into(), "Let me check.".into()),
        ]
    );
    // `tool_use` is Anthropic's word for `tool_calls`.
    assert_eq!(finishes(&events), [(0, "tool_calls".into())]);
    assert!(truncations(&events).is_empty(), "message_stop is a clean end");
    let last_usage = events.iter().rev().find_map(|e| match e {
        SourceEvent::Usage { usage } => Some(usage.clone()),
        _ => None,
    });
    assert_eq!(last_usage, Some(json!({"input_tokens": 5, "output_tokens": 9})));
}

#[test]
fn other_apis_words_for_a_finish_reason_read_as_the_chat_one() {
    for (word, reason) in [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("max_tokens", FinishReason::Length),
        ("max_output_tokens", FinishReason::Length),
        ("model_context_window_exceeded", FinishReason::Length),
        ("tool_use", FinishReason::ToolCalls),
        ("tool-calls", FinishReason::ToolCalls),
        ("refusal", FinishReason::ContentFilter),
        ("guardrail_intervened", FinishReason::ContentFilter),
        ("content-filter", FinishReason::ContentFilter),
    ] {
        assert_eq!(FinishReason::parse(word), reason, "{word}");
    }
    // An Anthropic stream cut by its token limit ends with `length`, as
    // a chat completion's would.
    let body = concat!(
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The answer is\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    assert_eq!(finishes(&sse(body)), [(0, "length".into())]);
}

/// A Gemini `streamGenerateContent?alt=sse` body: thought parts, text in
/// pieces, a function call, two candidates, `usageMetadata`, no `[DONE]`.
#[test]
fn gemini_stream() {
    let frames = [
        json!({"candidates": [{"index": 0, "content": {"role": "model", "parts": [{"text": "Weigh the", "thought": true}]}}]}),
        json!({"candidates": [{"index": 0, "content": {"role": "model", "parts": [{"text": " options.", "thought": true}]}},
                              {"index": 1, "content": {"role": "model", "parts": [{"text": "Second "}]}}]}),
        json!({"candidates": [{"index": 0, "content": {"role": "model", "parts": [{"text": "Let me "}, {"text": "check.", "thoughtSignature": "c2ln"}]}}],
               "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 9}, "modelVersion": "gemini-2.5-flash"}),
        json!({"candidates": [{"index": 0, "content": {"role": "model", "parts": [
                  {"functionCall": {"name": "weather", "args": {"city": "Rome"}}},
                  {"functionCall": {"name": "time", "args": {"zone": "CET"}}}]},
               "finishReason": "STOP"},
              {"index": 1, "content": {"role": "model", "parts": [{"text": "answer"}]}, "finishReason": "MAX_TOKENS"}],
               "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 20, "totalTokenCount": 25}}),
    ];
    let body: String = frames.iter().map(|f| format!("data: {f}\r\n\r\n")).collect();
    let events = sse(&body);
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Weigh the options.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"city\":\"Rome\"}".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"zone\":\"CET\"}".into()),
            (0, Channel::Content, "content".into(), "Let me check.".into()),
            (1, Channel::Content, "content".into(), "Second answer".into()),
        ]
    );
    let names: Vec<Value> = payloads(&events, "tool_call").iter().map(|p| p["name"].clone()).collect();
    assert_eq!(names, [json!("weather"), json!("time")]);
    assert_eq!(finishes(&events), [(0, "stop".into()), (1, "length".into())]);
    assert!(truncations(&events).is_empty(), "a finishReason is the stream's clean end: {events:?}");
    assert!(!diagnostics(&events).contains(&"unrecognized_chunk".to_string()));
    let last_usage = events.iter().rev().find_map(|e| match e {
        SourceEvent::Usage { usage } => Some(usage["totalTokenCount"].clone()),
        _ => None,
    });
    assert_eq!(last_usage, Some(json!(25)));

    // Cut before any finishReason: truncated.
    let cut: String = frames[..3].iter().map(|f| format!("data: {f}\n\n")).collect();
    assert!(!truncations(&sse(&cut)).is_empty());

    // The same stream as one JSON array (no `alt=sse`), read whole.
    let array = Value::Array(frames.to_vec()).to_string();
    let whole = ChatStream::response_events(StreamOptions::default(), array.as_bytes());
    assert_eq!(elements(&whole), elements(&events));
    assert_eq!(finishes(&whole), finishes(&events));

    // A blocked prompt: no candidates, the block reason as a prompt filter.
    let blocked = json!({"promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []}});
    let events = sse(&format!("data: {blocked}\n\n"));
    assert!(events.iter().any(
        |e| matches!(e, SourceEvent::ContentFilter { choice: None, results } if results["blockReason"] == "SAFETY")
    ));
    assert!(truncations(&events).is_empty());
    assert!(elements(&events).is_empty());
}

/// llama.cpp's own `/completion` stream (SSE of `{"content", "stop"}`
/// chunks): the text, the end by `stop` with its `stop_type`, the counts;
/// a whole answer (`"stream": false`) is one such object.
#[test]
fn llama_cpp_completion_streams() {
    let chunks = [
        json!({"content": "<think>hm</think>Two <b>cu", "stop": false, "id_slot": 0, "index": 0}),
        json!({"content": "ps</b>.", "stop": false, "id_slot": 0, "index": 0}),
        json!({"content": "", "stop": true, "model": "qwen3.gguf", "stop_type": "limit", "tokens_predicted": 9,
               "tokens_evaluated": 12, "timings": {"predicted_ms": 80.0}}),
    ];
    let data: Vec<String> = chunks.iter().map(Value::to_string).collect();
    let options = StreamOptions { framing: Framing::Chunks, ..StreamOptions::default() };
    let events = run_with(options.clone(), &strs(&data));
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Content, "thought".into(), "hm".into()),
            (0, Channel::Content, "content".into(), "Two <b>cups</b>.".into())
        ]
    );
    assert_eq!(finishes(&events), [(0, "length".into())]);
    assert!(truncations(&events).is_empty(), "stop is the clean end");
    assert!(!diagnostics(&events).contains(&"unrecognized_chunk".to_string()));
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Usage { usage }
        if usage["tokens_predicted"] == 9 && usage["tokens_evaluated"] == 12)));
    // Cut before `stop`: truncated.
    assert!(!truncations(&run_with(options.clone(), &strs(&data[..2]))).is_empty());
    // A whole answer, stopped by its end of sequence.
    let whole = json!({"content": "Tea.", "stop": true, "stop_type": "eos"}).to_string();
    let events = run_with(options, &strs(&[whole]));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Tea.".into())]);
    assert_eq!(finishes(&events), [(0, "stop".into())]);
}

/// Ollama's own `/api/chat` stream (one JSON object per line): thinking,
/// content, whole tool calls, and `done` with its reason and counts.
#[test]
fn ollama_chat_and_generate_streams() {
    let lines = [
        json!({"model": "qwen3", "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", "content": "", "thinking": "Use the"}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "thinking": " tool."}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "weather", "arguments": {"city": "Rome"}}},
            {"function": {"index": 1, "name": "time", "arguments": {"zone": "CET"}}}]}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"index": 0, "name": "date", "arguments": {}}}]}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "Checking <b>now</b>"}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "."}, "done": true, "done_reason": "length",
               "total_duration": 5_000_000, "prompt_eval_count": 12, "eval_count": 40}),
    ];
    let data: Vec<String> = lines.iter().map(Value::to_string).collect();
    let options = StreamOptions { framing: Framing::Chunks, ..StreamOptions::default() };
    let events = run_with(options.clone(), &strs(&data));
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Use the tool.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"city\":\"Rome\"}".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"zone\":\"CET\"}".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{}".into()),
            (0, Channel::Content, "content".into(), "Checking <b>now</b>.".into()),
        ]
    );
    // A later chunk's call at index 0 again is a call of its own.
    let names: Vec<Value> = payloads(&events, "tool_call").iter().map(|p| p["name"].clone()).collect();
    assert_eq!(names, [json!("weather"), json!("time"), json!("date")]);
    assert!(diagnostics(&events).iter().all(|d| !d.starts_with("tool_call_")), "{:?}", diagnostics(&events));
    assert_eq!(finishes(&events), [(0, "length".into())]);
    assert!(truncations(&events).is_empty(), "done is the clean end");
    assert!(!diagnostics(&events).contains(&"unrecognized_chunk".to_string()));
    assert!(events.iter().any(
        |e| matches!(e, SourceEvent::Usage { usage } if usage["eval_count"] == 40 && usage["prompt_eval_count"] == 12)
    ));

    // Cut before `done`: truncated.
    assert!(!truncations(&run_with(options.clone(), &strs(&data[..4]))).is_empty());

    // `/api/generate`: the text is `response`; a whole answer (`"stream": false`) is one object.
    let generate = [
        json!({"model": "llama3", "response": "<think>hm</think>Hel", "done": false}),
        json!({"model": "llama3", "response": "lo", "done": true, "done_reason": "stop", "eval_count": 3}),
    ];
    let data: Vec<String> = generate.iter().map(Value::to_string).collect();
    let events = run_with(options, &strs(&data));
    assert_eq!(
        elements(&events),
        [(0, Channel::Content, "thought".into(), "hm".into()), (0, Channel::Content, "content".into(), "Hello".into())]
    );
    assert_eq!(finishes(&events), [(0, "stop".into())]);
    let whole = json!({"model": "llama3", "message": {"role": "assistant", "content": "Hi."}, "done": true, "done_reason": "stop"});
    let events = ChatStream::response_events(StreamOptions::default(), whole.to_string().as_bytes());
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Hi.".into())]);
    assert_eq!(finishes(&events), [(0, "stop".into())]);
}

/// JSON lines read by `LineTap`: split anywhere (also inside a UTF-8
/// character and between `\r` and `\n`), the same events; a last line
/// without a newline is read; a line past the limit is skipped and said,
/// and the lines after it are read.
#[test]
fn line_tap_is_split_invariant_and_bounds_a_line() {
    let body = concat!(
        "{\"model\":\"m\",\"created_at\":\"2026-11-29T21:00:00.000000000Z\",",
        "\"message\":{\"role\":\"assistant\",\"content\":\"猫 <b>x\"},\"done\":false}\r\n",
        "\n",
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"</b>!\"},\"done\":true,\"done_reason\":\"stop\"}",
    );
    let read = |size: usize, options: StreamOptions| {
        let mut tap = LineTap::new(options);
        let mut events = Vec::new();
        for piece in body.as_bytes().chunks(size) {
            tap.feed_into(piece, &mut events);
        }
        assert_eq!(tap.offset(), body.len());
        tap.finish_into(&mut events);
        events
    };
    let whole = read(body.len(), StreamOptions::default());
    assert_eq!(elements(&whole), [(0, Channel::Content, "content".into(), "猫 <b>x</b>!".into())]);
    assert_eq!(finishes(&whole), [(0, "stop".into())]);
    assert!(truncations(&whole).is_empty());
    for size in 1..=9 {
        assert_eq!(read(size, StreamOptions::default()), whole, "read size {size}");
    }
    // The first line is longer than the limit: skipped, said, and the
    // second still read.
    let mut options = StreamOptions::default();
    options.sse.max_line_len = 110;
    for size in [1, 7, body.len()] {
        let events = read(size, options.clone());
        assert!(diagnostics(&events).contains(&"sse_line_too_long".to_string()), "{events:?}");
        assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "</b>!".into())], "{size}");
    }
}

#[test]
fn bedrock_converse_response() {
    let response = json!({
        "metrics": {"latencyMs": 812},
        "output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "Need the weather.", "signature": "c2ln"}}},
            {"reasoningContent": {"redactedContent": "AAAA"}},
            {"text": "Checking."},
            {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Rome"}}},
            {"image": {"format": "png", "source": {"bytes": "AAAA"}}}
        ]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 12, "outputTokens": 30, "totalTokens": 42}
    });
    let mut stream = ChatStream::new(StreamOptions::default());
    let mut events = Vec::new();
    stream.push_response(response.to_string().as_bytes(), &mut events);
    stream.finish_into(&mut events);
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Need the weather.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"city\":\"Rome\"}".into()),
            (0, Channel::Content, "content".into(), "Checking.".into()),
        ]
    );
    let call = &payloads(&events, "tool_call")[0];
    assert_eq!((&call["id"], &call["name"]), (&json!("tooluse_1"), &json!("weather")));
    assert_eq!(finishes(&events), [(0, "tool_calls".into())]);
    assert!(truncations(&events).is_empty(), "a whole response is complete");
    assert!(diagnostics(&events).contains(&"redacted_thinking".to_string()), "{:?}", diagnostics(&events));
    assert!(!diagnostics(&events).contains(&"unrecognized_chunk".to_string()));
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Usage { usage } if usage["totalTokens"] == 42)));

    // Cut by the token limit, and stopped by a guardrail.
    for (stop, reason) in [("max_tokens", "length"), ("guardrail_intervened", "content_filter")] {
        let response =
            json!({"output": {"message": {"role": "assistant", "content": [{"text": "Par"}]}}, "stopReason": stop});
        let mut stream = ChatStream::new(StreamOptions::default());
        let mut events = Vec::new();
        stream.push_response(response.to_string().as_bytes(), &mut events);
        stream.finish_into(&mut events);
        assert_eq!(finishes(&events), [(0, reason.into())]);
        assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Par".into())]);
    }
}

#[test]
fn responses_api_stream() {
    let lines = [
        json!({"type": "response.created", "response": {"status": "in_progress"}}),
        json!({"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "Plan."}),
        json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "call_id": "call_9", "name": "calc", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{\"a\":1}"}),
        json!({"type": "response.function_call_arguments.done", "output_index": 1, "arguments": "{\"a\":1}"}),
        json!({"type": "response.output_text.delta", "output_index": 2, "delta": "Done."}),
        json!({"type": "response.completed", "response": {"status": "completed", "usage": {"total_tokens": 3}}}),
    ];
    let data: Vec<String> = lines.iter().map(Value::to_string).collect();
    let events = run(&strs(&data));
    assert_eq!(
        elements(&events),
        [
            (0, Channel::Reasoning, "thought".into(), "Plan.".into()),
            (0, Channel::ToolCalls, "tool_call".into(), "{\"a\":1}".into()),
            (0, Channel::Content, "content".into(), "Done.".into()),
        ]
    );
    assert_eq!(payloads(&events, "tool_call")[0]["id"], json!("call_9"));
    assert!(truncations(&events).is_empty());
}

#[test]
fn realtime_response_events_read_as_the_responses_api() {
    // GA names: text, an audio transcript, `response.done` as the end.
    let lines = [
        json!({"type": "response.output_text.delta", "response_id": "r", "item_id": "i", "content_index": 0, "delta": "Hi "}),
        json!({"type": "response.output_audio_transcript.delta", "response_id": "r", "item_id": "j", "delta": "there."}),
        json!({"type": "response.done", "response": {"id": "r", "status": "completed", "usage": {"total_tokens": 4}}}),
    ];
    let data: Vec<String> = lines.iter().map(Value::to_string).collect();
    let events = run(&strs(&data));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Hi there.".into())]);
    assert_eq!(finishes(&events), [(0, "stop".into())]);
    assert!(truncations(&events).is_empty());
    // Beta names; an incomplete answer's reason is in `status_details`.
    let lines = [
        json!({"type": "response.text.delta", "delta": "Par"}),
        json!({"type": "response.audio_transcript.delta", "delta": "tial"}),
        json!({"type": "response.done", "response": {"status": "incomplete",
               "status_details": {"type": "incomplete", "reason": "max_output_tokens"}}}),
    ];
    let data: Vec<String> = lines.iter().map(Value::to_string).collect();
    let events = run(&strs(&data));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Partial".into())]);
    assert_eq!(finishes(&events), [(0, "length".into())]);
}

#[test]
fn unknown_chunk_shapes_are_reported() {
    let events = run(&[r#"{"hello":"world"}"#, "[DONE]"]);
    assert!(diagnostics(&events).contains(&"unrecognized_chunk".to_string()));
}

#[test]
fn choice_limit_is_enforced() {
    let options = StreamOptions { max_choices: 2, ..StreamOptions::default() };
    let data = [
        chunk(0, json!({"content": "a"})),
        chunk(1, json!({"content": "b"})),
        chunk(7, json!({"content": "c"})),
        "[DONE]".into(),
    ];
    let events = run_with(options, &strs(&data));
    assert!(diagnostics(&events).contains(&"too_many_choices".to_string()));
    assert_eq!(elements(&events).len(), 2);
}

#[test]
fn thought_element_size_limit() {
    let mut options = StreamOptions::default();
    options.parser.machine.max_element_len = 8;
    let data = [
        chunk(0, json!({"reasoning_content": "0123456"})),
        chunk(0, json!({"reasoning_content": "789abc"})),
        "[DONE]".into(),
    ];
    let events = run_with(options, &strs(&data));
    let el = events.iter().find_map(SourceEvent::as_element).cloned();
    assert!(el.as_ref().is_some_and(|e| e.truncated && e.text == "0123456"), "{el:?}");
    assert!(diagnostics(&events).contains(&"element_too_large".to_string()));
}

#[test]
fn json_lines_shape() {
    let events = run(&strs(&[chunk(0, json!({"content": "Hi"})), finish(0, "stop")]));
    let lines: Vec<Value> = events.iter().map(|e| serde_json::to_value(e).unwrap_or_default()).collect();
    // The default `chat` profile: a plain answer is content, no repair.
    assert_eq!(
        lines[0],
        json!({"type": "open", "id": 0, "tag": "content", "raw_tag": "content", "attrs": {}, "synthetic": true, "at": 0, "choice": 0, "channel": "content"})
    );
    assert!(lines.contains(
        &json!({"type": "delta", "id": 0, "tag": "content", "text": "Hi", "choice": 0, "channel": "content"})
    ));
    assert!(lines.contains(&json!({"type": "finish", "choice": 0, "reason": "stop"})));
    assert!(lines.contains(&json!({"type": "truncated", "choice": 0, "why": "no [DONE]"})));
    assert!(!events.iter().any(|e| matches!(e, SourceEvent::Choice(c) if matches!(&c.event, Event::Repair(_)))));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "Hi".into())]);
}

/// The corrected content a tap hands a rewriting proxy, joined, equals what
/// the parser rewrites from the whole content at once.
#[test]
fn rewrites_match_the_parser_on_the_whole_content() {
    let pieces = ["Thinking", " hard</th", "ink>The <b>answer</b> is", " 42<content>", "done"];
    let mut body = String::new();
    for p in pieces {
        body.push_str(&format!("data: {}\n\n", chunk(0, json!({"content": p}))));
    }
    body.push_str(&format!("data: {}\n\ndata: [DONE]\n\n", finish(0, "stop")));
    let options = StreamOptions {
        parser: ParserOptions { rewrite: true, ..ParserOptions::default() },
        ..StreamOptions::default()
    };
    let mut tap = StreamTap::new(options);
    let mut frames = Vec::new();
    for byte in body.as_bytes().chunks(7) {
        tap.feed_frames(byte, &mut frames);
    }
    let end = tap.finish_frames();
    let mut joined = String::new();
    for f in &frames {
        for (choice, text) in &f.rewrites {
            assert_eq!(*choice, 0);
            joined.push_str(text);
        }
    }
    for (_, text) in &end.rewrites {
        joined.push_str(text);
    }
    let whole: String = pieces.concat();
    let mut parser =
        Parser::with_options(Arc::new(Registry::chat()), ParserOptions { rewrite: true, ..ParserOptions::default() });
    parser.feed(whole.as_bytes());
    let mut expected = parser.take_rewrite();
    expected.extend(parser.finish_with_rewrite().1);
    assert_eq!(joined, String::from_utf8_lossy(&expected));
    assert!(frames.iter().any(|f| f.chunk.is_some()), "frames carry their parsed chunk");

    // Re-serialised chunks carry the corrected content and keep the rest.
    let mut from_chunks = String::new();
    for f in &frames {
        let Some(rewritten) = f.rewritten_chunk() else {
            continue;
        };
        assert_eq!(rewritten.id(), Some("c"));
        assert_eq!(rewritten.object(), Some("chat.completion.chunk"));
        let original = f.chunk.as_ref().map(|c| c.choice_list().len()).unwrap_or(0);
        assert_eq!(rewritten.choice_list().len(), original, "no choice added or lost");
        for choice in rewritten.choice_list() {
            if let Some(text) = choice.delta.as_option().and_then(|d| d.content.as_option()).and_then(|c| c.as_text()) {
                from_chunks.push_str(text);
            }
        }
    }
    for (_, text) in &end.rewrites {
        from_chunks.push_str(text);
    }
    assert_eq!(from_chunks, joined);
}

/// Any split of an SSE body into reads gives the same events.
#[test]
fn tap_is_split_invariant() {
    let mut body = String::from(": keep-alive\r\n");
    for (i, p) in ["<think>a", "b</think>", "Hé", "llo"].iter().enumerate() {
        body.push_str(&format!("data: {}\r\n\r\n", chunk((i % 2) as u32, json!({"content": p}))));
    }
    body.push_str(&format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        chunk(0, json!({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{\"k\":1}"}}]})),
        finish(0, "tool_calls")
    ));
    let whole = sse(&body);
    let bytes = body.as_bytes();
    for i in 0..=bytes.len() {
        let mut tap = StreamTap::new(StreamOptions::default());
        let mut out = tap.feed(&bytes[..i]);
        tap.feed_into(&bytes[i..], &mut out);
        tap.finish_into(&mut out);
        assert_eq!(out, whole, "split at {i}");
    }
}

#[test]
fn fields_of_unexpected_types_are_coerced_and_reported() {
    let odd = r#"{"choices":[{"index":"1","delta":{"content":5,"tool_calls":{"index":0,"id":7,"function":{"name":"f","arguments":"{}"}}},"finish_reason":null}]}"#;
    let events = run(&[odd, "[DONE]"]);
    assert!(diagnostics(&events).contains(&"chunk_fields_coerced".to_string()));
    assert_eq!(
        elements(&events),
        [(1, Channel::Content, "content".into(), "5".into()), (1, Channel::ToolCalls, "tool_call".into(), "{}".into()),]
    );
    assert_eq!(payloads(&events, "tool_call")[0]["id"], json!("7"));
}

#[test]
fn whitespace_only_content_is_a_gap_not_a_missing_answer() {
    let data = [
        chunk(0, json!({"content": "  "})),
        chunk(0, json!({"tool_calls": [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{}"}}]})),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ];
    let events = run(&strs(&data));
    assert!(diagnostics(&events).is_empty(), "{:?}", diagnostics(&events));
    let gaps: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Choice(c) => match &c.event {
                Event::Gap(g) => Some(g.text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(gaps, ["  "]);
    assert_eq!(elements(&events), [(0, Channel::ToolCalls, "tool_call".into(), "{}".into())]);

    // Followed by real content, the whitespace goes to the parser first.
    let data = [chunk(0, json!({"content": "\n\n"})), chunk(0, json!({"content": "{\"a\": 1}"})), finish(0, "stop")];
    let events = run(&strs(&data));
    assert_eq!(elements(&events), [(0, Channel::Content, "content".into(), "{\"a\": 1}".into())]);
    let spans: Vec<(usize, usize)> = events
        .iter()
        .filter_map(|e| match e {
            SourceEvent::Choice(c) => match &c.event {
                Event::Gap(g) => Some((g.span.start, g.span.end)),
                Event::Element(el) => Some((el.span.start, el.span.end)),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(spans, [(0, 2), (2, 10)]);
}

// ----- the end of a stream, and stream semantics decided one by one -------

#[test]
fn done_with_trailing_whitespace_ends_the_stream() {
    for done in ["data: [DONE]  \n\n", "data:  [DONE]\t\n\n", "data: [DONE]\r\n\r\n"] {
        let body = format!("data: {}\n\n{done}", chunk(0, json!({"content": "a"})));
        let events = sse(&body);
        assert!(events.iter().any(|e| matches!(e, SourceEvent::Done)), "{done:?}");
        assert!(truncations(&events).iter().all(|(_, why)| *why != Truncation::NoDone), "{done:?}");
    }
}

#[test]
fn data_after_done_is_ignored_and_reported_once() {
    let events = run(&strs(&[
        chunk(0, json!({"content": "a"})),
        finish(0, "stop"),
        "[DONE]".into(),
        chunk(0, json!({"content": "not content"})),
        "[DONE]".into(),
        "garbage".into(),
    ]));
    let texts: Vec<String> = elements(&events).into_iter().map(|e| e.3).collect();
    assert_eq!(texts, ["a"]);
    let diags = diagnostics(&events);
    assert_eq!(diags.iter().filter(|d| *d == "data_after_done").count(), 1, "{diags:?}");
    assert_eq!(events.iter().filter(|e| matches!(e, SourceEvent::Done)).count(), 1);
}

#[test]
fn usage_only_chunks_between_content_chunks_change_nothing_else() {
    let usage = json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).to_string();
    let events = run(&strs(&[
        chunk(0, json!({"content": "a"})),
        usage,
        chunk(0, json!({"content": "b"})),
        finish(0, "stop"),
        "[DONE]".into(),
    ]));
    let texts: Vec<String> = elements(&events).into_iter().map(|e| e.3).collect();
    assert_eq!(texts, ["ab"], "one content element across the usage chunk");
    assert_eq!(events.iter().filter(|e| matches!(e, SourceEvent::Usage { .. })).count(), 1);
    assert!(truncations(&events).is_empty());
}

#[test]
fn choice_index_gaps_are_kept_as_sent() {
    let events = run(&strs(&[
        chunk(2, json!({"content": "two"})),
        chunk(0, json!({"content": "zero"})),
        finish(0, "stop"),
        finish(2, "length"),
        "[DONE]".into(),
    ]));
    let got: Vec<(u32, String)> = elements(&events).into_iter().map(|e| (e.0, e.3)).collect();
    // Each element completes at its choice's finish reason.
    assert_eq!(got, [(0, "zero".to_string()), (2, "two".to_string())]);
    assert_eq!(finishes(&events), [(0, "stop".to_string()), (2, "length".to_string())]);
    // No phantom choice 1: nothing is reported for it.
    assert!(events.iter().all(|e| e.choice() != Some(1)));
}

#[test]
fn repeated_role_null_and_empty_content_and_missing_type() {
    let events = run(&strs(&[
        chunk(0, json!({"role": "assistant", "content": ""})),
        chunk(0, json!({"role": "assistant", "content": null})),
        chunk(0, json!({"content": "hi"})),
        chunk(
            0,
            json!({"tool_calls": [{"index": 0, "id": "x", "function": {"name": "f", "arguments": "{\"s\": \"\\u00e"}}]}),
        ),
        chunk(0, json!({"tool_calls": [{"index": 0, "function": {"arguments": "9\"}"}}]})),
        finish(0, "tool_calls"),
        "[DONE]".into(),
    ]));
    let texts: Vec<String> = elements(&events).into_iter().filter(|e| e.2 == "content").map(|e| e.3).collect();
    assert_eq!(texts, ["hi"]);
    // `type` missing, and the arguments split inside a \u escape.
    assert_eq!(payloads(&events, "tool_call"), [json!({"id": "x", "name": "f", "arguments": {"s": "é"}, "index": 0})]);
}
