//! The content HTML filter (spec 003 §3.1.3): an incremental allowlist
//! built on `lol_html`, followed by the safety net of `net` (private).
//!
//! This module owns what inline HTML in `<content>` may survive. It works
//! on the text of one element, chunk by chunk, and never sees events.
//!
//! # Rules
//!
//! * Kept: `span` (with a `style` of safe, URL-free properties only), `br`,
//!   `b`, `strong`, `i`, `em`, `u`, `s`, `ruby` (with `rt`, `rp`). Markup
//!   that needs no change is passed through byte for byte.
//! * Removed with their content: `script`, `style`, `iframe`, `object`,
//!   `embed`, `svg`, `math`, `template`, `noscript`, `textarea`, `title`,
//!   `xmp`, `noembed`, `noframes`, `plaintext`, `frameset`, `frame`,
//!   `applet`, `head`.
//! * Every other HTML element is removed and its content kept; every
//!   attribute but a safe span `style` is removed; comments and doctypes
//!   are removed (comments arrive as their own events).
//! * A tag whose name is not an HTML element (`<user>`, `<char>`, the
//!   pseudo-tags of role-play cards) is not markup any renderer knows: it
//!   is shown as text (`&lt;user>`), so the reader still sees it.
//! * Text that an HTML tokenizer would read as a tag of an HTML element,
//!   but that no writer of markup means as one (`if a<b {}`, `a<b and c>d`),
//!   is shown as text too (see `HeldTag`), instead of losing its
//!   "attributes".
//! * The `net` (private) pass then escapes any `<` that is not a whitelisted
//!   tag and breaks `javascript:`, `expression(`, `url(`, `on*=` patterns.
//! * Markdown code is shown, not filtered: the `code` (private) stages
//!   escape every `<` inside a fenced code block or code span before the
//!   passes above, and after them write back as it was each `<` there
//!   that is inert as HTML (`a < b`, `Vec<u8>`, `<div className="app">`),
//!   and leave the net's breaks of `url(` and `on<word>=` out of code:
//!   Markdown shows code verbatim, `&lt;` and `&#8203;` included.
//!
//! An element whose content is removed but which is never closed would
//! swallow the rest of the text, as it does in a browser. Instead its
//! content is held (up to [`FilterLimits::max_held`]) and, when the element
//! ends without its close tag, filtered again as ordinary HTML, so that
//! `<svg/onload=alert(1)> <b>text</b>` still shows `<b>text</b>`.
//!
//! # Example
//!
//! ```
//! use spindle::payload::html::HtmlFilter;
//!
//! let mut filter = HtmlFilter::new();
//! let mut html = String::new();
//! for chunk in ["Hi <b>there</b><scr", "ipt>alert(1)</script> <img src=x onerror=alert(1)>", "<span style=\"color: red\">!</span>"] {
//!     html.push_str(&filter.push(chunk));
//! }
//! html.push_str(&filter.finish());
//! assert_eq!(html, "Hi <b>there</b> <span style=\"color: red\">!</span>");
//! ```

use super::code::{self, CodeBlocks, ESCAPE, Side};
use super::net::{ESCAPED_LTS, Net, PlainByte, is_html_element, plain_table};
use super::style::{StyleVerdict, filter_style, style_is_safe};
use crate::scan::{find_byte, find_byte3, is_space, run_of};
use lol_html::html_content::{ContentType, TextType};
use lol_html::send::{HtmlRewriter, Settings};
use lol_html::{DocumentContentHandlers, ElementContentHandlers, MemorySettings, Selector};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Elements kept (with their attributes filtered).
const KEPT: &[&str] = &["b", "strong", "i", "em", "u", "s", "br", "span", "ruby", "rt", "rp"];

/// Elements removed together with their content.
const DROPPED: &[&str] = &[
    "script",
    "style",
    "iframe",
    "object",
    "embed",
    "svg",
    "math",
    "template",
    "noscript",
    "textarea",
    "title",
    "xmp",
    "noembed",
    "noframes",
    "plaintext",
    "frameset",
    "frame",
    "applet",
    "head",
];

pub use super::code::CodeMarkup;

/// Limits and settings of one filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterLimits {
    /// Most bytes of an unclosed removed element's content held for
    /// filtering again (see the module docs). Past it that content is
    /// dropped and the report says so. Default 256 KiB.
    pub max_held: usize,
    /// Memory limit of the HTML tokenizer (a single tag longer than this
    /// makes the filter fall back to escaping all markup). Default 1 MiB.
    pub max_tokenizer: usize,
    /// Most bytes of a start tag with attributes held while they are read,
    /// to tell a tag from text that reads like one (`if a<b {}`: see the
    /// module docs). A longer tag is taken for markup, its attributes
    /// filtered, and counted in [`FilterReport::long_tags`]. Default 512;
    /// 0 takes every such tag for markup at once.
    pub max_held_tag: usize,
    /// Most bytes of a Markdown code span held, from its first `<` to its
    /// closing backticks, to show its markup as written (see the module
    /// docs). Past it the span is read as text: its markup is filtered as
    /// anywhere else, its `<` escaped (`&lt;`), and it is counted in
    /// [`FilterReport::long_code_spans`]. Default 4 KiB.
    pub max_code_span: usize,
    /// What markup inside Markdown code becomes (see [`CodeMarkup`]).
    /// Default [`CodeMarkup::Inert`].
    pub code_markup: CodeMarkup,
}

impl Default for FilterLimits {
    fn default() -> Self {
        FilterLimits {
            max_held: 256 * 1024,
            max_tokenizer: 1024 * 1024,
            max_held_tag: 512,
            max_code_span: 4096,
            code_markup: CodeMarkup::Inert,
        }
    }
}

/// What a filter removed or changed, for diagnostics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilterReport {
    /// Elements removed, by name, with counts.
    pub removed_elements: BTreeMap<String, usize>,
    /// Attributes removed (or rewritten, for `style`), by name, with counts.
    pub removed_attributes: BTreeMap<String, usize>,
    /// Comments and doctypes removed.
    pub comments: usize,
    /// Tags interrupted by a `<` that were ended there.
    pub broken_tags: usize,
    /// Tags shown as text, by name: names that are not HTML (`<user>`),
    /// and text that an HTML tokenizer would read as a tag but no writer
    /// of markup means as one (`if a<b {}`, `a<b and c>d`, a tag across a
    /// blank line).
    pub text_tags: BTreeMap<String, usize>,
    /// `<` escaped by the safety net.
    pub escaped: usize,
    /// Start tags longer than [`FilterLimits::max_held_tag`], taken for
    /// markup without telling whether they were text.
    pub long_tags: usize,
    /// Code spans that passed [`FilterLimits::max_code_span`] before their
    /// closing backticks: their markup was filtered as outside code.
    pub long_code_spans: usize,
    /// End tags that closed nothing, dropped.
    pub stray_end_tags: usize,
    /// Dangerous text patterns neutralised by the safety net.
    pub neutralised: usize,
    /// Removed elements that were never closed, whose content was filtered
    /// again as ordinary HTML.
    pub unclosed: Vec<String>,
    /// Bytes of unclosed removed elements' content that were past the hold
    /// limit and were dropped.
    pub dropped_bytes: usize,
    /// Why the HTML tokenizer gave up, if it did. The markup after that
    /// point passed the safety net alone: tags written exactly as the
    /// allowlist writes them (`<b>`, `</i>`, a safely styled span) were
    /// kept, the end tags of other HTML elements dropped, and every other
    /// `<` escaped.
    pub degraded: Option<String>,
}

impl FilterReport {
    /// Whether the filter changed anything.
    pub fn is_clean(&self) -> bool {
        self.comments == 0 && self.is_clean_but_comments()
    }

    /// Whether the filter changed nothing but (perhaps) removing comments,
    /// which the content payload lists, so they need no diagnostic.
    pub fn is_clean_but_comments(&self) -> bool {
        // Field by field, so a new field is not forgotten here.
        let FilterReport {
            removed_elements,
            removed_attributes,
            comments: _,
            broken_tags,
            text_tags,
            escaped,
            long_tags,
            long_code_spans,
            stray_end_tags,
            neutralised,
            unclosed,
            dropped_bytes,
            degraded,
        } = self;
        removed_elements.is_empty()
            && removed_attributes.is_empty()
            && text_tags.is_empty()
            && unclosed.is_empty()
            && degraded.is_none()
            && [broken_tags, escaped, long_tags, long_code_spans, stray_end_tags, neutralised, dropped_bytes]
                .iter()
                .all(|n| **n == 0)
    }

    /// One sentence saying what was done, for a diagnostic.
    pub fn summary(&self) -> String {
        let list = |m: &BTreeMap<String, usize>| {
            m.iter().map(|(k, n)| if *n > 1 { format!("{k} ×{n}") } else { k.clone() }).collect::<Vec<_>>().join(", ")
        };
        let mut parts = Vec::new();
        if !self.removed_elements.is_empty() {
            parts.push(format!("removed elements: {}", list(&self.removed_elements)));
        }
        if !self.removed_attributes.is_empty() {
            parts.push(format!("removed attributes: {}", list(&self.removed_attributes)));
        }
        if self.comments > 0 {
            parts.push(format!("{} comment(s) or doctype(s) removed", self.comments));
        }
        if !self.text_tags.is_empty() {
            parts.push(format!("tags shown as text: {}", list(&self.text_tags)));
        }
        if self.broken_tags > 0 {
            parts.push(format!("{} tag(s) interrupted by '<' ended there", self.broken_tags));
        }
        if self.stray_end_tags > 0 {
            parts.push(format!("{} stray end tag(s) dropped", self.stray_end_tags));
        }
        if self.escaped > 0 {
            parts.push(format!("{} stray '<' escaped", self.escaped));
        }
        if self.long_tags > 0 {
            parts.push(format!(
                "{} start tag(s) past the held-tag limit taken for markup, their attributes filtered",
                self.long_tags
            ));
        }
        if self.long_code_spans > 0 {
            parts.push(format!("{} code span(s) past the hold limit left with '<' escaped", self.long_code_spans));
        }
        if self.neutralised > 0 {
            parts.push(format!(
                "{} script-like pattern(s) (javascript:, url(, on*=, ...) neutralised",
                self.neutralised
            ));
        }
        if !self.unclosed.is_empty() {
            parts.push(format!("unclosed {} removed and the text after it filtered again", self.unclosed.join(", ")));
        }
        if self.dropped_bytes > 0 {
            parts.push(format!(
                "{} bytes inside an unclosed removed element were dropped (hold limit)",
                self.dropped_bytes
            ));
        }
        if let Some(why) = &self.degraded {
            parts.push(format!(
                "the HTML tokenizer gave up ({why}); after that point only the safety net filtered the markup: allowed tags written plainly were kept, other tags escaped or dropped"
            ));
        }
        parts.join("; ")
    }

    fn merge(&mut self, other: FilterReport) {
        if other.is_clean() {
            // Nothing to add (the usual report of a piece of content).
            return;
        }
        add_counts(&mut self.removed_elements, other.removed_elements);
        add_counts(&mut self.removed_attributes, other.removed_attributes);
        self.comments += other.comments;
        self.broken_tags += other.broken_tags;
        self.escaped += other.escaped;
        self.long_tags += other.long_tags;
        self.long_code_spans += other.long_code_spans;
        add_counts(&mut self.text_tags, other.text_tags);
        let room = MAX_NAMES.saturating_sub(self.unclosed.len());
        self.unclosed.extend(other.unclosed.into_iter().take(room));
        self.dropped_bytes += other.dropped_bytes;
        if self.degraded.is_none() {
            self.degraded = other.degraded;
        }
    }
}

/// Adds the counts of `from` to `into` (taken whole when `into` is empty,
/// as it usually is: most content has nothing to report).
fn add_counts(into: &mut BTreeMap<String, usize>, from: BTreeMap<String, usize>) {
    if into.is_empty() {
        *into = from;
        return;
    }
    for (k, n) in from {
        count_name(into, &k, n);
    }
}

/// Most distinct names a report lists by name, per list; later new names
/// count under [`OTHER_NAMES`], so that content made of thousands of
/// distinct tags keeps a report of bounded size.
pub const MAX_NAMES: usize = 32;

/// The entry that counts the names past [`MAX_NAMES`].
pub const OTHER_NAMES: &str = "(other names)";

/// Counts `n` more of `name` in a report's list (see [`MAX_NAMES`]; a
/// list holds at most that many names and [`OTHER_NAMES`]).
fn count_name(map: &mut BTreeMap<String, usize>, name: &str, n: usize) {
    if let Some(count) = map.get_mut(name) {
        *count += n;
    } else if map.len() < MAX_NAMES {
        map.insert(name.to_string(), n);
    } else {
        *map.entry(OTHER_NAMES.to_string()).or_default() += n;
    }
}

