"""Issue 30: the measure a sandboxed server's disk gets at each attempt's end (on the event
loop) also says whether the attempt left a directory in the outbox, and skips the ended
attempts' directory of a server that never had one; what it counts stays the same.

Real directories and files; `/tmp`'s own file system stands in for the sandbox's tmpfs.
"""

from __future__ import annotations

import os
from pathlib import Path

from osmosis.eval.sites.sandbox import disk

KiB = 1024


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def _tmpfs() -> list[int]:
    return [os.open("/tmp", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]


def test_find_says_whether_the_outbox_holds_the_entry_and_changes_nothing_counted(tmp_path):
    outbox, ended = tmp_path / "outbox", tmp_path / "ended"
    _file(outbox / "mine" / "artifacts" / "a.bin", 64 * KiB)  # the attempt that ended
    _file(outbox / "other" / "b.bin", 64 * KiB)  # another server's attempt in flight
    _file(outbox / "stray.bin", 32 * KiB)  # nobody's
    claimed = {"mine", "other"}
    tmpfs = _tmpfs()
    try:
        plain = disk.measure(outbox, ended, running=(), claimed=claimed, tmpfs=[], cap=100)
        looked = disk.measure(
            outbox, ended, running=(), claimed=claimed, tmpfs=[], cap=100, find="mine"
        )
        absent = disk.measure(
            outbox, ended, running=(), claimed=claimed, tmpfs=tmpfs, cap=100, find="gone"
        )
    finally:
        for handle in tmpfs:
            os.close(handle)
    assert (plain.found, looked.found, absent.found) == (False, True, False)
    # Claimed entries are another server's or not walked: only the stray file counts.
    assert looked.stray == plain.stray == disk.Tree(32 * KiB, 2)
    assert looked.total == plain.total == 32 * KiB
    assert looked.walked == plain.walked == 4  # three entries, and the stray file walked
    assert absent.tmpfs > 0 and absent.total == 32 * KiB + absent.tmpfs


def test_a_running_attempt_is_walked_and_a_found_stray_entry_is_still_stray(tmp_path):
    outbox, ended = tmp_path / "outbox", tmp_path / "ended"
    _file(outbox / "mine" / "a.bin", 64 * KiB)
    _file(outbox / "odd" / "b.bin", 16 * KiB)
    use = disk.measure(
        outbox, ended, running={"mine"}, claimed={"mine"}, tmpfs=[], cap=100, find="odd"
    )
    assert use.found
    assert use.attempts == {"mine": disk.Tree(64 * KiB, 1)}
    assert use.stray == disk.Tree(16 * KiB, 2)
    assert use.total == 80 * KiB


def test_ended_attempts_count_unless_the_server_never_had_one(tmp_path):
    outbox, ended = tmp_path / "outbox", tmp_path / "ended"
    outbox.mkdir()
    _file(ended / "r1" / "log.bin", 48 * KiB)  # held by a leftover process, say
    counted = disk.measure(outbox, ended, running=(), claimed=(), tmpfs=[], cap=100)
    assert counted.ended == disk.tree(ended, cap=100).bytes >= 48 * KiB
    assert counted.walked == 2
    none = disk.measure(outbox, None, running=(), claimed=(), tmpfs=[], cap=100)
    assert (none.ended, none.walked, none.total) == (0, 0, 0)


def test_a_missing_outbox_measures_nothing_and_finds_nothing(tmp_path):
    use = disk.measure(
        tmp_path / "gone", tmp_path / "ended", running=(), claimed=(), tmpfs=[], cap=10, find="x"
    )
    assert (use.total, use.walked, use.found) == (0, 0, False)


def test_a_held_directory_lists_what_the_outbox_holds_each_time(tmp_path):
    """Listed through its descriptor (`disk.HeldDirectory`: libc with the GIL held), the outbox
    says what `os.listdir` says, after every change, past one read's worth of names too."""
    outbox = tmp_path / "outbox"
    outbox.mkdir()
    listing = disk.HeldDirectory(outbox)
    try:
        assert listing.names() == []
        _file(outbox / "r1" / "a.bin", 1)
        (outbox / "stray.bin").write_bytes(b"x")
        assert sorted(listing.names()) == ["r1", "stray.bin"]
        many = [f"{index:05d}-{'n' * 200}" for index in range(400)]  # ~90 KiB of entries
        for name in many:
            (outbox / name).touch()
        assert sorted(listing.names()) == sorted(os.listdir(outbox))
        for name in many:
            (outbox / name).unlink()
        (outbox / "stray.bin").unlink()
        assert listing.names() == ["r1"]
    finally:
        listing.close()


def test_a_measure_through_a_held_directory_counts_what_one_by_path_counts(tmp_path):
    outbox, ended = tmp_path / "outbox", tmp_path / "ended"
    _file(outbox / "mine" / "a.bin", 64 * KiB)
    _file(outbox / "odd" / "b.bin", 16 * KiB)
    _file(outbox / "stray.bin", 8 * KiB)
    listing = disk.HeldDirectory(outbox)
    tmpfs = _tmpfs()
    try:
        held, plain = (
            disk.measure(
                outbox,
                ended,
                running={"mine"},
                claimed={"mine"},
                tmpfs=tmpfs,
                cap=100,
                find="mine",
                listing=through,
            )
            for through in (listing, None)
        )
    finally:
        listing.close()
        for handle in tmpfs:
            os.close(handle)
    assert held.found and plain.found
    assert (held.attempts, held.stray, held.walked) == (plain.attempts, plain.stray, plain.walked)
    assert held.stray == disk.Tree(24 * KiB, 4)


def test_tmpfs_bytes_are_the_used_blocks_of_each_file_system(tmp_path):
    handles = [*_tmpfs(), os.open(tmp_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        expected = 0
        for handle in handles:
            info = os.fstatvfs(handle)
            expected += (info.f_blocks - info.f_bfree) * info.f_frsize
        # Used blocks move as other processes write: the same within a few MiB.
        assert abs(disk.tmpfs_bytes(handles) - expected) < 64 * 1024 * KiB
        assert disk.tmpfs_bytes([]) == 0
    finally:
        for handle in handles:
            os.close(handle)
