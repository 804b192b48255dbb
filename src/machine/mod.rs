//! The fault-tolerant state machine (DESIGN §4, spec 003 §11.3): tokens in,
//! events out, with every correction announced as a `repair`.
//!
//! This module owns the structure of a response: which element is open,
//! when it ends, and what the corrector changes. It must not read bytes
//! (that is [`crate::scan`]'s job) and must not interpret bodies (payloads
//! belong to [`crate::payload`]). Its state is one enum, `State`; every
//! row of DESIGN §4's table is one arm of `Machine::on_open`,
//! `Machine::on_close`, `Machine::on_text` or [`Machine::finish`]:
//!
//! | DESIGN §4 situation                        | where                                   | repair |
//! |--------------------------------------------|-----------------------------------------|--------|
//! | output starts with bare text               | `on_text`, `State::Start`               | `header_inserted` |
//! | `<B>` top-level while A is open            | `on_open`, `State::Open`                | `auto_closed` |
//! | `</A>` ws `<A>`, A mergeable               | `on_close` -> `State::CloseHeld`, then `on_open` | `merged_adjacent` |
//! | `</A>` ws bare text, A the default         | `State::CloseHeld`, `on_text`           | `merged_adjacent` |
//! | `</A>` inside a value A writes out, the value goes on | `on_close` -> `State::CloseHeld` (`Hold::InValue`), then `settle_held` | none (`close_in_value` diagnostic) |
//! | `</B>` while A is open                     | `on_close`, `State::Open`               | `mismatched_close` |
//! | `</B>` with nothing open                   | `on_close`, `State::Start`/`Between`    | `stray_close_dropped` |
//! | bare text between elements                 | `on_text`, `State::Between`             | `header_inserted` |
//! | end of input with A open                   | `finish`                                | `closed_at_eof` |
//! | implicit lead that was not the lead        | `LeadCheck`, `finish`                   | `reclassified` |
//! | lead prefilled by the chat template        | `open_for_bare_text` (never reclassified) | `header_inserted` |
//! | mandatory tag missing, order broken        | `finish`                                | `diagnostic` |
//! | `<media ...>` (void) without `/>`          | `State::VoidOpen`: ends at its open tag unless `</media>` follows | none |
//! | ```` ``` ```` fence around a TAM/ACTION block | `fenced_text`, `settle_fence` (`fence::FenceWatch`) | `fence_dropped` |
//!
//! # Reclassification
//!
//! When the output starts with bare text, the registry's lead tag (thought)
//! is opened implicitly and its text streams as thought deltas. Whether it
//! really was a thought is known only later:
//!
//! * `</thought>` closes it, or `<content>` follows it: it was a thought.
//! * `</B>` closes it: it was a `B` (the model forgot `<B>`).
//! * `<B>` follows it and B must come after content (variable_update), or
//!   the output ends with no content at all: it was content.
//! * `<B>` follows it and B says nothing (status_bar): undecided. The
//!   element's `close`/`element` events, and everything after them, wait in
//!   a queue until one of the above decides.
//!
//! Changing its tag emits one `repair` of kind `reclassified` naming the
//! element and its new tag, so a UI that showed its deltas as thought can
//! move them.

mod fence;
mod rewrite;

use crate::event::DiagnosticCode;
use crate::event::{
    AttrMap, Close, Comment, Delta, Diagnostic, Element, Event, Gap, Level, Open, Repair, RepairKind, TagName,
};
use crate::registry::{BodyKind, LeadOpen, MarkerRole, Registry, TagId};
use crate::scan::markdown::MarkdownCode;
use crate::scan::{JsonString, ScanNotice, Span, TagKind, TagToken, Token, TokenSink, UnfinishedKind};
use fence::{Closing, FENCE_HOLD_LIMIT, FenceWatch, closing_fence, indentation_suffix, opening_suffix};
use rewrite::Rewrite;
use std::sync::Arc;

/// Limits the machine enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MachineLimits {
    /// Largest inner text kept for one element's `element` event, in bytes.
    /// Past it the text is cut (`truncated: true`), a diagnostic says so, and
    /// the rest still arrives as `delta` events. Default 4 MiB.
    pub max_element_len: usize,
}

impl Default for MachineLimits {
    fn default() -> Self {
        MachineLimits { max_element_len: 4 * 1024 * 1024 }
    }
}

/// How an element came to be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opened {
    /// By a tag the model wrote.
    Tag,
    /// By the corrector, before bare text between elements.
    Synthetic,
    /// By the corrector, as the registry's lead tag at the start of output;
    /// whether it really is the lead is checked by [`LeadCheck`].
    ImplicitLead,
    /// By the corrector, as the default tag at the start of output of a
    /// registry without a separate lead (the `chat` profile): a `</B>`
    /// closing it proves it was a `B` (`hm</think>answer`).
    ImplicitDefault,
}

/// An element that is open.
#[derive(Debug)]
struct OpenElement {
    id: u32,
    tag: TagId,
    /// How the registry reads `tag`'s body (read on every piece of text;
    /// kept beside the tag, which changes only with it).
    body: BodyKind,
    raw_tag: TagName,
    attrs: AttrMap,
    /// Offset of the opening tag (or first text byte).
    start: usize,
    opened: Opened,
    /// Inner text, up to the element size limit.
    text: Vec<u8>,
    truncated: bool,
    /// Where a JSON body's text is: inside a string, markup is the string's
    /// text, not a tag (`{"content": "<think> tags"}`).
    quote: JsonString,
    /// What the element follows of its text when a tag asks (see
    /// [`Watch`]); made when a tag first asks.
    watch: Option<Box<Watch>>,
}

/// What an element follows of its own text, followed only when a tag
/// asks, from where it last asked: text costs nothing for it as it
/// arrives, and an element no tag asks about holds none (boxed: most
/// elements never need one). Which one is fixed by the body: a streamed
/// body has Markdown, a JSON body may be a call written in markup.
#[derive(Debug)]
enum Watch {
    Code(CodeWatch),
    Values(ValueWatch),
}

/// Where a streamed element's text is: inside Markdown code (a fenced
/// block, a code span), a registry tag is the code's text, not an element
/// (`` `<thought>` ``, an HTML example with `<details>`). See
/// [`code_so_far`].
#[derive(Debug, Default)]
struct CodeWatch {
    code: MarkdownCode,
    /// How much of the element's text `code` has followed.
    read: usize,
    /// Whether the `tag_in_code` diagnostic was given for this element
    /// (once per element).
    noted: bool,
}

/// Where a call body written in markup (Qwen3-Coder's `<function=…>`,
/// GLM's `name<arg_key>…`) is with respect to the values it writes out, as
/// the payload reads them: the value opened by `<parameter=` ends at
/// `</parameter>`, the next `<parameter=` or `</function>`; the one opened
/// by `<arg_value>` at `</arg_value>`. So the last of these markers says
/// whether a value is open. See [`in_value`].
#[derive(Debug, Default)]
struct ValueWatch {
    /// How much of the element's text was read.
    read: usize,
    /// Whether the last marker read opened a value (`None`: no marker yet,
    /// the body is not written in markup as far as it goes).
    open: Option<bool>,
}

/// The markers of [`ValueWatch`], and whether each opens a value.
const VALUE_MARKERS: [(&[u8], bool); 5] = [
    (b"<parameter=", true),
    (b"<arg_value>", true),
    (b"</parameter>", false),
    (b"</function>", false),
    (b"</arg_value>", false),
];

/// The shortest of [`VALUE_MARKERS`]: a marker cut by the last read ends
/// in the last `VALUE_MARKER_MIN - 1` bytes read.
const VALUE_MARKER_MIN: usize = 11;

impl ValueWatch {
    /// Follows `text` (the element's text so far) from where it last read,
    /// and re-reads the bytes a marker cut by that read may have begun in.
    /// The last marker wins, so reading a marker again changes nothing.
    fn follow(&mut self, text: &[u8]) -> Option<bool> {
        let from = self.read.min(text.len()).saturating_sub(VALUE_MARKER_MIN - 1);
        let region = &text[from..];
        let last = VALUE_MARKERS
            .iter()
            .filter_map(|&(marker, opens)| memchr::memmem::rfind(region, marker).map(|at| (at, opens)))
            .max_by_key(|&(at, _)| at);
        if let Some((_, opens)) = last {
            self.open = Some(opens);
        }
        self.read = text.len();
        self.open
    }
}

/// A close tag waiting for the next non-space byte (the whitespace read
/// since is in [`Machine::held_space`]).
#[derive(Debug)]
struct HeldClose {
    /// The close tag.
    span: Span,
    /// Why it waits.
    hold: Hold,
}

/// Why a close waits for what follows it.
#[derive(Debug)]
enum Hold {
    /// `</A>` of a mergeable element: `<A>` next merges, bare text goes on
    /// with A when A is the default tag, anything else closes.
    Merge,
    /// The element's own close inside a value it was writing out (a JSON
    /// string, a Qwen3-Coder parameter's value, a GLM argument's value;
    /// see [`in_value`]): `{"content": "end with </tool_call> here"}`.
    /// Only what ends a call confirms it: a registry tag or special
    /// marker, a chat-template token, or the end of input (or more
    /// whitespace than [`MERGE_SPACE_LIMIT`]). Anything else (text, markup
    /// that is no registry tag, a comment) goes on with the value, and the
    /// close is its text: these bytes, as written.
    InValue(Box<[u8]>),
}

/// Where the machine is between two tokens.
#[derive(Debug)]
enum State {
    /// Nothing but whitespace and comments so far.
    Start,
    /// Between top-level elements.
    Between,
    /// Inside a top-level element.
    Open(OpenElement),
    /// `</A>` of a mergeable element read; the next non-space byte decides
    /// between a merge (`<A>`), a continuation (bare text, A the default)
    /// and a real close (anything else).
    CloseHeld(OpenElement, HeldClose),
    /// `<media ...>` of a void tag written without `/>`. If its close
    /// follows, what came between is its body (`<media>pics/a.png</media>`);
    /// if anything else does (another marker, the end, or more than
    /// [`VOID_BODY_LIMIT`] bytes of text), it ended at its open tag (HTML
    /// habit) and the held text is read as ordinary text.
    VoidOpen(OpenElement, VoidHold),
}

