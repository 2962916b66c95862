"""bench/ has one entry point: bench/README.md's table ("Every benchmark here") lists every
script in bench/ with its page, docs/benchmarks.md (the site's index) lists the same ones,
and each has its page, docs/benchmarks/<script stem>.md, in the site's nav: how to run it
(the command) and its latest figures with the machine, the date and the command. The pages
hold figures, not history (git keeps that: the old notebook bench/RESULTS.md is gone, and
nothing points at it). A new benchmark goes into both lists and gets its page, or this fails."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

HELPERS = {"common.py", "baselines.py", "evidence.py"}  # shared modules, not benchmarks
ROW = re.compile(r"^\| \[?`(\w+\.py)`", re.MULTILINE)
PAGES = REPO / "docs" / "benchmarks"
HISTORY = re.compile(r"\b(?:issue|session) \d+(?![.,]?\d)", re.IGNORECASE)  # "session 32", not "multi-session 0.810"


def benchmarks() -> set[str]:
    return {path.name for path in (REPO / "bench").glob("*.py")} - HELPERS


def stem(script: str) -> str:
    return script.removesuffix(".py")


def listed(text: str) -> set[str]:
    return set(ROW.findall(text))


def section(page: str, heading: str) -> str:
    """The text of ``## heading`` up to the next ``## `` heading."""
    start = page.index(f"\n## {heading}\n")
    end = page.find("\n## ", start + 1)
    return page[start:end if end != -1 else len(page)]


def test_bench_readme_lists_every_benchmark_first_each_with_its_page():
    readme = (REPO / "bench" / "README.md").read_text()
    index = section(readme, "Every benchmark here")
    assert benchmarks() - listed(index) == set(), "bench/README.md's table lacks these"
    assert listed(index) - benchmarks() == set(), "bench/README.md's table names scripts that are gone"
    for helper in HELPERS:
        assert f"`{helper}`" in index
    rows = dict(re.findall(r"^\| \[`(\w+\.py)`\].*\(\.\./docs/benchmarks/(\w+)\.md\) \|$", index, re.MULTILINE))
    assert rows == {script: stem(script) for script in benchmarks()}, "each row links its script's page"


def test_the_sites_index_lists_the_same_benchmarks_each_with_its_page():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert listed(page) == benchmarks()
    links = dict(re.findall(r"^\| \[`(\w+\.py)`\]\(benchmarks/(\w+)\.md\)", page, re.MULTILINE))
    assert links == {script: stem(script) for script in benchmarks()}
    assert "../bench/README.md" in page


def test_every_benchmark_has_its_page_in_the_nav_and_every_page_its_benchmark():
    assert {path.stem for path in PAGES.glob("*.md")} == {stem(script) for script in benchmarks()}
    nav = (REPO / "mkdocs.yml").read_text()
    for script in benchmarks():
        assert f": benchmarks/{stem(script)}.md\n" in nav, script


@pytest.mark.parametrize("script", sorted(benchmarks()))
def test_each_page_says_how_to_run_it_and_gives_its_latest_figures(script):
    page = (PAGES / f"{stem(script)}.md").read_text()
    assert page.startswith(f"# `{script}`: ")
    run = section(page, "Run it")
    assert "```sh\n" in run and f"bench/{script}" in run, "the command that runs it"
    latest = section(page, "Latest figures")
    assert re.search(r"\*\*20\d\d-\d\d-\d\d\*\*", latest), "the date the figures were measured"
    assert re.search(r"\d cores", latest), "the machine they were measured on"
    assert f"bench/{script}" in latest, "the command that measured them"
    assert "|---|" in latest or re.search(r"\d ms", latest), "the figures"


def test_the_pages_hold_figures_not_history():
    for path in [REPO / "docs" / "benchmarks.md", REPO / "bench" / "README.md", *sorted(PAGES.glob("*.md"))]:
        found = HISTORY.findall(path.read_text())
        assert not found, f"{path.relative_to(REPO)}: {found} (git keeps the history)"


def test_the_old_notebook_is_gone_and_nothing_points_at_it():
    assert not (REPO / "bench" / "RESULTS.md").exists(), "figures go on the pages: docs/benchmarks/<script>.md"
    tell_where_it_went = {REPO / "docs" / "benchmarks.md", REPO / "bench" / "README.md", REPO / "tests" / "test_bench_index.py"}
    files = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml", REPO / "mkdocs.yml"]
    for folder, pattern in (("docs", "*.md"), ("bench", "*"), ("memory_service", "*.py"), ("tests", "*.py"), ("scripts", "*")):
        files += [path for path in (REPO / folder).rglob(pattern) if path.is_file()]
    pointing = [str(path.relative_to(REPO)) for path in files
                if path not in tell_where_it_went and "RESULTS.md" in path.read_text(errors="ignore")]
    assert pointing == []
