//! OpenTelemetry traces of proxied requests: a real OTLP/HTTP receiver on
//! 127.0.0.1:0 (decoding `ExportTraceServiceRequest` with the official
//! proto types), a small upstream that records the `traceparent` it gets,
//! and the proxy between a client and it.

mod proxy_support;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use proxy_support::{chat_bytes, chat_json, client, content, url};
use serde_json::json;
use spindle::Registry;
use spindle::proxy::{OtelConfig, ProxyConfig, ProxyHandle, ProxyServer};
use spindle::sources::StreamOptions;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Spans = Arc<Mutex<Vec<Span>>>;

async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let app = Router::new()
        .route(
            "/v1/traces",
            post(|State(spans): State<Spans>, body: Bytes| async move {
                if let Ok(req) = ExportTraceServiceRequest::decode(body) {
                    let mut all = spans.lock().unwrap();
                    for rs in req.resource_spans {
                        for ss in rs.scope_spans {
                            all.extend(ss.spans);
                        }
                    }
                }
                ""
            }),
        )
        .with_state(spans.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// Answers every request with a short stream (an unclosed `<content>`, so
/// there is a repair; usage; `finish_reason: stop`), noting the
/// `traceparent` it got.
async fn upstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|State(seen): State<Seen>, headers: HeaderMap| async move {
                let tp = headers.get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string);
                seen.lock().unwrap().push(tp);
                let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
                    json!({"id": "chatcmpl-up1", "object": "chat.completion.chunk", "model": "gpt-test-0613",
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                };
                let mut sse = String::new();
                for piece in ["<thought>hm", "m</thought>\n<content>Hello", " there"] {
                    sse.push_str(&format!("data: {}\n\n", chunk(json!({"content": piece}), json!(null))));
                }
                sse.push_str(&format!("data: {}\n\n", chunk(json!({}), json!("stop"))));
                let usage = json!({"id": "chatcmpl-up1", "object": "chat.completion.chunk", "model": "gpt-test-0613",
                    "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}});
                sse.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
                Response::builder().header("content-type", "text/event-stream").body(Body::from(sse)).unwrap()
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

async fn proxy(upstream: &str, otel: &str) -> ProxyHandle {
    let mut config = ProxyConfig::new(upstream);
    config.options = StreamOptions::with_registry(Registry::filament());
    config.otel = Some(OtelConfig { endpoint: Some(otel.to_string()), system: None });
    ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v| v.value.as_ref())
}

/// A string attribute of `span` (the debug form of anything else).
fn text_attr(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// An integer attribute of `span` (-1 when it is none).
fn int_attr(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(AnyValue::IntValue(n)) => *n,
        _ => -1,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_request_becomes_a_span_with_genai_attributes_and_its_traceparent_goes_upstream() {
    let (collector, spans) = receiver().await;
    let (up, seen) = upstream().await;
    let proxy = proxy(&up, &collector).await;
    let parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let body = client()
        .post(format!("{}/v1/chat/completions", url(&proxy)))
        .header("traceparent", format!("00-{parent_trace}-00f067aa0ba902b7-01"))
        .json(&json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(content(&body).contains("Hello there"));
    // Shutting down flushes the exporter.
    proxy.shutdown().await.unwrap();
    let spans = spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "chat gpt-test");
    assert_eq!(hex(&span.trace_id), parent_trace, "a child of the client's trace");
    assert_eq!(hex(&span.parent_span_id), "00f067aa0ba902b7");
    let text = |k: &str| text_attr(span, k);
    let int = |k: &str| int_attr(span, k);
    assert_eq!(text("gen_ai.operation.name"), "chat");
    assert_eq!(text("gen_ai.system"), "openai");
    assert_eq!(text("gen_ai.request.model"), "gpt-test");
    assert_eq!(text("gen_ai.response.model"), "gpt-test-0613");
    assert_eq!(text("gen_ai.response.id"), "chatcmpl-up1");
    assert_eq!((int("gen_ai.usage.input_tokens"), int("gen_ai.usage.output_tokens")), (11, 7));
    assert_eq!(int("http.response.status_code"), 200);
    match attr(span, "gen_ai.response.finish_reasons") {
        Some(AnyValue::ArrayValue(a)) => {
            let reasons: Vec<_> = a.values.iter().filter_map(|v| v.value.clone()).collect();
            assert_eq!(reasons, [AnyValue::StringValue("stop".into())]);
        }
        other => panic!("finish_reasons: {other:?}"),
    }
    assert!(matches!(attr(span, "gen_ai.server.time_to_first_token"), Some(AnyValue::DoubleValue(t)) if *t > 0.0));
    assert!(span.events.iter().any(|e| e.name == "spindle.repair"), "{:?}", span.events);
    // The upstream got the proxy span's context.
    let tp = seen.lock().unwrap().first().cloned().flatten().unwrap_or_default();
    assert_eq!(tp, format!("00-{parent_trace}-{}-01", hex(&span.span_id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_never_slows_the_stream() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (up, _) = upstream().await;
    let proxy = proxy(&up, &dead).await;
    let t = Instant::now();
    for _ in 0..20 {
        let body = chat_bytes(&url(&proxy), &json!({"model": "m", "stream": true, "messages": []})).await;
        assert!(content(&body).contains("Hello there"));
    }
    assert!(t.elapsed() < Duration::from_secs(5), "20 requests took {:?}", t.elapsed());
    proxy.shutdown().await.unwrap();
}

/// Agent mode (`--agent`): the span carries the loop's repairs, tool calls
/// and tool runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_request_traces_its_tool_runs() {
    use spindle::calls::ToolCatalog;
    use spindle::proxy::{ProxyAgent, ToolCalling};
    use spindle::tools::{Protocol, Runner};
    let (collector, spans) = receiver().await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mock = spindle::mock::MockUpstream::from_dir(&root.join("examples/agent-demo")).unwrap();
    let mock = mock.spawn("127.0.0.1:0").await.unwrap();
    let mut config = ProxyConfig::new(mock.url());
    config.options = StreamOptions::with_registry(Registry::chat());
    config.tool_calling = Some(ToolCalling::new(Protocol::Hermes));
    let catalog = ToolCatalog::load_plugins(&root.join("examples/plugins/basic")).unwrap();
    config.agent = Some(ProxyAgent::new(Arc::new(Runner::new(catalog))));
    config.otel = Some(OtelConfig { endpoint: Some(collector), system: None });
    let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn();
    let req = json!({"model": "agent-demo-hermes", "messages": [{"role": "user", "content": "What is 2 + 40?"}]});
    let whole: serde_json::Value = chat_json(&url(&proxy), &req).await;
    assert_eq!(whole["spindle"]["reason"], "answer", "{whole}");
    proxy.shutdown().await.unwrap();
    let spans = spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 1);
    let names: Vec<&str> = spans[0].events.iter().map(|e| e.name.as_str()).collect();
    assert!(names.contains(&"gen_ai.tool.run") && names.contains(&"gen_ai.tool.call"), "{names:?}");
    mock.shutdown().await.unwrap();
}

/// A WebSocket session (Realtime) is one span from the handshake to its
/// end: its `traceparent` goes upstream in the handshake, and the events
/// of each of its responses (a repair, the token counts, added up) are on
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_becomes_a_span_and_its_traceparent_goes_upstream() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response as WsResponse};
    let (collector, spans) = receiver().await;
    // An upstream that notes the handshake's traceparent and, asked, sends
    // two responses of text with an unclosed `<content>` and their usage.
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = format!("http://{}", listener.local_addr().unwrap());
    let noted = seen.clone();
    tokio::spawn(async move {
        let Ok((tcp, _)) = listener.accept().await else { return };
        // The callback's `Result` is tungstenite's, with its large error type.
        #[allow(clippy::result_large_err)]
        let callback = move |request: &Request, response: WsResponse| -> Result<WsResponse, ErrorResponse> {
            let tp = request.headers().get("traceparent").and_then(|v| v.to_str().ok()).map(str::to_string);
            noted.lock().unwrap().push(tp);
            Ok(response)
        };
        let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else { return };
        while let Some(Ok(message)) = ws.next().await {
            if message.to_text().unwrap_or_default() != "go" {
                continue;
            }
            for (id, tokens) in [("resp_1", 3), ("resp_2", 4)] {
                let delta = json!({"type": "response.output_text.delta", "response_id": id, "item_id": "i",
                    "output_index": 0, "content_index": 0, "delta": "<content>Hi"});
                let done = json!({"type": "response.done", "response": {"id": id, "status": "completed",
                    "usage": {"input_tokens": 10, "output_tokens": tokens, "total_tokens": 10 + tokens}}});
                for event in [delta, done] {
                    let _ = ws.send(Message::text(event.to_string())).await;
                }
            }
        }
    });
    let mut config = ProxyConfig::new(&up);
    config.options = StreamOptions::with_registry(Registry::filament());
    config.otel = Some(OtelConfig { endpoint: Some(collector), system: None });
    let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn();
    let parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let target = format!("{}/v1/realtime?model=gpt-realtime", url(&proxy).replacen("http://", "ws://", 1));
    let mut request = target.into_client_request().unwrap();
    let traceparent = format!("00-{parent_trace}-00f067aa0ba902b7-01");
    request.headers_mut().insert("traceparent", traceparent.parse().unwrap());
    let step = Duration::from_secs(10);
    let (mut ws, _) = tokio::time::timeout(step, tokio_tungstenite::connect_async(request)).await.unwrap().unwrap();
    ws.send(Message::text("go")).await.unwrap();
    for _ in 0..4 {
        tokio::time::timeout(step, ws.next()).await.unwrap().unwrap().unwrap();
    }
    ws.close(None).await.unwrap();
    tokio::time::timeout(step, async { while let Some(Ok(_)) = ws.next().await {} }).await.unwrap();
    tokio::time::timeout(step, proxy.shutdown()).await.unwrap().unwrap();
    let spans = spans.lock().unwrap().clone();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let span = &spans[0];
    assert_eq!(span.name, "realtime gpt-realtime");
    assert_eq!(hex(&span.trace_id), parent_trace, "a child of the client's trace");
    let text = |k: &str| text_attr(span, k);
    let int = |k: &str| int_attr(span, k);
    assert_eq!(text("gen_ai.operation.name"), "realtime");
    assert_eq!(text("gen_ai.request.model"), "gpt-realtime");
    assert_eq!(text("spindle.outcome"), "closed");
    assert_eq!(int("http.response.status_code"), 101);
    assert_eq!((int("gen_ai.usage.input_tokens"), int("gen_ai.usage.output_tokens")), (20, 7), "added up");
    assert_eq!(span.events.iter().filter(|e| e.name == "spindle.repair").count(), 2, "{:?}", span.events);
    let tp = seen.lock().unwrap().first().cloned().flatten().unwrap_or_default();
    assert_eq!(tp, format!("00-{parent_trace}-{}-01", hex(&span.span_id)));
}
