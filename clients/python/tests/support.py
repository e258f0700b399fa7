"""A real ``rota serve`` for the tests, and workers as child processes.

The binary is ``$ROTA_BIN`` (``.ci/run`` sets it to the debug build), else
the checkout's ``target/debug/rota``.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CLIENT_DIR = Path(__file__).resolve().parents[1]
REPO_DIR = CLIENT_DIR.parents[1]
SOURCE_DIR = CLIENT_DIR / "src"
EXAMPLES_DIR = CLIENT_DIR / "examples"
TESTS_DIR = CLIENT_DIR / "tests"

ADMIN_TOKEN = "admin-token-for-the-python-client"
SUBMIT_TOKEN = "submit-token-for-the-python-client"
WORKER_TOKEN = "worker-token-for-the-python-client"
WEBHOOK_SECRET = "a-webhook-secret-for-the-python-client"
WORKER_KEY = "a-worker-lease-key-of-at-least-32-bytes-for-python"

#: How long a server may take to say where it listens, and to stop.
STARTUP_S = 30.0
STOP_S = 20.0

#: The workflows every test server has.
WORKFLOWS = {
    # The README's workflow: what examples/submit.py submits.
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
    # What examples/worker.py serves.
    "hello": """
name: hello
version: 1
steps:
  - name: greet
    agent: greeter
    with: { name: "{{ input.name }}" }
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
    # A quick step of a workflow the tests pause (no other test uses it).
    "gated": """
name: gated
version: 1
steps:
  - name: pass
    agent: delay
    with: { ms: 1 }
""",
    # A step that runs a child workflow (`parcel`, one quick step).
    "shipment": """
name: shipment
version: 1
steps:
  - name: ship
    workflow: parcel
    timeout: 1m
""",
    "parcel": """
name: parcel
version: 1
steps:
  - name: book
    agent: delay
    with: { ms: 1 }
""",
    # A step that sleeps: a task to cancel, or to wait for in vain.
    "nap": """
name: nap
version: 1
steps:
  - name: sleep
    agent: delay
    with: { for: "60s" }
    timeout: 2m
""",
    # One task per customer at a time: the next waits for the key's slot.
    "serial": """
name: serial
version: 1
concurrency: { key: input.customer, limit: 1 }
steps:
  - name: sleep
    agent: delay
    with: { for: "60s" }
    timeout: 2m
""",
    # Retryable and permanent faults, with a step to undo.
    "pay": """
name: pay
version: 1
steps:
  - name: charge
    agent: payments
    with: { card: "{{ input.card }}", flaky: "{{ input.flaky }}" }
    timeout: 30s
    retry: { attempts: 2, backoff: 20ms, max_backoff: 50ms }
""",
    # A remote step whose policy fails HTTP 503 at once.
    "picky": """
name: picky
version: 1
steps:
  - name: call
    agent: payments
    with: { n: 1 }
    timeout: 30s
    retry: { attempts: 3, backoff: 20ms, max_backoff: 50ms, non_retryable: [503] }
""",
    # One slow step for the workers killed or stopped in the middle of it.
    "slow": """
name: slow
version: 1
steps:
  - name: work
    agent: slow
    with: { sleep_s: "{{ input.sleep_s }}" }
    timeout: 60s
""",
    # Steps that count how many run at once.
    "count": """
name: count
version: 1
steps:
  - name: hold
    agent: counted
    with: { hold_s: "{{ input.hold_s }}" }
    timeout: 60s
""",
}

REMOTE_AGENTS = ["greeter", "payments", "slow", "counted"]


def rota_bin() -> str:
    """The rota binary the tests run."""
    path = os.environ.get("ROTA_BIN") or str(REPO_DIR / "target" / "debug" / "rota")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no rota binary at {path}: build it (cargo build -p rota) or set ROTA_BIN")
    return path


class Server:
    """``rota serve`` on a temporary SQLite file and a free loopback port,
    with an admin, a submit and a worker token, the remote agents above and
    webhooks signed with ``WEBHOOK_SECRET``."""

    def __init__(self) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="rota-python-")
        root = Path(self.dir.name)
        (root / "workflows").mkdir()
        for name, text in WORKFLOWS.items():
            (root / "workflows" / f"{name}.yaml").write_text(text)
        auth = root / "auth.toml"
        auth.write_text(
            f'[[tokens]]\nname = "admin"\ntoken = "{ADMIN_TOKEN}"\nscopes = ["admin"]\n\n'
            f'[[tokens]]\nname = "shop"\ntoken = "{SUBMIT_TOKEN}"\nscopes = ["submit"]\n\n'
            f'[[tokens]]\nname = "workers"\ntoken = "{WORKER_TOKEN}"\nscopes = ["agent:{",".join(REMOTE_AGENTS)}"]\n'
        )
        self.log_path = root / "serve.log"
        env = dict(os.environ, ROTA_WORKER_KEY=WORKER_KEY, ROTA_WEBHOOK_SECRET=WEBHOOK_SECRET, RUST_LOG="info")
        env.pop("ROTA_API_TOKEN", None)
        command = [
            rota_bin(),
            "--store", f"sqlite://{root / 'rota.db'}",
            "--durability", "normal",
            "serve",
            "--workflows", str(root / "workflows"),
            "--listen", "127.0.0.1:0",
            "--auth", str(auth),
            "--remote-agent", ",".join(REMOTE_AGENTS),
            "--instance-id", "python-tests",
            # The cancelled naps' delay calls need not hold up the stop.
            "--shutdown-grace", "1s",
        ]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.url = self._wait_listening()

    def _wait_listening(self) -> str:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            found = re.search(r"listening on (http://[0-9.:]+)", self.log())
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rota serve did not start listening:\n{self.log()}")

    def log(self) -> str:
        """What the server logged so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not stop in time."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.dir.cleanup()


def client_env(server: Server, token: str, **extra: str) -> dict[str, str]:
    """The environment of a child process that uses the client from source."""
    path = os.pathsep.join(p for p in (str(SOURCE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, ROTA_URL=server.url, ROTA_TOKEN=token, PYTHONUNBUFFERED="1", **extra)


class Child:
    """A Python program as a child process, its stderr lines collected as
    they come (so that a test can wait for one)."""

    def __init__(self, script: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.process.stderr is not None
        stderr = self.process.stderr

        def read() -> None:
            for line in stderr:
                self.lines.put(line.rstrip("\n"))

        threading.Thread(target=read, daemon=True).start()

    def wait_for(self, pattern: str, timeout: float = 20.0) -> str:
        """The first stderr line (from now on, or seen before) matching ``pattern``."""
        deadline = time.monotonic() + timeout
        for line in self.seen:
            if re.search(pattern, line):
                return line
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n" + "\n".join(self.seen))
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if re.search(pattern, line):
                return line

    def drain(self) -> str:
        """Every stderr line so far, as one text."""
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except queue.Empty:
                return "\n".join(self.seen)

    def close(self) -> None:
        """Stops it if it still runs: SIGTERM, then SIGKILL. (A worker killed
        in a long poll would leave the server a receive that takes the next
        request for a whole lease, delaying the next test.)"""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
