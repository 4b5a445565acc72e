"""A real Apache Pulsar 4.0 standalone on demand, as a plain Java process (no container engine).

Why: production runs on Apache Pulsar, and the embedded pulsar-lite differs from
it. Tests, benchmarks and the deploy script must meet the real broker.

    python scripts/apache_pulsar.py fetch             # download + unpack once, into the cache
    python scripts/apache_pulsar.py start [--auth] [--dir D] [--topicspace tg]
    python scripts/apache_pulsar.py env|status|stop [--dir D]

The server distribution comes from Maven Central (`ARTIFACT`), cached under
`~/.cache/tool-discovery/apache-pulsar` (or `$TOOLREG_PULSAR_CACHE`), unpacked
once and reused. A broker's data, configuration, logs and `state.json` live
in its data directory (a temporary one unless `--dir` is given; a temporary
one is removed on stop). `--topicspace NAME` (repeatable) also makes tenant NAME
with the product's namespaces, as deploy/pulsar-init.sh does: `--topicspace tg`
is what `toolreg up` and the rest use by default. Python:
`ApachePulsar(data_dir, auth=False).start()`, then `.ensure_topicspace("tg")`.
Standard library only, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

VERSION = "4.0.8"  # newest 4.0.x (LTS, Java 17) whose server distribution Maven Central serves: 4.0.9-4.0.13 are not
ARTIFACT = f"org.apache.pulsar:pulsar-server-distribution:{VERSION}:tar.gz:bin"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
CLUSTER = "standalone"
PRODUCT_NAMESPACES = (
    "request",
    "response",
    "notify",
    "discovery",
    "state",
    "audit",
)  # every topic is <tenant>/<one of these>/<name>
UNLIMITED_RETENTION = {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}
NAMESPACE_POLICIES: dict[str, dict[str, Any]] = {"state": {"retention": UNLIMITED_RETENTION}}
"""Policies set on a namespace after it is created (what deploy/pulsar-init.sh sets): the replicated store's log and
snapshots in `state` must be kept without limit, whoever reads them."""
KIND_GRANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "store": {namespace: ("produce", "consume") for namespace in PRODUCT_NAMESPACES},
    "service": {"request": ("consume",), "response": ("produce",), "discovery": ("produce", "consume")},
    "agent": {
        "request": ("produce",),
        "response": ("produce", "consume"),
        "notify": ("consume",),
        "audit": ("produce",),
    },
    "operator": {
        "request": ("produce",),
        "response": ("produce", "consume"),
        "notify": ("consume",),
        "state": ("consume",),
        "audit": ("consume",),
    },
}
"""What each kind of process may do on each namespace: what deploy/pulsar-init.sh grants TOOLREG_<KIND>_ROLE."""
KIND_PROCESSES = {
    "store": "toolreg up, toolreg registry",
    "service": "toolreg serve, toolreg announce",
    "agent": "toolreg call, toolreg mcp, a ToolSet",
    "operator": "toolreg config, tools, replicas, store export",
}
"""What runs as each kind's role: said beside each token `start --auth` makes."""
RESERVED_SUBSCRIPTIONS = ("config-store", "tool-registry")
"""Subscriptions of the request namespace only the store's role may use (deploy/pulsar-init.sh reserves them)."""
DEFAULT_TOPICSPACE = "tg"
"""The tenant every toolreg process uses unless TOOLREG_TOPICSPACE names another."""
TOPICSPACE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
ROLE_NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
"""What toolreg accepts as a topicspace (toolservice_base.topics.check_topicspace): a Pulsar tenant name."""
SUPERUSER = "admin"
START_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0
HEAP = "-Xms512m -Xmx512m -XX:MaxDirectMemorySize=512m"  # the default pre-touches a 2 GB heap

# Appended to a copy of conf/standalone.conf: the last value of a key wins.
OVERRIDES = """
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
brokerServicePort={broker_port}
webServicePort={web_port}
listeningInterface={loopback}
allowAutoTopicCreation=true
allowAutoTopicCreationType=non-partitioned
brokerShutdownTimeoutMs=3000
diskUsageThreshold=0.99
diskUsageWarnThreshold=0.99
webSocketServiceEnabled=false
functionsWorkerEnabled=false
forceDeleteTenantAllowed=true
forceDeleteNamespaceAllowed=true
"""
AUTH_REFRESH_CHECK = 1
"""Seconds between the broker's checks of each connection's token (Apache Pulsar's default: 60): a token that expires
while a client runs is found within a second or two, so tests of expiry need no minute-long waits."""
AUTH_OVERRIDES = """
authenticationEnabled=true
authenticationProviders=org.apache.pulsar.broker.authentication.AuthenticationProviderToken
tokenSecretKey=file://{secret_key}
authorizationEnabled=true
superUserRoles={superuser}
brokerClientAuthenticationPlugin=org.apache.pulsar.client.impl.auth.AuthenticationToken
brokerClientAuthenticationParameters=file://{superuser_token}
authenticationRefreshCheckSeconds={refresh_check}
"""


