//! The JSON line of an event ([`Event::write_json`]): byte for byte its
//! serde form (what `serde_json::to_writer` writes), written directly.
//!
//! This module owns that writer, and [`JsonLines`], which writes such
//! lines one after another, and nothing else: the shapes and their
//! serde form are [`crate::event`]'s, and the serde form stays the contract.
//! The writer exists for speed. A `spindle parse` of a whole transcript
//! writes about five times its input as JSON (each text appears in its
//! deltas, its element and its payload), and serde's internally tagged
//! form goes through a map serializer per event and escapes strings a byte
//! at a time. Here every event is written field by field, and strings are
//! searched eight bytes at a time for the bytes JSON escapes. A test
//! compares the two forms on every event of the bundled and recorded
//! transcripts.
//!
//! Hand-written because no serializer does this: serde_json's string
//! escaping cannot be replaced through its `Formatter`, and a faster
//! serializer would have to match serde_json's output in every detail
//! (number formatting, escapes, key order) to keep the JSONL contract.

use crate::event::{Event, TagName};
use crate::scan::Span;
use serde_json::Value;
use std::collections::BTreeMap;

impl Event {
    /// Appends the event's JSON (no newline) to `out`: exactly what
    /// `serde_json::to_writer(out, self)` writes, several times faster. For
    /// JSONL writers (`spindle parse`, sinks).
    ///
    /// ```
    /// use spindle::{Registry, parse};
    /// for event in parse(Registry::filament(), b"<content>Hi \"you\"</content>") {
    ///     let mut line = Vec::new();
    ///     event.write_json(&mut line);
    ///     assert_eq!(line, serde_json::to_vec(&event).unwrap());
    /// }
    /// ```
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Event::Open(o) => {
                start(out, b"{\"type\":\"open\",\"id\":", o.id, &o.tag);
                out.extend_from_slice(b",\"raw_tag\":");
                write_str(out, &o.raw_tag);
                out.extend_from_slice(b",\"attrs\":");
                write_attrs(out, &o.attrs);
                end_synthetic_at(out, o.synthetic, o.at);
            }
            Event::Delta(d) => {
                delta_head(out, d.id, &d.tag);
                write_str(out, &d.text);
                out.push(b'}');
            }
            Event::Close(c) => {
                start(out, b"{\"type\":\"close\",\"id\":", c.id, &c.tag);
                end_synthetic_at(out, c.synthetic, c.at);
            }
            Event::Element(e) => {
                start(out, b"{\"type\":\"element\",\"id\":", e.id, &e.tag);
                out.extend_from_slice(b",\"raw_tag\":");
                write_str(out, &e.raw_tag);
                out.extend_from_slice(b",\"attrs\":");
                write_attrs(out, &e.attrs);
                out.extend_from_slice(b",\"text\":");
                write_str(out, &e.text);
                out.extend_from_slice(b",\"payload\":");
                write_value(out, &e.payload);
                out.extend_from_slice(b",\"span\":");
                write_span(out, e.span);
                if e.truncated {
                    out.extend_from_slice(b",\"truncated\":true");
                }
                out.push(b'}');
            }
            Event::Gap(g) => {
                out.extend_from_slice(b"{\"type\":\"gap\",\"text\":");
                write_str(out, &g.text);
                out.extend_from_slice(b",\"span\":");
                write_span(out, g.span);
                out.push(b'}');
            }
            Event::Comment(c) => {
                out.extend_from_slice(b"{\"type\":\"comment\",\"element\":");
                match c.element {
                    Some(id) => write_id(out, id),
                    None => out.extend_from_slice(b"null"),
                }
                out.extend_from_slice(b",\"tag\":");
                write_tag(out, c.tag.as_ref());
                out.extend_from_slice(b",\"text\":");
                write_str(out, &c.text);
                out.extend_from_slice(b",\"span\":");
                write_span(out, c.span);
                out.push(b'}');
            }
            // A few per response, but their texts are long (a diagnostic's
            // message, a fallback's text): serde would escape them a byte
            // at a time.
            Event::Repair(r) => {
                out.extend_from_slice(b"{\"type\":\"repair\",\"kind\":");
                write_str(out, r.kind.as_str());
                out.extend_from_slice(b",\"tag\":");
                write_tag(out, r.tag.as_ref());
                out.extend_from_slice(b",\"at\":");
                write_u64(out, r.at as u64);
                optional(out, b",\"element\":", r.element, write_id);
                optional(out, b",\"span\":", r.span, write_span);
                optional(out, b",\"from\":", r.from.as_deref(), write_str);
                optional(out, b",\"text\":", r.text.as_deref(), write_str);
                out.push(b'}');
            }
            Event::Diagnostic(d) => {
                out.extend_from_slice(b"{\"type\":\"diagnostic\",\"level\":");
                write_str(out, d.level.as_str());
                out.extend_from_slice(b",\"code\":");
                write_str(out, d.code.as_str());
                out.extend_from_slice(b",\"tag\":");
                write_tag(out, d.tag.as_ref());
                optional(out, b",\"element\":", d.element, write_id);
                optional(out, b",\"at\":", d.at, |out, at| write_u64(out, at as u64));
                out.extend_from_slice(b",\"message\":");
                write_str(out, &d.message);
                out.push(b'}');
            }
            Event::CallDelta(c) => {
                start(out, b"{\"type\":\"call_delta\",\"id\":", c.id, &c.tag);
                optional(out, b",\"name\":", c.name.as_deref(), write_str);
                out.extend_from_slice(b",\"arguments\":");
                write_str(out, &c.arguments);
                out.push(b'}');
            }
        }
    }
}

