//! The relay of one SSE response: upstream reads in, client bytes and
//! parsed events out. Synchronous and I/O-free; the pump drives it.
//!
//! This module owns what the client receives for a stream: in pass-through
//! mode ([`PassRelay`]) every upstream read, unchanged, in the order it
//! came; in rewrite mode ([`RewriteRelay`]) one re-serialised event per
//! upstream event, carrying the corrected content
//! ([`crate::sources::TapFrame::rewritten_chunk`]). In both modes
//! it owns the ending (and, with tool calling, puts each frame's
//! `tool_calls` into the chunk it re-serialises): a stream that breaks, stalls or (for chat
//! completions) ends without `data: [DONE]` gets an in-band error event
//! and `data: [DONE]`, never a silent clean end. It never touches sockets,
//! timers or sinks.
//!
//! # The ending, by case
//!
//! | how the upstream ended | client gets after the upstream's bytes |
//! |---|---|
//! | `[DONE]`, then EOF (or a reset after `[DONE]`) | nothing more (rewrite: the held `[DONE]`, after the last corrected text; events after `[DONE]` are left out) |
//! | EOF without `[DONE]`, after an upstream error event | `data: [DONE]` |
//! | EOF without `[DONE]`, no error | `upstream_truncated` error event, `data: [DONE]` |
//! | reset, stall, proxy shutdown | that error as an event, `data: [DONE]` |
//!
//! `[DONE]` is added only on `[DONE]`-framed endpoints (chat and legacy
//! completions). A line the upstream never ended is held (see
//! [`PassRelay::forward`]); at a clean end it is forwarded when it is whole
//! (`data: [DONE]`, which then ends the stream as if its line end had
//! come, or a `data:` line of whole JSON), and dropped when it was cut
//! inside its JSON, as a client would drop it;
//! when the upstream stopped after a line but before the blank line of its
//! event, one line end is written first so that the error is an event of
//! its own:
//!
//! ```text
//! data: {"a":1}\n|                 the upstream stopped here
//! data: {"a":1}\n\n|data: {"error":…   that event ends, the error follows
//! ```

use super::calling::response::{CallConverter, ChoiceCalls, Note};
use super::error::{ProxyError, ProxyErrorKind};
use crate::sources::{
    CallMark, ChatChunk, Choice, Content, Delta, ErrorOrigin, Nullable, SourceEvent, SseEvent, SseFault, SseItem,
    StreamOptions, StreamTap, TapEnd, TapFrame, ToolCallDelta, join_marked,
};
use bytes::Bytes;
use serde_json::{Map, Value, json};

/// How the upstream body ended.
#[derive(Debug, Clone)]
pub(crate) enum End {
    /// It ended cleanly.
    Eof,
    /// It broke (reset, stall, shutdown).
    Error(ProxyError),
}

/// What the relay added at the end, for metrics and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EndReport {
    /// The code of the error event the relay wrote, if any.
    pub(crate) error_code: Option<&'static str>,
    /// Whether the relay wrote a `[DONE]` the upstream did not send.
    pub(crate) added_done: bool,
    /// Whether the upstream sent `[DONE]`.
    pub(crate) upstream_done: bool,
}

const DONE: &str = "data: [DONE]\n\n";

/// Most bytes of an unfinished line held back in pass-through mode.
pub(crate) const HOLD_LIMIT: usize = 64 * 1024;

/// Fields of a chunk that every chunk of a stream repeats.
const TEMPLATE_KEYS: [&str; 5] = ["id", "object", "created", "model", "system_fingerprint"];

/// The relay of one SSE response: a [`PassRelay`] or a [`RewriteRelay`],
/// chosen once when the response starts (the pump's "choose mode" phase).
/// Each is boxed: both are several hundred bytes, of differing size, and
/// the relay is made once per response.
#[derive(Debug)]
pub(crate) enum SseRelay {
    /// Every upstream read forwarded unchanged; events parsed on the side.
    Pass(Box<PassRelay>),
    /// Every upstream event re-serialised with the corrected content.
    Rewrite(Box<RewriteRelay>),
}

impl SseRelay {
    /// A relay; `rewrite` sends corrected content, `done_framing` marks an
    /// endpoint whose streams end with `[DONE]`.
    pub(crate) fn new(mut options: StreamOptions, rewrite: bool, done_framing: bool) -> SseRelay {
        options.parser.rewrite = rewrite;
        let watch = Watch::new(options, done_framing);
        if rewrite {
            SseRelay::Rewrite(Box::new(RewriteRelay {
                watch,
                held_done: false,
                template: None,
                last_id: String::new(),
                carry: Vec::new(),
                carry_marks: Vec::new(),
                frames: Vec::new(),
                calls: None,
                pending: Vec::new(),
            }))
        } else {
            SseRelay::Pass(Box::new(PassRelay { watch, tail: [0; 4], tail_len: 0, held: Vec::new(), long_line: false }))
        }
    }

    /// Turns call elements into `tool_calls` (a rewriting relay whose
    /// options leave call text out of the content; a pass-through relay
    /// changes no byte, so it has no calls to convert).
    pub(crate) fn with_calls(mut self, calls: Option<CallConverter>) -> SseRelay {
        if let SseRelay::Rewrite(r) = &mut self {
            r.calls = calls;
        }
        self
    }

    /// Feeds one upstream read: appends what the client gets to `out` and
    /// the parsed events to `events`.
    #[cfg(test)]
    pub(crate) fn feed(&mut self, bytes: Bytes, out: &mut Vec<Bytes>, events: &mut Vec<SourceEvent>) {
        match self {
            SseRelay::Pass(p) => {
                if let Some(now) = p.forward(&bytes) {
                    out.push(now);
                }
                p.observe(&bytes, events);
            }
            SseRelay::Rewrite(r) => r.feed(bytes, out, events),
        }
    }

    /// Ends the stream: appends the last client bytes and events.
    pub(crate) fn end(self, end: End, out: &mut Vec<Bytes>, events: &mut Vec<SourceEvent>) -> EndReport {
        match self {
            SseRelay::Pass(p) => p.end(end, out, events),
            SseRelay::Rewrite(r) => r.end(end, out, events),
        }
    }

    /// The `model` and `id` the response's chunks name.
    pub(crate) fn response_model(&self) -> Option<(String, String)> {
        self.watch().tap.stream().response_model().map(|(m, i)| (m.to_string(), i.to_string()))
    }

