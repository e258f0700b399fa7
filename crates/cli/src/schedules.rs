//! `rota schedules …`: create, list (with the next fire times), show,
//! pause, resume, trigger and delete cron schedules, on a local store or a
//! server (`--server`). Each subcommand is one backend request and prints
//! its answer; the rules (what is refused and how it reads) are the
//! engine's, the same on either transport.

use clap::builder::PossibleValuesParser;
use rota_api::wire::{ScheduleRequest, ScheduleView};
use rota_model::{ScheduleName, WorkflowName};

use crate::output::{self, rfc3339_millis};
use crate::store_args::StoreArgs;
use crate::tasks::parse_input;

/// `rota schedules …`
#[derive(clap::Subcommand)]
pub enum Command {
    /// Create a schedule that starts a workflow on a cron expression (the same definition again changes nothing).
    Create(CreateArgs),
    /// List the schedules with their next fire times.
    List(ListArgs),
    /// Show a schedule: its definition, next fire time and progress.
    Show(ShowArgs),
    /// Pause a schedule: it does not fire until resumed.
    Pause(NameArg),
    /// Resume a paused schedule: it fires from now on (fires while paused are not caught up).
    Resume(NameArg),
    /// Fire a schedule now, paused or not; prints the task it started (NAME@manual@TIME).
    Trigger(NameArg),
    /// Delete a schedule (the tasks it started are kept).
    Delete(NameArg),
}

