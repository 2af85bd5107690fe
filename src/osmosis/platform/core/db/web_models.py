"""Dashboard sign-ins: one row per session cookie, so signing out can end it on the server;
and the official CLI's device logins, approved by a signed-in user.

The cookie names its row; a request is signed in only while the row is live (not ended, not
expired) and its API token is usable (not revoked or expired, its user not deactivated).
Revoking or deleting the token ends its sessions.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from osmosis.platform.core.db.models import ApiToken, Base, User, UtcDateTime, new_id, utcnow


class WebSession(Base):
    """One dashboard sign-in with an API token; `ended_at` is set by "Sign out"."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    token_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("api_tokens.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UtcDateTime)

    token: Mapped[ApiToken] = relationship()

    def is_live(self, now: datetime) -> bool:
        # The token's own rule: not revoked, not expired, its user not deactivated.
        return self.ended_at is None and now < self.expires_at and self.token.is_usable(now)


class DeviceLogin(Base):
    """One browser (device) login of the official CLI (RFC 8628), from the CLI asking for a
    code to the token it collects. Only the device code's SHA-256 is stored; the token is made
    when the CLI collects it, so its secret is never stored either."""

    __tablename__ = "device_logins"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    device_code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_code: Mapped[str] = mapped_column(String(16), unique=True)
    device_name: Mapped[str] = mapped_column(String(200))
    # pending -> approved | denied; approved -> issued once the CLI has its token.
    status: Mapped[str] = mapped_column(String(16), default="pending")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)
    last_polled_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    user_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("users.id", ondelete="CASCADE"), index=True
    )
    token_expires_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    token_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("api_tokens.id", ondelete="SET NULL")
    )

    user: Mapped[User | None] = relationship()
