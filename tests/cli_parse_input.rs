//! `spindle parse` reads a response as an API sends it: a streamed SSE body
//! (as `curl -N` prints it), a stream of JSON lines (Ollama's own API) or a
//! whole JSON chat completion, each choice
//! parsed as `spindle replay` and the proxy parse it. Model text is read as
//! before.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// `spindle ARGS` with every standard stream piped.
fn start(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn spindle: {e}"))
}

fn spindle(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = start(args);
    let mut pipe = child.stdin.take().unwrap_or_else(|| panic!("stdin"));
    let input = stdin.unwrap_or_default().to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("wait: {e}"));
    let _ = writer.join();
    out
}

fn ok(args: &[&str], stdin: Option<&[u8]>) -> String {
    let out = spindle(args, stdin);
    assert!(out.status.success(), "{args:?}: {:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("{args:?}: not UTF-8: {e}"))
}

fn lines(jsonl: &str) -> Vec<Value> {
    jsonl.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// A stream with a thought the model never closed, a call in native
/// `tool_calls` fragments, two choices, and a `length` finish on choice 1.
const SSE: &str = concat!(
    ": keep-alive\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"<think>short\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":1,\"delta\":{\"content\":\"Other \"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" plan</think>The answer is <b>42</b>.\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",",
    "\"function\":{\"name\":\"lookup\",\"arguments\":\"{\\\"q\\\":\"}}]}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"x\\\"}\"}}]}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"},",
    "{\"index\":1,\"delta\":{\"content\":\"choice\"},\"finish_reason\":\"length\"}]}\n\n",
    "data: [DONE]\n\n",
);

/// A few recorded transcripts of one folder whose names end in `ext`,
/// when `../shared/recorded` is there.
fn recorded(folder: &str, ext: &str, most: usize) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/recorded").join(folder);
    let Ok(dir) = std::fs::read_dir(&root) else {
        eprintln!("skipping the recorded part: {} is not there", root.display());
        return Vec::new();
    };
    let mut files: Vec<PathBuf> =
        dir.flatten().map(|e| e.path()).filter(|p| p.is_file() && p.to_string_lossy().ends_with(ext)).collect();
    files.sort();
    files.truncate(most);
    files
}

/// The events of `spindle parse FILE` and of `spindle replay FILE
/// --format jsonl` (its `source` fields left out).
fn parse_and_replay(file: &Path) -> (Vec<Value>, Vec<Value>) {
    let path = file.to_string_lossy();
    let parsed = lines(&ok(&["parse", &path], None));
    let mut replayed = lines(&ok(&["replay", &path, "--format", "jsonl", "--no-progress"], None));
    for event in &mut replayed {
        if let Some(map) = event.as_object_mut() {
            map.remove("source");
        }
    }
    (parsed, replayed)
}

#[test]
fn a_response_is_read_as_replay_reads_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ours = dir.path().join("ours.sse");
    std::fs::write(&ours, SSE).unwrap_or_else(|e| panic!("{e}"));
    let mut files = vec![ours];
    files.extend(recorded("openai-python-sse", ".bin", 12));
    files.extend(recorded("simonw-llm-cassettes/bodies", ".sse", 6));
    files.extend(recorded("simonw-llm-cassettes/bodies", ".json", 6));
    for file in &files {
        let path = file.to_string_lossy();
        let (parsed, replayed) = parse_and_replay(file);
        assert!(!parsed.is_empty(), "{path}: no events");
        assert_eq!(parsed, replayed, "{path}");
        // Piped, and read in any size: the same events.
        let body = std::fs::read(file).unwrap_or_else(|e| panic!("{e}"));
        let input = if path.ends_with(".json") { "json" } else { "auto" };
        for size in ["1", "7", "4096"] {
            let piped = lines(&ok(&["parse", "-", "--input", input, "--chunk-size", size], Some(&body)));
            assert_eq!(piped, parsed, "{path} at --chunk-size {size}");
        }
    }
}

