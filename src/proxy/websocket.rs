//! WebSocket pass-through: a request on a forwarded path that asks for a
//! WebSocket upgrade (OpenAI's Realtime API, `GET /v1/realtime?model=...`)
//! becomes a session relayed between the client and the upstream.
//!
//! This module owns such a request from the moment the server admitted it
//! (after the listener's screen of `Host` and `Origin`, the path check and
//! the in-flight limit) to the end of its session: both handshakes, the
//! relay of messages, and closing both sides. It must not touch plain HTTP
//! requests (the server's and the pump's), and it never changes, delays
//! or holds back a message it relays: they go on as they came. Reading
//! them is [`crate::sources`]'s (below).
//!
//! # Phases of a session
//!
//! 1. **Check** the client's handshake: `GET` with `Upgrade: websocket`
//!    and `Connection: upgrade` ([`asks_upgrade`]), a `Sec-WebSocket-Key`,
//!    version 13, a connection hyper can upgrade; else `400`
//!    (`websocket_handshake_invalid`).
//! 2. **Upstream handshake**, before the client gets anything: to the URL
//!    an HTTP request of that path goes to (`App::target`; `ws://` and
//!    `wss://` are `http://` and `https://` for the handshake, which
//!    reqwest sends over HTTP/1.1 with its own TLS), with the headers an
//!    HTTP request forwards (end-to-end ones, the configured key as
//!    `Authorization: Bearer` when the client sent none, neither as that
//!    header nor as an `openai-insecure-api-key.KEY` subprotocol), the client's
//!    `Sec-WebSocket-Protocol` list as offered, and a key and version of
//!    the proxy's own: the client's `Sec-WebSocket-Key`, `-Version` and
//!    `-Extensions` belong to its own connection. An upstream that answers
//!    anything but `101` has its status, headers and body (at most
//!    `max_response_body` bytes) passed to the client, as over HTTP; one
//!    that cannot be reached gets the client the proxy's `502` (`504` past
//!    the first-byte timeout); a `101` that is no valid answer (a wrong
//!    `Sec-WebSocket-Accept`, a subprotocol not offered, an extension) a
//!    `502`.
//! 3. **Client handshake**: only now `101` to the client, with the
//!    subprotocol the upstream chose and the upstream's other end-to-end
//!    headers (the listener's screen adds the CORS ones).
//! 4. **Relay**, both ways at once, message by message, each written
//!    before the next is read: text, binary, ping, pong and close frames
//!    go on as they came (no coalescing, no reordering). A message or
//!    frame larger than `max_ws_message` ends the session.
//! 5. **End**, when either direction ends: a close frame relayed ends it
//!    cleanly; otherwise both sides get a close frame from the proxy
//!    (`1009` for a message too big, `1001` at shutdown, `1002` to a side
//!    that broke the protocol, `1001` to the upstream when the client
//!    vanished, `1014` to the client when the upstream did). Each side's
//!    close handshake and TCP close then get [`CLOSE_WAIT`] at most.
//!
//! # Parsing on the side
//!
//! The upstream's text messages that are Realtime API server events of a
//! response (`response.output_text.delta`, `response.text.delta`, the
//! audio transcripts' `response.output_audio_transcript.delta` and
//! `response.audio_transcript.delta`, function-call arguments, and
//! `response.done` to end it) are read by a [`crate::sources::ChatStream`]
//! per response, as the HTTP streams are: elements, repairs and
//! diagnostics go to the metrics, the sinks, the inspector and the
//! session's trace span (with the `otel` feature; the span's
//! `traceparent` goes upstream in the handshake), under a
//! stream id of each response's own, the path, and the `model` of the
//! handshake's query. The text and transcript items of one response are
//! one answer (choice 0). Other events (audio, input, session) are not
//! parsed; a response cut off by the session's end is reported truncated.
//! As over HTTP, a message is read after it was relayed and before the
//! next one is read: parsing never delays the message itself, and only a
//! sink with the `block` policy can slow the upstream's direction down.
//!
//! A session counts as a request in flight (against `max_streams`, and in
//! `requests_active`) and keeps its client connection's slot under
//! `max_connections` until it ends; `/metrics` counts sessions open and
//! ended (by how), and messages and payload bytes by direction.
//!
//! # What is preserved, and what is not
//!
//! Every message's kind and payload, byte for byte, and close codes and
//! reasons. Not preserved: fragmentation (a message is relayed whole, as
//! one frame, at most `max_ws_message` bytes) and extensions (none is
//! negotiated with either side, so no `permessage-deflate`). The proxy's
//! WebSocket (tungstenite) answers pings and close frames itself, as RFC
//! 6455 asks: a ping is answered at once by the proxy and also relayed, so
//! the pinging side may get the far side's pong too (unsolicited pongs are
//! allowed, and ignored by clients); the side that closes first gets its
//! own close frame back from the proxy rather than the far side's reply.
//!
//! # Shutdown
//!
//! Sessions are not requests the grace period waits for on a connection
//! (hyper let go of the connection at the upgrade); the server waits for
//! them with its grace period, then the hard stop closes both sides of
//! every session with `1001` (going away).

