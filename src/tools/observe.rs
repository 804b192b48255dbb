//! Results of tool runs ([`ToolResult`], [`ToolAudit`]), their observation
//! texts in the specs' words (spec 004 §3.3, §5.1, §5.5), and the messages
//! that carry observations back to the model in each [`Protocol`].
//!
//! This module owns the wording. The error observations for calls that
//! cannot run (unknown tool, invalid parameters with did-you-mean,
//! malformed block) come from [`crate::calls::CallProblem::observation`]
//! and the success form from [`crate::calls::catalog::observation_success`];
//! this module adds timeout, failure, not-run, cancelled, pending and
//! output-cap texts. It runs nothing and does no I/O.
//!
//! # What goes back to the model, per protocol
//!
//! | protocol | message after an answer with calls |
//! |---|---|
//! | `tam`, `tam-cjk`, `action`, `attp` | one `user` message: the observation lines, one per result, in call order |
//! | `filament` | one `user` message: `<tool_result name="ID" call_id="..." ok="true">Observation: ...</tool_result>` per result |
//! | `hermes` | one `user` message: `<tool_response>\nOBSERVATION\n</tool_response>` per result, one per line (Qwen's chat template) |
//! | `openai` | one `role: "tool"` message per result (`tool_call_id`, `content` = the observation) |

use super::manual::Protocol;
use crate::calls::catalog::observation_success;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How a call or step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Outcome {
    /// It ran and succeeded.
    Success,
    /// It ran and failed (non-zero exit, MCP or service error, missing
    /// program).
    Failed,
    /// It passed its time limit and was stopped.
    Timeout,
    /// It wrote more output than the cap and was stopped; the result holds
    /// the first part.
    OutputCapped,
    /// Its parameters do not fit the tool's schema (or are too large).
    InvalidParams,
    /// No tool has its id.
    UnknownTool,
    /// The call block could not be read.
    Malformed,
    /// It was not run (cut off, a second ACTION block, an earlier step
    /// failed, no way to run it).
    NotRun,
    /// Its caller cancelled it.
    Cancelled,
    /// An async tool: it was started and answered with a task id; the
    /// result follows as a task event.
    Pending,
}

impl Outcome {
    /// The snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::Failed => "failed",
            Outcome::Timeout => "timeout",
            Outcome::OutputCapped => "output_capped",
            Outcome::InvalidParams => "invalid_params",
            Outcome::UnknownTool => "unknown_tool",
            Outcome::Malformed => "malformed",
            Outcome::NotRun => "not_run",
            Outcome::Cancelled => "cancelled",
            Outcome::Pending => "pending",
        }
    }

    /// Whether the outcome counts as success for `on_error` (a pending
    /// async task has started fine).
    pub fn is_ok(self) -> bool {
        matches!(self, Outcome::Success | Outcome::Pending)
    }

    /// Whether a retry may help (not for problems in the call itself).
    pub fn retryable(self) -> bool {
        matches!(self, Outcome::Failed | Outcome::Timeout | Outcome::OutputCapped)
    }
}

/// The result of one step of one call: one `{"type": "tool_result", ...}`
/// line in JSONL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call's id (unique per run: `call_1`, ...).
    pub call_id: String,
    /// The tool (empty when the call named none).
    pub tool_id: String,
    /// The step number as written (`command_2` -> 2), `null` when unnumbered.
    pub step: Option<u64>,
    /// Whether it succeeded (or, for an async tool, started).
    pub ok: bool,
    /// How it ended.
    pub outcome: Outcome,
    /// The text the model reads on its next turn.
    pub observation: String,
    /// The tool's result (JSON when its output parsed as JSON, else a
    /// string); `null` when it did not run.
    pub result: Value,
    /// Wall time of the run, retries included.
    pub duration_ms: u64,
    /// Bytes of output the tool produced (before any cap).
    pub bytes: u64,
    /// How many times it was started (1 + retries used; 0 when not run).
    #[serde(default)]
    pub attempts: u32,
    /// The task id of an async tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Whether the output was cut at the cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The call's `request_id` (TAM, spec 000 §4), when it has one: for
    /// tracing the step back to the request in logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For a call whose `request_id` an earlier call of the run had: that
    /// call's `call_id`. This result is a copy of that call's and ran
    /// nothing (see [`Runner`](super::Runner)'s `request_id` docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_of: Option<String>,
}

impl ToolResult {
    /// A result for a step that did not run.
    pub fn not_run(
        call_id: &str,
        tool_id: &str,
        step: Option<u64>,
        outcome: Outcome,
        observation: String,
    ) -> ToolResult {
        ToolResult {
            call_id: call_id.to_string(),
            tool_id: tool_id.to_string(),
            step,
            ok: false,
            outcome,
            observation,
            result: Value::Null,
            duration_ms: 0,
            bytes: 0,
            attempts: 0,
            task_id: None,
            truncated: false,
            request_id: None,
            repeat_of: None,
        }
    }

