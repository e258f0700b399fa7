"""Deadline warnings: a task whose step passed its ``warn_after`` shows an
"at risk" badge in the tasks list and on its page, the list's "At risk"
filter lists only such tasks, and the page says since when."""

from __future__ import annotations

import re

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    server.cli("submit", "tick", "--id", "calm-1")
    server.cli("submit", "late", "--id", "risky-1")
    server.wait_task("calm-1", {"processed"})
    support.eventually(lambda: server.task("risky-1")["at_risk_since"], timeout=15.0, what="risky-1 at risk")


def tearDownModule() -> None:
    support.stop(server, chromium)


class AtRisk(support.BrowserTest):
    def test_the_list_marks_a_task_at_risk_and_filters_on_it(self) -> None:
        page, _ = self.open("/ui/tasks")
        table = page.get_by_role("table", name="Tasks")
        risky = support.rows(table).filter(has=page.get_by_role("link", name="risky-1", exact=True))
        expect(risky.locator(".badge.at-risk")).to_have_text("at risk")
        calm = support.rows(table).filter(has=page.get_by_role("link", name="calm-1", exact=True))
        expect(calm).to_contain_text("processed")
        expect(calm.locator(".badge.at-risk")).to_have_count(0)

        page.get_by_label("At risk").check()
        expect(page).to_have_url(re.compile(r"[?&]at_risk=true(&|$)"))
        expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(1)
        expect(page.get_by_role("table", name="Tasks").get_by_role("link", name="risky-1", exact=True)).to_have_count(1)
        expect(page.get_by_label("At risk")).to_be_checked()
        expect(page.locator("p.total")).to_contain_text("Tasks at risk")

    def test_the_task_page_shows_the_badge_the_time_and_the_warning(self) -> None:
        page, _ = self.open("/ui/tasks/risky-1")
        expect(page.locator("p.subtitle .badge.at-risk")).to_have_text("at risk")
        fields = page.locator("dl.fields")
        since = fields.locator("dt", has_text=re.compile(r"^At risk since$")).locator("xpath=following-sibling::dd[1]")
        expect(since.locator("time")).to_have_count(1)
        history = page.get_by_role("table", name="History")
        expect(support.rows(history).filter(has_text="at_risk")).to_have_count(1)
        expect(support.rows(history).filter(has_text="at_risk")).to_contain_text("passed its warn_after")

    def test_a_calm_task_page_has_no_badge(self) -> None:
        page, _ = self.open("/ui/tasks/calm-1")
        expect(page.locator("p.subtitle .badge").first).to_have_text("processed")
        expect(page.locator("p.subtitle .badge.at-risk")).to_have_count(0)
