"""Whether a host or a URL names this machine: `localhost` or a loopback address.

Below the client and the engine both (plain http is allowed only to loopback; the bridge
binds to loopback by default), so neither imports the other for it.

    is_loopback("127.0.0.2")                    # True
    is_loopback_url("http://[::1]:8000/v1")     # True
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether `url`'s host names this machine."""
    return is_loopback(urlsplit(url).hostname or "")


__all__ = ["is_loopback", "is_loopback_url"]
