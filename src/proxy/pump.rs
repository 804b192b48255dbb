//! The pump of one response: reads the upstream body, hands each read to
//! the client through a bounded queue, and parses on the side.
//!
//! This module owns the async side of a response body: the idle timeout,
//! noticing that the client went away (the queue is closed when hyper
//! drops the body) and then dropping the upstream response, which closes
//! the upstream connection and so cancels the request; the hard stop at
//! the end of a graceful shutdown; and handing parsed events to metrics
//! and sinks. What the client receives is the relay's ([`super::relay`]);
//! the pump runs inside the client's body ([`super::body`]).
//!
//! Memory per response is bounded: the queue holds at most
//! `channel_capacity` items; while it is full the pump does not read the
//! upstream, so a slow client slows the upstream down (TCP backpressure)
//! instead of filling the proxy.

use super::app::App;
use super::body::{ClientItem, Outbox};
use super::error::{ProxyError, ProxyErrorKind, from_body_error};
use super::metrics::GaugeGuard;
use super::relay::{End, SseRelay};
use super::sink::{SinkRecord, is_sink_event};
use super::trace::Trace;
use crate::event::Event;
use crate::sources::{ErrorOrigin, LineTap, SourceEvent};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::OwnedSemaphorePermit;

/// The upstream body.
pub(crate) type UpstreamBody = BoxStream<'static, reqwest::Result<Bytes>>;

/// How a body is handled.
#[derive(Debug)]
pub(crate) enum Mode {
    /// An SSE stream, relayed (and rewritten) event by event.
    Sse(Box<SseRelay>),
    /// A JSON-lines stream (Ollama's own API), forwarded as it comes and
    /// read line by line on the side.
    Lines(Box<LineTap>),
    /// A whole JSON response, forwarded as it comes and parsed at its end
    /// (up to `limit` bytes; larger ones are forwarded unparsed).
    Json { buf: Vec<u8>, limit: usize, overflowed: bool },
    /// Anything else, forwarded unchanged.
    Opaque,
}

/// Everything a pump needs besides the bodies.
#[derive(Debug)]
pub(crate) struct PumpCtx {
    pub(crate) app: Arc<App>,
    pub(crate) id: u64,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) model: Option<String>,
    pub(crate) status: u16,
    pub(crate) started: Instant,
    pub(crate) _permit: OwnedSemaphorePermit,
    pub(crate) _request: GaugeGuard,
    pub(crate) _stream: Option<GaugeGuard>,
    /// Bytes of an error page kept for the log (non-2xx responses).
    pub(crate) error_excerpt: Option<Vec<u8>>,
    /// The request's trace span, when traces are on.
    pub(crate) trace: Option<Trace>,
}

/// How the pump stopped.
#[derive(Debug)]
enum Stop {
    Upstream(End),
    ClientGone,
}

/// Why a send to the client did not happen.
enum SendFail {
    ClientGone,
    HardStop,
}

