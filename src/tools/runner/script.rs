//! `script` tools (spec 002 §6.3, §16.2): a program run with the call's
//! parameters as one JSON object on stdin, its result read from stdout.
//!
//! * `command`: a string (split like a shell would split words, but no
//!   shell runs it) or an array of strings. A program given with a `/` is
//!   relative to the plugin's folder; a bare name is looked up in the
//!   runner's `PATH` ([`RunnerOptions::path`]: by default the one spindle
//!   was started with; `--tool-path` sets it). No argument may hold a `..` path component (a command
//!   that climbs out of its plugin is refused).
//! * `protocol`: `stdio` (the default and the only one).
//! * `timeout`: milliseconds; the runner's default when absent.
//!
//! The process runs in the plugin's folder, as the leader of its own
//! process group, with an empty environment except `PATH` (the runner's),
//! `LANG=C.UTF-8`,
//! the run's mark (`SPINDLE_TOOL_RUN`, see [`super::group`]) and the tool's
//! `configSchema` values. Parameters never reach a command
//! line, so text such as `; rm -rf /` is only data on stdin.

use super::group::GroupGuard;
use super::{RunnerOptions, StepRun};
use crate::calls::ToolDef;
use crate::tools::observe::{self, Outcome};
use serde_json::{Map, Value};
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// What a tool definition says about running it as a script.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScriptSpec {
    pub(crate) argv: Vec<String>,
    pub(crate) timeout: Option<Duration>,
}

impl ScriptSpec {
    /// Reads `implementation` of a script tool.
    pub(crate) fn from_def(def: &ToolDef) -> Result<ScriptSpec, String> {
        let imp = def.implementation.as_ref().ok_or("it has no implementation")?;
        let argv = match imp.get("command") {
            Some(Value::String(s)) => {
                shell_words::split(s).map_err(|e| format!("its command {s:?} cannot be split: {e}"))?
            }
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or("its command array holds a non-string"))
                .collect::<Result<_, _>>()?,
            _ => return Err("its implementation has no command".into()),
        };
        if argv.is_empty() || argv[0].trim().is_empty() {
            return Err("its command is empty".into());
        }
        if let Some(bad) = argv.iter().find(|a| Path::new(a).components().any(|c| c == Component::ParentDir)) {
            return Err(format!("its command argument {bad:?} climbs out of the plugin folder (`..`); refused"));
        }
        match imp.get("protocol").and_then(Value::as_str) {
            None | Some("stdio") => {}
            Some(other) => return Err(format!("protocol {other:?} is not supported (only stdio)")),
        }
        let timeout = imp.get("timeout").and_then(Value::as_u64).filter(|ms| *ms > 0).map(Duration::from_millis);
        Ok(ScriptSpec { argv, timeout })
    }

    /// The program to start: the plugin's own (in `dir`) when it has a `/`.
    fn program(&self, dir: &Path) -> PathBuf {
        super::plugin_program(dir, &self.argv[0])
    }
}

/// Reads `r` to its end, keeping at most `cap` bytes; calls `over` once
/// when more arrive. Returns the kept bytes and the total count.
pub(super) async fn read_capped<R: AsyncRead + Unpin>(mut r: R, cap: usize, over: impl Fn()) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 16 * 1024];
    let mut signalled = false;
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        total += n as u64;
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        if total > cap as u64 && !signalled {
            signalled = true;
            over();
        }
    }
    (kept, total)
}

/// Runs one script tool once.
pub(crate) async fn run(
    def: &ToolDef,
    spec: &ScriptSpec,
    dir: &Path,
    params: &Map<String, Value>,
    env: &[(String, String)],
    options: &RunnerOptions,
) -> StepRun {
    let id = def.id.as_str();
    let mark = super::group::new_mark();
    let mut cmd = super::tool_command(spec.program(dir), dir, options, &mark);
    cmd.args(&spec.argv[1..])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let why = if e.kind() == std::io::ErrorKind::NotFound {
                format!("program {:?} not found", spec.argv[0])
            } else {
                format!("{:?} could not be started: {e}", spec.argv[0])
            };
            return StepRun::fail(Outcome::Failed, observe::failure(id, "not started", &why), Value::Null, 0);
        }
    };
    let guard = GroupGuard::new(child.id(), Some(&mark));
    let input = {
        let mut v = serde_json::to_vec(&Value::Object(params.clone())).unwrap_or_default();
        v.push(b'\n');
        v
    };
    let stdin = child.stdin.take();
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return StepRun::fail(Outcome::Failed, observe::failure(id, "not started", "no pipes"), Value::Null, 0);
    };
    let cap = options.max_output;
    let timeout = spec.timeout.unwrap_or(options.default_timeout);
    let guard_ref = &guard;
    let work = async {
        let write = async move {
            if let Some(mut s) = stdin {
                // A tool that does not read its input (or exits first) is fine.
                let _ = s.write_all(&input).await;
                let _ = s.shutdown().await;
            }
        };
        let wait = async {
            let status = child.wait().await;
            // The call is over when the tool exits: whatever it forked goes too.
            guard_ref.kill();
            status
        };
        let (status, out, err, ()) = tokio::join!(
            wait,
            read_capped(stdout, cap, || guard_ref.kill()),
            read_capped(stderr, cap, || guard_ref.kill()),
            write
        );
        (status, out, err)
    };
    let (status, (out, out_total), (err, _)) = match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => {
            guard.kill();
            let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            return StepRun::fail(Outcome::Timeout, observe::timeout(id, ms), Value::Null, 0);
        }
    };
    let text = String::from_utf8_lossy(&out).into_owned();
    if out_total > cap as u64 {
        let first = observe::excerpt(&text, options.max_observation.min(cap));
        let mut run = StepRun::fail(
            Outcome::OutputCapped,
            observe::output_capped(id, cap, &first),
            Value::String(text),
            out_total,
        );
        run.truncated = true;
        return run;
    }
    let stderr_text = String::from_utf8_lossy(&err).into_owned();
    match status {
        Ok(st) if st.success() => {
            let trimmed = text.trim();
            let result = serde_json::from_str::<Value>(trimmed).unwrap_or_else(|_| Value::String(trimmed.to_string()));
            StepRun::ok(observe::success(id, &result, options.max_observation), result, out_total)
        }
        Ok(st) => {
            use std::os::unix::process::ExitStatusExt;
            let why = match (st.code(), st.signal()) {
                (Some(code), _) => format!("exit status {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                (None, None) => "abnormal exit".to_string(),
            };
            let detail = if stderr_text.trim().is_empty() { &text } else { &stderr_text };
            let excerpt = observe::excerpt(detail.trim(), options.max_stderr_excerpt);
            StepRun::fail(Outcome::Failed, observe::failure(id, &why, &excerpt), Value::String(text), out_total)
        }
        Err(e) => StepRun::fail(Outcome::Failed, observe::failure(id, "wait failed", &e.to_string()), Value::Null, 0),
    }
}
