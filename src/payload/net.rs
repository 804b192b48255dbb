//! The last line of defence over filtered content HTML: whatever the
//! allowlist pass let through, no markup but the whitelisted tags and no
//! script-capable text pattern leaves this filter.
//!
//! * A `<` that does not start a whitelisted tag exactly as the allowlist
//!   writes it (`<b>`, `</span>`, `<span style="safe">`, `<br/>`) is
//!   escaped as `&lt;`, so no other element can exist in the output. An
//!   end tag of another HTML element (`</div>`) closes nothing at this
//!   point (the allowlist pass removed the end tags of what it removed), so
//!   it is dropped, leaving a zero-width space when text touches it.
//! * `javascript:`, `vbscript:`, `livescript:`, `expression(`, `url(` and
//!   `on<word>=` are neutralised by a zero-width space (`&#8203;`) before
//!   their last character, so they neither run nor match, even after
//!   entity decoding. Matching decodes character references (`&#106;`,
//!   `&#x6A;`, `&colon;`) and skips the whitespace and control characters
//!   browsers ignore inside a scheme (`java\tscript:`).
//!
//! The net is incremental and split-invariant: it holds back only a
//! possible tag (up to [`MAX_TAG`] bytes) or pattern start, and decides each
//! position from the bytes after it alone, so any chunking of its input
//! gives the same output.

use super::style::style_is_safe;
use crate::scan::repeats;

/// Longest tag the net waits for; a longer `<...` is escaped.
pub(crate) const MAX_TAG: usize = 512;

/// What the net inserts before the last character of a dangerous pattern
/// (a zero-width space; the code stage reads it back out of code).
pub(crate) const BREAK: &str = "&#8203;";

/// Tags that pass (the spec 003 §3.1.3 allowlist; `rt`/`rp` for `ruby`).
const ALLOWED: &[&str] = &["b", "strong", "i", "em", "u", "s", "br", "span", "ruby", "rt", "rp"];

/// The HTML elements content really uses (the allowlist, `p`, `div`),
/// checked before the binary search of [`HTML_ELEMENTS`].
pub(crate) const COMMON_ELEMENTS: [&[u8]; 13] =
    [b"b", b"i", b"u", b"s", b"em", b"strong", b"span", b"br", b"p", b"div", b"ruby", b"rt", b"rp"];

/// Whether `name` (lower case) is an HTML element.
pub(crate) fn is_html_element(name: &[u8]) -> bool {
    COMMON_ELEMENTS.contains(&name) || std::str::from_utf8(name).is_ok_and(|n| HTML_ELEMENTS.binary_search(&n).is_ok())
}

/// HTML element names (current and obsolete), sorted: tags with these
/// names are markup; any other name is text.
pub(crate) const HTML_ELEMENTS: &[&str] = &[
    "a",
    "abbr",
    "acronym",
    "address",
    "applet",
    "area",
    "article",
    "aside",
    "audio",
    "b",
    "base",
    "basefont",
    "bdi",
    "bdo",
    "bgsound",
    "big",
    "blink",
    "blockquote",
    "body",
    "br",
    "button",
    "canvas",
    "caption",
    "center",
    "cite",
    "code",
    "col",
    "colgroup",
    "data",
    "datalist",
    "dd",
    "del",
    "details",
    "dfn",
    "dialog",
    "dir",
    "div",
    "dl",
    "dt",
    "em",
    "embed",
    "fieldset",
    "figcaption",
    "figure",
    "font",
    "footer",
    "form",
    "frame",
    "frameset",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "head",
    "header",
    "hgroup",
    "hr",
    "html",
    "i",
    "iframe",
    "image",
    "img",
    "input",
    "ins",
    "isindex",
    "kbd",
    "keygen",
    "label",
    "legend",
    "li",
    "link",
    "listing",
    "main",
    "map",
    "mark",
    "marquee",
    "math",
    "menu",
    "menuitem",
    "meta",
    "meter",
    "multicol",
    "nav",
    "nextid",
    "nobr",
    "noembed",
    "noframes",
    "noscript",
    "object",
    "ol",
    "optgroup",
    "option",
    "output",
    "p",
    "param",
    "picture",
    "plaintext",
    "portal",
    "pre",
    "progress",
    "q",
    "rb",
    "rp",
    "rt",
    "rtc",
    "ruby",
    "s",
    "samp",
    "script",
    "search",
    "section",
    "select",
    "slot",
    "small",
    "source",
    "spacer",
    "span",
    "strike",
    "strong",
    "style",
    "sub",
    "summary",
    "sup",
    "svg",
    "table",
    "tbody",
    "td",
    "template",
    "textarea",
    "tfoot",
    "th",
    "thead",
    "time",
    "title",
    "tr",
    "track",
    "tt",
    "u",
    "ul",
    "var",
    "video",
    "wbr",
    "xmp",
];

/// Counts of what the net changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NetReport {
    /// `<` escaped because it did not start a whitelisted tag.
    pub(crate) escaped: usize,
    /// Dangerous text patterns neutralised.
    pub(crate) neutralised: usize,
    /// Stray end tags of removed elements dropped.
    pub(crate) stray: usize,
}

/// The incremental safety net.
#[derive(Debug, Default)]
pub(crate) struct Net {
    /// The input from the first position not decided yet to the end of
    /// the input so far.
    pending: Vec<u8>,
    /// How many leading bytes of `pending` are already written out: the
    /// letters of a possible pattern. They pass whatever follows (a
    /// pattern is neutralised before its last character, and they hold no
    /// `<`, `&` or last character), so only the decisions are waited for,
    /// not the bytes: text that ends in the middle of a word is not held.
    emitted: usize,
    /// The last byte emitted (for [`Decision::Stray`]).
    last: Option<u8>,
    pub(crate) report: NetReport,
}

/// A decision about the bytes at a position.
enum Decision {
    /// More bytes are needed to decide.
    NeedMore,
    /// Nothing to do here.
    Pass,
    /// A whitelisted tag of this length.
    Tag(usize),
    /// A `<` to escape.
    Escape,
    /// A stray end tag of an HTML element that is not kept, this long. The
    /// allowlist pass removes the end tags of the elements it removes, so
    /// one that reaches the net closes nothing: it is dropped.
    Stray(usize),
    /// A pattern: insert the break at this offset, continue after `end`.
    Break { at: usize, end: usize },
}

