"""Loopback ports for servers a test starts in another process.

A port found by binding port 0 is one the kernel hands out again at once: to the next
outgoing connection of any test (thousands per run), or another `bind(0)`. Between finding it
and the server binding it (a process start, seconds on a loaded CI machine) it may be taken,
and the server fails with "address already in use" (stop 41's CI). So the ports come from
below the kernel's ephemeral range, which it never hands out by itself, each pytest-xdist
worker from its own slice, and never the same one twice in a process.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOWEST = 10_000
_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing is bound to, below the ephemeral range, not given before."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports, as `free_port`."""
    low, high = _slice()
    found: list[int] = []
    tries = 0
    while len(found) < count:
        tries += 1
        if tries > 20 * (high - low):
            raise RuntimeError(f"no free loopback port in {low}..{high}")
        candidate = random.randrange(low, high)
        if candidate in _given or not _bindable(candidate):
            continue
        _given.add(candidate)
        found.append(candidate)
        if len(_given) > (high - low) // 2:  # a long session: forget the oldest handouts
            _given.clear()
            _given.update(found)
    return found


def _slice() -> tuple[int, int]:
    """This worker's share of [LOWEST, the ephemeral range's start)."""
    top = _ephemeral_start()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    width = (top - LOWEST) // max(workers, 1)
    low = LOWEST + (index % max(workers, 1)) * width
    return low, low + width


def _ephemeral_start() -> int:
    try:
        start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        start = 32_768
    return max(start, LOWEST + 2_000)


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