/// Arguments of `schedules create`.
#[derive(clap::Args)]
pub struct CreateArgs {
    /// The schedule's name (ASCII letters, digits, '-', '_', '.', ':').
    name: ScheduleName,
    /// The workflow each fire starts (its latest version at the fire).
    #[arg(long, value_name = "NAME")]
    workflow: WorkflowName,
    /// A cron expression: five fields, or six with seconds first ("*/10 * * * * *").
    #[arg(long, value_name = "EXPR")]
    cron: String,
    /// The input of every task it starts: JSON, or @FILE.
    #[arg(long, value_name = "JSON", default_value = "{}")]
    input: String,
    /// The IANA time zone the expression is read in (Europe/Paris, America/New_York…).
    #[arg(long, value_name = "TZ", default_value = "UTC")]
    timezone: String,
    /// While the last fire's task runs: skip the fire, allow another task, or buffer one fire until it ends.
    #[arg(long, value_name = "POLICY", default_value = "skip", value_parser = PossibleValuesParser::new(["skip", "allow", "buffer-one"]))]
    overlap: String,
    /// After a time nobody fired it: skip the missed fires, start the latest one, or start them all.
    #[arg(long, value_name = "POLICY", default_value = "latest", value_parser = PossibleValuesParser::new(["none", "latest", "all"]))]
    catch_up: String,
    /// Print the schedule as JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `schedules list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of `schedules show`.
#[derive(clap::Args)]
pub struct ShowArgs {
    /// The schedule.
    name: ScheduleName,
    /// Print the schedule as JSON.
    #[arg(long)]
    json: bool,
}

/// A schedule's name, and why an operator acts on it.
#[derive(clap::Args)]
pub struct NameArg {
    /// The schedule.
    name: ScheduleName,
    /// Why, kept in the audit log with who did it.
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// Runs a `rota schedules` command.
pub async fn run(store: StoreArgs, command: Command) -> anyhow::Result<()> {
    let backend = store.backend().await?;
    match command {
        Command::Create(args) => {
            let request = ScheduleRequest {
                name: args.name.to_string(),
                workflow: args.workflow.to_string(),
                cron: args.cron,
                timezone: Some(args.timezone),
                input: Some(parse_input(&args.input)?),
                overlap: Some(args.overlap),
                catch_up: Some(args.catch_up),
            };
            let (view, created) = backend.create_schedule(&request).await?;
            if args.json {
                return output::json(&view);
            }
            let what = if created { "created" } else { "unchanged (it exists with this definition):" };
            output::line(&format!("schedule {} {what} {}; next fire {}", view.name, describe(&view), next_fire(&view)))?;
        }
        Command::List(args) => {
            let schedules = backend.schedules().await?;
            if args.json {
                return output::json(&schedules);
            }
            if schedules.is_empty() {
                eprintln!("no schedules (`rota schedules create` makes one, and a workflow file may declare them under `schedules:`)");
                return Ok(());
            }
            let rows: Vec<Vec<String>> = schedules
                .iter()
                .map(|s| {
                    vec![
                        s.name.clone(),
                        s.workflow.clone(),
                        s.cron.clone(),
                        s.timezone.clone(),
                        if s.paused { "paused".to_owned() } else { "running".to_owned() },
                        next_fire(s),
                        s.last_task.clone().unwrap_or_else(|| "-".to_owned()),
                    ]
                })
                .collect();
            output::line(&output::table(&["NAME", "WORKFLOW", "CRON", "TIMEZONE", "STATE", "NEXT FIRE", "LAST TASK"], &rows))?;
        }
        Command::Show(args) => {
            let view = backend.schedule(&args.name).await?;
            if args.json {
                return output::json(&view);
            }
            output::line(&show(&view))?;
        }
        Command::Pause(args) => {
            let view = backend.pause_schedule(&args.name, args.reason.as_deref()).await?;
            output::line(&format!("schedule {} paused", view.name))?;
        }
        Command::Resume(args) => {
            let view = backend.resume_schedule(&args.name, args.reason.as_deref()).await?;
            output::line(&format!("schedule {} resumed; next fire {}", view.name, next_fire(&view)))?;
        }
        Command::Trigger(args) => {
            let task = backend.trigger_schedule(&args.name, args.reason.as_deref()).await?;
            output::line(&format!(
                "schedule {} fired: task {} ({})",
                args.name,
                task.id,
                rota_model::TaskState::from(task.state).as_str()
            ))?;
        }
        Command::Delete(args) => {
            backend.delete_schedule(&args.name, args.reason.as_deref()).await?;
            output::line(&format!("schedule {} deleted", args.name))?;
        }
    }
    Ok(())
}

fn describe(view: &ScheduleView) -> String {
    format!(
        "(workflow {}, cron \"{}\" in {}, overlap {}, catch-up {})",
        view.workflow, view.cron, view.timezone, view.overlap, view.catch_up
    )
}

fn next_fire(view: &ScheduleView) -> String {
    match (view.paused, view.next_fire_at) {
        (true, _) => "none (paused)".to_owned(),
        (false, Some(at)) => rfc3339_millis(at),
        (false, None) => "none (the expression never matches again)".to_owned(),
    }
}

fn show(view: &ScheduleView) -> String {
    let optional = |at: Option<i64>| at.map_or_else(|| "-".to_owned(), rfc3339_millis);
    let rows = [
        ("name", view.name.clone()),
        ("workflow", view.workflow.clone()),
        ("cron", view.cron.clone()),
        ("timezone", view.timezone.clone()),
        ("input", view.input.to_string()),
        ("overlap", view.overlap.clone()),
        ("catch-up", view.catch_up.clone()),
        ("source", view.source.clone()),
        ("state", if view.paused { "paused".to_owned() } else { "running".to_owned() }),
        ("next fire", next_fire(view)),
        ("fired through", rfc3339_millis(view.fired_through)),
        ("last fire", optional(view.last_fire_at)),
        ("last task", view.last_task.clone().unwrap_or_else(|| "-".to_owned())),
        ("buffered fire", optional(view.buffered_fire_at)),
        ("skipped", view.skipped.to_string()),
        ("last skipped", optional(view.last_skipped_at)),
        ("created", rfc3339_millis(view.created_at)),
    ];
    rows.iter().map(|(key, value)| format!("{key:<14}{value}")).collect::<Vec<_>>().join("\n")
}
