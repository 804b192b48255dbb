//! The mock's transcripts: loading them, choosing one for a request, and
//! turning each kind into an SSE stream or a whole response.
//!
//! This module owns the shapes the mock serves; HTTP is [`super`]'s. What
//! a file is comes from [`crate::sources::transcript::detect`]; recorded
//! SSE frames are served byte for byte, everything else is synthesised in
//! the shape OpenAI uses.

use crate::sources::transcript::{Detection, TranscriptKind, detect};
use crate::sources::{SseDecoder, SseItem};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest transcript file loaded.
const MAX_FILE: u64 = 64 * 1024 * 1024;

/// File endings the mock serves (others, like `.snap` or `.tsv`, are
/// skipped); `.expected.json` files are expectations, not transcripts.
const SERVED: [&str; 7] = [".sse", ".bin", ".event-stream", ".chunks", ".txt", ".json", ".md"];

/// Why transcripts could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MockError {
    /// Reading the directory or a file failed.
    #[error("{path}: {cause}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// Nothing servable was found.
    #[error("no transcripts (.sse, .chunks.txt, .txt, chat-completion .json) under {0}")]
    Empty(PathBuf),
    /// A script could not be loaded, or names a transcript the mock does
    /// not serve.
    #[error("{0}")]
    Script(String),
}

/// What a transcript holds.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    /// A recorded SSE body, split after each blank line, and the data of
    /// its events (for whole responses).
    Sse { frames: Vec<Bytes>, payloads: Vec<String> },
    /// One JSON chunk per line.
    Chunks(Vec<String>),
    /// Plain model output.
    Text(String),
    /// A whole `chat.completion` response, as recorded.
    Response(Bytes),
}

/// One servable transcript.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// Its name: the path below the transcript directory without the
    /// transcript extension (`sse-refusal`, `openai-python-sse/test_x`);
    /// the `model` that picks it.
    pub name: String,
    /// The file name (`sse-refusal.sse`).
    pub file: String,
    pub(crate) body: Body,
}

impl Transcript {
    /// Reads one file; `None` when it is not something the mock serves.
    pub fn from_bytes(name: String, file: String, bytes: &[u8]) -> Option<Transcript> {
        let lower = file.to_ascii_lowercase();
        if lower.ends_with(".expected.json") || !SERVED.iter().any(|e| lower.ends_with(e)) {
            return None;
        }
        let kind = match detect(Path::new(&file), bytes) {
            Detection::Replay(kind) => kind,
            Detection::Skip(_) => return None,
        };
        let body = match kind {
            TranscriptKind::Sse => {
                let mut decoder = SseDecoder::new();
                let mut items = decoder.feed(bytes);
                items.extend(decoder.finish());
                let payloads = items
                    .into_iter()
                    .filter_map(|i| match i {
                        SseItem::Event(e) | SseItem::Unterminated(e) => Some(e.data),
                        _ => None,
                    })
                    .collect();
                Body::Sse { frames: split_events(bytes), payloads }
            }
            TranscriptKind::ChunkLines => {
                let text = String::from_utf8_lossy(bytes);
                Body::Chunks(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
            }
            TranscriptKind::Text => Body::Text(String::from_utf8_lossy(bytes).into_owned()),
            TranscriptKind::Json => {
                let value: Value = serde_json::from_slice(bytes).ok()?;
                value.get("choices")?.as_array()?;
                Body::Response(Bytes::copy_from_slice(bytes))
            }
            _ => return None,
        };
        Some(Transcript { name, file, body })
    }

    /// The kind, for listings: `sse`, `chunks`, `text` or `json`.
    pub fn kind(&self) -> &'static str {
        match self.body {
            Body::Sse { .. } => "sse",
            Body::Chunks(_) => "chunks",
            Body::Text(_) => "text",
            Body::Response(_) => "json",
        }
    }
}

