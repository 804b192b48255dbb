//! The NATS broker sink against a real `nats-server` (the Debian package
//! `nats-server`; `.ci/run` installs it): every test starts its own server
//! on 127.0.0.1 with a free port and stops it. Records arrive complete and
//! in order per stream with several streams at once; a broker killed and
//! restarted mid-run leaves the client streams byte-identical and on time,
//! the loss is counted and publishing resumes; a broker that is down from
//! the start costs the clients nothing; JetStream acknowledgements; the
//! `block` policy loses nothing.
//!
//! Without `nats-server` on the PATH (or in `NATS_SERVER`) each test
//! prints why it is skipped and passes.

mod proxy_support;

use futures::StreamExt;
use proxy_support::*;
use serde_json::Value;
use spindle::proxy::{Metrics, ProxyHandle, SinkRecord, SinkSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The `nats-server` binary, or `None` (with the reason printed).
fn nats_bin() -> Option<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let candidates = std::env::var_os("NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::split_paths(&path_var).map(|d| d.join("nats-server")))
        .chain([PathBuf::from("/usr/bin/nats-server"), PathBuf::from("/usr/sbin/nats-server")]);
    for path in candidates {
        if path.is_file() {
            return Some(path);
        }
    }
    eprintln!("skipped: nats-server not found (apt-get install nats-server, or set NATS_SERVER)");
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `nats-server` process on 127.0.0.1 (killed when dropped).
struct Broker {
    bin: PathBuf,
    port: u16,
    store: Option<PathBuf>,
    child: Option<Child>,
}

impl Broker {
    async fn start(bin: &Path, port: u16, store: Option<PathBuf>) -> Broker {
        let mut broker = Broker { bin: bin.to_path_buf(), port, store, child: None };
        broker.restart().await;
        broker
    }

    /// Starts the server (again) on the same port and waits until it
    /// accepts connections.
    async fn restart(&mut self) {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(dir) = &self.store {
            cmd.arg("-js").arg("-sd").arg(dir);
        }
        self.child = Some(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("nats-server starts"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen on {}", self.port);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the server (SIGKILL: a crash, not a clean shutdown).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn label(&self, subject: &str) -> String {
        format!("nats://127.0.0.1:{}/{subject}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
        if let Some(dir) = &self.store {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn store_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("spindle-nats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Polls until `check` holds on the proxy's metrics (10 s at most).
async fn until(metrics: &Metrics, what: &str, check: impl Fn(&Metrics) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check(metrics) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{}", metrics.render());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn connected(metrics: &Metrics, label: &str) -> bool {
    metrics.render().contains(&format!("spindle_proxy_sink_connected{{sink=\"{label}\"}} 1"))
}

/// Streams `name` through the proxy: the body and how long it took.
async fn stream(base: &str, name: &str) -> (bytes::Bytes, Duration) {
    let started = Instant::now();
    let response =
        client().post(format!("{base}/v1/chat/completions")).json(&request(name, true)).send().await.unwrap();
    assert!(response.status().is_success(), "{name}: {}", response.status());
    let body = response.bytes().await.unwrap();
    (body, started.elapsed())
}

/// Every record the channel sink got (after the proxy shut down), as JSON.
async fn drain(mut rx: mpsc::Receiver<Arc<SinkRecord>>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(r) = rx.recv().await {
        out.push(serde_json::to_value(&*r).unwrap());
    }
    out
}

/// Records grouped by stream, in arrival order.
fn by_stream(records: &[Value]) -> BTreeMap<u64, Vec<Value>> {
    let mut out: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    for r in records {
        out.entry(r["stream"].as_u64().unwrap()).or_default().push(r.clone());
    }
    out
}

/// Receives `n` messages (or what arrives within `wait` of the last one).
async fn receive(sub: &mut async_nats::Subscriber, n: usize, wait: Duration) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(wait, sub.next()).await {
            Ok(Some(m)) => out.push((m.subject.to_string(), serde_json::from_slice(&m.payload).unwrap())),
            _ => break,
        }
    }
    out
}

const NAMES: [&str; 7] = [
    "clean-every-tag-zh-ruins",
    "missing-content-tags-en",
    "sse-filament-tags",
    "sse-parallel-tool-calls",
    "sse-n2-interleaved",
    "sse-deepseek-reasoning",
    "stray-closes-zh",
];

async fn nats_proxy(upstream: &str, spec: &str) -> (ProxyHandle, mpsc::Receiver<Arc<SinkRecord>>) {
    let (tx, rx) = mpsc::channel(1_000_000);
    let spec: SinkSpec = spec.parse().unwrap();
    let proxy = proxy(upstream, |c| c.sinks = vec![spec, SinkSpec::Channel(tx)]).await;
    (proxy, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_complete_and_in_order_per_stream() {
    let Some(bin) = nats_bin() else { return };
    let broker = Broker::start(&bin, free_port(), None).await;
    let subscriber = async_nats::connect(broker.url()).await.unwrap();
    let mut sub = subscriber.subscribe("spindle.>").await.unwrap();
    subscriber.flush().await.unwrap();
    let mock = mock(1).await;
    let (proxy, rx) = nats_proxy(&mock.url(), &format!("{}/spindle?instance=t1", broker.url())).await;
    let metrics = proxy.metrics();
    let label = broker.label("spindle");
    until(&metrics, "the sink to connect", |m| connected(m, &label)).await;

    // Several streams at once (each name twice).
    let base = url(&proxy);
    let runs = NAMES.iter().chain(NAMES.iter()).map(|name| stream(&base, name));
    let bodies = futures::future::join_all(runs).await;
    assert!(bodies.iter().all(|(b, _)| b.ends_with(b"data: [DONE]\n\n")));
    proxy.shutdown().await.unwrap();

    let reference = drain(rx).await;
    assert!(reference.len() > 100, "{} records", reference.len());
    let got = receive(&mut sub, reference.len(), Duration::from_secs(5)).await;
    assert_eq!(got.len(), reference.len(), "every record published arrives");
    for (subject, record) in &got {
        let expected = format!("spindle.t1.{}.{}", record["stream"], record["type"].as_str().unwrap());
        assert_eq!(subject, &expected);
    }
    let got: Vec<Value> = got.into_iter().map(|(_, r)| r).collect();
    let (want, have) = (by_stream(&reference), by_stream(&got));
    assert_eq!(want.len(), NAMES.len() * 2);
    for (stream, records) in &want {
        assert_eq!(have.get(stream), Some(records), "stream {stream}: complete and in order");
    }
    let kinds: std::collections::BTreeSet<&str> = got.iter().filter_map(|r| r["type"].as_str()).collect();
    for kind in ["element", "repair", "finish", "call_delta"] {
        assert!(kinds.contains(kind), "{kind} in {kinds:?}");
    }
    assert_eq!(metrics.sink_records(&label), reference.len() as u64);
    assert_eq!(metrics.sink_dropped_for(&label), 0);
    assert_eq!(metrics.sink_failed_for(&label), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restarted_mid_run_leaves_clients_alone_and_counts_the_loss() {
    let Some(bin) = nats_bin() else { return };
    let mut broker = Broker::start(&bin, free_port(), None).await;
    // Paced: each stream takes between one and three seconds.
    let mock = mock(4).await;
    let (proxy, rx) = nats_proxy(&mock.url(), &format!("{}/spindle?instance=r1", broker.url())).await;
    let metrics = proxy.metrics();
    let label = broker.label("spindle");
    until(&metrics, "the sink to connect", |m| connected(m, &label)).await;

    // The same streams, straight from the mock and through the proxy, at
    // the same time; the broker is killed and restarted while they run.
    let base = url(&proxy);
    let names = ["clean-every-tag-zh-ruins", "missing-content-tags-en", "stray-closes-zh", "clean-rp-zh-teahouse"];
    let mock_url = mock.url();
    let finished = std::sync::atomic::AtomicUsize::new(0);
    let direct = futures::future::join_all(names.iter().map(|n| stream(&mock_url, n)));
    let proxied = futures::future::join_all(names.iter().map(|n| async {
        let out = stream(&base, n).await;
        finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        out
    }));
    let chaos = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        broker.kill();
        until(&metrics, "the sink to notice", |m| !connected(m, &label)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        broker.restart().await;
        finished.load(std::sync::atomic::Ordering::SeqCst)
    };
    let (direct, proxied, finished_before_restart) = tokio::join!(direct, proxied, chaos);
    assert_eq!(finished_before_restart, 0, "every stream was running through the outage");
    let mut worst = Duration::ZERO;
    for ((name, (d, d_time)), (p, p_time)) in names.iter().zip(&direct).zip(&proxied) {
        assert!(d == p, "{name}: the proxied stream differs from the direct one");
        worst = worst.max(p_time.saturating_sub(*d_time));
        eprintln!("{name}: direct {d_time:?}, proxied {p_time:?}");
    }
    assert!(worst < Duration::from_millis(400), "the proxied streams took {worst:?} longer than the direct ones");

    // Publishing resumes after the reconnect.
    until(&metrics, "the reconnect", |m| m.sink_reconnects(&label) == 1 && connected(m, &label)).await;
    let subscriber = async_nats::connect(broker.url()).await.unwrap();
    let mut sub = subscriber.subscribe("spindle.>").await.unwrap();
    subscriber.flush().await.unwrap();
    let before = metrics.sink_records(&label);
    let (after, _) = stream(&base, "sse-parallel-tool-calls").await;
    assert!(after.ends_with(b"data: [DONE]\n\n"));
    proxy.shutdown().await.unwrap();
    let reference = drain(rx).await;
    let last_stream = reference.iter().filter_map(|r| r["stream"].as_u64()).max().unwrap();
    let want: Vec<Value> = reference.iter().filter(|r| r["stream"] == last_stream).cloned().collect();
    let got: Vec<Value> =
        receive(&mut sub, want.len(), Duration::from_secs(5)).await.into_iter().map(|(_, r)| r).collect();
    assert_eq!(got, want, "the stream after the restart arrives whole and in order");

    // The loss is counted: every record was published, dropped or failed.
    let (published, dropped, failed) =
        (metrics.sink_records(&label), metrics.sink_dropped_for(&label), metrics.sink_failed_for(&label));
    eprintln!(
        "records {}, published {published} ({before} before the last stream), dropped {dropped}, failed {failed}",
        reference.len()
    );
    assert!(dropped > 0, "records made while the broker was down are dropped and counted");
    assert_eq!(published + dropped + failed, reference.len() as u64);
    let text = metrics.render();
    assert!(text.contains(&format!("spindle_proxy_sink_reconnects_total{{sink=\"{label}\"}} 1")), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_from_the_start_costs_the_clients_nothing() {
    let Some(_bin) = nats_bin() else { return };
    let port = free_port();
    let mock = mock(0).await;
    let (proxy, rx) = nats_proxy(&mock.url(), &format!("nats://127.0.0.1:{port}/spindle")).await;
    let metrics = proxy.metrics();
    let label = format!("nats://127.0.0.1:{port}/spindle");
    let base = url(&proxy);
    let health: Value = client().get(format!("{base}/healthz")).send().await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    for name in NAMES {
        let (direct, _) = stream(&mock.url(), name).await;
        let (proxied, _) = stream(&base, name).await;
        assert!(direct == proxied, "{name}");
    }
    proxy.shutdown().await.unwrap();
    let reference = drain(rx).await;
    assert!(!reference.is_empty());
    assert_eq!(metrics.sink_dropped_for(&label), reference.len() as u64, "every record dropped and counted");
    assert_eq!(metrics.sink_records(&label), 0);
    assert!(!connected(&metrics, &label));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_acknowledges_every_record() {
    let Some(bin) = nats_bin() else { return };
    let broker = Broker::start(&bin, free_port(), Some(store_dir("js"))).await;
    let nats = async_nats::connect(broker.url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let mut events = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "SPINDLE".into(),
            subjects: vec!["acked.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mock = mock(0).await;
    // One sink into the stream, one on subjects no stream covers.
    let (tx, rx) = mpsc::channel(1_000_000);
    let acked: SinkSpec = format!("{}/acked?jetstream=1&instance=j1", broker.url()).parse().unwrap();
    let unacked: SinkSpec = format!("{}/nowhere?jetstream=1", broker.url()).parse().unwrap();
    let proxy = proxy(&mock.url(), |c| c.sinks = vec![acked, unacked, SinkSpec::Channel(tx)]).await;
    let metrics = proxy.metrics();
    let (label, nowhere) = (broker.label("acked"), broker.label("nowhere"));
    until(&metrics, "the sinks to connect", |m| connected(m, &label) && connected(m, &nowhere)).await;
    let base = url(&proxy);
    futures::future::join_all(NAMES.iter().map(|n| stream(&base, n))).await;
    proxy.shutdown().await.unwrap();
    let reference = drain(rx).await;

    let n = reference.len() as u64;
    assert_eq!(metrics.sink_records(&label), n, "every record acknowledged");
    assert_eq!(metrics.sink_failed_for(&label), 0);
    assert_eq!(metrics.sink_failed_for(&nowhere), n, "no stream covers the subject: every record failed");
    assert_eq!(metrics.sink_records(&nowhere), 0);
    let info = events.info().await.unwrap();
    assert_eq!(info.state.messages, n);
    let mut stored = Vec::new();
    for seq in 1..=n {
        let m = events.get_raw_message(seq).await.unwrap();
        let id = m.headers.get("Nats-Msg-Id").map(|v| v.to_string()).unwrap_or_default();
        assert!(id.starts_with("j1-"), "{id}");
        stored.push(serde_json::from_slice::<Value>(&m.payload).unwrap());
    }
    assert_eq!(by_stream(&stored), by_stream(&reference), "stored complete and in order per stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_policy_waits_for_the_broker_and_loses_nothing() {
    let Some(bin) = nats_bin() else { return };
    let port = free_port();
    let mock = mock(0).await;
    let spec = format!("nats://127.0.0.1:{port}/held?jetstream=1&overflow=block&queue=2");
    let (proxy, rx) = nats_proxy(&mock.url(), &spec).await;
    let metrics = proxy.metrics();
    let label = format!("nats://127.0.0.1:{port}/held");
    let base = url(&proxy);
    let pending = tokio::spawn(async move { stream(&base, "clean-every-tag-zh-ruins").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!pending.is_finished(), "with the broker down, a blocking sink holds the stream");

    let broker = Broker::start(&bin, port, Some(store_dir("block"))).await;
    let nats = async_nats::connect(broker.url()).await.unwrap();
    let js = async_nats::jetstream::new(nats);
    let mut held = js
        .create_stream(async_nats::jetstream::stream::Config {
            name: "HELD".into(),
            subjects: vec!["held.>".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let (body, _) = tokio::time::timeout(Duration::from_secs(30), pending).await.unwrap().unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    proxy.shutdown().await.unwrap();
    let reference = drain(rx).await;
    assert_eq!(metrics.sink_dropped_for(&label), 0);
    assert_eq!(metrics.sink_records(&label), reference.len() as u64);
    assert_eq!(held.info().await.unwrap().state.messages, reference.len() as u64);
}
