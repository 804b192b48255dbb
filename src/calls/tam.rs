//! TAM blocks (spec 000; spec 002 §5): the text between
//! `<|[REQUEST_TOOL]|>` and `<|[END_TOOL]|>`, read into a [`ToolCall`].
//!
//! This module owns the key/value grammar of a block and its mapping onto
//! steps. It must not look for the block's markers (the machine does) and
//! it checks nothing against tool definitions ([`super::catalog`] does).
//!
//! # Grammar, as read here
//!
//! ```text
//! block  := line*
//! line   := blank | "# comment" | "```fence" | key ":" ws* OPEN value CLOSE
//! OPEN   := "»»»" | ">>>" | "「始」"       CLOSE := "«««" | "<<<" | "「末」"
//! ```
//!
//! Values are taken verbatim (no escapes), may span lines, and are trimmed.
//! The block's common indentation is removed first, so it is never part of
//! a value (spec 000 §5.3). Leniencies, each reported in `warnings`:
//!
//! | written | read as | code |
//! |---|---|---|
//! | `>>>`/`<<<` in a block that also uses another style, or a value opened in one style and closed in another | the value | `mixed_delimiters_used` |
//! | only `>>>`/`<<<` | the values | `alternate_delimiters_used` |
//! | no closing delimiter | the value ends before the next key line (or at the block's end) | `missing_close_delimiter` |
//! | `key: value` with no delimiters | a one-line value | `missing_delimiters` |
//! | text that is none of the above | ignored | `stray_text` |
//!
//! Lines starting with `#` are comments: not part of any call, kept in
//! `comments` for display. A line starting with three backticks (a code
//! fence around the key lines) is ignored.
//!
//! # Keys
//!
//! [`normalize_key`] implements spec 000 §2.3 (trim, lower-case,
//! non-alphanumerics to `_`, runs of `_` folded) plus the splits its
//! examples need: camelCase (`filePath_1` -> `file_path_1`) and a step
//! number written straight after a letter (`CONTENT1` -> `content_1`,
//! `command1` -> `command_1`).
//!
//! # Steps
//!
//! `command_N` opens step N; steps run in ascending N; an unnumbered
//! `command` is one step. `on_error_N` (`stop`, the default, or
//! `continue`), `retry_N`, `type_hint_<param>_N`, `uri_<param>_N` modify
//! step N; `common_<param>` is given to every step unless the step sets
//! `<param>` itself; `request_id` and `comment` describe the block. An
//! unnumbered key belongs to the unnumbered step when there is one, else
//! to every step (`unnumbered_param_applied_to_all`), or to the only step.
//! `@{...}` references are plain text.

use super::{CallFormat, Findings, Lines, OnError, Step, ToolCall};
use crate::event::DiagnosticCode;
use crate::scan::find_str;
use base64::Engine;
use serde_json::Value;
use std::collections::BTreeMap;

/// A TAM value delimiter style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Delimiter {
    /// `»»»value«««`, the standard of spec 000.
    Guillemet,
    /// `>>>value<<<`, the tolerated alternative.
    Angle,
    /// `「始」value「末」`, the delimiters of spec 002 §5.
    Cjk,
}

impl Delimiter {
    /// Every style, in the order they are tried.
    pub const ALL: [Delimiter; 3] = [Delimiter::Guillemet, Delimiter::Cjk, Delimiter::Angle];

    /// The opening delimiter.
    pub fn open(self) -> &'static str {
        match self {
            Delimiter::Guillemet => "»»»",
            Delimiter::Angle => ">>>",
            Delimiter::Cjk => "「始」",
        }
    }

    /// The closing delimiter.
    pub fn close(self) -> &'static str {
        match self {
            Delimiter::Guillemet => "«««",
            Delimiter::Angle => "<<<",
            Delimiter::Cjk => "「末」",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Delimiter::Guillemet => "»»» «««",
            Delimiter::Angle => ">>> <<<",
            Delimiter::Cjk => "「始」 「末」",
        }
    }
}

/// A key after normalisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalKey {
    /// The whole normalised key (`file_path_1`).
    pub name: String,
    /// The key without its step number (`file_path`).
    pub base: String,
    /// The step number (`1`), if the key ends in one.
    pub step: Option<u64>,
    /// The number followed a letter directly (`content1`), so it may also
    /// be part of the name (`sha256`); [`NormalKey::joined`] is that name.
    pub implicit: bool,
}

