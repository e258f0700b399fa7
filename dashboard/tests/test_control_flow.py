"""A task page's control flow: a child workflow and its parent linked both
ways, a for_each step's instances grouped under their step, and a task
that its concurrency key holds back saying so until it starts."""

from __future__ import annotations

import re

from playwright.sync_api import Locator, Page, expect

import support

server: support.Server
chromium: support.Chromium

#: The fan-out's items: two long waits first, then quick ones.
FAN_OUT = ["120s", "120s"] + ["1ms"] * 48


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    server.submit("nest", "nest-1", {"name": "ada"})
    server.submit("fanout", "fan-1", {"waits": FAN_OUT})
    server.wait_task("nest-1", {"processed"})


def tearDownModule() -> None:
    support.stop(server, chromium)


def own_rows(table: Locator) -> Locator:
    """A table's own body rows, not those of a table inside it."""
    return table.locator(":scope > tbody > tr")


def subtitle(page: Page) -> Locator:
    return page.locator("p.subtitle")


class ChildWorkflows(support.BrowserTest):
    def test_a_parent_lists_its_child_which_links_back(self) -> None:
        parent = server.task("nest-1")
        self.assertEqual(len(parent["children"]), 1, "the API's view")
        child = parent["children"][0]
        self.assertEqual((child["workflow"], child["step"], child["attempt"]), ("tick", "sub", 1))

        page, _ = self.open("/ui/tasks/nest-1")
        expect(subtitle(page)).not_to_contain_text("child of")
        children = page.get_by_role("table", name="Children")
        expect(support.rows(children)).to_have_count(1)
        row = support.rows(children).first
        expect(row.get_by_role("link", name=child["id"], exact=True)).to_be_visible()
        expect(row.get_by_role("link", name="tick", exact=True)).to_be_visible()
        expect(row.locator(".badge")).to_have_text(child["state"])
        expect(row).to_contain_text("step sub, attempt 1")

        # The step that ran the child names its workflow and links to it.
        sub = support.rows(page.get_by_role("table", name="Steps")).filter(has=page.get_by_role("rowheader", name="sub", exact=True))
        expect(sub).to_contain_text("workflow tick")
        sub.get_by_role("link", name=child["id"], exact=True).click()

        expect(page.locator("h1")).to_have_text(f"Task {child['id']}")
        expect(subtitle(page)).to_contain_text("child of nest-1, step sub (attempt 1)")
        expect(page.get_by_role("table", name="Children")).to_have_count(0)
        expect(support.region(page, "Fields")).to_contain_text("depth 1")
        subtitle(page).get_by_role("link", name="nest-1", exact=True).click()
        expect(page.locator("h1")).to_have_text("Task nest-1")

        # Every child is in the task list, filtered by its parent there.
        support.region(page, "Children").get_by_role("link", name="all of them in the task list").click()
        expect(page).to_have_url(re.compile(r"/ui/tasks\?parent=nest-1$"))
        tasks = page.get_by_role("table", name="Tasks")
        expect(support.rows(tasks)).to_have_count(1)
        expect(support.rows(tasks).first.get_by_role("link", name=child["id"], exact=True)).to_be_visible()
        expect(page.locator("p.total")).to_have_text("1 task started by nest-1")

    def test_the_workflow_page_names_the_child_workflow_of_a_step(self) -> None:
        page, _ = self.open("/ui/workflows/nest")
        steps = page.get_by_role("table", name="Steps")
        expect(support.rows(steps)).to_have_count(2)
        expect(support.rows(steps).nth(0).locator("td")).to_contain_text(["prepare", "delay"])
        expect(support.rows(steps).nth(1).locator("td")).to_contain_text(["sub", "workflow tick"])


