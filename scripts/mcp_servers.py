"""MCP servers nobody here wrote, on demand: `@modelcontextprotocol/server-everything` from npm and the official
Python SDK's own example servers (FastMCP, now `MCPServer`) from the `mcp` source distribution on PyPI.

Why: `toolreg announce --mcp` brings existing MCP servers into the fleet, so it is tested against the servers MCP
client authors test against, not against servers written to suit it.

    python scripts/mcp_servers.py fetch      # install both once, into the cache; print where they are

`server-everything` runs on the Node.js 22 that `scripts/mcp_conformance.py` installs (the machine's own may be
older); it is installed beside it with the machine's `npm` into
`~/.cache/tool-discovery/mcp-server-everything-<version>` (or `$TOOLREG_MCP_SERVERS_CACHE/...`), once, under a lock.
The SDK's examples come from the source distribution of the `mcp` release installed here (`pip download
--no-binary`), unpacked into `~/.cache/tool-discovery/mcp-sdk-examples-<version>`. Standard library only.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import mcp_conformance

EVERYTHING_VERSION = "2026.8.31"
EVERYTHING = f"@modelcontextprotocol/server-everything@{EVERYTHING_VERSION}"
INSTALL_TIMEOUT = 600.0


def _cache_root() -> Path:
    return Path(os.environ.get("TOOLREG_MCP_SERVERS_CACHE", Path.home() / ".cache" / "tool-discovery"))


@dataclass(frozen=True)
class Everything:
    """`server-everything`: `command("stdio")` or `command("streamableHttp")` (which listens on `$PORT`)."""

    node: Path
    entry: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.node), str(self.entry), *args]


def _once(root: Path, installed: Callable[[], bool], install: Callable[[Path], None]) -> None:
    """Run `install(staging)` into a fresh folder renamed to `root`, unless `installed()`; one installer at a time."""
    if installed():
        return
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others find it done
        if installed():
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            install(staging)
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def everything() -> Everything:
    """`server-everything` and the Node.js 22 it runs on, installed into the cache unless they are there already."""
    node = mcp_conformance.fetch().node
    root = _cache_root() / f"mcp-server-everything-{EVERYTHING_VERSION}"
    entry = root / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"

    def install(staging: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("mcp_servers: npm is not on PATH; install Node.js and npm (apt-get install nodejs npm)")
        (staging / "package.json").write_text('{"private": true}\n')
        print(f"mcp_servers: installing {EVERYTHING} into {root}", file=sys.stderr)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", EVERYTHING],
            cwd=staging,
            check=True,
            timeout=INSTALL_TIMEOUT,
            stdout=subprocess.DEVNULL,
        )

    _once(root, entry.is_file, install)
    if not entry.is_file():
        raise SystemExit(f"mcp_servers: {root} has no server-everything after the install; remove it and retry")
    return Everything(node, entry)


def sdk_examples() -> Path:
    """The `examples/` folder of the installed `mcp` release's source distribution (its `mcpserver/*.py` are the
    FastMCP examples), downloaded and unpacked into the cache unless it is there already."""
    version = metadata.version("mcp")
    root = _cache_root() / f"mcp-sdk-examples-{version}"
    examples = root / "examples"

    def install(staging: Path) -> None:
        print(f"mcp_servers: fetching the examples of mcp {version} into {root}", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:"]
            + ["--dest", str(staging), f"mcp=={version}"],
            check=True,
            timeout=INSTALL_TIMEOUT,
            stdout=subprocess.DEVNULL,
        )
        (archive,) = staging.glob("mcp-*.tar.gz")
        prefix = f"mcp-{version}/examples/"
        with tarfile.open(archive) as sdist:
            members = [m for m in sdist.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
            for member in members:
                member.name = member.name[len(f"mcp-{version}/") :]
            sdist.extractall(staging, members=members, filter="data")
        archive.unlink()

    _once(root, (examples / "mcpserver").is_dir, install)
    return examples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="install server-everything and the SDK's examples into the cache")
    parser.parse_args(argv)
    found = everything()
    print(f"server-everything: {' '.join(found.command('stdio'))}")
    print(f"sdk examples: {sdk_examples()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
