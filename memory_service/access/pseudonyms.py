"""User ids as keyed digests: how the audit log, the service's own log lines and the key
records of an erased user name a user (docs/erasure.md, "Pseudonyms").

A digest is HMAC-SHA256 of ``<agent>\\0<user>`` under a server secret, written
``hmac-sha256-<64 hex>`` (a valid id: no ':'). Keyed, so that whoever reads the audit log
or the logs cannot confirm a guessed id by hashing it: only the service can compute a
digest (``GET /v1/audit?agent_id=..&user_id=..`` does it for an admin). The secret is
USER_DIGEST_KEY when set (kept out of the store: a copy of Redis then cannot confirm
guesses either), else 256 random bits made once and kept in Redis (``keyspace.USER_DIGEST_KEY``),
shared by every replica. Changing it makes the digests written before unfindable by id.

Log lines are written synchronously, so the process keeps the last key it loaded
(``loaded_key``); a line written before any service loaded one names no user at all.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
from typing import Any

from redis.asyncio import Redis

from memory_service.domain.namespaces import MAX_ID_LENGTH, Namespace, NamespaceKind
from memory_service.state import keyspace

DIGEST_PREFIX = "hmac-sha256-"
UNNAMED = "<user>"  # in a log line written before the key was loaded

_loaded: dict[str, bytes] = {}  # "key": the process's last loaded key (log lines are synchronous)


def user_digest(key: bytes, agent_id: str, user_id: str) -> str:
    mac = hmac.new(key, f"{agent_id}\x00{user_id}".encode(), hashlib.sha256)
    return DIGEST_PREFIX + mac.hexdigest()


class Pseudonyms:
    """Digests under the service's key; ``redis`` may decode responses or not."""

    def __init__(self, redis: Redis, configured_key: str | None = None):
        self.redis = redis
        self._key = configured_key.encode() if configured_key else None

    async def key(self) -> bytes:
        if self._key is None:
            await self.redis.set(keyspace.USER_DIGEST_KEY, secrets.token_hex(32), nx=True)
            stored = await self.redis.get(keyspace.USER_DIGEST_KEY)
            if stored is None:
                raise RuntimeError(f"{keyspace.USER_DIGEST_KEY} vanished as it was written")
            self._key = stored.encode() if isinstance(stored, str) else bytes(stored)
        _loaded["key"] = self._key
        return self._key

    async def user(self, agent_id: str, user_id: str) -> str:
        return user_digest(await self.key(), agent_id, user_id)

    async def scrub(self, agent_id: str | None, value: Any) -> Any:
        """``value`` (an audit entry's before/after) with user ids as digests: the values of
        ``user_id``, ``users`` and ``user_ids``, user namespaces ``user:<agent>:<user>``
        anywhere, and the users of a key in its ``name``. Ids are digested under
        ``agent_id``, the agent whose log the entry goes to."""
        key = await self.key()
        return _scrub(key, agent_id, value)


_USER_FIELDS = ("user_id", "users", "user_ids")


def _scrub(key: bytes, agent_id: str | None, value: Any) -> Any:
    if isinstance(value, str):
        return _namespace(key, value)
    if isinstance(value, list):
        return [_scrub(key, agent_id, v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _scrub(key, agent_id, v) for k, v in value.items()}
    if agent_id is None:
        return out
    for field in _USER_FIELDS:
        held = value.get(field)
        if isinstance(held, str):
            out[field] = user_digest(key, agent_id, held)
        elif isinstance(held, list):
            out[field] = [user_digest(key, agent_id, u) if isinstance(u, str) else u for u in held]
    users, name = value.get("users"), value.get("name")
    if isinstance(users, list) and isinstance(name, str):  # a key's record: "eve's phone"
        out["name"] = name_without(name, [u for u in users if isinstance(u, str)])
    return out


def name_without(name: str, user_ids: list[str], placeholder: str = "[user]") -> str:
    """A free-text name with each of these user ids replaced (longest first)."""
    for user_id in sorted(user_ids, key=len, reverse=True):
        name = name.replace(user_id, placeholder)
    return name


def _namespace(key: bytes, text: str) -> str:
    if not text.startswith("user:") or len(text) > 2 * MAX_ID_LENGTH + 6:
        return text
    try:
        namespace = Namespace.parse(text)
    except Exception:  # not a namespace: kept as it is
        return text
    if namespace.kind is not NamespaceKind.USER:
        return text
    agent_id, user_id = namespace.fields
    return f"user:{agent_id}:{user_digest(key, agent_id, user_id)}"


# Log lines --------------------------------------------------------------------------


def for_log(agent_id: str, user_id: str | None) -> str:
    """How a log line names a user: the digest under the loaded key, else no name at all."""
    key = _loaded.get("key")
    if user_id is None:
        return "-"
    return user_digest(key, agent_id, user_id) if key else UNNAMED


def namespace_for_log(namespace: object) -> str:
    """A namespace for a log line: a user namespace with its user as a digest."""
    text = str(namespace)
    if not text.startswith("user:"):
        return text
    key = _loaded.get("key")
    if key is None:
        return f"user:{text.split(':')[1]}:{UNNAMED}" if text.count(":") >= 2 else text
    return _namespace(key, text)


# User namespaces as written (``user:<agent>:<user>``, the user ending at a quote, white
# space, ',' or ')') and as group ids (``user__<agent>__<user>``, exactly delimited).
_PLAIN_NAMESPACE = re.compile(r"user:([^:'\"\s,()/\\]+):([^:'\"\s,()/\\]+)")
_GROUP_ID = re.compile(r"\buser__((?:[A-Za-z0-9]|_[0-9a-f]+_)+)__((?:[A-Za-z0-9]|_[0-9a-f]+_)+)")


def scrub_text(text: str) -> str:
    """A log message with the user namespaces and user group ids it quotes as digests."""
    def plain(match: re.Match[str]) -> str:
        return namespace_for_log(f"user:{match.group(1)}:{match.group(2)}")

    def grouped(match: re.Match[str]) -> str:
        try:
            namespace = Namespace.from_group_id(match.group(0))
        except Exception:  # not one of ours
            return match.group(0)
        agent_id, user_id = namespace.fields
        return f"user__{match.group(1)}__{for_log(agent_id, user_id)}"

    return _GROUP_ID.sub(grouped, _PLAIN_NAMESPACE.sub(plain, text))


class UserIdsOutOfLogs(logging.Filter):
    """For loggers the service does not write itself (arq's job lines quote job ids and
    arguments, which hold user namespaces): the message with those as digests."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = scrub_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


def install_log_filter(*logger_names: str) -> None:
    """Add the filter to these loggers, once each."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserIdsOutOfLogs) for f in logger.filters):
            logger.addFilter(UserIdsOutOfLogs())
