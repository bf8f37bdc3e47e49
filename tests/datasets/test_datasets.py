"""Datasets: a selection of rollouts frozen as an event, in immutable versions.

On SQLite and PostgreSQL, on the recorded run of tests/support/recorded_run.py: its
finished policy rollouts are r0a (1.0), r0b (0.25 after g0's re-scoring), r1a (0.5) and,
at policy step 1, r2a and r2b (1.0 each) by the run's scorer "correct".
"""

from __future__ import annotations

import asyncio
import json

import pytest
from command_line import run_artstore
from recorded_run import RUN, record_run

import artstore
from artstore.datasets import Selection, create_dataset, dataset_diff, list_datasets, read_dataset
from artstore.datasets.selection import holds_the_same
from artstore.errors import InvalidArgumentError, NotFoundError, QueryRefusedError
from artstore.events import RewardsRecorded


async def ids(store, **selection) -> list[str]:
    made = await create_dataset(store, "d", Selection(run=RUN, **selection))
    return sorted(made.rollout_ids)


async def test_each_selection_chooses_its_rollouts(store):
    await record_run(store)
    assert await ids(store) == ["r0a", "r0b", "r1a", "r2a", "r2b"]
    assert await ids(store, min_reward=0.5) == ["r0a", "r1a", "r2a", "r2b"]
    assert await ids(store, top_k=1) == ["r0a", "r1a", "r2a"]  # a tie: the first recorded
    assert await ids(store, steps=(1, None)) == ["r2a", "r2b"]
    assert await ids(store, steps=(None, 0), scorer="judge", min_reward=0.35) == ["r0a", "r0b"]
    asked = "SELECT rollout_id FROM v_rollouts WHERE num_tool_calls > 0"
    assert await ids(store, sql=asked) == ["r0a", "r0b"]
    assert await ids(store, sql=asked, top_k=1) == ["r0a"]
    versions = await list_datasets(store)
    assert [(d.name, d.version) for d in versions] == [("d", n) for n in range(1, 8)]
    assert versions[1].selection == {"run": RUN, "min_reward": 0.5}
    assert versions[1].rewards == {"r0a": 1.0, "r1a": 0.5, "r2a": 1.0, "r2b": 1.0}


async def test_a_version_never_changes_and_its_digest_tells_a_rescore(store):
    await record_run(store)
    first = await create_dataset(store, "best", Selection(run=RUN, min_reward=0.5))
    await store.append(
        "group-g0",
        [RewardsRecorded(group_id="g0", scorer="correct", rewards={"r0b": 0.75}, rescored=True)],
    )
    second = await create_dataset(store, "best", Selection(run=RUN, min_reward=0.5))
    third = await create_dataset(store, "best", Selection(run=RUN, min_reward=0.5))
    again = await read_dataset(store, "best", 1)
    assert again == first and "r0b" not in again.rollout_ids
    assert (second.version, third.version) == (2, 3)
    assert second.digest == third.digest != first.digest  # the same rollouts, the same digest
    assert await holds_the_same(store, first)  # r0b is none of its rollouts
    await store.append(
        "group-g0",
        [RewardsRecorded(group_id="g0", scorer="correct", rewards={"r0a": 0.9}, rescored=True)],
    )
    assert not await holds_the_same(store, first) and not await holds_the_same(store, third)
    assert await holds_the_same(store, await create_dataset(store, "best", Selection(run=RUN)))
    changes = await dataset_diff(store, first, second)
    assert (changes["entered"], changes["left"], changes["kept"]) == (1, 0, 4)
    assert changes["rollouts"] == [
        {
            "change": "entered",
            "rollout_id": "r0b",
            "why": "reward moved from 0.25 to 0.75 (scored again)",
        }
    ]
    narrower = await create_dataset(store, "best", Selection(run=RUN, min_reward=0.8))
    changes = await dataset_diff(store, second, narrower)
    assert {r["rollout_id"]: r["why"] for r in changes["rollouts"]} == {
        "r0b": "the selection changed",
        "r1a": "the selection changed",
    }


async def test_two_creators_at_once_get_two_versions(store):
    await record_run(store)
    made = await asyncio.gather(
        *(create_dataset(store, "race", Selection(run=RUN, top_k=1)) for _ in range(3))
    )
    assert sorted(d.version for d in made) == [1, 2, 3]


