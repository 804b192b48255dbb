//! Payloads: typed views of elements, built the moment an element
//! completes (or, for those that depend on the element alone, when the
//! caller asks: [`Payloads::OnDemand`]), and the per-element streaming
//! transforms of deltas (HTML filtering of content, thought extraction from
//! ATTP).
//!
//! This module owns the `Stage` that sits between the machine and the
//! caller: it sees every event in order, keeps per-element state for
//! streaming bodies, and fills `payload` on `element` events. It must not
//! change structure (which elements exist, where they start and end): that
//! is the machine's. The tool-call bodies (TAM, ACTION, ATTP) are parsed by
//! [`crate::calls`]; this stage only dispatches to it.
//!
//! # Payloads (DESIGN §6)
//!
//! | tag | payload |
//! | --- | --- |
//! | `content` (and the registry's default stream tag) | `{html, comments}`; see below |
//! | `variable_update` (`state_update`, `UpdateVariable`) | `{analysis, ops: [[OP, path, value?]..], invalid: [{index, op, error}..]}` |
//! | `tool_call` | `{name, arguments}` |
//! | `ui_component` | `{view, props}` |
//! | `media` | `{type, src, alt}` |
//! | `choice` (`xx`) | `{prompt, options: [{id, label}..]}` |
//! | `details` | `{summary, body}`: the summary's text, the body filtered as content's HTML is |
//! | `status_bar` | ordered object of child tag to value (nested objects, `@attr`, `#text`, repeated tags as arrays) |
//! | `thought` | `null` |
//! | other registry tags | `{attrs, children}` (`{attrs, value}` for JSON bodies, `{attrs, text}` for raw ones) |
//! | TAM, ACTION, ATTP bodies | [`crate::calls`] |
//!
//! JSON objects keep the order the model wrote their keys in (`serde_json`'s
//! `preserve_order`).
//!
//! # Content
//!
//! A content element's `text` stays the raw inner text (DESIGN §5). Its
//! `delta` events carry the *filtered* text instead: comments removed and
//! inline HTML reduced to the spec 003 §3.1.3 allowlist by
//! [`html::HtmlFilter`], incrementally, so a UI can show deltas as they
//! come. Joined, the deltas equal `payload.html`, whatever the chunking.
//! Deltas that filter to nothing are not emitted. Comments arrive as their
//! own `comment` events; `payload.comments` lists the bodies of the
//! element's comments in order.
//!
//! The lead that bare text at the start opened (a thought) streams its
//! deltas under the lead tag. When the machine reclassifies it into
//! content (a `reclassified` repair: the text turned out not to be a
//! thought), the text streamed so far (as much as the element keeps) comes
//! again right after the repair, as one filtered content delta, and the
//! rest streams as content: the content deltas of that element, joined,
//! equal its `payload.html` too. Another element reclassified into content
//! streamed its deltas unfiltered under its first tag; show its
//! `payload.html` instead.
//!
//! # When a body cannot be read
//!
//! Leniencies used to read JSON are reported as `json_<leniency>` warnings
//! on the element. When even lenient reading fails, the payload is
//! `{"error": "..."}` (with whatever was understood, e.g. `analysis`), an
//! error `payload_unparsable` diagnostic follows, and when the tag's
//! registry entry has `fallback_to_content`, a `fallback_to_content` repair
//! carries the element's text, filtered as content, in its `text` field for
//! the UI to show (spec 003 §11.4). An element cut at the element size limit
//! (`truncated: true`) is not parsed: it gets an error payload and a
//! `payload_truncated` diagnostic.
//!
//! # Example
//!
//! ```
//! use spindle::{Event, Registry};
//!
//! let events = spindle::parse(Registry::filament(), br#"<content>Hi <b>you</b><script>x()</script></content>
//! <variable_update>```json
//! [["set", "mood", "happy"], ["ADD", "hp", 5],]
//! ```</variable_update>"#);
//! let payload = |tag: &str| events.iter().filter_map(Event::as_element).find(|e| &*e.tag == tag).map(|e| e.payload.clone());
//! assert_eq!(payload("content").unwrap()["html"], "Hi <b>you</b>");
//! assert_eq!(payload("variable_update").unwrap()["ops"], serde_json::json!([["SET", "mood", "happy"], ["ADD", "hp", 5]]));
//! ```

mod code;
pub mod html;
pub mod json;
mod kinds;
#[cfg(feature = "proxy")]
pub(crate) use kinds::is_markup_call;
mod net;
mod style;
mod tree;
mod variable;

