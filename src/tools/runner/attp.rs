//! ATTP code run by spindle (spec 001), when the host registered no
//! `python` service: a `python3` process in a namespace of its own (the
//! tool functions, the six libraries the spec lists, a short list of
//! builtins), under a memory and CPU limit, in a process group that ends
//! with the run. Each tool function the code calls comes back here as a
//! step of its own: checked against the catalog and run as any call's step
//! is, with its own [`ToolResult`] (and audit record), and its result (or
//! its error, raised as `ToolError` in the code) goes back to the code.
//! The code's `__result__` is the result of the `python` step, which comes
//! after the steps of the tools it called.
//!
//! This module owns the sandbox process and its line protocol (described
//! in `attp_sandbox.py`, embedded in the binary). It must not decide what a
//! tool call may do: the calls go through [`RunScope::run_call`]'s own checks.
//!
//! The wall around the code is the policy check of
//! [`check_code`](crate::calls::attp::check_code) (no import, no file or
//! dynamic code, no dunder escapes), which refused the call before it got
//! here, then the namespace and the limits. It is meant for code a model
//! wrote for the tools it was given, not for code written to attack the
//! host: run spindle as a user without rights it must not lend, or register
//! a `python` service that runs the code in a stronger sandbox.

use super::group::{GroupGuard, new_mark};
use super::{Kind, RunScope};
use crate::calls::attp::PYTHON_TOOL;
use crate::calls::{CallFormat, Step, ToolCall};
use crate::tools::observe::{self, Outcome, ToolResult};
use serde_json::{Map, Value, json};
use std::process::Stdio;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

/// The sandbox's Python source.
const SANDBOX: &str = include_str!("attp_sandbox.py");

/// The program that runs it, looked up in the tools' `PATH`.
const PYTHON: &str = "python3";

/// Most tool calls one code block may make.
const MAX_ATTP_CALLS: u64 = 64;

/// Most bytes of address space the code's process may use.
const MEMORY: u64 = 1024 * 1024 * 1024;

/// How one code run ended.
enum End {
    /// `__result__`, and what the code printed.
    Done(Value, String),
    /// An exception or a broken run: the observation's reason and detail.
    Failed(Outcome, String),
}

impl RunScope {
    /// Runs the ATTP code of `step` (of `call`) in the sandbox: the results
    /// of the tools it called, in order, then the `python` step's.
    pub(super) async fn run_attp(
        &self,
        call: &ToolCall,
        call_id: &str,
        step: &Step,
        cancel: &CancellationToken,
    ) -> (Vec<ToolResult>, ToolResult) {
        let started = Instant::now();
        let started_at_ms =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default();
        let mut calls = Vec::new();
        let (end, bytes) = self.sandbox(call, call_id, step, cancel, &mut calls).await;
        let max = self.inner.options.max_observation;
        let (outcome, observation, result) = match end {
            End::Done(value, printed) => {
                let observation = observe::success(PYTHON_TOOL, &value, max);
                let result = if printed.is_empty() { value } else { json!({"result": value, "printed": printed}) };
                (Outcome::Success, observation, result)
            }
            End::Failed(outcome, observation) => (outcome, observation, Value::Null),
        };
        let result = ToolResult {
            call_id: call_id.to_string(),
            tool_id: PYTHON_TOOL.to_string(),
            step: step.index,
            ok: outcome.is_ok(),
            outcome,
            observation,
            result,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            bytes,
            attempts: 1,
            task_id: None,
            truncated: false,
            request_id: call.request_id.clone(),
            repeat_of: None,
        };
        self.inner.audit_run(&result, Kind::Sandbox, Value::Object(step.params.clone()), started_at_ms);
        (calls, result)
    }

