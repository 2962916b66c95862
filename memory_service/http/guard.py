"""What the API refuses before a route runs, and the shape of its 4xx answers (docs/limits.md).

* A request body larger than MAX_REQUEST_BYTES (MAX_BATCH_BYTES for a batch of messages) answers 413: at once when its Content-Length
  says so (the route never runs), else as soon as the bytes read pass the limit. It is
  never buffered whole, and never parsed.
* A JSON body must be plain JSON: UTF-8, no NaN or Infinity, no lone surrogates, no U+0000
  (the graph store cannot hold it), at most MAX_JSON_DEPTH levels deep. Else 422, naming
  where in the body the problem is. A key given twice in one object answers 400 (the last
  would silently win: ``{"role": "read", "role": "admin"}``); a Content-Type naming a
  charset other than UTF-8, 415 (it would be read as UTF-8 all the same).
* Query parameters and path segments must be valid UTF-8 once percent-decoded (else they
  decode to U+FFFD unnoticed) and hold no U+0000: else 422 naming the parameter.
* Every route takes these rules: the app's own, and those of the routers made with
  ``strict_router`` (a plain APIRouter's routes keep FastAPI's lax parsing when included).
* A 422 answer quotes at most PREVIEW_CHARS characters of any bad input, and at most
  MAX_PROBLEMS_SHOWN problems.
"""

from __future__ import annotations

import email.message
import email.utils
import json
import re
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import HTTPException
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memory_service.domain.errors import PREVIEW_CHARS, preview
from memory_service.domain.limits import MAX_JSON_DEPTH, DuplicateKey, Location, json_problem, text_problem, unique_keys

MAX_PROBLEMS_SHOWN = 10
MAX_MESSAGE_CHARS_SHOWN = 1000  # of one problem's message (ours quote inputs through preview())


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, setting: str = "MAX_REQUEST_BYTES"):
        super().__init__(413, f"the request body is larger than {limit} bytes ({setting})")


class UnusableJSON(HTTPException):
    """A body that is not plain JSON. An HTTPException, so FastAPI passes it on from the
    body's parsing (any other error there becomes a bare 400) to its handler here."""

    def __init__(self, loc: Location, reason: str):
        super().__init__(422, reason)
        self.errors = [{"loc": loc, "msg": reason, "type": "json_unusable"}]


class UnusableParameter(UnusableJSON):
    """A query parameter or path segment the stores cannot take (``loc`` names it)."""

    def __init__(self, loc: Location, reason: str):
        super().__init__(loc, reason)
        self.errors[0]["type"] = "parameter_unusable"


class DuplicateKeyRefused(HTTPException):
    def __init__(self, exc: DuplicateKey):
        super().__init__(400, f"the body is not usable JSON: {exc}")


class UnsupportedCharset(HTTPException):
    def __init__(self, charset: str):
        super().__init__(415, f"the body's charset is {preview(charset, 40)}; JSON bodies must be UTF-8 "
                              "(send 'application/json' or 'application/json; charset=utf-8')")


UTF8_NAMES = frozenset({"utf-8", "utf8"})


def check_charset(content_type: str | None) -> None:
    """UnsupportedCharset unless ``content_type`` names no charset, or UTF-8."""
    if not content_type or "charset" not in content_type.lower():
        return
    parsed = email.message.Message()
    parsed["content-type"] = content_type
    charset = parsed.get_param("charset")
    if charset is None:
        return
    name = email.utils.collapse_rfc2231_value(charset) if isinstance(charset, tuple) else str(charset)
    if name.strip().lower() not in UTF8_NAMES:
        raise UnsupportedCharset(name)


def _query_pairs(query: bytes) -> list[tuple[bytes, bytes]]:
    """The query string's names and values as bytes, percent-decoded ('+' is a space), as
    Starlette splits it (urllib's parse_qsl decodes bytes as ASCII first)."""
    pairs = []
    for field in query.split(b"&"):
        if field:
            name, _, value = field.partition(b"=")
            pairs.append((unquote_to_bytes(name.replace(b"+", b" ")), unquote_to_bytes(value.replace(b"+", b" "))))
    return pairs


