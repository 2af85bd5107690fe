"""First start: an empty database gets an `admin` user, whose token goes to a 0600 file.

The token is never logged; `<home>/credentials.json` is its only channel, and the local CLI
reads it, so the embedded platform needs no login. Later starts refresh the file's URL.
"""

from __future__ import annotations

import json
import logging

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from osmosis.platform.core.errors import Conflict
from osmosis.platform.core.settings import Settings
from osmosis.platform.services.users import count_users, create_user
from osmosis.private_file import write_private_json

logger = logging.getLogger("osmosis.platform")

ADMIN_NAME = "admin"


def bootstrap(sessions: sessionmaker[Session], settings: Settings) -> None:
    """Create the first admin if there are no users, and keep credentials.json current."""
    with sessions() as db:
        if count_users(db) == 0:
            try:
                new = create_user(db, name=ADMIN_NAME, email=None, is_admin=True)
            except Conflict:
                _another_was_first()
                return
            # The file is written before the commit: if writing fails, no admin exists whose
            # token nobody knows, and the next start tries again.
            write_private_json(
                settings.credentials_file,
                {"platform_url": settings.url, "token": new.issued.secret, "user": ADMIN_NAME},
            )
            try:
                db.commit()
            except IntegrityError:
                # Ours never existed, nor may a file holding its token.
                db.rollback()
                settings.credentials_file.unlink(missing_ok=True)
                _another_was_first()
                return
            logger.info(
                "created user %r; its token is in %s", ADMIN_NAME, settings.credentials_file
            )
            return
    _refresh_url(settings)


def _another_was_first() -> None:
    # Another API process on this database created the first admin at the same moment (the
    # name is unique); its token is in that process's home, not ours.
    logger.info(
        "another platform process created user %r first; its token is in that process's "
        "credentials file",
        ADMIN_NAME,
    )


def _refresh_url(settings: Settings) -> None:
    path = settings.credentials_file
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return  # removed on purpose; the admin can issue tokens with `osmosis admin`
    except (OSError, ValueError) as error:
        logger.warning("could not read %s: %s", path, error)
        return
    if isinstance(data, dict) and data.get("platform_url") != settings.url:
        write_private_json(path, {**data, "platform_url": settings.url})
