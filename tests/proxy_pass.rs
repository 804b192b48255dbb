//! The proxy in pass-through and rewrite mode against real local servers
//! on 127.0.0.1:0: responses identical to direct access (streamed and
//! not, every transcript of `corpora/`), requests forwarded unchanged,
//! rewriting that keeps ids, sinks that get every element, `/metrics`,
//! `/healthz`, and the mock upstream's own surface.

mod proxy_support;

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use proxy_support::*;
use serde_json::{Value, json};
use spindle::proxy::{ProxyHandle, SinkRecord, SinkSpec};
use spindle::sources::{SourceEvent, StreamOptions, StreamTap};
use spindle::{Parser, ParserOptions, Registry};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Headers a client may depend on, compared between direct and proxied.
const HEADERS: [&str; 5] = ["content-type", "content-length", "x-request-id", "x-mock-transcript", "cache-control"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_through_is_identical_to_direct_access_for_every_transcript() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |_| {}).await;
    let models: Value = client().get(format!("{}/v1/models", mock.url())).send().await.unwrap().json().await.unwrap();
    let names: Vec<String> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
    assert!(names.len() >= 60, "{} transcripts", names.len());
    let http = client();
    let mut compared = 0;
    for name in &names {
        for stream in [true, false] {
            let body = request(name, stream);
            let direct = http.post(format!("{}/v1/chat/completions", mock.url())).json(&body).send().await.unwrap();
            let proxied = http
                .post(format!("{}/v1/chat/completions", url(&proxy)))
                .header("authorization", "Bearer sk-test")
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(direct.status(), proxied.status(), "{name} stream={stream}");
            for h in HEADERS {
                if stream && h == "cache-control" {
                    continue;
                }
                assert_eq!(direct.headers().get(h), proxied.headers().get(h), "{name} stream={stream} header {h}");
            }
            if stream && direct.status().is_success() {
                assert_eq!(proxied.headers()["cache-control"], "no-cache");
                assert_eq!(proxied.headers()["x-accel-buffering"], "no");
                assert!(proxied.headers().get("content-encoding").is_none());
            }
            let (d, p) = (direct.bytes().await.unwrap(), proxied.bytes().await.unwrap());
            let ended = datas(&d).iter().any(|x| x.trim() == "[DONE]");
            if !stream || ended {
                assert!(d == p, "{name} stream={stream}: proxied body differs from direct");
            } else {
                // A stream the upstream cut: the same bytes (but an
                // unfinished last line), then the proxy's error event and
                // [DONE].
                let whole_lines = d.iter().rposition(|b| *b == b'\n' || *b == b'\r').map_or(0, |i| i + 1);
                assert!(p.starts_with(&d[..whole_lines]), "{name}");
                let tail = datas(&p[whole_lines..]);
                let upstream_error = datas(&d).iter().any(|x| x.contains("\"error\""));
                assert!(upstream_error || tail.iter().any(|t| t.contains("upstream_truncated")), "{name}: {tail:?}");
                assert_eq!(tail.last().map(String::as_str), Some("[DONE]"), "{name}");
            }
            compared += 1;
        }
    }
    assert_eq!(compared, names.len() * 2);
    let text = metrics(&proxy).await;
    assert!(sample(&text, "spindle_proxy_streams_total") >= names.len() as f64, "{text}");
    assert_eq!(sample(&text, "spindle_proxy_streams_active"), 0.0);
    proxy.shutdown().await.unwrap();
}

