"""The README documents what the code reads."""

from memory_service.config import Settings

from .conftest import REPO


def test_the_readme_lists_every_environment_variable():
    readme = (REPO / "README.md").read_text()
    missing = [name.upper() for name in Settings.model_fields if f"`{name.upper()}`" not in readme]
    assert not missing, f"README's Configuration table lacks {missing}"
