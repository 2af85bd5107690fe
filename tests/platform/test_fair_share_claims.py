"""The users' shares of the run slots as claims see them (issue 25.7), on one database with
several users' runs: a user past their share waits while another user under it waits, alone a
user takes every slot, and `why_pending` says which holds a run back. SQLite and PostgreSQL."""

from __future__ import annotations

from sqlalchemy import update

from osmosis.platform.core.db.models import User
from osmosis.platform.core.db.run_models import EvalRun
from osmosis.platform.worker.leases import why_pending
from tests.platform.test_roles_leases import World
from tests.platform.test_roles_leases import world as world  # the fixture


def users(at: World, *names: str) -> list[str]:
    with at.sessions() as db:
        made = [User(name=name) for name in names]
        db.add_all(made)
        db.commit()
        return [user.id for user in made]


def runs_of(at: World, user: str, count: int) -> list[str]:
    ids = at.runs(count)
    with at.sessions() as db:
        db.execute(update(EvalRun).where(EvalRun.id.in_(ids)).values(created_by=user))
        db.commit()
    return ids


def claimed(at: World, worker: str, room: int, **settings: int) -> list[str]:
    return [claim.run_id for claim in at.claim(worker, room, **settings)]


def reason(at: World, run_id: str, **settings: int) -> str | None:
    with at.sessions() as db:
        run = db.get(EvalRun, run_id)
        assert run is not None
        return why_pending(db, run=run, settings=at.settings.replace(**settings))


def test_a_user_past_their_share_waits_for_another_users_run(world):
    ada, bea = users(world, "ada", "bea")
    worker = world.worker()
    limits = {"max_concurrent_runs": 3, "runs_per_user": 1}
    mine = runs_of(world, ada, 4)
    # Alone, Ada takes every slot.
    assert claimed(world, worker, 10, **limits) == mine[:3]
    theirs = runs_of(world, bea, 2)
    assert reason(world, theirs[0], **limits) == (
        "3 of 3 run slots held by other users' runs (OSMOSIS_MAX_CONCURRENT_RUNS); "
        "it starts when one is free"
    )
    assert (reason(world, mine[3], **limits) or "").startswith(
        "3 of 3 run slots held by your other runs"
    )

    # Two of Ada's runs end: Bea's oldest run, under her share, goes before Ada's older one;
    # then both are at their share, and age decides.
    with world.sessions() as db:
        db.execute(update(EvalRun).where(EvalRun.id.in_(mine[:2])).values(status="finished"))
        db.commit()
    assert claimed(world, worker, 10, **limits) == [theirs[0], mine[3]]
    assert world.run(theirs[1]).status == "pending"


def test_a_user_at_their_share_is_told_so_while_a_slot_is_free(world):
    ada, bea = users(world, "ada", "bea")
    worker = world.worker()
    limits = {"max_concurrent_runs": 4, "runs_per_user": 1}
    first = runs_of(world, ada, 2)
    assert claimed(world, worker, 1, **limits) == first[:1]
    theirs = runs_of(world, bea, 1)
    # Two free slots, Ada at her share, Bea waiting under hers: Ada's run waits for Bea's.
    assert reason(world, first[1], **limits) == (
        "your other runs hold 1 run slot, your share while other users' runs wait "
        "(OSMOSIS_RUNS_PER_USER=1)"
    )
    assert reason(world, theirs[0], **limits) == (
        "a run slot is free: a worker starts it at its next round"
    )
    assert claimed(world, worker, 1, **limits) == theirs
    assert claimed(world, worker, 1, **limits) == first[1:]
