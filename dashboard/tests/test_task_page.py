"""A task's page: its steps as DAG nodes coloured by state, the Steps
table, every attempt, the fields, the full history, input and output."""

from __future__ import annotations

import json
import re
from typing import Any

from playwright.sync_api import Locator, Page, expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    server.cli("submit", "greet", "--input", '{"name": "ada"}', "--id", "page-done", "--reply-queue", "page.replies")
    server.cli("submit", "refund", "--input", '{"order": 17}', "--id", "page-undone")
    server.cli("submit", "fail", "--id", "page-error")
    server.cli("submit", "hang", "--id", "page-timeout")
    server.cli("submit", "choose", "--id", "page-skipped")
    server.wait_task("page-done", {"processed"})
    server.wait_task("page-undone", {"compensated"})
    server.wait_task("page-error", {"error"})
    server.wait_task("page-timeout", {"error"})
    server.wait_task("page-skipped", {"processed"})


def tearDownModule() -> None:
    support.stop(server, chromium)


def fields(dl: Locator) -> dict[str, str]:
    """A <dl>'s terms and their descriptions, once drawn."""
    expect(dl.locator("dt").first).to_be_visible()
    terms = [t.strip() for t in dl.locator("dt").all_inner_texts()]
    values = [v.strip() for v in dl.locator("dd").all_inner_texts()]
    return dict(zip(terms, values))


def json_in(region: Locator) -> Any:
    return json.loads(region.locator("pre").first.inner_text())


