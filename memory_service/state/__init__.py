"""The service's control state in Redis: connection pools, per-session counters and cursors, persistence.

Imports only the vocabulary and the settings."""
