//! The events a parser emits (DESIGN §5). Their serde form is the JSONL
//! contract of `spindle parse --format jsonl`: one object per line with a
//! `type` field; the field names below are public and stable, extra fields
//! may be added.
//!
//! This module owns the shapes only; which events are emitted and when is
//! the state machine (`machine`)'s business, and payloads are filled in by
//! [`crate::payload`].

use crate::scan::Span;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A tag name: the canonical name of an element's tag, or a tag as it was
/// written. Cheap to clone, as every event of an element carries its name:
/// a name of up to 23 bytes (any tag in practice) is held inline and cloned
/// by copying it, and a longer one shares one allocation.
///
/// Dereferences to `str`, and compares with `str`:
///
/// ```
/// use spindle::TagName;
/// let tag = TagName::from("content");
/// assert_eq!(tag, "content");
/// assert!(tag.starts_with("con"));
/// assert_eq!(serde_json::to_string(&tag).unwrap(), "\"content\"");
/// ```
//
// Not `Arc<str>` (what it was): a clone and a drop of an `Arc` are two
// atomic read-modify-writes, paid for every delta of a stream read a few
// bytes at a time (~20 ns a pair on a 2-core machine; 5% of a 4-byte delta
// end to end). `smol_str` holds short strings inline and shares long ones;
// the newtype keeps it out of the public API.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TagName(smol_str::SmolStr);

impl TagName {
    /// A tag name from a string known at compile time (never allocates).
    pub const fn new_static(name: &'static str) -> TagName {
        TagName(smol_str::SmolStr::new_static(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl std::ops::Deref for TagName {
    type Target = str;
    fn deref(&self) -> &str {
        self.0.as_str()
    }
}

impl AsRef<str> for TagName {
    fn as_ref(&self) -> &str {
        self.0.as_str()
    }
}

impl std::borrow::Borrow<str> for TagName {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

impl std::fmt::Debug for TagName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0.as_str(), f)
    }
}

impl std::fmt::Display for TagName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.as_str())
    }
}

impl From<&str> for TagName {
    fn from(name: &str) -> TagName {
        TagName(smol_str::SmolStr::new(name))
    }
}

impl From<String> for TagName {
    fn from(name: String) -> TagName {
        TagName(smol_str::SmolStr::from(name))
    }
}

impl From<&String> for TagName {
    fn from(name: &String) -> TagName {
        TagName::from(name.as_str())
    }
}

impl From<TagName> for String {
    fn from(name: TagName) -> String {
        name.0.into()
    }
}

impl PartialEq<str> for TagName {
    fn eq(&self, other: &str) -> bool {
        self.0.as_str() == other
    }
}

impl PartialEq<&str> for TagName {
    fn eq(&self, other: &&str) -> bool {
        self.0.as_str() == *other
    }
}

impl PartialEq<String> for TagName {
    fn eq(&self, other: &String) -> bool {
        self.0.as_str() == other.as_str()
    }
}

impl PartialEq<TagName> for str {
    fn eq(&self, other: &TagName) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<TagName> for &str {
    fn eq(&self, other: &TagName) -> bool {
        *self == other.as_str()
    }
}

/// Attributes of a tag, name to value (entities decoded).
pub type AttrMap = BTreeMap<String, String>;

/// One event. See the variants for when each is emitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// An element started (explicitly, or synthetically by a repair).
    Open(Open),
    /// Text of a streaming element, released as soon as it cannot belong to
    /// a marker. Adjacent deltas of one element join into its text.
    Delta(Delta),
    /// An element ended (explicitly, or synthetically by a repair).
    Close(Close),
    /// An element is complete: its whole inner text and its payload.
    Element(Box<Element>),
    /// The parser changed the structure it was given.
    Repair(Box<Repair>),
    /// Something worth knowing that changed nothing (missing tags, limits).
    Diagnostic(Diagnostic),
    /// An HTML comment `<!-- -->`, inside an element or between elements.
    Comment(Comment),
    /// Bytes outside every element: they belong to no element, but are
    /// reported so that every input byte is accounted for. Whitespace
    /// between top-level elements; with a registry that has no `default`
    /// tag (none of the built-in profiles), also the text and unknown
    /// markup outside elements, since there is no element to open for it.
    Gap(Gap),
    /// A tool call's name and arguments while its `<tool_call>` body is
    /// still arriving: first one event with the `name`, then fragments of
    /// the arguments' JSON text in order (joined, they are the arguments,
    /// as OpenAI's `function.arguments` deltas are). The `element` event at
    /// the end carries the parsed call.
    CallDelta(CallDelta),
}

