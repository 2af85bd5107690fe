"""The platform's error family and the one handler that renders every error as JSON.

Each error carries its code and HTTP status, so a route raises `NotFound("no user u1")`
and the body is `{"error": {"code": "NOT_FOUND", "message": "no user u1", "details": {}}}`.
Validation errors, HTTPExceptions and unexpected exceptions take the same shape; an
unexpected one is logged with its traceback and answered with a bare 500. A write the disk
refused (SQLite's "database or disk is full", PostgreSQL's `DiskFull`, ENOSPC or EDQUOT from a
file) is no bug of ours: it is a 507 `DISK_FULL` that says what to do, and reads go on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis.platform.core.disk import disk_full_reason

logger = logging.getLogger("osmosis.platform")


class PlatformError(Exception):
    """Base of expected errors; subclasses set `code` and `status_code`."""

    code = "PLATFORM_ERROR"
    status_code = 400

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})


class ValidationFailed(PlatformError):
    code = "VALIDATION"
    status_code = 422


class AuthRequired(PlatformError):
    code = "AUTH_REQUIRED"
    status_code = 401


class Forbidden(PlatformError):
    code = "FORBIDDEN"
    status_code = 403


class NotFound(PlatformError):
    code = "NOT_FOUND"
    status_code = 404


class Conflict(PlatformError):
    code = "CONFLICT"
    status_code = 409


class DiskFull(PlatformError):
    """A write the platform's disk (or its database's) has no room for; reads still work."""

    code = "DISK_FULL"
    status_code = 507


def disk_full(reason: str) -> DiskFull:
    """The 507 for a write refused by a full disk, saying what the operator can do."""
    return DiskFull(
        f"the platform's disk is full ({reason}): this change was not saved. Reads still "
        "work; ask the operator to free space on the disk of the platform's home or "
        "database, then try again (no restart needed)",
        details={"reason": reason},
    )


# What an HTTPException raised by Starlette or FastAPI itself means in our vocabulary.
_STATUS_CODES = {
    401: "AUTH_REQUIRED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    422: "VALIDATION",
    429: "RATE_LIMITED",
}


def error_body(code: str, message: str, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": dict(details or {})}}


def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The single translation from any exception to the JSON error envelope."""
    headers: dict[str, str] | None = None
    if isinstance(exc, PlatformError):
        status, body = exc.status_code, error_body(exc.code, exc.message, exc.details)
        if isinstance(exc, AuthRequired):
            headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, RequestValidationError):
        issues = [
            {
                "loc": [str(part) for part in issue.get("loc", ())],
                "message": str(issue.get("msg", "")),
                "type": str(issue.get("type", "")),
            }
            for issue in exc.errors()
        ]
        status = 422
        body = error_body("VALIDATION", "the request is not valid", {"issues": issues})
    elif isinstance(exc, HTTPException):
        status = exc.status_code
        code = _STATUS_CODES.get(status, "PLATFORM_ERROR" if status < 500 else "INTERNAL")
        body = error_body(code, str(exc.detail))
        headers = dict(exc.headers) if exc.headers else None
    elif (reason := disk_full_reason(exc)) is not None:
        logger.warning(
            "%s %s refused: the disk is full (%s)", request.method, request.url.path, reason
        )
        full = disk_full(reason)
        status, body = full.status_code, error_body(full.code, full.message, full.details)
    else:
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        status, body = 500, error_body("INTERNAL", "internal server error")
    return JSONResponse(body, status_code=status, headers=headers)


class _CatchUnexpected:
    """Turns an exception no handler claimed into the 500 envelope.

    Starlette's own last-resort handler re-raises after answering, so the server would log
    the traceback twice; catching it here logs it once, through `error_response`.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:  # too late for a clean answer; let the server drop the connection
                raise
            response = error_response(Request(scope), exc)
            await response(scope, receive, send)


def install_error_handling(app: FastAPI) -> None:
    """Route every kind of error through `error_response`."""
    for kind in (PlatformError, RequestValidationError, HTTPException):
        app.add_exception_handler(kind, error_response)
    app.add_middleware(_CatchUnexpected)
