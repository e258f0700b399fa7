"""Checking the signature of a webhook delivery.

The server signs each POST with the header
``Rota-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``
under the secret it was given (``ROTA_WEBHOOK_SECRET``). A receiver checks
the HMAC over the raw body, exactly as it arrived, and refuses a ``t`` too
far from now, which would be a replay.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import cast

from .types import Event

#: The header that carries the signature.
SIGNATURE_HEADER = "Rota-Signature"

#: How far ``t`` may be from now, in seconds, unless told otherwise.
TOLERANCE_S = 300


class InvalidSignature(ValueError):
    """The delivery was not signed with this secret, or it is too old."""


def sign(secret: str | bytes, body: bytes, unix_seconds: int) -> str:
    """The ``Rota-Signature`` value the server sends with ``body`` at ``unix_seconds``."""
    key = secret.encode() if isinstance(secret, str) else secret
    tag = hmac.new(key, f"{unix_seconds}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={unix_seconds},v1={tag}"


def verify_webhook(
    body: bytes,
    signature: str | None,
    secret: str | bytes,
    *,
    tolerance_s: float = TOLERANCE_S,
    now: float | None = None,
) -> Event:
    """Checks a delivery and returns its event.

    ``body`` is the raw request body, ``signature`` the ``Rota-Signature``
    header. Raises ``InvalidSignature`` when the header is missing or
    malformed, no ``v1`` matches (compared in constant time), or ``t`` is more
    than ``tolerance_s`` seconds from ``now`` (the current time by default).
    Delivery is at least once: use the event's ``seq`` (also the
    ``Rota-Event-Id`` header) to drop repeats.
    """
    if not signature:
        raise InvalidSignature(f"no {SIGNATURE_HEADER} header")
    sent_at: int | None = None
    tags: list[str] = []
    for part in signature.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            try:
                sent_at = int(value)
            except ValueError:
                raise InvalidSignature(f"t={value!r} is not a time") from None
        elif name == "v1":
            tags.append(value)
    if sent_at is None or not tags:
        raise InvalidSignature(f"{SIGNATURE_HEADER} must have t= and v1=")
    expected = sign(secret, body, sent_at).partition(",v1=")[2]
    if not any(hmac.compare_digest(expected, tag) for tag in tags):
        raise InvalidSignature("the signature does not match this secret and body")
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance_s:
        raise InvalidSignature(f"signed at {sent_at}, more than {tolerance_s}s from now ({int(current)}): a replay?")
    return cast(Event, json.loads(body))