/// A writer of JSON lines: each event as [`Event::write_json`] writes it,
/// then a newline. A run of deltas of one element (a stream read a few
/// bytes at a time is mostly that) shares the start of its lines,
/// `{"type":"delta","id":3,"tag":"content","text":`: it is written once and
/// copied for the next deltas, not written again from the id and tag.
///
/// ```
/// use spindle::{JsonLines, Registry, parse};
/// let events = parse(Registry::filament(), b"<content>Hi \"you\"</content>");
/// let (mut lines, mut out) = (JsonLines::new(), Vec::new());
/// for event in &events {
///     lines.push(event, &mut out);
/// }
/// let expected: String = events.iter().map(|e| serde_json::to_string(e).unwrap() + "\n").collect();
/// assert_eq!(String::from_utf8(out).unwrap(), expected);
/// ```
#[derive(Debug, Default)]
pub struct JsonLines {
    /// The start of the last delta line written, up to its text.
    head: Vec<u8>,
    /// The element (id and tag) whose deltas `head` starts.
    head_of: Option<(u32, TagName)>,
}

impl JsonLines {
    /// A writer with no line written yet.
    pub fn new() -> JsonLines {
        JsonLines::default()
    }

    /// Appends `event`'s JSON line (its JSON and a newline) to `out`.
    pub fn push(&mut self, event: &Event, out: &mut Vec<u8>) {
        match event {
            Event::Delta(d) => {
                let same = matches!(&self.head_of, Some((id, tag)) if *id == d.id && *tag == d.tag);
                if !same {
                    self.head.clear();
                    delta_head(&mut self.head, d.id, &d.tag);
                    self.head_of = Some((d.id, d.tag.clone()));
                }
                out.extend_from_slice(&self.head);
                write_str(out, &d.text);
                out.extend_from_slice(b"}\n");
            }
            _ => {
                event.write_json(out);
                out.push(b'\n');
            }
        }
    }
}

/// How a delta's line starts, up to its text:
/// `{"type":"delta","id":3,"tag":"content","text":`.
#[inline(always)]
fn delta_head(out: &mut Vec<u8>, id: u32, tag: &str) {
    start(out, b"{\"type\":\"delta\",\"id\":", id, tag);
    out.extend_from_slice(b",\"text\":");
}

/// Appends `value` in its serde form: the path of other JSONL writers'
/// rare lines (the sources' own events, hence only with them).
#[cfg(feature = "sources")]
pub(crate) fn write_serde(out: &mut Vec<u8>, value: &impl serde::Serialize) {
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        // Cannot happen: writing to a `Vec` does not fail, and every
        // field serializes. Said in the line, not lost.
        out.extend_from_slice(b"{\"type\":\"error\",\"message\":");
        write_str(out, &e.to_string());
        out.push(b'}');
    }
}

/// How the events of an element start: `{"type":"open","id":3,"tag":"x"`
/// (`head` up to the id). Inlined, so that `head` is a constant: copied by
/// fixed-size moves, not by a call to `memcpy`.
#[inline(always)]
fn start(out: &mut Vec<u8>, head: &[u8], id: u32, tag: &str) {
    out.extend_from_slice(head);
    write_id(out, id);
    out.extend_from_slice(b",\"tag\":");
    write_str(out, tag);
}