#[test]
fn a_streamed_response_shows_its_choices() {
    let events = lines(&ok(&["parse", "-"], Some(SSE.as_bytes())));
    let elements: Vec<(u64, &str)> = events
        .iter()
        .filter(|e| e["type"] == "element")
        .map(|e| (e["choice"].as_u64().unwrap_or(99), e["tag"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(elements, [(0, "thought"), (0, "content"), (0, "tool_call"), (1, "content")], "{events:?}");
    let call = events.iter().find(|e| e["type"] == "element" && e["tag"] == "tool_call");
    assert_eq!(call.map(|c| &c["payload"]["arguments"]["q"]), Some(&Value::from("x")));
    let finishes: Vec<&Value> = events.iter().filter(|e| e["type"] == "finish").map(|e| &e["reason"]).collect();
    assert_eq!(finishes, ["tool_calls", "length"]);
    assert_eq!(events.last().map(|e| &e["type"]), Some(&Value::from("done")));

    // The corrected text of one choice at a time; a cut choice is said on stderr.
    let rewrite = ok(&["parse", "-", "--format", "rewrite"], Some(SSE.as_bytes()));
    // (The `chat` profile writes no `<content>` tags around the answer.)
    assert_eq!(rewrite, "<think>short plan</think>The answer is <b>42</b>.");
    let out = spindle(&["parse", "-", "--format", "rewrite", "--choice", "1"], Some(SSE.as_bytes()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Other choice");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("choice 1 finished: length"), "{stderr}");

    let out = spindle(&["parse", "-", "--format", "pretty", "--choice", "2"], Some(SSE.as_bytes()));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spindle: error: the response has no choice 2 (it has 0, 1)"), "{stderr}");
    assert_eq!(out.status.code(), Some(2), "a choice the response lacks is an error");

    // `summary` counts the shown choice's parse.
    let summary = ok(&["parse", "-", "--format", "summary"], Some(SSE.as_bytes()));
    assert!(summary.contains("elements     3"), "{summary}");
}

#[test]
fn a_cut_stream_is_said_on_stderr() {
    let cut = SSE.replace("data: [DONE]\n\n", "");
    let out = spindle(&["parse", "-", "--format", "pretty"], Some(cut.as_bytes()));
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cut off: no [DONE]"), "{stderr}");
    let events = lines(&ok(&["parse", "-"], Some(cut.as_bytes())));
    assert!(events.iter().any(|e| e["type"] == "truncated"), "{events:?}");
}

#[test]
fn a_whole_response_is_read_from_a_json_file_or_with_input_json() {
    let body = r#"{"id":"r1","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop",
        "message":{"role":"assistant","content":"<think>hm</think>Yes.","reasoning_content":null}}]}"#;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("answer.json");
    std::fs::write(&file, body).unwrap_or_else(|e| panic!("{e}"));
    let from_file = lines(&ok(&["parse", &file.to_string_lossy()], None));
    let tags: Vec<&str> =
        from_file.iter().filter(|e| e["type"] == "element").filter_map(|e| e["tag"].as_str()).collect();
    assert_eq!(tags, ["thought", "content"], "{from_file:?}");
    let piped = lines(&ok(&["parse", "--input", "json", "--chunk-size", "5"], Some(body.as_bytes())));
    assert_eq!(piped, from_file);
    assert_eq!(
        ok(&["parse", "--input", "json", "--format", "rewrite"], Some(body.as_bytes())),
        "<think>hm</think>Yes."
    );

    // Past --max-response: one error line, exit code 2.
    let out = spindle(&["parse", "--input", "json", "--max-response", "100"], Some(body.as_bytes()));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("larger than 100 bytes (--max-response)"), "{stderr}");

    // Not a chat completion: one error line, exit code 2.
    let out = spindle(&["parse", "--input", "json"], Some(b"not json at all"));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a JSON response"), "{stderr}");

    // JSON that is no API's response (a model's own JSON answer, an
    // array of numbers): the same, with the way to read it as text.
    for body in [&b"{\"foo\": 1}"[..], b"[1, 2, 3]"] {
        let out = spindle(&["parse", "--input", "json", "--format", "summary"], Some(body));
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("is JSON but not an API response") && stderr.contains("--input text"), "{stderr}");
    }
}

/// An SSE event longer than the 4 MiB line limit of the proxy's default is
/// read by `parse` up to `--max-response`; past that it is skipped and
/// said.
#[test]
fn sse_lines_are_read_up_to_max_response() {
    let text = "x".repeat(5 * 1024 * 1024);
    let chunk = format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
    );
    let out = ok(&["parse", "--input", "sse", "--format", "rewrite"], Some(chunk.as_bytes()));
    assert_eq!(out.len(), text.len());
    let out = spindle(&["parse", "--input", "sse", "--max-response", "1000"], Some(chunk.as_bytes()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sse_line_too_long"), "{}", &stdout[..stdout.len().min(500)]);
}

/// Ollama's own `/api/chat` stream: one JSON object per line.
const NDJSON: &str = concat!(
    "{\"model\":\"qwen3\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"Hm.\"},\"done\":false}\n",
    "{\"model\":\"qwen3\",\"message\":{\"role\":\"assistant\",\"content\":\"Two <b>cups\"},\"done\":false}\n",
    "{\"model\":\"qwen3\",\"message\":{\"role\":\"assistant\",\"content\":\"</b> of tea.\"},\"done\":true,",
    "\"done_reason\":\"length\",\"eval_count\":9}\n",
);

#[test]
fn a_stream_of_json_lines_is_read_as_replay_reads_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("ollama.ndjson");
    std::fs::write(&file, NDJSON).unwrap_or_else(|e| panic!("{e}"));
    let (parsed, replayed) = parse_and_replay(&file);
    assert_eq!(parsed, replayed);
    let elements: Vec<(&str, &str)> = parsed
        .iter()
        .filter(|e| e["type"] == "element")
        .filter_map(|e| Some((e["tag"].as_str()?, e["text"].as_str()?)))
        .collect();
    assert_eq!(elements, [("thought", "Hm."), ("content", "Two <b>cups</b> of tea.")]);
    // Piped (told apart by its first line), in any read size, or named.
    for size in ["1", "7", "4096"] {
        let piped = lines(&ok(&["parse", "-", "--chunk-size", size], Some(NDJSON.as_bytes())));
        assert_eq!(piped, parsed, "--chunk-size {size}");
    }
    let named = lines(&ok(&["parse", "-", "--input", "ndjson"], Some(NDJSON.as_bytes())));
    assert_eq!(named, parsed);
    // The length finish is said on stderr; the corrected text is the content.
    let out = spindle(&["parse", "-", "--format", "rewrite"], Some(NDJSON.as_bytes()));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Two <b>cups</b> of tea.");
    assert!(String::from_utf8_lossy(&out.stderr).contains("length"), "{out:?}");
    // A whole response on one line, piped, is read as the response.
    let whole = "{\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\
                 \"content\":\"<think>a</think>B\"},\"finish_reason\":\"stop\"}]}\n";
    let events = lines(&ok(&["parse", "-"], Some(whole.as_bytes())));
    let tags: Vec<&str> = events.iter().filter(|e| e["type"] == "element").filter_map(|e| e["tag"].as_str()).collect();
    assert_eq!(tags, ["thought", "content"]);
    assert!(events.iter().all(|e| e["choice"] == 0 || e["type"] == "usage"), "{events:?}");
}

