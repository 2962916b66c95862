"""The service's control state in Redis: connection pools, per-session counters and cursors, persistence,
the keyspace (every Redis key: keyspace.py) and the memory block's cache and its invalidation (cache.py).

Imports only the vocabulary and the settings."""
