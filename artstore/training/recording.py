"""ART's own objects in: `art.Trajectory` and `art.TrajectoryGroup` a loop built, recorded.

    group_id = await artstore.record_group(store, group, run="my-run", model=model)

A trajectory becomes a rollout whose `trajectory.recorded` event holds it whole: every
history item (message dicts as they are, `Choice` objects dumped with their logprobs),
the tools of each history, metrics, metadata and logs (key order kept), ART's exchanges,
its policy versions and start time. Its reward is recorded with the group's, under a
scorer (`rewards.recorded`), and the group is sealed with its own metadata, metrics, logs
and exceptions (`group.sealed`), ready to be trained, re-scored and replayed.

Recording stamps the objects: each trajectory's metadata gets `artstore_rollout_id` and
`artstore_group_id`, the group's metadata `artstore_group_id`, so a trajectory that came
through artstore says where it is (`SELECT ... FROM v_rollouts WHERE rollout_id = ...`).
A group recorded again as it is writes nothing new (a changed reward or trajectory is
recorded again); trajectories that are already finished rollouts of this store
(`wrap_rollout`, `durable_rollouts`) are sealed as they are, not copied.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from artstore.arguments import (
    check_json,
    check_model_name,
    check_name,
    check_names,
    check_store,
    check_whole_numbers,
)
from artstore.art_api import trajectory_group_class
from artstore.art_versions import has_exchange_data
from artstore.capture.rollout import rollout_stream, to_json_value
from artstore.documents.exchanges import redact_choice, redact_exchanges
from artstore.errors import ConfigurationError, InvalidEventError
from artstore.events import (
    GroupSealed,
    ImportedHistory,
    RewardsRecorded,
    RolloutFailed,
    RolloutFinished,
    RolloutStarted,
    TrajectoryRecorded,
    new_id,
)
from artstore.eventstore.blobs import blob_hash
from artstore.eventstore.records import NO_STREAM, PendingAppend
from artstore.groups import abandon_rollouts, group_stream, sealed_groups
from artstore.schema import tables as t
from artstore.training.runs import ensure_run

if TYPE_CHECKING:
    import art

    from artstore.capture.group import CapturedCall, GroupCalls
    from artstore.events import LLMCall
    from artstore.redaction import Redactor
    from artstore.store import Store

#: Metadata keys artstore stamps on what it records or hands out (not part of the stored data).
ROLLOUT_KEY = "artstore_rollout_id"
GROUP_KEY = "artstore_group_id"
STAMPS = (ROLLOUT_KEY, GROUP_KEY)


def own_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata without artstore's stamps, in its order."""
    return {k: v for k, v in metadata.items() if k not in STAMPS}


def stamp(trajectory: Any, rollout_id: str, group_id: str | None) -> None:
    trajectory.metadata[ROLLOUT_KEY] = rollout_id
    if group_id is not None:
        trajectory.metadata[GROUP_KEY] = group_id


def ordered_json(value: Any, what: str) -> str:
    """JSON text that keeps key order and every float (a blob body); refuses NaN."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidEventError(f"{what} is not JSON-serializable: {exc}") from None


class Blobs(dict[str, str]):
    """Blob bodies by hash, redacted as the store redacts every payload."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def add(self, value: Any, what: str) -> str:
        return self.add_checked(value, what)[0]

    def add_checked(self, value: Any, what: str) -> tuple[str, bool]:
        """The blob's hash, and whether the value held a secret (redacted in the blob)."""
        text = ordered_json(value, what)
        body = self.redact(text)
        digest = blob_hash(body)
        self[digest] = body
        return digest, body != text


def _item(item: Any, where: str) -> tuple[Any, bool]:
    """A history item as JSON, and whether it is a `Choice` (rebuilt as one)."""
    from openai.types.chat.chat_completion import Choice

    if isinstance(item, Choice):
        return item.model_dump(mode="json", warnings=False), True
    if isinstance(item, dict):
        return item, False
    raise InvalidEventError(
        f"{where} is a {type(item).__name__}, neither a message dict nor an openai Choice "
        "(append completion.choices[0], or the message as a dict)"
    )


