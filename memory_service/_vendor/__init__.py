"""Third-party code shipped inside the package, unchanged but for what its README says.

Only arq lives here (memory_service/_vendor/arq/README.md says why). Vendored code is not
ours to restyle: ruff, mypy and the layering test skip this folder (pyproject.toml,
tests/test_layering.py)."""