/// The name of a file: its path below the root without the transcript
/// extension.
fn name_of(relative: &Path) -> String {
    let text = relative.to_string_lossy().replace('\\', "/");
    let lower = text.to_ascii_lowercase();
    for suffix in [".chunks.txt", ".sse.txt"] {
        if lower.ends_with(suffix) {
            return text[..text.len() - suffix.len()].to_string();
        }
    }
    match text.rfind('.') {
        Some(dot) if dot > text.rfind('/').map_or(0, |s| s + 1) => text[..dot].to_string(),
        _ => text,
    }
}

/// Loads every servable file under `dir` (recursively, in name order).
/// The transcripts under `dir`, and the paths of its `*.script.toml` files.
pub(crate) fn load_dir(dir: &Path) -> Result<(Vec<Transcript>, Vec<PathBuf>), MockError> {
    let mut files = Vec::new();
    let mut scripts = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|cause| MockError::Io { path: d.clone(), cause })?;
        for entry in entries.flatten() {
            let path = entry.path();
            // A directory itself (a link to one is not followed: no loops).
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if !entry.file_name().to_string_lossy().starts_with('.') {
                    stack.push(path);
                }
                continue;
            }
            // A file, or a link followed to one; only a regular file is
            // read (a FIFO would block, a device never ends).
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if !meta.is_file() {
                continue;
            }
            if entry.file_name().to_string_lossy().ends_with(".script.toml") {
                scripts.push(path);
            } else if meta.len() <= MAX_FILE {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for path in files {
        // At most MAX_FILE bytes, even of a file that grew since it was
        // listed.
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, MAX_FILE), &mut bytes))
            .map_err(|cause| MockError::Io { path: path.clone(), cause })?;
        let relative = path.strip_prefix(dir).unwrap_or(&path);
        let file = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        if let Some(t) = Transcript::from_bytes(name_of(relative), file, &bytes) {
            out.push(t);
        }
    }
    if out.is_empty() {
        return Err(MockError::Empty(dir.to_path_buf()));
    }
    scripts.sort();
    Ok((out, scripts))
}

/// The transcripts served when no directory is given (copies of a few of
/// `corpora/`, so that `spindle demo` works anywhere).
pub(crate) fn builtin() -> Vec<Transcript> {
    let files: [(&str, &str); 6] = [
        ("missing-content-tags-en.txt", include_str!("../../corpora/missing-content-tags-en.txt")),
        ("plain-answer-no-tags-en.txt", include_str!("../../corpora/plain-answer-no-tags-en.txt")),
        ("reasoning-r1-full-think-zh.txt", include_str!("../../corpora/reasoning-r1-full-think-zh.txt")),
        ("sse-filament-tags.sse", include_str!("../../corpora/sse-filament-tags.sse")),
        ("sse-deepseek-reasoning.chunks.txt", include_str!("../../corpora/sse-deepseek-reasoning.chunks.txt")),
        ("sse-parallel-tool-calls.sse", include_str!("../../corpora/sse-parallel-tool-calls.sse")),
    ];
    files
        .iter()
        .filter_map(|(file, text)| {
            Transcript::from_bytes(name_of(Path::new(file)), (*file).to_string(), text.as_bytes())
        })
        .collect()
}

/// Splits an SSE body after each blank line (an event with its comments),
/// keeping every byte.
pub(crate) fn split_events(bytes: &[u8]) -> Vec<Bytes> {
    let mut frames = Vec::new();
    let (mut start, mut line_start, mut i) = (0, 0, 0);
    while i < bytes.len() {
        match bytes[i] {
            b'\n' | b'\r' => {
                let end = if bytes[i] == b'\r' && bytes.get(i + 1) == Some(&b'\n') { i + 2 } else { i + 1 };
                if line_start == i {
                    frames.push(Bytes::copy_from_slice(&bytes[start..end]));
                    start = end;
                }
                line_start = end;
                i = end;
            }
            _ => i += 1,
        }
    }
    if start < bytes.len() {
        frames.push(Bytes::copy_from_slice(&bytes[start..]));
    }
    frames
}

/// The text of a message's `content` (a string, or the text parts).
pub(crate) fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect(),
        _ => String::new(),
    }
}

