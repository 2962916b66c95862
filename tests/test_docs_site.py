"""The documentation site (mkdocs.yml, docs/): it builds with --strict, its generated pages
are what the code makes now, its links to files outside docs/ are kept honest, and its
runnable examples run.

A ```python block right after the line ``<!-- runs -->`` runs against a live server (its
``http://127.0.0.1:8080`` replaced by the server's address); after ``<!-- runs: standalone -->``
it runs as a script of its own in an empty directory (an example that opens the embedded
store itself). An example a page does not mark is not run here.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
from mkdocs_hooks import rewrite_outside_links  # noqa: E402

MKDOCS = Path(sys.executable).with_name("mkdocs")
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # material's banner about MkDocs 2, on every build
RUNS = re.compile(r"^<!-- runs(?:: (?P<how>standalone))? -->\n```python\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=ENV, timeout=120)


def test_the_site_builds_strict(tmp_path):
    built = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    for page in ("index.html", "getting-started/index.html", "configuration/index.html", "api/index.html"):
        assert (tmp_path / "site" / page).exists()
    # Nothing is fetched to read it: no web fonts, no CDN.
    html = (tmp_path / "site" / "index.html").read_text()
    assert "fonts.googleapis" not in html and "cdn." not in html


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path):
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "mkdocs_hooks.py", tmp_path / "scripts")
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\n[gone](no-such-page.md), [gone too](../no/such/file.py), [no anchor](concepts.md#no-such-part)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    built = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    for culprit in ("no-such-page.md", "../no/such/file.py", "no-such-part", "orphan.md"):
        assert culprit in built.stderr, (culprit, built.stderr)


def test_links_to_files_outside_docs_point_at_the_repository_or_name_the_file():
    page = "See [the benchmarks](../bench/README.md#running), [bench/locomo.py](../bench/locomo.py) and [a page](client.md)."
    docs = REPO / "docs"
    linked = rewrite_outside_links(page, "benchmarks.md", docs, REPO, "https://git.example/ms/", "main")
    assert "[the benchmarks](https://git.example/ms/blob/main/bench/README.md#running)" in linked
    assert "[bench/locomo.py](https://git.example/ms/blob/main/bench/locomo.py)" in linked
    assert "[a page](client.md)" in linked  # inside docs/: MkDocs's own
    named = rewrite_outside_links(page, "benchmarks.md", docs, REPO, None)
    assert "the benchmarks (`bench/README.md`)" in named and "`bench/locomo.py`" in named
    nested = rewrite_outside_links("[code](../../memory_service/integrations/)", "integrations/index.md", docs, REPO,
                                   "https://git.example/ms")
    assert nested == "[code](https://git.example/ms/tree/main/memory_service/integrations)"


@pytest.mark.parametrize("script", ["docs-config", "docs-api"])
def test_the_generated_pages_are_current(script):
    """docs/configuration.md (from Settings) and docs/api.md (from the OpenAPI schema): run
    `make docs-pages` after a setting or a route changed."""
    check = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--check"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr


def test_the_configuration_page_lists_every_setting_with_its_description():
    from memory_service.config import Settings

    page = (REPO / "docs" / "configuration.md").read_text()
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description"
        assert f"| `{name.upper()}` |" in page


def runnable_examples(how: str | None) -> list[tuple[str, str]]:
    """(page, code) of every example marked runnable the way ``how`` says."""
    found = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        for match in RUNS.finditer(page.read_text()):
            if match["how"] == how:
                found.append((str(page.relative_to(REPO)), match["code"]))
    return found


def test_getting_started_has_runnable_examples():
    pages = {page for page, _ in runnable_examples(None) + runnable_examples("standalone")}
    assert "docs/getting-started.md" in pages


@pytest.mark.parametrize("page, code", runnable_examples(None), ids=lambda v: v if v.endswith(".md") else "")
async def test_the_pages_examples_run_against_a_server(page, code, http, live_server, capsys):
    assert "http://127.0.0.1:8080" in code, f"an example of {page} names no server to replace"
    code = code.replace("http://127.0.0.1:8080", live_server.base_url)
    await asyncio.to_thread(exec, compile(code, page, "exec"), {"__name__": "docs"})
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize("page, code", runnable_examples("standalone"), ids=lambda v: v if v.endswith(".md") else "")
def test_the_pages_standalone_examples_run(page, code, tmp_path):
    """Run as a script in an empty directory, with no store configured: the embedded default."""
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.endswith(("_URL", "_URI")) and k != "REDIS_CLUSTER"}
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert ran.returncode == 0, f"{page}: {ran.stderr[-2000:]}"
    assert ran.stdout.strip()


def test_the_typescript_pages_example_is_the_one_make_test_ts_runs():
    """docs/typescript.md shows clients/typescript/examples/quickstart.mjs as it is; `make
    test-ts` runs that file against a real server (Node is not needed here)."""
    page = (REPO / "docs" / "typescript.md").read_text()
    shown = re.search(r"^```js\n(.*?)^```$", page, re.MULTILINE | re.DOTALL)
    assert shown and shown[1] == (REPO / "clients" / "typescript" / "examples" / "quickstart.mjs").read_text()