/// An upstream that answers with what it received.
async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let mut names: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in &headers {
        names.entry(k.to_string()).or_default().push(v.to_str().unwrap_or("?").to_string());
    }
    let reply = json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": names,
        "body": String::from_utf8_lossy(&body),
    });
    (
        StatusCode::IM_A_TEAPOT,
        axum::response::AppendHeaders([
            ("x-upstream", "yes"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("connection", "x-drop-me"),
            ("x-drop-me", "1"),
        ]),
        axum::Json(reply),
    )
}

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn requests_and_responses_are_forwarded_unchanged() {
    let upstream = serve(Router::new().fallback(echo)).await;
    let proxy = proxy(&upstream, |_| {}).await;
    let http = client();
    for (method, path, body) in [
        (Method::POST, "/v1/chat/completions?api-version=2024-10-21&x=%20y", r#"{"model":"m","messages":[]}"#),
        (Method::GET, "/v1/models", ""),
        (Method::DELETE, "/v1/files/file-abc", ""),
        (Method::POST, "/v1/embeddings", r#"{"input":"héllo"}"#),
    ] {
        let response = http
            .request(method.clone(), format!("{}{path}", url(&proxy)))
            .header("authorization", "Bearer sk-secret")
            .header("openai-organization", "org-1")
            .header("x-custom", "one")
            .header("connection", "x-hop")
            .header("x-hop", "must not pass")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::IM_A_TEAPOT, "{path}");
        assert_eq!(response.headers()["x-upstream"], "yes");
        let cookies: Vec<_> = response.headers().get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(response.headers().get("x-drop-me").is_none(), "a header named by Connection is hop-by-hop");
        let seen: Value = response.json().await.unwrap();
        assert_eq!(seen["method"], method.as_str());
        let (p, q) = path.split_once('?').unwrap_or((path, ""));
        assert_eq!(seen["path"], p);
        assert_eq!(seen["query"], if q.is_empty() { Value::Null } else { json!(q) });
        assert_eq!(seen["body"], body);
        assert_eq!(seen["headers"]["authorization"], json!(["Bearer sk-secret"]));
        assert_eq!(seen["headers"]["openai-organization"], json!(["org-1"]));
        assert_eq!(seen["headers"]["x-custom"], json!(["one"]));
        assert!(seen["headers"].get("x-hop").is_none(), "{seen}");
    }
    // An upstream path that names an API version is the API's base (as an
    // SDK's base_url): it takes the place of the request's /v1, so one
    // ending in /v1 does not get a second one, and providers whose version
    // is not v1 are reached. Any other path is a prefix.
    for (base, want) in [
        ("/v1/", "/v1/models"),
        ("/api/paas/v4", "/api/paas/v4/models"),
        ("/v1beta/openai", "/v1beta/openai/models"),
        ("/llm", "/llm/v1/models"),
    ] {
        let prefixed = proxy_support::proxy(&format!("{upstream}{base}"), |_| {}).await;
        let seen: Value =
            http.get(format!("{}/v1/models?a=1", url(&prefixed))).send().await.unwrap().json().await.unwrap();
        assert_eq!((seen["path"].as_str(), seen["query"].as_str()), (Some(want), Some("a=1")), "{base}");
    }
    // Paths outside /v1 are not proxied.
    let r = http.get(format!("{}/admin", url(&proxy))).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let err: Value = r.json().await.unwrap();
    assert_eq!((err["error"]["code"].as_str(), err["error"]["side"].as_str()), (Some("not_found"), Some("downstream")));
    // Nor are paths that would climb out of the API's base once resolved
    // (an HTTP client normalises them, so they go out as written, on a
    // socket of our own); the upstream never sees them.
    let based = proxy_support::proxy(&format!("{upstream}/api/v1"), |_| {}).await;
    for path in ["/v1/../../admin", "/v1/%2e%2E/%2e%2e/admin", "/v1/.%2e/x", "/v1/..\\..\\admin", "/v1/./models"] {
        let head = raw_get(based.local_addr(), path).await;
        assert!(head.starts_with("HTTP/1.1 404"), "{path}: {head}");
        assert!(!head.contains("x-upstream"), "{path} reached the upstream: {head}");
    }
    // A dot inside a segment is a name like any other.
    let head = raw_get(based.local_addr(), "/v1/models/gpt-4.1..mini").await;
    assert!(head.contains("x-upstream: yes"), "{head}");
}

/// The response head of `GET path`, sent as written.
async fn raw_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    socket.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response);
    text.split("\r\n\r\n").next().unwrap_or_default().to_string()
}