/// Runs one response to its end.
pub(crate) async fn pump(
    mut ctx: PumpCtx,
    mut upstream: UpstreamBody,
    first: Option<Bytes>,
    mut mode: Mode,
    tx: Outbox,
) {
    let app = ctx.app.clone();
    let inspector = app.inspector.clone().filter(|_| ctx.path.ends_with("completions"));
    if let Some(i) = &inspector {
        i.start(ctx.id, ctx.model.as_deref(), &ctx.path, ctx.status, ctx.started);
    }
    let idle = app.config.idle_timeout;
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut sent: u64 = 0;
    let mut received: u64 = 0;
    let mut truncated = false;
    let mut pending = first;
    // The idle timer is armed once and moved on only when it fires (to
    // `idle` after the last read), not reset per read: a paced stream's
    // reads then cost no timer-wheel work.
    let mut last_read = tokio::time::Instant::now();
    let idle_timer = tokio::time::sleep_until(idle_deadline(last_read, idle));
    tokio::pin!(idle_timer);
    let stop = 'run: loop {
        let bytes = match pending.take() {
            Some(b) => b,
            None => {
                let next = loop {
                    tokio::select! {
                        biased;
                        () = tx.closed() => break 'run Stop::ClientGone,
                        () = app.hard_stop.cancelled() => break 'run Stop::Upstream(End::Error(shutdown_error())),
                        next = upstream.next() => break next,
                        () = &mut idle_timer => {
                            let deadline = idle_deadline(last_read, idle);
                            if tokio::time::Instant::now() >= deadline {
                                break 'run Stop::Upstream(End::Error(ProxyError::idle(
                                    ProxyErrorKind::Stalled,
                                    idle,
                                    "data",
                                )));
                            }
                            idle_timer.as_mut().reset(deadline);
                        }
                    }
                };
                last_read = tokio::time::Instant::now();
                match next {
                    None => break 'run Stop::Upstream(End::Eof),
                    Some(Err(e)) => break 'run Stop::Upstream(End::Error(from_body_error(&e))),
                    Some(Ok(b)) => b,
                }
            }
        };
        received += bytes.len() as u64;
        app.metrics.bytes_upstream(bytes.len());
        if let Some(i) = &inspector {
            i.chunk(ctx.id, bytes.len());
        }
        match &mut mode {
            Mode::Sse(relay) => match relay.as_mut() {
                SseRelay::Pass(relay) => {
                    // Forward first, parse after: parsing never delays a byte.
                    if let Some(now) = relay.forward(&bytes) {
                        let len = now.len();
                        if let Err(fail) = send(&app, &tx, Ok(now)).await {
                            break 'run fail.into_stop();
                        }
                        sent += len as u64;
                        // Let the client's connection write these bytes
                        // before they are parsed: parsing first would add
                        // its time to every chunk's latency.
                        tx.let_flush().await;
                    }
                    relay.observe(&bytes, &mut events);
                }
                SseRelay::Rewrite(relay) => relay.feed(bytes, &mut out, &mut events),
            },
            Mode::Lines(tap) => {
                // Forward first, read after, as a pass-through SSE relay does.
                let len = bytes.len();
                if let Err(fail) = send(&app, &tx, Ok(bytes.clone())).await {
                    break 'run fail.into_stop();
                }
                sent += len as u64;
                tx.let_flush().await;
                tap.feed_into(&bytes, &mut events);
            }
            Mode::Json { buf, limit, overflowed } => {
                if !*overflowed {
                    if buf.len() + bytes.len() > *limit {
                        *overflowed = true;
                        *buf = Vec::new();
                        tracing::warn!(id = ctx.id, "response body larger than {limit} bytes; forwarded unparsed");
                        app.metrics.diagnostic("response_too_large");
                    } else {
                        buf.extend_from_slice(&bytes);
                    }
                }
                out.push(bytes);
            }
            Mode::Opaque => {
                if let Some(excerpt) = ctx.error_excerpt.as_mut()
                    && excerpt.len() < 512
                {
                    excerpt.extend_from_slice(&bytes[..bytes.len().min(512 - excerpt.len())]);
                }
                out.push(bytes);
            }
        }
        dispatch(&mut ctx, &mut events, &mut truncated).await;
        for b in out.drain(..) {
            let len = b.len();
            if let Err(fail) = send(&app, &tx, Ok(b)).await {
                break 'run fail.into_stop();
            }
            sent += len as u64;
        }
    };
    // The upstream response is dropped here at the latest; on a client
    // that went away, right now, which closes the upstream connection.
    drop(upstream);
    // The response's own model and id, for the trace.
    let response = match &mode {
        Mode::Sse(relay) => relay.response_model(),
        Mode::Lines(tap) => tap.stream().response_model().map(|(m, i)| (m.to_string(), i.to_string())),
        Mode::Json { buf, overflowed: false, .. } => response_model_of(buf),
        _ => None,
    };
    let outcome = match stop {
        Stop::ClientGone => {
            app.metrics.client_disconnect();
            match mode {
                Mode::Sse(relay) => {
                    let mut ignored = Vec::new();
                    let err = ProxyError::new(ProxyErrorKind::RequestBody, "the client went away");
                    relay.end(End::Error(err), &mut ignored, &mut events);
                }
                Mode::Lines(mut tap) => {
                    tap.transport_error("the client went away", &mut events);
                    tap.finish_into(&mut events);
                }
                Mode::Json { .. } | Mode::Opaque => {}
            }
            "client_gone".to_string()
        }
        Stop::Upstream(end) => {
            let (items, outcome): (Vec<ClientItem>, String) = match (mode, end) {
                (Mode::Sse(relay), end) => {
                    let mut out = Vec::new();
                    let upstream_error = match &end {
                        End::Error(e) if !relay.done_seen() => Some(e.code()),
                        _ => None,
                    };
                    let report = relay.end(end, &mut out, &mut events);
                    if let Some(code) = report.error_code.or(upstream_error)
                        && code != "proxy_shutting_down"
                    {
                        app.metrics.upstream_error(code);
                    }
                    let outcome = match report.error_code {
                        Some(code) => code.to_string(),
                        None if report.added_done => "done_added".to_string(),
                        None => "ok".to_string(),
                    };
                    (out.into_iter().map(Ok).collect(), outcome)
                }
                (Mode::Json { buf, overflowed, .. }, End::Eof) => {
                    if !overflowed && (200..300).contains(&ctx.status) {
                        let (parsed, _) = super::relay::whole_response(app.config.options.clone(), &buf, false, None);
                        events.extend(parsed);
                    }
                    (Vec::new(), "ok".to_string())
                }
                (Mode::Lines(tap), End::Eof) => {
                    tap.finish_into(&mut events);
                    (Vec::new(), "ok".to_string())
                }
                (Mode::Lines(mut tap), End::Error(err)) => {
                    tap.transport_error(&err.to_string(), &mut events);
                    tap.finish_into(&mut events);
                    if err.code() != "proxy_shutting_down" {
                        app.metrics.upstream_error(err.code());
                    }
                    // Abort the client's response, as for JSON: the stream's
                    // own lines carry no error event of the proxy's.
                    let outcome = err.code().to_string();
                    (vec![Err(std::io::Error::other(err.to_string()))], outcome)
                }
                (Mode::Opaque, End::Eof) => (Vec::new(), "ok".to_string()),
                (Mode::Json { .. } | Mode::Opaque, End::Error(err)) => {
                    if err.code() != "proxy_shutting_down" {
                        app.metrics.upstream_error(err.code());
                    }
                    // Abort the client's response: a JSON body cannot carry
                    // an error after it started.
                    let outcome = err.code().to_string();
                    (vec![Err(std::io::Error::other(err.to_string()))], outcome)
                }
            };
            for item in items {
                let len = item.as_ref().map(Bytes::len).unwrap_or(0);
                if send(&app, &tx, item).await.is_err() {
                    break;
                }
                sent += len as u64;
            }
            outcome
        }
    };
    dispatch(&mut ctx, &mut events, &mut truncated).await;
    if truncated {
        app.metrics.truncated();
    }
    if let Some(trace) = ctx.trace.take() {
        trace.end(ctx.status, &outcome, response.as_ref().map(|(m, i)| (m.as_str(), i.as_str())));
    }
    if let Some(i) = &inspector {
        i.end(ctx.id, &outcome);
    }
    app.metrics.bytes_client(sent as usize);
    if let Some(excerpt) = ctx.error_excerpt.take() {
        let text = String::from_utf8_lossy(&excerpt);
        tracing::warn!(id = ctx.id, status = ctx.status, "upstream error body: {}", text.trim());
    }
    tracing::info!(
        id = ctx.id,
        method = %ctx.method,
        path = %ctx.path,
        status = ctx.status,
        outcome = %outcome,
        bytes_in = received,
        bytes_out = sent,
        ms = ctx.started.elapsed().as_millis() as u64,
        "response done"
    );
}

