//! The agent loop against a scripted upstream (a real axum server on
//! 127.0.0.1:0 that answers turn N with the N-th transcript, paced, and
//! records every request), with the real script tools of
//! `examples/plugins/basic`.

mod process_support;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use process_support::{assert_no_process, processes_with};
use serde_json::{Value, json};
use spindle::calls::ToolCatalog;
use spindle::tools::agent::{Agent, AgentEvent, AgentLimits, StopReason};
use spindle::tools::{Outcome, Protocol, Runner, RunnerOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct Upstream {
    turns: Arc<Vec<String>>,
    requests: Arc<Mutex<Vec<Value>>>,
    pace: Duration,
    chunk: usize,
    /// Set when a response body was dropped before its end (the client went away).
    dropped: Arc<AtomicBool>,
}

struct DropFlag(Arc<AtomicBool>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

async fn chat(State(up): State<Upstream>, body: String) -> Response {
    let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let turn = req["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    up.requests.lock().map(|mut r| r.push(req)).unwrap_or(());
    let text = up.turns.get(turn).or(up.turns.last()).cloned().unwrap_or_default();
    let chars: Vec<char> = text.chars().collect();
    let pieces: Vec<String> = chars.chunks(up.chunk.max(1)).map(|c| c.iter().collect()).collect();
    let pace = up.pace;
    let flag = DropFlag(up.dropped.clone(), false);
    let stream = async_stream(pieces, pace, flag);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

fn async_stream(
    pieces: Vec<String>,
    pace: Duration,
    flag: DropFlag,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let n = pieces.len();
    futures::stream::unfold((0usize, pieces, flag), move |(i, pieces, mut flag)| async move {
        if i > n + 1 {
            return None;
        }
        if i > 0 && pace > Duration::ZERO {
            tokio::time::sleep(pace).await;
        }
        let data = if i < n {
            let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"content": pieces[i]}, "finish_reason": null}]});
            format!("data: {chunk}\n\n")
        } else if i == n {
            let chunk = json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
            format!("data: {chunk}\n\n")
        } else {
            flag.1 = true;
            "data: [DONE]\n\n".to_string()
        };
        Some((Ok(Bytes::from(data)), (i + 1, pieces, flag)))
    })
}

async fn upstream(turns: &[&str], pace_ms: u64, chunk: usize) -> (String, Upstream) {
    let up = Upstream {
        turns: Arc::new(turns.iter().map(|s| s.to_string()).collect()),
        requests: Arc::default(),
        pace: Duration::from_millis(pace_ms),
        chunk,
        dropped: Arc::default(),
    };
    let app = Router::new().route("/v1/chat/completions", post(chat)).with_state(up.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), up)
}

/// The sample tools, run with the fixed system `PATH`: the timings of
/// these tests (a tool done within ~100 ms of its block) assume that
/// `python3` starts at once, and the tools' `PATH` is by default the test
/// process's own, where a version manager's shim (pyenv: ~100 ms per
/// start) may come first.
fn runner() -> Arc<Runner> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins");
    let catalog = ToolCatalog::load_plugins(&dir).unwrap_or_else(|e| panic!("{e}"));
    let options = RunnerOptions { path: RunnerOptions::FALLBACK_PATH.into(), ..RunnerOptions::default() };
    Arc::new(Runner::with_options(catalog, options))
}

fn request(prompt: &str) -> Value {
    json!({"model": "scripted", "messages": [{"role": "user", "content": prompt}]})
}

async fn collect(agent: &Agent, prompt: &str, cancel: CancellationToken) -> Vec<(Instant, AgentEvent)> {
    let mut s = std::pin::pin!(agent.run(request(prompt), cancel));
    let mut out = Vec::new();
    while let Some(e) = s.next().await {
        out.push((Instant::now(), e));
    }
    out
}

fn end(events: &[(Instant, AgentEvent)]) -> (StopReason, String, usize, Vec<Value>) {
    match events.last().map(|(_, e)| e) {
        Some(AgentEvent::End { reason, text, turns, messages, .. }) => {
            (reason.clone(), text.clone(), *turns, messages.clone())
        }
        other => panic!("no end: {other:?}"),
    }
}

const TAM_TURN_1: &str =
    "I will add the numbers.\n<|[REQUEST_TOOL]|>\ncommand:»»»Math.Add«««\na:»»»2«««\nb:»»»40«««\n<|[END_TOOL]|>";
