"""The embedded broker: loopback only, no metrics listener, reuse, clean stop."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import accepts_connections
from discovery.errors import BrokerError


def listening_sockets(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_listens_on_loopback_only_without_a_metrics_listener(broker: EmbeddedBroker) -> None:
    assert broker.process is not None
    assert listening_sockets(broker.process.pid) == [f"127.0.0.1:{broker.port}"]
    assert "enabled = false" in (broker.data_dir / "broker.toml").read_text()


def test_writes_its_url_and_removes_it_on_stop(tmp_path: Path) -> None:
    embedded = EmbeddedBroker(tmp_path)
    url = embedded.start()
    assert (tmp_path / "broker.url").read_text().strip() == url
    port = embedded.port
    embedded.stop()
    assert not (tmp_path / "broker.url").exists()
    assert port is not None and not accepts_connections(port)


def test_a_second_start_on_the_same_data_dir_reuses_the_running_broker(broker: EmbeddedBroker) -> None:
    other = EmbeddedBroker(broker.data_dir)
    assert other.start() == broker.url
    assert other.reused
    other.stop()  # stopping a reused broker leaves it running
    assert broker.port is not None and accepts_connections(broker.port)


def test_a_stale_url_file_is_not_trusted(tmp_path: Path) -> None:
    (tmp_path / "broker.url").write_text("pulsar://127.0.0.1:1\n")
    (tmp_path / "broker.pid").write_text("999999\n")
    embedded = EmbeddedBroker(tmp_path)
    try:
        embedded.start()
        assert not embedded.reused and embedded.pid != 999999
        assert embedded.port is not None and accepts_connections(embedded.port)
    finally:
        embedded.stop()


def test_the_next_start_takes_the_port_used_last_time(tmp_path: Path) -> None:
    """Running services keep the URL they started with: a broker back on another port would strand them."""
    first = EmbeddedBroker(tmp_path)
    url = first.start()
    first.stop()
    assert (tmp_path / "broker.port").read_text().strip() == url.rsplit(":", 1)[1]
    again = EmbeddedBroker(tmp_path)
    try:
        assert again.start() == url and again.port_note is None
    finally:
        again.stop()


def test_after_a_crash_the_next_start_takes_the_port_from_the_url_left_behind(tmp_path: Path) -> None:
    crashed = EmbeddedBroker(tmp_path)
    url = crashed.start()
    crashed.kill()
    (tmp_path / "broker.port").unlink()  # as a data directory from before broker.port existed
    again = EmbeddedBroker(tmp_path)
    try:
        assert again.start() == url and not again.reused
    finally:
        again.stop()


def test_a_port_taken_since_is_said_in_one_line_and_another_is_used(tmp_path: Path) -> None:
    first = EmbeddedBroker(tmp_path)
    first.start()
    port = first.port
    first.stop()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port or 0))
        squatter.listen()
        again = EmbeddedBroker(tmp_path)
        try:
            assert again.start() != f"pulsar://127.0.0.1:{port}"
            assert again.port_note is not None and f"port {port}" in again.port_note and "\n" not in again.port_note
        finally:
            again.stop()


def test_an_adopted_broker_is_watched_and_stopped_like_one_we_started(broker: EmbeddedBroker) -> None:
    assert broker.process is not None
    heir = EmbeddedBroker(broker.data_dir)
    assert heir.start(adopt=True) == broker.url
    assert heir.adopted and heir.pid == broker.process.pid and heir.alive()
    heir.stop()
    assert broker.process.wait(5) is not None
    assert not heir.alive() and not (broker.data_dir / "broker.url").exists()


def test_a_port_in_use_fails_with_a_clear_error(tmp_path: Path, broker: EmbeddedBroker) -> None:
    with pytest.raises(BrokerError, match="in use"):
        EmbeddedBroker(tmp_path / "other").start(port=broker.port, timeout=3)
