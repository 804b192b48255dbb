//! A mock OpenAI-compatible upstream that serves transcripts, so that the
//! proxy (and any OpenAI client) can be run end to end with no API key:
//! `spindle mock-upstream --transcripts corpora`.
//!
//! This module owns the mock's HTTP surface and its fault injection; what
//! each transcript turns into is the `library` submodule's. It is a test and demo
//! tool: it accepts any API key and ignores sampling parameters.
//!
//! # Endpoints
//!
//! * `POST /v1/chat/completions` with `"stream": true` or `false`. The
//!   transcript is chosen by, in order: `model` equal to a transcript name
//!   (the file's path below the directory without its transcript
//!   extension: `sse-refusal`, `missing-content-tags-en`); the last user
//!   message naming a transcript (file name or name, the longest match
//!   wins); else a hash of the request's `messages`, so the same request
//!   always gets the same transcript. The response header
//!   `x-mock-transcript` names it. A `model` that names no transcript gets
//!   OpenAI's answer, 404 with `code: "model_not_found"`, unless it is
//!   `mock` ([`ANY_MODEL`]) or the mock runs with [`ModelPolicy::Any`]
//!   (`--any-model`), where any name picks by message or hash.
//!   * `.sse` / `.bin` bodies are streamed as recorded, one event per
//!     write; `.chunks.txt` lines become `data:` events and `[DONE]`;
//!     plain text (`.txt`, `.md`) is cut into pieces of one to three words
//!     or characters, sent as `chat.completion.chunk`s with a role chunk,
//!     a finish chunk (`length` when the name says `truncated`), a usage
//!     chunk when `stream_options.include_usage` is set, and `[DONE]`;
//!     recorded `chat.completion` JSON is streamed the same way.
//!   * Non-streamed requests get a `chat.completion`: recorded JSON as
//!     recorded, streams assembled from their chunks (a recorded in-band
//!     error becomes an error status), text as one message.
//!   * Synthesised ids are `chatcmpl-` and a hash of the transcript and
//!     the request, `created` is the mock's start time, `model` is the
//!     request's: identical requests get identical answers.
//! * `GET /v1/models` lists the transcripts (and the scripts' models);
//!   `GET /v1/models/{name}`.
//! * `GET /healthz`, and `GET /mock/stats` (requests, streams started,
//!   completed and cancelled by the client).
//! * `GET /mock/requests`: the last chat-completions request bodies the mock
//!   received (64 by default, [`MockUpstream::with_request_log`]), oldest
//!   first, so a test can check what an agent or a proxy sent.
//!
//! # Scripted conversations
//!
//! A `model` that names a [`Script`] (a `*.script.toml` in the transcript
//! directory, or `--script FILE`) plays a multi-turn conversation: each
//! request is answered by the transcript of the first turn whose
//! conditions hold (the turn number, text the last message contains);
//! see [`Script`] for the format.
//!
//! # Pacing and faults
//!
//! `--pace-ms N` waits N ms between events. A request header
//! `x-mock-fault` injects faults (comma-separated):
//!
//! | fault | effect |
//! |---|---|
//! | `reset-after=N` | after N events the connection is aborted (no clean end) |
//! | `stall-after=N` | after N events nothing more is sent; the connection stays open |
//! | `status=CODE` | an OpenAI-style JSON error with that status |
//! | `html=CODE` | an HTML page with that status |
//! | `delay-ms=N` | wait N ms before the response head |
//!
//! `x-mock-stamp: 1` puts a comment `: t=<Unix time in ns>` before each
//! event as it is written (the proxy benchmark measures latency with it).

mod library;
mod script;

pub use library::{MockError, Transcript};
pub use script::{Script, ScriptError, ScriptTurn};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as AxumPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Counters of a mock, for tests (`GET /mock/stats` in JSON).
#[derive(Debug, Default)]
pub struct MockStats {
    requests: AtomicU64,
    streams_started: AtomicU64,
    streams_completed: AtomicU64,
    streams_cancelled: AtomicU64,
    last_cancel: Mutex<Option<Instant>>,
}

