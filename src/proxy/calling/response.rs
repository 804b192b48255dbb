//! The response side of tool calling: the call elements of a choice's
//! parsed content become OpenAI `tool_calls` deltas, or the legacy
//! `function_call` for a request with `functions` (see the table in
//! [`super`]). Synchronous and I/O-free: the relay feeds it each frame's
//! source events and puts what it returns into the chunk it re-serialises.
//! It owns the call ids, the call indexes, the check against the
//! request's tools and the shape the calls take in a delta or message;
//! the content text without the calls comes from the parser
//! ([`crate::CallText::Omit`]).

use super::{CallShape, InvalidCalls};
use crate::CallText;
use crate::calls::{CallFormat, ToolCall, ToolCatalog, call_of};
use crate::event::DiagnosticCode;
use crate::event::{Event, RepairKind};
use crate::registry::{BodyKind, Registry};
use crate::sources::{Delta, FinishReason, FunctionDelta, Nullable, SourceEvent, StreamOptions, ToolCallDelta};
use serde_json::{Map, Value};
use std::sync::Arc;

/// What one choice gets from one frame.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ChoiceCalls {
    /// The choice index.
    pub(crate) choice: u32,
    /// `tool_calls` fragments, in order.
    pub(crate) calls: Vec<ToolCallDelta>,
    /// What goes into the content where calls were left out, each with
    /// the element id of its call ([`CallConverter::place_notes`]).
    pub(crate) notes: Vec<(u32, Note)>,
}

/// What takes a call element's place in the content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// The observation of a call that was left out, on a line of its own.
    Observation(String),
    /// The element as the model wrote it, in line: a `<tool_call>` whose
    /// body is prose (`Use <tool_call> and </tool_call> tags`), which is
    /// no call (see [`written_as_prose`]).
    Text(String),
}

/// Where one call element stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Its name went out with this call index; fragments follow.
    Streaming { index: u32 },
    /// Nothing sent yet: it goes out whole when the element completes.
    Held,
    /// An example inside a code block: not a call.
    Example,
}

/// One choice's calls so far.
#[derive(Debug, Default)]
struct ChoiceState {
    choice: u32,
    next_index: u32,
    slots: Vec<(u32, Slot)>,
    /// Element ids closed by the end of output (`closed_at_eof`).
    closed_at_eof: Vec<u32>,
    /// Element ids closed by a close tag of another name, with that name.
    closed_by: Vec<(u32, String)>,
    /// The output was cut (`finish_reason: length`, or a truncated stream).
    cut: bool,
    /// Whether the content so far ends a line (for observations).
    content_ends_line: bool,
    wrote_content: bool,
}

/// Turns call elements into `tool_calls`, per choice, for one response.
#[derive(Debug)]
pub(crate) struct CallConverter {
    registry: Arc<Registry>,
    catalog: Arc<ToolCatalog>,
    invalid: InvalidCalls,
    choices: Vec<ChoiceState>,
    /// Makes this response's call ids its own (see [`call_id`]).
    nonce: u64,
    /// How the client gets the calls.
    delivery: Delivery,
    /// The API the request used: the calls' shape, and how many a choice
    /// may make.
    shape: CallShape,
}

/// How a response's calls reach the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Streamed: with invalid calls passed, a call goes out as its name
    /// arrives, and what was sent stays sent.
    Stream,
    /// In one response body: nothing is sent before a call is complete,
    /// so every call is checked whole (an unreadable one is never sent).
    Whole,
}

impl CallConverter {
    /// The converter of a response to a request with `tools` (its calls
    /// checked against `catalog`), and `options` set to parse as it needs:
    /// call text left out of the content (the calls go out as `tool_calls`
    /// or observations instead). The one way the server and its self-check
    /// set up tool calling, so that the check runs what the server runs.
    pub(crate) fn attach(
        options: &mut StreamOptions,
        catalog: Arc<ToolCatalog>,
        invalid: InvalidCalls,
    ) -> CallConverter {
        options.parser.call_text = CallText::Omit;
        CallConverter {
            registry: options.registry.clone(),
            catalog,
            invalid,
            choices: Vec::new(),
            nonce: next_nonce(),
            delivery: Delivery::Stream,
            shape: CallShape::ToolCalls,
        }
    }

