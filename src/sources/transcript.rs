//! Recorded transcripts: what kind a file is, replaying it through the
//! stream model, and checking that no content was lost.
//!
//! This module owns the file kinds and the content check; walking
//! directories, progress and summaries belong to `spindle replay`.
//!
//! | kind | recognised by | replayed as |
//! |---|---|---|
//! | [`TranscriptKind::Sse`] | `.sse`, `.bin`, `.sse.txt`, or a body whose first line is an SSE field | one SSE stream |
//! | [`TranscriptKind::ChunkLines`] | `.chunks.txt` (or any text) with one JSON chunk per line | one stream, no `[DONE]` expected |
//! | [`TranscriptKind::Json`] | `.json`: a `chat.completion` (or Anthropic / Responses / Gemini / Ollama / Bedrock Converse) response, a Gemini stream sent as a JSON array, an error body, or an array of string tokens | one response, or the tokens fed one by one |
//! | [`TranscriptKind::JsonLines`] | `.jsonl`: records with a `text` field, or chunks | one plain-text stream per record |
//! | [`TranscriptKind::Text`] | anything else that is text | the Filament parser directly |
//!
//! `requests.jsonl`, `PROVENANCE*`, `INVENTORY*`, `README*`, licence files,
//! dot files and binary files are skipped with a reason.
//!
//! # The content check
//!
//! [`check_content`] re-reads the file with a deliberately naive reader (no
//! shared code with the decoder or the stream model) to get, per stream and
//! choice, the concatenated `delta.content`. Then, for each choice:
//!
//! * when its elements are all `content` and their joined text equals that
//!   concatenation, the choice is [`CheckResult::Equal`] (the rule);
//! * otherwise (tags in the content, whitespace before the first element,
//!   repairs) the elements, comments between elements, whitespace gaps and
//!   the spans that repairs dropped must tile the content exactly: every
//!   byte in exactly one of them, each element's text inside its span
//!   ([`CheckResult::Tiled`]). Anything else is a
//!   [`CheckResult::Mismatch`]: content lost or invented.

use super::events::{Channel, SourceEvent};
use super::lines::LineTap;
use super::model::{ChatStream, Framing, StreamOptions};
use super::model::{excerpt, is_converse, is_gemini, is_llama_cpp, is_ollama};
use super::tap::StreamTap;
use crate::event::DiagnosticCode;
use crate::event::Event;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// What a transcript file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TranscriptKind {
    /// A raw SSE body.
    Sse,
    /// One JSON chunk payload per line.
    ChunkLines,
    /// One JSON document.
    Json,
    /// JSON records, one per line.
    JsonLines,
    /// Plain model output.
    Text,
}

impl TranscriptKind {
    /// A short name for tables.
    pub fn as_str(self) -> &'static str {
        match self {
            TranscriptKind::Sse => "sse",
            TranscriptKind::ChunkLines => "chunks",
            TranscriptKind::Json => "json",
            TranscriptKind::JsonLines => "jsonl",
            TranscriptKind::Text => "text",
        }
    }
}

/// The result of [`detect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detection {
    /// Replay it as this kind.
    Replay(TranscriptKind),
    /// Not a transcript; why.
    Skip(String),
}

fn first_line(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len());
    let rest = &bytes[start..];
    let end = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
    &rest[..end]
}

fn looks_like_sse(bytes: &[u8]) -> bool {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let line = first_line(bytes);
    [&b"data:"[..], b"event:", b"id:", b"retry:", b":"].iter().any(|p| line.starts_with(p))
}

fn looks_like_chunk_line(bytes: &[u8]) -> bool {
    is_chunk_line(first_line(bytes))
}

