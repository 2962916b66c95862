"""The public path of the service's data models (README, "Embedding it"): they live in
memory_service/domain/models.py; this module only re-exports them."""

from memory_service.domain.models import *  # noqa: F403
