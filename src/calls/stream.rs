//! A JSON tool call read while its body arrives: the Hermes/Qwen form
//! `<tool_call>{"name": "f", "arguments": {…}}</tool_call>` and the Filament
//! form `<tool_call name="f">{…}</tool_call>`. The tool's name goes out as
//! soon as it is known, then the arguments' JSON text in fragments, in
//! order, as OpenAI's `function.arguments` deltas carry them.
//!
//! This module owns the incremental reading of one body. It must not decide
//! where the element starts or ends (that is the state machine (`machine`)'s), and it is
//! not the authority on what the call says: the element's payload, read from
//! the whole text with every leniency, is. [`ArgumentStream::finish`]
//! reconciles the two and says when they differ.
//!
//! Hand-written rather than built on a JSON crate: no streaming JSON parser
//! among the well-kept crates hands out the *raw text* of one member's value
//! as it arrives, resumable at any byte, which is exactly what is needed.
//!
//! # What is streamed
//!
//! | body | name | arguments fragments |
//! |---|---|---|
//! | `{"name": "f", "arguments": {"a": 1}}` | at the end of the name string | the raw text of the object, `{"a": 1}` |
//! | `{"name": "f", "arguments": "{\"a\": 1}"}` | likewise | the decoded string, `{"a": 1}` |
//! | `{"arguments": {…}, "name": "f"}` | at the end of the name string | held until then |
//! | `<tool_call name="f">{"a": 1}</tool_call>` | at once | the raw text of the body's object |
//! | anything else (Python literals, single quotes, an array) | at the end | the payload's arguments as compact JSON, at the end |
//!
//! A trailing comma (`{"a": 1,}`) is held back until the next byte shows it
//! is one and is then dropped, so the fragments join to strict JSON where
//! the model's text allows it. Where they cannot (the model wrote
//! something only the lenient reader accepts), streaming stops at that byte
//! and [`ArgumentStream::finish`] reports that the fragments and the
//! payload differ.

use crate::scan::{JsonString, incomplete_utf8_tail};
use serde_json::Value;

/// The keys that name the tool: a call element's attributes and its
/// body's keys (one list for the stream, the payload reader and the
/// proxy).
pub(crate) const NAME_KEYS: &[&str] = &["name", "tool", "function"];
/// Body keys that hold the arguments (one list for the stream and the
/// payload reader).
pub(crate) const ARG_KEYS: &[&str] = &["arguments", "args", "parameters", "params", "input"];
/// Most bytes of arguments held while the name is not yet known.
const HOLD_LIMIT: usize = 1024 * 1024;

/// What to emit: the name (once, first) and an arguments fragment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallPiece {
    /// The tool's name, the first time it is known.
    pub name: Option<String>,
    /// A fragment of the arguments' JSON text.
    pub arguments: String,
}

impl CallPiece {
    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.name.is_none() && self.arguments.is_empty()
    }
}

/// How the fragments compare with the payload at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOutcome {
    /// The fragments join to the payload's arguments (or nothing was
    /// streamed before the end, and the end sent the payload's).
    Agrees,
    /// The fragments already sent do not join to the payload's arguments
    /// (the model wrote JSON only the lenient reader accepts); the payload
    /// is what the call says.
    Differs,
}

/// A JSON value being skipped or copied: nesting and strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lex {
    depth: u32,
    string: JsonString,
    /// The value is a scalar (number, literal): it ends before `,`/`}`.
    scalar: bool,
}

impl Lex {
    fn start(b: u8) -> Lex {
        match b {
            b'{' | b'[' => Lex { depth: 1, string: JsonString::Out, scalar: false },
            b'"' => Lex { depth: 0, string: JsonString::In, scalar: false },
            _ => Lex { depth: 0, string: JsonString::Out, scalar: true },
        }
    }

    /// Feeds one byte after the first; `Step::Done` when the value ended
    /// with this byte included, `Step::EndedBefore` when it ended before it.
    fn step(&mut self, b: u8) -> LexStep {
        match self.string {
            JsonString::Out => {}
            JsonString::In if b == b'"' && self.depth == 0 => {
                self.string = JsonString::Out;
                return LexStep::Done;
            }
            string => {
                self.string = string.step(b);
                return LexStep::More;
            }
        }
        if self.scalar {
            return match b {
                b',' | b'}' | b']' => LexStep::EndedBefore,
                b if b.is_ascii_whitespace() => LexStep::EndedBefore,
                _ => LexStep::More,
            };
        }
        match b {
            b'"' => self.string = JsonString::In,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return LexStep::Done;
                }
            }
            _ => {}
        }
        LexStep::More
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LexStep {
    More,
    Done,
    EndedBefore,
}

/// Which top-level member a value belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Name,
    Args,
    Other,
}

/// How the arguments value is being copied out.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgsCopy {
    /// An object or array: raw bytes, trailing commas dropped; `last` is
    /// the last byte outside strings that was not whitespace.
    Raw { lex: Lex, comma: Option<String>, last: u8 },
    /// A JSON string holding the arguments: its decoded content; `escape`
    /// holds an unfinished escape sequence.
    Decoded { escape: String },
}

