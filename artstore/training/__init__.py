"""Training on events: the training loop with resume, replay and re-scoring.

The names below are loaded on first use: the loop imports capture, LangChain and the
projections, which a read command (`artstore runs`, importing `training.overview`) does
not need before it reads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from artstore.errors import RolloutsFailedError

if TYPE_CHECKING:
    from artstore.training.config import TrainingConfig
    from artstore.training.framework import TrainingFramework, train
    from artstore.training.recipe import RunSummary
    from artstore.training.steps import BackendStepError, TrainStepError

_MODULE_OF = {
    "TrainingConfig": "artstore.training.config",
    "TrainingFramework": "artstore.training.framework",
    "train": "artstore.training.framework",
    "RunSummary": "artstore.training.recipe",
    "BackendStepError": "artstore.training.steps",
    "TrainStepError": "artstore.training.steps",
}


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'artstore.training' has no attribute {name!r}")


__all__ = [
    "BackendStepError",
    "RolloutsFailedError",
    "RunSummary",
    "TrainStepError",
    "TrainingConfig",
    "TrainingFramework",
    "train",
]
