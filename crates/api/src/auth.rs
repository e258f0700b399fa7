//! Bearer tokens and scopes.
//!
//! The configuration is a list of tokens, each with its scopes; the binary
//! reads it (from a file or the environment) and builds an [`AuthConfig`].
//! Every `/v1` route needs one [`Permission`]; a request without a token,
//! or with one that is not configured, gets 401 with `WWW-Authenticate:
//! Bearer`; a known token whose scopes do not grant the permission gets 403.
//!
//! Tokens are compared in constant time (their SHA-256 digests, with
//! `subtle`; every configured token is compared, whatever matches), and
//! they never reach a log: [`AuthConfig`]'s
//! `Debug` shows only how many there are.
//!
//! The dashboard signs in with a token once and then sends a session
//! cookie ([`SESSION_COOKIE`], HttpOnly, SameSite=Strict) instead: it grants
//! what the token grants, and a change made with it must also carry the
//! page's CSRF proof ([`CSRF_HEADER`]). A change without a bearer token is
//! refused when the browser says it comes from another site (`Origin`,
//! `Sec-Fetch-Site`), with authentication or without.
//!
//! Every token has an id ([`Token::id`]): its name in the `--auth` file, or
//! `token:` and the start of its SHA-256 digest. A task submitted with a
//! token records that id as its submitter. A caller whose scopes grant no
//! [`Permission::Read`] (the `submit` scope alone) is *confined*
//! ([`Caller::confined_to`]): it may read, list, follow the events of and
//! signal only the tasks it submitted; any other task answers 404, as if it
//! did not exist, and submitting an id another caller's task has is refused.
//!
//! The worker-protocol endpoints (`/v1/workers/{agent}/…`) need
//! [`Permission::Work`] on the agent in the path: `admin`, or an `agent`
//! scope that names the agent's queue (`agent.<name>`) or the agent.

use std::fmt;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use rota_model::{QueueName, Timestamp};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ApiState;
use crate::error::ApiError;

/// The shortest token accepted: a guessable token is no protection.
pub const TOKEN_BYTES_MIN: usize = 16;
/// The longest token accepted (tokens travel in every request's headers).
pub const TOKEN_BYTES_MAX: usize = 512;

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything.
    Admin,
    /// Read everything; cancel and resubmit tasks; pause and resume queues;
    /// list, redrive and purge dead letters; validate and register workflows.
    Operator,
    /// Read everything, change nothing: for dashboards and people on call
    /// who watch but do not act.
    Read,
    /// Submit tasks; read, list, follow and signal the tasks it submitted.
    Submit,
    /// An external agent that may use the worker protocol on the named
    /// queues (`agent.<name>`, or the agent's bare name), and nothing else.
    Agent {
        /// The queues it may receive from.
        queues: Vec<QueueName>,
    },
}

impl Scope {
    /// Whether this scope grants `permission` on every route that needs
    /// it. [`Permission::Work`] is granted per agent: see [`Scope::grants_work`].
    pub fn grants(&self, permission: Permission) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Operator => matches!(permission, Permission::Read | Permission::ReadTask | Permission::Operate | Permission::Signal),
            Scope::Read => matches!(permission, Permission::Read | Permission::ReadTask),
            Scope::Submit => matches!(permission, Permission::Submit | Permission::ReadTask | Permission::Signal),
            Scope::Agent { .. } => false,
        }
    }

    /// Whether this scope may use the worker protocol for `agent` (the
    /// name in the path, not yet validated): `admin`, or an `agent` scope
    /// naming its queue `agent.<agent>` or the agent itself.
    pub fn grants_work(&self, agent: &str) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Agent { queues } => {
                queues.iter().any(|queue| queue.as_str() == agent || queue.as_str().strip_prefix("agent.") == Some(agent))
            }
            Scope::Operator | Scope::Read | Scope::Submit => false,
        }
    }

    /// The scope's name as configured (`admin`, `operator`, `read`, `submit`, `agent`).
    pub fn name(&self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Operator => "operator",
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Agent { .. } => "agent",
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = crate::Error;

    /// `admin`, `operator`, `read`, `submit`, or `agent:QUEUE[,QUEUE…]` (the queues
    /// an external agent may receive from), as a configuration file names them.
    fn from_str(text: &str) -> Result<Scope, crate::Error> {
        match text {
            "admin" => Ok(Scope::Admin),
            "operator" => Ok(Scope::Operator),
            "read" => Ok(Scope::Read),
            "submit" => Ok(Scope::Submit),
            other => match other.strip_prefix("agent:") {
                Some(list) => {
                    let queues = list
                        .split(',')
                        .map(|name| QueueName::new(name.trim()).map_err(|err| crate::Error::Config(format!("scope {other:?}: {err}"))))
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(Scope::Agent { queues })
                }
                None => Err(crate::Error::Config(format!(
                    "unknown scope {other:?} (expected admin, operator, read, submit or agent:QUEUE[,QUEUE…])"
                ))),
            },
        }
    }
}

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// Read anything: listings, alerts, queues, dead letters, workflows, metrics, all events.
    Read,
    /// Read one task (status, history, events) by its id, or list tasks;
    /// a confined caller only its own.
    ReadTask,
    /// Submit a task.
    Submit,
    /// Send a signal to a task; a confined caller only to its own.
    Signal,
    /// Change things: cancel, resubmit, pause, resume, redrive, purge, register.
    Operate,
    /// Receive, renew, complete and fail the step requests of the agent
    /// named in the path (the worker protocol).
    Work,
}

