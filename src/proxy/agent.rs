//! The agent loop behind the proxy (`spindle proxy --tool-protocol P
//! --tools DIR --agent`): a plain chat request comes in, the proxy runs
//! the tool runtime's loop ([`crate::tools::agent::Agent`]) against the
//! upstream with the tools it owns, and the client gets the final answer
//! of the whole tool conversation through that one request.
//!
//! This module owns the translation of the loop's events into an OpenAI
//! chat-completions response (streamed chunks or one whole object). It
//! must not run tools or talk to the upstream itself (the loop does), and
//! it must not touch sockets (the server hands it the request and sends
//! what it returns).
//!
//! What the client sees is documented on [`ProxyAgent`].

use super::error::{ProxyError, ProxyErrorKind};
use crate::event::Event;
use crate::sources::{Channel, SourceEvent};
use crate::tools::Runner;
use crate::tools::agent::{AgentEvent, AgentLimits, AsyncTasks, StopReason};
use serde_json::{Map, Value, json};
use std::sync::Arc;

/// The tools and limits of a proxy that runs the agent loop itself.
///
/// # Which requests
///
/// A chat-completions request **without** `tools` of its own is run by the
/// loop. A request that brings its own `tools` wants to run them itself:
/// it goes through the ordinary tool-calling translation (its calls come
/// back as `tool_calls`), and the proxy's tools are not offered.
///
/// # What the client sees
///
/// Every answer's content and reasoning, turn after turn, with the call
/// text left out: content as `delta.content` (turns joined by a blank
/// line), thoughts as `delta.reasoning_content`. The intermediate calls
/// and observations travel in an extension field, `spindle`, that the
/// official clients keep and ignore (the `openai` Python client exposes it
/// as `chunk.model_extra["spindle"]`):
///
/// | event | streamed chunk | whole response |
/// |---|---|---|
/// | a call block completed and started | `{"choices":[{"index":0,"delta":{}}], "spindle":{"type":"tool_call","turn":1,"id":"t1_call_1","call":{…}}}` | an entry of `spindle.steps` |
/// | a tool's result | `"spindle":{"type":"tool_result","turn":1,"call_id":…,"tool_id":…,"ok":…,"observation":…,…}` | an entry of `spindle.steps` |
/// | the loop ended | last chunk: `finish_reason`, and `"spindle":{"type":"agent_end","reason":"answer","turns":2,"detail":null}` | `finish_reason` and `spindle.reason`, `spindle.turns`, `spindle.detail` |
///
/// `finish_reason` is the last answer's own (`stop`, `length`) when the
/// loop ended with an answer, and `length` when a budget of the loop
/// (turns, tool calls, time, answer size, a failing call repeated) ended
/// it. `usage` adds up every turn's usage; it is sent as OpenAI does
/// (a last chunk with no choices) when the request asks for it with
/// `stream_options.include_usage`, and is always in a whole response.
///
/// An upstream that fails before anything reached the client gets a
/// `502` `agent_upstream_failed`; one that fails later ends the stream
/// with an `error` object (`{"error":{"code":"agent_upstream_failed",…}}`)
/// and `[DONE]`. A client that goes away cancels the loop: the upstream
/// request is dropped and running tools are killed.
///
/// # Async tools
///
/// The [`Runner`] is shared by every request (its MCP servers start once),
/// but each request's loop runs its calls in a
/// [`RunScope`](crate::tools::RunScope) of its own: the tasks of async
/// tools it starts are numbered for it alone (`task_1`, ...), their results
/// come back to that request only, and the tasks still running when its
/// loop ends (an answer, a limit, an error, the client gone) are killed
/// with their process groups, so no tool runs past its request (nor past
/// `--max-streams` or `--agent-max-time`). Each stopped task is a
/// `tool_result` step with `"outcome": "cancelled"` and its `task_id`, and
/// `agent_end`'s `detail` says `N async task(s) still running were
/// stopped`. With `--agent-async-tasks wait` ([`AsyncTasks::Wait`]) the
/// loop waits for a turn's tasks before it asks the model again, so a
/// final answer leaves none behind.
#[derive(Debug, Clone)]
pub struct ProxyAgent {
    /// The tools the proxy owns (plugin folders, MCP servers) and how they
    /// run.
    pub runner: Arc<Runner>,
    /// The loop's limits, per request.
    pub limits: AgentLimits,
    /// What the loop does with async tools' tasks (`--agent-async-tasks`).
    pub tasks: AsyncTasks,
}

