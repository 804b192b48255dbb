//! `spindle proxy`: the pipe-through proxy of [`spindle::proxy`] with its
//! command-line options, logs and signal handling. The options lie over a
//! configuration file ([`spindle::proxy::ProxySettings`]: its keys, the
//! defaults, the secrets from the environment).

use anyhow::{Context, Result};
use spindle::proxy::{
    InvalidCalls, ProxyAgent, ProxyOverrides, ProxyServer, ProxySettings, SinkSpec, TOOL_PROTOCOLS, UseProtocol,
};
use spindle::tools::{Protocol, Runner, RunnerOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `spindle proxy`.
#[derive(Debug, clap::Args)]
pub(crate) struct ProxyArgs {
    /// The upstream base URL (`http://127.0.0.1:8788`, `https://api.openai.com`,
    /// `https://openrouter.ai/api/v1`); `/v1/*` requests go there unchanged.
    /// A path that names a version (`/v1`, `/api/paas/v4`, `/v1beta/openai`)
    /// is the API's base, as an SDK's `base_url` is, and takes the place of
    /// the request's `/v1`. Required here or as `upstream.url` in the config
    /// file.
    #[arg(long, value_name = "URL", env = "SPINDLE_UPSTREAM")]
    upstream: Option<String>,
    /// Address to listen on (port 0 picks a free port) [default: 127.0.0.1:8787].
    #[arg(long, value_name = "ADDR", env = "SPINDLE_LISTEN")]
    listen: Option<String>,
    /// A configuration file (TOML; every option has a key, options given
    /// here win; secrets from SPINDLE_UPSTREAM_API_KEY, SPINDLE_NATS_TOKEN).
    #[arg(long, value_name = "FILE", env = "SPINDLE_CONFIG")]
    config: Option<PathBuf>,
    /// Print the effective configuration as TOML (secrets left out) and exit.
    #[arg(long)]
    print_config: bool,
    /// The registry profile the streams are parsed with (`chat`: plain
    /// answers are content, `<think>…</think>` is a thought). Default:
    /// `chat`, or with `--tool-protocol` the profile that reads its calls
    /// (`chat` for hermes and filament, `tam`, `action`).
    #[arg(long, conflicts_with = "registry", env = "SPINDLE_PROFILE", value_parser = crate::cli::profile_arg(&[]))]
    profile: Option<String>,
    /// A registry file (TOML, or JSON by extension) instead of a profile.
    #[arg(long, value_name = "FILE", env = "SPINDLE_REGISTRY")]
    registry: Option<PathBuf>,
    /// Send the corrected content instead of the raw content (synthetic
    /// closes added, merged tags removed; ids, model, created and usage kept).
    #[arg(long)]
    rewrite: bool,
    /// Whether a request whose system prompt declares `<use_protocol>`
    /// (Filament, spec 003 §11.2) is parsed with the registry those
    /// declarations build, in place of --profile/--registry [default: auto].
    #[arg(long, value_enum, value_name = "WHEN")]
    use_protocol: Option<UseProtocolArg>,
    /// Speak OpenAI tool calling to clients for a model that writes its
    /// calls as text: a request's `tools` become this protocol's manual in
    /// the system message, the answer's calls come back as `tool_calls`.
    /// Requests without tools pass through unchanged.
    #[arg(long, value_name = "PROTOCOL", env = "SPINDLE_TOOL_PROTOCOL", value_parser = crate::tools::protocol_arg(&TOOL_PROTOCOLS))]
    tool_protocol: Option<Protocol>,
    /// What happens to a call of a tool the request does not list, or with
    /// arguments its schema rejects: `pass` it on as written (calls stream
    /// as they arrive), or `drop` it and answer its observation (with a
    /// did-you-mean) as content (calls go out whole, once checked)
    /// [default: pass].
    #[arg(long, value_enum)]
    invalid_calls: Option<InvalidCallsArg>,
    /// Run the tool loop in the proxy for requests that bring no tools of
    /// their own: the model is taught the tools of --tools DIR, the proxy
    /// runs its calls and sends the observations back, and the client gets
    /// the final answer (intermediate calls and results in a `spindle`
    /// field of the chunks). Needs --tool-protocol and --tools (or their
    /// config keys).
    #[arg(long)]
    agent: bool,
    /// The plugins directory whose tools the agent loop runs (plugin.yaml +
    /// *.tool.json; MCP servers in plugin.yaml or mcp.json are started).
    #[arg(long, value_name = "DIR")]
    tools: Option<PathBuf>,
    /// Most model answers per agent request [default: 8].
    #[arg(long, value_name = "N")]
    agent_max_steps: Option<usize>,
    /// Most tool calls per agent request [default: 32].
    #[arg(long, value_name = "N")]
    agent_max_tool_calls: Option<usize>,
    /// Most seconds per agent request [default: 600].
    #[arg(long, value_name = "SECS")]
    agent_max_time: Option<f64>,
    /// What the agent loop does with async tools' tasks: `continue` (the
    /// model goes on; a result comes with a later turn, and a task still
    /// running at the final answer is stopped) or `wait` (wait for a
    /// turn's tasks, within the time budget, and send their results before
    /// asking again) [default: continue].
    #[arg(long, value_enum, value_name = "MODE")]
    agent_async_tasks: Option<crate::agent::AsyncTasksArg>,
    /// Only these tools of --tools (comma-separated ids) for the agent
    /// loop: its manual shows them alone, and a call of another tool is
    /// an unknown tool, never run [default: all].
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    agent_tools: Vec<String>,
    /// A tool's time limit unless its definition sets one, in milliseconds
    /// [default: 30000].
    #[arg(long, value_name = "MS")]
    tool_timeout_ms: Option<u64>,
    /// The PATH the agent's tools (scripts, MCP servers) see and their bare
    /// program names are looked up in [default: the PATH spindle was
    /// started with, else /usr/local/bin:/usr/bin:/bin]. The rest of the
    /// environment is not passed on (see --tool-env).
    #[arg(long, value_name = "PATH")]
    tool_path: Option<String>,
    /// More environment for the agent's tools: NAME passes the proxy's
    /// value on, NAME=VALUE sets one (repeatable; none by default: a tool
    /// sees only PATH and LANG of it).
    #[arg(long, value_name = "NAME[=VALUE]")]
    tool_env: Vec<String>,
    /// Where parsed elements go: `jsonl:FILE` (appended), `webhook:URL`
    /// (POSTed as JSON arrays) or `nats://HOST:PORT/SUBJECT[?jetstream=1&overflow=drop|block&...]`
    /// (published to NATS). Repeatable.
    #[arg(
        long = "sink",
        value_name = "jsonl:FILE|webhook:URL|nats://HOST:PORT/SUBJECT",
        env = "SPINDLE_SINK",
        value_delimiter = ' '
    )]
    sinks: Vec<SinkSpec>,
    /// Seconds of upstream silence inside a response body before it fails
    /// (an in-band error mid-stream) [default: 60].
    #[arg(long, value_name = "SECS")]
    idle_timeout: Option<f64>,
    /// Seconds to wait for the upstream's response head and first body byte
    /// (a non-streamed answer, a long prefill) before a 504 [default: 600].
    #[arg(long, value_name = "SECS")]
    first_byte_timeout: Option<f64>,
    /// Seconds to wait for a connection to the upstream [default: 10].
    #[arg(long, value_name = "SECS")]
    connect_timeout: Option<f64>,
    /// Seconds running streams may go on after SIGINT/SIGTERM [default: 30].
    #[arg(long, value_name = "SECS")]
    grace: Option<f64>,
    /// Most requests in flight; more get 503 [default: 4096].
    #[arg(long, value_name = "N")]
    max_streams: Option<usize>,
    /// Longest SSE line (and event) parsed, in bytes; longer ones are
    /// forwarded unparsed and reported [default: 4194304].
    #[arg(long, value_name = "BYTES")]
    max_line: Option<usize>,
    /// Largest request body of a model endpoint, in bytes (more gets 413)
    /// [default: 33554432].
    #[arg(long, value_name = "BYTES")]
    max_request_body: Option<usize>,
    /// Largest whole JSON response parsed (or rewritten), in bytes
    /// [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    max_response_body: Option<usize>,
    /// Records queued per sink before records are dropped [default: 10000].
    #[arg(long, value_name = "N")]
    sink_queue: Option<usize>,
    /// Log level (`error`, `warn`, `info`, `debug`, `trace`); RUST_LOG wins [default: info].
    #[arg(long, value_name = "LEVEL", env = "SPINDLE_LOG")]
    log: Option<String>,
    /// Export one OpenTelemetry span per chat request (GenAI attributes,
    /// repairs and tool calls as events, `traceparent` sent upstream) to this
    /// OTLP/HTTP endpoint (`http://127.0.0.1:4318`). Also on when
    /// OTEL_EXPORTER_OTLP_ENDPOINT is set.
    #[arg(long, value_name = "URL")]
    otel_endpoint: Option<String>,
    /// Serve the live stream inspector page at http://UI-LISTEN/ui (streams,
    /// their elements as they arrive, repairs, diagnostics, timing).
    #[arg(long)]
    ui: bool,
    /// Where the inspector page listens [default: 127.0.0.1:8789]; an address
    /// that is not loopback needs SPINDLE_UI_TOKEN (then open /ui?token=TOKEN).
    #[arg(long, value_name = "ADDR", requires = "ui")]
    ui_listen: Option<String>,
    /// A Host name (or IP address; no port) both listeners answer to. A
    /// listener on a loopback address answers only to localhost, *.localhost
    /// and loopback addresses (any port) and these names; one on another
    /// address answers to any Host unless this is given (then to these and
    /// the loopback names). Other Hosts get 403 (against DNS rebinding).
    /// Repeatable.
    #[arg(long = "allowed-host", value_name = "NAME", env = "SPINDLE_ALLOWED_HOST", value_delimiter = ' ')]
    allowed_hosts: Vec<String>,
    /// A browser origin whose pages may call the proxy
    /// (`https://app.example.com`, `http://localhost:3000`; `*`: any): its
    /// preflights are answered and its responses carry
    /// Access-Control-Allow-Origin. A request with another Origin gets 403;
    /// requests without one (curl, SDKs, server-side apps) are not affected.
    /// Repeatable [default: none].
    #[arg(long = "allow-origin", value_name = "ORIGIN", env = "SPINDLE_ALLOW_ORIGIN", value_delimiter = ' ')]
    allow_origins: Vec<String>,
    /// Seconds a client may take to send a request head (an idle keep-alive
    /// connection is closed after as long), or between two reads of a
    /// request body the proxy buffers (then 408) [default: 30].
    #[arg(long, value_name = "SECS")]
    request_timeout: Option<f64>,
    /// Most client connections open at once, per listener; past it, new
    /// connections wait to be accepted; fewer when the open-file limit
    /// (ulimit -n, raised to its hard limit at start) has no room for them
    /// [default: 1024].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Most bytes of request bodies buffered at once, across requests; a
    /// body that does not fit gets 503 with Retry-After. At least
    /// --max-request-body [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    max_request_buffer: Option<usize>,
    /// Largest WebSocket message (or frame) relayed either way, in bytes; a
    /// larger one closes the session with code 1009 [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    max_ws_message: Option<usize>,
}