/// Where the reader is inside the top-level object.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    /// Expecting a key (or the object's end).
    Key,
    /// Reading a key string (raw bytes, escapes undecoded).
    InKey { raw: Vec<u8>, escape: bool },
    /// After a key, expecting `:`.
    Colon(Member),
    /// After `:`, expecting the value.
    Value(Member),
    /// Reading the name string.
    NameValue { raw: Vec<u8>, escape: bool },
    /// Copying the arguments.
    ArgsValue(ArgsCopy),
    /// Skipping another member's value.
    Skip(Lex),
    /// After a value, expecting `,` or `}`.
    AfterValue,
}

/// The reader's phase.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Before the body's `{` (whitespace, a code fence).
    Before,
    /// Inside the `{"name": …, "arguments": …}` object.
    Wrapped(Slot),
    /// The name came from the tag's attribute, and the body's `{` was
    /// read: its first key decides whether the body is the arguments or a
    /// wrapper (`{"arguments": …}`). Nothing is sent meanwhile.
    BareKey(Vec<u8>),
    /// The body is the arguments: the next `{` starts the copy.
    BareReady,
    /// The name came from the tag's attribute: the body's object is the
    /// arguments, copied raw.
    Bare(ArgsCopy),
    /// The body (with a name attribute) starts with a wrapper key: whether
    /// it is `{"arguments": …}` is known only at its end. Nothing more is
    /// streamed; the end sends the payload's arguments.
    Held,
    /// The top-level value ended; later bytes are not the call's.
    After,
    /// Not a shape this reader follows, or something only the lenient reader
    /// accepts: nothing more is streamed.
    Stopped,
}

/// Reads one `<tool_call>` body as it arrives. Feed it the raw deltas of the
/// element's text with [`ArgumentStream::feed`], and call
/// [`ArgumentStream::finish`] with the parsed payload when the element ends.
///
/// ```
/// use spindle::calls::stream::ArgumentStream;
/// use serde_json::json;
///
/// let mut s = ArgumentStream::new(None);
/// let mut name = None;
/// let mut args = String::new();
/// for chunk in [r#"{"name": "get_wea"#, r#"ther", "arguments": {"ci"#, r#"ty": "Paris",}}"#] {
///     let piece = s.feed(chunk);
///     name = name.or(piece.name);
///     args.push_str(&piece.arguments);
/// }
/// let (last, outcome) = s.finish(Some("get_weather"), &json!({"city": "Paris"}));
/// args.push_str(&last.arguments);
/// assert_eq!(name.as_deref(), Some("get_weather"));
/// assert_eq!(args, r#"{"city": "Paris"}"#);
/// assert_eq!(outcome, spindle::calls::stream::StreamOutcome::Agrees);
/// ```
#[derive(Debug, Clone)]
pub struct ArgumentStream {
    phase: Phase,
    /// The name, once known (from the attribute or the body).
    name: Option<String>,
    name_sent: bool,
    /// Arguments read before the name was known.
    held: String,
    /// Every fragment sent, joined (to compare with the payload).
    sent: String,
    /// A held fragment passed [`HOLD_LIMIT`]: the end sends everything.
    overflowed: bool,
}

impl ArgumentStream {
    /// A reader for one body; `name_attr` is the tag's `name` attribute
    /// (or `tool`/`function`), when it has one.
    pub fn new(name_attr: Option<String>) -> ArgumentStream {
        ArgumentStream {
            phase: Phase::Before,
            name: name_attr.filter(|n| !n.trim().is_empty()).map(|n| n.trim().to_string()),
            name_sent: false,
            held: String::new(),
            sent: String::new(),
            overflowed: false,
        }
    }

    /// Reads the next piece of the body; returns what can be sent now.
    pub fn feed(&mut self, text: &str) -> CallPiece {
        let mut args = String::new();
        self.scan(text, &mut args);
        self.release(args)
    }