/// How much text after an unclosed void tag is held while deciding whether
/// it is the tag's body: a URL or an alt text, not a paragraph.
const VOID_BODY_LIMIT: usize = 256;

/// The most room [`Machine::held_space`] keeps between elements.
const HELD_SPACE_ROOM: usize = 1024;

/// Most whitespace held after the close of a mergeable element while
/// waiting to see whether it reopens (`</thought>\n\n<thought>`): past it,
/// the close stands, so that a model emitting nothing but newlines holds
/// no memory for them.
pub(crate) const MERGE_SPACE_LIMIT: usize = 4096;

/// A void element's open tag and the text after it, waiting for a decision.
#[derive(Debug)]
struct VoidHold {
    /// End of the open tag (where the held text starts).
    tag_end: usize,
    /// Text read since.
    held: Vec<u8>,
}

/// Whether the implicitly opened lead element has been confirmed.
#[derive(Debug)]
enum LeadCheck {
    /// No implicit lead element, or it has been decided.
    Settled,
    /// The implicit lead element is still open.
    Open { id: u32 },
    /// The implicit lead element has ended but its tag is undecided: its
    /// close and element events, and every event after them, wait here.
    Queued { id: u32, queue: Vec<Event>, queued_bytes: usize },
}

/// Text waiting to be emitted as one event (so that a run of text tokens
/// becomes one delta).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextTarget {
    None,
    Delta { id: u32, tag: TagId },
    Gap { start: usize },
}

/// The machine. Create it with a registry; feed it tokens through
/// [`TokenSink`]; collect events with [`Machine::drain`].
#[derive(Debug)]
pub(crate) struct Machine {
    /// The tags, and their names as events carry them (shared by all
    /// events: the raw tag of synthetic opens and of tags written as
    /// spelled is the registry's, not a copy per element).
    registry: Arc<Registry>,
    limits: MachineLimits,
    state: State,
    lead: LeadCheck,
    next_id: u32,
    events: Vec<Event>,
    /// The tag of each element as the machine decided it, for the payload
    /// stage (see [`TagLog`]).
    tags: TagLog,
    text_target: TextTarget,
    text_buf: Vec<u8>,
    /// The whitespace after a held close (`State::CloseHeld`), kept with
    /// its room from one element to the next: almost every element ends
    /// `</A>\n`.
    held_space: Vec<u8>,
    /// The id of the first element of each tag (ids follow input order).
    first_seen: Vec<Option<u32>>,
    invalid_utf8_seen: bool,
    rewrite: Option<Rewrite>,
    /// Whether call elements are left out of the rewrite.
    call_omit: CallOmit,
    /// Code fences around call blocks (see [`fence`]).
    fence: FenceWatch,
}

/// Call elements in the rewrite ([`crate::CallText`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallOmit {
    /// They stay.
    Off,
    /// They are left out; none is open.
    Idle,
    /// They are left out; this one is open.
    Inside { id: u32 },
}

impl Machine {
    /// A machine for one response.
    pub(crate) fn new(registry: Arc<Registry>, limits: MachineLimits) -> Machine {
        let n = registry.tags().len();
        let fence = if registry.tags().iter().any(|t| is_call_block(t.body)) {
            FenceWatch::Idle { line_start: true }
        } else {
            FenceWatch::Off
        };
        Machine {
            registry,
            limits,
            state: State::Start,
            lead: LeadCheck::Settled,
            next_id: 0,
            events: Vec::new(),
            tags: TagLog::default(),
            text_target: TextTarget::None,
            text_buf: Vec::new(),
            held_space: Vec::new(),
            first_seen: vec![None; n],
            invalid_utf8_seen: false,
            rewrite: None,
            call_omit: CallOmit::Off,
            fence,
        }
    }

    /// Leaves tool-call elements (and the fences around them) out of the
    /// corrected text ([`crate::CallText::Omit`]).
    pub(crate) fn omit_calls(&mut self) {
        self.call_omit = CallOmit::Idle;
    }

    /// Whether `tag` is a tool-call element (`tool_call`, TAM, ACTION).
    fn is_call_tag(&self, tag: TagId) -> bool {
        is_call_block(self.registry.tag(tag).body) || &*self.name(tag) == "tool_call"
    }

    /// Also produce the corrected text (`--format rewrite`), collected with
    /// [`Machine::take_rewrite`].
    pub(crate) fn enable_rewrite(&mut self) {
        self.rewrite = Some(Rewrite::default());
    }

    /// Corrected text that is final so far.
    pub(crate) fn take_rewrite(&mut self) -> Vec<u8> {
        self.take_rewrite_marked(&mut Vec::new())
    }

    /// [`Machine::take_rewrite`], and where call elements ended in it
    /// (element id, offset; only when call text is left out), appended to
    /// `marks`.
    pub(crate) fn take_rewrite_marked(&mut self, marks: &mut Vec<(u32, usize)>) -> Vec<u8> {
        self.rewrite.as_mut().map(|r| r.take(marks)).unwrap_or_default()
    }

    /// The events produced so far, for the caller to drain. Text that may
    /// still continue in the next chunk (an unfinished UTF-8 character)
    /// stays.
    pub(crate) fn drain(&mut self) -> (&mut Vec<Event>, &mut TagLog) {
        self.flush_text(false);
        (&mut self.events, &mut self.tags)
    }

    /// The events so far, keeping pending text for the next delta (between
    /// pieces of one chunk, so a chunk gives the same deltas however it is
    /// cut).
    pub(crate) fn events(&mut self) -> (&mut Vec<Event>, &mut TagLog) {
        (&mut self.events, &mut self.tags)
    }

    /// Bytes held for pending decisions, for memory accounting in tests.
    pub(crate) fn held_bytes(&self) -> usize {
        let el = match &self.state {
            State::Open(el) | State::CloseHeld(el, _) | State::VoidOpen(el, _) => el.text.capacity(),
            _ => 0,
        };
        let queue = match &self.lead {
            LeadCheck::Queued { queued_bytes, .. } => *queued_bytes,
            _ => 0,
        };
        el + queue + self.text_buf.capacity() + self.held_space.capacity() + self.fence.held_len()
    }

    fn name(&self, tag: TagId) -> TagName {
        self.registry.event_names(tag).0.clone()
    }

    /// The registry's spelling of `tag` (how synthetic tags are written).
    fn spelling(&self, tag: TagId) -> TagName {
        self.registry.event_names(tag).1.clone()
    }

    /// The raw tag of `tag` written as `written`: the shared name or
    /// spelling when it is written exactly so (almost always), else a copy.
    fn raw_name(&self, tag: TagId, written: &[u8]) -> TagName {
        let (name, spelling) = self.registry.event_names(tag);
        if written == name.as_bytes() {
            name.clone()
        } else if written == spelling.as_bytes() {
            spelling.clone()
        } else {
            TagName::from(crate::scan::owned_text(written))
        }
    }

    // ----- emitting -----------------------------------------------------

    /// Queues an event, after any pending text.
    fn emit(&mut self, event: Event) {
        self.flush_text(true);
        self.push_event(event);
    }

    /// Queues an event as it is (the undecided lead's queue out of line).
    #[inline]
    fn push_event(&mut self, event: Event) {
        match self.lead {
            LeadCheck::Queued { .. } => self.push_undecided(event),
            _ => self.events.push(event),
        }
    }

    /// [`Machine::push_event`] while the implicit lead is undecided.
    #[inline(never)]
    fn push_undecided(&mut self, event: Event) {
        let LeadCheck::Queued { queue, queued_bytes, .. } = &mut self.lead else {
            return self.events.push(event);
        };
        *queued_bytes += event_weight(&event);
        queue.push(event);
        if *queued_bytes > self.limits.max_element_len {
            // Waiting longer would hold unbounded memory: keep the lead tag
            // and say so (settled first: the diagnostic is an event too, and
            // queued it would come back here).
            self.settle_lead(None);
            self.diagnostic(
                Level::Warning,
                DiagnosticCode::LeadUndecided,
                None,
                "the implicit lead element stayed undecided past the element size limit; kept as the lead tag",
            );
        }
    }

    /// Adds text to the pending delta or gap, flushing first if the target
    /// changes.
    #[inline]
    fn push_text(&mut self, target: TextTarget, bytes: &[u8]) {
        if self.text_target != target {
            self.flush_text(true);
            self.text_target = target;
        }
        self.text_buf.extend_from_slice(bytes);
    }

    /// Emits pending text. With `complete == false` an unfinished UTF-8
    /// character at the end stays for the next chunk.
    fn flush_text(&mut self, complete: bool) {
        if self.text_buf.is_empty() {
            return;
        }
        let keep = if complete { 0 } else { crate::scan::incomplete_utf8_tail(&self.text_buf) };
        let cut = self.text_buf.len() - keep;
        if cut == 0 {
            return;
        }
        let text = crate::scan::copied_text(&self.text_buf[..cut]);
        if keep == 0 {
            self.text_buf.clear();
        } else {
            self.text_buf.drain(..cut);
        }
        self.text_event(text, cut);
    }

    /// The event of `len` input bytes of text for the current target, from
    /// their [`copied_text`](crate::scan::copied_text).
    fn text_event(&mut self, text: Result<String, String>, len: usize) {
        let text = text.unwrap_or_else(|lossy| {
            self.report_invalid_utf8();
            lossy
        });
        let event = match self.text_target {
            TextTarget::Delta { id, tag } => Event::Delta(Delta { id, tag: self.name(tag), text }),
            TextTarget::Gap { start } => {
                let span = Span::new(start, start + len);
                self.text_target = TextTarget::Gap { start: start + len };
                Event::Gap(Gap { text, span })
            }
            TextTarget::None => return,
        };
        self.push_event(event);
    }

