"""One router per resource, each mounted by memory_service.http.app.create_app."""