impl NormalKey {
    /// The key read without a step number: `sha256` for `sha256`, else
    /// [`NormalKey::name`].
    pub fn joined(&self) -> String {
        match (self.implicit, self.step) {
            (true, Some(n)) => format!("{}{n}", self.base),
            _ => self.name.clone(),
        }
    }
}

/// Normalises a TAM key (spec 000 §2.3 and its worked examples).
///
/// ```
/// use spindle::calls::tam::normalize_key;
///
/// for (raw, want) in [
///     ("File-Path 1", "file_path_1"),
///     ("filePath_1", "file_path_1"),
///     ("File Path_1", "file_path_1"),
///     ("CONTENT1", "content_1"),
///     ("command1", "command_1"),
///     ("Command_1", "command_1"),
///     ("  type-hint  payload 3 ", "type_hint_payload_3"),
/// ] {
///     assert_eq!(normalize_key(raw).name, want);
/// }
/// let k = normalize_key("filePath1");
/// assert_eq!((k.base.as_str(), k.step), ("file_path", Some(1)));
/// ```
pub fn normalize_key(raw: &str) -> NormalKey {
    // One pass over the characters: a separator (`_`) is written only
    // between words (never first, never twice in a row, dropped at the end),
    // so no second pass over the result is needed.
    let mut name = String::with_capacity(raw.len() + 4);
    let separate = |name: &mut String| {
        if !name.is_empty() && !name.ends_with('_') {
            name.push('_');
        }
    };
    let mut prev: Option<char> = None;
    let mut chars = raw.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if !c.is_alphanumeric() {
            separate(&mut name);
        } else {
            if c.is_uppercase()
                && let Some(prev) = prev
            {
                let next_lower = chars.peek().is_some_and(|n| n.is_lowercase());
                // fooBar, v2Name, HTTPRequest -> foo_bar, v2_name, http_request
                if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                    separate(&mut name);
                }
            }
            if c.is_ascii() {
                name.push(c.to_ascii_lowercase());
            } else {
                name.extend(c.to_lowercase());
            }
        }
        prev = Some(c);
    }
    if name.ends_with('_') {
        name.pop();
    }
    // A trailing step number: ASCII digits, one byte each.
    let digits = name.bytes().rev().take_while(u8::is_ascii_digit).count();
    let pre_len = name.len() - digits;
    let number = name[pre_len..].parse::<u64>().ok();
    match (number, name[..pre_len].chars().last()) {
        (Some(n), Some('_')) => {
            let base = name[..pre_len].trim_end_matches('_').to_string();
            NormalKey { name, base, step: Some(n), implicit: false }
        }
        (Some(n), Some(c)) if c.is_alphabetic() => {
            // `content1`: the name gets the separator.
            let mut base = name;
            base.truncate(pre_len);
            let name = format!("{base}_{n}");
            NormalKey { name, base, step: Some(n), implicit: true }
        }
        _ => NormalKey { base: name.clone(), name, step: None, implicit: false },
    }
}

/// Longest key read as a key, in characters.
const MAX_KEY_CHARS: usize = 128;

/// One `key: value` entry as written.
#[derive(Debug, Clone)]
struct Entry {
    raw_key: String,
    key: NormalKey,
    value: String,
    line: usize,
}

/// A key line: the key and where its value starts.
#[derive(Debug, Clone, Copy)]
struct KeyLine<'a> {
    key: &'a str,
    /// Delimiter style and the offset just past the opening delimiter.
    open: Option<(Delimiter, usize)>,
    /// Offset just past the colon and the spaces after it.
    after_colon: usize,
}

fn is_hspace(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\u{3000}'
}

/// Reads `key:` (or `key：`) at `start` (a line start) of `s`.
fn key_line(s: &str, start: usize) -> Option<KeyLine<'_>> {
    let line_end = line_end(s, start);
    let line = &s[start..line_end];
    let lead = line.len() - line.trim_start_matches(is_hspace).len();
    let body = &line[lead..];
    // The colon, `:` or the full-width `：` (read by bytes: both are
    // whole characters, so the position is a character boundary).
    let (colon, colon_len) = body.bytes().enumerate().find_map(|(i, b)| match b {
        b':' => Some((i, 1)),
        0xEF if body.as_bytes()[i..].starts_with("：".as_bytes()) => Some((i, "：".len())),
        _ => None,
    })?;
    let key = body[..colon].trim_matches(is_hspace);
    if key.starts_with(['#', '`']) || !plausible_key(key) {
        return None;
    }
    let rest_at = start + lead + colon + colon_len;
    let rest = &s[rest_at..line_end];
    let spaces = rest.len() - rest.trim_start_matches(is_hspace).len();
    let after_colon = rest_at + spaces;
    let open_at =
        |at: usize| Delimiter::ALL.iter().find(|d| s[at..].starts_with(d.open())).map(|d| (*d, at + d.open().len()));
    let mut open = open_at(after_colon);
    if open.is_none() && s[after_colon..line_end].trim().is_empty() && line_end < s.len() {
        // `key:` with the opening delimiter on the next line.
        let next = &s[line_end + 1..];
        let pad = next.len() - next.trim_start_matches(is_hspace).len();
        open = open_at(line_end + 1 + pad);
    }
    Some(KeyLine { key, open, after_colon })
}

