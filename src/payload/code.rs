//! Markdown code blocks in filtered content HTML (private): the last
//! stage of [`super::html::HtmlFilter`], over its output.
//!
//! Content is Markdown with inline HTML (spec 003 §3.1.2), and Markdown
//! shows the text of a fenced code block or a code span as written: there
//! `&lt;` is seen as the four characters `&lt;`, so `Vec<u8>` or
//! `while lo < hi`, escaped by the filter, would read `Vec&lt;u8>` and
//! `lo &lt; hi`. This stage writes such a `<` back as it was, inside code
//! only, and only where it is inert as HTML too: a `<` that starts no tag
//! (`a < b`, `<=`, `<3`), or the attribute-free tag of a name that is no
//! HTML element and no custom element (`<u8>`, `</T>`, `<user_name/>`;
//! not a name that begins like `script` or `iframe`). Should a renderer
//! read the block's
//! structure otherwise than this stage (an HTML block around it, a list's
//! indentation), such a `<` still runs nothing and hides at most the tag
//! itself; every other `<` stays escaped.
//!
//! The filter's own escapes reach this stage as `&#60;` (the same
//! character as `&lt;`); this stage writes each `&#60;` as `<` where the
//! rules above allow, and as `&lt;` everywhere else, so that output
//! outside code blocks is what it was. (A `&#60;` the model wrote itself
//! is read the same way.) It owns nothing else: it never looks at tags.
//!
//! Fences are read as CommonMark writes them: a line of at least three
//! backticks or tildes, after spaces (any number: fences in list items are
//! indented), with an info string that holds no backtick after backticks;
//! the block ends at a line of at least as many of the same character and
//! nothing but white space after them, or at the end of the content.
//!
//! Code spans are read on one line: a run of backticks opens one, the
//! next run as long closes it. (CommonMark also lets a span cross a line
//! break inside a paragraph, and reads a run that finds no closer as text
//! and looks again after it; here such escapes stay escaped, as outside
//! code.)
//!
//! The stage is incremental and split-invariant: it holds back only an
//! escape whose next bytes are not all there yet (a few bytes).

use super::net::is_html_element;
use crate::scan::{find_byte, find_byte3};

/// The filter's escape of `<`, read here.
pub(crate) const ESCAPE: &str = "&#60;";

/// Longest tag name an inert tag may have.
const MAX_NAME: usize = 32;

/// A code fence: its character and the length of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fence {
    ch: u8,
    len: usize,
}

/// Where the current line is, as far as fences go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At its start, after spaces only.
    Start,
    /// In a run of fence characters right after the spaces.
    Run(Fence),
    /// After a run that opens a fence (outside one): the info string.
    Info(Fence),
    /// After a run that closes the open fence: white space may follow.
    Closing,
    /// The rest of the line is ordinary.
    Rest,
}

/// A code span on the current line (outside fenced blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Span {
    /// None is open.
    Closed,
    /// A run of this many backticks opened one; nothing is held.
    Open(usize),
    /// One is open and holds an escape: the output from the first escape
    /// on is held, with where each escape is in it and whether it is
    /// inert, until the span closes (or the line ends, and it was none).
    Holding { ticks: usize, held: String, escapes: Vec<(usize, bool)> },
}

/// The code-block stage (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CodeBlocks {
    /// The fenced block the output is in, if any.
    open: Option<Fence>,
    line: Line,
    /// Backticks in the run being read (outside fenced blocks).
    ticks: usize,
    span: Span,
    /// Output held back: an escape and the bytes after it, while they do
    /// not yet show whether it is inert.
    lookahead: String,
    /// Most output held for one code span, waiting for its closing
    /// backticks ([`super::html::FilterLimits::max_code_span`]); past it
    /// the span is taken for text.
    max_span: usize,
    /// Spans taken for text at that limit.
    long_spans: usize,
}

