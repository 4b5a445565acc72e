"""Text from strangers as it reaches a screen: control characters and bidi controls written as visible escapes.

A tool's title and description, a config value, a tool's answer, a refusal's reason: anyone who can publish
wrote them. On a terminal ESC opens a control sequence (`ESC[2J` clears the screen, others retitle the window or
rewrite what was printed), NUL, DEL and the C1 controls are commands to some terminals, and carriage return
rewrites its line; on a terminal and in a browser alike, the bidi controls (U+202E RIGHT-TO-LEFT OVERRIDE and its
kin) reorder what follows them, so a line reads other than it is. `shown` writes each of them as the escape
`\\uXXXX` (ESC as `\\u001b`, U+202E as `\\u202e`): visible, and in JSON text the very escape JSON reads back as
the same character, so `toolreg ... -o json` stays the same data. Newline and tab are kept: output is laid out
with them. Everything else, letters of every script included, is left as it is.

Used at the output boundaries only: `toolreg` writes everything through it (`discovery.cli.output.screened`), and
the registry page renders every value through it, in its HTML and in the JSON its script draws from
(`discovery.web`).
"""

from __future__ import annotations

import re
from typing import Any

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but tab and newline, DEL, C1 controls, and the bidi marks, embeddings, overrides and isolates."""


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def shown(text: str) -> str:
    """`text` with every character of `UNSAFE` written as its `\\uXXXX` escape."""
    return UNSAFE.sub(_escape, text)


def shown_data(value: Any) -> Any:
    """`value` (JSON data: dicts, lists, strings, numbers) with every string in it, keys too, `shown`."""
    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {shown(key): shown_data(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shown_data(item) for item in value]
    return value
