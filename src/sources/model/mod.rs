//! The chat-completions stream model: decoded SSE data (or parsed chunks)
//! in, [`SourceEvent`]s out.
//!
//! This module owns what the fields of a chunk mean: one spindle
//! [`Parser`] per choice for `delta.content`, `thought` elements for
//! reasoning deltas, `refusal` elements, `tool_call` elements assembled
//! from native tool-call fragments, finish reasons, usage, in-band errors,
//! `[DONE]` and truncation. It does no I/O and knows nothing of SSE framing
//! ([`super::sse`]) or HTTP ([`super::stream`], [`super::client`]).
//! The rules are documented on [`ChatStream`]. Other streaming dialects
//! (Anthropic Messages, OpenAI Responses, the Vercel AI SDK's UI stream,
//! Gemini, Ollama's own API, a Bedrock Converse response) are read into the
//! same choices by its child module `dialects`.

mod dialects;

pub(crate) use dialects::{is_converse, is_gemini, is_llama_cpp, is_ollama};

use super::chunk::{ChatChunk, Choice, Content, Delta, FunctionDelta, ToolCallDelta};
use super::events::{Channel, ChoiceEvent, ErrorOrigin, FinishReason, SourceEvent, Truncation};
use super::sse::SseLimits;
use crate::event::DiagnosticCode;
use crate::event::{AttrMap, Close, Diagnostic, Element, Event, Level, Open, TagName};
use crate::parser::{Parser, ParserOptions};
use crate::registry::Registry;
use crate::scan::Span;
use serde_json::{Value, json};
use std::sync::Arc;

/// Where a call element ended in corrected content that leaves call text
/// out ([`crate::CallText::Omit`]): its choice, its element id, and the
/// byte offset in the choice's corrected text it came with (a text of
/// [`super::TapFrame::rewrites`], or of [`super::TapEnd::rewrites`]). The proxy puts its
/// observations of calls it does not send there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "proxy"), allow(dead_code))]
pub(crate) struct CallMark {
    pub(crate) choice: u32,
    pub(crate) element: u32,
    pub(crate) at: usize,
}

/// How a source is framed, which decides what counts as truncation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Framing {
    /// An SSE stream that ends with `data: [DONE]`; without it the stream
    /// is truncated.
    Sse,
    /// Chunks without `[DONE]` framing (one chunk per line): a choice is
    /// truncated when it has no `finish_reason` at the end.
    Chunks,
    /// One whole (non-streamed) response.
    Response,
    /// Plain text fed with [`ChatStream::push_content`]: nothing marks its
    /// end, so nothing counts as truncation.
    Text,
}

/// Options of a [`ChatStream`] (and of the taps and streams built on it).
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// The registry every choice's content parser uses. Default: the
    /// `chat` profile (plain answers are content; `<think>…</think>` is a
    /// thought).
    pub registry: Arc<Registry>,
    /// Limits of the content parsers; `rewrite` turns on corrected text
    /// ([`ChatStream::take_rewrites`]). `machine.max_element_len` also
    /// bounds thought, refusal and tool-call elements.
    pub parser: ParserOptions,
    /// SSE line and event limits (also the limit on a JSON chunk that is
    /// held while waiting for the rest of a split chunk).
    pub sse: SseLimits,
    /// What counts as truncation.
    pub framing: Framing,
    /// Most choices per stream; data of further choices is dropped with a
    /// diagnostic. Default 128.
    pub max_choices: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions::with_registry(Registry::chat())
    }
}

impl StreamOptions {
    /// Default options with another registry.
    pub fn with_registry(registry: Registry) -> StreamOptions {
        StreamOptions {
            registry: Arc::new(registry),
            parser: ParserOptions::default(),
            sse: SseLimits::default(),
            framing: Framing::Sse,
            max_choices: 128,
        }
    }
}

/// Most whitespace held before a choice's first content (see
/// `ChoiceState::content`).
const MAX_HELD_SPACE: usize = 64 * 1024;

/// Tag names of the elements this module builds itself.
#[derive(Debug)]
struct Tags {
    thought: TagName,
    refusal: TagName,
    tool_call: TagName,
}

/// What every choice needs to read.
#[derive(Debug)]
struct Shared {
    options: StreamOptions,
    tags: Tags,
}

impl Shared {
    fn element_limit(&self) -> usize {
        self.options.parser.machine.max_element_len
    }
}

/// The sink of one choice's events.
struct Out<'a> {
    choice: u32,
    events: &'a mut Vec<SourceEvent>,
}

impl Out<'_> {
    fn push(&mut self, channel: Channel, event: Event) {
        self.events.push(SourceEvent::Choice(ChoiceEvent { event, choice: self.choice, channel }));
    }
}

fn diagnostic(level: Level, code: DiagnosticCode, message: String, at: Option<usize>) -> Diagnostic {
    Diagnostic { level, code, tag: None, element: None, at, message }
}

/// At most `max` bytes of `text` for a one-line message, cut at a char
/// boundary, with control characters escaped (`\n`, `\u{1b}`): a binary
/// or multi-line body shows as text and cannot drive a terminal.
pub(crate) fn excerpt(text: &str, max: usize) -> String {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + 3);
    for c in text[..end].chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    if end < text.len() {
        out.push('…');
    }
    out
}

/// The content channel of a choice: its parser and the renumbering of the
/// parser's element ids into the choice's id space.
#[derive(Debug)]
struct ContentChannel {
    parser: Parser,
    ids: Vec<u32>,
    scratch: Vec<Event>,
}

/// A run of plain text (reasoning, refusal) becoming one element.
#[derive(Debug)]
struct TextRun {
    channel: Channel,
    /// Bytes of this channel so far.
    offset: usize,
    open: Option<OpenRun>,
}

#[derive(Debug)]
struct OpenRun {
    id: u32,
    raw_tag: TagName,
    start: usize,
    text: String,
    truncated: bool,
}

impl TextRun {
    fn new(channel: Channel) -> TextRun {
        TextRun { channel, offset: 0, open: None }
    }

    fn push(&mut self, tag: &TagName, raw_tag: &str, text: &str, next_id: &mut u32, limit: usize, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        let offset = self.offset;
        let run = match &mut self.open {
            Some(run) => run,
            None => {
                let id = *next_id;
                *next_id += 1;
                let raw_tag = TagName::from(raw_tag);
                out.push(
                    self.channel,
                    Event::Open(Open {
                        id,
                        tag: tag.clone(),
                        raw_tag: raw_tag.clone(),
                        attrs: AttrMap::new(),
                        synthetic: false,
                        at: offset,
                    }),
                );
                self.open.insert(OpenRun { id, raw_tag, start: offset, text: String::new(), truncated: false })
            }
        };
        out.push(
            self.channel,
            Event::Delta(crate::event::Delta { id: run.id, tag: tag.clone(), text: text.to_string() }),
        );
        if !run.truncated {
            if run.text.len() + text.len() <= limit {
                run.text.push_str(text);
            } else {
                run.truncated = true;
                let mut d = diagnostic(
                    Level::Warning,
                    DiagnosticCode::ElementTooLarge,
                    format!(
                        "{tag} element is larger than {limit} bytes; its text was cut (the deltas carry all of it)"
                    ),
                    Some(offset),
                );
                d.tag = Some(tag.clone());
                d.element = Some(run.id);
                out.push(self.channel, Event::Diagnostic(d));
            }
        }
        self.offset += text.len();
    }

