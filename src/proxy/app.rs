//! The state every request of one proxy shares: its configuration, the
//! upstream clients, metrics, sinks, limits, shutdown tokens, the running
//! WebSocket sessions, traces and the inspector.
//!
//! This module owns that state, the upstream URL of a request, and which
//! of its headers go upstream (the end-to-end ones, and the configured
//! key). It sits below the server (which builds it and routes requests),
//! the pump (which streams responses with it) and the WebSocket relay, so
//! that none imports another.

use super::ProxyConfig;
use super::metrics::Metrics;
use super::sink::Sinks;
use super::trace::Telemetry;
use axum::http::{HeaderMap, HeaderValue, Uri, header};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// State shared by all requests of one proxy.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) config: ProxyConfig,
    pub(crate) origin: String,
    pub(crate) base_path: String,
    pub(crate) http: reqwest::Client,
    /// The client of WebSocket handshakes: HTTP/1.1 only (an upgrade has
    /// no HTTP/2 form that reqwest speaks), same timeouts and TLS.
    pub(crate) ws_http: reqwest::Client,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sinks: Sinks,
    pub(crate) limit: Arc<Semaphore>,
    /// Room for the request bodies buffered at once.
    pub(crate) request_buffer: RequestBuffer,
    pub(crate) next_id: AtomicU64,
    /// Shutdown asked: refuse new requests, let running ones finish.
    pub(crate) stopping: CancellationToken,
    /// The grace period is over: cut running streams (with an error event)
    /// and WebSocket sessions (close `1001`).
    pub(crate) hard_stop: CancellationToken,
    /// The WebSocket sessions running (their connections left the
    /// listener's hands at the upgrade): waited for at shutdown.
    pub(crate) sessions: TaskTracker,
    /// Request traces, when on.
    pub(crate) telemetry: Option<Telemetry>,
    /// The inspector page's state, when on.
    pub(crate) inspector: Option<Arc<super::inspect::Inspector>>,
    /// The registries requests' `<use_protocol>` declarations built.
    pub(crate) registries: super::protocols::Registries,
}

impl App {
    /// The upstream URL for a request URI: the upstream's origin and path
    /// prefix, then the request path, then the query as it came. A prefix
    /// that names an API version (`/v1`, `/api/paas/v4`, `/v1beta/openai`:
    /// see [`names_version`]) is the API's base, as an OpenAI SDK's
    /// `base_url` is: it takes the place of the request's `/v1`.
    pub(crate) fn target(&self, uri: &Uri) -> String {
        let path = uri.path();
        let path = match path.strip_prefix("/v1") {
            Some(rest) if names_version(&self.base_path) && (rest.is_empty() || rest.starts_with('/')) => rest,
            _ => path,
        };
        let mut url = format!("{}{}{}", self.origin, self.base_path, path);
        if let Some(q) = uri.query() {
            url.push('?');
            url.push_str(q);
        }
        url
    }

    /// Adds the configured upstream key as `Authorization: Bearer KEY`
    /// (marked sensitive) when `headers` have no `Authorization`.
    pub(crate) fn add_upstream_key(&self, headers: &mut HeaderMap) {
        if let Some(key) = &self.config.upstream_api_key
            && !headers.contains_key(header::AUTHORIZATION)
            && let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
        {
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
    }
}

/// Headers that belong to one connection, never forwarded (RFC 9110
/// §7.6.1), plus `host` (the upstream's is set from its URL).
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Copies `headers` without the hop-by-hop ones (and those the
/// `Connection` header names).
pub(crate) fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || named.iter().any(|c| c == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// The bytes of request bodies the proxy buffers at once, across requests
/// ([`ProxyConfig::max_request_buffer`]): a body takes room as its bytes
/// arrive and gives it back when it is dropped.
#[derive(Debug)]
pub(crate) struct RequestBuffer {
    room: Arc<Semaphore>,
    size: usize,
}

impl RequestBuffer {
    /// A buffer of `size` bytes.
    pub(crate) fn new(size: usize) -> RequestBuffer {
        let size = size.min(Semaphore::MAX_PERMITS);
        RequestBuffer { room: Arc::new(Semaphore::new(size)), size }
    }

    /// Room for `n` more bytes, held until the share drops; `None` when
    /// the buffer has not that much room left.
    pub(crate) fn take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        let n = u32::try_from(n).ok()?;
        self.room.clone().try_acquire_many_owned(n).ok()
    }

    /// The bytes held now.
    pub(crate) fn held(&self) -> usize {
        self.size.saturating_sub(self.room.available_permits())
    }

    /// The buffer's size in bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

/// Whether a URL path (or one segment) names an API version: a segment of
/// `v` and a digit (`v1`, `v4`, `v1beta`). Providers put the version where they like
/// (`/v1`, `/api/v3`, `/api/paas/v4`, `/compatible-mode/v1`,
/// `/v1beta/openai`); a path without one (`/api`, `/proxy`) is a plain
/// prefix, and the request's `/v1` follows it.
pub(crate) fn names_version(path: &str) -> bool {
    path.split('/').any(|segment| {
        let mut bytes = segment.bytes();
        bytes.next() == Some(b'v') && bytes.next().is_some_and(|b| b.is_ascii_digit())
    })
}
