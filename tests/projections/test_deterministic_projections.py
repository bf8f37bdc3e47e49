"""Projections are a deterministic function of the events: same events, same bytes.

A run is appended in a random interleaving of its streams, in transactions of random
sizes (the writer's group commit takes what was queued together), with float latencies
and rewards whose sums depend on the order they are added in. Every projection table is
then dumped row by row in primary-key order, each value as the text of its exact value
(floats through repr, surrogate ids included), and compared with what a rebuild from the
log writes, and with what projecting the same log in pages of other sizes writes; two
LangGraph threads' checkpoints and writes among them (one thread deleted). Both
databases.
"""

from __future__ import annotations

from typing import Any

from mixed_run import record_interleaved
from sqlalchemy import delete, select
from sqlalchemy.engine import Connection

from artstore.projections import rebuild, trained
from artstore.schema import tables as t


async def dump(store: Any) -> dict[str, list[tuple[str, ...]]]:
    """Every row of every projection table, in primary-key order, each value as repr."""
    found = {}
    async with store.database.read() as connection:
        for table in t.PROJECTION_TABLES:
            query = select(table).order_by(*table.primary_key.columns)
            rows = await connection.execute(query)
            found[table.name] = [tuple(map(repr, row)) for row in rows]
    return found


async def project_in_pages(store: Any, page_size: int) -> None:
    """Rebuild the projections from the log, `page_size` events per projected batch."""

    def rebuilt(connection: Connection) -> int:
        store.database.lock_appends(connection)
        return rebuild(connection, page_size=page_size)

    await store.database.run_write(lambda c: c.run_sync(rebuilt))


async def test_a_rebuild_writes_the_live_tables_byte_for_byte(store):
    await record_interleaved(store, seed=24, checkpoints=True)
    live = await dump(store)
    assert live["train_steps"] and all(len(rows) > 0 for rows in live.values())

    await store.rebuild_projections()

    assert await dump(store) == live


async def test_the_same_events_projected_in_batches_of_any_size_give_the_same_tables(store):
    await record_interleaved(store, seed=10, checkpoints=True)
    live = await dump(store)

    for page_size in (1, 3, 17, 5000):
        await project_in_pages(store, page_size)
        assert await dump(store) == live, page_size


async def test_what_a_step_trained_does_not_depend_on_the_order_its_rows_are_stored_in(store):
    """The rollouts stored again in the reverse order (the order a query without ORDER BY
    returns them in), and every step summed again: the same bits."""
    await record_interleaved(store, seed=5)
    before = await dump(store)

    def stored_backwards_and_summed_again(connection: Connection) -> None:
        rollouts = connection.execute(select(t.rollouts).order_by(t.rollouts.c.rollout_id))
        backwards = [dict(row) for row in reversed(rollouts.mappings().all())]
        connection.execute(delete(t.rollouts))
        connection.execute(t.rollouts.insert(), backwards)
        steps = connection.execute(select(t.train_steps.c.id)).scalars().all()
        trained.refresh_trained(connection, steps)

    await store.database.run_write(lambda c: c.run_sync(stored_backwards_and_summed_again))

    assert await dump(store) == before
