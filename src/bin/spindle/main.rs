//! The `spindle` command: `parse` (one response), and the tools built on it.
#![deny(unsafe_code)]

mod agent;
#[cfg(feature = "mimalloc")]
mod alloc;
mod cli;
mod demo;
mod mock;
mod parse;
mod prompt;
mod proxy;
mod render;
mod replay;
mod tools;

/// The allocator of the binary: see the `mimalloc` feature in Cargo.toml.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: alloc::Allocator = alloc::Allocator;

use clap::{CommandFactory, Parser as ClapParser, Subcommand};
use std::process::ExitCode;

/// The version line: the package version and, when built from a git
/// checkout, the commit and its date (see build.rs).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), env!("SPINDLE_BUILD_INFO"));

const EXAMPLES: &str = "Examples:
  spindle replay corpora                                   # parse every bundled transcript, print a summary
  spindle parse corpora/long-rp-en-lighthouse.txt --format pretty
  spindle proxy --upstream https://api.openai.com          # parse streams on the side
  spindle demo                                             # mock upstream + proxy, one request
  spindle completions bash > ~/.local/share/bash-completion/completions/spindle";

const PARSE_EXAMPLES: &str = "Examples:
  spindle parse corpora/long-rp-en-lighthouse.txt --format pretty
  curl -sN $URL/v1/chat/completions -d @req.json | spindle parse --format pretty   # an SSE body: each choice parsed
  spindle parse response.json --format rewrite             # a whole chat completion
  curl -s localhost:11434/api/chat -d @req.json | spindle parse --format pretty   # Ollama's JSON lines
  ollama run deepseek-r1 \"...\" | spindle parse --profile reasoning --format jsonl   # model text
  spindle parse answer.txt --registry my-tags.toml --chunk-size 7
  spindle parse answer.txt --profile tam --tools examples/plugins/basic --execute";

const REPLAY_EXAMPLES: &str = "Examples:
  spindle replay corpora
  spindle replay ../shared/recorded --check
  spindle replay capture.sse --format jsonl | head";

const PROXY_EXAMPLES: &str = "Examples:
  spindle proxy --upstream https://api.openai.com
  SPINDLE_UPSTREAM=http://127.0.0.1:8080 spindle proxy --listen 0.0.0.0:8787 --sink jsonl:events.jsonl
  spindle proxy --upstream http://127.0.0.1:8080 --tool-protocol hermes
  spindle proxy --upstream http://127.0.0.1:8080 --allow-origin http://localhost:3000   # a web app's pages may call it
  spindle proxy --config spindle.toml --print-config

Precedence: a flag, then its SPINDLE_* variable, then the --config file, then the default.";

const MOCK_EXAMPLES: &str = "Examples:
  spindle mock-upstream --transcripts corpora --pace-ms 20
  curl -sN localhost:8788/v1/chat/completions -d '{\"model\": \"missing-content-tags-en\", \"stream\": true}'";

const PROMPT_EXAMPLES: &str = "Examples:
  spindle prompt render prompt.j2 --vars vars.yaml --state state.json --seed 7
  spindle prompt migrate st-preset.txt > prompt.j2          # report on stderr
  spindle prompt migrate card.png --report json > card.json
  spindle prompt import card.png                              # Skein blocks
  spindle prompt registry prompt.txt > expected.toml && spindle parse answer.txt --registry expected.toml";

const TOOLS_EXAMPLES: &str = "Examples:
  spindle tools list --tools examples/plugins/basic
  spindle tools manual --tools examples/plugins/basic --protocol hermes";

const AGENT_EXAMPLES: &str = "Examples:
  spindle agent \"What is 2 + 40?\" --upstream http://127.0.0.1:8080/v1 --model qwen3 --tools examples/plugins/basic --protocol hermes";

/// Structured, repaired events from LLM output, while it streams.
#[derive(Debug, ClapParser)]
#[command(name = "spindle", version = VERSION, about, after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse one response (a file or stdin) and print its events.
    #[command(after_help = PARSE_EXAMPLES)]
    Parse(parse::ParseArgs),
    /// Replay recorded transcripts (SSE bodies, chunk files, JSON responses, text).
    #[command(after_help = REPLAY_EXAMPLES)]
    Replay(replay::ReplayArgs),
    /// Run the OpenAI-compatible pipe-through proxy (parses streams on the side).
    #[command(after_help = PROXY_EXAMPLES)]
    Proxy(Box<proxy::ProxyArgs>),
    /// Serve transcripts as a mock OpenAI-compatible endpoint (no API key needed).
    #[command(after_help = MOCK_EXAMPLES)]
    MockUpstream(mock::MockArgs),
    /// Mock upstream + proxy on free ports, one streamed request, the parsed elements.
    Demo(demo::DemoArgs),
    /// Tool manuals and the tool list of a plugins directory.
    #[command(after_help = TOOLS_EXAMPLES)]
    Tools(tools::ToolsArgs),
    /// Run the tool loop: ask the model, run its calls while it streams, send observations back.
    #[command(after_help = AGENT_EXAMPLES)]
    Agent(agent::AgentArgs),
    /// The prompt side: render sandboxed Jinja2, migrate SillyTavern macros, import cards, registries from <use_protocol>.
    #[command(after_help = PROMPT_EXAMPLES)]
    Prompt(prompt::PromptArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cli::CompletionsArgs),
    /// Print a man page (roff): `spindle man > spindle.1`, `spindle man parse > spindle-parse.1`.
    Man(cli::ManArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Parse(args) => parse::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Proxy(args) => proxy::run(*args),
        Command::MockUpstream(args) => mock::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Tools(args) => tools::run(args),
        Command::Agent(args) => agent::run(args),
        Command::Prompt(args) => prompt::run(args),
        Command::Completions(args) => cli::completions(args, Cli::command()),
        Command::Man(args) => cli::man(args, Cli::command()),
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
