//! The proxy's faults against real local servers on 127.0.0.1:0: a client
//! that goes away (mid-stream and before the first token), an upstream
//! that resets, stalls, refuses, speaks no HTTP, answers HTML or 500, a
//! client that reads slowly, a 10 MB line, 1,000 concurrent streams, the
//! stream limit, request limits and graceful shutdown.

mod proxy_support;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use bytes::Bytes;
use futures::StreamExt;
use proxy_support::*;
use serde_json::{Value, json};
use spindle::proxy::{SinkRecord, SinkSpec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

fn post(proxy: &str, model: &str, fault: &str) -> reqwest::RequestBuilder {
    client().post(format!("{proxy}/v1/chat/completions")).header("x-mock-fault", fault).json(&request(model, true))
}

/// Waits until `f` holds, up to `limit`.
async fn until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_upstream_within_100ms() {
    let mock = mock(0).await;
    let stats = mock.stats();
    let proxy = proxy(&mock.url(), |_| {}).await;
    // Mid-stream: three events arrive, then the upstream goes quiet and
    // the client leaves.
    let mut response = post(&url(&proxy), "sse-filament-tags", "stall-after=3").send().await.unwrap();
    let mut got = Vec::new();
    while datas(&got).len() < 3 {
        got.extend_from_slice(&response.chunk().await.unwrap().unwrap());
    }
    let left = Instant::now();
    drop(response);
    assert!(
        until(Duration::from_secs(2), || stats.streams_cancelled() == 1).await,
        "upstream never saw the disconnect"
    );
    let took = stats.last_cancel().unwrap().duration_since(left);
    assert!(took < Duration::from_millis(100), "upstream cancelled {took:?} after the client left");
    eprintln!("mid-stream disconnect seen by the upstream after {took:?}");

    // During the first token: the upstream sent its head but no byte yet.
    let pending = tokio::spawn(post(&url(&proxy), "sse-filament-tags", "stall-after=0").send());
    assert!(until(Duration::from_secs(2), || stats.streams_started() == 2).await);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let left = Instant::now();
    pending.abort();
    assert!(until(Duration::from_secs(2), || stats.streams_cancelled() == 2).await, "first-token disconnect not seen");
    let took = stats.last_cancel().unwrap().duration_since(left);
    assert!(took < Duration::from_millis(100), "upstream cancelled {took:?} after the client left");
    eprintln!("first-token disconnect seen by the upstream after {took:?}");
    let metrics = proxy.metrics();
    assert!(until(Duration::from_secs(1), || metrics.client_disconnects() == 2).await);
    assert!(until(Duration::from_secs(1), || metrics.requests_active() == 0).await);
}

#[tokio::test]
async fn upstream_reset_mid_stream_gives_an_in_band_error_then_done() {
    let mock = mock(0).await;
    for rewrite in [false, true] {
        let proxy = proxy(&mock.url(), |c| c.rewrite = rewrite).await;
        let response = post(&url(&proxy), "sse-filament-tags", "reset-after=4").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.bytes().await.unwrap();
        let d = datas(&body);
        assert_eq!(d.last().map(String::as_str), Some("[DONE]"), "rewrite={rewrite}");
        let error: Value = serde_json::from_str(&d[d.len() - 2]).unwrap();
        assert_eq!(error["error"]["code"], "upstream_reset", "{error}");
        assert_eq!(error["error"]["side"], "upstream");
        assert!(chunks(&body).iter().filter(|c| c.get("choices").is_some()).count() >= 4);
        let text = metrics(&proxy).await;
        assert_eq!(sample(&text, "spindle_proxy_upstream_errors_total{kind=\"upstream_reset\"}"), 1.0, "{text}");
        proxy.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn upstream_stall_gives_an_in_band_error_after_the_idle_timeout() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |c| c.idle_timeout = Duration::from_millis(300)).await;
    let started = Instant::now();
    let body = post(&url(&proxy), "sse-filament-tags", "stall-after=3").send().await.unwrap().bytes().await.unwrap();
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    let d = datas(&body);
    assert_eq!(d.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&d[d.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "upstream_stalled");
    assert_eq!(d.len(), 3 + 2, "three upstream events, the error, [DONE]");
}

async fn error_of(response: reqwest::Response) -> (u16, Value, String) {
    let status = response.status().as_u16();
    let side =
        response.headers().get("x-spindle-error-side").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    (status, response.json().await.unwrap(), side)
}

#[tokio::test]
async fn errors_before_the_first_byte_are_http_statuses() {
    let mock = mock(0).await;
    let slow = proxy(&mock.url(), |c| c.first_byte_timeout = Duration::from_millis(300)).await;
    // Nothing after the head, a slow head, a reset before the first byte.
    for (fault, status, code) in [
        ("stall-after=0", 504, "upstream_timeout"),
        ("delay-ms=2000", 504, "upstream_timeout"),
        ("reset-after=0", 502, "upstream_reset"),
    ] {
        let (s, body, side) = error_of(post(&url(&slow), "sse-filament-tags", fault).send().await.unwrap()).await;
        assert_eq!(
            (s, body["error"]["code"].as_str(), side.as_str()),
            (status, Some(code), "upstream"),
            "{fault}: {body}"
        );
        assert_eq!(body["error"]["type"], "upstream_error");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // The idle timeout is for silence inside a body: a head that takes
    // longer than it (a non-streamed answer, a long prefill) is waited for.
    let patient = proxy(&mock.url(), |c| {
        c.idle_timeout = Duration::from_millis(300);
        c.first_byte_timeout = Duration::from_secs(30);
    })
    .await;
    let response = post(&url(&patient), "sse-filament-tags", "delay-ms=1000").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    // A refused connection.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let refused = proxy(&format!("http://{addr}"), |_| {}).await;
    let (s, body, side) = error_of(post(&url(&refused), "m", "").send().await.unwrap()).await;
    assert_eq!((s, body["error"]["code"].as_str(), side.as_str()), (502, Some("upstream_connect_failed"), "upstream"));
    assert_eq!(body["error"]["retryable"], true);
    // An upstream that does not speak HTTP.
    let garbage = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = garbage.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = garbage.accept().await {
            let mut buf = [0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let _ = socket.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\nnot http at all\r\n").await;
        }
    });
    let bad = proxy(&format!("http://{addr}"), |_| {}).await;
    let (s, body, _) = error_of(post(&url(&bad), "m", "").send().await.unwrap()).await;
    assert_eq!((s, body["error"]["code"].as_str()), (502, Some("upstream_invalid_response")), "{body}");
    let text = metrics(&refused).await;
    assert_eq!(sample(&text, "spindle_proxy_upstream_errors_total{kind=\"upstream_connect_failed\"}"), 1.0);
}

#[tokio::test]
async fn html_and_500_from_the_upstream_pass_through_unchanged() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |_| {}).await;
    for fault in ["status=500", "status=429", "html=502", "html=200"] {
        for stream in [true, false] {
            let body = request("sse-filament-tags", stream);
            let send = |base: String| {
                client().post(format!("{base}/v1/chat/completions")).header("x-mock-fault", fault).json(&body).send()
            };
            let direct = send(mock.url()).await.unwrap();
            let proxied = send(url(&proxy)).await.unwrap();
            assert_eq!(direct.status(), proxied.status(), "{fault}");
            assert_eq!(direct.headers().get("content-type"), proxied.headers().get("content-type"), "{fault}");
            assert_eq!(direct.bytes().await.unwrap(), proxied.bytes().await.unwrap(), "{fault}");
        }
    }
    let text = metrics(&proxy).await;
    assert_eq!(sample(&text, "spindle_proxy_upstream_errors_total{kind=\"status_5xx\"}"), 4.0, "{text}");
    assert_eq!(sample(&text, "spindle_proxy_upstream_errors_total{kind=\"unexpected_content_type\"}"), 2.0);
    assert_eq!(sample(&text, "spindle_proxy_upstream_responses_total{status=\"429\"}"), 2.0);
}

