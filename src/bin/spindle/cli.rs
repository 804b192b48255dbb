//! What the subcommands share on the command line: value parsers built
//! from the library's own lists (never a second copy), and the
//! `completions` and `man` subcommands (clap_complete, clap_mangen).

use anyhow::Result;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use spindle::Registry;
use std::io::Write;
use std::process::ExitCode;

/// A `--profile` parser: the built-in profile names, listed in `--help`
/// and completed by the shell completions; `extra` adds names a command
/// understands besides them (`auto` for replay).
pub(crate) fn profile_arg(extra: &'static [&'static str]) -> impl TypedValueParser<Value = String> {
    let names = extra.iter().chain(Registry::profile_names()).copied();
    PossibleValuesParser::new(names)
}

/// Arguments of `spindle completions`.
#[derive(Debug, clap::Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// Prints the completion script of `command` for a shell.
pub(crate) fn completions(args: CompletionsArgs, mut command: clap::Command) -> Result<ExitCode> {
    // Written whole into memory first: `generate` panics on a failed
    // write (a closed pipe, a full disk); a write of our own reports it.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "spindle", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `spindle man`.
#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// A subcommand whose page to print (`spindle man parse` is
    /// spindle-parse(1), with all its options); none: spindle(1).
    #[arg(value_name = "SUBCOMMAND")]
    subcommand: Option<String>,
}

/// Prints the man page of `command`, or of one of its subcommands (roff).
pub(crate) fn man(args: ManArgs, command: clap::Command) -> Result<ExitCode> {
    let page = match &args.subcommand {
        None => command,
        Some(name) => {
            let Some(sub) = command.find_subcommand(name) else {
                let names: Vec<&str> =
                    command.get_subcommands().map(clap::Command::get_name).filter(|n| *n != "help").collect();
                anyhow::bail!("no subcommand {name:?}; there are: {}", names.join(", "));
            };
            // The page's title and synopsis name the whole command.
            let full = format!("spindle-{}", sub.get_name());
            sub.clone().display_name(full).bin_name(format!("spindle {}", sub.get_name()))
        }
    };
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(page).render(&mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
