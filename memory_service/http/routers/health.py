"""Operations: the metrics (Prometheus text), liveness and readiness.

Liveness and readiness answer without a key (a load balancer probes them); what a
dependency's state says in detail, and the metrics, span every agent: operator keys only.
Where the stores listen is never shown.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST

from memory_service.access.authorization import require_operator
from memory_service.config import redact_addresses
from memory_service.http.deps import CallerDep, ServiceDep, caller
from memory_service.http.guard import strict_router
from memory_service.state import metrics

router = strict_router(tags=["ops"])


@router.get("/metrics", response_class=PlainTextResponse)
async def get_metrics(service: ServiceDep, principal: CallerDep) -> PlainTextResponse:
    """This process's metrics in the Prometheus text format (latency histograms, counters with
    labels) and the stores' gauges (outbox, job queue, deployment totals); docs/deploy.md
    lists them. Needs an operator key; METRICS_PORT serves the same without one."""
    require_operator(principal)
    await refresh_store_gauges(service)
    return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def refresh_store_gauges(service: Any) -> None:
    """Read the gauges that are facts about the whole deployment from the stores, for the next scrape."""
    values = await service.gauges()
    try:
        totals = await service.counters()
    except Exception:
        totals = {}
    metrics.STORE_GAUGES.update(values, totals)


@router.get("/health/live")
async def check_liveness() -> dict[str, Any]:
    """Liveness: the process answers HTTP. Checks no dependency (GET /health does)."""
    return {"ok": True}


@router.get("/health")
async def check_health(request: Request, service: ServiceDep) -> JSONResponse:
    """Readiness: `{"ok": ...}`, 503 when a dependency is down. With an operator key, each
    dependency's state too (`?detail=true`); where the stores listen is never shown."""
    report = await service.health()
    status = 200 if report["ok"] else 503
    if request.query_params.get("detail") not in ("1", "true"):
        return JSONResponse(status_code=status, content={"ok": report["ok"]})
    require_operator(await caller(request, service))
    return JSONResponse(status_code=status, content=_without_addresses(report))


def _without_addresses(value: Any) -> Any:
    """A report without URLs or host:port pairs: anyone who can reach /health may read it."""
    if isinstance(value, dict):
        return {k: _without_addresses(v) for k, v in value.items() if k not in ("url", "uri")}
    if isinstance(value, list):
        return [_without_addresses(v) for v in value]
    return redact_addresses(value) if isinstance(value, str) else value