    /// The process and its conversation; the tools' results go to `calls`.
    async fn sandbox(
        &self,
        call: &ToolCall,
        call_id: &str,
        step: &Step,
        cancel: &CancellationToken,
        calls: &mut Vec<ToolResult>,
    ) -> (End, u64) {
        let options = &self.inner.options;
        let code = step.params.get("code").and_then(Value::as_str).unwrap_or_default();
        let mut functions = Map::new();
        for (name, id) in self.inner.catalog.function_table() {
            let params: Vec<String> = self
                .inner
                .catalog
                .get(id)
                .map(|def| crate::tools::manual::params_of(def).into_iter().map(|p| p.name).collect())
                .unwrap_or_default();
            functions.insert(name, json!([id, params]));
        }
        let timeout = options.default_timeout;
        let job = json!({
            "code": code,
            "functions": functions,
            "memory": MEMORY,
            "cpu": timeout.as_secs().max(1),
        });
        let mark = new_mark();
        let mut cmd = super::tool_command(PYTHON, &std::env::temp_dir(), options, &mark);
        // The call id after the source: `ps` shows whose run it is.
        cmd.args(["-I", "-S", "-c", SANDBOX, call_id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let why = if e.kind() == std::io::ErrorKind::NotFound {
                    format!(
                        "ATTP code is run by {PYTHON}, which is not on the tools' PATH ({}); install it, set \
                         --tool-path, or register a `python` service",
                        options.path
                    )
                } else {
                    format!("{PYTHON} could not be started: {e}")
                };
                return (End::Failed(Outcome::NotRun, observe::not_run(PYTHON_TOOL, "attp_code", &why)), 0);
            }
        };
        let guard = GroupGuard::new(child.id(), Some(&mark));
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return (End::Failed(Outcome::Failed, observe::failure(PYTHON_TOOL, "not started", "no pipes")), 0);
        };
        // Stderr, capped, for the failure observation.
        let cap = options.max_stderr_excerpt;
        let errors = tokio::spawn(async move {
            let (kept, _) = super::script::read_capped(stderr, cap * 4, || {}).await;
            String::from_utf8_lossy(&kept).into_owned()
        });
        let mut lines = BufReader::new(stdout.take(options.max_output as u64 + 1));
        let mut bytes = 0u64;
        let send = |value: &Value| {
            let mut line = value.to_string();
            line.push('\n');
            line
        };
        if stdin.write_all(send(&job).as_bytes()).await.is_err() {
            guard.kill();
            let err = errors.await.unwrap_or_default();
            let detail = observe::excerpt(err.trim(), cap);
            return (End::Failed(Outcome::Failed, observe::failure(PYTHON_TOOL, "did not start", &detail)), 0);
        }
        let mut made = 0u64;
        let end = loop {
            let mut line = String::new();
            // The code's own time between two tool calls is limited; the
            // tools' time is their own.
            let read = tokio::select! {
                r = tokio::time::timeout(timeout, lines.read_line(&mut line)) => r,
                () = cancel.cancelled() => break End::Failed(Outcome::Cancelled, observe::cancelled(PYTHON_TOOL)),
            };
            match read {
                Err(_) => {
                    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                    break End::Failed(Outcome::Timeout, observe::timeout(PYTHON_TOOL, ms));
                }
                Ok(Err(_) | Ok(0)) => {
                    guard.kill();
                    let err = errors.await.unwrap_or_default();
                    let why = if bytes >= options.max_output as u64 { "output cap" } else { "exited" };
                    let detail = observe::excerpt(err.trim(), cap);
                    break End::Failed(Outcome::Failed, observe::failure(PYTHON_TOOL, why, &detail));
                }
                Ok(Ok(n)) => bytes += n as u64,
            }
            let Ok(Value::Object(msg)) = serde_json::from_str::<Value>(&line) else {
                let detail = observe::excerpt(line.trim(), cap);
                break End::Failed(Outcome::Failed, observe::failure(PYTHON_TOOL, "broken sandbox output", &detail));
            };
            if let Some(done) = msg.get("done").and_then(Value::as_bool) {
                let printed = msg.get("printed").and_then(Value::as_str).unwrap_or_default().to_string();
                if done {
                    break End::Done(msg.get("result").cloned().unwrap_or(Value::Null), printed);
                }
                let error = msg.get("error").and_then(Value::as_str).unwrap_or("the code failed");
                let at = msg.get("line").and_then(Value::as_u64).map(|l| format!(" (line {l})")).unwrap_or_default();
                let detail = format!("{error}{at}");
                break End::Failed(Outcome::Failed, format!("Observation: Error - ATTP code failed: {detail}"));
            }
            // A tool call.
            let tool = msg.get("call").and_then(Value::as_str).unwrap_or_default().to_string();
            made += 1;
            let reply = if made > MAX_ATTP_CALLS {
                json!({"ok": false, "error": format!("more than {MAX_ATTP_CALLS} tool calls in one code block")})
            } else {
                let mut inner = Step::new(&tool);
                if let Some(Value::Object(params)) = msg.get("params") {
                    inner.params = params.clone();
                }
                inner.index = Some(made);
                let mut one = ToolCall::new(CallFormat::Attp);
                one.steps.push(inner);
                one.request_id.clone_from(&call.request_id);
                let results = Box::pin(self.run_steps(&one, call_id, cancel)).await;
                let reply = match results.first() {
                    Some(r) if r.ok => json!({"ok": true, "result": r.result}),
                    Some(r) => json!({"ok": false, "error": r.observation}),
                    None => json!({"ok": false, "error": "the tool did not run"}),
                };
                calls.extend(results);
                reply
            };
            if stdin.write_all(send(&reply).as_bytes()).await.is_err() {
                let err = errors.await.unwrap_or_default();
                let detail = observe::excerpt(err.trim(), cap);
                break End::Failed(Outcome::Failed, observe::failure(PYTHON_TOOL, "exited", &detail));
            }
        };
        // No process outlives its run.
        guard.kill();
        let _ = child.wait().await;
        (end, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::{PYTHON, SANDBOX};
    use serde_json::{Value, json};
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// The sandbox's last line for `code`, run directly: without the
    /// policy check, which refuses these imports before anything runs.
    fn sandbox(code: &str) -> Value {
        let mut child = Command::new(PYTHON)
            .args(["-I", "-S", "-c", SANDBOX])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{PYTHON}: {e}"));
        let job = json!({"code": code, "functions": {}, "memory": 0, "cpu": 10});
        if let Some(mut stdin) = child.stdin.take() {
            writeln!(stdin, "{job}").unwrap_or_else(|e| panic!("{e}"));
        }
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn code_without_result_ends_with_its_last_expression_or_its_print() {
        let end = sandbox("x = 2\nx * 21");
        assert_eq!(end, json!({"done": true, "result": 42, "printed": ""}));
        let end = sandbox("print('a', 1)\nprint('b')");
        assert_eq!(end, json!({"done": true, "result": "a 1\nb\n", "printed": ""}));
        // An assigned `__result__` wins over the last expression.
        let end = sandbox("__result__ = 1\n2");
        assert_eq!(end["result"], 1);
        let end = sandbox("x = 1");
        assert_eq!(end["done"], false, "{end}");
        assert!(end["error"].as_str().is_some_and(|e| e.contains("never assigned __result__")), "{end}");
        // A syntax error still says where.
        let end = sandbox("x = (\n");
        assert_eq!(end["done"], false, "{end}");
        assert!(end["error"].as_str().is_some_and(|e| e.starts_with("SyntaxError")), "{end}");
    }

    #[test]
    fn imports_reach_only_the_injected_libraries() {
        let ok = sandbox(
            "import math, json as j\nfrom datetime import datetime, timedelta\nfrom statistics import *\n\
             __result__ = [math.floor(1.5), j.dumps(1), timedelta(days=2).days, datetime(2020, 1, 2).day, mean([1, 3])]",
        );
        assert_eq!(ok, json!({"done": true, "result": [1, "1", 2, 2, 2], "printed": ""}));
        for code in [
            "import os",
            "import os.path",
            "from os import path",
            "from . import x",
            "from math import _inst",
            "__import__('os')",
            "import importlib",
        ] {
            let end = sandbox(&format!("{code}\n__result__ = 1"));
            assert_eq!(end["done"], false, "{code}: {end}");
            assert!(end["error"].as_str().is_some_and(|e| e.starts_with("ImportError")), "{code}: {end}");
        }
    }
}
