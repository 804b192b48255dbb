//! MCP tools against a real MCP server from a package registry:
//! `@modelcontextprotocol/server-everything` (npm), installed by `.ci/run`
//! into `.ci/cache/mcp`. When it (or `node`) is absent the tests say why
//! and skip.

use spindle::calls::ToolCatalog;
use spindle::tools::collect::CallCollector;
use spindle::tools::{McpPool, Outcome, Protocol, Runner, RunnerOptions, manual};
use spindle::{Registry, parse};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn server_script() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".ci/cache/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !p.is_file() {
        eprintln!("SKIP: {} is missing (run .ci/run, which installs it with npm)", p.display());
        return None;
    }
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIP: node is not installed");
        return None;
    }
    Some(p)
}

/// A plugin folder whose plugin.yaml starts the server (removed when the
/// guard drops).
fn plugin_dir(name: &str, timeout_ms: u64) -> Option<tempfile::TempDir> {
    let script = server_script()?;
    let dir = tempfile::Builder::new().prefix(&format!("spindle-mcp-{name}-")).tempdir().ok()?;
    let yaml = format!(
        "name: everything\ndescription: the MCP reference test server\nmcp:\n  command: [\"node\", {:?}, \"stdio\"]\n  env: {{ SPINDLE_GIVEN: \"yes\" }}\n  timeout: {timeout_ms}\n  prefix: \"everything.\"\n  only: [echo, get-sum, get-env, trigger-long-running-operation]\n",
        script.display().to_string()
    );
    std::fs::write(dir.path().join("plugin.yaml"), yaml).ok()?;
    Some(dir)
}

async fn start(dir: &Path) -> (Runner, Arc<McpPool>) {
    let mut catalog = ToolCatalog::load_plugins(dir).unwrap_or_else(|e| panic!("{e}"));
    let pool = McpPool::start(&mut catalog, &RunnerOptions::default()).await.unwrap_or_else(|e| panic!("{e}"));
    let pool = Arc::new(pool);
    let mut runner = Runner::new(catalog);
    runner.set_mcp(pool.clone());
    (runner, pool)
}

fn calls(profile: &str, text: &str) -> Vec<spindle::calls::ToolCall> {
    let registry = Registry::profile(profile).unwrap_or_else(|| panic!("{profile}"));
    let events = parse(registry.clone(), text.as_bytes());
    let mut col = CallCollector::new(registry.into());
    events.iter().filter_map(|e| col.observe(e)).map(|(_, c)| c).collect()
}

fn alive(pid: u32) -> bool {
    // A zombie has an empty command line; a reaped process has no entry.
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| !c.is_empty())
}

