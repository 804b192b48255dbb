//! The wire shapes of OpenAI-compatible chat completions: streamed
//! `chat.completion.chunk` objects and whole `chat.completion` responses.
//!
//! This module owns (de)serialisation only. Every struct keeps the fields
//! it does not interpret in `extra`, and every interpreted field remembers
//! whether it was absent, `null` or a value ([`Nullable`]), so a chunk read
//! here and written back is the same JSON document (keys may come out in
//! another order). A proxy that rewrites content relies on that. What the
//! fields mean is [`super::model`]'s business. A reader that does not
//! write chunks back takes the faster crate-private `read_chat_meaning`,
//! which skips the fields the model does not read.
//!
//! ```
//! use spindle::sources::ChatChunk;
//!
//! let text = r#"{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,
//!     "delta":{"content":"Hi","x_vendor":1},"finish_reason":null}],"usage":null}"#;
//! let chunk: ChatChunk = serde_json::from_str(text).unwrap();
//! assert_eq!(chunk.id(), Some("c1"));
//! let choice = &chunk.choices.as_option().unwrap()[0];
//! let delta = choice.delta.as_option().unwrap();
//! assert_eq!(delta.content.as_option().and_then(|c| c.as_text()), Some("Hi"));
//!
//! // Written back, nothing is lost: unknown fields and nulls survive.
//! let again: serde_json::Value = serde_json::to_value(&chunk).unwrap();
//! let original: serde_json::Value = serde_json::from_str(text).unwrap();
//! assert_eq!(again, original);
//! ```

use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

/// A field that may be absent, `null`, or hold a value: the three are kept
/// apart so that writing a document back reproduces it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Nullable<T> {
    /// The key was not in the object.
    #[default]
    Absent,
    /// The key was there with `null`.
    Null,
    /// The key was there with a value.
    Value(T),
}

impl<T> Nullable<T> {
    /// The value, if there is one.
    pub fn as_option(&self) -> Option<&T> {
        match self {
            Nullable::Value(v) => Some(v),
            _ => None,
        }
    }

    /// The value, mutably.
    pub fn as_mut_option(&mut self) -> Option<&mut T> {
        match self {
            Nullable::Value(v) => Some(v),
            _ => None,
        }
    }

    /// The value, consuming the field.
    pub fn into_option(self) -> Option<T> {
        match self {
            Nullable::Value(v) => Some(v),
            _ => None,
        }
    }

    /// Whether the key was absent (used to skip it when serialising).
    pub fn is_absent(&self) -> bool {
        matches!(self, Nullable::Absent)
    }
}

impl<T: Serialize> Serialize for Nullable<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Nullable::Value(v) => v.serialize(s),
            Nullable::Absent | Nullable::Null => s.serialize_none(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Nullable<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(d)? {
            Some(v) => Nullable::Value(v),
            None => Nullable::Null,
        })
    }
}

/// One streamed `chat.completion.chunk`, or a whole `chat.completion`
/// response (whose choices carry `message` instead of `delta`).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ChatChunk {
    /// The choices of this chunk (empty, `null` or absent in a usage chunk).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub choices: Nullable<Vec<Choice>>,
    /// Token usage (the last chunk with `stream_options.include_usage`).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub usage: Nullable<Value>,
    /// An in-band error (`{"error":{...}}`).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub error: Nullable<Value>,
    /// Azure content filtering of the prompt.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub prompt_filter_results: Nullable<Value>,
    /// Everything else (`id`, `object`, `created`, `model`,
    /// `system_fingerprint`, vendor fields), kept as it came.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatChunk {
    /// The chunk id, when it is a string.
    pub fn id(&self) -> Option<&str> {
        self.extra.get("id").and_then(Value::as_str)
    }

    /// The model name, when it is a string.
    pub fn model(&self) -> Option<&str> {
        self.extra.get("model").and_then(Value::as_str)
    }

    /// The `object` field (`chat.completion.chunk`, `chat.completion`, ...).
    pub fn object(&self) -> Option<&str> {
        self.extra.get("object").and_then(Value::as_str)
    }

    /// The `created` timestamp, when it is an integer.
    pub fn created(&self) -> Option<i64> {
        self.extra.get("created").and_then(Value::as_i64)
    }

    /// The `type` field of other stream dialects (Anthropic Messages,
    /// Responses API), which chat chunks do not have.
    pub fn type_field(&self) -> Option<&str> {
        self.extra.get("type").and_then(Value::as_str)
    }

    /// The choices, or an empty slice.
    pub fn choice_list(&self) -> &[Choice] {
        self.choices.as_option().map(Vec::as_slice).unwrap_or(&[])
    }
}