    /// Notes invalid UTF-8; the diagnostic is emitted at the end, because
    /// where it is first seen depends on how the input was split.
    fn report_invalid_utf8(&mut self) {
        self.invalid_utf8_seen = true;
    }

    fn invalid_utf8_diagnostic(&mut self) {
        if self.invalid_utf8_seen {
            let d = Diagnostic {
                level: Level::Warning,
                code: DiagnosticCode::InvalidUtf8,
                tag: None,
                element: None,
                at: None,
                message: "input holds bytes that are not UTF-8; they appear as U+FFFD in text".into(),
            };
            self.emit(Event::Diagnostic(d));
        }
    }

    fn repair(
        &mut self,
        kind: RepairKind,
        tag: Option<TagId>,
        at: usize,
        element: Option<u32>,
        span: Option<Span>,
        from: Option<String>,
    ) {
        let tag = tag.map(|t| self.name(t));
        self.emit(Event::Repair(Box::new(Repair { kind, tag, at, element, span, from, text: None })));
    }

    fn diagnostic(&mut self, level: Level, code: DiagnosticCode, tag: Option<TagId>, message: &str) {
        let tag = tag.map(|t| self.name(t));
        self.emit(Event::Diagnostic(Diagnostic { level, code, tag, element: None, at: None, message: message.into() }));
    }

    fn rewrite_raw(&mut self, bytes: &[u8]) {
        if let Some(r) = &mut self.rewrite {
            r.push(bytes);
        }
    }

    /// Writes a synthetic open in the registry's spelling.
    fn rewrite_open(&mut self, tag: TagId) {
        let spec = self.registry.tag(tag);
        if spec.bare {
            return;
        }
        if let Some(r) = &mut self.rewrite {
            match &spec.markers {
                Some(m) => r.push(format!("<|[{}]|>", m.open).as_bytes()),
                None => r.push_tag(&spec.spelling, false),
            }
        }
    }

    /// Writes a synthetic close for `el`, in the spelling its open used.
    fn rewrite_close(&mut self, el: &OpenElement) {
        let spec = self.registry.tag(el.tag);
        if spec.bare {
            return;
        }
        if let Some(r) = &mut self.rewrite {
            match &spec.markers {
                Some(m) => r.push(format!("<|[{}]|>", m.close).as_bytes()),
                None => r.push_tag(&el.raw_tag, true),
            }
        }
    }

    // ----- opening and closing -----------------------------------------

    fn open_element(&mut self, tag: TagId, raw_tag: TagName, attrs: AttrMap, at: usize, opened: Opened) -> OpenElement {
        let id = self.next_id;
        self.next_id += 1;
        let synthetic = opened != Opened::Tag;
        match opened {
            Opened::ImplicitLead => self.lead = LeadCheck::Open { id },
            // Its tag counts once it is final (see `complete`).
            Opened::ImplicitDefault => {}
            Opened::Tag | Opened::Synthetic => {
                self.lead_sees_open(tag);
                self.mark_seen(tag, id);
            }
        }
        self.emit(Event::Open(Open {
            id,
            tag: self.name(tag),
            raw_tag: raw_tag.clone(),
            attrs: attrs.clone(),
            synthetic,
            at,
        }));
        self.tags.push(id, tag);
        // Room for a short body at once (most elements of markup-dense
        // output are under 64 bytes) instead of growing 8, 16, 32, 64.
        let text = Vec::with_capacity(64);
        let body = self.registry.tag(tag).body;
        OpenElement {
            id,
            tag,
            body,
            raw_tag,
            attrs,
            start: at,
            opened,
            text,
            truncated: false,
            quote: JsonString::Out,
            watch: None,
        }
    }

    /// Opens the lead (at the start of output) or the default tag (between
    /// elements) before bare text at `at`.
    fn open_for_bare_text(&mut self, at: usize, at_start: bool) -> Option<OpenElement> {
        let reg = self.registry.clone();
        let (tag, opened) = bare_text_opens(&reg, at_start)?;
        let spec = reg.tag(tag);
        if !spec.bare {
            self.repair(RepairKind::HeaderInserted, Some(tag), at, None, None, None);
        }
        // The open tag of an element whose tag may still change is written
        // once it is known (a bare default writes none either way).
        let may_change = opened == Opened::ImplicitLead || (opened == Opened::ImplicitDefault && !spec.bare);
        if may_change {
            if let Some(r) = &mut self.rewrite {
                r.hold_open();
            }
        } else {
            self.rewrite_open(tag);
        }
        Some(self.open_element(tag, self.spelling(tag), AttrMap::new(), at, opened))
    }

    /// Appends inner text to the open element: to its element text (up to
    /// the limit), to its deltas (streaming bodies, or overflow), and to the
    /// rewrite.
    fn element_text(&mut self, el: &mut OpenElement, bytes: &[u8]) {
        let kept = keep_text(self.limits, el, bytes);
        self.text_kept(el.id, el.tag, el.body, bytes, kept);
    }

    /// The events of text added to an element: the diagnostic when the text
    /// first passes the size limit (`Kept::Cut`), the delta, the rewrite.
    fn text_kept(&mut self, id: u32, tag: TagId, body: BodyKind, bytes: &[u8], kept: Kept) {
        let kept = match kept {
            Kept::All => bytes.len(),
            Kept::Part(n) => n,
            Kept::Cut(n) => {
                self.text_cut(id, tag);
                n
            }
        };
        if body.machine_deltas() {
            self.push_text(TextTarget::Delta { id, tag }, bytes);
        } else if kept < bytes.len() {
            self.push_text(TextTarget::Delta { id, tag }, &bytes[kept..]);
        }
        self.rewrite_raw(bytes);
    }

    /// The diagnostic of an element whose text first passed the size limit
    /// (out of line: the hot text path stays small).
    #[cold]
    #[inline(never)]
    fn text_cut(&mut self, id: u32, tag: TagId) {
        // The text so far goes out before the diagnostic, but a character
        // it ends inside waits for its last bytes, as at a chunk's end.
        self.flush_text(false);
        let d = Diagnostic {
            level: Level::Warning,
            code: DiagnosticCode::ElementTooLarge,
            tag: Some(self.name(tag)),
            element: Some(id),
            at: None,
            message: format!(
                "element text passed the {}-byte limit; the element keeps the first part, the rest arrives as deltas",
                self.limits.max_element_len
            ),
        };
        self.push_event(Event::Diagnostic(d));
    }

    fn gap(&mut self, at: usize, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let target = match self.text_target {
            TextTarget::Gap { start } if start + self.text_buf.len() == at => self.text_target,
            _ => TextTarget::Gap { start: at },
        };
        self.push_text(target, bytes);
        self.rewrite_raw(bytes);
    }

    /// Emits `close` and `element` for `el`. `end` is where the element ends
    /// (after its close tag, or where it was cut); `close_at` where its close
    /// tag starts.
    fn complete(&mut self, el: OpenElement, close_at: usize, end: usize, synthetic: bool) {
        if self.call_omit == (CallOmit::Inside { id: el.id }) {
            self.call_omit = CallOmit::Idle;
            if let Some(r) = &mut self.rewrite {
                r.end_omit();
            }
        }
        if self.call_omit != CallOmit::Off
            && self.is_call_tag(el.tag)
            && let Some(r) = &mut self.rewrite
        {
            // Where it ended, for what replaces it (left out, or kept: one
            // whose open was never seen, one shown in a code block).
            r.mark(el.id);
        }
        if el.opened == Opened::ImplicitDefault {
            // Not reclassified: it was the default tag after all.
            self.mark_seen(el.tag, el.id);
            let spec = self.registry.tag(el.tag);
            if let Some(r) = &mut self.rewrite {
                r.resolve(if spec.bare { None } else { Some(spec.spelling.as_str()) });
            }
        }
        // The element's bytes become its text (a short body in place).
        let text = crate::scan::into_text(el.text).unwrap_or_else(|s| {
            self.report_invalid_utf8();
            s
        });
        let tag = self.name(el.tag);
        self.emit(Event::Close(Close { id: el.id, tag: tag.clone(), synthetic, at: close_at }));
        self.emit(Event::Element(Box::new(Element {
            id: el.id,
            tag,
            raw_tag: el.raw_tag,
            attrs: el.attrs,
            text,
            payload: serde_json::Value::Null,
            span: Span::new(el.start, end),
            truncated: el.truncated,
        })));
    }

    /// Ends `el` because something else begins at `at` (auto-close) or the
    /// input ended (`eof`).
    fn close_synthetic(&mut self, mut el: OpenElement, at: usize, kind: RepairKind, next: Option<TagId>) {
        if el.opened == Opened::ImplicitLead {
            match self.decide_lead_on_end(next) {
                Some(tag) => {
                    self.reclassify(&mut el, tag, at);
                }
                None if matches!(self.lead, LeadCheck::Open { .. }) => {
                    // Undecided: queue from here on.
                    let id = el.id;
                    self.flush_text(true);
                    self.lead = LeadCheck::Queued { id, queue: Vec::new(), queued_bytes: 0 };
                    if let Some(r) = &mut self.rewrite {
                        r.hold_close();
                    }
                    if !self.registry.tag(el.tag).bare {
                        self.repair(kind, Some(el.tag), at, Some(el.id), None, None);
                    }
                    self.complete(el, at, at, true);
                    return;
                }
                None => {}
            }
        }
        if !self.registry.tag(el.tag).bare {
            self.repair(kind, Some(el.tag), at, Some(el.id), None, None);
        }
        self.rewrite_close(&el);
        self.complete(el, at, at, true);
    }

    /// Closes `el` with the close tag `close` (resolving a held close).
    fn close_with_tag(&mut self, el: OpenElement, close: Span) {
        self.complete(el, close.start, close.end, false);
    }