impl Net {
    /// Filters `bytes`, appending what is certain to `out`.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if self.pending.is_empty() {
            // The common case: nothing held, the input is read in place.
            let (used, emitted, _) = self.run(bytes, 0, Run::Writing, out);
            self.pending.extend_from_slice(&bytes[used..]);
            self.emitted = emitted;
        } else {
            let mut buf = std::mem::take(&mut self.pending);
            buf.extend_from_slice(bytes);
            let (used, emitted, _) = self.run(&buf, self.emitted, Run::Writing, out);
            buf.drain(..used);
            self.pending = buf;
            self.emitted = emitted;
        }
    }

    /// Like [`Net::push`], but when the net changes nothing in `bytes` and
    /// held nothing before them, writes nothing: it returns `Some(n)`, its
    /// output being `bytes[..n]` (the rest is held, as `push` holds it), so
    /// that the caller keeps its own buffer. `None`: the output was written
    /// to `out`. Long prose, and the filter's own escapes, pass this way
    /// without a copy.
    pub(crate) fn push_or_prefix(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Option<usize> {
        if !self.pending.is_empty() {
            self.push(bytes, out);
            return None;
        }
        let (used, emitted, prefix) = self.run(bytes, 0, Run::Lazy, out);
        self.pending.extend_from_slice(&bytes[used..]);
        self.emitted = emitted;
        prefix
    }

    /// Takes `bytes` when [`Net::push`] would write them out as they are
    /// and leave the net as this does: then the caller keeps its bytes and
    /// nothing is copied. Most deltas of prose: every position passes (the
    /// quiet start is all of them), or all but a last letter that may start
    /// a pattern and the ignorable bytes after it (`the `: written and held
    /// for the decision, as `push` does: with nothing but ignorables after
    /// it a pattern letter needs more), after nothing held or after a held
    /// letter the first byte that is not ignorable settles. `false` leaves
    /// the net untouched.
    pub(crate) fn pass_whole(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > WINDOW {
            // A long input: `run` skips its quiet stretches faster (a search
            // for special bytes, not a look at every letter).
            return false;
        }
        // A letter written and held at the end of the previous bytes, with
        // the ignorables after it: the first other byte must settle it.
        if let Some((&letter, ignored)) = self.pending.split_first() {
            if self.emitted != self.pending.len() || !is_letter(letter) || !ignored.iter().all(|&c| ignorable(c)) {
                return false;
            }
            let Some(k) = bytes.iter().position(|&c| !ignorable(c)) else { return false };
            if ignored.len() + k > MAX_IGNORED || !settles(letter, bytes[k]) {
                return false;
            }
        }
        let quiet = quiet_len(bytes);
        let Some((&end, tail)) = bytes.get(quiet..).and_then(<[u8]>::split_first) else {
            return self.passed_all(bytes);
        };
        if !is_letter(end) || tail.len() > MAX_IGNORED || !tail.iter().all(|&c| ignorable(c)) {
            return false;
        }
        if !tail.is_empty() && end.to_ascii_lowercase() == ON[0] {
            // `o` then an ignorable is no `on`: decided, as the matcher
            // decides it.
            return self.passed_all(bytes);
        }
        // The byte before the held letter, as `run` records it.
        self.last = match quiet {
            0 => self.pending.last().copied().or(self.last),
            q => Some(bytes[q - 1]),
        };
        self.pending.clear();
        self.pending.extend_from_slice(&bytes[quiet..]);
        self.emitted = self.pending.len();
        true
    }

    /// Takes `bytes` that change nothing when nothing is held back before
    /// them: they hold no byte `table` stops at (every byte the net
    /// decides at, [`DECIDING`], and what else the caller's own pass stops
    /// at: [`plain_table`]). They pass as they are (a change is made only
    /// at one of those bytes), so nothing is decided but where the
    /// positions that may still start a pattern begin. The net keeps those
    /// positions (letters already written) for the bytes that decide them;
    /// a later [`Net::run`] decides them from there as it would have (a
    /// decision reads only the bytes after its position). Prose deltas
    /// take this way: the net costs a look at their bytes. `false` (the
    /// net untouched) when a byte stops it or something is held back.
    pub(crate) fn take_plain(&mut self, bytes: &[u8], table: &[PlainByte; 256]) -> bool {
        // Held bytes (a possible tag, a character reference) wait for
        // bytes after them; written ones are pattern letters and
        // ignorables only (no `<`, `&` or last character).
        if self.emitted != self.pending.len() {
            return false;
        }
        // A position before the last byte that no pattern can hold before
        // its last character is decided ([`settled_before_end`]); what was
        // kept before these bytes holds no such byte, so only they are read.
        let mut settled = None;
        for (i, &b) in bytes.iter().enumerate() {
            match table[usize::from(b)] {
                PlainByte::Keeps => {}
                PlainByte::Settles => settled = Some(i),
                PlainByte::Stops => return false,
            }
        }
        match settled {
            Some(at) => {
                self.last = Some(bytes[at]);
                self.pending.clear();
                self.pending.extend_from_slice(&bytes[at + 1..]);
            }
            None => {
                self.pending.extend_from_slice(bytes);
                // Positions further than a window from the end are decided:
                // they are dropped a window at a time, not moved each time.
                if self.pending.len() > 2 * WINDOW {
                    let cut = self.pending.len() - WINDOW;
                    self.last = Some(self.pending[cut - 1]);
                    self.pending.drain(..cut);
                }
            }
        }
        self.emitted = self.pending.len();
        true
    }

    /// [`Net::pass_whole`] when every position of `bytes` is decided.
    fn passed_all(&mut self, bytes: &[u8]) -> bool {
        self.pending.clear();
        self.emitted = 0;
        if let Some(&end) = bytes.last() {
            self.last = Some(end);
        }
        true
    }

    /// Flushes everything held.
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        let buf = std::mem::take(&mut self.pending);
        let (used, _, _) = self.run(&buf, self.emitted, Run::Last, out);
        self.pending = buf[used..].to_vec();
        self.emitted = 0;
    }

    /// Bytes held back (not written out yet).
    pub(crate) fn held(&self) -> usize {
        self.pending.len() - self.emitted
    }

    /// Filters `buf` into `out`, of which the first `written` bytes are
    /// already out; returns how many bytes it decided (the rest is kept for
    /// more input), how many of the rest are written out, and, for a
    /// [`Run::Lazy`] run that changed nothing, the length of the prefix of
    /// `buf` that is its output, not written.
    fn run(&mut self, buf: &[u8], written: usize, run: Run, out: &mut Vec<u8>) -> (usize, usize, Option<usize>) {
        let last = run == Run::Last;
        let mut i = 0;
        let mut copied = written;
        // Nothing changed yet: a lazy run has written nothing.
        let mut unchanged = run == Run::Lazy && written == 0;
        // A short buffer (a small delta) is read whole: every position in
        // it is within the window of its end.
        let mut specials = (buf.len() > WINDOW).then(|| Specials::new(buf));
        while i < buf.len() {
            if buf[i] == b'<'
                && let Some(len) = bare_allowed_tag(&buf[i..])
            {
                i += len;
                continue;
            }
            // The escapes the filter itself writes (`&lt;` for every `<`
            // that starts nothing) pass whole: the entity decodes to no
            // pattern's first character and no position inside it starts
            // a pattern (the decisions the loop below would reach).
            if buf[i] == b'&'
                && let Some(escape) = SAFE_ESCAPES.iter().find(|e| buf[i..].starts_with(e))
            {
                i += escape.len();
                // A run of the filter's own escape of `<` (`&#60;`, a flood
                // of `<`), or of `&lt;`, passes without a look at each.
                i += match *escape {
                    b"&lt;" => repeats(*b"&lt;", &buf[i..]),
                    e if e == ESCAPE.as_bytes() => escape_run(&buf[i..]) * escape.len(),
                    _ => 0,
                };
                continue;
            }
            // A decision other than `Pass` needs a special byte (or the end
            // of the input) within `WINDOW` bytes: positions further from
            // one pass without a look (the prose fast path).
            let (skip_to, end) = specials.as_mut().map_or((0, buf.len()), |s| s.next(i));
            if skip_to > i {
                i = skip_to;
                continue;
            }
            // Up to the special byte that ends the stretch, the quiet
            // positions pass in one tight loop (what the checks below
            // would decide for each).
            let quiet = if end > i { quiet_len(buf.get(i..end).unwrap_or_default()) } else { 0 };
            if quiet > 0 {
                i += quiet;
                continue;
            }
            let b = buf[i];
            if !is_candidate(b) {
                // Only a candidate byte can decide anything: step to the
                // next one in one tight loop, at most a window ahead (past
                // it, the specials may skip further without a look).
                let ahead = &buf[i..buf.len().min(i + WINDOW)];
                i += ahead.iter().position(|&b| is_candidate(b)).unwrap_or(ahead.len());
                continue;
            }
            // Most candidate letters in prose are followed (after the
            // ignorable bytes a pattern may hold, at most MAX_IGNORED: a
            // word's last letter and a space) by a character that no
            // pattern starting with them has second: pass them without the
            // pattern matcher (the decision it would reach). An `&` (an
            // entity), a longer ignorable run or the end of the input still
            // go to the matcher.
            if passes_without_matcher(buf, i) {
                i += 1;
                continue;
            }
            let decision = if b == b'<' { check_tag(&buf[i..], last) } else { match_pattern(buf, i, last) };
            match decision {
                Decision::NeedMore => break,
                Decision::Pass => i += 1,
                Decision::Tag(len) => i += len,
                Decision::Escape => {
                    unchanged = false;
                    write_out(out, buf, copied, i);
                    out.extend_from_slice(b"&lt;");
                    self.report.escaped += 1;
                    i += 1;
                    copied = i;
                }
                Decision::Stray(len) => {
                    unchanged = false;
                    write_out(out, buf, copied, i);
                    let before = if i > 0 { buf.get(i - 1).copied() } else { self.last };
                    // Dropping the tag must not join the text around it into
                    // a pattern (`java</p>script:`): unless whitespace or a
                    // tag comes before it, a zero-width space stays.
                    if !matches!(before, None | Some(b' ' | b'\t' | b'\n' | b'\r' | b'>')) {
                        out.extend_from_slice(BREAK.as_bytes());
                    }
                    self.report.stray += 1;
                    i += len;
                    copied = i;
                }
                Decision::Break { at, end } => {
                    unchanged = false;
                    write_out(out, buf, copied, at);
                    out.extend_from_slice(BREAK.as_bytes());
                    self.report.neutralised += 1;
                    copied = at;
                    i = end;
                }
            }
        }
        if i > 0 {
            self.last = buf.get(i - 1).copied();
        }
        if i == buf.len() {
            if unchanged {
                return (i, 0, Some(i));
            }
            write_out(out, buf, copied, i);
            return (i, 0, None);
        }
        // Undecided from `i`. A possible pattern's letters (the matcher read
        // them all, to the end of the input, without meeting a `<` or a
        // last character) are written now; a `<` or an `&` (a tag or a
        // character reference not complete yet) and what follows are held.
        let from = copied.max(i);
        let held = from + buf[from..].iter().position(|&b| b == b'<' || b == b'&').unwrap_or(buf.len() - from);
        if unchanged {
            return (i, held - i, Some(held));
        }
        write_out(out, buf, copied, held);
        (i, held - i, None)
    }
}

