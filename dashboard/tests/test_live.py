"""Live updates from the event stream: no reload needed to see a new task
or a step's progress."""

from __future__ import annotations

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()


def tearDownModule() -> None:
    support.stop(server, chromium)


class Live(support.BrowserTest):
    def test_a_task_submitted_from_the_cli_appears_on_the_open_tasks_page_without_a_reload(self) -> None:
        page, _ = self.open("/ui/tasks")
        support.wait_live(page)
        support.mark(page)
        server.cli("submit", "greet", "--input", '{"name": "live"}', "--id", "live-new")
        expect(page.get_by_role("table", name="Tasks").get_by_role("link", name="live-new", exact=True)).to_be_visible(timeout=5_000)
        self.assertTrue(support.still_marked(page), "the page was reloaded")

    def test_a_running_tasks_step_nodes_change_colour_without_a_reload(self) -> None:
        server.cli("submit", "stages", "--id", "live-stages")
        server.wait_step("live-stages", "first", "running")
        page, _ = self.open("/ui/tasks/live-stages")
        support.wait_live(page)
        support.mark(page)
        first = page.locator('g.step-node[data-step="first"]')
        second = page.locator('g.step-node[data-step="second"]')
        expect(second).to_have_attribute("data-state", "not_started")
        fill = "e => getComputedStyle(e.querySelector('rect')).fill"
        colours = [second.evaluate(fill)]
        expect(second).to_have_attribute("data-state", "running", timeout=10_000)
        expect(first).to_have_attribute("data-state", "completed")
        colours.append(second.evaluate(fill))
        expect(second).to_have_attribute("data-state", "completed", timeout=10_000)
        colours.append(second.evaluate(fill))
        self.assertEqual(len(set(colours)), 3, f"the node's colours not_started, running, completed: {colours}")
        self.assertTrue(support.still_marked(page), "the page was reloaded")
