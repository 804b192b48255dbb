//! `spindle proxy --tool-protocol` against the real mock upstream serving
//! `corpora/tools/*` (text-protocol answers), with a recorder in front of
//! the mock so that the tests see what the upstream received: tool calls
//! come back as `tool_calls` (streamed and whole, paced and unpaced), the
//! upstream gets the manual and the history as text, and every bad input
//! of issue 12 has its defined answer. The official `openai` Python
//! client runs the same conversation when `.ci/cache/venv` has it.

mod proxy_support;

use axum::body::Body;
use axum::extract::Request;
use axum::middleware::Next;
use proxy_support::*;
use serde_json::{Value, json};
use spindle::Registry;
use spindle::mock::MockUpstream;
use spindle::proxy::{InvalidCalls, ProxyHandle, ToolCalling};
use spindle::sources::StreamOptions;
use spindle::tools::Protocol;
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Recorded = Arc<Mutex<Vec<Value>>>;

/// The mock serving `corpora/`, every request body it receives recorded.
async fn recording_mock(pace_ms: u64) -> (String, Recorded) {
    let recorded: Recorded = Arc::default();
    let rec = recorded.clone();
    let mock = MockUpstream::from_dir(&corpora()).expect("corpora load").with_pace(Duration::from_millis(pace_ms));
    let router = mock.router().layer(axum::middleware::from_fn(move |req: Request, next: Next| {
        let rec = rec.clone();
        async move {
            let (parts, body) = req.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap_or_default();
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                rec.lock().unwrap().push(v);
            }
            next.run(Request::from_parts(parts, Body::from(bytes))).await
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}"), recorded)
}

async fn tool_proxy(upstream: &str, protocol: Protocol, invalid: InvalidCalls) -> ProxyHandle {
    let calling = ToolCalling { protocol, invalid_calls: invalid };
    let registry = Registry::profile(calling.default_profile()).unwrap();
    proxy(upstream, move |c| {
        c.options = StreamOptions::with_registry(registry);
        c.tool_calling = Some(calling);
    })
    .await
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_current_weather", "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "state": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "final_answer", "description": "Ends the task",
            "parameters": {"type": "object", "properties": {"trigger": {"type": "boolean"}}}}},
        {"type": "function", "function": {"name": "write_file", "description": "Writes a file",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}}
    ])
}

fn ask(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "tools": tools(),
        "messages": [{"role": "user", "content": "What is the weather?"}]})
}

/// What a response said: content, calls (name, parsed arguments, id),
/// finish reason.
#[derive(Debug)]
struct Answer {
    content: String,
    calls: Vec<(String, Value, String)>,
    finish: String,
}

fn read_answer(body: &[u8], stream: bool) -> Answer {
    if !stream {
        let v: Value = serde_json::from_slice(body).unwrap();
        let choice = &v["choices"][0];
        let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
        return Answer {
            content: choice["message"]["content"].as_str().unwrap_or_default().to_string(),
            calls: calls
                .iter()
                .map(|c| {
                    assert_eq!(c["type"], "function");
                    let args = c["function"]["arguments"].as_str().unwrap();
                    let args = serde_json::from_str(args).unwrap_or(Value::String(args.into()));
                    (c["function"]["name"].as_str().unwrap().to_string(), args, c["id"].as_str().unwrap().into())
                })
                .collect(),
            finish: choice["finish_reason"].as_str().unwrap_or_default().to_string(),
        };
    }
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = String::new();
    for chunk in chunks(body) {
        for choice in chunk["choices"].as_array().cloned().unwrap_or_default() {
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_string();
            }
            for d in choice["delta"]["tool_calls"].as_array().cloned().unwrap_or_default() {
                let index = d["index"].as_u64().unwrap() as usize;
                if index == calls.len() {
                    // The first fragment of a call: id, type and name.
                    assert_eq!(d["type"], "function", "{d}");
                    calls.push((
                        d["function"]["name"].as_str().unwrap().into(),
                        String::new(),
                        d["id"].as_str().unwrap().into(),
                    ));
                } else {
                    assert!(d.get("id").is_none() && d["function"].get("name").is_none(), "{d}");
                }
                calls[index].1 += d["function"]["arguments"].as_str().unwrap_or_default();
            }
        }
    }
    Answer {
        content: content(body),
        calls: calls
            .into_iter()
            .map(|(n, a, id)| (n, serde_json::from_str(&a).unwrap_or(Value::String(a)), id))
            .collect(),
        finish,
    }
}

