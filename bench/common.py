"""What every benchmark shares: statistics, the progress line, and the product stack it measures.

A benchmark never talks to a half-reused deployment: each one gets a `Stack`
of its own (a fresh embedded broker unless `PULSAR_URL` names one, a fresh
data directory, and the product's own processes started the way an operator
starts them: `toolreg up`, `toolreg registry`). Figures are therefore the
product as deployed, with the registry and the store in processes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from discovery.broker import EmbeddedBroker
from discovery.broker.embedded import terminate
from toolservice_base import Settings

ROOT = Path(__file__).resolve().parent.parent
APACHE_PULSAR: Any = None
"""The run's Apache Pulsar (`BENCH_BROKER=apache-pulsar`), for a benchmark that restarts it or makes tenants; None:
none started by the run."""
T = TypeVar("T")


# --- statistics ------------------------------------------------------------


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile: p99 of 200 samples is the 198th, a real observation, not an interpolation."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def summary_ms(samples_s: list[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds, plus the sample count."""
    ms = [s * 1000 for s in samples_s]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 3) if ms else float("nan"),
        "p95_ms": round(percentile(ms, 95), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "max_ms": round(max(ms), 3) if ms else float("nan"),
    }


# --- progress --------------------------------------------------------------


class Progress:
    """One status line on stderr, rewritten in place on a terminal, one line per step otherwise.

    The suite runs for minutes; a silent terminal looks hung.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.2 if self._tty else 5.0):
            return
        self._last = now
        line = f"[{self.name} {now - self.started:5.1f}s] {text}"
        if self._tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self, text: str) -> None:
        self.update(text, force=True)
        if self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# --- waiting ---------------------------------------------------------------


async def until(check: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.001) -> float:
    """Poll `check` until truthy; returns perf_counter() at the moment it was seen."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


# --- processes -------------------------------------------------------------