/// Whether a `<` followed by `after` is inert as HTML: `Some(true)` when
/// it starts no tag or the attribute-free tag of a name that is no HTML
/// element (nor one that begins like `script` or `iframe`, which a check
/// by substring would take for them), `Some(false)` when it may start
/// markup, `None` when `after` is too short to tell (at the `end` of the
/// content it always tells). A `<` that ends the content is not written
/// back: the filter gives one there as `&lt;` (its last pass escapes it),
/// and the output must read the same when filtered again.
fn inert(after: &[u8], end: bool) -> Option<bool> {
    let Some(&first) = after.first() else { return end.then_some(false) };
    if first == b'!' || first == b'?' {
        return Some(false);
    }
    if !first.is_ascii_alphabetic() && first != b'/' {
        return Some(true);
    }
    let name = &after[usize::from(first == b'/')..];
    let len = name.iter().take(MAX_NAME + 1).take_while(|&&b| b.is_ascii_alphanumeric() || b == b'_').count();
    if len > MAX_NAME {
        return Some(false);
    }
    // The name, then `>` or `/>` (a self-closing tag of an unknown
    // element is as inert).
    let close = match name.get(len..) {
        Some([b'>', ..] | [b'/', b'>', ..]) => true,
        Some([] | [b'/']) if !end => return None,
        _ => false,
    };
    if len == 0 || !name[0].is_ascii_alphabetic() || !close {
        return Some(false);
    }
    let mut lower = [0u8; MAX_NAME];
    let lower = &mut lower[..len];
    lower.copy_from_slice(&name[..len]);
    lower.make_ascii_lowercase();
    Some(!is_html_element(lower) && !lower.starts_with(b"script") && !lower.starts_with(b"iframe"))
}

/// Writes an escape: as `<` in code where it is inert, else as `&lt;`.
fn write_escape(out: &mut String, in_code: bool, inert: bool) {
    out.push_str(if in_code && inert { "<" } else { "&lt;" });
}

impl CodeBlocks {
    /// A stage at the start of the content, holding at most `max_span`
    /// bytes of one code span.
    pub(crate) fn new(max_span: usize) -> CodeBlocks {
        CodeBlocks {
            open: None,
            line: Line::Start,
            ticks: 0,
            span: Span::Closed,
            lookahead: String::new(),
            max_span,
            long_spans: 0,
        }
    }

    /// Code spans taken for text because they held more than the limit.
    pub(crate) fn long_spans(&self) -> usize {
        self.long_spans
    }

    /// Passes the next piece of filtered output through the stage: `text`
    /// becomes what is certain so far. At the `end` of the content nothing
    /// stays held.
    #[inline]
    pub(crate) fn push(&mut self, text: &mut String, end: bool) {
        // The common delta, inside an ordinary line with nothing this
        // stage reads: decided here, without a call.
        let quiet = self.line == Line::Rest
            && self.ticks == 0
            && self.lookahead.is_empty()
            && !matches!(self.span, Span::Holding { .. });
        if quiet && find_byte3(b'\n', b'`', b'&', text.as_bytes()).is_none() {
            return;
        }
        self.push_any(text, end);
    }

    /// [`CodeBlocks::push`] past its common case.
    fn push_any(&mut self, text: &mut String, end: bool) {
        let holds = !self.lookahead.is_empty() || matches!(self.span, Span::Holding { .. });
        let bytes = text.as_bytes();
        if !holds && self.ticks == 0 && find_byte3(b'\n', b'`', b'&', bytes).is_none() {
            // The common delta, within a line: nothing this stage reads,
            // but a line's first bytes.
            match self.line {
                Line::Rest => return,
                Line::Start => match bytes.iter().position(|&b| b != b' ' && b != b'\t') {
                    None => return,
                    Some(at) if bytes[at] != b'~' => {
                        self.line = Line::Rest;
                        return;
                    }
                    Some(_) => {}
                },
                _ => {}
            }
        }
        if !holds {
            // Nothing written differently, nothing held: only the lines
            // and spans are followed (a span open at the end holds
            // nothing to write).
            let plain_line = self.ticks == 0 && matches!(self.line, Line::Start | Line::Rest);
            if plain_line && find_byte3(b'&', b'`', b'~', bytes).is_none() {
                self.follow_plain(bytes);
                return;
            }
            if find_byte(b'&', bytes).is_none() {
                self.run(text, None, false);
                return;
            }
        }
        let mut input = std::mem::take(&mut self.lookahead);
        input.push_str(text);
        let mut out = String::with_capacity(input.len());
        self.run(&input, Some(&mut out), end);
        if end {
            self.end_ticks(&mut out);
            self.end_span(&mut out, false);
        }
        *text = out;
    }

