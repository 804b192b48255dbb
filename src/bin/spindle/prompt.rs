//! `spindle prompt render|migrate|import|registry`: the prompt side of
//! Filament ([`spindle::prompt`]) on the command line.

use anyhow::{Context, Result, bail};
use spindle::prompt::{self, NoteKind, RenderLimits, Renderer};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `spindle prompt`.
#[derive(Debug, clap::Args)]
pub(crate) struct PromptArgs {
    #[command(subcommand)]
    command: PromptCommand,
}

#[derive(Debug, clap::Subcommand)]
enum PromptCommand {
    /// Render a Jinja2 prompt template in the sandbox.
    Render(RenderArgs),
    /// Convert SillyTavern macros (a prompt text, or a card's text fields) to Jinja2, with a report on stderr.
    Migrate(MigrateArgs),
    /// Turn a character card (PNG or JSON, V1/V2/V3) or world-info JSON into Skein blocks.
    Import(ImportArgs),
    /// Print the registry a prompt's <use_protocol> lines build (TOML, for `spindle parse --registry`).
    Registry(RegistryArgs),
}

#[derive(Debug, clap::Args)]
struct RenderArgs {
    /// The template file (`-` reads stdin).
    template: PathBuf,
    /// Variables (YAML or JSON by extension): user, char, history, ...
    #[arg(long, value_name = "FILE")]
    vars: Option<PathBuf>,
    /// The variable state, read-only to the template (JSON).
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// A character card (.png or .json, V1/V2/V3) as `char`, under the
    /// names migrated macros read (`char.description`, `char.main_prompt`,
    /// `char.examples`, ...); a `char` in --vars wins.
    #[arg(long, value_name = "FILE")]
    card: Option<PathBuf>,
    /// Seed of random/pick/roll (the same seed, the same render).
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,
    /// The time `now` holds: RFC 3339 (2025-01-01T09:30:00+01:00), or a date (2025-01-01) for its midnight UTC [default: the clock].
    #[arg(long, value_name = "TIME")]
    now: Option<String>,
    /// Most template instructions.
    #[arg(long, value_name = "N", default_value_t = RenderLimits::default().fuel)]
    max_fuel: u64,
    /// Deepest macro recursion.
    #[arg(long, value_name = "N", default_value_t = RenderLimits::default().recursion)]
    max_depth: usize,
    /// Most bytes of output.
    #[arg(long, value_name = "BYTES", default_value_t = RenderLimits::default().max_output)]
    max_output: usize,
    /// Most seconds of rendering: a template whose single steps grow
    /// without bound (a list doubled in a loop) is stopped here, as fuel
    /// stops one with many steps.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    max_time: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ReportFormat {
    /// One line per macro.
    Text,
    /// A JSON array of notes.
    Json,
}

#[derive(Debug, clap::Args)]
struct MigrateArgs {
    /// A SillyTavern prompt text (UTF-8), or a card (.json / .png); a card is written as JSON, in its own shape (V1, or V2/V3 with its `spec` and `data`).
    file: PathBuf,
    /// The report's format (on stderr).
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    report: ReportFormat,
}

#[derive(Debug, clap::Args)]
struct ImportArgs {
    /// A card (.png with a `chara`/`ccv3` chunk, or .json) or world-info JSON.
    file: PathBuf,
}

#[derive(Debug, clap::Args)]
struct RegistryArgs {
    /// The prompt (`-` reads stdin).
    prompt: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf).context("reading stdin")?;
        return Ok(buf);
    }
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

fn read_text(path: &Path) -> Result<String> {
    utf8_text(path, read(path)?)
}

/// The bytes read from `path` as text: an error naming the file when they
/// are not UTF-8 (never a lossy replacement).
fn utf8_text(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", path.display()))
}

