"""`client.auth`: who the token belongs to, and the caller's own tokens (`/api/auth`).

client.auth.whoami().user.name                 # 'ada'
client.auth.create_token(name="ci", expires_in=30 * 86400).token
"""

from __future__ import annotations

from urllib.parse import quote

from osmosis.client._base import Resource
from osmosis.wire import TokenCreate, TokenCreated, TokenList, TokenPublic, WhoAmI


class Auth(Resource):
    """The caller's identity and tokens."""

    def whoami(self) -> WhoAmI:
        return self._transport.call("GET", "/api/auth/whoami", WhoAmI)

    def create_token(
        self, *, name: str = "default", expires_in: int | str | None = None
    ) -> TokenCreated:
        """A new token of the caller's (never outliving the token this client presents)."""
        body = TokenCreate.model_validate({"name": name, "expires_in": expires_in})
        return self._transport.call("POST", "/api/auth/tokens", TokenCreated, body=body)

    def list_tokens(self) -> TokenList:
        return self._transport.call("GET", "/api/auth/tokens", TokenList)

    def revoke_token(self, *, token_id: str) -> TokenPublic:
        """Revoke one of the caller's tokens by id (another user's id is NOT_FOUND)."""
        path = f"/api/auth/tokens/{quote(token_id, safe='')}"
        return self._transport.call("DELETE", path, TokenPublic)

    def revoke_current_token(self) -> TokenPublic:
        """Revoke the token this client presents (a logout that ends the token itself)."""
        return self._transport.call("DELETE", "/api/auth/token", TokenPublic)
