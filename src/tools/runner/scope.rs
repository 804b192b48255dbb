//! Runs and their async tasks: a [`RunScope`] is one run's use of a
//! [`Runner`](super::Runner) — one agent loop, one `spindle parse
//! --execute`, one proxy request — and owns the async tasks its calls
//! start (spec 000 §3.2).
//!
//! This module owns the bookkeeping of those tasks: their ids, who may
//! take their results, and stopping them when the run ends. It must not
//! run tools itself ([`super`] does) or word observations
//! ([`crate::tools::observe`] does).
//!
//! # Why a scope
//!
//! A runner is shared: a proxy serves every request with one, so that its
//! MCP servers start once. The tasks of async tools must not be shared
//! with it. A task started by one run is seen only by that run (ids are
//! numbered per scope, `task_1`, `task_2`, ...; results are taken from the
//! scope), and it never outlives the run: [`RunScope::stop`] (or dropping
//! the scope) kills what is still running, the tool's whole process group
//! included, as a timeout does.
//!
//! # States
//!
//! ```text
//!   Runner::scope ──> Open ──stop / drop──> Closed
//! ```
//!
//! An open scope starts tasks; a closed one has stopped them all and
//! refuses new ones (a step of an async tool is then reported
//! [`Outcome::NotRun`], `run_ended`).

use super::{EventSink, Inner, ToolEvent};
use crate::tools::observe::{self, Outcome, ToolResult};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// What a task's future gives: its result, or `None` when it was aborted
/// (or panicked).
type TaskOutput = Shared<BoxFuture<'static, Option<ToolResult>>>;

/// One async task of a scope.
struct Task {
    /// `task_N`, unique in its scope.
    id: String,
    call_id: String,
    request_id: Option<String>,
    tool_id: String,
    step: Option<u64>,
    started: Instant,
    abort: tokio::task::AbortHandle,
    /// Awaited by [`RunScope::wait_tasks`] without taking the task out of
    /// the scope (so a dropped wait leaves it owned).
    output: TaskOutput,
}

impl Task {
    /// Its result when it has finished and the result can be had now.
    fn finished(&self) -> Option<ToolResult> {
        if !self.abort.is_finished() {
            return None;
        }
        self.output.clone().now_or_never().flatten()
    }

    /// The result of a task stopped because its run ended.
    fn stopped(&self) -> ToolResult {
        let mut r = ToolResult::not_run(
            &self.call_id,
            &self.tool_id,
            self.step,
            Outcome::Cancelled,
            observe::task_stopped(&self.tool_id, &self.id),
        );
        r.task_id = Some(self.id.clone());
        r.request_id.clone_from(&self.request_id);
        r.duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        r
    }
}

/// The tasks of a scope.
enum ScopeState {
    /// Tasks may start; `started` counts every task this scope started.
    Open { started: u64, tasks: Vec<Task> },
    /// The run ended: its tasks were stopped and no new one starts.
    Closed,
}