/// A YAML or JSON file as JSON.
fn read_data(path: &Path) -> Result<serde_json::Value> {
    let text = read_text(path)?;
    let json = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if json {
        serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
    } else {
        spindle::prompt::from_yaml(&text).map_err(|e| anyhow::anyhow!("{} is not valid YAML: {e}", path.display()))
    }
}

pub(crate) fn run(args: PromptArgs) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match args.command {
        PromptCommand::Render(a) => {
            let template = read_text(&a.template)?;
            let mut vars = a.vars.as_deref().map(read_data).transpose()?.unwrap_or(serde_json::json!({}));
            if let Some(path) = &a.card {
                let imported =
                    prompt::import_bytes(&read(path)?).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
                let Some(char_vars) = imported.char_vars() else {
                    bail!("{}: world info, not a character card", path.display());
                };
                match vars.as_object_mut() {
                    Some(v) => {
                        v.entry("char").or_insert(char_vars);
                    }
                    None => bail!("--vars must hold an object (user, char, ...)"),
                }
            }
            let state = a.state.as_deref().map(read_data).transpose()?.unwrap_or(serde_json::json!({}));
            if !(a.max_time.is_finite() && a.max_time > 0.0) {
                bail!("--max-time must be a positive number of seconds");
            }
            let limits = RenderLimits {
                fuel: a.max_fuel,
                recursion: a.max_depth,
                max_output: a.max_output,
                max_time: Some(std::time::Duration::from_secs_f64(a.max_time)),
            };
            let mut r = Renderer::new().with_seed(a.seed).with_limits(limits);
            if let Some(now) = &a.now {
                r = r.with_now(parse_now(now)?);
            }
            // A render that runs past --max-time is left behind, and ends
            // with the process.
            let rendered = r
                .render_full(&template, &vars, &state)
                .map_err(|e| anyhow::anyhow!("{}: {e}", a.template.display()))?;
            out.write_all(rendered.text.as_bytes())?;
            // Writes of `{% set_global %}`: the template wrote nothing; the
            // host applies them.
            for w in &rendered.global_writes {
                eprintln!("set_global {} = {} (for the host to apply)", w.name, w.value);
            }
        }
        PromptCommand::Migrate(a) => {
            let bytes = read(&a.file)?;
            let is_card =
                bytes.starts_with(b"\x89PNG") || a.file.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
            let mut notes = Vec::new();
            if is_card {
                let mut imported =
                    prompt::import_bytes(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
                let Some(data) = imported.card_data_mut() else {
                    bail!("{}: world info has no card text to migrate", a.file.display())
                };
                migrate_card(data, &mut notes);
                // The whole card, in its own shape: a V2/V3 card keeps its
                // `spec`, `spec_version` and every other key.
                if let Some(card) = &imported.card {
                    writeln!(out, "{}", serde_json::to_string_pretty(card)?)?;
                }
            } else {
                let text = utf8_text(&a.file, bytes)?;
                let m = prompt::migrate(&text);
                out.write_all(m.text.as_bytes())?;
                notes.extend(m.notes.into_iter().map(|n| (String::new(), n)));
            }
            report(&notes, a.report)?;
        }
        PromptCommand::Import(a) => {
            let imported = prompt::import(&a.file).map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
            out.write_all(imported.skein.render().as_bytes())?;
            for n in &imported.notes {
                eprintln!("spindle: note: {n}");
            }
        }
        PromptCommand::Registry(a) => {
            let text = read_text(&a.prompt)?;
            let r = prompt::registry_for(&text)?;
            out.write_all(r.toml.as_bytes())?;
            for u in &r.unknown {
                eprintln!(
                    "spindle: warning: unknown protocol {u:?} in <use_protocol>: it adds nothing to the registry"
                );
            }
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--now`: an RFC 3339 time, or a bare date `YYYY-MM-DD` (exactly that
/// shape) for its midnight UTC. An error says what is wanted, with an
/// example, and the parser's cause.
fn parse_now(now: &str) -> Result<chrono::DateTime<chrono::FixedOffset>> {
    let wanted = || {
        format!(
            "--now {now:?}: expected an RFC 3339 time such as 2025-01-01T00:00:00Z or 2025-01-01T09:30:00+01:00, \
             or a date such as 2025-01-01 (midnight UTC)"
        )
    };
    let b = now.as_bytes();
    let bare_date = b.len() == 10
        && b.iter().enumerate().all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    if bare_date {
        let day = chrono::NaiveDate::parse_from_str(now, "%Y-%m-%d").with_context(wanted)?;
        return Ok(day.and_time(chrono::NaiveTime::MIN).and_utc().fixed_offset());
    }
    chrono::DateTime::parse_from_rfc3339(now).with_context(wanted)
}

/// Migrates every text field of a card (and of its book's entries).
fn migrate_card(card: &mut serde_json::Value, notes: &mut Vec<(String, prompt::MigrationNote)>) {
    let fields = [
        "description",
        "personality",
        "scenario",
        "first_mes",
        "mes_example",
        "system_prompt",
        "post_history_instructions",
        "creator_notes",
    ];
    let mut one = |label: String, v: &mut serde_json::Value| {
        if let Some(text) = v.as_str() {
            let m = prompt::migrate(text);
            notes.extend(m.notes.into_iter().map(|n| (label.clone(), n)));
            *v = serde_json::Value::String(m.text);
        }
    };
    for f in fields {
        if let Some(v) = card.get_mut(f) {
            one(f.to_string(), v);
        }
    }
    if let Some(greetings) = card.get_mut("alternate_greetings").and_then(serde_json::Value::as_array_mut) {
        for (i, g) in greetings.iter_mut().enumerate() {
            one(format!("alternate_greetings[{i}]"), g);
        }
    }
    let entries = card.pointer_mut("/character_book/entries");
    let list: Vec<&mut serde_json::Value> = match entries {
        Some(serde_json::Value::Array(a)) => a.iter_mut().collect(),
        Some(serde_json::Value::Object(m)) => m.values_mut().collect(),
        _ => Vec::new(),
    };
    for (i, e) in list.into_iter().enumerate() {
        if let Some(c) = e.get_mut("content") {
            one(format!("character_book.entries[{i}].content"), c);
        }
    }
}

fn report(notes: &[(String, prompt::MigrationNote)], format: ReportFormat) -> Result<()> {
    let mut err = std::io::stderr().lock();
    match format {
        ReportFormat::Json => {
            let list: Vec<serde_json::Value> = notes
                .iter()
                .map(|(field, n)| {
                    let mut v = serde_json::to_value(n).unwrap_or_default();
                    if !field.is_empty()
                        && let serde_json::Value::Object(m) = &mut v
                    {
                        m.insert("field".into(), serde_json::Value::String(field.clone()));
                    }
                    v
                })
                .collect();
            writeln!(err, "{}", serde_json::Value::Array(list))?;
        }
        ReportFormat::Text => {
            for (field, n) in notes {
                let place =
                    if field.is_empty() { format!("line {}", n.line) } else { format!("{field}, line {}", n.line) };
                let kind = match n.kind {
                    NoteKind::Converted => "converted",
                    NoteKind::NeedsHost => "needs the host",
                    NoteKind::Unsupported => "no equivalent, kept",
                };
                let why = n.note.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
                writeln!(
                    err,
                    "{place}: {} -> {} [{kind}]{why}",
                    n.from.replace('\n', "\\n"),
                    n.to.replace('\n', "\\n")
                )?;
            }
            let count = |k: NoteKind| notes.iter().filter(|(_, n)| n.kind == k).count();
            writeln!(
                err,
                "{} macro(s): {} converted, {} need the host, {} without equivalent",
                notes.len(),
                count(NoteKind::Converted),
                count(NoteKind::NeedsHost),
                count(NoteKind::Unsupported)
            )?;
        }
    }
    Ok(())
}
