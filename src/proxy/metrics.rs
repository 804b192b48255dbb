//! The proxy's counters and their Prometheus text exposition (`/metrics`).
//!
//! This module owns counting and rendering only; it never decides what
//! happened. Counters are atomics, labelled families small maps behind a
//! mutex (a handful of labels, updated once per event batch). The text
//! format is written here rather than with a metrics crate: it is a dozen
//! families of plain counters, and the format
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/>) is
//! three kinds of line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A family of counters keyed by one label value.
#[derive(Debug, Default)]
struct Family(Mutex<BTreeMap<String, u64>>);

impl Family {
    fn add(&self, label: &str, n: u64) {
        if let Ok(mut map) = self.0.lock() {
            match map.get_mut(label) {
                Some(v) => *v += n,
                None => {
                    map.insert(label.to_string(), n);
                }
            }
        }
    }

    fn set(&self, label: &str, n: u64) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(label.to_string(), n);
        }
    }

    fn get(&self, label: &str) -> u64 {
        self.0.lock().ok().and_then(|m| m.get(label).copied()).unwrap_or(0)
    }

    fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().map(|m| m.clone()).unwrap_or_default()
    }
}

/// Counters of one proxy (shared by all requests).
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Family,
    requests_active: AtomicI64,
    connections_active: AtomicI64,
    streams_active: AtomicI64,
    streams_total: AtomicU64,
    rejected: AtomicU64,
    refused: Family,
    request_buffer_bytes: AtomicU64,
    client_disconnects: AtomicU64,
    bytes_upstream: AtomicU64,
    bytes_client: AtomicU64,
    bytes_request: AtomicU64,
    upstream_status: Family,
    upstream_errors: Family,
    repairs: Family,
    elements: Family,
    diagnostics: Family,
    truncated: AtomicU64,
    sink_sent: Family,
    sink_dropped: Family,
    sink_failed: Family,
    sink_connected: Family,
    sink_connects: Family,
    sink_reconnects: Family,
    websockets_active: AtomicI64,
    websockets_total: AtomicU64,
    /// Messages and payload bytes relayed, client to upstream and back.
    websocket_messages: [AtomicU64; 2],
    websocket_bytes: [AtomicU64; 2],
    websocket_ends: Family,
}

/// Which way a WebSocket message goes (the `direction` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    ClientToUpstream,
    UpstreamToClient,
}

impl Direction {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Direction::ClientToUpstream => "client_to_upstream",
            Direction::UpstreamToClient => "upstream_to_client",
        }
    }

    fn index(self) -> usize {
        match self {
            Direction::ClientToUpstream => 0,
            Direction::UpstreamToClient => 1,
        }
    }
}

/// Which gauge a [`GaugeGuard`] holds up.
#[derive(Debug, Clone, Copy)]
enum Gauge {
    Requests,
    Streams,
    Connections,
    WebSockets,
}

