"""Where memories live: the interface every store implements (base), the registry that picks an
agent's store, and one module per store (graph on FalkorDB, Mongo, the mirror with its outbox).

Only the composition root (memory_service/runtime.py, the CLI) imports a store's module
(graph, graph_layout, mongo, mirror); everything else speaks to memory_service.backends.base."""
