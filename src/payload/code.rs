//! Markdown code in content (private): the first and the last stage of
//! [`super::html::HtmlFilter`], one over its input and one over its
//! output.
//!
//! Content is Markdown with inline HTML (spec 003 §3.1.2), and Markdown
//! shows the text of a fenced code block or a code span as written: there
//! `<div>` is code to show, not markup to filter, and `&lt;` is seen as the
//! four characters `&lt;`. Left to the HTML filter alone,
//! `<div>{x}</div>` in a JSX block would lose its tags, `Vec<u8>` would
//! read `Vec&lt;u8>`, and `conn = db` would read `conn &#8203;= db` (the
//! net's break of `on<word>=`).
//!
//! * **Before the filter** ([`Side::Input`]), every `<` inside code is
//!   written as [`ESCAPE`] (`&#60;`, the same character as `&lt;`), so the
//!   filter reads no markup in code: it neither removes nor keeps tags
//!   there.
//! * **After the filter** ([`Side::Output`]), inside code, an [`ESCAPE`] is
//!   written back as `<` where it is inert as HTML, and the net's break
//!   before `=` or `(` (of `on<word>=`, `url(`, `expression(`, text in
//!   code) is dropped; with [`CodeMarkup::AsWritten`], every [`ESCAPE`]
//!   and every break in code but one that keeps the code's structure (a
//!   break before a backtick, or in a line's first bytes, where dropping
//!   it would join two runs of backticks or make a fence). Everywhere
//!   else an [`ESCAPE`] is written `&lt;` and the break stays, so output
//!   outside code is what the filter gave.
//!
//! A `<` is inert ([`inert`]) when it starts no tag (`a < b`, `<=`, `<3`,
//! `<'a>`), or starts a whole tag on one line that could do nothing but
//! show itself were it read as HTML: the tag of a harmless element (`<b>`,
//! `<div>`, `<P as Trait>`; not `<img>`, `<script>`, `<style>`, `<iframe>`,
//! `<textarea>`, `<details>` ...) or of a name that is no HTML element and
//! no custom element (`<u8>`, `<T: Clone>`, `<String, Vec<u8>>`), with no
//! attribute that acts (no `on*`, `href`, `src`, `style`, `hidden` ...;
//! values only on a few, such as `title` and `className`; not `class`,
//! `id` or `name`, through which a page's own styles and scripts would
//! reach the element). Should a
//! renderer read the block structure otherwise than these stages (an HTML
//! block around it, a list's indentation), such a `<` still runs nothing,
//! loads nothing and hides nothing; every other `<` stays escaped. The
//! break before `:` (`javascript:`) is never dropped: in text that a
//! renderer took for Markdown it would be a link's scheme.
//!
//! The filter's own escapes reach the output side as `&#60;` too; a
//! `&#60;` (or a break) the model wrote itself is read the same way. A `<`
//! of markup the filter kept outside code can land in code in the output,
//! since a removal can join, split or drop a fence line (`<!--x-->```` is
//! a fence once the comment is gone): the output side writes such a `<` as
//! it would an [`ESCAPE`], `<` where inert and `&lt;` where not.
//!
//! Fences are read by `scan::markdown::Fences`, as the state machine reads
//! them (where a registry tag in code is text), and as CommonMark writes
//! them: a line of at least three backticks or tildes, after spaces (any
//! number: fences in list items are indented), with an info string that
//! holds no backtick after backticks; the block ends at a line of at least
//! as many of the same character and nothing but white space after them,
//! or at the end of the content.
//!
//! Code spans are read on one line: a run of backticks opens one, the
//! next run as long closes it. What a span holds from its first mark on
//! is held until it closes, since only then is it code (at most
//! [`super::html::FilterLimits::max_code_span`] bytes; the end of the line
//! or of the content ends it as text). (CommonMark also lets a span cross
//! a line break inside a paragraph, and reads a run that finds no closer as
//! text and looks again after it; here such text is not code.)
//!
//! Both sides are incremental and split-invariant, and the output side
//! reads the output's lines and spans as the input side read the input's,
//! so that the filter's output is its own fixed point.

pub(crate) use super::net::ESCAPE;
use super::net::{BREAK, escape_run, is_html_element};
use crate::scan::markdown::{Fences, Line};
use crate::scan::{find_byte, find_byte2, find_byte3, is_space};
use memchr::memmem;

/// What the filter writes for markup inside Markdown code (fenced code
/// blocks and code spans), which a Markdown renderer shows as written.
/// Outside code the filter works the same either way.
///
/// ```
/// use spindle::payload::html::HtmlFilter;
/// use spindle::{CodeMarkup, FilterLimits};
///
/// let text = "Load it with `<script src=\"app.js\">`, not <script>alert(1)</script>.";
/// let inert = HtmlFilter::with_limits(FilterLimits::default()).push(text);
/// assert!(inert.starts_with("Load it with `&lt;script src=\"app.js\">`"));
/// let limits = FilterLimits { code_markup: CodeMarkup::AsWritten, ..FilterLimits::default() };
/// let mut filter = HtmlFilter::with_limits(limits);
/// let mut shown = filter.push(text);
/// shown.push_str(&filter.finish());
/// assert_eq!(shown, "Load it with `<script src=\"app.js\">`, not .");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodeMarkup {
    /// A `<` in code is written back where it is inert as HTML (`<div>`,
    /// `Vec<u8>`, `<T: Clone>`) and stays `&lt;` elsewhere (`<script>`,
    /// `<img src=x>`, `<div class="x">`); the net's break stays before `:`
    /// (`javascript:`). Safe also where the text reaches a page without a
    /// Markdown renderer, or one that reads the block otherwise. The
    /// default.
    #[default]
    Inert,
    /// Every `<` in code is written back and every break of the net in
    /// code is dropped: code reads exactly as the model wrote it (but a
    /// break that keeps two runs of backticks apart, or a line from
    /// reading as a fence, where the filter removed markup). For a
    /// front end that renders the content with a CommonMark renderer, which
    /// shows code as text. Where the content may reach a page as HTML
    /// without one, markup in code is live: do not use it there.
    AsWritten,
}