/// The corrected text of a whole content, by the parser itself.
fn oracle_rewrite(text: &str) -> String {
    let options = ParserOptions { rewrite: true, ..ParserOptions::default() };
    let mut parser = Parser::with_options(Arc::new(Registry::filament()), options);
    let _ = parser.feed(text.as_bytes());
    let mut out = parser.take_rewrite();
    let (_, rest) = parser.finish_with_rewrite();
    out.extend(rest);
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn rewrite_sends_corrected_text_and_keeps_ids_model_created_usage() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |c| c.rewrite = true).await;
    let http = client();
    for name in
        ["missing-content-tags-en", "split-content-no-space-zh", "truncated-mid-close-tag-en", "sse-filament-tags"]
    {
        let body = request(name, true);
        let direct = http.post(format!("{}/v1/chat/completions", mock.url())).json(&body).send().await.unwrap();
        let direct = direct.bytes().await.unwrap();
        let proxied = http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&body).send().await.unwrap();
        assert_eq!(proxied.headers()["content-type"], "text/event-stream; charset=utf-8");
        let proxied = proxied.bytes().await.unwrap();
        let (d, p) = (chunks(&direct), chunks(&proxied));
        assert_eq!(d.len(), p.len(), "{name}: one chunk out per chunk in");
        for (a, b) in d.iter().zip(&p) {
            for key in ["id", "model", "created", "object", "system_fingerprint", "usage"] {
                assert_eq!(a.get(key), b.get(key), "{name}: {key}");
            }
            assert_eq!(a["choices"][0]["finish_reason"], b["choices"][0]["finish_reason"], "{name}");
        }
        assert_eq!(datas(&proxied).last().map(String::as_str), Some("[DONE]"));
        let raw = content(&direct);
        let corrected = content(&proxied);
        assert_eq!(corrected, oracle_rewrite(&raw), "{name}");
        // Non-streamed: message.content rewritten, the rest untouched.
        let body = request(name, false);
        let direct = chat_json(&mock.url(), &body).await;
        let proxied = http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&body).send().await.unwrap();
        let length: usize = proxied.headers()["content-length"].to_str().unwrap().parse().unwrap();
        let proxied = proxied.bytes().await.unwrap();
        assert_eq!(length, proxied.len());
        let proxied: Value = serde_json::from_slice(&proxied).unwrap();
        for key in ["id", "model", "created", "usage", "object"] {
            assert_eq!(direct[key], proxied[key], "{name}: {key}");
        }
        let raw = direct["choices"][0]["message"]["content"].as_str().unwrap();
        assert_eq!(proxied["choices"][0]["message"]["content"], oracle_rewrite(raw), "{name}");
    }
    proxy.shutdown().await.unwrap();
}

