//! Other streaming dialects that OpenAI-compatible gateways also serve,
//! read into the same choice model as chat completions so that a replay or
//! a proxy accounts for every stream it meets:
//!
//! * the Anthropic Messages API (`message_start`, `content_block_delta`
//!   with `text_delta` / `thinking_delta` / `input_json_delta`,
//!   `message_delta`, `message_stop`);
//! * the OpenAI Responses API (`response.output_text.delta`,
//!   `response.reasoning_text.delta`, `response.function_call_arguments.delta`,
//!   `response.completed`, ...), and the server events of one response of
//!   the Realtime API, which share its names and add their own: text in
//!   `response.text.delta` (beta) and audio transcripts in
//!   `response.output_audio_transcript.delta` (beta:
//!   `response.audio_transcript.delta`), read as the answer's content, and
//!   `response.done` as the end;
//! * the Vercel AI SDK UI stream (`text-delta`, `reasoning-delta`, `finish`);
//! * the Gemini API (`generateContent`, and `streamGenerateContent` as SSE
//!   with `alt=sse` or as a JSON array): `candidates` with `content.parts`
//!   (`text`, `thought` text, `functionCall`), `finishReason`,
//!   `usageMetadata`, and a prompt blocked by `promptFeedback`;
//! * Ollama's own API (`/api/chat` and `/api/generate`, one JSON object per
//!   line): `message.content` or `response`, `thinking`, `message.tool_calls`,
//!   and `done` with `done_reason` and the token counts;
//! * llama.cpp's own API (`/completion`, `/infill`): `content` text and a
//!   boolean `stop`, the last chunk with `stop_type` (`eos`, `word`,
//!   `limit`) and the token counts;
//! * a whole Amazon Bedrock Converse response (`output.message.content`
//!   with `text`, `reasoningContent` and `toolUse` blocks, `stopReason`,
//!   `usage`). Its stream (`ConverseStream`) is AWS's binary event stream,
//!   not SSE, and is not read.
//!
//! This module owns only the mapping of those event objects onto choice
//! operations (text, reasoning, tool-call fragments, finish); everything
//! else (elements, ids, truncation) is [`super`]'s. All of them are
//! one choice, index 0, but Gemini's, whose candidates are the choices.
//! They end without `[DONE]`: their own end event (`message_stop`,
//! `response.completed`, `finish`, a Gemini `finishReason`, Ollama's
//! `done`, llama.cpp's `stop`) counts as a clean end.

use super::ChatStream;
use crate::event::DiagnosticCode;
use crate::event::Level;
use crate::sources::chunk::ChatChunk;
use crate::sources::events::{ErrorOrigin, FinishReason, SourceEvent};
use serde_json::Value;

/// Which dialect a stream turned out to speak, and its progress.
#[derive(Debug, Default)]
pub(super) struct Dialects {
    /// Anthropic: the stop reason from `message_delta`.
    stop_reason: Option<String>,
    /// Anthropic: usage merged from `message_start` and `message_delta`.
    usage: serde_json::Map<String, Value>,
    /// The dialect's own end event arrived.
    ended: bool,
}

