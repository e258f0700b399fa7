"""The operator's actions: each asks for a confirmation (Back does
nothing), and after Confirm the /v1 API reports the change."""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Page, expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()


def tearDownModule() -> None:
    support.stop(server, chromium)


def resubmits(task_id: str) -> list[Any]:
    return [e for e in server.history(task_id) if e["kind"] == "resubmitted"]


class Actions(support.BrowserTest):
    def status_says_something(self, page: Page) -> None:
        expect(page.get_by_role("status")).not_to_have_text(re.compile(r"^\s*$"))

    def test_cancel_asks_then_cancels_the_task(self) -> None:
        server.cli("submit", "nap", "--id", "act-cancel")
        server.wait_task("act-cancel", {"processing"})
        page, _ = self.open("/ui/tasks/act-cancel")
        support.confirm(
            page, page.get_by_role("button", name="Cancel", exact=True),
            check_unchanged=lambda: self.assertEqual(server.task("act-cancel")["state"], "processing", "Back cancelled"),
            reason="the customer asked",
        )  # fmt: skip
        self.assertEqual(server.wait_task("act-cancel", {"cancelled"}, timeout=10)["state"], "cancelled")
        cancelled = [e for e in server.history("act-cancel") if e["kind"] == "cancelled"]
        self.assertEqual(cancelled[0]["detail"]["reason"], "the customer asked", "the reason typed is kept in the history")
        self.status_says_something(page)
        # The step's call in flight was stopped; its attempt says so.
        support.eventually(lambda: [e for e in server.history("act-cancel") if e["kind"] == "call_stopped"], what="a call_stopped event")
        expect(support.region(page, "Attempts"), "the attempt names the stopped call").to_contain_text("stopped")

    def test_pause_and_resume_ask_then_change_the_task(self) -> None:
        server.cli("submit", "nap", "--id", "act-pause")
        server.wait_task("act-pause", {"processing"})
        page, _ = self.open("/ui/tasks/act-pause")
        support.confirm(
            page, page.get_by_role("button", name="Pause", exact=True),
            check_unchanged=lambda: self.assertFalse(server.task("act-pause")["paused"], "Back paused"),
        )  # fmt: skip
        support.eventually(lambda: server.task("act-pause")["paused"], what="the task paused")
        self.status_says_something(page)
        expect(page.locator(".subtitle .badge.paused"), "the page shows the Paused badge").to_have_text("paused")
        expect(page.get_by_role("button", name="Pause", exact=True), "a paused task offers Resume instead").to_have_count(0)
        paused = [e for e in server.history("act-pause") if e["kind"] == "paused"]
        self.assertEqual(len(paused), 1)
        self.assertTrue(paused[0]["detail"]["by"].startswith("dashboard session") or paused[0]["detail"]["by"].startswith("api"), paused)
        support.confirm(page, page.get_by_role("button", name="Resume", exact=True), back_first=False)
        support.eventually(lambda: not server.task("act-pause")["paused"], what="the task resumed")
        expect(page.locator(".subtitle .badge.paused"), "the badge goes with the pause").to_have_count(0)
        expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()
        server.cli("cancel", "act-pause")

    def test_pause_and_resume_ask_then_change_the_workflow(self) -> None:
        def paused() -> bool:
            return bool(server.api("GET", "/v1/workflows/gate")["paused"])

        page, _ = self.open("/ui/workflows")
        row = support.rows(page.get_by_role("table", name="Workflows")).filter(has=page.get_by_role("link", name="gate", exact=True))
        support.confirm(
            page, row.get_by_role("button", name="Pause", exact=True),
            check_unchanged=lambda: self.assertFalse(paused(), "Back paused"),
        )  # fmt: skip
        support.eventually(paused, what="the workflow paused")
        self.status_says_something(page)
        expect(row.locator(".badge.paused"), "the row shows the Paused badge").to_have_text("paused")
        expect(row.get_by_role("button", name="Pause", exact=True), "a paused workflow offers Resume instead").to_have_count(0)
        by = server.api("GET", "/v1/workflows/gate")["pause"]["by"]
        self.assertTrue(by.startswith("dashboard session") or by.startswith("api"), by)

        # A task of it waits, and its page says why.
        server.cli("submit", "gate", "--id", "act-gated")
        task, _ = self.open("/ui/tasks/act-gated")
        expect(task.locator(".subtitle .badge.paused"), "the task page names the paused workflow").to_have_text("workflow paused")
        self.assertEqual(server.task("act-gated")["state"], "pending")

        page, _ = self.open("/ui/workflows/gate")
        expect(page.locator(".subtitle .badge.paused")).to_have_text("paused")
        support.confirm(page, page.get_by_role("button", name="Resume", exact=True), back_first=False)
        support.eventually(lambda: not paused(), what="the workflow resumed")
        expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()
        self.assertEqual(server.wait_task("act-gated", {"processed"}, timeout=30)["state"], "processed")

    def test_resubmit_asks_then_resubmits_the_failed_task(self) -> None:
        server.cli("submit", "fail", "--id", "act-resubmit")
        server.wait_task("act-resubmit", {"error"})
        page, _ = self.open("/ui/tasks/act-resubmit")
        support.confirm(
            page, page.get_by_role("button", name="Resubmit", exact=True),
            check_unchanged=lambda: self.assertEqual(resubmits("act-resubmit"), [], "Back resubmitted"),
        )  # fmt: skip
        found = support.eventually(lambda: resubmits("act-resubmit"), what="a resubmitted event")
        self.assertEqual(len(found), 1)
        self.assertIsNone(found[0]["detail"].get("step"))
        self.status_says_something(page)

    def test_resubmit_step_asks_then_resubmits_that_step(self) -> None:
        server.cli("submit", "fail", "--id", "act-step")
        server.wait_task("act-step", {"error"})
        page, _ = self.open("/ui/tasks/act-step")
        row = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="explode")
        support.confirm(
            page, row.get_by_role("button", name="Resubmit step"),
            check_unchanged=lambda: self.assertEqual(resubmits("act-step"), [], "Back resubmitted"),
        )  # fmt: skip
        found = support.eventually(lambda: resubmits("act-step"), what="a resubmitted event")
        self.assertEqual(found[0]["detail"].get("step"), "explode")
        self.status_says_something(page)

    def test_resubmit_step_with_a_new_input_replaces_the_tasks_input(self) -> None:
        server.cli("submit", "fail", "--id", "act-step-input", "--input", '{"n": 1}')
        server.wait_task("act-step-input", {"error"})
        page, _ = self.open("/ui/tasks/act-step-input")
        row = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="explode")
        button = row.get_by_role("button", name="Resubmit step")
        box = "Input of task act-step-input (JSON)"

        # The confirmation shows the task's input; one that is not JSON is
        # refused in the page and nothing is sent.
        button.click()
        dialog = page.locator("dialog[open]")
        expect(dialog.get_by_role("textbox", name=box)).to_have_value('{\n  "n": 1\n}')
        dialog.get_by_role("textbox", name=box).fill("{n: 2}")
        dialog.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.locator("#problem")).to_contain_text("the input is not valid JSON")
        self.assertEqual(resubmits("act-step-input"), [], "an invalid input was sent")

        button.click()
        dialog = page.locator("dialog[open]")
        dialog.get_by_role("textbox", name=box).fill('{"n": 2}')
        dialog.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.get_by_role("status")).to_have_text("Step explode resubmitted with a new input.")
        found = support.eventually(lambda: resubmits("act-step-input"), what="a resubmitted event")
        self.assertEqual(found[0]["detail"].get("step"), "explode")
        self.assertEqual(found[0]["detail"]["input"]["new"], {"n": 2}, found[0])
        self.assertEqual(server.task("act-step-input")["input"], {"n": 2})

    def test_send_signal_asks_for_its_data_then_completes_the_waiting_step(self) -> None:
        server.cli("submit", "approval", "--id", "act-signal")
        server.wait_task("act-signal", {"processing"})
        page, _ = self.open("/ui/tasks/act-signal")
        row = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="approval")
        expect(row).to_contain_text("waits for approved")
        button = row.get_by_role("button", name="Send signal")

        def signals() -> list[Any]:
            return [e for e in server.history("act-signal") if e["kind"] == "signal"]

        # Data that is not JSON is refused in the page: nothing is sent.
        button.click()
        dialog = page.locator("dialog[open]")
        dialog.get_by_role("textbox", name="Data of signal approved (JSON)").fill("{by: ann}")
        dialog.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.locator("#problem")).to_contain_text("the data is not valid JSON")
        self.assertEqual(signals(), [], "an invalid signal was sent")

        # Back sends nothing.
        button.click()
        page.locator("dialog[open]").get_by_role("button", name="Back", exact=True).click()
        expect(page.locator("dialog[open]")).to_have_count(0)
        page.wait_for_timeout(300)
        self.assertEqual(signals(), [], "Back sent the signal")

        button.click()
        dialog = page.locator("dialog[open]")
        expect(dialog).to_contain_text("Send signal approved to task act-signal?")
        dialog.get_by_role("textbox", name="Data of signal approved (JSON)").fill('{"by": "ann"}')
        dialog.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.get_by_role("status")).to_have_text("Signal approved sent: step approval completed.")
        done = server.wait_task("act-signal", {"processed"}, timeout=10)
        self.assertEqual(done["output"], {"approval": {"by": "ann"}, "echo": {"by": "ann"}})
        self.assertEqual(len(signals()), 1)
        expect(row.get_by_role("button", name="Send signal"), "no second signal is offered").to_have_count(0)

    def test_pause_and_resume_ask_then_change_the_queue(self) -> None:
        server.cli("queue", "create", "act-pausable", remote=False)
        page, _ = self.open("/ui/queues/act-pausable")
        expect(page.get_by_role("button", name="Resume", exact=True)).to_have_count(0)
        support.confirm(
            page, page.get_by_role("button", name="Pause", exact=True),
            check_unchanged=lambda: self.assertFalse(server.queue("act-pausable")["paused"], "Back paused"),
            reason="draining for a deploy",
        )  # fmt: skip
        support.eventually(lambda: server.queue("act-pausable")["paused"], what="the queue paused")
        audit = server.api("GET", "/v1/audit?action=queue.pause&limit=10")
        pauses = [(entry["target"], entry["reason"]) for entry in audit if entry["target"] == "act-pausable"]
        self.assertEqual(pauses, [("act-pausable", "draining for a deploy")], "the reason typed is in the audit log")
        self.status_says_something(page)
        resume = page.get_by_role("button", name="Resume", exact=True)
        expect(page.get_by_role("button", name="Pause", exact=True)).to_have_count(0)
        support.confirm(
            page, resume,
            check_unchanged=lambda: self.assertTrue(server.queue("act-pausable")["paused"], "Back resumed"),
        )  # fmt: skip
        support.eventually(lambda: not server.queue("act-pausable")["paused"], what="the queue resumed")
        expect(page.get_by_role("button", name="Pause", exact=True)).to_be_visible()

    def test_redrive_one_then_all_ask_then_move_dead_letters_back(self) -> None:
        support.dead_letter(server, "act-redrive", [{"n": 1}, {"n": 2}, {"n": 3}])
        page, _ = self.open("/ui/queues/act-redrive")
        table = page.get_by_role("table", name="Dead letters")
        expect(support.rows(table)).to_have_count(3)
        first_id = server.dead_letters("act-redrive")[0]["id"]
        row = support.rows(table).filter(has_text=first_id)
        support.confirm(
            page, row.get_by_role("button", name="Redrive", exact=True),
            check_unchanged=lambda: self.assertEqual(len(server.dead_letters("act-redrive")), 3, "Back redrove"),
        )  # fmt: skip
        support.eventually(lambda: len(server.dead_letters("act-redrive")) == 2, what="one dead letter redriven")
        self.assertNotIn(first_id, [d["id"] for d in server.dead_letters("act-redrive")])
        self.assertEqual(server.queue("act-redrive")["ready"], 1)
        expect(support.rows(table)).to_have_count(2)
        self.status_says_something(page)
        support.confirm(
            page, page.get_by_role("button", name="Redrive all", exact=True),
            check_unchanged=lambda: self.assertEqual(len(server.dead_letters("act-redrive")), 2, "Back redrove"),
        )  # fmt: skip
        support.eventually(lambda: server.dead_letters("act-redrive") == [], what="every dead letter redriven")
        self.assertEqual(server.queue("act-redrive")["ready"], 3)

    def test_purge_asks_then_deletes_the_dead_letters(self) -> None:
        support.dead_letter(server, "act-purge", [{"n": 1}, {"n": 2}])
        page, _ = self.open("/ui/queues/act-purge")
        expect(support.rows(page.get_by_role("table", name="Dead letters"))).to_have_count(2)
        support.confirm(
            page, page.get_by_role("button", name="Purge", exact=True),
            check_unchanged=lambda: self.assertEqual(len(server.dead_letters("act-purge")), 2, "Back purged"),
        )  # fmt: skip
        support.eventually(lambda: server.dead_letters("act-purge") == [], what="the dead letters purged")
        stats = server.queue("act-purge")
        self.assertEqual((stats["dead_lettered"], stats["ready"]), (0, 0))
        self.status_says_something(page)
