"""`/device`: where a signed-in user approves or denies the official CLI's browser login.

`osmosis auth login` (official CLI) prints a code and this page's address with the code filled
in. The page shows the code, the device that asked and when, and Approve / Deny buttons (forms
with the session's CSRF token). Approving gives that CLI a new token of the approving user;
the API side is `platform/api/cli/device.py`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response

from osmosis.platform.core.errors import NotFound, ValidationFailed
from osmosis.platform.deps import Db
from osmosis.platform.services import device_login
from osmosis.platform.web.render import render
from osmosis.platform.web.session import CSRF_FIELD, PageViewer, Viewer, check_csrf

router = APIRouter()


def _page(
    request: Request,
    viewer: Viewer,
    *,
    status: int = 200,
    code: str = "",
    **context: object,
) -> Response:
    return render(request, "device.html", viewer, status_code=status, code=code, **context)


@router.get("/device")
def device_page(
    request: Request, db: Db, viewer: PageViewer, user_code: str | None = None
) -> Response:
    """The login waiting under `user_code`, with Approve and Deny; without a code, a form
    asking for one."""
    if not user_code:
        return _page(request, viewer)
    try:
        login = device_login.find_pending(db, user_code=user_code)
    except (NotFound, ValidationFailed) as exc:
        return _page(request, viewer, status=exc.status_code, code=user_code, error=exc.message)
    return _page(
        request,
        viewer,
        code=device_login.format_user_code(login.user_code),
        login=login,
    )


@router.post("/device")
def decide(
    request: Request,
    db: Db,
    viewer: PageViewer,
    user_code: Annotated[str, Form()] = "",
    decision: Annotated[Literal["approve", "deny"], Form()] = "deny",
    csrf_token: Annotated[str, Form(alias=CSRF_FIELD)] = "",
) -> Response:
    """Approve or deny; the page then says what the CLI will hear."""
    check_csrf(request, csrf_token)
    try:
        if decision == "approve":
            login = device_login.approve(
                db,
                user_code=user_code,
                user=viewer.user,
                cap=viewer.token.expires_at,
                ttl_days=request.app.state.settings.token_ttl_days,
            )
        else:
            login = device_login.deny(db, user_code=user_code, user=viewer.user)
    except (NotFound, ValidationFailed) as exc:
        return _page(request, viewer, status=exc.status_code, code=user_code, error=exc.message)
    return _page(
        request,
        viewer,
        code=device_login.format_user_code(login.user_code),
        decided=login,
    )
