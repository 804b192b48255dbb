//! Lenient JSON: the JSON that models write, read into `serde_json::Value`
//! with a report of every liberty taken.
//!
//! This module owns the tolerant reader and its [`Leniency`] vocabulary. It
//! knows nothing about tags or payload shapes; [`crate::payload`] turns the
//! leniencies into diagnostics on the element.
//!
//! Strict `serde_json` is always tried first; the tolerant pass runs only
//! when strict parsing fails, so valid JSON costs nothing extra and reports
//! nothing.
//!
//! # Why not `jsonrepair-rs`
//!
//! DESIGN §10 names `jsonrepair-rs` for this. It repairs well, but its API
//! returns only the repaired string: it cannot say *which* repairs it made,
//! and the issue requires every leniency to be reported on the element. So
//! this is one small recursive-descent reader (no dependencies beyond
//! `serde_json`), and the tests use `jsonrepair-rs` as an oracle for the
//! values it produces.
//!
//! # What is tolerated
//!
//! | input | [`Leniency`] |
//! | --- | --- |
//! | ```` ```json ... ``` ```` around the document | `CodeFence` |
//! | prose before or after the document | `SurroundingProse` |
//! | `// ...`, `/* ... */`, `# ...` | `Comment` |
//! | `[1, 2,]`, `{"a": 1,}`, `[1,,2]` | `TrailingComma` |
//! | `[1 2]`, `{"a": 1 "b": 2}` | `MissingComma` |
//! | `'text'` | `SingleQuotes` |
//! | `“text”`, `‘text’` | `SmartQuotes` |
//! | `{name: 1}` | `UnquotedKey` |
//! | `{"view": widget.grid}` | `UnquotedString` |
//! | `True`, `False`, `None` (and `TRUE`, `Null`, ...) | `PythonLiteral` |
//! | `undefined`, `NaN`, `Infinity` (read as `null`) | `JsLiteral` |
//! | `+1`, `.5`, `5.`, `007` | `NumberFormat` |
//! | a raw newline or tab inside a string | `ControlCharacter` |
//! | `"\q"`, `"\'"` | `InvalidEscape` |
//! | `"he said "hi" there"` | `UnescapedQuote` |
//! | `，` and `：` used as separators | `FullwidthPunctuation` |
//! | `{"a": [1, 2}` | `MismatchedBracket` |
//! | input ending inside a string, array or object | `Truncated` |
//!
//! # Example
//!
//! ```
//! use spindle::payload::json::{parse, Leniency};
//!
//! let read = parse("```json\n{name: 'Ada', tags: ['x',], ok: True\n```").unwrap();
//! assert_eq!(read.value, serde_json::json!({"name": "Ada", "tags": ["x"], "ok": true}));
//! let kinds: Vec<Leniency> = read.leniencies.iter().map(|l| l.kind).collect();
//! assert_eq!(kinds, [
//!     Leniency::CodeFence,
//!     Leniency::TrailingComma,
//!     Leniency::SingleQuotes,
//!     Leniency::UnquotedKey,
//!     Leniency::PythonLiteral,
//!     Leniency::Truncated,
//! ]);
//! ```

use crate::event::DiagnosticCode;
use serde::Serialize;
use serde_json::{Map, Number, Value};

/// Deepest nesting the reader accepts (the same as `serde_json`'s default).
pub const MAX_DEPTH: usize = 128;

/// One kind of liberty the tolerant reader took. See the module table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Leniency {
    /// The document sat in a Markdown code fence.
    CodeFence,
    /// Text before or after the document was ignored.
    SurroundingProse,
    /// Comments were skipped.
    Comment,
    /// A comma with nothing after it was ignored.
    TrailingComma,
    /// A missing comma between items was assumed.
    MissingComma,
    /// A string used single quotes.
    SingleQuotes,
    /// A string used typographic quotes.
    SmartQuotes,
    /// An object key had no quotes.
    UnquotedKey,
    /// A string value had no quotes.
    UnquotedString,
    /// `True`/`False`/`None` or another non-JSON spelling of a literal.
    PythonLiteral,
    /// `undefined`, `NaN` or `Infinity`, read as `null`.
    JsLiteral,
    /// A number JSON does not allow (`+1`, `.5`, `5.`, `007`).
    NumberFormat,
    /// A raw control character (newline, tab) inside a string.
    ControlCharacter,
    /// An escape JSON does not define; the escaped character was kept.
    InvalidEscape,
    /// A `"` inside a string that did not end it.
    UnescapedQuote,
    /// Fullwidth `，` or `：` used as a separator.
    FullwidthPunctuation,
    /// A closing bracket of the wrong kind closed the open container.
    MismatchedBracket,
    /// The input ended inside a value; the open strings, arrays and objects
    /// were closed.
    Truncated,
}

