"""Serve the example multiply rollout and drive every dataset row through it.

    python examples/demo.py [--wrong-rate 0.25]

Until the evaluation engine lands, this is the smallest honest controller: it starts the
scripted model server and the rollout's entrypoint as a child process, admits one rollout per
row over protocol 0.4, long-polls the results and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from osmosis.testing import FakeModelServer

WORKSPACE = Path(__file__).parent / "workspace"
ROLLOUT = WORKSPACE / "rollouts" / "multiply"
DATASET = WORKSPACE / "data" / "multiply.jsonl"
TERMINAL = {"success", "failure", "cancelled"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_rollout_server(port: int, artifact_root: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "_OSMOSIS_ROLLOUT_PORT": str(port),
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": artifact_root,
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "main.py"], cwd=ROLLOUT, env=env, stderr=subprocess.DEVNULL
    )


async def wait_healthy(client: httpx.AsyncClient, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the rollout server exited with code {process.returncode}")
        try:
            if (await client.get("/health")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the rollout server did not become healthy within 30 s")


async def run_row(client: httpx.AsyncClient, model_url: str, row: dict) -> dict:
    rollout_id = uuid.uuid4().hex
    messages = [
        {"role": "system", "content": row["system_prompt"]},
        {"role": "user", "content": row["user_prompt"]},
    ]
    accepted = await client.post(
        "/rollout",
        json={
            "rollout_id": rollout_id,
            "initial_messages": messages,
            "label": row["ground_truth"],
            "chat_completions_url": f"{model_url}/rollouts/{rollout_id}",
            "agent_timeout_sec": 60,
            "grader_timeout_sec": 30,
        },
    )
    accepted.raise_for_status()
    lease = {"X-Osmosis-Rollout-Lease": accepted.json()["polling_lease_token"]}
    while True:
        result = (await client.get(f"/rollout/{rollout_id}/result", headers=lease)).json()
        if result["status"] in TERMINAL:
            return dict(result)


async def main(wrong_rate: float) -> int:
    console = Console()
    rows = [json.loads(line) for line in DATASET.read_text().splitlines() if line.strip()]
    port = free_port()
    with (
        tempfile.TemporaryDirectory() as artifacts,
        FakeModelServer(wrong_rate=wrong_rate, seed=1) as model,
    ):
        process = start_rollout_server(port, artifacts)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                await wait_healthy(client, process)
                console.print(f"→ rollout server healthy on port {port}; model at {model.base_url}")
                results = await asyncio.gather(
                    *(run_row(client, model.base_url, row) for row in rows)
                )
        finally:
            process.terminate()
            process.wait(timeout=10)
    table = Table(title="multiply — one attempt per row")
    for column in ("row", "question", "answer", "label", "status", "reward"):
        table.add_column(column)
    for index, (row, result) in enumerate(zip(rows, results, strict=True)):
        sample = result.get("sample") or {}
        answer = (sample.get("messages") or [{}])[-1].get("content", "")
        reward = sample.get("reward")
        table.add_row(
            str(index),
            row["user_prompt"],
            str(answer),
            row["ground_truth"],
            result["status"],
            "-" if reward is None else f"{reward:g}",
        )
    console.print(table)
    passed = sum(1 for r in results if (r.get("sample") or {}).get("reward") == 1.0)
    console.print(f"passed {passed}/{len(rows)} ({passed / len(rows):.0%})")
    return 0 if all(r["status"] == "success" for r in results) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrong-rate", type=float, default=0.25, help="share of wrong answers")
    sys.exit(asyncio.run(main(parser.parse_args().wrong_rate)))