    fn close(&mut self, tag: &TagName, out: &mut Out<'_>) {
        let Some(run) = self.open.take() else { return };
        out.push(self.channel, Event::Close(Close { id: run.id, tag: tag.clone(), synthetic: false, at: self.offset }));
        out.push(
            self.channel,
            Event::Element(Box::new(Element {
                id: run.id,
                tag: tag.clone(),
                raw_tag: run.raw_tag,
                attrs: AttrMap::new(),
                text: run.text,
                payload: Value::Null,
                span: Span::new(run.start, self.offset),
                truncated: run.truncated,
            })),
        );
    }
}

/// Argument text of one fragment.
#[derive(Debug, Clone, Copy)]
enum Args<'a> {
    Text(&'a str),
    Json(&'a Value),
}

/// One tool-call fragment, from `tool_calls[i]` or `function_call`.
#[derive(Debug, Clone, Copy)]
struct Fragment<'a> {
    index: Option<u32>,
    id: Option<&'a str>,
    name: Option<&'a str>,
    args: Option<Args<'a>>,
    raw_tag: &'static str,
}

impl<'a> Fragment<'a> {
    fn from_delta(d: &'a ToolCallDelta) -> Fragment<'a> {
        let function = d.function.as_option();
        Fragment {
            index: d.index.as_option().copied(),
            id: d.id.as_option().map(String::as_str).filter(|s| !s.is_empty()),
            name: function.and_then(|f| f.name.as_option()).map(String::as_str),
            args: function.and_then(|f| f.arguments.as_option()).and_then(args_of),
            raw_tag: "tool_calls",
        }
    }

    fn from_function(f: &'a FunctionDelta) -> Fragment<'a> {
        Fragment {
            index: None,
            id: None,
            name: f.name.as_option().map(String::as_str),
            args: f.arguments.as_option().and_then(args_of),
            raw_tag: "function_call",
        }
    }
}

fn args_of(v: &Value) -> Option<Args<'_>> {
    match v {
        Value::Null => None,
        Value::String(s) => Some(Args::Text(s)),
        other => Some(Args::Json(other)),
    }
}

/// A tool call being assembled.
#[derive(Debug)]
struct ToolCall {
    element: u32,
    index: Option<u32>,
    call_id: Option<String>,
    name: String,
    args: String,
    start: usize,
    truncated: bool,
    raw_tag: &'static str,
    noted_repeat: bool,
}

/// The tool-call channel of a choice.
///
/// Several calls may be open at once: parallel `tool_calls` whose fragments
/// interleave by `index` (index 0's name, index 1's name, index 0's
/// arguments, …; ids only on each call's first fragment) are assembled per
/// index. A call is complete when a fragment of another call arrives while
/// its arguments already parse as JSON (OpenAI sends calls one after the
/// other, so each completes the moment the next starts), and at the end of
/// the choice (the rest, in the order they were opened).
#[derive(Debug, Default)]
struct ToolCalls {
    open: Vec<ToolCall>,
    /// Index and id of completed calls, to spot late fragments.
    completed: Vec<(Option<u32>, Option<String>)>,
    offset: usize,
}

fn index_compatible(a: Option<u32>, b: Option<u32>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// Whether a call's arguments so far are a whole JSON value.
fn complete_json(args: &str) -> bool {
    !args.trim().is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(args).is_ok()
}

impl ToolCalls {
    /// The open call a fragment belongs to, and whether it named that
    /// call's id again.
    fn target(&mut self, f: &Fragment<'_>) -> Option<(usize, bool)> {
        if let Some(id) = f.id {
            if let Some(i) = self.open.iter().position(|c| c.call_id.as_deref() == Some(id)) {
                return Some((i, true));
            }
            // The first fragment of a call may come without its id (some
            // servers send the id with the name later).
            let i = self
                .open
                .iter()
                .rposition(|c| c.call_id.is_none() && c.args.is_empty() && f.index.is_some() && c.index == f.index)?;
            self.open[i].call_id = Some(id.to_string());
            return Some((i, false));
        }
        match f.index {
            Some(index) => self.open.iter().position(|c| c.index == Some(index)).map(|i| (i, false)),
            // No index (legacy `function_call`, some servers): the latest
            // call that has no other index.
            None => self.open.iter().rposition(|c| index_compatible(c.index, None)).map(|i| (i, false)),
        }
    }

    fn fragment(&mut self, f: Fragment<'_>, shared: &Shared, next_id: &mut u32, out: &mut Out<'_>) {
        let found = self.target(&f);
        // Calls whose arguments are whole, other than this fragment's,
        // are complete: the server moved on.
        let keep = found.map(|(i, _)| self.open[i].element);
        self.complete_where(shared, out, |c| Some(c.element) != keep && complete_json(&c.args));
        let (at, repeated_id) = match found
            .and_then(|(_, r)| keep.and_then(|el| self.open.iter().position(|c| c.element == el)).map(|i| (i, r)))
        {
            Some(t) => t,
            None => {
                self.open_call(&f, shared, next_id, out);
                (self.open.len() - 1, false)
            }
        };
        let call = &mut self.open[at];
        if call.index.is_none() {
            call.index = f.index;
        }
        if let Some(name) = f.name.filter(|n| !n.is_empty()) {
            if call.name.is_empty() || name.starts_with(call.name.as_str()) {
                call.name = name.to_string();
            } else if call.name != name {
                call.name.push_str(name);
            }
        }
        let text: std::borrow::Cow<'_, str> = match f.args {
            None => return,
            Some(Args::Text(t)) => t.into(),
            Some(Args::Json(v)) => v.to_string().into(),
        };
        if text.is_empty() {
            return;
        }
        let repeat_note = if repeated_id && !call.args.is_empty() && *text == *call.args && complete_json(&call.args) {
            // The whole call again: already have it.
            Some("repeated the whole tool call; the repeat was dropped")
        } else if repeated_id
            && !call.args.is_empty()
            && text.len() > call.args.len()
            && text.starts_with(call.args.as_str())
        {
            // A growing snapshot: it replaces what we have.
            self.offset += text.len() - call.args.len();
            call.args = text.into_owned();
            Some("sent growing snapshots of the arguments; each replaced the last")
        } else {
            if call.truncated {
                self.offset += text.len();
            } else if call.args.len() + text.len() <= shared.element_limit() {
                call.args.push_str(&text);
                self.offset += text.len();
            } else {
                call.truncated = true;
                self.offset += text.len();
                let limit = shared.element_limit();
                let mut d = diagnostic(
                    Level::Warning,
                    DiagnosticCode::ElementTooLarge,
                    format!("tool_call arguments are larger than {limit} bytes; the rest was not kept"),
                    Some(self.offset),
                );
                d.tag = Some(shared.tags.tool_call.clone());
                d.element = Some(call.element);
                out.push(Channel::ToolCalls, Event::Diagnostic(d));
            }
            None
        };
        if let Some(note) = repeat_note
            && !call.noted_repeat
        {
            call.noted_repeat = true;
            let mut d = diagnostic(
                Level::Info,
                DiagnosticCode::ToolCallRepeated,
                format!("the server {note}"),
                Some(self.offset),
            );
            d.tag = Some(shared.tags.tool_call.clone());
            d.element = Some(call.element);
            out.push(Channel::ToolCalls, Event::Diagnostic(d));
        }
    }

    /// Opens a new call for `f` (reporting a fragment of a call that was
    /// already complete).
    fn open_call(&mut self, f: &Fragment<'_>, shared: &Shared, next_id: &mut u32, out: &mut Out<'_>) {
        let late = self.completed.iter().any(|(index, id)| match (f.id, id) {
            (Some(a), Some(b)) => a == b,
            (None, _) => f.index.is_some() && *index == f.index,
            _ => false,
        });
        if late {
            let mut d = diagnostic(
                Level::Warning,
                DiagnosticCode::ToolCallFragmentAfterComplete,
                format!(
                    "a tool-call fragment (index {:?}, id {:?}) arrived after its call was complete; it starts a new tool_call element",
                    f.index, f.id
                ),
                Some(self.offset),
            );
            d.tag = Some(shared.tags.tool_call.clone());
            out.push(Channel::ToolCalls, Event::Diagnostic(d));
        }
        let element = *next_id;
        *next_id += 1;
        let mut attrs = AttrMap::new();
        if let Some(id) = f.id {
            attrs.insert("id".into(), id.to_string());
        }
        if let Some(name) = f.name {
            attrs.insert("name".into(), name.to_string());
        }
        out.push(
            Channel::ToolCalls,
            Event::Open(Open {
                id: element,
                tag: shared.tags.tool_call.clone(),
                raw_tag: f.raw_tag.into(),
                attrs,
                synthetic: false,
                at: self.offset,
            }),
        );
        self.open.push(ToolCall {
            element,
            index: f.index,
            call_id: f.id.map(str::to_string),
            name: String::new(),
            args: String::new(),
            start: self.offset,
            truncated: false,
            raw_tag: f.raw_tag,
            noted_repeat: false,
        });
    }

    /// Completes every open call (the end of the choice), in the order
    /// they were opened.
    fn complete(&mut self, shared: &Shared, out: &mut Out<'_>) {
        self.complete_where(shared, out, |_| true);
    }

    /// Completes the open calls `done` picks, in the order they were opened.
    fn complete_where(&mut self, shared: &Shared, out: &mut Out<'_>, done: impl Fn(&ToolCall) -> bool) {
        let mut i = 0;
        while i < self.open.len() {
            if done(&self.open[i]) {
                let call = self.open.remove(i);
                self.emit(call, shared, out);
            } else {
                i += 1;
            }
        }
    }

    /// Emits a call as a complete element.
    fn emit(&mut self, call: ToolCall, shared: &Shared, out: &mut Out<'_>) {
        let tag = shared.tags.tool_call.clone();
        let (arguments, diagnostics) = parse_arguments(&call.args, call.truncated);
        let mut payload = serde_json::Map::new();
        payload.insert("id".into(), call.call_id.clone().map_or(Value::Null, Value::String));
        payload.insert("name".into(), Value::String(call.name.clone()));
        payload.insert("arguments".into(), arguments);
        if let Some(index) = call.index {
            payload.insert("index".into(), json!(index));
        }
        let mut attrs = AttrMap::new();
        if let Some(id) = &call.call_id {
            attrs.insert("id".into(), id.clone());
        }
        if !call.name.is_empty() {
            attrs.insert("name".into(), call.name.clone());
        }
        out.push(
            Channel::ToolCalls,
            Event::Close(Close { id: call.element, tag: tag.clone(), synthetic: false, at: self.offset }),
        );
        out.push(
            Channel::ToolCalls,
            Event::Element(Box::new(Element {
                id: call.element,
                tag: tag.clone(),
                raw_tag: call.raw_tag.into(),
                attrs,
                text: call.args,
                payload: Value::Object(payload),
                span: Span::new(call.start, self.offset),
                truncated: call.truncated,
            })),
        );
        for mut d in diagnostics {
            d.tag = Some(tag.clone());
            d.element = Some(call.element);
            out.push(Channel::ToolCalls, Event::Diagnostic(d));
        }
        if self.completed.len() < 4096 {
            self.completed.push((call.index, call.call_id));
        }
    }
}

/// Reads tool-call arguments: strictly, then leniently, reporting which.
fn parse_arguments(raw: &str, truncated: bool) -> (Value, Vec<Diagnostic>) {
    if truncated {
        let d = diagnostic(
            Level::Error,
            DiagnosticCode::InvalidArguments,
            "tool_call arguments were cut at the element size limit and not parsed".to_string(),
            None,
        );
        return (Value::Null, vec![d]);
    }
    if raw.trim().is_empty() {
        let d = diagnostic(
            Level::Info,
            DiagnosticCode::EmptyArguments,
            "the tool call has no argument text; arguments taken as {}".to_string(),
            None,
        );
        return (Value::Object(serde_json::Map::new()), vec![d]);
    }
    let strict_error = match serde_json::from_str::<Value>(raw) {
        Ok(v) => return (v, Vec::new()),
        Err(e) => e,
    };
    // The project's one lenient reader (it names every leniency it used).
    if let Ok(read) = crate::payload::json::parse(raw) {
        let used: Vec<&str> = read.leniencies.iter().map(|u| u.kind.describe()).collect();
        let d = diagnostic(
            Level::Warning,
            DiagnosticCode::ArgumentsRepaired,
            format!("tool_call arguments are not valid JSON ({strict_error}); read leniently: {}", used.join("; ")),
            None,
        );
        return (read.value, vec![d]);
    }
    let d = diagnostic(
        Level::Error,
        DiagnosticCode::InvalidArguments,
        format!(
            "tool_call arguments are not JSON even leniently ({strict_error}); arguments is null, the raw text is the element text"
        ),
        None,
    );
    (Value::Null, vec![d])
}

/// Everything known about one choice.
#[derive(Debug)]
struct ChoiceState {
    index: u32,
    next_id: u32,
    content: Option<ContentChannel>,
    reasoning: TextRun,
    refusal: TextRun,
    tools: ToolCalls,
    finished: bool,
    has_finish_reason: bool,
    noted_late: bool,
    noted_parts: Vec<String>,
    rewrite: Vec<u8>,
    /// Where call elements ended in `rewrite` (stream element id, byte
    /// offset; only when call text is left out).
    marks: Vec<(u32, usize)>,
    /// Whitespace-only content not yet given to a parser.
    held_space: String,
}

impl ChoiceState {
    fn new(index: u32) -> ChoiceState {
        ChoiceState {
            index,
            next_id: 0,
            content: None,
            reasoning: TextRun::new(Channel::Reasoning),
            refusal: TextRun::new(Channel::Refusal),
            tools: ToolCalls::default(),
            finished: false,
            has_finish_reason: false,
            noted_late: false,
            noted_parts: Vec::new(),
            rewrite: Vec::new(),
            marks: Vec::new(),
            held_space: String::new(),
        }
    }

