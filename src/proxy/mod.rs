//! The pipe-through proxy (DESIGN §8): `spindle proxy --upstream URL`.
//!
//! This module owns an OpenAI-compatible reverse proxy that forwards every
//! `/v1/*` request (and every other versioned API path, such as Gemini's
//! `/v1beta/*`, and Ollama's own `/api/*`) to one upstream unchanged and
//! parses the model output
//! of the responses on the side, with the [`crate::sources`] stream model,
//! sending parsed elements to sinks and counting everything in `/metrics`.
//! It must not change what the client receives, except for the documented
//! cases: `--rewrite`, and error events at the end of a broken stream. It
//! does not parse SSE or chunks itself (that is [`crate::sources`]'s).
//!
//! # What is forwarded, and how
//!
//! * Method, path, query, body and every header except the hop-by-hop
//!   ones (`Connection` and those it names, `Keep-Alive`, `TE`,
//!   `Transfer-Encoding`, `Upgrade`, `Proxy-*`) and `Host`; status and
//!   response headers the same way, but the upstream's `Access-Control-*`
//!   headers, which never reach the client. The upstream URL is the upstream's
//!   origin and path, then the request path: `--upstream
//!   http://127.0.0.1:8080` sends `/v1/chat/completions` to
//!   `http://127.0.0.1:8080/v1/chat/completions`. An upstream path that
//!   names an API version is the API's base URL, as an OpenAI SDK takes
//!   it, and replaces the request's `/v1`:
//!   `https://openrouter.ai/api/v1`, `https://open.bigmodel.cn/api/paas/v4`
//!   and `https://generativelanguage.googleapis.com/v1beta/openai` get
//!   `/chat/completions` after them. Any other path is a prefix
//!   (`http://gateway/llm` gets `/llm/v1/chat/completions`).
//! * WebSockets (OpenAI's Realtime API, `GET /v1/realtime?model=...`, and
//!   any other handshake on a forwarded path): the proxy opens the upstream
//!   WebSocket at the same URL first (`ws`/`wss` for `http`/`https`), with
//!   the end-to-end headers above, the client's `Sec-WebSocket-Protocol`
//!   list as offered and the upstream key when the client sent no
//!   `Authorization`, and answers the client's handshake only once the
//!   upstream accepted, with the subprotocol it chose; an upstream refusal
//!   reaches the client as it came. Messages (text, binary, ping, pong,
//!   close with code and reason) are relayed both ways unchanged, one at a
//!   time; fragmentation and extensions are not kept. The upstream's
//!   Realtime text and audio-transcript deltas are parsed on the side, a
//!   stream per response. Details in the `websocket` module's
//!   documentation.
//! * Model endpoints (`/chat/completions`, `/completions`, `/responses`,
//!   `/messages`, Gemini's `:generateContent` and `:streamGenerateContent`,
//!   Ollama's `/api/chat` and `/api/generate`) are asked for
//!   `Accept-Encoding: identity`, so the proxy can read them; other bodies
//!   pass through as they are (compressed or not). The proxy never
//!   compresses.
//! * SSE responses (`text/event-stream`), and JSON lines
//!   (`application/x-ndjson`, read by a [`crate::sources::LineTap`]):
//!   every upstream read is written
//!   to the client before the next is read (no coalescing), with
//!   `Cache-Control: no-cache` and `X-Accel-Buffering: no`, on sockets with
//!   `TCP_NODELAY`. The upstream is read by the client's own connection
//!   (its response body runs the relay), with a queue of at most
//!   [`ProxyConfig::channel_capacity`] items in between: a client that
//!   reads slowly slows the upstream down, it does not fill the proxy's
//!   memory.
//! * Parsing on the side: 2xx SSE bodies and 2xx JSON bodies of model
//!   endpoints go through the stream model; elements, repairs, diagnostics,
//!   tool-call fragments and the stream-level events go to the sinks
//!   ([`SinkSpec`]: a JSONL file, a webhook, a NATS broker ([`nats`]), a
//!   channel).
//! * Who may call: both listeners answer only to the `Host` names they
//!   allow (loopback names on a loopback listener, plus
//!   [`ProxyConfig::allowed_hosts`]), and the proxy serves browser pages of
//!   the [`ProxyConfig::allow_origins`] only (CORS preflights answered by
//!   the proxy); requests without `Origin` are not a browser page's and
//!   pass. The reasons, and the details, are in the `policy` module's
//!   documentation.
//! * Clients: HTTP/1.1; a request head must arrive within
//!   [`ProxyConfig::request_timeout`], at most
//!   [`ProxyConfig::max_connections`] connections are open per listener
//!   (more wait to be accepted).
//! * Configuration: [`ProxyConfig`] in code; the `spindle proxy` file,
//!   flags and environment are [`ProxySettings`].
//! * An upstream API key ([`ProxyConfig::upstream_api_key`], from
//!   `SPINDLE_UPSTREAM_API_KEY`) is added as `Authorization: Bearer KEY`
//!   to requests that have no `Authorization` header.
//! * `--rewrite` ([`ProxyConfig::rewrite`]): chat-completion streams carry
//!   the corrected content instead of the raw one (synthetic closes in the
//!   finish chunk, or in one more chunk before `[DONE]` when the stream had
//!   no finish reason; merged tags removed). Chunk `id`, `model`,
//!   `created`, usage and every other field stay as they came; whole
//!   responses get `message.content` replaced and a new `Content-Length`.
//! * `<use_protocol>` ([`ProxyConfig::use_protocol`]): a request whose
//!   system prompt declares protocols (spec 003 §11.2) is parsed with the
//!   registry they build ([`crate::registry::registry_for`]) in place of
//!   the configured one; its body goes upstream unchanged.
//! * `--tool-protocol hermes|filament|tam|action`
//!   ([`ProxyConfig::tool_calling`]): a chat request with `tools` has them
//!   rendered as the protocol's manual in its system message, and its
//!   response's call text comes back as `tool_calls` (streamed and whole);
//!   requests without tools are passed through as before. See
//!   [`calling`].
//!
//! # Faults
//!
//! | what happens | the client gets |
//! |---|---|
//! | upstream unreachable, reset or not HTTP before any body byte | `502` with `{"error":{"message","type","param","code","side","retryable"}}` |
//! | no response head or first byte within [`ProxyConfig::first_byte_timeout`] | `504`, same body |
//! | upstream answers an error status, or HTML | the upstream's status and body unchanged (counted in `/metrics`) |
//! | reset, stall past the idle timeout, after the first byte | an in-band `data: {"error":{...}}` event, then `data: [DONE]` |
//! | a chat stream that ends without `[DONE]` | an `upstream_truncated` error event (unless the upstream sent its own error), then `data: [DONE]` |
//! | the client goes away | the upstream request is dropped at once (its connection closed) |
//! | more than [`ProxyConfig::max_streams`] requests in flight | `503` with `Retry-After: 1` |
//! | a request body larger than [`ProxyConfig::max_request_body`] | `413` |
//! | a `Host` the listener does not answer to, an `Origin` the proxy does not serve (or its preflight) | `403` (`host_not_allowed`, `origin_not_allowed`) |
//! | a client silent for [`ProxyConfig::request_timeout`] mid-body | `408` (`request_timeout`) |
//! | buffered request bodies past [`ProxyConfig::max_request_buffer`] | `503` with `Retry-After: 1` (`proxy_request_buffer_full`) |
//! | a client silent for [`ProxyConfig::request_timeout`] before or inside a request head | the connection is closed |
//! | a path outside `/v1/` | `404` (`/healthz` and `/metrics` are the proxy's own) |
//! | a WebSocket handshake without a key, or not version 13 | `400` (`websocket_handshake_invalid`) |
//! | the upstream refuses a WebSocket handshake | its status, headers and body; the client gets no `101` |
//! | a WebSocket message (or frame) over [`ProxyConfig::max_ws_message`] | close `1009` to both sides |
//! | one side of a WebSocket vanishes without a close frame | the other gets close `1001` (client gone) or `1014` (upstream gone) |
//! | shutdown while WebSocket sessions are open | after the grace period, close `1001` to both sides |
//! | an SSE line past [`crate::sources::SseLimits`] | forwarded unparsed, a `diagnostic` counted (rewrite: the event cannot be forwarded; a `proxy_line_too_long` error event takes its place) |
//!
//! Every error names its side (`upstream`, `downstream`, `internal`) and
//! whether a retry may help ([`ProxyError`]).
//!
//! # Example
//!
//! ```no_run
//! use spindle::proxy::{ProxyConfig, ProxyServer};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = ProxyConfig::new("https://api.openai.com");
//! config.rewrite = true;
//! let server = ProxyServer::bind(config, "127.0.0.1:8787").await?;
//! println!("listening on {}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

