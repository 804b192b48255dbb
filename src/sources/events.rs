//! Source events (DESIGN §8): the parser's events of each choice, tagged
//! with the choice and the channel they came from, plus the stream-level
//! events of a chat completion (finish, usage, errors, truncation).
//!
//! This module owns the shapes and their JSON form (one object per line,
//! beside the parser's own events); which events a stream produces is
//! [`super::model`]'s business.

use crate::event::{Diagnostic, Event};
use serde::{Serialize, Serializer};
use serde_json::Value;

/// Which part of a choice an event's text came from. Element ids are unique
/// within a choice across channels; offsets (`at`, `span`) count bytes of
/// the event's own channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Channel {
    /// `delta.content` (or `message.content`, or legacy `text`), parsed by
    /// the Filament machine.
    Content,
    /// `reasoning_content` / `reasoning` / thinking parts: one `thought`
    /// element per run.
    Reasoning,
    /// `refusal`: one `refusal` element per run.
    Refusal,
    /// Native `tool_calls` (and legacy `function_call`): one `tool_call`
    /// element per call.
    ToolCalls,
}

impl Channel {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Content => "content",
            Channel::Reasoning => "reasoning",
            Channel::Refusal => "refusal",
            Channel::ToolCalls => "tool_calls",
        }
    }
}

/// Why a choice ended. Unknown strings are kept as they came.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FinishReason {
    /// `stop`: the model ended its answer (or hit a stop sequence).
    Stop,
    /// `length`: the token limit cut the answer.
    Length,
    /// `tool_calls`: the model asks for tools.
    ToolCalls,
    /// `content_filter`: a filter removed content.
    ContentFilter,
    /// `function_call`: legacy function calling.
    FunctionCall,
    /// Any other string (`pause_turn`, `error`, `eos`, ...).
    Other(String),
}

impl FinishReason {
    /// Reads a `finish_reason` string, or another API's word for the same
    /// reason, so that a cut-off answer reads as [`FinishReason::Length`]
    /// whichever API sent it:
    ///
    /// | reason | also read from |
    /// | --- | --- |
    /// | `stop` | `end_turn`, `stop_sequence` (Anthropic Messages, Bedrock Converse), `completed` (a Responses API status), `STOP` (Gemini) |
    /// | `length` | `max_tokens` (Anthropic, Bedrock), `max_output_tokens` (Responses), `model_context_window_exceeded` (Anthropic, Bedrock), `MAX_TOKENS` (Gemini) |
    /// | `tool_calls` | `tool_use` (Anthropic, Bedrock), `tool-calls` (Vercel AI SDK) |
    /// | `content_filter` | `refusal` (Anthropic), `content_filtered`, `guardrail_intervened` (Bedrock), `content-filter` (Vercel AI SDK), `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`, `IMAGE_SAFETY` (Gemini) |
    ///
    /// ```
    /// use spindle::sources::FinishReason;
    /// assert_eq!(FinishReason::parse("max_tokens"), FinishReason::Length);
    /// assert_eq!(FinishReason::parse("eos").as_str(), "eos");
    /// ```
    pub fn parse(text: &str) -> FinishReason {
        match text {
            "stop" | "end_turn" | "stop_sequence" | "completed" | "STOP" => FinishReason::Stop,
            "length" | "max_tokens" | "max_output_tokens" | "model_context_window_exceeded" | "MAX_TOKENS" => {
                FinishReason::Length
            }
            "tool_calls" | "tool_use" | "tool-calls" => FinishReason::ToolCalls,
            "content_filter"
            | "content-filter"
            | "refusal"
            | "content_filtered"
            | "guardrail_intervened"
            | "SAFETY"
            | "RECITATION"
            | "BLOCKLIST"
            | "PROHIBITED_CONTENT"
            | "SPII"
            | "IMAGE_SAFETY" => FinishReason::ContentFilter,
            "function_call" => FinishReason::FunctionCall,
            other => FinishReason::Other(other.to_string()),
        }
    }

    /// The string as it goes on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::FunctionCall => "function_call",
            FinishReason::Other(s) => s,
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Why a stream is considered cut off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Truncation {
    /// The SSE stream ended without `data: [DONE]`.
    NoDone,
    /// The stream ended inside a JSON chunk.
    MidJson,
    /// A transcript without `[DONE]` framing ended before this choice had a
    /// `finish_reason`.
    NoFinishReason,
    /// Reading the body failed (connection reset, idle timeout).
    Transport,
}

impl Truncation {
    /// The `why` string used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Truncation::NoDone => "no [DONE]",
            Truncation::MidJson => "mid-json",
            Truncation::NoFinishReason => "no finish_reason",
            Truncation::Transport => "transport",
        }
    }
}

impl Serialize for Truncation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Where a `stream_error` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorOrigin {
    /// A chunk carrying an `error` object.
    InBand,
    /// An SSE event of type `error`.
    ErrorEvent,
    /// Reading the body failed.
    Transport,
}

