//! The client and the async event stream against real local servers on
//! 127.0.0.1:0: streamed and whole responses, error statuses, HTML, a
//! connection reset mid-stream, a stalled server, a refused connection,
//! and cancellation when the caller drops the stream.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};
use spindle::sources::{
    ChatClient, ClientError, ErrorOrigin, ErrorSide, EventStream, SourceEvent, StreamOptions, Truncation,
};
use std::time::Duration;
use tokio::sync::oneshot;

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let c = json!({"id": "c1", "object": "chat.completion.chunk", "model": "local", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

fn sse_body() -> String {
    let mut s = String::from(": connected\n\n");
    s += &chunk(json!({"role": "assistant", "reasoning_content": "Adding."}), None);
    s += &chunk(json!({"content": "<b>2+2</b> = "}), None);
    s += &chunk(json!({"content": "4"}), None);
    s += &chunk(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "show", "arguments": "{\"n\":4}"}}]}),
        None,
    );
    s += &chunk(json!({}), Some("tool_calls"));
    s += "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"total_tokens\":7}}\n\ndata: [DONE]\n\n";
    s
}

/// The body in 5-byte pieces, so every JSON chunk arrives split.
fn pieces(text: String) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    let parts: Vec<Result<Bytes, std::io::Error>> =
        text.into_bytes().chunks(5).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    futures::stream::iter(parts)
}

fn sse_response(body: Body) -> Response {
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

async fn ok(headers: HeaderMap, body: axum::Json<Value>) -> Response {
    if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some("Bearer test-key") {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": {"message": "bad key", "type": "auth"}})))
            .into_response();
    }
    if body.0.get("stream") != Some(&Value::Bool(true)) || body.0.get("model") != Some(&json!("m")) {
        return (StatusCode::BAD_REQUEST, "stream must be true").into_response();
    }
    sse_response(Body::from_stream(pieces(sse_body())))
}

async fn server_error() -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": {"message": "overloaded", "type": "server_error"}})))
        .into_response()
}

async fn html() -> Response {
    ([(header::CONTENT_TYPE, "text/html")], "<html><body>Please log in</body></html>").into_response()
}

async fn whole() -> Response {
    axum::Json(json!({
        "id": "r1", "object": "chat.completion", "model": "local",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "<think>hm</think>Fine."}}],
        "usage": {"total_tokens": 3}
    }))
    .into_response()
}

async fn reset() -> Response {
    let first = futures::stream::iter(vec![Ok(Bytes::from(chunk(json!({"content": "Half an ans"}), None)))]);
    // The reset comes after the headers and the first chunk went out.
    let reset = futures::stream::once(async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "upstream reset"))
    });
    sse_response(Body::from_stream(first.chain(reset)))
}

async fn stall() -> Response {
    let first =
        futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(chunk(json!({"content": "Wait"}), None)))]);
    sse_response(Body::from_stream(first.chain(futures::stream::pending())))
}

/// Starts the server; returns its base URL.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

fn router() -> Router {
    Router::new()
        .route("/v1/chat/completions", post(ok))
        .route("/busy/v1/chat/completions", post(server_error))
        .route("/html/v1/chat/completions", post(html))
        .route("/whole/v1/chat/completions", post(whole))
        .route("/reset/v1/chat/completions", post(reset))
        .route("/stall/v1/chat/completions", post(stall))
}

async fn collect(mut events: EventStream) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    while let Some(e) = events.next().await {
        out.push(e);
    }
    out
}

fn tags(events: &[SourceEvent]) -> Vec<(String, String)> {
    events.iter().filter_map(SourceEvent::as_element).map(|e| (e.tag.to_string(), e.text.clone())).collect()
}

fn request() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "2+2?"}]})
}

#[tokio::test]
async fn streams_a_chat_completion_through_split_reads() {
    let base = serve(router()).await;
    let client = ChatClient::new(format!("{base}/v1/")).with_api_key("test-key");
    assert_eq!(client.endpoint(), format!("{base}/v1/chat/completions"));
    let events = collect(client.stream_chat(&request()).await.expect("stream starts")).await;
    assert_eq!(
        tags(&events),
        [
            ("thought".to_string(), "Adding.".to_string()),
            ("content".to_string(), "<b>2+2</b> = 4".to_string()),
            ("tool_call".to_string(), "{\"n\":4}".to_string()),
        ]
    );
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Finish { .. })));
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Usage { usage } if usage["total_tokens"] == 7)));
    assert!(matches!(events.last(), Some(SourceEvent::Done)), "{:?}", events.last());
}

#[tokio::test]
async fn error_statuses_say_who_failed_and_whether_to_retry() {
    let base = serve(router()).await;
    let err = ChatClient::new(format!("{base}/v1")).stream_chat(&request()).await.expect_err("no key");
    assert!(matches!(&err, ClientError::Status { status: 401, message, .. } if message == "bad key"), "{err}");
    assert_eq!(err.side(), ErrorSide::Local);
    assert!(!err.is_retryable());

    let err = ChatClient::new(format!("{base}/busy/v1")).stream_chat(&request()).await.expect_err("503");
    assert!(matches!(&err, ClientError::Status { status: 503, .. }), "{err}");
    assert_eq!(err.side(), ErrorSide::Upstream);
    assert!(err.is_retryable());

    let err = ChatClient::new(format!("{base}/html/v1")).stream_chat(&request()).await.expect_err("html");
    assert!(
        matches!(&err, ClientError::NotEventStream { content_type, excerpt, .. } if content_type == "text/html" && excerpt.contains("log in")),
        "{err}"
    );

    let err = ChatClient::new(format!("{base}/v1")).stream_chat(&json!(["not", "an object"])).await.expect_err("array");
    assert!(matches!(err, ClientError::InvalidRequest(_)));
}

