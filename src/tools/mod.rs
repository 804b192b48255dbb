//! The tool runtime: manuals from the catalog, running tools, observations
//! and the agent loop (specs 000 §3-4, 002 §1.2, §4, §6-7, §10-13, 004
//! §3.3, §4.2, §5; DESIGN §11).
//!
//! This layer sits on top of [`crate::calls`]: a [`ToolCall`] (any
//! notation) goes in, one [`ToolResult`] per step comes out, with the
//! observation text the model reads next. It owns the manual texts
//! ([`manual`](mod@manual)), the wording of observations ([`observe`]),
//! processes and MCP servers ([`runner`]) and the loop ([`agent`]). It
//! must not change how calls are read (that is [`crate::calls`]') nor
//! how streams are parsed.
//!
//! | you want | use |
//! |---|---|
//! | the tool manual for a prompt | [`manual()`], [`fill_placeholders`], [`place_manual`] |
//! | a request's OpenAI `tools` as a manual | [`manual_for_openai_tools`] |
//! | a chat history's `tool_calls` / `role: "tool"` messages as text | [`call_text`], [`observation_text`] |
//! | run the calls of a response | [`Runner::scope`], then [`RunScope::run_call`] (one scope per run: it owns the async tasks its calls start) |
//! | run a whole tool conversation against a model | [`agent::Agent`] |
//!
//! [`ToolCall`]: crate::calls::ToolCall

pub mod agent;
pub mod collect;
pub mod manual;
pub mod observe;
pub mod runner;

pub use manual::{
    ManualPlace, Protocol, call_text, fill_placeholders, manual, manual_for_openai_tools, openai_tools, place_manual,
};
pub use observe::{Outcome, ToolAudit, ToolResult, feedback_messages, observation_text};
pub use runner::{EventSink, McpPool, RunScope, Runner, RunnerOptions, ToolConfig, ToolEvent, UriResolver};
