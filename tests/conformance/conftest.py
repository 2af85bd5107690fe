"""Fixtures that run each conformance entrypoint as real server processes, once per flavour.

Every test that asks for a server runs twice: against our SDK (`osmosis`, this interpreter) and
against the open-source SDK (`osmosis-ai`, `.venv-interop/bin/python`, marked `interop`). The
osmosis-ai flavour is skipped, naming the command that fixes it, when that venv is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .apps.behaviours import ServerSettings
from .harness import OSMOSIS, OSMOSIS_AI, Flavour, RolloutServer, interop_unavailable_reason
from .settings import DOOMED, MAIN, MAIN_INSTANCE_ID, TIGHT


@functools.cache
def _interop_skip_reason() -> str | None:
    return interop_unavailable_reason()


@pytest.fixture(
    scope="session",
    params=[
        pytest.param(OSMOSIS, id="osmosis"),
        pytest.param(OSMOSIS_AI, id="osmosis-ai", marks=pytest.mark.interop),
    ],
)
def flavour(request: pytest.FixtureRequest) -> Flavour:
    chosen: Flavour = request.param
    if chosen is OSMOSIS_AI and (reason := _interop_skip_reason()) is not None:
        pytest.skip(reason)
    return chosen


@dataclass(frozen=True)
class Servers:
    """One flavour's servers, one per configuration in `settings.py`."""

    main: RolloutServer
    tight: RolloutServer
    doomed: RolloutServer

    def all(self) -> list[RolloutServer]:
        return [self.main, self.tight, self.doomed]


class Fleet:
    """Every flavour's servers, launched one flavour ahead: while one flavour's tests run, the
    next flavour's processes start (imports take a couple of CPU seconds per process)."""

    def __init__(self, order: list[Flavour], factory: pytest.TempPathFactory) -> None:
        self._order = order
        self._factory = factory
        self._launched: dict[str, Servers] = {}

    def _launch(self, flavour: Flavour) -> Servers:
        if flavour.name not in self._launched:
            self._launched[flavour.name] = Servers(
                main=self._launch_one(flavour, "main", MAIN, MAIN_INSTANCE_ID),
                tight=self._launch_one(flavour, "tight", TIGHT),
                doomed=self._launch_one(flavour, "doomed", DOOMED),
            )
        return self._launched[flavour.name]

    def _launch_one(
        self, flavour: Flavour, name: str, settings: ServerSettings, instance: str | None = None
    ) -> RolloutServer:
        workdir = self._factory.mktemp(f"{flavour.name}-{name}")
        return RolloutServer.launch(flavour, settings, workdir=workdir, instance_id=instance)

    def ready(self, flavour: Flavour) -> Servers:
        """This flavour's servers, each answering /health; starts the next flavour's too."""
        servers = self._launch(flavour)
        try:
            for server in servers.all():
                server.wait_ready()
        finally:
            upcoming = [f for f in self._order if f.name not in self._launched]
            if upcoming:
                self._launch(upcoming[0])
        return servers

    def stop(self) -> None:
        every = [server for servers in self._launched.values() for server in servers.all()]
        try:
            for server in every:
                server.request_stop()
        finally:
            for server in every:
                server.await_stop()


@pytest.fixture(scope="session")
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Servers for the flavours the selected tests use, in the order they run; all stopped at
    the end of the session."""
    order: list[Flavour] = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        chosen = callspec.params.get("flavour") if callspec is not None else None
        if isinstance(chosen, Flavour) and chosen not in order:
            order.append(chosen)
    if OSMOSIS_AI in order and _interop_skip_reason() is not None:
        order.remove(OSMOSIS_AI)
    fleet = Fleet(order, tmp_path_factory)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="session")
def servers(flavour: Flavour, fleet: Fleet) -> Servers:
    """This flavour's servers, each answering /health."""
    return fleet.ready(flavour)


@pytest.fixture
def main(servers: Servers) -> RolloutServer:
    """The MAIN server (bearer key required), idle: nothing queued or running at the start."""
    servers.main.reset()
    return servers.main


@pytest.fixture
def tight(servers: Servers) -> RolloutServer:
    """The TIGHT server (one slot, at most two pending, short timers), idle."""
    servers.tight.reset()
    return servers.tight


@pytest.fixture
def doomed(servers: Servers) -> RolloutServer:
    """A server for the one test that shuts it down; it serves nothing afterwards."""
    if servers.doomed.process.poll() is not None:
        pytest.fail("the DOOMED server was already shut down by an earlier test")
    servers.doomed.reset()
    return servers.doomed