def _history(items: Sequence[Any], tools: Any, blobs: Blobs, where: str) -> ImportedHistory:
    hashes, choices = [], []
    held = False  # an item so far held a secret: the prompt token ids of later choices spell it
    for index, item in enumerate(items):
        value, is_choice = _item(item, f"{where}[{index}]")
        if is_choice:  # a secret the model spelled over its tokens: see artstore.redaction
            held = redact_choice(value, blobs.redact, prompt_held_secret=held) or held
            choices.append(index)
        digest, redacted = blobs.add_checked(value, f"{where}[{index}]")
        hashes.append(digest)
        held = held or redacted
    return ImportedHistory(
        items=hashes,
        choices=choices,
        trainable=choices,
        tools=blobs.add(to_json_value(tools), f"{where} tools") if tools is not None else None,
    )


def check_reward(reward: Any, where: str) -> float:
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        raise InvalidEventError(f"{where}: the reward is {reward!r}, not a number")
    if not math.isfinite(reward):
        raise InvalidEventError(f"{where}: the reward is {reward}, not a finite number")
    return float(reward)


def trajectory_event(
    trajectory: art.Trajectory, rollout_id: str, blobs: Blobs, where: str
) -> TrajectoryRecorded:
    """The `trajectory.recorded` event of `trajectory` (its blobs added to `blobs`)."""
    histories = [
        _history(trajectory.messages_and_choices, trajectory.tools, blobs, f"{where}, message"),
        *(
            _history(h.messages_and_choices, h.tools, blobs, f"{where}, history {n}, message")
            for n, h in enumerate(trajectory.additional_histories, start=1)
        ),
    ]
    exchanges = None
    if has_exchange_data(trajectory):
        dumped = trajectory.exchanges.model_dump(mode="json", warnings=False)
        redact_exchanges(dumped, blobs.redact)
        exchanges = blobs.add(dumped, f"{where}, exchanges")
    details = {
        "metrics": dict(trajectory.metrics),
        "metadata": own_metadata(trajectory.metadata),
        "logs": list(trajectory.logs),
    }
    return TrajectoryRecorded(
        rollout_id=rollout_id,
        histories=histories,
        exchanges=exchanges,
        details=blobs.add(details, f"{where}, metrics, metadata or logs"),
        reward=check_reward(trajectory.reward, where),
        initial_policy_version=trajectory.initial_policy_version,
        final_policy_version=trajectory.final_policy_version,
        start_time=trajectory.start_time.isoformat() if trajectory.start_time else None,
    )


