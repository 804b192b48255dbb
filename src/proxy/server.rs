//! The HTTP side: the axum router, the forwarding handler, `/healthz`,
//! `/metrics`, the stream limit and graceful shutdown.
//!
//! This module owns the request phase (everything before the response
//! head goes out: reading the request, building the upstream request,
//! waiting for the upstream's head and first body byte, turning failures
//! into 502/503/504 JSON errors) and the server's lifecycle. The body
//! phase is [`super::pump`]'s.

use super::app::{App, RequestBuffer, end_to_end};
use super::body::{ClientItem, pump_body};
use super::calling::request::{ToolRequest, prepare, without_bom};
use super::calling::response::CallConverter;
use super::clipped;
use super::error::{ProxyError, ProxyErrorKind, error_response, from_body_error, from_send_error};
use super::listen::{self, Serving};
use super::metrics::Metrics;
use super::policy::{self, Hosts, Origins, Screen};
use super::pump::{Mode, PumpCtx, UpstreamBody, pump, read_whole};
use super::relay::SseRelay;
use super::sink::{SinkStartError, Sinks};
use super::trace::{Telemetry, Trace};
use super::{ProxyConfig, UseProtocol};
use crate::registry::Registry;
use crate::sources::{LineTap, StreamOptions};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures::StreamExt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What kind of endpoint a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// `/chat/completions`: parsed, rewritable, `[DONE]`-framed.
    Chat,
    /// `/completions` (legacy): parsed, `[DONE]`-framed.
    Completions,
    /// `/responses`, `/messages`, Gemini's `:generateContent` and
    /// `:streamGenerateContent`, Ollama's `/api/chat` and `/api/generate`,
    /// llama.cpp's `/completion` and `/infill`: parsed when 2xx.
    OtherModel,
    /// Anything else: forwarded only.
    Other,
}

