"""The signature of a webhook delivery: HMAC-SHA256 of ``<timestamp>.<body>`` under the
webhook's secret, sent as ``X-Memory-Signature: t=<timestamp>,v1=<hex digest>``.

The timestamp is signed with the body so that a captured delivery cannot be replayed later
than the receiver's tolerance; the receiver compares digests in constant time. docs/events.md
shows a receiver's check (tests/test_events.py runs it against real deliveries).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Memory-Signature"
EVENT_ID_HEADER = "X-Memory-Event-Id"
EVENT_TYPE_HEADER = "X-Memory-Event-Type"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for ``body`` sent at ``timestamp`` (now by default)."""
    moment = int(time.time()) if timestamp is None else timestamp
    digest = hmac.new(secret.encode(), f"{moment}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={moment},v1={digest}"
