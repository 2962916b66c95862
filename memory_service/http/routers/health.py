"""Operations: the counters and gauges (Prometheus text), liveness and readiness.

Liveness and readiness answer without a key (a load balancer probes them); what a
dependency's state says in detail, and the metrics, span every agent: operator keys only.
Where the stores listen is never shown.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse

from memory_service.access.authorization import require_operator
from memory_service.config import redact_addresses
from memory_service.http.deps import CallerDep, ServiceDep, caller
from memory_service.http.guard import strict_router

router = strict_router(tags=["ops"])


@router.get("/metrics", response_class=PlainTextResponse)
async def get_metrics(service: ServiceDep, principal: CallerDep) -> str:
    """Counters in the Prometheus text format: formations, LLM calls and tokens, consolidations.
    Needs an operator key (they span every agent)."""
    require_operator(principal)
    counters = await service.counters()
    text = "".join(
        f"# TYPE memory_service_{name}_total counter\nmemory_service_{name}_total {value:g}\n"
        for name, value in sorted(counters.items())
    )
    return text + _gauges(await service.gauges())


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


def _gauges(values: dict[str, float]) -> str:
    """The backends' current values (MemoryService.gauges) in the Prometheus text format."""
    lines, typed = [], set()
    for sample, value in sorted(values.items()):
        name = "memory_service_" + sample.partition("{")[0]
        if name not in typed:
            typed.add(name)
            lines.append(f"# TYPE {name} gauge\n")
        lines.append(f"memory_service_{sample} {value:g}\n")
    return "".join(lines)


def _without_addresses(value: Any) -> Any:
    """A report without URLs or host:port pairs: anyone who can reach /health may read it."""
    if isinstance(value, dict):
        return {k: _without_addresses(v) for k, v in value.items() if k not in ("url", "uri")}
    if isinstance(value, list):
        return [_without_addresses(v) for v in value]
    return redact_addresses(value) if isinstance(value, str) else value
