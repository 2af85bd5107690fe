"""API tokens: random secrets with a recognisable prefix, stored only as SHA-256 digests.

secret = new_token()        # 'osm_...' (shown to the user once)
digest = hash_token(secret) # what the database keeps

A lifetime's form (`30d`, `never`) is the wire's: `osmosis.wire.tokens`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from osmosis.wire.tokens import NEVER as NEVER

TOKEN_PREFIX = "osm_"


def new_token() -> str:
    """A fresh bearer token: the prefix (so leaked tokens are easy to spot) + 32 random bytes."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form. A plain hash suffices: the secret has 256 bits, nothing to brute-force."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of a presented token with a stored digest."""
    return hmac.compare_digest(hash_token(token), stored_hash)
