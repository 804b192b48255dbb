//! The proxy's configuration file: `spindle proxy --config FILE`, and
//! `--print-config`.
//!
//! This module owns the file's shape (TOML, one section per concern,
//! unknown keys refused), its defaults, how flags and environment variables
//! are laid over it, how it is printed back with its secrets masked, and
//! turning it into a [`ProxyConfig`]. It does not read flags (the binary
//! hands it a [`ProxyOverrides`]) and does not run anything.
//!
//! # Where a value comes from
//!
//! A flag beats an environment variable, which beats the file, which beats
//! the default. Secrets have no flag (flags show in `ps`): they come from
//! the environment (or the file) and are never printed.
//!
//! # Keys
//!
//! | key | flag | default |
//! |---|---|---|
//! | `listen` | `--listen` | `"127.0.0.1:8787"` |
//! | `log` | `--log` | `"info"` |
//! | `upstream.url` | `--upstream` | none (required) |
//! | `upstream.api_key` | env `SPINDLE_UPSTREAM_API_KEY` (secret) | none: the client's `Authorization` is forwarded |
//! | `upstream.connect_timeout` | `--connect-timeout` | `10.0` (seconds) |
//! | `upstream.idle_timeout` | `--idle-timeout` | `60.0` (seconds) |
//! | `upstream.first_byte_timeout` | `--first-byte-timeout` | `600.0` (seconds) |
//! | `parse.profile` | `--profile` | `"chat"` |
//! | `parse.registry` | `--registry` | none (a registry file instead of the profile) |
//! | `parse.rewrite` | `--rewrite` | `false` |
//! | `parse.use_protocol` | `--use-protocol` | `"auto"`: a request whose system prompt declares `<use_protocol>` is parsed with the registry they build; `"ignore"` |
//! | `limits.max_streams` | `--max-streams` | `4096` |
//! | `limits.max_line` | `--max-line` | `4194304` (bytes) |
//! | `limits.max_request_body` | `--max-request-body` | `33554432` (bytes) |
//! | `limits.max_response_body` | `--max-response-body` | `16777216` (bytes) |
//! | `limits.grace` | `--grace` | `30.0` (seconds) |
//! | `limits.channel_capacity` | none | `16` (items queued between relay and client) |
//! | `limits.request_timeout` | `--request-timeout` | `30.0` (seconds for a request head, and between reads of a buffered request body: `408`) |
//! | `limits.max_connections` | `--max-connections` | `1024` (client connections per listener; more wait to be accepted) |
//! | `limits.max_request_buffer` | `--max-request-buffer` | `268435456` (bytes of request bodies buffered at once; more: `503`) |
//! | `limits.max_ws_message` | `--max-ws-message` | `16777216` (bytes of a WebSocket message or frame, either way; more: close `1009`) |
//! | `access.allowed_hosts` | `--allowed-host` (repeatable; given flags replace the list), env `SPINDLE_ALLOWED_HOST` | `[]`: loopback names on a loopback listener, any name on another |
//! | `access.allow_origins` | `--allow-origin` (repeatable; given flags replace the list), env `SPINDLE_ALLOW_ORIGIN` | `[]`: no browser page may call the proxy (`"*"`: any) |
//! | `sink.targets` | `--sink` (repeatable; given flags replace the list) | `[]` |
//! | `sink.queue` | `--sink-queue` | `10000` |
//! | `sink.nats_token` | env `SPINDLE_NATS_TOKEN` (secret) | none |
//! | `ui.enabled` | `--ui` | `false` (the live inspector page) |
//! | `ui.listen` | `--ui-listen` | `"127.0.0.1:8789"` |
//! | `ui.token` | env `SPINDLE_UI_TOKEN` (secret) | none (required when `ui.listen` is not loopback) |
//! | `ui.recent` | none | `200` (streams kept) |
//! | `ui.max_stream_bytes` | none | `262144` (event bytes kept per stream) |
//! | `otel.endpoint` | `--otel-endpoint` | none: traces off, unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (feature `otel`) |
//! | `otel.system` | none | `"openai"` (the `gen_ai.system` attribute) |
//! | `tools.protocol` | `--tool-protocol` | none: tool calling off (`hermes`, `filament`, `tam`, `action`) |
//! | `tools.invalid_calls` | `--invalid-calls` | `"pass"` (or `"drop"`) |
//! | `tools.agent` | `--agent` | `false` (needs `tools.protocol` and `tools.dir`) |
//! | `tools.dir` | `--tools` | none (the plugins directory of the agent loop) |
//! | `tools.agent_max_steps` | `--agent-max-steps` | `8` (model answers per agent request) |
//! | `tools.agent_max_tool_calls` | `--agent-max-tool-calls` | `32` |
//! | `tools.agent_max_time` | `--agent-max-time` | `600.0` (seconds per agent request) |
//! | `tools.agent_tools` | `--agent-tools` | `[]`: all the tools of `tools.dir` (else only these ids: the agent's tool list) |
//! | `tools.agent_async_tasks` | `--agent-async-tasks` | `"continue"` (or `"wait"`: wait for a turn's async tasks before asking again, [`AsyncTasks`](crate::tools::agent::AsyncTasks)) |
//! | `tools.timeout_ms` | `--tool-timeout-ms` | `30000` (a tool's time limit unless its definition sets one) |
//! | `tools.env` | `--tool-env` (repeatable; given flags replace the list) | `[]`: the agent's tools see no more of the proxy's environment than `PATH` (`NAME` passes the proxy's value on, `NAME=VALUE` sets one) |
//! | `tools.path` | `--tool-path` | none: the `PATH` spindle was started with (`/usr/local/bin:/usr/bin:/bin` when it has none); the `PATH` the agent's tools see and their programs are looked up in |
//!
//! With `tools.protocol` set and no profile or registry chosen (the profile
//! left at `chat`), streams are parsed with the profile that reads that
//! protocol's calls (`tam`, `action`; `chat` for the others).
//!
//! Paths (`parse.registry`, `jsonl:` sinks) are relative to the working
//! directory. An upstream API key is sent as `Authorization: Bearer KEY` on
//! requests that do not carry their own `Authorization`.
//!
//! # Example
//!
//! ```
//! use spindle::proxy::ProxySettings;
//!
//! let text = r#"
//! listen = "0.0.0.0:8787"
//!
//! [upstream]
//! url = "http://127.0.0.1:8080"
//!
//! [sink]
//! targets = ["jsonl:elements.jsonl", "nats://127.0.0.1:4222/spindle"]
//! "#;
//! let mut settings = ProxySettings::from_toml(text, "proxy.toml").unwrap();
//! settings.apply_env(|name| (name == "SPINDLE_UPSTREAM_API_KEY").then(|| "sk-secret".to_string()));
//! let printed = settings.to_toml();
//! assert!(printed.contains("url = \"http://127.0.0.1:8080\""));
//! assert!(!printed.contains("sk-secret"));
//! let config = settings.to_proxy_config().unwrap();
//! assert_eq!(config.sinks.len(), 2);
//!
//! let err = ProxySettings::from_toml("[limits]\nmax_streams = \"many\"\n", "proxy.toml").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "config proxy.toml, line 2: limits.max_streams: invalid type: string \"many\", expected a nonzero usize"
//! );
//! ```

