"""artstore's JSONL export: one line per rollout, everything needed to import it again.

Each line is a JSON object (`"format": "artstore.rollout/1"`):

- `run`: {name, project, model, base_model, validation_model, scorer, config};
- `rollout_id`, `model`, `role` (policy | validation), `scenario`, `scenario_index`,
  `policy_step`, `started_at`, `status` (finished | failed), `result`, `duration_s`,
  `error` ({type, message, traceback} of a failed rollout, else null);
- `group`: {group_id, sealed, epoch, batch, scenario_index, metadata} (null: no group);
- `metrics`, `metadata`, `logs`: as the rollout recorded them (a scorer's metrics are in
  `rewards`);
- `rewards`: every reward recorded for the rollout, oldest first: {scorer, reward, metrics,
  rescored, position}; records with the same `position` came from one rewards event;
- `consumed`: {trained model: step after the train step that trained the group};
  `step`: that step for the run's own model (null: not trained);
- `trajectory`: the `art.Trajectory` (`model_dump` in JSON mode, rewarded by the run's
  scorer), with its `Choice` objects whole (logprobs included), `tools`, and
  `additional_histories` each with its own `tools`, and ART's captured `exchanges` where it
  has them (ART >= 0.5.20). An item of `messages_and_choices` is a Choice when it has
  `finish_reason` and `message` (ART's own rule).

Lines come in training order: sealed groups by batch, then unsealed ones; inside a group,
policy rollouts, validation rollouts, failed rollouts. Rollouts still running are left out.
Importing the file into another store gives the same `store.trajectory(id)` for every
rollout, under the same ids (unless `--run` renames the run: ids are then derived anew, so
that a copy can live next to the original). Train steps are not imported: the groups are
unconsumed in the new store, ready for `artstore replay`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from artstore.arguments import find_non_finite
from artstore.art_versions import exchanges_problem
from artstore.documents.messages import dump_model
from artstore.errors import ExchangeFormatError, NotFoundError
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
from artstore.exchange.source import (
    ExportSummary,
    GroupOutline,
    RolloutDetails,
    chunks,
    load_rollouts,
    load_run,
)

if TYPE_CHECKING:
    from artstore.store import Store

FORMAT = "artstore.rollout/1"


# --- export -------------------------------------------------------------------------------


async def export_jsonl(
    store: Store,
    run: str,
    out: str | Path,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Write every finished or failed rollout of `run` as a JSONL line to `out` ("-": stdout).

    A file is written under a temporary name and renamed when complete; an existing file
    is refused unless `force`, as the parquet export does, and anything at `out` that is
    not a regular file (a link, a pipe, a device...) is refused (`exchange.files`).
    """
    if str(out) != "-" and existing_file(Path(out)) is not None and not force:
        raise FileExistsError(f"{out} exists; nothing was written (--force overwrites it)")
    # A logprob can be -inf: written as `-Infinity`, which json reads back.
    return await export_lines(store, run, out, to_text=json.dumps, progress=progress)


async def export_lines(
    store: Store,
    run: str,
    out: str | Path,
    *,
    to_text: Callable[[dict[str, Any]], str],
    progress: Callable[[int, int], None] | None = None,
) -> ExportSummary:
    """Write each rollout's line (`to_text` of its JSONL record) to `out`, a chunk of
    rollouts read at a time (constant memory), calling `progress(done, total)` per chunk."""
    outline = await load_run(store, run)
    total = sum(len(group.rollout_ids) for group in outline.groups)
    summary = ExportSummary(run=run, path=str(out), running_rollouts=outline.skipped_running)
    info = outline.info
    run_record = {
        "name": info.run,
        "project": info.project,
        "model": info.model,
        "base_model": info.base_model,
        "validation_model": info.validation_model,
        "scorer": info.scorer,
        "config": info.config or {},
    }
    with _output(out) as handle:
        for chunk in chunks(outline.groups):
            ids = [rid for group in chunk for rid in group.rollout_ids]
            details = await load_rollouts(store, ids, info.scorer)
            for group in chunk:
                for rid in group.rollout_ids:
                    line = _line(run_record, group, rid, details[rid], outline.own_step(group))
                    handle.write(to_text(line) + "\n")
                    summary.trajectories += 1
                    summary.failed_rollouts += details[rid].failed is not None
                summary.groups += group.group_id is not None
            if progress is not None:
                progress(summary.trajectories, total)
    if str(out) != "-":
        summary.files.append(str(out))
    return summary


