"""Signed cursors: every list's ``next`` is sealed here, and every ``cursor`` opened here.

A cursor names a position in a list (the last item's sort key). Unsigned, it was input like
any other, and a forged one (a NaN timestamp, a NUL in a name) reached a store and failed
there. Sealed, the server only ever reads back what it wrote itself, for the same list and
the same caller:

* the token is ``<payload>.<mac>``, both base64url without padding; the payload is compact
  JSON ``{"k": <list>, ...position}``;
* the MAC is HMAC-SHA256 over the list's name, the caller's scope and the payload bytes.
  The list's name includes what makes a list the list it is (the agent, the entity, the
  filters), and the scope is what the caller's key reaches (its agents or its users, None
  for all): a cursor is good for the list and filters it came from, with any key of the same
  reach, and nowhere else (another list, other filters, a key of another reach: 422);
* the MAC key is derived from the pseudonym secret (USER_DIGEST_KEY, else the one kept in
  Redis: memory_service/access/pseudonyms.py), so every replica shares it, a cursor survives
  a restart, and changing USER_DIGEST_KEY invalidates the cursors given before (a 422 that
  says to start the list again).

Opening also checks what it decodes, before anything reaches a store, even though a valid
MAC means the server wrote it: numbers must be finite (JSON ``NaN``/``Infinity`` are
refused) and integers within 2^53, strings free of control characters, the payload small
and flat. A refusal is InvalidInput (422) with a message that says what to do.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
from typing import Any

from memory_service.access.pseudonyms import Pseudonyms
from memory_service.domain.errors import InvalidInput

MAX_CURSOR_CHARS = 2000  # of a cursor parameter (a 200-character name, in UTF-8, then base64)
_MAX_INT = 2**53  # integers a JSON reader anywhere reads exactly
_MAC_BYTES = 32
_DERIVATION = b"memory-service cursor key v1"

FORGED = ("cursor: not a cursor this API gave for this list and key (damaged, forged, made for another list, "
          "other filters or a key of another reach, or signed under an older secret); pass a page's `next` as it "
          "came, with the same filters and key, or start again without a cursor")


class Cursors:
    """Seals and opens cursors under a key derived from the pseudonym secret."""

    def __init__(self, pseudonyms: Pseudonyms):
        self.pseudonyms = pseudonyms
        self._key: bytes | None = None
        self._from: bytes | None = None

    async def _mac_key(self) -> bytes:
        secret = await self.pseudonyms.key()
        if self._key is None or self._from != secret:
            self._key, self._from = hmac.new(secret, _DERIVATION, hashlib.sha256).digest(), secret
        return self._key

    async def seal(self, list_name: str, scope: Any, position: dict[str, Any]) -> str:
        """The cursor of ``position`` in ``list_name`` for a caller of ``scope``."""
        _check(position)
        payload = json.dumps({"k": _kind(list_name), **position}, separators=(",", ":"), sort_keys=True,
                             allow_nan=False, ensure_ascii=False).encode()
        mac = _mac(await self._mac_key(), list_name, scope, payload)
        return f"{_b64(payload)}.{_b64(mac)}"

    async def open(self, cursor: str, list_name: str, scope: Any) -> dict[str, Any]:
        """The position ``cursor`` names, if this API sealed it for ``list_name`` and ``scope``;
        InvalidInput (422) otherwise."""
        if len(cursor) > MAX_CURSOR_CHARS:
            raise InvalidInput(f"cursor: longer than {MAX_CURSOR_CHARS} characters; pass a page's `next` as it came")
        payload_text, dot, mac_text = cursor.partition(".")
        payload, mac = _unb64(payload_text), _unb64(mac_text)
        if not dot or payload is None or mac is None or len(mac) != _MAC_BYTES:
            raise InvalidInput("cursor: not a cursor of this API; pass a page's `next` as it came")
        if not hmac.compare_digest(mac, _mac(await self._mac_key(), list_name, scope, payload)):
            raise InvalidInput(_why_foreign(payload, list_name))
        body = _loads(payload)
        if not isinstance(body, dict) or body.pop("k", None) != _kind(list_name):
            raise InvalidInput(FORGED)  # sealed by this API yet not of this shape: never written so
        _check(body)
        return body


def position_field(position: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """The ``name`` of an opened cursor's position, if it is of ``kind`` (never a boolean for
    a number); InvalidInput (422) otherwise."""
    value = position.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidInput("cursor: damaged (a field is missing or of the wrong type); pass a page's `next` as it came")
    return value


def _kind(list_name: str) -> str:
    """The list's kind: its name up to the first '|' (the rest names the agent, filters)."""
    return list_name.split("|", 1)[0]


def _mac(key: bytes, list_name: str, scope: Any, payload: bytes) -> bytes:
    scope_text = json.dumps(scope, sort_keys=True, default=sorted, separators=(",", ":"))
    message = b"\x00".join((list_name.encode(), scope_text.encode(), payload))
    return hmac.new(key, message, hashlib.sha256).digest()


def _why_foreign(payload: bytes, list_name: str) -> str:
    """The message for a cursor whose MAC does not match: of another list, if it says so."""
    try:
        body = _loads(payload)
    except InvalidInput:
        return FORGED
    if isinstance(body, dict) and isinstance(body.get("k"), str) and body["k"] != _kind(list_name):
        return (f"cursor: not a cursor of this list ({_kind(list_name)}); pass the `next` of a page of it, "
                "or start again without a cursor")
    return FORGED


def _refuse_constant(name: str) -> Any:
    raise InvalidInput(f"cursor: holds {name}, not a number; pass a page's `next` as it came")


def _loads(payload: bytes) -> Any:
    try:
        return json.loads(payload.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InvalidInput("cursor: not a cursor of this API; pass a page's `next` as it came") from None


def _check(position: dict[str, Any]) -> None:
    """Flat: each value a finite number, an integer within 2^53, a string without control
    characters, a boolean, None, or a short list of those."""
    for name, value in position.items():
        values = value if isinstance(value, list) and len(value) <= 8 else [value]
        if not plain_text(name) or not all(_scalar(v) for v in values):
            raise InvalidInput("cursor: damaged (a value is not a finite number or plain text); pass a page's "
                               "`next` as it came")


def _scalar(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -_MAX_INT <= value <= _MAX_INT
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) and plain_text(value)


def plain_text(text: Any) -> bool:
    """Text of at most MAX_CURSOR_CHARS characters without control characters or lone surrogates."""
    return isinstance(text, str) and len(text) <= MAX_CURSOR_CHARS and \
        not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 or 0xd800 <= ord(c) < 0xe000 for c in text)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes | None:
    """The bytes of canonical unpadded base64url (the one spelling ``_b64`` writes), else None:
    a cursor with a character changed never decodes to the same bytes."""
    if not text or len(text) % 4 == 1:
        return None
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if _b64(raw) == text else None
