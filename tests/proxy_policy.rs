//! Who may talk to the proxy, and for how long, against real servers on
//! 127.0.0.1:0: `Host` names (DNS rebinding) on both listeners, browser
//! origins and CORS (cross-site requests, preflights), the upstream's own
//! CORS headers, and slow clients (a stalled body, the shared request
//! buffer, silent and slow request heads, the connection cap). Raw TCP
//! where a well-behaved client cannot misbehave enough.

mod proxy_support;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method};
use axum::response::Response;
use proxy_support::*;
use serde_json::{Value, json};
use spindle::proxy::{ProxyConfig, ProxyHandle, ProxyServer, UiConfig};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the upstream of these tests received: method and path.
type Seen = Arc<Mutex<Vec<String>>>;

/// The SSE body the upstream streams.
const SSE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n\
                   data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                   data: [DONE]\n\n";

/// An upstream that answers every request as llama.cpp's and vLLM's
/// servers do by default, allowing any origin: a chat stream (or a JSON
/// answer to a request without `"stream": true`) with
/// `Access-Control-Allow-Origin: *` and friends. Records what it got.
async fn permissive_upstream() -> (String, Seen) {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = Router::new().fallback(move |method: Method, uri: axum::http::Uri, body: String| {
        let record = record.clone();
        async move {
            record.lock().map(|mut s| s.push(format!("{method} {}", uri.path()))).unwrap_or(());
            let streamed = serde_json::from_str::<Value>(&body).is_ok_and(|v| v["stream"] == true);
            let (kind, body) = if streamed {
                ("text/event-stream", SSE.to_string())
            } else {
                ("application/json", json!({"id": "c", "object": "chat.completion", "choices": []}).to_string())
            };
            Response::builder()
                .header("content-type", kind)
                .header("access-control-allow-origin", "*")
                .header("access-control-allow-credentials", "true")
                .header("access-control-allow-methods", "*")
                .header("access-control-expose-headers", "*")
                .header("x-upstream", "yes")
                .body(Body::from(body))
                .unwrap_or_default()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), seen)
}

fn seen(s: &Seen) -> Vec<String> {
    s.lock().map(|s| s.clone()).unwrap_or_default()
}

/// A proxy on `listen` with the inspector on 127.0.0.1:0.
async fn proxy_on(upstream: &str, listen: &str, f: impl FnOnce(&mut ProxyConfig)) -> ProxyHandle {
    let mut config = ProxyConfig::new(upstream);
    config.ui = Some(UiConfig { listen: "127.0.0.1:0".into(), ..UiConfig::default() });
    f(&mut config);
    ProxyServer::bind(config, listen).await.unwrap().spawn()
}

fn chat_body(stream: bool) -> String {
    json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

/// The `error` object of a JSON error body.
async fn error_of(response: reqwest::Response) -> Value {
    response.json::<Value>().await.map(|v| v["error"].clone()).unwrap_or(Value::Null)
}

fn cors_headers(headers: &HeaderMap) -> Vec<String> {
    headers.keys().map(|k| k.as_str().to_string()).filter(|k| k.starts_with("access-control-")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebinding_host_is_refused_on_both_listeners() {
    let (up, upstream_saw) = permissive_upstream().await;
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.upstream_api_key = Some(spindle::proxy::Secret::new("sk-x"))).await;
    let port = proxy.local_addr().port();
    let ui = proxy.ui_addr().expect("the inspector listens");
    let chat = format!("{}/v1/chat/completions", url(&proxy));

    // The DNS-rebinding page's request: refused before anything is read
    // or sent upstream with the proxy's key.
    let r = client()
        .post(&chat)
        .header("host", format!("rebind.attacker.example:{port}"))
        .header("content-type", "application/json")
        .body(chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-spindle-error-side"], "downstream");
    let err = error_of(r).await;
    assert_eq!(err["code"], "host_not_allowed", "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.contains("--allowed-host rebind.attacker.example"), "{message}");
    assert!(seen(&upstream_saw).is_empty(), "nothing went upstream");
    // Also the proxy's own endpoints.
    let r = client().get(format!("{}/metrics", url(&proxy))).header("host", "evil.example").send().await.unwrap();
    assert_eq!(r.status(), 403);

    // The inspector (no token on loopback): its streams are not served to
    // the rebinding page, on any of its paths.
    for path in ["/ui", "/ui/app.js", "/ui/api/streams", "/ui/api/streams/1", "/ui/api/events", "/nope"] {
        let r = client()
            .get(format!("http://{ui}{path}"))
            .header("host", format!("rebind.attacker.example:{}", ui.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{path}");
        assert_eq!(error_of(r).await["code"], "host_not_allowed", "{path}");
    }

    // Loopback names, with any port, pass on both.
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "app.localhost".into(), "[::1]:1".into()] {
        let r = client().post(&chat).header("host", &host).body(chat_body(false)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{host}");
        let r = client().get(format!("http://{ui}/ui/api/streams")).header("host", &host).send().await.unwrap();
        assert_eq!(r.status(), 200, "{host}");
    }
    assert_eq!(proxy.metrics().refused_for("host"), 8);
    proxy.shutdown().await.unwrap();

    // --allowed-host adds names (any port) on both listeners.
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.allowed_hosts = vec!["Proxy.LAN".into()]).await;
    let ui = proxy.ui_addr().expect("the inspector listens");
    let r = client().get(format!("{}/healthz", url(&proxy))).header("host", "proxy.lan:8787").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client().get(format!("http://{ui}/ui/api/streams")).header("host", "proxy.lan").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client().get(format!("{}/healthz", url(&proxy))).header("host", "other.lan").send().await.unwrap();
    assert_eq!(r.status(), 403);
    proxy.shutdown().await.unwrap();

    // A listener on every address answers to any name, unless names are
    // given; then to those and the loopback ones.
    let open = proxy_on(&up, "0.0.0.0:0", |_| {}).await;
    let at = format!("http://127.0.0.1:{}", open.local_addr().port());
    let r = client().get(format!("{at}/healthz")).header("host", "gpu-box.lan:8787").send().await.unwrap();
    assert_eq!(r.status(), 200);
    open.shutdown().await.unwrap();
    let listed = proxy_on(&up, "0.0.0.0:0", |c| c.allowed_hosts = vec!["gpu-box.lan".into()]).await;
    let at = format!("http://127.0.0.1:{}", listed.local_addr().port());
    for (host, status) in [("gpu-box.lan:8787", 200), ("localhost", 200), ("other.lan", 403)] {
        let r = client().get(format!("{at}/healthz")).header("host", host).send().await.unwrap();
        assert_eq!(r.status(), status, "{host}");
    }
    listed.shutdown().await.unwrap();

    // A value that is no host name stops the proxy at start.
    let mut config = ProxyConfig::new(&up);
    config.allowed_hosts = vec!["http://proxy.lan:8787".into()];
    let err = ProxyServer::bind(config, "127.0.0.1:0").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("is not a host name"), "{err}");
}

/// A page's POST of a chat request to `endpoint`, from `origin`.
fn from_page(endpoint: &str, origin: &'static str, stream: bool) -> reqwest::RequestBuilder {
    client().post(endpoint).header("origin", origin).body(chat_body(stream))
}

/// A browser's CORS preflight for a POST from `origin`.
fn preflight(endpoint: &str, origin: &'static str) -> reqwest::RequestBuilder {
    client()
        .request(Method::OPTIONS, endpoint)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type, authorization")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_are_refused_and_allowed_origins_get_cors() {
    let (up, upstream_saw) = permissive_upstream().await;
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.upstream_api_key = Some(spindle::proxy::Secret::new("sk-x"))).await;
    let chat = format!("{}/v1/chat/completions", url(&proxy));

    // A "simple" cross-site request (text/plain, no preflight): refused,
    // and the upstream never sees it.
    let r =
        from_page(&chat, "http://attacker.example", false).header("content-type", "text/plain").send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(cors_headers(r.headers()).is_empty());
    let err = error_of(r).await;
    assert_eq!(err["code"], "origin_not_allowed", "{err}");
    assert!(err["message"].as_str().unwrap_or_default().contains("--allow-origin http://attacker.example"), "{err}");
    // Its preflight: refused by the proxy, not forwarded.
    let r = preflight(&chat, "http://attacker.example").send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(cors_headers(r.headers()).is_empty());
    // `null` (a sandboxed frame, a file) is an origin like another.
    let r = from_page(&chat, "null", false).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert!(seen(&upstream_saw).is_empty(), "{:?}", seen(&upstream_saw));
    assert_eq!(proxy.metrics().refused_for("origin"), 3);

    // No Origin (curl, an SDK): served, and the upstream's CORS headers
    // stay behind.
    let r = client().post(&chat).body(chat_body(false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-upstream"], "yes");
    assert!(cors_headers(r.headers()).is_empty(), "{:?}", r.headers());
    // An OPTIONS that is no browser's preflight goes upstream as before.
    let r = client().request(Method::OPTIONS, &chat).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(cors_headers(r.headers()).is_empty(), "{:?}", r.headers());
    assert_eq!(seen(&upstream_saw), ["POST /v1/chat/completions", "OPTIONS /v1/chat/completions"]);
    proxy.shutdown().await.unwrap();

    // An allowed origin: its preflight answered by the proxy, its requests
    // served with the proxy's own CORS headers (never the upstream's).
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.allow_origins = vec!["https://App.example/".into()]).await;
    let chat = format!("{}/v1/chat/completions", url(&proxy));
    let before = seen(&upstream_saw).len();
    let r = preflight(&chat, "https://app.example")
        .header("access-control-request-private-network", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://app.example");
    assert_eq!(h["access-control-allow-methods"], "POST");
    assert_eq!(h["access-control-allow-headers"], "content-type, authorization");
    assert_eq!(h["access-control-max-age"], "600");
    assert_eq!(h["access-control-allow-private-network"], "true");
    assert!(h["vary"].to_str().unwrap_or_default().contains("Origin"));
    assert!(h.get("access-control-allow-credentials").is_none());
    assert_eq!(seen(&upstream_saw).len(), before, "the preflight was not forwarded");
    for stream in [false, true] {
        let r = from_page(&chat, "https://app.example", stream)
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let h = r.headers();
        assert_eq!(h["access-control-allow-origin"], "https://app.example", "stream={stream}");
        assert_eq!(cors_headers(h), ["access-control-allow-origin"], "stream={stream}");
        assert!(h.get_all("vary").iter().any(|v| v == "Origin"), "stream={stream}");
        let body = r.bytes().await.unwrap();
        if stream {
            assert_eq!(&body[..], SSE.as_bytes(), "the stream passes through unchanged");
        }
    }
    // Another origin is still refused, and its preflight too.
    let r = preflight(&chat, "https://other.example").send().await.unwrap();
    assert_eq!(r.status(), 403);
    proxy.shutdown().await.unwrap();

    // `*`: any origin.
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.allow_origins = vec!["*".into()]).await;
    let chat = format!("{}/v1/chat/completions", url(&proxy));
    let r = from_page(&chat, "http://localhost:5173", false).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "http://localhost:5173");
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstreams_cors_headers_are_dropped_and_bodies_are_unchanged() {
    let (up, _) = permissive_upstream().await;
    let proxy = proxy(&up, |_| {}).await;
    for stream in [true, false] {
        let direct = client().post(format!("{up}/v1/chat/completions")).body(chat_body(stream)).send().await.unwrap();
        assert_eq!(cors_headers(direct.headers()).len(), 4, "the upstream does send them");
        let proxied =
            client().post(format!("{}/v1/chat/completions", url(&proxy))).body(chat_body(stream)).send().await.unwrap();
        assert!(cors_headers(proxied.headers()).is_empty(), "stream={stream}: {:?}", proxied.headers());
        assert_eq!(proxied.headers()["x-upstream"], "yes");
        assert_eq!(direct.bytes().await.unwrap(), proxied.bytes().await.unwrap(), "stream={stream}");
    }
    proxy.shutdown().await.unwrap();
}

/// Sends `bytes` on a new connection to `addr` and returns the stream.
async fn raw(addr: std::net::SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(bytes).await.unwrap();
    tcp
}

/// Reads until the peer closes (or `limit` passes): what came, and
/// whether it closed.
async fn read_to_close(tcp: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

fn head(content_length: usize) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stalls_mid_body_gets_408() {
    let (up, upstream_saw) = permissive_upstream().await;
    let proxy = proxy(&up, |c| c.request_timeout = Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut tcp = raw(proxy.local_addr(), format!("{}{{\"model\":", head(100)).as_bytes()).await;
    let (answer, closed) = read_to_close(&mut tcp, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\"") && answer.contains("--request-timeout"), "{answer}");
    assert!(closed && started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(seen(&upstream_saw).is_empty());
    assert_eq!(proxy.metrics().refused_for("request_timeout"), 1);
    // A client that keeps sending is not cut off by the same timeout.
    let body = chat_body(false);
    let mut tcp = raw(proxy.local_addr(), head(body.len()).as_bytes()).await;
    for piece in body.as_bytes().chunks(body.len() / 4 + 1) {
        tokio::time::sleep(Duration::from_millis(150)).await;
        tcp.write_all(piece).await.unwrap();
    }
    let mut buf = [0u8; 12];
    tcp.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_share_a_bounded_buffer() {
    let (up, _) = permissive_upstream().await;
    let proxy = proxy(&up, |c| {
        c.max_request_body = 4096;
        c.max_request_buffer = 4096;
    })
    .await;
    // A holds 3000 bytes of a 4000-byte body and stalls.
    let filler = format!("{{\"model\":\"m\",\"pad\":\"{}", "x".repeat(2980));
    let mut held = raw(proxy.local_addr(), format!("{}{filler}", head(4000)).as_bytes()).await;
    let buffered = || async { sample(&metrics(&proxy).await, "spindle_proxy_request_buffer_bytes") };
    let start = Instant::now();
    while buffered().await < 3000.0 {
        assert!(start.elapsed() < Duration::from_secs(10), "the proxy never read the held body");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B does not fit beside it: 503, retry later.
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "y".repeat(1500)}]}).to_string();
    let r = client().post(format!("{}/v1/chat/completions", url(&proxy))).body(big.clone()).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let err = error_of(r).await;
    assert_eq!((err["code"].as_str(), err["retryable"].as_bool()), (Some("proxy_request_buffer_full"), Some(true)));
    // A small one still fits.
    let r = client().post(format!("{}/v1/chat/completions", url(&proxy))).body(chat_body(false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // A goes away: its room comes back, and B fits.
    held.shutdown().await.unwrap();
    drop(held);
    let start = Instant::now();
    while buffered().await > 0.0 {
        assert!(start.elapsed() < Duration::from_secs(10), "the room never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = client().post(format!("{}/v1/chat/completions", url(&proxy))).body(big).send().await.unwrap();
    assert_eq!(r.status(), 200);
    proxy.shutdown().await.unwrap();

    // A buffer that could never hold the largest body is a start error.
    let mut config = ProxyConfig::new(&up);
    config.max_request_buffer = 1000;
    let err = ProxyServer::bind(config, "127.0.0.1:0").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("--max-request-buffer"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_slow_request_heads_are_cut_off_on_both_listeners() {
    let (up, _) = permissive_upstream().await;
    let proxy = proxy_on(&up, "127.0.0.1:0", |c| c.request_timeout = Duration::from_millis(300)).await;
    let ui = proxy.ui_addr().expect("the inspector listens");
    for addr in [proxy.local_addr(), ui] {
        let started = Instant::now();
        // Nothing at all, half a head, a head one byte at a time.
        let mut silent = raw(addr, b"").await;
        let mut half = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ").await;
        let mut dribble = raw(addr, b"G").await;
        for b in b"ET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaa" {
            if dribble.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        for tcp in [&mut silent, &mut half, &mut dribble] {
            let (_, closed) = read_to_close(tcp, Duration::from_secs(10)).await;
            assert!(closed, "{addr}: a slow head kept its connection");
        }
        assert!(started.elapsed() < Duration::from_secs(8), "{addr}: {:?}", started.elapsed());
        // An idle keep-alive connection is closed too; a prompt one is served.
        let mut kept = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        let (answer, closed) = read_to_close(&mut kept, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 ") && closed, "{addr}: {answer}");
    }
    let r = client().get(format!("{}/healthz", url(&proxy))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    proxy.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_wait_to_be_accepted() {
    let (up, _) = permissive_upstream().await;
    let proxy = proxy(&up, |c| c.max_connections = 2).await;
    let a = raw(proxy.local_addr(), b"").await;
    let b = raw(proxy.local_addr(), b"").await;
    let start = Instant::now();
    while proxy.metrics().connections_active() < 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "the two connections were never accepted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let endpoint = format!("{}/healthz", url(&proxy));
    let mut third = tokio::spawn(async move { client().get(endpoint).send().await.map(|r| r.status().as_u16()) });
    let early = tokio::time::timeout(Duration::from_millis(500), &mut third).await;
    assert!(early.is_err(), "a third connection was served past the cap: {early:?}");
    assert_eq!(proxy.metrics().connections_active(), 2);
    drop(a);
    let status = tokio::time::timeout(Duration::from_secs(10), third).await;
    assert!(matches!(status, Ok(Ok(Ok(200)))), "{status:?}");
    drop(b);
    proxy.shutdown().await.unwrap();
}

/// `spindle proxy` under an open-file limit of 200 (soft and hard, so it
/// cannot raise it) serves at most (200 - 64) / 2 = 68 connections at
/// once, says so, and serves again once they close: its descriptors never
/// run out under idle connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_fits_the_open_file_limit() {
    let (up, _) = permissive_upstream().await;
    let script = format!("ulimit -n 200 && exec \"$0\" proxy --upstream {up} --listen 127.0.0.1:0 --log warn");
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-c", &script, env!("CARGO_BIN_EXE_spindle")]);
    let proxy = ProxyProcess::start_with(cmd, |seen| seen.iter().any(|l| l.contains("client connections"))).await;
    let text = proxy.stderr.join("\n");
    assert!(text.contains("room for about 68 client connections"), "{text}");
    let base = proxy.base.clone();
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let mut idle = Vec::new();
    for _ in 0..90 {
        idle.push(raw(addr, b"").await);
    }
    let endpoint = format!("{base}/healthz");
    let early = tokio::time::timeout(Duration::from_millis(500), client().get(&endpoint).send()).await;
    assert!(early.is_err(), "served past the cap: {early:?}");
    drop(idle);
    let status = tokio::time::timeout(Duration::from_secs(10), client().get(&endpoint).send()).await;
    assert!(matches!(&status, Ok(Ok(r)) if r.status() == 200), "{status:?}");
}