use super::app::{App, end_to_end};
use super::error::{ProxyError, ProxyErrorKind, chain, error_response, from_send_error};
use super::listen::ConnectionSlot;
use super::metrics::{Direction, GaugeGuard};
use super::pump::{Stream as SinkStream, dispatch_events, read_whole};
use super::trace::Trace;
use crate::sources::{ChatStream, SourceEvent};
use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use futures::{Sink, SinkExt, Stream, StreamExt};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::CancellationToken;

/// The longest the end of a session may take: the close frames to both
/// sides, their replies, and the TCP close.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// What an admitted request holds while it is in flight: the in-flight
/// permit and the requests gauge (a session holds them to its end).
pub(crate) type Held = (OwnedSemaphorePermit, GaugeGuard);

/// The client's side of a session: the connection hyper upgraded.
type ClientWs = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The upstream's side: the connection reqwest upgraded.
type UpstreamWs = WebSocketStream<reqwest::Upgraded>;

/// The `Sec-WebSocket-*` headers that belong to one connection's
/// handshake: never passed from one side to the other.
const HANDSHAKE_HEADERS: [HeaderName; 4] = [
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::SEC_WEBSOCKET_ACCEPT,
];

/// Whether a request asks for a WebSocket: `GET` with `Upgrade:
/// websocket` and `Connection` naming `upgrade` (tokens, any case).
pub(crate) fn asks_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::GET
        && has_token(headers, &header::UPGRADE, "websocket")
        && has_token(headers, &header::CONNECTION, "upgrade")
}

/// Whether a comma-separated header names `token` (any case).
fn has_token(headers: &HeaderMap, name: &HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The tokens of every `name` header (comma-separated), in order.
fn tokens(headers: &HeaderMap, name: &HeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// A WebSocket's limits: messages and frames of at most `limit` bytes.
fn socket_config(limit: usize) -> WebSocketConfig {
    WebSocketConfig::default().max_message_size(Some(limit)).max_frame_size(Some(limit))
}

/// One side of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Client,
    Upstream,
}

impl Peer {
    /// The direction of the messages this side sends.
    fn direction(self) -> Direction {
        match self {
            Peer::Client => Direction::ClientToUpstream,
            Peer::Upstream => Direction::UpstreamToClient,
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Peer::Client => "client",
            Peer::Upstream => "upstream",
        })
    }
}

/// The client's handshake, checked (phase 1).
struct ClientHandshake {
    /// The `Sec-WebSocket-Accept` that answers its key.
    accept: HeaderValue,
    /// The connection, once hyper has sent the `101`.
    on_upgrade: OnUpgrade,
    /// The subprotocols it offers, in order.
    offered: Vec<String>,
}

/// Phase 1: the client's handshake, or why it is none.
fn check(parts: &mut Parts) -> Result<ClientHandshake, ProxyError> {
    let bad = |why: &str| ProxyError::new(ProxyErrorKind::WebSocketHandshake, why);
    let key = parts
        .headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| bad("the WebSocket handshake has no Sec-WebSocket-Key"))?;
    if parts.headers.get(header::SEC_WEBSOCKET_VERSION).map(HeaderValue::as_bytes) != Some(b"13") {
        return Err(bad("the proxy speaks WebSocket version 13 only (Sec-WebSocket-Version: 13)"));
    }
    let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
        .map_err(|_| bad("the Sec-WebSocket-Key cannot be answered"))?;
    let on_upgrade = parts
        .extensions
        .remove::<OnUpgrade>()
        .ok_or_else(|| bad("this connection cannot be upgraded (a WebSocket needs HTTP/1.1)"))?;
    let offered = tokens(&parts.headers, &header::SEC_WEBSOCKET_PROTOCOL);
    Ok(ClientHandshake { accept, on_upgrade, offered })
}

