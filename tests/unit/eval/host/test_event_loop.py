"""The hosts' event loop: uvloop when it is installed (it is a dependency off Windows)."""

import asyncio

import uvloop

from osmosis.eval.host import event_loop


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_result():
    async def which_loop() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    assert event_loop.run(which_loop()).startswith("uvloop")
    assert event_loop.loop_factory() is uvloop.new_event_loop
