"""The worker helper: serve agent queues over rota's worker protocol.

Functions decorated with ``@worker.step("agent")`` run the steps that
workflows send to that (remote) agent. For each step request the worker:

- keeps the lease while the function runs, renewing it in the background
  (each renewal measured from the ``lease_until`` the server answers, which
  never passes the step's deadline);
- retries a ``Retryable`` fault (or any other exception) with the request's
  retry policy inside the deadline, then fails the attempt as retryable
  (rota tries the step again later); a ``Permanent`` fault fails at once
  (the task ends in ``error`` or compensates);
- completes the step with the function's return value (any JSON value);
- once the deadline has passed, or the lease was lost (``409 lease_lost``,
  ``410 deadline_passed``), or the task was cancelled (``410
  task_finished``, answered to the next renewal), stops and sends nothing:
  rota has given the request to someone else or given up on this attempt
  (a cancelled task's history says the call was stopped). The function cannot
  be killed: it runs on, its result ignored, and ``Step.abandoned`` is set
  so that a function that looks can stop early.

At most ``concurrency`` steps of each agent run at once: the worker asks
for requests only when it has a free slot. ``run()`` serves until SIGTERM
or SIGINT (or ``stop()``): it asks for no more requests, lets the receive
in progress end (within ``wait_ms``; what it brings is worked on like the
rest), finishes the steps in hand, and returns. A second signal does not
wait: SIGTERM kills the process, Ctrl-C raises ``KeyboardInterrupt``.

The receive in progress is not cut short on purpose: the server leases
what a long poll finds even when its caller has hung up, and nobody would
answer that request before its lease ran out. That is also why
``wait_ms`` is short by default (5 s): a killed worker's last long poll
can take a request with it for one lease.

Delivery is at least once: a worker that dies holding a request has it
delivered again after its lease. Each request's ``idempotency_key`` is the
same for every delivery and attempt of the step: pass it to the service you
call so that its effect happens once.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

from ._http import Transport, quote
from .client import DEFAULT_URL
from .errors import ApiError
from .types import Json, RetryPolicy, WorkRequest

log = logging.getLogger("rota.worker")

#: Answers of ``receive`` that no retry will change: a bad token, a token
#: without the agent's scope, an agent the server does not serve, a bad
#: request. The worker stops and ``run()`` raises them.
FATAL_STATUSES = frozenset({400, 401, 403, 404, 422})

#: How much longer than its long-poll wait a receive may take on the wire.
RECEIVE_SLACK_S = 10.0

#: The longest wait between two receives that failed.
RECEIVE_BACKOFF_MAX_S = 5.0


class Retryable(Exception):
    """A fault that may go away: retried within the attempt (the request's
    retry policy, inside its deadline), then reported as retryable.

    ``failure_class`` says what the fault was, in the words of a step's
    ``retry.non_retryable``: an HTTP status (``"503"``) or a kind
    (``"timeout"``, ``"connection"``). When the step's policy lists it, the
    step fails at once instead of being retried."""

    def __init__(self, message: str = "", *, failure_class: str | None = None) -> None:
        super().__init__(message)
        self.failure_class = failure_class


class Permanent(Exception):
    """A fault that will not go away: reported at once; the task ends in
    ``error`` or compensates, as its workflow says."""


@dataclass
class Step:
    """One step request being worked on: what the decorated function gets."""

    request: WorkRequest
    #: Set when the worker gave up on this request (its deadline passed or
    #: its lease was lost): nothing the function returns will be sent.
    abandoned: threading.Event = field(default_factory=threading.Event)

    @property
    def task_id(self) -> str:
        """The task."""
        return self.request["task_id"]

    @property
    def workflow(self) -> str:
        """The workflow and its version, ``name@version``."""
        return self.request["workflow"]

    @property
    def name(self) -> str:
        """The step's name in the workflow."""
        return self.request["step"]

    @property
    def attempt(self) -> int:
        """The attempt (1-based); a new one after a failure or a timeout."""
        return self.request["attempt"]

    @property
    def compensate(self) -> bool:
        """Whether this is the step's compensating action."""
        return self.request["compensate"]

    @property
    def input(self) -> Json:
        """The step's input, its templates resolved."""
        return self.request["input"]

    @property
    def idempotency_key(self) -> str:
        """The same for every delivery and attempt of the step: pass it on."""
        return self.request["idempotency_key"]

    @property
    def delivery_count(self) -> int:
        """How many times this request was delivered, this time included."""
        return self.request["delivery_count"]

    @property
    def complete_by(self) -> float:
        """The deadline, in seconds since the epoch (as ``time.time()``)."""
        return self.request["complete_by"] / 1000.0

    def remaining(self) -> float:
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self.complete_by - time.time())

    def __str__(self) -> str:
        what = " (compensate)" if self.compensate else ""
        return f"{self.task_id}/{self.name}{what} attempt {self.attempt}"