/// A WebSocket handshake admitted by the server: phases 1 to 3, and the
/// session spawned into the server's sessions.
pub(crate) async fn forward(app: &Arc<App>, id: u64, mut parts: Parts, held: Held) -> Response {
    let path = parts.uri.path().to_string();
    let client = match check(&mut parts) {
        Ok(client) => client,
        Err(err) => {
            tracing::info!(id, path = %path, "{err}");
            return error_response(&err);
        }
    };
    app.metrics.request("websocket");
    let url = app.target(&parts.uri);
    let model = model_in_query(&parts.uri);
    let mut carried = HeaderMap::new();
    let trace = app.telemetry.as_ref().map(|t| t.session(&parts.headers, model.as_deref(), &mut carried));
    let upstream = match open_upstream(app, &url, &parts.headers, carried, &client.offered).await {
        Ok(Opened::Accepted(accepted)) => accepted,
        Ok(Opened::Refused(response)) => {
            let status = response.status().as_u16();
            tracing::info!(id, path = %path, status, "upstream refused the WebSocket");
            if let Some(t) = trace {
                t.end(status, "refused", None);
            }
            return response;
        }
        Err(err) => {
            if err.side() == super::error::Side::Upstream {
                app.metrics.upstream_error(err.code());
            }
            tracing::warn!(id, path = %path, "{err}");
            if let Some(t) = trace {
                t.end(err.status(), err.code(), None);
            }
            return error_response(&err);
        }
    };
    let upstream = *upstream;
    let slot = parts.extensions.get::<Arc<ConnectionSlot>>().cloned();
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    *headers = upstream.headers;
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, client.accept);
    if let Some(protocol) = upstream.protocol {
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, protocol);
    }
    let session = Session { app: app.clone(), id, path, model, trace, _held: held, _slot: slot };
    app.sessions.spawn(session.run(client.on_upgrade, upstream.ws));
    response
}

/// What the upstream made of the handshake.
enum Opened {
    /// It switched protocols.
    Accepted(Box<Accepted>),
    /// It answered otherwise: its answer, for the client.
    Refused(Response),
}

/// An upstream WebSocket, open.
struct Accepted {
    ws: UpstreamWs,
    /// The subprotocol it chose.
    protocol: Option<HeaderValue>,
    /// Its other end-to-end headers, for the client's `101`.
    headers: HeaderMap,
}

/// The subprotocol prefix by which a browser client sends its API key.
const KEY_SUBPROTOCOL: &str = "openai-insecure-api-key.";

/// Phase 2: the upstream's handshake.
/// `carried` are the headers that carry the session's trace upstream.
async fn open_upstream(
    app: &App,
    url: &str,
    client: &HeaderMap,
    carried: HeaderMap,
    offered: &[String],
) -> Result<Opened, ProxyError> {
    let key = generate_key();
    let mut headers = end_to_end(client);
    headers.extend(carried);
    // A browser cannot set `Authorization` on a WebSocket: it names its key
    // in a subprotocol (OpenAI's `openai-insecure-api-key.KEY`). That is
    // the client's own key, as an `Authorization` header would be: the
    // configured one is not added beside it.
    if !offered.iter().any(|p| p.starts_with(KEY_SUBPROTOCOL)) {
        app.add_upstream_key(&mut headers);
    }
    for name in &HANDSHAKE_HEADERS {
        headers.remove(name);
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    let key_value = HeaderValue::from_str(&key)
        .map_err(|_| ProxyError::new(ProxyErrorKind::WebSocketHandshake, "cannot make a WebSocket key"))?;
    headers.insert(header::SEC_WEBSOCKET_KEY, key_value);
    let wait = app.config.first_byte_timeout;
    let send = app.ws_http.get(url).headers(headers).send();
    let response = tokio::select! {
        sent = tokio::time::timeout(wait, send) => match sent {
            Err(_) => return Err(ProxyError::idle(ProxyErrorKind::Timeout, wait, "answer to the WebSocket handshake")),
            Ok(Err(e)) => return Err(from_send_error(&e)),
            Ok(Ok(response)) => response,
        },
        () = app.hard_stop.cancelled() => {
            return Err(ProxyError::new(ProxyErrorKind::ShuttingDown, "the proxy is shutting down"));
        }
    };
    let status = response.status();
    app.metrics.upstream_status(status.as_u16());
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return refusal(app, response).await.map(Opened::Refused);
    }
    let protocol = verify(response.headers(), &key, offered)?;
    let mut headers = end_to_end(response.headers());
    super::policy::drop_cors(&mut headers);
    for name in HANDSHAKE_HEADERS.iter().chain([&header::SEC_WEBSOCKET_PROTOCOL, &header::CONTENT_LENGTH]) {
        headers.remove(name);
    }
    let upgraded = response.upgrade().await.map_err(|e| {
        ProxyError::new(ProxyErrorKind::Reset, format!("the upstream's WebSocket connection failed: {}", chain(&e)))
    })?;
    let ws =
        WebSocketStream::from_raw_socket(upgraded, Role::Client, Some(socket_config(app.config.max_ws_message))).await;
    Ok(Opened::Accepted(Box::new(Accepted { ws, protocol, headers })))
}