/// Accounts for a response the handler completed itself (a rewritten
/// whole body): metrics, sinks, the log line.
pub(crate) async fn account_whole(mut ctx: PumpCtx, mut events: Vec<SourceEvent>, body: &[u8]) {
    let len = body.len();
    let mut truncated = false;
    let inspector = ctx.app.inspector.clone();
    if let Some(i) = &inspector {
        i.start(ctx.id, ctx.model.as_deref(), &ctx.path, ctx.status, ctx.started);
        i.chunk(ctx.id, len);
    }
    dispatch(&mut ctx, &mut events, &mut truncated).await;
    if let Some(i) = &inspector {
        i.end(ctx.id, "rewritten");
    }
    if let Some(trace) = ctx.trace.take() {
        let response = response_model_of(body);
        trace.end(ctx.status, "rewritten", response.as_ref().map(|(m, i)| (m.as_str(), i.as_str())));
    }
    if truncated {
        ctx.app.metrics.truncated();
    }
    ctx.app.metrics.bytes_client(len);
    tracing::info!(
        id = ctx.id,
        method = %ctx.method,
        path = %ctx.path,
        status = ctx.status,
        outcome = "rewritten",
        bytes_out = len,
        ms = ctx.started.elapsed().as_millis() as u64,
        "response done"
    );
}

/// The `model` and `id` of a whole chat-completion body.
fn response_model_of(body: &[u8]) -> Option<(String, String)> {
    #[derive(serde::Deserialize)]
    struct Head {
        model: Option<String>,
        id: Option<String>,
    }
    let head: Head = serde_json::from_slice(body).ok()?;
    Some((head.model?, head.id.unwrap_or_default()))
}

/// When a stream that last read at `from` has been idle too long (far in
/// the future for an idle limit too large to add).
fn idle_deadline(from: tokio::time::Instant, idle: std::time::Duration) -> tokio::time::Instant {
    from.checked_add(idle).unwrap_or_else(|| from + std::time::Duration::from_secs(86_400 * 365))
}

fn shutdown_error() -> ProxyError {
    ProxyError::new(
        ProxyErrorKind::ShuttingDown,
        "the proxy is shutting down; the stream was cut at the end of its grace period",
    )
}

