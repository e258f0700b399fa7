"""The tasks list: what the CLI submitted, the State, Workflow, Tag and Id
filters, Find by id, and paging through 120 tasks 50 at a time."""

from __future__ import annotations

import re
import threading
import urllib.parse

from playwright.sync_api import Page, expect

import support

server: support.Server
chromium: support.Chromium

GREET = ["list-greet-1", "list-greet-2", "list-greet-3"]
FAIL = ["list-fail-1", "list-fail-2"]
#: The tags of the greet tasks.
CUSTOMER_OF = {"list-greet-1": "ada", "list-greet-2": "bob", "list-greet-3": "ada"}
#: The paged list.
TICKS = [f"tick-{n:03}" for n in range(120)]


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()
    # 120 through the API (120 CLI processes would take long); then the
    # CLI's, the newest, on the list's first page.
    for task_id in TICKS:
        server.submit("tick", task_id)
    for task_id in GREET:
        customer = CUSTOMER_OF[task_id]
        server.cli("submit", "greet", "--input", '{"name": "ada"}', "--id", task_id, "--tag", f"customer={customer}", "--tag", "region=eu")
    for task_id in FAIL:
        server.cli("submit", "fail", "--id", task_id)
    for task_id in GREET + FAIL + TICKS:
        server.wait_task(task_id)


def tearDownModule() -> None:
    support.stop(server, chromium)


def listed(page: Page) -> list[str]:
    """The ids in the table "Tasks", in order."""
    table = page.get_by_role("table", name="Tasks")
    expect(table).to_be_visible()
    return [t.strip() for t in support.rows(table).locator("td:first-child a, th:first-child a").all_inner_texts()]


def query(page: Page) -> dict[str, list[str]]:
    return urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)