impl Leniency {
    /// The diagnostic code of this leniency (`json_` and its name).
    pub fn code(self) -> DiagnosticCode {
        match self {
            Leniency::CodeFence => DiagnosticCode::JsonCodeFence,
            Leniency::SurroundingProse => DiagnosticCode::JsonSurroundingProse,
            Leniency::Comment => DiagnosticCode::JsonComment,
            Leniency::TrailingComma => DiagnosticCode::JsonTrailingComma,
            Leniency::MissingComma => DiagnosticCode::JsonMissingComma,
            Leniency::SingleQuotes => DiagnosticCode::JsonSingleQuotes,
            Leniency::SmartQuotes => DiagnosticCode::JsonSmartQuotes,
            Leniency::UnquotedKey => DiagnosticCode::JsonUnquotedKey,
            Leniency::UnquotedString => DiagnosticCode::JsonUnquotedString,
            Leniency::PythonLiteral => DiagnosticCode::JsonPythonLiteral,
            Leniency::JsLiteral => DiagnosticCode::JsonJsLiteral,
            Leniency::NumberFormat => DiagnosticCode::JsonNumberFormat,
            Leniency::ControlCharacter => DiagnosticCode::JsonControlCharacter,
            Leniency::InvalidEscape => DiagnosticCode::JsonInvalidEscape,
            Leniency::UnescapedQuote => DiagnosticCode::JsonUnescapedQuote,
            Leniency::FullwidthPunctuation => DiagnosticCode::JsonFullwidthPunctuation,
            Leniency::MismatchedBracket => DiagnosticCode::JsonMismatchedBracket,
            Leniency::Truncated => DiagnosticCode::JsonTruncated,
        }
    }

    /// The snake_case name, also the suffix of the diagnostic code
    /// (`json_trailing_comma`).
    pub fn as_str(self) -> &'static str {
        match self {
            Leniency::CodeFence => "code_fence",
            Leniency::SurroundingProse => "surrounding_prose",
            Leniency::Comment => "comment",
            Leniency::TrailingComma => "trailing_comma",
            Leniency::MissingComma => "missing_comma",
            Leniency::SingleQuotes => "single_quotes",
            Leniency::SmartQuotes => "smart_quotes",
            Leniency::UnquotedKey => "unquoted_key",
            Leniency::UnquotedString => "unquoted_string",
            Leniency::PythonLiteral => "python_literal",
            Leniency::JsLiteral => "js_literal",
            Leniency::NumberFormat => "number_format",
            Leniency::ControlCharacter => "control_character",
            Leniency::InvalidEscape => "invalid_escape",
            Leniency::UnescapedQuote => "unescaped_quote",
            Leniency::FullwidthPunctuation => "fullwidth_punctuation",
            Leniency::MismatchedBracket => "mismatched_bracket",
            Leniency::Truncated => "truncated",
        }
    }

    /// A short phrase for people.
    pub fn describe(self) -> &'static str {
        match self {
            Leniency::CodeFence => "the JSON was inside a Markdown code fence",
            Leniency::SurroundingProse => "text around the JSON was ignored",
            Leniency::Comment => "comments were skipped",
            Leniency::TrailingComma => "a trailing or doubled comma was ignored",
            Leniency::MissingComma => "a missing comma was assumed",
            Leniency::SingleQuotes => "single-quoted strings were accepted",
            Leniency::SmartQuotes => "typographic quotes were read as quotes",
            Leniency::UnquotedKey => "unquoted object keys were accepted",
            Leniency::UnquotedString => "an unquoted string value was accepted",
            Leniency::PythonLiteral => "Python-style literals (True/False/None) were read as JSON literals",
            Leniency::JsLiteral => "undefined/NaN/Infinity were read as null",
            Leniency::NumberFormat => "a number in a non-JSON format was accepted",
            Leniency::ControlCharacter => "a raw control character inside a string was kept",
            Leniency::InvalidEscape => "an invalid escape was read as the escaped character",
            Leniency::UnescapedQuote => "an unescaped quote inside a string was kept",
            Leniency::FullwidthPunctuation => "fullwidth punctuation was read as a separator",
            Leniency::MismatchedBracket => "a closing bracket of the wrong kind was accepted",
            Leniency::Truncated => "the JSON was cut off; open strings and brackets were closed",
        }
    }
}

/// One leniency, where it was first used and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Used {
    /// What was tolerated.
    pub kind: Leniency,
    /// Byte offset (in the text given to [`parse`]) of its first use.
    pub at: usize,
    /// How many times it was used.
    pub count: usize,
}

/// A value read leniently, and what it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Lenient {
    /// The value.
    pub value: Value,
    /// The leniencies used, one entry per kind, in [`Leniency`] order.
    /// Empty when the text was strict JSON.
    pub leniencies: Vec<Used>,
}

impl Lenient {
    /// Whether the text was strict JSON.
    pub fn is_strict(&self) -> bool {
        self.leniencies.is_empty()
    }
}

/// Why even the tolerant reader could not read the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at byte {at}")]
pub struct JsonError {
    /// What went wrong.
    pub message: String,
    /// Byte offset in the text given to [`parse`].
    pub at: usize,
}