use crate::event::DiagnosticCode;
use crate::event::{Delta, Diagnostic, Element, Event, Level, Open, Repair, RepairKind};
use crate::machine::TagLog;
use crate::registry::{BodyKind, LeadOpen, Registry, TagId, TagSpec};
use serde_json::{Value, json};
use std::sync::Arc;

pub use crate::event::Payload;

/// When the parser builds the typed payloads of completed elements
/// ([`crate::ParserOptions::payloads`]).
///
/// Building payloads is most of what a markup-dense response costs (the
/// child trees of `status_bar` and `choice`, the JSON of
/// `variable_update`): a caller that reads few of them can leave them for
/// later and build only those it reads, with [`build_deferred`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Payloads {
    /// Every `element` event carries its payload; the payload's
    /// diagnostics (and a `fallback_to_content` repair) follow it in the
    /// stream.
    #[default]
    Eager,
    /// The payloads that depend on the element alone (the Filament tags
    /// `variable_update`, `status_bar`, `choice`, `details`,
    /// `ui_component`, `media`, and the registry's custom tags) are left
    /// `null`, and the events that would have followed the element with
    /// them are not emitted: [`build_deferred`] gives both, exactly as the
    /// stream would have. Content (its HTML is filtered as it streams),
    /// `thought`, `tool_call` (its arguments stream as `call_delta`) and
    /// the TAM, ACTION and ATTP calls (they depend on the text before
    /// them) are built as they are eagerly.
    OnDemand,
}

/// A payload that [`Payloads::OnDemand`] left for later, built: what the
/// stream would have carried with the element.
#[derive(Debug, Clone, PartialEq)]
pub struct DeferredPayload {
    /// The element's payload.
    pub value: Value,
    /// The events that would have followed the `element` event: a
    /// `fallback_to_content` repair when the body could not be read and
    /// the tag falls back, then the payload's diagnostics (each with the
    /// element's id and tag).
    pub events: Vec<Event>,
}

/// Builds the payload of an element whose payload [`Payloads::OnDemand`]
/// left `null`, with the repair and diagnostics that would have followed
/// it; `None` for an element whose payload is never deferred (content,
/// `thought`, calls) or whose tag `registry` does not know. `registry` is
/// the parser's.
///
/// ```
/// use spindle::payload::{Payloads, build_deferred};
/// use spindle::{Event, Parser, ParserOptions, Registry};
/// use std::sync::Arc;
///
/// let registry = Arc::new(Registry::filament());
/// let options = ParserOptions { payloads: Payloads::OnDemand, ..ParserOptions::default() };
/// let mut parser = Parser::with_options(registry.clone(), options);
/// let mut events = parser.feed(b"<status_bar><hp>41/60</hp></status_bar><content>Hi</content>");
/// events.extend(parser.finish());
/// let bar = events.iter().filter_map(Event::as_element).find(|e| &*e.tag == "status_bar").unwrap();
/// assert!(bar.payload.is_null());
/// let built = build_deferred(&registry, bar).unwrap();
/// assert_eq!(built.value, serde_json::json!({"hp": "41/60"}));
/// assert!(built.events.is_empty());
/// ```
pub fn build_deferred(registry: &Registry, element: &Element) -> Option<DeferredPayload> {
    let spec = registry.lookup(element.tag.as_bytes()).map(|id| registry.tag(id))?;
    if !deferrable(registry, spec) {
        return None;
    }
    let mut events = Vec::new();
    let value = trailing_events(element, Some(spec), filament_payload(spec, element), &mut events);
    Some(DeferredPayload { value, events })
}

/// Whether [`Payloads::OnDemand`] leaves the payload of `spec`'s elements
/// for later: those built from the element alone.
fn deferrable(registry: &Registry, spec: &TagSpec) -> bool {
    !matches!(spec.body, BodyKind::Tam | BodyKind::Action | BodyKind::Attp)
        && !is_call_tag(&spec.name)
        && spec.name != THOUGHT
        && !is_content_tag(registry, &spec.name)
}

/// Whether `tag` is filtered as content: `content`, or the registry's
/// default tag when it streams.
fn is_content_tag(registry: &Registry, tag: &str) -> bool {
    tag == "content"
        || registry
            .default_tag()
            .map(|id| registry.tag(id))
            .is_some_and(|spec| spec.body == BodyKind::Stream && spec.name == tag)
}

