"""Fixtures for the fake model's tests: one shared server and a client for it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from osmosis.testing import FakeModelServer


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    """A default fake model in a background thread, shared by a module's tests."""
    with FakeModelServer() as server:
        yield server


@pytest.fixture(scope="session")
def client() -> Iterator[httpx.Client]:
    """One HTTP client for every test: creating one costs tens of milliseconds (TLS setup)."""
    with httpx.Client(timeout=5) as client:
        yield client


@pytest.fixture
def http(fake_model: FakeModelServer) -> Iterator[httpx.Client]:
    """An HTTP client rooted at the shared fake model's URL."""
    with httpx.Client(base_url=fake_model.url, timeout=5) as client:
        yield client


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the server serves on asyncio loops only
