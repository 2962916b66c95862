"""bench/ has one entry point: bench/README.md's table ("Every benchmark here") lists every
script in bench/, and docs/benchmarks.md (the site's page, with a command for each and the
latest figures) lists the same ones. A new benchmark goes into both, or this fails."""

from __future__ import annotations

import re

from .conftest import REPO

HELPERS = {"baselines.py", "evidence.py"}  # shared modules of the retrieval benchmarks, not benchmarks
ROW = re.compile(r"^\| \[?`(\w+\.py)`", re.MULTILINE)


def benchmarks() -> set[str]:
    return {path.name for path in (REPO / "bench").glob("*.py")} - HELPERS


def listed(text: str) -> set[str]:
    return set(ROW.findall(text))


def test_bench_readme_lists_every_benchmark_first():
    readme = (REPO / "bench" / "README.md").read_text()
    index = readme[readme.index("## Every benchmark here"):readme.index("\n## ", readme.index("## Every benchmark here") + 1)]
    assert benchmarks() - listed(index) == set(), "bench/README.md's table lacks these"
    assert listed(index) - benchmarks() == set(), "bench/README.md's table names scripts that are gone"
    for helper in HELPERS:
        assert f"`{helper}`" in index


def test_the_sites_page_lists_the_same_benchmarks():
    page = (REPO / "docs" / "benchmarks.md").read_text()
    assert listed(page) == benchmarks()
    assert "../bench/README.md" in page
