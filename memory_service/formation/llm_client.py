"""One structured-output call to an OpenAI-compatible chat endpoint, with the retry policy
that extraction and consolidation share.

Failure policy:
- a reply that ``parse`` rejects (raising ``Malformed``), a connection error or timeout,
  and HTTP 408, 429 or 5xx are retried with exponential backoff;
- any other HTTP error, or running out of attempts, raises ``LLMCallFailed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import openai

from memory_service.formation.extractor import ExtractionUsage
from memory_service.state import metrics, tracing

log = logging.getLogger(__name__)

try:  # the HTTP library openai is built on: httpx2 from openai 3.x, httpx before
    from httpx2 import Timeout as _TIMEOUT
except ImportError:  # pragma: no cover - openai 2.x
    from httpx import Timeout as _TIMEOUT  # type: ignore[assignment]

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 429})  # and every 5xx

# Some endpoints ignore response_format and the model wraps its JSON in a Markdown fence.
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


class Malformed(Exception):
    """The reply as a whole is unusable: worth another attempt."""


class LLMCallFailed(RuntimeError):
    """Every attempt failed, or one failed in a way every attempt would."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class _Retry(Exception):
    """This attempt failed in a way another attempt may not."""


def reply_json(text: str) -> Any:
    """The JSON value of a reply (a Markdown fence around it tolerated), or Malformed."""
    if fenced := _FENCE.match(text):
        text = fenced.group(1)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Malformed(f"not JSON ({exc})") from None


class StructuredChat:
    """A chat endpoint asked for JSON that follows a schema, retried until it answers usably."""

    def __init__(
        self,
        *,
        base_url: str | None,
        model: str | None,
        api_key: str | None = None,
        timeout_seconds: float = 60.0,
        connect_timeout_seconds: float = 5.0,
        max_attempts: int = 3,
        temperature: float = 0.0,
        backoff_seconds: float = 0.5,
    ) -> None:
        # An empty base_url would make the SDK fall back to OPENAI_BASE_URL or api.openai.com:
        # conversations must go nowhere but to the endpoint configured here.
        if not base_url:
            raise ValueError("an LLM client needs a base_url")
        if not model:
            raise ValueError("an LLM client needs a model name")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.model = model
        self.max_attempts = max_attempts
        self.temperature = temperature
        self.backoff_seconds = backoff_seconds
        # max_retries=0: the SDK's own retries would be invisible to the attempt count, the
        # usage and the tests; the loop in complete() is the only one. Local servers (vLLM,
        # Ollama, llama.cpp) need no key, but the SDK refuses to start without one and would
        # otherwise read OPENAI_API_KEY from the environment: pass a placeholder.
        # A connect timeout of its own: an unreachable endpoint fails fast, a slow model may
        # take the whole read timeout.
        # openai 3.x is built on httpx2, and 3.63 hands the timeout to its httpx2 client
        # unconverted (an httpx.Timeout there is a TypeError): give it its own library's.
        timeout = _TIMEOUT(timeout_seconds, connect=min(connect_timeout_seconds, timeout_seconds))
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "unused",
                                          timeout=timeout, max_retries=0)

    async def aclose(self) -> None:
        await self._client.close()

    async def complete(
        self,
        *,
        system: str,
        user: str,
        schema_name: str,
        schema: dict[str, Any],
        parse: Callable[[str], T],
        usage: ExtractionUsage,
        what: str,
    ) -> T:
        """``parse`` of the first usable reply; ``usage`` counts every attempt and call."""
        request = {
            "model": self.model,
            "temperature": self.temperature,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "response_format": {"type": "json_schema", "json_schema": {"name": schema_name, "strict": True, "schema": schema}},
        }
        problem = ""
        for attempt in range(1, self.max_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(self.backoff_seconds * 2 ** (attempt - 2))
            usage.attempts = attempt
            try:
                return await self._attempt(request, parse, usage)
            except _Retry as exc:
                problem = str(exc)
                log.warning("%s: attempt %d of %d: %s", what, attempt, self.max_attempts, problem)
        raise LLMCallFailed(problem)

    async def _attempt(self, request: dict[str, Any], parse: Callable[[str], T], usage: ExtractionUsage) -> T:
        """One request and its reply; every failure becomes _Retry or LLMCallFailed."""
        started = time.perf_counter()  # memory_service_llm_request_duration_seconds, and a span
        try:
            with tracing.span("memory_service.llm", model=self.model):
                completion = await self._client.chat.completions.create(**request)
        except openai.APIStatusError as exc:
            problem = f"HTTP {exc.status_code}: {exc.message}"
            if exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500:
                raise _Retry(problem) from exc
            raise LLMCallFailed(problem + " (not retryable)") from exc
        except openai.APIConnectionError as exc:  # includes timeouts
            raise _Retry(f"{type(exc).__name__}: {exc}") from exc
        except (openai.APIResponseValidationError, json.JSONDecodeError) as exc:
            # HTTP 200 whose body is declared JSON but is not: the SDK raises the bare decode error.
            raise _Retry(f"unusable response body: {exc}") from exc
        finally:
            metrics.LLM_REQUESTS.observe(time.perf_counter() - started)
        usage.calls += 1
        prompt_tokens, completion_tokens = _tokens(completion)
        usage.prompt_tokens += prompt_tokens
        usage.completion_tokens += completion_tokens
        try:
            return parse(_reply_text(completion))
        except Malformed as exc:
            raise _Retry(f"malformed reply: {exc}") from exc


# The SDK does not validate responses (and must not: local servers omit fields it declares
# required), so a completion may be a bare str or list, and any field may have any type.


def _tokens(completion: Any) -> tuple[int, int]:
    usage = getattr(completion, "usage", None)
    counts = (getattr(usage, "prompt_tokens", 0), getattr(usage, "completion_tokens", 0))
    return tuple(n if isinstance(n, int) else 0 for n in counts)  # type: ignore[return-value]


def _reply_text(completion: Any) -> str:
    if not hasattr(completion, "choices"):
        raise Malformed(f"the response is a {type(completion).__name__}, not a chat completion")
    choices = completion.choices
    message = getattr(choices[0], "message", None) if isinstance(choices, list) and choices else None
    content = getattr(message, "content", None)
    if not isinstance(content, str):
        refusal = getattr(message, "refusal", None)
        # Not the refusal's words: they may quote the conversation, and this text reaches the log.
        raise Malformed(f"the model refused ({len(str(refusal))} characters)" if refusal
                        else "no message content in the completion")
    return content
