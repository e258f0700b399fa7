"""The Batches page and the bulk actions of the tasks list: a batch made
through the API shows its progress, Stop stops a running one, and
"Resubmit matching…" resubmits every task in Error the list's filters
select after showing how many; the README's screenshot of the page.

A running batch is made on a store that only ``rota api`` serves: without
a Supervisor nobody runs it, so it stays Running until stopped (``rota
serve``'s leader would finish a small one within a second)."""

from __future__ import annotations

import json
import re
import struct
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from playwright.sync_api import Locator, Page, expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()


def tearDownModule() -> None:
    support.stop(server, chromium)


def batch_row(page: Page, batch_id: str) -> Locator:
    """The Batches table's row of ``batch_id``."""
    return support.rows(page.get_by_role("table", name="Batches")).filter(has=page.get_by_role("rowheader", name=batch_id))


def progress(row: Locator) -> tuple[str | None, str | None]:
    """The value and max of a row's progress bar."""
    bar = row.get_by_role("progressbar")
    return bar.get_attribute("value"), bar.get_attribute("max")


def batches_of(prefix: str) -> list[Any]:
    """The module server's batches whose filter has ``id_prefix``."""
    return [b for b in server.api("GET", "/v1/batches") if b["filter"]["id_prefix"] == prefix]


def fail_tasks(on: support.Server, ids: Sequence[str], marker: str) -> None:
    """Tasks of ``flaky`` that end in Error (until ``marker`` exists)."""
    for task_id in ids:
        on.api("POST", "/v1/tasks", {"workflow": "flaky", "id": task_id, "input": {"marker": marker}})
    for task_id in ids:
        on.wait_task(task_id, {"error"})


def api_only(tasks: Sequence[str]) -> tuple[support.Server, support.ApiServer]:
    """A store with ``tasks`` in Error, served by ``rota api`` alone: its
    ``rota serve`` (which made them) is stopped first."""
    own = support.Server()
    try:
        fail_tasks(own, tasks, str(own.root / "never"))
        support.terminate(own.process)
        return own, support.ApiServer(own)
    except BaseException:
        own.stop()
        raise


