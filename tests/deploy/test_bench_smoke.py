"""The benchmark suite's machinery, in `--quick` mode on its cheapest benchmarks and on those of the call paths
(invoke, the sidecar, the MCP front, the registry at scale), so `make bench` cannot rot.

Not a performance test: it asserts that the suite runs end to end against a
real broker and writes results with the expected shape and real figures; no
figure is held to its target here (that is the benchmark's row, `met`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("psutil")  # a bench extra; the suite itself is run by `make bench`, which installs it


def quick_bench(out: Path, names: list[str], timeout: float) -> dict[str, Any]:
    """`python -m bench --quick --only NAME ...` on a fresh embedded broker (no `PULSAR_`/`TOOLREG_` setting of
    this machine's reaches it), asserted to succeed; the results it wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_", "TOOLREG_"))}
    only = [arg for name in names for arg in ("--only", name)]
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *only, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results: dict[str, Any] = json.loads((out / "results-pulsar-lite.json").read_text())
    return results


@pytest.mark.timeout(180)
def test_quick_bench_writes_results(tmp_path: Path) -> None:
    results = quick_bench(tmp_path, ["reload", "propagation", "stages"], timeout=170)
    assert set(results["meta"]) >= {"date", "command", "machine", "versions", "wall_seconds"}
    by_name = {b["name"]: b for b in results["benchmarks"]}
    assert set(by_name) == {"reload", "propagation", "stages"}

    propagation = by_name["propagation"]["data"]
    assert propagation["starts"] == 20
    assert 0 < propagation["reference_start_plus_direct_call"]["p50_ms"] <= propagation["start_to_invokable"]["p50_ms"]
    assert propagation["start_to_invokable"]["n"] == 20

    # Every start stamped at each stage: a stage whose method left the path fails the benchmark, not a row of nan.
    stages = by_name["stages"]["data"]
    assert stages["complete_cycles"] * 2 >= stages["starts"] == 20
    assert all(stages["per_stage"][stage]["p50_ms"] > 0 for stage in stages["per_stage"])

    reload = by_name["reload"]["data"]
    assert reload["under_load"]["calls"] > 0 and reload["under_load"]["failed"] == 0
    assert reload["tools_10"]["reload"]["p50_ms"] > 0 and reload["tools_100"]["config_read"]["p50_ms"] > 0
    for benchmark in results["benchmarks"]:
        assert benchmark["rows"] and benchmark["reference_is"]
        for row in benchmark["rows"]:  # stages has no reference: each stage is timed from the one before
            assert row["ours"] is not None and (benchmark["name"] == "stages" or row["reference"] is not None)

    markdown = (tmp_path / "RESULTS.md").read_text()
    assert (
        "| benchmark | figure | ours, pulsar-lite | reference, pulsar-lite |" in markdown
        and "python -m bench --quick" in markdown
    )
    assert str(tmp_path) not in markdown and str(ROOT) not in json.dumps(results)


@pytest.mark.timeout(120)
def test_quick_mcp_bench_writes_results(tmp_path: Path) -> None:
    (mcp,) = quick_bench(tmp_path, ["mcp"], timeout=110)["benchmarks"]
    data = mcp["data"]
    assert (
        data["latency"]["count"] == 200
        and data["latency"]["mcp"]["p50_ms"] > 0
        and data["latency"]["invoke"]["p50_ms"] > 0
    )
    assert data["hotplug"]["starts"] == 20 and data["hotplug"]["notified"]["n"] == 20
    assert 0 < data["hotplug"]["notified"]["p50_ms"] <= data["hotplug"]["first_call_ok"]["p50_ms"]
    assert all(row["ours"] is not None and row["reference"] is not None for row in mcp["rows"])


CALL_PATH_TARGETS = {
    "invoke": [
        "p50 ratio to raw, listener-bridged caller and a responder answering from an event loop",
        "calls/s at 64 in flight, ratio to the listener-bridged caller and a responder answering from an event loop",
    ],
    "sidecar": ["calls/s, 32 in flight"],
    "front": ["calls/s, 4 sessions x 8 in flight", "calls/s, 4 sessions x 8 in flight, OAuth on"],
    "scale": ["registry CPU share vs a bare listener consumer"],
}
"""The call paths' figures held to a target, each of its benchmark."""


@pytest.mark.timeout(240)
def test_the_call_paths_benchmarks_run_and_give_each_target_figure_beside_its_reference(tmp_path: Path) -> None:
    results = quick_bench(tmp_path, list(CALL_PATH_TARGETS), timeout=230)
    by_name = {b["name"]: b for b in results["benchmarks"]}
    assert set(by_name) == set(CALL_PATH_TARGETS)
    for name, figures in CALL_PATH_TARGETS.items():
        rows = {row["figure"]: row for row in by_name[name]["rows"]}
        for figure in figures:
            row = rows[figure]
            assert row["ours"] is not None and row["reference"] is not None and row["target"], row
            assert isinstance(row["met"], bool), row
    # Each process on the sidecar's and the front's paths is measured, its main thread apart.
    sidecar = by_name["sidecar"]["data"]
    assert {"caller", "sidecar", "server"} <= sidecar["cpu_us_per_call"]["bus"].keys()
    assert all(us > 0 for us in sidecar["main_thread_cpu_us_per_call"]["bus"].values())
    front = by_name["front"]["data"]
    assert {"client", "front", "echo service"} <= front["cpu_us_per_call"]["front"].keys()
    assert {"client", "server"} <= front["main_thread_cpu_us_per_call"]["reference"].keys()


def test_results_of_two_brokers_sit_side_by_side_and_a_figure_one_lacks_says_so(tmp_path: Path) -> None:
    from bench import report

    def run(broker: str, rows: list[dict[str, object]]) -> dict[str, object]:
        meta = {
            "date": "d",
            "command": "python -m bench",
            "wall_seconds": 1.0,
            "broker": broker,
            "broker_key": broker,
            "machine": report.machine(),
            "versions": report.versions(),
        }
        return {
            "meta": meta,
            "benchmarks": [{"name": "invoke", "title": "Invocation", "reference_is": "bare", "rows": rows}],
        }

    p50 = {"figure": "p50", "ours": 1.5, "reference": 0.5, "unit": "ms", "target": "<= 3x", "met": True}
    lite = run("pulsar-lite", [p50, {"figure": "only here", "ours": 7, "reference": 7}])
    apache = run("apache-pulsar", [{**p50, "ours": 2.0, "reference": 1.25, "met": False}])
    text = report.markdown({"pulsar-lite": lite, "apache-pulsar": apache})
    assert "| invoke | p50 | 1.500 ms | 0.500 ms | 2.000 ms | 1.250 ms | <= 3x | yes / NO |" in text
    assert "| invoke | only here | 7 | 7 | not run | - | - | - |" in text
    assert "met (pulsar-lite / Apache Pulsar)" in text


def test_a_partial_run_replaces_only_its_own_benchmarks_and_is_noted_beside_the_full_run(tmp_path: Path) -> None:
    from bench import report

    def result(name: str, ours: float) -> dict[str, object]:
        return {
            "name": name,
            "title": name,
            "reference_is": "bare",
            "rows": [{"figure": "p50", "ours": ours, "reference": 1.0, "unit": "ms"}],
        }

    order = ["propagation", "invoke", "stages"]
    report.write([result("propagation", 5.0), result("invoke", 2.0)], tmp_path, ["--quick"], 1.0, "lite", "pulsar-lite")
    report.write(
        [result("stages", 9.0), result("invoke", 3.0)],
        tmp_path,
        ["--only", "invoke", "--only", "stages"],
        1.0,
        "lite",
        "pulsar-lite",
        partial=order,
    )
    merged = json.loads((tmp_path / "results-pulsar-lite.json").read_text())
    assert [(b["name"], b["rows"][0]["ours"]) for b in merged["benchmarks"]] == [
        ("propagation", 5.0),
        ("invoke", 3.0),
        ("stages", 9.0),
    ]
    assert merged["meta"]["command"] == "python -m bench --quick" and merged["meta"]["reruns"][0]["names"] == [
        "invoke",
        "stages",
    ]
    assert "re-run since: invoke, stages" in (tmp_path / "RESULTS.md").read_text()