    /// Reads `input`, writing to `out` (`None`: it holds no escape and
    /// nothing is held, so the output is the input and only the states
    /// move). Input is written a stretch at a time: up to where the
    /// target (the output, or a span's hold) may change. Every place it
    /// cuts `input` at is an ASCII byte's, or a whole character's end.
    fn run(&mut self, input: &str, mut out: Option<&mut String>, end: bool) {
        let bytes = input.as_bytes();
        // `input[from..i]` is read but not written yet.
        let mut from = 0;
        let mut i = 0;
        while i < bytes.len() {
            if self.line == Line::Rest && self.ticks == 0 {
                // Ordinary text up to the next byte that matters.
                i = find_byte3(b'\n', b'`', b'&', &bytes[i..]).map_or(bytes.len(), |at| i + at);
                if i == bytes.len() {
                    break;
                }
            }
            let b = bytes[i];
            if b == b'&'
                && let Some(out) = out.as_deref_mut()
            {
                let rest = &input[i..];
                if rest.len() < ESCAPE.len() && ESCAPE.starts_with(rest) && !end {
                    self.emit(&input[from..i], out);
                    self.lookahead.push_str(rest);
                    return;
                }
                if let Some(after) = rest.strip_prefix(ESCAPE) {
                    self.emit(&input[from..i], out);
                    let Some(inert) = inert(after.as_bytes(), end) else {
                        // What follows is ASCII so far (a name's start).
                        self.lookahead.push_str(rest);
                        return;
                    };
                    self.end_ticks(out);
                    // Not a fence's byte: the line is ordinary from here.
                    self.line_byte(b'<');
                    self.escape(inert, out);
                    i += ESCAPE.len();
                    from = i;
                    continue;
                }
            }
            if b != b'`' {
                if self.ticks > 0 {
                    match out.as_deref_mut() {
                        Some(out) => {
                            self.emit(&input[from..i], out);
                            from = i;
                            self.end_ticks(out);
                        }
                        None => self.end_ticks(&mut String::new()),
                    }
                }
            } else if self.open.is_none() {
                self.ticks += 1;
            }
            if b == b'\n' {
                match out.as_deref_mut() {
                    Some(out) if matches!(self.span, Span::Holding { .. }) => {
                        self.emit(&input[from..i], out);
                        from = i;
                        self.end_span(out, false);
                    }
                    _ => self.span = Span::Closed,
                }
                self.end_line();
            } else {
                self.line_byte(b);
            }
            // The whole character that `b` starts.
            i += input[i..].chars().next().map_or(1, char::len_utf8);
        }
        if let Some(out) = out {
            self.emit(&input[from..], out);
        }
    }

    /// Follows text with no backtick, tilde or `&`, from a line that is
    /// no fence's and with no run of backticks being read: it can open or
    /// close no fence and no span, only end lines (and with them an open
    /// span) and begin the last one. Two searches where [`CodeBlocks::run`]
    /// would stop at each line.
    fn follow_plain(&mut self, bytes: &[u8]) {
        let last =
            if bytes.len() < 16 { bytes.iter().rposition(|&b| b == b'\n') } else { memchr::memrchr(b'\n', bytes) };
        let tail = match last {
            Some(at) => {
                self.span = Span::Closed;
                self.line = Line::Start;
                &bytes[at + 1..]
            }
            None => bytes,
        };
        if self.line == Line::Start && !tail.iter().all(|&b| b == b' ' || b == b'\t') {
            self.line = Line::Rest;
        }
    }