/// Whether the upstream's `101` answers the proxy's handshake (its
/// `Upgrade`, its `Sec-WebSocket-Accept` for `key`, no extension, a
/// subprotocol among the `offered`); the subprotocol it chose.
fn verify(headers: &HeaderMap, key: &str, offered: &[String]) -> Result<Option<HeaderValue>, ProxyError> {
    let bad = |why: String| {
        ProxyError::new(
            ProxyErrorKind::InvalidResponse,
            format!("the upstream switched to a WebSocket but its answer is not valid: {why}"),
        )
    };
    if !has_token(headers, &header::UPGRADE, "websocket") {
        return Err(bad("no `Upgrade: websocket`".into()));
    }
    let expected = derive_accept_key(key.as_bytes());
    if headers.get(header::SEC_WEBSOCKET_ACCEPT).map(HeaderValue::as_bytes) != Some(expected.as_bytes()) {
        return Err(bad("its Sec-WebSocket-Accept does not answer the proxy's key".into()));
    }
    if headers.contains_key(header::SEC_WEBSOCKET_EXTENSIONS) {
        return Err(bad("it names an extension, and none was offered".into()));
    }
    let protocol = headers.get(header::SEC_WEBSOCKET_PROTOCOL);
    if let Some(chosen) = protocol {
        let text = String::from_utf8_lossy(chosen.as_bytes());
        if !offered.iter().any(|o| *o == text) {
            return Err(bad(format!("it chose the subprotocol {text:?}, which the client did not offer")));
        }
    }
    Ok(protocol.cloned())
}

/// The upstream's refusal of a handshake, for the client: its status, its
/// end-to-end headers (not its CORS ones) and its body, read whole (at
/// most `max_response_body` bytes, each read within the idle timeout).
async fn refusal(app: &App, response: reqwest::Response) -> Result<Response, ProxyError> {
    let status = response.status();
    if status.is_server_error() {
        app.metrics.upstream_error("status_5xx");
    }
    let mut headers = end_to_end(response.headers());
    let body = read_whole(app, &mut response.bytes_stream().boxed(), None).await?;
    super::policy::drop_cors(&mut headers);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    let mut answer = Response::new(Body::from(body));
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    Ok(answer)
}

/// The `model` of a handshake's query (`?model=gpt-realtime`), as the
/// records name it.
fn model_in_query(uri: &axum::http::Uri) -> Option<String> {
    let query = uri.query()?;
    let model = query.split('&').find_map(|pair| pair.strip_prefix("model="))?;
    (!model.is_empty()).then(|| super::clipped(model, 256))
}

/// A session between its `101` and its end: what it holds while it runs.
struct Session {
    app: Arc<App>,
    id: u64,
    path: String,
    /// The model the handshake names, for the records.
    model: Option<String>,
    /// The session's span (with the `otel` feature and an endpoint).
    trace: Option<Trace>,
    /// The in-flight permit and the requests gauge.
    _held: Held,
    /// The client connection's slot under the listener's cap.
    _slot: Option<Arc<ConnectionSlot>>,
}

