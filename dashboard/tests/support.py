"""A real ``rota serve`` and a real browser for the dashboard's tests.

The binary is ``$ROTA_BIN`` (``.ci/run`` sets it to the debug build), else
the checkout's ``target/debug/rota``. The browser is Debian's Chromium
(``$ROTA_CHROMIUM``, default ``/usr/bin/chromium``), driven headless by
Playwright: nothing is downloaded, and every page a test opens is watched
for console errors, failed requests and requests to any host but the
server's (those are also blocked).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Locator,
    Page,
    Playwright,
    Request,
    Response,
    Route,
    ViewportSize,
    expect,
    sync_playwright,
)

TESTS_DIR = Path(__file__).resolve().parent
REPO_DIR = TESTS_DIR.parents[1]
IMAGES_DIR = REPO_DIR / "docs" / "images"

#: How long a server may take to say where it listens, and to stop.
STARTUP_S = 30.0
STOP_S = 20.0

#: The viewport of every page (and of the README's screenshots).
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}

#: Every task and step state the API reports.
TASK_STATES = ["pending", "processing", "processed", "error", "compensating", "compensated", "cancelled"]
TERMINAL_STATES = {"processed", "error", "compensated", "cancelled"}

#: The workflows every test server has.
WORKFLOWS = {
    # The README's workflow: a delay, then an exec step.
    "greet": """
name: greet
version: 1
steps:
  - name: wait
    agent: delay
    with: { for: "100ms" }
  - name: echo
    agent: exec
    with: { command: ["cat"], stdin: { hello: "{{ input.name }}" } }
""",
    # A step that fails for good: the task ends in Error with an alert.
    "fail": """
name: fail
version: 1
on_exhausted: error
max_failures: 1
steps:
  - name: prepare
    agent: delay
    with: { for: "10ms" }
  - name: explode
    agent: exec
    with: { command: ["sh", "-c", "echo boom >&2; exit 3"] }
""",
    # A completed step undone after a later one fails: Compensated.
    "refund": """
name: refund
version: 1
on_exhausted: compensate
max_failures: 1
steps:
  - name: charge
    agent: exec
    with: { command: ["sh", "-c", "echo '{\\"charged\\": true}'"] }
    compensate: { agent: exec, with: { command: ["sh", "-c", "echo '{\\"refunded\\": true}'"] } }
  - name: ship
    agent: exec
    with: { command: ["sh", "-c", "echo 'no truck' >&2; exit 4"] }
    depends_on: [charge]
""",
    # A step skipped by its condition on an earlier output; the step after
    # it runs all the same.
    "choose": """
name: choose
version: 1
steps:
  - name: check
    agent: exec
    with: { command: ["sh", "-c", "echo '{\\"vip\\": false}'"] }
  - name: upgrade
    agent: delay
    with: { for: "1ms" }
    when: steps.check.output.vip
  - name: notify
    agent: delay
    with: { for: "1ms" }
""",
    # A step that waits for the signal `approved`; the next reads its data.
    "approval": """
name: approval
version: 1
steps:
  - name: approval
    wait: approved
    timeout: 2m
  - name: echo
    agent: exec
    with: { command: ["cat"], stdin: { by: "{{ steps.approval.output.by }}" } }
""",
    # A quick step of a workflow a test pauses (no other test uses it).
    "gate": """
name: gate
version: 1
steps:
  - name: pass
    agent: delay
    with: { ms: 1 }
""",
    # A long step: a task to cancel, or that stays Processing.
    "nap": """
name: nap
version: 1
steps:
  - name: sleep
    agent: delay
    with: { for: "120s" }
    timeout: 5m
""",
    # Two steps of a few seconds: the second one's node changes colour
    # twice while a page opened during the first shows it.
    "stages": """
name: stages
version: 1
steps:
  - name: first
    agent: delay
    with: { for: "4s" }
  - name: second
    agent: delay
    with: { for: "2s" }
    depends_on: [first]
""",
    # A step that outlives its complete-by, twice: timed out, retried,
    # timed out again, Error.
    "hang": """
name: hang
version: 1
on_exhausted: error
steps:
  - name: stall
    agent: delay
    with: { for: "30s" }
    timeout: 300ms
    retry: { attempts: 2, backoff: 50ms, max_backoff: 50ms }
""",
    # A long step with an early warning point: the Supervisor raises an
    # at_risk warning within about a second, and the task stays at risk.
    "late": """
name: late
version: 1
steps:
  - name: crawl
    agent: delay
    with: { for: "120s" }
    timeout: 5m
    warn_after: 200ms
