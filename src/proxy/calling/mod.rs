//! Native tool calling in front of a text-protocol model
//! (`spindle proxy --tool-protocol hermes|filament|tam|action`).
//!
//! This module owns the translation between the OpenAI tool-calling API
//! and the call text a model writes: the request side (`request`: the
//! request's `tools` become the protocol's manual in the system message,
//! the history's `tool_calls` and `role: "tool"` messages become call and
//! observation text) and the response side (`response`: call elements
//! the parser reads become `tool_calls` deltas, the content loses their
//! text, `finish_reason` becomes `tool_calls`), for the legacy
//! `functions`/`function_call` API too (`CallShape`). The renderings themselves
//! (manual, call text, observation text) are [`crate::tools`]'; the
//! reading of calls is [`crate::calls`]' and the parser's. It must not
//! touch sockets (that is the server's and the pump's).
//!
//! # Behaviour, by case
//!
//! | the request | upstream gets | client gets |
//! |---|---|---|
//! | no `tools`, no tool messages | the body unchanged | the response unchanged (pass-through) |
//! | `tools`, `tool_choice` absent or `"auto"` | the manual in the system message; no `tools`/`tool_choice`/`parallel_tool_calls` | calls as `tool_calls`, content without call text, `finish_reason: "tool_calls"` |
//! | `tool_choice: "required"` | the manual and "You must call at least one of these tools" | as `auto` (an answer with no call stays an answer: nothing can force the model) |
//! | `tool_choice` naming a tool | only that tool's manual and "You must call the tool X" | as `auto`; a call of another tool is an invalid call |
//! | `tool_choice: "none"` | no manual, `tools` removed | the response as the model wrote it (any call text stays text) |
//! | `tools` that are not function tools, a schema that does not compile, a name given twice, `tool_choice` naming an unknown tool | nothing | `400` `invalid_tools` with `param` |
//! | legacy `functions` (and `function_call`: `"auto"`, `"none"`, `{"name": ...}`) | as `tools` (each function a function tool) and `tool_choice`, and "Call at most one tool per answer"; no `functions`/`function_call` | the first call as `message.function_call` / `delta.function_call` (name, then argument fragments; no id), a later one's not-run observation in the content, `finish_reason: "function_call"` |
//! | both `tools` and `functions` | nothing | `400` `invalid_tools` with `param: "functions"` |
//! | a body with a UTF-8 byte order mark; `Content-Encoding: gzip` or `deflate` (decoded by the server) | translated, without the mark; plain, no `Content-Encoding` | as any other |
//! | another `Content-Encoding` (`br`, `zstd`, several) | nothing | `415` `unsupported_request_encoding` |
//! | assistant `tool_calls` (or legacy `function_call`) / `role: "tool"` (or `"function"`) in the history | call text / observation text (consecutive tool messages in one `user` message, which is also the user message next to them, observations first before a user's text and after it when the user message comes first, a blank line between: no two user turns in a row); a tool message is paired with the first unanswered call of its `tool_call_id` (two calls with one id answer in order) | |
//!
//! Response side, per call:
//!
//! | the call | `--invalid-calls pass` (default) | `--invalid-calls drop` |
//! |---|---|---|
//! | Hermes/Filament `<tool_call>` | streamed: name as soon as it is complete, then argument fragments | sent whole when complete and checked |
//! | several calls in one `<tool_call>` (one JSON object after another, or a list) | the first streamed, the others sent when the element ends | each sent whole and checked |
//! | Qwen3-Coder's `<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>`, GLM's `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>` | sent whole when its element ends, the parameters typed by the schema (`"2"` becomes `2` for an integer) | the same, after the check |
//! | TAM / ACTION block | one tool call per step at the end of the block (arguments converted to the schema's types) | the same, after the check |
//! | name not in `tools`, arguments failing the schema | sent as written | left out; its did-you-mean observation in the content |
//! | a call the parser cannot read (no name, arguments that never become JSON) | its `Malformed` observation in the content (pass: after what was already streamed of it) | the same, nothing of it sent |
//! | arguments only the lenient reader accepts (`{'a': True}`) | streaming stops at the first such byte (`call_arguments_streamed_differ` goes to the sinks) | sent whole, as read leniently |
//! | a TAM/ACTION step that must not run (block cut off by the end of output or at the element size limit, a second ACTION block) | not sent; its not-run observation in the content | the same |
//! | a Hermes call cut off by `max_tokens`, or never closed with its JSON unfinished (the model stopped inside it) | what was streamed stays; `finish_reason` stays `length` | left out with the cut-off observation |
//! | a call inside an open Markdown code block (an example) | text in the content, not a call | the same |
//! | a `<tool_call>` whose body is prose (no name attribute; the body, not empty, does not begin with `{`, `[` or a code fence): `Wrap each call in <tool_call> and </tool_call> tags` | text in the content as written (open tag, body, the close tag that ended it), not a call nor an observation | the same |
//!
//! An observation takes the place of its call in the content, on a line
//! of its own: the same however the upstream split the text into deltas,
//! and the same in a whole (non-streamed) response. The parser marks where
//! each call it left out of the corrected text was, and the relay inserts
//! the observation there (`crate::proxy::selfcheck` holds the proxy to
//! this, fuzzed by `fuzz/fuzz_targets/calling.rs`).
//!
//! Ids are `call_` and 16 hex digits of a hash of the response id, the
//! choice and the call's index: stable for a response, unique across
//! responses.

