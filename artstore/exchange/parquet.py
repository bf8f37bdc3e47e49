"""ART's trajectory parquet files: export a run into them, import them into the store.

The layout is the one `art.Model.log` writes, `trajectories/<split>/<step:04d>.parquet`,
one row per trajectory (columns of `art.utils.trajectory_logging`), written by ART's own
`write_trajectory_groups_parquet` and readable by its `read_trajectory_groups_parquet`.

Export (`export_parquet`), per sealed group of the run:

| split            | file number                            | what                              |
|------------------|----------------------------------------|-----------------------------------|
| `train`          | the step after the train step that     | the group's policy trajectories   |
|                  | consumed the group (as `model.log`)    |                                   |
| `val`            | the same step                          | its validation-model trajectories |
| `unconsumed`     | the group's batch index in the run     | policy trajectories never trained |
| `unconsumed_val` | the same batch index                   | their validation trajectories     |

Rewards are the latest of one scorer (the run's by default); groups without a reward by it,
failed rollouts and unsealed groups are left out. The parquet keeps no logprobs, no
additional histories and no policy versions (ART's format): use the JSONL export to keep
everything.

Import (`read_parquet`): every row becomes an imported rollout; rows of one `group_index`
one group, rewarded under a scorer (`imported` by default). Groups of the `train` and
`unconsumed` splits are sealed with policy rollouts; other splits (`val`, ...) become
validation rollouts in groups that are rewarded but never sealed, so no replay trains them.
Message dicts come back as ART's reader returns them (trainable turns too, since the parquet
holds no logprobs; the flag is kept in the event), and each trajectory's `tools` are kept
(ART's reader drops them). Group metrics and group logs are not kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artstore.errors import ExchangeFormatError, NotFoundError
from artstore.events import GroupSealed, RewardsRecorded, RunImported
from artstore.exchange.importer import (
    History,
    ImportedGroup,
    ImportedRollout,
    ImportPlan,
    derived_id,
    file_sha256,
)
from artstore.exchange.source import ExportSummary, GroupOutline, load_run

if TYPE_CHECKING:
    import art

    from artstore.store import Store

ART_COLUMNS = (
    "group_index",
    "group_metadata",
    "group_metrics",
    "group_logs",
    "reward",
    "metrics",
    "metadata",
    "tools",
    "logs",
    "messages",
)
REQUIRED_COLUMNS = ("reward", "messages")
MESSAGE_FIELDS = ("role", "content")
POLICY_SPLITS = ("train", "unconsumed")


# --- export -------------------------------------------------------------------------------


def step_file(out: Path, split: str, number: int) -> Path:
    return out / "trajectories" / split / f"{number:04d}.parquet"


async def export_parquet(
    store: Store,
    run: str,
    out: str | Path,
    *,
    scorer: str | None = None,
    model: str | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write `run` as ART trajectory parquet files under `out` (see the module's docstring).

    `model` ("project/name") chooses whose train steps number the files (the run's own
    trained model by default, e.g. another model that replayed the run). Existing files are
    refused unless `force`.
    """
    from artstore.training.groups import scored_rollouts

    out = Path(out)
    outline = await load_run(store, run)
    scorer = scorer or outline.info.scorer
    summary = ExportSummary(run=run, path=str(out), running_rollouts=outline.skipped_running)
    files: dict[tuple[str, int], list[tuple[GroupOutline, list[str]]]] = {}
    for group in outline.groups:
        if group.sealed is None:
            summary.unsealed_groups += group.group_id is not None
            continue
        step = outline.own_step(group, model)
        train, val = ("train", "val") if step is not None else ("unconsumed", "unconsumed_val")
        number = step if step is not None else (group.batch or 0)
        finished = [rid for rid in group.rollout_ids if group.statuses[rid] == "finished"]
        summary.failed_rollouts += len(group.rollout_ids) - len(finished)
        policy = [rid for rid in finished if group.roles[rid] == "policy"]
        validation = [rid for rid in finished if group.roles[rid] != "policy"]
        for split, ids in ((train, policy), (val, validation)):
            if ids:
                files.setdefault((split, number), []).append((group, ids))
    targets = {key: step_file(out, *key) for key in files}
    existing = [path for path in targets.values() if path.exists()]
    if existing and not force:
        raise FileExistsError(
            f"{existing[0]} exists ({len(existing)} of the files to write do); nothing was "
            "written (choose an empty directory, or pass --force to overwrite)"
        )
    all_ids = [rid for entries in files.values() for _, ids in entries for rid in ids]
    scored = await scored_rollouts(store, all_ids, scorer)
    # A group is left out whole (policy and validation files) when one of its rollouts has
    # no reward by the scorer: ART trains groups, and a group's rewards go together.
    unscored = {
        g.group_id
        for entries in files.values()
        for g, ids in entries
        if any(rid not in scored for rid in ids)
    }
    for key in sorted(files):
        entries = [(g, ids) for g, ids in files[key] if g.group_id not in unscored]
        if not entries:
            continue
        trajectories = await store.trajectories(
            [rid for _, ids in entries for rid in ids], scorer=scorer
        )
        groups = [_art_group(run, g, [trajectories[rid] for rid in ids]) for g, ids in entries]
        _write_groups(groups, targets[key])
        summary.files.append(str(targets[key]))
        summary.trajectories += sum(len(ids) for _, ids in entries)
    summary.groups = len({g.group_id for e in files.values() for g, _ in e} - unscored)
    summary.unscored_groups = len(unscored)
    return summary


