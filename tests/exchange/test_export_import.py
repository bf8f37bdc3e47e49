"""`artstore export` and `artstore import`, on SQLite and on PostgreSQL, on either ART.

- the parquet export is ART's layout in the installed ART's format (2 on ART >= 0.5.20,
  lossless; 1 on 0.5.18), read back by ART's own reader;
- the JSONL export imported into a fresh store gives the same trajectories, field for field
  (Choice objects with their logprobs, tools per history, additional histories, rewards);
- parquet written by ART's own `model.log` imports as rollouts marked imported;
- parquet formats 1 and 2 both import on either ART, as ART's reader returns them (format 2
  with its Choice objects and logprobs: trainable by `artstore replay`; ART's exchanges kept
  whole, and refused only where ART 0.5.18 cannot represent them);
- importing again writes nothing, clashes and bad files import nothing, with one clear line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import art
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from art.utils.trajectory_logging import read_trajectory_groups_parquet
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from openai.types.chat import ChatCompletionMessage, ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from parquet_samples import (
    EXCHANGES_SAMPLE,
    SAMPLES,
    exchanges_groups,
    sample_groups,
    write_samples,
)
from sqlalchemy import func, select, text
from typer.testing import CliRunner

import artstore
from artstore.art_versions import has_exchanges, parquet_format_version, trainable_model
from artstore.backends import CheckOnlyBackend
from artstore.backends.check_only import CHECKPOINT_FILE
from artstore.cli import app
from artstore.errors import ArtVersionError, ExchangeFormatError, ImportConflictError
from artstore.events import (
    GroupSealed,
    RewardsRecorded,
    RunStarted,
    TrainStepCompleted,
    TrajectoryImported,
    decode_event,
)
from artstore.exchange import export_jsonl, export_parquet, import_path
from artstore.exchange.importer import derived_id
from artstore.exchange.parquet import COLUMNS
from artstore.projections import rebuild
from artstore.schema import tables as t

RUN = "p/agent"
SEARCH = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
SUMMARIZE = [{"type": "function", "function": {"name": "summarize", "description": "sum up"}}]


# --- a small run, recorded through the capture API -------------------------------------------


def ai(
    content: str,
    *tools: tuple[str, dict],
    logprobs: bool = True,
    n: int = 0,
    last_logprob: float = -0.5,
) -> AIMessage:
    metadata: dict[str, Any] = {
        "finish_reason": "tool_calls" if tools else "stop",
        "model_name": "m",
    }
    if logprobs:
        tokens = (content or "call").split()
        metadata["logprobs"] = {
            "content": [
                {
                    "token": token,
                    "logprob": -0.5 if i < len(tokens) - 1 else last_logprob,
                    "bytes": list(token.encode()),
                    "top_logprobs": [],
                }
                for i, token in enumerate(tokens)
            ]
        }
    calls = [
        {"name": name, "args": args, "id": f"call-{n}-{i}", "type": "tool_call"}
        for i, (name, args) in enumerate(tools)
    ]
    return AIMessage(content=content, tool_calls=calls, response_metadata=metadata)


async def record_rollout(store, rollout_id: str, group_id: str, *, role: str = "policy") -> None:
    """Two conversations: a tool-using one (SEARCH), then a second one (SUMMARIZE)."""
    policy = role == "policy"
    async with store.rollout(
        "agent" if policy else "baseline",
        run=RUN,
        scenario={"question": f"q of {group_id}"},
        scenario_index=int(group_id[-1]),
        group_id=group_id,
        role=role,
        policy_step=0 if policy else None,
        rollout_id=rollout_id,
    ) as rollout:
        system, question = SystemMessage("Answer."), HumanMessage(f"question {rollout_id}")
        first = ai("", ("search", {"q": rollout_id}), logprobs=policy, n=1)
        rollout.record_llm_call([system, question], first, tools=SEARCH)
        found = ToolMessage("found it", tool_call_id="call-1-0")
        # A token the model was sure it would not say: a logprob of -inf, kept as such.
        answer = ai(f"answer of {rollout_id}", logprobs=policy, n=2, last_logprob=float("-inf"))
        rollout.record_llm_call([system, question, first, found], answer, tools=SEARCH)
        summary = ai("short", logprobs=policy, n=3)
        rollout.record_llm_call([HumanMessage("Summarize: found it")], summary, tools=SUMMARIZE)
        rollout.metrics = {"turns": 3}
        rollout.metadata = {"difficulty": "easy"}
        rollout.log(f"{rollout_id} done")
        rollout.result = {"answer": answer.content}


async def record_run(store) -> list[str]:
    """g0 (2 policy, 1 validation) trained at step 1; g1 (1 policy, 1 failed) not trained.

    Rewards by "correct" and "judge"; g1 re-scored by "correct" afterwards. Returns the ids.
    """
    await store.append(
        f"run-{RUN}",
        [
            RunStarted(
                run=RUN,
                project="p",
                model="agent",
                base_model="base",
                config={"batch_size": 1},
                scenarios=[{"question": "q0"}, {"question": "q1"}],
                validation_model="baseline",
                scorer="correct",
                trainer="host:1",
            )
        ],
    )
    for rid in ("g0-a", "g0-b", "g1-a"):
        await record_rollout(store, rid, rid[:2])
    await record_rollout(store, "g0-v", "g0", role="validation")
    with pytest.raises(RuntimeError):
        async with store.rollout("agent", run=RUN, group_id="g1", rollout_id="g1-x") as rollout:
            rollout.record_llm_call([HumanMessage("hi")], ai("partial", n=9), tools=SEARCH)
            raise RuntimeError("the tool broke")
    for group_id, batch, correct, judge in (
        ("g0", 0, {"g0-a": 1.0, "g0-b": 0.0, "g0-v": 0.5}, {"g0-a": 0.75, "g0-b": 0.25}),
        ("g1", 1, {"g1-a": 0.5}, {"g1-a": 0.125}),
    ):
        await store.append(
            f"group-{group_id}",
            [
                RewardsRecorded(
                    group_id=group_id,
                    scorer="correct",
                    rewards=correct,
                    metrics={rid: {"exact": r == 1.0} for rid, r in correct.items()},
                ),
                RewardsRecorded(group_id=group_id, scorer="judge", rewards=judge),
                GroupSealed(
                    group_id=group_id,
                    run=RUN,
                    epoch=0,
                    batch=batch,
                    scenario_index=batch,
                    rollout_ids=[r for r in correct if not r.endswith("v")],
                    validation_rollout_ids=[r for r in correct if r.endswith("v")],
                    failed_rollout_ids=["g1-x"] if group_id == "g1" else [],
                ),
            ],
        )
    await store.append(
        f"train-{RUN}",
        [TrainStepCompleted(run=RUN, model=RUN, step=1, group_ids=["g0"], scorer="correct")],
    )
    await store.append(
        "group-g1",
        [RewardsRecorded(group_id="g1", scorer="correct", rewards={"g1-a": 0.0}, rescored=True)],
    )
    return ["g0-a", "g0-b", "g0-v", "g1-a", "g1-x"]


@pytest.fixture(autouse=True)
def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)  # model.log stays offline


def cli(*args: str):
    # Wide enough that rich wraps no error line (one_line below joins the wrapped ones).
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines on a narrow terminal


async def rows(store, query) -> list[tuple]:
    async with store.database.read() as connection:
        return [tuple(row) for row in await connection.execute(query)]


async def count_events(store) -> int:
    return (await rows(store, select(func.count()).select_from(t.events)))[0][0]


def assert_same_trajectory(a: art.Trajectory, b: art.Trajectory) -> None:
    for name in type(a).model_fields:
        if name != "start_time":  # the time the object was built
            assert getattr(a, name) == getattr(b, name), name
    for history_a, history_b in zip(
        [a, *a.additional_histories], [b, *b.additional_histories], strict=True
    ):
        kinds = [type(item) for item in history_a.messages_and_choices]
        assert kinds == [type(item) for item in history_b.messages_and_choices]


# --- parquet export, read by ART ----------------------------------------------------------------


async def test_parquet_export_is_read_back_by_arts_own_reader(store, tmp_path: Path):
    await record_run(store)
    summary = await export_parquet(store, RUN, tmp_path / "out")

    layout = sorted(str(Path(f).relative_to(tmp_path / "out")) for f in summary.files)
    assert layout == [
        "trajectories/train/0001.parquet",  # g0, trained into the step 0 -> 1
        "trajectories/unconsumed/0001.parquet",  # g1, never trained: its batch index
        "trajectories/val/0001.parquet",  # g0's validation rollout
    ]
    assert (summary.groups, summary.trajectories, summary.failed_rollouts) == (2, 4, 1)
    expected = {
        "train/0001": [["g0-a", "g0-b"]],
        "val/0001": [["g0-v"]],
        "unconsumed/0001": [["g1-a"]],
    }
    version = parquet_format_version()  # what this ART's writer (and model.log) writes
    for name, groups in expected.items():
        path = tmp_path / "out" / "trajectories" / f"{name}.parquet"
        assert pq.read_schema(path).names == list(COLUMNS[version])
        read = read_trajectory_groups_parquet(path)
        assert [len(g.trajectories) for g in read] == [len(ids) for ids in groups]
        for group, ids in zip(read, groups, strict=True):
            assert group.metadata["run"] == RUN
            for got, rid in zip(group.trajectories, ids, strict=True):
                stored = await store.trajectory(rid, scorer="correct")
                if version == 2:
                    # Lossless: Choice objects with their logprobs, tools, additional
                    # histories, policy versions, exactly as the store projects them.
                    assert_same_trajectory(got, stored)
                    continue
                assert got.reward == stored.reward
                assert got.metrics == stored.metrics
                assert [(m["role"], m["content"] or "") for m in got.messages()] == [
                    (m["role"], m["content"] or "") for m in stored.messages()
                ]
                # Format 1 flattens Choice objects into plain messages: no logprobs.
                assert not [i for i in got.messages_and_choices if isinstance(i, Choice)]
                assert got.additional_histories == [] and got.tools is None
    trained = read_trajectory_groups_parquet(tmp_path / "out/trajectories/train/0001.parquet")
    first = trained[0].trajectories[0]
    if version == 2:
        answer = first.messages_and_choices[4]
        assert isinstance(answer, Choice)
        assert [(t.token, t.logprob) for t in answer.logprobs.content] == [
            ("answer", -0.5),
            ("of", -0.5),
            ("g0-a", float("-inf")),  # format 2 keeps a -inf logprob too
        ]
        assert first.additional_histories[0].tools == SUMMARIZE
        assert isinstance(first.additional_histories[0].messages_and_choices[1], Choice)
    assert (await store.trajectory("g1-a", scorer="correct")).reward == 0.0  # re-scored


async def test_parquet_export_refuses_to_overwrite_and_names_unknown_runs(store, tmp_path):
    await record_run(store)
    await export_parquet(store, RUN, tmp_path)
    with pytest.raises(FileExistsError, match="--force"):
        await export_parquet(store, RUN, tmp_path)
    summary = await export_parquet(store, RUN, tmp_path, scorer="judge", force=True)
    # g0's validation rollout has no "judge" reward: g0 is left out whole.
    assert (summary.groups, summary.unscored_groups) == (1, 1)
    # Numbered by another trained model's steps: it trained nothing, so all is unconsumed.
    other = await export_parquet(store, RUN, tmp_path / "other", model="p/other")
    assert sorted(str(Path(f).relative_to(tmp_path / "other")) for f in other.files) == [
        "trajectories/unconsumed/0000.parquet",
        "trajectories/unconsumed/0001.parquet",
        "trajectories/unconsumed_val/0000.parquet",
    ]
    with pytest.raises(artstore.errors.NotFoundError, match="no run 'nope'"):
        await export_jsonl(store, "nope", tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


# --- JSONL round trip ---------------------------------------------------------------------------


def test_jsonl_export_imported_into_a_fresh_store_gives_the_same_trajectories(
    database_url: str, other_database_url: str, tmp_path: Path
):
    asyncio.run(_record(database_url))
    exported = tmp_path / "run.jsonl"
    result = cli("export", RUN, str(exported), "--url", database_url)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert '"logprob": -Infinity' in exported.read_text()  # not null: ART's Choice needs a float
    to_stdout = cli("export", RUN, "-", "--url", database_url)
    assert to_stdout.exit_code == 0, to_stdout.output
    assert [json.loads(line) for line in to_stdout.stdout.splitlines()] == lines
    assert [line["rollout_id"] for line in lines] == ["g0-a", "g0-b", "g0-v", "g1-a", "g1-x"]
    assert [line["step"] for line in lines] == [1, 1, 1, None, None]

    result = cli("import", str(exported), "--url", other_database_url)
    assert result.exit_code == 0, result.output
    assert "imported 5 rollouts in 2 groups (2 sealed) into run 'p/agent'" in one_line(
        result.stdout
    )

    async def compare() -> None:
        async with (
            await artstore.open_store(database_url) as original,
            await artstore.open_store(other_database_url) as copy,
        ):
            ids = [line["rollout_id"] for line in lines]
            for scorer in (None, "correct", "judge"):
                before = await original.trajectories(ids, scorer=scorer)
                after = await copy.trajectories(ids, scorer=scorer)
                for rid in ids:
                    assert_same_trajectory(before[rid], after[rid])
            trained = await copy.trajectory("g0-a")
            assert isinstance(trained.messages_and_choices[2], Choice)
            assert trained.messages_and_choices[2].logprobs.content[0].logprob == -0.5
            answer = trained.messages_and_choices[4]
            assert answer.logprobs.content[-1].logprob == float("-inf")
            assert trained.tools == SEARCH
            assert trained.additional_histories[0].tools == SUMMARIZE

            for query in (
                select(t.trajectory_messages).order_by(*t.trajectory_messages.primary_key),
                select(t.rewards.c["rollout_id", "group_id", "scorer", "reward", "metrics"])
                .add_columns(t.rewards.c.rescored)
                .order_by(t.rewards.c.id),
                select(t.groups.c["group_id", "run", "epoch", "batch", "scenario_index"])
                .add_columns(t.groups.c["size", "num_validation", "num_failed"])
                .order_by(t.groups.c.group_id),
                select(t.rollouts.c["rollout_id", "run", "group_id", "scenario", "model"])
                .add_columns(t.rollouts.c["role", "policy_step", "status", "result"])
                .add_columns(t.rollouts.c["error_type", "error_message", "duration_s"])
                .order_by(t.rollouts.c.rollout_id),
            ):
                assert await rows(copy, query) == await rows(original, query)
            imported = select(t.rollouts.c.imported).order_by(t.rollouts.c.rollout_id)
            assert await rows(original, imported) == [(False,)] * 5
            assert await rows(copy, imported) == [(True,)] * 5
            run = select(t.runs.c["run", "project", "model", "scorer", "status", "config"])
            assert await rows(copy, run) == [
                (RUN, "p", "agent", "correct", "imported", {"batch_size": 1})
            ]
            # The groups are unconsumed here: a replay can train a new model on them.
            assert await rows(copy, select(t.group_consumptions)) == []

    asyncio.run(compare())


def test_an_imports_projection_is_what_replaying_its_events_in_any_pages_gives(
    database_url: str, other_database_url: str, tmp_path: Path
):
    """An import's transactions project its `trajectory.imported` events in bulk; a
    rebuild in pages of one event (each rollout's start, end and trajectory in pages of
    their own: the rollout is in the table, not in the batch) and in larger pages writes
    the same rows, the failed rollout's included."""
    asyncio.run(_record(database_url))
    exported = tmp_path / "run.jsonl"
    assert cli("export", RUN, str(exported), "--url", database_url).exit_code == 0
    result = cli("import", str(exported), "--url", other_database_url)
    assert result.exit_code == 0, result.output

    async def rebuilt_alike() -> None:
        async with await artstore.open_store(other_database_url) as store:
            imported = await projection_rows(store)
            messages = imported[t.trajectory_messages.name]
            assert {row["rollout_id"] for row in messages} == {"g0-a", "g0-b", "g0-v", "g1-a"}
            statuses = {row["rollout_id"]: row["status"] for row in imported[t.rollouts.name]}
            assert statuses["g1-x"] == "failed"
            assert {row["imported"] for row in imported[t.rollouts.name]} == {True}
            for page_size in (1, 2, 3, 2000):

                def replay(connection: Any, size: int = page_size) -> int:
                    store.database.lock_appends(connection)
                    return rebuild(connection, page_size=size)

                await store.database.run_write(lambda c, r=replay: c.run_sync(r))
                assert await projection_rows(store) == imported, page_size

    asyncio.run(rebuilt_alike())