pub(crate) mod request;
pub(crate) mod response;

use crate::registry::{BodyKind, Registry};
use crate::tools::Protocol;

/// What happens to a call the request's `tools` do not allow (`pass` or
/// `drop` in a configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InvalidCalls {
    /// It is sent as the model wrote it (and streamed as it arrives).
    #[default]
    Pass,
    /// It is left out and its observation (unknown tool with a
    /// did-you-mean, invalid parameters) becomes content; every call is
    /// then sent whole, once it is complete and checked.
    Drop,
}

/// The tool-calling configuration of a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolCalling {
    /// The text protocol the model is told to use (`hermes`, `filament`,
    /// `tam`, `action`).
    pub protocol: Protocol,
    /// What happens to invalid calls.
    pub invalid_calls: InvalidCalls,
}

/// Which of OpenAI's two tool-calling APIs a request used, and so the
/// shape its response's calls take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum CallShape {
    /// `tools` and `tool_choice`: calls as `tool_calls` (with ids), the
    /// finish reason `tool_calls`.
    #[default]
    ToolCalls,
    /// The legacy `functions` and `function_call`: one call per answer, as
    /// `function_call` (no id), the finish reason `function_call`.
    FunctionCall,
}

impl CallShape {
    /// The request field that lists the tools.
    pub(crate) fn tools_param(self) -> &'static str {
        match self {
            CallShape::ToolCalls => "tools",
            CallShape::FunctionCall => "functions",
        }
    }

    /// The request field that says what to call.
    pub(crate) fn choice_param(self) -> &'static str {
        match self {
            CallShape::ToolCalls => "tool_choice",
            CallShape::FunctionCall => "function_call",
        }
    }

    /// The finish reason of a choice that made calls.
    pub(crate) fn finish_reason(self) -> &'static str {
        match self {
            CallShape::ToolCalls => "tool_calls",
            CallShape::FunctionCall => "function_call",
        }
    }

    /// How many calls one choice may make.
    pub(crate) fn max_calls(self) -> u32 {
        match self {
            CallShape::ToolCalls => u32::MAX,
            CallShape::FunctionCall => 1,
        }
    }
}

/// The protocols the proxy can translate.
pub const TOOL_PROTOCOLS: [Protocol; 4] = [Protocol::Hermes, Protocol::Filament, Protocol::Tam, Protocol::Action];

impl ToolCalling {
    /// Tool calling in `protocol`, invalid calls passed.
    pub fn new(protocol: Protocol) -> ToolCalling {
        ToolCalling { protocol, invalid_calls: InvalidCalls::Pass }
    }

    /// The built-in profile that reads this protocol's calls when the user
    /// chose none: `chat` for Hermes and Filament `<tool_call>` (plain
    /// answers, `<think>` blocks), `tam`, `action`.
    pub fn default_profile(&self) -> &'static str {
        match self.protocol {
            Protocol::Tam | Protocol::TamCjk => "tam",
            Protocol::Action => "action",
            _ => "chat",
        }
    }

    /// Checks that the proxy can translate the protocol and that
    /// `registry` reads its calls.
    ///
    /// # Errors
    ///
    /// A sentence saying what is missing.
    pub fn check(&self, registry: &Registry) -> Result<(), String> {
        if !TOOL_PROTOCOLS.contains(&self.protocol) {
            return Err(format!(
                "--tool-protocol {} is not supported by the proxy (hermes, filament, tam, action)",
                self.protocol
            ));
        }
        let has = |f: &dyn Fn(&crate::registry::TagSpec) -> bool| registry.tags().iter().any(f);
        let ok = match self.protocol {
            Protocol::Tam | Protocol::TamCjk => has(&|t| t.body == BodyKind::Tam),
            Protocol::Action => has(&|t| t.body == BodyKind::Action),
            _ => has(&|t| t.name == "tool_call"),
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "the registry does not read {} calls; use a profile that does (for example {})",
                self.protocol,
                self.default_profile()
            ))
        }
    }
}

/// FNV-1a: a tiny stable hash for call ids (ids must not change with the
/// Rust version, which rules out `DefaultHasher`; no crate is worth it for
/// eight lines).
pub(crate) fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in *part {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}
