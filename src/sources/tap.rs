//! The per-stream tap: raw bytes of an SSE response in, source events out.
//!
//! This module owns the join of [`SseDecoder`] and [`ChatStream`] for one
//! stream, and the translation of SSE faults into stream diagnostics. It
//! never changes or holds back the bytes it is given, so a proxy can
//! forward every upstream read as it came and hand a copy to the tap; a
//! rewriting proxy uses [`StreamTap::feed_frames`] to get each event's
//! parsed chunk together with the corrected content it made final.
//!
//! ```
//! use spindle::sources::{StreamOptions, StreamTap, SourceEvent};
//!
//! let mut tap = StreamTap::new(StreamOptions::default());
//! let mut events = Vec::new();
//! // Reads as a socket delivers them: split anywhere.
//! for read in ["data: {\"choices\":[{\"index\":0,\"delta\":{\"con", "tent\":\"Hi\"},",
//!              "\"finish_reason\":\"stop\"}]}\n\nda", "ta: [DONE]\n\n"] {
//!     tap.feed_into(read.as_bytes(), &mut events);
//! }
//! tap.finish_into(&mut events);
//! let text: Vec<&str> = events.iter().filter_map(SourceEvent::as_element).map(|e| e.text.as_str()).collect();
//! assert_eq!(text, ["Hi"]);
//! assert!(events.iter().any(|e| matches!(e, SourceEvent::Done)));
//! assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })));
//! ```

use super::chunk::{ChatChunk, Choice, Content, Delta, Nullable};
use super::events::SourceEvent;
use super::model::{CallMark, ChatStream, ChunkUse, StreamOptions};
use super::sse::{SseDecoder, SseFault, SseItem};
use crate::event::DiagnosticCode;
use crate::event::{Diagnostic, Level};

/// One SSE item with what it produced (see [`StreamTap::feed_frames`]).
#[derive(Debug, Clone)]
pub struct TapFrame {
    /// The decoded SSE item (event, comment, fault).
    pub item: SseItem,
    /// The chunk, when the item was an event whose data is one.
    pub chunk: Option<ChatChunk>,
    /// The source events it produced.
    pub events: Vec<SourceEvent>,
    /// Corrected content that became final with this item, per choice (only
    /// with `ParserOptions::rewrite`).
    pub rewrites: Vec<(u32, String)>,
    /// Where call elements ended in that content ([`CallMark`]).
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) call_marks: Vec<CallMark>,
}

/// Appends corrected text (at most one piece per choice, as
/// [`crate::sources::ChatStream::take_rewrites`] gives it) and its marks
/// to `texts` and `marks`, joining pieces of a choice already there (its
/// marks move by the text before them). Empty pieces add nothing.
pub(crate) fn join_marked(
    texts: &mut Vec<(u32, String)>,
    marks: &mut Vec<CallMark>,
    pieces: Vec<(u32, String)>,
    piece_marks: Vec<CallMark>,
) {
    let before =
        |texts: &[(u32, String)], choice: u32| texts.iter().find(|(c, _)| *c == choice).map_or(0, |(_, t)| t.len());
    for mut m in piece_marks {
        m.at += before(texts, m.choice);
        marks.push(m);
    }
    for (choice, text) in pieces {
        if text.is_empty() {
            continue;
        }
        match texts.iter_mut().find(|(c, _)| *c == choice) {
            Some((_, t)) => t.push_str(&text),
            None => texts.push((choice, text)),
        }
    }
}

