//! The live stream inspector (`spindle proxy --ui`): a page that shows the
//! live and recent streams going through the proxy, each stream's elements
//! as they arrive, its repairs in place, diagnostics and timing.
//!
//! This module owns the inspector's state (a bounded ring of recent
//! streams), the live feed (a broadcast channel: a slow page loses
//! messages and is told so, it never slows a stream) and the page's HTTP
//! surface on its own listener. It must not touch the client's or the
//! upstream's bytes: the pump hands it events.
//!
//! # Safety of the page
//!
//! The page is plain HTML, CSS and JavaScript embedded in the binary, served
//! with a strict `Content-Security-Policy` (`default-src 'self'`, no inline
//! script or style, no images, no frames). Model text is only ever inserted
//! with `textContent`, never as HTML, so markup, event handlers and
//! `javascript:` URLs in model output stay text.
//!
//! # Exposure
//!
//! The page has its own listener, `127.0.0.1:8789` by default. Binding it
//! to a non-loopback address needs a token (`SPINDLE_UI_TOKEN`), which every
//! request but the page's script and style must then carry (`?token=…` or
//! `Authorization: Bearer …`).
//!
//! # Endpoints
//!
//! * `GET /ui` (the page), `/ui/app.js`, `/ui/app.css`;
//! * `GET /ui/api/streams`: the recent streams' summaries, newest last;
//! * `GET /ui/api/streams/{id}`: one stream with the events kept for it;
//! * `GET /ui/api/events`: the live feed (SSE: `start`, `event`, `end`,
//!   and `lagged` when this subscriber fell behind).

use crate::event::Event;
use crate::sources::SourceEvent;
use axum::Router;
use axum::extract::{Path as AxumPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::broadcast;

/// The inspector's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UiConfig {
    /// Where the page listens (default `127.0.0.1:8789`).
    pub listen: String,
    /// A token every page request must carry; required when `listen` is
    /// not a loopback address.
    pub token: Option<String>,
    /// How many streams the page keeps, live and recent (default 200).
    pub recent: usize,
    /// Most bytes of events kept per stream (default 256 KiB); later
    /// events are counted, not kept, and the page says so.
    pub max_stream_bytes: usize,
}

impl Default for UiConfig {
    fn default() -> Self {
        UiConfig { listen: "127.0.0.1:8789".into(), token: None, recent: 200, max_stream_bytes: 256 * 1024 }
    }
}

