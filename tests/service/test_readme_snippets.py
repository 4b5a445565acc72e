"""What the tool authors' guide's testing snippet installs is light. (The snippets themselves, the `ServiceHarness`
test with pytest in a directory of its own and the agent example, run with every other block in
tests/test_readme.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def guide_block(section: str, language: str = "python") -> str:
    """The first ```language block under the heading `section` of the tool authors' guide."""
    text = (ROOT / "docs" / "guide" / "tool-authors.md").read_text()
    start = text.index(f"{section}\n")
    end = text.find("\n##", start + len(section))  # the next heading (a code comment has one #)
    found = re.search(rf"```{language}\n(.*?)```", text[start : end if end != -1 else None], re.S)
    assert found, f"no {language} block under {section!r}"
    return found.group(1)


def test_the_testing_extra_is_light_and_named_where_the_snippet_is() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert sorted(re.split(r"[<>=!~ ]", requirement)[0] for requirement in extras["testing"]) == [
        "pytest",
        "pytest-asyncio",
    ]
    assert "[testing]'" in guide_block("## Testing a service, with no broker", "sh")
