"""The API's JSON objects, as typed dictionaries.

They are the server's answers as they come (``/openapi.json`` describes
them); a field the server adds later is simply there too. Times are integers:
milliseconds since the Unix epoch.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

#: Any JSON value: the inputs and outputs of tasks and steps.
Json = Any

TaskState = Literal["pending", "processing", "processed", "error", "compensating", "compensated", "cancelled"]
StepState = Literal["not_started", "running", "completed", "failed", "compensating", "compensated", "skipped"]

#: The states a task does not leave by itself (``error`` may be resubmitted).
TERMINAL_STATES: frozenset[str] = frozenset({"processed", "error", "compensated", "cancelled"})


class StepView(TypedDict):
    """One step of a task."""

    name: str
    position: int
    agent: str | None
    waits_for: str | None
    #: The child workflow it runs (a ``workflow:`` step), else None.
    workflow: str | None
    when: str | None
    state: StepState
    attempt: int
    owner: str | None
    complete_by: int | None
    not_before: int
    input: Json
    output: Json
    last_error: str | None
    updated_at: int


class TaskSummary(TypedDict):
    """A task as listings show it: without input, output and steps."""

    id: str
    workflow: str
    version: int
    state: TaskState
    locked_by: str | None
    complete_by: int | None
    failure_count: int
    error: str | None
    submitter: str | None
    #: Whether an operator paused it: it starts no new step until resumed.
    paused: bool
    #: Its labels, by key (empty when it has none).
    tags: dict[str, str]
    #: Schedulers claim higher priorities first.
    priority: int
    created_at: int
    updated_at: int


class ParentView(TypedDict):
    """Where a child workflow's task comes from."""

    task: str
    step: str
    attempt: int
    depth: int


class ChildView(TypedDict):
    """One child workflow of a task."""

    id: str
    workflow: str
    state: TaskState
    step: str
    attempt: int


class _TaskFields(TaskSummary):
    lease_epoch: int
    not_before: int
    max_failures: int | None
    input: Json
    output: Json
    callback_url: str | None
    reply_queue: str | None
    #: Whether its workflow is paused: no Scheduler claims it meanwhile.
    workflow_paused: bool
    #: The task whose ``workflow:`` step started it, when it is a child.
    parent: ParentView | None
    #: The child workflows its ``workflow:`` steps started, newest first.
    children: list[ChildView]
    steps: list[StepView]


class Task(_TaskFields, total=False):
    """A task with its input, output and steps."""

    #: Its concurrency key (``customer=c1``, or ``max_in_flight``), when its
    #: workflow has ``concurrency:`` or ``max_in_flight:``: at most the
    #: workflow's limit of its tasks with this key run at once. Absent otherwise.
    concurrency_key: str
    #: Why a pending task has not started, when its concurrency key holds it
    #: back: ``waiting for concurrency key customer=c1 (1/1 in use)``. Absent
    #: otherwise.
    waiting_for: str


class TaskCountsByState(TypedDict):
    """How many tasks are in each state: every state, zeros included."""

    pending: int
    processing: int
    processed: int
    error: int
    compensating: int
    compensated: int
    cancelled: int


class TaskCounts(TypedDict):
    """Exact task counts by state, and their total."""

    counts: TaskCountsByState
    total: int


class BatchFilter(TypedDict, total=False):
    """Which tasks a batch acts on: the filters of :meth:`Client.tasks`."""

    state: TaskState
    workflow: str
    #: ``key=value`` tags, every one of which a task must have.
    tag: list[str]
    created_after: str
    created_before: str
    ended_after: str
    ended_before: str
    id_prefix: str
    #: Only the children of this task.
    parent: str


class _DeadLetterFilterQueue(TypedDict):
    #: The queue whose dead letters (required).
    queue: str


class DeadLetterFilter(_DeadLetterFilterQueue, total=False):
    """Which dead letters of a queue a ``redrive`` batch sends back: those
    matching every condition given."""

    #: Only dead letters whose reason contains this text (case-sensitive).
    reason_contains: str
    #: Only dead letters dead-lettered at or after this time (RFC 3339).
    dead_lettered_after: str
    #: Only dead letters dead-lettered strictly before this time (RFC 3339).
    dead_lettered_before: str


class _BatchFields(TypedDict):
    id: str
    #: ``cancel``, ``resubmit`` or ``redrive``.
    action: str
    #: The tasks it acts on (empty for a redrive).
    filter: BatchFilter
    #: ``running``, ``stopped`` or ``done``.
    state: str
    total: int
    done: int
    skipped: int
    failed: int
    last_error: str | None
    requested_by: str
    reason: str | None
    locked_by: str | None
    lease_until: int | None
    created_at: int
    updated_at: int


class Batch(_BatchFields, total=False):
    """A bulk action and how far it got."""

    #: The dead letters a redrive sends back (only on a redrive).
    dead_letters: DeadLetterFilter


class AuditEntry(TypedDict):
    """One operator action, as ``GET /v1/audit`` lists it."""

    #: Its place in the listing: pass it as ``after`` for the next page.
    cursor: str
    #: When, epoch ms.
    at: int
    #: ``task.cancel``, ``dlq.redrive``, ``prune``…
    action: str
    #: Who: the token's name, ``cli, user NAME``, or retention.
    by: str
    reason: str | None
    #: A task id, a queue, a workflow, a schedule, a batch id.
    target: str
    detail: Json


class Event(TypedDict):
    """One entry of a task's history: a server-sent event's data, a webhook's body."""

    seq: int
    task_id: str
    at: int
    kind: str
    step: str | None
    attempt: int | None
    detail: Json


class RetryPolicy(TypedDict):
    """How a worker retries transient faults within one attempt."""

    attempts_max: int
    backoff_initial_ms: int
    backoff_max_ms: int
    #: Classes of fault to fail at once rather than retry: HTTP statuses
    #: (``"503"``) and kinds (``"timeout"``); see ``Retryable.failure_class``.
    non_retryable: list[str]


class WorkRequest(TypedDict):
    """One attempt of one step, as a worker receives it."""

    lease_token: str
    lease_until: int
    task_id: str
    workflow: str
    step: str
    attempt: int
    compensate: bool
    input: Json
    idempotency_key: str
    complete_by: int
    delivery_count: int
    retry: RetryPolicy


class CallbackAccepted(TypedDict):
    """What a callback did: the step and attempt its token named, and
    whether it completed the step (rather than failing the attempt)."""

    task_id: str
    step: str
    attempt: int
    completed: bool


class SignalDelivery(TypedDict):
    """What a signal did: the step it went to, and whether it completed it
    now (it was waiting) or is kept until the task reaches it."""

    id: str
    signal: str
    step: str
    completed: bool


class WorkflowPause(TypedDict):
    """An operator's pause or resume of a workflow: who, why and when."""

    workflow: str
    #: Whether it is paused (the change was a pause) or not (a resume).
    paused: bool
    by: str
    reason: str | None
    at: int


class Workflow(TypedDict):
    """The latest registered version of a workflow, and whether it is
    paused (no Scheduler claims its tasks)."""

    name: str
    version: int
    registered_at: int | None
    steps: list[dict[str, Json]]
    definition: Json
    paused: bool
    #: Its latest pause or resume; absent when it was never paused.
    pause: WorkflowPause | None
