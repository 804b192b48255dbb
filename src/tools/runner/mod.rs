//! Running tool calls: dispatch by `implementation.type` (spec 002 §4,
//! §6.3, §10.3), the step semantics of TAM (spec 000 §3.1, §4), async
//! tools with task ids (spec 000 §3.2), limits, and the audit record of
//! every run (spec 002 §13).
//!
//! This module owns processes and their lifetimes. It must not parse model
//! output (calls arrive as [`ToolCall`]s) or word observations itself
//! ([`crate::tools::observe`] does).
//!
//! # Implementations
//!
//! | `implementation.type` | how it runs |
//! |---|---|
//! | `script` | a program run in the plugin's folder without a shell: parameters as one JSON object on stdin, result from stdout (JSON when it parses), environment `PATH` ([`RunnerOptions::path`]: by default spindle's own), `LANG` and the tool's `configSchema` values only |
//! | `mcp` | a tool of an MCP server started from a plugin's `mcp:` section ([`McpPool`]) |
//! | `service` | a Rust async function registered with [`Runner::register_service`] |
//! | ATTP code (spec 001) | spindle's `python3` sandbox (the `attp` module: each tool function the code calls is a step of its own), or a `python` service when one is registered |
//!
//! A tool whose definition says `"async": true` (in `implementation` or at
//! the top level) answers at once with a task id ([`Outcome::Pending`]);
//! its result arrives later as a [`ToolEvent::TaskDone`] and from the
//! [`RunScope`] whose call started it.
//!
//! # Runs
//!
//! A [`Runner`] holds what every run shares: the catalog, services, MCP
//! servers, limits. Calls run through a [`RunScope`], one per run (an
//! agent loop, a request, a transcript), made with [`Runner::scope`]. The
//! async tasks a scope's calls start belong to it: their ids are numbered
//! in it, only it hands out their results, and when it ends
//! ([`RunScope::stop`], or dropping it) the tasks still running are
//! killed. Two runs on one runner never see each other's tasks.
//!
//! # Steps
//!
//! Every step of a call is checked (its tool id, its parameters against
//! the tool's schema, their size) **before any step runs** (spec 002
//! §12.2-12.3; spec 004 §3.3: on a validation failure nothing is run).
//! When one step fails the check, no step of the call runs: each invalid
//! step gets its error observation ([`Outcome::UnknownTool`],
//! [`Outcome::InvalidParams`]) and every other step an
//! [`Outcome::NotRun`] result whose observation names the invalid steps
//! (`... was not run: step 2 (File.Wrte) failed validation, and no step of
//! a call runs unless every step is valid`).
//!
//! A valid call's steps run one after another in the order of the call
//! (ascending `N` for TAM; `common_*` values are already merged into each
//! step by the TAM reader). A step that fails while running is retried
//! `retry_N` times (at most [`RunnerOptions::max_retry`]); when it still
//! fails and its `on_error` is `stop` (the default), the remaining steps
//! are reported [`Outcome::NotRun`]; with `continue` the next step runs
//! (`on_error` is about these run-time failures only: a step that is
//! invalid stops the whole call before anything runs). A call or step
//! marked `not_runnable` (a block cut off by the end of the output, an
//! ACTION block after the first) is never run. Every step gives exactly
//! one [`ToolResult`].
//!
//! # `request_id`
//!
//! A TAM call's `request_id` (spec 000 §4: for log tracing and
//! idempotency) is in every [`ToolResult`] of the call (and so in its
//! `tool_result` and `tool_task` JSON) and in every [`ToolAudit`]. Within
//! one [`RunScope`], a call with a `request_id` that an earlier call had
//! is not run again: each of its results is the earlier call's (outcome,
//! result, task id) under the new `call_id`, with `attempts` 0 and the
//! observation `... [request_id "req-1" was already run, as call_1: not
//! run again; this is that result]`, and `repeat_of` naming the earlier
//! call (a repeat does not count toward an agent's tool-call budget). Only a call that ran (or started) at
//! least one step is remembered: one that was invalid, cut off or
//! malformed ran nothing, so its `request_id` may be used again. A scope
//! remembers the last [`MAX_REQUEST_IDS`] ids; two calls with one id that
//! run at the same time in one scope (the agent loop and `parse
//! --execute` run calls one after another) both run.
//!
//! # Parameters passed by URI
//!
//! A TAM `uri_[param]_N` (spec 000 §3.3, §4) passes a parameter's value by
//! reference. The check counts it for `required`, and the tool gets the
//! URI string as that parameter's value, unless the URI's scheme has a
//! resolver ([`Runner::register_uri_scheme`]): then the resource it
//! returns replaces the URI before the tool runs (and is checked against
//! the schema again), and a resolver's error is the step's error
//! observation. spindle resolves no scheme itself, `file://` included: a
//! model must not be able to read any local file by naming it.
//!
//! # Limits and faults
//!
//! Every limit is in [`RunnerOptions`]. A script that passes its timeout,
//! or writes more than `max_output` bytes, is killed with its whole
//! process group; a tool never outlives its call, also when the caller is
//! cancelled (the token, or dropping the future), and an async tool's task
//! never outlives its [`RunScope`].
//!
//! # Cancel safety
//!
//! [`RunScope::run_call`] may be dropped at any await: the running tool's
//! process group is killed and no result is produced. Cancelling its
//! token instead gives [`Outcome::Cancelled`] results.

mod attp;
mod group;
pub mod mcp;
mod scope;
mod script;

pub use mcp::{McpError, McpPool};
pub use scope::{MAX_REQUEST_IDS, RunScope};

use super::observe::{self, Outcome, ToolAudit, ToolResult};
use crate::calls::attp::PYTHON_TOOL;
use crate::calls::catalog::CheckedStep;
use crate::calls::{CallFormat, CallProblem, ToolCall, ToolCatalog, ToolDef};
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