/// Sets out what follows an element with `payload`: pushes the
/// `fallback_to_content` repair (when the body could not be read and the
/// tag falls back) and the payload's diagnostics (with the element's id
/// and tag) to `out`; returns the payload's value.
fn trailing_events(el: &Element, spec: Option<&TagSpec>, payload: Payload, out: &mut Vec<Event>) -> Value {
    if payload.failed && spec.is_some_and(|spec| spec.fallback_to_content) {
        out.push(Event::Repair(Box::new(Repair {
            kind: RepairKind::FallbackToContent,
            tag: Some(el.tag.clone()),
            at: el.span.start,
            element: Some(el.id),
            span: None,
            from: None,
            text: Some(html::sanitize(&el.text).html),
        })));
    }
    for mut d in payload.diagnostics {
        d.element.get_or_insert(el.id);
        d.tag.get_or_insert_with(|| el.tag.clone());
        out.push(Event::Diagnostic(d));
    }
    payload.value
}

/// A diagnostic without a place; the stage fills in the element and tag.
pub(crate) fn diag(level: Level, code: DiagnosticCode, message: &str) -> Diagnostic {
    Diagnostic { level, code, tag: None, element: None, at: None, message: message.into() }
}

/// Reads a JSON body leniently, reporting each leniency used. `base` is the
/// offset of `text` in the element's text, for messages.
pub(crate) fn read_json(text: &str, base: usize, diagnostics: &mut Vec<Diagnostic>) -> Result<Value, json::JsonError> {
    match json::parse(text) {
        Ok(read) => {
            diagnostics.extend(leniency_diagnostics(&read.leniencies, base));
            Ok(read.value)
        }
        Err(mut e) => {
            e.at += base;
            Err(e)
        }
    }
}

/// One `json_<leniency>` warning per leniency kind used.
pub(crate) fn leniency_diagnostics(used: &[json::Used], base: usize) -> Vec<Diagnostic> {
    used.iter()
        .map(|u| {
            let times = if u.count > 1 { format!(", {} times", u.count) } else { String::new() };
            diag(
                Level::Warning,
                u.kind.code(),
                &format!(
                    "JSON read leniently: {} (first at byte {} of the element text{times})",
                    u.kind.describe(),
                    u.at + base
                ),
            )
        })
        .collect()
}

/// A child tag found by [`extract_child`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Child<'a> {
    /// The child's inner text.
    pub(crate) inner: &'a str,
    /// The parent's text without the child (borrowed when the child came
    /// first, as the spec writes it).
    pub(crate) rest: std::borrow::Cow<'a, str>,
    /// Where `rest` starts in the parent's text when the child came first
    /// (its offset after the child), else 0.
    pub(crate) rest_base: usize,
    /// Whether the child had its close tag.
    pub(crate) closed: bool,
}

/// Finds the first `<name ...>...</name>` child (case-insensitive, spaces
/// inside the brackets tolerated). An unclosed child ends where a JSON
/// document or an MVU call begins on a new line, or at the end.
pub(crate) fn extract_child<'a>(text: &'a str, name: &str) -> Option<Child<'a>> {
    let (open_start, open_end) = find_tag(text, 0, name, false)?;
    let self_closing = text[open_start..open_end].trim_end_matches('>').trim_end().ends_with('/');
    let found_close = if self_closing { Some((open_end, open_end)) } else { find_tag(text, open_end, name, true) };
    let (inner_end, rest_from, closed) = match found_close {
        Some((close_start, close_end)) => (close_start, close_end, true),
        None => {
            let mut at = open_end;
            let mut end = text.len();
            for line in text[open_end..].split_inclusive('\n') {
                let t = line.trim_start();
                if at > open_end && (t.starts_with(['[', '{']) || t.starts_with("```") || t.starts_with("_.")) {
                    end = at;
                    break;
                }
                at += line.len();
            }
            (end, end, false)
        }
    };
    let inner = &text[open_end..inner_end];
    let before = &text[..open_start];
    let after = &text[rest_from..];
    let rest_base = if before.trim().is_empty() { rest_from } else { 0 };
    let rest = if before.trim().is_empty() { after.into() } else { format!("{before}{after}").into() };
    Some(Child { inner, rest, rest_base, closed })
}