def call(url: str, method: str, path: str, body: Any = None) -> Any:
    """A request to the ``rota api`` at ``url`` (no tokens) that must
    succeed; its decoded body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def create_batch(url: str, body: Any) -> Any:
    return call(url, "POST", "/v1/batches", body)


def get_batch(url: str, batch_id: str) -> Any:
    return call(url, "GET", f"/v1/batches/{urllib.parse.quote(batch_id, safe='')}")


class Batches(support.BrowserTest):
    def test_a_batch_made_through_the_api_appears_with_its_progress(self) -> None:
        for n in range(1, 4):
            server.submit("nap", f"listed-{n}")
        for n in range(1, 4):
            server.wait_task(f"listed-{n}", {"processing"})
        page, _ = self.open("/ui/batches")
        support.wait_live(page)
        created = server.api("POST", "/v1/batches", {
            "action": "cancel", "filter": {"workflow": "nap", "id_prefix": "listed-"}, "reason": "superseded by v2",
        })  # fmt: skip
        self.assertEqual(created["total"], 3)
        # The page is not reloaded: the batch's cancels redraw it.
        row = batch_row(page, created["id"])
        expect(row).to_have_count(1)
        expect(row.get_by_role("cell", name="cancel", exact=True)).to_have_count(1)
        expect(row).to_contain_text("superseded by v2")
        expect(row).to_contain_text("workflow nap, id starting listed-")
        expect(row.locator(".badge")).to_have_text("done")
        expect(row).to_contain_text("3 of 3")
        expect(row).to_contain_text("3 done, 0 skipped, 0 failed")
        self.assertEqual(progress(row), ("3", "3"))
        expect(row.get_by_role("button", name="Stop", exact=True), "a finished batch has no Stop").to_have_count(0)
        for n in range(1, 4):
            self.assertEqual(server.task(f"listed-{n}")["state"], "cancelled")

    def test_stop_asks_then_stops_a_running_batch(self) -> None:
        own, api = api_only(["halted-1", "halted-2"])
        self.addCleanup(own.stop)
        self.addCleanup(api.stop)
        batch = create_batch(api.url, {"action": "resubmit", "filter": {"id_prefix": "halted-"}})
        self.assertEqual((batch["state"], batch["total"]), ("running", 2))
        context, _ = self.new_context(api.url)
        page, _ = self.open("/ui/batches", context)
        row = batch_row(page, batch["id"])
        expect(row.locator(".badge")).to_have_text("running")
        expect(row).to_contain_text("0 of 2")
        self.assertEqual(progress(row), ("0", "2"))
        support.confirm(
            page, row.get_by_role("button", name="Stop", exact=True),
            check_unchanged=lambda: self.assertEqual(get_batch(api.url, batch["id"])["state"], "running", "Back stopped it"),
        )  # fmt: skip
        expect(page.get_by_role("status")).to_contain_text(f"Batch {batch['id']} stopped.")
        expect(row.locator(".badge")).to_have_text("stopped")
        expect(row.get_by_role("button", name="Stop", exact=True), "a stopped batch has no Stop").to_have_count(0)
        self.assertEqual(get_batch(api.url, batch["id"])["state"], "stopped")
        # The tasks it had not reached are left as they were.
        for task_id in ["halted-1", "halted-2"]:
            self.assertEqual(call(api.url, "GET", f"/v1/tasks/{task_id}")["state"], "error")

    def test_resubmit_matching_shows_the_count_then_resubmits_the_tasks_in_error(self) -> None:
        marker = server.root / "flaky-fixed"
        fail_tasks(server, ["bulk-1", "bulk-2", "bulk-3"], str(marker))
        # In Error too, but outside the filter: left alone.
        fail_tasks(server, ["other-1"], str(marker))
        marker.touch()
        page, _ = self.open("/ui/tasks?state=error&id_prefix=bulk-")
        expect(page.get_by_role("button", name="Cancel matching…", exact=True)).to_be_visible()
        button = page.get_by_role("button", name="Resubmit matching…", exact=True)

        # The dry run: the dialog names how many tasks; Back makes nothing.
        button.click()
        dialog = page.locator("dialog[open]")
        expect(dialog).to_contain_text("Resubmit the 3 tasks in Error matching (id starting bulk-)?")
        dialog.get_by_role("button", name="Back", exact=True).click()
        expect(page.locator("dialog[open]")).to_have_count(0)
        self.assertEqual(batches_of("bulk-"), [], "Back made a batch")

        button.click()
        dialog = page.locator("dialog[open]")
        expect(dialog).to_contain_text("3 tasks")
        reason = dialog.get_by_role("textbox", name=re.compile("^Reason"))
        expect(reason, "the reason is the first control, focused").to_be_focused()
        reason.fill("the disk is free again")
        dialog.get_by_role("button", name="Confirm", exact=True).click()

        # It leads to the batch's row on the Batches page.
        expect(page).to_have_url(re.compile(r"/ui/batches#batch-"))
        batches = batches_of("bulk-")
        self.assertEqual(len(batches), 1)
        made = batches[0]
        self.assertEqual((made["action"], made["total"], made["reason"]), ("resubmit", 3, "the disk is free again"))
        self.assertEqual(made["filter"]["state"], "error")
        row = batch_row(page, made["id"])
        expect(row).to_have_attribute("aria-current", "true")
        expect(row.locator(".badge")).to_have_text("done")
        expect(row).to_contain_text("3 of 3")
        for task_id in ["bulk-1", "bulk-2", "bulk-3"]:
            self.assertEqual(server.wait_task(task_id, {"processed"})["state"], "processed")
            resubmitted = [e for e in server.history(task_id) if e["kind"] == "resubmitted"]
            self.assertEqual(len(resubmitted), 1, resubmitted)
            self.assertIn(made["id"], resubmitted[0]["detail"]["by"])
        self.assertEqual(server.task("other-1")["state"], "error")

    def test_bulk_actions_follow_the_filters(self) -> None:
        cases = [
            ("/ui/tasks", []),  # a batch needs a filter
            ("/ui/tasks?workflow=nap", ["Cancel matching…", "Resubmit matching…"]),
            ("/ui/tasks?state=error", ["Cancel matching…", "Resubmit matching…"]),
            ("/ui/tasks?state=processing&workflow=nap", ["Cancel matching…"]),  # only tasks in Error are resubmitted
            ("/ui/tasks?workflow=nap&at_risk=true", []),  # a batch's filter has no "at risk"
        ]
        for path, shown in cases:
            with self.subTest(path):
                page, _ = self.open(path)
                expect(page.locator("h1")).to_have_text("Tasks")
                support.wait_live(page)
                for name in ["Cancel matching…", "Resubmit matching…"]:
                    expect(page.get_by_role("button", name=name, exact=True)).to_have_count(1 if name in shown else 0)
                page.close()

    def test_an_api_refusal_is_shown_in_the_page(self) -> None:
        fail_tasks(server, ["refused-1"], str(server.root / "never"))
        page, watch = self.open("/ui/tasks?state=error&id_prefix=refused-")
        watch.allow(r"POST .*/v1/batches: HTTP 422")
        watch.allow(r"the server responded with a status of 422")
        page.get_by_role("button", name="Cancel matching…", exact=True).click()
        dialog = page.locator("dialog[open]")
        expect(dialog).to_contain_text("Cancel the 1 task matching (state error, id starting refused-)?")
        dialog.get_by_role("textbox", name=re.compile("^Reason")).fill("x" * 1001)
        dialog.get_by_role("button", name="Confirm", exact=True).click()
        expect(page.get_by_role("alert")).to_contain_text("reason: at most 1000 characters")
        expect(page).to_have_url(re.compile(r"/ui/tasks\?"))
        self.assertEqual(batches_of("refused-"), [])

    def test_the_batches_screenshot_at_1280x800(self) -> None:
        # Its own store, so that the other tests' batches are not in it:
        # two batches run by `rota serve`, then a running and a stopped one
        # under `rota api` (nobody runs them).
        own = support.Server()
        self.addCleanup(own.stop)
        fail_tasks(own, [f"report-{n}" for n in range(1, 5)], str(own.root / "fixed"))
        (own.root / "fixed").touch()
        for n in range(1, 4):
            own.submit("nap", f"nightly-sync-{n}")
            own.wait_task(f"nightly-sync-{n}", {"processing"})
        cancelled = own.api("POST", "/v1/batches", {
            "action": "cancel", "filter": {"workflow": "nap"}, "reason": "superseded by the v2 sync",
        })  # fmt: skip
        resubmitted = own.api("POST", "/v1/batches", {
            "action": "resubmit", "filter": {"workflow": "flaky", "id_prefix": "report-"}, "reason": "disk space freed",
        })  # fmt: skip
        for made in (cancelled, resubmitted):
            support.eventually(lambda: own.api("GET", f"/v1/batches/{made['id']}")["state"] == "done", timeout=20, what="a done batch")
        fail_tasks(own, [f"import-{n}" for n in range(1, 4)], str(own.root / "never"))
        support.terminate(own.process)
        api = support.ApiServer(own)
        self.addCleanup(api.stop)
        stopped = create_batch(api.url, {"action": "cancel", "filter": {"state": "error", "id_prefix": "import-"}, "reason": "wrong input file"})
        call(api.url, "POST", f"/v1/batches/{stopped['id']}/stop")
        create_batch(api.url, {"action": "resubmit", "filter": {"id_prefix": "import-"}, "reason": "retry after the fix"})
        context, _ = self.new_context(api.url)
        page, _ = self.open("/ui/batches", context)
        support.wait_live(page)
        expect(support.rows(page.get_by_role("table", name="Batches"))).to_have_count(4)
        page.wait_for_timeout(500)
        data = page.screenshot(path=str(support.IMAGES_DIR / "dashboard-batches.png"))
        self.assertEqual(struct.unpack(">II", data[16:24]), (1280, 800))