    /// Reopens a finished choice that receives more data.
    fn wake(&mut self, out: &mut Out<'_>) {
        if self.finished {
            self.finished = false;
            if !self.noted_late {
                self.noted_late = true;
                let d = diagnostic(
                    Level::Warning,
                    DiagnosticCode::DataAfterFinish,
                    "the choice received more data after its finish_reason; it is read as a continuation".to_string(),
                    None,
                );
                out.push(Channel::Content, Event::Diagnostic(d));
            }
        }
    }

    fn content(&mut self, shared: &Shared, text: &str, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        // Whitespace before any content (a space before tool calls, blank
        // lines before a JSON answer) is held: it opens nothing, and a
        // choice whose content is only whitespace reports it as a gap.
        if self.content.is_none()
            && !self.finished
            && self.held_space.len() + text.len() <= MAX_HELD_SPACE
            && text.bytes().all(|b| b.is_ascii_whitespace())
        {
            self.held_space.push_str(text);
            return;
        }
        self.wake(out);
        self.reasoning.close(&shared.tags.thought, out);
        self.refusal.close(&shared.tags.refusal, out);
        if !self.held_space.is_empty() {
            let held = std::mem::take(&mut self.held_space);
            self.feed_content(shared, &held, out);
        }
        self.feed_content(shared, text, out);
    }