/// Whether `key` (trimmed) can be a key: not empty, at most
/// [`MAX_KEY_CHARS`] characters, at least one letter or digit, and none of
/// the characters of delimiters, quotes, brackets and prose punctuation.
fn plausible_key(key: &str) -> bool {
    let (mut count, mut alphanumeric) = (0, false);
    for c in key.chars() {
        count += 1;
        if count > MAX_KEY_CHARS
            || matches!(
                c,
                '»' | '«' | '<' | '>' | '「' | '」' | '"' | '\'' | '{' | '}' | '[' | ']' | '(' | ')' | '=' | ',' | ';'
            )
        {
            return false;
        }
        alphanumeric |= c.is_alphanumeric();
    }
    alphanumeric
}

/// Whether a key with no delimiters looks like a parameter name (at most
/// three words of letters, digits, `_`, `-`, `.`), so that `key: value`
/// may be read; longer text before a colon is prose.
fn plain_key(key: &str) -> bool {
    key.chars().count() <= 64
        && key.split_whitespace().count() <= 3
        && key.chars().all(|c| c.is_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.'))
}

fn line_end(s: &str, at: usize) -> usize {
    crate::scan::find_byte(b'\n', &s.as_bytes()[at..]).map_or(s.len(), |i| at + i)
}

fn next_line(s: &str, at: usize) -> usize {
    crate::scan::find_byte(b'\n', &s.as_bytes()[at..]).map_or(s.len(), |i| at + i + 1)
}

fn is_fence(line: &str) -> bool {
    line.trim_start_matches(is_hspace).starts_with("```")
}

/// How far past a key-like line the reader looks for the closing
/// delimiter of the value it may belong to.
const LOOKAHEAD: usize = 16 * 1024;

/// The start of the first line after the one holding `at` that is a
/// delimited key line ending the value opened with `style`.
///
/// A key line in another style (`Note: >>> see below` inside a `»»»`
/// value) does not end the value when the value's own closing delimiter
/// follows it (within [`LOOKAHEAD`] bytes), that line's value would not be
/// closed before it, and the value was not closed in another style on an
/// earlier line: it is text of the value.
fn next_key_line(s: &str, at: usize, style: Delimiter) -> Option<(usize, KeyLine<'_>)> {
    let mut pos = next_line(s, at);
    while pos < s.len() {
        if let Some(kl @ KeyLine { open: Some((other, vstart)), .. }) = key_line(s, pos) {
            // Same style, or the value was already closed in another
            // style at the end of an earlier line: a real key line.
            if other == style || foreign_close(s, at, pos, style).is_some() {
                return Some((pos, kl));
            }
            let mut end = (vstart + LOOKAHEAD).min(s.len());
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            let window = &s[vstart..end];
            let own = find_str(window, style.close());
            let theirs = find_str(window, other.close());
            let inside = own.is_some_and(|o| theirs.is_none_or(|t| o < t));
            if !inside {
                return Some((pos, kl));
            }
        }
        pos = next_line(s, pos);
    }
    None
}

/// Removes the block's common leading whitespace. Blank and fence lines do
/// not count, nor does the first line: it starts right after the opening
/// marker (empty when the marker ended its line).
fn dedent(text: &str) -> String {
    let mut common: Option<&str> = None;
    for (i, line) in text.split('\n').enumerate() {
        if i == 0 || line.trim().is_empty() || is_fence(line) {
            continue;
        }
        let indent = &line[..line.len() - line.trim_start_matches(is_hspace).len()];
        common = Some(match common {
            None => indent,
            Some(c) => {
                let n = c.char_indices().zip(indent.chars()).take_while(|((_, a), b)| a == b).count();
                let end = c.char_indices().nth(n).map_or(c.len(), |(i, _)| i);
                &c[..end]
            }
        });
    }
    let common = common.unwrap_or("");
    if common.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
            let shared = line.char_indices().zip(common.chars()).take_while(|((_, a), b)| a == b).count();
            let cut = line.char_indices().nth(shared).map_or(line.len(), |(j, _)| j);
            out.push_str(&line[cut..]);
        } else {
            out.push_str(line);
        }
    }
    out
}