""",
    # A step that fails until the file its input names exists: a task in
    # Error that a resubmit completes once the test has made the file.
    "flaky": """
name: flaky
version: 1
on_exhausted: error
max_failures: 1
steps:
  - name: try
    agent: exec
    with:
      command: ["sh", "-c", "test -e \\"$MARKER\\" || { echo 'not yet' >&2; exit 3; }"]
      env: { MARKER: "{{ input.marker }}" }
""",
    # A child workflow: a quick step, then a task of `tick` as a step.
    "nest": """
name: nest
version: 1
steps:
  - name: prepare
    agent: delay
    with: { for: "1ms" }
  - name: sub
    workflow: tick
    timeout: 1m
    with: { from: "{{ input.name }}" }
""",
    # One task per customer at a time, each held until its signal `go`:
    # a second task of the same customer waits for the concurrency key.
    "serial": """
name: serial
version: 1
concurrency: { key: input.customer, limit: 1 }
steps:
  - name: hold
    wait: go
    timeout: 2m
""",
    # A step per element of `input.waits` (durations): the long ones stay
    # running while the short ones complete.
    "fanout": """
name: fanout
version: 1
steps:
  - name: each
    agent: delay
    for_each: input.waits
    timeout: 5m
    with: { for: "{{ item }}" }
""",
    # An `http` call to the URL of the input, retried quickly: against a
    # failing endpoint it opens the endpoint's circuit breaker.
    "outage": """
name: outage
version: 1
steps:
  - name: call
    agent: http
    with: { method: POST, url: "{{ input.url }}" }
    timeout: 2m
    retry: { attempts: 50, backoff: 10ms, max_backoff: 20ms }
""",
    # The quickest task: many of them fill a list.
    "tick": """
name: tick
version: 1
steps:
  - name: once
    agent: delay
    with: { for: "1ms" }
""",
}


def rota_bin() -> str:
    """The rota binary the tests run."""
    path = os.environ.get("ROTA_BIN") or str(REPO_DIR / "target" / "debug" / "rota")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no rota binary at {path}: build it (cargo build -p rota) or set ROTA_BIN")
    return path


def chromium_path() -> str:
    """Debian's Chromium (``apt-get install chromium``), never a downloaded build."""
    path = os.environ.get("ROTA_CHROMIUM") or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no Chromium at {path}: apt-get install -y --no-install-recommends chromium, or set ROTA_CHROMIUM")
    return path


@dataclass
class Token:
    """An API token of the server's ``--auth`` file."""

    name: str
    token: str
    scopes: list[str]


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the rota settings a developer
    may have exported, which would point a command elsewhere."""
    env = dict(os.environ, **extra)
    for name in ("ROTA_API_TOKEN", "ROTA_SERVER", "ROTA_TOKEN", "ROTA_STORE", "ROTA_CONFIG"):
        env.pop(name, None)
    return env


def spawn(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """Starts ``command`` (a rota server) logging to ``log_path``."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=clean_env(RUST_LOG="info"))