async def projection_rows(store) -> dict[str, list[dict[str, Any]]]:
    """Every projection table's rows without surrogate ids (a rebuild numbers them anew),
    in one order."""
    tables: dict[str, list[dict[str, Any]]] = {}
    async with store.database.read() as connection:
        for table in t.PROJECTION_TABLES:
            found = [
                {k: v for k, v in row._mapping.items() if k not in {"id", "step_id"}}
                for row in await connection.execute(select(table))
            ]
            tables[table.name] = sorted(found, key=repr)
    return tables


async def _record(url: str) -> None:
    async with await artstore.open_store(url) as store:
        await record_run(store)


async def test_reimporting_writes_nothing_and_a_clash_imports_nothing(store, tmp_path):
    await record_run(store)
    exported = tmp_path / "run.jsonl"
    await export_jsonl(store, RUN, exported)
    before = await count_events(store)

    # Into the store that recorded the run: the run (and its rollouts) are already here.
    with pytest.raises(ImportConflictError, match="recorded in this store, not imported"):
        await import_path(store, exported)
    assert await count_events(store) == before

    # A copy under another name gets ids of its own, and the same trajectories.
    first = await import_path(store, exported, run="copy")
    assert (first.rollouts, first.written_rollouts, first.trainable_rollouts) == (5, 5, 4)
    after_first = await count_events(store)
    again = await import_path(store, exported, run="copy")
    assert again.written_rollouts == 0
    assert await count_events(store) == after_first
    copied = derived_id("jsonl", "copy", "g0-a")
    assert_same_trajectory(await store.trajectory("g0-a"), await store.trajectory(copied))
    group = select(t.groups.c.run, t.groups.c.size).where(
        t.groups.c.group_id == derived_id("jsonl", "copy", "g0")
    )
    assert await rows(store, group) == [("copy", 2)]