    /// `<B>` (a registry tag, or a registry special marker) opens.
    fn on_open(&mut self, tag: TagId, raw_tag: TagName, attrs: AttrMap, span: Span, raw: &[u8], self_closing: bool) {
        // A call inside an open code block is an example the model shows
        // (read from the text of what is open, before it closes): wherever
        // calls are read, not only where they are left out of the text, so
        // that no runtime runs it.
        let in_code_block = self.is_call_tag(tag) && self.inside_code_block();
        let state = std::mem::replace(&mut self.state, State::Between);
        match state {
            State::Start | State::Between => {}
            State::VoidOpen(el, hold) => self.end_void(el, hold),
            State::Open(el) if el.tag == tag && !self_closing && self.registry.tag(tag).mergeable => {
                // `<A>` again while A is open: the model repeated itself;
                // one element, the repeated open dropped.
                if el.opened == Opened::ImplicitLead && matches!(self.lead, LeadCheck::Open { .. }) {
                    self.settle_lead(None);
                }
                self.repair(RepairKind::MergedAdjacent, Some(tag), span.start, Some(el.id), Some(span), None);
                self.state = State::Open(el);
                return;
            }
            State::Open(el) => {
                self.close_synthetic(el, span.start, RepairKind::AutoClosed, Some(tag));
            }
            State::CloseHeld(el, held) if el.tag == tag && !self_closing && matches!(held.hold, Hold::Merge) => {
                // `</A>` whitespace `<A>`: one element.
                let dropped = Span::new(held.span.start, span.end);
                self.repair(RepairKind::MergedAdjacent, Some(tag), held.span.start, Some(el.id), Some(dropped), None);
                if let Some(r) = &mut self.rewrite {
                    r.drop_held();
                }
                self.state = State::Open(el);
                return;
            }
            State::CloseHeld(el, held) => {
                self.resolve_held(el, held);
            }
        }
        // Decided now that what was open is closed: a call that ends an
        // open call is left out too.
        let omitted_call = self.call_omit == CallOmit::Idle && self.is_call_tag(tag);
        let example = in_code_block && matches!(self.call_omit, CallOmit::Off | CallOmit::Idle);
        if omitted_call
            && !example
            && let Some(r) = &mut self.rewrite
        {
            r.begin_omit();
        }
        self.rewrite_raw(raw);
        let el = self.open_element(tag, raw_tag, attrs, span.start, Opened::Tag);
        if omitted_call && !example {
            self.call_omit = CallOmit::Inside { id: el.id };
        } else if example {
            self.emit(Event::Diagnostic(Diagnostic {
                level: Level::Info,
                code: DiagnosticCode::CallInCodeBlock,
                tag: Some(self.name(tag)),
                element: Some(el.id),
                at: Some(span.start),
                message: "this call sits inside an open Markdown code block: an example, kept in the text".into(),
            }));
        }
        if self_closing {
            // `<media/>` closes where it ends: its (empty) inner text sits
            // after the whole tag, as a close tag would follow it.
            self.complete(el, span.end, span.end, false);
            self.state = State::Between;
        } else if self.registry.tag(tag).body == BodyKind::Void {
            self.state = State::VoidOpen(el, VoidHold { tag_end: span.end, held: Vec::new() });
        } else {
            self.state = State::Open(el);
        }
    }

    /// A close with nothing of its tag open: dropped, with a repair that
    /// keeps its spelling.
    fn stray_close(&mut self, tag: TagId, span: Span, raw_tag: &[u8]) {
        let written = crate::scan::owned_text(raw_tag);
        self.repair(RepairKind::StrayCloseDropped, Some(tag), span.start, None, Some(span), Some(written));
    }

    /// `</B>` (a registry tag, or a closing special marker). `by_marker`
    /// says it was a special marker, whose name never matches the opening
    /// marker's (`END_TOOL` closes `REQUEST_TOOL`).
    fn on_close(&mut self, tag: TagId, raw_tag: &[u8], span: Span, raw: &[u8], by_marker: bool) {
        let state = std::mem::replace(&mut self.state, State::Between);
        let state = match state {
            // `<media ...>` `</media>`: an ordinary element after all.
            State::VoidOpen(mut el, hold) if el.tag == tag => {
                self.element_text(&mut el, &hold.held);
                State::Open(el)
            }
            other => other,
        };
        match state {
            // The chat template opened the lead and the model closed it at
            // once (`</think>` first): an empty lead, as `x</think>` is a
            // lead holding `x`, so that its rewrite reads the same again.
            State::Start
                if self.registry.lead_open() == LeadOpen::Template
                    && self.registry.lead() == Some(tag)
                    && let Some(el) = self.open_for_bare_text(span.start, true) =>
            {
                self.state = State::Open(el);
                self.on_close(tag, raw_tag, span, raw, by_marker);
            }
            State::Start | State::Between => {
                self.stray_close(tag, span, raw_tag);
            }
            State::VoidOpen(el, hold) => {
                self.end_void(el, hold);
                self.stray_close(tag, span, raw_tag);
            }
            State::CloseHeld(el, held) => {
                self.resolve_held(el, held);
                self.stray_close(tag, span, raw_tag);
            }
            State::Open(mut el) => {
                if el.opened == Opened::ImplicitDefault && tag != el.tag {
                    // `hm</think>`: the bare text at the start was a B.
                    self.reclassify(&mut el, tag, span.start);
                    el.opened = Opened::Synthetic;
                }
                if el.opened == Opened::ImplicitLead && matches!(self.lead, LeadCheck::Open { .. }) {
                    // `</lead>` confirms the lead; `</B>` proves it was a B.
                    let reg = self.registry.clone();
                    if Some(tag) == reg.lead() {
                        self.settle_lead(None);
                    } else {
                        self.reclassify(&mut el, tag, span.start);
                    }
                }
                let spec = self.registry.tag(el.tag);
                let mergeable = spec.mergeable;
                let same_spelling = by_marker || raw_tag.eq_ignore_ascii_case(el.raw_tag.as_bytes());
                if tag != el.tag || (!same_spelling && el.opened == Opened::Tag) {
                    // `</B>` closes A, or an alias does: `<think>...</thought>`.
                    self.repair(
                        RepairKind::MismatchedClose,
                        Some(el.tag),
                        span.start,
                        Some(el.id),
                        None,
                        Some(crate::scan::owned_text(raw_tag)),
                    );
                    let spelling = el.raw_tag.clone();
                    if let Some(r) = &mut self.rewrite {
                        r.push_tag(&spelling, true);
                    }
                    self.close_with_tag(el, span);
                    return;
                }
                if in_value(&mut el) {
                    self.flush_text(true);
                    if let Some(r) = &mut self.rewrite {
                        r.hold_raw(raw);
                    }
                    self.held_space.clear();
                    self.state = State::CloseHeld(el, HeldClose { span, hold: Hold::InValue(raw.into()) });
                    return;
                }
                // The rewrite closes in the opening's spelling, so that an
                // inserted `<think>` is not closed by `</thought>`.
                let respelled;
                let close_bytes: &[u8] = if same_spelling {
                    raw
                } else {
                    respelled = format!("</{}>", el.raw_tag);
                    respelled.as_bytes()
                };
                if mergeable {
                    self.flush_text(true);
                    if let Some(r) = &mut self.rewrite {
                        r.hold_raw(close_bytes);
                    }
                    self.held_space.clear();
                    self.state = State::CloseHeld(el, HeldClose { span, hold: Hold::Merge });
                    return;
                }
                self.rewrite_raw(close_bytes);
                self.close_with_tag(el, span);
            }
        }
    }

    /// A void element with no close: it ends at its open tag, and the text
    /// held after it is read as ordinary text between elements. Not a
    /// repair: void tags need no close.
    fn end_void(&mut self, el: OpenElement, hold: VoidHold) {
        self.complete(el, hold.tag_end, hold.tag_end, true);
        self.state = State::Between;
        if !hold.held.is_empty() {
            self.on_text(Span::new(hold.tag_end, hold.tag_end + hold.held.len()), &hold.held);
        }
    }

    /// Ends a pending void element before a token that is not its close.
    fn settle_void(&mut self, token: &Token<'_>) {
        let State::VoidOpen(el, _) = &self.state else { return };
        let keep = match token {
            // Text is held (see `on_text`); comments and CDATA end the wait.
            Token::Text { .. } => true,
            Token::Tag(t) => t.kind == TagKind::Close && self.registry.lookup(t.name) == Some(el.tag),
            _ => false,
        };
        if !keep && let State::VoidOpen(el, hold) = std::mem::replace(&mut self.state, State::Between) {
            self.end_void(el, hold);
        }
    }

    /// A held `</A>` turned out to be a real close: close, and hand the
    /// whitespace after it to no element.
    fn resolve_held(&mut self, el: OpenElement, held: HeldClose) {
        if let Some(r) = &mut self.rewrite {
            r.release_held();
        }
        let span = held.span;
        self.close_with_tag(el, span);
        let space = self.take_held_space();
        self.gap(span.end, &space);
        self.keep_held_space(space);
        self.state = State::Between;
    }

