//! WebSocket pass-through (OpenAI Realtime's `/v1/realtime`) against real
//! servers on 127.0.0.1:0: a tokio-tungstenite upstream that records the
//! handshakes it saw and echoes, and a tokio-tungstenite client through the
//! proxy. Messages both ways byte for byte, the handshake's headers and
//! subprotocol, refusals and an unreachable upstream, close codes both
//! ways, the message limit, the browser-origin policy, shutdown, and
//! `/metrics`. Every wait is bounded: a hang fails the test.

mod proxy_support;

use futures::{SinkExt, StreamExt};
use proxy_support::*;
use serde_json::{Value, json};
use spindle::proxy::{ProxyConfig, ProxyHandle, Secret, SinkRecord, SinkSpec};
use spindle::sources::StreamOptions;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::{HeaderMap, HeaderValue, StatusCode};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// The longest any step of these tests may take.
const STEP: Duration = Duration::from_secs(10);

/// `fut`, or a failure naming `what` after [`STEP`].
async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {STEP:?}"),
    }
}

/// What the upstream saw.
#[derive(Debug, Default)]
struct Saw {
    /// Each handshake: its target (path and query) and headers.
    handshakes: Vec<(String, HeaderMap)>,
    /// Each close frame received: code and reason.
    closes: Vec<(u16, String)>,
    /// The payloads of the pings received.
    pings: Vec<Vec<u8>>,
}

type Shared = Arc<Mutex<Saw>>;

fn saw<T>(shared: &Shared, f: impl FnOnce(&Saw) -> T) -> T {
    f(&shared.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The JSON body of the upstream's refusal.
const REFUSAL: &str =
    r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;

/// A WebSocket upstream: refuses `.../refuse` with 401 and [`REFUSAL`];
/// otherwise accepts (choosing `realtime` when offered), records, and
/// echoes text and binary messages, except the commands `close:CODE:REASON`
/// (it closes), `big:N` (it sends N bytes) and `ping:PAYLOAD` (it pings).
async fn upstream() -> (String, Shared) {
    let shared: Shared = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let record = shared.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(serve_one(tcp, record.clone()));
        }
    });
    (format!("http://{addr}"), shared)
}

// The callback's `Result` is tungstenite's, with its large error type.
#[allow(clippy::result_large_err)]
async fn serve_one(tcp: tokio::net::TcpStream, shared: Shared) {
    let seen = shared.clone();
    let callback = move |request: &Request, mut response: Response| -> Result<Response, ErrorResponse> {
        let target = request.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        seen.lock().unwrap_or_else(|e| e.into_inner()).handshakes.push((target, request.headers().clone()));
        if request.uri().path().ends_with("/refuse") {
            let mut refusal = ErrorResponse::new(Some(REFUSAL.to_string()));
            *refusal.status_mut() = StatusCode::UNAUTHORIZED;
            refusal.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
            refusal.headers_mut().insert("content-length", HeaderValue::from(REFUSAL.len()));
            return Err(refusal);
        }
        let offered = request
            .headers()
            .get_all("sec-websocket-protocol")
            .iter()
            .any(|v| v.to_str().unwrap_or_default().split(',').any(|p| p.trim() == "realtime"));
        if offered {
            response.headers_mut().insert("sec-websocket-protocol", HeaderValue::from_static("realtime"));
        }
        response.headers_mut().insert("x-upstream-session", HeaderValue::from_static("sess_1"));
        Ok(response)
    };
    let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(tcp, callback).await else { return };
    while let Some(Ok(message)) = ws.next().await {
        let text = message.to_text().unwrap_or_default().to_string();
        let reply = match message {
            Message::Close(frame) => {
                if let Some(f) = frame {
                    shared
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .closes
                        .push((u16::from(f.code), f.reason.to_string()));
                }
                continue;
            }
            Message::Ping(payload) => {
                shared.lock().unwrap_or_else(|e| e.into_inner()).pings.push(payload.to_vec());
                continue;
            }
            Message::Pong(_) | Message::Frame(_) => continue,
            Message::Text(_) if text.starts_with("close:") => {
                let mut parts = text.splitn(3, ':').skip(1);
                let code = parts.next().and_then(|c| c.parse::<u16>().ok()).unwrap_or(1000);
                let reason = parts.next().unwrap_or_default().to_string();
                Message::Close(Some(CloseFrame { code: CloseCode::from(code), reason: reason.into() }))
            }
            Message::Text(_) if text.starts_with("big:") => Message::binary(vec![7u8; text[4..].parse().unwrap_or(0)]),
            Message::Text(_) if text.starts_with("ping:") => Message::Ping(text.as_bytes()[5..].to_vec().into()),
            Message::Text(_) if text == "realtime" => {
                for event in realtime_events() {
                    if ws.send(Message::text(event.to_string())).await.is_err() {
                        break;
                    }
                }
                continue;
            }
            echo => echo,
        };
        if ws.send(reply).await.is_err() {
            break;
        }
    }
}

