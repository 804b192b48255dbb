//! `spindle parse`: one response in, events out.

use crate::render::{Format, Renderer};
use anyhow::{Context, Result, bail};
use spindle::event::{DiagnosticCode, Event};
use spindle::sources::{ChatStream, FinishReason, Framing, LineTap, SourceEvent, StreamOptions, StreamTap, transcript};
use spindle::tools::collect::CallCollector;
use spindle::tools::{McpPool, RunScope, Runner, RunnerOptions, ToolConfig, ToolEvent};
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
/// `--code-markup`: see [`spindle::CodeMarkup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CodeMarkupArg {
    /// `<` written back where it is inert as HTML, `&lt;` where it could
    /// act (safe without a Markdown renderer too)
    Inert,
    /// Code exactly as the model wrote it (for a front end that renders
    /// content with a CommonMark renderer, which shows code as text)
    AsWritten,
}

impl From<CodeMarkupArg> for spindle::CodeMarkup {
    fn from(arg: CodeMarkupArg) -> Self {
        match arg {
            CodeMarkupArg::Inert => spindle::CodeMarkup::Inert,
            CodeMarkupArg::AsWritten => spindle::CodeMarkup::AsWritten,
        }
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// The response to parse; `-` or nothing reads stdin.
    pub(crate) file: Option<PathBuf>,
    /// A built-in registry profile [default: filament; `chat` for a
    /// response read with `--input sse|ndjson|json`, as the proxy and `replay`
    /// read one].
    #[arg(long, conflicts_with = "registry", value_parser = crate::cli::profile_arg(&[]))]
    pub(crate) profile: Option<String>,
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
    #[arg(long, value_name = "BYTES", default_value_t = spindle::ScanLimits::default().max_marker_len,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub(crate) max_marker: usize,
    /// What markup inside Markdown code becomes in content's filtered HTML
    /// (its `payload.html` and deltas).
    #[arg(long, value_enum, default_value_t = CodeMarkupArg::Inert)]
    pub(crate) code_markup: CodeMarkupArg,
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
    /// The PATH the tools (scripts, MCP servers) see and their bare
    /// program names are looked up in [default: the PATH spindle was
    /// started with, else /usr/local/bin:/usr/bin:/bin]. The rest of the
    /// environment is not passed on (see --tool-env).
    #[arg(long, value_name = "PATH", requires = "tools")]
    pub(crate) tool_path: Option<String>,
    /// More environment for the tools: NAME passes spindle's value on,
    /// NAME=VALUE sets one (repeatable; none by default: a tool sees only
    /// PATH and LANG of it).
    #[arg(long, value_name = "NAME[=VALUE]", requires = "tools")]
    pub(crate) tool_env: Vec<String>,
    /// Apply every variable_update of the response to the JSON state in
    /// FILE (created when missing) and write it back atomically; what each
    /// op did is printed to stderr.
    #[arg(long, value_name = "FILE")]
    pub(crate) state: Option<PathBuf>,
    /// What the input is: model text, or a chat-completions response as an
    /// API sends it (a streamed SSE body, JSON lines, a whole JSON
    /// response), whose choices are parsed as the proxy parses them.
    #[arg(long, value_enum, default_value_t = Input::Auto)]
    pub(crate) input: Input,
    /// With `--input sse|ndjson|json`: the choice whose parse `pretty`, `summary`,
    /// `rewrite`, `--tools` and `--state` use (`jsonl` prints every
    /// choice's events, each with its `choice`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) choice: u32,
    /// Largest whole response (`--input json`, read to its end before it is
    /// parsed), and longest line of `--input ndjson` or line and event of
    /// `--input sse` (a longer one is skipped and said), in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 256 * 1024 * 1024)]
    pub(crate) max_response: usize,
}

/// The tools of `--tools`: the calls are checked (observations of invalid
/// ones to stderr) or, with `--execute`, run.
struct Calls {
    collector: CallCollector,
    /// The parse is one run: its async tasks are waited for at the end.
    run: RunScope,
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
            path: args.tool_path.clone().unwrap_or_else(RunnerOptions::inherited_path),
            env: args.tool_env.clone(),
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
        let run = runner.scope();
        Ok(Calls { collector: CallCollector::new(registry), run, rt, execute: args.execute, records, _pool: pool })
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
                for obs in self.run.catalog().observations(&call) {
                    eprintln!("{obs}");
                }
                continue;
            }
            let results = self.rt.block_on(self.run.run_call(&call, &id, &CancellationToken::new()));
            self.flush_records(renderer)?;
            for r in &results {
                renderer.tool_line(&r.to_event_json("tool_result"))?;
            }
        }
        Ok(())
    }

    /// Waits for async tasks and prints their records.
    fn finish(&mut self, renderer: &mut Renderer) -> Result<()> {
        self.rt.block_on(self.run.wait_tasks());
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

/// Most bytes `--input auto` reads before it decides (only comments and
/// blank lines so far): then it reads text.
const DECIDE: usize = 64 * 1024;

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

/// What `parse` reads. `curl -N` of a streaming endpoint prints SSE, not
/// model text: `auto` sees that and reads the stream the way the proxy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Input {
    /// `sse` when the first line (after SSE comments) is an SSE field
    /// (`data:`, `event:`, `id:`, `retry:`), `ndjson` when it is a JSON
    /// chunk of an API (or the file is `.ndjson`/`.jsonl`), `json` for a
    /// `.json` file, else `text`.
    Auto,
    /// Model output as it is.
    Text,
    /// A streamed response body (SSE), as `curl -N` prints it: chat
    /// completions (or Anthropic Messages, Responses, Gemini); each choice's
    /// content, reasoning and tool calls parsed, with the stream's finish
    /// reasons, usage and truncation.
    Sse,
    /// A whole (non-streamed) response, JSON: a chat completion (or an
    /// Anthropic message, a Responses object, a Gemini or Bedrock
    /// response).
    Json,
    /// A stream of one JSON chunk per line (`application/x-ndjson`), as
    /// Ollama's own API sends it (`/api/chat`, `/api/generate`); also a
    /// whole response on one line.
    Ndjson,
}