/// Reads one JSON document leniently: strict `serde_json` first, the
/// tolerant reader when that fails.
///
/// # Errors
///
/// [`JsonError`] when no JSON value can be found, or the structure is
/// broken beyond the leniencies listed in the module docs.
pub fn parse(text: &str) -> Result<Lenient, JsonError> {
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        return Ok(Lenient { value, leniencies: Vec::new() });
    }
    let (mut values, leniencies) = parse_values(text)?;
    let mut reader_notes = leniencies;
    if values.len() > 1 {
        // Keep the first document; the rest is reported as surrounding text.
        note_into(&mut reader_notes, Leniency::SurroundingProse, text.len());
        values.truncate(1);
    }
    match values.pop() {
        Some(value) => Ok(Lenient { value, leniencies: reader_notes }),
        None => Err(JsonError { message: "no JSON value found".into(), at: 0 }),
    }
}

/// Reads every top-level JSON document in the text (`[..] [..]`, one per
/// line, ...), leniently. Used where models write several documents where
/// one was asked for (state-update ops without the outer array).
///
/// # Errors
///
/// As [`parse`]; an error in a later document is an error of the whole.
pub fn parse_values(text: &str) -> Result<(Vec<Value>, Vec<Used>), JsonError> {
    let mut reader = Reader::new(text);
    let (start, end) = reader.unfence();
    reader.pos = start;
    reader.end = end;
    let mut values = Vec::new();
    loop {
        reader.skip_space();
        if reader.pos >= reader.end {
            break;
        }
        if values.is_empty() {
            reader.skip_leading_prose();
        } else if !reader.at_container_start() {
            // Text after the document(s).
            reader.note(Leniency::SurroundingProse);
            break;
        }
        if reader.pos >= reader.end {
            break;
        }
        let value = reader.value(0)?;
        values.push(value);
        reader.skip_space();
        // `[..];` or `[..],` between documents.
        while reader.pos < reader.end && matches!(reader.byte(), b';' | b',') {
            reader.pos += 1;
            reader.skip_space();
        }
    }
    if values.is_empty() {
        return Err(JsonError { message: "no JSON value found".into(), at: start });
    }
    Ok((values, reader.finish_notes()))
}

fn note_into(notes: &mut Vec<Used>, kind: Leniency, at: usize) {
    match notes.iter_mut().find(|u| u.kind == kind) {
        Some(u) => u.count += 1,
        None => {
            notes.push(Used { kind, at, count: 1 });
            notes.sort_by_key(|u| u.kind);
        }
    }
}

/// Typographic quotes, as UTF-8.
const LDQUO: &[u8] = "\u{201c}".as_bytes();
const RDQUO: &[u8] = "\u{201d}".as_bytes();
const LSQUO: &[u8] = "\u{2018}".as_bytes();
const RSQUO: &[u8] = "\u{2019}".as_bytes();
const FW_COMMA: &[u8] = "\u{ff0c}".as_bytes();
const FW_COLON: &[u8] = "\u{ff1a}".as_bytes();

/// How a string was opened, which decides what closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Double,
    Single,
    /// `“` (closed by `”` or `"`).
    SmartDouble,
    /// `‘` (closed by `’` or `'`).
    SmartSingle,
}

/// Which container is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Array,
    Object,
}

/// The tolerant recursive-descent reader. Positions are byte offsets into
/// `text`; every loop advances `pos` or returns.
struct Reader<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    end: usize,
    notes: Vec<Used>,
}