/// The program a plugin's command starts: one with a `/` in it is the
/// plugin's own (relative to its folder `dir`, unless absolute), others
/// are looked up on `PATH`. The path is made absolute: the process starts
/// in `dir` (its working folder), where a relative `dir` would be
/// resolved a second time.
fn plugin_program(dir: &Path, program: &str) -> PathBuf {
    let path = Path::new(program);
    if path.is_absolute() || !program.contains('/') {
        return path.to_path_buf();
    }
    let joined = dir.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}

/// The command of a process spindle starts for a tool (a script, an MCP
/// server, the ATTP sandbox): `program` in `dir`, in a process group of its
/// own that dies with the handle, with only `LANG`, the environment
/// [`RunnerOptions::env`] names, `PATH` and the run's `mark`.
fn tool_command(program: impl AsRef<std::ffi::OsStr>, dir: &Path, options: &RunnerOptions, mark: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir)
        .env_clear()
        .env("LANG", "C.UTF-8")
        .envs(options.tool_env())
        .env("PATH", &options.path)
        .env(group::RUN_MARK, mark)
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Limits and settings of a [`Runner`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerOptions {
    /// Time limit of a run when the tool sets none (`timeout` in ms).
    pub default_timeout: Duration,
    /// Most bytes of stdout (and of stderr) kept from a script; past it the
    /// tool is stopped and the result cut ([`Outcome::OutputCapped`]).
    pub max_output: usize,
    /// Most bytes of a result shown in an observation.
    pub max_observation: usize,
    /// Most bytes of stderr quoted in a failure observation.
    pub max_stderr_excerpt: usize,
    /// Largest parameters object (as JSON) passed to a tool; a larger one
    /// is refused as invalid parameters.
    pub max_params_bytes: usize,
    /// Most retries of one step, whatever `retry_N` asks.
    pub max_retry: u32,
    /// The `PATH` a script or MCP server sees, and where a bare program
    /// name (`python`, `node`) is looked up. Default: the `PATH` this
    /// process was started with ([`RunnerOptions::inherited_path`]), so
    /// that programs installed with pyenv, nvm or Homebrew are found; the
    /// rest of the environment is not passed on ([`RunnerOptions::env`]).
    pub path: String,
    /// More environment for tools (scripts and MCP servers), beyond `PATH`
    /// and `LANG`: `NAME` passes this process's value on (nothing when it
    /// is unset), `NAME=VALUE` sets one. Default: none. Tools run on what
    /// a model asks, so spindle's environment (its keys and tokens) reaches
    /// them only when named here. `PATH` is [`RunnerOptions::path`]'s.
    pub env: Vec<String>,
}

impl RunnerOptions {
    /// The `PATH` used when the process has none (or an empty one, or one
    /// that is not UTF-8).
    pub const FALLBACK_PATH: &'static str = "/usr/local/bin:/usr/bin:/bin";

    /// The `PATH` this process was started with, or
    /// [`RunnerOptions::FALLBACK_PATH`] when it is unset, empty or not
    /// UTF-8: the default of [`RunnerOptions::path`].
    pub fn inherited_path() -> String {
        std::env::var("PATH")
            .ok()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or_else(|| RunnerOptions::FALLBACK_PATH.to_string())
    }

    /// The variables [`RunnerOptions::env`] gives a tool, read now: each
    /// `NAME=VALUE` as written, each `NAME` with this process's value when
    /// it has one.
    pub fn tool_env(&self) -> Vec<(String, std::ffi::OsString)> {
        self.env
            .iter()
            .filter_map(|item| match item.split_once('=') {
                Some((name, value)) => Some((name.to_string(), value.into())),
                None => std::env::var_os(item).map(|value| (item.clone(), value)),
            })
            .filter(|(name, _)| !name.is_empty() && name != "PATH")
            .collect()
    }
}

impl Default for RunnerOptions {
    fn default() -> Self {
        RunnerOptions {
            default_timeout: Duration::from_secs(30),
            max_output: 1024 * 1024,
            max_observation: 8 * 1024,
            max_stderr_excerpt: 2 * 1024,
            max_params_bytes: 1024 * 1024,
            max_retry: 5,
            path: RunnerOptions::inherited_path(),
            env: Vec::new(),
        }
    }
}

/// A step checked before its call runs.
enum Checked {
    /// Valid: its parameters as the tool takes them, and which of them
    /// are URIs.
    Params(CheckedStep),
    /// Invalid: its error result (unknown tool, invalid parameters).
    Invalid(ToolResult),
    /// Not checked: ATTP code, or a step that will not run.
    Unchecked,
}

/// The step's number as the model wrote it (`command_3`: 3), else its
/// 1-based position.
fn step_number(step: &crate::calls::Step, i: usize) -> String {
    step.index.map_or_else(|| (i + 1).to_string(), |n| n.to_string())
}

/// What one attempt of a step gave.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepRun {
    pub(crate) outcome: Outcome,
    pub(crate) observation: String,
    pub(crate) result: Value,
    pub(crate) bytes: u64,
    pub(crate) truncated: bool,
}

impl StepRun {
    pub(crate) fn ok(observation: String, result: Value, bytes: u64) -> StepRun {
        StepRun { outcome: Outcome::Success, observation, result, bytes, truncated: false }
    }

    pub(crate) fn fail(outcome: Outcome, observation: String, result: Value, bytes: u64) -> StepRun {
        StepRun { outcome, observation, result, bytes, truncated: false }
    }
}

/// The future a service tool returns: its result, or an error text for
/// the failure observation.
pub type ServiceFuture = BoxFuture<'static, Result<Value, String>>;

/// A `service` tool: a Rust async function of the checked parameters.
pub type ServiceFn = Arc<dyn Fn(Map<String, Value>) -> ServiceFuture + Send + Sync>;

