"""A callback step on a task's page: it says who completes it, stays
running after its service accepted the request, and turns completed
without a reload when the service calls back."""

from __future__ import annotations

import http.server
import queue
import threading
from typing import Any

from playwright.sync_api import expect

import support

server: support.Server
chromium: support.Chromium
service: http.server.ThreadingHTTPServer
tokens: queue.Queue[str] = queue.Queue()


class Service(http.server.BaseHTTPRequestHandler):
    """A remote service that accepts each request and keeps its token, to
    call back later."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        tokens.put(self.headers.get("Rota-Callback-Token") or "")
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"accepted": true}')

    def log_message(self, format: str, *args: Any) -> None:
        pass


def setUpModule() -> None:
    global server, chromium, service
    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=service.serve_forever, daemon=True).start()
    server, chromium = support.start()
    url = f"http://127.0.0.1:{service.server_address[1]}/payouts"
    definition = {
        "name": "payout",
        "version": 1,
        "steps": [
            {"name": "payout", "agent": "http", "callback": True, "timeout": "5m", "with": {"method": "POST", "url": url}},
        ],
    }
    server.api("POST", "/v1/workflows", definition)


def tearDownModule() -> None:
    support.stop(server, chromium)
    service.shutdown()


class CallbackStep(support.BrowserTest):
    def test_a_callback_step_waits_for_its_service_then_completes_live(self) -> None:
        server.submit("payout", "page-callback")
        token = tokens.get(timeout=30)
        self.assertTrue(token, "the request carried a callback token")
        page, _ = self.open("/ui/tasks/page-callback")
        support.wait_live(page)
        row = support.rows(page.get_by_role("table", name="Steps")).filter(has_text="payout")
        expect(row).to_contain_text("http, then its callback")
        expect(row.locator(".badge")).to_have_text("running")

        status, answer, _ = server.request("POST", f"/v1/callbacks/{token}", {"output": {"paid": 42}}, auth=False)
        self.assertEqual((status, answer["completed"]), (200, True), answer)
        expect(row.locator(".badge")).to_have_text("completed")
        history = support.region(page, "History")
        expect(history).to_contain_text("callback")
        output = support.region(page, "Output")
        expect(output).to_contain_text('"paid": 42')
