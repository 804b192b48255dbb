//! Tool calls written in the text: TAM blocks (spec 000, spec 002 §5),
//! ACTION XML (spec 004) and ATTP TOML (spec 001), normalised into one
//! [`ToolCall`] shape, and the [`ToolCatalog`] that checks them.
//!
//! This module owns the reading of a *completed* call element's text and
//! the checking of the call against tool definitions. It must not decide
//! where a block starts or ends (that is the state machine (`machine`)'s, driven by the
//! `tam`, `action` and `attp` profiles of [`crate::registry`]), and it runs
//! no tool: a checked call goes to a handler.
//!
//! # The formats
//!
//! | format | element | body | reader |
//! |---|---|---|---|
//! | TAM | `tam`, `<\|[REQUEST_TOOL]\|> ... <\|[END_TOOL]\|>` | `key:»»»value«««` lines | [`tam::parse_tam`] |
//! | ACTION | `action`, `<ACTION> ... </ACTION>` | XML, one element per tool | [`action::parse_action`] |
//! | ATTP | `attp`, the whole output | TOML with `thought` and `[tool_call]` | [`attp::parse_attp`] |
//! | Filament / Hermes | `tool_call`, `<tool_call name="id">{json}</tool_call>` or `{"name", "arguments"}` | JSON | [`filament_call`] (from the element's `{name, arguments}` payload) |
//!
//! All three give a [`ToolCall`]: `{"format", "steps": [{"tool_id",
//! "params", "on_error", "retry", "type_hints", "uris", ...}],
//! "request_id", "response_text", "warnings": [...]}`, steps in execution
//! order. `warnings` holds stable snake_case codes (`mixed_delimiters_used`,
//! ...); the same findings arrive with sentences as `diagnostic` events.
//!
//! # Profiles
//!
//! `spindle parse --profile tam|action|attp` (and [`Registry::profile`]):
//!
//! * `tam`: free text is `content` (bare: no tags, no repairs), each
//!   `<|[REQUEST_TOOL]|> ... <|[END_TOOL]|>` block one `tam` element. The
//!   element's canonical name is `tam`; Filament output can opt in with a
//!   registry file that `extends = "filament"` and adds the same tag (body
//!   `tam`, markers `REQUEST_TOOL`/`END_TOOL`).
//! * `action`: free text is `content`, `<ACTION>...</ACTION>` an `action`
//!   element.
//! * `attp`: the whole output is one `attp` element.
//!
//! `spindle parse --tools DIR` checks every completed call (any of the
//! four formats, [`call_of`]) against the plugins directory `DIR`
//! ([`ToolCatalog::load_plugins`]) and prints the observation text of each
//! invalid one to stderr; with `--execute` the calls run
//! (`spindle::tools`, with the `tools` feature).
//!
//! # Example: a TAM block
//!
//! ```
//! use spindle::{parse, Registry};
//!
//! let text = "Writing it.\n<|[REQUEST_TOOL]|>\ncommand:»»»File.Write«««\nfilePath:»»»/tmp/a«««\n<|[END_TOOL]|>";
//! let events = parse(Registry::profile("tam").unwrap(), text.as_bytes());
//! let call = events.iter().filter_map(|e| e.as_element()).find(|e| &*e.tag == "tam").unwrap();
//! assert_eq!(call.payload["steps"][0]["tool_id"], "File.Write");
//! assert_eq!(call.payload["steps"][0]["params"]["file_path"], "/tmp/a");
//! ```
//!
//! # Context: response text and repeated blocks
//!
//! A payload function sees one element. What lies around it (the text before
//! an ACTION block, whether a block is the second one, whether it was cut
//! off by the end of input) is known to a [`CallTracker`], which watches
//! every event of one response; [`tam_payload`], [`action_payload`] and
//! [`attp_payload`] are the context-free forms.
//!
//! # Streaming the ATTP thought
//!
//! An `attp` element streams its raw TOML as `delta` events;
//! [`attp::ThoughtStream`] turns them into the `thought` string's text as
//! it arrives (split-invariant). The payload stage keeps one per open ATTP
//! element: each raw delta is fed, the released text goes out as a
//! `delta` with tag `thought` and the element's id, and `finish` is called
//! when the element completes, before its `element` event.

pub mod action;
pub mod attp;
pub mod catalog;
pub mod stream;
pub mod tam;

pub use catalog::{CallProblem, CatalogError, LoadWarning, ParamProblem, ToolCatalog, ToolDef, openai_function_name};

