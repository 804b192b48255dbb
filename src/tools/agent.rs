//! The agent loop: a chat request, an OpenAI-compatible upstream, a tool
//! runner and a call protocol in; turns of "stream the answer, run its
//! calls, send the observations back" out, until an answer makes no call
//! or a limit is reached (spec 004 §3.3's deliberation-action loop).
//!
//! This module owns the loop, its limits and its events. It must not word
//! observations ([`super::observe`]) or run processes itself
//! ([`super::runner`]).
//!
//! # Streaming
//!
//! Each call block is started **the moment its element completes**, while
//! the rest of the answer is still streaming (calls of one answer run one
//! after another, in order). When the answer ends, the loop waits only for
//! what is still running; a tool that finished during the stream has its
//! result ready. [`AgentEvent::TurnEnd`] reports how long the stream took,
//! how long the loop waited for tools after it, and how much tool time ran
//! under the stream (the time the early start saved).
//!
//! # What is sent back
//!
//! After an answer with calls, the loop appends the assistant message (its
//! content as the model wrote it) and [`super::feedback_messages`] for the
//! protocol, then asks again. The system message holds the tool manual:
//! the request's system text with `{{AVAILABLE_TOOLS}}` /
//! `{{{system:available_tools}}}` filled in, or the manual appended to it,
//! or the manual alone when the request has no system message.
//!
//! # Limits
//!
//! [`AgentLimits`]: turns, total time, tool calls, and the number of times
//! the same failing call may repeat. Each stop says why
//! ([`StopReason`]).
//!
//! # Async tools
//!
//! Each run has its own [`RunScope`]: the tasks of async tools it starts
//! are numbered in it and only it gets their results, also when many runs
//! share one [`Runner`]. [`AsyncTasks`] says when: with a later turn once
//! done ([`AsyncTasks::Continue`], the default: an answer without a call
//! ends the run even while a task runs), or at the end of the turn that
//! left them running ([`AsyncTasks::Wait`]: no task is left behind by a
//! final answer). When the run ends, for
//! whatever reason, the tasks still running are killed (their process
//! groups, as at a timeout): each is reported as an
//! [`AgentEvent::ToolResult`] with [`Outcome::Cancelled`] and its task id,
//! and the [`AgentEvent::End`] detail says how many were stopped.
//!
//! # Cancel safety
//!
//! Cancelling the token passed to [`Agent::run`] drops the upstream
//! request (its connection closes) and kills running tools and tasks; the
//! stream then ends with [`StopReason::Cancelled`]. Dropping the returned
//! stream does the same.