/// Whether one line (without its newline) is a JSON chunk of a stream an
/// API sends one object per line (`application/x-ndjson`): a chunk the
/// stream model reads (a chat chunk, another dialect's event, a Gemini or
/// an Ollama chunk, a whole response on one line). Model text that merely
/// is JSON (`{"type": "greeting"}`) is not one.
pub fn is_chunk_line(line: &[u8]) -> bool {
    let line = line.trim_ascii();
    if !line.starts_with(b"{") || serde_json::from_slice::<serde::de::IgnoredAny>(line).is_err() {
        return false;
    }
    let mut stream = ChatStream::new(StreamOptions::default());
    let mut events = Vec::new();
    stream.push_data_events("message", &String::from_utf8_lossy(line), 0, &mut events);
    let stats = stream.stats();
    stats.chunks == 1 && stats.bad_chunks == 0
}

/// Decides what kind of transcript `bytes` (the file at `path`) is.
pub fn detect(path: &Path, bytes: &[u8]) -> Detection {
    let name = path.file_name().map(|n| n.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
    if name == "requests.jsonl" {
        return Detection::Skip("request log (requests.jsonl)".into());
    }
    for prefix in ["provenance", "inventory", "readme", "license", "licence", "notice", "copying"] {
        if name.starts_with(prefix) {
            return Detection::Skip(format!("{prefix} file"));
        }
    }
    if name.starts_with('.') {
        return Detection::Skip("hidden file".into());
    }
    // Test expectations kept beside transcripts are not model output.
    if name.ends_with(".snap") || name.ends_with(".snap.new") || name.ends_with(".pending-snap") {
        return Detection::Skip("test snapshot (insta), not a transcript".into());
    }
    if name.ends_with(".expected.json") {
        return Detection::Skip("expected test output, not a transcript".into());
    }
    let ext_sse = [".sse", ".bin", ".sse.txt", ".event-stream"];
    if ext_sse.iter().any(|e| name.ends_with(e)) {
        return Detection::Replay(TranscriptKind::Sse);
    }
    if name.ends_with(".chunks.txt") || name.ends_with(".chunks") {
        return Detection::Replay(if looks_like_sse(bytes) { TranscriptKind::Sse } else { TranscriptKind::ChunkLines });
    }
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        return Detection::Replay(TranscriptKind::JsonLines);
    }
    if name.ends_with(".json") {
        return Detection::Replay(TranscriptKind::Json);
    }
    if looks_like_sse(bytes) {
        return Detection::Replay(TranscriptKind::Sse);
    }
    if looks_like_chunk_line(bytes) {
        return Detection::Replay(TranscriptKind::ChunkLines);
    }
    // A file named as text is model output whatever bytes the model wrote
    // (a NUL among them is the parser's to report); a file of another name
    // with NUL bytes is most likely not a transcript (an image, an archive).
    let named_text = [".txt", ".md", ".text", ".log"].iter().any(|e| name.ends_with(e));
    let head = &bytes[..bytes.len().min(8192)];
    if !named_text && head.contains(&0) {
        return Detection::Skip("binary file (NUL bytes)".into());
    }
    Detection::Replay(TranscriptKind::Text)
}

/// One replayed stream of a transcript.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Which stream of the file (`L12` for line 12 of a JSON-lines file);
    /// `None` when the file is one stream.
    pub label: Option<String>,
    /// Its events.
    pub events: Vec<SourceEvent>,
}

/// The result of [`replay`].
#[derive(Debug, Clone)]
pub enum ReplayOutcome {
    /// The streams of the file.
    Streams(Vec<Replayed>),
    /// The file turned out not to be a transcript; why.
    Skip(String),
}

fn with_framing(options: &StreamOptions, framing: Framing) -> StreamOptions {
    let mut options = options.clone();
    options.framing = framing;
    options
}

fn text_stream(options: &StreamOptions, pieces: &[&str]) -> Vec<SourceEvent> {
    let mut stream = ChatStream::new(with_framing(options, Framing::Text));
    let mut events = Vec::new();
    for piece in pieces {
        stream.push_content(0, piece, &mut events);
    }
    stream.finish_into(&mut events);
    events
}

