"""Exports of a dataset version in the formats trainers load.

- `openai`: OpenAI's chat fine-tuning JSONL, a line per history of each trajectory:
  `messages` (with `tool_calls` and `tool_call_id`) and `tools`; an assistant turn the
  model did not produce in the rollout (given in the prompt, not trained by ART) has
  `weight: 0`, one it produced `weight: 1`.
- `hf-sft`, `hf-dpo`, `hf-kto`: Hugging Face `datasets` parquet shards under
  `PATH/data/` plus a dataset card `PATH/README.md`, in TRL's conversational formats:
  `messages` (SFT); `prompt`, `chosen`, `rejected` (DPO: in each group the best rollout
  against the worst by the dataset's scorer, when their rewards differ by at least
  `min_margin`); `prompt`, `completion`, `label` (KTO: a rollout above its group's mean
  reward is desirable, one below it is not; groups without spread are left out).
- `art`: ART's own trajectory parquet (`art.utils.trajectory_logging`), shards of whole
  groups under `PATH/`, read back with `read_trajectory_groups_parquet`.

Every export streams: trajectories are rebuilt a page at a time (whole groups for the
formats that pair or group them) and written before the next page is read, so memory
stays flat however large the dataset. It writes the named path only: a file, or a
directory, written under a temporary name beside it and renamed into place when complete.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.art_api import art_module, trajectory_group_class
from artstore.datasets.selection import CHUNK, Dataset
from artstore.errors import ExportTargetError, InvalidArgumentError, NotFoundError
from artstore.exchange.files import existing_file, written_in_place
from artstore.schema import tables as t

if TYPE_CHECKING:
    from artstore.store import Store

FORMATS = ("openai", "hf-sft", "hf-dpo", "hf-kto", "art")
PAGE = 64  # trajectories rebuilt at once
SHARD_ROWS = 10_000  # rows per parquet shard
Progress = Callable[[int], None]


@dataclass
class ExportSummary:
    dataset: str
    format: str
    path: str
    rollouts: int = 0
    rows: int = 0
    files: list[str] = field(default_factory=list)
    left_out: int = 0  # rollouts in no row (DPO/KTO: groups without a pair or spread)


# --- messages -------------------------------------------------------------------------------


def _get(value: Any, name: str) -> Any:
    if value is None:
        return None
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content
        )
    return json.dumps(content, ensure_ascii=False)


def _tool_calls(message: Any) -> list[dict[str, Any]] | None:
    calls = _get(message, "tool_calls")
    if not calls:
        return None
    shown = []
    for call in calls:
        function = _get(call, "function")
        arguments = _get(function, "arguments")
        shown.append(
            {
                "id": _get(call, "id"),
                "type": "function",
                "function": {
                    "name": _get(function, "name"),
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    return shown


def chat_message(item: Any) -> tuple[dict[str, Any], bool]:
    """An item of `messages_and_choices` as an OpenAI chat message, and whether the model
    produced it in the rollout (a `Choice`: what ART trains)."""
    produced = _get(item, "message") is not None and _get(item, "finish_reason") is not None
    message = _get(item, "message") if produced else item
    out: dict[str, Any] = {"role": _get(message, "role") or "assistant"}
    out["content"] = _text(_get(message, "content"))
    calls = _tool_calls(message)
    if calls:
        out["tool_calls"] = calls
    if _get(message, "tool_call_id") is not None:
        out["tool_call_id"] = _get(message, "tool_call_id")
    if _get(message, "name") and out["role"] != "tool":
        out["name"] = _get(message, "name")
    return out, produced


def histories(trajectory: Any) -> Iterator[tuple[list[Any], Any]]:
    """(messages_and_choices, tools) of the trajectory and of its additional histories."""
    yield trajectory.messages_and_choices, trajectory.tools
    for history in getattr(trajectory, "additional_histories", None) or []:
        yield history.messages_and_choices, history.tools


def openai_lines(trajectory: Any) -> Iterator[dict[str, Any]]:
    for items, tools in histories(trajectory):
        messages = []
        for item in items:
            message, produced = chat_message(item)
            if message["role"] == "assistant":
                message["weight"] = 1 if produced else 0
            messages.append(message)
        line: dict[str, Any] = {"messages": messages}
        if tools:
            line["tools"] = list(tools)
        yield line


def _hf_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message in the one struct type every parquet row shares."""
    return {
        "role": message["role"],
        "content": message["content"],
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": c["function"]}
            for c in message.get("tool_calls", [])
        ]
        or None,
        "tool_call_id": message.get("tool_call_id"),
    }