def _art_group(run: str, group: GroupOutline, trajectories: list) -> art.TrajectoryGroup:
    import art

    sealed = group.sealed
    assert sealed is not None
    metadata = {"group_id": group.group_id, "run": run, "scenario_index": sealed.scenario_index}
    return art.TrajectoryGroup(
        trajectories, metadata={k: v for k, v in metadata.items() if v is not None}
    )


def _write_groups(groups: list, path: Path) -> None:
    """ART's own writer, into a temporary file renamed into place (never a half file)."""
    from art.utils.trajectory_logging import write_trajectory_groups_parquet

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        write_trajectory_groups_parquet(groups, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


# --- import -------------------------------------------------------------------------------


@dataclass
class ParquetFile:
    path: Path
    split: str
    step: int | None
    project: str | None  # from `<project>/models/<name>/trajectories/...`, when so laid out
    model: str | None


def find_files(path: Path) -> list[ParquetFile]:
    """The trajectory files at `path`: one file, or every `trajectories/<split>/<step>.parquet`
    under a directory (anything else there is an error)."""
    if not path.exists():
        raise NotFoundError(f"{path}: no such file or directory")
    if path.is_file():
        return [_located(path, strict=False)]
    found = sorted(path.rglob("*.parquet"))
    if not found:
        raise ExchangeFormatError(
            f"{path}: no parquet file in this directory (ART writes "
            "<project>/models/<name>/trajectories/<split>/<step>.parquet)"
        )
    return [_located(file, strict=True) for file in found]


def _located(file: Path, *, strict: bool) -> ParquetFile:
    parents = file.absolute().parents
    in_layout = len(parents) > 1 and parents[1].name == "trajectories" and file.stem.isdigit()
    if strict and not in_layout:
        raise ExchangeFormatError(
            f"{file}: not in ART's layout trajectories/<split>/<step>.parquet; nothing was "
            "imported (import the file alone, or a directory that holds only ART's files)"
        )
    project = model = None
    if in_layout and len(parents) > 4 and parents[3].name == "models":
        project, model = parents[4].name, parents[2].name
    return ParquetFile(
        path=file,
        split=file.parent.name if in_layout else "train",
        step=int(file.stem) if file.stem.isdigit() else None,
        project=project,
        model=model,
    )


def default_run(path: Path, files: list[ParquetFile]) -> str:
    """`<project>/<name>` of the model whose files these are, else the path's name."""
    models = sorted({f"{f.project}/{f.model}" for f in files if f.model})
    if len(models) > 1:
        raise ExchangeFormatError(
            f"{path} holds the trajectories of {len(models)} models ({', '.join(models)}); "
            "import each model's directory, or pass --run NAME to import them into one run"
        )
    if models and all(f.model for f in files):
        return models[0]
    return path.absolute().stem if path.is_file() else path.absolute().name


def read_table(file: Path) -> list[dict[str, Any]]:
    """The rows of one ART trajectory parquet file, or ExchangeFormatError."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        raise ExchangeFormatError(f"{file}: not a parquet file ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    messages = table.schema.field("messages").type if "messages" in table.column_names else None
    if (
        not missing
        and messages is not None
        and not (
            pa.types.is_list(messages)
            and pa.types.is_struct(messages.value_type)
            and all(messages.value_type.get_field_index(f) >= 0 for f in MESSAGE_FIELDS)
        )
    ):
        missing = ["messages (a list of {role, content, ...} structs)"]
    if missing:
        raise ExchangeFormatError(
            f"{file}: not an ART trajectory parquet file (no column {', '.join(missing)}; "
            f"ART writes {', '.join(ART_COLUMNS)}); nothing was imported"
        )
    return table.to_pylist()


def _json(value: Any, file: Path, row: int, column: str) -> Any:
    if value is None or value == "":
        return None
    try:
        return json.loads(value)
    except (TypeError, ValueError) as exc:
        raise ExchangeFormatError(f"{file}, row {row}: {column} is not JSON ({exc})") from None


def _message(flat: dict[str, Any], file: Path, row: int) -> dict[str, Any]:
    """A message dict as ART's reader rebuilds it (`_unflatten_message`)."""
    message = {"role": flat.get("role"), "content": flat.get("content")}
    if flat.get("tool_calls"):
        message["tool_calls"] = _json(flat["tool_calls"], file, row, "tool_calls")
    if flat.get("tool_call_id"):
        message["tool_call_id"] = flat["tool_call_id"]
    return message


def _scalars(values: dict[str, Any] | None) -> dict[str, Any]:
    """Group metadata as a sealed group keeps it: scalars, anything else as JSON text."""
    return {
        key: value
        if value is None or isinstance(value, (str, int, float, bool))
        else json.dumps(value)
        for key, value in (values or {}).items()
    }


def read_parquet(
    path: str | Path, *, run: str | None = None, scorer: str = "imported"
) -> ImportPlan:
    """The import plan of ART trajectory parquet files (see the module's docstring)."""
    path = Path(path)
    files = find_files(path)
    run = run or default_run(path, files)
    digests = {file.path: file_sha256(file.path) for file in files}
    first = next((f for f in files if f.model), None)
    groups: list[ImportedGroup] = []
    for file in files:
        groups.extend(_file_groups(file, digests[file.path], run, scorer))
    plan_key = hashlib.sha256("".join(sorted(digests.values())).encode()).hexdigest()
    return ImportPlan(
        run=RunImported(
            run=run,
            project=first.project if first and first.project else run.split("/")[0],
            model=first.model if first and first.model else run,
            scorer=scorer,
            source="parquet",
            path=str(path),
        ),
        groups=groups,
        key=plan_key,
        files=len(files),
    )


def _group_index(row: dict[str, Any], path: Path, number: int) -> int:
    value = row.get("group_index") or 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ExchangeFormatError(
            f"{path}, row {number}: group_index is {value!r}, not a whole number; nothing "
            "was imported"
        ) from None


def _file_groups(file: ParquetFile, digest: str, run: str, scorer: str) -> Iterable[ImportedGroup]:
    rows = read_table(file.path)
    started_at = datetime.fromtimestamp(file.path.stat().st_mtime, UTC)
    policy = file.split in POLICY_SPLITS
    by_index: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for number, row in enumerate(rows):
        if row.get("reward") is None and row.get("messages") is None:
            continue  # as ART's reader
        by_index.setdefault(_group_index(row, file.path, number), []).append((number, row))
    where = (run, file.split, file.step, digest)
    for group_index in sorted(by_index):
        group_id = derived_id("parquet", *where, group_index)
        rollouts = []
        for position, (number, row) in enumerate(by_index[group_index]):
            flats = row.get("messages") or []
            rollouts.append(
                ImportedRollout(
                    rollout_id=derived_id("parquet", *where, group_index, position),
                    role="policy" if policy else "validation",
                    model=file.model or run,
                    histories=[
                        History(
                            items=[_message(m, file.path, number) for m in flats],
                            trainable=[i for i, m in enumerate(flats) if m.get("trainable")],
                            tools=_json(row.get("tools"), file.path, number, "tools"),
                        )
                    ],
                    started_at=started_at,
                    metrics=_json(row.get("metrics"), file.path, number, "metrics") or {},
                    metadata=_json(row.get("metadata"), file.path, number, "metadata") or {},
                    logs=list(row.get("logs") or []),
                    split=file.split,
                    step=file.step,
                    group_index=group_index,
                )
            )
        rewards = {
            r.rollout_id: row["reward"]
            for r, (_, row) in zip(rollouts, by_index[group_index], strict=True)
            if row.get("reward") is not None
        }
        first_row = by_index[group_index][0][1]
        group_metadata = _json(first_row.get("group_metadata"), file.path, 0, "group_metadata")
        yield ImportedGroup(
            group_id=group_id,
            rollouts=rollouts,
            rewards=[RewardsRecorded(group_id=group_id, scorer=scorer, rewards=rewards)]
            if rewards
            else [],
            sealed=GroupSealed(
                group_id=group_id,
                run=run,
                batch=file.step,
                rollout_ids=[r.rollout_id for r in rollouts],
                metadata=_scalars(group_metadata),
            )
            if policy
            else None,
        )
