"""The arq worker: formation and consolidation jobs, the cold-session sweep, retention."""