/// Cuts trailing fence lines, and trailing comment lines set off by a blank
/// line, from a value that had no closing delimiter; returns the comments.
fn trim_open_value(value: &str) -> (&str, Vec<String>) {
    let lines: Vec<&str> = value.split('\n').collect();
    let mut end = lines.len();
    while end > 0 && (lines[end - 1].trim().is_empty() || is_fence(lines[end - 1])) {
        end -= 1;
    }
    let mut comments = Vec::new();
    let mut k = end;
    while k > 0 && lines[k - 1].trim_start().starts_with('#') {
        k -= 1;
    }
    if k < end && k > 0 && lines[k - 1].trim().is_empty() {
        comments = lines[k..end].iter().map(|l| comment_text(l)).collect();
        end = k;
        while end > 0 && lines[end - 1].trim().is_empty() {
            end -= 1;
        }
    }
    let len: usize = lines[..end].iter().map(|l| l.len() + 1).sum::<usize>();
    (&value[..len.saturating_sub(1).min(value.len())], comments)
}

fn comment_text(line: &str) -> String {
    line.trim().trim_start_matches('#').trim().to_string()
}

/// The reader's pass over the text: entries, comments, styles used.
#[derive(Debug, Default)]
struct Scan {
    entries: Vec<Entry>,
    comments: Vec<String>,
    styles: Vec<Delimiter>,
}

impl Scan {
    fn style(&mut self, d: Delimiter) {
        if !self.styles.contains(&d) {
            self.styles.push(d);
        }
    }
}