async def test_a_bad_line_imports_nothing(store, tmp_path):
    await record_run(store)
    exported = tmp_path / "run.jsonl"
    await export_jsonl(store, RUN, exported)
    good = exported.read_text().splitlines()
    broken = json.loads(good[1])
    broken["trajectory"]["messages_and_choices"][2]["logprobs"] = "nope"  # not a Choice
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good[0], json.dumps(broken), *good[2:]]) + "\n")
    before = await count_events(store)
    with pytest.raises(ExchangeFormatError, match=r"line 2: item 2 is not a Choice"):
        await import_path(store, bad, run="other")
    bad.write_text(good[0] + "\n{not json\n")
    with pytest.raises(ExchangeFormatError, match="line 2: not JSON"):
        await import_path(store, bad, run="other")
    nul = json.loads(good[1])
    nul["rollout_id"] = "g0-\x00b"  # no database keeps NUL in an id
    bad.write_text("\n".join([good[0], json.dumps(nul), *good[2:]]) + "\n")
    with pytest.raises(ExchangeFormatError, match="cannot hold the NUL character"):
        await import_path(store, bad)  # its own ids (under another run, ids are derived)
    assert await count_events(store) == before


# --- importing ART's own parquet ----------------------------------------------------------------


def art_choice(content: str) -> Choice:
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=content),
        logprobs=ChoiceLogprobs(
            content=[ChatCompletionTokenLogprob(token="t", logprob=-0.1, top_logprobs=[])]
        ),
    )