/// One run's use of a [`Runner`](super::Runner): the calls it runs and the
/// async tasks they start, which belong to this run alone.
///
/// Make one per run with [`Runner::scope`](super::Runner::scope) — per
/// agent loop, per request of a server, per transcript — and run the
/// run's calls with [`RunScope::run_call`]. An async tool's task is
/// numbered in the scope (`task_1`, `task_2`, ...), its result is taken
/// from the scope ([`RunScope::take_finished_tasks`],
/// [`RunScope::wait_tasks`]) and never from another, and when the run ends
/// ([`RunScope::stop`], or dropping the scope) every task still running is
/// killed with its whole process group.
///
/// ```
/// use spindle::calls::{CallFormat, Step, ToolCall, ToolCatalog, ToolDef};
/// use spindle::tools::{Outcome, Runner};
/// use serde_json::json;
/// use std::sync::Arc;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut catalog = ToolCatalog::new();
/// let mut def = ToolDef::new("Render", json!({"type": "object"}));
/// def.implementation = Some(json!({"type": "service", "async": true}));
/// catalog.add(def).unwrap();
/// let mut runner = Runner::new(catalog);
/// runner.register_service("Render", |_| async { Ok(json!("done")) });
/// let runner = Arc::new(runner); // shared by every run
///
/// let mut call = ToolCall::new(CallFormat::Tam);
/// call.steps.push(Step::new("Render"));
/// let alice = runner.scope();
/// let bob = runner.scope();
/// let started = alice.run_call(&call, "call_1", &CancellationToken::new()).await;
/// assert_eq!(started[0].outcome, Outcome::Pending);
/// assert_eq!(started[0].task_id.as_deref(), Some("task_1"));
/// assert!(bob.wait_tasks().await.is_empty(), "Bob never sees Alice's task");
/// let done = alice.wait_tasks().await;
/// assert_eq!(done[0].result, json!("done"));
/// # }
/// ```
pub struct RunScope {
    pub(super) inner: Arc<Inner>,
    state: Mutex<ScopeState>,
    /// The calls run so far that had a `request_id`, by it: the first
    /// call's id and results (at most [`MAX_REQUEST_IDS`], oldest
    /// forgotten first).
    requests: Mutex<VecDeque<(String, String, Vec<ToolResult>)>>,
}

/// Most `request_id`s a scope remembers; past it the oldest is forgotten
/// (a repeat of it would run again).
pub const MAX_REQUEST_IDS: usize = 1024;

impl std::fmt::Debug for RunScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tasks = match &*self.lock() {
            ScopeState::Open { tasks, .. } => Some(tasks.len()),
            ScopeState::Closed => None,
        };
        f.debug_struct("RunScope").field("tasks", &tasks).finish_non_exhaustive()
    }
}

/// Why an async task was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotStarted {
    /// The scope was closed: its run has ended.
    Closed,
}

impl RunScope {
    pub(super) fn new(inner: Arc<Inner>) -> RunScope {
        RunScope {
            inner,
            state: Mutex::new(ScopeState::Open { started: 0, tasks: Vec::new() }),
            requests: Mutex::new(VecDeque::new()),
        }
    }

    /// The first call's id and results for `request_id`, if this scope ran
    /// a call with it.
    pub(super) fn remembered(&self, request_id: &str) -> Option<(String, Vec<ToolResult>)> {
        let requests = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        requests.iter().find(|(rid, _, _)| rid == request_id).map(|(_, call, results)| (call.clone(), results.clone()))
    }

    /// Remembers the results of the call `call_id` for its `request_id`
    /// (the first call with it wins).
    pub(super) fn remember(&self, request_id: &str, call_id: &str, results: &[ToolResult]) {
        let mut requests = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if requests.iter().any(|(rid, _, _)| rid == request_id) {
            return;
        }
        if requests.len() >= MAX_REQUEST_IDS {
            requests.pop_front();
        }
        requests.push_back((request_id.to_string(), call_id.to_string(), results.to_vec()));
    }

    /// The state, also when a thread panicked while holding it (the list
    /// stays consistent: every change is one push or one swap).
    fn lock(&self) -> MutexGuard<'_, ScopeState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts `work` as a task of this scope and returns its id, or why it
    /// was not started. `work` gets the id.
    pub(super) fn start_task(
        &self,
        call_id: &str,
        request_id: Option<&str>,
        tool_id: &str,
        step: Option<u64>,
        work: impl FnOnce(String) -> BoxFuture<'static, ToolResult>,
    ) -> Result<String, NotStarted> {
        let mut state = self.lock();
        let ScopeState::Open { started, tasks } = &mut *state else {
            return Err(NotStarted::Closed);
        };
        *started += 1;
        let id = format!("task_{started}");
        // Spawned under the lock: a scope closed by `stop` never gets a
        // task it does not know about.
        let handle = tokio::spawn(work(id.clone()));
        let abort = handle.abort_handle();
        let output = handle.map(Result::ok).boxed().shared();
        tasks.push(Task {
            id: id.clone(),
            call_id: call_id.to_string(),
            request_id: request_id.map(str::to_string),
            tool_id: tool_id.to_string(),
            step,
            started: Instant::now(),
            abort,
            output,
        });
        Ok(id)
    }