impl Input {
    /// The input kind `auto` stands for, judged by the file's name and the
    /// first bytes read (`ended`: they are all there is); `None` while
    /// those bytes cannot tell yet (a live stream's first read may hold
    /// only a comment, `: PROCESSING`, or part of a field name).
    fn resolve(self, file: Option<&Path>, first: &[u8], ended: bool) -> Option<Input> {
        const FIELDS: [&[u8]; 4] = [b"data:", b"event:", b"id:", b"retry:"];
        if self != Input::Auto {
            return Some(self);
        }
        let by_name = file.and_then(Path::extension).and_then(|ext| {
            let ext = ext.to_string_lossy().to_ascii_lowercase();
            match ext.as_str() {
                "json" => Some(Input::Json),
                "ndjson" | "jsonl" => Some(Input::Ndjson),
                _ => None,
            }
        });
        let not_sse = || by_name.unwrap_or(Input::Text);
        let first = first.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(first);
        let mut lines = first.split(|&b| b == b'\n').peekable();
        while let Some(line) = lines.next() {
            // The last piece has no newline after it yet: more may follow.
            let whole = lines.peek().is_some() || ended;
            let line = line.trim_ascii();
            if line.is_empty() || (line.starts_with(b":") && whole) {
                continue; // blank, or an SSE comment (`: ping`)
            }
            if FIELDS.iter().any(|field| line.starts_with(field)) {
                return Some(Input::Sse);
            }
            if by_name.is_none() && line.starts_with(b"{") {
                // One JSON chunk per line, once the line is whole.
                return match (whole, transcript::is_chunk_line(line)) {
                    (_, true) => Some(Input::Ndjson),
                    (true, false) => Some(Input::Text),
                    (false, false) => None,
                };
            }
            // `da`, or `:` so far: the rest of the line decides.
            let open = line.starts_with(b":") || FIELDS.iter().any(|field| field.starts_with(line));
            return if whole || !open { Some(not_sse()) } else { None };
        }
        // Only blank lines and comments so far; text that merely starts
        // like a comment (`:)`) has a line of its own after it.
        ended.then(not_sse)
    }

    /// Whether the input is a response as an API sends it.
    fn is_response(self) -> bool {
        matches!(self, Input::Sse | Input::Json | Input::Ndjson)
    }
}