use crate::event::DiagnosticCode;
use crate::event::Payload;
use crate::event::{Close, Diagnostic, Element, Event, Level};
use crate::registry::{BodyKind, Registry, TagId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Which notation a call was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallFormat {
    /// `<|[REQUEST_TOOL]|>` blocks (spec 000, spec 002 §5).
    Tam,
    /// `<ACTION>` XML (spec 004).
    Action,
    /// ATTP TOML (spec 001).
    Attp,
    /// A `<tool_call name="...">{json}</tool_call>` element (spec 003
    /// §3.2.2), or the Hermes/Qwen form with `{"name", "arguments"}` in
    /// the body: one step.
    Filament,
}

/// What happens to the remaining steps when a step fails (TAM `on_error_N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the whole call (the default).
    #[default]
    Stop,
    /// Ignore the error and go on with the next step.
    Continue,
}

/// One tool invocation of a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The tool's id (`File.Write`, `ReadWorldStateTool`; `python` for ATTP
    /// code).
    pub tool_id: String,
    /// Parameters, name to JSON value (TAM: after `common_*` and type hints
    /// are applied).
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// What a failure of this step does to the rest.
    #[serde(default)]
    pub on_error: OnError,
    /// How many times to retry this step after a failure.
    #[serde(default)]
    pub retry: u32,
    /// Declared type of a parameter (`json`, `base64`, `text`), by name.
    #[serde(default)]
    pub type_hints: BTreeMap<String, String>,
    /// Parameters passed by reference (`fam://...`), by name.
    #[serde(default)]
    pub uris: BTreeMap<String, String>,
    /// The step number as written (`command_3` -> 3), `null` for an
    /// unnumbered `command` and for ACTION/ATTP; for several calls in one
    /// `tool_call` element, 1, 2, ... in order.
    #[serde(default)]
    pub index: Option<u64>,
    /// A `comment_N` note for this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// Why this step must not be run, as a code (`cut_off`: its block was
    /// cut off by the end of the output, so its values may be incomplete;
    /// `too_large`: its block passed the element size limit;
    /// `malformed_arguments`: one of several calls in a `<tool_call>` whose
    /// arguments are not a JSON object); `None` for a runnable step. A runner reports such a step instead of
    /// running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_runnable: Option<String>,
    /// Parameters that came from a TAM `common_*` key (not set by the step
    /// itself): given to every step, they are dropped from a step whose
    /// tool does not declare them instead of making it invalid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<String>,
}

impl Step {
    /// A step with no parameters and default modifiers.
    pub fn new(tool_id: impl Into<String>) -> Step {
        Step {
            tool_id: tool_id.into(),
            params: serde_json::Map::new(),
            on_error: OnError::Stop,
            retry: 0,
            type_hints: BTreeMap::new(),
            uris: BTreeMap::new(),
            index: None,
            comment: None,
            not_runnable: None,
            shared: Vec::new(),
        }
    }
}

/// The code of an ATTP `[tool_call]` and what the policy check found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttpCall {
    /// `thought`, the model's reasoning.
    pub thought: Option<String>,
    /// `status`: `success` or `fail` (as written, lower-cased).
    pub status: Option<String>,
    /// `target` of a successful call.
    pub target: Option<String>,
    /// `code` of a successful call (Python).
    pub code: Option<String>,
    /// `message` of a failed call.
    pub message: Option<String>,
    /// Breaches of the code policy of spec 001 (empty when the code is
    /// allowed).
    pub violations: Vec<attp::Violation>,
    /// Functions the code calls by bare name (tool candidates), in order of
    /// first use.
    pub calls: Vec<String>,
}

/// A tool call in any of the three notations: the `payload` of a `tam`,
/// `action` or `attp` element.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The notation it was written in.
    pub format: CallFormat,
    /// The tool invocations, in execution order.
    pub steps: Vec<Step>,
    /// TAM `request_id`.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The text the model wrote before the block (trimmed); `null` when the
    /// payload was built without context (see [`CallTracker`]).
    #[serde(default)]
    pub response_text: Option<String>,
    /// Codes of the leniencies used and problems found, each once, in order
    /// of first occurrence.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// TAM `comment`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// TAM `# ...` comment lines, for display.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comments: Vec<String>,
    /// TAM parameters with a step number that no `command_N` has, kept so
    /// that nothing is dropped silently.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub unassigned: serde_json::Map<String, serde_json::Value>,
    /// Why the call cannot be run (`Malformed XML in ACTION block`, no
    /// command, TOML that does not parse); `steps` is then empty or partial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The observation text for the model's next turn when `error` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<String>,
    /// ATTP details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attp: Option<AttpCall>,
    /// Why the whole call must not be run, as a code
    /// (`second_action_block`: spec 004 §3.2.1 runs only the first ACTION
    /// block of an output); `None` for a runnable call. A runner reports
    /// such a call instead of running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_runnable: Option<String>,
}