/// How [`Net::run`] treats its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// More input may follow; the output is written.
    Writing,
    /// More input may follow; an output that is a prefix of the input
    /// (nothing changed) is not written, only measured.
    Lazy,
    /// The end of the input: everything is decided.
    Last,
}

/// Writes `buf[from..to]` out. Every decision that writes is at or after
/// what is already out (written letters hold no `<` and no pattern's last
/// character), so `from <= to`.
fn write_out(out: &mut Vec<u8>, buf: &[u8], from: usize, to: usize) {
    debug_assert!(from <= to, "the net wrote past a decision: {from} > {to}");
    if out.capacity() == 0 {
        // The first write into an empty buffer (a lazy run's, or one the
        // caller left unsized): room for the rest of the input and a few
        // insertions at once.
        out.reserve(buf.len().saturating_sub(from) + 64);
    }
    out.extend_from_slice(buf.get(from..to).unwrap_or_default());
}

/// The escape of `<` in code, written before the filter and read after
/// it (see `code`); also the filter's own escape of `<`. Here because the
/// net passes runs of it (a flood of `<`) and the code stage both writes
/// and reads it: both use it without the net reading the code stage.
pub(crate) const ESCAPE: &str = "&#60;";

/// [`ESCAPE`] sixty-four times: a run of `<` (a flood) is written, and
/// read again, a block at a time.
pub(crate) const ESCAPED_LTS: &[u8; 64 * ESCAPE.len()] = &repeated(ESCAPE.as_bytes());

/// `unit` repeated to fill `N` bytes: a block of escapes, written or
/// compared at once.
pub(crate) const fn repeated<const N: usize>(unit: &[u8]) -> [u8; N] {
    let mut block = [0u8; N];
    let mut i = 0;
    while i < N {
        block[i] = unit[i % unit.len()];
        i += 1;
    }
    block
}

/// How many whole [`ESCAPE`]s `hay` starts with, compared a block of
/// [`ESCAPED_LTS`] at a time.
pub(crate) fn escape_run(hay: &[u8]) -> usize {
    let mut n = 0;
    while hay[n * ESCAPE.len()..].starts_with(ESCAPED_LTS) {
        n += ESCAPED_LTS.len() / ESCAPE.len();
    }
    n + hay[n * ESCAPE.len()..].chunks_exact(ESCAPE.len()).take_while(|c| *c == ESCAPE.as_bytes()).count()
}

/// Character references that pass the net unchanged, whole: the filter's
/// own escapes ([`ESCAPE`] is its escape of `<`), each decoding to no
/// pattern's first character, with no position inside that starts a
/// pattern.
const SAFE_ESCAPES: [&[u8]; 5] = [ESCAPE.as_bytes(), b"&lt;", b"&gt;", b"&amp;", b"&quot;"];

/// Farthest a pattern match reaches from its first byte before it meets a
/// special byte: a pattern holds at most `MAX_IGNORED` ignorables and, for
/// `on<word>=`, a word of at most 40 characters, so any match reads an
/// entity's `&`, its last character (`:`, `(`, `=`) or the end of the input
/// within fewer bytes than this. A `<` decides only at itself (no pattern
/// holds one).
const WINDOW: usize = 64;
const _: () = assert!(WINDOW > 2 + 40 + MAX_IGNORED + 1 && WINDOW > 11 + MAX_IGNORED);

/// The bytes at which the net may change its input: a `<` (a tag), an
/// `&` (a character reference) and the last characters of the patterns.
/// Input without them passes as it is ([`Net::take_plain`]).
const DECIDING: [u8; 5] = *b"<&:(=";

/// What a byte is to [`Net::take_plain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlainByte {
    /// A letter, a digit, `_`, `-` or an ignorable byte: a pattern may
    /// hold it before its last character.
    Keeps,
    /// No pattern holds it before its last character: every position
    /// before it is decided.
    Settles,
    /// The net (or the caller's pass) may change the input here.
    Stops,
}

/// The table [`Net::take_plain`] reads bytes by: [`DECIDING`] and the
/// caller's `also` stop it.
pub(crate) const fn plain_table(also: &[u8]) -> [PlainByte; 256] {
    let mut table = [PlainByte::Settles; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        if before_last(c) {
            table[b] = PlainByte::Keeps;
        }
        b += 1;
    }
    let mut k = 0;
    while k < DECIDING.len() {
        table[DECIDING[k] as usize] = PlainByte::Stops;
        k += 1;
    }
    let mut k = 0;
    while k < also.len() {
        table[also[k] as usize] = PlainByte::Stops;
        k += 1;
    }
    table
}

