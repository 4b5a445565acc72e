"""What a newcomer reads from a replicated deployment says what happened, and nothing else.

On the run's Apache Pulsar: a second `toolreg up --store pulsar` is a standby
and its start says so (the registry runs on the active replica, not here),
and `toolreg store export --store pulsar` on a terminal prints its answer
with no log line beside it unless `--log-level` asks for them.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from apache_pulsar import ApachePulsar
from support import toolreg_background
from support.replicas import Cluster
from test_apache_pulsar_cli import stop, wait_for

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]


def on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`toolreg ARGS` with its stderr on a pseudo-terminal, as a user's: (code, stdout, stderr)."""
    master, slave = pty.openpty()
    said: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            said.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    process = subprocess.Popen(
        [sys.executable, "-m", "discovery.cli", *args], env=env, stdout=subprocess.PIPE, stderr=slave
    )
    os.close(slave)
    out, _ = process.communicate(timeout=90)
    reader.join(5)
    os.close(master)
    return process.returncode, out.decode(), b"".join(said).decode().replace("\r\n", "\n")


def test_a_standby_says_it_is_one_and_an_export_on_a_terminal_prints_no_log_line(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path
) -> None:
    cluster = Cluster(apache_pulsar, tenant, tmp_path)
    active = toolreg_background("up", "--metrics-port", "0", env=cluster.env("a"), log=tmp_path / "a.log")
    standby = None
    try:
        wait_for(tmp_path / "a.log", "ready in", active)
        assert "registry      runs here (this replica is the active one)" in (tmp_path / "a.log").read_text()
        standby = toolreg_background("up", "--metrics-port", "0", env=cluster.env("b"), log=tmp_path / "b.log")
        wait_for(tmp_path / "b.log", "ready in", standby)
        said = (tmp_path / "b.log").read_text()
        assert "registry      runs on the active replica, not here: this one is a standby" in said, said[-3000:]

        plain = {k: v for k, v in cluster.env("c").items() if k not in ("TOOLREG_LOG_FORMAT", "TOOLREG_LOG_LEVEL")}
        out = tmp_path / "export.json"
        code, stdout, stderr = on_a_terminal(["store", "export", "--store", "pulsar", str(out)], plain)
        assert code == 0 and stdout.startswith("exported "), (stdout, stderr)
        assert stderr == "", stderr  # no log line: the answer is on stdout
        code, _, asked = on_a_terminal(["store", "export", "--store", "pulsar", str(out), "--log-level", "info"], plain)
        assert code == 0 and "log." in asked, asked  # asked for: the reader's events, as the terminal shows them
    finally:
        if standby is not None:
            stop(standby)
        stop(active)