impl ToolCall {
    /// An empty call in `format`.
    pub fn new(format: CallFormat) -> ToolCall {
        ToolCall {
            format,
            steps: Vec::new(),
            request_id: None,
            response_text: None,
            warnings: Vec::new(),
            comment: None,
            comments: Vec::new(),
            unassigned: serde_json::Map::new(),
            error: None,
            observation: None,
            attp: None,
            not_runnable: None,
        }
    }

    /// Reads a call back from an element's payload.
    ///
    /// # Errors
    ///
    /// The serde error when the value is not a `ToolCall` (a `null`
    /// payload, an element of another tag).
    pub fn from_payload(value: &serde_json::Value) -> Result<ToolCall, serde_json::Error> {
        serde_json::from_value(value.clone())
    }

    /// The payload form.
    pub fn to_value(&self) -> serde_json::Value {
        // A ToolCall is maps of strings and JSON values: serialising it
        // cannot fail.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// [`ToolCall::to_value`] of a call that is not needed any more: its
    /// strings and parameters move into the value instead of being copied
    /// by serde, and each object is built from its shape (the payload
    /// layer's `object!`) instead of hashing every key again. The
    /// serde form stays the contract: a test compares the two on every
    /// call of the bundled transcripts and on a call with every field set.
    pub(crate) fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        // Every field named: a field added to `ToolCall` does not compile
        // here until it is written.
        let ToolCall {
            format,
            steps,
            request_id,
            response_text,
            warnings,
            comment,
            comments,
            unassigned,
            error,
            observation,
            attp,
            not_runnable,
        } = self;
        let steps = Value::Array(steps.into_iter().map(Step::into_value).collect());
        let mut value = crate::shape::object!([
            ("format", unit_value(format)),
            ("steps", steps),
            ("request_id", request_id.map_or(Value::Null, Value::String)),
            ("response_text", response_text.map_or(Value::Null, Value::String)),
            ("warnings", strings(warnings)),
        ]);
        if let Value::Object(map) = &mut value {
            // The fields serde leaves out when empty, in their order.
            if let Some(comment) = comment {
                map.insert("comment".into(), Value::String(comment));
            }
            if !comments.is_empty() {
                map.insert("comments".into(), strings(comments));
            }
            if !unassigned.is_empty() {
                map.insert("unassigned".into(), Value::Object(unassigned));
            }
            if let Some(error) = error {
                map.insert("error".into(), Value::String(error));
            }
            if let Some(observation) = observation {
                map.insert("observation".into(), Value::String(observation));
            }
            if let Some(attp) = attp {
                // ATTP calls are few: their details go through serde.
                map.insert("attp".into(), serde_json::to_value(attp).unwrap_or(Value::Null));
            }
            if let Some(code) = not_runnable {
                map.insert("not_runnable".into(), Value::String(code));
            }
        }
        value
    }
}

impl Step {
    /// The serde form of a step, built by moving its parts
    /// ([`ToolCall::into_value`]).
    fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        let string_map = |map: BTreeMap<String, String>| {
            Value::Object(map.into_iter().map(|(k, v)| (k, Value::String(v))).collect())
        };
        // Every field named, as in `ToolCall::into_value`.
        let Step { tool_id, params, on_error, retry, type_hints, uris, index, comment, not_runnable, shared } = self;
        let mut value = crate::shape::object!([
            ("tool_id", Value::String(tool_id)),
            ("params", Value::Object(params)),
            ("on_error", unit_value(on_error)),
            ("retry", Value::from(retry)),
            ("type_hints", string_map(type_hints)),
            ("uris", string_map(uris)),
            ("index", index.map_or(Value::Null, Value::from)),
        ]);
        if let Value::Object(map) = &mut value {
            if let Some(comment) = comment {
                map.insert("comment".into(), Value::String(comment));
            }
            if let Some(code) = not_runnable {
                map.insert("not_runnable".into(), Value::String(code));
            }
            if !shared.is_empty() {
                map.insert("shared".into(), strings(shared));
            }
        }
        value
    }
}

