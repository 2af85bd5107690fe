"""The rollout server's book of admitted rollouts: leases, long-polls, cancellation, retention.

Everything here runs on the server's event loop and never awaits while changing state, so
no lock is needed: each method is atomic with respect to the others.

Memory stays flat however long a run is: a finished rollout keeps only its answer, serialised
once (`TrackedRollout.answer`), and once its controller has read that answer it is kept
`collected_retention_sec` more (for a re-read after a lost response), not the full
`result_retention_sec` that an unread result gets; or not at all once the controller says it
has it (`release`, `protocol.COLLECTED_HEADER`): at a thousand attempts a second, ten seconds
of collected results would be ten thousand of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from osmosis.rollout.jsonbytes import dumps
from osmosis.rollout.protocol import RolloutResultResponse
from osmosis.rollout.types import ErrorCategory, RolloutStatus

logger = logging.getLogger("osmosis.rollout")

DEFAULT_COLLECTED_RETENTION_SEC = 10.0
"""How long a result stays readable after its controller read it. Both protocol clients
re-read within seconds after a lost response (osmosis-ai's longest schedule: ~8 s)."""


class UnknownRollout(KeyError):
    """No rollout with this id (never admitted, or its result retention ended)."""


class DuplicateRollout(ValueError):
    """A rollout with this id is already registered."""


class InvalidLease(PermissionError):
    """The poll carried a lease token that is not this rollout's."""


@dataclass(eq=False, slots=True)
class TrackedRollout:
    """One admitted rollout as the server sees it."""

    rollout_id: str
    lease: str
    status: RolloutStatus = RolloutStatus.QUEUED
    answer: bytes | None = None
    """The terminal result as the result route sends it (JSON), once finished."""
    plain: bytes | None = None
    """`answer` without its inline trajectory: what is kept once it was collected."""
    task: asyncio.Task[None] | None = None
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    """Polls waiting for the next status change (or the end); woken and dropped on it."""
    lease_timer: asyncio.TimerHandle | None = None
    retention_timer: asyncio.TimerHandle | None = None
    collected: bool = False

    @property
    def finished(self) -> bool:
        return self.answer is not None


class RolloutRegistry:
    """Tracks rollouts from admission until their result's retention ends."""

    def __init__(
        self,
        *,
        result_wait_timeout_sec: float,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
        collected_retention_sec: float = DEFAULT_COLLECTED_RETENTION_SEC,
        cancel_backend: Callable[[str], object] | None = None,
    ) -> None:
        if not 0 < result_wait_timeout_sec < polling_lease_timeout_sec:
            raise ValueError("need 0 < result_wait_timeout_sec < polling_lease_timeout_sec")
        if result_retention_sec < 0 or collected_retention_sec < 0:
            raise ValueError("result retention must not be negative")
        self.result_wait_timeout_sec = result_wait_timeout_sec
        self.polling_lease_timeout_sec = polling_lease_timeout_sec
        self.result_retention_sec = result_retention_sec
        self.collected_retention_sec = min(collected_retention_sec, result_retention_sec)
        self._cancel_backend = cancel_backend
        self._rollouts: dict[str, TrackedRollout] = {}
        self._active = 0

    # -- admission and progress ---------------------------------------------------------------
    def admit(self, rollout_id: str) -> TrackedRollout:
        if rollout_id in self._rollouts:
            raise DuplicateRollout(rollout_id)
        rollout = TrackedRollout(rollout_id=rollout_id, lease=secrets.token_urlsafe(24))
        self._rollouts[rollout_id] = rollout
        self._arm_lease(rollout)
        return rollout

    def started(self, rollout: TrackedRollout, task: asyncio.Task[None]) -> None:
        """`task` executes `rollout`; it counts as active until it is done."""
        rollout.task = task
        self._active += 1
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._active -= 1

    def discard(self, rollout_id: str) -> None:
        rollout = self._rollouts.pop(rollout_id, None)
        if rollout is not None:
            _cancel(rollout.lease_timer)
            _cancel(rollout.retention_timer)

    def set_status(self, rollout: TrackedRollout, status: RolloutStatus) -> None:
        if rollout.answer is None and rollout.status is not status:
            rollout.status = status
            self._notify(rollout)

    def finish(
        self,
        rollout: TrackedRollout,
        result: RolloutResultResponse,
        *,
        trajectory: Mapping[str, Any] | None = None,
    ) -> bool:
        """Record the outcome; the first one wins (lease expiry or cancellation may race it).
        `trajectory` (asked for inline) travels in the answer as a top-level field."""
        if rollout.answer is not None:
            return False
        # Serialised once, here: every poll of a finished rollout sends these bytes.
        answer = result.model_dump_json(exclude={"sample": {"trajectory_messages"}}).encode()
        if trajectory is not None:
            try:
                inline = dumps(trajectory, default=repr, nan="null")
            except (TypeError, ValueError, RecursionError):
                logger.warning("rollout %s: its trajectory is not JSON", rollout.rollout_id)
            else:
                rollout.plain = answer
                answer = b"".join((answer[:-1], b',"trajectory":', inline, b"}"))
        rollout.answer = answer
        rollout.status = result.status
        _cancel(rollout.lease_timer)
        rollout.lease_timer = None
        _wake(rollout)  # every poll waiting: no change follows
        rollout.retention_timer = asyncio.get_running_loop().call_later(
            self.result_retention_sec, self._forget, rollout
        )
        return True

    def collected(self, rollout: TrackedRollout) -> None:
        """The controller has read this rollout's final answer: keep it only briefly more."""
        if rollout.answer is None or rollout.collected:
            return
        rollout.collected = True
        if rollout.plain is not None:  # a re-read after a lost answer goes without it
            rollout.answer, rollout.plain = rollout.plain, None
        timer = rollout.retention_timer
        loop = asyncio.get_running_loop()
        if timer is not None and timer.when() - loop.time() > self.collected_retention_sec:
            timer.cancel()  # a cancelled handle drops its reference to the rollout
            rollout.retention_timer = loop.call_later(
                self.collected_retention_sec, self._forget, rollout
            )

    def release(self, rollout_ids: Iterable[str]) -> None:
        """The controller says it holds these results and will not read them again
        (`protocol.COLLECTED_HEADER`): forget them now rather than after the re-read window."""
        for rollout_id in rollout_ids:
            rollout = self._rollouts.get(rollout_id)
            if rollout is not None and rollout.collected:  # only what was read already
                _cancel(rollout.retention_timer)
                self._forget(rollout)  # the id stays reserved while its work unwinds

    @property
    def active(self) -> int:
        """Rollouts whose execution has not finished yet."""
        return self._active

    def tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._rollouts.values() if r.task is not None and not r.task.done()]

    # -- polling --------------------------------------------------------------------------------
    async def wait_for_result(
        self, rollout_id: str, lease: str, *, until_terminal: bool = False
    ) -> tuple[bytes, TrackedRollout]:
        """Long-poll: answer at once if finished, else on the next status change (with
        `until_terminal`, only once finished) or after `result_wait_timeout_sec`. Each poll
        renews the lease. Returns the JSON answer and the rollout it is about."""
        rollout = self._checked(rollout_id, lease)
        if rollout.answer is not None:
            return rollout.answer, rollout
        self._arm_lease(rollout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.result_wait_timeout_sec
        while rollout.answer is None and loop.time() < deadline:
            # A future and a timer of our own: a tenth of what asyncio.timeout costs, and
            # every attempt waits here once.
            waiter: asyncio.Future[None] = loop.create_future()
            rollout.waiters.append(waiter)
            timer = loop.call_at(deadline, _settle, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                with contextlib.suppress(ValueError):  # still listed: timed out or cancelled
                    rollout.waiters.remove(waiter)
            if not until_terminal:
                break
        if rollout.answer is not None:
            return rollout.answer, rollout
        return _in_flight_answer(rollout_id, rollout.status), rollout

    def _checked(self, rollout_id: str, lease: str) -> TrackedRollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise UnknownRollout(rollout_id)
        if not secrets.compare_digest(rollout.lease.encode(), lease.encode()):
            raise InvalidLease(rollout_id)
        return rollout

    # -- cancellation ---------------------------------------------------------------------------
    def cancel(
        self, *, ids: Iterable[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        if all:
            selected = list(self._rollouts)
        elif prefix is not None:
            selected = [rid for rid in self._rollouts if rid.startswith(prefix)]
        else:
            selected = list(dict.fromkeys(ids or []))
        return {rid: self._cancel_one(rid) for rid in selected}

    def _cancel_one(self, rollout_id: str) -> str:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            return "not_found"
        if rollout.answer is not None:
            return "not_found"  # finished (cancelled ones too): nothing left to cancel
        disposition = (
            "cancelled_queued" if rollout.status is RolloutStatus.QUEUED else "cancelled_running"
        )
        self.finish(
            rollout,
            RolloutResultResponse(
                rollout_id=rollout_id, status=RolloutStatus.CANCELLED, err_message="cancelled"
            ),
        )
        self._stop_execution(rollout)
        return disposition

    def _stop_execution(self, rollout: TrackedRollout) -> None:
        if self._cancel_backend is not None:
            self._cancel_backend(rollout.rollout_id)
        if rollout.task is not None and not rollout.task.done():
            rollout.task.cancel()

    # -- leases and retention -------------------------------------------------------------------
    def _arm_lease(self, rollout: TrackedRollout) -> None:
        _cancel(rollout.lease_timer)
        loop = asyncio.get_running_loop()
        rollout.lease_timer = loop.call_later(self.polling_lease_timeout_sec, self._expire, rollout)

    def _expire(self, rollout: TrackedRollout) -> None:
        # The controller stopped polling: nobody will read this result, so stop the work.
        expired = RolloutResultResponse(
            rollout_id=rollout.rollout_id,
            status=RolloutStatus.FAILURE,
            err_message="polling lease expired",
            err_category=ErrorCategory.LEASE_EXPIRED,
        )
        if self.finish(rollout, expired):
            self._stop_execution(rollout)

    def _forget(self, rollout: TrackedRollout) -> None:
        # Keep the id reserved while late work is still unwinding, so it cannot be reused.
        rollout.retention_timer = None
        if rollout.task is not None and not rollout.task.done():
            rollout.task.add_done_callback(lambda _: self._forget(rollout))
            return
        rollout.task = None
        if self._rollouts.get(rollout.rollout_id) is rollout:
            del self._rollouts[rollout.rollout_id]

    @staticmethod
    def _notify(rollout: TrackedRollout) -> None:
        _wake(rollout)  # later polls wait for the change after this one


def _wake(rollout: TrackedRollout) -> None:
    waiters, rollout.waiters = rollout.waiters, []
    for waiter in waiters:
        _settle(waiter)


def _settle(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _in_flight_answer(rollout_id: str, status: RolloutStatus) -> bytes:
    return json.dumps(
        {
            "rollout_id": rollout_id,
            "status": status.value,
            "sample": None,
            "err_message": None,
            "err_category": None,
        },
        separators=(",", ":"),
    ).encode()


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
