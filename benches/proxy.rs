//! The proxy's cost, measured in one run against the mock upstream
//! (everything in this process, on 127.0.0.1):
//!
//! * added per-chunk latency: the mock stamps every event with the time it
//!   wrote it (`x-mock-stamp`); the load generator notes when the event's
//!   last byte arrived. p50/p99 of that delay, direct and through the
//!   proxy (pass-through, parsing on the side with the filament profile),
//!   at concurrency 1 and 64; the proxy's cost is the difference;
//! * proxy throughput: unpaced streams, direct and through the proxy;
//! * tool calling: the added per-chunk latency of `--tool-protocol hermes`
//!   (a request with `tools`: manual injected, content re-serialised
//!   without call text, `tool_calls` deltas) next to pass-through, both
//!   with the `chat` profile, on a long answer and on a Hermes tool call;
//! * replay throughput: every transcript of `../shared/recorded/` through
//!   `spindle::sources::transcript` (the stream model and parser), in MB/s.
//!
//! * CPU per chunk: the on-CPU time of the proxies' own threads
//!   (`/proc/self/task/*/schedstat`) over 32 streams of 64 chunks, per
//!   chunk, with chunks 20 ms apart (paced, as models send them) and
//!   back to back: the proxy's fixed cost per wake-up shows as their ratio
//!   (beside the wire's and the handoff's, which have no work of their own);
//! * streams/s: 64-chunk streams, 64 at a time for 3 s, direct and through
//!   the proxy (the generator and the mock share one core, so this is a
//!   floor of the proxy's own one-core ceiling; direct is the generator's).
//!   With it, how busy the proxy's core was meanwhile, and the rate that
//!   share gives at 100%: the proxy's one-core ceiling when the generator
//!   saturates first.
//!
//! * memory: the release binary (`spindle proxy`, a child process, default
//!   allocator and runtime) in front of a mock that sends one event and
//!   then waits a minute: its resident set (`VmRSS`) idle, and with
//!   `PROXY_BENCH_STREAMS` (default 500) streams open; per open stream is
//!   the difference over the count.
//!
//! Topology, as in a side-by-side harness: the load generator and the mocks
//! run on this thread (a current-thread runtime) pinned to the first core;
//! the proxies, the "wire" (a TCP byte relay, the floor of one more hop)
//! and the "handoff" (the same relay reading the upstream in one task and
//! writing to the client in another, as a proxy on an HTTP client must),
//! run on their own one-worker runtime pinned to the last core.
//!
//! Run: `cargo bench --bench proxy` (release). `PROXY_BENCH_PACE_MS`
//! (default 2) sets the time between events; `PROXY_BENCH_PARTS` (a comma
//! list of `latency`, `throughput`, `tools`, `cpu`, `memory`, `replay`;
//! default all)
//! runs only those parts; `PROXY_BENCH_WORKERS` (default 1) gives the
//! proxies' runtime more workers, unpinned.

use futures::StreamExt;
use spindle::Registry;
use spindle::mock::MockUpstream;
use spindle::proxy::{ProxyConfig, ProxyHandle, ProxyServer, ToolCalling};
use spindle::sources::StreamOptions;
use spindle::sources::transcript::{self, Detection, ReplayOutcome};
use spindle::tools::Protocol;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const MODEL: &str = "long-rp-en-lighthouse";

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// One streamed request; the delay of every stamped event, in µs, and
/// the body size.
async fn stream(http: &reqwest::Client, base: &str, stamp: bool) -> (Vec<f64>, usize) {
    let body = serde_json::json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "go"}]});
    stream_body(http, base, stamp, &body).await
}