def wait_listening(process: subprocess.Popen[bytes], log_path: Path, what: str) -> str:
    """The URL a started server logs it listens on; stops it and raises if
    it does not within ``STARTUP_S``."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        found = re.search(r"listening on (http://[0-9.:]+)", log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    terminate(process)
    raise RuntimeError(f"{what} did not start listening:\n{log_path.read_text(errors='replace')}")


def terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it does not stop in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Server:
    """``rota serve`` on a temporary SQLite file and a free loopback port,
    with the workflows above. Without ``tokens`` the API runs without
    authentication (as it does on loopback); with them, from an ``--auth``
    file, and ``admin_token`` is the one the helpers use."""

    def __init__(self, tokens: Sequence[Token] = ()) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="rota-dashboard-")
        self.root = Path(self.dir.name)
        self.store = f"sqlite://{self.root / 'rota.db'}"
        self.tokens = list(tokens)
        admins = [t.token for t in self.tokens if "admin" in t.scopes]
        self.admin_token: str | None = admins[0] if admins else None
        (self.root / "workflows").mkdir()
        for name, text in WORKFLOWS.items():
            (self.root / "workflows" / f"{name}.yaml").write_text(text)
        self.log_path = self.root / "serve.log"
        command = [
            rota_bin(),
            "--store", self.store,
            "--durability", "normal",
            "serve",
            "--workflows", str(self.root / "workflows"),
            "--listen", "127.0.0.1:0",
            "--instance-id", "dashboard-tests",
            # The cancelled naps' delay calls need not hold up the stop.
            "--shutdown-grace", "1s",
        ]  # fmt: skip
        if self.tokens:
            auth = self.root / "auth.toml"
            auth.write_text(
                "\n".join(
                    f'[[tokens]]\nname = "{t.name}"\ntoken = "{t.token}"\nscopes = {json.dumps(t.scopes)}\n' for t in self.tokens
                )
            )
            command += ["--auth", str(auth)]
        self.process = spawn(command, self.log_path)
        self.url = wait_listening(self.process, self.log_path, "rota serve")
        #: host:port, the only one a page may send requests to.
        self.netloc = urllib.parse.urlsplit(self.url).netloc

    def log(self) -> str:
        """What the server logged so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stops the server and removes its files."""
        terminate(self.process)
        self.dir.cleanup()

    # -- the API, as the tests check what actions did ------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        headers: Mapping[str, str] | None = None,
        auth: bool = True,
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One request; returns the status, the decoded body and the headers
        whatever the status. ``token`` defaults to the admin token;
        ``auth=False`` sends none."""
        sent = dict(headers or {})
        bearer = token if token is not None else self.admin_token
        if auth and bearer is not None:
            sent["Authorization"] = f"Bearer {bearer}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=sent)
        try:
            with _NO_REDIRECTS.open(req, timeout=30) as response:
                raw = response.read()
                status, answer_headers = response.status, dict(response.headers)
        except urllib.error.HTTPError as err:
            raw = err.read()
            status, answer_headers = err.code, dict(err.headers)
        try:
            decoded: Any = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return status, decoded, answer_headers

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None) -> Any:
        """A request that must succeed; its decoded body."""
        status, decoded, _ = self.request(method, path, body, token=token)
        if not 200 <= status < 300:
            raise ApiError(status, decoded)
        return decoded

    def task(self, task_id: str) -> Any:
        return self.api("GET", f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}")

    def history(self, task_id: str) -> list[Any]:
        answer = self.api("GET", f"/v1/tasks/{urllib.parse.quote(task_id, safe='')}/history")
        return list(answer["events"] if isinstance(answer, dict) else answer)

    def queue(self, name: str) -> Any:
        return self.api("GET", f"/v1/queues/{urllib.parse.quote(name, safe='')}")

    def dead_letters(self, name: str) -> list[Any]:
        answer = self.api("GET", f"/v1/queues/{urllib.parse.quote(name, safe='')}/dead-letters")
        return list(answer["dead_letters"] if isinstance(answer, dict) else answer)

    def submit(self, workflow: str, task_id: str, input: Any = None) -> Any:
        """A submit through the API (for bulk; the tests that show CLI
        submissions use :meth:`cli`)."""
        return self.api("POST", "/v1/tasks", {"workflow": workflow, "id": task_id, "input": input or {}})

    def wait_task(self, task_id: str, states: Iterable[str] = TERMINAL_STATES, timeout: float = 30.0) -> Any:
        """The task once it is in one of ``states``."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        while True:
            task = self.task(task_id)
            if task["state"] in wanted:
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} is {task['state']} after {timeout}s, not one of {sorted(wanted)}")
            time.sleep(0.1)

    def wait_step(self, task_id: str, step: str, state: str, timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            task = self.task(task_id)
            found = [s for s in task["steps"] if s["name"] == step]
            if found and found[0]["state"] == state:
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"step {step} of {task_id} is not {state} after {timeout}s: {found}")
            time.sleep(0.1)

    # -- the CLI, as an operator runs it --------------------------------------

    def cli(self, *args: str, remote: bool = True, timeout: float = 60.0) -> str:
        """``rota ARGS`` against this server's API (``--server``, and the
        admin token if there are tokens), or with ``remote=False`` against
        its store file (the queue commands that move messages have no API).
        Returns stdout; fails the test on a non-zero exit."""
        command = [rota_bin()]
        if remote:
            command += ["--server", self.url]
            if self.admin_token is not None:
                command += ["--token", self.admin_token]
        else:
            command += ["--store", self.store]
        command += list(args)
        done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout


class ApiServer:
    """``rota api`` (the API alone, no engine role) over ``server``'s store,
    on a free loopback port."""

    def __init__(self, server: Server) -> None:
        self.log_path = server.root / "api.log"
        command = [rota_bin(), "api", "--store", server.store, "--durability", "normal", "--listen", "127.0.0.1:0"]
        self.process = spawn(command, self.log_path)
        self.url = wait_listening(self.process, self.log_path, "rota api")

    def stop(self) -> None:
        terminate(self.process)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_NO_REDIRECTS = urllib.request.build_opener(_NoRedirects)


def dead_letter(server: Server, queue: str, bodies: Sequence[Any]) -> None:
    """Puts ``bodies`` in ``queue``'s dead-letter queue with the CLI on the
    store: a queue that allows one delivery, each message received and
    abandoned once."""
    server.cli("queue", "create", queue, "--lease", "30s", "--max-deliveries", "1", remote=False)
    for body in bodies:
        server.cli("queue", "send", queue, "--body", json.dumps(body), remote=False)
    received = json.loads(server.cli("queue", "receive", queue, "--max", str(len(bodies)), "--lease", "30s", "--json", remote=False))
    messages = received if isinstance(received, list) else received.get("messages", [])
    for message in messages:
        server.cli("queue", "abandon", queue, message["lease_token"], "--reason", "dashboard test", remote=False)
    deadline = time.monotonic() + 20
    while len(server.dead_letters(queue)) < len(bodies):
        if time.monotonic() > deadline:
            raise AssertionError(f"{queue}: {len(server.dead_letters(queue))} dead letters, expected {len(bodies)}")
        time.sleep(0.1)


# -- the browser ---------------------------------------------------------------


class Chromium:
    """One headless Chromium for a test module."""

    def __init__(self) -> None:
        self.playwright: Playwright = sync_playwright().start()
        try:
            self.browser: Browser = self.playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        except BaseException:
            self.playwright.stop()
            raise

    def close(self) -> None:
        self.browser.close()
        self.playwright.stop()


@dataclass
class Watch:
    """What a page did that a test must not let pass: console errors and
    uncaught exceptions, requests that failed or got a 4xx/5xx, and any
    request to another host than the server's (blocked)."""

    netloc: str
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    foreign_requests: list[str] = field(default_factory=list)
    #: Patterns of console errors and failed requests a test expects (a
    #: 401 on purpose, say).
    allowed: list[re.Pattern[str]] = field(default_factory=list)

    def allow(self, pattern: str) -> None:
        self.allowed.append(re.compile(pattern))

    def route(self, route: Route) -> None:
        url = route.request.url
        parts = urllib.parse.urlsplit(url)
        if parts.scheme in ("data", "blob", "about") or parts.netloc == self.netloc:
            route.continue_()
        else:
            self.foreign_requests.append(f"{route.request.method} {url}")
            route.abort("blockedbyclient")

    def console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            where = message.location.get("url", "") if message.location else ""
            self.console_errors.append(f"{message.text} ({where})")

    def page_error(self, error: Exception) -> None:
        self.console_errors.append(f"uncaught: {error}")

    def request_failed(self, request: Request) -> None:
        failure = request.failure or ""
        # Leaving a page cuts its event stream and whatever it was still
        # loading: that is how browsers stop requests, not a failure.
        if "ERR_ABORTED" in failure:
            return
        if urllib.parse.urlsplit(request.url).netloc != self.netloc:
            return  # reported as foreign
        self.failed_requests.append(f"{request.method} {request.url}: {failure}")

    def response(self, response: Response) -> None:
        if response.status >= 400:
            self.failed_requests.append(f"{response.request.method} {response.url}: HTTP {response.status}")

    def problems(self) -> list[str]:
        found = [f"request to another host: {r}" for r in self.foreign_requests]
        found += [f"console error: {e}" for e in self.console_errors if not self._allowed(e)]
        found += [f"failed request: {r}" for r in self.failed_requests if not self._allowed(r)]
        return found

    def _allowed(self, text: str) -> bool:
        return any(p.search(text) for p in self.allowed)