/// One choice of a chunk or response.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Choice {
    /// Which choice (`n > 1`); some servers leave it out for choice 0.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub index: Nullable<u32>,
    /// The new text of a streamed choice.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub delta: Nullable<Delta>,
    /// The whole message of a non-streamed choice.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub message: Nullable<Delta>,
    /// Legacy completions (`text_completion`) carry their text here.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub text: Nullable<String>,
    /// Why the choice ended; any string is kept.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub finish_reason: Nullable<String>,
    /// Azure content filtering of the completion.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub content_filter_results: Nullable<Value>,
    /// Everything else (`logprobs`, `native_finish_reason`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The delta of a streamed choice, or the message of a whole response.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Delta {
    /// Answer text: a string, or (Mistral) a list of typed parts.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub content: Nullable<Content>,
    /// Reasoning text (DeepSeek, Qwen, xAI, llama.cpp, ...).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub reasoning_content: Nullable<String>,
    /// Reasoning text (OpenRouter, Groq, vLLM).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub reasoning: Nullable<String>,
    /// Refusal text (OpenAI structured outputs).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub refusal: Nullable<String>,
    /// Native tool-call fragments.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub tool_calls: Nullable<Vec<ToolCallDelta>>,
    /// The legacy single function call.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub function_call: Nullable<FunctionDelta>,
    /// Everything else (`role`, `reasoning_details`, `annotations`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The `content` of a delta or message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text (the usual form).
    Text(String),
    /// A list of typed parts (`{"type":"text","text":...}`,
    /// `{"type":"thinking","thinking":[...]}`), kept as JSON.
    Parts(Vec<Value>),
}

impl Content {
    /// The text, when the content is a plain string.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Content::Text(t) => Some(t),
            Content::Parts(_) => None,
        }
    }
}

/// One fragment of a native tool call.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ToolCallDelta {
    /// Which call of the choice (absent with some servers).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub index: Nullable<u32>,
    /// The call id (usually only on the first fragment).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub id: Nullable<String>,
    /// Name and argument text.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub function: Nullable<FunctionDelta>,
    /// Everything else (`type`, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The function part of a tool call fragment.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct FunctionDelta {
    /// The function name (usually whole, on the first fragment).
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub name: Nullable<String>,
    /// Argument text (a JSON document in pieces); some servers send an
    /// object instead, kept as JSON.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub arguments: Nullable<Value>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// An object key, borrowed from the input when it can be.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// `Deserialize` for a struct of interpreted [`Nullable`] fields and an
/// `extra` map of every other key: a known key is read straight into its
/// field (twice is an error, as with a derived struct), any other into
/// `extra`.
///
/// Hand-written because serde's `#[serde(flatten)]` first buffers every
/// value of the object as a generic tree and then reads it again: that
/// was over half of the proxy's CPU per relayed chunk (callgrind).
macro_rules! deserialize_open_struct {
    ($name:ident { $($field:ident),* $(,)? } extra: $hint:literal) => {
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct StructVisitor;
                impl<'de> Visitor<'de> for StructVisitor {
                    type Value = $name;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str(concat!("struct ", stringify!($name)))
                    }
                    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<$name, A::Error> {
                        let mut out = $name::default();
                        while let Some(Key(key)) = map.next_key()? {
                            match key.as_ref() {
                                $(stringify!($field) => {
                                    if !out.$field.is_absent() {
                                        return Err(A::Error::duplicate_field(stringify!($field)));
                                    }
                                    out.$field = map.next_value()?;
                                })*
                                _ => {
                                    if out.extra.is_empty() {
                                        // Room for the usual keys at once,
                                        // instead of growing the map twice.
                                        out.extra = Map::with_capacity($hint);
                                    }
                                    out.extra.insert(key.into_owned(), map.next_value()?);
                                }
                            }
                        }
                        Ok(out)
                    }
                }
                d.deserialize_map(StructVisitor)
            }
        }
    };
}

// `extra`: how many other keys to make room for at the first one (a
// chunk's `id`, `object`, `created`, `model`, `system_fingerprint`, ...).
deserialize_open_struct!(ChatChunk { choices, usage, error, prompt_filter_results } extra: 8);
deserialize_open_struct!(Choice { index, delta, message, text, finish_reason, content_filter_results } extra: 2);
deserialize_open_struct!(Delta { content, reasoning_content, reasoning, refusal, tool_calls, function_call } extra: 2);
deserialize_open_struct!(ToolCallDelta { index, id, function } extra: 1);
deserialize_open_struct!(FunctionDelta { name, arguments } extra: 1);

