"""`scripts/apache-pulsar start --auth` gives each kind of process a role and a token of its own, and a deployment
where each process runs with its own works: `toolreg up` as the store, `toolreg serve` as a service, `toolreg call`
as an agent, `toolreg tools` as an operator (the operating guide's walkthrough, on the run's Apache Pulsar, auth on)."""

from __future__ import annotations

from pathlib import Path

import apache_pulsar as script
import pytest
from apache_pulsar import KIND_GRANTS, ApachePulsar
from support import toolreg_background
from test_apache_pulsar_cli import env_for, run, stop, wait_for

from toolservice_base.transport.pulsar.diagnosis import Claims

pytestmark = [pytest.mark.apache_pulsar, pytest.mark.timeout(420)]


def test_each_kind_runs_with_its_own_token(
    apache_pulsar: ApachePulsar, tenant: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = apache_pulsar.kind_tokens([tenant])
    assert sorted(files) == sorted(KIND_GRANTS)
    for kind, path in files.items():
        assert Claims.of(path.read_text().strip()).role == kind and path.stat().st_mode & 0o077 == 0

    assert script.main(["token", "--role", "auditor", "--dir", str(apache_pulsar.data_dir)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(apache_pulsar.data_dir / "auth" / "auditor.token")
    assert Claims.of(Path(printed).read_text().strip()).role == "auditor"

    def env(kind: str) -> dict[str, str]:
        said = env_for(apache_pulsar, tenant, tmp_path / kind, None)
        return {**said, "PULSAR_AUTH_TOKEN_FILE": str(files[kind]), "TOOLREG_BROKER": "apache-pulsar"}

    up = toolreg_background("up", env=env("store"), log=tmp_path / "up.log")
    serve = None
    try:
        wait_for(tmp_path / "up.log", "ready in", up)
        serve = toolreg_background(
            "serve", "toolservice_base.examples.joke:JokeService", env=env("service"), log=tmp_path / "serve.log"
        )
        wait_for(tmp_path / "serve.log", "service.announced", serve)
        called = run("call", "tell-joke", "topic=owls", env=env("agent"))
        assert called.returncode == 0 and "owls" in called.stdout, called.stderr[-2000:]
        listed = run("tools", env=env("operator"))
        assert listed.returncode == 0 and "tell-joke" in listed.stdout, listed.stderr[-2000:]
    finally:
        if serve is not None:
            stop(serve)
        stop(up)