impl Endpoint {
    fn of(path: &str) -> Endpoint {
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Endpoint::Chat
        } else if path.ends_with("/completions") {
            Endpoint::Completions
        } else if path.ends_with("/responses")
            || path.ends_with("/messages")
            || path.ends_with(":generateContent")
            || path.ends_with(":streamGenerateContent")
            || path == "/api/chat"
            || path == "/api/generate"
            || path == "/completion"
            || path == "/infill"
        {
            Endpoint::OtherModel
        } else {
            Endpoint::Other
        }
    }

    fn is_model(self) -> bool {
        self != Endpoint::Other
    }

    fn done_framing(self) -> bool {
        matches!(self, Endpoint::Chat | Endpoint::Completions)
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyStartError {
    /// The upstream URL is not an absolute http(s) URL.
    #[error("bad upstream URL {url:?}: {why}")]
    Upstream {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {cause}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        cause: std::io::Error,
    },
    /// A sink could not start (a file that cannot be opened).
    #[error(transparent)]
    Sink(#[from] SinkStartError),
    /// The HTTP client could not be built (TLS backend).
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    /// The inspector page would be open to the network without a token.
    #[error("{0}")]
    Ui(String),
    /// The trace exporter could not start.
    #[error("{0}")]
    Telemetry(String),
    /// The tool-calling configuration does not fit the registry.
    #[error("tool calling: {0}")]
    ToolCalling(String),
    /// An allowed host or origin that is not one.
    #[error("{0}")]
    Access(String),
    /// Limits that contradict each other.
    #[error("{0}")]
    Limits(String),
}

/// Most bytes of a request's model name kept for records, metrics and
/// the inspector (the upstream gets the body as sent).
const MAX_MODEL_NAME: usize = 256;

/// What the proxy reads of a request body: the model (for sink records).
#[derive(serde::Deserialize)]
struct Peek {
    #[serde(default)]
    model: Option<serde_json::Value>,
}

/// Counts a client that went away while the request phase was waiting
/// (the handler future is dropped, and with it the upstream request).
struct RequestWatch {
    metrics: Arc<Metrics>,
    id: u64,
    armed: bool,
}

impl Drop for RequestWatch {
    fn drop(&mut self) {
        if self.armed {
            self.metrics.client_disconnect();
            tracing::info!(id = self.id, "client went away before the response started; upstream request cancelled");
        }
    }
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    let stopping = app.stopping.is_cancelled();
    let body = serde_json::json!({
        "status": if stopping { "stopping" } else { "ok" },
        "upstream": app.config.upstream,
        "rewrite": app.config.rewrite,
        "tool_protocol": app.config.tool_calling.map(|t| t.protocol.as_str()),
        "streams_active": app.metrics.streams_active(),
        "requests_active": app.metrics.requests_active(),
    });
    let status = if stopping { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    app.metrics.request_buffer(app.request_buffer.held());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render()).into_response()
}

/// The unversioned paths of llama.cpp's server (its own API, and its
/// OpenAI-compatible one without `/v1`) that are proxied; its slot
/// management (`/slots`) is not.
const LLAMA_CPP_PATHS: [&str; 13] = [
    "completion",
    "completions",
    "chat",
    "infill",
    "tokenize",
    "detokenize",
    "apply-template",
    "embedding",
    "embeddings",
    "rerank",
    "props",
    "health",
    "models",
];

/// Phase 1, admit: only an API's paths are proxied (`/v1/*`, and
/// `/v1beta/*`, `/v2/*`: a first segment that names a version; Ollama's
/// `/api/*`; llama.cpp's unversioned ones, [`LLAMA_CPP_PATHS`]), nothing
/// new while shutting down, at most `max_streams` in flight. The permit
/// lives as long as the response.
fn admit(app: &App, path: &str) -> Result<tokio::sync::OwnedSemaphorePermit, ProxyError> {
    if has_dot_segment(path) {
        // `/v1/../../admin` would leave the API's base once the upstream
        // URL is resolved, with the proxy's key on it.
        return Err(ProxyError::new(
            ProxyErrorKind::NotFound,
            format!("{path} has a `.` or `..` segment; such paths are not proxied"),
        ));
    }
    let first = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    if !super::app::names_version(first) && first != "api" && !LLAMA_CPP_PATHS.contains(&first) {
        return Err(ProxyError::new(
            ProxyErrorKind::NotFound,
            format!(
                "spindle proxies an API's paths (/v1/*, /v1beta/*, Ollama's /api/*, llama.cpp's /completion, \
                 /tokenize, ...) to the upstream; {path} is not proxied (local: /healthz, /metrics)"
            ),
        ));
    }
    if app.stopping.is_cancelled() {
        app.metrics.rejected();
        return Err(ProxyError::new(ProxyErrorKind::ShuttingDown, "the proxy is shutting down"));
    }
    app.limit.clone().try_acquire_owned().map_err(|_| {
        app.metrics.rejected();
        let limit = app.config.max_streams;
        ProxyError::new(
            ProxyErrorKind::Overloaded { limit },
            format!("more than {limit} requests in flight; retry shortly"),
        )
    })
}

/// Whether a request path has a segment that URL resolution reads as `.`
/// or `..`: written plainly or percent-encoded (`%2e`), and with `\` as a
/// separator, as a URL parser reads an http URL.
fn has_dot_segment(path: &str) -> bool {
    path.split(['/', '\\']).any(|segment| {
        let lower = segment.to_ascii_lowercase();
        matches!(lower.replace("%2e", ".").as_str(), "." | "..")
    })
}

/// Phase 2, the upstream request's headers: the end-to-end headers of the
/// client's request, the configured key when the client sent none, and
/// `Accept-Encoding: identity` for the bodies the proxy reads.
fn upstream_headers(app: &App, client: &HeaderMap, buffered: bool, endpoint: Endpoint) -> HeaderMap {
    let mut headers = end_to_end(client);
    headers.remove(header::EXPECT);
    if buffered {
        headers.remove(header::CONTENT_LENGTH);
    }
    app.add_upstream_key(&mut headers);
    if endpoint.is_model() {
        // The proxy reads these bodies; ask for them uncompressed (and it
        // never compresses what it sends on).
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    headers
}

/// Everything that is not `/healthz` or `/metrics`: one proxied request,
/// in named phases, after the listener's screen ([`super::policy`]: the
/// `Host`, the browser `Origin`, preflights): admit ([`admit`]); read the
/// request body ([`read_body`]: buffered for model endpoints, tool calling
/// prepared, or handed to the agent loop); send the upstream request and
/// wait for its head ([`send_upstream`]); wait for the first body byte
/// ([`first_byte`]); choose the mode ([`choose_mode`]: pass-through or
/// rewrite of SSE, whole JSON, opaque); relay ([`relay`] into the pump of
/// [`super::pump`], or [`rewrite_whole`]), which finishes the metrics,
/// sinks, trace and inspector entry. A WebSocket handshake is handed to
/// [`super::websocket`] once admitted.
async fn forward(State(app): State<Arc<App>>, request: Request) -> Response {
    let id = app.next_id.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().to_string();
    let permit = match admit(&app, &path) {
        Ok(permit) => permit,
        Err(err) => return error_response(&err),
    };
    if super::websocket::asks_upgrade(&parts.method, &parts.headers) {
        let held = (permit, app.metrics.request_active());
        return super::websocket::forward(&app, id, parts, held).await;
    }
    let mut ex = Exchange {
        id,
        endpoint: Endpoint::of(&path),
        path,
        method: parts.method,
        uri: parts.uri,
        headers: parts.headers,
        started: Instant::now(),
        watch: RequestWatch { metrics: app.metrics.clone(), id, armed: true },
        held: (permit, app.metrics.request_active()),
        model: None,
        registry: None,
        trace: None,
    };
    let (body, tools) = match read_body(&app, &mut ex, body).await {
        Ok(RequestBody::Upstream { body, tools }) => (body, tools),
        Ok(RequestBody::Agent(run, request)) => return ex.into_agent(&app, run, request).await,
        Err(err) => return ex.refuse(&err),
    };
    let waited = match send_upstream(&app, &mut ex, body).await {
        Ok(response) => first_byte(&app, &ex, response).await,
        Err(halt) => Err(halt),
    };
    let (head, upstream) = match waited {
        Ok(got) => got,
        Err(Halt::Failed(err)) => return ex.fail(&app, &err),
        Err(Halt::Stopping) => {
            return ex.refuse(&ProxyError::new(ProxyErrorKind::ShuttingDown, "the proxy is shutting down"));
        }
    };
    match choose_mode(&app, ex.endpoint, &head, tools, ex.registry.clone()) {
        Choice::Pump { mode, kind } => relay(&app, ex, head, upstream, mode, kind),
        Choice::Whole { options, converter } => rewrite_whole(&app, ex, head, upstream, options, converter).await,
    }
}

/// One request between its admission and its response head: what the
/// phases after admission read, and what its records need.
struct Exchange {
    id: u64,
    method: Method,
    uri: axum::http::Uri,
    /// The client's request headers.
    headers: HeaderMap,
    path: String,
    endpoint: Endpoint,
    started: Instant,
    /// Counts the client going away while the request phase waits.
    watch: RequestWatch,
    /// The in-flight permit and the request gauge: held as long as the
    /// response.
    held: (tokio::sync::OwnedSemaphorePermit, super::metrics::GaugeGuard),
    /// The model the request names (for the records).
    model: Option<String>,
    /// The registry its `<use_protocol>` declarations built.
    registry: Option<Arc<Registry>>,
    /// The request's span (with the `otel` feature and an endpoint).
    trace: Option<Trace>,
}

impl Exchange {
    /// Ends the request with a refusal of its own (a bad or too large
    /// body, shutting down): not an upstream failure.
    fn refuse(mut self, err: &ProxyError) -> Response {
        self.watch.armed = false;
        error_response(err)
    }

    /// Ends the request with an upstream failure: counted, logged and
    /// traced.
    fn fail(mut self, app: &App, err: &ProxyError) -> Response {
        self.watch.armed = false;
        if let Some(t) = self.trace.take() {
            t.end(err.status(), err.code(), None);
        }
        app.metrics.upstream_error(err.code());
        tracing::warn!(id = self.id, path = %self.path, "{err}");
        error_response(err)
    }

    /// Hands the request to the agent loop, which keeps its own records.
    async fn into_agent(mut self, app: &Arc<App>, run: AgentRun, request: serde_json::Value) -> Response {
        self.watch.armed = false;
        run_agent(app, run, request, &self.headers, self.held).await
    }

    /// Whether the request body is read whole before it goes upstream.
    fn buffered(&self) -> bool {
        self.endpoint.is_model() && self.method == Method::POST
    }

    /// The pump's context: the request's records go on in the body phase.
    fn into_pump(mut self, app: &Arc<App>, status: u16, stream: Option<super::metrics::GaugeGuard>) -> PumpCtx {
        self.watch.armed = false;
        let (permit, request) = self.held;
        PumpCtx {
            app: app.clone(),
            id: self.id,
            method: self.method.to_string(),
            path: self.path,
            model: self.model,
            status,
            started: self.started,
            _permit: permit,
            _request: request,
            _stream: stream,
            error_excerpt: None,
            trace: self.trace,
        }
    }
}

/// What the request body phase hands on.
enum RequestBody {
    /// The body for the upstream, and the request's tools when the proxy
    /// turns the response's calls into `tool_calls`.
    Upstream { body: reqwest::Body, tools: Option<ToolRequest> },
    /// A request the agent loop answers (it has no tools of its own).
    Agent(AgentRun, serde_json::Value),
}

/// Phase 2, the request body: buffered (bounded) for model endpoints, whose
/// model the records name, whose tools tool calling translates and which
/// the agent loop may take; streamed through for everything else.
async fn read_body(app: &App, ex: &mut Exchange, body: Body) -> Result<RequestBody, ProxyError> {
    if !ex.buffered() {
        let metrics = app.metrics.clone();
        let body = reqwest::Body::wrap_stream(body.into_data_stream().map(move |r| {
            if let Ok(b) = &r {
                metrics.bytes_request(b.len());
            }
            r
        }));
        return Ok(RequestBody::Upstream { body, tools: None });
    }
    // The share of the request buffer is held until the body is handed on.
    let Buffered { bytes, share: _share } = read_request(app, body).await?;
    app.metrics.bytes_request(bytes.len());
    let chat = ex.endpoint == Endpoint::Chat;
    // Tool calling reads the body: never passed on unread for being
    // compressed.
    let bytes = match app.config.tool_calling {
        Some(_) if chat => decoded_request(&mut ex.headers, bytes, app.config.max_request_body)?,
        _ => bytes,
    };
    if let (Some(agent), Some(tc)) = (&app.config.agent, app.config.tool_calling)
        && chat
        && let Ok(request) = serde_json::from_slice::<serde_json::Value>(without_bom(&bytes))
        && super::agent::runs(&request)
    {
        let run = AgentRun { id: ex.id, agent: agent.clone(), protocol: tc.protocol, url: app.target(&ex.uri) };
        return Ok(RequestBody::Agent(run, request));
    }
    let (bytes, tools) = match app.config.tool_calling {
        Some(tc) if chat => match prepare(&bytes, tc.protocol) {
            Ok(prepared) => (prepared.body.map_or(bytes, Bytes::from), prepared.tools),
            Err(err) => {
                tracing::info!(id = ex.id, path = %ex.path, "{err}");
                return Err(err);
            }
        },
        _ => (bytes, None),
    };
    ex.model = serde_json::from_slice::<Peek>(&bytes)
        .ok()
        .and_then(|p| p.model)
        .and_then(|m| m.as_str().map(|m| clipped(m, MAX_MODEL_NAME)))
        .or_else(|| model_in_path(&ex.path).map(|m| clipped(m, MAX_MODEL_NAME)));
    if app.config.use_protocol == UseProtocol::Auto {
        ex.registry = app.registries.for_request(without_bom(&bytes));
    }
    Ok(RequestBody::Upstream { body: reqwest::Body::from(bytes), tools })
}

/// The model a request names in its path rather than its body, as
/// Gemini's do (`/v1beta/models/gemini-2.5-flash:streamGenerateContent`).
fn model_in_path(path: &str) -> Option<&str> {
    let (_, rest) = path.rsplit_once("/models/")?;
    let (model, _) = rest.split_once(':')?;
    (!model.is_empty() && !model.contains('/')).then_some(model)
}

/// Why waiting on the upstream ended without its answer.
enum Halt {
    /// It failed or stayed idle too long.
    Failed(ProxyError),
    /// The proxy is stopping now.
    Stopping,
}

/// `fut` (the response head, the first body byte), awaited at most the
/// first-byte timeout and not past a hard stop. `what` names the awaited
/// thing in the timeout's message.
async fn within<T>(app: &App, what: &str, fut: impl Future<Output = T>) -> Result<T, Halt> {
    let idle = app.config.first_byte_timeout;
    tokio::select! {
        r = tokio::time::timeout(idle, fut) => r.map_err(|_| Halt::Failed(ProxyError::idle(ProxyErrorKind::Timeout, idle, what))),
        () = app.hard_stop.cancelled() => Err(Halt::Stopping),
    }
}

/// Phase 3, the upstream request: its headers ([`upstream_headers`]), the
/// request's span (a child of the client's traceparent; its own goes
/// upstream), then the wait for the response head.
async fn send_upstream(app: &App, ex: &mut Exchange, body: reqwest::Body) -> Result<reqwest::Response, Halt> {
    let mut headers = upstream_headers(app, &ex.headers, ex.buffered(), ex.endpoint);
    ex.trace = match (&app.telemetry, ex.endpoint.is_model()) {
        (Some(t), true) => Some(t.request(&ex.headers, ex.model.as_deref(), &mut headers)),
        _ => None,
    };
    let url = app.target(&ex.uri);
    let send = app.http.request(ex.method.clone(), &url).headers(headers).body(body).send();
    within(app, "response headers", send).await?.map_err(|e| Halt::Failed(from_send_error(&e)))
}

/// The upstream's response head, as the later phases read it.
struct Head {
    status: StatusCode,
    /// Its end-to-end headers, for the client.
    headers: HeaderMap,
    body: BodyKind,
    /// Whether the proxy parses the body: a 2xx SSE, JSON-lines or JSON
    /// body of a model endpoint, not compressed.
    parse: bool,
}

/// What a response body is, by its content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    /// `text/event-stream`.
    Sse,
    /// `application/x-ndjson` (or `jsonl`): one JSON chunk per line, as
    /// Ollama's own API streams.
    Lines,
    /// `application/json`, `…+json`: one whole JSON document.
    Json,
    /// Anything else.
    Other,
}

impl BodyKind {
    fn of(content_type: &str) -> BodyKind {
        if content_type.starts_with("text/event-stream") {
            BodyKind::Sse
        } else if content_type.starts_with("application/x-ndjson")
            || content_type.starts_with("application/jsonl")
            || content_type.starts_with("application/json-lines")
        {
            BodyKind::Lines
        } else if content_type.starts_with("application/json") || content_type.contains("+json") {
            BodyKind::Json
        } else {
            BodyKind::Other
        }
    }

    /// A stream: relayed read by read, with stream headers and gauges.
    fn is_stream(self) -> bool {
        matches!(self, BodyKind::Sse | BodyKind::Lines)
    }
}

impl Head {
    /// Reads (and counts) the head of `response`.
    fn read(app: &App, ex: &Exchange, response: &reqwest::Response) -> Head {
        let status = response.status();
        app.metrics.upstream_status(status.as_u16());
        if status.is_server_error() {
            app.metrics.upstream_error("status_5xx");
        }
        let header = |name| response.headers().get(name).and_then(|v| v.to_str().ok());
        let content_type = header(header::CONTENT_TYPE).unwrap_or("").to_ascii_lowercase();
        let encoded = header(header::CONTENT_ENCODING).is_some_and(|v| !v.eq_ignore_ascii_case("identity"));
        let body = BodyKind::of(&content_type);
        let model = status.is_success() && ex.endpoint.is_model();
        if model && body == BodyKind::Other {
            app.metrics.upstream_error("unexpected_content_type");
            tracing::warn!(id = ex.id, path = %ex.path,
                "upstream answered {status} with content type {content_type:?}; passed through");
        }
        // The upstream's CORS answer never reaches the client: the
        // listener's browser policy decides.
        let mut headers = end_to_end(response.headers());
        super::policy::drop_cors(&mut headers);
        Head { status, headers, body, parse: model && !encoded && body != BodyKind::Other }
    }
}

/// The upstream's body: what came first, then the rest.
struct Upstream {
    body: UpstreamBody,
    first: Option<Bytes>,
}

/// Phase 4, the first body byte: waited for before the response head goes
/// out, so that an upstream that fails before sending anything still gets
/// a proper status.
async fn first_byte(app: &App, ex: &Exchange, response: reqwest::Response) -> Result<(Head, Upstream), Halt> {
    let head = Head::read(app, ex, &response);
    let mut body: UpstreamBody = response.bytes_stream().boxed();
    let first = match within(app, "response body", body.next()).await? {
        Some(Err(e)) => {
            let mut err = from_body_error(&e);
            if matches!(err.kind(), ProxyErrorKind::Stalled) {
                err = ProxyError::new(ProxyErrorKind::Timeout, err.message().to_string());
            }
            return Err(Halt::Failed(err));
        }
        Some(Ok(b)) => Some(b),
        None => None,
    };
    Ok((head, Upstream { body, first }))
}

/// How the response body goes to the client.
enum Choice {
    /// Through the pump: SSE relayed (passed through or rewritten), JSON
    /// read on the side, or opaque bytes; `kind` is the request's label in
    /// the metrics.
    Pump { mode: Mode, kind: &'static str },
    /// A whole chat response to rewrite (`--rewrite`, or tool calling).
    Whole { options: StreamOptions, converter: Option<CallConverter> },
}

/// Phase 5, the mode. With tool calling and a request that carried tools,
/// the response's calls become `tool_calls` (rewrite mode, call text left
/// out of the content).
/// `registry` is the one the request's `<use_protocol>` declarations
/// built, when they did.
fn choose_mode(
    app: &App,
    endpoint: Endpoint,
    head: &Head,
    tools: Option<ToolRequest>,
    registry: Option<Arc<Registry>>,
) -> Choice {
    let mut options = app.config.options.clone();
    options.parser.rewrite = false;
    if let Some(registry) = registry {
        options.registry = registry;
    }
    let converter = match (app.config.tool_calling, tools) {
        (Some(tc), Some(req)) if endpoint == Endpoint::Chat && head.parse => {
            Some(CallConverter::attach(&mut options, req.catalog, tc.invalid_calls).with_shape(req.shape))
        }
        _ => None,
    };
    let rewrite = (app.config.rewrite || converter.is_some()) && endpoint == Endpoint::Chat && head.parse;
    if head.parse && head.body == BodyKind::Sse {
        let relay = SseRelay::new(options, rewrite, endpoint.done_framing()).with_calls(converter);
        Choice::Pump { mode: Mode::Sse(Box::new(relay)), kind: "chat_stream" }
    } else if head.parse && head.body == BodyKind::Lines {
        // Forwarded as it comes (JSON lines are never rewritten), read on the side.
        Choice::Pump { mode: Mode::Lines(Box::new(LineTap::new(options))), kind: "chat_stream" }
    } else if head.parse && rewrite {
        Choice::Whole { options, converter }
    } else if head.parse {
        Choice::Pump {
            mode: Mode::Json { buf: Vec::new(), limit: app.config.max_response_body, overflowed: false },
            kind: "chat",
        }
    } else {
        Choice::Pump { mode: Mode::Opaque, kind: if endpoint.is_model() { "chat" } else { "other" } }
    }
}

/// Phase 6, relay: the response head goes out now, and the pump
/// ([`super::pump`]) streams the body and finishes the request's records.
fn relay(app: &Arc<App>, ex: Exchange, mut head: Head, upstream: Upstream, mode: Mode, kind: &'static str) -> Response {
    app.metrics.request(kind);
    let stream_gauge = if head.body.is_stream() { Some(app.metrics.stream_started()) } else { None };
    if head.body.is_stream() {
        head.headers.remove(header::CONTENT_LENGTH);
        head.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        head.headers.insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    }
    let mut ctx = ex.into_pump(app, head.status.as_u16(), stream_gauge);
    if !head.status.is_success() {
        ctx.error_excerpt = Some(Vec::new());
    }
    let Upstream { body, first } = upstream;
    let body = pump_body(app.config.channel_capacity, move |out| pump(ctx, body, first, mode, out));
    respond(head.status, head.headers, Body::from_stream(body))
}

/// Phase 6 for a whole response to rewrite: read it all, rewrite it, keep
/// its records, answer.
async fn rewrite_whole(
    app: &Arc<App>,
    mut ex: Exchange,
    mut head: Head,
    upstream: Upstream,
    options: StreamOptions,
    converter: Option<CallConverter>,
) -> Response {
    ex.watch.armed = false;
    app.metrics.request("chat");
    let Upstream { body: mut rest, first } = upstream;
    let body = match read_whole(app, &mut rest, first).await {
        Ok(b) => b,
        Err(err) => return ex.fail(app, &err),
    };
    let (events, rewritten) = super::relay::whole_response(options, &body, true, converter);
    let body = rewritten.map_or(body, Bytes::from);
    head.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let ctx = ex.into_pump(app, head.status.as_u16(), None);
    super::pump::account_whole(ctx, events, &body).await;
    respond(head.status, head.headers, Body::from(body))
}

/// One request for the agent loop.
struct AgentRun {
    id: u64,
    agent: super::ProxyAgent,
    protocol: crate::tools::Protocol,
    /// The upstream chat-completions URL.
    url: String,
}

/// Runs the agent loop for one request and answers with its translation
/// ([`super::agent`]): streamed when the request asks for a stream, whole
/// otherwise. `held` (the in-flight permit and gauge) lives as long as the
/// response.
async fn run_agent(
    app: &Arc<App>,
    run: AgentRun,
    request: serde_json::Value,
    headers: &HeaderMap,
    held: (tokio::sync::OwnedSemaphorePermit, super::metrics::GaugeGuard),
) -> Response {
    use super::agent::Translator;
    use crate::tools::agent::{Agent, AgentEvent};
    let AgentRun { id, agent: owned, protocol, url } = run;
    app.metrics.request("agent");
    let model = clipped(request.get("model").and_then(serde_json::Value::as_str).unwrap_or_default(), MAX_MODEL_NAME);
    let streamed = request.get("stream").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let include_usage =
        request.pointer("/stream_options/include_usage").and_then(serde_json::Value::as_bool) == Some(true);
    // The endpoint is the request's own upstream URL (checked at bind).
    let mut agent = match Agent::new(&url, owned.runner.clone(), protocol) {
        Ok(a) => a
            .with_endpoint(url)
            .with_http(app.http.clone())
            .with_limits(owned.limits.clone())
            .with_async_tasks(owned.tasks),
        Err(e) => return error_response(&ProxyError::new(ProxyErrorKind::Agent, e.to_string())),
    };
    // The client's own key goes upstream; else the configured one.
    let client_key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    if let Some(key) = client_key.or_else(|| app.config.upstream_api_key.as_ref().map(|k| k.expose().to_string())) {
        agent = agent.with_api_key(key);
    }
    // The request's span and inspector entry see every event of the loop.
    let mut upstream_headers = HeaderMap::new();
    let mut watch = AgentWatch {
        id,
        trace: app.telemetry.as_ref().map(|t| t.request(headers, Some(&model), &mut upstream_headers)),
        inspector: app.inspector.clone(),
        ended: false,
    };
    if let Some(i) = &watch.inspector {
        i.start(id, Some(&model), "/v1/chat/completions (agent)", 200, Instant::now());
    }
    agent = agent.with_headers(upstream_headers);
    let cancel = app.hard_stop.child_token();
    let mut events = Box::pin(agent.run(request, cancel).map(move |e| {
        watch.see(&e);
        e
    }));
    let mut t = Translator::new(&model, id);
    if !streamed {
        while let Some(event) = events.next().await {
            t.on(event);
        }
        drop(held);
        if let Some(err) = t.upstream_failure() {
            tracing::warn!(id, "agent: {}", err.message());
            return error_response(&err);
        }
        let body = t.whole().to_string();
        let mut response = Response::new(Body::from(body));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    // Streamed: hold the status until the loop has something to say, so an
    // upstream that fails at once still gets a proper error status.
    let mut first: Vec<serde_json::Value> = vec![t.opening()];
    let mut ended = false;
    loop {
        match events.next().await {
            Some(event) => {
                let is_end = matches!(event, AgentEvent::End { .. });
                first.extend(t.on(event));
                if is_end {
                    ended = true;
                    break;
                }
                if first.len() > 1 {
                    break;
                }
            }
            None => {
                ended = true;
                break;
            }
        }
    }
    if ended && let Some(err) = t.upstream_failure() {
        tracing::warn!(id, "agent: {}", err.message());
        return error_response(&err);
    }
    let (tx, rx) = mpsc::channel::<ClientItem>(app.config.channel_capacity.max(1));
    let frame = |v: &serde_json::Value| Ok(Bytes::from(format!("data: {v}\n\n")));
    tokio::spawn(async move {
        let _held = held;
        for v in &first {
            if tx.send(frame(v)).await.is_err() {
                return;
            }
        }
        if !ended {
            loop {
                // A client that went away drops the loop (and kills its
                // tools) at once, also while a tool runs and nothing is
                // sent.
                let event = tokio::select! {
                    event = events.next() => event,
                    () = tx.closed() => return,
                };
                let Some(event) = event else { break };
                for v in t.on(event) {
                    if tx.send(frame(&v)).await.is_err() {
                        return;
                    }
                }
            }
        }
        for v in t.closing(include_usage) {
            if tx.send(frame(&v)).await.is_err() {
                return;
            }
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(HeaderName::from_static("x-accel-buffering"), HeaderValue::from_static("no"));
    respond(StatusCode::OK, headers, Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// The trace span and inspector entry of an agent request.
struct AgentWatch {
    id: u64,
    trace: Option<Trace>,
    inspector: Option<Arc<super::inspect::Inspector>>,
    ended: bool,
}

impl AgentWatch {
    fn see(&mut self, event: &crate::tools::agent::AgentEvent) {
        use crate::tools::agent::AgentEvent;
        match event {
            AgentEvent::Source { event, .. } => {
                if let Some(t) = self.trace.as_mut() {
                    t.observe(event);
                }
                if let Some(i) = &self.inspector {
                    i.events(self.id, std::slice::from_ref(event));
                }
            }
            // A new turn's element ids start again at 0: the page starts
            // new boxes at this mark.
            AgentEvent::TurnStart { .. } => {
                if let Some(i) = &self.inspector {
                    i.note(self.id, event.to_json());
                }
            }
            AgentEvent::ToolResult { result, .. } => {
                if let Some(t) = self.trace.as_mut() {
                    t.tool_run(&result.tool_id, result.ok, result.duration_ms, &result.observation);
                }
                if let Some(i) = &self.inspector {
                    i.note(self.id, result.to_event_json("tool_result"));
                }
            }
            AgentEvent::End { reason, .. } => {
                let outcome = serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_string));
                let outcome = match outcome.as_deref() {
                    Some("answer") | None => "ok".to_string(),
                    Some(other) => other.to_string(),
                };
                self.finish(&outcome);
            }
            _ => {}
        }
    }

    fn finish(&mut self, outcome: &str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        if let Some(t) = self.trace.take() {
            t.end(if outcome == "upstream" { 502 } else { 200 }, outcome, None);
        }
        if let Some(i) = &self.inspector {
            i.end(self.id, outcome);
        }
    }
}

impl Drop for AgentWatch {
    fn drop(&mut self) {
        // The client went away before the loop ended.
        self.finish("client_gone");
    }
}

fn respond(status: StatusCode, headers: HeaderMap, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// A request body read whole, and the room it takes in the request
/// buffer (given back when dropped).
struct Buffered {
    bytes: Bytes,
    share: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// Reads a request body the proxy buffers: at most `max_request_body`
/// bytes (`413`), each read waiting at most the request timeout (`408`: a
/// client that stalls mid-body holds no memory for long), every byte
/// taking room in the request buffer shared by all requests (none left:
/// `503` with `Retry-After`).
async fn read_request(app: &App, body: Body) -> Result<Buffered, ProxyError> {
    let limit = app.config.max_request_body;
    let wait = app.config.request_timeout;
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut share: Option<tokio::sync::OwnedSemaphorePermit> = None;
    loop {
        let piece = match tokio::time::timeout(wait, stream.next()).await {
            Ok(Some(Ok(piece))) => piece,
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ProxyError::new(
                    ProxyErrorKind::RequestBody,
                    format!("reading the request body failed: {e}"),
                ));
            }
            Err(_) => {
                app.metrics.refused("request_timeout");
                return Err(ProxyError::new(
                    ProxyErrorKind::RequestTimeout,
                    format!(
                        "the client sent no more of the request body for {:.1} s (--request-timeout)",
                        wait.as_secs_f64()
                    ),
                ));
            }
        };
        if buf.len() + piece.len() > limit {
            return Err(ProxyError::new(
                ProxyErrorKind::RequestTooLarge { limit },
                format!("the request body is larger than {limit} bytes"),
            ));
        }
        let Some(more) = app.request_buffer.take(piece.len()) else {
            app.metrics.rejected();
            let size = app.request_buffer.size();
            return Err(ProxyError::new(
                ProxyErrorKind::BufferFull { limit: size },
                format!(
                    "the request bodies being received fill the proxy's request buffer ({size} bytes, \
                     --max-request-buffer); retry shortly"
                ),
            ));
        };
        match share.as_mut() {
            Some(held) => held.merge(more),
            None => share = Some(more),
        }
        buf.extend_from_slice(&piece);
    }
    Ok(Buffered { bytes: Bytes::from(buf), share })
}

/// A request body that tool calling must read, decoded: a body in
/// `Content-Encoding` `gzip` (`x-gzip`) or `deflate` (zlib) becomes plain,
/// at most `limit` bytes, and the header goes (the upstream gets it plain).
///
/// # Errors
///
/// `415` for another encoding (`br`, `zstd`, more than one), `400` for a
/// body that does not decode, `413` for one that decodes to more than
/// `limit` bytes.
fn decoded_request(headers: &mut HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, ProxyError> {
    use flate2::read::{MultiGzDecoder, ZlibDecoder};
    use std::io::Read;
    let mut codings = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        let value = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
        codings.extend(value.split(',').map(str::trim).filter(|c| !c.is_empty() && *c != "identity").map(String::from));
    }
    fn read_at_most(reader: impl Read, limit: usize) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        reader.take(limit as u64 + 1).read_to_end(&mut out)?;
        Ok(out)
    }
    let decoded = match codings.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => return Ok(body),
        ["gzip" | "x-gzip"] => read_at_most(MultiGzDecoder::new(&body[..]), limit),
        ["deflate"] => read_at_most(ZlibDecoder::new(&body[..]), limit),
        _ => {
            return Err(ProxyError::new(
                ProxyErrorKind::UnsupportedEncoding,
                format!(
                    "tool calling reads the request body, and the proxy decodes only gzip and deflate; send it uncompressed (Content-Encoding: {})",
                    codings.join(", ")
                ),
            ));
        }
    };
    let decoded = decoded.map_err(|e| {
        ProxyError::new(
            ProxyErrorKind::RequestBody,
            format!("the request body does not decode as {}: {e}", codings.join(", ")),
        )
    })?;
    if decoded.len() > limit {
        return Err(ProxyError::new(
            ProxyErrorKind::RequestTooLarge { limit },
            format!("the request body decompresses to more than {limit} bytes"),
        ));
    }
    headers.remove(header::CONTENT_ENCODING);
    Ok(Bytes::from(decoded))
}

/// A proxy bound to its listen address, not yet serving.
#[derive(Debug)]
pub struct ProxyServer {
    proxy: Bound,
    /// The inspector page's listener, when it is on.
    ui: Option<Bound>,
    app: Arc<App>,
}

/// A bound listener and what it checks before routing: the `Host` for
/// its address, and for the proxy's the browser policy.
#[derive(Debug)]
struct Bound {
    listener: TcpListener,
    screen: Arc<Screen>,
}

impl Bound {
    /// Binds `addr`; the listener answers to the loopback names and
    /// `allowed_hosts` (or, not on loopback without names, to any), and
    /// has the browser policy of `origins` when given.
    async fn bind(
        addr: &str,
        allowed_hosts: &[String],
        origins: Option<Origins>,
        metrics: &Arc<Metrics>,
    ) -> Result<Bound, ProxyStartError> {
        let bind_error = |cause| ProxyStartError::Bind { addr: addr.to_string(), cause };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let ip = listener.local_addr().map_err(bind_error)?.ip();
        let screen = Arc::new(Screen::new(Hosts::for_listener(ip, allowed_hosts), origins, metrics.clone()));
        Ok(Bound { listener, screen })
    }

    /// Serves `router` behind the screen until `stop` (see [`listen::serve`]).
    async fn serve(self, router: Router, serving: Serving, stop: CancellationToken, metrics: Arc<Metrics>) {
        let router = router.layer(from_fn_with_state(self.screen, policy::screen));
        listen::serve(self.listener, router, serving, stop, metrics).await;
    }
}

/// A proxy serving in the background (see [`ProxyServer::spawn`]).
#[derive(Debug)]
pub struct ProxyHandle {
    addr: SocketAddr,
    ui_addr: Option<SocketAddr>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl ProxyHandle {
    /// The address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the inspector page, when it is on.
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui_addr
    }

    /// The proxy's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Starts a graceful shutdown and waits for it to end.
    ///
    /// # Errors
    ///
    /// The server's I/O error, if it failed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the shutdown running in the background.
    pub async fn shutdown(self) -> std::io::Result<()> {
        self.shutdown.cancel();
        self.join.await.unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }
}

impl ProxyServer {
    /// Validates the configuration, starts the sinks and binds `addr`
    /// (`127.0.0.1:0` picks a free port).
    ///
    /// # Errors
    ///
    /// A bad upstream URL, an address that cannot be bound, or a sink that
    /// cannot start.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes binds nothing.
    pub async fn bind(config: ProxyConfig, addr: &str) -> Result<ProxyServer, ProxyStartError> {
        if config.agent.is_some() && config.tool_calling.is_none() {
            let why = "the agent loop needs a tool protocol (--tool-protocol) to tell the model how to call";
            return Err(ProxyStartError::ToolCalling(why.to_string()));
        }
        if let Some(tc) = &config.tool_calling {
            tc.check(&config.options.registry).map_err(ProxyStartError::ToolCalling)?;
        }
        let allowed_hosts = config
            .allowed_hosts
            .iter()
            .map(|h| policy::host_name(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| ProxyStartError::Access(format!("allowed host: {why}")))?;
        let allow_origins = config
            .allow_origins
            .iter()
            .map(|o| policy::origin(o))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|why| ProxyStartError::Access(format!("allowed origin: {why}")))?;
        if config.max_request_buffer < config.max_request_body {
            return Err(ProxyStartError::Limits(format!(
                "the request buffer ({} bytes, --max-request-buffer) is smaller than the largest request body ({} \
                 bytes, --max-request-body): such a body could never be read",
                config.max_request_buffer, config.max_request_body
            )));
        }
        let bad = |why: &str| ProxyStartError::Upstream {
            url: super::sink::nats::mask_url(&config.upstream),
            why: why.to_string(),
        };
        let url = crate::sources::check_api_url(&config.upstream).map_err(|why| bad(&why))?;
        let origin = url.origin().ascii_serialization();
        let base_path = url.path().trim_end_matches('/').to_string();
        let client = || {
            reqwest::Client::builder()
                .connect_timeout(config.connect_timeout)
                .redirect(reqwest::redirect::Policy::none())
                .tcp_nodelay(true)
                .pool_idle_timeout(Duration::from_secs(60))
        };
        let http = client().build().map_err(|e| ProxyStartError::Client(super::error::chain(&e)))?;
        let ws_http = client().http1_only().build().map_err(|e| ProxyStartError::Client(super::error::chain(&e)))?;
        let metrics = Arc::new(Metrics::default());
        let sinks = Sinks::start(&config.sinks, config.sink_queue, http.clone(), metrics.clone()).await?;
        #[cfg(feature = "otel")]
        let telemetry = match &config.otel {
            Some(otel) => Some(Telemetry::start(otel).map_err(|e| ProxyStartError::Telemetry(e.to_string()))?),
            None => None,
        };
        #[cfg(not(feature = "otel"))]
        let telemetry: Option<Telemetry> = None;
        let proxy = Bound::bind(addr, &allowed_hosts, Some(Origins::new(&allow_origins)), &metrics).await?;
        // The inspector's page calls it same-origin: no browser policy.
        let (inspector, ui) = match &config.ui {
            Some(ui) => {
                ui.check().map_err(ProxyStartError::Ui)?;
                let bound = Bound::bind(&ui.listen, &allowed_hosts, None, &metrics).await?;
                (Some(Arc::new(super::inspect::Inspector::new(ui.clone()))), Some(bound))
            }
            None => (None, None),
        };
        let app = Arc::new(App {
            inspector,
            registries: super::protocols::Registries::default(),
            telemetry,
            limit: Arc::new(Semaphore::new(config.max_streams.max(1))),
            request_buffer: RequestBuffer::new(config.max_request_buffer),
            config,
            origin,
            base_path,
            http,
            ws_http,
            metrics,
            sinks,
            next_id: AtomicU64::new(1),
            stopping: CancellationToken::new(),
            hard_stop: CancellationToken::new(),
            sessions: TaskTracker::new(),
        });
        Ok(ProxyServer { proxy, ui, app })
    }

    /// The address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.proxy.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// The proxy's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.app.metrics.clone()
    }

    /// The address of the inspector page, when it is on (`/ui`).
    pub fn ui_addr(&self) -> Option<SocketAddr> {
        self.ui.as_ref().and_then(|b| b.listener.local_addr().ok())
    }

    /// Serves until `shutdown` completes (HTTP/1.1, at most
    /// [`ProxyConfig::max_connections`] connections per listener, each
    /// request head within [`ProxyConfig::request_timeout`], each request's
    /// `Host` and `Origin` checked first), then shuts down gracefully: stops
    /// accepting, refuses new requests on open connections with 503, lets
    /// running responses and WebSocket sessions finish for up to the grace
    /// period, then cuts the streams still running (each gets an in-band
    /// `proxy_shutting_down` error and `[DONE]`) and closes the sessions
    /// (`1001` to both sides), and finally flushes the sinks.
    ///
    /// # Errors
    ///
    /// An I/O error of the server.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops serving at once, without the graceful
    /// part; running pumps end when their clients or upstreams do.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
        let app = self.app;
        let serving = Serving {
            max_connections: super::listen::within_open_files(app.config.max_connections),
            header_timeout: app.config.request_timeout,
        };
        let stopping = app.stopping.clone();
        // The inspector page: its own listener, stopped with the proxy.
        if let (Some(ui), Some(insp)) = (self.ui, app.inspector.clone()) {
            tokio::spawn(ui.serve(super::inspect::router(insp), serving, stopping.clone(), app.metrics.clone()));
        }
        let router = Router::new()
            .route("/healthz", get(healthz))
            .route("/metrics", get(metrics))
            .fallback(forward)
            .with_state(app.clone());
        let serve = self.proxy.serve(router, serving, stopping.clone(), app.metrics.clone());
        let sessions = app.sessions.clone();
        let mut server = tokio::spawn(async move {
            serve.await;
            // The WebSocket sessions outlive their connections' tasks.
            sessions.close();
            sessions.wait().await;
            Ok::<(), std::io::Error>(())
        });
        let result = tokio::select! {
            r = &mut server => Some(r),
            () = shutdown => None,
        };
        let result = match result {
            Some(r) => r.unwrap_or_else(|e| Err(std::io::Error::other(e))),
            None => {
                tracing::info!(grace = ?app.config.grace, "shutting down: no new requests; running streams may finish");
                stopping.cancel();
                match tokio::time::timeout(app.config.grace, &mut server).await {
                    Ok(r) => r.unwrap_or_else(|e| Err(std::io::Error::other(e))),
                    Err(_) => {
                        tracing::warn!(
                            streams = app.metrics.streams_active(),
                            "grace period over; cutting the running streams"
                        );
                        app.hard_stop.cancel();
                        match tokio::time::timeout(Duration::from_secs(5), &mut server).await {
                            Ok(r) => r.unwrap_or_else(|e| Err(std::io::Error::other(e))),
                            Err(_) => {
                                server.abort();
                                Ok(())
                            }
                        }
                    }
                }
            }
        };
        app.hard_stop.cancel();
        app.sinks.close(Duration::from_secs(5)).await;
        if let Some(t) = app.telemetry.clone() {
            // The exporter's flush blocks until its thread has sent.
            let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
        }
        tracing::info!("proxy stopped");
        result
    }

    /// Serves in a background task; [`ProxyHandle::shutdown`] stops it.
    pub fn spawn(self) -> ProxyHandle {
        let addr = self.local_addr();
        let ui_addr = self.ui_addr();
        let metrics = self.metrics();
        let shutdown = CancellationToken::new();
        let signal = shutdown.clone().cancelled_owned();
        let join = tokio::spawn(self.run(signal));
        ProxyHandle { addr, ui_addr, metrics, shutdown, join }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let written = encoder.write_all(bytes).and_then(|()| encoder.finish());
        written.unwrap_or_else(|e| panic!("{e}"))
    }

    fn encoded(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn a_compressed_tool_request_is_decoded_or_refused() {
        let body = br#"{"model":"m","tools":[]}"#;
        for value in ["gzip", "x-gzip", "GZIP, identity"] {
            let mut headers = encoded(value);
            let plain = decoded_request(&mut headers, Bytes::from(gzip(body)), 1024).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&plain[..], body, "{value}");
            assert!(!headers.contains_key(header::CONTENT_ENCODING), "the upstream gets it plain");
        }
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        let zlib = zlib.write_all(body).and_then(|()| zlib.finish()).unwrap_or_else(|e| panic!("{e}"));
        let plain = decoded_request(&mut encoded("deflate"), Bytes::from(zlib), 1024).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&plain[..], body);
        // Not encoded: untouched.
        for mut headers in [HeaderMap::new(), encoded("identity")] {
            let same = decoded_request(&mut headers, Bytes::from_static(body), 1024).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&same[..], body);
        }
        let status = |value: &'static str, bytes: Vec<u8>, limit: usize| {
            decoded_request(&mut encoded(value), Bytes::from(bytes), limit).err().map(|e| (e.status(), e.code()))
        };
        assert_eq!(status("br", body.to_vec(), 1024), Some((415, "unsupported_request_encoding")));
        assert_eq!(status("gzip, br", gzip(body), 1024), Some((415, "unsupported_request_encoding")));
        assert_eq!(status("gzip", body.to_vec(), 1024), Some((400, "request_body_error")));
        // Bounded: a body that decompresses past the limit is refused.
        assert_eq!(status("gzip", gzip(&[b' '; 4096]), 1024), Some((413, "request_too_large")));
        assert_eq!(status("gzip", gzip(&[b' '; 1024]), 1024), None);
    }
}
