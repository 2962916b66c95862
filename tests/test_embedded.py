"""The embedded store with real processes: one owner per data directory, a server that
dies with its owner, orphans stopped, a private directory and a password."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from memory_service.backends.embedded import LOCK_FILE, PID_FILE, URL_FILE, EmbeddedFalkorDB, _binaries, server_in
from memory_service.domain.errors import BackendUnavailable

from .conftest import clean_env, free_port
from .test_cli import CLI, _wait_healthy


def servers_in(data_dir: Path) -> list[int]:
    """Every redis-server process working in ``data_dir``."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and server_in(int(p.name), data_dir)]


def wait_until(condition, seconds: float = 60) -> bool:
    """Wait for ``condition`` to hold (a bound on waiting for an event, not a speed check)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def modes(root: Path) -> dict[str, int]:
    """The permission bits of ``root`` and everything under it, by path relative to it."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.fixture
def store(tmp_path):
    server = EmbeddedFalkorDB(tmp_path / "store")
    server.start()
    yield server
    server.stop()


# Dying with the owner -----------------------------------------------------------------


def _serve(data: Path, port: int) -> subprocess.Popen:
    return subprocess.Popen([CLI, "serve", "--port", str(port), "--data-dir", str(data), "--log-level", "warning"],
                            env={**clean_env(), "EMBEDDER": "hash"}, stderr=subprocess.PIPE, text=True)


async def test_a_killed_owner_takes_its_server_with_it_and_a_restart_runs_one_server(tmp_path):
    data, port = (tmp_path / "data").resolve(), free_port()
    body = {"agent_id": "a1", "user_id": "u1", "role": "user", "content": "kept across the crash", "message_id": "m1"}
    owner = _serve(data, port)
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", owner)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            assert (await http.post("/v1/sessions/s1/messages", json=body)).json()["duplicate"] is False
        [server] = servers_in(data)
        assert int((data / PID_FILE).read_text()) == server
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert wait_until(lambda: not server_in(server, data)), "the server outlived its killed owner"
    finally:
        owner.kill()
        owner.wait()
    restarted = _serve(data, port)
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", restarted)
        assert len(servers_in(data)) == 1
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            # The message recorded before the kill is still there: the server saved it on the way out.
            assert (await http.post("/v1/sessions/s1/messages", json=body)).json()["duplicate"] is True
    finally:
        restarted.terminate()
        restarted.wait(timeout=60)
    assert servers_in(data) == []


def test_a_server_started_from_a_thread_that_ends_keeps_running(tmp_path):
    """The parent-death signal follows the thread that forked: a server started from an
    executor or event-loop thread must not die when that thread does."""
    server = EmbeddedFalkorDB(tmp_path / "threaded")
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    try:
        # Once the thread is gone from the kernel, a signal its end caused is pending at the
        # server; it is handled before the server answers the next command.
        assert wait_until(lambda: not Path(f"/proc/self/task/{starter.native_id}").exists())
        assert redis.Redis.from_url(server.url).ping()
        assert "Received SIGTERM" not in (server.data_dir / "falkordb.log").read_text()
        pid = int((server.data_dir / PID_FILE).read_text())
    finally:
        server.stop()
    assert not server_in(pid, server.data_dir)
    assert "Received SIGTERM" in (server.data_dir / "falkordb.log").read_text()  # from stop(), the way it logs it


# Orphans and the lock -------------------------------------------------------------------


def _orphan(data: Path) -> subprocess.Popen:
    """A redis-server in ``data`` that no owner holds, as an older version left behind."""
    data.mkdir(parents=True, exist_ok=True)
    server, module = _binaries()
    port = free_port()
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
                             "--loadmodule", module, "--appendonly", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    client = redis.Redis(port=port)
    assert wait_until(lambda: _answers(client)), "the orphan did not start"
    client.set("written-by", "the orphan")
    client.close()
    (data / PID_FILE).write_text(str(proc.pid))
    return proc


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.RedisError:
        return False


def test_an_orphan_left_in_the_directory_is_stopped_and_its_data_kept(tmp_path):
    data = (tmp_path / "data").resolve()
    orphan = _orphan(data)
    server = EmbeddedFalkorDB(data)
    try:
        server.start()
        assert orphan.wait(timeout=60) == 0  # stopped by SIGTERM: it saved and exited cleanly
        assert servers_in(data) == [int((data / PID_FILE).read_text())]
        assert redis.Redis.from_url(server.url).get("written-by") == b"the orphan"
    finally:
        orphan.kill()
        orphan.wait()
        server.stop()


