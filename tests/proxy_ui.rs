//! The live inspector page (`spindle proxy --ui`) in a real headless
//! Chromium, driven over the DevTools protocol: streams and their elements
//! appear while a paced transcript streams through the proxy, repairs are
//! shown, and hostile model output (`<script>`, `onerror=`, `javascript:`
//! URLs) never runs. A screenshot goes to `target/ui-inspector.png`.
//! Skips with a message when Chromium is not installed (`.ci/run`
//! installs it).

mod proxy_support;

use futures::{SinkExt, StreamExt};
use proxy_support::{client, url};
use serde_json::{Value, json};
use spindle::Registry;
use spindle::mock::MockUpstream;
use spindle::proxy::{ProxyConfig, ProxyServer, UiConfig};
use spindle::sources::StreamOptions;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|name| {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
    })
}

/// A headless Chromium with its DevTools port; killed on drop.
struct Browser {
    child: Child,
    port: u16,
    _profile: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Chromium's helper processes may still be writing to the profile
        // for a moment after the main process ends.
        for _ in 0..20 {
            if std::fs::remove_dir_all(&self._profile).is_ok() || !self._profile.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

fn launch(bin: &Path) -> Browser {
    let profile = std::env::temp_dir().join(format!("spindle-ui-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,800",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("about:blank")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let stderr = child.stderr.take().expect("stderr");
    let mut port = 0;
    for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("DevTools listening on ws://127.0.0.1:") {
            port = rest.split('/').next().and_then(|p| p.parse().ok()).unwrap_or(0);
            break;
        }
    }
    assert!(port > 0, "no DevTools port from chromium");
    Browser { child, port, _profile: profile }
}

/// One page over the DevTools protocol.
struct Page {
    ws: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    next: u64,
}

impl Page {
    async fn open(browser: &Browser) -> Page {
        let list: Value = client()
            .get(format!("http://127.0.0.1:{}/json/list", browser.port))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ws_url = list
            .as_array()
            .and_then(|l| l.iter().find(|t| t["type"] == "page"))
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (ws, _) = tokio_tungstenite::connect_async(ws_url).await.expect("devtools socket");
        Page { ws, next: 1 }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws.send(Message::text(msg)).await.unwrap();
        while let Some(Ok(m)) = self.ws.next().await {
            if let Message::Text(t) = m {
                let v: Value = serde_json::from_str(&t).unwrap_or_default();
                if v["id"] == id {
                    return v["result"].clone();
                }
            }
        }
        Value::Null
    }

    async fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true})).await;
        r["result"]["value"].clone()
    }

    /// Polls `expr` until it is true (or panics after `secs`).
    async fn wait(&mut self, expr: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if self.eval(expr).await == json!(true) {
                return;
            }
            let state = self.eval("document.getElementById('stream-rows').innerText + ' | ' + document.getElementById('elements').innerText.slice(0, 300)").await;
            assert!(Instant::now() < deadline, "timed out waiting for {expr}; page: {state}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_shows_live_streams_and_never_runs_model_output() {
    let Some(bin) = chromium() else {
        eprintln!("skipped: chromium is not installed (.ci/run installs it: apt-get install chromium)");
        return;
    };
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ui");
    let mock = MockUpstream::from_dir(&data).unwrap().with_pace(Duration::from_millis(25));
    let mock = mock.spawn("127.0.0.1:0").await.unwrap();
    let mut config = ProxyConfig::new(mock.url());
    config.options = StreamOptions::with_registry(Registry::filament());
    config.ui = Some(UiConfig { listen: "127.0.0.1:0".into(), ..UiConfig::default() });
    let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn();
    let ui = format!("http://{}/ui", proxy.ui_addr().expect("ui listens"));

    // The page's own headers: a strict CSP, no sniffing.
    let head = client().get(&ui).send().await.unwrap();
    let csp = head.headers()["content-security-policy"].to_str().unwrap_or_default().to_string();
    assert!(csp.contains("default-src 'self'") && csp.contains("script-src 'self'"), "{csp}");

    let browser = launch(&bin);
    let mut page = Page::open(&browser).await;
    page.call("Runtime.enable", json!({})).await;
    page.call("Page.navigate", json!({"url": ui})).await;
    page.wait("document.getElementById('status').textContent === 'live'", 20).await;

    // A paced stream: the page shows it live, its elements as they arrive.
    let endpoint = format!("{}/v1/chat/completions", url(&proxy));
    let paced = tokio::spawn({
        let endpoint = endpoint.clone();
        async move {
            let req = json!({"model": "paced", "stream": true, "messages": [{"role": "user", "content": "go"}]});
            client().post(&endpoint).json(&req).send().await.unwrap().bytes().await.unwrap()
        }
    });
    page.wait("!!document.querySelector('#stream-rows tr.live')", 20).await;
    page.wait("document.getElementById('elements').innerText.includes('lighthouse keeper')", 20).await;
    let live = page.eval("!!document.querySelector('#stream-rows tr.live')").await;
    assert_eq!(live, json!(true), "elements appeared while the stream was still live");
    paced.await.unwrap();
    page.wait("document.querySelector('#stream-rows td.outcome').textContent === 'ok'", 20).await;

    // Hostile output: shown as text, never run.
    let req = json!({"model": "hostile", "stream": true, "messages": [{"role": "user", "content": "go"}]});
    client().post(&endpoint).json(&req).send().await.unwrap().bytes().await.unwrap();
    page.wait("!!document.querySelector('#stream-rows tr[data-id=\"2\"]')", 20).await;
    page.eval("document.querySelector('#stream-rows tr[data-id=\"2\"]').click(); true").await;
    page.wait("document.getElementById('elements').innerText.includes(\"document.title='pwned'\")", 20).await;
    page.wait("document.querySelectorAll('#elements .repair').length > 0", 20).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(page.eval("document.title").await, json!("spindle inspector"));
    assert_eq!(page.eval("typeof window.pwned").await, json!("undefined"));
    let injected = page.eval("document.querySelectorAll('#elements script, #elements img, #elements a, #elements iframe, #elements svg').length").await;
    assert_eq!(injected, json!(0), "no markup from the model became elements");
    let text = page.eval("document.getElementById('elements').innerText").await;
    let text = text.as_str().unwrap_or_default();
    assert!(text.contains("onerror=") && text.contains("javascript:"), "{text}");

    // A screenshot for the record.
    let shot = page.call("Page.captureScreenshot", json!({"format": "png"})).await;
    if let Some(b64) = shot["data"].as_str() {
        use base64::Engine as _;
        if let Ok(png) = base64::engine::general_purpose::STANDARD.decode(b64) {
            let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-inspector.png");
            let _ = std::fs::write(&out, png);
            eprintln!("screenshot: {}", out.display());
        }
    }
    drop(page);
    drop(browser);
    proxy.shutdown().await.unwrap();
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_token_guards_the_page() {
    let mock = MockUpstream::builtin().spawn("127.0.0.1:0").await.unwrap();
    let mut config = ProxyConfig::new(mock.url());
    config.ui = Some(UiConfig { listen: "127.0.0.1:0".into(), token: Some("s3cret".into()), ..UiConfig::default() });
    let proxy = ProxyServer::bind(config, "127.0.0.1:0").await.unwrap().spawn();
    let ui = format!("http://{}", proxy.ui_addr().unwrap());
    for path in ["/ui", "/ui/api/streams", "/ui/api/events"] {
        let r = client().get(format!("{ui}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    // The page loads its script and style without the token (they hold no
    // data): with them refused, a page opened with its token stayed empty.
    let page = client().get(format!("{ui}/ui?token=s3cret")).send().await.unwrap().text().await.unwrap();
    for path in ["/ui/app.js", "/ui/app.css"] {
        assert!(page.contains(&format!("\"{path}\"")), "the page loads {path} as is: {page}");
        let r = client().get(format!("{ui}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let r = client().get(format!("{ui}/ui/api/streams?token=s3cret")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = client().get(format!("{ui}/ui/api/streams")).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(r.status(), 200);
    proxy.shutdown().await.unwrap();
    // Open to the network without a token: refused at start.
    let mut config = ProxyConfig::new(mock.url());
    config.ui = Some(UiConfig { listen: "0.0.0.0:0".into(), ..UiConfig::default() });
    let err = ProxyServer::bind(config, "127.0.0.1:0").await.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("SPINDLE_UI_TOKEN"), "{err}");
    mock.shutdown().await.unwrap();
}
