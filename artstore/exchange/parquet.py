"""ART's trajectory parquet files: export a run into them, import them into the store.

The layout is the one `art.Model.log` writes, `trajectories/<split>/<step:04d>.parquet`,
one row per trajectory, written by ART's own `write_trajectory_groups_parquet` and readable
by its `read_trajectory_groups_parquet`. ART has two formats (`art.utils.trajectory_logging`):

- format 1 (ART 0.5.18): the columns of `V1_COLUMNS`; messages flattened to
  {role, content, tool_calls, tool_call_id, trainable}: no logprobs (Choice objects become
  plain assistant messages), no additional histories, no policy versions;
- format 2 (ART >= 0.5.20): `format_version`, `trajectory_index`, and each group and
  trajectory whole as JSON (`group_json`, `trajectory_json`: Choice objects with their
  logprobs, tools, additional histories, policy versions, ART's captured `exchanges`, the
  group's exceptions), plus format 1's columns for queries. Lossless.

Export (`export_parquet`) writes the format of the installed ART's writer
(`art_versions.parquet_format_version()`), per sealed group of the run:

| split            | file number                            | what                              |
|------------------|----------------------------------------|-----------------------------------|
| `train`          | the step after the train step that     | the group's policy trajectories   |
|                  | consumed the group (as `model.log`)    |                                   |
| `val`            | the same step                          | its validation-model trajectories |
| `unconsumed`     | the group's batch index in the run     | policy trajectories never trained |
| `unconsumed_val` | the same batch index                   | their validation trajectories     |

Rewards are the latest of one scorer (the run's by default); groups without a reward by it,
failed rollouts and unsealed groups are left out.

Import (`read_parquet`) reads both formats on either ART (format 2 is parsed here, not by
ART's reader, which 0.5.18 lacks): every trajectory becomes an imported rollout; the
trajectories of one `group_index` one group, rewarded under a scorer (`imported` by
default). Groups of the `train` and `unconsumed` splits are sealed with policy rollouts;
other splits (`val`, ...) become validation rollouts in groups that are rewarded but never
sealed, so no replay trains them.

- Format 1: message dicts come back as ART's reader returns them (the trainable flag is
  kept in the event), plus each trajectory's `tools` (ART's reader drops them). Not
  trainable: there are no logprobs.
- Format 2: the trajectories come back as ART's reader returns them, field for field:
  Choice objects with their logprobs (trainable by `artstore replay`), tools, additional
  histories, metrics, metadata, logs, policy versions and `exchanges` (kept whole on ART
  0.5.18 too, which cannot represent them: see `projections.imported`). A group's
  exceptions become failed rollouts of the group.

Group metadata is kept on sealed groups (`group.sealed`, values that are not scalars as
JSON text); group metrics and group logs are not kept (the store has no place for them),
nor are groups without trajectories. Each file is checked whole before anything is
written: a malformed one imports nothing, with a one-line error naming file, row and column.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from artstore.art_api import art_module, trajectory_group_class
from artstore.art_versions import exchanges_problem
from artstore.errors import ExchangeFormatError, ExportTargetError, NotFoundError
from artstore.events import GroupSealed, RewardsRecorded, RunImported
from artstore.exchange.files import existing_file, written_in_place
from artstore.exchange.importer import (
    History,
    ImportedGroup,
    ImportedRollout,
    ImportPlan,
    derived_id,
    file_sha256,
)
from artstore.exchange.source import ExportSummary, GroupOutline, load_run
from artstore.groups import scored_rollouts

if TYPE_CHECKING:
    import art

    from artstore.store import Store

V1_COLUMNS = (
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
V2_COLUMNS = (
    "format_version",
    "group_index",
    "trajectory_index",
    "group_json",
    "trajectory_json",
    *V1_COLUMNS[1:],
)
#: The columns of each format of ART's trajectory parquet, in the order ART writes them.
COLUMNS = {1: V1_COLUMNS, 2: V2_COLUMNS}
V1_REQUIRED = ("reward", "messages")
V2_REQUIRED = V2_COLUMNS[:5]  # the JSON columns are the whole record; the rest are copies
MESSAGE_FIELDS = ("role", "content")
#: Where format 2 files say their version besides the `format_version` column.
VERSION_METADATA = b"art.trajectory_parquet.version"
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
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Write `run` as ART trajectory parquet files under `out` (see the module's docstring).

    `model` ("project/name") chooses whose train steps number the files (the run's own
    trained model by default, e.g. another model that replayed the run). Existing files are
    refused unless `force`. A file's trajectories are read, written and let go before the
    next file's: `progress(done, total)` is called after each file.
    """
    out = Path(out)
    if (out.exists() or out.is_symlink()) and not out.is_dir():  # (a link to a folder is one)
        raise ExportTargetError(
            f"{out} is not a directory: a parquet export writes its files under one; "
            "nothing was written"
        )
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
    existing = [path for path in targets.values() if existing_file(path) is not None]
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
    kept = {key: [(g, ids) for g, ids in files[key] if g.group_id not in unscored] for key in files}
    await _write_files(store, run, kept, targets, scorer, summary, progress)
    summary.groups = len({g.group_id for e in files.values() for g, _ in e} - unscored)
    summary.unscored_groups = len(unscored)
    return summary