impl Permission {
    fn describe(self) -> &'static str {
        match self {
            Permission::Read => "read access (scope admin or operator)",
            Permission::ReadTask => "reading tasks (scope admin, operator, read, or submit for its own tasks)",
            Permission::Signal => "signalling a task (scope admin, operator, or submit for its own tasks)",
            Permission::Submit => "submitting tasks (scope admin or submit)",
            Permission::Operate => "operating (scope admin or operator)",
            Permission::Work => "working on this agent's queue (scope admin, or agent naming the queue)",
        }
    }
}

/// The longest token name.
pub const TOKEN_NAME_BYTES_MAX: usize = 64;

/// One configured token and its scopes.
#[derive(Clone)]
pub struct Token {
    secret: Vec<u8>,
    scopes: Vec<Scope>,
    id: String,
}

impl Token {
    /// A token with its scopes. Refuses tokens shorter than
    /// [`TOKEN_BYTES_MIN`] or longer than [`TOKEN_BYTES_MAX`], with
    /// characters that cannot travel in a header, and empty scope lists.
    /// The error never repeats the token.
    pub fn new(secret: impl Into<String>, scopes: Vec<Scope>) -> Result<Token, crate::Error> {
        let secret: String = secret.into();
        if secret.len() < TOKEN_BYTES_MIN || secret.len() > TOKEN_BYTES_MAX {
            return Err(crate::Error::Config(format!(
                "a token must be {TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX} bytes long, one is {} bytes",
                secret.len()
            )));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(crate::Error::Config("a token may only contain visible ASCII characters (no spaces)".into()));
        }
        if scopes.is_empty() {
            return Err(crate::Error::Config("a token needs at least one scope".into()));
        }
        let digest = Sha256::digest(secret.as_bytes());
        let id = format!("token:{}", digest[..6].iter().map(|b| format!("{b:02x}")).collect::<String>());
        Ok(Token { secret: secret.into_bytes(), scopes, id })
    }

    /// The token with a name, which becomes its id: 1 to
    /// [`TOKEN_NAME_BYTES_MAX`] visible ASCII characters, not starting with
    /// `token:` (the ids of unnamed tokens).
    pub fn named(mut self, name: &str) -> Result<Token, crate::Error> {
        if name.is_empty() || name.len() > TOKEN_NAME_BYTES_MAX || !name.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
            return Err(crate::Error::Config(format!(
                "a token name must be 1 to {TOKEN_NAME_BYTES_MAX} visible ASCII characters, got {name:?}"
            )));
        }
        if name.starts_with("token:") {
            return Err(crate::Error::Config(format!("a token name must not start with \"token:\", got {name:?}")));
        }
        self.id = name.to_owned();
        Ok(self)
    }

    /// The token's scopes.
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }

    /// Who the token is, as a task's submitter records it: its name, or
    /// `token:` and the first 12 hex digits of its SHA-256 digest (which
    /// does not reveal the token).
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scopes: Vec<&str> = self.scopes.iter().map(Scope::name).collect();
        write!(f, "Token({}, {scopes:?})", self.id)
    }
}

