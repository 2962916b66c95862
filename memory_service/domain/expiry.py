"""Expiry (docs/expiry.md): the times to live an agent sets per memory kind and per shard,
and the ``expires_at`` they give a memory stored without its own.

Why here, apart from the stores: the stores only compare ``expires_at`` with the clock (an
expired memory leaves every read at once) and the retention job purges it; which memory
gets which time is a rule of the agent's settings, applied where memories are made (the
formation's extraction, memory_service/formation/steps.py, and memory_write,
memory_service/curation/tools.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator

from memory_service.domain.namespaces import Namespace, NamespaceKind

# The longest time to live or expiry horizon the service takes at all (MEMORY_EXPIRY_MAX_DAYS
# may hold writes to less).
EXPIRY_CEILING_DAYS = 36_500
# The kinds a time to live applies to: those formation and memory_write make (recorded
# messages and consolidated memories take none, docs/expiry.md).
TTL_KINDS = ("episode", "directive", "fact", "suggestion", "observation")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")


def ttl_seconds(value: object) -> int:
    """A time to live as seconds: a whole number of seconds, or a text such as ``"90d"``,
    ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"``; at least one second, at most the ceiling."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"a time to live is seconds (an integer) or a text like '90d', '12h', not {value!r}")
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"time to live {value!r}: a number and a unit (s, m, h, d or w), like '90d' or '12h'")
        value = int(match[1]) * _UNITS[match[2]]
    if not 1 <= value <= EXPIRY_CEILING_DAYS * 86_400:
        raise ValueError(f"time to live {value} s: from 1 second to {EXPIRY_CEILING_DAYS} days")
    return value


# A time to live as the settings take it (seconds or '90d') and store it (seconds).
Ttl = Annotated[int, BeforeValidator(ttl_seconds)]


@dataclass(frozen=True, slots=True)
class ExpiryPolicy:
    """An agent's times to live, in seconds: by memory kind (its settings' ``memory_ttl``)
    and by shard (each shard's ``memory_ttl``). A memory both reach takes the sooner expiry."""

    kinds: Mapping[str, int] = field(default_factory=dict)
    shards: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, kinds: Mapping[str, int], shards: Iterable[tuple[str, int | None]]) -> ExpiryPolicy:
        return cls({str(k): v for k, v in kinds.items()}, {s: ttl for s, ttl in shards if ttl})

    def ttl(self, kind: str, namespace: str) -> int | None:
        """The time to live of a memory of ``kind`` in ``namespace`` (None: none applies)."""
        found = [self.kinds[kind]] if kind in self.kinds else []
        if self.shards and namespace.startswith("shard:"):
            ns = Namespace.parse(namespace)
            if ns.kind is NamespaceKind.SHARD and (shard := self.shards.get(ns.fields[1])):
                found.append(shard)
        return min(found) if found else None

    def expires_at(self, kind: str, namespace: str, stored_at: datetime) -> datetime | None:
        ttl = self.ttl(kind, namespace)
        return stored_at + timedelta(seconds=ttl) if ttl else None


def sources_end(expiries: Iterable[datetime | None]) -> datetime | None:
    """When a knowledge-graph fact's source memories have all expired (their latest
    ``expires_at``): from then on reads hold the fact closed, as the next purge closes it.
    None when one of them never expires, or there are none."""
    ends = list(expiries)
    if not ends or any(end is None for end in ends):
        return None
    return max(end for end in ends if end is not None)