impl TapFrame {
    /// The frame's chunk with its content replaced by the corrected
    /// content, for a rewriting proxy to serialise instead of the original.
    ///
    /// Every choice of the chunk that carried string (or `null`) content
    /// gets its corrected text, `""` when nothing became final yet (the
    /// parser holds an unfinished tag back). A choice whose corrected text
    /// became final without content in this chunk (the synthetic closes at
    /// its `finish_reason`) gets it as `delta.content` of this chunk, which
    /// clients read before the finish reason. Everything else (ids, model,
    /// usage, reasoning, tool calls, unknown fields) is kept as it came.
    /// `None` when the frame has no chunk.
    pub fn rewritten_chunk(&self) -> Option<ChatChunk> {
        let mut chunk = self.chunk.clone()?;
        let text_of =
            |index: u32| self.rewrites.iter().filter(|(c, _)| *c == index).map(|(_, t)| t.as_str()).collect::<String>();
        let mut placed = Vec::new();
        if let Some(choices) = chunk.choices.as_mut_option() {
            for choice in choices.iter_mut() {
                let index = choice.index.as_option().copied().unwrap_or(0);
                let Some(delta) = choice.delta.as_mut_option() else {
                    continue;
                };
                let text = text_of(index);
                placed.push(index);
                match &mut delta.content {
                    Nullable::Absent | Nullable::Null if text.is_empty() => {}
                    Nullable::Absent | Nullable::Null | Nullable::Value(Content::Text(_)) => {
                        delta.content = Nullable::Value(Content::Text(text));
                    }
                    Nullable::Value(Content::Parts(parts)) => {
                        // Keep the parts that are not answer text (thinking).
                        parts.retain(|p| {
                            !matches!(p.get("type").and_then(|t| t.as_str()), Some("text" | "output_text"))
                        });
                        if !text.is_empty() {
                            parts.push(serde_json::json!({"type": "text", "text": text}));
                        }
                    }
                }
            }
        }
        for (index, text) in &self.rewrites {
            if placed.contains(index) || text.is_empty() {
                continue;
            }
            let choice = Choice {
                index: Nullable::Value(*index),
                delta: Nullable::Value(Delta {
                    content: Nullable::Value(Content::Text(text_of(*index))),
                    ..Delta::default()
                }),
                ..Choice::default()
            };
            match chunk.choices.as_mut_option() {
                Some(choices) => choices.push(choice),
                None => chunk.choices = Nullable::Value(vec![choice]),
            }
            placed.push(*index);
        }
        Some(chunk)
    }
}

/// What is left at the end of a stream (see [`StreamTap::finish_frames`]).
#[derive(Debug, Clone, Default)]
pub struct TapEnd {
    /// The last source events (closes, finish, truncation).
    pub events: Vec<SourceEvent>,
    /// The rest of the corrected content per choice (synthetic closes).
    pub rewrites: Vec<(u32, String)>,
    /// Where call elements ended in that content ([`CallMark`]).
    #[cfg_attr(not(feature = "proxy"), allow(dead_code))]
    pub(crate) call_marks: Vec<CallMark>,
}

/// Raw SSE bytes in, source events out, for one stream.
#[derive(Debug)]
pub struct StreamTap {
    decoder: SseDecoder,
    stream: ChatStream,
    items: Vec<SseItem>,
    ignored_fields: u32,
}

impl StreamTap {
    /// A tap with the given options.
    pub fn new(options: StreamOptions) -> StreamTap {
        StreamTap {
            decoder: SseDecoder::with_limits(options.sse),
            stream: ChatStream::new(options),
            items: Vec::new(),
            ignored_fields: 0,
        }
    }

