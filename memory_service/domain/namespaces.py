"""Namespaces and their reversible, collision-free mapping to Graphiti group_ids.

A namespace is one of ``session:<session_id>``, ``user:<agent_id>:<user_id>``,
``shard:<agent_id>:<shard_id>`` or ``agent:<agent_id>``.

Graphiti accepts ``[A-Za-z0-9_-]`` in a group_id, and on FalkorDB a hyphen breaks
full-text search inside the group, so group_ids use ``[A-Za-z0-9_]`` only:

* ASCII letters and digits stand for themselves;
* any other character becomes ``_<lowercase hex code point>_`` (``_`` is ``_5f_``);
* ``__`` (an escape with no digits, which no character produces) separates fields;
* the first field is the namespace kind.

``session:a_b`` -> ``session__a_5f_b``. Decoding is the exact inverse, so the mapping is
injective, and no group_id is ``''`` or ``'_'``.
"""

from __future__ import annotations

import functools
import inspect
import re
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum

from memory_service.domain.errors import InvalidInput, preview

MAX_ID_LENGTH = 256
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")  # kept as is in a group_id
_ESCAPE = re.compile(r"_([0-9a-f]*)_")


class NamespaceKind(StrEnum):
    SESSION = "session"
    USER = "user"
    SHARD = "shard"
    AGENT = "agent"


_FIELDS: dict[NamespaceKind, tuple[str, ...]] = {
    NamespaceKind.SESSION: ("session_id",),
    NamespaceKind.USER: ("agent_id", "user_id"),
    NamespaceKind.SHARD: ("agent_id", "shard_id"),
    NamespaceKind.AGENT: ("agent_id",),
}


# '/' and '\\' would split a path segment (clients turn '\\' into '/'), and clients drop the
# dot segments '.' and '..' from a URL (RFC 3986, 5.2.4): agent, session and shard ids are
# path segments, and one rule holds for every id.
_PATH_BREAKING = ("/", "\\")
_DOT_SEGMENTS = (".", "..")


# Characters an id may not hold though they are assigned and visible to no one: the
# invisible format characters (Unicode category Cf: zero-width space and joiners U+200B..U+200D,
# word joiner U+2060, the BOM U+FEFF, the bidirectional controls U+200E, U+200F, U+061C,
# U+202A..U+202E, U+2066..U+2069, soft hyphen...), which make two ids that look alike differ or
# one id look like another; and U+FFFD, what invalid UTF-8 in a URL decodes to.
_BANNED_CATEGORIES = {"Cc": "control", "Cs": "surrogate", "Cn": "unassigned", "Cf": "invisible format"}
_REPLACEMENT = "\ufffd"


def normalize_id(value: str) -> str:
    """An id in its one stored form: Unicode NFC, so that the composed and decomposed
    spellings of one name ('é' as U+00E9, or 'e' + U+0301) are one id."""
    return value if value.isascii() else unicodedata.normalize("NFC", value)


def id_rule(colon_allowed: bool = False) -> str:
    """The id rule in a sentence, for error messages."""
    banned = "'/' and '\\'" if colon_allowed else "':', '/' and '\\'"
    return (f"an id is 1 to {MAX_ID_LENGTH} characters (after Unicode NFC normalisation): any Unicode letters, "
            f"digits, punctuation, symbols and inner spaces, except {banned}, U+FFFD and control, surrogate, "
            "unassigned or invisible format characters (zero-width, bidirectional controls, BOM); not '.' or '..'; "
            "no white space at either end")


