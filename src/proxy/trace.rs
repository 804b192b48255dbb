//! The proxy's hook for request traces: the OpenTelemetry span of
//! [`super::otel`] with the `otel` feature, and a no-op without it, so the
//! server and the pump call the same methods either way.
//!
//! This module owns only that switch; what a span records is `otel`'s.

#[cfg(feature = "otel")]
pub(crate) use super::otel::{RequestSpan as Trace, Telemetry};

#[cfg(not(feature = "otel"))]
pub(crate) use off::{Telemetry, Trace};

#[cfg(not(feature = "otel"))]
mod off {
    use crate::sources::SourceEvent;

    /// No tracer (the `otel` feature is off).
    #[derive(Debug, Clone)]
    pub(crate) struct Telemetry;

    impl Telemetry {
        pub(crate) fn request(
            &self,
            _client: &axum::http::HeaderMap,
            _model: Option<&str>,
            _inject: &mut axum::http::HeaderMap,
        ) -> Trace {
            Trace
        }

        pub(crate) fn session(
            &self,
            _client: &axum::http::HeaderMap,
            _model: Option<&str>,
            _inject: &mut axum::http::HeaderMap,
        ) -> Trace {
            Trace
        }

        pub(crate) fn shutdown(&self) {}
    }

    /// No span.
    #[derive(Debug)]
    pub(crate) struct Trace;

    impl Trace {
        pub(crate) fn observe(&mut self, _event: &SourceEvent) {}

        pub(crate) fn tool_run(&mut self, _tool: &str, _ok: bool, _duration_ms: u64, _observation: &str) {}

        pub(crate) fn end(self, _status: u16, _outcome: &str, _response: Option<(&str, &str)>) {}
    }
}
