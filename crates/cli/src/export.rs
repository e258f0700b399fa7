//! `rota export` and `rota import`: tasks with their steps and history as
//! JSON lines (the format is `rota_engine::export`'s), written to stdout
//! page by page and read back into an empty store for inspection; `rota
//! verify` checks the hash chains of the histories, in such files or in
//! the store. All work on a local store only (`--store`).

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rota_engine::archive;
use rota_engine::export::{self, Import, Line};

use crate::backend::Backend;
use crate::store_args::StoreArgs;
use crate::tasks::FilterArgs;

/// Arguments of `export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    filters: FilterArgs,
    /// How many tasks are read from the store at a time (the memory an
    /// export holds grows with it, not with the store).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(export::PAGE_MAX)))]
    page: u32,
}

/// Arguments of `import`.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// Files of export lines (`rota export`'s output), or directories of
    /// them (`--archive`'s: their `.jsonl` files, by name); `-` reads stdin.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Import tasks whose history's hash chain is broken (the line was
    /// changed after it was written) instead of refusing them; this store
    /// chains them anew, so only the file shows the break.
    #[arg(long)]
    accept_broken_chains: bool,
}

/// Arguments of `verify`.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// Files of export lines, or archive directories, to check; without
    /// any, the store's own histories are checked.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
    /// How many tasks are read from the store at a time.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=i64::from(export::PAGE_MAX)))]
    page: u32,
}

/// Runs `rota verify`: prints each task whose history's hash chain is
/// broken, and where; fails if any is.
pub async fn verify(store: &StoreArgs, args: VerifyArgs) -> anyhow::Result<()> {
    let (checked, broken) = if args.files.is_empty() {
        store.local_only("verify")?;
        let Backend::Local(store) = store.backend().await? else { unreachable!("local_only refused --server") };
        let verified = export::verify(&store, args.page, |id, at| println!("task {id}: {at}")).await?;
        let mut summary = format!("checked {} task(s), {} history row(s)", verified.tasks, verified.rows);
        if verified.unchained_tasks > 0 {
            summary.push_str(&format!("; {} task(s) have rows from before the chain, not checked", verified.unchained_tasks));
        }
        (summary, verified.broken)
    } else {
        verify_files(&expand(&args.files)?)?
    };
    if broken > 0 {
        bail!("{checked}: the history of {broken} task(s) was changed after it was written (see above)");
    }
    println!("{checked}: every chain holds");
    Ok(())
}

/// Checks every line of `files`; returns the summary and the broken count.
fn verify_files(files: &[PathBuf]) -> anyhow::Result<(String, u64)> {
    let (mut tasks, mut rows, mut broken) = (0u64, 0u64, 0u64);
    for file in files {
        let name = file.display().to_string();
        for (n, text) in open(file)?.lines().enumerate() {
            let text = text.with_context(|| format!("cannot read {name}"))?;
            if text.trim().is_empty() {
                continue;
            }
            let line = Line::parse(&text).map_err(|why| anyhow::anyhow!("{name}:{}: {why}", n + 1))?;
            tasks += 1;
            match line.verify() {
                Ok(whole) => rows += whole.chained as u64,
                Err(at) => {
                    broken += 1;
                    println!("{name}:{}: task {}: {at}", n + 1, line.task.id);
                }
            }
        }
    }
    Ok((format!("checked {tasks} task(s), {rows} history row(s) in {} file(s)", files.len()), broken))
}

/// A file to read lines from, or stdin for `-`.
fn open(file: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    if file == Path::new("-") {
        return Ok(Box::new(BufReader::new(io::stdin().lock())));
    }
    Ok(Box::new(BufReader::new(File::open(file).with_context(|| format!("cannot read {}", file.display()))?)))
}

/// Runs `rota export`: every task the filters select, newest first, one
/// line each, to stdout.
pub async fn export(store: &StoreArgs, args: ExportArgs) -> anyhow::Result<()> {
    store.local_only("export")?;
    let Backend::Local(store) = store.backend().await? else { unreachable!("local_only refused --server") };
    let mut out = BufWriter::new(io::stdout().lock());
    let written = export::export(&store, args.filters.filter(args.page)?, |line| {
        out.write_all(line.to_json().as_bytes())?;
        out.write_all(b"\n")
    })
    .await?;
    out.flush().context("cannot write to stdout")?;
    eprintln!("exported {written} task(s)");
    Ok(())
}

/// Runs `rota import`: every line of the files into the store, which must
/// hold no task (it is created if missing).
pub async fn import(store: &StoreArgs, args: ImportArgs) -> anyhow::Result<()> {
    store.local_only("import")?;
    let files = expand(&args.files)?;
    let mut import = Import::start(store.open().await?).await?;
    if args.accept_broken_chains {
        import = import.accepting_broken_chains();
    }
    for file in &files {
        let name = file.display().to_string();
        for (n, text) in open(file)?.lines().enumerate() {
            let text = text.with_context(|| format!("cannot read {name}"))?;
            if text.trim().is_empty() {
                continue;
            }
            let line = Line::parse(&text).map_err(|why| anyhow::anyhow!("{name}:{}: {why}", n + 1))?;
            import.write(line).await.with_context(|| format!("{name}:{}", n + 1))?;
        }
    }
    let imported = import.finish();
    let mut summary = format!("imported {} task(s) from {} file(s)", imported.tasks, files.len());
    if imported.duplicates > 0 {
        summary.push_str(&format!("; {} later line(s) of a task already imported were skipped", imported.duplicates));
    }
    if imported.broken_chains > 0 {
        summary.push_str(&format!(
            "; {} task(s) whose history's hash chain was broken were imported anyway and chained anew (`rota verify` on the files names them)",
            imported.broken_chains
        ));
    }
    println!("{summary}");
    Ok(())
}

/// The files to read: each file named, and each directory's archive files.
fn expand(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let found = archive::files(path).with_context(|| format!("cannot list {}", path.display()))?;
            if found.is_empty() {
                bail!("{} holds no {} file", path.display(), archive::SUFFIX);
            }
            files.extend(found);
        } else if path == Path::new("-") || path.is_file() {
            files.push(path.clone());
        } else {
            bail!("{} does not exist", path.display());
        }
    }
    Ok(files)
}