/// Longest tag that may be inert, from its `<` to its `>`.
const MAX_TAG: usize = 256;

/// HTML elements whose tags do nothing but show their content: inert in
/// code, with the attributes [`attribute_is_inert`] allows. Sorted.
const HARMLESS: &[&str] = &[
    "a",
    "abbr",
    "acronym",
    "address",
    "article",
    "aside",
    "b",
    "bdi",
    "bdo",
    "big",
    "blockquote",
    "br",
    "caption",
    "center",
    "cite",
    "code",
    "col",
    "colgroup",
    "dd",
    "del",
    "dfn",
    "div",
    "dl",
    "dt",
    "em",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "hr",
    "i",
    "ins",
    "kbd",
    "label",
    "li",
    "main",
    "mark",
    "nav",
    "ol",
    "p",
    "pre",
    "q",
    "rb",
    "rp",
    "rt",
    "rtc",
    "ruby",
    "s",
    "samp",
    "section",
    "small",
    "span",
    "strike",
    "strong",
    "sub",
    "sup",
    "table",
    "tbody",
    "td",
    "tfoot",
    "th",
    "thead",
    "time",
    "tr",
    "tt",
    "u",
    "ul",
    "var",
    "wbr",
];

/// Attributes that may have a value in an inert tag: they change nothing
/// but text a reader may see. Sorted.
const VALUED: &[&str] = &[
    "align",
    "alt",
    "classname",
    "colspan",
    "datetime",
    "dir",
    "for",
    "height",
    "htmlfor",
    "key",
    "label",
    "lang",
    "ref",
    "role",
    "rowspan",
    "title",
    "type",
    "value",
    "width",
];

/// Attributes that act even bare (hide, focus, load, run): never in an
/// inert tag. Sorted. (`on*` too, and any value not in [`VALUED`].)
const ACTING: &[&str] = &[
    "action",
    "autofocus",
    "background",
    "content",
    "contenteditable",
    "data",
    "formaction",
    "hidden",
    "href",
    "http-equiv",
    "inert",
    "is",
    "popover",
    "popovertarget",
    "poster",
    "slot",
    "src",
    "srcdoc",
    "srcset",
    "style",
    "xlink:href",
];

/// Beginnings of attribute names that are never inert (`on*`, and names
/// that merely begin like an acting one: `style)`, `href<x`,
/// `action-item`), which a reader that recovers from a malformed tag
/// otherwise than the HTML tokenizer could take for the acting attribute.
const ACTING_PREFIXES: &[&str] = &["action", "data", "formaction", "hidden", "href", "on", "src", "style"];

/// URL schemes that run or load what follows them: a name that begins
/// with one (`<data:...>`) could be a Markdown autolink.
const SCHEMES: &[&str] = &["data:", "javascript:", "livescript:", "vbscript:"];

/// The bytes either side reads (line breaks, backticks, and both
/// triggers).
static READ: [bool; 256] = {
    let mut table = [false; 256];
    table[b'\n' as usize] = true;
    table[b'`' as usize] = true;
    table[b'<' as usize] = true;
    table[b'&' as usize] = true;
    table
};

/// Whether `bytes`, a short text (a streamed delta), holds no byte that
/// either side reads: one look at each byte for both sides, where a
/// [`CodeBlocks::is_quiet`] stage would leave it as it is. `false` for a
/// longer text, which the sides' own searches skip faster.
#[inline]
pub(crate) fn reads_nothing(bytes: &[u8]) -> bool {
    bytes.len() < 16 && !bytes.iter().any(|&b| READ[usize::from(b)])
}

/// Which side of the filter a stage works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// Before the filter, over the raw content: a `<` in code becomes
    /// [`ESCAPE`].
    Input,
    /// After the filter, over its output: an [`ESCAPE`] in code becomes
    /// `<` where inert, a [`BREAK`] before `=` or `(` in code is dropped;
    /// an [`ESCAPE`] elsewhere becomes `&lt;`.
    Output,
}

impl Side {
    /// The byte every mark of this side begins with.
    fn trigger(self) -> u8 {
        match self {
            Side::Input => b'<',
            Side::Output => b'&',
        }
    }
}

/// What a stage reads and writes differently in code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// A `<` (on the input side), or its [`ESCAPE`] (on the output side),
    /// `inert` or not (always `true` on the input side, which does not
    /// judge).
    Lt { inert: bool },
    /// The net's [`BREAK`] before `=` or `(` (output side only).
    Break,
    /// A `<` of markup the filter kept (output side only, `inert` or not):
    /// kept outside code, where the input side read it, but in code as the
    /// output's own fences and spans fall (a removal can join, split or
    /// drop a fence line: `<!--x-->```` is a fence once the comment is
    /// gone). Written there as an [`ESCAPE`] would be, so that the output
    /// stays the filter's fixed point.
    KeptLt { inert: bool },
}