/// `--use-protocol` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum UseProtocolArg {
    /// A request's declarations choose its registry.
    Auto,
    /// Every request gets the configured registry.
    Ignore,
}

/// `--invalid-calls` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum InvalidCallsArg {
    /// Send invalid calls as written.
    Pass,
    /// Leave them out; their observation becomes content.
    Drop,
}

impl ProxyArgs {
    /// The options given, to lay over the config file.
    fn overrides(&self) -> ProxyOverrides {
        let mut o = ProxyOverrides::default();
        o.upstream.clone_from(&self.upstream);
        o.listen.clone_from(&self.listen);
        o.profile.clone_from(&self.profile);
        o.registry.clone_from(&self.registry);
        o.rewrite = self.rewrite;
        o.use_protocol = self.use_protocol.map(|u| match u {
            UseProtocolArg::Auto => UseProtocol::Auto,
            UseProtocolArg::Ignore => UseProtocol::Ignore,
        });
        o.sinks.clone_from(&self.sinks);
        o.idle_timeout = self.idle_timeout;
        o.first_byte_timeout = self.first_byte_timeout;
        o.connect_timeout = self.connect_timeout;
        o.grace = self.grace;
        o.max_streams = self.max_streams;
        o.max_line = self.max_line;
        o.max_request_body = self.max_request_body;
        o.max_response_body = self.max_response_body;
        o.sink_queue = self.sink_queue;
        o.log.clone_from(&self.log);
        o.otel_endpoint.clone_from(&self.otel_endpoint);
        o.ui = self.ui;
        o.ui_listen.clone_from(&self.ui_listen);
        o.tool_protocol = self.tool_protocol;
        o.invalid_calls = self.invalid_calls.map(|v| match v {
            InvalidCallsArg::Pass => InvalidCalls::Pass,
            InvalidCallsArg::Drop => InvalidCalls::Drop,
        });
        o.agent = self.agent;
        o.tools.clone_from(&self.tools);
        o.agent_max_steps = self.agent_max_steps;
        o.agent_max_tool_calls = self.agent_max_tool_calls;
        o.agent_max_time = self.agent_max_time;
        o.agent_async_tasks = self.agent_async_tasks.map(Into::into);
        o.agent_tools.clone_from(&self.agent_tools);
        o.tool_timeout_ms = self.tool_timeout_ms;
        o.tool_path.clone_from(&self.tool_path);
        o.tool_env.clone_from(&self.tool_env);
        o.allowed_hosts.clone_from(&self.allowed_hosts);
        o.allow_origins.clone_from(&self.allow_origins);
        o.request_timeout = self.request_timeout;
        o.max_connections = self.max_connections;
        o.max_request_buffer = self.max_request_buffer;
        o.max_ws_message = self.max_ws_message;
        o
    }
}