/// A removed element whose close tag has not come yet.
#[derive(Debug, Clone)]
struct Dropping {
    name: String,
    /// Input offset just after its start tag.
    from: usize,
    /// Distinguishes successive removed elements.
    generation: u64,
}

/// State shared with the `lol_html` handlers.
#[derive(Debug, Default)]
struct Shared {
    out: Vec<u8>,
    dropping: Option<Dropping>,
    generation: u64,
    report: FilterReport,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A handler never panics while holding the lock; recover anyway.
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Where the rewriter writes: into [`Shared::out`].
type Sink = Box<dyn FnMut(&[u8]) + Send>;

type Rewriter = HtmlRewriter<'static, Sink>;

/// What the HTML tokenizer reads after the start tag of an element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterStart {
    /// Markup, as before.
    Data,
    /// Foreign content (`<svg>`, `<math>`): see [`Mirror::Foreign`].
    Foreign,
    /// Raw text up to the element's end tag (`<script>`, `<textarea>`).
    Raw(&'static str),
}

/// What follows a tag of `name` (lower case): markup after an end tag,
/// else by the name. A `match` on the name: one comparison of lengths
/// decides most names (`b`, `span`).
fn after_tag(name: &[u8], end_tag: bool) -> AfterStart {
    if end_tag {
        return AfterStart::Data;
    }
    match name {
        b"svg" | b"math" => AfterStart::Foreign,
        b"script" => AfterStart::Raw("script"),
        b"style" => AfterStart::Raw("style"),
        b"textarea" => AfterStart::Raw("textarea"),
        b"title" => AfterStart::Raw("title"),
        b"xmp" => AfterStart::Raw("xmp"),
        b"iframe" => AfterStart::Raw("iframe"),
        b"noembed" => AfterStart::Raw("noembed"),
        b"noframes" => AfterStart::Raw("noframes"),
        b"noscript" => AfterStart::Raw("noscript"),
        b"plaintext" => AfterStart::Raw("plaintext"),
        _ => AfterStart::Data,
    }
}

/// Where the [`TagCloser`] is, following the HTML tokenizer's states for
/// tags, comments and raw text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pre {
    Text,
    Lt,
    EndLt,
    TagName,
    BeforeAttr,
    AttrName,
    AfterAttrName,
    BeforeValue,
    DoubleQuoted,
    SingleQuoted,
    AfterQuoted,
    Unquoted,
    MarkupDecl,
    DeclDash,
    /// The comment states of the HTML tokenizer (so that a comment ends
    /// where it ends for the rewriter: at `-->`, but also at `<!-->`,
    /// `<!--->` and `--!>`). `<!--` just read.
    CommentStart,
    /// `<!---`.
    CommentStartDash,
    Comment,
    /// `-` in a comment.
    CommentEndDash,
    /// `--` in a comment.
    CommentEnd,
    /// `--!` in a comment.
    CommentEndBang,
    /// `<` in a comment.
    CommentLt,
    /// `<!` in a comment.
    CommentLtBang,
    /// `<!-` in a comment.
    CommentLtBangDash,
    /// `<!--` in a comment: the next byte is read as after `--`.
    CommentLtBangDashDash,
    Bogus,
    /// Inside a raw-text element (`raw` names it).
    Raw,
    RawLt,
    /// Matching `</name` (`matched` bytes of the name so far).
    RawEndName,
}

/// Ends a tag that a `<` interrupts (`<iframe src=x <b>` becomes
/// `<iframe src=x ><b>`), before the allowlist pass.
///
/// The HTML tokenizer reads such a `<` as part of an attribute, so one
/// broken tag would swallow the (whitelisted) tag after it. Here the broken
/// tag is ended first. The states mirror the tokenizer's (quoted values,
/// comments, raw text), so only a `<` the tokenizer would have read inside
/// a tag's attributes gets a `>` before it; a byte-wise state machine, so
/// it does not depend on how the input is split.
#[derive(Debug)]
struct TagCloser {
    state: Pre,
    /// The current tag's name, lower-cased (at most 16 bytes).
    name: Vec<u8>,
    end_tag: bool,
    raw: Option<&'static str>,
    matched: usize,
    /// `>` inserted so far.
    inserted: usize,
    /// The bytes of a tag start whose name is not complete yet (`<`, `</`,
    /// `<na`): held until the name shows whether it is an HTML element.
    pending: Vec<u8>,
    /// The name passed 16 bytes (no HTML element is that long).
    long_name: bool,
    /// Tags shown as text, by name: a non-HTML name, or an HTML name
    /// whose attributes read as text ([`HeldTag`]).
    text_tags: BTreeMap<String, usize>,
    /// A start tag of an HTML element held (in `pending`) while its
    /// attributes are read.
    held: Option<HeldTag>,
    /// `<` that start nothing, escaped here.
    escaped: usize,
    /// Longest start tag held while its attributes are read
    /// ([`FilterLimits::max_held_tag`]); a longer one is taken for markup,
    /// as every tag was before tags were held.
    max_held_tag: usize,
    /// Held tags taken for markup at that limit.
    long_tags: usize,
    /// Whether its states still follow the tokenizer's.
    mirror: Mirror,
    /// Whether it may have written a `<` since [`TagCloser::take_lt`]: its
    /// output is markup for the rewriter only then. Set by every write that
    /// may carry one; not by its escapes of `<` floods and its copies of
    /// text runs that stop at `<`, so that a flood of `<` (four times as
    /// long once escaped) is not searched again for a `<`.
    wrote_lt: bool,
}

/// Whether the [`TagCloser`]'s states can be taken for the HTML tokenizer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mirror {
    /// They follow them.
    Exact,
    /// An `<svg>` or `<math>` started: in foreign content the tokenizer
    /// reads `<textarea>` and the like as ordinary tags and knows CDATA
    /// sections, which the closer does not follow; from here on its being
    /// in text says nothing about the rewriter.
    Foreign,
}

/// An attribute-free start or end tag at the start of `bytes` (`<b>`,
/// `</SPAN>`) whose name is a letter and then letters or digits, at most
/// `max_name` of them: whether it is an end tag, the name as written, and
/// the tag's length.
#[inline(always)]
fn bare_tag(bytes: &[u8], max_name: usize) -> Option<(bool, &[u8], usize)> {
    let end_tag = bytes.get(1) == Some(&b'/');
    let start = if end_tag { 2 } else { 1 };
    let name_len = bytes.get(start..)?.iter().take(max_name + 1).take_while(|b| b.is_ascii_alphanumeric()).count();
    let len = start + name_len + 1;
    let fits = bytes.first() == Some(&b'<')
        && (1..=max_name).contains(&name_len)
        && bytes[start].is_ascii_alphabetic()
        && bytes.get(len - 1) == Some(&b'>');
    fits.then(|| (end_tag, &bytes[start..start + name_len], len))
}

/// Room left in a filtered buffer for what the end of the input usually
/// adds: a held tag start, escaped.
const END_SLACK: usize = 64;

/// Makes room for `additional` more bytes in `out`. A buffer that grows
/// while still nearly empty (reserved byte for byte for its input, then a
/// flood of `<` escaped four to one) moves to a new allocation that
/// receives only its bytes: `realloc` would copy its whole capacity.
fn reserve_fresh(out: &mut Vec<u8>, additional: usize) {
    if out.capacity() - out.len() >= additional {
        return;
    }
    let mut fresh = Vec::with_capacity(out.len() + additional);
    fresh.extend_from_slice(out);
    *out = fresh;
}

/// Longest tag start held while its name is read.
const MAX_PENDING: usize = 40;

/// Longest attribute name a [`HeldTag`] keeps (none that means something
/// bare is longer).
const MAX_ATTR_NAME: usize = 32;

/// Attributes that mean something without a value (`<details open>`), so
/// that a bare word in a tag (`<b and c>`) tells prose from markup.
/// Sorted, for a binary search.
const BARE_ATTRIBUTES: &[&str] = &[
    "allowfullscreen",
    "async",
    "autofocus",
    "autoplay",
    "checked",
    "compact",
    "contenteditable",
    "controls",
    "declare",
    "default",
    "defer",
    "disabled",
    "download",
    "draggable",
    "formnovalidate",
    "hidden",
    "inert",
    "ismap",
    "itemscope",
    "loop",
    "multiple",
    "muted",
    "nohref",
    "nomodule",
    "noresize",
    "noshade",
    "novalidate",
    "nowrap",
    "open",
    "playsinline",
    "popover",
    "readonly",
    "required",
    "reversed",
    "selected",
    "shadowrootclonable",
    "shadowrootdelegatesfocus",
    "shadowrootserializable",
    "spellcheck",
    "translate",
    "truespeed",
];

/// A start tag of an HTML element held while its attributes are read,
/// until they show whether the model meant markup.
///
/// To an HTML tokenizer `if a<b {}` and `a<b and c>d` hold start tags of
/// `<b>`, whose attributes (`{}`, `and`, `c`) the allowlist removes, and
/// with them text the reader should see; the tag may run on to the next
/// `>`, lines later. Such a tag is shown as text instead (`&lt;b {}`,
/// always safe), when an attribute name holds a byte no attribute name has
/// (`{`, `(`, a quote), when a bare word is not an attribute that means
/// something bare (`and`; `hidden`, `data-x` and `@click` are), or when a
/// blank line falls inside it (where Markdown ends the paragraph, so no
/// renderer reads a tag across it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct HeldTag {
    /// The attribute being read, lower case (its first
    /// [`MAX_ATTR_NAME`] bytes).
    attr: Vec<u8>,
    /// Whether that attribute has a value (`=` read).
    valued: bool,
    /// Line breaks since the last byte that is not white space.
    breaks: u8,
}

/// What a [`HeldTag`] turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// A tag: its bytes go on to the allowlist.
    Markup,
    /// Text that reads like a tag: shown as text.
    Text,
}

/// Whether `b` may be part of an attribute name as markup writes them
/// (`style`, `data-x`, `xml:lang`, `@click`).
fn attr_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b':' | b'.' | b'@')
}

/// Whether the attribute `name` (lower case) means something without a
/// value: one of [`BARE_ATTRIBUTES`], or a name of the kinds that are
/// often bare (`data-x`, `aria-x`, `v-cloak`, `:x`, `@x`).
fn bare_attribute(name: &[u8]) -> bool {
    name.contains(&b'-')
        || name.contains(&b':')
        || name.first() == Some(&b'@')
        || std::str::from_utf8(name).is_ok_and(|n| BARE_ATTRIBUTES.binary_search(&n).is_ok())
}

impl TagCloser {
    fn new(max_held_tag: usize) -> TagCloser {
        TagCloser {
            max_held_tag,
            long_tags: 0,
            state: Pre::Text,
            name: Vec::new(),
            end_tag: false,
            raw: None,
            matched: 0,
            inserted: 0,
            pending: Vec::new(),
            long_name: false,
            text_tags: BTreeMap::new(),
            held: None,
            escaped: 0,
            mirror: Mirror::Exact,
            wrote_lt: false,
        }
    }

    /// Whether a `<` may have been written since the last call.
    fn take_lt(&mut self) -> bool {
        std::mem::take(&mut self.wrote_lt)
    }

