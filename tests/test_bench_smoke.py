"""The benchmark suite's machinery, in `--quick` mode on its two cheapest benchmarks, so `make bench` cannot rot.

Not a performance test: it asserts that the suite runs end to end against a
real broker and writes results with the expected shape and real figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("psutil")  # a bench extra; the suite itself is run by `make bench`, which installs it


@pytest.mark.timeout(180)
def test_quick_bench_writes_results(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "reload", "--only", "propagation", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=170,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["meta"]) >= {"date", "command", "machine", "versions", "wall_seconds"}
    by_name = {b["name"]: b for b in results["benchmarks"]}
    assert set(by_name) == {"reload", "propagation"}

    propagation = by_name["propagation"]["data"]
    assert propagation["starts"] == 20
    assert 0 < propagation["reference_start_plus_direct_call"]["p50_ms"] <= propagation["start_to_invokable"]["p50_ms"]
    assert propagation["start_to_invokable"]["n"] == 20

    reload = by_name["reload"]["data"]
    assert reload["under_load"]["calls"] > 0 and reload["under_load"]["failed"] == 0
    assert reload["tools_10"]["reload"]["p50_ms"] > 0 and reload["tools_100"]["config_read"]["p50_ms"] > 0
    for benchmark in results["benchmarks"]:
        assert benchmark["rows"] and benchmark["reference_is"]
        for row in benchmark["rows"]:
            assert row["ours"] is not None and row["reference"] is not None

    markdown = (tmp_path / "RESULTS.md").read_text()
    assert "| benchmark | figure |" in markdown and "python -m bench --quick" in markdown
    assert str(tmp_path) not in markdown and str(ROOT) not in json.dumps(results)


@pytest.mark.timeout(120)
def test_quick_mcp_bench_writes_results(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "mcp", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=110,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (mcp,) = json.loads((tmp_path / "results.json").read_text())["benchmarks"]
    data = mcp["data"]
    assert data["latency"]["count"] == 200 and data["latency"]["mcp"]["p50_ms"] > 0 and data["latency"]["invoke"]["p50_ms"] > 0
    assert data["hotplug"]["starts"] == 20 and data["hotplug"]["notified"]["n"] == 20
    assert 0 < data["hotplug"]["notified"]["p50_ms"] <= data["hotplug"]["first_call_ok"]["p50_ms"]
    assert all(row["ours"] is not None and row["reference"] is not None for row in mcp["rows"])
