"""The object-store blob backend (issue 29.1): `OSMOSIS_BLOB_URL=s3://bucket/prefix` against a
real S3-compatible HTTP server (moto's server mode, a subprocess on loopback, one per session).

Two `ObjectBlobStore`s on two local directories stand for two machines: what one stores the
other reads from the store alone. The slow test runs the platform as a team does: an API and
two workers, each on its own home, sharing only PostgreSQL and the object store."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from osmosis.client import PlatformClient
from osmosis.platform.core.blobs import (
    MARKER,
    BlobMismatch,
    BlobStore,
    BlobStoreError,
    ObjectBlobStore,
)
from osmosis.platform.core.blobs import check_identity as check_store_identity
from osmosis.platform.core.db import make_engine, make_session_factory, upgrade
from osmosis.platform.core.object_store import RunPublisher
from osmosis.platform.core.settings import Settings
from osmosis.testing import FakeModelServer
from tests.e2e.conftest import osmosis as osmosis_in
from tests.e2e.workspace import row
from tests.platform.conftest import osmosis, osmosis_json
from tests.platform.eval_world import (
    Server,
    all_logs,
    finished,
    gone_within,
    make_repo,
    pids_of,
    read_jsonl,
    recorded_at_least,
    submit,
    upload_dataset,
)
from tests.platform.object_store_world import MotoServer
from tests.platform.test_roles import Process, team

ROWS = 30
_VOLATILE = ("_id", "_ms", "_at", "timestamp")


@pytest.fixture(scope="session")
def moto(tmp_path_factory) -> Iterator[MotoServer]:
    with MotoServer.start(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def aws(moto, monkeypatch) -> MotoServer:
    """This process's AWS variables name the moto server (as an operator's would)."""
    for name, value in moto.env().items():
        monkeypatch.setenv(name, value)
    return moto


def machine(url: str, root: Path) -> ObjectBlobStore:
    """The store as one machine sees it: its own cache and runs directories."""
    store = ObjectBlobStore(url, root / "blobs", runs_root=root / "runs")
    store.prepare()
    return store


# -- dataset blobs and the store's identity ------------------------------------------------------
def test_a_blob_stored_on_one_machine_is_read_on_another_from_the_store(aws, tmp_path):
    url = aws.bucket()
    here, there = machine(url, tmp_path / "a"), machine(url, tmp_path / "b")
    data = b'{"user_prompt": "2 * 3", "ground_truth": "6"}\n' * 100
    sha = hashlib.sha256(data).hexdigest()
    writer = here.writer("datasets", extension="jsonl")
    writer.write(data)
    writer.commit(size=len(data), sha256=sha)
    assert aws.objects(url, "datasets/") == {f"datasets/{sha}.jsonl": data}

    fetched = there.path("datasets", sha256=sha, extension="jsonl")
    assert fetched == tmp_path / "b" / "blobs" / "datasets" / f"{sha}.jsonl"
    assert fetched.read_bytes() == data

    # Bytes that are not what was declared reach neither the cache nor the store.
    bad = here.writer("datasets", extension="jsonl")
    bad.write(b"not the declared bytes\n")
    with pytest.raises(BlobMismatch):
        bad.commit(size=23, sha256="0" * 64)
    assert list(aws.objects(url, "datasets/")) == [f"datasets/{sha}.jsonl"]
    missing = there.path("datasets", sha256="1" * 64, extension="jsonl")
    assert not missing.exists()  # left missing: the caller reports it
    assert here.check().ok and here.describe() == {
        "mode": "object",
        "url": url,
        "cache": str(tmp_path / "a" / "blobs"),
    }


@pytest.mark.slow  # the client retries a refused connection with backoff
def test_an_unreachable_store_is_refused_naming_the_url_and_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("OBJECT_STORE_TIMEOUT", "2s")
    store = ObjectBlobStore("s3://nowhere/p", tmp_path / "blobs", runs_root=tmp_path / "runs")
    with pytest.raises(BlobStoreError) as refused:
        store.prepare()
    assert "s3://nowhere/p" in str(refused.value) and "AWS_ENDPOINT_URL" in str(refused.value)
    # A reader serves this machine's copy of a run while the store cannot be reached.
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "logs.txt").write_text("cached\n")
    store.refresh_run("r1", replace=True)
    assert (tmp_path / "runs" / "r1" / "logs.txt").read_text() == "cached\n"
    with pytest.raises(ValueError, match="OSMOSIS_BLOB_URL"):
        Settings.from_env({"OSMOSIS_HOME": str(tmp_path), "OSMOSIS_BLOB_URL": "s3://"})


@pytest.fixture
def sessions(tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'platform.db'}")
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


def test_every_process_must_use_the_object_store_the_database_was_used_with(
    aws, tmp_path, sessions
):
    url = aws.bucket()
    store_id = check_store_identity(machine(url, tmp_path / "api"), sessions)
    assert json.loads(aws.objects(url)[MARKER])["id"] == store_id
    # Another machine, its own cache, the same store: accepted.
    assert check_store_identity(machine(url, tmp_path / "worker"), sessions) == store_id

    elsewhere = url + "-other"  # a forgotten prefix: another, empty store
    with pytest.raises(BlobStoreError) as refused:
        check_store_identity(machine(elsewhere, tmp_path / "late"), sessions)
    message = str(refused.value)
    assert elsewhere in message and store_id in message and "OSMOSIS_BLOB_URL" in message
    assert MARKER not in aws.objects(elsewhere)  # nothing written to claim it


# -- run directories -------------------------------------------------------------------------------
def test_a_run_published_as_it_goes_is_resumed_on_another_machine_from_the_store(aws, tmp_path):
    url = aws.bucket()
    a, b = machine(url, tmp_path / "a"), machine(url, tmp_path / "b")
    run = a.run_dir("run1")
    (run / "trajectories").mkdir(parents=True)
    (run / "rollout_trials" / "r-9").mkdir(parents=True)
    (run / "rollout_trials" / "r-9" / "scratch.json").write_text("{}")
    (run / "trajectories" / "row_0_run_0.json").write_text('{"row": 0}')
    (run / "trajectories" / "row_1_run_0.json").write_text('{"row": 1}')
    big = os.urandom(1536 * 1024)  # an artifact too large for a batch: an object of its own
    (run / "artifacts" / "row_1_run_0").mkdir(parents=True)
    (run / "artifacts" / "row_1_run_0" / "big.bin").write_bytes(big)
    # A journal line being written when the pass reads it waits for the next pass.
    (run / "events.jsonl").write_bytes(b'{"row_index": 0}\n{"row_index": 1}\n{"row_ind')
    (run / "logs.txt").write_text("a: started\n")
    publisher = RunPublisher(a, "run1")
    # The journal, logs, the big artifact, one batch of the trajectories; never the scratch.
    assert publisher.publish() == 4
    assert publisher.publish() == 0  # nothing changed, nothing sent
    stored = aws.objects(url, "runs/run1/")
    assert stored["runs/run1/events.jsonl"] == b'{"row_index": 0}\n{"row_index": 1}\n'
    assert stored["runs/run1/artifacts/row_1_run_0/big.bin"] == big
    assert len([key for key in stored if key.startswith("runs/run1/batches/")]) == 1
    assert not any("rollout_trials" in key or "/trajectories/" in key for key in stored)

    # Machine b takes the run over: its scheduler logged a line before the store's copy came.
    (b.runs_root / "run1").mkdir(parents=True)
    (b.runs_root / "run1" / "logs.txt").write_text("b: resumed by a worker\n")
    held = b.sync_run("run1")
    copy = b.run_dir("run1")
    assert held["trajectories/row_0_run_0.json"] == len('{"row": 0}')
    assert (copy / "events.jsonl").read_bytes() == stored["runs/run1/events.jsonl"]
    assert (copy / "trajectories" / "row_1_run_0.json").read_text() == '{"row": 1}'
    assert (copy / "artifacts" / "row_1_run_0" / "big.bin").read_bytes() == big
    assert (copy / "logs.txt").read_text() == "a: started\nb: resumed by a worker\n"
    resumed = RunPublisher(b, "run1")
    resumed.adopt(held)
    with (copy / "events.jsonl").open("ab") as journal:
        journal.write(b'{"row_index": 2}\n')
    (copy / "trajectories" / "row_2_run_0.json").write_text('{"row": 2}')
    assert resumed.publish() == 3  # a batch of the new trajectory, the journal, b's log line

    # Machine a, with its stale copy, reads the store's newer one (as an API process does).
    a.refresh_run("run1", replace=True)
    assert (run / "events.jsonl").read_bytes() == (copy / "events.jsonl").read_bytes()
    assert (run / "logs.txt").read_text() == (copy / "logs.txt").read_text()
    assert (run / "trajectories" / "row_2_run_0.json").read_text() == '{"row": 2}'
    # Until the run is published again, a reader's look is one HEAD: nothing is listed.
    (run / "events.jsonl").unlink()
    a.refresh_run("run1", replace=True)
    assert not (run / "events.jsonl").exists()
    (copy / "logs.txt").write_text((copy / "logs.txt").read_text() + "b: run finished\n")
    assert resumed.publish() == 1
    a.refresh_run("run1", replace=True)
    assert (run / "events.jsonl").read_bytes() == (copy / "events.jsonl").read_bytes()
    assert (run / "logs.txt").read_text().endswith("b: run finished\n")


@pytest.mark.slow  # four CLI processes
def test_copy_store_moves_a_directory_store_into_an_object_store_once(aws, tmp_path):
    home = tmp_path / "home"
    source = BlobStore(home / "blobs", runs_root=home / "runs")
    source.prepare()
    store_id = source.write_marker()
    data = b'{"user_prompt": "1 * 1"}\n'
    writer = source.writer("datasets", extension="jsonl")
    writer.write(data)
    blob = writer.commit(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    run = source.run_dir("r1")
    (run / "trajectories").mkdir(parents=True)
    (run / "events.jsonl").write_text('{"row_index": 0}\n')
    (run / "trajectories" / "row_0_run_0.json").write_text("{}")
    url = aws.bucket()
    env = {**os.environ, **aws.env(), "OSMOSIS_HOME": str(home)}

    first = osmosis("server", "copy-store", "--to", url, env=env)
    assert first.returncode == 0, first.stderr
    assert "3/3 files checked" in first.stdout + first.stderr and "Copied 3 files" in first.stdout
    stored = aws.objects(url)
    assert stored == {
        f"datasets/{blob.name}": data,
        "runs/r1/events.jsonl": b'{"row_index": 0}\n',
        "runs/r1/trajectories/row_0_run_0.json": b"{}",
        "runs/r1/.published": stored["runs/r1/.published"],  # API caches of r1 look again
        MARKER: stored[MARKER],
    }
    assert json.loads(stored[MARKER])["id"] == store_id  # the database accepts it as its own

    again = osmosis_json("server", "copy-store", "--to", url, env=env)["resource"]
    assert (again["copied"], again["skipped"], again["store_id"]) == (0, 3, store_id)
    (run / "trajectories" / "row_0_run_0.json").write_text('{"changed": true}')
    third = osmosis_json("server", "copy-store", "--to", url, env=env)["resource"]
    assert (third["copied"], third["skipped"]) == (1, 2)

    # A prefix holding another store is never mixed with this one.
    other = BlobStore(tmp_path / "other" / "blobs", runs_root=tmp_path / "other" / "runs")
    other.prepare()
    other.write_marker()
    env_other = {**env, "OSMOSIS_HOME": str(tmp_path / "other")}
    refused = osmosis("--json", "server", "copy-store", "--to", url, env=env_other)
    assert refused.returncode != 0 and "another store" in refused.stderr


# -- the platform: an API and two workers on separate homes --------------------------------------
@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def team_database(postgres) -> Iterator[str]:
    url = postgres.create_database(migrated=False)
    yield url
    postgres.drop_database(url)


def run_files(root: Path) -> dict[str, bytes]:
    """A run directory's record: every file but logs, scratch and temporary files."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file()
        and path.name != "logs.txt"
        and "rollout_trials" not in path.parts
        and not path.name.startswith(".partial")
    }