class PulsarError(RuntimeError):
    """Apache Pulsar could not be fetched, started or reached; the message says what to do."""


def progress(message: str) -> None:
    print(f"apache-pulsar: {message}", file=sys.stderr, flush=True)


# --- fetch ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLREG_PULSAR_CACHE") or Path.home() / ".cache" / "tool-discovery" / "apache-pulsar")


def _central_url() -> str | None:
    """Maven Central's URL as this Maven knows it (its super POM), so no repository address is written here."""
    mvn = shutil.which("mvn")
    if mvn is None:
        return None
    for jar in (Path(mvn).resolve().parent.parent / "lib").glob("maven-model-builder-*.jar"):
        with zipfile.ZipFile(jar) as archive:
            pom = archive.read("org/apache/maven/model/pom-4.0.0.xml").decode()
        start = pom.find("<url>", pom.find("<id>central</id>"))
        return pom[start + 5 : pom.find("</url>", start)].strip()
    return None


def _maven_settings(cache: Path) -> list[str]:
    """Send every repository request to Central: Pulsar's parent POM names others we neither need nor reach.

    A user's own ~/.m2/settings.xml (a company mirror, say) is respected instead.
    """
    if (Path.home() / ".m2" / "settings.xml").exists():
        return []
    central = _central_url()
    if central is None:
        return []
    settings = cache / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>"
        f"<url>{central}</url></mirror></mirrors></settings>\n"
    )
    return ["-s", str(settings)]


def fetch(cache: Path | None = None) -> Path:
    """Download and unpack the server distribution once; return its home (the directory holding bin/pulsar)."""
    cache = cache or cache_dir()
    home = cache / f"apache-pulsar-{VERSION}"
    if (home / ".unpacked").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; a waiting one then finds it done
        if not (home / ".unpacked").exists():
            tarball, download_s = _download(cache)
            unpack_s = _unpack(tarball, home)
            record = {
                "artifact": ARTIFACT,
                "bytes": tarball.stat().st_size,
                "download_s": download_s,
                "unpack_s": unpack_s,
            }
            tarball.unlink()
            (home / ".unpacked").write_text(json.dumps(record) + "\n")
    return home


def _download(cache: Path) -> tuple[Path, float]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PulsarError(
            "Maven (`mvn`) is not installed; install it (Debian: apt-get install maven) to fetch Apache Pulsar"
        )
    out, repo = cache / "downloads", cache / "m2"
    command = [
        mvn,
        "-B",
        *_maven_settings(cache),
        f"-Dmaven.repo.local={repo}",
        f"{DEPENDENCY_PLUGIN}:copy",
        f"-Dartifact={ARTIFACT}",
        f"-DoutputDirectory={out}",
    ]
    log = cache / "maven.log"
    progress(f"downloading {ARTIFACT} (about 245 MB) with Maven; log {log}")
    started = time.monotonic()
    with open(log, "wb") as handle:
        maven = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        partial = repo / "org" / "apache" / "pulsar" / "pulsar-server-distribution" / VERSION
        while maven.poll() is None:
            time.sleep(2)
            size = sum(f.stat().st_size for f in partial.glob("*")) if partial.exists() else 0
            what = f"{size / 1e6:.0f} MB" if size else "Maven is resolving its plugin"
            progress(f"downloading: {what} after {time.monotonic() - started:.0f}s")
    elapsed = time.monotonic() - started
    tarball = out / f"pulsar-server-distribution-{VERSION}-bin.tar.gz"
    if maven.returncode != 0 or not tarball.exists():
        errors = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("[ERROR]")]
        raise PulsarError(f"Maven could not fetch {ARTIFACT}: {errors[0] if errors else 'no error line'} (see {log})")
    for copy in partial.glob("*.tar.gz"):
        copy.unlink()  # Maven's own copy: the unpacked tree is what we keep
    progress(f"downloaded {tarball.stat().st_size / 1e6:.0f} MB in {elapsed:.1f}s")
    return tarball, elapsed


