"""The platform's public names are pinned."""

import osmosis.client
import osmosis.platform


def test_platform_public_names():
    assert osmosis.platform.__all__ == [
        "BlobStoreError",
        "DatabaseUnavailable",
        "Holder",
        "HomeInUse",
        "LocalView",
        "SchemaMismatch",
        "SecretKeyError",
        "Settings",
        "SettingsError",
        "copy_store",
        "create_app",
        "home_disk",
        "local_row_texts",
        "local_view",
        "lock_holder",
        "migrate_database",
        "platform_status",
        "process_alive",
        "serve",
        "server_pid",
        "worker_pid",
        "worker_state_pid",
    ]
    for name in osmosis.platform.__all__:
        assert getattr(osmosis.platform, name) is not None


def test_client_public_names():
    assert osmosis.client.__all__ == [
        "PlatformAPIError",
        "PlatformClient",
        "check_platform_url",
        "is_loopback",
    ]
