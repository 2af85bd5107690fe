"""A token's lifetime as people write it (`--expires-in 30d`) and as the API takes it.

    parse_lifetime("30d")     # 2592000: seconds, what `expires_in` carries
    parse_lifetime("never")   # 'never'

Standard library only: `osmosis auth` and `osmosis admin` check the form before a request,
and the platform issues tokens of the same bounds.
"""

from __future__ import annotations

import re
from typing import Final

NEVER: Final = "never"
# Past a century an expiry date stops meaning anything (and datetimes overflow near 9999).
MAX_LIFETIME_S: Final = 100 * 365 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_LIFETIME = re.compile(r"^(\d+)\s*([smhdw]?)$")


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


__all__ = ["MAX_LIFETIME_S", "NEVER", "parse_lifetime"]