/// A piece of a tool call streamed before its element completes.
///
/// For one element, the event that carries `name` comes first and exactly
/// once; every later one carries only an `arguments` fragment. Adjacent
/// call deltas of one element join ([`coalesce`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallDelta {
    /// The element this call is.
    pub id: u32,
    /// Canonical tag name of that element (`tool_call`).
    pub tag: TagName,
    /// The tool's name, on the first call delta of the element only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A fragment of the arguments' JSON text (possibly empty on the event
    /// that carries the name).
    #[serde(default)]
    pub arguments: String,
}

/// An element started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Open {
    /// The element's number in this response, counting from 0.
    pub id: u32,
    /// Canonical tag name.
    pub tag: TagName,
    /// The spelling the model used (the registry's spelling when synthetic).
    pub raw_tag: TagName,
    /// Attributes of the opening tag.
    pub attrs: AttrMap,
    /// Whether the parser inserted this open (see the `repair` before it).
    pub synthetic: bool,
    /// Input offset of the opening tag, or of the first text byte when
    /// synthetic.
    pub at: usize,
}

/// Streamed text of an element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delta {
    /// The element this text belongs to.
    pub id: u32,
    /// Canonical tag name of that element.
    pub tag: TagName,
    /// The text as the model wrote it; for content (the registry's default
    /// stream tag), the safe-to-display text filtered by
    /// [`crate::payload`] (comments removed, inline HTML allowlisted).
    pub text: String,
}

/// An element ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Close {
    /// The element.
    pub id: u32,
    /// Canonical tag name.
    pub tag: TagName,
    /// Whether the parser supplied this close.
    pub synthetic: bool,
    /// Input offset of the closing tag, or where the element was ended.
    pub at: usize,
}

/// A complete element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Element {
    /// The element's number in this response.
    pub id: u32,
    /// Canonical tag name.
    pub tag: TagName,
    /// The spelling the model used (the registry's when synthetic).
    pub raw_tag: TagName,
    /// Attributes of the opening tag.
    pub attrs: AttrMap,
    /// The raw inner text as the model wrote it. Merged parts are joined
    /// with the close, the whitespace between and the reopen removed; an
    /// auto-closed element's text ends where the tag that closed it begins.
    pub text: String,
    /// The typed payload, `null` for tags without one.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// From the opening tag (or first text byte) to the end of the closing
    /// tag (or where the element was ended).
    pub span: Span,
    /// Whether `text` was cut at the element size limit (the rest arrived
    /// as deltas).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// Declares an enum of stable snake_case names from `Variant =>
/// "name"` pairs (each with its own doc lines, if any), so that the name a
/// value prints and parses as is written once: the enum, `ALL`, `as_str`,
/// `from_name`, `Display` and serde through the names. Each variant's doc
/// ends with its name.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $enum:ident ($what:literal) {
            $($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[non_exhaustive]
        pub enum $enum {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
            #[doc = concat!("A ", $what, " this version does not know, read from the JSON of a")]
            /// newer spindle: deserialising keeps the event instead of failing,
            /// but not the name it had. Never produced by this version's parser;
            /// prints as `unknown`; not in `ALL`.
            Unknown,
        }

        impl $enum {
            #[doc = concat!("Every ", $what, ".")]
            pub const ALL: &'static [$enum] = &[$($enum::$variant,)*];

            /// The name it prints as (in JSON too).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)*
                    $enum::Unknown => "unknown",
                }
            }

            #[doc = concat!("The ", $what, " of a printed name (`unknown` is [`", stringify!($enum), "::Unknown`]).")]
            pub fn from_name(name: &str) -> Option<$enum> {
                match name {
                    $($name => Some($enum::$variant),)*
                    "unknown" => Some($enum::Unknown),
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $enum {
            /// The name it prints as.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $enum {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $enum {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Forward compatible: a name a newer version added is
                // `Unknown`, so that a reader keeps the event around it.
                let name = String::deserialize(d)?;
                Ok($enum::from_name(&name).unwrap_or($enum::Unknown))
            }
        }
    };
}

