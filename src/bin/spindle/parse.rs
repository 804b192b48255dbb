//! `spindle parse`: one response in, events out.

use crate::render::{Format, Renderer};
use anyhow::{Context, Result, bail};
use spindle::{Parser, ParserOptions, Registry};
use std::io::Read;
use std::path::PathBuf;
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
}

/// Resolves `--profile` / `--registry` into a registry.
pub(crate) fn load_registry(profile: &str, file: Option<&PathBuf>) -> Result<Registry> {
    if let Some(path) = file {
        return Registry::load(path).with_context(|| format!("registry {}", path.display()));
    }
    match Registry::profile(profile) {
        Some(r) => Ok(r),
        None => bail!(
            "unknown profile {profile:?} (known: {})",
            Registry::profile_names().join(", ")
        ),
    }
}

pub(crate) fn run(args: ParseArgs) -> Result<ExitCode> {
    let registry = Arc::new(load_registry(&args.profile, args.registry.as_ref())?);
    if args.chunk_size == Some(0) {
        bail!("--chunk-size must be at least 1");
    }
    let mut options = ParserOptions {
        rewrite: args.format == Format::Rewrite,
        ..ParserOptions::default()
    };
    if let Some(n) = args.max_element {
        options.machine.max_element_len = n;
    }
    if let Some(n) = args.max_marker {
        options.scan.max_marker_len = n;
    }
    let mut parser = Parser::with_options(registry.clone(), options);
    let mut renderer = Renderer::new(args.format, &registry);
    let started = Instant::now();
    let mut events = Vec::new();
    let mut feed = |bytes: &[u8], parser: &mut Parser, renderer: &mut Renderer| -> Result<()> {
        events.clear();
        parser.feed_into(bytes, &mut events);
        renderer.events(&events)?;
        renderer.rewrite(&parser.take_rewrite())?;
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
    renderer.finish(bytes, started.elapsed())?;
    Ok(ExitCode::SUCCESS)
}
