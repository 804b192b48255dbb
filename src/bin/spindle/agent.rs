//! `spindle agent`: the tool loop against an OpenAI-compatible upstream,
//! printed for a person or as JSONL.

use crate::tools::{load_tools, protocol_arg};
use anyhow::{Context, Result};
use futures::StreamExt;
use spindle::Event;
use spindle::sources::SourceEvent;
use spindle::tools::agent::{Agent, AgentEvent, AgentLimits, AsyncTasks, StopReason};
use spindle::tools::{Protocol, Runner, RunnerOptions, ToolConfig};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// `--async-tasks` (`--agent-async-tasks` of the proxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum AsyncTasksArg {
    /// The model goes on; a task's result comes with a later turn, and a
    /// task still running at the final answer is stopped.
    Continue,
    /// Wait for a turn's tasks (within the time budget) and send their
    /// results before asking the model again.
    Wait,
}

impl From<AsyncTasksArg> for AsyncTasks {
    fn from(a: AsyncTasksArg) -> AsyncTasks {
        match a {
            AsyncTasksArg::Continue => AsyncTasks::Continue,
            AsyncTasksArg::Wait => AsyncTasks::Wait,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AgentFormat {
    /// The turns as a person reads them.
    Pretty,
    /// One JSON object per event and line.
    Jsonl,
}

/// Arguments of `spindle agent`.
#[derive(Debug, clap::Args)]
pub(crate) struct AgentArgs {
    /// The user's message.
    prompt: String,
    /// The OpenAI-compatible base URL (`http://127.0.0.1:8080/v1`; a bare
    /// origin such as `http://127.0.0.1:8080` is given `/v1`).
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// The model name sent upstream.
    #[arg(long, value_name = "M")]
    model: String,
    /// The plugins directory (script and MCP tools).
    #[arg(long, value_name = "DIR")]
    tools: PathBuf,
    /// How the model writes calls (the manual teaches it; the parser reads it).
    #[arg(long, visible_alias = "tool-protocol", value_parser = protocol_arg(&Protocol::TEXT), default_value = "tam")]
    protocol: Protocol,
    /// A system prompt file; {{AVAILABLE_TOOLS}} / {{{system:available_tools}}}
    /// become the manual (else the manual is appended).
    #[arg(long, value_name = "FILE")]
    system: Option<PathBuf>,
    /// Only these tool ids (comma-separated): the agent's tool list. The
    /// manual shows them alone, and a call of another tool is an unknown
    /// tool, never run.
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    only: Vec<String>,
    /// Most model answers.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_steps: usize,
    /// Most tool calls over the whole run (steps run and async tasks started; a repeated request_id is free).
    #[arg(long, value_name = "N", default_value_t = 32)]
    max_tool_calls: usize,
    /// Most seconds for the whole run.
    #[arg(long, value_name = "S", default_value_t = 600)]
    max_time: u64,
    /// What the loop does with async tools' tasks: `continue` (the model
    /// goes on; a task's result comes with a later turn, and a task still
    /// running at the final answer is stopped) or `wait` (wait for a
    /// turn's tasks, within --max-time, and send their results with that
    /// turn's observations, so none is left behind).
    #[arg(long, value_enum, value_name = "MODE", default_value_t = AsyncTasksArg::Continue)]
    async_tasks: AsyncTasksArg,
    /// configSchema values for the tools (TOML, or JSON by extension).
    #[arg(long, value_name = "FILE")]
    tool_config: Option<PathBuf>,
    /// Time limit of a tool run that sets none, in ms.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    tool_timeout_ms: u64,
    /// The PATH the tools (scripts, MCP servers) see and their bare
    /// program names are looked up in [default: the PATH spindle was
    /// started with, else /usr/local/bin:/usr/bin:/bin]. The rest of the
    /// environment is not passed on (see --tool-env).
    #[arg(long, value_name = "PATH")]
    tool_path: Option<String>,
    /// More environment for the tools: NAME passes spindle's value on,
    /// NAME=VALUE sets one (repeatable; none by default: a tool sees only
    /// PATH and LANG of it).
    #[arg(long, value_name = "NAME[=VALUE]")]
    tool_env: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = AgentFormat::Pretty)]
    format: AgentFormat,
}

pub(crate) fn run(args: AgentArgs) -> Result<ExitCode> {
    let protocol = args.protocol;
    let system = match &args.system {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?),
        None => None,
    };
    crate::proxy::runtime()?.block_on(async move {
        let options = RunnerOptions {
            default_timeout: Duration::from_millis(args.tool_timeout_ms),
            path: args.tool_path.clone().unwrap_or_else(RunnerOptions::inherited_path),
            env: args.tool_env.clone(),
            ..RunnerOptions::default()
        };
        let (mut catalog, pool) = load_tools(&args.tools, &options).await?;
        catalog.keep_only(&args.only).context("--only")?;
        let mut runner = Runner::with_options(catalog, options);
        runner.set_mcp(Arc::new(pool));
        if let Some(file) = &args.tool_config {
            runner.set_config(ToolConfig::load(file).map_err(anyhow::Error::msg)?);
        }
        let mut agent = Agent::new(&args.upstream, Arc::new(runner), protocol)?
            .with_limits(AgentLimits {
                max_steps: args.max_steps,
                max_tool_calls: args.max_tool_calls,
                max_time: Some(Duration::from_secs(args.max_time)),
                ..AgentLimits::default()
            })
            .with_async_tasks(args.async_tasks.into());
        if let Some(key) = std::env::var("SPINDLE_API_KEY").ok().or_else(|| std::env::var("OPENAI_API_KEY").ok()) {
            agent = agent.with_api_key(key);
        }
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(serde_json::json!({"role": "system", "content": s}));
        }
        messages.push(serde_json::json!({"role": "user", "content": args.prompt}));
        let request = serde_json::json!({"model": args.model, "messages": messages});
        let cancel = CancellationToken::new();
        let on_signal = cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                on_signal.cancel();
            }
        });
        let mut events = std::pin::pin!(agent.run(request, cancel));
        let mut out = anstream::AutoStream::auto(std::io::stdout());
        let mut code = ExitCode::SUCCESS;
        while let Some(event) = events.next().await {
            if let AgentEvent::End { reason, .. } = &event
                && !matches!(reason, StopReason::Answer)
            {
                code = ExitCode::from(1);
            }
            match args.format {
                AgentFormat::Jsonl => writeln!(out, "{}", event.to_json())?,
                AgentFormat::Pretty => pretty(&mut out, &event)?,
            }
            out.flush()?;
        }
        Ok(code)
    })
}

