"""The install-from-wheel path of the README: the wheel it names is the one the project builds, and `toolreg` runs
from it in an environment of its own, outside the repository, with everything it ships (the registry page's files).

The new environment gets the wheel alone (`--no-deps`); its dependencies are borrowed from this test run's
environment on PYTHONPATH, so nothing is downloaded, and the product itself can only come from the wheel (this
environment has it as an editable install, which PYTHONPATH does not carry).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILT_FROM = ("pyproject.toml", "README.md", "toolservice_base", "discovery", "agent_bridge")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built as the README builds it (pip fetches the build backend), from a copy of its
    sources (the build leaves nothing in the repository)."""
    source = tmp_path_factory.mktemp("source")
    for part in BUILT_FROM:
        if (ROOT / part).is_dir():
            shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / part, source / part)
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = dist.glob("*.whl")
    return found


def test_the_readme_names_the_wheel_the_project_builds(wheel: Path) -> None:
    named = set(re.findall(r"dist/(tool_discovery-[^\s'\[]+\.whl)", (ROOT / "README.md").read_text()))
    assert named == {wheel.name}


def test_the_wheel_carries_the_registry_pages_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    page = {"discovery/web/templates/page.html", "discovery/web/static/page.js", "discovery/web/static/page.css"}
    assert page <= names
    assert not [name for name in names if name.startswith(("tests/", "bench/", "scripts/"))]


def test_toolreg_runs_from_the_wheel_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=sysconfig.get_paths()["purelib"], PATH=f"{venv / 'bin'}:/usr/bin:/bin")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=away, env=env, capture_output=True, text=True, timeout=60)

    where = run("python", "-c", "import discovery.web, toolservice_base; print(discovery.web.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout  # the wheel's, not the checkout's
    assert (Path(where.stdout.strip()).parent / "templates" / "page.html").is_file()
    version = run("toolreg", "--version")
    assert version.stdout.strip() == f"toolreg {wheel.name.split('-')[1]}", version.stderr
    assert run("toolreg", "init", "--help").returncode == 0
    lost = run("toolreg", "tools")
    assert lost.returncode == 1 and "TOOLREG_DATA_DIR" in lost.stderr and "\n" not in lost.stderr.strip()
