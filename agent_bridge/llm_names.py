"""Tool names as LLM function-calling APIs accept them.

Our tool names may hold dots and run to 128 characters (`NAME_PATTERN`), so
that services can namespace them (`acme.search.v2`). OpenAI's function names
may not: `^[a-zA-Z0-9_-]{1,64}$`, and a request carrying one such name is
refused whole. `as_openai_tools()` therefore gives each tool a name the API
takes, and `ToolSet.invoke` accepts that name back, so an agent can pass the
model's tool call straight through.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
_KEEP = 55  # leaves room for "_" and an 8-character hash within 64


def openai_names(names: Iterable[str]) -> dict[str, str]:
    """Each tool name -> a name OpenAI accepts; one-to-one, and the identity for names already valid.

    A name is changed only as far as it must be (`.` becomes `_`); one that
    is then too long, or would take a name another tool already has, ends in
    a short hash of the original, so it stays the same from reload to reload.
    """
    given = sorted(set(names))
    taken = {name for name in given if OPENAI_NAME.match(name)}
    mapping: dict[str, str] = {}
    for name in given:
        if name in taken:
            mapping[name] = name
            continue
        safe = _NOT_ALLOWED.sub("_", name)
        if len(safe) > 64 or safe in taken:
            safe = f"{safe[:_KEEP]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        taken.add(safe)
        mapping[name] = safe
    return mapping