def _unpack(tarball: Path, home: Path) -> float:
    progress(f"unpacking into {home}")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="unpack-", dir=home.parent))
    try:
        with tarfile.open(tarball) as archive:
            archive.extractall(scratch, filter="data")
        (top,) = [p for p in scratch.iterdir() if (p / "bin" / "pulsar").exists()]
        if home.exists():
            shutil.rmtree(home)  # a half-finished earlier unpack
        top.rename(home)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - started
    progress(f"unpacked in {elapsed:.1f}s")
    return elapsed


# --- ports and processes -------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nobody listens on now (held together while chosen, so never the same twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # the bookie binds every address if it cannot find the loopback interface
        except OSError:
            return False
    return True


def _loopback_interface() -> str:
    return next((name for _, name in socket.if_nameindex() if name == "lo" or name.startswith("lo0")), "lo")


def _is_our_broker(pid: int, data_dir: Path) -> bool:
    """The pid is a live JVM logging into this data directory (not a recycled pid)."""
    try:
        return f"-Dpulsar.log.dir={data_dir / 'logs'}".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _java() -> str:
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not Path(java).exists():
        raise PulsarError(
            "Java 17 or newer is needed for Apache Pulsar 4.0; install it (Debian: apt-get install"
            " openjdk-17-jre-headless) or set JAVA_HOME"
        )
    return str(java)


# --- the broker ----------------------------------------------------------------------------------