async fn post(proxy: &ProxyHandle, body: &Value) -> (u16, Vec<u8>) {
    let r = client().post(format!("{}/v1/chat/completions", url(proxy))).json(body).send().await.unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

fn no_call_text(content: &str) {
    for marker in ["<tool_call", "</tool_call>", "REQUEST_TOOL", "END_TOOL", "<ACTION", "</ACTION>"] {
        assert!(!content.contains(marker), "call text {marker} in content {content:?}");
    }
}

/// The file `tools/hermes-close-in-string` writes.
const NOTES: &str = "# Calls\n\nA call ends with </tool_call> on its own line; then wait for <tool_response>.\n";

/// The calls a transcript makes: (name, arguments).
type Calls = Vec<(&'static str, Value)>;

/// (transcript, protocol, calls, the manual's mark in the system message)
fn cases() -> Vec<(&'static str, Protocol, Calls, &'static str)> {
    let w = "get_current_weather";
    vec![
        (
            "tools/hermes-weather",
            Protocol::Hermes,
            vec![(w, json!({"city": "Dallas", "state": "TX", "unit": "fahrenheit"}))],
            "<tools>",
        ),
        (
            "tools/hermes-parallel",
            Protocol::Hermes,
            vec![
                (w, json!({"city": "Tokyo", "state": "", "unit": "celsius"})),
                (w, json!({"city": "Osaka", "state": "", "unit": "celsius"})),
            ],
            "<tools>",
        ),
        ("tools/hermes-until-eos", Protocol::Hermes, vec![("final_answer", json!({"trigger": true}))], "<tools>"),
        (
            "tools/hermes-two-in-one",
            Protocol::Hermes,
            vec![(w, json!({"city": "Tokyo", "unit": "celsius"})), (w, json!({"city": "Osaka", "unit": "celsius"}))],
            "<tools>",
        ),
        ("tools/glm-weather", Protocol::Hermes, vec![(w, json!({"city": "Oslo", "unit": "celsius"}))], "<tools>"),
        // A file about tool calls: `</tool_call>` inside the value written.
        (
            "tools/hermes-close-in-string",
            Protocol::Hermes,
            vec![("write_file", json!({"path": "notes/calls.md", "content": NOTES}))],
            "<tools>",
        ),
        (
            "tools/qwen-coder-close-in-value",
            Protocol::Hermes,
            vec![(
                "write_file",
                json!({"path": "notes/calls.md", "content": "# Calls\n\nA call ends with\n</tool_call>\non its own line."}),
            )],
            "<tools>",
        ),
        (
            "tools/hermes-arguments-string",
            Protocol::Hermes,
            vec![(w, json!({"city": "Paris", "unit": "celsius"}))],
            "<tools>",
        ),
        (
            "tools/filament-weather",
            Protocol::Filament,
            vec![(w, json!({"city": "Oslo", "unit": "celsius"}))],
            "<tool_call name=",
        ),
        (
            "tools/tam-weather",
            Protocol::Tam,
            vec![(w, json!({"city": "Oslo", "unit": "celsius"})), (w, json!({"city": "Rome"}))],
            "- Tool ID: get_current_weather",
        ),
        ("tools/action-weather", Protocol::Action, vec![(w, json!({"city": "Oslo", "unit": "celsius"}))], "<ACTION>"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_gives_tool_calls_streamed_and_whole_paced_and_not() {
    for pace in [0, 2] {
        let (upstream, recorded) = recording_mock(pace).await;
        for ((model, protocol, want, mark), invalid) in
            cases().into_iter().flat_map(|c| [(c.clone(), InvalidCalls::Pass), (c, InvalidCalls::Drop)])
        {
            let proxy = tool_proxy(&upstream, protocol, invalid).await;
            for stream in [true, false] {
                let (status, body) = post(&proxy, &ask(model, stream)).await;
                assert_eq!(status, 200, "{model}: {}", String::from_utf8_lossy(&body));
                let answer = read_answer(&body, stream);
                let got: Vec<(&str, &Value)> = answer.calls.iter().map(|(n, a, _)| (n.as_str(), a)).collect();
                let want_ref: Vec<(&str, &Value)> = want.iter().map(|(n, a)| (*n, a)).collect();
                assert_eq!(got, want_ref, "{model} stream={stream} pace={pace} {invalid:?}");
                assert_eq!(answer.finish, "tool_calls", "{model} stream={stream}");
                no_call_text(&answer.content);
                let ids: std::collections::BTreeSet<&str> = answer.calls.iter().map(|c| c.2.as_str()).collect();
                assert_eq!(ids.len(), answer.calls.len(), "unique ids");
                let sent = recorded.lock().unwrap().last().cloned().unwrap();
                assert!(sent.get("tools").is_none() && sent.get("tool_choice").is_none());
                let system = sent["messages"][0]["content"].as_str().unwrap_or_default();
                assert_eq!(sent["messages"][0]["role"], "system");
                assert!(system.contains(mark) && system.contains("get_current_weather"), "{model}: {system}");
            }
            proxy.shutdown().await.unwrap();
        }
    }
}

/// The client's second request, with the calls and their results, reaches
/// the upstream as the protocol's call and observation text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_reaches_the_upstream_as_protocol_text() {
    let (upstream, recorded) = recording_mock(0).await;
    let cases: [(Protocol, &str, &str); 4] = [
        (
            Protocol::Hermes,
            "<tool_call>\n{\"name\":\"get_current_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>",
            "<tool_response>\n12°C, rain\n</tool_response>",
        ),
        (
            Protocol::Filament,
            "<tool_call name=\"get_current_weather\">{\"city\":\"Oslo\"}</tool_call>",
            "<tool_result name=\"get_current_weather\" call_id=\"call_a\">Observation: Tool get_current_weather executed successfully. Result: 12°C, rain</tool_result>",
        ),
        (
            Protocol::Tam,
            "<|[REQUEST_TOOL]|>\ncommand:»»»get_current_weather«««\ncity:»»»Oslo«««\n<|[END_TOOL]|>",
            "Observation: Tool get_current_weather executed successfully. Result: 12°C, rain",
        ),
        (
            Protocol::Action,
            "<city>Oslo</city>",
            "Observation: Tool get_current_weather executed successfully. Result: 12°C, rain",
        ),
    ];
    for (protocol, call_text, observation) in cases {
        let proxy = tool_proxy(&upstream, protocol, InvalidCalls::Pass).await;
        let body = json!({"model": "tools/hermes-weather", "stream": true, "tools": tools(), "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function",
                "function": {"name": "get_current_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "12°C, rain"}]});
        let (status, _) = post(&proxy, &body).await;
        assert_eq!(status, 200);
        let sent = recorded.lock().unwrap().last().cloned().unwrap();
        let msgs = sent["messages"].as_array().cloned().unwrap();
        assert_eq!(msgs.len(), 4, "{protocol}: {msgs:?}");
        assert!(msgs[0]["content"].as_str().unwrap().starts_with("You are terse.\n\n"), "manual after the system text");
        assert_eq!(msgs[2]["role"], "assistant");
        assert!(msgs[2].get("tool_calls").is_none());
        assert!(msgs[2]["content"].as_str().unwrap().contains(call_text), "{protocol}: {}", msgs[2]["content"]);
        assert_eq!(
            (msgs[3]["role"].as_str(), msgs[3]["content"].as_str()),
            (Some("user"), Some(observation)),
            "{protocol}"
        );
        proxy.shutdown().await.unwrap();
    }
}

/// A request with the legacy `functions` (and `function_call`) is
/// translated as one with `tools`, and its answer speaks the legacy API:
/// the first call as `function_call` (streamed: name, then argument
/// fragments), finish reason `function_call`, never `tool_calls`. Its
/// history's `function_call` and `role: "function"` reach the upstream as
/// protocol text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_functions_get_function_call() {
    let (upstream, recorded) = recording_mock(0).await;
    let functions: Vec<Value> = tools().as_array().unwrap().iter().map(|t| t["function"].clone()).collect();
    for invalid in [InvalidCalls::Pass, InvalidCalls::Drop] {
        let proxy = tool_proxy(&upstream, Protocol::Hermes, invalid).await;
        for (model, city) in [("tools/hermes-weather", "Dallas"), ("tools/hermes-parallel", "Tokyo")] {
            for stream in [true, false] {
                let body = json!({"model": model, "stream": stream, "functions": functions, "function_call": "auto",
                    "messages": [{"role": "user", "content": "What is the weather?"}]});
                let (status, bytes) = post(&proxy, &body).await;
                assert_eq!(status, 200, "{model}: {}", String::from_utf8_lossy(&bytes));
                assert!(!String::from_utf8_lossy(&bytes).contains("tool_calls"), "{model} stream={stream}");
                let (name, args, finish, content) = if stream {
                    let (mut name, mut args, mut finish) = (None, String::new(), String::new());
                    for chunk in chunks(&bytes) {
                        let choice = &chunk["choices"][0];
                        if let Some(f) = choice["finish_reason"].as_str() {
                            finish = f.to_string();
                        }
                        let call = &choice["delta"]["function_call"];
                        if let Some(n) = call["name"].as_str() {
                            assert!(name.is_none() && args.is_empty(), "the name comes once, first");
                            name = Some(n.to_string());
                        }
                        args += call["arguments"].as_str().unwrap_or_default();
                    }
                    (name, args, finish, content(&bytes))
                } else {
                    let v: Value = serde_json::from_slice(&bytes).unwrap();
                    let choice = &v["choices"][0];
                    let call = &choice["message"]["function_call"];
                    (
                        call["name"].as_str().map(str::to_string),
                        call["arguments"].as_str().unwrap_or_default().to_string(),
                        choice["finish_reason"].as_str().unwrap_or_default().to_string(),
                        choice["message"]["content"].as_str().unwrap_or_default().to_string(),
                    )
                };
                let label = format!("{model} stream={stream} {invalid:?}");
                assert_eq!(name.as_deref(), Some("get_current_weather"), "{label}");
                let args: Value = serde_json::from_str(&args).unwrap();
                assert_eq!(args["city"], city, "{label}: the first call only");
                assert_eq!(finish, "function_call", "{label}");
                no_call_text(&content);
                if model.ends_with("parallel") {
                    assert!(content.contains("only one function call per answer"), "{label}: {content:?}");
                }
                let sent = recorded.lock().unwrap().last().cloned().unwrap();
                assert!(sent.get("functions").is_none() && sent.get("function_call").is_none(), "{sent}");
                let system = sent["messages"][0]["content"].as_str().unwrap_or_default();
                assert!(system.contains("<tools>") && system.contains("Call at most one tool per answer."));
            }
        }
        proxy.shutdown().await.unwrap();
    }
    let proxy = tool_proxy(&upstream, Protocol::Hermes, InvalidCalls::Pass).await;
    let body = json!({"model": "tools/hermes-weather", "functions": functions, "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": null,
            "function_call": {"name": "get_current_weather", "arguments": "{\"city\":\"Oslo\"}"}},
        {"role": "function", "name": "get_current_weather", "content": "12°C, rain"}]});
    assert_eq!(post(&proxy, &body).await.0, 200);
    let sent = recorded.lock().unwrap().last().cloned().unwrap();
    let msgs = sent["messages"].as_array().cloned().unwrap();
    assert_eq!(
        msgs[2],
        json!({"role": "assistant", "content": "<tool_call>\n{\"name\":\"get_current_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>"})
    );
    assert_eq!(msgs[3], json!({"role": "user", "content": "<tool_response>\n12°C, rain\n</tool_response>"}));
    // Both tools and functions: 400 invalid_tools, nothing sent upstream.
    let before = recorded.lock().unwrap().len();
    let mut both = ask("tools/hermes-weather", false);
    both["functions"] = Value::Array(functions);
    let (status, text) = post(&proxy, &both).await;
    let err: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        (status, &err["error"]["code"], &err["error"]["param"]),
        (400, &json!("invalid_tools"), &json!("functions"))
    );
    assert_eq!(recorded.lock().unwrap().len(), before);
    proxy.shutdown().await.unwrap();
}

/// A tool request is never passed on untranslated for the form of its
/// body: one with a UTF-8 byte order mark, or gzip-compressed, reaches the
/// upstream translated (and plain); one in an encoding the proxy does not
/// decode is refused, nothing sent upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bom_or_gzip_tool_request_is_translated() {
    use std::io::Write;
    let (upstream, recorded) = recording_mock(0).await;
    let proxy = tool_proxy(&upstream, Protocol::Hermes, InvalidCalls::Pass).await;
    let json = serde_json::to_vec(&ask("tools/hermes-weather", false)).unwrap();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(&json);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bom).unwrap();
    let gz = gz.finish().unwrap();
    let send = |body: Vec<u8>, encoding: Option<&'static str>| {
        let mut request = client()
            .post(format!("{}/v1/chat/completions", url(&proxy)))
            .header("content-type", "application/json")
            .body(body);
        if let Some(encoding) = encoding {
            request = request.header("content-encoding", encoding);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.bytes().await.unwrap().to_vec())
        }
    };
    for (body, encoding) in [(bom, None), (gz.clone(), Some("gzip"))] {
        let before = recorded.lock().unwrap().len();
        let (status, bytes) = send(body, encoding).await;
        assert_eq!(status, 200, "{encoding:?}: {}", String::from_utf8_lossy(&bytes));
        let answer = read_answer(&bytes, false);
        assert_eq!((answer.calls.len(), answer.finish.as_str()), (1, "tool_calls"), "{encoding:?}");
        // Recorded only when the upstream could read it as JSON.
        assert_eq!(recorded.lock().unwrap().len(), before + 1, "{encoding:?}");
        let sent = recorded.lock().unwrap().last().cloned().unwrap();
        assert!(sent.get("tools").is_none() && sent["messages"][0]["role"] == "system", "{sent}");
    }
    let before = recorded.lock().unwrap().len();
    let (status, bytes) = send(gz, Some("br")).await;
    let err: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!((status, &err["error"]["code"]), (415, &json!("unsupported_request_encoding")), "{err}");
    assert!(err["error"]["message"].as_str().unwrap().contains("uncompressed"), "{err}");
    assert_eq!(recorded.lock().unwrap().len(), before);
    proxy.shutdown().await.unwrap();
}