use super::calling::{InvalidCalls, TOOL_PROTOCOLS, ToolCalling};
use super::sink::SinkSpec;
use super::{ProxyConfig, UseProtocol};
use crate::Registry;
use crate::sources::StreamOptions;
use crate::tools::Protocol;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::PathBuf;
use std::time::Duration;

/// A secret (an API key, a token): never shown by `Debug` or printed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself (to send it, never to log it).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A positive, finite number of seconds (`10`, `2.5`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Seconds(f64);

impl Seconds {
    /// `secs`, when it is positive and finite.
    ///
    /// # Errors
    ///
    /// A message saying what a valid value is.
    pub fn new(secs: f64) -> Result<Seconds, &'static str> {
        if secs.is_finite() && secs > 0.0 { Ok(Seconds(secs)) } else { Err("expected a positive number of seconds") }
    }

    /// As a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs_f64(self.0)
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Seconds, D::Error> {
        let secs = f64::deserialize(d)?;
        Seconds::new(secs).map_err(serde::de::Error::custom)
    }
}

/// A sink as the file and `--sink` write it (`jsonl:FILE`, `webhook:URL`,
/// `nats://HOST:PORT/SUBJECT`); printed with passwords masked.
#[derive(Debug, Clone)]
pub struct SinkTarget(pub SinkSpec);

impl<'de> Deserialize<'de> for SinkTarget {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<SinkTarget, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map(SinkTarget).map_err(serde::de::Error::custom)
    }
}

impl Serialize for SinkTarget {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.to_masked_string() {
            Some(text) => s.serialize_str(&text),
            None => Err(serde::ser::Error::custom("an in-process channel sink has no text form")),
        }
    }
}

fn profile<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    if Registry::profile(&name).is_none() {
        return Err(serde::de::Error::custom(format!(
            "unknown profile {name:?} (known: {})",
            Registry::profile_names().join(", ")
        )));
    }
    Ok(name)
}

/// The whole configuration file. Every field has a default, so an empty
/// file is valid (but the proxy still needs an upstream URL).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ProxySettings {
    /// Address to listen on (`127.0.0.1:8787`; port 0 picks a free port).
    pub listen: String,
    /// Log level (`error`, `warn`, `info`, `debug`, `trace`; `RUST_LOG`
    /// wins). Default `info`.
    pub log: String,
    /// `[upstream]`: where requests go.
    pub upstream: UpstreamSettings,
    /// `[parse]`: how streams are parsed.
    pub parse: ParseSettings,
    /// `[limits]`: sizes, counts and the shutdown grace period.
    pub limits: LimitSettings,
    /// `[sink]`: where parsed records go.
    pub sink: SinkSettings,
    /// `[otel]`: request traces (feature `otel`).
    pub otel: OtelSettings,
    /// `[ui]`: the live inspector page.
    pub ui: UiSettings,
    /// `[tools]`: OpenAI tool calling for models that write their calls
    /// as text, and the agent loop.
    pub tools: ToolSettings,
    /// `[access]`: the `Host` names the listeners answer to, and the
    /// browser origins that may call the proxy.
    pub access: AccessSettings,
}

/// `[access]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct AccessSettings {
    /// `Host` names the listeners answer to besides the loopback ones
    /// (see [`ProxyConfig::allowed_hosts`]).
    pub allowed_hosts: Vec<AllowedHost>,
    /// Browser origins whose pages may call the proxy (see
    /// [`ProxyConfig::allow_origins`]).
    pub allow_origins: Vec<AllowedOrigin>,
}

/// An `access.allowed_hosts` entry (`--allowed-host`): a host name or IP
/// address, no scheme or port; kept in lower case.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct AllowedHost(String);

impl AllowedHost {
    /// `text`, when it is a host name or IP address.
    ///
    /// # Errors
    ///
    /// A sentence saying why it is not one.
    pub fn new(text: &str) -> Result<AllowedHost, String> {
        super::policy::host_name(text).map(AllowedHost)
    }

