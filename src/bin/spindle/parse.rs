//! `spindle parse`: one response in, events out.

use crate::render::{Format, Renderer};
use anyhow::{Context, Result, bail};
use spindle::event::Event;
use spindle::tools::collect::CallCollector;
use spindle::tools::{McpPool, Runner, RunnerOptions, ToolConfig, ToolEvent};
use spindle::{Parser, ParserOptions, Registry, state};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// Arguments of `spindle parse`.
#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// The response to parse; `-` or nothing reads stdin.
    pub(crate) file: Option<PathBuf>,
    /// A built-in registry profile.
    #[arg(long, conflicts_with = "registry", default_value = "filament", value_parser = crate::cli::profile_arg(&[]))]
    pub(crate) profile: String,
    /// A registry file (TOML, or JSON by extension) instead of a profile.
    #[arg(long, value_name = "FILE")]
    pub(crate) registry: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub(crate) format: Format,
    /// Feed the parser N bytes at a time (default: a file 64 KiB at a time,
    /// stdin as it delivers; the elements are the same at any size).
    #[arg(long, value_name = "N")]
    pub(crate) chunk_size: Option<usize>,
    /// Largest element text kept in an element event, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = spindle::MachineLimits::default().max_element_len)]
    pub(crate) max_element: usize,
    /// Longest tag or special marker, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = spindle::ScanLimits::default().max_marker_len)]
    pub(crate) max_marker: usize,
    /// Check every completed tool call (TAM, ACTION, ATTP) against the tools
    /// of a plugins directory (plugin.yaml + *.tool.json); for each invalid
    /// call, its observation text goes to stderr, one line each (stdout
    /// keeps the chosen format).
    #[arg(long, value_name = "DIR")]
    pub(crate) tools: Option<PathBuf>,
    /// Run every call found (with --tools) as its element completes and add
    /// one `tool_result` event per step (plus `tool_audit` records, and
    /// `tool_task` for async tools) to the output.
    #[arg(long, requires = "tools")]
    pub(crate) execute: bool,
    /// configSchema values for the tools (TOML, or JSON by extension):
    /// `[plugin-or-tool-id] key = "value"`.
    #[arg(long, value_name = "FILE", requires = "tools")]
    pub(crate) tool_config: Option<PathBuf>,
    /// Time limit of a tool run that sets no `timeout`, in ms.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub(crate) tool_timeout_ms: u64,
    /// Most bytes of output kept from a tool; past it the tool is stopped.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024)]
    pub(crate) max_tool_output: usize,
    /// Apply every variable_update of the response to the JSON state in
    /// FILE (created when missing) and write it back atomically; what each
    /// op did is printed to stderr.
    #[arg(long, value_name = "FILE")]
    pub(crate) state: Option<PathBuf>,
}

/// The tools of `--tools`: the calls are checked (observations of invalid
/// ones to stderr) or, with `--execute`, run.
struct Calls {
    collector: CallCollector,
    runner: Runner,
    rt: tokio::runtime::Runtime,
    execute: bool,
    /// Audit and task records sent by the runner, printed after each call.
    records: Arc<Mutex<Vec<serde_json::Value>>>,
    /// Kept alive while the MCP tools may run.
    _pool: Arc<McpPool>,
}

impl Calls {
    fn new(args: &ParseArgs, dir: &Path, registry: Arc<Registry>) -> Result<Calls> {
        let rt = crate::proxy::runtime()?;
        let options = RunnerOptions {
            default_timeout: Duration::from_millis(args.tool_timeout_ms),
            max_output: args.max_tool_output,
            ..RunnerOptions::default()
        };
        let (catalog, pool) = rt.block_on(crate::tools::load_tools(dir, &options))?;
        let pool = Arc::new(pool);
        let mut runner = Runner::with_options(catalog, options);
        runner.set_mcp(pool.clone());
        if let Some(file) = &args.tool_config {
            runner.set_config(ToolConfig::load(file).map_err(anyhow::Error::msg)?);
        }
        let records: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
        let sink = records.clone();
        runner.set_sink(Arc::new(move |e: ToolEvent| {
            if let Ok(mut list) = sink.lock() {
                list.push(e.to_event_json());
            }
        }));
        Ok(Calls { collector: CallCollector::new(registry), runner, rt, execute: args.execute, records, _pool: pool })
    }

    fn flush_records(&self, renderer: &mut Renderer) -> Result<()> {
        let records: Vec<serde_json::Value> = match self.records.lock() {
            Ok(mut list) => list.drain(..).collect(),
            Err(_) => Vec::new(),
        };
        for r in &records {
            renderer.tool_line(r)?;
        }
        Ok(())
    }

    /// Checks or runs the calls completed among `events`.
    fn handle(&mut self, events: &[Event], renderer: &mut Renderer) -> Result<()> {
        for event in events {
            let Some((id, call)) = self.collector.observe(event) else { continue };
            if !self.execute {
                for obs in self.runner.catalog().observations(&call) {
                    eprintln!("{obs}");
                }
                continue;
            }
            let results = self.rt.block_on(self.runner.run_call(&call, &id, &CancellationToken::new()));
            self.flush_records(renderer)?;
            for r in &results {
                renderer.tool_line(&r.to_event_json("tool_result"))?;
            }
        }
        Ok(())
    }

    /// Waits for async tasks and prints their records.
    fn finish(&mut self, renderer: &mut Renderer) -> Result<()> {
        self.rt.block_on(self.runner.wait_tasks());
        self.flush_records(renderer)
    }
}

