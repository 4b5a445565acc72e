"""The embedded Pulsar-protocol broker: the pulsar-lite binary, run by us.

We start the binary ourselves rather than through pulsar-lite's Python helper,
which logs to a fixed file in the system temp folder and scans a fixed port
range. Here everything lives under the data directory:

    <data-dir>/broker.toml       config: metrics listener off
    <data-dir>/broker.rocksdb/   the broker's data
    <data-dir>/broker.log        its log
    <data-dir>/broker.url        pulsar://127.0.0.1:<port>, read by every other process
    <data-dir>/broker.pid        the process id, to tell a live broker from a stale file

It listens on 127.0.0.1 only and has no authentication: it is a laptop and
test broker. Production points `PULSAR_URL` at Apache Pulsar instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from .errors import BrokerError
from .logs import get_logger
from .settings import BROKER_URL_FILE

log = get_logger("toolservice_base.broker")

CONFIG = """# Written by toolreg: keep pulsar-lite's metrics listener (0.0.0.0:8080 by default) off.
[metrics]
enabled = false
"""


def binary_path() -> Path:
    import pulsar_lite

    path = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not path.exists():
        raise BrokerError(f"pulsar-lite binary missing at {path}; reinstall with `pip install --force-reinstall pulsar-lite`")
    return path


def reserve_port() -> socket.socket:
    """Bind (not listen) a free loopback port and keep it bound until the broker listens.

    pulsar-lite binds with SO_REUSEPORT, so it can share the port with this
    socket, while no other process's bind to port 0 can be handed the same
    port in the meantime: two brokers never end up on one port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def port_is_free(port: int) -> bool:
    """pulsar-lite binds with port reuse, so a taken port does not make it fail: check first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def accepts_connections(port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_of(url: str) -> int | None:
    try:
        return int(url.rsplit(":", 1)[1].strip("/"))
    except (IndexError, ValueError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        try:
            return b"pulsar-lite" in cmdline.read_bytes()
        except OSError:
            return False
    return True


def terminate(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a process we started, then SIGKILL it if it is still there after `timeout`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class EmbeddedBroker:
    """Start, find or stop the pulsar-lite broker of one data directory."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.process: subprocess.Popen[bytes] | None = None
        self.url: str | None = None
        self.port: int | None = None
        self.reused = False

    @property
    def url_file(self) -> Path:
        return self.data_dir / BROKER_URL_FILE

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def running(self) -> str | None:
        """The URL of a live broker already serving this data directory, if any."""
        try:
            url = self.url_file.read_text().strip()
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        port = _port_of(url)
        if port and _pid_alive(pid) and accepts_connections(port):
            return url
        return None

    def start(self, port: int | None = None, timeout: float = 10.0) -> str:
        """Start the broker (or reuse a live one) and return its URL."""
        existing = self.running()
        if existing:
            self.url, self.port, self.reused = existing, _port_of(existing), True
            log.info("broker.reused", url=existing, data_dir=str(self.data_dir))
            return existing
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "broker.toml"
        config.write_text(CONFIG)
        if port and not port_is_free(port):
            raise BrokerError(f"port {port} on 127.0.0.1 is in use; choose another --port or leave it out")
        reservation = None if port else reserve_port()
        try:
            chosen = port if port else int(reservation.getsockname()[1])  # type: ignore[union-attr]
            return self._launch(chosen, config, timeout)
        finally:
            if reservation is not None:
                reservation.close()

    def _launch(self, port: int, config: Path, timeout: float) -> str:
        logfile = open(self.log_file, "ab")
        try:
            self.process = subprocess.Popen(
                [
                    str(binary_path()),
                    "--config", str(config),
                    "--addr", f"127.0.0.1:{port}",
                    "--db-path", str(self.data_dir / "broker"),
                    "--log-level", "warn",
                ],
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the broker last
            )
        finally:
            logfile.close()
        deadline = time.monotonic() + timeout
        while not accepts_connections(port, timeout=0.1):
            if self.process.poll() is not None:
                self.process = None
                tail = self._log_tail()
                if "LOCK" in tail:
                    other = self._wait_for_other(deadline)
                    if other:
                        return other
                    raise BrokerError(f"another broker holds {self.data_dir}; stop it or use another --data-dir")
                raise BrokerError(f"pulsar-lite exited at start: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'} (see {self.log_file})")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"pulsar-lite did not accept connections on 127.0.0.1:{port} within {timeout:g}s (see {self.log_file})")
            time.sleep(0.01)
        self.url, self.port = f"pulsar://127.0.0.1:{port}", port
        self.pid_file.write_text(str(self.process.pid))
        self.url_file.write_text(self.url + "\n")
        log.info("broker.started", url=self.url, pid=self.process.pid, data_dir=str(self.data_dir))
        return self.url

    def _wait_for_other(self, deadline: float) -> str | None:
        """Another process is starting a broker on this directory: use it once it is up."""
        while time.monotonic() < deadline:
            url = self.running()
            if url:
                self.url, self.port, self.reused = url, _port_of(url), True
                return url
            time.sleep(0.05)
        return None

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a broker we started (never one we reused) and remove its URL file."""
        process, self.process = self.process, None
        if process is None:
            return
        terminate(process, timeout)
        for path in (self.url_file, self.pid_file):
            try:
                if path == self.pid_file and path.read_text().strip() != str(process.pid):
                    continue
                path.unlink()
            except (OSError, ValueError):
                pass
        log.info("broker.stopped", url=self.url)

    def kill(self) -> None:
        """SIGKILL, for crash tests: leaves the URL file behind like a real crash."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def __enter__(self) -> "EmbeddedBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
