//! `spindle replay`: recorded transcripts (files or directories) through
//! the stream model, with a summary table or JSONL events, and optionally
//! the content check of [`spindle::sources::transcript`].

use crate::parse::load_registry;
use anyhow::Result;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use spindle::Registry;
use spindle::event::Event;
use spindle::sources::transcript::{self, CheckResult, Detection, ReplayOutcome, TranscriptKind};
use spindle::sources::{SourceEvent, StreamOptions};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Arguments of `spindle replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Transcript files or directories (searched recursively).
    #[arg(required = true)]
    pub(crate) paths: Vec<PathBuf>,
    /// The registry profile for content. `auto`: plain-text transcripts use
    /// the profile their file name starts with (`reasoning-x.txt`), else
    /// `filament`; chat-completion transcripts use `chat`.
    #[arg(long, conflicts_with = "registry", default_value = "auto", value_parser = crate::cli::profile_arg(&["auto"]))]
    pub(crate) profile: String,
    /// A registry file (TOML, or JSON by extension) instead of a profile.
    #[arg(long, value_name = "FILE")]
    pub(crate) registry: Option<PathBuf>,
    /// Output: a summary table, or one JSON event per line (with `source`).
    #[arg(long, value_enum, default_value_t = ReplayFormat::Summary)]
    pub(crate) format: ReplayFormat,
    /// Check every choice: its content elements must hold exactly the
    /// concatenated `delta.content` (read by an independent naive reader)
    /// whenever no repair dropped bytes; print every mismatch.
    #[arg(long)]
    pub(crate) check: bool,
    /// Never show the progress bar (it is hidden anyway when stderr is not
    /// a terminal).
    #[arg(long)]
    pub(crate) no_progress: bool,
    /// Feed SSE bodies N bytes at a time, as a slow socket would (the
    /// events must not change; for testing).
    #[arg(long, value_name = "N")]
    pub(crate) read_size: Option<usize>,
    /// Largest element text kept in an element event, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = spindle::MachineLimits::default().max_element_len)]
    pub(crate) max_element: usize,
}

/// How `spindle replay` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReplayFormat {
    /// Counts per file kind, event type, tag, repair and diagnostic.
    Summary,
    /// Every event as JSON with a `source` field (the summary goes to stderr).
    Jsonl,
}

/// Writes an event with the file it came from as one JSON line: the
/// event's object ([`SourceEvent::write_json`]) with a last field,
/// `source`, added (`tail`: `,"source":"…"}` and the newline). The bytes
/// are those of the event and a `source` field flattened by serde.
fn sourced_line(out: &mut (impl Write + ?Sized), line: &mut Vec<u8>, event: &SourceEvent, tail: &[u8]) -> Result<()> {
    line.clear();
    event.write_json(line);
    if line.last() == Some(&b'}') {
        line.pop();
    }
    line.extend_from_slice(tail);
    out.write_all(line)?;
    Ok(())
}

/// Everything counted over a run.
#[derive(Debug, Default)]
struct Totals {
    files: usize,
    kinds: BTreeMap<&'static str, usize>,
    skipped: BTreeMap<String, usize>,
    failed: Vec<(String, String)>,
    bytes: u64,
    replay_time: Duration,
    streams: usize,
    choices: usize,
    events: usize,
    event_types: BTreeMap<&'static str, usize>,
    elements: BTreeMap<String, usize>,
    repairs: BTreeMap<&'static str, usize>,
    diagnostics: BTreeMap<&'static str, usize>,
    done: usize,
    truncated: usize,
    truncated_why: BTreeMap<&'static str, usize>,
    errored: usize,
    finish: BTreeMap<String, usize>,
    check: BTreeMap<&'static str, usize>,
    check_skips: BTreeMap<String, usize>,
    mismatches: Vec<String>,
}

impl Totals {
    fn count_stream(&mut self, events: &[SourceEvent]) {
        self.streams += 1;
        self.events += events.len();
        let mut choices = std::collections::BTreeSet::new();
        let mut truncated = false;
        let mut errored = false;
        for e in events {
            *self.event_types.entry(e.type_name()).or_default() += 1;
            if let Some(c) = e.choice() {
                choices.insert(c);
            }
            match e {
                SourceEvent::Choice(c) => match &c.event {
                    Event::Element(el) => *self.elements.entry(el.tag.to_string()).or_default() += 1,
                    Event::Repair(r) => *self.repairs.entry(r.kind.as_str()).or_default() += 1,
                    Event::Diagnostic(d) => *self.diagnostics.entry(d.code.as_str()).or_default() += 1,
                    _ => {}
                },
                SourceEvent::Diagnostic(d) => *self.diagnostics.entry(d.code.as_str()).or_default() += 1,
                SourceEvent::Truncated { why, .. } => {
                    if !truncated {
                        *self.truncated_why.entry(why.as_str()).or_default() += 1;
                    }
                    truncated = true;
                }
                SourceEvent::StreamError { .. } => errored = true,
                SourceEvent::Done => self.done += 1,
                SourceEvent::Finish { reason, .. } => *self.finish.entry(reason.as_str().to_string()).or_default() += 1,
                _ => {}
            }
        }
        self.choices += choices.len();
        self.truncated += usize::from(truncated);
        self.errored += usize::from(errored);
    }
}

/// Files under `path`, recursively, in a stable order.
fn collect(path: &Path, out: &mut Vec<PathBuf>, failed: &mut Vec<(String, String)>) {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            failed.push((path.display().to_string(), format!("cannot read: {e}")));
            return;
        }
    };
    if meta.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    if !meta.is_dir() {
        failed.push((path.display().to_string(), "not a file or directory".into()));
        return;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            failed.push((path.display().to_string(), format!("cannot list: {e}")));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        // Directories found by walking: skip hidden ones (.git), never
        // follow symlinked directories (loops).
        let hidden = child.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
        let link = std::fs::symlink_metadata(&child).is_ok_and(|m| m.file_type().is_symlink());
        if child.is_dir() && (hidden || link) {
            continue;
        }
        collect(&child, out, failed);
    }
}

pub(crate) fn run(args: ReplayArgs) -> Result<ExitCode> {
    run_inner(args)
}

/// The stream options each file is replayed with: one fixed registry
/// (`--registry`, or a named `--profile`), or, with `--profile auto`, a
/// profile per file (built once per profile).
struct Profiles {
    fixed: Option<Arc<StreamOptions>>,
    by_name: std::collections::HashMap<&'static str, Arc<StreamOptions>>,
    max_element: usize,
}

impl Profiles {
    fn new(args: &ReplayArgs) -> Result<Profiles> {
        let mut profiles = Profiles { fixed: None, by_name: Default::default(), max_element: args.max_element };
        if args.registry.is_some() || args.profile != "auto" {
            let registry = load_registry(&args.profile, args.registry.as_ref())?;
            profiles.fixed = Some(profiles.options(registry));
        }
        Ok(profiles)
    }

    fn options(&self, registry: Registry) -> Arc<StreamOptions> {
        let mut options = StreamOptions::with_registry(registry);
        options.parser.machine.max_element_len = self.max_element;
        Arc::new(options)
    }

    fn for_file(&mut self, file: &Path, kind: TranscriptKind) -> Result<Arc<StreamOptions>> {
        if let Some(fixed) = &self.fixed {
            return Ok(fixed.clone());
        }
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let profile = match kind {
            TranscriptKind::Text => Registry::profile_for_file_name(&name).unwrap_or("filament"),
            _ => "chat",
        };
        if let Some(o) = self.by_name.get(profile) {
            return Ok(o.clone());
        }
        let registry = load_registry(profile, None)?;
        let options = self.options(registry);
        self.by_name.insert(profile, options.clone());
        Ok(options)
    }
}

fn run_inner(args: ReplayArgs) -> Result<ExitCode> {
    if args.read_size == Some(0) {
        anyhow::bail!("--read-size must be at least 1");
    }
    let mut profiles = Profiles::new(&args)?;
    let mut totals = Totals::default();
    let mut files = Vec::new();
    let mut bad_paths = 0;
    for path in &args.paths {
        if path.as_os_str() == "-" {
            files.push(path.clone());
            continue;
        }
        let before = totals.failed.len();
        collect(path, &mut files, &mut totals.failed);
        for (name, why) in &totals.failed[before..] {
            // Like `parse` (and ripgrep): one line per path that cannot be
            // read, on stderr.
            eprintln!("spindle: error: {name}: {why}");
            bad_paths += 1;
        }
    }
    if files.is_empty() && bad_paths > 0 {
        // Nothing could be read: no summary of nothing.
        return Ok(ExitCode::from(2));
    }
    let bar = if args.no_progress || !std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(files.len() as u64), ProgressDrawTarget::hidden())
    } else {
        let bar = ProgressBar::new(files.len() as u64);
        let style = ProgressStyle::with_template("{bar:40} {pos}/{len} files  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(crate::render::OUT_BUFFER, stdout.lock());
    let started = Instant::now();
    for file in &files {
        let name = file.display().to_string();
        bar.set_message(file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        replay_file(file, &name, &mut profiles, &args, &mut totals, &mut out)?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let wall = started.elapsed();
    out.flush()?;
    drop(out);
    let failed = !totals.failed.is_empty() || !totals.mismatches.is_empty();
    match args.format {
        ReplayFormat::Summary => print_summary(&mut std::io::stdout().lock(), &totals, wall, args.check)?,
        ReplayFormat::Jsonl => print_summary(&mut std::io::stderr().lock(), &totals, wall, args.check)?,
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Replays one file; every failure is recorded in `totals`, never returned
/// (only writing the output can fail the run).
fn replay_file(
    file: &Path,
    name: &str,
    profiles: &mut Profiles,
    args: &ReplayArgs,
    totals: &mut Totals,
    out: &mut impl Write,
) -> Result<()> {
    let read = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut buf).map(|_| buf)
    } else {
        std::fs::read(file)
    };
    let bytes = match read {
        Ok(b) => b,
        Err(e) => {
            totals.failed.push((name.to_string(), format!("cannot read: {e}")));
            return Ok(());
        }
    };
    let kind = match transcript::detect(file, &bytes) {
        Detection::Replay(kind) => kind,
        Detection::Skip(why) => {
            *totals.skipped.entry(why).or_default() += 1;
            return Ok(());
        }
    };
    let options = profiles.for_file(file, kind)?;
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
        transcript::replay_in_reads(kind, &bytes, &options, args.read_size.unwrap_or(usize::MAX))
    }));
    totals.replay_time += started.elapsed();
    let streams = match outcome {
        Ok(ReplayOutcome::Streams(streams)) => streams,
        Ok(ReplayOutcome::Skip(why)) => {
            *totals.skipped.entry(why).or_default() += 1;
            return Ok(());
        }
        Err(_) => {
            totals
                .failed
                .push((name.to_string(), "internal error: the replay panicked (a bug; please report it)".into()));
            return Ok(());
        }
    };
    totals.files += 1;
    totals.bytes += bytes.len() as u64;
    *totals.kinds.entry(kind.as_str()).or_default() += 1;
    let mut line = Vec::new();
    for stream in &streams {
        totals.count_stream(&stream.events);
        if args.format == ReplayFormat::Jsonl {
            let source = match &stream.label {
                Some(label) => format!("{name}#{label}"),
                None => name.to_string(),
            };
            // `,"source":"…"}`, escaped once for the stream.
            let mut tail = b",\"source\":".to_vec();
            serde_json::to_writer(&mut tail, &source)?;
            tail.extend_from_slice(b"}\n");
            for event in &stream.events {
                sourced_line(out, &mut line, event, &tail)?;
            }
        }
    }
    if args.check {
        check_file(kind, &bytes, &streams, name, totals);
    }
    Ok(())
}

fn check_file(kind: TranscriptKind, bytes: &[u8], streams: &[transcript::Replayed], name: &str, totals: &mut Totals) {
    for check in transcript::check_content(kind, bytes, streams) {
        let key = match &check.result {
            CheckResult::Equal => "equal",
            CheckResult::Tiled => "tiled",
            CheckResult::Skipped(why) => {
                *totals.check_skips.entry(why.clone()).or_default() += 1;
                "not checkable"
            }
            CheckResult::Mismatch(what) => {
                let label = check.label.as_deref().map(|l| format!("#{l}")).unwrap_or_default();
                totals.mismatches.push(format!("{name}{label} choice {}: {what}", check.choice));
                "mismatch"
            }
        };
        *totals.check.entry(key).or_default() += 1;
    }
}

fn table<K: std::fmt::Display>(
    w: &mut impl Write,
    title: &str,
    rows: impl IntoIterator<Item = (K, usize)>,
) -> Result<()> {
    let rows: Vec<(String, usize)> = rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(w, "{title}")?;
    let width = rows.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    for (k, v) in rows {
        writeln!(w, "  {k:<width$}  {v:>8}")?;
    }
    Ok(())
}

fn print_summary(w: &mut impl Write, t: &Totals, wall: Duration, check: bool) -> Result<()> {
    let skipped: usize = t.skipped.values().sum();
    let secs = t.replay_time.as_secs_f64();
    let mb = t.bytes as f64 / 1e6;
    let rate = if secs > 0.0 { mb / secs } else { 0.0 };
    writeln!(
        w,
        "replayed {} files ({:.2} MB) in {:.3}s: {:.1} MB/s (parse time {:.3}s); {} skipped, {} failed",
        t.files,
        mb,
        wall.as_secs_f64(),
        rate,
        secs,
        skipped,
        t.failed.len()
    )?;
    table(w, "files by kind", t.kinds.iter().map(|(k, v)| (*k, *v)))?;
    table(
        w,
        "streams",
        [
            ("streams", t.streams),
            ("choices", t.choices),
            ("events", t.events),
            ("ended with [DONE]", t.done),
            ("truncated", t.truncated),
            ("with stream errors", t.errored),
        ],
    )?;
    table(w, "truncated, why", t.truncated_why.iter().map(|(k, v)| (*k, *v)))?;
    table(w, "finish reasons", t.finish.iter().map(|(k, v)| (k.as_str(), *v)))?;
    table(w, "events by type", t.event_types.iter().map(|(k, v)| (*k, *v)))?;
    table(w, "elements by tag", t.elements.iter().map(|(k, v)| (k.as_str(), *v)))?;
    table(w, "repairs", t.repairs.iter().map(|(k, v)| (*k, *v)))?;
    table(w, "diagnostics", t.diagnostics.iter().map(|(k, v)| (*k, *v)))?;
    table(w, "skipped files", t.skipped.iter().map(|(k, v)| (k.as_str(), *v)))?;
    if !t.failed.is_empty() {
        writeln!(w, "failed files")?;
        for (file, why) in &t.failed {
            writeln!(w, "  {file}: {why}")?;
        }
    }
    if check {
        table(w, "content check (choices)", t.check.iter().map(|(k, v)| (*k, *v)))?;
        table(w, "not checkable, why", t.check_skips.iter().map(|(k, v)| (k.as_str(), *v)))?;
        if t.mismatches.is_empty() {
            writeln!(w, "content check passed: no content lost or invented")?;
        } else {
            writeln!(w, "content mismatches")?;
            for m in &t.mismatches {
                writeln!(w, "  {m}")?;
            }
        }
    }
    Ok(())
}