    /// Whether the upstream sent `[DONE]` so far.
    pub(crate) fn done_seen(&self) -> bool {
        self.watch().seen.done
    }

    fn watch(&self) -> &Watch {
        match self {
            SseRelay::Pass(p) => &p.watch,
            SseRelay::Rewrite(r) => &r.watch,
        }
    }
}

/// What both relays keep: the parser over the stream and what the stream
/// said about its own end.
#[derive(Debug)]
struct Watch {
    tap: StreamTap,
    seen: Seen,
}

/// What the stream said about its end so far.
#[derive(Debug, Clone, Copy)]
struct Seen {
    done_framing: bool,
    done: bool,
    /// The `[DONE]` came in the last, unterminated event, read at the end.
    done_at_end: bool,
    error: bool,
}

impl Watch {
    fn new(options: StreamOptions, done_framing: bool) -> Watch {
        Watch {
            tap: StreamTap::new(options),
            seen: Seen { done_framing, done: false, done_at_end: false, error: false },
        }
    }

    fn scan(&mut self, events: &[SourceEvent]) {
        self.seen.scan(events);
    }

    /// Ends the parse: the transport error (unless the stream was done) and
    /// the last frames. What the stream said at its end counts: a last
    /// `data: [DONE]` without the blank line after it (or without any line
    /// end) is read then, and it is a `[DONE]` (`Seen::done_at_end`).
    fn finish(mut self, end: &End, events: &mut Vec<SourceEvent>) -> (TapEnd, Seen) {
        if let End::Error(err) = end
            && !self.seen.done
        {
            self.tap.transport_error(err.message(), events);
        }
        let finished = self.tap.finish_frames();
        let before = self.seen.done;
        self.seen.scan(&finished.events);
        self.seen.done_at_end = self.seen.done && !before;
        (finished, self.seen)
    }
}

impl Seen {
    /// Notes the end markers among `events`.
    fn scan(&mut self, events: &[SourceEvent]) {
        for event in events {
            match event {
                SourceEvent::Done => self.done = true,
                SourceEvent::StreamError { origin: ErrorOrigin::InBand | ErrorOrigin::ErrorEvent, .. } => {
                    self.error = true;
                }
                _ => {}
            }
        }
    }

    /// The error event the client needs at the end, if any.
    fn ending_error(self, end: End) -> Option<ProxyError> {
        match end {
            _ if self.done => None,
            End::Error(err) => Some(err),
            End::Eof if self.done_framing && !self.error => Some(ProxyError::new(
                ProxyErrorKind::Truncated,
                "the upstream ended the stream without data: [DONE]; the response is incomplete",
            )),
            End::Eof => None,
        }
    }

    /// Writes the error event and `[DONE]` of the ending (`prefix` first
    /// when one of them is written; `held_done`: a `[DONE]` held back).
    fn write_ending(self, end: End, prefix: &str, held_done: bool, buf: &mut String) -> EndReport {
        let mut report = EndReport { upstream_done: self.done, ..EndReport::default() };
        let needs_done = !self.done && self.done_framing;
        let error = self.ending_error(end);
        if error.is_some() || needs_done {
            buf.push_str(prefix);
        }
        if let Some(err) = error {
            report.error_code = Some(err.code());
            buf.push_str(&err.to_sse_event());
        }
        if held_done {
            buf.push_str(DONE);
        } else if needs_done {
            report.added_done = true;
            buf.push_str(DONE);
        }
        report
    }
}

/// Pass-through: each upstream read goes to the client unchanged (but for
/// an unfinished last line, held until its line end), and is parsed on the
/// side after it was sent.
#[derive(Debug)]
pub(crate) struct PassRelay {
    watch: Watch,
    /// The last bytes written to the client, to find out whether the stream
    /// stands between events.
    tail: [u8; 4],
    tail_len: usize,
    /// The start of a line not yet ended (see `forward`).
    held: Vec<u8>,
    /// The held line passed the limit and streams as it comes.
    long_line: bool,
}

impl PassRelay {
    /// What of an upstream read goes to the client now.
    ///
    /// Everything up to the read's last line end, after the partial line
    /// held from before; the bytes after it (the start of a line) wait for
    /// their line end, at most [`HOLD_LIMIT`] bytes of them. An event
    /// becomes usable to a client only at its blank line, which comes with
    /// (or after) the end of every line before it, so holding a partial
    /// line delays no event; it lets a stream that is cut inside a line
    /// end with a well-formed error event instead of half a JSON chunk.
    /// A line longer than the limit is forwarded as it comes.
    ///
    /// ```text
    /// read: data: {"a":1}\n\ndata: {"b|     forward: data: {"a":1}\n\n   hold: data: {"b
    /// read: ":2}\n\n|                      forward: data: {"b":2}\n\n
    /// ```
    pub(crate) fn forward(&mut self, bytes: &Bytes) -> Option<Bytes> {
        let out = match memchr::memrchr2(b'\n', b'\r', bytes) {
            Some(i) if self.held.is_empty() => Some(bytes.slice(..=i)),
            Some(i) => {
                let mut joined = std::mem::take(&mut self.held);
                joined.extend_from_slice(&bytes[..=i]);
                Some(Bytes::from(joined))
            }
            None if self.long_line => Some(bytes.clone()),
            None => {
                self.held.extend_from_slice(bytes);
                if self.held.len() > HOLD_LIMIT {
                    self.long_line = true;
                    Some(Bytes::from(std::mem::take(&mut self.held)))
                } else {
                    None
                }
            }
        };
        if let Some(i) = memchr::memrchr2(b'\n', b'\r', bytes) {
            self.long_line = false;
            self.held.extend_from_slice(&bytes[i + 1..]);
        }
        if let Some(now) = &out {
            self.remember_tail(now);
        }
        out.filter(|b| !b.is_empty())
    }

    /// Parses an upstream read on the side.
    pub(crate) fn observe(&mut self, bytes: &[u8], events: &mut Vec<SourceEvent>) {
        let start = events.len();
        self.watch.tap.feed_into(bytes, events);
        self.watch.scan(&events[start..]);
    }