/// Finds `<name ...>` (or `</name>` when `close`) at or after `from`:
/// returns its start and end offsets.
fn find_tag(text: &str, from: usize, name: &str, close: bool) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut i = from;
    while let Some(rel) = text.get(i..)?.find('<') {
        let start = i + rel;
        let mut j = start + 1;
        let skip = |j: &mut usize| {
            while *j < bytes.len() && bytes[*j].is_ascii_whitespace() {
                *j += 1;
            }
        };
        skip(&mut j);
        let is_close = bytes.get(j) == Some(&b'/');
        if is_close {
            j += 1;
            skip(&mut j);
        }
        let name_ok = text.get(j..j + name.len()).is_some_and(|n| n.eq_ignore_ascii_case(name));
        let after = bytes.get(j + name.len()).copied();
        if is_close == close && name_ok && matches!(after, Some(b'>' | b'/' | b' ' | b'\t' | b'\n' | b'\r')) {
            let end = text[j..].find('>').map(|g| j + g + 1)?;
            return Some((start, end));
        }
        i = start + 1;
    }
    None
}

/// Streaming state of one open content element.
struct ContentState {
    filter: html::HtmlFilter,
    /// Filtered text so far (stops growing once the element passes the
    /// element size limit).
    html: String,
    /// Whether the element passed the size limit.
    truncated: bool,
    /// Whether the filter has been finished (at `close`).
    finished: bool,
}

impl std::fmt::Debug for ContentState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentState")
            .field("html_len", &self.html.len())
            .field("truncated", &self.truncated)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

/// Streaming state of one open element.
#[derive(Debug)]
enum BodyState {
    /// Deltas pass through unchanged.
    Plain,
    /// Content: deltas are filtered.
    Content(Box<ContentState>),
    /// ATTP: the raw TOML deltas become `thought` deltas carrying the
    /// `thought` string as it arrives (the element's text keeps the TOML).
    Attp(Box<crate::calls::attp::ThoughtStream>),
    /// A JSON tool call: the raw deltas become `call_delta` events (the
    /// name, then the arguments as they arrive).
    Call(Box<crate::calls::stream::ArgumentStream>, Kept),
    /// Another JSON body (ui_component): its raw deltas are not shown; the
    /// element carries the text.
    Quiet(Kept),
    /// The lead (thought) that bare text at the start opened, which may
    /// prove to be content: its deltas pass through, and its text is kept
    /// (as much as the element keeps) to be given again as content's
    /// deltas if it is reclassified, so that a content subscriber never
    /// misses an answer written without tags.
    Lead(Box<LeadText>),
}

/// The text of an implicitly opened lead, so far.
#[derive(Debug, Default)]
struct LeadText {
    text: String,
    /// It passed the element size limit: the rest is not kept.
    cut: bool,
}

/// Bytes of a JSON body seen so far, against the element size limit: what
/// passes the limit is not in the element's text, so it goes out as
/// `delta` events, as every non-streaming body's overflow does.
#[derive(Debug, Clone, Copy)]
struct Kept {
    seen: usize,
    limit: usize,
}

impl Kept {
    /// The part of `text` past the limit, if any.
    fn overflow<'t>(&mut self, text: &'t str) -> Option<&'t str> {
        let room = self.limit.saturating_sub(self.seen);
        self.seen += text.len();
        let mut cut = room.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        (cut < text.len()).then(|| &text[cut..])
    }
}

/// Per-element state kept between `open` and `element`.
#[derive(Debug)]
struct OpenState {
    /// The element's tag, as the machine decided it (at the open, then at
    /// a reclassification).
    tag: Option<TagId>,
    body: BodyState,
    /// Bodies of the element's comments, in order, as many as are listed.
    comments: Comments,
}

/// Most comments a content payload lists; each is in its own `comment`
/// event, listed or not.
const MAX_LISTED_COMMENTS: usize = 1024;

/// The comments a content payload lists: at most [`MAX_LISTED_COMMENTS`],
/// and no more bytes of them than the element size limit, so that content
/// of endless comments keeps a payload of bounded size.
#[derive(Debug, Default)]
struct Comments {
    listed: Vec<String>,
    bytes: usize,
    left_out: usize,
}

impl Comments {
    fn push(&mut self, text: &str, max_bytes: usize) {
        if self.listed.len() < MAX_LISTED_COMMENTS && self.bytes + text.len() <= max_bytes {
            self.bytes += text.len();
            self.listed.push(text.to_string());
        } else {
            self.left_out += 1;
        }
    }
}

/// The payload stage. One per parser.
#[derive(Debug)]
pub(crate) struct Stage {
    registry: Arc<Registry>,
    open: OpenStates,
    /// Context for tool-call payloads (the text before a call, repeated
    /// blocks, blocks cut off by the end of input).
    calls: crate::calls::CallTracker,
    /// The machine's element size limit (see [`Kept`]).
    max_element_len: usize,
    /// When payloads are built.
    payloads: Payloads,
    /// The limits of every content element's HTML filter.
    html: html::FilterLimits,
}

