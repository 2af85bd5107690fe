"""Issue 13 (1, 7, 8, 9, 10) and 12.6: what a rollout writes and what a repository holds is hostile.

A real server process, real git origins and real rollouts that try: rewriting their dataset,
planting links to the platform's key among their artifacts, committing `.osmosis` and
`configs/eval` as links out of the checkout. Then bombs and odd input for the dataset routes,
oversized bodies, 5,000-character path components on every route, and a hostile server for
`eval download`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from osmosis.platform import Settings, create_app
from osmosis.testing import FakeModelServer
from tests.e2e.workspace import SCRIPTED_MAIN, row
from tests.platform.conftest import clean_env, free_port, osmosis
from tests.platform.databases import Databases
from tests.platform.eval_world import (
    Repo,
    Server,
    all_logs,
    finished,
    git,
    make_repo,
    run_body,
    submit,
    upload_dataset,
)

pytestmark = pytest.mark.slow

RUN_TOKEN = "run-only-7f3a9c2e51d4"
LONG = "a" * 5000

# The scripted rollout plus what a hostile member adds before the workflow runs.
HOOK = r"""
def hostile(ctx):
    checkout = Path(__file__).resolve().parents[2]  # rollouts/<name>/main.py
    if os.environ.get("WRITE_NOTE") and ctx.artifacts_dir:
        out = Path(ctx.artifacts_dir)
        out.mkdir(parents=True, exist_ok=True)
        token = os.environ.get("RUN_TOKEN", "-")
        (out / "notes.txt").write_text("the run token is " + token + "\n")
    if os.environ.get("PLANT_ARTIFACTS") and ctx.artifacts_dir:
        out = Path(ctx.artifacts_dir)
        home = Path(os.environ["PLATFORM_HOME"])
        (out / "key.txt").symlink_to(home / "secret.key")
        (out / "home").symlink_to(home, target_is_directory=True)
        os.mkfifo(out / "pipe")
    if os.environ.get("REWRITE_DATASET"):
        # Its own data file, wherever the worker put it, rewritten in place (same inode).
        for path in (checkout / ".osmosis" / "datasets" / "scripted.jsonl",
                     checkout.with_name(checkout.name + ".inputs") / "scripted.jsonl"):
            if path.is_file():
                text = path.read_text()
                with open(path, "w") as handle:
                    handle.write(re.sub(r'"ground_truth": "\d+"', '"ground_truth": "0"', text))
                print("rewrote", path, flush=True)


