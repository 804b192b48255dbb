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

/// A plugins folder whose one tool, `Where`, runs a program by its bare
/// name, and the folder that program is in (on no `PATH` but the one a
/// test gives): the tool is found only when the tools' `PATH` holds `bin`.
/// It answers `{"found": "yes", "path": "<its PATH>"}`.
pub struct PrivateProgram {
    /// Removed when dropped.
    pub root: tempfile::TempDir,
    /// The plugins folder (`--tools`).
    pub plugins: std::path::PathBuf,
    /// The folder of the program.
    pub bin: std::path::PathBuf,
}

impl PrivateProgram {
    /// Writes the plugin and the program.
    pub fn new() -> PrivateProgram {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::Builder::new().prefix("spindle-private-program-").tempdir().expect("tempdir");
        let bin = root.path().join("bin");
        let plugins = root.path().join("plugins");
        let name = format!("spindle-where-{}", std::process::id());
        let tool = format!(
            r#"{{"id": "Where", "implementation": {{"type": "script", "command": "{name}"}}, "parameters": {{"type": "object", "properties": {{}}}}}}"#
        );
        for (path, text) in [
            (plugins.join("where/plugin.yaml"), "name: where\ntools:\n  entry: ./tools\n".to_string()),
            (plugins.join("where/tools/where.tool.json"), tool),
            (bin.join(&name), "#!/bin/sh\nprintf '{\"found\": \"yes\", \"path\": \"%s\"}' \"$PATH\"\n".to_string()),
        ] {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
        }
        std::fs::set_permissions(bin.join(&name), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        PrivateProgram { root, plugins, bin }
    }

    /// A `PATH` with the program's folder first, then the system's.
    pub fn path(&self) -> String {
        format!("{}:/usr/bin:/bin", self.bin.display())
    }
}
