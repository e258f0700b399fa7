"""The worker helper against a real server: the README's worker, retryable
and permanent faults, lease renewal, the bound on steps at once, and
workers killed (SIGKILL) or stopped (SIGTERM) in the middle of a step."""

from __future__ import annotations

import signal
import threading
import time
import unittest
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from rota import ApiError, Client, Json, Permanent, Retryable, Step, Worker

import support

server: support.Server


def setUpModule() -> None:
    global server
    server = support.Server()


def tearDownModule() -> None:
    server.stop()


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def admin() -> Client:
    return Client(server.url, token=support.ADMIN_TOKEN)


@contextmanager
def running(worker: Worker) -> Iterator[threading.Thread]:
    """The worker in a thread of this process, stopped at the end."""
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(60)


class Example(unittest.TestCase):
    def test_the_worker_example_serves_its_agent_and_stops_on_sigterm(self) -> None:
        # The program README shows, run as it is, with a worker token.
        worker = support.Child(support.EXAMPLES_DIR / "worker.py", support.client_env(server, support.WORKER_TOKEN))
        try:
            task_id = fresh("hello")
            admin().submit("hello", {"name": "ada"}, id=task_id)
            done = admin().wait(task_id, timeout=30)
            self.assertEqual(done["state"], "processed", worker.drain())
            self.assertEqual(done["output"], {"greet": {"greeting": "hello, ada"}})

            # Idle in a long poll, it stops when the poll ends (5 s at most).
            started = time.monotonic()
            worker.process.send_signal(signal.SIGTERM)
            self.assertEqual(worker.process.wait(20), 0, worker.drain())
            self.assertLess(time.monotonic() - started, 10.0)
        finally:
            worker.close()


class Faults(unittest.TestCase):
    def test_a_fault_of_a_class_the_policy_lists_fails_the_step_at_once(self) -> None:
        tries: list[str] = []

        def call(step: Step) -> Json:
            tries.append(step.task_id)
            raise Retryable("503 from upstream", failure_class="503")

        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500)
        worker.step("payments")(call)
        task_id = fresh("picky")
        with running(worker):
            admin().submit("picky", id=task_id)
            failed = admin().wait(task_id, timeout=60)
        self.assertEqual(failed["state"], "error", failed)
        self.assertEqual(tries, [task_id], "one try: the policy lists 503")
        step = failed["steps"][0]
        self.assertEqual(step["last_error"], "503 from upstream; not retried: HTTP status 503 is listed in retry.non_retryable")

    def test_retryable_faults_are_retried_and_permanent_ones_fail_the_task(self) -> None:
        tries: dict[str, int] = {}

        def charge(step: Step) -> Json:
            tries[step.task_id] = tries.get(step.task_id, 0) + 1
            if step.input["card"] == "declined":
                raise Permanent("card declined")
            if step.input["card"] == "buggy" and step.attempt == 1:
                raise KeyError("a bug counts as retryable")
            if step.input["flaky"] and step.attempt == 1:
                raise Retryable("payment gateway timed out")
            return {"attempt": step.attempt, "key": step.idempotency_key}

        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500)
        worker.step("payments")(charge)
        client = admin()
        flaky, declined, buggy = fresh("flaky"), fresh("declined"), fresh("buggy")
        with running(worker):
            client.submit("pay", {"card": "ok", "flaky": True}, id=flaky)
            client.submit("pay", {"card": "declined", "flaky": False}, id=declined)
            client.submit("pay", {"card": "buggy", "flaky": False}, id=buggy)
            done, failed, fixed = (client.wait(task, timeout=60) for task in (flaky, declined, buggy))

        # Attempt 1 used its two tries (the workflow's retry policy) and was
        # reported retryable; rota then sent attempt 2.
        self.assertEqual(done["state"], "processed")
        self.assertEqual(done["output"]["charge"], {"attempt": 2, "key": f"{flaky}/charge"})
        self.assertEqual(tries[flaky], 3)
        step_failed = [event for event in client.history(flaky) if event["kind"] == "step_failed"]
        self.assertEqual(len(step_failed), 1, step_failed)
        self.assertEqual(step_failed[0]["detail"]["retryable"], True)
        self.assertIn("payment gateway timed out", step_failed[0]["detail"]["error"])

        self.assertEqual(failed["state"], "error")
        self.assertEqual(tries[declined], 1, "a permanent fault is not retried")
        self.assertIn("card declined", failed["steps"][0]["last_error"] or "")

        self.assertEqual(fixed["state"], "processed")
        self.assertIn("KeyError", str(client.history(buggy)))

    def test_a_worker_whose_token_may_not_serve_the_agent_stops_with_the_error(self) -> None:
        worker = Worker(server.url, token=support.SUBMIT_TOKEN, wait_ms=500)
        worker.step("payments")(lambda step: None)
        with self.assertRaises(ApiError) as raised:
            worker.run(handle_signals=False)
        self.assertEqual(raised.exception.code, "forbidden")


