"""`client.admin`: users and their tokens, for admins (`/api/admin`).

created = client.admin.create_user(name="ada", email="ada@example.com")
created.token.token  # the new user's secret, shown once
"""

from __future__ import annotations

from urllib.parse import quote

from osmosis.client._base import Resource
from osmosis.vocabulary import MAX_PAGE
from osmosis.wire import (
    TokenCreate,
    TokenCreated,
    TokenList,
    TokenPublic,
    UserCreate,
    UserCreated,
    UserDeactivated,
    UserList,
    UserPublic,
)


class Admin(Resource):
    """Users, and any user's tokens."""

    def create_user(
        self, *, name: str, email: str | None = None, is_admin: bool = False
    ) -> UserCreated:
        body = UserCreate(name=name, email=email, is_admin=is_admin)
        return self._transport.call("POST", "/api/admin/users", UserCreated, body=body)

    def list_users(self, *, limit: int = MAX_PAGE, offset: int = 0) -> UserList:
        params = {"limit": limit, "offset": offset}
        return self._transport.call("GET", "/api/admin/users", UserList, params=params)

    def deactivate_user(self, *, user: str) -> UserDeactivated:
        """Stop a user's tokens and sessions at once; `user`: id, name or email."""
        path = f"/api/admin/users/{quote(user, safe='')}/deactivate"
        return self._transport.call("POST", path, UserDeactivated)

    def reactivate_user(self, *, user: str) -> UserPublic:
        path = f"/api/admin/users/{quote(user, safe='')}/reactivate"
        return self._transport.call("POST", path, UserPublic)

    def create_token(
        self, *, user_id: str, name: str = "default", expires_in: int | str | None = None
    ) -> TokenCreated:
        """Issue a token for a user; `expires_in`: seconds, "never", or None for the
        server's default lifetime."""
        path = f"/api/admin/users/{quote(user_id, safe='')}/tokens"
        body = TokenCreate.model_validate({"name": name, "expires_in": expires_in})
        return self._transport.call("POST", path, TokenCreated, body=body)

    def list_tokens(self, *, user_id: str) -> TokenList:
        path = f"/api/admin/users/{quote(user_id, safe='')}/tokens"
        return self._transport.call("GET", path, TokenList)

    def revoke_token(self, *, token_id: str) -> TokenPublic:
        """Revoke any user's token by id."""
        path = f"/api/admin/tokens/{quote(token_id, safe='')}"
        return self._transport.call("DELETE", path, TokenPublic)