/// Where the next decision that may not be `Pass` can be, from any
/// position: at the next `<`, or `WINDOW` bytes before the next `&`, `:`,
/// `(`, `=` or the end of the buffer when no `<` comes first (a pattern
/// holds no `<`: one that starts before it meets it and passes). Each
/// search is cached until it is passed, so walking a whole buffer is
/// linear.
struct Specials<'a> {
    buf: &'a [u8],
    lt: Option<usize>,
    amp: Option<usize>,
    ends: Option<usize>,
    /// The last stop, and where the positions before it that need a look
    /// begin (computed once per stop).
    look: Option<(usize, usize)>,
}

impl<'a> Specials<'a> {
    fn new(buf: &'a [u8]) -> Specials<'a> {
        Specials { buf, lt: None, amp: None, ends: None, look: None }
    }

    /// The first position at or after `from` that needs a look (or one
    /// before `from`: no skip), and the special byte (or the end of the
    /// buffer) that ends the stretch of positions needing one.
    fn next(&mut self, from: usize) -> (usize, usize) {
        let buf = self.buf;
        let len = buf.len();
        if buf.get(from) == Some(&b'<') {
            // At a `<` already (tag after tag): no search.
            return (from, from);
        }
        let find = |cached: &mut Option<usize>, search: &dyn Fn(&[u8]) -> Option<usize>| {
            if cached.is_none_or(|p| p < from) {
                *cached = Some(search(buf.get(from..).unwrap_or_default()).map_or(len, |p| p + from));
            }
            cached.unwrap_or(len)
        };
        let lt = find(&mut self.lt, &|b| memchr::memchr(b'<', b));
        let amp = find(&mut self.amp, &|b| memchr::memchr(b'&', b));
        let ends = find(&mut self.ends, &|b| memchr::memchr3(b':', b'(', b'=', b));
        let stop = amp.min(ends).min(len);
        if lt < stop {
            // A pattern that starts before the `<` meets it before its
            // last character, entity or the end: all of them pass.
            return (lt, lt);
        }
        let window = stop.saturating_sub(WINDOW);
        let look_from = match self.look {
            Some((at, from)) if at == stop => from,
            _ => {
                let from = if stop == len {
                    settled_before_end(buf)
                } else if stop == ends && no_pattern_ends_at(buf, stop) {
                    stop
                } else {
                    window
                };
                self.look = Some((stop, from));
                from
            }
        };
        (look_from.max(window), stop)
    }
}

/// Whether no pattern can end at `buf[at]` (a `:`, `(` or `=`): the
/// character before it, past at most [`MAX_IGNORED`] ignorable bytes, is
/// none that a pattern ending there has last (`t` of `…script:`, `n` or
/// `l` of `expression(` and `url(`, a word character of `on<word>=`, or
/// the `;` of a character reference). Then, with no `<` or `&` before it
/// (the caller's stretch), every position before it passes: a match from
/// any of them meets that character, or the `:`, `(` or `=`, before its
/// end, and no pattern holds one of those but as its last character.
/// ([`Net::run`]'s matcher, position by position, decides the same; a
/// proptest holds the two together.)
fn no_pattern_ends_at(buf: &[u8], at: usize) -> bool {
    let Some(&end) = buf.get(at) else { return false };
    let mut ignored = 0;
    for &c in buf[..at].iter().rev() {
        if ignorable(c) {
            ignored += 1;
            if ignored > MAX_IGNORED {
                return true;
            }
            continue;
        }
        let c = c.to_ascii_lowercase();
        let may_end = match end {
            b':' => c == b't',
            b'(' => c == b'n' || c == b'l',
            _ => is_word(c),
        };
        return !may_end && c != b';';
    }
    // Ignorable bytes only: no letter, no pattern.
    true
}

/// Where the positions that may still be undecided at the end of `buf`
/// begin, when no `<`, `&`, `:`, `(` or `=` comes before the end (the
/// caller's stretch): after the last byte that no pattern's start can
/// hold before its last character (a letter, a digit, `_`, `-` or an
/// ignorable byte), looking back at most a [`WINDOW`]. A match from any
/// position before it meets that byte and passes.
fn settled_before_end(buf: &[u8]) -> usize {
    let from = buf.len().saturating_sub(WINDOW);
    buf[from..].iter().rposition(|&c| !before_last(c)).map_or(from, |at| from + at + 1)
}

/// The first two letters of `on<word>=`, a pattern beside [`PATTERNS`].
const ON: &[u8; 2] = b"on";

/// The first letter of each pattern, `on<word>=` last.
const FIRSTS: [u8; PATTERNS.len() + 1] = {
    let mut firsts = [ON[0]; PATTERNS.len() + 1];
    let mut k = 0;
    while k < PATTERNS.len() {
        firsts[k] = PATTERNS[k][0];
        k += 1;
    }
    firsts
};

/// The second letter of the pattern that starts with a letter (lower
/// case), by that letter; 0 for no pattern. One pattern per first letter
/// (checked when this is built), so one second letter each.
static SECOND: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut k = 0;
    while k < FIRSTS.len() {
        let second = if k < PATTERNS.len() { PATTERNS[k][1] } else { ON[1] };
        assert!(table[FIRSTS[k] as usize] == 0, "two patterns start with one letter");
        table[FIRSTS[k] as usize] = second;
        k += 1;
    }
    table
};

/// Whether the candidate letter at `i` is certainly not a pattern start:
/// the next character after at most [`MAX_IGNORED`] ignorable bytes is
/// known, is not an entity, and is no second character of a pattern that
/// starts with this letter. ([`match_pattern`] would decide `Pass`.)
#[inline]
fn passes_without_matcher(buf: &[u8], i: usize) -> bool {
    let Some(&b) = buf.get(i) else { return false };
    if b == b'<' || b == b'&' {
        return false;
    }
    let after = buf.get(i + 1..buf.len().min(i + 2 + MAX_IGNORED)).unwrap_or_default();
    after.iter().find(|&&c| !ignorable(c)).is_some_and(|&next| settles(b, next))
}

/// How many leading bytes of `buf` pass without a decision: bytes that
/// start nothing, and candidate letters that [`passes_without_matcher`]
/// passes (the first byte after them that is not ignorable settles them:
/// not an entity, not the pattern's second letter). It stops at a `<`, an
/// `&`, or a letter the bytes after it do not settle; what the loop in
/// `Net::run` decides from there is what it would have decided anyway.
#[inline]
fn quiet_len(buf: &[u8]) -> usize {
    let mut i = 0;
    while let Some(&b) = buf.get(i) {
        if is_candidate(b) && !passes_without_matcher(buf, i) {
            break;
        }
        i += 1;
    }
    i
}

/// Whether `b` is a candidate letter (a pattern's first letter, not `<` or
/// `&`).
fn is_letter(b: u8) -> bool {
    is_candidate(b) && b != b'<' && b != b'&'
}

/// Whether the byte right after the candidate letter `letter` settles it as
/// no pattern's start ([`passes_without_matcher`]'s decision when that
/// byte is not ignorable).
fn settles(letter: u8, next: u8) -> bool {
    if ignorable(next) {
        return false;
    }
    let next = next.to_ascii_lowercase();
    next != b'&' && SECOND[usize::from(letter.to_ascii_lowercase())] != next
}

