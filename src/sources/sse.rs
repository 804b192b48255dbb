//! An incremental decoder for `text/event-stream` bodies, following the
//! WHATWG HTML "server-sent events" parsing rules
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream>).
//!
//! This module owns SSE framing only: bytes in, [`SseItem`]s out. It knows
//! nothing about JSON or chat completions (that is [`super::model`]'s job)
//! and does no I/O.
//!
//! Written here rather than taken from a crate: the maintained SSE crates
//! either pin an old `reqwest` (reqwest-eventsource) or are unmaintained
//! (eventsource-stream), none bounds line or event size, and none reports
//! an event cut off by the end of the stream. DESIGN §10 lists both as
//! crates to avoid.
//!
//! # The rules, as implemented
//!
//! * Lines end with LF, CRLF or a lone CR. A CR that ends one chunk and an
//!   LF that starts the next are one line end:
//!
//!   ```text
//!   data: a\r|\ndata: b      one line end, split between two reads
//!   ```
//!
//!   The line is handed on as soon as its CR arrives; the decoder then
//!   remembers to swallow one LF, so no byte is ever held back for it.
//! * A UTF-8 byte order mark at the very start of the stream is stripped
//!   once, even when it arrives split over several reads (`EF|BB BF`).
//! * A line starting with `:` is a comment ([`SseItem::Comment`]).
//! * `field:value` and `field: value` are the same (one leading space of
//!   the value is stripped); a line without a colon is a field with an
//!   empty value.
//! * `data` lines append their value and a newline to the data buffer; at
//!   dispatch the last newline is removed, so multi-line data is joined
//!   with `\n`.
//! * `event` sets the type of the next event (`message` when unset), `id`
//!   sets the last event id (ignored when it contains NUL; it persists
//!   across events), `retry` sets the reconnection time when it is all
//!   ASCII digits. Other field names are ignored and reported
//!   ([`SseFault::IgnoredField`]): a recorded body whose lines start with
//!   ` data:` (a leading space) is otherwise silently empty.
//! * A blank line dispatches the event; an event whose data buffer is empty
//!   (no `data` line at all) is not dispatched.
//! * Bytes are decoded as UTF-8 per line; invalid sequences become U+FFFD
//!   and are reported ([`SseFault::InvalidUtf8`]).
//! * At the end of the stream an unfinished last line is taken as a line,
//!   and an event that was not followed by a blank line is handed over as
//!   [`SseItem::Unterminated`]: WHATWG discards it, a transcript reader may
//!   want it, and either way the caller learns that the stream was cut.
//!
//! # Limits
//!
//! A line longer than [`SseLimits::max_line_len`] or an event whose data
//! grows past [`SseLimits::max_event_len`] is dropped with an
//! [`SseFault`]; the decoder discards up to the next line end (and drops
//! the rest of that event), then resynchronises. Memory held is bounded by
//! the two limits.
//!
//! # Example
//!
//! ```
//! use spindle::sources::{SseDecoder, SseItem};
//!
//! let mut decoder = SseDecoder::new();
//! let mut items = decoder.feed(b"data: {\"a\":1}\r");
//! items.extend(decoder.feed(b"\n\r\n: keep-alive\nevent: error\ndata: x\n\n"));
//! items.extend(decoder.finish());
//! let events: Vec<(&str, &str)> = items
//!     .iter()
//!     .filter_map(|item| match item {
//!         SseItem::Event(e) => Some((e.event.as_str(), e.data.as_str())),
//!         _ => None,
//!     })
//!     .collect();
//! assert_eq!(events, [("message", "{\"a\":1}"), ("error", "x")]);
//! ```

use std::borrow::Cow;

/// Size limits of an [`SseDecoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseLimits {
    /// Longest line, in bytes, without its line end. Default 4 MiB.
    pub max_line_len: usize,
    /// Largest data buffer of one event, in bytes. Default 4 MiB.
    pub max_event_len: usize,
}

impl Default for SseLimits {
    fn default() -> Self {
        SseLimits { max_line_len: 4 * 1024 * 1024, max_event_len: 4 * 1024 * 1024 }
    }
}

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The event type: the last `event` field, or `message`.
    pub event: String,
    /// The data lines joined with `\n`.
    pub data: String,
    /// The last event id at dispatch (it persists across events).
    pub id: String,
    /// A valid `retry` field seen in this event, in milliseconds.
    pub retry: Option<u64>,
    /// Offset of the event's first field line in the stream (after a BOM).
    pub at: usize,
}