/// A resolver of one URI scheme ([`Runner::register_uri_scheme`]): the
/// resource a URI stands for, or an error text for the observation.
pub type UriResolver = Arc<dyn Fn(String) -> ServiceFuture + Send + Sync>;

/// The scheme of `uri`, lower-cased (`FAM://x` -> `fam`), when it starts
/// with one (a letter, then letters, digits, `+`, `-`, `.`, then `:`).
fn uri_scheme(uri: &str) -> Option<String> {
    let (scheme, _) = uri.trim_start().split_once(':')?;
    let mut chars = scheme.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (first_ok && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .then(|| scheme.to_ascii_lowercase())
}

/// Something the runner reports besides the results it returns.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ToolEvent {
    /// The audit record of one step (run or not).
    Audit(ToolAudit),
    /// An async tool's task finished, or was stopped because its run
    /// ended ([`Outcome::Cancelled`], see [`RunScope::stop`]).
    TaskDone(ToolResult),
}

impl ToolEvent {
    /// The JSONL form (`tool_audit`, `tool_task`).
    pub fn to_event_json(&self) -> Value {
        match self {
            ToolEvent::Audit(a) => a.to_event_json(),
            ToolEvent::TaskDone(r) => r.to_event_json("tool_task"),
        }
    }
}

/// Where a runner sends its [`ToolEvent`]s.
pub type EventSink = Arc<dyn Fn(ToolEvent) + Send + Sync>;

/// Values for tools' `configSchema` entries (spec 002 §6.3, §17), by tool
/// id or plugin name: `{"bilibili-fetcher": {"bilibiliCookie": "..."}}`.
/// A script gets each value its tool declares as an environment variable
/// named after the key in upper snake case (`BILIBILI_COOKIE`); nothing
/// else of the runner's environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolConfig(pub Map<String, Value>);

impl ToolConfig {
    /// Reads a TOML or JSON (by extension `.json`) config file.
    ///
    /// # Errors
    ///
    /// A text naming the file and the cause.
    pub fn load(path: &Path) -> Result<ToolConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let value: Value = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| format!("{} is not valid JSON: {e}", path.display()))?
        } else {
            let t: toml::Value =
                toml::from_str(&text).map_err(|e| format!("{} is not valid TOML: {e}", path.display()))?;
            serde_json::to_value(t).map_err(|e| e.to_string())?
        };
        match value {
            Value::Object(m) => Ok(ToolConfig(m)),
            _ => Err(format!("{} is not a table of tools", path.display())),
        }
    }

    /// The environment of `def`: its `configSchema` keys with values from
    /// this config (by tool id, then plugin) or their `defaultValue`.
    pub fn env_for(&self, def: &ToolDef) -> Vec<(String, String)> {
        let Some(Value::Array(schema)) = def.extra.get("configSchema") else {
            return Vec::new();
        };
        let sections: Vec<&Map<String, Value>> = [Some(def.id.as_str()), def.plugin.as_deref()]
            .into_iter()
            .flatten()
            .filter_map(|k| self.0.get(k).and_then(Value::as_object))
            .collect();
        let mut out = Vec::new();
        for entry in schema {
            let Some(key) = entry.get("key").and_then(Value::as_str) else { continue };
            let value = sections.iter().find_map(|s| s.get(key)).or_else(|| entry.get("defaultValue"));
            if let Some(v) = value.filter(|v| !v.is_null()) {
                out.push((env_name(key), observe::result_text(v)));
            }
        }
        out
    }
}

/// `bilibiliCookie` -> `BILIBILI_COOKIE`; `extensions.x.max-items` ->
/// `EXTENSIONS_X_MAX_ITEMS`.
pub fn env_name(key: &str) -> String {
    let mut out = String::new();
    let mut prev_lower = false;
    for c in key.chars() {
        if c.is_ascii_alphanumeric() {
            if c.is_ascii_uppercase() && prev_lower {
                out.push('_');
            }
            prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
            out.push(c.to_ascii_uppercase());
        } else {
            if !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
            prev_lower = false;
        }
    }
    out.trim_end_matches('_').to_string()
}

/// How a tool is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Script,
    Mcp,
    Service,
    /// ATTP code in spindle's own Python sandbox.
    Sandbox,
    Other,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Script => "script",
            Kind::Mcp => "mcp",
            Kind::Service => "service",
            Kind::Sandbox => "attp_sandbox",
            Kind::Other => "none",
        }
    }
}

/// The implementation type a definition declares (`script`, `mcp`,
/// `service`, ...), `None` when it declares none.
pub fn implementation_type(def: &ToolDef) -> Option<&str> {
    def.implementation.as_ref().and_then(|i| i.get("type")).and_then(Value::as_str)
}

/// Whether a tool is async (answers with a task id): `"async": true` or
/// `"mode": "async"` in its `implementation` or at its top level.
pub fn is_async(def: &ToolDef) -> bool {
    let says = |m: Option<&Value>| {
        m.is_some_and(|m| {
            m.get("async").and_then(Value::as_bool) == Some(true)
                || m.get("mode").and_then(Value::as_str) == Some("async")
        })
    };
    says(def.implementation.as_ref())
        || def.extra.get("async").and_then(Value::as_bool) == Some(true)
        || def.extra.get("mode").and_then(Value::as_str) == Some("async")
}

struct Inner {
    catalog: Arc<ToolCatalog>,
    dirs: HashMap<String, PathBuf>,
    services: HashMap<String, ServiceFn>,
    /// URI resolvers, by lower-case scheme.
    resolvers: HashMap<String, UriResolver>,
    mcp: Option<Arc<McpPool>>,
    config: ToolConfig,
    options: RunnerOptions,
    sink: Option<EventSink>,
}

