"""LangGraph's own conformance suite (`langgraph-checkpoint-conformance`) against
`artstore.langgraph.checkpointer`, on SQLite and PostgreSQL: every base capability (put,
put_writes, get_tuple, list, delete_thread) passes, none is skipped."""

from __future__ import annotations

from checkpoint_tables import checkpoint_tables
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from artstore.langgraph import checkpointer

BASE = {"put", "put_writes", "get_tuple", "list", "delete_thread"}


async def test_the_checkpointer_passes_langgraphs_conformance_suite(store):
    @checkpointer_test(name=f"artstore-{store.dialect}")
    async def artstore_saver():
        yield checkpointer(store)

    report = await validate(artstore_saver, progress=ProgressCallbacks.verbose())
    report.print_report()
    failures = {name: r.failures for name, r in report.results.items() if r.failures}
    assert failures == {}
    assert report.passed_all_base()
    assert {name for name, r in report.results.items() if r.passed} == BASE


async def test_what_the_suite_wrote_equals_a_rebuild_of_the_projections(store):
    @checkpointer_test(name=f"artstore-{store.dialect}-rebuild")
    async def artstore_saver():
        yield checkpointer(store)

    await validate(artstore_saver, capabilities={"put_writes", "delete_thread"})

    before = await checkpoint_tables(store)
    assert before["langgraph_writes"] and before["langgraph_checkpoints"]
    await store.rebuild_projections()
    assert await checkpoint_tables(store) == before