#[tokio::test]
async fn refused_connection_is_a_retryable_upstream_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let err = ChatClient::new(format!("http://{addr}/v1")).stream_chat(&request()).await.expect_err("refused");
    assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    assert_eq!(err.side(), ErrorSide::Upstream);
    assert!(err.is_retryable());
}

#[tokio::test]
async fn a_whole_json_answer_is_read_too() {
    let base = serve(router()).await;
    let events =
        collect(ChatClient::new(format!("{base}/whole/v1")).stream_chat(&request()).await.expect("json")).await;
    assert_eq!(
        tags(&events),
        [("thought".to_string(), "hm".to_string()), ("content".to_string(), "Fine.".to_string())]
    );
    assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })));
}

#[tokio::test]
async fn a_reset_mid_stream_is_an_error_event_then_truncation() {
    let base = serve(router()).await;
    let events =
        collect(ChatClient::new(format!("{base}/reset/v1")).stream_chat(&request()).await.expect("starts")).await;
    assert_eq!(tags(&events), [("content".to_string(), "Half an ans".to_string())]);
    assert!(events.iter().any(|e| matches!(e, SourceEvent::StreamError { origin: ErrorOrigin::Transport, .. })));
    assert!(matches!(events.last(), Some(SourceEvent::Truncated { why: Truncation::Transport, .. })));
}

#[tokio::test]
async fn a_stalled_server_hits_the_idle_timeout() {
    let base = serve(router()).await;
    let client = ChatClient::new(format!("{base}/stall/v1")).with_idle_timeout(Some(Duration::from_millis(200)));
    let started = std::time::Instant::now();
    let events = collect(client.stream_chat(&request()).await.expect("starts")).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let error = events.iter().find_map(|e| match e {
        SourceEvent::StreamError { error, .. } => error["message"].as_str().map(str::to_string),
        _ => None,
    });
    assert!(error.is_some_and(|m| m.contains("no data")));
    assert!(matches!(events.last(), Some(SourceEvent::Truncated { why: Truncation::Transport, .. })));
}

/// Dropping the event stream closes the connection: the server's body is
/// dropped soon after.
#[tokio::test]
async fn dropping_the_stream_cancels_the_request() {
    struct Guard(Option<oneshot::Sender<()>>);
    impl Drop for Guard {
        fn drop(&mut self) {
            if let Some(tx) = self.0.take() {
                let _ = tx.send(());
            }
        }
    }
    let (tx, rx) = oneshot::channel();
    let tx = std::sync::Mutex::new(Some(tx));
    let guarded = std::sync::Arc::new(tx);
    let router = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let guard = Guard(guarded.lock().ok().and_then(|mut t| t.take()));
            async move {
                let first = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(chunk(
                    json!({"content": "x"}),
                    None,
                )))]);
                let endless = futures::stream::unfold(guard, |g| async move {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Some((Ok(Bytes::from_static(b": tick\n\n")), g))
                });
                sse_response(Body::from_stream(first.chain(endless)))
            }
        }),
    );
    let base = serve(router).await;
    let mut events = ChatClient::new(format!("{base}/v1")).stream_chat(&request()).await.expect("starts");
    // Read until the first content delta, then go away.
    while let Some(e) = events.next().await {
        if matches!(&e, SourceEvent::Choice(c) if matches!(c.event, spindle::event::Event::Delta(_))) {
            break;
        }
    }
    drop(events);
    tokio::time::timeout(Duration::from_secs(2), rx).await.expect("server body dropped within 2 s").ok();
}

#[tokio::test]
async fn any_byte_stream_can_be_wrapped() {
    let events = collect(EventStream::sse(pieces(sse_body()), StreamOptions::default())).await;
    assert_eq!(tags(&events).len(), 3);
    let events =
        collect(EventStream::json(pieces("{\"error\":{\"message\":\"nope\"}}".into()), StreamOptions::default())).await;
    assert!(events.iter().any(|e| matches!(e, SourceEvent::StreamError { origin: ErrorOrigin::InBand, .. })));
    let events = collect(EventStream::json(pieces("<html>".into()), StreamOptions::default())).await;
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Diagnostic(d) if d.code == "invalid_response_json")));
    // JSON lines (Ollama's /api/chat), split every 5 bytes: the same
    // elements as the synchronous LineTap gives.
    let lines = "{\"message\":{\"role\":\"assistant\",\"content\":\"<think>hm</think>4\"},\"done\":false}\n\
                 {\"message\":{\"role\":\"assistant\",\"content\":\"2\"},\"done\":true,\"done_reason\":\"stop\"}\n";
    let events = collect(EventStream::ndjson(pieces(lines.into()), StreamOptions::default())).await;
    assert_eq!(tags(&events), [("thought".to_string(), "hm".to_string()), ("content".to_string(), "42".to_string())]);
    assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })), "{events:?}");
    let tap_events = spindle::LineTap::new(StreamOptions::default()).feed(lines.as_bytes());
    assert!(tap_events.iter().all(|e| events.contains(e)), "{tap_events:?}");
}

/// Parser-holding types are `Send` (a stream moves between tasks) but not
/// `Sync`: the incremental HTML filter (lol_html) is not, and a parser is
/// only ever driven by one task at a time.
#[test]
fn public_types_are_send_and_sync() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<EventStream>();
    send::<spindle::Parser>();
    send::<spindle::sources::StreamTap>();
    send::<spindle::sources::ChatStream>();
    send::<ChatClient>();
    sync::<ChatClient>();
    send::<SourceEvent>();
    sync::<SourceEvent>();
    send::<ClientError>();
    sync::<ClientError>();
    send::<spindle::sources::SseDecoder>();
    sync::<spindle::sources::SseDecoder>();
}