impl ProxyAgent {
    /// An agent over `runner` with the default limits, going on while
    /// async tasks run ([`AsyncTasks::Continue`]).
    pub fn new(runner: Arc<Runner>) -> ProxyAgent {
        ProxyAgent { runner, limits: AgentLimits::default(), tasks: AsyncTasks::default() }
    }

    /// Uses these limits.
    pub fn with_limits(mut self, limits: AgentLimits) -> ProxyAgent {
        self.limits = limits;
        self
    }

    /// Waits for async tasks before a turn's observations go back, or goes
    /// on (see [`AsyncTasks`]).
    pub fn with_async_tasks(mut self, tasks: AsyncTasks) -> ProxyAgent {
        self.tasks = tasks;
        self
    }
}

/// Whether the loop runs this chat request: a JSON object with
/// `messages` and no `tools` (nor legacy `functions`) of its own.
pub(crate) fn runs(request: &Value) -> bool {
    let listed = |key| request.get(key).and_then(Value::as_array).is_some_and(|t| !t.is_empty());
    let has_tools = listed("tools") || listed("functions");
    request.get("messages").is_some_and(Value::is_array) && !has_tools
}

/// Turns the loop's events into chat-completions output.
#[derive(Debug)]
pub(crate) struct Translator {
    id: String,
    created: u64,
    model: String,
    /// The current turn, and whether it has sent content yet.
    turn: usize,
    turn_content: bool,
    /// Trailing whitespace of the turn's text, not sent yet.
    held_space: String,
    /// Whether any content was sent (a later turn's starts after a blank
    /// line).
    any_content: bool,
    content: String,
    reasoning: String,
    steps: Vec<Value>,
    /// The last usage object of the current turn; the sum of the others.
    turn_usage: Option<Value>,
    usage: Map<String, Value>,
    /// The last `finish_reason` the upstream sent.
    finish: Option<String>,
    /// The loop's end: reason and detail, once known.
    end: Option<(StopReason, usize, Option<String>)>,
}

impl Translator {
    /// A translator for one response to `model`; `seq` makes the id unique.
    pub(crate) fn new(model: &str, seq: u64) -> Translator {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Translator {
            id: format!("chatcmpl-spindle-agent-{created:x}-{seq}"),
            created,
            model: model.to_string(),
            turn: 0,
            turn_content: false,
            held_space: String::new(),
            any_content: false,
            content: String::new(),
            reasoning: String::new(),
            steps: Vec::new(),
            turn_usage: None,
            usage: Map::new(),
            finish: None,
            end: None,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>, extension: Option<Value>) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let (Some(ext), Value::Object(m)) = (extension, &mut c) {
            m.insert("spindle".into(), ext);
        }
        c
    }

