#!/usr/bin/env python3
"""A rota worker in Python, with the standard library only.

It runs one remote agent over rota's HTTP worker protocol, under the rules
the built-in agents follow:

- long-poll ``POST /v1/workers/{agent}/receive`` for step requests;
- run each request's handler, retrying transient faults (``Transient``)
  with the request's retry policy, inside the request's deadline
  (``complete_by``); a permanent fault (``Permanent``) fails at once;
- renew the lease while the handler runs (``…/renew``), never past the
  deadline;
- answer with ``…/complete`` (the output) or ``…/fail`` (``retryable``
  says transient or permanent);
- once the deadline has passed, stop and send nothing, not even an error:
  rota has already given up on this attempt and may have sent another one.

Every request carries an ``idempotency_key`` (the same for every attempt of
a step): pass it on to the service you call, so that a repeated request has
its effect once. Delivery is at least once.

    python3 worker.py --url http://127.0.0.1:7878 --agent py-payments [--token TOKEN]

The token (also ``ROTA_TOKEN``) needs the scope ``agent:agent.py-payments``
(or ``admin``). Replace ``handle`` with your own code.
"""

import argparse
import concurrent.futures
import json
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request


class Transient(Exception):
    """A fault that may go away: retried within the deadline, then reported as retryable."""


class Permanent(Exception):
    """A fault that will not go away: reported at once; the task fails or compensates."""


def handle(request, context):
    """The example agent: a payment service.

    ``request`` is the step request (``task_id``, ``step``, ``attempt``,
    ``compensate``, ``input``, ``idempotency_key``, ``complete_by``…);
    ``context.remaining()`` says how many seconds are left before the
    deadline. Return the step's output (any JSON value) or raise
    ``Transient`` / ``Permanent``.
    """
    data = request["input"] if isinstance(request["input"], dict) else {}
    key = request["idempotency_key"]
    if request["compensate"]:
        return {"refunded": data.get("amount"), "key": key}
    if data.get("card") == "declined":
        raise Permanent("card declined")
    if data.get("flaky") and request["attempt"] == 1:
        raise Transient("payment gateway timed out")
    slow_ms = data.get("slow_ms", 0)
    if slow_ms:
        # Slow work: the lease is renewed meanwhile by the worker.
        time.sleep(min(slow_ms / 1000.0, context.remaining()))
    return {
        "step": request["step"],
        "amount": data.get("amount"),
        "key": key,
        "attempt": request["attempt"],
        "delivery_count": request["delivery_count"],
    }


class Client:
    """The worker protocol's four calls."""

    def __init__(self, url, agent, token, timeout_slack=10.0):
        self.base = url.rstrip("/") + "/v1/workers/" + urllib.request.quote(agent, safe="")
        self.token = token
        self.timeout_slack = timeout_slack

    def call(self, operation, body, wait_s=0.0):
        """POSTs ``body``; returns (status, JSON body)."""
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.base + "/" + operation, data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(request, timeout=wait_s + self.timeout_slack) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            text = error.read()
            try:
                return error.code, json.loads(text)
            except ValueError:
                return error.code, {"error": {"code": "http_%d" % error.code, "reason": text.decode(errors="replace")}}

    def receive(self, max_requests, wait_ms, worker):
        status, body = self.call("receive", {"max": max_requests, "wait_ms": wait_ms, "worker": worker}, wait_s=wait_ms / 1000.0)
        if status != 200:
            raise RuntimeError("receive: %s %s" % (status, body))
        return body["requests"]


class Context:
    """What a handler may ask while it runs."""

    def __init__(self, request):
        self.complete_by = request["complete_by"] / 1000.0

    def remaining(self):
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self.complete_by - time.time())


def log(message):
    # One write per line, so that lines from several threads do not mix.
    sys.stderr.write("worker: " + message + "\n")
    sys.stderr.flush()


class Renewer(threading.Thread):
    """Renews one lease whenever two thirds of what was left of it have
    passed, until stopped; stops by itself when rota says the lease is lost
    or the deadline has passed. Each renewal asks for the server's own lease
    length (no ``lease_ms``), and the next wait is measured from the
    ``lease_until`` it returns: a lease that was already partly spent when
    the request arrived must not make every later renewal shorter."""

    def __init__(self, client, request, lease_s):
        super().__init__(daemon=True)
        self.client = client
        self.request = request
        self.lease_s = max(lease_s, 0.3)
        self.stopped = threading.Event()
        self.lost = None

    def run(self):
        left = self.lease_s
        while not self.stopped.wait(max(left / 3.0, 0.05)):
            status, body = self.client.call("renew", {"lease_token": self.request["lease_token"]})
            if status != 200:
                self.lost = body.get("error", {}).get("code", str(status))
                log("renew of %s/%s: %s" % (self.request["task_id"], self.request["step"], self.lost))
                return
            left = max(0.0, body["lease_until"] / 1000.0 - time.time())

    def stop(self):
        self.stopped.set()