    /// The held whitespace, out of the machine while it is read.
    fn take_held_space(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held_space)
    }

    /// Gives the buffer of [`Machine::take_held_space`] back, emptied; a
    /// large one is dropped, so that memory follows what is held now.
    fn keep_held_space(&mut self, mut space: Vec<u8>) {
        if space.capacity() <= HELD_SPACE_ROOM {
            space.clear();
            self.held_space = space;
        }
    }

    #[inline]
    fn on_text(&mut self, span: Span, bytes: &[u8]) {
        if let State::Open(el) = &mut self.state {
            // The common case, without moving the element out and back.
            let (id, tag, body) = (el.id, el.tag, el.body);
            let kept = keep_text(self.limits, el, bytes);
            self.text_kept(id, tag, body, bytes, kept);
            return;
        }
        self.on_text_between(span, bytes);
    }

    /// [`Machine::on_text`] in any state but an open element (out of line:
    /// the common case stays small).
    #[inline(never)]
    fn on_text_between(&mut self, span: Span, bytes: &[u8]) {
        let state = std::mem::replace(&mut self.state, State::Between);
        match state {
            // Read above, in place.
            State::Open(el) => self.state = State::Open(el),
            State::Start | State::Between => {
                let at_start = matches!(state, State::Start);
                let n = leading_space(bytes);
                self.gap(span.start, &bytes[..n]);
                if n == bytes.len() {
                    self.state = state;
                    return;
                }
                match self.open_for_bare_text(span.start + n, at_start) {
                    Some(mut el) => {
                        self.element_text(&mut el, &bytes[n..]);
                        self.state = State::Open(el);
                    }
                    None => {
                        // A registry with no default tag has nowhere to put
                        // bare text; keep it as a gap rather than lose it.
                        self.push_text(TextTarget::Gap { start: span.start + n }, &bytes[n..]);
                        self.rewrite_raw(&bytes[n..]);
                        self.state = state;
                    }
                }
            }
            State::VoidOpen(el, mut hold) => {
                hold.held.extend_from_slice(bytes);
                if hold.held.len() > VOID_BODY_LIMIT {
                    self.end_void(el, hold);
                } else {
                    self.state = State::VoidOpen(el, hold);
                }
            }
            State::CloseHeld(el, held) => {
                let n = leading_space(bytes);
                self.held_space.extend_from_slice(&bytes[..n]);
                if self.held_space.len() > MERGE_SPACE_LIMIT {
                    // Too far apart to be one element cut in two: the
                    // close stands (the whitespace held is a gap).
                    let tag = self.name(el.tag);
                    let message = match held.hold {
                        Hold::Merge => format!(
                            "more than {MERGE_SPACE_LIMIT} bytes of whitespace after </{tag}>: it stays closed, and a <{tag}> after them starts a new element"
                        ),
                        Hold::InValue(_) => format!(
                            "more than {MERGE_SPACE_LIMIT} bytes of whitespace after </{tag}> inside a value: it stays closed, and what follows is not the value's text"
                        ),
                    };
                    self.emit(Event::Diagnostic(Diagnostic {
                        level: Level::Info,
                        code: DiagnosticCode::MergeSpaceTooLong,
                        message,
                        tag: Some(tag),
                        element: Some(el.id),
                        at: Some(held.span.end),
                    }));
                    self.resolve_held(el, held);
                    if n < bytes.len() {
                        self.on_text(Span::new(span.start + n, span.end), &bytes[n..]);
                    }
                    return;
                }
                if n == bytes.len() {
                    self.state = State::CloseHeld(el, held);
                    return;
                }
                self.settle_held(el, held);
                self.on_text(Span::new(span.start + n, span.end), &bytes[n..]);
            }
        }
    }

    /// Settles a held close before the first byte after it that is not
    /// whitespace (the byte is the caller's to pass on): after
    /// `</content>` bare text goes on in the same element (merged, the
    /// whitespace its text); a close inside a value goes on with the value
    /// (the close and the whitespace its text); any other close stands (the
    /// whitespace a gap).
    fn settle_held(&mut self, el: OpenElement, held: HeldClose) {
        if let Hold::InValue(raw) = held.hold {
            return self.value_goes_on(el, held.span, &raw);
        }
        if Some(el.tag) != self.registry.default_tag() {
            return self.resolve_held(el, held);
        }
        self.repair(RepairKind::MergedAdjacent, Some(el.tag), held.span.start, Some(el.id), Some(held.span), None);
        self.goes_on_after_held(el, b"");
    }

    /// A close held inside a value turned out to be the value's text: the
    /// element goes on, with the close as written and the whitespace after
    /// it as its text.
    fn value_goes_on(&mut self, el: OpenElement, span: Span, raw: &[u8]) {
        let tag = self.name(el.tag);
        self.emit(Event::Diagnostic(Diagnostic {
            level: Level::Info,
            code: DiagnosticCode::CloseInValue,
            message: format!("</{tag}> stood inside a value the element was writing out, and the value went on: it is the value's text"),
            tag: Some(tag),
            element: Some(el.id),
            at: Some(span.start),
        }));
        self.goes_on_after_held(el, raw);
    }

    /// A held close that closed nothing: the element is open again, with
    /// `close` (what of the close is its text: nothing for a merge) and
    /// the whitespace held after it as its text.
    fn goes_on_after_held(&mut self, mut el: OpenElement, close: &[u8]) {
        if let Some(r) = &mut self.rewrite {
            r.drop_held();
        }
        if !close.is_empty() {
            self.element_text(&mut el, close);
        }
        let space = self.take_held_space();
        if !space.is_empty() {
            self.element_text(&mut el, &space);
        }
        self.keep_held_space(space);
        self.state = State::Open(el);
    }

    fn on_comment(&mut self, span: Span, raw: &[u8], body: &[u8]) {
        let state = std::mem::replace(&mut self.state, State::Between);
        let state = match state {
            // A comment inside a value is the value's text.
            State::CloseHeld(el, held) if matches!(held.hold, Hold::InValue(_)) => {
                self.settle_held(el, held);
                std::mem::replace(&mut self.state, State::Between)
            }
            State::CloseHeld(el, held) => {
                self.resolve_held(el, held);
                State::Between
            }
            other => other,
        };
        let (element, tag) = match &state {
            State::Open(el) => (Some(el.id), Some(self.name(el.tag))),
            _ => (None, None),
        };
        let text = crate::scan::copied_text(body).unwrap_or_else(|s| s);
        self.emit(Event::Comment(Comment { element, tag, text, span }));
        match state {
            State::Open(mut el) => {
                self.element_text(&mut el, raw);
                self.state = State::Open(el);
            }
            other => {
                self.rewrite_raw(raw);
                self.state = other;
            }
        }
    }

    /// A token that is text wherever it appears (a non-registry tag, CDATA,
    /// an unknown special marker).
    #[inline]
    fn on_markup_text(&mut self, span: Span, raw: &[u8]) {
        self.on_text(span, raw);
    }

    fn on_tag(&mut self, tag: TagToken<'_>) {
        // The registry is read through `self` (no `Arc` clone: a tag of
        // HTML in content takes this path, one per tag).
        let Some(id) = self.registry.lookup(tag.name) else {
            return self.on_markup_text(tag.span, tag.raw);
        };
        if let State::Open(el) = &mut self.state {
            let body = self.registry.tag(el.tag).body;
            let own_close = tag.kind == TagKind::Close && id == el.tag;
            if (!own_close && (body.is_opaque() || in_value(el))) || self.registry.is_child(el.tag, tag.name) {
                return self.on_markup_text(tag.span, tag.raw);
            }
            // Where calls are left out of the text (the proxy), a call in
            // an open code block keeps its own reading there (an example
            // element, see `on_open`); elsewhere, and in a code span, it is
            // text as any tag (`` wrap the JSON in `<tool_call>` tags ``).
            let code = if own_close { MarkdownCode::default() } else { code_so_far(el) };
            let example_element = self.call_omit != CallOmit::Off && code.in_block() && self.is_call_tag(id);
            if code.in_code() && !example_element {
                self.note_tag_in_code(id, tag.span.start);
                return self.on_markup_text(tag.span, tag.raw);
            }
        }
        match tag.kind {
            TagKind::Open | TagKind::SelfClosing => {
                let attrs = tag
                    .attrs()
                    .map(|a| (crate::scan::owned_text(a.name), crate::scan::decode_entities(a.value)))
                    .collect();
                let raw_tag = self.raw_name(id, tag.name);
                self.on_open(id, raw_tag, attrs, tag.span, tag.raw, tag.kind == TagKind::SelfClosing);
            }
            TagKind::Close => self.on_close(id, tag.name, tag.span, tag.raw, false),
        }
    }

    /// Says once per element that registry tags inside its Markdown code
    /// are read as the code's text (the first is `tag`, at `at`).
    fn note_tag_in_code(&mut self, tag: TagId, at: usize) {
        let State::Open(el) = &mut self.state else { return };
        let noted = match el.watch.as_deref_mut() {
            Some(Watch::Code(watch)) => std::mem::replace(&mut watch.noted, true),
            _ => true,
        };
        if noted {
            return;
        }
        let (id, open) = (el.id, el.tag);
        let message = format!(
            "<{}> and any other registry tag inside Markdown code in <{}> is the code's text, not an element",
            self.name(tag),
            self.name(open)
        );
        self.emit(Event::Diagnostic(Diagnostic {
            level: Level::Info,
            code: DiagnosticCode::TagInCode,
            tag: Some(self.name(open)),
            element: Some(id),
            at: Some(at),
            message,
        }));
    }

    fn on_special(&mut self, span: Span, raw: &[u8], name: &[u8]) {
        let Some((id, role)) = self.registry.lookup_marker(name) else {
            return self.on_unknown_special(span, raw);
        };
        if let State::Open(el) = &mut self.state {
            let opaque = self.registry.tag(el.tag).body.is_opaque();
            let own_close = role == MarkerRole::Close && id == el.tag;
            if !own_close && (opaque || in_value(el)) {
                return self.on_markup_text(span, raw);
            }
        }
        match role {
            MarkerRole::Open => self.on_open(id, self.raw_name(id, name), AttrMap::new(), span, raw, false),
            MarkerRole::Close => self.on_close(id, name, span, raw, true),
        }
    }

    /// A special marker the registry does not know (`<|im_end|>`,
    /// `<|eot_id|>`): chat-template tokens leaked by a server. Inside an
    /// element it is that element's text; between elements it would invent
    /// a content element, so it is dropped and announced.
    fn on_unknown_special(&mut self, span: Span, raw: &[u8]) {
        let state = std::mem::replace(&mut self.state, State::Between);
        let state = match state {
            State::CloseHeld(el, held) => {
                self.resolve_held(el, held);
                State::Between
            }
            State::Open(el) => {
                self.state = State::Open(el);
                return self.on_markup_text(span, raw);
            }
            other => other,
        };
        self.state = state;
        let token = String::from_utf8_lossy(raw).into_owned();
        self.repair(RepairKind::SpecialTokenDropped, None, span.start, None, Some(span), Some(token));
    }

    /// A marker cut off by the end of input: dropped (with a repair) when it
    /// was on its way to a registry tag, otherwise text of whatever is open.
    ///
    /// While the name is still being read (`<thi`), a prefix of a registry
    /// name is enough; once the name is complete (`<thin is a word`,
    /// `</thin `), only a registry name or alias makes it a marker.
    fn on_unfinished(&mut self, span: Span, raw: &[u8], kind: UnfinishedKind, name: &[u8]) {
        let reg = self.registry.clone();
        // Inside Markdown code, too, only the element's own close ends it.
        let opaque_tag = match &mut self.state {
            State::Open(el) => (reg.tag(el.tag).body.is_opaque() || code_so_far(el).in_code()).then_some(el.tag),
            _ => None,
        };
        // A close inside an opaque body can only be the element's own.
        let own_name = |t: TagId, exact: bool| {
            let spec = reg.tag(t);
            std::iter::once(&spec.name)
                .chain(&spec.aliases)
                .any(|n| if exact { n.as_bytes().eq_ignore_ascii_case(name) } else { prefix_of(name, n.as_bytes()) })
        };
        let cut_marker = match kind {
            UnfinishedKind::OpenTagName => opaque_tag.is_none() && !name.is_empty() && reg.is_name_prefix(name),
            UnfinishedKind::OpenTag => opaque_tag.is_none() && reg.lookup(name).is_some(),
            UnfinishedKind::CloseTagName => match opaque_tag {
                Some(t) => name.is_empty() || own_name(t, false),
                None => name.is_empty() || reg.is_name_prefix(name),
            },
            UnfinishedKind::CloseTag => match opaque_tag {
                Some(t) => own_name(t, true),
                None => reg.lookup(name).is_some(),
            },
            UnfinishedKind::Special => {
                let inner = raw.get(2..).unwrap_or_default();
                reg.is_marker_prefix(inner.strip_suffix(b"|").unwrap_or(inner))
                    && reg.tags().iter().any(|t| t.markers.is_some())
            }
            UnfinishedKind::Lt | UnfinishedKind::Comment => false,
        };
        if cut_marker {
            let tag = reg.lookup(name);
            let element = match &self.state {
                State::Open(el) => Some(el.id),
                _ => None,
            };
            self.repair(
                RepairKind::TruncatedMarker,
                tag,
                span.start,
                element,
                Some(span),
                Some(String::from_utf8_lossy(raw).into_owned()),
            );
        } else {
            self.on_text(span, raw);
            if kind == UnfinishedKind::Comment {
                self.close_cut_comment(span, raw);
            }
        }
    }

    /// A comment or CDATA section the end of input cut off stays text; the
    /// corrected text closes it, or the synthetic closes written after it
    /// would be inside it when the corrected text is read again.
    fn close_cut_comment(&mut self, span: Span, raw: &[u8]) {
        let close: &str = if raw.starts_with(b"<!--") {
            "-->"
        } else if raw.starts_with(b"<![CDATA[") {
            "]]>"
        } else {
            // `<!`, `<!-`, `<![CD`: not a comment yet, nothing to close.
            return;
        };
        let element = match &self.state {
            State::Open(el) => Some(el.id),
            _ => None,
        };
        self.emit(Event::Repair(Box::new(Repair {
            kind: RepairKind::CommentClosedAtEof,
            tag: None,
            at: span.end,
            element,
            span: None,
            from: None,
            text: Some(close.to_string()),
        })));
        self.rewrite_raw(close.as_bytes());
    }

    /// Ends the input at offset `end`.
    pub(crate) fn finish(&mut self, end: usize) {
        self.settle_fence(None);
        // A pending void element ends first: the text it held may open an
        // element that the end of input must then close.
        if matches!(self.state, State::VoidOpen(..))
            && let State::VoidOpen(el, hold) = std::mem::replace(&mut self.state, State::Between)
        {
            self.end_void(el, hold);
        }
        let state = std::mem::replace(&mut self.state, State::Between);
        match state {
            State::VoidOpen(el, hold) => self.end_void(el, hold),
            State::Open(el) => {
                self.close_synthetic(el, end, RepairKind::ClosedAtEof, None);
            }
            State::CloseHeld(el, held) => self.resolve_held(el, held),
            State::Start | State::Between => {}
        }
        if !matches!(self.lead, LeadCheck::Settled) {
            let default = self.registry.default_tag();
            self.settle_lead(default);
        }
        self.flush_text(true);
        self.end_diagnostics();
        self.invalid_utf8_diagnostic();
        self.flush_text(true);
        if let Some(r) = &mut self.rewrite {
            r.release_held();
        }
    }

    fn end_diagnostics(&mut self) {
        let reg = self.registry.clone();
        for (i, spec) in reg.tags().iter().enumerate() {
            let id = TagId(i as u16);
            if spec.mandatory && self.first_seen[i].is_none() {
                let msg = format!("the response has no <{}> element", spec.name);
                self.diagnostic(Level::Warning, DiagnosticCode::MissingMandatory, Some(id), &msg);
            }
            let Some(me) = self.first_seen[i] else { continue };
            for &before in &spec.after {
                if let Some(b) = self.first_seen[before.index()]
                    && b > me
                {
                    let msg =
                        format!("<{}> appeared before <{}>, which it should follow", spec.name, reg.tag(before).name);
                    self.diagnostic(Level::Warning, DiagnosticCode::OrderViolation, Some(id), &msg);
                }
            }
        }
    }

    fn mark_seen(&mut self, tag: TagId, id: u32) {
        let slot = &mut self.first_seen[tag.index()];
        if slot.is_none_or(|first| id < first) {
            *slot = Some(id);
        }
    }

    // ----- the implicit lead ------------------------------------------

    /// The implicit lead element ends because `next` opens (or input ends,
    /// `None`). Returns the tag it must become, if that is now known and is
    /// not the lead; settles the check when it is the lead.
    fn decide_lead_on_end(&mut self, next: Option<TagId>) -> Option<TagId> {
        let reg = self.registry.clone();
        let default = reg.default_tag()?;
        match next {
            None => Some(default),
            Some(t) if t == default => {
                self.settle_lead(None);
                None
            }
            Some(t) if reg.tag(t).after.contains(&default) => Some(default),
            Some(_) => None,
        }
    }

    /// While the lead is open or queued, an element `tag` opening may decide
    /// it: content confirms it, a tag that must follow content proves the
    /// lead was content.
    fn lead_sees_open(&mut self, tag: TagId) {
        if !matches!(self.lead, LeadCheck::Queued { .. }) {
            return;
        }
        let reg = self.registry.clone();
        let Some(default) = reg.default_tag() else { return };
        if tag == default {
            self.settle_lead(None);
        } else if reg.tag(tag).after.contains(&default) {
            self.settle_lead(Some(default));
        }
    }

    /// Changes the tag of the open implicit lead element.
    fn reclassify(&mut self, el: &mut OpenElement, tag: TagId, at: usize) {
        let from = self.registry.tag(el.tag).name.clone();
        el.tag = tag;
        el.body = self.registry.tag(tag).body;
        el.raw_tag = self.spelling(tag);
        self.lead = LeadCheck::Settled;
        self.mark_seen(tag, el.id);
        if let Some(r) = &mut self.rewrite {
            let spec = self.registry.tag(tag);
            r.resolve(if spec.bare { None } else { Some(spec.spelling.as_str()) });
        }
        self.repair(RepairKind::Reclassified, Some(tag), at, Some(el.id), None, Some(from));
        self.tags.push(el.id, tag);
    }

    /// Decides the implicit lead: `None` keeps the lead tag, `Some(tag)`
    /// reclassifies it. Releases queued events.
    fn settle_lead(&mut self, new_tag: Option<TagId>) {
        let state = std::mem::replace(&mut self.lead, LeadCheck::Settled);
        let reg = self.registry.clone();
        let final_tag = match (new_tag, reg.lead()) {
            (Some(t), _) => t,
            (None, Some(lead)) => lead,
            (None, None) => return,
        };
        let spec = reg.tag(final_tag);
        if let Some(r) = &mut self.rewrite {
            r.resolve(if spec.bare { None } else { Some(spec.spelling.as_str()) });
        }
        match &state {
            LeadCheck::Open { id } | LeadCheck::Queued { id, .. } => self.mark_seen(final_tag, *id),
            LeadCheck::Settled => {}
        }
        match state {
            LeadCheck::Settled => {}
            LeadCheck::Open { id } => {
                if let (Some(t), State::Open(el)) = (new_tag, &mut self.state)
                    && el.id == id
                {
                    el.tag = t;
                    el.body = spec.body;
                    el.raw_tag = reg.event_names(t).1.clone();
                }
            }
            LeadCheck::Queued { id, mut queue, .. } => {
                if let Some(t) = new_tag {
                    if spec.bare {
                        // A bare element (written without tags) has no
                        // close tag to miss: the close queued as a repair
                        // of the lead is no repair of what it proved to be,
                        // as for bare text read as that tag from the start.
                        queue.retain(|ev| {
                            !matches!(ev, Event::Repair(r) if r.element == Some(id) && r.kind == RepairKind::AutoClosed)
                        });
                    }
                    let name = self.name(t);
                    let spelling = self.spelling(t);
                    let from = reg.lead().map(|l| reg.tag(l).name.clone());
                    let mut at = 0;
                    for ev in &mut queue {
                        match ev {
                            Event::Close(c) if c.id == id => {
                                c.tag = name.clone();
                                at = c.at;
                            }
                            Event::Element(e) if e.id == id => {
                                e.tag = name.clone();
                                e.raw_tag = spelling.clone();
                            }
                            Event::Repair(r) if r.element == Some(id) => r.tag = Some(name.clone()),
                            _ => {}
                        }
                    }
                    self.tags.push(id, t);
                    self.events.push(Event::Repair(Box::new(Repair {
                        kind: RepairKind::Reclassified,
                        tag: Some(name),
                        at,
                        element: Some(id),
                        span: None,
                        from,
                        text: None,
                    })));
                }
                self.events.append(&mut queue);
            }
        }
    }

    // ----- fences around call blocks ------------------------------------

    /// Text, seen first by the fence watch: a suffix that may be the
    /// opening fence of a call block is held; the rest goes on.
    fn fenced_text(&mut self, span: Span, bytes: &[u8]) {
        // The common case, read in place: `watch_text` sets the watch.
        if let FenceWatch::Idle { line_start } = self.fence {
            return self.watch_text(span.start, bytes, line_start);
        }
        match std::mem::replace(&mut self.fence, FenceWatch::Off) {
            FenceWatch::Off => self.on_text(span, bytes),
            FenceWatch::InBlock { tag } => {
                self.fence = FenceWatch::InBlock { tag };
                self.on_text(span, bytes);
            }
            FenceWatch::Idle { line_start } => self.watch_text(span.start, bytes, line_start),
            FenceWatch::Opening { start, mut held } => {
                held.extend_from_slice(bytes);
                self.watch_text(start, &held, true);
            }
            FenceWatch::Closing { start, mut held, tag } => {
                held.extend_from_slice(bytes);
                match closing_fence(&held, false) {
                    Closing::Fence(n) => {
                        self.drop_fence(start, &held[..n], tag);
                        self.watch_text(start + n, &held[n..], true);
                    }
                    Closing::Partial if held.len() <= FENCE_HOLD_LIMIT => {
                        self.fence = FenceWatch::Closing { start, held, tag };
                    }
                    Closing::Partial | Closing::No => self.watch_text(start, &held, true),
                }
            }
        }
    }

    /// The common streamed delta, the short way: a chunk of plain text
    /// (no `<`, so the scanner would make it one text token; no backtick,
    /// so it holds no fence) inside an element that streams goes straight
    /// to the element's text and its delta (made at once when nothing is
    /// pending and the chunk ends with a whole character), without the
    /// text token and the fence watch's pass.
    ///
    /// Taken only when the full way does just that: no fence is held, the
    /// chunk fits the element's size limit and does not end in the
    /// indentation a fence may follow. Returns whether it was taken
    /// (nothing changed when not); the caller then drains the events as
    /// after any chunk. The split-invariance tests and the fuzzers compare
    /// chunkings that take either way.
    pub(crate) fn plain_text(&mut self, chunk: &[u8]) -> bool {
        debug_assert!(crate::scan::find_byte2(b'<', b'`', chunk).is_none());
        let State::Open(el) = &mut self.state else { return false };
        let held_fence = match self.fence {
            FenceWatch::Idle { line_start } => {
                el.body == BodyKind::Stream && indentation_suffix(chunk, line_start).is_some()
            }
            FenceWatch::Off | FenceWatch::InBlock { .. } => false,
            FenceWatch::Opening { .. } | FenceWatch::Closing { .. } => true,
        };
        if held_fence
            || chunk.is_empty()
            || !el.body.machine_deltas()
            || el.text.len() + chunk.len() > self.limits.max_element_len
        {
            return false;
        }
        if el.body == BodyKind::Json {
            follow_quotes(el, chunk);
        }
        el.text.extend_from_slice(chunk);
        let (id, tag) = (el.id, el.tag);
        if let FenceWatch::Idle { line_start } = &mut self.fence {
            *line_start = chunk.last() == Some(&b'\n');
        }
        let target = TextTarget::Delta { id, tag };
        if self.text_buf.is_empty() && chunk.last().is_some_and(u8::is_ascii) {
            // Nothing pending, and the chunk ends with a whole character:
            // what `flush_text` would emit once it were pending, at once.
            self.text_target = target;
            self.text_event(crate::scan::copied_text(chunk), chunk.len());
        } else {
            self.push_text(target, chunk);
        }
        self.rewrite_raw(chunk);
        true
    }

    /// Passes `text` (at input offset `start`) on, holding back a suffix
    /// that may be an opening fence when the state is one a call block can
    /// follow.
    fn watch_text(&mut self, start: usize, text: &[u8], line_start: bool) {
        // A held close or a void element waits on text, which settles it
        // part way: a held close before the first byte that is not
        // whitespace, a void element's wait once it has read its limit. The text after
        // that byte is read in the state it leaves, as it would be had a
        // chunk ended there: split-invariant, whatever piece the byte is in.
        if let State::CloseHeld(..) = self.state
            && let k = leading_space(text)
            && k < text.len()
        {
            // Settled before its first byte, so that the byte is watched in
            // the state it leaves (a fence right after `</thought>\n`).
            if k > 0 {
                self.on_text(Span::new(start, start + k), &text[..k]);
            }
            if let State::CloseHeld(el, held) = std::mem::replace(&mut self.state, State::Between) {
                self.settle_held(el, held);
            }
            let line_start = if k > 0 { text[k - 1] == b'\n' } else { line_start };
            return self.watch_text(start + k, &text[k..], line_start);
        }
        let (eligible, settles_at) = match &self.state {
            // Bare text opens an element here: when it does not stream, the
            // text after the byte that opens it is not watched (below).
            State::Start | State::Between => (true, None),
            State::Open(el) => (el.body == BodyKind::Stream, None),
            // Only whitespace here (above): it waits on.
            State::CloseHeld(..) => (false, None),
            State::VoidOpen(_, hold) => (false, Some((VOID_BODY_LIMIT + 1).saturating_sub(hold.held.len()).max(1))),
        };
        if let Some(n) = settles_at.filter(|&n| n < text.len()) {
            self.on_text(Span::new(start, start + n), &text[..n]);
            return self.watch_text(start + n, &text[n..], text[n - 1] == b'\n');
        }
        let cut = if eligible { opening_suffix(text, line_start) } else { None }
            .filter(|&i| text.len() - i <= FENCE_HOLD_LIMIT && (self.bare_text_watched() || i <= leading_space(text)));
        let pass = cut.unwrap_or(text.len());
        if pass > 0 {
            self.on_text(Span::new(start, start + pass), &text[..pass]);
        }
        self.fence = match cut {
            Some(i) => FenceWatch::Opening { start: start + i, held: text[i..].to_vec() },
            None => FenceWatch::Idle { line_start: text.last().map_or(line_start, |&b| b == b'\n') },
        };
    }

    /// Whether text after the first bare byte here is watched for a fence:
    /// always in an open element (the caller reads its body), between
    /// elements only when the element bare text opens streams (or none
    /// opens: the text stays a gap).
    fn bare_text_watched(&self) -> bool {
        let at_start = match self.state {
            State::Start => true,
            State::Between => false,
            State::Open(_) | State::CloseHeld(..) | State::VoidOpen(..) => return true,
        };
        bare_text_opens(&self.registry, at_start).is_none_or(|(tag, _)| self.registry.tag(tag).body == BodyKind::Stream)
    }

    /// Decides held fence text before a token that is not text (`call`:
    /// the call block that token opens, if any) or before the end of input
    /// (`None`).
    #[inline]
    fn settle_fence(&mut self, call: Option<TagId>) {
        // The common case, in place (nothing held: no state moved out), and
        // inline: every tag passes here.
        match &mut self.fence {
            FenceWatch::Idle { line_start } => *line_start = true,
            FenceWatch::Off | FenceWatch::InBlock { .. } => {}
            FenceWatch::Opening { .. } | FenceWatch::Closing { .. } => self.settle_held_fence(call),
        }
    }

    /// [`Machine::settle_fence`] with fence text held (out of line).
    #[inline(never)]
    fn settle_held_fence(&mut self, call: Option<TagId>) {
        match std::mem::replace(&mut self.fence, FenceWatch::Off) {
            FenceWatch::Opening { start, held } => match call {
                Some(tag) if !self.inside_code_block() => {
                    // The fence belongs to the block: the element before
                    // ends where the fence starts.
                    match std::mem::replace(&mut self.state, State::Between) {
                        State::Open(el) => self.close_synthetic(el, start, RepairKind::AutoClosed, Some(tag)),
                        other => self.state = other,
                    }
                    self.drop_fence(start, &held, tag);
                    self.fence = FenceWatch::InBlock { tag };
                }
                _ => {
                    self.on_text(Span::new(start, start + held.len()), &held);
                    self.fence = FenceWatch::Idle { line_start: true };
                }
            },
            FenceWatch::Closing { start, held, tag } => {
                let rest = match closing_fence(&held, true) {
                    Closing::Fence(n) => {
                        self.drop_fence(start, &held[..n], tag);
                        n
                    }
                    Closing::Partial | Closing::No => 0,
                };
                if rest < held.len() {
                    self.on_text(Span::new(start + rest, start + held.len()), &held[rest..]);
                }
                self.fence = FenceWatch::Idle { line_start: true };
            }
            // Settled by `settle_fence`, in place.
            other @ (FenceWatch::Idle { .. } | FenceWatch::Off | FenceWatch::InBlock { .. }) => self.fence = other,
        }
    }

    /// After a token: a call block opened after a dropped fence has ended,
    /// so its closing fence may follow.
    fn watch_block_end(&mut self, end: usize) {
        let FenceWatch::InBlock { tag } = self.fence else {
            return;
        };
        match &self.state {
            State::Open(el) if is_call_block(self.registry.tag(el.tag).body) => {}
            State::Start | State::Between => self.fence = FenceWatch::Closing { start: end, held: Vec::new(), tag },
            _ => self.fence = FenceWatch::Idle { line_start: true },
        }
    }

    /// Whether the open element's text leaves a Markdown code block open,
    /// so that a fence closes it rather than opening a call block's.
    fn inside_code_block(&mut self) -> bool {
        match &mut self.state {
            State::Open(el) => code_so_far(el).in_block(),
            _ => false,
        }
    }

    /// Takes a fence out of the text around a call block. The rewrite
    /// keeps it: it is the model's formatting, not a structural fault, and a
    /// well-formed fenced response should rewrite to itself.
    fn drop_fence(&mut self, start: usize, fence: &[u8], tag: TagId) {
        let span = Span::new(start, start + fence.len());
        let text = crate::scan::copied_text(fence).unwrap_or_else(|s| s);
        self.repair(RepairKind::FenceDropped, Some(tag), start, None, Some(span), Some(text));
        if self.call_omit == CallOmit::Off {
            self.rewrite_raw(fence);
        }
    }

    /// The call block (TAM, ACTION) that `token` opens, if any.
    fn call_opened_by(&self, token: &Token<'_>) -> Option<TagId> {
        let id = match token {
            Token::Tag(t) if t.kind == TagKind::Open => self.registry.lookup(t.name)?,
            Token::Special { name, .. } => match self.registry.lookup_marker(name)? {
                (id, MarkerRole::Open) => id,
                (_, MarkerRole::Close) => return None,
            },
            _ => return None,
        };
        is_call_block(self.registry.tag(id).body).then_some(id)
    }
}

