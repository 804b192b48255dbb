//! Where Markdown text is in code, followed byte by byte: the fences of
//! fenced code blocks ([`Fences`]), and, for the state machine, code spans
//! as well ([`MarkdownCode`]). Both the machine (a registry tag inside
//! code is text, not structure) and the payload's code stage (markup inside
//! code is shown, not filtered) ask it, and must read a block the same way.
//!
//! This module owns the reading of fence lines and backtick runs and
//! nothing else: what code means for tags, marks or escapes belongs to its
//! users. Hand-written: Markdown crates parse whole documents, and the
//! question here is asked of a stream, one piece at a time, with no text
//! kept.
//!
//! Fences are read as CommonMark writes them: a line of at least three
//! backticks or tildes after spaces (any number: fences in list items are
//! indented), with an info string that holds no backtick after backticks;
//! the block ends at a line of at least as many of the same character and
//! nothing but white space after them. Code spans are read on one line: a
//! run of backticks opens one, the next run as long closes it.

use super::find_byte2;

/// A code fence: its character and the length of its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fence {
    /// `` ` `` or `~`.
    pub(crate) ch: u8,
    /// How many of them (counted up to `u32::MAX`, which keeps the state
    /// small).
    pub(crate) len: u32,
}

/// Where the current line is, as far as fences go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line {
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

/// The fenced code block the text is in, and where its current line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fences {
    /// The open block's fence, if any (set and cleared when the fence's
    /// line ends).
    pub(crate) open: Option<Fence>,
    pub(crate) line: Line,
}

impl Default for Fences {
    fn default() -> Self {
        Fences { open: None, line: Line::Start }
    }
}

impl Fences {
    /// Follows the line through byte `b` (not a line break).
    #[inline]
    pub(crate) fn line_byte(&mut self, b: u8) {
        self.line = match self.line {
            Line::Start if b == b' ' || b == b'\t' => Line::Start,
            Line::Start if b == b'`' || b == b'~' => Line::Run(Fence { ch: b, len: 1 }),
            Line::Run(f) if b == f.ch => Line::Run(Fence { len: f.len.saturating_add(1), ..f }),
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
    pub(crate) fn after_run(&self, f: Fence) -> Line {
        match self.open {
            _ if f.len < 3 => Line::Rest,
            None => Line::Info(f),
            Some(open) if f.ch == open.ch && f.len >= open.len => Line::Closing,
            Some(_) => Line::Rest,
        }
    }

    /// A line ended: a fence it opened or closed takes effect.
    pub(crate) fn end_line(&mut self) {
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

    /// Whether a run of backticks that ends here may open or close a code
    /// span: not inside a fenced block, nor a fence's own run or a
    /// backtick in its info string.
    pub(crate) fn reads_spans(&self) -> bool {
        let fence_line = match self.line {
            Line::Info(_) => true,
            Line::Run(f) => self.after_run(f) != Line::Rest,
            _ => false,
        };
        self.open.is_none() && !fence_line
    }
}

/// Whether the text read so far leaves a fenced code block or a code span
/// open, followed over any pieces of the text: the state after them is the
/// same however the text was split. A span is taken as code from its
/// opening run on (the closing run may not have come yet; the end of the
/// line ends it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct MarkdownCode {
    fences: Fences,
    /// Backticks in the run being read (outside fenced blocks), up to
    /// `u32::MAX`.
    ticks: u32,
    /// The length of the run that opened the span on this line, if one is
    /// open.
    span: Option<u32>,
}

impl MarkdownCode {
    /// Follows `bytes`, skipping with `memchr` to the line breaks and
    /// backticks inside ordinary lines.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            if self.fences.line == Line::Rest && self.ticks == 0 {
                match find_byte2(b'\n', b'`', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return,
                }
            }
            let b = bytes[i];
            if b != b'`' {
                self.end_ticks();
            } else if self.fences.open.is_none() {
                self.ticks = self.ticks.saturating_add(1);
            }
            if b == b'\n' {
                self.span = None;
                self.fences.end_line();
            } else {
                self.fences.line_byte(b);
            }
            i += 1;
        }
    }

    /// A run of backticks ended (the byte after it is not one): it opens a
    /// span when none is open, closes the open one when as long.
    fn end_ticks(&mut self) {
        let ticks = std::mem::take(&mut self.ticks);
        if ticks == 0 || !self.fences.reads_spans() {
            return;
        }
        self.span = match self.span {
            None => Some(ticks),
            Some(n) if n == ticks => None,
            open => open,
        };
    }

    /// Whether what comes next (a tag) is inside code: inside a fenced
    /// block, or inside a code span (a run of backticks being read ends
    /// before it).
    pub(crate) fn in_code(&self) -> bool {
        let mut next = *self;
        next.end_ticks();
        next.fences.open.is_some() || next.span.is_some()
    }

    /// Whether what comes next is inside a fenced code block.
    pub(crate) fn in_block(&self) -> bool {
        self.fences.open.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn after(text: &str) -> MarkdownCode {
        let mut code = MarkdownCode::default();
        code.push(text.as_bytes());
        code
    }

    #[test]
    fn blocks_and_spans() {
        let cases: &[(&str, bool, bool)] = &[
            ("plain", false, false),
            ("see:\n```rust\nfn main() {}\n", true, true),
            ("see:\n```rust\nfn main() {}\n```\n", false, false),
            ("see:\n```rust\nfn main() {}\n```", true, true),
            ("see:\n  ~~~\nx\n", true, true),
            ("see:\n~~~\nx\n```\n", true, true),
            ("see:\n````\nx\n```\n", true, true),
            ("see:\n```\nx\n``` not a close\n", true, true),
            ("see:\n```\nx\n```  \r\n", false, false),
            ("inline ``` not at a line start\n", false, false),
            ("```a`b\n", false, false),
            ("a `", false, true),
            ("a `x", false, true),
            ("a `x`", false, false),
            ("a ``x`", false, true),
            ("a ``x``", false, false),
            ("a ``x`` ", false, false),
            ("a `x\nb", false, false),
            ("```\n`x`\n", true, true),
        ];
        for &(text, block, code) in cases {
            let state = after(text);
            assert_eq!((state.in_block(), state.in_code()), (block, code), "{text:?}");
        }
    }

    proptest! {
        #[test]
        fn any_split_reads_the_same(text in "[`~ \\na<x\r]{0,40}", cut in 0usize..41) {
            let cut = cut.min(text.len());
            let mut split = MarkdownCode::default();
            split.push(&text.as_bytes()[..cut]);
            split.push(&text.as_bytes()[cut..]);
            prop_assert_eq!(split, after(&text));
        }
    }
}