/// Where a choice's events go: the renderer, `--state`, `--tools`.
struct Out {
    renderer: Renderer,
    state: Option<StateFile>,
    calls: Option<Calls>,
    /// The choices a response has shown so far.
    choices: std::collections::BTreeSet<u32>,
}

impl Out {
    fn events(&mut self, events: &[Event]) -> Result<()> {
        self.renderer.events(events)?;
        self.handle(events)
    }

    /// `--state` and `--tools` on a choice's events.
    fn handle(&mut self, events: &[Event]) -> Result<()> {
        if let Some(st) = &mut self.state {
            st.apply(events);
        }
        if let Some(calls) = &mut self.calls {
            // What the model said before a tool runs is out before it runs.
            self.renderer.flush()?;
            calls.handle(events, &mut self.renderer)?;
        }
        Ok(())
    }

    /// A stream's events: every one as a JSON line (`jsonl`), the shown
    /// choice's parse for the rest; trouble with the stream on stderr.
    fn source_events(&mut self, events: Vec<SourceEvent>, choice: u32) -> Result<()> {
        let mut shown = Vec::new();
        for event in events {
            if self.renderer.format() == Format::Jsonl {
                self.renderer.source_line(&event)?;
            } else {
                report_stream(&event);
            }
            if let SourceEvent::Choice(c) = event {
                self.choices.insert(c.choice);
                if c.choice == choice {
                    shown.push(c.event);
                }
            }
        }
        if self.renderer.format() == Format::Jsonl {
            // The lines are out already; `--state` and `--tools` still
            // want the events.
            self.handle(&shown)
        } else {
            self.events(&shown)
        }
    }
}

/// A line on stderr for what a stream says beyond a choice's parse (not
/// in `jsonl`, which prints every event).
fn report_stream(event: &SourceEvent) {
    match event {
        // A choice that stopped early; the other reasons are normal ends.
        SourceEvent::Finish { choice, reason }
            if matches!(reason, FinishReason::Length | FinishReason::ContentFilter) =>
        {
            eprintln!("spindle: choice {choice} finished: {}", reason.as_str());
        }
        SourceEvent::Truncated { choice, why } => match choice {
            Some(c) => eprintln!("spindle: choice {c} was cut off: {}", why.as_str()),
            None => eprintln!("spindle: the stream was cut off: {}", why.as_str()),
        },
        SourceEvent::StreamError { error, .. } => eprintln!("spindle: the stream reported an error: {error}"),
        SourceEvent::Diagnostic(d) => eprintln!("spindle: stream: {}", d.message),
        _ => {}
    }
}

/// How the input is read: one parser over text, or the stream model over
/// a response.
enum Reader {
    Text(Box<Parser>),
    Sse {
        tap: Box<StreamTap>,
        choice: u32,
    },
    /// One JSON chunk per line, each read as its line ends.
    Lines {
        tap: Box<LineTap>,
        choice: u32,
    },
    /// A whole response: read to the end, then parsed.
    Json {
        body: Vec<u8>,
        /// `--max-response`.
        limit: usize,
        options: Box<StreamOptions>,
        choice: u32,
    },
}

impl Reader {
    fn new(input: Input, registry: Arc<Registry>, parser: ParserOptions, args: &ParseArgs) -> Reader {
        let choice = args.choice;
        let options = || {
            let mut options = StreamOptions::with_registry((*registry).clone());
            options.parser = parser;
            options
        };
        match input {
            Input::Sse => {
                let mut options = options();
                options.sse.max_line_len = args.max_response;
                options.sse.max_event_len = args.max_response;
                Reader::Sse { tap: Box::new(StreamTap::new(options)), choice }
            }
            Input::Json => {
                Reader::Json { body: Vec::new(), limit: args.max_response, options: Box::new(options()), choice }
            }
            Input::Ndjson => {
                let mut options = options();
                options.sse.max_line_len = args.max_response;
                Reader::Lines { tap: Box::new(LineTap::new(options)), choice }
            }
            Input::Auto | Input::Text => Reader::Text(Box::new(Parser::with_options(registry.clone(), parser))),
        }
    }