    fn transform(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        // With room for a few escapes (a `<` the closer writes out as
        // text is five bytes), so that a long text with one in it does
        // not copy itself again to grow.
        out.reserve(bytes.len() + END_SLACK);
        let mut i = 0;
        while i < bytes.len() {
            // In text, a comment, a bogus comment or raw text, with nothing
            // held, every byte but one or two passes unchanged and leaves
            // the state as it is: copy up to such a byte (what the steps
            // below do one at a time).
            if self.state == Pre::Text && self.pending.is_empty() && bytes[i] == b'<' {
                if let Some(len) = self.simple_tag(&bytes[i..]) {
                    // A whole `<name>` or `</name>` of an HTML element: what
                    // the steps below would write and leave, in one go (tag
                    // after tag, without a search for the next `<`, and
                    // copied as one run).
                    let from = i;
                    i += len;
                    while self.state == Pre::Text
                        && bytes.get(i) == Some(&b'<')
                        && let Some(len) = self.simple_tag(&bytes[i..])
                    {
                        i += len;
                    }
                    out.extend_from_slice(&bytes[from..i]);
                    self.wrote_lt = true;
                    continue;
                }
            } else {
                let stop = match self.state {
                    Pre::Text | Pre::Raw => Some((b'<', b'<')),
                    Pre::Comment => Some((b'-', b'<')),
                    Pre::Bogus => Some((b'>', b'>')),
                    _ => None,
                };
                if let Some((stop, or)) = stop
                    && self.pending.is_empty()
                {
                    let rest = &bytes[i..];
                    let at = if stop == or { find_byte(stop, rest) } else { find_byte3(stop, or, or, rest) };
                    let run = at.unwrap_or(rest.len());
                    if run > 0 {
                        // A bogus comment's run stops at `>` only.
                        self.wrote_lt |= stop != b'<' && or != b'<';
                        out.extend_from_slice(&bytes[i..i + run]);
                        i += run;
                        continue;
                    }
                }
            }
            if bytes[i] == b'<' && self.state == Pre::Lt && self.pending == b"<" {
                // A run of `<` after a held `<`: each releases the one
                // before it as `&lt;` and is held in turn (what the steps
                // below do one byte at a time), in one tight loop.
                let run = run_of(b'<', &bytes[i..]);
                // Room for the escapes at once (each `<` grows to five),
                // and for what the end may add.
                reserve_fresh(out, ESCAPE.len() * run + END_SLACK);
                let mut left = run;
                while left > 0 {
                    let n = left.min(ESCAPED_LTS.len() / ESCAPE.len());
                    out.extend_from_slice(&ESCAPED_LTS[..ESCAPE.len() * n]);
                    left -= n;
                }
                self.escaped += run;
                i += run;
                continue;
            }
            let b = bytes[i];
            i += 1;
            let name_ends = matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' | b'/' | b'>' | b'<');
            // Reading a held tag again as text may hold another, which
            // reads `b` in turn, or leave a tag's name being read, which
            // `b` may end.
            while let Some(reading) = self.read_held(b) {
                self.settle(reading, out);
            }
            if self.state == Pre::TagName && name_ends {
                // A start tag whose attributes follow is held while they
                // are read.
                self.decide(out, !matches!(b, b'>' | b'<'));
            }
            if b == b'<' && self.in_tag() {
                out.push(b'>');
                self.inserted += 1;
                self.tag_end();
            }
            let was_lt = self.state == Pre::Lt;
            if was_lt && b == b'<' {
                // `<<`: the first `<` starts nothing.
                self.release_lt(out);
            }
            self.step(b);
            if matches!(self.state, Pre::Lt | Pre::EndLt | Pre::TagName) {
                self.pending.push(b);
                if self.pending.len() > MAX_PENDING {
                    self.long_name = true;
                    self.decide(out, false);
                }
            } else if self.held.is_some() {
                self.pending.push(b);
                if self.pending.len() > self.max_held_tag {
                    self.long_tags += 1;
                    self.settle(Reading::Markup, out);
                }
            } else {
                if was_lt && self.state == Pre::Text {
                    // `< ` or `<3`: the `<` starts nothing.
                    self.release_lt(out);
                }
                self.wrote_lt |= !self.pending.is_empty() || b == b'<';
                out.append(&mut self.pending);
                out.push(b);
            }
        }
    }

    /// The length of the start or end tag of an HTML element without
    /// attributes (`<b>`, `</span>`) at the start of `bytes`, read whole:
    /// the tag is ended (as the steps would end it) and its bytes pass
    /// unchanged. `None` leaves the state as it was, for the steps.
    #[inline(always)]
    fn simple_tag(&mut self, bytes: &[u8]) -> Option<usize> {
        let (end_tag, written, len) = bare_tag(bytes, 16)?;
        // Names are lower case as written, almost always: then no copy.
        let mut lower = [0u8; 16];
        let name = if written.iter().any(u8::is_ascii_uppercase) {
            let lower = &mut lower[..written.len()];
            lower.copy_from_slice(written);
            lower.make_ascii_lowercase();
            &*lower
        } else {
            written
        };
        if !is_html_element(name) {
            return None;
        }
        self.ended(name, end_tag);
        Some(len)
    }

    /// The state after a whole tag of the HTML element `name` (lower
    /// case): what the steps through it would leave.
    /// (`name` and `end_tag` are not kept: only a tag read by the steps
    /// reads them again.)
    fn ended(&mut self, name: &[u8], end_tag: bool) {
        self.long_name = false;
        self.leave_tag(after_tag(name, end_tag));
    }

    /// The name of the tag being read is complete: an HTML element keeps
    /// its `<`; any other name (`<user>`, `<char>`, `<xss>`) is not markup
    /// a renderer knows, so it is shown as text (`&lt;user>`). A start tag
    /// of an HTML element stays held while its attributes are read when
    /// `hold` (they follow): see [`HeldTag`].
    fn decide(&mut self, out: &mut Vec<u8>, hold: bool) {
        let html = !self.long_name && is_html_element(&self.name);
        if html && hold && !self.end_tag && !self.pending.is_empty() {
            self.held = Some(HeldTag::default());
        } else if html || self.pending.is_empty() {
            self.wrote_lt |= !self.pending.is_empty();
            out.append(&mut self.pending);
        } else {
            let rest = std::mem::take(&mut self.pending);
            self.show_as_text(&rest, out);
        }
        self.long_name = false;
    }

    /// Shows the tag start `tag` (held, so not written yet) as text: its
    /// `<` escaped, the rest as it is.
    fn show_as_text(&mut self, tag: &[u8], out: &mut Vec<u8>) {
        count_name(&mut self.text_tags, std::str::from_utf8(&self.name).unwrap_or_default(), 1);
        let rest = tag.get(1..).unwrap_or_default();
        self.wrote_lt |= rest.contains(&b'<');
        out.extend_from_slice(ESCAPE.as_bytes());
        out.extend_from_slice(rest);
        self.state = Pre::Text;
    }

    /// Reads byte `b` of a held start tag before the steps do: what the
    /// tag turned out to be once `b` shows it (see [`HeldTag`]), `None`
    /// while that is still open or no tag is held. `b` ends a tag as
    /// markup when it ends it for the tokenizer (`>`, or a `<` that
    /// interrupts it).
    fn read_held(&mut self, b: u8) -> Option<Reading> {
        let held = self.held.as_mut()?;
        let ws = is_space(b);
        if b == b'\n' {
            held.breaks = held.breaks.saturating_add(1);
            if held.breaks >= 2 {
                return Some(Reading::Text);
            }
        } else if !ws {
            held.breaks = 0;
        }
        if ws || matches!(self.state, Pre::DoubleQuoted | Pre::SingleQuoted) {
            return None;
        }
        // A bare attribute ends here: the tag ends, or another begins.
        let bare_ends = match self.state {
            Pre::AttrName => matches!(b, b'>' | b'/' | b'<'),
            Pre::AfterAttrName => b != b'=',
            _ => false,
        };
        if bare_ends && !held.valued && !bare_attribute(&held.attr) {
            return Some(Reading::Text);
        }
        match (self.state, b) {
            (_, b'>' | b'<') => return Some(Reading::Markup),
            (Pre::AttrName | Pre::AfterAttrName, b'=') => held.valued = true,
            (_, b'/') | (Pre::BeforeValue | Pre::Unquoted, _) => {}
            (Pre::AttrName, _) => {
                if !attr_byte(b) {
                    return Some(Reading::Text);
                }
                if held.attr.len() < MAX_ATTR_NAME {
                    held.attr.push(b.to_ascii_lowercase());
                }
            }
            // An attribute begins.
            _ => {
                if !attr_byte(b) {
                    return Some(Reading::Text);
                }
                held.attr.clear();
                held.attr.push(b.to_ascii_lowercase());
                held.valued = false;
            }
        }
        None
    }

    /// Ends holding a start tag. As markup its bytes go on as they were
    /// read; as text its `<` is escaped and the rest is read again as
    /// what follows text (so that the states still follow the
    /// tokenizer's, which reads it so: a `<` in a quoted value may start a
    /// tag there).
    fn settle(&mut self, reading: Reading, out: &mut Vec<u8>) {
        if self.held.take().is_none() {
            return;
        }
        let tag = std::mem::take(&mut self.pending);
        match reading {
            Reading::Markup => {
                self.wrote_lt = true;
                out.extend_from_slice(&tag);
                // Its buffer, to hold the next tag.
                self.pending = tag;
                self.pending.clear();
            }
            Reading::Text => {
                self.show_as_text(&tag[..tag.len().min(1)], out);
                self.transform(tag.get(1..).unwrap_or_default(), out);
            }
        }
    }

    /// Releases a held `<` that starts nothing (`<<`, `< `, `<3`) as
    /// `&lt;`, the escape the safety net would give it: the HTML tokenizer
    /// then reads a flood of them as one text run instead of one token
    /// per `<`.
    fn release_lt(&mut self, out: &mut Vec<u8>) {
        if self.pending == b"<" {
            self.pending.clear();
            out.extend_from_slice(ESCAPE.as_bytes());
            self.escaped += 1;
        } else {
            self.wrote_lt |= !self.pending.is_empty();
            out.append(&mut self.pending);
        }
    }

    /// In text, with nothing held (bytes other than `<` pass unchanged),
    /// and the HTML tokenizer is in its data state too (the closer still
    /// follows it; see [`Mirror`]).
    fn is_idle_with_tokenizer(&self) -> bool {
        self.state == Pre::Text && self.pending.is_empty() && self.mirror == Mirror::Exact
    }

    /// Releases a tag start still held at the end of the input: a start
    /// tag never ended is text.
    fn finish(&mut self, out: &mut Vec<u8>) {
        // Reading the rest of one again may hold another.
        while self.held.is_some() {
            self.settle(Reading::Text, out);
        }
        self.wrote_lt |= !self.pending.is_empty();
        out.append(&mut self.pending);
    }

    fn in_tag(&self) -> bool {
        matches!(
            self.state,
            Pre::TagName
                | Pre::BeforeAttr
                | Pre::AttrName
                | Pre::AfterAttrName
                | Pre::BeforeValue
                | Pre::AfterQuoted
                | Pre::Unquoted
        )
    }

    /// A tag ended: raw text follows a raw-text start tag.
    fn tag_end(&mut self) {
        self.leave_tag(after_tag(&self.name, self.end_tag));
    }

    /// Leaves a tag for what follows it.
    fn leave_tag(&mut self, after: AfterStart) {
        self.state = Pre::Text;
        match after {
            AfterStart::Data => {}
            AfterStart::Foreign => self.mirror = Mirror::Foreign,
            AfterStart::Raw(raw) => {
                self.raw = Some(raw);
                self.state = Pre::Raw;
            }
        }
    }

    fn start_tag(&mut self, first: u8, end_tag: bool) {
        self.name.clear();
        self.long_name = false;
        self.name.push(first.to_ascii_lowercase());
        self.end_tag = end_tag;
        self.state = Pre::TagName;
    }