    fn feed_content(&mut self, shared: &Shared, text: &str, out: &mut Out<'_>) {
        let channel = self.content.get_or_insert_with(|| ContentChannel {
            parser: Parser::with_options(shared.options.registry.clone(), shared.options.parser),
            ids: Vec::new(),
            scratch: Vec::new(),
        });
        channel.parser.feed_into(text.as_bytes(), &mut channel.scratch);
        let mut marks = Vec::new();
        let base = self.rewrite.len();
        if shared.options.parser.rewrite {
            self.rewrite.extend(channel.parser.take_rewrite_marked(&mut marks));
        }
        let mut scratch = std::mem::take(&mut channel.scratch);
        for event in scratch.drain(..) {
            let event = remap(event, &mut channel.ids, &mut self.next_id);
            out.push(Channel::Content, event);
        }
        channel.scratch = scratch;
        mark_calls(&mut self.marks, &marks, base, &channel.ids);
    }

    fn reasoning(&mut self, shared: &Shared, text: &str, raw_tag: &str, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        self.wake(out);
        self.refusal.close(&shared.tags.refusal, out);
        let limit = shared.element_limit();
        self.reasoning.push(&shared.tags.thought, raw_tag, text, &mut self.next_id, limit, out);
    }

    fn refusal(&mut self, shared: &Shared, text: &str, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        self.wake(out);
        self.reasoning.close(&shared.tags.thought, out);
        let limit = shared.element_limit();
        self.refusal.push(&shared.tags.refusal, "refusal", text, &mut self.next_id, limit, out);
    }

    fn tool_fragment(&mut self, shared: &Shared, f: Fragment<'_>, out: &mut Out<'_>) {
        self.wake(out);
        self.reasoning.close(&shared.tags.thought, out);
        self.refusal.close(&shared.tags.refusal, out);
        self.tools.fragment(f, shared, &mut self.next_id, out);
    }