const DIM: &str = "\x1b[2m";
const BOLD: &str = "\x1b[1m";
const GREEN: &str = "\x1b[32m";
const YELLOW: &str = "\x1b[33m";
const CYAN: &str = "\x1b[36m";
const RESET: &str = "\x1b[0m";

fn pretty(out: &mut impl Write, event: &AgentEvent) -> Result<()> {
    match event {
        AgentEvent::TurnStart { turn, messages } => {
            writeln!(out, "{BOLD}── turn {turn}{RESET} {DIM}({messages} messages){RESET}")?
        }
        AgentEvent::Source { event: SourceEvent::Choice(c), .. } => match &c.event {
            Event::Delta(d) if &*d.tag == "content" || &*d.tag == "thought" => {
                let colour = if &*d.tag == "thought" { DIM } else { "" };
                write!(out, "{colour}{}{RESET}", d.text)?;
            }
            _ => {}
        },
        AgentEvent::Source { .. } => {}
        AgentEvent::CallStarted { call_id, call, at_ms, .. } => {
            let tools: Vec<&str> = call.steps.iter().map(|s| s.tool_id.as_str()).collect();
            writeln!(out, "\n{CYAN}→ {call_id} {} started at {at_ms} ms{RESET}", tools.join(", "))?;
        }
        AgentEvent::ToolResult { result, .. } => {
            let colour = if result.ok { GREEN } else { YELLOW };
            writeln!(out, "{colour}← {} {} ms: {}{RESET}", result.call_id, result.duration_ms, result.observation)?;
        }
        AgentEvent::TurnEnd { stream_ms, tool_wait_ms, overlap_ms, calls, .. } => writeln!(
            out,
            "\n{DIM}   stream {stream_ms} ms, {calls} call(s), waited {tool_wait_ms} ms for tools after it, {overlap_ms} ms of tool time ran under the stream{RESET}"
        )?,
        AgentEvent::End { reason, turns, detail, text, .. } => {
            let reason = serde_json::to_value(reason).unwrap_or_default();
            writeln!(out, "{BOLD}== {} after {turns} turn(s){RESET}", reason.as_str().unwrap_or_default())?;
            if let Some(d) = detail {
                writeln!(out, "{YELLOW}{d}{RESET}")?;
            }
            writeln!(out, "{text}")?;
        }
        _ => {}
    }
    Ok(())
}