impl Stage {
    pub(crate) fn new(
        registry: Arc<Registry>,
        max_element_len: usize,
        html: html::FilterLimits,
        payloads: Payloads,
    ) -> Stage {
        Stage {
            calls: crate::calls::CallTracker::new(registry.clone()),
            registry,
            open: OpenStates::default(),
            max_element_len,
            payloads,
            html,
        }
    }

    fn kept(&self) -> Kept {
        Kept { seen: 0, limit: self.max_element_len }
    }

    fn is_content(&self, tag: &str) -> bool {
        is_content_tag(&self.registry, tag)
    }

    /// Whether a synthetic open of `tag` is the lead that bare text at the
    /// start opened and that may yet prove to be content (the chat
    /// template did not write its open tag, and it is not the default tag).
    fn may_be_reclassified(&self, tag: Option<TagId>) -> bool {
        let reg = &self.registry;
        tag == reg.lead() && reg.lead() != reg.default_tag() && reg.lead_open() != LeadOpen::Template
    }

    /// Transforms machine events into caller events.
    ///
    /// `tags` holds the tags the machine decided for the elements of these
    /// events (with each `open` and `reclassified`): the stage takes them
    /// there rather than looking names up again.
    pub(crate) fn process(&mut self, events: &mut Vec<Event>, tags: &mut TagLog, out: &mut Vec<Event>) {
        for mut event in events.drain(..) {
            // The most common events, text of content and of plain
            // elements, are filtered in place and moved on whole: no new
            // event is built (a copy of a fresh event stalls on its
            // just-written fields). Call tracking reads no delta.
            if let Event::Delta(d) = &mut event {
                match self.open.get_mut(&d.id).map(|s| &mut s.body) {
                    Some(BodyState::Content(c)) if !c.finished => {
                        c.filter.push_in_place(&mut d.text);
                        if !d.text.is_empty() {
                            if !c.truncated {
                                c.html.push_str(&d.text);
                            }
                            out.push(event);
                        }
                        continue;
                    }
                    Some(BodyState::Plain) | None => {
                        out.push(event);
                        continue;
                    }
                    Some(BodyState::Lead(lead)) => {
                        if !lead.cut {
                            let room = self.max_element_len.saturating_sub(lead.text.len());
                            let mut keep = room.min(d.text.len());
                            while !d.text.is_char_boundary(keep) {
                                keep -= 1;
                            }
                            lead.text.push_str(&d.text[..keep]);
                            lead.cut = keep < d.text.len();
                        }
                        out.push(event);
                        continue;
                    }
                    // The others become other deltas (below).
                    _ => {}
                }
            }
            // The tag of an ending element, as known since it opened.
            let ending = match &event {
                Event::Close(c) => self.open.get_mut(&c.id).map(|s| s.tag),
                Event::Element(e) => self.open.get_mut(&e.id).map(|s| s.tag),
                _ => None,
            };
            match ending {
                Some(tag) => self.calls.observe_tagged(&event, tag),
                None => self.calls.observe(&event),
            }
            match event {
                Event::Open(o) => {
                    let tag = tags.take(o.id).or_else(|| self.registry.lookup(o.tag.as_bytes()));
                    self.on_open(o, tag, out);
                }
                Event::Delta(d) => match self.open.get_mut(&d.id).map(|s| &mut s.body) {
                    Some(BodyState::Attp(thought)) => {
                        // The raw TOML deltas become the `thought` string's
                        // deltas (emitting both would interleave two streams
                        // in a chunking-dependent order); the element's text
                        // keeps the whole TOML.
                        let text = thought.feed(&d.text);
                        if !text.is_empty() {
                            out.push(Event::Delta(Delta { id: d.id, tag: THOUGHT.into(), text }));
                        }
                    }
                    Some(BodyState::Call(call, kept)) => {
                        // The call streams what the element keeps; text past
                        // the size limit goes on as plain deltas (each byte
                        // once, and no call state growing past the limit).
                        let rest = kept.overflow(&d.text).map(str::len).unwrap_or(0);
                        let (head, rest) = d.text.split_at(d.text.len() - rest);
                        if !head.is_empty() {
                            let piece = call.feed(head);
                            if !piece.is_empty() {
                                out.push(call_delta(d.id, &d.tag, piece));
                            }
                        }
                        if !rest.is_empty() {
                            out.push(Event::Delta(Delta { text: rest.to_string(), ..d }));
                        }
                    }
                    Some(BodyState::Quiet(kept)) => {
                        if let Some(rest) = kept.overflow(&d.text) {
                            out.push(Event::Delta(Delta { text: rest.to_string(), ..d }));
                        }
                    }
                    _ => out.push(Event::Delta(d)),
                },
                Event::Comment(c) => {
                    if let Some(state) = c.element.and_then(|id| self.open.get_mut(&id)) {
                        state.comments.push(&c.text, self.max_element_len);
                    }
                    out.push(Event::Comment(c));
                }
                Event::Diagnostic(d) => {
                    if d.code == DiagnosticCode::ElementTooLarge {
                        match d.element.and_then(|id| self.open.get_mut(&id)).map(|s| &mut s.body) {
                            Some(BodyState::Content(c)) => c.truncated = true,
                            Some(BodyState::Lead(lead)) => lead.cut = true,
                            _ => {}
                        }
                    }
                    out.push(Event::Diagnostic(d));
                }
                Event::Close(c) => {
                    if let Some(BodyState::Content(state)) = self.open.get_mut(&c.id).map(|s| &mut s.body) {
                        finish_content(state, c.id, &c.tag, out);
                    }
                    out.push(Event::Close(c));
                }
                Event::Element(el) => {
                    // An element seen without its open (none, in practice).
                    let decided = if self.open.get_mut(&el.id).is_some() { None } else { tags.take(el.id) };
                    self.element(el, decided, out);
                }
                Event::Repair(r) => {
                    // The element's tag changed: its payload follows the new
                    // tag.
                    if r.kind == RepairKind::Reclassified
                        && let Some(id) = r.element
                    {
                        let tag =
                            tags.take(id).or_else(|| r.tag.as_ref().and_then(|t| self.registry.lookup(t.as_bytes())));
                        let to_content = r.tag.as_ref().is_some_and(|t| self.is_content(t));
                        if let Some(state) = self.open.get_mut(&id) {
                            state.tag = tag;
                            if to_content && let BodyState::Lead(lead) = &mut state.body {
                                // The answer so far, again, as content's
                                // deltas (filtered); what follows is content.
                                let LeadText { text, cut } = std::mem::take(&mut **lead);
                                let mut content = ContentState {
                                    filter: html::HtmlFilter::with_limits(self.html),
                                    html: String::new(),
                                    truncated: cut,
                                    finished: false,
                                };
                                let mut text = text;
                                content.filter.push_in_place(&mut text);
                                // With room for what the filter still holds
                                // (most often a few bytes at the end): the
                                // last delta does not copy it all again.
                                content.html = String::with_capacity(text.len() + 256);
                                content.html.push_str(&text);
                                state.body = BodyState::Content(Box::new(content));
                                let name = r.tag.clone();
                                out.push(Event::Repair(r));
                                if let Some(tag) = name
                                    && !text.is_empty()
                                {
                                    out.push(Event::Delta(Delta { id, tag, text }));
                                }
                                continue;
                            }
                        }
                    }
                    out.push(Event::Repair(r));
                }
                other => out.push(other),
            }
        }
    }