impl MockStats {
    /// Chat-completion requests received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Streamed responses started.
    pub fn streams_started(&self) -> u64 {
        self.streams_started.load(Ordering::Relaxed)
    }

    /// Streamed responses that sent their last event.
    pub fn streams_completed(&self) -> u64 {
        self.streams_completed.load(Ordering::Relaxed)
    }

    /// Streamed responses whose client went away before the end (the mock
    /// saw its body dropped).
    pub fn streams_cancelled(&self) -> u64 {
        self.streams_cancelled.load(Ordering::Relaxed)
    }

    /// When the last cancellation was seen.
    pub fn last_cancel(&self) -> Option<Instant> {
        self.last_cancel.lock().ok().and_then(|g| *g)
    }

    fn to_json(&self) -> Value {
        json!({
            "requests": self.requests(),
            "streams_started": self.streams_started(),
            "streams_completed": self.streams_completed(),
            "streams_cancelled": self.streams_cancelled(),
        })
    }
}

/// A mock upstream, configured but not yet serving.
#[derive(Debug, Clone)]
pub struct MockUpstream {
    transcripts: Arc<Vec<Transcript>>,
    pace: Duration,
    created: i64,
    stats: Arc<MockStats>,
    models: ModelPolicy,
    scripts: Arc<Vec<Script>>,
    requests: Arc<RequestLog>,
}

/// The last request bodies a mock received (bounded), for tests.
#[derive(Debug)]
pub struct RequestLog {
    keep: usize,
    bodies: Mutex<VecDeque<Value>>,
}

impl RequestLog {
    fn new(keep: usize) -> RequestLog {
        RequestLog { keep, bodies: Mutex::new(VecDeque::new()) }
    }

    fn push(&self, body: Value) {
        if self.keep == 0 {
            return;
        }
        let mut bodies = self.bodies.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if bodies.len() == self.keep {
            bodies.pop_front();
        }
        bodies.push_back(body);
    }

    /// The chat-completions request bodies received, oldest first (the last
    /// N, N set by [`MockUpstream::with_request_log`]); a body that is not
    /// JSON is kept as a string.
    pub fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect()
    }
}

/// How many request bodies a mock keeps by default.
pub const REQUEST_LOG: usize = 64;

/// What the mock does with a `model` that names no transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelPolicy {
    /// Answer as OpenAI does: 404 with `model_not_found` (the default), so
    /// a typo in a script or test is an error, not some other transcript.
    /// The model [`ANY_MODEL`] (`"mock"`) and a request without `model`
    /// still pick by the last user message or a hash of the messages.
    #[default]
    Strict,
    /// Any model name picks by the last user message or a hash of the
    /// messages (`spindle mock-upstream --any-model`).
    Any,
}

/// The model name that asks the mock to choose the transcript by the last
/// user message (a transcript named in it) or a hash of the messages.
pub const ANY_MODEL: &str = "mock";

impl MockUpstream {
    /// Serves every transcript under `dir` (recursively).
    ///
    /// # Errors
    ///
    /// A directory or file that cannot be read, or no servable file.
    ///
    /// The directory's `*.script.toml` files are loaded as scripts
    /// ([`Script`]).
    pub fn from_dir(dir: &Path) -> Result<MockUpstream, MockError> {
        let (transcripts, scripts) = library::load_dir(dir)?;
        let mut mock = MockUpstream::new(transcripts);
        for path in scripts {
            let script = Script::load(&path).map_err(|e| MockError::Script(e.to_string()))?;
            mock = mock.with_script(script)?;
        }
        Ok(mock)
    }

    /// Serves a few transcripts built into the binary (copies of some of
    /// `corpora/`), for when no directory is at hand.
    pub fn builtin() -> MockUpstream {
        MockUpstream::new(library::builtin())
    }

