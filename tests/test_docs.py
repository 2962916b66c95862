"""The README documents what the code reads."""

from memory_service.config import Settings

from .conftest import REPO


def test_the_readme_lists_every_environment_variable():
    readme = (REPO / "README.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in readme]
    assert not missing, f"README's Configuration table lacks {missing}"


def test_the_deploy_files_require_keys_and_keep_the_stores_private():
    import yaml

    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())["services"]
    assert "OPERATOR_API_KEY" in compose["api"]["environment"]
    assert not any("ports" in compose[store] for store in ("falkordb", "redis", "mongodb"))
    k8s = list(yaml.safe_load_all((REPO / "deploy/k8s/memory-service.yaml").read_text()))
    api = next(d for d in k8s if d["metadata"]["name"] == "memory-service-api" and d["kind"] == "Deployment")
    env = {e["name"]: e for e in api["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["OPERATOR_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "memory-service"
    assert env["API_AUTH"]["value"] == "keys"
