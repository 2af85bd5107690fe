"""Group commit on a writer thread: slow, blocking writes leave the event loop, and one
commit (one fsync) covers every write that arrived while the previous one ran.

    writer = GroupCommit(write=append_line, commit=fsync_journal, name="journal")
    offset = await writer.submit(record)   # returns once a commit after its write returned
    writer.close()                         # commits what is queued, then stops the thread

`write(job)` runs on the thread, in submission order; after each group of writes, `commit()`
runs once, and only then does each `submit` return `write`'s result. A job whose write raised
gets that error; when the commit raises, every job of its group gets that error (nothing of
the group counts as done). A waiter that is cancelled does not stop its job: once submitted,
a job is written and committed, and `close()` waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from osmosis.eval.sites import cpu_split

__all__ = ["GroupCommit", "WriterClosed"]

_Job = TypeVar("_Job")
_Result = TypeVar("_Result")


class WriterClosed(RuntimeError):
    """`submit` after `close`."""


@dataclass(eq=False)
class _Pending(Generic[_Job, _Result]):
    job: _Job
    future: asyncio.Future[_Result]
    loop: asyncio.AbstractEventLoop
    result: _Result | None = None
    error: BaseException | None = None


class GroupCommit(Generic[_Job, _Result]):
    """One writer thread, started with the first job; see the module doc."""

    def __init__(
        self,
        *,
        write: Callable[[_Job], _Result],
        commit: Callable[[], None],
        name: str = "group-commit",
    ) -> None:
        self._write = write
        self._commit = commit
        self._name = name
        self._queue: deque[_Pending[_Job, _Result]] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._kicks: set[asyncio.AbstractEventLoop] = set()  # loops with a wake-up pending
        self.commits = 0
        """How many commits ran (for tests and benchmarks: commits < jobs means grouping)."""

    async def submit(self, job: _Job) -> _Result:
        """Queue `job`; returns `write(job)`'s result once a commit after it returned."""
        loop = asyncio.get_running_loop()
        pending: _Pending[_Job, _Result] = _Pending(job, loop.create_future(), loop)
        with self._ready:
            if self._closing:
                raise WriterClosed(f"the {self._name} writer is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append(pending)
            if loop not in self._kicks:
                # One wake-up of the thread per turn of the loop, however many jobs came in it:
                # each wake-up is a system call and a fight for the GIL.
                self._kicks.add(loop)
                loop.call_soon(self._kick, loop)
        return await pending.future

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._ready:
            self._kicks.discard(loop)
            self._ready.notify()

    def close(self) -> None:
        """Write and commit everything queued, then stop the thread (idempotent)."""
        with self._ready:
            self._closing = True
            self._ready.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- the writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        cpu_split.off_the_loop()
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return  # closing, and nothing left
                group = list(self._queue)
                self._queue.clear()
            self._write_group(group)

    def _write_group(self, group: list[_Pending[_Job, _Result]]) -> None:
        written = []
        for pending in group:
            try:
                pending.result = self._write(pending.job)
                written.append(pending)
            except BaseException as error:  # handed to the job's waiter
                pending.error = error
        if written:
            try:
                self._commit()
                self.commits += 1
            except BaseException as error:  # nothing of this group counts
                for pending in written:
                    pending.error = error
        by_loop: dict[asyncio.AbstractEventLoop, list[_Pending[_Job, _Result]]] = {}
        for pending in group:
            by_loop.setdefault(pending.loop, []).append(pending)
        for loop, settled in by_loop.items():
            # One wake-up per group; a closed loop has nobody waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, settled)


def _settle(group: list[_Pending[_Job, _Result]]) -> None:
    for pending in group:
        if pending.future.done():
            continue  # its waiter was cancelled; the job was written all the same
        if pending.error is not None:
            pending.future.set_exception(pending.error)
        else:
            pending.future.set_result(pending.result)  # type: ignore[arg-type]
