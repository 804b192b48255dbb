//! Helpers shared by the proxy tests: real servers on 127.0.0.1:0 (the
//! mock upstream, the proxy, small purpose-built upstreams) and SSE
//! reading.

#![allow(dead_code)]

use spindle::Registry;
use spindle::mock::{MockServer, MockUpstream};
use spindle::proxy::{ProxyConfig, ProxyHandle, ProxyServer};
use spindle::sources::{SseDecoder, SseItem, StreamOptions};
use std::path::PathBuf;
use std::time::Duration;

pub fn corpora() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpora")
}

/// The mock serving `corpora/`.
pub async fn mock(pace_ms: u64) -> MockServer {
    let mock = MockUpstream::from_dir(&corpora()).expect("corpora load");
    mock.with_pace(Duration::from_millis(pace_ms)).spawn("127.0.0.1:0").await.expect("mock binds")
}

/// A proxy in front of `upstream`, configured by `f`.
pub async fn proxy(upstream: &str, f: impl FnOnce(&mut ProxyConfig)) -> ProxyHandle {
    let mut config = ProxyConfig::new(upstream);
    config.options = StreamOptions::with_registry(Registry::filament());
    f(&mut config);
    ProxyServer::bind(config, "127.0.0.1:0").await.expect("proxy binds").spawn()
}

pub fn url(handle: &ProxyHandle) -> String {
    format!("http://{}", handle.local_addr())
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().expect("client")
}

/// The data of every event of an SSE body, in order.
pub fn datas(body: &[u8]) -> Vec<String> {
    let mut decoder = SseDecoder::new();
    let mut items = decoder.feed(body);
    items.extend(decoder.finish());
    items
        .into_iter()
        .filter_map(|i| match i {
            SseItem::Event(e) | SseItem::Unterminated(e) => Some(e.data),
            _ => None,
        })
        .collect()
}

/// The JSON chunks of an SSE body (`[DONE]` and non-JSON data left out).
pub fn chunks(body: &[u8]) -> Vec<serde_json::Value> {
    datas(body).iter().filter_map(|d| serde_json::from_str(d).ok()).collect()
}

/// The concatenated `delta.content` of choice 0.
pub fn content(body: &[u8]) -> String {
    chunks(body)
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["index"].as_u64().unwrap_or(0) == 0)
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// A chat-completion request for a transcript.
pub fn request(model: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "stream_options": if stream { serde_json::json!({"include_usage": true}) } else { serde_json::Value::Null },
        "messages": [{"role": "user", "content": "Continue."}],
    })
}

/// Fetches a proxy's `/metrics` text.
pub async fn metrics(handle: &ProxyHandle) -> String {
    client().get(format!("{}/metrics", url(handle))).send().await.expect("metrics").text().await.expect("text")
}

/// The value of one sample line of a Prometheus text (0 when absent).
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// POSTs `body` to `BASE/v1/chat/completions` and reads the JSON answer.
pub async fn chat_json(base: &str, body: &serde_json::Value) -> serde_json::Value {
    let response = client().post(format!("{base}/v1/chat/completions")).json(body).send().await.expect("request");
    response.json().await.expect("a JSON answer")
}

/// POSTs `body` to `BASE/v1/chat/completions` and reads the raw answer.
pub async fn chat_bytes(base: &str, body: &serde_json::Value) -> Vec<u8> {
    let response = client().post(format!("{base}/v1/chat/completions")).json(body).send().await.expect("request");
    response.bytes().await.expect("a body").to_vec()
}

/// `spindle proxy` as a real process, listening on a free port; killed
/// when dropped.
pub struct ProxyProcess {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The lines it wrote on stderr up to the one that says where it
    /// listens (or as far as `start_with` waited).
    pub stderr: Vec<String>,
}

impl ProxyProcess {
    /// Starts `spindle proxy --listen 127.0.0.1:0 --log warn ARGS` with
    /// `PATH` set to `path` and waits for the line that says where it
    /// listens.
    pub async fn start(args: &[&str], path: &str) -> ProxyProcess {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"));
        cmd.args(["proxy", "--listen", "127.0.0.1:0", "--log", "warn"]).args(args).env("PATH", path);
        ProxyProcess::start_with(cmd, |_| true).await
    }

    /// Starts `cmd` (a `spindle proxy` command line, perhaps behind a
    /// shell) and reads its stderr until it has said where it listens and
    /// `done` accepts the lines so far (20 s at most for each line).
    pub async fn start_with(
        mut cmd: std::process::Command,
        done: impl Fn(&[String]) -> bool + Send + 'static,
    ) -> ProxyProcess {
        use std::io::{BufRead, BufReader};
        let mut child = cmd
            .env_remove("RUST_LOG")
            .env_remove("SPINDLE_CONFIG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (lines, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        let seen = tokio::task::spawn_blocking(move || {
            let mut seen: Vec<String> = Vec::new();
            let listening = |seen: &[String]| seen.iter().any(|l| l.starts_with("spindle proxy: "));
            while !(listening(&seen) && done(&seen)) {
                match rx.recv_timeout(Duration::from_secs(20)) {
                    Ok(line) => seen.push(line),
                    Err(e) => panic!("the proxy did not start ({e}): {seen:?}"),
                }
            }
            seen
        })
        .await
        .unwrap();
        let line = seen.iter().find(|l| l.starts_with("spindle proxy: ")).unwrap();
        let base =
            line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().trim_end_matches("/v1").to_string();
        ProxyProcess { child, base, stderr: seen }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