/// The JSON state of `--state`, updated as variable_update elements
/// complete and written back once at the end.
struct StateFile {
    path: PathBuf,
    value: serde_json::Value,
    applied: usize,
    failed: usize,
}

impl StateFile {
    fn load(path: &Path) -> Result<StateFile> {
        let value = match std::fs::read_to_string(path) {
            Ok(text) if text.trim().is_empty() => serde_json::Value::Object(Default::default()),
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("state file {} is not valid JSON; it was left untouched", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                eprintln!("spindle: state: {} does not exist; starting from {{}}", path.display());
                serde_json::Value::Object(Default::default())
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read state file {}", path.display()));
            }
        };
        Ok(StateFile { path: path.to_path_buf(), value, applied: 0, failed: 0 })
    }

    /// Applies the ops of every completed variable_update in `events`.
    fn apply(&mut self, events: &[Event]) {
        for el in events.iter().filter_map(Event::as_element) {
            if &*el.tag != "variable_update" {
                continue;
            }
            let ops = state::ops_from_payload(&el.payload);
            for outcome in state::apply(&mut self.value, &ops) {
                if outcome.is_ok() {
                    self.applied += 1;
                } else {
                    self.failed += 1;
                }
                eprintln!("spindle: state: element {}: {outcome}", el.id);
            }
        }
    }

    fn save(self) -> Result<()> {
        if self.applied == 0 {
            eprintln!("spindle: state: no op applied ({} failed); {} left as it was", self.failed, self.path.display());
            return Ok(());
        }
        state::save_atomic(&self.path, &self.value)
            .with_context(|| format!("cannot write state file {}", self.path.display()))?;
        eprintln!(
            "spindle: state: wrote {} ({} op(s) applied, {} failed)",
            self.path.display(),
            self.applied,
            self.failed
        );
        Ok(())
    }
}

/// How much of a file `parse` reads and feeds at a time.
const FILE_BLOCK: usize = 64 * 1024;

/// Resolves `--profile` / `--registry` into a registry.
pub(crate) fn load_registry(profile: &str, file: Option<&PathBuf>) -> Result<Registry> {
    if let Some(path) = file {
        return Registry::load(path).with_context(|| format!("registry {}", path.display()));
    }
    match Registry::profile(profile) {
        Some(r) => Ok(r),
        None => bail!("unknown profile {profile:?} (known: {})", Registry::profile_names().join(", ")),
    }
}

pub(crate) fn run(args: ParseArgs) -> Result<ExitCode> {
    let registry = Arc::new(load_registry(&args.profile, args.registry.as_ref())?);
    if args.chunk_size == Some(0) {
        bail!("--chunk-size must be at least 1");
    }
    let mut options = ParserOptions { rewrite: args.format == Format::Rewrite, ..ParserOptions::default() };
    options.machine.max_element_len = args.max_element;
    options.scan.max_marker_len = args.max_marker;
    let mut calls = match &args.tools {
        Some(dir) => Some(Calls::new(&args, dir, registry.clone())?),
        None => None,
    };
    let mut state_file = args.state.as_deref().map(StateFile::load).transpose()?;
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut renderer = Renderer::new(args.format, &registry);
    let started = Instant::now();
    let mut feed = |bytes: &[u8], parser: &mut Parser, renderer: &mut Renderer| -> Result<()> {
        // Events are rendered in batches as they become certain, so a whole
        // file fed at once is never held as a whole file's events.
        parser.feed_with(bytes, |events| -> Result<()> {
            renderer.events(events)?;
            if let Some(st) = &mut state_file {
                st.apply(events);
            }
            if let Some(calls) = &mut calls {
                // What the model said before a tool runs is out before it runs.
                renderer.flush()?;
                calls.handle(events, renderer)?;
            }
            Ok(())
        })?;
        if renderer.wants_rewrite() {
            renderer.rewrite(&parser.take_rewrite())?;
        }
        Ok(())
    };
    match args.file.as_ref().filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            // Read a block at a time, never the whole file: memory stays
            // flat whatever its size (and the corrected text goes out a
            // block at a time). A block holds whole chunks, so the parser
            // sees exactly N bytes at a time.
            let mut file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
            let block = args.chunk_size.map_or(FILE_BLOCK, |n| n * (FILE_BLOCK / n).max(1));
            let mut buf = Vec::with_capacity(block);
            loop {
                buf.clear();
                let n = (&mut file)
                    .take(block as u64)
                    .read_to_end(&mut buf)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                for chunk in buf.chunks(args.chunk_size.unwrap_or(block)) {
                    feed(chunk, &mut parser, &mut renderer)?;
                }
                if n < block {
                    break;
                }
            }
        }
        None => {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e).context("cannot read stdin"),
                };
                let size = args.chunk_size.unwrap_or(n);
                for chunk in buf[..n].chunks(size) {
                    feed(chunk, &mut parser, &mut renderer)?;
                }
                // A live input: its events are out before the next read waits.
                renderer.flush()?;
            }
        }
    }
    let bytes = parser.offset();
    let (last, rest) = parser.finish_with_rewrite();
    renderer.events(&last)?;
    renderer.rewrite(&rest)?;
    if let Some(calls) = &mut calls {
        calls.handle(&last, &mut renderer)?;
        calls.finish(&mut renderer)?;
    }
    renderer.finish(bytes, started.elapsed())?;
    if let Some(mut st) = state_file {
        st.apply(&last);
        st.save()?;
    }
    Ok(ExitCode::SUCCESS)
}