    fn step(&mut self, b: u8) {
        let ws = is_space(b);
        self.state = match self.state {
            Pre::Text => {
                if b == b'<' {
                    Pre::Lt
                } else {
                    Pre::Text
                }
            }
            Pre::Lt => match b {
                b'!' => Pre::MarkupDecl,
                b'/' => Pre::EndLt,
                b'?' => Pre::Bogus,
                b'<' => Pre::Lt,
                b if b.is_ascii_alphabetic() => {
                    self.start_tag(b, false);
                    Pre::TagName
                }
                _ => Pre::Text,
            },
            Pre::EndLt => match b {
                b'>' => Pre::Text,
                b if b.is_ascii_alphabetic() => {
                    self.start_tag(b, true);
                    Pre::TagName
                }
                _ => Pre::Bogus,
            },
            Pre::TagName => match b {
                b'>' => return self.tag_end(),
                b'/' => Pre::BeforeAttr,
                _ if ws => Pre::BeforeAttr,
                _ => {
                    if self.name.len() < 16 {
                        self.name.push(b.to_ascii_lowercase());
                    } else {
                        self.long_name = true;
                    }
                    Pre::TagName
                }
            },
            Pre::BeforeAttr => match b {
                b'>' => return self.tag_end(),
                b'/' => Pre::BeforeAttr,
                _ if ws => Pre::BeforeAttr,
                _ => Pre::AttrName,
            },
            Pre::AttrName => match b {
                b'>' => return self.tag_end(),
                b'/' => Pre::BeforeAttr,
                b'=' => Pre::BeforeValue,
                _ if ws => Pre::AfterAttrName,
                _ => Pre::AttrName,
            },
            Pre::AfterAttrName => match b {
                b'>' => return self.tag_end(),
                b'/' => Pre::BeforeAttr,
                b'=' => Pre::BeforeValue,
                _ if ws => Pre::AfterAttrName,
                _ => Pre::AttrName,
            },
            Pre::BeforeValue => match b {
                b'>' => return self.tag_end(),
                b'"' => Pre::DoubleQuoted,
                b'\'' => Pre::SingleQuoted,
                _ if ws => Pre::BeforeValue,
                _ => Pre::Unquoted,
            },
            Pre::DoubleQuoted => {
                if b == b'"' {
                    Pre::AfterQuoted
                } else {
                    Pre::DoubleQuoted
                }
            }
            Pre::SingleQuoted => {
                if b == b'\'' {
                    Pre::AfterQuoted
                } else {
                    Pre::SingleQuoted
                }
            }
            Pre::AfterQuoted => match b {
                b'>' => return self.tag_end(),
                b'/' => Pre::BeforeAttr,
                _ if ws => Pre::BeforeAttr,
                _ => Pre::AttrName,
            },
            Pre::Unquoted => match b {
                b'>' => return self.tag_end(),
                _ if ws => Pre::BeforeAttr,
                _ => Pre::Unquoted,
            },
            Pre::MarkupDecl => match b {
                b'-' => Pre::DeclDash,
                b'>' => Pre::Text,
                _ => Pre::Bogus,
            },
            Pre::DeclDash => match b {
                b'-' => Pre::CommentStart,
                b'>' => Pre::Text,
                _ => Pre::Bogus,
            },
            Pre::CommentStart
            | Pre::CommentStartDash
            | Pre::Comment
            | Pre::CommentEndDash
            | Pre::CommentEnd
            | Pre::CommentEndBang
            | Pre::CommentLt
            | Pre::CommentLtBang
            | Pre::CommentLtBangDash
            | Pre::CommentLtBangDashDash => comment_step(self.state, b),
            Pre::Bogus => {
                if b == b'>' {
                    Pre::Text
                } else {
                    Pre::Bogus
                }
            }
            Pre::Raw => {
                if b == b'<' && self.raw != Some("plaintext") {
                    Pre::RawLt
                } else {
                    Pre::Raw
                }
            }
            Pre::RawLt => match b {
                b'/' => {
                    self.matched = 0;
                    Pre::RawEndName
                }
                b'<' => Pre::RawLt,
                _ => Pre::Raw,
            },
            Pre::RawEndName => {
                let name = self.raw.unwrap_or_default().as_bytes();
                if self.matched < name.len() {
                    if name.get(self.matched) == Some(&b.to_ascii_lowercase()) {
                        self.matched += 1;
                        Pre::RawEndName
                    } else if b == b'<' {
                        Pre::RawLt
                    } else {
                        Pre::Raw
                    }
                } else if ws || b == b'/' || b == b'>' {
                    // `</script` and a delimiter: the raw text ends.
                    self.raw = None;
                    self.name = name.to_vec();
                    self.end_tag = true;
                    if b == b'>' { Pre::Text } else { Pre::BeforeAttr }
                } else if b == b'<' {
                    Pre::RawLt
                } else {
                    Pre::Raw
                }
            }
        };
    }
}

/// The next comment state after `b`, as the HTML tokenizer's comment
/// states go ("reconsume in" is the same byte read again in that state).
fn comment_step(state: Pre, b: u8) -> Pre {
    match (state, b) {
        (Pre::CommentStart, b'-') => Pre::CommentStartDash,
        (Pre::CommentStart | Pre::CommentStartDash, b'>') => Pre::Text,
        (Pre::CommentStartDash, b'-') => Pre::CommentEnd,
        (Pre::Comment, b'-') => Pre::CommentEndDash,
        (Pre::Comment, b'<') => Pre::CommentLt,
        (Pre::CommentEndDash, b'-') => Pre::CommentEnd,
        (Pre::CommentEnd, b'>') | (Pre::CommentEndBang, b'>') => Pre::Text,
        (Pre::CommentEnd, b'!') => Pre::CommentEndBang,
        (Pre::CommentEnd, b'-') => Pre::CommentEnd,
        (Pre::CommentEndBang, b'-') => Pre::CommentEndDash,
        (Pre::CommentLt, b'!') => Pre::CommentLtBang,
        (Pre::CommentLt, b'<') => Pre::CommentLt,
        (Pre::CommentLtBang, b'-') => Pre::CommentLtBangDash,
        (Pre::CommentLtBangDash, b'-') => Pre::CommentLtBangDashDash,
        (Pre::CommentLtBangDash, _) => comment_step(Pre::CommentEndDash, b),
        (Pre::CommentLtBangDashDash, _) => comment_step(Pre::CommentEnd, b),
        (Pre::Comment, _) => Pre::Comment,
        // Every other comment state reads any other byte as the comment
        // state does.
        _ => comment_step(Pre::Comment, b),
    }
}

/// One `lol_html` pass over a run of text, with the hold buffer for an
/// unclosed removed element.
/// The lol_html rewriter of a pass: built only when the first `<` arrives.
/// Text before any tag is what lol_html would pass unchanged (the pre-pass
/// and the handlers only act on markup), so markup-free content never pays
/// for a rewriter: neither its memory nor its per-byte work.
enum Rewriting {
    /// No `<` yet: bytes pass as they are.
    Waiting,
    /// The rewriter, and the input offset it started at (its source
    /// locations count from there).
    Running(Box<Rewriter>, usize),
    /// The rewriter gave up (a limit); the caller escapes what follows.
    Gone,
}

/// Whether a [`Pass`] may let runs of text and kept tags that need no
/// change bypass the rewriter (see [`Pass::run`]). Only the
/// tests turn it off, to compare the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bypass {
    Runs,
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    Never,
}

/// Which bytes end a run that may bypass the rewriter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RunStops {
    /// No rewriter yet: only a `<` (every other byte passes as it is).
    Lt,
    /// A settled rewriter: `<`, `>` and `&` (what the plain-text shortcut
    /// never lets by).
    LtGtAmp,
}

/// Deepest nesting of kept tags a bypassing run follows; a deeper run is
/// left to the rewriter (it is not about to balance, and the look ahead
/// stays bounded).
const MAX_RUN_DEPTH: usize = 32;

/// Kept elements that are void (no end tag, never open).
const KEPT_VOID: &[&str] = &["br"];

/// The kept element (its index in [`KEPT`]) of an attribute-free start or
/// end tag at the start of `bytes` (`<b>`, `</span>`, `<BR>`), whether it
/// is an end tag, and the tag's length.
fn kept_tag(bytes: &[u8]) -> Option<(usize, bool, usize)> {
    // The longest kept name is `strong`.
    let (end_tag, name, len) = bare_tag(bytes, 6)?;
    let kept = KEPT.iter().position(|k| k.as_bytes().eq_ignore_ascii_case(name))?;
    Some((kept, end_tag, len))
}

/// The index of `span` in [`KEPT`].
const SPAN: usize = 7;
const _: () = assert!(matches!(KEPT[SPAN].as_bytes(), b"span"));

/// Longest style value [`styled_span`] reads (a longer one goes to the
/// rewriter; the look ahead stays bounded).
const MAX_RUN_STYLE: usize = 512;

/// How a styled span a run carries begins ([`styled_span`]).
const STYLED_OPEN: &[u8] = b"<span style=";

/// Longest styled span start tag a run carries: its head, the value in
/// quotes, and `>`. A longer tag start is not held ([`run_tag_prefix`]).
const MAX_STYLED_TAG: usize = STYLED_OPEN.len() + MAX_RUN_STYLE + 2;

/// The length of a `<span style="…">` start tag at the start of `bytes`
/// that the rewriter would pass byte for byte: one `style` attribute,
/// quoted, with no space around `=`, whose value has a declaration, no `&`
/// (so no entity to decode) and only safe declarations written plainly
/// ([`style_is_safe`]). For such a value [`filter_style`] keeps the
/// attribute as written, and so does the element handler: the tag is
/// markup a run may carry past the rewriter. Anything else (`<span
/// title=…>`, an unsafe or encoded style, two attributes) is left to it.
fn styled_span(bytes: &[u8]) -> Option<usize> {
    if !bytes.get(..STYLED_OPEN.len())?.eq_ignore_ascii_case(STYLED_OPEN) {
        return None;
    }
    let quote = *bytes.get(STYLED_OPEN.len())?;
    if quote != b'"' && quote != b'\'' {
        return None;
    }
    let from = STYLED_OPEN.len() + 1;
    let rest = bytes.get(from..)?;
    let len = find_byte(quote, &rest[..rest.len().min(MAX_RUN_STYLE)])?;
    if rest.get(len + 1) != Some(&b'>') {
        return None;
    }
    let value = std::str::from_utf8(&rest[..len]).ok()?;
    let declares = value.split(';').any(|d| !d.trim().is_empty());
    (declares && style_is_safe(value)).then_some(from + len + 2)
}

/// A tag a bypassing run may carry: an attribute-free kept tag
/// ([`kept_tag`]) or a safely styled span start tag ([`styled_span`]).
/// The kept element (its index in [`KEPT`]), whether it is an end tag,
/// and the tag's length.
fn run_tag(bytes: &[u8]) -> Option<(usize, bool, usize)> {
    kept_tag(bytes).or_else(|| styled_span(bytes).map(|len| (SPAN, false, len)))
}

/// Whether `bytes`, to their end, may be the start of a tag a run carries
/// ([`run_tag`]) or of a comment, not yet complete: `<`, `</b`, `<span
/// sty`, `<span style="color: r`, `<!-`.
fn run_tag_prefix(bytes: &[u8]) -> bool {
    let is_prefix = |whole: &[u8]| bytes.len() < whole.len() && whole[..bytes.len()].eq_ignore_ascii_case(bytes);
    if bytes.first() != Some(&b'<') || bytes.len() > MAX_STYLED_TAG {
        return false;
    }
    if is_prefix(b"<!--") {
        return true;
    }
    // `<`, `</`, then (part of) a kept name, with no `>` yet.
    let name = bytes.get(1 + usize::from(bytes.get(1) == Some(&b'/'))..).unwrap_or_default();
    if KEPT.iter().any(|k| name.len() <= k.len() && k.as_bytes()[..name.len()].eq_ignore_ascii_case(name)) {
        return true;
    }
    if bytes.len() <= STYLED_OPEN.len() {
        return is_prefix(STYLED_OPEN) || bytes.eq_ignore_ascii_case(STYLED_OPEN);
    }
    let (head, value) = bytes.split_at(STYLED_OPEN.len());
    if !head.eq_ignore_ascii_case(STYLED_OPEN) {
        return false;
    }
    // A quote, the value, and perhaps its closing quote, with no `>` yet.
    match value.split_first() {
        Some((&quote, value)) if quote == b'"' || quote == b'\'' => {
            find_byte(quote, value).is_none_or(|at| at + 1 == value.len())
        }
        _ => false,
    }
}

/// Most `<` [`next_run_start`] looks at before it gives up (markup dense
/// with other tags, or a flood of `<`, goes to the rewriter whole).
const MAX_RUN_STARTS_SEEN: usize = 8;

/// The offset of the next place at or after `from` where a bypassing run
/// may begin, if any among the next few `<`: a start tag a run may carry
/// ([`run_tag`]), or one cut off at the end ([`run_tag_prefix`]), after
/// text (one right after another tag belongs to the markup the rewriter
/// is reading, as in a flood of `<b>`).
fn next_run_start(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    for _ in 0..MAX_RUN_STARTS_SEEN {
        let lt = bytes.get(at..).and_then(|rest| find_byte(b'<', rest))?;
        at += lt;
        if at > 0
            && bytes[at - 1] != b'>'
            && (matches!(run_tag(&bytes[at..]), Some((_, false, _))) || run_tag_prefix(&bytes[at..]))
        {
            return Some(at);
        }
        at += 1;
    }
    None
}

/// Whether a comment is being read past the rewriter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elision {
    None,
    /// A comment that began where a run could: the rewriter would remove
    /// it whole and count it, so it is not fed at all (an unterminated
    /// comment is held by the tokenizer and copied again on every write,
    /// which made an endless one quadratic). The tag closer follows its
    /// states to its end.
    Comment,
}

struct Pass {
    closer: TagCloser,
    bypass: Bypass,
    elision: Elision,
    /// Comments removed here without the rewriter.
    elided_comments: usize,
    /// The kept elements that runs opened past the rewriter and that are
    /// still open, innermost last ([`Pass::run`]): each as its index in
    /// [`KEPT`] and where its start tag begins in [`Pass::unseen`].
    run_open: Vec<(usize, usize)>,
    /// Their start tags, as written.
    unseen: Vec<u8>,
    /// The start of a tag a run could carry, incomplete at the end of the
    /// last write.
    partial: Vec<u8>,
    rewriter: Rewriting,
    /// The rewriter's output and report, made with the rewriter: content
    /// whose markup never needs one (most) allocates and locks nothing.
    shared: Option<Arc<Mutex<Shared>>>,
    limits: FilterLimits,
    fed: usize,
    held: Vec<u8>,
    held_generation: u64,
    /// The generation whose content passed the hold limit.
    overflowed: Option<u64>,
    /// The running rewriter holds nothing (its last input ended on a
    /// character boundary) and no removed element is open: text without
    /// `<`, `>` or `&` would pass through it unchanged.
    settled: bool,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass").field("fed", &self.fed).field("held", &self.held.len()).finish_non_exhaustive()
    }
}

