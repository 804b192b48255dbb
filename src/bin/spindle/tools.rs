//! `spindle tools manual|list`: the tool catalog of a plugins directory as a
//! manual for a prompt, or as a list; and the catalog loading that `parse
//! --execute` and `agent` share.

use anyhow::{Context, Result, bail};
use spindle::calls::ToolCatalog;
use spindle::tools::runner::implementation_type;
use spindle::tools::{McpPool, Protocol, RunnerOptions, manual};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `spindle tools`.
#[derive(Debug, clap::Args)]
pub(crate) struct ToolsArgs {
    #[command(subcommand)]
    command: ToolsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ToolsCommand {
    /// Print the tool manual for a prompt, in one call protocol.
    Manual(ManualArgs),
    /// List the tools: id, implementation type, plugin, source (the plugins
    /// and tool files that could not be loaded are said on stderr).
    List(ListArgs),
}

/// A parser for the protocol names of `list` (the library's lists), each
/// with its one-line summary in `--help`.
pub(crate) fn protocol_arg(list: &'static [Protocol]) -> impl clap::builder::TypedValueParser<Value = Protocol> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = list.iter().map(|p| PossibleValue::new(p.as_str()).help(p.summary()));
    PossibleValuesParser::new(values).try_map(|name| Protocol::from_name(&name).ok_or("unknown protocol"))
}

#[derive(Debug, clap::Args)]
struct ManualArgs {
    /// The plugins directory (plugin.yaml + *.tool.json; MCP servers in plugin.yaml are started).
    #[arg(long, value_name = "DIR")]
    tools: PathBuf,
    /// The call protocol the manual teaches.
    #[arg(long, value_parser = protocol_arg(&Protocol::ALL), default_value = "tam")]
    protocol: Protocol,
    /// Only these tool ids (comma-separated), in catalog order.
    #[arg(long, value_delimiter = ',', value_name = "ID,...")]
    only: Vec<String>,
    /// Also load the tools of an OpenAI `tools` JSON array from FILE.
    #[arg(long, value_name = "FILE")]
    openai_tools: Option<PathBuf>,
    /// Put the manual into this prompt text, in place of
    /// {{{system:available_tools}}} / {{AVAILABLE_TOOLS}} (after it when it
    /// has neither, as `agent --system` does), and print the prompt.
    #[arg(long, value_name = "FILE")]
    prompt: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ListFormat {
    /// One line per tool (id, implementation, plugin, source, tab-separated).
    Text,
    /// A JSON array of the tools.
    Json,
}

#[derive(Debug, clap::Args)]
struct ListArgs {
    /// The plugins directory.
    #[arg(long, value_name = "DIR")]
    tools: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ListFormat::Text)]
    format: ListFormat,
}

/// Loads a plugins directory and starts its MCP servers (plugin.yaml `mcp:`
/// sections, and `DIR/mcp.json` or `DIR/.mcp.json` in the `mcpServers`
/// form); their tools join the catalog. The pool must live as long as its tools are used.
///
/// A plugin or tool file that cannot be loaded is left out: each is said
/// on stderr (`spindle: warning: skipped tool file PATH: REASON`) and the
/// rest loads ([`ToolCatalog::warnings`] keeps them).
pub(crate) async fn load_tools(dir: &Path, options: &RunnerOptions) -> Result<(ToolCatalog, McpPool)> {
    let mut catalog = ToolCatalog::load_plugins(dir).with_context(|| format!("tools {}", dir.display()))?;
    let mut pool = McpPool::start(&mut catalog, options).await.with_context(|| format!("tools {}", dir.display()))?;
    for name in ["mcp.json", ".mcp.json"] {
        let file = dir.join(name);
        if file.is_file() {
            pool.add_config_file(&mut catalog, &file, options).await.with_context(|| format!("{}", file.display()))?;
        }
    }
    for warning in catalog.warnings() {
        eprintln!("spindle: warning: {warning}");
    }
    if catalog.is_empty() {
        eprintln!(
            "spindle: warning: {} holds no tools (a plugin is a folder with plugin.yaml and *.tool.json; \
             MCP servers go in plugin.yaml or mcp.json)",
            dir.display()
        );
    }
    Ok((catalog, pool))
}

pub(crate) fn run(args: ToolsArgs) -> Result<ExitCode> {
    let rt = crate::proxy::runtime()?;
    match args.command {
        ToolsCommand::Manual(a) => rt.block_on(async move {
            let (mut catalog, _pool) = load_tools(&a.tools, &RunnerOptions::default()).await?;
            if let Some(file) = &a.openai_tools {
                let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
                let value: serde_json::Value =
                    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
                let value = value.get("tools").cloned().unwrap_or(value);
                catalog.add_openai_tools(&value).with_context(|| format!("{}", file.display()))?;
            }
            let tools = match spindle::tools::manual::select(&catalog, &a.only) {
                Ok(t) => t,
                Err(e) => bail!("--only: {e}"),
            };
            let text = manual(tools, a.protocol);
            let mut out = std::io::stdout().lock();
            match &a.prompt {
                Some(file) => {
                    let prompt =
                        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
                    let (filled, place) = spindle::tools::place_manual(&prompt, &text);
                    if place == spindle::tools::ManualPlace::Appended {
                        eprintln!("spindle: {} has no tool placeholder; the manual is appended", file.display());
                    }
                    write!(out, "{filled}")?;
                    if !filled.ends_with('\n') {
                        writeln!(out)?;
                    }
                }
                None => writeln!(out, "{}", text.trim_end())?,
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }),
        ToolsCommand::List(a) => rt.block_on(async move {
            let (catalog, _pool) = load_tools(&a.tools, &RunnerOptions::default()).await?;
            let rows: Vec<serde_json::Value> = catalog
                .tools()
                .map(|t| {
                    serde_json::json!({
                        "id": t.id,
                        "plugin": t.plugin,
                        "source": t.source.as_ref().map(|p| p.display().to_string())
                            .unwrap_or_else(|| if implementation_type(t) == Some("mcp") { "mcp server".into() } else { "code".into() }),
                        "implementation": implementation_type(t).unwrap_or("none"),
                        "async": spindle::tools::runner::is_async(t),
                        "description": t.description,
                    })
                })
                .collect();
            let mut out = std::io::stdout().lock();
            match a.format {
                ListFormat::Json => writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?,
                ListFormat::Text => {
                    for r in &rows {
                        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
                        writeln!(out, "{}\t{}\t{}\t{}", s("id"), s("implementation"), s("plugin"), s("source"))?;
                    }
                }
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }),
    }
}