    /// Feeds raw bytes; returns the events they completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        out
    }

    /// Like [`StreamTap::feed`], appending to `out`.
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SourceEvent>) {
        let mut items = std::mem::take(&mut self.items);
        self.decoder.feed_into(bytes, &mut items);
        for item in items.drain(..) {
            self.item(&item, ChunkUse::EventsOnly, out);
        }
        self.items = items;
    }

    /// Feeds raw bytes and returns one frame per SSE item, each with its
    /// parsed chunk, events and corrected content: what a rewriting proxy
    /// needs to re-serialise the stream.
    pub fn feed_frames(&mut self, bytes: &[u8], frames: &mut Vec<TapFrame>) {
        let mut items = std::mem::take(&mut self.items);
        self.decoder.feed_into(bytes, &mut items);
        for item in items.drain(..) {
            let mut events = Vec::new();
            let chunk = self.item(&item, ChunkUse::Returned, &mut events);
            let mut call_marks = Vec::new();
            let rewrites = self.stream.take_rewrites_marked(&mut call_marks);
            frames.push(TapFrame { item, chunk, events, rewrites, call_marks });
        }
        self.items = items;
    }

    /// Ends the stream; returns the last events.
    pub fn finish(self) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    /// Like [`StreamTap::finish`], appending to `out`.
    pub fn finish_into(self, out: &mut Vec<SourceEvent>) {
        let end = self.finish_frames();
        out.extend(end.events);
    }

    /// Ends the stream; returns the last events and corrected content.
    pub fn finish_frames(mut self) -> TapEnd {
        let mut end = TapEnd::default();
        let items = std::mem::take(&mut self.decoder).finish();
        for item in &items {
            self.item(item, ChunkUse::EventsOnly, &mut end.events);
        }
        let mut marks = Vec::new();
        let rewrites = self.stream.take_rewrites_marked(&mut marks);
        join_marked(&mut end.rewrites, &mut end.call_marks, rewrites, marks);
        // Finishing closes what is open; its corrected text comes after.
        let mut marks = Vec::new();
        let tail = self.stream.finish_with_rewrites_marked(&mut end.events, &mut marks);
        join_marked(&mut end.rewrites, &mut end.call_marks, tail, marks);
        end
    }

    /// Reports that reading the body failed (connection reset, timeout);
    /// the stream will end truncated.
    pub fn transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>) {
        self.stream.push_transport_error(message, out);
    }

    /// Takes the corrected content that became final, per choice (with
    /// `ParserOptions::rewrite`; [`StreamTap::feed_frames`] does this for
    /// every frame, callers of [`StreamTap::feed`] must, or it piles up).
    pub fn take_rewrites(&mut self) -> Vec<(u32, String)> {
        self.stream.take_rewrites()
    }

    /// The stream model (statistics, options).
    pub fn stream(&self) -> &ChatStream {
        &self.stream
    }

    /// Bytes fed so far.
    pub fn offset(&self) -> usize {
        self.decoder.offset()
    }

    /// The events of one SSE item, and its chunk (whole when `chunk_use`
    /// says it is returned).
    fn item(&mut self, item: &SseItem, chunk_use: ChunkUse, out: &mut Vec<SourceEvent>) -> Option<ChatChunk> {
        match item {
            SseItem::Event(e) => self.stream.push_data_as(&e.event, &e.data, e.at, out, chunk_use),
            SseItem::Unterminated(e) => {
                out.push(SourceEvent::Diagnostic(Diagnostic {
                    level: Level::Warning,
                    code: DiagnosticCode::SseUnterminatedEvent,
                    tag: None,
                    element: None,
                    at: Some(e.at),
                    message: "the stream ended without a blank line after its last event; the event was read anyway"
                        .into(),
                }));
                self.stream.push_data_as(&e.event, &e.data, e.at, out, chunk_use)
            }
            SseItem::Comment { .. } => None,
            SseItem::Fault(fault) => {
                let (level, code) = match fault {
                    SseFault::LineTooLong { .. } => (Level::Error, DiagnosticCode::SseLineTooLong),
                    SseFault::EventTooLarge { .. } => (Level::Error, DiagnosticCode::SseEventTooLarge),
                    SseFault::InvalidUtf8 { .. } => (Level::Warning, DiagnosticCode::SseInvalidUtf8),
                    SseFault::IgnoredField { .. } => {
                        self.ignored_fields += 1;
                        if self.ignored_fields > 3 {
                            return None;
                        }
                        (Level::Warning, DiagnosticCode::SseIgnoredField)
                    }
                };
                let at = match fault {
                    SseFault::LineTooLong { at, .. }
                    | SseFault::EventTooLarge { at, .. }
                    | SseFault::InvalidUtf8 { at }
                    | SseFault::IgnoredField { at, .. } => Some(*at),
                };
                out.push(SourceEvent::Diagnostic(Diagnostic {
                    level,
                    code,
                    tag: None,
                    element: None,
                    at,
                    message: fault.to_string(),
                }));
                None
            }
        }
    }
}
