"""The official CLI's token conventions, honoured by ours: `OSMOSIS_TOKEN_PLATFORM_URL` binds
`OSMOSIS_TOKEN` to one platform, `OSMOSIS_TOKEN_STORE` takes only the official values."""

import json
import os
import socket
import subprocess
import sys


def closed_port() -> int:
    """A loopback port nothing listens on: a command that reached it fails NETWORK."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def osmosis(tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    base["OSMOSIS_CONFIG_DIR"] = str(tmp_path / "config")
    base["OSMOSIS_HOME"] = str(tmp_path / "home")
    done = subprocess.run(
        [sys.executable, "-c", "from osmosis.cli.main import run; run()",
         "--json", "auth", "whoami"],
        capture_output=True, text=True, timeout=60, env={**base, **env},
    )  # fmt: skip
    return done.returncode, json.loads(done.stderr.strip().splitlines()[-1])["error"]


def test_a_token_bound_to_another_platform_is_never_sent(tmp_path):
    port = closed_port()
    code, error = osmosis(
        tmp_path,
        OSMOSIS_PLATFORM_URL=f"http://127.0.0.1:{port}",
        OSMOSIS_TOKEN="osm_ci_token",
        OSMOSIS_TOKEN_PLATFORM_URL="https://osmosis.example.com",
    )
    # Refused before any request: not the NETWORK error the closed port would give.
    assert code == 1 and error["code"] == "ENV_TOKEN_PLATFORM_MISMATCH", error
    assert "https://osmosis.example.com" in error["message"]
    assert "osm_ci_token" not in json.dumps(error)


def test_a_token_bound_to_this_platform_is_used_scheme_or_not(tmp_path):
    port = closed_port()
    code, error = osmosis(
        tmp_path,
        OSMOSIS_PLATFORM_URL=f"http://127.0.0.1:{port}",
        OSMOSIS_TOKEN="osm_ci_token",
        OSMOSIS_TOKEN_PLATFORM_URL=f"127.0.0.1:{port}/",
    )
    assert (code, error["code"]) == (1, "NETWORK"), error  # it went ahead: nothing listens


def test_an_unknown_token_store_is_named(tmp_path):
    code, error = osmosis(tmp_path, OSMOSIS_TOKEN_STORE="bogus")
    assert error["code"] == "VALIDATION" and "OSMOSIS_TOKEN_STORE" in error["message"], error
    assert code in (1, 2)