impl SendFail {
    fn into_stop(self) -> Stop {
        match self {
            SendFail::ClientGone => Stop::ClientGone,
            SendFail::HardStop => Stop::Upstream(End::Error(shutdown_error())),
        }
    }
}

/// Sends one item to the client, waiting while the queue is full (that
/// wait is the backpressure), unless the proxy is forced to stop.
async fn send(app: &App, tx: &Outbox, item: ClientItem) -> Result<(), SendFail> {
    tokio::select! {
        biased;
        r = tx.send(item) => r.map_err(|_| SendFail::ClientGone),
        () = app.hard_stop.cancelled() => Err(SendFail::HardStop),
    }
}

/// Counts events in the metrics and queues the sink records (waiting only
/// for sinks whose overflow policy is `block`).
async fn dispatch(ctx: &mut PumpCtx, events: &mut Vec<SourceEvent>, truncated: &mut bool) {
    let app = ctx.app.clone();
    let stream = Stream { id: ctx.id, path: &ctx.path, model: ctx.model.as_deref() };
    dispatch_events(&app, &stream, ctx.trace.as_mut(), events, truncated).await;
}

/// Which stream parsed events belong to, for their sink records.
pub(crate) struct Stream<'a> {
    /// The stream's id (a request's, or one response of a WebSocket session).
    pub(crate) id: u64,
    pub(crate) path: &'a str,
    pub(crate) model: Option<&'a str>,
}

/// [`dispatch`] for any stream parsed on the side (a response body, a
/// WebSocket session's responses): the inspector, the trace when there is
/// one, the metrics, the sinks. Drains `events`.
pub(crate) async fn dispatch_events(
    app: &App,
    stream: &Stream<'_>,
    mut trace: Option<&mut Trace>,
    events: &mut Vec<SourceEvent>,
    truncated: &mut bool,
) {
    if let Some(i) = &app.inspector {
        i.events(stream.id, events);
    }
    let to_sinks = !app.sinks.is_empty() && !events.is_empty();
    // The records' time stamp (read only when there are records to make).
    let ts_ms = if to_sinks {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    } else {
        0
    };
    for event in events.drain(..) {
        if let Some(trace) = trace.as_deref_mut() {
            trace.observe(&event);
        }
        match &event {
            SourceEvent::Choice(c) => match &c.event {
                Event::Element(el) => app.metrics.element(&el.tag),
                Event::Repair(r) => app.metrics.repair(r.kind.as_str()),
                Event::Diagnostic(d) => app.metrics.diagnostic(d.code.as_str()),
                _ => {}
            },
            SourceEvent::Diagnostic(d) => app.metrics.diagnostic(d.code.as_str()),
            SourceEvent::Truncated { .. } => *truncated = true,
            SourceEvent::StreamError { origin: ErrorOrigin::InBand | ErrorOrigin::ErrorEvent, .. } => {
                app.metrics.upstream_error("in_band");
            }
            _ => {}
        }
        if to_sinks && is_sink_event(&event) {
            let record = SinkRecord {
                stream: stream.id,
                path: stream.path.to_string(),
                model: stream.model.map(str::to_string),
                ts_ms,
                event,
            };
            let record = Arc::new(record);
            let blocked = app.sinks.send(&record);
            if !blocked.is_empty() {
                app.sinks.wait(blocked, &record, &app.hard_stop).await;
            }
        }
    }
}

/// Reads a whole body the proxy must hold (to rewrite it, or to pass on an
/// upstream's refusal of a WebSocket): at most `max_response_body` bytes,
/// each read bounded by the idle timeout, `first` already read.
pub(crate) async fn read_whole(
    app: &App,
    upstream: &mut UpstreamBody,
    first: Option<Bytes>,
) -> Result<Bytes, ProxyError> {
    let idle = app.config.idle_timeout;
    let limit = app.config.max_response_body;
    let mut buf = Vec::new();
    if let Some(b) = first {
        app.metrics.bytes_upstream(b.len());
        buf.extend_from_slice(&b);
    }
    loop {
        match tokio::time::timeout(idle, upstream.next()).await {
            Err(_) => return Err(ProxyError::idle(ProxyErrorKind::Timeout, idle, "data")),
            Ok(None) => return Ok(Bytes::from(buf)),
            Ok(Some(Err(e))) => return Err(from_body_error(&e)),
            Ok(Some(Ok(b))) => {
                app.metrics.bytes_upstream(b.len());
                if buf.len() + b.len() > limit {
                    return Err(ProxyError::new(
                        ProxyErrorKind::InvalidResponse,
                        format!(
                            "the upstream response is larger than {limit} bytes (--max-response-body), the most the proxy reads whole"
                        ),
                    ));
                }
                buf.extend_from_slice(&b);
            }
        }
    }
}