/// Reads the lines of a dedented block.
fn scan(s: &str, f: &mut Findings) -> Scan {
    let lines = Lines::new(s);
    let line_of = |_: &str, at: usize| lines.line(at);
    let mut out = Scan::default();
    let mut pos = 0;
    // A key line already read further on (the line that ends a value, or
    // the key after a closing delimiter), where the reading goes next.
    let mut ahead: Option<(usize, KeyLine<'_>)> = None;
    while pos < s.len() {
        let end = line_end(s, pos);
        let line = &s[pos..end];
        let trimmed = line.trim();
        if trimmed.is_empty() || is_fence(line) {
            pos = next_line(s, pos);
            continue;
        }
        if trimmed.starts_with('#') {
            out.comments.push(comment_text(trimmed));
            pos = next_line(s, pos);
            continue;
        }
        let read = match ahead.take() {
            Some((at, kl)) if at == pos => Some(kl),
            _ => key_line(s, pos),
        };
        let Some(kl) = read else {
            f.warn(
                DiagnosticCode::StrayText,
                format!("line {} is not a `key:»»»value«««` line and was ignored: {trimmed:?}", line_of(s, pos)),
            );
            pos = next_line(s, pos);
            continue;
        };
        let line_no = line_of(s, pos);
        let Some((style, vstart)) = kl.open else {
            if plain_key(kl.key) {
                let mut value = s[kl.after_colon..end].trim();
                for d in Delimiter::ALL {
                    if let Some(v) = value.strip_suffix(d.close()) {
                        value = v.trim();
                        out.style(d);
                    }
                    // `key:»»` cut off by the end of the output.
                    if !value.is_empty() && d.open().starts_with(value) {
                        value = "";
                    }
                }
                f.warn(
                    DiagnosticCode::MissingDelimiters,
                    format!(
                        "line {line_no}: key {:?} has no »»» ««« delimiters; its value was read to the end of the line",
                        kl.key
                    ),
                );
                out.entries.push(Entry {
                    raw_key: kl.key.to_string(),
                    key: normalize_key(kl.key),
                    value: value.to_string(),
                    line: line_no,
                });
            } else {
                f.warn(
                    DiagnosticCode::StrayText,
                    format!("line {line_no} is not a `key:»»»value«««` line and was ignored: {trimmed:?}"),
                );
            }
            pos = next_line(s, pos);
            continue;
        };
        out.style(style);
        let next_key = next_key_line(s, vstart, style);
        let limit = next_key.map_or(s.len(), |(at, _)| at);
        ahead = next_key;
        let own_close = find_str(&s[vstart..limit], style.close()).map(|i| vstart + i).filter(|&c| c < limit);
        let (value, resume) = match own_close {
            Some(c) => (&s[vstart..c], c + style.close().len()),
            None => {
                match foreign_close(s, vstart, limit, style) {
                    Some((c, d)) => {
                        out.style(d);
                        f.warn(
                            DiagnosticCode::MixedDelimitersUsed,
                            format!(
                                "line {line_no}: the value of {:?} opens with {} and closes with {}",
                                kl.key,
                                style.open(),
                                d.close()
                            ),
                        );
                        (&s[vstart..c], c + d.close().len())
                    }
                    None => {
                        let what = if next_key.is_some() { "the next key line" } else { "the end of the block" };
                        f.warn(
                            DiagnosticCode::MissingCloseDelimiter,
                            format!(
                                "line {line_no}: the value of {:?} has no closing {}; it was read up to {what}",
                                kl.key,
                                style.close()
                            ),
                        );
                        let (mut value, comments) = trim_open_value(&s[vstart..limit]);
                        out.comments.extend(comments);
                        if next_key.is_none() {
                            // Cut off inside the closing delimiter: `value««` (longest first).
                            let close = style.close();
                            for (i, _) in close.char_indices().rev().filter(|(i, _)| *i > 0) {
                                if let Some(v) = value.strip_suffix(&close[..i]) {
                                    value = v;
                                    break;
                                }
                            }
                        }
                        (value, limit)
                    }
                }
            }
        };
        out.entries.push(Entry {
            raw_key: kl.key.to_string(),
            key: normalize_key(kl.key),
            value: value.trim().to_string(),
            line: line_no,
        });
        pos = resume;
        if pos < s.len() && s.as_bytes().get(pos.wrapping_sub(1)) != Some(&b'\n') {
            // Rest of the line after a closing delimiter: another key, or
            // something to report.
            let rest_end = line_end(s, pos);
            let rest = s[pos..rest_end].trim();
            if rest.is_empty() {
                pos = next_line(s, pos);
            } else if let Some(kl) = key_line(s, pos).filter(|k| k.open.is_some()) {
                // `a:»»»x«««b:»»»y«««`: go on reading at `b`.
                ahead = Some((pos, kl));
            } else {
                f.warn(
                    DiagnosticCode::StrayText,
                    format!("line {}: text after a value was ignored: {rest:?}", line_of(s, pos)),
                );
                pos = next_line(s, pos);
            }
        }
    }
    out
}

/// A closing delimiter of another style at the end of a line (only
/// whitespace after it), between `from` and `limit`.
fn foreign_close(s: &str, from: usize, limit: usize, style: Delimiter) -> Option<(usize, Delimiter)> {
    let mut pos = from;
    while pos < limit {
        let end = line_end(s, pos).min(limit);
        let line = s[pos..end].trim_end();
        for d in Delimiter::ALL.into_iter().filter(|d| *d != style) {
            if line.ends_with(d.close()) {
                return Some((pos + line.len() - d.close().len(), d));
            }
        }
        pos = next_line(s, pos);
    }
    None
}

/// Where an entry's value goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// Step `command_N`, or the unnumbered step (`None`).
    Step(Option<u64>),
    /// Every step (an unnumbered key in a block of numbered steps).
    All,
}

/// What one step collects before it is built.
#[derive(Debug, Default)]
struct StepParts {
    tool_id: Option<String>,
    params: serde_json::Map<String, Value>,
    on_error: Option<String>,
    retry: Option<String>,
    type_hints: BTreeMap<String, String>,
    uris: BTreeMap<String, String>,
    comment: Option<String>,
}

/// Reads a TAM block's inner text into a call.
///
/// ```
/// use spindle::calls::tam::parse_tam;
///
/// let (call, _) = parse_tam("\ncommand:「始」Search「末」\nquery:「始」cats\nand dogs「末」\n");
/// assert_eq!(call.steps[0].tool_id, "Search");
/// assert_eq!(call.steps[0].params["query"], "cats\nand dogs");
/// assert!(call.warnings.is_empty());
/// ```
pub fn parse_tam(text: &str) -> (ToolCall, Findings) {
    let mut f = Findings::default();
    let s = dedent(text);
    let scanned = scan(&s, &mut f);
    if scanned.styles.len() > 1 {
        if !f.warnings.iter().any(|w| w == "mixed_delimiters_used") {
            let names: Vec<&str> = scanned.styles.iter().map(|d| d.name()).collect();
            f.warn(
                DiagnosticCode::MixedDelimitersUsed,
                format!("the block mixes delimiter styles: {}", names.join(", ")),
            );
        }
    } else if scanned.styles == [Delimiter::Angle] {
        f.warn(
            DiagnosticCode::AlternateDelimitersUsed,
            "the block uses >>> <<< instead of the standard »»» «««".to_string(),
        );
    }
    let mut call = ToolCall::new(CallFormat::Tam);
    call.comments = scanned.comments;
    assemble(scanned.entries, &mut call, &mut f);
    (call, f)
}

