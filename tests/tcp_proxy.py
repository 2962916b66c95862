"""A TCP proxy on loopback that a test can cut and restore: an outage of whatever server
is behind it (the MongoDB stand-in or a real MongoDB at MONGODB_URI) as the client sees
one — connections reset, new ones refused — without owning that server. A ``tap`` sees
every chunk before it is forwarded, and can stop it (and its connection) there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from memory_service.loopback import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        # tap(connection, "up" (client to server) or "down", chunk) -> forward it?
        self.tap: Callable[[int, str, bytes], bool] | None = None

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        """Refuse new connections and reset the open ones."""
        if self._server:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            return
        self._writers |= {client_writer, server_writer}
        connection = id(client_writer)
        await asyncio.gather(self._pipe(connection, "up", client_reader, server_writer, client_writer),
                             self._pipe(connection, "down", server_reader, client_writer, server_writer))
        self._writers -= {client_writer, server_writer}

    async def _pipe(self, connection: int, direction: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, other: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if self.tap is not None and not self.tap(connection, direction, data):
                    writer.transport.abort()
                    other.transport.abort()
                    return
                writer.write(data)
                await writer.drain()
        writer.close()
