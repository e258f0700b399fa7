//! The web dashboard at `/ui`: a page shell, its script and style sheet
//! (from `dashboard/` at the repository root, compiled into the binary, so
//! it works offline and loads nothing from other hosts), and the login
//! form that turns a token into a session cookie.
//!
//! The dashboard is a client of the `/v1` API like any other: the script
//! reads and acts through it, and follows `/v1/events` to update the page
//! live. Every `/ui/…` path answers with the same shell, and the script
//! draws the page its path names, so every page has a URL to bookmark.
//!
//! With tokens configured, a page needs a session: `/ui/login` checks a
//! token and sets [`SESSION_COOKIE`] (HttpOnly, SameSite=Strict), which the
//! `/v1` routes accept as they accept the token itself ([`auth`]). The
//! shell carries the session's CSRF proof and what its scopes allow, so the
//! script shows only the actions that would be accepted; the API checks
//! them again. Without tokens the dashboard is open, like the API.
//!
//! [`auth`]: crate::auth

use std::time::Duration;

use axum::Router;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use crate::ApiState;
use crate::auth::{self, AuthConfig, Permission, SESSION_COOKIE, Scope};
use crate::error::ApiError;

const SCRIPT: &str = include_str!("../../../dashboard/app.js");
const STYLE: &str = include_str!("../../../dashboard/app.css");
const ICON: &str = include_str!("../../../dashboard/icon.svg");

/// What a dashboard page may load and where it may connect: only this server.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The dashboard's routes, outside the `/v1` authentication layer (they
/// check the session themselves).
pub(crate) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/{*path}", get(page))
        .route("/ui/assets/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/ui/assets/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/ui/assets/icon.svg", get(|| async { asset("image/svg+xml", ICON) }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    // Revalidated on every load, so that a new binary's script is never
    // mixed with an old page.
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// What the person looking at a page may do.
struct Viewer {
    /// The session cookie, when tokens are configured.
    session: Option<String>,
    can_operate: bool,
}

/// The viewer of a request: everyone when authentication is disabled; the
/// session's token otherwise (`None` without a valid session).
fn viewer(state: &ApiState, headers: &HeaderMap) -> Option<Viewer> {
    match &state.config().auth {
        AuthConfig::Disabled => Some(Viewer { session: None, can_operate: true }),
        tokens => {
            let session = auth::cookie(headers, SESSION_COOKIE)?;
            let scopes = tokens.session_scopes(session, state.clock().now())?;
            let can_operate = scopes.iter().any(|scope| scope.grants(Permission::Operate));
            Some(Viewer { session: Some(session.to_owned()), can_operate })
        }
    }
}

async fn page(State(state): State<ApiState>, headers: HeaderMap, uri: Uri) -> Response {
    let Some(viewer) = viewer(&state, &headers) else {
        let next = uri.path_and_query().map_or("/ui", |p| p.as_str());
        return Redirect::to(&format!("/ui/login?next={}", percent_encode(next))).into_response();
    };
    let csrf = viewer.session.as_deref().and_then(|session| state.config().auth.csrf_token(session, state.clock().now()));
    // The page follows the events from here on: what came before is in
    // what it reads when it draws. An event whose commit lands just after
    // this read with a lower seq is missed by the stream, not by the page's
    // own reads; the next event redraws it.
    let events_after = match state.store().latest_events(1).await {
        Ok(latest) => latest.first().map_or(0, |event| event.seq),
        Err(err) => return ApiError::store("read the latest event", err).into_response(),
    };
    let body = shell(csrf.as_deref().unwrap_or(""), viewer.can_operate, viewer.session.is_some(), events_after);
    html(StatusCode::OK, body)
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::REFERRER_POLICY, HeaderValue::from_static("same-origin")),
        ],
        body,
    )
        .into_response()
}

/// The page every `/ui/…` path gets; `app.js` fills `<main>` for the path.
fn shell(csrf: &str, can_operate: bool, signed_in: bool, events_after: i64) -> String {
    let sign_out = if signed_in {
        r#"<form method="post" action="/ui/logout" class="sign-out"><button type="submit">Sign out</button></form>"#
    } else {
        ""
    };
    let can = if can_operate { "read operate" } else { "read" };
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="{csrf}">
<meta name="rota-can" content="{can}">
<meta name="rota-events-after" content="{events_after}">
<title>rota</title>
<link rel="icon" href="/ui/assets/icon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/ui/assets/app.css">
<script src="/ui/assets/app.js" defer></script>
</head>
<body>
<header class="top">
<a class="brand" href="/ui">rota</a>
<nav aria-label="Main">
<a href="/ui">Overview</a>
<a href="/ui/tasks">Tasks</a>
<a href="/ui/alerts">Alerts</a>
<a href="/ui/queues">Queues</a>
<a href="/ui/workflows">Workflows</a>
<a href="/ui/schedules">Schedules</a>
<a href="/ui/batches">Batches</a>
</nav>
<span id="live" class="live" title="Updates from the server's event stream">connecting</span>
{sign_out}
</header>
<div id="notice" role="status" aria-live="polite"></div>
<div id="problem" role="alert"></div>
<main id="main"><noscript>The dashboard needs JavaScript; the same data is in the API at <a href="/docs/">/docs</a>.</noscript></main>
</body>
</html>
"#,
        csrf = escape(csrf)
    )
}

