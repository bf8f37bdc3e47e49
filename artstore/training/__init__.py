"""Training on events: the seed's loop with resume, replay and re-scoring."""

from artstore.training.config import TrainingConfig
from artstore.training.framework import RunSummary, TrainingFramework, train

__all__ = ["RunSummary", "TrainingConfig", "TrainingFramework", "train"]
