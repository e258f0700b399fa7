//! The `rota` binary. (Commands in progress.)
mod bench;

use clap::{Parser, Subcommand};

/// rota: durable task orchestration.
#[derive(Parser)]
#[command(name = "rota", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a benchmark workload (see ../shared/bench/peers/README.md).
    Bench(bench::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(args),
    }
}