/// The elements (choice, tag, text) of an SSE body, parsed directly.
fn elements_of(body: &[u8]) -> Vec<(u32, String, String)> {
    let mut tap = StreamTap::new(StreamOptions::with_registry(Registry::filament()));
    let mut events = tap.feed(body);
    events.extend(tap.finish());
    events
        .iter()
        .filter_map(|e| {
            let el = e.as_element()?;
            Some((e.choice().unwrap_or(0), el.tag.to_string(), el.text.clone()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sinks_receive_every_element() {
    let mock = mock(0).await;
    // A webhook receiver that keeps every POSTed batch.
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let store = received.clone();
    let hook = serve(Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::Json<Value>| {
            let store = store.clone();
            async move {
                store.lock().unwrap().extend(body.0.as_array().cloned().unwrap_or_default());
                StatusCode::NO_CONTENT
            }
        }),
    ))
    .await;
    let file = std::env::temp_dir().join(format!("spindle-proxy-sink-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(100_000);
    let sinks = vec![SinkSpec::Jsonl(file.clone()), SinkSpec::Webhook(format!("{hook}/hook")), SinkSpec::Channel(tx)];
    let proxy = proxy(&mock.url(), |c| c.sinks = sinks).await;
    let http = client();
    let names = [
        "clean-every-tag-zh-ruins",
        "missing-content-tags-en",
        "sse-filament-tags",
        "sse-parallel-tool-calls",
        "sse-n2-interleaved",
        "sse-deepseek-reasoning",
        "stray-closes-zh",
    ];
    let mut expected: BTreeMap<String, Vec<(u32, String, String)>> = BTreeMap::new();
    for name in names {
        let body = request(name, true);
        let direct = http.post(format!("{}/v1/chat/completions", mock.url())).json(&body).send().await.unwrap();
        expected.insert(name.to_string(), elements_of(&direct.bytes().await.unwrap()));
        let proxied = http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&body).send().await.unwrap();
        let _ = proxied.bytes().await.unwrap();
    }
    // A non-streamed response is parsed too.
    let whole = http
        .post(format!("{}/v1/chat/completions", url(&proxy)))
        .json(&request("clean-rp-zh-teahouse", false))
        .send()
        .await
        .unwrap();
    assert!(whole.status().is_success());
    let _ = whole.bytes().await.unwrap();
    proxy.shutdown().await.unwrap();

    let mut from_channel: Vec<Value> = Vec::new();
    while let Some(r) = rx.recv().await {
        from_channel.push(serde_json::to_value(&*r).unwrap());
    }
    let from_file: Vec<Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let from_hook = received.lock().unwrap().clone();
    let _ = std::fs::remove_file(&file);
    for (label, records) in [("channel", &from_channel), ("jsonl", &from_file), ("webhook", &from_hook)] {
        for name in names {
            let got: Vec<(u32, String, String)> = records
                .iter()
                .filter(|r| r["model"] == name && r["type"] == "element")
                .map(|r| {
                    (
                        r["choice"].as_u64().unwrap() as u32,
                        r["tag"].as_str().unwrap().into(),
                        r["text"].as_str().unwrap().into(),
                    )
                })
                .collect();
            assert_eq!(&got, &expected[name], "{label}: {name}");
            assert!(records.iter().any(|r| r["model"] == name && r["type"] == "finish"), "{label}: {name}");
        }
        let teahouse: Vec<&Value> =
            records.iter().filter(|r| r["model"] == "clean-rp-zh-teahouse" && r["type"] == "element").collect();
        assert!(teahouse.len() >= 3, "{label}: whole response parsed: {}", teahouse.len());
        assert!(records.iter().all(|r| r["path"] == "/v1/chat/completions" && r["ts_ms"].as_u64().is_some()));
    }
    assert_eq!(from_file, from_channel, "file and channel hold the same records in the same order");
}

/// A proxy with the `chat` profile in front of `upstream`, its records
/// going to the returned channel.
async fn proxy_with_channel(upstream: &str) -> (ProxyHandle, tokio::sync::mpsc::Receiver<Arc<SinkRecord>>) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(10_000);
    let proxy = proxy(upstream, |c| {
        c.options = StreamOptions::default();
        c.sinks = vec![SinkSpec::Channel(tx)];
    })
    .await;
    (proxy, rx)
}

/// Shuts the proxy down and returns every record it sent, as JSON.
async fn records_after(proxy: ProxyHandle, mut rx: tokio::sync::mpsc::Receiver<Arc<SinkRecord>>) -> Vec<Value> {
    proxy.shutdown().await.unwrap();
    let mut records = Vec::new();
    while let Some(r) = rx.recv().await {
        records.push(serde_json::to_value(&*r).unwrap());
    }
    records
}

/// (tag, text) of every element record.
fn tags_and_texts(records: &[Value]) -> Vec<(String, String)> {
    records
        .iter()
        .filter(|r| r["type"] == "element")
        .map(|r| (r["tag"].as_str().unwrap().to_string(), r["text"].as_str().unwrap().to_string()))
        .collect()
}

/// Gemini's own API through the proxy: `/v1beta/*` is forwarded, the SSE
/// body (`alt=sse`) and the JSON array (without it) reach the client as
/// the upstream sent them, and both are parsed on the side: candidates,
/// thoughts and the finish go to the sinks, and no stream counts as cut.
#[tokio::test]
async fn gemini_streams_pass_through_and_are_parsed() {
    let frames = [
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Plan it.", "thought": true}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Two <b>cups</b> of "}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "tea."}]}, "finishReason": "STOP"}],
               "usageMetadata": {"totalTokenCount": 12}}),
    ];
    let sse: String = frames.iter().map(|f| format!("data: {f}\r\n\r\n")).collect();
    let array = Value::Array(frames.to_vec()).to_string();
    let upstream = serve(Router::new().fallback(move |uri: Uri| {
        let (sse, array) = (sse.clone(), array.clone());
        async move {
            match (uri.path(), uri.query()) {
                ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", Some("alt=sse")) => {
                    ([("content-type", "text/event-stream")], sse).into_response()
                }
                ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", None) => {
                    ([("content-type", "application/json")], array).into_response()
                }
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    }))
    .await;
    let (proxy, rx) = proxy_with_channel(&upstream).await;
    let http = client();
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "tea?"}]}]});
    for query in ["?alt=sse", ""] {
        let path = format!("/v1beta/models/gemini-2.5-flash:streamGenerateContent{query}");
        let direct = http.post(format!("{upstream}{path}")).json(&body).send().await.unwrap().bytes().await.unwrap();
        let proxied = http.post(format!("{}{path}", url(&proxy))).json(&body).send().await.unwrap();
        assert!(proxied.status().is_success(), "{path}: {}", proxied.status());
        assert_eq!(proxied.bytes().await.unwrap(), direct, "{path}: pass-through is byte-identical");
    }
    let records = records_after(proxy, rx).await;
    let elements = tags_and_texts(&records);
    let one = [
        ("thought".to_string(), "Plan it.".to_string()),
        ("content".to_string(), "Two <b>cups</b> of tea.".to_string()),
    ];
    assert_eq!(elements, [one.clone(), one].concat(), "{records:?}");
    assert_eq!(records.iter().filter(|r| r["type"] == "finish" && r["reason"] == "stop").count(), 2, "{records:?}");
    assert!(!records.iter().any(|r| r["type"] == "truncated" || r["type"] == "stream_error"), "{records:?}");
    // The model is named in the path: the records carry it.
    assert!(records.iter().all(|r| r["model"] == "gemini-2.5-flash"), "{records:?}");
}

