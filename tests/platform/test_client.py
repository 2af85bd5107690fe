"""The typed client: URL safety, error translation, network failures."""

from __future__ import annotations

import httpx
import pytest

from osmosis.client import PlatformAPIError, PlatformClient, check_platform_url, is_loopback


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
        ("example.com", False),
    ],
)
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8765/", "http://localhost", "https://example.com", "http://[::1]:1"]
)
def test_safe_urls_pass(url):
    assert check_platform_url(url) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://example.com", "http://10.1.2.3:8765"])
def test_plain_http_beyond_loopback_is_refused_unless_allowed(url):
    with pytest.raises(PlatformAPIError, match="plain http") as caught:
        PlatformClient(url, "osm_x")
    assert caught.value.code == "VALIDATION"
    assert check_platform_url(url, allow_insecure_http=True) == url


@pytest.mark.parametrize("url", ["ftp://example.com", "example.com", "http://"])
def test_unusable_urls_are_validation_errors(url):
    with pytest.raises(PlatformAPIError) as caught:
        check_platform_url(url)
    assert caught.value.code == "VALIDATION"


def _client(handler) -> PlatformClient:
    return PlatformClient("http://127.0.0.1:1", "osm_t", transport=httpx.MockTransport(handler))


def test_the_server_envelope_becomes_the_exception():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer osm_t"
        body = {"error": {"code": "FORBIDDEN", "message": "admins only", "details": {"a": 1}}}
        return httpx.Response(403, json=body)

    with pytest.raises(PlatformAPIError) as caught, _client(handler) as client:
        client.admin.list_users()
    error = caught.value
    assert (error.code, error.message, error.details, error.status_code) == (
        "FORBIDDEN",
        "admins only",
        {"a": 1},
        403,
    )


@pytest.mark.parametrize(
    ("status", "code"), [(401, "AUTH_REQUIRED"), (404, "NOT_FOUND"), (502, "PLATFORM_ERROR")]
)
def test_a_body_that_is_not_an_envelope_still_gets_a_code(status, code):
    with (
        pytest.raises(PlatformAPIError) as caught,
        _client(lambda request: httpx.Response(status, text="<html>proxy error</html>")) as client,
    ):
        client.auth.whoami()
    assert caught.value.code == code and caught.value.status_code == status


def test_an_unexpected_response_shape_is_a_platform_error():
    with (
        pytest.raises(PlatformAPIError) as caught,
        _client(lambda request: httpx.Response(200, json={"user": "nope"})) as client,
    ):
        client.auth.whoami()
    assert caught.value.code == "PLATFORM_ERROR"


def test_network_failures_name_the_url():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(PlatformAPIError) as caught, _client(handler) as client:
        client.health()
    assert caught.value.code == "NETWORK"
    assert "http://127.0.0.1:1" in caught.value.message
    assert caught.value.details == {"url": "http://127.0.0.1:1/api/health"}


def test_path_parameters_are_escaped():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(
            201,
            json={
                "id": "t",
                "user_id": "a/b",
                "name": "n",
                "created_at": "2026-01-01T00:00:00Z",
                "token": "osm_x",
            },
        )

    with _client(handler) as client:
        assert client.admin.create_token(user_id="a/b?c", name="n").token == "osm_x"
    assert seen == [b"/api/admin/users/a%2Fb%3Fc/tokens"]


def test_resources_mirror_the_routers():
    with _client(lambda request: httpx.Response(200, json={})) as client:
        public = {name for name in vars(client) if not name.startswith("_")}
    assert public == {
        "admin",
        "auth",
        "base_url",
        "datasets",
        "imports",
        "runs",
        "secrets",
        "workspaces",
    }