use super::collect::CallCollector;
use super::manual::{Protocol, manual, place_manual};
use super::observe::{Outcome, ToolResult, feedback_messages};
use super::runner::{RunScope, Runner};
use crate::Registry;
use crate::calls::ToolCall;
use crate::sources::{SourceEvent, StreamOptions, StreamTap, TapFrame};
use futures::{Stream, StreamExt};
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Limits of one [`Agent::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLimits {
    /// Most model answers (turns).
    pub max_steps: usize,
    /// Most tool calls (steps run, async tasks started) over all turns; a
    /// repeated `request_id` is not one. Calls past it are not
    /// run and the loop stops after that turn.
    pub max_tool_calls: usize,
    /// Most wall time for the whole run.
    pub max_time: Option<Duration>,
    /// How many times the same failing call (tool and parameters) may be
    /// made before the loop stops.
    pub max_repeats: usize,
    /// Most bytes of one answer's text kept (it is sent back as the
    /// assistant message); a longer answer ends the run.
    pub max_answer_bytes: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_steps: 8,
            max_tool_calls: 32,
            max_time: Some(Duration::from_secs(600)),
            max_repeats: 3,
            max_answer_bytes: 4 * 1024 * 1024,
        }
    }
}

/// What the loop does with async tools' tasks (spec 000 §3.2: the result
/// is reported to the caller when it is done). Either way, a run only ever
/// gets the results of the tasks it started, and the tasks still running
/// when it ends are stopped.
///
/// `spindle agent --async-tasks continue|wait` and the proxy's
/// `--agent-async-tasks` (`tools.agent_async_tasks`) choose one; the
/// names are the snake_case ones in a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AsyncTasks {
    /// Send the "started, task id" observation and go on; a task's result
    /// is sent back with a later turn's observations once it has finished
    /// (the default). The model works on while the task runs, but an
    /// answer without a call ends the run, and a task still running then
    /// is stopped (reported [`Outcome::Cancelled`]): its result never
    /// reaches the model.
    #[default]
    Continue,
    /// Wait at the end of every turn that leaves tasks running, for all of
    /// them, and send their results with that turn's observations (the
    /// run's time budget and its cancel still end the wait). So no answer
    /// is taken as final while a task runs, and every result reaches the
    /// model; the price is that the model waits for each task before its
    /// next turn (the task's result comes with the "started" line).
    Wait,
}

impl AsyncTasks {
    /// The name used by the flags and in a configuration file
    /// (`continue`, `wait`).
    pub fn as_str(self) -> &'static str {
        match self {
            AsyncTasks::Continue => "continue",
            AsyncTasks::Wait => "wait",
        }
    }
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The model answered without a call.
    Answer,
    /// `max_steps` turns were used.
    MaxSteps,
    /// The time budget ran out.
    TimeBudget,
    /// The tool-call budget ran out.
    ToolBudget,
    /// The same failing call came back `max_repeats` times.
    RepeatedFailure,
    /// An answer passed `max_answer_bytes`.
    AnswerTooLarge,
    /// The caller cancelled.
    Cancelled,
    /// The upstream failed (status, connection, broken stream).
    Upstream,
}

/// One thing that happened in a run, in order. In JSONL each is one line
/// with a `type` (`turn_start`, the parser's own events with `turn`,
/// `call_started`, `tool_result`, `turn_end`, `agent_end`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// A request went upstream.
    TurnStart {
        /// 1-based turn.
        turn: usize,
        /// The messages sent.
        messages: usize,
    },
    /// An event of the answer's stream (parser events, finish, usage,
    /// stream errors).
    Source {
        /// The turn.
        turn: usize,
        /// The event.
        event: SourceEvent,
    },
    /// A call block completed and was started.
    CallStarted {
        /// The turn.
        turn: usize,
        /// Its id (`t1_call_1`).
        call_id: String,
        /// The call.
        call: Box<ToolCall>,
        /// Milliseconds since the turn's request.
        at_ms: u64,
    },
    /// One step's result.
    ToolResult {
        /// The turn.
        turn: usize,
        /// The result.
        result: ToolResult,
        /// Microseconds from the block's completion to the call's start
        /// (the wait behind earlier calls of the same answer included).
        start_latency_us: u64,
    },
    /// The answer and its calls are done.
    TurnEnd {
        /// The turn.
        turn: usize,
        /// The assistant's text as written.
        text: String,
        /// Calls found in it.
        calls: usize,
        /// Request to end of stream.
        stream_ms: u64,
        /// Time waited for tools after the stream ended.
        tool_wait_ms: u64,
        /// Tool time that ran while the answer was still streaming (saved
        /// by starting calls early).
        overlap_ms: u64,
        /// The loop's own work this turn, in µs: decoding and parsing the
        /// stream and dispatching its calls (network and tool time
        /// excluded).
        overhead_us: u64,
    },
    /// The run is over.
    End {
        /// Why.
        reason: StopReason,
        /// The last answer's text.
        text: String,
        /// Turns used.
        turns: usize,
        /// A sentence for the reason (the upstream error, the repeated
        /// call), and how many async tasks were stopped at the end
        /// (`N async task(s) still running were stopped`).
        detail: Option<String>,
        /// The whole conversation, ready to continue.
        messages: Vec<Value>,
    },
}

impl AgentEvent {
    /// The JSONL form.
    pub fn to_json(&self) -> Value {
        match self {
            AgentEvent::TurnStart { turn, messages } => {
                json!({"type": "turn_start", "turn": turn, "messages": messages})
            }
            AgentEvent::Source { turn, event } => {
                let mut v = serde_json::to_value(event).unwrap_or(Value::Null);
                if let Value::Object(m) = &mut v {
                    m.insert("turn".into(), json!(turn));
                }
                v
            }
            AgentEvent::CallStarted { turn, call_id, call, at_ms } => {
                json!({"type": "call_started", "turn": turn, "call_id": call_id, "at_ms": at_ms, "call": call.to_value()})
            }
            AgentEvent::ToolResult { turn, result, start_latency_us } => {
                let mut v = result.to_event_json("tool_result");
                if let Value::Object(m) = &mut v {
                    m.insert("turn".into(), json!(turn));
                    m.insert("start_latency_us".into(), json!(start_latency_us));
                }
                v
            }
            AgentEvent::TurnEnd { turn, text, calls, stream_ms, tool_wait_ms, overlap_ms, overhead_us } => json!({
                "type": "turn_end", "turn": turn, "text": text, "calls": calls, "stream_ms": stream_ms,
                "tool_wait_ms": tool_wait_ms, "overlap_ms": overlap_ms, "overhead_us": overhead_us
            }),
            AgentEvent::End { reason, text, turns, detail, messages } => json!({
                "type": "agent_end", "reason": reason, "text": text, "turns": turns, "detail": detail,
                "messages": messages
            }),
        }
    }
}

/// Runs tool conversations against an OpenAI-compatible upstream.
#[derive(Debug, Clone)]
pub struct Agent {
    http: reqwest::Client,
    endpoint: String,
    api_key: Option<String>,
    runner: Arc<Runner>,
    protocol: Protocol,
    registry: Arc<Registry>,
    limits: AgentLimits,
    tasks: AsyncTasks,
    /// Headers sent with every upstream request (`traceparent`, ...).
    headers: reqwest::header::HeaderMap,
}

/// Why an agent could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The protocol has no text form to parse (`openai`).
    #[error("protocol {0} has no text call form the loop can read")]
    Protocol(Protocol),
    /// The base URL cannot be an API's base.
    #[error("bad upstream URL {url:?}: {why}")]
    Upstream {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Whether a result spends one call of the tool-call budget: a step that
/// ran, or an async tool's task that started; not a repeat of an earlier
/// call's `request_id` (nothing ran), nor a task's later result (counted
/// when it started).
fn counts_as_call(r: &ToolResult) -> bool {
    r.repeat_of.is_none() && (r.outcome == Outcome::Pending || (r.attempts > 0 && r.task_id.is_none()))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Agent {
    /// An agent for `base_url` (`http://host/v1`; `/chat/completions` is
    /// added, and a bare origin `http://host` is given `/v1` first, as
    /// [`crate::sources::ChatClient::new`] does).
    ///
    /// # Errors
    ///
    /// [`AgentError::Protocol`] for `openai`; [`AgentError::Upstream`] for a
    /// base that is not an `http://` or `https://` URL with a host.
    pub fn new(base_url: &str, runner: Arc<Runner>, protocol: Protocol) -> Result<Agent, AgentError> {
        let registry = protocol.profile().and_then(Registry::profile).ok_or(AgentError::Protocol(protocol))?;
        crate::sources::check_api_url(base_url)
            .map_err(|why| AgentError::Upstream { url: base_url.to_string(), why })?;
        Ok(Agent {
            http: reqwest::Client::new(),
            endpoint: format!("{}/chat/completions", crate::sources::api_base(base_url)),
            api_key: None,
            runner,
            protocol,
            registry: Arc::new(registry),
            limits: AgentLimits::default(),
            tasks: AsyncTasks::default(),
            headers: reqwest::header::HeaderMap::new(),
        })
    }

    /// Sends this bearer key upstream.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Agent {
        self.api_key = Some(key.into());
        self
    }

    /// Sends each turn's request to this chat-completions URL as it is
    /// (instead of `BASE/chat/completions`).
    pub fn with_endpoint(mut self, url: impl Into<String>) -> Agent {
        self.endpoint = url.into();
        self
    }

    /// Sends these headers with every upstream request (a `traceparent`,
    /// an organisation header); they replace headers of the same name.
    pub fn with_headers(mut self, headers: reqwest::header::HeaderMap) -> Agent {
        self.headers.extend(headers);
        self
    }

    /// Uses this HTTP client (its timeouts and connection pool).
    pub fn with_http(mut self, http: reqwest::Client) -> Agent {
        self.http = http;
        self
    }

    /// Uses these limits.
    pub fn with_limits(mut self, limits: AgentLimits) -> Agent {
        self.limits = limits;
        self
    }

    /// Waits for async tasks, or goes on (the default).
    pub fn with_async_tasks(mut self, tasks: AsyncTasks) -> Agent {
        self.tasks = tasks;
        self
    }

    /// The system text with the manual: placeholders filled, or the manual
    /// appended.
    pub fn system_prompt(&self, system: Option<&str>) -> String {
        let text = manual(self.runner.catalog().tools(), self.protocol);
        match system {
            Some(s) => place_manual(s, &text).0,
            None => text,
        }
    }

    /// Starts a run of `request` (a chat-completions body with `model` and
    /// `messages`; `stream` is forced on) and returns its events as they
    /// happen. The run goes on in a spawned task; it ends when the stream
    /// has yielded [`AgentEvent::End`].
    ///
    /// # Cancel safety
    ///
    /// See the module docs: cancelling `cancel` or dropping the stream
    /// ends the upstream request and kills running tools.
    pub fn run(&self, request: Value, cancel: CancellationToken) -> impl Stream<Item = AgentEvent> + Send + 'static {
        let (tx, rx) = mpsc::channel(256);
        let me = self.clone();
        let guard = cancel.clone().drop_guard();
        tokio::spawn(async move {
            // The run's own tasks; dropping it (the runtime going away)
            // kills them too.
            let scope = Arc::new(me.runner.scope());
            let end = me.drive(request, &scope, &cancel, &tx).await;
            let end = end.stop_tasks(&scope, &tx).await;
            let _ = tx.send(end.into_event()).await;
        });
        // Dropping the stream drops the guard, which cancels the run.
        tokio_stream::wrappers::ReceiverStream::new(rx).map(move |e| {
            let _ = &guard;
            e
        })
    }

    async fn drive(
        &self,
        request: Value,
        scope: &Arc<RunScope>,
        cancel: &CancellationToken,
        tx: &mpsc::Sender<AgentEvent>,
    ) -> RunEnd {
        let started = Instant::now();
        let mut body = match request {
            Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        body.insert("stream".into(), Value::Bool(true));
        // Usage per turn, so that a caller can add it up (a caller's own
        // `stream_options` wins).
        body.entry("stream_options").or_insert_with(|| json!({"include_usage": true}));
        let mut messages: Vec<Value> = body
            .remove("messages")
            .and_then(|m| if let Value::Array(a) = m { Some(a) } else { None })
            .unwrap_or_default();
        // The manual goes into the (first) system message.
        match messages.iter_mut().find(|m| m["role"] == "system") {
            Some(sys) => {
                let text = sys["content"].as_str().map(str::to_string);
                sys["content"] = Value::String(self.system_prompt(text.as_deref()));
            }
            None => messages.insert(0, json!({"role": "system", "content": self.system_prompt(None)})),
        }
        let mut tool_calls = 0usize;
        let mut failures: Vec<(String, usize)> = Vec::new();
        let mut last_text = String::new();
        let end = |reason, text: String, turns, detail: Option<String>, messages: Vec<Value>| RunEnd {
            reason,
            text,
            turns,
            detail,
            messages,
        };
        for turn in 1..=self.limits.max_steps {
            if cancel.is_cancelled() {
                return end(StopReason::Cancelled, last_text, turn - 1, None, messages);
            }
            let remaining = self.limits.max_time.map(|t| t.saturating_sub(started.elapsed()));
            if remaining == Some(Duration::ZERO) {
                return end(StopReason::TimeBudget, last_text, turn - 1, None, messages);
            }
            let _ = tx.send(AgentEvent::TurnStart { turn, messages: messages.len() }).await;
            let mut req = body.clone();
            req.insert("messages".into(), Value::Array(messages.clone()));
            let budget_left = self.limits.max_tool_calls.saturating_sub(tool_calls);
            let turn_cancel = cancel.child_token();
            // The time budget cancels the turn like the caller would; the
            // turn then stops its tools and returns, so `End` is the last
            // event.
            let fired = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let timer = remaining.map(|r| {
                let (t, f) = (turn_cancel.clone(), fired.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(r).await;
                    f.store(true, std::sync::atomic::Ordering::SeqCst);
                    t.cancel();
                })
            });
            let outcome = self.turn(turn, Value::Object(req), budget_left, scope, &turn_cancel, tx).await;
            if let Some(t) = timer {
                t.abort();
            }
            let outcome = match outcome {
                Err((StopReason::Cancelled, d)) if fired.load(std::sync::atomic::Ordering::SeqCst) => {
                    Err((StopReason::TimeBudget, d))
                }
                other => other,
            };
            let done = match outcome {
                Ok(d) => d,
                Err((reason, detail)) => {
                    turn_cancel.cancel();
                    return end(reason, last_text, turn, detail, messages);
                }
            };
            last_text = done.text.clone();
            messages.push(json!({"role": "assistant", "content": done.text}));
            let mut done = done;
            // This run's async tasks: their results, now (wait) or as they
            // finish.
            let finished = match self.tasks {
                AsyncTasks::Wait => {
                    let remaining = self.limits.max_time.map(|t| t.saturating_sub(started.elapsed()));
                    let budget = async {
                        match remaining {
                            Some(r) => tokio::time::sleep(r).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        r = scope.wait_tasks() => r,
                        () = cancel.cancelled() => return end(StopReason::Cancelled, last_text, turn, None, messages),
                        () = budget => return end(StopReason::TimeBudget, last_text, turn, None, messages),
                    }
                }
                AsyncTasks::Continue => scope.take_finished_tasks(),
            };
            for mut r in finished {
                if let Some(task) = &r.task_id {
                    r.observation = format!("Task {task} finished. {}", r.observation);
                }
                let _ = tx.send(AgentEvent::ToolResult { turn, result: r.clone(), start_latency_us: 0 }).await;
                done.results.push(r);
            }
            if done.results.is_empty() {
                // Tasks still running are stopped by the caller, which says so.
                return end(StopReason::Answer, last_text, turn, None, messages);
            }
            tool_calls += done.results.iter().filter(|r| counts_as_call(r)).count();
            messages.extend(feedback_messages(self.protocol, &done.results));
            // The same failing call, again and again.
            for r in done.results.iter().filter(|r| !r.ok) {
                let key = format!("{}\u{0}{}", r.tool_id, done.signatures.get(&r.call_id).cloned().unwrap_or_default());
                match failures.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, n)) => *n += 1,
                    None => failures.push((key, 1)),
                }
            }
            if let Some((key, n)) = failures.iter().find(|(_, n)| *n >= self.limits.max_repeats) {
                let tool = key.split('\u{0}').next().unwrap_or_default();
                let detail = format!("the same failing call to {tool} came {n} times");
                return end(StopReason::RepeatedFailure, last_text, turn, Some(detail), messages);
            }
            if done.budget_hit {
                return end(StopReason::ToolBudget, last_text, turn, None, messages);
            }
        }
        end(StopReason::MaxSteps, last_text, self.limits.max_steps, None, messages)
    }

    /// One turn: stream the answer, start calls as their blocks complete,
    /// wait for the rest at the end.
    async fn turn(
        &self,
        turn: usize,
        request: Value,
        budget: usize,
        scope: &Arc<RunScope>,
        cancel: &CancellationToken,
        tx: &mpsc::Sender<AgentEvent>,
    ) -> Result<TurnDone, (StopReason, Option<String>)> {
        let t0 = Instant::now();
        let mut req = self
            .http
            .post(&self.endpoint)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .headers(self.headers.clone())
            .json(&request);
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let upstream = |e: String| (StopReason::Upstream, Some(e));
        let response = tokio::select! {
            r = req.send() => r.map_err(|e| upstream(format!("cannot reach {}: {}", self.endpoint, crate::chain::error_chain(&e))))?,
            () = cancel.cancelled() => return Err((StopReason::Cancelled, None)),
        };
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(upstream(format!(
                "{} answered {status}: {}",
                self.endpoint,
                super::observe::excerpt(&text, 500)
            )));
        }
        let mut tap = StreamTap::new(StreamOptions { registry: self.registry.clone(), ..StreamOptions::default() });
        let mut collector = CallCollector::with_prefix(self.registry.clone(), &format!("t{turn}_call_"));
        // Calls run one after another in a worker, each as soon as its block
        // is complete and the one before is done.
        let (call_tx, mut call_rx) = mpsc::unbounded_channel::<(String, ToolCall, Instant)>();
        let scope = scope.clone();
        let worker_cancel = cancel.clone();
        let events = tx.clone();
        let worker = tokio::spawn(async move {
            let mut results: Vec<(ToolResult, Instant, Instant)> = Vec::new();
            let mut used = 0usize;
            let mut budget_hit = false;
            while let Some((id, mut call, closed_at)) = call_rx.recv().await {
                let start = Instant::now();
                if used + call.steps.len().max(1) > budget {
                    budget_hit = true;
                    call.not_runnable = Some("tool_budget".into());
                }
                let rs = if call.not_runnable.as_deref() == Some("tool_budget") {
                    call.steps
                        .iter()
                        .map(|s| {
                            ToolResult::not_run(
                                &id,
                                &s.tool_id,
                                s.index,
                                Outcome::NotRun,
                                super::observe::not_run(
                                    &s.tool_id,
                                    "tool_budget",
                                    "the tool-call budget of this run is spent",
                                ),
                            )
                        })
                        .collect()
                } else {
                    scope.run_call(&call, &id, &worker_cancel).await
                };
                used += rs.iter().filter(|r| counts_as_call(r)).count();
                let end = Instant::now();
                for r in rs {
                    let latency = u64::try_from(start.duration_since(closed_at).as_micros()).unwrap_or(u64::MAX);
                    let _ = events
                        .send(AgentEvent::ToolResult { turn, result: r.clone(), start_latency_us: latency })
                        .await;
                    results.push((r, start, end));
                }
            }
            (results, budget_hit)
        });
        let mut text = String::new();
        let mut signatures = std::collections::HashMap::new();
        let mut calls = 0usize;
        let mut frames: Vec<TapFrame> = Vec::new();
        let mut body = response.bytes_stream();
        let mut failed: Option<String> = None;
        let mut cancelled = false;
        let mut busy = Duration::ZERO;
        let mut handle = |frame_events: Vec<SourceEvent>,
                          text_piece: Option<String>,
                          text: &mut String,
                          pending: &mut Vec<AgentEvent>,
                          dispatch: &mut Vec<(String, ToolCall, Instant)>| {
            if let Some(t) = text_piece {
                text.push_str(&t);
            }
            for ev in frame_events {
                if let SourceEvent::Choice(c) = &ev
                    && c.choice == 0
                    && let Some((id, call)) = collector.observe(&c.event)
                {
                    calls += 1;
                    signatures.insert(id.clone(), serde_json::to_string(&call.steps).unwrap_or_default());
                    pending.push(AgentEvent::CallStarted {
                        turn,
                        call_id: id.clone(),
                        call: Box::new(call.clone()),
                        at_ms: ms(t0.elapsed()),
                    });
                    dispatch.push((id, call, Instant::now()));
                }
                pending.push(AgentEvent::Source { turn, event: ev });
            }
        };
        loop {
            let next = tokio::select! {
                n = body.next() => n,
                () = cancel.cancelled() => {
                    cancelled = true;
                    break;
                }
            };
            let Some(item) = next else { break };
            let bytes = match item {
                Ok(b) => b,
                Err(e) => {
                    failed = Some(format!("the stream broke: {e}"));
                    break;
                }
            };
            let busy_from = Instant::now();
            frames.clear();
            tap.feed_frames(&bytes, &mut frames);
            let mut pending = Vec::new();
            let mut dispatch = Vec::new();
            for f in frames.drain(..) {
                let piece = f.chunk.as_ref().and_then(|c| {
                    c.choice_list()
                        .iter()
                        .find(|ch| ch.index.as_option().copied().unwrap_or(0) == 0)
                        .and_then(|ch| ch.delta.as_option())
                        .and_then(|d| d.content.as_option())
                        .and_then(|c| c.as_text())
                        .map(str::to_string)
                });
                handle(f.events, piece, &mut text, &mut pending, &mut dispatch);
            }
            busy += busy_from.elapsed();
            // A call is reported started before it runs, so its result
            // never overtakes the report.
            for e in pending {
                let _ = tx.send(e).await;
            }
            for d in dispatch {
                let _ = call_tx.send(d);
            }
            if text.len() > self.limits.max_answer_bytes {
                drop(body);
                drop(call_tx);
                cancel.cancel();
                let _ = worker.await;
                let limit = self.limits.max_answer_bytes;
                return Err((StopReason::AnswerTooLarge, Some(format!("the answer passed {limit} bytes"))));
            }
        }
        if cancelled {
            // The upstream request is dropped here (its connection closes);
            // the worker stops its tool (the token is cancelled) and ends.
            drop(body);
            drop(call_tx);
            let _ = worker.await;
            return Err((StopReason::Cancelled, None));
        }
        let mut pending = Vec::new();
        let mut dispatch = Vec::new();
        handle(tap.finish(), None, &mut text, &mut pending, &mut dispatch);
        for e in pending {
            let _ = tx.send(e).await;
        }
        for d in dispatch {
            let _ = call_tx.send(d);
        }
        drop(call_tx);
        let stream_end = Instant::now();
        if let Some(why) = failed
            && calls == 0
        {
            return Err(upstream(why));
        }
        // A cancel now stops the running tool; the worker still ends soon.
        let (results, budget_hit) = worker.await.unwrap_or_default();
        if cancel.is_cancelled() {
            return Err((StopReason::Cancelled, None));
        }
        let done = Instant::now();
        let overlap: Duration = results
            .iter()
            .map(|(_, s, e)| (*e).min(stream_end).saturating_duration_since(*s))
            .fold(Duration::ZERO, |a, b| a + b);
        let tool_wait = done.duration_since(stream_end);
        let stream = stream_end.duration_since(t0);
        let overhead = busy;
        let _ = tx
            .send(AgentEvent::TurnEnd {
                turn,
                text: text.clone(),
                calls,
                stream_ms: ms(stream),
                tool_wait_ms: ms(tool_wait),
                overlap_ms: ms(overlap),
                overhead_us: u64::try_from(overhead.as_micros()).unwrap_or(u64::MAX),
            })
            .await;
        Ok(TurnDone { text, results: results.into_iter().map(|(r, _, _)| r).collect(), signatures, budget_hit })
    }
}