/// Reads a chat chunk for what it means to the stream model only: the
/// interpreted fields, and `id` and `model` when `named` (the stream
/// model asks for them until it knows them). Every other key is skipped
/// without being built ([`IgnoredAny`]). `None` when the text is not such
/// a chunk: not JSON, a field of an unexpected type, a repeated field, or
/// no `choices` (another dialect, a usage or error chunk); the caller then
/// reads the whole chunk as before, so that its errors and diagnostics do
/// not change.
///
/// Why: a whole chunk keeps every other key as JSON (`extra`) so that it
/// can be written back unchanged, which a rewriting proxy needs. Each such
/// key is a string, a value and a map entry; on recorded streams that was
/// over half the cost of reading them. A tap that only wants the events
/// does not pay it. The choices and their deltas (a choice is most of a
/// kilobyte) are also read in place rather than returned through serde's
/// layers, each of which would copy them.
pub(crate) fn read_chat_meaning(text: &str, named: bool) -> Option<ChatChunk> {
    let mut chunk = ChatChunk::default();
    let mut de = serde_json::Deserializer::from_str(text);
    ChunkInto { chunk: &mut chunk, named }.deserialize(&mut de).ok()?;
    // As `serde_json::from_str`: nothing but whitespace after the value.
    de.end().ok()?;
    (!chunk.choices.is_absent()).then_some(chunk)
}

/// Reads the keys of one object into `$out` (see [`read_chat_meaning`]):
/// the `plain` fields as their types say, the `seeded` ones through a seed
/// that reads them in place, a repeated one an error; `kept(key)` keys
/// into `extra` as they are; every other key skipped.
macro_rules! read_fields_into {
    (
        $map:ident, $out:expr,
        plain: [$($plain:ident),* $(,)?],
        seeded: [$($field:ident => $seed:ident),* $(,)?],
        kept: $kept:expr $(,)?
    ) => {{
        let out = $out;
        while let Some(Key(key)) = $map.next_key()? {
            match key.as_ref() {
                $(stringify!($plain) => {
                    if !out.$plain.is_absent() {
                        return Err(serde::de::Error::duplicate_field(stringify!($plain)));
                    }
                    out.$plain = $map.next_value()?;
                })*
                $(stringify!($field) => {
                    if !out.$field.is_absent() {
                        return Err(serde::de::Error::duplicate_field(stringify!($field)));
                    }
                    $map.next_value_seed($seed(&mut out.$field))?;
                })*
                other if ($kept)(other) => {
                    out.extra.insert(key.into_owned(), $map.next_value()?);
                }
                _ => {
                    $map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }};
}

/// A chunk's keys, read into it ([`read_chat_meaning`]).
struct ChunkInto<'b> {
    chunk: &'b mut ChatChunk,
    named: bool,
}

impl<'de> DeserializeSeed<'de> for ChunkInto<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ChunkInto<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct ChatChunk")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let named = self.named;
        read_fields_into!(
            map, self.chunk,
            plain: [usage, error, prompt_filter_results],
            seeded: [choices => NullableInto],
            kept: |key: &str| named && (key == "id" || key == "model"),
        )
    }
}

/// A value that a reader fills where it already is (see
/// [`read_chat_meaning`]).
trait ReadInto<'de>: Default {
    fn read_into<D: Deserializer<'de>>(&mut self, d: D) -> Result<(), D::Error>;
}

/// A [`Nullable`] field read in place: `null` makes it `Null`; a value
/// starts as the default and is read into.
struct NullableInto<'b, T>(&'b mut Nullable<T>);

impl<'de, T: ReadInto<'de>> DeserializeSeed<'de> for NullableInto<'_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, T: ReadInto<'de>> Visitor<'de> for NullableInto<'_, T> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null or a value")
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        *self.0 = Nullable::Null;
        Ok(())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.visit_none()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        *self.0 = Nullable::Value(T::default());
        match self.0 {
            Nullable::Value(value) => value.read_into(d),
            Nullable::Absent | Nullable::Null => Ok(()),
        }
    }
}