impl Session {
    /// Phases 4 and 5: waits for hyper to hand over the client's
    /// connection, relays, ends, counts and logs.
    async fn run(mut self, on_upgrade: OnUpgrade, mut upstream: UpstreamWs) {
        let trace = self.trace.take();
        let (app, id, path) = (&self.app, self.id, &self.path);
        let ended = |how: &'static str, trace: Option<Trace>| {
            app.metrics.websocket_end(how);
            if let Some(t) = trace {
                t.end(StatusCode::SWITCHING_PROTOCOLS.as_u16(), how, None);
            }
        };
        let upgraded = tokio::select! {
            upgraded = on_upgrade => upgraded,
            () = app.hard_stop.cancelled() => {
                let _ = tokio::time::timeout(CLOSE_WAIT, upstream.close(Some(going_away("proxy shutting down")))).await;
                ended("shutdown", trace);
                return;
            }
        };
        let upgraded = match upgraded {
            Ok(upgraded) => upgraded,
            Err(e) => {
                tracing::info!(id, path = %path, "the client's connection was not upgraded: {e}");
                let _ = tokio::time::timeout(CLOSE_WAIT, upstream.close(Some(going_away("client went away")))).await;
                ended("client_lost", trace);
                return;
            }
        };
        let config = socket_config(app.config.max_ws_message);
        let client = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
        let _open = app.metrics.websocket_open();
        let started = Instant::now();
        tracing::info!(id, path = %path, "websocket session open");
        let counts = [AtomicU64::new(0), AtomicU64::new(0)];
        let mut tap = Tap::new(path, self.model.clone(), trace);
        let end = relay(client, upstream, app, &counts, &mut tap).await;
        let trace = tap.finish(app).await;
        ended(end.label(), trace);
        tracing::info!(
            id,
            path = %path,
            secs = started.elapsed().as_secs_f64(),
            from_client = counts[0].load(Ordering::Relaxed),
            from_upstream = counts[1].load(Ordering::Relaxed),
            "websocket session ended: {end}"
        );
    }
}

/// How a session ended: as the first of its two directions to end did.
#[derive(Debug)]
enum End {
    /// A close frame from this side went through to the other.
    Closed(Peer),
    /// The grace period of a shutdown ran out.
    Shutdown,
    /// It failed.
    Failed(RelayError),
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
enum RelayError {
    /// A message (or frame) larger than the limit.
    #[error("the {from} sent a message of more than {limit} bytes")]
    TooBig {
        /// Who sent it.
        from: Peer,
        /// The limit in bytes.
        limit: usize,
    },
    /// A side broke the WebSocket protocol (a bad frame, text that is not
    /// UTF-8, an unmasked client frame).
    #[error("the {peer} broke the WebSocket protocol: {cause}")]
    Protocol {
        /// The side at fault.
        peer: Peer,
        /// What it did.
        cause: String,
    },
    /// A side's connection ended without a close frame, or failed.
    #[error("the {peer}'s connection was lost: {cause}")]
    Lost {
        /// The side lost.
        peer: Peer,
        /// How.
        cause: String,
    },
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Closed(peer) => write!(f, "the {peer} closed it"),
            End::Shutdown => f.write_str("the proxy is shutting down"),
            End::Failed(err) => write!(f, "{err}"),
        }
    }
}

impl End {
    /// The `reason` label of the sessions-ended metric.
    fn label(&self) -> &'static str {
        match self {
            End::Closed(_) => "closed",
            End::Shutdown => "shutdown",
            End::Failed(RelayError::TooBig { .. }) => "too_big",
            End::Failed(RelayError::Protocol { peer: Peer::Client, .. }) => "client_protocol",
            End::Failed(RelayError::Protocol { peer: Peer::Upstream, .. }) => "upstream_protocol",
            End::Failed(RelayError::Lost { peer: Peer::Client, .. }) => "client_lost",
            End::Failed(RelayError::Lost { peer: Peer::Upstream, .. }) => "upstream_lost",
        }
    }

    /// Whether the client's and the upstream's connections may hold bytes
    /// the proxy will never read as frames (the rest of a message too big,
    /// what follows a broken frame): those are read and dropped before the
    /// TCP close, lest the close reset the connection and lose the close
    /// frame sent just before.
    fn unread(&self) -> (bool, bool) {
        match self {
            End::Failed(RelayError::TooBig { from, .. } | RelayError::Protocol { peer: from, .. }) => {
                (*from == Peer::Client, *from == Peer::Upstream)
            }
            End::Closed(_) | End::Shutdown | End::Failed(RelayError::Lost { .. }) => (false, false),
        }
    }

    /// The close frames the proxy sends the client and the upstream:
    /// none after a close frame went through (each side is closing
    /// already); else what the module's phase 5 says.
    fn close_frames(&self) -> (Option<CloseFrame>, Option<CloseFrame>) {
        let lost = |peer: Peer| match peer {
            // The upstream is told its client went away; the client that
            // its gateway lost the upstream.
            Peer::Client => (None, Some(going_away("client went away"))),
            Peer::Upstream => (Some(frame(CloseCode::from(1014), "upstream connection lost")), None),
        };
        match self {
            End::Closed(_) => (None, None),
            End::Shutdown => (Some(going_away("proxy shutting down")), Some(going_away("proxy shutting down"))),
            End::Failed(RelayError::TooBig { limit, .. }) => {
                let reason = format!("message larger than {limit} bytes");
                (Some(frame(CloseCode::Size, &reason)), Some(frame(CloseCode::Size, &reason)))
            }
            End::Failed(RelayError::Protocol { peer, .. }) => {
                let (to_client, to_upstream) = lost(*peer);
                let broken = Some(frame(CloseCode::Protocol, "protocol error"));
                match peer {
                    Peer::Client => (broken, to_upstream),
                    Peer::Upstream => (to_client, broken),
                }
            }
            End::Failed(RelayError::Lost { peer, .. }) => lost(*peer),
        }
    }
}

