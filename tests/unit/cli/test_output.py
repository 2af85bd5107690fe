"""What `Output` shows a terminal user, read back from a recording console."""

from __future__ import annotations

import pytest
from rich.console import Console

from osmosis.cli.output import CLIError, Mode, Output, byte_size, short_time


def shown(error: CLIError, mode: Mode) -> str:
    console = Console(record=True, width=80)
    out = Output(mode=mode)
    out.err_console = console
    out.error(error)
    return console.export_text()


@pytest.mark.parametrize("mode", [Mode.RICH, Mode.PLAIN])
def test_a_refused_confirmation_says_what_it_would_have_asked(mode):
    error = CLIError(
        "Use --yes to confirm in non-interactive mode.",
        code="INTERACTIVE_REQUIRED",
        details={"prompt": "Delete personal secret K from o/r?"},
    )
    text = shown(error, mode)
    assert "Use --yes" in text and "Delete personal secret K from o/r?" in text


def test_problems_the_message_only_counts_are_each_shown():
    error = CLIError(
        "--env-file: cannot read secrets file .env",
        details={"problems": [".env:2: expected NAME=value, got 'x'", ".env:5: bad quote"]},
    )
    text = shown(error, Mode.RICH)
    assert ".env:2: expected NAME=value" in text and ".env:5: bad quote" in text


def test_problems_already_in_the_message_are_not_repeated():
    error = CLIError("bad rows:\n  a.jsonl:2: oops", details={"problems": ["a.jsonl:2: oops"]})
    assert shown(error, Mode.RICH).count("a.jsonl:2: oops") == 1


@pytest.mark.parametrize(
    "value, text",
    [
        (0, "0 B"),
        (999, "999 B"),
        (1000, "1000 B"),
        (1024, "1.0 KiB"),
        (312_300_000, "297.8 MiB"),
        (None, "-"),
    ],
)
def test_byte_sizes_read_as_people_write_them(value, text):
    assert byte_size(value) == text


def test_a_table_keeps_raw_values_for_json_and_plain_but_shapes_rich_cells():
    items = [{"name": "qa", "size_bytes": 1_500_000, "updated_at": "2026-12-01T05:21:33+00:00"}]
    columns = ["name", "size_bytes", "updated_at"]
    rich = Console(record=True, width=80)
    Output(mode=Mode.RICH, _console=rich).listing(
        items,
        columns=columns,
        headers={"size_bytes": "Size"},
        cells={"size_bytes": byte_size, "updated_at": short_time},
    )
    text = rich.export_text()
    assert "1.4 MiB" in text and "Size" in text and "T05:21" not in text
    assert short_time("2026-12-01T05:21:33+00:00") in text
