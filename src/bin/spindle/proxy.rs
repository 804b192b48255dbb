//! `spindle proxy`: the pipe-through proxy of [`spindle::proxy`] with its
//! command-line options, logs and signal handling.

use crate::parse::load_registry;
use anyhow::{Context, Result, bail};
use spindle::proxy::{InvalidCalls, ProxyConfig, ProxyServer, SinkSpec, ToolCalling};
use spindle::sources::StreamOptions;
use spindle::tools::Protocol;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `spindle proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// The upstream base URL (`http://127.0.0.1:8788`, `https://api.openai.com`,
    /// `https://openrouter.ai/api/v1`); `/v1/*` requests go there unchanged.
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8787", value_name = "ADDR")]
    listen: String,
    /// The registry profile the streams are parsed with (`chat`: plain
    /// answers are content, `<think>…</think>` is a thought; `filament`,
    /// `reasoning`, `tam`, `action`, `attp`). Default: `chat`, or with
    /// `--tool-protocol` the profile that reads its calls (`chat` for
    /// hermes and filament, `tam`, `action`).
    #[arg(long, conflicts_with = "registry")]
    profile: Option<String>,
    /// A registry file (TOML, or JSON by extension) instead of a profile.
    #[arg(long, value_name = "FILE")]
    registry: Option<PathBuf>,
    /// Send the corrected content instead of the raw content (synthetic
    /// closes added, merged tags removed; ids, model, created and usage kept).
    #[arg(long)]
    rewrite: bool,
    /// Speak OpenAI tool calling to clients for a model that writes its
    /// calls as text: a request's `tools` become this protocol's manual in
    /// the system message, the answer's calls come back as `tool_calls`.
    /// Requests without tools pass through unchanged.
    #[arg(long, value_enum, value_name = "PROTOCOL")]
    tool_protocol: Option<ToolProtocolArg>,
    /// What happens to a call of a tool the request does not list, or with
    /// arguments its schema rejects: `pass` it on as written (calls stream
    /// as they arrive), or `drop` it and answer its observation (with a
    /// did-you-mean) as content (calls go out whole, once checked).
    #[arg(long, value_enum, default_value = "pass", requires = "tool_protocol")]
    invalid_calls: InvalidCallsArg,
    /// Where parsed elements go: `jsonl:FILE` (appended) or `webhook:URL`
    /// (POSTed as JSON arrays). Repeatable.
    #[arg(long = "sink", value_name = "jsonl:FILE|webhook:URL")]
    sinks: Vec<SinkSpec>,
    /// Seconds of upstream silence (waiting for the head, the first byte or
    /// any later byte) before the request fails (504, or an in-band error
    /// mid-stream).
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    idle_timeout: f64,
    /// Seconds to wait for a connection to the upstream.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    connect_timeout: f64,
    /// Seconds running streams may go on after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    grace: f64,
    /// Most requests in flight; more get 503.
    #[arg(long, default_value_t = 4096, value_name = "N")]
    max_streams: usize,
    /// Longest SSE line (and event) parsed, in bytes; longer ones are
    /// forwarded unparsed and reported.
    #[arg(long, value_name = "BYTES")]
    max_line: Option<usize>,
    /// Largest request body of a model endpoint, in bytes (more gets 413).
    #[arg(long, value_name = "BYTES")]
    max_request_body: Option<usize>,
    /// Largest whole JSON response parsed (or rewritten), in bytes.
    #[arg(long, value_name = "BYTES")]
    max_response_body: Option<usize>,
    /// Records queued per sink before records are dropped.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    sink_queue: usize,
    /// Log level (`error`, `warn`, `info`, `debug`, `trace`); RUST_LOG wins.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log: String,
}

/// `--tool-protocol` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum ToolProtocolArg {
    /// Hermes/Qwen `<tool_call>{"name": …, "arguments": …}</tool_call>`.
    Hermes,
    /// Filament `<tool_call name="…">{…}</tool_call>`.
    Filament,
    /// TAM `<|[REQUEST_TOOL]|>` blocks.
    Tam,
    /// `<ACTION>` blocks.
    Action,
}

/// `--invalid-calls` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum InvalidCallsArg {
    /// Send invalid calls as written.
    Pass,
    /// Leave them out; their observation becomes content.
    Drop,
}

fn seconds(name: &str, secs: f64) -> Result<Duration> {
    if !secs.is_finite() || secs <= 0.0 {
        bail!("--{name} must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Logs to stderr: RUST_LOG when set, else `level`.
pub(crate) fn init_logs(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => futures::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = futures::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("signal received");
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")
}

pub(crate) fn run(args: ProxyArgs) -> Result<ExitCode> {
    init_logs(&args.log);
    let tool_calling = args.tool_protocol.map(|p| {
        let protocol = match p {
            ToolProtocolArg::Hermes => Protocol::Hermes,
            ToolProtocolArg::Filament => Protocol::Filament,
            ToolProtocolArg::Tam => Protocol::Tam,
            ToolProtocolArg::Action => Protocol::Action,
        };
        let invalid_calls = match args.invalid_calls {
            InvalidCallsArg::Pass => InvalidCalls::Pass,
            InvalidCallsArg::Drop => InvalidCalls::Drop,
        };
        ToolCalling { protocol, invalid_calls }
    });
    let profile = match (&args.profile, &tool_calling) {
        (Some(p), _) => p.clone(),
        (None, Some(tc)) => tc.default_profile().to_string(),
        (None, None) => "chat".to_string(),
    };
    let registry = load_registry(&profile, args.registry.as_ref())?;
    let mut options = StreamOptions::with_registry(registry);
    if let Some(n) = args.max_line {
        options.sse.max_line_len = n;
        options.sse.max_event_len = n;
    }
    let mut config = ProxyConfig::new(args.upstream.clone());
    config.options = options;
    config.rewrite = args.rewrite;
    config.tool_calling = tool_calling;
    config.sinks = args.sinks;
    config.idle_timeout = seconds("idle-timeout", args.idle_timeout)?;
    config.connect_timeout = seconds("connect-timeout", args.connect_timeout)?;
    config.grace = seconds("grace", args.grace)?;
    config.max_streams = args.max_streams.max(1);
    config.sink_queue = args.sink_queue.max(1);
    if let Some(n) = args.max_request_body {
        config.max_request_body = n;
    }
    if let Some(n) = args.max_response_body {
        config.max_response_body = n;
    }
    let rewrite = config.rewrite;
    let tools = tool_calling.map(|t| format!(", tool protocol {}", t.protocol)).unwrap_or_default();
    runtime()?.block_on(async move {
        let server = ProxyServer::bind(config, &args.listen).await?;
        let addr = server.local_addr();
        eprintln!(
            "spindle proxy: http://{addr}/v1 -> {} ({}{}{tools}); /healthz, /metrics",
            args.upstream,
            args.registry.as_ref().map_or(format!("profile {profile}"), |r| format!("registry {}", r.display())),
            if rewrite { ", rewriting" } else { "" },
        );
        server.run(shutdown_signal()).await.context("serving")?;
        Ok(ExitCode::SUCCESS)
    })
}