    /// Writes output: into a code span's hold while one holds.
    fn emit(&mut self, text: &str, out: &mut String) {
        match &mut self.span {
            Span::Holding { held, .. } => {
                held.push_str(text);
                if held.len() > self.max_span {
                    // Too long to wait for: taken for text.
                    self.long_spans += 1;
                    self.end_span(out, false);
                }
            }
            _ => out.push_str(text),
        }
    }

    /// An escape whose `<` is `inert` or not.
    fn escape(&mut self, inert: bool, out: &mut String) {
        match &mut self.span {
            _ if self.open.is_some() => write_escape(out, true, inert),
            Span::Closed => write_escape(out, false, inert),
            Span::Open(ticks) => {
                let ticks = *ticks;
                self.span = Span::Holding { ticks, held: ESCAPE.to_string(), escapes: vec![(0, inert)] };
            }
            Span::Holding { held, escapes, .. } => {
                escapes.push((held.len(), inert));
                held.push_str(ESCAPE);
            }
        }
    }

    /// A run of backticks ended (the byte after it is not one): it opens a
    /// span when none is open, closes the open one when as long.
    fn end_ticks(&mut self, out: &mut String) {
        let ticks = std::mem::take(&mut self.ticks);
        // A fence's own run, or backticks in its info string, open no
        // span.
        let fence_line = match self.line {
            Line::Info(_) => true,
            Line::Run(f) => self.after_run(f) != Line::Rest,
            _ => false,
        };
        if ticks == 0 || self.open.is_some() || fence_line {
            return;
        }
        match &self.span {
            Span::Closed => self.span = Span::Open(ticks),
            Span::Open(n) | Span::Holding { ticks: n, .. } if *n == ticks => self.end_span(out, true),
            _ => {}
        }
    }

    /// Ends the open span, if any: its held output is written, its escapes
    /// as `<` where inert if it was `closed` (a span), as `&lt;` if not.
    fn end_span(&mut self, out: &mut String, closed: bool) {
        if let Span::Holding { held, escapes, .. } = std::mem::replace(&mut self.span, Span::Closed) {
            let mut from = 0;
            for (at, inert) in escapes {
                out.push_str(&held[from..at]);
                write_escape(out, closed, inert);
                from = at + ESCAPE.len();
            }
            out.push_str(&held[from..]);
        }
    }

    /// Follows the fence state of the line through byte `b` (not a line
    /// break).
    fn line_byte(&mut self, b: u8) {
        self.line = match self.line {
            Line::Start if b == b' ' || b == b'\t' => Line::Start,
            Line::Start if b == b'`' || b == b'~' => Line::Run(Fence { ch: b, len: 1 }),
            Line::Run(f) if b == f.ch => Line::Run(Fence { len: f.len + 1, ..f }),
            Line::Run(f) => match self.after_run(f) {
                Line::Info(f) if b == b'`' && f.ch == b'`' => Line::Rest,
                Line::Closing if !b.is_ascii_whitespace() => Line::Rest,
                line => line,
            },
            Line::Info(f) if b == b'`' && f.ch == b'`' => Line::Rest,
            Line::Info(f) => Line::Info(f),
            Line::Closing if b.is_ascii_whitespace() => Line::Closing,
            _ => Line::Rest,
        };
    }

    /// What a line is after the run of fence characters `f` at its start.
    fn after_run(&self, f: Fence) -> Line {
        match self.open {
            _ if f.len < 3 => Line::Rest,
            None => Line::Info(f),
            Some(open) if f.ch == open.ch && f.len >= open.len => Line::Closing,
            Some(_) => Line::Rest,
        }
    }