/// Who may call the API.
#[derive(Clone)]
pub enum AuthConfig {
    /// No authentication: every request may do everything. For local use
    /// only; it must be chosen explicitly.
    Disabled,
    /// Bearer tokens with scopes.
    Tokens(Vec<Token>),
}

impl AuthConfig {
    /// Bearer tokens. Refuses an empty list (that would lock everyone out;
    /// [`AuthConfig::Disabled`] says what is meant) and duplicate tokens.
    pub fn tokens(tokens: Vec<Token>) -> Result<AuthConfig, crate::Error> {
        if tokens.is_empty() {
            return Err(crate::Error::Config("no tokens configured: give at least one, or disable authentication explicitly".into()));
        }
        for (i, token) in tokens.iter().enumerate() {
            if tokens[..i].iter().any(|earlier| earlier.secret == token.secret) {
                return Err(crate::Error::Config(format!("token number {} is configured twice", i + 1)));
            }
            if tokens[..i].iter().any(|earlier| earlier.id == token.id) {
                return Err(crate::Error::Config(format!("token number {} has the id {} of an earlier one", i + 1, token.id)));
            }
        }
        Ok(AuthConfig::Tokens(tokens))
    }

    /// The scopes of the token `presented`, if it is configured. Every
    /// configured token is compared in full, in constant time per byte, so
    /// the time taken says nothing about which one (or how much of one) matched.
    fn token_of(&self, presented: &[u8]) -> Option<&Token> {
        let AuthConfig::Tokens(tokens) = self else { return None };
        let mut found = None;
        for token in tokens {
            if constant_time_eq(&token.secret, presented) {
                found = Some(token);
            }
        }
        found
    }
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthConfig::Disabled => f.write_str("AuthConfig::Disabled"),
            AuthConfig::Tokens(tokens) => write!(f, "AuthConfig::Tokens({tokens:?})"),
        }
    }
}

/// Equality that takes the same time whatever the contents: the SHA-256
/// digests of both inputs (of one length whatever theirs) compared with
/// `subtle`, whose comparison the optimizer cannot cut short.
fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    Sha256::digest(expected).as_slice().ct_eq(Sha256::digest(presented).as_slice()).into()
}

/// The permission a `/v1` route needs, by method and route pattern.
/// Unknown routes need `Read`, so a route added without an entry here is
/// closed to `submit` tokens rather than open to everyone.
pub fn permission(method: &Method, route: &str) -> Permission {
    match (method.as_str(), route) {
        ("POST", "/v1/tasks") => Permission::Submit,
        (_, route) if route.starts_with("/v1/workers/") => Permission::Work,
        ("GET", "/v1/tasks" | "/v1/tasks/{id}" | "/v1/tasks/{id}/history" | "/v1/tasks/{id}/events") => Permission::ReadTask,
        ("POST", "/v1/tasks/{id}/signals/{name}") => Permission::Signal,
        ("GET", _) => Permission::Read,
        ("POST", "/v1/workflows/validate") => Permission::Read,
        _ => Permission::Operate,
    }
}

/// Who made a request, as the history records it (a signal's sender): how
/// it authenticated and the scopes it had. Tokens carry no name, so this is
/// all the API knows of a caller.
#[derive(Debug, Clone)]
pub struct Caller {
    via: &'static str,
    scopes: Vec<&'static str>,
    /// The token's id, when a token (or its session) authenticated.
    id: Option<String>,
    /// Whether it may only see its own tasks.
    confined: bool,
}

impl Caller {
    /// A caller on an API without authentication.
    pub fn anonymous() -> Caller {
        Caller { via: "api without authentication", scopes: Vec::new(), id: None, confined: false }
    }