impl<'a> Reader<'a> {
    fn new(text: &'a str) -> Reader<'a> {
        Reader { text, bytes: text.as_bytes(), pos: 0, end: text.len(), notes: Vec::new() }
    }

    fn finish_notes(self) -> Vec<Used> {
        self.notes
    }

    fn note(&mut self, kind: Leniency) {
        note_into(&mut self.notes, kind, self.pos);
    }

    fn note_at(&mut self, kind: Leniency, at: usize) {
        note_into(&mut self.notes, kind, at);
    }

    fn error(&self, message: impl Into<String>) -> JsonError {
        JsonError { message: message.into(), at: self.pos }
    }

    fn byte(&self) -> u8 {
        self.bytes.get(self.pos).copied().unwrap_or(0)
    }

    fn starts_with(&self, s: &[u8]) -> bool {
        self.bytes.get(self.pos..self.end).is_some_and(|b| b.starts_with(s))
    }

    fn eof(&self) -> bool {
        self.pos >= self.end
    }

    /// Finds a Markdown code fence holding the document and returns the
    /// range inside it (the whole text when there is none).
    fn unfence(&mut self) -> (usize, usize) {
        let Some(open) = self.text.find("```") else {
            return (0, self.text.len());
        };
        let after = open + 3;
        // Skip the info string (`json`, `javascript`, ...) up to the newline.
        let body = match self.text[after..].find('\n') {
            Some(nl) => after + nl + 1,
            None => after + self.text[after..].len(),
        };
        let (close, rest) = match self.text[body..].find("```") {
            Some(c) => (body + c, body + c + 3),
            None => (self.text.len(), self.text.len()),
        };
        self.note_at(Leniency::CodeFence, open);
        let before = self.text[..open].trim();
        let after_close = self.text[rest..].trim();
        if !before.is_empty() || !after_close.is_empty() {
            self.note_at(Leniency::SurroundingProse, if before.is_empty() { rest } else { 0 });
        }
        (body, close)
    }

    /// Skips whitespace and comments (`//`, `/* */`, `#`).
    fn skip_space(&mut self) {
        while self.pos < self.end {
            let b = self.byte();
            if b.is_ascii_whitespace() {
                self.pos += 1;
            } else if self.starts_with(b"//") || b == b'#' {
                self.note(Leniency::Comment);
                while self.pos < self.end && self.byte() != b'\n' {
                    self.pos += 1;
                }
            } else if self.starts_with(b"/*") {
                self.note(Leniency::Comment);
                match self.text[self.pos + 2..self.end].find("*/") {
                    Some(i) => self.pos += 2 + i + 2,
                    None => self.pos = self.end,
                }
            } else if self.starts_with("\u{feff}".as_bytes()) || self.starts_with("\u{3000}".as_bytes()) {
                // A byte-order mark or an ideographic space.
                self.pos += 3;
            } else {
                break;
            }
        }
    }

    fn at_container_start(&self) -> bool {
        matches!(self.byte(), b'{' | b'[')
    }

    /// Whether a JSON value (not prose) starts here.
    fn at_value_start(&self) -> bool {
        match self.byte() {
            b'{' | b'[' | b'"' | b'\'' | b'-' | b'+' | b'.' | b'0'..=b'9' => true,
            _ if self.starts_with(LDQUO) || self.starts_with(LSQUO) => true,
            _ => {
                let word = self.word_at(self.pos);
                literal(word).is_some() && {
                    let after = self.pos + word.len();
                    after >= self.end || !self.bytes[after].is_ascii_alphanumeric()
                }
            }
        }
    }

    /// Skips prose before the document, up to the first `{` or `[`.
    fn skip_leading_prose(&mut self) {
        if self.at_value_start() {
            return;
        }
        let start = self.pos;
        // Without a container the value reader gets the text as it is (an
        // unquoted string, or an error).
        if let Some(i) = self.bytes[self.pos..self.end].iter().position(|&b| b == b'{' || b == b'[') {
            self.pos += i;
            self.note_at(Leniency::SurroundingProse, start);
        }
    }

    /// The run of ASCII letters at `at`.
    fn word_at(&self, at: usize) -> &'a str {
        let len = self.bytes[at.min(self.end)..self.end].iter().take_while(|b| b.is_ascii_alphabetic()).count();
        &self.text[at..at + len]
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.skip_space();
        if self.eof() {
            self.note(Leniency::Truncated);
            return Ok(Value::Null);
        }
        match self.byte() {
            b'{' => {
                self.pos += 1;
                self.container(Container::Object, depth)
            }
            b'[' => {
                self.pos += 1;
                self.container(Container::Array, depth)
            }
            b'"' | b'\'' => self.string().map(Value::String),
            _ if self.starts_with(LDQUO)
                || self.starts_with(LSQUO)
                || self.starts_with(RDQUO)
                || self.starts_with(RSQUO) =>
            {
                self.string().map(Value::String)
            }
            b'-' | b'+' | b'.' | b'0'..=b'9' => self.number(),
            b'}' | b']' | b',' | b':' => Err(self.error(format!("expected a value, found {:?}", self.byte() as char))),
            _ => self.word(),
        }
    }

    /// Reads an array or object after its opening bracket.
    fn container(&mut self, kind: Container, depth: usize) -> Result<Value, JsonError> {
        let mut items: Vec<Value> = Vec::new();
        let mut map = Map::new();
        // Whether a separator (or the opening bracket) came since the last
        // item: decides between a missing comma and a trailing comma.
        let mut separated = true;
        let mut first = true;
        loop {
            self.skip_space();
            if self.eof() {
                self.note(Leniency::Truncated);
                break;
            }
            let b = self.byte();
            let close_here = match (kind, b) {
                (Container::Array, b']') | (Container::Object, b'}') => Some(false),
                (Container::Array, b'}') | (Container::Object, b']') => Some(true),
                _ => None,
            };
            if let Some(mismatched) = close_here {
                if mismatched {
                    self.note(Leniency::MismatchedBracket);
                }
                self.pos += 1;
                break;
            }
            if b == b',' || self.starts_with(FW_COMMA) {
                if self.starts_with(FW_COMMA) {
                    self.note(Leniency::FullwidthPunctuation);
                    self.pos += FW_COMMA.len();
                } else {
                    self.pos += 1;
                }
                if separated {
                    // `[,1]` or `[1,,2]`.
                    self.note(Leniency::TrailingComma);
                }
                separated = true;
                self.skip_space();
                if !self.eof() && matches!(self.byte(), b']' | b'}') && !first {
                    self.note(Leniency::TrailingComma);
                }
                continue;
            }
            if !separated {
                self.note(Leniency::MissingComma);
            }
            match kind {
                Container::Array => {
                    let v = self.value(depth + 1)?;
                    items.push(v);
                }
                Container::Object => {
                    let key = self.key()?;
                    self.skip_space();
                    if self.eof() {
                        // `{"a"` or `{"a":` cut off: the key has no value.
                        self.note(Leniency::Truncated);
                        break;
                    }
                    if self.byte() == b':' {
                        self.pos += 1;
                    } else if self.starts_with(FW_COLON) {
                        self.note(Leniency::FullwidthPunctuation);
                        self.pos += FW_COLON.len();
                    } else {
                        return Err(self.error(format!("expected ':' after key {key:?}")));
                    }
                    self.skip_space();
                    if self.eof() {
                        self.note(Leniency::Truncated);
                        break;
                    }
                    let v = self.value(depth + 1)?;
                    map.insert(key, v);
                }
            }
            first = false;
            separated = false;
        }
        Ok(match kind {
            Container::Array => Value::Array(items),
            Container::Object => Value::Object(map),
        })
    }

