"""The names MCP and OpenAI-style clients call tools by, worked out in one place.

Our tool names may hold dots and run to 128 characters (`NAME_PATTERN`), so
that services can namespace them (`acme.search.v2`). OpenAI's function names
may not: `^[a-zA-Z0-9_-]{1,64}$`, and a request carrying one such name is
refused whole. So clients are shown another name for such a tool
(`client_name`): `acme.search` is listed as `acme_search`.

Two layers use this, and must agree: the agent bridge (`agent_bridge.llm_names`,
the MCP front) lists tools under these names and resolves a call back, and
the registry refuses a newcomer whose client-visible name is one another
tool already has, so a name a client was shown never moves to another tool.
Both import it from here (the bridge and the registry never import each other).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from functools import lru_cache

__all__ = ["OPENAI_NAME", "client_name", "openai_names"]

OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


def _hashed(safe: str, name: str, length: int = 8) -> str:
    """`safe` cut to leave room for "_" and `length` characters of a hash of `name`, within 64."""
    return f"{safe[: 64 - 1 - length]}_{hashlib.sha256(name.encode()).hexdigest()[:length]}"


@lru_cache(maxsize=65_536)
def client_name(name: str) -> str:
    """The name clients are shown for the tool `name`, when no other tool claims it first.

    A name OpenAI accepts is its own client name. Otherwise it is changed only
    as far as it must be (`.` becomes `_`), and one that is then over 64
    characters is cut and ends in a short hash of the whole name, so it stays
    the same from reload to reload. Two tools with one client name collide:
    the registry refuses the later one as a conflict.
    """
    if OPENAI_NAME.match(name):
        return name
    safe = _NOT_ALLOWED.sub("_", name)
    return safe if len(safe) <= 64 else _hashed(safe, name)


def openai_names(names: Iterable[str]) -> dict[str, str]:
    """Each tool name -> a name OpenAI accepts; one-to-one, and the identity for names already valid.

    Each name gets its `client_name`. Names the registry let in never share
    one; should a set still hold two that do (static items written by hand),
    the name that is valid as it is keeps it, and the other ends in a short
    hash of its original (longer hashes if even that is taken), so the same
    set always maps the same way.
    """
    given = sorted(set(names))
    taken = {name for name in given if OPENAI_NAME.match(name)}
    mapping: dict[str, str] = {}
    for name in given:
        if name in taken:
            mapping[name] = name
            continue
        safe = client_name(name)
        length = 8
        while safe in taken and length <= 56:  # 8 hex characters do it, unless a name was chosen to collide
            safe = _hashed(_NOT_ALLOWED.sub("_", name), name, length)
            length += 8
        taken.add(safe)
        mapping[name] = safe
    return mapping
