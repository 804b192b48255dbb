//! The proxy's errors: what failed, on which side, whether a retry may
//! help, and how the client is told (an HTTP status with an OpenAI-style
//! JSON body before the response started, an in-band SSE error event
//! after).
//!
//! This module owns the error vocabulary only; deciding when an error
//! happened is the relay's and the server's.

use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::time::Duration;

/// Which side of the proxy failed (pingora's `ErrorSource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Side {
    /// The upstream server, or the network to it.
    Upstream,
    /// The client: a request the proxy cannot forward, or a client that
    /// went away.
    Downstream,
    /// The proxy itself (limits, shutdown).
    Internal,
}

impl Side {
    /// `upstream`, `downstream` or `internal`.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Upstream => "upstream",
            Side::Downstream => "downstream",
            Side::Internal => "internal",
        }
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyErrorKind {
    /// The upstream could not be connected to (refused, DNS, TLS).
    Connect,
    /// Connecting to the upstream took longer than the connect timeout.
    ConnectTimeout,
    /// No response headers, or no first body byte, within the idle timeout.
    Timeout,
    /// The upstream went silent mid-body for longer than the idle timeout.
    Stalled,
    /// The connection to the upstream broke (reset, an incomplete body).
    Reset,
    /// The upstream answered with something that is not HTTP.
    InvalidResponse,
    /// A chat-completion stream ended cleanly without `data: [DONE]`.
    Truncated,
    /// The request path is not proxied (only an API's paths, `/v1/*`,
    /// `/v1beta/*`, ..., and Ollama's `/api/*`, are).
    NotFound,
    /// The request body is larger than the limit (or decompresses to more).
    RequestTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// Reading the request body from the client failed (or it did not
    /// decompress).
    RequestBody,
    /// A request body in a `Content-Encoding` the proxy must read through
    /// but cannot decode (a tool-calling chat request in `br`, say).
    UnsupportedEncoding,
    /// More streams are in flight than the limit allows.
    Overloaded {
        /// The limit.
        limit: usize,
    },
    /// The proxy is shutting down.
    ShuttingDown,
    /// An SSE line or event of the upstream is larger than the proxy's
    /// limit, so a rewriting proxy could not forward it.
    LineTooLong {
        /// The limit in bytes.
        limit: usize,
    },
    /// A chat request's `tools` or `tool_choice` that a tool-calling proxy
    /// cannot render (not a function tool, a schema that does not
    /// compile, a name given twice, a choice naming no tool of the list).
    InvalidTools {
        /// The request field at fault (`tools`, `tool_choice`).
        param: &'static str,
    },
    /// The agent loop (`--agent`) could not get an answer from the
    /// upstream before anything was sent to the client.
    Agent,
    /// The request's `Host` is not a name the listener answers to (a
    /// loopback listener answers to loopback names and `--allowed-host`
    /// ones only: DNS rebinding).
    HostNotAllowed,
    /// The request comes from a browser page of an origin the proxy does
    /// not serve (`--allow-origin`).
    OriginNotAllowed,
    /// The client went silent while sending a request body the proxy
    /// buffers, for longer than the request timeout.
    RequestTimeout,
    /// The request bodies the proxy buffers at once already fill its
    /// request buffer.
    BufferFull {
        /// The buffer's size in bytes.
        limit: usize,
    },
    /// A request that asks for a WebSocket upgrade but is not a valid
    /// handshake (no `Sec-WebSocket-Key`, a version other than 13, a
    /// connection that cannot be upgraded).
    WebSocketHandshake,
}

/// A proxy error: kind, side, retryability and a message.
///
/// ```
/// use spindle::proxy::{ProxyError, ProxyErrorKind, Side};
///
/// let err = ProxyError::new(ProxyErrorKind::Connect, "connection refused");
/// assert_eq!(err.side(), Side::Upstream);
/// assert_eq!(err.status(), 502);
/// assert!(err.is_retryable());
/// assert_eq!(err.to_json()["error"]["code"], "upstream_connect_failed");
/// ```
#[derive(Debug, Clone)]
pub struct ProxyError {
    kind: ProxyErrorKind,
    message: String,
}

