//! `spindle proxy --config FILE` and `--print-config`, run as real
//! processes: one exact error line for a bad file, flags over the file,
//! secrets from the environment never printed, the printed configuration
//! read back unchanged, a proxy started from a file; and the upstream API
//! key sent to a real local upstream.

mod proxy_support;

use axum::Router;
use axum::http::HeaderMap;
use proxy_support::*;
use spindle::proxy::Secret;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}")
}

fn spindle() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    for var in ["SPINDLE_UPSTREAM_API_KEY", "SPINDLE_NATS_TOKEN", "SPINDLE_UPSTREAM", "SPINDLE_LISTEN", "RUST_LOG"] {
        cmd.env_remove(var);
    }
    cmd
}

fn file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("spindle-config-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().unwrap()
}

#[test]
fn a_bad_file_gives_one_line_naming_the_key_and_the_line() {
    let cases = [
        (
            "unknown.toml",
            "listen = \"127.0.0.1:0\"\n\n[limits]\nmax_streams = 8\nmax_stream = 9\n",
            "line 5: limits.max_stream: unknown field `max_stream`, expected one of `max_streams`, `max_line`, \
             `max_request_body`, `max_response_body`, `grace`, `channel_capacity`, `request_timeout`, \
             `max_connections`, `max_request_buffer`, `max_ws_message`",
        ),
        (
            "type.toml",
            "[upstream]\nurl = \"http://127.0.0.1:9\"\nidle_timeout = \"soon\"\n",
            "line 3: upstream.idle_timeout: invalid type: string \"soon\", expected f64",
        ),
        (
            "range.toml",
            "[upstream]\nidle_timeout = 0\n",
            "line 2: upstream.idle_timeout: expected a positive number of seconds",
        ),
        (
            "sink.toml",
            "[sink]\ntargets = [\n  \"jsonl:a.jsonl\",\n  \"nats://127.0.0.1:4222/bad subject\",\n]\n",
            "line 4: sink.targets[1]: bad sink \"nats://127.0.0.1:4222/bad subject\": \"bad subject\" is not a subject \
             to publish to (dot-separated tokens, no spaces, * or >) (expected jsonl:FILE, webhook:URL or \
             nats://HOST:PORT/SUBJECT)",
        ),
        (
            "section.toml",
            "[sinks]\nqueue = 5\n",
            "line 1: sinks: unknown field `sinks`, expected one of `listen`, `log`, `upstream`, `parse`, `limits`, `sink`, `otel`, `ui`, `tools`, `access`",
        ),
        ("syntax.toml", "[upstream\nurl = 1\n", "line 1: unclosed table, expected `]`"),
        (
            "value.toml",
            "[upstream]\nurl = \"http://x\"\nidle_timeout = 5 5\n",
            "line 3: string values must be quoted, expected literal string",
        ),
    ];
    for (name, text, want) in cases {
        let path = file(name, text);
        let out = run(spindle().args(["proxy", "--config"]).arg(&path));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr, format!("spindle: error: config {}, {want}\n", path.display()), "{name}");
        assert!(out.stdout.is_empty());
        let _ = std::fs::remove_file(path);
    }
    let out = run(spindle().args(["proxy", "--config", "/nonexistent/spindle.toml"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("spindle: error: config /nonexistent/spindle.toml: cannot read it: ")
            && stderr.lines().count() == 1,
        "{stderr}"
    );
}

#[test]
fn print_config_lays_flags_over_the_file_and_hides_secrets() {
    let path = file(
        "print.toml",
        "log = \"debug\"\n[upstream]\nurl = \"http://127.0.0.1:9\"\napi_key = \"sk-from-file\"\n\
         [limits]\nmax_streams = 3\ngrace = 2.5\n[sink]\ntargets = [\"jsonl:a.jsonl\"]\n",
    );
    let out = run(spindle()
        .args(["proxy", "--print-config", "--max-streams", "7", "--sink", "nats://user:hunter2@127.0.0.1:4222/ev"])
        .arg("--config")
        .arg(&path)
        .env("SPINDLE_UPSTREAM_API_KEY", "sk-from-env")
        .env("SPINDLE_NATS_TOKEN", "nats-s3cret"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    for secret in ["sk-from-file", "sk-from-env", "nats-s3cret", "hunter2"] {
        assert!(!printed.contains(secret), "{secret} printed:\n{printed}");
    }
    let value: toml::Table = printed.parse().unwrap();
    assert_eq!(value["log"].as_str(), Some("debug"), "from the file");
    assert_eq!(value["limits"]["max_streams"].as_integer(), Some(7), "the flag wins");
    assert_eq!(value["limits"]["grace"].as_float(), Some(2.5));
    assert_eq!(value["limits"]["max_request_body"].as_integer(), Some(32 * 1024 * 1024), "defaults shown");
    let targets = value["sink"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 1, "given --sink flags replace the file's list");
    assert_eq!(targets[0].as_str(), Some("nats://user:***@127.0.0.1:4222/ev"));
    assert!(printed.contains("# upstream.api_key: set, not printed (secret; from SPINDLE_UPSTREAM_API_KEY)"));
    assert!(printed.contains("# sink.nats_token: set, not printed (secret; from SPINDLE_NATS_TOKEN)"));

    // What was printed reads back to the same configuration (but secrets).
    let again = file("again.toml", &printed);
    let out = run(spindle().args(["proxy", "--print-config", "--config"]).arg(&again));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reprinted = String::from_utf8(out.stdout).unwrap();
    let body = |t: &str| t.lines().filter(|l| !l.starts_with('#')).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(body(&reprinted), body(&printed));
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(again);
}

#[test]
fn tool_calling_options_have_keys_and_are_printed() {
    let plugins = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plugins");
    let out = run(spindle().args(["proxy", "--upstream", "http://127.0.0.1:9", "--print-config"]).args([
        "--tool-protocol",
        "tam",
        "--invalid-calls",
        "drop",
        "--agent",
        "--tools",
        plugins,
        "--agent-max-steps",
        "3",
        "--tool-timeout-ms",
        "100",
        "--tool-path",
        "/opt/tools/bin:/usr/bin",
        "--agent-async-tasks",
        "wait",
    ]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8(out.stdout).unwrap();
    let value: toml::Table = printed.parse().unwrap();
    let tools = &value["tools"];
    assert_eq!(tools["protocol"].as_str(), Some("tam"), "{printed}");
    assert_eq!(tools["invalid_calls"].as_str(), Some("drop"));
    assert_eq!(tools["agent"].as_bool(), Some(true));
    assert_eq!(tools["dir"].as_str(), Some(plugins));
    assert_eq!(tools["agent_max_steps"].as_integer(), Some(3));
    assert_eq!(tools["timeout_ms"].as_integer(), Some(100));
    assert_eq!(tools["path"].as_str(), Some("/opt/tools/bin:/usr/bin"));
    assert_eq!(tools["agent_async_tasks"].as_str(), Some("wait"));
    assert_eq!(value["parse"]["profile"].as_str(), Some("tam"), "the profile that reads TAM calls");

    // The same from a file, with a flag over it.
    let path = file("tools.toml", &printed);
    let out = run(spindle().args(["proxy", "--print-config", "--agent-max-steps", "4", "--config"]).arg(&path));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let value: toml::Table = String::from_utf8(out.stdout).unwrap().parse().unwrap();
    assert_eq!(value["tools"]["agent_max_steps"].as_integer(), Some(4));
    assert_eq!(value["tools"]["protocol"].as_str(), Some("tam"));

    // The agent without its tools says what it needs.
    let out =
        run(spindle().args(["proxy", "--upstream", "http://127.0.0.1:9", "--tool-protocol", "hermes", "--agent"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("tools.agent: the agent loop needs tools.dir (--tools DIR)"), "{stderr}");
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_runs_from_a_config_file() {
    let mock = mock(0).await;
    let records = std::env::temp_dir().join(format!("spindle-config-{}-records.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&records);
    let path = file(
        "run.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\nlog = \"warn\"\n[upstream]\nurl = \"{}\"\n[parse]\nprofile = \"filament\"\n\
             [sink]\ntargets = [\"jsonl:{}\"]\n",
            mock.url(),
            records.display()
        ),
    );
    let mut child = spindle()
        .args(["proxy", "--config"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stderr).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    assert!(first.contains("(profile filament)"), "{first}");
    let base = first.split_whitespace().find(|w| w.starts_with("http://")).unwrap().trim_end_matches("/v1").to_string();
    let body = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&request("missing-content-tags-en", true))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let written = loop {
        let text = std::fs::read_to_string(&records).unwrap_or_default();
        if text.contains("\"type\":\"finish\"") || std::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(written.lines().any(|l| l.contains("\"type\":\"element\"")), "{written}");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(records);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_api_key_goes_only_where_the_client_sent_none() {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let store = seen.clone();
    let upstream = serve(Router::new().route(
        "/v1/models",
        axum::routing::get(move |headers: HeaderMap| {
            let store = store.clone();
            async move {
                let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string);
                store.lock().unwrap().push(auth);
                axum::Json(serde_json::json!({"object": "list", "data": []}))
            }
        }),
    ))
    .await;
    let proxy = proxy(&upstream, |c| c.upstream_api_key = Some(Secret::new("sk-upstream"))).await;
    let http = client();
    let _ = http.get(format!("{}/v1/models", url(&proxy))).send().await.unwrap().bytes().await.unwrap();
    let _ = http
        .get(format!("{}/v1/models", url(&proxy)))
        .header("authorization", "Bearer sk-client")
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    proxy.shutdown().await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Some("Bearer sk-upstream".to_string()), Some("Bearer sk-client".to_string())]
    );
    assert!(!format!("{:?}", Secret::new("sk-upstream")).contains("sk-upstream"));
}

#[test]
fn public_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<spindle::proxy::ProxySettings>();
    both::<spindle::proxy::ProxyOverrides>();
    both::<spindle::proxy::SettingsError>();
    both::<spindle::proxy::Secret>();
    both::<spindle::proxy::NatsSink>();
    both::<spindle::proxy::NatsSpecError>();
    both::<spindle::proxy::Overflow>();
}

/// An upstream URL with a user name or password is refused (it would not
/// be sent, and it is printed wherever the URL is), and the refusal masks
/// the password.
#[test]
fn an_upstream_url_with_credentials_is_refused_masked() {
    let out =
        run(spindle().args(["proxy", "--listen", "127.0.0.1:0", "--upstream", "http://user:hunter2@127.0.0.1:9/v1"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("user name or password") && stderr.contains("user:***@"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