    /// Who submits a task this caller submits ([`Token::id`]), when known.
    pub fn submitter(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The submitter whose tasks alone this caller may see, when its
    /// scopes grant no [`Permission::Read`] (the `submit` scope alone).
    pub fn confined_to(&self) -> Option<&str> {
        if self.confined { Some(self.id.as_deref().unwrap_or_default()) } else { None }
    }

    /// Whether this caller may see a task `submitter` submitted.
    pub fn may_see(&self, submitter: Option<&str>) -> bool {
        self.confined_to().is_none_or(|me| submitter == Some(me))
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scopes.is_empty() {
            return f.write_str(self.via);
        }
        write!(f, "{} with scope {}", self.via, self.scopes.join(", "))?;
        match &self.id {
            Some(id) => write!(f, " ({id})"),
            None => Ok(()),
        }
    }
}

/// The middleware of every protected route: authenticates (401) and checks
/// the route's permission (403) before any extractor reads the request. It
/// leaves the [`Caller`] in the request's extensions.
pub async fn authorize(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let auth = &state.inner.config.auth;
    let headers = request.headers();
    let with_bearer = headers.contains_key(header::AUTHORIZATION);
    let changes_something = !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    // A bearer token cannot be attached by another site; a cookie can.
    if changes_something
        && !with_bearer
        && let Err(why) = same_origin(headers)
    {
        return ApiError::forbidden(why).into_response();
    }
    if matches!(auth, AuthConfig::Disabled) {
        request.extensions_mut().insert(Caller::anonymous());
        return next.run(request).await;
    }
    let route = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    let needed = permission(request.method(), &route);
    let token = if with_bearer {
        match bearer(headers) {
            Err(why) => return ApiError::unauthorized(why).into_response(),
            Ok(presented) => match auth.token_of(presented) {
                Some(token) => token,
                None => return ApiError::unauthorized("the bearer token is not valid").into_response(),
            },
        }
    } else if let Some(session) = cookie(headers, SESSION_COOKIE) {
        let Some(token) = auth.session_token(session, state.clock().now()) else {
            return ApiError::unauthorized("the dashboard session has expired or its token is no longer configured: sign in again")
                .into_response();
        };
        if changes_something && !auth.csrf_matches(session, headers.get(CSRF_HEADER).map(|value| value.as_bytes())) {
            return ApiError::forbidden(format!("a change made with the dashboard's session needs the {CSRF_HEADER} header of its page"))
                .into_response();
        }
        token
    } else {
        return ApiError::unauthorized("this request needs a bearer token (Authorization: Bearer …)").into_response();
    };
    let scopes = token.scopes.as_slice();
    let granted = match needed {
        Permission::Work => {
            let agent = agent_in_path(request.uri().path());
            scopes.iter().any(|scope| scope.grants_work(&agent))
        }
        _ => scopes.iter().any(|scope| scope.grants(needed)),
    };
    let names: Vec<&'static str> = scopes.iter().map(Scope::name).collect();
    if !granted {
        let why = format!("{} {route} needs {}; the token has scope {}", request.method(), needed.describe(), names.join(", "));
        return ApiError::forbidden(why).into_response();
    }
    let via = if with_bearer { "api token" } else { "dashboard session" };
    let confined = !scopes.iter().any(|scope| scope.grants(Permission::Read));
    request.extensions_mut().insert(Caller { via, scopes: names, id: Some(token.id.clone()), confined });
    next.run(request).await
}

/// The agent of a `/v1/workers/{agent}/…` path, percent-decoded (an
/// undecodable one matches no scope, and the handler refuses it).
fn agent_in_path(path: &str) -> String {
    let segment = path.strip_prefix("/v1/workers/").and_then(|rest| rest.split('/').next()).unwrap_or_default();
    percent_decode(segment).unwrap_or_default()
}

/// `%XX` escapes decoded; `None` when they do not make UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The dashboard's session cookie: a signed expiry time, HttpOnly and
/// SameSite=Strict, set by the login form.
pub const SESSION_COOKIE: &str = "rota_session";
/// The header that carries a dashboard page's proof that a change comes
/// from it (the page gets the value from [`AuthConfig::csrf_token`]).
pub const CSRF_HEADER: &str = "x-csrf-token";

impl AuthConfig {
    /// A session cookie's value for the token `presented`, valid until
    /// `until`, with the token's scopes; `None` if the token is not
    /// configured. The value names no token: it is the expiry time signed
    /// with the token's secret, so any API process configured with the same
    /// token accepts it, and removing the token ends its sessions.
    pub fn open_session(&self, presented: &[u8], until: Timestamp) -> Option<(String, &[Scope])> {
        let scopes = self.token_of(presented)?.scopes.as_slice();
        let expiry = until.as_millis().to_string();
        let tag = session_mac(presented, &expiry).finalize().into_bytes();
        Some((format!("{expiry}.{}", URL_SAFE_NO_PAD.encode(tag)), scopes))
    }

