"""GroupCommit: writes on a thread, one commit per group, and nobody told "done" early."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from osmosis.eval.host.group_commit import GroupCommit, WriterClosed


class Journal:
    """A fake journal: what was written, what each commit covered, on which thread."""

    def __init__(self, commit_sec: float = 0.0, fail_write: int | None = None) -> None:
        self.written: list[int] = []
        self.committed: list[int] = []  # how many writes each commit covered, in total
        self.threads: set[str] = set()
        self.commit_sec = commit_sec
        self.fail_write = fail_write
        self.fail_commit = False

    def write(self, job: int) -> int:
        self.threads.add(threading.current_thread().name)
        if job == self.fail_write:
            raise OSError(f"disk full writing {job}")
        self.written.append(job)
        return job * 10

    def commit(self) -> None:
        time.sleep(self.commit_sec)  # an fsync
        if self.fail_commit:
            raise OSError("fsync failed")
        self.committed.append(len(self.written))

    def is_durable(self, job: int) -> bool:
        return bool(self.committed) and self.written.index(job) < self.committed[-1]


async def test_every_job_returns_only_after_a_commit_that_covers_it() -> None:
    journal = Journal(commit_sec=0.02)
    writer = GroupCommit(write=journal.write, commit=journal.commit, name="journal")

    async def submit(job: int) -> tuple[int, bool]:
        result = await writer.submit(job)
        return result, journal.is_durable(job)

    results = await asyncio.gather(*(submit(job) for job in range(200)))
    writer.close()

    assert [result for result, _ in results] == [job * 10 for job in range(200)]
    assert all(durable for _, durable in results)
    assert sorted(journal.written) == list(range(200))
    # Jobs that arrived while a commit ran shared the next one.
    assert writer.commits < 20
    assert journal.threads == {"journal"}


async def test_a_failed_write_fails_only_its_own_job() -> None:
    journal = Journal(fail_write=3)
    writer = GroupCommit(write=journal.write, commit=journal.commit)

    results = await asyncio.gather(
        *(writer.submit(job) for job in range(6)), return_exceptions=True
    )
    writer.close()

    assert isinstance(results[3], OSError)
    assert "disk full writing 3" in str(results[3])
    assert [r for i, r in enumerate(results) if i != 3] == [0, 10, 20, 40, 50]


async def test_a_failed_commit_fails_every_job_of_its_group() -> None:
    journal = Journal()
    journal.fail_commit = True
    writer = GroupCommit(write=journal.write, commit=journal.commit)

    results = await asyncio.gather(
        *(writer.submit(job) for job in range(5)), return_exceptions=True
    )
    journal.fail_commit = False
    after = await writer.submit(99)
    writer.close()

    assert all(isinstance(result, OSError) for result in results)
    assert after == 990


async def test_a_cancelled_waiter_still_gets_its_job_written_and_committed() -> None:
    journal = Journal(commit_sec=0.2)
    writer = GroupCommit(write=journal.write, commit=journal.commit)
    first = asyncio.create_task(writer.submit(1))
    await asyncio.sleep(0.05)  # job 1 is being committed; job 2 waits for the next group
    second = asyncio.create_task(writer.submit(2))
    await asyncio.sleep(0.01)

    second.cancel()
    assert await first == 10
    with pytest.raises(asyncio.CancelledError):
        await second
    writer.close()  # waits for job 2's commit

    assert journal.written == [1, 2]
    assert journal.committed[-1] == 2
    with pytest.raises(WriterClosed):
        await writer.submit(3)