    /// Serves these transcripts.
    pub fn new(transcripts: Vec<Transcript>) -> MockUpstream {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        MockUpstream {
            transcripts: Arc::new(transcripts),
            pace: Duration::ZERO,
            created,
            stats: Arc::default(),
            models: ModelPolicy::Strict,
            scripts: Arc::default(),
            requests: Arc::new(RequestLog::new(REQUEST_LOG)),
        }
    }

    /// Plays `script` for its model name (see [`Script`]).
    ///
    /// # Errors
    ///
    /// [`MockError::Script`] when a turn names a transcript the mock does
    /// not serve.
    pub fn with_script(mut self, script: Script) -> Result<MockUpstream, MockError> {
        script.check(&self.transcripts).map_err(MockError::Script)?;
        let mut scripts: Vec<Script> = self.scripts.iter().filter(|s| s.model != script.model).cloned().collect();
        scripts.push(script);
        self.scripts = Arc::new(scripts);
        Ok(self)
    }

    /// Keeps the last `n` request bodies (default [`REQUEST_LOG`]; 0 keeps
    /// none).
    pub fn with_request_log(mut self, n: usize) -> MockUpstream {
        self.requests = Arc::new(RequestLog::new(n));
        self
    }

    /// The request bodies received (also `GET /mock/requests`).
    pub fn requests(&self) -> Arc<RequestLog> {
        self.requests.clone()
    }

    /// What to do with a model that names no transcript (default:
    /// [`ModelPolicy::Strict`], a 404 as OpenAI answers).
    pub fn with_models(mut self, policy: ModelPolicy) -> MockUpstream {
        self.models = policy;
        self
    }

    /// Waits this long between events (default: none).
    pub fn with_pace(mut self, pace: Duration) -> MockUpstream {
        self.pace = pace;
        self
    }

    /// The transcripts served.
    pub fn transcripts(&self) -> &[Transcript] {
        &self.transcripts
    }

    /// The counters.
    pub fn stats(&self) -> Arc<MockStats> {
        self.stats.clone()
    }

    /// The mock as an axum router.
    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .route("/v1/models/{*id}", get(model))
            .route("/healthz", get(|| async { axum::Json(json!({"status": "ok"})) }))
            .route("/mock/stats", get(|State(m): State<MockUpstream>| async move { axum::Json(m.stats.to_json()) }))
            .route(
                "/mock/requests",
                get(|State(m): State<MockUpstream>| async move { axum::Json(Value::Array(m.requests.bodies())) }),
            )
            .fallback(|uri: axum::http::Uri| async move {
                openai_error(StatusCode::NOT_FOUND, &format!("Unknown request URL: {}", uri.path()), "unknown_url")
            })
            .with_state(self)
    }

    /// Binds `addr` (`127.0.0.1:0` picks a free port) and serves in the
    /// background until [`MockServer::shutdown`].
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes binds nothing.
    pub async fn spawn(self, addr: &str) -> std::io::Result<MockServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let stats = self.stats.clone();
        let requests = self.requests.clone();
        let stop = CancellationToken::new();
        let signal = stop.clone().cancelled_owned();
        let router = self.router();
        let join = tokio::spawn(async move { axum::serve(listener, router).with_graceful_shutdown(signal).await });
        Ok(MockServer { addr, stats, requests, stop, join })
    }
}