    fn feed(&mut self, bytes: &[u8], out: &mut Out) -> Result<()> {
        match self {
            Reader::Text(parser) => {
                // Events are rendered in batches as they become certain, so
                // a whole file fed at once is never held as a whole file's
                // events.
                parser.feed_with(bytes, |events| out.events(events))?;
                if out.renderer.wants_rewrite() {
                    out.renderer.rewrite(&parser.take_rewrite())?;
                }
            }
            Reader::Sse { tap, choice } => {
                let mut events = Vec::new();
                tap.feed_into(bytes, &mut events);
                out.source_events(events, *choice)?;
                if out.renderer.wants_rewrite() {
                    rewrite_choice(&mut out.renderer, tap.take_rewrites(), *choice)?;
                }
            }
            Reader::Lines { tap, choice } => {
                let mut events = Vec::new();
                tap.feed_into(bytes, &mut events);
                out.source_events(events, *choice)?;
                if out.renderer.wants_rewrite() {
                    rewrite_choice(&mut out.renderer, tap.take_rewrites(), *choice)?;
                }
            }
            Reader::Json { body, limit, .. } => {
                if body.len() + bytes.len() > *limit {
                    bail!("the response is larger than {limit} bytes (--max-response); --input sse or text streams it");
                }
                body.extend_from_slice(bytes);
            }
        }
        Ok(())
    }

    /// Ends the input; returns how many bytes were read.
    fn finish(self, out: &mut Out) -> Result<usize> {
        match self {
            Reader::Text(parser) => {
                let bytes = parser.offset();
                let (last, rest) = parser.finish_with_rewrite();
                out.events(&last)?;
                out.renderer.rewrite(&rest)?;
                Ok(bytes)
            }
            Reader::Sse { tap, choice } => {
                let bytes = tap.offset();
                let end = tap.finish_frames();
                out.source_events(end.events, choice)?;
                rewrite_choice(&mut out.renderer, end.rewrites, choice)?;
                Ok(bytes)
            }
            Reader::Lines { tap, choice } => {
                let bytes = tap.offset();
                let mut events = Vec::new();
                let rewrites = tap.finish_with_rewrites(&mut events);
                out.source_events(events, choice)?;
                rewrite_choice(&mut out.renderer, rewrites, choice)?;
                Ok(bytes)
            }
            Reader::Json { body, mut options, choice, .. } => {
                options.framing = Framing::Response;
                let mut stream = ChatStream::new(*options);
                let mut events = Vec::new();
                // A chat completion, or another API's response (Anthropic
                // Messages, Responses): what `replay` reads.
                stream.push_response(&body, &mut events);
                // A body that is not JSON at all is the wrong input, not a
                // response with a problem.
                if let Some(d) = events.iter().find_map(|e| match e {
                    SourceEvent::Diagnostic(d) if d.code == DiagnosticCode::InvalidResponseJson => Some(d),
                    _ => None,
                }) {
                    bail!(
                        "the input is not a JSON response (read as one: a .json file, or --input json); \
                         --input text reads it as model text: {}",
                        d.message
                    );
                }
                // JSON that no API's reader knows (a model's own JSON
                // answer saved as `answer.json`) is the wrong input too.
                let read = events.iter().any(|e| !matches!(e, SourceEvent::Diagnostic(_)));
                if !read && stream.stats().bad_chunks > 0 {
                    bail!(
                        "the input is JSON but not an API response (a chat completion, another API's response, \
                         or a JSON array of them); --input text reads it as model text"
                    );
                }
                let rewrites = stream.finish_with_rewrites(&mut events);
                out.source_events(events, choice)?;
                rewrite_choice(&mut out.renderer, rewrites, choice)?;
                Ok(body.len())
            }
        }
    }
}

/// The corrected text of the shown choice (`--format rewrite`).
fn rewrite_choice(renderer: &mut Renderer, rewrites: Vec<(u32, String)>, choice: u32) -> Result<()> {
    for (_, text) in rewrites.into_iter().filter(|(c, _)| *c == choice) {
        renderer.rewrite(text.as_bytes())?;
    }
    Ok(())
}