    fn parts(&mut self, shared: &Shared, parts: &[Value], out: &mut Out<'_>) {
        for part in parts {
            let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "text" | "output_text" => {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        self.content(shared, text, out);
                    }
                }
                "thinking" | "reasoning" => {
                    let inner = part.get(kind).or_else(|| part.get("text"));
                    match inner {
                        Some(Value::String(s)) => self.reasoning(shared, s, kind, out),
                        Some(Value::Array(items)) => {
                            for item in items {
                                if let Some(text) = item.get("text").and_then(Value::as_str) {
                                    self.reasoning(shared, text, kind, out);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                other => {
                    let other = excerpt(other, 40);
                    if !self.noted_parts.contains(&other) && self.noted_parts.len() < 16 {
                        let d = diagnostic(
                            Level::Info,
                            DiagnosticCode::UnsupportedContentPart,
                            format!("a content part of type {other:?} carries no text; it was not parsed"),
                            None,
                        );
                        out.push(Channel::Content, Event::Diagnostic(d));
                        self.noted_parts.push(other);
                    }
                }
            }
        }
    }

    fn delta(&mut self, shared: &Shared, delta: &Delta, out: &mut Out<'_>) {
        let rc = delta.reasoning_content.as_option().map(String::as_str).unwrap_or("");
        let r = delta.reasoning.as_option().map(String::as_str).unwrap_or("");
        self.reasoning(shared, rc, "reasoning_content", out);
        if r != rc {
            self.reasoning(shared, r, "reasoning", out);
        }
        match delta.content.as_option() {
            Some(Content::Text(text)) => self.content(shared, text, out),
            Some(Content::Parts(parts)) => self.parts(shared, parts, out),
            None => {}
        }
        if let Some(text) = delta.refusal.as_option() {
            self.refusal(shared, text, out);
        }
        if let Some(calls) = delta.tool_calls.as_option() {
            for call in calls {
                self.tool_fragment(shared, Fragment::from_delta(call), out);
            }
        }
        if let Some(f) = delta.function_call.as_option() {
            self.tool_fragment(shared, Fragment::from_function(f), out);
        }
    }

    /// Ends every open run of the choice; emits `finish` when it has a reason.
    fn finish(&mut self, shared: &Shared, reason: Option<FinishReason>, out: &mut Out<'_>) {
        self.reasoning.close(&shared.tags.thought, out);
        self.refusal.close(&shared.tags.refusal, out);
        if !self.held_space.is_empty() && self.content.is_none() {
            let held = std::mem::take(&mut self.held_space);
            if shared.options.parser.rewrite {
                self.rewrite.extend(held.as_bytes());
            }
            let span = Span::new(0, held.len());
            out.push(Channel::Content, Event::Gap(crate::event::Gap { text: held, span }));
        }
        if let Some(mut channel) = self.content.take() {
            let mut marks = Vec::new();
            let base = self.rewrite.len();
            let (events, rest) = channel.parser.finish_with_rewrite_marked(&mut marks);
            if shared.options.parser.rewrite {
                self.rewrite.extend(rest);
            }
            for event in events {
                let event = remap(event, &mut channel.ids, &mut self.next_id);
                out.push(Channel::Content, event);
            }
            mark_calls(&mut self.marks, &marks, base, &channel.ids);
        }
        self.tools.complete(shared, out);
        self.finished = true;
        if let Some(reason) = reason {
            self.has_finish_reason = true;
            out.events.push(SourceEvent::Finish { choice: self.index, reason });
        }
    }

    /// The corrected content that is final so far, as whole characters,
    /// with the marks of the call elements that ended in it (appended to
    /// `marks`).
    fn take_rewrite(&mut self, marks: &mut Vec<CallMark>) -> String {
        let valid = match std::str::from_utf8(&self.rewrite) {
            Ok(_) => self.rewrite.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Not reachable from str input; keep every byte visible anyway.
            Err(_) => self.rewrite.len(),
        };
        let rest = self.rewrite.split_off(valid);
        let text = std::mem::replace(&mut self.rewrite, rest);
        let choice = self.index;
        marks.extend(self.marks.iter().filter(|m| m.1 <= valid).map(|&(element, at)| CallMark { choice, element, at }));
        self.marks.retain(|m| m.1 > valid);
        for m in &mut self.marks {
            m.1 -= valid;
        }
        match String::from_utf8(text) {
            Ok(text) => text,
            // Replacement characters move the offsets: the marks stay at
            // whole characters, no further than the text.
            Err(e) => {
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                for m in marks.iter_mut().filter(|m| m.choice == choice) {
                    m.at = m.at.min(text.len());
                    while !text.is_char_boundary(m.at) {
                        m.at -= 1;
                    }
                }
                text
            }
        }
    }
}

/// Adds the parser's marks of call elements (its element ids, offsets in
/// the bytes it returned) to a choice's marks: stream ids, offsets in the
/// choice's rewrite buffer, where those bytes began at `base`.
fn mark_calls(into: &mut Vec<(u32, usize)>, marks: &[(u32, usize)], base: usize, ids: &[u32]) {
    for &(id, at) in marks {
        if let Some(&stream_id) = ids.get(id as usize) {
            into.push((stream_id, base + at));
        }
    }
}

/// Renumbers a parser event's element ids into the choice's id space.
fn remap(mut event: Event, ids: &mut Vec<u32>, next_id: &mut u32) -> Event {
    let mut map = |pid: u32| -> u32 {
        let p = pid as usize;
        while ids.len() <= p {
            ids.push(*next_id);
            *next_id += 1;
        }
        ids.get(p).copied().unwrap_or(pid)
    };
    match &mut event {
        Event::Open(e) => e.id = map(e.id),
        Event::Delta(e) => e.id = map(e.id),
        Event::Close(e) => e.id = map(e.id),
        Event::Element(e) => e.id = map(e.id),
        Event::Repair(e) => e.element = e.element.map(&mut map),
        Event::Diagnostic(e) => e.element = e.element.map(&mut map),
        Event::Comment(e) => e.element = e.element.map(&mut map),
        _ => {}
    }
    event
}

/// Whether filter results flag anything (`filtered`/`detected` true, or an
/// `error`).
fn filter_flagged(v: &Value, depth: u8) -> bool {
    if depth > 6 {
        return false;
    }
    match v {
        Value::Object(map) => map.iter().any(|(k, v)| {
            ((k == "filtered" || k == "detected") && v == &Value::Bool(true))
                || (k == "error" && !v.is_null())
                || filter_flagged(v, depth + 1)
        }),
        Value::Array(items) => items.iter().any(|v| filter_flagged(v, depth + 1)),
        _ => false,
    }
}

/// Counters of a stream, for summaries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Data payloads and chunks pushed.
    pub chunks: u64,
    /// Whether `[DONE]` arrived.
    pub done: bool,
    /// In-band errors seen.
    pub errors: u64,
    /// Chunks that could not be read (invalid JSON, unknown shape).
    pub bad_chunks: u64,
}

/// The stream model of one chat completion: push SSE data payloads (or
/// parsed chunks), get [`SourceEvent`]s.
///
/// Synchronous and I/O-free, like [`Parser`]; [`super::StreamTap`] adds SSE
/// decoding, [`super::EventStream`] an async byte stream.
///
/// # Channels and ids
///
/// Each choice has four channels ([`Channel`]). Content goes through the
/// Filament machine (so `<think>` inside content, inline tags and repairs
/// work as in `spindle parse`); the other channels are plain text or JSON
/// and become one element per run. Element ids are unique within a choice
/// across channels; `at` and `span` count bytes of the event's channel.
///
/// # Tool calls
///
/// Servers send tool calls in several shapes, all handled:
///
/// | shape | seen from | how it is read |
/// |---|---|---|
/// | `id` and `name` on the first fragment, then argument pieces | OpenAI | pieces appended by `index` |
/// | `id` repeated on every fragment | Novita, Groq | same id = same call |
/// | repeated whole call, or growing snapshots | some OpenRouter routes | a repeat is dropped, a snapshot replaces (with a `diagnostic`) |
/// | no `index`, one `id` per call, several calls in one delta | Mistral, Ollama | a new id starts a new call |
/// | whole call in one chunk | xAI, Kimi, GLM | one fragment |
/// | `arguments` as a JSON object | some gateways | written out as JSON text |
///
/// A call is complete, and its `element` emitted, when the next call
/// starts, when the choice finishes, or at the end of the stream.
/// `arguments` are parsed strictly, then leniently (jsonrepair, reported by
/// a `diagnostic`), else left `null` with an error `diagnostic`; the raw
/// text is always the element's `text`.
///
/// # Example
///
/// ```
/// use spindle::sources::{ChatStream, SourceEvent, StreamOptions};
///
/// let mut stream = ChatStream::new(StreamOptions::default());
/// let mut events = Vec::new();
/// for data in [
///     r#"{"choices":[{"index":0,"delta":{"reasoning_content":"Sum."}}]}"#,
///     r#"{"choices":[{"index":0,"delta":{"content":"4"}}]}"#,
///     r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
///     "[DONE]",
/// ] {
///     stream.push_data("message", data, 0, &mut events);
/// }
/// stream.finish_into(&mut events);
/// let elements: Vec<(&str, &str)> = events
///     .iter()
///     .filter_map(SourceEvent::as_element)
///     .map(|e| (&*e.tag, e.text.as_str()))
///     .collect();
/// assert_eq!(elements, [("thought", "Sum."), ("content", "4")]);
/// ```
#[derive(Debug)]
pub struct ChatStream {
    shared: Shared,
    choices: Vec<ChoiceState>,
    stats: StreamStats,
    last_usage: Option<Value>,
    /// The start of a JSON chunk split over several data payloads.
    pending: String,
    pending_at: usize,
    transport_failed: bool,
    noted_choice_limit: bool,
    noted_unknown: u32,
    dialect: dialects::Dialects,
    /// Events that came after `[DONE]` (ignored; reported once).
    after_done: u32,
    /// The `model` and `id` of the first chunk that names a model.
    response: Option<(String, String)>,
}

impl ChatStream {
    /// A stream model with the given options.
    pub fn new(options: StreamOptions) -> ChatStream {
        ChatStream {
            shared: Shared {
                options,
                tags: Tags { thought: "thought".into(), refusal: "refusal".into(), tool_call: "tool_call".into() },
            },
            choices: Vec::new(),
            stats: StreamStats::default(),
            last_usage: None,
            pending: String::new(),
            pending_at: 0,
            transport_failed: false,
            noted_choice_limit: false,
            noted_unknown: 0,
            dialect: Default::default(),
            after_done: 0,
            response: None,
        }
    }

    /// The options.
    pub fn options(&self) -> &StreamOptions {
        &self.shared.options
    }

    /// Counters so far.
    pub fn stats(&self) -> StreamStats {
        self.stats
    }

    /// The `model` and `id` the response's chunks name (from the first
    /// chunk that names a model).
    pub fn response_model(&self) -> Option<(&str, &str)> {
        self.response.as_ref().map(|(m, i)| (m.as_str(), i.as_str()))
    }

    /// Pushes the data of one SSE event (`event_type` is its `event` field,
    /// `message` by default; `at` its offset, for diagnostics). Returns the
    /// chunk when the data was one.
    pub fn push_data(
        &mut self,
        event_type: &str,
        data: &str,
        at: usize,
        out: &mut Vec<SourceEvent>,
    ) -> Option<ChatChunk> {
        self.push_data_as(event_type, data, at, out, ChunkUse::Returned)
    }

    /// [`ChatStream::push_data`] for a caller that wants the events only
    /// (a tap, a replay): the same events, faster, because the chunk is
    /// read for what it means instead of whole (its other fields, kept for
    /// writing it back, are skipped).
    ///
    /// ```
    /// use spindle::sources::{ChatStream, StreamOptions};
    ///
    /// let mut stream = ChatStream::new(StreamOptions::default());
    /// let mut events = Vec::new();
    /// let data = r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",
    ///     "choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":"stop"}]}"#;
    /// stream.push_data_events("message", data, 0, &mut events);
    /// assert_eq!(stream.response_model(), Some(("m", "c1")));
    /// stream.finish_into(&mut events);
    /// let text: Vec<&str> = events.iter().filter_map(|e| e.as_element()).map(|e| e.text.as_str()).collect();
    /// assert_eq!(text, ["Hi"]);
    /// ```
    pub fn push_data_events(&mut self, event_type: &str, data: &str, at: usize, out: &mut Vec<SourceEvent>) {
        self.push_data_as(event_type, data, at, out, ChunkUse::EventsOnly);
    }

    /// [`ChatStream::push_data`], reading chunks as `chunk_use` needs them.
    /// With [`ChunkUse::EventsOnly`] a returned chunk holds only what the
    /// model reads (no `extra` fields but `id` and `model`): not one to
    /// write back.
    pub(super) fn push_data_as(
        &mut self,
        event_type: &str,
        data: &str,
        at: usize,
        out: &mut Vec<SourceEvent>,
        chunk_use: ChunkUse,
    ) -> Option<ChatChunk> {
        if self.stats.done {
            // `[DONE]` ended the stream: what follows is not content (a
            // second `[DONE]`, a stray chunk, a keep-alive payload). A
            // pass-through proxy forwards it untouched; the model ignores it
            // and says so once.
            self.after_done += 1;
            if self.after_done == 1 {
                out.push(SourceEvent::Diagnostic(diagnostic(
                    Level::Warning,
                    DiagnosticCode::DataAfterDone,
                    format!("an event came after data: [DONE] and was ignored: {:?}", cut_text(data, 80)),
                    Some(at),
                )));
            }
            return None;
        }
        self.stats.chunks += 1;
        if event_type == "error" {
            let error = match serde_json::from_str::<Value>(data) {
                Ok(Value::Object(mut map)) => match map.remove("error") {
                    Some(inner) if !inner.is_null() => inner,
                    _ => Value::Object(map),
                },
                Ok(other) => json!({ "message": other }),
                Err(_) => json!({ "message": data }),
            };
            self.stats.errors += 1;
            out.push(SourceEvent::StreamError { choice: None, origin: ErrorOrigin::ErrorEvent, error });
            return None;
        }
        let trimmed = data.trim();
        if trimmed == "[DONE]" {
            self.drop_pending("[DONE] arrived", out);
            self.push_done(out);
            return None;
        }
        if trimmed.is_empty() {
            return None;
        }
        if !self.pending.is_empty() {
            let mut joined = std::mem::take(&mut self.pending);
            joined.push_str(data);
            match read_chunk(&joined, chunk_use, self.response.is_none()) {
                Ok(chunk) => {
                    out.push(SourceEvent::Diagnostic(diagnostic(
                        Level::Warning,
                        DiagnosticCode::ChunkRejoined,
                        "a JSON chunk was split over several SSE events; they were joined".to_string(),
                        Some(self.pending_at),
                    )));
                    self.push_chunk(&chunk, out);
                    return Some(chunk);
                }
                Err(e) if e.is_eof() && joined.len() <= self.shared.options.sse.max_event_len => {
                    self.pending = joined;
                    return None;
                }
                Err(_) => {
                    joined.truncate(joined.len() - data.len());
                    self.pending = joined;
                    self.drop_pending("the next event did not continue it", out);
                }
            }
        }
        match read_chunk(data, chunk_use, self.response.is_none()) {
            Ok(chunk) => {
                self.push_chunk(&chunk, out);
                Some(chunk)
            }
            Err(e) if e.is_eof() && data.len() <= self.shared.options.sse.max_event_len => {
                self.pending = data.to_string();
                self.pending_at = at;
                None
            }
            Err(e) => {
                if let Ok(value) = serde_json::from_str::<Value>(data)
                    && let (Some(chunk), notes) = super::chunk::coerce_chunk(value)
                {
                    out.push(SourceEvent::Diagnostic(diagnostic(
                        Level::Warning,
                        DiagnosticCode::ChunkFieldsCoerced,
                        format!("a chunk has fields of unexpected types ({e}): {}", notes.join("; ")),
                        Some(at),
                    )));
                    self.push_chunk(&chunk, out);
                    return Some(chunk);
                }
                self.stats.bad_chunks += 1;
                let (code, what) = match serde_json::from_str::<serde::de::IgnoredAny>(data) {
                    Ok(_) => (DiagnosticCode::UnexpectedChunkShape, "is JSON but not a chat-completion chunk"),
                    Err(_) => (DiagnosticCode::InvalidChunkJson, "is not valid JSON"),
                };
                out.push(SourceEvent::Diagnostic(diagnostic(
                    Level::Error,
                    code,
                    format!("an SSE data payload {what} ({e}); skipped it: {}", excerpt(data, 200)),
                    Some(at),
                )));
                None
            }
        }
    }

    fn drop_pending(&mut self, why: &str, out: &mut Vec<SourceEvent>) {
        if self.pending.is_empty() {
            return;
        }
        self.stats.bad_chunks += 1;
        let pending = std::mem::take(&mut self.pending);
        out.push(SourceEvent::Diagnostic(diagnostic(
            Level::Error,
            DiagnosticCode::InvalidChunkJson,
            format!(
                "an SSE data payload is an unfinished JSON document and {why}; skipped it: {}",
                excerpt(&pending, 200)
            ),
            Some(self.pending_at),
        )));
    }

    /// All events of a whole (non-streamed) response body: a
    /// `chat.completion`, an Anthropic message, a Responses API object, a
    /// Gemini or a Bedrock Converse response, or an error body. The
    /// options' framing is set to [`Framing::Response`].
    ///
    /// ```
    /// use spindle::sources::{ChatStream, StreamOptions};
    ///
    /// let body = br#"{"object":"chat.completion","choices":[{"index":0,
    ///     "message":{"role":"assistant","content":"<think>hm</think>Yes."},"finish_reason":"stop"}]}"#;
    /// let events = ChatStream::response_events(StreamOptions::default(), body);
    /// let tags: Vec<&str> = events.iter().filter_map(|e| e.as_element()).map(|e| &*e.tag).collect();
    /// assert_eq!(tags, ["thought", "content"]);
    /// ```
    pub fn response_events(mut options: StreamOptions, body: &[u8]) -> Vec<SourceEvent> {
        options.framing = Framing::Response;
        let mut stream = ChatStream::new(options);
        let mut out = Vec::new();
        stream.push_response(body, &mut out);
        stream.finish_into(&mut out);
        out
    }

    /// Reads a whole (non-streamed) response body, as
    /// [`ChatStream::response_events`] does, into a stream made with
    /// [`Framing::Response`]; for a caller that wants more of the stream
    /// after it (its corrected text: [`ChatStream::finish_with_rewrites`]).
    /// A JSON array of response objects (Gemini's `streamGenerateContent`
    /// without `alt=sse`) is read as the stream it was, one object after
    /// the other. A body that is not JSON gets an error diagnostic
    /// (`invalid_response_json`).
    pub fn push_response(&mut self, body: &[u8], out: &mut Vec<SourceEvent>) {
        let error = match serde_json::from_slice::<ChatChunk>(body) {
            Ok(chunk) => return self.push_chunk(&chunk, out),
            Err(e) => e,
        };
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(serde_json::Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_object) => {
                for item in &items {
                    self.push_data("message", &item.to_string(), 0, out);
                }
            }
            Ok(_) => {
                // Valid JSON with fields of unexpected types: the stream model
                // coerces them and says so.
                let text = crate::scan::text_lossy(body);
                self.push_data("message", &text, 0, out);
            }
            Err(_) => {
                let text = crate::scan::text_lossy(body);
                out.push(SourceEvent::Diagnostic(Diagnostic {
                    level: Level::Error,
                    code: DiagnosticCode::InvalidResponseJson,
                    tag: None,
                    element: None,
                    at: None,
                    message: format!(
                        "the response body is not a JSON chat completion ({error}): {}",
                        excerpt(&text, 200)
                    ),
                }));
            }
        }
    }

    /// Pushes answer text of one choice directly, as if it came in
    /// `delta.content` (plain-text transcripts, token recordings).
    pub fn push_content(&mut self, choice: u32, text: &str, out: &mut Vec<SourceEvent>) {
        self.with_choice(choice, out, |c| c.content(text));
    }

    /// Pushes `data: [DONE]`.
    pub fn push_done(&mut self, out: &mut Vec<SourceEvent>) {
        self.stats.done = true;
        out.push(SourceEvent::Done);
    }

    /// Reports that reading the body failed; the stream will end truncated.
    pub fn push_transport_error(&mut self, message: &str, out: &mut Vec<SourceEvent>) {
        self.transport_failed = true;
        self.stats.errors += 1;
        out.push(SourceEvent::StreamError {
            choice: None,
            origin: ErrorOrigin::Transport,
            error: json!({ "message": message }),
        });
    }

    /// Pushes one parsed chunk (streamed) or whole response
    /// ([`Framing::Response`]).
    pub fn push_chunk(&mut self, chunk: &ChatChunk, out: &mut Vec<SourceEvent>) {
        if self.response.is_none()
            && let Some(model) = chunk.model()
        {
            self.response = Some((model.to_string(), chunk.id().unwrap_or_default().to_string()));
        }
        let other_dialect = chunk.choices.is_absent()
            && (chunk.type_field().is_some()
                || chunk.object() == Some("response")
                || dialects::is_converse(&chunk.extra)
                || dialects::is_gemini(&chunk.extra)
                || dialects::is_ollama(&chunk.extra)
                || dialects::is_llama_cpp(&chunk.extra));
        let chat = !chunk.choices.is_absent()
            || chunk.usage.as_option().is_some_and(|u| !u.is_null())
            || chunk.error.as_option().is_some_and(|e| !e.is_null())
            || chunk.prompt_filter_results.as_option().is_some_and(|p| !p.is_null());
        if other_dialect || !chat {
            if !dialects::push(self, chunk, out) {
                self.unknown_chunk(chunk, out);
            }
            return;
        }
        if let Some(results) = chunk.prompt_filter_results.as_option()
            && filter_flagged(results, 0)
        {
            out.push(SourceEvent::ContentFilter { choice: None, results: results.clone() });
        }
        for choice in chunk.choice_list() {
            self.push_choice(choice, out);
        }
        if let Some(error) = chunk.error.as_option().filter(|e| !e.is_null()) {
            self.stats.errors += 1;
            out.push(SourceEvent::StreamError { choice: None, origin: ErrorOrigin::InBand, error: error.clone() });
        }
        if let Some(usage) = chunk.usage.as_option() {
            self.push_usage(usage, out);
        }
    }

    fn dialect_mut(&mut self) -> &mut dialects::Dialects {
        &mut self.dialect
    }

    fn push_error(&mut self, choice: Option<u32>, origin: ErrorOrigin, error: Value, out: &mut Vec<SourceEvent>) {
        self.stats.errors += 1;
        out.push(SourceEvent::StreamError { choice, origin, error });
    }

    fn push_usage(&mut self, usage: &Value, out: &mut Vec<SourceEvent>) {
        if usage.is_null() || self.last_usage.as_ref() == Some(usage) {
            return;
        }
        self.last_usage = Some(usage.clone());
        out.push(SourceEvent::Usage { usage: usage.clone() });
    }

    fn unknown_chunk(&mut self, chunk: &ChatChunk, out: &mut Vec<SourceEvent>) {
        self.stats.bad_chunks += 1;
        self.noted_unknown += 1;
        // One diagnostic per kind of chunk would need the kinds; the first
        // few are enough to see what the stream is.
        if self.noted_unknown <= 3 {
            let text = serde_json::to_string(chunk).unwrap_or_default();
            out.push(SourceEvent::Diagnostic(diagnostic(
                Level::Warning,
                DiagnosticCode::UnrecognizedChunk,
                format!(
                    "a chunk has no choices, usage or error and is of no known dialect; skipped it: {}",
                    excerpt(&text, 200)
                ),
                None,
            )));
        }
    }

    fn push_choice(&mut self, choice: &Choice, out: &mut Vec<SourceEvent>) {
        let index = choice.index.as_option().copied().unwrap_or(0);
        let framing = self.shared.options.framing;
        let Some(pos) = self.choice_pos(index, out) else {
            return;
        };
        let (shared, state) = (&self.shared, &mut self.choices[pos]);
        let mut o = Out { choice: index, events: out };
        if let Some(delta) = choice.delta.as_option() {
            state.delta(shared, delta, &mut o);
        }
        if let Some(message) = choice.message.as_option()
            && (framing == Framing::Response || choice.delta.as_option().is_none())
        {
            state.delta(shared, message, &mut o);
        }
        if let Some(text) = choice.text.as_option() {
            state.content(shared, text, &mut o);
        }
        if let Some(results) = choice.content_filter_results.as_option()
            && filter_flagged(results, 0)
        {
            o.events.push(SourceEvent::ContentFilter { choice: Some(index), results: results.clone() });
        }
        if let Some(reason) = choice.finish_reason.as_option().filter(|r| !r.is_empty()) {
            state.finish(shared, Some(FinishReason::parse(reason)), &mut o);
        }
    }

    /// The position of a choice's state, created on first sight.
    fn choice_pos(&mut self, index: u32, out: &mut Vec<SourceEvent>) -> Option<usize> {
        if let Some(pos) = self.choices.iter().position(|c| c.index == index) {
            return Some(pos);
        }
        if self.choices.len() >= self.shared.options.max_choices {
            if !self.noted_choice_limit {
                self.noted_choice_limit = true;
                out.push(SourceEvent::Diagnostic(diagnostic(
                    Level::Error,
                    DiagnosticCode::TooManyChoices,
                    format!(
                        "the stream has more than {} choices; data of choice {index} and further new choices is dropped",
                        self.shared.options.max_choices
                    ),
                    None,
                )));
            }
            return None;
        }
        self.choices.push(ChoiceState::new(index));
        Some(self.choices.len() - 1)
    }

    /// Runs `f` on a choice's state (for the other dialects).
    fn with_choice(&mut self, index: u32, out: &mut Vec<SourceEvent>, f: impl FnOnce(&mut ChoiceOps<'_, '_>)) {
        let Some(pos) = self.choice_pos(index, out) else {
            return;
        };
        let (shared, state) = (&self.shared, &mut self.choices[pos]);
        let mut ops = ChoiceOps { shared, state, out: Out { choice: index, events: out } };
        f(&mut ops);
    }

    /// Takes the corrected content that became final, per choice (only with
    /// [`ParserOptions::rewrite`]; choices with nothing new are left out).
    pub fn take_rewrites(&mut self) -> Vec<(u32, String)> {
        self.take_rewrites_marked(&mut Vec::new())
    }

    /// [`ChatStream::take_rewrites`], and, when call text is left out
    /// ([`crate::CallText::Omit`]), where call elements ended in it,
    /// appended to `marks`. A mark may belong to a choice with no text
    /// now (the call was all that became final): it stands at the end of
    /// the text before.
    pub(crate) fn take_rewrites_marked(&mut self, marks: &mut Vec<CallMark>) -> Vec<(u32, String)> {
        self.choices
            .iter_mut()
            .filter(|c| !c.rewrite.is_empty() || !c.marks.is_empty())
            .map(|c| (c.index, c.take_rewrite(marks)))
            .filter(|(_, text)| !text.is_empty())
            .collect()
    }

    /// Ends the stream: finishes every open choice, then reports truncation.
    pub fn finish(self) -> Vec<SourceEvent> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        out
    }