def _utc(moment: datetime | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    return (moment if moment.tzinfo else moment.astimezone()).astimezone(UTC)


def rollout_events(
    trajectory: art.Trajectory,
    *,
    rollout_id: str,
    run: str | None,
    group_id: str | None,
    model: str,
    scenario: Any,
    scenario_index: int | None,
    policy_step: int | None,
    blobs: Blobs,
    where: str,
) -> list[Any]:
    """A whole rollout for a trajectory made outside any `store.rollout` block."""
    started_at = _utc(getattr(trajectory, "start_time", None))
    duration = trajectory.metrics.get("duration")
    if isinstance(duration, bool) or not isinstance(duration, (int, float)) or duration < 0:
        duration = max(0.0, (datetime.now(UTC) - started_at).total_seconds())
    initial = trajectory.initial_policy_version
    return [
        RolloutStarted(
            rollout_id=rollout_id,
            run=run,
            group_id=group_id,
            scenario=scenario,
            scenario_index=scenario_index,
            model=model,
            role="policy",
            policy_step=initial if initial is not None else policy_step,
            started_at=started_at,
        ),
        trajectory_event(trajectory, rollout_id, blobs, where),
        RolloutFinished(rollout_id=rollout_id, duration_s=float(duration)),
    ]


def numbered_calls(calls: list[CapturedCall], blobs: Blobs) -> list[LLMCall]:
    """The `llm.call` events of a rollout's captured calls, numbered (their blobs added)."""
    for call in calls:
        blobs.update(call.blobs)
    return [call.event.model_copy(update={"index": i}) for i, call in enumerate(calls)]


def _same_content(a: TrajectoryRecorded, b: TrajectoryRecorded) -> bool:
    """Equal trajectories, the reward aside (rewards are the groups' business)."""
    ignore = {"reward", "event_id"}
    return a.model_dump(exclude=ignore) == b.model_dump(exclude=ignore)


async def _rollout_state(store: Store, rollout_ids: list[str]) -> dict[str, Any]:
    """Rows of the rollouts: status, group, whether the group is sealed, and its run."""
    if not rollout_ids:
        return {}
    async with store.database.read() as connection:
        rows = (
            await connection.execute(
                select(t.rollouts.c.rollout_id, t.rollouts.c.status, t.rollouts.c.group_id).where(
                    t.rollouts.c.rollout_id.in_(rollout_ids)
                )
            )
        ).all()
        group_ids = list({r.group_id for r in rows if r.group_id})
        sealed = dict(
            (
                await connection.execute(
                    select(t.groups.c.group_id, t.groups.c.run).where(
                        t.groups.c.group_id.in_(group_ids)
                    )
                )
            ).all()
        )
    return {
        r.rollout_id: (r.status, r.group_id, r.group_id in sealed, sealed.get(r.group_id))
        for r in rows
    }


def _check_not_sealed_elsewhere(claimed: list[Any], state: dict[str, Any], run: str) -> None:
    """Refuse a trajectory that is a member of a sealed group of `run` (recorded again in
    another composition): a copy of it in a second group would be trained twice."""
    for index, claim in enumerate(claimed):
        found = state.get(claim) if isinstance(claim, str) else None
        if found is not None and found[0] == "finished" and found[2] and found[3] == run:
            raise ConfigurationError(
                f"run {run!r}: trajectory {index} is rollout {claim}, already in sealed group "
                f"{found[1]}, and this group is not that one: a trajectory belongs to one "
                "group, so that it is trained once. Record or train the sealed group as it "
                f"was (artstore.run_groups, unconsumed_groups), or remove '{ROLLOUT_KEY}' "
                "from the trajectory's metadata to record a copy on purpose"
            )


async def _group_members(store: Store, group_id: str) -> dict[str, list[str]]:
    """Rollouts recorded under `group_id` (by durable rollouts), by status."""
    found: dict[str, list[str]] = {"finished": [], "failed": [], "running": []}
    async with store.database.read() as connection:
        for row in await connection.execute(
            select(t.rollouts.c.rollout_id, t.rollouts.c.status)
            .where(t.rollouts.c.group_id == group_id)
            .order_by(t.rollouts.c.started_at, t.rollouts.c.rollout_id)
        ):
            found.setdefault(row.status, []).append(row.rollout_id)
    return found


async def _latest_recorded(store: Store, rollout_ids: list[str]) -> dict[str, Any]:
    streams = await store.read_streams(rollout_stream(r) for r in rollout_ids)
    found = {}
    for rollout_id in rollout_ids:
        for recorded in streams[rollout_stream(rollout_id)]:
            if recorded.type == TrajectoryRecorded.type:
                found[rollout_id] = recorded.decode()
    return found


async def _scored(store: Store, rollout_ids: list[str], scorer: str) -> dict[str, float]:
    found: dict[str, float] = {}
    async with store.database.read() as connection:
        for row in await connection.execute(
            select(t.rewards.c.rollout_id, t.rewards.c.reward)
            .where(t.rewards.c.rollout_id.in_(rollout_ids), t.rewards.c.scorer == scorer)
            .order_by(t.rewards.c.position, t.rewards.c.id)
        ):
            found[row.rollout_id] = row.reward
    return found


def _art_group_details(group: art.TrajectoryGroup) -> dict[str, Any]:
    return {
        "metadata": own_metadata(group.metadata),
        "metrics": dict(group.metrics),
        "logs": list(group.logs),
        "exceptions": [e.model_dump(mode="json") for e in group.exceptions],
    }


async def record_group(
    store: Store,
    group: art.TrajectoryGroup,
    *,
    run: str,
    model: Any = None,
    scorer: str | None = None,
    batch: int | None = None,
    epoch: int | None = None,
    scenario: Any = None,
    scenario_index: int | None = None,
    policy_step: int | None = None,
    group_id: str | None = None,
) -> str:
    """Record `group` (an `art.TrajectoryGroup`) as a sealed group of `run`; its id.

    - `model`: the `art.Model` whose rollouts these are (needed when `run` was never
      started: it starts the run; its name is the rollouts' model).
    - `scorer`: the name the rewards are recorded under (default: the run's scorer,
      `reward` for a new run). Each trajectory's `reward` is its reward.
    - `batch`, `epoch`, `scenario_index`: where the group belongs in the run
      (`artstore replay` trains groups batch by batch); `scenario`: what the rollouts
      were given (JSON), for re-scoring; `policy_step`: the step that made them, when
      the trajectories carry no `initial_policy_version`.

    Stamps the group and its trajectories with their ids (see the module docstring).
    The new rollouts and the seal are committed in one transaction: a crash leaves
    the group whole or not at all.
    """
    return await record_group_with_calls(
        store,
        group,
        None,
        run=run,
        model=model,
        scorer=scorer,
        batch=batch,
        epoch=epoch,
        scenario=scenario,
        scenario_index=scenario_index,
        policy_step=policy_step,
        group_id=group_id,
    )


async def record_group_with_calls(
    store: Store,
    group: art.TrajectoryGroup,
    calls: GroupCalls | None,
    *,
    run: str,
    model: Any = None,
    scorer: str | None = None,
    batch: int | None = None,
    epoch: int | None = None,
    scenario: Any = None,
    scenario_index: int | None = None,
    policy_step: int | None = None,
    group_id: str | None = None,
) -> str:
    """`record_group`, each new rollout with the LLM calls `calls` gives its trajectory
    (`artstore.capture.group`), in the transaction that records it."""
    _check_arguments(store, group, run, model, scorer, group_id, scenario)
    check_whole_numbers(
        optional=True,
        batch=batch,
        epoch=epoch,
        scenario_index=scenario_index,
        policy_step=policy_step,
    )
    trajectories = list(group.trajectories)
    where = f"run {run!r}, group"
    rewards = _checked_rewards(trajectories, where)  # refused before the run is started
    scorer = await ensure_run(store, run, model=model, scorer=scorer)
    if model is not None:  # the store refuses to write the model's key anywhere
        store.redact.add(
            [getattr(model, "inference_api_key", None)],
            urls=[getattr(model, "inference_base_url", None)],
        )
    claimed, hinted = _stamped_ids(group, trajectories)

    # The same group, sealed before with exactly these rollouts: nothing new but changes.
    if group_id is None and (hint := await _sealed_as_it_is(store, hinted, claimed)):
        await _sync(store, trajectories, [str(c) for c in claimed], rewards, hint, scorer)
        _stamp_group(group, trajectories, [str(c) for c in claimed], hint)
        return hint
    if group_id is None:
        open_hints = [g for g in hinted if not (await sealed_groups(store, [g]))]
        group_id = open_hints[0] if len(open_hints) == 1 else new_id()
    elif await sealed_groups(store, [group_id]):
        raise ConfigurationError(f"group {group_id} is sealed already; it cannot be recorded again")

    rollout_ids, new_rollouts = await _reuse_or_add(store, claimed, group_id, run)
    rollouts = _GroupRollouts(
        run=run,
        group_id=group_id,
        model=getattr(model, "name", None) or await _run_model(store, run),
        scenario=to_json_value(scenario),
        scenario_index=scenario_index,
        policy_step=policy_step,
        where=where,
    )
    appends = rollouts.new_appends(store, trajectories, new_rollouts, calls)
    reused = [(i, r) for i, r in enumerate(rollout_ids) if (i, r) not in new_rollouts]
    reused_trajectories = [trajectories[i] for i, _ in reused]
    await _sync(store, reused_trajectories, [r for _, r in reused], None, group_id, scorer)
    failed = await _failed_members(store, group_id, rollout_ids)
    scored = RewardsRecorded(
        group_id=group_id, scorer=scorer, rewards=dict(zip(rollout_ids, rewards, strict=True))
    )
    details = Blobs(store.redact)
    sealed = GroupSealed(
        group_id=group_id,
        run=run,
        epoch=epoch,
        batch=batch,
        scenario_index=scenario_index,
        rollout_ids=rollout_ids,
        failed_rollout_ids=failed,
        art_group=details.add(_art_group_details(group), f"{where} metadata, metrics or logs"),
    )
    appends.append(await _seal_append(store, group_id, [scored, sealed], details))
    await _append_together(store, appends)
    _stamp_group(group, trajectories, rollout_ids, group_id)
    return group_id


async def _seal_append(
    store: Store, group_id: str, events: list[Any], blobs: Blobs
) -> PendingAppend:
    """The group's rewards and seal, after what its stream holds: a group may hold rewards
    before its seal (`artstore serve` records them as each rollout finishes). The seal
    refuses a group that changed since it was read."""
    head = await store.stream_version(group_stream(group_id))
    return PendingAppend(group_stream(group_id), events, head, blobs)


def _checked_rewards(trajectories: list[Any], where: str) -> list[float]:
    return [check_reward(t.reward, f"{where}, trajectory {i}") for i, t in enumerate(trajectories)]


def _stamped_ids(group: Any, trajectories: list[Any]) -> tuple[list[Any], set[str]]:
    """The rollout id stamped on each trajectory (None where none is), and the group ids
    stamped on the group and its trajectories (see the module docstring)."""
    claimed = [t.metadata.get(ROLLOUT_KEY) for t in trajectories]
    hinted = {group.metadata.get(GROUP_KEY)} | {t.metadata.get(GROUP_KEY) for t in trajectories}
    return claimed, {g for g in hinted if isinstance(g, str)}


async def _sealed_as_it_is(store: Store, hinted: set[str], claimed: list[Any]) -> str | None:
    """The group the trajectories name, when it was sealed with exactly their rollouts."""
    if len(hinted) != 1:
        return None
    (hint,) = hinted
    seal = (await sealed_groups(store, [hint])).get(hint)
    if seal is not None and sorted(seal.rollout_ids) == sorted(map(str, claimed)):
        return hint
    return None


async def _reuse_or_add(
    store: Store, claimed: list[Any], group_id: str, run: str
) -> tuple[list[str], list[tuple[int, str]]]:
    """The group's rollout ids, and (trajectory index, id) of those to record now.

    Finished rollouts of this store, in no sealed group, are sealed as they are; one
    already in a sealed group of the run is refused (see `_check_not_sealed_elsewhere`).
    """
    state = await _rollout_state(store, [c for c in claimed if isinstance(c, str)])
    _check_not_sealed_elsewhere(claimed, state, run)
    rollout_ids: list[str] = []
    new_rollouts: list[tuple[int, str]] = []
    for index, claim in enumerate(claimed):
        status = state.get(claim) if isinstance(claim, str) else None
        reusable = (
            status is not None
            and status[0] == "finished"
            and not status[2]
            and status[1] in (None, group_id)
            and claim not in rollout_ids
        )
        if reusable:
            rollout_ids.append(str(claim))
        else:
            rollout_ids.append(new_id())
            new_rollouts.append((index, rollout_ids[-1]))
    return rollout_ids, new_rollouts


@dataclass
class _GroupRollouts:
    """Where the new rollouts of a recorded group belong, and what they were given."""

    run: str
    group_id: str
    model: str
    scenario: Any
    scenario_index: int | None
    policy_step: int | None
    where: str

    def new_appends(
        self,
        store: Store,
        trajectories: list[Any],
        new_rollouts: list[tuple[int, str]],
        calls: GroupCalls | None,
    ) -> list[PendingAppend]:
        """The events of each new rollout (its LLM calls included), encoded: nothing is
        written yet, and what cannot be stored is refused now."""
        appends = []
        for index, rollout_id in new_rollouts:
            blobs = Blobs(store.redact)
            events = rollout_events(
                trajectories[index],
                rollout_id=rollout_id,
                run=self.run,
                group_id=self.group_id,
                model=self.model,
                scenario=self.scenario,
                scenario_index=self.scenario_index,
                policy_step=self.policy_step,
                blobs=blobs,
                where=f"{self.where}, trajectory {index}",
            )
            events[1:1] = numbered_calls(calls.of_trajectory.get(index, []) if calls else [], blobs)
            appends.append(PendingAppend(rollout_stream(rollout_id), events, NO_STREAM, blobs))
        return appends


async def _failed_members(store: Store, group_id: str, rollout_ids: list[str]) -> list[str]:
    """The group's failed rollouts besides `rollout_ids`; those still running are abandoned
    (their process is gone: the group is sealed without them) and count as failed."""
    members = await _group_members(store, group_id)
    if members["running"]:
        await abandon_rollouts(
            store,
            members["running"],
            why="the process running this rollout stopped (crash or kill) before it ended; "
            "its group was sealed without it",
        )
    return [r for r in [*members["failed"], *members["running"]] if r not in rollout_ids]


async def _append_together(store: Store, appends: list[PendingAppend]) -> None:
    """Everything was encoded (and refused, if it had to be) before anything is written.
    Queued together: the writer commits the new rollouts and the seal in one transaction,
    never split between two, so a crash leaves all or nothing (an append the database
    refuses fails alone: `append_together_nowait`)."""
    outcomes = await asyncio.gather(*store.append_together_nowait(appends), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _check_arguments(
    store: Store, group: Any, run: Any, model: Any, scorer: Any, group_id: Any, scenario: Any
) -> None:
    """`record_group`'s arguments, refused before anything is written (InvalidArgumentError)."""
    if not isinstance(group, trajectory_group_class()):
        raise ConfigurationError(f"record_group records an art.TrajectoryGroup, not {group!r}")
    check_store(store)
    check_name("run", run)
    check_names(optional=True, scorer=scorer, group_id=group_id)
    check_json("scenario", to_json_value(scenario))
    if model is not None:
        check_model_name(model)


async def record_unattributed_calls(
    store: Store,
    calls: list[list[CapturedCall]],
    *,
    run: str,
    group_id: str,
    model: Any,
    scenario: Any,
    scenario_index: int | None,
    policy_step: int | None,
    error: BaseException | None = None,
) -> None:
    """Calls made while a group was rolled out that belong to none of its trajectories
    (`artstore.capture.group`): each list as a rollout of the group, recorded as failed
    (with `error`, the exception of the group's rollout function, if it raised), so that
    every call made is kept. `record_group` then lists them as its failures."""
    failure = {
        "error_type": "NoTrajectory",
        "error_message": "its LLM calls answered no trajectory of the group (a rollout "
        "that failed: the group's exceptions say why)",
        "traceback": "",
    }
    if error is not None:
        failure = {
            "error_type": type(error).__name__,
            "error_message": str(error) or repr(error),
            "traceback": "".join(traceback.format_exception(error)),
        }
    store.redact.add(
        [getattr(model, "inference_api_key", None)],
        urls=[getattr(model, "inference_base_url", None)],
    )
    appends = []
    for captured in calls:
        rollout_id = new_id()
        blobs = Blobs(store.redact)
        first, last = captured[0].event, captured[-1].event
        ended = last.finished_at or last.started_at
        events = [
            RolloutStarted(
                rollout_id=rollout_id,
                run=run,
                group_id=group_id,
                scenario=scenario,
                scenario_index=scenario_index,
                model=model.name,
                policy_step=policy_step,
                started_at=first.started_at,
            ),
            *numbered_calls(captured, blobs),
            RolloutFailed(
                rollout_id=rollout_id,
                duration_s=max(0.0, (ended - first.started_at).total_seconds()),
                **failure,
            ),
        ]
        appends.append(PendingAppend(rollout_stream(rollout_id), events, NO_STREAM, blobs))
    outcomes = await asyncio.gather(*store.append_together_nowait(appends), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _stamp_group(
    group: art.TrajectoryGroup, trajectories: list[Any], rollout_ids: list[str], group_id: str
) -> None:
    for trajectory, rollout_id in zip(trajectories, rollout_ids, strict=True):
        stamp(trajectory, rollout_id, group_id)
    group.metadata[GROUP_KEY] = group_id


async def _sync(
    store: Store,
    trajectories: list[Any],
    rollout_ids: list[str],
    rewards: list[float] | None,
    group_id: str,
    scorer: str,
) -> None:
    """Record what changed in trajectories that are rollouts already: content, rewards."""
    if not rollout_ids:
        return
    stored = await _latest_recorded(store, rollout_ids)
    for trajectory, rollout_id in zip(trajectories, rollout_ids, strict=True):
        blobs = Blobs(store.redact)
        event = trajectory_event(trajectory, rollout_id, blobs, f"rollout {rollout_id}")
        if rollout_id not in stored or not _same_content(event, stored[rollout_id]):
            await store.append(rollout_stream(rollout_id), [event], blobs=blobs)
    if rewards is None:
        return
    before = await _scored(store, rollout_ids, scorer)
    if [before.get(r) for r in rollout_ids] != rewards:
        await store.append(
            group_stream(group_id),
            [
                RewardsRecorded(
                    group_id=group_id,
                    scorer=scorer,
                    rewards=dict(zip(rollout_ids, rewards, strict=True)),
                    rescored=True,
                )
            ],
        )


async def _run_model(store: Store, run: str) -> str:
    async with store.database.read() as connection:
        found = (
            await connection.execute(select(t.runs.c.model).where(t.runs.c.run == run))
        ).scalar()
    return found or run


def group_recorder(
    store: Store, *, run: str, **options: Any
) -> Callable[[art.TrajectoryGroup], Awaitable[art.TrajectoryGroup]]:
    """A ready `after_each=` for `art.gather_trajectory_groups`: records each group as it ends.

        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in batch),
            after_each=artstore.group_recorder(store, run="my-run", model=model, batch=step),
        )

    Options are `record_group`'s (model, scorer, batch, epoch, scenario_index...).
    Returns the group, stamped with its ids; one that cannot be recorded raises.
    """
    check_store(store)
    check_name("run", run)

    async def after_each(group: art.TrajectoryGroup) -> art.TrajectoryGroup:
        await record_group(store, group, run=run, **options)
        return group

    return after_each
