"""The command-line reference page, written from `toolreg`'s own argparse parser at each build.

`docs/reference/cli.md` holds the overview by hand and the marker below; this hook puts, in its place, every
command and subcommand with its usage, description, arguments and examples, read from the parser tree that
`toolreg --help` prints from, so the reference cannot drift from the commands. `python docs/hooks/cli_reference.py`
prints the same Markdown.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
PAGE = "reference/cli.md"
ROOT = Path(__file__).resolve().parents[2]
WIDTH = 80
"""Usage lines are wrapped at this width whatever the terminal that builds the site (the theme's code blocks show
about 85 characters on a laptop's screen)."""


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: fill the reference page's marker."""
    if page.file.src_uri != PAGE:
        return markdown
    assert MARKER in markdown, f"{PAGE} must hold {MARKER}, where the generated reference goes"
    return markdown.replace(MARKER, render(toolreg_parser()))


def toolreg_parser() -> argparse.ArgumentParser:
    """The parser of the checkout being documented (ahead of any installed copy)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from discovery.cli.main import build_parser

    return build_parser()


def render(parser: argparse.ArgumentParser) -> str:
    """The whole tree as Markdown, in the parser's order: `toolreg` itself, then each command under it.

    The options `toolreg` takes are taken by every command too (before or after its name), so they are listed once,
    under `toolreg`, and left out of each command's list (its usage still shows them)."""
    shared = {tuple(action.option_strings) for action in _options(parser)}
    return "\n".join(_command(parser, "", level=2, hidden=set(), shared=shared))


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand directly under `parser`, aliases once."""
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    found.append((name, summaries.get(name, ""), sub))
    return found


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options `parser` documents itself: shown in help, not its subcommands, not `-h`."""
    return [
        action
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        and not isinstance(action, argparse._SubParsersAction | argparse._HelpAction)
    ]


def _command(
    parser: argparse.ArgumentParser,
    summary: str,
    level: int,
    hidden: set[tuple[str, ...]],
    shared: set[tuple[str, ...]],
) -> list[str]:
    """One command's section (heading, summary, usage, description, arguments, examples), then its subcommands'."""
    lines = [f"{'#' * level} {parser.prog}", ""]
    said = " ".join((parser.description or "").split()).lower()
    if summary and not said.startswith(summary.lower().rstrip(".")):  # else the description says it first
        lines += [_prose(summary[:1].upper() + summary[1:]) + ".", ""]
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    lines += ["```text", formatter.format_help().strip(), "```", ""]
    if parser.description:
        lines += [_prose(parser.description), ""]
    own = [action for action in _options(parser) if tuple(action.option_strings) not in hidden]
    if own:
        lines += [_item(parser, action) for action in own] + [""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    for _name, sub_summary, sub in _subcommands(parser):
        lines += _command(sub, sub_summary, min(level + 1, 6), shared, shared)
    return lines


def _item(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """One argument as a list item: how it is written, in code, then what it does."""
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    invocation = formatter._format_action_invocation(action)
    said = formatter._expand_help(action) if action.help else ""
    return f"- `{invocation}`" + (f": {_prose(said)}" if said else "")


def _prose(text: str) -> str:
    """Help text as Markdown shows it as written: code spans kept, every other Markdown or HTML character escaped."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(
        part if part.startswith("`") and part.endswith("`") and len(part) > 1 else _escape(part) for part in parts
    )


def _escape(text: str) -> str:
    return re.sub(r"([\\*_\[\]#|])", r"\\\1", html.escape(text, quote=False))


if __name__ == "__main__":
    print(render(toolreg_parser()))
