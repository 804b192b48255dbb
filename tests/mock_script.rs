//! The mock upstream's scripted conversations and request log, with a real
//! mock on 127.0.0.1:0, the real `spindle agent` and the real script tools
//! of `examples/plugins`.

use serde_json::{Value, json};
use spindle::mock::{MockUpstream, Script};
use std::path::Path;
use std::time::Duration;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_demo_script_plays_three_turns_and_the_requests_are_recorded() {
    let mock = MockUpstream::from_dir(&root().join("examples/agent-demo")).unwrap().with_pace(Duration::from_millis(1));
    let server = mock.spawn("127.0.0.1:0").await.unwrap();
    let models: Value = client().get(format!("{}/v1/models", server.url())).send().await.unwrap().json().await.unwrap();
    assert!(models["data"].as_array().unwrap().iter().any(|m| m["id"] == "agent-demo" && m["kind"] == "script"));

    // The prompt names no transcript: the script alone picks each turn.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["agent", "--upstream", &format!("{}/v1", server.url())])
        .args(["--model", "agent-demo", "--protocol", "tam", "--format", "jsonl"])
        .arg("--tools")
        .arg(root().join("examples/plugins"))
        .arg("What is 2 + 40?")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let end: Value = stdout.lines().last().and_then(|l| serde_json::from_str(l).ok()).unwrap_or_default();
    assert_eq!((end["reason"].as_str(), end["turns"].as_u64()), (Some("answer"), Some(3)), "{end}");

    // GET /mock/requests: the three requests, the second carrying Math.Add's
    // observation as the protocol's text, the third Sleepy's.
    let requests: Value =
        client().get(format!("{}/mock/requests", server.url())).send().await.unwrap().json().await.unwrap();
    let requests = requests.as_array().cloned().unwrap_or_default();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests, server.requests());
    let last_message = |r: &Value| r["messages"].as_array().and_then(|m| m.last()).cloned().unwrap_or_default();
    assert_eq!(last_message(&requests[0])["content"], "What is 2 + 40?");
    assert_eq!(last_message(&requests[1])["content"], "Observation: Tool Math.Add executed successfully. Result: 42");
    assert!(last_message(&requests[2])["content"].as_str().unwrap_or_default().contains("Tool Sleepy"));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn going_off_script_is_a_loud_error_and_the_log_is_bounded() {
    let mock = MockUpstream::from_dir(&root().join("examples/agent-demo")).unwrap().with_request_log(2);
    let server = mock.spawn("127.0.0.1:0").await.unwrap();
    let url = format!("{}/v1/chat/completions", server.url());
    let off = json!({"model": "agent-demo", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "?"}, {"role": "user", "content": "hello"}]});
    let response = client().post(&url).json(&off).send().await.unwrap();
    assert_eq!(response.status(), 400);
    let err: Value = response.json().await.unwrap();
    assert_eq!(err["error"]["code"], "script_exhausted");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("turn 2"), "{err}");
    let first = json!({"model": "agent-demo", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
    let whole: Value = client().post(&url).json(&first).send().await.unwrap().json().await.unwrap();
    assert!(whole["choices"][0]["message"]["content"].as_str().unwrap_or_default().contains("calculator"), "{whole}");
    client().post(&url).body("not json").send().await.unwrap();
    let log = server.requests();
    assert_eq!(log.len(), 2, "bounded to 2: {log:?}");
    assert_eq!((log[0]["messages"][0]["content"].as_str(), log[1].as_str()), (Some("hi"), Some("not json")));
    server.shutdown().await.unwrap();
}

#[test]
fn a_script_naming_an_unknown_transcript_is_refused() {
    let script = Script::from_toml_str("model = \"m\"\n[[turn]]\ntranscript = \"nope\"", None).unwrap();
    let err = MockUpstream::builtin().with_script(script).err().map(|e| e.to_string()).unwrap_or_default();
    assert_eq!(err, "script m: no transcript named \"nope\"");
    let tmp = tempfile::Builder::new().prefix("spindle-mock-script-").tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("bad.script.toml"), "model = \"m\"\n[[turn]]\ntranscript = \"nope\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["mock-upstream", "--listen", "127.0.0.1:0", "--script"])
        .arg(dir.join("bad.script.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "spindle: error: script m: no transcript named \"nope\"\n");
}
