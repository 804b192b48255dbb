//! Process groups: every tool process is started as the leader of its own
//! group, and a [`GroupGuard`] kills the whole group (the tool and any
//! child it forked) when the run ends, times out, hits the output cap, is
//! cancelled or is dropped.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Kills a process group with SIGKILL when dropped (or at [`GroupGuard::kill`]).
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: Option<i32>,
}

impl GroupGuard {
    /// A guard for the group led by `pid` (started with `process_group(0)`).
    pub(crate) fn new(pid: Option<u32>) -> GroupGuard {
        GroupGuard { pgid: pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 1) }
    }

    /// Kills every process of the group now. A group that is already gone
    /// is fine.
    pub(crate) fn kill(&self) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}