    /// The JSONL form: `{"type": "tool_result", ...}` (or `tool_task` for
    /// the completion of an async task).
    pub fn to_event_json(&self, kind: &str) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.shift_insert(0, "type".into(), Value::String(kind.into()));
        }
        v
    }
}

/// The audit record of one tool run (spec 002 §13): one
/// `{"type": "tool_audit", ...}` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolAudit {
    /// The call's id.
    pub call_id: String,
    /// The tool.
    pub tool_id: String,
    /// The step number as written.
    pub step: Option<u64>,
    /// How the tool is implemented (`script`, `mcp`, `service`), or
    /// `none` when it was not run.
    pub implementation: String,
    /// The parameters as passed (after checking and conversion).
    pub params: Value,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall time.
    pub duration_ms: u64,
    /// Bytes of output.
    pub bytes: u64,
    /// Starts (1 + retries used).
    pub attempts: u32,
    /// Unix time of the start, in milliseconds.
    pub started_at_ms: u64,
    /// The call's `request_id` (TAM, spec 000 §4: for log tracing and
    /// idempotency), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ToolAudit {
    /// The JSONL form `{"type": "tool_audit", ...}`.
    pub fn to_event_json(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.shift_insert(0, "type".into(), Value::String("tool_audit".into()));
        }
        v
    }
}

/// Cuts `text` to at most `max` bytes (on a character boundary) and says
/// how much was left out.
pub fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… [{} more bytes cut]", &text[..cut], text.len() - cut)
}

