"""Safe defaults and `memory-service keys`, as an operator runs them: a server reachable
from other hosts refuses to start without a key, the first key is made before it starts,
and a key revoked from the command line is refused by the running server at once."""

from __future__ import annotations

import json
import signal
import subprocess

import httpx

from .conftest import clean_env, free_port
from .test_cli import CLI, _wait_healthy, run


def serve(data_dir, host: str, port: int, **env: str) -> subprocess.Popen:
    return subprocess.Popen([CLI, "serve", "--host", host, "--port", str(port), "--data-dir", str(data_dir),
                             "--log-level", "info"], env={**clean_env(), **env}, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def test_a_reachable_server_without_keys_refuses_to_start(tmp_path):
    proc = serve(tmp_path / "d", "0.0.0.0", free_port())
    assert proc.wait(timeout=60) != 0
    err = proc.stderr.read()
    assert "API keys are required" in err and "memory-service keys create" in err


async def test_loopback_runs_without_keys_and_says_so(tmp_path):
    port = free_port()
    proc = serve(tmp_path / "d", "127.0.0.1", port)
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", proc)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/v1/agents/a1")).status_code == 404  # no key needed: not found, not 401
            assert (await http.get("/v1/agents/a1", headers={"Authorization": "Bearer msk_bad"})).status_code == 401
    finally:
        err = stop(proc)
    assert "API keys are not required" in err


async def test_keys_made_and_revoked_from_the_command_line(tmp_path):
    data_dir = tmp_path / "d"
    made = run("keys", "create", "--name", "ops", "--role", "admin", "--data-dir", str(data_dir), "--json")
    assert made.returncode == 0, made.stdout + made.stderr
    operator = json.loads(made.stdout)
    assert operator["agents"] is None and operator["key"].startswith("msk_")
    port = free_port()
    proc = serve(data_dir, "0.0.0.0", port)
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}", proc)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/v1/agents/a1")).status_code == 401
            auth = {"Authorization": f"Bearer {operator['key']}"}
            assert (await http.put("/v1/agents/a1", json={}, headers=auth)).status_code == 200
            # While `serve` owns the store, the command attaches to it.
            agent_key = run("keys", "create", "--name", "bot", "--role", "read", "--agent", "a1", "--data-dir",
                            str(data_dir), "--json")
            assert agent_key.returncode == 0, agent_key.stderr
            reader = {"Authorization": f"Bearer {json.loads(agent_key.stdout)['key']}"}
            assert (await http.get("/v1/agents/a1", headers=reader)).status_code == 200
            listed = run("keys", "list", "--data-dir", str(data_dir), "--json")
            rows = [json.loads(line) for line in listed.stdout.splitlines()]
            assert {r["name"] for r in rows} == {"ops", "bot"} and all("key" not in r for r in rows)
            key_id = json.loads(agent_key.stdout)["key_id"]
            revoked = run("keys", "revoke", key_id, "--data-dir", str(data_dir))
            assert revoked.returncode == 0 and "revoked" in revoked.stdout
            assert (await http.get("/v1/agents/a1", headers=reader)).status_code == 401
            log = (await http.get("/v1/audit", params={"agent_id": "a1"}, headers=auth)).json()["entries"]
            assert [(e["action"], e["key_id"]) for e in log] == [("key.revoke", "cli"), ("key.create", "cli"),
                                                                ("agent.put", operator["key_id"])]
    finally:
        stop(proc)


def test_bad_key_options_are_refused_and_make_nothing(tmp_path):
    data_dir = tmp_path / "d"
    bad = run("keys", "create", "--name", "x", "--role", "admin", "--user", "bob", "--data-dir", str(data_dir))
    assert bad.returncode == 2 and "exactly one agent" in bad.stdout
    assert run("keys", "create", "--name", "x", "--role", "root", "--data-dir", str(data_dir)).returncode == 2
    unknown = run("keys", "revoke", "0123456789abcdef", "--data-dir", str(data_dir))
    assert unknown.returncode == 1 and "no key" in unknown.stdout
    assert run("keys", "list", "--data-dir", str(data_dir), "--json").stdout == ""