/// A problem the decoder met and recovered from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseFault {
    /// A line was longer than the limit; it was dropped, and so is the event
    /// it belongs to (unless it was a comment line).
    #[error("SSE line at byte {at} is longer than {limit} bytes; dropped it and its event")]
    LineTooLong {
        /// Where the line starts.
        at: usize,
        /// The limit it passed.
        limit: usize,
    },
    /// An event's data grew past the limit; the event was dropped.
    #[error("SSE event at byte {at} has more than {limit} bytes of data; dropped it")]
    EventTooLarge {
        /// Where the event starts.
        at: usize,
        /// The limit it passed.
        limit: usize,
    },
    /// A line held bytes that are not UTF-8; they were replaced by U+FFFD.
    #[error("SSE line at byte {at} is not valid UTF-8; invalid bytes replaced by U+FFFD")]
    InvalidUtf8 {
        /// Where the line starts.
        at: usize,
    },
    /// A field name other than `data`, `event`, `id`, `retry` was ignored.
    #[error("SSE line at byte {at} has unknown field {field:?}; ignored")]
    IgnoredField {
        /// The field name (at most 64 bytes of it).
        field: String,
        /// Where the line starts.
        at: usize,
    },
}

/// What the decoder hands back, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// An event, dispatched by a blank line.
    Event(SseEvent),
    /// A comment line (`: ping`), without its leading colon.
    Comment {
        /// The text after the colon (not trimmed).
        text: String,
        /// Where the line starts.
        at: usize,
    },
    /// An event the stream ended inside (no blank line followed it). Only
    /// [`SseDecoder::finish`] returns this.
    Unterminated(SseEvent),
    /// A recoverable problem.
    Fault(SseFault),
}

/// Whether the start of the stream has been checked for a BOM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bom {
    /// Fewer than three bytes seen, all of them a BOM prefix.
    Pending { held: [u8; 3], len: u8 },
    /// Checked (stripped or absent).
    Done,
}

/// The state of the current line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineState {
    /// Collecting bytes into `line`.
    Collecting,
    /// The line passed the limit: skip to the next line end.
    Discarding,
}

/// The state of the event being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventState {
    /// Fields apply normally.
    Building,
    /// A fault hit this event: drop it at the next blank line.
    Poisoned,
}

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// An incremental `text/event-stream` decoder. Feed it bytes split anywhere.
#[derive(Debug, Clone)]
pub struct SseDecoder {
    limits: SseLimits,
    bom: Bom,
    /// Stream offset of the next byte (after the BOM).
    offset: usize,
    /// The unfinished line (only when it spans reads).
    line: Vec<u8>,
    line_start: usize,
    line_state: LineState,
    /// The previous byte was a CR ending a line: swallow one LF.
    skip_lf: bool,
    data: String,
    event_type: String,
    last_id: String,
    retry: Option<u64>,
    reconnection_time: Option<u64>,
    event_start: Option<usize>,
    event_state: EventState,
}

impl Default for SseDecoder {
    fn default() -> Self {
        SseDecoder::new()
    }
}

impl SseDecoder {
    /// A decoder with default limits.
    pub fn new() -> SseDecoder {
        SseDecoder::with_limits(SseLimits::default())
    }

    /// A decoder with explicit limits.
    pub fn with_limits(limits: SseLimits) -> SseDecoder {
        SseDecoder {
            limits,
            bom: Bom::Pending { held: [0; 3], len: 0 },
            offset: 0,
            line: Vec::new(),
            line_start: 0,
            line_state: LineState::Collecting,
            skip_lf: false,
            data: String::new(),
            event_type: String::new(),
            last_id: String::new(),
            retry: None,
            reconnection_time: None,
            event_start: None,
            event_state: EventState::Building,
        }
    }