@contextlib.contextmanager
def _output(out: str | Path) -> Iterator[IO[str]]:
    if str(out) == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    with written_in_place(Path(out)) as partial, open(partial, "w", encoding="utf-8") as handle:
        yield handle


def _line(
    run: dict[str, Any], group: GroupOutline, rid: str, d: RolloutDetails, step: int | None
) -> dict[str, Any]:
    started, end = d.started, d.finished or d.failed
    sealed = group.sealed
    return {
        "format": FORMAT,
        "run": run,
        "rollout_id": rid,
        "group": None
        if group.group_id is None
        else {
            "group_id": group.group_id,
            "sealed": sealed is not None,
            "epoch": sealed.epoch if sealed else None,
            "batch": sealed.batch if sealed else None,
            "scenario_index": sealed.scenario_index if sealed else started.scenario_index,
            "metadata": sealed.metadata if sealed else {},
        },
        "model": started.model,
        "role": started.role,
        "scenario": started.scenario,
        "scenario_index": started.scenario_index,
        "policy_step": started.policy_step,
        "started_at": started.started_at.isoformat(),
        "status": "failed" if d.failed else "finished",
        "result": d.finished.result if d.finished else None,
        "duration_s": getattr(end, "duration_s", None),
        "error": {
            "type": d.failed.error_type,
            "message": d.failed.error_message,
            "traceback": d.failed.traceback,
        }
        if d.failed
        else None,
        "metrics": d.finished.metrics if d.finished else {},
        "metadata": d.finished.metadata if d.finished else {},
        "logs": d.finished.logs if d.finished else [],
        "rewards": [
            {
                "scorer": row.scorer,
                "reward": row.reward,
                "metrics": row.metrics,
                "rescored": row.rescored,
                "position": row.position,
            }
            for row in d.rewards
        ],
        "consumed": dict(group.consumed),
        "step": step,
        # Non-finite floats kept (pydantic's default would write -inf as null)
        "trajectory": json.loads(dump_model(d.trajectory)),
    }


# --- import -------------------------------------------------------------------------------


def is_choice(item: Any) -> bool:
    """A dumped `Choice` (ART's rule in `_flatten_message`), not a message dict."""
    return isinstance(item, dict) and "finish_reason" in item and "message" in item


def _history(messages_and_choices: Any, tools: Any, where: str) -> History:
    from openai.types.chat.chat_completion import Choice
    from pydantic import ValidationError

    if not isinstance(messages_and_choices, list):
        raise ExchangeFormatError(f"{where}: messages_and_choices is not a list")
    choices = [i for i, item in enumerate(messages_and_choices) if is_choice(item)]
    for index in choices:
        try:
            Choice.model_validate(messages_and_choices[index])
        except ValidationError as exc:
            raise ExchangeFormatError(f"{where}: item {index} is not a Choice ({exc})") from None
    return History(items=messages_and_choices, choices=choices, trainable=choices, tools=tools)


def read_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The lines of an artstore JSONL export, each checked to be one."""
    for where, line in read_text_lines(path):
        if not isinstance(line, dict) or line.get("format") != FORMAT:
            raise ExchangeFormatError(
                f'{where}: not a line of an artstore JSONL export (no "format": '
                f'"{FORMAT}"; write one with `artstore export RUN --format jsonl`)'
            )
        yield where, line


def read_text_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """Each non-blank line of a JSON lines file, parsed, with where it is in the file."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{path}, line {number}"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ExchangeFormatError(
                    f"{where}: not UTF-8 text (the byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1})"
                ) from None
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except ValueError as exc:
                raise ExchangeFormatError(f"{where}: not JSON ({exc})") from None
            yield where, line


def read_jsonl(path: str | Path, *, run: str | None = None, scorer: str = "imported") -> ImportPlan:
    """The import plan of an artstore JSONL export (`run` renames the run and its ids)."""
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"{path}: no such file")
    return plan_of_lines(path, read_lines(path), run=run, scorer=scorer, source="jsonl")