/// How a run ended, before its tasks are stopped.
struct RunEnd {
    reason: StopReason,
    text: String,
    turns: usize,
    detail: Option<String>,
    messages: Vec<Value>,
}

impl RunEnd {
    /// Stops the run's async tasks that are still running (their process
    /// groups are killed before this returns), reports each as a
    /// [`AgentEvent::ToolResult`] of the last turn, and says how many in
    /// the detail.
    async fn stop_tasks(mut self, scope: &RunScope, tx: &mpsc::Sender<AgentEvent>) -> RunEnd {
        let stopped = scope.stop().await;
        if stopped.is_empty() {
            return self;
        }
        let note = format!("{} async task(s) still running were stopped", stopped.len());
        for result in stopped {
            let _ = tx.send(AgentEvent::ToolResult { turn: self.turns, result, start_latency_us: 0 }).await;
        }
        self.detail = Some(match self.detail.take() {
            Some(d) => format!("{d}; {note}"),
            None => note,
        });
        self
    }

    fn into_event(self) -> AgentEvent {
        let RunEnd { reason, text, turns, detail, messages } = self;
        AgentEvent::End { reason, text, turns, detail, messages }
    }
}

/// What one turn gave.
struct TurnDone {
    text: String,
    results: Vec<ToolResult>,
    /// Each call's steps as JSON (to spot a repeated failing call).
    signatures: std::collections::HashMap<String, String>,
    budget_hit: bool,
}