impl Mark {
    /// The text of the mark as read.
    fn read(self, side: Side) -> &'static str {
        match (self, side) {
            (Mark::Lt { .. }, Side::Input) => "<",
            (Mark::Lt { .. }, Side::Output) => ESCAPE,
            (Mark::Break, _) => BREAK,
            (Mark::KeptLt { .. }, _) => "<",
        }
    }

    /// Writes the mark, `in_code` or not.
    fn write(self, side: Side, in_code: bool, out: &mut String) {
        out.push_str(self.written(side, in_code));
    }

    /// What the mark is written as, `in_code` or not.
    #[inline]
    const fn written(self, side: Side, in_code: bool) -> &'static str {
        match (self, side, in_code) {
            (Mark::Lt { .. }, Side::Input, true) => ESCAPE,
            (Mark::Lt { .. }, Side::Input, false) => "<",
            (Mark::Lt { inert: true }, Side::Output, true) => "<",
            (Mark::Lt { .. }, Side::Output, _) => "&lt;",
            (Mark::Break, _, true) => "",
            (Mark::Break, _, false) => BREAK,
            (Mark::KeptLt { inert: false }, _, true) => "&lt;",
            (Mark::KeptLt { .. }, _, _) => "<",
        }
    }
}

/// What a `<` outside code is written as on the output side.
const OUTSIDE_LT: &str = Mark::Lt { inert: false }.written(Side::Output, false);

/// [`OUTSIDE_LT`] sixty-four times, as one `str`: a run of escapes
/// outside code (a flood of `<`) is written a block at a time, not a
/// `push_str` per `<`.
const OUTSIDE_LTS: &str = {
    const BYTES: [u8; 64 * OUTSIDE_LT.len()] = super::net::repeated(OUTSIDE_LT.as_bytes());
    match std::str::from_utf8(&BYTES) {
        Ok(s) => s,
        Err(_) => panic!("an ASCII escape repeated is UTF-8"),
    }
};

/// Writes `run` [`OUTSIDE_LT`]s to `out`.
fn write_outside_lts(run: usize, out: &mut String) {
    out.reserve(run * OUTSIDE_LT.len());
    let mut left = run;
    while left >= 64 {
        out.push_str(OUTSIDE_LTS);
        left -= 64;
    }
    out.push_str(&OUTSIDE_LTS[..left * OUTSIDE_LT.len()]);
}

/// What the text at a trigger byte is.
enum Read {
    /// A mark of this many bytes.
    Mark(Mark, usize),
    /// Not yet known: the rest of the text is too short to tell.
    Wait,
    /// Ordinary text.
    Text,
}

/// A code span on the current line (outside fenced blocks).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Span {
    /// None is open.
    Closed,
    /// A run of this many backticks opened one; nothing is held.
    Open(u32),
    /// One is open and holds a mark: the text from the first mark on is
    /// held, with where each mark is in it, until the span closes (or the
    /// line ends, and it was none).
    Holding { ticks: u32, held: String, marks: Vec<(usize, Mark)> },
}

/// A code stage (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CodeBlocks {
    side: Side,
    /// What a mark in code is written as (output side).
    markup: CodeMarkup,
    /// The fenced block the text is in, and the current line.
    fences: Fences,
    /// Backticks in the run being read (outside fenced blocks), up to
    /// `u32::MAX`.
    ticks: u32,
    span: Span,
    /// Text held back: a mark's start and the bytes after it, while they
    /// do not yet show what it is.
    lookahead: String,
    /// Most text held for one code span, waiting for its closing
    /// backticks ([`super::html::FilterLimits::max_code_span`]); past it
    /// the span is taken for text.
    max_span: usize,
    /// Spans taken for text at that limit.
    long_spans: usize,
    /// The net's breaks dropped in code.
    dropped_breaks: usize,
}

/// Whether a `<` followed by `after` is inert as HTML (see the module
/// docs): `Some(true)` when it starts no tag or an inert one, `Some(false)`
/// when it may start markup that acts, `None` when `after` is too short to
/// tell (at the `end` of the content it always tells). A `<` that ends the
/// content is not written back: the filter gives one there as `&lt;` (its
/// last pass escapes it), and the output must read the same when filtered
/// again.
fn inert(after: &[u8], end: bool) -> Option<bool> {
    let Some(&first) = after.first() else { return end.then_some(false) };
    // Told by the first byte: no line to read (a run of `<` costs one
    // look each).
    match first {
        b'?' => return Some(false),
        b'!' | b'/' => {}
        _ if first.is_ascii_alphabetic() => {}
        _ => return Some(true),
    }
    // What is read: the rest of the line, within MAX_TAG bytes. It waits
    // for more text only while neither has ended.
    let window = &after[..after.len().min(MAX_TAG)];
    let line_end = memchr::memchr(b'\n', window);
    let line = &window[..line_end.unwrap_or(window.len())];
    let wait = !end && after.len() < MAX_TAG && line_end.is_none();
    if first == b'!' {
        if !b"!--".starts_with(&line[..line.len().min(3)]) {
            return Some(false);
        }
        // A comment ended on its line: read as HTML, it hides only
        // itself.
        if line.len() >= 3 && memmem::find(&line[3..], b"-->").is_some() {
            return Some(true);
        }
        return if wait { None } else { Some(false) };
    }
    // Read as the HTML tokenizer reads a tag, on its line.
    match read_tag(line) {
        None if wait => None,
        None => Some(false),
        Some(inert) => Some(inert),
    }
}

