"""A MkDocs hook: files of the repository outside ``docs/`` that a page links to.

The pages are read on the code host as well as on the site, so a page links to a chart kept
with its benchmark (``../../benchmarks/results/drain.png``) by its path in the repository. This
copies each such file into the site under ``repo/`` and points the page's link there; a link
into the repository whose file does not exist is left alone, for the build to report.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

PREFIX = "repo"
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
_targets: dict[str, str] = {}  # page src_uri + link -> repository path


def _outside(page_uri: str, link: str) -> str | None:
    """The repository path a relative link leaves ``docs/`` for, if it does."""
    if "://" in link or link.startswith(("#", "/", "mailto:")):
        return None
    path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), link.split("#")[0]))
    return None if path.startswith(("docs/", "../")) or path.endswith(".md") else path


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    root = Path(config.config_file_path).parent
    _targets.clear()
    for page_file in list(files.documentation_pages()):
        for _, link, _ in LINK.findall(Path(page_file.abs_src_path or "").read_text()):
            path = _outside(page_file.src_uri, link)
            if path is None or not (root / path).is_file():
                continue
            _targets[page_file.src_uri + "\0" + link] = path
            if files.get_file_from_path(f"{PREFIX}/{path}") is None:
                files.append(File.generated(config, f"{PREFIX}/{path}", abs_src_path=str(root / path)))
    return files


def on_page_markdown(markdown: str, page: Page, **kwargs: Any) -> str:
    def point(match: re.Match[str]) -> str:
        path = _targets.get(page.file.src_uri + "\0" + match.group(2))
        if path is None:
            return match.group(0)
        up = posixpath.relpath(f"{PREFIX}/{path}", posixpath.dirname(page.file.src_uri) or ".")
        return f"{match.group(1)}{up}{match.group(3)}"

    return LINK.sub(point, markdown)