class BrowserTest(unittest.TestCase):
    """A test case with a server and a browser, set by the module's
    ``setUpModule``. :meth:`open` gives a page in a fresh context (no
    cookies) whose :class:`Watch` is checked when the test ends."""

    server: Server
    chromium: Chromium

    def new_context(self, url: str | None = None) -> tuple[BrowserContext, Watch]:
        """A fresh context (no cookies) whose pages are watched, on the
        server or on ``url``."""
        base = url or self.server.url
        context = self.chromium.browser.new_context(viewport=VIEWPORT, base_url=base)
        context.set_default_timeout(10_000)
        watch = Watch(urllib.parse.urlsplit(base).netloc)
        context.route("**/*", watch.route)
        self._watch_of[id(context)] = watch
        self.addCleanup(self._check, context, watch)
        return context, watch

    def open(self, path: str, context: BrowserContext | None = None) -> tuple[Page, Watch]:
        """A new watched page at ``path`` (of the server), loaded; in a new
        context unless one is given."""
        if context is None:
            context, watch = self.new_context()
        else:
            watch = self._watch_of[id(context)]
        page = context.new_page()
        page.on("console", watch.console)
        page.on("pageerror", watch.page_error)
        page.on("requestfailed", watch.request_failed)
        page.on("response", watch.response)
        page.goto(path)
        return page, watch

    def setUp(self) -> None:
        self._watch_of: dict[int, Watch] = {}

    def _check(self, context: BrowserContext, watch: Watch) -> None:
        context.close()
        problems = watch.problems()
        if problems:
            self.fail("the page(s) of this test:\n  " + "\n  ".join(problems))