impl Pass {
    fn new(limits: FilterLimits, bypass: Bypass) -> Pass {
        Pass {
            closer: TagCloser::new(limits.max_held_tag),
            bypass,
            elision: Elision::None,
            elided_comments: 0,
            run_open: Vec::new(),
            unseen: Vec::new(),
            partial: Vec::new(),
            rewriter: Rewriting::Waiting,
            shared: None,
            limits,
            fed: 0,
            held: Vec::new(),
            held_generation: 0,
            overflowed: None,
            settled: false,
        }
    }

    /// Whether bytes of plain text (no `<`, `>` or `&`) would bypass the
    /// rewriter now, as they are: nothing is held from before and a run
    /// may begin ([`Pass::write`]'s first branch). Changes nothing; the
    /// caller that takes them says so with [`Pass::bypassed`].
    fn passes_plain(&self) -> bool {
        self.partial.is_empty() && self.run_stops().is_some()
    }

    /// Feeds bytes; returns the allowlisted output so far.
    ///
    /// Runs that the rewriter would pass unchanged (see [`Pass::run`])
    /// bypass it; the rest goes through the tag closer and the rewriter, up
    /// to where such a run may begin again. A tag a run could carry that
    /// is not complete at the end of `bytes` is held until the next write
    /// shows what it is (the rewriter would hold it too).
    #[inline]
    fn write<'a>(&mut self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        if self.partial.is_empty() {
            // The common delta, plain text: one search.
            let plain = match self.run_stops() {
                Some(RunStops::Lt) => find_byte(b'<', bytes).is_none(),
                Some(RunStops::LtGtAmp) => find_byte3(b'<', b'>', b'&', bytes).is_none(),
                None => false,
            };
            if plain {
                self.bypassed(bytes.len());
                return Cow::Borrowed(bytes);
            }
            return self.write_markup(bytes);
        }
        let mut joined = std::mem::take(&mut self.partial);
        joined.extend_from_slice(bytes);
        Cow::Owned(self.write_markup(&joined).into_owned())
    }

    /// [`Pass::write`] of bytes that may hold markup, with nothing held
    /// from before.
    fn write_markup<'a>(&mut self, bytes: &'a [u8]) -> Cow<'a, [u8]> {
        // The output: the input itself while only runs from its start have
        // passed.
        let mut out = Cow::Borrowed(&bytes[..0]);
        let mut i = 0;
        while i < bytes.len() {
            let rest = &bytes[i..];
            if self.elision == Elision::Comment {
                let len = self.elide_comment(rest);
                self.bypassed(len);
                i += len;
                continue;
            }
            let stops = self.run_stops();
            if stops.is_some() && rest.starts_with(b"<!--") {
                // The steps would reach the comment's start state with
                // nothing held.
                self.closer.state = Pre::CommentStart;
                self.elision = Elision::Comment;
                self.bypassed(4);
                i += 4;
                continue;
            }
            let run = match stops {
                Some(stops) => self.run(rest, stops),
                None => 0,
            };
            if run > 0 {
                self.bypassed(run);
                match &mut out {
                    Cow::Borrowed(passed) if passed.len() == i => *passed = &bytes[..i + run],
                    out => out.to_mut().extend_from_slice(&rest[..run]),
                }
                i += run;
                continue;
            }
            if stops.is_some() && run_tag_prefix(rest) {
                // The end of the input, and perhaps a tag a run carries.
                self.partial.extend_from_slice(rest);
                break;
            }
            // Through the rewriter, on to the next place a run may begin.
            let end = next_run_start(rest, 1).unwrap_or(rest.len());
            let mut closed = Vec::new();
            self.closer.transform(&rest[..end], &mut closed);
            let filtered = self.write_closed(closed);
            if i == 0 && end == bytes.len() {
                return Cow::Owned(filtered);
            }
            out.to_mut().extend_from_slice(&filtered);
            i += end;
        }
        out
    }

    /// Reads an elided comment's bytes (the closer's comment states) up to
    /// its end; returns how many belong to it.
    fn elide_comment(&mut self, bytes: &[u8]) -> usize {
        let mut i = 0;
        while i < bytes.len() {
            if self.closer.state == Pre::Comment {
                // Only `-` and `<` leave the comment state.
                match find_byte3(b'-', b'<', b'<', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return bytes.len(),
                }
            }
            self.closer.state = comment_step(self.closer.state, bytes[i]);
            i += 1;
            if self.closer.state == Pre::Text {
                self.elision = Elision::None;
                self.elided_comments += 1;
                break;
            }
        }
        i
    }

    /// Bytes that bypassed the rewriter: its source locations shift by the
    /// bytes it did not see.
    fn bypassed(&mut self, len: usize) {
        self.fed += len;
        if let Rewriting::Running(_, origin) = &mut self.rewriter {
            *origin += len;
        }
    }

    /// Which bytes end a run that may bypass the rewriter now, if one may:
    /// the tag closer is in text with nothing held, and either no rewriter
    /// exists yet or it is settled.
    fn run_stops(&self) -> Option<RunStops> {
        if self.bypass == Bypass::Never || !self.closer.is_idle_with_tokenizer() {
            return None;
        }
        match self.rewriter {
            Rewriting::Waiting => Some(RunStops::Lt),
            Rewriting::Running(..) if self.settled => Some(RunStops::LtGtAmp),
            Rewriting::Running(..) | Rewriting::Gone => None,
        }
    }

    /// The length of the run at the start of `bytes` that may bypass the
    /// rewriter.
    ///
    /// The run is text without a stop byte and tags of kept elements that
    /// need no change ([`run_tag`]: `<b>`, `</i>`, `<br>`, `<span
    /// style="color: red">`), in which an end tag only closes an element a
    /// run opened. The rewriter would pass such a run byte for byte: the
    /// element handler changes nothing on a kept element without
    /// attributes or with a style it keeps as written, text in the data
    /// state is copied, and no removed element is open (settled). What it
    /// would remember of the run is the elements left open on its stack
    /// (so that a later end tag finds them there): their start tags are
    /// kept in [`Pass::unseen`] and shown to it before its next input
    /// ([`Pass::reveal_unseen`]). The run ends in the data state, holding
    /// nothing, and the tag closer is left as its steps would leave it.
    fn run(&mut self, bytes: &[u8], stops: RunStops) -> usize {
        let mut i = 0;
        let mut last_tag = None;
        loop {
            let stop = match stops {
                RunStops::Lt => find_byte(b'<', &bytes[i..]),
                RunStops::LtGtAmp => find_byte3(b'<', b'>', b'&', &bytes[i..]),
            };
            let Some(at) = stop else {
                i = bytes.len();
                break;
            };
            i += at;
            if bytes[i] != b'<' {
                break;
            }
            let Some((kept, end_tag, len)) = run_tag(&bytes[i..]) else { break };
            if end_tag {
                // As the rewriter's stack pops: up to the innermost element
                // of that name; one it has seen ends the run.
                let Some(open) = self.run_open.iter().rposition(|&(k, _)| k == kept) else { break };
                self.unseen.truncate(self.run_open[open].1);
                self.run_open.truncate(open);
            } else if !KEPT_VOID.contains(&KEPT[kept]) {
                if self.run_open.len() == MAX_RUN_DEPTH {
                    // A flood of start tags: the rest goes to the rewriter.
                    break;
                }
                self.run_open.push((kept, self.unseen.len()));
                self.unseen.extend_from_slice(&bytes[i..i + len]);
            }
            i += len;
            last_tag = Some((kept, end_tag));
        }
        if let Some((kept, end_tag)) = last_tag {
            // The closer's state after that tag (its steps would end it).
            self.closer.ended(KEPT[kept].as_bytes(), end_tag);
        }
        i
    }

    /// Shows the rewriter the start tags of the elements that runs opened
    /// past it and left open, so that its stack is what it would be had it
    /// read them; it passes them unchanged, and that output was written
    /// already, so it is dropped.
    fn reveal_unseen(&mut self) {
        if self.run_open.is_empty() {
            return;
        }
        let Rewriting::Running(rw, origin) = &mut self.rewriter else { return };
        let shared = self.shared.get_or_insert_with(Default::default);
        let before = lock(shared).out.len();
        let wrote = rw.write(&self.unseen);
        // Its source locations count the tags it read now.
        *origin = origin.saturating_sub(self.unseen.len());
        let mut state = lock(shared);
        debug_assert!(wrote.is_err() || state.out[before..] == self.unseen[..], "kept tags pass unchanged");
        state.out.truncate(before);
        if let Err(e) = wrote {
            state.report.degraded = Some(e.to_string());
            drop(state);
            self.rewriter = Rewriting::Gone;
        }
        self.run_open.clear();
        self.unseen.clear();
    }

    /// Feeds bytes that went through the [`TagCloser`].
    fn write_closed(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        let base = self.fed;
        self.fed += bytes.len();
        let lt = self.closer.take_lt();
        debug_assert!(lt || find_byte(b'<', &bytes).is_none(), "the tag closer wrote a `<` it did not note");
        if matches!(self.rewriter, Rewriting::Waiting) {
            if !lt || find_byte(b'<', &bytes).is_none() {
                // No markup: the bytes are the output, as they are.
                return bytes;
            }
            let rewriter = build_rewriter(self.shared.get_or_insert_with(Default::default), self.limits);
            self.rewriter = Rewriting::Running(Box::new(rewriter), base);
        }
        self.reveal_unseen();
        let origin = match &mut self.rewriter {
            Rewriting::Running(rw, origin) => {
                // Room for the output at once (it is about as long as the
                // input): no growth by doubling through a large chunk.
                lock(self.shared.get_or_insert_with(Default::default)).out.reserve(bytes.len());
                if let Err(e) = rw.write(&bytes) {
                    // With graceful bail-out, the bytes lol_html held were
                    // flushed to the sink unchanged; the caller escapes them
                    // and everything after.
                    self.rewriter = Rewriting::Gone;
                    let mut state = self.state();
                    state.report.degraded = Some(e.to_string());
                    return std::mem::take(&mut state.out);
                }
                *origin
            }
            Rewriting::Waiting | Rewriting::Gone => return bytes,
        };
        self.hold(&bytes, base, origin);
        let (dropping, out) = {
            let mut state = self.state();
            (state.dropping.is_some(), std::mem::take(&mut state.out))
        };
        self.settled = !dropping && crate::scan::incomplete_utf8_tail(&bytes) == 0;
        out
    }

    /// The state shared with the rewriter's handlers (made on first use).
    fn state(&mut self) -> MutexGuard<'_, Shared> {
        lock(self.shared.get_or_insert_with(Default::default))
    }

    /// Keeps the bytes after the start tag of the removed element that is
    /// still open.
    fn hold(&mut self, bytes: &[u8], base: usize, origin: usize) {
        let dropping = self.state().dropping.clone();
        let Some(d) = dropping else {
            self.held.clear();
            return;
        };
        if self.overflowed == Some(d.generation) {
            self.state().report.dropped_bytes += bytes.len();
            return;
        }
        let start = if d.generation != self.held_generation {
            self.held.clear();
            self.held_generation = d.generation;
            (d.from + origin).saturating_sub(base).min(bytes.len())
        } else {
            0
        };
        self.held.extend_from_slice(&bytes[start..]);
        if self.held.len() > self.limits.max_held {
            let held = self.held.len();
            self.state().report.dropped_bytes += held;
            self.held = Vec::new();
            self.overflowed = Some(d.generation);
        }
    }

    /// Ends the pass, adding what it changed to `report`: the remaining
    /// output, and the content of a removed element that was never closed
    /// (to filter again). Added in place, not returned: a report of three
    /// maps costs more to build and drop than content with nothing to
    /// report costs to end.
    ///
    /// By reference, not by value: a pass is a few hundred bytes, and
    /// moving it out of its filter to end it copied it for every content
    /// element. It is dropped by its owner after this.
    fn end(&mut self, report: &mut FilterReport) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut rest = Vec::new();
        if !self.partial.is_empty() {
            // A held tag start never completed: markup for the rewriter.
            let partial = std::mem::take(&mut self.partial);
            self.closer.transform(&partial, &mut rest);
        }
        self.closer.finish(&mut rest);
        let mut early = Vec::new();
        if !rest.is_empty() {
            early = self.write_closed(rest);
        }
        if let Rewriting::Running(rw, _) = std::mem::replace(&mut self.rewriter, Rewriting::Gone)
            && let Err(e) = rw.end()
        {
            self.state().report.degraded = Some(e.to_string());
        }
        let mut out = early;
        let dropping = match self.shared.take() {
            Some(shared) => {
                let mut shared = lock(&shared);
                out.append(&mut shared.out);
                report.merge(std::mem::take(&mut shared.report));
                shared.dropping.take()
            }
            None => None,
        };
        // An elided comment still open at the end is removed as the
        // rewriter removes one at the end of its input.
        report.comments += self.elided_comments + usize::from(self.elision == Elision::Comment);
        report.broken_tags += self.closer.inserted;
        report.escaped += self.closer.escaped;
        report.long_tags += self.closer.long_tags;
        add_counts(&mut report.text_tags, std::mem::take(&mut self.closer.text_tags));
        let again = match &dropping {
            Some(d) if self.overflowed != Some(d.generation) => {
                if report.unclosed.len() < MAX_NAMES {
                    report.unclosed.push(format!("<{}>", d.name));
                }
                Some(std::mem::take(&mut self.held))
            }
            _ => None,
        };
        (out, again)
    }
}

