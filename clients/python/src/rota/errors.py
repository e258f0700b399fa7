"""The one exception type for answers of the API that are errors."""

from __future__ import annotations

import json


class ApiError(Exception):
    """The API answered with an error: ``{"error": {"code", "reason"}}``.

    ``code`` is stable and meant for programs (``not_found``, ``refused``,
    ``lease_lost``…; see the server's docs/api.md); ``reason`` is for
    people. An answer that is not in that shape (a proxy's error page) gets
    the code ``http_<status>`` and its text as the reason.

    Network failures are not API errors: they stay ``OSError``.
    """

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(f"{status} {code}: {reason}")
        self.status = status
        self.code = code
        self.reason = reason

    @classmethod
    def from_answer(cls, status: int, body: bytes) -> ApiError:
        """The error carried by an answer's body, whatever its shape."""
        try:
            error = json.loads(body)["error"]
            code, reason = error["code"], error["reason"]
            if isinstance(code, str) and isinstance(reason, str):
                return cls(status, code, reason)
        except (ValueError, KeyError, TypeError):
            pass
        return cls(status, f"http_{status}", body.decode("utf-8", errors="replace").strip())