#[test]
fn model_text_stays_text() {
    // Text that merely starts like a field name, or as an SSE comment
    // would, is model output; so is SSE when `--input text` says so.
    for text in [
        "database: up<content>ok</content>",
        ":) hello",
        "{\"type\": \"greeting\"}",
        "{\"name\": \"Ann\", \"age\": 3}\nmore",
    ] {
        let events = lines(&ok(&["parse", "-", "--profile", "chat"], Some(text.as_bytes())));
        assert!(events.iter().all(|e| e.get("choice").is_none()), "{text}: {events:?}");
        let text_of: String = events
            .iter()
            .filter(|e| e["type"] == "element" || e["type"] == "gap")
            .filter_map(|e| e["text"].as_str())
            .collect();
        assert!(text_of.contains(&text[..4]), "{text}: {events:?}");
    }
    let as_text = lines(&ok(&["parse", "-", "--input", "text"], Some(SSE.as_bytes())));
    assert!(as_text.iter().all(|e| e.get("choice").is_none()));
    let content: String = as_text.iter().filter(|e| e["type"] == "delta").filter_map(|e| e["text"].as_str()).collect();
    assert!(content.contains("data: {"), "{as_text:?}");
}

#[test]
fn a_native_call_in_a_stream_runs_with_execute() {
    // `tool_calls` fragments, as an OpenAI-compatible server streams them,
    // become a call that the tool runtime runs (a real Python script tool).
    let sse = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Adding.\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",",
        "\"function\":{\"name\":\"Math.Add\",\"arguments\":\"{\\\"a\\\": 2, \"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"b\\\": 3}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n",
    );
    let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/plugins/basic");
    let plugins = plugins.to_string_lossy();
    let events = lines(&ok(&["parse", "-", "--tools", &plugins, "--execute"], Some(sse.as_bytes())));
    let result = events.iter().find(|e| e["type"] == "tool_result");
    assert_eq!(
        result.map(|r| (&r["tool_id"], &r["ok"], &r["result"])),
        Some((&"Math.Add".into(), &true.into(), &5.into())),
        "{events:?}"
    );
    assert_eq!(result.map(|r| &r["call_id"]), Some(&Value::from("call_1")));
}

/// Runs `spindle parse -` (jsonl) with stdin written in `pieces`, a pause
/// after each, as a live stream arrives.
fn live(pieces: &[&str]) -> Vec<Value> {
    let mut child = start(&["parse", "-"]);
    let mut pipe = child.stdin.take().unwrap_or_else(|| panic!("stdin"));
    for piece in pieces {
        pipe.write_all(piece.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        pipe.flush().unwrap_or_else(|e| panic!("{e}"));
        std::thread::sleep(std::time::Duration::from_millis(150));
    }
    drop(pipe);
    let out = child.wait_with_output().unwrap_or_else(|e| panic!("wait: {e}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    lines(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn a_live_stream_is_told_apart_when_its_first_read_cannot_tell() {
    // Gateways send a comment first (`: OPENROUTER PROCESSING`), and a
    // first read may end inside a field name: auto waits for a line that
    // decides.
    let rest = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    for first in [": PROCESSING\n\n", ":", "da", "\n"] {
        let second = match first {
            "da" => rest[2..].to_string(),
            ":" => format!(" keep-alive\n\n{rest}"),
            _ => rest.to_string(),
        };
        let events = live(&[first, &second]);
        assert!(events.iter().any(|e| e["type"] == "finish"), "first read {first:?}: {events:?}");
        let text: String = events.iter().filter(|e| e["type"] == "delta").filter_map(|e| e["text"].as_str()).collect();
        assert_eq!(text, "Hi", "first read {first:?}");
    }
    // Text whose first line only looks like a comment is text, and so is
    // input of nothing but comments.
    for text in [":)\nhello <b>there</b>\n", ": just a colon line\n"] {
        let events = live(&[text]);
        assert!(events.iter().all(|e| e.get("choice").is_none()), "{text:?}: {events:?}");
    }
}
