"""The dashboard's compare pairs rows by their place in each run's selection: it must say so
when a pair is two different dataset rows, as for two platform runs that each sampled 10 %
of a dataset at random (no `limit`). Through the app in process, on seeded runs."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osmosis.platform import Settings, create_app
from osmosis.platform.core.db.models import User
from tests.web import seed
from tests.web.seed import Attempt, RunSpec


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(home=tmp_path / "home")
    platform = create_app(settings)
    with platform.state.sessions() as db:
        admin = db.query(User).one()
        ws = seed.workspace(db, identity="acme/evals", owner=admin)
        for name, sources in (
            ("first", (13, 20, 21)),
            ("second", (5, 15, 21)),
            ("again", (13, 20, 21)),
        ):
            attempts = [Attempt(row, 0, source_row_index=s) for row, s in enumerate(sources)]
            seed.seed_run(db, settings.home, ws=ws, user=admin, spec=RunSpec(name, attempts))
        db.commit()
    token = json.loads(settings.credentials_file.read_text())["token"]
    # No `with`: the scheduler stays off; these runs are finished already.
    yield TestClient(platform, headers={"Authorization": f"Bearer {token}", "accept": "text/html"})
    platform.state.engine.dispose()


def test_rows_that_are_other_dataset_rows_are_named(client: TestClient) -> None:
    sampled = client.get("/compare", params=[("run", "first"), ("run", "second")])
    same = client.get("/compare", params=[("run", "first"), ("run", "again")])

    assert sampled.status_code == 200, sampled.text
    text = html.unescape(sampled.text)
    assert "rows are other dataset rows: 2 of 3 rows paired by index ran different" in text
    assert "row 0: 13 in first, 5 in second" in text
    assert same.status_code == 200 and "rows are other dataset rows" not in same.text