    /// Like [`ChatStream::finish`], appending to `out`.
    pub fn finish_into(mut self, out: &mut Vec<SourceEvent>) {
        self.end(out);
    }

    /// Ends the stream and returns the rest of the corrected content per
    /// choice (the synthetic closes; only with `ParserOptions::rewrite`).
    pub fn finish_with_rewrites(self, out: &mut Vec<SourceEvent>) -> Vec<(u32, String)> {
        self.finish_with_rewrites_marked(out, &mut Vec::new())
    }

    /// [`ChatStream::finish_with_rewrites`] with the marks of
    /// [`ChatStream::take_rewrites_marked`].
    pub(crate) fn finish_with_rewrites_marked(
        mut self,
        out: &mut Vec<SourceEvent>,
        marks: &mut Vec<CallMark>,
    ) -> Vec<(u32, String)> {
        self.end(out);
        self.take_rewrites_marked(marks)
    }

    fn end(&mut self, out: &mut Vec<SourceEvent>) {
        self.finish_open(out);
        let mid_json = !self.pending.is_empty();
        if mid_json {
            self.stats.bad_chunks += 1;
            let pending = std::mem::take(&mut self.pending);
            out.push(SourceEvent::Diagnostic(diagnostic(
                Level::Error,
                DiagnosticCode::TruncatedChunk,
                format!("the stream ended inside a JSON chunk; its text was not read: {}", excerpt(&pending, 200)),
                Some(self.pending_at),
            )));
        }
        let framing = self.shared.options.framing;
        let why = if self.transport_failed {
            Some(Truncation::Transport)
        } else if mid_json {
            Some(Truncation::MidJson)
        } else if framing == Framing::Sse && !self.stats.done && !self.dialect.ended_cleanly() {
            Some(Truncation::NoDone)
        } else {
            None
        };
        self.choices.sort_by_key(|c| c.index);
        match why {
            Some(why) if self.choices.is_empty() => out.push(SourceEvent::Truncated { choice: None, why }),
            // A chunk transcript that never showed a choice nor its
            // dialect's end event ended before anything was finished.
            None if self.choices.is_empty() && framing == Framing::Chunks && !self.dialect.ended_cleanly() => {
                out.push(SourceEvent::Truncated { choice: None, why: Truncation::NoFinishReason })
            }
            Some(why) => {
                for c in &self.choices {
                    out.push(SourceEvent::Truncated { choice: Some(c.index), why });
                }
            }
            None => {
                for c in self.choices.iter().filter(|c| !c.has_finish_reason) {
                    if framing == Framing::Text {
                        continue;
                    }
                    if framing == Framing::Chunks {
                        out.push(SourceEvent::Truncated { choice: Some(c.index), why: Truncation::NoFinishReason });
                    } else {
                        out.push(SourceEvent::Diagnostic(diagnostic(
                            Level::Warning,
                            DiagnosticCode::NoFinishReason,
                            format!("choice {} ended without a finish_reason", c.index),
                            None,
                        )));
                    }
                }
            }
        }
    }

