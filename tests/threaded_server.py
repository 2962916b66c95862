"""The API on a real uvicorn server on loopback, in a thread of its own with its own event
loop: for synchronous tests (schemathesis and hypothesis drive requests synchronously)."""

from __future__ import annotations

import threading
import time

import uvicorn

from memory_service.backends.loopback import free_port


class ThreadedServer:
    def __init__(self, app):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="api-server", daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
