"""Server-sent events, read line by line from a response."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol


class _Lines(Protocol):
    def readline(self, limit: int = -1, /) -> bytes: ...


@dataclass
class Message:
    """One server-sent event: its ``event`` name (``message`` unless named),
    ``data`` (lines joined by newlines) and ``id`` (``None`` if it had none)."""

    event: str
    data: str
    id: str | None


def messages(stream: _Lines) -> Iterator[Message]:
    """The events of a stream until it closes; comments (keep-alives) are skipped."""
    event, last_id = "", None
    data: list[str] = []
    while True:
        raw = stream.readline()
        if not raw:
            return
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield Message(event or "message", "\n".join(data), last_id)
            event, data, last_id = "", [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            last_id = value