/// [`stream`] with a given request body.
async fn stream_body(http: &reqwest::Client, base: &str, stamp: bool, body: &serde_json::Value) -> (Vec<f64>, usize) {
    let mut request = http.post(format!("{base}/v1/chat/completions")).json(body);
    if stamp {
        request = request.header("x-mock-stamp", "1");
    }
    let Ok(response) = request.send().await else { return (Vec::new(), 0) };
    let mut reads = response.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut delays = Vec::new();
    let mut total = 0;
    while let Some(Ok(read)) = reads.next().await {
        let arrived = now_ns();
        total += read.len();
        buf.extend_from_slice(&read);
        // Every complete event (blank line) in the buffer.
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            if let Some(rest) = event.strip_prefix(b": t=")
                && let Some(nl) = rest.iter().position(|b| *b == b'\n')
                && let Some(sent) = std::str::from_utf8(&rest[..nl]).ok().and_then(|s| s.parse::<u128>().ok())
            {
                delays.push(arrived.saturating_sub(sent) as f64 / 1000.0);
            }
        }
    }
    (delays, total)
}

/// `clients` concurrent streams; every event delay of all of them.
async fn load(http: &reqwest::Client, base: &str, clients: usize) -> Vec<f64> {
    let runs = (0..clients).map(|_| stream(http, base, true));
    let mut all: Vec<f64> = futures::future::join_all(runs).await.into_iter().flat_map(|(d, _)| d).collect();
    all.sort_by(f64::total_cmp);
    all
}

/// `runs` sequential streams of `body`; every event delay, sorted.
async fn load_body(http: &reqwest::Client, base: &str, body: &serde_json::Value, runs: usize) -> Vec<f64> {
    let mut all = Vec::new();
    for _ in 0..runs {
        all.extend(stream_body(http, base, true, body).await.0);
    }
    all.sort_by(f64::total_cmp);
    all
}

/// The threads of the proxies' runtime (workers and blocking threads).
static PROXY_THREADS: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The calling thread's id (Linux; empty elsewhere).
fn thread_id() -> String {
    std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

/// On-CPU time of the proxies' threads, in seconds (Linux schedstat, in
/// nanoseconds; 0 elsewhere): the proxy's own CPU, without the generator's.
fn proxy_cpu_secs() -> f64 {
    let threads = PROXY_THREADS.lock().map(|t| t.clone()).unwrap_or_default();
    let ns: u64 = threads
        .iter()
        .filter_map(|tid| std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum();
    ns as f64 / 1e9
}

/// `n` concurrent streams of `model` from `base`; the CPU seconds the
/// proxies spent meanwhile and the events the streams carried.
async fn cpu_of(http: &reqwest::Client, base: &str, model: &str, n: usize) -> (f64, usize) {
    let body = serde_json::json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "go"}]});
    let before = proxy_cpu_secs();
    let runs = (0..n).map(|_| stream_body(http, base, true, &body));
    let events: usize = futures::future::join_all(runs).await.iter().map(|(d, _)| d.len()).sum();
    (proxy_cpu_secs() - before, events)
}

/// How a relay ([`wire`]) moves the upstream's bytes to the client.
#[derive(Clone, Copy)]
enum Relay {
    /// One task reads and writes (`copy_bidirectional`): one more loopback
    /// hop and nothing else.
    Direct,
    /// One task reads the upstream and hands each read over a channel to
    /// the task that writes to the client. An HTTP client works so (hyper's
    /// connection task reads, the response body is read in the task that
    /// serves the client), so this is the floor of any proxy built on one:
    /// the hop plus one task hand-off per read.
    Handoff,
}

/// The wire in front of the mock at `url`: a byte relay (accept, connect
/// upstream, copy both ways), no HTTP, served on the proxies' runtime like a
/// proxy. What one more loopback hop costs on this machine, the floor under
/// any proxy's added latency. Its base URL.
async fn wire(rt: &tokio::runtime::Handle, url: &str, relay: Relay) -> String {
    let upstream: std::net::SocketAddr = url.trim_start_matches("http://").parse().expect("mock address");
    format!("http://{}", rt.spawn(tcp_relay(upstream, relay)).await.expect("relay"))
}

/// Serves [`wire`] on the current runtime; its address.
async fn tcp_relay(upstream: std::net::SocketAddr, relay: Relay) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("relay");
    let addr = listener.local_addr().expect("relay addr");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else { return };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                match relay {
                    Relay::Direct => {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                    Relay::Handoff => handoff(client, server).await,
                }
            });
        }
    });
    addr
}