    /// Starts the per-element state of an opening element.
    fn on_open(&mut self, o: Open, tag: Option<TagId>, out: &mut Vec<Event>) {
        let kind = tag.map(|id| self.registry.tag(id).body);
        let attp = kind == Some(BodyKind::Attp);
        let json = kind == Some(BodyKind::Json);
        let body = if attp {
            BodyState::Attp(Box::default())
        } else if json && is_call_tag(&o.tag) {
            let name = crate::calls::stream::NAME_KEYS.iter().find_map(|k| o.attrs.get(*k)).cloned();
            BodyState::Call(Box::new(crate::calls::stream::ArgumentStream::new(name)), self.kept())
        } else if json {
            BodyState::Quiet(self.kept())
        } else if o.synthetic && tag.is_some() && self.may_be_reclassified(tag) {
            BodyState::Lead(Box::default())
        } else if self.is_content(&o.tag) {
            BodyState::Content(Box::new(ContentState {
                filter: html::HtmlFilter::with_limits(self.html),
                html: String::new(),
                truncated: false,
                finished: false,
            }))
        } else {
            BodyState::Plain
        };
        self.open.insert(o.id, OpenState { tag, body, comments: Comments::default() });
        out.push(Event::Open(o));
    }

    /// Fills the payload of a completed element and emits it with its
    /// repairs and diagnostics.
    ///
    /// `decided` is the machine's tag for an element the stage saw no
    /// `open` of.
    fn element(&mut self, mut el: Box<Element>, decided: Option<TagId>, out: &mut Vec<Event>) {
        let mut state = self.open.remove(&el.id);
        if let Some(OpenState { body: BodyState::Attp(thought), .. }) = &mut state {
            let text = thought.finish();
            if !text.is_empty() {
                out.push(Event::Delta(Delta { id: el.id, tag: THOUGHT.into(), text }));
            }
        }
        // The tag as the machine decided it when the element opened (by
        // name only for an element the machine did not announce).
        let tag_id = match &state {
            Some(s) => s.tag,
            None => decided.or_else(|| self.registry.lookup(el.tag.as_bytes())),
        };
        let spec = tag_id.map(|id| self.registry.tag(id));
        let mut payload = if let Some(call) = self.calls.payload_tagged(&el, tag_id) {
            call
        } else if self.is_content(&el.tag) {
            let (body, comments) = match state.take() {
                Some(s) => (s.body, s.comments),
                None => (BodyState::Plain, Comments::default()),
            };
            content_payload(&el, body, comments, out)
        } else {
            match spec {
                Some(spec) if self.payloads == Payloads::OnDemand && deferrable(&self.registry, spec) => {
                    Payload::none()
                }
                Some(spec) => element_payload(spec, &el),
                None => Payload::none(),
            }
        };
        let failed = payload.failed;
        if let Some(OpenState { body: BodyState::Call(call, _), .. }) = &mut state
            && !failed
        {
            let name = payload.value.get("name").and_then(Value::as_str);
            let args = payload.value.get("arguments").unwrap_or(&Value::Null);
            let (piece, outcome) = call.finish(name, args);
            if !piece.is_empty() {
                out.push(call_delta(el.id, &el.tag, piece));
            }
            if outcome == crate::calls::stream::StreamOutcome::Differs {
                let mut d = diag(
                    Level::Warning,
                    DiagnosticCode::CallArgumentsStreamedDiffer,
                    "the arguments streamed as call_delta fragments are the text as written, which only the lenient reader accepts; the element's payload has the arguments as read",
                );
                d.element = Some(el.id);
                payload.diagnostics.push(d);
            }
        }
        // The element goes out first, what its payload brings after it (no
        // allocation when it brings nothing, the common case).
        let mut trailing = Vec::new();
        el.payload = trailing_events(&el, spec, payload, &mut trailing);
        out.push(Event::Element(el));
        out.append(&mut trailing);
    }
}