/// A Realtime session's server events: a text response, an audio response
/// (its transcript, GA names), and a response in beta names that the
/// session's end cuts off.
fn realtime_events() -> Vec<Value> {
    let mut events = vec![
        json!({"type": "session.created", "event_id": "e0", "session": {"id": "sess_1", "model": "gpt-realtime"}}),
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
        json!({"type": "response.output_item.added", "response_id": "resp_1", "output_index": 0,
               "item": {"id": "item_1", "type": "message", "role": "assistant", "content": []}}),
    ];
    for delta in ["Two <b>cu", "ps</b> of ", "tea."] {
        events.push(json!({"type": "response.output_text.delta", "response_id": "resp_1", "item_id": "item_1",
                           "output_index": 0, "content_index": 0, "delta": delta}));
    }
    events.extend([
        json!({"type": "response.output_text.done", "response_id": "resp_1", "item_id": "item_1",
               "output_index": 0, "content_index": 0, "text": "Two <b>cups</b> of tea."}),
        json!({"type": "response.done", "response": {"id": "resp_1", "status": "completed", "usage": {"total_tokens": 9}}}),
        json!({"type": "response.created", "response": {"id": "resp_2", "status": "in_progress"}}),
        json!({"type": "response.output_audio.delta", "response_id": "resp_2", "item_id": "item_2",
               "output_index": 0, "content_index": 0, "delta": "UklGRiQAAABXQVZF".repeat(2000)}),
    ]);
    for delta in ["Hello <b>the", "re</b>."] {
        events.push(json!({"type": "response.output_audio_transcript.delta", "response_id": "resp_2",
                           "item_id": "item_2", "output_index": 0, "content_index": 0, "delta": delta}));
    }
    events.push(json!({"type": "response.done", "response": {"id": "resp_2", "status": "completed"}}));
    events.push(json!({"type": "response.text.delta", "response_id": "resp_3", "item_id": "item_3",
                       "output_index": 0, "content_index": 0, "delta": "Cut <b>off"}));
    events
}

