//! Code fences around tool-call blocks (```` ``` ```` before a TAM or
//! ACTION block, ```` ``` ```` after it).
//!
//! Models often wrap a call block in a Markdown fence. The call readers
//! already ignore fence lines inside a block; this module decides, byte
//! pattern only, whether text *around* a block is such a fence, so that the
//! machine can take it out of the surrounding content instead of leaving an
//! unpaired ```` ``` ```` in what a UI renders. It owns only the shape of a
//! fence line and the watch state; it must not touch elements or events
//! (the machine decides what dropping a fence means).
//!
//! Hand-written: a fence is a few bytes at a line start, and the question is
//! asked of the suffix of each text run (never of accumulated text), which no
//! Markdown crate answers incrementally.

use crate::registry::TagId;

/// Most bytes held while deciding whether text is a fence (the fence line
/// plus the whitespace after it). Past it the bytes are ordinary text.
pub(super) const FENCE_HOLD_LIMIT: usize = 64;

/// What the machine is watching for, around call blocks.
#[derive(Debug)]
pub(super) enum FenceWatch {
    /// The registry has no call blocks: text passes untouched.
    Off,
    /// Nothing held. `line_start`: the next text byte begins a line.
    Idle { line_start: bool },
    /// Text at input offset `start` that may be the opening fence of a call
    /// block (and the whitespace after it), held until the next token.
    Opening { start: usize, held: Vec<u8> },
    /// An opening fence was dropped and its call block (`tag`) is open.
    InBlock { tag: TagId },
    /// That call block ended at `start`; `held` may be its closing fence.
    Closing { start: usize, held: Vec<u8>, tag: TagId },
}

impl FenceWatch {
    /// Bytes held, for memory accounting.
    pub(super) fn held_len(&self) -> usize {
        match self {
            FenceWatch::Opening { held, .. } | FenceWatch::Closing { held, .. } => held.capacity(),
            _ => 0,
        }
    }
}

/// Whether a byte may appear in a fence's info string (```` ```xml ````).
fn is_info(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'+' | b'.' | b'#')
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

/// Where the suffix of `text` that may be an opening fence starts: a line
/// holding (the beginning of) ```` ```info ````, then only whitespace. The
/// suffix is the fence only if a call block follows, which the caller
/// learns from the next token. `starts_line`: `text[0]` begins a line.
pub(super) fn opening_suffix(text: &[u8], starts_line: bool) -> Option<usize> {
    fence_suffix(text, starts_line).or_else(|| indentation_suffix(text, starts_line))
}

/// Where trailing indentation at a line start begins: a fence may follow.
/// For text without a backtick, the whole of [`opening_suffix`].
pub(super) fn indentation_suffix(text: &[u8], starts_line: bool) -> Option<usize> {
    let mut start = text.len();
    while start > 0 && matches!(text[start - 1], b' ' | b'\t') {
        start -= 1;
    }
    let at_line_start = if start == 0 { starts_line } else { text[start - 1] == b'\n' };
    (start < text.len() && at_line_start).then_some(start)
}

/// Where a trailing (beginning of a) fence line and the whitespace after it
/// begin.
fn fence_suffix(text: &[u8], starts_line: bool) -> Option<usize> {
    // Without a backtick there is no fence (most text: the scan back over
    // its last word is not needed).
    crate::scan::find_byte(b'`', text)?;
    let mut end = text.len();
    while end > 0 && is_space(text[end - 1]) {
        end -= 1;
    }
    let spaced = end < text.len();
    let mut info = end;
    while info > 0 && is_info(text[info - 1]) {
        info -= 1;
    }
    let has_info = info < end;
    let mut ticks = info;
    while ticks > 0 && text[ticks - 1] == b'`' {
        ticks -= 1;
    }
    let count = info - ticks;
    // One or two backticks at the very end may still grow into a fence.
    let could_be_fence = count >= 3 || (count >= 1 && !has_info && !spaced);
    if !could_be_fence {
        return None;
    }
    let mut start = ticks;
    while start > 0 && matches!(text[start - 1], b' ' | b'\t') {
        start -= 1;
    }
    let at_line_start = if start == 0 { starts_line } else { text[start - 1] == b'\n' };
    at_line_start.then_some(start)
}

/// How text after a call block reads as its closing fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// The first `n` bytes are whitespace, a bare fence, and its line end.
    Fence(usize),
    /// All of the text is a beginning of that; more may decide.
    Partial,
    /// Not a closing fence.
    No,
}

/// Reads `text` (right after a call block) as whitespace, ```` ``` ````
/// and the end of that line. `at_end`: nothing more text follows (a marker
/// or the end of input comes next), so a fence without its line end counts.
pub(super) fn closing_fence(text: &[u8], at_end: bool) -> Closing {
    let mut i = 0;
    while i < text.len() && is_space(text[i]) {
        i += 1;
    }
    let ticks_start = i;
    while i < text.len() && text[i] == b'`' {
        i += 1;
    }
    let ticks = i - ticks_start;
    if i < text.len() && ticks < 3 {
        return Closing::No;
    }
    while i < text.len() && matches!(text[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    match text.get(i) {
        Some(b'\n') => Closing::Fence(i + 1),
        Some(_) => Closing::No,
        None if at_end && ticks >= 3 => Closing::Fence(i),
        None if at_end => Closing::No,
        None => Closing::Partial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_suffixes() {
        let cases: &[(&str, bool, Option<usize>)] = &[
            ("Here:\n```\n", true, Some(6)),
            ("Here:\n```xml\n  \n", true, Some(6)),
            ("Here:\n  ```json", true, Some(6)),
            ("Here:\n``", true, Some(6)),
            ("Here:\n`", true, Some(6)),
            ("Here:\n  ", true, Some(6)),
            ("  ", true, Some(0)),
            ("  ", false, None),
            ("Here: ", true, None),
            ("```\n", true, Some(0)),
            ("```\n", false, None),
            ("Here: ```\n", true, None),
            ("Here:\n`` \n", true, None),
            ("Here:\n```py\nprint(1)", true, None),
            ("Here:\n`code` x", true, None),
            ("plain text\n", true, None),
            ("", true, None),
        ];
        for &(text, starts, want) in cases {
            assert_eq!(opening_suffix(text.as_bytes(), starts), want, "{text:?}");
        }
    }

    #[test]
    fn closing_fences() {
        assert_eq!(closing_fence(b"\n```\nDone", false), Closing::Fence(5));
        assert_eq!(closing_fence(b"```  \r\nDone", false), Closing::Fence(7));
        assert_eq!(closing_fence(b"\n``", false), Closing::Partial);
        assert_eq!(closing_fence(b"\n```", false), Closing::Partial);
        assert_eq!(closing_fence(b"\n```", true), Closing::Fence(4));
        assert_eq!(closing_fence(b"\n``", true), Closing::No);
        assert_eq!(closing_fence(b"\n\n", true), Closing::No);
        assert_eq!(closing_fence(b"```py\n", false), Closing::No);
        assert_eq!(closing_fence(b"Done", false), Closing::No);
        assert_eq!(closing_fence(b"`x", false), Closing::No);
    }
}
