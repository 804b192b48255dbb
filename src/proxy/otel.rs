//! OpenTelemetry traces of proxied requests: one span per chat request with
//! the GenAI semantic-convention attributes, span events for repairs and
//! tool calls, and `traceparent` propagated to the upstream (feature
//! `otel`).
//!
//! This module owns the tracer provider, the span of a request and what
//! goes on it. It must not touch the bodies (the pump hands it events) and
//! must never slow a stream: spans are exported by the SDK's batch
//! processor on its own thread, and a collector that is down only costs
//! dropped spans.
//!
//! # Switching it on
//!
//! Off unless an endpoint is known: the `otel.endpoint` key of the config
//! file, `spindle proxy --otel-endpoint URL`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! variables; `OTEL_SDK_DISABLED=true` keeps it off. The service name is
//! `OTEL_SERVICE_NAME`, else `spindle`; `OTEL_RESOURCE_ATTRIBUTES` adds
//! resource attributes.
//!
//! # The span
//!
//! Name `chat MODEL`, kind client, child of the client's `traceparent`
//! when it sent one. Attributes: `gen_ai.operation.name` (`chat`),
//! `gen_ai.system`, `gen_ai.request.model`, `gen_ai.response.model`,
//! `gen_ai.response.id`, `gen_ai.usage.input_tokens`,
//! `gen_ai.usage.output_tokens`, `gen_ai.response.finish_reasons`,
//! `gen_ai.server.time_to_first_token` (seconds from the request to the
//! first content or reasoning text), `http.response.status_code`,
//! `spindle.outcome`, `spindle.repairs`. Events: `spindle.repair` (kind,
//! tag, the text added or dropped), `gen_ai.tool.call` (tool name, call
//! element), `spindle.diagnostic` (warnings and errors).
//!
//! A WebSocket session (OpenAI's Realtime API) is one span too, named
//! `realtime MODEL`, with `gen_ai.operation.name` `realtime`, from the
//! handshake to the session's end: status `101` and the way the session
//! ended as its outcome (`closed`, `too_big`, `client_lost`, ...; an
//! upstream's refusal is its status, outcome `refused`), the events
//! of all its responses on it (their token counts added up), and
//! its `traceparent` sent in the upstream's handshake.

use crate::event::{Event, Level};
use crate::sources::SourceEvent;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Where traces go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OtelConfig {
    /// The OTLP/HTTP base URL (`http://127.0.0.1:4318`; `/v1/traces` is
    /// added). `None`: the `OTEL_EXPORTER_OTLP_*` variables say.
    pub endpoint: Option<String>,
    /// The `gen_ai.system` attribute (default `openai`: the API the proxy
    /// speaks).
    pub system: Option<String>,
}

impl OtelConfig {
    /// The configuration the environment asks for: `Some` when an OTLP
    /// endpoint variable is set (and `OTEL_SDK_DISABLED` is not `true`).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Option<OtelConfig> {
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return None;
        }
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).then(OtelConfig::default)
    }
}

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
#[error("OpenTelemetry: {0}")]
pub struct OtelError(String);

/// The tracer of a running proxy.
#[derive(Debug, Clone)]
pub(crate) struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    system: String,
}