fn is_candidate(b: u8) -> bool {
    CANDIDATES[usize::from(b)]
}

/// The bytes a decision other than `Pass` can start at: `<`, `&` and the
/// first letters of the patterns, either case (a table: the test runs on
/// every byte near a special one).
static CANDIDATES: [bool; 256] = {
    let mut table = [false; 256];
    table[b'<' as usize] = true;
    table[b'&' as usize] = true;
    let mut k = 0;
    while k < FIRSTS.len() {
        table[FIRSTS[k] as usize] = true;
        table[FIRSTS[k].to_ascii_uppercase() as usize] = true;
        k += 1;
    }
    table
};

/// Whether `buf` (starting with `<`) starts a whitelisted tag as the
/// allowlist pass writes them.
fn check_tag(buf: &[u8], last: bool) -> Decision {
    // A tag starts `<name` or `</name`: a `<` followed by anything else is
    // text, whatever comes later. Deciding it here, without looking for a
    // `>` up to MAX_TAG bytes ahead, keeps a flood of `<` linear (the
    // decision is the one the scan below would reach).
    match buf.get(1) {
        None if !last => return Decision::NeedMore,
        None => return Decision::Escape,
        Some(&next) if !(next.is_ascii_alphabetic() || next == b'/') => return Decision::Escape,
        Some(_) => {}
    }
    let window = &buf[..buf.len().min(MAX_TAG)];
    let Some(gt) = window.iter().position(|&b| b == b'>') else {
        return if last || buf.len() >= MAX_TAG { Decision::Escape } else { Decision::NeedMore };
    };
    let tag = &buf[..=gt];
    if whitelisted_tag(tag) {
        Decision::Tag(gt + 1)
    } else if stray_end_tag(tag) {
        Decision::Stray(gt + 1)
    } else {
        Decision::Escape
    }
}

/// `</name ...>` where `name` is an HTML element.
fn stray_end_tag(tag: &[u8]) -> bool {
    let Some(rest) = tag.strip_prefix(b"</") else {
        return false;
    };
    let name_len = rest.iter().take_while(|b| b.is_ascii_alphanumeric()).count();
    let name = String::from_utf8_lossy(&rest[..name_len]).to_ascii_lowercase();
    let after = rest.get(name_len).copied();
    name_len > 0
        && matches!(after, Some(b'>' | b' ' | b'\t' | b'\n' | b'\r' | b'/'))
        && HTML_ELEMENTS.binary_search(&name.as_str()).is_ok()
}

/// Whether `name` (any case) is an allowed element.
fn is_allowed(name: &[u8]) -> bool {
    ALLOWED.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(name))
}

/// The length of a `<name>` or `</name>` of an allowed element, whole at
/// the start of `buf` (what [`check_tag`] decides for it, without looking
/// for its `>` first): tag after tag of inline HTML passes here.
#[inline]
fn bare_allowed_tag(buf: &[u8]) -> Option<usize> {
    let start = if buf.get(1) == Some(&b'/') { 2 } else { 1 };
    // The longest allowed name, `strong`, and one more.
    let name_len = buf.get(start..)?.iter().take(7).take_while(|b| b.is_ascii_alphanumeric()).count();
    let end = start + name_len;
    (name_len > 0 && buf.get(end) == Some(&b'>') && is_allowed(&buf[start..end])).then_some(end + 1)
}

/// `<name>`, `</name>`, `<br/>`, `<span style="..">` with a safe style.
fn whitelisted_tag(tag: &[u8]) -> bool {
    // The common forms, `<name>` and `</name>`, decided on the bytes (the
    // answer the reading below gives them).
    if let Some(inner) = tag.strip_prefix(b"<").and_then(|t| t.strip_suffix(b">")) {
        let name = inner.strip_prefix(b"/").unwrap_or(inner);
        if !name.is_empty() && name.iter().all(u8::is_ascii_alphanumeric) {
            return is_allowed(name);
        }
    }
    let Ok(tag) = std::str::from_utf8(tag) else {
        return false;
    };
    let Some(inner) = tag.strip_prefix('<').and_then(|t| t.strip_suffix('>')) else {
        return false;
    };
    let (close, inner) = match inner.strip_prefix('/') {
        Some(rest) => (true, rest),
        None => (false, inner),
    };
    let name_len = inner.bytes().take_while(u8::is_ascii_alphanumeric).count();
    let name = &inner[..name_len];
    if !is_allowed(name.as_bytes()) {
        return false;
    }
    let rest = &inner[name_len..];
    if close {
        return rest.trim_start_matches(is_space).is_empty();
    }
    let rest = rest.trim_end_matches(is_space);
    let rest = rest.strip_suffix('/').unwrap_or(rest).trim_end_matches(is_space);
    if rest.is_empty() {
        return true;
    }
    // Attributes: only `style` on `span`, separated by whitespace.
    if !name.eq_ignore_ascii_case("span") || !rest.starts_with(is_space) {
        return false;
    }
    let rest = rest.trim_start_matches(is_space);
    let Some(after_name) = strip_prefix_ci(rest, "style") else {
        return false;
    };
    let Some(value) = after_name.trim_start_matches(is_space).strip_prefix('=') else {
        return false;
    };
    let value = value.trim_start_matches(is_space);
    let raw = if let Some(v) = value.strip_prefix('"') {
        match v.strip_suffix('"') {
            Some(inner) if !inner.contains('"') => inner,
            _ => return false,
        }
    } else if let Some(v) = value.strip_prefix('\'') {
        match v.strip_suffix('\'') {
            Some(inner) if !inner.contains('\'') => inner,
            _ => return false,
        }
    } else {
        if value.contains(|c: char| is_space(c) || matches!(c, '"' | '\'' | '`' | '=' | '<')) {
            return false;
        }
        value
    };
    // A style that declares nothing (`style=`, `style=";"`) is one the
    // allowlist removes: it never writes such a tag (only text can hold
    // one, as the value of a broken tag shown as text).
    raw.split(';').any(|d| !d.trim().is_empty()) && style_is_safe(raw)
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\u{c}')
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix).then(|| &s[prefix.len()..])
}

/// One decoded character of text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// Not enough bytes to decode.
    NeedMore,
    /// The end of the input.
    End,
    /// A character (ASCII lower-cased; `0x80` stands for any non-ASCII
    /// character) and its length in bytes.
    Char(u8, usize),
}

/// Decodes the unit at `pos`: a character reference or one byte.
fn unit(buf: &[u8], pos: usize, last: bool) -> Unit {
    let Some(&b) = buf.get(pos) else {
        return if last { Unit::End } else { Unit::NeedMore };
    };
    if b != b'&' {
        return Unit::Char(if b.is_ascii() { b.to_ascii_lowercase() } else { 0x80 }, 1);
    }
    match entity(&buf[pos..], last) {
        Some(Some((c, len))) => Unit::Char(c, len),
        Some(None) => Unit::Char(b'&', 1),
        None => Unit::NeedMore,
    }
}

