"""The client against a real server: submit, wait, status, list, history,
events, cancel, resubmit, pause and resume, and how errors arrive."""

from __future__ import annotations

import http.server
import json
import queue
import subprocess
import sys
import threading
import time
import unittest
import uuid
from collections.abc import Callable
from pathlib import Path

from rota import ApiError, Client, Permanent, Step, Worker
from rota.errors import ApiError as ErrorsApiError

import support

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.stop()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class SubmitAndWait(unittest.TestCase):
    def test_the_submit_example_prints_the_tasks_result(self) -> None:
        # The program README shows, run as it is, with a submit-only token.
        program = support.EXAMPLES_DIR / "submit.py"
        done = subprocess.run(
            [sys.executable, str(program)], env=support.client_env(server, support.SUBMIT_TOKEN),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertTrue(done.stdout.startswith("processed "), done.stdout)
        self.assertIn("'echo': {'hello': 'ada'}", done.stdout)

    def test_readme_shows_the_examples_as_they_are(self) -> None:
        readme = (support.REPO_DIR / "README.md").read_text()
        for program in ("submit.py", "worker.py"):
            with self.subTest(program):
                self.assertIn((support.EXAMPLES_DIR / program).read_text(), readme)

    def test_submit_is_idempotent_by_id_and_wait_returns_the_terminal_task(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        task_id = fresh("g")
        task = client.submit("greet", {"name": "bob"}, id=task_id)
        self.assertEqual((task["id"], task["workflow"], task["version"]), (task_id, "greet", 1))
        again = client.submit("greet", {"name": "someone else"}, id=task_id)
        self.assertEqual(again["input"], {"name": "bob"}, "the id is the idempotency key")

        done = client.wait(task_id, timeout=30)
        self.assertEqual(done["state"], "processed")
        self.assertEqual(done["output"]["echo"], {"hello": "bob"})
        self.assertEqual([step["state"] for step in done["steps"]], ["completed", "completed"])
        self.assertEqual(client.status(task_id), done)

    def test_a_reply_queue_receives_the_tasks_status_events(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        queue = fresh("py.replies")
        task = client.submit("greet", {"name": "eve"}, id=fresh("r"), reply_queue=queue)
        self.assertEqual(task["reply_queue"], queue)
        self.assertEqual(client.wait(task["id"], timeout=30)["state"], "processed")
        store = f"sqlite://{Path(server.dir.name) / 'rota.db'}"
        events = []
        while True:
            received = subprocess.run(
                [support.rota_bin(), "--store", store, "queue", "receive", queue, "--max", "10", "--json"],
                capture_output=True, text=True, timeout=30, check=True,
            )  # fmt: skip
            batch = json.loads(received.stdout)
            if not batch:
                break
            for delivery in batch:
                self.assertEqual(delivery["body"]["correlation_id"], task["id"])
                events.append(delivery["body"]["event"])
                subprocess.run(
                    [support.rota_bin(), "--store", store, "queue", "complete", queue, delivery["lease_token"]],
                    capture_output=True, timeout=30, check=True,
                )  # fmt: skip
        self.assertEqual(events, ["received", "step_completed", "step_completed", "processed"])

    def test_a_delayed_submit_waits_pending_with_its_start_time(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        later = client.submit("greet", {"name": "ann"}, id=fresh("d"), delay="1h")
        self.assertEqual(later["state"], "pending")
        self.assertGreaterEqual(later["not_before"], later["created_at"] + 3_600_000)
        at = client.submit("greet", {"name": "ann"}, id=fresh("d"), start_at="2000-01-01T00:00:00Z")
        self.assertEqual(client.wait(at["id"], timeout=30)["state"], "processed", "a start already past runs now")

    def test_tasks_lists_and_filters(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        finished, sleeping = fresh("list-done"), fresh("list-nap")
        client.submit("greet", {"name": "c"}, id=finished)
        client.submit("nap", id=sleeping)
        client.wait(finished, timeout=30)

        processed = [task["id"] for task in client.tasks(state="processed", workflow="greet", limit=1000)]
        self.assertIn(finished, processed)
        self.assertNotIn(sleeping, processed)
        naps = [task["id"] for task in client.tasks(workflow="nap")]
        self.assertIn(sleeping, naps)
        self.assertNotIn(finished, naps)
        self.assertEqual(len(client.tasks(limit=1)), 1)
        client.cancel(sleeping)

    def test_a_parents_children_are_listed_and_counted(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        parent = fresh("shipment")
        client.submit("shipment", id=parent)
        self.assertEqual(client.wait(parent, timeout=30)["state"], "processed")
        children = client.tasks(parent=parent)
        self.assertEqual([(task["id"], task["workflow"]) for task in children], [(f"{parent}/ship#1", "parcel")])
        self.assertEqual(client.task_counts(parent=parent)["counts"]["processed"], 1)
        self.assertEqual(client.tasks(parent=children[0]["id"]), [], "a child without children of its own")

    def test_tasks_are_found_and_counted_by_tags_times_and_id_prefix(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        prefix = fresh("tagged")
        customer = fresh("customer")
        for n, region in enumerate(["eu", "us", "eu"]):
            task = client.submit("nap", id=f"{prefix}-{n}", tags={"customer": customer, "region": region})
            self.assertEqual(task["tags"], {"customer": customer, "region": region})
        both = [task["id"] for task in client.tasks(tags={"customer": customer, "region": "eu"})]
        self.assertEqual(both, [f"{prefix}-2", f"{prefix}-0"])
        self.assertEqual([task["id"] for task in client.tasks(id_prefix=f"{prefix}-1")], [f"{prefix}-1"])
        recent = client.tasks(tags={"customer": customer}, created_after="2000-01-01T00:00:00Z", limit=2)
        self.assertEqual(len(recent), 2)
        older = client.tasks(tags={"customer": customer}, before=recent[-1]["id"])
        self.assertEqual([task["id"] for task in older], [f"{prefix}-0"])
        client.cancel(f"{prefix}-1")
        ended = client.tasks(tags={"customer": customer}, ended_after="2000-01-01T00:00:00Z")
        self.assertEqual([task["id"] for task in ended], [f"{prefix}-1"])
        counts = client.task_counts(tags={"customer": customer})
        self.assertEqual((counts["total"], counts["counts"]["cancelled"]), (3, 1))
        self.assertEqual(client.task_counts(id_prefix=prefix, workflow="greet")["total"], 0)
        with self.assertRaises(ApiError) as refused:
            client.tasks(created_after="yesterday")
        self.assertEqual((refused.exception.status, refused.exception.code), (400, "invalid_query"))
        for n in (0, 2):
            client.cancel(f"{prefix}-{n}")

    def test_a_task_keeps_the_priority_it_was_submitted_with(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        urgent = client.submit("nap", id=fresh("urgent"), priority=-100)
        self.assertEqual(urgent["priority"], -100)
        self.assertEqual(client.status(urgent["id"])["priority"], -100)
        normal = client.submit("nap", id=fresh("normal"))
        self.assertEqual(normal["priority"], 0)
        with self.assertRaises(ApiError) as refused:
            client.submit("nap", id=fresh("too-high"), priority=101)
        self.assertEqual((refused.exception.status, refused.exception.code), (422, "invalid_body"))
        self.assertIn("-100 to 100", refused.exception.reason)
        client.cancel(urgent["id"])
        client.cancel(normal["id"])

    def test_a_batch_cancels_the_tasks_its_filter_selects(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        customer = fresh("bulk")
        ids = [fresh("bulk-task") for _ in range(3)]
        for task_id in ids:
            client.submit("nap", id=task_id, tags={"customer": customer})
        batch = client.create_batch("cancel", {"tag": [f"customer={customer}"]}, reason="test")
        self.assertEqual((batch["total"], batch["state"], batch["reason"]), (3, "running", "test"))
        deadline = time.monotonic() + 30
        while batch["state"] == "running":
            self.assertLess(time.monotonic(), deadline, f"the batch did not finish: {batch}")
            time.sleep(0.1)
            batch = client.batch(batch["id"])
        self.assertEqual((batch["state"], batch["done"], batch["failed"]), ("done", 3, 0))
        self.assertEqual({client.status(task_id)["state"] for task_id in ids}, {"cancelled"})
        self.assertIn(batch["id"], [b["id"] for b in client.batches(limit=50)])
        self.assertEqual(client.stop_batch(batch["id"], reason="done by hand")["state"], "done")
        with self.assertRaises(ApiError) as long:
            client.stop_batch(batch["id"], reason="x" * 1001)
        self.assertEqual((long.exception.status, long.exception.code), (422, "invalid_body"), "the reason is sent")
        with self.assertRaises(ApiError) as refused:
            client.create_batch("cancel", {})
        self.assertEqual((refused.exception.status, refused.exception.code), (422, "invalid_body"))
        # The batch is in the audit log with its reason, and so are the
        # cancels it made, read from each task's history.
        created = client.audit(action="batch.create", limit=100)
        self.assertIn((batch["id"], "test"), [(e["target"], e["reason"]) for e in created])
        cancels = client.audit(action="task.cancel", limit=1000)
        self.assertTrue(set(ids) <= {e["target"] for e in cancels}, cancels)
        first = client.audit(limit=1)
        self.assertEqual(len(first), 1)
        after = client.audit(limit=1, after=first[0]["cursor"])
        self.assertNotEqual(after[0]["cursor"], first[0]["cursor"])
        with self.assertRaises(ApiError) as refused:
            client.audit(action="task.explode")
        self.assertEqual((refused.exception.status, refused.exception.code), (400, "invalid_query"))

    def test_a_redrive_batch_sends_back_the_dead_letters_its_filter_selects(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        queue = fresh("py.dlq")
        store = f"sqlite://{Path(server.dir.name) / 'rota.db'}"

        def rota(*args: str) -> str:
            done = subprocess.run(
                [support.rota_bin(), "--store", store, *args], capture_output=True, text=True, timeout=30, check=True
            )  # fmt: skip
            return done.stdout

        rota("queue", "send", queue, "--body", '{"n": 1}')
        rota("queue", "send", queue, "--body", '{"n": 2}')
        for delivery in json.loads(rota("queue", "receive", queue, "--max", "10", "--json")):
            reason = "agent timeout" if delivery["body"]["n"] == 1 else "HTTP 400"
            rota("queue", "dead-letter", queue, delivery["lease_token"], "--reason", reason)
        batch = client.create_batch("redrive", dead_letters={"queue": queue, "reason_contains": "timeout"}, reason="fixed")
        self.assertEqual((batch["action"], batch["total"], batch["dead_letters"]["queue"]), ("redrive", 1, queue))
        deadline = time.monotonic() + 30
        while batch["state"] == "running":
            self.assertLess(time.monotonic(), deadline, f"the batch did not finish: {batch}")
            time.sleep(0.1)
            batch = client.batch(batch["id"])
        self.assertEqual((batch["state"], batch["done"], batch["skipped"]), ("done", 1, 0))
        back = json.loads(rota("queue", "receive", queue, "--max", "10", "--json"))
        self.assertEqual([d["body"]["n"] for d in back], [1], "only the timed-out one went back")
        with self.assertRaises(ApiError) as refused:
            client.create_batch("redrive")
        self.assertEqual((refused.exception.status, refused.exception.code), (422, "invalid_body"))
        self.assertTrue(refused.exception.reason.startswith("dead_letters"), refused.exception.reason)
        with self.assertRaises(ApiError) as refused:
            client.create_batch("cancel", {"state": "error"}, dead_letters={"queue": queue})
        self.assertEqual((refused.exception.status, refused.exception.code), (422, "invalid_body"))

    def test_a_paused_task_says_so_until_resumed(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        task_id = fresh("paused")
        client.submit("nap", id=task_id)
        self.assertTrue(client.pause(task_id, reason="maintenance")["paused"])
        with self.assertRaises(ApiError) as refused:
            client.pause(task_id)
        self.assertEqual((refused.exception.status, refused.exception.code), (409, "refused"))
        self.assertTrue(client.status(task_id)["paused"])
        self.assertFalse(client.resume(task_id)["paused"])
        history = client.history(task_id)
        paused = [event["detail"] for event in history if event["kind"] == "paused"]
        self.assertEqual(paused, [{"by": "api token with scope admin (admin)", "reason": "maintenance"}])
        self.assertEqual([event["detail"]["reason"] for event in history if event["kind"] == "resumed"], [None])
        with self.assertRaises(ApiError) as missing:
            client.pause(fresh("no-such-task"))
        self.assertEqual((missing.exception.status, missing.exception.code), (404, "not_found"))
        self.assertEqual(client.cancel(task_id, reason="not needed"), "cancelled")
        cancelled = [event["detail"] for event in client.history(task_id) if event["kind"] == "cancelled"]
        self.assertEqual(cancelled, [{"compensate": False, "by": "api token with scope admin (admin)", "reason": "not needed"}])

    def test_a_paused_workflows_tasks_wait_until_it_is_resumed(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        paused = client.pause_workflow("gated", reason="maintenance")
        try:
            self.assertEqual(
                (paused["workflow"], paused["paused"], paused["by"], paused["reason"]),
                ("gated", True, "api token with scope admin (admin)", "maintenance"),
            )
            listed = next(workflow for workflow in client.workflows() if workflow["name"] == "gated")
            self.assertTrue(listed["paused"])
            self.assertEqual(listed["pause"], paused)
            with self.assertRaises(ApiError) as refused:
                client.pause_workflow("gated")
            self.assertEqual((refused.exception.status, refused.exception.code), (409, "refused"))
            task_id = fresh("gated")
            client.submit("gated", id=task_id)
            time.sleep(0.5)
            waiting = client.status(task_id)
            self.assertEqual((waiting["state"], waiting["workflow_paused"]), ("pending", True))
        finally:
            resumed = client.resume_workflow("gated")
        self.assertFalse(resumed["paused"])
        self.assertEqual(client.wait(task_id, timeout=30)["state"], "processed")
        with self.assertRaises(ApiError) as missing:
            client.pause_workflow("no-such-workflow")
        self.assertEqual((missing.exception.status, missing.exception.code), (404, "unknown_workflow"))

    def test_a_task_its_concurrency_key_holds_back_says_what_it_waits_for(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        customer = fresh("customer")
        first = client.submit("serial", {"customer": customer}, id=fresh("serial"))
        deadline = time.monotonic() + 30
        while (running := client.status(first["id"]))["state"] != "processing":
            self.assertLess(time.monotonic(), deadline, f"the first task did not start: {running}")
            time.sleep(0.05)
        second = client.submit("serial", {"customer": customer}, id=fresh("serial"))
        waiting = client.status(second["id"])
        key = f"customer={customer}"
        self.assertEqual((waiting["state"], waiting.get("concurrency_key")), ("pending", key))
        self.assertEqual(waiting.get("waiting_for"), f"waiting for concurrency key {key} (1/1 in use)")
        self.assertEqual(running.get("concurrency_key"), key)
        self.assertNotIn("waiting_for", running, "it holds the key's slot")
        unkeyed = client.submit("nap", id=fresh("unkeyed"))
        self.assertNotIn("concurrency_key", client.status(unkeyed["id"]))
        for task_id in (second["id"], first["id"], unkeyed["id"]):
            client.cancel(task_id)

    def test_tasks_page_with_before(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        ids = [fresh("page") for _ in range(3)]
        for task_id in ids:
            client.submit("nap", id=task_id)
        page = [task["id"] for task in client.tasks(workflow="nap", before=ids[2], limit=2)]
        self.assertEqual(page, [ids[1], ids[0]])
        with self.assertRaises(ApiError) as raised:
            client.tasks(before=fresh("no-such-task"))
        self.assertEqual((raised.exception.status, raised.exception.code), (400, "invalid_query"))
        for task_id in ids:
            client.cancel(task_id)

    def test_events_follow_a_task_until_it_ends_and_resume_after_a_seq(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        task_id = fresh("ev")
        client.submit("greet", {"name": "dee"}, id=task_id)
        events = list(client.events(task_id))
        kinds = [event["kind"] for event in events]
        self.assertEqual(kinds[0], "received")
        self.assertEqual(kinds[-1], "processed")
        self.assertIn("step_completed", kinds)
        self.assertTrue(all(event["task_id"] == task_id for event in events))
        self.assertEqual(events, client.history(task_id))

        resumed = list(client.events(task_id, after=events[1]["seq"]))
        self.assertEqual(resumed, events[2:])

    def test_a_signal_completes_the_step_that_waits_for_it(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        task_id = fresh("approval")
        client.submit("approval", id=task_id)
        delivery = client.signal(task_id, "approved", {"by": "ada"})
        self.assertEqual(delivery["step"], "approval")
        done = client.wait(task_id, timeout=30)
        self.assertEqual(done["state"], "processed")
        self.assertEqual(done["output"], {"approval": {"by": "ada"}, "echo": {"by": "ada"}})
        self.assertEqual([step["waits_for"] for step in done["steps"]], ["approved", None])
        with self.assertRaises(ApiError) as refused:
            client.signal(task_id, "approved")
        self.assertEqual(refused.exception.code, "refused")
        other = fresh("approval")
        client.submit("approval", id=other)
        with self.assertRaises(ApiError) as unknown:
            client.signal(other, "rejected")
        self.assertEqual(unknown.exception.code, "invalid_signal")
        client.signal(other, "approved")  # without data: JSON null
        approval = client.wait(other, timeout=30)["steps"][0]
        self.assertEqual((approval["state"], approval["output"]), ("completed", None))

    def test_a_callback_completes_or_fails_the_step_whose_request_carried_its_token(self) -> None:
        # A remote service that accepts each request and keeps its token.
        tokens: queue.Queue[str] = queue.Queue()

        class Service(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                tokens.put(self.headers.get("Rota-Callback-Token") or "")
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Service)
        threading.Thread(target=service.serve_forever, daemon=True).start()
        self.addCleanup(service.shutdown)
        url = f"http://127.0.0.1:{service.server_address[1]}/payouts"
        payout = {"name": "payout", "version": 1, "on_exhausted": "error", "max_failures": 1, "steps": [
            {"name": "payout", "agent": "http", "callback": True, "timeout": "5m", "with": {"method": "POST", "url": url}},
        ]}  # fmt: skip
        admin = Client(server.url, token=support.ADMIN_TOKEN)
        admin._http.call("POST", "/v1/workflows", payout)

        # The service's client needs no API token: the callback token is the credential.
        service_client = Client(server.url)
        paid = fresh("payout")
        admin.submit("payout", id=paid)
        token = tokens.get(timeout=30)
        accepted = service_client.complete_callback(token, {"payout_id": "po-1"})
        self.assertEqual(accepted, {"task_id": paid, "step": "payout", "attempt": 1, "completed": True})
        done = admin.wait(paid, timeout=30)
        self.assertEqual((done["state"], done["output"]), ("processed", {"payout": {"payout_id": "po-1"}}))
        with self.assertRaises(ApiError) as used:
            service_client.complete_callback(token)
        self.assertEqual(used.exception.code, "refused")
        with self.assertRaises(ApiError) as forged:
            service_client.fail_callback("not-a-token", "declined")
        self.assertEqual(forged.exception.code, "unknown_callback")

        declined = fresh("payout")
        admin.submit("payout", id=declined)
        accepted = service_client.fail_callback(tokens.get(timeout=30), "card declined")
        self.assertFalse(accepted["completed"])
        failed = admin.wait(declined, timeout=30)
        self.assertEqual(failed["state"], "error")
        self.assertIn("card declined", failed["error"] or "")

    def test_wait_gives_up_after_its_timeout(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        task_id = fresh("nap")
        client.submit("nap", id=task_id)
        started = time.monotonic()
        with self.assertRaises(TimeoutError):
            client.wait(task_id, timeout=1.0)
        self.assertLess(time.monotonic() - started, 10.0)
        self.assertEqual(client.cancel(task_id), "cancelled")
        self.assertEqual(client.wait(task_id, timeout=30)["state"], "cancelled")

    def test_a_task_in_error_runs_again_when_resubmitted(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500)
        declined = threading.Event()
        declined.set()

        @worker.step("payments")
        def charge(step: Step) -> dict[str, str]:
            if declined.is_set():
                raise Permanent("card declined")
            return {"charged": step.input["card"]}

        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            task_id = fresh("resubmit")
            client.submit("pay", {"card": "ok", "flaky": False}, id=task_id)
            failed = client.wait(task_id, timeout=30)
            self.assertEqual(failed["state"], "error")
            self.assertIn("card declined", failed["steps"][0]["last_error"] or "")
            with self.assertRaises(ApiError) as refused:
                client.cancel(task_id)
            self.assertEqual((refused.exception.status, refused.exception.code), (409, "refused"))

            declined.clear()
            self.assertIn(client.resubmit(task_id, reason="the card works now"), ("pending", "processing"))
            done = client.wait(task_id, timeout=30)
            self.assertEqual((done["state"], done["output"]), ("processed", {"charge": {"charged": "ok"}}))
            [resubmitted] = [event["detail"] for event in client.history(task_id) if event["kind"] == "resubmitted"]
            self.assertEqual((resubmitted["by"], resubmitted["reason"]), ("api token with scope admin (admin)", "the card works now"))
            with self.assertRaises(ApiError) as refused:
                client.resubmit(task_id, step="charge")
            self.assertEqual(refused.exception.code, "refused")
        finally:
            worker.stop()
            thread.join(30)


class ResubmitWithInput(unittest.TestCase):
    def test_a_step_runs_again_on_a_new_input(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500)

        @worker.step("payments")
        def charge(step: Step) -> dict[str, str]:
            if step.input["card"] == "expired":
                raise Permanent("card expired")
            return {"charged": step.input["card"]}

        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            task_id = fresh("new-input")
            client.submit("pay", {"card": "expired", "flaky": False}, id=task_id)
            self.assertEqual(client.wait(task_id, timeout=30)["state"], "error")
            with self.assertRaises(ValueError):
                client.resubmit(task_id, input={"card": "new"})
            state = client.resubmit(task_id, step="charge", input={"card": "renewed", "flaky": False}, reason="renewed card")
            self.assertIn(state, ("pending", "processing"))
            done = client.wait(task_id, timeout=30)
            self.assertEqual((done["state"], done["input"]), ("processed", {"card": "renewed", "flaky": False}))
            self.assertEqual(done["output"], {"charge": {"charged": "renewed"}})
            [resubmitted] = [event for event in client.history(task_id) if event["kind"] == "resubmitted"]
            self.assertEqual(
                resubmitted["detail"]["input"],
                {"old": {"card": "expired", "flaky": False}, "new": {"card": "renewed", "flaky": False}},
            )
            self.assertEqual(resubmitted["detail"]["reason"], "renewed card")
            with self.assertRaises(ApiError) as refused:
                client.resubmit(task_id, step="charge", input={"card": "again"})
            self.assertEqual(refused.exception.code, "refused")
            self.assertEqual(client.status(task_id)["input"], {"card": "renewed", "flaky": False})
        finally:
            worker.stop()
            thread.join(30)


class Errors(unittest.TestCase):
    def test_every_error_is_an_api_error_with_the_servers_code_and_reason(self) -> None:
        client = Client(server.url, token=support.ADMIN_TOKEN)
        cases: list[tuple[Callable[[], object], int, str, str]] = [
            (lambda: client.status("no-such-task"), 404, "not_found", "no-such-task"),
            (lambda: client.submit("no-such-workflow"), 404, "unknown_workflow", "no-such-workflow"),
            (lambda: client.tasks(state="bogus"), 400, "invalid_query", "state"),  # type: ignore[arg-type]
            (lambda: client.tasks(limit=0), 400, "invalid_query", "limit"),
            (lambda: client.resubmit(fresh("none"), step="x"), 404, "not_found", "none"),
            (lambda: Client(server.url, token="not-a-token-of-this-server").tasks(), 401, "unauthorized", ""),
            # A submit token lists its own tasks, but may not cancel.
            (lambda: Client(server.url, token=support.SUBMIT_TOKEN).cancel("no-such-task"), 403, "forbidden", ""),
        ]
        for call, status, code, named in cases:
            with self.subTest(code=code, named=named):
                with self.assertRaises(ApiError) as raised:
                    call()
                error = raised.exception
                self.assertEqual((error.status, error.code), (status, code), error)
                self.assertIn(named, error.reason)
                self.assertIn(code, str(error))
        self.assertIs(ApiError, ErrorsApiError)

    def test_an_answer_that_is_not_the_apis_error_shape_keeps_its_status(self) -> None:
        error = ApiError.from_answer(502, b"<html>Bad Gateway</html>")
        self.assertEqual((error.status, error.code, error.reason), (502, "http_502", "<html>Bad Gateway</html>"))

    def test_an_unreachable_server_is_an_os_error(self) -> None:
        with self.assertRaises(OSError):
            Client("http://127.0.0.1:9", timeout=5).status("x")

    def test_a_url_that_is_not_http_is_refused_at_once(self) -> None:
        with self.assertRaises(ValueError):
            Client("ftp://example")


if __name__ == "__main__":
    unittest.main()