/// Ollama's own API through the proxy: `/api/*` is forwarded; the JSON
/// lines of `/api/chat` reach the client as sent and are read on the side
/// (thinking, content, the finish and the counts go to the sinks); a
/// stream that stops before `done` is recorded as cut; a whole answer
/// (`"stream": false`) is parsed too; `/api/tags` just passes.
#[tokio::test]
async fn ollama_streams_pass_through_and_are_parsed() {
    let lines = [
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "thinking": "Hm."}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "Two <b>cups"}, "done": false}),
        json!({"model": "qwen3", "message": {"role": "assistant", "content": "</b> of tea."}, "done": true,
               "done_reason": "stop", "eval_count": 9}),
    ];
    let ndjson: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let whole = json!({"model": "qwen3", "message": {"role": "assistant", "content": "Tea."}, "done": true, "done_reason": "stop"});
    let upstream = serve(Router::new().fallback(move |uri: Uri, body: Bytes| {
        let ndjson = ndjson.clone();
        let whole = whole.to_string();
        async move {
            let request: Value = serde_json::from_slice(&body).unwrap_or_default();
            match uri.path() {
                "/api/chat" if request["stream"] == false => {
                    ([("content-type", "application/json")], whole).into_response()
                }
                "/api/chat" => {
                    // Two lines only when asked to stop early: no `done`.
                    let text = if request["cut"] == true {
                        ndjson.lines().take(2).map(|l| format!("{l}\n")).collect()
                    } else {
                        ndjson
                    };
                    // Sent in pieces that split lines.
                    let pieces: Vec<Result<Bytes, std::io::Error>> =
                        text.as_bytes().chunks(37).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
                    let body = axum::body::Body::from_stream(futures::stream::iter(pieces));
                    ([("content-type", "application/x-ndjson")], body).into_response()
                }
                "/api/tags" => axum::Json(json!({"models": [{"name": "qwen3"}]})).into_response(),
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    }))
    .await;
    let (proxy, rx) = proxy_with_channel(&upstream).await;
    let http = client();
    let ask = |extra: Value| {
        let mut body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "tea?"}]});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        body
    };
    for (path, body) in [
        ("/api/chat", ask(json!({}))),
        ("/api/chat", ask(json!({"cut": true}))),
        ("/api/chat", ask(json!({"stream": false}))),
    ] {
        let direct = http.post(format!("{upstream}{path}")).json(&body).send().await.unwrap().bytes().await.unwrap();
        let proxied = http.post(format!("{}{path}", url(&proxy))).json(&body).send().await.unwrap();
        assert!(proxied.status().is_success(), "{path}: {}", proxied.status());
        assert_eq!(proxied.bytes().await.unwrap(), direct, "{path} {body}: pass-through is byte-identical");
    }
    let tags: Value = http.get(format!("{}/api/tags", url(&proxy))).send().await.unwrap().json().await.unwrap();
    assert_eq!(tags["models"][0]["name"], "qwen3");
    let records = records_after(proxy, rx).await;
    let elements = tags_and_texts(&records);
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        elements,
        [
            pair("thought", "Hm."),
            pair("content", "Two <b>cups</b> of tea."),
            pair("thought", "Hm."),
            pair("content", "Two <b>cups"),
            pair("content", "Tea."),
        ],
        "{records:?}"
    );
    let finishes: Vec<&Value> = records.iter().filter(|r| r["type"] == "finish").map(|r| &r["reason"]).collect();
    assert_eq!(finishes, [&json!("stop"), &json!("stop")], "{records:?}");
    assert_eq!(records.iter().filter(|r| r["type"] == "truncated").count(), 1, "the cut stream: {records:?}");
    assert!(records.iter().any(|r| r["type"] == "usage" && r["usage"]["eval_count"] == 9), "{records:?}");
    assert!(records.iter().filter(|r| r["type"] == "element").all(|r| r["path"] == "/api/chat"));
}