/// Runs checked tool calls against a catalog: what every run shares (the
/// catalog, services, MCP servers, limits, the event sink). Each run makes
/// its own [`RunScope`] ([`Runner::scope`]) and runs its calls there; a
/// runner may be shared (`Arc<Runner>`) by any number of runs at once.
///
/// ```
/// use spindle::calls::{CallFormat, Step, ToolCall, ToolCatalog, ToolDef};
/// use spindle::tools::{Outcome, Runner};
/// use serde_json::json;
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let mut catalog = ToolCatalog::new();
/// catalog.add(ToolDef::new("Add", json!({"type": "object",
///     "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}))).unwrap();
/// let mut runner = Runner::new(catalog);
/// runner.register_service("Add", |p| async move {
///     Ok(json!(p["a"].as_i64().unwrap_or(0) + p["b"].as_i64().unwrap_or(0)))
/// });
/// let mut step = Step::new("Add");
/// step.params.insert("a".into(), json!("2")); // text from a TAM block
/// step.params.insert("b".into(), json!(3));
/// let mut call = ToolCall::new(CallFormat::Tam);
/// call.steps.push(step);
/// let run = runner.scope();
/// let results = run.run_call(&call, "call_1", &CancellationToken::new()).await;
/// assert_eq!(results[0].outcome, Outcome::Success);
/// assert_eq!(results[0].observation, "Observation: Tool Add executed successfully. Result: 5");
/// # }
/// ```
pub struct Runner {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("tools", &self.inner.catalog.len())
            .field("services", &self.inner.services.keys().collect::<Vec<_>>())
            .field("uri_schemes", &self.inner.resolvers.keys().collect::<Vec<_>>())
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner over `catalog` with default options.
    pub fn new(catalog: ToolCatalog) -> Runner {
        Runner::with_options(catalog, RunnerOptions::default())
    }

    /// A runner with explicit limits.
    pub fn with_options(catalog: ToolCatalog, options: RunnerOptions) -> Runner {
        let mut dirs = HashMap::new();
        for p in catalog.plugins() {
            for id in &p.tools {
                dirs.insert(id.clone(), p.dir.clone());
            }
        }
        Runner {
            inner: Arc::new(Inner {
                catalog: Arc::new(catalog),
                dirs,
                services: HashMap::new(),
                resolvers: HashMap::new(),
                mcp: None,
                config: ToolConfig::default(),
                options,
                sink: None,
            }),
        }
    }

    fn inner_mut(&mut self) -> &mut Inner {
        // Only called while building, before any scope shares `inner`.
        if Arc::get_mut(&mut self.inner).is_none() {
            let copy = Inner {
                catalog: self.inner.catalog.clone(),
                dirs: self.inner.dirs.clone(),
                services: self.inner.services.clone(),
                resolvers: self.inner.resolvers.clone(),
                mcp: self.inner.mcp.clone(),
                config: self.inner.config.clone(),
                options: self.inner.options.clone(),
                sink: self.inner.sink.clone(),
            };
            self.inner = Arc::new(copy);
        }
        Arc::get_mut(&mut self.inner).unwrap_or_else(|| unreachable!("a fresh Arc has one owner"))
    }

    /// Registers a `service` tool's function under its tool id. The tool
    /// must be in the catalog to be called (with `"type": "service"` or no
    /// implementation); ATTP code is handed to a service registered as
    /// `python`, if there is one (else it runs in spindle's own `python3`
    /// sandbox). Its parameters are `code`, `target`, and
    /// `functions`: each name the code may call a tool by, with the tool's
    /// id ([`ToolCatalog::function_table`]), for the sandbox to bind. Code
    /// that calls a function no tool provides is not handed over.
    pub fn register_service<F, Fut>(&mut self, id: &str, f: F)
    where
        F: Fn(Map<String, Value>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value, String>> + Send + 'static,
    {
        let f: ServiceFn = Arc::new(move |p| Box::pin(f(p)));
        self.inner_mut().services.insert(id.to_string(), f);
    }

    /// Registers a resolver for the URIs of `scheme` (`fam`, matched
    /// without regard to case): a parameter passed as `uri_[param]_N` with
    /// such a URI (spec 000 §3.3, §4) is replaced by what `f` returns for
    /// the whole URI before the tool runs (the result is checked against
    /// the tool's schema again). An error `f` returns, or no answer within
    /// [`RunnerOptions::default_timeout`], is the step's error observation
    /// ([`Outcome::Failed`]; the tool does not run). A URI whose scheme has
    /// no resolver reaches the tool as the URI string. There is no
    /// built-in resolver, for `file://` neither: a model must not be able
    /// to read any file of the machine by naming it.
    ///
    /// ```
    /// use spindle::calls::{CallFormat, Step, ToolCall, ToolCatalog, ToolDef};
    /// use spindle::tools::Runner;
    /// use serde_json::json;
    /// use tokio_util::sync::CancellationToken;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let mut catalog = ToolCatalog::new();
    /// catalog.add(ToolDef::new("Show", json!({"type": "object",
    ///     "properties": {"image": {"type": "object"}}, "required": ["image"]}))).unwrap();
    /// let mut runner = Runner::new(catalog);
    /// runner.register_service("Show", |p| async move { Ok(p["image"]["size"].clone()) });
    /// runner.register_uri_scheme("fam", |uri| async move {
    ///     match uri.strip_prefix("fam://project/") {
    ///         Some(name) => Ok(json!({"name": name, "size": 1024})),
    ///         None => Err(format!("{uri} is not in this project")),
    ///     }
    /// });
    /// let mut step = Step::new("Show");
    /// step.uris.insert("image".into(), "fam://project/a.png".into());
    /// let mut call = ToolCall::new(CallFormat::Tam);
    /// call.steps.push(step);
    /// let results = runner.scope().run_call(&call, "call_1", &CancellationToken::new()).await;
    /// assert_eq!(results[0].result, json!(1024));
    /// # }
    /// ```
    pub fn register_uri_scheme<F, Fut>(&mut self, scheme: &str, f: F)
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value, String>> + Send + 'static,
    {
        let f: UriResolver = Arc::new(move |uri| Box::pin(f(uri)));
        self.inner_mut().resolvers.insert(scheme.to_ascii_lowercase(), f);
    }

    /// Uses these `configSchema` values.
    pub fn set_config(&mut self, config: ToolConfig) {
        self.inner_mut().config = config;
    }

    /// Sends audit records and task completions to `sink`.
    pub fn set_sink(&mut self, sink: EventSink) {
        self.inner_mut().sink = Some(sink);
    }

    /// Uses the MCP servers of `pool` for `mcp` tools.
    pub fn set_mcp(&mut self, pool: Arc<McpPool>) {
        self.inner_mut().mcp = Some(pool);
    }

    /// The catalog.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.inner.catalog
    }