    /// Reads `text`, appending the arguments text it releases to `args`.
    fn scan(&mut self, text: &str, args: &mut String) {
        let bytes = text.as_bytes();
        // Bytes of `text` from `run` on are arguments to copy as they are.
        let mut run: Option<usize> = None;
        let mut i = 0;
        while i < bytes.len() {
            // The arguments' object, copied raw (the bulk of a call): read
            // in one loop with its copy state held here, not moved in and
            // out of the phase byte by byte.
            if let Some((copy, bare)) = self.take_raw_copy() {
                i = self.copy_raw(copy, bare, text, i, &mut run, args);
                if run.is_some() && !matches!(self.phase, Phase::Bare(_) | Phase::Wrapped(Slot::ArgsValue(_))) {
                    run = None;
                }
                continue;
            }
            // Inside a string argument only `"` and `\` change anything:
            // copy up to the next one at once.
            match &self.phase {
                Phase::Wrapped(Slot::ArgsValue(ArgsCopy::Decoded { escape })) if escape.is_empty() => {
                    let k = JsonString::In.unchanged_run(&bytes[i..]);
                    if let Some(plain) = text.get(i..i + k) {
                        args.push_str(plain);
                        i += k;
                        if i == bytes.len() {
                            break;
                        }
                    }
                }
                _ => {}
            }
            let b = bytes[i];
            let phase = std::mem::replace(&mut self.phase, Phase::Stopped);
            self.phase = match phase {
                Phase::Before => match (b, &self.name) {
                    (b'{', Some(_)) => Phase::BareKey(vec![b]),
                    (b'{', None) => Phase::Wrapped(Slot::Key),
                    _ => Phase::Before,
                },
                Phase::BareReady => match b {
                    b'{' => {
                        run = Some(i);
                        Phase::Bare(ArgsCopy::Raw { lex: Lex::start(b), comma: None, last: b })
                    }
                    _ => Phase::BareReady,
                },
                Phase::BareKey(mut buf) => {
                    buf.push(b);
                    match first_key(&buf) {
                        FirstKey::Undecided if buf.len() <= 256 => Phase::BareKey(buf),
                        FirstKey::Wrapper => Phase::Held,
                        FirstKey::Lenient => Phase::Stopped,
                        // Decided inside a character: hold its other bytes
                        // too, so that the replay below and the copy after
                        // it both start at a character boundary.
                        FirstKey::Undecided | FirstKey::Plain if incomplete_utf8_tail(&buf) > 0 => Phase::BareKey(buf),
                        FirstKey::Undecided | FirstKey::Plain => {
                            // Replay the held bytes as the start of the copy.
                            self.phase = Phase::BareReady;
                            let held = String::from_utf8_lossy(&buf).into_owned();
                            self.scan(&held, args);
                            std::mem::replace(&mut self.phase, Phase::Stopped)
                        }
                    }
                }
                Phase::Bare(copy) => {
                    let (copy, ended) = self.copy_args(copy, b, text, i, &mut run, args);
                    match (ended, copy) {
                        (true, _) => Phase::After,
                        (false, Some(c)) => Phase::Bare(c),
                        (false, None) => Phase::Stopped,
                    }
                }
                Phase::Wrapped(slot) => self.wrapped(slot, b, text, i, &mut run, args),
                p @ (Phase::Held | Phase::After | Phase::Stopped) => p,
            };
            if run.is_some() && !matches!(self.phase, Phase::Bare(_) | Phase::Wrapped(Slot::ArgsValue(_))) {
                run = None;
            }
            i += 1;
        }
        if let Some(start) = run {
            push_run(args, text, start, text.len());
        }
    }