/// An upstream streaming 1 KiB chunks without end, counting what it made.
fn endless(made: Arc<AtomicU64>) -> Router {
    Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let made = made.clone();
            async move {
                let filler = "x".repeat(1000);
                let body = futures::stream::iter(0u64..).map(move |i| {
                    let c = json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": format!("{i} {filler}")}}]});
                    let frame = format!("data: {c}\n\n");
                    made.fetch_add(frame.len() as u64, Ordering::Relaxed);
                    Ok::<_, std::io::Error>(Bytes::from(frame))
                });
                ([("content-type", "text/event-stream")], Body::from_stream(body)).into_response()
            }
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_does_not_make_the_proxy_buffer() {
    let made = Arc::new(AtomicU64::new(0));
    let upstream = serve(endless(made.clone())).await;
    let proxy = proxy(&upstream, |_| {}).await;
    // A raw client that sends its request and then reads one byte per 100 ms.
    let mut socket = tokio::net::TcpStream::connect(proxy.local_addr()).await.unwrap();
    let body = r#"{"model":"m","stream":true,"messages":[]}"#;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    let started = Instant::now();
    let mut at_2s = None;
    while started.elapsed() < Duration::from_secs(3) {
        if socket.read(&mut byte).await.unwrap() == 1 && first.len() < 12 {
            first.push(byte[0]);
        }
        if at_2s.is_none() && started.elapsed() >= Duration::from_secs(2) {
            at_2s = Some(made.load(Ordering::Relaxed));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let at_3s = made.load(Ordering::Relaxed);
    assert!(first.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&first));
    // The upstream is held back: what it made is bounded (socket buffers
    // and the proxy's channel), and it stopped growing.
    assert!(at_3s < 64 << 20, "upstream produced {at_3s} bytes for a client that read 30");
    let grew = at_3s - at_2s.unwrap_or(0);
    assert!(grew < 2 << 20, "upstream output still growing by {grew} bytes/s");
    assert_eq!(proxy.metrics().streams_active(), 1);
    drop(socket);
    let metrics = proxy.metrics();
    assert!(until(Duration::from_secs(2), || metrics.streams_active() == 0).await);
}

/// An upstream with a 10 MB `data:` line between two ordinary chunks.
fn huge_line_body() -> Vec<u8> {
    let chunk = |content: &str, finish: Value| {
        let c = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let mut body = chunk("<content>before ", Value::Null);
    body += &chunk(&"a".repeat(10 << 20), Value::Null);
    body += &chunk("after</content>", Value::Null);
    body += &chunk("", json!("stop"));
    body += "data: [DONE]\n\n";
    body.into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_10mb_line_is_forwarded_and_reported() {
    let body = Bytes::from(huge_line_body());
    let served = body.clone();
    let upstream = serve(Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move || {
            let pieces: Vec<Result<Bytes, std::io::Error>> =
                served.chunks(64 << 10).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
            async move { ([("content-type", "text/event-stream")], Body::from_stream(futures::stream::iter(pieces))) }
        }),
    ))
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(1000);
    let pass = proxy(&upstream, |c| c.sinks = vec![SinkSpec::Channel(tx)]).await;
    let got = post(&url(&pass), "m", "").send().await.unwrap().bytes().await.unwrap();
    assert!(got == body, "pass-through forwards the 10 MB line byte for byte");
    let text = metrics(&pass).await;
    assert_eq!(sample(&text, "spindle_proxy_diagnostics_total{code=\"sse_line_too_long\"}"), 1.0, "{text}");
    pass.shutdown().await.unwrap();
    let mut records = Vec::new();
    while let Some(r) = rx.recv().await {
        records.push(serde_json::to_value(&*r).unwrap());
    }
    let content: Vec<&Value> = records.iter().filter(|r| r["type"] == "element" && r["tag"] == "content").collect();
    assert_eq!(content.len(), 1);
    assert_eq!(content[0]["text"], "before after", "the parse resynchronised after the long line");
    assert!(records.iter().any(|r| r["type"] == "finish"));

    // Rewriting, the long event cannot be re-sent: the client is told.
    let rewrite = proxy(&upstream, |c| c.rewrite = true).await;
    let got = post(&url(&rewrite), "m", "").send().await.unwrap().bytes().await.unwrap();
    assert!(got.len() < 1 << 20);
    let errors: Vec<Value> = chunks(&got).into_iter().filter(|c| c.get("error").is_some()).collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["error"]["code"], "proxy_line_too_long");
    assert_eq!(datas(&got).last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_streams_none_lost() {
    const N: usize = 1000;
    // Every upstream stream sends its first event, then waits until all N
    // are open at once (the last to arrive checks that the proxy counts N
    // streams in flight, then releases them all), then finishes.
    let arrived = Arc::new(AtomicU64::new(0));
    let (release, released) = tokio::sync::watch::channel(false);
    let release = Arc::new(release);
    let peak = Arc::new(AtomicU64::new(0));
    let metrics_slot: Arc<std::sync::OnceLock<Arc<spindle::proxy::Metrics>>> = Arc::default();
    let (a, r, w, p, m) = (arrived.clone(), release.clone(), released.clone(), peak.clone(), metrics_slot.clone());
    let upstream = serve(Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: axum::Json<Value>| {
            let (a, r, mut w, p, m) = (a.clone(), r.clone(), w.clone(), p.clone(), m.clone());
            async move {
                let n = body.0["n_client"].as_u64().unwrap_or(0);
                let chunk = move |content: String, finish: Value| {
                    let c = json!({"id": format!("c{n}"), "object": "chat.completion.chunk",
                        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]});
                    Bytes::from(format!("data: {c}\n\n"))
                };
                let first = chunk(format!("<content>stream {n}"), Value::Null);
                let rest = async move {
                    if a.fetch_add(1, Ordering::SeqCst) + 1 == N as u64 {
                        // The last stream's first byte may still be on its
                        // way through the proxy.
                        let start = Instant::now();
                        while start.elapsed() < Duration::from_secs(5) {
                            if let Some(metrics) = m.get() {
                                p.fetch_max(metrics.streams_active() as u64, Ordering::Relaxed);
                            }
                            if p.load(Ordering::Relaxed) >= N as u64 {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        let _ = r.send(true);
                    } else {
                        let _ = w.wait_for(|open| *open).await;
                    }
                    futures::stream::iter(vec![
                        chunk(format!(" done {n}</content>"), Value::Null),
                        chunk(String::new(), json!("stop")),
                        Bytes::from_static(b"data: [DONE]\n\n"),
                    ])
                };
                let body = futures::stream::once(async move { first })
                    .chain(futures::stream::once(rest).flatten())
                    .map(Ok::<_, std::io::Error>);
                ([("content-type", "text/event-stream")], Body::from_stream(body))
            }
        }),
    ))
    .await;
    let proxy = proxy(&upstream, |_| {}).await;
    let _ = metrics_slot.set(proxy.metrics());
    let http = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap();
    let base = url(&proxy);
    let started = Instant::now();
    let tasks: Vec<_> = (0..N)
        .map(|n| {
            let (http, base) = (http.clone(), base.clone());
            tokio::spawn(async move {
                let body = json!({"model": "m", "stream": true, "n_client": n, "messages": []});
                let r = http.post(format!("{base}/v1/chat/completions")).json(&body).send().await?;
                let status = r.status();
                let bytes = r.bytes().await?;
                Ok::<_, reqwest::Error>((n, status, bytes))
            })
        })
        .collect();
    let results = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks))
        .await
        .expect("1000 streams within 60 s");
    let mut ok = 0;
    for r in results {
        let (n, status, bytes) = r.unwrap().unwrap();
        assert_eq!(status, StatusCode::OK, "stream {n}");
        assert_eq!(content(&bytes), format!("<content>stream {n} done {n}</content>"), "stream {n}");
        assert_eq!(datas(&bytes).last().map(String::as_str), Some("[DONE]"), "stream {n}");
        ok += 1;
    }
    assert_eq!(ok, N);
    assert_eq!(peak.load(Ordering::Relaxed), N as u64, "all streams were open at once");
    let metrics = proxy.metrics();
    assert_eq!(metrics.streams_total(), N as u64);
    assert!(until(Duration::from_secs(2), || metrics.streams_active() == 0).await);
    eprintln!("{N} concurrent streams through the proxy in {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_give_503_and_413() {
    let mock = mock(0).await;
    let proxy = proxy(&mock.url(), |c| {
        c.max_streams = 2;
        c.max_request_body = 4096;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut r = post(&url(&proxy), "sse-filament-tags", "stall-after=1").send().await.unwrap();
        let _ = r.chunk().await.unwrap();
        held.push(r);
    }
    let (status, body, side) = error_of(post(&url(&proxy), "sse-filament-tags", "").send().await.unwrap()).await;
    assert_eq!((status, body["error"]["code"].as_str(), side.as_str()), (503, Some("proxy_overloaded"), "internal"));
    drop(held);
    let metrics = proxy.metrics();
    assert!(until(Duration::from_secs(2), || metrics.requests_active() == 0).await);
    let r = post(&url(&proxy), "sse-filament-tags", "").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "permits come back when streams end");
    let _ = r.bytes().await.unwrap();
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(10_000)}]});
    let r = client().post(format!("{}/v1/chat/completions", url(&proxy))).json(&big).send().await.unwrap();
    let (status, body, side) = error_of(r).await;
    assert_eq!((status, body["error"]["code"].as_str(), side.as_str()), (413, Some("request_too_large"), "downstream"));
    assert_eq!(metrics.rejected_total(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_streams_finish_then_cuts_them() {
    let mock = mock(25).await;
    // A stream that outlives the shutdown request but not the grace period.
    let proxy = proxy(&mock.url(), |c| c.grace = Duration::from_secs(10)).await;
    let addr = proxy.local_addr();
    let mut r = post(&url(&proxy), "sse-filament-tags", "").send().await.unwrap();
    let mut body = r.chunk().await.unwrap().unwrap().to_vec();
    let stopping = tokio::spawn(proxy.shutdown());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "no new connections once shutting down");
    while let Some(c) = r.chunk().await.unwrap() {
        body.extend_from_slice(&c);
    }
    let direct = client()
        .post(format!("{}/v1/chat/completions", mock.url()))
        .json(&request("sse-filament-tags", true))
        .send()
        .await
        .unwrap();
    assert!(body == direct.bytes().await.unwrap(), "the running stream finished whole");
    tokio::time::timeout(Duration::from_secs(5), stopping).await.unwrap().unwrap().unwrap();

    // A stream still running at the end of the grace period is cut, loudly.
    let proxy = proxy_support::proxy(&mock.url(), |c| c.grace = Duration::from_millis(300)).await;
    let mut r = post(&url(&proxy), "sse-filament-tags", "stall-after=2").send().await.unwrap();
    let mut body = r.chunk().await.unwrap().unwrap().to_vec();
    let started = Instant::now();
    let stopping = tokio::spawn(proxy.shutdown());
    while let Some(c) = r.chunk().await.unwrap() {
        body.extend_from_slice(&c);
    }
    let d = datas(&body);
    assert_eq!(d.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&d[d.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "proxy_shutting_down");
    tokio::time::timeout(Duration::from_secs(5), stopping).await.unwrap().unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}