/// Picks the transcript for a request, and says why.
///
/// 1. `model` equal to a transcript's name (or its file name, or the last
///    segment of its name when that is unique);
/// 2. the last user message naming a transcript (its file name or name;
///    the longest match wins);
/// 3. otherwise a transcript chosen by a hash of the request's `messages`,
///    so that the same request always gets the same transcript (which is
///    what lets a client compare direct and proxied answers).
pub(crate) fn choose<'a>(transcripts: &'a [Transcript], request: &Value) -> Option<(&'a Transcript, &'static str)> {
    if transcripts.is_empty() {
        return None;
    }
    if let Some(model) = request.get("model").and_then(Value::as_str) {
        if let Some(t) = transcripts.iter().find(|t| t.name == model || t.file == model) {
            return Some((t, "model"));
        }
        let tail: Vec<&Transcript> = transcripts.iter().filter(|t| t.name.rsplit('/').next() == Some(model)).collect();
        if let [one] = tail.as_slice() {
            return Some((one, "model"));
        }
    }
    let last_user = request
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user")))
        .and_then(|m| m.get("content"))
        .map(content_text)
        .unwrap_or_default();
    if !last_user.is_empty() {
        let best = transcripts
            .iter()
            .filter_map(|t| {
                [t.file.as_str(), t.name.as_str()]
                    .into_iter()
                    .filter(|n| !n.is_empty() && last_user.contains(n))
                    .map(str::len)
                    .max()
                    .map(|len| (len, t))
            })
            .max_by_key(|(len, _)| *len);
        if let Some((_, t)) = best {
            return Some((t, "message"));
        }
    }
    let messages = request.get("messages").map(Value::to_string).unwrap_or_default();
    let index = (fnv(messages.as_bytes()) % transcripts.len() as u64) as usize;
    transcripts.get(index).map(|t| (t, "hash"))
}

/// FNV-1a: a stable hash (the same in every build and run).
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Splits text into stream pieces the way a tokenizer-driven server sends
/// them: one to three units, a unit being optional leading whitespace and
/// then a word (ASCII letters, digits, `_`, `'`) or one other character
/// (punctuation, one CJK character). `seed` makes it deterministic.
pub(crate) fn pieces(text: &str, seed: u64) -> Vec<&str> {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '\'';
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut units = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let start = chars[i].0;
        while i < chars.len() && chars[i].1.is_whitespace() {
            i += 1;
        }
        if i < chars.len() {
            if is_word(chars[i].1) {
                while i < chars.len() && is_word(chars[i].1) {
                    i += 1;
                }
            } else {
                i += 1;
            }
        }
        let end = chars.get(i).map_or(text.len(), |c| c.0);
        units.push((start, end));
    }
    let mut state = seed | 1;
    let mut out = Vec::new();
    let mut u = 0;
    while u < units.len() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let take = 1 + (state % 3) as usize;
        let last = (u + take).min(units.len()) - 1;
        out.push(&text[units[u].0..units[last].1]);
        u = last + 1;
    }
    out
}

/// What a synthesised response says about itself.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pub(crate) id: String,
    pub(crate) created: i64,
    pub(crate) model: String,
    pub(crate) include_usage: bool,
    pub(crate) prompt_tokens: u64,
}

fn chunk(meta: &Meta, choices: Value) -> Value {
    let mut c = json!({
        "id": meta.id,
        "object": "chat.completion.chunk",
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": "fp_spindle_mock",
        "choices": choices,
    });
    if meta.include_usage
        && let Some(map) = c.as_object_mut()
    {
        map.insert("usage".into(), Value::Null);
    }
    c
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

fn finish_reason_for(name: &str) -> &'static str {
    if name.contains("truncated") { "length" } else { "stop" }
}

