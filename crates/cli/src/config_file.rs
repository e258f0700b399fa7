//! `--config FILE` (or `ROTA_CONFIG`): a TOML file of settings for any
//! command, most useful for the long-running ones (`rota serve`, the
//! single roles, `rota api`).
//!
//! Each key is the name of a flag without its dashes (`store`,
//! `listen`, `supervisor-interval`, `instance-id`; `_` may stand for `-`),
//! or one of the settings that otherwise only come from the environment
//! ([`ENV_ONLY`]: `webhook-secret`, `api-token`, `worker-key`). Values are
//! what the flag takes: a string, a number, `true` for a switch, an array
//! for a flag that may be repeated.
//!
//! A flag given on the command line wins, then its environment variable,
//! then the file, then the default. The file's values are checked as the
//! flags are; an error names the file, the line and the key. A key that no
//! `rota` command knows is an error; a key that this command does not take
//! (`roles` for `rota status`) is skipped, so that one file serves every
//! command of a deployment.
//!
//! Deliberately left out: sections and includes (flat keys map one to one
//! onto the flags), and reloading while running.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::api_server;
use crate::serve::WEBHOOK_SECRET_ENV;

/// The largest configuration file read: settings are small, a huge file is a mistake.
const FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The flag naming the file, and its environment variable.
pub const CONFIG_FLAG: &str = "config";

/// The settings read only from the environment, with their file keys.
pub const ENV_ONLY: [(&str, &str); 3] =
    [("webhook-secret", WEBHOOK_SECRET_ENV), ("api-token", api_server::TOKEN_ENV), ("worker-key", api_server::WORKER_KEY_ENV)];

/// The command line with the file's settings added where neither a flag
/// nor an environment variable gave them; `args` unchanged without
/// `--config`. Sets the environment-only settings the file gives (and the
/// environment does not), so call it before any thread starts.
pub fn apply(command: &Command, matches: &ArgMatches, args: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let Some(path) = matches.get_one::<PathBuf>(CONFIG_FLAG) else { return Ok(args) };
    let text = read(path)?;
    let settings = parse(path, &text)?;
    let (subcommands, deepest) = subcommand_path(command, matches);
    let mut extra: Vec<OsString> = Vec::new();
    for setting in &settings {
        if let Some((_, variable)) = ENV_ONLY.iter().find(|(key, _)| *key == setting.key) {
            set_env_unless_set(path, setting, variable)?;
            continue;
        }
        let Some(arg) = deepest.iter().find(|arg| arg.get_long() == Some(setting.key.as_str())) else {
            if !is_known_anywhere(command, &setting.key) {
                bail!("{}:{}: unknown key `{}`{}", path.display(), setting.line, setting.written, hint(command, &setting.key));
            }
            continue;
        };
        // Global flags are propagated down, so the deepest command's matches know every flag it takes.
        let source = deepest_matches(matches).value_source(arg.get_id().as_str());
        if matches!(source, Some(ValueSource::CommandLine | ValueSource::EnvVariable)) {
            continue;
        }
        let flag_args = setting.as_flag_args(path, arg.get_action().takes_values())?;
        check(command, &subcommands, &flag_args).map_err(|why| anyhow!("{}:{}: {}: {why}", path.display(), setting.line, setting.key))?;
        extra.extend(flag_args);
    }
    Ok(with_extra(args, extra))
}

/// One `key = value` line of the file.
struct Setting {
    /// The flag's name (`_` written as `-`).
    key: String,
    /// The key as the file writes it.
    written: String,
    line: usize,
    value: Value,
}

enum Value {
    Text(String),
    Switch(bool),
    List(Vec<String>),
}

impl Setting {
    /// The flag and its values as they would be typed.
    fn as_flag_args(&self, path: &Path, takes_values: bool) -> anyhow::Result<Vec<OsString>> {
        let flag = OsString::from(format!("--{}", self.key));
        let wrong = |expected: &str| anyhow!("{}:{}: {}: expected {expected}", path.display(), self.line, self.key);
        match (&self.value, takes_values) {
            (Value::Switch(on), false) => Ok(if *on { vec![flag] } else { Vec::new() }),
            (_, false) => Err(wrong("true or false")),
            (Value::Switch(_), true) => Err(wrong("a string or a number, not true or false")),
            (Value::Text(text), true) => Ok(vec![flag, text.into()]),
            (Value::List(items), true) => Ok(items.iter().flat_map(|item| [flag.clone(), item.into()]).collect()),
        }
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    let size = std::fs::metadata(path).with_context(|| format!("--config {}: cannot read", path.display()))?.len();
    if size > FILE_BYTES_MAX {
        bail!("--config {}: {size} bytes, more than the {FILE_BYTES_MAX} a configuration file may have", path.display());
    }
    std::fs::read_to_string(path).with_context(|| format!("--config {}: cannot read", path.display()))
}

/// The file's settings in order, each with its line; any value that is not
/// a string, number, boolean or array of those is an error.
fn parse(path: &Path, text: &str) -> anyhow::Result<Vec<Setting>> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let table = DeTable::parse(text).map_err(|err| {
        let line = err.span().map_or(1, |span| line_of(span.start));
        anyhow!("{}:{line}: not valid TOML: {}", path.display(), err.message())
    })?;
    let mut settings = Vec::new();
    for (key, value) in table.get_ref() {
        let line = line_of(key.span().start);
        let name = key.get_ref().replace('_', "-");
        let value = value_of(value).map_err(|why| anyhow!("{}:{line}: {name}: {why}", path.display()))?;
        if name == CONFIG_FLAG {
            bail!("{}:{line}: a configuration file cannot name another one", path.display());
        }
        settings.push(Setting { key: name, written: key.get_ref().to_string(), line, value });
    }
    Ok(settings)
}

