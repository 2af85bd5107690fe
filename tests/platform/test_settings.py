"""Settings: one table, read from a mapping, validated, nothing global."""

from pathlib import Path

import pytest

from osmosis.platform.core.settings import SETTINGS, Settings, SettingsError


def test_defaults_put_everything_under_home(tmp_path):
    settings = Settings.from_env({"OSMOSIS_HOME": str(tmp_path)})
    assert settings.home == tmp_path.resolve()
    assert settings.database_url == f"sqlite:///{tmp_path.resolve() / 'platform.db'}"
    assert settings.url == "http://127.0.0.1:8765"
    assert settings.max_upload_bytes == 5 * 1024**3
    assert settings.allow_insecure_http is False
    assert settings.credentials_file == tmp_path.resolve() / "credentials.json"


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        ({"OSMOSIS_PORT": "9000"}, "port", 9000),
        ({"OSMOSIS_HOST": "0.0.0.0"}, "host", "0.0.0.0"),
        (
            {"OSMOSIS_DATABASE_URL": "postgresql+psycopg://u@h/db"},
            "database_url",
            "postgresql+psycopg://u@h/db",
        ),
        ({"OSMOSIS_ALLOW_INSECURE_HTTP": "1"}, "allow_insecure_http", True),
        ({"OSMOSIS_ALLOW_INSECURE_HTTP": "false"}, "allow_insecure_http", False),
        ({"OSMOSIS_MAX_UPLOAD_BYTES": "1024"}, "max_upload_bytes", 1024),
    ],
)
def test_each_setting_reads_its_environment_variable(env, field, expected):
    assert getattr(Settings.from_env(env), field) == expected


def test_overrides_win_and_none_means_unset(tmp_path):
    settings = Settings.from_env({"OSMOSIS_PORT": "9000"}, port=None, home=tmp_path)
    assert (settings.port, settings.home) == (9000, tmp_path.resolve())
    assert Settings.from_env({"OSMOSIS_PORT": "9000"}, port=9001).port == 9001


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OSMOSIS_PORT": "http"}, "OSMOSIS_PORT"),
        ({"OSMOSIS_PORT": "70000"}, "port"),
        ({"OSMOSIS_ALLOW_INSECURE_HTTP": "maybe"}, "OSMOSIS_ALLOW_INSECURE_HTTP"),
    ],
)
def test_bad_values_name_the_variable(env, message):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_wildcard_bind_is_reached_through_loopback():
    assert Settings(host="0.0.0.0", port=80).url == "http://127.0.0.1:80"
    assert Settings(host="::1", port=80).url == "http://[::1]:80"


def test_the_table_and_the_settings_object_agree():
    fields = set(Settings.__dataclass_fields__)
    assert {setting.name for setting in SETTINGS} == fields
    for setting in SETTINGS:
        assert setting.env.startswith("OSMOSIS_") and setting.help


def test_nothing_is_built_at_import(tmp_path):
    # Settings is a plain value: building one touches no disk.
    Settings(home=tmp_path / "not-yet")
    assert not Path(tmp_path / "not-yet").exists()
