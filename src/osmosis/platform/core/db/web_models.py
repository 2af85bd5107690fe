"""Dashboard sign-ins: one row per session cookie, so signing out can end it on the server.

The cookie names its row; a request is signed in only while the row is live (not ended, not
expired) and its API token is usable (not revoked or expired, its user not deactivated).
Revoking or deleting the token ends its sessions.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column, relationship

from osmosis.platform.core.db.models import ApiToken, Base, UtcDateTime, new_id, utcnow


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