const TAM_TURN_2: &str = "Now echo it.\n<|[REQUEST_TOOL]|>\ncommand:»»»Echo«««\ntext:»»»42«««\n<|[END_TOOL]|>";
const FINAL: &str = "The answer is 42.";

#[tokio::test]
async fn tam_conversation_runs_three_turns_and_sends_observations_back() {
    let (url, up) = upstream(&[TAM_TURN_1, TAM_TURN_2, FINAL], 0, 7).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let events = collect(&agent, "What is 2 + 40?", CancellationToken::new()).await;
    let (reason, text, turns, messages) = end(&events);
    assert_eq!((reason, text.as_str(), turns), (StopReason::Answer, FINAL, 3));
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(requests.len(), 3);
    // The manual is in the system message of every request.
    for r in &requests {
        assert_eq!(r["messages"][0]["role"], "system");
        assert!(r["messages"][0]["content"].as_str().unwrap_or_default().contains("- Tool ID: Math.Add"));
        assert_eq!(r["stream"], true);
        assert_eq!(r["model"], "scripted");
    }
    let second = requests[1]["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(second[2], json!({"role": "assistant", "content": TAM_TURN_1}));
    assert_eq!(
        second[3],
        json!({"role": "user", "content": "Observation: Tool Math.Add executed successfully. Result: 42"})
    );
    let third = requests[2]["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        third[5],
        json!({"role": "user", "content": "Observation: Tool Echo executed successfully. Result: {\"echo\":{\"text\":\"42\"}}"})
    );
    assert_eq!(messages.len(), 7, "system, user, 2 × (assistant, observation), final assistant");
    let results: Vec<&AgentEvent> =
        events.iter().map(|(_, e)| e).filter(|e| matches!(e, AgentEvent::ToolResult { .. })).collect();
    assert_eq!(results.len(), 2);
}

#[tokio::test]
async fn action_and_filament_observations_take_their_protocol_form() {
    let action = "Sum first.\n<ACTION><Math.Add><a>1</a><b>2</b></Math.Add></ACTION>";
    let (url, up) = upstream(&[action, "It is 3."], 0, 5).await;
    let agent = Agent::new(&url, runner(), Protocol::Action).unwrap_or_else(|e| panic!("{e}"));
    let (reason, text, _, _) = end(&collect(&agent, "1+2?", CancellationToken::new()).await);
    assert_eq!((reason, text.as_str()), (StopReason::Answer, "It is 3."));
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(requests[0]["messages"][0]["content"].as_str().unwrap_or_default().contains("`<Math.Add>`"));
    assert_eq!(requests[1]["messages"][3]["content"], "Observation: Tool Math.Add executed successfully. Result: 3");

    let filament = "<content>Greeting.</content>\n<tool_call name=\"Greet\">{\"name\": \"Bo\"}</tool_call>";
    let (url, up) = upstream(&[filament, "<content>Done.</content>"], 0, 5).await;
    let agent = Agent::new(&url, runner(), Protocol::Filament).unwrap_or_else(|e| panic!("{e}"));
    let (reason, _, turns, _) = end(&collect(&agent, "greet Bo", CancellationToken::new()).await);
    assert_eq!((reason, turns), (StopReason::Answer, 2));
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(
        requests[1]["messages"][3]["content"],
        "<tool_result name=\"Greet\" call_id=\"t1_call_1\" ok=\"true\">Observation: Tool Greet executed successfully. Result: hello from sh, got: {\"name\":\"Bo\"}</tool_result>"
    );
}

#[tokio::test]
async fn a_call_starts_while_the_answer_still_streams() {
    // The block comes first, then ~1.2 s of paced text; the tool takes 0.4 s.
    let tail = " and some more words while the tool runs".repeat(3);
    let turn1 = format!(
        "<|[REQUEST_TOOL]|>\ncommand:»»»Sleepy«««\nseconds:»»»0.4«««\nlabel:»»»early«««\n<|[END_TOOL]|>\nWhile it runs:{tail}"
    );
    let (url, _up) = upstream(&[&turn1, FINAL], 10, 1).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let events = collect(&agent, "go", CancellationToken::new()).await;
    let at = |pred: &dyn Fn(&AgentEvent) -> bool| events.iter().find(|(_, e)| pred(e)).map(|(t, _)| *t);
    let result_at = at(&|e| matches!(e, AgentEvent::ToolResult { .. })).unwrap_or_else(|| panic!("no result"));
    let finish_at =
        at(&|e| matches!(e, AgentEvent::Source { event: spindle::sources::SourceEvent::Finish { .. }, .. }))
            .unwrap_or_else(|| panic!("no finish"));
    assert!(result_at < finish_at, "the result was ready before the stream ended");
    let Some(AgentEvent::TurnEnd { tool_wait_ms, overlap_ms, stream_ms, .. }) =
        events.iter().map(|(_, e)| e).find(|e| matches!(e, AgentEvent::TurnEnd { turn: 1, .. }))
    else {
        panic!("no turn end")
    };
    assert!(*tool_wait_ms < 100, "waited {tool_wait_ms} ms after the stream");
    assert!(*overlap_ms >= 350, "only {overlap_ms} ms under the stream of {stream_ms} ms");
    let Some(AgentEvent::ToolResult { start_latency_us, result, .. }) =
        events.iter().map(|(_, e)| e).find(|e| matches!(e, AgentEvent::ToolResult { .. }))
    else {
        panic!()
    };
    assert_eq!(result.outcome, Outcome::Success);
    let overhead: Vec<u64> = events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::TurnEnd { overhead_us, .. } => Some(*overhead_us),
            _ => None,
        })
        .collect();
    eprintln!(
        "figures: start latency {start_latency_us} µs after the block closed; stream {stream_ms} ms, \
         tool time under the stream {overlap_ms} ms, waited {tool_wait_ms} ms after it; loop work per turn {overhead:?} µs"
    );
    assert!(*start_latency_us < 50_000, "started {start_latency_us} µs after the block closed");
}

