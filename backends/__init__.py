"""Memory backends: one module per store, all behind memory_service.backend.MemoryBackend (the core owns the interface; backends depend on the core, never the reverse)."""
