"""The documentation site's generated parts: the command-line reference is the parser's, whole, and links written
for the repository land on the site's pages.

The build itself (`mkdocs build --strict`: every link, anchor and API reference resolves) runs in `make test`.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from discovery.cli.main import build_parser
from discovery.cli.parsing import every_parser

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def hook(name: str) -> ModuleType:
    """A hook module as mkdocs loads it: from its file, by path."""
    spec = importlib.util.spec_from_file_location(name, HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_has_every_command_and_every_option() -> None:
    parser = build_parser()
    page = hook("cli_reference").render(parser)
    headings = re.findall(r"^#{2,6} (toolreg.*)$", page, re.M)
    parsers = every_parser(parser)
    assert headings == [p.prog for p in parsers]  # each once, in the parser's order
    assert {"toolreg up", "toolreg config put", "toolreg store restore", "toolreg trust add"} <= set(headings)
    sections = dict(zip(headings, re.split(r"^#{2,6} toolreg.*$", page, flags=re.M)[1:]))
    shared = {o for a in parser._actions for o in a.option_strings}
    for sub in parsers:
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help") and (sub is parser or option not in shared):
                    assert f"`{option}" in sections[sub.prog] or f", {option}" in sections[sub.prog], (sub.prog, option)
    # help text is shown as written: a `*` in a path pattern is not emphasis, `<data-dir>` is not an HTML tag
    assert "tool-service/\\*.json" in page and "&lt;data-dir&gt;/backups" in page and "<data-dir>/backups" not in page


def test_the_cli_reference_page_has_its_marker() -> None:
    cli = hook("cli_reference")
    assert cli.MARKER in (ROOT / "docs" / cli.PAGE).read_text()


@pytest.mark.parametrize(
    ("page", "written", "in_site"),
    [
        ("index.md", "[ops](docs/operators.md#running-replicas)", "[ops](operators.md#running-replicas)"),
        ("index.md", "![page](docs/registry-page.png)", "![page](registry-page.png)"),
        ("index.md", "[guide](docs/guide/mcp.md)", "[guide](guide/mcp.md)"),
        ("index.md", "[deploy](deploy/README.md)", "[deploy](deploy.md)"),
        ("operators.md", "[deploy/README.md](../deploy/README.md)", "[deploy/README.md](deploy.md)"),
        ("deploy.md", "[ops](../docs/operators.md)", "[ops](operators.md)"),
        ("guide/mcp.md", "[home](../../README.md#calling-tools)", "[home](../index.md#calling-tools)"),
        ("guide/mcp.md", "[ops](../operators.md)", "[ops](../operators.md)"),
        # neither in docs/ nor a page: left as written, for --strict to refuse
        ("guide/mcp.md", "[results](../../bench/RESULTS.md)", "[results](../../bench/RESULTS.md)"),
        ("index.md", "<https://example.com/x.md>, [x](https://example.com/docs/a.md)", None),
    ],
)
def test_repository_links_are_rewritten_to_site_pages(page: str, written: str, in_site: str | None) -> None:
    assert hook("repository_pages").rewrite(written, page) == (in_site or written)