/// Lines of a text, with their byte offsets, without line ends.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut at = 0;
    text.split('\n').map(move |line| {
        let start = at;
        at += line.len() + 1;
        (start, line.strip_suffix('\r').unwrap_or(line))
    })
}

/// Replays one transcript of the given kind.
pub fn replay(kind: TranscriptKind, bytes: &[u8], options: &StreamOptions) -> ReplayOutcome {
    replay_in_reads(kind, bytes, options, usize::MAX)
}

/// Like [`replay`], feeding an SSE body `read_size` bytes at a time (as a
/// socket might deliver it); the events do not depend on it.
pub fn replay_in_reads(kind: TranscriptKind, bytes: &[u8], options: &StreamOptions, read_size: usize) -> ReplayOutcome {
    let one = |events| ReplayOutcome::Streams(vec![Replayed { label: None, events }]);
    match kind {
        TranscriptKind::Sse => {
            let mut tap = StreamTap::new(with_framing(options, Framing::Sse));
            let mut events = Vec::new();
            for read in bytes.chunks(read_size.max(1)) {
                tap.feed_into(read, &mut events);
            }
            tap.finish_into(&mut events);
            one(events)
        }
        TranscriptKind::ChunkLines => {
            let mut tap = LineTap::new(options.clone());
            let mut events = Vec::new();
            for read in bytes.chunks(read_size.max(1)) {
                tap.feed_into(read, &mut events);
            }
            tap.finish_into(&mut events);
            one(events)
        }
        TranscriptKind::Json => {
            let value: Value = match serde_json::from_slice(bytes) {
                Ok(v) => v,
                Err(e) => return ReplayOutcome::Skip(format!("not valid JSON ({e})")),
            };
            match &value {
                Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
                    let pieces: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
                    one(text_stream(options, &pieces))
                }
                // One response, or a stream sent as one JSON array of them
                // (Gemini without `alt=sse`).
                Value::Object(map) if is_response(map) => one(ChatStream::response_events(options.clone(), bytes)),
                Value::Array(items) if is_response_array(items) => {
                    one(ChatStream::response_events(options.clone(), bytes))
                }
                Value::Array(_) => {
                    ReplayOutcome::Skip("a JSON array that is neither string tokens nor responses".into())
                }
                Value::Object(map) => {
                    let keys: Vec<&str> = map.keys().take(6).map(String::as_str).collect();
                    ReplayOutcome::Skip(format!("JSON of an unknown shape (keys: {})", keys.join(", ")))
                }
                _ => ReplayOutcome::Skip("a JSON scalar".into()),
            }
        }
        TranscriptKind::JsonLines => {
            let text = crate::scan::text_lossy(bytes);
            if looks_like_chunk_line(bytes) {
                return replay_in_reads(TranscriptKind::ChunkLines, bytes, options, read_size);
            }
            let mut streams = Vec::new();
            for (n, (_, line)) in lines(&text).enumerate() {
                let Ok(Value::Object(record)) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                if let Some(Value::String(body)) = record.get("text") {
                    streams
                        .push(Replayed { label: Some(format!("L{}", n + 1)), events: text_stream(options, &[body]) });
                }
            }
            if streams.is_empty() {
                ReplayOutcome::Skip("JSON lines without `text` records or chunks".into())
            } else {
                ReplayOutcome::Streams(streams)
            }
        }
        TranscriptKind::Text => {
            let text = crate::scan::text_lossy(bytes);
            one(text_stream(options, &[&text]))
        }
    }
}

/// Whether a JSON object is a response the stream model reads.
fn is_response(map: &serde_json::Map<String, Value>) -> bool {
    let object = map.get("object").and_then(Value::as_str).unwrap_or("");
    let kind = map.get("type").and_then(Value::as_str).unwrap_or("");
    map.contains_key("choices")
        || object.starts_with("chat.completion")
        || object == "text_completion"
        || object == "response"
        || kind == "message"
        || is_converse(map)
        || is_gemini(map)
        || is_ollama(map)
        || is_llama_cpp(map)
        || (map.contains_key("error") && map.len() <= 3)
}