impl ProxyError {
    /// An error of `kind` with a message for the client and the log.
    pub fn new(kind: ProxyErrorKind, message: impl Into<String>) -> ProxyError {
        ProxyError { kind, message: message.into() }
    }

    /// The idle timeout ran out waiting for the upstream.
    pub(crate) fn idle(kind: ProxyErrorKind, idle: Duration, what: &str) -> ProxyError {
        ProxyError::new(kind, format!("no {what} from the upstream for {:.1} s (idle timeout)", idle.as_secs_f64()))
    }

    /// What went wrong.
    pub fn kind(&self) -> &ProxyErrorKind {
        &self.kind
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Which side failed.
    pub fn side(&self) -> Side {
        match self.kind {
            ProxyErrorKind::Connect
            | ProxyErrorKind::ConnectTimeout
            | ProxyErrorKind::Timeout
            | ProxyErrorKind::Stalled
            | ProxyErrorKind::Reset
            | ProxyErrorKind::InvalidResponse
            | ProxyErrorKind::Truncated
            | ProxyErrorKind::Agent => Side::Upstream,
            ProxyErrorKind::NotFound
            | ProxyErrorKind::RequestTooLarge { .. }
            | ProxyErrorKind::RequestBody
            | ProxyErrorKind::UnsupportedEncoding
            | ProxyErrorKind::InvalidTools { .. }
            | ProxyErrorKind::HostNotAllowed
            | ProxyErrorKind::OriginNotAllowed
            | ProxyErrorKind::RequestTimeout
            | ProxyErrorKind::WebSocketHandshake => Side::Downstream,
            ProxyErrorKind::Overloaded { .. }
            | ProxyErrorKind::BufferFull { .. }
            | ProxyErrorKind::ShuttingDown
            | ProxyErrorKind::LineTooLong { .. } => Side::Internal,
        }
    }

    /// Whether sending the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self.kind {
            ProxyErrorKind::Connect
            | ProxyErrorKind::ConnectTimeout
            | ProxyErrorKind::Timeout
            | ProxyErrorKind::Stalled
            | ProxyErrorKind::Reset
            | ProxyErrorKind::Truncated
            | ProxyErrorKind::Overloaded { .. }
            | ProxyErrorKind::BufferFull { .. }
            | ProxyErrorKind::RequestTimeout
            | ProxyErrorKind::ShuttingDown => true,
            ProxyErrorKind::InvalidResponse
            | ProxyErrorKind::Agent
            | ProxyErrorKind::NotFound
            | ProxyErrorKind::RequestTooLarge { .. }
            | ProxyErrorKind::RequestBody
            | ProxyErrorKind::UnsupportedEncoding
            | ProxyErrorKind::InvalidTools { .. }
            | ProxyErrorKind::HostNotAllowed
            | ProxyErrorKind::OriginNotAllowed
            | ProxyErrorKind::WebSocketHandshake
            | ProxyErrorKind::LineTooLong { .. } => false,
        }
    }

    /// The HTTP status the client gets when nothing was sent yet: 502 for
    /// a broken upstream, 504 for a timeout, 503 when overloaded or
    /// shutting down, 404/413/415/400 for requests the proxy does not
    /// forward (400 also for a broken WebSocket handshake), 403 for a host
    /// or browser origin it does not serve, 408 for a client too slow to
    /// send its body.
    pub fn status(&self) -> u16 {
        match self.kind {
            ProxyErrorKind::Connect
            | ProxyErrorKind::Reset
            | ProxyErrorKind::InvalidResponse
            | ProxyErrorKind::Truncated
            | ProxyErrorKind::Agent
            | ProxyErrorKind::LineTooLong { .. } => 502,
            ProxyErrorKind::ConnectTimeout | ProxyErrorKind::Timeout | ProxyErrorKind::Stalled => 504,
            ProxyErrorKind::NotFound => 404,
            ProxyErrorKind::RequestTooLarge { .. } => 413,
            ProxyErrorKind::UnsupportedEncoding => 415,
            ProxyErrorKind::RequestBody | ProxyErrorKind::InvalidTools { .. } | ProxyErrorKind::WebSocketHandshake => {
                400
            }
            ProxyErrorKind::HostNotAllowed | ProxyErrorKind::OriginNotAllowed => 403,
            ProxyErrorKind::RequestTimeout => 408,
            ProxyErrorKind::Overloaded { .. } | ProxyErrorKind::BufferFull { .. } | ProxyErrorKind::ShuttingDown => 503,
        }
    }

    /// A stable machine-readable code (the JSON `error.code`, and the
    /// `kind` label of the upstream-error metric).
    pub fn code(&self) -> &'static str {
        match self.kind {
            ProxyErrorKind::Connect => "upstream_connect_failed",
            ProxyErrorKind::ConnectTimeout => "upstream_connect_timeout",
            ProxyErrorKind::Timeout => "upstream_timeout",
            ProxyErrorKind::Stalled => "upstream_stalled",
            ProxyErrorKind::Reset => "upstream_reset",
            ProxyErrorKind::InvalidResponse => "upstream_invalid_response",
            ProxyErrorKind::Truncated => "upstream_truncated",
            ProxyErrorKind::NotFound => "not_found",
            ProxyErrorKind::RequestTooLarge { .. } => "request_too_large",
            ProxyErrorKind::RequestBody => "request_body_error",
            ProxyErrorKind::UnsupportedEncoding => "unsupported_request_encoding",
            ProxyErrorKind::Overloaded { .. } => "proxy_overloaded",
            ProxyErrorKind::ShuttingDown => "proxy_shutting_down",
            ProxyErrorKind::LineTooLong { .. } => "proxy_line_too_long",
            ProxyErrorKind::InvalidTools { .. } => "invalid_tools",
            ProxyErrorKind::Agent => "agent_upstream_failed",
            ProxyErrorKind::HostNotAllowed => "host_not_allowed",
            ProxyErrorKind::OriginNotAllowed => "origin_not_allowed",
            ProxyErrorKind::RequestTimeout => "request_timeout",
            ProxyErrorKind::BufferFull { .. } => "proxy_request_buffer_full",
            ProxyErrorKind::WebSocketHandshake => "websocket_handshake_invalid",
        }
    }

    /// The OpenAI-style `type` of the error.
    fn error_type(&self) -> &'static str {
        match self.side() {
            Side::Upstream => "upstream_error",
            Side::Downstream => "invalid_request_error",
            Side::Internal => "proxy_error",
        }
    }

    /// The error as an OpenAI-style body:
    /// `{"error":{"message","type","param","code","side","retryable"}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.error_type(),
                "param": match self.kind {
                    ProxyErrorKind::InvalidTools { param } => Value::String(param.into()),
                    _ => Value::Null,
                },
                "code": self.code(),
                "side": self.side().as_str(),
                "retryable": self.is_retryable(),
            }
        })
    }

    /// The error as one SSE event (`data: {"error":{...}}` and a blank
    /// line), the in-band form OpenAI clients raise on.
    pub fn to_sse_event(&self) -> String {
        format!("data: {}\n\n", self.to_json())
    }
}

