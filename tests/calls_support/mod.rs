//! Helpers shared by the `calls_*` tests: run `spindle parse` at several
//! chunk sizes, check split invariance, pull out call payloads.
#![allow(dead_code)]

use serde_json::Value;
use spindle::calls::CallTracker;
use spindle::{Event, Registry};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary path (pid + counter); the caller removes what it
/// creates there.
pub fn temp_path(name: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("spindle-calls-{}-{n}-{name}", std::process::id()))
}

/// Output of one `spindle parse` run.
pub struct Run {
    pub events: Vec<Value>,
    pub stderr: String,
    pub code: i32,
}

/// Runs `spindle parse FILE --format jsonl [--chunk-size N] ARGS`.
pub fn run(input: &[u8], chunk: Option<usize>, args: &[&str]) -> Run {
    let path = temp_path("input.txt");
    std::fs::write(&path, input).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_spindle"));
    cmd.arg("parse").arg(&path).args(["--format", "jsonl"]).args(args);
    if let Some(n) = chunk {
        cmd.args(["--chunk-size", &n.to_string()]);
    }
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8(out.stdout).unwrap();
    Run {
        events: stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        stderr: String::from_utf8(out.stderr).unwrap(),
        code: out.status.code().unwrap_or(-1),
    }
}

/// The form in which events must not depend on the split: within each run
/// of consecutive deltas, the deltas of one (element, tag) are joined into
/// one (in order of first appearance), and adjacent gaps are joined. (An
/// ATTP element may interleave its raw deltas with `thought` deltas.)
pub fn normalize(events: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut run_start = 0;
    for e in events {
        if e["type"] == "delta" {
            let found = out[run_start..].iter_mut().find(|d| d["id"] == e["id"] && d["tag"] == e["tag"]);
            if let Some(d) = found {
                let text = format!("{}{}", d["text"].as_str().unwrap(), e["text"].as_str().unwrap());
                d["text"] = Value::String(text);
            } else {
                out.push(e.clone());
            }
            continue;
        }
        if let Some(last) = out.last_mut()
            && e["type"] == "gap"
            && last["type"] == "gap"
            && last["span"][1] == e["span"][0]
        {
            let text = format!("{}{}", last["text"].as_str().unwrap(), e["text"].as_str().unwrap());
            last["text"] = Value::String(text);
            last["span"][1] = e["span"][1].clone();
            continue;
        }
        out.push(e.clone());
        run_start = out.len();
    }
    out
}

/// Runs the binary whole, byte by byte and 7 bytes at a time; asserts the
/// normalised events agree and returns them.
pub fn parse_all_splits(input: &str, args: &[&str]) -> Vec<Value> {
    let whole = normalize(&run(input.as_bytes(), None, args).events);
    for n in [1, 7] {
        let split = normalize(&run(input.as_bytes(), Some(n), args).events);
        assert_eq!(split, whole, "chunk size {n} differs from whole input for {args:?}:\n{input}");
    }
    whole
}

/// The payloads of the elements of `tag`, in order.
pub fn payloads(events: &[Value], tag: &str) -> Vec<Value> {
    events.iter().filter(|e| e["type"] == "element" && e["tag"] == tag).map(|e| e["payload"].clone()).collect()
}

/// The diagnostics' codes, in order.
pub fn diagnostic_codes(events: &[Value]) -> Vec<String> {
    events.iter().filter(|e| e["type"] == "diagnostic").map(|e| e["code"].as_str().unwrap().to_string()).collect()
}

/// Call payloads with context: the events replayed through a
/// [`CallTracker`] (what the payload stage gives once it is wired to it).
pub fn tracked_payloads(registry: &Registry, events: &[Value]) -> Vec<Value> {
    let mut tracker = CallTracker::new(Arc::new(registry.clone()));
    let mut out = Vec::new();
    for e in events {
        let event: Event = serde_json::from_value(e.clone()).unwrap();
        tracker.observe(&event);
        if let Some(el) = event.as_element()
            && let Some(p) = tracker.payload(el)
        {
            out.push(p.value);
        }
    }
    out
}

/// Parses in-process and returns tracked payloads (no binary).
pub fn tracked(registry: &Registry, input: &str) -> Vec<Value> {
    let events = spindle::parse(registry.clone(), input.as_bytes());
    let values: Vec<Value> = events.iter().map(|e| serde_json::to_value(e).unwrap()).collect();
    tracked_payloads(registry, &values)
}

/// `(tool_id, params)` of each step of a payload.
pub fn steps(payload: &Value) -> Vec<(String, Value)> {
    payload["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["tool_id"].as_str().unwrap().to_string(), s["params"].clone()))
        .collect()
}

/// The `warnings` codes of a payload.
pub fn warnings(payload: &Value) -> Vec<String> {
    payload["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap().to_string()).collect()
}

pub fn profile(name: &str) -> Registry {
    Registry::profile(name).unwrap()
}