/// A fieldless enum's serde form (its name, as serde spells it).
fn unit_value(value: impl Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

/// A list of strings as a JSON array.
fn strings(list: Vec<String>) -> serde_json::Value {
    serde_json::Value::Array(list.into_iter().map(serde_json::Value::String).collect())
}

/// Findings collected while reading one call: the `warnings` codes and the
/// diagnostics with sentences.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Findings {
    /// Codes, each once, in order of first occurrence.
    pub warnings: Vec<String>,
    /// One diagnostic per finding, with a sentence.
    pub diagnostics: Vec<Diagnostic>,
}

impl Findings {
    /// Records a finding; `code` goes to `warnings` once.
    pub(crate) fn warn(&mut self, code: DiagnosticCode, message: String) {
        self.push(Level::Warning, code, message);
    }

    /// Records an error-level finding.
    pub(crate) fn error(&mut self, code: DiagnosticCode, message: String) {
        self.push(Level::Error, code, message);
    }

    fn push(&mut self, level: Level, code: DiagnosticCode, message: String) {
        if !self.warnings.iter().any(|w| w == code.as_str()) {
            self.warnings.push(code.as_str().to_string());
        }
        self.diagnostics.push(Diagnostic { level, code, tag: None, element: None, at: None, message });
    }

    /// Turns a call and its findings into a payload.
    pub(crate) fn into_payload(self, mut call: ToolCall) -> Payload {
        for w in self.warnings {
            if !call.warnings.contains(&w) {
                call.warnings.push(w);
            }
        }
        let failed = call.error.is_some();
        Payload { value: call.into_value(), diagnostics: self.diagnostics, failed }
    }
}

/// Line numbers of byte offsets, in O(log n) each (warnings name lines; a
/// block may have many).
#[derive(Debug)]
pub(crate) struct Lines(Vec<usize>);

impl Lines {
    pub(crate) fn new(text: &str) -> Lines {
        Lines(memchr::memchr_iter(b'\n', text.as_bytes()).collect())
    }

    /// The 1-based line holding byte `at`.
    pub(crate) fn line(&self, at: usize) -> usize {
        self.0.partition_point(|&nl| nl < at) + 1
    }
}

/// What is known about a call element beyond its own text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallContext {
    /// The text before the block (see [`CallTracker`]); `None` when unknown.
    pub response_text: Option<String>,
    /// How many call elements of the same tag came before this one.
    pub previous_blocks: usize,
    /// The element was ended by the end of input, not by its close marker.
    pub cut_off: bool,
    /// `response_text` holds only the latest part of a longer text (see
    /// [`CallTracker::with_text_limit`]).
    pub text_truncated: bool,
}

/// The payload of a completed TAM element, without context.
pub fn tam_payload(el: &Element) -> Payload {
    tam_payload_in(el, &CallContext::default())
}

/// The payload of a completed ACTION element, without context
/// (`response_text` is `null`).
pub fn action_payload(el: &Element) -> Payload {
    action_payload_in(el, &CallContext::default())
}

/// The payload of a completed ATTP element.
pub fn attp_payload(el: &Element) -> Payload {
    attp_payload_in(el, &CallContext::default())
}

/// The payload of a TAM element in its context.
pub fn tam_payload_in(el: &Element, ctx: &CallContext) -> Payload {
    call_payload(BodyKind::Tam, el, ctx, ctx.response_text.clone())
}

/// The payload of an ACTION element in its context.
pub fn action_payload_in(el: &Element, ctx: &CallContext) -> Payload {
    call_payload(BodyKind::Action, el, ctx, ctx.response_text.clone())
}

/// The payload of an ATTP element in its context.
pub fn attp_payload_in(el: &Element, ctx: &CallContext) -> Payload {
    call_payload(BodyKind::Attp, el, ctx, ctx.response_text.clone())
}

/// The payload of a call element read as `body` (TAM, ACTION, or else
/// ATTP) in its context, whose response text comes by value: the tracker
/// moves its own in (a few KiB of text before each block, copied per call
/// otherwise).
fn call_payload(body: BodyKind, el: &Element, ctx: &CallContext, response_text: Option<String>) -> Payload {
    let ((call, mut findings), what) = match body {
        BodyKind::Tam => (tam::parse_tam(&el.text), "TAM block"),
        BodyKind::Action => (action::parse_action(&el.text), "ACTION block"),
        _ => (attp::parse_attp(&el.text), "ATTP document"),
    };
    let mut call = finish_call(call, &mut findings, ctx, response_text, what);
    if el.truncated {
        too_large(&mut call, &mut findings, el.text.len(), what);
    }
    findings.into_payload(call)
}

