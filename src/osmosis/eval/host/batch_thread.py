"""Jobs run in order on a thread of their own, a batch at a time, a moment after they come.

    later = BatchThread("mirror-run", delay=0.05)
    later.submit(lambda: mirror_trial(...))   # returns at once
    later.wait()                              # every job submitted so far has run (no delay)
    later.close()                             # the same, then the thread ends (never raises)

Handing each job to a thread on its own costs the submitter a future and the thread a wake-up
per job, each taking the GIL from the event loop. Here the first job of a batch wakes the
thread, which waits `delay` and then runs every job queued by then: at a provider's steady
latency the engine's attempts end in waves, and their jobs run in the gap after a wave, not
inside it. `wait` and `close` cut the delay short.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from osmosis.eval.sites import cpu_split


class BatchThread:
    def __init__(self, name: str, *, delay: float) -> None:
        self._name = name
        self._delay = delay
        self._jobs: deque[Callable[[], None]] = deque()
        self._lock = threading.Lock()
        self._hurry = threading.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._running: Future[None] | None = None  # the batch every queued job is in
        self._draining = False

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` on the thread, after the jobs submitted before it."""
        with self._lock:
            self._jobs.append(job)
            if self._draining:
                return  # the running batch takes it before it ends
            self._draining = True
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    1, thread_name_prefix=self._name, initializer=cpu_split.off_the_loop
                )
            self._running = self._executor.submit(self._drain)

    def wait(self) -> None:
        """Return once every job submitted so far has run (raising the first error of the
        batch they ran in)."""
        with self._lock:
            running = self._running
            if self._draining:
                self._hurry.set()
        if running is not None:
            running.result()

    def close(self) -> None:
        """Run every job submitted so far, then end the thread; a job's error is `wait`'s to
        raise, not this (a run directory closes whatever its mirror did). Idempotent; a later
        `submit` starts a new thread."""
        with self._lock:
            if self._draining:
                self._hurry.set()
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _drain(self) -> None:
        self._hurry.wait(self._delay)
        error: Exception | None = None
        while True:
            with self._lock:
                if not self._jobs:
                    self._draining = False
                    self._hurry.clear()
                    break
                job = self._jobs.popleft()
            try:
                job()
            except Exception as caught:  # the jobs after it still run; `wait` raises it
                error = error or caught
        if error is not None:
            raise error
