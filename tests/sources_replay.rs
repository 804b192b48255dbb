//! Transcript replay: the project's own corpora with exact expectations,
//! the whole recorded tree (`../shared/recorded`) without a panic and with
//! the content check passing, lossless chunk round trips, and the
//! `spindle replay` command itself.

use serde_json::Value;
use spindle::Registry;
use spindle::sources::transcript::{self, CheckResult, Detection, ReplayOutcome, TranscriptKind};
use spindle::sources::{ChatChunk, ChatStream, SourceEvent, StreamOptions, StreamTap, Truncation};
use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/recorded`, or `None` (with a message) when it is not there.
fn recorded() -> Option<PathBuf> {
    let dir = manifest().join("../shared/recorded");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: {} is missing (the shared recordings are not on this machine)", dir.display());
        None
    }
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files_under(&p, out);
        } else {
            out.push(p);
        }
    }
}

fn replay_path(path: &Path, options: &StreamOptions) -> Option<(TranscriptKind, Vec<u8>, Vec<transcript::Replayed>)> {
    let bytes = std::fs::read(path).ok()?;
    let Detection::Replay(kind) = transcript::detect(path, &bytes) else {
        return None;
    };
    match transcript::replay(kind, &bytes, options) {
        ReplayOutcome::Streams(streams) => Some((kind, bytes, streams)),
        ReplayOutcome::Skip(_) => None,
    }
}

struct Expect {
    file: &'static str,
    profile: &'static str,
    /// (choice, tag, text) of every element, in order.
    elements: &'static [(u32, &'static str, &'static str)],
    truncated: Option<Truncation>,
    /// Diagnostic codes that must appear.
    diagnostics: &'static [&'static str],
    errors: usize,
}

const CORPORA: &[Expect] = &[
    Expect {
        file: "sse-think-in-content.sse",
        profile: "reasoning",
        elements: &[(0, "thought", "\nThe user asks for  2+2. Simple: 4.\n"), (0, "content", "2 + 2 = **4**.")],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-parallel-tool-calls.sse",
        profile: "reasoning",
        elements: &[
            (0, "tool_call", "{\"city\": \"Paris\", \"unit\": \"c\"}"),
            (0, "content", "Let me check both cities."),
            (0, "tool_call", "{\"city\": \"Rome\"}"),
        ],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-tool-calls-interleaved.sse",
        profile: "reasoning",
        elements: &[(0, "tool_call", "{\"city\": \"Paris\"}"), (0, "tool_call", "{\"tz\": \"Europe/Paris\"}")],
        truncated: None,
        diagnostics: &["data_after_done"],
        errors: 0,
    },
    Expect {
        file: "sse-n2-interleaved.sse",
        profile: "reasoning",
        elements: &[
            (0, "thought", "Two answers are wanted."),
            (1, "content", "Tea, hot."),
            (0, "content", "Coffee, black."),
        ],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-broken-framing.sse",
        profile: "reasoning",
        elements: &[(0, "content", "Hello there, friend!")],
        truncated: Some(Truncation::NoDone),
        diagnostics: &["chunk_rejoined", "invalid_chunk_json", "sse_ignored_field", "sse_unterminated_event"],
        errors: 0,
    },
    Expect {
        file: "sse-error-midstream.sse",
        profile: "reasoning",
        elements: &[(0, "content", "The report says that the")],
        truncated: None,
        diagnostics: &[],
        errors: 1,
    },
    Expect {
        file: "sse-error-event.sse",
        profile: "reasoning",
        elements: &[(0, "content", "Calling the tool")],
        truncated: Some(Truncation::NoDone),
        diagnostics: &[],
        errors: 1,
    },
    Expect {
        file: "sse-filament-tags.sse",
        profile: "filament",
        elements: &[
            (0, "thought", "The player greets 纯田真奈."),
            (0, "content", "\n\"Good morning!\" she says, <i>smiling</i>.\n"),
            (0, "variable_update", "\n<Analysis>greeting</Analysis>\n_.set('纯田真奈.好感度', 10, 12);//friendly\n"),
        ],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-truncated-mid-json.sse",
        profile: "reasoning",
        elements: &[(0, "content", "Partial answer before the")],
        truncated: Some(Truncation::MidJson),
        diagnostics: &["truncated_chunk"],
        errors: 0,
    },
    Expect {
        file: "sse-azure-content-filter.sse",
        profile: "reasoning",
        elements: &[(0, "content", "Once upon a time, the knight")],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-refusal.sse",
        profile: "reasoning",
        elements: &[(0, "refusal", "I'm sorry, but I can't help with that.")],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
    Expect {
        file: "sse-deepseek-reasoning.chunks.txt",
        profile: "reasoning",
        elements: &[(0, "thought", "Compare 9.11 and 9.9: 9.9 is larger."), (0, "content", "9.9 is larger than 9.11.")],
        truncated: None,
        diagnostics: &[],
        errors: 0,
    },
];

#[test]
fn corpora_replay_as_expected() {
    for e in CORPORA {
        let path = manifest().join("corpora").join(e.file);
        let registry = Registry::profile(e.profile).unwrap_or_else(Registry::reasoning);
        let options = StreamOptions::with_registry(registry);
        let Some((kind, bytes, streams)) = replay_path(&path, &options) else {
            panic!("{} did not replay", e.file);
        };
        assert_eq!(streams.len(), 1, "{}", e.file);
        let events = &streams[0].events;
        let elements: Vec<(u32, String, String)> = events
            .iter()
            .filter_map(|ev| match ev {
                SourceEvent::Choice(c) => {
                    c.event.as_element().map(|el| (c.choice, el.tag.to_string(), el.text.clone()))
                }
                _ => None,
            })
            .collect();
        let want: Vec<(u32, String, String)> =
            e.elements.iter().map(|(c, t, x)| (*c, t.to_string(), x.to_string())).collect();
        assert_eq!(elements, want, "{}", e.file);
        let truncated = events.iter().find_map(|ev| match ev {
            SourceEvent::Truncated { why, .. } => Some(*why),
            _ => None,
        });
        assert_eq!(truncated, e.truncated, "{}", e.file);
        let codes: Vec<String> = events
            .iter()
            .filter_map(|ev| match ev {
                SourceEvent::Diagnostic(d) => Some(d.code.to_string()),
                _ => None,
            })
            .collect();
        for code in e.diagnostics {
            assert!(codes.iter().any(|c| c == code), "{}: no {code} in {codes:?}", e.file);
        }
        let errors = events.iter().filter(|ev| matches!(ev, SourceEvent::StreamError { .. })).count();
        assert_eq!(errors, e.errors, "{}", e.file);
        for check in transcript::check_content(kind, &bytes, &streams) {
            assert!(matches!(check.result, CheckResult::Equal | CheckResult::Tiled), "{}: {:?}", e.file, check.result);
        }
    }
}

#[test]
fn recorded_tree_replays_and_keeps_every_content_byte() {
    let Some(dir) = recorded() else { return };
    let mut files = Vec::new();
    files_under(&dir, &mut files);
    let options = StreamOptions::default();
    let (mut streams_total, mut checked, mut mismatches) = (0, 0, Vec::new());
    for path in &files {
        let Some((kind, bytes, streams)) = replay_path(path, &options) else {
            continue;
        };
        for stream in &streams {
            streams_total += 1;
            // Every stream is accounted for: it ended cleanly or says why not.
            let ended = stream.events.iter().any(|e| {
                matches!(
                    e,
                    SourceEvent::Done
                        | SourceEvent::Finish { .. }
                        | SourceEvent::Truncated { .. }
                        | SourceEvent::StreamError { .. }
                )
            });
            let text_only = matches!(kind, TranscriptKind::Text | TranscriptKind::JsonLines)
                || (kind == TranscriptKind::Json && bytes.first() == Some(&b'['));
            assert!(ended || text_only, "{} ended without a word", path.display());
        }
        for check in transcript::check_content(kind, &bytes, &streams) {
            match check.result {
                CheckResult::Equal | CheckResult::Tiled => checked += 1,
                CheckResult::Skipped(_) => {}
                CheckResult::Mismatch(what) => mismatches.push(format!("{} {:?}: {what}", path.display(), check.label)),
            }
        }
    }
    assert!(mismatches.is_empty(), "content lost or invented:\n{}", mismatches.join("\n"));
    assert!(streams_total > 400, "only {streams_total} streams replayed");
    // The README states the count.
    let readme = std::fs::read_to_string(manifest().join("README.md")).unwrap_or_default();
    let claim = format!("all {streams_total} recorded third-party streams");
    assert!(readme.contains(&claim), "README.md should say \"{claim}\"");
    assert!(checked > 1000, "only {checked} choices checked");
}

/// The recorded Bedrock Converse responses (pydantic-ai's cassettes) are
/// read, not skipped: each gives its answer or its tool call, and a finish
/// reason in the chat's words.
#[test]
fn recorded_bedrock_converse_responses_are_read() {
    let Some(dir) = recorded() else { return };
    let mut files = Vec::new();
    files_under(&dir.join("pydantic-ai-cassettes/bodies"), &mut files);
    files.retain(|p| p.to_string_lossy().contains("test_bedrock__") && p.extension().is_some_and(|x| x == "json"));
    assert!(files.len() >= 6, "only {} Bedrock responses", files.len());
    for path in &files {
        let (_, _, streams) =
            replay_path(path, &StreamOptions::default()).unwrap_or_else(|| panic!("{} was skipped", path.display()));
        let events = &streams[0].events;
        let finish = events.iter().find_map(|e| match e {
            SourceEvent::Finish { reason, .. } => Some(reason.as_str().to_string()),
            _ => None,
        });
        assert!(matches!(finish.as_deref(), Some("stop" | "tool_calls")), "{}: {finish:?}", path.display());
        let tags: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                SourceEvent::Choice(c) => match &c.event {
                    spindle::event::Event::Element(el) => Some(el.tag.to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        // (One answer opens a `<think>` it never closes: a thought.)
        assert!(!tags.is_empty(), "{}: no element", path.display());
        assert!(
            !events.iter().any(|e| matches!(e, SourceEvent::Diagnostic(d) if d.code.as_str() == "unrecognized_chunk")),
            "{}",
            path.display()
        );
        if finish.as_deref() == Some("tool_calls") {
            assert!(
                tags.iter().any(|t| t == "tool_call"),
                "{}: tool_calls without a tool_call element",
                path.display()
            );
        }
    }
}

/// A Gemini stream saved as SSE (`alt=sse`) and as the JSON array the
/// API sends without it: both replay to the same choices, and the content
/// check reads both.
#[test]
fn gemini_streams_replay_from_sse_and_from_a_json_array() {
    let frames = [
        serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Plan it.", "thought": true}]}}]}),
        serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Two <b>cups</b> of "}]}}]}),
        serde_json::json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "tea."}]}, "finishReason": "STOP"}],
                           "usageMetadata": {"totalTokenCount": 12}}),
    ];
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sse_path = dir.path().join("gemini.sse");
    let json_path = dir.path().join("gemini.json");
    let sse: String = frames.iter().map(|f| format!("data: {f}\r\n\r\n")).collect();
    std::fs::write(&sse_path, sse).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&json_path, Value::Array(frames.to_vec()).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let mut contents = Vec::new();
    for path in [&sse_path, &json_path] {
        let (kind, bytes, streams) =
            replay_path(path, &StreamOptions::default()).unwrap_or_else(|| panic!("{} was skipped", path.display()));
        let events = &streams[0].events;
        assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })), "{}", path.display());
        let checks = transcript::check_content(kind, &bytes, &streams);
        assert!(
            checks.iter().all(|c| matches!(c.result, CheckResult::Equal | CheckResult::Tiled)),
            "{}: {checks:?}",
            path.display()
        );
        let elements: Vec<(String, String)> = events
            .iter()
            .filter_map(|e| match e {
                SourceEvent::Choice(c) => match &c.event {
                    spindle::event::Event::Element(el) => Some((el.tag.to_string(), el.text.clone())),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        contents.push(elements);
    }
    assert_eq!(contents[0], contents[1]);
    assert_eq!(
        contents[0],
        [
            ("thought".to_string(), "Plan it.".to_string()),
            ("content".to_string(), "Two <b>cups</b> of tea.".to_string())
        ]
    );
}

/// An Ollama `/api/chat` stream saved as NDJSON is a chunk transcript:
/// read, checked, and ended by its `done` line.
#[test]
fn ollama_ndjson_replays_as_chunk_lines() {
    let lines = [
        serde_json::json!({"model": "qwen3", "message": {"role": "assistant", "content": "", "thinking": "Hm."}, "done": false}),
        serde_json::json!({"model": "qwen3", "message": {"role": "assistant", "content": "Two cups"}, "done": false}),
        serde_json::json!({"model": "qwen3", "message": {"role": "assistant", "content": " of tea."}, "done": true, "done_reason": "stop", "eval_count": 9}),
    ];
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("ollama-chat.ndjson");
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, body).unwrap_or_else(|e| panic!("{e}"));
    let (kind, bytes, streams) =
        replay_path(&path, &StreamOptions::default()).unwrap_or_else(|| panic!("{} was skipped", path.display()));
    // (A `.ndjson` file is JSON lines; lines that are chunks replay as chunks.)
    assert_eq!(kind, TranscriptKind::JsonLines);
    let events = &streams[0].events;
    assert!(!events.iter().any(|e| matches!(e, SourceEvent::Truncated { .. })), "{events:?}");
    assert!(events.iter().any(|e| matches!(e, SourceEvent::Finish { .. })));
    let checks = transcript::check_content(kind, &bytes, &streams);
    assert!(checks.iter().all(|c| matches!(c.result, CheckResult::Equal)), "{checks:?}");
}

/// Every event of every recorded stream (and of the bundled corpora)
/// writes the JSON that serde writes for it: `SourceEvent::write_json` is
/// the fast form of the same contract (`spindle replay --format jsonl`).
#[test]
fn every_source_event_writes_its_serde_json() {
    let mut files = Vec::new();
    files_under(&manifest().join("corpora"), &mut files);
    if let Some(dir) = recorded() {
        files_under(&dir, &mut files);
    }
    let options = StreamOptions::default();
    let (mut checked, mut choices, mut channels) = (0, 0, std::collections::BTreeSet::new());
    for path in &files {
        let Some((_, _, streams)) = replay_path(path, &options) else {
            continue;
        };
        for event in streams.iter().flat_map(|s| &s.events) {
            let mut line = Vec::new();
            event.write_json(&mut line);
            let expected = serde_json::to_string(event).expect("events serialise");
            assert_eq!(String::from_utf8_lossy(&line), expected, "{}", path.display());
            checked += 1;
            if let Some(c) = event.as_choice_event() {
                choices += 1;
                channels.insert(c.channel.as_str());
            }
        }
    }
    assert!(checked > choices && choices > 1000, "{checked} events checked, {choices} of choices");
    if recorded().is_some() {
        assert!(channels.len() >= 3, "channels seen: {channels:?}");
    }
}

/// Every chunk of every recorded stream, read and written back, is the
/// same JSON document (unknown fields and nulls survive: a rewriting proxy
/// depends on it).
#[test]
fn recorded_chunks_round_trip_losslessly() {
    let Some(dir) = recorded() else { return };
    let mut files = Vec::new();
    files_under(&dir, &mut files);
    let mut n = 0;
    for path in files {
        let name = path.to_string_lossy().to_string();
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let payloads: Vec<&str> = if name.ends_with(".chunks.txt") {
            text.lines().collect()
        } else if name.ends_with(".sse") || name.ends_with(".bin") {
            text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect()
        } else if name.ends_with(".json") {
            vec![&text]
        } else {
            continue;
        };
        for p in payloads {
            let Ok(original @ Value::Object(_)) = serde_json::from_str::<Value>(p) else {
                continue;
            };
            let chunk: ChatChunk = match serde_json::from_str(p) {
                Ok(c) => c,
                Err(e) => panic!("{name}: a JSON object did not read as a chunk ({e}): {p:.200}"),
            };
            let again = serde_json::to_value(&chunk).unwrap_or(Value::Null);
            assert_eq!(again, original, "{name}");
            n += 1;
        }
    }
    assert!(n > 20_000, "only {n} chunks");
}

/// A tap that wants only events reads each chunk by its meaning (other
/// fields skipped, not built); a rewriting proxy's tap reads it whole. The
/// events must be the same, for every recorded SSE body and chunk file and
/// every test stream (odd dialects, broken chunks, coerced fields).
#[test]
fn chunks_read_for_events_only_give_the_same_events() {
    let mut files = Vec::new();
    files_under(&manifest().join("tests/data"), &mut files);
    if let Some(dir) = recorded() {
        files_under(&dir, &mut files);
    }
    let options = StreamOptions::default();
    let (mut sse, mut lines) = (0, 0);
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let (whole, meaning) = match transcript::detect(&path, &bytes) {
            Detection::Replay(TranscriptKind::Sse) => {
                sse += 1;
                let mut tap = StreamTap::new(options.clone());
                let mut frames = Vec::new();
                tap.feed_frames(&bytes, &mut frames);
                let mut whole: Vec<SourceEvent> = frames.into_iter().flat_map(|f| f.events).collect();
                whole.extend(tap.finish_frames().events);
                let mut tap = StreamTap::new(options.clone());
                let mut meaning = Vec::new();
                tap.feed_into(&bytes, &mut meaning);
                tap.finish_into(&mut meaning);
                (whole, meaning)
            }
            Detection::Replay(TranscriptKind::ChunkLines) => {
                lines += 1;
                let text = String::from_utf8_lossy(&bytes);
                let (mut a, mut b) = (ChatStream::new(options.clone()), ChatStream::new(options.clone()));
                let (mut whole, mut meaning) = (Vec::new(), Vec::new());
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    a.push_data("message", line, 0, &mut whole);
                    b.push_data_events("message", line, 0, &mut meaning);
                }
                assert_eq!(a.response_model(), b.response_model(), "{}", path.display());
                a.finish_into(&mut whole);
                b.finish_into(&mut meaning);
                (whole, meaning)
            }
            _ => continue,
        };
        assert_eq!(meaning, whole, "{}", path.display());
    }
    assert!(sse > 10 && lines > 0, "{sse} SSE bodies, {lines} chunk files");
    if recorded().is_some() {
        assert!(sse > 300 && lines > 30, "{sse} SSE bodies, {lines} chunk files");
    }
}

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

#[test]
fn replay_command_summary_check_and_jsonl() {
    let corpora = manifest().join("corpora");
    let out = spindle().args(["replay", "--check"]).arg(&corpora).output().expect("run spindle");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("content check passed"), "{stdout}");
    assert!(stdout.contains("MB/s"), "{stdout}");
    assert!(stdout.contains("elements by tag"), "{stdout}");

    let out = spindle()
        .args(["replay", "--format", "jsonl"])
        .arg(corpora.join("sse-refusal.sse"))
        .output()
        .expect("run spindle");
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(lines.iter().all(|l| { l["source"].as_str().is_some_and(|s| s.ends_with("sse-refusal.sse")) }));
    assert!(lines.iter().any(|l| l["type"] == "element" && l["tag"] == "refusal" && l["choice"] == 0));
    assert!(lines.iter().any(|l| l["type"] == "done"));
}

#[test]
fn one_bad_path_never_stops_the_run() {
    let dir = std::env::temp_dir().join(format!("spindle-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("garbage.json"), b"{ not json").expect("write");
    std::fs::write(dir.join("binary.dat"), [0u8, 159, 146, 150, 0, 1]).expect("write");
    std::fs::write(dir.join("answer.txt"), "<think>hm</think>42").expect("write");
    // A file named as text is replayed even with a NUL the model wrote.
    std::fs::write(dir.join("nul.txt"), "<think>a\0b</think>42").expect("write");
    std::fs::write(dir.join("README.md"), "# notes").expect("write");
    let out =
        spindle().args(["replay", "--check"]).arg(&dir).arg(dir.join("missing.sse")).output().expect("run spindle");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "a missing path fails the run: {stdout}");
    assert!(stdout.contains("missing.sse: cannot read"), "{stdout}");
    assert!(stdout.contains("replayed 2 files"), "the text files still ran: {stdout}");
    assert!(stdout.contains("not valid JSON"), "{stdout}");
    assert!(stdout.contains("binary file"), "{stdout}");
    assert!(stdout.contains("readme file"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

mod property {
    use super::*;
    use proptest::prelude::*;

    fn piece() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "<think>",
            "</think>",
            "<thought>",
            "</thought>",
            "<content>",
            "</content>",
            "<",
            ">",
            "</",
            "Hello",
            " ",
            "\n",
            "<b>bold</b>",
            "名前",
            "<!-- c -->",
            "<tool_call>",
            "{\"a\":1}",
            "</tool_call>",
            "<UpdateVariable>",
            "</UpdateVariable>",
            "x",
        ])
        .prop_map(str::to_string)
    }

    proptest! {
        /// Whatever the content and however it is cut into chunks, no
        /// content byte is lost or invented (the `--check` rule).
        #[test]
        fn no_content_lost_or_invented(
            pieces in prop::collection::vec(piece(), 0..24),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
            profile in prop::sample::select(vec!["reasoning", "filament"]),
        ) {
            let content: String = pieces.concat();
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(content.len() + 1)).collect();
            points.sort_unstable();
            points.retain(|&p| content.is_char_boundary(p));
            let mut body = String::new();
            let mut prev = 0;
            for p in points.into_iter().chain([content.len()]) {
                let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": &content[prev..p]}}]});
                body.push_str(&format!("data: {chunk}\n\n"));
                prev = p;
            }
            body.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
            let registry = Registry::profile(profile).unwrap_or_else(Registry::reasoning);
            let options = StreamOptions::with_registry(registry);
            let ReplayOutcome::Streams(streams) = transcript::replay(TranscriptKind::Sse, body.as_bytes(), &options) else {
                panic!("an SSE body is always replayed");
            };
            for check in transcript::check_content(TranscriptKind::Sse, body.as_bytes(), &streams) {
                prop_assert!(
                    matches!(check.result, CheckResult::Equal | CheckResult::Tiled),
                    "{:?} for {:?}", check.result, content
                );
            }
        }
    }
}

/// The checker itself: a lost or an invented byte is caught.
#[test]
fn the_content_check_catches_loss_and_invention() {
    let path = manifest().join("corpora/sse-think-in-content.sse");
    let options = StreamOptions::default();
    let Some((kind, bytes, streams)) = replay_path(&path, &options) else { panic!("replays") };
    let tamper = |f: &dyn Fn(&mut String)| {
        let mut streams = streams.clone();
        for e in &mut streams[0].events {
            if let SourceEvent::Choice(c) = e
                && let spindle::event::Event::Element(el) = &mut c.event
                && &*el.tag == "content"
            {
                f(&mut el.text);
            }
        }
        transcript::check_content(kind, &bytes, &streams)
    };
    let clean = tamper(&|_| {});
    assert!(clean.iter().all(|c| matches!(c.result, CheckResult::Tiled)), "{clean:?}");
    for check in [tamper(&|t| t.push('!')), tamper(&|t| t.truncate(3))] {
        assert!(check.iter().any(|c| matches!(c.result, CheckResult::Mismatch(_))), "{check:?}");
    }
    // A dropped gap leaves bytes unaccounted for.
    let mut streams = streams.clone();
    streams[0]
        .events
        .retain(|e| !matches!(e, SourceEvent::Choice(c) if matches!(c.event, spindle::event::Event::Gap(_))));
    let check = transcript::check_content(kind, &bytes, &streams);
    assert!(
        check.iter().any(|c| matches!(&c.result, CheckResult::Mismatch(m) if m.contains("belong to no"))),
        "{check:?}"
    );
}

/// Every recorded SSE body gives the same events read whole, byte by byte
/// and in 7-byte reads (chunk-boundary invariance on real data).
#[test]
fn recorded_sse_bodies_are_read_size_invariant() {
    let Some(dir) = recorded() else { return };
    let mut files = Vec::new();
    files_under(&dir, &mut files);
    let options = StreamOptions::default();
    let mut n = 0;
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if transcript::detect(&path, &bytes) != Detection::Replay(TranscriptKind::Sse) {
            continue;
        }
        let events = |read| match transcript::replay_in_reads(TranscriptKind::Sse, &bytes, &options, read) {
            ReplayOutcome::Streams(s) => s.into_iter().flat_map(|s| s.events).collect::<Vec<_>>(),
            ReplayOutcome::Skip(why) => panic!("{why}"),
        };
        let whole = events(usize::MAX);
        assert_eq!(events(1), whole, "{} byte by byte", path.display());
        assert_eq!(events(7), whole, "{} in 7-byte reads", path.display());
        n += 1;
    }
    assert!(n > 300, "only {n} SSE bodies");
}