/// Body kinds of tool-call blocks, which models wrap in code fences.
fn is_call_block(body: BodyKind) -> bool {
    matches!(body, BodyKind::Tam | BodyKind::Action)
}

impl TokenSink for Machine {
    fn token(&mut self, token: Token<'_>) {
        // Text, the common token, takes the short way: it is settled by the
        // fence watch itself, and a void element's wait holds it (see
        // `settle_void`).
        if let Token::Text { span, bytes } = token {
            return self.fenced_text(span, bytes);
        }
        self.markup_token(token);
    }
}

impl Machine {
    /// [`TokenSink::token`] for every token but text.
    #[inline(never)]
    fn markup_token(&mut self, token: Token<'_>) {
        self.settle_void(&token);
        let end = match &token {
            // Text is settled by the fence watch itself; a notice is not
            // input (its bytes arrive as text).
            Token::Text { .. } | Token::Notice(_) => None,
            Token::Tag(t) => Some(t.span.end),
            Token::Comment { span, .. }
            | Token::CData { span, .. }
            | Token::Special { span, .. }
            | Token::Unfinished { span, .. } => Some(span.end),
        };
        if end.is_some() {
            // Only a held opening fence asks which block the token opens:
            // no registry lookup per marker otherwise.
            let call = match self.fence {
                FenceWatch::Opening { .. } => self.call_opened_by(&token),
                _ => None,
            };
            self.settle_fence(call);
        }
        match token {
            Token::Text { span, bytes } => self.fenced_text(span, bytes),
            Token::Tag(tag) => self.on_tag(tag),
            Token::Comment { span, raw, body } => self.on_comment(span, raw, body),
            Token::CData { span, raw, .. } => self.on_markup_text(span, raw),
            Token::Special { span, raw, name } => self.on_special(span, raw, name),
            Token::Unfinished { span, raw, kind, name } => self.on_unfinished(span, raw, kind, name),
            Token::Notice(ScanNotice::MarkerTooLong { at, limit }) => {
                let d = Diagnostic {
                    level: Level::Warning,
                    code: DiagnosticCode::MarkerTooLong,
                    tag: None,
                    element: None,
                    at: Some(at),
                    message: format!(
                        "a marker starting here passed the {limit}-byte limit; its bytes are kept as text"
                    ),
                };
                self.emit(Event::Diagnostic(d));
            }
        }
        if let Some(end) = end {
            self.watch_block_end(end);
        }
    }
}

