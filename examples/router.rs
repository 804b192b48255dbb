//! Routes a Filament response to async handlers while it streams in.
//!
//! Reads a transcript (default `corpora/route-tavern-en.txt`; try
//! `corpora/route-sloppy-en.txt` for repairs and a failing handler), feeds it to a
//! parser in small chunks with a delay between them (as a model would send
//! it), and routes each element to a handler the moment it completes: the
//! times printed show elements handled while the input is still arriving.
//!
//! ```text
//! cargo run --example router [FILE] [CHUNK_BYTES] [DELAY_MS]
//! ```

use futures::StreamExt;
use futures::stream;
use spindle::route::{Router, RouterOptions, SubscribeOptions, Topic};
use spindle::{Parser, Registry};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpora/route-tavern-en.txt"));
    let chunk: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(16).max(1);
    let delay = Duration::from_millis(args.next().map(|a| a.parse()).transpose()?.unwrap_or(3));
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let total = text.len();
    println!("routing {} ({total} bytes) in {chunk}-byte chunks, {} ms apart\n", path.display(), delay.as_millis());

    let start = Instant::now();
    let fed = Arc::new(AtomicUsize::new(0));
    // A line with the time since start and how much input had arrived.
    let stamp = {
        let fed = fed.clone();
        move || format!("[{:>5} ms, input {:>4}/{total}]", start.elapsed().as_millis(), fed.load(Ordering::Relaxed))
    };

    let registry = Registry::filament();
    let mut router = Router::with_options(RouterOptions::new().registry(registry.clone()));

    // Reasoning: hidden from users, logged when complete.
    let s = stamp.clone();
    router.on("thought", move |el| {
        let line = format!("{} thought      {} bytes of reasoning", s(), el.text.len());
        async move { println!("{line}") }
    });

    // Content deltas, as a chat UI would receive them; note when each
    // content element starts streaming.
    let s = stamp.clone();
    let mut streaming = None;
    let deltas = router.subscribe_deltas("content");
    router.handle(deltas, move |d| {
        let first = streaming.replace(d.id) != Some(d.id);
        let line = format!("{} content      started streaming", s());
        async move {
            if first {
                println!("{line}");
            }
        }
    });
    let s = stamp.clone();
    router.on("content", move |el| {
        let first_line = el.text.trim().lines().next().unwrap_or("").to_string();
        let line = format!("{} content      complete: {first_line:?} ...", s());
        async move { println!("{line}") }
    });

    // HTML comments are routed apart from what users see.
    let s = stamp.clone();
    let comments = router.subscribe_to(Topic::comments(), SubscribeOptions::new());
    router.handle(comments, move |c| {
        let line = format!("{} comment      (hidden) {:?}", s(), c.text.trim());
        async move { println!("{line}") }
    });

    // The tool executor: slow, so it runs beside the stream, not in it.
    let s = stamp.clone();
    router.on_with("tool_call", SubscribeOptions::new().name("tool executor"), move |el| {
        let s = s.clone();
        async move {
            // The typed payload `{name, arguments}` when the payload
            // stage provides it (read leniently); else the raw body,
            // read strictly here, so a sloppy body fails this handler
            // (reported, nothing else stops).
            let name = match el.payload.get("name").and_then(|n| n.as_str()) {
                Some(n) => n.to_string(),
                None => el.attrs.get("name").cloned().unwrap_or_default(),
            };
            let args = match el.payload.get("arguments") {
                Some(a) => a.clone(),
                None => serde_json::from_str::<serde_json::Value>(el.text.trim())?,
            };
            println!("{} tool_call    {name}({args}) running ...", s());
            tokio::time::sleep(Duration::from_millis(40)).await;
            println!("{} tool_call    {name} done: -4 °C, snow after dark (simulated)", s());
            Ok::<_, serde_json::Error>(())
        }
    });

    // State updates: the payload when the payload stage fills it, else the
    // raw body.
    let s = stamp.clone();
    router.on("variable_update", move |el| {
        let body = if el.payload.is_null() {
            el.text.split_whitespace().collect::<Vec<_>>().join(" ")
        } else {
            el.payload.to_string()
        };
        let line = format!("{} state        {body}", s());
        async move { println!("{line}") }
    });

    // A renderer that is not wired up here: its failure is reported, and
    // nothing else stops.
    router.on_with("choice", SubscribeOptions::new().name("choice renderer"), |_| async {
        Err::<(), _>("no UI attached in this example")
    });

    // Handler failures, as they happen (they are in the report too).
    let s = stamp.clone();
    let failures = router.subscribe_failures();
    router.handle(failures, move |f| {
        let line = format!("{} failure      {f}", s());
        async move { println!("{line}") }
    });

    // Everything else, and what the corrector repaired.
    let s = stamp.clone();
    router.on_all(move |el| {
        let line = format!("{} element      #{} {} done", s(), el.id, el.tag);
        async move {
            if matches!(&*el.tag, "status_bar" | "details" | "media" | "ui_component") {
                println!("{line}");
            }
        }
    });
    let s = stamp.clone();
    let repairs = router.subscribe_to(Topic::repairs(), SubscribeOptions::new());
    router.handle(repairs, move |r| {
        let tag = r.tag.as_deref().unwrap_or("-").to_string();
        let line = format!("{} repair       {} ({tag}) at byte {}", s(), r.kind.as_str(), r.at);
        async move { println!("{line}") }
    });

    // The input: small chunks with a delay, like a model's stream.
    let chunks: Vec<Vec<u8>> = text.chunks(chunk).map(<[u8]>::to_vec).collect();
    let input = stream::iter(chunks).then(move |c| {
        let fed = fed.clone();
        async move {
            tokio::time::sleep(delay).await;
            fed.fetch_add(c.len(), Ordering::Relaxed);
            Ok::<_, std::io::Error>(c)
        }
    });

    let report = router.run(Parser::new(registry), input).await?;
    println!(
        "\ninput ended after {} ms; {} bytes in {} chunks",
        start.elapsed().as_millis(),
        report.input_bytes,
        report.chunks
    );
    print!("{}", report.routing);
    Ok(())
}
