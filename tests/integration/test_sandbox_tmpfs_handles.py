"""Issue 30: a sandboxed server's `/tmp` and `HOME` are measured through two descriptors the
endpoint opens once (`disk.open_tmpfs`), not looked up through its processes at each measure.
What the rollout writes there still counts, and no descriptor outlives the server.

Real bwrap, a real rollout server that fills its `/tmp` past its server's disk quota while it
starts.
"""

from __future__ import annotations

import asyncio
import os
import textwrap

from osmosis.eval.sites.sandbox import SandboxLimits, SandboxPolicy
from osmosis.eval.sites.sandbox.site import SandboxEndpoint
from tests.integration.test_sandbox import site_for

MiB = 1024**2

FILLS_TMP = """
import json, os, uvicorn

with open("/tmp/junk.bin", "wb") as handle:
    handle.write(b"x" * (4 * 1024 * 1024))

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = json.dumps({"status": "ok", "concurrency": {"max_concurrent": 2}}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning")
"""


def test_a_full_tmp_ends_the_server_and_no_descriptor_outlives_it(tmp_path):
    rollout = tmp_path / "ws" / "rollouts" / "fills"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(FILLS_TMP))
    limits = SandboxLimits(artifact_bytes=MiB, disk_bytes=2 * MiB, file_bytes=64 * MiB)
    site = site_for(rollout, tmp_path, [], SandboxPolicy(limits=limits))

    async def scenario() -> tuple[str | None, int, int]:
        before = len(os.listdir("/proc/self/fd"))
        await site.start(1)
        endpoint = site.endpoints[0]
        assert isinstance(endpoint, SandboxEndpoint)
        try:
            await asyncio.wait_for(endpoint.dead.wait(), 15)  # the watcher measures each second
        finally:
            await site.stop()
        return endpoint.limit_hit, before, len(os.listdir("/proc/self/fd"))

    hit, before, after = asyncio.run(scenario())
    assert hit is not None and hit.startswith("disk quota"), hit
    assert after <= before