/// llama.cpp's own API through the proxy (its unversioned paths, which a
/// SillyTavern-style front end calls): `/completion`'s SSE reaches the
/// client as sent and is read on the side; `/tokenize` just passes;
/// `/slots` (slot management) is not proxied.
#[tokio::test]
async fn llama_cpp_native_paths_pass_through_and_are_parsed() {
    let chunks = [
        json!({"content": "Two <b>cu", "stop": false, "index": 0}),
        json!({"content": "ps</b> of tea.", "stop": false, "index": 0}),
        json!({"content": "", "stop": true, "stop_type": "eos", "tokens_predicted": 7}),
    ];
    let sse: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    let upstream = serve(Router::new().fallback(move |uri: Uri| {
        let sse = sse.clone();
        async move {
            match uri.path() {
                "/completion" => ([("content-type", "text/event-stream")], sse).into_response(),
                "/tokenize" => axum::Json(json!({"tokens": [1, 2, 3]})).into_response(),
                _ => StatusCode::NOT_FOUND.into_response(),
            }
        }
    }))
    .await;
    let (proxy, rx) = proxy_with_channel(&upstream).await;
    let http = client();
    let body = json!({"prompt": "tea?", "stream": true, "n_predict": 64});
    let direct = http.post(format!("{upstream}/completion")).json(&body).send().await.unwrap().bytes().await.unwrap();
    let proxied = http.post(format!("{}/completion", url(&proxy))).json(&body).send().await.unwrap();
    assert!(proxied.status().is_success(), "{}", proxied.status());
    assert_eq!(proxied.bytes().await.unwrap(), direct, "pass-through is byte-identical");
    let tokens: Value = http
        .post(format!("{}/tokenize", url(&proxy)))
        .json(&json!({"content": "tea"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(tokens["tokens"], json!([1, 2, 3]));
    let slots = http.get(format!("{}/slots", url(&proxy))).send().await.unwrap();
    assert_eq!(slots.status(), 404, "slot management is not proxied");
    let records = records_after(proxy, rx).await;
    let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(tags_and_texts(&records), [pair("content", "Two <b>cups</b> of tea.")], "{records:?}");
    let finishes: Vec<&Value> = records.iter().filter(|r| r["type"] == "finish").map(|r| &r["reason"]).collect();
    assert_eq!(finishes, [&json!("stop")], "{records:?}");
    assert!(!records.iter().any(|r| r["type"] == "truncated"), "{records:?}");
}

#[tokio::test]
async fn metrics_and_healthz() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |_| {}).await;
    let http = client();
    let health: Value = http.get(format!("{}/healthz", url(&proxy))).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["upstream"], mock.url());
    for name in ["missing-content-tags-en", "stray-closes-zh"] {
        let r =
            http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&request(name, true)).send().await.unwrap();
        let _ = r.bytes().await.unwrap();
    }
    let r = http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&request("plain-answer-no-tags-en", false));
    let _ = r.send().await.unwrap().bytes().await.unwrap();
    let _ = http.get(format!("{}/v1/models", url(&proxy))).send().await.unwrap().bytes().await.unwrap();
    // The last pump may still be counting.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let response = http.get(format!("{}/metrics", url(&proxy))).send().await.unwrap();
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    let text = response.text().await.unwrap();
    for (series, at_least) in [
        ("spindle_proxy_streams_total", 2.0),
        ("spindle_proxy_requests_total{kind=\"chat_stream\"}", 2.0),
        ("spindle_proxy_requests_total{kind=\"chat\"}", 1.0),
        ("spindle_proxy_requests_total{kind=\"other\"}", 1.0),
        ("spindle_proxy_repairs_total{kind=\"header_inserted\"}", 1.0),
        ("spindle_proxy_repairs_total{kind=\"stray_close_dropped\"}", 1.0),
        ("spindle_proxy_elements_total{tag=\"content\"}", 3.0),
        ("spindle_proxy_upstream_responses_total{status=\"200\"}", 4.0),
        ("spindle_proxy_bytes_total{direction=\"upstream_in\"}", 1000.0),
        ("spindle_proxy_bytes_total{direction=\"client_out\"}", 1000.0),
        ("spindle_proxy_bytes_total{direction=\"request\"}", 100.0),
    ] {
        assert!(sample(&text, series) >= at_least, "{series} in\n{text}");
    }
    assert_eq!(sample(&text, "spindle_proxy_streams_active"), 0.0);
    assert_eq!(sample(&text, "spindle_proxy_requests_active"), 0.0);
    assert!(text.contains("# TYPE spindle_proxy_sink_dropped_total counter"));
    proxy.shutdown().await.unwrap();
}