def split_prompt(trajectory: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The trajectory's messages before the model's first turn (the prompt), and the rest."""
    items = [chat_message(item) for item in trajectory.messages_and_choices]
    first = next((i for i, (_, produced) in enumerate(items) if produced), len(items))
    prompt = [_hf_message(m) for m, _ in items[:first]]
    return prompt, [_hf_message(m) for m, _ in items[first:]]


# --- reading a dataset a page at a time ---------------------------------------------------


async def _groups_of(store: Store, rollout_ids: list[str]) -> dict[str, str | None]:
    ro = t.rollouts
    found: dict[str, str | None] = {}
    async with store.database.read() as connection:
        for start in range(0, len(rollout_ids), CHUNK):
            rows = await connection.execute(
                select(ro.c.rollout_id, ro.c.group_id).where(
                    ro.c.rollout_id.in_(rollout_ids[start : start + CHUNK])
                )
            )
            found.update({row.rollout_id: row.group_id for row in rows})
    return found


async def grouped_pages(
    store: Store, dataset: Dataset
) -> AsyncIterator[list[tuple[str | None, list[tuple[str, Any]]]]]:
    """Pages of whole groups: [(group id, [(rollout id, trajectory)])], about PAGE
    trajectories a page, the dataset's own order within each group."""
    groups_of = await _groups_of(store, dataset.rollout_ids)
    by_group: dict[str | None, list[str]] = {}
    for rid in dataset.rollout_ids:
        by_group.setdefault(groups_of.get(rid) or rid, []).append(rid)
    page: list[tuple[str | None, list[str]]] = []

    async def built(entries: list[tuple[str | None, list[str]]]) -> list[Any]:
        ids = [rid for _, members in entries for rid in members]
        trajectories = await store.trajectories(ids, scorer=dataset.scorer)
        return [(g, [(rid, trajectories[rid]) for rid in members]) for g, members in entries]

    for group_id, members in by_group.items():
        page.append((group_id, members))
        if sum(len(m) for _, m in page) >= PAGE:
            yield await built(page)
            page = []
    if page:
        yield await built(page)


# --- writing --------------------------------------------------------------------------------


@contextmanager
def written_directory(path: Path, force: bool) -> Iterator[Path]:
    """A new directory beside `path`, renamed to `path` when the block ends without error."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ExportTargetError(f"{path} is not a directory; nothing was written")
    if path.exists() and any(path.iterdir()) and not force:
        raise FileExistsError(
            f"{path} is not empty; nothing was written (choose a new directory, or --force)"
        )
    partial = path.with_name(f".{path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=False)
    except OSError as exc:
        raise ExportTargetError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield partial
        if path.exists():
            shutil.rmtree(path)
        partial.rename(path)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


class ShardWriter:
    """Rows into `data/train-NNNNN.parquet` shards of at most SHARD_ROWS rows."""

    def __init__(self, folder: Path, schema: Any) -> None:
        self.folder, self.schema = folder / "data", schema
        self.folder.mkdir()
        self.writer: Any = None
        self.in_shard = 0
        self.files: list[Path] = []

    def write(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        while rows:
            if self.writer is None:
                self.files.append(self.folder / f"train-{len(self.files):05d}.parquet")
                self.writer = pq.ParquetWriter(self.files[-1], self.schema)
                self.in_shard = 0
            taken = rows[: SHARD_ROWS - self.in_shard]
            rows = rows[len(taken) :]
            self.writer.write_table(pa.Table.from_pylist(taken, schema=self.schema))
            self.in_shard += len(taken)
            if self.in_shard >= SHARD_ROWS:
                self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _schemas() -> dict[str, Any]:
    import pyarrow as pa

    function = pa.struct([("name", pa.string()), ("arguments", pa.string())])
    call = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", function)])
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
        ]
    )
    messages = pa.list_(message)
    return {
        "hf-sft": pa.schema(
            [
                ("messages", messages),
                ("rollout_id", pa.string()),
                ("group_id", pa.string()),
                ("reward", pa.float64()),
            ]
        ),
        "hf-dpo": pa.schema(
            [
                ("prompt", messages),
                ("chosen", messages),
                ("rejected", messages),
                ("group_id", pa.string()),
                ("chosen_rollout_id", pa.string()),
                ("rejected_rollout_id", pa.string()),
                ("chosen_reward", pa.float64()),
                ("rejected_reward", pa.float64()),
            ]
        ),
        "hf-kto": pa.schema(
            [
                ("prompt", messages),
                ("completion", messages),
                ("label", pa.bool_()),
                ("rollout_id", pa.string()),
                ("group_id", pa.string()),
                ("reward", pa.float64()),
            ]
        ),
    }


def sft_rows(group_id: Any, members: list[tuple[str, Any]], rewards: dict[str, float]) -> list:
    rows = []
    for rid, trajectory in members:
        prompt, rest = split_prompt(trajectory)
        row = {"messages": prompt + rest, "rollout_id": rid, "group_id": group_id}
        rows.append(row | {"reward": rewards.get(rid)})
    return rows


def dpo_rows(
    group_id: Any, members: list[tuple[str, Any]], rewards: dict[str, float], min_margin: float
) -> list:
    scored = [(rewards[rid], rid, trajectory) for rid, trajectory in members if rid in rewards]
    if len(scored) < 2:
        return []
    # Stable: among equal rewards the dataset's first rollout is the best, its last the worst.
    best = max(scored, key=lambda s: s[0])
    worst = min(reversed(scored), key=lambda s: s[0])
    if best[0] - worst[0] < min_margin or best[0] == worst[0]:
        return []
    prompt, chosen = split_prompt(best[2])
    _, rejected = split_prompt(worst[2])
    return [
        {
            "prompt": prompt,
            "chosen": chosen,
            "rejected": rejected,
            "group_id": group_id,
            "chosen_rollout_id": best[1],
            "rejected_rollout_id": worst[1],
            "chosen_reward": best[0],
            "rejected_reward": worst[0],
        }
    ]


def kto_rows(group_id: Any, members: list[tuple[str, Any]], rewards: dict[str, float]) -> list:
    scored = [(rewards[rid], rid, trajectory) for rid, trajectory in members if rid in rewards]
    if not scored:
        return []
    mean = sum(s[0] for s in scored) / len(scored)
    rows = []
    for reward, rid, trajectory in scored:
        if reward == mean:  # no spread, or exactly average: neither good nor bad
            continue
        prompt, completion = split_prompt(trajectory)
        rows.append(
            {
                "prompt": prompt,
                "completion": completion,
                "label": reward > mean,
                "rollout_id": rid,
                "group_id": group_id,
                "reward": reward,
            }
        )
    return rows


def dataset_card(dataset: Dataset, fmt: str, summary: ExportSummary) -> str:
    columns = {
        "hf-sft": "`messages` (TRL's conversational language modeling)",
        "hf-dpo": "`prompt`, `chosen`, `rejected` (TRL's conversational preference format)",
        "hf-kto": "`prompt`, `completion`, `label` (TRL's conversational unpaired preference)",
    }[fmt]
    selection = json.dumps(dataset.selection, ensure_ascii=False, sort_keys=True)
    return (
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        '    path: "data/train-*.parquet"\n---\n\n'
        f"# {dataset.name}@{dataset.version}\n\n"
        f"Exported by artstore as `{fmt}`: {summary.rows} rows from {summary.rollouts} "
        f"rollouts, with the columns {columns}.\n\n"
        f"- run: {dataset.run}\n- scorer: {dataset.scorer}\n- selection: `{selection}`\n"
        f"- content digest: `{dataset.digest}`\n- created: {dataset.created_at}\n"
    )


# --- the exports ----------------------------------------------------------------------------


async def export_dataset(
    store: Store,
    dataset: Dataset,
    fmt: str,
    out: str | Path,
    *,
    min_margin: float = 0.0,
    force: bool = False,
    on_rollouts: Progress | None = None,
) -> ExportSummary:
    """Write `dataset` as `fmt` (one of FORMATS) at `out`; see the module's docstring."""
    if fmt not in FORMATS:
        raise InvalidArgumentError("format", f"must be one of {', '.join(FORMATS)}, not {fmt!r}")
    out = Path(out)
    summary = ExportSummary(dataset=f"{dataset.name}@{dataset.version}", format=fmt, path=str(out))
    advance = on_rollouts or (lambda n: None)
    if fmt == "openai":
        if existing_file(out) is not None and not force:
            raise FileExistsError(f"{out} exists; nothing was written (pass --force to overwrite)")
        await _export_openai(store, dataset, out, summary, advance)
        return summary
    with written_directory(out, force) as folder:
        if fmt == "art":
            await _export_art(store, dataset, folder, summary, advance)
        else:
            await _export_hf(store, dataset, fmt, folder, summary, advance, min_margin)
    summary.files = [str(out / Path(f).relative_to(folder)) for f in summary.files]
    return summary


async def _export_openai(
    store: Store, dataset: Dataset, out: Path, summary: ExportSummary, advance: Progress
) -> None:
    with written_in_place(out) as partial, open(partial, "w", encoding="utf-8") as handle:
        async for page in grouped_pages(store, dataset):
            for _, members in page:
                for _, trajectory in members:
                    for line in openai_lines(trajectory):
                        handle.write(json.dumps(line, ensure_ascii=False) + "\n")
                        summary.rows += 1
                summary.rollouts += len(members)
                advance(len(members))
    summary.files = [str(out)]


async def _export_hf(
    store: Store,
    dataset: Dataset,
    fmt: str,
    folder: Path,
    summary: ExportSummary,
    advance: Progress,
    min_margin: float,
) -> None:
    writer = ShardWriter(folder, _schemas()[fmt])
    rewards = dataset.rewards
    try:
        async for page in grouped_pages(store, dataset):
            rows = []
            for group_id, members in page:
                if fmt == "hf-sft":
                    made = sft_rows(group_id, members, rewards)
                elif fmt == "hf-dpo":
                    made = dpo_rows(group_id, members, rewards, min_margin)
                else:
                    made = kto_rows(group_id, members, rewards)
                used = {r.get("rollout_id") for r in made} | {
                    r.get(k) for r in made for k in ("chosen_rollout_id", "rejected_rollout_id")
                }
                summary.left_out += sum(1 for rid, _ in members if rid not in used)
                rows.extend(made)
                summary.rollouts += len(members)
                advance(len(members))
            summary.rows += len(rows)
            writer.write(rows)
    finally:
        writer.close()
    if not summary.rows:  # (a shard without rows is one `datasets` cannot load)
        why = {
            "hf-dpo": f"no group has two rollouts a reward margin of {min_margin} apart",
            "hf-kto": "no rollout's reward differs from its group's mean",
        }.get(fmt, "no rollout")
        raise NotFoundError(f"{summary.dataset} gives no {fmt} row ({why}); nothing was written")
    summary.files = [str(f) for f in writer.files] + [str(folder / "README.md")]
    (folder / "README.md").write_text(dataset_card(dataset, fmt, summary), encoding="utf-8")


async def _export_art(
    store: Store, dataset: Dataset, folder: Path, summary: ExportSummary, advance: Progress
) -> None:
    async for page in grouped_pages(store, dataset):
        groups = []
        for group_id, members in page:
            trajectories = []
            for rid, trajectory in members:
                if rid in dataset.rewards:
                    trajectory.reward = dataset.rewards[rid]
                trajectories.append(trajectory)
            metadata = {"group_id": group_id, "dataset": f"{dataset.name}@{dataset.version}"}
            groups.append(trajectory_group_class()(trajectories, metadata=metadata))
            summary.rollouts += len(members)
            summary.rows += len(members)
            advance(len(members))
        path = folder / f"train-{len(summary.files):05d}.parquet"
        art_module("utils.trajectory_logging").write_trajectory_groups_parquet(groups, path)
        summary.files.append(str(path))