mod agent;
mod app;
mod body;
pub mod calling;
mod error;
mod inspect;
mod listen;
mod metrics;
#[cfg(feature = "otel")]
mod otel;
mod policy;
mod protocols;
mod pump;
mod relay;
#[cfg(feature = "testing")]
pub(crate) mod selfcheck;
mod server;
mod settings;
mod sink;
mod trace;
mod websocket;

pub use agent::ProxyAgent;
pub use calling::{InvalidCalls, TOOL_PROTOCOLS, ToolCalling};
pub use error::{ProxyError, ProxyErrorKind, Side};
pub use inspect::UiConfig;
pub use metrics::Metrics;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub use otel::{OtelConfig, OtelError};
pub use protocols::UseProtocol;
pub use server::{ProxyHandle, ProxyServer, ProxyStartError};
pub use settings::{
    AccessSettings, AllowedHost, AllowedOrigin, LimitSettings, OtelSettings, ParseSettings, ProxyOverrides,
    ProxySettings, Seconds, Secret, SettingsError, SinkSettings, SinkTarget, ToolSettings, UiSettings,
    UpstreamSettings,
};
pub use sink::nats;
pub use sink::nats::{NatsSink, NatsSpecError};
pub use sink::{Overflow, SinkRecord, SinkSpec, SinkSpecError, SinkStartError, WEBHOOK_BATCH, is_sink_event};