impl Telemetry {
    /// Starts the exporter (a background thread; nothing is sent until the
    /// first span ends).
    pub(crate) fn start(config: &OtelConfig) -> Result<Telemetry, OtelError> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_timeout(Duration::from_secs(5));
        if let Some(base) = &config.endpoint {
            builder = builder.with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')));
        }
        let exporter = builder.build().map_err(|e| OtelError(e.to_string()))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("spindle");
        }
        let provider =
            SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource.build()).build();
        let tracer = provider.tracer("spindle");
        Ok(Telemetry { provider, tracer, system: config.system.clone().unwrap_or_else(|| "openai".to_string()) })
    }

    /// Starts the span of one request: a child of the client's
    /// `traceparent` when it sent one. `inject` receives the headers that
    /// carry the new span upstream (`traceparent`, `tracestate`).
    pub(crate) fn request(
        &self,
        client_headers: &axum::http::HeaderMap,
        model: Option<&str>,
        inject: &mut axum::http::HeaderMap,
    ) -> RequestSpan {
        self.span(Operation::Chat, client_headers, model, inject)
    }

    /// Starts the span of a WebSocket session, as [`Telemetry::request`]
    /// does a request's.
    pub(crate) fn session(
        &self,
        client_headers: &axum::http::HeaderMap,
        model: Option<&str>,
        inject: &mut axum::http::HeaderMap,
    ) -> RequestSpan {
        self.span(Operation::Realtime, client_headers, model, inject)
    }

    fn span(
        &self,
        operation: Operation,
        client_headers: &axum::http::HeaderMap,
        model: Option<&str>,
        inject: &mut axum::http::HeaderMap,
    ) -> RequestSpan {
        use opentelemetry::propagation::TextMapPropagator as _;
        let propagator = TraceContextPropagator::new();
        let incoming: HashMap<String, String> = client_headers
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect();
        let parent = propagator.extract(&incoming);
        let name = match model {
            Some(m) => format!("{} {m}", operation.as_str()),
            None => operation.as_str().to_string(),
        };
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", operation.as_str()),
            KeyValue::new("gen_ai.system", self.system.clone()),
        ];
        if let Some(m) = model {
            attributes.push(KeyValue::new("gen_ai.request.model", m.to_string()));
        }
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        let cx = Context::current_with_span(span);
        let mut outgoing: HashMap<String, String> = HashMap::new();
        propagator.inject_context(&cx, &mut outgoing);
        for (k, v) in outgoing {
            if let (Ok(name), Ok(value)) =
                (axum::http::HeaderName::try_from(k.as_str()), axum::http::HeaderValue::from_str(&v))
            {
                inject.insert(name, value);
            }
        }
        RequestSpan {
            operation,
            cx,
            started: Instant::now(),
            first_token: None,
            finish_reasons: Vec::new(),
            input_tokens: None,
            output_tokens: None,
            repairs: 0,
        }
    }

    /// Sends what is buffered and stops the exporter.
    pub(crate) fn shutdown(&self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }
}

/// What a span is of: its name's first word and `gen_ai.operation.name`.
#[derive(Debug, Clone, Copy)]
enum Operation {
    /// A chat request (over HTTP).
    Chat,
    /// A WebSocket session of OpenAI's Realtime API.
    Realtime,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Chat => "chat",
            Operation::Realtime => "realtime",
        }
    }
}

/// The span of one request, fed the request's events by the pump.
#[derive(Debug)]
pub(crate) struct RequestSpan {
    operation: Operation,
    cx: Context,
    started: Instant,
    first_token: Option<Duration>,
    finish_reasons: Vec<String>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    repairs: i64,
}

