"""The client: submit tasks, read them, wait for them, follow their events,
cancel and resubmit them."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import cast

from . import sse
from ._http import JSON_NULL, Transport, quote
from .types import (
    AuditEntry,
    Batch,
    BatchFilter,
    CallbackAccepted,
    DeadLetterFilter,
    Event,
    Json,
    SignalDelivery,
    Task,
    TaskCounts,
    TaskState,
    TaskSummary,
    Workflow,
    WorkflowPause,
)

#: The server when neither the ``url`` argument nor ``ROTA_URL`` names one.
DEFAULT_URL = "http://127.0.0.1:7878"

#: How long an event stream may stay silent before it is opened again: the
#: server sends a keep-alive comment every 15 s.
STREAM_IDLE_S = 60.0


class Client:
    """rota's HTTP API for programs that submit and follow tasks.

    ``url`` defaults to ``ROTA_URL`` (else ``http://127.0.0.1:7878``) and
    ``token`` to ``ROTA_TOKEN``; ``timeout`` bounds each request, in seconds.
    Errors the API answers raise ``ApiError``; an unreachable server raises
    ``OSError``. A client may be shared between threads.
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0) -> None:
        url = url or os.environ.get("ROTA_URL") or DEFAULT_URL
        token = token if token is not None else os.environ.get("ROTA_TOKEN")
        self._http = Transport(url, token or None, timeout)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._http.url

    def submit(
        self,
        workflow: str,
        input: Json = None,
        *,
        id: str | None = None,
        version: int | None = None,
        callback_url: str | None = None,
        reply_queue: str | None = None,
        start_at: str | None = None,
        delay: str | None = None,
        tags: Mapping[str, str] | None = None,
        priority: int | None = None,
    ) -> Task:
        """Submits a task of ``workflow`` (its latest version unless
        ``version`` says) and returns it. ``id`` is the idempotency key:
        submitting an id that exists creates nothing and returns that task,
        so a submit whose answer was lost can simply be sent again.
        ``start_at`` (RFC 3339) or ``delay`` (``"10m"``) puts its start off:
        it waits Pending until then, and its ``not_before`` says when.
        ``reply_queue`` names a durable queue of the server's store that
        receives each status event of the task, in the commit that records
        it, with the task id as ``correlation_id``. ``tags`` label the task
        for :meth:`tasks` and :meth:`task_counts` to find it by.
        ``priority`` (-100 to 100; the workflow's ``priority:``, or 0, when
        not given): Schedulers claim higher priorities first, then in
        submission order, and one claimed task in eight is the oldest
        waiting whatever its priority."""
        body: dict[str, Json] = {"workflow": workflow}
        if input is not None:
            body["input"] = input
        if id is not None:
            body["id"] = id
        if version is not None:
            body["version"] = version
        if callback_url is not None:
            body["callback_url"] = callback_url
        if reply_queue is not None:
            body["reply_queue"] = reply_queue
        if start_at is not None:
            body["start_at"] = start_at
        if delay is not None:
            body["delay"] = delay
        if tags:
            body["tags"] = dict(tags)
        if priority is not None:
            body["priority"] = priority
        return cast(Task, self._http.call("POST", "/v1/tasks", body))

    def status(self, task_id: str) -> Task:
        """The task with its input, output and steps."""
        return cast(Task, self._http.call("GET", "/v1/tasks/" + quote(task_id)))

    def history(self, task_id: str) -> list[Event]:
        """The task's events so far, oldest first."""
        return cast("list[Event]", self._http.call("GET", f"/v1/tasks/{quote(task_id)}/history"))

    def tasks(
        self,
        *,
        state: TaskState | None = None,
        workflow: str | None = None,
        locked_by: str | None = None,
        tags: Mapping[str, str] | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        ended_after: str | None = None,
        ended_before: str | None = None,
        id_prefix: str | None = None,
        parent: str | None = None,
        before: str | None = None,
        limit: int | None = None,
    ) -> list[TaskSummary]:
        """Tasks, newest first, that match every filter given: state,
        workflow, holder, every one of ``tags``, creation and end times
        (RFC 3339; ``*_after`` inclusive, ``*_before`` exclusive; an end
        time selects finished tasks), id prefix and ``parent`` (the children
        its ``workflow:`` steps started) (``limit``: at most 1000 by default
        on the server, 100 if not given). ``before`` pages: only
        the tasks created before that task, so pass the last id of a page to
        get the next one (an empty page is the end; an id that names no task
        is a 400 ``invalid_query``)."""
        query = _search_query(tags, created_after, created_before, ended_after, ended_before, id_prefix, parent)
        chosen = {"state": state, "workflow": workflow, "locked_by": locked_by, "before": before}
        query.extend((key, value) for key, value in chosen.items() if value is not None)
        if limit is not None:
            query.append(("limit", str(limit)))
        return cast("list[TaskSummary]", self._http.call("GET", "/v1/tasks", query=query))

    def task_counts(
        self,
        *,
        workflow: str | None = None,
        tags: Mapping[str, str] | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        ended_after: str | None = None,
        ended_before: str | None = None,
        id_prefix: str | None = None,
        parent: str | None = None,
    ) -> TaskCounts:
        """Exact counts, by state, of the tasks matching the filters (as
        :meth:`tasks` takes them)."""
        query = _search_query(tags, created_after, created_before, ended_after, ended_before, id_prefix, parent)
        if workflow is not None:
            query.append(("workflow", workflow))
        return cast(TaskCounts, self._http.call("GET", "/v1/tasks/counts", query=query))

    def create_batch(
        self,
        action: str,
        filter: BatchFilter | None = None,
        *,
        dead_letters: DeadLetterFilter | None = None,
        reason: str | None = None,
    ) -> Batch:
        """Starts a bulk action: ``cancel`` or ``resubmit`` every task
        ``filter`` selects (at least one filter; a resubmit without
        ``state`` selects the tasks in Error), or ``redrive`` every dead
        letter ``dead_letters`` selects (its ``queue`` is required). The
        server's Supervisor leader runs it; follow it with :meth:`batch`."""
        body: dict[str, Json] = {"action": action}
        if filter is not None:
            body["filter"] = cast(Json, dict(filter))
        if dead_letters is not None:
            body["dead_letters"] = cast(Json, dict(dead_letters))
        if reason is not None:
            body["reason"] = reason
        return cast(Batch, self._http.call("POST", "/v1/batches", body))

    def batch(self, batch_id: str) -> Batch:
        """A batch and how far it got."""
        return cast(Batch, self._http.call("GET", "/v1/batches/" + quote(batch_id)))

    def batches(self, *, limit: int | None = None) -> list[Batch]:
        """The latest batches, newest first."""
        query = [] if limit is None else [("limit", str(limit))]
        return cast("list[Batch]", self._http.call("GET", "/v1/batches", query=query))

    def stop_batch(self, batch_id: str, reason: str | None = None) -> Batch:
        """Stops a batch: the tasks it has not reached are left as they are.
        ``reason`` is kept in the audit log with who stopped it."""
        return cast(Batch, self._http.call("POST", f"/v1/batches/{quote(batch_id)}/stop", {"reason": reason}))

    def audit(
        self,
        *,
        since: str | None = None,
        action: str | None = None,
        by: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """Operator actions, newest first, with who did them and why:
        ``since`` an RFC 3339 time, ``action`` one name (``task.cancel``,
        ``dlq.redrive``…), ``by`` exactly one name; ``after`` the ``cursor``
        of the last entry of the previous page."""
        given = {"since": since, "action": action, "by": by, "after": after, "limit": None if limit is None else str(limit)}
        query = [(name, value) for name, value in given.items() if value is not None]
        return cast("list[AuditEntry]", self._http.call("GET", "/v1/audit", query=query))

    def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Waits until the task is terminal (``processed``, ``error``,
        ``compensated`` or ``cancelled``) and returns it. Follows its event
        stream, so it returns as soon as the task ends. ``TimeoutError``
        after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self._follow(task_id, None, deadline):
            pass
        return self.status(task_id)

    def events(self, task_id: str, *, after: int | None = None) -> Iterator[Event]:
        """The task's events: its history (after the event ``after``, if
        given), then each one as it happens, until the task is terminal.
        A dropped stream is opened again from the last event seen."""
        return self._follow(task_id, after, None)

    def cancel(self, task_id: str, reason: str | None = None) -> TaskState:
        """Cancels a task that has not finished; returns the state it moved
        to (``cancelled``, or ``compensating`` when completed steps are
        undone). ``reason`` is kept in its history with who cancelled it.
        ``ApiError`` ``refused`` for a finished task."""
        answer = self._http.call("POST", f"/v1/tasks/{quote(task_id)}/cancel", {"reason": reason})
        return cast(TaskState, answer["state"])

    def pause(self, task_id: str, reason: str | None = None) -> Task:
        """Pauses a task that has not finished: it starts no new step until
        resumed (steps in flight finish). ``reason`` is kept in its history
        with who paused it. Returns the task (``paused`` true). ``ApiError``
        ``refused`` for a finished or already paused task."""
        answer = self._http.call("POST", f"/v1/tasks/{quote(task_id)}/pause", {"reason": reason})
        return cast(Task, answer)

    def resume(self, task_id: str, reason: str | None = None) -> Task:
        """Resumes a paused task; ``reason`` is kept in its history. Returns
        the task (``paused`` false). ``ApiError`` ``refused`` for a task that
        is not paused."""
        answer = self._http.call("POST", f"/v1/tasks/{quote(task_id)}/resume", {"reason": reason})
        return cast(Task, answer)

    def workflows(self) -> list[Workflow]:
        """The latest version of every registered workflow, sorted by name,
        each saying whether it is paused."""
        return cast(list[Workflow], self._http.call("GET", "/v1/workflows"))

    def pause_workflow(self, name: str, reason: str | None = None) -> WorkflowPause:
        """Pauses a workflow (every version): no Scheduler claims its tasks
        until it is resumed, so new ones wait ``pending``; tasks already
        running go on. ``reason`` is kept with who paused it. ``ApiError``
        ``refused`` when it is paused already, ``unknown_workflow`` when it
        is not registered."""
        answer = self._http.call("POST", f"/v1/workflows/{quote(name)}/pause", {"reason": reason})
        return cast(WorkflowPause, answer)

    def resume_workflow(self, name: str, reason: str | None = None) -> WorkflowPause:
        """Resumes a paused workflow: its waiting tasks are claimed again.
        ``ApiError`` ``refused`` when it is not paused."""
        answer = self._http.call("POST", f"/v1/workflows/{quote(name)}/resume", {"reason": reason})
        return cast(WorkflowPause, answer)

    def signal(self, task_id: str, name: str, data: Json = None) -> SignalDelivery:
        """Sends the signal ``name`` with ``data`` to a task: it completes the
        step that waits for it (``wait: name``), now or when the task gets
        there, and ``data`` becomes that step's output. ``ApiError``
        ``invalid_signal`` when no step waits for it, ``refused`` when the
        task has finished or the step already received it."""
        body = JSON_NULL if data is None else data
        answer = self._http.call("POST", f"/v1/tasks/{quote(task_id)}/signals/{quote(name)}", body)
        return cast(SignalDelivery, answer)

    def complete_callback(self, token: str, output: Json = None) -> CallbackAccepted:
        """Completes the attempt of a callback step (``callback: true``) that
        ``token`` names, with ``output`` as the step's output: what the
        remote service that got the step's request does when its work is
        done. The token is the request's ``Rota-Callback-Token`` header (or
        ``{{ callback.token }}`` in its input) and is the credential: no
        API token is needed. ``ApiError`` ``unknown_callback`` for a token
        that names no waiting step, ``refused`` when its attempt is over
        or the token was used; either way nothing changed."""
        return self._callback(token, {"output": output})

    def fail_callback(self, token: str, error: str, retryable: bool = False) -> CallbackAccepted:
        """Fails the attempt ``token`` names (see :meth:`complete_callback`):
        for good unless ``retryable``, in which case the step is tried again
        as a new attempt with a new token, counted against the task's
        ``max_failures``."""
        return self._callback(token, {"error": error, "retryable": retryable})

    def _callback(self, token: str, body: dict[str, Json]) -> CallbackAccepted:
        answer = self._http.call("POST", f"/v1/callbacks/{quote(token)}", body)
        return cast(CallbackAccepted, answer)

    def resubmit(self, task_id: str, step: str | None = None, *, input: Json = None, reason: str | None = None) -> TaskState:
        """Runs a task that ended in ``error`` again (its failed steps, or
        just ``step``); returns its new state. With ``input`` (which needs
        ``step``), the task's input is replaced first, and ``step`` and every
        step that depends on it run again on it; the history records the old
        and the new input. ``reason`` is kept in its history with who asked.
        ``ApiError`` ``refused`` for a task that did not fail."""
        if input is not None and step is None:
            raise ValueError("a new input needs the step to resubmit from (step=...)")
        path = f"/v1/tasks/{quote(task_id)}" + (f"/steps/{quote(step)}" if step is not None else "") + "/resubmit"
        body: dict[str, Json] = {"reason": reason}
        if input is not None:
            body["input"] = input
        answer = self._http.call("POST", path, body)
        return cast(TaskState, answer["state"])

    def _follow(self, task_id: str, after: int | None, deadline: float | None) -> Iterator[Event]:
        path = f"/v1/tasks/{quote(task_id)}/events"
        while True:
            query = None if after is None else {"after": str(after)}
            connection, response = self._http.open("GET", path, query=query, headers={"Accept": "text/event-stream"}, timeout=STREAM_IDLE_S)
            try:
                for message in sse.messages(_Bounded(response, connection, deadline)):
                    if message.event == "end":
                        return
                    if message.event == "message":
                        event = cast(Event, json.loads(message.data))
                        after = event["seq"]
                        yield event
            except (OSError, http.client.HTTPException):
                pass  # a dropped or silent stream: opened again below
            finally:
                connection.close()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} did not end in time")
            # The server closes streams when it stops; do not spin while it restarts.
            time.sleep(0.2)