/// The selector of every element, parsed once per process (each rewriter
/// takes its selectors by value).
fn every_element() -> Option<Selector> {
    static ALL: OnceLock<Option<Selector>> = OnceLock::new();
    ALL.get_or_init(|| "*".parse().ok()).clone()
}

fn build_rewriter(shared: &Arc<Mutex<Shared>>, limits: FilterLimits) -> Rewriter {
    let sink_state = shared.clone();
    let sink: Sink = Box::new(move |chunk: &[u8]| lock(&sink_state).out.extend_from_slice(chunk));
    let el_state = shared.clone();
    let comment_state = shared.clone();
    let doctype_state = shared.clone();
    let text_state = shared.clone();
    // A constant, valid selector, parsed once per process; the fallback
    // arm is never taken.
    let Some(all) = every_element() else {
        return HtmlRewriter::new(Settings::new_send(), sink);
    };
    let settings = Settings::new_send()
        .with_strict(false)
        .with_memory_settings(
            MemorySettings::new()
                .with_max_allowed_memory_usage(limits.max_tokenizer)
                .with_graceful_bail_out_on_memory_limit_exceeded(true),
        )
        .with_graceful_bail_out_on_content_handler_error(true)
        .append_element_content_handler((
            Cow::Owned(all),
            ElementContentHandlers::default()
                .element(move |el: &mut lol_html::send::Element<'_, '_>| {
                    let state = el_state.clone();
                    let mut st = lock(&el_state);
                    if st.dropping.is_some() {
                        // Inside a removed element: its content goes with it.
                        return Ok(());
                    }
                    let name = el.tag_name();
                    if KEPT.contains(&name.as_str()) {
                        filter_attributes(el, &name, &mut st.report);
                    } else if DROPPED.contains(&name.as_str()) {
                        count_name(&mut st.report.removed_elements, &name, 1);
                        el.remove();
                        if el.can_have_content() {
                            st.generation += 1;
                            st.dropping = Some(Dropping {
                                name,
                                from: el.source_location().bytes().end,
                                generation: st.generation,
                            });
                            let generation = st.generation;
                            drop(st);
                            el.on_end_tag(Box::new(move |_end| {
                                let mut st = lock(&state);
                                if st.dropping.as_ref().is_some_and(|d| d.generation == generation) {
                                    st.dropping = None;
                                }
                                Ok(())
                            }))?;
                        }
                    } else {
                        count_name(&mut st.report.removed_elements, &name, 1);
                        el.remove_and_keep_content();
                    }
                    Ok(())
                })
                // Raw text outside a removed element can only come from markup
                // the allowlist does not know; escape it. Raw text is always
                // inside an element, so the handler is the elements' own: text
                // outside every element is then not decoded for it (a
                // document-wide text handler decodes every text chunk).
                .text(move |t: &mut lol_html::html_content::TextChunk<'_>| {
                    if t.text_type() != TextType::Data && lock(&text_state).dropping.is_none() {
                        let s = t.as_str().to_string();
                        t.replace(&s, ContentType::Text);
                    }
                    Ok(())
                }),
        ))
        .append_document_content_handler(
            DocumentContentHandlers::default()
                .comments(move |c: &mut lol_html::html_content::Comment<'_>| {
                    let mut st = lock(&comment_state);
                    if st.dropping.is_none() {
                        st.report.comments += 1;
                    }
                    c.remove();
                    Ok(())
                })
                .doctype(move |d: &mut lol_html::html_content::Doctype<'_>| {
                    lock(&doctype_state).report.comments += 1;
                    d.remove();
                    Ok(())
                }),
        );
    HtmlRewriter::new(settings, sink)
}

/// Removes every attribute of a kept element, except a safe `style` on a
/// `span` (rewritten to its safe declarations when needed).
fn filter_attributes(el: &mut lol_html::send::Element<'_, '_>, name: &str, report: &mut FilterReport) {
    let attrs: Vec<(String, String)> = el.attributes().iter().map(|a| (a.name(), a.value())).collect();
    let mut style_seen = false;
    for (attr, value) in attrs {
        if name == "span" && attr == "style" && !style_seen {
            style_seen = true;
            match filter_style(&value) {
                StyleVerdict::Keep => {}
                StyleVerdict::Rewrite(safe) => {
                    count_name(&mut report.removed_attributes, "style (unsafe part)", 1);
                    if el.set_attribute("style", &safe).is_err() {
                        el.remove_attribute("style");
                    }
                }
                StyleVerdict::Drop => {
                    count_name(&mut report.removed_attributes, "style", 1);
                    el.remove_attribute("style");
                }
            }
            continue;
        }
        count_name(&mut report.removed_attributes, &attr, 1);
        el.remove_attribute(&attr);
    }
}

/// Most times the content of an unclosed removed element is filtered again
/// (each time it is shorter); past it the rest is dropped.
const MAX_REFILTER: usize = 16;

/// Longest chunk [`HtmlFilter::take_plain`] takes: a streamed delta.
const PLAIN_MAX: usize = 64;

/// How [`HtmlFilter::take_plain`] reads a chunk's bytes: it stops at
/// what the net decides at and at what ends the allowlist pass's
/// bypassing runs (`<`, `>`, `&`).
static PLAIN: [PlainByte; 256] = plain_table(b"<>&");

/// The incremental content filter: raw inner text of a content element in,
/// safe-to-display HTML out, chunk by chunk. Joining the outputs of
/// [`HtmlFilter::push`] and [`HtmlFilter::finish`] does not depend on how
/// the input was split.
pub struct HtmlFilter {
    pass: Option<Pass>,
    net: Net,
    limits: FilterLimits,
    report: FilterReport,
    /// Output bytes that end in an unfinished UTF-8 character.
    tail: Vec<u8>,
    /// A reused output buffer for [`HtmlFilter::push_in_place`].
    scratch: Vec<u8>,
    /// The allowlist pass failed: markup goes to the net unfiltered (the
    /// net escapes it).
    degraded: bool,
    /// Whether its passes let balanced runs bypass the rewriter.
    bypass: Bypass,
    /// The first stage: `<` in Markdown code escaped, so that no markup is
    /// read there.
    code_in: CodeBlocks,
    /// The last stage: escapes in Markdown code written back where inert.
    code: CodeBlocks,
}

impl std::fmt::Debug for HtmlFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HtmlFilter").field("pass", &self.pass).field("held", &self.net.held()).finish_non_exhaustive()
    }
}

impl Default for HtmlFilter {
    fn default() -> Self {
        HtmlFilter::new()
    }
}

impl HtmlFilter {
    /// A filter with default limits.
    pub fn new() -> HtmlFilter {
        HtmlFilter::with_limits(FilterLimits::default())
    }

    /// A filter with explicit limits.
    pub fn with_limits(limits: FilterLimits) -> HtmlFilter {
        HtmlFilter::with_bypass(limits, Bypass::Runs)
    }

    fn with_bypass(limits: FilterLimits, bypass: Bypass) -> HtmlFilter {
        HtmlFilter {
            bypass,
            pass: Some(Pass::new(limits, bypass)),
            net: Net::default(),
            limits,
            report: FilterReport::default(),
            tail: Vec::new(),
            degraded: false,
            scratch: Vec::new(),
            code_in: CodeBlocks::new(Side::Input, limits.max_code_span, limits.code_markup),
            code: CodeBlocks::new(Side::Output, limits.max_code_span, limits.code_markup),
        }
    }

    /// Filters the next chunk of raw text; returns the filtered text that is
    /// certain so far (possibly empty).
    pub fn push(&mut self, chunk: &str) -> String {
        let mut text = chunk.to_string();
        self.push_in_place(&mut text);
        text
    }

    /// Runs the allowlist pass and the net over `chunk`: the output that is
    /// certain so far, as bytes.
    fn filter_bytes(&mut self, chunk: &[u8]) -> Vec<u8> {
        let passed = self.allowlist(chunk);
        let mut bytes = Vec::new();
        let Some(n) = self.net.push_or_prefix(&passed, &mut bytes) else { return bytes };
        // The net changed nothing: the allowlist's output (its own buffer
        // when it made one) is the output, with room for what an end
        // usually adds (a held tag start); growing a large buffer later
        // copies all of it.
        match passed {
            Cow::Owned(mut own) => {
                own.truncate(n);
                own.reserve(END_SLACK);
                own
            }
            Cow::Borrowed(b) => {
                bytes.reserve_exact(n + END_SLACK);
                bytes.extend_from_slice(b.get(..n).unwrap_or_default());
                bytes
            }
        }
    }

    /// Like [`HtmlFilter::push`], taking the chunk by value: when the
    /// filter passes it unchanged and holds nothing back (prose, the common
    /// case), the same string comes back, with no allocation.
    pub fn push_owned(&mut self, mut chunk: String) -> String {
        self.push_in_place(&mut chunk);
        chunk
    }

    /// Like [`HtmlFilter::push`], replacing `text` by its filtered text.
    /// When the filter passes it unchanged and holds nothing back (prose,
    /// the common case), `text` is not touched: no copy, no allocation, no
    /// write.
    pub fn push_in_place(&mut self, text: &mut String) {
        // The common streamed delta: neither code stage reads it, and
        // where the passes leave it as it is, it needs no second look.
        let quiet = self.code_in.is_quiet() && self.code.is_quiet() && code::reads_nothing(text.as_bytes());
        if !quiet {
            self.code_in.push(text, false);
        }
        let untouched = self.filter_in_place(text);
        if !(quiet && untouched) {
            self.code.push(text, false);
        }
    }

