//! The incremental tokenizer: bytes in, text runs and markers out.
//!
//! This module owns the byte-level grammar of markers (tags, comments,
//! CDATA sections, `<|[NAME]|>` special markers) and nothing else. It does
//! not know which tags matter: deciding what a tag *means* belongs to
//! the state machine (`machine`), which receives every [`Token`] through a
//! [`TokenSink`]. It must not allocate per byte, must not look back at text
//! it has already released, and must never hold more than one unfinished
//! marker (bounded by [`ScanLimits`]).
//!
//! # How bytes move
//!
//! In text, the scanner jumps with `memchr` to the next `<`; everything
//! before it is released at once as [`Token::Text`]. From a `<` on, bytes are
//! *held* while a small state machine (`Candidate`) decides, one byte at a
//! time and resumably across chunks, whether they form a marker:
//!
//! ```text
//!   "abc<con" | "tent>xyz"      chunks as they arrive
//!    Text(abc)                  released at once
//!       <con                    held: could still be a marker
//!             tent>             completes it: Tag(content)
//!                  Text(xyz)
//! ```
//!
//! A simple tag (`<name>`, `</name>`, `<name/>`: most tags) that is whole in
//! the chunk is read at once where it lies, without the candidate machine
//! or the hold buffer; the token is the one the machine would give
//! (`simple_tag` says why), so how the input is split changes nothing.
//!
//! A candidate that turns out not to be a marker is released as text and the
//! byte that broke it is looked at once more (it may start a new candidate:
//! "A `<` met while reading a candidate tag ends that candidate"). So every
//! byte is examined a bounded number of times (by the simple-tag read, which
//! looks no further than the marker limit, by the candidate machine, and
//! once more if it broke a candidate), and no accumulated buffer is ever
//! re-scanned.
//!
//! Delimiters split across chunks need no special code: the candidate state
//! is carried over. The multi-byte ends are drawn here once:
//!
//! ```text
//!   comment end   -|->   --|>        CDATA end   ]|]>   ]]|>
//!   special end   |>  as  ||>        close tag   <|/x>  </|x>  </x|>
//! ```
//!
//! # Limits
//!
//! A tag or special marker longer than [`ScanLimits::max_marker_len`], or a
//! comment/CDATA longer than [`ScanLimits::max_comment_len`], is given up:
//! its bytes are released as text and a [`Token::Notice`] says so. Memory
//! held by the scanner is therefore bounded by the larger of the two limits.

mod json;
pub(crate) mod markdown;
mod tag;

pub(crate) use json::JsonString;
pub use tag::{Attr, Attrs, TagKind, TagToken, decode_entities};

/// A half-open byte range `[start, end)` in the input stream.
///
/// Offsets count bytes from the first byte ever fed to the parser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Span {
    /// Offset of the first byte.
    pub start: usize,
    /// Offset one past the last byte.
    pub end: usize,
}

impl Span {
    /// Builds a span from its two ends.
    pub fn new(start: usize, end: usize) -> Span {
        Span { start, end }
    }

    /// The number of bytes covered (0 for a span whose ends are reversed,
    /// which the parser never makes).
    pub fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether the span covers no byte.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

impl From<Span> for std::ops::Range<usize> {
    /// The span as a range, to index the input with: `&input[span.into()]`
    /// (`Range` is not `Copy`, so the span is the one to keep).
    fn from(span: Span) -> std::ops::Range<usize> {
        span.start..span.end
    }
}

impl serde::Serialize for Span {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        [self.start, self.end].serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for Span {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let [start, end] = <[usize; 2]>::deserialize(d)?;
        if end < start {
            return Err(serde::de::Error::custom(format_args!("span [{start}, {end}] ends before it starts")));
        }
        Ok(Span { start, end })
    }
}

/// Size limits that bound the memory a scanner holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLimits {
    /// Longest tag (`<name attr="v">`) or special marker (`<|[NAME]|>`), in
    /// bytes, including the angle brackets. Default 4 KiB.
    pub max_marker_len: usize,
    /// Longest comment (`<!-- -->`) or CDATA section, in bytes, including
    /// its delimiters. Default 256 KiB.
    pub max_comment_len: usize,
}

impl Default for ScanLimits {
    fn default() -> Self {
        ScanLimits { max_marker_len: 4 * 1024, max_comment_len: 256 * 1024 }
    }
}