    /// Finishes every choice that is still open (no finish reason).
    fn finish_open(&mut self, out: &mut Vec<SourceEvent>) {
        self.choices.sort_by_key(|c| c.index);
        let shared = &self.shared;
        for state in self.choices.iter_mut().filter(|c| !c.finished) {
            let mut o = Out { choice: state.index, events: out };
            state.finish(shared, None, &mut o);
        }
    }
}

/// What the caller of [`ChatStream::push_data_as`] does with the chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChunkUse {
    /// They are returned whole (every field, to be written back).
    Returned,
    /// Only their events are wanted.
    EventsOnly,
}

/// Reads the JSON of a chunk: by its meaning when only events are wanted
/// and it is a chat chunk, whole otherwise (and whenever the reading by
/// meaning fails, so that errors read as they always did).
/// `named`: whether the chunk's `id` and `model` are still wanted.
fn read_chunk(text: &str, chunk_use: ChunkUse, named: bool) -> serde_json::Result<ChatChunk> {
    if chunk_use == ChunkUse::EventsOnly
        && let Some(chunk) = super::chunk::read_chat_meaning(text, named)
    {
        return Ok(chunk);
    }
    serde_json::from_str(text)
}

/// What a dialect adapter may do to one choice.
struct ChoiceOps<'s, 'o> {
    shared: &'s Shared,
    state: &'s mut ChoiceState,
    out: Out<'o>,
}