class ForEach(support.BrowserTest):
    def wait_quick_items(self) -> None:
        """Until every quick item of ``fan-1`` has completed (the long ones run on)."""

        def completed() -> bool:
            steps = server.task("fan-1")["steps"]
            return sum(1 for s in steps if s["name"].startswith("each[") and s["state"] == "completed") == len(FAN_OUT) - 2

        support.eventually(completed, timeout=30, what="48 instances of fan-1 completed")

    def test_the_instances_are_grouped_under_their_step_with_their_states_counted(self) -> None:
        self.wait_quick_items()
        task = server.task("fan-1")
        self.assertEqual(len(task["steps"]), 1 + len(FAN_OUT), "the API's view: the step and an instance per item")

        page, _ = self.open("/ui/tasks/fan-1")
        table = page.get_by_role("table", name="Steps")
        # One row for the step, one for its instances: not a row per instance.
        expect(own_rows(table)).to_have_count(2)
        expect(own_rows(table).first.get_by_role("rowheader")).to_have_text("each")
        expect(own_rows(table).first.locator(".badge")).to_have_text("running")
        summary = table.locator("details summary")
        expect(summary).to_have_text("50 instances: 48 completed, 2 running")

        # Closed at first; open, each instance in item order with its state.
        instances = page.get_by_role("table", name="Instances of each")
        expect(instances).to_be_hidden()
        summary.click()
        expect(instances).to_be_visible()
        names = support.rows(instances).get_by_role("rowheader")
        expect(names).to_have_text([f"each[{i}]" for i in range(len(FAN_OUT))])
        states = support.rows(instances).locator(".badge")
        expect(states).to_have_text(["running", "running"] + ["completed"] * 48)

        # The graph has the step's node, counting its completed instances.
        node = page.locator('g.step-node[data-step="each"]')
        expect(node).to_have_attribute("data-state", "running")
        expect(node.locator("text.node-state")).to_have_text("running · 48/50")
        expect(page.locator("g.step-node")).to_have_count(1)

        # A redraw (the pause's event) keeps the instances open.
        support.mark(page)
        server.api("POST", "/v1/tasks/fan-1/pause")
        try:
            expect(subtitle(page).locator(".badge.paused")).to_have_text("paused")
            expect(instances).to_be_visible()
            self.assertTrue(support.still_marked(page), "redrawn in place, not reloaded")
        finally:
            server.api("POST", "/v1/tasks/fan-1/resume")

    def test_a_task_without_for_each_has_no_instances_row(self) -> None:
        page, _ = self.open("/ui/tasks/nest-1")
        table = page.get_by_role("table", name="Steps")
        expect(own_rows(table)).to_have_count(2)
        expect(table.locator("details")).to_have_count(0)


class ConcurrencyKeys(support.BrowserTest):
    def test_a_task_waiting_for_its_key_says_so_until_the_key_is_free(self) -> None:
        server.submit("serial", "key-1", {"customer": "c1"})
        server.wait_step("key-1", "hold", "running")
        server.submit("serial", "key-2", {"customer": "c1"})
        server.submit("serial", "key-3", {"customer": "c2"})
        server.wait_step("key-3", "hold", "running")
        waiting = server.task("key-2")
        self.assertEqual(
            (waiting["state"], waiting["concurrency_key"], waiting["waiting_for"]),
            ("pending", "customer=c1", "waiting for concurrency key customer=c1 (1/1 in use)"),
            "the API's view",
        )

        page, _ = self.open("/ui/tasks/key-2")
        note = subtitle(page).locator(".badge.waiting")
        expect(note).to_have_text("waiting for concurrency key customer=c1 (1/1 in use)")
        expect(support.region(page, "Fields").locator("dd").filter(has_text=re.compile(r"^customer=c1$"))).to_have_count(1)
        # Its step has not started: a light node, not a black one.
        node = page.locator('g.step-node[data-step="hold"]')
        expect(node).to_have_attribute("data-state", "not_started")
        self.assertEqual(node.locator("rect").evaluate("e => getComputedStyle(e).fill"), "rgb(249, 250, 251)")

        # Another key's task runs: no note, its own key in the Fields.
        other, _ = self.open("/ui/tasks/key-3")
        expect(subtitle(other).locator(".badge").first).to_have_text("processing")
        expect(subtitle(other).locator(".badge.waiting")).to_have_count(0)
        expect(support.region(other, "Fields")).to_contain_text("customer=c2")

        # The key's first task ends: the waiting one starts, and the open page says so.
        support.wait_live(page)
        server.api("POST", "/v1/tasks/key-1/signals/go", {})
        server.wait_step("key-2", "hold", "running")
        expect(note).to_have_count(0)
        expect(subtitle(page).locator(".badge").first).to_have_text("processing")
        for task_id in ("key-2", "key-3"):
            server.api("POST", f"/v1/tasks/{task_id}/signals/go", {})
            server.wait_task(task_id, {"processed"})
