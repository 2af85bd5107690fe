"""Errors and version signals in the official CLI's dialect, for `/api/cli` routes only.

Our API nests errors (`{"error": {"code", "message", "details"}}`); the official client reads
them flat: `{"code", "message", **details}`, with validation problems as
`issues: [{key, message}]`. The route class here renders every error raised by an `/api/cli`
route (its dependencies included) that way, refuses official CLIs older than `OLDEST_CLI`
with 426, and stamps the version status header on every answer.

    router = APIRouter(prefix="/api/cli", route_class=OfficialRoute)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from osmosis.platform.core.errors import AuthRequired, PlatformError
from osmosis.wire.official import (
    CLI_VERSION_HEADER,
    OLDEST_CLI,
    VERSION_MESSAGE_HEADER,
    VERSION_STATUS_HEADER,
    parse_cli_version,
)

logger = logging.getLogger("osmosis.platform")

# What a bare HTTPException's status means, in the words the official client knows.
_STATUS_CODES = {
    401: "TOKEN_INVALID",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    422: "VALIDATION",
}
# Keys a detail may not take: they would overwrite the error's own fields.
_RESERVED = frozenset({"code", "message"})


def flat_error(
    status: int, code: str, message: str, details: Mapping[str, Any] | None = None
) -> JSONResponse:
    """One error in the official shape: `{"code", "message", **details}`."""
    body: dict[str, Any] = {k: v for k, v in (details or {}).items() if k not in _RESERVED}
    body.update(code=code, message=message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def official_error(request: Request, exc: Exception) -> JSONResponse:
    """Any exception raised while serving an `/api/cli` route, as the official client reads it."""
    if isinstance(exc, PlatformError):
        code = exc.code
        if isinstance(exc, AuthRequired) and code == AuthRequired.code:
            code = "TOKEN_EXPIRED" if "expired_at" in exc.details else "TOKEN_INVALID"
        return flat_error(exc.status_code, code, exc.message, exc.details)
    if isinstance(exc, RequestValidationError):
        issues = [
            {
                "key": ".".join(str(part) for part in issue.get("loc", ()) if part != "body"),
                "message": str(issue.get("msg", "")),
            }
            for issue in exc.errors()
        ]
        return flat_error(422, "VALIDATION", "the request is not valid", {"issues": issues})
    if isinstance(exc, HTTPException):
        code = _STATUS_CODES.get(exc.status_code, "INTERNAL")
        return flat_error(exc.status_code, code, str(exc.detail))
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return flat_error(500, "INTERNAL", "internal server error")


def version_refusal(request: Request) -> JSONResponse | None:
    """426 for an official CLI older than `OLDEST_CLI`; None for newer ones and other clients."""
    sent = request.headers.get(CLI_VERSION_HEADER)
    version = parse_cli_version(sent) if sent else None
    if version is None or version >= OLDEST_CLI:
        return None
    oldest = ".".join(str(part) for part in OLDEST_CLI)
    message = (
        f"this osmosis server serves the official osmosis CLI from {oldest} on; you run "
        f"{sent}: run `osmosis upgrade`"
    )
    return JSONResponse({"status": "unsupported", "message": message}, status_code=426)


def stamp_version(response: Response) -> Response:
    # "current": the official client stays silent; it warns only on other statuses.
    response.headers[VERSION_STATUS_HEADER] = "current"
    response.headers.setdefault(VERSION_MESSAGE_HEADER, "")
    return response


class OfficialRoute(APIRoute):
    """An APIRoute whose errors, dependencies' included, come out flat and version-stamped."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def serve(request: Request) -> Response:
            refusal = version_refusal(request)
            if refusal is not None:
                return refusal
            try:
                response = await handler(request)
            except Exception as exc:
                response = official_error(request, exc)
            return stamp_version(response)

        return serve


__all__ = ["OfficialRoute", "flat_error", "official_error", "stamp_version", "version_refusal"]
