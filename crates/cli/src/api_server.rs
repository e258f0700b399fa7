//! The HTTP API in the binary: `rota serve --listen ADDR` serves it beside
//! the engine roles, and `rota api` serves it alone (an API-only process,
//! for scale-out: it talks only to the store).
//!
//! This module reads what the API needs from flags, files and the
//! environment, and builds a [`rota_api::Config`]:
//! - `--listen ADDR` (`none` turns the API off in `rota serve`);
//! - `--auth FILE`, a TOML file of tokens and their scopes (each token given
//!   inline or named by an environment variable), and/or `ROTA_API_TOKEN`,
//!   one admin token;
//! - without any token the API runs with authentication disabled, but only
//!   on a loopback address, unless `--insecure-no-auth` says otherwise;
//! - `--remote-agent NAME`, the agents that external workers run through
//!   the worker protocol, and `ROTA_WORKER_KEY`, the key that signs their
//!   lease tokens (shared by every API process; random when absent).
//!
//! Binding the API installs the process-global metrics recorder
//! (`rota_api::metrics::install_global`), so that `/metrics` also shows what
//! the engine roles of the same process record.
//!
//! Tokens never reach a log or an error message: errors name the file, the
//! entry and the field.
//!
//! Deliberately left out: TLS (put a proxy in front), reloading the tokens
//! while running, and the API's limits as flags (the defaults of
//! [`rota_api::Limits`] apply).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use rota_api::workers::{LeaseKey, WorkerConfig};
use rota_api::{AuthConfig, Scope, Token};
use rota_engine::{Client, Shutdown, Workflows};
use rota_model::{Clock, SystemClock};
use rota_store::SharedStore;
use rota_workflow::AgentName;
use serde::Deserialize;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::signals::Signals;
use crate::store_args::StoreArgs;
use crate::store_url::redacted;

/// Where the API listens unless `--listen` says otherwise.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7878";
/// The `--listen` value that turns the API off (`rota serve` only).
pub const LISTEN_NONE: &str = "none";
/// The environment variable holding one admin token.
pub const TOKEN_ENV: &str = "ROTA_API_TOKEN";
/// The environment variable holding the key that signs workers' lease tokens.
pub const WORKER_KEY_ENV: &str = "ROTA_WORKER_KEY";
/// The largest `--auth` file read: a token file is small, and a huge one is a mistake.
const AUTH_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// The most tokens an `--auth` file may configure (each request compares every one).
const AUTH_TOKENS_MAX: usize = 1000;

/// How the API is served: the address and who may call it.
#[derive(clap::Args, Clone, Debug)]
pub struct ListenArgs {
    /// Serve the HTTP API on this address (HOST:PORT; port 0 picks a free
    /// port, logged as `listening on http://…`). `rota serve --listen none`
    /// runs without the API [default: 127.0.0.1:7878; if `rota serve` finds
    /// that in use, it warns and runs without the API].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// A TOML file of API tokens and their scopes (see docs/api.md). The
    /// environment variable ROTA_API_TOKEN adds one admin token.
    #[arg(long = "auth", value_name = "FILE")]
    pub auth_file: Option<PathBuf>,
    /// Serve without authentication even on a non-loopback address when no
    /// token is configured (anyone who reaches the port may do everything).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// The largest task input (and schedule input) a submission may carry,
    /// in bytes of JSON; a larger one is refused with 422. At most 262144,
    /// the limit of a step request, which carries the rendered input.
    #[arg(long, value_name = "BYTES", default_value_t = rota_engine::client::INPUT_BYTES_MAX_DEFAULT)]
    pub input_bytes_max: usize,
    /// Refuse submissions with 429 and Retry-After while this many tasks
    /// are Pending (counted at most once a second, plus the submissions
    /// accepted since), instead of letting the backlog grow without limit
    /// [default: no bound].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub pending_max: Option<u64>,
}

impl ListenArgs {
    /// Whether the API is turned off (`--listen none`).
    pub fn is_off(&self) -> bool {
        self.address().eq_ignore_ascii_case(LISTEN_NONE)
    }

    /// The address to listen on, as given or by default.
    pub fn address(&self) -> &str {
        self.listen.as_deref().unwrap_or(LISTEN_DEFAULT)
    }