    /// An object key: a string in any quotes, or an unquoted name.
    fn key(&mut self) -> Result<String, JsonError> {
        let b = self.byte();
        if b == b'"'
            || b == b'\''
            || self.starts_with(LDQUO)
            || self.starts_with(LSQUO)
            || self.starts_with(RDQUO)
            || self.starts_with(RSQUO)
        {
            return self.string();
        }
        let start = self.pos;
        while self.pos < self.end {
            let c = self.byte();
            if c == b':'
                || c == b','
                || c == b'{'
                || c == b'}'
                || c == b'['
                || c == b']'
                || c == b'"'
                || c == b'\''
                || c.is_ascii_whitespace()
                || self.starts_with(FW_COLON)
            {
                break;
            }
            self.pos += 1;
        }
        let key = &self.text[start..self.pos];
        let word_like = |c: char| c.is_alphanumeric() || matches!(c, '_' | '$' | '-' | '.' | '@' | '#' | '/');
        if key.is_empty() || !key.chars().all(word_like) {
            self.pos = start;
            let found = self.text[start..self.end].chars().next().unwrap_or(' ');
            return Err(self.error(format!("expected an object key, found {found:?}")));
        }
        self.note_at(Leniency::UnquotedKey, start);
        Ok(key.to_string())
    }

    /// A quoted string, the reader on its opening quote.
    fn string(&mut self) -> Result<String, JsonError> {
        let start = self.pos;
        let quote = if self.byte() == b'"' {
            self.pos += 1;
            Quote::Double
        } else if self.byte() == b'\'' {
            self.note(Leniency::SingleQuotes);
            self.pos += 1;
            Quote::Single
        } else if self.starts_with(LDQUO) || self.starts_with(RDQUO) {
            self.note(Leniency::SmartQuotes);
            self.pos += LDQUO.len();
            Quote::SmartDouble
        } else {
            self.note(Leniency::SmartQuotes);
            self.pos += LSQUO.len();
            Quote::SmartSingle
        };
        let mut out = String::new();
        // The first `"` taken as part of the text (see below), to go back
        // to if the string then never ends: (offset after it, text length).
        let mut first_inner: Option<(usize, usize)> = None;
        let mut inner_quotes = 0;
        loop {
            if self.eof() {
                if let Some((after, len)) = first_inner {
                    // The quote taken as text was the real end after all.
                    out.truncate(len);
                    self.pos = after;
                    return Ok(out);
                }
                self.note_at(Leniency::Truncated, start);
                return Ok(out);
            }
            let b = self.byte();
            // A closing quote?
            let close_len = match quote {
                Quote::Double if b == b'"' => 1,
                Quote::Single if b == b'\'' => 1,
                Quote::SmartDouble if self.starts_with(RDQUO) || self.starts_with(LDQUO) => RDQUO.len(),
                Quote::SmartDouble if b == b'"' => 1,
                Quote::SmartSingle if self.starts_with(RSQUO) => RSQUO.len(),
                Quote::SmartSingle if b == b'\'' => 1,
                _ => 0,
            };
            if close_len > 0 {
                let after = self.pos + close_len;
                if quote == Quote::Double && !self.ends_string_at(after) {
                    // `"he said "hi" there"`: the quote is part of the text.
                    first_inner.get_or_insert((after, out.len()));
                    inner_quotes += 1;
                    out.push('"');
                    self.pos = after;
                    continue;
                }
                for _ in 0..inner_quotes {
                    self.note_at(Leniency::UnescapedQuote, start);
                }
                self.pos = after;
                return Ok(out);
            }
            if b == b'\\' {
                self.escape(&mut out, quote)?;
                continue;
            }
            // Copy a run of ordinary characters.
            let run_start = self.pos;
            while self.pos < self.end {
                let c = self.byte();
                if c == b'\\' || c == b'"' || c == b'\'' || c == 0xE2 {
                    break;
                }
                if c < 0x20 {
                    self.note(Leniency::ControlCharacter);
                }
                self.pos += 1;
            }
            if self.pos == run_start {
                // A quote or a 0xE2 lead byte that is not our closing quote:
                // copy the whole character.
                let ch_len = utf8_len(self.byte());
                let stop = (self.pos + ch_len).min(self.end);
                out.push_str(&self.text[self.pos..stop]);
                self.pos = stop;
            } else {
                out.push_str(&self.text[run_start..self.pos]);
            }
        }
    }

