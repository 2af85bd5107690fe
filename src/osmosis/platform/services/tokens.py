"""API tokens: random secrets with a recognisable prefix, stored only as SHA-256 digests.

secret = new_token()        # 'osm_...' (shown to the user once)
digest = hash_token(secret) # what the database keeps
parse_lifetime("30d")       # 2592000 seconds, what `--expires-in` sends

Standard library only: the CLI imports `parse_lifetime`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

TOKEN_PREFIX = "osm_"
NEVER = "never"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_LIFETIME = re.compile(r"^(\d+)\s*([smhdw]?)$")
# Past a century an expiry date stops meaning anything (and datetimes overflow near 9999).
MAX_LIFETIME_S = 100 * 365 * 86400


def new_token() -> str:
    """A fresh bearer token: the prefix (so leaked tokens are easy to spot) + 32 random bytes."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form. A plain hash suffices: the secret has 256 bits, nothing to brute-force."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored digest."""
    return hmac.compare_digest(hash_token(token), stored_hash)


def parse_lifetime(text: str) -> int | str:
    """Seconds for `30d`, `12h`, `45m`, `90s`, `2w` (a bare number is days), or `NEVER`.

    parse_lifetime("never")  # 'never'
    """
    value = text.strip().lower()
    if value == NEVER:
        return NEVER
    match = _LIFETIME.match(value)
    seconds = int(match.group(1)) * _UNITS[match.group(2) or "d"] if match else 0
    if not 0 < seconds <= MAX_LIFETIME_S:
        raise ValueError(
            f"expected a lifetime such as 30d, 12h, 45m, 90s or 2w (at most 100 years), "
            f"or 'never'; got {text!r}"
        )
    return seconds