/// The tag of each element as the machine decided it, in the order it
/// decided: one entry with each `open` event, and one with each
/// `reclassified` repair. The payload stage takes an element's entries as
/// those events reach it ([`TagLog::take`]), so that it never looks a tag
/// up again by name: which tag an element is, the machine decides.
///
/// Events reach the stage in the order the machine decided them, but for
/// the lead's queue (its `reclassified` repair goes out before the events
/// it held), so the entry taken is the first one or one of the first few.
/// An entry lives until the stage reads its event: as many as one piece
/// of input opens, at most [`TagLog::MAX`]; past that the oldest is
/// dropped, and the stage reads that element's tag from its name.
#[derive(Debug, Default)]
pub(crate) struct TagLog(std::collections::VecDeque<(u32, TagId)>);

impl TagLog {
    /// Entries kept at most.
    const MAX: usize = 1 << 16;

    fn push(&mut self, id: u32, tag: TagId) {
        if self.0.len() >= Self::MAX {
            self.0.pop_front();
        }
        self.0.push_back((id, tag));
    }

    /// The oldest entry of element `id`, removed.
    pub(crate) fn take(&mut self, id: u32) -> Option<TagId> {
        let at = self.0.iter().position(|(i, _)| *i == id)?;
        self.0.remove(at).map(|(_, tag)| tag)
    }

