"""Browser (device) login for the official CLI, RFC 8628: store functions, no HTTP.

    started = start(db, device_name="laptop")     # the CLI shows started.user_code
    approve(db, user_code="BCDF-GHJK", user=me, cap=my_token.expires_at)   # on the dashboard
    issued = collect(db, device_code=started.device_code, ttl_days=90)     # the CLI polls

A device code is a bearer secret (whoever holds it collects the token), so only its SHA-256 is
stored. The user code is what a person types or checks on the page: eight letters from an
alphabet without vowels or look-alikes (RFC 8628 §6.1), shown as `XXXX-XXXX`. Both expire
after `CODE_TTL`. The token is created when the CLI collects it, as a personal token of the
user who approved, so its secret never sits in the database.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis.platform.core.db.models import User, utcnow
from osmosis.platform.core.db.web_models import DeviceLogin
from osmosis.platform.core.errors import Conflict, NotFound, PlatformError, ValidationFailed
from osmosis.platform.services import users
from osmosis.platform.services.tokens import hash_token

CODE_TTL = timedelta(minutes=10)
POLL_INTERVAL_S = 5
"""RFC 8628's default; a poll sooner than this (less a second of jitter) is told `slow_down`."""
TOKEN_DAYS_WHEN_NEVER = 90
"""A device login's token always expires (the official CLI needs a date): the server's token
lifetime, or this many days when that is "never"."""
KEPT_AFTER_EXPIRY = timedelta(days=1)
"""Expired logins are kept this long, so a late poll still hears `expired_token`."""

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
TOKEN_NAME_PREFIX = "device login: "

PENDING, APPROVED, DENIED, ISSUED = "pending", "approved", "denied", "issued"


class DeviceGrantError(PlatformError):
    """An RFC 8628 token-endpoint error: `code` is the RFC's `error` value."""

    status_code = 400


class AuthorizationPending(DeviceGrantError):
    code = "authorization_pending"


class SlowDown(DeviceGrantError):
    code = "slow_down"


class ExpiredToken(DeviceGrantError):
    code = "expired_token"


class AccessDenied(DeviceGrantError):
    code = "access_denied"


class InvalidGrant(DeviceGrantError):
    code = "invalid_grant"


@dataclass(frozen=True)
class Started:
    """A new device login: the device code (the CLI's secret) and the code a person checks."""

    login: DeviceLogin
    device_code: str
    user_code: str
    expires_in: int


@dataclass(frozen=True)
class Collected:
    """The token the CLI collected, for the user who approved."""

    issued: users.IssuedToken
    user: User


def format_user_code(code: str) -> str:
    """`BCDFGHJK` -> `BCDF-GHJK`."""
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def normalise_user_code(text: str) -> str:
    """What a person typed, as stored: upper case, dashes and spaces dropped."""
    return re.sub(r"[^A-Z]", "", text.upper())


def _new_user_code() -> str:
    return "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))


def start(db: Session, *, device_name: str, now: datetime | None = None) -> Started:
    """Record a login for `device_name` and return its codes (committed)."""
    now = now or utcnow()
    # Long-expired logins are of no use to anyone: drop them while we are here.
    db.execute(delete(DeviceLogin).where(DeviceLogin.expires_at < now - KEPT_AFTER_EXPIRY))
    name = device_name.strip()[:200] or "unknown device"
    for _attempt in range(5):
        device_code = secrets.token_urlsafe(32)
        user_code = _new_user_code()
        login = DeviceLogin(
            device_code_hash=hash_token(device_code),
            user_code=user_code,
            device_name=name,
            status=PENDING,
            created_at=now,
            expires_at=now + CODE_TTL,
        )
        db.add(login)
        try:
            db.commit()
        except IntegrityError:  # a user code still in use: draw another
            db.rollback()
            continue
        return Started(
            login=login,
            device_code=device_code,
            user_code=format_user_code(user_code),
            expires_in=int(CODE_TTL.total_seconds()),
        )
    raise Conflict("could not draw a free user code; try again")


