"""A client for rota's HTTP API, and a helper to write workers in Python.

    from rota import Client
    client = Client("http://127.0.0.1:7878", token="…")
    task = client.submit("greet", {"name": "ada"})
    print(client.wait(task["id"], timeout=60)["output"])

Standard library only. ``Client`` submits, reads, waits for, follows,
cancels, resubmits and signals tasks; ``Worker`` runs the steps of remote agents
(``@worker.step("agent")``); ``verify_webhook`` checks a webhook delivery.
Every error the API answers is an ``ApiError`` with its ``code`` and
``reason``.
"""

from .client import Client
from .errors import ApiError
from .types import (
    TERMINAL_STATES,
    AuditEntry,
    Batch,
    BatchFilter,
    CallbackAccepted,
    DeadLetterFilter,
    Event,
    Json,
    SignalDelivery,
    StepView,
    Task,
    TaskCounts,
    TaskState,
    TaskSummary,
    Workflow,
    WorkflowPause,
    WorkRequest,
)
from .webhooks import InvalidSignature, verify_webhook
from .worker import Permanent, Retryable, Step, Worker

__all__ = [
    "TERMINAL_STATES",
    "ApiError",
    "AuditEntry",
    "Batch",
    "BatchFilter",
    "DeadLetterFilter",
    "Client",
    "Event",
    "InvalidSignature",
    "Json",
    "Permanent",
    "Retryable",
    "CallbackAccepted",
    "SignalDelivery",
    "Step",
    "StepView",
    "Task",
    "TaskCounts",
    "TaskState",
    "TaskSummary",
    "WorkRequest",
    "Worker",
    "Workflow",
    "WorkflowPause",
    "verify_webhook",
]