async def test_feedback_chooses_a_dataset_like_any_scorer(store):
    await record_run(store)
    await store.feedback("r1a", score=1.0, name="alice")
    await store.feedback("r0a", score=0.0, name="alice")
    made = await create_dataset(
        store, "liked", Selection(run=RUN, scorer="human:alice", min_reward=1.0)
    )
    assert made.rollout_ids == ["r1a"] and made.scorer == "human:alice"


@pytest.mark.parametrize(
    ("selection", "error", "refused"),
    [
        (Selection(sql="DELETE FROM events"), QueryRefusedError, ""),
        (Selection(run=RUN, sql="SELECT run FROM v_runs"), InvalidArgumentError, "no rollout_id"),
        (Selection(run=RUN, min_reward=5.0), NotFoundError, "chooses no rollout"),
        (Selection(run="nope"), NotFoundError, "no run 'nope'"),
        (Selection(), InvalidArgumentError, "give a run or a query"),
        (Selection(run=RUN, top_k=0), InvalidArgumentError, "at least 1"),
    ],
)  # fmt: skip
async def test_a_bad_selection_is_one_error_and_writes_nothing(store, selection, error, refused):
    await record_run(store)
    before = await store.last_position()
    with pytest.raises(error, match=refused or None):
        await create_dataset(store, "d", selection)
    assert await store.last_position() == before


def test_the_commands_create_list_show_and_diff(database_url):
    async def record() -> None:
        async with await artstore.open_store(database_url) as store:
            await record_run(store)

    asyncio.run(record())
    url = ("--url", database_url)
    made = run_artstore("dataset", "create", "sft", "--run", RUN, "--top-k", "1", *url)
    assert made.exit_code == 0, made.stderr
    assert "created dataset sft@1: 3 rollouts" in made.stdout
    made = run_artstore(
        "dataset", "create", "sft", "--run", RUN, "--steps", "0:0", "--sql",
        "SELECT rollout_id FROM v_rollouts WHERE reward >= 0.5", "--format", "json", *url,
    )  # fmt: skip
    assert made.exit_code == 0, made.stderr
    assert json.loads(made.stdout)["selection"]["steps"] == [0, 0]
    listed = run_artstore("dataset", "list", "--format", "json", *url)
    assert [(d["name"], d["version"], d["rollouts"]) for d in json.loads(listed.stdout)] == [
        ("sft", 1, 3),
        ("sft", 2, 2),
    ]
    shown = json.loads(run_artstore("dataset", "show", "sft@1", "--format", "json", *url).stdout)
    assert shown["rewards"] == {"r0a": 1.0, "r1a": 0.5, "r2a": 1.0} and shown["unchanged"]
    assert "r2a" in run_artstore("dataset", "show", "sft@1", *url).stdout
    changed = run_artstore("dataset", "diff", "sft@1", "sft@2", *url)
    assert changed.exit_code == 0, changed.stderr
    assert "sft@1 -> sft@2: 0 entered, 1 left, 2 kept" in changed.stdout
    for bad, says in [
        (("show", "sft@9"), "no dataset sft@9"),
        (("show", "sft@x"), "the version after @ is a number"),
        (("create", "x", "--run", RUN, "--steps", "a:b"), "must be A:B"),
        (("diff", "sft@1", "nope@1"), "no dataset nope@1"),
    ]:
        done = run_artstore("dataset", *bad, *url)
        assert done.exit_code == 1 and says in done.stderr, (bad, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [
        ["dataset", "list"],
        ["dataset", "show", "d"],
        ["dataset", "diff", "d@1", "d@2"],
        ["dataset", "export", "d", "--format", "openai", "--out", "x.jsonl"],
        ["dataset", "create", "d", "--run", RUN],
        ["feedback", "r0a", "--score", "1"],
    ],
    ids=lambda c: "-".join(c[:2]),
)
def test_a_missing_store_is_one_line_and_nothing_is_created(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "no" / "artstore.db"
    done = run_artstore(*command, "--url", path)
    assert done.exit_code == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert list(tmp_path.iterdir()) == []
