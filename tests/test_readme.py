"""Every fenced block of README.md, then of the guide's pages, runs as it is written, in order, as one reader's
session pastes it.

One embedded broker for the whole run: the README's own `toolreg up &`, in a fresh directory, with the product's
commands on PATH and nothing in the environment pointing anywhere else. A guide page goes on from the README and
the pages before it (its services still up, its files still there). The blocks that cannot run there (a remote
cluster, an API key, a download) say so above themselves, with why (`support.readme`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support.readme import Block, Session, blocks, commands, run_blocks

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"
PAGES = [
    README,
    GUIDE / "tool-authors.md",
    GUIDE / "agents.md",
    GUIDE / "mcp.md",
    GUIDE / "operating.md",
    GUIDE / "contributing.md",
]
"""The order a newcomer takes them in, and the session runs them in."""
REFERENCE_PAGES = [ROOT / "docs" / "operators.md", ROOT / "deploy" / "README.md", ROOT / "docs" / "architecture.md"]
"""The site's other written pages, run after them: each block runs, or says above itself why it cannot (a cluster,
a container engine, what a command prints, a diagram). The CLI and API references are generated, not written."""


def every_block(pages: list[Path] = PAGES) -> list[Block]:
    return [block for page in pages for block in blocks(page.read_text(), str(page.relative_to(ROOT)))]


def test_every_guide_page_is_run() -> None:
    """A new page of the guide is a page whose blocks run: it must take its place in the reader's order."""
    assert set(GUIDE.glob("*.md")) == set(PAGES[1:])


def test_every_written_page_of_the_site_is_run() -> None:
    """Every page in the site's navigation (mkdocs.yml) is one whose blocks the session runs, but the generated
    references; the home page is README.md and "Deploying" deploy/README.md (docs/hooks/repository_pages.py)."""
    import yaml

    def leaves(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, dict):
            return [leaf for value in nav.values() for leaf in leaves(value)]
        assert isinstance(nav, list)
        return [leaf for item in nav for leaf in leaves(item)]

    outside = {"index.md": README, "deploy.md": ROOT / "deploy" / "README.md"}
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = [page for page in leaves(site["nav"]) if not page.startswith("reference/")]
    written = {outside.get(page, ROOT / "docs" / page) for page in pages}
    assert written == set(PAGES) | set(REFERENCE_PAGES)


@pytest.mark.timeout(300)  # about 20 s; each command is bounded on its own (support.readme)
def test_the_readme_and_the_guide_run_as_written(tmp_path: Path) -> None:
    found = every_block()
    reference = every_block(REFERENCE_PAGES)
    run = tmp_path / "run"
    run.mkdir()
    pointing = ("PULSAR_", "TOOLREG_", "PYTHON", "PYTEST_", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(pointing)}
    env.update(PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", HOME=str(tmp_path / "home"))
    session = Session(run, env, tmp_path / "session.log")
    try:
        skipped = run_blocks(found, session)
        run_blocks(reference, session)
    finally:
        session.close()
    assert len(skipped) < len(found) / 2, skipped  # most of what a newcomer reads runs
    said = (tmp_path / "session.log").read_text()
    # the README: its first call, its service, and its agent's call once the calculator arrived
    assert "I would tell you a joke about cats" in said and "A groan-worthy pun about brokers" in said
    assert "42" in said
    assert "6.21" in said  # the guide for tool authors: the units service
    # the agents' guide: pydantic-ai's TestModel called the live tool
    assert '{"tell-joke":"I would tell you a joke about a' in said


def test_the_example_services_do_not_take_the_shipped_examples_names() -> None:
    """Pasted beside `toolreg serve ...JokeService`, a README or guide service with the joke service's id would
    silently join it as one service (answers alternating between the two), and one with its tool's name would be
    refused."""
    import re

    from toolservice_base.examples import calculator, countdown, echo, joke

    shipped = [joke.JokeService, calculator.CalculatorService, countdown.CountdownService, echo.EchoService]
    taken_ids = {cls.descriptor["id"] for cls in shipped}
    taken_tools = {tool["name"] for cls in shipped for tool in cls.tools}
    code = "\n".join(block.text for block in every_block() if block.language == "python")
    ids = set(re.findall(r'descriptor = \{"id": "([^"]+)"', code))
    tools = set(re.findall(r'"name": "([^"]+)",\s*"description"', code))
    assert ids and tools
    assert not ids & taken_ids and not tools & taken_tools, (ids & taken_ids, tools & taken_tools)


def test_the_runner_reads_markers_commands_and_here_documents() -> None:
    text = (
        "<!-- readme-test: skip needs a cluster -->\n```sh\nx\n```\n\n"
        "<!-- readme-test: file a.py -->\n\n```python\nprint(1)\n```\n```json\n{}\n```\n"
    )
    assert blocks(text) == [
        Block("sh", "x\n", 2, "skip", "needs a cluster"),
        Block("python", "print(1)\n", 8, "file", "a.py"),
        Block("json", "{}\n", 11),
    ]
    script = "toolreg up &   # comment\n# only a comment\ncat > f <<'EOF'\n{\n}\nEOF\nls \\\n  -l\n"
    assert commands(script) == ["toolreg up &   # comment", "cat > f <<'EOF'\n{\n}\nEOF", "ls \\\n  -l"]
    quoted = 'toolreg config put tool/x --value \'{"a": 1,\n  "b": 2}\'\necho done   # the store\'s own quote\nls\n'
    assert commands(quoted) == [
        'toolreg config put tool/x --value \'{"a": 1,\n  "b": 2}\'',  # a value over two lines is one command
        "echo done   # the store's own quote",  # a quote in a comment opens nothing
        "ls",
    ]


def test_a_skip_marker_without_a_reason_is_refused(tmp_path: Path) -> None:
    session = Session(tmp_path, {"PATH": "/usr/bin:/bin"}, tmp_path / "log")
    try:
        with pytest.raises(AssertionError, match="must say why"):
            run_blocks([Block("sh", "false\n", 1, "skip", "")], session)
        with pytest.raises(AssertionError, match="exited 1"):
            run_blocks([Block("sh", "true\nfalse\n", 1)], session)
    finally:
        session.close()
