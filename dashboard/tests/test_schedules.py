"""The Schedules page: every schedule with its next fire and state; Pause,
Resume and Fire now each ask first (Back does nothing), and the /v1 API
reports the change."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()


def tearDownModule() -> None:
    support.stop(server, chromium)


def schedule(name: str) -> dict[str, Any]:
    found: dict[str, Any] = server.api("GET", f"/v1/schedules/{name}")
    return found


class Schedules(support.BrowserTest):
    def test_lists_schedules_then_pauses_resumes_and_fires_one(self) -> None:
        # Once a year: it never fires by itself during the test.
        server.api("POST", "/v1/schedules", {"name": "yearly", "workflow": "greet", "cron": "0 0 0 1 1 *", "timezone": "Europe/Paris", "input": {"name": "ann"}})
        page, _ = self.open("/ui/schedules")
        row = support.rows(page.get_by_role("table", name="Schedules")).filter(has_text="yearly")
        expect(row).to_contain_text("greet")
        expect(row).to_contain_text("0 0 0 1 1 *")
        expect(row).to_contain_text("Europe/Paris")
        expect(row).to_contain_text("running")

        support.confirm(
            page, row.get_by_role("button", name="Pause"),
            check_unchanged=lambda: self.assertFalse(schedule("yearly")["paused"], "Back paused"),
        )  # fmt: skip
        support.eventually(lambda: schedule("yearly")["paused"], what="the schedule paused")
        expect(row).to_contain_text("paused")

        support.confirm(page, row.get_by_role("button", name="Resume"), back_first=False)
        support.eventually(lambda: not schedule("yearly")["paused"], what="the schedule resumed")
        expect(row).to_contain_text("running")

        def manual_tasks() -> list[Any]:
            return [t for t in server.api("GET", "/v1/tasks?workflow=greet") if t["id"].startswith("yearly@manual@")]

        support.confirm(
            page, row.get_by_role("button", name="Fire now"),
            check_unchanged=lambda: self.assertEqual(manual_tasks(), [], "Back fired"),
        )  # fmt: skip
        fired = support.eventually(manual_tasks, what="a task fired by hand")
        self.assertEqual(len(fired), 1)
        expect(page.get_by_role("status")).to_contain_text("yearly fired: task yearly@manual@")
