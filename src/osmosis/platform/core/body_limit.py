"""A cap on request bodies, applied before any route parses one.

Every JSON route and dashboard form reads its whole body into memory before validating it, so
an unbounded body is a way to exhaust the server. This ASGI middleware answers 413
`PAYLOAD_TOO_LARGE` (the usual error envelope) when `Content-Length` says too much, and stops a
chunked body as soon as it passes the cap. The routes that stream a raw body to disk (the
dataset upload, with `OSMOSIS_MAX_UPLOAD_BYTES`, and the files of a run import, each checked
against its declared size) are exempt.

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis.platform.core.errors import error_body

# Streamed to disk, never buffered whole, each with its own limit: (method, path prefix).
_STREAMED = (
    ("POST", "/api/datasets"),
    ("PUT", "/api/eval-runs/imports/"),
    ("PUT", "/api/cli/transfer/"),  # the official CLI's dataset bytes, capped by their route
)


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, before the application reads them."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _streamed(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(declared)(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised into whatever reads the body; the error handler renders the 413.
                    raise HTTPException(413, self._message(None))
            return message

        await self.app(scope, counting_receive, send)

    def _message(self, size: int | None) -> str:
        said = f"is {size:,} bytes" if size is not None else "is larger than that"
        return (
            f"this route accepts a request body of at most {self.max_bytes:,} bytes "
            f"(OSMOSIS_MAX_BODY_BYTES) and this one {said}; dataset files go to "
            "POST /api/datasets"
        )

    def _refuse(self, size: int) -> JSONResponse:
        details = {"size": size, "max_body_bytes": self.max_bytes}
        body = error_body("PAYLOAD_TOO_LARGE", self._message(size), details)
        # The body is not read: close the connection rather than drain it.
        return JSONResponse(body, status_code=413, headers={"Connection": "close"})


def _streamed(method: str, path: str) -> bool:
    return any(
        method == verb and (path == prefix if not prefix.endswith("/") else path.startswith(prefix))
        for verb, prefix in _STREAMED
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None
