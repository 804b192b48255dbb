//! The self-check of the proxy's tool calling (`crate::check` runs it for
//! the `relay` fuzz target and the replay of its saved inputs): model text
//! through the relay that turns calls into `tool_calls`, streamed in
//! deltas of different sizes and read in pieces of different sizes, and
//! answered whole. It owns no behaviour of the proxy; it only drives the
//! relay and the converter as the server does and compares what a client
//! would get.

use super::calling::response::CallConverter;
use super::calling::{InvalidCalls, TOOL_PROTOCOLS, ToolCalling};
use super::relay::{End, SseRelay, whole_response};
use crate::Registry;
use crate::calls::ToolCatalog;
use crate::sources::{SseDecoder, SseItem, StreamOptions};
use bytes::Bytes;
use serde_json::{Value, json};
use std::sync::{Arc, OnceLock};

/// The response id every run uses (call ids are derived from it).
const ID: &str = "chatcmpl-check";

/// What a client makes of one response: the content, the calls (each as
/// `{"id", "name", "arguments"}`, fragments joined) and the finish reason.
#[derive(Debug, PartialEq)]
struct Seen {
    content: String,
    calls: Vec<Value>,
    finish: Option<String>,
}

/// One way of running the check, chosen by a selector byte.
struct Run {
    protocol: crate::tools::Protocol,
    invalid: InvalidCalls,
    /// The finish reason the upstream sends; none (a stream that ends
    /// with `[DONE]` alone) for one text in four.
    finish: Option<&'static str>,
    /// Characters per content delta.
    chars: usize,
}

impl Run {
    /// The selector's bits: the protocol (two), invalid calls dropped
    /// (one), the stream cut by `length` (one), characters per delta
    /// minus one (four); a text whose length is 3 modulo 4 gets no finish
    /// reason.
    fn new(selector: u8, text: &str) -> Run {
        Run {
            protocol: TOOL_PROTOCOLS[usize::from(selector & 3) % TOOL_PROTOCOLS.len()],
            invalid: if selector & 4 == 0 { InvalidCalls::Pass } else { InvalidCalls::Drop },
            finish: match (text.len() % 4, selector & 8) {
                (3, _) => None,
                (_, 0) => Some("stop"),
                _ => Some("length"),
            },
            chars: usize::from(selector >> 4) + 1,
        }
    }
}

/// The tools the requests offer: one with a typed schema, one with
/// optional parameters of other types. Built once (compiling the schemas
/// is most of a run's time).
fn catalog() -> Result<Arc<ToolCatalog>, String> {
    static CATALOG: OnceLock<Result<Arc<ToolCatalog>, String>> = OnceLock::new();
    CATALOG.get_or_init(build_catalog).clone()
}

fn build_catalog() -> Result<Arc<ToolCatalog>, String> {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "number"}, "exact": {"type": "boolean"}}}}}
    ]);
    let mut catalog = ToolCatalog::new();
    catalog.add_openai_tools(&tools).map_err(|e| e.to_string())?;
    Ok(Arc::new(catalog))
}