/// A character reference at the start of `buf` (which starts with `&`):
/// `Some(Some((char, len)))`, `Some(None)` when it is not one, `None` when
/// more bytes are needed.
fn entity(buf: &[u8], last: bool) -> Option<Option<(u8, usize)>> {
    const MAX: usize = 12;
    let more = |n: usize| {
        if !last && buf.len() <= n && n < MAX { None } else { Some(None) }
    };
    let Some(&second) = buf.get(1) else {
        return more(1);
    };
    if second == b'#' {
        let (hex, start) = match buf.get(2) {
            Some(b'x' | b'X') => (true, 3),
            Some(_) => (false, 2),
            None => return more(2),
        };
        let mut i = start;
        let mut value: u32 = 0;
        while i < buf.len() && i < MAX {
            let d = buf[i];
            let digit = if hex { (d as char).to_digit(16) } else { (d as char).to_digit(10) };
            match digit {
                Some(v) => value = value.saturating_mul(if hex { 16 } else { 10 }).saturating_add(v),
                None => break,
            }
            i += 1;
        }
        if i == buf.len() && !last && i < MAX {
            return None;
        }
        if i == start {
            return Some(None);
        }
        let len = if buf.get(i) == Some(&b';') { i + 1 } else { i };
        let c =
            char::from_u32(value).map_or(0x80, |c| if c.is_ascii() { (c as u8).to_ascii_lowercase() } else { 0x80 });
        return Some(Some((c, len)));
    }
    let name_len = buf[1..].iter().take(MAX).take_while(|b| b.is_ascii_alphanumeric()).count();
    if 1 + name_len == buf.len() && !last && name_len < MAX {
        return None;
    }
    if buf.get(1 + name_len) != Some(&b';') {
        return Some(None);
    }
    let name = &buf[1..1 + name_len];
    let c = match name {
        b"colon" => b':',
        b"lpar" => b'(',
        b"rpar" => b')',
        b"equals" => b'=',
        b"Tab" => b'\t',
        b"NewLine" => b'\n',
        b"nbsp" => b' ',
        b"lt" => b'<',
        b"gt" => b'>',
        b"amp" => b'&',
        b"quot" => b'"',
        b"apos" => b'\'',
        _ => return Some(None),
    };
    Some(Some((c, name_len + 2)))
}

/// A character of the word in `on<word>=` (every letter of the other
/// patterns is one too).
const fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// Whether a pattern may hold `c` before its last character: a letter,
/// a digit, `_` or `-` (of `on<word>=`), or an ignorable byte.
const fn before_last(c: u8) -> bool {
    ignorable(c) || is_word(c)
}

/// Characters browsers skip inside a URL scheme (and that the net skips
/// inside a pattern).
const fn ignorable(c: u8) -> bool {
    c <= 0x20
}

/// Literal patterns, lower case; the last byte is where the break goes.
const PATTERNS: &[&[u8]] = &[b"javascript:", b"vbscript:", b"livescript:", b"expression(", b"url("];

/// Most ignorable characters a pattern may hold.
const MAX_IGNORED: usize = 16;

fn match_pattern(buf: &[u8], pos: usize, last: bool) -> Decision {
    let first = match unit(buf, pos, last) {
        Unit::NeedMore => return Decision::NeedMore,
        Unit::End => return Decision::Pass,
        Unit::Char(c, _) => c,
    };
    let mut need_more = false;
    for pattern in PATTERNS {
        if pattern.first() != Some(&first) {
            continue;
        }
        match match_literal(buf, pos, pattern, last) {
            Decision::NeedMore => need_more = true,
            d @ Decision::Break { .. } => return d,
            _ => {}
        }
    }
    if first == ON[0] {
        match match_on_handler(buf, pos, last) {
            Decision::NeedMore => need_more = true,
            d @ Decision::Break { .. } => return d,
            _ => {}
        }
    }
    if need_more { Decision::NeedMore } else { Decision::Pass }
}

fn match_literal(buf: &[u8], pos: usize, pattern: &[u8], last: bool) -> Decision {
    let mut q = pos;
    let mut ignored = 0;
    for (k, &want) in pattern.iter().enumerate() {
        loop {
            match unit(buf, q, last) {
                Unit::NeedMore => return Decision::NeedMore,
                Unit::End => return Decision::Pass,
                Unit::Char(c, len) if k > 0 && ignorable(c) && c != want => {
                    ignored += 1;
                    if ignored > MAX_IGNORED {
                        return Decision::Pass;
                    }
                    q += len;
                }
                Unit::Char(c, len) => {
                    if c != want {
                        return Decision::Pass;
                    }
                    if k + 1 == pattern.len() {
                        return Decision::Break { at: q, end: q + len };
                    }
                    q += len;
                    break;
                }
            }
        }
    }
    Decision::Pass
}

