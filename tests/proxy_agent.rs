//! The agent loop behind the proxy (`--tool-protocol P --tools DIR
//! --agent`): a plain request in, the final answer of a tool conversation
//! out, with the real script tools of `examples/plugins/basic`, a scripted
//! upstream model (a real axum server on 127.0.0.1:0 that answers turn N
//! with the N-th transcript and records every request), the proxy as a
//! real server and, when `.ci/cache/venv` has it, the official `openai`
//! Python client.

mod proxy_support;

mod process_support;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use process_support::processes_with;
use proxy_support::{ProxyProcess, chat_bytes, chat_json, chunks, client, content, url};
use serde_json::{Value, json};
use spindle::Registry;
use spindle::calls::ToolCatalog;
use spindle::proxy::{ProxyAgent, ProxyConfig, ProxyHandle, ProxyServer, ToolCalling};
use spindle::sources::StreamOptions;
use spindle::tools::agent::AgentLimits;
use spindle::tools::{Protocol, Runner};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
struct Script {
    turns: Arc<Vec<String>>,
    /// Turns for a conversation whose first user message is this text
    /// (many clients, each with its own script); `turns` for the others.
    by_prompt: Arc<Vec<(String, Vec<String>)>>,
    requests: Arc<Mutex<Vec<Value>>>,
    /// Answer with this status and no stream.
    fail: Option<u16>,
}

/// Turn N (the number of assistant messages in the request) is the N-th
/// text (of the conversation's script), streamed in 5-character pieces.
async fn chat(State(s): State<Script>, body: String) -> Response {
    let req: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let turn = req["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count());
    let user = req["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let turns = s.by_prompt.iter().find(|(p, _)| p == user).map_or(&s.turns[..], |(_, t)| &t[..]);
    let text = turns.get(turn).or(turns.last()).cloned().unwrap_or_default();
    s.requests.lock().map(|mut r| r.push(req)).unwrap_or(());
    if let Some(status) = s.fail {
        return Response::builder()
            .status(status)
            .body(Body::from(r#"{"error":{"message":"down for maintenance"}}"#))
            .unwrap_or_default();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut sse = String::new();
    for piece in chars.chunks(5) {
        let piece: String = piece.iter().collect();
        let c = json!({"id": "up", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
        sse.push_str(&format!("data: {c}\n\n"));
    }
    let end = json!({"id": "up", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}});
    sse.push_str(&format!("data: {end}\n\ndata: [DONE]\n\n"));
    Response::builder().header("content-type", "text/event-stream").body(Body::from(sse)).unwrap_or_default()
}

async fn upstream(turns: &[&str], fail: Option<u16>) -> (String, Arc<Mutex<Vec<Value>>>) {
    upstream_by_prompt(turns, &[], fail).await
}

/// An upstream with a script of its own for each first user message.
async fn upstream_by_prompt(
    turns: &[&str],
    by_prompt: &[(&str, &[&str])],
    fail: Option<u16>,
) -> (String, Arc<Mutex<Vec<Value>>>) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let owned = |t: &[&str]| t.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    let script = Script {
        turns: Arc::new(owned(turns)),
        by_prompt: Arc::new(by_prompt.iter().map(|(p, t)| (p.to_string(), owned(t))).collect()),
        requests: requests.clone(),
        fail,
    };
    let app = Router::new().route("/v1/chat/completions", post(chat)).with_state(script);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), requests)
}

async fn agent_proxy(upstream: &str, protocol: Protocol) -> ProxyHandle {
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/basic");
    let catalog = ToolCatalog::load_plugins(&plugins).unwrap();
    let mut config = ProxyConfig::new(upstream);
    let tc = ToolCalling::new(protocol);
    config.options = StreamOptions::with_registry(Registry::profile(tc.default_profile()).unwrap());
    config.tool_calling = Some(tc);
    config.agent = Some(
        ProxyAgent::new(Arc::new(Runner::new(catalog)))
            .with_limits(AgentLimits { max_steps: 4, ..AgentLimits::default() }),
    );
    ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn()
}

const HERMES: [&str; 2] = [
    "<think>I should add.</think>Let me add them.\n<tool_call>\n{\"name\": \"Math.Add\", \"arguments\": {\"a\": 2, \"b\": 40}}\n</tool_call>",
    "The sum is 42.",
];

fn request(stream: bool) -> Value {
    json!({"model": "m", "stream": stream, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "What is 2 + 40?"}]})
}

/// The `spindle` extension objects of a stream, in order.
fn steps(body: &[u8]) -> Vec<Value> {
    chunks(body).into_iter().filter_map(|c| c.get("spindle").cloned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_request_gets_the_final_answer_of_the_tool_conversation() {
    let (up, recorded) = upstream(&HERMES, None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));

    // Streamed.
    let response = client().post(&endpoint).json(&request(true)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let body = response.bytes().await.unwrap();
    assert_eq!(content(&body), "Let me add them.\n\nThe sum is 42.");
    assert!(!String::from_utf8_lossy(&body).contains("<tool_call>"), "call text left out");
    let all = chunks(&body);
    let reasoning: String = all.iter().filter_map(|c| c["choices"][0]["delta"]["reasoning_content"].as_str()).collect();
    assert_eq!(reasoning, "I should add.");
    let steps = steps(&body);
    let kinds: Vec<&str> = steps.iter().filter_map(|s| s["type"].as_str()).collect();
    assert_eq!(kinds, ["tool_call", "tool_result", "agent_end"]);
    assert_eq!(steps[0]["call"]["steps"][0]["tool_id"], "Math.Add", "{}", steps[0]);
    assert_eq!(steps[1]["ok"], true, "{}", steps[1]);
    assert!(steps[1]["observation"].as_str().unwrap_or_default().ends_with("Result: 42"), "{}", steps[1]);
    assert_eq!((steps[2]["reason"].as_str(), steps[2]["turns"].as_u64()), (Some("answer"), Some(2)));
    let finish: Vec<&str> = all.iter().filter_map(|c| c["choices"][0]["finish_reason"].as_str()).collect();
    assert_eq!(finish, ["stop"]);
    let usage = all.last().map(|c| c["usage"].clone()).unwrap_or_default();
    assert_eq!(usage["total_tokens"], 30, "two turns' usage added up");
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));

    // The second upstream request carried the manual, the call and the
    // observation in the protocol's text form.
    {
        let requests = recorded.lock().unwrap();
        assert_eq!(requests.len(), 2);
        let system = requests[0]["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(system.contains("Math.Add") && system.contains("<tool_call>"), "{system}");
        assert!(requests[0].get("tools").is_none());
        let second = requests[1]["messages"].to_string();
        assert!(second.contains("<tool_response>") && second.contains("42"), "{second}");
    }

    // Whole.
    let response = client().post(&endpoint).json(&request(false)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let whole: Value = response.json().await.unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["content"], "Let me add them.\n\nThe sum is 42.");
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], "I should add.");
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    assert_eq!(whole["usage"]["total_tokens"], 30);
    assert_eq!(whole["spindle"]["reason"], "answer");
    assert_eq!(whole["spindle"]["steps"].as_array().map(Vec::len), Some(2));
    proxy.shutdown().await.unwrap();
}