async def _write_files(
    store: Store,
    run: str,
    files: dict[tuple[str, int], list[tuple[GroupOutline, list[str]]]],
    targets: dict[tuple[str, int], Path],
    scorer: str,
    summary: ExportSummary,
    progress: Callable[[int, int], None] | None,
) -> None:
    """Each file in turn: its trajectories read, written and let go before the next's."""
    total = sum(len(ids) for entries in files.values() for _, ids in entries)
    for key in sorted(files):
        entries = files[key]
        if not entries:
            continue
        trajectories = await store.trajectories(
            [rid for _, ids in entries for rid in ids], scorer=scorer
        )
        groups = [_art_group(run, g, [trajectories[rid] for rid in ids]) for g, ids in entries]
        _write_groups(groups, targets[key])
        summary.files.append(str(targets[key]))
        summary.trajectories += sum(len(ids) for _, ids in entries)
        if progress is not None:
            progress(summary.trajectories, total)


def _art_group(run: str, group: GroupOutline, trajectories: list) -> art.TrajectoryGroup:
    sealed = group.sealed
    assert sealed is not None
    metadata = {"group_id": group.group_id, "run": run, "scenario_index": sealed.scenario_index}
    return trajectory_group_class()(
        trajectories, metadata={k: v for k, v in metadata.items() if v is not None}
    )


def _write_groups(groups: list, path: Path) -> None:
    """ART's own writer, into a temporary file renamed into place (never a half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_in_place(path) as partial:
        art_module("utils.trajectory_logging").write_trajectory_groups_parquet(groups, partial)


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


def read_table(file: Path) -> tuple[int, list[dict[str, Any]]]:
    """The format version (1 or 2) and the rows of one ART trajectory parquet file.

    The version is told as ART's reader tells it: format 2 files have a `format_version`
    column (and the schema metadata `art.trajectory_parquet.version`); files without it
    are format 1. ExchangeFormatError for anything else.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, OSError) as exc:
        raise ExchangeFormatError(f"{file}: not a parquet file ({exc})") from None
    names = table.column_names
    raw = (table.schema.metadata or {}).get(VERSION_METADATA)
    if raw is not None:
        try:
            declared = int(raw)
        except ValueError:
            raise ExchangeFormatError(
                f"{file}: its schema metadata {VERSION_METADATA.decode()} is {raw!r}, not a "
                "format number; nothing was imported"
            ) from None
        if declared not in COLUMNS:
            raise _unknown_format(file, declared, f"schema metadata {VERSION_METADATA.decode()}")
        version = declared
    else:
        version = 2 if {"format_version", "group_json", "trajectory_json"} & set(names) else 1
    required = V2_REQUIRED if version == 2 else V1_REQUIRED
    missing = [c for c in required if c not in names]
    messages = table.schema.field("messages").type if "messages" in names else None
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
        what = "an ART trajectory parquet file" + (" of format 2" if version == 2 else "")
        raise ExchangeFormatError(
            f"{file}: not {what} (no column {', '.join(missing)}; ART writes "
            f"{', '.join(COLUMNS[version])}); nothing was imported"
        )
    return version, table.to_pylist()