def plan_of_lines(
    path: Path,
    lines: Iterable[tuple[str, dict[str, Any]]],
    *,
    run: str | None,
    scorer: str,
    source: Literal["jsonl", "atif"],
) -> ImportPlan:
    """The import plan of rollouts in the JSONL export's shape (each with where it is
    in the file, for the errors); other formats (ATIF) are read into that shape."""
    source_run: dict[str, Any] | None = None
    groups: dict[str, ImportedGroup] = {}
    records: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    group_info: dict[str, dict[str, Any]] = {}
    new_id = _same
    for where, line in lines:
        _check_shape(line, where)
        _check_finite(line, where)
        try:
            if source_run is None:
                source_run = line["run"]
                if run and run != source_run["name"]:  # a copy: ids of its own
                    new_id = functools.partial(derived_id, "jsonl", run)
            elif line["run"]["name"] != source_run["name"]:
                raise ExchangeFormatError(
                    f"{where}: run {line['run']['name']!r}, but the file began with run "
                    f"{source_run['name']!r} (one run per file)"
                )
            rollout = _rollout(line, new_id, where)
            group = line.get("group") or {"group_id": derived_id("jsonl-group", rollout.rollout_id)}
            group_id = new_id(group["group_id"])
            if group_id not in groups:
                groups[group_id] = ImportedGroup(group_id=group_id, rollouts=[])
                group_info[group_id] = group
            groups[group_id].rollouts.append(rollout)
            rewards = line.get("rewards")
            if rewards is None and "reward" in (line.get("trajectory") or {}):
                rewards = [{"scorer": scorer, "reward": line["trajectory"]["reward"]}]
            records.setdefault(group_id, []).extend(
                (rollout.rollout_id, record) for record in rewards or []
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, ExchangeFormatError):
                raise
            raise ExchangeFormatError(
                f"{where}: malformed line ({type(exc).__name__}: {exc})"
            ) from None
    if source_run is None:
        raise ExchangeFormatError(f"{path}: empty file, nothing to import")
    name = run or source_run["name"]
    for group_id, group in groups.items():
        group.rewards = _rewards_events(group_id, records.get(group_id, []))
        info = group_info[group_id]
        if info.get("sealed"):
            group.sealed = GroupSealed(
                group_id=group_id,
                run=name,
                epoch=info.get("epoch"),
                batch=info.get("batch"),
                scenario_index=info.get("scenario_index"),
                rollout_ids=_ids(group, "policy"),
                validation_rollout_ids=_ids(group, "validation"),
                failed_rollout_ids=[r.rollout_id for r in group.rollouts if r.status == "failed"],
                metadata=info.get("metadata") or {},
            )
    return ImportPlan(
        run=RunImported(
            run=name,
            project=source_run.get("project") or name.split("/")[0],
            model=source_run.get("model") or name,
            base_model=source_run.get("base_model"),
            validation_model=source_run.get("validation_model"),
            scorer=source_run.get("scorer") or scorer,
            config=source_run.get("config") or {},
            source=source,
            path=str(path),
        ),
        groups=list(groups.values()),
        key=f"{name}\x00{file_sha256(path)}",
    )


def _same(old: str) -> str:
    return old


# What `read_jsonl` reads of a line, checked before it reads it, so that a line of the
# wrong shape is refused with the field that is wrong (not "'str' has no attribute 'get'").
class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow")


class _RunShape(_Shape):
    name: str
    project: str | None = None
    model: str | None = None
    config: dict[str, Any] | None = None


class _HistoryShape(_Shape):
    messages_and_choices: list[Any] = []
    tools: list[dict[str, Any]] | None = None


class _TrajectoryShape(_HistoryShape):
    additional_histories: list[_HistoryShape] | None = None
    reward: float | None = None
    metrics: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    logs: list[str] | None = None


class _GroupShape(_Shape):
    group_id: str
    sealed: bool | None = None
    epoch: int | None = None
    batch: int | None = None
    scenario_index: int | None = None
    metadata: dict[str, Any] | None = None


class _RewardShape(_Shape):
    scorer: str
    reward: float
    rescored: bool | None = None
    position: int | None = None
    metrics: dict[str, Any] | None = None


