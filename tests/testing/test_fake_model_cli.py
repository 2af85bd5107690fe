"""`osmosis dev fake-model` as users run it: a process that prints its URL and serves."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from rich.console import Console

from osmosis.cli.main import main
from osmosis.testing import FakeModelServer

COMMAND = [sys.executable, "-c", "from osmosis.cli.main import run; run()"]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*COMMAND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.fixture
def fake_model_process() -> Iterator[subprocess.Popen[str]]:
    process = start("dev", "fake-model", "--port", "0", "--wrong-rate", "0", "--seed", "1")
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_prints_its_url_serves_and_stops_on_sigterm(
    fake_model_process: subprocess.Popen[str], client: httpx.Client
) -> None:
    assert fake_model_process.stdout is not None
    base_url = fake_model_process.stdout.readline().strip()
    assert base_url.startswith("http://127.0.0.1:")
    assert base_url.endswith("/v1")
    assert not base_url.endswith(":0/v1")  # the real port, not the one asked for

    body = {"model": "m", "messages": [{"role": "user", "content": "What is 17 * 23?"}]}
    response = client.post(base_url + "/chat/completions", json=body)
    assert response.json()["choices"][0]["message"]["content"] == "391"
    stats = client.get(base_url.removesuffix("/v1") + "/stats").json()
    assert stats["chat_completions"] == 1

    fake_model_process.send_signal(signal.SIGTERM)
    assert fake_model_process.wait(timeout=10) == 0


def test_json_mode_and_ctrl_c(client: httpx.Client) -> None:
    process = start("--json", "dev", "fake-model", "--port", "0")
    try:
        assert process.stdout is not None
        document = json.loads(process.stdout.readline())
        base_url = document["data"]["base_url"]
        assert client.get(base_url + "/models").status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 130
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_invalid_option_is_one_line_and_exit_1() -> None:
    console = Console(file=io.StringIO(), width=200)
    assert main(["dev", "fake-model", "--error-rate", "2"], console=console) == 1
    assert console.file.getvalue() == "error: error_rate must be between 0 and 1, got 2.0\n"  # type: ignore[attr-defined]


def test_port_in_use_is_a_one_line_error(fake_model: FakeModelServer) -> None:
    console = Console(file=io.StringIO(), width=200)
    code = main(["dev", "fake-model", "--port", str(fake_model.port)], console=console)
    assert code == 1
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[0].startswith(f"error: cannot listen on 127.0.0.1:{fake_model.port}")
    assert lines[1].startswith("hint: ")
