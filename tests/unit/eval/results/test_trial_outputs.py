"""Copying a trial's artifacts out of a hostile rollout's reach: real files, links, FIFOs."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from dataclasses import replace
from pathlib import Path

from osmosis.eval.host.run_dir import RunDirectory, Slots
from osmosis.eval.results.redact import Redactor
from osmosis.eval.results.trial_outputs import ArtifactLimits, copy_artifacts, read_trial_json
from tests.unit.eval.host.test_run_dir import attempt

SECRET = "run-only-secret-4242"
KEY = b"the platform's secret key bytes\n"


def redact(text: str) -> str:
    return Redactor([SECRET]).redact(text)


def hostile_trial(root: Path) -> tuple[Path, Path]:
    """A trial directory as a hostile rollout leaves it, and a "key file" outside it."""
    key = root / "home" / "secret.key"
    key.parent.mkdir(parents=True)
    key.write_bytes(KEY)
    artifacts = root / "trial" / "artifacts"
    (artifacts / "out").mkdir(parents=True)
    (artifacts / "report.txt").write_text(f"token={SECRET}\nok\n")
    (artifacts / "out" / "image.bin").write_bytes(b"\x89PNG\x00\xff" * 10)
    (artifacts / "key.txt").symlink_to(key)
    (artifacts / "home").symlink_to(key.parent, target_is_directory=True)
    (artifacts / "out" / "deeper.txt").symlink_to("../../../home/secret.key")
    os.mkfifo(artifacts / "pipe")
    return artifacts, key


def every_byte(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_links_fifos_and_sockets_are_reported_never_their_targets(tmp_path: Path) -> None:
    artifacts, _ = hostile_trial(tmp_path)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(artifacts / "sock"))
    dest = tmp_path / "run" / "artifacts" / "row_0_run_0"

    done: list[object] = []
    worker = threading.Thread(
        target=lambda: done.append(copy_artifacts(artifacts, dest, redact=redact)), daemon=True
    )
    worker.start()
    worker.join(timeout=10)
    server.close()
    assert done, "the copy blocked (on the FIFO?)"
    copied = done[0]

    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == [
        "out",
        "out/image.bin",
        "report.txt",
    ]
    assert KEY not in every_byte(dest)
    reasons = {item.path: item.reason for item in copied.skipped}  # type: ignore[attr-defined]
    assert reasons == {
        "home": "a symbolic link: links are not followed",
        "key.txt": "a symbolic link: links are not followed",
        "out/deeper.txt": "a symbolic link: links are not followed",
        "pipe": "a FIFO: only regular files are copied",
        "sock": "a socket: only regular files are copied",
    }
    assert not any(p.is_symlink() for p in dest.rglob("*"))


def test_text_is_redacted_and_a_binary_file_holding_a_secret_is_withheld(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "log.txt").write_text(f"calling with {SECRET} now\n")
    (artifacts / "clean.bin").write_bytes(bytes(range(256)))
    (artifacts / "leak.bin").write_bytes(b"\xff\xfe" + SECRET.encode() + b"\x00\x01")
    dest = tmp_path / "dest"

    copied = copy_artifacts(artifacts, dest, redact=redact)

    assert (dest / "log.txt").read_text() == "calling with [REDACTED] now\n"
    assert (dest / "clean.bin").read_bytes() == bytes(range(256))  # byte-exact
    assert not (dest / "leak.bin").exists()
    assert copied.redacted == ["log.txt"]
    assert [(s.path, s.reason) for s in copied.skipped] == [
        ("leak.bin", "a binary file holding a secret value: withheld")
    ]
    assert SECRET.encode() not in every_byte(dest)


def test_file_count_file_size_and_total_bytes_are_capped(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    for index in range(6):
        (artifacts / f"f{index}.txt").write_bytes(b"x" * 100)
    (artifacts / "huge.txt").write_bytes(b"y" * 1000)
    limits = ArtifactLimits(max_files=4, max_file_bytes=500, max_total_bytes=250)

    copied = copy_artifacts(
        artifacts, tmp_path / "dest", redact=redact, limits=limits, keep_source=True
    )

    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["f0.txt", "f1.txt"]
    assert (copied.files, copied.bytes) == (2, 200)
    assert [(s.path, s.reason) for s in copied.skipped] == [
        ("f2.txt", "over the 250-byte limit for one attempt's artifacts"),
        ("f3.txt", "over the 250-byte limit for one attempt's artifacts"),
        ("f4.txt", "over the 250-byte limit for one attempt's artifacts"),
        ("f5.txt", "over the 250-byte limit for one attempt's artifacts"),
        ("huge.txt", "1,000 bytes, over the 500-byte file limit"),
    ]
    many = copy_artifacts(
        artifacts, tmp_path / "d2", redact=redact, limits=replace(limits, max_total_bytes=10**6)
    )
    assert many.files == 4 and "over the limit of 4 files" in many.skipped[0].reason


def test_a_linked_artifacts_directory_copies_nothing(tmp_path: Path) -> None:
    _, key = hostile_trial(tmp_path)
    trial = tmp_path / "trial2"
    trial.mkdir()
    (trial / "artifacts").symlink_to(key.parent, target_is_directory=True)
    copied = copy_artifacts(trial / "artifacts", tmp_path / "dest", redact=redact)
    assert copied.files == 0 and not (tmp_path / "dest").exists()
    assert [(s.path, s.reason) for s in copied.skipped] == [
        (".", "a symbolic link: links are not followed")
    ]


def test_recording_an_attempt_copies_safely_and_logs_what_it_left(tmp_path: Path) -> None:
    artifacts, _ = hostile_trial(tmp_path)
    run_path = tmp_path / "evals" / "r1"
    finished = replace(attempt(0, 1), trial_dir=artifacts.parent)
    with RunDirectory.open(
        run_path,
        slots=Slots(rows=1, n=2),
        inputs={},
        provenance={},
        redactor=Redactor([SECRET]),
    ) as run:
        run.record(finished)
    stored = run_path / "artifacts" / "row_0_run_1"
    assert (stored / "report.txt").read_text() == "token=[REDACTED]\nok\n"
    assert KEY not in every_byte(stored)
    log = (run_path / "logs.txt").read_text()
    assert "artifacts of row_0_run_1: 4 not copied (home: a symbolic link" in log


def test_a_trajectory_that_is_a_link_is_not_read(tmp_path: Path) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"token": "admin-token"}))
    (trial / "trajectory.json").symlink_to(credentials)
    assert read_trial_json(trial, "trajectory.json") is None
    (trial / "trajectory.json").unlink()
    (trial / "trajectory.json").write_text(json.dumps({"steps": []}))
    assert read_trial_json(trial, "trajectory.json") == {"steps": []}
    assert read_trial_json(trial, "trajectory.json", max_bytes=5) is None


def test_a_setuid_file_is_copied_plain_and_loses_its_bits_in_the_raw_trial(tmp_path):
    artifacts = tmp_path / "trial" / "artifacts"
    (artifacts / "bin").mkdir(parents=True)
    tool = artifacts / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho pwned\n")
    os.chmod(tool, 0o4755)
    (artifacts / "notes.txt").write_text("plain\n")
    os.chmod(artifacts / "bin", 0o3755)  # setgid and sticky on a directory
    too_big = artifacts / "big.bin"
    too_big.write_bytes(b"x" * 100)
    os.chmod(too_big, 0o6711)  # skipped by the limit, yet it stays on the host: defused too
    dest = tmp_path / "run" / "artifacts" / "row_0_run_0"

    copied = copy_artifacts(
        artifacts, dest, redact=redact, limits=ArtifactLimits(max_file_bytes=50), keep_source=True
    )

    assert copied.files == 2
    for name in ("bin/tool", "notes.txt"):
        info = (dest / name).lstat()
        assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600, name
    assert (dest / "bin" / "tool").read_bytes() == b"#!/bin/sh\necho pwned\n"
    assert (dest / "notes.txt").read_text() == "plain\n"
    risky = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o111
    for raw in (tool, too_big):  # the raw trial directory keeps the files, not their bits
        assert stat.S_IMODE(raw.stat().st_mode) & risky == 0, raw
    assert stat.S_IMODE(tool.stat().st_mode) == 0o644
    assert stat.S_IMODE((artifacts / "bin").stat().st_mode) == 0o755


def test_the_raw_trial_is_dropped_once_copied_and_only_named_entries_are_taken(tmp_path):
    """The raw `artifacts/` is not kept beside its copy (issue 25.4: twice the space)."""
    trial = tmp_path / "trial"
    (trial / "artifacts").mkdir(parents=True)
    (trial / "artifacts" / "out.txt").write_text("kept\n")
    (trial / "trajectory.json").write_text("{}")
    (trial / "junk.bin").write_bytes(b"x" * 1000)
    dest = tmp_path / "taken"

    copied = copy_artifacts(trial, dest, redact=redact, names=("artifacts", "trajectory.json"))

    assert copied.files == 2 and not trial.exists()
    assert (dest / "artifacts" / "out.txt").read_text() == "kept\n"
    assert sorted(p.name for p in dest.iterdir()) == ["artifacts", "trajectory.json"]
