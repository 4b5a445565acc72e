"""`toolreg completion bash|zsh|fish`: scripts generated from the real parser, that complete in the real shells.

Bash is on every machine the suite runs on, so its script is driven the way
bash drives it on Tab (COMP_WORDS/COMP_CWORD, then COMPREPLY). zsh and fish
are driven too where they are installed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import toolreg, toolreg_env

from discovery.cli.completion import path_kind
from discovery.cli.main import build_parser

SHELLS = ("bash", "zsh", "fish")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    return dict(action.choices) if action is not None else {}


def _walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for name, sub in _subcommands(parser).items():
        found.extend(_walk(sub, (*path, name)))
    return found


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings if option.startswith("--")}


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each shell's script as `toolreg completion SHELL` prints it, run with no broker and no data directory."""
    home = tmp_path_factory.mktemp("completion")
    env = toolreg_env("", home / "no-such-data-dir")
    env.pop("PULSAR_URL")
    found = {}
    for shell in SHELLS:
        result = toolreg("completion", shell, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""
        found[shell] = home / f"toolreg.{shell}"
        found[shell].write_text(result.stdout)
    assert not (home / "no-such-data-dir").exists()  # it needs no data directory, and makes none
    return found


def bash_complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What bash offers on Tab at the end of `line`, with the script sourced."""
    driver = (
        'source "$1"; COMP_LINE="$2"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"; '
        '[[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=(""); COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); '
        'COMPREPLY=(); _shtab_toolreg; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", driver, "bash", str(script), line], capture_output=True, text=True, timeout=30, cwd=cwd
    )
    assert done.returncode == 0, done.stderr
    return [word for word in done.stdout.splitlines() if word]


def test_bash_completes_commands_subcommands_flags_and_choices_of_the_real_parser(scripts: dict[str, Path]) -> None:
    parser = build_parser()
    commands = _subcommands(parser)
    assert sorted(bash_complete(scripts["bash"], "toolreg ")) == sorted(commands)
    assert "completion" in commands and "tools" in commands
    assert sorted(bash_complete(scripts["bash"], "toolreg con")) == ["config", "conflicts"]
    assert sorted(bash_complete(scripts["bash"], "toolreg config ")) == sorted(_subcommands(commands["config"]))
    assert set(bash_complete(scripts["bash"], "toolreg tools --")) == _long_options(commands["tools"])
    assert {"--watch", "--interval", "--strict"} <= set(bash_complete(scripts["bash"], "toolreg tools --"))
    assert set(bash_complete(scripts["bash"], "toolreg rejections --")) >= {"--workspace", "--json", "--timeout"}
    assert bash_complete(scripts["bash"], "toolreg up --store ") == ["sqlite", "pulsar"]
    assert bash_complete(scripts["bash"], "toolreg completion ") == list(SHELLS)
    # options before the command are skipped over, values and all
    assert sorted(bash_complete(scripts["bash"], "toolreg --data-dir /tmp tools --w")) == ["--watch", "--workspace"]


def test_bash_completes_file_names_where_the_parser_takes_a_path(scripts: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "signing.key").write_text("")
    (tmp_path / "state").mkdir()
    assert bash_complete(scripts["bash"], "toolreg serve --signing-key sig", cwd=tmp_path) == ["signing.key"]
    assert bash_complete(scripts["bash"], "toolreg up --data-dir st", cwd=tmp_path) == ["state"]
    assert bash_complete(scripts["bash"], "toolreg tools --workspace st", cwd=tmp_path) == []  # a name, not a path


def test_path_arguments_are_told_from_the_parser_alone() -> None:
    kinds = {
        (path, option): path_kind(action)
        for path, parser in _walk(build_parser())
        for action in parser._actions
        for option in (action.option_strings[-1:] or [action.dest])
    }
    assert kinds[(("up",), "--trust-policy")] == "file" and kinds[(("serve",), "--signing-key")] == "file"
    assert kinds[(("call",), "--static-dir")] == "directory" and kinds[((), "--data-dir")] == "directory"
    assert kinds[(("keygen",), "path")] == "file" and kinds[(("announce",), "--service")] == "file"
    assert (
        kinds[(("tools",), "--workspace")] is None
        and kinds[(("up",), "--store")] is None
        and kinds[(("tools",), "--json")] is None
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_every_command_and_flag_of_the_parser_is_in_the_script(scripts: dict[str, Path], shell: str) -> None:
    text = scripts[shell].read_text()
    for path, parser in _walk(build_parser()):
        for name in path:
            assert name in text, f"{shell}: no {' '.join(path)}"
        for option in _long_options(parser):
            assert option.removeprefix("--") in text, f"{shell}: no {option} of toolreg {' '.join(path)}"


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_script_and_binds_it_to_toolreg(scripts: dict[str, Path]) -> None:
    check = subprocess.run(["zsh", "-n", str(scripts["zsh"])], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    loaded = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            'autoload -U compinit; compinit -u -d "$2"; eval "$(<$1)"; print -r -- $_comps[toolreg]',
            "zsh",
            str(scripts["zsh"]),
            str(scripts["zsh"].with_suffix(".zcompdump")),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "_shtab_toolreg"


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_subcommands_flags_and_choices(scripts: dict[str, Path]) -> None:
    def offered(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {scripts['fish']}; complete -C {json.dumps(line)}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return [entry.split("\t")[0] for entry in done.stdout.splitlines()]

    assert sorted(offered("toolreg config ")) == ["delete", "get", "list", "put"]
    assert sorted(offered("toolreg tools --w")) == ["--watch", "--workspace"]
    assert sorted(offered("toolreg up --store ")) == ["pulsar", "sqlite"]
    assert sorted(offered("toolreg --data-dir x tools --st")) == ["--strict"]


def test_the_completion_command_loads_no_subsystem_and_no_broker_client() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import contextlib, io, sys\nfrom discovery.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    code = main(['completion', 'zsh'])\n"
            "print(code, ' '.join(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    code, modules = loaded.stdout.split(" ", 1)
    assert code == "0"
    assert not {
        "pulsar",
        "_pulsar",
        "discovery.registry.service",
        "discovery.store.service",
        "agent_bridge",
        "starlette",
        "mcp",
    } & set(modules.split())
