"""The names MCP and OpenAI-style clients call tools by, worked out in one place.

Our tool names may hold dots and run to 128 characters (`NAME_PATTERN`), so
that services can namespace them (`acme.search.v2`). OpenAI's function names
may not: `^[a-zA-Z0-9_-]{1,64}$`, and a request carrying one such name is
refused whole. So clients are shown another name for such a tool
(`client_name`): `acme.search` is listed as `acme_search`.

Two layers use this, and must agree: the agent bridge (`ToolSet.as_openai_tools`,
the MCP front) lists tools under these names and resolves a call back, and
the registry refuses a newcomer whose client-visible name is one another
tool already has, so a name a client was shown never moves to another tool.
Both import it from here (the bridge and the registry never import each other).

Names are compared here too (`name_keys`): two names collide when a person or a
model could take one for the other, not only when they are equal. `tell-joke`,
`TELL-JOKE`, `tell_joke`, `tell.joke`, `tell-joke_` and `tеll-joke` (a Cyrillic
`е`) are one name: case, separators (`-`, `_`, `.`, spaces, dashes of any kind,
runs of them, at either end), invisible characters and the UTS #39 confusables
(`lookalikes`, generated from Unicode's data) fold away. The registry refuses a
tool whose name collides so with another service's as a name conflict.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

from .lookalikes import DATA

__all__ = ["OPENAI_NAME", "ascii_lookalikes", "client_name", "fold_name", "name_keys", "openai_names"]

OPENAI_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
_PROTOTYPES: dict[str, str] = {
    char: prototype
    for line in DATA.rstrip("\n").split("\n")
    for prototype, chars in [line.split("\t")]
    for char in chars
}
"""Character -> the ASCII it looks like (UTS #39 confusables, `lookalikes`)."""
_SEPARATORS = re.compile(r"[\s._\-]+")


def _skeleton(text: str) -> str:
    """UTS #39's skeleton, over the characters that can look like a name's: NFD, each character as its prototype,
    NFD again. Invisible characters (format and control: zero-width spaces, bidi marks) go first."""
    text = "".join(char for char in unicodedata.normalize("NFD", text) if unicodedata.category(char)[0] != "C")
    return unicodedata.normalize("NFD", "".join(_PROTOTYPES.get(char, char) for char in text))


def _separated(text: str) -> str:
    """Every run of separators as one `_`, none at either end: `-`, `_`, `.`, whitespace, any dash (the
    skeleton made dashes `-`)."""
    return _SEPARATORS.sub("_", text).strip("_")


@lru_cache(maxsize=65_536)
def fold_name(name: str, *, case_first: bool = True) -> str:
    """What is left of `name` once what cannot tell two names apart to a reader is taken away: case, lookalike
    characters, invisible ones, the choice and number of separators. `tell-joke`, `TELL-JOKE`, `tell_joke ` and
    `tеll‐joke` all fold to `tell_joke`.

    `case_first` folds case before the skeleton (`TOOLI` is `tooli`); without it, after (`toolI` looks like
    `tooll`, its `I` like an `l`): `name_keys` takes both, so either likeness makes a collision.
    """
    if case_first:
        name = name.casefold()
    return _separated(_skeleton(name).casefold())


@lru_cache(maxsize=65_536)
def name_keys(name: str) -> frozenset[str]:
    """Keys two tool names collide by when they share one: both folds of the name (`fold_name`) and the fold of the
    name clients are shown (`client_name`: a long name's shortened one ends in a hash of it, and another name may
    be spelled like that)."""
    return frozenset({fold_name(name), fold_name(name, case_first=False), fold_name(client_name(name))})


def ascii_lookalikes(text: str) -> str:
    """`text` with each character that looks like ASCII (a Cyrillic `е`, the hyphen U+2010, a no-break space)
    written as the ASCII it looks like; other characters as they are. For names mapped from elsewhere (an MCP
    server's), so a lookalike of a name is mapped onto that name, not to a new one that merely looks like it."""
    return "".join(_PROTOTYPES.get(char, char) if ord(char) > 127 else char for char in text)


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
