"""Jobs on a thread of their own, a batch at a time (`BatchThread`): the run directory's
`rollout_trials/` entries are made this way, in the gap after a wave of attempts. Jobs run in
order, a batch waits its delay unless asked for, and a failing job neither stops the jobs
after it nor the thread."""

from __future__ import annotations

import threading
import time

import pytest

from osmosis.eval.host.batch_thread import BatchThread


def test_jobs_submitted_together_run_in_order_in_one_batch_after_the_delay() -> None:
    later = BatchThread("test", delay=0.2)
    ran: list[tuple[int, str, float]] = []
    began = time.monotonic()
    for number in range(5):
        later.submit(
            lambda n=number: ran.append((n, threading.current_thread().name, time.monotonic()))
        )
    assert ran == []  # nothing on the submitter's time
    time.sleep(0.6)
    assert [n for n, _, _ in ran] == [0, 1, 2, 3, 4]
    assert len({name for _, name, _ in ran}) == 1
    assert all(at - began >= 0.19 for _, _, at in ran)  # in the gap, not at once
    later.close()


def test_wait_cuts_the_delay_short_and_sees_every_job_done() -> None:
    later = BatchThread("test", delay=30)
    ran: list[int] = []
    for number in range(3):
        later.submit(lambda n=number: ran.append(n))
    began = time.monotonic()
    later.wait()
    assert ran == [0, 1, 2] and time.monotonic() - began < 5
    later.submit(lambda: ran.append(3))  # a new batch after a hurried one waits again
    time.sleep(0.2)
    assert ran == [0, 1, 2]
    later.close()  # close hurries too
    assert ran == [0, 1, 2, 3]


def test_a_failing_job_is_raised_by_wait_and_the_jobs_after_it_still_run() -> None:
    later = BatchThread("test", delay=0.01)
    ran: list[str] = []

    def fail() -> None:
        raise OSError("disk full")

    later.submit(lambda: ran.append("before"))
    later.submit(fail)
    later.submit(lambda: ran.append("after"))
    with pytest.raises(OSError, match="disk full"):
        later.wait()
    assert ran == ["before", "after"]
    later.submit(lambda: ran.append("next batch"))
    later.submit(fail)
    later.close()  # a run directory closes whatever its mirror did
    assert ran == ["before", "after", "next batch"]