/// Maps entries onto steps.
fn assemble(entries: Vec<Entry>, call: &mut ToolCall, f: &mut Findings) {
    // Pass 1: which steps exist.
    let mut steps: BTreeMap<Option<u64>, StepParts> = BTreeMap::new();
    for e in &entries {
        if e.key.base == "command" {
            steps.entry(e.key.step).or_default();
        }
    }
    if steps.is_empty() {
        let msg = "the block has no `command` key, so it names no tool".to_string();
        f.error(DiagnosticCode::MissingCommand, msg.clone());
        for e in entries {
            match e.key.name.as_str() {
                "request_id" => call.request_id = Some(e.value),
                "comment" => call.comment = Some(e.value),
                _ => {
                    call.unassigned.insert(e.key.name, Value::String(e.value));
                }
            }
        }
        call.observation = Some(format!("Observation: Error - Invalid TAM block: {msg}"));
        call.error = Some(msg);
        return;
    }
    let numbered: Vec<u64> = steps.keys().filter_map(|k| *k).collect();
    let has_unnumbered = steps.contains_key(&None);
    let mut all = StepParts::default();
    let mut common = serde_json::Map::new();
    // For an entry whose key came before, the line it last came on (read
    // before the entries are taken apart: the keys are borrowed).
    let repeats: Vec<Option<usize>> = {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        entries.iter().map(|e| seen.insert(&e.key.name, e.line)).collect()
    };

    for (e, repeat) in entries.into_iter().zip(repeats) {
        if let Some(first) = repeat {
            f.warn(
                DiagnosticCode::DuplicateKey,
                format!(
                    "line {}: key {:?} ({}) repeats line {first}; the later value wins",
                    e.line, e.raw_key, e.key.name
                ),
            );
        }
        // Resolve the key into (name, target).
        let (base, target) = match e.key.step {
            Some(n) if steps.contains_key(&Some(n)) => (e.key.base.clone(), Target::Step(Some(n))),
            Some(_) if e.key.base == "command" => (e.key.base.clone(), Target::Step(e.key.step)),
            Some(_) if e.key.implicit => (e.key.joined(), unnumbered_target(has_unnumbered, &numbered)),
            Some(n) if has_unnumbered && numbered.is_empty() => {
                f.warn(
                    DiagnosticCode::StepNumberMismatch,
                    format!(
                        "line {}: key {:?} names step {n} but the block has one unnumbered command; given to it",
                        e.line, e.raw_key
                    ),
                );
                (e.key.base.clone(), Target::Step(None))
            }
            Some(n) => {
                f.warn(
                    DiagnosticCode::ParamsWithoutCommand,
                    format!(
                        "line {}: key {:?} belongs to step {n}, which has no command_{n}; kept in `unassigned`",
                        e.line, e.raw_key
                    ),
                );
                call.unassigned.insert(e.key.name.clone(), Value::String(e.value));
                continue;
            }
            None => (e.key.base.clone(), unnumbered_target(has_unnumbered, &numbered)),
        };
        match base.as_str() {
            "request_id" if e.key.step.is_none() => call.request_id = Some(e.value),
            "comment" if e.key.step.is_none() => call.comment = Some(e.value),
            _ if base.starts_with("common_") && e.key.step.is_none() => {
                common.insert(base["common_".len()..].to_string(), Value::String(e.value));
            }
            _ => {
                if target == Target::All && !is_modifier(&base) {
                    f.warn(
                        DiagnosticCode::UnnumberedParamAppliedToAll,
                        format!(
                            "line {}: {:?} has no step number in a block of numbered steps; given to every step",
                            e.line, e.raw_key
                        ),
                    );
                }
                let parts = match target {
                    Target::Step(k) => steps.entry(k).or_default(),
                    Target::All => &mut all,
                };
                put(parts, base, e.value);
            }
        }
    }

    if has_unnumbered && !numbered.is_empty() {
        f.warn(
            DiagnosticCode::MixedNumberedCommands,
            "the block has both an unnumbered `command` and numbered ones; the unnumbered step runs first".to_string(),
        );
    }
    for (index, parts) in steps {
        call.steps.push(build_step(index, parts, &all, &common, f));
    }
}

