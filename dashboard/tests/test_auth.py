"""The dashboard with API tokens: sign-in, what a read-only token may do,
an operator's actions, and the session cookie's protections."""

from __future__ import annotations

import re
import urllib.parse

from playwright.sync_api import BrowserContext, Page, expect

import support

ADMIN = support.Token("admin", "admin-token-for-the-dashboard-tests", ["admin"])
OPERATOR = support.Token("ops", "operator-token-for-the-dashboard-tests", ["operator"])
READER = support.Token("viewer", "read-only-token-for-the-dashboard-tests", ["read"])

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start([ADMIN, OPERATOR, READER])
    server.cli("submit", "fail", "--id", "auth-error")
    for task_id in ["auth-nap-1", "auth-nap-2", "auth-nap-3"]:
        server.cli("submit", "nap", "--id", task_id)
    server.wait_task("auth-error", {"error"})
    for task_id in ["auth-nap-1", "auth-nap-2", "auth-nap-3"]:
        server.wait_task(task_id, {"processing"})
    support.dead_letter(server, "auth-dlq", [{"n": 1}])
    server.cli("queue", "create", "auth-paused", remote=False)
    server.cli("queue", "pause", "auth-paused", remote=False)


def tearDownModule() -> None:
    support.stop(server, chromium)