def test_a_pid_file_naming_something_else_kills_nothing(tmp_path):
    data = (tmp_path / "data").resolve()
    data.mkdir()
    other_dir_server = _orphan(tmp_path / "elsewhere")  # a redis-server, but in another directory
    bystander = subprocess.Popen(["sleep", "300"])  # ours, but not a redis-server
    server = EmbeddedFalkorDB(data)
    try:
        for pid in (other_dir_server.pid, bystander.pid, 2**22 + 1):  # the last: no such process
            (data / PID_FILE).write_text(str(pid))
            server.start()
            assert int((data / PID_FILE).read_text()) != pid
            server.stop()
        assert other_dir_server.poll() is None and bystander.poll() is None
    finally:
        for proc in (other_dir_server, bystander):
            proc.kill()
            proc.wait()
        server.stop()


def test_a_second_owner_is_refused_and_disturbs_nothing(store):
    url = (store.data_dir / URL_FILE).read_text()
    second = EmbeddedFalkorDB(store.data_dir)
    with pytest.raises(BackendUnavailable, match=f"in use by another memory-service process \\(pid {os.getpid()}\\)"):
        second.start()
    second.stop()  # stopping the refused one leaves the owner's files alone
    assert (store.data_dir / URL_FILE).read_text() == url
    assert EmbeddedFalkorDB.running_url(store.data_dir) == url
    assert redis.Redis.from_url(url).ping()
    assert len(servers_in(store.data_dir)) == 1


def test_running_url_finds_only_a_running_owner(tmp_path):
    missing = tmp_path / "missing"
    assert EmbeddedFalkorDB.running_url(missing) is None
    assert not missing.exists()  # looking does not create the directory or its lock
    server = EmbeddedFalkorDB(tmp_path / "data")
    url = server.start()
    assert EmbeddedFalkorDB.running_url(tmp_path / "data") == url
    server.stop()
    assert EmbeddedFalkorDB.running_url(tmp_path / "data") is None  # the lock file stays; nobody holds it
    assert (tmp_path / "data" / LOCK_FILE).exists()


# Privacy ------------------------------------------------------------------------------


def test_the_store_needs_its_password(store):
    client = redis.Redis(port=store.port)
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=store.port, password="guess").ping()
    assert redis.Redis.from_url(store.url).ping()
    pid = int((store.data_dir / PID_FILE).read_text())
    assert store.password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_each_owner_has_a_new_password_that_the_log_never_shows(tmp_path, caplog):
    passwords, urls = [], []
    with caplog.at_level(logging.DEBUG, logger="memory_service"):
        for _ in range(2):
            server = EmbeddedFalkorDB(tmp_path / "data")
            for _ in range(2):  # started again, an owner keeps its URL: its clients reconnect as they were
                urls.append(server.start())
                assert redis.Redis.from_url(urls[0 if len(urls) <= 2 else 2]).ping()
                server.stop()
            passwords.append(server.password)
    assert urls[0] == urls[1] and urls[2] == urls[3]
    assert passwords[0] != passwords[1] and all(len(p) >= 32 for p in passwords)
    assert "embedded FalkorDB on redis://:***@127.0.0.1:" in caplog.text
    assert not any(p in caplog.text for p in passwords)
    assert not any(p in (tmp_path / "data" / "falkordb.log").read_text() for p in passwords)


def test_the_directory_and_every_file_are_private(tmp_path):
    server = EmbeddedFalkorDB(tmp_path / "new" / "data")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.set("k", "v")
        client.execute_command("GRAPH.QUERY", "g", "CREATE (:N {x: 1})")
        client.bgsave()
        assert wait_until(lambda: (server.data_dir / "dump.rdb").exists())
        running = modes(server.data_dir)
        assert {URL_FILE, PID_FILE, LOCK_FILE, "falkordb.log", "appendonlydir"} <= set(running)
    finally:
        server.stop()
    for found in (running, modes(server.data_dir)):
        wrong = {p: oct(m) for p, m in found.items()
                 if m != (0o700 if (server.data_dir / p).is_dir() or p == "." else 0o600)}
        assert wrong == {}


def test_files_an_older_version_left_readable_are_made_private(tmp_path):
    data = (tmp_path / "data").resolve()
    old = _orphan(data)  # a server without our umask writes 0644 files and 0755 directories
    old.terminate()
    assert old.wait(timeout=60) == 0
    data.chmod(0o755)
    (data / "link").symlink_to("/etc/hostname")  # a link is not followed: /etc keeps its modes
    hostname_mode = stat.S_IMODE(os.stat("/etc/hostname").st_mode)
    before = modes(data)
    assert before["."] == 0o755 and before["dump.rdb"] & 0o044 and before["appendonlydir"] & 0o055
    server = EmbeddedFalkorDB(data)
    server.start()
    try:
        assert redis.Redis.from_url(server.url).get("written-by") == b"the orphan"
    finally:
        server.stop()
    found = modes(data)
    assert found["."] == found["appendonlydir"] == 0o700
    assert {p: m for p, m in found.items() if not (data / p).is_dir() and p != "link" and m != 0o600} == {}
    assert stat.S_IMODE(os.stat("/etc/hostname").st_mode) == hostname_mode


