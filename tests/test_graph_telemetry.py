"""Graphiti's telemetry stays off unless the operator turns it on.

graphiti-core reads GRAPHITI_TELEMETRY_ENABLED (default: on) whenever it would send, and
turns itself off under pytest, so the variable the backend sets is what is checked."""

import os

from memory_service.backends.graph import GraphBackend


async def test_graphiti_telemetry_is_off_by_default_and_on_only_when_asked(settings, monkeypatch):
    monkeypatch.setenv("GRAPHITI_TELEMETRY_ENABLED", "true")  # graphiti-core's own default
    await GraphBackend(settings.falkordb_url, settings).close()
    assert os.environ["GRAPHITI_TELEMETRY_ENABLED"] == "false"
    opted_in = settings.model_copy(update={"graphiti_telemetry_enabled": True})
    await GraphBackend(settings.falkordb_url, opted_in).close()
    assert os.environ["GRAPHITI_TELEMETRY_ENABLED"] == "true"