class Auth(support.BrowserTest):
    def sign_in(self, token: support.Token, next: str = "/ui") -> tuple[BrowserContext, Page]:
        context, _ = self.new_context()
        page, _ = self.open(f"/ui/login?next={urllib.parse.quote(next, safe='')}", context)
        page.get_by_label("Token").fill(token.token)
        page.get_by_role("button", name="Sign in", exact=True).click()
        expect(page).to_have_url(re.compile(re.escape(next) + "$"))
        expect(page.get_by_role("button", name="Sign out", exact=True)).to_be_visible()
        return context, page

    def test_ui_redirects_to_the_login_form_without_a_session(self) -> None:
        page, _ = self.open("/ui/tasks?state=error")
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))
        self.assertEqual(urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)["next"], ["/ui/tasks?state=error"])
        expect(page.get_by_label("Token")).to_be_visible()
        expect(page.get_by_role("button", name="Sign in", exact=True)).to_be_visible()
        # The API says 401 to a cookie-less browser, and no page leaks data.
        status, _, _ = server.request("GET", "/v1/tasks", auth=False)
        self.assertEqual(status, 401)

    def test_a_wrong_token_shows_an_error_and_no_session(self) -> None:
        context, watch = self.new_context()
        watch.allow(r"/ui/login: HTTP 401|status of 401")
        page, _ = self.open("/ui/login?next=%2Fui", context)
        page.get_by_label("Token").fill("not-a-token-this-server-knows")
        page.get_by_role("button", name="Sign in", exact=True).click()
        expect(page.get_by_role("alert")).to_contain_text(re.compile(r"\S"))
        expect(page).to_have_url(re.compile(r"/ui/login"))
        self.assertNotIn("rota_session", [c["name"] for c in context.cookies()])
        page.goto("/ui")
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))

    def test_signing_in_leads_to_next_and_signing_out_ends_the_session(self) -> None:
        context, page = self.sign_in(ADMIN, "/ui/tasks?state=error")
        expect(page.locator("h1")).to_have_text("Tasks")
        expect(page.get_by_role("table", name="Tasks").get_by_role("link", name="auth-error", exact=True)).to_be_visible()
        page.get_by_role("button", name="Sign out", exact=True).click()
        expect(page).to_have_url(re.compile(r"/ui/login"))
        page.goto("/ui")
        expect(page).to_have_url(re.compile(r"/ui/login\?next="))

    def test_the_task_page_says_which_token_submitted_the_task(self) -> None:
        _, page = self.sign_in(READER, "/ui/tasks/auth-error")
        dl = support.region(page, "Fields").locator("dl")
        expect(dl.locator("dt", has_text="Submitted by")).to_be_visible()
        terms = [t.strip() for t in dl.locator("dt").all_inner_texts()]
        values = [v.strip() for v in dl.locator("dd").all_inner_texts()]
        self.assertEqual(server.task("auth-error")["submitter"], "admin", "the token's name, from the --auth file")
        self.assertEqual(dict(zip(terms, values))["Submitted by"], "admin")

    def test_a_read_only_token_sees_everything_and_no_enabled_action_button(self) -> None:
        context, page = self.sign_in(READER)
        for path, heading in [
            ("/ui", "Overview"),
            ("/ui/tasks", "Tasks"),
            ("/ui/tasks/auth-error", "Task auth-error"),
            ("/ui/tasks/auth-nap-1", "Task auth-nap-1"),
            ("/ui/alerts", "Alerts"),
            ("/ui/queues", "Queues"),
            ("/ui/queues/auth-dlq", "Queue auth-dlq"),
            ("/ui/queues/auth-paused", "Queue auth-paused"),
            ("/ui/workflows", "Workflows"),
            ("/ui/workflows/fail", "Workflow fail"),
            ("/ui/tasks?state=error", "Tasks"),
            ("/ui/batches", "Batches"),
        ]:
            with self.subTest(path):
                page.goto(path)
                expect(page.locator("h1")).to_have_text(heading)
                support.wait_live(page, or_ended=True)
                page.wait_for_timeout(150)
                for name in support.ACTION_BUTTONS:
                    buttons = page.get_by_role("button", name=name, exact=True)
                    enabled = [b for b in buttons.all() if b.is_visible() and b.is_enabled()]
                    self.assertEqual(enabled, [], f"{path}: an enabled {name!r} for a read-only token")
                # Reading controls: signing out, finding a task, filtering the list.
                others = [
                    b.inner_text().strip() for b in page.get_by_role("button").all()
                    if b.is_visible() and b.is_enabled() and b.inner_text().strip() not in ("Sign out", "Find", "Filter")
                ]  # fmt: skip
                self.assertEqual(others, [], f"{path}: enabled buttons for a read-only token")
        # The data is there: the tasks list and the dead letter.
        page.goto("/ui/queues/auth-dlq")
        expect(support.rows(page.get_by_role("table", name="Dead letters"))).to_have_count(1)
        # And the API refuses the read token's change.
        status, _, _ = server.request("POST", "/v1/tasks/auth-nap-1/cancel", token=READER.token)
        self.assertEqual(status, 403)

    def test_an_operator_token_can_act(self) -> None:
        context, page = self.sign_in(OPERATOR, "/ui/tasks/auth-nap-2")
        support.confirm(page, page.get_by_role("button", name="Cancel", exact=True), back_first=False)
        self.assertEqual(server.wait_task("auth-nap-2", {"cancelled"}, timeout=10)["state"], "cancelled")

    def test_the_session_cookie_is_httponly_samesite_strict_and_needs_the_csrf_header(self) -> None:
        context, page = self.sign_in(OPERATOR, "/ui/tasks/auth-nap-3")
        cookies = {c["name"]: c for c in context.cookies()}
        self.assertIn("rota_session", cookies)
        session = cookies["rota_session"]
        self.assertTrue(session["httpOnly"], session)
        self.assertEqual(session["sameSite"], "Strict", session)
        self.assertEqual(page.evaluate("document.cookie"), "", "the session is out of the script's reach")
        csrf = page.locator('meta[name="csrf-token"]').get_attribute("content") or ""
        self.assertTrue(csrf, "the page carries a CSRF token")
        cookie = {"Cookie": f"rota_session={session['value']}"}
        cancel = "/v1/tasks/auth-nap-3/cancel"
        for headers, why in [
            (cookie, "the session cookie and no X-CSRF-Token"),
            ({**cookie, "X-CSRF-Token": "x" + csrf[1:] if csrf[:1] != "x" else "y" + csrf[1:]}, "a wrong X-CSRF-Token"),
            ({**cookie, "X-CSRF-Token": ""}, "an empty X-CSRF-Token"),
        ]:
            with self.subTest(why):
                status, body, _ = server.request("POST", cancel, headers=headers, auth=False)
                self.assertEqual(status, 403, f"{why}: {body}")
                self.assertEqual(server.task("auth-nap-3")["state"], "processing")
        # The same request with the page's token is accepted: the 403s were
        # for the CSRF proof, not the session.
        status, body, _ = server.request("POST", cancel, headers={**cookie, "X-CSRF-Token": csrf}, auth=False)
        self.assertEqual(status, 200, body)
        self.assertEqual(server.wait_task("auth-nap-3", {"cancelled"}, timeout=10)["state"], "cancelled")
        # Reads with the cookie alone are fine.
        status, _, _ = server.request("GET", "/v1/tasks", headers=cookie, auth=False)
        self.assertEqual(status, 200)
