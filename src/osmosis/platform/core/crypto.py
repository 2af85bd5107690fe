"""Encryption of secrets at rest with Fernet (AES-128-CBC + HMAC-SHA256).

The key comes from `OSMOSIS_SECRET_KEY` when set, otherwise from `<home>/secret.key`, which
the first start creates with mode 0600. Keep the key apart from database backups: either
alone is useless, together they reveal every secret.

    box = load_secret_box(home, env=os.environ)
    token = box.encrypt("sk-...", context="ws1/user/u1/OPENAI_API_KEY")
    box.decrypt(token, context="ws1/user/u1/OPENAI_API_KEY")  # 'sk-...'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from osmosis.platform.core.errors import PlatformError

KEY_ENV = "OSMOSIS_SECRET_KEY"
KEY_FILE_NAME = "secret.key"
_GENERATE = 'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key())"'


class SecretKeyError(RuntimeError):
    """The secret key is unusable: malformed, unreadable, or not the one secrets were
    stored with. Raised at start-up so the server refuses to run rather than fail later."""


class SecretUnreadable(PlatformError):
    """A stored secret does not decrypt with the server's key (a 500: the server's fault)."""

    code = "SECRET_KEY_MISMATCH"
    status_code = 500


class SecretBox:
    """Encrypts and decrypts secret values; each value is bound to a context string.

    The context (workspace, scope, owner, name) is sealed inside the ciphertext and checked
    on decryption, so a ciphertext copied into another row of the database does not decrypt
    there: Fernet has no associated data, this gives the same guarantee.
    """

    def __init__(self, key: bytes, *, source: str) -> None:
        try:
            self._fernet = Fernet(key)
        except (ValueError, TypeError):
            raise SecretKeyError(
                f"{source} is not a Fernet key (32 bytes, url-safe base64); "
                f"generate one with: {_GENERATE}"
            ) from None
        self.source = source

    def encrypt(self, value: str, *, context: str) -> str:
        sealed = json.dumps({"c": context, "v": value}, separators=(",", ":"))
        return self._fernet.encrypt(sealed.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str, *, context: str) -> str:
        try:
            sealed = json.loads(self._fernet.decrypt(token.encode("ascii")))
        except (InvalidToken, ValueError):
            raise SecretUnreadable(
                f"a stored secret cannot be decrypted with the key from {self.source}; "
                "the server runs with a different key than the one the secret was stored with"
            ) from None
        if not isinstance(sealed, dict) or sealed.get("c") != context:
            raise SecretUnreadable("a stored secret belongs to another record; refusing to use it")
        return str(sealed["v"])

    def can_decrypt(self, token: str) -> bool:
        """True when `token` was made with this key (used to check the key at start-up)."""
        try:
            self._fernet.decrypt(token.encode("ascii"))
        except (InvalidToken, ValueError):
            return False
        return True


def key_file(home: Path) -> Path:
    return home / KEY_FILE_NAME


def load_secret_box(home: Path, *, env: Mapping[str, str]) -> SecretBox:
    """The box for `env[OSMOSIS_SECRET_KEY]`, else for `<home>/secret.key` (created 0600).

    box = load_secret_box(Path("/srv/osmosis"), env={})  # creates /srv/osmosis/secret.key
    """
    from_env = env.get(KEY_ENV, "").strip()
    if from_env:
        return SecretBox(from_env.encode("ascii", "replace"), source=KEY_ENV)
    path = key_file(home)
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        key = _create_key_file(path)
    except OSError as error:
        raise SecretKeyError(f"cannot read the secret key {path}: {error}") from None
    return SecretBox(key, source=str(path))


def _create_key_file(path: Path) -> bytes:
    key = Fernet.generate_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two servers starting on one home must not each write a different key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as handle:
        handle.write(key + b"\n")
    return key