def test_a_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() == 0:
        data = tmp_path / "theirs"
        data.mkdir(mode=0o755)
        os.chown(data, 65534, 65534)
    else:
        data = Path("/")  # root's
    before = stat.S_IMODE(data.stat().st_mode)
    server = EmbeddedFalkorDB(data)
    with pytest.raises(BackendUnavailable, match="belongs to another user"):
        server.start()
    assert not (data / LOCK_FILE).exists()
    assert stat.S_IMODE(data.stat().st_mode) == before


# What unauthenticated callers see ---------------------------------------------------------


async def test_health_and_errors_do_not_say_where_the_stores_listen(settings, tmp_path):
    from memory_service.backends.loopback import LoopbackServer
    from memory_service.http.app import create_app

    graph = EmbeddedFalkorDB(tmp_path / "graph")
    graph_url = graph.start()
    state_port = str(redis.Redis.from_url(settings.falkordb_url).connection_pool.connection_kwargs["port"])
    addresses = ("redis://", "127.0.0.1", f":{graph.port}", f":{state_port}", graph.password)
    body = {"agent_id": "a1", "user_id": "u1", "role": "user", "content": "hello", "message_id": "chat:12"}
    try:  # memories on their own store, to be cut; state on the shared one
        app = create_app(settings.model_copy(update={"falkordb_url": graph_url, "redis_url": settings.falkordb_url}),
                         run_worker=False)
        async with LoopbackServer(app) as server, httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            healthy = await http.get("/health?detail=true")
            assert healthy.status_code == 200 and healthy.json()["backends"]["graph"]["ok"] is True
            graph.stop()
            down = await http.get("/health?detail=true")  # the open connection closed
            again = await http.get("/health?detail=true")  # a new one refused: redis names the address it tried
            assert down.status_code == again.status_code == 503
            assert "connecting to <address>" in again.json()["backends"]["graph"]["error"]
            refused = await http.post("/v1/sessions/s1/messages", json=body)
            assert refused.status_code == 503 and "send it again" in refused.json()["detail"]
            # The ids stay (they may look like host:port); the store's words are not sent at all
            # (issue 21: they stay in the server's log).
            assert "could not store message 'chat:12'" in refused.json()["detail"]
            assert "the memory store is unavailable" in refused.json()["detail"]
            assert "connect" not in refused.json()["detail"].lower()
            for answer in (healthy, down, again, refused):
                assert [a for a in addresses if a in answer.text] == [], answer.text
    finally:
        graph.stop()


@pytest.mark.parametrize("error, kept", [
    ("Error 111 connecting to 127.0.0.1:41234. Connect call failed ('127.0.0.1', 41234).", "Error 111 connecting to"),
    ("localhost:27017: [Errno 111] Connection refused (configured timeouts: connectTimeoutMS: 20000.0ms)",
     "Connection refused"),
    ("[::1]:6379 refused; ('::1', 6379, 0, 0)", "refused"),
    ("bad uri mongodb://user:secret@db.internal:27017,db2.internal:27018/?replicaSet=rs", "bad uri"),
    ("Timeout connecting to server at 10.1.2.3", "Timeout connecting to server at"),
])
def test_addresses_in_errors_are_redacted(error, kept):
    from memory_service.config import redact_addresses

    redacted = redact_addresses(error)
    assert kept in redacted and "<address>" in redacted
    assert not any(leak in redacted for leak in ("41234", "27017", "6379", "secret", "db.internal", "10.1.2.3"))
    assert redact_addresses("memory backend 'graph' failed to start: Timeout") == \
        "memory backend 'graph' failed to start: Timeout"


def test_error_details_lose_the_stores_addresses_and_keep_the_ids():
    from memory_service.domain.errors import FormationPending, InvalidInput
    from memory_service.http.app import _public_detail

    store_error = ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    try:
        try:
            raise store_error
        except ConnectionError as exc:
            raise BackendUnavailable(f"could not store message 'chat:12' of session 's1': {exc}; send it again") from exc
    except BackendUnavailable as exc:
        assert _public_detail(exc) == ("could not store message 'chat:12' of session 's1': Error 111 connecting to "
                                       "<address>. Connection refused.; send it again")
    cached = BackendUnavailable("memory backend 'mongo' failed to start: ServerSelectionTimeoutError: db:27017: refused")
    assert _public_detail(cached) == "memory backend 'mongo' failed to start: ServerSelectionTimeoutError: <address>: refused"
    waited = FormationPending("the window of session 's1' is not formed after 120s; job form:s1:3 is still queued")
    assert _public_detail(waited) == str(waited)
    assert _public_detail(InvalidInput("message_id 'host:80' is bad")) == "message_id 'host:80' is bad"
