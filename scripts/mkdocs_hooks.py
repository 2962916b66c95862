"""MkDocs hook (mkdocs.yml, `hooks:`): links from a page to a file of the repository outside
docs/ (`../bench/README.md`, `../memory_service/config.py`).

The pages are read in two places: on the repository's web view, where such a relative link
works, and on the built site, which holds docs/ alone. So a page keeps the relative link,
and the site build rewrites it: to the file on the repository's web view when mkdocs.yml sets
``repo_url`` (``{repo_url}/blob/{branch}/{path}``, ``extra.source_branch``, default main),
else to the path as code, which names the file without a link that would break. A link to
a file that does not exist warns, so `mkdocs build --strict` fails on it as it does on a
broken link between pages.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.outside_links")

# [text](target) or [text](target#anchor), target relative (no scheme, not absolute).
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]*)\]\((?P<target>(?![a-z][a-z0-9+.-]*:|/|#)[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")


def rewrite_outside_links(markdown: str, page_path: str, docs_dir: Path, repo_root: Path,
                          repo_url: str | None, branch: str = "main") -> str:
    """``markdown`` of the page at ``page_path`` (relative to ``docs_dir``) with each link to a
    file outside docs/ rewritten; links inside docs/ are left to MkDocs."""
    docs_prefix = docs_dir.resolve().relative_to(repo_root.resolve()).as_posix()

    def rewrite(match: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(docs_prefix, posixpath.dirname(page_path), match["target"]))
        if target == docs_prefix or target.startswith(docs_prefix + "/"):
            return match[0]
        if target.startswith("../") or not (repo_root / target).exists():
            log.warning("%s links to %s, which is not a file of the repository", page_path, match["target"])
            return match[0]
        if repo_url:
            kind = "tree" if (repo_root / target).is_dir() else "blob"
            return f"[{match['text']}]({repo_url.rstrip('/')}/{kind}/{branch}/{target}{match['anchor'] or ''})"
        text = match["text"].strip("`")
        return f"`{target}`" if text == target else f"{match['text']} (`{target}`)"

    return _LINK.sub(rewrite, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"])
    repo_root = Path(config["config_file_path"]).resolve().parent
    branch = (config.get("extra") or {}).get("source_branch", "main")
    return rewrite_outside_links(markdown, page.file.src_uri, docs_dir, repo_root, config.get("repo_url"), branch)
