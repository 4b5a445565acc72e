"""A real authorization server for the MCP front's OAuth tests (`scripts/oauth_server.py`: panva's oidc-provider),
and how its tokens are had: the official SDK client's OAuth flow, or a raw token request where a test needs the
token itself (to expire it, forge from it, present it to the wrong server)."""

from __future__ import annotations

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