class ApachePulsar:
    """One Apache Pulsar standalone (broker + one bookie + RocksDB metadata in one JVM) on loopback ports.

    `data_dir=None` makes a temporary directory, removed on `stop()`. Started
    again on the same data directory, it keeps its ports and its data (a
    restart, as clients see it).
    """

    def __init__(self, data_dir: str | Path | None = None, *, auth: bool = False, home: Path | None = None) -> None:
        self.temporary = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="apache-pulsar-")).absolute()
        self.auth = auth
        self._home = home
        self.process: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        self.broker_port = self.web_port = self.bookie_port = 0
        self.token: str | None = None
        self.started_in: float | None = None

    # addresses ---------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "state.json"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "pulsar.out"

    @property
    def home(self) -> Path:
        if self._home is None:
            self._home = fetch()
        return self._home

    def env(self) -> dict[str, str]:
        env = {"PULSAR_URL": self.url, "PULSAR_ADMIN_URL": self.admin_url}
        if self.token:
            env["PULSAR_AUTH_TOKEN"] = self.token
        return env

    # lifecycle ---------------------------------------------------------------
    @classmethod
    def attach(cls, data_dir: str | Path) -> "ApachePulsar":
        """The broker recorded in `data_dir`'s state file (started by another process)."""
        broker = cls(data_dir)
        state = broker._read_state()
        if state is None:
            raise PulsarError(
                f"no Apache Pulsar recorded in {broker.data_dir}; start one with `scripts/apache-pulsar start`"
            )
        return broker

    def _read_state(self) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        self.broker_port, self.web_port, self.bookie_port = (
            state["broker_port"],
            state["web_port"],
            state["bookie_port"],
        )
        self.pid, self.token, self.auth = state.get("pid"), state.get("token"), bool(state.get("auth"))
        self.temporary = bool(state.get("temporary"))
        return state

    def running(self) -> bool:
        return self.pid is not None and _is_our_broker(self.pid, self.data_dir)

    def start(self, timeout: float = START_TIMEOUT) -> "ApachePulsar":
        """Start and wait until the admin API lists `public/default`; reuse the ports of an earlier run here."""
        auth, temporary = self.auth, self.temporary  # this call's choice, not the last run's
        previous = self._read_state()
        self.auth, self.temporary = auth, temporary
        if not auth:
            self.token = None
        if previous and self.running():
            raise PulsarError(f"Apache Pulsar already runs on {self.data_dir} (pid {self.pid}); stop it first")
        ports = [self.broker_port, self.web_port] if previous else free_ports(2)
        busy = [p for p in ports if not port_is_free(p)]
        if busy:
            raise PulsarError(f"port(s) {busy} on 127.0.0.1 are in use; stop what holds them or use a new --dir")
        self.broker_port, self.web_port = ports
        home = self.home
        for sub in ("logs", "tmp", "auth"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        try:
            conf = self._write_conf(home)
            _java()
        except BaseException:
            if self.temporary:  # nothing ran yet: leave nothing behind
                shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        command = [
            str(home / "bin" / "pulsar"),
            "standalone",
            "--no-functions-worker",
            "--no-stream-storage",
            "--metadata-dir",
            str(self.data_dir / "metadata"),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
            "--advertised-address",
            "127.0.0.1",  # no --bookkeeper-port: 4.0 ignores it and picks a free one
        ]
        env = {
            **os.environ,
            "PULSAR_STANDALONE_CONF": str(conf),
            "PULSAR_LOG_DIR": str(self.data_dir / "logs"),
            "PULSAR_MEM": HEAP,
            "PULSAR_GC": "-XX:+UseG1GC",
            "PULSAR_EXTRA_OPTS": (
                f"-Djava.io.tmpdir={self.data_dir / 'tmp'} -Dpulsar.allocator.exit_on_oom=true "
                "-Dio.netty.recycler.maxCapacityPerThread=4096"
            ),
        }
        started = time.monotonic()
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=home,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches us; we stop the broker ourselves
            )
        self.pid = self.process.pid  # bin/pulsar execs the JVM: this is the broker's pid
        self._write_state()
        progress(
            f"starting Apache Pulsar {VERSION} (pid {self.pid}, broker {self.url}, admin {self.admin_url}, log"
            f" {self.log_file})"
        )
        try:
            self._wait_ready(started, timeout)
        except BaseException:
            self.stop(remove=False)
            raise
        self.started_in = time.monotonic() - started
        self.bookie_port = self._bookie_port_from_log()
        self._write_state()
        progress(f"ready in {self.started_in:.1f}s")
        return self

    def _bookie_port_from_log(self) -> int:
        """The bookie picks its own free port (bound to loopback through `listeningInterface`): read it back."""
        marker = "Starting new bookie on port: "
        lines = [line for line in self.log_file.read_text(errors="replace").splitlines() if marker in line]
        return int(lines[-1].rsplit(marker, 1)[1].split()[0]) if lines else 0

    def _write_conf(self, home: Path) -> Path:
        overrides = OVERRIDES.format(
            broker_port=self.broker_port, web_port=self.web_port, loopback=_loopback_interface()
        )
        if self.auth:
            overrides += AUTH_OVERRIDES.format(
                secret_key=self._secret_key(home),
                superuser=SUPERUSER,
                superuser_token=self._superuser_token_file(home),
                refresh_check=AUTH_REFRESH_CHECK,
            )
        conf = self.data_dir / "standalone.conf"
        # The shipped file does not end with a newline: without one the first override joins its last line.
        conf.write_text((home / "conf" / "standalone.conf").read_text().rstrip("\n") + "\n" + overrides)
        return conf

    def _secret_key(self, home: Path) -> Path:
        key = self.data_dir / "auth" / "secret.key"
        if not key.exists():
            self._tool(home, "tokens", "create-secret-key", "--output", str(key))
        return key

    def _superuser_token_file(self, home: Path) -> Path:
        path = self.data_dir / "auth" / f"{SUPERUSER}.token"
        if not path.exists():
            path.write_text(self.mint_token(SUPERUSER))
        self.token = path.read_text().strip()
        return path

    def mint_token(self, role: str, *, secret_key: Path | None = None, expires_in: float | None = None) -> str:
        """A token for `role`, signed with this broker's secret key (or another key, to make a wrong token).

        What `bin/pulsar tokens create --subject ROLE [--expiry-time ...]` makes (an HS256 JWT over the raw key
        bytes, claims `sub` and `exp`), made here without starting a JVM. `expires_in`: seconds from now.
        """
        key = (secret_key or self.data_dir / "auth" / "secret.key").read_bytes()
        claims: dict[str, Any] = {"sub": role}
        if expires_in is not None:
            claims["exp"] = int(time.time() + expires_in)

        def part(value: dict[str, Any] | bytes) -> str:
            raw = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
            return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

        signed = f"{part({'alg': 'HS256'})}.{part(claims)}"
        return f"{signed}.{part(hmac.new(key, signed.encode(), hashlib.sha256).digest())}"

    def _tool(self, home: Path, *args: str) -> str:
        env = {
            **os.environ,
            "PULSAR_LOG_DIR": str(self.data_dir / "logs"),
            "PULSAR_MEM": "-Xmx128m",
            "PULSAR_GC": "-XX:+UseSerialGC",
            "PULSAR_EXTRA_OPTS": "-XX:TieredStopAtLevel=1",  # a one-shot JVM starts faster
        }
        result = subprocess.run(
            [str(home / "bin" / "pulsar"), *args], env=env, capture_output=True, text=True, timeout=120
        )
        if result.returncode != 0:
            said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
            raise PulsarError(f"bin/pulsar {' '.join(args[:2])} failed: {said}")
        return result.stdout

    def _write_state(self) -> None:
        state = {
            "version": VERSION,
            "pid": self.pid,
            "broker_url": self.url,
            "admin_url": self.admin_url,
            "broker_port": self.broker_port,
            "web_port": self.web_port,
            "bookie_port": self.bookie_port,
            "auth": self.auth,
            "token": self.token,
            "temporary": self.temporary,
            "log": str(self.log_file),
        }
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    def _wait_ready(self, started: float, timeout: float) -> None:
        reported = 0
        while True:
            elapsed = time.monotonic() - started
            if self.process is not None and self.process.poll() is not None:
                raise PulsarError(
                    f"Apache Pulsar exited during start (code {self.process.returncode}); see {self.log_file}"
                )
            if elapsed > timeout:
                raise PulsarError(f"Apache Pulsar was not ready within {timeout:g}s; see {self.log_file}")
            if "public/default" in self.namespaces("public", quiet=True):
                return
            if elapsed - reported >= 5:
                reported = elapsed
                progress(f"waiting for the admin API to list public/default ({elapsed:.0f}s)")
            time.sleep(0.25)

    def stop(self, timeout: float = STOP_TIMEOUT, *, remove: bool | None = None) -> None:
        """SIGTERM (broker and bookie close cleanly), SIGKILL after `timeout`; remove a temporary data directory."""
        if self.pid is None:
            self._read_state()
        pid, process = self.pid, self.process
        if pid is not None and (process is not None or _is_our_broker(pid, self.data_dir)):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while self._alive(pid, process) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._alive(pid, process):
                progress(f"pid {pid} still running after {timeout:g}s: killing it")
                os.kill(pid, signal.SIGKILL)
                while self._alive(pid, process):
                    time.sleep(0.05)
        self.process, self.pid = None, None
        if self.state_file.exists():
            self._write_state()  # the ports stay recorded, so a restart on this directory reuses them
        if self.temporary if remove is None else remove:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _alive(self, pid: int, process: subprocess.Popen[bytes] | None) -> bool:
        if process is not None:
            return process.poll() is None
        return _is_our_broker(pid, self.data_dir)

    def restart(self, timeout: float = START_TIMEOUT) -> float:
        """Stop and start again on the same ports and data; returns the seconds the broker was away."""
        went = time.monotonic()
        self.stop(remove=False)
        self.start(timeout)
        return time.monotonic() - went

    def __enter__(self) -> "ApachePulsar":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # admin REST API ----------------------------------------------------------
    def admin(self, method: str, path: str, body: Any = None, *, token: str | None = None, timeout: float = 30) -> Any:
        """One admin REST call (`path` under /admin/v2); JSON in and out. Raises PulsarError on an HTTP error."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.admin_url}/admin/v2/{path.lstrip('/')}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        bearer = token if token is not None else self.token
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise PulsarError(f"{method} {path}: HTTP {exc.code} {detail[:200]}") from None
        return json.loads(text) if text.strip() else None

    def namespaces(self, tenant: str, *, quiet: bool = False) -> list[str]:
        try:
            return list(self.admin("GET", f"namespaces/{tenant}", timeout=5))
        except (PulsarError, OSError):
            if quiet:
                return []
            raise

    def create_tenant(
        self, name: str, namespaces: Iterable[str] = PRODUCT_NAMESPACES, *, roles: Iterable[str] = ()
    ) -> list[str]:
        """A tenant allowed on this cluster with the product's namespaces; `roles` may produce and consume on them."""
        self.admin("PUT", f"tenants/{name}", {"allowedClusters": [CLUSTER], "adminRoles": []})
        created = []
        for namespace in namespaces:
            self.admin("PUT", f"namespaces/{name}/{namespace}")
            for policy, value in NAMESPACE_POLICIES.get(namespace, {}).items():
                self.admin("POST", f"namespaces/{name}/{namespace}/{policy}", value)
            for role in roles:
                self.admin("POST", f"namespaces/{name}/{namespace}/permissions/{role}", ["produce", "consume"])
            created.append(f"{name}/{namespace}")
        return created

    def ensure_topicspace(self, name: str) -> list[str]:
        """Tenant `name` with the product's namespaces and their policies, as deploy/pulsar-init.sh makes them.

        Safe to run again: what exists is kept, and the policies are set every time. Returns one line per step.
        """
        said = []
        if name in self.admin("GET", "tenants"):
            said.append(f"tenant {name}: exists")
        else:
            self.admin("PUT", f"tenants/{name}", {"allowedClusters": [CLUSTER], "adminRoles": []})
            said.append(f"tenant {name}: created (cluster {CLUSTER})")
        existing = set(self.namespaces(name))
        for namespace in PRODUCT_NAMESPACES:
            full = f"{name}/{namespace}"
            if full in existing:
                said.append(f"namespace {full}: exists")
            else:
                self.admin("PUT", f"namespaces/{full}")
                said.append(f"namespace {full}: created")
            for policy, value in NAMESPACE_POLICIES.get(namespace, {}).items():
                self.admin("POST", f"namespaces/{full}/{policy}", value)
                said.append(
                    f"namespace {full}: {policy} {'unlimited' if value == UNLIMITED_RETENTION else json.dumps(value)}"
                )
        return said

    def grant_kinds(self, tenant: str, roles: dict[str, str]) -> dict[str, str]:
        """Grant each kind of process (`KIND_GRANTS`: store, service, agent, operator) its role on `tenant`'s
        namespaces, as deploy/pulsar-init.sh does, and reserve the store's subscriptions for the store's role.

        `roles`: kind -> role name. Returns kind -> a token of that role, minted with this broker's key.
        """
        for kind, role in roles.items():
            for namespace, actions in KIND_GRANTS[kind].items():
                self.grant(f"{tenant}/{namespace}", role, actions)
        if "store" in roles:
            for subscription in RESERVED_SUBSCRIPTIONS:
                path = f"namespaces/{tenant}/request/permissions/subscription/{subscription}"
                self.admin("POST", path, [roles["store"]])
        return {kind: self.mint_token(role) for kind, role in roles.items()}

    def token_file(self, role: str) -> Path:
        """A token of `role` in the data directory (`auth/<role>.token`), minted once with this broker's key."""
        if not ROLE_NAME.match(role):
            raise PulsarError(f"{role!r} is not a role name (letters, digits, '-', '_', '.')")
        path = self.data_dir / "auth" / f"{role}.token"
        if not path.exists():
            path.write_text(self.mint_token(role) + "\n")
            path.chmod(0o600)
        return path

    def kind_tokens(self, topicspaces: Iterable[str]) -> dict[str, Path]:
        """One role per kind of process (named for its kind: store, service, agent, operator), granted what its kind
        needs on each of `topicspaces` (`grant_kinds`), and a token file of each: kind -> its path."""
        roles = {kind: kind for kind in KIND_GRANTS}
        for name in topicspaces:
            self.grant_kinds(name, roles)
        return {kind: self.token_file(role) for kind, role in roles.items()}

    def delete_tenant(self, name: str) -> None:
        """Delete a tenant with its namespaces and topics (the broker allows forced deletes)."""
        self.admin("DELETE", f"tenants/{name}?force=true")

    def grant(self, namespace: str, role: str, actions: Iterable[str] = ("produce", "consume")) -> None:
        """Let `role` do `actions` on `namespace` (`tenant/ns`); granting again replaces what it had."""
        self.admin("POST", f"namespaces/{namespace}/permissions/{role}", list(actions))

    def revoke(self, namespace: str, role: str) -> None:
        """Take every permission `role` has on `namespace` away."""
        self.admin("DELETE", f"namespaces/{namespace}/permissions/{role}")

    def permissions(self, namespace: str) -> dict[str, list[str]]:
        return dict(self.admin("GET", f"namespaces/{namespace}/permissions"))

    def delete_namespace(self, namespace: str) -> None:
        """Delete `namespace` with its topics, even while clients use them (the broker allows forced deletes)."""
        self.admin("DELETE", f"namespaces/{namespace}?force=true")


