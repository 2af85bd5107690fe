"""`client.secrets`: secrets of a workspace and the caller's own (`/api/secrets`).

Values are write-only: they travel once, in a request body, and no answer contains them.

    client.secrets.set(git="acme/evals", name="OPENAI_API_KEY", value=key, scope="workspace")
    [s.name for s in client.secrets.list(git="acme/evals").secrets]
"""

from __future__ import annotations

from urllib.parse import quote

from pydantic import ValidationError

from osmosis.client._base import PlatformAPIError, Resource, git_header
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire import SecretCreate, SecretList, SecretPublic


class Secrets(Resource):
    """Secrets' metadata, and setting or deleting one."""

    def list(
        self, *, git: str, scope: str = "all", limit: int = MAX_PAGE, offset: int = 0
    ) -> SecretList:
        """A page of metadata of the secrets visible to the caller; `scope`: all, workspace,
        personal."""
        params = {"scope": scope, "limit": limit, "offset": offset}
        return self._transport.call(
            "GET", "/api/secrets", SecretList, params=params, headers=git_header(git)
        )

    def set(self, *, git: str, name: str, value: str, scope: str = "user") -> SecretPublic:
        """Create or replace a secret. The value travels once, in the body, never in the URL."""
        try:
            body = SecretCreate.model_validate({"value": value, "scope": scope})
        except ValidationError as error:
            # pydantic's message quotes the input; only the field and the rule may surface.
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
            )
            raise PlatformAPIError(f"invalid secret: {problems}", code="VALIDATION") from None
        path = f"/api/secrets/{quote(name, safe='')}"
        return self._transport.call("PUT", path, SecretPublic, body=body, headers=git_header(git))

    def delete(self, *, git: str, name: str, scope: str = "user") -> SecretPublic:
        path = f"/api/secrets/{quote(name, safe='')}"
        params = {"scope": scope}
        return self._transport.call(
            "DELETE", path, SecretPublic, params=params, headers=git_header(git)
        )
