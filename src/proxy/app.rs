//! The state every request of one proxy shares: its configuration, the
//! upstream client, metrics, sinks, limits, shutdown tokens, traces and the
//! inspector.
//!
//! This module owns that state and the upstream URL of a request. It sits
//! below the server (which builds it and routes requests) and the pump
//! (which streams responses with it), so that neither imports the other.

use super::ProxyConfig;
use super::metrics::Metrics;
use super::sink::Sinks;
use super::trace::Telemetry;
use axum::http::Uri;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// State shared by all requests of one proxy.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) config: ProxyConfig,
    pub(crate) origin: String,
    pub(crate) base_path: String,
    pub(crate) http: reqwest::Client,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) sinks: Sinks,
    pub(crate) limit: Arc<Semaphore>,
    pub(crate) next_id: AtomicU64,
    /// Shutdown asked: refuse new requests, let running ones finish.
    pub(crate) stopping: CancellationToken,
    /// The grace period is over: cut running streams (with an error event).
    pub(crate) hard_stop: CancellationToken,
    /// Request traces, when on.
    pub(crate) telemetry: Option<Telemetry>,
    /// The inspector page's state, when on.
    pub(crate) inspector: Option<Arc<super::inspect::Inspector>>,
}

impl App {
    /// The upstream URL for a request URI: the upstream's origin and path
    /// prefix, then the request path (its `/v1` not repeated when the
    /// prefix already ends in `/v1`), then the query as it came.
    pub(crate) fn target(&self, uri: &Uri) -> String {
        let path = uri.path();
        let path = if self.base_path.ends_with("/v1") { path.strip_prefix("/v1").unwrap_or(path) } else { path };
        let mut url = format!("{}{}{}", self.origin, self.base_path, path);
        if let Some(q) = uri.query() {
            url.push('?');
            url.push_str(q);
        }
        url
    }
}