/// The response for an error before anything was sent: its status, the
/// JSON body of [`ProxyError::to_json`], `X-Spindle-Error-Side`, and
/// `Retry-After: 1` on a 503.
pub(crate) fn error_response(err: &ProxyError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = (status, axum::Json(err.to_json())).into_response();
    if let Ok(side) = HeaderValue::from_str(err.side().as_str()) {
        response.headers_mut().insert(HeaderName::from_static("x-spindle-error-side"), side);
    }
    if err.status() == 503 {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// An error and its causes, `: `-separated: one rendering for the client
/// and the proxy.
pub(crate) use crate::sources::error_chain as chain;

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} error ({}): {}", self.side().as_str(), self.code(), self.message)
    }
}

impl std::error::Error for ProxyError {}

/// `message` (the text of `err`) with the query of the URL it names
/// masked: a client's query may carry its key (Gemini's `?key=`), which
/// then went into logs.
fn without_query(message: String, err: &reqwest::Error) -> String {
    match err.url() {
        Some(url) if url.query().is_some() => {
            message.replace(url.as_str(), &crate::proxy::sink::nats::mask_query(url.as_str()))
        }
        _ => message,
    }
}

/// Reads a `reqwest` error from sending a request into a proxy error.
pub(crate) fn from_send_error(err: &reqwest::Error) -> ProxyError {
    let message = without_query(chain(err), err);
    if err.is_connect() && err.is_timeout() {
        ProxyError::new(ProxyErrorKind::ConnectTimeout, message)
    } else if err.is_connect() {
        ProxyError::new(ProxyErrorKind::Connect, message)
    } else if err.is_timeout() {
        ProxyError::new(ProxyErrorKind::Timeout, message)
    } else if err.is_request() && !err.is_body() {
        // hyper rejected what the upstream sent (not HTTP, bad headers) or
        // the connection closed before a response.
        let lower = message.to_ascii_lowercase();
        if lower.contains("parse") || lower.contains("invalid") {
            ProxyError::new(ProxyErrorKind::InvalidResponse, message)
        } else {
            ProxyError::new(ProxyErrorKind::Reset, message)
        }
    } else {
        ProxyError::new(ProxyErrorKind::Reset, message)
    }
}

