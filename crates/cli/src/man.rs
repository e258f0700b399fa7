//! `rota man`: the man pages, in roff, generated from the clap definition.
//!
//! Without `--dir` the page of `rota` itself goes to stdout (`rota man |
//! man -l -`). With `--dir DIR`, one page per command is written there —
//! `rota.1`, `rota-serve.1`, `rota-queue.1`, `rota-queue-send.1`, … — the
//! layout of a `man1` directory, for packagers; each path written is
//! printed on its own line.
//!
//! Deliberately left out: a date on the pages (it would make two builds of
//! the same source differ) and compressing them, which packaging tools do.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

/// Arguments of `rota man`.
#[derive(clap::Args)]
pub struct Args {
    /// Write one page per command into DIR (created if missing) instead of
    /// printing rota's own page.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Prints the page of `cli` (the whole `rota` command), or writes every
/// command's page to `--dir`.
pub fn run(args: Args, cli: clap::Command) -> anyhow::Result<()> {
    match args.dir {
        Some(dir) => write_pages(cli, &dir),
        None => print_page(cli),
    }
}

fn print_page(cli: clap::Command) -> anyhow::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cli).render(&mut page).context("cannot render the man page")?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&page).and_then(|()| stdout.flush()).context("cannot write the man page to stdout")
}

fn write_pages(cli: clap::Command, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // Building the whole command first names each subcommand's page after
    // its path (`rota-queue-send`). `help` (at every level: the setting is
    // global) is clap's, not a command with a page of its own.
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    write_page_and_below(cli, dir)
}

/// Writes the page of `command`, then those of its subcommands, depth first.
fn write_page_and_below(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    let subcommands: Vec<clap::Command> = command.get_subcommands().filter(|sub| !sub.is_hide_set()).cloned().collect();
    let written =
        clap_mangen::Man::new(command).generate_to(dir).with_context(|| format!("cannot write a man page in {}", dir.display()))?;
    crate::output::line(&written.display().to_string())?;
    for subcommand in subcommands {
        write_page_and_below(subcommand, dir)?;
    }
    Ok(())
}
