//! `spindle demo`: the mock upstream and the proxy on free local ports,
//! one streamed chat completion through the proxy, the text as it
//! arrives, then what the proxy parsed on the side. No API key, no
//! network beyond 127.0.0.1.

use crate::mock::load;
use crate::parse::load_registry;
use crate::proxy::{init_logs, runtime};
use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};
use spindle::event::Event;
use spindle::proxy::{ProxyConfig, ProxyServer, SinkRecord, SinkSpec};
use spindle::sources::{SourceEvent, SseDecoder, SseItem, StreamOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `spindle demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Transcripts to serve (default: the built-in ones).
    #[arg(long, value_name = "DIR")]
    transcripts: Option<PathBuf>,
    /// The transcript to play (its name, as `GET /v1/models` lists it).
    #[arg(long, default_value = "missing-content-tags-en", value_name = "NAME")]
    model: String,
    /// The registry profile (default: from the transcript name: `reasoning-*`
    /// reasoning, `tam-*`/`action-*`/`attp-*` those, else filament).
    #[arg(long, value_parser = crate::cli::profile_arg(&[]))]
    profile: Option<String>,
    /// Run the proxy with --rewrite (corrected text is streamed).
    #[arg(long)]
    rewrite: bool,
    /// Milliseconds between events.
    #[arg(long, default_value_t = 15, value_name = "N")]
    pace_ms: u64,
    /// Log level of the mock and proxy (logs go to stderr).
    #[arg(long, default_value = "warn", value_name = "LEVEL")]
    log: String,
}

fn profile_for(name: &str) -> &'static str {
    let base = name.rsplit('/').next().unwrap_or(name);
    spindle::Registry::profile_for_file_name(base).unwrap_or("filament")
}

fn excerpt(text: &str, max: usize) -> String {
    let flat: String = text.chars().map(|c| if c == '\n' { '⏎' } else { c }).collect();
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

pub(crate) fn run(args: DemoArgs) -> Result<ExitCode> {
    init_logs(&args.log);
    let mock = load(args.transcripts.as_ref())?.with_pace(Duration::from_millis(args.pace_ms));
    if !mock.transcripts().iter().any(|t| t.name == args.model) {
        let names: Vec<&str> = mock.transcripts().iter().map(|t| t.name.as_str()).collect();
        bail!("no transcript named {:?}; there are: {}", args.model, names.join(", "));
    }
    let profile = args.profile.clone().unwrap_or_else(|| profile_for(&args.model).to_string());
    let registry = load_registry(&profile, None)?;
    // Every write is checked: a closed pipe (`spindle demo | head`) ends
    // the demo quietly (see `main`), a full disk with an error.
    let mut out = std::io::stdout();
    runtime()?.block_on(async move {
        let mock = mock.spawn("127.0.0.1:0").await.context("starting the mock upstream")?;
        let (tx, mut records) = tokio::sync::mpsc::channel::<Arc<SinkRecord>>(100_000);
        let mut config = ProxyConfig::new(mock.url());
        config.options = StreamOptions::with_registry(registry);
        config.rewrite = args.rewrite;
        config.sinks = vec![SinkSpec::Channel(tx)];
        config.grace = Duration::from_secs(2);
        let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.context("starting the proxy")?.spawn();
        let proxy_url = format!("http://{}", proxy.local_addr());
        writeln!(out, "mock upstream  {}/v1   (spindle mock-upstream)", mock.url())?;
        writeln!(
            out,
            "proxy          {proxy_url}/v1   (spindle proxy --upstream {} --profile {profile}{})",
            mock.url(),
            if args.rewrite { " --rewrite" } else { "" }
        )?;
        writeln!(out, "request        POST /v1/chat/completions  model={} stream=true\n", args.model)?;

        let request = json!({
            "model": args.model,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Go on."}],
        });
        let response = reqwest::Client::new()
            .post(format!("{proxy_url}/v1/chat/completions"))
            .header("authorization", "Bearer demo-key")
            .json(&request)
            .send()
            .await
            .context("sending the request through the proxy")?;
        writeln!(out, "── streamed through the proxy ({}) ──", response.status())?;
        let mut body = response.bytes_stream();
        let mut decoder = SseDecoder::new();
        while let Some(read) = body.next().await {
            let read = read.context("reading the stream")?;
            for item in decoder.feed(&read) {
                let SseItem::Event(e) = item else { continue };
                let Ok(chunk) = serde_json::from_str::<Value>(&e.data) else { continue };
                for choice in chunk["choices"].as_array().into_iter().flatten() {
                    for key in ["reasoning_content", "content"] {
                        if let Some(text) = choice["delta"][key].as_str() {
                            write!(out, "{text}")?;
                        }
                    }
                }
                if let Some(err) = chunk.get("error") {
                    write!(out, "\n[error] {err}")?;
                }
                out.flush()?;
            }
        }
        writeln!(out, "\n")?;
        let metrics = proxy.metrics();
        proxy.shutdown().await.context("stopping the proxy")?;
        let _ = mock.shutdown().await;

        writeln!(out, "── parsed on the side (what the sinks received) ──")?;
        while let Some(record) = records.recv().await {
            match &record.event {
                SourceEvent::Choice(c) => match &c.event {
                    Event::Element(el) => {
                        let payload = if el.payload.is_null() {
                            String::new()
                        } else {
                            format!("  payload {}", excerpt(&el.payload.to_string(), 60))
                        };
                        writeln!(out, "element  {:<16} {}{payload}", el.tag.to_string(), excerpt(el.text.trim(), 70))?;
                    }
                    Event::Repair(r) => writeln!(
                        out,
                        "repair   {:<16} {}",
                        r.kind.as_str(),
                        r.tag.as_ref().map(|t| t.to_string()).unwrap_or_default()
                    )?,
                    _ => {}
                },
                other => writeln!(
                    out,
                    "{:<8} {}",
                    other.type_name(),
                    excerpt(&serde_json::to_string(other).unwrap_or_default(), 90)
                )?,
            }
        }
        writeln!(out, "\n── /metrics (excerpt) ──")?;
        for line in metrics.render().lines() {
            if !line.starts_with('#')
                && (line.contains("repairs_total") || line.contains("elements_total") || line.contains("streams_total"))
            {
                writeln!(out, "{line}")?;
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