fn value_of(value: &Spanned<DeValue<'_>>) -> Result<Value, String> {
    fn scalar(value: &DeValue<'_>) -> Result<String, String> {
        match value {
            DeValue::String(text) => Ok(text.to_string()),
            DeValue::Integer(number) => {
                i64::from_str_radix(number.as_str(), number.radix()).map(|n| n.to_string()).map_err(|err| err.to_string())
            }
            DeValue::Float(number) => Ok(number.as_str().to_owned()),
            other => Err(format!("expected a string or a number, got {}", other.type_str())),
        }
    }
    match value.get_ref() {
        DeValue::Boolean(on) => Ok(Value::Switch(*on)),
        DeValue::Array(items) => items.iter().map(|item| scalar(item.get_ref())).collect::<Result<_, _>>().map(Value::List),
        DeValue::Table(_) => Err("sections are not settings: write each key at the top of the file".into()),
        other => scalar(other).map(Value::Text),
    }
}

/// The names of the subcommands run (`["queue", "send"]`) and the
/// arguments the deepest one takes, with the global ones.
fn subcommand_path<'a>(command: &'a Command, matches: &ArgMatches) -> (Vec<String>, Vec<&'a clap::Arg>) {
    let mut names = Vec::new();
    let mut args: Vec<&clap::Arg> = command.get_arguments().filter(|arg| arg.is_global_set()).collect();
    let (mut command, mut matches) = (command, matches);
    while let Some((name, sub_matches)) = matches.subcommand() {
        let Some(sub) = command.find_subcommand(name) else { break };
        names.push(name.to_owned());
        args.extend(sub.get_arguments().filter(|arg| arg.is_global_set()));
        (command, matches) = (sub, sub_matches);
    }
    args.extend(command.get_arguments());
    (names, args)
}

fn deepest_matches(matches: &ArgMatches) -> &ArgMatches {
    let mut matches = matches;
    while let Some((_, sub)) = matches.subcommand() {
        matches = sub;
    }
    matches
}

/// Whether some command of `rota` has the flag `--key`.
fn is_known_anywhere(command: &Command, key: &str) -> bool {
    command.get_arguments().any(|arg| arg.get_long() == Some(key)) || command.get_subcommands().any(|sub| is_known_anywhere(sub, key))
}

fn every_key(command: &Command, keys: &mut Vec<String>) {
    keys.extend(
        command.get_arguments().filter_map(|arg| arg.get_long()).filter(|long| !matches!(*long, "help" | "version")).map(str::to_owned),
    );
    for sub in command.get_subcommands() {
        every_key(sub, keys);
    }
}

/// ` (did you mean `x`?)` for a key one edit away from a known one.
fn hint(command: &Command, key: &str) -> String {
    let mut keys = Vec::new();
    every_key(command, &mut keys);
    keys.extend(ENV_ONLY.iter().map(|(key, _)| (*key).to_owned()));
    let near = keys.into_iter().filter(|known| strsim::levenshtein(known, key) <= 2).min_by_key(|known| strsim::levenshtein(known, key));
    near.map(|known| format!(" (did you mean `{known}`?)")).unwrap_or_default()
}

/// Checks a setting as clap would check the flag, alone.
fn check(command: &Command, subcommands: &[String], flag_args: &[OsString]) -> Result<(), String> {
    let mut argv: Vec<OsString> = vec!["rota".into()];
    argv.extend(subcommands.iter().map(OsString::from));
    argv.extend(flag_args.iter().cloned());
    match command.clone().try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        // A subcommand that needs more than this flag (a positional
        // argument) is checked with the whole command line later.
        Err(err) if err.kind() == clap::error::ErrorKind::MissingRequiredArgument => Ok(()),
        Err(err) => {
            let rendered = err.to_string();
            let first = rendered.lines().next().unwrap_or_default();
            Err(first.strip_prefix("error: ").unwrap_or(first).to_owned())
        }
    }
}

fn set_env_unless_set(path: &Path, setting: &Setting, variable: &str) -> anyhow::Result<()> {
    if std::env::var_os(variable).is_some() {
        return Ok(());
    }
    let Value::Text(value) = &setting.value else {
        bail!("{}:{}: {}: expected a string", path.display(), setting.line, setting.key);
    };
    // SAFETY: called from `main` before the runtime or any other thread
    // starts, so nothing reads the environment concurrently.
    unsafe { std::env::set_var(variable, value) };
    Ok(())
}

/// `args` with `extra` added before a `--` (what follows one is not rota's).
fn with_extra(mut args: Vec<OsString>, extra: Vec<OsString>) -> Vec<OsString> {
    let at = args.iter().position(|arg| arg == "--").unwrap_or(args.len());
    args.splice(at..at, extra);
    args
}