def art_groups(split: str) -> list[art.TrajectoryGroup]:
    return [
        art.TrajectoryGroup(
            [
                art.Trajectory(
                    messages_and_choices=[
                        {"role": "system", "content": "Answer."},
                        {"role": "user", "content": f"{split} question {g}.{i}"},
                        art_choice(f"answer {g}.{i}"),
                    ],
                    tools=SEARCH,
                    reward=g + i / 4,
                    metrics={"turns": i},
                    metadata={"scenario": f"s{g}"},
                    logs=[f"log {g}.{i}"],
                )
                for i in range(2)
            ],
            metadata={"scenario": f"s{g}"},
        )
        for g in range(2)
    ]


async def art_logged_model(tmp_path: Path) -> Path:
    """`model.log` output for train step 1 (2 groups of 2) and a val split (2 groups of 2)."""
    model = trainable_model(name="agent", project="p", base_model="base")
    await model.register(CheckOnlyBackend(path=tmp_path / "art"))
    await model.log(art_groups("train"), split="train", step=1)
    await model.log(art_groups("val"), split="val", step=1)
    return tmp_path / "art" / "p" / "models" / "agent"


async def test_parquet_written_by_art_model_log_imports_as_imported_rollouts(store, tmp_path):
    model_dir = await art_logged_model(tmp_path)
    version = parquet_format_version()  # the format this ART's model.log wrote
    summary = await import_path(store, model_dir)
    assert (summary.run, summary.files, summary.groups, summary.sealed_groups) == (
        "p/agent",
        2,
        4,
        2,
    )
    assert summary.formats == [version]
    # Format 2 keeps the Choice objects with their logprobs: every trajectory is trainable.
    trainable = 8 if version == 2 else 0
    assert (summary.rollouts, summary.written_rollouts, summary.trainable_rollouts) == (
        8,
        8,
        trainable,
    )

    found = await rows(
        store,
        select(t.rollouts.c.rollout_id, t.rollouts.c.role, t.rollouts.c.imported)
        .where(t.rollouts.c.run == "p/agent")
        .order_by(t.rollouts.c.role),
    )
    assert len(found) == 8 and all(imported for _, _, imported in found)
    assert [role for _, role, _ in found].count("validation") == 4  # the val split

    # Each trajectory as ART's reader returns it (plus, for format 1, the tools its reader
    # drops; format 2 keeps them).
    train = model_dir / "trajectories" / "train" / "0001.parquet"
    read = read_trajectory_groups_parquet(train)
    sealed = await rows(
        store,
        select(t.groups.c.group_id, t.groups.c.batch, t.groups.c.size)
        .where(t.groups.c.run == "p/agent")
        .order_by(t.groups.c.position),
    )
    assert [(batch, size) for _, batch, size in sealed] == [(1, 2), (1, 2)]
    from artstore.groups import sealed_groups

    events = await sealed_groups(store, [group_id for group_id, _, _ in sealed])
    for (group_id, _, _), art_group in zip(sealed, read, strict=True):
        ids = events[group_id].rollout_ids
        stored = await store.trajectories(ids, scorer="imported")
        for rid, expected in zip(ids, art_group.trajectories, strict=True):
            if version == 1:
                assert expected.tools is None
                expected = expected.model_copy(update={"tools": SEARCH})
            assert_same_trajectory(stored[rid], expected)
            assert isinstance(stored[rid].messages_and_choices[2], Choice if version == 2 else dict)
    assert await rows(
        store,
        select(t.rewards.c.scorer, func.count()).group_by(t.rewards.c.scorer),
    ) == [("imported", 8)]

    # The projections and views work for the imported run.
    messages = await rows(
        store,
        select(t.trajectory_messages.c.role, t.trajectory_messages.c.trainable)
        .where(t.trajectory_messages.c.rollout_id == ids[0])
        .order_by(t.trajectory_messages.c.message_index),
    )
    assert messages == [("system", False), ("user", False), ("assistant", version == 2)]
    async with store.database.read() as connection:
        view = await connection.execute(
            text("SELECT count(*), sum(imported) FROM v_rollouts WHERE run = 'p/agent'")
        )
        assert tuple(view.one()) == (8, 8)
        status = await connection.execute(text("SELECT status FROM v_runs WHERE run = 'p/agent'"))
        assert status.scalar() == "imported"

    # The event keeps what ART's parquet marked trainable; in format 1 no item is a Choice
    # (no logprobs), in format 2 the Choice is one.
    (imported,) = [
        e for e in await store.read_stream(f"rollout-{ids[0]}") if e.data.get("histories")
    ]
    assert imported.type == "trajectory.imported"
    assert (
        imported.data["histories"][0]["trainable"],
        imported.data["histories"][0]["choices"],
    ) == ([2], [2] if version == 2 else [])
    # The projections rebuild from the events alone.
    projected = select(t.rollouts.c.rollout_id, t.rollouts.c.imported).order_by(
        t.rollouts.c.rollout_id
    )
    count_messages = select(func.count()).select_from(t.trajectory_messages)
    before = (await rows(store, projected), await rows(store, count_messages))
    await store.rebuild_projections()
    assert (await rows(store, projected), await rows(store, count_messages)) == before

    # Importing the same files again, from the whole art directory, writes nothing.
    before = await count_events(store)
    again = await import_path(store, tmp_path / "art")
    assert (again.run, again.written_rollouts) == ("p/agent", 0)
    assert await count_events(store) == before