    /// The name, as the `Host` header is compared with it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AllowedHost {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AllowedHost, D::Error> {
        AllowedHost::new(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// An `access.allow_origins` entry (`--allow-origin`):
/// `scheme://host[:port]`, `null`, or `*` for any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct AllowedOrigin(String);

impl AllowedOrigin {
    /// `text`, when it is a browser origin (or `*`).
    ///
    /// # Errors
    ///
    /// A sentence saying why it is not one.
    pub fn new(text: &str) -> Result<AllowedOrigin, String> {
        super::policy::origin(text).map(AllowedOrigin)
    }

    /// The origin, as the `Origin` header is compared with it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for AllowedOrigin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AllowedOrigin, D::Error> {
        AllowedOrigin::new(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// `[tools]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ToolSettings {
    /// The text protocol the proxy translates OpenAI tool calling to and
    /// from; none: tool calling off.
    #[serde(skip_serializing_if = "Option::is_none", with = "tool_protocol")]
    pub protocol: Option<Protocol>,
    /// What happens to a call the request's tools do not allow.
    pub invalid_calls: InvalidCalls,
    /// Run the tool loop in the proxy for requests without tools of their
    /// own.
    pub agent: bool,
    /// The plugins directory whose tools the agent loop runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Most model answers per agent request.
    pub agent_max_steps: NonZeroUsize,
    /// Most tool calls per agent request.
    pub agent_max_tool_calls: usize,
    /// Most seconds per agent request.
    pub agent_max_time: Seconds,
    /// What the agent loop does with async tools' tasks.
    pub agent_async_tasks: crate::tools::agent::AsyncTasks,
    /// The ids of the tools of `dir` the agent loop may use; empty: all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub agent_tools: Vec<String>,
    /// A tool's time limit unless its definition sets one, in ms.
    pub timeout_ms: NonZeroU64,
    /// The `PATH` the agent's tools see (and their bare program names are
    /// looked up in); none: the proxy's own
    /// ([`RunnerOptions::inherited_path`](crate::tools::RunnerOptions::inherited_path)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// More environment for the agent's tools: `NAME` (the proxy's value)
    /// or `NAME=VALUE` ([`RunnerOptions::env`](crate::tools::RunnerOptions::env)).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
}

impl Default for ToolSettings {
    /// The library's defaults: [`AgentLimits`](crate::tools::agent::AgentLimits)
    /// and [`RunnerOptions`](crate::tools::RunnerOptions).
    fn default() -> ToolSettings {
        let limits = crate::tools::agent::AgentLimits::default();
        let timeout = crate::tools::RunnerOptions::default().default_timeout;
        ToolSettings {
            protocol: None,
            invalid_calls: InvalidCalls::Pass,
            agent: false,
            dir: None,
            agent_max_steps: nonzero(limits.max_steps),
            agent_max_tool_calls: limits.max_tool_calls,
            agent_max_time: Seconds(limits.max_time.unwrap_or(Duration::from_secs(600)).as_secs_f64()),
            agent_async_tasks: crate::tools::agent::AsyncTasks::default(),
            agent_tools: Vec::new(),
            timeout_ms: NonZeroU64::new(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(NonZeroU64::MIN),
            path: None,
            env: Vec::new(),
        }
    }
}

impl ToolSettings {
    /// The tool-calling configuration, when a protocol is set.
    pub fn tool_calling(&self) -> Option<ToolCalling> {
        self.protocol.map(|protocol| ToolCalling { protocol, invalid_calls: self.invalid_calls })
    }

    /// The agent loop's limits.
    pub fn agent_limits(&self) -> crate::tools::agent::AgentLimits {
        crate::tools::agent::AgentLimits {
            max_steps: self.agent_max_steps.get(),
            max_tool_calls: self.agent_max_tool_calls,
            max_time: Some(self.agent_max_time.duration()),
            ..crate::tools::agent::AgentLimits::default()
        }
    }

    /// A tool's time limit unless its definition sets one.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.get())
    }

    /// The `PATH` of the agent's tools: `tools.path`, else the proxy's own.
    pub fn tool_path(&self) -> String {
        self.path.clone().unwrap_or_else(crate::tools::RunnerOptions::inherited_path)
    }
}

/// The protocols the proxy translates, for messages (`hermes, filament, …`).
fn tool_protocol_names() -> String {
    TOOL_PROTOCOLS.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
}

/// `tools.protocol` as its name; only the protocols the proxy translates.
mod tool_protocol {
    use super::{Protocol, TOOL_PROTOCOLS};
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(p: &Option<Protocol>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            Some(p) => s.serialize_str(p.as_str()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Protocol>, D::Error> {
        let name = String::deserialize(d)?;
        match Protocol::from_name(&name).filter(|p| TOOL_PROTOCOLS.contains(p)) {
            Some(p) => Ok(Some(p)),
            None => Err(serde::de::Error::custom(format!(
                "unknown tool protocol {name:?} (known: {})",
                super::tool_protocol_names()
            ))),
        }
    }
}

/// `[ui]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct UiSettings {
    /// Serve the page.
    pub enabled: bool,
    /// Where the page listens.
    pub listen: String,
    /// The page's token (secret; `SPINDLE_UI_TOKEN`).
    #[serde(skip_serializing)]
    pub token: Option<Secret>,
    /// Streams kept.
    pub recent: NonZeroUsize,
    /// Event bytes kept per stream.
    pub max_stream_bytes: usize,
}

impl Default for UiSettings {
    fn default() -> UiSettings {
        let d = super::UiConfig::default();
        UiSettings {
            enabled: false,
            listen: d.listen,
            token: None,
            recent: nonzero(d.recent),
            max_stream_bytes: d.max_stream_bytes,
        }
    }
}

/// `[otel]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct OtelSettings {
    /// The OTLP/HTTP base URL (`http://127.0.0.1:4318`); setting it turns
    /// traces on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The `gen_ai.system` attribute (default `openai`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Traces are on because an `OTEL_EXPORTER_OTLP_*` endpoint variable
    /// is set (the exporter reads it).
    #[serde(skip)]
    pub from_env: bool,
}

/// `[upstream]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct UpstreamSettings {
    /// The upstream base URL. No default: the file or `--upstream` must
    /// name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An API key for the upstream (secret; `SPINDLE_UPSTREAM_API_KEY`).
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// Seconds to wait for a connection (default 10).
    pub connect_timeout: Seconds,
    /// Seconds of upstream silence in a body before it fails (default 60).
    pub idle_timeout: Seconds,
    /// Seconds to wait for the response head and the first body byte
    /// (default 600).
    pub first_byte_timeout: Seconds,
}

/// `[parse]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct ParseSettings {
    /// The registry profile (default `chat`).
    #[serde(deserialize_with = "profile")]
    pub profile: String,
    /// A registry file (TOML, or JSON by extension) instead of the profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry: Option<PathBuf>,
    /// Send the corrected content instead of the raw content (default false).
    pub rewrite: bool,
    /// Whether a request's `<use_protocol>` declarations choose its
    /// registry (default `auto`).
    pub use_protocol: UseProtocol,
}

/// `[limits]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct LimitSettings {
    /// Most requests in flight; more get 503 (default 4096).
    pub max_streams: NonZeroUsize,
    /// Longest SSE line (and event) parsed, in bytes (default 4 MiB).
    pub max_line: NonZeroUsize,
    /// Largest request body of a model endpoint, in bytes (default 32 MiB).
    pub max_request_body: usize,
    /// Largest whole JSON response parsed, in bytes (default 16 MiB).
    pub max_response_body: usize,
    /// Seconds running streams may go on after a shutdown (default 30).
    pub grace: Seconds,
    /// Items queued between the relay and the client's connection
    /// (default 16).
    pub channel_capacity: NonZeroUsize,
    /// Seconds a client may take to send a request head, or between two
    /// reads of a request body the proxy buffers (default 30).
    pub request_timeout: Seconds,
    /// Most client connections open at once, per listener (default 1024).
    pub max_connections: NonZeroUsize,
    /// Most bytes of request bodies buffered at once, across requests
    /// (default 256 MiB).
    pub max_request_buffer: usize,
    /// Largest WebSocket message (and frame) relayed, in bytes (default
    /// 16 MiB; more closes the session with `1009`).
    pub max_ws_message: NonZeroUsize,
}

/// `[sink]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct SinkSettings {
    /// Where parsed records go (default none).
    pub targets: Vec<SinkTarget>,
    /// Records queued per sink before records are dropped (default 10,000).
    pub queue: NonZeroUsize,
    /// A token for NATS sinks whose URL has no credentials (secret;
    /// `SPINDLE_NATS_TOKEN`).
    #[serde(skip_serializing)]
    pub nats_token: Option<Secret>,
}

