//! The per-stream tap of a JSON-lines response: raw bytes of a stream that
//! sends one JSON chunk per line (`application/x-ndjson`, as Ollama's own
//! `/api/chat` and `/api/generate` do, or a chunk transcript) in, source
//! events out.
//!
//! This module owns only the cutting of the bytes into lines, split
//! anywhere, and the line limit; what a chunk means is [`ChatStream`]'s.
//! Like [`super::StreamTap`] it never changes or holds back the bytes it is
//! given, so a proxy can forward every read as it came.
//!
//! ```
//! use spindle::sources::{LineTap, SourceEvent, StreamOptions};
//!
//! let mut tap = LineTap::new(StreamOptions::default());
//! let mut events = Vec::new();
//! for read in ["{\"message\":{\"role\":\"assistant\",\"content\":\"Hel", "lo\"},\"done\":false}\n",
//!              "{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\"}\n"] {
//!     tap.feed_into(read.as_bytes(), &mut events);
//! }
//! tap.finish_into(&mut events);
//! let text: Vec<&str> = events.iter().filter_map(SourceEvent::as_element).map(|e| e.text.as_str()).collect();
//! assert_eq!(text, ["Hello"]);
//! assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })));
//! ```

use super::events::SourceEvent;
use super::model::{ChatStream, Framing, StreamOptions};
use crate::event::{Diagnostic, DiagnosticCode, Level};

/// Reads a JSON-lines stream as it arrives (see the module doc). A line
/// longer than the options' `sse.max_line_len` is dropped with an
/// `sse_line_too_long` diagnostic, and the stream goes on at the next line.
#[derive(Debug)]
pub struct LineTap {
    stream: ChatStream,
    /// The line read so far (no newline yet).
    line: Vec<u8>,
    /// Where in the body `line` starts.
    line_at: usize,
    /// The current line passed the limit: its bytes are skipped to its end.
    skipping: bool,
    max_line: usize,
    /// Bytes fed so far.
    offset: usize,
}

impl LineTap {
    /// A tap over a new [`ChatStream`] with [`Framing::Chunks`]: a choice
    /// without a finish (or its dialect's end, Ollama's `done`) at the end
    /// is cut off.
    pub fn new(mut options: StreamOptions) -> LineTap {
        options.framing = Framing::Chunks;
        let max_line = options.sse.max_line_len;
        LineTap { stream: ChatStream::new(options), line: Vec::new(), line_at: 0, skipping: false, max_line, offset: 0 }
    }

    /// Feeds the next bytes (a read, split anywhere); returns the events of
    /// every line they complete.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        out
    }

    /// Ends the stream; returns the last events (see
    /// [`LineTap::finish_into`]).
    pub fn finish(self) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    /// Like [`LineTap::feed`], appending to `out`.
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SourceEvent>) {
        let mut rest = bytes;
        while !rest.is_empty() {
            let (piece, ended) = match memchr::memchr(b'\n', rest) {
                Some(end) => (&rest[..end], true),
                None => (rest, false),
            };
            if !self.skipping {
                if self.line.len() + piece.len() > self.max_line {
                    self.skipping = true;
                    self.line.clear();
                    out.push(SourceEvent::Diagnostic(Diagnostic {
                        level: Level::Error,
                        code: DiagnosticCode::SseLineTooLong,
                        tag: None,
                        element: None,
                        at: Some(self.line_at),
                        message: format!("a line is longer than {} bytes; skipped it", self.max_line),
                    }));
                } else {
                    self.line.extend_from_slice(piece);
                }
            }
            let used = piece.len() + usize::from(ended);
            self.offset += used;
            rest = &rest[used..];
            if ended {
                self.end_line(out);
            }
        }
    }

    /// Ends the stream: a last line without a newline is read, then the
    /// stream's end (finish, truncation) goes to `out`.
    pub fn finish_into(mut self, out: &mut Vec<SourceEvent>) {
        self.end_line(out);
        self.stream.finish_into(out);
    }

    /// [`LineTap::finish_into`], returning each choice's corrected content
    /// not yet taken (with `ParserOptions::rewrite`).
    pub fn finish_with_rewrites(mut self, out: &mut Vec<SourceEvent>) -> Vec<(u32, String)> {
        self.end_line(out);
        self.stream.finish_with_rewrites(out)
    }

    /// Reports that reading the body failed (the connection broke, the
    /// client went away): the stream will end cut off.
    pub fn transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>) {
        self.stream.push_transport_error(message, out);
    }

    /// Corrected content that became final since the last call, per choice
    /// (with `ParserOptions::rewrite`).
    pub fn take_rewrites(&mut self) -> Vec<(u32, String)> {
        self.stream.take_rewrites()
    }

    /// The stream model (statistics, the response's model).
    pub fn stream(&self) -> &ChatStream {
        &self.stream
    }

    /// Bytes fed so far.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Reads the line that just ended (a blank line is nothing).
    fn end_line(&mut self, out: &mut Vec<SourceEvent>) {
        let line = self.line.trim_ascii();
        if !self.skipping && !line.is_empty() {
            self.stream.push_data_events("message", &String::from_utf8_lossy(line), self.line_at, out);
        }
        self.line.clear();
        self.skipping = false;
        self.line_at = self.offset;
    }
}