    /// The scopes of the token that signed the session cookie `session`, if
    /// it is well formed, signed by a configured token and not expired at `now`.
    pub fn session_scopes(&self, session: &str, now: Timestamp) -> Option<&[Scope]> {
        self.session_token(session, now).map(|token| token.scopes.as_slice())
    }

    /// The value the pages of `session` send in [`CSRF_HEADER`]: a MAC of
    /// the session under its token, which another site can neither read
    /// (the cookie is HttpOnly) nor compute.
    pub fn csrf_token(&self, session: &str, now: Timestamp) -> Option<String> {
        let token = self.session_token(session, now)?;
        Some(URL_SAFE_NO_PAD.encode(csrf_mac(&token.secret, session).finalize().into_bytes()))
    }

    fn csrf_matches(&self, session: &str, presented: Option<&[u8]>) -> bool {
        let (Some(presented), AuthConfig::Tokens(tokens)) = (presented, self) else { return false };
        let Ok(tag) = URL_SAFE_NO_PAD.decode(presented) else { return false };
        // Whichever token signed the session: `session_scopes` already
        // refused a session no configured token signed.
        tokens.iter().fold(false, |matched, token| csrf_mac(&token.secret, session).verify_slice(&tag).is_ok() | matched)
    }

    fn session_token(&self, session: &str, now: Timestamp) -> Option<&Token> {
        let AuthConfig::Tokens(tokens) = self else { return None };
        let (expiry, tag) = session.split_once('.')?;
        let until: i64 = expiry.parse().ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        if until <= now.as_millis() {
            return None;
        }
        // Every token is tried, so the time taken does not say which one signed it.
        tokens
            .iter()
            .fold(None, |found, token| if session_mac(&token.secret, expiry).verify_slice(&tag).is_ok() { Some(token) } else { found })
    }
}

fn session_mac(secret: &[u8], expiry: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(b"rota dashboard session\0");
    mac.update(expiry.as_bytes());
    mac
}

fn csrf_mac(secret: &[u8], session: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(b"rota dashboard csrf\0");
    mac.update(session.as_bytes());
    mac
}

/// The value of the cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Refuses a request that a browser says comes from another site: its
/// `Sec-Fetch-Site` is `cross-site` or `same-site`, or its `Origin` is not
/// the host it was sent to. Programs that send neither header pass.
pub fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return Err(format!("refused a request from another site (Sec-Fetch-Site: {site})"));
    }
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|value| value.to_str().ok()) {
        let host = headers.get(header::HOST).and_then(|value| value.to_str().ok()).unwrap_or_default();
        let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest);
        if origin_host != host {
            return Err(format!("refused a request from another origin ({origin} is not {host})"));
        }
    }
    Ok(())
}