    /// The passes of [`HtmlFilter::push_in_place`] between the code stages.
    /// `true` when `text` is left as it was.
    fn filter_in_place(&mut self, text: &mut String) -> bool {
        if self.take_plain(text.as_bytes()) {
            return true;
        }
        let passed = self.allowlist(text.as_bytes());
        // The common delta: both passes leave it as it is.
        if matches!(passed, Cow::Borrowed(b) if b.len() == text.len())
            && self.tail.is_empty()
            && self.net.pass_whole(text.as_bytes())
        {
            return true;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let prefix = self.net.push_or_prefix(&passed, &mut scratch);
        match (prefix, passed) {
            // Nothing changed by either pass: the output is the start of
            // `text` (the net holds the rest back at an ASCII byte).
            (Some(n), Cow::Borrowed(_)) if self.tail.is_empty() && text.is_char_boundary(n) => {
                text.truncate(n);
                self.scratch = scratch;
            }
            // Changed by the first pass only: its output is the text (no
            // copy; the net wrote nothing).
            (Some(n), Cow::Owned(mut passed)) => {
                passed.truncate(n);
                self.scratch = scratch;
                *text = self.text(passed);
            }
            (Some(n), Cow::Borrowed(passed)) => {
                scratch.extend_from_slice(passed.get(..n).unwrap_or_default());
                *text = self.text(scratch);
            }
            // Written after held bytes, and still the same text.
            (None, _) if self.tail.is_empty() && scratch == text.as_bytes() => {
                self.scratch = scratch;
                return true;
            }
            (None, _) => *text = self.text(scratch),
        }
        false
    }

    /// Takes a short chunk of plain prose that both passes leave as it is
    /// and after which neither holds anything back: no byte either pass
    /// stops at ([`PLAIN`]), nothing held by the allowlist pass, the net,
    /// or an unfinished UTF-8 character. One look at each byte, where the
    /// passes would each search the chunk and the net would decide the
    /// pattern letters in it one by one. Longer chunks go the passes' way,
    /// whose searches skip quiet stretches faster. `false`: nothing taken,
    /// nothing changed.
    fn take_plain(&mut self, bytes: &[u8]) -> bool {
        if bytes.len() > PLAIN_MAX || !self.tail.is_empty() {
            return false;
        }
        let pass = match &mut self.pass {
            Some(pass) if !self.degraded => {
                if !pass.passes_plain() {
                    return false;
                }
                Some(pass)
            }
            // No allowlist pass (ended, or degraded): the net alone.
            _ => None,
        };
        if !self.net.take_plain(bytes, &PLAIN) {
            return false;
        }
        if let Some(pass) = pass {
            pass.bypassed(bytes.len());
        }
        true
    }

    /// Runs the allowlist pass over `chunk` (while it runs): its output so
    /// far, the input itself when it passes unchanged.
    fn allowlist<'a>(&mut self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        match &mut self.pass {
            Some(pass) if !self.degraded => {
                let passed = pass.write(chunk);
                if matches!(pass.rewriter, Rewriting::Gone) {
                    self.degraded = true;
                }
                passed
            }
            _ => Cow::Borrowed(chunk),
        }
    }

    /// Ends the input; returns the rest of the filtered text.
    pub fn finish(&mut self) -> String {
        // What the first stage held (a code span's text) goes through the
        // filter first.
        let mut rest = String::new();
        self.code_in.push(&mut rest, true);
        let bytes = if rest.is_empty() { Vec::new() } else { self.filter_bytes(rest.as_bytes()) };
        self.finish_after(bytes)
    }

    /// Ends the input, appending the rest of the filtered bytes to `bytes`
    /// (output not yet turned into text); returns all of it as text.
    fn finish_after(&mut self, mut bytes: Vec<u8>) -> String {
        let mut again = None;
        if let Some(pass) = &mut self.pass {
            let (out, rest) = pass.end(&mut self.report);
            self.net.push(&out, &mut bytes);
            again = rest;
        }
        self.pass = None;
        // Content of a removed element that was never closed: filter it
        // again as ordinary HTML (it follows the removed start tag).
        let mut rounds = 0;
        while let Some(rest) = again.take() {
            if rest.is_empty() {
                break;
            }
            rounds += 1;
            if rounds > MAX_REFILTER {
                self.report.dropped_bytes += rest.len();
                break;
            }
            let mut pass = Pass::new(self.limits, self.bypass);
            let out = pass.write(&rest);
            self.net.push(&out, &mut bytes);
            let (out, next) = pass.end(&mut self.report);
            self.net.push(&out, &mut bytes);
            again = next;
        }
        self.net.finish(&mut bytes);
        self.report.escaped += self.net.report.escaped;
        self.report.stray_end_tags = self.net.report.stray;
        let mut text = self.text(bytes);
        if !self.tail.is_empty() {
            text.push_str(&String::from_utf8_lossy(&std::mem::take(&mut self.tail)));
        }
        self.code.push(&mut text, true);
        // Breaks in code are the net's count, but were dropped again.
        self.report.neutralised = self.net.report.neutralised.saturating_sub(self.code.dropped_breaks());
        // A long span usually passes the limit on both sides: counted once.
        self.report.long_code_spans = self.code_in.long_spans().max(self.code.long_spans());
        text
    }

    /// What was removed or changed (complete after [`HtmlFilter::finish`]).
    pub fn report(&self) -> &FilterReport {
        &self.report
    }

    /// Takes the report out (what [`HtmlFilter::report`] shows), leaving an
    /// empty one.
    pub fn take_report(&mut self) -> FilterReport {
        std::mem::take(&mut self.report)
    }

    /// Turns output bytes into text, keeping an unfinished UTF-8 character
    /// for the next call.
    fn text(&mut self, bytes: Vec<u8>) -> String {
        let all = if self.tail.is_empty() {
            bytes
        } else {
            let mut all = std::mem::take(&mut self.tail);
            all.extend_from_slice(&bytes);
            all
        };
        // One validation in the common case (whole characters).
        match String::from_utf8(all) {
            Ok(text) => text,
            Err(e) => {
                let error = e.utf8_error();
                let mut all = e.into_bytes();
                if error.error_len().is_some() {
                    return String::from_utf8_lossy(&all).into_owned();
                }
                self.tail = all.split_off(error.valid_up_to());
                String::from_utf8(all).unwrap_or_default()
            }
        }
    }
}

/// Filters a whole text at once.
///
/// ```
/// let safe = spindle::payload::html::sanitize("<b onclick=\"x()\">hi</b><script>bad()</script>");
/// assert_eq!(safe.html, "<b>hi</b>");
/// ```
pub fn sanitize(text: &str) -> Sanitized {
    let mut filter = HtmlFilter::new();
    let mut text = text.to_string();
    filter.code_in.push(&mut text, true);
    // One buffer from the first pass to the end: a large text is not
    // copied again to append the end.
    let bytes = filter.filter_bytes(text.as_bytes());
    let html = filter.finish_after(bytes);
    Sanitized { html, report: filter.report }
}

/// The result of [`sanitize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sanitized {
    /// The filtered text.
    pub html: String,
    /// What was changed.
    pub report: FilterReport,
}

/// Filters `text` in pieces of `chunk` bytes (widened to character
/// boundaries), with or without the bypass.
#[cfg(any(test, feature = "testing"))]
fn filter_by(bypass: Bypass, text: &str, chunk: usize) -> (String, FilterReport) {
    let mut f = HtmlFilter::with_bypass(FilterLimits::default(), bypass);
    let mut out = String::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + chunk.max(1)).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push_str(&f.push_owned(text[start..end].to_string()));
        start = end;
    }
    out.push_str(&f.finish());
    (out, f.report().clone())
}