/// Whether the tag in `tag` (the text after its `<`, up to the end of its
/// line at most) is inert: `None` when `tag` ends before the tag does.
fn read_tag(tag: &[u8]) -> Option<bool> {
    let end_tag = tag.first() == Some(&b'/');
    let name_at = usize::from(end_tag);
    if !tag.get(name_at)?.is_ascii_alphabetic() {
        // `</3`, `</>`: a bogus comment or nothing, not a tag.
        return Some(false);
    }
    let name_len = tag[name_at..].iter().position(|&b| is_space(b) || b == b'/' || b == b'>')?;
    let name = &tag[name_at..name_at + name_len];
    if !name_is_inert(name) {
        return Some(false);
    }
    let mut i = name_at + name_len;
    loop {
        let b = *tag.get(i)?;
        match b {
            b'\r' => return Some(false),
            _ if is_space(b) => i += 1,
            b'>' => return Some(true),
            b'/' if end_tag => return Some(false),
            // `/>`, or a stray `/` the tokenizer skips.
            b'/' => i += 1,
            // An end tag's attributes are errors a checker may read
            // otherwise: none is inert.
            _ if end_tag => return Some(false),
            _ => {
                let len = tag[i..].iter().position(|&b| is_space(b) || b == b'/' || b == b'>' || b == b'=')?;
                if len == 0 {
                    // `=` where a name starts.
                    return Some(false);
                }
                let attr = &tag[i..i + len];
                i += len;
                while is_space(*tag.get(i)?) {
                    i += 1;
                }
                let valued = tag[i] == b'=';
                if !attribute_is_inert(attr, valued) {
                    return Some(false);
                }
                if valued {
                    i += 1;
                    while is_space(*tag.get(i)?) {
                        i += 1;
                    }
                    i += match tag.get(i)? {
                        &q @ (b'"' | b'\'') => 2 + tag[i + 1..].iter().position(|&b| b == q)?,
                        _ => tag[i..].iter().position(|&b| is_space(b) || b == b'>')?,
                    };
                }
            }
        }
    }
}

/// Whether a tag of this name may be inert: a harmless HTML element, or a
/// name that is none (nor a custom element, nor one that begins like
/// `script` or `iframe`, which a check by substring would take for them,
/// nor one that begins with a scheme that runs what follows, which could
/// be a Markdown autolink), with no break of the net in it.
fn name_is_inert(name: &[u8]) -> bool {
    let lower = name.to_ascii_lowercase();
    if is_html_element(&lower) {
        return std::str::from_utf8(&lower).is_ok_and(|n| HARMLESS.binary_search(&n).is_ok());
    }
    !lower.contains(&b'-')
        && !lower.starts_with(b"script")
        && !lower.starts_with(b"iframe")
        && !SCHEMES.iter().any(|s| lower.starts_with(s.as_bytes()))
        && memmem::find(&lower, BREAK.as_bytes()).is_none()
}

/// Whether an attribute of this name (`valued` or bare) may be in an
/// inert tag. A name with `"` or `'` in it (`<n style">`) is a parse
/// error the HTML tokenizer reads into the name (`style"`, which does
/// nothing), but a reader that recovers otherwise may see `style`: never
/// inert.
fn attribute_is_inert(name: &[u8], valued: bool) -> bool {
    if name.iter().any(|b| matches!(b, b'"' | b'\'')) {
        return false;
    }
    let lower = name.to_ascii_lowercase();
    let Ok(lower) = std::str::from_utf8(&lower) else { return false };
    if ACTING_PREFIXES.iter().any(|p| lower.starts_with(p))
        || lower.contains(BREAK)
        || ACTING.binary_search(&lower).is_ok()
    {
        return false;
    }
    !valued || VALUED.binary_search(&lower).is_ok()
}

impl CodeBlocks {
    /// A stage on `side` at the start of the content, holding at most
    /// `max_span` bytes of one code span.
    pub(crate) fn new(side: Side, max_span: usize, markup: CodeMarkup) -> CodeBlocks {
        CodeBlocks {
            side,
            markup,
            fences: Fences::default(),
            ticks: 0,
            span: Span::Closed,
            lookahead: String::new(),
            max_span,
            long_spans: 0,
            dropped_breaks: 0,
        }
    }

    /// Code spans taken for text because they held more than the limit.
    pub(crate) fn long_spans(&self) -> usize {
        self.long_spans
    }

    /// The net's breaks dropped in code (each the net counted as a
    /// pattern neutralised).
    pub(crate) fn dropped_breaks(&self) -> usize {
        self.dropped_breaks
    }

    /// Writes `mark`, `in_code` or not, counting the breaks dropped.
    fn write_mark(&mut self, mark: Mark, in_code: bool, out: &mut String) {
        if in_code && mark == Mark::Break {
            self.dropped_breaks += 1;
        }
        mark.write(self.side, in_code, out);
    }

