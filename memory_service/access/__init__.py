"""Who may do what: API keys, the principal a request acts as, what a caller may see (reach),
the audit log, and the keyed digests that stand for user ids in logs."""
