"""HTTP with the standard library: one connection per request.

``http.client`` rather than ``urllib.request``: it hands out error answers
as answers (not exceptions to unpick) and streams a response line by line
(server-sent events) with a timeout that can change between reads.

A connection per request keeps the transport safe to share between threads;
on the loopback or a LAN the extra connect costs far less than the calls.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.parse
from typing import Any

from .errors import ApiError

#: The user agent sent with every request.
USER_AGENT = "rota-client-python/0.1"


class Transport:
    """Requests to one server, with its bearer token."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"{url!r} is not an http or https URL")
        self.url = url.rstrip("/")
        self._https = parsed.scheme == "https"
        self._host = parsed.hostname
        self._port = parsed.port
        self._prefix = parsed.path.rstrip("/")
        self._token = token
        self.timeout = timeout

    def open(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Sends a request and returns its connection and response, unread
        (for streams); the caller closes the connection. An error answer is
        read and raised as ``ApiError``."""
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        connection = self._connection(self.timeout if timeout is None else timeout)
        try:
            sent = {"User-Agent": USER_AGENT, "Accept": "application/json"}
            if self._token:
                sent["Authorization"] = "Bearer " + self._token
            data = None
            if body is not None:
                data = json.dumps(None if body is JSON_NULL else body).encode()
                sent["Content-Type"] = "application/json"
            sent.update(headers or {})
            connection.request(method, target, body=data, headers=sent)
            response = connection.getresponse()
            if response.status >= 400:
                raise ApiError.from_answer(response.status, response.read())
            return connection, response
        except BaseException:
            connection.close()
            raise

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | list[tuple[str, str]] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Sends a request and returns its JSON answer (``ApiError`` for an
        error answer, ``OSError`` when the server cannot be reached)."""
        connection, response = self.open(method, path, body, query=query, timeout=timeout)
        try:
            text = response.read()
        finally:
            connection.close()
        return json.loads(text) if text else None

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)


#: A request body that is JSON ``null`` (``None`` means no body at all).
JSON_NULL: Any = object()


def quote(segment: str) -> str:
    """One path segment, URL-encoded (a task id may hold ``/`` or spaces)."""
    return urllib.parse.quote(segment, safe="")