class _LineShape(_Shape):
    run: _RunShape
    rollout_id: str
    trajectory: _TrajectoryShape
    group: _GroupShape | None = None
    rewards: list[_RewardShape] | None = None
    role: Literal["policy", "validation"] | None = None
    model: str | None = None
    started_at: datetime | None = None
    status: Literal["finished", "failed"] | None = None
    scenario_index: int | None = None
    policy_step: int | None = None
    duration_s: float | None = None
    metrics: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    logs: list[str] | None = None
    error: dict[str, Any] | None = None


def _check_shape(line: dict[str, Any], where: str) -> None:
    try:
        _LineShape.model_validate(line)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "the line"
        message = re.sub(r" or instance of _\w+", "", first["msg"])  # (our classes' names)
        raise ExchangeFormatError(f"{where}: {field}: {message}") from None


# What a line holds that is stored as the model saw and said it (blobs, where a logprob
# may be -Infinity); everything else becomes event payloads, which hold no NaN.
_KEPT_EXACTLY = {"messages_and_choices", "tools", "additional_histories", "exchanges"}


def _check_finite(line: dict[str, Any], where: str) -> None:
    """Refuse NaN and the infinities (which `json` reads) where they would be stored as
    event payloads, naming the field; they are kept exactly in the trajectory's messages."""
    trajectory = {k: v for k, v in line["trajectory"].items() if k not in _KEPT_EXACTLY}
    found = find_non_finite({**line, "trajectory": trajectory})
    if found is not None:
        keys, number = found
        word = "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
        raise ExchangeFormatError(
            f"{where}: {'.'.join(map(str, keys))} is {word}, which is not a JSON number (NaN "
            "and the infinities are kept only inside the trajectory's messages)"
        )


def _rollout(line: dict[str, Any], new_id: Callable[[str], str], where: str) -> ImportedRollout:
    trajectory = line["trajectory"]
    histories = [
        _history(trajectory.get("messages_and_choices", []), trajectory.get("tools"), where),
        *(
            _history(h.get("messages_and_choices", []), h.get("tools"), where)
            for h in trajectory.get("additional_histories") or []
        ),
    ]
    exchanges = trajectory.get("exchanges") or None
    problem = exchanges_problem(exchanges) if exchanges else None
    if problem:
        raise ExchangeFormatError(f"{where}: trajectory.exchanges: {problem}")
    started_at = line.get("started_at")
    return ImportedRollout(
        rollout_id=new_id(line["rollout_id"]),
        role=line.get("role") or "policy",
        model=line.get("model") or line["run"].get("model") or line["run"]["name"],
        histories=histories,
        started_at=datetime.fromisoformat(started_at) if started_at else datetime.now(UTC),
        status="failed" if line.get("status") == "failed" else "finished",
        scenario=line.get("scenario"),
        scenario_index=line.get("scenario_index"),
        policy_step=line.get("policy_step"),
        initial_policy_version=trajectory.get("initial_policy_version"),
        final_policy_version=trajectory.get("final_policy_version"),
        result=line.get("result"),
        duration_s=line.get("duration_s") or 0.0,
        metrics=line["metrics"] if "metrics" in line else trajectory.get("metrics") or {},
        metadata=line["metadata"] if "metadata" in line else trajectory.get("metadata") or {},
        logs=line["logs"] if "logs" in line else trajectory.get("logs") or [],
        error=line.get("error"),
        exchanges=exchanges,
    )


def _ids(group: ImportedGroup, role: str) -> list[str]:
    return [r.rollout_id for r in group.rollouts if r.status == "finished" and r.role == role]


def _rewards_events(
    group_id: str, records: list[tuple[str, dict[str, Any]]]
) -> list[RewardsRecorded]:
    """One rewards event per recorded one (same position, scorer, rescored), in order."""
    events: dict[tuple, dict[str, Any]] = {}
    for order, (rid, record) in enumerate(records):
        key = (record.get("position", order), record["scorer"], bool(record.get("rescored")))
        event = events.setdefault(key, {"rewards": {}, "metrics": {}})
        event["rewards"][rid] = record["reward"]
        if record.get("metrics"):
            event["metrics"][rid] = record["metrics"]
    return [
        RewardsRecorded(
            group_id=group_id,
            scorer=scorer,
            rewards=event["rewards"],
            metrics=event["metrics"],
            rescored=rescored,
        )
        for (_, scorer, rescored), event in sorted(events.items(), key=lambda item: item[0][0])
    ]
