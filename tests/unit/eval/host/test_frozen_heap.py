"""`frozen_heap`: what a run starts with stays out of full collections while it dispatches,
and is collectable again once it is over (a platform worker hosts many runs)."""

import gc
import weakref

import pytest

from osmosis.eval.host.frozen_heap import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def _dropped_cycle() -> weakref.ref[_Node]:
    return weakref.ref(_Node())


def test_garbage_made_before_a_run_is_left_alone_during_it_and_collected_after() -> None:
    assert gc.get_freeze_count() == 0
    left = _dropped_cycle()
    with frozen_heap():
        gc.collect()
        assert left() is not None, "a full collection walked the frozen objects"
        made_during = _dropped_cycle()
        gc.collect()
        assert made_during() is None, "what the run makes itself must still be collected"
    gc.collect()
    assert left() is None
    assert gc.get_freeze_count() == 0


def test_overlapping_runs_share_one_freeze_and_the_last_one_out_thaws_it() -> None:
    first, second = frozen_heap(), frozen_heap()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_freeze_count() > 0, "a run still dispatching lost its freeze"
    second.__exit__(None, None, None)
    assert gc.get_freeze_count() == 0


def test_a_run_that_fails_thaws_the_heap_too() -> None:
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0