class Scripted(AgentWorkflow):"""
HOSTILE_MAIN = SCRIPTED_MAIN.replace("\nclass Scripted(AgentWorkflow):", HOOK, 1).replace(
    '        kind = ctx.metadata["kind"]\n        if kind == "hang":',
    '        kind = ctx.metadata["kind"]\n        hostile(ctx)\n        if kind == "hang":',
    1,
)
assert HOSTILE_MAIN.count("hostile(ctx)") == 2


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as model:
        yield model


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory,
    fake_model: FakeModelServer,
    module_databases: Databases,
) -> Iterator[Server]:
    platform = Server.start(
        tmp_path_factory.mktemp("platform"), fake_model, databases=module_databases
    )
    yield platform
    platform.stop()


def rows_of(b: int, count: int = 4) -> list[dict[str, Any]]:
    return [row("pass", a, b) for a in range(2, 2 + count)]


def headers(server: Server, repo: Repo | None = None) -> dict[str, str]:
    found = {"Authorization": f"Bearer {server.admin_token}"}
    return {**found, "X-Osmosis-Git": repo.git} if repo is not None else found


@pytest.fixture
def http() -> Iterator[Callable[..., httpx.Client]]:
    """HTTP clients of a server (as its admin, in a repo's workspace), closed after the test."""
    made: list[httpx.Client] = []

    def make(server: Server, repo: Repo | None = None, *, timeout: float = 60) -> httpx.Client:
        client = httpx.Client(base_url=server.url, headers=headers(server, repo), timeout=timeout)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- 13.1: datasets stay immutable ---------------------------------------------------------------
def test_a_rollout_that_rewrites_its_dataset_changes_no_other_run(tmp_path, fake_model, databases):
    # Unsandboxed (OSMOSIS_SANDBOX=off): a sandboxed rollout cannot even see its dataset copy
    # (tests/platform/test_sandbox.py); this shows the copy protects the other runs when a
    # rollout does rewrite it.
    server = Server.start(
        tmp_path / "platform", fake_model, databases=databases, OSMOSIS_SANDBOX="off"
    )
    try:
        _rewrite_and_check(server, tmp_path)
    finally:
        server.stop()


def _rewrite_and_check(server: Server, tmp_path: Path) -> None:
    rows = rows_of(7, count=6)
    first = make_repo(
        tmp_path / "a", rows, limit=6, main=HOSTILE_MAIN, env={"REWRITE_DATASET": "1"}
    )
    second = make_repo(tmp_path / "b", rows, limit=6, main=HOSTILE_MAIN)
    data = (first.tree / "data" / "scripted.jsonl").read_bytes()
    assert data == (second.tree / "data" / "scripted.jsonl").read_bytes()  # one blob for both
    upload_dataset(server, first)
    upload_dataset(server, second)
    with server.client() as client:
        run = finished(client, submit(client, first).name)
        said = list(all_logs(client, run.eval_run.id))
        assert any("rewrote" in line for line in said), said  # it found its file and wrote it
        other = finished(client, submit(client, second).name)
        assert other.eval_run.status == "finished", list(all_logs(client, other.eval_run.id))
        assert other.summary.pass_rate == 1.0  # the other workspace's rows are the originals
        for repo in (first, second):
            assert client.datasets.get(git=repo.git, name="scripted").sha256 == sha(data)
    blob = server.home / "blobs" / "datasets" / f"{sha(data)}.jsonl"
    assert sha(blob.read_bytes()) == sha(data)  # `dataset info`'s hash is still the bytes'


def test_a_blob_changed_on_disk_fails_the_run_naming_both_hashes(server, tmp_path):
    repo = make_repo(tmp_path, rows_of(11), limit=4)
    upload_dataset(server, repo)
    data = (repo.tree / "data" / "scripted.jsonl").read_bytes()
    blob = server.home / "blobs" / "datasets" / f"{sha(data)}.jsonl"
    blob.chmod(0o600)
    blob.write_bytes(data.replace(b'"ground_truth": "22"', b'"ground_truth": "00"'))
    with server.client() as client:
        run = finished(client, submit(client, repo).name)
    assert run.eval_run.status == "failed"
    error = run.eval_run.error or ""
    assert f"not the {sha(data)} recorded when it was uploaded" in error, error
    assert "changed on disk" in error and run.summary.progress.completed == 0
    worker_log = server.home / "logs" / "workers" / f"{run.eval_run.id}.log"
    assert "changed on disk" in worker_log.read_text()  # the operator hears of it too


# -- 12.6: the worker never writes through a path the repository controls -----------------------
def test_links_a_repository_commits_never_redirect_the_worker(server, tmp_path):
    somewhere = tmp_path / "somewhere"
    (somewhere / "datasets").mkdir(parents=True)
    sentinel = somewhere / "datasets" / "scripted.jsonl"
    sentinel.write_text("not the platform's\n")
    victim = tmp_path / "victim.toml"
    victim.write_text("precious\n")
    repo = make_repo(tmp_path / "ws", rows_of(13), limit=4)
    upload_dataset(server, repo)
    body = run_body(repo)  # of the real config, before it becomes a link
    (repo.tree / ".osmosis").symlink_to(somewhere, target_is_directory=True)
    repo.config.unlink()
    repo.config.symlink_to(victim)
    git("add", "-A", "--force", cwd=repo.tree)
    commit = repo.push("links out of the checkout")
    with server.client() as client:
        created = client.runs.submit(git=repo.git, body=_at(body, commit))
        run = finished(client, created.name)
    assert run.eval_run.status == "finished", run.eval_run.error
    assert run.summary.pass_rate == 1.0
    assert victim.read_text() == "precious\n"
    assert sentinel.read_text() == "not the platform's\n"
    assert sorted(p.name for p in somewhere.rglob("*")) == ["datasets", "scripted.jsonl"]


def test_a_linked_configs_eval_is_refused_and_nothing_is_written_through_it(server, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    repo = make_repo(tmp_path / "ws", rows_of(17), limit=4)
    upload_dataset(server, repo)
    body = run_body(repo)
    eval_dir = repo.tree / "configs" / "eval"
    for path in eval_dir.iterdir():
        path.unlink()
    eval_dir.rmdir()
    eval_dir.symlink_to(elsewhere, target_is_directory=True)
    commit = repo.push("configs/eval is a link")
    with server.client() as client:
        created = client.runs.submit(git=repo.git, body=_at(body, commit))
        run = finished(client, created.name)
    assert run.eval_run.status == "failed"
    assert "configs/eval is a symbolic link in the repository" in (run.eval_run.error or "")
    assert list(elsewhere.iterdir()) == []


def _at(body: Any, commit: str) -> Any:
    """A submit body built from the committed config, sent for a later commit."""
    repository = body.repository.model_copy(update={"commit_sha": commit})
    return body.model_copy(update={"repository": repository})


# -- 13.9 and 12.6: artifacts are copied safely, redacted, and served without links -------------
class HostileRun:
    def __init__(self, server: Server, repo: Repo, run_id: str, name: str) -> None:
        self.server, self.repo, self.id, self.name = server, repo, run_id, name


@pytest.fixture(scope="module")
def hostile_run(server: Server, tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    """A finished run whose rollout planted a link to the key file, a link to the home, a
    FIFO, and a note holding the run-only secret among each attempt's artifacts."""
    repo = make_repo(
        tmp_path_factory.mktemp("hostile"),
        rows_of(19),
        limit=4,
        main=HOSTILE_MAIN,
        secrets=["RUN_TOKEN"],
        env={"WRITE_NOTE": "1", "PLANT_ARTIFACTS": "1", "PLATFORM_HOME": str(server.home)},
    )
    upload_dataset(server, repo)
    with server.client() as client:
        created = submit(client, repo, provided={"RUN_TOKEN": RUN_TOKEN})
        run = finished(client, created.name)
        assert run.eval_run.status == "finished", list(all_logs(client, created.id))
    return HostileRun(server, repo, created.id, created.name)


@pytest.fixture(scope="module")
def plain_run(server: Server, tmp_path_factory: pytest.TempPathFactory) -> HostileRun:
    """A finished run whose attempts each wrote one artifact, `notes.txt`, and nothing odd."""
    repo = make_repo(
        tmp_path_factory.mktemp("plain"),
        rows_of(43),
        limit=4,
        main=HOSTILE_MAIN,
        env={"WRITE_NOTE": "1"},
    )
    upload_dataset(server, repo)
    with server.client() as client:
        created = submit(client, repo)
        run = finished(client, created.name)
        assert run.eval_run.status == "finished", "\n".join(all_logs(client, created.id))
    return HostileRun(server, repo, created.id, created.name)


def test_an_artifact_link_to_the_key_never_yields_its_bytes(hostile_run, tmp_path, http):
    server = hostile_run.server
    key = (server.home / "secret.key").read_bytes().strip()
    assert len(key) > 20
    api = http(server)
    base = f"/api/eval-runs/{hostile_run.name}"
    manifest = api.get(f"{base}/files", params={"types": "artifacts"}).json()
    paths = sorted(item["path"] for item in manifest["files"])
    assert paths == [f"artifacts/row_{r}_run_0/notes.txt" for r in range(4)]
    for name in ("key.txt", "home/secret.key", "home/credentials.json", "pipe"):
        assert api.get(f"{base}/files/artifacts/row_0_run_0/{name}").status_code == 404
        page = f"/runs/{hostile_run.name}/samples/0/0"
        assert api.get(f"{page}/artifacts/{name}").status_code == 404
        assert (
            api.get(f"/runs/{hostile_run.name}/files/artifacts/row_0_run_0/{name}").status_code
            == 404
        )
        shown = api.get(page, params={"file": name})
        assert shown.status_code in (200, 404) and key not in shown.content
    sample = api.get(f"/runs/{hostile_run.name}/samples/0/0")
    assert sample.status_code == 200 and key not in sample.content
    assert "notes.txt" in sample.text and "key.txt" not in sample.text

    # Everything `eval download` fetches, as a user runs it.
    done = osmosis(
        "--json",
        "eval",
        "download",
        hostile_run.name,
        "--type",
        "all",
        "-o",
        str(tmp_path),
        env=server.env,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    fetched = [p for p in (tmp_path / hostile_run.name).rglob("*") if p.is_file()]
    assert any(p.name == "notes.txt" for p in fetched)
    assert not any(p.is_symlink() for p in (tmp_path / hostile_run.name).rglob("*"))
    assert all(key not in p.read_bytes() for p in fetched)
    # ... and nothing on the server's side of the run directory either.
    stored = server.home / "runs" / hostile_run.id / "artifacts"
    assert all(key not in p.read_bytes() for p in stored.rglob("*") if p.is_file())
    assert not any(p.is_symlink() for p in stored.rglob("*"))


def test_a_run_only_secret_in_an_artifact_is_redacted_where_it_is_served(hostile_run, http):
    server = hostile_run.server
    api = http(server)
    served = api.get(f"/api/eval-runs/{hostile_run.name}/files/artifacts/row_1_run_0/notes.txt")
    assert served.status_code == 200
    assert served.text == "the run token is [REDACTED]\n"
    page = api.get(f"/runs/{hostile_run.name}/samples/1/0", params={"file": "notes.txt"})
    assert page.status_code == 200 and RUN_TOKEN not in page.text and "[REDACTED]" in page.text
    raw = api.get(f"/runs/{hostile_run.name}/samples/1/0/artifacts/notes.txt")
    assert raw.status_code == 200 and RUN_TOKEN.encode() not in raw.content
    with server.client() as client:
        said = "\n".join(all_logs(client, hostile_run.id))
    # What was left out is in the log the user reads, the secret is not.
    assert "artifacts of row_1_run_0: 3 not copied (home: a symbolic link" in said
    assert "pipe: a FIFO: only regular files are copied" in said and RUN_TOKEN not in said


# -- 13.10: no 500 for a long path --------------------------------------------------------------
def _route_values(run: HostileRun, dataset_id: str) -> dict[str, list[str]]:
    return {
        "run": [run.name],
        "run_ref": [run.name],
        "path": ["metrics.json", "artifacts/row_0_run_0/notes.txt"],
        "row_index": ["0"],
        "run_index": ["0"],
        "name": ["scripted"],
        "dataset_id": [dataset_id],
    }


def _routes(routes: Any) -> Iterator[tuple[str, set[str]]]:
    """(path, methods) of every route, through FastAPI's included routers."""
    for route in routes:
        if hasattr(route, "effective_candidates"):  # an included router (FastAPI >= 0.16x)
            yield from _routes(route.effective_candidates())
        elif getattr(route, "path", None) and getattr(route, "methods", None):
            yield route.path, set(route.methods)


def test_a_five_thousand_character_path_component_is_never_a_500(plain_run, tmp_path, http):
    server = plain_run.server
    api = http(server, plain_run.repo)
    dataset_id = api.get("/api/datasets/scripted").json()["id"]
    values = _route_values(plain_run, dataset_id)
    # The routes, from the server's own OpenAPI document and the dashboard's router.
    spec = api.get("/openapi.json").json()
    routes = [(m.upper(), p) for p, ops in spec["paths"].items() for m in ops if "{" in p]
    app = create_app(Settings(home=tmp_path / "listing"))
    try:
        pages = [
            (method, path)
            for path, methods in _routes(app.routes)
            if "{" in path and not path.startswith("/api")
            for method in sorted(methods)
            if method != "HEAD"
        ]
    finally:
        app.state.engine.dispose()
    assert pages, "no dashboard page with a path parameter was found"
    tried, answers = 0, {}
    for method, template in routes + pages:
        params = re.findall(r"\{([^}:]+)(?::path)?\}", template)
        for long_one in params:
            for long_value in (
                LONG,
                *(f"{v}/{LONG}" for v in values.get(long_one, []) if "/" in v),
            ):
                url = template
                for param in params:
                    value = long_value if param == long_one else values.get(param, ["x"])[0]
                    url = re.sub(r"\{" + param + r"(?::path)?\}", value, url)
                answer = api.request(method, url, json={} if method in ("POST", "PUT") else None)
                tried += 1
                answers[(method, template, long_one, long_value[:30])] = answer.status_code
    # A query value is a path component too: the sample page's `?file=`.
    sample = api.get(f"/runs/{plain_run.name}/samples/0/0", params={"file": f"out/{LONG}"})
    answers[("GET", "/runs/{run_ref}/samples/..?file=", "file", "long")] = sample.status_code
    bad = {where: status for where, status in answers.items() if status not in (400, 404, 422)}
    assert not bad, bad
    assert tried > 20


# -- 13.7: bodies, bombs and odd input -----------------------------------------------------------
def test_json_bodies_over_the_limit_are_refused_before_they_are_read(server, tmp_path, http):
    repo = make_repo(tmp_path, rows_of(23), limit=4)
    api = http(server, repo)
    huge = b'{"config_toml": "' + b"x" * (2 << 20) + b'"}'
    answer = api.post("/api/eval-runs", content=huge, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert error["code"] == "PAYLOAD_TOO_LARGE" and "OSMOSIS_MAX_BODY_BYTES" in error["message"]
    assert error["details"] == {"size": len(huge), "max_body_bytes": 1024 * 1024}

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"config_toml": "'
        for _ in range(3):
            yield b"x" * (1 << 20)
        yield b'"}'

    streamed = api.post(
        "/api/eval-runs", content=chunked(), headers={"Content-Type": "application/json"}
    )
    assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"
    # The dataset upload streams to disk under its own, larger limit.
    big_rows = [{"user_prompt": f"{i} " + "y" * 1000, "ground_truth": str(i)} for i in range(3000)]
    data = "".join(json.dumps(r) + "\n" for r in big_rows).encode()
    assert len(data) > 2 << 20
    params = {"file_name": "big.jsonl", "size": len(data), "sha256": sha(data)}
    assert api.post("/api/datasets", params=params, content=data).status_code == 201


def _upload(api: httpx.Client, file_name: str, data: bytes) -> httpx.Response:
    params = {"file_name": file_name, "size": len(data), "sha256": sha(data)}
    return api.post("/api/datasets", params=params, content=data)


def _jsonl(*lines: str) -> bytes:
    good = [json.dumps({"metadata": {"k": f"s{i}"}}) for i in range(3)]
    return ("\n".join([*good, *lines]) + "\n").encode()


def test_a_row_nested_a_thousand_deep_is_a_clear_error_in_the_cli_and_the_server(
    server, tmp_path, http
):
    repo = make_repo(tmp_path, rows_of(29), limit=4)
    deep = '{"a": ' * 1000 + "1" + "}" * 1000
    path = repo.tree / "data" / "deep.jsonl"
    path.write_bytes(_jsonl('{"metadata": ' + deep + "}"))
    checked = osmosis("--json", "dataset", "validate", str(path), env=server.env)
    assert checked.returncode != 0
    error = json.loads(checked.stdout or checked.stderr)["error"]
    assert error["code"] == "VALIDATION", error
    assert "deep.jsonl:4: row 3: invalid JSON: nested too deeply to read" in error["message"]
    assert "Recursion" not in checked.stdout + checked.stderr

    api = http(server, repo)
    answer = _upload(api, "deep.jsonl", path.read_bytes())
    assert answer.status_code == 422, answer.text
    assert "row 3: invalid JSON: nested too deeply to read" in answer.json()["error"]["message"]
    info = api.get("/api/datasets/deep").json()
    assert info["status"] == "error" and "nested too deeply" in info["error"]


def test_surrogates_and_nul_are_refused_and_no_page_breaks(server, tmp_path, http):
    repo = make_repo(tmp_path, rows_of(31), limit=4)
    api = http(server, repo)
    surrogate = _upload(api, "lone.jsonl", _jsonl('{"metadata": {"k": "\\ud800"}}'))
    assert surrogate.status_code == 422
    assert "lone surrogate (U+D800)" in surrogate.json()["error"]["message"]
    nul = b"user_prompt,ground_truth\nq1,1\nq2,2\nq\x003,3\nq4,4\n"
    refused = _upload(api, "nulbyte.csv", nul)
    assert refused.status_code == 422
    assert "nulbyte.csv:4: row 2: user_prompt: contains a NUL character" in refused.text
    for name in ("lone", "nulbyte"):
        info = api.get(f"/api/datasets/{name}").json()
        assert info["status"] == "error"
        assert api.get(f"/datasets/{info['id']}").status_code == 200
    assert api.get("/datasets").status_code == 200


@pytest.mark.parametrize(
    ("file_name", "rule"),
    [
        (" .jsonl", "cannot start or end with a space"),
        ("CON.jsonl", "CON, PRN, AUX, NUL, COM0-9 and LPT0-9 are device names on Windows"),
        ("nul.jsonl", "device names on Windows"),
        ("a\uff0fb.jsonl", "look-alike of / or \\ such as the full-width"),
        ("a\uff3cb.jsonl", "look-alike of / or \\"),
        ("a:b.jsonl", "Windows refuses : * ?"),
        ("qa..jsonl", "or end with a dot"),
    ],
)
def test_names_no_system_can_hold_are_refused_with_the_rule(
    server, tmp_path, file_name, rule, http
):
    repo = make_repo(tmp_path, rows_of(37), limit=4)
    api = http(server, repo)
    answer = _upload(api, file_name, _jsonl('{"metadata": {"k": "s9"}}'))
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "VALIDATION"
    assert rule in answer.json()["error"]["message"]


def _peak_and_now(pid: int) -> tuple[int, int]:
    """(peak RSS, RSS) of a process, in MB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmHWM"].split()[0]) // 1024, int(fields["VmRSS"].split()[0]) // 1024


def test_a_parquet_bomb_costs_neither_memory_nor_database(fake_model, tmp_path, http, databases):
    """4 rows of 50 MB strings in a 7 KB file: once 1.7 GB of server memory and +420 MB of
    database. Now refused from the file's footer; 4 rows of 10 MB (allowed) store a preview
    of cut cells."""
    platform = Server.start(tmp_path / "bomb-platform", fake_model, databases=databases)
    try:
        repo = make_repo(tmp_path / "ws", rows_of(41), limit=4)
        api = http(platform, repo, timeout=300)
        bombs = {}
        for megabytes in (50, 10):
            values = ["a" * (megabytes << 20) + str(i) for i in range(4)]
            path = tmp_path / f"bomb{megabytes}.parquet"
            table = pa.table({"user_prompt": values, "ground_truth": ["1"] * 4})
            pq.write_table(table, path, compression="zstd", compression_level=19)
            bombs[megabytes] = path.read_bytes()
        assert len(bombs[50]) < 10_000
        time.sleep(0.5)
        _, rss_before = _peak_and_now(platform.pid)
        db_before = databases.size_bytes(databases.url(platform.home))

        refused = _upload(api, "bomb50.parquet", bombs[50])
        peak, _ = _peak_and_now(platform.pid)
        assert refused.status_code == 422
        message = refused.json()["error"]["message"]
        assert (
            "column user_prompt holds 52,4" in message
            and "a cell may hold at most 16,777,216" in message
        )
        assert peak - rss_before < 150, (rss_before, peak)

        accepted = _upload(api, "bomb10.parquet", bombs[10])
        assert accepted.status_code == 201, accepted.text
        preview = api.get("/api/datasets/bomb10/preview", params={"rows": 20})
        peak, _ = _peak_and_now(platform.pid)
        growth = databases.size_bytes(databases.url(platform.home)) - db_before
        print(
            f"parquet bomb: server RSS {rss_before} MB before, peak {peak} MB; database "
            f"+{growth:,} bytes; preview {len(preview.content):,} bytes"
        )
        cells = [r["user_prompt"] for r in preview.json()["rows"]]
        assert [len(c) for c in cells] == [2001] * 4 and all(c.endswith("…") for c in cells)
        assert len(preview.content) < 50_000
        assert growth < 2 << 20, growth
        assert peak < 500, (rss_before, peak)  # a few hundred MB at most, not 1.7 GB
    finally:
        platform.stop()


# -- 13.8: the client never writes outside its folder --------------------------------------------
class HostileServer:
    """A tiny platform impostor on loopback: it answers a real run's detail and files, but
    names the run by an absolute path, with a name that cleans to nothing."""

    def __init__(self, real: HostileRun, evil: Path) -> None:
        self.real, self.evil = real, evil
        self.port = free_port()
        self.app = FastAPI()
        self.app.add_api_route("/{rest:path}", self.answer, methods=["GET"])
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    async def answer(self, rest: str, request: Request) -> Response:
        real = self.real.server
        after = rest.removeprefix("api/eval-runs/")
        key = next(k for k in (str(self.evil), "x", "") if after.startswith(k))
        suffix = after[len(key) :]
        async with httpx.AsyncClient(base_url=real.url, headers=headers(real)) as upstream:
            if suffix in ("", "/"):
                found = await upstream.get(f"/api/eval-runs/{self.real.name}")
                detail = found.json()
                detail["eval_run"].update(id=str(self.evil), name="///")
                return JSONResponse(detail)
            found = await upstream.get(
                f"/api/eval-runs/{self.real.name}{suffix}", params=dict(request.query_params)
            )
        kind = found.headers.get("content-type")
        return Response(found.content, status_code=found.status_code, media_type=kind)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the hostile server did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_a_hostile_server_cannot_make_eval_download_write_outside_its_folder(plain_run, tmp_path):
    evil = tmp_path / "outside" / "target"
    evil.mkdir(parents=True)
    root = tmp_path / "downloads"
    with HostileServer(plain_run, evil) as impostor:
        env = clean_env(OSMOSIS_CONFIG_DIR=str(tmp_path / "config"), OSMOSIS_TOKEN="any-token")
        url = f"http://127.0.0.1:{impostor.port}"
        # The impostor does answer a plausible run, as a client would see it.
        assert httpx.get(f"{url}/api/eval-runs/x").json()["eval_run"]["id"] == str(evil)
        for command in (
            ["eval", "download", "x", "--type", "metrics,logs", "-o", str(root), "-y"],
            ["eval", "info", "x", "-o", str(root)],
        ):
            done = osmosis("--json", "--platform", url, *command, env=env)
            assert done.returncode != 0, done.stdout
            error = json.loads(done.stdout or done.stderr)["error"]
            assert error["code"] == "PLATFORM_ERROR", error
            assert "refusing to write outside the output directory" in error["message"]
    assert list(evil.iterdir()) == []  # no metrics.json, no logs.txt
    assert not root.exists() or not any(p.is_file() for p in root.rglob("*"))
