"""Webhook signatures: a real signed delivery from ``rota serve`` checks
out under its secret, and not under another secret, with another body, or
long after it was signed."""

from __future__ import annotations

import http.server
import queue
import threading
import time
import unittest
import uuid
from collections.abc import Callable

from rota import Client, InvalidSignature, verify_webhook
from rota.webhooks import SIGNATURE_HEADER, sign

import support

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.stop()


Delivery = tuple[bytes, dict[str, str]]


class Receiver(http.server.ThreadingHTTPServer):
    """Answers 200 to every POST and keeps its raw body and headers (names
    in lower case)."""

    def __init__(self) -> None:
        self.deliveries: queue.Queue[Delivery] = queue.Queue()
        deliveries = self.deliveries

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                deliveries.put((body, {name.lower(): value for name, value in self.headers.items()}))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class Signatures(unittest.TestCase):
    def test_a_real_delivery_verifies_and_a_forged_or_stale_one_does_not(self) -> None:
        receiver = Receiver()
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        try:
            client = Client(server.url, token=support.ADMIN_TOKEN)
            task_id = f"hook-{uuid.uuid4().hex[:8]}"
            client.submit("greet", {"name": "eve"}, id=task_id, callback_url=receiver.url)
            self.assertEqual(client.wait(task_id, timeout=30)["state"], "processed")
            body, headers = self.delivery(receiver, "processed")
        finally:
            receiver.shutdown()
            receiver.server_close()

        signature = headers[SIGNATURE_HEADER.lower()]
        event = verify_webhook(body, signature, support.WEBHOOK_SECRET)
        self.assertEqual((event["task_id"], event["kind"]), (task_id, "processed"))
        self.assertEqual(str(event["seq"]), headers["rota-event-id"])
        self.assertEqual(verify_webhook(body, signature, support.WEBHOOK_SECRET.encode()), event)

        sent_at = int(signature.split(",")[0].removeprefix("t="))
        self.assertEqual(sign(support.WEBHOOK_SECRET, body, sent_at), signature, "the server's own scheme")
        refused: dict[str, Callable[[], object]] = {
            "another secret": lambda: verify_webhook(body, signature, "another-secret-of-some-length"),
            "another body": lambda: verify_webhook(body.replace(b"processed", b"cancelled"), signature, support.WEBHOOK_SECRET),
            "a replay": lambda: verify_webhook(body, signature, support.WEBHOOK_SECRET, now=sent_at + 301),
            "no header": lambda: verify_webhook(body, None, support.WEBHOOK_SECRET),
            "no v1": lambda: verify_webhook(body, f"t={sent_at}", support.WEBHOOK_SECRET),
            "a bad t": lambda: verify_webhook(body, signature.replace("t=", "t=x"), support.WEBHOOK_SECRET),
        }
        for what, check in refused.items():
            with self.subTest(what):
                with self.assertRaises(InvalidSignature):
                    check()
        # Within the tolerance either side, it is accepted.
        self.assertEqual(verify_webhook(body, signature, support.WEBHOOK_SECRET, now=sent_at + 299), event)
        self.assertEqual(verify_webhook(body, signature, support.WEBHOOK_SECRET, now=sent_at - 10), event)

    def delivery(self, receiver: Receiver, kind: str) -> Delivery:
        """The first delivery of an event of ``kind``."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                body, headers = receiver.deliveries.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if headers.get("rota-event-kind") == kind:
                return body, headers
        self.fail(f"no {kind} event delivered within 30 s; the server's log:\n{server.log()[-3000:]}")


if __name__ == "__main__":
    unittest.main()