impl Dialects {
    /// Whether the stream ended with its dialect's end event.
    pub(super) fn ended_cleanly(&self) -> bool {
        self.ended
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn index_of(v: &Value, key: &str) -> Option<u32> {
    v.get(key).and_then(Value::as_u64).and_then(|i| u32::try_from(i).ok())
}

/// Reads a chunk of another dialect. Returns false when it is none of them.
pub(super) fn push(stream: &mut ChatStream, chunk: &ChatChunk, out: &mut Vec<SourceEvent>) -> bool {
    // The whole object, typed fields (`usage`, `error`) included.
    let whole = || serde_json::to_value(chunk).unwrap_or(Value::Null);
    if is_converse(&chunk.extra) {
        converse(stream, &whole(), out);
        return true;
    }
    if is_gemini(&chunk.extra) {
        gemini(stream, &whole(), out);
        return true;
    }
    if is_ollama(&chunk.extra) {
        ollama(stream, &whole(), out);
        return true;
    }
    if is_llama_cpp(&chunk.extra) {
        llama_cpp(stream, &whole(), out);
        return true;
    }
    if chunk.object() == Some("response") && chunk.type_field().is_none() {
        responses_object(stream, &whole(), out);
        return true;
    }
    let Some(kind) = chunk.type_field() else {
        return false;
    };
    let v = whole();
    match kind {
        "message" => anthropic_message(stream, &v, out),
        "message_start"
        | "content_block_start"
        | "content_block_delta"
        | "content_block_stop"
        | "message_delta"
        | "message_stop"
        | "ping" => anthropic(stream, kind, &v, out),
        "error" => {
            let error = v.get("error").cloned().unwrap_or_else(|| v.clone());
            stream.push_error(None, ErrorOrigin::InBand, error, out);
        }
        k if k.starts_with("response.") => responses(stream, k, &v, out),
        "text-delta" | "reasoning-delta" | "finish" | "text-start" | "text-end" | "reasoning-start"
        | "reasoning-end" | "stream-start" | "response-metadata" | "start" | "start-step" | "finish-step" => {
            vercel(stream, kind, &v, out)
        }
        _ => return false,
    }
    true
}

fn merge_usage(stream: &mut ChatStream, usage: Option<&Value>, out: &mut Vec<SourceEvent>) {
    let Some(Value::Object(map)) = usage else {
        return;
    };
    for (k, v) in map {
        stream.dialect_mut().usage.insert(k.clone(), v.clone());
    }
    let merged = Value::Object(stream.dialect_mut().usage.clone());
    stream.push_usage(&merged, out);
}

fn anthropic(stream: &mut ChatStream, kind: &str, v: &Value, out: &mut Vec<SourceEvent>) {
    match kind {
        "message_start" => {
            let usage = v.get("message").and_then(|m| m.get("usage"));
            merge_usage(stream, usage, out);
        }
        "content_block_start" => {
            let index = index_of(v, "index");
            let Some(block) = v.get("content_block") else {
                return;
            };
            let block_type = str_of(block, "type").unwrap_or("");
            stream.with_choice(0, out, |c| match block_type {
                "text" => c.content(str_of(block, "text").unwrap_or("")),
                "thinking" => c.reasoning(str_of(block, "thinking").unwrap_or(""), "thinking"),
                "redacted_thinking" => c.diagnostic(
                    Level::Info,
                    DiagnosticCode::RedactedThinking,
                    "a redacted thinking block carries no readable text".to_string(),
                ),
                t if t.ends_with("tool_use") => {
                    let input = block.get("input").filter(|i| i.as_object().is_some_and(|o| !o.is_empty()));
                    c.tool_call(index, str_of(block, "id"), str_of(block, "name"), input, "tool_use");
                }
                _ => {}
            });
        }
        "content_block_delta" => {
            let index = index_of(v, "index");
            let Some(delta) = v.get("delta") else { return };
            stream.with_choice(0, out, |c| match str_of(delta, "type").unwrap_or("") {
                "text_delta" => c.content(str_of(delta, "text").unwrap_or("")),
                "thinking_delta" => c.reasoning(str_of(delta, "thinking").unwrap_or(""), "thinking"),
                "input_json_delta" => {
                    if let Some(json) = delta.get("partial_json") {
                        c.tool_call(index, None, None, Some(json), "tool_use");
                    }
                }
                _ => {}
            });
        }
        "content_block_stop" => stream.with_choice(0, out, |c| {
            c.end_tool_call();
            c.end_reasoning();
        }),
        "message_delta" => {
            if let Some(reason) = v.get("delta").and_then(|d| str_of(d, "stop_reason")) {
                stream.dialect_mut().stop_reason = Some(reason.to_string());
            }
            merge_usage(stream, v.get("usage"), out);
        }
        "message_stop" => {
            let reason = stream.dialect_mut().stop_reason.take();
            stream.dialect_mut().ended = true;
            stream
                .with_choice(0, out, |c| c.finish(Some(FinishReason::parse(reason.as_deref().unwrap_or("end_turn")))));
        }
        _ => {}
    }
}

fn responses(stream: &mut ChatStream, kind: &str, v: &Value, out: &mut Vec<SourceEvent>) {
    let text = str_of(v, "delta").unwrap_or("");
    match kind {
        // The Realtime API's text and audio transcripts (GA and beta names).
        "response.output_text.delta"
        | "response.text.delta"
        | "response.output_audio_transcript.delta"
        | "response.audio_transcript.delta" => stream.with_choice(0, out, |c| c.content(text)),
        "response.refusal.delta" => stream.with_choice(0, out, |c| c.refusal(text)),
        "response.reasoning_text.delta" => stream.with_choice(0, out, |c| c.reasoning(text, "reasoning_text")),
        "response.reasoning_summary_text.delta" => {
            stream.with_choice(0, out, |c| c.reasoning(text, "reasoning_summary"))
        }
        "response.reasoning_text.done" | "response.reasoning_summary_part.done" => {
            stream.with_choice(0, out, |c| c.end_reasoning())
        }
        "response.output_item.added" => {
            let Some(item) = v.get("item") else { return };
            if str_of(item, "type") == Some("function_call") {
                let index = index_of(v, "output_index");
                let args = item.get("arguments").filter(|a| a.as_str() != Some(""));
                stream.with_choice(0, out, |c| {
                    c.tool_call(index, str_of(item, "call_id"), str_of(item, "name"), args, "function_call")
                });
            }
        }
        "response.function_call_arguments.delta" => {
            let index = index_of(v, "output_index");
            if let Some(delta) = v.get("delta") {
                stream.with_choice(0, out, |c| c.tool_call(index, None, None, Some(delta), "function_call"));
            }
        }
        "response.function_call_arguments.done" => stream.with_choice(0, out, |c| c.end_tool_call()),
        "response.completed" | "response.incomplete" | "response.failed" | "response.done" => {
            let response = v.get("response");
            // Realtime's `response.done` puts the error and the reason of
            // an incomplete answer in `status_details`.
            let details = response.and_then(|r| r.get("incomplete_details").or_else(|| r.get("status_details")));
            merge_usage(stream, response.and_then(|r| r.get("usage")), out);
            let error = response.and_then(|r| r.get("error")).or_else(|| details.and_then(|d| d.get("error")));
            if let Some(error) = error.filter(|e| !e.is_null()) {
                stream.push_error(Some(0), ErrorOrigin::InBand, error.clone(), out);
            }
            let reason = details
                .filter(|d| str_of(d, "type") != Some("completed"))
                .and_then(|d| str_of(d, "reason"))
                .or_else(|| response.and_then(|r| str_of(r, "status")))
                .unwrap_or(&kind["response.".len()..])
                .to_string();
            stream.dialect_mut().ended = true;
            stream.with_choice(0, out, |c| c.finish(Some(FinishReason::parse(&reason))));
        }
        "response.error" => {
            stream.push_error(None, ErrorOrigin::InBand, v.clone(), out);
        }
        _ => {}
    }
}

fn vercel(stream: &mut ChatStream, kind: &str, v: &Value, out: &mut Vec<SourceEvent>) {
    match kind {
        "text-delta" => {
            let text = str_of(v, "delta").or_else(|| str_of(v, "textDelta")).unwrap_or("");
            stream.with_choice(0, out, |c| c.content(text));
        }
        "reasoning-delta" => {
            let text = str_of(v, "delta").unwrap_or("");
            stream.with_choice(0, out, |c| c.reasoning(text, "reasoning"));
        }
        "reasoning-end" => stream.with_choice(0, out, |c| c.end_reasoning()),
        "finish" => {
            let reason = match v.get("finishReason") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => str_of(other, "unified").unwrap_or("stop").to_string(),
                None => "stop".to_string(),
            };
            stream.dialect_mut().ended = true;
            stream.with_choice(0, out, |c| c.finish(Some(FinishReason::parse(&reason))));
            if let Some(usage) = v.get("usage") {
                stream.push_usage(usage, out);
            }
        }
        _ => {}
    }
}

/// A whole (non-streamed) Anthropic Messages response.
fn anthropic_message(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    let blocks = v.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    stream.with_choice(0, out, |c| {
        for (i, block) in blocks.iter().enumerate() {
            let index = u32::try_from(i).ok();
            match str_of(block, "type").unwrap_or("") {
                "text" => c.content(str_of(block, "text").unwrap_or("")),
                "thinking" => {
                    c.reasoning(str_of(block, "thinking").unwrap_or(""), "thinking");
                    c.end_reasoning();
                }
                t if t.ends_with("tool_use") => {
                    c.tool_call(index, str_of(block, "id"), str_of(block, "name"), block.get("input"), "tool_use");
                    c.end_tool_call();
                }
                _ => {}
            }
        }
        let reason = str_of(v, "stop_reason").unwrap_or("end_turn");
        c.finish(Some(FinishReason::parse(reason)));
    });
    stream.dialect_mut().ended = true;
    if let Some(usage) = v.get("usage") {
        stream.push_usage(usage, out);
    }
}

/// Whether an object is a Bedrock Converse response: an `output` holding a
/// `message`.
pub(crate) fn is_converse(object: &serde_json::Map<String, Value>) -> bool {
    object.get("output").and_then(|o| o.get("message")).is_some_and(Value::is_object)
}

/// Whether an object is a Gemini `GenerateContentResponse`: it has
/// `candidates`, or only the `promptFeedback` of a blocked prompt.
pub(crate) fn is_gemini(object: &serde_json::Map<String, Value>) -> bool {
    object.get("candidates").is_some_and(Value::is_array) || object.get("promptFeedback").is_some_and(Value::is_object)
}

/// One Gemini response, streamed or whole: each candidate is a choice.
fn gemini(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    if let Some(feedback) = v.get("promptFeedback").filter(|f| f.get("blockReason").is_some()) {
        // A blocked prompt: this is the whole answer.
        out.push(SourceEvent::ContentFilter { choice: None, results: feedback.clone() });
        stream.dialect_mut().ended = true;
    }
    for candidate in v.get("candidates").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
        let index = index_of(candidate, "index").unwrap_or(0);
        let parts = candidate
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let reason = str_of(candidate, "finishReason").filter(|r| *r != "FINISH_REASON_UNSPECIFIED");
        stream.with_choice(index, out, |c| {
            for part in parts {
                if let Some(call) = part.get("functionCall") {
                    c.tool_call(None, str_of(call, "id"), str_of(call, "name"), call.get("args"), "functionCall");
                    c.end_tool_call();
                } else if let Some(text) = str_of(part, "text") {
                    if part.get("thought").and_then(Value::as_bool) == Some(true) {
                        c.reasoning(text, "thought");
                    } else {
                        c.content(text);
                    }
                }
            }
            if let Some(reason) = reason {
                c.finish(Some(FinishReason::parse(reason)));
            }
        });
        if reason.is_some() {
            stream.dialect_mut().ended = true;
        }
    }
    if let Some(usage) = v.get("usageMetadata") {
        stream.push_usage(usage, out);
    }
}

