"""Sign in with an API token, sign out. Both forms carry the session's CSRF token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from osmosis.platform.deps import Db
from osmosis.platform.services.users import authenticate
from osmosis.platform.web.render import render
from osmosis.platform.web.session import (
    CSRF_FIELD,
    check_csrf,
    clear_session,
    end_session,
    new_session,
    read_session,
    start_session,
    write_session,
)

router = APIRouter()


def _safe_next(target: str | None) -> str:
    # Only a path on this site: "//evil.example" or "https://..." would be an open redirect.
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _login_page(request: Request, *, next_url: str, error: str | None, status: int) -> Response:
    # Keep the visitor's session if it is valid, so a second tab's form stays usable.
    state = read_session(request) or new_session(None)
    response = render(
        request,
        "login.html",
        None,
        status_code=status,
        csrf=state.nonce,
        next=next_url,
        error=error,
    )
    write_session(request, response, state)
    return response


@router.get("/login")
def login_form(request: Request, next: str | None = None) -> Response:
    return _login_page(request, next_url=_safe_next(next), error=None, status=200)


@router.post("/login")
def login(
    request: Request,
    db: Db,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "",
) -> Response:
    check_csrf(request, csrf_token)
    uses = request.app.state.token_uses
    found = authenticate(db, secret=token.strip(), uses=uses) if token.strip() else None
    if found is None:
        return _login_page(
            request,
            next_url=_safe_next(next),
            error="That token is not valid or has been revoked.",
            status=401,
        )
    # A sign-in over an earlier one replaces it; the old cookie must not stay usable.
    end_session(db, read_session(request))
    response = RedirectResponse(_safe_next(next), status_code=303)
    write_session(request, response, start_session(db, found))
    return response


@router.post("/logout")
def logout(
    request: Request, db: Db, csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = ""
) -> Response:
    check_csrf(request, csrf_token)
    # Ended on the server, so a copy of the cookie taken before now is refused too.
    end_session(db, read_session(request))
    response = RedirectResponse("/login", status_code=303)
    clear_session(request, response)
    return response
