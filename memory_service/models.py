"""The public path of the service's data models (docs/getting-started.md, "From Python, in process"): they live in
memory_service/domain/models.py; this module only re-exports them."""

from memory_service.domain.models import *  # noqa: F403