/// Bad input, each with its defined answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_has_defined_answers() {
    let (upstream, recorded) = recording_mock(0).await;
    let pass = tool_proxy(&upstream, Protocol::Hermes, InvalidCalls::Pass).await;
    let drop = tool_proxy(&upstream, Protocol::Hermes, InvalidCalls::Drop).await;
    for stream in [true, false] {
        // A name not in tools: passed as written, or dropped with a did-you-mean.
        let a = read_answer(&post(&pass, &ask("tools/hermes-unknown-tool", stream)).await.1, stream);
        assert_eq!((a.calls[0].0.as_str(), a.finish.as_str()), ("get_current_wether", "tool_calls"));
        let a = read_answer(&post(&drop, &ask("tools/hermes-unknown-tool", stream)).await.1, stream);
        assert!(a.calls.is_empty() && a.finish == "stop", "{a:?}");
        assert!(a.content.contains("Unknown tool ID 'get_current_wether', did you mean 'get_current_weather'?"));
        // Cut off by max_tokens: pass keeps what was streamed, drop says why.
        let a = read_answer(&post(&pass, &ask("tools/hermes-truncated", stream)).await.1, stream);
        assert_eq!(a.finish, "length");
        let a = read_answer(&post(&drop, &ask("tools/hermes-truncated", stream)).await.1, stream);
        assert!(a.calls.is_empty() && a.finish == "length" && a.content.contains("cut off"), "{a:?}");
        // Arguments that never become JSON: the Malformed observation.
        for proxy in [&pass, &drop] {
            let a = read_answer(&post(proxy, &ask("tools/hermes-bad-json", stream)).await.1, stream);
            assert!(a.content.contains("Observation: Error - Malformed <tool_call>"), "{a:?}");
            assert!(!a.content.contains("[city = Oslo"), "the call text is not content: {a:?}");
        }
        let a = read_answer(&post(&drop, &ask("tools/hermes-bad-json", stream)).await.1, stream);
        assert!(a.calls.is_empty() && a.finish == "stop", "{a:?}");
        // A call in a code fence is an example: text, no call.
        let a = read_answer(&post(&pass, &ask("tools/hermes-fenced-example", stream)).await.1, stream);
        assert!(a.calls.is_empty() && a.finish == "stop", "{a:?}");
        assert!(a.content.contains("```\n<tool_call>\n{\"name\": \"get_current_weather\""), "{a:?}");
        // tool_choice none: no manual, the answer as written.
        let mut body = ask("tools/hermes-weather", stream);
        body["tool_choice"] = json!("none");
        let a = read_answer(&post(&pass, &body).await.1, stream);
        assert!(a.calls.is_empty() && a.content.contains("<tool_call>"), "{a:?}");
        let sent = recorded.lock().unwrap().last().cloned().unwrap();
        assert_eq!(sent["messages"].as_array().map(Vec::len), Some(1), "no manual: {sent}");
        // tool_choice required and named: the instruction is in the manual.
        body["tool_choice"] = json!("required");
        let a = read_answer(&post(&pass, &body).await.1, stream);
        assert_eq!(a.calls.len(), 1);
        let sent = recorded.lock().unwrap().last().cloned().unwrap();
        assert!(sent["messages"][0]["content"].as_str().unwrap().contains("You must call at least one"));
        body["tool_choice"] = json!({"type": "function", "function": {"name": "final_answer"}});
        let a = read_answer(&post(&drop, &body).await.1, stream);
        assert!(a.calls.is_empty(), "a call of a tool other than the named one is invalid: {a:?}");
        assert!(a.content.contains("Unknown tool ID 'get_current_weather'"), "{a:?}");
        let sent = recorded.lock().unwrap().last().cloned().unwrap();
        let system = sent["messages"][0]["content"].as_str().unwrap();
        assert!(system.contains("You must call the tool final_answer") && !system.contains("get_current_weather"));
    }
    // Invalid tools from the client: 400 invalid_tools, nothing sent upstream.
    let before = recorded.lock().unwrap().len();
    let mut body = ask("tools/hermes-weather", true);
    body["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "nonsense"}}}}}]);
    let (status, text) = post(&pass, &body).await;
    let err: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!(
        (status, &err["error"]["code"], &err["error"]["param"]),
        (400, &json!("invalid_tools"), &json!("tools"))
    );
    assert_eq!(recorded.lock().unwrap().len(), before);
    // A schema nested past what JSON readers take (128 levels): the same,
    // never passed on untranslated.
    let mut schema = json!({"type": "string"});
    for _ in 0..70 {
        schema = json!({"type": "object", "properties": {"a": schema}});
    }
    body["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": schema}}]);
    let (status, text) = post(&pass, &body).await;
    let err: Value = serde_json::from_slice(&text).unwrap();
    assert_eq!((status, &err["error"]["param"]), (400, &json!("tools")), "{err}");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("deeper than 128"), "{err}");
    assert_eq!(recorded.lock().unwrap().len(), before);
    // No tools: pass-through, byte for byte what the upstream sent.
    let plain =
        json!({"model": "tools/hermes-weather", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let direct = client().post(format!("{upstream}/v1/chat/completions")).json(&plain).send().await.unwrap();
    let direct = direct.bytes().await.unwrap();
    assert_eq!(post(&pass, &plain).await.1, direct.to_vec());
    assert_eq!(recorded.lock().unwrap().last().cloned().unwrap(), plain);
    pass.shutdown().await.unwrap();
    drop.shutdown().await.unwrap();
}

/// The official `openai` Python client (from `.ci/cache/venv`), with only
/// `base_url` changed: `tools/check_tools.py` asserts on what it receives;
/// this test asserts on what the upstream received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_client_does_tool_calling_through_the_proxy() {
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/cache/venv/bin/python");
    let ok =
        std::process::Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!(
            "skipped: no openai client in .ci/cache/venv (.ci/run installs it: python3 -m venv .ci/cache/venv && .ci/cache/venv/bin/pip install openai)"
        );
        return;
    }
    for pace in [0, 2] {
        let (upstream, recorded) = recording_mock(pace).await;
        for protocol in [Protocol::Hermes, Protocol::Filament, Protocol::Tam, Protocol::Action] {
            let proxy = tool_proxy(&upstream, protocol, InvalidCalls::Pass).await;
            let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_tools.py");
            let out = tokio::process::Command::new(&python)
                .arg(&script)
                .args(["--base-url", &format!("{}/v1", url(&proxy)), "--protocol", protocol.as_str()])
                .output()
                .await
                .unwrap();
            assert!(
                out.status.success(),
                "{protocol}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            eprintln!("openai client, {protocol}, pace {pace} ms:\n{}", String::from_utf8_lossy(&out.stdout));
            // The client's second request carried the observation as text.
            let last = recorded.lock().unwrap().last().cloned().unwrap();
            let text = last["messages"].to_string();
            assert!(text.contains("Sunny, 22") && !text.contains("\"role\":\"tool\""), "{protocol}: {text}");
            proxy.shutdown().await.unwrap();
        }
    }
}