/// The token of an `Authorization: Bearer …` header.
fn bearer(headers: &HeaderMap) -> Result<&[u8], &'static str> {
    let value = headers.get(header::AUTHORIZATION).ok_or("this request needs a bearer token (Authorization: Bearer …)")?;
    let value = value.as_bytes();
    let scheme = b"bearer ";
    if value.len() <= scheme.len() || !value[..scheme.len()].eq_ignore_ascii_case(scheme) {
        return Err("the Authorization header must be `Bearer <token>`");
    }
    Ok(value[scheme.len()..].trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abc\0", b"abc"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn tokens_are_checked_and_never_shown() {
        let err = Token::new("short", vec![Scope::Admin]).unwrap_err().to_string();
        assert!(err.contains("16 to 512 bytes") && !err.contains("short"), "{err}");
        assert!(Token::new("x".repeat(20), vec![]).is_err());
        assert!(Token::new("with a space in the token", vec![Scope::Admin]).is_err());
        let token = Token::new("s3cret-s3cret-s3cret", vec![Scope::Operator]).unwrap();
        let shown = format!("{:?}", AuthConfig::tokens(vec![token.clone()]).unwrap());
        assert!(!shown.contains("s3cret") && shown.contains("operator"), "{shown}");
        assert!(AuthConfig::tokens(vec![]).is_err());
        assert!(AuthConfig::tokens(vec![token.clone(), token]).is_err(), "duplicates are refused");
    }

    #[test]
    fn scopes_grant_what_the_docs_say() {
        use Permission::*;
        let all = [Read, ReadTask, Submit, Signal, Operate, Work];
        let granted = |scope: Scope| all.into_iter().filter(|p| scope.grants(*p)).collect::<Vec<_>>();
        assert_eq!(granted(Scope::Admin), all);
        assert_eq!(granted(Scope::Operator), [Read, ReadTask, Signal, Operate]);
        assert_eq!(granted(Scope::Read), [Read, ReadTask]);
        assert_eq!(granted(Scope::Submit), [ReadTask, Submit, Signal]);
        let agent = Scope::Agent { queues: vec![QueueName::new("agent.py").unwrap(), QueueName::new("ledger").unwrap()] };
        assert!(granted(agent.clone()).is_empty(), "work is granted per agent only");
        assert!(agent.grants_work("py") && agent.grants_work("ledger"));
        assert!(!agent.grants_work("agent.ledger") && !agent.grants_work("http") && !agent.grants_work(""));
        assert!(Scope::Admin.grants_work("anything"));
        assert!(!Scope::Operator.grants_work("py") && !Scope::Submit.grants_work("py"));
    }

    #[test]
    fn tokens_have_ids_that_do_not_reveal_them() {
        let token = Token::new("s3cret-s3cret-s3cret", vec![Scope::Submit]).unwrap();
        assert!(token.id().starts_with("token:") && token.id().len() == "token:".len() + 12, "{}", token.id());
        assert!(!token.id().contains("s3cret"));
        assert_eq!(token.id(), Token::new("s3cret-s3cret-s3cret", vec![Scope::Admin]).unwrap().id(), "stable");
        assert_ne!(token.id(), Token::new("s3cret-s3cret-s3creT", vec![Scope::Submit]).unwrap().id());
        let named = token.clone().named("shop").unwrap();
        assert_eq!(named.id(), "shop");
        assert!(format!("{named:?}").contains("shop") && !format!("{named:?}").contains("s3cret"));
        assert!(token.clone().named("").is_err() && token.clone().named("token:x").is_err());
        let other = Token::new("another-secret-0123", vec![Scope::Submit]).unwrap().named("shop").unwrap();
        let err = AuthConfig::tokens(vec![named, other]).unwrap_err().to_string();
        assert!(err.contains("token number 2 has the id shop"), "{err}");
    }

    #[test]
    fn the_agent_is_read_from_worker_paths() {
        assert_eq!(agent_in_path("/v1/workers/py-payments/receive"), "py-payments");
        assert_eq!(agent_in_path("/v1/workers/a%2Eb/renew"), "a.b");
        assert_eq!(agent_in_path("/v1/workers/%FF/renew"), "");
        assert_eq!(agent_in_path("/v1/workers/%4/renew"), "");
    }

    #[test]
    fn scopes_parse_from_their_configured_names() {
        assert_eq!("admin".parse::<Scope>().unwrap(), Scope::Admin);
        assert_eq!("operator".parse::<Scope>().unwrap(), Scope::Operator);
        assert_eq!("submit".parse::<Scope>().unwrap(), Scope::Submit);
        assert_eq!("read".parse::<Scope>().unwrap(), Scope::Read);
        let queues = vec![QueueName::new("agent.http").unwrap(), QueueName::new("agent.exec").unwrap()];
        assert_eq!("agent:agent.http, agent.exec".parse::<Scope>().unwrap(), Scope::Agent { queues });
        assert!("agent:".parse::<Scope>().unwrap_err().to_string().contains("queue name"));
        assert!("root".parse::<Scope>().unwrap_err().to_string().contains("unknown scope \"root\""));
    }

    #[test]
    fn a_session_carries_its_token_scopes_until_it_expires() {
        let operator = Token::new("operator-token-0123456789", vec![Scope::Operator]).unwrap();
        let reader = Token::new("read-only-token-0123456789", vec![Scope::Read]).unwrap();
        let auth = AuthConfig::tokens(vec![operator, reader]).unwrap();
        let until = Timestamp::from_millis(10_000);
        let (session, scopes) = auth.open_session(b"read-only-token-0123456789", until).unwrap();
        assert_eq!(scopes, [Scope::Read]);
        assert!(!session.contains("read-only"), "the cookie does not carry the token: {session}");
        assert_eq!(auth.session_scopes(&session, Timestamp::from_millis(9_999)), Some(&[Scope::Read][..]));
        assert_eq!(auth.session_scopes(&session, until), None, "expired");
        assert!(auth.open_session(b"not-a-configured-token", until).is_none());
        // Another expiry under the same tag, or a tag of a token no longer configured, is refused.
        let (_, tag) = session.split_once('.').unwrap();
        assert_eq!(auth.session_scopes(&format!("99999.{tag}"), Timestamp::from_millis(0)), None);
        let other = AuthConfig::tokens(vec![Token::new("operator-token-0123456789", vec![Scope::Operator]).unwrap()]).unwrap();
        assert_eq!(other.session_scopes(&session, Timestamp::from_millis(0)), None);
        for garbage in ["", ".", "abc", "1.", "1.!!!"] {
            assert_eq!(auth.session_scopes(garbage, Timestamp::from_millis(0)), None, "{garbage:?}");
        }
    }

    #[test]
    fn the_csrf_proof_is_bound_to_its_session() {
        let auth = AuthConfig::tokens(vec![Token::new("operator-token-0123456789", vec![Scope::Operator]).unwrap()]).unwrap();
        let (first, _) = auth.open_session(b"operator-token-0123456789", Timestamp::from_millis(10_000)).unwrap();
        let (second, _) = auth.open_session(b"operator-token-0123456789", Timestamp::from_millis(20_000)).unwrap();
        let proof = auth.csrf_token(&first, Timestamp::from_millis(0)).unwrap();
        assert!(auth.csrf_matches(&first, Some(proof.as_bytes())));
        assert!(!auth.csrf_matches(&second, Some(proof.as_bytes())), "another session's proof");
        assert!(!auth.csrf_matches(&first, None));
        assert!(!auth.csrf_matches(&first, Some(b"")));
        assert!(!AuthConfig::Disabled.csrf_matches(&first, Some(proof.as_bytes())));
    }

    #[test]
    fn requests_from_other_sites_are_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        assert!(same_origin(&headers(&[])).is_ok(), "a program sends neither header");
        assert!(same_origin(&headers(&[("host", "127.0.0.1:7878"), ("origin", "http://127.0.0.1:7878")])).is_ok());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])).is_ok());
        assert!(same_origin(&headers(&[("host", "127.0.0.1:7878"), ("origin", "https://evil.example")])).is_err());
        assert!(same_origin(&headers(&[("host", "127.0.0.1:7878"), ("origin", "null")])).is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "cross-site")])).is_err());
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-site")])).is_err());
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, "a=1; rota_session=123.abc".parse().unwrap());
        headers.append(header::COOKIE, "b=2".parse().unwrap());
        assert_eq!(cookie(&headers, "rota_session"), Some("123.abc"));
        assert_eq!(cookie(&headers, "b"), Some("2"));
        assert_eq!(cookie(&headers, "rota"), None);
    }

    #[test]
    fn bearer_headers_are_parsed_strictly() {
        let headers = |value: &str| {
            let mut map = HeaderMap::new();
            map.insert(header::AUTHORIZATION, value.parse().unwrap());
            map
        };
        assert_eq!(bearer(&headers("Bearer abc")).unwrap(), b"abc");
        assert_eq!(bearer(&headers("bearer  abc ")).unwrap(), b"abc");
        assert!(bearer(&headers("Basic abc")).is_err());
        assert!(bearer(&headers("Bearer")).is_err());
        assert!(bearer(&HeaderMap::new()).is_err());
    }
}