    /// The first chunk: the assistant role.
    pub(crate) fn opening(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), None, None)
    }

    fn add_usage(&mut self) {
        if let Some(Value::Object(u)) = self.turn_usage.take() {
            for (k, v) in u {
                if let Some(n) = v.as_u64() {
                    let sum = self.usage.get(&k).and_then(Value::as_u64).unwrap_or(0) + n;
                    self.usage.insert(k, json!(sum));
                }
            }
        }
    }

    /// The chunks one event of the loop makes (often none).
    pub(crate) fn on(&mut self, event: AgentEvent) -> Vec<Value> {
        match event {
            AgentEvent::TurnStart { turn, .. } => {
                self.add_usage();
                self.turn = turn;
                self.turn_content = false;
                self.held_space.clear();
                self.finish = None;
                Vec::new()
            }
            AgentEvent::Source { event, .. } => self.source(event),
            AgentEvent::CallStarted { turn, call_id, call, .. } => {
                let step = json!({"type": "tool_call", "turn": turn, "id": call_id, "call": call.to_value()});
                self.steps.push(step.clone());
                vec![self.chunk(json!({}), None, Some(step))]
            }
            AgentEvent::ToolResult { turn, result, .. } => {
                let mut step = result.to_event_json("tool_result");
                if let Value::Object(m) = &mut step {
                    m.shift_insert(1, "turn".into(), json!(turn));
                }
                self.steps.push(step.clone());
                vec![self.chunk(json!({}), None, Some(step))]
            }
            AgentEvent::TurnEnd { .. } => Vec::new(),
            AgentEvent::End { reason, turns, detail, .. } => {
                self.add_usage();
                self.end = Some((reason, turns, detail));
                Vec::new()
            }
        }
    }

    fn source(&mut self, event: SourceEvent) -> Vec<Value> {
        match event {
            SourceEvent::Choice(c) if c.choice == 0 => match c.event {
                Event::Delta(d) if c.channel == Channel::Reasoning || &*d.tag == "thought" => {
                    if d.text.is_empty() {
                        return Vec::new();
                    }
                    self.reasoning.push_str(&d.text);
                    vec![self.chunk(json!({"reasoning_content": d.text}), None, None)]
                }
                Event::Delta(d) if &*d.tag == "content" => {
                    // Whitespace at the end of a turn's text (before its
                    // call) is held until more text follows, so turns join
                    // with exactly one blank line.
                    let text = if self.turn_content { d.text.as_str() } else { d.text.trim_start() };
                    let body = text.trim_end();
                    if body.is_empty() {
                        self.held_space.push_str(text);
                        return Vec::new();
                    }
                    let lead = match (self.turn_content, self.any_content) {
                        (true, _) => std::mem::take(&mut self.held_space),
                        (false, true) => "\n\n".to_string(),
                        (false, false) => String::new(),
                    };
                    let out = format!("{lead}{body}");
                    self.held_space = text[body.len()..].to_string();
                    self.turn_content = true;
                    self.any_content = true;
                    self.content.push_str(&out);
                    vec![self.chunk(json!({"content": out}), None, None)]
                }
                _ => Vec::new(),
            },
            SourceEvent::Finish { choice: 0, reason } => {
                self.finish = Some(reason.as_str().to_string());
                Vec::new()
            }
            SourceEvent::Usage { usage } => {
                self.turn_usage = Some(usage);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    /// The `finish_reason` of the whole response.
    fn finish_reason(&self) -> &str {
        match &self.end {
            Some((StopReason::Answer, ..)) => match self.finish.as_deref() {
                Some("length") => "length",
                Some("content_filter") => "content_filter",
                _ => "stop",
            },
            _ => "length",
        }
    }

    fn end_json(&self) -> Value {
        match &self.end {
            Some((reason, turns, detail)) => {
                json!({"type": "agent_end", "reason": reason, "turns": turns, "detail": detail})
            }
            None => json!({"type": "agent_end", "reason": "cancelled", "turns": self.turn, "detail": null}),
        }
    }

    /// Whether the loop failed at the upstream; with the detail.
    pub(crate) fn upstream_failure(&self) -> Option<ProxyError> {
        match &self.end {
            Some((StopReason::Upstream, _, detail)) => Some(ProxyError::new(
                ProxyErrorKind::Agent,
                detail.clone().unwrap_or_else(|| "the upstream failed".to_string()),
            )),
            _ => None,
        }
    }

    /// The last chunks of a stream: the finish (or the error of an
    /// upstream that failed mid-way) and, when asked for, the usage.
    pub(crate) fn closing(&self, include_usage: bool) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(err) = self.upstream_failure() {
            let mut e = err.to_json();
            if let Value::Object(m) = &mut e {
                m.insert("spindle".into(), self.end_json());
            }
            out.push(e);
            return out;
        }
        out.push(self.chunk(json!({}), Some(self.finish_reason()), Some(self.end_json())));
        if include_usage {
            out.push(json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": Value::Object(self.usage.clone()),
            }));
        }
        out
    }

    /// The whole (non-streamed) response.
    pub(crate) fn whole(&self) -> Value {
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.reasoning.is_empty()
            && let Value::Object(m) = &mut message
        {
            m.insert("reasoning_content".into(), json!(self.reasoning));
        }
        let mut spindle = self.end_json();
        if let Value::Object(m) = &mut spindle {
            m.remove("type");
            m.insert("steps".into(), Value::Array(self.steps.clone()));
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason()}],
            "usage": Value::Object(self.usage.clone()),
            "spindle": spindle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Delta;
    use crate::sources::ChoiceEvent;

    fn delta(tag: &str, text: &str) -> AgentEvent {
        AgentEvent::Source {
            turn: 1,
            event: SourceEvent::Choice(ChoiceEvent {
                event: Event::Delta(Delta { id: 0, tag: tag.into(), text: text.into() }),
                choice: 0,
                channel: Channel::Content,
            }),
        }
    }

    #[test]
    fn turns_join_with_a_blank_line_and_usage_adds_up() {
        let mut t = Translator::new("m", 1);
        t.on(AgentEvent::TurnStart { turn: 1, messages: 2 });
        assert_eq!(t.on(delta("content", "Let me look. "))[0]["choices"][0]["delta"]["content"], "Let me look.");
        assert!(t.on(delta("content", "\n")).is_empty());
        t.on(AgentEvent::Source { turn: 1, event: SourceEvent::Usage { usage: json!({"total_tokens": 5}) } });
        t.on(AgentEvent::TurnStart { turn: 2, messages: 4 });
        assert_eq!(t.on(delta("content", " Sunny."))[0]["choices"][0]["delta"]["content"], "\n\nSunny.");
        assert!(t.on(delta("tool_call", "{}")).is_empty());
        t.on(AgentEvent::Source { turn: 2, event: SourceEvent::Usage { usage: json!({"total_tokens": 7}) } });
        t.on(AgentEvent::End {
            reason: StopReason::Answer,
            text: String::new(),
            turns: 2,
            detail: None,
            messages: Vec::new(),
        });
        let whole = t.whole();
        assert_eq!(whole["choices"][0]["message"]["content"], "Let me look.\n\nSunny.");
        assert_eq!(whole["usage"]["total_tokens"], 12);
        assert_eq!(whole["choices"][0]["finish_reason"], "stop");
        assert_eq!(whole["spindle"]["reason"], "answer");
        let closing = t.closing(true);
        assert_eq!(closing[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(closing[1]["usage"]["total_tokens"], 12);
    }

    #[test]
    fn a_budget_ends_with_length_and_an_upstream_failure_is_an_error() {
        let mut t = Translator::new("m", 2);
        t.on(AgentEvent::End {
            reason: StopReason::MaxSteps,
            text: String::new(),
            turns: 8,
            detail: None,
            messages: Vec::new(),
        });
        assert_eq!(t.whole()["choices"][0]["finish_reason"], "length");
        let mut t = Translator::new("m", 3);
        t.on(AgentEvent::End {
            reason: StopReason::Upstream,
            text: String::new(),
            turns: 1,
            detail: Some("http://x answered 500".into()),
            messages: Vec::new(),
        });
        let err = t.upstream_failure().map(|e| e.to_json());
        assert_eq!(err.as_ref().map(|e| e["error"]["code"].clone()), Some(json!("agent_upstream_failed")));
        assert!(t.closing(false)[0].get("error").is_some());
    }

    #[test]
    fn only_requests_without_their_own_tools_run_the_loop() {
        assert!(runs(&json!({"messages": []})));
        assert!(runs(&json!({"messages": [], "tools": []})));
        assert!(!runs(&json!({"messages": [], "tools": [{"type": "function"}]})));
        assert!(!runs(&json!({"messages": [], "functions": [{"name": "f"}]})));
        assert!(!runs(&json!({"prompt": "x"})));
    }
}
