"""What the model bridge tells an observer of the run (issue 29: worker metrics, traces).

    bridge.observer = observer          # before `bridge.start()`; None: nothing is told
    observer.wrap_transport(transport)  # at start: every provider request passes through it
    observer.model_call(call)           # each call the bridge recorded for an attempt

The bridge only calls these two hooks; what is counted or traced is the observer's
(`osmosis.eval.host.observe`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from osmosis.eval.model.bridge_calls import CallRecord
    from osmosis.eval.model.providers import Transport


class BridgeObserver(Protocol):
    def wrap_transport(self, transport: Transport) -> Transport:
        """The transport the bridge calls the provider through (each request, each retry)."""
        ...

    def model_call(self, call: CallRecord) -> None:
        """A call answered for a dispatched attempt (200 or an error status), once recorded."""
        ...


__all__ = ["BridgeObserver"]