/// The SSE frames of a transcript for one request.
pub(crate) fn stream_frames(t: &Transcript, meta: &Meta) -> Vec<Bytes> {
    match &t.body {
        Body::Sse { frames, .. } => frames.clone(),
        Body::Chunks(lines) => {
            let mut out: Vec<Bytes> = lines.iter().map(|l| Bytes::from(format!("data: {l}\n\n"))).collect();
            out.push(Bytes::from_static(b"data: [DONE]\n\n"));
            out
        }
        Body::Text(text) => {
            let parts = pieces(text, fnv(meta.id.as_bytes()));
            let mut out = Vec::with_capacity(parts.len() + 4);
            out.push(sse(&chunk(
                meta,
                json!([{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": null}, "logprobs": null, "finish_reason": null}]),
            )));
            for p in &parts {
                out.push(sse(&chunk(
                    meta,
                    json!([{"index": 0, "delta": {"content": p}, "logprobs": null, "finish_reason": null}]),
                )));
            }
            out.push(sse(&chunk(
                meta,
                json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason_for(&t.name)}]),
            )));
            if meta.include_usage {
                let mut last = chunk(meta, json!([]));
                last["usage"] = usage(meta.prompt_tokens, parts.len() as u64);
                out.push(sse(&last));
            }
            out.push(Bytes::from_static(b"data: [DONE]\n\n"));
            out
        }
        Body::Response(bytes) => response_frames(bytes, meta),
    }
}

/// A whole recorded response, streamed: per choice a role chunk, reasoning,
/// content and refusal in pieces, each tool call whole, the finish chunk.
fn response_frames(bytes: &[u8], meta: &Meta) -> Vec<Bytes> {
    let doc: Value = serde_json::from_slice(bytes).unwrap_or_default();
    let mut meta = meta.clone();
    if let Some(id) = doc.get("id").and_then(Value::as_str) {
        meta.id = id.to_string();
    }
    if let Some(created) = doc.get("created").and_then(Value::as_i64) {
        meta.created = created;
    }
    if let Some(model) = doc.get("model").and_then(Value::as_str) {
        meta.model = model.to_string();
    }
    let mut out = Vec::new();
    let mut completion = 0u64;
    let one = |index: &Value, delta: Value, finish: Value| json!([{"index": index, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    for choice in doc.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let index = choice.get("index").cloned().unwrap_or(json!(0));
        let message = choice.get("message").cloned().unwrap_or_default();
        out.push(sse(&chunk(&meta, one(&index, json!({"role": "assistant", "content": ""}), Value::Null))));
        for field in ["reasoning_content", "reasoning", "content", "refusal"] {
            let text = message.get(field).map(content_text).unwrap_or_default();
            for p in pieces(&text, fnv(meta.id.as_bytes())) {
                completion += 1;
                out.push(sse(&chunk(&meta, one(&index, json!({ field: p }), Value::Null))));
            }
        }
        for (i, call) in message.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let mut call = call.clone();
            if let Some(map) = call.as_object_mut() {
                map.insert("index".into(), json!(i));
            }
            out.push(sse(&chunk(&meta, one(&index, json!({"tool_calls": [call]}), Value::Null))));
        }
        let finish = choice.get("finish_reason").cloned().unwrap_or(json!("stop"));
        out.push(sse(&chunk(&meta, one(&index, json!({}), finish))));
    }
    if meta.include_usage {
        let mut last = chunk(&meta, json!([]));
        last["usage"] = doc.get("usage").cloned().unwrap_or_else(|| usage(meta.prompt_tokens, completion));
        out.push(sse(&last));
    }
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

/// A whole (non-streamed) response: `Ok(body)`, or `Err((status, body))`
/// when the recorded stream carried an error.
pub(crate) fn whole(t: &Transcript, meta: &Meta) -> Result<Bytes, (u16, Value)> {
    match &t.body {
        Body::Response(bytes) => Ok(bytes.clone()),
        Body::Text(text) => {
            let completion = pieces(text, fnv(meta.id.as_bytes())).len() as u64;
            let doc = json!({
                "id": meta.id,
                "object": "chat.completion",
                "created": meta.created,
                "model": meta.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": null, "annotations": []},
                    "logprobs": null,
                    "finish_reason": finish_reason_for(&t.name),
                }],
                "usage": usage(meta.prompt_tokens, completion),
                "system_fingerprint": "fp_spindle_mock",
            });
            Ok(Bytes::from(doc.to_string()))
        }
        Body::Sse { payloads, .. } => assemble(payloads.iter().map(String::as_str), meta),
        Body::Chunks(lines) => assemble(lines.iter().map(String::as_str), meta),
    }
}