#[derive(Deserialize)]
struct LoginQuery {
    next: Option<String>,
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

async fn login_form(State(state): State<ApiState>, Query(query): Query<LoginQuery>) -> Response {
    if matches!(state.config().auth, AuthConfig::Disabled) {
        return Redirect::to("/ui").into_response();
    }
    html(StatusCode::OK, login_page(&safe_next(query.next.as_deref()), None))
}

async fn login(State(state): State<ApiState>, headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    if let Err(why) = auth::same_origin(&headers) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let next = safe_next(form.next.as_deref());
    let auth = &state.config().auth;
    if matches!(auth, AuthConfig::Disabled) {
        return Redirect::to(&next).into_response();
    }
    let ttl = state.limits().session_ttl;
    let until = state.clock().now().add(ttl);
    let refused = |why: &str| html(StatusCode::UNAUTHORIZED, login_page(&next, Some(why)));
    let Some((session, scopes)) = auth.open_session(form.token.trim().as_bytes(), until) else {
        return refused("That token is not valid.");
    };
    if !scopes.iter().any(|scope| scope.grants(Permission::Read)) {
        let names: Vec<&str> = scopes.iter().map(Scope::name).collect();
        return refused(&format!("That token has scope {}; the dashboard needs admin, operator or read.", names.join(", ")));
    }
    let secure = if forwarded_https(&headers) { "; Secure" } else { "" };
    let cookie = format!("{SESSION_COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}", ttl.as_secs());
    let mut response = Redirect::to(&next).into_response();
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("a cookie of visible ASCII"));
    response
}

async fn logout(headers: HeaderMap) -> Response {
    if let Err(why) = auth::same_origin(&headers) {
        return (StatusCode::FORBIDDEN, why).into_response();
    }
    let mut response = Redirect::to("/ui/login").into_response();
    let cleared = format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cleared).expect("a cookie of visible ASCII"));
    response
}

/// Behind a proxy that ends TLS, the cookie is marked `Secure`.
fn forwarded_https(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"https"))
}

/// Where to go after signing in: a dashboard path, never another site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(path) if path.starts_with("/ui") && !path.contains("//") && !path.contains('\\') => path.to_owned(),
        _ => "/ui".to_owned(),
    }
}

fn login_page(next: &str, problem: Option<&str>) -> String {
    let problem = problem.map_or(String::new(), |why| format!(r#"<p role="alert" class="problem">{}</p>"#, escape(why)));
    format!(
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · rota</title>
<link rel="icon" href="/ui/assets/icon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/ui/assets/app.css">
</head>
<body class="login">
<main>
<h1>Sign in to rota</h1>
{problem}
<form method="post" action="/ui/login">
<input type="hidden" name="next" value="{next}">
<label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Sign in</button>
</form>
<p class="hint">A token configured with <code>--auth</code> or <code>ROTA_API_TOKEN</code>, with scope admin, operator or read.</p>
</main>
</body>
</html>
"#,
        next = escape(next)
    )
}

/// Text made safe inside HTML text and double-quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path and query made safe as a query parameter's value.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// The shortest and longest dashboard session that may be configured.
pub(crate) const SESSION_TTL_RANGE: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dashboard_paths_are_followed_after_sign_in() {
        assert_eq!(safe_next(Some("/ui/tasks?state=error")), "/ui/tasks?state=error");
        for elsewhere in ["https://evil.example/ui", "//evil.example/ui", "/v1/tasks", "/ui//evil", "/ui\\evil"] {
            assert_eq!(safe_next(Some(elsewhere)), "/ui", "{elsewhere}");
        }
        assert_eq!(safe_next(None), "/ui");
    }

    #[test]
    fn text_is_escaped_for_html() {
        assert_eq!(escape(r#"<a href="x">'&'</a>"#), "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
        assert_eq!(percent_encode("/ui/tasks?state=error&x=1"), "/ui/tasks%3Fstate%3Derror%26x%3D1");
    }
}