def backoff(retry, tries):
    """The wait after ``tries`` failed tries: exponential, capped, equal jitter."""
    base = min(retry["backoff_initial_ms"] * (2 ** (tries - 1)), retry["backoff_max_ms"]) / 1000.0
    return base / 2 + random.random() * base / 2


def run_until_deadline(request, pool):
    """Runs the handler with retries inside the deadline. Returns
    ("complete", output), ("fail", message, retryable) or ("silent",)."""
    context = Context(request)
    retry = request["retry"]
    tries = 0
    while True:
        if context.remaining() <= 0:
            return ("silent",)
        tries += 1
        future = pool.submit(handle, request, context)
        try:
            output = future.result(timeout=context.remaining())
        except concurrent.futures.TimeoutError:
            # The handler still runs; its result will be ignored.
            return ("silent",)
        except Permanent as error:
            return ("fail", str(error) or "permanent failure", False)
        except Exception as error:  # noqa: BLE001: any other error counts as transient
            if context.remaining() <= 0:
                return ("silent",)
            if tries >= retry["attempts_max"]:
                return ("fail", str(error) or type(error).__name__, True)
            wait = backoff(retry, tries)
            if wait >= context.remaining():
                return ("silent",)
            log("%s/%s try %d: %s; retrying in %.2fs" % (request["task_id"], request["step"], tries, error, wait))
            time.sleep(wait)
            continue
        if context.remaining() <= 0:
            return ("silent",)
        return ("complete", output)


def work(client, request, pool):
    """Runs one request and answers it (or stays silent)."""
    lease_s = max(0.0, (request["lease_until"] / 1000.0) - time.time())
    renewer = Renewer(client, request, lease_s)
    renewer.start()
    try:
        result = run_until_deadline(request, pool)
    finally:
        renewer.stop()
    what = "%s/%s%s attempt %d" % (request["task_id"], request["step"], " (compensate)" if request["compensate"] else "", request["attempt"])
    if result[0] == "silent":
        log(what + ": deadline passed; no reply")
        return
    if result[0] == "complete":
        status, body = client.call("complete", {"lease_token": request["lease_token"], "output": result[1]})
    else:
        status, body = client.call("fail", {"lease_token": request["lease_token"], "message": result[1], "retryable": result[2]})
    if status == 200:
        log("%s: %s" % (what, body["status"]))
    else:
        # lease_lost (409): someone else has the request now; deadline_passed
        # (410): rota dropped it. Either way the work is dropped.
        log("%s: reply refused: %s" % (what, body.get("error", {}).get("code", status)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("ROTA_URL", "http://127.0.0.1:7878"))
    parser.add_argument("--agent", default=os.environ.get("ROTA_AGENT", "py-payments"))
    parser.add_argument("--token", default=os.environ.get("ROTA_TOKEN"))
    parser.add_argument("--concurrency", type=int, default=4, help="requests worked on at once")
    parser.add_argument("--wait-ms", type=int, default=20000, help="long-poll wait of a receive")
    parser.add_argument("--name", default="py-worker-%d" % os.getpid(), help="recorded as the lease owner")
    args = parser.parse_args()

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client = Client(args.url, args.agent, args.token)
    handlers = concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency * 2)
    slots = concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency)
    free = threading.Semaphore(args.concurrency)
    log("serving agent %s at %s" % (args.agent, args.url))
    failures = 0
    while not stopping.is_set():
        # Ask for as many requests as there are free slots (at least one).
        free.acquire()
        taken = 1
        while taken < args.concurrency and free.acquire(blocking=False):
            taken += 1
        try:
            requests = client.receive(taken, args.wait_ms, args.name)
            failures = 0
        except (OSError, RuntimeError) as error:
            for _ in range(taken):
                free.release()
            failures += 1
            log("receive failed (%s); retrying" % error)
            stopping.wait(min(0.1 * 2 ** failures, 5.0))
            continue
        for _ in range(taken - len(requests)):
            free.release()
        for request in requests:
            def run(request=request):
                try:
                    work(client, request, handlers)
                except Exception as error:  # noqa: BLE001: keep the worker alive; the lease expires
                    log("%s/%s: %s" % (request["task_id"], request["step"], error))
                finally:
                    free.release()
            slots.submit(run)
    log("stopping")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