class _Bounded:
    """A response whose every line must arrive before a deadline (keep-alive
    comments arrive every 15 s, so a timeout on each read alone would never
    end a wait)."""

    def __init__(self, response: http.client.HTTPResponse, connection: http.client.HTTPConnection, deadline: float | None) -> None:
        self._response = response
        self._connection = connection
        self._deadline = deadline

    def readline(self, limit: int = -1, /) -> bytes:
        if self._deadline is not None and self._connection.sock is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("deadline passed")
            self._connection.sock.settimeout(min(STREAM_IDLE_S, left))
        return self._response.readline(limit)


def _search_query(
    tags: Mapping[str, str] | None,
    created_after: str | None,
    created_before: str | None,
    ended_after: str | None,
    ended_before: str | None,
    id_prefix: str | None,
    parent: str | None,
) -> list[tuple[str, str]]:
    """The search filters as query parameters: one ``tag=key=value`` per tag."""
    query = [("tag", f"{key}={value}") for key, value in (tags or {}).items()]
    named = {
        "created_after": created_after,
        "created_before": created_before,
        "ended_after": ended_after,
        "ended_before": ended_before,
        "id_prefix": id_prefix,
        "parent": parent,
    }
    query.extend((key, value) for key, value in named.items() if value is not None)
    return query