/// Reads a `reqwest` error from reading a body into a proxy error.
pub(crate) fn from_body_error(err: &reqwest::Error) -> ProxyError {
    let message = without_query(chain(err), err);
    if err.is_timeout() {
        ProxyError::new(ProxyErrorKind::Stalled, message)
    } else {
        ProxyError::new(ProxyErrorKind::Reset, format!("reading the upstream body failed: {message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_in_the_query_stays_out_of_the_message() {
        let url = "http://127.0.0.1:1/v1beta/models/m:streamGenerateContent?alt=sse&key=SECRET";
        let Err(err) = reqwest::Client::new().get(url).send().await else { panic!("port 1 answered") };
        let message = from_send_error(&err).message().to_string();
        assert!(!message.contains("SECRET") && message.contains("127.0.0.1:1/v1beta/models/m"), "{message}");
    }

    #[test]
    fn every_kind_has_status_side_and_code() {
        let table = [
            (ProxyErrorKind::Connect, 502, Side::Upstream, true),
            (ProxyErrorKind::ConnectTimeout, 504, Side::Upstream, true),
            (ProxyErrorKind::Timeout, 504, Side::Upstream, true),
            (ProxyErrorKind::Stalled, 504, Side::Upstream, true),
            (ProxyErrorKind::Reset, 502, Side::Upstream, true),
            (ProxyErrorKind::InvalidResponse, 502, Side::Upstream, false),
            (ProxyErrorKind::Truncated, 502, Side::Upstream, true),
            (ProxyErrorKind::NotFound, 404, Side::Downstream, false),
            (ProxyErrorKind::RequestTooLarge { limit: 1 }, 413, Side::Downstream, false),
            (ProxyErrorKind::RequestBody, 400, Side::Downstream, false),
            (ProxyErrorKind::UnsupportedEncoding, 415, Side::Downstream, false),
            (ProxyErrorKind::Overloaded { limit: 1 }, 503, Side::Internal, true),
            (ProxyErrorKind::ShuttingDown, 503, Side::Internal, true),
            (ProxyErrorKind::LineTooLong { limit: 1 }, 502, Side::Internal, false),
            (ProxyErrorKind::HostNotAllowed, 403, Side::Downstream, false),
            (ProxyErrorKind::OriginNotAllowed, 403, Side::Downstream, false),
            (ProxyErrorKind::RequestTimeout, 408, Side::Downstream, true),
            (ProxyErrorKind::BufferFull { limit: 1 }, 503, Side::Internal, true),
            (ProxyErrorKind::WebSocketHandshake, 400, Side::Downstream, false),
        ];
        let mut codes = std::collections::HashSet::new();
        for (kind, status, side, retry) in table {
            let err = ProxyError::new(kind.clone(), "m");
            assert_eq!((err.status(), err.side(), err.is_retryable()), (status, side, retry), "{kind:?}");
            assert!(codes.insert(err.code()), "duplicate code {}", err.code());
            let body = err.to_json();
            assert_eq!(body["error"]["message"], "m");
            assert_eq!(body["error"]["side"], side.as_str());
            let event = err.to_sse_event();
            assert!(event.starts_with("data: {\"error\":") && event.ends_with("}\n\n"), "{event}");
        }
    }
}