def _unknown_format(file: Path, version: Any, where: str) -> ExchangeFormatError:
    return ExchangeFormatError(
        f"{file}: ART trajectory parquet format {version!r} ({where}), which this artstore "
        f"does not read (it reads formats {' and '.join(map(str, COLUMNS))}); nothing was "
        "imported"
    )


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


def _reward(value: Any, file: Path, row: int, column: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ExchangeFormatError(
            f"{file}, row {row}: {column} is {value!r}, not a finite number; nothing was imported"
        )
    return float(value)


# --- format 2: each group and trajectory as JSON ------------------------------------------


class _Strict(BaseModel):
    """A record of ART's format 2 JSON: fields as ART dumps them, nothing unknown."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    for key, value in metrics.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(
                f"value of {key!r} is {value!r}: ART's metrics are finite numbers or booleans"
            )
    return metrics


def _scalar_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    for key, value in metadata.items():
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ValueError(
                f"value of {key!r} is a {type(value).__name__}: artstore keeps metadata "
                "values that are numbers, strings, booleans or null (as ART 0.5.18 does)"
            )
    return metadata


class _HistoryJson(_Strict):
    messages_and_choices: list[dict[str, Any]] = []
    tools: list[Any] | None = None


class _TrajectoryJson(_Strict):
    """`Trajectory.model_dump(mode="json")` as ART's writer stores it (defaults left out)."""

    exchanges: dict[str, Any] | None = None
    messages_and_choices: list[dict[str, Any]] = []
    tools: list[Any] | None = None
    additional_histories: list[_HistoryJson] = []
    reward: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    metrics: Annotated[dict[str, Any], AfterValidator(_numbers)] = {}
    metadata: Annotated[dict[str, Any], AfterValidator(_scalar_metadata)] = {}
    logs: list[str] = []


class _ExceptionJson(_Strict):
    type: str
    message: str
    traceback: str


class _GroupJson(_Strict):
    """`TrajectoryGroup.model_dump(mode="json")` without its trajectories."""

    exceptions: list[_ExceptionJson] = []
    metadata: dict[str, Any] = {}
    metrics: Annotated[dict[str, Any], AfterValidator(_numbers)] = {}
    logs: list[str] = []


def _v2_record(model: type[_Strict], text: Any, file: Path, row: int, column: str) -> Any:
    """The JSON object of a format 2 column, checked against ART's model of it."""
    if not isinstance(text, str):
        raise ExchangeFormatError(
            f"{file}, row {row}: {column} is {type(text).__name__}, not JSON text; nothing "
            "was imported"
        )
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ExchangeFormatError(
            f"{file}, row {row}: {column} is not JSON ({exc}); nothing was imported"
        ) from None
    if not isinstance(value, dict):
        raise ExchangeFormatError(
            f"{file}, row {row}: {column} is a JSON {type(value).__name__}, not an object; "
            "nothing was imported"
        )
    try:
        model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = (
            "a field this artstore does not know (written by a newer ART?)"
            if first["type"] == "extra_forbidden"
            else first["msg"].removeprefix("Value error, ")
        )
        raise ExchangeFormatError(
            f"{file}, row {row}: {column} {where}: {problem}; nothing was imported"
        ) from None
    return value  # as the file holds it: the model only checks it


def _is_choice(item: dict[str, Any]) -> bool:
    """ART's reader's rule (`_choice_data`): these keys, and valid as an openai Choice."""
    from openai.types.chat.chat_completion import Choice

    if not {"finish_reason", "index", "message"} <= item.keys():
        return False
    try:
        Choice.model_validate(item)
    except ValidationError:
        return False
    return True


def _v2_history(messages_and_choices: list[dict[str, Any]], tools: Any) -> History:
    choices = [i for i, item in enumerate(messages_and_choices) if _is_choice(item)]
    return History(items=messages_and_choices, choices=choices, trainable=choices, tools=tools)


@dataclass
class _Group:
    """The rows of one `group_index` of a format 2 file."""

    first_row: int
    record: dict[str, Any]  # group_json
    trajectories: dict[int, tuple[int, dict[str, Any]]]  # trajectory_index -> (row, JSON)


def _v2_groups(file: Path, rows: list[dict[str, Any]]) -> dict[int, _Group]:
    groups: dict[int, _Group] = {}
    for number, row in enumerate(rows):
        version = row.get("format_version")
        if version != 2:
            raise _unknown_format(file, version, f"row {number}, column format_version")
        index = row.get("group_index")
        if not isinstance(index, int):
            raise ExchangeFormatError(
                f"{file}, row {number}: group_index is {index!r}, not an integer; nothing was "
                "imported"
            )
        group = groups.get(index)
        if group is None:
            record = _v2_record(_GroupJson, row.get("group_json"), file, number, "group_json")
            group = groups[index] = _Group(number, record, {})
        elif row.get("group_json") != rows[group.first_row].get("group_json"):
            raise ExchangeFormatError(
                f"{file}, row {number}: group_json differs from row {group.first_row}'s, of the "
                f"same group {index}; nothing was imported"
            )
        position = row.get("trajectory_index")
        if position is None:  # the row ART writes for a group without trajectories
            if row.get("trajectory_json") is not None:
                raise ExchangeFormatError(
                    f"{file}, row {number}: trajectory_json without a trajectory_index; "
                    "nothing was imported"
                )
            continue
        if not isinstance(position, int) or position in group.trajectories:
            what = "given twice" if isinstance(position, int) else "not an integer"
            raise ExchangeFormatError(
                f"{file}, row {number}: trajectory_index {position!r} of group {index} is "
                f"{what}; nothing was imported"
            )
        text = row.get("trajectory_json")
        record = _v2_record(_TrajectoryJson, text, file, number, "trajectory_json")
        if record.get("exchanges"):
            problem = exchanges_problem(record["exchanges"])
            histories = (
                record.get("messages_and_choices")
                or record.get("tools") is not None
                or record.get("additional_histories")
            )
            if not problem and histories:  # as ART's `Trajectory` refuses it
                problem = "a trajectory holds either exchanges or histories, never both"
            if problem:
                raise ExchangeFormatError(
                    f"{file}, row {number}: trajectory_json exchanges: {problem}; nothing was "
                    "imported"
                )
        group.trajectories[position] = (number, record)
    return groups


def _v2_file_groups(
    file: ParquetFile, rows: list[dict[str, Any]], where: tuple, base: dict[str, Any]
) -> Iterable[tuple[int, list[ImportedRollout], dict[str, float], dict[str, Any]]]:
    """(group index, rollouts, rewards, group metadata) of each group of a format 2 file."""
    for index, group in sorted(_v2_groups(file.path, rows).items()):
        rollouts, rewards = [], {}
        for position in sorted(group.trajectories):
            number, record = group.trajectories[position]
            rollout = ImportedRollout(
                rollout_id=derived_id("parquet", *where, index, position),
                histories=[
                    _v2_history(record.get("messages_and_choices", []), record.get("tools")),
                    *(
                        _v2_history(h.get("messages_and_choices", []), h.get("tools"))
                        for h in record.get("additional_histories", [])
                    ),
                ],
                initial_policy_version=record.get("initial_policy_version"),
                final_policy_version=record.get("final_policy_version"),
                metrics=record.get("metrics", {}),
                metadata=record.get("metadata", {}),
                logs=record.get("logs", []),
                exchanges=record.get("exchanges") or None,
                group_index=index,
                **base,
            )
            rollouts.append(rollout)
            rewards[rollout.rollout_id] = _reward(
                record.get("reward", 0.0), file.path, number, "trajectory_json reward"
            )
        # A group's exceptions are its rollouts that raised: failed rollouts of the group.
        for k, exception in enumerate(group.record.get("exceptions", [])):
            rollouts.append(
                ImportedRollout(
                    rollout_id=derived_id("parquet", *where, index, "exception", k),
                    histories=[],
                    status="failed",
                    error=dict(exception),
                    group_index=index,
                    **base,
                )
            )
        if rollouts:  # a group without trajectories nor exceptions holds nothing to import
            yield index, rollouts, rewards, group.record.get("metadata", {})


# --- format 1: flat messages --------------------------------------------------------------


def _v1_file_groups(
    file: ParquetFile, rows: list[dict[str, Any]], where: tuple, base: dict[str, Any]
) -> Iterable[tuple[int, list[ImportedRollout], dict[str, float], dict[str, Any]]]:
    """(group index, rollouts, rewards, group metadata) of each group of a format 1 file."""
    by_index: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for number, row in enumerate(rows):
        if row.get("reward") is None and row.get("messages") is None:
            continue  # as ART's reader
        by_index.setdefault(_group_index(row, file.path, number), []).append((number, row))
    for index in sorted(by_index):
        rollouts, rewards = [], {}
        for position, (number, row) in enumerate(by_index[index]):
            flats = row.get("messages") or []
            rollout = ImportedRollout(
                rollout_id=derived_id("parquet", *where, index, position),
                histories=[
                    History(
                        items=[_message(m, file.path, number) for m in flats],
                        trainable=[i for i, m in enumerate(flats) if m.get("trainable")],
                        tools=_json(row.get("tools"), file.path, number, "tools"),
                    )
                ],
                metrics=_json(row.get("metrics"), file.path, number, "metrics") or {},
                metadata=_json(row.get("metadata"), file.path, number, "metadata") or {},
                logs=list(row.get("logs") or []),
                group_index=index,
                **base,
            )
            rollouts.append(rollout)
            if row.get("reward") is not None:
                rewards[rollout.rollout_id] = _reward(row["reward"], file.path, number, "reward")
        first_number, first_row = by_index[index][0]
        metadata = _json(first_row.get("group_metadata"), file.path, first_number, "group_metadata")
        yield index, rollouts, rewards, metadata or {}


# --- the plan -----------------------------------------------------------------------------


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
    formats: set[int] = set()
    for file in files:
        version, rows = read_table(file.path)
        formats.add(version)
        groups.extend(_file_groups(file, version, rows, digests[file.path], run, scorer))
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
        formats=sorted(formats),
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


def _file_groups(
    file: ParquetFile,
    version: int,
    rows: list[dict[str, Any]],
    digest: str,
    run: str,
    scorer: str,
) -> Iterable[ImportedGroup]:
    policy = file.split in POLICY_SPLITS
    base = {
        "role": "policy" if policy else "validation",
        "model": file.model or run,
        "started_at": datetime.fromtimestamp(file.path.stat().st_mtime, UTC),
        "split": file.split,
        "step": file.step,
    }
    where = (run, file.split, file.step, digest)
    read = _v2_file_groups if version == 2 else _v1_file_groups
    for index, rollouts, rewards, metadata in read(file, rows, where, base):
        group_id = derived_id("parquet", *where, index)
        finished = [r.rollout_id for r in rollouts if r.status == "finished"]
        yield ImportedGroup(
            group_id=group_id,
            rollouts=rollouts,
            rewards=[RewardsRecorded(group_id=group_id, scorer=scorer, rewards=rewards)]
            if rewards
            else [],
            # Only policy groups with a trajectory are sealed (ready to train).
            sealed=GroupSealed(
                group_id=group_id,
                run=run,
                batch=file.step,
                rollout_ids=finished,
                failed_rollout_ids=[r.rollout_id for r in rollouts if r.status == "failed"],
                metadata=_scalars(metadata),
            )
            if policy and finished
            else None,
        )
