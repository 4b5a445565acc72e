"""How a listing is printed: `-o table|wide|json|yaml|name` and `--no-headers`, as kubectl users expect.

Every command that prints a table (`tools`, `rejections`, `conflicts`,
`pending`, `replicas`, `trust list`) takes the same options and prints its
rows through `render`, from one description of its columns:

- `table` (the default): the columns a person needs, aligned; `wide` adds
  the ones that make a row long (full digests, workspace, versions);
- `json` (also `--json`, kept as it was) and `yaml`: every field of every
  row, for scripts;
- `name`: one name per line, for `xargs` and shell loops;
- `--no-headers`: a table without its header line, and without the line that
  says there is nothing (so an empty listing is empty output).

Whatever a command prints, on stdout or stderr, goes through `screened`: control
characters and bidi controls a stranger put in a description, a config value or
a tool's answer reach the terminal as visible escapes (`discovery.shown`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TextIO, TypeVar, cast

from discovery.shown import shown

from .common import CommandError

T = TypeVar("T")

FORMATS = ("table", "wide", "json", "yaml", "name")


def add_output_options(parser: argparse.ArgumentParser, *, wide: str, name: str) -> None:
    """`-o FORMAT` and `--no-headers`; `wide` and `name` say what the wide columns and a row's name are."""
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=None,
        metavar="FORMAT",
        help=(
            f"table (default), wide (also {wide}), json or yaml (every field of every row), or name (the {name} of"
            " each row, one per line)"
        ),
    )
    parser.add_argument(
        "--no-headers", action="store_true", help="print the table without its header line (nothing when empty)"
    )


def output_format(args: argparse.Namespace) -> str:
    """`-o`, else `json` for `--json`, else `table`; `--json` beside another `-o` is one line."""
    chosen: str | None = getattr(args, "output", None)
    if getattr(args, "json", False):
        if chosen not in (None, "json"):
            raise CommandError(f"--json and -o {chosen} ask for two formats: give one")
        return "json"
    return chosen or "table"


@dataclass(frozen=True)
class Column(Generic[T]):
    header: str
    cell: Callable[[T], str]
    wide: bool = False
    """Only with `-o wide`."""
    narrow: bool = False
    """Only without `-o wide` (a short form of a column `wide` gives whole)."""


def render(
    args: argparse.Namespace,
    rows: Sequence[T],
    columns: Sequence[Column[T]],
    *,
    name: Callable[[T], str],
    record: Callable[[T], Any],
    empty: str,
) -> str:
    """Print `rows` as `args` asks; returns the format used (a command adds what follows a table, e.g. diffs)."""
    chosen = output_format(args)
    if chosen == "json":
        print(json.dumps([record(row) for row in rows], indent=2, ensure_ascii=False))
    elif chosen == "yaml":
        import yaml  # only this format needs it

        print(yaml.safe_dump([record(row) for row in rows], sort_keys=False, allow_unicode=True), end="")
    elif chosen == "name":
        for row in rows:
            print(name(row))
    elif not rows:
        if not getattr(args, "no_headers", False):
            print(empty)
    else:
        shown = [column for column in columns if (column.narrow if chosen == "wide" else column.wide) is False]
        print(
            table(
                [column.header for column in shown],
                [[column.cell(row) for column in shown] for row in rows],
                header_line=not getattr(args, "no_headers", False),
            )
        )
    return chosen


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, header_line: bool = True) -> str:
    """Rows aligned under `headers` (nothing after the last column is padded); `header_line=False` leaves it out."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip()
        for row in ([headers] if header_line else []) + list(rows)
    )


class ScreenedStream:
    """A text stream that writes what it is given `shown` to `raw`; anything else (`buffer`, `fileno`, `isatty`)
    is `raw`'s own, so binary writers (`toolreg mcp` over stdio) and terminal checks see the real stream."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(shown(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


@contextlib.contextmanager
def screened() -> Iterator[None]:
    """While a command runs, everything it prints on stdout and stderr `shown`; the streams as they were after.

    The output boundary, one for every command, rather than a call at each print: a listing, `config get`, a
    tool's streamed answer, an error quoting a stranger's text are all covered, and a new command is too. Logs keep
    the stream they were given before (`configure_logging`): their renderer escapes on its own, and colours them.
    """
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = cast(TextIO, ScreenedStream(out)), cast(TextIO, ScreenedStream(err))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
