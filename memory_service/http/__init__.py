"""The HTTP API: FastAPI app, the guard in front of every route, overload control, the access log, and
one router per resource."""
