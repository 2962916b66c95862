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
    # The Kubernetes manifests' keys and Secrets: tests/test_deploy.py renders and checks them.


def readme_block(after_heading: str, language: str = "python") -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index(f"```{language}\n", readme.index(after_heading)) + len(f"```{language}\n")
    return readme[start:readme.index("```", start)]


async def test_the_readme_client_example_runs(http, live_server, capsys):
    import asyncio

    code = readme_block("### The session loop with the client library")
    placeholder = 'API, KEY = "http://127.0.0.1:8080", None'
    assert placeholder in code
    code = code.replace(placeholder, f'API, KEY = "{live_server.base_url}", None')
    await asyncio.to_thread(exec, compile(code, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "<MemoryContext>" in out and "window seats" in out
