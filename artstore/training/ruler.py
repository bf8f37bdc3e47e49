"""ART's RULER (an LLM judge that ranks a group's trajectories) as an artstore scorer.

    from artstore.training.ruler import ruler_reward

    judge = ruler_reward(judge_model="openai/o4-mini")
    await artstore.rescore(store, "my-run", judge, scorer="ruler")
    await artstore.replay(store, "my-run", model, scorer="ruler")

or, from the command line, with a module of your own that holds `judge` (or the
ready-made `artstore.training.ruler:ruler`, configured by environment variables):

    artstore rescore my-run --reward my_rewards:judge --scorer ruler

`ruler_reward(...)` returns a reward function `(scenario, results,
trajectories) -> rewards` that calls `art.rewards.ruler_score_group` on the group's
trajectories. What ART's RULER returns is a new group that keeps only the trajectories'
messages, tools, rewards, metrics, metadata and logs: the group's metadata, metrics,
logs and exceptions and the trajectories' policy versions and start times are dropped.
None of that is lost here: the reward function hands back only the scores, appended as a
new `rewards.recorded` event under the scorer's name, and everything else stays in the
rollouts' own events, from which the trajectories are projected whenever they are
trained. RULER's `ruler_score` and `independent_reward` (the reward of the run's scorer)
are recorded as reward metrics. Its explanations (free text) are not recorded: reward
metrics are numbers.

RULER (ART 0.5.18 and 0.5.23 alike) refuses trajectories with `additional_histories`
("not supported by RULER yet"). This scorer judges each trajectory by its main history
(`messages_and_choices`, or ART's exchanges) and leaves the other histories out of the
judge's prompt; the stored trajectories keep them. A trajectory with no main history to
judge is a RewardFunctionError naming it.
"""

from __future__ import annotations

import os
from typing import Any

from artstore.art_api import art_module, trajectory_group_class
from artstore.art_versions import has_exchange_data
from artstore.errors import RewardFunctionError
from artstore.training.rescore import RewardFunction, Rewards

JUDGE_MODEL_ENV = "ARTSTORE_RULER_JUDGE_MODEL"
DEFAULT_JUDGE_MODEL = "openai/o3"  # ART's own default

#: Metrics RULER sets on each trajectory; recorded beside the new rewards.
RULER_METRICS = ("ruler_score", "independent_reward")


def ruler_reward(
    judge_model: str | None = None,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str | None = None,
    *,
    debug: bool = False,
) -> RewardFunction:
    """A reward function that scores a group with ART's RULER.

    Args:
        judge_model: LiteLLM model name of the judge, e.g. "openai/o4-mini" (default:
            `$ARTSTORE_RULER_JUDGE_MODEL`, then ART's default "openai/o3"), read when the
            function is called.
        extra_litellm_params: passed to LiteLLM (`api_base`, `api_key`, `temperature`...).
            Without them LiteLLM reads its usual environment variables
            (`OPENAI_API_KEY`, `OPENAI_BASE_URL`...).
        rubric: the grading rubric (default: RULER's own `DEFAULT_RUBRIC`).
        debug: print the judge's reasoning (RULER's `debug`).

    A judge that fails (network, malformed answer) makes the group's scoring fail with a
    RewardFunctionError naming the group: RULER's `swallow_exceptions` is not used, since
    a group without scores cannot be recorded.
    """

    async def ruler(scenario: Any, results: list[Any], trajectories: list[Any]) -> Rewards:
        if not trajectories:
            return Rewards([])
        model = judge_model or os.environ.get(JUDGE_MODEL_ENV) or DEFAULT_JUDGE_MODEL
        judged = []
        for index, trajectory in enumerate(trajectories):
            if not trajectory.messages_and_choices and not has_exchange_data(trajectory):
                raise RewardFunctionError(
                    f"trajectory {index} has no main history (messages_and_choices) for "
                    "RULER to judge"
                )
            # RULER refuses additional histories: it judges the main one.
            judged.append(trajectory.model_copy(update={"additional_histories": []}))
        scored = await art_module("rewards").ruler_score_group(
            trajectory_group_class()(judged),
            judge_model=model,
            extra_litellm_params=extra_litellm_params,
            rubric=rubric or art_module("rewards.ruler").DEFAULT_RUBRIC,
            swallow_exceptions=False,
            debug=debug,
        )
        if scored is None or len(scored.trajectories) != len(trajectories):
            raise RewardFunctionError(
                f"RULER ({model}) returned no scores for a group of {len(trajectories)}"
            )
        return Rewards(
            [float(t.reward) for t in scored.trajectories],
            metrics=[
                {k: t.metrics[k] for k in RULER_METRICS if k in t.metrics}
                for t in scored.trajectories
            ],
        )

    ruler.__qualname__ = ruler.__name__ = "ruler"
    return ruler


#: RULER with the judge of `$ARTSTORE_RULER_JUDGE_MODEL` (default "openai/o3") and
#: LiteLLM's own environment variables: `--reward artstore.training.ruler:ruler`.
ruler = ruler_reward()
