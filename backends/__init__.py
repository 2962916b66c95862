"""Memory backends: one module per store, all behind backends.base.MemoryBackend."""
