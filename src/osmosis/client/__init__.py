"""A typed HTTP client for the osmosis platform API; the CLI speaks to the platform only here.

    with PlatformClient("http://127.0.0.1:8765", token="osm_...") as client:
        client.auth.whoami().user.name  # 'admin'

Every failure is a `PlatformAPIError` carrying the server's `{code, message, details}`;
a connection that fails is code `NETWORK` and names the URL.

Map (one private module per resource, as the server has one router per resource):
`_client` the `PlatformClient`; `_base` the shared connection, the error and the URL check;
`_auth`, `_admin`, `_workspaces`, `_secrets`, `_datasets`, `_runs`, `_imports` the resources.
Imports only `osmosis.wire`, `osmosis.vocabulary`, `osmosis.loopback` and `osmosis._version`:
nothing of the platform, the engine or the command line.
"""

from __future__ import annotations

from osmosis.client._base import PlatformAPIError, check_platform_url
from osmosis.client._client import PlatformClient
from osmosis.loopback import is_loopback

__all__ = ["PlatformAPIError", "PlatformClient", "check_platform_url", "is_loopback"]