#[tokio::test]
async fn mock_lists_chooses_and_assembles() {
    let mock = mock(0).await;
    let http = client();
    let models: Value = http.get(format!("{}/v1/models", mock.url())).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().filter_map(|m| m["id"].as_str()).collect();
    assert!(ids.contains(&"sse-refusal") && ids.contains(&"missing-content-tags-en"), "{ids:?}");
    assert!(!ids.iter().any(|i| i.ends_with(".expected") || i.starts_with("expected/")), "{ids:?}");
    // An unknown model: OpenAI's 404, not some other transcript.
    let typo = json!({"model": "sse-refusall", "messages": [{"role": "user", "content": "hi"}]});
    let r = http.post(format!("{}/v1/chat/completions", mock.url())).json(&typo).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.unwrap();
    assert_eq!(
        (err["error"]["code"].as_str(), err["error"]["param"].as_str()),
        (Some("model_not_found"), Some("model"))
    );
    // Model `mock`: chosen by a message naming the file.
    let body =
        json!({"model": "mock", "stream": false, "messages": [{"role": "user", "content": "replay sse-refusal.sse"}]});
    let r = http.post(format!("{}/v1/chat/completions", mock.url())).json(&body).send().await.unwrap();
    assert_eq!(r.headers()["x-mock-transcript"], "sse-refusal");
    let whole: Value = r.json().await.unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert!(whole["choices"][0]["message"]["refusal"].as_str().is_some_and(|s| !s.is_empty()), "{whole}");
    // A synthesised stream has OpenAI's shape and its content is the file.
    let r = http
        .post(format!("{}/v1/chat/completions", mock.url()))
        .json(&request("plain-answer-no-tags-en", true))
        .send()
        .await
        .unwrap();
    let body = r.bytes().await.unwrap();
    let text = std::fs::read_to_string(corpora().join("plain-answer-no-tags-en.txt")).unwrap();
    assert_eq!(content(&body), text);
    let cs = chunks(&body);
    assert!(cs.len() > 10);
    assert_eq!(cs[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(cs.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == cs[0]["id"]));
    assert_eq!(cs.last().unwrap()["choices"], json!([]));
    assert!(cs.last().unwrap()["usage"]["total_tokens"].as_u64().is_some());
    // Unknown paths get an OpenAI-style 404.
    let r = http.get(format!("{}/v1/nothing", mock.url())).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let stats: Value = http.get(format!("{}/mock/stats", mock.url())).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["requests"], 3);
    let _ = SourceEvent::Done;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewrite_of_every_transcript_is_a_well_formed_stream() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |c| c.rewrite = true).await;
    let models: Value = client().get(format!("{}/v1/models", mock.url())).send().await.unwrap().json().await.unwrap();
    let http = client();
    for m in models["data"].as_array().unwrap() {
        let name = m["id"].as_str().unwrap();
        let body = request(name, true);
        let direct = http.post(format!("{}/v1/chat/completions", mock.url())).json(&body).send().await.unwrap();
        let direct = direct.bytes().await.unwrap();
        let proxied = http.post(format!("{}/v1/chat/completions", url(&proxy))).json(&body).send().await.unwrap();
        assert!(proxied.status().is_success(), "{name}");
        let proxied = proxied.bytes().await.unwrap();
        let d = datas(&proxied);
        assert_eq!(d.last().map(String::as_str), Some("[DONE]"), "{name}");
        assert_eq!(d.iter().filter(|x| x.trim() == "[DONE]").count(), 1, "{name}");
        // Every event but [DONE] and the upstream's own broken data is JSON.
        let direct_bad = datas(&direct).iter().filter(|x| serde_json::from_str::<Value>(x).is_err()).count();
        let bad = d.iter().filter(|x| serde_json::from_str::<Value>(x).is_err()).count();
        assert!(bad <= direct_bad.max(1), "{name}: {bad} non-JSON events");
        // The ids of every chunk are the upstream's.
        let ids: std::collections::BTreeSet<String> =
            chunks(&direct).iter().filter_map(|c| c["id"].as_str().map(str::to_string)).collect();
        for c in chunks(&proxied) {
            if let Some(id) = c["id"].as_str() {
                assert!(ids.contains(id), "{name}: {id}");
            }
        }
    }
    proxy.shutdown().await.unwrap();
}

