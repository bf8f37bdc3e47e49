"""The SQL views (issue 5): each one against values worked out by hand on a recorded run.

Every test runs on SQLite and on PostgreSQL with the same expected values: the views
read the same on both. The run is described in tests/support/recorded_run.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from alembic import command
from recorded_run import MODEL, RUN, SYSTEM, VALIDATION_MODEL, record_run
from sqlalchemy import inspect

from artstore.analysis import query
from artstore.eventstore.sqlite import _ensure_sqrt, _sqrt
from artstore.schema import migrate
from artstore.schema.views import VIEWS

VIEWS_PAGE = Path(__file__).parents[2] / "docs" / "views.md"


@pytest.fixture
async def recorded(store):
    await record_run(store)
    return store


async def rows(store, sql: str) -> list[dict]:
    result = await query(store, sql)
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def pick(records: list[dict], *columns: str) -> list[tuple]:
    return [tuple(record[column] for column in columns) for record in records]


async def test_every_view_exists_with_its_declared_columns(recorded):
    for view in VIEWS:
        result = await query(recorded, f"SELECT * FROM {view.name}")
        assert result.columns == view.columns, view.name


def test_every_view_and_column_is_documented():
    section = VIEWS_PAGE.read_text()
    for view in VIEWS:
        match = re.search(rf"^## `{view.name}`\n(.*?)(?=^## |\Z)", section, re.M | re.S)
        assert match, f"docs/views.md documents no view {view.name}"
        documented = set(re.findall(r"^\| `(\w+)` \|", match.group(1), re.M))
        assert documented == set(view.columns), view.name
        assert "```sql" in match.group(1), f"no example query for {view.name}"


async def test_every_documented_example_runs(recorded):
    section = VIEWS_PAGE.read_text()
    examples = re.findall(r"```sql\n(.*?)```", section, re.S)
    assert len(examples) >= len(VIEWS)  # one per view at least
    for example in examples:
        await query(recorded, example)


async def test_v_runs(recorded):
    (run,) = await rows(recorded, "SELECT * FROM v_runs")
    events = await recorded.read_stream(f"run-{RUN}")
    started, finished = events[0].recorded_at, events[-1].recorded_at
    assert run == {
        "run": RUN,
        "project": "arith",
        "model": MODEL,
        "model_key": f"arith/{MODEL}",  # project/model (this fixture's model has a slash)
        "base_model": "Qwen/Qwen2.5-0.5B-Instruct",
        "validation_model": VALIDATION_MODEL,
        "scorer": "correct",
        "status": "failed",
        "trainer": "trainer-host:4242",
        "error": "RuntimeError: CUDA out of memory",
        "num_scenarios": 3,
        "num_rollouts": 7,  # r0a r0b r0v r1a r1b r2a r2b
        "num_finished": 6,
        "num_failed": 1,  # r1b
        "num_running": 0,
        "num_groups": 3,
        "num_train_steps": 1,  # the second one failed
        "last_step": 1,
        # 120 + 180 + 210 (r0a) + 140 (r0b) + 95 (r0v) + 180 (r1a) + 125 (r1b) + 88 + 92
        "total_tokens": 1230,
        "started_at": started.strftime("%Y-%m-%d %H:%M:%S.%f"),
        "finished_at": finished.strftime("%Y-%m-%d %H:%M:%S.%f"),
        "duration_s": pytest.approx((finished - started).total_seconds(), abs=1e-6),
        "config": '{"batch_size":2,"group_size":2,"learning_rate":1e-05}',
    }


async def test_v_rollouts(recorded):
    found = await rows(recorded, "SELECT * FROM v_rollouts ORDER BY rollout_id")
    # reward: the latest by the run's scorer, "correct" (r0b was re-scored 0.0 -> 0.25)
    assert pick(found, "rollout_id", "group_id", "role", "policy_step", "status", "reward") == [
        ("r0a", "g0", "policy", 0, "finished", 1.0),
        ("r0b", "g0", "policy", 0, "finished", 0.25),
        ("r0v", "g0", "validation", None, "finished", 0.5),
        ("r1a", "g1", "policy", 0, "finished", 0.5),
        ("r1b", "g1", "policy", 0, "failed", None),
        ("r2a", "g2", "policy", 1, "finished", 1.0),
        ("r2b", "g2", "policy", 1, "finished", 1.0),
    ]
    tokens = ("num_llm_calls", "prompt_tokens", "completion_tokens", "total_tokens")
    assert pick(found, "rollout_id", *tokens, "num_tool_calls", "duration_s") == [
        ("r0a", 3, 100 + 150 + 200, 20 + 30 + 10, 510, 3, 4.5),
        ("r0b", 1, 100, 40, 140, 1, 2.0),
        ("r0v", 1, 90, 5, 95, 0, 1.0),
        ("r1a", 1, 120, 60, 180, 0, 3.0),
        ("r1b", 1, 110, 15, 125, 1, 0.5),
        ("r2a", 1, 80, 8, 88, 0, 1.0),
        ("r2b", 1, 80, 12, 92, 0, 1.5),
    ]
    # UTC text on both databases: r0b's RolloutStarted said 14:00:00.125+02:00
    assert pick(found, "started_at") == [
        ("2026-03-01 12:00:00.000000",),
        ("2026-03-01 12:00:00.125000",),
        ("2026-03-01 12:00:00.250000",),
        ("2026-03-01 12:00:10.000000",),
        ("2026-03-01 12:00:10.500000",),
        ("2026-03-01 12:01:00.000000",),
        ("2026-03-01 12:01:01.000000",),
    ]
    by_id = {record["rollout_id"]: record for record in found}
    assert by_id["r0v"]["model"] == VALIDATION_MODEL
    assert by_id["r1b"]["error_type"] == "ToolError"
    assert by_id["r1b"]["error_message"] == "the search tool timed out"
    assert by_id["r1b"]["result"] is None
    assert json.loads(by_id["r0a"]["result"]) == {"answer": "4"}
    assert json.loads(by_id["r1a"]["scenario"]) == {"question": "What is 3*3?", "answer": "9"}
    assert by_id["r0a"]["llm_latency_s"] == pytest.approx(0.5 + 0.25 + 0.5)
    assert {record["scorer"] for record in found} == {"correct"}
    assert {record["imported"] for record in found} == {0}
    assert all(record["finished_at"] > record["started_at"] for record in found)


async def test_v_llm_calls(recorded):
    found = await rows(recorded, "SELECT * FROM v_llm_calls ORDER BY position")
    columns = (
        "call_id",
        "rollout_id",
        "call_index",
        "policy_step",
        "total_tokens",
        "latency_s",
        "finish_reason",
        "num_input_messages",
        "num_tool_calls",
        "tool_names",
        "has_logprobs",
    )
    assert pick(found, *columns) == [
        ("c0a0", "r0a", 0, 0, 120, 0.5, "tool_calls", 2, 1, "search", 1),
        ("c0a1", "r0a", 1, 0, 180, 0.25, "tool_calls", 4, 2, "search, calculator", 1),
        ("c0a2", "r0a", 2, 0, 210, 0.5, "stop", 7, 0, None, 1),
        ("c0b0", "r0b", 0, 0, 140, 1.0, "tool_calls", 2, 1, "calculator", 1),
        ("c0v0", "r0v", 0, None, 95, 0.75, "stop", 2, 0, None, 0),
        ("c1a0", "r1a", 0, 0, 180, 2.0, "stop", 2, 0, None, 1),
        ("c1b0", "r1b", 0, 0, 125, 0.3, "tool_calls", 2, 1, "search", 1),
        ("c2a0", "r2a", 0, 1, 88, 0.5, "stop", 2, 0, None, 1),
        ("c2b0", "r2b", 0, 1, 92, 0.5, "stop", 2, 0, None, 1),
    ]
    by_id = {record["call_id"]: record for record in found}
    assert json.loads(by_id["c0a1"]["tool_calls"]) == [
        {"name": "search", "args": {"q": "sum of 2 and 2"}},
        {"name": "calculator", "args": {"expr": "2+2"}},
    ]
    assert by_id["c0a2"]["tool_calls"] is None  # JSON null reads as NULL
    assert by_id["c0b0"]["started_at"] == "2026-03-01 12:00:00.125000"  # given in +02:00
    assert by_id["c0v0"]["model"] == VALIDATION_MODEL
    assert (by_id["c0a0"]["prompt_tokens"], by_id["c0a0"]["completion_tokens"]) == (100, 20)
    assert (await rows(recorded, "SELECT count(*) AS n FROM v_llm_calls WHERE tool_calls IS NULL"))[
        0
    ]["n"] == 5


async def test_v_tool_calls_time_the_gap_until_the_next_call(recorded):
    found = await rows(recorded, "SELECT * FROM v_tool_calls ORDER BY call_id, tool_index")
    columns = (
        "call_id",
        "tool_index",
        "tool_name",
        "num_parallel",
        "call_latency_s",
        "tool_time_s",
    )
    assert pick(found, *columns) == [
        # c0a0 at 0.0 s for 0.5 s; c0a1 starts at 1.5 s: 1.0 s for the tool
        ("c0a0", 0, "search", 1, 0.5, 1.0),
        # c0a1 at 1.5 s for 0.25 s; c0a2 starts at 4.0 s: 2.25 s for both tools
        ("c0a1", 0, "search", 2, 0.25, 2.25),
        ("c0a1", 1, "calculator", 2, 0.25, 2.25),
        # the last call of r0b and of r1b: no next call, no time
        ("c0b0", 0, "calculator", 1, 1.0, None),
        ("c1b0", 0, "search", 1, 0.3, None),
    ]
    assert [json.loads(record["args"]) for record in found] == [
        {"q": "2+2"},
        {"q": "sum of 2 and 2"},
        {"expr": "2+2"},
        {"expr": "2*2"},
        {"q": "3*3"},
    ]
    assert {(r["run"], r["policy_step"], r["role"]) for r in found} == {(RUN, 0, "policy")}


async def test_v_rewards_keeps_every_reward_and_marks_the_latest(recorded):
    found = await rows(recorded, "SELECT * FROM v_rewards ORDER BY id")
    assert pick(found, "rollout_id", "scorer", "reward", "rescored", "is_latest") == [
        ("r0a", "correct", 1.0, 0, 0),
        ("r0b", "correct", 0.0, 0, 0),
        ("r0v", "correct", 0.5, 0, 0),
        ("r0a", "judge", 0.8, 0, 1),
        ("r0b", "judge", 0.4, 0, 1),
        ("r0v", "judge", 0.6, 0, 1),
        ("r1a", "correct", 0.5, 0, 1),
        ("r1a", "judge", 0.3, 0, 1),
        ("r0a", "correct", 1.0, 1, 1),  # the re-scoring of g0
        ("r0b", "correct", 0.25, 1, 1),
        ("r0v", "correct", 0.5, 1, 1),
        ("r2a", "correct", 1.0, 0, 1),
        ("r2b", "correct", 1.0, 0, 1),
    ]
    assert json.loads(found[3]["metrics"]) == {"confidence": 0.9}
    assert found[0]["metrics"] is None
    assert (found[2]["role"], found[2]["policy_step"]) == ("validation", None)


async def test_v_latest_rewards_has_one_reward_per_rollout_and_scorer(recorded):
    found = await rows(recorded, "SELECT * FROM v_latest_rewards ORDER BY rollout_id, scorer")
    assert pick(found, "rollout_id", "scorer", "reward", "rescored", "num_scores") == [
        ("r0a", "correct", 1.0, 1, 2),
        ("r0a", "judge", 0.8, 0, 1),
        ("r0b", "correct", 0.25, 1, 2),
        ("r0b", "judge", 0.4, 0, 1),
        ("r0v", "correct", 0.5, 1, 2),
        ("r0v", "judge", 0.6, 0, 1),
        ("r1a", "correct", 0.5, 0, 1),
        ("r1a", "judge", 0.3, 0, 1),
        ("r2a", "correct", 1.0, 0, 1),
        ("r2b", "correct", 1.0, 0, 1),
    ]


async def test_v_groups(recorded):
    found = await rows(recorded, "SELECT * FROM v_groups ORDER BY group_id, scorer")
    shape = ("group_id", "batch", "size", "num_validation", "num_failed", "scorer", "num_rewards")
    assert pick(found, *shape) == [
        ("g0", 0, 2, 1, 0, "correct", 2),
        ("g0", 0, 2, 1, 0, "judge", 2),
        ("g1", 0, 2, 0, 1, "correct", 1),  # r1b failed: one reward
        ("g1", 0, 2, 0, 1, "judge", 1),
        ("g2", 1, 2, 0, 0, "correct", 2),
    ]
    stats = ("reward_mean", "reward_std", "reward_min", "reward_max", "validation_reward_mean")
    assert pick(found, *stats) == [
        # policy rewards 1.0 and 0.25 (re-scored): mean 0.625, population std 0.375
        (0.625, pytest.approx(0.375), 0.25, 1.0, 0.5),
        # 0.8 and 0.4: mean 0.6, std 0.2; the validation rollout r0v got 0.6
        (pytest.approx(0.6), pytest.approx(0.2), 0.4, 0.8, 0.6),
        (0.5, 0.0, 0.5, 0.5, None),  # one reward: no spread
        (0.3, 0.0, 0.3, 0.3, None),
        (1.0, 0.0, 1.0, 1.0, None),  # equal rewards: exactly 0
    ]
    consumed = ("consumed_by", "consumed_at_step", "consumed_with_scorer", "num_consumptions")
    assert pick(found, *consumed) == [
        (MODEL, 1, "correct", 1),
        (MODEL, 1, "correct", 1),
        (MODEL, 1, "correct", 1),
        (MODEL, 1, "correct", 1),
        (None, None, None, 0),  # its train step failed
    ]
    assert {record["run"] for record in found} == {RUN}


async def test_v_train_steps_and_their_metrics(recorded):
    found = await rows(recorded, "SELECT * FROM v_train_steps ORDER BY id")
    assert pick(found, "step_before", "step", "status", "scorer", "num_groups") == [
        (0, 1, "completed", "correct", 2),
        (1, None, "failed", "correct", 1),
    ]
    # g0 and g1 trained r0a 1.0, r0b 0.25 (latest) and r1a 0.5 (r1b failed, r0v validates)
    assert pick(found, "num_trajectories", "reward_mean") == [
        (3, pytest.approx(1.75 / 3)),
        (2, 1.0),
    ]
    assert pick(found, "pushed_to", "reconciled", "duration_s", "error_message") == [
        ("s3://bucket/agent-001/0001", 0, 12.5, None),
        (None, 0, None, "CUDA out of memory"),
    ]
    assert json.loads(found[0]["group_ids"]) == ["g0", "g1"]
    assert json.loads(found[0]["metrics"]) == {
        "loss": 0.25,
        "reward_mean": 0.5,
        "num_groups_trainable": 1.0,
    }
    assert found[1]["metrics"] is None
    metrics = await rows(
        recorded, "SELECT * FROM v_train_step_metrics ORDER BY train_step_id, metric"
    )
    assert pick(metrics, "train_step_id", "step", "metric", "value") == [
        (found[0]["id"], 1, "loss", 0.25),
        (found[0]["id"], 1, "num_groups_trainable", 1.0),
        (found[0]["id"], 1, "reward_mean", 0.5),
    ]


async def test_v_trajectory_messages(recorded):
    found = await rows(
        recorded,
        "SELECT * FROM v_trajectory_messages WHERE rollout_id = 'r0a' "
        "ORDER BY history_index, message_index",
    )
    columns = (
        "history_index",
        "message_index",
        "role",
        "content",
        "trainable",
        "num_logprobs",
        "tool_call_id",
        "num_tool_calls",
        "tool_names",
    )
    # r0a's three calls grow one conversation (ART's merging rule): 8 messages.
    assert pick(found, *columns) == [
        (0, 0, "system", SYSTEM.content, 0, 0, None, 0, None),
        (0, 1, "user", "What is 2+2?", 0, 0, None, 0, None),
        (0, 2, "assistant", "", 1, 1, None, 1, "search"),
        (0, 3, "tool", "result of search", 0, 0, "c0a0-0", 0, None),
        (0, 4, "assistant", "", 1, 1, None, 2, "search, calculator"),
        (0, 5, "tool", "result of search", 0, 0, "c0a1-0", 0, None),
        (0, 6, "tool", "result of calculator", 0, 0, "c0a1-1", 0, None),
        (0, 7, "assistant", "4", 1, 1, None, 0, None),
    ]
    assert [call["name"] for call in json.loads(found[4]["tool_calls"])] == [
        "search",
        "calculator",
    ]
    assert {(r["run"], r["policy_step"], r["rollout_role"]) for r in found} == {(RUN, 0, "policy")}
    validation = await rows(
        recorded, "SELECT trainable FROM v_trajectory_messages WHERE rollout_role = 'validation'"
    )
    assert validation and {r["trainable"] for r in validation} == {0}  # no logprobs


async def test_views_read_the_same_after_the_projections_are_rebuilt(recorded):
    renumbered = {"id", "train_step_id"}  # projection rows get new ids in a rebuild
    queries = [
        "SELECT {} FROM {}".format(
            ", ".join(f'"{column}"' for column in view.columns if column not in renumbered),
            view.name,
        )
        for view in VIEWS
    ]
    before = [sorted(map(repr, (await query(recorded, sql)).rows)) for sql in queries]
    await recorded.rebuild_projections()
    after = [sorted(map(repr, (await query(recorded, sql)).rows)) for sql in queries]
    for sql, old, new in zip(queries, before, after, strict=True):
        assert old == new, sql


async def test_downgrade_drops_the_views_and_upgrade_creates_them(store):
    names = {view.name for view in VIEWS}

    def view_names(connection) -> set[str]:
        return set(inspect(connection).get_view_names()) & names

    def migrate_to(connection, revision: str) -> None:
        config = migrate.alembic_config()
        config.attributes["connection"] = connection
        if revision == "0001":
            command.downgrade(config, revision)
        else:
            command.upgrade(config, revision)

    async with store.database.write() as connection:
        assert await connection.run_sync(view_names) == names
        await connection.run_sync(migrate_to, "0001")
        assert await connection.run_sync(view_names) == set()
        await connection.run_sync(migrate_to, "0002")
        assert await connection.run_sync(view_names) == names


def test_sqlite_without_math_functions_gets_a_sqrt():
    class NoSqrt:
        def execute(self, sql):
            raise RuntimeError("no such function: sqrt")

    registered = {}
    connection = SimpleNamespace(
        create_function=lambda name, n, f, deterministic: registered.update({name: (n, f)})
    )
    _ensure_sqrt(connection, NoSqrt())
    assert registered == {"sqrt": (1, _sqrt)}
    assert (_sqrt(2.25), _sqrt(0), _sqrt(-1e-18), _sqrt(None), _sqrt("x")) == (
        1.5,
        0.0,
        None,
        None,
        None,
    )
