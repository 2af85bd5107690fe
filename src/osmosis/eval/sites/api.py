"""The rollout protocol as the engine uses it: admit, long-poll, cancel, health.

    lease = await endpoint.api.start(init_request)
    result = await endpoint.api.wait(lease, deadline_sec=600)

`RolloutAPI` is a Protocol: `osmosis.eval.sites.rollout_client.RolloutClient` speaks it over HTTP,
the engine's unit tests supply an in-memory one, a Ray site may call an actor. Every
implementation sorts faults the same way, because the engine's honesty rests on it:

- `AdmissionRejected` (a 4xx other than 429): this one rollout was refused, its failure.
- `AtCapacity` (429): come back after `retry_after_sec`; nobody's fault.
- `MalformedResponse`: the server answered, but not in the protocol's shape (a result body
  that does not parse, a reward that is not a finite number): the rollout's failure, with
  the error type `rollout_protocol_error`.
- `RolloutServerUnavailable` (no connection, a 5xx, a transport timeout): the endpoint's
  fault; the attempt goes back to pending.
- `ResultDeadlineExceeded`: no terminal result within the supervisor's deadline.

A result may carry the rollout's trajectory (`ResultWithTrajectory`, when the server sent it
inline); otherwise the endpoint's `trial()` directory holds it as `trajectory.json`.

A site that enforces resource limits (the sandbox) says which one an attempt went past as a
typed `ResourceLimitBreach`: on the endpoint it killed (`Endpoint.breach`), or on the failure
it answers for the attempt (`ResultWithBreach`). Only such a value makes an attempt fail with
the error type `resource_limit`; no message text does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from osmosis.rollout.protocol import RolloutInitRequest, RolloutResultResponse
from osmosis.rollout.sample import WIRE

PROTOCOL_ERROR = "rollout_protocol_error"
"""The error type of an attempt the rollout server refused (4xx) or answered out of shape."""

RESOURCE_LIMIT = "resource_limit"
"""The error type of an attempt charged with a `ResourceLimitBreach`."""


@dataclass(frozen=True)
class ResourceLimitBreach:
    """A resource limit a rollout server or one attempt went past (memory, processes, CPU
    time, file size, output bytes); the attempt charged with it fails `resource_limit`.

    breach = ResourceLimitBreach("the attempt", "output limit (2048 bytes per attempt)")
    str(breach)  # 'resource_limit: the attempt exceeded its output limit (2048 bytes ...)'
    """

    who: str
    """What went past it: `rollout server 'scripted-0'`, `the attempt`."""
    limit: str
    """Which limit, in words: `memory limit (512 MiB)`."""

    def __str__(self) -> str:
        # The words an endpoint's death reason and the attempt's error message carry.
        return f"{RESOURCE_LIMIT}: {self.who} exceeded its {self.limit}"


class RolloutServerUnavailable(Exception):
    """The endpoint cannot take or report work: the attempt stays pending."""


class AdmissionRejected(Exception):
    """The server refused this one rollout (4xx other than 429): a terminal failure of it."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"rollout server rejected the rollout (HTTP {status_code}): {detail}")
        self.status_code = status_code


class AtCapacity(Exception):
    """The server is full (429): try this endpoint again after `retry_after_sec`."""

    def __init__(self, retry_after_sec: float) -> None:
        super().__init__(f"rollout server at capacity; retry after {retry_after_sec:g} s")
        self.retry_after_sec = retry_after_sec


class MalformedResponse(Exception):
    """The server answered something the protocol does not allow."""


class ResultDeadlineExceeded(Exception):
    """No terminal result arrived before the supervisor's deadline."""


@dataclass(frozen=True)
class Lease:
    """An admitted rollout and the token its polls must carry."""

    rollout_id: str
    token: str
    result_wait_timeout_sec: float


class RolloutAPI(Protocol):
    """What the engine calls on one endpoint (see the module docstring for the errors)."""

    async def health(self) -> dict[str, object]: ...

    async def start(self, request: RolloutInitRequest) -> Lease: ...

    async def wait(
        self, lease: Lease, *, deadline_sec: float | None = None
    ) -> RolloutResultResponse: ...

    async def cancel(self, rollout_ids: list[str]) -> dict[str, str]: ...

    async def aclose(self) -> None: ...


class ResultWithTrajectory(RolloutResultResponse):
    """A result as the engine reads it: the protocol's fields, and the rollout's ATIF
    trajectory when the server sent it along (protocol.TRAJECTORY_HEADER).

    `trajectory` is untrusted like the file it replaces: whatever JSON the rollout built
    (only an object counts as a trajectory).
    """

    trajectory: Any = None


class ResultWithBreach(RolloutResultResponse):
    """The failure a site answers for an attempt charged with a resource limit: its
    `err_message` is `str(breach)`. Built by sites and the engine, never read off the wire
    (`parse_result` makes a `ResultWithTrajectory`), so a rollout cannot claim one.
    """

    breach: ResourceLimitBreach


def parse_result(body: bytes) -> ResultWithTrajectory:
    """A `GET /rollout/{id}/result` body as the protocol's model, or `MalformedResponse`
    naming what is wrong with it. Parsed and validated in one pass, straight from the bytes.

    parse_result(b'{"rollout_id": "a", "status": "success"}').status  # 'success'
    """
    try:
        return ResultWithTrajectory.model_validate_json(body, context=WIRE)
    except ValidationError as error:
        raise MalformedResponse(f"malformed result body: {_describe(error)}") from None


def _describe(error: ValidationError) -> str:
    problems = []
    for problem in error.errors():
        if problem["type"] == "json_invalid":
            return f"not JSON ({problem['msg']})"
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        problems.append(f"{where}: {problem['msg']}")
    return "; ".join(problems[:5])


__all__ = [
    "PROTOCOL_ERROR",
    "RESOURCE_LIMIT",
    "AdmissionRejected",
    "AtCapacity",
    "Lease",
    "MalformedResponse",
    "ResourceLimitBreach",
    "ResultDeadlineExceeded",
    "ResultWithBreach",
    "ResultWithTrajectory",
    "RolloutAPI",
    "RolloutServerUnavailable",
    "parse_result",
]