#[test]
fn public_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<spindle::proxy::ProxyConfig>();
    both::<spindle::proxy::ProxyServer>();
    both::<spindle::proxy::ProxyHandle>();
    both::<spindle::proxy::ProxyError>();
    both::<spindle::proxy::Metrics>();
    both::<spindle::proxy::SinkSpec>();
    both::<spindle::proxy::SinkRecord>();
    both::<spindle::proxy::ProxyStartError>();
    both::<spindle::mock::MockUpstream>();
    both::<spindle::mock::MockServer>();
    both::<spindle::mock::MockStats>();
    both::<spindle::mock::Transcript>();
    both::<spindle::mock::MockError>();
}

/// A request whose system prompt declares `<use_protocol>` (spec 003
/// §11.2) is parsed with the registry the declarations build, in place of
/// the configured `chat` profile; the body goes upstream unchanged; with
/// `UseProtocol::Ignore`, or without a declaration, the configured
/// registry holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_declares_its_protocols_is_parsed_with_their_registry() {
    use spindle::proxy::UseProtocol;
    let mock = mock(0).await;
    let tags_of = |use_protocol: UseProtocol, system: Option<&'static str>| {
        let mock = mock.url();
        async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(10_000);
            let proxy = proxy(&mock, |c| {
                c.options = StreamOptions::with_registry(Registry::chat());
                c.use_protocol = use_protocol;
                c.sinks = vec![SinkSpec::Channel(tx)];
            })
            .await;
            let mut req = request("clean-rp-zh-teahouse", true);
            if let Some(system) = system {
                req["messages"] =
                    json!([{"role": "system", "content": system}, {"role": "user", "content": "Continue."}]);
            }
            let direct = chat_bytes(&mock, &req).await;
            let proxied = chat_bytes(&url(&proxy), &req).await;
            assert_eq!(content(&proxied), content(&direct), "the answer passes through unchanged");
            proxy.shutdown().await.unwrap();
            let mut tags = Vec::new();
            while let Some(r) = rx.recv().await {
                let r = serde_json::to_value(&*r).unwrap();
                if r["type"] == "element" {
                    tags.push(r["tag"].as_str().unwrap_or_default().to_string());
                }
            }
            tags
        }
    };
    let declares = Some(
        "You are the innkeeper.\n<use_protocol>variable_update_v2</use_protocol>\n<use_protocol>status_bar</use_protocol>",
    );
    let tags = tags_of(UseProtocol::Auto, declares).await;
    assert!(tags.contains(&"variable_update".to_string()) && tags.contains(&"status_bar".to_string()), "{tags:?}");
    for (use_protocol, system) in [(UseProtocol::Auto, None), (UseProtocol::Ignore, declares)] {
        let tags = tags_of(use_protocol, system).await;
        assert!(!tags.iter().any(|t| t == "variable_update" || t == "status_bar"), "{use_protocol:?}: {tags:?}");
    }
    mock.shutdown().await.unwrap();
}