    /// Whether a `"` ending at `after` really closes the string: what follows
    /// is a separator, a closing bracket, a colon, or the end.
    fn ends_string_at(&self, after: usize) -> bool {
        let mut i = after;
        while i < self.end && (self.bytes[i] == b' ' || self.bytes[i] == b'\t' || self.bytes[i] == b'\r') {
            i += 1;
        }
        if i >= self.end {
            return true;
        }
        let rest = &self.bytes[i..self.end];
        matches!(rest[0], b',' | b'}' | b']' | b':' | b'\n' | b'/' | b'#')
            || rest.starts_with(FW_COMMA)
            || rest.starts_with(FW_COLON)
    }

    /// An escape sequence, the reader on its backslash.
    fn escape(&mut self, out: &mut String, quote: Quote) -> Result<(), JsonError> {
        self.pos += 1;
        if self.eof() {
            self.note(Leniency::Truncated);
            return Ok(());
        }
        let b = self.byte();
        self.pos += 1;
        match b {
            b'"' => out.push('"'),
            b'\\' => out.push('\\'),
            b'/' => out.push('/'),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'u' => {
                let Some(unit) = self.hex4() else {
                    self.note(Leniency::InvalidEscape);
                    out.push('u');
                    return Ok(());
                };
                let ch = if (0xD800..0xDC00).contains(&unit) && self.starts_with(b"\\u") {
                    let save = self.pos;
                    self.pos += 2;
                    match self.hex4() {
                        Some(low) if (0xDC00..0xE000).contains(&low) => {
                            char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
                        }
                        _ => {
                            self.pos = save;
                            None
                        }
                    }
                } else {
                    char::from_u32(unit)
                };
                out.push(ch.unwrap_or('\u{fffd}'));
            }
            b'\'' if quote == Quote::Single => out.push('\''),
            _ => {
                self.note_at(Leniency::InvalidEscape, self.pos - 2);
                self.pos -= 1;
                let ch_len = utf8_len(self.byte());
                let stop = (self.pos + ch_len).min(self.end);
                out.push_str(&self.text[self.pos..stop]);
                self.pos = stop;
            }
        }
        Ok(())
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.bytes.get(self.pos..self.pos + 4).filter(|_| self.pos + 4 <= self.end)?;
        let s = std::str::from_utf8(digits).ok()?;
        let v = u32::from_str_radix(s, 16).ok()?;
        self.pos += 4;
        Some(v)
    }

