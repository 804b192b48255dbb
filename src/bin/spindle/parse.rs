//! `spindle parse`: one response in, events out.

use crate::render::{Format, Renderer};
use anyhow::{Context, Result, bail};
use spindle::calls::{ToolCall, ToolCatalog};
use spindle::event::Event;
use spindle::registry::BodyKind;
use spindle::{Parser, ParserOptions, Registry, state};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// Arguments of `spindle parse`.
#[derive(Debug, clap::Args)]
pub(crate) struct ParseArgs {
    /// The response to parse; `-` or nothing reads stdin.
    pub(crate) file: Option<PathBuf>,
    /// A built-in registry profile (filament, reasoning, ...).
    #[arg(long, conflicts_with = "registry", default_value = "filament")]
    pub(crate) profile: String,
    /// A registry file (TOML, or JSON by extension) instead of a profile.
    #[arg(long)]
    pub(crate) registry: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub(crate) format: Format,
    /// Feed the parser N bytes at a time (default: the whole input at once,
    /// or as stdin delivers it).
    #[arg(long, value_name = "N")]
    pub(crate) chunk_size: Option<usize>,
    /// Largest element text kept in an element event, in bytes.
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_element: Option<usize>,
    /// Longest tag or special marker, in bytes.
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_marker: Option<usize>,
    /// Check every completed tool call (TAM, ACTION, ATTP) against the tools
    /// of a plugins directory (plugin.yaml + *.tool.json); for each invalid
    /// call, its observation text goes to stderr, one line each (stdout
    /// keeps the chosen format).
    #[arg(long, value_name = "DIR")]
    pub(crate) tools: Option<PathBuf>,
    /// Apply every variable_update of the response to the JSON state in
    /// FILE (created when missing) and write it back atomically; what each
    /// op did is printed to stderr.
    #[arg(long, value_name = "FILE")]
    pub(crate) state: Option<PathBuf>,
}

/// Prints the observation text of every invalid tool call among `events`.
fn check_calls(catalog: &ToolCatalog, registry: &Registry, events: &[spindle::Event]) {
    for el in events.iter().filter_map(spindle::Event::as_element) {
        let is_call = registry
            .lookup(el.tag.as_bytes())
            .is_some_and(|id| matches!(registry.tag(id).body, BodyKind::Tam | BodyKind::Action | BodyKind::Attp));
        if let (true, Ok(call)) = (is_call, ToolCall::from_payload(&el.payload)) {
            for obs in catalog.observations(&call) {
                eprintln!("{obs}");
            }
        }
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
    if let Some(n) = args.max_element {
        options.machine.max_element_len = n;
    }
    if let Some(n) = args.max_marker {
        options.scan.max_marker_len = n;
    }
    let catalog = match &args.tools {
        Some(dir) => Some(ToolCatalog::load_plugins(dir).with_context(|| format!("tools {}", dir.display()))?),
        None => None,
    };
    let mut state_file = args.state.as_deref().map(StateFile::load).transpose()?;
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut renderer = Renderer::new(args.format, &registry);
    let started = Instant::now();
    let mut events = Vec::new();
    let mut feed = |bytes: &[u8], parser: &mut Parser, renderer: &mut Renderer| -> Result<()> {
        events.clear();
        parser.feed_into(bytes, &mut events);
        renderer.events(&events)?;
        if let Some(st) = &mut state_file {
            st.apply(&events);
        }
        renderer.rewrite(&parser.take_rewrite())?;
        if let Some(catalog) = &catalog {
            check_calls(catalog, &registry, &events);
        }
        Ok(())
    };
    match args.file.as_ref().filter(|p| p.as_os_str() != "-") {
        Some(path) => {
            let input = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            let size = args.chunk_size.unwrap_or(input.len().max(1));
            for chunk in input.chunks(size) {
                feed(chunk, &mut parser, &mut renderer)?;
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
            }
        }
    }
    let bytes = parser.offset();
    let (last, rest) = parser.finish_with_rewrite();
    renderer.events(&last)?;
    renderer.rewrite(&rest)?;
    if let Some(catalog) = &catalog {
        check_calls(catalog, &registry, &last);
    }
    renderer.finish(bytes, started.elapsed())?;
    if let Some(mut st) = state_file {
        st.apply(&last);
        st.save()?;
    }
    Ok(ExitCode::SUCCESS)
}
