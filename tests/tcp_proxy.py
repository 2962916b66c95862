"""A TCP proxy on loopback that a test can cut, stall and restore: an outage of whatever
server is behind it (the MongoDB stand-in, a real MongoDB at MONGODB_URI, an embedded
FalkorDB) as the client sees one, without owning that server.

* ``stop()`` cuts: open connections are reset, new ones refused.
* ``stall()`` hangs: connections are accepted (new ones too) and nothing more is
  forwarded either way, as with a server that stopped answering; ``resume()`` forwards
  what was held back.
* ``tap`` sees every chunk before it is forwarded, and can stop it (and its connection)
  there: a cut at an exact point of a protocol exchange.

``ThreadedTcpProxy`` runs one on an event loop of its own, for clients that block the
test's loop (falkordb probes its server synchronously while it constructs a client).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from memory_service.backends.loopback import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self.accepted = 0  # connections accepted so far
        self.password: str | None = None  # the target's, for ``url`` (the embedded store has one)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None
        # tap(connection, "up" (client to server) or "down", chunk) -> forward it?
        self.tap: Callable[[int, str, bytes], bool] | None = None

    @property
    def url(self) -> str:
        credentials = f":{self.password}@" if self.password else ""
        return f"redis://{credentials}127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        if self._flowing is None:
            self._flowing = asyncio.Event()
        self._flowing.set()
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
        if self._flowing is not None:
            self._flowing.set()  # let stalled pipes see their reset connections

    async def stall(self) -> None:
        """Accept connections, forward nothing."""
        self._flowing.clear()

    async def resume(self) -> None:
        self._flowing.set()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._writers.add(client_writer)
        try:
            await self._flowing.wait()
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            return
        except asyncio.CancelledError:  # the test's loop is shutting down: nothing to forward
            client_writer.transport.abort()
            return
        self._writers.add(server_writer)
        with contextlib.suppress(asyncio.CancelledError):
            connection = id(client_writer)
            await asyncio.gather(self._pipe(connection, "up", client_reader, server_writer, client_writer),
                                 self._pipe(connection, "down", server_reader, client_writer, server_writer))
        self._writers -= {client_writer, server_writer}

    async def _pipe(self, connection: int, direction: str, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, other: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                if writer.transport.is_closing():
                    break
                if self.tap is not None and not self.tap(connection, direction, data):
                    writer.transport.abort()
                    other.transport.abort()
                    return
                writer.write(data)
                await writer.drain()
        writer.close()


class ThreadedTcpProxy:
    """A TcpProxy on its own event loop in a daemon thread; the same methods, blocking."""

    def __init__(self, target_host: str, target_port: int):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self.proxy = TcpProxy(target_host, target_port)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return self.proxy.url

    def _run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    def start(self) -> ThreadedTcpProxy:
        self._run(self.proxy.start())
        return self

    def stop(self) -> None:
        self._run(self.proxy.stop())

    def stall(self) -> None:
        self._run(self.proxy.stall())

    def resume(self) -> None:
        self._run(self.proxy.resume())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
