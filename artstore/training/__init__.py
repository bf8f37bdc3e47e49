"""Training on events: the training loop with resume, replay and re-scoring."""

from artstore.errors import RolloutsFailedError
from artstore.training.config import TrainingConfig
from artstore.training.framework import TrainingFramework, train
from artstore.training.recipe import RunSummary
from artstore.training.steps import BackendStepError, TrainStepError

__all__ = [
    "BackendStepError",
    "RolloutsFailedError",
    "RunSummary",
    "TrainStepError",
    "TrainingConfig",
    "TrainingFramework",
    "train",
]
