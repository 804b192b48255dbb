//! Stream a chat completion from any OpenAI-compatible server and print
//! spindle's events as they arrive: thought in grey, the answer as it
//! streams, tool calls, repairs, and how the stream ended.
//!
//! ```text
//! cargo run --example chat_client -- [--base-url URL] [--model NAME] [--profile NAME] [--jsonl] PROMPT...
//! ```
//!
//! The base URL comes from `--base-url`, else `OPENAI_BASE_URL`, else
//! `http://127.0.0.1:8080/v1` (a local server, e.g. llama.cpp, vLLM,
//! Ollama's `/v1`, or `spindle mock-upstream`). The API key comes from
//! `SPINDLE_API_KEY`, else `OPENAI_API_KEY` (none is sent when both are
//! unset). The model from `--model`, else `OPENAI_MODEL`, else `gpt-4o-mini`.

use futures::StreamExt;
use serde_json::json;
use spindle::Registry;
use spindle::event::{Event, RepairKind};
use spindle::sources::{Channel, ChatClient, ClientError, SourceEvent, StreamOptions};
use std::io::Write;
use std::process::ExitCode;

struct Args {
    base_url: String,
    model: String,
    profile: String,
    jsonl: bool,
    prompt: String,
}

fn parse_args() -> Result<Args, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let mut args = Args {
        base_url: env("OPENAI_BASE_URL").unwrap_or_else(|| "http://127.0.0.1:8080/v1".into()),
        model: env("OPENAI_MODEL").unwrap_or_else(|| "gpt-4o-mini".into()),
        profile: "reasoning".into(),
        jsonl: false,
        prompt: String::new(),
    };
    let mut words = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--base-url" => args.base_url = value("--base-url")?,
            "--model" => args.model = value("--model")?,
            "--profile" => args.profile = value("--profile")?,
            "--jsonl" => args.jsonl = true,
            "-h" | "--help" => {
                return Err(
                    "usage: chat_client [--base-url URL] [--model NAME] [--profile NAME] [--jsonl] PROMPT...".into()
                );
            }
            _ => words.push(arg),
        }
    }
    args.prompt = if words.is_empty() { "Say hello in three languages.".into() } else { words.join(" ") };
    Ok(args)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let Some(registry) = Registry::profile(&args.profile) else {
        eprintln!("unknown profile {:?} (known: {})", args.profile, Registry::profile_names().join(", "));
        return ExitCode::from(2);
    };
    let client = ChatClient::new(&args.base_url).with_env_key().with_options(StreamOptions::with_registry(registry));
    let request = json!({
        "model": args.model,
        "messages": [{"role": "user", "content": args.prompt}],
        "stream_options": {"include_usage": true},
    });
    let mut events = match client.stream_chat(&request).await {
        Ok(events) => events,
        Err(err) => {
            eprintln!("chat_client: {err}");
            if let ClientError::Connect { .. } = err {
                eprintln!(
                    "chat_client: nothing answered at {}. Start an OpenAI-compatible server there, \
                     or pass --base-url / set OPENAI_BASE_URL.",
                    client.base_url()
                );
            }
            if err.is_retryable() {
                eprintln!("chat_client: this error may go away if you try again.");
            }
            return ExitCode::from(1);
        }
    };
    let mut out = std::io::stdout();
    let mut ok = true;
    while let Some(event) = events.next().await {
        if args.jsonl {
            let _ = writeln!(out, "{}", serde_json::to_string(&event).unwrap_or_default());
            continue;
        }
        match &event {
            SourceEvent::Choice(c) => match &c.event {
                Event::Delta(d) if &*d.tag == "content" || c.channel == Channel::Refusal => {
                    let _ = write!(out, "{}", d.text);
                }
                Event::Delta(d) if &*d.tag == "thought" => {
                    let _ = write!(out, "\x1b[2m{}\x1b[0m", d.text);
                }
                Event::Element(el) if &*el.tag == "tool_call" => {
                    let _ = writeln!(out, "\n[tool call] {}", el.payload);
                }
                // With the reasoning profile a plain answer streams as an
                // implicit thought until the stream shows it had no
                // `</think>`; this repair says so.
                Event::Repair(r) if r.kind == RepairKind::Reclassified => {
                    eprintln!("\n[the grey text above was the answer, not a thought]");
                }
                Event::Repair(r) if r.kind != RepairKind::HeaderInserted => {
                    eprintln!("\n[repair] {} ({:?})", r.kind.as_str(), r.tag);
                }
                Event::Diagnostic(d) => eprintln!("\n[{:?}] {}: {}", d.level, d.code, d.message),
                _ => {}
            },
            SourceEvent::Finish { choice, reason } => {
                eprintln!("\n[finish] choice {choice}: {}", reason.as_str())
            }
            SourceEvent::Usage { usage } => eprintln!("[usage] {usage}"),
            SourceEvent::StreamError { error, .. } => {
                ok = false;
                eprintln!("\n[error] {error}");
            }
            SourceEvent::Truncated { why, .. } => {
                ok = false;
                eprintln!("\n[truncated] {}", why.as_str());
            }
            SourceEvent::Diagnostic(d) => eprintln!("[{:?}] {}: {}", d.level, d.code, d.message),
            _ => {}
        }
        let _ = out.flush();
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
