"""The embedded Pulsar-protocol broker: the pulsar-lite binary, run by us.

We start the binary ourselves rather than through pulsar-lite's Python helper,
which logs to a fixed file in the system temp folder and scans a fixed port
range. Here everything lives under the data directory:

    <data-dir>/broker.toml       config: metrics listener off
    <data-dir>/broker.rocksdb/   the broker's data
    <data-dir>/broker.log        its log
    <data-dir>/broker.url        pulsar://127.0.0.1:<port>, read by every other process
    <data-dir>/broker.pid        the process id, to tell a live broker from a stale file
    <data-dir>/broker.port       the port last used, kept after a stop: the next start takes it again

The port stays the same across restarts because every running service and
agent keeps the URL it started with and reconnects to it: a broker that came
back on another port would leave all of them retrying the old one.

It listens on 127.0.0.1 only and has no authentication: it is a laptop and
test broker. Production points `PULSAR_URL` at Apache Pulsar instead.

A data directory the broker cannot write (a read-only mount, a full disk,
where its own log is lost too) is said as such, not as a broker that
"exited with no output": see `_unwritable`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from discovery.disk_access import of_os_error, probe
from discovery.errors import BrokerError
from toolservice_base.logs import get_logger
from toolservice_base.settings import BROKER_URL_FILE

log = get_logger("discovery.broker")

CONFIG = """# Written by toolreg: keep pulsar-lite's metrics listener (0.0.0.0:8080 by default) off.
[metrics]
enabled = false
"""


def binary_path() -> Path:
    import pulsar_lite

    path = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    if not path.exists():
        raise BrokerError(
            f"pulsar-lite binary missing at {path}; reinstall with `pip install --force-reinstall pulsar-lite`"
        )
    return path


def reserve_port(port: int = 0) -> socket.socket:
    """Bind (not listen) a loopback port, free or `port`, and keep it bound while the broker needs it.

    pulsar-lite's own bind succeeds beside this bound, never-listening socket
    (address reuse), while no other process's bind to port 0 (or outgoing
    connection) is handed the same port in the meantime: two brokers never
    end up on one port, and the port stays ours while a crashed broker
    restarts. (A program that binds the port explicitly with SO_REUSEADDR can
    still take it; the restart then says so.)
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
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


