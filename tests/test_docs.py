"""The README's two examples run, and the pages document what the code reads.

The README shows the session loop twice, in curl and with the Python client: both run here
against a live server, so a changed route or client method breaks this and not a newcomer.
(The documentation site's own examples run in tests/test_docs_site.py.)"""

import re

from memory_service.config import Settings

from .conftest import REPO


def test_the_configuration_page_lists_every_environment_variable():
    page = (REPO / "docs" / "configuration.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in page]
    assert not missing, f"docs/configuration.md lacks {missing} (make docs-pages)"


def test_the_deploy_files_require_keys_and_keep_the_stores_private():
    import yaml

    compose = yaml.safe_load((REPO / "deploy/compose.yaml").read_text())["services"]
    assert "OPERATOR_API_KEY" in compose["api"]["environment"]
    assert not any("ports" in compose[store] for store in ("falkordb", "redis", "mongodb"))
    # The Kubernetes manifests' keys and Secrets: tests/test_deploy.py renders and checks them.


def readme_block(after_heading: str, language: str) -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index(f"```{language}\n", readme.index(after_heading)) + len(f"```{language}\n")
    return readme[start:readme.index("```", start)]


def test_the_readme_is_short_and_dateless():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    prose = re.sub(r"^```xml\n.*?^```$", "", readme, flags=re.MULTILINE | re.DOTALL)  # the block's memories have dates
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", prose), "dated figures belong in docs/benchmarks.md"
    assert not re.search(r"\b(issue|session) \d+\b", readme, re.IGNORECASE), "no history in the README"
    assert "<MemoryContext>" in readme_block("## The block it produces", "xml")


async def test_the_readme_client_example_runs(http, live_server, capsys):
    import asyncio

    code = readme_block("## The session loop", "python")
    placeholder = 'API, KEY = "http://127.0.0.1:8080", None'
    assert placeholder in code
    code = code.replace(placeholder, f'API, KEY = "{live_server.base_url}", None')
    await asyncio.to_thread(exec, compile(code, "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "<MemoryContext>" in out and "window seats" in out
    assert re.search(r"^\d\.\d\d \w+: .*June 3rd", out, re.MULTILINE), out  # a search result


async def test_the_readme_curl_example_runs(http, live_server):
    """The shell block as it is, but for the server's address, under bash -e: every call
    answers 2xx (curl --fail), the window is formed and the block and the search show it."""
    import asyncio
    import shutil
    import subprocess

    code = readme_block("## The session loop", "sh")
    assert "API=http://127.0.0.1:8080" in code
    code = code.replace("API=http://127.0.0.1:8080", f"API={live_server.base_url}").replace("curl -s ", "curl -sS --fail ")
    assert code.count("curl -sS --fail ") == 4
    ran = await asyncio.to_thread(subprocess.run, [shutil.which("bash") or "bash", "-euo", "pipefail", "-c", code],
                                  capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout
    assert '"duplicate":false' in out.replace(" ", "") and '"formed":true' in out.replace(" ", "")
    assert "<MemoryContext>" in out and "window seats" in out
    assert '"results":[{' in out.replace(" ", "")


def slug(heading: str) -> str:
    """The anchor GitHub and MkDocs's toc give a heading (the simple cases the README links)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_links_reach_the_pages():
    """Where to read next is one click each: every relative link of the README names a file
    that exists and, with an anchor, a heading of that file."""
    readme = (REPO / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#([\w-]+))?\)", readme)
    assert len(links) > 20 and all(not target.startswith("/") for target, _ in links)
    for target, anchor in links:
        if target.startswith(("http://", "https://")):
            continue
        path = REPO / target
        assert path.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(), re.MULTILINE)
            assert anchor in {slug(h) for h in headings}, f"{target}#{anchor}"
    for page in ("getting-started", "integrations/index", "operating", "deploy", "benchmarks", "configuration", "api"):
        assert f"(docs/{page}.md" in readme, page