class TasksList(support.BrowserTest):
    def test_the_list_shows_the_tasks_submitted_from_the_cli_with_their_columns(self) -> None:
        page, _ = self.open("/ui/tasks")
        table = page.get_by_role("table", name="Tasks")
        for column in ["Id", "Workflow", "State", "Failures", "Tags", "Created", "Updated"]:
            expect(table.get_by_role("columnheader", name=column, exact=True)).to_have_count(1)
        for task_id in GREET + FAIL:
            with self.subTest(task_id):
                link = table.get_by_role("link", name=task_id, exact=True)
                expect(link).to_have_count(1)
                self.assertTrue((link.get_attribute("href") or "").endswith(f"/ui/tasks/{task_id}"))
        row = support.rows(table).filter(has=page.get_by_role("link", name="list-fail-1", exact=True))
        expect(row).to_contain_text("fail")
        expect(row).to_contain_text("error")

    def test_the_state_filter_lists_only_tasks_in_that_state(self) -> None:
        page, _ = self.open("/ui/tasks")
        page.get_by_label("State").select_option("error")
        expect(page).to_have_url(re.compile(r"[?&]state=error(&|$)"))
        expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(len(FAIL))
        self.assertEqual(sorted(listed(page)), sorted(FAIL))
        expect(page.get_by_label("State")).to_have_value("error")

    def test_the_tag_filter_and_a_tags_link_list_the_tasks_with_that_tag(self) -> None:
        page, _ = self.open("/ui/tasks")
        page.get_by_label("Tag").fill("customer=ada")
        page.get_by_label("Tag").press("Enter")
        expect(page).to_have_url(re.compile(r"[?&]tag=customer%3Dada(&|$)"))
        expect(page.locator("p.total")).to_have_text("2 tasks tagged customer=ada")
        self.assertEqual(listed(page), ["list-greet-3", "list-greet-1"])
        # A tag shown in a row leads to the tasks that have it.
        page, _ = self.open("/ui/tasks?workflow=greet")
        row = support.rows(page.get_by_role("table", name="Tasks")).filter(has=page.get_by_role("link", name="list-greet-2", exact=True))
        row.get_by_role("link", name="customer=bob", exact=True).click()
        expect(page).to_have_url(re.compile(r"[?&]tag=customer%3Dbob(&|$)"))
        self.assertEqual(listed(page), ["list-greet-2"])
        expect(page.get_by_label("Tag")).to_have_value("customer=bob")

    def test_the_id_filter_lists_the_tasks_whose_ids_start_so(self) -> None:
        page, _ = self.open("/ui/tasks")
        page.get_by_label("Id starts with").fill("list-fail")
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(re.compile(r"[?&]id_prefix=list-fail(&|$)"))
        expect(page.locator("p.total")).to_have_text("2 tasks with ids starting list-fail")
        self.assertEqual(sorted(listed(page)), sorted(FAIL))

    def test_the_workflow_filter_lists_only_that_workflows_tasks(self) -> None:
        page, _ = self.open("/ui/tasks")
        page.get_by_label("Workflow").select_option("greet")
        expect(page).to_have_url(re.compile(r"[?&]workflow=greet(&|$)"))
        expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(len(GREET))
        self.assertEqual(sorted(listed(page)), sorted(GREET))

    def test_both_filters_from_the_query_string(self) -> None:
        page, _ = self.open("/ui/tasks?state=processed&workflow=greet")
        expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(len(GREET))
        expect(page.get_by_label("State")).to_have_value("processed")
        expect(page.get_by_label("Workflow")).to_have_value("greet")
        page.goto("/ui/tasks?state=error&workflow=greet")
        expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(0)

    def test_find_by_id_leads_to_the_task(self) -> None:
        page, _ = self.open("/ui/tasks")
        page.get_by_label("Task id").fill("list-greet-2")
        page.get_by_role("button", name="Find", exact=True).click()
        # The task's page (or the list narrowed to it).
        expect(page.locator("h1")).to_have_text(re.compile(r"^(Task list-greet-2|Tasks)$"))
        if page.locator("h1").inner_text().strip() == "Tasks":
            self.assertEqual(listed(page), ["list-greet-2"])
        else:
            expect(page).to_have_url(re.compile(r"/ui/tasks/list-greet-2$"))

    def test_older_and_newer_walk_all_120_tasks_50_per_page(self) -> None:
        page, _ = self.open("/ui/tasks?workflow=tick")
        newer = page.get_by_role("link", name="Newer", exact=True)
        older = page.get_by_role("link", name="Older", exact=True)
        # The API's own order (newest first) is the list's.
        answer = server.api("GET", "/v1/tasks?workflow=tick&limit=1000")
        newest_first = [t["id"] for t in (answer["tasks"] if isinstance(answer, dict) else answer)]
        self.assertEqual(sorted(newest_first), sorted(TICKS))
        pages: list[list[str]] = []
        for expected in (newest_first[:50], newest_first[50:100], newest_first[100:]):
            expect(support.rows(page.get_by_role("table", name="Tasks"))).to_have_count(len(expected))
            ids = listed(page)
            pages.append(ids)
            self.assertEqual(ids, expected, f"page {len(pages)} of {page.url}")
            self.assertEqual(query(page).get("workflow"), ["tick"], "paging keeps the filter")
            self.assertEqual(support.usable(newer), len(pages) > 1, f"Newer on page {len(pages)}")
            self.assertEqual(support.usable(older), len(pages) < 3, f"Older on page {len(pages)}")
            if len(pages) < 3:
                older.first.click()
                expect(page).to_have_url(re.compile(rf"[?&]before={re.escape(ids[-1])}(&|$)"))
        self.assertEqual(sorted(sum(pages, [])), sorted(TICKS), "every task once")
        for expected in (pages[1], pages[0]):
            newer.first.click()
            expect(page.get_by_role("table", name="Tasks").get_by_role("link", name=expected[0], exact=True)).to_be_visible()
            self.assertEqual(listed(page), expected)
        self.assertFalse(support.usable(newer), "no Newer on the first page")
