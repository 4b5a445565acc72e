"""`toolreg serve --ttl` and `toolreg announce --ttl` take only a lease the registry accepts and the broker can bear.

0, -5 and nan used to end in a 40-line traceback once the service had subscribed, and 0.001 was
taken (2,900 messages in 6 s from one instance). Now the range is checked before anything starts:
no broker is running here, and the answer is still the one line about --ttl.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import toolreg, toolreg_env

NOWHERE = "pulsar://127.0.0.1:9"
"""No broker: a command that got past the check would say it cannot reach one (or hang), not speak of --ttl."""


def command(name: str, tmp_path: Path) -> list[str]:
    if name == "serve":
        return ["serve", "toolservice_base.examples.joke:JokeService"]
    return [
        "announce",
        "--service",
        str(tmp_path / "missing-service.json"),
        "--tools",
        str(tmp_path / "missing-tools.json"),
    ]


@pytest.mark.parametrize("name", ["serve", "announce"])
@pytest.mark.parametrize(
    ("ttl", "says"),
    [
        ("0", "more than 0"),
        ("-5", "more than 0"),
        ("nan", "got nan"),
        ("inf", "at most 3600"),
        ("3601", "at most 3600"),
        ("0.001", "at least 1 second"),
        ("0.5", "at least 1 second"),
    ],
)
def test_a_ttl_out_of_range_is_refused_in_one_line_before_anything_starts(
    name: str, ttl: str, says: str, tmp_path: Path
) -> None:
    result = toolreg(*command(name, tmp_path), "--ttl", ttl, env=toolreg_env(NOWHERE, tmp_path), timeout=30)
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert result.stderr.startswith("toolreg: --ttl ") and says in result.stderr, result.stderr[-2000:]
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr and result.stdout == ""


def test_a_ttl_in_range_gets_past_the_check(tmp_path: Path) -> None:
    for ttl in ("1", "15", "3600"):
        result = toolreg(*command("announce", tmp_path), "--ttl", ttl, env=toolreg_env(NOWHERE, tmp_path), timeout=30)
        assert result.returncode == 1 and "missing-service.json" in result.stderr and "--ttl" not in result.stderr, (
            result.stderr
        )
