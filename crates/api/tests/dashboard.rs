//! The dashboard's server side: its pages and files, the sign-in that turns
//! a token into a session cookie, and what that cookie may do on `/v1`.
//! The pages themselves are tested in a real browser (dashboard/tests).

mod common;

use common::{Options, Server, start};
use reqwest::header::{self, HeaderValue};
use reqwest::{Method, StatusCode};
use rota_api::{AuthConfig, Scope, Token};

const OPERATOR: &str = "operator-token-00000001";
const READ: &str = "read-token-000000000001";
const SUBMIT: &str = "submit-token-0000000001";

fn tokens() -> AuthConfig {
    let token = |secret: &str, scope: Scope| Token::new(secret, vec![scope]).unwrap();
    AuthConfig::tokens(vec![token(OPERATOR, Scope::Operator), token(READ, Scope::Read), token(SUBMIT, Scope::Submit)]).unwrap()
}

/// A client that follows no redirect, so that each answer is seen as sent.
fn browser() -> reqwest::Client {
    rota_agent::http_client().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// A form body, as a browser encodes it.
fn form_body(fields: &[(&str, &str)]) -> String {
    let encode = |text: &str| {
        text.bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect::<String>()
    };
    fields.iter().map(|(key, value)| format!("{}={}", encode(key), encode(value))).collect::<Vec<_>>().join("&")
}

/// Signs in with `token`; the session cookie's value and the whole `Set-Cookie` header.
async fn sign_in(server: &Server, token: &str) -> (String, String) {
    let reply = browser()
        .post(server.url("/ui/login"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form_body(&[("token", token), ("next", "/ui/tasks?state=error")]))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::SEE_OTHER, "{}", reply.text().await.unwrap());
    assert_eq!(reply.headers()[header::LOCATION], "/ui/tasks?state=error");
    let set_cookie = reply.headers()[header::SET_COOKIE].to_str().unwrap().to_owned();
    let value = set_cookie.strip_prefix("rota_session=").unwrap().split(';').next().unwrap().to_owned();
    (value, set_cookie)
}

/// The page a session gets, and the CSRF proof it carries.
async fn page_with(server: &Server, session: &str, path: &str) -> (String, String) {
    let reply = browser().get(server.url(path)).header(header::COOKIE, format!("rota_session={session}")).send().await.unwrap();
    assert_eq!(reply.status(), StatusCode::OK);
    let html = reply.text().await.unwrap();
    let csrf = html.split(r#"<meta name="csrf-token" content=""#).nth(1).unwrap().split('"').next().unwrap().to_owned();
    (html, csrf)
}

fn cookie_request(server: &Server, method: Method, path: &str, session: &str) -> reqwest::RequestBuilder {
    browser().request(method, server.url(path)).header(header::COOKIE, format!("rota_session={session}"))
}

#[tokio::test]
async fn the_dashboard_and_its_files_are_served_with_a_strict_content_policy() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let root = browser().get(server.url("/")).send().await.unwrap();
    assert!(root.status().is_redirection());
    assert_eq!(root.headers()[header::LOCATION], "/ui");
    for path in ["/ui", "/ui/", "/ui/tasks?state=error", "/ui/tasks/some-id", "/ui/queues/agent.delay", "/ui/workflows/quick"] {
        let reply = browser().get(server.url(path)).send().await.unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "{path}");
        let policy = reply.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().to_owned();
        assert!(policy.contains("default-src 'none'") && policy.contains("connect-src 'self'"), "{policy}");
        let html = reply.text().await.unwrap();
        assert!(html.contains(r#"<script src="/ui/assets/app.js""#) && html.contains(r#"<nav aria-label="Main">"#), "{path}");
        assert!(html.contains(r#"content="read operate""#), "open dashboards may act");
        assert!(!html.contains("http://") && !html.contains("https://"), "{path} names no other host");
    }
    for (path, kind) in [("/ui/assets/app.js", "javascript"), ("/ui/assets/app.css", "text/css"), ("/ui/assets/icon.svg", "image/svg+xml")]
    {
        let reply = browser().get(server.url(path)).send().await.unwrap();
        assert_eq!(reply.status(), StatusCode::OK, "{path}");
        assert!(reply.headers()[header::CONTENT_TYPE].to_str().unwrap().contains(kind), "{path}");
        // XML namespaces are names, not addresses.
        let text = reply.text().await.unwrap().replace("http://www.w3.org/2000/svg", "");
        assert!(!text.contains("http://") && !text.contains("https://"), "{path} loads nothing from another host");
    }
    // A page follows the events after the latest one, not the whole history.
    let before = browser().get(server.url("/ui")).send().await.unwrap().text().await.unwrap();
    assert!(before.contains(r#"<meta name="rota-events-after" content="0">"#), "an empty store");
    server.submit("quick", "one-event").await;
    let after = browser().get(server.url("/ui")).send().await.unwrap().text().await.unwrap();
    let latest = server.store.latest_events(1).await.unwrap()[0].seq;
    assert!(latest > 0 && after.contains(&format!(r#"<meta name="rota-events-after" content="{latest}">"#)), "{after}");

    // Without tokens there is nothing to sign in to.
    let login = browser().get(server.url("/ui/login")).send().await.unwrap();
    assert_eq!(login.headers()[header::LOCATION], "/ui");
}

#[tokio::test]
async fn with_tokens_a_page_needs_a_session_that_only_a_valid_token_opens() {
    let server = start(Options { engine: false, auth: tokens(), ..Options::default() }).await;
    let page = browser().get(server.url("/ui/tasks?state=error")).send().await.unwrap();
    assert!(page.status().is_redirection());
    assert_eq!(page.headers()[header::LOCATION], "/ui/login?next=/ui/tasks%3Fstate%3Derror");

    let form = browser().get(server.url("/ui/login?next=/ui/alerts")).send().await.unwrap();
    let html = form.text().await.unwrap();
    assert!(html.contains(r#"<label for="token">Token</label>"#) && html.contains(r#"value="/ui/alerts""#), "{html}");

    let wrong = browser()
        .post(server.url("/ui/login"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form_body(&[("token", "not-a-configured-token")]))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get(header::SET_COOKIE).is_none());
    assert!(wrong.text().await.unwrap().contains(r#"role="alert""#));

    let submit_only = browser()
        .post(server.url("/ui/login"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form_body(&[("token", SUBMIT)]))
        .send()
        .await
        .unwrap();
    assert_eq!(submit_only.status(), StatusCode::UNAUTHORIZED);
    assert!(submit_only.text().await.unwrap().contains("needs admin, operator or read"));

    let (session, set_cookie) = sign_in(&server, OPERATOR).await;
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set_cookie.contains(attribute), "{attribute} in {set_cookie}");
    }
    assert!(!set_cookie.contains(OPERATOR), "the cookie does not carry the token");
    let (html, csrf) = page_with(&server, &session, "/ui/tasks").await;
    assert!(html.contains(r#"content="read operate""#) && html.contains("Sign out"));
    assert!(!csrf.is_empty());

    // Sign-in goes only to dashboard pages, and signing out clears the cookie.
    let elsewhere = browser()
        .post(server.url("/ui/login"))
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form_body(&[("token", READ), ("next", "https://evil.example/")]))
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.headers()[header::LOCATION], "/ui");
    let out = cookie_request(&server, Method::POST, "/ui/logout", &session).send().await.unwrap();
    assert!(out.headers()[header::SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
}

#[tokio::test]
async fn a_session_acts_like_its_token_and_a_change_needs_the_pages_csrf_proof() {
    let server = start(Options { engine: false, auth: tokens(), ..Options::default() }).await;
    let submitted = server
        .send(
            server
                .request(Method::POST, "/v1/tasks")
                .bearer_auth(SUBMIT)
                .json(&serde_json::json!({ "workflow": "slow", "id": "by-session" })),
        )
        .await;
    assert_eq!(submitted.status, StatusCode::CREATED, "{}", submitted.text);
    let created = "by-session";
    let cancel = format!("/v1/tasks/{created}/cancel");

    let (operator, _) = sign_in(&server, OPERATOR).await;
    let (_, proof) = page_with(&server, &operator, "/ui").await;
    let list = cookie_request(&server, Method::GET, "/v1/tasks", &operator).send().await.unwrap();
    assert_eq!(list.status(), StatusCode::OK, "reads need no proof");

    let without = cookie_request(&server, Method::POST, &cancel, &operator).send().await.unwrap();
    assert_eq!(without.status(), StatusCode::FORBIDDEN);
    assert!(without.text().await.unwrap().contains("x-csrf-token"));
    let wrong =
        cookie_request(&server, Method::POST, &cancel, &operator).header("x-csrf-token", "bm90LXRoZS1wcm9vZg").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::FORBIDDEN);
    let (reader, reader_proof) = {
        let (session, _) = sign_in(&server, READ).await;
        let (html, proof) = page_with(&server, &session, "/ui").await;
        assert!(html.contains(r#"content="read""#) && !html.contains("read operate"), "a read-only page offers no action");
        (session, proof)
    };
    let another_sessions_proof =
        cookie_request(&server, Method::POST, &cancel, &operator).header("x-csrf-token", &reader_proof).send().await.unwrap();
    assert_eq!(another_sessions_proof.status(), StatusCode::FORBIDDEN);
    let from_elsewhere = cookie_request(&server, Method::POST, &cancel, &operator)
        .header("x-csrf-token", &proof)
        .header(header::ORIGIN, "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(from_elsewhere.status(), StatusCode::FORBIDDEN);
    let task = server.send(server.request(Method::GET, &format!("/v1/tasks/{created}")).bearer_auth(OPERATOR)).await;
    assert_eq!(task.body["state"], "pending", "no refused request changed anything");

    let read_only = cookie_request(&server, Method::POST, &cancel, &reader).header("x-csrf-token", &reader_proof).send().await.unwrap();
    assert_eq!(read_only.status(), StatusCode::FORBIDDEN, "a read session cannot act even with its proof");

    let done = cookie_request(&server, Method::POST, &cancel, &operator).header("x-csrf-token", &proof).send().await.unwrap();
    assert_eq!(done.status(), StatusCode::OK, "{}", done.text().await.unwrap());

    let expired = cookie_request(&server, Method::GET, "/v1/tasks", "1000.AAAA").send().await.unwrap();
    assert_eq!(expired.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn without_tokens_a_change_from_another_site_is_still_refused() {
    let server = start(Options { engine: false, ..Options::default() }).await;
    let id = server.submit("slow", "cross-site").await["id"].as_str().unwrap().to_owned();
    let cancel = server.url(&format!("/v1/tasks/{id}/cancel"));
    let refused = browser().post(&cancel).header(header::ORIGIN, "https://evil.example").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let refused = browser().post(&cancel).header("sec-fetch-site", HeaderValue::from_static("cross-site")).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(server.get(&format!("/v1/tasks/{id}")).await.body["state"], "pending");
    let same_origin = browser().post(&cancel).header(header::ORIGIN, server.base.clone()).send().await.unwrap();
    assert_eq!(same_origin.status(), StatusCode::OK, "the dashboard's own page may act");
}