    /// Whether `err` (from [`bind`]) says that the default address is
    /// taken when no `--listen` was given: one host may run several `rota
    /// serve` processes, and only one of them can have the default port.
    pub fn is_default_in_use(&self, err: &anyhow::Error) -> bool {
        self.listen.is_none()
            && err.chain().any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse))
    }
}

/// The agents that external workers run (the worker protocol): workflow
/// definitions may name them, and the API serves their queues.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct RemoteAgentArgs {
    /// An agent run by external workers through the HTTP API's worker
    /// protocol (repeat or comma-separate); steps may name it, and its
    /// queue is agent.NAME. ROTA_WORKER_KEY (32+ bytes, the same on every
    /// API process) signs the workers' lease tokens.
    #[arg(long = "remote-agent", value_name = "NAME", value_delimiter = ',')]
    pub remote_agents: Vec<String>,
}

impl RemoteAgentArgs {
    /// The names, checked; the error names the flag.
    pub fn names(&self) -> anyhow::Result<Vec<AgentName>> {
        self.remote_agents.iter().map(|name| AgentName::new(name.trim()).map_err(|err| anyhow!("--remote-agent {name:?}: {err}"))).collect()
    }
}

/// The API, ready to serve: a bound listener and its configuration.
pub struct Listening {
    listener: TcpListener,
    config: rota_api::Config,
    /// The address actually bound (the port is known even for `:0`).
    pub address: SocketAddr,
}

/// Reads the tokens, resolves and checks `--listen`, and binds it. Run
/// before the engine starts, so that a bad address or token file stops
/// startup with nothing running.
pub async fn bind(args: &ListenArgs, remote: &RemoteAgentArgs) -> anyhow::Result<Listening> {
    let tokens = configured_tokens(args.auth_file.as_deref(), secret_env(TOKEN_ENV))?;
    let workers = worker_config(remote.names()?, secret_env(WORKER_KEY_ENV))?;
    let listen = args.address();
    let addresses: Vec<SocketAddr> =
        tokio::net::lookup_host(listen).await.with_context(|| format!("--listen {listen}: not a HOST:PORT address"))?.collect();
    let Some(address) = addresses.first().copied() else { bail!("--listen {listen}: the host name resolves to no address") };
    let loopback = addresses.iter().all(|address| address.ip().is_loopback());
    let auth = match tokens {
        Some(tokens) => AuthConfig::tokens(tokens).map_err(|err| anyhow!("API tokens: {err}"))?,
        None if loopback || args.insecure_no_auth => {
            if !args.insecure_no_auth {
                warn!(
                    "no API tokens configured (--auth FILE or {TOKEN_ENV}): serving {address} without authentication because it is a loopback address"
                );
            }
            AuthConfig::Disabled
        }
        None => bail!(
            "--listen {listen}: refusing to serve the HTTP API on a non-loopback address without tokens; \
             configure them with --auth FILE or {TOKEN_ENV}, or pass --insecure-no-auth"
        ),
    };
    let listener = TcpListener::bind(address).await.with_context(|| format!("--listen {listen}: cannot listen on {address}"))?;
    let address = listener.local_addr().with_context(|| format!("--listen {listen}: cannot read the bound address"))?;
    let mut config = rota_api::Config::new(auth);
    config.workers = workers;
    config.limits.pending_max = args.pending_max;
    // One recorder for the whole process, so that `/metrics` shows what the
    // engine roles (and the store's writer) of this process recorded too.
    config.metrics = rota_api::metrics::Registry::Global(rota_api::metrics::install_global().context("the metrics recorder")?);
    Ok(Listening { listener, config, address })
}

/// A secret from the environment; an empty variable counts as unset (as
/// `VAR= rota …` means to unset it).
pub fn secret_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// The worker protocol's settings: the remote agents, and the lease key
/// from `key` (`ROTA_WORKER_KEY`) or a random one.
fn worker_config(remote_agents: Vec<AgentName>, key: Option<String>) -> anyhow::Result<WorkerConfig> {
    let mut workers = WorkerConfig { remote_agents, ..WorkerConfig::default() };
    match key {
        Some(key) => workers.lease_key = LeaseKey::new(key).map_err(|err| anyhow!("{WORKER_KEY_ENV}: {}", config_message(err)))?,
        None if !workers.remote_agents.is_empty() => info!(
            "{WORKER_KEY_ENV} is not set: workers' lease tokens are signed with a random key, so only this process accepts them \
             (set it, the same on every API process, to share them)"
        ),
        None => {}
    }
    workers.validate().map_err(|err| anyhow!("the worker protocol: {}", config_message(err)))?;
    Ok(workers)
}