class Leases(unittest.TestCase):
    def test_sigterm_twice_exits_at_once(self) -> None:
        env = support.client_env(server, support.WORKER_TOKEN, LEASE_MS="1500")
        worker = support.Child(support.TESTS_DIR / "slow_worker.py", env)
        task_id = fresh("twice")
        try:
            admin().submit("slow", {"sleep_s": 30}, id=task_id)
            worker.wait_for(f"{task_id}/work attempt 1: started")
            time.sleep(0.5)  # past the first renewal, which set the 1.5 s lease
            worker.process.send_signal(signal.SIGTERM)
            worker.wait_for("SIGTERM: finishing the steps in hand")
            worker.process.send_signal(signal.SIGTERM)
            self.assertEqual(worker.process.wait(5), -signal.SIGTERM, worker.drain())
        finally:
            worker.close()
        # Its step goes to the next worker after the lease.
        again = support.Child(support.TESTS_DIR / "slow_worker.py", env)
        try:
            done = admin().wait(task_id, timeout=60)
            self.assertEqual(done["output"]["work"]["delivery_count"], 2, again.drain())
        finally:
            again.close()

    def test_the_lease_is_renewed_while_a_step_outlives_it(self) -> None:
        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500, lease_ms=600)

        @worker.step("slow")
        def work(step: Step) -> Json:
            time.sleep(step.input["sleep_s"])
            return {"delivery_count": step.delivery_count}

        task_id = fresh("renewed")
        with running(worker):
            admin().submit("slow", {"sleep_s": 2.5}, id=task_id)
            done = admin().wait(task_id, timeout=60)
        self.assertEqual(done["output"], {"work": {"delivery_count": 1}}, "delivered once: the lease was kept")

    def test_a_step_of_a_cancelled_task_is_abandoned_at_its_next_renewal(self) -> None:
        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500, lease_ms=600)
        started, abandoned = threading.Event(), threading.Event()

        @worker.step("slow")
        def work(step: Step) -> Json:
            started.set()
            if step.abandoned.wait(step.input["sleep_s"]):
                abandoned.set()
            return {"finished": True}

        task_id = fresh("cancelled")
        with running(worker):
            admin().submit("slow", {"sleep_s": 30}, id=task_id)
            self.assertTrue(started.wait(20), "the step started")
            self.assertEqual(admin().cancel(task_id), "cancelled")
            self.assertTrue(abandoned.wait(20), "the renewal told the worker to stop")
        stopped = [event for event in admin().history(task_id) if event["kind"] == "call_stopped"]
        self.assertEqual([(event["step"], event["detail"]["agent"]) for event in stopped], [("work", "slow")])
        self.assertEqual(admin().status(task_id)["state"], "cancelled")

    def test_no_more_steps_run_at_once_than_the_concurrency(self) -> None:
        lock = threading.Lock()
        now, most = 0, 0
        worker = Worker(server.url, token=support.WORKER_TOKEN, wait_ms=500, concurrency=2)

        @worker.step("counted")
        def hold(step: Step) -> Json:
            nonlocal now, most
            with lock:
                now += 1
                most = max(most, now)
            time.sleep(step.input["hold_s"])
            with lock:
                now -= 1
            return None

        ids = [fresh("count") for _ in range(6)]
        with running(worker):
            for task_id in ids:
                admin().submit("count", {"hold_s": 0.4}, id=task_id)
            states = [admin().wait(task_id, timeout=60)["state"] for task_id in ids]
        self.assertEqual(states, ["processed"] * 6)
        self.assertEqual(most, 2)

    def test_a_step_of_a_killed_worker_is_delivered_again_after_its_lease(self) -> None:
        env = support.client_env(server, support.WORKER_TOKEN, LEASE_MS="1500")
        first = support.Child(support.TESTS_DIR / "slow_worker.py", env)
        task_id = fresh("killed")
        try:
            admin().submit("slow", {"sleep_s": 30}, id=task_id)
            first.wait_for(f"{task_id}/work attempt 1: started \\(delivery 1\\)")
            time.sleep(0.5)  # past the first renewal, which set the 1.5 s lease
            first.process.send_signal(signal.SIGKILL)
            first.process.wait()
            killed_at = time.monotonic()
        finally:
            first.close()

        second = support.Child(support.TESTS_DIR / "slow_worker.py", env)
        try:
            done = admin().wait(task_id, timeout=60)
            redelivered_after = time.monotonic() - killed_at
            output = done["output"]["work"]
            self.assertEqual(done["state"], "processed", second.drain())
            # The same attempt, delivered a second time, to the other worker.
            self.assertEqual((output["attempt"], output["delivery_count"]), (1, 2), output)
            self.assertEqual(output["pid"], second.process.pid)
            # Far sooner than the server's own 30 s lease: the worker's held.
            self.assertLess(redelivered_after, 15.0)
        finally:
            second.close()

    def test_sigterm_lets_the_step_in_hand_finish_and_takes_no_new_one(self) -> None:
        env = support.client_env(server, support.WORKER_TOKEN, LEASE_MS="1500")
        worker = support.Child(support.TESTS_DIR / "slow_worker.py", env)
        in_hand, later = fresh("in-hand"), fresh("later")
        try:
            admin().submit("slow", {"sleep_s": 3}, id=in_hand)
            worker.wait_for(f"{in_hand}/work attempt 1: started")
            worker.process.send_signal(signal.SIGTERM)
            worker.wait_for("SIGTERM: finishing the steps in hand")
            admin().submit("slow", {"sleep_s": 0}, id=later)
            self.assertEqual(worker.process.wait(30), 0, worker.drain())
            log = worker.drain()
        finally:
            worker.close()

        done = admin().status(in_hand)
        self.assertEqual(done["state"], "processed", log)
        self.assertEqual(done["output"]["work"], {"pid": worker.process.pid, "delivery_count": 1, "attempt": 1})
        self.assertLess(log.index(f"{in_hand}/work attempt 1: succeeded"), log.index("stopped"), log)
        self.assertNotIn(later, log, "a stopping worker takes no new step")
        self.assertEqual(admin().status(later)["steps"][0]["output"], None)
        admin().cancel(later)


if __name__ == "__main__":
    unittest.main()
