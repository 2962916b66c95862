"""What goes over the wire: the models the HTTP API answers with (and some it takes), and
that the typed client (memory_service.client) parses.

They sit just above the vocabulary (memory_service.domain) and below everything of the
server, so that the client can use the service's own models without loading the server:
a module here imports only memory_service.domain, pydantic and the standard library
(tests/test_layering.py and tests/test_client_standalone.py hold it to that). The server
builds these answers; nothing here does I/O. One module per resource."""
