"""Toxiproxy between each process and the broker: one `Link` per process, faults on command.

A process reaches the broker only through its link (its `PULSAR_URL` is the
link's address). That holds on the Apache Pulsar 4.0 standalone because the
broker answers every topic lookup with `proxyThroughServiceUrl` set (it does
whenever it runs standalone): pulsar-client keeps each connection on the
service URL instead of dialling the broker's advertised address. Measured:
with the link disabled, a producer created through it can no longer send.
On a multi-broker cluster a lookup would answer the owner's advertised
address and the client would go around the proxy; there each proxy needs an
advertised listener of its own (`advertisedListeners`) and the client its
name (`listenerName`). `direct_connections` checks it holds for a process.

Faults, each on both directions or one (`up`: process to broker, `down`):

- `drop`: a black hole (Toxiproxy's `timeout` toxic, 0: never closes): bytes
  are read and thrown away, the connection stays open; healing closes it (a
  stream that lost bytes cannot go on) and the client reconnects;
- `stall`: nothing moves and nothing is lost (a `latency` toxic of an hour),
  as in a partition TCP rides out: healing delivers everything held, late;
- `delay`: latency and jitter per chunk;
- `throttle`: a bandwidth cap;
- `cut`: every open connection closed at once (the proxy disabled and
  enabled again), as a load balancer or a NAT timeout does.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Direction = Literal["both", "up", "down"]
STALL_MS = 3_600_000


class ToxiproxyError(RuntimeError):
    pass


@dataclass
class Fault:
    """One fault as injected: for the history's report."""

    at: float
    """time.monotonic()"""
    link: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


class Toxiproxy:
    """A Toxiproxy server on a loopback port, for one test; `link(name, upstream)` makes a proxy."""

    def __init__(self, binary: Path, log: Path) -> None:
        self.binary = binary
        self.log = log
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.links: dict[str, Link] = {}
        self.faults: list[Fault] = []

    def start(self, timeout: float = 10.0) -> "Toxiproxy":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        with open(self.log, "ab") as handle:
            self.process = subprocess.Popen(
                [str(self.binary), "-host", "127.0.0.1", "-port", str(self.port)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", "/proxies")
                return self
            except (OSError, ValueError, ToxiproxyError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise ToxiproxyError(f"toxiproxy did not start on port {self.port}; see {self.log}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> "Toxiproxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')}") from None
        return json.loads(text) if text.strip() else None

    def link(self, name: str, upstream: str) -> "Link":
        """A proxy named `name` on a free loopback port to `upstream` (`host:port`)."""
        made = self.call("POST", "/proxies", {"name": name, "listen": "127.0.0.1:0", "upstream": upstream})
        link = Link(self, name, made["listen"])
        self.links[name] = link
        return link

    def heal_all(self) -> None:
        for link in self.links.values():
            link.heal()


class Link:
    """One process's path to the broker."""

    def __init__(self, proxy: Toxiproxy, name: str, listen: str) -> None:
        self._proxy = proxy
        self.name = name
        self.listen = listen
        self.faulty: str | None = None
        """The fault on now, if any."""

    @property
    def url(self) -> str:
        return f"pulsar://{self.listen}"

    def _toxic(self, kind: str, attributes: dict[str, Any], direction: Direction) -> None:
        streams = (
            ["upstream", "downstream"] if direction == "both" else ["upstream" if direction == "up" else "downstream"]
        )
        for stream in streams:
            self._proxy.call(
                "POST",
                f"/proxies/{self.name}/toxics",
                {"name": f"{kind}-{stream}", "type": kind, "stream": stream, "toxicity": 1.0, "attributes": attributes},
            )

    def _record(self, kind: str, **detail: Any) -> None:
        self.faulty = kind
        self._proxy.faults.append(Fault(time.monotonic(), self.name, kind, detail))

    def drop(self, direction: Direction = "both") -> None:
        self._toxic("timeout", {"timeout": 0}, direction)
        self._record("drop", direction=direction)

    def stall(self, direction: Direction = "both") -> None:
        self._toxic("latency", {"latency": STALL_MS, "jitter": 0}, direction)
        self._record("stall", direction=direction)

    def delay(self, ms: int, jitter: int = 0, direction: Direction = "both") -> None:
        self._toxic("latency", {"latency": ms, "jitter": jitter}, direction)
        self._record("delay", ms=ms, jitter=jitter, direction=direction)

    def throttle(self, kilobytes_per_second: int, direction: Direction = "both") -> None:
        self._toxic("bandwidth", {"rate": kilobytes_per_second}, direction)
        self._record("throttle", rate_kb_s=kilobytes_per_second, direction=direction)

    def cut(self) -> None:
        self._proxy.call("POST", f"/proxies/{self.name}", {"enabled": False})
        self._proxy.call("POST", f"/proxies/{self.name}", {"enabled": True})
        self._proxy.faults.append(Fault(time.monotonic(), self.name, "cut"))

    def heal(self) -> None:
        for toxic in self._proxy.call("GET", f"/proxies/{self.name}/toxics") or []:
            self._proxy.call("DELETE", f"/proxies/{self.name}/toxics/{toxic['name']}")
        if self.faulty is not None:
            self._proxy.faults.append(Fault(time.monotonic(), self.name, "heal", {"was": self.faulty}))
        self.faulty = None


def direct_connections(pid: int, port: int) -> int:
    """How many TCP connections process `pid` has open to `port` on loopback (0: everything goes through its link)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[9] in inodes and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count