def product_env(url: str, data_dir: Path, broker: str = "pulsar-lite", **extra: str) -> dict[str, str]:
    """The environment a product process gets: our broker (and its kind) and data dir, quiet JSON logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULSAR_URL", "TOOLREG_"))}
    env.update(
        PULSAR_URL=url,
        TOOLREG_BROKER=broker,
        TOOLREG_DATA_DIR=str(data_dir),
        TOOLREG_LOG_FORMAT="json",
        TOOLREG_LOG_LEVEL="warning",
        TOOLREG_EVENT_LOOP="uvloop" if os.environ.get(LOOP_ENV) == "uvloop" else "asyncio",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def spawn(args: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen[bytes]:
    """A child Python process (`python -m ...`), logging to `log`, in its own session so Ctrl-C reaches us first.
    Run in `cwd` (this checkout by default): `python -m` puts the working directory first on the path."""
    with open(log, "ab") as handle:
        return subprocess.Popen(
            [sys.executable, *args],
            env=env,
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


PROFILE_ENV = "TOOLREG_BENCH_PROFILE_DIR"


def profiling() -> bool:
    """Whether `python -m bench --profile DIR` asked for py-spy profiles."""
    return bool(os.environ.get(PROFILE_ENV))


def _py_spy_record(name: str, *options: str) -> list[str]:
    """A `py-spy record` command writing raw collapsed stacks to `<profile dir>/<name>.txt`; py-spy sits next to the
    interpreter."""
    out = Path(os.environ[PROFILE_ENV]) / f"{name}.txt"
    return [
        str(Path(sys.executable).parent / "py-spy"),
        "record",
        "--format",
        "raw",
        "--rate",
        "250",
        "--output",
        str(out),
        *options,
    ]


def _spawn_profiled(name: str, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A Python process run under py-spy from its start."""
    with open(log, "ab") as handle:
        return subprocess.Popen(
            _py_spy_record(name, "--", sys.executable, *args),
            env=env,
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


class CpuPerCall:
    """CPU time per call (microseconds, all threads, user and system) of named processes, over the blocks measured
    with it (`with meter.over(calls):`): on a shared machine it moves far less than wall-clock figures. Each
    process's main thread is counted apart too: in a Python process on pulsar-client, what the rest is (the
    client's I/O and listener threads) is the native cost of the messages, which no Python of ours runs."""

    def __init__(self, processes: dict[str, int]) -> None:
        import psutil  # a bench extra

        self._processes = {name: psutil.Process(pid) for name, pid in processes.items()}
        self._seconds = dict.fromkeys(processes, 0.0)
        self._main = dict.fromkeys(processes, 0.0)
        self._calls = 0

    def _now(self) -> tuple[dict[str, float], dict[str, float]]:
        """(each process's CPU, its main thread's): the process's own count, which keeps the time of threads that
        have ended, unlike a sum over the threads alive now."""
        every, main = {}, {}
        for name, process in self._processes.items():
            every[name] = sum(process.cpu_times()[:2])
            main[name] = sum(t.user_time + t.system_time for t in process.threads() if t.id == process.pid)
        return every, main

    @contextlib.contextmanager
    def over(self, calls: int) -> Iterator[None]:
        before, main_before = self._now()
        yield
        after, main_after = self._now()
        for name in self._seconds:
            self._seconds[name] += after[name] - before[name]
            self._main[name] += main_after[name] - main_before[name]
        self._calls += calls

    def figures(self) -> dict[str, float]:
        """Microseconds per call by process, over every block measured."""
        return {name: round(1e6 * seconds / max(self._calls, 1)) for name, seconds in self._seconds.items()}

    def main_thread_figures(self) -> dict[str, float]:
        """Microseconds per call of each process's main thread alone (its event loop, in ours); a process whose
        main thread did nothing (a broker's, which works in threads of its own) is left out."""
        return {name: round(1e6 * seconds / max(self._calls, 1)) for name, seconds in self._main.items() if seconds}


@contextlib.contextmanager
def sampled(pid: int, name: str) -> Iterator[None]:
    """Under `--profile`, py-spy samples the running process `pid` (native frames too) for the block.

    Raw collapsed stacks go to `<profile dir>/<name>.txt`; `python -m bench.profile_summary`
    reads them. Without `--profile` this does nothing.
    """
    if not profiling():
        yield
        return
    spy = subprocess.Popen(
        _py_spy_record(name, "--native", "--threads", "--pid", str(pid)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # attaching takes a moment
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            terminate(spy)


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM one process we started (by its pid), then SIGKILL if it lingers."""
    terminate(proc, timeout)


def wait_for_line(log: Path, marker: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Block until `marker` shows in a child's log (its own 'ready' line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and marker in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"bench: {log.name} exited ({proc.returncode}) before"
                f" '{marker}':\n{log.read_text(errors='replace')[-2000:]}"
            )
        time.sleep(0.02)
    raise TimeoutError(f"bench: no '{marker}' in {log.name} after {timeout:g}s")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_metrics(port: int) -> dict[str, float]:
    """A Prometheus text page as {series: value} (series with labels kept verbatim)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                pass
    return values


# --- the stack -------------------------------------------------------------


@dataclass
class Stack:
    """Broker + config store (+ registry) for one benchmark, torn down in reverse order.

    `split_registry=True` runs the registry as a process of its own
    (`toolreg registry`), so its CPU and memory can be measured alone; its
    /metrics page (counters of heartbeats, expiries, rejections) is on
    `metrics_port`; `registry_args` are more options for `toolreg registry`.
    """

    workdir: Path
    registry: bool = True
    split_registry: bool = False
    registry_args: tuple[str, ...] = ()
    url: str = ""
    data_dir: Path = field(init=False)
    metrics_port: int | None = None
    broker: EmbeddedBroker | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data_dir = self.workdir / "data"

    @property
    def broker_kind(self) -> str:
        """The embedded broker is pulsar-lite; a `PULSAR_URL` broker is what `TOOLREG_BROKER` says, Apache Pulsar by
        default."""
        return "pulsar-lite" if self.broker is not None else os.environ.get("TOOLREG_BROKER") or "apache-pulsar"

    @property
    def settings(self) -> Settings:
        return Settings(data_dir=self.data_dir, pulsar_url=self.url, broker=self.broker_kind)

    def env(self, **extra: str) -> dict[str, str]:
        return product_env(self.url, self.data_dir, self.broker_kind, **extra)

    def start(self) -> "Stack":
        self.workdir.mkdir(parents=True, exist_ok=True)
        external = os.environ.get("PULSAR_URL")
        if external:
            self.url = external
        else:
            self.broker = EmbeddedBroker(self.workdir / "broker")
            self.url = self.broker.start()
        up_args = ["-m", "discovery.cli", "up"]
        if not self.registry or self.split_registry:
            up_args.append("--no-registry")
        log = self.workdir / "up.log"
        proc = self.processes["up"] = spawn(up_args, self.env(), log)
        wait_for_line(log, "ready in", proc)
        if self.registry and self.split_registry:
            self.metrics_port = free_port()
            log = self.workdir / "registry.log"
            args = ["-m", "discovery.cli", "registry", "--metrics-port", str(self.metrics_port), *self.registry_args]
            if profiling():  # `--profile`: sample the registry with py-spy; its CPU figures then include py-spy's
                proc = self.processes["registry"] = _spawn_profiled(
                    f"registry-{self.workdir.name}", args, self.env(), log
                )
            else:
                proc = self.processes["registry"] = spawn(args, self.env(), log)
            wait_for_line(log, "registry listening", proc)
        return self

    @property
    def registry_pid(self) -> int:
        """The registry's own pid (under `--profile`, the child py-spy started, not py-spy)."""
        pid = self.processes["registry"].pid
        if profiling():
            import psutil

            children = psutil.Process(pid).children()
            if children:
                return int(children[0].pid)
        return pid

    def stop(self) -> None:
        if profiling() and "registry" in self.processes:
            # py-spy writes its profile when the program it runs exits: stop the registry, not py-spy.
            import psutil

            child = self.registry_pid
            if child != self.processes["registry"].pid:
                psutil.Process(child).terminate()
            try:
                self.processes["registry"].wait(15)
            except subprocess.TimeoutExpired:
                pass
        for name in reversed(list(self.processes)):
            stop_process(self.processes.pop(name))
        if self.broker is not None:
            self.broker.stop()
            self.broker = None


class Workdirs:
    """Temporary directories for one run, removed at the end (they hold nothing worth keeping)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="toolreg-bench-"))

    def make(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


async def gather_limited(limit: int, jobs: list[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run coroutine factories at most `limit` at a time (starting 20 services at once on 2 cores is its own
    benchmark)."""
    gate = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await job()

    return await asyncio.gather(*(one(job) for job in jobs))


LOOP_ENV = "BENCH_LOOP"
"""`uvloop`: run the bench and the processes it starts on uvloop's event loop instead of asyncio's (uvloop
installed)."""


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run`, on uvloop when `BENCH_LOOP=uvloop` (inherited by every process the bench starts)."""
    if os.environ.get(LOOP_ENV) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