/// The list of `choices`, each choice read where it stays.
impl<'de> ReadInto<'de> for Vec<Choice> {
    fn read_into<D: Deserializer<'de>>(&mut self, d: D) -> Result<(), D::Error> {
        struct ChoiceList<'b>(&'b mut Vec<Choice>);
        impl<'de> Visitor<'de> for ChoiceList<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of choices")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
                let list = self.0;
                list.reserve(seq.size_hint().unwrap_or(1).min(8));
                loop {
                    // A slot for the next choice, read into where it stays.
                    list.push(Choice::default());
                    let Some(slot) = list.last_mut() else { break };
                    if seq.next_element_seed(ChoiceInto(slot))?.is_none() {
                        list.pop();
                        break;
                    }
                }
                Ok(())
            }
        }
        d.deserialize_seq(ChoiceList(self))
    }
}

/// One choice of the list, read into its slot.
struct ChoiceInto<'b>(&'b mut Choice);

impl<'de> DeserializeSeed<'de> for ChoiceInto<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ChoiceInto<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("struct Choice")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        read_fields_into!(
            map, self.0,
            plain: [index, text, finish_reason, content_filter_results],
            seeded: [delta => NullableInto, message => NullableInto],
            kept: |_: &str| false,
        )
    }
}

/// A `delta` or `message`, its keys read into it.
impl<'de> ReadInto<'de> for Delta {
    fn read_into<D: Deserializer<'de>>(&mut self, d: D) -> Result<(), D::Error> {
        struct DeltaFields<'b>(&'b mut Delta);
        impl<'de> Visitor<'de> for DeltaFields<'_> {
            type Value = ();
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("struct Delta")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
                read_fields_into!(
                    map, self.0,
                    plain: [content, reasoning_content, reasoning, refusal, tool_calls, function_call],
                    seeded: [],
                    kept: |_: &str| false,
                )
            }
        }
        d.deserialize_map(DeltaFields(self))
    }
}