Handler = Callable[[Step], Json]
H = TypeVar("H", bound=Handler)


@dataclass
class _Agent:
    name: str
    handler: Handler
    slots: threading.Semaphore
    concurrency: int


@dataclass
class _Outcome:
    """What to answer: ``complete`` with ``output``, ``fail`` with
    ``message`` and ``retryable``, or ``silent`` (nothing)."""

    kind: str
    output: Json = None
    message: str = ""
    retryable: bool = False
    #: The failure's class (``Retryable.failure_class``), sent with it.
    failure_class: str | None = None


def backoff(retry: RetryPolicy, tries: int) -> float:
    """The wait after ``tries`` failed tries, in seconds: exponential,
    capped, with equal jitter (as the built-in agents wait)."""
    base = min(retry["backoff_initial_ms"] * (1 << min(tries - 1, 62)), retry["backoff_max_ms"]) / 1000.0
    return base / 2 + random.random() * base / 2


def default_name() -> str:
    """``<host>-<pid>``, in the characters the server accepts."""
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname())[:80] or "worker"
    return f"{host}-{os.getpid()}"


class Worker:
    """Runs the steps of remote agents (see the module's documentation).

    ``url`` defaults to ``ROTA_URL`` (else ``http://127.0.0.1:7878``) and
    ``token`` to ``ROTA_TOKEN`` (it needs the scope ``agent:<name>`` of each
    agent, or ``admin``). ``concurrency``: steps of each agent at once.
    ``lease_ms``: the lease to hold, asked for at once after each receive
    and at every renewal (default: the server's, 30 s); a shorter one gets
    a dead worker's requests delivered again sooner and costs more renewals.
    ``wait_ms``: how long one receive waits for requests (and so the longest
    a stop waits before the steps in hand). ``name``: recorded as the owner
    of the leases.
    """

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        concurrency: int = 4,
        lease_ms: int | None = None,
        wait_ms: int = 5_000,
        name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        if lease_ms is not None and lease_ms < 100:
            raise ValueError(f"lease_ms must be at least 100, got {lease_ms}")
        url = url or os.environ.get("ROTA_URL") or DEFAULT_URL
        token = token if token is not None else os.environ.get("ROTA_TOKEN")
        self._http = Transport(url, token or None, timeout)
        self.concurrency = concurrency
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.name = name or default_name()
        self._agents: dict[str, _Agent] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._in_hand = 0
        self._idle = threading.Condition(self._lock)
        self._fatal: ApiError | None = None

    def step(self, agent: str, *, concurrency: int | None = None) -> Callable[[H], H]:
        """Decorates the function that runs the steps of ``agent``: it gets
        a ``Step`` and returns the step's output (any JSON value), or raises
        ``Retryable`` / ``Permanent``. ``concurrency`` overrides the
        worker's for this agent."""
        slots = self.concurrency if concurrency is None else concurrency
        if slots < 1:
            raise ValueError(f"concurrency must be at least 1, got {slots}")

        def register(handler: H) -> H:
            if agent in self._agents:
                raise ValueError(f"agent {agent!r} already has a function")
            self._agents[agent] = _Agent(agent, handler, threading.Semaphore(slots), slots)
            return handler

        return register

    def stop(self) -> None:
        """Stops asking for requests; ``run()`` returns once the steps in
        hand are answered (or abandoned at their deadline)."""
        self._stopping.set()

    def run(self, *, handle_signals: bool = True) -> None:
        """Serves every decorated agent until ``stop()``, SIGTERM or SIGINT
        (signals are handled only from the main thread, and only when
        ``handle_signals``). Raises ``ApiError`` when the server refuses to
        serve an agent to this worker (a bad token, an unknown agent)."""
        if not self._agents:
            raise ValueError("no agent: decorate a function with @worker.step(AGENT) first")
        restore = self._handle_signals() if handle_signals else []
        loops = [threading.Thread(target=self._serve, args=(agent,), name=f"rota-receive-{agent.name}", daemon=True) for agent in self._agents.values()]
        log.info("serving %s at %s as %s", ", ".join(self._agents), self._http.url, self.name)
        try:
            for loop in loops:
                loop.start()
            # Short waits, so that signal handlers run promptly in this thread.
            while any(loop.is_alive() for loop in loops):
                for loop in loops:
                    loop.join(0.2)
            with self._idle:
                while self._in_hand:
                    self._idle.wait(0.2)
        finally:
            for signum, previous in restore:
                signal.signal(signum, previous)
        log.info("stopped")
        if self._fatal is not None:
            raise self._fatal

    def _handle_signals(self) -> list[tuple[int, Any]]:
        if threading.current_thread() is not threading.main_thread():
            return []
        previous: list[tuple[int, Any]] = [(signum, signal.getsignal(signum)) for signum in (signal.SIGTERM, signal.SIGINT)]

        def graceful(signum: int, _frame: FrameType | None) -> None:
            # A second signal does not wait for the steps in hand. Reset
            # before saying anything: a signal sent once the line is read
            # must find the default handler, not be lost on this one.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            log.info("%s: finishing the steps in hand, then stopping", signal.Signals(signum).name)
            self.stop()

        for signum, _ in previous:
            signal.signal(signum, graceful)
        return previous

    def _serve(self, agent: _Agent) -> None:
        """One agent's receive loop: a request per free slot."""
        path = f"/v1/workers/{quote(agent.name)}/receive"
        failures = 0
        while not self._stopping.is_set():
            if not agent.slots.acquire(timeout=0.2):
                continue
            taken = 1
            while taken < agent.concurrency and agent.slots.acquire(blocking=False):
                taken += 1
            body = {"max": taken, "wait_ms": self.wait_ms, "worker": self.name}
            try:
                answer = self._http.call("POST", path, body, timeout=self.wait_ms / 1000.0 + RECEIVE_SLACK_S)
                requests: list[WorkRequest] = answer["requests"]
                failures = 0
            except ApiError as error:
                requests = []
                if error.status in FATAL_STATUSES:
                    log.error("receive of %s refused: %s", agent.name, error)
                    self._fatal = error
                    self.stop()
                else:
                    failures += 1
            except (OSError, http.client.HTTPException, ValueError) as error:
                requests = []
                failures += 1
                log.warning("receive of %s failed (%s); trying again", agent.name, error)
            for _ in range(taken - len(requests)):
                agent.slots.release()
            for request in requests:
                self._start(agent, request)
            if failures:
                self._stopping.wait(min(0.1 * 2**failures, RECEIVE_BACKOFF_MAX_S))

    def _start(self, agent: _Agent, request: WorkRequest) -> None:
        with self._lock:
            self._in_hand += 1

        def work() -> None:
            try:
                self._work(agent, Step(request))
            except Exception:
                log.exception("%s/%s: the worker failed; the lease runs out", request["task_id"], request["step"])
            finally:
                agent.slots.release()
                with self._idle:
                    self._in_hand -= 1
                    self._idle.notify_all()

        threading.Thread(target=work, name=f"rota-step-{request['task_id']}", daemon=True).start()

    def _work(self, agent: _Agent, step: Step) -> None:
        """Runs one request with its lease renewed, then answers it (or not)."""
        log.info("%s: started (delivery %d)", step, step.delivery_count)
        outcome: list[_Outcome] = []
        done = threading.Event()

        def run() -> None:
            outcome.append(_attempt(agent.handler, step))
            done.set()

        threading.Thread(target=run, name=f"rota-handler-{step.task_id}", daemon=True).start()
        lease_until = step.request["lease_until"] / 1000.0
        renew_at = time.time() if self.lease_ms is not None else _renewal_due(lease_until)
        while not done.wait(max(0.0, min(renew_at, step.complete_by) - time.time())):
            if time.time() >= step.complete_by:
                step.abandoned.set()
                log.warning("%s: deadline passed; no reply", step)
                return
            try:
                lease_until = self._renew(agent, step)
                renew_at = _renewal_due(lease_until)
            except ApiError as error:
                # 409 lease_lost: the request is someone else's now; 410
                # deadline_passed or task_finished (a cancel): rota dropped
                # it. Either way: drop the work.
                step.abandoned.set()
                log.warning("%s: renewal refused (%s); work dropped", step, error.code)
                return
            except (OSError, http.client.HTTPException) as error:
                log.warning("%s: renewal failed (%s); trying again", step, error)
                renew_at = time.time() + min(0.5, max(0.05, (lease_until - time.time()) / 3))
        self._answer(agent, step, outcome[0])

    def _renew(self, agent: _Agent, step: Step) -> float:
        body: dict[str, Json] = {"lease_token": step.request["lease_token"]}
        if self.lease_ms is not None:
            body["lease_ms"] = self.lease_ms
        answer = self._http.call("POST", f"/v1/workers/{quote(agent.name)}/renew", body)
        return float(answer["lease_until"]) / 1000.0

    def _answer(self, agent: _Agent, step: Step, outcome: _Outcome) -> None:
        if outcome.kind == "silent" or step.remaining() <= 0:
            step.abandoned.set()
            log.warning("%s: deadline passed; no reply", step)
            return
        token = step.request["lease_token"]
        if outcome.kind == "complete":
            operation, body = "complete", {"lease_token": token, "output": outcome.output}
        else:
            operation, body = "fail", {"lease_token": token, "message": outcome.message, "retryable": outcome.retryable}
            if outcome.failure_class is not None:
                body["class"] = outcome.failure_class
        tries = 0
        while True:
            tries += 1
            try:
                self._http.call("POST", f"/v1/workers/{quote(agent.name)}/{operation}", body)
                log.info("%s: %s", step, "succeeded" if operation == "complete" else f"failed ({'retryable' if outcome.retryable else 'permanent'}): {outcome.message}")
                return
            except ApiError as error:
                step.abandoned.set()
                log.warning("%s: reply refused (%s); work dropped", step, error.code)
                return
            except (OSError, http.client.HTTPException) as error:
                # The reply may or may not have arrived: sending it again is
                # safe (a second answer is refused as lease_lost).
                wait = min(0.1 * 2**tries, 2.0)
                if step.remaining() <= wait:
                    log.warning("%s: reply failed (%s); deadline passed", step, error)
                    return
                log.warning("%s: reply failed (%s); trying again", step, error)
                time.sleep(wait)


