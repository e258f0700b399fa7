//! `rota completions SHELL`: the shell's completion script, printed to
//! stdout.
//!
//! The script is generated from the same clap definition that parses the
//! command line, so it offers every subcommand, flag and fixed value this
//! build knows, and cannot drift from it.
//!
//! Deliberately left out: values only a store knows (queue names, task
//! ids). The scripts are static; completing those would mean calling back
//! into `rota` at each TAB, and opening the store from there.

use std::io::Write;

use anyhow::Context;
use clap_complete::Shell;

/// Arguments of `rota completions`.
#[derive(clap::Args)]
pub struct Args {
    /// The shell to print the completion script for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Prints the completion script of `cli` (the whole `rota` command) for
/// the shell `args` names.
pub fn run(args: Args, mut cli: clap::Command) -> anyhow::Result<()> {
    // Into memory first: `generate` panics if its writer fails, and stdout
    // may be a pipe closed early.
    let mut script = Vec::new();
    let name = cli.get_name().to_owned();
    clap_complete::generate(args.shell, &mut cli, name, &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("cannot write the completion script to stdout")
}
