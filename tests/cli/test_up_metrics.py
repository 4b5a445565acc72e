"""`toolreg up`'s /metrics right after the registry started: its start-up probe is no config error.

The registry learns whether the store honours `expect` by a conditional write the store must refuse.
That refusal is counted as what it is, a conflict, and no error alert (`toolreg_config_request_errors_total`)
can fire on every start.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from support import toolreg_env

from discovery.broker import EmbeddedBroker


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def status(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


def test_the_registry_start_up_probe_counts_as_a_conflict_not_a_config_error(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "discovery.cli", "up", "--metrics-port", "0"],
            env=toolreg_env(broker.url or "", tmp_path / "data"),
            stdout=subprocess.PIPE,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    try:
        assert process.stdout is not None
        first = process.stdout.readline().decode()  # `metrics  URL/metrics` comes first, before the broker starts
        found = re.search(r"(http://\S+)/metrics", first)
        assert found, (first, log.read_text()[-2000:])
        base = found.group(1)
        deadline = time.monotonic() + 30
        while not status(f"{base}/readyz"):  # ready: store and registry started, the probe made
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        metrics = fetch(f"{base}/metrics")
    finally:
        process.terminate()
        process.wait(timeout=30)
    errors = samples(metrics, "toolreg_config_request_errors_total")
    assert all(value == 0 for value in errors.values()), errors
    assert samples(metrics, "toolreg_config_conflicts_total") == {(): 1.0}  # the probe, and nothing else
    assert samples(metrics, "toolreg_config_requests_total")[(("operation", "put"),)] >= 1