    /// A number, strict or lenient.
    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let mut lenient = false;
        let mut norm = String::new();
        if self.byte() == b'+' {
            lenient = true;
            self.pos += 1;
        } else if self.byte() == b'-' {
            norm.push('-');
            self.pos += 1;
        }
        // `-Infinity`, `+Infinity`
        if self.byte().is_ascii_alphabetic() {
            let word = self.word_at(self.pos);
            if word == "Infinity" || word == "inf" {
                self.pos += word.len();
                self.note_at(Leniency::JsLiteral, start);
                return Ok(Value::Null);
            }
            self.pos = start;
            return self.word();
        }
        let int_start = self.pos;
        while self.pos < self.end && self.byte().is_ascii_digit() {
            self.pos += 1;
        }
        let int = &self.text[int_start..self.pos];
        if int.is_empty() {
            lenient = true;
            norm.push('0');
        } else if int.len() > 1 && int.starts_with('0') {
            lenient = true;
            let trimmed = int.trim_start_matches('0');
            norm.push_str(if trimmed.is_empty() { "0" } else { trimmed });
        } else {
            norm.push_str(int);
        }
        let mut float = false;
        if self.byte() == b'.' {
            self.pos += 1;
            let frac_start = self.pos;
            while self.pos < self.end && self.byte().is_ascii_digit() {
                self.pos += 1;
            }
            if self.pos == frac_start {
                lenient = true; // `5.`
            } else {
                float = true;
                norm.push('.');
                norm.push_str(&self.text[frac_start..self.pos]);
            }
        }
        if matches!(self.byte(), b'e' | b'E') {
            let save = self.pos;
            self.pos += 1;
            let mut exp = String::from("e");
            if matches!(self.byte(), b'+' | b'-') {
                exp.push(self.byte() as char);
                self.pos += 1;
            }
            let digits_start = self.pos;
            while self.pos < self.end && self.byte().is_ascii_digit() {
                self.pos += 1;
            }
            if self.pos == digits_start {
                self.pos = save;
            } else {
                float = true;
                exp.push_str(&self.text[digits_start..self.pos]);
                norm.push_str(&exp);
            }
        }
        // `12px`, `3rd`: not a number after all.
        if self.pos < self.end && (self.byte().is_ascii_alphabetic() || self.byte() == b'_') {
            self.pos = start;
            return self.word();
        }
        if norm == "-" || (int.is_empty() && !float) {
            if self.eof() {
                self.note_at(Leniency::Truncated, start);
                return Ok(Value::Null);
            }
            return Err(JsonError { message: "a number has no digits".into(), at: start });
        }
        if lenient {
            self.note_at(Leniency::NumberFormat, start);
        }
        match serde_json::from_str::<Number>(&norm) {
            Ok(n) => Ok(Value::Number(n)),
            Err(_) => match norm.parse::<f64>().ok().and_then(Number::from_f64) {
                Some(n) => Ok(Value::Number(n)),
                None => Err(JsonError { message: format!("number {norm:?} is out of range"), at: start }),
            },
        }
    }

    /// A bare word in value position: a literal, a Python/JS spelling of
    /// one, or an unquoted string.
    fn word(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let word = self.word_at(self.pos);
        let after = start + word.len();
        let word_ends = after >= self.end || !(self.bytes[after].is_ascii_alphanumeric() || self.bytes[after] == b'_');
        if word_ends && !word.is_empty() {
            if let Some((value, leniency)) = literal(word) {
                self.pos = after;
                if let Some(l) = leniency {
                    self.note_at(l, start);
                }
                return Ok(value);
            }
            if after >= self.end {
                // `tr` at the very end: a literal cut off.
                for (full, value) in [("true", Value::Bool(true)), ("false", Value::Bool(false)), ("null", Value::Null)]
                {
                    if full.starts_with(word) {
                        self.pos = after;
                        self.note_at(Leniency::Truncated, start);
                        return Ok(value);
                    }
                }
            }
        }
        // An unquoted string: up to a separator, a closing bracket or the
        // end of the line. Only word-like text qualifies (`widget.grid`,
        // `Dark Forest`, `#fff`); markup, calls and operators do not.
        let first_ok = {
            let c = self.byte();
            c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'-' | b'+' | b'.') || c >= 0x80
        };
        while self.pos < self.end {
            let c = self.byte();
            if matches!(c, b',' | b'}' | b']' | b'\n' | b'\r') || self.starts_with(FW_COMMA) {
                break;
            }
            let word_like = c.is_ascii_alphanumeric()
                || c >= 0x80
                || matches!(c, b'_' | b'-' | b'.' | b'/' | b':' | b'@' | b'#' | b'$' | b'%' | b'+' | b' ' | b'\t');
            if !first_ok || !word_like {
                return Err(JsonError {
                    message: format!("unexpected {:?} in a value", self.text[self.pos..].chars().next().unwrap_or(' ')),
                    at: self.pos,
                });
            }
            self.pos += 1;
        }
        let s = self.text[start..self.pos].trim_end();
        if s.is_empty() {
            return Err(JsonError {
                message: format!("expected a value, found {:?}", self.text[start..].chars().next().unwrap_or(' ')),
                at: start,
            });
        }
        self.note_at(Leniency::UnquotedString, start);
        Ok(Value::String(s.to_string()))
    }
}

/// A literal word: the value and the leniency its spelling needs.
fn literal(word: &str) -> Option<(Value, Option<Leniency>)> {
    Some(match word {
        "true" => (Value::Bool(true), None),
        "false" => (Value::Bool(false), None),
        "null" => (Value::Null, None),
        "True" | "TRUE" => (Value::Bool(true), Some(Leniency::PythonLiteral)),
        "False" | "FALSE" => (Value::Bool(false), Some(Leniency::PythonLiteral)),
        "None" | "Null" | "NULL" | "nil" => (Value::Null, Some(Leniency::PythonLiteral)),
        "undefined" | "NaN" | "Infinity" => (Value::Null, Some(Leniency::JsLiteral)),
        _ => return None,
    })
}

