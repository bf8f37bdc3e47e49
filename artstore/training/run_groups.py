"""ART's objects out: a run's sealed groups as `art.TrajectoryGroup`s, ready for `backend.train`.

    leftover = await artstore.unconsumed_groups(store, "my-run", model)  # train these first
    groups = await artstore.run_groups(store, "my-run", batch=3)

Trajectories are trainable (`Choice` objects with their logprobs), rewarded by the run's
scorer (or `scorer=`), and stamped with `artstore_rollout_id` / `artstore_group_id`, so
that the recording backend knows them when they are trained: no group is recorded twice,
and none is trained twice into one model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import check_name, check_store, check_whole_number
from artstore.groups import load_groups
from artstore.schema import tables as t
from artstore.training.backend import recording_backend_of
from artstore.training.runs import run_scorer
from artstore.training.steps import consumed_groups

if TYPE_CHECKING:
    import art

    from artstore.store import Store


async def _sealed_ids(store: Store, run: str, batch: int | None) -> list[str]:
    query = (
        select(t.groups.c.group_id)
        .where(t.groups.c.run == run)
        .order_by(t.groups.c.batch, t.groups.c.scenario_index, t.groups.c.position)
    )
    if batch is not None:
        query = query.where(t.groups.c.batch == batch)
    async with store.database.read() as connection:
        return list((await connection.execute(query)).scalars().all())


async def run_groups(
    store: Store, run: str, *, batch: int | None = None, scorer: str | None = None
) -> list[art.TrajectoryGroup]:
    """The sealed groups of `run` (of one `batch`), in the run's order (none: no such run)."""
    check_store(store)
    check_name("run", run)
    check_whole_number("batch", batch, optional=True)
    check_name("scorer", scorer, optional=True)
    ids = await _sealed_ids(store, run, batch)
    return await load_groups(store, ids, scorer or await run_scorer(store, run))


async def unconsumed_groups(
    store: Store, run: str, model: Any, *, scorer: str | None = None
) -> list[art.TrajectoryGroup]:
    """The sealed groups of `run` that `model` has not been trained on, in the run's order.

    When `model` is registered with the recording backend (`artstore.recording_backend`), that
    backend first takes the model (one trainer per model) and settles a train step a
    crash left open, with the backend's own step: a group the crashed step did train
    counts as consumed, one it did not is handed out again.
    """
    check_store(store)
    check_name("run", run)
    check_name("scorer", scorer, optional=True)
    recording = recording_backend_of(model)
    if recording is not None:
        await recording.settle(model)
    ids = await _sealed_ids(store, run, None)
    consumed = await consumed_groups(store, model, ids)
    left = [g for g in ids if g not in consumed]
    return await load_groups(store, left, scorer or await run_scorer(store, run))
