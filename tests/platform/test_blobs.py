"""The blob store: verified content lands atomically, once per hash; nothing else remains."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from osmosis.platform.core.blobs import BlobMismatch, BlobStore

DATA = b'{"user_prompt": "1 x 2?", "ground_truth": "2"}\n' * 3
DIGEST = hashlib.sha256(DATA).hexdigest()


def put(store: BlobStore, data: bytes, *, size: int | None = None, digest: str = DIGEST) -> Path:
    writer = store.writer("datasets", extension="jsonl")
    for start in range(0, len(data), 7):  # many small writes, as a network stream gives them
        writer.write(data[start : start + 7])
    return writer.commit(size=len(data) if size is None else size, sha256=digest)


def test_verified_content_is_stored_once_under_its_hash_with_its_extension(tmp_path):
    store = BlobStore(tmp_path)
    first = put(store, DATA)
    second = put(store, DATA)
    assert first == second == tmp_path / "datasets" / f"{DIGEST}.jsonl"
    assert first.read_bytes() == DATA
    assert [p.name for p in (tmp_path / "datasets").iterdir()] == [first.name]


@pytest.mark.parametrize(
    ("size", "digest", "message"),
    [
        (len(DATA) + 1, DIGEST, f"received {len(DATA):,} bytes, expected {len(DATA) + 1:,}"),
        (len(DATA), "0" * 64, f"the content's SHA-256 is {DIGEST}"),
    ],
)
def test_a_mismatch_stores_nothing(tmp_path, size, digest, message):
    store = BlobStore(tmp_path)
    with pytest.raises(BlobMismatch, match=message):
        put(store, DATA, size=size, digest=digest)
    assert list((tmp_path / "datasets").iterdir()) == []


def test_partials_of_abandoned_writes_are_swept(tmp_path):
    store = BlobStore(tmp_path)
    abandoned = store.writer("datasets", extension="csv")
    abandoned.write(b"user_prompt,ground_truth\n")
    kept = put(store, DATA)
    assert store.remove_partials("datasets") == 1
    assert [p.name for p in (tmp_path / "datasets").iterdir()] == [kept.name]
    abandoned.discard()  # closing after the sweep is harmless


@pytest.mark.parametrize(
    ("namespace", "sha256", "extension"),
    [("datasets", "../../etc", "jsonl"), ("..", DIGEST, "jsonl"), ("datasets", DIGEST, "j/x")],
)
def test_a_key_that_is_not_a_hash_cannot_build_a_path(tmp_path, namespace, sha256, extension):
    with pytest.raises(ValueError, match="not a blob key"):
        BlobStore(tmp_path).path(namespace, sha256=sha256, extension=extension)


def test_blobs_are_owner_only_whatever_the_umask(tmp_path):
    previous = os.umask(0o022)  # files 0644 and directories 0755 by default
    try:
        stored = put(BlobStore(tmp_path), DATA)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