/// One unit of scanner output. Borrowed data lives until the sink returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token<'a> {
    /// Bytes that are not part of any marker. Consecutive text may arrive
    /// as several tokens; a run may end in the middle of a UTF-8 character
    /// when a chunk does.
    Text {
        /// Where the bytes are in the input.
        span: Span,
        /// The bytes.
        bytes: &'a [u8],
    },
    /// An open, close or self-closing tag.
    Tag(TagToken<'a>),
    /// `<!-- ... -->`; `body` excludes the delimiters.
    Comment {
        /// Where the whole comment is.
        span: Span,
        /// The comment as written, delimiters included.
        raw: &'a [u8],
        /// The text between `<!--` and `-->`.
        body: &'a [u8],
    },
    /// `<![CDATA[ ... ]]>`; `body` excludes the delimiters.
    CData {
        /// Where the whole section is.
        span: Span,
        /// The section as written, delimiters included.
        raw: &'a [u8],
        /// The text between `<![CDATA[` and `]]>`.
        body: &'a [u8],
    },
    /// `<|[NAME]|>`, `<|NAME|>` or `<| [NAME] |>`; `name` is trimmed and
    /// stripped of its square brackets.
    Special {
        /// Where the marker is.
        span: Span,
        /// The marker as written.
        raw: &'a [u8],
        /// The name inside the marker.
        name: &'a [u8],
    },
    /// At end of input, the bytes of a marker that never finished.
    /// The receiver decides whether they are text or a cut-off marker.
    Unfinished {
        /// Where the bytes are.
        span: Span,
        /// The held bytes.
        raw: &'a [u8],
        /// What the bytes were on their way to becoming.
        kind: UnfinishedKind,
        /// For a tag, the (possibly partial) name read so far.
        name: &'a [u8],
    },
    /// Something the scanner gave up on; its bytes were released as text.
    Notice(ScanNotice),
}

/// What an unfinished marker at end of input was on its way to becoming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnfinishedKind {
    /// A lone `<` (or `<` and whitespace).
    Lt,
    /// An open tag whose name was still being read (`<na`): the name may
    /// be partial.
    OpenTagName,
    /// An open or self-closing tag whose name is complete (a space or `/`
    /// followed it: `<name attr`).
    OpenTag,
    /// A close tag whose name was still being read (`</na`, `</`).
    CloseTagName,
    /// A close tag whose name is complete (`</name `).
    CloseTag,
    /// A comment or CDATA section.
    Comment,
    /// A `<|...|>` special marker.
    Special,
}

/// Something the scanner degraded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanNotice {
    /// A candidate marker grew past its limit; its bytes were released as
    /// text.
    MarkerTooLong {
        /// Where the candidate started.
        at: usize,
        /// The limit that was hit.
        limit: usize,
    },
}

/// Receives tokens from a [`Scanner`].
pub trait TokenSink {
    /// Called once per token, in input order.
    fn token(&mut self, token: Token<'_>);
}

/// The scanner's position inside a candidate marker. One small `Copy` enum;
/// each variant names what has been read since the `<`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Candidate {
    /// `<`
    Lt,
    /// `<` and whitespace: only a tag may follow (`< content >`).
    LtSpace,
    /// `<na`: reading an open tag's name.
    Name,
    /// `<name ` (or after an attribute): expecting an attribute, `/` or `>`.
    AfterName,
    /// `<name at`: reading an attribute name.
    AttrName,
    /// `<name attr `: expecting `=`, another attribute, `/` or `>`.
    AfterAttrName,
    /// `<name attr=`: expecting a value.
    BeforeValue,
    /// Inside a quoted value; the byte is the quote.
    Quoted(u8),
    /// Inside an unquoted value.
    Bare,
    /// `<name /`: expecting `>`.
    SelfClose,
    /// `</` or `< /`: expecting the name.
    CloseSlash,
    /// `</na`: reading a close tag's name.
    CloseName,
    /// `</name `: expecting `>`.
    CloseAfterName,
    /// `<!`
    Bang,
    /// `<!-`
    BangDash,
    /// Inside a comment; the count of `-` just read (0, 1, 2).
    Comment(u8),
    /// `<![CDA`: the count of `[CDATA[` bytes matched so far.
    CdataOpen(u8),
    /// Inside CDATA; the count of `]` just read (0, 1, 2).
    Cdata(u8),
    /// `<|`: expecting the name of a special marker.
    Pipe,
    /// `<|[NA`: inside a special marker's name.
    SpecialName,
    /// `<|[NAME]|`: expecting `>`.
    SpecialEnd,
}

impl Candidate {
    fn is_comment_like(self) -> bool {
        matches!(self, Candidate::Comment(_) | Candidate::CdataOpen(_) | Candidate::Cdata(_))
    }

