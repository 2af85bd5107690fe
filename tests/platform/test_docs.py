"""The platform's documentation names every setting the server reads."""

from __future__ import annotations

from pathlib import Path

from osmosis.platform.core.settings import SETTINGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "platform.md"


def test_every_setting_is_documented_with_its_variable():
    table = {
        line.split("|")[1].strip().strip("`")
        for line in DOC.read_text().splitlines()
        if line.startswith("| `OSMOSIS_")
    }
    assert table == {setting.env for setting in SETTINGS}
