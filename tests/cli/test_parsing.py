"""The whole `toolreg` command line: long options by their whole name only, errors in the subcommand's own words.

argparse takes an unambiguous prefix of a long option for the option unless told not to: `toolreg call tell-joke
--topic cats` ran as `--topicspace cats`. Every parser of the tree is checked here, and so is what each subcommand
says of an argument it does not take.
"""

from __future__ import annotations

import argparse

import pytest

from discovery.cli.main import build_parser
from discovery.cli.parsing import every_parser


def tree() -> list[tuple[str, argparse.ArgumentParser]]:
    return [(parser.prog, parser) for parser in every_parser(build_parser())]


def recognised(parser: argparse.ArgumentParser, word: str) -> bool:
    """Whether `parser` takes `word` for one of its options (argparse's own lookup; a list of matches since 3.12)."""
    found = parser._parse_optional(word)  # type: ignore[attr-defined]
    if found is None:
        return False
    if isinstance(found, tuple):
        return found[0] is not None
    return any(match[0] is not None for match in found)


def test_the_tree_is_every_command() -> None:
    progs = {prog for prog, _ in tree()}
    assert {"toolreg", "toolreg call", "toolreg config list", "toolreg store export", "toolreg trust add"} <= progs
    assert len(progs) > 30


@pytest.mark.parametrize(("prog", "parser"), tree(), ids=[prog for prog, _ in tree()])
def test_no_parser_takes_a_prefix_of_a_long_option_for_the_option(prog: str, parser: argparse.ArgumentParser) -> None:
    assert parser.allow_abbrev is False, f"{prog} would take a prefix of a long option for the option"
    options = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
    for option in options:
        for cut in range(3, len(option)):
            prefix = option[:cut]
            if prefix not in options:
                assert not recognised(parser, prefix), f"{prog} takes {prefix} for {option}"


def leaves() -> list[list[str]]:
    found = []
    for prog, parser in tree():
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            found.append(prog.split()[1:])
    return found


@pytest.mark.parametrize("path", leaves(), ids=[" ".join(path) for path in leaves()])
def test_an_argument_a_subcommand_does_not_take_is_its_own_error_with_its_own_usage(
    path: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--no-such-option"])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    command = " ".join(["toolreg", *path])
    assert said.startswith(f"usage: {command} "), said
    assert said.strip().splitlines()[-1].startswith(f"{command}: error: "), said


def test_an_unknown_option_of_a_command_with_all_it_needs_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["config", "list", "tool", "--jsn"])
    said = capsys.readouterr().err
    assert said.startswith("usage: toolreg config list ")
    assert said.strip().splitlines()[-1] == "toolreg config list: error: unrecognized arguments: --jsn"