impl ChoiceOps<'_, '_> {
    /// Answer text.
    fn content(&mut self, text: &str) {
        self.state.content(self.shared, text, &mut self.out);
    }

    /// Reasoning text; `raw_tag` names the field it came from.
    fn reasoning(&mut self, text: &str, raw_tag: &str) {
        self.state.reasoning(self.shared, text, raw_tag, &mut self.out);
    }

    /// Refusal text.
    fn refusal(&mut self, text: &str) {
        self.state.refusal(self.shared, text, &mut self.out);
    }

    /// A tool-call fragment.
    pub(super) fn tool_call(
        &mut self,
        index: Option<u32>,
        id: Option<&str>,
        name: Option<&str>,
        args: Option<&Value>,
        raw_tag: &'static str,
    ) {
        let f = Fragment { index, id: id.filter(|s| !s.is_empty()), name, args: args.and_then(args_of), raw_tag };
        self.state.tool_fragment(self.shared, f, &mut self.out);
    }

    /// Completes the tool call being assembled, if any.
    pub(super) fn end_tool_call(&mut self) {
        self.state.tools.complete(self.shared, &mut self.out);
    }

    /// Closes the reasoning run, if one is open.
    pub(super) fn end_reasoning(&mut self) {
        self.state.reasoning.close(&self.shared.tags.thought, &mut self.out);
    }

    /// Ends the choice.
    pub(super) fn finish(&mut self, reason: Option<FinishReason>) {
        self.state.finish(self.shared, reason, &mut self.out);
    }

    /// A diagnostic about this choice.
    pub(super) fn diagnostic(&mut self, level: Level, code: DiagnosticCode, message: String) {
        let d = diagnostic(level, code, message, None);
        self.out.push(Channel::Content, Event::Diagnostic(d));
    }
}

/// At most `max` bytes of `text` (at a char boundary), for messages.
fn cut_text(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