    /// Decodes one chunk and returns what it completed.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        out
    }

    /// Like [`SseDecoder::feed`], appending to `out`.
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<SseItem>) {
        let rest = match self.bom {
            Bom::Done => bytes,
            Bom::Pending { mut held, mut len } => {
                // Take bytes while they can still be a BOM:  EF|BB|BF
                let mut used = 0;
                while usize::from(len) < 3 && used < bytes.len() {
                    let b = bytes[used];
                    if BOM.get(usize::from(len)) != Some(&b) {
                        break;
                    }
                    held[usize::from(len)] = b;
                    len += 1;
                    used += 1;
                }
                if len == 3 {
                    self.bom = Bom::Done;
                    &bytes[used..]
                } else if used == bytes.len() {
                    // Every byte so far is a BOM prefix: wait for more.
                    self.bom = Bom::Pending { held, len };
                    return;
                } else {
                    // Not a BOM: the held prefix is ordinary input.
                    self.bom = Bom::Done;
                    let held_len = usize::from(len);
                    self.feed_body(&held[..held_len], out);
                    &bytes[used..]
                }
            }
        };
        self.feed_body(rest, out);
    }

    /// Ends the stream: takes an unfinished last line as a line, and hands
    /// over an event that no blank line dispatched.
    pub fn finish(self) -> Vec<SseItem> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    /// Like [`SseDecoder::finish`], appending to `out`.
    pub fn finish_into(mut self, out: &mut Vec<SseItem>) {
        if let Bom::Pending { held, len } = self.bom {
            self.bom = Bom::Done;
            self.feed_body(&held[..usize::from(len)], out);
        }
        match self.line_state {
            LineState::Discarding => {}
            LineState::Collecting => {
                if !self.line.is_empty() {
                    let line = std::mem::take(&mut self.line);
                    self.process_line(&line, out);
                }
            }
        }
        if self.event_state == EventState::Building && !self.data.is_empty() {
            let event = self.take_event();
            out.push(SseItem::Unterminated(event));
        }
    }

    /// Bytes consumed so far, not counting a stripped BOM.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The reconnection time set by the last valid `retry` field, in ms.
    pub fn reconnection_time(&self) -> Option<u64> {
        self.reconnection_time
    }

    /// The last event id seen (`id` field), which persists across events.
    pub fn last_event_id(&self) -> &str {
        &self.last_id
    }

    /// Bytes held for an unfinished line or event; for memory tests.
    pub fn held_bytes(&self) -> usize {
        self.line.capacity() + self.data.capacity() + self.event_type.capacity()
    }

    fn feed_body(&mut self, bytes: &[u8], out: &mut Vec<SseItem>) {
        let mut i = 0;
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if bytes[0] == b'\n' {
                i = 1;
            }
        }
        while i < bytes.len() {
            let rest = &bytes[i..];
            match memchr::memchr2(b'\r', b'\n', rest) {
                Some(k) => {
                    let seg = &rest[..k];
                    let base = self.offset + i;
                    self.end_line(seg, base, out);
                    i += k + 1;
                    if rest[k] == b'\r' {
                        //  \r|\n  split after the CR: swallow the LF later.
                        match bytes.get(i) {
                            Some(b'\n') => i += 1,
                            Some(_) => {}
                            None => self.skip_lf = true,
                        }
                    }
                    self.line_start = self.offset + i;
                }
                None => {
                    let base = self.offset + i;
                    self.extend_line(rest, base, out);
                    i = bytes.len();
                }
            }
        }
        self.offset += bytes.len();
    }

    /// Adds bytes of a line that continues past this read.
    fn extend_line(&mut self, seg: &[u8], seg_at: usize, out: &mut Vec<SseItem>) {
        if self.line.is_empty() && self.line_state == LineState::Collecting {
            self.line_start = seg_at;
        }
        match self.line_state {
            LineState::Discarding => {}
            LineState::Collecting => {
                if self.line.len() + seg.len() > self.limits.max_line_len {
                    let first = self.line.first().or(seg.first()).copied();
                    self.line_too_long(first, out);
                } else {
                    self.line.extend_from_slice(seg);
                }
            }
        }
    }

    /// Ends the current line with its last bytes `seg` (which start at
    /// `seg_at`) and processes it.
    fn end_line(&mut self, seg: &[u8], seg_at: usize, out: &mut Vec<SseItem>) {
        match self.line_state {
            LineState::Discarding => {
                self.line_state = LineState::Collecting;
            }
            LineState::Collecting if self.line.is_empty() => {
                // The whole line is in this read: no copy.
                self.line_start = seg_at;
                if seg.len() > self.limits.max_line_len {
                    self.line_too_long(seg.first().copied(), out);
                    self.line_state = LineState::Collecting;
                } else {
                    self.process_line(seg, out);
                }
            }
            LineState::Collecting => {
                if self.line.len() + seg.len() > self.limits.max_line_len {
                    let first = self.line.first().copied();
                    self.line_too_long(first, out);
                    self.line_state = LineState::Collecting;
                } else {
                    let mut line = std::mem::take(&mut self.line);
                    line.extend_from_slice(seg);
                    self.process_line(&line, out);
                    line.clear();
                    self.line = line;
                }
            }
        }
    }

    fn line_too_long(&mut self, first: Option<u8>, out: &mut Vec<SseItem>) {
        out.push(SseItem::Fault(SseFault::LineTooLong { at: self.line_start, limit: self.limits.max_line_len }));
        // Give the memory back: the next line starts small.
        self.line = Vec::new();
        self.line_state = LineState::Discarding;
        if first != Some(b':') {
            self.poison();
        }
    }

    fn poison(&mut self) {
        self.event_state = EventState::Poisoned;
        self.data = String::new();
    }

    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseItem>) {
        let at = self.line_start;
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            let text = self.text(&line[1..], at, out).into_owned();
            out.push(SseItem::Comment { text, at });
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(c) => {
                let value = &line[c + 1..];
                (&line[..c], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &line[line.len()..]),
        };
        self.event_start.get_or_insert(at);
        match field {
            b"data" => {
                if self.event_state == EventState::Poisoned {
                    return;
                }
                if self.data.len() + value.len() + 1 > self.limits.max_event_len {
                    out.push(SseItem::Fault(SseFault::EventTooLarge {
                        at: self.event_start.unwrap_or(at),
                        limit: self.limits.max_event_len,
                    }));
                    self.poison();
                    return;
                }
                let text = self.text(value, at, out);
                self.data.push_str(&text);
                self.data.push('\n');
            }
            b"event" => {
                let text = self.text(value, at, out).into_owned();
                self.event_type = text;
            }
            b"id" => {
                if !value.contains(&0) {
                    let text = self.text(value, at, out).into_owned();
                    self.last_id = text;
                }
            }
            b"retry" => {
                if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
                    // All digits; only an overflow can fail, and is ignored.
                    if let Ok(ms) = std::str::from_utf8(value).unwrap_or("").parse::<u64>() {
                        self.retry = Some(ms);
                        self.reconnection_time = Some(ms);
                    }
                }
            }
            other => {
                let shown = &other[..other.len().min(64)];
                out.push(SseItem::Fault(SseFault::IgnoredField {
                    field: String::from_utf8_lossy(shown).into_owned(),
                    at,
                }));
            }
        }
    }

    /// Decodes bytes as UTF-8, reporting replacements.
    fn text<'a>(&self, bytes: &'a [u8], at: usize, out: &mut Vec<SseItem>) -> Cow<'a, str> {
        let text = crate::scan::text_lossy(bytes);
        if let Cow::Owned(_) = text {
            out.push(SseItem::Fault(SseFault::InvalidUtf8 { at }));
        }
        text
    }

    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        if self.event_state == EventState::Poisoned {
            self.reset_event();
            return;
        }
        if self.data.is_empty() {
            // No data field: nothing to dispatch (the id, if any, stays).
            self.reset_event();
            return;
        }
        let event = self.take_event();
        out.push(SseItem::Event(event));
    }

    /// Builds the event from the buffers and resets them.
    fn take_event(&mut self) -> SseEvent {
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event =
            if self.event_type.is_empty() { "message".to_string() } else { std::mem::take(&mut self.event_type) };
        let at = self.event_start.unwrap_or(self.line_start);
        let out = SseEvent { event, data, id: self.last_id.clone(), retry: self.retry.take(), at };
        self.reset_event();
        out
    }

    fn reset_event(&mut self) {
        self.data.clear();
        self.event_type.clear();
        self.retry = None;
        self.event_start = None;
        self.event_state = EventState::Building;
    }
}