/// One choice being assembled from chunks.
#[derive(Debug, Default)]
struct Acc {
    content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    calls: BTreeMap<u64, Value>,
    finish: Value,
}

fn append(slot: &mut Option<String>, v: Option<&Value>) {
    if let Some(text) = v.map(content_text).filter(|t| !t.is_empty()) {
        slot.get_or_insert_with(String::new).push_str(&text);
    }
}

/// Assembles a `chat.completion` from streamed chunk payloads.
fn assemble<'a>(payloads: impl Iterator<Item = &'a str>, meta: &Meta) -> Result<Bytes, (u16, Value)> {
    let mut top: Map<String, Value> = Map::new();
    let mut choices: BTreeMap<u64, Acc> = BTreeMap::new();
    let mut usage_seen = Value::Null;
    for data in payloads {
        let Ok(Value::Object(c)) = serde_json::from_str::<Value>(data.trim()) else { continue };
        if let Some(err) = c.get("error").filter(|e| !e.is_null()) {
            let status = err.get("code").and_then(Value::as_u64).filter(|s| (400..600).contains(s)).unwrap_or(500);
            return Err((status as u16, json!({ "error": err })));
        }
        for key in ["id", "created", "model", "system_fingerprint"] {
            if let Some(v) = c.get(key).filter(|v| !v.is_null()) {
                top.entry(key).or_insert_with(|| v.clone());
            }
        }
        if let Some(u) = c.get("usage").filter(|u| !u.is_null()) {
            usage_seen = u.clone();
        }
        for choice in c.get("choices").and_then(Value::as_array).into_iter().flatten() {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let acc = choices.entry(index).or_default();
            if let Some(delta) = choice.get("delta") {
                append(&mut acc.content, delta.get("content"));
                append(&mut acc.reasoning, delta.get("reasoning_content").or_else(|| delta.get("reasoning")));
                append(&mut acc.refusal, delta.get("refusal"));
                for (pos, call) in delta.get("tool_calls").and_then(Value::as_array).into_iter().flatten().enumerate() {
                    let i = call.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
                    let slot = acc.calls.entry(i).or_insert_with(
                        || json!({"id": null, "type": "function", "function": {"name": "", "arguments": ""}}),
                    );
                    if let Some(id) = call.get("id").filter(|v| !v.is_null()) {
                        slot["id"] = id.clone();
                    }
                    let f = call.get("function");
                    if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                        slot["function"]["name"] = json!(name);
                    }
                    if let Some(args) = f.and_then(|f| f.get("arguments")) {
                        let piece = args.as_str().map(str::to_string).unwrap_or_else(|| args.to_string());
                        let joined = format!("{}{piece}", slot["function"]["arguments"].as_str().unwrap_or(""));
                        slot["function"]["arguments"] = json!(joined);
                    }
                }
            }
            if let Some(f) = choice.get("finish_reason").filter(|f| !f.is_null()) {
                acc.finish = f.clone();
            }
        }
    }
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, acc)| {
            let mut message = json!({"role": "assistant", "content": acc.content, "refusal": acc.refusal});
            if let Some(r) = acc.reasoning {
                message["reasoning_content"] = json!(r);
            }
            if !acc.calls.is_empty() {
                message["tool_calls"] = Value::Array(acc.calls.into_values().collect());
            }
            json!({"index": index, "message": message, "logprobs": null, "finish_reason": acc.finish})
        })
        .collect();
    let doc = json!({
        "id": top.get("id").cloned().unwrap_or_else(|| json!(meta.id)),
        "object": "chat.completion",
        "created": top.get("created").cloned().unwrap_or_else(|| json!(meta.created)),
        "model": top.get("model").cloned().unwrap_or_else(|| json!(meta.model)),
        "choices": choices,
        "usage": usage_seen,
        "system_fingerprint": top.get("system_fingerprint").cloned().unwrap_or(Value::Null),
    });
    Ok(Bytes::from(doc.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO would block the read, a link to a device would never end:
    /// only regular files are read, and a link to a directory is not
    /// followed (no loops).
    #[test]
    #[cfg(target_os = "linux")]
    fn only_regular_files_are_read() {
        let dir = std::env::temp_dir().join(format!("spindle-mock-special-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("ok.txt"), "<content>hi</content>").unwrap_or_else(|e| panic!("{e}"));
        let fifo = std::process::Command::new("mkfifo").arg(dir.join("pipe.sse")).status();
        assert!(fifo.is_ok_and(|s| s.success()), "mkfifo");
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero.txt")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&dir, dir.join("loop")).unwrap_or_else(|e| panic!("{e}"));
        let (transcripts, scripts) = load_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = transcripts.iter().map(|t| t.name.as_str()).collect();
        assert_eq!((names, scripts.len()), (vec!["ok"], 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn split_keeps_every_byte_and_ends_frames_at_blank_lines() {
        let body = b"data: a\n\n: c\ndata: b\r\n\r\ndata: c\r\rtail";
        let frames = split_events(body);
        let joined: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
        assert_eq!(joined, body);
        let texts: Vec<&[u8]> = frames.iter().map(|f| f.as_ref()).collect();
        assert_eq!(texts, [&b"data: a\n\n"[..], b": c\ndata: b\r\n\r\n", b"data: c\r\r", b"tail"]);
    }

    #[test]
    fn pieces_cover_the_text_in_small_steps() {
        for text in ["Hello, world! This is <content>a test</content>.", "纯田真奈走进了茶馆。", "", "  \n\n x"]
        {
            let p = pieces(text, 42);
            assert_eq!(p.concat(), text);
            assert!(p.iter().all(|s| s.chars().filter(|c| !c.is_whitespace()).count() <= 3 * 12), "{p:?}");
            assert_eq!(p, pieces(text, 42), "deterministic");
        }
        assert!(pieces("one two three four five six seven", 7).len() >= 3);
    }

    #[test]
    fn names_and_choice() {
        assert_eq!(name_of(Path::new("sse-refusal.sse")), "sse-refusal");
        assert_eq!(name_of(Path::new("a/deep.chunks.txt")), "a/deep");
        assert_eq!(name_of(Path::new("dir.v2/noext")), "dir.v2/noext");
        let ts = builtin();
        assert!(ts.len() >= 6, "{}", ts.len());
        let by_model = choose(&ts, &json!({"model": "sse-filament-tags", "messages": []}));
        assert_eq!(by_model.map(|(t, why)| (t.name.as_str(), why)), Some(("sse-filament-tags", "model")));
        let by_message = choose(
            &ts,
            &json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "play plain-answer-no-tags-en.txt please"}]}),
        );
        assert_eq!(by_message.map(|(t, why)| (t.name.as_str(), why)), Some(("plain-answer-no-tags-en", "message")));
        let request = json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]});
        let a = choose(&ts, &request).map(|(t, _)| t.name.clone());
        assert_eq!(a, choose(&ts, &request).map(|(t, _)| t.name.clone()), "same request, same transcript");
    }

    #[test]
    fn assembled_response_matches_the_stream() {
        let ts = builtin();
        let meta =
            Meta { id: "chatcmpl-x".into(), created: 1, model: "m".into(), include_usage: true, prompt_tokens: 3 };
        for t in &ts {
            let whole: Value = serde_json::from_slice(&whole(t, &meta).unwrap_or_default()).unwrap_or_default();
            let frames = stream_frames(t, &meta);
            let text: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
            let mut decoder = SseDecoder::new();
            let payloads: Vec<String> = decoder
                .feed(&text)
                .into_iter()
                .filter_map(|i| match i {
                    SseItem::Event(e) => Some(e.data),
                    _ => None,
                })
                .collect();
            assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"), "{}", t.name);
            let again: Value =
                serde_json::from_slice(&assemble(payloads.iter().map(String::as_str), &meta).unwrap_or_default())
                    .unwrap_or_default();
            assert_eq!(
                whole["choices"][0]["message"]["content"], again["choices"][0]["message"]["content"],
                "{}",
                t.name
            );
        }
    }
}
