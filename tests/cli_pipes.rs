//! The command line as a filter: a reader that goes away (`| head -1`)
//! stops every subcommand quietly, and unreadable paths get one error line
//! each.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn spindle() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
}

/// Runs `args` with a big input on stdin, reads one line of its output and
/// closes the pipe; returns the exit status and stderr.
fn head_one(args: &[&str], input: &[u8]) -> (std::process::ExitStatus, String) {
    let mut child = spindle()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn spindle");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    {
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("one line");
        assert!(!line.is_empty());
        // `out` is dropped here: the reader goes away.
    }
    let output = child.wait_with_output().expect("wait");
    let _ = writer.join();
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn every_format_stops_quietly_when_the_reader_goes_away() {
    let big = format!("<thought>hm</thought><content>{}</content>", "word\n".repeat(400_000));
    for format in ["jsonl", "pretty", "rewrite"] {
        let (status, stderr) = head_one(&["parse", "-", "--format", format, "--chunk-size", "7"], big.as_bytes());
        assert!(status.success(), "{format}: {status:?} {stderr}");
        assert_eq!(stderr, "", "{format}");
    }
    let sse: String = (0..50_000)
        .map(|i| format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"w{i} \"}}}}]}}\n\n"))
        .collect();
    let (status, stderr) = head_one(&["replay", "-", "--format", "jsonl"], sse.as_bytes());
    assert!(status.success(), "replay: {status:?} {stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

#[test]
fn replay_reports_each_unreadable_path() {
    let out = spindle().args(["replay", "/no/such/dir", "/no/such/file.sse"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2), "nothing could be read");
    assert!(out.stdout.is_empty(), "no summary of nothing: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].starts_with("spindle: error: /no/such/dir: "), "{stderr}");
    assert!(lines[1].starts_with("spindle: error: /no/such/file.sse: "), "{stderr}");
    // One good path among bad ones: the good one is replayed, exit 1.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/corpora/sse-refusal.sse");
    let out = spindle().args(["replay", "/no/such/dir", dir]).output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("replayed 1 files"));
}

#[test]
fn logs_in_a_pipe_carry_no_colour_escapes() {
    // The mock logs a line at start; its stderr here is a pipe.
    let mut child = spindle()
        .args(["mock-upstream", "--listen", "127.0.0.1:0", "--log", "info"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    // Its first line says where it listens; one line is enough.
    let mut seen = String::new();
    let _ = err.read_line(&mut seen);
    let _ = child.kill();
    let _ = child.wait();
    assert!(!seen.is_empty());
    assert!(!seen.contains('\u{1b}'), "escape in {seen:?}");
}

/// A file bigger than `parse`'s read block gives what the library gives for
/// it whole: the same elements and the same corrected text, by default and
/// at a chunk size that does not divide the block.
#[test]
fn a_file_read_in_blocks_parses_as_a_whole() {
    use spindle::{Parser, ParserOptions, Registry};
    let piece = "<thought>plan 思考</thought><content>Hello <b>world</b>, a < b.</content>\n\
                 <status_bar><hp>3</hp></status_bar>bare text then ```\n";
    // Pieces of odd length, so that elements and characters cross blocks.
    let input = piece.repeat(200_000 / piece.len() + 1);
    let dir = std::env::temp_dir().join(format!("spindle-blocks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("big.txt");
    std::fs::write(&path, &input).expect("write");
    let registry = std::sync::Arc::new(Registry::filament());
    let mut parser = Parser::with_options(registry, ParserOptions { rewrite: true, ..ParserOptions::default() });
    let mut events = parser.feed(input.as_bytes());
    let mut text = parser.take_rewrite();
    let (last, rest) = parser.finish_with_rewrite();
    events.extend(last);
    text.extend(rest);
    let want: Vec<String> =
        events.iter().filter_map(|e| e.as_element()).map(|el| format!("{} {:?}", el.tag, el.text)).collect();
    for chunk in [None, Some("7")] {
        let mut args = vec!["parse", path.to_str().expect("utf-8 path")];
        args.extend(chunk.map(|c| ["--chunk-size", c]).into_iter().flatten());
        let out = spindle().args(&args).output().expect("run");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
            .filter(|v| v["type"] == "element")
            .map(|v| format!("{} {:?}", v["tag"].as_str().unwrap_or(""), v["text"].as_str().unwrap_or("")))
            .collect();
        assert_eq!(got.len(), want.len(), "elements at chunk {chunk:?}");
        assert!(got == want, "elements differ at chunk {chunk:?}");
        args.extend(["--format", "rewrite"]);
        let out = spindle().args(&args).output().expect("run");
        assert!(out.stdout == text, "the corrected text differs at chunk {chunk:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
