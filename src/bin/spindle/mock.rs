//! `spindle mock-upstream`: the mock OpenAI-compatible endpoint of
//! [`spindle::mock`], serving transcripts.

use crate::proxy::{init_logs, runtime, shutdown_signal};
use anyhow::{Context, Result};
use spindle::mock::{MockUpstream, ModelPolicy, Script};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `spindle mock-upstream`.
#[derive(Debug, clap::Args)]
pub(crate) struct MockArgs {
    /// A directory of transcripts (`.sse`, `.chunks.txt`, `.txt`,
    /// chat-completion `.json`; searched recursively). Without it, a few
    /// built-in transcripts are served.
    #[arg(long, value_name = "DIR")]
    transcripts: Option<PathBuf>,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8788", value_name = "ADDR")]
    listen: String,
    /// Milliseconds between events.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pace_ms: u64,
    /// Accept any model name (pick the transcript by the last user message
    /// or a hash of the messages) instead of answering an unknown model
    /// with 404 `model_not_found`, as OpenAI does.
    #[arg(long)]
    any_model: bool,
    /// A scripted conversation (TOML, see `spindle::mock::Script`): its
    /// model answers each turn with the transcript the script names.
    /// Repeatable; `*.script.toml` files in --transcripts load by themselves.
    #[arg(long = "script", value_name = "FILE")]
    scripts: Vec<PathBuf>,
    /// How many request bodies `GET /mock/requests` keeps.
    #[arg(long, value_name = "N", default_value_t = spindle::mock::REQUEST_LOG)]
    request_log: usize,
    /// Log level; RUST_LOG wins.
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log: String,
}

/// The mock for a directory, or the built-in transcripts.
pub(crate) fn load(dir: Option<&PathBuf>) -> Result<MockUpstream> {
    match dir {
        Some(dir) => MockUpstream::from_dir(dir).with_context(|| format!("transcripts {}", dir.display())),
        None => Ok(MockUpstream::builtin()),
    }
}

pub(crate) fn run(args: MockArgs) -> Result<ExitCode> {
    init_logs(&args.log);
    let policy = if args.any_model { ModelPolicy::Any } else { ModelPolicy::Strict };
    let mut mock = load(args.transcripts.as_ref())?
        .with_pace(Duration::from_millis(args.pace_ms))
        .with_models(policy)
        .with_request_log(args.request_log);
    for path in &args.scripts {
        mock = mock.with_script(Script::load(path)?)?;
    }
    let names: Vec<String> = mock.transcripts().iter().map(|t| t.name.clone()).collect();
    runtime()?.block_on(async move {
        let server = mock.spawn(&args.listen).await.with_context(|| format!("cannot listen on {}", args.listen))?;
        let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
        eprintln!(
            "spindle mock-upstream: {} transcripts on {}/v1 (models: {}{}); pick one with \"model\"",
            names.len(),
            server.url(),
            shown.join(", "),
            if names.len() > shown.len() { ", ..." } else { "" }
        );
        shutdown_signal().await;
        // Open streams (a stalled one never ends by itself) get a moment.
        let _ = tokio::time::timeout(Duration::from_secs(5), server.shutdown()).await;
        Ok(ExitCode::SUCCESS)
    })
}