/// A close frame.
fn frame(code: CloseCode, reason: &str) -> CloseFrame {
    CloseFrame { code, reason: reason.into() }
}

/// `1001`, going away.
fn going_away(reason: &str) -> CloseFrame {
    frame(CloseCode::Away, reason)
}

/// Phases 4 and 5: relays both ways until one direction ends, then closes
/// both sides (at most [`CLOSE_WAIT`]). `counts` gets the messages from
/// the client and from the upstream; `tap` reads the upstream's.
async fn relay(client: ClientWs, upstream: UpstreamWs, app: &App, counts: &[AtomicU64; 2], tap: &mut Tap) -> End {
    let (mut client_tx, mut client_rx) = client.split();
    let (mut upstream_tx, mut upstream_rx) = upstream.split();
    let end = {
        let up = Pump { from: Peer::Client, app, count: &counts[0], tap: None };
        let down = Pump { from: Peer::Upstream, app, count: &counts[1], tap: Some(tap) };
        let up = up.run(&mut client_rx, &mut upstream_tx);
        let down = down.run(&mut upstream_rx, &mut client_tx);
        tokio::pin!(up, down);
        tokio::select! {
            end = &mut up => end,
            end = &mut down => end,
        }
    };
    let (to_client, to_upstream) = end.close_frames();
    let (client_unread, upstream_unread) = end.unread();
    let _ = tokio::time::timeout(CLOSE_WAIT, async {
        tokio::join!(
            finish(client_tx, client_rx, to_client, client_unread),
            finish(upstream_tx, upstream_rx, to_upstream, upstream_unread)
        );
    })
    .await;
    end
}

/// One direction of a session.
struct Pump<'a> {
    from: Peer,
    app: &'a App,
    count: &'a AtomicU64,
    /// Reads the text messages after they went on (the upstream's).
    tap: Option<&'a mut Tap>,
}

impl Pump<'_> {
    /// Relays `source` to `sink`, a message at a time, until a close frame
    /// went through, a side failed, or the hard stop.
    ///
    /// # Cancel safety
    ///
    /// Dropping it between messages loses nothing; during a write, the
    /// message stays queued in `sink`'s socket (written before anything
    /// sent later).
    async fn run<R, W>(mut self, source: &mut R, sink: &mut W) -> End
    where
        R: Stream<Item = Result<Message, WsError>> + Unpin,
        W: Sink<Message, Error = WsError> + Unpin,
    {
        let from = self.from;
        let stop: &CancellationToken = &self.app.hard_stop;
        let to = match from {
            Peer::Client => Peer::Upstream,
            Peer::Upstream => Peer::Client,
        };
        loop {
            let next = tokio::select! {
                biased;
                () = stop.cancelled() => return End::Shutdown,
                next = source.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(e)) => return End::Failed(self.read_error(e)),
                None => {
                    let cause = "the connection ended without a close frame".to_string();
                    return End::Failed(RelayError::Lost { peer: from, cause });
                }
            };
            let closing = matches!(message, Message::Close(_));
            self.app.metrics.websocket_message(from.direction(), message.len());
            self.count.fetch_add(1, Ordering::Relaxed);
            // A text message's bytes are shared, not copied.
            let text = match (&self.tap, &message) {
                (Some(_), Message::Text(text)) => Some(text.clone()),
                _ => None,
            };
            let sent = tokio::select! {
                biased;
                () = stop.cancelled() => return End::Shutdown,
                sent = sink.send(message) => sent,
            };
            match sent {
                // The close went through, or the other side had closed
                // already: the session ends either way.
                _ if closing => return End::Closed(from),
                Ok(()) => {}
                Err(e) => return End::Failed(RelayError::Lost { peer: to, cause: e.to_string() }),
            }
            if let (Some(tap), Some(text)) = (self.tap.as_deref_mut(), text) {
                tap.observe(self.app, text.as_str()).await;
            }
        }
    }

    /// What a read error of this direction's source means.
    fn read_error(&self, e: WsError) -> RelayError {
        match e {
            WsError::Capacity(_) => RelayError::TooBig { from: self.from, limit: self.app.config.max_ws_message },
            WsError::Protocol(_) | WsError::Utf8(_) => RelayError::Protocol { peer: self.from, cause: e.to_string() },
            e => RelayError::Lost { peer: self.from, cause: e.to_string() },
        }
    }
}