    /// The converter for a request that used `shape` (calls as
    /// `tool_calls` unless told otherwise).
    pub(crate) fn with_shape(mut self, shape: CallShape) -> CallConverter {
        self.shape = shape;
        self
    }

    /// How many calls a choice has made (sent as `tool_calls`, or as the
    /// legacy `function_call`).
    pub(crate) fn calls_made(&self, choice: u32) -> u32 {
        self.choices.iter().find(|c| c.choice == choice).map_or(0, |c| c.next_index)
    }

    /// The finish reason a choice should report instead of `reason`:
    /// `tool_calls` (legacy: `function_call`) when it made calls and ended
    /// normally.
    pub(crate) fn finish_reason(&self, choice: u32, reason: &str) -> Option<&'static str> {
        let normal = !matches!(reason, "length" | "content_filter" | "tool_calls" | "function_call");
        (normal && self.calls_made(choice) > 0).then_some(self.shape.finish_reason())
    }

    /// Puts a choice's call fragments into a streamed delta, in the
    /// request's shape: appended to `tool_calls`, or (legacy) joined into
    /// the one `function_call`, its name first, then argument text.
    pub(crate) fn put_in_delta(&self, delta: &mut Delta, calls: Vec<ToolCallDelta>) {
        if calls.is_empty() {
            return;
        }
        match self.shape {
            CallShape::ToolCalls => match &mut delta.tool_calls {
                Nullable::Value(list) => list.extend(calls),
                other => *other = Nullable::Value(calls),
            },
            // One call per choice (`max_calls`): every fragment is its.
            CallShape::FunctionCall => {
                for function in calls.into_iter().filter_map(|c| c.function.into_option()) {
                    let Nullable::Value(have) = &mut delta.function_call else {
                        delta.function_call = Nullable::Value(function);
                        continue;
                    };
                    if have.name.is_absent() {
                        have.name = function.name;
                    }
                    match (&mut have.arguments, function.arguments) {
                        (Nullable::Value(Value::String(a)), Nullable::Value(Value::String(more))) => a.push_str(&more),
                        (slot, more @ Nullable::Value(_)) => *slot = more,
                        _ => {}
                    }
                }
            }
        }
    }

    /// Puts a choice's call fragments, joined, into the message of a whole
    /// response: appended to `tool_calls`, or (legacy) as `function_call`
    /// (`{name, arguments}`).
    pub(crate) fn put_in_message(&self, message: &mut Map<String, Value>, calls: &[ToolCallDelta]) {
        let whole = assemble(calls);
        match self.shape {
            CallShape::ToolCalls => {
                let mut list = match message.shift_remove("tool_calls") {
                    Some(Value::Array(l)) => l,
                    _ => Vec::new(),
                };
                list.extend(whole);
                message.insert("tool_calls".into(), Value::Array(list));
            }
            CallShape::FunctionCall => {
                if let Some(function) =
                    whole.into_iter().next().and_then(|mut c| c.get_mut("function").map(Value::take))
                {
                    message.insert("function_call".into(), function);
                }
            }
        }
    }

    /// Notes the content text a choice received (where observations go).
    pub(crate) fn saw_content(&mut self, choice: u32, text: &str) {
        if let Some(last) = text.chars().last() {
            let state = self.state(choice);
            state.wrote_content = true;
            state.content_ends_line = last == '\n';
        }
    }

    /// Puts a choice's observations into `text`, the content it sends next:
    /// each where its call element was (`marks`: element id, byte offset
    /// in `text`), or else at the end, in order. An observation begins on
    /// a line of its own (after the content before it, sent earlier or in
    /// `text`) and ends its line. Call [`CallConverter::saw_content`] with
    /// the whole text after.
    pub(crate) fn place_notes(
        &mut self,
        choice: u32,
        text: &mut String,
        notes: &[(u32, Note)],
        marks: &[(u32, usize)],
    ) {
        if notes.is_empty() {
            return;
        }
        let state = self.state(choice);
        let (wrote, ends_line) = (state.wrote_content, state.content_ends_line);
        // Where each goes, in the text as it is now; stable for equal places.
        let mut places: Vec<(usize, &Note)> = notes
            .iter()
            .map(|(id, note)| {
                let at = marks.iter().find(|(m, _)| m == id).map_or(text.len(), |&(_, at)| at.min(text.len()));
                (if text.is_char_boundary(at) { at } else { text.len() }, note)
            })
            .collect();
        places.sort_by_key(|&(at, _)| at);
        let mut shift = 0;
        for (at, note) in places {
            let at = at + shift;
            let piece = match note {
                Note::Text(written) => written.clone(),
                Note::Observation(note) => {
                    let new_line = match text[..at].chars().last() {
                        Some(last) => last != '\n',
                        None => wrote && !ends_line,
                    };
                    let mut piece = String::with_capacity(note.len() + 2);
                    if new_line {
                        piece.push('\n');
                    }
                    piece.push_str(note);
                    piece.push('\n');
                    piece
                }
            };
            text.insert_str(at, &piece);
            shift += piece.len();
        }
    }

    fn state(&mut self, choice: u32) -> &mut ChoiceState {
        let pos = match self.choices.iter().position(|c| c.choice == choice) {
            Some(p) => p,
            None => {
                self.choices.push(ChoiceState { choice, ..ChoiceState::default() });
                self.choices.len() - 1
            }
        };
        &mut self.choices[pos]
    }

    /// The converter with the given nonce instead of its own: its call ids
    /// are those of any other converter given it (for comparing runs).
    #[cfg(feature = "testing")]
    pub(crate) fn with_nonce(mut self, nonce: u64) -> CallConverter {
        self.nonce = nonce;
        self
    }

    /// The converter of a whole (non-streamed) response: no call is sent
    /// before its element completes.
    pub(crate) fn for_whole_response(mut self) -> CallConverter {
        self.delivery = Delivery::Whole;
        self
    }

    /// Reads a frame's events; returns what each choice gets. `response_id`
    /// seeds the call ids.
    pub(crate) fn convert(&mut self, events: &[SourceEvent], response_id: &str) -> Vec<ChoiceCalls> {
        let mut out: Vec<ChoiceCalls> = Vec::new();
        for event in events {
            match event {
                SourceEvent::Finish { choice, reason: FinishReason::Length } => self.state(*choice).cut = true,
                SourceEvent::Truncated { choice, .. } => match choice {
                    Some(c) => self.state(*c).cut = true,
                    None => self.choices.iter_mut().for_each(|c| c.cut = true),
                },
                _ => {}
            }
        }
        // Calls in Qwen3-Coder's `<function=…>` or GLM's `name<arg_key>…`
        // form: their arguments are strings until the schema types them,
        // so they go out whole and checked (their one `call_delta` comes
        // with their element), not as the stream's fragments.
        let markup_calls: Vec<(u32, u32)> = events
            .iter()
            .filter_map(SourceEvent::as_choice_event)
            .filter_map(|ce| ce.event.as_element().map(|el| (ce.choice, el)))
            .filter(|(_, el)| &*el.tag == "tool_call" && crate::payload::is_markup_call(&el.text))
            .map(|(choice, el)| (choice, el.id))
            .collect();
        for event in events {
            let Some(ce) = event.as_choice_event() else { continue };
            let choice = ce.choice;
            match &ce.event {
                Event::Diagnostic(d) if d.code == DiagnosticCode::CallInCodeBlock => {
                    if let Some(id) = d.element {
                        self.state(choice).slots.push((id, Slot::Example));
                    }
                }
                Event::Repair(r) if r.kind == RepairKind::ClosedAtEof => {
                    if let Some(id) = r.element {
                        self.state(choice).closed_at_eof.push(id);
                    }
                }
                Event::Repair(r)
                    if r.kind == RepairKind::MismatchedClose && r.tag.as_ref().is_some_and(|t| self.is_call(t)) =>
                {
                    if let (Some(id), Some(from)) = (r.element, &r.from) {
                        self.state(choice).closed_by.push((id, from.clone()));
                    }
                }
                Event::CallDelta(d) => {
                    let send_early = self.invalid == InvalidCalls::Pass && self.delivery == Delivery::Stream;
                    let max = self.shape.max_calls();
                    let state = self.state(choice);
                    // A call past what the shape allows is held: it
                    // completes as an observation.
                    let send_early = send_early && state.next_index < max && !markup_calls.contains(&(choice, d.id));
                    let slot = state.slots.iter().find(|(id, _)| *id == d.id).map(|(_, s)| *s);
                    let delta = match (slot, &d.name) {
                        (None, Some(name)) if send_early => {
                            let index = state.next_index;
                            state.next_index += 1;
                            state.slots.push((d.id, Slot::Streaming { index }));
                            Some(first_delta(
                                index,
                                &call_id(self.nonce, response_id, choice, index),
                                name,
                                &d.arguments,
                            ))
                        }
                        (None, _) => {
                            state.slots.push((d.id, Slot::Held));
                            None
                        }
                        (Some(Slot::Streaming { index }), _) if !d.arguments.is_empty() => {
                            Some(args_delta(index, &d.arguments))
                        }
                        _ => None,
                    };
                    if let Some(delta) = delta {
                        entry(&mut out, choice).calls.push(delta);
                    }
                }
                Event::Element(el) if self.is_call(&el.tag) => {
                    let Some(call) = call_of(&self.registry, el) else { continue };
                    let state = self.state(choice);
                    let slot = state.slots.iter().find(|(id, _)| *id == el.id).map(|(_, s)| *s);
                    // Cut: never closed, and the output was cut, or its
                    // JSON had to be completed to be read (the model
                    // stopped inside it).
                    let cut = state.closed_at_eof.contains(&el.id)
                        && (state.cut || serde_json::from_str::<serde::de::IgnoredAny>(el.text.trim()).is_err());
                    state.slots.retain(|(id, _)| *id != el.id);
                    let closed_by = state.closed_by.iter().position(|(id, _)| *id == el.id);
                    let closed_by = closed_by.map(|at| state.closed_by.swap_remove(at).1);
                    if matches!(slot, None | Some(Slot::Held)) && call.steps.is_empty() && written_as_prose(el) {
                        // No call: the text stays as written.
                        let end = if state.closed_at_eof.contains(&el.id) {
                            None
                        } else {
                            Some(closed_by.as_deref().unwrap_or(&el.raw_tag))
                        };
                        entry(&mut out, choice).notes.push((el.id, Note::Text(as_written(el, end))));
                        continue;
                    }
                    match slot {
                        Some(Slot::Example) => {}
                        // Sent already; a body that turned out unreadable
                        // also gets its observation as content.
                        Some(Slot::Streaming { .. }) if call.steps.is_empty() => {
                            let empty = ToolCall { steps: Vec::new(), ..call };
                            self.complete(&empty, el.id, cut, choice, response_id, &mut out);
                        }
                        // The first call went out as it streamed; the
                        // others written in the same element go now.
                        Some(Slot::Streaming { .. }) if call.steps.len() > 1 => {
                            let steps = call.steps[1..].to_vec();
                            let rest = ToolCall { steps, ..call };
                            self.complete(&rest, el.id, cut, choice, response_id, &mut out);
                        }
                        Some(Slot::Streaming { .. }) => {}
                        None | Some(Slot::Held) => self.complete(&call, el.id, cut, choice, response_id, &mut out),
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn is_call(&self, tag: &str) -> bool {
        tag == "tool_call"
            || self
                .registry
                .lookup(tag.as_bytes())
                .is_some_and(|id| matches!(self.registry.tag(id).body, BodyKind::Tam | BodyKind::Action))
    }

    /// A call element completed with nothing sent yet: send its steps (or
    /// their observations).
    fn complete(
        &mut self,
        call: &ToolCall,
        element: u32,
        cut: bool,
        choice: u32,
        response_id: &str,
        out: &mut Vec<ChoiceCalls>,
    ) {
        let mut notes: Vec<String> = Vec::new();
        let mut sends: Vec<(String, Map<String, Value>)> = Vec::new();
        if let Some(obs) = &call.observation
            && call.steps.is_empty()
        {
            notes.push(obs.clone());
        }
        for (i, step) in call.steps.iter().enumerate() {
            let reason = step.not_runnable.as_deref().or(call.not_runnable.as_deref());
            let reason = reason.or((cut && call.format == CallFormat::Filament).then_some("cut_off"));
            if let Some(reason) = reason {
                notes.push(crate::tools::observe::not_run(&step.tool_id, reason, ""));
                continue;
            }
            match self.catalog.check_step(call.format, i, step) {
                Ok(params) => sends.push((step.tool_id.clone(), params)),
                Err(problem) if self.invalid == InvalidCalls::Pass => {
                    tracing::debug!("passing an invalid call: {problem}");
                    sends.push((step.tool_id.clone(), step.params.clone()));
                }
                Err(problem) => notes.push(problem.observation()),
            }
        }
        let (nonce, max) = (self.nonce, self.shape.max_calls());
        let state = self.state(choice);
        let mut deltas = Vec::new();
        for (name, params) in sends {
            if state.next_index >= max {
                let why = "only one function call per answer (legacy function calling); this was a later one";
                notes.push(crate::tools::observe::not_run(&name, "one_call", why));
                continue;
            }
            let index = state.next_index;
            state.next_index += 1;
            let args = Value::Object(params).to_string();
            deltas.push(first_delta(index, &call_id(nonce, response_id, choice, index), &name, &args));
        }
        let e = entry(out, choice);
        e.calls.extend(deltas);
        e.notes.extend(notes.into_iter().map(|note| (element, Note::Observation(note))));
    }
}

/// Whether a `<tool_call>` element is prose that names the tag rather
/// than a call: no name attribute, and a body that does not begin as a
/// call does (`{`, `[`, a code fence) and is not empty. vLLM's Hermes
/// reader leaves such text as it is; reading it as a malformed call would
/// replace the model's sentence with an observation.
fn written_as_prose(el: &crate::event::Element) -> bool {
    let named = crate::calls::stream::NAME_KEYS.iter().any(|k| el.attrs.contains_key(*k));
    let first = el.text.trim_start().chars().next();
    &*el.tag == "tool_call" && !named && first.is_some_and(|c| !matches!(c, '{' | '[' | '`'))
}

/// The element as written: its open tag (attributes re-quoted), its text,
/// and `</end>` when a close tag ended it.
fn as_written(el: &crate::event::Element, end: Option<&str>) -> String {
    let mut out = format!("<{}", el.raw_tag);
    for (name, value) in &el.attrs {
        out.push_str(&format!(" {name}=\"{}\"", value.replace('&', "&amp;").replace('"', "&quot;")));
    }
    out.push('>');
    out.push_str(&el.text);
    if let Some(end) = end {
        out.push_str(&format!("</{end}>"));
    }
    out
}

fn entry(out: &mut Vec<ChoiceCalls>, choice: u32) -> &mut ChoiceCalls {
    let pos = match out.iter().position(|c| c.choice == choice) {
        Some(p) => p,
        None => {
            out.push(ChoiceCalls { choice, ..ChoiceCalls::default() });
            out.len() - 1
        }
    };
    &mut out[pos]
}

/// `call_` and 16 hex digits of a hash of the converter's nonce, the
/// response id, the choice and the index: unique per call, as OpenAI's
/// are, even when an upstream repeats its response ids (Ollama's
/// `chatcmpl-` + a number under 1000, a mock's fixed id), so that the
/// turns of one conversation never share a call id.
pub(crate) fn call_id(nonce: u64, response_id: &str, choice: u32, index: u32) -> String {
    let h = super::fnv(&[&nonce.to_le_bytes(), response_id.as_bytes(), &choice.to_le_bytes(), &index.to_le_bytes()]);
    format!("call_{h:016x}")
}

/// A number no other converter of this process gets, and that another
/// process is unlikely to: a counter, started from std's per-process
/// random hash keys (no random-number crate for one seed).
fn next_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().build_hasher().finish());
    seed ^ COUNT.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The first fragment of a call: index, id, type, name, and the arguments
/// known so far.
fn first_delta(index: u32, id: &str, name: &str, arguments: &str) -> ToolCallDelta {
    let mut extra = Map::new();
    extra.insert("type".into(), Value::String("function".into()));
    ToolCallDelta {
        index: Nullable::Value(index),
        id: Nullable::Value(id.to_string()),
        function: Nullable::Value(FunctionDelta {
            name: Nullable::Value(name.to_string()),
            arguments: Nullable::Value(Value::String(arguments.to_string())),
            extra: Map::new(),
        }),
        extra,
    }
}

/// A later fragment: index and more argument text.
fn args_delta(index: u32, arguments: &str) -> ToolCallDelta {
    ToolCallDelta {
        index: Nullable::Value(index),
        id: Nullable::Absent,
        function: Nullable::Value(FunctionDelta {
            name: Nullable::Absent,
            arguments: Nullable::Value(Value::String(arguments.to_string())),
            extra: Map::new(),
        }),
        extra: Map::new(),
    }
}

/// Joins fragments into whole `message.tool_calls` entries (for a
/// non-streamed response).
pub(crate) fn assemble(deltas: &[ToolCallDelta]) -> Vec<Value> {
    let mut calls: Vec<(u32, String, String, String)> = Vec::new();
    for d in deltas {
        let index = d.index.as_option().copied().unwrap_or(0);
        let pos = match calls.iter().position(|c| c.0 == index) {
            Some(p) => p,
            None => {
                calls.push((index, String::new(), String::new(), String::new()));
                calls.len() - 1
            }
        };
        let c = &mut calls[pos];
        if let Some(id) = d.id.as_option() {
            c.1.clone_from(id);
        }
        if let Some(f) = d.function.as_option() {
            if let Some(n) = f.name.as_option() {
                c.2.clone_from(n);
            }
            if let Some(Value::String(a)) = f.arguments.as_option() {
                c.3.push_str(a);
            }
        }
    }
    calls
        .into_iter()
        .map(|(_, id, name, args)| {
            serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Registry;
    use crate::sources::{CallMark, ChatStream, StreamOptions};
    use serde_json::json;

    fn catalog() -> Arc<ToolCatalog> {
        let mut c = ToolCatalog::new();
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}}]);
        c.add_openai_tools(&tools).unwrap_or_else(|e| panic!("{e}"));
        Arc::new(c)
    }

    /// Content pieces through the stream model; returns (content, calls).
    fn run(profile: &str, pieces: &[&str], invalid: InvalidCalls, finish: &str) -> (String, Vec<Value>, u32) {
        let registry = Registry::profile(profile).unwrap_or_else(|| panic!("{profile}"));
        let mut options = StreamOptions::with_registry(registry);
        options.parser.rewrite = true;
        let mut conv = CallConverter::attach(&mut options, catalog(), invalid);
        let mut stream = ChatStream::new(options);
        let mut content = String::new();
        let mut deltas = Vec::new();
        // As the relay does: the frame's text with its observations placed.
        let mut feed =
            |events: &[SourceEvent], rewrites: Vec<(u32, String)>, marks: Vec<CallMark>, conv: &mut CallConverter| {
                let mut text: String = rewrites.into_iter().map(|(_, t)| t).collect();
                let marks: Vec<(u32, usize)> = marks.iter().map(|m| (m.element, m.at)).collect();
                for c in conv.convert(events, "chatcmpl-1") {
                    conv.place_notes(0, &mut text, &c.notes, &marks);
                    deltas.extend(c.calls);
                }
                conv.saw_content(0, &text);
                content.push_str(&text);
            };
        for p in pieces {
            let mut events = Vec::new();
            let chunk =
                json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]});
            stream.push_data_events("message", &chunk.to_string(), 0, &mut events);
            let mut marks = Vec::new();
            let rw = stream.take_rewrites_marked(&mut marks);
            feed(&events, rw, marks, &mut conv);
        }
        let mut events = Vec::new();
        let chunk = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]});
        stream.push_data_events("message", &chunk.to_string(), 0, &mut events);
        let mut marks = Vec::new();
        let rw = stream.take_rewrites_marked(&mut marks);
        feed(&events, rw, marks, &mut conv);
        let mut events = Vec::new();
        let mut marks = Vec::new();
        let rw = stream.finish_with_rewrites_marked(&mut events, &mut marks);
        feed(&events, rw, marks, &mut conv);
        let made = conv.calls_made(0);
        (content, assemble(&deltas), made)
    }

    fn split(text: &str, n: usize) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        chars.chunks(n).map(|c| c.iter().collect()).collect()
    }

    #[test]
    fn hermes_calls_at_any_split() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}\n</tool_call>";
        for n in [1, 2, 5, 13, text.len()] {
            let pieces = split(text, n);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
                let (content, calls, made) = run("chat", &refs, invalid, "stop");
                assert_eq!(content, "Let me check.\n", "split {n}");
                assert_eq!(made, 1);
                assert_eq!(calls[0]["function"]["name"], "get_weather");
                let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap_or(""))
                    .unwrap_or(Value::Null);
                assert_eq!(args, json!({"city": "Oslo", "days": 2}), "split {n} {invalid:?}");
                assert!(calls[0]["id"].as_str().is_some_and(|i| i.starts_with("call_") && i.len() == 21));
            }
        }
    }

    #[test]
    fn unknown_tool_pass_or_drop() {
        let text = "<tool_call>{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
        let (content, calls, _) = run("chat", &[text], InvalidCalls::Pass, "stop");
        assert_eq!((content.as_str(), calls[0]["function"]["name"].as_str()), ("", Some("get_wether")));
        let (content, calls, made) = run("chat", &[text], InvalidCalls::Drop, "stop");
        assert!(calls.is_empty() && made == 0);
        assert_eq!(content, "Observation: Error - Unknown tool ID 'get_wether', did you mean 'get_weather'?\n");
        let bad = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}</tool_call>";
        let (content, calls, _) = run("chat", &[bad], InvalidCalls::Drop, "stop");
        assert!(calls.is_empty());
        assert!(content.starts_with("Observation: Error - Invalid parameters for get_weather"), "{content}");
    }

    #[test]
    fn an_observation_takes_its_calls_place() {
        let text =
            "Before.<tool_call>{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>After.";
        let want = "Before.\nObservation: Error - Unknown tool ID 'get_wether', did you mean 'get_weather'?\nAfter.";
        for n in [1, 4, 9, text.len()] {
            let pieces = split(text, n);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (content, calls, _) = run("chat", &refs, InvalidCalls::Drop, "stop");
            assert_eq!((content.as_str(), calls.len()), (want, 0), "split {n}");
        }
    }

    /// Qwen3-Coder writes its calls as `<function=…><parameter=…>` inside
    /// `<tool_call>`, GLM as `name<arg_key>…</arg_key><arg_value>…`: they
    /// become `tool_calls`, the parameters typed by the tool's schema, at
    /// any split.
    #[test]
    fn markup_calls_become_tool_calls() {
        let texts = [
            "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
            "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        ];
        for text in texts {
            for n in [1, 4, 11, text.len()] {
                let pieces = split(text, n);
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
                    let (content, calls, made) = run("chat", &refs, invalid, "stop");
                    let got = (content.as_str(), made, calls.len());
                    assert_eq!(got, ("Checking.\n", 1, 1), "{text} split {n} {invalid:?}");
                    assert_eq!(calls[0]["function"]["name"], "get_weather");
                    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap_or(""))
                        .unwrap_or(Value::Null);
                    assert_eq!(args, json!({"city": "Oslo", "days": 2}), "{text} split {n} {invalid:?}");
                }
            }
        }
    }

    /// Two calls written in one `<tool_call>` (one object after the other,
    /// or a list) are two `tool_calls`, the first streamed as it arrives
    /// when calls pass, both sent whole and checked when they are dropped.
    #[test]
    fn several_calls_in_one_element_are_several_tool_calls() {
        let texts = [
            "On it.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bergen\"}}\n</tool_call>",
            "On it.<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bergen\"}}]</tool_call>",
            "On it.<tool_call>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}</tool_call><tool_call>{\"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bergen\"}}}</tool_call>",
        ];
        for text in texts {
            for n in [1, 5, text.len()] {
                let pieces = split(text, n);
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
                    let (content, calls, made) = run("chat", &refs, invalid, "stop");
                    assert_eq!((content.as_str(), made), ("On it.", 2), "{text} split {n} {invalid:?}");
                    let cities: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            let args = c["function"]["arguments"].as_str().unwrap_or("");
                            serde_json::from_str::<Value>(args).unwrap_or(Value::Null)["city"].clone()
                        })
                        .collect();
                    assert_eq!(cities, [json!("Oslo"), json!("Bergen")], "{text} split {n} {invalid:?}: {calls:?}");
                }
            }
        }
    }

    /// Prose that names the tags is no call: the client gets it as the
    /// model wrote it, however it was split, with invalid calls passed or
    /// dropped.
    #[test]
    fn prose_naming_the_call_tag_stays_text() {
        let texts = [
            "Wrap each call in <tool_call> and </tool_call> tags, with JSON between them.",
            "The marker <tool_call> starts a call; the model writes JSON after it.",
            "A call is <tool_call> then the JSON, and </content> ends the answer.",
        ];
        for text in texts {
            for n in [1, 3, 8, text.len()] {
                let pieces = split(text, n);
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
                    let (content, calls, made) = run("chat", &refs, invalid, "stop");
                    assert_eq!((content.as_str(), calls.len(), made), (text, 0, 0), "split {n} {invalid:?}");
                }
            }
        }
        // A body that begins as a call does is still read as one: an
        // unreadable one gets its observation.
        let text = "Sure.<tool_call>{\"name\": }</tool_call>";
        let (content, calls, _) = run("chat", &[text], InvalidCalls::Drop, "stop");
        assert!(calls.is_empty() && content.starts_with("Sure.\nObservation:"), "{content}");
    }

    #[test]
    fn example_in_code_block_stays_text() {
        let text = "Like this:\n```\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>\n```\nOK.";
        let (content, calls, made) = run("chat", &[text], InvalidCalls::Pass, "stop");
        assert_eq!((content.as_str(), calls.len(), made), (text, 0, 0));
    }

    #[test]
    fn cut_off_call() {
        let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
        let (_, calls, _) = run("chat", &[text], InvalidCalls::Pass, "length");
        assert_eq!(calls.len(), 1, "pass: what was streamed stays");
        let (content, calls, _) = run("chat", &[text], InvalidCalls::Drop, "length");
        assert!(calls.is_empty());
        assert!(content.contains("was not run: its block was cut off"), "{content}");
        // A missing </tool_call> at a normal end is a whole call.
        let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
        let (_, calls, _) = run("chat", &[text], InvalidCalls::Drop, "stop");
        assert_eq!(calls.len(), 1);
        // But a model that stopped inside the JSON cut its call, whatever
        // the finish reason says: nothing is made up to close it.
        let text = "A <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"unterminated";
        let (content, calls, _) = run("chat", &[text], InvalidCalls::Drop, "stop");
        assert!(calls.is_empty(), "{calls:?}");
        assert!(content.contains("was not run: its block was cut off"), "{content}");
    }

    #[test]
    fn tam_steps_become_calls_with_schema_types() {
        let text = "Checking.\n<|[REQUEST_TOOL]|>\ncommand_1:»»»get_weather«««\ncity_1:»»»Oslo«««\ndays_1:»»»3«««\ncommand_2:»»»get_weather«««\ncity_2:»»»Rome«««\n<|[END_TOOL]|>";
        for n in [1, 7, text.len()] {
            let pieces = split(text, n);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (content, calls, made) = run("tam", &refs, InvalidCalls::Pass, "stop");
            assert_eq!(content.trim_end(), "Checking.", "split {n}");
            assert_eq!(made, 2);
            assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\",\"days\":3}");
            assert_eq!(calls[1]["function"]["arguments"], "{\"city\":\"Rome\"}");
            assert_ne!(calls[0]["id"], calls[1]["id"]);
        }
    }

    #[test]
    fn fenced_action_block_leaves_no_fence() {
        let text = "I will look.\n```xml\n<ACTION><get_weather><city>Oslo</city></get_weather></ACTION>\n```\n";
        let (content, calls, _) = run("action", &[text], InvalidCalls::Pass, "stop");
        assert_eq!(calls.len(), 1);
        assert!(!content.contains("```"), "{content:?}");
        assert!(content.starts_with("I will look."), "{content:?}");
    }
}