    fn unfinished_kind(self) -> UnfinishedKind {
        use Candidate::*;
        match self {
            Lt | LtSpace => UnfinishedKind::Lt,
            Name => UnfinishedKind::OpenTagName,
            AfterName | AttrName | AfterAttrName | BeforeValue | Quoted(_) | Bare | SelfClose => {
                UnfinishedKind::OpenTag
            }
            CloseSlash | CloseName => UnfinishedKind::CloseTagName,
            CloseAfterName => UnfinishedKind::CloseTag,
            Bang | BangDash | Comment(_) | CdataOpen(_) | Cdata(_) => UnfinishedKind::Comment,
            Pipe | SpecialName | SpecialEnd => UnfinishedKind::Special,
        }
    }
}

/// What one byte does to a candidate.
enum Step {
    /// Keep reading.
    Next(Candidate),
    /// This byte completes a marker.
    Done(Finished),
    /// Not a marker: the held bytes are text; look at this byte again.
    Fail,
}

#[derive(Debug, Clone, Copy)]
enum Finished {
    Open,
    SelfClosing,
    Close,
    Comment,
    Cdata,
    Special,
}

const CDATA_OPEN: &[u8; 7] = b"[CDATA[";

/// Inputs shorter than this are searched byte by byte: `memchr`'s vector
/// setup costs more than the loop on a streamed delta of a few bytes.
const SHORT: usize = 16;

/// The first `needle` in `hay` (`memchr`, or a plain loop on a short
/// input; no search when `hay` starts with it, as markup after markup
/// does).
#[inline]
pub(crate) fn find_byte(needle: u8, hay: &[u8]) -> Option<usize> {
    match hay.first() {
        Some(&b) if b == needle => Some(0),
        _ if hay.len() < SHORT => hay.iter().position(|&b| b == needle),
        _ => memchr::memchr(needle, hay),
    }
}

/// The first of two bytes in `hay` (`memchr2`, or a plain loop on a short
/// one).
#[inline]
pub(crate) fn find_byte2(a: u8, b: u8, hay: &[u8]) -> Option<usize> {
    if hay.len() < SHORT { hay.iter().position(|&x| x == a || x == b) } else { memchr::memchr2(a, b, hay) }
}

/// The first of three bytes in `hay` (`memchr3`, or a plain loop on a
/// short input).
#[inline]
pub(crate) fn find_byte3(a: u8, b: u8, c: u8, hay: &[u8]) -> Option<usize> {
    if hay.len() < SHORT { hay.iter().position(|&x| x == a || x == b || x == c) } else { memchr::memchr3(a, b, c, hay) }
}

