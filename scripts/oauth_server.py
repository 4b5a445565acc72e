"""An OAuth 2.1 authorization server nobody here wrote, on demand: panva's `oidc-provider` from npm.

Why: `toolreg mcp --http` is an OAuth resource server, so it is tested against
a real, certified authorization server (client credentials, RFC 8707
resource indicators putting the MCP server's URI in the token's audience,
RFC 9068 JWT access tokens, RFC 7662 introspection for opaque ones), driven
by the official MCP SDK client's OAuth flow. oidc-provider was chosen over
Keycloak for the suite's time: a 3.4 MB npm install on the Node.js 22 that
`scripts/mcp_conformance.py` already fetches, ready in well under a second,
against Keycloak's ~200 MB distribution, a Java 21 runtime and a start of
many seconds.

    python scripts/oauth_server.py fetch      # install once, into the cache; print where it is

Installed with the machine's `npm` into
`~/.cache/tool-discovery/oidc-provider-<version>` (or
`$TOOLREG_MCP_SERVERS_CACHE/...`), once, under a lock; `scripts/oauth-server.mjs`
configures it from a JSON file. Python: `AuthorizationServer(config).start()`,
`.stop()`; `.issuer`. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mcp_conformance
import mcp_servers

VERSION = "9.13.3"
PACKAGE = f"oidc-provider@{VERSION}"
SCRIPT = Path(__file__).with_name("oauth-server.mjs")
START_TIMEOUT = 30.0


def home() -> Path:
    """oidc-provider installed into the cache (unless it is there already); the folder holding its node_modules."""
    root = mcp_servers._cache_root() / f"oidc-provider-{VERSION}"
    entry = root / "node_modules" / "oidc-provider" / "lib" / "index.js"

    def install(staging: Path) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("oauth_server: npm is not on PATH; install Node.js and npm (apt-get install nodejs npm)")
        (staging / "package.json").write_text('{"private": true}\n')
        print(f"oauth_server: installing {PACKAGE} into {root}", file=sys.stderr)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error", PACKAGE],
            cwd=staging,
            check=True,
            timeout=mcp_servers.INSTALL_TIMEOUT,
            stdout=subprocess.DEVNULL,
        )

    mcp_servers._once(root, entry.is_file, install)
    if not entry.is_file():
        raise SystemExit(f"oauth_server: {root} has no oidc-provider after the install; remove it and retry")
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AuthorizationServer:
    """One oidc-provider process on a loopback port. `config` is what `oauth-server.mjs` reads, less issuer and port."""

    def __init__(self, config: dict[str, Any], *, port: int | None = None, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.config = {**config, "issuer": self.issuer, "port": self.port}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0
        self._folder = Path(tempfile.mkdtemp(prefix="oauth-server-"))

    def start(self) -> AuthorizationServer:
        node = mcp_conformance.fetch().node
        provider = home()
        config_file = self._folder / "config.json"
        config_file.write_text(json.dumps(self.config))
        began = time.monotonic()
        with open(self.log or os.devnull, "ab") as log:
            self.process = subprocess.Popen(
                [str(node), str(SCRIPT), str(config_file)],
                env={**os.environ, "OIDC_PROVIDER_HOME": str(provider), "NODE_ENV": "test"},
                stdout=subprocess.PIPE,
                stderr=log,
            )
        assert self.process.stdout is not None
        line = self._first_line()
        if not line.startswith(b"ready "):
            self.stop()
            raise RuntimeError(f"oauth_server: oidc-provider did not start (said {line[:200]!r}); see {self.log}")
        self.started_in = time.monotonic() - began
        return self

    def _first_line(self) -> bytes:
        assert self.process is not None and self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if selector.select(timeout=0.1):
                    return self.process.stdout.readline()
                if self.process.poll() is not None:
                    return b""
        return b""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        self.process = None

    def restart(self, **changes: Any) -> AuthorizationServer:
        """Stop and start again on the same port (and so the same issuer), with `changes` to the config (new keys)."""
        self.stop()
        self.config = {**self.config, **changes}
        return self.start()

    def __enter__(self) -> AuthorizationServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self._folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("fetch", help="install oidc-provider (and the Node.js 22 it runs on) into the cache")
    parser.parse_args(argv)
    print(f"node={mcp_conformance.fetch().node} oidc-provider={home()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