use crate::sources::StreamOptions;
use std::time::Duration;

/// The configuration of a proxy. Every limit has a default that suits a
/// proxy in front of one LLM API.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The upstream base URL (`http://127.0.0.1:8080`,
    /// `https://api.openai.com`, `https://openrouter.ai/api/v1`).
    pub upstream: String,
    /// The parse options: registry (default profile `reasoning`), parser
    /// and SSE limits.
    pub options: StreamOptions,
    /// Send corrected content instead of the raw content.
    pub rewrite: bool,
    /// Whether a request whose system prompt declares `<use_protocol>`
    /// (spec 003 §11.2) is parsed with the registry the declarations build
    /// ([`crate::registry::registry_for`]) in place of `options.registry`
    /// (default [`UseProtocol::Auto`]).
    pub use_protocol: UseProtocol,
    /// An API key sent upstream as `Authorization: Bearer KEY` on requests
    /// that carry no `Authorization` of their own (default none).
    pub upstream_api_key: Option<Secret>,
    /// Translate OpenAI tool calling to and from a text protocol
    /// (`--tool-protocol`, see [`calling`]); `None` (the default) leaves
    /// requests and responses alone.
    pub tool_calling: Option<ToolCalling>,
    /// Run the agent loop for requests without tools of their own, with
    /// the tools the proxy owns (`--tools DIR --agent`, see
    /// [`ProxyAgent`]); needs `tool_calling` for the protocol. Default none.
    pub agent: Option<ProxyAgent>,
    /// The live stream inspector page on its own listener
    /// (`--ui`, see [`UiConfig`]); `None` (the default) serves no page.
    pub ui: Option<UiConfig>,
    /// Export a trace span per chat request over OTLP/HTTP (see
    /// [`OtelConfig`]); `None` (the default) exports nothing.
    #[cfg(feature = "otel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
    pub otel: Option<OtelConfig>,
    /// Where parsed records go.
    pub sinks: Vec<SinkSpec>,
    /// The longest wait for any read of a response body after its first
    /// byte: a stream silent this long is stalled (default 60 s).
    pub idle_timeout: Duration,
    /// The longest wait for the upstream's response head and the first
    /// byte of its body (default 600 s, the OpenAI client's own timeout): a
    /// non-streamed answer or a long prompt's prefill may take minutes
    /// before the first byte.
    pub first_byte_timeout: Duration,
    /// The longest wait for a connection to the upstream (default 10 s).
    pub connect_timeout: Duration,
    /// How long running responses may go on after a shutdown was asked
    /// (default 30 s).
    pub grace: Duration,
    /// Most requests in flight; more get `503` (default 4096).
    pub max_streams: usize,
    /// Largest request body of a model endpoint, buffered to read its
    /// `model` (default 32 MiB; more gets `413`).
    pub max_request_body: usize,
    /// Largest whole JSON response that is parsed (or rewritten); larger
    /// ones are forwarded unparsed (rewrite: `502`). Default 16 MiB.
    pub max_response_body: usize,
    /// Items (upstream reads, rewritten chunks) queued between the relay
    /// and the client's connection (default 16).
    pub channel_capacity: usize,
    /// Records queued per sink before records are dropped (default 10,000).
    pub sink_queue: usize,
    /// `Host` names the listeners answer to besides the loopback ones
    /// (`--allowed-host`; host names or IP addresses, no port). A listener
    /// bound to a loopback address answers only to loopback names and
    /// these; one bound to another address answers to any name while this
    /// is empty (the default), else to these and the loopback ones. Others
    /// get `403` (against DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Browser origins whose pages may call the proxy (`--allow-origin`:
    /// `https://app.example.com`, `*` for any). A request with another
    /// `Origin` gets `403`; one without `Origin` (not a browser page's) is
    /// not affected. Default none.
    pub allow_origins: Vec<String>,
    /// The longest wait for a client: for each request head (and on an
    /// idle keep-alive connection, for the next one: the connection is
    /// closed), and for each read of a request body the proxy buffers (then
    /// `408`). Default 30 s.
    pub request_timeout: Duration,
    /// Most client connections open at once, per listener; past it, new
    /// connections wait to be accepted (default 1024). Fewer when the
    /// process's open-file limit has no room for them: two descriptors a
    /// connection, 64 kept for the rest (the log says so).
    pub max_connections: usize,
    /// Most bytes of request bodies buffered at once, across requests
    /// (default 256 MiB; at least [`ProxyConfig::max_request_body`]); a
    /// body that does not fit gets `503` with `Retry-After`.
    pub max_request_buffer: usize,
    /// Largest WebSocket message (and frame) relayed, either way, in bytes
    /// (default 16 MiB): a larger one ends the session with close code
    /// `1009` (message too big) to both sides.
    pub max_ws_message: usize,
}

