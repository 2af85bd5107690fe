"""Capability URLs: short-lived links that let one request, without a token, read or write one
object, as presigned storage URLs do.

A URL names its purpose, its object and an expiry, and carries an HMAC-SHA256 over those and
the HTTP method. The HMAC key is derived from the platform's secret key (`OSMOSIS_SECRET_KEY`,
else `<home>/secret.key`), so every API server sharing that key accepts the others' URLs and
nothing else can mint one. A URL is refused after its expiry, for another object or purpose,
and with another method.

    signer = CapabilitySigner(signing_key(settings))
    url = signer.url("https://osmosis.example", method="GET", purpose="dataset",
                     object_id=version.id, ttl_s=900, now=time.time())
    signer.check(method="GET", purpose="dataset", object_id=version.id,
                 expires=..., signature=..., now=time.time())  # or CapabilityRefused
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote, urlencode

from osmosis.loopback import is_loopback_url
from osmosis.platform.core.crypto import key_file
from osmosis.platform.core.errors import Forbidden, PlatformError
from osmosis.platform.core.settings import Settings

PATH = "/api/cli/transfer"
"""Where capability URLs point: `{PATH}/{purpose}/{object_id}?expires=...&signature=..."""
TTL_S = 900
"""How long a URL works: long enough to start a transfer of a large file, short enough that a
leaked one is soon useless. A transfer under way is not cut off when the URL expires."""
_DOMAIN = b"osmosis capability url v1"  # keeps this key apart from every other use of the key


class CapabilityRefused(Forbidden):
    code = "URL_REFUSED"


class HttpsRequired(PlatformError):
    """A capability URL over plain http would carry its bearer power in clear text."""

    code = "HTTPS_REQUIRED"
    status_code = 400


def signing_key(settings: Settings) -> bytes:
    """The HMAC key for capability URLs, derived from the platform's secret key."""
    if settings.secret_key and settings.secret_key.strip():
        secret = settings.secret_key.strip().encode("utf-8")
    else:
        secret = key_file(settings.home).read_bytes().strip()  # `create_app` made it
    return hmac.new(secret, _DOMAIN, hashlib.sha256).digest()


def check_base(base_url: str) -> str:
    """`base_url` without its trailing slash, if clients may fetch capability URLs from it:
    https, or plain http only on this machine's loopback."""
    base = base_url.rstrip("/")
    if base.startswith("https://") or (base.startswith("http://") and is_loopback_url(base)):
        return base
    raise HttpsRequired(
        "transfer links are served only over https (or plain http on loopback): serve the "
        f"platform behind TLS; this request came to {base}",
        details={"base_url": base},
    )


class CapabilitySigner:
    """Mints and checks capability URLs with one key."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def signature(self, *, method: str, purpose: str, object_id: str, expires: int) -> str:
        message = "\n".join((method.upper(), purpose, object_id, str(expires)))
        return hmac.new(self._key, message.encode("utf-8"), hashlib.sha256).hexdigest()

    def url(
        self,
        base_url: str,
        *,
        method: str,
        purpose: str,
        object_id: str,
        now: float,
        ttl_s: int = TTL_S,
    ) -> str:
        """A URL for one `method` request on `object_id`, valid `ttl_s` seconds from `now`."""
        expires = int(now) + ttl_s
        signature = self.signature(
            method=method, purpose=purpose, object_id=object_id, expires=expires
        )
        query = urlencode({"expires": expires, "signature": signature})
        return f"{check_base(base_url)}{PATH}/{purpose}/{quote(object_id)}?{query}"

    def check(
        self,
        *,
        method: str,
        purpose: str,
        object_id: str,
        expires: int,
        signature: str,
        now: float,
    ) -> None:
        """Nothing when the URL's signature matches and it has not expired; else refused."""
        wanted = self.signature(
            method=method, purpose=purpose, object_id=object_id, expires=expires
        )
        if not hmac.compare_digest(wanted, signature):
            # One answer for a wrong object, purpose, method or a forged link: none says more.
            raise CapabilityRefused("this transfer link is not valid for this request")
        if now >= expires:
            raise CapabilityRefused(
                "this transfer link has expired; ask for a new one", details={"expires": expires}
            )


__all__ = [
    "PATH",
    "TTL_S",
    "CapabilityRefused",
    "CapabilitySigner",
    "HttpsRequired",
    "check_base",
    "signing_key",
]