    /// The raw copy of the arguments out of the phase (and whether the body
    /// is the arguments itself), when that is what is being read.
    fn take_raw_copy(&mut self) -> Option<(ArgsCopy, bool)> {
        if !matches!(
            self.phase,
            Phase::Bare(ArgsCopy::Raw { .. }) | Phase::Wrapped(Slot::ArgsValue(ArgsCopy::Raw { .. }))
        ) {
            return None;
        }
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Bare(copy) => Some((copy, true)),
            Phase::Wrapped(Slot::ArgsValue(copy)) => Some((copy, false)),
            other => {
                self.phase = other;
                None
            }
        }
    }

    /// Copies the raw arguments from byte `i` of `text` until they end (or
    /// stop being followable, or the text ends); sets the phase that
    /// follows and returns where reading goes on. Inside a string only `"`
    /// and `\` change anything: the bytes up to the next one are skipped
    /// at once (a long argument, a file's text, at memchr speed).
    fn copy_raw(
        &mut self,
        copy: ArgsCopy,
        bare: bool,
        text: &str,
        mut i: usize,
        run: &mut Option<usize>,
        args: &mut String,
    ) -> usize {
        let bytes = text.as_bytes();
        let mut copy = Some(copy);
        while let Some(current) = copy.take() {
            if let ArgsCopy::Raw { lex, comma: None, .. } = &current
                && lex.string == JsonString::In
                && run.is_some()
            {
                i += lex.string.unchanged_run(&bytes[i..]);
            }
            if i >= bytes.len() {
                copy = Some(current);
                break;
            }
            let (next, ended) = self.copy_args(current, bytes[i], text, i, run, args);
            i += 1;
            match (ended, next) {
                (true, _) => {
                    self.phase = if bare { Phase::After } else { Phase::Wrapped(Slot::AfterValue) };
                    return i;
                }
                (false, None) => {
                    self.phase = Phase::Stopped;
                    return i;
                }
                (false, Some(c)) => copy = Some(c),
            }
        }
        if let Some(c) = copy {
            self.phase = if bare { Phase::Bare(c) } else { Phase::Wrapped(Slot::ArgsValue(c)) };
        }
        i
    }

    /// One byte inside the wrapper object.
    fn wrapped(
        &mut self,
        slot: Slot,
        b: u8,
        text: &str,
        i: usize,
        run: &mut Option<usize>,
        args: &mut String,
    ) -> Phase {
        let slot = match slot {
            Slot::Key => match b {
                b'"' => Slot::InKey { raw: Vec::new(), escape: false },
                b'}' => return Phase::After,
                b if b.is_ascii_whitespace() || b == b',' => Slot::Key,
                // An unquoted or single-quoted key: lenient JSON.
                _ => return Phase::Stopped,
            },
            Slot::InKey { mut raw, escape } => match (escape, b) {
                (false, b'"') => {
                    let member = match std::str::from_utf8(&raw) {
                        Ok(k) if NAME_KEYS.contains(&k) => Member::Name,
                        Ok(k) if ARG_KEYS.contains(&k) => Member::Args,
                        _ => Member::Other,
                    };
                    Slot::Colon(member)
                }
                (false, b'\\') => {
                    raw.push(b);
                    Slot::InKey { raw, escape: true }
                }
                _ => {
                    raw.push(b);
                    Slot::InKey { raw, escape: false }
                }
            },
            Slot::Colon(m) => match b {
                b':' => Slot::Value(m),
                b if b.is_ascii_whitespace() => Slot::Colon(m),
                _ => return Phase::Stopped,
            },
            Slot::Value(m) => match (m, b) {
                (_, b) if b.is_ascii_whitespace() => Slot::Value(m),
                (Member::Name, b'"') => Slot::NameValue { raw: vec![b'"'], escape: false },
                (Member::Args, b'"') => Slot::ArgsValue(ArgsCopy::Decoded { escape: String::new() }),
                (Member::Args, b'{' | b'[') => {
                    *run = Some(i);
                    Slot::ArgsValue(ArgsCopy::Raw { lex: Lex::start(b), comma: None, last: b })
                }
                // A name that is not a string, or arguments that are a
                // scalar: the end decides.
                (Member::Name | Member::Args, b) => Slot::Skip(Lex::start(b)),
                (Member::Other, b) => {
                    let lex = Lex::start(b);
                    if lex.scalar && !matches!(b, b'-' | b'0'..=b'9' | b't' | b'f' | b'n') {
                        return Phase::Stopped;
                    }
                    Slot::Skip(lex)
                }
            },
            Slot::NameValue { mut raw, escape } => {
                raw.push(b);
                match (escape, b) {
                    (false, b'"') => {
                        if let Ok(name) = serde_json::from_slice::<String>(&raw) {
                            self.name.get_or_insert(name);
                        }
                        Slot::AfterValue
                    }
                    (false, b'\\') => Slot::NameValue { raw, escape: true },
                    _ => Slot::NameValue { raw, escape: false },
                }
            }
            Slot::ArgsValue(copy) => {
                let (copy, ended) = self.copy_args(copy, b, text, i, run, args);
                match (ended, copy) {
                    (true, _) => Slot::AfterValue,
                    (false, Some(c)) => Slot::ArgsValue(c),
                    (false, None) => return Phase::Stopped,
                }
            }
            Slot::Skip(mut lex) => match lex.step(b) {
                LexStep::More => Slot::Skip(lex),
                LexStep::Done => Slot::AfterValue,
                LexStep::EndedBefore => return self.wrapped(Slot::AfterValue, b, text, i, run, args),
            },
            Slot::AfterValue => match b {
                b',' => Slot::Key,
                b'}' => return Phase::After,
                b if b.is_ascii_whitespace() => Slot::AfterValue,
                _ => return Phase::Stopped,
            },
        };
        Phase::Wrapped(slot)
    }

    /// One byte of the arguments value. Returns the copy state (`None`:
    /// stop streaming) and whether the value ended with this byte.
    fn copy_args(
        &mut self,
        copy: ArgsCopy,
        b: u8,
        text: &str,
        i: usize,
        run: &mut Option<usize>,
        args: &mut String,
    ) -> (Option<ArgsCopy>, bool) {
        match copy {
            ArgsCopy::Raw { mut lex, mut comma, mut last } => {
                // The first byte (`{`) was taken when the copy began.
                if run.is_none() && comma.is_none() {
                    *run = Some(i);
                }
                if let Some(held) = &mut comma {
                    if b.is_ascii_whitespace() {
                        held.push(b as char);
                        *run = None;
                        return (Some(ArgsCopy::Raw { lex, comma, last }), false);
                    }
                    let held = comma.take().unwrap_or_default();
                    if matches!(b, b'}' | b']') {
                        // A trailing comma: drop it, keep its spacing; what
                        // came before it was a value.
                        args.push_str(held.trim_start_matches(','));
                        last = b'0';
                    } else {
                        args.push_str(&held);
                    }
                    *run = Some(i);
                }
                let out_of_string = lex.string == JsonString::Out;
                if out_of_string && !b.is_ascii_whitespace() {
                    if !strict_after(last, b) {
                        // Single quotes, comments, Python literals, an
                        // unquoted key: only the lenient reader follows;
                        // stop before this byte.
                        if let Some(start) = run.take() {
                            push_run(args, text, start, i);
                        }
                        return (None, false);
                    }
                    last = b;
                }
                if out_of_string && b == b',' && lex.depth > 0 {
                    if let Some(start) = run.take() {
                        push_run(args, text, start, i);
                    }
                    return (Some(ArgsCopy::Raw { lex, comma: Some(",".into()), last }), false);
                }
                match lex.step(b) {
                    LexStep::Done => {
                        if let Some(start) = run.take() {
                            push_run(args, text, start, i + 1);
                        }
                        (Some(ArgsCopy::Raw { lex, comma, last }), true)
                    }
                    _ => (Some(ArgsCopy::Raw { lex, comma, last }), false),
                }
            }
            ArgsCopy::Decoded { mut escape } => {
                if escape.is_empty() {
                    match b {
                        b'"' => return (Some(ArgsCopy::Decoded { escape }), true),
                        b'\\' => escape.push('\\'),
                        _ => {
                            // Copy a whole UTF-8 sequence: `text` is a str,
                            // so `i` is at a char boundary when `b` is not a
                            // continuation byte.
                            if b & 0xC0 != 0x80 {
                                let ch = text.get(i..).and_then(|t| t.chars().next()).unwrap_or('\u{FFFD}');
                                args.push(ch);
                            }
                        }
                    }
                    return (Some(ArgsCopy::Decoded { escape }), false);
                }
                escape.push(b as char);
                match decode_escape(&escape) {
                    Escape::Char(c) => {
                        args.push(c);
                        escape.clear();
                    }
                    Escape::NeedMore => {}
                    Escape::Bad => return (None, false),
                }
                (Some(ArgsCopy::Decoded { escape }), false)
            }
        }
    }

    /// Holds arguments until the name is known; sends the name first.
    fn release(&mut self, args: String) -> CallPiece {
        let mut piece = CallPiece::default();
        if !self.name_sent {
            match &self.name {
                Some(n) => {
                    piece.name = Some(n.clone());
                    self.name_sent = true;
                    piece.arguments = std::mem::take(&mut self.held);
                }
                None => {
                    if self.held.len() + args.len() > HOLD_LIMIT {
                        self.overflowed = true;
                        self.phase = Phase::Stopped;
                        self.held.clear();
                    } else if !self.overflowed {
                        self.held.push_str(&args);
                    }
                    return piece;
                }
            }
        }
        piece.arguments.push_str(&args);
        self.sent.push_str(&piece.arguments);
        piece
    }

    /// Ends the body. `name` and `arguments` are the element's payload (the
    /// authority). Returns what is left to send and how the fragments sent
    /// compare with the payload's arguments.
    pub fn finish(&mut self, name: Option<&str>, arguments: &Value) -> (CallPiece, StreamOutcome) {
        let mut piece = CallPiece::default();
        let canonical = || serde_json::to_string(arguments).unwrap_or_default();
        if !self.name_sent {
            let Some(name) = name.map(str::to_string).or_else(|| self.name.clone()) else {
                return (piece, StreamOutcome::Agrees);
            };
            piece.name = Some(name);
            self.name_sent = true;
            // Nothing was sent: send the payload's arguments, strict JSON.
            piece.arguments = canonical();
            self.held.clear();
            self.sent.push_str(&piece.arguments);
            return (piece, StreamOutcome::Agrees);
        }
        if self.sent.is_empty() {
            piece.arguments = canonical();
            self.sent.push_str(&piece.arguments);
            return (piece, StreamOutcome::Agrees);
        }
        let agrees = same_json(&self.sent, arguments);
        (piece, if agrees { StreamOutcome::Agrees } else { StreamOutcome::Differs })
    }
}