impl Listening {
    /// Serves the API over `store` with `client` until `shutdown` is
    /// triggered; then ends the event streams and waits for the requests in
    /// progress. Logs the address it listens on first (tests and scripts
    /// read the port from that line). With `scheduler`, this process's,
    /// remote workers' replies are decided by it at once.
    pub async fn serve(
        self,
        store: SharedStore,
        client: Client,
        clock: Arc<dyn Clock>,
        scheduler: Option<rota_engine::Scheduler>,
        shutdown: Shutdown,
    ) -> anyhow::Result<()> {
        let mut state = rota_api::ApiState::new(store, client, clock, self.config).context("cannot set up the HTTP API")?;
        if let Some(scheduler) = scheduler {
            state = state.with_scheduler(scheduler);
        }
        info!("HTTP API listening on http://{} (OpenAPI at /openapi.json, docs at /docs/)", self.address);
        info!("dashboard at http://{}/ui", self.address);
        rota_api::serve(self.listener, state, async move { shutdown.triggered().await }).await.context("the HTTP API failed")
    }
}

/// Arguments of `rota api`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    listen: ListenArgs,
    #[command(flatten)]
    remote: RemoteAgentArgs,
    #[command(flatten)]
    pub trace: crate::serve::TraceArgs,
}

/// `rota api`: the HTTP API alone, until SIGINT or SIGTERM. Task changes go
/// through a [`Client`] without completions, as the CLI's own commands do:
/// a `rota serve` or `rota scheduler` somewhere does the work.
pub async fn run(store_args: StoreArgs, args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(!args.listen.is_off(), "--listen {LISTEN_NONE}: `rota api` serves only the API; give it an address");
    rota_engine::client::check_input_bytes_max(args.listen.input_bytes_max).map_err(|why| anyhow!("--input-bytes-max {why}"))?;
    let mut signals = Signals::new()?;
    let listening = bind(&args.listen, &args.remote).await?;
    let store = store_args.open().await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let client =
        Client::new(store.clone(), clock.clone(), Workflows::new(store.clone()), None).with_input_bytes_max(args.listen.input_bytes_max);
    info!("rota api started: store {}", redacted(&store_args.url));
    let shutdown = Shutdown::new();
    let mut serving = tokio::spawn(listening.serve(store, client, clock, None, shutdown.clone()));
    tokio::select! {
        () = signals.next() => {
            info!("stopping: waiting for the requests in progress (send another SIGINT or SIGTERM to stop at once)");
            shutdown.trigger();
            tokio::select! {
                joined = &mut serving => joined.map_err(|err| anyhow!("the HTTP API panicked: {err}"))??,
                () = signals.next() => bail!("stopped at once by a second signal"),
            }
        }
        joined = &mut serving => {
            joined.map_err(|err| anyhow!("the HTTP API panicked: {err}"))??;
            bail!("the HTTP API stopped by itself");
        }
    }
    info!("rota api stopped");
    Ok(())
}

/// The `--auth` file: a list of tokens.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

/// One `[[tokens]]` entry: the secret (inline, or the environment variable
/// that holds it) and its scopes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    /// A name for people and error messages (never the secret), and the
    /// token's id: the submitter its tasks record.
    name: Option<String>,
    token: Option<String>,
    token_env: Option<String>,
    scopes: Vec<String>,
}

/// The tokens of the `--auth` file and of `ROTA_API_TOKEN` (`env_token`),
/// or `None` when neither configures any.
fn configured_tokens(file: Option<&Path>, env_token: Option<String>) -> anyhow::Result<Option<Vec<Token>>> {
    let mut tokens = match file {
        Some(path) => read_auth_file(path)?,
        None => Vec::new(),
    };
    if let Some(secret) = env_token {
        let token = Token::new(secret, vec![Scope::Admin]).map_err(|err| anyhow!("{TOKEN_ENV}: {}", config_message(err)))?;
        tokens.push(token);
    }
    Ok(if tokens.is_empty() { None } else { Some(tokens) })
}