/// The inspector shows each turn's elements in boxes of their own: a
/// turn's element ids start again at 0, and a `turn_start` mark comes
/// before each turn's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_marks_each_turn() {
    let (up, _) = upstream(&HERMES, None).await;
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/basic");
    let mut config = ProxyConfig::new(&up);
    let tc = ToolCalling::new(Protocol::Hermes);
    config.options = StreamOptions::with_registry(Registry::profile(tc.default_profile()).unwrap());
    config.tool_calling = Some(tc);
    config.agent = Some(ProxyAgent::new(Arc::new(Runner::new(ToolCatalog::load_plugins(&plugins).unwrap()))));
    config.ui = Some(spindle::proxy::UiConfig { listen: "127.0.0.1:0".into(), ..Default::default() });
    let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn();
    let response =
        client().post(format!("{}/v1/chat/completions", url(&proxy))).json(&request(false)).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let ui = format!("http://{}/ui/api", proxy.ui_addr().unwrap());
    let list: Value = client().get(format!("{ui}/streams")).send().await.unwrap().json().await.unwrap();
    let id = list[0]["id"].as_u64().unwrap();
    let one: Value = client().get(format!("{ui}/streams/{id}")).send().await.unwrap().json().await.unwrap();
    let events = one["events"].as_array().cloned().unwrap_or_default();
    let marks: Vec<(usize, u64)> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["type"] == "turn_start")
        .map(|(i, e)| (i, e["turn"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(marks.iter().map(|m| m.1).collect::<Vec<_>>(), [1, 2], "{events:?}");
    let answer = events.iter().position(|e| e["type"] == "element" && e["text"] == "The sum is 42.");
    assert!(answer.is_some_and(|a| a > marks[1].0), "turn 2's answer after its mark: {events:?}");
    proxy.shutdown().await.unwrap();
}

/// A web page's cross-site "simple" request (`text/plain`, no preflight)
/// and a DNS-rebinding page's same-origin one must not make the proxy ask
/// the model, let alone run a tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_site_or_rebinding_request_runs_no_tool() {
    let (up, recorded) = upstream(&HERMES, None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));
    let port = proxy.local_addr().port();
    let rebound = format!("rebind.attacker.example:{port}");
    for (host, origin, code) in [
        (format!("127.0.0.1:{port}"), "http://attacker.example".to_string(), "origin_not_allowed"),
        (rebound.clone(), format!("http://{rebound}"), "host_not_allowed"),
    ] {
        let response = client()
            .post(&endpoint)
            .header("host", host)
            .header("origin", origin)
            .header("content-type", "text/plain")
            .body(request(false).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 403);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{body}");
    }
    assert!(recorded.lock().unwrap().is_empty(), "the model was asked");
    // The same request without a browser's Origin is served.
    let response = client().post(&endpoint).body(request(false).to_string()).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(recorded.lock().unwrap().len(), 2);
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_leaves_while_a_tool_runs_ends_the_run() {
    let call = "<tool_call>\n{\"name\": \"Sleepy\", \"arguments\": {\"seconds\": 60}}\n</tool_call>";
    let (up, _) = upstream(&[call, "done"], None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));
    let mut response = client().post(&endpoint).json(&request(true)).send().await.unwrap();
    // Read up to the call's step: the tool is running now.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("\"tool_call\"") {
        match response.chunk().await.unwrap() {
            Some(bytes) => seen.extend_from_slice(&bytes),
            None => panic!("the stream ended before the call: {}", String::from_utf8_lossy(&seen)),
        }
    }
    assert_eq!(proxy.metrics().requests_active(), 1);
    drop(response);
    // The run (and the tool's 60 seconds) ends with the client.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while proxy.metrics().requests_active() > 0 {
        assert!(std::time::Instant::now() < deadline, "the run outlived its client");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tam_and_action_models_run_the_loop_too() {
    let tam = "<|[REQUEST_TOOL]|>\ncommand:»»»Math.Add«««\na:»»»1«««\nb:»»»2«««\n<|[END_TOOL]|>";
    let action = "<ACTION><Math.Add><a>1</a><b>2</b></Math.Add></ACTION>";
    for (protocol, first) in [(Protocol::Tam, tam), (Protocol::Action, action)] {
        let (up, recorded) = upstream(&[first, "It is 3."], None).await;
        let proxy = agent_proxy(&up, protocol).await;
        let endpoint = format!("{}/v1/chat/completions", url(&proxy));
        let whole: Value = client().post(&endpoint).json(&request(false)).send().await.unwrap().json().await.unwrap();
        assert_eq!(whole["choices"][0]["message"]["content"], "It is 3.", "{protocol}: {whole}");
        let steps = whole["spindle"]["steps"].as_array().cloned().unwrap_or_default();
        let kinds: Vec<&str> = steps.iter().filter_map(|s| s["type"].as_str()).collect();
        assert_eq!(kinds, ["tool_call", "tool_result"], "{protocol}: {whole}");
        assert_eq!(steps[1]["ok"], true, "{protocol}: {whole}");
        assert_eq!(steps[1]["result"], 3, "{protocol}: {whole}");
        assert_eq!(recorded.lock().unwrap().len(), 2, "{protocol}");
        proxy.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_its_own_tools_gets_them_as_tool_calls() {
    let (up, recorded) = upstream(&HERMES, None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let mut req = request(true);
    req["tools"] = json!([{"type": "function", "function": {"name": "Math.Add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]);
    let body = chat_bytes(&url(&proxy), &req).await;
    let all = chunks(&body);
    assert!(all.iter().any(|c| c["choices"][0]["delta"]["tool_calls"].is_array()), "tool_calls for the client");
    assert!(all.iter().all(|c| c.get("spindle").is_none()));
    assert_eq!(recorded.lock().unwrap().len(), 1, "the proxy ran nothing");
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_failure_before_any_output_is_a_502() {
    let (up, _) = upstream(&HERMES, Some(503)).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    for stream in [true, false] {
        let response =
            client().post(format!("{}/v1/chat/completions", url(&proxy))).json(&request(stream)).send().await.unwrap();
        assert_eq!(response.status(), 502, "stream {stream}");
        let err: Value = response.json().await.unwrap();
        assert_eq!(err["error"]["code"], "agent_upstream_failed");
        assert!(err["error"]["message"].as_str().unwrap_or_default().contains("503"), "{err}");
    }
    proxy.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_agent_needs_a_tool_protocol() {
    let catalog =
        ToolCatalog::load_plugins(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/basic")).unwrap();
    let mut config = ProxyConfig::new("http://127.0.0.1:9");
    config.agent = Some(ProxyAgent::new(Arc::new(Runner::new(catalog))));
    let err = ProxyServer::bind(config, "127.0.0.1:0").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("--tool-protocol"), "{err}");
}

/// The official `openai` Python client, `base_url` changed only, streams
/// and reads the whole answer; the `spindle` steps reach it as an extra
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_gets_the_final_answer() {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/cache/venv/bin/python");
    let ok =
        std::process::Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: no openai client in .ci/cache/venv (.ci/run installs it)");
        return;
    }
    let (up, _) = upstream(&HERMES, None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_agent.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", url(&proxy))])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    proxy.shutdown().await.unwrap();
}

/// The README's example: the mock's `agent-demo-hermes` script behind the
/// agent proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_against_the_scripted_mock() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agent-demo");
    let mock = spindle::mock::MockUpstream::from_dir(&dir).unwrap().spawn("127.0.0.1:0").await.unwrap();
    let proxy = agent_proxy(&mock.url(), Protocol::Hermes).await;
    let req = json!({"model": "agent-demo-hermes", "messages": [{"role": "user", "content": "What is 2 + 40?"}]});
    let whole: Value = chat_json(&url(&proxy), &req).await;
    assert_eq!(
        whole["choices"][0]["message"]["content"],
        "Let me add them with the calculator.\n\nThe calculator says 2 + 40 = 42.",
        "{whole}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[1]["messages"].to_string().contains("Result: 42"));
    proxy.shutdown().await.unwrap();
    mock.shutdown().await.unwrap();
}

fn hermes_call(tool: &str, arguments: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": tool, "arguments": arguments}))
}

/// A whole (not streamed) agent request with this user message and key.
async fn ask(endpoint: &str, key: &str, prompt: &str) -> Value {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": prompt}]});
    let response = client().post(endpoint).bearer_auth(key).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The `tool_result` steps of a whole agent response.
fn results_of(whole: &Value) -> Vec<Value> {
    let steps = whole["spindle"]["steps"].as_array().cloned().unwrap_or_default();
    steps.into_iter().filter(|s| s["type"] == "tool_result").collect()
}

/// The security review's case through the real proxy: Alice's async task
/// finishes while Bob's request is between turns. It comes back to Alice
/// and never to Bob (his answer, his steps, what his upstream requests
/// carried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_async_task_never_reaches_another_client() {
    let alice = [
        hermes_call("Image.Render", json!({"prompt": "ALICE-PRIVATE-PROMPT", "seconds": 0.1})),
        hermes_call("Sleepy", json!({"seconds": 2.0})),
        "Alice is done.".to_string(),
    ];
    let bob = [hermes_call("Sleepy", json!({"seconds": 1.0})), "Bob is done.".to_string()];
    let alice: Vec<&str> = alice.iter().map(String::as_str).collect();
    let bob: Vec<&str> = bob.iter().map(String::as_str).collect();
    let (up, recorded) =
        upstream_by_prompt(&["nobody's"], &[("alice asks", &alice[..]), ("bob asks", &bob[..])], None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));
    let (a, b) = tokio::join!(ask(&endpoint, "sk-ALICE", "alice asks"), ask(&endpoint, "sk-BOB", "bob asks"));

    assert!(!b.to_string().contains("ALICE-PRIVATE-PROMPT"), "Bob got Alice's task: {b}");
    assert_eq!(b["choices"][0]["message"]["content"], "Bob is done.");
    assert!(results_of(&b).iter().all(|r| r.get("task_id").is_none()), "{b}");
    assert_eq!(b["spindle"]["detail"], Value::Null);
    let requests = recorded.lock().unwrap().clone();
    let of = |who: &str| -> Vec<Value> {
        requests.iter().filter(|r| r["messages"].to_string().contains(who)).cloned().collect()
    };
    assert_eq!(of("bob asks").len(), 2);
    for r in of("bob asks") {
        assert!(!r.to_string().contains("ALICE-PRIVATE-PROMPT"), "Bob's upstream request: {r}");
    }
    // Alice's own task came back to her, in her next turn.
    assert_eq!(a["choices"][0]["message"]["content"], "Alice is done.");
    let task = results_of(&a).into_iter().find(|r| r["task_id"] == "task_1" && r["outcome"] == "success");
    assert_eq!(task.map(|t| t["result"].clone()), Some(json!({"rendered": "ALICE-PRIVATE-PROMPT"})), "{a}");
    assert_eq!(of("alice asks").len(), 3);
    assert!(of("alice asks")[2]["messages"].to_string().contains("Task task_1 finished."));
    proxy.shutdown().await.unwrap();
}

/// An async task still running when its request's loop ends is killed
/// with it (not left to run to its own time limit outside the request),
/// and the response says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_task_does_not_outlive_its_request() {
    use std::time::{Duration, Instant};
    let marker = format!("spindle-proxy-agent-task-{}", std::process::id());
    let turns = [
        hermes_call("Image.Render", json!({"prompt": "p", "seconds": 60, "marker": marker})),
        // A second turn's call: time for the task's process to show.
        hermes_call("Sleepy", json!({"seconds": 1.0})),
        "Done.".to_string(),
    ];
    let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
    let (up, _) = upstream(&turns, None).await;
    let proxy = agent_proxy(&up, Protocol::Hermes).await;
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, m) = (seen.clone(), marker.clone());
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && processes_with(&m).is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        flag.store(!processes_with(&m).is_empty(), std::sync::atomic::Ordering::SeqCst);
    });
    let whole = ask(&endpoint, "sk-x", "draw").await;
    assert!(seen.load(std::sync::atomic::Ordering::SeqCst), "the task's process never ran");
    assert_eq!(whole["choices"][0]["message"]["content"], "Done.");
    assert_eq!(whole["spindle"]["detail"], "1 async task(s) still running were stopped");
    let last = results_of(&whole).pop().unwrap_or_default();
    assert_eq!((last["task_id"].as_str(), last["outcome"].as_str()), (Some("task_1"), Some("cancelled")), "{whole}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while !processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "left running: {:?}", processes_with(&marker));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.shutdown().await.unwrap();
}

/// `spindle proxy --tool-path`: the PATH of the agent's tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_process_takes_the_tools_path() {
    let program = process_support::PrivateProgram::new();
    let turns = [hermes_call("Where", json!({})), "Done.".to_string()];
    let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
    let (up, _) = upstream(&turns, None).await;
    let plugins = program.plugins.display().to_string();
    let tool_path = program.path();
    let args =
        ["--upstream", &up, "--tool-protocol", "hermes", "--agent", "--tools", &plugins, "--tool-path", &tool_path];
    let proxy = ProxyProcess::start(&args, "/usr/bin:/bin").await;
    let whole = ask(&format!("{}/v1/chat/completions", proxy.base), "sk-x", "where?").await;
    let result = results_of(&whole).pop().unwrap_or_default();
    assert_eq!(result["result"], json!({"found": "yes", "path": program.path()}), "{whole}");
    assert_eq!(whole["choices"][0]["message"]["content"], "Done.");
}

/// `spindle proxy --agent-async-tasks wait`: the loop waits for an async
/// tool's task before asking again, so its result reaches the model and
/// the final answer leaves nothing running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_process_can_wait_for_async_tasks() {
    let turns = [hermes_call("Image.Render", json!({"prompt": "owl", "seconds": 1.0})), "Done.".to_string()];
    let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/basic").display().to_string();
    let path = spindle::tools::RunnerOptions::FALLBACK_PATH;
    for (mode, detail) in [("wait", Value::Null), ("continue", json!("1 async task(s) still running were stopped"))] {
        let (up, recorded) = upstream(&turns, None).await;
        let args = [
            "--upstream",
            &up,
            "--tool-protocol",
            "hermes",
            "--agent",
            "--tools",
            &plugins,
            "--agent-async-tasks",
            mode,
        ];
        let proxy = ProxyProcess::start(&args, path).await;
        let whole = ask(&format!("{}/v1/chat/completions", proxy.base), "sk-x", "draw").await;
        assert_eq!(whole["choices"][0]["message"]["content"], "Done.", "{mode}");
        assert_eq!(whole["spindle"]["detail"], detail, "{mode}: {whole}");
        let requests = recorded.lock().unwrap().clone();
        let fed_back = requests[1]["messages"].to_string().contains("Task task_1 finished.");
        assert_eq!(fed_back, mode == "wait", "{mode}: {}", requests[1]["messages"]);
    }
}