    /// The options.
    pub fn options(&self) -> &RunnerOptions {
        &self.inner.options
    }

    /// Starts a run: a [`RunScope`] that runs calls with this runner's
    /// tools and owns the async tasks they start. Make one per run (per
    /// agent loop, per request); set the runner up (services, sink, MCP
    /// servers) before.
    pub fn scope(&self) -> RunScope {
        RunScope::new(self.inner.clone())
    }
}

impl RunScope {
    /// The catalog.
    pub fn catalog(&self) -> &ToolCatalog {
        &self.inner.catalog
    }

    /// Checks every step of `call`, then runs them (see the module docs)
    /// and returns one result per step. A call with an invalid step runs
    /// none of its steps. A call that could not be read (its `error` is
    /// set: malformed XML, no command, an ATTP code policy breach) gives
    /// one [`Outcome::Malformed`] result and runs nothing; an ATTP answer
    /// with `status = "fail"`, or with no `[tool_call]`, gives no result.
    ///
    /// A call whose `request_id` an earlier call of this scope had (and
    /// ran at least one step of) is not run again: it gets that call's
    /// results, under its own `call_id`, with `attempts` 0 and observations
    /// that say it is a repeat (see the module docs).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future kills the running tool's process group.
    /// Cancelling `cancel` stops the running step and reports it and the
    /// rest as [`Outcome::Cancelled`].
    pub async fn run_call(&self, call: &ToolCall, call_id: &str, cancel: &CancellationToken) -> Vec<ToolResult> {
        if call.error.is_none() && call.steps.is_empty() && call.format == CallFormat::Attp {
            // ATTP `status = "fail"` (the model declined) or no [tool_call]
            // at all (an answer): nothing to run or report.
            return Vec::new();
        }
        let readable = call.error.is_none() && !call.steps.is_empty();
        // A request_id this run has already run: its results again, nothing run.
        if let (true, Some(rid)) = (readable, call.request_id.as_deref())
            && let Some((first_call, results)) = self.remembered(rid)
        {
            return results
                .into_iter()
                .map(|mut r| {
                    r.observation = observe::repeat(&r.observation, rid, &first_call);
                    r.repeat_of = Some(first_call.clone());
                    r.call_id = call_id.to_string();
                    r.attempts = 0;
                    r.duration_ms = 0;
                    r.bytes = 0;
                    let params = call.steps.iter().find(|s| s.index == r.step && s.tool_id == r.tool_id);
                    let params = params.map_or(Value::Null, |s| Value::Object(s.params.clone()));
                    self.inner.audit_not_run(&r, &params);
                    r
                })
                .collect();
        }
        let out = self.run_steps(call, call_id, cancel).await;
        if let Some(rid) = call.request_id.as_deref()
            && out.iter().any(|r| r.attempts > 0 || r.outcome == Outcome::Pending)
        {
            self.remember(rid, call_id, &out);
        }
        out
    }