class TaskPage(support.BrowserTest):
    def shows(self, task_id: str) -> tuple[Page, Any]:
        page, _ = self.open(f"/ui/tasks/{task_id}")
        expect(page.locator("h1")).to_have_text(f"Task {task_id}")
        task = server.task(task_id)
        return page, task

    def test_the_dag_has_a_node_per_step_coloured_by_its_state(self) -> None:
        for task_id, states in [
            ("page-done", {"wait": "completed", "echo": "completed"}),
            ("page-undone", {"charge": "compensated", "ship": "failed"}),
            ("page-error", {"prepare": "completed", "explode": "failed"}),
            ("page-skipped", {"check": "completed", "upgrade": "skipped", "notify": "completed"}),
        ]:
            with self.subTest(task_id):
                page, task = self.shows(task_id)
                self.assertEqual({s["name"]: s["state"] for s in task["steps"]}, states, "the API's view")
                graph = support.region(page, "Workflow").locator("svg[role=img]")
                expect(graph).to_have_count(1)
                nodes = graph.locator("g.step-node")
                expect(nodes).to_have_count(len(states))
                for step, state in states.items():
                    expect(graph.locator(f'g.step-node[data-step="{step}"]')).to_have_attribute("data-state", state)
                # Nodes of different states look different.
                fills = {
                    step: graph.locator(f'g.step-node[data-step="{step}"] rect').first.evaluate("e => getComputedStyle(e).fill")
                    for step in states
                }
                if len(set(states.values())) > 1:
                    self.assertEqual(len(set(fills.values())), len(set(states.values())), f"fills by state: {fills}")

    def test_the_steps_table_has_a_row_per_step_with_a_resubmit_step_button(self) -> None:
        page, task = self.shows("page-error")
        table = page.get_by_role("table", name="Steps")
        expect(support.rows(table)).to_have_count(len(task["steps"]))
        for step in task["steps"]:
            with self.subTest(step["name"]):
                row = support.rows(table).filter(has_text=step["name"])
                expect(row).to_have_count(1)
                expect(row).to_contain_text(step["agent"])
                expect(row).to_contain_text(step["state"])
                expect(row.get_by_role("button", name="Resubmit step")).to_have_count(1)
        explode = support.rows(table).filter(has_text="explode")
        expect(explode).to_contain_text("boom")  # the last error

    def test_a_skipped_step_has_its_own_badge_naming_its_condition(self) -> None:
        page, task = self.shows("page-skipped")
        self.assertNotIn("upgrade", task["output"], "a skipped step has no entry in the output")
        row = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="upgrade")
        badge = row.locator(".badge")
        expect(badge).to_have_text("skipped")
        expect(badge).to_have_attribute("title", "when: steps.check.output.vip")
        completed = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="notify").locator(".badge")
        looks = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).borderStyle]"
        self.assertNotEqual(badge.evaluate(looks), completed.evaluate(looks), "skipped looks unlike completed")

    def test_the_attempts_show_each_attempts_outcome(self) -> None:
        for task_id, expected in [
            ("page-done", {"wait": "replied", "echo": "replied"}),
            ("page-undone", {"charge": "compensated", "ship": "failed"}),
            ("page-error", {"prepare": "replied", "explode": "failed"}),
        ]:
            with self.subTest(task_id):
                page, _ = self.shows(task_id)
                attempts = support.region(page, "Attempts")
                items = attempts.locator("li, tbody tr")
                expect(items.first).to_be_visible()
                texts = items.all_inner_texts()
                for step, outcome in expected.items():
                    mine = [t for t in texts if step in t]
                    self.assertTrue(mine, f"no attempt of {step} in {texts}")
                    self.assertTrue(any(outcome in t for t in mine), f"{step}: no attempt {outcome!r} in {mine}")
                    self.assertTrue(any("sent" in t for t in mine), f"{step}: no 'sent' in {mine}")

    def test_an_attempt_that_timed_out_says_timed_out_and_a_retried_one_retried(self) -> None:
        page, _ = self.shows("page-timeout")
        events = [e for e in server.history("page-timeout") if e["kind"] == "step_failed"]
        self.assertEqual([e["attempt"] for e in events], [1, 2, 3], "the API's view: three attempts timed out")
        self.assertEqual([e["detail"]["retry_in_ms"] is not None for e in events], [True, True, False])
        items = support.region(page, "Attempts").locator("li")
        expect(items).to_have_count(3)
        texts = items.all_inner_texts()
        for n, text in enumerate(texts, start=1):
            self.assertIn("timed out", text, f"attempt {n} (no reply before its complete-by) in the Attempts list")
        for n, text in enumerate(texts[:2], start=1):
            self.assertIn("retried", text, f"attempt {n} (retried, the history says) in the Attempts list")

    def test_the_fields_show_lock_epoch_deadline_and_failure_count(self) -> None:
        page, task = self.shows("page-error")
        shown = fields(support.region(page, "Fields").locator("dl"))
        for name in ["Locked by", "Lease epoch", "Complete by", "Failure count"]:
            self.assertIn(name, shown)
        self.assertEqual(shown["Lease epoch"], str(task["lease_epoch"]))
        self.assertRegex(shown["Failure count"], rf"^{task['failure_count']}\b")
        self.assertEqual(shown["Locked by"] in ("", "—", "-"), task["locked_by"] is None, shown["Locked by"])

    def test_the_fields_name_the_reply_queue(self) -> None:
        _, task = self.shows("page-done")
        page, _ = self.open("/ui/tasks/page-done")
        shown = fields(support.region(page, "Fields").locator("dl"))
        self.assertEqual((task["reply_queue"], shown["Reply queue"]), ("page.replies", "page.replies"))

    def test_the_history_has_every_event(self) -> None:
        page, _ = self.shows("page-undone")
        events = server.history("page-undone")
        table = page.get_by_role("table", name="History")
        expect(support.rows(table)).to_have_count(len(events))
        texts = support.rows(table).all_inner_texts()
        for event, text in zip(events, texts):
            self.assertIn(event["kind"], text)

    def test_input_and_output_are_formatted_json(self) -> None:
        page, task = self.shows("page-done")
        self.assertEqual(json_in(support.region(page, "Input")), task["input"])
        self.assertEqual(json_in(support.region(page, "Output")), task["output"])
        # Formatted: indented over lines, not one line.
        self.assertIn("\n  ", support.region(page, "Output").locator("pre").first.inner_text())

    def test_an_unfinished_task_has_cancel_and_resubmit(self) -> None:
        page, _ = self.shows("page-error")
        expect(page.get_by_role("button", name="Cancel", exact=True)).to_be_enabled()
        expect(page.get_by_role("button", name="Resubmit", exact=True)).to_be_enabled()

    def test_an_unknown_task_says_so_in_an_alert(self) -> None:
        page, watch = self.open("/ui/tasks/no-such-task")
        watch.allow(r"/v1/tasks/no-such-task.*(HTTP )?404|status of 404")
        expect(page.get_by_role("alert")).to_contain_text(re.compile("no-such-task|not found|no task", re.I))
