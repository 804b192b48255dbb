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
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut command, "spindle", &mut out);
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the man page of `command` (roff).
pub(crate) fn man(command: clap::Command) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(command).render(&mut out)?;
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