/// Where `needle` (a short one: a delimiter, a marker) first occurs in
/// `hay`: a search for its first byte, then a comparison. std's
/// `str::find` builds a two-way searcher for each call, which costs more
/// than searching the few lines of a tool-call value. Linear in `hay`
/// times the needle's length. The position is a character boundary: the
/// needle's first byte starts a character.
pub(crate) fn find_str(hay: &str, needle: &str) -> Option<usize> {
    let (hay, needle) = (hay.as_bytes(), needle.as_bytes());
    let Some(&first) = needle.first() else { return Some(0) };
    let mut from = 0;
    while let Some(i) = hay.get(from..).and_then(|rest| find_byte(first, rest)) {
        let at = from + i;
        if hay.get(at..).is_some_and(|rest| rest.starts_with(needle)) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// How many bytes at the start of `hay` are whole repeats of `unit`
/// (`<<<<`, `&lt;`): compared sixty-four bytes at a time (four sixteen-byte
/// words, without a branch between them), then sixteen, so that a flood of
/// one byte or of one escape is measured in a few instructions per block,
/// not several per byte.
#[inline]
pub(crate) fn repeats(unit: [u8; 4], hay: &[u8]) -> usize {
    let mut block = [0u8; 16];
    for quarter in block.chunks_exact_mut(4) {
        quarter.copy_from_slice(&unit);
    }
    let block = u128::from_ne_bytes(block);
    let is_block = |c: &[u8]| <[u8; 16]>::try_from(c).is_ok_and(|c| u128::from_ne_bytes(c) == block);
    let mut len = 0;
    for chunk in hay.chunks_exact(64) {
        if !chunk.chunks_exact(16).fold(true, |all, c| all & is_block(c)) {
            break;
        }
        len += 64;
    }
    for chunk in hay[len..].chunks_exact(16) {
        if !is_block(chunk) {
            break;
        }
        len += 16;
    }
    let unit = u32::from_ne_bytes(unit);
    for chunk in hay[len..].chunks_exact(4) {
        match <[u8; 4]>::try_from(chunk) {
            Ok(c) if u32::from_ne_bytes(c) == unit => len += 4,
            _ => break,
        }
    }
    len
}

/// How many bytes at the start of `hay` are `byte` (a flood of `<`):
/// [`repeats`] of it four at a time, then the last few.
#[inline]
pub(crate) fn run_of(byte: u8, hay: &[u8]) -> usize {
    let whole = repeats([byte; 4], hay);
    whole + hay[whole..].iter().take_while(|&&b| b == byte).count()
}

/// `bytes` as text, invalid UTF-8 as U+FFFD (then owned). Valid text,
/// the usual case, is checked by `simdutf8` and borrowed: std's
/// `String::from_utf8_lossy` walks it chunk by chunk, several times slower
/// on lines of a few hundred bytes.
pub(crate) fn text_lossy(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    // A short piece (a streamed delta is a few bytes) is checked by std
    // directly: `simdutf8` hands it to std anyway, after its own dispatch.
    let checked = if bytes.len() < SHORT_TEXT {
        std::str::from_utf8(bytes).map_err(|_| ())
    } else {
        simdutf8::basic::from_utf8(bytes).map_err(|_| ())
    };
    match checked {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Below this length text is validated by std rather than `simdutf8`.
const SHORT_TEXT: usize = 64;

/// Up to this length ASCII text is copied byte by byte ([`copied_text`]).
const TINY_TEXT: usize = 16;

/// `bytes` as text, taking the buffer; `Err` carries the lossy text when
/// some bytes were not UTF-8. A short buffer (most element bodies) is
/// validated in place and becomes the string: no new allocation, no copy.
/// A longer one is checked by `simdutf8` and copied ([`copied_text`]): on
/// long non-ASCII text that beats std's validation in place.
pub(crate) fn into_text(bytes: Vec<u8>) -> Result<String, String> {
    if bytes.len() < SHORT_TEXT {
        return String::from_utf8(bytes).map_err(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    }
    copied_text(&bytes)
}

/// `bytes` decoded into a new string; `Err` carries the lossy text when
/// some bytes were invalid. A fast validation and a copy beat std's
/// validation in place (`String::from_utf8`) on non-ASCII text.
pub(crate) fn copied_text(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() <= TINY_TEXT && bytes.is_ascii() {
        // A streamed delta of a few ASCII bytes: pushed byte by byte, no
        // validation call and no copy call; an ASCII byte is its own
        // character. `& 0x7f` changes no byte here but tells the compiler
        // that each character is one byte, so no push carries the
        // multi-byte branch. Callgrind, 4 bytes, allocation included: 138
        // instructions, against 172 without the mask and ~190 validating
        // and copying.
        let mut text = String::with_capacity(bytes.len());
        text.extend(bytes.iter().map(|&b| char::from(b & 0x7f)));
        return Ok(text);
    }
    match text_lossy(bytes) {
        std::borrow::Cow::Borrowed(s) => Ok(s.to_owned()),
        std::borrow::Cow::Owned(s) => Err(s),
    }
}

/// `bytes` as an owned string, invalid UTF-8 as U+FFFD. Names and short
/// values are valid UTF-8 almost always: one validation and a copy beat
/// `String::from_utf8_lossy`'s chunked walk there.
pub(crate) fn owned_text(bytes: &[u8]) -> String {
    copied_text(bytes).unwrap_or_else(|lossy| lossy)
}

/// Length of an unfinished (but so far valid) UTF-8 sequence at the end.
/// Inlined: on every flush of streamed text, and most text ends in ASCII,
/// decided at the first byte looked at.
#[inline]
pub(crate) fn incomplete_utf8_tail(bytes: &[u8]) -> usize {
    let n = bytes.len();
    for back in 1..=3.min(n) {
        let b = bytes[n - back];
        if b & 0xC0 == 0x80 {
            continue; // continuation byte, keep looking for the lead
        }
        let need = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Whether `b` may start a tag name: ASCII letters, `_`, and any non-ASCII
/// byte (so `<状态栏>` is a tag; the machine decides whether it matters).
#[inline]
pub(crate) const fn is_name_start(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

#[inline]
pub(crate) fn is_name_char(b: u8) -> bool {
    NAME_CHARS[usize::from(b)]
}

/// [`is_name_char`] as a table: it runs on every byte of every tag name.
static NAME_CHARS: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = is_name_start(c) || c.is_ascii_digit() || matches!(c, b'-' | b'.' | b':');
        b += 1;
    }
    table
};

fn is_attr_name_char(b: u8) -> bool {
    is_name_char(b) || b == b'@'
}

fn is_special_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':' | b'[' | b']' | b' ' | b'\t')
}

/// HTML's white space (between a tag's parts).
pub(crate) fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')
}

/// One transition of the candidate machine. Kept free of any buffer so it
/// reads as the grammar it is.
fn step(cand: Candidate, b: u8) -> Step {
    use Candidate::*;
    use Step::*;
    if b == b'<' && !cand.is_comment_like() {
        return Fail;
    }
    match cand {
        Lt => match b {
            b'/' => Next(CloseSlash),
            b'!' => Next(Bang),
            b'|' => Next(Pipe),
            _ if is_space(b) => Next(LtSpace),
            _ if is_name_start(b) => Next(Name),
            _ => Fail,
        },
        LtSpace => match b {
            b'/' => Next(CloseSlash),
            _ if is_space(b) => Next(LtSpace),
            _ if is_name_start(b) => Next(Name),
            _ => Fail,
        },
        Name => match b {
            b'>' => Done(Finished::Open),
            b'/' => Next(SelfClose),
            _ if is_space(b) => Next(AfterName),
            _ if is_name_char(b) => Next(Name),
            _ => Fail,
        },
        AfterName => match b {
            b'>' => Done(Finished::Open),
            b'/' => Next(SelfClose),
            _ if is_space(b) => Next(AfterName),
            _ if is_attr_name_char(b) => Next(AttrName),
            _ => Fail,
        },
        AttrName => match b {
            b'>' => Done(Finished::Open),
            b'/' => Next(SelfClose),
            b'=' => Next(BeforeValue),
            _ if is_space(b) => Next(AfterAttrName),
            _ if is_attr_name_char(b) => Next(AttrName),
            _ => Fail,
        },
        AfterAttrName => match b {
            b'>' => Done(Finished::Open),
            b'/' => Next(SelfClose),
            b'=' => Next(BeforeValue),
            _ if is_space(b) => Next(AfterAttrName),
            _ if is_attr_name_char(b) => Next(AttrName),
            _ => Fail,
        },
        BeforeValue => match b {
            b'"' | b'\'' => Next(Quoted(b)),
            b'>' => Fail,
            _ if is_space(b) => Next(BeforeValue),
            _ => Next(Bare),
        },
        Quoted(q) if b == q => Next(AfterName),
        Quoted(q) => Next(Quoted(q)),
        Bare => match b {
            b'>' => Done(Finished::Open),
            _ if is_space(b) => Next(AfterName),
            _ => Next(Bare),
        },
        SelfClose => match b {
            b'>' => Done(Finished::SelfClosing),
            _ if is_space(b) => Next(SelfClose),
            _ => Fail,
        },
        CloseSlash => match b {
            _ if is_space(b) => Next(CloseSlash),
            _ if is_name_start(b) => Next(CloseName),
            _ => Fail,
        },
        CloseName => match b {
            b'>' => Done(Finished::Close),
            _ if is_space(b) => Next(CloseAfterName),
            _ if is_name_char(b) => Next(CloseName),
            _ => Fail,
        },
        CloseAfterName => match b {
            b'>' => Done(Finished::Close),
            _ if is_space(b) => Next(CloseAfterName),
            _ => Fail,
        },
        Bang => match b {
            b'-' => Next(BangDash),
            b'[' => Next(CdataOpen(1)),
            _ => Fail,
        },
        BangDash => match b {
            b'-' => Next(Comment(0)),
            _ => Fail,
        },
        Comment(dashes) => match b {
            b'-' => Next(Comment((dashes + 1).min(2))),
            b'>' if dashes == 2 => Done(Finished::Comment),
            _ => Next(Comment(0)),
        },
        CdataOpen(n) => {
            let want = CDATA_OPEN[usize::from(n)];
            if b.eq_ignore_ascii_case(&want) {
                if usize::from(n) + 1 == CDATA_OPEN.len() { Next(Cdata(0)) } else { Next(CdataOpen(n + 1)) }
            } else {
                Fail
            }
        }
        Cdata(brackets) => match b {
            b']' => Next(Cdata((brackets + 1).min(2))),
            b'>' if brackets == 2 => Done(Finished::Cdata),
            _ => Next(Cdata(0)),
        },
        Pipe => match b {
            _ if is_special_char(b) => Next(SpecialName),
            _ => Fail,
        },
        SpecialName => match b {
            b'|' => Next(SpecialEnd),
            _ if is_special_char(b) => Next(SpecialName),
            _ => Fail,
        },
        SpecialEnd => match b {
            b'>' => Done(Finished::Special),
            _ => Fail,
        },
    }
}

/// Where the scanner is between two bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScanState {
    /// Outside any marker.
    Text,
    /// Holding the bytes of a candidate marker that started at `held_start`.
    Marker(Candidate),
}

/// The incremental tokenizer. Feed it chunks split anywhere; it calls the
/// sink with tokens in input order.
///
/// ```
/// use spindle::scan::{Scanner, Token, TokenSink};
///
/// #[derive(Default)]
/// struct Names(Vec<String>);
/// impl TokenSink for Names {
///     fn token(&mut self, token: Token<'_>) {
///         if let Token::Tag(tag) = token {
///             self.0.push(String::from_utf8_lossy(tag.name).into_owned());
///         }
///     }
/// }
///
/// let mut names = Names::default();
/// let mut scanner = Scanner::default();
/// for chunk in [&b"<tho"[..], b"ught>hi</", b"thought>"] {
///     scanner.feed(chunk, &mut names);
/// }
/// scanner.finish(&mut names);
/// assert_eq!(names.0, ["thought", "thought"]);
/// ```
#[derive(Debug, Clone)]
pub struct Scanner {
    state: ScanState,
    /// The bytes of the current candidate (empty in text).
    held: Vec<u8>,
    /// Input offset of `held[0]`.
    held_start: usize,
    /// Input offset of the next byte to be fed.
    offset: usize,
    limits: ScanLimits,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner::new(ScanLimits::default())
    }
}

impl Scanner {
    /// A scanner with the given limits.
    pub fn new(limits: ScanLimits) -> Scanner {
        Scanner { state: ScanState::Text, held: Vec::new(), held_start: 0, offset: 0, limits }
    }

    /// The offset of the next byte to be fed (the total fed so far).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes currently held back as an unfinished marker.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// The capacity of the hold buffer, for memory accounting in tests.
    pub fn held_capacity(&self) -> usize {
        self.held.capacity()
    }

    /// Whether no unfinished marker is held: then a chunk without `<` is
    /// one text token of the whole chunk.
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.state, ScanState::Text)
    }

    /// Passes over `n` bytes that the caller took as such a text token.
    pub(crate) fn pass_text(&mut self, n: usize) {
        debug_assert!(self.is_idle());
        self.offset += n;
    }

    /// Scans one chunk. Text is released as soon as it cannot be part of a
    /// marker; an unfinished marker at the end of the chunk is held.
    pub fn feed(&mut self, chunk: &[u8], sink: &mut impl TokenSink) {
        let base = self.offset;
        self.offset += chunk.len();
        let mut i = 0;
        while i < chunk.len() {
            match self.state {
                ScanState::Text => {
                    // The next `<` that can start a candidate. A `<` whose
                    // next byte already fails (`<<`, `<3`) is text, as the
                    // candidate machine would decide one byte later: it stays
                    // in this text run instead of becoming a token of its own
                    // (a flood of `<` is one text token, not one per byte).
                    let mut from = i;
                    let found = loop {
                        let Some(off) = find_byte(b'<', &chunk[from..]) else { break None };
                        let at = from + off;
                        match chunk.get(at + 1) {
                            Some(&next) if matches!(step(Candidate::Lt, next), Step::Fail) => {
                                // In a run of `<` each but the last fails on
                                // the next: go to the last one at once.
                                let run = run_of(b'<', &chunk[at + 1..]);
                                from = at + run.max(1);
                            }
                            _ => break Some(at - i),
                        }
                    };
                    let Some(lt) = found else {
                        emit_text(sink, base + i, &chunk[i..]);
                        return;
                    };
                    if lt > 0 {
                        emit_text(sink, base + i, &chunk[i..i + lt]);
                    }
                    i += lt;
                    // Most tags are simple and whole in the chunk: read at
                    // once, in place, what the candidate machine would read
                    // byte by byte into the hold buffer.
                    if let Some((kind, name, len)) = simple_tag(&chunk[i..], self.limits.max_marker_len) {
                        let raw = &chunk[i..i + len];
                        let span = Span::new(base + i, base + i + len);
                        let tag = TagToken::simple(kind, raw, span, name);
                        debug_assert_eq!(tag, TagToken::from_raw(kind, raw, span));
                        sink.token(Token::Tag(tag));
                        i += len;
                        continue;
                    }
                    if let Some(len) = fails_at_next_lt(&chunk[i..], self.limits.max_marker_len) {
                        emit_text(sink, base + i, &chunk[i..i + len]);
                        i += len;
                        continue;
                    }
                    self.held.clear();
                    self.held.push(b'<');
                    self.held_start = base + i;
                    self.state = ScanState::Marker(Candidate::Lt);
                    i += 1;
                }
                ScanState::Marker(cand) => {
                    i = self.advance(cand, chunk, i, sink);
                }
            }
        }
    }

    /// Moves a candidate forward through `chunk[i..]`; returns the index of
    /// the next unread byte.
    fn advance(&mut self, mut cand: Candidate, chunk: &[u8], mut i: usize, sink: &mut impl TokenSink) -> usize {
        while i < chunk.len() {
            // Inside comment and CDATA bodies, jump to the next byte that can
            // matter instead of stepping through the body one byte at a time.
            if let Candidate::Comment(0) | Candidate::Cdata(0) = cand {
                let key = if matches!(cand, Candidate::Comment(_)) { b'-' } else { b']' };
                let skip = memchr::memchr(key, &chunk[i..]).unwrap_or(chunk.len() - i);
                if skip > 0 {
                    let limit = self.limits.max_comment_len;
                    if self.held.len() + skip > limit {
                        let room = limit.saturating_sub(self.held.len());
                        self.held.extend_from_slice(&chunk[i..i + room]);
                        i += room;
                        self.give_up(limit, sink);
                        return i;
                    }
                    self.held.extend_from_slice(&chunk[i..i + skip]);
                    i += skip;
                    continue;
                }
            }
            // A tag name or a quoted value is read as a run: every byte of
            // it is a step to the same candidate (the transitions `step`
            // would make), unless the run would pass the marker limit, which
            // the byte-wise path below reports at its exact byte.
            let run = match cand {
                Candidate::Name | Candidate::CloseName => {
                    chunk[i..].iter().position(|&b| !is_name_char(b)).unwrap_or(chunk.len() - i)
                }
                Candidate::Quoted(q) => memchr::memchr2(q, b'<', &chunk[i..]).unwrap_or(chunk.len() - i),
                _ => 0,
            };
            if run > 0 && self.held.len() + run <= self.limits.max_marker_len {
                self.held.extend_from_slice(&chunk[i..i + run]);
                i += run;
                continue;
            }
            let b = chunk[i];
            match step(cand, b) {
                Step::Next(next) => {
                    self.held.push(b);
                    i += 1;
                    let limit =
                        if next.is_comment_like() { self.limits.max_comment_len } else { self.limits.max_marker_len };
                    if self.held.len() > limit {
                        self.give_up(limit, sink);
                        return i;
                    }
                    cand = next;
                }
                Step::Done(done) => {
                    self.held.push(b);
                    i += 1;
                    self.complete(done, sink);
                    self.state = ScanState::Text;
                    return i;
                }
                Step::Fail => {
                    // The held bytes were text; `b` is looked at again in
                    // text state, where a `<` starts a new candidate.
                    self.release_as_text(sink);
                    return i;
                }
            }
        }
        self.state = ScanState::Marker(cand);
        i
    }

    /// A candidate outgrew its limit: release it as text and say so.
    fn give_up(&mut self, limit: usize, sink: &mut impl TokenSink) {
        sink.token(Token::Notice(ScanNotice::MarkerTooLong { at: self.held_start, limit }));
        self.release_as_text(sink);
    }

    fn release_as_text(&mut self, sink: &mut impl TokenSink) {
        if !self.held.is_empty() {
            emit_text(sink, self.held_start, &self.held);
        }
        self.held.clear();
        self.shrink_if_oversized();
        self.state = ScanState::Text;
    }

    /// After a large comment the hold buffer may keep a big allocation; give
    /// it back so that a stream's resident memory follows what it holds now.
    fn shrink_if_oversized(&mut self) {
        if self.held.capacity() > self.limits.max_marker_len.max(1024).saturating_mul(2) {
            self.held = Vec::new();
        }
    }

    fn complete(&mut self, done: Finished, sink: &mut impl TokenSink) {
        let span = Span::new(self.held_start, self.held_start + self.held.len());
        let raw = &self.held[..];
        match done {
            Finished::Open | Finished::SelfClosing | Finished::Close => {
                let kind = match done {
                    // `<media src=a.png/>`: the unquoted value swallowed the
                    // `/`, but the tag is self-closing.
                    Finished::Open if raw.ends_with(b"/>") => TagKind::SelfClosing,
                    Finished::Open => TagKind::Open,
                    Finished::SelfClosing => TagKind::SelfClosing,
                    _ => TagKind::Close,
                };
                sink.token(Token::Tag(TagToken::from_raw(kind, raw, span)));
            }
            Finished::Comment => sink.token(Token::Comment { span, raw, body: &raw[4..raw.len() - 3] }),
            Finished::Cdata => sink.token(Token::CData { span, raw, body: &raw[9..raw.len() - 3] }),
            Finished::Special => {
                let inner = &raw[2..raw.len() - 2];
                let name = trim_special(inner);
                sink.token(Token::Special { span, raw, name });
            }
        }
        self.held.clear();
        self.shrink_if_oversized();
    }

    /// Ends the input: an unfinished marker is handed over as
    /// [`Token::Unfinished`] so the receiver can decide what it was.
    pub fn finish(&mut self, sink: &mut impl TokenSink) {
        if let ScanState::Marker(cand) = self.state {
            let span = Span::new(self.held_start, self.held_start + self.held.len());
            let raw = &self.held[..];
            let name = partial_name(raw);
            sink.token(Token::Unfinished { span, raw, kind: cand.unfinished_kind(), name });
            self.held.clear();
            self.state = ScanState::Text;
        }
    }
}