/// Logs to stderr: RUST_LOG when set, else `level`.
pub(crate) fn init_logs(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colour only on a terminal, never with NO_COLOR (logs in files and
    // pipes stay plain text).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour).try_init();
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

/// Raises the soft open-file limit to the hard one, as servers do (Go's
/// runtime does it for every program): a soft limit of 1024 left room for
/// fewer client connections than `--max-connections`. Nothing happens when
/// it cannot be raised; the proxy then serves fewer connections at once
/// and says so.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::debug!("cannot raise the open-file limit from {soft} to {hard}: {e}");
    }
}

pub(crate) fn run(args: ProxyArgs) -> Result<ExitCode> {
    let mut settings = match &args.config {
        Some(path) => ProxySettings::load(path)?,
        None => ProxySettings::default(),
    };
    settings.apply_env(|name| std::env::var(name).ok());
    settings.apply(args.overrides())?;
    if args.print_config {
        let mut out = std::io::stdout().lock();
        out.write_all(settings.to_toml().as_bytes())?;
        out.flush()?;
        return Ok(ExitCode::SUCCESS);
    }
    init_logs(&settings.log);
    raise_open_files();
    let mut config = settings.to_proxy_config()?;
    let upstream = config.upstream.clone();
    let parsing = match &settings.parse.registry {
        Some(r) => format!("registry {}", r.display()),
        None => format!("profile {}", settings.parse.profile),
    };
    let rewrite = config.rewrite;
    let tools = settings.tools.tool_calling().map(|t| format!(", tool protocol {}", t.protocol)).unwrap_or_default();
    let tool_settings = settings.tools.clone();
    runtime()?.block_on(async move {
        // The agent's tools, and the MCP servers they need (the runner
        // keeps them running as long as the proxy).
        let tools = match (tool_settings.agent, &tool_settings.dir) {
            (true, Some(dir)) => {
                let options = RunnerOptions {
                    default_timeout: tool_settings.timeout(),
                    path: tool_settings.tool_path(),
                    env: tool_settings.env.clone(),
                    ..RunnerOptions::default()
                };
                let (mut catalog, pool) = crate::tools::load_tools(dir, &options).await?;
                catalog.keep_only(&tool_settings.agent_tools).context("tools.agent_tools (--agent-tools)")?;
                let mut runner = Runner::with_options(catalog, options);
                runner.set_mcp(std::sync::Arc::new(pool));
                config.agent = Some(
                    ProxyAgent::new(std::sync::Arc::new(runner))
                        .with_limits(tool_settings.agent_limits())
                        .with_async_tasks(tool_settings.agent_async_tasks),
                );
                format!("{tools}, agent with the tools of {}", dir.display())
            }
            _ => tools,
        };
        let server = ProxyServer::bind(config, &settings.listen).await?;
        let addr = server.local_addr();
        let ui = server.ui_addr().map(|a| format!("; inspector http://{a}/ui")).unwrap_or_default();
        eprintln!(
            "spindle proxy: http://{addr}/v1 -> {upstream} ({parsing}{}{tools}); /healthz, /metrics{ui}",
            if rewrite { ", rewriting" } else { "" },
        );
        server.run(shutdown_signal()).await.context("serving")?;
        Ok(ExitCode::SUCCESS)
    })
}
