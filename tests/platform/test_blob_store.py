"""The blob store a team shares (issue 14.3): where runs live, a shared directory that is
never created by accident, a store that must be the database's own, and a health probe."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from osmosis.platform.core.blobs import (
    MARKER,
    STALE_PARTIAL_SEC,
    BlobStore,
    BlobStoreError,
    SharedBlobStore,
    check_identity,
    open_store,
)
from osmosis.platform.core.db import make_engine, make_session_factory, upgrade
from osmosis.platform.core.settings import Settings


def test_runs_live_in_the_home_by_default_and_in_the_blob_dir_when_it_is_set(tmp_path):
    default = open_store(Settings(home=tmp_path / "home"))
    assert type(default) is BlobStore
    assert default.root == tmp_path / "home" / "blobs"
    assert default.run_dir("ab12") == tmp_path / "home" / "runs" / "ab12"

    env = {"OSMOSIS_HOME": str(tmp_path / "home"), "OSMOSIS_BLOB_DIR": str(tmp_path / "shared")}
    shared = open_store(Settings.from_env({**env, "OSMOSIS_BLOB_SHARED": "1"}))
    assert type(shared) is SharedBlobStore
    assert (shared.root, shared.runs_root) == (tmp_path / "shared", tmp_path / "shared" / "runs")
    with pytest.raises(ValueError, match="not a run id"):
        shared.run_dir("../etc")


def test_shared_mode_needs_its_directory_and_never_creates_it(tmp_path):
    missing = tmp_path / "mnt" / "osmosis"
    with pytest.raises(BlobStoreError) as refused:
        SharedBlobStore(missing).prepare()
    assert str(missing) in str(refused.value) and "mount it" in str(refused.value)
    assert not (tmp_path / "mnt").exists()
    with pytest.raises(ValueError, match="OSMOSIS_BLOB_DIR"):
        Settings.from_env({"OSMOSIS_HOME": str(tmp_path), "OSMOSIS_BLOB_SHARED": "1"})

    missing.mkdir(parents=True)
    SharedBlobStore(missing).prepare()
    assert (missing / "runs").is_dir()


def test_a_shared_sweep_spares_uploads_another_machine_may_still_write(tmp_path):
    store = SharedBlobStore(tmp_path)
    fresh = store.writer("datasets", extension="jsonl")
    fresh.write(b"still arriving")
    old = store.writer("datasets", extension="jsonl")
    old.write(b"abandoned")
    long_ago = time.time() - STALE_PARTIAL_SEC - 60
    os.utime(old.temp_path, (long_ago, long_ago))
    assert store.remove_partials("datasets") == 1
    assert fresh.temp_path.exists() and not old.temp_path.exists()
    old.discard()
    # On this machine alone every partial at start-up is abandoned.
    assert BlobStore(tmp_path).remove_partials("datasets") == 1
    fresh.discard()


@pytest.fixture
def sessions(tmp_path: Path, databases):
    engine = make_engine(databases.url(tmp_path / "home"))
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


def test_every_process_must_use_the_blob_store_the_database_was_used_with(tmp_path, sessions):
    first = BlobStore(tmp_path / "store")
    first.prepare()
    store_id = check_identity(first, sessions)
    assert (tmp_path / "store" / MARKER).is_file()
    assert check_identity(BlobStore(tmp_path / "store"), sessions) == store_id  # same again

    other = BlobStore(tmp_path / "elsewhere")  # a process that forgot OSMOSIS_BLOB_DIR
    other.prepare()
    with pytest.raises(BlobStoreError) as refused:
        check_identity(other, sessions)
    message = str(refused.value)
    assert str(tmp_path / "elsewhere") in message and store_id in message
    assert f"no {MARKER}" in message and "OSMOSIS_BLOB_DIR" in message
    assert not (tmp_path / "elsewhere" / MARKER).exists()  # nothing written to claim it

    # A copy of the store (its marker with it) is the same store.
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / MARKER).write_bytes((tmp_path / "store" / MARKER).read_bytes())
    assert check_identity(BlobStore(tmp_path / "moved"), sessions) == store_id


def test_the_probe_says_when_the_store_cannot_be_written(tmp_path):
    store = BlobStore(tmp_path / "store")
    store.prepare()
    good = store.check()
    assert good.ok and good.error is None and good.latency_ms >= 0
    assert [p.name for p in (tmp_path / "store").iterdir()] == ["runs"]  # no probe left
    shutil.rmtree(tmp_path / "store")  # an unmounted share, say
    bad = store.check()
    assert not bad.ok and str(tmp_path / "store") in (bad.error or "")
