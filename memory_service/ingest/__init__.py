"""Ingest: recording messages into the session ledger and the store (group commit)."""