    /// Passes the next piece of text through the stage: `text` becomes
    /// what is certain so far. At the `end` of the content nothing stays
    /// held.
    #[inline]
    pub(crate) fn push(&mut self, text: &mut String, end: bool) {
        // The common delta, inside an ordinary line with nothing this
        // stage reads: decided here, without a call.
        if self.is_quiet() && self.find_with(b'\n', b'`', text.as_bytes()).is_none() {
            return;
        }
        self.push_any(text, end);
    }

    /// Inside an ordinary line, with nothing held or pending: text that
    /// holds no byte of [`reads_nothing`] passes unread and unchanged.
    #[inline]
    pub(crate) fn is_quiet(&self) -> bool {
        self.fences.line == Line::Rest
            && self.ticks == 0
            && self.lookahead.is_empty()
            && !matches!(self.span, Span::Holding { .. })
    }

    /// Whether a mark would be written here as it is read: on the input
    /// side, outside code (no fenced block, no span open), a `<` stays.
    fn marks_stay(&self) -> bool {
        self.side == Side::Input && self.fences.open.is_none() && self.span == Span::Closed
    }

    /// The first of `a`, `b` and the trigger byte in `bytes`, the trigger
    /// left out where marks stay as they are, and a kept `<` added where
    /// it is read ([`CodeBlocks::reads_kept`]).
    fn find_with(&self, a: u8, b: u8, bytes: &[u8]) -> Option<usize> {
        if self.marks_stay() {
            return find_byte2(a, b, bytes);
        }
        let first = find_byte3(a, b, self.side.trigger(), bytes);
        if !self.reads_kept() {
            return first;
        }
        // Four bytes, two searches: only in code on the output side.
        find_byte(b'<', &bytes[..first.unwrap_or(bytes.len())]).or(first)
    }

    /// Whether this side reads the `<` of markup the filter kept
    /// ([`Mark::KeptLt`]) anywhere: on the output side, unless code is
    /// shown as written (where every `<` in code is written as it is).
    fn kept_lts(&self) -> bool {
        self.side == Side::Output && self.markup == CodeMarkup::Inert
    }

    /// Whether a kept `<` read now is read as a mark: where
    /// [`CodeBlocks::kept_lts`], and where it may turn out to be in code.
    fn reads_kept(&self) -> bool {
        self.kept_lts() && self.may_be_code()
    }