/// Whether an object is a chunk of Ollama's own API: `done`, with a
/// `message` (`/api/chat`) or a `response` (`/api/generate`).
pub(crate) fn is_ollama(object: &serde_json::Map<String, Value>) -> bool {
    object.get("done").is_some_and(Value::is_boolean)
        && (object.get("message").is_some_and(Value::is_object) || object.get("response").is_some_and(Value::is_string))
}

/// The token counts and timings of Ollama's last chunk, as its usage.
const OLLAMA_USAGE: [&str; 6] =
    ["prompt_eval_count", "eval_count", "total_duration", "load_duration", "prompt_eval_duration", "eval_duration"];

/// One chunk of Ollama's `/api/chat` or `/api/generate` stream (or its
/// whole answer, `"stream": false`).
fn ollama(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    let message = v.get("message");
    let field = |key: &str| message.and_then(|m| str_of(m, key)).or_else(|| str_of(v, key));
    let calls = message.and_then(|m| m.get("tool_calls")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let done = v.get("done").and_then(Value::as_bool) == Some(true);
    stream.with_choice(0, out, |c| {
        c.reasoning(field("thinking").unwrap_or(""), "thinking");
        c.content(message.map_or_else(|| str_of(v, "response"), |m| str_of(m, "content")).unwrap_or(""));
        for call in calls {
            let function = call.get("function").unwrap_or(call);
            let index = index_of(function, "index");
            c.tool_call(index, str_of(call, "id"), str_of(function, "name"), function.get("arguments"), "tool_calls");
            c.end_tool_call();
        }
        if done {
            c.finish(Some(FinishReason::parse(str_of(v, "done_reason").unwrap_or("stop"))));
        }
    });
    if done {
        ended_with_usage(stream, v, &OLLAMA_USAGE, out);
    }
}

/// Ends a native (non-OpenAI) stream at its last chunk `v`: the stream is
/// over, and the token counts named by `keys` that it carries are its
/// usage.
fn ended_with_usage(stream: &mut ChatStream, v: &Value, keys: &[&str], out: &mut Vec<SourceEvent>) {
    stream.dialect_mut().ended = true;
    let usage: serde_json::Map<String, Value> =
        keys.iter().filter_map(|k| v.get(*k).map(|n| ((*k).to_string(), n.clone()))).collect();
    if !usage.is_empty() {
        stream.push_usage(&Value::Object(usage), out);
    }
}

/// Whether an object is a chunk of llama.cpp's own completion API
/// (`/completion`, `/infill`): `content` text with a boolean `stop`.
pub(crate) fn is_llama_cpp(object: &serde_json::Map<String, Value>) -> bool {
    object.get("stop").is_some_and(Value::is_boolean) && object.get("content").is_some_and(Value::is_string)
}

/// The token counts of llama.cpp's last chunk, as its usage.
const LLAMA_CPP_USAGE: [&str; 3] = ["tokens_evaluated", "tokens_predicted", "tokens_cached"];

/// One chunk of llama.cpp's `/completion` stream (or its whole answer,
/// `"stream": false`): the text is `content`; the chunk with `stop: true`
/// ends it, stopped by the token limit when its `stop_type` is `limit`
/// (older servers: `stopped_limit`).
fn llama_cpp(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    let stop = v.get("stop").and_then(Value::as_bool) == Some(true);
    stream.with_choice(0, out, |c| {
        c.content(str_of(v, "content").unwrap_or(""));
        if stop {
            let limit = str_of(v, "stop_type") == Some("limit")
                || v.get("stopped_limit").and_then(Value::as_bool) == Some(true);
            c.finish(Some(if limit { FinishReason::Length } else { FinishReason::Stop }));
        }
    });
    if stop {
        ended_with_usage(stream, v, &LLAMA_CPP_USAGE, out);
    }
}

/// A whole Bedrock Converse response.
fn converse(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    let message = v.get("output").and_then(|o| o.get("message"));
    let blocks = message.and_then(|m| m.get("content")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    stream.with_choice(0, out, |c| {
        for (i, block) in blocks.iter().enumerate() {
            if let Some(text) = str_of(block, "text") {
                c.content(text);
            } else if let Some(reasoning) = block.get("reasoningContent") {
                match reasoning.get("reasoningText").and_then(|r| str_of(r, "text")) {
                    Some(text) => c.reasoning(text, "reasoningContent"),
                    None => c.diagnostic(
                        Level::Info,
                        DiagnosticCode::RedactedThinking,
                        "a redacted reasoning block carries no readable text".to_string(),
                    ),
                }
                c.end_reasoning();
            } else if let Some(call) = block.get("toolUse") {
                let index = u32::try_from(i).ok();
                c.tool_call(index, str_of(call, "toolUseId"), str_of(call, "name"), call.get("input"), "toolUse");
                c.end_tool_call();
            }
        }
        c.finish(Some(FinishReason::parse(str_of(v, "stopReason").unwrap_or("end_turn"))));
    });
    stream.dialect_mut().ended = true;
    if let Some(usage) = v.get("usage") {
        stream.push_usage(usage, out);
    }
}

/// A whole (non-streamed) Responses API object.
fn responses_object(stream: &mut ChatStream, v: &Value, out: &mut Vec<SourceEvent>) {
    let items = v.get("output").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    stream.with_choice(0, out, |c| {
        for (i, item) in items.iter().enumerate() {
            let index = u32::try_from(i).ok();
            match str_of(item, "type").unwrap_or("") {
                "message" => {
                    for part in item.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
                        match str_of(part, "type").unwrap_or("") {
                            "output_text" => c.content(str_of(part, "text").unwrap_or("")),
                            "refusal" => c.refusal(str_of(part, "refusal").unwrap_or("")),
                            _ => {}
                        }
                    }
                }
                "reasoning" => {
                    for key in ["content", "summary"] {
                        for part in item.get(key).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]) {
                            c.reasoning(str_of(part, "text").unwrap_or(""), "reasoning");
                        }
                    }
                    c.end_reasoning();
                }
                "function_call" => {
                    c.tool_call(
                        index,
                        str_of(item, "call_id"),
                        str_of(item, "name"),
                        item.get("arguments"),
                        "function_call",
                    );
                    c.end_tool_call();
                }
                _ => {}
            }
        }
        let reason = v
            .get("incomplete_details")
            .and_then(|d| str_of(d, "reason"))
            .or_else(|| str_of(v, "status"))
            .unwrap_or("completed");
        c.finish(Some(FinishReason::parse(reason)));
    });
    stream.dialect_mut().ended = true;
    if let Some(error) = v.get("error").filter(|e| !e.is_null()) {
        stream.push_error(None, ErrorOrigin::InBand, error.clone(), out);
    }
    if let Some(usage) = v.get("usage") {
        stream.push_usage(usage, out);
    }
}
