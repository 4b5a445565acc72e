"""Who may read the registry page: anyone on this machine when it is bound to loopback, else the bearer of the token.

On a loopback address the Host header must be exactly `localhost` or a
loopback IP literal, compared as a parsed name, never as a text prefix, so
another site cannot read the page through DNS rebinding. Bound anywhere
else the page requires the bearer token `TOOLREG_HTTP_TOKEN`
(`HttpSettings.http_token`), compared in constant time: `Authorization: Bearer
<token>`, or `/?token=<token>` once, which sets a cookie (HttpOnly,
SameSite=Strict) and redirects to `/`.

Another site's page can make a browser send requests here, though not read
the answers; it is refused before anything is done for it. A request that
says it comes from another origin (`Origin`, which browsers send on
cross-origin fetches, event streams and forms) is refused unless it names this
page's own host exactly; one that a browser says is cross-site
(`Sec-Fetch-Site`) is refused unless it is a top-level navigation (a link to
the page from elsewhere still opens it).
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from .health import is_loopback_host, split_host
from .settings import HttpSettings

__all__ = ["COOKIE", "TOKEN_ENV", "PageAccess"]

TOKEN_ENV = HttpSettings.env("http_token")
COOKIE = "toolreg_token"


class PageAccess:
    """Who may read the page: anyone on this machine when bound to loopback; else the bearer of the token."""

    def __init__(self, loopback: bool, token: str | None) -> None:
        self.loopback = loopback
        self.token = token or None

    def login(self, request: Request) -> Response | None:
        """`/?token=<token>` off loopback: the redirect that sets the cookie (or the refusal of a wrong token); None for
        any other request."""
        offered = request.query_params.get("token")
        if offered is None or self.token is None or self.loopback:
            return None
        if not hmac.compare_digest(offered.encode(), self.token.encode()):
            return self.refusal(request) or Response(status_code=401)
        redirect = RedirectResponse("./", status_code=303)
        redirect.set_cookie(COOKIE, offered, httponly=True, samesite="strict", secure=request.url.scheme == "https")
        return redirect

    def refusal(self, request: Request) -> Response | None:
        """None if the request may read the page; else the response to send instead."""
        foreign = _foreign(request)
        if foreign is not None:
            return JSONResponse({"error": foreign}, status_code=403)
        if self.loopback:
            given = request.headers.get("host", "")
            parsed = split_host(given)
            if parsed is None or not is_loopback_host(parsed[0]):
                return JSONResponse(
                    {
                        "error": (
                            "the registry page answers only to Host localhost or a loopback address, not"
                            f" {given[:100]!r}"
                        )
                    },
                    status_code=403,
                )
            return None
        if self.token is None:
            return JSONResponse(
                {"error": f"the registry page is not served off loopback without a token; set {TOKEN_ENV} and restart"},
                status_code=403,
            )
        presented = _bearer(request) or request.cookies.get(COOKIE) or ""
        if hmac.compare_digest(presented.encode(), self.token.encode()):
            return None
        return JSONResponse(
            {
                "error": (
                    f"the registry page needs the token in {TOKEN_ENV}: send 'Authorization: Bearer <token>' or open"
                    " /?token=<token>"
                )
            },
            status_code=401,
            headers={"WWW-Authenticate": 'Bearer realm="toolreg"'},
        )


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _foreign(request: Request) -> str | None:
    """Why a request another site's page made is refused; None for this page's own, or one no browser made."""
    host = request.headers.get("host", "").lower()
    origin = request.headers.get("origin")
    if origin is not None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not host or parts.netloc.lower() != host:
            return f"the registry page answers only its own origin, not {origin[:100]!r}"
    site, mode = request.headers.get("sec-fetch-site"), request.headers.get("sec-fetch-mode")
    if site == "cross-site" and mode != "navigate":
        return "the registry page does not answer another site's requests (only links to it)"
    return None
