"""Needs `six`, which only its own environment has, and our SDK, which the engine adds."""

import os
import sys

import six
import uvicorn

import osmosis
from osmosis import AgentWorkflow, LocalBackend, create_rollout_server


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return list(ctx.prompt)


print(f"prefix={sys.prefix} six={six.__version__} osmosis={osmosis.__file__}", flush=True)
app = create_rollout_server(backend=LocalBackend(workflow=Echo))

if __name__ == "__main__":
    port = int(os.environ["_OSMOSIS_ROLLOUT_PORT"])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