named_enum! {
    /// What kind of change a repair made.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum RepairKind ("repair kind") {
        /// An open tag was inserted before bare text.
        HeaderInserted => "header_inserted",
        /// An element was closed because another top-level tag began.
        AutoClosed => "auto_closed",
        /// `</A>` + whitespace + `<A>` (or bare text) continued one element.
        MergedAdjacent => "merged_adjacent",
        /// A close tag of another name closed the open element.
        MismatchedClose => "mismatched_close",
        /// A close tag with nothing to close was dropped.
        StrayCloseDropped => "stray_close_dropped",
        /// An element was still open at end of input.
        ClosedAtEof => "closed_at_eof",
        /// A marker cut off by the end of input was dropped.
        TruncatedMarker => "truncated_marker",
        /// A comment or CDATA section cut off by the end of input stays
        /// text, and the corrected text closes it (`-->`, `]]>`: the
        /// repair's `text`), so that the closes after it stay closes.
        CommentClosedAtEof => "comment_closed_at_eof",
        /// An unparseable payload's text was shown as content.
        FallbackToContent => "fallback_to_content",
        /// An implicitly opened element turned out to be another tag.
        Reclassified => "reclassified",
        /// A special token the registry does not know (`<|im_end|>`) between
        /// elements was dropped.
        SpecialTokenDropped => "special_token_dropped",
        /// A Markdown code fence around a tool-call block was taken out of the
        /// text around the block (its bytes are the repair's `span`).
        FenceDropped => "fence_dropped",
    }
}

/// A change the parser made to the structure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repair {
    /// What was done.
    pub kind: RepairKind,
    /// The canonical tag concerned (for `reclassified`, the new tag).
    pub tag: Option<TagName>,
    /// Input offset where the repair applies.
    pub at: usize,
    /// The element concerned, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<u32>,
    /// Bytes of the input that were dropped by this repair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<Span>,
    /// For `reclassified`, the tag the element had before; for
    /// `mismatched_close` and `stray_close_dropped`, the tag as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// For `fallback_to_content`, the element's text to show as content
    /// (filtered like content HTML); for `comment_closed_at_eof`, the
    /// delimiter the corrected text adds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// How serious a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Informational.
    Info,
    /// Something is off but nothing was lost.
    Warning,
    /// Something could not be done (a payload that did not parse).
    Error,
}

impl Level {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

impl std::fmt::Display for Level {
    /// The snake_case name (`warning`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A finding that changed nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// Severity.
    pub level: Level,
    /// What it is about (`missing_mandatory`, `order_violation`,
    /// `marker_too_long`, `element_too_large`, `invalid_utf8`, ...).
    pub code: DiagnosticCode,
    /// The canonical tag concerned.
    pub tag: Option<TagName>,
    /// The element concerned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<u32>,
    /// Where, when it has a place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<usize>,
    /// A sentence for people.
    pub message: String,
}

/// An HTML comment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comment {
    /// The element it sits in, if any.
    pub element: Option<u32>,
    /// That element's canonical tag.
    pub tag: Option<TagName>,
    /// The text between `<!--` and `-->`.
    pub text: String,
    /// Where the whole comment is.
    pub span: Span,
}

/// Bytes outside every element (see [`Event::Gap`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    /// The bytes: whitespace, or any text when the registry has no
    /// `default` tag.
    pub text: String,
    /// Where they are.
    pub span: Span,
}

impl Event {
    /// The event's `type` in JSON.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Open(_) => "open",
            Event::Delta(_) => "delta",
            Event::Close(_) => "close",
            Event::Element(_) => "element",
            Event::Repair(_) => "repair",
            Event::Diagnostic(_) => "diagnostic",
            Event::Comment(_) => "comment",
            Event::Gap(_) => "gap",
            Event::CallDelta(_) => "call_delta",
        }
    }

    /// The element, if this is an `element` event.
    pub fn as_element(&self) -> Option<&Element> {
        match self {
            Event::Element(e) => Some(e),
            _ => None,
        }
    }
}