/// `on` + word characters + ignorables + `=`.
fn match_on_handler(buf: &[u8], pos: usize, last: bool) -> Decision {
    let mut q = pos;
    for &want in ON {
        match unit(buf, q, last) {
            Unit::NeedMore => return Decision::NeedMore,
            Unit::Char(c, len) if c == want => q += len,
            _ => return Decision::Pass,
        }
    }
    let mut word = 0;
    loop {
        match unit(buf, q, last) {
            Unit::NeedMore => return Decision::NeedMore,
            Unit::Char(c, len) if is_word(c) => {
                word += 1;
                if word > 40 {
                    return Decision::Pass;
                }
                q += len;
            }
            _ => break,
        }
    }
    if word == 0 {
        return Decision::Pass;
    }
    let mut ignored = 0;
    loop {
        match unit(buf, q, last) {
            Unit::NeedMore => return Decision::NeedMore,
            Unit::Char(b'=', len) => {
                return Decision::Break { at: q, end: q + len };
            }
            Unit::Char(c, len) if ignorable(c) => {
                ignored += 1;
                if ignored > MAX_IGNORED {
                    return Decision::Pass;
                }
                q += len;
            }
            _ => return Decision::Pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_direct_matches_are_html_elements() {
        for name in COMMON_ELEMENTS {
            let name = std::str::from_utf8(name).unwrap_or_default();
            assert!(HTML_ELEMENTS.binary_search(&name).is_ok(), "{name}");
        }
        assert!(is_html_element(b"table") && !is_html_element(b"user") && !is_html_element(b"bb"));
    }

    proptest! {
        /// The stretches the specials skip hold only positions the matcher
        /// passes: before a `:`, `(` or `=` that no pattern can end at,
        /// and before the settled end of the input.
        #[test]
        fn skipped_positions_pass(
            bytes in prop::collection::vec(prop::sample::select(b"javscriptexlonuURL(:= \t\n\x0b#;x1_-.,\xe4".to_vec()), 0..90),
        ) {
            let text = String::from_utf8_lossy(&bytes);
            // The first `:`, `(` or `=` (or the end), with no `<` or `&`
            // before it, as `Specials::next` finds it.
            let stop = bytes.iter().position(|b| b":(=".contains(b)).unwrap_or(bytes.len());
            let skipped = if stop == bytes.len() {
                settled_before_end(&bytes)
            } else if no_pattern_ends_at(&bytes, stop) {
                stop
            } else {
                0
            };
            for i in 0..skipped {
                if is_candidate(bytes[i]) {
                    let decision = match_pattern(&bytes, i, false);
                    prop_assert!(matches!(decision, Decision::Pass), "{text:?} at {i}");
                }
            }
        }

        /// The shortcut decides only what the matcher would: wherever it
        /// passes a candidate letter, the matcher (with all the input
        /// there, or more to come) passes it too.
        #[test]
        fn the_shortcut_agrees_with_the_matcher(
            bytes in prop::collection::vec(prop::sample::select(b"javscriptexlonuURL(:= \t\n\x0b&#;x1\xe4".to_vec()), 0..40),
        ) {
            for i in 0..bytes.len() {
                if is_candidate(bytes[i]) && passes_without_matcher(&bytes, i) {
                    for last in [true, false] {
                        prop_assert!(
                            matches!(match_pattern(&bytes, i, last), Decision::Pass),
                            "{:?} at {i} (last {last})",
                            String::from_utf8_lossy(&bytes)
                        );
                    }
                }
            }
        }
    }

    /// Text dense in what the net decides: pattern letters, tags,
    /// character references.
    fn markup() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(prop::sample::select(b"javscriptexlonuURLb(:=> <>/p\t&#;x16lt:colon".to_vec()), 0..60)
    }

    /// Pattern letters between runs of ignorable bytes, some longer than a
    /// pattern may hold.
    fn spaced() -> impl Strategy<Value = Vec<u8>> {
        let letter = prop::sample::select(b"ejovunx(:=&a".to_vec()).prop_map(|b| vec![b]);
        let run = (1usize..20, prop::sample::select(b" \t\n".to_vec())).prop_map(|(n, b)| vec![b; n]);
        prop::collection::vec(prop_oneof![letter, run], 0..20).prop_map(|parts| parts.concat())
    }

    /// Markup among stretches of quiet prose and of the filter's own
    /// escapes: inputs past the window.
    fn long() -> impl Strategy<Value = Vec<u8>> {
        let quiet = Just(b"the lamp turned slowly above the dark water and ".to_vec());
        let escapes = Just(b"&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;&lt;".to_vec());
        prop::collection::vec(prop_oneof![markup(), quiet, escapes], 0..10).prop_map(|parts| parts.concat())
    }

    /// The net's own table: no other pass's stops.
    static NET_ONLY: [PlainByte; 256] = plain_table(&[]);

    /// Words of pattern letters between spaces and punctuation, long runs
    /// without a byte the net decides at, and now and then one: the
    /// shape `take_plain` takes, with patterns split across its pieces.
    fn plain_words() -> impl Strategy<Value = Vec<u8>> {
        let word = prop::sample::select(vec![
            &b"javascript"[..],
            b"java",
            b"script",
            b"onclick",
            b"onmouseover",
            b"expression",
            b"url",
            b"vb",
            b"live",
            b"the",
            b"lamp",
            b"\xe4\xb8\xad",
        ])
        .prop_map(<[u8]>::to_vec);
        let gap = prop::sample::select(vec![&b" "[..], b"  \t", b"\n", b". ", b", ", b"-", b"_", b""])
            .prop_map(<[u8]>::to_vec);
        let decider = prop::sample::select(vec![&b":"[..], b"(", b" =", b"&#58;", b"<b>", b"</p>", b"&amp;"])
            .prop_map(<[u8]>::to_vec);
        prop::collection::vec(prop_oneof![4 => word, 4 => gap, 1 => decider], 0..40).prop_map(|parts| parts.concat())
    }

    /// `bytes` in pieces, each taken by `shortcut` where it takes it and
    /// pushed otherwise, against every piece pushed: the output so far is
    /// the same after each piece (a piece taken is what `push` writes for
    /// it), `same_net` holds between the two nets, and the ends and the
    /// reports are the same.
    fn shortcut_is_pushing(
        bytes: &[u8],
        cuts: &[usize],
        mut shortcut: impl FnMut(&mut Net, &[u8]) -> bool,
        same_net: impl Fn(&Net, &Net) -> Result<(), TestCaseError>,
    ) -> Result<(), TestCaseError> {
        let (mut pushed, mut mixed) = (Net::default(), Net::default());
        let (mut out_pushed, mut out_mixed) = (Vec::new(), Vec::new());
        for piece in pieces(bytes, cuts) {
            pushed.push(piece, &mut out_pushed);
            if shortcut(&mut mixed, piece) {
                out_mixed.extend_from_slice(piece);
            } else {
                mixed.push(piece, &mut out_mixed);
            }
            prop_assert_eq!(&out_mixed, &out_pushed, "{:?}", String::from_utf8_lossy(bytes));
            same_net(&mixed, &pushed)?;
        }
        pushed.finish(&mut out_pushed);
        mixed.finish(&mut out_mixed);
        prop_assert_eq!(out_mixed, out_pushed);
        prop_assert_eq!(&mixed.report, &pushed.report);
        Ok(())
    }

    /// `bytes` cut into pieces of the sizes in `cuts`, cycled.
    fn pieces<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut rest = bytes;
        for &cut in cuts.iter().cycle() {
            if rest.is_empty() || cut == 0 {
                break;
            }
            let (piece, tail) = rest.split_at(cut.min(rest.len()));
            out.push(piece);
            rest = tail;
        }
        out
    }

    proptest! {
        /// Any chunking gives the output of the whole input, and what is
        /// written after each chunk is a prefix of it: the letters written
        /// before their pattern is decided never need a change.
        #[test]
        fn chunking_does_not_change_the_output(
            bytes in markup(),
            cuts in prop::collection::vec(1usize..9, 1..12),
        ) {
            let whole = {
                let mut n = Net::default();
                let mut out = Vec::new();
                n.push(&bytes, &mut out);
                n.finish(&mut out);
                out
            };
            let mut n = Net::default();
            let mut out = Vec::new();
            for piece in pieces(&bytes, &cuts) {
                n.push(piece, &mut out);
                prop_assert!(whole.starts_with(&out), "{:?}: {:?} is not a prefix of {:?}",
                    String::from_utf8_lossy(&bytes), String::from_utf8_lossy(&out), String::from_utf8_lossy(&whole));
            }
            n.finish(&mut out);
            prop_assert_eq!(out, whole);
        }
    }

    proptest! {
        /// Taking a chunk whole (`pass_whole`) is `push` when it succeeds:
        /// the same output (the chunk itself), the same net after it (held
        /// bytes, the last byte, every later decision), so that a stream
        /// that mixes both gives the output of `push` alone.
        #[test]
        fn passing_whole_is_pushing(
            bytes in prop_oneof![markup(), spaced()],
            cuts in prop::collection::vec(1usize..24, 1..12),
        ) {
            shortcut_is_pushing(&bytes, &cuts, Net::pass_whole, |mixed, pushed| {
                prop_assert_eq!(&mixed.pending, &pushed.pending);
                prop_assert_eq!(mixed.emitted, pushed.emitted);
                prop_assert_eq!(mixed.last, pushed.last);
                Ok(())
            })?;
        }

        /// Taking plain pieces (`take_plain`) where it may, and pushing the
        /// rest, writes what `push` alone writes, piece by piece: a piece
        /// taken is exactly what `push` writes for it, and every later
        /// decision (a break after letters taken plain, a tag, an escape)
        /// is the same, as is the report. The net may keep more letters
        /// than `push` does (decided ones), never more than two windows.
        #[test]
        fn taking_plain_is_pushing(
            bytes in prop_oneof![markup(), spaced(), long(), plain_words()],
            cuts in prop::collection::vec(1usize..24, 1..12),
        ) {
            let take = |net: &mut Net, piece: &[u8]| {
                let took = net.take_plain(piece, &NET_ONLY);
                assert!(!took || net.pending.len() <= 2 * WINDOW, "take_plain kept {} bytes", net.pending.len());
                took
            };
            shortcut_is_pushing(&bytes, &cuts, take, |mixed, pushed| {
                prop_assert_eq!(mixed.held(), pushed.held());
                Ok(())
            })?;
        }

        /// `push_or_prefix` is `push`: its output (the prefix it names, or
        /// what it wrote) and the net after it are the same, and a prefix
        /// is named only when nothing was held before and nothing changed.
        /// Pieces up to 200 bytes reach past the window, where the run
        /// searches for special bytes.
        #[test]
        fn prefix_or_push_is_pushing(
            bytes in prop_oneof![markup(), spaced(), long()],
            cuts in prop::collection::vec(1usize..200, 1..8),
        ) {
            let (mut pushed, mut lazy) = (Net::default(), Net::default());
            let (mut out_pushed, mut out_lazy) = (Vec::new(), Vec::new());
            for piece in pieces(&bytes, &cuts) {
                let before = out_pushed.len();
                pushed.push(piece, &mut out_pushed);
                let held_before = !lazy.pending.is_empty();
                let mut written = Vec::new();
                match lazy.push_or_prefix(piece, &mut written) {
                    Some(n) => {
                        prop_assert!(!held_before && written.is_empty());
                        prop_assert_eq!(&out_pushed[before..], &piece[..n], "{:?}", String::from_utf8_lossy(&bytes));
                        out_lazy.extend_from_slice(&piece[..n]);
                    }
                    None => out_lazy.extend_from_slice(&written),
                }
                prop_assert_eq!(&lazy.pending, &pushed.pending);
                prop_assert_eq!(lazy.emitted, pushed.emitted);
                prop_assert_eq!(lazy.last, pushed.last);
                prop_assert_eq!(&out_lazy, &out_pushed);
            }
            pushed.finish(&mut out_pushed);
            lazy.finish(&mut out_lazy);
            prop_assert_eq!(out_lazy, out_pushed);
            prop_assert_eq!(lazy.report, pushed.report);
        }
    }

    /// Text that stops in the middle of a word that may start a pattern
    /// (`e` of `expression(`, `on` of `onclick=`) is written out at once;
    /// only a possible tag or character reference is held.
    #[test]
    fn possible_patterns_are_not_held() {
        for (input, held) in [("the ", 0), ("a ja", 0), ("onclick", 0), ("java\tscr", 0), ("a <b", 2), ("x &#10", 4)] {
            let mut n = Net::default();
            let mut out = Vec::new();
            n.push(input.as_bytes(), &mut out);
            assert_eq!(n.held(), held, "{input:?}");
            assert_eq!(out.len() + held, input.len(), "{input:?}");
        }
    }

    fn net(input: &str, chunk: usize) -> String {
        let mut n = Net::default();
        let mut out = Vec::new();
        for c in input.as_bytes().chunks(chunk.max(1)) {
            n.push(c, &mut out);
        }
        n.finish(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn cases() {
        let table: &[(&str, &str)] = &[
            ("plain text", "plain text"),
            ("<b>bold</b> <STRONG>x</STRONG><br/><br /><br>", "<b>bold</b> <STRONG>x</STRONG><br/><br /><br>"),
            ("<span style=\"color: red\">r</span>", "<span style=\"color: red\">r</span>"),
            ("<span style='color:red'>r</span>", "<span style='color:red'>r</span>"),
            ("<span style=\"background:url(x)\">r</span>", "&lt;span style=\"background:url&#8203;(x)\">r</span>"),
            ("<span onclick=\"x\">r</span>", "&lt;span onclick&#8203;=\"x\">r</span>"),
            ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror&#8203;=alert(1)>"),
            ("</script>", ""),
            ("a</div>b", "a&#8203;b"),
            ("a </p>b", "a b"),
            ("java</p>script:x", "java&#8203;script:x"),
            ("</user>", "&lt;/user>"),
            ("< IMG>", "&lt; IMG>"),
            ("a < b <3", "a &lt; b &lt;3"),
            ("javascript:alert(1)", "javascript&#8203;:alert(1)"),
            ("JaVaScRiPt:x", "JaVaScRiPt&#8203;:x"),
            ("java\tscript:x", "java\tscript&#8203;:x"),
            ("&#106;avascript&#58;x", "&#106;avascript&#8203;&#58;x"),
            ("&#x6A;avascript&colon;x", "&#x6A;avascript&#8203;&colon;x"),
            ("&#0000106avascript:x", "&#0000106avascript&#8203;:x"),
            ("vbscript:x livescript:y", "vbscript&#8203;:x livescript&#8203;:y"),
            ("width:expression(alert(1))", "width:expression&#8203;(alert(1))"),
            ("url(x) URL (y)", "url&#8203;(x) URL &#8203;(y)"),
            ("onload=x ONCLICK = y", "onload&#8203;=x ONCLICK &#8203;= y"),
            ("json=1 on= one two", "json=1 on= one two"),
            ("expressions everywhere, urls too", "expressions everywhere, urls too"),
            ("&amp; &lt; &", "&amp; &lt; &"),
            ("&lt;&lt;javascript:x&quot;onclick=y", "&lt;&lt;javascript&#8203;:x&quot;onclick&#8203;=y"),
            ("中文 javascript: 好", "中文 javascript&#8203;: 好"),
        ];
        for (input, want) in table {
            for chunk in [usize::MAX, 1, 2, 3, 7] {
                assert_eq!(&net(input, chunk), want, "{input:?} at chunk {chunk}");
            }
        }
    }

    /// The prose fast path skips positions far from a special byte: the
    /// longest matches the net knows (40-letter handler names, 16 ignorables,
    /// entities) still meet one within the window, at every distance from
    /// the start of a long buffer and at every chunking.
    #[test]
    fn long_prose_around_patterns_is_filtered_like_short_input() {
        let patterns: &[(&str, &str)] = &[
            ("javascript:", "javascript&#8203;:"),
            ("java\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\tscript:", "java\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\tscript&#8203;:"),
            ("jav&#x61;script&colon;", "jav&#x61;script&#8203;&colon;"),
            (
                "onabcdefghijabcdefghijabcdefghijabcdefghij\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t=",
                "onabcdefghijabcdefghijabcdefghijabcdefghij\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t&#8203;=",
            ),
            ("<xss>", "&lt;xss>"),
            ("url(", "url&#8203;("),
        ];
        let filler = "The keeper counted the steps in the dark ";
        for (pattern, want) in patterns {
            for before in [0, 1, 63, 64, 65, 127, 128, 129, 300] {
                let lead: String = filler.chars().cycle().take(before).collect();
                let input = format!("{lead}{pattern}{}", filler.repeat(5));
                let expected = format!("{lead}{want}{}", filler.repeat(5));
                for chunk in [usize::MAX, 1, 4, 61, 128, 200] {
                    assert_eq!(net(&input, chunk), expected, "{pattern:?} after {before} bytes at chunk {chunk}");
                }
            }
        }
    }

    #[test]
    fn unfinished_tag_is_escaped_at_the_end() {
        assert_eq!(net("a <b", 1), "a &lt;b");
        let long = format!("<span style=\"{}\">", "color: red;".repeat(60));
        assert!(net(&long, 5).starts_with("&lt;span"));
    }
}