    /// [`RunScope::run_call`] without the `request_id` bookkeeping: checks
    /// and runs the steps; every result carries the call's `request_id`.
    async fn run_steps(&self, call: &ToolCall, call_id: &str, cancel: &CancellationToken) -> Vec<ToolResult> {
        let inner = &self.inner;
        let mut out = Vec::new();
        // A result that did not run: the call's request_id, and its audit record.
        let not_run_report = |mut r: ToolResult, params: &Value| {
            r.request_id.clone_from(&call.request_id);
            inner.audit_not_run(&r, params);
            r
        };
        if call.error.is_some() || call.steps.is_empty() {
            // An unreadable call (malformed XML, no command, a code policy
            // breach): nothing of it runs, even the steps that were read.
            let obs = call
                .observation
                .clone()
                .or_else(|| call.error.as_ref().map(|e| format!("Observation: Error - {e}")))
                .unwrap_or_else(|| "Observation: Error - The tool call names no tool".into());
            let tool = call.steps.first().map_or("", |s| s.tool_id.as_str());
            out.push(not_run_report(ToolResult::not_run(call_id, tool, None, Outcome::Malformed, obs), &Value::Null));
            return out;
        }
        // Every step is checked before any runs.
        let runnable = call.not_runnable.is_none();
        let checked: Vec<Checked> = (0..call.steps.len())
            .map(|i| if runnable { self.check(call, i, call_id) } else { Checked::Unchecked })
            .collect();
        let invalid: Vec<String> = call
            .steps
            .iter()
            .zip(&checked)
            .enumerate()
            .filter(|(_, (_, c))| matches!(c, Checked::Invalid(_)))
            .map(|(i, (step, _))| format!("{} ({})", step_number(step, i), step.tool_id))
            .collect();
        if !invalid.is_empty() {
            let detail = match invalid.as_slice() {
                [one] => format!("step {one} failed validation"),
                many => format!("steps {} failed validation", many.join(", ")),
            };
            for (step, c) in call.steps.iter().zip(checked) {
                let result = match (c, step.not_runnable.as_deref()) {
                    (Checked::Invalid(r), _) => r,
                    (_, Some(reason)) => ToolResult::not_run(
                        call_id,
                        &step.tool_id,
                        step.index,
                        Outcome::NotRun,
                        observe::not_run(&step.tool_id, reason, ""),
                    ),
                    _ => ToolResult::not_run(
                        call_id,
                        &step.tool_id,
                        step.index,
                        Outcome::NotRun,
                        observe::not_run(&step.tool_id, "invalid_call", &detail),
                    ),
                };
                out.push(not_run_report(result, &Value::Object(step.params.clone())));
            }
            return out;
        }
        // The first step that stopped the call, if any.
        let mut stopped: Option<String> = None;
        for ((i, step), checked) in call.steps.iter().enumerate().zip(checked) {
            let not_run = |reason: &str, detail: &str| {
                ToolResult::not_run(
                    call_id,
                    &step.tool_id,
                    step.index,
                    Outcome::NotRun,
                    observe::not_run(&step.tool_id, reason, detail),
                )
            };
            let mut result = if let Some(reason) = call.not_runnable.as_deref().or(step.not_runnable.as_deref()) {
                not_run(reason, "")
            } else if cancel.is_cancelled() {
                ToolResult::not_run(
                    call_id,
                    &step.tool_id,
                    step.index,
                    Outcome::Cancelled,
                    observe::cancelled(&step.tool_id),
                )
            } else if let Some(why) = &stopped {
                not_run("previous_step_failed", why)
            } else if self.in_sandbox(call, step) {
                // ATTP code in spindle's sandbox: the steps of the tools it
                // called come first.
                let (calls, result) = self.run_attp(call, call_id, step, cancel).await;
                out.extend(calls);
                result
            } else {
                let checked = match checked {
                    Checked::Params(c) => c,
                    // ATTP code, handed over as written.
                    Checked::Unchecked | Checked::Invalid(_) => {
                        CheckedStep { params: step.params.clone(), ..CheckedStep::default() }
                    }
                };
                self.run_step(call, i, call_id, checked, cancel).await
            };
            if !result.outcome.is_ok() && stopped.is_none() && step.on_error == crate::calls::OnError::Stop {
                stopped = Some(format!("step {} ({}) did not succeed", step_number(step, i), step.tool_id));
            }
            if result.attempts == 0 {
                result = not_run_report(result, &Value::Object(step.params.clone()));
            }
            result.request_id.clone_from(&call.request_id);
            out.push(result);
        }
        out
    }

    /// Whether `step` is ATTP code (its `python` step, when no catalog tool
    /// has that id), for the `python` service or the sandbox.
    fn is_attp_code(&self, call: &ToolCall, step: &crate::calls::Step) -> bool {
        call.format == CallFormat::Attp && step.tool_id == PYTHON_TOOL && self.inner.catalog.get(PYTHON_TOOL).is_none()
    }

    /// Whether `step` is ATTP code for spindle's own sandbox: no `python`
    /// service is registered.
    fn in_sandbox(&self, call: &ToolCall, step: &crate::calls::Step) -> bool {
        self.is_attp_code(call, step) && !self.inner.services.contains_key(PYTHON_TOOL)
    }

    /// Checks one step of `call` before anything of the call runs: its
    /// parameters as the tool takes them, or its error result. Of ATTP
    /// code, only the functions it calls are checked; steps that will not
    /// run are not checked.
    fn check(&self, call: &ToolCall, i: usize, call_id: &str) -> Checked {
        let inner = &self.inner;
        let step = &call.steps[i];
        let id = step.tool_id.as_str();
        if step.not_runnable.is_some() {
            return Checked::Unchecked;
        }
        if self.is_attp_code(call, step) {
            // ATTP code: the functions it calls must be tools (spec 001).
            let calls = call.attp.as_ref().map_or(&[][..], |a| a.calls.as_slice());
            let problems = inner.catalog.function_problems(calls);
            if problems.is_empty() {
                return Checked::Unchecked;
            }
            let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
            let obs = format!("Observation: Error - {}", text.join("; "));
            return Checked::Invalid(ToolResult::not_run(call_id, id, step.index, Outcome::UnknownTool, obs));
        }
        let checked = match inner.catalog.check_step_uris(call.format, i, step) {
            Ok(c) => c,
            Err(problem) => {
                let outcome = match problem {
                    CallProblem::UnknownTool { .. } => Outcome::UnknownTool,
                    CallProblem::Unreadable { .. } => Outcome::Malformed,
                    _ => Outcome::InvalidParams,
                };
                return Checked::Invalid(ToolResult::not_run(call_id, id, step.index, outcome, problem.observation()));
            }
        };
        if let Some(obs) = inner.too_large(id, &checked.params) {
            return Checked::Invalid(ToolResult::not_run(call_id, id, step.index, Outcome::InvalidParams, obs));
        }
        Checked::Params(checked)
    }

    /// Replaces each parameter passed by a URI whose scheme has a resolver
    /// ([`Runner::register_uri_scheme`]) with the resource, and checks the
    /// parameters again; the others keep the URI string. The error result
    /// when a resolver fails, takes too long or gives a value the schema
    /// rejects.
    async fn resolve_uris(
        &self,
        call_id: &str,
        step: Option<u64>,
        id: &str,
        checked: CheckedStep,
        cancel: &CancellationToken,
    ) -> Result<Map<String, Value>, ToolResult> {
        let inner = &self.inner;
        let CheckedStep { mut params, uris } = checked;
        let mut resolved = false;
        for (name, uri) in &uris {
            let Some(resolve) = uri_scheme(uri).and_then(|s| inner.resolvers.get(&s)).cloned() else { continue };
            let limit = inner.options.default_timeout;
            let fail = |why: String| {
                ToolResult::not_run(call_id, id, step, Outcome::Failed, observe::uri_failed(id, name, uri, &why))
            };
            let value = tokio::select! {
                r = tokio::time::timeout(limit, resolve(uri.clone())) => match r {
                    Ok(Ok(v)) => v,
                    Ok(Err(why)) => return Err(fail(why)),
                    Err(_) => return Err(fail(format!("no answer within {} ms", limit.as_millis()))),
                },
                () = cancel.cancelled() => {
                    return Err(ToolResult::not_run(call_id, id, step, Outcome::Cancelled, observe::cancelled(id)));
                }
            };
            params.insert(name.clone(), value);
            resolved = true;
        }
        if resolved {
            let problems = inner.catalog.validate_params(id, &params);
            if !problems.is_empty() {
                let problem = CallProblem::InvalidParams { step: 0, tool_id: id.to_string(), problems };
                let obs = format!("{} (after resolving its URIs)", problem.observation());
                return Err(ToolResult::not_run(call_id, id, step, Outcome::InvalidParams, obs));
            }
            if let Some(obs) = inner.too_large(id, &params) {
                return Err(ToolResult::not_run(call_id, id, step, Outcome::InvalidParams, obs));
            }
        }
        Ok(params)
    }