/// Reads and checks an `--auth` file; every error names the file, the entry
/// and the field.
fn read_auth_file(path: &Path) -> anyhow::Result<Vec<Token>> {
    let shown = path.display();
    let size = std::fs::metadata(path).with_context(|| format!("--auth {shown}: cannot read the file"))?.len();
    anyhow::ensure!(size <= AUTH_FILE_BYTES_MAX, "--auth {shown}: the file is {size} bytes; at most {AUTH_FILE_BYTES_MAX} are read");
    let text = std::fs::read_to_string(path).with_context(|| format!("--auth {shown}: cannot read the file"))?;
    parse_auth_file(&text, &|name| std::env::var(name).ok()).map_err(|err| anyhow!("--auth {shown}: {err}"))
}

/// Parses the text of an `--auth` file, reading `token_env` variables with `env`.
fn parse_auth_file(text: &str, env: &dyn Fn(&str) -> Option<String>) -> anyhow::Result<Vec<Token>> {
    // toml's message spans several lines (a snippet of the file); the
    // position is what matters on one line.
    let file: AuthFile = toml::from_str(text).map_err(|err| {
        let position = err.span().map(|span| line_and_column(text, span.start)).unwrap_or_default();
        anyhow!("{position}{}", err.message())
    })?;
    anyhow::ensure!(file.tokens.len() <= AUTH_TOKENS_MAX, "tokens: {} entries; at most {AUTH_TOKENS_MAX}", file.tokens.len());
    let mut tokens = Vec::with_capacity(file.tokens.len());
    for (index, entry) in file.tokens.into_iter().enumerate() {
        let at = match &entry.name {
            Some(name) => format!("tokens[{index}] ({name})"),
            None => format!("tokens[{index}]"),
        };
        let secret = match (entry.token, entry.token_env) {
            (Some(secret), None) => secret,
            (None, Some(variable)) => {
                env(&variable).ok_or_else(|| anyhow!("{at}.token_env: environment variable {variable} is not set"))?
            }
            (Some(_), Some(_)) => bail!("{at}: give either token or token_env, not both"),
            (None, None) => bail!("{at}: missing field `token` (or `token_env`)"),
        };
        anyhow::ensure!(
            !entry.scopes.is_empty(),
            "{at}.scopes: give at least one scope (admin, operator, read, submit, agent:QUEUE[,QUEUE…])"
        );
        let scopes = entry
            .scopes
            .iter()
            .enumerate()
            .map(|(i, scope)| scope.parse::<Scope>().map_err(|err| anyhow!("{at}.scopes[{i}]: {}", config_message(err))))
            .collect::<anyhow::Result<Vec<Scope>>>()?;
        let token = Token::new(secret, scopes).map_err(|err| anyhow!("{at}.token: {}", config_message(err)))?;
        let token = match &entry.name {
            Some(name) => token.named(name).map_err(|err| anyhow!("{at}.name: {}", config_message(err)))?,
            None => token,
        };
        tokens.push(token);
    }
    Ok(tokens)
}

/// The message of an API configuration error without its generic prefix.
fn config_message(err: rota_api::Error) -> String {
    match err {
        rota_api::Error::Config(message) => message,
        other => other.to_string(),
    }
}

