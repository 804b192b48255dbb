//! Helpers shared by the tests that check the process table: a tool's
//! processes (found by a marker on their command line) must not outlive
//! their call or their run.
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Processes whose command line holds `marker` (zombies have none), as
/// `PID: command line`.
pub fn processes_with(marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&bytes).replace('\0', " ");
            if cmd.contains(marker) {
                out.push(format!("{}: {cmd}", name.to_string_lossy()));
            }
        }
    }
    out
}

/// Waits up to 3 s for every process with `marker` to be gone.
pub async fn assert_no_process(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "leaked processes: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
