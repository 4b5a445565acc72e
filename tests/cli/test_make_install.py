"""`make demo` and `make test` install the project quietly: no walls of setuptools warnings on a fresh machine.

pip repeats a local project's build-backend warnings even with --quiet. The project's `license` is the SPDX
string setuptools wants (with `license-files`), so a plain quiet install says nothing of it (it said 52 lines
when it was a table); the Makefile's `PIP_INSTALL` filters only the notice that an editable install is one.
This runs it as `make` would, with a venv's own python, on a copy of what the project is built
from, into a fresh venv that borrows this pip (the project's own venv, whose install of this project pip would
replace, is not touched).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pip
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILT_FROM = ("pyproject.toml", "README.md", "LICENSE", "toolservice_base", "discovery", "agent_bridge")


def pip_install_command() -> list[str]:
    """`$(PIP_INSTALL)` as make expands it, with this interpreter as the venv's python."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [
            "make",
            "-s",
            "-f",
            str(ROOT / "Makefile"),
            "--eval",
            "show-pip-install: ; @true $(info $(PIP_INSTALL))",
            "show-pip-install",
            "BIN=BIN",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    command = shlex.split(done.stdout)
    assert command[0] == "BIN/python" and command[-3:] == ["pip", "install", "--quiet"], command
    return [sys.executable, *command[1:]]


def install(command: list[str], tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`command` (a `python ... -m pip install ...`) installing a copy of the project, editable, into a new venv."""
    source = tmp_path / name
    source.mkdir()
    for part in BUILT_FROM:
        (shutil.copytree if (ROOT / part).is_dir() else shutil.copy)(ROOT / part, source / part)
    venv = tmp_path / f"{name}-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    borrowed = tmp_path / f"{name}-pip"  # this pip alone on the new venv's path: it sees no other installed package
    shutil.copytree(Path(pip.__file__).parent, borrowed / "pip")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return subprocess.run(
        [str(venv / "bin" / "python"), *command[1:], "--no-deps", "--disable-pip-version-check", "-e", str(source)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(borrowed)},
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(600)
def test_the_makefile_install_is_quiet_and_a_plain_one_says_nothing_of_the_license(tmp_path: Path) -> None:
    command = pip_install_command()
    quiet = install(command, tmp_path, "filtered")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert quiet.stdout == "" and quiet.stderr == "", quiet.stderr[-3000:]

    plain = install([sys.executable, "-m", "pip", "install", "--quiet"], tmp_path, "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "project.license" not in plain.stderr and "License classifiers" not in plain.stderr, plain.stderr[-3000:]
    warnings = [line for line in plain.stderr.splitlines() if "Warning" in line]
    assert all("Editable installation" in line for line in warnings), warnings  # the one the Makefile filters