    /// The results of this scope's async tasks that have finished since the
    /// last call (or [`RunScope::wait_tasks`]), in start order; running
    /// tasks stay. Never a task of another scope.
    pub fn take_finished_tasks(&self) -> Vec<ToolResult> {
        let mut state = self.lock();
        let ScopeState::Open { tasks, .. } = &mut *state else { return Vec::new() };
        let mut out = Vec::new();
        tasks.retain(|t| match t.finished() {
            Some(r) => {
                out.push(r);
                false
            }
            None => true,
        });
        out
    }

    /// Waits for every async task this scope has started so far and returns
    /// their results in start order (each was also sent to the sink as it
    /// finished).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the tasks running and owned by the scope
    /// ([`RunScope::stop`] or dropping the scope kills them); the results
    /// of those that finished meanwhile are left for the next call.
    pub async fn wait_tasks(&self) -> Vec<ToolResult> {
        let waiting: Vec<(String, TaskOutput)> = match &*self.lock() {
            ScopeState::Open { tasks, .. } => tasks.iter().map(|t| (t.id.clone(), t.output.clone())).collect(),
            ScopeState::Closed => Vec::new(),
        };
        let mut out = Vec::new();
        let mut done = Vec::new();
        for (id, output) in waiting {
            if let Some(r) = output.await {
                out.push(r);
            }
            done.push(id);
        }
        if let ScopeState::Open { tasks, .. } = &mut *self.lock() {
            tasks.retain(|t| !done.contains(&t.id));
        }
        out
    }

    /// How many of this scope's async tasks are still running.
    pub fn pending_tasks(&self) -> usize {
        match &*self.lock() {
            ScopeState::Open { tasks, .. } => tasks.iter().filter(|t| !t.abort.is_finished()).count(),
            ScopeState::Closed => 0,
        }
    }

    /// Ends the run: closes the scope (no task starts after this) and kills
    /// every task still running, each with its whole process group. When
    /// it returns, their processes have been killed. Returns one
    /// [`Outcome::Cancelled`] result per stopped task (its `task_id` set),
    /// each also sent to the sink as a [`ToolEvent::TaskDone`]. Results of
    /// finished tasks not yet taken are dropped. A second call returns
    /// nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after its first poll leaves the tasks aborted
    /// (they die as soon as the runtime drops them) but unreported.
    pub async fn stop(&self) -> Vec<ToolResult> {
        let running = self.close();
        let mut out = Vec::new();
        for task in running {
            // `None`: the abort dropped the tool's future, and with it its
            // process group; `Some`: it finished just before the abort and
            // reported itself.
            if task.output.clone().await.is_none() {
                out.push(report_stopped(self.inner.sink.as_ref(), &task));
            }
        }
        out
    }

    /// Marks the scope closed and aborts its running tasks; returns them.
    fn close(&self) -> Vec<Task> {
        close(&mut self.lock())
    }
}

/// Closes `state` and aborts its running tasks; returns them.
fn close(state: &mut ScopeState) -> Vec<Task> {
    let ScopeState::Open { tasks, .. } = std::mem::replace(state, ScopeState::Closed) else {
        return Vec::new();
    };
    let running: Vec<Task> = tasks.into_iter().filter(|t| !t.abort.is_finished()).collect();
    for t in &running {
        t.abort.abort();
    }
    running
}

/// The stopped result of `task`, sent to `sink`.
fn report_stopped(sink: Option<&EventSink>, task: &Task) -> ToolResult {
    let r = task.stopped();
    if let Some(sink) = sink {
        sink(ToolEvent::TaskDone(r.clone()));
    }
    r
}

impl Drop for RunScope {
    fn drop(&mut self) {
        // Aborting a task drops its future, which kills its process group
        // (soon after, on the runtime; `stop` waits for it).
        let state = self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        for task in close(state) {
            report_stopped(self.inner.sink.as_ref(), &task);
        }
    }
}
