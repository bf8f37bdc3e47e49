"""Feedback: a person's judgement is an immutable event, and its score a reward by the
scorer `human:<name>` that the views, replay and datasets read like any other scorer's.

On SQLite and PostgreSQL, on the recorded run of tests/support/recorded_run.py.
"""

from __future__ import annotations

import asyncio

import pytest
from command_line import run_artstore
from recorded_run import RUN, record_run

import artstore
from artstore.analysis.sql import query
from artstore.errors import InvalidArgumentError, NotFoundError
from artstore.schema.views import VIEWS
from artstore.training.replay import policy_rewards


async def latest(store, scorer: str) -> dict[str, float]:
    rows = await query(
        store, f"SELECT rollout_id, reward FROM v_latest_rewards WHERE scorer = '{scorer}'"
    )
    return dict(rows.rows)


async def test_a_score_is_a_reward_by_human_name_in_the_views_and_for_replay(store):
    await record_run(store)
    await store.feedback("r0a", score=0.0, label="wrong-tool", name="alice")
    await store.feedback("r0b", score=1.0, comment="right in the end", name="alice")
    await store.feedback("r0a", score=0.5, name="alice")  # a second judgement: the latest counts
    await store.feedback("r0a", score=1.0, name="bob")

    assert await latest(store, "human:alice") == {"r0a": 0.5, "r0b": 1.0}
    assert await latest(store, "human:bob") == {"r0a": 1.0}
    every = await query(
        store, "SELECT reward FROM v_rewards WHERE scorer = 'human:alice' AND rollout_id = 'r0a'"
    )
    assert sorted(r[0] for r in every.rows) == [0.0, 0.5]  # both kept
    # The run's own scorer is untouched: a person's score is a scorer of its own.
    shown = await query(store, "SELECT reward FROM v_rollouts WHERE rollout_id = 'r0a'")
    assert shown.rows == [(1.0,)]
    groups = await query(
        store, "SELECT reward_mean FROM v_groups WHERE group_id = 'g0' AND scorer = 'human:alice'"
    )
    assert groups.rows == [(0.75,)]
    assert await policy_rewards(store, ["g0"], "human:alice") == {"g0": [0.5, 1.0]}
    trajectory = await store.trajectory("r0a", scorer="human:alice")
    assert trajectory.reward == 0.5


async def test_labels_comments_and_call_scores_are_kept_but_are_no_reward(store):
    await record_run(store)
    kept = await store.feedback("r0a", label="loops", comment="asks twice", name="alice")
    await store.feedback("r0a", score=0.0, call_index=1, name="alice")
    assert await latest(store, "human:alice") == {}
    stream = await store.read_stream("feedback-r0a")
    assert [e.data.get("call_index") for e in stream] == [None, 1]
    assert stream[0].data["label"] == "loops" and stream[0].event_id == kept.event_id


async def test_views_equal_a_rebuild_after_feedback(store):
    await record_run(store)
    await store.feedback("r0a", score=0.0, name="alice")
    await store.feedback("r1a", score=1.0, label="good", name="bob")
    renumbered = {"id", "train_step_id"}
    queries = [
        "SELECT {} FROM {}".format(
            ", ".join(f'"{c}"' for c in view.columns if c not in renumbered), view.name
        )
        for view in VIEWS
    ]
    before = [sorted(map(repr, (await query(store, sql)).rows)) for sql in queries]
    await store.rebuild_projections()
    after = [sorted(map(repr, (await query(store, sql)).rows)) for sql in queries]
    assert before == after


@pytest.mark.parametrize(
    ("arguments", "refused"),
    [
        ({}, "give a score, a label or a comment"),
        ({"score": float("nan")}, "finite number"),
        ({"score": True}, "finite number"),
        ({"score": 1.0, "call_index": 9}, "has 3 LLM calls"),
        ({"label": 3}, "must be a str"),
        ({"score": 1.0, "name": ""}, "must not be empty"),
    ],
)
async def test_a_bad_judgement_is_refused_and_writes_nothing(store, arguments, refused):
    await record_run(store)
    before = await store.last_position()
    with pytest.raises(InvalidArgumentError, match=refused):
        await store.feedback("r0a", **({"name": "alice"} | arguments))
    with pytest.raises(NotFoundError, match="no rollout nope"):
        await store.feedback("nope", score=1.0, name="alice")
    assert await store.last_position() == before


def test_the_command_records_feedback_by_a_prefix_of_the_id(database_url):
    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)

    asyncio.run(record())
    done = run_artstore(
        "feedback", "r0", "--score", "1", "--label", "wrong-tool", "--url", database_url
    )
    assert done.exit_code == 1 and "starts several rollout ids" in done.stderr
    done = run_artstore(
        "feedback", "r1a", "--score", "0", "--label", "wrong-tool", "--comment", "searched",
        "--name", "alice", "--url", database_url,
    )  # fmt: skip
    assert done.exit_code == 0, done.stderr
    assert "human:alice on rollout r1a" in done.stdout
    shown = run_artstore(
        "sql", "SELECT scorer, reward FROM v_latest_rewards WHERE rollout_id = 'r1a' "
        "ORDER BY scorer", "--format", "json", "--url", database_url,
    )  # fmt: skip
    assert shown.exit_code == 0, shown.stderr
    assert {"scorer": "human:alice", "reward": 0.0} in __import__("json").loads(shown.stdout)
    replayed = run_artstore(
        "replay", RUN, "--scorer", "human:alice", "--model", "from-people", "--dry-run",
        "--url", database_url,
    )  # fmt: skip
    assert replayed.exit_code == 0, replayed.stderr
