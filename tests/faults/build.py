"""The two Go programs the fault tests use, built once with the machine's Go and cached.

    python tests/faults/build.py        # build both (CI does, before the suite); prints their paths

- `toxiproxy`: Shopify's Toxiproxy server (`github.com/Shopify/toxiproxy/v2`, a
  `tool` of `lincheck/go.mod`): the TCP proxy between each process and the
  broker that partitions, delays, throttles and cuts on command.
- `lincheck`: `lincheck/main.go`, porcupine (`github.com/anishathalye/porcupine`,
  the checker etcd's robustness tests use) over a recorded history.

Modules come from the Go module proxy into Go's module cache, pinned by
`lincheck/go.sum`; the binaries go to `~/.cache/tool-discovery/faults/<digest>`
(or `$TOOLREG_FAULTS_CACHE`), the digest covering the sources and the Go
version, so a change rebuilds and an unchanged tree never does. Standard
library only: it runs before the project is installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "lincheck"
TOXIPROXY_PACKAGE = "github.com/Shopify/toxiproxy/v2/cmd/server"
BUILD_TIMEOUT = 600.0


class BuildError(RuntimeError):
    """Go is missing or a build failed; the message says what to do."""


@dataclass(frozen=True)
class Binaries:
    toxiproxy: Path
    lincheck: Path


def cache_root() -> Path:
    default = Path.home() / ".cache" / "tool-discovery" / "faults"
    return Path(os.environ.get("TOOLREG_FAULTS_CACHE") or default)


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "Go is needed to build the fault tests' proxy and checker; install it (Debian: apt-get install golang-go)"
        )
    return go


def _digest(go: str) -> str:
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(version.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((SOURCE / name).read_bytes())
    return digest.hexdigest()[:16]


def build() -> Binaries:
    """Both binaries, built now unless this tree's build is cached."""
    go = _go()
    target = cache_root() / _digest(go)
    binaries = Binaries(toxiproxy=target / "toxiproxy-server", lincheck=target / "lincheck")
    if binaries.toxiproxy.exists() and binaries.lincheck.exists():
        return binaries
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a waiting one then finds it done
        for output, package in ((binaries.lincheck, "."), (binaries.toxiproxy, TOXIPROXY_PACKAGE)):
            if not output.exists():
                _go_build(go, output, package)
    return binaries


def _go_build(go: str, output: Path, package: str) -> None:
    print(f"faults: building {output.name} with {go}", file=sys.stderr, flush=True)
    partial = output.with_suffix(".partial")
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false", "CGO_ENABLED": "0"}
    try:
        done = subprocess.run(
            [go, "build", "-o", str(partial), package],
            cwd=SOURCE,
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        raise BuildError(
            f"go build {package} took over {BUILD_TIMEOUT:g}s; is the Go module proxy reachable?"
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip() or "no output").splitlines()[-1]
        raise BuildError(f"go build {package} failed: {said} (GOPROXY={os.environ.get('GOPROXY', 'default')})")
    partial.rename(output)


if __name__ == "__main__":
    try:
        built = build()
    except BuildError as exc:
        print(f"faults: error: {exc}", file=sys.stderr)
        sys.exit(1)
    print(built.toxiproxy)
    print(built.lincheck)
