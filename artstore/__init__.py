"""artstore: an event-sourced, persistent trajectory store for OpenPipe ART and LangGraph.

Every rollout, LLM call, reward and train step is an immutable event in SQLite or
PostgreSQL; trajectories are projected from the events; the trainer replays unconsumed
groups into ART, so runs resume after a crash and can be re-scored and trained again.

Importing artstore is quick: ART (slow to import) is loaded only where it is used.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# LiteLLM (imported by ART) fetches a price map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from artstore.errors import (
    ArtstoreError,
    DatabaseUnavailableError,
    GroupAlreadyConsumedError,
    SchemaTooNewError,
    WrongExpectedVersionError,
)

if TYPE_CHECKING:
    from artstore.eventstore import ANY, NO_STREAM, AppendResult, RecordedEvent
    from artstore.store import Store, open_store

__version__ = "0.1.0"

_TRAINING = {"TrainingFramework", "TrainingConfig", "train", "RunSummary"}
# Training on a store that holds runs: functions that take the store.
_ON_A_STORE = {
    # The store itself (SQLAlchemy): not for `artstore --help`.
    "ANY": "artstore.eventstore",
    "NO_STREAM": "artstore.eventstore",
    "AppendResult": "artstore.eventstore",
    "RecordedEvent": "artstore.eventstore",
    "Store": "artstore.store",
    "open_store": "artstore.store",
    "replay": "artstore.training.replay",
    "rescore": "artstore.training.rescore",
    # Loops of your own: ART's objects in and out, train steps, runs.
    "record_group": "artstore.training.recording",
    "group_recorder": "artstore.training.recording",
    "run_groups": "artstore.training.run_groups",
    "unconsumed_groups": "artstore.training.run_groups",
    "recording_backend": "artstore.training.backend",
    "durable_rollouts": "artstore.training.durable",
    "pipeline_trainer": "artstore.training.pipeline",
    "start_run": "artstore.training.runs",
    # Resuming inside a rollout: tools whose results are served back.
    "recorded_tool": "artstore.capture.tools",
    "finish_run": "artstore.training.runs",
}


def __getattr__(name: str):
    # The training layer imports ART, which is slow: load it only when asked for.
    if name in _TRAINING:
        from artstore import training

        return getattr(training, name)
    if name in _ON_A_STORE:
        import importlib

        return getattr(importlib.import_module(_ON_A_STORE[name]), name)
    raise AttributeError(f"module 'artstore' has no attribute {name!r}")


__all__ = [
    "ANY",
    "NO_STREAM",
    "AppendResult",
    "ArtstoreError",
    "DatabaseUnavailableError",
    "GroupAlreadyConsumedError",
    "RecordedEvent",
    "RunSummary",
    "SchemaTooNewError",
    "Store",
    "TrainingConfig",
    "TrainingFramework",
    "WrongExpectedVersionError",
    "__version__",
    "durable_rollouts",
    "finish_run",
    "group_recorder",
    "open_store",
    "pipeline_trainer",
    "record_group",
    "recorded_tool",
    "recording_backend",
    "replay",
    "rescore",
    "run_groups",
    "start_run",
    "train",
    "unconsumed_groups",
]
