"""A real authorization server for the MCP front's OAuth tests (`scripts/oauth_server.py`: panva's oidc-provider),
and how its tokens are had: the official SDK client's OAuth flow, or a raw token request where a test needs the
token itself (to expire it, forge from it, present it to the wrong server); and `SlowIssuer`, a key set served by a
tiny local HTTP server that can trickle its answers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

SECRET = "a secret nobody guesses"


def signing_key(kid: str) -> tuple[dict[str, Any], rsa.RSAPrivateKey]:
    """A fresh RSA key as the private JWK the authorization server signs with, and the key itself."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key))
    return {**jwk, "kid": kid, "alg": "RS256", "use": "sig"}, key


def client(client_id: str) -> dict[str, Any]:
    return {
        "client_id": client_id,
        "client_secret": SECRET,
        "grant_types": ["client_credentials"],
        "redirect_uris": [],
        "response_types": [],
        "token_endpoint_auth_method": "client_secret_basic",
    }


class MemoryStorage:
    """The SDK's `TokenStorage`, in memory: each test's client starts without tokens."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.info = client_info


def sdk_oauth(endpoint: str, issuer: str, client_id: str) -> ClientCredentialsOAuthProvider:
    """The official SDK's client-credentials OAuth flow for `client_id`: it finds the authorization server from the
    front's 401 and metadata, and asks for a token for the front's resource URI."""
    return ClientCredentialsOAuthProvider(
        server_url=endpoint, storage=MemoryStorage(), client_id=client_id, client_secret=SECRET, issuer=issuer
    )


async def token(issuer: str, client_id: str, resource: str, scope: str = "") -> str:
    """An access token straight from the token endpoint (client credentials, RFC 8707 `resource`)."""
    async with httpx2.AsyncClient(timeout=10) as http:
        data = {"grant_type": "client_credentials", "resource": resource}
        if scope:
            data["scope"] = scope
        answer = await http.post(f"{issuer}/token", data=data, auth=(client_id, SECRET))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["access_token"])


class SlowIssuer:
    """A key set served on 127.0.0.1 by a tiny HTTP server that can turn slow: with `trickle` set, each answer is
    its headers, then one byte of body every `interval` seconds, without end; `served` counts the requests.

    The hostile issuer the front must not wait on: every read gets its byte in time, so only a deadline on the
    whole fetch cuts it."""

    def __init__(self, keys: list[dict[str, Any]], interval: float = 0.05) -> None:
        self.document = json.dumps({"keys": keys}).encode()
        self.interval = interval
        self.trickle = False
        self.served = 0
        self._server: asyncio.Server | None = None
        self._answering: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/jwks"

    async def __aenter__(self) -> SlowIssuer:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._answering:
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._answering.add(task)
        try:
            while await reader.readline() not in (b"\r\n", b"\n", b""):
                pass  # the request line and headers: every request is for the key set
            self.served += 1
            if not self.trickle:
                head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(self.document)}\r\n"
                writer.write(f"{head}Connection: close\r\n\r\n".encode() + self.document)
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000000\r\n\r\n")
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(self.interval)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._answering.discard(task)