def test_import_command_says_which_imports_are_trainable(database_url: str, tmp_path: Path):
    train = asyncio.run(art_logged_model(tmp_path)) / "trajectories" / "train" / "0001.parquet"
    result = cli("import", str(train), "--run", "one-step", "--url", database_url)
    assert result.exit_code == 0, result.output
    assert "imported 4 rollouts in 2 groups (2 sealed) into run 'one-step'" in one_line(
        result.stdout
    )
    if parquet_format_version() == 1:
        assert "format 1 (written by ART 0.5.18) keeps no logprobs" in one_line(result.stderr)
    else:
        assert result.stderr == ""  # format 2: every trajectory has its logprobs
    result = cli("import", str(train), "--run", "one-step", "--url", database_url)
    assert result.exit_code == 0, result.output
    assert "nothing new" in one_line(result.stdout)

    # Both formats import on either ART (the other ART wrote the other sample).
    v1 = cli("import", str(SAMPLES[1]), "--run", "v1", "--url", database_url)
    assert v1.exit_code == 0, v1.output
    assert "format 1 (written by ART 0.5.18) keeps no logprobs" in one_line(v1.stderr)
    v2 = cli("import", str(SAMPLES[2]), "--run", "v2", "--url", database_url)
    assert v2.exit_code == 0, v2.output
    assert "imported 5 rollouts in 2 groups (2 sealed) into run 'v2'" in one_line(v2.stdout)
    assert v2.stderr == ""  # the failed rollout (a group exception) is no untrainable one
    # ... and exports again in this ART's format; format 2 in, format 2 out, field for field.
    out = tmp_path / "v2-out"
    exported = cli("export", "v2", str(out), "--format", "parquet", "--url", database_url)
    assert exported.exit_code == 0, exported.output
    assert f"(ART's parquet format {parquet_format_version()})" in one_line(exported.stdout)
    (written,) = out.rglob("*.parquet")
    read = [t for group in read_trajectory_groups_parquet(written) for t in group.trajectories]
    assert len(read) == 4
    if parquet_format_version() == 2:
        for got, source in zip(
            read, [t for group in sample_groups() for t in group.trajectories], strict=True
        ):
            assert_same_trajectory(got, source)
    exchanges = cli("import", str(EXCHANGES_SAMPLE), "--run", "ex", "--url", database_url)
    assert exchanges.exit_code == 0, exchanges.output
    if has_exchanges():
        assert exchanges.stderr == ""
    else:
        assert "2 rollouts hold ART's captured exchanges, which this ART cannot represent" in (
            one_line(exchanges.stderr)
        )


# --- ART's parquet formats 1 and 2, on either ART ---------------------------------------------


def test_the_samples_are_what_this_arts_writer_makes_of_the_sample_groups(tmp_path: Path):
    written = write_samples(tmp_path)
    committed = [
        SAMPLES[parquet_format_version()],
        *([EXCHANGES_SAMPLE] if has_exchanges() else []),
    ]
    assert [path.name for path in written] == [path.name for path in committed]
    for new, old in zip(written, committed, strict=True):
        assert pq.read_table(new).equals(pq.read_table(old), check_metadata=True), old.name
    if has_exchanges():
        # What the format 2 tests expect on ART 0.5.18, which cannot read the sample itself:
        # ART 0.5.23's reader gives back the groups its writer was given, field for field.
        for name, groups in ((SAMPLES[2], sample_groups()), (EXCHANGES_SAMPLE, exchanges_groups())):
            assert_same_groups(read_trajectory_groups_parquet(name), groups)


