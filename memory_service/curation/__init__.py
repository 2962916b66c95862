"""Curation: changing what is held. The memory tools, structured write blocks, retention and the stale
purge, erasure, the legacy import and the move between stores."""
