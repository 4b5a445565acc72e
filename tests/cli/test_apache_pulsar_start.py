"""`scripts/apache-pulsar start --topicspace NAME`: a broker `toolreg up` can use at once.

Without the option the broker has no tenant `tg` and `toolreg up` stops with "no namespace tg/notify";
with it, the tenant and the product's namespaces exist (`state` kept without limit), as
deploy/pulsar-init.sh makes them on a cluster, and running it again changes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_pulsar as script
import pytest
from apache_pulsar import PRODUCT_NAMESPACES, ApachePulsar
from support import toolreg_background


@pytest.fixture
def fresh(apache_pulsar: ApachePulsar) -> Iterator[str]:
    name = f"ts-{uuid.uuid4().hex[:10]}"
    yield name
    apache_pulsar.delete_tenant(name)


@pytest.mark.apache_pulsar
@pytest.mark.timeout(300)
def test_ensure_topicspace_makes_what_toolreg_up_needs_and_is_safe_to_run_again(
    apache_pulsar: ApachePulsar, fresh: str, tmp_path: Path
) -> None:
    first = apache_pulsar.ensure_topicspace(fresh)
    assert first[0] == f"tenant {fresh}: created (cluster standalone)"
    assert sorted(apache_pulsar.namespaces(fresh)) == sorted(f"{fresh}/{n}" for n in PRODUCT_NAMESPACES)
    assert apache_pulsar.admin("GET", f"namespaces/{fresh}/state/retention") == {
        "retentionTimeInMinutes": -1,
        "retentionSizeInMB": -1,
    }
    again = apache_pulsar.ensure_topicspace(fresh)
    assert again[0] == f"tenant {fresh}: exists" and f"namespace {fresh}/notify: exists" in again
    assert f"namespace {fresh}/state: retention unlimited" in again

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    assert apache_pulsar.token is not None
    env.update(
        PULSAR_URL=apache_pulsar.url,
        PULSAR_AUTH_TOKEN=apache_pulsar.token,
        TOOLREG_TOPICSPACE=fresh,
        TOOLREG_DATA_DIR=str(tmp_path / "data"),
        TOOLREG_LOG_FORMAT="json",
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "up.log"
    up = toolreg_background("up", env=env, log=log)
    try:
        deadline = time.monotonic() + 120
        while "ready in" not in log.read_text(errors="replace"):
            assert up.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        assert "no namespace" not in log.read_text(errors="replace")
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()


class FakeBroker:
    """Stands in for `ApachePulsar` in `main`: records what the command line asked of it."""

    made: list[FakeBroker] = []

    def __init__(self, data_dir: Any = None, *, auth: bool = False) -> None:
        self.data_dir = Path("/nowhere")
        self.auth = auth
        self.topicspaces: list[str] = []
        FakeBroker.made.append(self)

    def start(self) -> FakeBroker:
        return self

    def ensure_topicspace(self, name: str) -> list[str]:
        self.topicspaces.append(name)
        return [f"tenant {name}: created (cluster standalone)"]

    def env(self) -> dict[str, str]:
        return {"PULSAR_URL": "pulsar://127.0.0.1:1", "PULSAR_ADMIN_URL": "http://127.0.0.1:2"}

    def kind_tokens(self, topicspaces: list[str]) -> dict[str, Path]:
        self.granted = list(topicspaces)
        return {kind: self.data_dir / "auth" / f"{kind}.token" for kind in ("store", "service", "agent", "operator")}


def test_start_creates_each_topicspace_named_once_and_says_so_on_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeBroker.made.clear()
    monkeypatch.setattr(script, "ApachePulsar", FakeBroker)
    monkeypatch.setattr(script, "cache_dir", lambda: tmp_path)
    assert script.main(["start", "--topicspace", "tg", "--topicspace", "team-a", "--topicspace", "tg"]) == 0
    (broker,) = FakeBroker.made
    assert broker.topicspaces == ["tg", "team-a"]
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "PULSAR_URL=pulsar://127.0.0.1:1",
        "PULSAR_ADMIN_URL=http://127.0.0.1:2",
    ]  # still `export`-able
    assert "apache-pulsar: tenant tg: created" in err and "apache-pulsar: tenant team-a: created" in err


def test_start_with_auth_says_where_each_kinds_token_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeBroker.made.clear()
    monkeypatch.setattr(script, "ApachePulsar", FakeBroker)
    monkeypatch.setattr(script, "cache_dir", lambda: tmp_path)
    assert script.main(["start", "--auth", "--topicspace", "tg"]) == 0
    (broker,) = FakeBroker.made
    assert broker.auth and broker.granted == ["tg"]
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "PULSAR_URL=pulsar://127.0.0.1:1"  # stdout still `export`-able
    for kind, runs in [("store", "toolreg up"), ("service", "toolreg serve"), ("agent", "toolreg call")]:
        assert any(
            f"{kind}" in line and f"/nowhere/auth/{kind}.token" in line and runs in line for line in err.splitlines()
        )
    assert "/nowhere/auth/operator.token" in err
    assert "PULSAR_AUTH_TOKEN_FILE=/nowhere/auth/store.token toolreg up" in err and "token --role NAME" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["stop", "--topicspace", "tg"], "--topicspace goes with start"),
        (["token"], "token takes --role NAME"),
        (["env", "--role", "x"], "token takes --role NAME"),
        (["start", "--topicspace", "a/b"], "'a/b' is not a valid Pulsar tenant name"),
    ],
)
def test_a_misused_topicspace_is_refused_before_anything_starts(
    argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    FakeBroker.made.clear()
    monkeypatch.setattr(script, "ApachePulsar", FakeBroker)
    with pytest.raises(SystemExit) as exited:
        script.main(argv)
    assert exited.value.code == 2 and FakeBroker.made == []
    assert says in capsys.readouterr().err


def test_the_wrapper_and_its_help_name_the_option() -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [str(root / "scripts" / "apache-pulsar"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert done.returncode == 0 and "--topicspace NAME" in done.stdout and "no namespace tg/notify" in done.stdout
    assert "--topicspace tg" in (root / "docs" / "guide" / "operating.md").read_text()
