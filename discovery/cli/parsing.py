"""The parser class of every `toolreg` command: whole option names only, and errors in the subcommand's own words.

argparse's defaults fit `toolreg` badly in two ways:

- it takes any unambiguous prefix of a long option for the option
  (`allow_abbrev`): `toolreg call tell-joke --topic cats` was read as
  `--topicspace cats` and sent the call to another deployment. Every parser
  here is built with `allow_abbrev=False`, so an option is recognised only by
  its whole name (`tests/cli/test_parsing.py` walks the whole tree);
- an argument no subcommand takes is reported by the top-level parser, with
  the top-level usage (`toolreg [-h] ... COMMAND`), which says nothing of the
  command the user was typing. A subcommand's parser here refuses what it
  does not take itself, with its own usage, and can add a hint (`toolreg
  call` says how tool arguments are written).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

Hint = Callable[[list[str], Sequence[str]], str]
"""Given the arguments a parser did not take and all it was given, one more sentence for the error (or "")."""


class Parser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` without prefix matching of long options; the class of every `toolreg` parser."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


class CommandParser(Parser):
    """A subcommand's parser: an argument it does not take is its own error, with its usage and its `hint`."""

    hint: Hint | None = None

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # a subcommand under this one has refused its own already: these are this parser's
            said = f"unrecognized arguments: {' '.join(extras)}"
            more = self.hint(extras, list(args or ())) if self.hint is not None else ""
            self.error(f"{said}; {more}" if more else said)
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        """The subcommand's usage, then the one line (exit code 2, as argparse does)."""
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def subcommands(parser: argparse.ArgumentParser, **kwargs: Any) -> Any:
    """`parser.add_subparsers(...)` whose parsers are `CommandParser`s."""
    return parser.add_subparsers(parser_class=CommandParser, **kwargs)


def parent(*parents: argparse.ArgumentParser) -> Parser:
    """A parser that only lends its options to others (`parents=[...]`)."""
    return Parser(add_help=False, parents=list(parents))


def every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every subcommand's parser under it, each once."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                found.extend(every_parser(sub))
    return found