/// Whether a JSON array is a stream of response objects.
fn is_response_array(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|item| item.as_object().is_some_and(is_response))
}

/// The expected content of every (stream, choice), read naively.
type Expected = Vec<(Option<String>, BTreeMap<u32, String>)>;

fn push_text(map: &mut BTreeMap<u32, String>, choice: u32, text: &str) {
    map.entry(choice).or_default().push_str(text);
}

/// The content text a JSON payload carries, per choice (naive reading of
/// the same fields the stream model reads as content).
fn payload_content(v: &Value, map: &mut BTreeMap<u32, String>) {
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for c in choices {
            let index = c.get("index").and_then(Value::as_u64).and_then(|i| u32::try_from(i).ok()).unwrap_or(0);
            map.entry(index).or_default();
            let delta = c.get("delta").filter(|d| d.is_object());
            let message = c.get("message").filter(|_| delta.is_none());
            for part in [delta, message].into_iter().flatten() {
                match part.get("content") {
                    Some(Value::String(s)) => push_text(map, index, s),
                    Some(Value::Array(parts)) => {
                        for p in parts {
                            let t = p.get("type").and_then(Value::as_str);
                            if matches!(t, Some("text" | "output_text")) {
                                push_text(map, index, p.get("text").and_then(Value::as_str).unwrap_or(""));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if let Some(Value::String(s)) = c.get("text") {
                push_text(map, index, s);
            }
        }
        return;
    }
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "content_block_start" => {
            if let Some(b) = v.get("content_block").filter(|b| b.get("type").and_then(Value::as_str) == Some("text")) {
                push_text(map, 0, b.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
        "content_block_delta" => {
            if let Some(d) = v.get("delta").filter(|d| d.get("type").and_then(Value::as_str) == Some("text_delta")) {
                push_text(map, 0, d.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
        "response.output_text.delta" | "text-delta" => {
            push_text(map, 0, v.get("delta").and_then(Value::as_str).unwrap_or(""));
        }
        "message" => {
            for b in v.get("content").and_then(Value::as_array).into_iter().flatten() {
                if b.get("type").and_then(Value::as_str) == Some("text") {
                    push_text(map, 0, b.get("text").and_then(Value::as_str).unwrap_or(""));
                }
            }
        }
        _ => {}
    }
    for candidate in v.get("candidates").and_then(Value::as_array).into_iter().flatten() {
        let index = candidate.get("index").and_then(Value::as_u64).and_then(|i| u32::try_from(i).ok()).unwrap_or(0);
        map.entry(index).or_default();
        let parts = candidate.get("content").and_then(|c| c.get("parts")).and_then(Value::as_array);
        for part in parts.into_iter().flatten() {
            if part.get("thought").and_then(Value::as_bool) != Some(true) {
                push_text(map, index, part.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
    }
    if let Some(chunk) = v.as_object().filter(|o| is_ollama(o)) {
        let message = chunk.get("message").and_then(|m| m.get("content"));
        push_text(map, 0, message.or_else(|| chunk.get("response")).and_then(Value::as_str).unwrap_or(""));
    }
    if let Some(chunk) = v.as_object().filter(|o| is_llama_cpp(o)) {
        push_text(map, 0, chunk.get("content").and_then(Value::as_str).unwrap_or(""));
    }
    if let Some(output) = v.as_object().filter(|o| is_converse(o)).and_then(|o| o.get("output")) {
        for block in
            output.get("message").and_then(|m| m.get("content")).and_then(Value::as_array).into_iter().flatten()
        {
            push_text(map, 0, block.get("text").and_then(Value::as_str).unwrap_or(""));
        }
    }
    if v.get("object").and_then(Value::as_str) == Some("response") {
        for item in v.get("output").and_then(Value::as_array).into_iter().flatten() {
            for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                if part.get("type").and_then(Value::as_str) == Some("output_text") {
                    push_text(map, 0, part.get("text").and_then(Value::as_str).unwrap_or(""));
                }
            }
        }
    }
}

/// Naive SSE: events separated by blank lines, `data:` lines joined by LF.
fn naive_sse_payloads(text: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let normalized = text.replace("\r\n", "\n").replace('\r', "\n");
    let mut out = Vec::new();
    let mut data: Option<String> = None;
    for line in normalized.split('\n') {
        if line.is_empty() {
            if let Some(d) = data.take() {
                out.push(d);
            }
        } else if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_string()),
            }
        } else if line == "data" {
            match &mut data {
                Some(d) => d.push('\n'),
                None => data = Some(String::new()),
            }
        }
    }
    out.extend(data);
    out
}

/// The expected content per stream and choice, or why it cannot be known.
fn expected(kind: TranscriptKind, bytes: &[u8]) -> Result<Expected, String> {
    let text = crate::scan::text_lossy(bytes);
    let from_payloads = |payloads: Vec<String>| -> Result<Expected, String> {
        let mut map = BTreeMap::new();
        let mut i = 0;
        while let Some(p) = payloads.get(i) {
            i += 1;
            if p.trim() == "[DONE]" || p.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(p) {
                Ok(v) => payload_content(&v, &mut map),
                Err(_) => {
                    // A chunk split over two payloads is read joined; a
                    // payload that is not JSON at all carries no content
                    // anyone can read (the stream model reports it).
                    let joined = payloads.get(i).map(|next| format!("{p}{next}"));
                    if let Some(v) = joined.and_then(|j| serde_json::from_str::<Value>(&j).ok()) {
                        payload_content(&v, &mut map);
                        i += 1;
                    }
                }
            }
        }
        Ok(vec![(None, map)])
    };
    match kind {
        TranscriptKind::Sse => from_payloads(naive_sse_payloads(&text)),
        TranscriptKind::ChunkLines => {
            from_payloads(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect())
        }
        TranscriptKind::Json => match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Array(items)) if is_response_array(&items) => {
                let mut map = BTreeMap::new();
                for item in &items {
                    payload_content(item, &mut map);
                }
                Ok(vec![(None, map)])
            }
            Ok(Value::Array(items)) => {
                let joined: String = items.iter().filter_map(Value::as_str).collect();
                Ok(vec![(None, BTreeMap::from([(0, joined)]))])
            }
            Ok(v) => {
                let mut map = BTreeMap::new();
                payload_content(&v, &mut map);
                Ok(vec![(None, map)])
            }
            Err(_) => Err("not JSON".into()),
        },
        TranscriptKind::JsonLines => {
            if looks_like_chunk_line(bytes) {
                return expected(TranscriptKind::ChunkLines, bytes);
            }
            let mut out = Vec::new();
            for (n, line) in text.split('\n').enumerate() {
                let line = line.strip_suffix('\r').unwrap_or(line);
                if let Ok(Value::Object(r)) = serde_json::from_str::<Value>(line)
                    && let Some(Value::String(body)) = r.get("text")
                {
                    out.push((Some(format!("L{}", n + 1)), BTreeMap::from([(0, body.clone())])));
                }
            }
            Ok(out)
        }
        TranscriptKind::Text => Ok(vec![(None, BTreeMap::from([(0, text.into_owned())]))]),
    }
}

/// How a choice fared in the content check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckResult {
    /// Content elements only; their joined text equals the content.
    Equal,
    /// Every content byte is in exactly one element (its text inside its
    /// span), comment, whitespace gap or repair-dropped span.
    Tiled,
    /// Not checkable; why.
    Skipped(String),
    /// Content was lost or invented; what differs.
    Mismatch(String),
}

/// The content check of one choice of one stream.
#[derive(Debug, Clone)]
pub struct ChoiceCheck {
    /// The stream's label within its file.
    pub label: Option<String>,
    /// The choice.
    pub choice: u32,
    /// The outcome.
    pub result: CheckResult,
}

/// Where two texts first differ, for messages.
fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    let mut start = at.saturating_sub(20);
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    let context = |s: &str| {
        let mut end = (at + 40).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let mut begin = start.min(end);
        while !s.is_char_boundary(begin) {
            begin -= 1;
        }
        s[begin..end].to_string()
    };
    format!(
        "lengths {} vs {}, first difference at byte {at}: expected {:?}, got {:?}",
        a.len(),
        b.len(),
        context(a),
        context(b)
    )
}

/// One piece of a choice's content for the tiling check.
#[derive(Debug)]
struct Piece<'a> {
    start: usize,
    end: usize,
    element: Option<ElementCheck<'a>>,
}

/// What an element's span must hold.
#[derive(Debug)]
struct ElementCheck<'a> {
    text: &'a str,
    /// Opened without a tag: the text starts at the span's start.
    open_synthetic: bool,
    /// Where the text ends (the closing tag's offset, or the span's end).
    inner_end: usize,
    close_synthetic: bool,
}

/// Checks one choice's content-channel events against its expected text.
fn check_choice(events: &[&Event], expected: &str) -> CheckResult {
    let mut late = false;
    let mut elements = Vec::new();
    let mut opens = std::collections::HashMap::new();
    let mut closes = std::collections::HashMap::new();
    let mut dropped: Vec<(usize, usize)> = Vec::new();
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    for e in events {
        match e {
            Event::Open(o) => {
                opens.insert(o.id, o.synthetic);
            }
            Event::Close(c) => {
                closes.insert(c.id, (c.at, c.synthetic));
            }
            Event::Repair(r) => {
                if let Some(span) = r.span.filter(|s| !s.is_empty()) {
                    dropped.push((span.start, span.end));
                    pieces.push(Piece { start: span.start, end: span.end, element: None });
                }
            }
            Event::Diagnostic(d) if d.code == DiagnosticCode::DataAfterFinish => late = true,
            Event::Element(el) => {
                if el.truncated {
                    return CheckResult::Skipped("an element was cut at the size limit".into());
                }
                elements.push(el);
                let (inner_end, close_synthetic) = closes.get(&el.id).copied().unwrap_or((el.span.end, true));
                pieces.push(Piece {
                    start: el.span.start,
                    end: el.span.end,
                    element: Some(ElementCheck {
                        text: el.text.as_str(),
                        open_synthetic: opens.get(&el.id).copied().unwrap_or(false),
                        inner_end: inner_end.clamp(el.span.start, el.span.end),
                        close_synthetic,
                    }),
                });
            }
            Event::Comment(c) if c.element.is_none() => {
                pieces.push(Piece { start: c.span.start, end: c.span.end, element: None })
            }
            Event::Gap(g) => pieces.push(Piece { start: g.span.start, end: g.span.end, element: None }),
            _ => {}
        }
    }
    if late {
        return CheckResult::Skipped("content arrived after finish_reason (two parses)".into());
    }
    let joined: String = elements.iter().map(|el| el.text.as_str()).collect();
    if joined == expected && elements.iter().all(|el| &*el.tag == "content") {
        return CheckResult::Equal;
    }
    match tiling(pieces, &dropped, expected) {
        Ok(()) => CheckResult::Tiled,
        Err(why) => {
            CheckResult::Mismatch(format!("{why}; element texts vs content: {}", first_difference(expected, &joined)))
        }
    }
}

/// Checks that an element's span holds its open tag (unless synthetic),
/// exactly its text (less the bytes repairs dropped), and its close tag.
fn check_element(
    el: &ElementCheck<'_>,
    start: usize,
    end: usize,
    dropped: &[(usize, usize)],
    expected: &str,
) -> Result<(), String> {
    let mut kept = String::new();
    let mut at = start;
    let mut inner: Vec<(usize, usize)> =
        dropped.iter().copied().filter(|&(s, e)| s >= start && e <= el.inner_end).collect();
    inner.sort_unstable();
    for (s, e) in inner.into_iter().chain([(el.inner_end, el.inner_end)]) {
        if s > at {
            kept.push_str(expected.get(at..s).unwrap_or(""));
        }
        at = at.max(e);
    }
    let problem = |what: &str| {
        Err(format!(
            "element {what} in span {start}..{end}: text {:?}, span holds {:?}",
            excerpt(el.text, 60),
            excerpt(expected.get(start..end).unwrap_or(""), 80)
        ))
    };
    let Some(prefix) = kept.strip_suffix(el.text) else {
        return problem("text is not what its span holds before the close");
    };
    let tag_like = |s: &str| s.starts_with('<') && s.ends_with('>');
    if el.open_synthetic && !prefix.is_empty() {
        return problem("was opened without a tag but has bytes before its text");
    }
    if !el.open_synthetic && !tag_like(prefix) {
        return problem("has no opening tag before its text");
    }
    let after = expected.get(el.inner_end..end).unwrap_or("");
    if !el.close_synthetic && !after.is_empty() && !after.starts_with('<') {
        return problem("has no closing tag after its text");
    }
    Ok(())
}

/// Whether the pieces cover `expected` exactly (see [`CheckResult::Tiled`]).
fn tiling(mut pieces: Vec<Piece<'_>>, dropped: &[(usize, usize)], expected: &str) -> Result<(), String> {
    pieces.sort_by_key(|p| (p.start, std::cmp::Reverse(p.end)));
    let mut at = 0;
    for piece in pieces {
        let (start, end) = (piece.start, piece.end);
        if end <= at && start < at {
            // Inside the previous piece (a merge's dropped close and reopen).
            continue;
        }
        if start != at {
            return Err(format!(
                "bytes {}..{} belong to no element, comment, gap or repair",
                at.min(start),
                at.max(start)
            ));
        }
        if expected.get(start..end).is_none() {
            return Err(format!("span {start}..{end} is outside the content ({} bytes)", expected.len()));
        }
        if let Some(el) = &piece.element {
            check_element(el, start, end, dropped, expected)?;
        }
        at = end;
    }
    if at != expected.len() {
        return Err(format!("bytes {at}..{} belong to no element", expected.len()));
    }
    Ok(())
}

/// Checks that the content elements of `streams` (replayed from `bytes`)
/// hold exactly the content of the file (see the module docs).
pub fn check_content(kind: TranscriptKind, bytes: &[u8], streams: &[Replayed]) -> Vec<ChoiceCheck> {
    let expected = match expected(kind, bytes) {
        Ok(e) => e,
        Err(why) => {
            return streams
                .iter()
                .map(|s| ChoiceCheck { label: s.label.clone(), choice: 0, result: CheckResult::Skipped(why.clone()) })
                .collect();
        }
    };
    let mut out = Vec::new();
    for stream in streams {
        let Some((_, choices)) = expected.iter().find(|(label, _)| *label == stream.label) else {
            out.push(ChoiceCheck {
                label: stream.label.clone(),
                choice: 0,
                result: CheckResult::Mismatch("the naive reader found no such stream".into()),
            });
            continue;
        };
        let mut seen: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
        for e in &stream.events {
            if let SourceEvent::Choice(c) = e {
                let list = seen.entry(c.choice).or_default();
                if c.channel == Channel::Content {
                    list.push(&c.event);
                }
            }
        }
        let all: std::collections::BTreeSet<u32> = choices.keys().chain(seen.keys()).copied().collect();
        for choice in all {
            let want = choices.get(&choice).map(String::as_str).unwrap_or("");
            let events = seen.get(&choice).map(Vec::as_slice).unwrap_or(&[]);
            out.push(ChoiceCheck { label: stream.label.clone(), choice, result: check_choice(events, want) });
        }
    }
    out
}
