"""The rollout server's book of admitted rollouts: leases, long-polls, cancellation, retention.

Everything here runs on the server's event loop and never awaits while changing state, so
no lock is needed: each method is atomic with respect to the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from osmosis.rollout.protocol import RolloutResultResponse
from osmosis.rollout.types import ErrorCategory, RolloutStatus


class UnknownRollout(KeyError):
    """No rollout with this id (never admitted, or its result retention ended)."""


class DuplicateRollout(ValueError):
    """A rollout with this id is already registered."""


class InvalidLease(PermissionError):
    """The poll carried a lease token that is not this rollout's."""


@dataclass
class TrackedRollout:
    """One admitted rollout as the server sees it."""

    rollout_id: str
    lease: str
    status: RolloutStatus = RolloutStatus.QUEUED
    result: RolloutResultResponse | None = None
    task: asyncio.Task[None] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lease_timer: asyncio.TimerHandle | None = None


class RolloutRegistry:
    """Tracks rollouts from admission until their result's retention ends."""

    def __init__(
        self,
        *,
        result_wait_timeout_sec: float,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
        cancel_backend: Callable[[str], object] | None = None,
    ) -> None:
        if not 0 < result_wait_timeout_sec < polling_lease_timeout_sec:
            raise ValueError("need 0 < result_wait_timeout_sec < polling_lease_timeout_sec")
        if result_retention_sec < 0:
            raise ValueError("result_retention_sec must not be negative")
        self.result_wait_timeout_sec = result_wait_timeout_sec
        self.polling_lease_timeout_sec = polling_lease_timeout_sec
        self.result_retention_sec = result_retention_sec
        self._cancel_backend = cancel_backend
        self._rollouts: dict[str, TrackedRollout] = {}

    # -- admission and progress ---------------------------------------------------------------
    def admit(self, rollout_id: str) -> TrackedRollout:
        if rollout_id in self._rollouts:
            raise DuplicateRollout(rollout_id)
        rollout = TrackedRollout(rollout_id=rollout_id, lease=secrets.token_urlsafe(24))
        self._rollouts[rollout_id] = rollout
        self._arm_lease(rollout)
        return rollout

    def discard(self, rollout_id: str) -> None:
        rollout = self._rollouts.pop(rollout_id, None)
        if rollout is not None and rollout.lease_timer is not None:
            rollout.lease_timer.cancel()

    def set_status(self, rollout: TrackedRollout, status: RolloutStatus) -> None:
        if rollout.result is None and rollout.status is not status:
            rollout.status = status
            self._notify(rollout)

    def finish(self, rollout: TrackedRollout, result: RolloutResultResponse) -> bool:
        """Record the outcome; the first one wins (lease expiry or cancellation may race it)."""
        if rollout.result is not None:
            return False
        rollout.result = result
        rollout.status = result.status
        if rollout.lease_timer is not None:
            rollout.lease_timer.cancel()
        self._notify(rollout)
        asyncio.get_running_loop().call_later(self.result_retention_sec, self._forget, rollout)
        return True

    @property
    def active(self) -> int:
        return sum(1 for r in self._rollouts.values() if r.task is not None and not r.task.done())

    def tasks(self) -> list[asyncio.Task[None]]:
        return [r.task for r in self._rollouts.values() if r.task is not None and not r.task.done()]

    # -- polling --------------------------------------------------------------------------------
    async def wait_for_result(self, rollout_id: str, lease: str) -> RolloutResultResponse:
        """Long-poll: answer at once if finished, else on the next status change or after
        `result_wait_timeout_sec`. Each poll renews the lease."""
        rollout = self._checked(rollout_id, lease)
        if rollout.result is not None:
            return rollout.result
        self._arm_lease(rollout)
        changed = rollout.changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), self.result_wait_timeout_sec)
        if rollout.result is not None:
            return rollout.result
        return RolloutResultResponse(rollout_id=rollout_id, status=rollout.status)

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
        if rollout.result is not None:
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
        if rollout.lease_timer is not None:
            rollout.lease_timer.cancel()
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
        if rollout.task is not None and not rollout.task.done():
            rollout.task.add_done_callback(lambda _: self._forget(rollout))
            return
        if self._rollouts.get(rollout.rollout_id) is rollout:
            del self._rollouts[rollout.rollout_id]

    @staticmethod
    def _notify(rollout: TrackedRollout) -> None:
        # Wake current waiters, and give later waiters a fresh event to wait on.
        rollout.changed.set()
        rollout.changed = asyncio.Event()
