"""Every page of the dashboard: it loads with no console error, no failed
request and no request to another host, has the main navigation and its
one <h1>, and connects to the event stream."""

from __future__ import annotations

import re

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    # Something on every page: a task in each end state and one running,
    # an alert, a dead letter.
    server.cli("submit", "greet", "--input", '{"name": "ada"}', "--id", "pages-done")
    server.cli("submit", "fail", "--id", "pages-error")
    server.cli("submit", "refund", "--id", "pages-undone")
    server.cli("submit", "nap", "--id", "pages-running")
    for task_id, state in [("pages-done", "processed"), ("pages-error", "error"), ("pages-undone", "compensated")]:
        server.wait_task(task_id, {state})
    server.wait_task("pages-running", {"processing"})
    support.dead_letter(server, "pages-dlq", [{"n": 1}])


def tearDownModule() -> None:
    support.stop(server, chromium)


#: Each page and its <h1>.
PAGES = [
    ("/ui", "Overview"),
    ("/ui/tasks", "Tasks"),
    ("/ui/tasks?state=error&workflow=fail", "Tasks"),
    ("/ui/tasks/pages-done", "Task pages-done"),
    ("/ui/tasks/pages-error", "Task pages-error"),
    ("/ui/tasks/pages-undone", "Task pages-undone"),
    ("/ui/tasks/pages-running", "Task pages-running"),
    ("/ui/alerts", "Alerts"),
    ("/ui/queues", "Queues"),
    ("/ui/queues/pages-dlq", "Queue pages-dlq"),
    ("/ui/queues/agent.delay", "Queue agent.delay"),
    ("/ui/workflows", "Workflows"),
    ("/ui/workflows/refund", "Workflow refund"),
    ("/ui/schedules", "Schedules"),
    ("/ui/batches", "Batches"),
]