def _renewal_due(lease_until: float) -> float:
    """When to renew a lease that runs to ``lease_until``: once two thirds
    of what is left of it have passed."""
    return time.time() + max(0.05, (lease_until - time.time()) / 3)


def _attempt(handler: Handler, step: Step) -> _Outcome:
    """Runs the function, retrying faults with the request's policy inside
    the deadline."""
    retry = step.request["retry"]
    tries = 0
    while True:
        if step.remaining() <= 0 or step.abandoned.is_set():
            return _Outcome("silent")
        tries += 1
        try:
            output = handler(step)
        except Permanent as error:
            return _Outcome("fail", message=str(error) or "permanent failure", retryable=False)
        except Exception as error:  # any other exception counts as retryable
            message = str(error) if isinstance(error, Retryable) else f"{type(error).__name__}: {error}"
            failure_class = error.failure_class if isinstance(error, Retryable) else None
            if step.remaining() <= 0 or step.abandoned.is_set():
                return _Outcome("silent")
            if failure_class is not None and failure_class in retry.get("non_retryable", []):
                # The step's policy says it will not pass: no more tries here,
                # and rota fails the step at once on this class.
                return _Outcome("fail", message=message, retryable=True, failure_class=failure_class)
            if tries >= max(1, retry["attempts_max"]):
                return _Outcome("fail", message=message, retryable=True, failure_class=failure_class)
            wait = backoff(retry, tries)
            if wait >= step.remaining():
                return _Outcome("silent")
            log.info("%s: try %d failed (%s); again in %.2fs", step, tries, message, wait)
            step.abandoned.wait(wait)
            continue
        try:
            json.dumps(output)
        except (TypeError, ValueError) as error:
            return _Outcome("fail", message=f"the output is not JSON: {error}", retryable=False)
        return _Outcome("complete", output=output)