    /// Ends the stream: the error event and `[DONE]` the client still
    /// needs, after a line end if the upstream stopped inside an event.
    fn end(mut self, end: End, out: &mut Vec<Bytes>, events: &mut Vec<SourceEvent>) -> EndReport {
        // A clean end after a whole last line the upstream did not end
        // (`data: [DONE]` at EOF): the client gets it as sent, as a direct
        // client would read it. A line cut inside its JSON stays held.
        if matches!(end, End::Eof) && is_whole_data_line(&self.held) {
            let last = Bytes::from(std::mem::take(&mut self.held));
            self.remember_tail(&last);
            out.push(last);
        }
        let (finished, seen) = self.watch.finish(&end, events);
        events.extend(finished.events);
        let mut buf = String::new();
        let report = seen.write_ending(end, boundary_prefix(&self.tail[..self.tail_len]), false, &mut buf);
        if !buf.is_empty() {
            out.push(Bytes::from(buf));
        }
        report
    }

    fn remember_tail(&mut self, bytes: &[u8]) {
        if bytes.len() >= 4 {
            self.tail.copy_from_slice(&bytes[bytes.len() - 4..]);
            self.tail_len = 4;
            return;
        }
        let mut joined = [0u8; 8];
        joined[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        joined[self.tail_len..self.tail_len + bytes.len()].copy_from_slice(bytes);
        let len = self.tail_len + bytes.len();
        let keep = len.min(4);
        self.tail[..keep].copy_from_slice(&joined[len - keep..len]);
        self.tail_len = keep;
    }
}

/// Rewrite: each upstream event re-serialised with the corrected content
/// (and, with tool calling, the `tool_calls` its call elements make).
#[derive(Debug)]
pub(crate) struct RewriteRelay {
    watch: Watch,
    /// `[DONE]` held back until the corrected tail is out.
    held_done: bool,
    template: Option<Map<String, Value>>,
    last_id: String,
    /// Corrected text that became final with an event that had no chunk.
    carry: Vec<(u32, String)>,
    /// Where call elements ended in it.
    carry_marks: Vec<CallMark>,
    frames: Vec<TapFrame>,
    /// Tool calling: call elements become `tool_calls`.
    calls: Option<CallConverter>,
    /// Tool calls (and observations) of frames that had no chunk, for the
    /// next chunk or the tail.
    pending: Vec<ChoiceCalls>,
}

impl RewriteRelay {
    /// Feeds one upstream read: appends what the client gets to `out` and
    /// the parsed events to `events`.
    pub(crate) fn feed(&mut self, bytes: Bytes, out: &mut Vec<Bytes>, events: &mut Vec<SourceEvent>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.watch.tap.feed_frames(&bytes, &mut frames);
        let mut buf = String::new();
        for frame in frames.drain(..) {
            // What follows `[DONE]` is not part of the stream (the stream
            // model ignores it and reports it once): the rewrite leaves it
            // out, so the client's stream still ends with `[DONE]`.
            let after_done = self.watch.seen.done;
            self.watch.scan(&frame.events);
            if !after_done {
                self.write_frame(&frame, &mut buf);
            }
            events.extend(frame.events);
        }
        self.frames = frames;
        if !buf.is_empty() {
            out.push(Bytes::from(buf));
        }
    }

    /// Ends the stream: the corrected tail (synthetic closes, last tool
    /// calls) as one more chunk, then the error event and `[DONE]`.
    fn end(mut self, end: End, out: &mut Vec<Bytes>, events: &mut Vec<SourceEvent>) -> EndReport {
        let (finished, seen) = self.watch.finish(&end, events);
        if let Some(conv) = &mut self.calls {
            let id = self.template.as_ref().and_then(|t| t.get("id")).and_then(Value::as_str).unwrap_or_default();
            self.pending.extend(conv.convert(&finished.events, id));
        }
        events.extend(finished.events);
        let mut buf = String::new();
        let (mut tail, mut marks) = (std::mem::take(&mut self.carry), std::mem::take(&mut self.carry_marks));
        join_marked(&mut tail, &mut marks, finished.rewrites, finished.call_marks);
        if !tail.is_empty() || !self.pending.is_empty() {
            let pending = std::mem::take(&mut self.pending);
            let chunk = tail_chunk(self.template.as_ref(), tail, &marks, pending, self.calls.as_mut());
            write_data(&mut buf, &chunk);
        }
        // A `[DONE]` read only at the end was not written with its frame.
        let report = seen.write_ending(end, "", self.held_done || seen.done_at_end, &mut buf);
        if !buf.is_empty() {
            out.push(Bytes::from(buf));
        }
        report
    }

    fn write_frame(&mut self, frame: &TapFrame, buf: &mut String) {
        match &frame.item {
            SseItem::Event(e) | SseItem::Unterminated(e) => {
                if let Some(original) = &frame.chunk {
                    let template = self.template.get_or_insert_with(Map::new);
                    for key in TEMPLATE_KEYS {
                        if let Some(v) = original.extra.get(key) {
                            template.insert(key.to_string(), v.clone());
                        }
                    }
                    let produced = self.convert_calls(frame);
                    if let Some(mut chunk) = frame.rewritten_chunk() {
                        if let Some(conv) = &mut self.calls {
                            let pending = std::mem::take(&mut self.pending);
                            drop_emptied_content(&mut chunk, original);
                            put_calls(&mut chunk, pending, produced, &frame.call_marks, conv);
                        }
                        self.flush_done(buf);
                        let data = serde_json::to_string(&chunk).unwrap_or_default();
                        self.write_event(buf, e, &data);
                    }
                } else if e.data.trim() == "[DONE]" {
                    let produced = self.convert_calls(frame);
                    self.pending.extend(produced);
                    self.held_done = true;
                    self.carry_over(frame);
                } else {
                    let produced = self.convert_calls(frame);
                    self.pending.extend(produced);
                    self.carry_over(frame);
                    self.flush_done(buf);
                    self.write_event(buf, e, &e.data);
                }
            }
            SseItem::Comment { text, .. } => {
                buf.push(':');
                buf.push_str(text);
                buf.push_str("\n\n");
            }
            SseItem::Fault(fault) => {
                self.carry_over(frame);
                if let SseFault::LineTooLong { limit, .. } | SseFault::EventTooLarge { limit, .. } = fault {
                    // The decoder dropped the event's bytes: say so in the
                    // stream rather than lose content silently.
                    let err = ProxyError::new(
                        ProxyErrorKind::LineTooLong { limit: *limit },
                        format!("{fault}; the rewriting proxy could not forward that event (raise --max-line)"),
                    );
                    self.flush_done(buf);
                    buf.push_str(&err.to_sse_event());
                }
            }
        }
    }