/// A call whose block passed the element size limit: read from the kept
/// part, so a value may be cut anywhere (or a later key missing) and
/// nothing in it runs; a block that read as invalid says why it did.
fn too_large(call: &mut ToolCall, findings: &mut Findings, kept: usize, what: &str) {
    findings.error(
        DiagnosticCode::PayloadTruncated,
        format!(
            "the {what} passed the element size limit ({kept} bytes kept); its values may be cut, so nothing in it runs"
        ),
    );
    for step in &mut call.steps {
        step.not_runnable = Some("too_large".into());
    }
    call.not_runnable = Some("too_large".into());
    if call.steps.is_empty() {
        let why = format!("the {what} passed the element size limit ({kept} bytes kept) and was cut");
        call.error = Some(why.clone());
        call.observation = Some(format!("Observation: Error - {why}; write a shorter block"));
    }
}

/// The call of a completed `tool_call` element (Filament `<tool_call
/// name="...">{json}</tool_call>`, or the Hermes/Qwen form): one step whose
/// tool id is the payload's `name` and whose parameters are its
/// `arguments`, and one more for each of its `more_calls` (several calls
/// written in one element; each step then goes on when another fails). A
/// body that did not parse, a missing name, or the arguments of a lone
/// call that are not a JSON object give a call with `error` and the
/// `Malformed <tool_call>` observation, and no step. Among several calls,
/// one whose arguments are not an object is a step of its own marked
/// `not_runnable: malformed_arguments`, and the others still run.
///
/// ```
/// use spindle::calls::{filament_call, CallFormat};
/// use spindle::{parse, Registry};
///
/// let events = parse(Registry::filament(), br#"<tool_call name="weather">{"city": "Oslo"}</tool_call>"#);
/// let el = events.iter().filter_map(|e| e.as_element()).find(|e| &*e.tag == "tool_call").unwrap();
/// let call = filament_call(el);
/// assert_eq!(call.format, CallFormat::Filament);
/// assert_eq!(call.steps[0].tool_id, "weather");
/// assert_eq!(call.steps[0].params["city"], "Oslo");
/// ```
pub fn filament_call(el: &Element) -> ToolCall {
    let mut call = ToolCall::new(CallFormat::Filament);
    let payload = &el.payload;
    let malformed = |call: &mut ToolCall, why: String| {
        call.observation = Some(format!("Observation: Error - Malformed <tool_call>: {why}"));
        call.error = Some(why);
    };
    if let Some(err) = payload.get("error").and_then(serde_json::Value::as_str) {
        malformed(&mut call, err.to_string());
        return call;
    }
    let name = payload.get("name").and_then(serde_json::Value::as_str).map(str::trim).filter(|n| !n.is_empty());
    let Some(name) = name else {
        malformed(&mut call, "it names no tool (no name attribute and no \"name\" in its body)".into());
        return call;
    };
    // More calls in the same element (`more_calls`): steps of their own,
    // independent of each other as parallel calls are.
    let more = payload.get("more_calls").and_then(serde_json::Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if more.is_empty() {
        match call_step(name, payload.get("arguments")) {
            Ok(step) => call.steps.push(step),
            Err(why) => malformed(&mut call, why),
        }
        return call;
    }
    let calls = std::iter::once((name, payload.get("arguments"))).chain(more.iter().map(|extra| {
        let name = extra.get("name").and_then(serde_json::Value::as_str).map(str::trim).unwrap_or_default();
        (name, extra.get("arguments"))
    }));
    for (n, (name, args)) in (1..).zip(calls) {
        let mut step = call_step(name, args).unwrap_or_else(|_| {
            let mut step = Step::new(name);
            step.not_runnable = Some("malformed_arguments".into());
            step
        });
        step.on_error = OnError::Continue;
        step.index = Some(n);
        call.steps.push(step);
    }
    call
}

/// The step of one `{name, arguments}` call: no arguments (or `null`) are
/// no parameters, an object is the parameters; anything else is why the
/// call is malformed.
fn call_step(name: &str, args: Option<&serde_json::Value>) -> Result<Step, String> {
    let params = match args {
        None | Some(serde_json::Value::Null) => serde_json::Map::new(),
        Some(serde_json::Value::Object(m)) => m.clone(),
        Some(other) => {
            let kind = crate::state::type_name(other);
            return Err(format!("the arguments of {name} are {kind}, not a JSON object"));
        }
    };
    let mut step = Step::new(name);
    step.params = params;
    Ok(step)
}

/// The [`ToolCall`] of any completed call element: the payload of a `tam`,
/// `action` or `attp` element (body kinds of the same name), or
/// [`filament_call`] for a `tool_call` element. `None` for other elements.
pub fn call_of(registry: &Registry, el: &Element) -> Option<ToolCall> {
    let body = registry.lookup(el.tag.as_bytes()).map(|id| registry.tag(id).body);
    match body {
        Some(BodyKind::Tam | BodyKind::Action | BodyKind::Attp) => ToolCall::from_payload(&el.payload).ok(),
        _ if &*el.tag == "tool_call" => Some(filament_call(el)),
        _ => None,
    }
}

/// Applies what the context knows to a call.
fn finish_call(
    mut call: ToolCall,
    findings: &mut Findings,
    ctx: &CallContext,
    response_text: Option<String>,
    what: &str,
) -> ToolCall {
    if call.format != CallFormat::Attp {
        call.response_text = response_text;
    }
    if ctx.cut_off {
        findings.warn(
            DiagnosticCode::UnterminatedBlock,
            format!("the {what} was still open at the end of the output; it was read up to there"),
        );
        // Its last value may have been cut anywhere: nothing in it runs.
        for step in &mut call.steps {
            step.not_runnable = Some("cut_off".into());
        }
        call.not_runnable.get_or_insert_with(|| "cut_off".into());
    }
    if ctx.text_truncated {
        findings.warn(
            DiagnosticCode::ResponseTextTruncated,
            "the text before the block passed the tracker's limit; response_text holds its latest part".into(),
        );
    }
    if ctx.previous_blocks > 0 && call.format == CallFormat::Action {
        let n = ctx.previous_blocks + 1;
        findings.warn(
            DiagnosticCode::SecondActionBlock,
            format!(
                "this is ACTION block number {n} in one output; spec 004 §3.2.1 runs only the first, so this one is not run"
            ),
        );
        call.not_runnable = Some("second_action_block".into());
    }
    call
}

/// Removes code-fence lines (```` ``` ````, ```` ```xml ````) and blank lines
/// from both ends of a response text: they wrap the block that follows (or
/// closed the one before), they are not part of the text.
fn strip_fences(text: &str) -> String {
    let is_fence = |l: &str| {
        let l = l.trim();
        l.is_empty() || (l.starts_with("```") && !l[3..].contains('`') && !l[3..].contains(' '))
    };
    // Only the lines at the two ends are read: the first and the last line
    // that are not fences bound the text, whatever lies between.
    let mut start = 0;
    for line in text.split('\n') {
        if !is_fence(line) {
            break;
        }
        start += line.len() + 1;
    }
    if start >= text.len() {
        return String::new();
    }
    let mut end = text.len();
    for line in text.rsplit('\n') {
        if !is_fence(line) {
            break;
        }
        // The line and the newline before it (a line that is not a fence
        // stops this loop before `end` reaches `start`).
        end -= line.len() + 1;
    }
    text[start..end].trim().to_string()
}

/// Watches the events of one response and builds call payloads with their
/// [`CallContext`]: the text before each block (`response_text`), repeated
/// blocks, blocks cut off by the end of input.
///
/// Feed it every event in order with [`CallTracker::observe`] (the call
/// element's own `element` event included, before or after asking for its
/// payload: it is not counted as text) and ask [`CallTracker::payload`] for
/// each call element.
///
/// `response_text` is the text of the elements of the registry's default
/// tag (content) that completed since the previous call element, joined
/// with newlines and trimmed, without the code-fence lines that wrap a
/// block; an empty string when there was none.
///
/// ```
/// use spindle::calls::CallTracker;
/// use spindle::{parse, Registry};
///
/// let registry = Registry::profile("action").unwrap();
/// let text = b"Let me look.\n<ACTION><Look><at>sky</at></Look></ACTION>";
/// let events = parse(registry.clone(), text);
/// let mut tracker = CallTracker::new(registry.into());
/// let mut payloads = Vec::new();
/// for event in &events {
///     tracker.observe(event);
///     if let Some(el) = event.as_element() {
///         if let Some(p) = tracker.payload(el) {
///             payloads.push(p.value);
///         }
///     }
/// }
/// assert_eq!(payloads[0]["response_text"], "Let me look.");
/// assert_eq!(payloads[0]["steps"][0]["params"]["at"], "sky");
/// ```
#[derive(Debug)]
pub struct CallTracker {
    registry: Arc<Registry>,
    /// Whether the registry has any call tag at all; without one there is
    /// nothing to track (and no text worth keeping).
    has_calls: bool,
    /// Text of default-tag elements since the last call element.
    text: std::collections::VecDeque<(u32, String)>,
    /// Call elements seen so far, per tag.
    blocks: BTreeMap<TagId, usize>,
    /// Ids of elements whose close was synthetic (cut off).
    cut_off: Vec<u32>,
    /// Call element ids already counted.
    counted: Vec<u32>,
    /// Most bytes of text kept for `response_text`.
    text_limit: usize,
    /// Bytes in `text`.
    text_len: usize,
    /// Text was dropped since the last call element.
    text_dropped: bool,
}

/// Default of [`CallTracker::with_text_limit`]: 1 MiB.
pub const RESPONSE_TEXT_LIMIT: usize = 1024 * 1024;

impl CallTracker {
    /// A tracker for one response parsed with `registry`.
    pub fn new(registry: Arc<Registry>) -> CallTracker {
        CallTracker::with_text_limit(registry, RESPONSE_TEXT_LIMIT)
    }

    /// A tracker that keeps at most `limit` bytes of text before a block:
    /// past it the oldest text is dropped, the call's `response_text` is
    /// the latest part, and its warnings say `response_text_truncated`.
    pub fn with_text_limit(registry: Arc<Registry>, limit: usize) -> CallTracker {
        CallTracker {
            has_calls: registry.tags().iter().any(|t| Self::is_call(t.body)),
            registry,
            text: std::collections::VecDeque::new(),
            blocks: BTreeMap::new(),
            cut_off: Vec::new(),
            counted: Vec::new(),
            text_limit: limit,
            text_len: 0,
            text_dropped: false,
        }
    }

    /// Adds an element's text, dropping the oldest past the limit.
    fn keep_text(&mut self, id: u32, text: &str) {
        let mut text = text;
        if text.len() > self.text_limit {
            let mut cut = text.len() - self.text_limit;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            text = &text[cut..];
            self.text_dropped = true;
        }
        self.text_len += text.len();
        self.text.push_back((id, text.to_string()));
        while self.text_len > self.text_limit {
            let Some((_, old)) = self.text.pop_front() else { break };
            self.text_len -= old.len();
            self.text_dropped = true;
        }
    }

    fn is_call(body: BodyKind) -> bool {
        matches!(body, BodyKind::Tam | BodyKind::Action | BodyKind::Attp)
    }

    /// Notes one event of the response.
    pub fn observe(&mut self, event: &Event) {
        if !self.has_calls {
            return;
        }
        let tag = match event {
            Event::Close(Close { tag, .. }) => self.registry.lookup(tag.as_bytes()),
            Event::Element(el) => self.registry.lookup(el.tag.as_bytes()),
            _ => return,
        };
        self.observe_tagged(event, tag);
    }

    /// [`CallTracker::observe`] for an event whose element's tag is known
    /// (the payload stage carries it from the element's open).
    pub(crate) fn observe_tagged(&mut self, event: &Event, tag: Option<TagId>) {
        if !self.has_calls {
            return;
        }
        let Some((id, body)) = tag.map(|id| (id, self.registry.tag(id).body)) else {
            return;
        };
        match event {
            // A bare call element (ATTP: the whole output) always ends with
            // the input; only a block with its own close is cut off.
            Event::Close(c) if c.synthetic && Self::is_call(body) && !self.registry.tag(id).bare => {
                self.cut_off.push(c.id);
            }
            Event::Element(el) => {
                if Self::is_call(body) {
                    return;
                }
                let is_text = match self.registry.default_tag() {
                    Some(d) => d == id,
                    None => body == BodyKind::Stream,
                };
                if is_text && self.text.back().is_none_or(|(i, _)| *i != el.id) {
                    self.keep_text(el.id, &el.text);
                }
            }
            _ => {}
        }
    }

    /// The payload of a call element with its context; `None` for an
    /// element that is not a TAM, ACTION or ATTP call.
    pub fn payload(&mut self, el: &Element) -> Option<Payload> {
        let tag = self.registry.lookup(el.tag.as_bytes());
        self.payload_tagged(el, tag)
    }

    /// [`CallTracker::payload`] for an element whose tag is known.
    pub(crate) fn payload_tagged(&mut self, el: &Element, tag: Option<TagId>) -> Option<Payload> {
        let tag = tag?;
        let body = self.registry.tag(tag).body;
        if !Self::is_call(body) {
            return None;
        }
        let before: Vec<&str> =
            self.text.iter().filter(|(id, _)| *id < el.id).map(|(_, t)| t.trim()).filter(|t| !t.is_empty()).collect();
        let response_text = strip_fences(&before.join("\n"));
        let seen = self.blocks.entry(tag).or_insert(0);
        let previous_blocks = *seen;
        if !self.counted.contains(&el.id) {
            self.counted.push(el.id);
            *seen += 1;
        }
        self.text.retain(|(id, _)| *id > el.id);
        self.text_len = self.text.iter().map(|(_, t)| t.len()).sum();
        let text_truncated = std::mem::take(&mut self.text_dropped);
        // The response text goes into the call by value, not through the
        // context (which would copy it).
        let ctx = CallContext {
            response_text: None,
            previous_blocks,
            cut_off: self.cut_off.contains(&el.id),
            text_truncated,
        };
        self.cut_off.retain(|id| *id != el.id);
        self.counted.retain(|id| *id >= el.id);
        Some(call_payload(body, el, &ctx, Some(response_text)))
    }
}

#[cfg(test)]
mod tests {
    use super::{AttpCall, CallFormat, OnError, Step, ToolCall, attp::Violation};

    /// The serde text of a value (an ordered map's `==` ignores key order,
    /// the text does not).
    fn text(value: &serde_json::Value) -> String {
        serde_json::to_string(value).unwrap_or_default()
    }

    #[test]
    fn a_call_moved_into_its_value_is_its_serde_form() {
        let mut step = Step::new("File.Write");
        step.params.insert("path".into(), "a.txt".into());
        step.params.insert("lines".into(), serde_json::json!([1, {"b": null}]));
        step.on_error = OnError::Continue;
        step.retry = 3;
        step.type_hints.insert("lines".into(), "json".into());
        step.uris.insert("path".into(), "fam://x".into());
        step.index = Some(2);
        step.comment = Some("note".into());
        step.not_runnable = Some("cut_off".into());
        step.shared = vec!["mode".into()];
        let mut full = ToolCall::new(CallFormat::Attp);
        full.steps = vec![step, Step::new("Search")];
        full.request_id = Some("r1".into());
        full.response_text = Some("Calling.".into());
        full.warnings = vec!["stray_text".into()];
        full.comment = Some("c".into());
        full.comments = vec!["# a".into()];
        full.unassigned.insert("x_9".into(), "y".into());
        full.error = Some("bad".into());
        full.observation = Some("Observation: bad".into());
        full.attp = Some(AttpCall {
            thought: Some("t".into()),
            status: Some("success".into()),
            target: None,
            code: Some("print(1)".into()),
            message: None,
            violations: vec![Violation {
                rule: "import".into(),
                name: Some("os".into()),
                line: 1,
                message: "m".into(),
            }],
            calls: vec!["f".into()],
        });
        full.not_runnable = Some("second_action_block".into());
        for call in [full, ToolCall::new(CallFormat::Tam), ToolCall::new(CallFormat::Filament)] {
            assert_eq!(text(&call.clone().into_value()), text(&call.to_value()));
        }
    }

    use super::strip_fences;

    #[test]
    fn fences_and_blank_lines_go_from_both_ends_only() {
        let cases = [
            ("", ""),
            ("\n\n", ""),
            ("```\n```xml\n", ""),
            ("Let me look.", "Let me look."),
            ("\n```xml\n  Let me look.  \n\n```\n", "Let me look."),
            ("```\nfirst\n```\nsecond\n```json\n", "first\n```\nsecond"),
            ("``` not a fence\nx", "``` not a fence\nx"),
            ("a\n\n\nb\n```", "a\n\n\nb"),
            ("   \n雪が降る\n```", "雪が降る"),
        ];
        for (text, want) in cases {
            assert_eq!(strip_fences(text), want, "{text:?}");
        }
    }
}