def terminate_pid(pid: int, timeout: float = 10.0) -> None:
    """The same for a broker we adopted (not our child): signal it and watch /proc until it is gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            return


def describe_exit(returncode: int | None) -> str:
    """`killed by SIGKILL`, `exit status 1`, or `unknown` for a process that was not our child."""
    if returncode is None:
        return "unknown"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class EmbeddedBroker:
    """Start, find, restart or stop the pulsar-lite broker of one data directory."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        """The broker's process id: our child's, or an adopted broker's (then `process` is None)."""
        self.url: str | None = None
        self.port: int | None = None
        self.reused = False
        """A live broker already served this data directory; we did not start it."""
        self.adopted = False
        """It was reused with `adopt=True`: we watch it and stop it as if we had started it."""
        self.port_note: str | None = None
        """One line when the port used last time could not be taken again (another process has it)."""
        self._reservation: socket.socket | None = None

    @property
    def url_file(self) -> Path:
        return self.data_dir / BROKER_URL_FILE

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def port_file(self) -> Path:
        return self.data_dir / "broker.port"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "broker.toml"

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

    def remembered_port(self) -> int | None:
        """The port this data directory's broker used last (`broker.port`, or a stale `broker.url`)."""
        for path in (self.port_file, self.url_file):
            try:
                text = path.read_text().strip()
            except OSError:
                continue
            port = _port_of(text) if text.startswith("pulsar://") else int(text) if text.isdigit() else None
            if port and 0 < port < 65536:
                return port
        return None

    def alive(self) -> bool:
        """Whether the broker process we own (started or adopted) is still there."""
        if self.process is not None:
            return self.process.poll() is None
        if self.pid is not None:
            return _pid_alive(self.pid)
        return False

    @property
    def exit_status(self) -> str:
        """How the broker we owned ended, for the log line that reports its death."""
        return describe_exit(self.process.returncode if self.process is not None else None)

    def start(self, port: int | None = None, timeout: float = 10.0, *, adopt: bool = False) -> str:
        """Start the broker (or reuse a live one) and return its URL.

        Without `port`, the port used last time is taken again if it is free,
        so processes that kept the old URL find the broker again; if another
        process holds it, `port_note` says so and a free port is used.
        `adopt=True` (for `toolreg up`, which holds the data directory's lock)
        takes over a broker a previous, killed `toolreg up` left running:
        `alive()` watches it and `stop()` stops it.
        """
        existing = self.running()
        if existing:
            self.url, self.port, self.reused = existing, _port_of(existing), True
            if adopt:
                self.pid, self.adopted = int(self.pid_file.read_text().strip()), True
                if self.port:
                    self._reserve(self.port)
                log.info("broker.adopted", url=existing, pid=self.pid, data_dir=str(self.data_dir))
            else:
                log.info("broker.reused", url=existing, data_dir=str(self.data_dir))
            return existing
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.config_file.write_text(CONFIG)
        except OSError as exc:
            raise self._unwritable(exc) from None
        if port and not port_is_free(port):
            raise BrokerError(f"port {port} on 127.0.0.1 is in use; choose another --port or leave it out")
        if not port:
            last = self.remembered_port()
            if last and port_is_free(last):
                port = last
            elif last:
                self.port_note = (
                    f"port {last} (used last time) is taken by another process; "
                    "processes that knew the old URL must be restarted"
                )
                log.warning("broker.port_taken", port=last, data_dir=str(self.data_dir))
        self._reserve(port or 0)
        try:
            if not port:
                if self._reservation is None:
                    raise BrokerError("no free port on 127.0.0.1 for the broker; pass --port")
                port = int(self._reservation.getsockname()[1])
            return self._launch(port, timeout)
        except BaseException:
            self._release()
            raise

    def restart(self, timeout: float = 10.0) -> str:
        """Start the broker again on its port and data, after it died; raises `BrokerError` if it cannot."""
        if self.port is None:
            raise BrokerError("the broker was never started, so there is no port to restart it on")
        if self.alive():
            raise BrokerError(f"the broker (pid {self.pid}) is still running")
        self.process = self.pid = None
        self.reused = self.adopted = False
        if accepts_connections(self.port):
            raise BrokerError(f"port {self.port} on 127.0.0.1 was taken by another process while the broker was down")
        if not self.config_file.exists():
            try:
                self.config_file.write_text(CONFIG)
            except OSError as exc:
                raise self._unwritable(exc) from None
        if self._reservation is None:
            self._reserve(self.port)
        return self._launch(self.port, timeout)

    def _reserve(self, port: int) -> None:
        try:
            self._reservation = reserve_port(port)
        except OSError as exc:
            self._reservation = None  # the free-port check passed; the launch will say what is wrong
            log.debug("broker.reserve_failed", port=port, error=str(exc))

    def _release(self) -> None:
        if self._reservation is not None:
            self._reservation.close()
            self._reservation = None

    def _unwritable(self, exc: OSError | None = None) -> BrokerError:
        """Why the broker's data directory cannot be written, as the one line to stop with; a plain one if the cause is
        not that."""
        problem = (of_os_error(exc, self.data_dir) if exc is not None else None) or probe(self.data_dir)
        if problem is not None:
            return BrokerError(problem.says("the embedded broker's data"))
        return BrokerError(f"cannot write the embedded broker's data at {self.data_dir}: {exc}")

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        """pulsar-lite on `port`, its output appended to the log file, in a session of its own."""
        try:
            logfile = open(self.log_file, "ab")
        except OSError as exc:
            raise self._unwritable(exc) from None
        command = [str(binary_path()), "--config", str(self.config_file), "--addr", f"127.0.0.1:{port}"]
        command += ["--db-path", str(self.data_dir / "broker"), "--log-level", "warn"]
        try:
            return subprocess.Popen(
                command,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the broker last
            )
        finally:
            logfile.close()

    def _launch(self, port: int, timeout: float) -> str:
        self.process = self._spawn(port)
        self.pid = self.process.pid
        deadline = time.monotonic() + timeout
        while not accepts_connections(port, timeout=0.1):
            if self.process.poll() is not None:
                self.process = self.pid = None
                tail = self._log_tail()
                if "LOCK" in tail:
                    other = self._wait_for_other(deadline)
                    if other:
                        return other
                    raise BrokerError(f"another broker holds {self.data_dir}; stop it or use another --data-dir")
                problem = probe(self.data_dir)  # a full disk takes the broker's log with it: ask the file system
                if problem is not None:
                    raise BrokerError(problem.says("the embedded broker's data"))
                raise BrokerError(
                    f"pulsar-lite exited at start: {tail.strip().splitlines()[-1] if tail.strip() else 'no output'}"
                    f" (see {self.log_file})"
                )
            if time.monotonic() > deadline:
                terminate(self.process)
                self.process = self.pid = None
                raise BrokerError(
                    f"pulsar-lite did not accept connections on 127.0.0.1:{port} within {timeout:g}s (see"
                    f" {self.log_file})"
                )
            time.sleep(0.01)
        self.url, self.port = f"pulsar://127.0.0.1:{port}", port
        try:
            self.pid_file.write_text(str(self.process.pid))
            self.url_file.write_text(self.url + "\n")
            self.port_file.write_text(f"{port}\n")
        except OSError as exc:  # a broker no other process can find is no use: stop it
            terminate(self.process)
            self.process = self.pid = None
            raise self._unwritable(exc) from None
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
        """Stop a broker we started or adopted (never one merely reused) and remove its URL file.

        `broker.port` stays: the next start takes the same port again.
        """
        process, pid, adopted = self.process, self.pid, self.adopted
        self.process, self.pid, self.adopted = None, None, False
        self._release()
        if process is not None:
            terminate(process, timeout)
        elif adopted and pid is not None:
            terminate_pid(pid, timeout)
        else:
            return
        for path in (self.url_file, self.pid_file):
            try:
                if path == self.pid_file and path.read_text().strip() != str(pid):
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
        elif self.adopted and self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pid = None

    def __enter__(self) -> "EmbeddedBroker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