/// Joins adjacent `delta` events of one element, adjacent `call_delta`
/// argument fragments of one element, and adjacent `gap` events: the only
/// difference chunking makes, so two parses of one input split
/// differently coalesce to equal lists (DESIGN §2.1).
///
/// ```
/// use spindle::{Parser, Registry, event::coalesce};
///
/// let input = b"<content>Hello, world</content>";
/// let whole = spindle::parse(Registry::filament(), input);
/// let mut p = Parser::new(Registry::filament());
/// let mut bytewise = Vec::new();
/// for b in input.chunks(1) {
///     bytewise.extend(p.feed(b));
/// }
/// bytewise.extend(p.finish());
/// assert_eq!(coalesce(bytewise), coalesce(whole));
/// ```
pub fn coalesce(events: impl IntoIterator<Item = Event>) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    for e in events {
        match (out.last_mut(), e) {
            (Some(Event::Delta(prev)), Event::Delta(d)) if prev.id == d.id && prev.tag == d.tag => {
                prev.text.push_str(&d.text)
            }
            (Some(Event::CallDelta(prev)), Event::CallDelta(d)) if prev.id == d.id && d.name.is_none() => {
                prev.arguments.push_str(&d.arguments)
            }
            (Some(Event::Gap(prev)), Event::Gap(g)) if prev.span.end == g.span.start => {
                prev.text.push_str(&g.text);
                prev.span.end = g.span.end;
            }
            (_, e) => out.push(e),
        }
    }
    out
}

