"""`wrap_rollout`: ART's `art.langgraph.wrap_rollout`, with the trajectory projected from events."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, ParamSpec

from artstore.art_api import trajectory_class
from artstore.capture.rollout import to_json_value
from artstore.errors import InvalidEventError
from artstore.eventstore.blobs import canonical_json

if TYPE_CHECKING:
    import art

    from artstore.store import Store

P = ParamSpec("P")


def wrap_rollout(
    store: Store,
    model: Any,
    fn: Callable[P, Awaitable[Any]],
    *,
    scenario: Callable[P, Any] | None = None,
    run: str | None = None,
    group_id: str | None = None,
    role: Literal["policy", "validation"] = "policy",
    policy_step: int | None = None,
) -> Callable[P, Awaitable[art.Trajectory]]:
    """`fn` recorded as a rollout of `model`; the wrapper returns its `art.Trajectory`.

        trajectory = await wrap_rollout(store, model, rollout)(model, scenario)

    As in ART, each call of the wrapper runs `fn` with the LLM calls of
    `init_chat_model()` (artstore's or ART's) recorded, and returns the trajectory built
    from them, here projected from the stored events (`store.trajectory(rollout_id)`).
    When `fn` returns an `art.Trajectory`, that object is returned, as ART does, with the
    recorded conversations put in it (its reward, metrics, metadata and logs kept); its
    metrics, metadata and logs are recorded with the rollout, its reward as the rollout's
    result `{"reward": ...}`. Any other return value is recorded as the result.

    `scenario(*args, **kwargs)` says what to record as the scenario; by default, the first
    argument that is not a model (an object with an `inference_base_url`), or None. If
    `fn` raises, the rollout is recorded as failed, with the calls made before, and the
    exception reaches the caller.

    The trajectory's metadata says which rollout it is (`artstore_rollout_id`, and
    `artstore_group_id` with `group_id`): `artstore.record_group` seals it as it was
    recorded, LLM calls included, rather than a copy.
    """

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> art.Trajectory:
        recorded = scenario(*args, **kwargs) if scenario else _default_scenario(args, kwargs)
        try:
            canonical_json(to_json_value(recorded))
        except (TypeError, ValueError) as exc:
            raise InvalidEventError(
                f"the scenario ({type(recorded).__name__}) is not JSON-serializable: {exc}; "
                "pass wrap_rollout(..., scenario=lambda *args, **kwargs: <JSON>) to say "
                "what to record"
            ) from None
        async with store.rollout(
            model,
            scenario=recorded,
            run=run,
            group_id=group_id,
            role=role,
            policy_step=policy_step,
        ) as rollout:
            result = await fn(*args, **kwargs)
            if isinstance(result, trajectory_class()):
                rollout.metrics.update(result.metrics)
                rollout.metadata.update(result.metadata)
                rollout.logs.extend(result.logs)
                rollout.result = {"reward": result.reward}
            else:
                rollout.result = result
        projected = await store.trajectory(rollout.id)
        # Where it is in the store: `artstore.record_group` seals this rollout, not a copy.
        projected.metadata["artstore_rollout_id"] = rollout.id
        if group_id is not None:
            projected.metadata["artstore_group_id"] = group_id
        if not isinstance(result, trajectory_class()):
            return projected
        result.metadata.update(
            {k: v for k, v in projected.metadata.items() if k.startswith("artstore_")}
        )
        # What ART's create_messages_from_logs does to the trajectory `fn` returned.
        if projected.messages_and_choices:
            result.messages_and_choices = projected.messages_and_choices
            result.tools = projected.tools
        result.additional_histories.extend(projected.additional_histories)
        return result

    return wrapper


def _default_scenario(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if "scenario" in kwargs:
        return kwargs["scenario"]
    candidates = [*args, *kwargs.values()]
    return next((a for a in candidates if not hasattr(a, "inference_base_url")), None)