/// A mock serving in the background.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    stats: Arc<MockStats>,
    requests: Arc<RequestLog>,
    stop: CancellationToken,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl MockServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR` (what `spindle proxy --upstream` takes).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The counters.
    pub fn stats(&self) -> Arc<MockStats> {
        self.stats.clone()
    }

    /// The request bodies received, oldest first.
    pub fn requests(&self) -> Vec<Value> {
        self.requests.bodies()
    }

    /// Stops accepting and waits for open responses to end (a stalled
    /// stream ends when its client goes away).
    ///
    /// # Errors
    ///
    /// The server's I/O error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the server stopping in the background.
    pub async fn shutdown(self) -> std::io::Result<()> {
        self.stop.cancel();
        self.join.await.unwrap_or_else(|e| Err(std::io::Error::other(e)))
    }
}

fn openai_error(status: StatusCode, message: &str, code: &str) -> Response {
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    (status, axum::Json(json!({"error": {"message": message, "type": kind, "param": null, "code": code}})))
        .into_response()
}

/// OpenAI's answer to an unknown model: 404, `model_not_found`, `param`
/// `model`.
fn model_not_found(message: &str) -> Response {
    let error = json!({"error": {"message": message, "type": "invalid_request_error", "param": "model", "code": "model_not_found"}});
    (StatusCode::NOT_FOUND, axum::Json(error)).into_response()
}

async fn models(State(mock): State<MockUpstream>) -> Response {
    let data: Vec<Value> = mock
        .transcripts
        .iter()
        .map(|t| json!({"id": t.name, "object": "model", "created": mock.created, "owned_by": "spindle-mock", "kind": t.kind()}))
        .chain(mock.scripts.iter().map(|s| {
            json!({"id": s.model, "object": "model", "created": mock.created, "owned_by": "spindle-mock", "kind": "script"})
        }))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn model(State(mock): State<MockUpstream>, AxumPath(id): AxumPath<String>) -> Response {
    match mock.transcripts.iter().find(|t| t.name == id) {
        Some(t) => {
            axum::Json(json!({"id": t.name, "object": "model", "created": mock.created, "owned_by": "spindle-mock"}))
                .into_response()
        }
        None => openai_error(StatusCode::NOT_FOUND, &format!("The model `{id}` does not exist"), "model_not_found"),
    }
}

/// Faults asked for with `x-mock-fault`.
#[derive(Debug, Default, Clone, Copy)]
struct Faults {
    reset_after: Option<usize>,
    stall_after: Option<usize>,
    status: Option<u16>,
    html: Option<u16>,
    delay_ms: Option<u64>,
}

fn faults(headers: &HeaderMap) -> Faults {
    let mut f = Faults::default();
    let Some(text) = headers.get("x-mock-fault").and_then(|v| v.to_str().ok()) else { return f };
    for part in text.split(',') {
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        let value = value.trim();
        match key.trim() {
            "reset-after" => f.reset_after = value.parse().ok(),
            "stall-after" => f.stall_after = value.parse().ok(),
            "status" => f.status = value.parse().ok(),
            "html" => f.html = value.parse().ok().or(Some(200)),
            "delay-ms" => f.delay_ms = value.parse().ok(),
            _ => {}
        }
    }
    f
}

async fn chat(State(mock): State<MockUpstream>, headers: HeaderMap, body: Bytes) -> Response {
    mock.stats.requests.fetch_add(1, Ordering::Relaxed);
    let f = faults(&headers);
    if let Some(ms) = f.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(code) = f.status {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return openai_error(status, "mock fault: error status", "mock_fault");
    }
    if let Some(code) = f.html {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
        let page = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1><p>mock fault</p></body></html>\n";
        return (status, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], page).into_response();
    }
    let parsed = serde_json::from_slice::<Value>(&body);
    mock.requests.push(match &parsed {
        Ok(v) => v.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
    });
    let request: Value = match parsed {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return openai_error(
                StatusCode::BAD_REQUEST,
                "We could not parse the JSON body of your request.",
                "invalid_json",
            );
        }
    };
    let script = request.get("model").and_then(Value::as_str).and_then(|m| mock.scripts.iter().find(|s| s.model == m));
    let chosen = match script {
        Some(script) => {
            let Some(name) = script.choose(&request) else {
                let turn = Script::turn_of(&request);
                let message = format!("spindle mock: script {} has no turn that answers turn {turn}", script.model);
                return openai_error(StatusCode::BAD_REQUEST, &message, "script_exhausted");
            };
            mock.transcripts.iter().find(|t| t.name == name || t.file == name).map(|t| (t, "model"))
        }
        None => library::choose(&mock.transcripts, &request),
    };
    let Some((transcript, why)) = chosen else {
        return openai_error(StatusCode::SERVICE_UNAVAILABLE, "the mock has no transcripts", "no_transcripts");
    };
    if why != "model"
        && mock.models == ModelPolicy::Strict
        && let Some(name) = request.get("model").and_then(Value::as_str)
        && name != ANY_MODEL
    {
        let message = format!(
            "The model `{name}` does not exist or you do not have access to it. (spindle mock: the models are the transcript names of GET /v1/models, or `{ANY_MODEL}` to pick by the last user message; `--any-model` accepts any name.)"
        );
        return model_not_found(&message);
    }
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = request.get("model").and_then(Value::as_str).unwrap_or(&transcript.name).to_string();
    let prompt_tokens = request.get("messages").map(|m| m.to_string().len() as u64 / 4).unwrap_or(0);
    let include_usage = request.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false);
    let mut seed = transcript.name.clone().into_bytes();
    seed.extend_from_slice(&body);
    let hash = library::fnv(&seed);
    let meta = library::Meta {
        id: format!("chatcmpl-mock{hash:016x}"),
        created: mock.created,
        model,
        include_usage: include_usage || !stream,
        prompt_tokens,
    };
    let mut out_headers = HeaderMap::new();
    out_headers.insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req_{hash:016x}")).unwrap_or(HeaderValue::from_static("req")),
    );
    if let Ok(v) = HeaderValue::from_str(&transcript.name) {
        out_headers.insert("x-mock-transcript", v);
    }
    if !stream {
        return match library::whole(transcript, &meta) {
            Ok(bytes) => {
                out_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                (StatusCode::OK, out_headers, bytes).into_response()
            }
            Err((status, error)) => {
                let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                (status, out_headers, axum::Json(error)).into_response()
            }
        };
    }
    let frames = library::stream_frames(transcript, &meta);
    mock.stats.streams_started.fetch_add(1, Ordering::Relaxed);
    let stamp = headers.get("x-mock-stamp").is_some_and(|v| v.as_bytes() != b"0");
    let play = Play {
        frames,
        next: 0,
        pace: mock.pace,
        stamp,
        faults: f,
        ended: false,
        guard: Guard { stats: mock.stats.clone(), finished: false },
    };
    out_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    out_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let body = Body::from_stream(futures::stream::unfold(play, step));
    (StatusCode::OK, out_headers, body).into_response()
}

/// Records a cancellation when a stream's body is dropped before its end.
#[derive(Debug)]
struct Guard {
    stats: Arc<MockStats>,
    finished: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.finished {
            self.stats.streams_cancelled.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut last) = self.stats.last_cancel.lock() {
                *last = Some(Instant::now());
            }
        }
    }
}

/// One stream being played.
#[derive(Debug)]
struct Play {
    frames: Vec<Bytes>,
    next: usize,
    pace: Duration,
    stamp: bool,
    faults: Faults,
    ended: bool,
    guard: Guard,
}

async fn step(mut play: Play) -> Option<(Result<Bytes, std::io::Error>, Play)> {
    if play.ended {
        return None;
    }
    if play.faults.reset_after == Some(play.next) {
        // Let hyper flush the events before it: it writes out what it
        // holds only when the body is not ready.
        tokio::time::sleep(Duration::from_millis(20)).await;
        play.ended = true;
        play.guard.finished = true;
        return Some((Err(std::io::Error::other("mock fault: connection reset")), play));
    }
    if play.faults.stall_after == Some(play.next) {
        // Silent until the client goes away (the body is then dropped).
        futures::future::pending::<()>().await;
    }
    if play.next >= play.frames.len() {
        play.guard.finished = true;
        play.guard.stats.streams_completed.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    if play.next > 0 && !play.pace.is_zero() {
        tokio::time::sleep(play.pace).await;
    }
    let frame = play.frames[play.next].clone();
    play.next += 1;
    let frame = if play.stamp {
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let mut stamped = format!(": t={ns}\n").into_bytes();
        stamped.extend_from_slice(&frame);
        Bytes::from(stamped)
    } else {
        frame
    };
    Some((Ok(frame), play))
}
