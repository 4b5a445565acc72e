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
    python scripts/oauth_server.py serve      # a local issuer to try `toolreg mcp --oauth-issuer` with

`serve` runs one on 127.0.0.1 (`--port`, 9000 unless told) with one client
(`--client`, `--scopes`) and a fresh signing key, prints the issuer, the
client, and the commands that get a token and start the MCP front against
it, and serves until Ctrl-C.

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
import secrets
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
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
    serve = commands.add_parser("serve", help="run a local authorization server until Ctrl-C; print how to use it")
    serve.add_argument("--port", type=int, default=9000, help="its port on 127.0.0.1 (default 9000)")
    serve.add_argument("--client", default="agent", help="the client id it knows (default agent)")
    serve.add_argument("--scopes", default="mcp", help='scopes the client may get (default "mcp")')
    serve.add_argument(
        "--resource", default="http://127.0.0.1:8765/mcp", help="the MCP front's URL: the tokens' audience"
    )
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    print(f"node={mcp_conformance.fetch().node} oidc-provider={home()}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    """One authorization server in the foreground, and the lines a newcomer needs to use it."""
    secret = secrets.token_urlsafe(24)
    client = {
        "client_id": args.client,
        "client_secret": secret,
        "grant_types": ["client_credentials"],
        "redirect_uris": [],
        "response_types": [],
        "token_endpoint_auth_method": "client_secret_basic",
    }
    server = AuthorizationServer({"clients": [client], "grants": {args.client: args.scopes}}, port=args.port)
    server.start()
    listen = args.resource.split("://", 1)[-1].split("/", 1)[0]
    print(
        f"issuer:   {server.issuer}\n"
        f"client:   {args.client}, secret {secret} (client credentials; scopes: {args.scopes})\n"
        f"token:    curl -s -u {args.client}:{secret} -d grant_type=client_credentials -d 'scope={args.scopes}'"
        f" -d resource={args.resource} {server.issuer}/token\n"
        f"front:    toolreg mcp --http {listen} --resource {args.resource} --oauth-issuer {server.issuer}\n"
        "then call the front with: Authorization: Bearer <the access_token>; Ctrl-C stops this server",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set() and server.process is not None and server.process.poll() is None:
        stop.wait(0.5)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
