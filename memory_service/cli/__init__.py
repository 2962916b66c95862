"""The `memory-service` command line (memory_service.cli.main:app, the entry point)."""