/// How `open` and `close` end: `,"synthetic":false,"at":12}`.
fn end_synthetic_at(out: &mut Vec<u8>, synthetic: bool, at: usize) {
    out.extend_from_slice(b",\"synthetic\":");
    write_bool(out, synthetic);
    out.extend_from_slice(b",\"at\":");
    write_u64(out, at as u64);
    out.push(b'}');
}

/// Writes `key` (`,"name":`) and the value when there is one: the fields
/// serde skips when they are `None`.
fn optional<T>(out: &mut Vec<u8>, key: &[u8], value: Option<T>, write: impl FnOnce(&mut Vec<u8>, T)) {
    if let Some(value) = value {
        out.extend_from_slice(key);
        write(out, value);
    }
}

/// Writes an element id.
#[inline]
fn write_id(out: &mut Vec<u8>, id: u32) {
    write_u64(out, u64::from(id));
}

fn write_bool(out: &mut Vec<u8>, b: bool) {
    out.extend_from_slice(if b { b"true" } else { b"false" });
}

pub(crate) fn write_u64(out: &mut Vec<u8>, n: u64) {
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(n).as_bytes();
    let mut block = [0u8; SHORT_BLOCK];
    if place_short(&mut block, 0, digits).is_some() {
        append_block(out, &block, digits.len());
    } else {
        out.extend_from_slice(digits);
    }
}

/// The room of a short piece quoted: a quote, sixteen bytes, a quote.
const SHORT_BLOCK: usize = 18;

/// Copies `bytes` (at most sixteen: `None` for more) into `block` from
/// `at` (0 or 1) by fixed-size pieces, overlapping where the length is not
/// theirs: the first and last eight, or four, or the first, middle and last
/// byte. Returns two words that between them hold every byte and nothing
/// else (spaces where a word has room), for [`escapes`].
///
/// Why: the pieces of a JSON line are short (a tag, a number, the text of
/// a small read), and a copy of a run-time length is a call to `memcpy`,
/// which costs more than such a piece. Fixed-size copies compile to moves.
#[inline(always)]
fn place_short(block: &mut [u8; SHORT_BLOCK], at: usize, bytes: &[u8]) -> Option<(u64, u64)> {
    let len = bytes.len();
    let end = at + len;
    if let (Some(first), Some(last)) = (bytes.first_chunk::<8>(), bytes.last_chunk::<8>()) {
        if len > 16 {
            return None;
        }
        block.get_mut(at..at + 8)?.copy_from_slice(first);
        block.get_mut(end - 8..end)?.copy_from_slice(last);
        return Some((u64::from_le_bytes(*first), u64::from_le_bytes(*last)));
    }
    if let (Some(first), Some(last)) = (bytes.first_chunk::<4>(), bytes.last_chunk::<4>()) {
        block.get_mut(at..at + 4)?.copy_from_slice(first);
        block.get_mut(end - 4..end)?.copy_from_slice(last);
        let word = u64::from(u32::from_le_bytes(*first)) | u64::from(u32::from_le_bytes(*last)) << 32;
        return Some((word, word));
    }
    let mut word = splat(b' ');
    if let (Some(&first), Some(&middle), Some(&last)) = (bytes.first(), bytes.get(len / 2), bytes.last()) {
        block[at] = first;
        block[at + len / 2] = middle;
        block[end - 1] = last;
        word = (word & !0xff_ffff) | u64::from(first) | u64::from(middle) << 8 | u64::from(last) << 16;
    }
    Some((word, word))
}

/// Appends the first `len` bytes of `block` with one fixed-size copy (the
/// whole block, then cut back).
#[inline(always)]
fn append_block(out: &mut Vec<u8>, block: &[u8; SHORT_BLOCK], len: usize) {
    let at = out.len();
    out.extend_from_slice(block);
    out.truncate(at + len);
}

fn write_span(out: &mut Vec<u8>, span: Span) {
    out.push(b'[');
    write_u64(out, span.start as u64);
    out.push(b',');
    write_u64(out, span.end as u64);
    out.push(b']');
}