/// [`Relay::Handoff`] for one connection: requests go straight up; each
/// read of the response goes to the client's task through a channel (the
/// read buffer reused as hyper reuses its own).
async fn handoff(client: tokio::net::TcpStream, server: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(async move {
        let mut buf = bytes::BytesMut::with_capacity(8192);
        loop {
            buf.reserve(8192);
            match server_read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(buf.split().freeze()).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    while let Some(read) = rx.recv().await {
        if client_write.write_all(&read).await.is_err() {
            break;
        }
    }
    let _ = client_write.shutdown().await;
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn replay_throughput(root: &Path) -> Option<(usize, u64, f64)> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() { stack.push(p) } else { files.push(p) }
        }
    }
    let loaded: Vec<(PathBuf, Vec<u8>)> =
        files.into_iter().filter_map(|p| Some((p.clone(), std::fs::read(&p).ok()?))).collect();
    let options = StreamOptions::default();
    let mut best = f64::INFINITY;
    let mut bytes = 0;
    let mut streams = 0;
    for _ in 0..3 {
        let start = Instant::now();
        bytes = 0;
        streams = 0;
        for (path, data) in &loaded {
            if let Detection::Replay(kind) = transcript::detect(path, data)
                && let ReplayOutcome::Streams(s) = transcript::replay(kind, data, &options)
            {
                streams += s.len();
                bytes += data.len() as u64;
            }
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some((streams, bytes, bytes as f64 / best / 1e6))
}

/// Starts a proxy on the proxies' runtime.
async fn start(rt: &tokio::runtime::Handle, config: ProxyConfig) -> ProxyHandle {
    rt.spawn(async move { ProxyServer::bind(config, "127.0.0.1:0").await.expect("proxy").spawn() })
        .await
        .expect("proxy")
}

/// The resident set of a process, in KiB (`VmRSS` of `/proc/PID/status`).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Whether a response read so far holds a whole SSE event (`data:` and
/// the blank line after it).
fn has_event(seen: &[u8]) -> bool {
    seen.windows(5).position(|w| w == b"data:").is_some_and(|at| seen[at..].windows(2).any(|w| w == b"\n\n"))
}

/// What [`memory`] measured.
struct Memory {
    idle_kib: u64,
    open_kib: u64,
    streams: usize,
    answered: usize,
}

/// Kills the child proxy however the measurement ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The proxy binary's resident set idle and with `streams` streams open
/// (each has its first event; the mock holds the rest back). `None` when
/// the binary was not built (the `cli` feature off) or did not start.
async fn memory(upstream: &str, streams: usize) -> Option<Memory> {
    use std::io::BufRead;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exe = option_env!("CARGO_BIN_EXE_spindle")?;
    let mut child = std::process::Command::new(exe)
        .args(["proxy", "--upstream", upstream, "--listen", "127.0.0.1:0", "--profile", "filament"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let stderr = child.stderr.take();
    let child = Reaped(child);
    let pid = child.0.id();
    // The banner names the address: `spindle proxy: http://ADDR/v1 -> ...`.
    let mut lines = std::io::BufReader::new(stderr?).lines();
    let banner = lines.next()?.ok()?;
    let addr = banner.split("http://").nth(1)?.split("/v1").next()?.to_string();
    // The rest of its log is read (and dropped) so that it never blocks.
    std::thread::spawn(move || lines.for_each(drop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_kib = rss_kib(pid)?;
    let body = serde_json::json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "go"}]})
        .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut open = Vec::with_capacity(streams);
    for _ in 0..streams {
        let Ok(mut socket) = tokio::net::TcpStream::connect(&addr).await else { break };
        if socket.write_all(request.as_bytes()).await.is_ok() {
            open.push(socket);
        }
    }
    // Every stream has its headers and first event (or gave up).
    let mut answered = 0;
    let mut buf = vec![0u8; 64 * 1024];
    for socket in &mut open {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !has_event(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, socket.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        answered += usize::from(seen.starts_with(b"HTTP/1.1 200") && has_event(&seen));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let open_kib = rss_kib(pid)?;
    drop(open);
    drop(child);
    Some(Memory { idle_kib, open_kib, streams, answered })
}

/// The cores to pin to: the load generator and mocks on the first, the
/// proxies on the last (none when there is only one).
fn cores() -> Option<(core_affinity::CoreId, core_affinity::CoreId)> {
    let ids = core_affinity::get_core_ids()?;
    Some((*ids.first()?, *ids.last()?)).filter(|(a, b)| a != b)
}

fn main() {
    let pace: u64 = std::env::var("PROXY_BENCH_PACE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    // As in a side-by-side harness: the generator and the mocks on one
    // core (this thread), each proxy on its own runtime on the other core,
    // one worker, as the binary runs when pinned to one core.
    let workers: usize = std::env::var("PROXY_BENCH_WORKERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pin = cores().filter(|_| workers == 1);
    let parts = std::env::var("PROXY_BENCH_PARTS").ok();
    let want = |part: &str| parts.as_deref().is_none_or(|p| p.split(',').any(|w| w.trim() == part));
    if let Some((generator, _)) = pin {
        core_affinity::set_for_current(generator);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let proxies = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.max(1))
        .on_thread_start(move || {
            if let Ok(mut threads) = PROXY_THREADS.lock() {
                threads.push(thread_id());
            }
            if let Some((_, proxy)) = pin {
                core_affinity::set_for_current(proxy);
            }
        })
        .enable_all()
        .build()
        .expect("proxy runtime");
    let prt = proxies.handle().clone();
    runtime.block_on(async {
        let corpora = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpora");
        let transcripts = MockUpstream::from_dir(&corpora).expect("corpora");
        let paced = transcripts.clone().with_pace(Duration::from_millis(pace)).spawn("127.0.0.1:0").await.expect("mock");
        let fast = transcripts.spawn("127.0.0.1:0").await.expect("mock");
        let config = |upstream: String| {
            let mut c = ProxyConfig::new(upstream);
            c.options = StreamOptions::with_registry(Registry::filament());
            c
        };
        let proxy = start(&prt, config(paced.url())).await;
        let fast_proxy = start(&prt, config(fast.url())).await;
        let http = reqwest::Client::builder().no_proxy().build().expect("client");
        let via = format!("http://{}", proxy.local_addr());
        let wire_url = wire(&prt, &paced.url(), Relay::Direct).await;
        let handoff_url = wire(&prt, &paced.url(), Relay::Handoff).await;
        // Warm up connections and code paths.
        let _ = load(&http, &paced.url(), 4).await;
        let _ = load(&http, &via, 4).await;
        let _ = load(&http, &wire_url, 4).await;
        let _ = load(&http, &handoff_url, 4).await;

        if want("latency") {
        println!("per-chunk latency, event written by the mock -> last byte read by the client (µs); {MODEL}, {pace} ms between events");
        println!("(wire: a TCP byte relay on the proxies' runtime, the floor of one more hop; handoff: the same relay");
        println!(" reading and writing in two tasks, the floor of a proxy on an HTTP client; both added to direct)");
        println!("{:<12} {:>9} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}", "concurrency", "events", "direct p50", "direct p99", "proxy p50", "proxy p99", "added p50", "added p99", "wire p50", "wire p99", "handoff p50", "handoff p99");
        for clients in [1usize, 64] {
            let direct = load(&http, &paced.url(), clients).await;
            let proxied = load(&http, &via, clients).await;
            let relayed = load(&http, &wire_url, clients).await;
            let handed = load(&http, &handoff_url, clients).await;
            let (d50, d99, p50, p99) = (pct(&direct, 0.5), pct(&direct, 0.99), pct(&proxied, 0.5), pct(&proxied, 0.99));
            let (w50, w99) = (pct(&relayed, 0.5), pct(&relayed, 0.99));
            let (h50, h99) = (pct(&handed, 0.5), pct(&handed, 0.99));
            println!(
                "{clients:<12} {:>9} {d50:>10.0} {d99:>10.0} {p50:>10.0} {p99:>10.0} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>12.0} {:>12.0}",
                proxied.len(),
                p50 - d50,
                p99 - d99,
                w50 - d50,
                w99 - d99,
                h50 - d50,
                h99 - d99
            );
        }
        }

        if want("throughput") {
        println!("\nthroughput, unpaced streams of {MODEL} (8 at a time, 64 requests)");
        for (label, base) in [("direct", fast.url()), ("proxy", format!("http://{}", fast_proxy.local_addr()))] {
            let start = Instant::now();
            let mut bytes = 0;
            for _ in 0..8 {
                let batch = (0..8).map(|_| stream(&http, &base, false));
                bytes += futures::future::join_all(batch).await.into_iter().map(|(_, n)| n).sum::<usize>();
            }
            let secs = start.elapsed().as_secs_f64();
            println!("{label:<8} {:>8.1} MB/s  ({bytes} bytes in {secs:.2} s)", bytes as f64 / secs / 1e6);
        }

        }

        // Tool calling against pass-through, same profile, same upstream.
        if want("tools") {
        let chat = |upstream: String, tools: bool| {
            let mut c = ProxyConfig::new(upstream);
            c.options = StreamOptions::with_registry(Registry::chat());
            c.tool_calling = tools.then(|| ToolCalling::new(Protocol::Hermes));
            c
        };
        let plain = start(&prt, chat(paced.url(), false)).await;
        let tooled = start(&prt, chat(paced.url(), true)).await;
        let tools = serde_json::json!([{"type": "function", "function": {"name": "get_current_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "state": {"type": "string"},
            "unit": {"type": "string"}}, "required": ["city"]}}}]);
        println!("\ntool calling: per-chunk latency (µs), chat profile, {pace} ms between events, 8 streams each");
        println!("{:<24} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}", "transcript", "events", "direct p50", "direct p99", "pass p50", "pass p99", "tools p50", "tools p99");
        for model in [MODEL, "tools/hermes-weather"] {
            let body = serde_json::json!({"model": model, "stream": true, "tools": tools,
                "messages": [{"role": "user", "content": "go"}]});
            let _ = load_body(&http, &format!("http://{}", tooled.local_addr()), &body, 2).await;
            let direct = load_body(&http, &paced.url(), &body, 8).await;
            let pass = load_body(&http, &format!("http://{}", plain.local_addr()), &body, 8).await;
            let tool = load_body(&http, &format!("http://{}", tooled.local_addr()), &body, 8).await;
            println!(
                "{model:<24} {:>7} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
                tool.len(),
                pct(&direct, 0.5),
                pct(&direct, 0.99),
                pct(&pass, 0.5),
                pct(&pass, 0.99),
                pct(&tool, 0.5),
                pct(&tool, 0.99)
            );
            println!(
                "{:<24} added by the proxy, p50: pass-through {:.0} µs, tool protocol {:.0} µs",
                "",
                pct(&pass, 0.5) - pct(&direct, 0.5),
                pct(&tool, 0.5) - pct(&direct, 0.5)
            );
        }
        let _ = plain.shutdown().await;
        let _ = tooled.shutdown().await;
        }

        // CPU per chunk, paced vs back to back, and streams/s, on a short
        // transcript of about 64 chunks.
        if want("cpu") {
        let words = "The keeper climbed the stairs and lit the lamp above the water tonight. ".repeat(12);
        let short = format!("<content>{}</content>", words.trim_end());
        let t = spindle::mock::Transcript::from_bytes("short".into(), "short.txt".into(), short.as_bytes())
            .expect("a text transcript");
        let slow = MockUpstream::new(vec![t.clone()]).with_pace(Duration::from_millis(20)).spawn("127.0.0.1:0").await.expect("mock");
        let quick = MockUpstream::new(vec![t]).spawn("127.0.0.1:0").await.expect("mock");
        let via_slow = start(&prt, config(slow.url())).await;
        let via_quick = start(&prt, config(quick.url())).await;
        let (via_slow, via_quick) = (format!("http://{}", via_slow.local_addr()), format!("http://{}", via_quick.local_addr()));
        let _ = cpu_of(&http, &via_quick, "short", 8).await;
        let per = |p: f64, n: usize| p / n.max(1) as f64 * 1e6;
        let wire_slow = wire(&prt, &slow.url(), Relay::Direct).await;
        let wire_quick = wire(&prt, &quick.url(), Relay::Direct).await;
        let _ = cpu_of(&http, &wire_quick, "short", 8).await;
        let handoff_slow = wire(&prt, &slow.url(), Relay::Handoff).await;
        let handoff_quick = wire(&prt, &quick.url(), Relay::Handoff).await;
        let _ = cpu_of(&http, &handoff_quick, "short", 8).await;
        println!("\nCPU per chunk on the proxies' core, paced 20 ms / back to back (32 streams of 81 chunks):");
        for (label, slow_base, quick_base) in [
            ("proxy", &via_slow, &via_quick),
            ("wire", &wire_slow, &wire_quick),
            ("handoff", &handoff_slow, &handoff_quick),
        ] {
            let (p_paced, n_paced) = cpu_of(&http, slow_base, "short", 32).await;
            let (p_fast, n_fast) = cpu_of(&http, quick_base, "short", 32).await;
            let (paced_us, fast_us) = (per(p_paced, n_paced), per(p_fast, n_fast));
            println!("  {label:<8} {paced_us:>6.1} µs / {fast_us:>6.1} µs, ratio {:.2}", paced_us / fast_us.max(0.001));
        }
        println!("streams/s, 64-chunk streams, 64 at a time for 3 s (the generator and mock on one core, the proxy on the other):");
        for (label, base) in [("direct", quick.url()), ("proxy", via_quick.clone())] {
            let deadline = Instant::now() + Duration::from_secs(3);
            let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let workers = (0..64).map(|_| {
                let (http, base, done) = (http.clone(), base.clone(), done.clone());
                async move {
                    let body = serde_json::json!({"model": "short", "stream": true, "messages": [{"role": "user", "content": "go"}]});
                    while Instant::now() < deadline {
                        if stream_body(&http, &base, false, &body).await.1 > 0 {
                            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
            });
            let (start, cpu) = (Instant::now(), proxy_cpu_secs());
            futures::future::join_all(workers).await;
            let n = done.load(std::sync::atomic::Ordering::Relaxed);
            let (secs, busy) = (start.elapsed().as_secs_f64(), proxy_cpu_secs() - cpu);
            let rate = n as f64 / secs;
            if label == "proxy" && busy > 0.0 {
                // The generator may saturate first: how busy the proxy's
                // core was says what one core of it would serve.
                let share = busy / secs;
                println!("  {label:<8} {rate:>8.0} streams/s, its core {:.0}% busy: about {:.0} streams/s at 100%", share * 100.0, rate / share);
            } else {
                println!("  {label:<8} {rate:>8.0} streams/s");
            }
        }
        }
        if want("memory") {
            let streams: usize =
                std::env::var("PROXY_BENCH_STREAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
            let held = MockUpstream::from_dir(&corpora)
                .expect("corpora")
                .with_pace(Duration::from_secs(60))
                .spawn("127.0.0.1:0")
                .await
                .expect("mock");
            println!("\nmemory of the release binary (`spindle proxy --profile filament`, a child process), VmRSS:");
            match memory(&held.url(), streams).await {
                Some(m) => {
                    println!("  idle {:.1} MiB", m.idle_kib as f64 / 1024.0);
                    println!(
                        "  {} streams open ({} answered) {:.1} MiB: {:.1} KiB per open stream",
                        m.streams,
                        m.answered,
                        m.open_kib as f64 / 1024.0,
                        m.open_kib.saturating_sub(m.idle_kib) as f64 / m.streams.max(1) as f64
                    );
                }
                None => println!("  skipped: the `spindle` binary was not built (feature `cli`) or did not start"),
            }
        }
        let _ = proxy.shutdown().await;
        let _ = fast_proxy.shutdown().await;
    });

    if !want("replay") {
        return;
    }
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/recorded");
    match replay_throughput(&recorded) {
        Some((streams, bytes, mbps)) => {
            println!("\nreplay of ../shared/recorded: {streams} streams, {bytes} bytes, {mbps:.1} MB/s (best of 3)")
        }
        None => println!("\nreplay: ../shared/recorded not found; skipped"),
    }
}
