"""What the Ray site ships: the checkout out to the nodes, each attempt's trial back, with
real files, links, FIFOs and limits (no cluster needed)."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from osmosis.eval.sites.ray.ship import (
    TrialFiles,
    TrialLimits,
    WorkingDirTooLarge,
    collect_trial,
    pack_working_dir,
    write_trial,
)


def workspace(root: Path) -> Path:
    (root / "rollouts" / "scripted").mkdir(parents=True)
    (root / "rollouts" / "scripted" / "main.py").write_text("print('hi')\n")
    (root / "rollouts" / "scripted" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "rollouts" / "scripted" / "run.sh", 0o755)
    (root / ".gitignore").write_text("rollouts/scripted/model.bin\n")
    (root / "rollouts" / "scripted" / "model.bin").write_bytes(b"\0" * 10)  # ignored by git
    for private in (".git/objects", ".osmosis/evals/old", ".venv/lib", "rollouts/scripted/venv2"):
        (root / private).mkdir(parents=True)
        (root / private / "x").write_text("not shipped")
    (root / "rollouts" / "scripted" / "venv2" / "pyvenv.cfg").write_text("home = /usr\n")
    (root / "rollouts" / "scripted" / "__pycache__").mkdir()
    (root / "rollouts" / "scripted" / "__pycache__" / "main.pyc").write_bytes(b"pyc")
    return root


def test_the_checkout_ships_its_files_but_no_link_git_venv_or_run_outputs(tmp_path):
    secret = tmp_path / "outside" / "credentials.json"
    secret.parent.mkdir()
    secret.write_text('{"token": "the-platform-key"}')
    root = workspace(tmp_path / "ws")
    (root / "rollouts" / "scripted" / "creds.json").symlink_to(secret)
    (root / "rollouts" / "etc").symlink_to(secret.parent, target_is_directory=True)
    os.mkfifo(root / "rollouts" / "scripted" / "pipe")

    packed = pack_working_dir(root, tmp_path / "out" / "working_dir.zip")

    with zipfile.ZipFile(packed.path) as shipped:
        names = sorted(shipped.namelist())
        assert names == [
            ".gitignore",
            "rollouts/scripted/main.py",
            "rollouts/scripted/model.bin",  # .gitignore does not decide what a rollout reads
            "rollouts/scripted/run.sh",
        ]
        assert b"the-platform-key" not in b"".join(shipped.read(n) for n in names)
        modes = {i.filename: i.external_attr >> 16 for i in shipped.infolist()}
        assert modes["rollouts/scripted/run.sh"] == 0o755
        assert modes["rollouts/scripted/main.py"] == 0o644
    left = {item.path: item.reason for item in packed.skipped}
    assert left["rollouts/scripted/creds.json"].startswith("a symbolic link")
    assert left["rollouts/etc"].startswith("a symbolic link")
    assert left["rollouts/scripted/pipe"] == "not a regular file"
    assert left["rollouts/scripted/venv2"] == "a virtual environment"
    assert (packed.files, packed.bytes) == (4, len("print('hi')\n") + 10 + 10 + 28)
    assert "4 files" in packed.summary() and "4 left out" in packed.summary()


def test_an_unchanged_checkout_zips_to_the_same_bytes(tmp_path):
    root = workspace(tmp_path / "ws")
    first = pack_working_dir(root, tmp_path / "a.zip").path.read_bytes()
    os.utime(root / "rollouts" / "scripted" / "main.py", (1, 1))  # only the time changed
    assert pack_working_dir(root, tmp_path / "b.zip").path.read_bytes() == first  # Ray reuses it


def test_a_checkout_too_big_to_ship_names_its_largest_files(tmp_path):
    root = workspace(tmp_path / "ws")
    (root / "data").mkdir()
    (root / "data" / "big.parquet").write_bytes(b"x" * 5000)
    with pytest.raises(WorkingDirTooLarge) as raised:
        pack_working_dir(root, tmp_path / "w.zip", max_bytes=4096)
    message = str(raised.value)
    assert "over the 4,096-byte limit" in message
    assert message.split("the largest: ")[1].startswith("data/big.parquet (5,000 bytes)")
    assert raised.value.hint and not (tmp_path / "w.zip").exists()


def test_a_trial_comes_back_with_regular_files_only_within_its_limits(tmp_path):
    trial = tmp_path / "node" / "abc"
    (trial / "artifacts" / "deep").mkdir(parents=True)
    (trial / "trajectory.json").write_text('{"steps": []}')
    (trial / "artifacts" / "a.txt").write_text("a")
    (trial / "artifacts" / "deep" / "b.txt").write_text("bb")
    (trial / "artifacts" / "huge.bin").write_bytes(b"h" * 100)
    (trial / "artifacts" / "key").symlink_to("/etc/hostname")
    os.mkfifo(trial / "artifacts" / "fifo")  # read naively, it would hang the node's actor

    files = collect_trial(trial, TrialLimits(max_files=10, max_file_bytes=50, max_total_bytes=80))

    assert dict(files.files) == {
        "artifacts/a.txt": b"a",
        "artifacts/deep/b.txt": b"bb",
        "trajectory.json": b'{"steps": []}',
    }
    reasons = {item.path: item.reason for item in files.skipped}
    assert reasons["artifacts/huge.bin"] == "100 bytes, over the 50-byte file limit"
    assert reasons["artifacts/key"].startswith("a symbolic link")
    assert reasons["artifacts/fifo"] == "not a regular file"
    assert collect_trial(tmp_path / "missing", TrialLimits()).files == []


def test_a_shipped_trial_cannot_write_outside_its_directory(tmp_path):
    dest = tmp_path / "trials" / "abc"
    hostile = TrialFiles(
        files=[
            ("trajectory.json", b"{}"),
            ("artifacts/ok.txt", b"ok"),
            ("../escape.txt", b"x"),
            ("/etc/owned", b"x"),
            ("artifacts/../../up.txt", b"x"),
            ("artifacts//empty-part", b"x"),
            ("artifacts/ok.txt", b"twice"),  # a repeated name keeps the first
            ("artifacts/big.bin", b"b" * 200),
        ]
    )
    write_trial(hostile, dest, TrialLimits(max_files=10, max_file_bytes=100, max_total_bytes=1000))
    written = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert written == ["artifacts/ok.txt", "trajectory.json"]
    assert (dest / "artifacts" / "ok.txt").read_bytes() == b"ok"
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "up.txt").exists()