def validate_id(value: object, what: str = "id", colon_allowed: bool = False) -> str:
    """Return ``value`` if it is a usable identifier, else raise InvalidInput.

    Any Unicode is allowed except ':' (the namespace separator), '/' and '\\', control,
    surrogate, unassigned and invisible format characters, U+FFFD, leading or trailing white
    space, and the ids '.' and '..'; so every id works as a (percent-encoded) URL path
    segment, and two ids that look alike are alike. The id returned is NFC-normalised
    (normalize_id): callers that keep it store and look up one form.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}; {id_rule(colon_allowed)}")
    return _validated_id(value, what, colon_allowed)


# Remembered: every message checks its session's, agent's and user's ids several times over
# (its namespace is built and parsed on the way to the store), about 20 µs each; a batch of
# a session's messages checks the same few ids. Only accepted ids are kept (a refusal raises).
@functools.lru_cache(maxsize=16_384)
def _validated_id(value: str, what: str, colon_allowed: bool) -> str:
    if problem := _id_problem(value, colon_allowed):  # the form sent: lone surrogates cannot be normalised
        raise InvalidInput(f"{what} {problem}; {id_rule(colon_allowed)}")
    normalized = normalize_id(value)
    if normalized != value and (problem := _id_problem(normalized, colon_allowed)):
        raise InvalidInput(f"{what} {problem}; {id_rule(colon_allowed)}")
    return normalized


def _id_problem(value: str, colon_allowed: bool) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"is {len(value)} characters long; the limit is {MAX_ID_LENGTH}"
    shown = preview(value)
    if value != value.strip():
        return f"{shown} must not start or end with white space"
    if ":" in value and not colon_allowed:
        return f"{shown} must not contain ':' (it separates namespace fields)"
    if slash := next((c for c in _PATH_BREAKING if c in value), None):
        return f"{shown} must not contain '{slash}' (ids are URL path segments)"
    if value in _DOT_SEGMENTS:
        return f"must not be {value!r} (URLs drop it as a dot segment)"
    if value.isascii():
        bad = next((c for c in value if not c.isprintable()), None)  # ASCII's only non-printables are Cc
    else:
        bad = next((c for c in value if c == _REPLACEMENT or unicodedata.category(c) in _BANNED_CATEGORIES), None)
    if bad == _REPLACEMENT:
        return (f"{shown} contains U+FFFD, the replacement character (what invalid UTF-8 decodes to): "
                "send the id as valid UTF-8")
    if bad is not None:
        kind = _BANNED_CATEGORIES[unicodedata.category(bad)]
        return f"{shown} contains the {kind} character U+{ord(bad):04X}"
    return None


def validate_message_id(value: object, what: str = "message_id") -> str:
    """Message ids are never namespace fields, so ':' is allowed in them (LoCoMo's ``D3:7``)."""
    return validate_id(value, what, colon_allowed=True)


# The arguments a class that takes ids from its callers checks (checks_ids), by name.
ID_ARGUMENTS = ("agent_id", "user_id", "session_id", "shard_id", "record_id")


def checks_ids[T](cls: type[T]) -> type[T]:
    """Make every public coroutine method of ``cls`` check its id arguments (those named in
    ID_ARGUMENTS, when given and not None) with validate_id before it runs.

    For the class where ids enter in process (the MemoryService facade, which docs/getting-started.md
    documents for direct use): one rule, applied to every method the class has or gains, and
    the parts below it take the ids as checked. The HTTP API checks them in its own types
    (memory_service.domain.models.AgentId...) before it calls the facade.
    """
    for name, method in list(vars(cls).items()):
        if not name.startswith("_") and inspect.iscoroutinefunction(method):
            setattr(cls, name, _checking(method))
    return cls


def _checking[**P, R](method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    names = list(inspect.signature(method).parameters)
    checked = [(index, name) for index, name in enumerate(names) if name in ID_ARGUMENTS]
    if not checked:
        return method

    @functools.wraps(method)
    async def checking(*args: P.args, **kwargs: P.kwargs) -> R:
        for index, name in checked:
            value = args[index] if index < len(args) else kwargs.get(name)
            if value is not None:
                validate_id(value, name)
        return await method(*args, **kwargs)

    return checking


@functools.lru_cache(maxsize=16_384)  # a block names a few namespaces many times over
def _encode_field(value: str) -> str:
    return "".join(c if c in _PLAIN else f"_{ord(c):x}_" for c in value)


def _decode_group_id(group_id: str) -> list[str]:
    """Split and unescape a group_id into its fields, scanning left to right.

    A plain split on '__' would be wrong: ``_5f_`` followed by the separator reads ``_5f___``.
    """
    fields: list[str] = [""]
    pos = 0
    while pos < len(group_id):
        char = group_id[pos]
        if char in _PLAIN:
            fields[-1] += char
            pos += 1
            continue
        match = _ESCAPE.match(group_id, pos)
        if not match:
            raise InvalidInput(f"group_id {group_id!r} is not one this service produced")
        digits = match.group(1)
        if not digits:
            fields.append("")
        elif digits.startswith("0") or int(digits, 16) > 0x10FFFF:
            raise InvalidInput(f"group_id {group_id!r} has a malformed escape _{digits}_")
        else:
            fields[-1] += chr(int(digits, 16))
        pos = match.end()
    return fields


@dataclass(frozen=True, slots=True)
class Namespace:
    kind: NamespaceKind
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        names = _FIELDS[self.kind]
        if len(self.fields) != len(names):
            raise InvalidInput(f"a {self.kind} namespace has {len(names)} field(s): {', '.join(names)}")
        for name, value in zip(names, self.fields):
            validate_id(value, name)

    # Constructors, one per kind, so call sites read as the spec does.
    @classmethod
    def session(cls, session_id: str) -> Namespace:
        return cls(NamespaceKind.SESSION, (session_id,))

    @classmethod
    def user(cls, agent_id: str, user_id: str) -> Namespace:
        return cls(NamespaceKind.USER, (agent_id, user_id))

    @classmethod
    def shard(cls, agent_id: str, shard_id: str) -> Namespace:
        return cls(NamespaceKind.SHARD, (agent_id, shard_id))

    @classmethod
    def agent(cls, agent_id: str) -> Namespace:
        return cls(NamespaceKind.AGENT, (agent_id,))

    @classmethod
    def parse(cls, text: object) -> Namespace:
        if not isinstance(text, str):
            raise InvalidInput(f"a namespace must be a string, got {type(text).__name__}")
        kind_text, sep, rest = text.partition(":")
        if not sep:
            raise InvalidInput(f"namespace {preview(text)} has no ':'; expected e.g. 'session:<session_id>'")
        try:
            kind = NamespaceKind(kind_text)
        except ValueError:
            kinds = ", ".join(k.value for k in NamespaceKind)
            raise InvalidInput(f"namespace {preview(text)} has unknown kind {preview(kind_text)}; expected one of {kinds}") from None
        return cls(kind, tuple(rest.split(":")))

    def __str__(self) -> str:
        return ":".join((self.kind.value, *self.fields))

    @property
    def group_id(self) -> str:
        return "__".join((self.kind.value, *(_encode_field(f) for f in self.fields)))

    @classmethod
    def from_group_id(cls, group_id: str) -> Namespace:
        if not isinstance(group_id, str):
            raise InvalidInput(f"a group_id must be a string, got {type(group_id).__name__}")
        kind_text, *fields = _decode_group_id(group_id)
        try:
            kind = NamespaceKind(kind_text)
        except ValueError:
            raise InvalidInput(f"group_id {group_id!r} is not one this service produced") from None
        return cls(kind, tuple(fields))