    /// Runs one checked step (with retries): resolves its URIs, then runs
    /// the tool with `checked`'s parameters (the code, for ATTP).
    async fn run_step(
        &self,
        call: &ToolCall,
        i: usize,
        call_id: &str,
        checked: CheckedStep,
        cancel: &CancellationToken,
    ) -> ToolResult {
        let inner = &self.inner;
        let step = &call.steps[i];
        let id = step.tool_id.as_str();
        // ATTP code: handed to the `python` service (without one it runs
        // in spindle's sandbox, see `in_sandbox`).
        if self.is_attp_code(call, step)
            && let Some(f) = inner.services.get(PYTHON_TOOL).cloned()
        {
            // The names the code calls its tools by, for the host to bind.
            let mut params = checked.params;
            let table = inner.catalog.function_table().into_iter();
            let table = table.map(|(name, tool)| (name, Value::String(tool.to_string())));
            params.entry("functions").or_insert_with(|| Value::Object(table.collect()));
            return self
                .attempts(call, call_id, step.index, id, Kind::Service, params, step.retry, cancel, move |p| {
                    let f = f.clone();
                    Box::pin(async move { service_run(PYTHON_TOOL, f(p).await) })
                })
                .await;
        }
        let Some(def) = inner.catalog.get(id).cloned() else {
            return ToolResult::not_run(
                call_id,
                id,
                step.index,
                Outcome::UnknownTool,
                observe::not_run(id, "unknown", ""),
            );
        };
        let kind = match implementation_type(&def) {
            Some("script") => Kind::Script,
            Some("mcp") => Kind::Mcp,
            Some("service") | None if inner.services.contains_key(id) => Kind::Service,
            _ => Kind::Other,
        };
        if kind == Kind::Other {
            let ty = implementation_type(&def).unwrap_or("none");
            let detail =
                format!("it has no implementation spindle can run (implementation type {ty:?}, no service registered)");
            return ToolResult::not_run(
                call_id,
                id,
                step.index,
                Outcome::NotRun,
                observe::not_run(id, "no_runner", &detail),
            );
        }
        let params = match self.resolve_uris(call_id, step.index, id, checked, cancel).await {
            Ok(p) => p,
            Err(result) => return result,
        };
        let run_inner = inner.clone();
        let def2 = def.clone();
        let exec = move |p: Map<String, Value>| -> BoxFuture<'static, StepRun> {
            let inner = run_inner.clone();
            let def = def2.clone();
            Box::pin(async move { inner.execute(&def, kind, &p).await })
        };
        if is_async(&def) {
            let me = TaskCtx {
                inner: inner.clone(),
                call_id: call_id.to_string(),
                request_id: call.request_id.clone(),
                step: step.index,
                id: id.to_string(),
                kind,
                retry: step.retry,
            };
            let started = self.start_task(call_id, call.request_id.as_deref(), id, step.index, move |task_id| {
                Box::pin(async move {
                    let mut r = me.attempts(params, &CancellationToken::new(), exec).await;
                    r.task_id = Some(task_id);
                    if let Some(sink) = &me.inner.sink {
                        sink(ToolEvent::TaskDone(r.clone()));
                    }
                    r
                })
            });
            return match started {
                Ok(task_id) => {
                    let mut pending =
                        ToolResult::not_run(call_id, id, step.index, Outcome::Pending, observe::pending(id, &task_id));
                    pending.ok = true;
                    pending.result = serde_json::json!({"task_id": task_id});
                    pending.task_id = Some(task_id);
                    pending
                }
                Err(scope::NotStarted::Closed) => ToolResult::not_run(
                    call_id,
                    id,
                    step.index,
                    Outcome::NotRun,
                    observe::not_run(id, "run_ended", "the run that made this call has ended"),
                ),
            };
        }
        self.attempts(call, call_id, step.index, id, kind, params, step.retry, cancel, exec).await
    }

    #[allow(clippy::too_many_arguments)]
    async fn attempts(
        &self,
        call: &ToolCall,
        call_id: &str,
        step: Option<u64>,
        id: &str,
        kind: Kind,
        params: Map<String, Value>,
        retry: u32,
        cancel: &CancellationToken,
        exec: impl Fn(Map<String, Value>) -> BoxFuture<'static, StepRun>,
    ) -> ToolResult {
        let ctx = TaskCtx {
            inner: self.inner.clone(),
            call_id: call_id.into(),
            request_id: call.request_id.clone(),
            step,
            id: id.into(),
            kind,
            retry,
        };
        ctx.attempts(params, cancel, exec).await
    }
}

/// What a retrying run needs, owned (async tasks outlive the call, not their scope).
struct TaskCtx {
    inner: Arc<Inner>,
    call_id: String,
    request_id: Option<String>,
    step: Option<u64>,
    id: String,
    kind: Kind,
    retry: u32,
}