def assert_same_groups(a: list[art.TrajectoryGroup], b: list[art.TrajectoryGroup]) -> None:
    assert len(a) == len(b)
    for group_a, group_b in zip(a, b, strict=True):
        for name in ("metadata", "metrics", "logs", "exceptions"):
            assert getattr(group_a, name) == getattr(group_b, name), name
        for trajectory_a, trajectory_b in zip(
            group_a.trajectories, group_b.trajectories, strict=True
        ):
            assert_same_trajectory(trajectory_a, trajectory_b)


def expected_groups(version: int) -> list[art.TrajectoryGroup]:
    """What ART's reader returns for the sample of `version` (tools included, see below)."""
    if version == 1:
        # Format 1's reader drops the tools that the file holds (artstore keeps them).
        read = read_trajectory_groups_parquet(SAMPLES[1])
        for group, source in zip(read, sample_groups(), strict=True):
            for trajectory, written in zip(group.trajectories, source.trajectories, strict=True):
                assert trajectory.tools is None
                trajectory.tools = written.tools
        return read
    if has_exchanges():
        return read_trajectory_groups_parquet(SAMPLES[2])
    # ART 0.5.18 has no format 2 reader: what ART 0.5.23's reader returns, the groups its
    # writer was given (checked on ART 0.5.23 by the test above).
    return sample_groups()


async def imported_groups(store, run: str) -> list[tuple[GroupSealed, dict[str, art.Trajectory]]]:
    """The run's sealed groups in file order, each with its trajectories."""
    from artstore.groups import sealed_groups

    found = await rows(
        store,
        select(t.groups.c.group_id).where(t.groups.c.run == run).order_by(t.groups.c.position),
    )
    sealed = await sealed_groups(store, [group_id for (group_id,) in found])
    return [
        (event, await store.trajectories(event.rollout_ids, scorer="imported"))
        for event in sealed.values()
    ]


@pytest.mark.parametrize("version", [1, 2])
async def test_both_parquet_formats_import_as_arts_reader_returns_them(store, version: int):
    summary = await import_path(store, SAMPLES[version], run=f"v{version}")
    expected = expected_groups(version)
    assert summary.formats == [version]
    assert (summary.groups, summary.sealed_groups, summary.rollouts) == (2, 2, 4 + (version == 2))
    assert summary.trainable_rollouts == (4 if version == 2 else 0)

    imported = await imported_groups(store, f"v{version}")
    assert len(imported) == len(expected)
    for (sealed, trajectories), group in zip(imported, expected, strict=True):
        assert sealed.metadata == group.metadata
        assert sealed.batch is None  # a file outside ART's layout has no step
        for rid, trajectory in zip(sealed.rollout_ids, group.trajectories, strict=True):
            assert_same_trajectory(trajectories[rid], trajectory)
        # Format 2 keeps a group's exceptions: they are its failed rollouts.
        failed = [
            next(e for e in await store.read_stream(f"rollout-{rid}") if e.type == "rollout.failed")
            for rid in sealed.failed_rollout_ids
        ]
        assert [
            (e.data["error_type"], e.data["error_message"], e.data["traceback"]) for e in failed
        ] == [(e.type, e.message, e.traceback) for e in group.exceptions]
    assert [len(g.exceptions) for g in expected] == ([0, 1] if version == 2 else [0, 0])

    (first_group, first_trajectories), *_ = imported
    first = first_trajectories[first_group.rollout_ids[0]]
    answer = first.messages_and_choices[4]
    messages = await rows(
        store,
        select(t.trajectory_messages.c["history_index", "message_index", "role"])
        .add_columns(t.trajectory_messages.c["trainable", "num_logprobs"])
        .where(t.trajectory_messages.c.rollout_id == first_group.rollout_ids[0])
        .order_by(t.trajectory_messages.c.history_index, t.trajectory_messages.c.message_index),
    )
    if version == 2:
        assert isinstance(answer, Choice)
        assert [token.logprob for token in answer.logprobs.content] == [-0.25, -0.125, -1.5]
        assert first.additional_histories[0].tools == SUMMARIZE
        assert (first.initial_policy_version, first.final_policy_version) == (3, 4)
        assert messages == [
            (0, 0, "system", False, 0),
            (0, 1, "user", False, 0),
            (0, 2, "assistant", True, 1),
            (0, 3, "tool", False, 0),
            (0, 4, "assistant", True, 3),
            (1, 0, "user", False, 0),
            (1, 1, "assistant", True, 1),
        ]
    else:
        assert answer == {"role": "assistant", "content": "The answer is 4."}
        assert first.additional_histories == [] and first.initial_policy_version is None
        assert [row[3] for row in messages] == [False] * 5

    # Importing again writes nothing; the projections rebuild from the events alone.
    before = await count_events(store)
    again = await import_path(store, SAMPLES[version], run=f"v{version}")
    assert again.written_rollouts == 0 and await count_events(store) == before
    everything = select(t.trajectory_messages).order_by(*t.trajectory_messages.primary_key)
    projected = await rows(store, everything)
    await store.rebuild_projections()
    assert await rows(store, everything) == projected