def check_url(scope: Scope) -> None:
    """UnusableParameter for the first query parameter or path parameter that is not valid
    UTF-8 once percent-decoded, or holds text the stores cannot take (text_problem)."""
    for raw_name, raw_value in _query_pairs(scope.get("query_string", b"")):
        name = raw_name.decode("utf-8", "replace")
        for part in (raw_name, raw_value):
            try:
                text = part.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UnusableParameter(("query", name), f"is not UTF-8 once percent-decoded: byte {exc.start} "
                                                         f"({part[exc.start]:#04x}) is {exc.reason}") from None
            if problem := text_problem(text):
                raise UnusableParameter(("query", name), problem)
    params: dict[str, Any] = scope.get("path_params", {})
    try:
        unquote_to_bytes(scope.get("raw_path") or b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        name = next((k for k, v in params.items() if isinstance(v, str) and "\ufffd" in v), "")
        raise UnusableParameter(("path", name) if name else ("path",),
                                f"is not UTF-8 once percent-decoded: {exc.reason}") from None
    for name, value in params.items():
        if isinstance(value, str) and (problem := text_problem(value)):
            raise UnusableParameter(("path", name), problem)


class LargerBodies(NamedTuple):
    """Paths (a full match) whose bodies may be larger than MAX_REQUEST_BYTES: up to
    ``max_bytes``, the ``setting`` named in the 413."""

    path: re.Pattern[str]
    max_bytes: int
    setting: str


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` (or a ``larger`` limit of their path)
    answer 413, counted as they stream in."""

    def __init__(self, app: ASGIApp, max_bytes: int, larger: Sequence[LargerBodies] = ()):
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger

    def _limit(self, path: str) -> tuple[int, str]:
        for rule in self.larger:
            if rule.path.fullmatch(path):
                return rule.max_bytes, rule.setting
        return self.max_bytes, "MAX_REQUEST_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes, setting = self._limit(scope.get("path", ""))
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > max_bytes):
            answer = JSONResponse({"detail": BodyTooLarge(max_bytes, setting).detail}, status_code=413)
            await answer(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(max_bytes, setting)  # the route's handler answers it
            return message

        await self.app(scope, counted, send)


def parse_json(body: bytes) -> Any:
    """``body`` as JSON if it is plain JSON, else UnusableJSON saying where and why."""
    value = parse_json_values(body)
    if problem := json_problem(value, ("body",)):
        raise UnusableJSON(*problem)
    return value


def parse_json_values(body: bytes) -> Any:
    """``body`` as JSON (UTF-8, unique keys, parsable), its values not yet checked with
    ``json_problem``: for a route that checks the parts of its body one by one (a batch,
    whose bad items are refused alone)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnusableJSON(("body",), f"the body is not UTF-8: byte {exc.start} ({body[exc.start]:#04x}) is "
                                      f"{exc.reason}") from None
    try:
        value = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        raise DuplicateKeyRefused(exc) from None
    except json.JSONDecodeError as exc:
        raise UnusableJSON(("body",), f"the body is not JSON: {exc.msg} at character {exc.pos}") from None
    except RecursionError:
        raise UnusableJSON(("body",), f"nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise UnusableJSON(("body",), f"the body is not usable JSON: {preview(str(exc), 200)}") from None
    return value


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            check_charset(self.headers.get("content-type"))
            self._json = parse_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """A route whose JSON body goes through parse_json (FastAPI's documented way to
    customise the request: https://fastapi.tiangolo.com/how-to/custom-request-and-route/)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            check_url(request.scope)
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def strict_router(**options: Any) -> APIRouter:
    """An APIRouter whose routes take the rules above. Included in the app, a router's
    routes keep their own route class: one made with a plain APIRouter() parses bodies as
    FastAPI does (duplicate keys, NaN, U+0000 and all)."""
    return APIRouter(route_class=StrictJSONRoute, **options)


def _clip(text: str, limit: int = PREVIEW_CHARS) -> str:
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates escaped


def invalid_input_answer(errors: Sequence[Mapping[str, Any]]) -> JSONResponse:
    """The 422 answer: a sentence per problem in ``detail`` and each problem in ``errors``,
    quoting only short prefixes of what the caller sent."""
    shown = []
    for error in errors[:MAX_PROBLEMS_SHOWN]:
        item = {
            "loc": [part if isinstance(part, int) else _clip(str(part)) for part in error.get("loc", ())],
            "msg": _clip(str(error.get("msg", "")), MAX_MESSAGE_CHARS_SHOWN),
            "type": _clip(str(error.get("type", ""))),
        }
        if "input" in error:
            item["input"] = preview(error["input"])
        shown.append(item)
    problems = [f"{'.'.join(str(p) for p in item['loc'] if p != 'body') or 'body'}: {item['msg']}" for item in shown]
    if len(errors) > MAX_PROBLEMS_SHOWN:
        problems.append(f"and {len(errors) - MAX_PROBLEMS_SHOWN} more problem(s)")
    return JSONResponse(status_code=422, content={"detail": "; ".join(problems), "errors": shown})


def install(app: FastAPI, max_request_bytes: int, larger: Sequence[LargerBodies] = ()) -> None:
    """Guard ``app``; call before its routes are added (they take the strict JSON route class)."""
    app.router.route_class = StrictJSONRoute
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes, larger=larger)

    @app.exception_handler(UnusableJSON)
    async def _unusable_json(request: Request, exc: UnusableJSON) -> JSONResponse:
        return invalid_input_answer(exc.errors)