/// The server events of a Realtime response that are read on the side;
/// others (audio, input, session events) are not parsed at all.
const READ: [&str; 9] = [
    "response.output_text.delta",
    "response.text.delta",
    "response.output_audio_transcript.delta",
    "response.audio_transcript.delta",
    "response.refusal.delta",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.done",
];

/// Parsing on the side of a session (see the module's documentation): a
/// stream per Realtime response, from its first event read to its
/// `response.done`.
struct Tap {
    path: String,
    model: Option<String>,
    /// The response being read, and its stream id.
    current: Option<(u64, ChatStream)>,
    /// Bytes of the upstream's text messages so far (diagnostics' offsets).
    offset: usize,
    events: Vec<SourceEvent>,
    /// The session's span, which sees the events of all its responses.
    trace: Option<Trace>,
}

/// The `type` of a server event, read without the rest.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "type", borrow)]
    kind: Option<&'a str>,
}

impl Tap {
    fn new(path: &str, model: Option<String>, trace: Option<Trace>) -> Tap {
        Tap { path: path.to_string(), model, current: None, offset: 0, events: Vec::new(), trace }
    }

    /// Reads one text message of the upstream (already relayed), and
    /// hands what it parsed on.
    async fn observe(&mut self, app: &App, text: &str) {
        let at = self.offset;
        self.offset += text.len();
        let kind = match serde_json::from_str::<Kind<'_>>(text) {
            Ok(Kind { kind: Some(kind) }) if READ.contains(&kind) => kind,
            _ => return,
        };
        let (id, stream) = self.current.get_or_insert_with(|| {
            let id = app.next_id.fetch_add(1, Ordering::Relaxed);
            if let Some(i) = &app.inspector {
                i.start(id, self.model.as_deref(), &self.path, 101, Instant::now());
            }
            let mut options = app.config.options.clone();
            options.parser.rewrite = false;
            (id, ChatStream::new(options))
        });
        let id = *id;
        stream.push_data_events("message", text, at, &mut self.events);
        let done = kind == "response.done";
        if done && let Some((_, stream)) = self.current.take() {
            stream.finish_into(&mut self.events);
        }
        self.dispatch(app, id).await;
        if done && let Some(i) = &app.inspector {
            i.end(id, "ok");
        }
    }

    /// Ends the response still being read when the session ended: it was
    /// cut off. Hands back the session's span, to end.
    async fn finish(mut self, app: &App) -> Option<Trace> {
        if let Some((id, stream)) = self.current.take() {
            stream.finish_into(&mut self.events);
            self.dispatch(app, id).await;
            if let Some(i) = &app.inspector {
                i.end(id, "session_ended");
            }
        }
        self.trace
    }

    /// Metrics, sinks and the inspector for the events of response `id`.
    async fn dispatch(&mut self, app: &App, id: u64) {
        if self.events.is_empty() {
            return;
        }
        let stream = SinkStream { id, path: &self.path, model: self.model.as_deref() };
        let mut truncated = false;
        dispatch_events(app, &stream, self.trace.as_mut(), &mut self.events, &mut truncated).await;
        if truncated {
            app.metrics.truncated();
        }
    }
}