def find_pending(db: Session, *, user_code: str, now: datetime | None = None) -> DeviceLogin:
    """The login waiting for a decision under `user_code`; NotFound when there is none (never
    was, expired, or already decided), with the reason."""
    now = now or utcnow()
    code = normalise_user_code(user_code)
    if len(code) != USER_CODE_LENGTH:
        raise ValidationFailed(
            f"a code is {USER_CODE_LENGTH} letters, like {format_user_code('BCDFGHJK')}",
            details={"field": "user_code"},
        )
    login = db.scalar(select(DeviceLogin).where(DeviceLogin.user_code == code))
    if login is None:
        raise NotFound(f"no login is waiting for code {format_user_code(code)}")
    if now >= login.expires_at:
        raise NotFound(f"code {format_user_code(code)} has expired; run `osmosis auth login` again")
    if login.status != PENDING:
        decided = "denied" if login.status == DENIED else "approved"
        raise NotFound(f"code {format_user_code(code)} was already {decided}")
    return login


def approve(
    db: Session, *, user_code: str, user: User, cap: datetime | None, ttl_days: int
) -> DeviceLogin:
    """`user` approves the login under `user_code` (committed). Its token will expire after
    the server's lifetime `ttl_days`, never after `cap` (the approving session's token)."""
    login = find_pending(db, user_code=user_code)
    now = utcnow()
    login.status = APPROVED
    login.decided_at = now
    login.user_id = user.id
    login.token_expires_at = users.token_expiry(
        now=now, ttl_days=ttl_days or TOKEN_DAYS_WHEN_NEVER, expires_in=None, cap=cap
    )
    db.commit()
    return login


def deny(db: Session, *, user_code: str, user: User) -> DeviceLogin:
    """`user` refuses the login under `user_code` (committed): the CLI hears `access_denied`."""
    login = find_pending(db, user_code=user_code)
    login.status = DENIED
    login.decided_at = utcnow()
    login.user_id = user.id
    db.commit()
    return login


def collect(db: Session, *, device_code: str, now: datetime | None = None) -> Collected:
    """The CLI's poll: the new token once approved (committed), else the RFC 8628 error that
    says why not."""
    now = now or utcnow()
    login = db.scalar(
        select(DeviceLogin).where(DeviceLogin.device_code_hash == hash_token(device_code))
    )
    if login is None:
        raise InvalidGrant("this device code is not known to the server; log in again")
    if login.status == ISSUED:
        raise InvalidGrant("this device code was already exchanged for a token; log in again")
    if now >= login.expires_at:
        raise ExpiredToken("the device code has expired; run `osmosis auth login` again")
    if login.status == DENIED:
        raise AccessDenied("the login was denied in the browser")
    if login.status == PENDING:
        too_soon = login.last_polled_at is not None and now - login.last_polled_at < timedelta(
            seconds=POLL_INTERVAL_S - 1
        )
        login.last_polled_at = now
        db.commit()
        if too_soon:
            raise SlowDown(f"poll at most every {POLL_INTERVAL_S} s")
        raise AuthorizationPending("waiting for a signed-in user to approve this code")
    return _issue(db, login, now)


def _issue(db: Session, login: DeviceLogin, now: datetime) -> Collected:
    user = login.user
    if user is None:  # the approver was deleted since
        raise AccessDenied("the user who approved this login no longer exists")
    # Claim the login first: of two polls racing here, one gets the token, the other hears
    # that the code was already used.
    claimed = db.execute(
        update(DeviceLogin)
        .where(DeviceLogin.id == login.id, DeviceLogin.status == APPROVED)
        .values(status=ISSUED, last_polled_at=now)
    )
    if getattr(claimed, "rowcount", 0) != 1:
        db.rollback()
        raise InvalidGrant("this device code was already exchanged for a token; log in again")
    issued = users.create_token(
        db,
        user=user,
        name=(TOKEN_NAME_PREFIX + login.device_name)[:64],
        expires_at=login.token_expires_at,
    )
    login.token_id = issued.token.id
    db.commit()
    return Collected(issued=issued, user=user)


__all__ = [
    "CODE_TTL",
    "POLL_INTERVAL_S",
    "AccessDenied",
    "AuthorizationPending",
    "Collected",
    "DeviceGrantError",
    "ExpiredToken",
    "InvalidGrant",
    "SlowDown",
    "Started",
    "approve",
    "collect",
    "deny",
    "find_pending",
    "format_user_code",
    "normalise_user_code",
    "start",
]