/// The tag of the deltas an ATTP element's `thought` string streams as.
const THOUGHT: &str = "thought";

/// Whether a JSON element is a tool call (its name and arguments stream).
fn is_call_tag(tag: &str) -> bool {
    tag == "tool_call"
}

fn call_delta(id: u32, tag: &crate::event::TagName, piece: crate::calls::stream::CallPiece) -> Event {
    Event::CallDelta(crate::event::CallDelta { id, tag: tag.clone(), name: piece.name, arguments: piece.arguments })
}

/// Finishes a content element's filter: the last filtered text goes out as
/// a delta.
fn finish_content(state: &mut ContentState, id: u32, tag: &crate::event::TagName, out: &mut Vec<Event>) {
    if state.finished {
        return;
    }
    state.finished = true;
    let text = state.filter.finish();
    if !text.is_empty() {
        if !state.truncated {
            state.html.push_str(&text);
        }
        out.push(Event::Delta(Delta { id, tag: tag.clone(), text }));
    }
}

/// `{html, comments}` for a content element (plus `truncated: true` when it
/// passed the size limit: `html` then covers the part that was kept).
fn content_payload(el: &Element, body: BodyState, comments: Comments, out: &mut Vec<Event>) -> Payload {
    let mut payload = Payload::none();
    let mut filtered = |report: &html::FilterReport| {
        if !report.is_clean_but_comments() {
            payload.diagnostics.push(diag(
                Level::Warning,
                DiagnosticCode::HtmlFiltered,
                &format!("content HTML filtered: {}", report.summary()),
            ));
        }
    };
    let html = match body {
        BodyState::Content(mut state) if !el.truncated => {
            finish_content(&mut state, el.id, &el.tag, out);
            // Read in place: the report goes with the filter.
            filtered(state.filter.report());
            std::mem::take(&mut state.html)
        }
        // Cut at the size limit: the streamed filter's output stopped
        // where the limit was noticed, which depends on how the input was
        // split; the kept text, filtered whole, does not.
        BodyState::Content(mut state) => {
            finish_content(&mut state, el.id, &el.tag, out);
            let s = html::sanitize(&el.text);
            filtered(&s.report);
            s.html
        }
        // Reclassified into content after streaming as another tag: filter
        // the whole text now.
        BodyState::Plain | BodyState::Lead(_) | BodyState::Attp(_) | BodyState::Call(..) | BodyState::Quiet(_) => {
            let s = html::sanitize(&el.text);
            filtered(&s.report);
            s.html
        }
    };
    if comments.left_out > 0 {
        payload.diagnostics.push(diag(
            Level::Warning,
            DiagnosticCode::PayloadTruncated,
            &format!(
                "payload.comments lists the first {} comments; {} more are left out of it (past {MAX_LISTED_COMMENTS} comments or the element size limit in bytes), each still in its comment event",
                comments.listed.len(),
                comments.left_out
            ),
        ));
    }
    let comments = Value::Array(comments.listed.into_iter().map(Value::String).collect());
    let mut value = object!([("html", Value::String(html)), ("comments", comments)]);
    if el.truncated
        && let Value::Object(map) = &mut value
    {
        map.insert("truncated".into(), Value::Bool(true));
    }
    payload.value = value;
    payload
}