fn unnumbered_target(has_unnumbered: bool, numbered: &[u64]) -> Target {
    match (has_unnumbered, numbered) {
        (true, _) | (false, []) => Target::Step(None),
        (false, [n]) => Target::Step(Some(*n)),
        _ => Target::All,
    }
}

fn is_modifier(base: &str) -> bool {
    matches!(base, "on_error" | "retry") || base.starts_with("type_hint_") || base.starts_with("uri_")
}

fn put(parts: &mut StepParts, base: String, value: String) {
    if base == "command" {
        parts.tool_id = Some(value);
    } else if base == "on_error" {
        parts.on_error = Some(value);
    } else if base == "retry" {
        parts.retry = Some(value);
    } else if base == "comment" {
        parts.comment = Some(value);
    } else if let Some(p) = base.strip_prefix("type_hint_") {
        parts.type_hints.insert(p.to_string(), value);
    } else if let Some(p) = base.strip_prefix("uri_") {
        parts.uris.insert(p.to_string(), value);
    } else {
        parts.params.insert(base, Value::String(value));
    }
}

fn build_step(
    index: Option<u64>,
    parts: StepParts,
    all: &StepParts,
    common: &serde_json::Map<String, Value>,
    f: &mut Findings,
) -> Step {
    // How findings name the step (written only for a finding).
    let label = || index.map_or_else(|| "the step".to_string(), |n| format!("step {n}"));
    let mut step = Step::new(parts.tool_id.unwrap_or_default());
    step.index = index;
    step.comment = parts.comment;
    // common_*, then keys given to every step, then the step's own.
    step.params = common.clone();
    step.params.extend(all.params.clone());
    step.shared =
        common.keys().filter(|k| !all.params.contains_key(*k) && !parts.params.contains_key(*k)).cloned().collect();
    step.params.extend(parts.params);
    step.type_hints = all.type_hints.clone();
    step.type_hints.extend(parts.type_hints);
    step.uris = all.uris.clone();
    step.uris.extend(parts.uris);
    if let Some(v) = parts.on_error.or_else(|| all.on_error.clone()) {
        step.on_error = match v.trim().to_lowercase().as_str() {
            "stop" => OnError::Stop,
            "continue" => OnError::Continue,
            other => {
                f.warn(
                    DiagnosticCode::InvalidOnError,
                    format!("{}: on_error {other:?} is neither `stop` nor `continue`; `stop` is used", label()),
                );
                OnError::Stop
            }
        };
    }
    if let Some(v) = parts.retry.or_else(|| all.retry.clone()) {
        match v.trim().parse::<u32>() {
            Ok(n) => step.retry = n,
            Err(_) => f.warn(
                DiagnosticCode::InvalidRetry,
                format!("{}: retry {v:?} is not a whole number; 0 is used", label()),
            ),
        }
    }
    for (param, hint) in &step.type_hints {
        let Some(slot) = step.params.get_mut(param) else {
            continue;
        };
        let Value::String(text) = slot else { continue };
        if let Some(v) = apply_hint(hint, text, &label(), param, f) {
            *slot = v;
        }
    }
    step
}

