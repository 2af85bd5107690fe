"""Dashboard sign-in: the session cookie, its CSRF token, and who is asking.

The cookie holds `{session_id, nonce, issued}` sealed with the server's secret box (Fernet:
encrypted and authenticated). The session id names a `web_sessions` row, which names the API
token that signed in without the cookie carrying its secret. A request is signed in only while
that row is live: signing out ends it on the server (a copied cookie stops working at once,
the token keeps working), and so do its expiry and revoking the token. The nonce doubles as
the CSRF token: every form that changes state posts it back, and a request whose form value
does not match the cookie's nonce is refused with 403. A visitor who has not signed in gets a
session with no row, so the login form is protected the same way.

    viewer = page_viewer(request, db)      # raises LoginRequired when nobody signed in
    check_csrf(request, form)              # raises CsrfRejected (403) on a missing/wrong token
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated

from fastapi import Depends, Request, Response
from sqlalchemy.orm import Session

from osmosis.platform.core.crypto import SecretBox, SecretUnreadable
from osmosis.platform.core.db.models import ApiToken, User, utcnow
from osmosis.platform.core.db.web_models import WebSession
from osmosis.platform.core.errors import Forbidden, PlatformError
from osmosis.platform.deps import Db
from osmosis.platform.services.users import authenticate

COOKIE = "osmosis_session"
CSRF_FIELD = "csrf_token"
MAX_AGE_S = 14 * 24 * 3600
_CONTEXT = "dashboard-session"


class LoginRequired(PlatformError):
    """Nobody is signed in; pages answer with a redirect to the login page."""

    code = "AUTH_REQUIRED"
    status_code = 401


class CsrfRejected(Forbidden):
    """A state-changing form came without the session's CSRF token."""


@dataclass(frozen=True)
class SessionState:
    """What the cookie carries; `session_id` (a `web_sessions` row) is None before sign-in."""

    nonce: str
    session_id: str | None
    issued: float


@dataclass(frozen=True)
class Viewer:
    """The signed-in user and how they proved it (`via`: "session" or "bearer")."""

    user: User
    token: ApiToken
    via: str
    csrf: str


def _box(request: Request) -> SecretBox:
    box: SecretBox = request.app.state.secret_box
    return box


def read_session(request: Request) -> SessionState | None:
    """The session in the request's cookie, or None when absent, forged or expired."""
    raw = request.cookies.get(COOKIE)
    if not raw:
        return None
    try:
        payload = json.loads(_box(request).decrypt(raw, context=_CONTEXT))
        state = SessionState(
            nonce=str(payload["n"]),
            session_id=payload.get("s"),
            issued=float(payload["i"]),
        )
    except (SecretUnreadable, ValueError, KeyError, TypeError):
        return None
    if not 0 <= time.time() - state.issued <= MAX_AGE_S:
        return None
    return state


def new_session(session_id: str | None) -> SessionState:
    # A fresh nonce at every sign-in, so a nonce seen before login is useless after it.
    return SessionState(nonce=secrets.token_urlsafe(24), session_id=session_id, issued=time.time())


def start_session(db: Session, token: ApiToken) -> SessionState:
    """Record a sign-in with `token` and return the cookie's state that names it."""
    now = utcnow()
    row = WebSession(
        token_id=token.id, created_at=now, expires_at=now + timedelta(seconds=MAX_AGE_S)
    )
    db.add(row)
    db.commit()
    return new_session(row.id)


def end_session(db: Session, state: SessionState | None) -> None:
    """Sign out on the server: the session's row stops counting, whoever holds the cookie."""
    row = db.get(WebSession, state.session_id) if state and state.session_id else None
    if row is not None and row.ended_at is None:
        row.ended_at = utcnow()
        db.commit()


def write_session(request: Request, response: Response, state: SessionState) -> None:
    sealed = _box(request).encrypt(
        json.dumps({"n": state.nonce, "s": state.session_id, "i": state.issued}), context=_CONTEXT
    )
    response.set_cookie(
        COOKIE,
        sealed,
        max_age=MAX_AGE_S,
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def clear_session(request: Request, response: Response) -> None:
    response.delete_cookie(
        COOKIE, path="/", httponly=True, samesite="lax", secure=request.url.scheme == "https"
    )


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _live_session(db: Session, session_id: str) -> WebSession | None:
    row = db.get(WebSession, session_id)
    return row if row is not None and row.is_live(utcnow()) else None


def page_viewer(request: Request, db: Db) -> Viewer:
    """The signed-in user, from `Authorization: Bearer` (scripts) or the session cookie."""
    secret = _bearer(request)
    if secret is not None:
        token = authenticate(db, secret=secret, uses=request.app.state.token_uses)
        if token is None:
            raise LoginRequired("the API token is not valid or has been revoked")
        return Viewer(user=token.user, token=token, via="bearer", csrf="")
    state = read_session(request)
    row = _live_session(db, state.session_id) if state and state.session_id else None
    if state is None or row is None:
        raise LoginRequired("sign in to see this page")
    return Viewer(user=row.token.user, token=row.token, via="session", csrf=state.nonce)


PageViewer = Annotated[Viewer, Depends(page_viewer)]


def check_csrf(request: Request, submitted: object) -> None:
    """Refuse a state-changing form whose CSRF token does not match the session's.

    A request signed by an `Authorization` header needs none: a browser never attaches that
    header on its own, so another site cannot forge such a request.
    """
    if _bearer(request) is not None:
        return
    state = read_session(request)
    if (
        state is None
        or not isinstance(submitted, str)
        or not hmac.compare_digest(submitted.encode(), state.nonce.encode())
    ):
        raise CsrfRejected(
            "this form has no valid CSRF token; reload the page and submit it again",
            details={"field": CSRF_FIELD},
        )