impl ProxyConfig {
    /// A configuration for `upstream` with the defaults.
    pub fn new(upstream: impl Into<String>) -> ProxyConfig {
        ProxyConfig {
            upstream: upstream.into(),
            options: StreamOptions::default(),
            rewrite: false,
            use_protocol: UseProtocol::Auto,
            upstream_api_key: None,
            tool_calling: None,
            agent: None,
            ui: None,
            #[cfg(feature = "otel")]
            otel: None,
            sinks: Vec::new(),
            idle_timeout: Duration::from_secs(60),
            first_byte_timeout: Duration::from_secs(600),
            connect_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(30),
            max_streams: 4096,
            max_request_body: 32 * 1024 * 1024,
            max_response_body: 16 * 1024 * 1024,
            channel_capacity: 16,
            sink_queue: 10_000,
            allowed_hosts: Vec::new(),
            allow_origins: Vec::new(),
            request_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_request_buffer: 256 * 1024 * 1024,
            max_ws_message: 16 * 1024 * 1024,
        }
    }
}

/// `s` cut to at most `max` bytes (at a character boundary) with `…` after
/// the cut, for a name a client sends that is kept or shown (a model name
/// in records and the inspector).
pub(crate) fn clipped(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::clipped;

    #[test]
    fn a_clipped_name_ends_at_a_character_boundary() {
        assert_eq!(clipped("gpt-4o", 256), "gpt-4o");
        assert_eq!(clipped("abcdef", 3), "abc…");
        // `é` is two bytes: a cut inside it moves before it.
        assert_eq!(clipped("aé", 2), "a…");
        assert_eq!(clipped(&"m".repeat(1 << 20), 256).len(), 256 + "…".len());
    }
}
