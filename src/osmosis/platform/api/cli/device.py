"""`/api/cli/device/authorize` and `/api/cli/device/token`: the official CLI's browser login
(`osmosis auth login` without `--token`), RFC 8628.

The CLI asks for a code, shows it with the dashboard's `/device` page, and polls; a signed-in
user approves (or denies) there, and the next poll collects a new token of theirs. Neither
route takes a token: the device code is the CLI's secret. Errors while polling carry the RFC's
`error` value (`authorization_pending`, `slow_down`, `expired_token`, `access_denied`), which
is what the official client reads.
"""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Request

from osmosis.platform.deps import Db
from osmosis.platform.services import device_login
from osmosis.wire.official import DeviceAuthorization, DeviceAuthorizeIn, DeviceToken, DeviceTokenIn

from .account import cli_user
from .errors import OfficialRoute

router = APIRouter(route_class=OfficialRoute)

DEVICE_PAGE = "/device"
"""The dashboard page where a signed-in user approves a code (platform/web/pages_device.py)."""


@router.post("/device/authorize")
def authorize(body: DeviceAuthorizeIn, request: Request, db: Db) -> DeviceAuthorization:
    """A new device login: the CLI keeps `device_code` and shows `user_code` and the page."""
    started = device_login.start(db, device_name=body.device_name)
    page = str(request.base_url).rstrip("/") + DEVICE_PAGE
    return DeviceAuthorization(
        device_code=started.device_code,
        user_code=started.user_code,
        verification_uri=page,
        verification_uri_complete=f"{page}?{urlencode({'user_code': started.user_code})}",
        expires_in=started.expires_in,
        interval=device_login.POLL_INTERVAL_S,
    )


@router.post("/device/token")
def token(body: DeviceTokenIn, db: Db) -> DeviceToken:
    """One poll: 400 with `error` set to the RFC 8628 reason until approved, then the token."""
    try:
        collected = device_login.collect(db, device_code=body.device_code)
    except device_login.DeviceGrantError as exc:
        # RFC 8628 §3.5 names the reason `error`; our flat shape adds `code` and `message`.
        exc.details = {**exc.details, "error": exc.code, "error_description": exc.message}
        raise
    issued = collected.issued.token
    if issued.expires_at is None:  # never: device_login always sets an expiry
        raise RuntimeError("a device login's token has no expiry")
    return DeviceToken(
        token=collected.issued.secret,
        token_id=issued.id,
        expires_at=issued.expires_at.isoformat(),
        user=cli_user(collected.user),
    )