/// Ends one side: sends it `close` (when the proxy has one for it),
/// flushes what its socket still owes (the reply to its own close frame),
/// reads (and drops) its frames until its close handshake is done, then
/// shuts the TCP connection's write side. With `unread`, it then reads
/// and drops raw bytes until the peer closes too, so that the close does
/// not reset the connection (which may lose the last frames sent).
///
/// # Cancel safety
///
/// Meant to be cut by a timeout: dropping it drops the connection.
async fn finish<S>(
    mut tx: futures::stream::SplitSink<WebSocketStream<S>, Message>,
    mut rx: futures::stream::SplitStream<WebSocketStream<S>>,
    close: Option<CloseFrame>,
    unread: bool,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if let Some(close) = close {
        let _ = tx.send(Message::Close(Some(close))).await;
    }
    let _ = tx.close().await;
    while let Some(Ok(_)) = rx.next().await {}
    let Ok(mut ws) = rx.reunite(tx) else { return };
    let io = ws.get_mut();
    let _ = io.shutdown().await;
    if unread {
        let mut scratch = [0u8; 8192];
        while let Ok(n) = io.read(&mut scratch).await {
            if n == 0 {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn an_upgrade_is_a_get_naming_websocket_and_upgrade() {
        let ws = headers(&[("connection", "keep-alive, Upgrade"), ("upgrade", "WebSocket")]);
        assert!(asks_upgrade(&Method::GET, &ws));
        assert!(!asks_upgrade(&Method::POST, &ws));
        assert!(!asks_upgrade(&Method::GET, &headers(&[("upgrade", "websocket")])));
        assert!(!asks_upgrade(&Method::GET, &headers(&[("connection", "upgrade"), ("upgrade", "h2c")])));
        assert!(!asks_upgrade(&Method::GET, &headers(&[("connection", "upgraded"), ("upgrade", "websocket")])));
    }

    #[test]
    fn the_upstream_answer_is_verified() {
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let accept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
        let offered = vec!["realtime".to_string(), "openai-beta.realtime-v1".to_string()];
        let mut good = headers(&[("upgrade", "websocket"), ("connection", "Upgrade")]);
        good.insert(header::SEC_WEBSOCKET_ACCEPT, HeaderValue::from_static(accept));
        assert_eq!(verify(&good, key, &offered).ok(), Some(None));
        let mut chosen = good.clone();
        chosen.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("realtime"));
        assert_eq!(verify(&chosen, key, &offered).ok(), Some(Some(HeaderValue::from_static("realtime"))));
        let code = |h: &HeaderMap| verify(h, key, &offered).err().map(|e| e.code());
        let mut other = good.clone();
        other.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static("chat"));
        assert_eq!(code(&other), Some("upstream_invalid_response"));
        let mut wrong = good.clone();
        wrong.insert(header::SEC_WEBSOCKET_ACCEPT, HeaderValue::from_static("nope"));
        assert_eq!(code(&wrong), Some("upstream_invalid_response"));
        let mut deflate = good.clone();
        deflate.insert(header::SEC_WEBSOCKET_EXTENSIONS, HeaderValue::from_static("permessage-deflate"));
        assert_eq!(code(&deflate), Some("upstream_invalid_response"));
    }

    #[test]
    fn every_end_closes_both_sides_as_documented() {
        let code = |f: &Option<CloseFrame>| f.as_ref().map(|f| u16::from(f.code));
        let lost = |peer| End::Failed(RelayError::Lost { peer, cause: String::new() });
        let broke = |peer| End::Failed(RelayError::Protocol { peer, cause: String::new() });
        let cases = [
            (End::Closed(Peer::Client), None, None, "closed"),
            (End::Shutdown, Some(1001), Some(1001), "shutdown"),
            (End::Failed(RelayError::TooBig { from: Peer::Upstream, limit: 1 }), Some(1009), Some(1009), "too_big"),
            (lost(Peer::Client), None, Some(1001), "client_lost"),
            (lost(Peer::Upstream), Some(1014), None, "upstream_lost"),
            (broke(Peer::Client), Some(1002), Some(1001), "client_protocol"),
            (broke(Peer::Upstream), Some(1014), Some(1002), "upstream_protocol"),
        ];
        for (end, client, upstream, label) in cases {
            let (to_client, to_upstream) = end.close_frames();
            assert_eq!((code(&to_client), code(&to_upstream), end.label()), (client, upstream, label), "{end}");
        }
        assert_eq!(End::Failed(RelayError::TooBig { from: Peer::Client, limit: 1 }).unread(), (true, false));
        assert_eq!(broke(Peer::Upstream).unread(), (false, true));
        assert_eq!(lost(Peer::Upstream).unread(), (false, false));
    }
}