impl RequestSpan {
    /// Notes one event of the response.
    pub(crate) fn observe(&mut self, event: &SourceEvent) {
        let span = self.cx.span();
        match event {
            SourceEvent::Choice(c) => match &c.event {
                Event::Delta(d) if self.first_token.is_none() && !d.text.is_empty() => {
                    let at = self.started.elapsed();
                    self.first_token = Some(at);
                    span.set_attribute(KeyValue::new("gen_ai.server.time_to_first_token", at.as_secs_f64()));
                }
                Event::Repair(r) => {
                    self.repairs += 1;
                    let mut attrs = vec![
                        KeyValue::new("spindle.repair.kind", r.kind.as_str()),
                        KeyValue::new("gen_ai.choice.index", i64::from(c.choice)),
                    ];
                    if let Some(tag) = &r.tag {
                        attrs.push(KeyValue::new("spindle.tag", tag.to_string()));
                    }
                    span.add_event("spindle.repair", attrs);
                }
                Event::Element(el) if el.payload.get("name").is_some() || el.tag.contains("tool") => {
                    let name = el.payload.get("name").and_then(serde_json::Value::as_str).unwrap_or_default();
                    span.add_event(
                        "gen_ai.tool.call",
                        vec![
                            KeyValue::new("gen_ai.tool.name", name.to_string()),
                            KeyValue::new("spindle.tag", el.tag.to_string()),
                            KeyValue::new("gen_ai.choice.index", i64::from(c.choice)),
                        ],
                    );
                }
                Event::Diagnostic(d) if d.level != Level::Info => {
                    span.add_event("spindle.diagnostic", vec![KeyValue::new("spindle.code", d.code.as_str())]);
                }
                _ => {}
            },
            SourceEvent::Finish { reason, .. } => self.finish_reasons.push(reason.as_str().to_string()),
            SourceEvent::Usage { usage } => {
                let n = |k: &str| usage.get(k).and_then(serde_json::Value::as_i64);
                let (input, output) =
                    (n("prompt_tokens").or(n("input_tokens")), n("completion_tokens").or(n("output_tokens")));
                match self.operation {
                    // A request's usage may come in several chunks, each
                    // with the counts so far: the last one holds.
                    Operation::Chat => {
                        self.input_tokens = input.or(self.input_tokens);
                        self.output_tokens = output.or(self.output_tokens);
                    }
                    // A session's comes once per response: they add up.
                    Operation::Realtime => {
                        let add = |total: Option<i64>, n: Option<i64>| match (total, n) {
                            (Some(t), Some(n)) => Some(t.saturating_add(n)),
                            (t, n) => t.or(n),
                        };
                        self.input_tokens = add(self.input_tokens, input);
                        self.output_tokens = add(self.output_tokens, output);
                    }
                }
            }
            SourceEvent::StreamError { error, .. } => {
                let message = error.get("message").and_then(serde_json::Value::as_str).unwrap_or("stream error");
                span.add_event("exception", vec![KeyValue::new("exception.message", message.to_string())]);
            }
            _ => {}
        }
    }

    /// Notes a tool run (agent mode) as a span event.
    pub(crate) fn tool_run(&mut self, tool: &str, ok: bool, duration_ms: u64, observation: &str) {
        let excerpt: String = observation.chars().take(200).collect();
        self.cx.span().add_event(
            "gen_ai.tool.run",
            vec![
                KeyValue::new("gen_ai.tool.name", tool.to_string()),
                KeyValue::new("spindle.tool.ok", ok),
                KeyValue::new("spindle.tool.duration_ms", i64::try_from(duration_ms).unwrap_or(i64::MAX)),
                KeyValue::new("spindle.tool.observation", excerpt),
            ],
        );
    }

    /// Ends the span with the response's status, outcome and response
    /// model/id (from the chunks).
    pub(crate) fn end(self, status: u16, outcome: &str, response: Option<(&str, &str)>) {
        let span = self.cx.span();
        let mut attrs = vec![
            KeyValue::new("http.response.status_code", i64::from(status)),
            KeyValue::new("spindle.outcome", outcome.to_string()),
            KeyValue::new("spindle.repairs", self.repairs),
        ];
        if let Some((model, id)) = response {
            if !model.is_empty() {
                attrs.push(KeyValue::new("gen_ai.response.model", model.to_string()));
            }
            if !id.is_empty() {
                attrs.push(KeyValue::new("gen_ai.response.id", id.to_string()));
            }
        }
        if let Some(n) = self.input_tokens {
            attrs.push(KeyValue::new("gen_ai.usage.input_tokens", n));
        }
        if let Some(n) = self.output_tokens {
            attrs.push(KeyValue::new("gen_ai.usage.output_tokens", n));
        }
        if !self.finish_reasons.is_empty() {
            let reasons: Vec<opentelemetry::StringValue> =
                self.finish_reasons.into_iter().map(opentelemetry::StringValue::from).collect();
            attrs.push(KeyValue::new(
                "gen_ai.response.finish_reasons",
                opentelemetry::Value::Array(opentelemetry::Array::String(reasons)),
            ));
        }
        span.set_attributes(attrs);
        if status >= 400 || !matches!(outcome, "ok" | "done_added" | "rewritten" | "closed") {
            span.set_status(Status::error(outcome.to_string()));
        }
        span.end();
    }
}
