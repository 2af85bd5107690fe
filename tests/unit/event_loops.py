"""`on_each_loop`: run an async test once on asyncio's loop and once on uvloop (what the
engine runs on), failing on any error the loop's exception handler is told."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def on_each_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run the async `test` once per loop in LOOPS, within 5 s, failing on anything the
    loop's exception handler is told (an error in a protocol callback lands there)."""

    def run(loop: str, **kwargs: Any) -> None:
        errors: list[dict[str, Any]] = []

        async def guarded() -> None:
            asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
            async with asyncio.timeout(5):
                await test(**kwargs)

        with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
            runner.run(guarded())
        assert errors == []

    signature = inspect.signature(test)
    loop_parameter = inspect.Parameter("loop", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[loop_parameter, *signature.parameters.values()], return_annotation=None
    )
    run.__name__, run.__qualname__, run.__doc__ = test.__name__, test.__qualname__, test.__doc__
    return pytest.mark.parametrize("loop", list(LOOPS))(run)