fn write_tag(out: &mut Vec<u8>, tag: Option<&TagName>) {
    match tag {
        Some(t) => write_str(out, t),
        None => out.extend_from_slice(b"null"),
    }
}

fn write_attrs(out: &mut Vec<u8>, attrs: &BTreeMap<String, String>) {
    write_object(out, attrs, |out, value| write_str(out, value));
}

/// `{"key":value,...}`, each value written by `write`.
fn write_object<'a, V: 'a>(
    out: &mut Vec<u8>,
    entries: impl IntoIterator<Item = (&'a String, &'a V)>,
    write: impl Fn(&mut Vec<u8>, &'a V),
) {
    out.push(b'{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(out, key);
        out.push(b':');
        write(out, value);
    }
    out.push(b'}');
}

/// A JSON value as serde_json writes it (compact, keys in map order).
fn write_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => write_bool(out, *b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => write_u64(out, u),
            (None, Some(i)) => out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes()),
            // A float: serde_json's own `Display`, which its serializer
            // shares (shortest round-trip form).
            (None, None) => out.extend_from_slice(n.to_string().as_bytes()),
        },
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(out, map, write_value),
    }
}

/// Eight copies of a byte.
const fn splat(b: u8) -> u64 {
    0x0101_0101_0101_0101 * b as u64
}

/// The bytes of `word` (little-endian) that JSON escapes (`"`, `\` and
/// the control characters below 0x20), as the high bit of each: the
/// classic word tricks ("has a byte less than n", "has a zero byte").
/// Borrows only run upwards, so the lowest bit set is always a byte to
/// escape (higher ones may be false), which is all this is asked.
fn escapes(word: u64) -> u64 {
    let below = word.wrapping_sub(splat(0x20)) & !word;
    let quote = word ^ splat(b'"');
    let quote = quote.wrapping_sub(splat(1)) & !quote;
    let backslash = word ^ splat(b'\\');
    let backslash = backslash.wrapping_sub(splat(1)) & !backslash;
    (below | quote | backslash) & splat(0x80)
}

/// Where the first byte at or after `from` that JSON escapes is.
fn next_escape(bytes: &[u8], mut from: usize) -> Option<usize> {
    // Thirty-two bytes at a time while none needs escaping: a fold without
    // a branch per byte, which the compiler turns into vector compares.
    while let Some(block) = bytes.get(from..).and_then(<[u8]>::first_chunk::<32>) {
        if block.iter().fold(false, |any, &b| any | (b < 0x20) | (b == b'"') | (b == b'\\')) {
            break;
        }
        from += 32;
    }
    // Eight bytes at a time.
    while let Some(word) = bytes.get(from..).and_then(<[u8]>::first_chunk::<8>) {
        let found = escapes(u64::from_le_bytes(*word));
        if found != 0 {
            return Some(from + found.trailing_zeros() as usize / 8);
        }
        from += 8;
    }
    if from >= bytes.len() {
        return None;
    }
    // The last few bytes: the string's last eight, those before `from`
    // (already read) replaced by spaces, which need nothing (masking them
    // off the result instead would not do: an escaped byte among them
    // borrows into the bytes above it).
    if let Some(word) = bytes.last_chunk::<8>() {
        let skip = from + 8 - bytes.len();
        let read = (1u64 << (8 * skip)) - 1;
        let word = (u64::from_le_bytes(*word) & !read) | (splat(b' ') & read);
        let found = escapes(word);
        return (found != 0).then(|| bytes.len() - 8 + found.trailing_zeros() as usize / 8);
    }
    // A short string, padded with spaces (which need nothing).
    let rest = bytes.get(from..)?;
    let mut word = [b' '; 8];
    word[..rest.len()].copy_from_slice(rest);
    let found = escapes(u64::from_le_bytes(word));
    (found != 0).then(|| from + found.trailing_zeros() as usize / 8)
}