def test_a_dry_run_of_a_run_that_names_no_base_model_needs_none(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    imported = cli("import", str(SAMPLES[2]), "--run", "v2", "--url", database_url)
    assert imported.exit_code == 0, imported.output
    options = ["--model", "on-v2", "--url", database_url]

    planned = cli("replay", "v2", "--dry-run", *options, "--format", "json")
    with_backend = cli(
        "replay", "v2", "--dry-run", *options, "--backend", "artstore.backends:check_only_backend"
    )
    training = cli("replay", "v2", *options, "--backend", "artstore.backends:check_only_backend")

    assert planned.exit_code == 0, planned.output  # a plan trains nothing: no base model needed
    assert [(row["status"], row["train_step"]) for row in json.loads(planned.stdout)] == [
        ("planned", 1),
        ("planned", 1),
    ]
    assert with_backend.exit_code == 0, with_backend.output
    assert "would train 2 groups in 1 step" in with_backend.stdout
    assert training.exit_code == 2  # training does need one
    assert one_line(training.stderr) == "error: run 'v2' names no base model: give --base-model"
    assert not (tmp_path / ".art" / "v2" / "models" / "on-v2" / "checkpoints").exists()


def test_a_format_2_import_is_trainable_by_replay(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # the CPU backend keeps its checkpoints in ./.art
    backend = "artstore.backends:check_only_backend"
    for version in (1, 2):
        result = cli("import", str(SAMPLES[version]), "--run", f"v{version}", "--url", database_url)
        assert result.exit_code == 0, result.output

    def replay(run: str):
        options = ["--base-model", "base", "--model", f"on-{run}", "--format", "json"]
        return cli("replay", run, "--backend", backend, *options, "--url", database_url)

    trained = replay("v2")
    assert trained.exit_code == 0, trained.output
    steps = json.loads(trained.stdout)
    assert [(row["status"], row["rewards"]) for row in steps] == [
        ("trained", [1.0, 0.0]),
        ("trained", [0.1, 0.7000000000000001]),
    ]
    # One train step, as the file's groups were logged by one step of `model.log`; the CPU
    # backend trained on the Choices' logprob tokens (it refuses a trajectory without).
    assert {row["train_step"] for row in steps} == {1}
    checkpoints = tmp_path / ".art" / "v2" / "models" / "on-v2" / "checkpoints"
    record = json.loads((checkpoints / "0001" / CHECKPOINT_FILE).read_text())
    assert record["metrics"]["num_trainable_tokens"] == 10.0
    assert not (checkpoints / "0002").exists()

    # Format 1 has no logprobs: the trainer refuses it, and nothing is consumed.
    refused = replay("v1")
    assert refused.exit_code == 1
    assert "no trainable Choice with logprobs" in one_line(refused.stderr)
    consumed = select(t.group_consumptions.c.model, func.count()).group_by(
        t.group_consumptions.c.model
    )

    async def consumption() -> list[tuple]:
        async with await artstore.open_store(database_url) as store:
            return await rows(store, consumed)

    assert asyncio.run(consumption()) == [("v2/on-v2", 2)]


async def test_exchanges_are_kept_whole_and_refused_only_where_art_cannot_hold_them(
    store, tmp_path: Path
):
    summary = await import_path(store, EXCHANGES_SAMPLE, run="ex")
    assert (summary.rollouts, summary.exchange_rollouts, summary.sealed_groups) == (2, 2, 1)
    from artstore.groups import sealed_groups

    ((group_id,),) = await rows(store, select(t.groups.c.group_id).where(t.groups.c.run == "ex"))
    ids = (await sealed_groups(store, [group_id]))[group_id].rollout_ids

    # Stored as the file holds them, on either ART.
    in_file = [
        json.loads(row["trajectory_json"])["exchanges"]
        for row in pq.read_table(EXCHANGES_SAMPLE).to_pylist()
    ]
    events = [
        TrajectoryImported.model_validate(e.data)
        for rid in ids
        for e in await store.read_stream(f"rollout-{rid}")
        if e.type == "trajectory.imported"
    ]
    bodies = await store.get_blobs(e.exchanges for e in events)
    by_hash = {digest: json.loads(body) for digest, body in bodies.items()}
    assert [by_hash[e.exchanges] for e in events] == in_file
    rewards = await rows(store, select(t.rewards.c["rollout_id", "scorer", "reward"]))
    by_rollout = {rollout_id: (scorer, reward) for rollout_id, scorer, reward in rewards}
    assert len(rewards) == 2
    assert [by_rollout[rid] for rid in ids] == [("imported", 1.0), ("imported", 0.0)]

    if has_exchanges():
        stored = await store.trajectories(ids, scorer="imported")
        (group,) = read_trajectory_groups_parquet(EXCHANGES_SAMPLE)
        for rid, trajectory in zip(ids, group.trajectories, strict=True):
            assert_same_trajectory(stored[rid], trajectory)
        assert stored[ids[0]].exchanges.chat_completions[0].response.choices[0].logprobs
        # A JSONL export keeps them too.
        await export_jsonl(store, "ex", tmp_path / "ex.jsonl")
        await import_path(store, tmp_path / "ex.jsonl", run="ex-copy")
        copies = await store.trajectories([derived_id("jsonl", "ex-copy", rid) for rid in ids])
        for rid in ids:
            assert_same_trajectory(copies[derived_id("jsonl", "ex-copy", rid)], stored[rid])
    else:
        # ART 0.5.18 has no Trajectory.exchanges: only building these trajectories is refused.
        with pytest.raises(ArtVersionError, match=r"openpipe-art >= 0\.5\.20") as refused:
            await store.trajectory(ids[0])
        assert f"rollout {ids[0]} holds ART's captured exchanges" in str(refused.value)
        assert "\n" not in str(refused.value)
        with pytest.raises(ArtVersionError):
            await export_jsonl(store, "ex", tmp_path / "ex.jsonl")
        assert not (tmp_path / "ex.jsonl").exists()
    # The projections (tables, views) need no ART: they rebuild on either.
    projected = (
        select(t.rollouts.c["rollout_id", "status", "imported"])
        .where(t.rollouts.c.run == "ex")
        .order_by(t.rollouts.c.rollout_id)
    )
    before = await rows(store, projected)
    await store.rebuild_projections()
    assert await rows(store, projected) == before == sorted((rid, "finished", True) for rid in ids)


def test_trajectory_imported_events_written_before_exchanges_still_decode():
    stored = {
        "rollout_id": "r",
        "source": "parquet",
        "path": "0001.parquet",
        "histories": [{"items": ["h"], "choices": [], "trainable": [0], "tools": None}],
        "initial_policy_version": None,
        "final_policy_version": None,
        "split": "train",
        "step": 1,
        "group_index": 0,
    }
    event = decode_event("trajectory.imported", stored)
    assert isinstance(event, TrajectoryImported) and event.exchanges is None
    from artstore.projections.imported import imported_trajectory

    trajectory = imported_trajectory(event, {"h": {"role": "user", "content": "hi"}})
    assert trajectory.messages_and_choices == [{"role": "user", "content": "hi"}]


# --- bad inputs: one line, exit code 1, nothing imported ------------------------------------


def broken(
    tmp_path: Path,
    version: int,
    *,
    row: int | None = None,
    declared: bytes | None = None,
    drop: str | None = None,
    **cells: Any,
) -> Path:
    """A copy of the sample of format `version` with some cells of `row`, the format the
    schema metadata declares, or a column (`drop`) changed; JSON cells may be objects."""
    table = pq.read_table(SAMPLES[version])
    if row is not None:
        rows_ = table.to_pylist()
        rows_[row].update(
            {k: json.dumps(v) if isinstance(v, dict) else v for k, v in cells.items()}
        )
        table = pa.Table.from_pylist(rows_, schema=table.schema)
    if declared is not None:
        table = table.replace_schema_metadata(
            {**table.schema.metadata, b"art.trajectory_parquet.version": declared}
        )
    if drop is not None:
        table = table.drop_columns([drop])
    path = tmp_path / f"broken-{len(list(tmp_path.glob('broken-*')))}.parquet"
    pq.write_table(table, path)
    return path


def test_bad_inputs_fail_with_one_line_and_import_nothing(database_url: str, tmp_path: Path):
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "other.parquet")
    (tmp_path / "fake.parquet").write_text("not parquet")
    stray = tmp_path / "tree" / "trajectories" / "train"
    stray.mkdir(parents=True)
    pq.write_table(pa.table({"a": [1]}), stray / "notes.parquet")
    (tmp_path / "notes.txt").write_text("hello")
    v2 = [json.loads(row["trajectory_json"]) for row in pq.read_table(SAMPLES[2]).to_pylist()]
    nested = {**v2[0], "metadata": {"tags": ["a", "b"]}}
    # (file, what its one-line error says after the file's name)
    malformed = [
        (
            broken(tmp_path, 2, row=1, trajectory_json='{"reward": 1.0,'),
            ", row 1: trajectory_json is not JSON",
        ),
        (
            broken(tmp_path, 2, row=2, trajectory_json="[1, 2]"),
            ", row 2: trajectory_json is a JSON list, not an object",
        ),
        (
            broken(tmp_path, 2, row=3, format_version=3),
            ": ART trajectory parquet format 3 (row 3, column format_version), which this "
            "artstore does not read (it reads formats 1 and 2)",
        ),
        (
            broken(tmp_path, 2, declared=b"3"),
            ": ART trajectory parquet format 3 (schema metadata art.trajectory_parquet.version)",
        ),
        (
            broken(tmp_path, 2, row=0, trajectory_json={**v2[0], "surprise": 1}),
            ", row 0: trajectory_json surprise: a field this artstore does not know",
        ),
        (
            broken(tmp_path, 2, row=0, trajectory_json=nested),
            ", row 0: trajectory_json metadata: value of 'tags' is a list",
        ),
        (
            broken(tmp_path, 2, row=1, trajectory_json='{"reward": NaN}'),
            ", row 1: trajectory_json reward: Input should be a finite number",
        ),
        (
            broken(tmp_path, 2, row=0, trajectory_json={"exchanges": {"chat_completions": "x"}}),
            ", row 0: trajectory_json exchanges: ",
        ),
        (
            broken(tmp_path, 2, row=1, trajectory_index=0),
            ", row 1: trajectory_index 0 of group 0 is given twice",
        ),
        (broken(tmp_path, 2, row=0, group_json="{"), ", row 0: group_json is not JSON"),
        (
            broken(tmp_path, 2, row=1, group_json="{}"),
            ", row 1: group_json differs from row 0's, of the same group 0",
        ),
        (
            broken(tmp_path, 2, drop="trajectory_json"),
            ": not an ART trajectory parquet file of format 2 (no column trajectory_json",
        ),
        (
            broken(tmp_path, 1, row=2, reward=float("nan")),
            ", row 2: reward is nan, not a finite number",
        ),
    ]
    cases = [
        *((["import", str(path)], f"{path}{message}") for path, message in malformed),
        (["import", str(tmp_path / "missing.parquet")], "no such file or directory"),
        (["import", str(tmp_path / "other.parquet")], "not an ART trajectory parquet file"),
        (["import", str(tmp_path / "fake.parquet")], "not a parquet file"),
        (["import", str(tmp_path / "tree")], "not in ART's layout"),
        (["import", str(tmp_path / "notes.txt")], "artstore imports ART trajectory parquet"),
        (["export", "nope", str(tmp_path / "out")], "no run 'nope' in this store"),
    ]
    for args, message in cases:
        result = cli(*args, "--url", database_url)
        assert result.exit_code == 1, (args, result.output)
        assert message in one_line(result.stderr), (args, result.stderr)
        assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr

    async def nothing_written() -> None:
        async with await artstore.open_store(database_url) as store:
            assert await count_events(store) == 0

    asyncio.run(nothing_written())