# --- command line --------------------------------------------------------------------------------


def _current_pointer() -> Path:
    return cache_dir() / "current"


def _resolve_dir(given: str | None) -> Path:
    if given:
        return Path(given).absolute()
    try:
        return Path(_current_pointer().read_text().strip())
    except OSError:
        raise PulsarError("no Apache Pulsar started here; run `scripts/apache-pulsar start` or pass --dir") from None


def _say_kind_tokens(broker: ApachePulsar, topicspaces: list[str]) -> None:
    """`start --auth`: where each kind of process's token is, and how a process runs with it (on stderr: stdout stays
    `export`-able)."""
    files = broker.kind_tokens(topicspaces)
    granted = f"granted on {', '.join(topicspaces)}" if topicspaces else "granted nothing yet (no --topicspace)"
    progress(f"a role per kind of process, {granted}; each one's token:")
    for kind, path in files.items():
        progress(f"  {kind:<8} {path}   ({KIND_PROCESSES[kind]})")
    progress(f"run each with its own: PULSAR_AUTH_TOKEN_FILE={files['store']} toolreg up")
    progress("the superuser's token is PULSAR_AUTH_TOKEN below (toolreg init); another role's: token --role NAME")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="apache-pulsar",
        description=__doc__.split("\n\n")[0],
        epilog=(
            "For toolreg on it: scripts/apache-pulsar start --topicspace tg, then PULSAR_URL=... toolreg up "
            '(a broker without the topicspace\'s namespaces makes toolreg stop with "no namespace tg/notify").'
        ),
    )
    parser.add_argument("command", choices=["fetch", "start", "stop", "status", "env", "token"])
    parser.add_argument("--dir", help="data directory (default: a temporary one, removed on stop)")
    parser.add_argument("--auth", action="store_true", help="token authentication and authorization on (start)")
    parser.add_argument(
        "--topicspace",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            f"with start: also create tenant NAME with toolreg's namespaces ({', '.join(PRODUCT_NAMESPACES)}; state"
            f" kept without limit), as deploy/pulsar-init.sh does; repeatable. `toolreg up` uses {DEFAULT_TOPICSPACE!r}"
            " unless TOOLREG_TOPICSPACE names another"
        ),
    )
    parser.add_argument(
        "--role", metavar="NAME", help="with token: print the path of a token of role NAME (made once, in --dir)"
    )
    args = parser.parse_args(argv)
    if (args.role is None) != (args.command != "token"):
        parser.error("token takes --role NAME (and only token does)")
    if args.topicspace and args.command != "start":
        parser.error("--topicspace goes with start")
    bad = [name for name in args.topicspace if not TOPICSPACE_NAME.match(name)]
    if bad:
        parser.error(f"--topicspace {bad[0]!r} is not a valid Pulsar tenant name (letters, digits, '-', '_', '.')")
    try:
        if args.command == "fetch":
            print(fetch())
        elif args.command == "start":
            broker = ApachePulsar(args.dir, auth=args.auth)
            broker.start()
            cache_dir().mkdir(parents=True, exist_ok=True)
            _current_pointer().write_text(str(broker.data_dir) + "\n")
            for name in dict.fromkeys(args.topicspace):
                for line in broker.ensure_topicspace(name):
                    progress(line)
            if args.auth:
                _say_kind_tokens(broker, list(dict.fromkeys(args.topicspace)))
            print("\n".join(f"{k}={v}" for k, v in broker.env().items()))
        else:
            broker = ApachePulsar.attach(_resolve_dir(args.dir))
            if args.command == "env":
                print("\n".join(f"{k}={v}" for k, v in broker.env().items()))
            elif args.command == "token":
                if not (broker.data_dir / "auth" / "secret.key").exists():
                    raise PulsarError(f"the Apache Pulsar in {broker.data_dir} runs without --auth: it takes no token")
                print(broker.token_file(args.role))
            elif args.command == "status":
                ready = broker.running() and "public/default" in broker.namespaces("public", quiet=True)
                print(
                    f"{'ready' if ready else 'running, not ready' if broker.running() else 'stopped'} "
                    f"pid={broker.pid} url={broker.url} admin={broker.admin_url} dir={broker.data_dir}"
                )
                return 0 if ready else 1
            else:
                broker.stop()
                pointer = _current_pointer()
                if pointer.exists() and Path(pointer.read_text().strip()) == broker.data_dir:
                    pointer.unlink()
                progress(f"stopped{' and removed ' + str(broker.data_dir) if broker.temporary else ''}")
    except PulsarError as exc:
        print(f"apache-pulsar: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
