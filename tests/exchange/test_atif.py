"""ATIF out and in, on SQLite and on PostgreSQL.

- `artstore export RUN --format atif` writes trajectories that the `atif` package's own
  models load, with the tool calls, observations, logprobs and token ids in ATIF's places;
- importing that file into a fresh store gives the same trajectories (messages, tool calls,
  Choices with their logprobs, rewards of every scorer);
- an ATIF file written elsewhere imports (agent steps with logprobs become trainable
  Choices); a file the models refuse imports nothing, with one line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import atif
from openai.types.chat.chat_completion import Choice
from sqlalchemy import select
from test_export_import import (
    RUN,
    SEARCH,
    _record,
    assert_same_trajectory,
    cli,
    one_line,
    rows,
)

import artstore
from artstore.schema import tables as t

IDS = ["g0-a", "g0-b", "g0-v", "g1-a", "g1-x"]


def test_atif_export_loads_in_atifs_models_and_imports_back_the_same(
    database_url: str,
    other_database_url: str,
    tmp_path: Path,
):
    asyncio.run(_record(database_url))
    exported = tmp_path / "run.atif.jsonl"
    result = cli("export", RUN, str(exported), "--format", "atif", "--url", database_url)
    assert result.exit_code == 0, result.output
    documents = [
        atif.Trajectory.model_validate(json.loads(line))
        for line in exported.read_text().splitlines()
    ]
    assert [d.trajectory_id for d in documents] == IDS
    first = documents[0]
    assert first.agent.name == "agent" and first.agent.tool_definitions == SEARCH
    assert [s.source for s in first.steps] == ["system", "user", "agent", "agent"]
    call = first.steps[2].tool_calls[0]
    assert (call.function_name, call.arguments) == ("search", {"q": "g0-a"})
    observed = first.steps[2].observation.results[0]
    assert (observed.source_call_id, observed.content) == (call.tool_call_id, "found it")
    assert first.steps[3].message == "answer of g0-a"
    assert first.steps[3].metrics.logprobs == [-0.5, -0.5, float("-inf")]
    rewards = first.extra["artstore"]["rewards"]
    assert {(r["scorer"], r["reward"]) for r in rewards} == {("correct", 1.0), ("judge", 0.75)}

    result = cli("import", str(exported), "--format", "atif", "--url", other_database_url)
    assert result.exit_code == 0, result.output
    assert "imported 5 rollouts in 2 groups (2 sealed)" in one_line(result.stdout)

    async def compare() -> None:
        async with (
            await artstore.open_store(database_url) as original,
            await artstore.open_store(other_database_url) as copy,
        ):
            for scorer in (None, "correct", "judge"):
                before = await original.trajectories(IDS, scorer=scorer)
                after = await copy.trajectories(IDS, scorer=scorer)
                for rid in IDS:
                    assert_same_trajectory(before[rid], after[rid])
            answer = (await copy.trajectory("g0-a")).messages_and_choices[4]
            assert isinstance(answer, Choice)
            assert answer.logprobs.content[-1].logprob == float("-inf")
            query = select(t.rewards.c["rollout_id", "scorer", "reward", "rescored"]).order_by(
                t.rewards.c.rollout_id, t.rewards.c.scorer, t.rewards.c.rescored
            )
            assert await rows(copy, query) == await rows(original, query)

    asyncio.run(compare())


def harbor_like(session: str, logprobs: list[float] | None = None) -> dict:
    """An ATIF trajectory as a tool outside artstore writes it (no artstore extras)."""
    agent_metrics = {"logprobs": logprobs, "completion_token_ids": [11, 12]} if logprobs else None
    return {
        "schema_version": "ATIF-v1.6",
        "session_id": session,
        "agent": {"name": "terminus", "version": "2.0", "model_name": "qwen"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "list the files"},
            {
                "step_id": 2,
                "source": "agent",
                "message": "",
                "tool_calls": [
                    {"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "ls"}}
                ],
                "observation": {"results": [{"source_call_id": "c1", "content": "a.txt"}]},
            },
            {"step_id": 3, "source": "agent", "message": "a.txt", "metrics": agent_metrics},
        ],
    }


def test_foreign_atif_imports_and_a_bad_file_imports_nothing(database_url: str, tmp_path: Path):
    good = tmp_path / "trials.jsonl"
    good.write_text(
        json.dumps(harbor_like("s1", [-0.1, -0.2])) + "\n" + json.dumps(harbor_like("s2")) + "\n"
    )
    bad = tmp_path / "bad.json"
    broken = harbor_like("s3")
    broken["steps"][1]["step_id"] = 5
    bad.write_text(json.dumps(broken))

    refused = cli("import", str(bad), "--format", "atif", "--url", database_url)
    assert refused.exit_code == 1
    assert "not an ATIF trajectory" in one_line(refused.output)
    assert "is not sequential" in one_line(refused.output)

    result = cli("import", str(good), "--format", "atif", "--run", "harbor", "--url", database_url)
    assert result.exit_code == 0, result.output
    assert "imported 2 rollouts" in one_line(result.stdout)

    async def check() -> None:
        async with await artstore.open_store(database_url) as store:
            found = await rows(
                store, select(t.rollouts.c.rollout_id).where(t.rollouts.c.run == "harbor")
            )
            assert len(found) == 2
            assert await rows(store, select(t.runs.c.run)) == [("harbor",)]
            trajectories = await store.trajectories([rid for (rid,) in found])
            by_session = {tr.metadata["atif_session_id"]: tr for tr in trajectories.values()}
            items = by_session["s1"].messages_and_choices
            assert items[0] == {"role": "user", "content": "list the files"}
            assert items[1]["tool_calls"][0]["function"] == {
                "name": "bash",
                "arguments": '{"cmd": "ls"}',
            }
            assert items[2] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
            answer = items[3]
            assert isinstance(answer, Choice)  # logprobs: ART can train it
            assert [(c.token, c.logprob) for c in answer.logprobs.content] == [
                ("token_id:11", -0.1),
                ("token_id:12", -0.2),
            ]
            assert not isinstance(by_session["s2"].messages_and_choices[3], Choice)

    asyncio.run(check())