fn nonzero(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap_or(NonZeroUsize::MIN)
}

impl Default for ProxySettings {
    fn default() -> ProxySettings {
        ProxySettings {
            listen: "127.0.0.1:8787".into(),
            log: "info".into(),
            upstream: UpstreamSettings::default(),
            parse: ParseSettings::default(),
            limits: LimitSettings::default(),
            sink: SinkSettings::default(),
            otel: OtelSettings::default(),
            ui: UiSettings::default(),
            tools: ToolSettings::default(),
            access: AccessSettings::default(),
        }
    }
}

impl Default for UpstreamSettings {
    fn default() -> UpstreamSettings {
        let config = ProxyConfig::new("");
        UpstreamSettings {
            url: None,
            api_key: None,
            connect_timeout: Seconds(config.connect_timeout.as_secs_f64()),
            idle_timeout: Seconds(config.idle_timeout.as_secs_f64()),
            first_byte_timeout: Seconds(config.first_byte_timeout.as_secs_f64()),
        }
    }
}

impl Default for ParseSettings {
    fn default() -> ParseSettings {
        ParseSettings { profile: "chat".into(), registry: None, rewrite: false, use_protocol: UseProtocol::Auto }
    }
}

impl Default for LimitSettings {
    fn default() -> LimitSettings {
        let config = ProxyConfig::new("");
        LimitSettings {
            max_streams: nonzero(config.max_streams),
            max_line: nonzero(config.options.sse.max_line_len),
            max_request_body: config.max_request_body,
            max_response_body: config.max_response_body,
            grace: Seconds(config.grace.as_secs_f64()),
            channel_capacity: nonzero(config.channel_capacity),
            request_timeout: Seconds(config.request_timeout.as_secs_f64()),
            max_connections: nonzero(config.max_connections),
            max_request_buffer: config.max_request_buffer,
            max_ws_message: nonzero(config.max_ws_message),
        }
    }
}

impl Default for SinkSettings {
    fn default() -> SinkSettings {
        SinkSettings { targets: Vec::new(), queue: nonzero(ProxyConfig::new("").sink_queue), nats_token: None }
    }
}

/// What is wrong with a configuration: one line naming the file, the line
/// and the key when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct SettingsError {
    origin: String,
    line: Option<usize>,
    key: Option<String>,
    message: String,
}

impl SettingsError {
    fn render(&self) -> String {
        let mut out = self.origin.clone();
        if let Some(line) = self.line {
            out.push_str(&format!(", line {line}"));
        }
        out.push_str(": ");
        if let Some(key) = &self.key {
            out.push_str(key);
            out.push_str(": ");
        }
        out.push_str(&self.message);
        out
    }

    fn key(key: &str, message: impl Into<String>) -> SettingsError {
        SettingsError { origin: "config".into(), line: None, key: Some(key.into()), message: message.into() }
    }

    /// The dotted key the error is about (`limits.max_streams`), if any.
    pub fn key_path(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The 1-based line of the file, if the error is in a file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }
}