/// A string, or a list of parts (hand-written: an untagged enum buffers
/// the value before it tries each variant).
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ContentVisitor;
        impl<'de> Visitor<'de> for ContentVisitor {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content::Text(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Content, E> {
                Ok(Content::Text(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(part) = seq.next_element()? {
                    parts.push(part);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(ContentVisitor)
    }
}

/// Reads a chunk whose interpreted fields have unexpected types (an `index`
/// sent as `"0"`, a numeric tool-call `id`, a `content` number, a
/// `tool_calls` object instead of a list): each such field is converted
/// when its meaning is clear, dropped otherwise, and every change is
/// listed. `None` when the value is not an object.
pub(crate) fn coerce_chunk(mut value: Value) -> (Option<ChatChunk>, Vec<String>) {
    let mut notes = Vec::new();
    let Value::Object(top) = &mut value else {
        return (None, notes);
    };
    if let Some(choices) = top.get_mut("choices") {
        match choices {
            Value::Null => {}
            Value::Array(items) => {
                let before = items.len();
                items.retain(Value::is_object);
                if items.len() != before {
                    notes.push("dropped choices that are not objects".into());
                }
                for (i, choice) in items.iter_mut().enumerate() {
                    if let Value::Object(c) = choice {
                        coerce_choice(c, i, &mut notes);
                    }
                }
            }
            Value::Object(_) => {
                notes.push("`choices` was an object; read as a list of one".into());
                let one = choices.take();
                *choices = Value::Array(vec![one]);
                if let Some(Value::Object(c)) = choices.as_array_mut().and_then(|a| a.first_mut()) {
                    coerce_choice(c, 0, &mut notes);
                }
            }
            other => {
                notes.push(format!("dropped `choices` of type {}", kind(other)));
                top.remove("choices");
            }
        }
    }
    match serde_json::from_value::<ChatChunk>(value) {
        Ok(chunk) => (Some(chunk), notes),
        Err(e) => {
            notes.push(format!("still unreadable: {e}"));
            (None, notes)
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// An index as a `u32`, from a number or a string of digits.
fn coerce_index(map: &mut Map<String, Value>, path: &str, notes: &mut Vec<String>) {
    let Some(v) = map.get("index") else { return };
    if v.is_null() || v.as_u64().is_some_and(|n| n <= u64::from(u32::MAX)) {
        return;
    }
    let parsed = v.as_str().and_then(|s| s.trim().parse::<u32>().ok());
    match parsed {
        Some(n) => {
            notes.push(format!("{path}.index was {v}; read as {n}"));
            map.insert("index".into(), Value::from(n));
        }
        None => {
            notes.push(format!("dropped {path}.index {v}"));
            map.remove("index");
        }
    }
}

/// A text field: numbers and booleans become their text, other types are
/// dropped.
fn coerce_text(map: &mut Map<String, Value>, key: &str, path: &str, notes: &mut Vec<String>) {
    let Some(v) = map.get(key) else { return };
    match v {
        Value::Null | Value::String(_) => {}
        Value::Number(_) | Value::Bool(_) => {
            notes.push(format!("{path}.{key} was a {}; read as text", kind(v)));
            let text = v.to_string();
            map.insert(key.into(), Value::String(text));
        }
        other => {
            notes.push(format!("dropped {path}.{key} of type {}", kind(other)));
            map.remove(key);
        }
    }
}

fn coerce_choice(c: &mut Map<String, Value>, i: usize, notes: &mut Vec<String>) {
    let path = format!("choices[{i}]");
    coerce_index(c, &path, notes);
    coerce_text(c, "text", &path, notes);
    if let Some(v) = c.get("finish_reason")
        && !v.is_null()
        && !v.is_string()
    {
        notes.push(format!("{path}.finish_reason was a {}; read as its JSON text", kind(v)));
        let text = v.to_string();
        c.insert("finish_reason".into(), Value::String(text));
    }
    for key in ["delta", "message"] {
        match c.get_mut(key) {
            None | Some(Value::Null) => {}
            Some(Value::Object(d)) => coerce_delta(d, &format!("{path}.{key}"), notes),
            Some(other) => {
                notes.push(format!("dropped {path}.{key} of type {}", kind(other)));
                c.remove(key);
            }
        }
    }
}

fn coerce_delta(d: &mut Map<String, Value>, path: &str, notes: &mut Vec<String>) {
    match d.get("content") {
        None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
        Some(_) => coerce_text(d, "content", path, notes),
    }
    for key in ["reasoning_content", "reasoning", "refusal"] {
        coerce_text(d, key, path, notes);
    }
    if let Some(calls) = d.get_mut("tool_calls") {
        match calls {
            Value::Null => {}
            Value::Array(items) => {
                items.retain(Value::is_object);
                for (i, call) in items.iter_mut().enumerate() {
                    if let Value::Object(call) = call {
                        coerce_call(call, &format!("{path}.tool_calls[{i}]"), notes);
                    }
                }
            }
            Value::Object(_) => {
                notes.push(format!("{path}.tool_calls was an object; read as a list of one"));
                let one = calls.take();
                *calls = Value::Array(vec![one]);
                if let Some(Value::Object(call)) = calls.as_array_mut().and_then(|a| a.first_mut()) {
                    coerce_call(call, &format!("{path}.tool_calls[0]"), notes);
                }
            }
            other => {
                notes.push(format!("dropped {path}.tool_calls of type {}", kind(other)));
                d.remove("tool_calls");
            }
        }
    }
    match d.get_mut("function_call") {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) => coerce_function(f, &format!("{path}.function_call"), notes),
        Some(other) => {
            notes.push(format!("dropped {path}.function_call of type {}", kind(other)));
            d.remove("function_call");
        }
    }
}

fn coerce_call(call: &mut Map<String, Value>, path: &str, notes: &mut Vec<String>) {
    coerce_index(call, path, notes);
    coerce_text(call, "id", path, notes);
    match call.get_mut("function") {
        None | Some(Value::Null) => {}
        Some(Value::Object(f)) => coerce_function(f, &format!("{path}.function"), notes),
        Some(other) => {
            notes.push(format!("dropped {path}.function of type {}", kind(other)));
            call.remove("function");
        }
    }
}

fn coerce_function(f: &mut Map<String, Value>, path: &str, notes: &mut Vec<String>) {
    coerce_text(f, "name", path, notes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_keys_read_into_fields_and_the_rest_into_extra() {
        // An escaped key is not borrowed from the input; it still matches.
        let text = r#"{"\u0069d":"c1","choices":[{"index":0,"delta":{"content":[{"type":"text","text":"a"}],
            "role":"assistant"},"finish_reason":null,"logprobs":null}],"usage":null}"#;
        let chunk: ChatChunk = serde_json::from_str(text).unwrap_or_default();
        assert_eq!(chunk.id(), Some("c1"));
        assert_eq!(chunk.usage, Nullable::Null);
        assert_eq!(chunk.error, Nullable::Absent);
        let choice = &chunk.choice_list()[0];
        assert_eq!(choice.index, Nullable::Value(0));
        assert_eq!(choice.finish_reason, Nullable::Null);
        assert_eq!(choice.extra.get("logprobs"), Some(&Value::Null));
        let delta = choice.delta.as_option().cloned().unwrap_or_default();
        assert!(matches!(delta.content, Nullable::Value(Content::Parts(ref p)) if p.len() == 1));
        assert_eq!(delta.extra.get("role").and_then(Value::as_str), Some("assistant"));
        // The same from a `Value` (owned keys and strings).
        let value: Value = serde_json::from_str(text).unwrap_or_default();
        assert_eq!(serde_json::from_value::<ChatChunk>(value).ok(), Some(chunk));
    }

    #[test]
    fn a_field_twice_or_of_the_wrong_type_is_an_error() {
        let twice = serde_json::from_str::<ChatChunk>(r#"{"usage":null,"usage":{}}"#);
        assert!(twice.is_err_and(|e| e.to_string().contains("duplicate field `usage`")));
        let index = serde_json::from_str::<Choice>(r#"{"index":"0"}"#);
        assert!(index.is_err_and(|e| e.to_string().contains("expected u32")));
        let content = serde_json::from_str::<Delta>(r#"{"content":5}"#);
        assert!(content.is_err_and(|e| e.to_string().contains("a string or a list of content parts")));
        let not_object = serde_json::from_str::<ChatChunk>("[1]");
        assert!(not_object.is_err_and(|e| e.to_string().contains("struct ChatChunk")));
        // An unknown key keeps the last of two values, as a map does.
        let extra = serde_json::from_str::<FunctionDelta>(r#"{"x":1,"x":2}"#).unwrap_or_default();
        assert_eq!(extra.extra.get("x"), Some(&Value::from(2)));
    }

    /// The whole chunk without the other fields, `id` and `model` kept
    /// when `named`.
    fn meaning_of_whole(text: &str, named: bool) -> Option<ChatChunk> {
        let mut chunk: ChatChunk = serde_json::from_str(text).ok()?;
        chunk.extra.retain(|k, _| named && (k == "id" || k == "model"));
        for choice in chunk.choices.as_mut_option().into_iter().flatten() {
            choice.extra.clear();
            for delta in [&mut choice.delta, &mut choice.message] {
                if let Some(d) = delta.as_mut_option() {
                    d.extra.clear();
                }
            }
        }
        Some(chunk)
    }

    #[test]
    fn a_chunk_read_by_meaning_is_the_whole_chunk_without_the_other_fields() {
        let texts = [
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":"fp",
                "choices":[{"index":0,"delta":{"role":"assistant","content":"Hi \"x\""},"logprobs":{"content":[]},
                "finish_reason":null}]}"#,
            r#"{"choices":[{"index":1,"delta":{"reasoning_content":"hm","reasoning":"hm","refusal":null,
                "tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]}},
                {"index":0,"message":{"content":[{"type":"text","text":"a"}]},"text":"legacy",
                "finish_reason":"stop","content_filter_results":{"hate":{"filtered":false}}}],
                "usage":{"total_tokens":3},"error":null,"prompt_filter_results":[]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            r#"{"choices":null}"#,
            r#"{"choices":[{"delta":null,"function_call":{"name":"g"}}]}"#,
            r#"{"choices":[{"delta":{"function_call":{"name":"g","arguments":{"a":1}}}}]} "#,
        ];
        for text in texts {
            for named in [true, false] {
                let whole = meaning_of_whole(text, named);
                assert!(whole.is_some(), "{text}");
                assert_eq!(read_chat_meaning(text, named), whole, "{text}");
            }
        }
    }

    #[test]
    fn what_is_not_a_chat_chunk_is_left_to_the_whole_reading() {
        for text in [
            // Another dialect, no choices at all, not an object.
            r#"{"type":"content_block_delta","delta":{"text":"x"}}"#,
            r#"{"usage":{"total_tokens":3}}"#,
            "[1]",
            // Fields twice or of a wrong type, broken or trailing JSON.
            r#"{"choices":[],"choices":[]}"#,
            r#"{"choices":[{"delta":{},"delta":{}}]}"#,
            r#"{"choices":[{"index":"0"}]}"#,
            r#"{"choices":[null]}"#,
            r#"{"choices":{"index":0}}"#,
            r#"{"choices":[{"delta":"x"}]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[]"#,
            r#"{"choices":[]} x"#,
        ] {
            assert_eq!(read_chat_meaning(text, true), None, "{text}");
        }
    }
}