/// A JSON string, escaped as serde_json escapes it: `\"`, `\\`, `\b`,
/// `\f`, `\n`, `\r`, `\t`, other controls as `\u00XX` (lower-case hex),
/// everything else (DEL and non-ASCII included) as it is.
fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    // A short string with nothing to escape (a tag, the text of a small
    // read), quoted in one fixed-size copy.
    let mut block = [b'"'; SHORT_BLOCK];
    if let Some((a, b)) = place_short(&mut block, 1, bytes)
        && escapes(a) | escapes(b) == 0
    {
        return append_block(out, &block, bytes.len() + 2);
    }
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    // Bytes from `run` on are not written yet.
    let mut run = 0;
    while let Some(at) = next_escape(bytes, run) {
        let Some(&b) = bytes.get(at) else { break };
        out.extend_from_slice(&bytes[run..at]);
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        run = at + 1;
    }
    out.extend_from_slice(&bytes[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn serde_str(s: &str) -> Vec<u8> {
        serde_json::to_vec(s).unwrap_or_default()
    }

    fn ours(s: &str) -> Vec<u8> {
        let mut out = Vec::new();
        write_str(&mut out, s);
        out
    }

    #[test]
    fn every_byte_value_escapes_as_serde_json_does() {
        for b in 0u8..=0x7f {
            let s = format!("ab{}cdefghijk{}", b as char, b as char);
            assert_eq!(ours(&s), serde_str(&s), "byte {b:#x}");
        }
        // An escaped byte at each place of strings of each length, with
        // bytes that need nothing but sit right above it (a space: one
        // less than the control characters' bound) and escapes after it;
        // lengths past two blocks of thirty-two.
        for len in 1..80 {
            for at in 0..len {
                for (b, after) in [(b'\r', b' '), (b'"', b'!'), (b'\\', b']'), (0, b' '), (b'\n', b'\t')] {
                    let mut bytes = vec![b'a'; len];
                    bytes[at] = b;
                    bytes[at + 1..].fill(after);
                    let s = String::from_utf8(bytes).unwrap_or_default();
                    assert_eq!(ours(&s), serde_str(&s), "{s:?}");
                }
            }
        }
        for s in ["", "\"", "\\", "é日本\u{2028}\u{7f}", "12345678\n", "1234567\n8", "\u{1}\u{1f}\u{0}", "日\r aa\t"]
        {
            assert_eq!(ours(s), serde_str(s), "{s:?}");
        }
    }

    #[test]
    fn the_word_test_finds_the_first_escaped_byte_at_each_position() {
        let escaped = (0u8..0x20).chain([b'"', b'\\']);
        for at in 0..8 {
            for b in escaped.clone() {
                // Whatever lies above it (escaped bytes too), whatever that
                // needs nothing lies below.
                for above in 0u8..=0xff {
                    for below in [b'a', b' ', 0x7f, 0x80, 0xff] {
                        let mut word = [below; 8];
                        word[at] = b;
                        word[at + 1..].fill(above);
                        let found = escapes(u64::from_le_bytes(word));
                        assert_eq!(found.trailing_zeros() as usize / 8, at, "{b:#x} at {at} under {above:#x}");
                    }
                }
            }
            for b in (0x20u8..=0xff).filter(|b| !matches!(b, b'"' | b'\\')) {
                let mut word = [b'a'; 8];
                word[at] = b;
                assert_eq!(escapes(u64::from_le_bytes(word)), 0, "{b:#x} at {at}");
            }
        }
    }

    #[test]
    fn numbers_of_every_length_are_written_as_serde_json_does() {
        let mut n = 1u64;
        let mut cases = vec![0, u64::MAX];
        for _ in 0..20 {
            cases.extend([n - 1, n, n + 1, n.saturating_mul(7)]);
            n = n.saturating_mul(10);
        }
        for n in cases {
            let mut out = b"x".to_vec();
            write_u64(&mut out, n);
            assert_eq!(out, format!("x{n}").as_bytes(), "{n}");
        }
    }

    #[test]
    fn short_strings_are_written_whole_after_what_came_before() {
        // Every length around the pieces' sizes, after a line of each
        // length (the copy writes past the end and cuts back).
        for len in 0..20 {
            let s: String = "abcdefghijklmnopqrstuvwxyz".chars().take(len).collect();
            for before in 0..4 {
                let mut out = vec![b'-'; before];
                write_str(&mut out, &s);
                out.push(b'|');
                assert_eq!(out, format!("{}\"{s}\"|", "-".repeat(before)).as_bytes(), "{s:?}");
            }
        }
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        let value = serde_json::json!({
            "z": [1, -2, 3.5, 1e300, -0.0, 18446744073709551615u64, -9223372036854775808i64],
            "a": {"nested": [null, true, false, "x\ty"], "empty": {}, "list": []},
            "\u{1}key": "v\"al",
        });
        let mut out = Vec::new();
        write_value(&mut out, &value);
        assert_eq!(out, serde_json::to_vec(&value).unwrap_or_default());
    }

    #[test]
    fn repairs_diagnostics_and_call_deltas_are_written_as_serde_json_writes_them() {
        use crate::event::{CallDelta, Diagnostic, DiagnosticCode, Level, Repair, RepairKind};
        let mut events = Vec::new();
        // Each optional field present and absent, with texts to escape.
        for (i, &kind) in RepairKind::ALL.iter().enumerate() {
            for mask in 0..32u32 {
                let on = |bit: u32| mask & (1 << bit) != 0;
                events.push(Event::Repair(Box::new(Repair {
                    kind,
                    tag: on(0).then(|| TagName::from("content")),
                    at: i * 1000,
                    element: on(1).then_some(7),
                    span: on(2).then(|| Span::new(3, 40)),
                    from: on(3).then(|| "Thought \"x\"".to_string()),
                    text: on(4).then(|| "line\none\t<b>é日</b>\u{1}".repeat(3)),
                })));
            }
        }
        for (i, &code) in DiagnosticCode::ALL.iter().enumerate() {
            for (level, mask) in [(Level::Info, 0u32), (Level::Warning, 5), (Level::Error, 2), (Level::Warning, 7)] {
                events.push(Event::Diagnostic(Diagnostic {
                    level,
                    code,
                    tag: (mask & 1 != 0).then(|| TagName::from("status_bar")),
                    element: (mask & 2 != 0).then_some(u32::MAX),
                    at: (mask & 4 != 0).then_some(i),
                    message: format!("the <x> \"body\" is\nnot JSON: {i}"),
                }));
            }
        }
        for name in [None, Some("get_weather"), Some("a \"quoted\" name")] {
            for arguments in ["", "{\"city\": \"Par", "is\\n\u{1}\"}"] {
                let (name, arguments) = (name.map(str::to_string), arguments.to_string());
                events.push(Event::CallDelta(CallDelta { id: 3, tag: TagName::from("tool_call"), name, arguments }));
            }
        }
        for event in &events {
            let mut out = Vec::new();
            event.write_json(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), serde_json::to_string(event).unwrap_or_default());
        }
    }

    /// Pieces of responses that make every kind of event: elements of
    /// each payload kind, attributes, comments, repairs, diagnostics, tool
    /// calls, escapes and control characters.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("<thought>".to_string()),
            Just("</thought>".to_string()),
            Just("<content>".to_string()),
            Just("</content>".to_string()),
            Just("<status_bar><hp>3/5</hp><mood>\"ok\"</mood></status_bar>".to_string()),
            Just("<variable_update>[[\"SET\", \"a.b\", 1.5], [\"ADD\", \"n\", -2]]</variable_update>".to_string()),
            Just("<variable_update>[[\"NOPE\", 1]]</variable_update>".to_string()),
            Just("<choice><option>A \\ B</option><option>C</option></choice>".to_string()),
            Just("<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, null, true]}}</tool_call>".to_string()),
            Just("<span style=\"color: red\" onclick=\"x\">".to_string()),
            Just("<!-- note -->".to_string()),
            Just("<|im_end|>".to_string()),
            Just("\n\n".to_string()),
            "[a-z \"\\\\\t\r\x01\x1f\u{7f}é日]{0,12}",
        ]
    }

    proptest! {
        #[test]
        fn strings_are_escaped_as_serde_json_does(s in "(\\PC|[\\x00-\\x1f\"\\\\\u{7f}])*") {
            prop_assert_eq!(ours(&s), serde_str(&s));
        }

        #[test]
        fn every_event_is_written_as_serde_json_writes_it(
            pieces in proptest::collection::vec(piece(), 0..12),
            chunk in 1usize..9,
        ) {
            let input = pieces.concat();
            let mut parser = crate::Parser::new(crate::Registry::filament());
            let mut events = Vec::new();
            for c in input.as_bytes().chunks(chunk) {
                parser.feed_into(c, &mut events);
            }
            events.extend(parser.finish());
            for event in &events {
                let mut line = Vec::new();
                event.write_json(&mut line);
                let expected = serde_json::to_vec(event).unwrap_or_default();
                prop_assert_eq!(String::from_utf8_lossy(&line), String::from_utf8_lossy(&expected));
            }
        }
    }
}
