"""The overview's circuit breakers: a shared breaker that opened on a
failing endpoint, then its probe (who holds it, until when), then closed.

The endpoint is a small HTTP server of the test's own: it answers 503 until
told to hold its requests, so the breaker opens (5 failures in a row) and,
once its 10 s are up, the probe's call stays out while the page shows it."""

from __future__ import annotations

import http.server
import re
import threading
from typing import Any

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium

#: How long the endpoint holds a request at most (the probe's call).
HOLD_S = 60.0


class Endpoint(http.server.ThreadingHTTPServer):
    """Answers 503 while ``failing``; else holds each request until
    ``released``, then answers 200."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.failing = True
        self.released = threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: Endpoint

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.server.failing:
            self.answer(503, b'{"error": "down"}')
            return
        self.server.released.wait(HOLD_S)
        self.answer(200, b'{"ok": true}')

    def answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


endpoint: Endpoint


def setUpModule() -> None:
    global server, chromium, endpoint
    endpoint = Endpoint()
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    server, chromium = support.start()


def tearDownModule() -> None:
    endpoint.released.set()
    try:
        support.stop(server, chromium)
    finally:
        endpoint.shutdown()
        endpoint.server_close()


def breaker() -> Any:
    """The API's breaker of the test's endpoint, if there is one."""
    found = [b for b in server.api("GET", "/v1/breakers") if b["endpoint"] == endpoint.url]
    return found[0] if found else None


class Breakers(support.BrowserTest):
    def test_a_shared_breaker_shows_its_state_then_who_probes_until_when(self) -> None:
        server.submit("outage", "outage-1", {"url": f"{endpoint.url}/x"})
        opened = support.eventually(lambda: (b := breaker()) is not None and b["state"] == "open" and b, timeout=30, what="the breaker open")
        self.assertTrue(opened["shared"], f"the API's view: {opened}")

        page, _ = self.open("/ui")
        table = page.get_by_role("table", name="Circuit breakers")
        row = support.rows(table).filter(has_text=endpoint.url)
        expect(row.locator(".badge")).to_have_text("open")
        headers = [h.strip() for h in table.locator("thead th").all_text_contents()]
        cells = dict(zip(headers, (c.strip() for c in row.locator("td").all_text_contents())))
        self.assertEqual(cells["Probe"], "—", cells)
        # Under its state: kept in the store, shared by every process.
        expect(row.locator(".scope")).to_have_text("shared")
        expect(row.locator(".scope")).to_have_attribute("title", re.compile("^Shared through the store"))
        self.assertEqual(cells["Failures"], str(opened["consecutive_failures"]), cells)

        # Once it may, one call probes the endpoint, which holds it.
        endpoint.failing = False
        probing = support.eventually(lambda: (b := breaker()) is not None and b["probe_holder"] and b, timeout=40, what="a probe out")
        self.assertEqual(probing["state"], "half_open", probing)
        self.assertIsNotNone(probing["probe_until"], probing)
        expect(row.locator(".badge")).to_have_text("half_open", timeout=15_000)
        probe = row.locator("td").nth(headers.index("Probe"))
        expect(probe).to_contain_text(probing["probe_holder"])
        expect(probe.locator(".until")).to_have_text(re.compile(r"^until in \d+ s$"))
        expect(probe.locator("time")).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\dT"))
        content, box = support.region(page, "Circuit breakers").evaluate("s => [s.scrollWidth, s.clientWidth]")
        self.assertLessEqual(content, box, "the table fits its region at 1280 wide")

        # The probe succeeds: closed, the row goes, the task ends.
        endpoint.released.set()
        server.wait_task("outage-1", {"processed"}, timeout=30)
        expect(support.region(page, "Circuit breakers")).to_contain_text("Every circuit breaker is closed.", timeout=15_000)