named_enum! {
    /// What a [`Diagnostic`] is about: a stable code, printed in
    /// `snake_case` (`missing_mandatory`, `element_too_large`, ...).
    /// Compare codes with the variants, not with strings; comparing with
    /// a `&str` works too, for tests and scripts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum DiagnosticCode ("diagnostic code") {
        AlternateDelimitersUsed => "alternate_delimiters_used",
        AnalysisUnclosed => "analysis_unclosed",
        ArgumentsNotObject => "arguments_not_object",
        ArgumentsRepaired => "arguments_repaired",
        ArgumentsString => "arguments_string",
        AttributesIgnored => "attributes_ignored",
        CallArgumentsStreamedDiffer => "call_arguments_streamed_differ",
        CallInCodeBlock => "call_in_code_block",
        ChoicePlainLines => "choice_plain_lines",
        ChoiceWithoutOptions => "choice_without_options",
        ChunkFieldsCoerced => "chunk_fields_coerced",
        ChunkRejoined => "chunk_rejoined",
        /// The element's own close tag stood inside a value the element was
        /// writing out (a JSON string, a Qwen3-Coder parameter's value, a
        /// GLM argument's value) and what followed it went on with the
        /// value, so it was read as the value's text.
        CloseInValue => "close_in_value",
        CloseTagCaseMismatch => "close_tag_case_mismatch",
        /// An ATTP `code` written as a `"""` string with backslashes in it
        /// was read as written (with Python's escapes), not through TOML's.
        CodeReadRaw => "code_read_raw",
        /// An ATTP `code` wrapped in a Markdown fence: the fence lines
        /// were dropped.
        CodeFenceDropped => "code_fence_dropped",
        DataAfterDone => "data_after_done",
        DataAfterFinish => "data_after_finish",
        DetailsWithoutSummary => "details_without_summary",
        DuplicateKey => "duplicate_key",
        ElementTooLarge => "element_too_large",
        EmptyArguments => "empty_arguments",
        HtmlFiltered => "html_filtered",
        InvalidArguments => "invalid_arguments",
        InvalidChunkJson => "invalid_chunk_json",
        InvalidOnError => "invalid_on_error",
        InvalidOp => "invalid_op",
        InvalidResponseJson => "invalid_response_json",
        InvalidRetry => "invalid_retry",
        InvalidToml => "invalid_toml",
        InvalidUtf8 => "invalid_utf8",
        JsonCodeFence => "json_code_fence",
        JsonComment => "json_comment",
        JsonControlCharacter => "json_control_character",
        JsonFullwidthPunctuation => "json_fullwidth_punctuation",
        JsonInvalidEscape => "json_invalid_escape",
        JsonJsLiteral => "json_js_literal",
        JsonMismatchedBracket => "json_mismatched_bracket",
        JsonMissingComma => "json_missing_comma",
        JsonNumberFormat => "json_number_format",
        JsonPythonLiteral => "json_python_literal",
        JsonSingleQuotes => "json_single_quotes",
        JsonSmartQuotes => "json_smart_quotes",
        JsonSurroundingProse => "json_surrounding_prose",
        JsonTrailingComma => "json_trailing_comma",
        JsonTruncated => "json_truncated",
        JsonUnescapedQuote => "json_unescaped_quote",
        JsonUnquotedKey => "json_unquoted_key",
        JsonUnquotedString => "json_unquoted_string",
        KeyCase => "key_case",
        LeadUndecided => "lead_undecided",
        MalformedXml => "malformed_xml",
        MarkerTooLong => "marker_too_long",
        /// More whitespace than the machine holds followed the close of a
        /// mergeable element, or an element's own close inside a value: the
        /// close stands (no merge with a reopening tag after it, no value
        /// going on).
        MergeSpaceTooLong => "merge_space_too_long",
        MediaSrcRefused => "media_src_refused",
        MediaTypeInferred => "media_type_inferred",
        MediaWithoutSrc => "media_without_src",
        MissingCloseDelimiter => "missing_close_delimiter",
        MissingCode => "missing_code",
        MissingCommand => "missing_command",
        MissingDelimiters => "missing_delimiters",
        MissingMandatory => "missing_mandatory",
        MissingMessage => "missing_message",
        MissingStatus => "missing_status",
        MissingTarget => "missing_target",
        MissingThought => "missing_thought",
        MissingToolCall => "missing_tool_call",
        MixedContent => "mixed_content",
        MixedDelimitersUsed => "mixed_delimiters_used",
        MixedNumberedCommands => "mixed_numbered_commands",
        MultipleTools => "multiple_tools",
        MvuFormat => "mvu_format",
        NoFinishReason => "no_finish_reason",
        NoOps => "no_ops",
        /// ATTP code that never assigns `__result__` (its last expression's
        /// value, or what it prints, is its result).
        NoResult => "no_result",
        OpAlias => "op_alias",
        OpsNotWrapped => "ops_not_wrapped",
        OrderViolation => "order_violation",
        ParamsWithoutCommand => "params_without_command",
        PayloadTooDeep => "payload_too_deep",
        PayloadTruncated => "payload_truncated",
        PayloadUnparsable => "payload_unparsable",
        PolicyViolation => "policy_violation",
        PropsNotObject => "props_not_object",
        RedactedThinking => "redacted_thinking",
        ResponseTextTruncated => "response_text_truncated",
        ResponseTooLarge => "response_too_large",
        SecondActionBlock => "second_action_block",
        /// Several calls in one `<tool_call>` element (one JSON object after
        /// another, or a list): each is read as a call of its own.
        SeveralCalls => "several_calls",
        SseEventTooLarge => "sse_event_too_large",
        SseIgnoredField => "sse_ignored_field",
        SseInvalidUtf8 => "sse_invalid_utf8",
        SseLineTooLong => "sse_line_too_long",
        SseUnterminatedEvent => "sse_unterminated_event",
        StatusBarLines => "status_bar_lines",
        StepNumberMismatch => "step_number_mismatch",
        StrayText => "stray_text",
        /// A registry tag inside Markdown code (a fenced block or a code
        /// span) in a streamed element was read as the code's text, not
        /// as an element (given once per element).
        TagInCode => "tag_in_code",
        TextOutsideToml => "text_outside_toml",
        TooManyChoices => "too_many_choices",
        ToolCallFragmentAfterComplete => "tool_call_fragment_after_complete",
        ToolCallRepeated => "tool_call_repeated",
        ToolCallWithoutName => "tool_call_without_name",
        ToolTextIgnored => "tool_text_ignored",
        TruncatedChunk => "truncated_chunk",
        TruncatedMarkup => "truncated_markup",
        TypeHintFailed => "type_hint_failed",
        UiComponentViewInvalid => "ui_component_view_invalid",
        UiComponentWithoutView => "ui_component_without_view",
        UnclosedElements => "unclosed_elements",
        UnclosedFence => "unclosed_fence",
        UnexpectedChunkShape => "unexpected_chunk_shape",
        UnknownKey => "unknown_key",
        UnknownTypeHint => "unknown_type_hint",
        UnnumberedParamAppliedToAll => "unnumbered_param_applied_to_all",
        UnrecognizedChunk => "unrecognized_chunk",
        UnsupportedContentPart => "unsupported_content_part",
        UnterminatedBlock => "unterminated_block",
    }
}

impl PartialEq<&str> for DiagnosticCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for DiagnosticCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