/// "line L column C: " of a byte offset in `text`.
fn line_and_column(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |tail| tail.chars().count()) + 1;
    format!("line {line} column {column}: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "a-token-of-at-least-16-bytes";

    fn check(text: &str) -> Result<usize, String> {
        let env = |name: &str| (name == "OPS_TOKEN").then(|| SECRET.to_owned());
        parse_auth_file(text, &env).map(|tokens| tokens.len()).map_err(|err| err.to_string())
    }

    #[test]
    fn tokens_come_inline_or_from_the_environment() {
        let text = format!(
            "[[tokens]]\nname = \"ops\"\ntoken_env = \"OPS_TOKEN\"\nscopes = [\"operator\"]\n\n\
             [[tokens]]\ntoken = \"{SECRET}-2\"\nscopes = [\"submit\", \"agent:agent.http,agent.exec\"]\n"
        );
        assert_eq!(check(&text), Ok(2));
        assert_eq!(check(""), Ok(0));
    }

    #[test]
    fn errors_name_the_entry_and_the_field_never_the_token() {
        let cases = [
            ("[[tokens]]\ntoken_env = \"MISSING\"\nscopes = [\"admin\"]\n", "tokens[0].token_env: environment variable MISSING is not set"),
            (
                "[[tokens]]\nname = \"ci\"\ntoken = \"short-secret\"\nscopes = [\"admin\"]\n",
                "tokens[0] (ci).token: a token must be 16 to 512",
            ),
            (&format!("[[tokens]]\ntoken = \"{SECRET}\"\nscopes = [\"root\"]\n"), "tokens[0].scopes[0]: unknown scope \"root\""),
            (&format!("[[tokens]]\ntoken = \"{SECRET}\"\nscopes = []\n"), "tokens[0].scopes: give at least one scope"),
            ("[[tokens]]\nscopes = [\"admin\"]\n", "tokens[0]: missing field `token`"),
            (&format!("[[tokens]]\ntoken = \"{SECRET}\"\ntoken_env = \"OPS_TOKEN\"\nscopes = [\"admin\"]\n"), "either token or token_env"),
            (&format!("[[tokens]]\ntoken = \"{SECRET}\"\nscope = [\"admin\"]\n"), "line 3 column 1: unknown field `scope`"),
            ("[[tokens]\n", "line 1 column"),
        ];
        for (text, expected) in cases {
            let err = check(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(!err.contains(SECRET) && !err.contains("short-secret"), "{err}");
        }
    }

    #[test]
    fn the_environment_token_is_one_admin_token() {
        assert!(configured_tokens(None, None).unwrap().is_none());
        assert_eq!(configured_tokens(None, Some(SECRET.to_owned())).unwrap().unwrap().len(), 1);
        let err = configured_tokens(None, Some("short".to_owned())).unwrap_err().to_string();
        assert!(err.starts_with("ROTA_API_TOKEN: a token must be"), "{err}");
    }

    #[test]
    fn remote_agents_and_the_worker_key_are_checked() {
        let names = RemoteAgentArgs { remote_agents: vec!["py-payments".into(), " ledger".into()] }.names().unwrap();
        assert_eq!(names.iter().map(AgentName::as_str).collect::<Vec<_>>(), ["py-payments", "ledger"]);
        let err = RemoteAgentArgs { remote_agents: vec!["has space".into()] }.names().unwrap_err().to_string();
        assert!(err.starts_with("--remote-agent \"has space\""), "{err}");
        let workers = worker_config(names, Some("k".repeat(LeaseKey::BYTES_MIN))).unwrap();
        assert_eq!(workers.remote_agents.len(), 2);
        let err = worker_config(Vec::new(), Some("short".into())).unwrap_err().to_string();
        assert!(err.starts_with("ROTA_WORKER_KEY: "), "{err}");
        assert!(!err.contains("short"), "the key is never repeated: {err}");
    }

    #[tokio::test]
    async fn no_tokens_means_loopback_only() {
        // bind() reads ROTA_API_TOKEN, which this test does not set (setting
        // it would race with the other tests); skip when the environment has it.
        if secret_env(TOKEN_ENV).is_some() || secret_env(WORKER_KEY_ENV).is_some() {
            return;
        }
        let args = |listen: &str, insecure: bool| ListenArgs {
            listen: Some(listen.to_owned()),
            auth_file: None,
            insecure_no_auth: insecure,
            input_bytes_max: rota_engine::client::INPUT_BYTES_MAX_DEFAULT,
            pending_max: None,
        };
        let no_remote = RemoteAgentArgs::default();
        let bound = bind(&args("127.0.0.1:0", false), &no_remote).await.unwrap();
        assert!(bound.address.ip().is_loopback() && bound.address.port() != 0);
        let err = bind(&args("0.0.0.0:0", false), &no_remote).await.err().unwrap().to_string();
        assert!(err.starts_with("--listen 0.0.0.0:0: refusing") && err.contains("--insecure-no-auth"), "{err}");
        assert!(bind(&args("0.0.0.0:0", true), &no_remote).await.is_ok());
        let err = bind(&args("not an address", false), &no_remote).await.err().unwrap().to_string();
        assert!(err.starts_with("--listen not an address"), "{err}");

        // A busy port is an error, except the default one in `rota serve`.
        let taken = bound.address.to_string();
        let err = bind(&args(&taken, false), &no_remote).await.err().unwrap();
        assert!(format!("{err:#}").starts_with(&format!("--listen {taken}: cannot listen")), "{err:#}");
        assert!(!args(&taken, false).is_default_in_use(&err));
        let implicit = ListenArgs {
            listen: None,
            auth_file: None,
            insecure_no_auth: false,
            input_bytes_max: rota_engine::client::INPUT_BYTES_MAX_DEFAULT,
            pending_max: None,
        };
        assert!(implicit.is_default_in_use(&err));
    }
}