/// `text` as a chat-completions SSE body: a role chunk, deltas of `chars`
/// characters, a chunk with `finish` (if any), then `[DONE]`.
fn sse_body(text: &str, chars: usize, finish: Option<&str>) -> Vec<u8> {
    let mut body = String::new();
    let mut push = |delta: Value, finish: Value| {
        let chunk = json!({"id": ID, "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        body.push_str(&format!("data: {chunk}\n\n"));
    };
    push(json!({"role": "assistant", "content": ""}), Value::Null);
    let all: Vec<char> = text.chars().collect();
    for piece in all.chunks(chars.max(1)) {
        push(json!({"content": piece.iter().collect::<String>()}), Value::Null);
    }
    if let Some(finish) = finish {
        push(json!({}), json!(finish));
    }
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

/// The relay's options and a converter, as the server makes them for a
/// request with `tools`.
fn parts(run: &Run) -> Result<(StreamOptions, CallConverter), String> {
    let calling = ToolCalling { protocol: run.protocol, invalid_calls: run.invalid };
    let registry = Registry::profile(calling.default_profile()).ok_or("profile")?;
    calling.check(&registry)?;
    let mut options = StreamOptions::with_registry(registry);
    // One nonce for every run: the runs' bytes are compared, ids included.
    let converter = CallConverter::attach(&mut options, catalog()?, run.invalid).with_nonce(0);
    Ok((options, converter))
}

/// The client's bytes of `body` streamed through the tool-calling relay,
/// read `read` bytes at a time.
fn streamed(run: &Run, body: &[u8], read: usize) -> Result<Vec<u8>, String> {
    let (options, converter) = parts(run)?;
    let relay = SseRelay::new(options, true, true).with_calls(Some(converter));
    let SseRelay::Rewrite(mut relay) = relay else {
        return Err("tool calling did not choose the rewriting relay".into());
    };
    let mut out = Vec::new();
    let mut events = Vec::new();
    for piece in body.chunks(read.max(1)) {
        relay.feed(Bytes::copy_from_slice(piece), &mut out, &mut events);
    }
    SseRelay::Rewrite(relay).end(End::Eof, &mut out, &mut events);
    Ok(out.iter().flat_map(|b| b.iter().copied()).collect())
}

/// What a client reads from a streamed response; an error when the stream
/// is not whole SSE events of JSON chunks ending in `[DONE]`.
fn read_stream(sse: &[u8]) -> Result<Seen, String> {
    let mut decoder = SseDecoder::new();
    let mut items = decoder.feed(sse);
    items.extend(decoder.finish());
    let mut seen = Seen { content: String::new(), calls: Vec::new(), finish: None };
    let mut fragments: Vec<(u64, Value)> = Vec::new();
    let mut done = false;
    for item in items {
        let SseItem::Event(event) = item else {
            return Err(format!("the client's stream holds {item:?}"));
        };
        if done {
            return Err("an event after [DONE]".into());
        }
        if event.data == "[DONE]" {
            done = true;
            continue;
        }
        let chunk: Value = serde_json::from_str(&event.data).map_err(|e| format!("{e}: {:?}", event.data))?;
        if chunk.get("error").is_some() {
            return Err(format!("an error event: {}", event.data));
        }
        let Some(choice) = chunk["choices"].get(0) else { continue };
        if let Some(text) = choice["delta"]["content"].as_str() {
            seen.content.push_str(text);
        }
        if let Some(list) = choice["delta"]["tool_calls"].as_array() {
            for fragment in list {
                let index =
                    fragment["index"].as_u64().ok_or_else(|| format!("a fragment without index: {fragment}"))?;
                fragments.push((index, fragment.clone()));
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            if seen.finish.is_some() {
                return Err(format!("a second finish_reason: {}", event.data));
            }
            seen.finish = Some(reason.to_string());
        }
    }
    if !done {
        return Err("the stream does not end with [DONE]".into());
    }
    let mut calls: Vec<(u64, String, String, String)> = Vec::new();
    for (index, fragment) in fragments {
        let pos = match calls.iter().position(|c| c.0 == index) {
            Some(pos) => pos,
            None if index == calls.len() as u64 => {
                let (Some(id), Some(name)) = (fragment["id"].as_str(), fragment["function"]["name"].as_str()) else {
                    return Err(format!("a call's first fragment without id and name: {fragment}"));
                };
                calls.push((index, id.to_string(), name.to_string(), String::new()));
                calls.len() - 1
            }
            None => return Err(format!("call index {index} after {} calls", calls.len())),
        };
        if let Some(arguments) = fragment["function"]["arguments"].as_str() {
            calls[pos].3.push_str(arguments);
        }
    }
    seen.calls =
        calls.into_iter().map(|(_, id, name, args)| json!({"id": id, "name": name, "arguments": args})).collect();
    Ok(seen)
}

/// What a client reads from the same text answered whole (not streamed).
fn read_whole(run: &Run, text: &str) -> Result<Seen, String> {
    let (options, converter) = parts(run)?;
    let body = json!({"id": ID, "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": run.finish}]});
    let bytes = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    let (_, rewritten) = whole_response(options, &bytes, true, Some(converter));
    let doc: Value = match rewritten {
        Some(b) => serde_json::from_slice(&b).map_err(|e| e.to_string())?,
        None => body,
    };
    let choice = &doc["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    Ok(Seen {
        content: choice["message"]["content"].as_str().unwrap_or_default().to_string(),
        calls: calls
            .iter()
            .map(|c| json!({"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
            .collect(),
        finish: choice["finish_reason"].as_str().map(str::to_string),
    })
}

/// Model text through the proxy's tool calling, as [`crate::check`]
/// describes it.
pub(crate) fn tool_calling_agreement(selector: u8, text: &str) -> Result<(), String> {
    let run = Run::new(selector, text);
    let label = format!("{:?}, {:?}, {:?}, {} characters a delta", run.protocol, run.invalid, run.finish, run.chars);
    // The request side: the same bytes as a request body translate, or
    // are refused with a reason; a translated body is JSON.
    if let Ok(prepared) = super::calling::request::prepare(text.as_bytes(), run.protocol)
        && let Some(body) = prepared.body
        && let Err(e) = serde_json::from_slice::<Value>(&body)
    {
        return Err(format!("{label}: the translated request is not JSON: {e}"));
    }
    let body = sse_body(text, run.chars, run.finish);
    let out = streamed(&run, &body, body.len())?;
    // Read sizes change nothing: the relay writes per upstream event.
    let read = text.len() % 13 + 1;
    if streamed(&run, &body, read)? != out {
        return Err(format!("{label}: the client's bytes differ when the upstream is read {read} bytes at a time"));
    }
    let seen = read_stream(&out).map_err(|why| format!("{label}: {why}"))?;
    // Nor do delta sizes: the text in one delta reads the same.
    let one = sse_body(text, usize::MAX, run.finish);
    let seen_one =
        read_stream(&streamed(&run, &one, one.len())?).map_err(|why| format!("{label}, one delta: {why}"))?;
    if seen_one != seen {
        return Err(format!("{label}: {seen:?} streamed, {seen_one:?} in one delta"));
    }
    // And a whole response gives the same calls, content and finish
    // reason (its content is null when only calls were made). With
    // invalid calls passed, a stream sends each call as its name arrives,
    // read by the streaming reader; a whole response sends nothing before
    // a call is complete, read whole (by the lenient reader, where the body
    // needs it). Then the whole response sends no unreadable call and no
    // call the stream did not start, and where it sends as many calls its
    // content and finish reason are the stream's.
    let mut whole = read_whole(&run, text).map_err(|why| format!("{label}, whole: {why}"))?;
    if whole.content.is_empty() && !whole.calls.is_empty() && seen.content.trim().is_empty() {
        whole.content.clone_from(&seen.content);
    }
    if run.invalid == InvalidCalls::Pass && !whole.agrees(&seen) {
        let unreadable = |c: &Value| {
            c["arguments"].as_str().is_none_or(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_err())
        };
        if let Some(call) = whole.calls.iter().find(|c| unreadable(c)) {
            return Err(format!("{label}: a whole response sent the unreadable call {call}"));
        }
        if whole.calls.len() > seen.calls.len() {
            return Err(format!(
                "{label}: a whole response sent more calls than the stream: {seen:?} streamed, {whole:?} whole"
            ));
        }
        if whole.calls.len() == seen.calls.len() && (whole.content != seen.content || whole.finish != seen.finish) {
            return Err(format!("{label}: {seen:?} streamed, {whole:?} whole"));
        }
        return Ok(());
    }
    if !whole.agrees(&seen) {
        return Err(format!("{label}: {seen:?} streamed, {whole:?} whole"));
    }
    Ok(())
}

impl Seen {
    /// The same content, finish reason and calls (see [`same_call`]).
    fn agrees(&self, other: &Seen) -> bool {
        self.content == other.content
            && self.finish == other.finish
            && self.calls.len() == other.calls.len()
            && self.calls.iter().zip(&other.calls).all(|(a, b)| same_call(a, b))
    }
}

/// The same call, its arguments compared as JSON: a stream passes on the
/// arguments as the model wrote them (spaces and all), a whole response
/// writes them as read.
fn same_call(a: &Value, b: &Value) -> bool {
    let args = |call: &Value| {
        let mut call = call.clone();
        if let Some(text) = call.get("arguments").and_then(Value::as_str)
            && let Ok(parsed) = serde_json::from_str::<Value>(text)
        {
            call["arguments"] = parsed;
        }
        call
    };
    args(a) == args(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Calls of every protocol, valid, invalid, lenient, cut off, in a
    /// code block, and text with none.
    const TEXTS: &[&str] = &[
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>",
        "<tool_call>{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"x\"}}</tool_call>",
        "<tool_call>{'name': 'search', 'arguments': {'query': 'rust', 'exact': True}}</tool_call> after",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os",
        "Like this:\n```\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>\n```\nOK.",
        "Checking.\n<|[REQUEST_TOOL]|>\ncommand_1:»»»get_weather«««\ncity_1:»»»Oslo«««\ndays_1:»»»3«««\ncommand_2:»»»search«««\nquery_2:»»»北京«««\n<|[END_TOOL]|>",
        "I will look.\n```xml\n<ACTION><get_weather><city>Oslo</city><days>2</days></get_weather></ACTION>\n```\n",
        "<ACTION><search><query>a &amp; b</query></search><nope/></ACTION><ACTION><search/></ACTION>",
        "<think>plan</think>Just an answer, with <b>markup</b> and a < b.",
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "Wrap each call in <tool_call> and </tool_call> tags; <tool_call> alone opens one.",
        REQUEST,
        "",
    ];

    /// A request with tools and a history of calls and results (also read
    /// as a request by the check).
    const REQUEST: &str = r#"{"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}}}}}], "tool_choice": "auto", "parallel_tool_calls": false}"#;

    #[test]
    fn the_request_seed_translates() {
        for protocol in TOOL_PROTOCOLS {
            let prepared = super::super::calling::request::prepare(REQUEST.as_bytes(), protocol)
                .unwrap_or_else(|e| panic!("{protocol:?}: {e}"));
            let body: Value = serde_json::from_slice(&prepared.body.unwrap_or_default()).unwrap_or_default();
            assert!(body.get("tools").is_none() && body["messages"].as_array().is_some_and(|m| m.len() >= 3));
        }
    }

    #[test]
    fn every_run_of_the_seed_texts_agrees() {
        for text in TEXTS {
            for selector in 0..=255u8 {
                if let Err(why) = tool_calling_agreement(selector, text) {
                    panic!("selector {selector:#04x}, {text:?}: {why}");
                }
            }
        }
    }

    #[test]
    fn the_check_sees_calls() {
        // Not a check that passes because nothing was called: the Hermes
        // seed makes one call in every run.
        let run = Run::new(0, TEXTS[0]);
        let body = sse_body(TEXTS[0], 3, Some("stop"));
        let seen = read_stream(&streamed(&run, &body, 5).unwrap_or_default()).unwrap_or_else(|why| panic!("{why}"));
        assert_eq!(seen.calls.len(), 1, "{seen:?}");
        assert_eq!(seen.calls[0]["name"], "get_weather");
        assert_eq!(seen.finish.as_deref(), Some("tool_calls"));
        assert_eq!(seen.content, "Let me check.\n");
    }
}