    /// Keeps the corrected text of a frame that has no chunk to carry it,
    /// for the tail.
    fn carry_over(&mut self, frame: &TapFrame) {
        join_marked(&mut self.carry, &mut self.carry_marks, frame.rewrites.clone(), frame.call_marks.clone());
    }

    /// The `tool_calls` a frame's events make (nothing without tool calling).
    fn convert_calls(&mut self, frame: &TapFrame) -> Vec<ChoiceCalls> {
        let Some(conv) = &mut self.calls else { return Vec::new() };
        let id = self.template.as_ref().and_then(|t| t.get("id")).and_then(Value::as_str).unwrap_or_default();
        conv.convert(&frame.events, id)
    }

    /// An event after `[DONE]`: the held `[DONE]` goes first.
    fn flush_done(&mut self, buf: &mut String) {
        if self.held_done {
            self.held_done = false;
            buf.push_str(DONE);
        }
    }

    fn write_event(&mut self, buf: &mut String, e: &SseEvent, data: &str) {
        if e.event != "message" {
            buf.push_str("event: ");
            buf.push_str(&e.event);
            buf.push('\n');
        }
        if e.id != self.last_id {
            buf.push_str("id: ");
            buf.push_str(&e.id);
            buf.push('\n');
            self.last_id.clone_from(&e.id);
        }
        write_data(buf, data);
    }
}

/// `data:` lines for `data` (one per line of it) and the blank line.
fn write_data(buf: &mut String, data: &str) {
    for line in data.split('\n') {
        buf.push_str("data: ");
        buf.push_str(line);
        buf.push('\n');
    }
    buf.push('\n');
}

/// A chunk carrying the last corrected text of each choice (the synthetic
/// closes of a stream that ended without a finish reason) and the last
/// calls, with the ids of the stream's other chunks. Observations go where
/// their calls were in that text (`marks`).
fn tail_chunk(
    template: Option<&Map<String, Value>>,
    tail: Vec<(u32, String)>,
    marks: &[CallMark],
    calls: Vec<ChoiceCalls>,
    mut conv: Option<&mut CallConverter>,
) -> String {
    let mut chunk = template.cloned().unwrap_or_default();
    chunk.entry("object").or_insert_with(|| json!("chat.completion.chunk"));
    let mut texts: Vec<(u32, Option<String>, Vec<ToolCallDelta>)> =
        tail.into_iter().map(|(index, text)| (index, Some(text), Vec::new())).collect();
    for c in placing(Vec::new(), calls, marks) {
        let pos = match texts.iter().position(|t| t.0 == c.choice) {
            Some(p) => p,
            None => {
                texts.push((c.choice, None, Vec::new()));
                texts.len() - 1
            }
        };
        let (_, text, list) = &mut texts[pos];
        if let Some(conv) = conv.as_deref_mut()
            && !c.notes.is_empty()
        {
            conv.place_notes(c.choice, text.get_or_insert_with(String::new), &c.notes, &c.at);
        }
        list.extend(c.calls);
    }
    let choices: Vec<Value> = texts
        .into_iter()
        .map(|(index, text, list)| {
            let mut delta = Delta::default();
            if let Some(text) = text {
                delta.content = Nullable::Value(Content::Text(text));
            }
            if let Some(conv) = conv.as_deref() {
                conv.put_in_delta(&mut delta, list);
            }
            json!({"index": index, "delta": delta, "finish_reason": null})
        })
        .collect();
    chunk.insert("choices".into(), Value::Array(choices));
    Value::Object(chunk).to_string()
}

/// What one choice of a chunk gets: its calls, and its observations with
/// where they go in the chunk's text (element id, offset).
struct Placing {
    choice: u32,
    calls: Vec<ToolCallDelta>,
    notes: Vec<(u32, Note)>,
    at: Vec<(u32, usize)>,
}

/// Gathers per choice what `pending` (from frames before that had no text
/// of their own: their observations go first) and `produced` (placed by
/// `marks`, in the text they arrive with) give, so that each choice's
/// observations are placed in one go (offsets stay those of the text as
/// it came).
fn placing(pending: Vec<ChoiceCalls>, produced: Vec<ChoiceCalls>, marks: &[CallMark]) -> Vec<Placing> {
    let mut out: Vec<Placing> = Vec::new();
    let items = pending.into_iter().map(|i| (i, true)).chain(produced.into_iter().map(|i| (i, false)));
    for (item, earlier) in items {
        let pos = match out.iter().position(|p| p.choice == item.choice) {
            Some(pos) => pos,
            None => {
                out.push(Placing { choice: item.choice, calls: Vec::new(), notes: Vec::new(), at: Vec::new() });
                out.len() - 1
            }
        };
        let p = &mut out[pos];
        if earlier {
            p.at.extend(item.notes.iter().map(|(id, _)| (*id, 0)));
        }
        p.calls.extend(item.calls);
        p.notes.extend(item.notes);
    }
    for p in &mut out {
        p.at.extend(marks_of(marks, p.choice));
    }
    out
}

/// The marks of one choice: (element id, offset).
fn marks_of(marks: &[CallMark], choice: u32) -> Vec<(u32, usize)> {
    marks.iter().filter(|m| m.choice == choice).map(|m| (m.element, m.at)).collect()
}

/// Puts a frame's `tool_calls` and observation text into its chunk (a
/// choice the chunk lacks is added), and `finish_reason: "tool_calls"` on
/// the finish of a choice that made calls. `produced` is the frame's own,
/// whose observations go where their calls were (`marks`, in the chunk's
/// corrected text); `pending` came from frames before that had no chunk,
/// and goes first.
/// Leaves out a choice's `content` that had text and has none once the
/// call text is out of it: a delta that only calls tools has no content,
/// as OpenAI streams one (not `""`, which clients join into the message).
/// An upstream's own `""` (a first chunk's) stays as it came.
fn drop_emptied_content(chunk: &mut ChatChunk, original: &ChatChunk) {
    let had_text = |index: u32| {
        original.choices.as_option().into_iter().flatten().any(|c| {
            c.index.as_option().copied().unwrap_or(0) == index
                && c.delta
                    .as_option()
                    .is_some_and(|d| matches!(&d.content, Nullable::Value(Content::Text(t)) if !t.is_empty()))
        })
    };
    let Some(choices) = chunk.choices.as_mut_option() else { return };
    for choice in choices {
        let index = choice.index.as_option().copied().unwrap_or(0);
        if let Some(delta) = choice.delta.as_mut_option()
            && matches!(&delta.content, Nullable::Value(Content::Text(t)) if t.is_empty())
            && had_text(index)
        {
            delta.content = Nullable::Absent;
        }
    }
}

fn put_calls(
    chunk: &mut ChatChunk,
    pending: Vec<ChoiceCalls>,
    produced: Vec<ChoiceCalls>,
    marks: &[CallMark],
    conv: &mut CallConverter,
) {
    for item in placing(pending, produced, marks) {
        let choices = match &mut chunk.choices {
            Nullable::Value(list) => list,
            other => {
                *other = Nullable::Value(Vec::new());
                match other {
                    Nullable::Value(list) => list,
                    _ => continue,
                }
            }
        };
        let pos = match choices.iter().position(|c| c.index.as_option().copied().unwrap_or(0) == item.choice) {
            Some(p) => p,
            None => {
                choices.push(Choice { index: Nullable::Value(item.choice), ..Choice::default() });
                choices.len() - 1
            }
        };
        let choice = &mut choices[pos];
        if choice.delta.as_option().is_none() {
            choice.delta = Nullable::Value(Delta::default());
        }
        let Some(delta) = choice.delta.as_mut_option() else { continue };
        if !item.notes.is_empty() {
            match &mut delta.content {
                Nullable::Value(Content::Text(t)) => conv.place_notes(item.choice, t, &item.notes, &item.at),
                other => {
                    let mut text = String::new();
                    conv.place_notes(item.choice, &mut text, &item.notes, &[]);
                    add_text(other, &text);
                }
            }
        }
        conv.put_in_delta(delta, item.calls);
    }
    for choice in chunk.choices.as_mut_option().into_iter().flatten() {
        let index = choice.index.as_option().copied().unwrap_or(0);
        if let Some(Content::Text(t)) = choice.delta.as_option().and_then(|d| d.content.as_option()) {
            conv.saw_content(index, t);
        }
        if let Nullable::Value(reason) = &mut choice.finish_reason
            && let Some(new) = conv.finish_reason(index, reason)
        {
            *reason = new.to_string();
        }
    }
}

/// Appends `text` to a delta's or message's content.
fn add_text(content: &mut Nullable<Content>, text: &str) {
    match content {
        Nullable::Value(Content::Text(t)) => t.push_str(text),
        Nullable::Value(Content::Parts(parts)) => parts.push(json!({"type": "text", "text": text})),
        other => *other = Nullable::Value(Content::Text(text.to_string())),
    }
}

/// The line ends to write so that what follows starts a new event, given
/// the last bytes written (`""` between events; a CR at the end swallows
/// the first LF).
/// Whether a line the upstream never ended is whole: `data: [DONE]`, or a
/// `data:` field whose value is a whole JSON document.
fn is_whole_data_line(line: &[u8]) -> bool {
    let Some(value) = line.strip_prefix(b"data:") else { return false };
    let value = value.strip_prefix(b" ").unwrap_or(value);
    value == b"[DONE]" || serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok()
}

fn boundary_prefix(tail: &[u8]) -> &'static str {
    if tail.is_empty() {
        return "";
    }
    let mut ends = 0;
    let mut i = tail.len();
    while i > 0 && ends < 2 {
        match tail[i - 1] {
            b'\n' => {
                i -= 1;
                if i > 0 && tail[i - 1] == b'\r' {
                    i -= 1;
                }
            }
            b'\r' => i -= 1,
            _ => break,
        }
        ends += 1;
    }
    match ends {
        2.. => "",
        1 if tail.last() == Some(&b'\r') => "\n\n",
        1 => "\n",
        _ => "\n\n",
    }
}