/// The payload of a completed element, by body kind.
fn element_payload(spec: &TagSpec, el: &Element) -> Payload {
    match spec.body {
        BodyKind::Tam => crate::calls::tam_payload(el),
        BodyKind::Action => crate::calls::action_payload(el),
        BodyKind::Attp => crate::calls::attp_payload(el),
        _ => filament_payload(spec, el),
    }
}

/// The payloads of the Filament tags (spec 003 §3) and of custom tags.
fn filament_payload(spec: &TagSpec, el: &Element) -> Payload {
    if spec.name == "thought" {
        return Payload::none();
    }
    if el.truncated {
        return Payload {
            diagnostics: vec![diag(
                Level::Error,
                DiagnosticCode::PayloadTruncated,
                &format!(
                    "the <{}> element passed the element size limit ({} bytes kept); its payload was not parsed from a cut body",
                    spec.name,
                    el.text.len()
                ),
            )],
            value: json!({"error": "element too large: the body was cut at the element size limit and not parsed", "truncated": true}),
            failed: true,
        };
    }
    match spec.name.as_str() {
        "variable_update" => variable::variable_update(el),
        "tool_call" => kinds::tool_call(el),
        "ui_component" => kinds::ui_component(el),
        "media" => kinds::media(el),
        "choice" => kinds::choice(el),
        "details" => kinds::details(el),
        "status_bar" => kinds::status_bar(el),
        _ => kinds::custom(el, spec.body),
    }
}

pub(crate) use crate::shape::object;

/// The state of each open element, by id. Few elements are open at once
/// (one top-level element, in practice), so a vector searched from the
/// newest end beats hashing the id on every delta.
#[derive(Debug, Default)]
struct OpenStates(Vec<(u32, OpenState)>);

impl OpenStates {
    fn insert(&mut self, id: u32, state: OpenState) {
        self.remove(&id);
        self.0.push((id, state));
    }

    fn get_mut(&mut self, id: &u32) -> Option<&mut OpenState> {
        self.0.iter_mut().rev().find(|(k, _)| k == id).map(|(_, s)| s)
    }

    fn remove(&mut self, id: &u32) -> Option<OpenState> {
        let at = self.0.iter().rposition(|(k, _)| k == id)?;
        Some(self.0.remove(at).1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extract_child_cases() {
        let c = extract_child("<analysis>why</analysis>\n[1]", "analysis").unwrap_or_else(|| panic!("no child"));
        assert_eq!((c.inner, &*c.rest, c.closed), ("why", "\n[1]", true));
        assert_eq!(c.rest_base, 24);
        let c = extract_child("< Analysis >why</ analysis >[1]", "analysis").unwrap_or_else(|| panic!("no child"));
        assert_eq!((c.inner, &*c.rest), ("why", "[1]"));
        let c = extract_child("<analysis>\n- a\n- b\n[[\"SET\", \"x\", 1]]", "analysis")
            .unwrap_or_else(|| panic!("no child"));
        assert_eq!((c.inner, &*c.rest, c.closed), ("\n- a\n- b\n", "[[\"SET\", \"x\", 1]]", false));
        let c = extract_child("pre <summary>S</summary> post", "summary").unwrap_or_else(|| panic!("no child"));
        assert_eq!((c.inner, &*c.rest, c.rest_base), ("S", "pre  post", 0));
        assert!(extract_child("<analysisx>no</analysisx>", "analysis").is_none());
        let c = extract_child("<analysis/>[1]", "analysis").unwrap_or_else(|| panic!("no child"));
        assert_eq!(c.inner, "");
    }
}
