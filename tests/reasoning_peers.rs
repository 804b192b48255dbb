//! Agreement with the reasoning parsers of vLLM, SGLang, llama.cpp, Ollama
//! and the Vercel AI SDK on cases drawn from their own test suites
//! (`tests/data/reasoning_peers.toml`): joined thought text vs the peer's
//! reasoning, joined content vs the peer's content, surrounding whitespace
//! stripped, at chunk sizes whole, 1 and 7, through the `spindle parse`
//! binary as a user runs it. A case marked `differs` is a deliberate
//! difference the README's profile table explains; it must give what the
//! file says spindle gives.

use serde::Deserialize;
use serde_json::Value;
use std::process::Command;

#[derive(Debug, Deserialize)]
struct Case {
    peer: String,
    name: String,
    profile: String,
    output: String,
    reasoning: String,
    content: String,
    differs: Option<String>,
    spindle_reasoning: Option<String>,
    spindle_content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Cases {
    case: Vec<Case>,
}

/// Runs `spindle parse - --profile P --format jsonl --chunk-size N` and
/// returns the joined (thought, content) text.
fn parse(profile: &str, output: &str, chunk: Option<usize>) -> (String, String) {
    use std::io::Write;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.args(["parse", "-", "--profile", profile, "--format", "jsonl"]);
    if let Some(n) = chunk {
        cmd.args(["--chunk-size", &n.to_string()]);
    }
    let mut child =
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().expect("spawn spindle");
    child.stdin.take().expect("stdin").write_all(output.as_bytes()).expect("write");
    let out = child.wait_with_output().expect("run spindle");
    assert!(out.status.success(), "spindle parse failed: {}", String::from_utf8_lossy(&out.stderr));
    let (mut thought, mut content) = (String::new(), String::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let e: Value = serde_json::from_str(line).expect("jsonl");
        if e["type"] != "element" {
            continue;
        }
        let text = e["text"].as_str().unwrap_or_default();
        match e["tag"].as_str() {
            Some("thought") => thought.push_str(text),
            Some("content") => content.push_str(text),
            _ => {}
        }
    }
    (thought.trim().to_string(), content.trim().to_string())
}

#[test]
fn reasoning_parsers_agree_on_their_own_cases() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/reasoning_peers.toml"))
        .expect("read cases");
    let cases: Cases = toml::from_str(&text).expect("parse cases");
    assert!(cases.case.len() >= 40, "{} cases", cases.case.len());
    let mut agree = 0;
    let mut failures = Vec::new();
    for c in &cases.case {
        let want = match &c.differs {
            None => (c.reasoning.trim().to_string(), c.content.trim().to_string()),
            Some(_) => (
                c.spindle_reasoning.clone().unwrap_or_default().trim().to_string(),
                c.spindle_content.clone().unwrap_or_default().trim().to_string(),
            ),
        };
        for chunk in [None, Some(1), Some(7)] {
            let got = parse(&c.profile, &c.output, chunk);
            if got != want {
                failures.push(format!("{} / {} (chunk {chunk:?}): got {got:?}, want {want:?}", c.peer, c.name));
            }
        }
        if c.differs.is_none() {
            agree += 1;
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    let share = agree as f64 / cases.case.len() as f64;
    println!("{agree}/{} cases agree with the peer ({:.1}%)", cases.case.len(), share * 100.0);
    assert!(share >= 0.96, "agreement {share:.3} below 96%");
}
