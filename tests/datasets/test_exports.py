"""Exports of a dataset, each loaded by its consumer's own code.

- `openai`: `datasets.load_dataset("json", ...)` reads the chat fine-tuning lines, with
  tools, tool calls and `weight` (0 on an assistant turn the model did not produce);
- `hf-sft`, `hf-dpo`, `hf-kto`: `datasets.load_dataset(PATH)` reads the shards through
  the dataset card's configuration, in TRL's conversational columns;
- `art`: ART's own `read_trajectory_groups_parquet` gives back the trajectories.

Exports stream (a page of trajectories at a time, shards of bounded rows) and write only
the path they are given. On SQLite and PostgreSQL, on tests/support/recorded_run.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import art
import datasets
import pytest
from art.utils.trajectory_logging import read_trajectory_groups_parquet
from command_line import run_artstore_in_thread
from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from recorded_run import RUN, record_run

from artstore.datasets import Selection, create_dataset
from artstore.datasets import export as exports
from artstore.datasets.export import export_dataset, openai_lines
from artstore.errors import NotFoundError

datasets.disable_progress_bars()


def loaded(path: Path) -> list[dict]:
    return list(datasets.load_dataset(str(path), split="train", cache_dir=str(path.parent / "c")))


async def made(store):
    await record_run(store)
    return await create_dataset(store, "everything", Selection(run=RUN))


async def test_the_hugging_face_exports_load_in_trls_columns(store, tmp_path):
    dataset = await made(store)
    await export_dataset(store, dataset, "hf-sft", tmp_path / "sft")
    sft = loaded(tmp_path / "sft")
    assert [row["rollout_id"] for row in sft] == ["r0a", "r0b", "r1a", "r2a", "r2b"]
    first = sft[0]["messages"]
    assert [m["role"] for m in first] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant",
    ]  # fmt: skip
    assert first[2]["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "2+2"}'}
    assert first[3]["tool_call_id"] == first[2]["tool_calls"][0]["id"]
    assert first[-1]["content"] == "4"
    assert "data/train-*.parquet" in (tmp_path / "sft" / "README.md").read_text()

    dpo = await export_dataset(store, dataset, "hf-dpo", tmp_path / "dpo")
    (pair,) = loaded(tmp_path / "dpo")  # g0 only: g1 has one rollout, g2 no spread
    assert (pair["chosen_rollout_id"], pair["rejected_rollout_id"]) == ("r0a", "r0b")
    assert (pair["chosen_reward"], pair["rejected_reward"]) == (1.0, 0.25)
    assert [m["role"] for m in pair["prompt"]] == ["system", "user"]
    assert pair["chosen"][-1]["content"] == "4" and pair["rejected"][0]["role"] == "assistant"
    assert dpo.left_out == 3
    with pytest.raises(NotFoundError, match=r"margin of 0\.8 apart"):
        await export_dataset(store, dataset, "hf-dpo", tmp_path / "wide", min_margin=0.8)
    assert not (tmp_path / "wide").exists()

    await export_dataset(store, dataset, "hf-kto", tmp_path / "kto")
    kto = loaded(tmp_path / "kto")
    assert [(row["rollout_id"], row["label"]) for row in kto] == [("r0a", True), ("r0b", False)]
    assert kto[0]["prompt"] == pair["prompt"] and kto[0]["completion"] == pair["chosen"]


async def test_the_openai_export_loads_as_json_lines_with_weights_and_tools(store, tmp_path):
    dataset = await made(store)
    out = tmp_path / "chat.jsonl"
    summary = await export_dataset(store, dataset, "openai", out)
    assert summary.rows == 5 and summary.files == [str(out)]
    rows = list(datasets.load_dataset("json", data_files=str(out), split="train"))
    assert len(rows) == 5
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [t["function"]["name"] for t in lines[0]["tools"]] == ["search", "calculator"]
    assistant = [m for m in lines[0]["messages"] if m["role"] == "assistant"]
    assert [m["weight"] for m in assistant] == [1, 1, 1]
    assert all("weight" not in m for m in lines[0]["messages"] if m["role"] != "assistant")


def test_an_assistant_turn_the_model_did_not_produce_has_weight_0():
    produced = Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content="6"),
    )
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "2"},  # an example given in the prompt
            {"role": "user", "content": "3+3?"},
            produced,
        ],
        reward=1.0,
    )
    (line,) = openai_lines(trajectory)
    assert [(m["role"], m.get("weight")) for m in line["messages"]] == [
        ("user", None),
        ("assistant", 0),
        ("user", None),
        ("assistant", 1),
    ]


async def test_the_art_export_reads_back_with_arts_reader(store, tmp_path):
    dataset = await made(store)
    await export_dataset(store, dataset, "art", tmp_path / "art")
    groups = [
        g for f in sorted((tmp_path / "art").iterdir()) for g in read_trajectory_groups_parquet(f)
    ]
    assert [g.metadata["group_id"] for g in groups] == ["g0", "g1", "g2"]
    read = {id(t): t for g in groups for t in g.trajectories}
    assert sorted(t.reward for t in read.values()) == [0.25, 0.5, 1.0, 1.0, 1.0]
    own = await store.trajectory("r0a", scorer="correct")
    assert len(groups[0].trajectories[0].messages_and_choices) == len(own.messages_and_choices)


async def test_an_export_streams_pages_into_shards_and_writes_only_its_path(
    store, tmp_path, monkeypatch
):
    dataset = await made(store)
    monkeypatch.setattr(exports, "PAGE", 2)
    monkeypatch.setattr(exports, "SHARD_ROWS", 2)
    asked: list[int] = []
    rebuild = store.trajectories

    async def counted(ids, **options):
        asked.append(len(ids))
        return await rebuild(ids, **options)

    monkeypatch.setattr(store, "trajectories", counted)
    out = tmp_path / "out" / "sft"
    out.parent.mkdir()
    summary = await export_dataset(store, dataset, "hf-sft", out)
    assert max(asked) <= 3 and sum(asked) == 5  # whole groups, about PAGE at a time
    assert sorted(p.name for p in (out / "data").iterdir()) == [
        "train-00000.parquet",
        "train-00001.parquet",
        "train-00002.parquet",
    ]
    assert len(summary.files) == 4 and len(loaded(out)) == 5
    assert sorted(p.name for p in out.parent.iterdir()) == ["c", "sft"]
    with pytest.raises(FileExistsError, match="is not empty; nothing was written"):
        await export_dataset(store, dataset, "hf-sft", out)
    (tmp_path / "taken.jsonl").write_text("kept\n")
    with pytest.raises(FileExistsError, match="exists; nothing was written"):
        await export_dataset(store, dataset, "openai", tmp_path / "taken.jsonl")
    assert (tmp_path / "taken.jsonl").read_text() == "kept\n"
    await export_dataset(store, dataset, "openai", tmp_path / "taken.jsonl", force=True)
    assert len((tmp_path / "taken.jsonl").read_text().splitlines()) == 5


async def test_the_export_command(database_url, tmp_path):
    url = ("--url", database_url)
    done = await run_artstore_in_thread("dataset", "create", "top", "--run", RUN, *url)
    assert done.exit_code == 1 and "no run 'arith-001'" in done.stderr  # one line
    import artstore

    async with await artstore.open_store(database_url) as store:
        await record_run(store)
    made = await run_artstore_in_thread(
        "dataset", "create", "top", "--run", RUN, "--top-k", "1", *url
    )
    assert made.exit_code == 0, made.stderr
    out = tmp_path / "dpo"
    done = await run_artstore_in_thread(
        "dataset", "export", "top@1", "--format", "hf-sft", "--out", out, *url
    )
    assert done.exit_code == 0, done.stderr
    assert "wrote 3 rows from 3 rollouts of top@1 as hf-sft" in done.stdout
    refused = await run_artstore_in_thread(
        "dataset", "export", "top", "--format", "csv", "--out", tmp_path / "x", *url
    )
    assert refused.exit_code == 1 and "must be one of openai" in refused.stderr
    assert not (tmp_path / "x").exists()
