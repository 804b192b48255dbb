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