impl UiConfig {
    /// Checks that a page on a non-loopback address is protected.
    ///
    /// # Errors
    ///
    /// A sentence saying what is missing.
    pub fn check(&self) -> Result<(), String> {
        let host = self.listen.rsplit_once(':').map_or(self.listen.as_str(), |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        match (&self.token, loopback) {
            (Some(t), _) if t.is_empty() => Err("SPINDLE_UI_TOKEN must not be empty".into()),
            (None, false) => Err(format!(
                "the inspector page on {} would be open to the network; set SPINDLE_UI_TOKEN (then open /ui?token=TOKEN) or give a loopback --ui-listen",
                self.listen
            )),
            _ => Ok(()),
        }
    }
}

/// One stream as the page sees it.
#[derive(Debug, Clone, Serialize)]
struct Summary {
    id: u64,
    model: Option<String>,
    path: String,
    /// Unix time of the request, ms.
    started: u64,
    /// Request to first upstream byte, ms.
    first_byte_ms: Option<u64>,
    /// Longest gap between upstream chunks, ms.
    max_gap_ms: u64,
    chunks: u64,
    bytes: u64,
    repairs: u64,
    tool_calls: u64,
    diagnostics: u64,
    /// `live` until it ends, then its outcome (`ok`, an error code, ...).
    outcome: String,
    status: u16,
    duration_ms: Option<u64>,
    /// Events not kept (past the per-stream limit).
    dropped_events: u64,
}

#[derive(Debug)]
struct View {
    summary: Summary,
    begun: Instant,
    last_chunk: Option<Instant>,
    events: Vec<Value>,
    kept_bytes: usize,
}

#[derive(Debug, Default)]
struct Ring {
    order: VecDeque<u64>,
    views: HashMap<u64, View>,
}

/// The inspector of a running proxy.
#[derive(Debug)]
pub(crate) struct Inspector {
    config: UiConfig,
    ring: Mutex<Ring>,
    feed: broadcast::Sender<Arc<str>>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Inspector {
    pub(crate) fn new(config: UiConfig) -> Inspector {
        let (feed, _) = broadcast::channel(4096);
        Inspector { config, ring: Mutex::new(Ring::default()), feed }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn publish(&self, message: Value) {
        // No subscriber is fine; a full subscriber lags (it is told).
        let _ = self.feed.send(Arc::from(message.to_string()));
    }

    /// A request started.
    pub(crate) fn start(&self, id: u64, model: Option<&str>, path: &str, status: u16, begun: Instant) {
        let summary = Summary {
            id,
            model: model.map(|m| crate::proxy::clipped(m, MAX_NAME)),
            path: crate::proxy::clipped(path, MAX_NAME),
            started: now_ms(),
            first_byte_ms: None,
            max_gap_ms: 0,
            chunks: 0,
            bytes: 0,
            repairs: 0,
            tool_calls: 0,
            diagnostics: 0,
            outcome: "live".into(),
            status,
            duration_ms: None,
            dropped_events: 0,
        };
        let message = json!({"type": "start", "stream": summary});
        {
            let mut ring = self.ring();
            while ring.order.len() >= self.config.recent.max(1) {
                match ring.order.pop_front() {
                    Some(old) => {
                        ring.views.remove(&old);
                    }
                    None => break,
                }
            }
            ring.order.push_back(id);
            ring.views.insert(id, View { summary, begun, last_chunk: None, events: Vec::new(), kept_bytes: 0 });
        }
        self.publish(message);
    }

    /// Upstream bytes arrived.
    pub(crate) fn chunk(&self, id: u64, len: usize) {
        let mut ring = self.ring();
        if let Some(v) = ring.views.get_mut(&id) {
            let now = Instant::now();
            if v.summary.first_byte_ms.is_none() {
                v.summary.first_byte_ms = Some(ms(now.duration_since(v.begun)));
            }
            if let Some(last) = v.last_chunk {
                v.summary.max_gap_ms = v.summary.max_gap_ms.max(ms(now.duration_since(last)));
            }
            v.last_chunk = Some(now);
            v.summary.chunks += 1;
            v.summary.bytes += len as u64;
        }
    }

    /// Events of the stream.
    pub(crate) fn events(&self, id: u64, events: &[SourceEvent]) {
        let mut out = Vec::new();
        {
            let mut ring = self.ring();
            let Some(v) = ring.views.get_mut(&id) else { return };
            for event in events {
                match event {
                    SourceEvent::Done => continue,
                    SourceEvent::Choice(c) => match &c.event {
                        Event::Repair(_) => v.summary.repairs += 1,
                        Event::Diagnostic(_) => v.summary.diagnostics += 1,
                        Event::Element(el) if el.tag.contains("tool") || el.payload.get("name").is_some() => {
                            v.summary.tool_calls += 1;
                        }
                        _ => {}
                    },
                    SourceEvent::Diagnostic(_) => v.summary.diagnostics += 1,
                    _ => {}
                }
                let value = serde_json::to_value(event).unwrap_or(Value::Null);
                let size = value.to_string().len();
                if v.kept_bytes + size > self.config.max_stream_bytes {
                    v.summary.dropped_events += 1;
                    continue;
                }
                v.kept_bytes += size;
                v.events.push(value.clone());
                out.push(json!({"type": "event", "stream": id, "event": value}));
            }
        }
        for message in out {
            self.publish(message);
        }
    }

    /// A note that is not a parser event (a tool's result in agent mode):
    /// kept and sent like one.
    pub(crate) fn note(&self, id: u64, value: Value) {
        {
            let mut ring = self.ring();
            let Some(v) = ring.views.get_mut(&id) else { return };
            if value.get("type").and_then(Value::as_str) == Some("tool_result") {
                v.summary.tool_calls += 1;
            }
            let size = value.to_string().len();
            if v.kept_bytes + size > self.config.max_stream_bytes {
                v.summary.dropped_events += 1;
                return;
            }
            v.kept_bytes += size;
            v.events.push(value.clone());
        }
        self.publish(json!({"type": "event", "stream": id, "event": value}));
    }

    /// The stream ended.
    pub(crate) fn end(&self, id: u64, outcome: &str) {
        let summary = {
            let mut ring = self.ring();
            let Some(v) = ring.views.get_mut(&id) else { return };
            v.summary.outcome = outcome.to_string();
            v.summary.duration_ms = Some(ms(v.begun.elapsed()));
            v.summary.clone()
        };
        self.publish(json!({"type": "end", "stream": summary}));
    }

    fn summaries(&self) -> Vec<Summary> {
        let ring = self.ring();
        ring.order.iter().filter_map(|id| ring.views.get(id)).map(|v| v.summary.clone()).collect()
    }

    fn stream(&self, id: u64) -> Option<Value> {
        let ring = self.ring();
        ring.views.get(&id).map(|v| json!({"stream": v.summary, "events": v.events}))
    }

    fn authorised(&self, headers: &HeaderMap, query: &HashMap<String, String>) -> bool {
        let Some(token) = &self.config.token else { return true };
        let bearer =
            headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        bearer == Some(token.as_str()) || query.get("token") == Some(token)
    }
}

/// Most bytes of a request's model name or path a summary keeps: the ring
/// keeps them outside each stream's byte budget.
const MAX_NAME: usize = 1024;

const PAGE: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("app.js");
const STYLE: &str = include_str!("app.css");
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'none'; media-src 'none'; \
                   object-src 'none'; frame-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    r
}

fn json_response(v: &impl Serialize) -> Response {
    let mut r = axum::Json(v).into_response();
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

type Q = Query<HashMap<String, String>>;

async fn guarded(
    insp: &Inspector,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    f: impl FnOnce() -> Response,
) -> Response {
    if insp.authorised(headers, query) {
        f()
    } else {
        (StatusCode::UNAUTHORIZED, "the inspector needs its token (?token=...)").into_response()
    }
}

/// The page's routes.
pub(crate) fn router(insp: Arc<Inspector>) -> Router {
    Router::new()
        .route(
            "/ui",
            get(|State(i): State<Arc<Inspector>>, h: HeaderMap, Query(q): Q| async move {
                guarded(&i, &h, &q, || asset("text/html; charset=utf-8", PAGE)).await
            }),
        )
        // The script and the style hold no data, and the page loads them
        // without its token: not guarded.
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route(
            "/ui/api/streams",
            get(|State(i): State<Arc<Inspector>>, h: HeaderMap, Query(q): Q| async move {
                let list = i.summaries();
                guarded(&i, &h, &q, || json_response(&list)).await
            }),
        )
        .route(
            "/ui/api/streams/{id}",
            get(|State(i): State<Arc<Inspector>>, AxumPath(id): AxumPath<u64>, h: HeaderMap, Query(q): Q| async move {
                let one = i.stream(id);
                guarded(&i, &h, &q, || match one {
                    Some(v) => json_response(&v),
                    None => (StatusCode::NOT_FOUND, "no such stream (it may have left the ring)").into_response(),
                })
                .await
            }),
        )
        .route("/ui/api/events", get(feed))
        .fallback(|| async { (StatusCode::NOT_FOUND, "the inspector is at /ui").into_response() })
        .with_state(insp)
}

/// The live feed as SSE.
async fn feed(State(insp): State<Arc<Inspector>>, headers: HeaderMap, Query(q): Q) -> Response {
    if !insp.authorised(&headers, &q) {
        return (StatusCode::UNAUTHORIZED, "the inspector needs its token (?token=...)").into_response();
    }
    let rx = insp.feed.subscribe();
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        let data: Arc<str> = match rx.recv().await {
            Ok(m) => m,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                Arc::from(json!({"type": "lagged", "missed": n}).to_string())
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok::<_, std::io::Error>(bytes::Bytes::from(format!("data: {data}\n\n"))), rx))
    });
    let mut r = Response::new(axum::body::Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_open_to_the_network_needs_a_token() {
        let mut c = UiConfig::default();
        assert!(c.check().is_ok());
        c.listen = "0.0.0.0:8789".into();
        assert!(c.check().unwrap_err().contains("SPINDLE_UI_TOKEN"));
        c.token = Some("s3cret".into());
        assert!(c.check().is_ok());
        c.listen = "[::1]:8789".into();
        c.token = None;
        assert!(c.check().is_ok());
    }

    #[test]
    fn the_ring_and_the_per_stream_budget_are_bounded() {
        let insp = Inspector::new(UiConfig { recent: 3, max_stream_bytes: 200, ..UiConfig::default() });
        for id in 0..5 {
            insp.start(id, Some("m"), "/v1/chat/completions", 200, Instant::now());
        }
        let ids: Vec<u64> = insp.summaries().iter().map(|s| s.id).collect();
        assert_eq!(ids, [2, 3, 4]);
        let usage = SourceEvent::Usage { usage: json!({"total_tokens": 1}) };
        insp.events(4, &vec![usage; 10]);
        let one = insp.stream(4).unwrap_or_default();
        let kept = one["events"].as_array().map_or(0, Vec::len);
        assert!(kept > 0 && kept < 10, "{kept}");
        assert_eq!(one["stream"]["dropped_events"], 10 - kept as u64);
    }
}
