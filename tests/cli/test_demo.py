"""`make demo`: the product alone installed (not the test extra), and the story alone on stdout, even when piped.

The test extra is this project's suite (linters, TrustGraph, a browser driver, the agent frameworks: 578 MB); the
demo needs none of it. Piped (`make demo | less`, a CI log), the story used to be interleaved with the JSON log lines
of the demo's own registry and bridge; they go to a file in the demo's directory now.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_make_demo_installs_the_product_without_the_test_extra(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    alone = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under `make test`
    planned = subprocess.run(
        ["make", "-n", "--no-print-directory", "-f", str(ROOT / "Makefile"), "demo", f"VENV={venv}"],
        cwd=ROOT,
        env=alone,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert planned.returncode == 0, planned.stderr
    installs = [shlex.split(line) for line in planned.stdout.splitlines() if " pip install " in line]
    project = [words[-1] for words in installs if words[-2] == "-e"]
    assert project == ["."], planned.stdout  # the product, no extra
    assert "[test]" not in planned.stdout
    assert planned.stdout.splitlines()[-1] == f"{venv}/bin/toolreg demo"


def test_the_demo_piped_prints_the_story_and_no_log_lines(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "discovery.cli", "demo", "--dir", str(tmp_path / "demo")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == ""
    steps = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert [step[:3] for step in steps] == ["[1]", "[2]", "[3]", "[4]", "[5]", "[6]"]
    for line in done.stdout.splitlines():
        assert not line.lstrip().startswith("{"), f"a log line in the story: {line}"
    logged = [json.loads(line) for line in (tmp_path / "demo" / "demo.log").read_text().splitlines()]
    assert {"broker.started", "toolset.fallback"} <= {entry["event"] for entry in logged}
    assert "demo.log" in done.stdout.splitlines()[-1]
