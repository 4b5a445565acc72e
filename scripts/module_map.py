"""Write the "Every module" section of docs/architecture.md from the modules' own docstrings.

The section lists each product module with the first sentence of its docstring, so the map a reader opens names
every room, and says of each what its author wrote about it. `tests/test_architecture_map.py` fails when the section
and the tree disagree (a module added, moved or removed, or its docstring's first sentence changed); run this to
bring it up to date:

    python scripts/module_map.py            # rewrite the section in place
    python scripts/module_map.py --check    # exit 1 if the section is not what the tree says
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("toolservice_base", "agent_bridge", "discovery")
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module-map: begin (scripts/module_map.py writes this section) -->"
END = "<!-- module-map: end -->"


def modules() -> list[Path]:
    """Every product module, package by package, in the order a reader goes down the layers."""
    found: list[Path] = []
    for package in PACKAGES:
        found.extend(sorted((ROOT / package).rglob("*.py"), key=lambda p: p.relative_to(ROOT).parts))
    return [p.relative_to(ROOT) for p in found]


def first_sentence(path: Path) -> str:
    """A module's docstring up to its first paragraph's end, on one line (a table cell holds no line break)."""
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text())) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    if not paragraph:
        raise SystemExit(f"{path} has no docstring: say in one sentence what the module is for, then run this again")
    return paragraph.replace("|", "\\|")


def section() -> str:
    rows = []
    for path in modules():
        rows.append(f"| `{path.as_posix()}` | {first_sentence(path)} |")
    return "\n".join([BEGIN, "", "| module | what it is for |", "| --- | --- |", *rows, "", END])


def current(text: str) -> str | None:
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), text, re.S)
    return match.group(0) if match else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the section is up to date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    old = current(text)
    if old is None:
        print(f"{DOC.name} has no module-map markers: add the two lines {BEGIN!r} and {END!r}", file=sys.stderr)
        return 2
    new = section()
    if args.check:
        if old != new:
            print(f"{DOC.name}'s module map is out of date: run python scripts/module_map.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text.replace(old, new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
