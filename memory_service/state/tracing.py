"""OpenTelemetry traces, off by default (OTEL_TRACES): spans for each request, the service
operation, each store call, each LLM and embedding call, and the worker's job.

The service speaks only to the OpenTelemetry API (a dependency of the server extra), whose
tracer is a no-op until a provider is installed: with OTEL_TRACES=off nothing is recorded
or sent, and a span costs a few attribute look-ups. ``configure`` installs the SDK's
provider (the ``otel`` extra) with an OTLP/HTTP exporter (OTEL_EXPORTER_OTLP_ENDPOINT and
the other standard OTEL_* variables) or a console one; tests install their own
in-memory exporter with ``install``.

Store calls are spanned by opentelemetry-instrumentation-redis (the ``otel`` extra), which
wraps redis-py's commands and pipelines: the state store's Redis calls, arq's, and the graph
store's, since the falkordb client sends its queries through redis-py (``GRAPH.QUERY``,
``GRAPH.RO_QUERY``: marked ``db.system.name=falkordb``). Why it keeps no user's words: it
writes a command's name and a ``?`` per argument (``GRAPH.QUERY ? ? ?``; sanitising is not
optional in its releases since 2023), never the keys, the query text or its parameters, and
the connection's host, port and database index. Clients must be made after ``install``
(falkordb binds redis-py's method when its client is built). A Redis call outside any span
(arq's queue polling, the gauges' refresh) is not recorded: a root span of kind CLIENT is
dropped by the sampler, so an idle worker sends nothing.

A request continues into the worker: when a request enqueues a job, ``remember_job``
stores its trace context (W3C ``traceparent``) under the job's id in Redis for a day, and
the job's span (``job_span``) takes it as its parent. A job enqueued by several requests
(formation job ids are per window) continues the first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY
from opentelemetry.propagate import extract, inject

from memory_service.state import keyspace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.sampling import Sampler

    from memory_service.config import Settings

log = logging.getLogger(__name__)

TRACER_NAME = "memory_service"
JOB_CONTEXT_TTL_SECONDS = 86_400
_configured = False


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def configure(settings: Settings) -> None:
    """Install the exporter OTEL_TRACES names (once per process); off: nothing."""
    global _configured
    if settings.otel_traces == "off" or _configured:
        return
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        log.error("OTEL_TRACES=%s but the OpenTelemetry SDK is not installed: "
                  "pip install 'memory-service[server,otel]'; tracing stays off", settings.otel_traces)
        return
    if settings.otel_traces == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: SpanProcessor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(ConsoleSpanExporter())
    install(processor, settings.otel_service_name)
    log.info("traces: %s", settings.otel_traces)


def install(processor: SpanProcessor, service_name: str = "memory-service") -> None:
    """Make ``processor`` receive every span of this process (a tracer provider of the SDK)."""
    global _configured
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):  # one provider per process: add to it
        current.add_span_processor(processor)
    else:
        provider = TracerProvider(resource=Resource.create({"service.name": service_name}), sampler=_sampler())
        provider.add_span_processor(processor)
        trace.set_tracer_provider(provider)
    instrument_store_clients()
    _configured = True


def _sampler() -> Sampler:
    """The SDK's sampler (OTEL_TRACES_SAMPLER, parent-based always-on by default), except that a
    store call with no parent span (a worker polling its queue) is dropped."""
    from opentelemetry.sdk.trace import sampling

    inner = sampling._get_from_env_or_default()

    class NoLoneClientSpans(sampling.Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, kind: Any = None,
                          attributes: Any = None, links: Any = None, trace_state: Any = None) -> sampling.SamplingResult:
            parent = trace.get_current_span(parent_context).get_span_context()
            if kind == trace.SpanKind.CLIENT and not parent.is_valid:
                return sampling.SamplingResult(sampling.Decision.DROP)
            return inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

        def get_description(self) -> str:
            return f"NoLoneClientSpans{{{inner.get_description()}}}"

    return NoLoneClientSpans()


def instrument_store_clients() -> None:
    """Span every redis-py command (the state store, the queue, FalkorDB) with no argument
    recorded; a graph query is marked as FalkorDB's. Once per process; without the
    instrumentation package, store calls go unspanned (said once in the log)."""
    try:
        from opentelemetry.instrumentation.redis import RedisInstrumentor
    except ImportError:
        log.error("opentelemetry-instrumentation-redis is not installed (the `otel` extra): store calls are not "
                  "spanned")
        return
    instrumentor = RedisInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(request_hook=_store_call)


def _store_call(span: trace.Span, instance: Any, args: Any, kwargs: Any) -> None:
    if span.is_recording() and args and str(args[0]).upper().startswith("GRAPH."):
        span.set_attribute("db.system.name", "falkordb")


@contextmanager
def unspanned() -> Iterator[None]:
    """Store calls inside the block make no span (many small calls that one span of the
    caller's describes better)."""
    token = otel_context.attach(otel_context.set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A span named ``name``, child of the current one; an exception marks it as an error."""
    with tracer().start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None}) as s:
        yield s


def _job_key(job_id: str) -> str:
    return keyspace.trace_job(job_id)


async def remember_job(redis: Any, job_id: str) -> None:
    """Keep the current trace context for the job ``job_id`` (nothing without a recording span)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return
    carrier: dict[str, str] = {}
    inject(carrier)
    if "traceparent" in carrier:
        await redis.set(_job_key(job_id), carrier["traceparent"], ex=JOB_CONTEXT_TTL_SECONDS, nx=True)


@contextmanager
def job_span(name: str, traceparent: str | None, **attributes: Any) -> Iterator[trace.Span]:
    """The worker's span for a job, continuing the trace of the request that enqueued it."""
    parent = extract({"traceparent": traceparent}) if traceparent else otel_context.Context()
    token = otel_context.attach(parent)
    try:
        with span(name, **attributes) as s:
            yield s
    finally:
        otel_context.detach(token)


async def job_traceparent(redis: Any, job_id: str | None) -> str | None:
    """The trace context ``remember_job`` kept for ``job_id``; None when tracing is off or none was kept."""
    if job_id is None or not _configured:
        return None
    value = await redis.get(_job_key(job_id))
    if isinstance(value, bytes):
        value = value.decode()
    return value if isinstance(value, str) else None


def current_trace_id() -> str | None:
    """The current span's trace id (hex), for log lines; None outside a recorded span."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None
