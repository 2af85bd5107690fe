"""An S3-compatible object store for platform tests and benches: moto's server mode, a real
HTTP server process on a free loopback port (never a patched client).

    with MotoServer.start() as moto:
        url = moto.bucket("runs-1")             # s3://runs-1/platform, a new empty bucket
        env = {**env, **moto.env(), "OSMOSIS_BLOB_URL": url}
        moto.objects(url)                        # {key below the prefix: bytes}
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.platform.conftest import free_port

_BUCKETS = itertools.count(1)
_STARTUP_TIMEOUT_SEC = 60


@dataclass
class MotoServer:
    """`python -m moto.server` on 127.0.0.1:`port`."""

    process: subprocess.Popen[bytes]
    port: int

    @classmethod
    def start(cls, log: Path | None = None) -> MotoServer:
        port = free_port()
        with open(log or os.devnull, "wb") as output:  # the child keeps its own descriptor
            process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(process, port)
        deadline = time.monotonic() + _STARTUP_TIMEOUT_SEC
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"moto's server exited with {process.returncode}")
            try:
                httpx.get(f"{server.endpoint}/moto-api/", timeout=2)
                return server
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    server.stop()
                    raise RuntimeError("moto's server did not answer within 60 s") from None
                time.sleep(0.1)

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The AWS variables every platform process gets (moto takes any credentials)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "osmosis-test",
            "AWS_SECRET_ACCESS_KEY": "osmosis-test-secret",
        }

    def bucket(self, name: str | None = None, prefix: str = "platform") -> str:
        """A new empty bucket; returns `s3://<bucket>/<prefix>`."""
        name = name or f"osmosis-{os.getpid()}-{next(_BUCKETS)}"
        response = httpx.put(f"{self.endpoint}/{name}", timeout=30)
        assert response.status_code == 200, response.text
        return f"s3://{name}/{prefix}" if prefix else f"s3://{name}"

    def objects(self, url: str, under: str = "") -> dict[str, bytes]:
        """Every object below `url` (+ `under`), by key relative to the URL's prefix."""
        import obstore
        from obstore.store import S3Store

        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        store = S3Store(
            bucket,
            prefix=prefix or None,
            endpoint=self.endpoint,
            region="us-east-1",
            access_key_id="osmosis-test",
            secret_access_key="osmosis-test-secret",
            client_options={"allow_http": True},
        )
        keys = [meta["path"] for page in obstore.list(store, under or None) for meta in page]
        return {key: bytes(obstore.get(store, key).bytes()) for key in keys}