impl TaskCtx {
    async fn attempts(
        &self,
        params: Map<String, Value>,
        cancel: &CancellationToken,
        exec: impl Fn(Map<String, Value>) -> BoxFuture<'static, StepRun>,
    ) -> ToolResult {
        let started = Instant::now();
        let started_at_ms =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default();
        let max = 1 + self.retry.min(self.inner.options.max_retry);
        let mut attempts = 0;
        let mut bytes = 0;
        let run = loop {
            attempts += 1;
            let r = tokio::select! {
                r = exec(params.clone()) => r,
                () = cancel.cancelled() => StepRun::fail(Outcome::Cancelled, observe::cancelled(&self.id), Value::Null, 0),
            };
            bytes += r.bytes;
            if r.outcome.is_ok() || !r.outcome.retryable() || attempts >= max {
                break r;
            }
        };
        let mut observation = run.observation;
        if attempts > 1 && !run.outcome.is_ok() {
            observation.push_str(&format!(" (after {attempts} attempts)"));
        }
        let result = ToolResult {
            call_id: self.call_id.clone(),
            tool_id: self.id.clone(),
            step: self.step,
            ok: run.outcome.is_ok(),
            outcome: run.outcome,
            observation,
            result: run.result,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            bytes,
            attempts,
            task_id: None,
            truncated: run.truncated,
            request_id: self.request_id.clone(),
            repeat_of: None,
        };
        self.inner.audit_run(&result, self.kind, Value::Object(params), started_at_ms);
        result
    }
}

impl Inner {
    /// The observation refusing parameters past
    /// [`RunnerOptions::max_params_bytes`], if they are.
    fn too_large(&self, id: &str, params: &Map<String, Value>) -> Option<String> {
        let size = serde_json::to_string(params).map(|s| s.len()).unwrap_or(0);
        (size > self.options.max_params_bytes).then(|| {
            format!(
                "Observation: Error - Invalid parameters for {id}: the parameters are {size} bytes, more than the {}-byte limit",
                self.options.max_params_bytes
            )
        })
    }

    /// The audit record of a run (spec 002 §13).
    fn audit_run(&self, r: &ToolResult, kind: Kind, params: Value, started_at_ms: u64) {
        if let Some(sink) = &self.sink {
            sink(ToolEvent::Audit(ToolAudit {
                call_id: r.call_id.clone(),
                tool_id: r.tool_id.clone(),
                step: r.step,
                implementation: kind.as_str().into(),
                params,
                outcome: r.outcome,
                duration_ms: r.duration_ms,
                bytes: r.bytes,
                attempts: r.attempts,
                started_at_ms,
                request_id: r.request_id.clone(),
            }));
        }
    }

    fn audit_not_run(&self, r: &ToolResult, params: &Value) {
        if let Some(sink) = &self.sink {
            sink(ToolEvent::Audit(ToolAudit {
                call_id: r.call_id.clone(),
                tool_id: r.tool_id.clone(),
                step: r.step,
                implementation: Kind::Other.as_str().into(),
                params: params.clone(),
                outcome: r.outcome,
                duration_ms: 0,
                bytes: 0,
                attempts: 0,
                started_at_ms: SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or_default(),
                request_id: r.request_id.clone(),
            }));
        }
    }

    /// One attempt of a checked step.
    async fn execute(&self, def: &ToolDef, kind: Kind, params: &Map<String, Value>) -> StepRun {
        let id = def.id.as_str();
        match kind {
            Kind::Script => {
                let spec = match script::ScriptSpec::from_def(def) {
                    Ok(s) => s,
                    Err(why) => {
                        return StepRun::fail(
                            Outcome::Failed,
                            observe::failure(id, "misconfigured", &why),
                            Value::Null,
                            0,
                        );
                    }
                };
                let dir = self
                    .dirs
                    .get(id)
                    .cloned()
                    .or_else(|| def.source.as_ref().and_then(|s| s.parent()).map(Path::to_path_buf));
                let dir = dir.unwrap_or_else(|| PathBuf::from("."));
                let env = self.config.env_for(def);
                script::run(def, &spec, &dir, params, &env, &self.options).await
            }
            Kind::Mcp => match &self.mcp {
                Some(pool) => pool.call(def, params, &self.options).await,
                None => StepRun::fail(
                    Outcome::Failed,
                    observe::failure(id, "no MCP server", "the runner was started without its MCP servers"),
                    Value::Null,
                    0,
                ),
            },
            Kind::Service => match self.services.get(id).cloned() {
                Some(f) => {
                    let timeout = def
                        .implementation
                        .as_ref()
                        .and_then(|i| i.get("timeout"))
                        .and_then(Value::as_u64)
                        .map_or(self.options.default_timeout, Duration::from_millis);
                    match tokio::time::timeout(timeout, f(params.clone())).await {
                        Ok(r) => {
                            let mut run = service_run(id, r);
                            if run.outcome == Outcome::Success {
                                run.observation = observe::success(id, &run.result, self.options.max_observation);
                            }
                            run
                        }
                        Err(_) => StepRun::fail(
                            Outcome::Timeout,
                            observe::timeout(id, u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
                            Value::Null,
                            0,
                        ),
                    }
                }
                None => StepRun::fail(Outcome::Failed, observe::failure(id, "no service", ""), Value::Null, 0),
            },
            // (ATTP code never comes here: `run_attp` runs it.)
            Kind::Sandbox | Kind::Other => {
                StepRun::fail(Outcome::NotRun, observe::not_run(id, "no_runner", ""), Value::Null, 0)
            }
        }
    }
}

/// A service's answer as a step run.
fn service_run(id: &str, r: Result<Value, String>) -> StepRun {
    match r {
        Ok(v) => {
            let bytes = observe::result_text(&v).len() as u64;
            StepRun::ok(observe::success(id, &v, usize::MAX), v, bytes)
        }
        Err(e) => StepRun::fail(Outcome::Failed, observe::failure(id, "service error", &e), Value::Null, 0),
    }
}