/// Length of the UTF-8 sequence a lead byte starts (1 for anything else).
fn utf8_len(b: u8) -> usize {
    match b {
        0xC0..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF7 => 4,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(text: &str) -> (Value, Vec<Leniency>) {
        let read = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        (read.value, read.leniencies.iter().map(|u| u.kind).collect())
    }

    #[test]
    fn strict_json_reports_nothing() {
        let (v, k) = kinds(r#"{"a": [1, 2.5, "x", true, null]}"#);
        assert_eq!(v, json!({"a": [1, 2.5, "x", true, null]}));
        assert!(k.is_empty());
    }

    #[test]
    fn keys_keep_their_order() {
        let (v, _) = kinds("{z: 1, a: 2, m: 3,}");
        let keys: Vec<&String> = v.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["z", "a", "m"]);
    }

    #[test]
    fn every_leniency_is_reported() {
        use Leniency::*;
        let table: &[(&str, Value, &[Leniency])] = &[
            ("```json\n[1, 2]\n```", json!([1, 2]), &[CodeFence]),
            ("```\n[1]\n```", json!([1]), &[CodeFence]),
            ("Here you go:\n```json\n{\"a\": 1}\n```\nDone.", json!({"a": 1}), &[CodeFence, SurroundingProse]),
            ("```json\n{\"a\": 1}", json!({"a": 1}), &[CodeFence]),
            ("Sure! Here is the JSON:\n{\"a\": 1}", json!({"a": 1}), &[SurroundingProse]),
            ("{\"a\": 1} hope this helps", json!({"a": 1}), &[SurroundingProse]),
            ("[1, 2,]", json!([1, 2]), &[TrailingComma]),
            ("{\"a\": 1,}", json!({"a": 1}), &[TrailingComma]),
            ("[1,,2]", json!([1, 2]), &[TrailingComma]),
            ("[1 2]", json!([1, 2]), &[MissingComma]),
            ("{\"a\": 1\n \"b\": 2}", json!({"a": 1, "b": 2}), &[MissingComma]),
            ("{\"a\": 1 // one\n}", json!({"a": 1}), &[Comment]),
            ("{/* c */ \"a\": 1}", json!({"a": 1}), &[Comment]),
            ("{\"a\": 1 # py\n}", json!({"a": 1}), &[Comment]),
            ("{'a': 'b'}", json!({"a": "b"}), &[SingleQuotes]),
            ("{'a': 'it\\'s'}", json!({"a": "it's"}), &[SingleQuotes]),
            ("{\u{201c}a\u{201d}: \u{201c}b\u{201d}}", json!({"a": "b"}), &[SmartQuotes]),
            ("{\u{2018}a\u{2019}: 1}", json!({"a": 1}), &[SmartQuotes]),
            ("{a: 1, b_c: 2, $d: 3}", json!({"a": 1, "b_c": 2, "$d": 3}), &[UnquotedKey]),
            ("{好感度: 1}", json!({"好感度": 1}), &[UnquotedKey]),
            ("{\"view\": widget.grid}", json!({"view": "widget.grid"}), &[UnquotedString]),
            ("[True, False, None]", json!([true, false, null]), &[PythonLiteral]),
            ("[undefined, NaN]", json!([null, null]), &[JsLiteral]),
            ("[+1, .5, 5., 007]", json!([1, 0.5, 5, 7]), &[NumberFormat]),
            ("{\"a\": \"line\nbreak\"}", json!({"a": "line\nbreak"}), &[ControlCharacter]),
            ("{\"a\": \"\\q\"}", json!({"a": "q"}), &[InvalidEscape]),
            ("{\"a\": \"he said \"hi\" there\"}", json!({"a": "he said \"hi\" there"}), &[UnescapedQuote]),
            ("{\"a\"\u{ff1a}1\u{ff0c}\"b\": 2}", json!({"a": 1, "b": 2}), &[FullwidthPunctuation]),
            ("{\"a\": [1, 2}", json!({"a": [1, 2]}), &[MismatchedBracket, Truncated]),
            ("[[\"SET\", \"a\", 1], [\"ADD\", \"b\"", json!([["SET", "a", 1], ["ADD", "b"]]), &[Truncated]),
            ("{\"a\": \"cut", json!({"a": "cut"}), &[Truncated]),
            ("{\"a\": 1, \"b\":", json!({"a": 1}), &[Truncated]),
            ("{\"a\": 1, \"b\"", json!({"a": 1}), &[Truncated]),
            ("[1, tr", json!([1, true]), &[Truncated]),
            ("[1, -", json!([1, null]), &[Truncated]),
        ];
        for (text, want, want_kinds) in table {
            let (v, k) = kinds(text);
            assert_eq!(&v, want, "value of {text:?}");
            assert_eq!(&k, want_kinds, "leniencies of {text:?}");
        }
    }

    #[test]
    fn failures_are_errors_with_offsets() {
        for text in ["", "   ", "just words", "{\"a\" 1}", "{:}", "[1, :]"] {
            let r = parse(text);
            if text == "just words" {
                // A bare unquoted string is still a value.
                assert_eq!(r.map(|l| l.value), Ok(json!("just words")));
                continue;
            }
            let err = r.expect_err(text);
            assert!(err.at <= text.len(), "{text:?}: {err}");
            assert!(!err.message.is_empty());
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 10);
        let err = parse(&deep).expect_err("too deep");
        assert!(err.message.contains("nesting"), "{err}");
    }

    #[test]
    fn several_documents() {
        let (values, used) = parse_values("[\"SET\", \"a\", 1]\n[\"ADD\", \"b\", 2];\n").unwrap_or_default();
        assert_eq!(values, [json!(["SET", "a", 1]), json!(["ADD", "b", 2])]);
        assert!(used.is_empty(), "{used:?}");
    }

    #[test]
    fn unicode_survives() {
        let (v, k) = kinds("{'纯田真奈.好感度': '很高', emoji: '😀\\u00e9'}");
        assert_eq!(v, json!({"纯田真奈.好感度": "很高", "emoji": "😀é"}));
        assert_eq!(k, [Leniency::SingleQuotes, Leniency::UnquotedKey]);
    }
}