/// How many bytes of `bytes` (which starts with a `<`) are text because the
/// candidate marker they start must fail: one that is no comment or CDATA
/// (`<!`) ends only at a `>`, and any candidate fails at a `<`, so with a
/// `<` before the next `>` (within `limit` bytes, so that no marker-limit
/// notice would come first), everything up to that `<` is text, as the
/// candidate machine would decide byte by byte. `None` when that is not
/// certain in `bytes`. A stray `<` in prose (`if a < b then ...`) is then
/// one search, not one step per byte up to the next tag. (Out of line: it
/// is only asked when the tag is not simple.)
#[inline(never)]
fn fails_at_next_lt(bytes: &[u8], limit: usize) -> Option<usize> {
    if bytes.get(1) == Some(&b'!') {
        return None;
    }
    let rest = bytes.get(1..)?;
    let at = 1 + find_byte2(b'<', b'>', &rest[..rest.len().min(limit)])?;
    (bytes[at] == b'<').then_some(at)
}

/// The kind, the name and the length of the simple tag `bytes` starts with
/// (`<name>`, `</name>` or `<name/>`, nothing else between the brackets),
/// when all of it is in `bytes` and it is at most `limit` bytes long; `None`
/// otherwise, and the candidate machine decides. For a simple tag the two agree: it is
/// the path `Lt`, `Name`/`CloseSlash`, `CloseName`, `SelfClose` through
/// [`step`] ends in, a tag the machine would never give up (it gives up
/// past `limit` held bytes, and the `>` is never held before the end).
#[inline]
fn simple_tag(bytes: &[u8], limit: usize) -> Option<(TagKind, std::ops::Range<usize>, usize)> {
    let close = bytes.get(1) == Some(&b'/');
    let start = 1 + usize::from(close);
    if !is_name_start(*bytes.get(start)?) {
        return None;
    }
    // The name, looked for no further than the limit.
    let window = bytes.get(start + 1..bytes.len().min(limit))?;
    let end = start + 1 + window.iter().position(|&b| !is_name_char(b))?;
    let (kind, len) = match (bytes[end], close) {
        (b'>', true) => (TagKind::Close, end + 1),
        (b'>', false) => (TagKind::Open, end + 1),
        (b'/', false) if bytes.get(end + 1) == Some(&b'>') => (TagKind::SelfClosing, end + 2),
        _ => return None,
    };
    (len <= limit).then_some((kind, start..end, len))
}

fn emit_text(sink: &mut impl TokenSink, at: usize, bytes: &[u8]) {
    sink.token(Token::Text { span: Span::new(at, at + bytes.len()), bytes });
}

/// `[ NAME ]` -> `NAME`.
fn trim_special(inner: &[u8]) -> &[u8] {
    let t = inner.trim_ascii();
    let t = t.strip_prefix(b"[").unwrap_or(t);
    let t = t.strip_suffix(b"]").unwrap_or(t);
    t.trim_ascii()
}

/// The tag name in an unfinished `<na` or `</na`, possibly partial.
fn partial_name(raw: &[u8]) -> &[u8] {
    let rest = raw.strip_prefix(b"<").unwrap_or(raw).trim_ascii_start();
    let rest = rest.strip_prefix(b"/").unwrap_or(rest).trim_ascii_start();
    let end = rest.iter().position(|&b| !is_name_char(b)).unwrap_or(rest.len());
    &rest[..end]
}

#[cfg(test)]
mod tests;