#[tokio::test]
async fn limits_stop_the_loop_and_say_why() {
    // A model that calls forever.
    let (url, up) = upstream(&[TAM_TURN_1], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(AgentLimits { max_steps: 3, ..AgentLimits::default() });
    let (reason, _, turns, _) = end(&collect(&agent, "loop", CancellationToken::new()).await);
    assert_eq!((reason, turns), (StopReason::MaxSteps, 3));
    assert_eq!(up.requests.lock().map(|r| r.len()).unwrap_or(0), 3);
    // The same failing call again and again.
    let failing = "Try.\n<|[REQUEST_TOOL]|>\ncommand:»»»Fail«««\n<|[END_TOOL]|>";
    let (url, _) = upstream(&[failing], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let events = collect(&agent, "fail", CancellationToken::new()).await;
    let (reason, _, turns, _) = end(&events);
    assert_eq!((reason, turns), (StopReason::RepeatedFailure, 3));
    // A tool-call budget.
    let (url, _) = upstream(&[TAM_TURN_1], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(AgentLimits { max_tool_calls: 2, ..AgentLimits::default() });
    let events = collect(&agent, "budget", CancellationToken::new()).await;
    let (reason, _, turns, _) = end(&events);
    assert_eq!((reason, turns), (StopReason::ToolBudget, 3));
    let run = events
        .iter()
        .filter(|(_, e)| matches!(e, AgentEvent::ToolResult { result, .. } if result.attempts > 0))
        .count();
    assert_eq!(run, 2);
    // An answer larger than the limit.
    let (url, _) = upstream(&[TAM_TURN_1], 0, 5).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(AgentLimits { max_answer_bytes: 20, ..AgentLimits::default() });
    let (reason, _, _, _) = end(&collect(&agent, "big", CancellationToken::new()).await);
    assert_eq!(reason, StopReason::AnswerTooLarge);
    // A time budget.
    let (url, _) = upstream(&[TAM_TURN_1], 30, 1).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(AgentLimits { max_time: Some(Duration::from_millis(300)), ..AgentLimits::default() });
    let started = Instant::now();
    let (reason, _, _, _) = end(&collect(&agent, "slow", CancellationToken::new()).await);
    assert_eq!(reason, StopReason::TimeBudget);
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// The agent and the client take a bare origin as `spindle proxy
/// --upstream` does: `/v1` is added, so the same URL reaches the same
/// server everywhere; a base with a path is used as it is.
#[tokio::test]
async fn a_bare_origin_is_given_v1() {
    let (url, _up) = upstream(&[FINAL, FINAL], 0, 7).await;
    let origin = url.trim_end_matches("/v1").to_string();
    for base in [origin.clone(), format!("{origin}/")] {
        let agent = Agent::new(&base, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
        let events = collect(&agent, "x", CancellationToken::new()).await;
        let (reason, text, _, _) = end(&events);
        assert_eq!((reason, text.as_str()), (StopReason::Answer, FINAL), "{base}");
    }
    assert_eq!(spindle::sources::ChatClient::new(origin).endpoint(), format!("{url}/chat/completions"));
    let versioned = "https://open.bigmodel.cn/api/paas/v4/";
    assert_eq!(
        spindle::sources::ChatClient::new(versioned).endpoint(),
        "https://open.bigmodel.cn/api/paas/v4/chat/completions"
    );
}

#[tokio::test]
async fn upstream_errors_end_the_run() {
    let agent = Agent::new("http://127.0.0.1:9/v1", runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let events = collect(&agent, "x", CancellationToken::new()).await;
    let Some((_, AgentEvent::End { reason, detail, .. })) = events.last() else { panic!() };
    assert_eq!(*reason, StopReason::Upstream);
    assert!(detail.as_deref().unwrap_or_default().contains("cannot reach"), "{detail:?}");
}

#[tokio::test]
async fn cancelling_stops_the_upstream_and_the_tools() {
    let marker = format!("spindle-agent-cancel-{}", std::process::id());
    let turn1 = format!(
        "<|[REQUEST_TOOL]|>\ncommand:»»»Forker«««\nmarker:»»»{marker}«««\n<|[END_TOOL]|>\n<|[REQUEST_TOOL]|>\ncommand:»»»Hang«««\nmarker:»»»{marker}«««\n<|[END_TOOL]|>{}",
        " slow tail".repeat(100)
    );
    // 40 characters every 20 ms: both blocks complete within ~150 ms, the
    // tail streams on for ~0.5 s; Hang (400 ms limit) is running at 250 ms.
    let (url, up) = upstream(&[&turn1, FINAL], 20, 40).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(250)).await;
        c2.cancel();
    });
    let started = Instant::now();
    let events = collect(&agent, "x", cancel).await;
    assert!(started.elapsed() < Duration::from_secs(3));
    let (reason, _, _, _) = end(&events);
    assert_eq!(reason, StopReason::Cancelled);
    let outcomes: Vec<(String, Outcome)> = events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::ToolResult { result, .. } => Some((result.tool_id.clone(), result.outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        [("Forker".to_string(), Outcome::Success), ("Hang".to_string(), Outcome::Cancelled)],
        "Hang was running when the run was cancelled"
    );
    let deadline = Instant::now() + Duration::from_secs(3);
    while !up.dropped.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the upstream response was not dropped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_no_process(&marker).await;
}

#[tokio::test]
async fn spindle_agent_against_the_built_in_mock() {
    // The mock picks each turn's transcript by what the last message holds:
    // the prompt names `sum-question`, the observations name the tools.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mock = spindle::mock::MockUpstream::from_dir(&root.join("examples/agent-demo"))
        .unwrap_or_else(|e| panic!("{e}"))
        .with_pace(Duration::from_millis(2));
    let server = mock.spawn("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["agent", "--upstream", &format!("{}/v1", server.url().trim_end_matches('/'))])
        .args(["--model", "mock", "--protocol", "tam", "--format", "jsonl"])
        .arg("--tools")
        .arg(root.join("examples/plugins"))
        .arg("sum-question: what is 2 + 40?")
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> = stdout.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let kinds = |t: &str| lines.iter().filter(|l| l["type"] == t).count();
    assert_eq!((kinds("turn_start"), kinds("turn_end"), kinds("tool_result")), (3, 3, 2));
    let end = lines.last().cloned().unwrap_or_default();
    assert_eq!(end["type"], "agent_end");
    assert_eq!(end["reason"], "answer");
    assert!(end["text"].as_str().unwrap_or_default().starts_with("Both tools answered: 2 + 40 is 42"));
    let messages = end["messages"].as_array().cloned().unwrap_or_default();
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant", "user", "assistant"]);
    assert_eq!(messages[3]["content"], "Observation: Tool Math.Add executed successfully. Result: 42");
    assert!(
        messages[5]["content"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Observation: Tool Sleepy executed successfully.")
    );
    let _ = server.shutdown().await;
}

/// `spindle agent --tool-path`: the tools' `PATH` (and where their bare
/// program names are found).
#[tokio::test]
async fn spindle_agent_takes_the_tools_path() {
    let program = process_support::PrivateProgram::new();
    let (url, up) = upstream(&[&tam_call("Where", &[]), FINAL], 0, 20).await;
    let agent = |flag: Option<String>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
        cmd.args(["agent", "--upstream", &url, "--model", "m", "--protocol", "tam", "--format", "jsonl"])
            .arg("--tools")
            .arg(&program.plugins)
            .arg("where?")
            .env("PATH", "/usr/bin:/bin");
        if let Some(p) = flag {
            cmd.args(["--tool-path", &p]);
        }
        cmd.output()
    };
    let out = agent(Some(program.path())).await.unwrap_or_else(|e| panic!("{e}"));
    let result = first_tool_result(&out);
    assert_eq!(result["result"], json!({"found": "yes", "path": program.path()}), "{result}");
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(requests[1]["messages"][3]["content"].as_str().unwrap_or_default().contains("\"found\":\"yes\""));
}

/// Spec 000 §3.2: an async tool's result is reported when it is done.
/// `spindle agent --async-tasks wait` waits for it before asking again,
/// so the final answer leaves no task behind; with `continue` (the
/// default) an answer without a call ends the run and stops the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spindle_agent_async_tasks_wait_reports_every_result() {
    let render = tam_call("Image.Render", &[("prompt", "owl"), ("seconds", "1.0")]);
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins");
    let run = |mode: &'static str| {
        let plugins = plugins.clone();
        let render = render.clone();
        async move {
            let (url, up) = upstream(&[&render, FINAL], 0, 20).await;
            let out = spindle_agent_jsonl(&url, &plugins, &["--async-tasks", mode], "draw an owl").await;
            assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
            let lines: Vec<Value> =
                String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
            (lines, requests)
        }
    };
    let (lines, requests) = run("wait").await;
    let end = lines.last().cloned().unwrap_or_default();
    assert_eq!((end["type"].as_str(), end["reason"].as_str()), (Some("agent_end"), Some("answer")), "{end}");
    assert_eq!(end["detail"], Value::Null, "no task was left to stop");
    assert_eq!(requests.len(), 2);
    let observations = requests[1]["messages"][3]["content"].as_str().unwrap_or_default().to_string();
    assert!(
        observations.contains(
            "Task task_1 finished. Observation: Tool Image.Render executed successfully. Result: {\"rendered\":\"owl\"}"
        ),
        "{observations}"
    );
    let task =
        lines.iter().find(|l| l["type"] == "tool_result" && l["task_id"] == "task_1" && l["outcome"] == "success");
    assert!(task.is_some(), "{lines:?}");

    // The default: the final answer comes while the task runs; it is stopped.
    let (lines, _) = run("continue").await;
    let end = lines.last().cloned().unwrap_or_default();
    assert_eq!(end["reason"], "answer");
    assert_eq!(end["detail"], "1 async task(s) still running were stopped");
}

#[tokio::test]
async fn async_tool_results_come_back_in_a_later_turn_or_at_once() {
    let call = "Render it.\n<|[REQUEST_TOOL]|>\ncommand:»»»Image.Render«««\nprompt:»»»owl«««\nseconds:»»»0.2«««\n<|[END_TOOL]|>";
    // Wait: the result is in the first turn's observations.
    let (url, up) = upstream(&[call, FINAL], 0, 20).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_async_tasks(spindle::tools::agent::AsyncTasks::Wait);
    let (reason, _, turns, _) = end(&collect(&agent, "draw", CancellationToken::new()).await);
    assert_eq!((reason, turns), (StopReason::Answer, 2));
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(
        requests[1]["messages"][3]["content"],
        "Observation: Tool Image.Render started asynchronously. Task id: task_1. Its result will be reported when it completes.\nTask task_1 finished. Observation: Tool Image.Render executed successfully. Result: {\"rendered\":\"owl\"}"
    );
    // Continue: the model goes on; the result comes with a later turn.
    let wait = "Meanwhile.\n<|[REQUEST_TOOL]|>\ncommand:»»»Sleepy«««\nseconds:»»»1.0«««\n<|[END_TOOL]|>";
    let (url, up) = upstream(&[call, wait, FINAL], 0, 20).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let (reason, _, turns, _) = end(&collect(&agent, "draw", CancellationToken::new()).await);
    assert_eq!((reason, turns), (StopReason::Answer, 3));
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    let second = requests[1]["messages"][3]["content"].as_str().unwrap_or_default().to_string();
    assert!(second.starts_with("Observation: Tool Image.Render started asynchronously."), "{second}");
    assert!(!second.contains("finished"), "{second}");
    let third = requests[2]["messages"][5]["content"].as_str().unwrap_or_default().to_string();
    assert!(third.contains("Task task_1 finished. Observation: Tool Image.Render executed successfully."), "{third}");
}

/// The tool-call budget counts what ran: an async task once (when it
/// starts, not again when its result comes), and a repeated `request_id`
/// not at all (nothing ran).
#[tokio::test]
async fn the_budget_counts_a_task_once_and_a_repeat_not_at_all() {
    let render = "Render it.\n<|[REQUEST_TOOL]|>\ncommand:»»»Image.Render«««\nprompt:»»»owl«««\nseconds:»»»0.1«««\nrequest_id:»»»r1«««\n<|[END_TOOL]|>";
    let (url, _) = upstream(&[render, render, TAM_TURN_1, FINAL], 0, 20).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_async_tasks(spindle::tools::agent::AsyncTasks::Wait)
        .with_limits(AgentLimits { max_tool_calls: 2, ..AgentLimits::default() });
    let events = collect(&agent, "draw", CancellationToken::new()).await;
    let (reason, _, turns, _) = end(&events);
    assert_eq!((reason, turns), (StopReason::Answer, 4), "{:?}", end_detail(&events));
    let results = tool_results(&events);
    let outcomes: Vec<(Outcome, Option<&str>)> = results.iter().map(|r| (r.outcome, r.repeat_of.as_deref())).collect();
    assert_eq!(
        outcomes,
        [
            (Outcome::Pending, None),
            (Outcome::Success, None),
            (Outcome::Pending, Some("t1_call_1")),
            (Outcome::Success, None)
        ]
    );
    assert_eq!(results[3].tool_id, "Math.Add");
}

/// `--protocol attp`: the model's code runs in the sandbox, its tool calls
/// as steps, and the observations go back as one user message.
#[tokio::test]
async fn attp_code_runs_and_its_observations_go_back() {
    let turn = "thought = \"\"\"Add them.\"\"\"\n\n[tool_call]\nstatus = \"success\"\ntarget = \"sum\"\ncode = '''\n__result__ = {\"sum\": Add(2, b=40)}\n'''\n";
    let (url, up) = upstream(&[turn, FINAL], 0, 9).await;
    let agent = Agent::new(&url, runner(), Protocol::Attp).unwrap_or_else(|e| panic!("{e}"));
    let events = collect(&agent, "What is 2 + 40?", CancellationToken::new()).await;
    let (reason, _, turns, _) = end(&events);
    let results = tool_results(&events);
    assert_eq!((reason, turns), (StopReason::Answer, 2), "{results:?}");
    let got: Vec<(&str, Outcome)> = results.iter().map(|r| (r.tool_id.as_str(), r.outcome)).collect();
    assert_eq!(got, [("Math.Add", Outcome::Success), ("python", Outcome::Success)]);
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert!(requests[0]["messages"][0]["content"].as_str().unwrap_or_default().contains("def Add(a: int, b: int)"));
    assert_eq!(
        requests[1]["messages"][3]["content"],
        "Observation: Tool Math.Add executed successfully. Result: 42\nObservation: Tool python executed successfully. Result: {\"sum\":42}"
    );
}

/// `spindle agent --protocol tam --format jsonl` against `url`, with the
/// tools of `plugins` on the fixed system PATH, `extra` flags and `prompt`.
async fn spindle_agent_jsonl(url: &str, plugins: &Path, extra: &[&str], prompt: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["agent", "--upstream", url, "--model", "m", "--protocol", "tam", "--format", "jsonl"])
        .args(extra)
        .args(["--tool-path", RunnerOptions::FALLBACK_PATH])
        .arg("--tools")
        .arg(plugins)
        .arg(prompt)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tam_call(tool: &str, params: &[(&str, &str)]) -> String {
    let params: String = params.iter().map(|(k, v)| format!("{k}:»»»{v}«««\n")).collect();
    format!("On it.\n<|[REQUEST_TOOL]|>\ncommand:»»»{tool}«««\n{params}<|[END_TOOL]|>")
}

/// Every `tool_result` event of a run.
fn tool_results(events: &[(Instant, AgentEvent)]) -> Vec<spindle::tools::ToolResult> {
    events
        .iter()
        .filter_map(|(_, e)| match e {
            AgentEvent::ToolResult { result, .. } => Some(result.clone()),
            _ => None,
        })
        .collect()
}

fn end_detail(events: &[(Instant, AgentEvent)]) -> Option<String> {
    match events.last().map(|(_, e)| e) {
        Some(AgentEvent::End { detail, .. }) => detail.clone(),
        other => panic!("no end: {other:?}"),
    }
}

/// The security review's case: two runs at once on one shared runner (as
/// the proxy serves two clients). Alice's async task finishes while Bob's
/// run is between turns; it must reach Alice's conversation and never
/// Bob's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runs_on_one_runner_get_only_their_own_tasks() {
    let runner = runner();
    let render = tam_call("Image.Render", &[("prompt", "ALICE-PRIVATE-PROMPT"), ("seconds", "0.1")]);
    let alice_wait = tam_call("Sleepy", &[("seconds", "2.0")]);
    let (alice_url, alice_up) = upstream(&[&render, &alice_wait, FINAL], 0, 50).await;
    let bob_wait = tam_call("Sleepy", &[("seconds", "1.0")]);
    let (bob_url, bob_up) = upstream(&[&bob_wait, FINAL], 0, 50).await;
    let alice = Agent::new(&alice_url, runner.clone(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let bob = Agent::new(&bob_url, runner.clone(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = tokio::join!(
        collect(&alice, "draw", CancellationToken::new()),
        collect(&bob, "chat", CancellationToken::new())
    );
    assert_eq!(end(&a).0, StopReason::Answer);
    assert_eq!(end(&b).0, StopReason::Answer);
    // Bob: no task result among his events, nothing of Alice's upstream.
    assert!(tool_results(&b).iter().all(|r| r.task_id.is_none()), "{:?}", tool_results(&b));
    let bob_requests = bob_up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(bob_requests.len(), 2);
    for r in &bob_requests {
        assert!(!r.to_string().contains("ALICE-PRIVATE-PROMPT"), "Bob's request carries Alice's task: {r}");
    }
    assert_eq!(end_detail(&b), None);
    // Alice: her task's result comes back to her with her next turn.
    let alice_requests = alice_up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    assert_eq!(alice_requests.len(), 3);
    let third = alice_requests[2]["messages"][5]["content"].as_str().unwrap_or_default().to_string();
    assert!(
        third.contains("Task task_1 finished. Observation: Tool Image.Render executed successfully. Result: {\"rendered\":\"ALICE-PRIVATE-PROMPT\"}"),
        "{third}"
    );
}

/// Set once a process with `marker` has been seen (so that a check that
/// none is left is not vacuous).
fn watch_for(marker: &str) -> Arc<AtomicBool> {
    let seen = Arc::new(AtomicBool::new(false));
    let (flag, marker) = (seen.clone(), marker.to_string());
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !processes_with(&marker).is_empty() {
                flag.store(true, Ordering::SeqCst);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ends_stops_its_running_tasks_and_says_so() {
    // An answer with no call ends the run while the task still runs (a
    // 60 s render; a second turn's 1 s call gives its process time to show).
    let marker = format!("spindle-agent-task-answer-{}", std::process::id());
    let render = tam_call("Image.Render", &[("prompt", "p"), ("seconds", "60"), ("marker", &marker)]);
    let meanwhile = tam_call("Sleepy", &[("seconds", "1.0")]);
    let (url, _up) = upstream(&[&render, &meanwhile, FINAL], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam).unwrap_or_else(|e| panic!("{e}"));
    let seen = watch_for(&marker);
    let started = Instant::now();
    let events = collect(&agent, "draw", CancellationToken::new()).await;
    assert!(started.elapsed() < Duration::from_secs(8), "the run waited for its task");
    assert!(seen.load(Ordering::SeqCst), "the task's process never ran");
    assert_eq!(end(&events).0, StopReason::Answer);
    assert_eq!(end_detail(&events).as_deref(), Some("1 async task(s) still running were stopped"));
    let results = tool_results(&events);
    let last = results.last().unwrap_or_else(|| panic!("no results"));
    assert_eq!((last.outcome, last.task_id.as_deref()), (Outcome::Cancelled, Some("task_1")));
    assert!(last.observation.contains("was stopped before it finished"), "{}", last.observation);
    assert_no_process(&marker).await;

    // The time budget ends the run while a call of a later turn runs.
    let marker = format!("spindle-agent-task-budget-{}", std::process::id());
    let render = tam_call("Image.Render", &[("prompt", "p"), ("seconds", "60"), ("marker", &marker)]);
    let slow = tam_call("Sleepy", &[("seconds", "5")]);
    let (url, _up) = upstream(&[&render, &slow], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_limits(AgentLimits { max_time: Some(Duration::from_millis(1500)), ..AgentLimits::default() });
    let seen = watch_for(&marker);
    let events = collect(&agent, "draw", CancellationToken::new()).await;
    assert!(seen.load(Ordering::SeqCst), "the task's process never ran");
    assert_eq!(end(&events).0, StopReason::TimeBudget);
    assert_eq!(end_detail(&events).as_deref(), Some("1 async task(s) still running were stopped"));
    assert_no_process(&marker).await;

    // Waiting for tasks: a cancel ends the wait, and the task.
    let marker = format!("spindle-agent-task-wait-{}", std::process::id());
    let render = tam_call("Image.Render", &[("prompt", "p"), ("seconds", "60"), ("marker", &marker)]);
    let (url, _up) = upstream(&[&render, FINAL], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::Tam)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_async_tasks(spindle::tools::agent::AsyncTasks::Wait);
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let m2 = marker.clone();
    tokio::spawn(async move {
        // Once the task runs.
        let deadline = Instant::now() + Duration::from_secs(5);
        while processes_with(&m2).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c2.cancel();
    });
    let started = Instant::now();
    let events = collect(&agent, "draw", cancel).await;
    assert!(started.elapsed() < Duration::from_secs(6), "the wait outlived the cancel");
    assert_eq!(end(&events).0, StopReason::Cancelled);
    assert_eq!(end_detail(&events).as_deref(), Some("1 async task(s) still running were stopped"));
    assert_no_process(&marker).await;
}

#[tokio::test]
async fn the_system_prompt_placeholder_becomes_the_manual() {
    let (url, up) = upstream(&[FINAL], 0, 50).await;
    let agent = Agent::new(&url, runner(), Protocol::TamCjk).unwrap_or_else(|e| panic!("{e}"));
    let req = json!({"model": "m", "messages": [
        {"role": "system", "content": "You are a helper.\n## Tools\n{{{system:available_tools}}}\n## End"},
        {"role": "user", "content": "hi"}
    ]});
    let mut s = std::pin::pin!(agent.run(req, CancellationToken::new()));
    while s.next().await.is_some() {}
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    let system = requests[0]["messages"][0]["content"].as_str().unwrap_or_default().to_string();
    assert!(system.starts_with("You are a helper.\n## Tools\nTo call a tool, write a TAM block."), "{system}");
    assert!(system.contains("command:「始」Math.Add「末」"), "{system}");
    assert!(system.ends_with("## End"), "{system}");
    assert_eq!(requests[0]["messages"].as_array().map(Vec::len), Some(2));
}

/// An agent's tool list (spec 002 §4.4.1, spec 004 §3.3): with `--only`,
/// the manual in the system prompt shows those tools alone, and a call of
/// another tool of the folder is an unknown tool, never run; an id the
/// folder does not have is refused with the closest one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spindle_agent_only_runs_the_tools_of_its_list() {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins");
    let (url, up) = upstream(&[&tam_call("Math.Add", &[("a", "1"), ("b", "2")]), FINAL], 0, 20).await;
    let out = spindle_agent_jsonl(&url, &plugins, &["--only", "Echo,Greet"], "add 1 and 2").await;
    let result = first_tool_result(&out);
    assert_ne!(result["outcome"], "success", "{result}");
    assert!(result["observation"].as_str().unwrap_or_default().contains("Math.Add"), "{result}");
    let requests = up.requests.lock().map(|r| r.clone()).unwrap_or_default();
    let system = requests[0]["messages"][0]["content"].as_str().unwrap_or_default().to_string();
    assert!(system.contains("Tool ID: Echo") && system.contains("Tool ID: Greet"), "{system}");
    assert!(!system.contains("Tool ID: Math.Add"), "{system}");

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["agent", "--upstream", &url, "--model", "m", "--only", "Ech"])
        .arg("--tools")
        .arg(&plugins)
        .arg("hi")
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--only") && err.contains("unknown tool id \"Ech\", did you mean \"Echo\"?"), "{err}");
}

/// The first `tool_result` event a successful `spindle agent --format
/// jsonl` printed.
fn first_tool_result(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "tool_result")
        .unwrap_or_else(|| panic!("{stdout}"))
}