/// Whether `text` is strict JSON that reads as `expected`: what
/// `serde_json::from_str::<Value>(text) == Ok(expected)` says, without
/// building the value (for a large argument object that value costs as
/// much memory as the payload itself, about ten times the text).
fn same_json(text: &str, expected: &Value) -> bool {
    let mut de = serde_json::Deserializer::from_str(text);
    serde::de::DeserializeSeed::deserialize(Same(expected), &mut de).is_ok_and(|same| same) && de.end().is_ok()
}

/// Reads one JSON value and says whether it is the value it holds, as
/// `serde_json::Value`'s own reading would build it: numbers by the same
/// conversion, objects regardless of key order with the last of a
/// repeated key counting. It reads the whole value either way (an error
/// would leave the reader mid-value).
struct Same<'a>(&'a Value);

impl<'de> serde::de::DeserializeSeed<'de> for Same<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Same<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<bool, E> {
        Ok(*self.0 == Value::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<bool, E> {
        Ok(*self.0 == v)
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<bool, E> {
        Ok(*self.0 == v)
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<bool, E> {
        Ok(*self.0 == serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
        Ok(self.0.as_str() == Some(v))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
        Ok(self.0.is_null())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        let Value::Array(items) = self.0 else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            return Ok(false);
        };
        let mut expected = items.iter();
        let mut same = true;
        loop {
            let read = match expected.next() {
                // Fewer items than expected when the array ends here.
                Some(item) => seq.next_element_seed(Same(item))?.ok_or(false),
                None => seq.next_element::<serde::de::IgnoredAny>()?.map(|_| false).ok_or(true),
            };
            match read {
                Ok(agrees) => same &= agrees,
                Err(complete) => return Ok(same && complete),
            }
        }
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let members = self.0.as_object();
        // Each expected key read, with whether its last value agreed.
        let mut seen: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        let mut same = members.is_some();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match members.and_then(|m| m.get_key_value(key.as_ref())) {
                Some((name, value)) => {
                    let agrees = map.next_value_seed(Same(value))?;
                    seen.insert(name.as_str(), agrees);
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    same = false;
                }
            }
        }
        Ok(same && members.is_some_and(|m| seen.len() == m.len()) && seen.values().all(|&agrees| agrees))
    }
}

/// Whether `b`, the next significant byte outside strings, may follow
/// `last` in strict JSON (the check that keeps streamed arguments strict:
/// a value starts with `"`, `{`, `[`, `-`, a digit or `t`/`f`/`n`; after
/// `{` comes a key or `}`; `'`, `#`, `/`, `(`, `True`, `None`, unquoted
/// keys never pass).
fn strict_after(last: u8, b: u8) -> bool {
    let value_start = matches!(b, b'"' | b'{' | b'[' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n');
    match last {
        b'{' => matches!(b, b'"' | b'}'),
        b'[' => value_start || b == b']',
        b':' | b',' => value_start,
        // Inside or after a value: structure, or the rest of a number or
        // literal.
        _ => {
            matches!(b, b',' | b':' | b'}' | b']' | b'"')
                || b.is_ascii_alphanumeric()
                || matches!(b, b'.' | b'+' | b'-')
        }
    }
}

/// What the first key of a body with a name attribute says.
enum FirstKey {
    /// Not all of it has arrived.
    Undecided,
    /// `{"arguments"…`, `{"name"…`: maybe a wrapper; the end decides.
    Wrapper,
    /// Any other key, or `{}`: the body is the arguments.
    Plain,
    /// Not strict JSON (`{'a'…`, `{a:`): the end decides.
    Lenient,
}

/// Looks at `{` + spaces + `"key"` held so far.
fn first_key(buf: &[u8]) -> FirstKey {
    let rest = buf.get(1..).unwrap_or_default().trim_ascii_start();
    match rest.first() {
        None => FirstKey::Undecided,
        Some(b'}') => FirstKey::Plain,
        Some(b'"') => {
            let key = &rest[1..];
            match key.iter().position(|&c| c == b'"' || c == b'\\') {
                None => FirstKey::Undecided,
                Some(n) if key[n] == b'"' => {
                    let k = &key[..n];
                    if NAME_KEYS.iter().chain(ARG_KEYS).any(|w| w.as_bytes() == k) {
                        FirstKey::Wrapper
                    } else {
                        FirstKey::Plain
                    }
                }
                // An escape in the key: no wrapper key has one.
                Some(_) => FirstKey::Plain,
            }
        }
        Some(_) => FirstKey::Lenient,
    }
}

#[derive(Debug, PartialEq)]
enum Escape {
    Char(char),
    NeedMore,
    Bad,
}

/// Decodes one JSON escape sequence (`\n`, `\u00e9`, a surrogate pair
/// `\ud83d\ude00`) once it is complete. `seq` holds the bytes read so far,
/// each as a char, so a byte that is not ASCII is in it as a longer char:
/// the hex digits are checked, not sliced blindly.
fn decode_escape(seq: &str) -> Escape {
    let b = seq.as_bytes();
    if b.len() < 2 {
        return Escape::NeedMore;
    }
    if b[1] != b'u' {
        return match serde_json::from_str::<String>(&format!("\"{seq}\"")) {
            Ok(s) => s.chars().next().map_or(Escape::Bad, Escape::Char),
            Err(_) => Escape::Bad,
        };
    }
    // The four hex digits from byte `at` on: `None` while fewer have
    // arrived, `Some(None)` when one is not a hex digit.
    let hex = |at: usize| -> Option<Option<u32>> {
        let digits = b.get(at..).unwrap_or_default();
        let got = &digits[..digits.len().min(4)];
        if !got.iter().all(u8::is_ascii_hexdigit) {
            return Some(None);
        }
        if got.len() < 4 {
            return None;
        }
        Some(Some(got.iter().fold(0, |n, &c| n * 16 + char::from(c).to_digit(16).unwrap_or(0))))
    };
    let hi = match hex(2) {
        None => return Escape::NeedMore,
        Some(None) => return Escape::Bad,
        Some(Some(hi)) => hi,
    };
    if (0xD800..0xDC00).contains(&hi) {
        // A high surrogate: its low half follows as `\uXXXX`.
        if b.len() > 6 && b[6] != b'\\' || b.len() > 7 && b[7] != b'u' {
            return Escape::Char('\u{FFFD}');
        }
        let lo = match hex(8) {
            None => return Escape::NeedMore,
            Some(None) => return Escape::Bad,
            Some(Some(lo)) => lo,
        };
        let c = 0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF);
        return Escape::Char(char::from_u32(c).unwrap_or('\u{FFFD}'));
    }
    Escape::Char(char::from_u32(hi).unwrap_or('\u{FFFD}'))
}

/// Appends `text[start..end]`: a run of arguments copied as written. Runs
/// start and end at character boundaries (a run starts at an ASCII byte
/// or after a whole character); were one not to, its bytes are appended
/// lossily rather than panicking.
fn push_run(args: &mut String, text: &str, start: usize, end: usize) {
    match text.get(start..end) {
        Some(run) => args.push_str(run),
        None => args.push_str(&String::from_utf8_lossy(text.as_bytes().get(start..end).unwrap_or_default())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `same_json` says what comparing a parsed `Value` says, on the
    /// cases where reading and comparing as one goes could differ.
    #[test]
    fn same_json_agrees_with_parsing_the_value() {
        let texts = [
            r#"{"a": 1, "b": [1, 2.0, "x\u00e9", null, true]}"#,
            r#"{"b": [1, 2.0, "xé", null, true], "a": 1}"#,
            r#"{"a": 1.0, "b": [1, 2.0, "xé", null, true]}"#,
            r#"{"a": 1, "b": [1, 2.0, "xé", null]}"#,
            r#"{"a": 1, "b": [1, 2.0, "xé", null, true, 6]}"#,
            r#"{"a": 1, "b": [1, 2.0, "xé", null, true], "c": {}}"#,
            r#"{"a": 2, "a": 1, "b": [1, 2.0, "xé", null, true]}"#,
            r#"{"a": 1, "a": 2, "b": [1, 2.0, "xé", null, true]}"#,
            r#"{"a": 1}"#,
            r#"{"a": 1, "b": [1, 2.0, "xé", null, true]} x"#,
            r#"{"a": 1, "b": [1, 2.0, "xé", null, true]"#,
            r#"[1, 2]"#,
            r#"{}"#,
            r#"-0"#,
            r#"18446744073709551616"#,
            r#""s""#,
        ];
        for text in texts {
            for expected in texts.iter().filter_map(|t| serde_json::from_str::<Value>(t).ok()) {
                let parsed = serde_json::from_str::<Value>(text).is_ok_and(|v| v == expected);
                assert_eq!(same_json(text, &expected), parsed, "{text} against {expected}");
            }
        }
    }

    /// Feeds `body` in pieces of `chunk` chars; returns the name and the
    /// joined arguments, and the outcome.
    fn stream(
        attr: Option<&str>,
        body: &str,
        chunk: usize,
        name: Option<&str>,
        args: &Value,
    ) -> (Option<String>, String, StreamOutcome) {
        let mut s = ArgumentStream::new(attr.map(str::to_string));
        let (mut got_name, mut got_args) = (None, String::new());
        let chars: Vec<char> = body.chars().collect();
        for piece in chars.chunks(chunk.max(1)) {
            let p = s.feed(&piece.iter().collect::<String>());
            if p.name.is_some() {
                assert!(got_name.is_none(), "name sent twice");
                assert!(got_args.is_empty(), "arguments before the name");
                got_name = p.name;
            }
            got_args.push_str(&p.arguments);
        }
        let (p, outcome) = s.finish(name, args);
        if p.name.is_some() {
            assert!(got_name.is_none());
            got_name = p.name;
        }
        got_args.push_str(&p.arguments);
        (got_name, got_args, outcome)
    }

    fn every_split(attr: Option<&str>, body: &str, name: &str, args: Value, want_args: &str) {
        for chunk in [usize::MAX, 1, 2, 3, 7] {
            let (n, a, outcome) = stream(attr, body, chunk, Some(name), &args);
            assert_eq!(n.as_deref(), Some(name), "{body:?} at {chunk}");
            assert_eq!(a, want_args, "{body:?} at {chunk}");
            assert_eq!(outcome, StreamOutcome::Agrees, "{body:?} at {chunk}");
        }
    }

    #[test]
    fn hermes_shapes() {
        every_split(
            None,
            r#"{"name": "f", "arguments": {"a": 1, "b": [1, {"c": "}"}]}}"#,
            "f",
            json!({"a": 1, "b": [1, {"c": "}"}]}),
            r#"{"a": 1, "b": [1, {"c": "}"}]}"#,
        );
        every_split(
            None,
            "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
            "get_weather",
            json!({"city": "Paris"}),
            r#"{"city": "Paris"}"#,
        );
        // arguments before name: held, then sent after it.
        every_split(
            None,
            r#"{"arguments": {"q": "x"}, "name": "search"}"#,
            "search",
            json!({"q": "x"}),
            r#"{"q": "x"}"#,
        );
        // parameters instead of arguments.
        every_split(None, r#"{"name": "f", "parameters": {"q": "é"}}"#, "f", json!({"q": "é"}), r#"{"q": "é"}"#);
        // arguments as a JSON string: decoded.
        // Escapes of the outer string are decoded (`\u00e9` -> é, a
        // surrogate pair -> one char); the inner JSON's own escapes stay.
        every_split(
            None,
            r#"{"name": "f", "arguments": "{\"q\": \"\u00e9\ud83d\ude00 \\\"x\\u0041\"}"}"#,
            "f",
            json!({"q": "é😀 \"xA"}),
            r#"{"q": "é😀 \"x\u0041"}"#,
        );
        // A trailing comma is dropped.
        every_split(None, r#"{"name": "f", "arguments": {"a": 1,  }}"#, "f", json!({"a": 1}), r#"{"a": 1  }"#);
        // Fenced.
        every_split(None, "```json\n{\"name\": \"f\", \"arguments\": {}}\n```", "f", json!({}), "{}");
        // An escaped name.
        every_split(None, r#"{"name": "a\"b", "arguments": {}}"#, "a\"b", json!({}), "{}");
    }

    #[test]
    fn filament_attribute_shapes() {
        every_split(
            Some("f"),
            r#"{"x": {"y": [1, 2]}, "z": "w"}"#,
            "f",
            json!({"x": {"y": [1, 2]}, "z": "w"}),
            r#"{"x": {"y": [1, 2]}, "z": "w"}"#,
        );
        // A wrapper body: held to the end, then the payload's arguments.
        every_split(Some("f"), r#"{"arguments": {"a": 1}}"#, "f", json!({"a": 1}), r#"{"a":1}"#);
        every_split(Some("f"), "", "f", json!({}), "{}");
    }

    /// Escapes are decoded when whole; bytes that are not hex digits (a
    /// byte past ASCII arrives as a longer char) end the streaming instead
    /// of being sliced through (found by fuzzing: a slice inside a
    /// character panicked).
    #[test]
    fn escapes() {
        for (seq, want) in [
            ("\\", Escape::NeedMore),
            ("\\n", Escape::Char('\n')),
            ("\\q", Escape::Bad),
            ("\\u00", Escape::NeedMore),
            ("\\u00e9", Escape::Char('é')),
            ("\\u00E9", Escape::Char('é')),
            ("\\u+0e9", Escape::Bad),
            ("\\uzz", Escape::Bad),
            ("\\u\u{bb}", Escape::Bad),
            ("\\u1\u{bf}", Escape::Bad),
            ("\\u15e\u{bf}", Escape::Bad),
            ("\\ud83d", Escape::NeedMore),
            ("\\ud83d\\u", Escape::NeedMore),
            ("\\ud83d\\ude", Escape::NeedMore),
            ("\\ud83d\\ude00", Escape::Char('😀')),
            ("\\ud83d\\ud\u{bf}", Escape::Bad),
            ("\\ud83dx", Escape::Char('\u{FFFD}')),
        ] {
            assert_eq!(decode_escape(seq), want, "{seq:?}");
        }
    }

    /// A first key too long to decide within 256 bytes is decided at the
    /// byte after them, which may fall inside a character: the copy must
    /// still start and end at character boundaries (found by fuzzing: a
    /// slice inside a character panicked).
    #[test]
    fn a_long_first_key_of_multibyte_characters() {
        for ch in ["é", "\u{FFFD}", "猫", "🦀"] {
            for pad in 0..4 {
                let key = format!("{}{}", "k".repeat(pad), ch.repeat(300));
                let body = format!("{{\"{key}\": 1, \"b\": \"{ch}\"}}");
                every_split(Some("f"), &body, "f", json!({key.as_str(): 1, "b": ch}), &body);
            }
        }
    }

    #[test]
    fn lenient_bodies_send_the_payload_at_the_end() {
        // Python literals with single quotes: nothing is streamed before the
        // end when the first byte already needs the lenient reader.
        every_split(None, "{'name': 'f', 'arguments': {'a': None}}", "f", json!({"a": null}), r#"{"a":null}"#);
        // Single quotes inside the arguments after streaming began: the
        // fragments stop and the end says they differ.
        let (n, a, outcome) =
            stream(None, "{\"name\": \"f\", \"arguments\": {\"a\": 'x'}}", 1, Some("f"), &json!({"a": "x"}));
        assert_eq!(n.as_deref(), Some("f"));
        assert_eq!(a, "{\"a\": ");
        assert_eq!(outcome, StreamOutcome::Differs);
    }

    #[test]
    fn cut_off_bodies() {
        let (n, a, _) = stream(None, r#"{"name": "f", "arguments": {"a": "par"#, 3, Some("f"), &json!({"a": "par"}));
        assert_eq!(n.as_deref(), Some("f"));
        assert_eq!(a, r#"{"a": "par"#);
        // No name anywhere: nothing is sent.
        let (n, a, _) = stream(None, r#"{"arguments": {"a": 1}}"#, 1, None, &json!({"a": 1}));
        assert_eq!((n, a), (None, String::new()));
    }
}
