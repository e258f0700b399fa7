"""The harness itself, on a page the server has served for long: the
Swagger UI at /docs. Proves that Chromium starts, that a page of the server
loads under watch, and that the watch catches what it must."""

from __future__ import annotations

import support

server: support.Server
chromium: support.Chromium


def setUpModule() -> None:
    global server, chromium
    server, chromium = support.start()


def tearDownModule() -> None:
    support.stop(server, chromium)


class Harness(support.BrowserTest):
    def test_swagger_ui_loads_the_api_document_with_no_error_and_no_other_host(self) -> None:
        page, _ = self.open("/docs/")
        # Swagger UI renders an operation per route once it has fetched and
        # parsed /openapi.json.
        page.locator(".opblock-summary-path", has_text="/v1/tasks/{id}/cancel").first.wait_for()
        self.assertGreater(page.locator(".opblock").count(), 20)

    def test_the_watch_blocks_and_reports_a_request_to_another_host(self) -> None:
        context, watch = self.new_context()
        page = context.new_page()
        page.on("console", watch.console)
        page.goto("/docs/")
        page.evaluate("fetch('http://example.invalid/x').catch(() => {})")
        page.wait_for_timeout(300)
        self.assertEqual(watch.foreign_requests, ["GET http://example.invalid/x"])
        self.assertTrue(any("ERR_BLOCKED_BY_CLIENT" in e for e in watch.console_errors), watch.console_errors)
        watch.foreign_requests.clear()  # seen; not a failure of this test
        watch.allow("ERR_BLOCKED_BY_CLIENT")

    def test_the_watch_reports_console_errors_and_error_responses(self) -> None:
        context, watch = self.new_context()
        page = context.new_page()
        page.on("console", watch.console)
        page.on("pageerror", watch.page_error)
        page.on("response", watch.response)
        page.goto("/docs/")
        page.evaluate("console.error('on purpose')")
        page.evaluate("setTimeout(() => { throw new Error('thrown on purpose') }, 0)")
        page.evaluate("fetch('/v1/tasks/no-such-task').catch(() => {})")
        support.eventually(lambda: len(watch.console_errors) >= 2 and watch.failed_requests, what="the errors reported")
        problems = "\n".join(watch.problems())
        self.assertIn("on purpose", problems)
        self.assertIn("thrown on purpose", problems)
        self.assertIn("/v1/tasks/no-such-task: HTTP 404", problems)
        watch.allow(".")  # seen; not a failure of this test

    def test_the_api_and_the_cli_reach_the_server(self) -> None:
        server.cli("submit", "greet", "--input", '{"name": "ada"}', "--id", "harness-1")
        done = server.wait_task("harness-1")
        self.assertEqual(done["state"], "processed", done)
        self.assertEqual(done["output"]["echo"], {"hello": "ada"})
