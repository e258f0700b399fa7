//! Bearer tokens and scopes.
//!
//! The configuration is a list of tokens, each with its scopes; the binary
//! reads it (from a file or the environment) and builds an [`AuthConfig`].
//! Every `/v1` route needs one [`Permission`]; a request without a token,
//! or with one that is not configured, gets 401 with `WWW-Authenticate:
//! Bearer`; a known token whose scopes do not grant the permission gets 403.
//!
//! Tokens are compared in constant time (every configured token is compared
//! in full, whatever matches), and they never reach a log: [`AuthConfig`]'s
//! `Debug` shows only how many there are.
//!
//! The dashboard signs in with a token once and then sends a session
//! cookie ([`SESSION_COOKIE`], HttpOnly, SameSite=Strict) instead: it grants
//! what the token grants, and a change made with it must also carry the
//! page's CSRF proof ([`CSRF_HEADER`]). A change without a bearer token is
//! refused when the browser says it comes from another site (`Origin`,
//! `Sec-Fetch-Site`), with authentication or without.
//!
//! Deliberately left out: per-task ownership for the `submit` scope (the
//! task record has no submitter yet, so a `submit` token may read any task
//! whose id it knows, but never list them).
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
use sha2::Sha256;

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
    /// Submit tasks and read a task by its id.
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
            Scope::Operator => matches!(permission, Permission::Read | Permission::ReadTask | Permission::Operate),
            Scope::Read => matches!(permission, Permission::Read | Permission::ReadTask),
            Scope::Submit => matches!(permission, Permission::Submit | Permission::ReadTask),
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
    /// Read one task (status, history, events) by its id.
    ReadTask,
    /// Submit a task.
    Submit,
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
            Permission::ReadTask => "reading a task (scope admin, operator or submit)",
            Permission::Submit => "submitting tasks (scope admin or submit)",
            Permission::Operate => "operating (scope admin or operator)",
            Permission::Work => "working on this agent's queue (scope admin, or agent naming the queue)",
        }
    }
}

/// One configured token and its scopes.
#[derive(Clone)]
pub struct Token {
    secret: Vec<u8>,
    scopes: Vec<Scope>,
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
        Ok(Token { secret: secret.into_bytes(), scopes })
    }

    /// The token's scopes.
    pub fn scopes(&self) -> &[Scope] {
        &self.scopes
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scopes: Vec<&str> = self.scopes.iter().map(Scope::name).collect();
        write!(f, "Token(<redacted>, {scopes:?})")
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
        }
        Ok(AuthConfig::Tokens(tokens))
    }

    /// The scopes of the token `presented`, if it is configured. Every
    /// configured token is compared in full, in constant time per byte, so
    /// the time taken says nothing about which one (or how much of one) matched.
    fn scopes_of(&self, presented: &[u8]) -> Option<&[Scope]> {
        let AuthConfig::Tokens(tokens) = self else { return None };
        let mut found = None;
        for token in tokens {
            if constant_time_eq(&token.secret, presented) {
                found = Some(token.scopes.as_slice());
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

/// Equality that takes the same time whatever the contents: it looks at
/// every byte of the longer input.
fn constant_time_eq(expected: &[u8], presented: &[u8]) -> bool {
    let length = expected.len().max(presented.len());
    let mut difference = (expected.len() ^ presented.len()) as u64;
    for i in 0..length {
        let a = expected.get(i).copied().unwrap_or(0);
        let b = presented.get(i).copied().unwrap_or(0);
        difference |= u64::from(a ^ b);
    }
    std::hint::black_box(difference) == 0
}

/// The permission a `/v1` route needs, by method and route pattern.
/// Unknown routes need `Read`, so a route added without an entry here is
/// closed to `submit` tokens rather than open to everyone.
pub fn permission(method: &Method, route: &str) -> Permission {
    match (method.as_str(), route) {
        ("POST", "/v1/tasks") => Permission::Submit,
        (_, route) if route.starts_with("/v1/workers/") => Permission::Work,
        ("GET", "/v1/tasks/{id}" | "/v1/tasks/{id}/history" | "/v1/tasks/{id}/events") => Permission::ReadTask,
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
}

impl Caller {
    /// A caller on an API without authentication.
    pub fn anonymous() -> Caller {
        Caller { via: "api without authentication", scopes: Vec::new() }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.scopes.is_empty() {
            return f.write_str(self.via);
        }
        write!(f, "{} with scope {}", self.via, self.scopes.join(", "))
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
    let scopes = if with_bearer {
        match bearer(headers) {
            Err(why) => return ApiError::unauthorized(why).into_response(),
            Ok(presented) => match auth.scopes_of(presented) {
                Some(scopes) => scopes,
                None => return ApiError::unauthorized("the bearer token is not valid").into_response(),
            },
        }
    } else if let Some(session) = cookie(headers, SESSION_COOKIE) {
        let Some(scopes) = auth.session_scopes(session, state.clock().now()) else {
            return ApiError::unauthorized("the dashboard session has expired or its token is no longer configured: sign in again")
                .into_response();
        };
        if changes_something && !auth.csrf_matches(session, headers.get(CSRF_HEADER).map(|value| value.as_bytes())) {
            return ApiError::forbidden(format!("a change made with the dashboard's session needs the {CSRF_HEADER} header of its page"))
                .into_response();
        }
        scopes
    } else {
        return ApiError::unauthorized("this request needs a bearer token (Authorization: Bearer …)").into_response();
    };
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
    request.extensions_mut().insert(Caller { via, scopes: names });
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
        let scopes = self.scopes_of(presented)?;
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
        let all = [Read, ReadTask, Submit, Operate, Work];
        let granted = |scope: Scope| all.into_iter().filter(|p| scope.grants(*p)).collect::<Vec<_>>();
        assert_eq!(granted(Scope::Admin), all);
        assert_eq!(granted(Scope::Operator), [Read, ReadTask, Operate]);
        assert_eq!(granted(Scope::Read), [Read, ReadTask]);
        assert_eq!(granted(Scope::Submit), [ReadTask, Submit]);
        let agent = Scope::Agent { queues: vec![QueueName::new("agent.py").unwrap(), QueueName::new("ledger").unwrap()] };
        assert!(granted(agent.clone()).is_empty(), "work is granted per agent only");
        assert!(agent.grants_work("py") && agent.grants_work("ledger"));
        assert!(!agent.grants_work("agent.ledger") && !agent.grants_work("http") && !agent.grants_work(""));
        assert!(Scope::Admin.grants_work("anything"));
        assert!(!Scope::Operator.grants_work("py") && !Scope::Submit.grants_work("py"));
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