type Client = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket to `path` through the proxy, with `headers`.
async fn connect(
    proxy: &ProxyHandle,
    path: &str,
    headers: &[(&'static str, &str)],
) -> Result<(Client, tokio_tungstenite::tungstenite::handshake::client::Response), WsError> {
    let mut request = format!("ws://{}{path}", proxy.local_addr()).into_client_request()?;
    for (name, value) in headers {
        request.headers_mut().insert(*name, HeaderValue::from_str(value).unwrap());
    }
    within("the handshake", tokio_tungstenite::connect_async(request)).await
}

/// The next message other than a pong (the proxy answers pings itself).
async fn next(ws: &mut Client) -> Message {
    loop {
        match within("a message", ws.next()).await {
            Some(Ok(Message::Pong(_))) => continue,
            Some(Ok(m)) => return m,
            other => panic!("expected a message, got {other:?}"),
        }
    }
}

/// The close frame the client receives next (data before it skipped);
/// then the client answers it, and the proxy closes the connection.
async fn close_of(ws: &mut Client) -> (u16, String) {
    let frame = loop {
        match within("a close frame", ws.next()).await {
            Some(Ok(Message::Close(Some(f)))) => break (u16::from(f.code), f.reason.to_string()),
            Some(Ok(Message::Close(None))) => break (1005, String::new()),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    within("the end of the connection", async { while let Some(Ok(_)) = ws.next().await {} }).await;
    frame
}

/// Waits until the upstream saw a close frame; returns them all.
async fn upstream_closes(shared: &Shared) -> Vec<(u16, String)> {
    within("the upstream's close frame", async {
        loop {
            let closes = saw(shared, |s| s.closes.clone());
            if !closes.is_empty() {
                return closes;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// Waits until `series` of the proxy's `/metrics` is `want`.
async fn metric_reaches(proxy: &ProxyHandle, series: &str, want: f64) {
    within(series, async {
        loop {
            if sample(&metrics(proxy).await, series) == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_go_both_ways_byte_for_byte_and_are_counted() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |_| {}).await;
    let (mut ws, response) = connect(&proxy, "/v1/realtime?model=gpt-realtime", &[]).await.unwrap();
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(header(response.headers(), "x-upstream-session"), Some("sess_1"), "the upstream's headers");
    metric_reaches(&proxy, "spindle_proxy_websockets_active", 1.0).await;

    let non_ascii = "héllo — 日本語 🎉 \u{0}\u{7f}".to_string();
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let large_binary: Vec<u8> = (0..4 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let large_text = "Ω≈ç√∫ realtime delta ".repeat(40_000);
    let sent = [
        Message::text("hello"),
        Message::text(non_ascii.clone()),
        Message::text(""),
        Message::binary(all_bytes.clone()),
        Message::binary(Vec::new()),
        Message::binary(large_binary.clone()),
        Message::text(large_text.clone()),
    ];
    for message in &sent {
        within("a send", ws.send(message.clone())).await.unwrap();
        assert_eq!(next(&mut ws).await, *message, "echoed unchanged ({} bytes)", message.len());
    }
    // Pings: the client's reaches the upstream; the upstream's the client.
    within("a ping", ws.send(Message::Ping(b"are you there".to_vec().into()))).await.unwrap();
    within("a ping", ws.send(Message::text("ping:from upstream"))).await.unwrap();
    assert_eq!(next(&mut ws).await, Message::Ping(b"from upstream".to_vec().into()));
    assert_eq!(saw(&shared, |s| s.pings.clone()), [b"are you there".to_vec()]);

    let text = metrics(&proxy).await;
    assert_eq!(sample(&text, "spindle_proxy_websockets_total"), 1.0, "{text}");
    assert_eq!(sample(&text, "spindle_proxy_requests_total{kind=\"websocket\"}"), 1.0, "{text}");
    let up_count = sample(&text, "spindle_proxy_websocket_messages_total{direction=\"client_to_upstream\"}");
    let down_count = sample(&text, "spindle_proxy_websocket_messages_total{direction=\"upstream_to_client\"}");
    assert_eq!(up_count, sent.len() as f64 + 2.0, "{text}");
    assert!(down_count >= sent.len() as f64 + 1.0, "{text}");
    let payload: usize = sent.iter().map(Message::len).sum();
    assert!(sample(&text, "spindle_proxy_websocket_bytes_total{direction=\"client_to_upstream\"}") >= payload as f64);

    within("the close", ws.close(None)).await.unwrap();
    metric_reaches(&proxy, "spindle_proxy_websockets_active", 0.0).await;
    metric_reaches(&proxy, "spindle_proxy_websocket_ends_total{reason=\"closed\"}", 1.0).await;
    assert_eq!(sample(&metrics(&proxy).await, "spindle_proxy_requests_active"), 0.0);
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_forwards_end_to_end_headers_and_adds_the_configured_key() {
    let (up, shared) = upstream().await;
    // An upstream URL naming the API version: `/v1` is its base.
    let proxy = proxy(&format!("{up}/v1"), |c| c.upstream_api_key = Some(Secret::new("sk-proxy"))).await;
    let client_key = "x3JJHMbDL1EzLkh9GBhXDw==";
    let (mut ws, _) = connect(
        &proxy,
        "/v1/realtime?model=gpt-realtime",
        &[
            ("authorization", "Bearer sk-client"),
            ("openai-beta", "realtime=v1"),
            ("cookie", "session=abc"),
            ("x-custom", "kept"),
            ("x-hop", "dropped"),
            ("connection", "Upgrade, x-hop"),
            ("sec-websocket-key", client_key),
        ],
    )
    .await
    .unwrap();
    within("the close", ws.close(None)).await.unwrap();
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("the close", ws.close(None)).await.unwrap();

    let handshakes = saw(&shared, |s| s.handshakes.clone());
    assert_eq!(handshakes.len(), 2);
    let (target, h) = &handshakes[0];
    assert_eq!(target, "/v1/realtime?model=gpt-realtime", "path and query as the HTTP path maps them");
    assert_eq!(header(h, "authorization"), Some("Bearer sk-client"), "the client's own key wins");
    assert_eq!(header(h, "openai-beta"), Some("realtime=v1"));
    assert_eq!(header(h, "cookie"), Some("session=abc"));
    assert_eq!(header(h, "x-custom"), Some("kept"));
    assert_eq!(header(h, "x-hop"), None, "a header the client's Connection names is hop-by-hop");
    assert_eq!(header(h, "sec-websocket-version"), Some("13"));
    let key = header(h, "sec-websocket-key").unwrap_or_default();
    assert!(!key.is_empty() && key != client_key, "the proxy's own key upstream, not the client's: {key}");
    assert_eq!(header(h, "host"), Some(up.trim_start_matches("http://")), "the upstream's Host");
    let (target, h) = &handshakes[1];
    assert_eq!(target, "/v1/realtime");
    assert_eq!(header(h, "authorization"), Some("Bearer sk-proxy"), "the configured key when the client sent none");
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_the_subprotocol_the_upstream_chose() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |c| c.upstream_api_key = Some(Secret::new("sk-proxy"))).await;
    let offered = "openai-insecure-api-key.sk-browser, realtime, openai-beta.realtime-v1";
    let (mut ws, response) =
        connect(&proxy, "/v1/realtime?model=gpt-realtime", &[("sec-websocket-protocol", offered)]).await.unwrap();
    assert_eq!(header(response.headers(), "sec-websocket-protocol"), Some("realtime"));
    let seen = saw(&shared, |s| s.handshakes[0].1.clone());
    assert_eq!(header(&seen, "sec-websocket-protocol"), Some(offered), "the list as offered, key included");
    assert_eq!(header(&seen, "authorization"), None, "a key in a subprotocol is the client's: none added");
    within("a send", ws.send(Message::text("{\"type\":\"session.update\"}"))).await.unwrap();
    assert_eq!(next(&mut ws).await, Message::text("{\"type\":\"session.update\"}"));
    within("the close", ws.close(None)).await.unwrap();
    // Nothing offered: none chosen.
    let (mut ws, response) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    assert_eq!(header(response.headers(), "sec-websocket-protocol"), None);
    within("the close", ws.close(None)).await.unwrap();
    within("shutdown", proxy.shutdown()).await.unwrap();
}

/// A handshake sent as a plain HTTP request, to read a refusal whole.
async fn raw_handshake(proxy: &ProxyHandle, path: &str) -> reqwest::Response {
    let request = client()
        .get(format!("{}{path}", url(proxy)))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send();
    within("the refusal", request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_reaches_the_client_and_an_unreachable_upstream_is_a_502() {
    let (up, _) = upstream().await;
    let proxy = proxy(&up, |_| {}).await;
    let refused = raw_handshake(&proxy, "/v1/refuse").await;
    assert_eq!(refused.status(), 401);
    assert_eq!(refused.headers()["content-type"], "application/json");
    assert_eq!(within("the body", refused.text()).await.unwrap(), REFUSAL);
    // A WebSocket client sees the refusal, not a 101.
    match connect(&proxy, "/v1/refuse", &[]).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::UNAUTHORIZED),
        other => panic!("expected a 401, got {other:?}"),
    }
    assert_eq!(sample(&metrics(&proxy).await, "spindle_proxy_websockets_total"), 0.0);
    within("shutdown", proxy.shutdown()).await.unwrap();

    // Port 1: nothing listens.
    let proxy = proxy_support::proxy("http://127.0.0.1:1", |_| {}).await;
    let failed = raw_handshake(&proxy, "/v1/realtime").await;
    assert_eq!(failed.status(), 502);
    assert_eq!(failed.headers()["x-spindle-error-side"], "upstream");
    let body: Value = within("the body", failed.json()).await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_connect_failed", "{body}");
    match connect(&proxy, "/v1/realtime", &[]).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::BAD_GATEWAY),
        other => panic!("expected a 502, got {other:?}"),
    }
    // Not a handshake at all: no key.
    let broken = within(
        "a request",
        client()
            .get(format!("{}/v1/realtime", url(&proxy)))
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(broken.status(), 400);
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_codes_and_reasons_go_both_ways() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |_| {}).await;
    // The client closes.
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    let bye = CloseFrame { code: CloseCode::from(4000), reason: "client bye ✓".into() };
    within("the close", ws.close(Some(bye))).await.unwrap();
    assert_eq!(close_of(&mut ws).await, (4000, "client bye ✓".to_string()));
    assert_eq!(upstream_closes(&shared).await, [(4000, "client bye ✓".to_string())]);
    // The upstream closes.
    shared.lock().unwrap_or_else(|e| e.into_inner()).closes.clear();
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::text("close:4001:upstream bye"))).await.unwrap();
    assert_eq!(close_of(&mut ws).await, (4001, "upstream bye".to_string()));
    // The upstream's close was answered (by the proxy's socket, with its
    // own frame: see the websocket module's documentation).
    assert_eq!(upstream_closes(&shared).await, [(4001, "upstream bye".to_string())]);
    metric_reaches(&proxy, "spindle_proxy_websocket_ends_total{reason=\"closed\"}", 2.0).await;
    metric_reaches(&proxy, "spindle_proxy_websockets_active", 0.0).await;
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_closes_both_sides_with_1009() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |c| c.max_ws_message = 64 * 1024).await;
    // From the client.
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::binary(vec![1u8; 64 * 1024]))).await.unwrap();
    assert_eq!(next(&mut ws).await.len(), 64 * 1024, "at the limit: relayed");
    within("a send", ws.send(Message::binary(vec![1u8; 64 * 1024 + 1]))).await.unwrap();
    assert_eq!(close_of(&mut ws).await.0, 1009);
    drop(ws);
    assert_eq!(upstream_closes(&shared).await.first().map(|c| c.0), Some(1009));
    // From the upstream.
    shared.lock().unwrap_or_else(|e| e.into_inner()).closes.clear();
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::text("big:100000"))).await.unwrap();
    assert_eq!(close_of(&mut ws).await.0, 1009);
    assert_eq!(upstream_closes(&shared).await.first().map(|c| c.0), Some(1009));
    metric_reaches(&proxy, "spindle_proxy_websocket_ends_total{reason=\"too_big\"}", 2.0).await;
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_origin_policy_screens_handshakes() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |c: &mut ProxyConfig| c.allow_origins = vec!["https://app.example".into()]).await;
    match connect(&proxy, "/v1/realtime", &[("origin", "https://evil.example")]).await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), StatusCode::FORBIDDEN),
        other => panic!("expected a 403, got {other:?}"),
    }
    assert!(saw(&shared, |s| s.handshakes.is_empty()), "nothing went upstream");
    assert_eq!(sample(&metrics(&proxy).await, "spindle_proxy_refused_total{reason=\"origin\"}"), 1.0);
    let (mut ws, response) = connect(&proxy, "/v1/realtime", &[("origin", "https://app.example")]).await.unwrap();
    assert_eq!(header(response.headers(), "access-control-allow-origin"), Some("https://app.example"));
    within("a send", ws.send(Message::text("hi"))).await.unwrap();
    assert_eq!(next(&mut ws).await, Message::text("hi"));
    let seen = saw(&shared, |s| s.handshakes[0].1.clone());
    assert_eq!(header(&seen, "origin"), Some("https://app.example"), "forwarded as the HTTP path does");
    within("the close", ws.close(None)).await.unwrap();
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_open_sessions_with_1001() {
    let (up, shared) = upstream().await;
    let proxy = proxy(&up, |c| c.grace = Duration::from_millis(300)).await;
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::text("still here"))).await.unwrap();
    assert_eq!(next(&mut ws).await, Message::text("still here"));
    let stopping = tokio::spawn(proxy.shutdown());
    assert_eq!(close_of(&mut ws).await, (1001, "proxy shutting down".to_string()));
    assert_eq!(upstream_closes(&shared).await, [(1001, "proxy shutting down".to_string())]);
    within("shutdown", stopping).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_connection_slot_under_the_cap() {
    let (up, _) = upstream().await;
    let proxy = proxy(&up, |c| c.max_connections = 1).await;
    let (mut ws, _) = connect(&proxy, "/v1/realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::text("hi"))).await.unwrap();
    assert_eq!(next(&mut ws).await, Message::text("hi"));
    // hyper let go of the connection at the upgrade; its slot is held.
    assert_eq!(proxy.metrics().connections_active(), 1);
    assert_eq!(proxy.metrics().websockets_active(), 1);
    let endpoint = format!("{}/healthz", url(&proxy));
    let mut other = tokio::spawn(async move { client().get(endpoint).send().await.map(|r| r.status().as_u16()) });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut other).await;
    assert!(early.is_err(), "a connection was served past the cap beside a session: {early:?}");
    within("the close", ws.close(None)).await.unwrap();
    within("the end of the connection", async { while let Some(Ok(_)) = ws.next().await {} }).await;
    assert!(matches!(within("the waiting request", other).await, Ok(Ok(200))));
    within("shutdown", proxy.shutdown()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_text_is_parsed_on_the_side_into_the_sinks() {
    let (up, _) = upstream().await;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(10_000);
    let proxy = proxy(&up, |c| {
        c.options = StreamOptions::default();
        c.sinks = vec![SinkSpec::Channel(tx)];
    })
    .await;
    let (mut ws, _) = connect(&proxy, "/v1/realtime?model=gpt-realtime", &[]).await.unwrap();
    within("a send", ws.send(Message::text("realtime"))).await.unwrap();
    // The client gets every event as the upstream sent it.
    for event in realtime_events() {
        assert_eq!(next(&mut ws).await, Message::text(event.to_string()));
    }
    within("the close", ws.close(None)).await.unwrap();
    within("the end of the connection", async { while let Some(Ok(_)) = ws.next().await {} }).await;
    within("shutdown", proxy.shutdown()).await.unwrap();
    let mut records = Vec::new();
    while let Some(r) = rx.recv().await {
        records.push(serde_json::to_value(&*r).unwrap());
    }
    let elements: Vec<(&str, &str)> = records
        .iter()
        .filter(|r| r["type"] == "element")
        .map(|r| (r["tag"].as_str().unwrap_or_default(), r["text"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(
        elements[..2],
        [("content", "Two <b>cups</b> of tea."), ("content", "Hello <b>there</b>.")],
        "{records:?}"
    );
    assert_eq!(records.iter().filter(|r| r["type"] == "finish" && r["reason"] == "stop").count(), 2, "{records:?}");
    assert_eq!(records.iter().filter(|r| r["type"] == "truncated").count(), 1, "the cut response: {records:?}");
    assert!(records.iter().all(|r| r["model"] == "gpt-realtime" && r["path"] == "/v1/realtime"), "{records:?}");
    let streams: std::collections::BTreeSet<u64> = records.iter().filter_map(|r| r["stream"].as_u64()).collect();
    assert_eq!(streams.len(), 3, "a stream per response: {records:?}");
}
