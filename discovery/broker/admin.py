"""Apache Pulsar's admin REST API (`/admin/v2`), as much of it as preparing a topicspace needs.

`toolreg init` talks to a cluster's web service, the one `bin/pulsar-admin`
talks to, with a superuser's token when authentication is on. A refusal,
an absent service or an answer that is not the admin API's is one line
saying what to fix (`ClusterAdminError`); nothing of httpx reaches the caller.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

import httpx

from discovery.errors import ClusterAdminError

DEFAULT_ADMIN_PORT = 8080
"""Apache Pulsar's webServicePort: where the admin API is when only the broker's `pulsar://` URL is known."""
TIMEOUT = 10.0


def admin_url_for(broker_url: str) -> str:
    """The admin API of the broker at `pulsar://HOST:PORT` (`pulsar+ssl://` gives https), on its default port."""
    parts = urlsplit(broker_url.split(",")[0])
    if parts.scheme not in ("pulsar", "pulsar+ssl") or not parts.hostname:
        raise ClusterAdminError(
            f"cannot tell the admin API's address from the broker URL {broker_url!r}: give --admin-url (or"
            " PULSAR_ADMIN_URL), e.g. http://broker:8080"
        )
    scheme = "https" if parts.scheme == "pulsar+ssl" else "http"
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}:{DEFAULT_ADMIN_PORT}"


class PulsarAdmin:
    """An async client of one cluster's admin API; `async with` opens and closes its connections."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = TIMEOUT) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=f"{self.url}/admin/v2/", headers=headers, timeout=timeout)
        self.authenticated = token is not None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self._http.aclose()

    async def get(self, path: str) -> Any:
        return await self._call("GET", path)

    async def put(self, path: str, body: Any = None, *, exists_ok: bool = False) -> Any:
        """`exists_ok`: a 409 (what `path` makes exists already) is no error."""
        return await self._call("PUT", path, body, exists_ok=exists_ok)

    async def post(self, path: str, body: Any = None) -> Any:
        return await self._call("POST", path, body)

    async def delete(self, path: str, *, missing_ok: bool = False) -> Any:
        """`missing_ok`: a 404 (nothing there to delete) is no error."""
        return await self._call("DELETE", path, missing_ok=missing_ok)

    async def _call(
        self, method: str, path: str, body: Any = None, *, exists_ok: bool = False, missing_ok: bool = False
    ) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.TimeoutException:
            raise ClusterAdminError(
                f"the admin API at {self.url} did not answer {method} {path} within {self._http.timeout.read:g}s;"
                " is it the broker's web service (port 8080 by default)?"
            ) from None
        except httpx.HTTPError as exc:
            raise ClusterAdminError(
                f"cannot reach Apache Pulsar's admin API at {self.url} ({exc or type(exc).__name__}); is the broker"
                " running, and is --admin-url (or PULSAR_ADMIN_URL) its web service's URL?"
            ) from None
        if response.status_code in (401, 403):
            raise ClusterAdminError(
                f"the admin API at {self.url} refused {method} {path} (HTTP {response.status_code}): "
                + (
                    "the token is not a superuser's; give one in PULSAR_ADMIN_TOKEN_FILE"
                    if self.authenticated
                    else "it wants a superuser's token: give it in PULSAR_ADMIN_TOKEN_FILE"
                )
            )
        if (response.status_code == 409 and exists_ok) or (response.status_code == 404 and missing_ok):
            return None
        if response.status_code >= 400:
            raise ClusterAdminError(
                f"the admin API at {self.url} answered {method} {path} with HTTP {response.status_code}:"
                f" {_reason(response)}"
            )
        if not response.content.strip():
            return None
        try:
            return response.json()
        except ValueError:
            raise ClusterAdminError(
                f"{self.url} answered {method} {path} with something other than JSON: is it Apache Pulsar's admin API?"
            ) from None


def _reason(response: httpx.Response) -> str:
    """The admin API's own words for a refusal (`{"reason": ...}`), else the start of the body."""
    try:
        reason = response.json().get("reason")
    except (ValueError, AttributeError):
        reason = None
    return str(reason or response.text.strip()[:200] or response.reason_phrase)
