"""Writes `toolservice_base/lookalikes.py`, the table `toolservice_base.names` folds tool names with.

Usage: python scripts/lookalikes_table.py confusables.txt > toolservice_base/lookalikes.py

The input is Unicode's confusables.txt (Unicode Security Mechanisms, UTS #39), the data UTS #39 skeletons are
made of. Kept: each character whose prototype is made only of what a tool name may hold (ASCII letters, digits,
`-`, `_`, `.`) or spaces. A name is ASCII (`NAME_PATTERN`), so a lookalike of one can only have an ASCII
skeleton: the rest of the file (about three quarters of it) never decides whether two tool names look alike.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

KEPT = re.compile(r"^[A-Za-z0-9_. -]+$")
WIDTH = 100


def entries(path: str) -> tuple[str, dict[str, str]]:
    """The file's version line, and each kept character -> its prototype."""
    version, table = "", {}
    with open(path, encoding="utf-8-sig") as source:
        for line in source:
            if line.startswith("# Version:"):
                version = line[2:].strip()
            data = line.split("#", 1)[0].strip()
            if not data:
                continue
            char, prototype, _ = (part.strip() for part in data.split(";"))
            target = "".join(chr(int(code, 16)) for code in prototype.split())
            if KEPT.match(target):
                table[chr(int(char, 16))] = target
    return version, table


def tokens(table: dict[str, str]) -> list[str]:
    """The table as Python string-literal pieces, one per character: `prototype TAB characters NEWLINE`, per
    prototype. Characters outside ASCII are escaped, so the module is plain ASCII whatever a font shows."""
    by_target: dict[str, list[str]] = defaultdict(list)
    for char, target in sorted(table.items()):
        by_target[target].append(char)
    out: list[str] = []
    for target, chars in sorted(by_target.items()):
        out += [*target, "\\t"]
        out += [f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}" for c in chars]
        out.append("\\n")
    return out


def main(path: str) -> None:
    version, table = entries(path)
    print('"""Characters that look like what a tool name may hold, and what they look like: generated, do not edit.')
    print()
    print(
        f"From Unicode's confusables.txt (UTS #39, {version}) by scripts/lookalikes_table.py, which says what is kept."
    )
    print("`DATA` is one line per prototype: the prototype, a tab, then every character that looks like it.")
    print('"""')
    print()
    print("DATA = (")
    line = ""
    for token in tokens(table):
        if len(line) + len(token) > WIDTH:
            print(f'    "{line}"')
            line = ""
        line += token
    if line:
        print(f'    "{line}"')
    print(")")


if __name__ == "__main__":
    main(sys.argv[1])