#[tokio::test]
async fn mcp_tools_join_the_catalog_and_run_from_text_calls() {
    let Some(dir) = plugin_dir("run", 5000) else { return };
    let (runner, pool) = start(dir.path()).await;
    let ids: Vec<&str> = runner.catalog().tools().map(|t| t.id.as_str()).collect();
    assert_eq!(
        ids,
        ["everything.echo", "everything.get-env", "everything.get-sum", "everything.trigger-long-running-operation"]
    );
    for p in Protocol::ALL {
        let text = manual(runner.catalog().tools(), p);
        assert!(text.contains("get-sum") || text.contains("get_sum"), "{p}");
        assert!(text.contains("message"), "{p}: the echo schema's parameter");
    }
    // A TAM call: its text values are converted to the schema's numbers.
    let tam =
        calls("tam", "<|[REQUEST_TOOL]|>\ncommand:»»»everything.get-sum«««\na:»»»2«««\nb:»»»3«««\n<|[END_TOOL]|>");
    let r = runner.scope().run_call(&tam[0], "call_1", &CancellationToken::new()).await;
    assert_eq!(r[0].outcome, Outcome::Success, "{}", r[0].observation);
    assert!(r[0].observation.contains("5"), "{}", r[0].observation);
    // An ACTION call.
    let action = calls("action", "<ACTION><everything.echo><message>hi there</message></everything.echo></ACTION>");
    let r = runner.scope().run_call(&action[0], "call_2", &CancellationToken::new()).await;
    assert_eq!(r[0].outcome, Outcome::Success, "{}", r[0].observation);
    assert!(r[0].observation.contains("hi there"), "{}", r[0].observation);
    // A Filament call with a wrong parameter never reaches the server.
    let fil = calls("filament", r#"<tool_call name="everything.echo">{"mesage": "x"}</tool_call>"#);
    let r = runner.scope().run_call(&fil[0], "call_3", &CancellationToken::new()).await;
    assert_eq!(r[0].outcome, Outcome::InvalidParams);
    assert!(r[0].observation.contains("did you mean 'message'"), "{}", r[0].observation);
    // The server sees only PATH and the env its plugin gives it.
    let env = calls("filament", r#"<tool_call name="everything.get-env">{}</tool_call>"#);
    let r = runner.scope().run_call(&env[0], "call_4", &CancellationToken::new()).await;
    let text = r[0].observation.clone();
    assert!(text.contains("SPINDLE_GIVEN"), "{text}");
    assert!(!text.contains("CARGO_MANIFEST_DIR") && !text.contains("\"HOME\""), "{text}");
    // Dropping the pool (runner first: it holds a reference) ends the server.
    let pids = pool.pids();
    assert_eq!(pids.len(), 1);
    assert!(alive(pids[0]));
    drop(runner);
    drop(pool);
    let deadline = Instant::now() + Duration::from_secs(3);
    while alive(pids[0]) {
        assert!(Instant::now() < deadline, "MCP server {} still running", pids[0]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn mcp_server_that_never_answers_times_out() {
    let Some(dir) = plugin_dir("slow", 800) else { return };
    let (runner, _pool) = start(dir.path()).await;
    let c = calls(
        "filament",
        r#"<tool_call name="everything.trigger-long-running-operation">{"duration": 30, "steps": 2}</tool_call>"#,
    );
    let started = Instant::now();
    let r = runner.scope().run_call(&c[0], "call_1", &CancellationToken::new()).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r[0].outcome, Outcome::Timeout);
    assert_eq!(
        r[0].observation,
        "Observation: Error - Tool everything.trigger-long-running-operation timed out after 800 ms and was stopped"
    );
}

#[tokio::test]
async fn mcp_server_crashing_mid_call_fails_the_call() {
    let Some(dir) = plugin_dir("crash", 20_000) else { return };
    let (runner, pool) = start(dir.path()).await;
    let pid = pool.pids()[0];
    let c = calls(
        "filament",
        r#"<tool_call name="everything.trigger-long-running-operation">{"duration": 10, "steps": 2}</tool_call>"#,
    );
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The crash: the server dies while the call waits for it.
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status();
    });
    let started = Instant::now();
    let r = runner.scope().run_call(&c[0], "call_1", &CancellationToken::new()).await;
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    assert_eq!(r[0].outcome, Outcome::Failed, "{}", r[0].observation);
    assert!(r[0].observation.contains("MCP"), "{}", r[0].observation);
    // A later call fails at once, it does not hang.
    let echo = calls("filament", r#"<tool_call name="everything.echo">{"message": "x"}</tool_call>"#);
    let started = Instant::now();
    let r = runner.scope().run_call(&echo[0], "call_2", &CancellationToken::new()).await;
    assert_eq!(r[0].outcome, Outcome::Failed, "{}", r[0].observation);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn mcp_json_in_the_plugins_dir_through_the_cli() {
    let Some(script) = server_script() else { return };
    let tmp = tempfile::Builder::new().prefix("spindle-mcp-json-").tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp.path();
    let config = serde_json::json!({"mcpServers": {"everything": {
        "command": "node", "args": [script.display().to_string(), "stdio"], "only": ["echo", "get-sum"]
    }}});
    std::fs::write(dir.join("mcp.json"), config.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let bin = env!("CARGO_BIN_EXE_spindle");
    let out = tokio::process::Command::new(bin)
        .args(["tools", "list", "--format", "json", "--tools"])
        .arg(dir)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<&str> = rows.as_array().into_iter().flatten().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids, ["echo", "get-sum"]);
    assert_eq!(rows[0]["implementation"], "mcp");
    // A Filament call of the MCP tool, run by `parse --execute`.
    let text = dir.join("answer.txt");
    std::fs::write(&text, "<tool_call name=\"get-sum\">{\"a\": 20, \"b\": 22}</tool_call>")
        .unwrap_or_else(|e| panic!("{e}"));
    let out = tokio::process::Command::new(bin)
        .arg("parse")
        .arg(&text)
        .args(["--profile", "filament", "--execute", "--tools"])
        .arg(dir)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result: {stdout}"));
    assert_eq!(result["outcome"], "success", "{result}");
    assert!(result["observation"].as_str().unwrap_or_default().contains("42"), "{result}");
}