pub(crate) fn run(args: ParseArgs) -> Result<ExitCode> {
    // A registry named on the command line is checked before any input
    // is read; the default depends on what the input is.
    let named = match (&args.profile, &args.registry) {
        (None, None) => None,
        (profile, file) => Some(load_registry(profile.as_deref().unwrap_or("filament"), file.as_ref())?),
    };
    if args.chunk_size == Some(0) {
        bail!("--chunk-size must be at least 1");
    }
    let mut options = ParserOptions { rewrite: args.format == Format::Rewrite, ..ParserOptions::default() };
    options.machine.max_element_len = args.max_element;
    options.scan.max_marker_len = args.max_marker;
    options.html.code_markup = args.code_markup.into();
    let state = args.state.as_deref().map(StateFile::load).transpose()?;
    let started = Instant::now();
    let file = args.file.as_deref().filter(|p| p.as_os_str() != "-");
    let mut blocks = match file {
        // Read a block at a time, never the whole file: memory stays flat
        // whatever its size (and the corrected text goes out a block at a
        // time). A block holds whole chunks, so the parser sees exactly N
        // bytes at a time.
        Some(path) => Blocks::File {
            file: std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
            path,
            block: args.chunk_size.map_or(FILE_BLOCK, |n| n * (FILE_BLOCK / n).max(1)),
        },
        None => Blocks::Stdin(std::io::stdin().lock()),
    };
    let mut buf = Vec::new();
    // Enough of the input to tell what it is (a block, or a little more of
    // a live stream), at most `DECIDE` bytes.
    let mut more = blocks.next(&mut buf)?;
    let input = loop {
        if let Some(input) = args.input.resolve(file, &buf, !more) {
            break input;
        }
        if buf.len() >= DECIDE {
            break args.input.resolve(file, &buf, true).unwrap_or(Input::Text);
        }
        let mut next = Vec::new();
        more = blocks.next(&mut next)?;
        buf.extend_from_slice(&next);
    };
    let registry = Arc::new(match named {
        Some(registry) => registry,
        // A response as an API sends it is read as the proxy and `replay`
        // read one: the `chat` profile.
        None => load_registry(if input.is_response() { "chat" } else { "filament" }, None)?,
    });
    let calls = match &args.tools {
        Some(dir) => Some(Calls::new(&args, dir, registry.clone())?),
        None => None,
    };
    let mut out = Out { renderer: Renderer::new(args.format, &registry), state, calls, choices: Default::default() };
    let mut reader = Reader::new(input, registry, options, &args);
    // `buf` holds what was read; `more`: whether reading may go on.
    while !buf.is_empty() {
        for chunk in buf.chunks(args.chunk_size.unwrap_or(buf.len()).max(1)) {
            reader.feed(chunk, &mut out)?;
        }
        if matches!(blocks, Blocks::Stdin(_)) {
            // A live input: its events are out before the next read waits.
            out.renderer.flush()?;
        }
        if !more {
            break;
        }
        more = blocks.next(&mut buf)?;
    }
    let bytes = reader.finish(&mut out)?;
    if input.is_response()
        && args.format != Format::Jsonl
        && !out.choices.is_empty()
        && !out.choices.contains(&args.choice)
    {
        let seen: Vec<String> = out.choices.iter().map(u32::to_string).collect();
        bail!("the response has no choice {} (it has {}); see --choice", args.choice, seen.join(", "));
    }
    let Out { mut renderer, state, calls, .. } = out;
    if let Some(mut calls) = calls {
        calls.finish(&mut renderer)?;
    }
    renderer.finish(bytes, started.elapsed())?;
    if let Some(st) = state {
        st.save()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The input, a block at a time.
enum Blocks<'a> {
    File { file: std::fs::File, path: &'a Path, block: usize },
    Stdin(std::io::StdinLock<'static>),
}

impl Blocks<'_> {
    /// Reads the next block into `buf`; `false` at the end.
    fn next(&mut self, buf: &mut Vec<u8>) -> Result<bool> {
        buf.clear();
        match self {
            Blocks::File { file, path, block } => {
                file.take(*block as u64).read_to_end(buf).with_context(|| format!("cannot read {}", path.display()))?;
            }
            Blocks::Stdin(stdin) => {
                buf.resize(64 * 1024, 0);
                loop {
                    match stdin.read(buf) {
                        Ok(n) => {
                            buf.truncate(n);
                            break;
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e).context("cannot read stdin"),
                    }
                }
            }
        }
        Ok(!buf.is_empty())
    }
}