/// A result value as observation text: strings as they are, other JSON
/// compact.
pub fn result_text(result: &Value) -> String {
    match result {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `Observation: Tool ID executed successfully. Result: ...` with the
/// result cut at `max` bytes.
pub fn success(tool_id: &str, result: &Value, max: usize) -> String {
    observation_success(tool_id, &excerpt(&result_text(result), max))
}

/// A failed run: `Observation: Error - Tool ID failed (WHY): DETAIL`.
pub fn failure(tool_id: &str, why: &str, detail: &str) -> String {
    let detail = detail.trim();
    if detail.is_empty() {
        format!("Observation: Error - Tool {tool_id} failed ({why})")
    } else {
        format!("Observation: Error - Tool {tool_id} failed ({why}): {detail}")
    }
}

/// `Observation: Error - Tool ID timed out after N ms and was stopped`.
pub fn timeout(tool_id: &str, ms: u64) -> String {
    format!("Observation: Error - Tool {tool_id} timed out after {ms} ms and was stopped")
}

/// The observation of a run stopped at the output cap.
pub fn output_capped(tool_id: &str, cap: usize, first: &str) -> String {
    format!(
        "Observation: Error - Tool {tool_id} wrote more than {cap} bytes of output and was stopped. Its output began: {first}"
    )
}

/// The observation of a step whose parameter passed by URI could not be
/// resolved (the tool did not run).
pub fn uri_failed(tool_id: &str, param: &str, uri: &str, why: &str) -> String {
    format!(
        "Observation: Error - Tool {tool_id} was not run: its parameter '{param}' ({uri}) could not be resolved: {why}"
    )
}

/// The observation of a step not run again because its call repeats the
/// `request_id` of an earlier call of the run: the earlier call's
/// observation, and a note that it is a repeat.
pub fn repeat(first: &str, request_id: &str, first_call_id: &str) -> String {
    format!(
        "{first} [request_id {request_id:?} was already run, as {first_call_id}: not run again; this is that result]"
    )
}

/// The observation of a cancelled run.
pub fn cancelled(tool_id: &str) -> String {
    format!("Observation: Error - Tool {tool_id} was cancelled before it finished")
}

/// The observation of an async tool's task that was stopped (its process
/// group killed) because the run that started it ended first.
pub fn task_stopped(tool_id: &str, task_id: &str) -> String {
    format!(
        "Observation: Error - Task {task_id} of tool {tool_id} was stopped before it finished: the run that started it ended"
    )
}

/// The observation of an async tool that started.
pub fn pending(tool_id: &str, task_id: &str) -> String {
    format!(
        "Observation: Tool {tool_id} started asynchronously. Task id: {task_id}. Its result will be reported when it completes."
    )
}

/// Why a step was not run, as an observation; `reason` is the
/// `not_runnable` code (`cut_off`, `too_large`, `second_action_block`,
/// `malformed_arguments`) or a code of
/// the runner's (`previous_step_failed`, `invalid_call`, `no_runner`,
/// `attp_code`).
pub fn not_run(tool_id: &str, reason: &str, detail: &str) -> String {
    let why = match reason {
        "cut_off" => "its block was cut off by the end of the output, so its values may be incomplete; write the whole block again".to_string(),
        "second_action_block" => "only the first <ACTION> block of an answer runs (spec 004 §3.2.1); this was a later one".to_string(),
        "too_large" => "its block passed the element size limit, so its values may be incomplete; write a shorter block".to_string(),
        "malformed_arguments" => "its arguments are not a JSON object; write them as one, as in {\"name\": \"tool\", \"arguments\": {\"key\": \"value\"}}".to_string(),
        "previous_step_failed" => format!("{detail}, and on_error for it is stop"),
        "invalid_call" => format!("{detail}, and no step of a call runs unless every step is valid"),
        _ if detail.is_empty() => reason.replace('_', " "),
        _ => detail.to_string(),
    };
    format!("Observation: Error - Tool {tool_id} was not run: {why}")
}

/// The text a `role: "tool"` message becomes in a text protocol (for
/// replaying an OpenAI chat history): content that already is an
/// observation stays as it is; other content becomes the success
/// observation of `name` (the tool the message answers; `tool` when
/// unknown). Filament wraps it in `<tool_result name="...">`; Hermes
/// puts the content as it is in `<tool_response>` (Qwen's template);
/// `openai` keeps the content.
///
/// ```
/// use spindle::tools::{observation_text, Protocol};
/// use serde_json::json;
///
/// let msg = json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"});
/// assert_eq!(
///     observation_text(Protocol::Action, &msg, Some("ReadWeather")),
///     "Observation: Tool ReadWeather executed successfully. Result: sunny"
/// );
/// ```
pub fn observation_text(protocol: Protocol, tool_message: &Value, name: Option<&str>) -> String {
    let content = match tool_message.get("content") {
        Some(Value::String(s)) => s.clone(),
        // Content parts: the text of each text part, joined.
        Some(Value::Array(parts)) => {
            parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("")
        }
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    };
    let name = name.or_else(|| tool_message.get("name").and_then(Value::as_str)).unwrap_or("tool");
    if protocol == Protocol::Openai {
        return content;
    }
    if protocol == Protocol::Hermes {
        // Qwen's template shows a tool message's content as it is.
        return tool_response_element(&content);
    }
    let obs =
        if content.trim_start().starts_with("Observation:") { content } else { observation_success(name, &content) };
    match protocol {
        Protocol::Filament => {
            let id = tool_message.get("tool_call_id").and_then(Value::as_str);
            tool_result_element(name, id, None, &obs)
        }
        _ => obs,
    }
}

fn attr_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;")
}

/// `<tool_response>\nTEXT\n</tool_response>` (Qwen's chat template).
fn tool_response_element(text: &str) -> String {
    format!("<tool_response>\n{text}\n</tool_response>")
}

/// `<tool_result name="ID" call_id="ID" ok="BOOL">TEXT</tool_result>`.
fn tool_result_element(name: &str, call_id: Option<&str>, ok: Option<bool>, text: &str) -> String {
    let mut s = format!("<tool_result name=\"{}\"", attr_escape(name));
    if let Some(id) = call_id {
        s.push_str(&format!(" call_id=\"{}\"", attr_escape(id)));
    }
    if let Some(ok) = ok {
        s.push_str(&format!(" ok=\"{ok}\""));
    }
    format!("{s}>{text}</tool_result>")
}

/// The chat messages that carry `results` back to the model after an
/// answer, in `protocol`'s form (see the module docs). Empty when there
/// are no results.
///
/// ```
/// use spindle::tools::{feedback_messages, Protocol, ToolResult, Outcome};
///
/// let r = ToolResult::not_run("call_1", "Look", None, Outcome::UnknownTool,
///     "Observation: Error - Unknown tool ID 'Look', did you mean 'LookAt'?".into());
/// let msgs = feedback_messages(Protocol::Tam, &[r]);
/// assert_eq!(msgs[0]["role"], "user");
/// assert_eq!(msgs[0]["content"], "Observation: Error - Unknown tool ID 'Look', did you mean 'LookAt'?");
/// ```
pub fn feedback_messages(protocol: Protocol, results: &[ToolResult]) -> Vec<Value> {
    if results.is_empty() {
        return Vec::new();
    }
    match protocol {
        Protocol::Openai => results
            .iter()
            .map(|r| json!({"role": "tool", "tool_call_id": r.call_id, "content": r.observation}))
            .collect(),
        Protocol::Filament => {
            let parts: Vec<String> = results
                .iter()
                .map(|r| tool_result_element(&r.tool_id, Some(&r.call_id), Some(r.ok), &r.observation))
                .collect();
            vec![json!({"role": "user", "content": parts.join("\n")})]
        }
        Protocol::Hermes => {
            let parts: Vec<String> = results.iter().map(|r| tool_response_element(&r.observation)).collect();
            vec![json!({"role": "user", "content": parts.join("\n")})]
        }
        _ => {
            let lines: Vec<&str> = results.iter().map(|r| r.observation.as_str()).collect();
            vec![json!({"role": "user", "content": lines.join("\n")})]
        }
    }
}