/// Hermes cases drawn from vLLM's and SGLang's hermes tool-parser tests
/// (`corpora/tools/hermes-*`: a call with thinking and text before it,
/// parallel calls, a call until EOS with no `</tool_call>`, arguments as a
/// JSON string, no call) through `spindle parse`, whole and at 1 and 7
/// bytes: the `call_delta` events give the name first and argument
/// fragments that join to the element's arguments.
#[test]
fn hermes_parser_cases_through_spindle_parse() {
    let w = "get_current_weather";
    let cases: Vec<(&str, Vec<(&str, Value)>)> = vec![
        ("hermes-weather", vec![(w, json!({"city": "Dallas", "state": "TX", "unit": "fahrenheit"}))]),
        (
            "hermes-parallel",
            vec![
                (w, json!({"city": "Tokyo", "state": "", "unit": "celsius"})),
                (w, json!({"city": "Osaka", "state": "", "unit": "celsius"})),
            ],
        ),
        ("hermes-until-eos", vec![("final_answer", json!({"trigger": true}))]),
        ("hermes-arguments-string", vec![(w, json!({"city": "Paris", "unit": "celsius"}))]),
        ("hermes-no-call", vec![]),
        ("hermes-close-in-string", vec![("write_file", json!({"path": "notes/calls.md", "content": NOTES}))]),
    ];
    for (file, want) in cases {
        let path = corpora().join("tools").join(format!("{file}.txt"));
        for chunk in [None, Some("1"), Some("7")] {
            let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
            cmd.arg("parse").arg(&path).args(["--profile", "chat", "--format", "jsonl"]);
            if let Some(n) = chunk {
                cmd.args(["--chunk-size", n]);
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let events: Vec<Value> =
                String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
            // (id, name, joined fragments), in order of first sight.
            let mut calls: Vec<(u64, String, String)> = Vec::new();
            for e in &events {
                if e["type"] != "call_delta" {
                    continue;
                }
                let id = e["id"].as_u64().unwrap();
                match calls.iter_mut().find(|c| c.0 == id) {
                    Some(c) => {
                        assert!(e.get("name").is_none(), "the name comes once, first: {e}");
                        c.2 += e["arguments"].as_str().unwrap();
                    }
                    None => {
                        calls.push((id, e["name"].as_str().unwrap().into(), e["arguments"].as_str().unwrap().into()))
                    }
                }
            }
            let got: Vec<(String, Value)> =
                calls.iter().map(|(_, n, a)| (n.clone(), serde_json::from_str(a).unwrap_or(Value::Null))).collect();
            let want: Vec<(String, Value)> = want.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
            assert_eq!(got, want, "{file} at chunk size {chunk:?}");
            for (id, name, _) in &calls {
                let el = events.iter().find(|e| e["type"] == "element" && e["id"].as_u64() == Some(*id)).unwrap();
                assert_eq!(el["payload"]["name"].as_str(), Some(name.as_str()));
            }
        }
    }
}
