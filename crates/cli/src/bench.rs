//! `rota bench` (in progress).

/// Arguments of `rota bench`.
#[derive(clap::Args)]
pub struct Args {
    /// The workload: Q or W.
    workload: String,
}

/// Runs the benchmark.
pub fn run(_args: Args) -> std::process::ExitCode {
    std::process::ExitCode::from(3)
}
