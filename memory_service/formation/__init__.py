"""Formation: conversation windows into memories, exactly once.

The gates say when a session has enough new conversation; the window is the state machine of
one window's life in Redis; the steps form a claimed window (extract, guard, store); the
pipeline is the worker's work (forming, consolidating, sweeping cold sessions)."""