def published_records(
    store: ObjectBlobStore, run_id: str, *, at_least: int, seconds: float
) -> bool:
    """Whether the store's copy of the run's journal holds `at_least` records within `seconds`
    (read as a new machine would: synced into `store`'s own directory)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.sync_run(run_id)
        journal = store.run_dir(run_id) / "events.jsonl"
        if journal.exists() and len(read_jsonl_bytes(journal.read_bytes())) >= at_least:
            return True
        time.sleep(0.2)
    return False


def attempts_of(journal: list[dict]) -> list[tuple[int, int, str, object]]:
    return sorted((e["row_index"], e["run_index"], e["status"], e["reward"]) for e in journal)


@pytest.mark.slow
@pytest.mark.timeout(600)  # three platform processes, a kill, a resume, and a baseline run
def test_a_worker_killed_mid_run_is_resumed_by_another_from_the_store_alone(
    aws, tmp_path, fake_model, team_database
):
    url = aws.bucket()
    process = team(
        tmp_path,
        fake_model,
        **aws.env(),
        OSMOSIS_BLOB_URL=url,
        OSMOSIS_DATABASE_URL=team_database,
        OSMOSIS_SECRET_KEY=Fernet.generate_key().decode(),
        OSMOSIS_SANDBOX="off",
        OSMOSIS_LEASE_S="6",
    )
    api, first, second = process("api", "api"), process("w1", "worker"), process("w2", "worker")
    rows = [row("pass", a, 7, sleep=0.5) for a in range(2, 2 + ROWS)]
    repo = make_repo(tmp_path / "ws", rows, limit=ROWS, batch_size=2, env={"MAX_CONCURRENT": "2"})
    assert osmosis("server", "migrate", env=api.env).returncode == 0
    everyone: list[Process] = [api, first]
    clients: list[PlatformClient] = []
    try:
        api.start()
        first.start()
        token = json.loads((api.home / "credentials.json").read_text())["token"]
        upload_dataset(api, repo, token=token)  # type: ignore[arg-type]
        client = Server(home=api.home, env=api.env, port=api.port).client(token)
        clients.append(client)
        created = submit(client, repo)
        assert recorded_at_least(client, created.id, 6).eval_run.status == "running"
        # ... and once the store holds some of it (published every OSMOSIS_BLOB_PUBLISH_S):
        # killed before the first publish, the first worker would leave nothing to resume.
        early = machine(url, tmp_path / "early")
        assert published_records(early, created.id, at_least=1, seconds=60), "never published"

        # The first worker dies with its run worker, mid-run; a second one, on a home that
        # never saw the run, joins.
        run_workers = pids_of(f"worker.run_worker {created.id}")
        assert run_workers
        dead = [first.pid, *run_workers]
        for pid in dead:
            os.kill(pid, signal.SIGKILL)
        assert all(gone_within(pid, seconds=10) for pid in dead)
        everyone.append(second)
        second.start()

        detail = finished(client, created.id, timeout=300)
        logs = "\n".join(all_logs(client, created.id))
        assert detail.eval_run.status == "finished", logs
        assert "resumed by a worker" in logs and "claimed by a worker" in logs  # both homes'

        # Every attempt once, in the store's journal and in the database. What the store
        # holds is read as a new machine would: synced into a directory of its own.
        reader = machine(url, tmp_path / "reader")
        reader.sync_run(created.id)
        stored = run_files(reader.run_dir(created.id))
        journal = read_jsonl_bytes(stored["events.jsonl"])
        keys = sorted((e["row_index"], e["run_index"]) for e in journal)
        assert keys == [(r, 0) for r in range(ROWS)]  # no duplicates, no losses
        attempts = client.runs.attempts(created.id, limit=200).attempts
        assert sorted((a.row_index, a.run_index) for a in attempts) == keys
        assert (detail.summary.passed, detail.summary.progress.completed) == (ROWS, ROWS)
        # No shared directory: the survivor's copy came from the store, the dead worker's
        # copy stopped where it died.
        survivor = read_jsonl(second.home / "runs" / created.id / "events.jsonl")
        assert attempts_of(survivor) == attempts_of(journal)
        died = read_jsonl(first.home / "runs" / created.id / "events.jsonl")
        # Resumed from what the store held (published up to OSMOSIS_BLOB_PUBLISH_S before).
        assert ROWS > len(died) >= detail.summary.resumed_count >= 1

        # `eval download` through the API: verified files, byte for byte the store's.
        env = {**api.env, "OSMOSIS_PLATFORM_URL": api.url, "OSMOSIS_TOKEN": token}
        out = tmp_path / "downloaded"
        done = osmosis_in(
            "--json", "eval", "download", created.name, "-o", str(out), cwd=repo.tree, env=env
        )
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)["resource"]
        got = run_files(out / created.name)
        assert result["files_downloaded"] == len(got) >= ROWS + 2
        for name, data in got.items():
            if name != "metrics.json":  # the platform's view of it names this download
                assert data == stored[name], name
    finally:
        for client in clients:
            client.close()
        for member in everyone:
            member.stop()

    # The same run on a directory store: the same files, the same attempts.
    baseline = Server.start(tmp_path / "directory", fake_model, OSMOSIS_SANDBOX="off")
    try:
        upload_dataset(baseline, repo)
        with baseline.client() as plain:
            again = submit(plain, repo)
            assert finished(plain, again.id).eval_run.status == "finished"
        directory = run_files(baseline.home / "runs" / again.id)
    finally:
        baseline.stop()
    from_store = stored  # the reader's copy of the store's run
    assert sorted(from_store) == sorted(directory)
    assert attempts_of(read_jsonl_bytes(from_store["events.jsonl"])) == attempts_of(
        read_jsonl_bytes(directory["events.jsonl"])
    )
    for name in (f"trajectories/row_{r}_run_0.json" for r in range(ROWS)):
        ours, theirs = _leaves(json.loads(from_store[name])), _leaves(json.loads(directory[name]))
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        # Ids and timings differ between any two runs; messages, labels, rewards may not.
        differ = [k for k in differ if not k.rsplit(".", 1)[-1].endswith(_VOLATILE)]
        assert differ == [], (name, [(k, ours.get(k), theirs.get(k)) for k in differ])


def read_jsonl_bytes(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _leaves(value: object, path: str = "") -> dict[str, object]:
    """A JSON document as {".a.b[0].c": leaf value}."""
    if isinstance(value, dict):
        return {
            k: v for key, item in value.items() for k, v in _leaves(item, f"{path}.{key}").items()
        }
    if isinstance(value, list):
        return {
            k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{path}[{i}]").items()
        }
    return {path: value}


@pytest.mark.slow
def test_a_run_uploaded_from_eval_run_is_in_the_store_for_every_machine(aws, tmp_path, fake_model):
    # An uploaded local run is a platform run too: the API that received it publishes it,
    # so another machine's reader finds it in the store, not only on that API's disk.
    url = aws.bucket()
    process = team(tmp_path, fake_model, **aws.env(), OSMOSIS_BLOB_URL=url,
                   OSMOSIS_SECRET_KEY=Fernet.generate_key().decode())  # fmt: skip
    api = process("api", "api")
    repo = make_repo(tmp_path / "ws", [row("pass", a, 7) for a in range(2, 6)], limit=4)
    assert osmosis("server", "migrate", env=api.env).returncode == 0
    try:
        api.start()
        token = json.loads((api.home / "credentials.json").read_text())["token"]
        env = {**api.env, "OSMOSIS_PLATFORM_URL": api.url, "OSMOSIS_TOKEN": token}
        ran = osmosis_in("eval", "run", str(repo.config), "--name", "local-1", "-y",
                         cwd=repo.tree, env=env)  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        sent = osmosis_in("--json", "eval", "upload", "local-1", cwd=repo.tree, env=env)
        assert sent.returncode == 0, sent.stderr
        run_id = json.loads(sent.stdout)["resource"]["eval_run_id"]
        # The API's /metrics times its object-store requests, the upload's puts among them.
        scraped = httpx.get(api.url + "/metrics", timeout=30).text
        assert 'osmosis_blob_store_duration_seconds_count{operation="upload"}' in scraped
    finally:
        api.stop()
    elsewhere = machine(url, tmp_path / "elsewhere")
    held = elsewhere.sync_run(run_id)
    assert "metrics.json" in held and "events.jsonl" in held
    local = tmp_path / "ws" / "tree" / ".osmosis" / "evals" / "local-1"
    copied, received = elsewhere.run_dir(run_id), api.home / "runs" / run_id
    for name in ("metrics.json", "events.jsonl", "manifest.json"):
        assert (copied / name).read_bytes() == (received / name).read_bytes(), name
    assert (copied / "events.jsonl").read_bytes() == (local / "events.jsonl").read_bytes()
    assert sorted(p.name for p in (copied / "trajectories").iterdir()) == sorted(
        p.name for p in (local / "trajectories").iterdir()
    )
