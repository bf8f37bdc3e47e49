"""The guarantee matrix: every way of running ART on the store, failing and killed.

Hypothesis draws cases (tests/matrix/cases.py): a pattern (`TrainingFramework`, the docs'
loop of `recording_backend` + `durable_rollouts` + `group_recorder` with
`gather_trajectory_groups`, the same with `record_group`, LangGraph agents under
`wrap_rollout`, `pipeline_trainer` on ART >= 0.5.20, workers on PostgreSQL, agents
recorded by `artstore serve`), an agent kind (ART's OpenAI client, a plain one through
serve's proxy, or a LangGraph graph on ART's chat model, streamed or not, or compiled
with artstore's checkpointer), a
failure (the agent raises, an LLM request gets HTTP 500 or times out, `@art.retry`
retries, `max_exceptions` is exceeded, the reward function raises) and up to two kills
(`POINT:N`, SIGKILL at the Nth arrival at a crash point tests/support/crash_points.py declares,
`append` among them: right after an acknowledged append). The case runs in
child processes on a fresh database until the run finishes (tests/matrix/harness.py);
then every invariant of tests/matrix/invariants.py is checked:

- no acknowledged event lost;
- no trajectory recorded twice, none trained twice (by the backend's own checkpoints);
- projections equal a rebuild from the events;
- the LLM calls recorded are the calls the inference server received, each once;
- the inference API key (which the model also spells out) is nowhere: database, blobs,
  exports, viewer pages, command output; nor is a rollout token of `artstore serve`.

Budget: `ARTSTORE_MATRIX=ci` (the default) runs the cases of `ci_cases` (a test each) and
one drawn case per database, the same in every run (derandomized, no shrinking);
`ARTSTORE_MATRIX=long` draws at random, `ARTSTORE_MATRIX_EXAMPLES=N` cases per database
(default 200), and shrinks what fails (`ARTSTORE_MATRIX_SHRINK=0`: reported as drawn).
`ARTSTORE_MATRIX_EXAMPLES` sets the CI draw too; `ARTSTORE_MATRIX_PATTERNS=a,b` draws
from those patterns only.

What it found, each before its fix (docs/guarantees.md, "The guarantee matrix", has the
messages and times):

- issue 24 item 1 (a durable loop trains the same trajectories twice): the first case of
  `ci_cases`, on both databases and both ARTs;
- item 6 (streamed LangGraph calls recorded twice), drawn in 105 s:
  Case(pattern='training-framework', agent='langgraph-stream', failure='none',
  kills=(), database='postgresql');
- item 8 (PipelineTrainer records no LLM call), drawn in 77 s on ART 0.5.23:
  Case(pattern='pipeline-trainer', agent='openai', failure='none', kills=(),
  database='sqlite');
- calls of rollouts cancelled when `max_exceptions` is exceeded went unrecorded (fixed
  with item 6), drawn in 126 s: Case(pattern='user-loop', agent='openai',
  failure='max-exceptions', kills=(), database='sqlite');
- `artstore serve` refused runs named `project/model`, and served groups (rewards recorded
  at each rollout's finish) could not be sealed by `record_group`: the serve CI case, in
  its first run (tests/serve/test_serve_training.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path
from typing import Any

import pytest
from crash_runs import forkserver
from hypothesis import HealthCheck, Phase, given, settings
from matrix.cases import Case, cases
from matrix.databases import fresh_database
from matrix.harness import run_case
from matrix.invariants import broken
from matrix.patterns import available_patterns

import artstore

LONG = os.environ.get("ARTSTORE_MATRIX", "ci") == "long"
EXAMPLES = int(os.environ.get("ARTSTORE_MATRIX_EXAMPLES", "200" if LONG else "1"))
SHRINK = os.environ.get("ARTSTORE_MATRIX_SHRINK", "1" if LONG else "0") == "1"
ONLY = os.environ.get("ARTSTORE_MATRIX_PATTERNS", "")  # e.g. "user-loop,workers"
BUDGET = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not LONG,
    database=None,
    # In CI a failing case is reported as drawn: shrinking reruns whole runs for minutes.
    phases=[Phase.generate, Phase.shrink] if SHRINK else [Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    print_blob=True,
)


@pytest.fixture(scope="module")
def processes() -> Any:
    return forkserver(["matrix.child", "art", "openai", "artstore.store", "langgraph.prebuilt"])


def check_case(case: Case, templates: Any, processes: Any) -> int:
    """Run `case` on a fresh database and assert it kept every invariant; return how many
    calls were served from a record (resumed rollouts' copies)."""
    with tempfile.TemporaryDirectory(prefix="matrix-") as folder:
        workdir = Path(folder)
        (workdir / "leaks").mkdir()
        api_key = "sk-matrix-" + secrets.token_hex(16)
        with fresh_database(templates, case.database, workdir) as url:
            return asyncio.run(run_and_check(case, processes, url, workdir, api_key))


async def run_and_check(case: Case, processes: Any, url: str, workdir: Path, key: str) -> int:
    outcome = await run_case(processes, case, url, workdir, key)
    if case.failure != "none":  # a case that injected nothing would test nothing
        assert list(workdir.glob("fault-*")), f"{case}: its failure was never injected"
    async with await artstore.open_store(url) as store:
        found = await broken(store, url, workdir, outcome, key)
        calls = await store.read_all(limit=1_000_000, types=["llm.call"])
    starts = [s.exit_code for s in outcome.starts]
    assert not found, f"{case} (starts {starts}, fired {outcome.fired}):\n" + "\n".join(found)
    return sum(1 for call in calls if call.data.get("replayed_from"))


def ci_cases() -> list[Case]:
    """The cases every CI run checks, each a test of its own: each pattern once, with
    another failure and kill, the databases taking turns, and each new path once on
    SQLite (the cheaper); among them the cases that found issue 24's items 1, 6 and 8
    (docs/guarantees.md). A pattern this ART lacks is left
    out, not skipped."""
    chosen = [
        # item 1: a rollout of a group failed, the process died between gathering and training
        Case("user-loop", "openai", "agent-raises", ("train-start:1",), "sqlite"),
        # item 6: streamed LangGraph calls
        Case("langgraph-loop", "langgraph-stream", "http-error", (), "postgresql"),
        Case("training-framework", "langgraph", "reward-raises", ("train-end:1",), "postgresql"),
        Case("record-group", "openai-stream", "art-retry", ("sealed:1", "append:3"), "sqlite"),
        # item 8: PipelineTrainer's calls
        Case("pipeline-trainer", "openai", "timeout", (), "postgresql"),
        # artstore serve: a plain OpenAI client through the proxy, killed mid-stream
        Case("serve", "openai-stream", "http-error", ("stream:2",), "sqlite"),
        # LangGraph checkpoints in the event log, a child killed after an append
        Case("langgraph-loop", "langgraph-checkpointed", "agent-raises", ("append:9",), "sqlite"),
    ]
    return [case for case in chosen if case.pattern in available_patterns(case.database)]


CI_CASES = ci_cases()


@pytest.mark.slow
@pytest.mark.parametrize("case", CI_CASES, ids=lambda case: case.id)
def test_a_pattern_failing_and_killed_keeps_every_invariant(
    case: Case, migrated_templates: Any, processes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    check_case(case, migrated_templates, processes)


def replay_cases() -> list[Case]:
    """Rollouts killed after their LLM call (the `rollout` point: a sibling of the group
    finished), resumed from their record: by `durable_rollouts`, streamed and not, by
    `TrainingFramework`, and through `artstore serve` (a new rollout that `resumes` it)."""
    return [
        Case("user-loop", "openai", "http-error", ("rollout:1",), "postgresql"),
        Case("user-loop", "openai-stream", "none", ("rollout:1", "rollout:1"), "sqlite"),
        Case("training-framework", "langgraph", "none", ("rollout:1",), "sqlite"),
        Case("serve", "openai-stream", "none", ("rollout:1",), "postgresql"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case", replay_cases(), ids=lambda case: case.id)
def test_a_rollout_killed_after_its_call_is_served_its_record(
    case: Case, migrated_templates: Any, processes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calls the killed rollouts recorded were served back, not paid for again."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    served = check_case(case, migrated_templates, processes)
    assert served >= len(case.kills), f"{case}: {served} calls served from a record"


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_drawn_cases_keep_every_invariant(
    database: str, migrated_templates: Any, processes: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    patterns = available_patterns(database)
    drawn = {name: agents for name, agents in patterns.items() if name in ONLY.split(",")}

    @BUDGET
    @given(case=cases(drawn or patterns, database))
    def matrix(case: Case) -> None:
        check_case(case, migrated_templates, processes)

    matrix()