class EveryPage(support.BrowserTest):
    def test_every_page_loads_with_nav_h1_and_live_stream_and_no_console_error_or_other_host(self) -> None:
        for path, heading in PAGES:
            with self.subTest(path):
                page, watch = self.open(path)
                expect(page.locator("h1")).to_have_count(1)
                expect(page.locator("h1")).to_have_text(heading)
                nav = page.get_by_role("navigation", name="Main")
                for name in support.NAV_LINKS:
                    expect(nav.get_by_role("link", name=name, exact=True)).to_have_count(1)
                # A finished task's stream ends after its history.
                support.wait_live(page, or_ended=path.startswith("/ui/tasks/") and path != "/ui/tasks/pages-running")
                # Let late requests (the stream's first events, lazy
                # fetches) happen before judging.
                page.wait_for_timeout(250)
                problems = watch.problems()
                watch.allow(".")  # judged here, page by page
                self.assertEqual(problems, [], f"{path}: {problems}")
                page.close()

    def test_rota_api_serves_the_dashboard_too(self) -> None:
        api = support.ApiServer(server)
        self.addCleanup(api.stop)
        context, _ = self.new_context(api.url)
        page, _ = self.open("/ui/tasks?workflow=fail", context)
        expect(page.locator("h1")).to_have_text("Tasks")
        expect(page.get_by_role("table", name="Tasks").get_by_role("link", name="pages-error", exact=True)).to_be_visible()
        support.wait_live(page)

    def test_the_root_redirects_to_the_overview(self) -> None:
        page, _ = self.open("/")
        expect(page).to_have_url(re.compile(r"/ui/?$"))
        expect(page.locator("h1")).to_have_text("Overview")

    def test_the_nav_links_lead_to_their_pages(self) -> None:
        page, _ = self.open("/ui")
        nav = page.get_by_role("navigation", name="Main")
        for name, heading in [("Tasks", "Tasks"), ("Alerts", "Alerts"), ("Queues", "Queues"), ("Workflows", "Workflows"), ("Overview", "Overview")]:
            with self.subTest(name):
                nav.get_by_role("link", name=name, exact=True).click()
                expect(page.locator("h1")).to_have_text(heading)

    def test_the_overview_shows_its_regions_and_links_each_state_to_the_filtered_list(self) -> None:
        page, _ = self.open("/ui")
        for name in ["Tasks by state", "Activity", "Open alerts", "Circuit breakers", "Queues", "Instances"]:
            with self.subTest(region=name):
                expect(support.region(page, name)).to_be_visible()
        by_state = support.region(page, "Tasks by state")
        for state in ["processed", "error", "compensated", "processing"]:
            with self.subTest(state=state):
                link = by_state.get_by_role("link", name=re.compile(rf"^\s*{state}\s+1\s*$"))
                expect(link).to_have_count(1)
                self.assertRegex(link.get_attribute("href") or "", rf"/ui/tasks\?(.*&)?state={state}(&|$)")
        by_state.get_by_role("link", name=re.compile(r"^\s*error\s+1\s*$")).click()
        expect(page).to_have_url(re.compile(r"/ui/tasks\?(.*&)?state=error"))
        table = page.get_by_role("table", name="Tasks")
        expect(support.rows(table)).to_have_count(1)
        expect(table.get_by_role("link", name="pages-error", exact=True)).to_be_visible()

    def test_the_overview_tables_fit_their_regions_at_1280_wide(self) -> None:
        page, _ = self.open("/ui")
        expect(support.region(page, "Queues").locator("table")).to_be_visible()
        overflowing = []
        for name in ["Open alerts", "Circuit breakers", "Queues", "Instances"]:
            content, box = support.region(page, name).evaluate("s => [s.scrollWidth, s.clientWidth]")
            if content > box:
                overflowing.append(f"region {name!r}: content {content} px wide in {box} px")
        self.assertEqual(overflowing, [])

    def test_the_overview_lists_the_open_alert_and_this_instance(self) -> None:
        page, _ = self.open("/ui")
        expect(support.region(page, "Open alerts")).to_contain_text("pages-error")
        expect(support.region(page, "Instances")).to_contain_text("dashboard-tests")

    def test_the_alerts_page_lists_the_alert_with_a_link_to_its_task(self) -> None:
        page, _ = self.open("/ui/alerts")
        table = page.get_by_role("table", name="Alerts")
        for column in ["At", "Task", "Step", "Reason"]:
            expect(table.get_by_role("columnheader", name=column, exact=True)).to_have_count(1)
        link = table.get_by_role("link", name="pages-error", exact=True)
        expect(link.first).to_be_visible()
        expect(support.rows(table).filter(has=page.get_by_role("link", name="pages-error", exact=True)).first).to_contain_text("explode")
        link.first.click()
        expect(page.locator("h1")).to_have_text("Task pages-error")

    def test_the_queues_page_lists_every_queue_with_its_counts(self) -> None:
        page, _ = self.open("/ui/queues")
        table = page.get_by_role("table", name="Queues")
        for column in ["Ready", "Leased", "Delayed", "Dead-lettered", "Paused", "Oldest"]:
            expect(table.get_by_role("columnheader", name=column, exact=True)).to_have_count(1)
        queues = server.api("GET", "/v1/queues")
        names = [q["queue"] for q in (queues["queues"] if isinstance(queues, dict) else queues)]
        self.assertIn("pages-dlq", names)
        for name in names:
            expect(table.get_by_role("link", name=name, exact=True)).to_have_count(1)
        row = support.rows(table).filter(has=page.get_by_role("link", name="pages-dlq", exact=True))
        # Dead-lettered: 1 (the column's own cell).
        # Text content, not the rendered text (which CSS may upper-case).
        headers = [h.strip() for h in table.locator("thead th").all_text_contents()]
        cells = [c.strip() for c in row.locator("td, th").all_text_contents()]
        self.assertEqual(cells[headers.index("Dead-lettered")], "1", dict(zip(headers, cells)))

    def test_the_workflows_page_and_a_workflow_show_versions_dag_and_definition(self) -> None:
        page, _ = self.open("/ui/workflows")
        table = page.get_by_role("table", name="Workflows")
        for name in support.WORKFLOWS:
            expect(table.get_by_role("link", name=name, exact=True)).to_have_count(1)
        table.get_by_role("link", name="refund", exact=True).click()
        expect(page.locator("h1")).to_have_text("Workflow refund")
        version = page.get_by_label("Version")
        expect(version).to_have_value("1")
        svg = page.locator("svg[role=img] g.step-node")
        expect(svg).to_have_count(2)
        expect(page.locator('g.step-node[data-step="charge"]')).to_have_count(1)
        expect(page.locator('g.step-node[data-step="ship"]')).to_have_count(1)
        expect(support.region(page, "Definition").locator("pre")).to_contain_text("ship")
        # A step's condition has a column of its own.
        page, _ = self.open("/ui/workflows/choose")
        upgrade = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="upgrade")
        expect(upgrade.locator("code")).to_have_text("steps.check.output.vip")
