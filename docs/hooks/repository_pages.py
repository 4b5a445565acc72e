"""Repository files that are pages of the site as they stand: README.md is the home page, deploy/README.md the
deployment page.

Each stays where a reader of the repository looks for it, and is read from there at build time: one copy of
each text, readable on both. Links are written for the repository (README.md links `docs/operators.md`,
docs/operators.md links `../deploy/README.md`), so every page's relative links are resolved from the page's
place in the repository and rewritten to the site page the target has become; a target that is neither in
`docs/` nor one of these pages is left as written, and `mkdocs build --strict` refuses it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File

PAGES = {"README.md": "index.md", "deploy/README.md": "deploy.md"}
"""Repository path -> the page it is in the site."""
DOCS = "docs/"
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")
"""An inline Markdown link or image with a relative or absolute target, and its anchor."""


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the repository's pages to the site's files."""
    root = Path(config.config_file_path).parent
    for source, target in PAGES.items():
        files.append(File.generated(config, target, abs_src_path=str(root / source)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: resolve links from where the page is in the repository."""
    return rewrite(markdown, page.file.src_uri)


def rewrite(markdown: str, page: str) -> str:
    """`markdown`, the text of the site page `page`, with each repository link turned into a link between pages."""
    sources = {target: source for source, target in PAGES.items()}
    here = posixpath.dirname(sources.get(page, DOCS + page))

    def site_link(found: re.Match[str]) -> str:
        target = found.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return found.group(0)
        resolved = posixpath.normpath(posixpath.join(here, target))
        if resolved in PAGES:
            in_site = PAGES[resolved]
        elif resolved.startswith(DOCS):
            in_site = resolved[len(DOCS) :]
        else:
            return found.group(0)
        relative = posixpath.relpath(in_site, posixpath.dirname(page) or ".")
        return f"{found.group(1)}{relative}{found.group(3) or ''}{found.group(4)}"

    return LINK.sub(site_link, markdown)