/// The filter's self-check for the fuzz targets (`crate::check`) and its
/// tests: `text` whole and in pieces of `chunk` bytes, with runs bypassing
/// the rewriter, must give what the rewriter alone gives the whole text. A
/// description of the first difference.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn bypass_disagreement(text: &str, chunk: usize) -> Option<String> {
    let want = filter_by(Bypass::Never, text, usize::MAX);
    for (bypass, size) in [(Bypass::Runs, usize::MAX), (Bypass::Runs, chunk), (Bypass::Never, chunk)] {
        let got = filter_by(bypass, text, size);
        if got != want {
            return Some(format!("{bypass:?} at chunk {size}: {got:?} where the rewriter alone gives {want:?}"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter_with(limits: FilterLimits, text: &str, chunk: usize) -> (String, FilterReport) {
        let mut f = HtmlFilter::with_limits(limits);
        let mut out = String::new();
        let mut start = 0;
        while start < text.len() {
            let mut end = (start + chunk).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            out.push_str(&f.push(&text[start..end]));
            start = end;
        }
        out.push_str(&f.finish());
        (out, f.report().clone())
    }

    /// A tag closer fed `input` in pieces of `chunk` bytes, and its output
    /// (without `finish`).
    fn close_in_pieces(input: &str, chunk: usize) -> (TagCloser, Vec<u8>) {
        let mut c = TagCloser::new(FilterLimits::default().max_held_tag);
        let mut out = Vec::new();
        for piece in input.as_bytes().chunks(chunk.min(input.len().max(1))) {
            c.transform(piece, &mut out);
        }
        (c, out)
    }

    /// A held tag shown as text is read again, and may leave a tag's name
    /// being read, which the byte that settled the held tag then ends (a
    /// fuzz find: that byte passed without ending it, and the runs that
    /// bypass the rewriter then disagreed with it).
    #[test]
    fn the_byte_that_settles_a_held_tag_ends_the_name_read_again() {
        let text = "\u{fffd}<cg<span style=\"2<AC=\"2<<\0 yle=>\u{1}le=>\u{1}ontent>]\n\n\n";
        for chunk in 1..17 {
            assert_eq!(bypass_disagreement(text, chunk), None, "chunk {chunk}");
        }
    }

    #[test]
    fn tag_closer_cases() {
        let table: &[(&str, &str)] = &[
            ("<iframe src=x <b>", "<iframe src=x ><b>"),
            ("<img src=\"a<b\">", "<img src=\"a<b\">"),
            ("<img alt='<b>' <i>", "<img alt='<b>' ><i>"),
            ("<script>if (a<b) x</script><b>", "<script>if (a<b) x</script><b>"),
            ("<!-- <b x <i -->", "<!-- <b x <i -->"),
            ("<user> and </user>", "&#60;user> and &#60;/user>"),
            ("<User-Name x=1>", "&#60;User-Name x=1>"),
            ("a < b << c <3", "a &#60; b &#60;&#60; c &#60;3"),
            ("x<<<<<y", "x&#60;&#60;&#60;&#60;<y"),
            ("<!-- a <b x - -- y --><i>", "<!-- a <b x - -- y --><i>"),
            ("<? a <b ><i>", "<? a <b ><i>"),
            ("<script>a <b x</script><i>", "<script>a <b x</script><i>"),
            ("<textarea><b x </textarea ><i", "<textarea><b x </textarea ><i"),
            ("x<<<< <<3", "x&#60;&#60;&#60;&#60; &#60;&#60;3"),
            ("<<<<b>t</b>", "&#60;&#60;&#60;<b>t</b>"),
            ("<<<</b>", "&#60;&#60;&#60;</b>"),
            ("<<<<", "&#60;&#60;&#60;<"),
            ("<b", "<b"),
            ("<averyveryverylongtagnamethatisnothtmlatall>", "&#60;averyveryverylongtagnamethatisnothtmlatall>"),
            ("<B>x</SPAN><H1><user>", "<B>x</SPAN><H1>&#60;user>"),
            ("<script><b></script><b>", "<script><b></script><b>"),
        ];
        for (input, want) in table {
            for chunk in [usize::MAX, 1, 3] {
                let (mut c, mut out) = close_in_pieces(input, chunk);
                c.finish(&mut out);
                assert_eq!(String::from_utf8_lossy(&out), *want, "{input} at {chunk}");
            }
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// Whole tags read in one go (`TagCloser::simple_tag`) give the
        /// output and leave the state that the byte-wise steps give (a
        /// piece of one byte never holds a whole tag).
        #[test]
        fn whole_simple_tags_match_the_steps(
            parts in proptest::collection::vec(prop_oneof![
                Just("<b>"), Just("</b>"), Just("<SPAN>"), Just("</span >"), Just("<script>"), Just("</script>"),
                Just("<textarea>"), Just("<user>"), Just("</User>"), Just("<br/>"), Just("<p2>"), Just("<h1>"),
                Just("<"), Just(">"), Just("/"), Just("!--"), Just("-->"), Just(" "), Just("x"), Just("\""),
                Just("<b x='1'>"), Just("<aaaaaaaaaaaaaaaa>"), Just("<aaaaaaaaaaaaaaaaa>"), Just("<plaintext>"),
                Just("<svg>"), Just("</math>"), Just("<MATH>"),
            ], 0..24),
        ) {
            let text = parts.concat();
            let mut whole = TagCloser::new(FilterLimits::default().max_held_tag);
            let mut whole_out = Vec::new();
            whole.transform(text.as_bytes(), &mut whole_out);
            let mut steps = TagCloser::new(FilterLimits::default().max_held_tag);
            let mut steps_out = Vec::new();
            for b in text.as_bytes().chunks(1) {
                steps.transform(b, &mut steps_out);
            }
            prop_assert_eq!(&whole_out, &steps_out);
            prop_assert_eq!(whole.state, steps.state);
            prop_assert_eq!(&whole.pending, &steps.pending);
            prop_assert_eq!(&whole.held, &steps.held);
            prop_assert_eq!((whole.raw, whole.escaped, whole.mirror), (steps.raw, steps.escaped, steps.mirror));
            // Which kind of tag is being read matters only while one is
            // (a whole tag leaves no trace of it).
            if whole.in_tag() {
                prop_assert_eq!(whole.end_tag, steps.end_tag);
            }
            prop_assert_eq!(&whole.text_tags, &steps.text_tags);
        }
    }

    #[test]
    fn comments_end_where_the_tokenizer_ends_them() {
        let table: &[(&str, Pre)] = &[
            ("<!---->", Pre::Text),
            ("<!-->", Pre::Text),
            ("<!--->", Pre::Text),
            ("<!-- a --!>", Pre::Text),
            ("<!-- a <!-->", Pre::Text),
            ("<!-- a <!--->", Pre::Text),
            ("<!-- a ---->", Pre::Text),
            ("<!-- a -- >", Pre::Comment),
            ("<!-- a --!x>", Pre::Comment),
            ("<!-- a <!-x>", Pre::Comment),
            ("<!-- a <>", Pre::Comment),
            ("<!-x>", Pre::Text),
            ("<!DOCTYPE a \"", Pre::Bogus),
        ];
        for (input, want) in table {
            for chunk in [usize::MAX, 1] {
                let (c, out) = close_in_pieces(input, chunk);
                assert_eq!(c.state, *want, "{input} at {chunk}");
                assert_eq!(out, input.as_bytes(), "{input} at {chunk}");
            }
        }
    }

    #[test]
    fn runs_bypass_the_rewriter() {
        let table: &[(&str, &str)] = &[
            // Never a rewriter: every tag is a balanced kept tag.
            ("a <b>b</b> <i><em>c</em></i><br>d", "a <b>b</b> <i><em>c</em></i><br>d"),
            // Spans whose style is kept as written are carried too.
            ("<b>x <span style=\"color: red\">y</span></b>", "<b>x <span style=\"color: red\">y</span></b>"),
            (
                "a <SPAN STYLE='font-family: \"Noto Serif\"'>b</span>",
                "a <SPAN STYLE='font-family: \"Noto Serif\"'>b</span>",
            ),
            // Other styles and attributes go through the rewriter.
            ("a <span style=\"color: red; position: fixed\">b</span>", "a <span style=\"color: red\">b</span>"),
            ("a <span style=\"color: &#114;ed\">b</span>", "a <span style=\"color: red\">b</span>"),
            ("a <span style=\" ; \">b</span>", "a <span>b</span>"),
            ("a <span style=\"color: red\" title=t>b</span>", "a <span style=\"color: red\">b</span>"),
            ("a <span style=color:red>b</span>", "a <span style=color:red>b</span>"),
            // Elements a run leaves open are shown to the rewriter before
            // what follows: its stack holds them, as if it had read them.
            ("<b>x <span style=\"color: red\">y</b>", "<b>x <span style=\"color: red\">y</b>"),
            ("<b>a<svg>c</b>d</svg>e", "<b>ad&#8203;e"),
            ("<span style=\"color: red\">a<p>b</span>c</p>", "<span style=\"color: red\">abc&#8203;"),
            // An end tag of an element opened before the run.
            ("<span title=t><b>x</b></span>z", "<span><b>x</b></span>z"),
            // A removed element open around kept tags.
            ("<svg><b>x</b></svg>y<b>z</b>", "y<b>z</b>"),
            ("<script><b></b></script><B>q</B>", "<B>q</B>"),
            // `</b>` inside the removed element still finds the `<b>`
            // opened before it (ending the removal, as the rewriter's
            // stack pops); the `</svg>` after it is stray.
            ("<b onclick=x>a<svg>c</b>d</svg>e", "<b>ad&#8203;e"),
            // Comments are removed without the rewriter, wherever the
            // tokenizer ends them; one never closed is removed to the end.
            ("a <!-- c --> b<b>d</b>", "a  b<b>d</b>"),
            ("a<!-->b<!-- x --!>c<!--->d", "abcd"),
            ("a<!-- <b>x</b> -- >", "a"),
        ];
        for (input, want) in table {
            for chunk in [usize::MAX, 1, 4] {
                let (out, report) = filter_by(Bypass::Runs, input, chunk);
                assert_eq!(out, *want, "{input} at {chunk}");
                assert_eq!(report.comments, input.matches("<!--").count(), "{input} at {chunk}");
                assert_eq!((out, report), filter_by(Bypass::Never, input, chunk), "{input} at {chunk}");
            }
        }
        // `<!--` inside a comment, then `>`, ends it.
        let (out, report) = filter_by(Bypass::Runs, "a<!-- b <!-->c", 1);
        assert_eq!((out.as_str(), report.comments), ("ac", 1));
    }

    /// The bundled transcripts, whole and at two splits: the bypass gives
    /// the output and report of the rewriter alone, on real role-play
    /// markup.
    #[test]
    fn the_bypass_changes_nothing_on_the_transcripts() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = 0;
        for dir in ["corpora", "tests/data"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                if !text.contains('<') {
                    continue;
                }
                files += 1;
                for chunk in [3, 61] {
                    if let Some(why) = bypass_disagreement(&text, chunk) {
                        panic!("{}: {why}", path.display());
                    }
                }
            }
        }
        assert!(files > 50, "only {files} transcripts found");
    }

    #[test]
    fn styled_role_play_markup_builds_no_rewriter() {
        let text = "<span style=\"color: #c00\">She nods</span> and <b>steps</b> closer.<br>\
                    <span style='font-style: italic; color: rgb(90, 90, 90)'>(quietly)</span>";
        for chunk in [usize::MAX, 1, 7] {
            let mut f = HtmlFilter::new();
            let mut out = String::new();
            let mut start = 0;
            while start < text.len() {
                let end = (start + chunk).min(text.len());
                out.push_str(&f.push(&text[start..end]));
                start = end;
            }
            let built = f.pass.as_ref().is_some_and(|p| !matches!(p.rewriter, Rewriting::Waiting));
            out.push_str(&f.finish());
            assert!(!built, "styled role-play markup needs no rewriter, at {chunk}");
            assert_eq!(out, text, "at {chunk}");
            assert!(f.report().is_clean(), "at {chunk}");
        }
        assert_eq!(styled_span(b"<span style=\"color: red\">"), Some(25));
        for tag in [
            "<span style=\"\">",
            "<span style=\"color: red\"",
            "<span style=\"color: red\" >",
            "<span style = \"color: red\">",
            "<span style=\"color: url(x)\">",
            "<span style=\"color: &quot;\">",
            "<span style=\"color: red'>",
            "<spanx style=\"color: red\">",
        ] {
            assert_eq!(styled_span(tag.as_bytes()), None, "{tag}");
        }
    }

    proptest! {
        /// Balanced runs that bypass the rewriter change nothing: the same
        /// output and report as a filter that feeds every byte to it, at
        /// any split. And the output, filtered again, is unchanged.
        #[test]
        fn the_bypass_changes_nothing(
            parts in proptest::collection::vec(prop_oneof![
                Just("<b>"), Just("</b>"), Just("<I>"), Just("</i>"), Just("<br>"), Just("</br>"), Just("<span>"),
                Just("</span>"), Just("<span style=\"color: red\">"), Just("<b onclick=x>"), Just("<ruby>"),
                Just("<rt>"), Just("</ruby>"), Just("<svg>"), Just("</svg>"), Just("<svg/>"), Just("<script>"),
                Just("</script>"), Just("<textarea>"), Just("</textarea>"), Just("<user>"), Just("</p>"), Just("<p>"),
                Just("<!-- c -->"), Just("<!--"), Just("-->"), Just("<"), Just(">"), Just("&"), Just("&amp;"),
                Just("&lt;"), Just(" "), Just("text"), Just("\u{3000}\u{300c}"), Just("javascript:"), Just("<math>"),
                Just("</math>"), Just("<strong>"), Just("</strong>"), Just("<img src=x onerror=y>"), Just("\""),
                Just("<!-->"), Just("<!--->"), Just("--!>"), Just("<!--<!-->"), Just("<!DOCTYPE x \">\">"),
                Just("<?x>"), Just("</>"), Just("<![CDATA["), Just("]]>"), Just("<foreignObject>"),
                Just("<noscript>"), Just("<xmp>"), Just("</xmp>"), Just("<b x='>'>"), Just("-"), Just("!"),
                Just("<SPAN STYLE='font-family: \"x y\", serif'>"), Just("<span style=\"color: url(x)\">"),
                Just("<span style=\"color: &#114;ed\">"), Just("<span style=\" ; \">"), Just("<span style=\""),
                Just("<span style='color: red; position: fixed'>"), Just("<span style=\"font-size: 1.2em\" id=x>"),
                Just("color: red\">"), Just("'"), Just("<span style=\"color:red;\">"), Just("<span style=>"),
                Just("<SPAN S='"), Just("<span style=\";\">"),
            ], 0..28),
            chunk in prop_oneof![1usize..12, 60usize..200],
        ) {
            let text = parts.concat();
            let whole = sanitize(&text);
            // Its output is its own fixed point.
            prop_assert_eq!(&sanitize(&whole.html).html, &whole.html);
            prop_assert_eq!(&(whole.html, whole.report), &filter_by(Bypass::Never, &text, usize::MAX));
            let disagreement = bypass_disagreement(&text, chunk);
            prop_assert!(disagreement.is_none(), "{}", disagreement.unwrap_or_default());
        }
    }

    #[test]
    fn a_tag_past_the_tokenizer_limit_degrades_to_escaping() {
        let limits = FilterLimits { max_held: 1024, max_tokenizer: 4096, ..FilterLimits::default() };
        let text = format!("ok <b>b</b> <span title=\"{}\">x</span> <i>i</i>", "y".repeat(20_000));
        let (out, report) = filter_with(limits, &text, 512);
        assert!(report.degraded.is_some(), "{report:?}");
        assert!(out.starts_with("ok <b>b</b> "), "{}", &out[..40.min(out.len())]);
        assert!(out.contains("&lt;span title="), "the broken tag is shown as text");
        assert!(out.ends_with("x</span> <i>i</i>"));
        assert!(!report.summary().is_empty());
    }

    #[test]
    fn unclosed_removed_elements_past_the_hold_limit_are_dropped_and_reported() {
        let limits = FilterLimits { max_held: 100, max_tokenizer: 1 << 20, ..FilterLimits::default() };
        let (out, report) = filter_with(limits, &format!("a <svg>{}", "z".repeat(500)), 7);
        assert_eq!(out, "a ");
        assert!(report.dropped_bytes >= 400, "{report:?}");
        // Within the limit the text after an unclosed removed element is
        // filtered again.
        let (out, report) = filter_with(FilterLimits::default(), "a <svg> b <b>c</b>", 2);
        assert_eq!(out, "a  b <b>c</b>");
        assert_eq!(report.unclosed, ["<svg>"]);
    }

    #[test]
    fn nested_unclosed_removed_elements_terminate() {
        // Each round of filtering again peels one unclosed <svg>; after
        // MAX_REFILTER rounds the rest is dropped, and the report says so.
        let text = "<svg>".repeat(5000) + "<b>end</b>";
        let (out, report) = filter_with(FilterLimits::default(), &text, 64);
        assert_eq!(out, "");
        assert_eq!(report.unclosed.len(), MAX_REFILTER + 1);
        assert_eq!(report.dropped_bytes, (5000 - MAX_REFILTER - 1) * 5 + "<b>end</b>".len());
        // A few nested ones are all peeled.
        let (out, _) = filter_with(FilterLimits::default(), "<svg><svg><svg><b>end</b>", 3);
        assert_eq!(out, "<b>end</b>");
    }

    #[test]
    fn held_tags_and_code_spans_past_their_limits_degrade_and_are_reported() {
        // Within the held-tag limit, `a<b` followed by words is text.
        let text = "when a<b c=\"a long quoted value\" and d>e";
        for chunk in [1, 3, usize::MAX] {
            let (out, report) = filter_with(FilterLimits::default(), text, chunk);
            assert_eq!(out, "when a&lt;b c=\"a long quoted value\" and d>e");
            assert_eq!(report.long_tags, 0);
        }
        // Past it, the tag is markup (its "attributes" filtered) and the
        // report says so.
        let limits = FilterLimits { max_held_tag: 8, ..FilterLimits::default() };
        for chunk in [1, 3, usize::MAX] {
            let (out, report) = filter_with(limits, text, chunk);
            assert_eq!(out, "when a<b>e", "chunk {chunk}");
            assert_eq!(report.long_tags, 1);
            assert!(report.summary().contains("1 start tag(s) past the held-tag limit"), "{}", report.summary());
        }
        // A code span's `<` is written back within the span limit, and
        // stays escaped past it.
        let text = "see `Vec<u8> and more words` here";
        let (out, report) = filter_with(FilterLimits::default(), text, 2);
        assert_eq!(out, text);
        assert_eq!(report.long_code_spans, 0);
        let limits = FilterLimits { max_code_span: 10, ..FilterLimits::default() };
        for chunk in [1, 2, usize::MAX] {
            let (out, report) = filter_with(limits, text, chunk);
            assert_eq!(out, "see `Vec&lt;u8> and more words` here", "chunk {chunk}");
            assert_eq!(report.long_code_spans, 1);
            assert!(report.summary().contains("1 code span(s) past the hold limit"), "{}", report.summary());
        }
    }
}
