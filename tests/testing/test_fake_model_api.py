"""The public names of `osmosis.testing`, pinned so a change to them is deliberate."""

from __future__ import annotations

import osmosis.testing


def test_public_names() -> None:
    assert osmosis.testing.__all__ == [
        "ChatRequest",
        "Fail",
        "FakeModelServer",
        "JudgeScript",
        "Reply",
        "Rule",
        "Stats",
        "ToolCall",
        "candidate_text",
    ]
    assert osmosis.testing.__all__ == sorted(osmosis.testing.__all__)
    for name in osmosis.testing.__all__:
        assert getattr(osmosis.testing, name).__doc__