/// Parses a whole (non-streamed) response body; with `rewrite`, also
/// returns the body with each choice's `message.content` replaced by its
/// corrected text (`None` when the body is not a JSON object with choices,
/// or nothing changed).
pub(crate) fn whole_response(
    mut options: StreamOptions,
    body: &[u8],
    rewrite: bool,
    calls: Option<CallConverter>,
) -> (Vec<SourceEvent>, Option<Vec<u8>>) {
    if !rewrite {
        return (crate::sources::ChatStream::response_events(options, body), None);
    }
    options.parser.rewrite = true;
    options.framing = crate::sources::Framing::Response;
    let mut stream = crate::sources::ChatStream::new(options);
    let mut events = Vec::new();
    let text = crate::scan::text_lossy(body);
    stream.push_data_events("message", &text, 0, &mut events);
    let (mut rewrites, mut marks) = (Vec::new(), Vec::new());
    let mut piece_marks = Vec::new();
    let piece = stream.take_rewrites_marked(&mut piece_marks);
    join_marked(&mut rewrites, &mut marks, piece, piece_marks);
    let mut piece_marks = Vec::new();
    let piece = stream.finish_with_rewrites_marked(&mut events, &mut piece_marks);
    join_marked(&mut rewrites, &mut marks, piece, piece_marks);
    let Ok(Value::Object(mut doc)) = serde_json::from_slice::<Value>(body) else {
        return (events, None);
    };
    let id = doc.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
    let mut calls = calls.map(CallConverter::for_whole_response);
    let produced = calls.as_mut().map(|c| c.convert(&events, &id)).unwrap_or_default();
    let Some(Value::Array(choices)) = doc.get_mut("choices") else {
        return (events, None);
    };
    let mut changed = false;
    for (pos, choice) in choices.iter_mut().enumerate() {
        let index = choice.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
        let mut text =
            rewrites.iter().find(|(c, _)| u64::from(*c) == index).map(|(_, t)| t.clone()).unwrap_or_default();
        let made = produced.iter().find(|c| u64::from(c.choice) == index);
        if let (Some(made), Some(conv)) = (made, calls.as_mut()) {
            conv.place_notes(made.choice, &mut text, &made.notes, &marks_of(&marks, made.choice));
        }
        if let (Some(conv), Some(Value::String(reason))) = (&calls, choice.get_mut("finish_reason"))
            && let Some(new) = conv.finish_reason(index as u32, reason)
        {
            *reason = new.to_string();
            changed = true;
        }
        let text = text.as_str();
        let Some(message) = choice.get_mut("message").and_then(Value::as_object_mut) else { continue };
        if let (Some(made), Some(conv)) = (made.filter(|m| !m.calls.is_empty()), calls.as_ref()) {
            conv.put_in_message(message, &made.calls);
            changed = true;
            if text.trim().is_empty() {
                // As OpenAI answers a message that only calls tools.
                message.insert("content".into(), Value::Null);
                continue;
            }
        }
        match message.get_mut("content") {
            Some(Value::String(old)) if old != text => {
                *old = text.to_string();
                changed = true;
            }
            Some(Value::Array(parts)) => {
                parts.retain(|p| !matches!(p.get("type").and_then(Value::as_str), Some("text" | "output_text")));
                if !text.is_empty() {
                    parts.push(json!({"type": "text", "text": text}));
                }
                changed = true;
            }
            None | Some(Value::Null) if !text.is_empty() => {
                message.insert("content".into(), Value::String(text.to_string()));
                changed = true;
            }
            _ => {}
        }
    }
    let body = if changed { serde_json::to_vec(&doc).ok() } else { None };
    (events, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;

    fn chunk(content: &str, finish: Option<&str>) -> String {
        let c = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    }

    fn stream(parts: &[(&str, Option<&str>)], done: bool) -> String {
        let mut s = String::new();
        for (c, f) in parts {
            s += &chunk(c, *f);
        }
        if done {
            s += DONE;
        }
        s
    }

    fn options() -> StreamOptions {
        StreamOptions::with_registry(Registry::filament())
    }

    fn run(input: &str, rewrite: bool, read: usize, end: End) -> (String, Vec<SourceEvent>, EndReport) {
        let mut relay = SseRelay::new(options(), rewrite, true);
        let mut out = Vec::new();
        let mut events = Vec::new();
        for piece in input.as_bytes().chunks(read.max(1)) {
            relay.feed(Bytes::copy_from_slice(piece), &mut out, &mut events);
        }
        let report = relay.end(end, &mut out, &mut events);
        let bytes: Vec<u8> = out.iter().flat_map(|b| b.iter().copied()).collect();
        (String::from_utf8(bytes).unwrap_or_default(), events, report)
    }

    /// Contents of the chunks of an SSE text, and whether it ends in [DONE].
    fn contents(sse: &str) -> (Vec<Value>, bool) {
        let mut chunks = Vec::new();
        let mut done = false;
        for block in sse.split("\n\n") {
            let data: Vec<&str> = block.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            if data.is_empty() {
                continue;
            }
            let data = data.join("\n");
            if data == "[DONE]" {
                done = true;
            } else if let Ok(v) = serde_json::from_str::<Value>(&data) {
                chunks.push(v);
            }
        }
        (chunks, done)
    }

    #[test]
    fn pass_through_is_byte_identical_at_every_read_size() {
        let input = stream(&[("<thought>a</thought>", None), ("<content>b", None), ("", Some("stop"))], true);
        for read in [1, 2, 3, 7, 64, input.len()] {
            let (out, events, report) = run(&input, false, read, End::Eof);
            assert_eq!(out, input, "read size {read}");
            assert!(report.upstream_done && report.error_code.is_none() && !report.added_done);
            assert!(events.iter().any(|e| e.as_element().is_some_and(|el| &*el.tag == "content" && el.text == "b")));
        }
    }

    /// A last `data:` line the upstream never ended is read as a client
    /// reads it: a `[DONE]` (with or without its line end) ends the stream
    /// with no error, and a whole JSON chunk is forwarded before the
    /// truncation error; a line cut inside its JSON is not forwarded.
    #[test]
    fn an_unended_last_line_is_what_it_says() {
        let body = stream(&[("<content>Hi", Some("stop"))], false);
        for last in ["data: [DONE]", "data: [DONE]\n", "data:[DONE]"] {
            let input = format!("{body}{last}");
            for read in [5, usize::MAX] {
                let (out, _, report) = run(&input, false, read, End::Eof);
                assert_eq!(out, input, "{last:?} at {read}");
                assert!(report.upstream_done && report.error_code.is_none() && !report.added_done, "{last:?}");
                let (out, _, report) = run(&input, true, read, End::Eof);
                assert!(out.ends_with(DONE) && !out.contains("error"), "{last:?}: {out}");
                assert!(report.error_code.is_none(), "{last:?}");
            }
        }
        let whole = "data: {\"choices\":[]}";
        let (out, _, report) = run(&format!("{body}{whole}"), false, 5, End::Eof);
        assert!(out.starts_with(&format!("{body}{whole}\n\n")), "{out}");
        assert_eq!(report.error_code, Some("upstream_truncated"));
        let (out, _, _) = run(&format!("{body}data: {{\"cho"), false, 5, End::Eof);
        assert!(!out.contains("{\"cho"), "{out}");
    }

    #[test]
    fn endings_table() {
        let body = stream(&[("<content>Hi", None)], false);
        // (input, end, expected suffix after the upstream bytes, error code)
        let reset = || End::Error(ProxyError::new(ProxyErrorKind::Reset, "reset"));
        let cases: Vec<(String, End, Option<&str>, bool)> = vec![
            (format!("{body}{DONE}"), End::Eof, None, false),
            (format!("{body}{DONE}"), reset(), None, false),
            (body.clone(), End::Eof, Some("upstream_truncated"), true),
            (body.clone(), reset(), Some("upstream_reset"), true),
            (format!("{body}data: {{\"error\":{{\"message\":\"boom\"}}}}\n\n"), End::Eof, None, true),
            (format!("{body}data: {{\"cho"), End::Eof, Some("upstream_truncated"), true),
            (format!("{body}data: {{}}\n"), reset(), Some("upstream_reset"), true),
            (format!("{body}data: {{}}\r"), reset(), Some("upstream_reset"), true),
        ];
        for (input, end, code, added_done) in cases {
            let (out, _, report) = run(&input, false, 5, end);
            // An unfinished last line is not forwarded.
            let forwarded = &input[..input.rfind(['\n', '\r']).map_or(0, |i| i + 1)];
            assert!(out.starts_with(forwarded), "{input:?}");
            let rest = &out[forwarded.len()..];
            assert_eq!(report.error_code, code, "{input:?}");
            assert_eq!(report.added_done, added_done, "{input:?}");
            // What follows the upstream's bytes parses as whole events: the
            // partial event is terminated, then the error, then [DONE].
            let mut decoder = crate::sources::SseDecoder::new();
            let mut items = decoder.feed(out.as_bytes());
            items.extend(decoder.finish());
            let datas: Vec<String> = items
                .iter()
                .filter_map(|i| match i {
                    SseItem::Event(e) => Some(e.data.clone()),
                    _ => None,
                })
                .collect();
            assert!(!items.iter().any(|i| matches!(i, SseItem::Unterminated(_))), "{out:?}");
            if let Some(code) = code {
                let error = datas.iter().rev().nth(1).and_then(|d| serde_json::from_str::<Value>(d).ok());
                assert_eq!(error.as_ref().map(|e| e["error"]["code"].clone()), Some(json!(code)), "{out:?}");
            }
            if added_done || code.is_some() {
                assert_eq!(datas.last().map(String::as_str), Some("[DONE]"), "{rest:?}");
            } else {
                assert!(rest.is_empty(), "{rest:?}");
            }
        }
    }

    fn pass_relay() -> PassRelay {
        match SseRelay::new(options(), false, true) {
            SseRelay::Pass(p) => *p,
            SseRelay::Rewrite(_) => unreachable!("rewrite is off"),
        }
    }

    #[test]
    fn forward_holds_only_an_unfinished_line() {
        let mut relay = pass_relay();
        let mut sent = Vec::new();
        for read in ["data: {\"a\":1}\n\ndata: {\"b", "\":2", "}\n", "\n", "data: x\r", "\n\r\n"] {
            sent.push(relay.forward(&Bytes::from(read)).map(|b| String::from_utf8_lossy(&b).into_owned()));
        }
        let want = [
            Some("data: {\"a\":1}\n\n"),
            None,
            Some("data: {\"b\":2}\n"),
            Some("\n"),
            Some("data: x\r"),
            Some("\n\r\n"),
        ];
        assert_eq!(sent, want.map(|w| w.map(str::to_string)));
        // A line past the limit streams as it comes, in every read.
        let mut relay = pass_relay();
        let big = "a".repeat(HOLD_LIMIT);
        assert!(relay.forward(&Bytes::from(format!("data: {big}"))).is_some_and(|b| b.len() > HOLD_LIMIT));
        assert_eq!(relay.forward(&Bytes::from("aaa")).as_deref(), Some(&b"aaa"[..]));
        assert_eq!(relay.forward(&Bytes::from("a\n\ndata: c")).as_deref(), Some(&b"a\n\n"[..]));
        assert_eq!(relay.forward(&Bytes::from("d")), None, "a new line is held again");
    }

    #[test]
    fn boundary_prefixes() {
        for (tail, want) in [
            ("", ""),
            ("}\n\n", ""),
            ("}\r\n\r\n", ""),
            ("\r\r", ""),
            ("\n\r\n", ""),
            ("x\n", "\n"),
            ("x\r\n", "\n"),
            ("x\r", "\n\n"),
            ("xyz", "\n\n"),
        ] {
            assert_eq!(boundary_prefix(tail.as_bytes()), want, "{tail:?}");
        }
    }

    #[test]
    fn rewrite_inserts_closes_before_finish_and_keeps_ids() {
        let input = stream(
            &[
                ("I think", None),
                ("</thought>\n<content>Hel", None),
                ("lo</content>\n<content>", None),
                ("more", None),
                ("", Some("stop")),
            ],
            true,
        );
        let mut seen = None;
        for read in [1, 3, 11, input.len()] {
            let (out, _, report) = run(&input, true, read, End::Eof);
            assert!(report.upstream_done && report.error_code.is_none());
            if let Some(prev) = &seen {
                assert_eq!(&out, prev, "rewrite output depends on read size {read}");
            }
            seen = Some(out.clone());
            let (chunks, done) = contents(&out);
            assert!(done && out.ends_with(DONE));
            assert_eq!(chunks.len(), 5, "one chunk out per chunk in: {out}");
            for c in &chunks {
                assert_eq!((&c["id"], &c["created"], &c["model"]), (&json!("chatcmpl-1"), &json!(7), &json!("m")));
            }
            let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
            assert_eq!(text, "<thought>I think</thought>\n<content>Hellomore</content>");
            let last = chunks.last().cloned().unwrap_or_default();
            assert_eq!(last["choices"][0]["finish_reason"], "stop");
            assert!(last["choices"][0]["delta"]["content"].as_str().is_some_and(|t| t.ends_with("</content>")));
        }
    }

    #[test]
    fn rewrite_of_a_cut_stream_sends_the_closes_then_the_error() {
        let input = stream(&[("<content>Hello", None)], false);
        let (out, _, report) = run(&input, true, 4, End::Error(ProxyError::new(ProxyErrorKind::Stalled, "quiet")));
        assert_eq!(report.error_code, Some("upstream_stalled"));
        let (chunks, done) = contents(&out);
        assert!(done);
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text, "<content>Hello</content>");
        let tail = &chunks[chunks.len() - 2];
        assert_eq!(tail["id"], "chatcmpl-1");
        assert_eq!(chunks.last().map(|c| c["error"]["code"].clone()), Some(json!("upstream_stalled")));
    }

    #[test]
    fn whole_response_rewrite_replaces_content_only() {
        let body = br#"{"id":"c9","object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"I plan.</thought><content>Done"},"finish_reason":"stop"}],"usage":{"total_tokens":3}}"#;
        let (events, rewritten) = whole_response(options(), body, true, None);
        let v: Value = serde_json::from_slice(&rewritten.unwrap_or_default()).unwrap_or_default();
        assert_eq!(v["choices"][0]["message"]["content"], "<thought>I plan.</thought><content>Done</content>");
        assert_eq!((&v["id"], &v["created"], &v["usage"]), (&json!("c9"), &json!(5), &json!({"total_tokens": 3})));
        assert!(events.iter().any(|e| e.as_element().is_some_and(|el| &*el.tag == "content")));
        let (_, untouched) = whole_response(options(), b"<html>nope</html>", true, None);
        assert!(untouched.is_none());
    }

    /// In a whole response nothing was sent before a call completed: with
    /// invalid calls passed, an unreadable call is still not sent as a
    /// tool call (its observation is the content), where a stream sends a
    /// call as soon as its name arrives. Call ids differ between two
    /// responses with the same upstream id.
    #[test]
    fn a_whole_response_sends_only_readable_calls() {
        use crate::calls::ToolCatalog;
        use crate::proxy::InvalidCalls;
        let mut catalog = ToolCatalog::new();
        let tools =
            json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        catalog.add_openai_tools(&tools).unwrap_or_else(|e| panic!("{e}"));
        let catalog = std::sync::Arc::new(catalog);
        let whole = |content: &str| {
            let mut options = StreamOptions::with_registry(Registry::chat());
            let conv = CallConverter::attach(&mut options, catalog.clone(), InvalidCalls::Pass);
            let body = json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]});
            let (_, rewritten) = whole_response(options, body.to_string().as_bytes(), true, Some(conv));
            serde_json::from_slice::<Value>(&rewritten.unwrap_or_default()).unwrap_or_default()
        };
        let bad = whole("<tool_call>{\"name\": \"get_weather\", \"arguments\": [</tool_call>");
        let message = &bad["choices"][0]["message"];
        assert!(message.get("tool_calls").is_none(), "{bad}");
        assert!(message["content"].as_str().is_some_and(|c| c.contains("Observation")), "{bad}");
        let good = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
        let (a, b) = (whole(good), whole(good));
        let id = |v: &Value| v["choices"][0]["message"]["tool_calls"][0]["id"].as_str().map(str::to_string);
        assert!(id(&a).is_some() && id(&b).is_some() && id(&a) != id(&b), "{a} {b}");
        // Streamed, a delta that only calls tools has no content (an
        // upstream's own first "" stays).
        let mut options = StreamOptions::with_registry(Registry::chat());
        let conv = CallConverter::attach(&mut options, catalog.clone(), InvalidCalls::Pass);
        let mut relay = SseRelay::new(options, true, true).with_calls(Some(conv));
        let (mut out, mut events) = (Vec::new(), Vec::new());
        let first =
            json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
        let mut input = format!("data: {first}\n\n");
        for piece in good.as_bytes().chunks(9) {
            input.push_str(&chunk(std::str::from_utf8(piece).unwrap_or_default(), None));
        }
        let last = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        input.push_str(&format!("data: {last}\n\n{DONE}"));
        relay.feed(Bytes::from(input), &mut out, &mut events);
        relay.end(End::Eof, &mut out, &mut events);
        let text: String = out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        let (chunks, done) = contents(&text);
        assert!(done && chunks.iter().any(|c| c["choices"][0]["delta"]["tool_calls"].is_array()), "{text}");
        assert_eq!(chunks[0]["choices"][0]["delta"]["content"], json!(""), "{text}");
        for c in &chunks[1..] {
            assert!(c["choices"][0]["delta"].get("content").is_none(), "{c}");
        }
    }

    /// A request with the legacy `functions` gets its calls as
    /// `function_call`: whole, `{name, arguments}` in the message; streamed,
    /// the name first, then argument fragments; the first call only (a
    /// later one's observation is content); finish reason `function_call`;
    /// never `tool_calls`.
    #[test]
    fn legacy_functions_get_a_function_call() {
        use crate::calls::ToolCatalog;
        use crate::proxy::InvalidCalls;
        use crate::proxy::calling::CallShape;
        let mut catalog = ToolCatalog::new();
        let tools =
            json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
        catalog.add_openai_tools(&tools).unwrap_or_else(|e| panic!("{e}"));
        let catalog = std::sync::Arc::new(catalog);
        let call = |city: &str| {
            format!("<tool_call>{{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"{city}\"}}}}</tool_call>")
        };
        let two = format!("Looking.\n{}\n{}", call("Oslo"), call("Rome"));
        let later = "Observation: Error - Tool get_weather was not run: only one function call per answer";
        for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
            let converter = |options: &mut StreamOptions| {
                CallConverter::attach(options, catalog.clone(), invalid).with_shape(CallShape::FunctionCall)
            };
            // Whole.
            let mut options = StreamOptions::with_registry(Registry::chat());
            let conv = converter(&mut options);
            let body = json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0,
                "message": {"role": "assistant", "content": two}, "finish_reason": "stop"}]});
            let (_, rewritten) = whole_response(options, body.to_string().as_bytes(), true, Some(conv));
            let v: Value = serde_json::from_slice(&rewritten.unwrap_or_default()).unwrap_or_default();
            let message = &v["choices"][0]["message"];
            assert_eq!(message["function_call"], json!({"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}));
            assert!(message.get("tool_calls").is_none(), "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "function_call");
            let content = message["content"].as_str().unwrap_or_default();
            assert!(content.starts_with("Looking.\n") && content.contains(later), "{content:?}");
            // Streamed, with a finish chunk, and ended by [DONE] alone with
            // the call never closed (its fragments go out in the tail).
            let deltas = |text: &str| {
                let chars: Vec<char> = text.chars().collect();
                chars.chunks(5).map(|c| chunk(&c.iter().collect::<String>(), None)).collect::<String>()
            };
            let finished = format!(
                "{}data: {}\n\n",
                deltas(&two),
                json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            );
            let unclosed = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
            for (input, finish) in [(finished, Some("function_call")), (deltas(unclosed), None)] {
                let mut options = StreamOptions::with_registry(Registry::chat());
                let conv = converter(&mut options);
                let mut relay = SseRelay::new(options, true, true).with_calls(Some(conv));
                let (mut out, mut events) = (Vec::new(), Vec::new());
                for piece in format!("{input}{DONE}").as_bytes().chunks(7) {
                    relay.feed(Bytes::copy_from_slice(piece), &mut out, &mut events);
                }
                relay.end(End::Eof, &mut out, &mut events);
                let text: String = out.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
                let (chunks, done) = contents(&text);
                assert!(done && !text.contains("tool_calls"), "{text}");
                let calls: Vec<&Value> =
                    chunks.iter().filter_map(|c| c["choices"][0]["delta"].get("function_call")).collect();
                assert_eq!(calls.first().map(|f| &f["name"]), Some(&json!("get_weather")), "{text}");
                assert!(calls[1..].iter().all(|f| f.get("name").is_none()), "the name comes once, first: {text}");
                let args: String = calls.iter().filter_map(|f| f["arguments"].as_str()).collect();
                assert_eq!(serde_json::from_str::<Value>(&args).ok(), Some(json!({"city": "Oslo"})), "{text}");
                let finishes: Vec<&str> =
                    chunks.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
                assert_eq!(finishes.last().copied(), finish, "{text}");
                if finish.is_some() {
                    let content: String =
                        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
                    assert!(content.starts_with("Looking.\n") && content.contains(later), "{content:?}");
                }
            }
        }
    }
}