    /// A line ended: a fence it opened or closed takes effect.
    fn end_line(&mut self) {
        let line = match self.line {
            Line::Run(f) => self.after_run(f),
            line => line,
        };
        match line {
            Line::Info(f) => self.open = Some(f),
            Line::Closing => self.open = None,
            _ => {}
        }
        self.line = Line::Start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn through(pieces: &[&str]) -> String {
        let mut stage = CodeBlocks::new(4096);
        let mut out = String::new();
        for (n, piece) in pieces.iter().enumerate() {
            let mut text = piece.to_string();
            stage.push(&mut text, n + 1 == pieces.len());
            out.push_str(&text);
        }
        out
    }

    #[test]
    fn escapes_in_fenced_code_are_written_back_where_inert() {
        let cases: &[(&str, &str)] = &[
            ("a &#60; b", "a &lt; b"),
            ("```\na &#60; b\n```\na &#60; b", "```\na < b\n```\na &lt; b"),
            (
                "```rust\nVec&#60;u8> x; &#60;/T> &#60;b> &#60;div> &#60;!-- &#60;x y>\n```",
                "```rust\nVec<u8> x; </T> &lt;b> &lt;div> &lt;!-- &lt;x y>\n```",
            ),
            ("~~~~\n```\n&#60;3\n~~~\n&#60;3\n~~~~~\n&#60;3", "~~~~\n```\n<3\n~~~\n<3\n~~~~~\n&lt;3"),
            ("``` `x`\n&#60;3", "``` `x`\n&lt;3"),
            ("~~~ `x`\n&#60;3", "~~~ `x`\n<3"),
            ("   - item\n     ```\n     x &#60;= y\n     ```", "   - item\n     ```\n     x <= y\n     ```"),
            ("```\nend &#60;", "```\nend &lt;"),
            ("```\n&#60;scriptx> &#60;IFRAMEs> &#60;Script2>", "```\n&lt;scriptx> &lt;IFRAMEs> &lt;Script2>"),
            ("```\nend &#60;u8", "```\nend &lt;u8"),
            ("``\n&#60;3", "``\n&lt;3"),
            ("```\n``` x\n&#60;3", "```\n``` x\n<3"),
            ("x &amp; y &#61; &#6", "x &amp; y &#61; &#6"),
            // Code spans, on one line.
            ("`Vec&#60;u8>` and `a &#60; b` but a &#60; b", "`Vec<u8>` and `a < b` but a &lt; b"),
            ("``a ` &#60;3`` x", "``a ` <3`` x"),
            ("``a &#60;3` x", "``a &lt;3` x"),
            ("`a &#60;3\nb` &#60;3", "`a &lt;3\nb` &lt;3"),
            (
                "`&#60;b>` `&#60;!--` `&#60;x>` `&#60;a_b/>` `&#60;x-y>` `&#60;x/ >`",
                "`&lt;b>` `&lt;!--` `<x>` `<a_b/>` `&lt;x-y>` `&lt;x/ >`",
            ),
            ("`unclosed &#60;3", "`unclosed &lt;3"),
        ];
        for (input, want) in cases {
            assert_eq!(&through(&[input]), want, "{input}");
        }
    }

    proptest! {
        /// Any split gives the same output.
        #[test]
        fn any_split_gives_the_same_output(
            parts in proptest::collection::vec(prop_oneof![
                Just("```"), Just("~~~"), Just("`"), Just("\n"), Just(" "), Just("&#60;"), Just("&"), Just("#60;"),
                Just("u8>"), Just("b>"), Just("/"), Just("x"), Just("é"), Just("<"), Just("&lt;"), Just("``"),
            ], 0..24),
            cuts in proptest::collection::vec(0usize..64, 0..6),
        ) {
            let text = parts.concat();
            let whole = through(&[&text]);
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).filter(|&c| text.is_char_boundary(c)).collect();
            at.sort_unstable();
            at.dedup();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in at {
                pieces.push(&text[from..cut]);
                from = cut;
            }
            pieces.push(&text[from..]);
            prop_assert_eq!(through(&pieces), whole);
        }
    }
}
