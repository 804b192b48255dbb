//! Process groups: every tool process is started as the leader of its own
//! group, and a [`GroupGuard`] kills the whole group (the tool and any
//! child it forked) when the run ends, times out, hits the output cap, is
//! cancelled or is dropped.
//!
//! A child can leave the group (`setsid`, the daemon's double fork), so
//! each process is also started with a mark in its environment
//! ([`RUN_MARK`], one value per run), which its children inherit wherever
//! they go. On Linux the guard also kills every process that carries the
//! run's mark (read from `/proc/PID/environ`): a tool's descendants do not
//! outlive its run unless they scrub their own environment.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that marks a tool run's processes.
pub(crate) const RUN_MARK: &str = "SPINDLE_TOOL_RUN";

/// A mark no other run of this process has: `PID-N`.
pub(crate) fn new_mark() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Kills a process group with SIGKILL when dropped (or at [`GroupGuard::kill`]),
/// and the processes that carry its run's mark.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: Option<i32>,
    /// `RUN_MARK=value`, as it appears in an environment block.
    mark: Option<Vec<u8>>,
}

impl GroupGuard {
    /// A guard for the group led by `pid` (started with `process_group(0)`),
    /// whose processes were started with `RUN_MARK=mark`.
    pub(crate) fn new(pid: Option<u32>, mark: Option<&str>) -> GroupGuard {
        GroupGuard {
            pgid: pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 1),
            mark: mark.map(|m| format!("{RUN_MARK}={m}").into_bytes()),
        }
    }

    /// Kills every process of the group now, and every process that left
    /// it but carries the run's mark. A group that is already gone is fine.
    pub(crate) fn kill(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        if let Some(mark) = &self.mark {
            kill_marked(mark);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills the processes whose environment holds `mark` (`NAME=value`).
/// A killed process forks no more, but one may have forked between the
/// scan and the kill: scan again until a scan finds none (at most a few
/// times).
#[cfg(target_os = "linux")]
fn kill_marked(mark: &[u8]) {
    let me = std::process::id();
    for _ in 0..4 {
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        let mut killed = 0;
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if pid == me {
                continue;
            }
            // Another user's process, or one that just ended: not ours.
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
            if environ.split(|&b| b == 0).any(|var| var == mark)
                && let Ok(pid) = i32::try_from(pid)
                && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
            {
                killed += 1;
            }
        }
        if killed == 0 {
            return;
        }
    }
}

/// Elsewhere there is no `/proc` to read: the group kill is all.
#[cfg(not(target_os = "linux"))]
fn kill_marked(_mark: &[u8]) {}