    /// Whether no entry waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Rough memory weight of a queued event.
fn event_weight(event: &Event) -> usize {
    match event {
        Event::Delta(d) => d.text.len(),
        Event::Element(e) => e.text.len(),
        _ => 64,
    }
}

/// The element bare text opens (at the start of the output or between
/// elements), and how: `None` when the registry has nowhere to put it.
fn bare_text_opens(reg: &Registry, at_start: bool) -> Option<(TagId, Opened)> {
    let default = reg.default_tag();
    Some(match (at_start, reg.lead()) {
        // The chat template wrote the lead's open tag: this is the lead,
        // whatever follows (no reclassification).
        (true, Some(lead)) if reg.lead_open() == LeadOpen::Template => (lead, Opened::Synthetic),
        (true, Some(lead)) if Some(lead) != default => (lead, Opened::ImplicitLead),
        (true, _) => (default?, Opened::ImplicitDefault),
        (false, _) => (default?, Opened::Synthetic),
    })
}

fn leading_space(bytes: &[u8]) -> usize {
    bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(bytes.len())
}

fn prefix_of(prefix: &[u8], name: &[u8]) -> bool {
    name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// How much of a piece of text an element kept (its size limit).
#[derive(Debug, Clone, Copy)]
enum Kept {
    All,
    /// The first bytes; the element was already cut before.
    Part(usize),
    /// The first bytes; the element passes its limit with this piece.
    Cut(usize),
}

/// Whether `el`'s text so far stands inside a value it writes out, where
/// a registry tag is the value's text: inside a string of a JSON body
/// (`{"content": "<think> tags"}`), or inside a parameter's or an
/// argument's value of a call written in markup (see [`ValueWatch`]). The
/// element's own close there waits for what follows it instead (see
/// [`Hold::InValue`]). Other bodies write out no values.
#[inline]
fn in_value(el: &mut OpenElement) -> bool {
    el.body == BodyKind::Json && in_json_body_value(el)
}

/// [`in_value`] of a JSON body (out of line: other bodies, every close
/// and every tag inside content, pay one comparison for it).
#[inline(never)]
fn in_json_body_value(el: &mut OpenElement) -> bool {
    let json = matches!(el.text.get(leading_space(&el.text)), Some(b'{' | b'['));
    if !json {
        let watch = el.watch.get_or_insert_with(|| Box::new(Watch::Values(ValueWatch::default())));
        if let Watch::Values(values) = &mut **watch
            && let Some(open) = values.follow(&el.text)
        {
            return open;
        }
    }
    el.quote != JsonString::Out
}

/// Where a streamed element's text so far is with respect to Markdown
/// code, followed from where it was last asked (each byte is read once).
/// Past the element size limit only the kept text is read. Other bodies
/// have no Markdown: never in code.
fn code_so_far(el: &mut OpenElement) -> MarkdownCode {
    if el.body != BodyKind::Stream {
        return MarkdownCode::default();
    }
    match &mut **el.watch.get_or_insert_with(|| Box::new(Watch::Code(CodeWatch::default()))) {
        Watch::Code(watch) => {
            watch.code.push(&el.text[watch.read.min(el.text.len())..]);
            watch.read = el.text.len();
            watch.code
        }
        Watch::Values(_) => MarkdownCode::default(),
    }
}

/// Follows a JSON body's strings over `bytes` (out of line: text of other
/// bodies, the hot path, pays one comparison for it and stays small enough
/// to be inlined).
#[inline(never)]
fn follow_quotes(el: &mut OpenElement, bytes: &[u8]) {
    el.quote = el.quote.after(bytes);
}

/// Adds text to an element's kept text, up to the size limit (and follows
/// a JSON body's strings, see [`JsonString`]).
#[inline]
fn keep_text(limits: MachineLimits, el: &mut OpenElement, bytes: &[u8]) -> Kept {
    if el.body == BodyKind::Json {
        follow_quotes(el, bytes);
    }
    // The common case: all of it fits.
    if bytes.len() <= limits.max_element_len.saturating_sub(el.text.len()) {
        el.text.extend_from_slice(bytes);
        return Kept::All;
    }
    keep_part(limits, el, bytes)
}

/// [`keep_text`] when the text does not all fit (out of line: the hot
/// text path stays small).
#[cold]
#[inline(never)]
fn keep_part(limits: MachineLimits, el: &mut OpenElement, bytes: &[u8]) -> Kept {
    let room = limits.max_element_len.saturating_sub(el.text.len());
    let mut kept = bytes.len().min(room);
    el.text.extend_from_slice(&bytes[..kept]);
    // A cut inside a character keeps the rest of it (at most 3 bytes past
    // the limit): the kept text stays UTF-8 wherever the input was split.
    // Only until a byte was left out: the bytes that come after that do
    // not follow the kept text.
    while !el.truncated
        && kept < bytes.len()
        && bytes[kept] & 0xC0 == 0x80
        && crate::scan::incomplete_utf8_tail(&el.text) > 0
    {
        el.text.push(bytes[kept]);
        kept += 1;
    }
    if kept == bytes.len() {
        Kept::All
    } else if el.truncated {
        Kept::Part(kept)
    } else {
        el.truncated = true;
        Kept::Cut(kept)
    }
}

#[cfg(test)]
mod tests;