    /// [`CodeBlocks::push`] past its common case.
    fn push_any(&mut self, text: &mut String, end: bool) {
        let trigger = self.side.trigger();
        let holds = !self.lookahead.is_empty() || matches!(self.span, Span::Holding { .. });
        let bytes = text.as_bytes();
        // (Text with no backtick and no line break opens no span and no
        // fence: where marks stay, their search is left out.)
        if !holds && self.ticks == 0 && self.find_with(b'\n', b'`', bytes).is_none() {
            // The common delta, within a line: nothing this stage reads,
            // but a line's first bytes.
            match self.fences.line {
                Line::Rest => return,
                Line::Start => match bytes.iter().position(|&b| b != b' ' && b != b'\t') {
                    None => return,
                    Some(at) if bytes[at] != b'~' => {
                        self.fences.line = Line::Rest;
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
            let plain_line = self.ticks == 0 && matches!(self.fences.line, Line::Start | Line::Rest);
            if plain_line && self.find_with(b'`', b'~', bytes).is_none() {
                self.follow_plain(bytes);
                return;
            }
            let unread = if self.kept_lts() { find_byte2(trigger, b'<', bytes) } else { find_byte(trigger, bytes) };
            if unread.is_none() {
                self.run(text, None, false);
                return;
            }
        }
        // Held text goes first; with none held, the text is read where it
        // is (not copied: a long element's text is read once at its end).
        let mut held = std::mem::take(&mut self.lookahead);
        let input = if held.is_empty() {
            std::mem::take(text)
        } else {
            held.push_str(text);
            held
        };
        let mut out = String::with_capacity(input.len() + 8);
        self.run(&input, Some(&mut out), end);
        if end {
            self.end_ticks(&mut out);
            self.end_span(&mut out, false);
        }
        *text = out;
    }

    /// Whether a mark read now may turn out to be in code: inside a fenced
    /// block, inside a span, or after a run of backticks that may open one
    /// (the run ends at the mark).
    fn may_be_code(&self) -> bool {
        self.fences.open.is_some() || self.ticks > 0 || self.span != Span::Closed
    }

    /// What the text `rest`, which begins with the trigger byte (or a
    /// `<` where [`CodeBlocks::reads_kept`]), is.
    fn read(&self, rest: &str, end: bool) -> Read {
        if self.side == Side::Input {
            return Read::Mark(Mark::Lt { inert: true }, 1);
        }
        if let Some(after) = rest.strip_prefix('<') {
            return match inert(after.as_bytes(), end) {
                Some(inert) => Read::Mark(Mark::KeptLt { inert }, 1),
                None => Read::Wait,
            };
        }
        if let Some(after) = rest.strip_prefix(ESCAPE) {
            // As written, every `<` is written back but one that ends the
            // content, which `inert` judges alike for both.
            if self.markup == CodeMarkup::AsWritten && !after.is_empty() {
                return Read::Mark(Mark::Lt { inert: true }, ESCAPE.len());
            }
            return match inert(after.as_bytes(), end) {
                Some(inert) => Read::Mark(Mark::Lt { inert }, ESCAPE.len()),
                None => Read::Wait,
            };
        }
        if let Some(after) = rest.strip_prefix(BREAK) {
            if self.markup == CodeMarkup::AsWritten {
                // Every break but one that keeps the code's structure: one
                // before a backtick keeps two runs apart (`` `&#8203;`` ``
                // is a span, ```` ``` ```` a run that opens one), and one in a
                // line's first bytes keeps them from reading as a fence.
                return match after.as_bytes().first() {
                    None if !end => Read::Wait,
                    Some(b'`') => Read::Text,
                    _ if self.fences.line != Line::Rest => Read::Text,
                    _ => Read::Mark(Mark::Break, BREAK.len()),
                };
            }
            return match after.as_bytes().first() {
                Some(b'=' | b'(') => Read::Mark(Mark::Break, BREAK.len()),
                None if !end => Read::Wait,
                _ => Read::Text,
            };
        }
        if !end && rest.len() < BREAK.len() && (ESCAPE.starts_with(rest) || BREAK.starts_with(rest)) {
            return Read::Wait;
        }
        Read::Text
    }

    /// Reads `input`, writing to `out` (`None`: it holds no mark and
    /// nothing is held, so the output is the input and only the states
    /// move). Input is written a stretch at a time: up to where the
    /// target (the output, or a span's hold) may change. Every place it
    /// cuts `input` at is an ASCII byte's, or a whole character's end.
    fn run(&mut self, input: &str, mut out: Option<&mut String>, end: bool) {
        let trigger = self.side.trigger();
        let bytes = input.as_bytes();
        // `input[from..i]` is read but not written yet.
        let mut from = 0;
        let mut i = 0;
        while i < bytes.len() {
            if self.fences.line == Line::Rest && self.ticks == 0 {
                // Ordinary text up to the next byte that matters. Outside
                // code a `<` of the input is written as it is: only lines
                // and backticks matter there.
                i = self.find_with(b'\n', b'`', &bytes[i..]).map_or(bytes.len(), |at| i + at);
                if i == bytes.len() {
                    break;
                }
            }
            let b = bytes[i];
            if b == trigger
                && self.side == Side::Output
                && !self.may_be_code()
                && let Some(out) = out.as_deref_mut()
            {
                // Outside code, with no span about to open, a `<` is written
                // as outside code whatever follows it: not read (`read`
                // reads the escapes that may be in code). A run of them (a
                // flood of `<`) is written in one go.
                let run = escape_run(&bytes[i..]);
                if run > 0 {
                    self.emit(&input[from..i], out);
                    write_outside_lts(run, out);
                    self.fences.line_byte(b'<');
                    i += run * ESCAPE.len();
                    from = i;
                    continue;
                }
            }
            if (b == trigger || b == b'<' && self.reads_kept())
                && let Some(out) = out.as_deref_mut()
            {
                let rest = &input[i..];
                match self.read(rest, end) {
                    Read::Wait => {
                        self.emit(&input[from..i], out);
                        self.lookahead.push_str(rest);
                        return;
                    }
                    Read::Mark(mark, len) => {
                        self.emit(&input[from..i], out);
                        self.end_ticks(out);
                        // Not a fence's byte: the line is ordinary from
                        // here.
                        self.fences.line_byte(b'<');
                        self.mark(mark, out);
                        i += len;
                        from = i;
                        continue;
                    }
                    Read::Text => {}
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
            } else if self.fences.open.is_none() {
                self.ticks = self.ticks.saturating_add(1);
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
                self.fences.end_line();
            } else {
                self.fences.line_byte(b);
            }
            // The whole character that `b` starts.
            i += input[i..].chars().next().map_or(1, char::len_utf8);
        }
        if let Some(out) = out {
            self.emit(&input[from..], out);
        }
    }

    /// Follows text with no backtick, tilde or trigger byte, from a line
    /// that is no fence's and with no run of backticks being read: it can
    /// open or close no fence and no span, only end lines (and with them
    /// an open span) and begin the last one. Two searches where
    /// [`CodeBlocks::run`] would stop at each line.
    fn follow_plain(&mut self, bytes: &[u8]) {
        let last =
            if bytes.len() < 16 { bytes.iter().rposition(|&b| b == b'\n') } else { memchr::memrchr(b'\n', bytes) };
        let tail = match last {
            Some(at) => {
                self.span = Span::Closed;
                self.fences.line = Line::Start;
                &bytes[at + 1..]
            }
            None => bytes,
        };
        if self.fences.line == Line::Start && !tail.iter().all(|&b| b == b' ' || b == b'\t') {
            self.fences.line = Line::Rest;
        }
    }

    /// Writes text: into a code span's hold while one holds.
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

    /// A mark: written at once in a fenced block or outside a span, held
    /// in an open span.
    fn mark(&mut self, mark: Mark, out: &mut String) {
        let side = self.side;
        match &mut self.span {
            _ if self.fences.open.is_some() => self.write_mark(mark, true, out),
            Span::Closed => self.write_mark(mark, false, out),
            Span::Open(ticks) => {
                let ticks = *ticks;
                self.span = Span::Holding { ticks, held: mark.read(side).to_string(), marks: vec![(0, mark)] };
            }
            Span::Holding { held, marks, .. } => {
                marks.push((held.len(), mark));
                held.push_str(mark.read(side));
            }
        }
    }

    /// A run of backticks ended (the byte after it is not one): it opens a
    /// span when none is open, closes the open one when as long.
    fn end_ticks(&mut self, out: &mut String) {
        let ticks = std::mem::take(&mut self.ticks);
        if ticks == 0 || !self.fences.reads_spans() {
            return;
        }
        match &self.span {
            Span::Closed => self.span = Span::Open(ticks),
            Span::Open(n) | Span::Holding { ticks: n, .. } if *n == ticks => self.end_span(out, true),
            _ => {}
        }
    }

    /// Ends the open span, if any: its held text is written, its marks as
    /// in code if it was `closed` (a span), as outside it if not.
    fn end_span(&mut self, out: &mut String, closed: bool) {
        if let Span::Holding { held, marks, .. } = std::mem::replace(&mut self.span, Span::Closed) {
            let mut from = 0;
            for (at, mark) in marks {
                out.push_str(&held[from..at]);
                self.write_mark(mark, closed, out);
                from = at + mark.read(self.side).len();
            }
            out.push_str(&held[from..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn through(pieces: &[&str]) -> String {
        through_side(Side::Output, pieces)
    }

    fn through_side(side: Side, pieces: &[&str]) -> String {
        through_with(side, CodeMarkup::Inert, pieces)
    }

    fn through_with(side: Side, markup: CodeMarkup, pieces: &[&str]) -> String {
        let mut stage = CodeBlocks::new(side, 4096, markup);
        let mut out = String::new();
        for (n, piece) in pieces.iter().enumerate() {
            let mut text = piece.to_string();
            stage.push(&mut text, n + 1 == pieces.len());
            out.push_str(&text);
        }
        out
    }

    /// `CodeMarkup::AsWritten`: in code every escape is `<` again and
    /// every break is dropped, at every cut; outside code nothing changes.
    #[test]
    fn as_written_code_reads_as_the_model_wrote_it() {
        let cases: &[(&str, &str)] = &[
            (
                "```\n&#60;script src=x>&#60;/script> &#60;img src=x onerror&#8203;=y> javascript&#8203;:x\n```\n",
                "```\n<script src=x></script> <img src=x onerror=y> javascript:x\n```\n",
            ),
            ("`&#60;div class=\"x\">` &#60;div> javascript&#8203;:", "`<div class=\"x\">` &lt;div> javascript&#8203;:"),
            // A `<` that ends the content stays escaped, as in `Inert`.
            ("```\n&#60;", "```\n&lt;"),
            // A break that keeps two runs of backticks apart, or a line
            // from reading as a fence, stays.
            ("`&#8203;``&#60;`", "`&#8203;``<`"),
            ("```\n&#8203;```\n  &#8203;~~~ x&#8203;=y\n```\n", "```\n&#8203;```\n  &#8203;~~~ x=y\n```\n"),
        ];
        for (input, want) in cases {
            for cut in 0..=input.len() {
                if !input.is_char_boundary(cut) {
                    continue;
                }
                let got = through_with(Side::Output, CodeMarkup::AsWritten, &[&input[..cut], &input[cut..]]);
                assert_eq!(&got, want, "{input:?} cut at {cut}");
            }
        }
    }

    /// A `<` the filter kept outside code that lands in the output's code
    /// (a removal made a fence) is written as an escape would be, at every
    /// cut; outside code, and with `AsWritten`, it stays as it is.
    #[test]
    fn a_kept_lt_in_the_outputs_code_is_written_as_an_escape() {
        let cases: &[(CodeMarkup, &str, &str)] = &[
            (
                CodeMarkup::Inert,
                "```\n<span style=\"color:b\"> <b>x</b> a < b\n```\n<i>",
                "```\n&lt;span style=\"color:b\"> <b>x</b> a < b\n```\n<i>",
            ),
            (CodeMarkup::Inert, "`<img src=x>` <img src=x>", "`&lt;img src=x>` <img src=x>"),
            (CodeMarkup::Inert, "<span style=\"color:b\">", "<span style=\"color:b\">"),
            (CodeMarkup::AsWritten, "```\n<span style=\"color:b\">", "```\n<span style=\"color:b\">"),
        ];
        for (markup, input, want) in cases {
            for cut in 0..=input.len() {
                let got = through_with(Side::Output, *markup, &[&input[..cut], &input[cut..]]);
                assert_eq!(&got, want, "{input:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn a_long_tag_is_not_inert() {
        let long = format!("```\n&#60;div title=\"{}\">", "x".repeat(MAX_TAG));
        assert_eq!(through(&[&long]), long.replace("&#60;", "&lt;"));
        let short = format!("```\n&#60;div title=\"{}\">", "x".repeat(MAX_TAG - 20));
        assert_eq!(through(&[&short[..30], &short[30..]]), short.replace("&#60;", "<"));
    }

    #[test]
    fn the_lists_are_sorted() {
        for list in [HARMLESS, VALUED, ACTING] {
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{list:?}");
        }
        // Every harmless name is an HTML element (else the list is not
        // read for it).
        for name in HARMLESS {
            assert!(is_html_element(name.as_bytes()), "{name}");
        }
    }

    /// The input side: `<` in code becomes the escape, and only there.
    #[test]
    fn the_input_side_escapes_every_lt_in_code() {
        let cases: &[(&str, &str)] = &[
            ("```\n<div>\n```\n<div> `a<b` `x<y\n", "```\n&#60;div>\n```\n<div> `a&#60;b` `x<y\n"),
            ("~~~\n<<3 &#60;\n", "~~~\n&#60;&#60;3 &#60;\n"),
            ("``a ` <b>`` <b> `<i>", "``a ` &#60;b>`` <b> `<i>"),
        ];
        for (input, want) in cases {
            for cut in 0..=input.len() {
                if !input.is_char_boundary(cut) {
                    continue;
                }
                let mut stage = CodeBlocks::new(Side::Input, 4096, CodeMarkup::Inert);
                let mut out = String::new();
                for (piece, end) in [(&input[..cut], false), (&input[cut..], true)] {
                    let mut text = piece.to_string();
                    stage.push(&mut text, end);
                    out.push_str(&text);
                }
                assert_eq!(&out, want, "{input} cut at {cut}");
            }
        }
    }

    #[test]
    fn escapes_in_fenced_code_are_written_back_where_inert() {
        let cases: &[(&str, &str)] = &[
            ("a &#60; b", "a &lt; b"),
            ("```\na &#60; b\n```\na &#60; b", "```\na < b\n```\na &lt; b"),
            (
                "```rust\nVec&#60;u8> x; &#60;/T> &#60;b> &#60;div> &#60;!-- &#60;x y>\n```",
                "```rust\nVec<u8> x; </T> <b> <div> &lt;!-- <x y>\n```",
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
                "`<b>` `&lt;!--` `<x>` `<a_b/>` `&lt;x-y>` `<x/ >`",
            ),
            ("`unclosed &#60;3", "`unclosed &lt;3"),
            // A comment ended on its line hides only itself.
            ("`&#60;!-- c -->` `&#60;!-->` `&#60;!x>` `&#60;!-- c`", "`<!-- c -->` `&lt;!-->` `&lt;!x>` `&lt;!-- c`"),
            ("```\n&#60;!-- c\n-->", "```\n&lt;!-- c\n-->"),
            // Tags that act, or may, stay escaped; harmless ones do not.
            (
                "```\n&#60;img src=x> &#60;a href=x>y&#60;/a> &#60;p hidden> &#60;b onclick> &#60;b\tOnClick=x>",
                "```\n&lt;img src=x> &lt;a href=x>y</a> &lt;p hidden> &lt;b onclick> &lt;b\tOnClick=x>",
            ),
            (
                "```\n&#60;div title=\"a > b\" dir=rtl> &#60;div class=x> &#60;Header key='k' /> &#60;/div x> &#60;/3",
                "```\n<div title=\"a > b\" dir=rtl> &lt;div class=x> <Header key='k' /> &lt;/div x> &lt;/3",
            ),
            (
                "`HashMap&#60;String, Vec&#60;u8>>` `&#60;T: Clone>` `&#60;P as Trait>` `&#60;data:x>` `&#60;javascript&#8203;:x>`",
                "`HashMap<String, Vec<u8>>` `<T: Clone>` `<P as Trait>` `&lt;data:x>` `&lt;javascript&#8203;:x>`",
            ),
            (
                "`&#60;x-y>` `&#60;scripts>` `&#60;textarea>` `&#60;style>` `&#60;details>`",
                "`&lt;x-y>` `&lt;scripts>` `&lt;textarea>` `&lt;style>` `&lt;details>`",
            ),
            // A tag must end on its line, within MAX_TAG bytes.
            ("```\n&#60;div\ntitle=x> &#60;div title=\"x\ny\">", "```\n&lt;div\ntitle=x> &lt;div title=\"x\ny\">"),
            ("```\n&#60;div title=\"x", "```\n&lt;div title=\"x"),
            ("```\n&#60;b x\n> &#60;b x=\n1>", "```\n&lt;b x\n> &lt;b x=\n1>"),
            // An attribute name the tokenizer reads with a parse error.
            ("```\n&#60;n style\"> &#60;n x'y> &#60;n title=\"t\">", "```\n&lt;n style\"> &lt;n x'y> <n title=\"t\">"),
            // A name that begins like an acting one.
            (
                "```\n&#60;y style)> &#60;a href&#60;x> &#60;e corpora/action-x> &#60;p data-k> &#60;p lang>",
                "```\n&lt;y style)> &lt;a href<x> &lt;e corpora/action-x> &lt;p data-k> <p lang>",
            ),
            // The net's breaks before `=` and `(` are dropped in code, not
            // the one before `:`, and none outside code.
            (
                "```\nconn &#8203;= db; url&#8203;(x) javascript&#8203;:x &#8203;a &#8203;\n```\nconn &#8203;= db",
                "```\nconn = db; url(x) javascript&#8203;:x &#8203;a &#8203;\n```\nconn &#8203;= db",
            ),
            ("`conn &#8203;= db` and conn &#8203;= db `x &#8203;= y", "`conn = db` and conn &#8203;= db `x &#8203;= y"),
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
                Just("&#8203;"), Just("="), Just("("), Just("div"), Just(" title=\"t\""), Just("'"), Just(">"),
            ], 0..24),
            input_side in any::<bool>(),
            as_written in any::<bool>(),
            cuts in proptest::collection::vec(0usize..64, 0..6),
        ) {
            let side = if input_side { Side::Input } else { Side::Output };
            let markup = if as_written { CodeMarkup::AsWritten } else { CodeMarkup::Inert };
            let text = parts.concat();
            let whole = through_with(side, markup, &[&text]);
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
            prop_assert_eq!(through_with(side, markup, &pieces), whole);
        }
    }
}