/// What a payload parser returns for one element (the payload stage,
/// [`crate::payload`], and the call parsers, [`crate::calls`], build it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Payload {
    /// The typed payload (`null` when the tag has none).
    pub value: serde_json::Value,
    /// Leniencies used and problems found, attached to the element.
    pub diagnostics: Vec<Diagnostic>,
    /// Whether the body could not be read even leniently.
    pub failed: bool,
}

impl Payload {
    /// No payload.
    pub fn none() -> Payload {
        Payload::default()
    }

    /// A body that could not be read: `value` gets an `error` key (added to
    /// `partial` when it is an object), and an error diagnostic
    /// `payload_unparsable` is appended.
    pub fn failed(mut diagnostics: Vec<Diagnostic>, message: &str, partial: serde_json::Value) -> Payload {
        let mut value = match partial {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        value.shift_insert(0, "error".into(), serde_json::Value::String(message.into()));
        diagnostics.push(Diagnostic {
            level: Level::Error,
            code: DiagnosticCode::PayloadUnparsable,
            tag: None,
            element: None,
            at: None,
            message: message.into(),
        });
        Payload { value: serde_json::Value::Object(value), diagnostics, failed: true }
    }
}

#[cfg(test)]
mod code_tests {
    use super::{DiagnosticCode, Event, Level, RepairKind};

    /// Every value of a [`named_enum!`] serializes as its name, in snake
    /// case, and parses back; an unknown name is no value of `from_name`,
    /// and deserialises as `Unknown` (a newer version's name).
    fn prints_and_parses_as_its_name<T>(
        all: &[T],
        unknown: T,
        as_str: fn(T) -> &'static str,
        from_name: fn(&str) -> Option<T>,
    ) where
        T: Copy + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    {
        for &value in all {
            let json = serde_json::to_string(&value).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", as_str(value)));
            assert_eq!(serde_json::from_str::<T>(&json).ok(), Some(value));
            assert_eq!(from_name(as_str(value)), Some(value));
            assert!(as_str(value).bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
        }
        assert_eq!(from_name("no_such_name"), None);
        assert_eq!(serde_json::from_str::<T>("\"no_such_name\"").ok(), Some(unknown));
        assert_eq!(serde_json::to_string(&unknown).unwrap_or_default(), "\"unknown\"");
        assert_eq!(from_name("unknown"), Some(unknown));
        assert!(!all.contains(&unknown));
        assert!(serde_json::from_str::<T>("7").is_err());
    }

    #[test]
    fn every_repair_kind_prints_and_parses_as_its_name() {
        prints_and_parses_as_its_name(RepairKind::ALL, RepairKind::Unknown, RepairKind::as_str, RepairKind::from_name);
    }

    #[test]
    fn every_code_prints_and_parses_as_its_name() {
        prints_and_parses_as_its_name(
            DiagnosticCode::ALL,
            DiagnosticCode::Unknown,
            DiagnosticCode::as_str,
            DiagnosticCode::from_name,
        );
        assert_eq!(DiagnosticCode::MissingMandatory, "missing_mandatory");
    }

    /// A reader of event JSON (a consumer of `spindle parse` or of a
    /// proxy's events) keeps the events of a newer spindle whose repair
    /// kind or diagnostic code it does not know, with every other field.
    #[test]
    fn events_with_names_of_a_newer_version_are_kept() {
        let line = r#"{"type":"repair","kind":"tag_invented_later","tag":"content","at":12,"element":3,"text":"x"}"#;
        let Ok(Event::Repair(repair)) = serde_json::from_str::<Event>(line) else {
            panic!("the repair was not read: {line}");
        };
        assert_eq!(repair.kind, RepairKind::Unknown);
        assert_eq!((repair.tag.as_deref(), repair.at, repair.element), (Some("content"), 12, Some(3)));
        assert_eq!(repair.text.as_deref(), Some("x"));
        let line = r#"{"type":"diagnostic","level":"warning","code":"code_invented_later","tag":null,"message":"m"}"#;
        let Ok(Event::Diagnostic(diagnostic)) = serde_json::from_str::<Event>(line) else {
            panic!("the diagnostic was not read: {line}");
        };
        assert_eq!(
            (diagnostic.code, diagnostic.level, diagnostic.message.as_str()),
            (DiagnosticCode::Unknown, Level::Warning, "m")
        );
    }
}