/// Where in `text` the key or array element at `path` is.
fn locate(text: &str, path: &serde_path_to_error::Path) -> Option<std::ops::Range<usize>> {
    use serde_path_to_error::Segment;
    use toml::de::{DeTable, DeValue};
    let root = DeTable::parse(text).ok()?;
    let mut table = Some(root.get_ref());
    let mut array: Option<&[toml::Spanned<DeValue<'_>>]> = None;
    let mut span = None;
    for segment in path.iter() {
        let value = match segment {
            Segment::Map { key } => {
                let (k, v) = table?.iter().find(|(k, _)| k.get_ref().as_ref() == key.as_str())?;
                span = Some(k.span());
                v
            }
            Segment::Seq { index } => {
                let v = array?.get(*index)?;
                span = Some(v.span());
                v
            }
            Segment::Enum { .. } | Segment::Unknown => return span,
        };
        (table, array) = match value.get_ref() {
            DeValue::Table(t) => (Some(t), None),
            DeValue::Array(a) => (None, Some(a.as_ref())),
            _ => (None, None),
        };
    }
    span
}

/// One line: the messages of TOML and serde may hold line breaks.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Values given on the command line (or through clap's environment
/// twins), laid over the file by [`ProxySettings::apply`]. `None` leaves the
/// file's value.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ProxyOverrides {
    /// `--upstream`.
    pub upstream: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--profile` (clears the file's `parse.registry`).
    pub profile: Option<String>,
    /// `--registry`.
    pub registry: Option<PathBuf>,
    /// `--rewrite` (a flag can only turn it on).
    pub rewrite: bool,
    /// `--use-protocol`.
    pub use_protocol: Option<UseProtocol>,
    /// `--sink`, repeated (replaces the file's list when not empty).
    pub sinks: Vec<SinkSpec>,
    /// `--idle-timeout`.
    pub idle_timeout: Option<f64>,
    /// `--first-byte-timeout`.
    pub first_byte_timeout: Option<f64>,
    /// `--connect-timeout`.
    pub connect_timeout: Option<f64>,
    /// `--grace`.
    pub grace: Option<f64>,
    /// `--max-streams`.
    pub max_streams: Option<usize>,
    /// `--max-line`.
    pub max_line: Option<usize>,
    /// `--max-request-body`.
    pub max_request_body: Option<usize>,
    /// `--max-response-body`.
    pub max_response_body: Option<usize>,
    /// `--sink-queue`.
    pub sink_queue: Option<usize>,
    /// `--log`.
    pub log: Option<String>,
    /// `--otel-endpoint`.
    pub otel_endpoint: Option<String>,
    /// `--ui` (a flag can only turn it on).
    pub ui: bool,
    /// `--ui-listen`.
    pub ui_listen: Option<String>,
    /// `--tool-protocol`.
    pub tool_protocol: Option<Protocol>,
    /// `--invalid-calls`.
    pub invalid_calls: Option<InvalidCalls>,
    /// `--agent` (a flag can only turn it on).
    pub agent: bool,
    /// `--tools`.
    pub tools: Option<PathBuf>,
    /// `--agent-max-steps`.
    pub agent_max_steps: Option<usize>,
    /// `--agent-max-tool-calls`.
    pub agent_max_tool_calls: Option<usize>,
    /// `--agent-max-time` (seconds).
    pub agent_max_time: Option<f64>,
    /// `--agent-async-tasks`.
    pub agent_async_tasks: Option<crate::tools::agent::AsyncTasks>,
    /// `--agent-tools` (replaces the file's list when not empty).
    pub agent_tools: Vec<String>,
    /// `--tool-timeout-ms`.
    pub tool_timeout_ms: Option<u64>,
    /// `--tool-path`.
    pub tool_path: Option<String>,
    /// `--tool-env`, repeated (replaces the file's list when not empty).
    pub tool_env: Vec<String>,
    /// `--allowed-host`, repeated (replaces the file's list when not empty).
    pub allowed_hosts: Vec<String>,
    /// `--allow-origin`, repeated (replaces the file's list when not empty).
    pub allow_origins: Vec<String>,
    /// `--request-timeout` (seconds).
    pub request_timeout: Option<f64>,
    /// `--max-connections`.
    pub max_connections: Option<usize>,
    /// `--max-request-buffer`.
    pub max_request_buffer: Option<usize>,
    /// `--max-ws-message`.
    pub max_ws_message: Option<usize>,
}

impl ProxySettings {
    /// Reads a configuration file.
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not TOML, has an unknown key or a value
    /// of the wrong kind: one line naming the file, the line and the key.
    pub fn load(path: &std::path::Path) -> Result<ProxySettings, SettingsError> {
        let origin = format!("config {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| SettingsError {
            origin: origin.clone(),
            line: None,
            key: None,
            message: format!("cannot read it: {e}"),
        })?;
        ProxySettings::parse(&text, origin)
    }

    /// Reads configuration text; `name` names it in errors (a file name).
    ///
    /// # Errors
    ///
    /// As [`ProxySettings::load`].
    pub fn from_toml(text: &str, name: &str) -> Result<ProxySettings, SettingsError> {
        ProxySettings::parse(text, format!("config {name}"))
    }

    fn parse(text: &str, origin: String) -> Result<ProxySettings, SettingsError> {
        let line_of = |span: Option<std::ops::Range<usize>>| {
            span.map(|s| text.get(..s.start.min(text.len())).unwrap_or("").matches('\n').count() + 1)
        };
        let de = toml::Deserializer::parse(text).map_err(|e| SettingsError {
            origin: origin.clone(),
            line: line_of(e.span()),
            key: None,
            message: one_line(e.message()),
        })?;
        let mut settings: ProxySettings = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            // The span of the key (or array element) the path names: the
            // deserializer's own span is the enclosing value's (a whole
            // array for a bad element).
            let span = locate(text, e.path()).or_else(|| e.inner().span());
            SettingsError {
                origin,
                line: line_of(span),
                key: (path != "." && !path.is_empty()).then_some(path),
                message: one_line(e.inner().message()),
            }
        })?;
        settings.settle(false);
        Ok(settings)
    }

    /// Derived defaults: with a tool protocol and the profile left at
    /// `chat` (no registry, and no `--profile`), the profile that reads
    /// the protocol's calls.
    fn settle(&mut self, profile_given: bool) {
        if let Some(tc) = self.tools.tool_calling()
            && !profile_given
            && self.parse.registry.is_none()
            && self.parse.profile == "chat"
        {
            self.parse.profile = tc.default_profile().to_string();
        }
    }

    /// Reads the secrets from the environment (`var` is
    /// `std::env::var(name).ok()` in the binary): `SPINDLE_UPSTREAM_API_KEY`
    /// and `SPINDLE_NATS_TOKEN`; set ones replace the file's.
    pub fn apply_env(&mut self, var: impl Fn(&str) -> Option<String>) {
        if let Some(key) = var("SPINDLE_UPSTREAM_API_KEY").filter(|k| !k.is_empty()) {
            self.upstream.api_key = Some(Secret(key));
        }
        if let Some(token) = var("SPINDLE_NATS_TOKEN").filter(|k| !k.is_empty()) {
            self.sink.nats_token = Some(Secret(token));
        }
        if let Some(token) = var("SPINDLE_UI_TOKEN").filter(|k| !k.is_empty()) {
            self.ui.token = Some(Secret(token));
        }
        let set = |name: &str| var(name).is_some_and(|v| !v.trim().is_empty());
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        self.otel.from_env =
            !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"));
    }

    /// Lays command-line values over the settings.
    ///
    /// # Errors
    ///
    /// A value out of range, naming its flag.
    pub fn apply(&mut self, o: ProxyOverrides) -> Result<(), SettingsError> {
        let seconds = |flag: &str, v: f64| Seconds::new(v).map_err(|m| SettingsError::key(flag, m));
        let count = |flag: &str, v: usize| {
            NonZeroUsize::new(v).ok_or_else(|| SettingsError::key(flag, "expected a number above 0"))
        };
        if let Some(v) = o.upstream {
            self.upstream.url = Some(v);
        }
        if let Some(v) = o.listen {
            self.listen = v;
        }
        let profile_given = o.profile.is_some() || o.registry.is_some();
        if let Some(v) = o.profile {
            if Registry::profile(&v).is_none() {
                let known = Registry::profile_names().join(", ");
                return Err(SettingsError::key("--profile", format!("unknown profile {v:?} (known: {known})")));
            }
            self.parse.profile = v;
            self.parse.registry = None;
        }
        if let Some(v) = o.registry {
            self.parse.registry = Some(v);
        }
        self.parse.rewrite |= o.rewrite;
        if let Some(v) = o.use_protocol {
            self.parse.use_protocol = v;
        }
        if !o.sinks.is_empty() {
            self.sink.targets = o.sinks.into_iter().map(SinkTarget).collect();
        }
        if let Some(v) = o.idle_timeout {
            self.upstream.idle_timeout = seconds("--idle-timeout", v)?;
        }
        if let Some(v) = o.first_byte_timeout {
            self.upstream.first_byte_timeout = seconds("--first-byte-timeout", v)?;
        }
        if let Some(v) = o.connect_timeout {
            self.upstream.connect_timeout = seconds("--connect-timeout", v)?;
        }
        if let Some(v) = o.grace {
            self.limits.grace = seconds("--grace", v)?;
        }
        if let Some(v) = o.max_streams {
            self.limits.max_streams = count("--max-streams", v)?;
        }
        if let Some(v) = o.max_line {
            self.limits.max_line = count("--max-line", v)?;
        }
        if let Some(v) = o.max_request_body {
            self.limits.max_request_body = v;
        }
        if let Some(v) = o.max_response_body {
            self.limits.max_response_body = v;
        }
        if let Some(v) = o.sink_queue {
            self.sink.queue = count("--sink-queue", v)?;
        }
        if let Some(v) = o.log {
            self.log = v;
        }
        if let Some(v) = o.otel_endpoint {
            self.otel.endpoint = Some(v);
        }
        self.ui.enabled |= o.ui;
        if let Some(v) = o.ui_listen {
            self.ui.listen = v;
        }
        if let Some(v) = o.tool_protocol {
            if !TOOL_PROTOCOLS.contains(&v) {
                let known = tool_protocol_names();
                return Err(SettingsError::key("--tool-protocol", format!("expected one of {known}")));
            }
            self.tools.protocol = Some(v);
        }
        if let Some(v) = o.invalid_calls {
            self.tools.invalid_calls = v;
        }
        self.tools.agent |= o.agent;
        if let Some(v) = o.tools {
            self.tools.dir = Some(v);
        }
        if let Some(v) = o.agent_max_steps {
            self.tools.agent_max_steps = count("--agent-max-steps", v)?;
        }
        if let Some(v) = o.agent_max_tool_calls {
            self.tools.agent_max_tool_calls = v;
        }
        if let Some(v) = o.agent_max_time {
            self.tools.agent_max_time = seconds("--agent-max-time", v)?;
        }
        if let Some(v) = o.agent_async_tasks {
            self.tools.agent_async_tasks = v;
        }
        if !o.agent_tools.is_empty() {
            self.tools.agent_tools = o.agent_tools;
        }
        if let Some(v) = o.tool_timeout_ms {
            self.tools.timeout_ms = NonZeroU64::new(v)
                .ok_or_else(|| SettingsError::key("--tool-timeout-ms", "expected a number above 0"))?;
        }
        if let Some(v) = o.tool_path {
            self.tools.path = Some(v);
        }
        if !o.tool_env.is_empty() {
            self.tools.env = o.tool_env;
        }
        if !o.allowed_hosts.is_empty() {
            self.access.allowed_hosts = o
                .allowed_hosts
                .iter()
                .map(|h| AllowedHost::new(h).map_err(|m| SettingsError::key("--allowed-host", m)))
                .collect::<Result<_, _>>()?;
        }
        if !o.allow_origins.is_empty() {
            self.access.allow_origins = o
                .allow_origins
                .iter()
                .map(|h| AllowedOrigin::new(h).map_err(|m| SettingsError::key("--allow-origin", m)))
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = o.request_timeout {
            self.limits.request_timeout = seconds("--request-timeout", v)?;
        }
        if let Some(v) = o.max_connections {
            self.limits.max_connections = count("--max-connections", v)?;
        }
        if let Some(v) = o.max_request_buffer {
            self.limits.max_request_buffer = v;
        }
        if let Some(v) = o.max_ws_message {
            self.limits.max_ws_message = count("--max-ws-message", v)?;
        }
        self.settle(profile_given);
        Ok(())
    }

    /// The effective configuration as TOML, readable by `--config`.
    /// Secrets are left out (a comment says which are set), and passwords
    /// in URLs (the upstream's, the sinks') are masked.
    pub fn to_toml(&self) -> String {
        let mut out = String::from("# spindle proxy: the effective configuration\n");
        let mut shown = self.clone();
        shown.upstream.url = shown.upstream.url.as_deref().map(crate::proxy::sink::nats::mask_url);
        match toml::to_string_pretty(&shown) {
            Ok(text) => out.push_str(&text),
            Err(e) => out.push_str(&format!("# cannot print the configuration: {e}\n")),
        }
        for (key, var, set) in [
            ("upstream.api_key", "SPINDLE_UPSTREAM_API_KEY", self.upstream.api_key.is_some()),
            ("sink.nats_token", "SPINDLE_NATS_TOKEN", self.sink.nats_token.is_some()),
            ("ui.token", "SPINDLE_UI_TOKEN", self.ui.token.is_some()),
        ] {
            let state = if set { "set, not printed" } else { "not set" };
            out.push_str(&format!("# {key}: {state} (secret; from {var})\n"));
        }
        out
    }

    /// The registry the settings name (a file, or a profile).
    ///
    /// # Errors
    ///
    /// The registry file cannot be loaded.
    pub fn registry(&self) -> Result<Registry, SettingsError> {
        if let Some(path) = &self.parse.registry {
            return Registry::load(path).map_err(|e| {
                SettingsError::key("parse.registry", format!("{}: {}", path.display(), crate::sources::error_chain(&e)))
            });
        }
        Registry::profile(&self.parse.profile).ok_or_else(|| {
            let known = Registry::profile_names().join(", ");
            SettingsError::key("parse.profile", format!("unknown profile {:?} (known: {known})", self.parse.profile))
        })
    }

    /// The proxy configuration: registry loaded, sinks given the NATS
    /// token, limits set.
    ///
    /// # Errors
    ///
    /// No upstream URL, or the registry file cannot be loaded.
    pub fn to_proxy_config(&self) -> Result<ProxyConfig, SettingsError> {
        let Some(url) = &self.upstream.url else {
            return Err(SettingsError::key("upstream.url", "no upstream: set it in the file or give --upstream URL"));
        };
        if self.tools.agent {
            let missing = match (&self.tools.protocol, &self.tools.dir) {
                (None, _) => Some("tools.protocol (--tool-protocol)"),
                (_, None) => Some("tools.dir (--tools DIR)"),
                _ => None,
            };
            if let Some(missing) = missing {
                return Err(SettingsError::key("tools.agent", format!("the agent loop needs {missing}")));
            }
        }
        let mut options = StreamOptions::with_registry(self.registry()?);
        options.sse.max_line_len = self.limits.max_line.get();
        options.sse.max_event_len = self.limits.max_line.get();
        let mut config = ProxyConfig::new(url.clone());
        config.options = options;
        config.rewrite = self.parse.rewrite;
        config.use_protocol = self.parse.use_protocol;
        config.upstream_api_key = self.upstream.api_key.clone();
        config.idle_timeout = self.upstream.idle_timeout.duration();
        config.first_byte_timeout = self.upstream.first_byte_timeout.duration();
        config.connect_timeout = self.upstream.connect_timeout.duration();
        config.grace = self.limits.grace.duration();
        config.max_streams = self.limits.max_streams.get();
        config.max_request_body = self.limits.max_request_body;
        config.max_response_body = self.limits.max_response_body;
        config.channel_capacity = self.limits.channel_capacity.get();
        config.sink_queue = self.sink.queue.get();
        config.request_timeout = self.limits.request_timeout.duration();
        config.max_connections = self.limits.max_connections.get();
        config.max_request_buffer = self.limits.max_request_buffer;
        config.max_ws_message = self.limits.max_ws_message.get();
        config.allowed_hosts = self.access.allowed_hosts.iter().map(|h| h.0.clone()).collect();
        config.allow_origins = self.access.allow_origins.iter().map(|o| o.0.clone()).collect();
        config.tool_calling = self.tools.tool_calling();
        if self.ui.enabled {
            config.ui = Some(super::UiConfig {
                listen: self.ui.listen.clone(),
                token: self.ui.token.as_ref().map(|t| t.expose().to_string()),
                recent: self.ui.recent.get(),
                max_stream_bytes: self.ui.max_stream_bytes,
            });
        }
        #[cfg(feature = "otel")]
        if self.otel.endpoint.is_some() || self.otel.from_env {
            config.otel =
                Some(super::OtelConfig { endpoint: self.otel.endpoint.clone(), system: self.otel.system.clone() });
        }
        config.sinks = self
            .sink
            .targets
            .iter()
            .map(|t| match (&t.0, &self.sink.nats_token) {
                (SinkSpec::Nats(nats), Some(token)) => SinkSpec::Nats(nats.clone().with_token(token.expose())),
                (spec, _) => spec.clone(),
            })
            .collect();
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        ProxySettings::from_toml(text, "p.toml").unwrap_err().to_string()
    }

    #[test]
    fn bad_files_name_the_line_and_the_key() {
        for (text, want) in [
            ("listen = 1\n", "config p.toml, line 1: listen: invalid type: integer `1`, expected a string"),
            (
                "\n[limits]\nmax_stream = 5\n",
                "config p.toml, line 3: limits.max_stream: unknown field `max_stream`, expected one of `max_streams`, `max_line`, `max_request_body`, `max_response_body`, `grace`, `channel_capacity`",
            ),
            (
                "[upstream]\nidle_timeout = -1\n",
                "config p.toml, line 2: upstream.idle_timeout: expected a positive number of seconds",
            ),
            (
                "[sink]\ntargets = [\"kafka:x\"]\n",
                "config p.toml, line 2: sink.targets[0]: bad sink \"kafka:x\": unknown sink kind (expected jsonl:FILE, webhook:URL or nats://HOST:PORT/SUBJECT)",
            ),
            ("[parse]\nprofile = \"nope\"\n", "config p.toml, line 2: parse.profile: unknown profile \"nope\""),
            ("[limits\n", "config p.toml, line 1: "),
            ("colour = \"red\"\n", "config p.toml, line 1: colour: unknown field `colour`"),
        ] {
            let got = err(text);
            assert!(got.starts_with(want), "{text:?}:\n got {got}\nwant {want}");
            assert!(!got.contains('\n'), "{got}");
        }
    }

    #[test]
    fn printed_config_reads_back_and_hides_secrets() {
        let text = "listen = \"0.0.0.0:9\"\n[upstream]\nurl = \"http://u:upw@u\"\napi_key = \"sk-file\"\nidle_timeout = 5\n\
                    [sink]\ntargets = [\"nats://user:pw@h:4222/s?instance=a\", \"jsonl:x.jsonl\"]\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        s.apply_env(|v| (v == "SPINDLE_NATS_TOKEN").then(|| "s3cr3t-t0k".to_string()));
        let printed = s.to_toml();
        for secret in ["sk-file", "s3cr3t-t0k", ":pw@", "upw"] {
            assert!(!printed.contains(secret), "{secret} in\n{printed}");
        }
        assert!(printed.contains("# upstream.api_key: set, not printed"), "{printed}");
        let back = ProxySettings::from_toml(&printed, "printed").unwrap();
        assert_eq!(back.listen, "0.0.0.0:9");
        assert_eq!(back.upstream.idle_timeout, Seconds(5.0));
        assert_eq!(back.sink.targets.len(), 2);
        let body = |t: &str| t.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
        assert_eq!(body(&back.to_toml()), body(&printed));
    }

    #[test]
    fn tool_calling_and_the_agent_have_keys() {
        let text = "[upstream]\nurl = \"http://u\"\n[tools]\nprotocol = \"tam\"\ninvalid_calls = \"drop\"\n\
                    agent = true\ndir = \"plugins\"\nagent_max_steps = 3\ntimeout_ms = 250\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        // The profile that reads the protocol's calls, as with --tool-protocol.
        assert_eq!(s.parse.profile, "tam");
        let config = s.to_proxy_config().unwrap();
        assert_eq!(
            config.tool_calling,
            Some(ToolCalling { protocol: Protocol::Tam, invalid_calls: InvalidCalls::Drop })
        );
        assert_eq!((s.tools.agent_limits().max_steps, s.tools.timeout()), (3, Duration::from_millis(250)));
        // Printed, it reads back the same.
        let back = ProxySettings::from_toml(&s.to_toml(), "printed").unwrap();
        assert_eq!(back.to_toml(), s.to_toml());
        // Flags beat the file; a profile given keeps its choice.
        let o = ProxyOverrides {
            tool_protocol: Some(Protocol::Hermes),
            profile: Some("filament".into()),
            agent_max_steps: Some(5),
            ..ProxyOverrides::default()
        };
        s.apply(o).unwrap();
        assert_eq!(
            (s.tools.protocol, s.parse.profile.as_str(), s.tools.agent_max_steps.get()),
            (Some(Protocol::Hermes), "filament", 5)
        );
        // The agent needs a directory and a protocol.
        let no_dir = ProxySettings::from_toml(
            "[upstream]\nurl = \"http://u\"\n[tools]\nprotocol = \"hermes\"\nagent = true\n",
            "t",
        );
        assert!(
            no_dir
                .unwrap()
                .to_proxy_config()
                .unwrap_err()
                .to_string()
                .contains("tools.agent: the agent loop needs tools.dir")
        );
        assert!(err("[tools]\nprotocol = \"attp\"\n").contains("tools.protocol: unknown tool protocol \"attp\""));
        assert!(err("[tools]\ninvalid_calls = \"keep\"\n").contains("tools.invalid_calls: unknown variant `keep`"));
    }

    #[test]
    fn the_tools_path_has_a_key_and_a_flag() {
        let s = ProxySettings::from_toml("[upstream]\nurl = \"http://u\"\n", "t").unwrap();
        assert_eq!(s.tools.path, None);
        assert_eq!(s.tools.tool_path(), crate::tools::RunnerOptions::inherited_path());
        assert!(!s.to_toml().contains("path ="), "not printed when not set");
        let mut s =
            ProxySettings::from_toml("[upstream]\nurl = \"http://u\"\n[tools]\npath = \"/opt/x/bin\"\n", "t").unwrap();
        assert_eq!(s.tools.tool_path(), "/opt/x/bin");
        let back = ProxySettings::from_toml(&s.to_toml(), "printed").unwrap();
        assert_eq!(back.tools.path.as_deref(), Some("/opt/x/bin"));
        s.apply(ProxyOverrides { tool_path: Some("/flag/bin".into()), ..ProxyOverrides::default() }).unwrap();
        assert_eq!(s.tools.tool_path(), "/flag/bin", "the flag wins");
    }

    #[test]
    fn the_tools_env_has_a_key_and_a_flag() {
        let s = ProxySettings::from_toml("[upstream]\nurl = \"http://u\"\n", "t").unwrap();
        assert!(s.tools.env.is_empty());
        assert!(!s.to_toml().contains("env ="), "not printed when empty");
        let text = "[upstream]\nurl = \"http://u\"\n[tools]\nenv = [\"HOME\", \"MODE=test\"]\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        assert_eq!(s.tools.env, ["HOME", "MODE=test"]);
        let back = ProxySettings::from_toml(&s.to_toml(), "printed").unwrap();
        assert_eq!(back.tools.env, ["HOME", "MODE=test"]);
        s.apply(ProxyOverrides { tool_env: vec!["LANG".into()], ..ProxyOverrides::default() }).unwrap();
        assert_eq!(s.tools.env, ["LANG"], "the flags replace the list");
    }

    #[test]
    fn agent_async_tasks_has_a_key_and_a_flag() {
        use crate::tools::agent::AsyncTasks;
        let s = ProxySettings::from_toml("[upstream]\nurl = \"http://u\"\n", "t").unwrap();
        assert_eq!(s.tools.agent_async_tasks, AsyncTasks::Continue);
        assert!(s.to_toml().contains("agent_async_tasks = \"continue\""), "{}", s.to_toml());
        let text = "[upstream]\nurl = \"http://u\"\n[tools]\nagent_async_tasks = \"wait\"\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        assert_eq!(s.tools.agent_async_tasks, AsyncTasks::Wait);
        s.apply(ProxyOverrides { agent_async_tasks: Some(AsyncTasks::Continue), ..ProxyOverrides::default() }).unwrap();
        assert_eq!(s.tools.agent_async_tasks, AsyncTasks::Continue, "the flag wins");
        let bad = ProxySettings::from_toml("[tools]\nagent_async_tasks = \"later\"\n", "t").unwrap_err().to_string();
        assert!(bad.contains("tools.agent_async_tasks: unknown variant `later`"), "{bad}");
    }

    #[test]
    fn agent_tools_and_use_protocol_have_keys_and_flags() {
        let s = ProxySettings::from_toml("[upstream]\nurl = \"http://u\"\n", "t").unwrap();
        assert!(s.tools.agent_tools.is_empty());
        assert_eq!(s.parse.use_protocol, UseProtocol::Auto);
        let text = "[upstream]\nurl = \"http://u\"\n[parse]\nuse_protocol = \"ignore\"\n[tools]\nagent_tools = [\"Echo\", \"Greet\"]\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        assert_eq!(s.tools.agent_tools, ["Echo", "Greet"]);
        assert_eq!(s.parse.use_protocol, UseProtocol::Ignore);
        assert!(s.to_toml().contains("agent_tools = ["), "{}", s.to_toml());
        s.apply(ProxyOverrides {
            agent_tools: vec!["Echo".into()],
            use_protocol: Some(UseProtocol::Auto),
            ..ProxyOverrides::default()
        })
        .unwrap();
        assert_eq!(s.tools.agent_tools, ["Echo"], "the flag wins");
        assert_eq!(s.to_proxy_config().unwrap().use_protocol, UseProtocol::Auto);
        let bad = ProxySettings::from_toml("[parse]\nuse_protocol = \"sometimes\"\n", "t").unwrap_err().to_string();
        assert!(bad.contains("parse.use_protocol: unknown variant `sometimes`"), "{bad}");
    }

    #[test]
    fn access_and_client_limits_have_keys() {
        let text = "[upstream]\nurl = \"http://u\"\n[limits]\nrequest_timeout = 5\nmax_connections = 64\n\
                    max_request_buffer = 67108864\nmax_ws_message = 65536\n[access]\nallowed_hosts = [\"Proxy.LAN.\", \"[::1]\"]\n\
                    allow_origins = [\"https://App.example/\"]\n";
        let mut s = ProxySettings::from_toml(text, "t").unwrap();
        let config = s.to_proxy_config().unwrap();
        assert_eq!(config.allowed_hosts, ["proxy.lan", "::1"]);
        assert_eq!(config.allow_origins, ["https://app.example"]);
        assert_eq!(
            (config.request_timeout, config.max_connections, config.max_request_buffer),
            (Duration::from_secs(5), 64, 64 << 20)
        );
        assert_eq!(config.max_ws_message, 65536);
        let back = ProxySettings::from_toml(&s.to_toml(), "printed").unwrap();
        assert_eq!(back.to_toml(), s.to_toml());
        // Flags replace the file's lists and are checked, naming the flag.
        let o = ProxyOverrides { allow_origins: vec!["*".into()], ..ProxyOverrides::default() };
        s.apply(o).unwrap();
        assert_eq!(s.to_proxy_config().unwrap().allow_origins, ["*"]);
        let bad = ProxyOverrides { allowed_hosts: vec!["proxy.lan:8787".into()], ..ProxyOverrides::default() };
        assert!(s.apply(bad).unwrap_err().to_string().starts_with("config: --allowed-host: \"proxy.lan:8787\" is not"));
        let bad = ProxyOverrides { max_connections: Some(0), ..ProxyOverrides::default() };
        assert!(s.apply(bad).is_err());
        assert!(
            err("[access]\nallow_origins = [\"app.example\"]\n")
                .starts_with("config p.toml, line 2: access.allow_origins[0]: \"app.example\" is not a browser origin")
        );
        assert!(err("[access]\nallowed_hosts = [\"https://x\"]\n").contains("access.allowed_hosts[0]"));
    }

    #[test]
    fn flags_beat_the_file() {
        let mut s =
            ProxySettings::from_toml("[parse]\nregistry = \"r.toml\"\n[limits]\nmax_streams = 3\n", "t").unwrap();
        let o = ProxyOverrides { profile: Some("filament".into()), max_streams: Some(7), ..ProxyOverrides::default() };
        s.apply(o).unwrap();
        assert_eq!(
            (s.parse.profile.as_str(), s.parse.registry.as_ref(), s.limits.max_streams.get()),
            ("filament", None, 7)
        );
        let bad = ProxyOverrides { grace: Some(0.0), ..ProxyOverrides::default() };
        assert_eq!(s.apply(bad).unwrap_err().to_string(), "config: --grace: expected a positive number of seconds");
        assert!(s.to_proxy_config().unwrap_err().to_string().contains("upstream.url: no upstream"));
    }
}
