"""What keeps web pages out: JSON bodies only, and no cross-origin browser requests.

A page in a browser can POST `text/plain` (or no type at all) to a localhost server without a
preflight; `application/json` makes the browser ask first, and nobody answers yes unless
`--allow-origin` names the page's origin. Browsers put `Origin` on every cross-origin request
(and on a DNS-rebound one, which a preflight does not stop), while API clients send none: a
request with an `Origin` not allowed is refused (403) whatever its route.
"""

from __future__ import annotations

import orjson
from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from latlab.server.schemas import ApiError


def require_json(request: Request) -> None:
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(415, "the body must be JSON: send Content-Type: application/json",
                       code="unsupported_media_type")


class OriginGuard:
    """403 for a request whose `Origin` header is not one of `allowed` ("*": any)."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = {origin.rstrip("/").lower() for origin in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.allowed:
            return await self.app(scope, receive, send)
        origin = next((v for k, v in scope["headers"] if k == b"origin"), None)
        if origin is None or origin.decode("latin-1").rstrip("/").lower() in self.allowed:
            return await self.app(scope, receive, send)
        error = ApiError(403, f"requests from web pages at {origin.decode('latin-1')!r} are "
                         "refused; start latlab serve with --allow-origin to allow them",
                         type="permission_error", code="origin_not_allowed")
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(error.body())})
