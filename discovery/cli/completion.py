"""`toolreg completion bash|zsh|fish`: a shell completion script, generated from the real parser.

The script is written by `shtab` from the very `build_parser()` every
command runs, so it names each command, subcommand, flag and choice there is
and cannot drift from them. It is static: completing a word runs no Python
and asks no broker (unlike `argcomplete`, whose hook runs the program on
every Tab).

`toolreg completion SHELL` itself is `main.cmd_completion`: it writes the
script of `main.build_parser()`, which this module does not import.

The parser declares which arguments are paths only by their names
(`--data-dir`, `--trust-policy PATH`, `keygen PATH`), so `path_kind` reads
them off there and the script completes file or directory names for those.
"""

from __future__ import annotations

import argparse
from typing import Literal

from .parsing import every_parser

SHELLS = ("bash", "zsh", "fish")
PathKind = Literal["file", "directory"]


def path_kind(action: argparse.Action) -> PathKind | None:
    """Whether an argument takes a file or a directory name, by what the parser calls it; None for anything else."""
    if action.choices is not None or action.nargs == 0:
        return None
    dest, metavar = action.dest, str(action.metavar or "")
    if dest == "dir" or dest.endswith("_dir"):
        return "directory"
    if metavar == "PATH" or metavar.endswith(".JSON") or dest == "path" or dest.endswith(("_file", "_key", "policy")):
        return "file"
    return None


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` for `shell` (one of `SHELLS`)."""
    import shtab  # only this command needs it

    hints = {"file": shtab.FILE, "directory": shtab.DIRECTORY}
    for each in every_parser(parser):
        for action in each._actions:
            kind = path_kind(action)
            if kind is not None:
                action.complete = hints[kind]  # type: ignore[attr-defined]  # shtab reads this attribute
    text: str = shtab.complete(parser, shell=shell)
    return text