/// Decrements a gauge when dropped.
#[derive(Debug)]
pub(crate) struct GaugeGuard(Arc<Metrics>, Gauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        let gauge = match self.1 {
            Gauge::Requests => &self.0.requests_active,
            Gauge::Streams => &self.0.streams_active,
            Gauge::Connections => &self.0.connections_active,
            Gauge::WebSockets => &self.0.websockets_active,
        };
        gauge.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Counts a forwarded request of a kind (`chat_stream`, `chat`, `other`).
    pub(crate) fn request(&self, kind: &str) {
        self.requests.add(kind, 1);
    }

    /// A request in flight until the guard drops.
    pub(crate) fn request_active(self: &Arc<Self>) -> GaugeGuard {
        self.requests_active.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone(), Gauge::Requests)
    }

    /// A stream (an SSE response) in flight until the guard drops.
    pub(crate) fn stream_started(self: &Arc<Self>) -> GaugeGuard {
        self.streams_total.fetch_add(1, Ordering::Relaxed);
        self.streams_active.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone(), Gauge::Streams)
    }

    /// A client connection open (on either listener) until the guard
    /// drops.
    pub(crate) fn connection_open(self: &Arc<Self>) -> GaugeGuard {
        self.connections_active.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone(), Gauge::Connections)
    }

    /// A WebSocket session open (both handshakes done) until the guard
    /// drops.
    pub(crate) fn websocket_open(self: &Arc<Self>) -> GaugeGuard {
        self.websockets_total.fetch_add(1, Ordering::Relaxed);
        self.websockets_active.fetch_add(1, Ordering::Relaxed);
        GaugeGuard(self.clone(), Gauge::WebSockets)
    }

    /// Counts a WebSocket message relayed one way, and its payload bytes.
    pub(crate) fn websocket_message(&self, direction: Direction, bytes: usize) {
        self.websocket_messages[direction.index()].fetch_add(1, Ordering::Relaxed);
        self.websocket_bytes[direction.index()].fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a WebSocket session that ended, by how (`closed`,
    /// `too_big`, `client_lost`, `upstream_lost`, `client_protocol`,
    /// `upstream_protocol`, `shutdown`).
    pub(crate) fn websocket_end(&self, reason: &str) {
        self.websocket_ends.add(reason, 1);
    }

    /// Counts a request refused with 503 (stream limit, request buffer
    /// full, shutdown).
    pub(crate) fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused for how it came, by reason (`host`,
    /// `origin`, `request_timeout`).
    pub(crate) fn refused(&self, reason: &str) {
        self.refused.add(reason, 1);
    }

    /// Sets the bytes of request bodies buffered now (sampled when
    /// `/metrics` is read).
    pub(crate) fn request_buffer(&self, bytes: usize) {
        self.request_buffer_bytes.store(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn client_disconnect(&self) {
        self.client_disconnects.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn bytes_upstream(&self, n: usize) {
        self.bytes_upstream.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn bytes_client(&self, n: usize) {
        self.bytes_client.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn bytes_request(&self, n: usize) {
        self.bytes_request.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn upstream_status(&self, status: u16) {
        self.upstream_status.add(&status.to_string(), 1);
    }

    /// Counts an upstream error by kind (the error code, or `status_5xx`,
    /// `status_4xx`, `in_band`, `unexpected_content_type`).
    pub(crate) fn upstream_error(&self, kind: &str) {
        self.upstream_errors.add(kind, 1);
    }

    pub(crate) fn repair(&self, kind: &str) {
        self.repairs.add(kind, 1);
    }

    pub(crate) fn element(&self, tag: &str) {
        self.elements.add(tag, 1);
    }

    pub(crate) fn diagnostic(&self, code: &str) {
        self.diagnostics.add(code, 1);
    }

    pub(crate) fn truncated(&self) {
        self.truncated.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn sink_sent(&self, sink: &str, n: u64) {
        self.sink_sent.add(sink, n);
    }

    pub(crate) fn sink_dropped(&self, sink: &str, n: u64) {
        self.sink_dropped.add(sink, n);
    }

    pub(crate) fn sink_failed(&self, sink: &str, n: u64) {
        self.sink_failed.add(sink, n);
    }

    /// Sets whether a broker sink is connected; on a connection, returns
    /// whether it had been connected before (a reconnect).
    pub(crate) fn sink_connected(&self, sink: &str, up: bool) -> bool {
        self.sink_connected.set(sink, u64::from(up));
        if up {
            self.sink_connects.add(sink, 1);
            return self.sink_connects.get(sink) > 1;
        }
        false
    }

    pub(crate) fn sink_reconnect(&self, sink: &str) {
        self.sink_reconnects.add(sink, 1);
    }

    /// Records a sink delivered (for a broker: published, acknowledged
    /// under JetStream).
    pub fn sink_records(&self, sink: &str) -> u64 {
        self.sink_sent.get(sink)
    }

    /// Records one sink dropped (queue full, or its broker down).
    pub fn sink_dropped_for(&self, sink: &str) -> u64 {
        self.sink_dropped.get(sink)
    }

    /// Records one sink failed to deliver.
    pub fn sink_failed_for(&self, sink: &str) -> u64 {
        self.sink_failed.get(sink)
    }

    /// Times a broker sink connected again after losing its connection.
    pub fn sink_reconnects(&self, sink: &str) -> u64 {
        self.sink_reconnects.get(sink)
    }

    /// SSE streams in flight.
    pub fn streams_active(&self) -> i64 {
        self.streams_active.load(Ordering::Relaxed)
    }

    /// SSE streams started.
    pub fn streams_total(&self) -> u64 {
        self.streams_total.load(Ordering::Relaxed)
    }

    /// WebSocket sessions open.
    pub fn websockets_active(&self) -> i64 {
        self.websockets_active.load(Ordering::Relaxed)
    }

    /// WebSocket sessions opened.
    pub fn websockets_total(&self) -> u64 {
        self.websockets_total.load(Ordering::Relaxed)
    }

    /// Requests in flight (streams included).
    pub fn requests_active(&self) -> i64 {
        self.requests_active.load(Ordering::Relaxed)
    }

    /// Clients that went away before their response ended.
    pub fn client_disconnects(&self) -> u64 {
        self.client_disconnects.load(Ordering::Relaxed)
    }

    /// Requests refused with 503 (over the stream limit, the request
    /// buffer full, or shutting down).
    pub fn rejected_total(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Requests refused for how they came, of one reason (`host`,
    /// `origin`, `request_timeout`).
    pub fn refused_for(&self, reason: &str) -> u64 {
        self.refused.get(reason)
    }

    /// Client connections open, on the proxy's and the inspector's
    /// listeners.
    pub fn connections_active(&self) -> i64 {
        self.connections_active.load(Ordering::Relaxed)
    }

    /// Upstream errors of one kind.
    pub fn upstream_errors(&self, kind: &str) -> u64 {
        self.upstream_errors.get(kind)
    }

    /// Repairs of one kind (`header_inserted`, `closed_at_eof`, ...).
    pub fn repairs(&self, kind: &str) -> u64 {
        self.repairs.get(kind)
    }

    /// Records a sink dropped because its queue was full or it failed.
    pub fn sink_dropped_total(&self) -> u64 {
        self.sink_dropped.snapshot().values().sum::<u64>() + self.sink_failed.snapshot().values().sum::<u64>()
    }

    /// The Prometheus text exposition of every counter.
    ///
    /// ```
    /// let metrics = spindle::proxy::Metrics::default();
    /// let text = metrics.render();
    /// assert!(text.contains("# TYPE spindle_proxy_streams_active gauge"));
    /// assert!(text.contains("spindle_proxy_streams_total 0"));
    /// ```
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        family(&mut out, "requests_total", "counter", "Requests forwarded, by kind.", "kind", &self.requests);
        scalar(&mut out, "requests_active", "gauge", "Requests in flight.", self.requests_active());
        scalar(
            &mut out,
            "connections_active",
            "gauge",
            "Client connections open (the proxy's and the inspector's listeners).",
            self.connections_active(),
        );
        scalar(&mut out, "streams_active", "gauge", "SSE streams in flight.", self.streams_active());
        scalar(&mut out, "streams_total", "counter", "SSE streams started.", self.streams_total());
        scalar(
            &mut out,
            "websockets_active",
            "gauge",
            "WebSocket sessions open (both handshakes done).",
            self.websockets_active(),
        );
        scalar(&mut out, "websockets_total", "counter", "WebSocket sessions opened.", self.websockets_total());
        let ways = [Direction::ClientToUpstream, Direction::UpstreamToClient];
        let by_way = |counters: &[AtomicU64; 2]| ways.map(|d| (d.as_str(), load(&counters[d.index()])));
        labelled(
            &mut out,
            "websocket_messages_total",
            "counter",
            "WebSocket messages relayed (text, binary, ping, pong, close), by direction.",
            "direction",
            &by_way(&self.websocket_messages),
        );
        labelled(
            &mut out,
            "websocket_bytes_total",
            "counter",
            "Payload bytes of the WebSocket messages relayed, by direction.",
            "direction",
            &by_way(&self.websocket_bytes),
        );
        family(
            &mut out,
            "websocket_ends_total",
            "counter",
            "WebSocket sessions ended, by how (a close frame relayed, a message too big, a side lost or in breach of the protocol, shutdown).",
            "reason",
            &self.websocket_ends,
        );
        scalar(
            &mut out,
            "rejected_total",
            "counter",
            "Requests refused with 503 (stream limit, request buffer full, shutdown).",
            load(&self.rejected),
        );
        family(
            &mut out,
            "refused_total",
            "counter",
            "Requests refused for how they came, by reason (a Host or browser Origin not allowed: 403; a request body too slow: 408).",
            "reason",
            &self.refused,
        );
        scalar(
            &mut out,
            "request_buffer_bytes",
            "gauge",
            "Bytes of request bodies buffered now, across requests.",
            load(&self.request_buffer_bytes),
        );
        scalar(
            &mut out,
            "client_disconnects_total",
            "counter",
            "Clients that went away before their response ended (the upstream request was cancelled).",
            load(&self.client_disconnects),
        );
        labelled(
            &mut out,
            "bytes_total",
            "counter",
            "Bytes through the proxy: request bodies to the upstream, response bodies from the upstream, bytes written to clients.",
            "direction",
            &[
                ("request", load(&self.bytes_request)),
                ("upstream_in", load(&self.bytes_upstream)),
                ("client_out", load(&self.bytes_client)),
            ],
        );
        family(
            &mut out,
            "upstream_responses_total",
            "counter",
            "Upstream responses, by status.",
            "status",
            &self.upstream_status,
        );
        family(
            &mut out,
            "upstream_errors_total",
            "counter",
            "Upstream failures, by kind (connect, timeout, stalled, reset, truncated, in-band errors, error statuses, unexpected content types).",
            "kind",
            &self.upstream_errors,
        );
        scalar(
            &mut out,
            "streams_truncated_total",
            "counter",
            "Parsed streams that ended cut off.",
            load(&self.truncated),
        );
        family(&mut out, "repairs_total", "counter", "Repairs the parser made, by kind.", "kind", &self.repairs);
        family(&mut out, "elements_total", "counter", "Elements parsed, by tag.", "tag", &self.elements);
        family(
            &mut out,
            "diagnostics_total",
            "counter",
            "Stream and parser diagnostics, by code.",
            "code",
            &self.diagnostics,
        );
        family(&mut out, "sink_records_total", "counter", "Records delivered to sinks.", "sink", &self.sink_sent);
        family(
            &mut out,
            "sink_dropped_total",
            "counter",
            "Records dropped because a sink queue was full or its broker was down.",
            "sink",
            &self.sink_dropped,
        );
        family(
            &mut out,
            "sink_failed_total",
            "counter",
            "Records a sink failed to deliver (after retries).",
            "sink",
            &self.sink_failed,
        );
        family(
            &mut out,
            "sink_reconnects_total",
            "counter",
            "Times a broker sink connected again after losing its connection.",
            "sink",
            &self.sink_reconnects,
        );
        family(
            &mut out,
            "sink_connected",
            "gauge",
            "Whether a broker sink is connected (1) or not (0).",
            "sink",
            &self.sink_connected,
        );
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP spindle_proxy_{name} {help}");
    let _ = writeln!(out, "# TYPE spindle_proxy_{name} {kind}");
}

fn scalar(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    header(out, name, kind, help);
    let _ = writeln!(out, "spindle_proxy_{name} {value}");
}

fn labelled(out: &mut String, name: &str, kind: &str, help: &str, label: &str, values: &[(&str, u64)]) {
    header(out, name, kind, help);
    for (value, n) in values {
        let _ = writeln!(out, "spindle_proxy_{name}{{{label}=\"{}\"}} {n}", escape(value));
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str, label: &str, family: &Family) {
    let snapshot = family.snapshot();
    let values: Vec<(&str, u64)> = snapshot.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    labelled(out, name, kind, help, label, &values);
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_is_valid_exposition() {
        let m = Arc::new(Metrics::default());
        m.request("chat_stream");
        m.repair("closed_at_eof");
        m.repair("closed_at_eof");
        m.element("we\"ird\ntag");
        m.upstream_error("upstream_reset");
        let guard = m.stream_started();
        let text = m.render();
        assert!(text.contains("spindle_proxy_repairs_total{kind=\"closed_at_eof\"} 2"), "{text}");
        assert!(text.contains("spindle_proxy_streams_active 1"));
        assert!(text.contains("spindle_proxy_elements_total{tag=\"we\\\"ird\\ntag\"} 1"));
        drop(guard);
        assert_eq!(m.streams_active(), 0);
        assert_eq!(m.streams_total(), 1);
        // Every sample line belongs to a declared family.
        let mut declared = std::collections::HashSet::new();
        for line in m.render().lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap_or("").to_string());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap_or("");
                assert!(declared.contains(name), "{line}");
                let value = line.rsplit(' ').next().unwrap_or("");
                assert!(value.parse::<f64>().is_ok(), "{line}");
            }
        }
    }
}
