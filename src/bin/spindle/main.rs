//! The `spindle` command: `parse` (one response), and the tools built on it.

mod agent;
mod demo;
mod mock;
mod parse;
mod proxy;
mod render;
mod replay;
mod tools;

use clap::{Parser as ClapParser, Subcommand};
use std::process::ExitCode;

/// Structured, repaired events from LLM output, while it streams.
#[derive(Debug, ClapParser)]
#[command(name = "spindle", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse one response (a file or stdin) and print its events.
    Parse(parse::ParseArgs),
    /// Replay recorded transcripts (SSE bodies, chunk files, JSON responses, text).
    Replay(replay::ReplayArgs),
    /// Run the OpenAI-compatible pipe-through proxy (parses streams on the side).
    Proxy(proxy::ProxyArgs),
    /// Serve transcripts as a mock OpenAI-compatible endpoint (no API key needed).
    MockUpstream(mock::MockArgs),
    /// Mock upstream + proxy on free ports, one streamed request, the parsed elements.
    Demo(demo::DemoArgs),
    /// Tool manuals and the tool list of a plugins directory.
    Tools(tools::ToolsArgs),
    /// Run the tool loop: ask the model, run its calls while it streams, send observations back.
    Agent(agent::AgentArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Parse(args) => parse::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Proxy(args) => proxy::run(args),
        Command::MockUpstream(args) => mock::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Tools(args) => tools::run(args),
        Command::Agent(args) => agent::run(args),
    };
    match result {
        Ok(code) => code,
        // The reader went away (`spindle parse BIG | head -1`): stop
        // quietly, as a filter does.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, the whole cause chain: what failed and why.
            // (A multi-line cause, such as a TOML diagnostic, keeps its
            // lines but not its trailing newline.)
            eprintln!("spindle: error: {}", format!("{err:#}").trim_end());
            ExitCode::from(2)
        }
    }
}

/// Whether an error is a write to a closed pipe, anywhere in its chain.
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    let pipe = Some(std::io::ErrorKind::BrokenPipe);
    e.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().map(std::io::Error::kind) == pipe
            || cause.downcast_ref::<serde_json::Error>().and_then(serde_json::Error::io_error_kind) == pipe
    })
}