/// Converts a value by its type hint; `None` keeps the text.
fn apply_hint(hint: &str, text: &str, label: &str, param: &str, f: &mut Findings) -> Option<Value> {
    match hint.trim().to_lowercase().as_str() {
        "text" | "string" | "str" | "" => None,
        "json" => match serde_json::from_str::<Value>(text) {
            Ok(v) => Some(v),
            Err(e) => {
                f.warn(
                    DiagnosticCode::TypeHintFailed,
                    format!("{label}: {param} is hinted json but does not parse ({e}); kept as text"),
                );
                None
            }
        },
        "base64" => {
            let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            let bytes = base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT
                .decode(&compact)
                .or_else(|_| base64::engine::general_purpose::URL_SAFE_PAD_INDIFFERENT.decode(&compact));
            match bytes.map(String::from_utf8) {
                Ok(Ok(s)) => Some(Value::String(s)),
                Ok(Err(_)) => {
                    f.warn(
                        DiagnosticCode::TypeHintFailed,
                        format!(
                            "{label}: {param} decodes from base64 to bytes that are not UTF-8 text; kept as base64"
                        ),
                    );
                    None
                }
                Err(e) => {
                    f.warn(
                        DiagnosticCode::TypeHintFailed,
                        format!("{label}: {param} is hinted base64 but does not decode ({e}); kept as text"),
                    );
                    None
                }
            }
        }
        "number" | "float" | "int" | "integer" => match serde_json::from_str::<Value>(text.trim()) {
            Ok(v @ Value::Number(_)) => Some(v),
            _ => {
                f.warn(
                    DiagnosticCode::TypeHintFailed,
                    format!("{label}: {param} is hinted {hint} but is not a number; kept as text"),
                );
                None
            }
        },
        "bool" | "boolean" => match text.trim().to_lowercase().as_str() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => {
                f.warn(
                    DiagnosticCode::TypeHintFailed,
                    format!("{label}: {param} is hinted boolean but is not true/false; kept as text"),
                );
                None
            }
        },
        other => {
            f.warn(
                DiagnosticCode::UnknownTypeHint,
                format!("{label}: type hint {other:?} for {param} is not known (json, base64, text); kept as text"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    /// The first reading of spec 000 §2.3, character by character over a
    /// collected `Vec<char>` and a second pass for the separators: the
    /// reference the one-pass [`normalize_key`] must agree with.
    fn normalize_key_reference(raw: &str) -> NormalKey {
        let chars: Vec<char> = raw.trim().chars().collect();
        let mut out = String::new();
        for (i, &c) in chars.iter().enumerate() {
            if !c.is_alphanumeric() {
                out.push('_');
                continue;
            }
            if c.is_uppercase() && i > 0 {
                let prev = chars[i - 1];
                let next_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
                if prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower) {
                    out.push('_');
                }
            }
            out.extend(c.to_lowercase());
        }
        let mut name = String::new();
        for c in out.chars() {
            if c == '_' && (name.is_empty() || name.ends_with('_')) {
                continue;
            }
            name.push(c);
        }
        while name.ends_with('_') {
            name.pop();
        }
        let digits = name.chars().rev().take_while(char::is_ascii_digit).count();
        let pre_len = name.len() - digits;
        let pre = &name[..pre_len];
        let number = name[pre_len..].parse::<u64>().ok();
        match (number, pre.chars().last()) {
            (Some(n), Some('_')) => {
                let base = pre.trim_end_matches('_').to_string();
                NormalKey { name, base, step: Some(n), implicit: false }
            }
            (Some(n), Some(c)) if c.is_alphabetic() => {
                let base = pre.to_string();
                NormalKey { name: format!("{base}_{n}"), base, step: Some(n), implicit: true }
            }
            _ => NormalKey { base: name.clone(), name, step: None, implicit: false },
        }
    }

    proptest::proptest! {
        #[test]
        fn keys_normalise_as_the_reference_does(raw in "[a-zA-Z0-9 _\\-.:İıßǅΣσς Ⅻ٣é日\u{3000}\t]{0,24}") {
            proptest::prop_assert_eq!(normalize_key(&raw), normalize_key_reference(&raw));
        }
    }

    #[test]
    fn keys_of_every_shape_normalise_as_the_reference_does() {
        for raw in [
            "",
            " ",
            "_",
            "__a__",
            "a__b",
            "HTTPRequest",
            "v2Name",
            "fooBar",
            "File-Path 1",
            "CONTENT1",
            "content_1_",
            "sha256",
            "x99999999999999999999999",
            "İstanbul",
            "ǅemal",
            "ΣΑΣ",
            "A1B2",
            "a_1_2",
            "1",
            "_1",
            "Ⅻ1",
            "日本1",
            "a-",
            "-a",
            "aB",
            "ABc",
            "a٣",
            "a ٣",
        ] {
            assert_eq!(normalize_key(raw), normalize_key_reference(raw), "{raw:?}");
        }
    }

    use super::*;

    #[test]
    fn dedent_keeps_relative_indentation() {
        assert_eq!(dedent("\n  a\n    b\n  c"), "\na\n  b\nc");
        assert_eq!(dedent("\n\ta\n\n\tb"), "\na\n\nb");
        assert_eq!(dedent("x\n  a\n  b"), "x\na\nb");
    }

    #[test]
    fn trailing_comments_leave_an_open_value() {
        let (v, c) = trim_open_value("A\nB\n\n# step 2\n");
        assert_eq!((v, c), ("A\nB", vec!["step 2".to_string()]));
        let (v, c) = trim_open_value("A\n# not a comment\n");
        assert_eq!((v, c.len()), ("A\n# not a comment", 0));
        let (v, _) = trim_open_value("A\n```\n");
        assert_eq!(v, "A");
    }
}
