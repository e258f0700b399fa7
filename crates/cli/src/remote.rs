//! A small client of a rota server's HTTP API (`--server URL`, `--token`),
//! for the operator commands. It speaks the API's wire types
//! ([`rota_api::wire`]) and turns its JSON errors into [`Error`]s that keep
//! the stable code (so that a command can word them as the local path
//! does) and the reason.
//!
//! Deliberately left out: retries (an operator runs the command again;
//! submits are idempotent by task id), and following server-sent events
//! (`submit --wait` polls, as it does on a local store).

use std::time::Duration;

use anyhow::{Context, anyhow};
use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// How long one request may take before the command gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most bytes of a non-JSON error body repeated in a message.
const ERROR_BODY_CHARS_MAX: usize = 200;

/// `--server` and `--token`, as given.
#[derive(Clone)]
pub struct ServerArgs {
    /// The server's base URL.
    pub url: String,
    /// The bearer token, if any (never printed).
    pub token: Option<String>,
}

/// A remote server's API.
pub struct Server {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

/// A request the server refused or failed: its status, the API's stable
/// code and the reason.
#[derive(Debug)]
pub struct Error {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable error code (`not_found`, `refused`, …).
    pub code: String,
    /// The reason, for people.
    pub reason: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            StatusCode::UNAUTHORIZED => write!(f, "{} (give the server's token with --token or ROTA_TOKEN)", self.reason),
            status if status.is_server_error() => write!(f, "the server answered {}: {}", status.as_u16(), self.reason),
            _ => f.write_str(&self.reason),
        }
    }
}

impl std::error::Error for Error {}

impl Server {
    /// A client of the server at `args.url` (http or https).
    pub fn new(args: &ServerArgs) -> anyhow::Result<Server> {
        let mut base = Url::parse(&args.url).map_err(|err| anyhow!("--server {}: not a URL: {err}", args.url))?;
        anyhow::ensure!(
            matches!(base.scheme(), "http" | "https") && base.host().is_some(),
            "--server {}: expected http://HOST:PORT or https://HOST[:PORT]",
            args.url
        );
        anyhow::ensure!(base.query().is_none() && base.fragment().is_none(), "--server {}: give the base URL without a query", args.url);
        // Segments are appended to the base's path, which may be a prefix
        // behind a proxy; an empty last segment would double the slash.
        if let Ok(mut segments) = base.path_segments_mut() {
            segments.pop_if_empty();
        }
        let http = rota_agent::http_client()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("rota-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot set up the HTTP client")?;
        Ok(Server { http, base, token: args.token.clone() })
    }

    /// The URL of `segments` (each percent-encoded) below the base, with `query`.
    fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Url {
        let mut url = self.base.clone();
        url.path_segments_mut().expect("checked: an http(s) URL has a path").extend(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// GET `segments` with `query`; the decoded body.
    pub async fn get<T: DeserializeOwned>(&self, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<T> {
        Ok(self.send::<T, ()>(Method::GET, segments, query, None).await?.1)
    }

    /// POST `body` (or nothing) to `segments`; the status and decoded body.
    pub async fn post<T: DeserializeOwned, B: Serialize>(&self, segments: &[&str], body: Option<&B>) -> anyhow::Result<(StatusCode, T)> {
        self.send(Method::POST, segments, &[], body).await
    }

    /// DELETE `segments` with `query`; the answer has no body.
    pub async fn delete(&self, segments: &[&str], query: &[(&str, String)]) -> anyhow::Result<()> {
        self.send::<serde::de::IgnoredAny, ()>(Method::DELETE, segments, query, None).await.map(drop)
    }

    async fn send<T: DeserializeOwned, B: Serialize>(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> anyhow::Result<(StatusCode, T)> {
        let url = self.url(segments, query);
        let mut request = self.http.request(method.clone(), url.clone());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|err| anyhow!("cannot reach the server at {}: {}", self.base, error_chain(&err)))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|err| anyhow!("{method} {}: cannot read the answer: {err}", url.path()))?;
        if !status.is_success() {
            return Err(decode_error(status, &bytes).into());
        }
        // An answer without a body (204) reads as JSON null.
        let body: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        let value = serde_json::from_slice(body)
            .map_err(|err| anyhow!("{method} {}: the server's answer is not what this client expects: {err}", url.path()))?;
        Ok((status, value))
    }
}

/// The API's error body, or a stand-in for a server (or proxy) that did not send one.
fn decode_error(status: StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<rota_api::ErrorBody>(bytes) {
        Ok(body) => Error { status, code: body.error.code, reason: body.error.reason },
        Err(_) => {
            let text: String = String::from_utf8_lossy(bytes).chars().take(ERROR_BODY_CHARS_MAX).collect();
            let reason = if text.trim().is_empty() { status.to_string() } else { format!("{status}: {}", text.trim()) };
            Error { status, code: String::new(), reason }
        }
    }
}

/// An error with its sources on one line (reqwest's own message is terse).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The API's error code of `err`, when it is a refused request.
pub fn code_of(err: &anyhow::Error) -> Option<&str> {
    err.downcast_ref::<Error>().map(|err| err.code.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(url: &str) -> anyhow::Result<Server> {
        Server::new(&ServerArgs { url: url.to_owned(), token: None })
    }

    #[test]
    fn path_segments_are_encoded_below_the_base() {
        let url = server("http://127.0.0.1:7878/").unwrap().url(&["v1", "tasks", "order 17/β"], &[("limit", "5".to_owned())]);
        assert_eq!(url.as_str(), "http://127.0.0.1:7878/v1/tasks/order%2017%2F%CE%B2?limit=5");
        let url = server("https://example.test/rota").unwrap().url(&["v1", "queues"], &[]);
        assert_eq!(url.as_str(), "https://example.test/rota/v1/queues");
    }

    #[test]
    fn bad_server_urls_name_the_flag() {
        for bad in ["localhost:7878", "ftp://x", "http://x/?a=1", "nonsense"] {
            let err = server(bad).err().unwrap().to_string();
            assert!(err.starts_with(&format!("--server {bad}")), "{err}");
        }
    }

    #[test]
    fn errors_keep_the_code_and_the_reason() {
        let err = decode_error(StatusCode::NOT_FOUND, br#"{"error": {"code": "not_found", "reason": "task x not found"}}"#);
        assert_eq!((err.code.as_str(), err.to_string().as_str()), ("not_found", "task x not found"));
        let err = decode_error(StatusCode::BAD_GATEWAY, b"upstream down");
        assert_eq!(err.to_string(), "the server answered 502: 502 Bad Gateway: upstream down");
        let err = decode_error(StatusCode::UNAUTHORIZED, br#"{"error": {"code": "unauthorized", "reason": "no token"}}"#);
        assert!(err.to_string().contains("--token"), "{err}");
    }
}