def eventually(check: Callable[[], Any], timeout: float = 5.0, what: str = "the condition") -> Any:
    """``check()``'s first truthy result within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.1)


def start(tokens: Sequence[Token] = ()) -> tuple[Server, Chromium]:
    """A module's server and browser, given to every :class:`BrowserTest`."""
    server = Server(tokens)
    try:
        chromium = Chromium()
    except BaseException:
        server.stop()
        raise
    BrowserTest.server = server
    BrowserTest.chromium = chromium
    return server, chromium


def stop(server: Server, chromium: Chromium) -> None:
    try:
        chromium.close()
    finally:
        server.stop()


# -- what the spec says the pages have ----------------------------------------

expect.set_options(timeout=10_000)

#: The links of every page's main navigation.
NAV_LINKS = ["Overview", "Tasks", "Alerts", "Queues", "Workflows", "Schedules", "Batches"]

#: The buttons that change something; a read-only token sees none enabled.
ACTION_BUTTONS = [
    "Cancel", "Resubmit", "Resubmit step", "Pause", "Resume", "Redrive", "Redrive all", "Purge",
    "Stop", "Cancel matching…", "Resubmit matching…",
]  # fmt: skip


def region(page: Page, name: str) -> Locator:
    """The section whose heading is ``name`` (the innermost one, when
    sections nest)."""
    return page.locator("section").filter(has=page.get_by_role("heading", name=name, exact=True)).last


def rows(table: Locator) -> Locator:
    """A table's body rows."""
    return table.locator("tbody tr")


def wait_live(page: Page, *, or_ended: bool = False) -> None:
    """Until ``#live`` says the event stream is connected (or, with
    ``or_ended``, that it was and ended: a finished task's stream ends)."""
    expect(page.locator("#live")).to_have_text(re.compile(r"^\s*(live|ended)\s*$" if or_ended else r"^\s*live\s*$"))


def confirm(
    page: Page,
    button: Locator,
    *,
    back_first: bool = True,
    check_unchanged: Callable[[], None] | None = None,
    reason: str | None = None,
) -> None:
    """Clicks an action's ``button``; the dialog must open and only its
    Confirm act. With ``back_first``, first opens it and leaves with Back,
    then runs ``check_unchanged`` (that nothing happened). A ``reason`` is
    typed into the dialog's reason field before Confirm."""
    if back_first:
        button.click()
        dialog = page.locator("dialog[open]")
        expect(dialog, "an action opens a <dialog> to confirm").to_be_visible()
        dialog.get_by_role("button", name="Back", exact=True).click()
        expect(page.locator("dialog[open]"), "Back closes the dialog").to_have_count(0)
        if check_unchanged is not None:
            page.wait_for_timeout(300)
            check_unchanged()
    button.click()
    dialog = page.locator("dialog[open]")
    expect(dialog, "an action opens a <dialog> to confirm").to_be_visible()
    if reason is not None:
        dialog.get_by_label("Reason (optional)").fill(reason)
    dialog.get_by_role("button", name="Confirm", exact=True).click()
    expect(page.locator("dialog[open]"), "Confirm closes the dialog").to_have_count(0)


def usable(link: Locator) -> bool:
    """Whether a paging link is there and enabled (neither absent, nor
    disabled, nor without an href)."""
    if link.count() == 0:
        return False
    first = link.first
    if not first.is_visible():
        return False
    if first.get_attribute("aria-disabled") == "true" or first.get_attribute("disabled") is not None:
        return False
    return first.get_attribute("href") is not None or first.evaluate("e => e.tagName") == "BUTTON"


def mark(page: Page) -> None:
    """Marks the document, so that :func:`still_marked` tells whether it was
    reloaded since."""
    page.evaluate("window.__rotaTestMark = 'same document'")


def still_marked(page: Page) -> bool:
    return bool(page.evaluate("window.__rotaTestMark === 'same document'"))