/// A parser event of one choice.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChoiceEvent {
    /// The event (ids renumbered to be unique within the choice).
    #[serde(flatten)]
    pub event: Event,
    /// The choice index.
    pub choice: u32,
    /// The channel the event's text came from.
    pub channel: Channel,
}

/// One event of a chat-completion source.
///
/// In JSON, [`SourceEvent::Choice`] is the parser's event with `choice` and
/// `channel` added (`{"type":"delta","id":0,"tag":"content","text":"Hi",
/// "choice":0,"channel":"content"}`); the other variants are
/// `{"type":"finish","choice":0,"reason":"stop"}`, `{"type":"usage",
/// "usage":{...}}`, `{"type":"stream_error","origin":"in_band","error":
/// {...}}`, `{"type":"truncated","choice":0,"why":"no [DONE]"}`,
/// `{"type":"content_filter","choice":0,"results":{...}}`,
/// `{"type":"done"}` and stream-level `{"type":"diagnostic",...}` (no
/// `choice`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SourceEvent {
    /// A choice ended with a `finish_reason`.
    Finish {
        /// The choice.
        choice: u32,
        /// Why.
        reason: FinishReason,
    },
    /// Token usage (emitted when it first appears and whenever it changes).
    Usage {
        /// The usage object as the server sent it.
        usage: Value,
    },
    /// An error reported inside the stream, or reading it failed.
    StreamError {
        /// The choice, when the error names one.
        #[serde(skip_serializing_if = "Option::is_none")]
        choice: Option<u32>,
        /// Where it came from.
        origin: ErrorOrigin,
        /// The error object (`{"message":...}` at least).
        error: Value,
    },
    /// The stream (or this choice) was cut off.
    Truncated {
        /// The choice, or none when no choice was ever seen.
        #[serde(skip_serializing_if = "Option::is_none")]
        choice: Option<u32>,
        /// Why it counts as cut.
        why: Truncation,
    },
    /// A content filter flagged something (Azure `prompt_filter_results` /
    /// `content_filter_results` with `filtered` or `detected` true).
    ContentFilter {
        /// The choice, or none for the prompt.
        #[serde(skip_serializing_if = "Option::is_none")]
        choice: Option<u32>,
        /// The filter results as sent.
        results: Value,
    },
    /// `data: [DONE]` arrived.
    Done,
    /// A problem with the stream itself (framing, invalid JSON, unknown
    /// chunk shapes, limits); it carries no `choice`.
    Diagnostic(Diagnostic),
    /// An event of one choice's parse (listed last: serde wants untagged
    /// variants at the end).
    #[serde(untagged)]
    Choice(ChoiceEvent),
}

impl SourceEvent {
    /// The event's `type` in JSON.
    pub fn type_name(&self) -> &'static str {
        match self {
            SourceEvent::Choice(c) => c.event.type_name(),
            SourceEvent::Finish { .. } => "finish",
            SourceEvent::Usage { .. } => "usage",
            SourceEvent::StreamError { .. } => "stream_error",
            SourceEvent::Truncated { .. } => "truncated",
            SourceEvent::ContentFilter { .. } => "content_filter",
            SourceEvent::Done => "done",
            SourceEvent::Diagnostic(_) => "diagnostic",
        }
    }

    /// The choice the event belongs to, if any.
    pub fn choice(&self) -> Option<u32> {
        match self {
            SourceEvent::Choice(c) => Some(c.choice),
            SourceEvent::Finish { choice, .. } => Some(*choice),
            SourceEvent::StreamError { choice, .. }
            | SourceEvent::Truncated { choice, .. }
            | SourceEvent::ContentFilter { choice, .. } => *choice,
            SourceEvent::Usage { .. } | SourceEvent::Done | SourceEvent::Diagnostic(_) => None,
        }
    }

    /// Appends the event's JSON (no newline) to `out`: exactly what
    /// `serde_json::to_writer(out, self)` writes. A choice's parser event
    /// (nearly every event) is written by [`Event::write_json`], with its
    /// `choice` and `channel` after it; the rest go through serde.
    ///
    /// [`Event::write_json`]: crate::Event::write_json
    pub fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            SourceEvent::Choice(c) => {
                c.event.write_json(out);
                // The event's object, reopened for the two fields serde's
                // `flatten` puts after its own.
                if out.last() == Some(&b'}') {
                    out.pop();
                    out.extend_from_slice(b",\"choice\":");
                    crate::jsonl::write_u64(out, u64::from(c.choice));
                    out.extend_from_slice(b",\"channel\":\"");
                    out.extend_from_slice(c.channel.as_str().as_bytes());
                    out.extend_from_slice(b"\"}");
                }
            }
            other => crate::jsonl::write_serde(out, other),
        }
    }

    /// The parser event, for [`SourceEvent::Choice`].
    pub fn as_choice_event(&self) -> Option<&ChoiceEvent> {
        match self {
            SourceEvent::Choice(c) => Some(c),
            _ => None,
        }
    }

    /// The completed element, when this is a choice's `element` event.
    pub fn as_element(&self) -> Option<&crate::event::Element> {
        self.as_choice_event().and_then(|c| c.event.as_element())
    }
}
