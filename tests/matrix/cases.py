"""What one matrix case is, and the Hypothesis strategy that draws them.

A case is one pattern (a way of running ART on the store, patterns.py) with one agent
kind, one failure, one crash point and one database. Only combinations that exist are
drawn: a pattern offers the agent kinds it is written for, the failures need an agent
kind that can meet them (a client timeout needs a client whose timeout can be set), and a
pattern that this ART or this database lacks is not offered at all (so that no
PostgreSQL case is ever skipped).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from crash_points import POINTS
from hypothesis import strategies as st

AGENT_KINDS = ("openai", "openai-stream", "langgraph", "langgraph-stream", "langgraph-checkpointed")

FAILURES = (
    "none",
    "agent-raises",  # one rollout raises after its LLM call; max_exceptions tolerates it
    "http-error",  # one LLM request answered HTTP 500 (the client retries)
    "timeout",  # one LLM request answered after the client's timeout (the client retries)
    "art-retry",  # the rollout function, under @art.retry, raises once and is retried
    "max-exceptions",  # two rollouts raise, one more than max_exceptions: the run stops
    "reward-raises",  # the reward function raises once
)

# Failures that stop the process (an exception out of the loop): the harness restarts it.
STOPPING_FAILURES = ("max-exceptions", "reward-raises")

MAX_KILLS = 2  # a second kill reaches what only a restart does (the reconciled points)


@dataclass(frozen=True)
class Case:
    """One run of the matrix; `kills` are crash points `POINT:N` (tests/support/crash_points.py:
    SIGKILL at the Nth arrival at POINT), fired one per start, in order."""

    pattern: str
    agent: str
    failure: str
    kills: tuple[str, ...]
    database: str

    @property
    def plan(self) -> str:
        """The crash plan the child arms (tests/support/crash_points.py), or ''."""
        return ",".join(self.kills)

    def write(self, folder: Path) -> None:
        (folder / "case.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, folder: Path) -> Case:
        fields = json.loads((folder / "case.json").read_text())
        return cls(**{**fields, "kills": tuple(fields["kills"])})

    @property
    def id(self) -> str:
        """The case as a test id: `pattern-agent-failure-kills-database`."""
        kills = "+".join(self.kills) or "no-kill"
        return "-".join((self.pattern, self.agent, self.failure, kills, self.database))

    def __str__(self) -> str:
        return (
            f"{self.pattern} / {self.agent} / {self.failure} / "
            f"{self.plan or 'no kill'} / {self.database}"
        )


# Failures that do not apply to agents recorded by `artstore serve`: its agent is an HTTP
# client outside ART (no `@art.retry` around it), and its groups are rolled out until
# full, not gathered by `gather_trajectory_groups` (no `max_exceptions` to exceed).
NOT_SERVED = ("art-retry", "max-exceptions")


def failures_for(pattern: str, agent: str) -> tuple[str, ...]:
    """ART's LangGraph chat model takes no client options: no timeout can be set on it."""
    return tuple(
        f
        for f in FAILURES
        if not (f == "timeout" and agent.startswith("langgraph"))
        and not (pattern == "serve" and f in NOT_SERVED)
    )


def points_for(pattern: str) -> tuple[str, ...]:
    """The crash points a pattern reaches: `stream` (mid-stream) only the served agents."""
    return tuple(p for p in POINTS if p != "stream" or pattern == "serve")


def cases(patterns: dict[str, tuple[str, ...]], database: str) -> st.SearchStrategy[Case]:
    """Cases on `database` over `patterns` (name -> the agent kinds it offers)."""

    @st.composite
    def draw(draw: st.DrawFn) -> Case:
        pattern = draw(st.sampled_from(sorted(patterns)))
        agent = draw(st.sampled_from(patterns[pattern]))
        points = st.sampled_from(points_for(pattern))
        kill = st.tuples(points, st.integers(min_value=1, max_value=6))
        kills = draw(st.lists(kill, max_size=MAX_KILLS))
        return Case(
            pattern=pattern,
            agent=agent,
            failure=draw(st.sampled_from(failures_for(pattern, agent))),
            kills=tuple(f"{point}:{nth}" for point, nth in kills),
            database=database,
        )

    return draw()
