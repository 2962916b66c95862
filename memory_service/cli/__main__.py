"""`python -m memory_service.cli`: the `memory-service` command."""

from memory_service.cli import main

main()
